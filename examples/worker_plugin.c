/* towerpack example: a tp-worker plugin.
 *
 * Build:  cc -shared -fPIC -I/path/to/towerpack/include worker_plugin.c \
 *            -o libcount_plugin.so
 * Run:    tp-worker --plugin ./libcount_plugin.so --plugin-arg 1000 \
 *            --plugin-arg 4096 --connect ipc:///tmp/data.sock
 *
 * The plugin exports tp_worker_dataflow (TP_WORKER_FACTORY): it gets its
 * --plugin-arg values (argv[0] is the plugin path) and returns a new
 * dataflow. Here: N datapoints per pass, each an int64 counter and PAD
 * bytes of payload. */
#include <stdlib.h>
#include <string.h>
#include <towerpack/actor_dataflow.h>

typedef struct {
    int64_t n, i, pad;
} count_t;

static tp_status_t count_begin(void *impl) {
    ((count_t *)impl)->i = 0;
    return TP_OK;
}

static tp_status_t count_next(void *impl, tp_datapoint_t **out) {
    count_t *c = impl;
    if (c->i >= c->n)
        return TP_DONE;
    tp_datapoint_t *dp = tp_datapoint_new(0);
    tp_tensor_t t;
    if (!dp || tp_tensor_init(&t, TP_INT64, 0, NULL) < 0) {
        tp_datapoint_destroy(&dp);
        return tp_error(TP_ERR_NOMEM, "count plugin");
    }
    *(int64_t *)t.data = c->i++;
    tp_datapoint_append(dp, &t);
    if (c->pad > 0) {
        int64_t shape[1] = {c->pad};
        tp_tensor_init_zero(&t, TP_UINT8, 1, shape);
        tp_datapoint_append(dp, &t);
    }
    *out = dp;
    return TP_OK;
}

static int64_t count_size(void *impl) { return ((count_t *)impl)->n; }
static void count_destroy(void *impl) { free(impl); }

static const tp_dataflow_ops_t count_ops = {
    .name = "count-plugin", .begin = count_begin, .next = count_next,
    .size = count_size, .destroy = count_destroy};

tp_status_t tp_worker_dataflow(int argc, char **argv, tp_dataflow_t **out) {
    count_t *c = calloc(1, sizeof *c);
    if (!c)
        return tp_error(TP_ERR_NOMEM, "count plugin");
    c->n = argc > 1 ? atoll(argv[1]) : 100;
    c->pad = argc > 2 ? atoll(argv[2]) : 0;
    if (c->n <= 0) {
        free(c);
        return tp_error(TP_ERR_INVALID, "count plugin: N must be > 0 (got '%s')",
                        argc > 1 ? argv[1] : "");
    }
    *out = tp_dataflow_new(&count_ops, c);
    return *out ? TP_OK : tp_error(TP_ERR_NOMEM, "count plugin");
}
