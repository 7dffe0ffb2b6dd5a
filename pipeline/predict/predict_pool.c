/* towerpack pipeline: predictors over several threads (tensorpack's
 * MultiThreadAsyncPredictor and DataParallelOfflinePredictor).
 *
 * Neither shares a predictor between threads: a predictor owns the buffers
 * of its graph, so each worker thread has its own (its own copy of the
 * weights too; a model is small next to the batches it serves). The async
 * predictor's workers take requests from one bounded ring under a mutex;
 * the data-parallel predictor hands each of its tower threads a slice of
 * the batch and waits for all of them (a generation counter says "new
 * work"), then joins the slices in order. A future is the async
 * predictor's callback made into an object the caller waits on. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <towerpack/predict.h>

/* ---- async --------------------------------------------------------------- */

typedef struct {
    tp_tensor_t in[TP_PREDICT_MAX_IO]; /* owned copies of the caller's */
    tp_predict_cb cb;
    void *user;
} s_req_t;

typedef struct s_worker {
    struct tp_async_predictor *ap;
    tp_predictor_t *pred;
    pthread_t thread;
    int started;
} s_worker_t;

struct tp_async_predictor {
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full, idle;
    s_req_t *ring;     /* [cap] */
    int cap, head, count;
    int64_t pending;   /* put and not yet called back */
    int stop;
    s_worker_t *workers;
    int nworkers, nin, nout;
};

static void s_req_fini(s_req_t *r, int nin) {
    for (int i = 0; i < nin; i++)
        tp_tensor_fini(&r->in[i]);
}

static void *s_async_main(void *arg) {
    s_worker_t *w = arg;
    struct tp_async_predictor *ap = w->ap;
    for (;;) {
        pthread_mutex_lock(&ap->mu);
        while (ap->count == 0 && !ap->stop)
            pthread_cond_wait(&ap->not_empty, &ap->mu);
        if (ap->count == 0) { /* stopping, and the queue is drained */
            pthread_mutex_unlock(&ap->mu);
            return NULL;
        }
        s_req_t r = ap->ring[ap->head];
        ap->head = (ap->head + 1) % ap->cap;
        ap->count--;
        pthread_cond_signal(&ap->not_full);
        pthread_mutex_unlock(&ap->mu);

        tp_tensor_t out[TP_PREDICT_MAX_IO];
        tp_status_t rc = tp_predictor_run(w->pred, r.in, out);
        r.cb(rc, rc == TP_OK ? out : NULL, rc == TP_OK ? ap->nout : 0, r.user);
        if (rc == TP_OK)
            for (int j = 0; j < ap->nout; j++)
                tp_tensor_fini(&out[j]);
        s_req_fini(&r, ap->nin);

        pthread_mutex_lock(&ap->mu);
        if (--ap->pending == 0)
            pthread_cond_broadcast(&ap->idle);
        pthread_mutex_unlock(&ap->mu);
    }
}

void tp_async_predictor_destroy(tp_async_predictor_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_async_predictor_t *ap = *self_p;
    pthread_mutex_lock(&ap->mu);
    ap->stop = 1;
    pthread_cond_broadcast(&ap->not_empty);
    pthread_cond_broadcast(&ap->not_full);
    pthread_mutex_unlock(&ap->mu);
    for (int i = 0; i < ap->nworkers; i++)
        if (ap->workers[i].started)
            pthread_join(ap->workers[i].thread, NULL);
    /* requests no worker could take (none started) */
    for (; ap->count > 0; ap->count--) {
        s_req_t *r = &ap->ring[ap->head];
        r->cb(TP_ERR_INTERRUPTED, NULL, 0, r->user);
        s_req_fini(r, ap->nin);
        ap->head = (ap->head + 1) % ap->cap;
    }
    for (int i = 0; i < ap->nworkers; i++)
        tp_predictor_destroy(&ap->workers[i].pred);
    free(ap->workers);
    free(ap->ring);
    pthread_cond_destroy(&ap->idle);
    pthread_cond_destroy(&ap->not_full);
    pthread_cond_destroy(&ap->not_empty);
    pthread_mutex_destroy(&ap->mu);
    free(ap);
    *self_p = NULL;
}

tp_async_predictor_t *tp_async_predictor_new(const tp_predict_config_t *c,
                                             int workers, int queue) {
    if (workers < 1 || workers > 256 || queue < 1 || queue > 1 << 20) {
        tp_error(TP_ERR_INVALID, "async predictor: %d workers (1..256), queue "
                 "%d (1..%d)", workers, queue, 1 << 20);
        return NULL;
    }
    tp_async_predictor_t *ap = calloc(1, sizeof *ap);
    if (!ap) {
        tp_error(TP_ERR_NOMEM, "async predictor");
        return NULL;
    }
    pthread_mutex_init(&ap->mu, NULL);
    pthread_cond_init(&ap->not_empty, NULL);
    pthread_cond_init(&ap->not_full, NULL);
    pthread_cond_init(&ap->idle, NULL);
    ap->cap = queue;
    ap->ring = calloc((size_t)queue, sizeof *ap->ring);
    ap->workers = calloc((size_t)workers, sizeof *ap->workers);
    if (!ap->ring || !ap->workers) {
        tp_async_predictor_destroy(&ap);
        tp_error(TP_ERR_NOMEM, "async predictor");
        return NULL;
    }
    ap->nworkers = workers;
    for (int i = 0; i < workers; i++) {
        ap->workers[i].ap = ap;
        ap->workers[i].pred = tp_predictor_new(c);
        if (!ap->workers[i].pred) {
            char msg[2048];
            snprintf(msg, sizeof msg, "%s", tp_last_error());
            tp_async_predictor_destroy(&ap);
            tp_error(TP_ERR_INVALID, "async predictor: %s", msg);
            return NULL;
        }
    }
    ap->nin = tp_predictor_input_count(ap->workers[0].pred);
    ap->nout = tp_predictor_output_count(ap->workers[0].pred);
    for (int i = 0; i < workers; i++) {
        if (pthread_create(&ap->workers[i].thread, NULL, s_async_main,
                           &ap->workers[i]) != 0) {
            tp_async_predictor_destroy(&ap);
            tp_error(TP_ERR_NOMEM, "async predictor: starting worker %d", i);
            return NULL;
        }
        ap->workers[i].started = 1;
    }
    return ap;
}

tp_status_t tp_async_predictor_put(tp_async_predictor_t *ap,
                                   const tp_tensor_t *inputs, tp_predict_cb cb,
                                   void *user) {
    if (!ap || !cb || (ap->nin && !inputs))
        return tp_error(TP_ERR_INVALID, "async predictor put: NULL argument");
    s_req_t r;
    memset(&r, 0, sizeof r);
    r.cb = cb;
    r.user = user;
    for (int i = 0; i < ap->nin; i++) {
        tp_status_t rc = tp_tensor_copy(&r.in[i], &inputs[i]);
        if (rc < 0) {
            s_req_fini(&r, i);
            return tp_error_wrap(rc, "async predictor: copying input %d", i);
        }
    }
    pthread_mutex_lock(&ap->mu);
    while (ap->count == ap->cap && !ap->stop)
        pthread_cond_wait(&ap->not_full, &ap->mu);
    if (ap->stop) {
        pthread_mutex_unlock(&ap->mu);
        s_req_fini(&r, ap->nin);
        return tp_error(TP_ERR_STATE, "async predictor: stopping");
    }
    ap->ring[(ap->head + ap->count) % ap->cap] = r;
    ap->count++;
    ap->pending++;
    pthread_cond_signal(&ap->not_empty);
    pthread_mutex_unlock(&ap->mu);
    return TP_OK;
}

void tp_async_predictor_wait(tp_async_predictor_t *ap) {
    pthread_mutex_lock(&ap->mu);
    while (ap->pending > 0)
        pthread_cond_wait(&ap->idle, &ap->mu);
    pthread_mutex_unlock(&ap->mu);
}

/* ---- futures ------------------------------------------------------------ */

/* A future is shared by its caller and its request: two references, the
 * last one out frees it (the caller may destroy it before the result). The
 * worker fulfils it through the ordinary callback, on its own thread. */
struct tp_predict_future {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* on CLOCK_MONOTONIC, for timed waits */
    int done, taken, refs;
    tp_status_t rc;
    char err[1024];             /* the worker's message for a failure */
    int nout;
    tp_tensor_t out[TP_PREDICT_MAX_IO];
};

static void s_future_free(tp_predict_future_t *f) {
    for (int j = 0; j < f->nout; j++)
        tp_tensor_fini(&f->out[j]);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* Drop one reference; the last frees. */
static void s_future_unref(tp_predict_future_t *f) {
    pthread_mutex_lock(&f->mu);
    int last = --f->refs == 0;
    pthread_mutex_unlock(&f->mu);
    if (last)
        s_future_free(f);
}

static void s_future_cb(tp_status_t st, tp_tensor_t *outputs, int n,
                        void *user) {
    tp_predict_future_t *f = user;
    pthread_mutex_lock(&f->mu);
    f->rc = st;
    if (st == TP_OK) {
        for (int j = 0; j < n; j++)
            tp_tensor_move(&f->out[j], &outputs[j]);
        f->nout = n;
    } else if (st == TP_ERR_INTERRUPTED && !outputs) {
        snprintf(f->err, sizeof f->err, "async predictor: destroyed before "
                 "the request ran");
    } else {
        snprintf(f->err, sizeof f->err, "%s", tp_last_error());
    }
    f->done = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    s_future_unref(f);
}

tp_status_t tp_async_predictor_put_future(tp_async_predictor_t *ap,
                                          const tp_tensor_t *inputs,
                                          tp_predict_future_t **out) {
    if (!out)
        return tp_error(TP_ERR_INVALID, "async predictor put: NULL future");
    *out = NULL;
    tp_predict_future_t *f = calloc(1, sizeof *f);
    if (!f)
        return tp_error(TP_ERR_NOMEM, "async predictor: a future");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, &ca);
    pthread_condattr_destroy(&ca);
    f->refs = 2;  /* the caller's and the request's */
    tp_status_t rc = tp_async_predictor_put(ap, inputs, s_future_cb, f);
    if (rc < 0) {  /* never queued: no callback will come */
        s_future_free(f);
        return rc;
    }
    *out = f;
    return TP_OK;
}

tp_status_t tp_predict_future_wait(tp_predict_future_t *f, double timeout_s) {
    if (!f)
        return tp_error(TP_ERR_INVALID, "predict future: NULL");
    struct timespec until;
    if (timeout_s >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &until);
        double whole = timeout_s > 1e9 ? 1e9 : timeout_s;
        until.tv_sec += (time_t)whole;
        until.tv_nsec += (long)((whole - (double)(time_t)whole) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&f->mu);
    int timed_out = 0;
    while (!f->done && !timed_out) {
        if (timeout_s < 0)
            pthread_cond_wait(&f->cv, &f->mu);
        else
            timed_out = pthread_cond_timedwait(&f->cv, &f->mu, &until) == ETIMEDOUT;
    }
    int done = f->done;
    pthread_mutex_unlock(&f->mu);
    return done ? TP_OK
                : tp_error(TP_ERR_TIMEOUT, "predict future: no result after "
                           "%g s", timeout_s);
}

int tp_predict_future_done(tp_predict_future_t *f) {
    if (!f)
        return 0;
    pthread_mutex_lock(&f->mu);
    int done = f->done;
    pthread_mutex_unlock(&f->mu);
    return done;
}

tp_status_t tp_predict_future_take(tp_predict_future_t *f, tp_tensor_t *outputs) {
    if (!f || !outputs)
        return tp_error(TP_ERR_INVALID, "predict future take: NULL argument");
    TP_TRY(tp_predict_future_wait(f, -1));
    pthread_mutex_lock(&f->mu);
    tp_status_t rc = f->rc;
    int taken = f->taken;
    if (rc == TP_OK && !taken) {
        for (int j = 0; j < f->nout; j++)
            tp_tensor_move(&outputs[j], &f->out[j]);
        f->taken = 1;
    }
    pthread_mutex_unlock(&f->mu);
    if (taken)
        return tp_error(TP_ERR_STATE, "predict future: the outputs were "
                        "taken already");
    if (rc < 0)
        return tp_error(rc, "%s", f->err);  /* err is final once done */
    return TP_OK;
}

void tp_predict_future_destroy(tp_predict_future_t **self_p) {
    if (!self_p || !*self_p)
        return;
    s_future_unref(*self_p);
    *self_p = NULL;
}

/* ---- data-parallel ------------------------------------------------------- */

typedef struct s_tower {
    struct tp_dp_predictor *dp;
    tp_predictor_t *pred;
    pthread_t thread;
    int started;
    int64_t begin, rows;       /* this run's slice */
    tp_tensor_t out[TP_PREDICT_MAX_IO];
    tp_status_t rc;
    char err[512];
} s_tower_t;

struct tp_dp_predictor {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    uint64_t gen;              /* bumped per run: the towers' start signal */
    int remaining;             /* towers still running this generation */
    int stop;
    const tp_tensor_t *inputs; /* this run's */
    s_tower_t *towers;
    int ntowers, nin, nout;
};

/* rows [begin, begin + rows) of x as a borrowed view */
static void s_slice(const tp_tensor_t *x, int64_t begin, int64_t rows,
                    tp_tensor_t *view) {
    size_t row = x->shape[0] > 0 ? x->nbytes / (size_t)x->shape[0] : 0;
    int64_t shape[TP_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] = rows;
    tp_tensor_init_wrap(view, x->dtype, x->ndim, shape,
                        (char *)x->data + (size_t)begin * row, NULL, NULL);
}

static void *s_tower_main(void *arg) {
    s_tower_t *t = arg;
    struct tp_dp_predictor *dp = t->dp;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&dp->mu);
        while (dp->gen == seen && !dp->stop)
            pthread_cond_wait(&dp->work, &dp->mu);
        if (dp->stop) {
            pthread_mutex_unlock(&dp->mu);
            return NULL;
        }
        seen = dp->gen;
        pthread_mutex_unlock(&dp->mu);
        t->rc = TP_OK;
        if (t->rows > 0) {
            tp_tensor_t in[TP_PREDICT_MAX_IO];
            for (int i = 0; i < dp->nin; i++)
                s_slice(&dp->inputs[i], t->begin, t->rows, &in[i]);
            t->rc = tp_predictor_run(t->pred, in, t->out);
            if (t->rc < 0)  /* errors are per thread: carry the message */
                snprintf(t->err, sizeof t->err, "%s", tp_last_error());
        }
        pthread_mutex_lock(&dp->mu);
        if (--dp->remaining == 0)
            pthread_cond_signal(&dp->done);
        pthread_mutex_unlock(&dp->mu);
    }
}

void tp_dp_predictor_destroy(tp_dp_predictor_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_dp_predictor_t *dp = *self_p;
    pthread_mutex_lock(&dp->mu);
    dp->stop = 1;
    pthread_cond_broadcast(&dp->work);
    pthread_mutex_unlock(&dp->mu);
    for (int i = 0; i < dp->ntowers; i++) {
        if (dp->towers[i].started)
            pthread_join(dp->towers[i].thread, NULL);
        tp_predictor_destroy(&dp->towers[i].pred);
    }
    free(dp->towers);
    pthread_cond_destroy(&dp->done);
    pthread_cond_destroy(&dp->work);
    pthread_mutex_destroy(&dp->mu);
    free(dp);
    *self_p = NULL;
}

tp_dp_predictor_t *tp_dp_predictor_new(const tp_predict_config_t *c,
                                       const int *devices, int ntowers) {
    if (!c || !devices || ntowers < 1 || ntowers > 64) {
        tp_error(TP_ERR_INVALID, "data-parallel predictor: %d towers (1..64)",
                 ntowers);
        return NULL;
    }
    tp_dp_predictor_t *dp = calloc(1, sizeof *dp);
    if (!dp || !(dp->towers = calloc((size_t)ntowers, sizeof *dp->towers))) {
        free(dp);
        tp_error(TP_ERR_NOMEM, "data-parallel predictor");
        return NULL;
    }
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->work, NULL);
    pthread_cond_init(&dp->done, NULL);
    dp->ntowers = ntowers;
    for (int i = 0; i < ntowers; i++) {
        tp_predict_config_t tc = *c;
        tc.device = devices[i];
        dp->towers[i].dp = dp;
        dp->towers[i].pred = tp_predictor_new(&tc);
        if (!dp->towers[i].pred) {
            char msg[2048];
            snprintf(msg, sizeof msg, "%s", tp_last_error());
            tp_dp_predictor_destroy(&dp);
            tp_error(TP_ERR_INVALID, "data-parallel predictor: tower %d: %s", i,
                     msg);
            return NULL;
        }
    }
    dp->nin = tp_predictor_input_count(dp->towers[0].pred);
    dp->nout = tp_predictor_output_count(dp->towers[0].pred);
    for (int i = 0; i < ntowers; i++) {
        if (pthread_create(&dp->towers[i].thread, NULL, s_tower_main,
                           &dp->towers[i]) != 0) {
            tp_dp_predictor_destroy(&dp);
            tp_error(TP_ERR_NOMEM, "data-parallel predictor: starting tower %d", i);
            return NULL;
        }
        dp->towers[i].started = 1;
    }
    return dp;
}

int tp_dp_predictor_towers(const tp_dp_predictor_t *dp) { return dp->ntowers; }

/* The towers' outputs, row slices in tower order, into one tensor each. */
static tp_status_t s_join(tp_dp_predictor_t *dp, int64_t n, tp_tensor_t *outputs) {
    for (int j = 0; j < dp->nout; j++) {
        const tp_tensor_t *first = &dp->towers[0].out[j];
        int64_t shape[TP_MAX_DIMS];
        memcpy(shape, first->shape, sizeof shape);
        if (first->ndim < 1 || first->shape[0] != dp->towers[0].rows)
            return tp_error(TP_ERR_SHAPE, "data-parallel predictor: output "
                            "'%s' has no row per input row, so the towers' "
                            "results cannot be joined",
                            tp_predictor_output_name(dp->towers[0].pred, j));
        shape[0] = n;
        TP_TRY(tp_tensor_init(&outputs[j], first->dtype, first->ndim, shape));
        size_t at = 0;
        for (int t = 0; t < dp->ntowers && dp->towers[t].rows > 0; t++) {
            const tp_tensor_t *o = &dp->towers[t].out[j];
            memcpy((char *)outputs[j].data + at, o->data, o->nbytes);
            at += o->nbytes;
        }
    }
    return TP_OK;
}

tp_status_t tp_dp_predictor_run(tp_dp_predictor_t *dp, const tp_tensor_t *inputs,
                                tp_tensor_t *outputs) {
    if (!dp || !inputs || !outputs)
        return tp_error(TP_ERR_INVALID, "data-parallel predictor: NULL argument");
    for (int j = 0; j < dp->nout; j++)
        tp_tensor_init_empty(&outputs[j]);
    int64_t n = dp->nin > 0 && inputs[0].ndim > 0 ? inputs[0].shape[0] : 0;
    int64_t maxb = tp_predictor_max_batch(dp->towers[0].pred);
    for (int i = 0; i < dp->nin; i++)
        if (inputs[i].ndim < 1 || inputs[i].shape[0] != n)
            return tp_error(TP_ERR_SHAPE, "data-parallel predictor: input %d "
                            "has another batch than input 0 (%lld)", i,
                            (long long)n);
    if (n < 1 || n > maxb * dp->ntowers)
        return tp_error(TP_ERR_SHAPE, "data-parallel predictor: %lld rows; "
                        "%d towers x %lld take 1..%lld", (long long)n,
                        dp->ntowers, (long long)maxb,
                        (long long)(maxb * dp->ntowers));
    int64_t per = (n + dp->ntowers - 1) / dp->ntowers;
    pthread_mutex_lock(&dp->mu);
    for (int t = 0; t < dp->ntowers; t++) {
        int64_t b = per * t;
        dp->towers[t].begin = b < n ? b : n;
        dp->towers[t].rows = b < n ? (n - b < per ? n - b : per) : 0;
    }
    dp->inputs = inputs;
    dp->remaining = dp->ntowers;
    dp->gen++;
    pthread_cond_broadcast(&dp->work);
    while (dp->remaining > 0)
        pthread_cond_wait(&dp->done, &dp->mu);
    pthread_mutex_unlock(&dp->mu);
    tp_status_t rc = TP_OK;
    for (int t = 0; t < dp->ntowers && rc == TP_OK; t++)
        if (dp->towers[t].rc < 0)
            rc = tp_error(dp->towers[t].rc, "data-parallel predictor: tower "
                          "%d: %s", t, dp->towers[t].err);
    if (rc == TP_OK)
        rc = s_join(dp, n, outputs);
    for (int t = 0; t < dp->ntowers; t++)
        for (int j = 0; j < dp->nout && dp->towers[t].rows > 0; j++)
            tp_tensor_fini(&dp->towers[t].out[j]);
    if (rc < 0)
        for (int j = 0; j < dp->nout; j++)
            tp_tensor_fini(&outputs[j]);
    return rc;
}
