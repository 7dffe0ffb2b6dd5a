/* towerpack pipeline: TextSample, what people read while a language model
 * trains (nanoGPT prints a sample; tensorpack's examples run a predictor
 * at each epoch's end). After every epoch it asks the caller's generator
 * for a continuation of a fixed prompt from the model's weights as they
 * are, and prints it to the log on one line. The generator is the
 * caller's (the model zoo's GPT for tp-train), so this room needs no model:
 * it owns the prompt, the sampling settings and the printing. Runs between
 * steps, as SampleGrid does: the generator may read the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/trainer_loop.h>

typedef struct {
    tp_text_sample_opts_t o;  /* o.prompt points at prompt */
    char *prompt;
    uint8_t *text;            /* [plen + tokens] */
    char *line;               /* [4 x (plen + tokens) + 1]: escaped */
} s_sample_t;

static void s_free(void *impl) {
    s_sample_t *s = impl;
    if (!s)
        return;
    if (s->o.gen_destroy)
        s->o.gen_destroy(s->o.gen);
    free(s->prompt);
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
    tp_status_t rc = s->o.generate(s->o.gen, m, &s->o, s->text);
    if (rc < 0)
        return tp_error_wrap(rc, "TextSample after epoch %lld",
                             (long long)tp_trainer_epoch_num(tr));
    size_t plen = strlen(s->prompt);
    s_escape(s->text, (plen ? plen : 1) + (size_t)s->o.tokens, s->line);
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
    const char *prompt = o->prompt ? o->prompt : "";
    size_t n = (strlen(prompt) ? strlen(prompt) : 1) + (size_t)o->tokens;
    if (!(s->prompt = strdup(prompt)) || !(s->text = malloc(n)) ||
        !(s->line = malloc(4 * n + 1))) {
        s_free(s);
        tp_error(TP_ERR_NOMEM, "TextSample: %zu bytes", n);
        return NULL;
    }
    s->o.prompt = s->prompt;
    return tp_callback_new(&s_sample_ops, s, /*chief_only=*/1);
}
