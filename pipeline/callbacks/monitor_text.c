/* towerpack pipeline: the monitors of a language model that need no model
 * (TokenThroughput, BitsPerByte): tokens a second of training, and the
 * validation cross-entropy in bits per byte. The launch registers both
 * when tp_train_config_t.tokens_per_sample says the data are text. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <towerpack/callback.h>
#include <towerpack/log.h>
#include "pipeline/callbacks/cb_internal.h"

double tp_bits_per_byte(double nats_per_token, double bytes_per_token) {
    if (!(bytes_per_token > 0))
        bytes_per_token = 1;
    return nats_per_token / M_LN2 / bytes_per_token;
}

/* ---- TokenThroughput ------------------------------------------------------ */

typedef struct {
    int64_t tokens_per_sample;
    tp_cb_epoch_clock_t clock; /* as ThroughputTracker's */
} s_tokens_t;

static tp_status_t tok_before_epoch(void *impl, tp_trainer_t *tr) {
    tp_cb_epoch_clock_start(&((s_tokens_t *)impl)->clock, tr);
    return TP_OK;
}

static tp_status_t tok_after_epoch(void *impl, tp_trainer_t *tr) {
    s_tokens_t *t = impl;
    double steps, el = tp_cb_epoch_clock_read(&t->clock, tr, &steps);
    int64_t sps = tp_trainer_samples_per_step(tr);
    if (el > 0 && sps > 0)
        tp_trainer_put_scalar(tr, "tokens_per_s",
                              steps * (double)sps * (double)t->tokens_per_sample / el);
    return TP_OK;
}

static void s_free(void *impl) { free(impl); }

static const tp_callback_ops_t s_tokens_ops = {
    .name = "TokenThroughput",
    .before_epoch = tok_before_epoch, .after_epoch = tok_after_epoch,
    .destroy = s_free,
};

tp_callback_t *tp_cb_token_throughput(int64_t tokens_per_sample) {
    if (tokens_per_sample <= 0) {
        tp_error(TP_ERR_INVALID, "TokenThroughput: %lld tokens per sample (> 0)",
                 (long long)tokens_per_sample);
        return NULL;
    }
    s_tokens_t *t = tp_cb_impl_alloc(sizeof *t, "TokenThroughput");
    if (!t)
        return NULL;
    t->tokens_per_sample = tokens_per_sample;
    return tp_callback_new(&s_tokens_ops, t, 0);
}

/* ---- BitsPerByte ----------------------------------------------------------- */

typedef struct {
    char cost[64], out[64];
    double bytes_per_token;
} s_bpb_t;

static void bpb_on_scalar(void *impl, tp_trainer_t *tr, const char *name, double value) {
    s_bpb_t *b = impl;
    /* the put below comes back here as `out`: it never equals `cost` */
    if (!strcmp(name, b->cost))
        tp_trainer_put_scalar(tr, b->out, tp_bits_per_byte(value, b->bytes_per_token));
}

static const tp_callback_ops_t s_bpb_ops = {
    .name = "BitsPerByte", .on_scalar = bpb_on_scalar, .destroy = s_free,
};

tp_callback_t *tp_cb_bits_per_byte(const char *cost, const char *out,
                                   double bytes_per_token) {
    cost = cost ? cost : "validation_cost";
    out = out ? out : "validation_bpb";
    if (!*cost || !*out || strlen(cost) >= 64 || strlen(out) >= 64 || !strcmp(cost, out)) {
        tp_error(TP_ERR_INVALID, "BitsPerByte: scalar names '%s' -> '%s' (two "
                 "different names of 1..63 characters)", cost, out);
        return NULL;
    }
    s_bpb_t *b = tp_cb_impl_alloc(sizeof *b, "BitsPerByte");
    if (!b)
        return NULL;
    snprintf(b->cost, sizeof b->cost, "%s", cost);
    snprintf(b->out, sizeof b->out, "%s", out);
    b->bytes_per_token = bytes_per_token > 0 ? bytes_per_token : 1;
    return tp_callback_new(&s_bpb_ops, b, 0);
}
