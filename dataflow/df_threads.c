/* towerpack dataflow: MultiThreadMapData, a map run by N pthreads with a
 * bounded number of datapoints in flight.
 *
 * The inner dataflow is only ever touched by the consuming thread: each call
 * to next() first tops the pipeline up (pulls from the inner dataflow until
 * buffer_size datapoints are in flight), then waits for one result. Workers
 * take jobs from a FIFO of slots and put results back. In strict mode the
 * slot of job `seq` is seq % buffer_size and results are taken in seq
 * order; in non-strict mode slots come from a free list and results are
 * taken in the order they finish. One mutex guards the queues; datapoints
 * change hands only under it. */
#include <pthread.h>
#include <inttypes.h>
#include "df_internal.h"

enum { SLOT_FREE = 0, SLOT_QUEUED, SLOT_DONE };

typedef struct {
    int state;
    uint64_t seq;
    tp_datapoint_t *dp;    /* input while queued, result when done */
    tp_status_t rc;        /* TP_OK, TP_DF_DROP or < 0 */
    char err[256];         /* the worker's tp_last_error when rc < 0 */
} slot_t;

typedef struct {
    tp_dataflow_t *inner;
    int nthreads, cap, strict;
    tp_df_map_fn fn;
    void *user;
    tp_df_free_fn user_free;

    pthread_mutex_t mu;
    pthread_cond_t work_cv;    /* a job was queued, or stop */
    pthread_cond_t done_cv;    /* a job finished */
    pthread_t *threads;        /* [nthreads] */
    int started, stop;
    slot_t *slots;             /* [cap] */
    int *work_q;               /* FIFO of slot indices [cap] */
    int work_head, work_count;
    int *done_q;               /* non-strict: FIFO of finished slots [cap] */
    int done_head, done_count;
    int *free_stack;           /* non-strict: free slot indices [cap] */
    int free_count;

    /* consumer side (no lock needed: only the consuming thread) */
    uint64_t issued, taken;    /* job numbers handed out / results taken */
    int in_flight;
    int inner_done;            /* the inner pass ended (strict, or unsized) */
    int empty_passes;
    int64_t yielded, pass_len;
    uint64_t base_seed;
} mtmap_t;

static void *s_worker(void *arg) {
    mtmap_t *self = arg;
    pthread_mutex_lock(&self->mu);
    for (;;) {
        while (!self->stop && self->work_count == 0)
            pthread_cond_wait(&self->work_cv, &self->mu);
        if (self->stop)
            break;
        int k = self->work_q[self->work_head];
        self->work_head = (self->work_head + 1) % self->cap;
        self->work_count--;
        slot_t *s = &self->slots[k];
        tp_datapoint_t *dp = s->dp;
        s->dp = NULL;
        uint64_t seq = s->seq;
        pthread_mutex_unlock(&self->mu);

        /* Per-datapoint RNG: results do not depend on which thread ran. */
        tp_rng_t rng;
        tp_rng_init(&rng, self->base_seed, seq);
        tp_status_t rc = self->fn(&dp, &rng, self->user);
        char err[256] = "";
        if (rc < 0) {
            snprintf(err, sizeof err, "%s", tp_last_error());
            tp_datapoint_destroy(&dp);
        } else if (rc == TP_DF_DROP || !dp) {
            tp_datapoint_destroy(&dp);
            rc = TP_DF_DROP;
        } else if (rc != TP_OK) {
            snprintf(err, sizeof err, "map function returned %d", (int)rc);
            tp_datapoint_destroy(&dp);
            rc = TP_ERR_INVALID;
        }

        pthread_mutex_lock(&self->mu);
        s->dp = dp;
        s->rc = rc;
        memcpy(s->err, err, sizeof err);
        s->state = SLOT_DONE;
        if (!self->strict) {
            self->done_q[(self->done_head + self->done_count) % self->cap] = k;
            self->done_count++;
        }
        pthread_cond_broadcast(&self->done_cv);
    }
    pthread_mutex_unlock(&self->mu);
    return NULL;
}

static void s_stop_threads(mtmap_t *self) {
    if (!self->started)
        return;
    pthread_mutex_lock(&self->mu);
    self->stop = 1;
    pthread_cond_broadcast(&self->work_cv);
    pthread_mutex_unlock(&self->mu);
    for (int i = 0; i < self->started; i++)
        pthread_join(self->threads[i], NULL);
    self->started = 0;
    self->stop = 0;
}

/* Forget every job (threads stopped or idle): free datapoints and slots. */
static void s_clear_jobs(mtmap_t *self) {
    for (int i = 0; i < self->cap; i++) {
        tp_datapoint_destroy(&self->slots[i].dp);
        self->slots[i].state = SLOT_FREE;
        self->free_stack[i] = self->cap - 1 - i;
    }
    self->free_count = self->cap;
    self->work_head = self->work_count = 0;
    self->done_head = self->done_count = 0;
    self->in_flight = 0;
    self->taken = self->issued = 0;
    self->inner_done = 0;
}

static tp_status_t s_mt_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                              uint64_t stream) {
    mtmap_t *self = impl;
    s_stop_threads(self);
    s_clear_jobs(self);
    tp_rng_t r;
    tp_df_rng_derive(&r, seed, stream, "multithread-map");
    self->base_seed = tp_rng_u64(&r);
    TP_TRY(df_reset_inner(self->inner, seed, stream));
    for (int i = 0; i < self->nthreads; i++) {
        int err = pthread_create(&self->threads[i], NULL, s_worker, self);
        if (err) {
            s_stop_threads(self);
            return tp_error(TP_ERR_NOMEM, "multithread-map: starting thread "
                            "%d: %s", i, strerror(err));
        }
        self->started = i + 1;
    }
    return TP_OK;
}

/* Hand one datapoint to the workers. */
static void s_issue(mtmap_t *self, tp_datapoint_t *dp) {
    pthread_mutex_lock(&self->mu);
    int k;
    if (self->strict) {
        k = (int)(self->issued % (uint64_t)self->cap);
    } else {
        TP_ASSERT(self->free_count > 0);
        k = self->free_stack[--self->free_count];
    }
    slot_t *s = &self->slots[k];
    TP_ASSERT(s->state == SLOT_FREE);
    s->state = SLOT_QUEUED;
    s->seq = self->issued++;
    s->dp = dp;
    self->work_q[(self->work_head + self->work_count) % self->cap] = k;
    self->work_count++;
    pthread_cond_signal(&self->work_cv);
    pthread_mutex_unlock(&self->mu);
    self->in_flight++;
}

/* Wait for the next result (in order when strict); frees its slot. */
static tp_status_t s_take(mtmap_t *self, tp_datapoint_t **out) {
    pthread_mutex_lock(&self->mu);
    int k;
    if (self->strict) {
        k = (int)(self->taken % (uint64_t)self->cap);
        while (self->slots[k].state != SLOT_DONE)
            pthread_cond_wait(&self->done_cv, &self->mu);
    } else {
        while (self->done_count == 0)
            pthread_cond_wait(&self->done_cv, &self->mu);
        k = self->done_q[self->done_head];
        self->done_head = (self->done_head + 1) % self->cap;
        self->done_count--;
    }
    slot_t *s = &self->slots[k];
    tp_status_t rc = s->rc;
    *out = s->dp;
    s->dp = NULL;
    s->state = SLOT_FREE;
    if (!self->strict)
        self->free_stack[self->free_count++] = k;
    if (rc < 0)
        tp_error(rc, "multithread-map: %s", s->err);
    pthread_mutex_unlock(&self->mu);
    self->taken++;
    self->in_flight--;
    return rc;
}

static tp_status_t s_mt_begin(void *impl) {
    mtmap_t *self = impl;
    int64_t n = tp_dataflow_size(self->inner);
    self->pass_len = self->strict || n < 0 ? -1 : n;
    self->yielded = 0;
    return TP_OK;
}

static tp_status_t s_mt_next(void *impl, tp_datapoint_t **out) {
    mtmap_t *self = impl;
    for (;;) {
        if (self->pass_len >= 0 && self->yielded >= self->pass_len)
            return TP_DONE;
        while (!self->inner_done && self->in_flight < self->cap) {
            tp_datapoint_t *dp;
            tp_status_t rc = tp_dataflow_next(self->inner, &dp);
            if (rc == TP_DONE) {
                if (self->strict || self->pass_len < 0) {
                    self->inner_done = 1;
                    break;
                }
                /* non-strict with a known size: the inner runs forever */
                if (++self->empty_passes >= 2)
                    return tp_error(TP_ERR_STATE, "multithread-map: the inner "
                                    "dataflow '%s' yields nothing",
                                    tp_dataflow_name(self->inner));
                continue;
            }
            if (rc < 0)
                return rc;
            self->empty_passes = 0;
            s_issue(self, dp);
        }
        if (self->in_flight == 0) {
            TP_ASSERT(self->inner_done);
            self->inner_done = 0;
            return TP_DONE;
        }
        tp_datapoint_t *dp = NULL;
        tp_status_t rc = s_take(self, &dp);
        if (rc < 0)
            return rc;
        if (rc == TP_DF_DROP)
            continue;
        self->yielded++;
        *out = dp;
        return TP_OK;
    }
}

static int64_t s_mt_size(void *impl) {
    return tp_dataflow_size(((mtmap_t *)impl)->inner);
}

static void s_mt_end_pass(void *impl) {
    mtmap_t *self = impl;
    if (!self->strict)
        return;  /* passes mix anyway; keep the pipeline full */
    /* A strict pass is abandoned: drain what is in flight (it belongs to
     * the old pass) and end the inner pass too. */
    while (self->in_flight > 0) {
        tp_datapoint_t *dp = NULL;
        (void)s_take(self, &dp);
        tp_datapoint_destroy(&dp);
    }
    if (!self->inner_done)
        tp_dataflow_end_pass(self->inner);
    self->inner_done = 0;
}

/* The map's memory; also what a half-made map frees (free(NULL) is fine). */
static void s_mt_free(mtmap_t *self) {
    free(self->threads);
    free(self->slots);
    free(self->work_q);
    free(self->done_q);
    free(self->free_stack);
    free(self);
}

static void s_mt_destroy(void *impl) {
    mtmap_t *self = impl;
    s_stop_threads(self);
    if (self->slots)
        s_clear_jobs(self);
    if (self->user_free)
        self->user_free(self->user);
    tp_dataflow_destroy(&self->inner);
    pthread_mutex_destroy(&self->mu);
    pthread_cond_destroy(&self->work_cv);
    pthread_cond_destroy(&self->done_cv);
    s_mt_free(self);
}

static const tp_dataflow_ops_t s_mt_ops = {
    .name = "multithread-map", .reset_state = s_mt_reset,
    .begin = s_mt_begin, .next = s_mt_next, .size = s_mt_size,
    .destroy = s_mt_destroy, .end_pass = s_mt_end_pass};

tp_dataflow_t *tp_df_multithread_map(tp_dataflow_t *inner, int nthreads,
                                     int buffer_size, int strict,
                                     tp_df_map_fn fn, void *user,
                                     tp_df_free_fn user_free) {
    if (buffer_size == 0)
        buffer_size = 200;
    if (!inner || !fn || nthreads < 1 || nthreads > 1024 || buffer_size < 1 ||
        buffer_size > (1 << 20)) {
        if (user_free)
            user_free(user);
        if (inner) {
            tp_dataflow_destroy(&inner);
            tp_error(TP_ERR_INVALID, "multithread-map: %d threads (1..1024), "
                     "buffer %d (1..%d), function %s", nthreads, buffer_size,
                     1 << 20, fn ? "given" : "NULL");
        }
        return NULL;
    }
    mtmap_t *self = calloc(1, sizeof *self);
    if (self) {
        self->threads = calloc((size_t)nthreads, sizeof *self->threads);
        self->slots = calloc((size_t)buffer_size, sizeof *self->slots);
        self->work_q = calloc((size_t)buffer_size, sizeof(int));
        self->done_q = calloc((size_t)buffer_size, sizeof(int));
        self->free_stack = calloc((size_t)buffer_size, sizeof(int));
    }
    if (!self || !self->threads || !self->slots || !self->work_q ||
        !self->done_q || !self->free_stack) {
        if (self)
            s_mt_free(self);
        if (user_free)
            user_free(user);
        tp_dataflow_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "multithread-map");
        return NULL;
    }
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->work_cv, NULL);
    pthread_cond_init(&self->done_cv, NULL);
    self->inner = inner;
    self->nthreads = nthreads;
    self->cap = buffer_size;
    self->strict = strict;
    self->fn = fn;
    self->user = user;
    self->user_free = user_free;
    s_clear_jobs(self);
    return df_make(&s_mt_ops, self);
}
