/* towerpack pipeline: ZMQInput, batches straight from tp-worker processes or
 * any remote sender (tensorpack's ZMQInput).
 *
 * A PULL socket bound or connected to the endpoints receives whole batches
 * in the wire format and the trainer's thread decodes them in place (zero
 * copy: the components borrow the received frames). No prefetch actor sits
 * in between: the senders are the prefetchers, and the socket's queue (its
 * high-water mark) is the prefetch queue. A malformed message is counted,
 * logged at most once a second and dropped; the count is a statistic. The
 * receiving is RemoteDataZMQ's (tp_df_remote); this is its input source.
 *
 * While next() waits, ZMQInput makes its own step watchdog the thread's
 * wait phase (tp_actor_wait_begin; the remote dataflow's wait calls
 * tp_actor_wait_tick every 100 ms), chained to the phase it replaces (the
 * trainer's supervision): after watchdog_s without a batch it names
 * itself and its senders, and the statistics count the wait in progress
 * as starved, so a stall shows while it lasts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/actor.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/stats.h>
#include <towerpack/launch.h>

typedef struct {
    tp_dataflow_t *df;
    char *endpoints;          /* as given, for the watchdog's message */
    uint64_t received;
    uint64_t waited_ns;       /* finished waits */
    double t_start;           /* 0 until started */
    double watchdog_s;        /* 10 s by default, 0: off */
    /* the wait in progress (all on the receiving thread) */
    uint64_t wait_t0;         /* 0: none */
    double warned;            /* seconds of this wait at the last warning */
    int tower;
    tp_wait_phase_t phase;    /* s_wait_tick: the watchdog */
    const tp_wait_phase_t *outer;  /* the phase it replaced, run after it */
} s_zmq_t;

static tp_status_t z_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    s_zmq_t *z = impl;
    (void)towers;
    /* The socket is made here, on the thread that will receive. */
    TP_TRY(tp_dataflow_reset_state(z->df, seed, 0));
    z->t_start = tp_now_s();
    if (skip > 0)  /* a remote stream cannot be replayed: resuming takes new data */
        TP_INFO("ZMQInput: resuming without replay (%lld batches were taken "
                "before; senders decide what comes next)", (long long)skip);
    return TP_OK;
}

/* The wait's phase (every 100 ms while next() waits): the watchdog, then
 * the phase it replaced (the trainer's supervision, which also publishes
 * the rows: z_stats sees the wait in progress). */
static int s_wait_tick(void *arg) {
    s_zmq_t *z = arg;
    double waited = (double)(tp_now_ns() - z->wait_t0) * 1e-9;
    if (z->watchdog_s > 0 && waited - z->warned >= z->watchdog_s) {
        z->warned = waited;
        char senders[512];
        tp_df_remote_describe(z->df, senders, sizeof senders);
        TP_WARN("step watchdog: tower%d has waited %.1f s for a batch: the input "
                "(ZMQInput %s) has had no batch for %.0f s; %s", z->tower, waited,
                z->endpoints, waited, senders);
    }
    return z->outer && z->outer->run(z->outer->arg);
}

static tp_status_t z_next(void *impl, int tower, tp_datapoint_t **out) {
    s_zmq_t *z = impl;
    uint64_t t0 = tp_now_ns();
    z->wait_t0 = t0;
    z->warned = 0;
    z->tower = tower;
    z->outer = tp_actor_wait_begin(&z->phase);
    tp_status_t rc = tp_dataflow_next(z->df, out);
    tp_actor_wait_end(z->outer);
    z->outer = NULL;
    z->wait_t0 = 0;
    z->waited_ns += tp_now_ns() - t0;
    if (rc == TP_DONE)
        return tp_error(TP_ERR_STATE, "ZMQInput: the remote stream ended");
    if (rc < 0)
        return tp_error_wrap(rc, "ZMQInput (tower%d)", tower);
    z->received++;
    return TP_OK;
}

static int64_t z_size(void *impl) { (void)impl; return -1; }

static void z_destroy(void *impl) {
    s_zmq_t *z = impl;
    tp_dataflow_destroy(&z->df);
    free(z->endpoints);
    free(z);
}

static void z_set_watchdog(void *impl, double seconds) {
    ((s_zmq_t *)impl)->watchdog_s = seconds;
}

/* The receiver's row. It receives on the trainer's thread, so its time
 * is the trainer's: starved is the time spent waiting for (and decoding)
 * a batch, the wait in progress included (the trainer publishes the rows
 * from inside the wait); nothing is counted busy. Bytes are the wire
 * bytes received. Everything here but the bytes is written by that same
 * thread. */
static int z_stats(void *impl, tp_stats_row_t *rows, int max) {
    s_zmq_t *z = impl;
    if (z->t_start <= 0 || max < 1)
        return 0;
    /* upstream first: the tp-worker processes that feed it, as they
     * reported on the data socket (their own pid and host) */
    int n = tp_df_remote_rows(z->df, rows, max - 1);
    tp_stats_row_t *r = &rows[n];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "ZMQInput");
    r->state = TP_ACTOR_RUNNING;
    r->msgs_in = z->received;
    r->bytes_in = tp_df_remote_bytes(z->df);
    uint64_t waiting = z->wait_t0 ? tp_now_ns() - z->wait_t0 : 0;
    r->starved_s = (double)(z->waited_ns + waiting) * 1e-9;
    r->alive_s = tp_now_s() - z->t_start;
    r->queue_fill = -1;  /* the socket's queue is not visible */
    return n + 1;
}

static int z_scalars(void *impl, tp_input_scalar_t *out, int max) {
    s_zmq_t *z = impl;
    if (max < 1)
        return 0;
    out[0] = (tp_input_scalar_t){"ZMQInput/malformed",
                                 (double)tp_df_remote_malformed(z->df)};
    if (max < 2)
        return 1;
    out[1] = (tp_input_scalar_t){"ZMQInput/unfit", (double)tp_df_remote_unfit(z->df)};
    if (max < 3)
        return 2;
    /* issue 47: messages of senders of another job (the job handshake) */
    out[2] = (tp_input_scalar_t){"ZMQInput/refused", (double)tp_df_remote_refused(z->df)};
    return 3;
}

static const tp_input_ops_t s_zmq_ops = {
    .name = "ZMQInput", .start = z_start, .next = z_next, .size = z_size,
    .destroy = z_destroy, .stats = z_stats, .scalars = z_scalars,
    .set_watchdog = z_set_watchdog,
};

tp_input_t *tp_input_zmq(const char *endpoints, const tp_remote_opts_t *opts) {
    tp_remote_opts_t o;
    if (opts)
        o = *opts;
    else
        tp_remote_opts_init(&o);
    tp_dataflow_t *df = endpoints ? tp_df_remote(endpoints, &o) : NULL;
    if (!df) {
        if (!endpoints)
            tp_error(TP_ERR_INVALID, "ZMQInput: no endpoint");
        else
            tp_error_wrap(TP_ERR_INVALID, "ZMQInput %s", endpoints);
        return NULL;
    }
    s_zmq_t *z = calloc(1, sizeof *z);
    if (z && !(z->endpoints = strdup(endpoints))) {
        free(z);
        z = NULL;
    }
    if (!z) {
        tp_dataflow_destroy(&df);
        tp_error(TP_ERR_NOMEM, "ZMQInput");
        return NULL;
    }
    z->df = df;
    z->watchdog_s = 10;
    z->phase = (tp_wait_phase_t){s_wait_tick, z};
    return tp_input_new(&s_zmq_ops, z);
}

/* A ZMQInput is recognised by its ops table, never by its name. */
static s_zmq_t *s_zmq(tp_input_t *input) {
    return input && tp_input_ops(input) == &s_zmq_ops ? tp_input_impl(input) : NULL;
}

uint64_t tp_input_zmq_received(tp_input_t *input) {
    s_zmq_t *z = s_zmq(input);
    return z ? z->received : 0;
}

uint64_t tp_input_zmq_malformed(tp_input_t *input) {
    s_zmq_t *z = s_zmq(input);
    return z ? tp_df_remote_malformed(z->df) : 0;
}

double tp_input_zmq_waited_s(tp_input_t *input) {
    s_zmq_t *z = s_zmq(input);
    return z ? (double)z->waited_ns * 1e-9 : 0;
}

/* The model's inputs (batch first) as a remote dataflow's expectations:
 * the batch dimension `batch` (<= 0: any), integer inputs in
 * 0..classes-1 when classes > 0. */
static tp_status_t s_expect_of(const tp_input_desc_t *inputs, int n, int64_t batch,
                               int64_t classes, tp_remote_expect_t *e) {
    if (n < 0 || n > 16)
        return tp_error(TP_ERR_INVALID, "expect: %d inputs (at most 16)", n);
    for (int i = 0; i < n; i++) {
        /* the model's description has the batch dimension first */
        tp_dtype_t dt = inputs[i].dtype;
        int integer = dt == TP_UINT8 || dt == TP_INT32 || dt == TP_INT64;
        /* uint8 is an image's (its values are pixels); int32 and int64
         * inputs are labels or tokens */
        e[i] = (tp_remote_expect_t){.name = inputs[i].name, .dtype = dt,
                                    .ndim = inputs[i].ndim,
                                    .bound = integer && dt != TP_UINT8 && classes > 0
                                                 ? classes : 0};
        for (int k = 0; k < inputs[i].ndim && k < TP_MAX_DIMS; k++)
            e[i].shape[k] = k == 0 ? (batch > 0 ? batch : -1) : inputs[i].shape[k];
    }
    return TP_OK;
}

tp_status_t tp_input_zmq_expect(tp_input_t *input, const tp_input_desc_t *inputs, int n,
                                int64_t batch, int64_t classes) {
    s_zmq_t *z = s_zmq(input);
    if (!z)
        return tp_error(TP_ERR_INVALID, "tp_input_zmq_expect: not a ZMQInput");
    tp_remote_expect_t e[16];
    TP_TRY(s_expect_of(inputs, n, batch, classes, e));
    return tp_df_remote_expect(z->df, e, n);
}

tp_status_t tp_input_expect_dataflow(tp_dataflow_t *df, const tp_input_desc_t *inputs,
                                     int n, int64_t batch, int64_t classes) {
    tp_remote_expect_t e[16];
    TP_TRY(s_expect_of(inputs, n, batch, classes, e));
    return tp_df_expect(df, e, n);
}

uint64_t tp_input_zmq_bytes(tp_input_t *input) {
    s_zmq_t *z = s_zmq(input);
    return z ? tp_df_remote_bytes(z->df) : 0;
}
