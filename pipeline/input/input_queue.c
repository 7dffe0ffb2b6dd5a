/* towerpack pipeline: QueueInput, tensorpack's default input for a
 * dataflow. A prefetch actor runs the dataflow and pushes batches, by
 * pointer over inproc, into a bounded queue (50 by default); the trainer's
 * thread takes from it. While the towers compute (and while epoch-end
 * callbacks run) the queue fills, so the next step's batches are ready.
 *
 * The dataflow is reset on the caller's thread, before the actor starts:
 * a process-parallel dataflow forks its workers there (the fork rule).
 *
 * Batches the trainer is done with come back (tp_input_release) and the
 * actor frees them before it makes the next one. Freeing a batch on the
 * trainer's thread cost about 1.5 us a step: the allocator's lock and the
 * batch's headers are lines last written on the actor's core. The trainer
 * only pushes the batch on a lock-free list (one compare-and-swap); the
 * list never holds more than the batches taken since the actor last ran,
 * which the queue bounds. */
#include <czmq.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <towerpack/actor.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/process.h>
#include <towerpack/supervisor.h>
#include <towerpack/launch.h>

typedef struct {
    tp_dataflow_t *df;
    int capacity;
    int64_t skip;             /* datapoints to drop first (resume) */
    char endpoint[96];
    tp_actor_port_t port;
    tp_actor_def_t def;
    tp_actor_t *actor;
    tp_port_reader_t *reader; /* the trainer's end of the queue */
    tp_actor_port_t in;
    double watchdog_s;
    /* Set by the prefetch actor when it fails, read by whichever thread
     * takes the batches (the trainer's, or a StagingInput's): that thread
     * learns of the failure without touching the actor's pipe, which
     * belongs to the thread that started it. */
    atomic_int failed;
    tp_status_t fail_rc;
    char why[512];
    /* Given back, to free: pushed by any thread while the actor runs,
     * emptied by the actor (and by q_stop once it has ended). */
    _Atomic(tp_datapoint_t *) returned;
    atomic_int accepting;   /* 1 while the actor runs */
} s_queue_t;

/* Free every batch given back so far. */
static void q_free_returned(s_queue_t *q) {
    if (!atomic_load_explicit(&q->returned, memory_order_relaxed))
        return;
    tp_datapoint_t *dp = atomic_exchange_explicit(&q->returned, NULL, memory_order_acquire);
    while (dp) {
        tp_datapoint_t *next = *tp_datapoint_link(dp);
        tp_datapoint_destroy(&dp);
        dp = next;
    }
}

/* In the actor's thread, with tp_last_error() saying why (without the
 * "QueueInput" q_next puts before it for the thread that takes the batch). */
static tp_status_t q_fail(s_queue_t *q, tp_status_t rc) {
    snprintf(q->why, sizeof q->why, "%s", tp_last_error());
    q->fail_rc = rc;
    atomic_store_explicit(&q->failed, 1, memory_order_release);
    return rc;
}

static tp_status_t q_produce(tp_actor_ctx_t *ctx, void *state) {
    s_queue_t *q = state;
    q_free_returned(q);
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_dataflow_next(q->df, &dp);
    if (rc == TP_DONE) {  /* a new pass: epochs are the trainer's business */
        rc = tp_dataflow_next(q->df, &dp);
        if (rc == TP_DONE)
            return q_fail(q, tp_error(TP_ERR_STATE, "the dataflow %s is empty",
                                      tp_dataflow_name(q->df)));
    }
    if (rc < 0)
        return q_fail(q, tp_error_wrap(rc, "dataflow %s", tp_dataflow_name(q->df)));
    if (q->skip > 0) {
        q->skip--;
        tp_datapoint_destroy(&dp);
        return TP_OK;
    }
    rc = tp_actor_send(ctx, 0, &dp);
    return rc < 0 ? q_fail(q, rc) : rc;
}

static tp_status_t q_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    s_queue_t *q = impl;
    TP_TRY(tp_dataflow_reset_state(q->df, seed, 0));
    q->skip = skip;
    static atomic_int s_counter;
    snprintf(q->endpoint, sizeof q->endpoint, "inproc://tp-queue-input-%d-%d",
             (int)getpid(), atomic_fetch_add(&s_counter, 1));
    q->port = (tp_actor_port_t){.name = "out", .endpoint = q->endpoint, .bind = 1,
                                .hwm = q->capacity};
    q->def = (tp_actor_def_t){.name = "QueueInput", .outputs = &q->port,
                              .noutputs = 1, .produce = q_produce};
    atomic_store_explicit(&q->accepting, 1, memory_order_relaxed);
    q->actor = tp_actor_new(&q->def, q);
    if (!q->actor)
        return tp_error_wrap(TP_ERR_STATE, "starting QueueInput");
    q->in = (tp_actor_port_t){.name = "in", .endpoint = q->endpoint, .bind = 0,
                              .hwm = q->capacity};
    q->reader = tp_port_reader_new(&q->in, "trainer");
    if (!q->reader)
        return tp_error_wrap(TP_ERR_IO, "QueueInput");
    return TP_OK;
}

/* The next batch: waits for the prefetch actor, never forever. A failed or
 * ended actor, or a signal, ends the wait with its reason; a long wait is
 * reported by the step watchdog, naming the starving input. */
static tp_status_t q_next(void *impl, int tower, tp_datapoint_t **out) {
    s_queue_t *q = impl;
    *out = NULL;
    double waited = 0, warned = 0;
    for (;;) {
        tp_status_t rc = tp_port_reader_recv(q->reader, out, 100);
        if (rc == TP_OK)
            return TP_OK;
        if (atomic_load_explicit(&q->failed, memory_order_acquire)) {
            tp_error(q->fail_rc, "%s", q->why);
            return tp_error_wrap(q->fail_rc, "QueueInput");
        }
        if (rc == TP_DONE)  /* end-of-stream: the actor was stopped */
            return tp_error(TP_ERR_STATE, "QueueInput ended: stopped");
        if (tp_signal_pending())
            return tp_error(TP_ERR_INTERRUPTED, "QueueInput: interrupted while "
                            "waiting for data");
        if (tp_actor_wait_tick())  /* the wait's phase says stop */
            return tp_error(TP_ERR_INTERRUPTED, "QueueInput: the wait for data "
                            "was ended: the training tree stopped");
        waited += 0.1;
        if (q->watchdog_s > 0 && waited - warned >= q->watchdog_s) {
            warned = waited;
            TP_WARN("step watchdog: tower%d has waited %.1f s for a batch: the "
                    "input (QueueInput, dataflow %s) is starving the towers",
                    tower, waited, tp_dataflow_name(q->df));
        }
    }
}

static int64_t q_size(void *impl) { return tp_dataflow_size(((s_queue_t *)impl)->df); }

/* Stop order: the producer first (it may be blocked on a full queue: stop
 * and destroy end that wait), then the reader, which frees whatever is
 * still queued. */
static void q_stop(void *impl) {
    s_queue_t *q = impl;
    atomic_store_explicit(&q->accepting, 0, memory_order_relaxed);
    if (q->actor) {
        tp_actor_stop(q->actor);
        tp_actor_destroy(&q->actor);
    }
    tp_port_reader_destroy(&q->reader);
    q_free_returned(q);
}

/* Any thread. Once the input is stopping, the caller frees the batch. */
static void q_release(void *impl, int tower, tp_datapoint_t *dp) {
    s_queue_t *q = impl;
    (void)tower;
    if (!atomic_load_explicit(&q->accepting, memory_order_relaxed)) {
        tp_datapoint_destroy(&dp);
        return;
    }
    tp_datapoint_t **link = tp_datapoint_link(dp);
    *link = atomic_load_explicit(&q->returned, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&q->returned, link, dp,
                                                  memory_order_release,
                                                  memory_order_relaxed))
        ;
}

static void q_destroy(void *impl) {
    s_queue_t *q = impl;
    q_stop(q);
    tp_dataflow_destroy(&q->df);
    free(q);
}

static void q_set_watchdog(void *impl, double seconds) {
    ((s_queue_t *)impl)->watchdog_s = seconds;
}

/* Batches ready in the queue over its capacity, in [0, 1], from the
 * prefetch actor's count of batches sent and the reader's of batches
 * taken (neither waits for the other thread). */
static double q_fill(const s_queue_t *q, const tp_stats_row_t *row) {
    uint64_t taken = q->reader ? tp_port_reader_count(q->reader) : 0;
    double queued = row->msgs_out >= taken ? (double)(row->msgs_out - taken) : 0;
    double fill = queued / (double)q->capacity;
    return fill > 1 ? 1 : fill;
}

/* The prefetch actor's row, with the fill of the queue it fills (a source
 * has no input queue of its own to show there). Never waits on the actor:
 * it is often blocked on the full queue, and the supervisor reads these
 * between steps. */
static tp_status_t q_row(s_queue_t *q, tp_stats_row_t *row) {
    if (!q->actor)
        return tp_error(TP_ERR_STATE, "QueueInput not started");
    TP_TRY(tp_actor_stats_recent(q->actor, row));
    row->queue_fill = q_fill(q, row);
    return TP_OK;
}

/* Upstream first: the dataflow's forked workers (the readers, when its
 * chain has `processes N`: one row each, with its process), then the
 * prefetch actor. */
static int q_stats(void *impl, tp_stats_row_t *rows, int max) {
    s_queue_t *q = impl;
    int n = tp_df_multiprocess_rows(q->df, rows, max - 1);
    /* and the tp-worker processes feeding a remote: source in the chain */
    n += tp_df_remote_rows(q->df, rows + n, max - 1 - n);
    return q_row(q, &rows[n]) == TP_OK ? n + 1 : n;
}

/* The queue's fill and blocked time; with forked dataflow workers
 * (`processes N` anywhere in the chain) also how many were restarted. */
static int q_scalars(void *impl, tp_input_scalar_t *out, int max) {
    s_queue_t *q = impl;
    tp_stats_row_t row;
    if (max < 2 || q_row(q, &row) != TP_OK)
        return 0;
    out[0] = (tp_input_scalar_t){"QueueInput/queue_fill", row.queue_fill};
    out[1] = (tp_input_scalar_t){"QueueInput/blocked_s", row.blocked_s};
    int n = 2;
    /* Bad image files skipped (skip-bad) by the image sources, in this
     * process or in forked workers (their reports) */
    int64_t skipped = tp_df_skipped_files(q->df);
    if (skipped >= 0 && n < max)
        out[n++] = (tp_input_scalar_t){"dataflow/skipped_files", (double)skipped};
    int restarts = tp_df_multiprocess_restarts(q->df);
    if (restarts < 0 || n >= max)
        return n;
    out[n++] = (tp_input_scalar_t){"dataflow/worker_restarts", (double)restarts};
    /* Each worker's resident memory now and at its peak, in MB: a worker
     * whose memory grows epoch after epoch shows here (worker N is the
     * N-th live one). */
    int pids[64];
    int np = tp_df_multiprocess_pids(q->df, pids, 64);
    for (int i = 0; i < np && n + 2 <= max; i++) {
        int64_t rss, peak;
        if (tp_process_memory(pids[i], &rss, &peak) != TP_OK) {
            tp_clear_error();  /* it just died: the restart count says so */
            continue;
        }
        snprintf(out[n].name, sizeof out[n].name, "memory/worker%d_rss_mb", i);
        out[n++].value = (double)rss / 1024.0;
        snprintf(out[n].name, sizeof out[n].name, "memory/worker%d_peak_mb", i);
        out[n++].value = (double)peak / 1024.0;
    }
    return n;
}

static const tp_input_ops_t s_queue_ops = {
    .name = "QueueInput", .start = q_start, .next = q_next, .size = q_size,
    .stop = q_stop, .destroy = q_destroy, .set_watchdog = q_set_watchdog,
    .release = q_release, .stats = q_stats, .scalars = q_scalars,
};

tp_input_t *tp_input_queue(tp_dataflow_t *df, int capacity) {
    if (!df)
        return NULL;
    s_queue_t *q = calloc(1, sizeof *q);
    if (!q) {
        tp_dataflow_destroy(&df);
        tp_error(TP_ERR_NOMEM, "QueueInput");
        return NULL;
    }
    q->df = df;
    q->capacity = capacity > 0 ? capacity : 50;
    q->watchdog_s = 10;
    return tp_input_new(&s_queue_ops, q);
}

/* The QueueInput behind `input` (itself, or the one a StagingInput
 * stages), recognised by its ops table, never by its name; NULL for
 * another kind. */
static s_queue_t *s_queue(tp_input_t *input) {
    if (!input)
        return NULL;
    tp_input_t *inner = tp_input_staging_inner(input);
    if (inner)
        input = inner;
    return tp_input_ops(input) == &s_queue_ops ? tp_input_impl(input) : NULL;
}

tp_status_t tp_input_queue_stats(tp_input_t *input, tp_stats_row_t *row) {
    s_queue_t *q = s_queue(input);
    if (!q)
        return tp_error(TP_ERR_INVALID, "not a QueueInput");
    return q_row(q, row);
}

uint64_t tp_input_queue_taken(tp_input_t *input) {
    s_queue_t *q = s_queue(input);
    return q && q->reader ? tp_port_reader_count(q->reader) : 0;
}

double tp_input_queue_waited_s(tp_input_t *input) {
    s_queue_t *q = s_queue(input);
    return q && q->reader ? tp_port_reader_waited_s(q->reader) : 0;
}

double tp_input_queue_fill(tp_input_t *input) {
    s_queue_t *q = s_queue(input);
    tp_stats_row_t row;
    if (!q || q_row(q, &row) != TP_OK)
        return -1;
    return row.queue_fill;
}
