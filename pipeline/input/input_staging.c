/* towerpack pipeline: StagingInput, one staging actor per tower over another
 * input (tensorpack's StagingInput).
 *
 * Each tower's stage is a thread with a small ring of slots in the tower's
 * memory (nr_stage + 1 of them: one the tower computes on, nr_stage staged
 * ahead). While the tower computes step s, its stage already takes the
 * batch of step s + 1 from the inner input and copies it into a free slot,
 * so the next step finds its batch where the tower reads it. At most
 * nr_stage batches are staged ahead of the one the tower holds. The copy goes
 * through tp_stage_ops_t: host memory and memcpy on the CPU; a device puts
 * its allocator and an asynchronous copy on a copy stream there.
 *
 * Order: the stages take from the inner input in turns (tower 0, 1, ...,
 * then 0 again), so tower i at step s gets the same batch a trainer taking
 * them in tower order on one thread would: runs stay reproducible and a
 * resumed run replays the same stream. A slot is freed when the datapoint
 * handed out is destroyed (its components' free function), so memory is
 * bounded by (nr_stage + 1) x batch bytes per tower. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/stats.h>
#include <towerpack/supervisor.h>
#include <towerpack/launch.h>

#define MAX_TOWERS 64
#define MAX_COMP 16
#define MAX_SLOTS (TP_STAGE_MAX + 1)

enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_LENT };

typedef struct s_stage s_stage_t;

typedef struct {
    s_stage_t *stage;
    int state;
    int ncomp;
    void *buf[MAX_COMP];      /* the tower's memory, kept between uses */
    size_t cap[MAX_COMP];
    tp_tensor_t meta[MAX_COMP]; /* dtype and shape of what was staged */
    atomic_int refs;          /* components handed out and not yet freed */
} s_slot_t;

typedef struct s_staging s_staging_t;

struct s_stage {
    s_staging_t *owner;
    int tower;
    pthread_t thread;
    int running;
    s_slot_t slots[MAX_SLOTS];
    int fill_at, take_at;     /* ring positions */
    int ahead;                /* slots filling or ready: at most nr_stage */
    uint64_t staged;
    uint64_t busy_ns, starved_ns, blocked_ns, waited_ns;
};

struct s_staging {
    tp_input_t *inner;
    int nr_stage;
    tp_stage_ops_t ops;
    int has_ops;
    int towers;
    double t_start;
    double watchdog_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t turn;             /* whose turn it is to take from the inner input */
    int stop;
    tp_status_t err;          /* the first stage failure */
    char msg[1024];
    s_stage_t stages[MAX_TOWERS];
};

/* ---- memory: host by default, the device's through tp_stage_ops_t ---- */

static void *s_alloc(s_staging_t *s, int tower, size_t bytes) {
    if (s->has_ops && s->ops.alloc)
        return s->ops.alloc(s->ops.user, tower, bytes);
    return tp_alloc(bytes ? bytes : 1);
}

static void s_free(s_staging_t *s, int tower, void *p) {
    if (!p)
        return;
    if (s->has_ops && s->ops.free)
        s->ops.free(s->ops.user, tower, p);
    else
        tp_free(p);
}

static tp_status_t s_copy(s_staging_t *s, int tower, void *dst, const void *src,
                          size_t bytes) {
    if (s->has_ops && s->ops.copy)
        return s->ops.copy(s->ops.user, tower, dst, src, bytes);
    memcpy(dst, src, bytes);
    return TP_OK;
}

static void s_timeout(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += (long)ms * 1000000L;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

/* Copy `dp` into the slot's buffers (grown when a batch is larger). */
static tp_status_t s_stage_into(s_staging_t *s, s_stage_t *st, s_slot_t *slot,
                                const tp_datapoint_t *dp) {
    int n = tp_datapoint_size(dp);
    if (n > MAX_COMP)
        return tp_error(TP_ERR_INVALID, "StagingInput tower%d: a batch with %d "
                        "components (at most %d)", st->tower, n, MAX_COMP);
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        if (slot->cap[i] < t->nbytes) {
            s_free(s, st->tower, slot->buf[i]);
            slot->buf[i] = s_alloc(s, st->tower, t->nbytes);
            if (!slot->buf[i]) {
                slot->cap[i] = 0;
                return tp_error(TP_ERR_NOMEM, "StagingInput tower%d: %zu bytes "
                                "for component %d", st->tower, t->nbytes, i);
            }
            slot->cap[i] = t->nbytes;
        }
        if (t->nbytes)
            TP_TRY(s_copy(s, st->tower, slot->buf[i], t->data, t->nbytes));
        slot->meta[i].dtype = t->dtype;
        slot->meta[i].ndim = t->ndim;
        memcpy(slot->meta[i].shape, t->shape, sizeof t->shape);
        slot->meta[i].nbytes = t->nbytes;
    }
    slot->ncomp = n;
    return TP_OK;
}

static void *s_stage_main(void *arg) {
    s_stage_t *st = arg;
    s_staging_t *s = st->owner;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* Wait for a free slot and this tower's turn at the inner input. */
        /* Waiting for a free slot is being blocked by the tower (its
         * stages are full); waiting for the turn is waiting for input. */
        uint64_t w0 = tp_now_ns();
        int full = st->slots[st->fill_at].state != SLOT_FREE || st->ahead >= s->nr_stage;
        while (!s->stop && s->err >= 0 &&
               (st->slots[st->fill_at].state != SLOT_FREE || st->ahead >= s->nr_stage ||
                s->turn % s->towers != st->tower))
            pthread_cond_wait(&s->cv, &s->mu);
        if (full)
            st->blocked_ns += tp_now_ns() - w0;
        else
            st->starved_ns += tp_now_ns() - w0;
        if (s->stop || s->err < 0)
            break;
        s_slot_t *slot = &st->slots[st->fill_at];
        slot->state = SLOT_FILLING;
        st->ahead++;
        pthread_mutex_unlock(&s->mu);

        /* Only this stage takes now (the turn is not passed yet). */
        uint64_t t0 = tp_now_ns();
        tp_datapoint_t *dp = NULL;
        tp_status_t rc = tp_input_next(s->inner, st->tower, &dp);
        uint64_t t1 = tp_now_ns();
        pthread_mutex_lock(&s->mu);
        s->turn++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (rc >= 0)
            rc = s_stage_into(s, st, slot, dp);
        tp_input_release(s->inner, st->tower, &dp);
        uint64_t t2 = tp_now_ns();

        pthread_mutex_lock(&s->mu);
        st->starved_ns += t1 - t0;   /* waiting for the inner input */
        st->busy_ns += t2 - t1;      /* copying into the tower's memory */
        if (rc < 0) {
            slot->state = SLOT_FREE;
            st->ahead--;
            if (s->err >= 0) {
                s->err = rc;
                snprintf(s->msg, sizeof s->msg, "StagingInput tower%d: %s",
                         st->tower, tp_last_error());
            }
            pthread_cond_broadcast(&s->cv);
            break;
        }
        slot->state = SLOT_READY;
        st->staged++;
        st->fill_at = (st->fill_at + 1) % (s->nr_stage + 1);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* The free function of a handed-out component: the last one frees the slot
 * for the stage to fill again. */
static void s_release(void *data, void *hint) {
    (void)data;
    s_slot_t *slot = hint;
    if (atomic_fetch_sub(&slot->refs, 1) != 1)
        return;
    s_staging_t *s = slot->stage->owner;
    pthread_mutex_lock(&s->mu);
    slot->state = SLOT_FREE;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void st_stop(void *impl);

static tp_status_t st_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    s_staging_t *s = impl;
    if (towers < 1 || towers > MAX_TOWERS)
        return tp_error(TP_ERR_INVALID, "StagingInput: %d towers (1..%d)", towers,
                        MAX_TOWERS);
    st_stop(s);
    TP_TRY(tp_input_start(s->inner, towers, seed, skip));
    s->towers = towers;
    s->turn = 0;
    s->stop = 0;
    s->err = TP_OK;
    s->t_start = tp_now_s();
    for (int i = 0; i < towers; i++) {
        s_stage_t *st = &s->stages[i];
        st->owner = s;
        st->tower = i;
        for (int k = 0; k < MAX_SLOTS; k++)
            st->slots[k].stage = st;
        if (pthread_create(&st->thread, NULL, s_stage_main, st) != 0) {
            st_stop(s);
            return tp_error(TP_ERR_NOMEM, "StagingInput: starting the stage of "
                            "tower%d", i);
        }
        st->running = 1;
    }
    return TP_OK;
}

static tp_status_t st_next(void *impl, int tower, tp_datapoint_t **out) {
    s_staging_t *s = impl;
    *out = NULL;
    if (tower < 0 || tower >= s->towers || !s->stages[tower].running)
        return tp_error(TP_ERR_STATE, "StagingInput: tower%d has no stage (started "
                        "for %d towers)", tower, s->towers);
    s_stage_t *st = &s->stages[tower];
    uint64_t w0 = tp_now_ns();
    double warned = 0;
    pthread_mutex_lock(&s->mu);
    s_slot_t *slot = &st->slots[st->take_at];
    /* A slot being filled is finished even after another stage failed:
     * batches taken before the failure are still delivered. */
    while (slot->state != SLOT_READY && (s->err >= 0 || slot->state == SLOT_FILLING)) {
        struct timespec ts;
        s_timeout(&ts, 100);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (slot->state == SLOT_READY)
            break;
        if (tp_signal_pending()) {
            pthread_mutex_unlock(&s->mu);
            return tp_error(TP_ERR_INTERRUPTED, "StagingInput: interrupted while "
                            "tower%d waited for its batch", tower);
        }
        double waited = (double)(tp_now_ns() - w0) * 1e-9;
        if (s->watchdog_s > 0 && waited - warned >= s->watchdog_s) {
            warned = waited;
            TP_WARN("step watchdog: tower%d has waited %.1f s for a batch: its "
                    "StagingInput stage is starved by the input %s", tower,
                    waited, tp_input_name(s->inner));
        }
    }
    if (slot->state != SLOT_READY) {
        tp_status_t err = s->err;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", s->msg);
        pthread_mutex_unlock(&s->mu);
        return tp_error(err, "%s", msg);
    }
    slot->state = SLOT_LENT;
    st->ahead--;
    pthread_cond_broadcast(&s->cv);  /* the stage may fill one more */
    st->take_at = (st->take_at + 1) % (s->nr_stage + 1);
    st->waited_ns += tp_now_ns() - w0;
    pthread_mutex_unlock(&s->mu);

    tp_datapoint_t *dp = tp_datapoint_new(slot->ncomp);
    if (!dp) {
        atomic_store(&slot->refs, 1);
        s_release(NULL, slot);
        return tp_error(TP_ERR_NOMEM, "StagingInput");
    }
    atomic_store(&slot->refs, slot->ncomp > 0 ? slot->ncomp : 1);
    for (int i = 0; i < slot->ncomp; i++) {
        const tp_tensor_t *m = &slot->meta[i];
        TP_ASSERT(tp_tensor_init_wrap(tp_datapoint_get(dp, i), m->dtype, m->ndim,
                                      m->shape, slot->buf[i], s_release, slot) == TP_OK);
    }
    if (slot->ncomp == 0)
        s_release(NULL, slot);
    *out = dp;
    return TP_OK;
}

static int64_t st_size(void *impl) {
    return tp_input_size(((s_staging_t *)impl)->inner);
}

/* Stop the stages (a stage inside the inner input's next returns when that
 * does), then the inner input. Slots still lent keep their memory until the
 * input is destroyed. */
static void st_stop(void *impl) {
    s_staging_t *s = impl;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < MAX_TOWERS; i++)
        if (s->stages[i].running) {
            pthread_join(s->stages[i].thread, NULL);
            s->stages[i].running = 0;
        }
}

static void st_destroy(void *impl) {
    s_staging_t *s = impl;
    st_stop(s);
    tp_input_destroy(&s->inner);
    for (int i = 0; i < MAX_TOWERS; i++)
        for (int k = 0; k < MAX_SLOTS; k++) {
            s_slot_t *slot = &s->stages[i].slots[k];
            /* a batch still lent out would read freed memory: a caller bug */
            if (slot->state == SLOT_LENT)
                TP_WARN("StagingInput: tower%d's batch is still in use at destroy", i);
            for (int c = 0; c < MAX_COMP; c++)
                s_free(s, i, slot->buf[c]);
        }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void st_set_watchdog(void *impl, double seconds) {
    s_staging_t *s = impl;
    s->watchdog_s = seconds;
    tp_input_set_watchdog(s->inner, seconds);
}

/* A stage's row: batches staged, time copying (busy), time waiting for
 * the inner input or its turn at it (starved), time waiting for the tower
 * to free a slot (blocked), staged slots over nr_stage. */
static void st_row(s_staging_t *s, int tower, tp_stats_row_t *row) {
    s_stage_t *st = &s->stages[tower];
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "StagingInput/tower%d", tower);
    pthread_mutex_lock(&s->mu);
    int ready = 0;
    for (int k = 0; k <= s->nr_stage; k++)
        ready += st->slots[k].state == SLOT_READY;
    row->state = s->err < 0 ? TP_ACTOR_FAILED : TP_ACTOR_RUNNING;
    row->msgs_out = st->staged;
    row->busy_s = (double)st->busy_ns * 1e-9;
    row->starved_s = (double)st->starved_ns * 1e-9;
    row->blocked_s = (double)st->blocked_ns * 1e-9;
    row->alive_s = tp_now_s() - s->t_start;
    row->queue_fill = (double)ready / (double)s->nr_stage;
    pthread_mutex_unlock(&s->mu);
}

/* The inner input's rows first (upstream), then one per stage. The lock is
 * the stages' own, held for a few loads: they never hold it while they
 * wait for the inner input or copy. */
static int st_stats(void *impl, tp_stats_row_t *rows, int max) {
    s_staging_t *s = impl;
    int n = tp_input_stats(s->inner, rows, max);
    for (int i = 0; i < s->towers && n < max; i++)
        if (s->stages[i].running)
            st_row(s, i, &rows[n++]);
    return n;
}

static int st_scalars(void *impl, tp_input_scalar_t *out, int max) {
    s_staging_t *s = impl;
    int n = tp_input_scalars(s->inner, out, max);
    if (n >= max || s->towers < 1)
        return n;
    double waited = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->towers; i++)
        waited += (double)s->stages[i].waited_ns * 1e-9;
    pthread_mutex_unlock(&s->mu);
    out[n++] = (tp_input_scalar_t){"StagingInput/towers_wait_s", waited};
    return n;
}

static const tp_input_ops_t s_staging_ops = {
    .name = "StagingInput", .start = st_start, .next = st_next, .size = st_size,
    .stop = st_stop, .destroy = st_destroy, .set_watchdog = st_set_watchdog,
    .stats = st_stats, .scalars = st_scalars,
};

tp_input_t *tp_input_staging(tp_input_t *inner, int nr_stage,
                             const tp_stage_ops_t *ops) {
    if (!inner) {
        tp_error(TP_ERR_INVALID, "StagingInput: no inner input");
        return NULL;
    }
    if (nr_stage < 0 || nr_stage > TP_STAGE_MAX) {
        tp_input_destroy(&inner);
        tp_error(TP_ERR_INVALID, "StagingInput: nr_stage %d (1..%d)", nr_stage,
                 TP_STAGE_MAX);
        return NULL;
    }
    s_staging_t *s = calloc(1, sizeof *s);
    if (!s) {
        tp_input_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "StagingInput");
        return NULL;
    }
    s->inner = inner;
    s->nr_stage = nr_stage ? nr_stage : 1;
    if (ops) {
        s->ops = *ops;
        s->has_ops = 1;
    }
    s->watchdog_s = 10;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    return tp_input_new(&s_staging_ops, s);
}

/* A StagingInput is recognised by its ops table, never by its name. */
static s_staging_t *s_staging(tp_input_t *input) {
    return input && tp_input_ops(input) == &s_staging_ops ? tp_input_impl(input)
                                                           : NULL;
}

tp_input_t *tp_input_staging_inner(tp_input_t *input) {
    s_staging_t *s = s_staging(input);
    return s ? s->inner : NULL;
}

tp_status_t tp_input_staging_stats(tp_input_t *input, int tower,
                                   tp_stats_row_t *row) {
    s_staging_t *s = s_staging(input);
    if (!s)
        return tp_error(TP_ERR_INVALID, "not a StagingInput");
    if (tower < 0 || tower >= s->towers || !s->stages[tower].running)
        return tp_error(TP_ERR_STATE, "StagingInput: no stage for tower%d", tower);
    st_row(s, tower, row);
    return TP_OK;
}

double tp_input_staging_waited_s(tp_input_t *input, int tower) {
    s_staging_t *s = s_staging(input);
    if (!s || tower < 0 || tower >= s->towers)
        return 0;
    pthread_mutex_lock(&s->mu);
    double w = (double)s->stages[tower].waited_ns * 1e-9;
    pthread_mutex_unlock(&s->mu);
    return w;
}
