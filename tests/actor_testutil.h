/* towerpack tests: small helpers shared by the actor, supervisor and
 * process tests (datapoints that count themselves, tiny dataflows). */
#ifndef TP_ACTOR_TESTUTIL_H
#define TP_ACTOR_TESTUTIL_H

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>

/* Datapoints alive in this process (made by tu_dp). */
static atomic_long tu_live;

static void tu_free(void *data, void *hint) {
    (void)hint;
    free(data);
    atomic_fetch_sub(&tu_live, 1);
}

/* A datapoint of one int64 component holding `value`, plus `pad` bytes of
 * uint8 payload when pad > 0. */
static inline tp_datapoint_t *tu_dp(int64_t value, size_t pad) {
    tp_datapoint_t *dp = tp_datapoint_new(0);
    int64_t *v = malloc(sizeof *v);
    *v = value;
    tp_tensor_t t;
    tp_tensor_init_wrap(&t, TP_INT64, 0, NULL, v, tu_free, NULL);
    atomic_fetch_add(&tu_live, 1);
    tp_datapoint_append(dp, &t);
    if (pad) {
        int64_t shape[1] = {(int64_t)pad};
        tp_tensor_init_zero(&t, TP_UINT8, 1, shape);
        tp_datapoint_append(dp, &t);
    }
    return dp;
}

static inline int64_t tu_value(tp_datapoint_t *dp) {
    return *(const int64_t *)tp_datapoint_cget(dp, 0)->data;
}

/* ---- a counting dataflow: yields n datapoints 0..n-1 (value + stream *
 * 1000000 so streams can be told apart), optional pad bytes; fail_at >= 0
 * makes next fail at that index. */
typedef struct {
    int64_t n, i, pad, fail_at;
    uint64_t stream;
    int spin;  /* busy-loop iterations per datapoint (CPU-bound work) */
} tu_count_t;

static tp_status_t tu_count_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                  uint64_t stream) {
    (void)rng; (void)seed;
    ((tu_count_t *)impl)->stream = stream;
    return TP_OK;
}
static tp_status_t tu_count_begin(void *impl) {
    ((tu_count_t *)impl)->i = 0;
    return TP_OK;
}
static tp_status_t tu_count_next(void *impl, tp_datapoint_t **out) {
    tu_count_t *c = impl;
    if (c->i >= c->n)
        return TP_DONE;
    if (c->fail_at >= 0 && c->i == c->fail_at)
        return tp_error(TP_ERR_FORMAT, "count: planted failure at %lld",
                        (long long)c->i);
    volatile double x = 0;
    for (int k = 0; k < c->spin; k++)
        x += k * 0.5;
    *out = tu_dp(c->i++ + (int64_t)c->stream * 1000000, (size_t)c->pad);
    return TP_OK;
}
static int64_t tu_count_size(void *impl) { return ((tu_count_t *)impl)->n; }
static void tu_count_destroy(void *impl) { free(impl); }
static const tp_dataflow_ops_t tu_count_ops = {
    .name = "count", .reset_state = tu_count_reset, .begin = tu_count_begin,
    .next = tu_count_next, .size = tu_count_size, .destroy = tu_count_destroy};

static inline tp_dataflow_t *tu_count_df(int64_t n, size_t pad, int64_t fail_at) {
    tu_count_t *c = calloc(1, sizeof *c);
    c->n = n;
    c->pad = (int64_t)pad;
    c->fail_at = fail_at;
    return tp_dataflow_new(&tu_count_ops, c);
}

/* A fresh temp dir for ipc sockets; removed by tu_rmdir. */
static inline void tu_tmpdir(char *buf, size_t size) {
    snprintf(buf, size, "/tmp/tp-test-XXXXXX");
    if (!mkdtemp(buf))
        abort();
}

#endif
