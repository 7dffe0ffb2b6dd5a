/* towerpack pipeline: TextSample, what people read while a language model
 * trains (nanoGPT prints a sample; tensorpack's examples run a predictor
 * at each epoch's end). After every epoch it asks the caller's generator
 * for a continuation of a fixed prompt from the model's weights as they
 * are, and prints it to the log on one line. The generator is the
 * caller's (the model zoo's GPT for tp-train), so this room needs no model:
 * it owns the prompt, the sampling settings and the printing. Runs between
 * steps, as SampleGrid does: the generator may read the model. The
 * generator works on token ids: bytes, or GPT-2's BPE through the run's
 * tokenizer files (loaded here), which encodes the prompt once and turns
 * the tokens drawn back into bytes for the line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/tokenizer.h>
#include <towerpack/trainer_loop.h>

typedef struct {
    tp_text_sample_opts_t o;  /* o.prompt points at prompt */
    char *prompt;
    tp_tokenizer_t *tk;       /* NULL: bytes */
    int32_t *pids;            /* [plen] the prompt's tokens */
    size_t plen;
    int32_t *ids;             /* [plen + tokens] */
    uint8_t *text;            /* [cap] their bytes */
    char *line;               /* [4 cap + 1]: escaped */
    size_t cap;
} s_sample_t;

static void s_free(void *impl) {
    s_sample_t *s = impl;
    if (!s)
        return;
    if (s->o.gen_destroy)
        s->o.gen_destroy(s->o.gen);
    free(s->prompt);
    tp_tokenizer_destroy(&s->tk);
    free(s->pids);
    free(s->ids);
    free(s->text);
    free(s->line);
    free(s);
}

/* text[0..n) on one line: printable ASCII as it is, the rest escaped. */
static void s_escape(const uint8_t *text, size_t n, char *out) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        uint8_t c = text[i];
        if (c == '\n' || c == '\t' || c == '\\') {
            *out++ = '\\';
            *out++ = c == '\n' ? 'n' : c == '\t' ? 't' : '\\';
        } else if (c < 0x20 || c >= 0x7f) {
            *out++ = '\\';
            *out++ = 'x';
            *out++ = hex[c >> 4];
            *out++ = hex[c & 15];
        } else {
            *out++ = (char)c;
        }
    }
    *out = 0;
}

static tp_status_t sample_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_sample_t *s = impl;
    tp_model_t *m = tp_trainer_model(tr);
    if (!m)
        return tp_error(TP_ERR_STATE, "TextSample needs a trainer with a model");
    tp_status_t rc = s->o.generate(s->o.gen, m, &s->o, s->pids, s->plen, s->ids);
    if (rc < 0)
        return tp_error_wrap(rc, "TextSample after epoch %lld",
                             (long long)tp_trainer_epoch_num(tr));
    /* the ids' bytes: one each, or the tokenizer's (as long as they are) */
    const int64_t n = (int64_t)s->plen + s->o.tokens;
    int64_t len = n;
    if (s->tk && (len = tp_tokenizer_decode(s->tk, s->ids, n, NULL, 0)) < 0)
        return tp_error_wrap(TP_ERR_INVALID, "TextSample after epoch %lld",
                             (long long)tp_trainer_epoch_num(tr));
    if ((size_t)len + 1 > s->cap) {
        size_t cap = (size_t)len + 1;
        uint8_t *text = realloc(s->text, cap);
        if (text)
            s->text = text;
        char *line = text ? realloc(s->line, 4 * cap + 1) : NULL;
        if (!line)
            return tp_error(TP_ERR_NOMEM, "TextSample: %zu bytes", cap);
        s->line = line;
        s->cap = cap;
    }
    if (s->tk)
        tp_tokenizer_decode(s->tk, s->ids, n, s->text, s->cap);
    else
        for (int64_t i = 0; i < n; i++)
            s->text[i] = (uint8_t)s->ids[i];
    s_escape(s->text, (size_t)len, s->line);
    TP_INFO("[TextSample] epoch %lld: %s", (long long)tp_trainer_epoch_num(tr), s->line);
    return TP_OK;
}

static const tp_callback_ops_t s_sample_ops = {
    .name = "TextSample",
    .trigger_epoch = sample_trigger_epoch,
    .destroy = s_free,
};

tp_callback_t *tp_cb_text_sample(const tp_text_sample_opts_t *o) {
    if (!o || !o->generate || o->tokens < 1 || !(o->temperature >= 0) || o->top_k < 0) {
        tp_error(TP_ERR_INVALID, "TextSample: %s", !o || !o->generate ? "no generator"
                 : o->tokens < 1 ? "tokens < 1" : o->top_k < 0 ? "top-k < 0"
                 : "temperature < 0");
        if (o && o->gen_destroy)
            o->gen_destroy(o->gen);
        return NULL;
    }
    s_sample_t *s = calloc(1, sizeof *s);
    if (!s) {
        if (o->gen_destroy)
            o->gen_destroy(o->gen);
        tp_error(TP_ERR_NOMEM, "TextSample");
        return NULL;
    }
    s->o = *o;  /* takes gen: s_free frees it from here on */
    s->o.vocab = s->o.merges = NULL;  /* read here only */
    /* nothing to continue: a line's start */
    const char *prompt = o->prompt && *o->prompt ? o->prompt : "\n";
    if (!(s->prompt = strdup(prompt))) {
        s_free(s);
        tp_error(TP_ERR_NOMEM, "TextSample: the prompt");
        return NULL;
    }
    s->o.prompt = s->prompt;
    size_t plen = strlen(prompt);
    if (o->vocab && *o->vocab) {
        int64_t np = 0;
        if (!(s->tk = tp_tokenizer_load(o->vocab, o->merges && *o->merges ? o->merges
                                                                            : NULL)) ||
            tp_tokenizer_encode(s->tk, prompt, plen, &s->pids, &np) != TP_OK) {
            tp_error_wrap(TP_ERR_INVALID, "TextSample: the tokenizer (%s)", o->vocab);
            s_free(s);
            return NULL;
        }
        s->plen = (size_t)np;
    } else if ((s->pids = malloc(plen * sizeof *s->pids))) {
        for (size_t i = 0; i < plen; i++)
            s->pids[i] = (uint8_t)prompt[i];
        s->plen = plen;
    }
    size_t n = s->plen + (size_t)o->tokens;
    if (!s->pids || !(s->ids = malloc(n * sizeof *s->ids))) {
        s_free(s);
        tp_error(TP_ERR_NOMEM, "TextSample: %zu tokens", n);
        return NULL;
    }
    return tp_callback_new(&s_sample_ops, s, /*chief_only=*/1);
}
