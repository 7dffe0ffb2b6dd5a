/* tp-generate: text from a GPT checkpoint (tp-train --model gpt).
 *
 * The generator of models/zoo_gpt_decode.c does the work (tp-train's
 * per-epoch sample calls the same one): it builds the GPT's decoding graph
 * at the shape the checkpoint's metadata records, feeds the prompt a byte
 * at a time into a cache of keys and values, and then draws each byte
 * from the logits of the one position before it: logits / temperature,
 * cut to the top K, softmax, one uniform draw of a seeded generator
 * (temperature 0, or K 1, is the argmax). Each byte costs one position.
 * Past the training context T the cache slides: it is refilled from the
 * last T/2 bytes (docs/training.md). --no-cache runs the whole model over
 * the last T bytes for every byte instead, the reference the cache is
 * tested against. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/clock.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/models.h>
#include "tools/tp-generate/text.h"

static int s_fail(const char *what) {
    fprintf(stderr, "tp-generate: %s: %s\n", what, tp_last_error());
    return 1;
}

static void s_emit(const uint8_t *bytes, size_t n, void *user) {
    fwrite(bytes, 1, n, user);
    fflush(user);
}

int tp_generate_text(const char *ckpt, const tp_gen_text_t *g) {
    tp_zoo_gpt_gen_t *gen = tp_zoo_gpt_gen_open(ckpt, !g->no_cache);
    if (!gen)
        return s_fail("--load");
    const char *prompt = g->prompt && *g->prompt ? g->prompt : "\n";
    size_t plen = strlen(prompt), total = plen + (size_t)g->tokens;
    uint8_t *text = malloc(total + 1);
    if (!text) {
        tp_zoo_gpt_gen_destroy(&gen);
        tp_error(TP_ERR_NOMEM, "%zu bytes of text", total);
        return s_fail("generating");
    }
    fwrite(prompt, 1, plen, stdout);
    tp_zoo_gpt_sampling_t s = {g->temperature, g->top_k, g->seed};
    double t0 = tp_now_s();
    tp_status_t rc = tp_zoo_gpt_gen_run(gen, (const uint8_t *)prompt, plen, text, g->tokens,
                                        &s, s_emit, stdout);
    double secs = tp_now_s() - t0;
    const int context = tp_zoo_gpt_gen_context(gen);
    const tp_zoo_gpt_options_t shape = *tp_zoo_gpt_gen_shape(gen);
    tp_zoo_gpt_gen_destroy(&gen);
    if (rc == TP_OK && g->output)
        rc = tp_file_write_atomic(g->output, text, total);
    free(text);
    if (rc != TP_OK)
        return s_fail(g->output ? g->output : "generating");
    fputc('\n', stdout);
    char k[16] = "all";
    if (g->top_k > 0)
        snprintf(k, sizeof k, "%d", g->top_k);
    fprintf(stderr, "tp-generate: %ld bytes after a %zu-byte prompt from %s (gpt, context "
            "%d, %d layers, width %d; temperature %g, top-k %s, seed %llu) in %.2f s, %.1f "
            "tokens/s (%s)%s%s\n", g->tokens, plen, ckpt, context, shape.layers, shape.embed,
            g->temperature, k, (unsigned long long)g->seed, secs,
            secs > 0 ? (double)g->tokens / secs : 0.0,
            g->no_cache ? "no cache: the whole window a byte" : "cache of keys and values",
            g->output ? ", also in " : "", g->output ? g->output : "");
    return 0;
}
