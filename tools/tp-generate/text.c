/* tp-generate: text from a GPT checkpoint (tp-train --model gpt).
 *
 * The generator of models/zoo_gpt_decode.c does the work (tp-train's
 * per-epoch sample calls the same one): it builds the GPT's decoding graph
 * at the shape the checkpoint's metadata records (its vocabulary V from
 * wte's rows), feeds the prompt a token at a time into a cache of keys and
 * values, and then draws each token from the logits of the one position
 * before it: logits / temperature, cut to the top K, softmax, one uniform
 * draw of a seeded generator (temperature 0, or K 1, is the argmax). Each
 * token costs one position. Past the training context T the cache slides:
 * it is refilled from the last T/2 tokens (docs/training.md). --no-cache
 * runs the whole model over the last T tokens for every token instead, the
 * reference the cache is tested against.
 *
 * Tokens are bytes, or GPT-2's BPE when the checkpoint says tokens
 * "gpt2-bpe": the tokenizer is loaded from the files its metadata names
 * (vocab, merges; --vocab/--merges override them, for a checkpoint moved
 * to another machine), encodes the prompt and gives each token's bytes as
 * it is drawn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/clock.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/backend.h>
#include <towerpack/checkpoint.h>
#include <towerpack/models.h>
#include <towerpack/tokenizer.h>
#include "tools/tp-generate/text.h"

static int s_fail(const char *what) {
    fprintf(stderr, "tp-generate: %s: %s\n", what, tp_last_error());
    return 1;
}

typedef struct {
    const tp_tokenizer_t *tk;  /* NULL: bytes */
    FILE *out;
} s_emit_t;

/* Each token's bytes to stdout as it is drawn (a UTF-8 character split
 * over two tokens is still right once both are out). */
static void s_emit(const int32_t *ids, size_t n, void *user) {
    s_emit_t *e = user;
    for (size_t i = 0; i < n; i++) {
        size_t len = 1;
        uint8_t b = (uint8_t)ids[i];
        const uint8_t *bytes = e->tk ? tp_tokenizer_token(e->tk, ids[i], &len) : &b;
        if (bytes)
            fwrite(bytes, 1, len, e->out);
    }
    fflush(e->out);
}

/* The checkpoint's tokenizer into *tk (NULL for bytes): the files its
 * metadata names, or g's --vocab/--merges. A file that is gone is named. */
static tp_status_t s_tokenizer(const char *ckpt, const tp_gen_text_t *g, int vocab,
                               tp_tokenizer_t **tk) {
    *tk = NULL;
    tp_safetensors_t *st = NULL;
    TP_TRY(tp_safetensors_open(ckpt, &st));
    const char *tokens = tp_safetensors_meta(st, "tokens");
    tp_status_t rc = TP_OK;
    if (!tokens || !strcmp(tokens, "bytes")) {
        if (g->vocab || g->merges)
            rc = tp_error(TP_ERR_INVALID, "--vocab/--merges: %s is a byte-level GPT (no "
                          "tokenizer)", ckpt);
        tp_safetensors_destroy(&st);
        return rc;
    }
    /* --vocab alone replaces both files (a .tiktoken file has no merges) */
    const char *vf = g->vocab ? g->vocab : tp_safetensors_meta(st, "vocab");
    const char *mf = g->merges ? g->merges : g->vocab ? NULL
                                                     : tp_safetensors_meta(st, "merges");
    if (!vf || !*vf) {
        rc = tp_error(TP_ERR_FORMAT, "%s: tokens '%s' but no 'vocab' in the metadata: give "
                      "--vocab (and --merges)", ckpt, tokens);
    } else {
        const char *missing = access(vf, R_OK) ? vf : mf && *mf && access(mf, R_OK) ? mf
                                                                                   : NULL;
        if (missing)
            rc = tp_error(TP_ERR_NOT_FOUND, "the tokenizer's file %s (%s of %s) cannot be "
                          "read: give --vocab and --merges", missing,
                          missing == vf ? "vocab" : "merges",
                          g->vocab || g->merges ? "the flags" : ckpt);
        else if (!(*tk = tp_tokenizer_load(vf, mf && *mf ? mf : NULL)))
            rc = tp_error_wrap(TP_ERR_FORMAT, "the tokenizer of %s", ckpt);
    }
    if (rc == TP_OK && tp_tokenizer_vocab_size(*tk) > vocab) {
        rc = tp_error(TP_ERR_INVALID, "the tokenizer (%s) has %d tokens, the model's "
                      "embedding %d rows", vf, (int)tp_tokenizer_vocab_size(*tk), vocab);
        tp_tokenizer_destroy(tk);
    }
    tp_safetensors_destroy(&st);
    return rc;
}

int tp_generate_text(const char *ckpt, const tp_gen_text_t *g) {
    tp_zoo_gpt_gen_t *gen = tp_zoo_gpt_gen_open(ckpt, !g->no_cache);
    if (!gen)
        return s_fail("--load");
    tp_tokenizer_t *tk = NULL;
    if (s_tokenizer(ckpt, g, tp_zoo_gpt_gen_vocab(gen), &tk) != TP_OK) {
        tp_zoo_gpt_gen_destroy(&gen);
        return s_fail("--load");
    }
    const char *prompt = g->prompt && *g->prompt ? g->prompt : "\n";
    size_t plen = strlen(prompt);
    int32_t *pids = NULL, *ids = NULL;
    int64_t np = (int64_t)plen;
    tp_status_t rc = TP_OK;
    if (tk)
        rc = tp_tokenizer_encode(tk, prompt, plen, &pids, &np);
    else if ((pids = malloc(plen * sizeof *pids)))
        for (size_t i = 0; i < plen; i++)
            pids[i] = (uint8_t)prompt[i];
    const size_t total = (size_t)np + (size_t)g->tokens;
    if (rc == TP_OK && (!pids || !(ids = malloc(total * sizeof *ids))))
        rc = tp_error(TP_ERR_NOMEM, "%zu tokens", total);
    if (rc != TP_OK) {
        free(pids);
        tp_tokenizer_destroy(&tk);
        tp_zoo_gpt_gen_destroy(&gen);
        return s_fail("the prompt");
    }
    fwrite(prompt, 1, plen, stdout);
    tp_zoo_gpt_sampling_t s = {g->temperature, g->top_k, g->seed};
    s_emit_t e = {tk, stdout};
    double t0 = tp_now_s();
    rc = tp_zoo_gpt_gen_run_ids(gen, pids, (size_t)np, ids, g->tokens, &s, s_emit, &e);
    double secs = tp_now_s() - t0;
    const int context = tp_zoo_gpt_gen_context(gen), vocab = tp_zoo_gpt_gen_vocab(gen);
    const tp_zoo_gpt_options_t shape = *tp_zoo_gpt_gen_shape(gen);
    tp_zoo_gpt_gen_destroy(&gen);
    free(pids);
    /* what failed, for the message: the run, or the write of --output (a
     * failed run was told as the output file's name) */
    const char *what = "generating";
    if (rc == TP_OK && g->output) {  /* prompt + continuation, as printed */
        int64_t len = tk ? tp_tokenizer_decode(tk, ids, (int64_t)total, NULL, 0)
                         : (int64_t)total;
        uint8_t *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
        if (!text)
            rc = len < 0 ? TP_ERR_INVALID : tp_error(TP_ERR_NOMEM, "%lld bytes",
                                                     (long long)len);
        else if (tk)
            tp_tokenizer_decode(tk, ids, (int64_t)total, text, (size_t)len + 1);
        else
            for (size_t i = 0; i < total; i++)
                text[i] = (uint8_t)ids[i];
        if (text && (rc = tp_file_write_atomic(g->output, text, (size_t)len)) != TP_OK)
            what = "--output";  /* the message names the file and why */
        free(text);
    }
    free(ids);
    const char *unit = tk ? "token" : "byte";
    tp_tokenizer_destroy(&tk);
    if (rc != TP_OK)
        return s_fail(what);
    fputc('\n', stdout);
    fflush(stdout);  /* before the summary on stderr */
    char k[16] = "all";
    if (g->top_k > 0 && g->top_k < vocab)
        snprintf(k, sizeof k, "%d", g->top_k);
    char tokens[64] = "bytes";
    if (vocab != 256)
        snprintf(tokens, sizeof tokens, "GPT-2 BPE tokens, vocabulary %d", vocab);
    fprintf(stderr, "tp-generate: %ld %ss after a %lld-%s prompt from %s (gpt, %s, "
            "context %d, %d layer%s, width %d; temperature %g, top-k %s, seed %llu) in %.2f s, "
            "%.1f tokens/s (%s%s)%s%s\n", g->tokens, unit, (long long)np, unit, ckpt, tokens,
            context,
            shape.layers, shape.layers > 1 ? "s" : "", shape.embed, g->temperature, k, (unsigned long long)g->seed, secs,
            secs > 0 ? (double)g->tokens / secs : 0.0,
            g->no_cache ? "no cache: the whole window a token" : "cache of keys and values",
            tp_backend_cpu_bf16_ask(-1) ? "; the CPU's products on bf16 operands" : "",
            g->output ? ", also in " : "", g->output ? g->output : "");
    return 0;
}
