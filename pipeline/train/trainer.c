/* towerpack pipeline: the base trainer loop, callbacks, fetches and the
 * scalar store behind monitors.
 *
 * The loop runs on the thread that calls tp_trainer_train (the supervisor's
 * thread in a full run); towers and input actors run beside it. No hook
 * allocates in the steady state: fetch names and scalar names live in
 * tables that only grow when a new name first appears.
 *
 * Dependencies run one way: this file calls no function of the callbacks
 * and sidecars built on it. What runs beside the loop (the callback actor,
 * pipeline/callbacks/callback_actor.c) is a sidecar it was handed through
 * an ops table (trainer_internal.h) and calls by name at fixed points:
 * start after setup_graph, poll at each step boundary, epoch_end, finish
 * after after_train, destroy. A trainer may also follow a loop run
 * elsewhere (tp_trainer_follow): that is what observing callbacks see, a
 * plain trainer with its own counters and scalars and no link back. */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <towerpack/callback.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/supervisor.h>
#include "pipeline/trainer_internal.h"

/* ---- fetches ----------------------------------------------------------------- */

struct tp_fetches {
    int count;          /* names known (ever asked) */
    int capacity;
    char **names;       /* [capacity] */
    double *values;     /* [capacity] */
    uint8_t *wanted;    /* [capacity] asked this step */
    uint8_t *have;      /* [capacity] provided this step */
    int nwanted;
};

static void s_fetches_clear(tp_fetches_t *f) {
    if (f->count) {  /* the arrays are NULL until a first name */
        memset(f->wanted, 0, (size_t)f->count);
        memset(f->have, 0, (size_t)f->count);
    }
    f->nwanted = 0;
}

static int s_fetches_find(const tp_fetches_t *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->names[i], name) == 0)
            return i;
    return -1;
}

tp_status_t tp_fetches_request(tp_fetches_t *f, const char *name) {
    int i = s_fetches_find(f, name);
    if (i < 0) {
        if (f->count == f->capacity) {
            int cap = f->capacity ? f->capacity * 2 : 8;
            char **n = realloc(f->names, (size_t)cap * sizeof *n);
            if (n)
                f->names = n;
            double *v = realloc(f->values, (size_t)cap * sizeof *v);
            if (v)
                f->values = v;
            uint8_t *w = realloc(f->wanted, (size_t)cap);
            if (w)
                f->wanted = w;
            uint8_t *h = realloc(f->have, (size_t)cap);
            if (h)
                f->have = h;
            if (!n || !v || !w || !h)
                return tp_error(TP_ERR_NOMEM, "fetches");
            f->capacity = cap;
        }
        f->names[f->count] = strdup(name);
        if (!f->names[f->count])
            return tp_error(TP_ERR_NOMEM, "fetches");
        f->wanted[f->count] = 0;
        f->have[f->count] = 0;
        i = f->count++;
    }
    if (!f->wanted[i]) {
        f->wanted[i] = 1;
        f->nwanted++;
    }
    return TP_OK;
}

int tp_fetches_count(const tp_fetches_t *f) { return f->nwanted; }

const char *tp_fetches_name(const tp_fetches_t *f, int k) {
    for (int i = 0; i < f->count; i++)
        if (f->wanted[i] && k-- == 0)
            return f->names[i];
    return NULL;
}

int tp_fetches_wanted(const tp_fetches_t *f, const char *name) {
    int i = s_fetches_find(f, name);
    return i >= 0 && f->wanted[i];
}

void tp_fetches_set(tp_fetches_t *f, const char *name, double value) {
    int i = s_fetches_find(f, name);
    if (i >= 0 && f->wanted[i]) {
        f->values[i] = value;
        f->have[i] = 1;
    }
}

tp_status_t tp_fetches_get(const tp_fetches_t *f, const char *name,
                           double *value) {
    int i = s_fetches_find(f, name);
    if (i < 0 || !f->have[i])
        return tp_error(TP_ERR_NOT_FOUND,
                        "the step did not provide '%s' (is it a named output "
                        "or metric of the model?)", name);
    *value = f->values[i];
    return TP_OK;
}

static void s_fetches_fini(tp_fetches_t *f) {
    for (int i = 0; i < f->count; i++)
        free(f->names[i]);
    free(f->names);
    free(f->values);
    free(f->wanted);
    free(f->have);
    memset(f, 0, sizeof *f);
}

tp_fetches_t *tp_fetches_new(void) {
    tp_fetches_t *f = calloc(1, sizeof *f);
    if (!f)
        tp_error(TP_ERR_NOMEM, "fetches");
    return f;
}

void tp_fetches_destroy(tp_fetches_t **f_p) {
    if (!f_p || !*f_p)
        return;
    s_fetches_fini(*f_p);
    free(*f_p);
    *f_p = NULL;
}

void tp_fetches_begin(tp_fetches_t *f) { s_fetches_clear(f); }

/* ---- callbacks ----------------------------------------------------------------- */

struct tp_callback {
    const tp_callback_ops_t *ops;
    void *impl;
    int chief_only;
    uint64_t ns_total;      /* every hook */
    uint64_t ns_epoch_end;  /* after_epoch + trigger_epoch of the last epoch */
    int setup_done;         /* setup_graph succeeded: after_train is owed */
    int ran_before_run;     /* this step's before_run ran (pairs after_run) */
};

tp_callback_t *tp_callback_new(const tp_callback_ops_t *ops, void *impl,
                               int chief_only) {
    TP_ASSERT(ops);
    tp_callback_t *self = calloc(1, sizeof *self);
    if (!self) {
        if (ops->destroy)
            ops->destroy(impl);
        tp_error(TP_ERR_NOMEM, "callback %s", ops->name);
        return NULL;
    }
    self->ops = ops;
    self->impl = impl;
    self->chief_only = chief_only;
    return self;
}

void tp_callback_destroy(tp_callback_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_callback_t *self = *self_p;
    if (self->ops->destroy)
        self->ops->destroy(self->impl);
    free(self);
    *self_p = NULL;
}

const char *tp_callback_name(const tp_callback_t *self) {
    return self->ops->name ? self->ops->name : "callback";
}
int tp_callback_chief_only(const tp_callback_t *self) { return self->chief_only; }
double tp_callback_seconds(const tp_callback_t *self) {
    return (double)self->ns_total * 1e-9;
}
double tp_callback_epoch_end_seconds(const tp_callback_t *self) {
    return (double)self->ns_epoch_end * 1e-9;
}
void *tp_callback_impl(tp_callback_t *self) { return self->impl; }
const tp_callback_ops_t *tp_callback_ops(const tp_callback_t *self) {
    return self->ops;
}

/* Hooks, called by the loop and by wrappers. Each times itself. */
#define HOOK_BODY(field, ...)                                                 \
    if (!cb->ops->field)                                                      \
        return TP_OK;                                                         \
    uint64_t t0 = tp_now_ns();                                                \
    tp_status_t rc = cb->ops->field(cb->impl, __VA_ARGS__);                   \
    cb->ns_total += tp_now_ns() - t0;                                         \
    if (rc < 0)                                                               \
        return tp_error_wrap(rc, "callback %s: " #field, tp_callback_name(cb)); \
    return rc;

tp_status_t tp_cb_setup_graph(tp_callback_t *cb, tp_trainer_t *tr) { HOOK_BODY(setup_graph, tr) }
tp_status_t tp_cb_before_train(tp_callback_t *cb, tp_trainer_t *tr) { HOOK_BODY(before_train, tr) }
tp_status_t tp_cb_before_epoch(tp_callback_t *cb, tp_trainer_t *tr) { HOOK_BODY(before_epoch, tr) }
tp_status_t tp_cb_before_run(tp_callback_t *cb, tp_trainer_t *tr, tp_fetches_t *f) { HOOK_BODY(before_run, tr, f) }
tp_status_t tp_cb_after_run(tp_callback_t *cb, tp_trainer_t *tr, const tp_fetches_t *f) { HOOK_BODY(after_run, tr, f) }
tp_status_t tp_cb_trigger_step(tp_callback_t *cb, tp_trainer_t *tr) { HOOK_BODY(trigger_step, tr) }
tp_status_t tp_cb_after_train(tp_callback_t *cb, tp_trainer_t *tr) { HOOK_BODY(after_train, tr) }
tp_status_t tp_cb_trigger(tp_callback_t *cb, tp_trainer_t *tr) { HOOK_BODY(trigger, tr) }

tp_status_t tp_cb_after_epoch(tp_callback_t *cb, tp_trainer_t *tr) {
    uint64_t before = cb->ns_total;
    tp_status_t rc;
    if (!cb->ops->after_epoch) {
        rc = TP_OK;
    } else {
        uint64_t t0 = tp_now_ns();
        rc = cb->ops->after_epoch(cb->impl, tr);
        cb->ns_total += tp_now_ns() - t0;
        if (rc < 0)
            rc = tp_error_wrap(rc, "callback %s: after_epoch", tp_callback_name(cb));
    }
    cb->ns_epoch_end = cb->ns_total - before;
    return rc;
}

/* trigger_epoch, or trigger when the callback has no trigger_epoch. */
tp_status_t tp_cb_trigger_epoch(tp_callback_t *cb, tp_trainer_t *tr) {
    uint64_t before = cb->ns_total;
    tp_status_t rc = TP_OK;
    const char *what = cb->ops->trigger_epoch ? "trigger_epoch" : "trigger";
    tp_status_t (*fn)(void *, tp_trainer_t *) =
        cb->ops->trigger_epoch ? cb->ops->trigger_epoch : cb->ops->trigger;
    if (fn) {
        uint64_t t0 = tp_now_ns();
        rc = fn(cb->impl, tr);
        cb->ns_total += tp_now_ns() - t0;
        if (rc < 0)
            rc = tp_error_wrap(rc, "callback %s: %s", tp_callback_name(cb), what);
    }
    cb->ns_epoch_end += cb->ns_total - before;
    return rc;
}

void tp_cb_on_scalar(tp_callback_t *cb, tp_trainer_t *tr, const char *name,
                     double value) {
    if (cb->ops->on_scalar)
        cb->ops->on_scalar(cb->impl, tr, name, value);
}

void tp_cb_on_image(tp_callback_t *cb, tp_trainer_t *tr, const char *tag,
                    const tp_tensor_t *image) {
    if (cb->ops->on_image)
        cb->ops->on_image(cb->impl, tr, tag, image);
}

/* ---- the trainer ------------------------------------------------------------------ */

typedef struct {
    char *name;
    double latest;
    double *history;   /* [nhistory] epoch-end values */
    size_t nhistory, caphistory;
} s_scalar_t;

struct tp_trainer {
    const tp_trainer_ops_t *ops;
    void *impl;
    tp_callback_t **cbs;
    size_t ncbs, capcbs;
    int is_chief;
    int training;
    tp_schedule_t sched;
    int64_t epoch_num, local_step, global_step;
    int global_step_set;
    tp_fetches_t fetches;
    s_scalar_t *scalars;
    size_t nscalars, capscalars;
    char *logdir;
    atomic_int stop;            /* 1: stop requested, 2: by a signal */
    _Atomic(const char *) stop_reason_lit;
    /* What runs beside the loop (the callback actor): called by name. */
    struct {
        const tp_sidecar_ops_t *ops;
        void *impl;
    } sidecars[TP_TRAINER_MAX_SIDECARS];
    int nsidecars;
    int sidecars_started;       /* from their start to the end of training */
    double watchdog_s;          /* 0: off */
    /* Following a loop run elsewhere (tp_trainer_follow): the hooks run
     * now were due at follow_time_ns. */
    int following;
    uint64_t follow_time_ns;
};

tp_trainer_t *tp_trainer_new(const tp_trainer_ops_t *ops, void *impl) {
    TP_ASSERT(ops && ops->run_step);
    tp_trainer_t *self = calloc(1, sizeof *self);
    if (!self) {
        if (ops->destroy)
            ops->destroy(impl);
        tp_error(TP_ERR_NOMEM, "trainer");
        return NULL;
    }
    self->ops = ops;
    self->impl = impl;
    self->is_chief = 1;
    atomic_init(&self->stop, 0);
    atomic_init(&self->stop_reason_lit, NULL);
    return self;
}

void tp_trainer_destroy(tp_trainer_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_trainer_t *self = *self_p;
    /* The sidecars first (each stops before its destroy returns): the
     * callback actor runs the observing callbacks' hooks until then. */
    for (int i = self->nsidecars - 1; i >= 0; i--)
        if (self->sidecars[i].ops->destroy)
            self->sidecars[i].ops->destroy(self->sidecars[i].impl);
    for (size_t i = 0; i < self->ncbs; i++)
        tp_callback_destroy(&self->cbs[i]);
    free(self->cbs);
    for (size_t i = 0; i < self->nscalars; i++) {
        free(self->scalars[i].name);
        free(self->scalars[i].history);
    }
    free(self->scalars);
    s_fetches_fini(&self->fetches);
    free(self->logdir);
    if (self->ops->destroy)
        self->ops->destroy(self->impl);
    free(self);
    *self_p = NULL;
}

tp_status_t tp_trainer_add_callback(tp_trainer_t *self, tp_callback_t **cb_p) {
    tp_callback_t *cb = *cb_p;
    *cb_p = NULL;
    if (!cb)
        return tp_error(TP_ERR_INVALID, "adding a NULL callback (%s)",
                        tp_last_error());
    if (self->training) {
        tp_status_t rc = tp_error(TP_ERR_STATE,
                                  "callback %s added while training runs",
                                  tp_callback_name(cb));
        tp_callback_destroy(&cb);
        return rc;
    }
    if (cb->chief_only && !self->is_chief) {
        TP_DEBUG("callback %s is chief-only: not on this rank",
                 tp_callback_name(cb));
        tp_callback_destroy(&cb);
        return TP_OK;
    }
    if (self->ncbs == self->capcbs) {
        size_t cap = self->capcbs ? self->capcbs * 2 : 16;
        tp_callback_t **c = realloc(self->cbs, cap * sizeof *c);
        if (!c) {
            tp_callback_destroy(&cb);
            return tp_error(TP_ERR_NOMEM, "callbacks");
        }
        self->cbs = c;
        self->capcbs = cap;
    }
    self->cbs[self->ncbs++] = cb;
    return TP_OK;
}

void tp_trainer_set_chief(tp_trainer_t *self, int is_chief) {
    self->is_chief = is_chief ? 1 : 0;
}
int tp_trainer_is_chief(const tp_trainer_t *self) { return self->is_chief; }

int64_t tp_trainer_epoch_num(const tp_trainer_t *self) { return self->epoch_num; }
int64_t tp_trainer_local_step(const tp_trainer_t *self) { return self->local_step; }
int64_t tp_trainer_global_step(const tp_trainer_t *self) { return self->global_step; }
uint64_t tp_trainer_hook_time_ns(const tp_trainer_t *self) {
    return self->following ? self->follow_time_ns : tp_now_ns();
}
const tp_schedule_t *tp_trainer_schedule(const tp_trainer_t *self) { return &self->sched; }
void tp_trainer_set_global_step(tp_trainer_t *self, int64_t step) {
    self->global_step = step;
    self->global_step_set = 1;
}
int64_t tp_trainer_samples_per_step(const tp_trainer_t *self) {
    return self->ops->samples_per_step ? self->ops->samples_per_step(self->impl) : 0;
}
void *tp_trainer_impl(tp_trainer_t *self) { return self->impl; }
tp_model_t *tp_trainer_model(tp_trainer_t *self) {
    return self->ops->model ? self->ops->model(self->impl) : NULL;
}
size_t tp_trainer_ncallbacks(const tp_trainer_t *self) { return self->ncbs; }
void tp_trainer_set_watchdog(tp_trainer_t *self, double seconds) {
    self->watchdog_s = seconds > 0 ? seconds : 0;
}
double tp_trainer_watchdog(const tp_trainer_t *self) { return self->watchdog_s; }
tp_callback_t *tp_trainer_callback(tp_trainer_t *self, size_t i) {
    TP_ASSERT(i < self->ncbs);
    return self->cbs[i];
}

tp_status_t tp_trainer_set_hyperparam(tp_trainer_t *self, const char *name,
                                      double value) {
    if (!self->ops->set_hyperparam)
        return tp_error(TP_ERR_NOT_FOUND, "trainer %s has no hyper-parameter '%s'",
                        self->ops->name, name);
    TP_TRY(self->ops->set_hyperparam(self->impl, name, value));
    tp_trainer_put_scalar(self, name, value);
    return TP_OK;
}

tp_status_t tp_trainer_get_hyperparam(tp_trainer_t *self, const char *name,
                                      double *value) {
    if (!self->ops->get_hyperparam)
        return tp_error(TP_ERR_NOT_FOUND, "trainer %s has no hyper-parameter '%s'",
                        self->ops->name, name);
    return self->ops->get_hyperparam(self->impl, name, value);
}

void tp_trainer_request_stop(tp_trainer_t *self, const char *reason,
                             int interrupted) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&self->stop, &expected,
                                       interrupted ? 2 : 1))
        atomic_store(&self->stop_reason_lit, reason);
}

int tp_trainer_stop_requested(const tp_trainer_t *self) {
    return atomic_load(&((tp_trainer_t *)self)->stop);
}

const char *tp_trainer_stop_reason(const tp_trainer_t *self) {
    const char *r = atomic_load(&((tp_trainer_t *)self)->stop_reason_lit);
    return r ? r : "";
}

tp_status_t tp_trainer_set_logdir(tp_trainer_t *self, const char *dir) {
    char *copy = dir ? strdup(dir) : NULL;
    if (dir && !copy)
        return tp_error(TP_ERR_NOMEM, "logdir");
    free(self->logdir);
    self->logdir = copy;
    return TP_OK;
}
const char *tp_trainer_logdir(const tp_trainer_t *self) { return self->logdir; }

/* ---- scalars ------------------------------------------------------------------------ */

static s_scalar_t *s_scalar_find(const tp_trainer_t *self, const char *name) {
    for (size_t i = 0; i < self->nscalars; i++)
        if (strcmp(self->scalars[i].name, name) == 0)
            return &self->scalars[i];
    return NULL;
}

/* Record `value` as the latest of `name` (a new name gets an entry). */
static void s_scalar_store(tp_trainer_t *self, const char *name, double value) {
    s_scalar_t *s = s_scalar_find(self, name);
    if (!s) {
        if (self->nscalars == self->capscalars) {
            size_t cap = self->capscalars ? self->capscalars * 2 : 16;
            s_scalar_t *n = realloc(self->scalars, cap * sizeof *n);
            if (!n) {
                TP_WARN("scalar %s dropped: out of memory", name);
                return;
            }
            self->scalars = n;
            self->capscalars = cap;
        }
        s = &self->scalars[self->nscalars];
        memset(s, 0, sizeof *s);
        if (!(s->name = strdup(name))) {
            TP_WARN("scalar %s dropped: out of memory", name);
            return;
        }
        self->nscalars++;
    }
    s->latest = value;
}

void tp_trainer_put_scalar(tp_trainer_t *self, const char *name, double value) {
    s_scalar_store(self, name, value);
    for (size_t i = 0; i < self->ncbs; i++)
        tp_cb_on_scalar(self->cbs[i], self, name, value);
}

tp_status_t tp_trainer_put_image(tp_trainer_t *self, const char *tag,
                                 const tp_tensor_t *image) {
    if (!tag || !*tag)
        return tp_error(TP_ERR_INVALID, "put_image: no tag");
    if (!image || image->dtype != TP_UINT8 || image->ndim != 3 ||
        (image->shape[2] != 1 && image->shape[2] != 3) || image->shape[0] < 1 ||
        image->shape[1] < 1 || !image->data)
        return tp_error(TP_ERR_INVALID, "put_image '%s': an image is uint8 [H, W, 1 or 3] "
                        "(got %s of rank %d, last dim %lld)", tag,
                        image ? tp_dtype_name(image->dtype) : "nothing",
                        image ? image->ndim : 0,
                        image && image->ndim ? (long long)image->shape[image->ndim - 1] : 0LL);
    for (size_t i = 0; i < self->ncbs; i++)
        tp_cb_on_image(self->cbs[i], self, tag, image);
    return TP_OK;
}

tp_status_t tp_trainer_get_scalar(const tp_trainer_t *self, const char *name,
                                  double *value) {
    const s_scalar_t *s = s_scalar_find(self, name);
    if (!s)
        return tp_error(TP_ERR_NOT_FOUND, "no scalar named '%s'", name);
    *value = s->latest;
    return TP_OK;
}

tp_status_t tp_trainer_scalar_history(const tp_trainer_t *self,
                                      const char *name, const double **values,
                                      size_t *n) {
    const s_scalar_t *s = s_scalar_find(self, name);
    if (!s)
        return tp_error(TP_ERR_NOT_FOUND, "no scalar named '%s'", name);
    *values = s->history;
    *n = s->nhistory;
    return TP_OK;
}

size_t tp_trainer_scalar_count(const tp_trainer_t *self) { return self->nscalars; }
const char *tp_trainer_scalar_name(const tp_trainer_t *self, size_t i) {
    TP_ASSERT(i < self->nscalars);
    return self->scalars[i].name;
}

/* At the end of each epoch every scalar's latest value joins its history
 * (tensorpack's StatHolder): one entry per epoch, so memory grows with the
 * number of epochs, not steps. */
static void s_snapshot_history(tp_trainer_t *self) {
    for (size_t i = 0; i < self->nscalars; i++) {
        s_scalar_t *s = &self->scalars[i];
        if (s->nhistory == s->caphistory) {
            size_t cap = s->caphistory ? s->caphistory * 2 : 16;
            double *h = realloc(s->history, cap * sizeof *h);
            if (!h)
                continue;
            s->history = h;
            s->caphistory = cap;
        }
        s->history[s->nhistory++] = s->latest;
    }
}

/* ---- sidecars ------------------------------------------------------------------------- */

tp_status_t tp_trainer_attach(tp_trainer_t *self, const tp_sidecar_ops_t *ops, void *impl) {
    TP_ASSERT(ops);
    const char *why = self->nsidecars == TP_TRAINER_MAX_SIDECARS ? "too many sidecars"
                      : self->following || self->sidecars_started ? "training has begun"
                                                                 : NULL;
    if (why) {
        if (ops->destroy)
            ops->destroy(impl);
        return tp_error(TP_ERR_STATE, "trainer %s: sidecar %s not attached: %s",
                        self->ops->name, ops->name ? ops->name : "?", why);
    }
    self->sidecars[self->nsidecars].ops = ops;
    self->sidecars[self->nsidecars].impl = impl;
    self->nsidecars++;
    return TP_OK;
}

void *tp_trainer_sidecar(const tp_trainer_t *self, const tp_sidecar_ops_t *ops) {
    for (int i = 0; i < self->nsidecars; i++)
        if (self->sidecars[i].ops == ops)
            return self->sidecars[i].impl;
    return NULL;
}

/* ---- following a loop run elsewhere --------------------------------------------------- */

void tp_trainer_follow(tp_trainer_t *self, const tp_schedule_t *sched) {
    self->sched = *sched;
    self->training = 1;  /* its callbacks are set */
    self->following = 1;
    self->follow_time_ns = tp_now_ns();
}

void tp_trainer_follow_at(tp_trainer_t *self, int64_t epoch, int64_t local_step,
                          int64_t global_step, uint64_t t_ns) {
    self->epoch_num = epoch;
    self->local_step = local_step;
    self->global_step = global_step;
    self->follow_time_ns = t_ns;
}

void tp_trainer_follow_epoch_end(tp_trainer_t *self) { s_snapshot_history(self); }

/* ---- the loop ------------------------------------------------------------------------- */

/* Keep the first error: later hooks still run (after_train), but the status
 * and message returned are those of what went wrong first. */
static void s_keep(tp_status_t *first, char *msg, size_t size, tp_status_t rc) {
    if (rc < 0 && *first >= 0) {
        *first = rc;
        snprintf(msg, size, "%s", tp_last_error());
    }
}

/* The sidecars' hooks, by name. */
typedef enum { S_START, S_POLL, S_EPOCH_END, S_FINISH } s_sidecar_hook_t;

/* Call one hook of every sidecar, keeping the first error. Start and
 * finish are owed to every sidecar even after an error (the callbacks set
 * up still get their after_train); poll and epoch end stop at one. */
static void s_sidecars(tp_trainer_t *self, s_sidecar_hook_t hook, tp_status_t *first,
                       char *msg, size_t size) {
    for (int i = 0; i < self->nsidecars; i++) {
        const tp_sidecar_ops_t *ops = self->sidecars[i].ops;
        tp_status_t (*fn)(void *, tp_trainer_t *) =
            hook == S_START ? ops->start : hook == S_POLL ? ops->poll
            : hook == S_EPOCH_END ? ops->epoch_end : ops->finish;
        if (!fn || (*first < 0 && (hook == S_POLL || hook == S_EPOCH_END)))
            continue;
        s_keep(first, msg, size, fn(self->sidecars[i].impl, self));
    }
}

/* A SIGINT or SIGTERM recorded by tp_signals_install (supervisor.h) turns
 * into an interrupted stop at the next step boundary. */
static int s_stopping(tp_trainer_t *self) {
    int sig = tp_signal_pending();
    if (sig)
        tp_trainer_request_stop(self, sig == SIGINT ? "SIGINT" : "SIGTERM", 1);
    return atomic_load_explicit(&self->stop, memory_order_relaxed) != 0;
}

tp_status_t tp_trainer_train(tp_trainer_t *self, const tp_schedule_t *sched) {
    if (sched->starting_epoch < 1 || sched->steps_per_epoch < 1 ||
        sched->max_epoch < sched->starting_epoch - 1)
        return tp_error(TP_ERR_INVALID,
                        "schedule: starting_epoch %lld, max_epoch %lld, "
                        "steps_per_epoch %lld (need starting_epoch >= 1, "
                        "max_epoch >= starting_epoch - 1, steps_per_epoch >= 1)",
                        (long long)sched->starting_epoch,
                        (long long)sched->max_epoch,
                        (long long)sched->steps_per_epoch);
    if (self->training)
        return tp_error(TP_ERR_STATE, "trainer %s is already training",
                        self->ops->name);
    self->training = 1;
    self->sched = *sched;
    if (!self->global_step_set)
        self->global_step = (sched->starting_epoch - 1) * sched->steps_per_epoch;
    self->epoch_num = sched->starting_epoch - 1;
    self->local_step = 0;

    tp_status_t first = TP_OK;
    char msg[1024] = "";
    tp_status_t rc = TP_OK;
    if (self->ops->setup && (rc = self->ops->setup(self->impl, self)) < 0)
        s_keep(&first, msg, sizeof msg,
               tp_error_wrap(rc, "trainer %s: setup", self->ops->name));
    for (size_t i = 0; first >= 0 && i < self->ncbs; i++) {
        s_keep(&first, msg, sizeof msg, tp_cb_setup_graph(self->cbs[i], self));
        if (first >= 0)
            self->cbs[i]->setup_done = 1;
    }
    /* What the setup_graphs attached starts now, before any before_train. */
    self->sidecars_started = 1;
    s_sidecars(self, S_START, &first, msg, sizeof msg);
    for (size_t i = 0; first >= 0 && i < self->ncbs; i++)
        s_keep(&first, msg, sizeof msg, tp_cb_before_train(self->cbs[i], self));

    tp_fetches_t *f = &self->fetches;
    uint64_t hook_ns = 0, step_ns = 0;  /* this epoch: per-step hooks, run_step */
    for (int64_t ep = sched->starting_epoch;
         first >= 0 && !s_stopping(self) && ep <= sched->max_epoch; ep++) {
        self->epoch_num = ep;
        self->local_step = 0;
        hook_ns = step_ns = 0;
        for (size_t i = 0; first >= 0 && i < self->ncbs; i++)
            s_keep(&first, msg, sizeof msg, tp_cb_before_epoch(self->cbs[i], self));
        for (int64_t s = 0; first >= 0 && s < sched->steps_per_epoch; s++) {
            if (s_stopping(self))
                break;
            self->local_step = s;
            uint64_t t0 = tp_now_ns();
            s_fetches_clear(f);
            for (size_t i = 0; first >= 0 && i < self->ncbs; i++) {
                rc = tp_cb_before_run(self->cbs[i], self, f);
                self->cbs[i]->ran_before_run = rc >= 0;
                s_keep(&first, msg, sizeof msg, rc);
            }
            if (first < 0)
                break;
            uint64_t t1 = tp_now_ns();
            rc = self->ops->run_step(self->impl, self, f);
            uint64_t t2 = tp_now_ns();
            step_ns += t2 - t1;
            if (rc < 0) {
                s_keep(&first, msg, sizeof msg,
                       tp_error_wrap(rc, "step %lld of epoch %lld",
                                     (long long)s, (long long)ep));
                break;
            }
            self->global_step++;
            for (size_t i = 0; first >= 0 && i < self->ncbs; i++)
                if (self->cbs[i]->ran_before_run)
                    s_keep(&first, msg, sizeof msg,
                           tp_cb_after_run(self->cbs[i], self, f));
            for (size_t i = 0; first >= 0 && i < self->ncbs; i++)
                s_keep(&first, msg, sizeof msg, tp_cb_trigger_step(self->cbs[i], self));
            /* What the sidecars sent back (the observing callbacks' scalars,
             * stop requests, a failure). */
            s_sidecars(self, S_POLL, &first, msg, sizeof msg);
            hook_ns += (t1 - t0) + (tp_now_ns() - t2);
        }
        /* A stop inside the epoch skips its end: the epoch did not finish. */
        if (first < 0 || s_stopping(self))
            break;
        self->local_step = sched->steps_per_epoch;
        /* What the per-step hooks cost the towers: the share of the epoch's
         * step time spent in before_run, after_run and trigger_step. */
        if (step_ns + hook_ns > 0)
            tp_trainer_put_scalar(self, "callback_step_pct",
                                  100.0 * (double)hook_ns / (double)(step_ns + hook_ns));
        for (size_t i = 0; first >= 0 && i < self->ncbs; i++)
            s_keep(&first, msg, sizeof msg, tp_cb_after_epoch(self->cbs[i], self));
        for (size_t i = 0; first >= 0 && i < self->ncbs; i++)
            s_keep(&first, msg, sizeof msg, tp_cb_trigger_epoch(self->cbs[i], self));
        s_snapshot_history(self);
        s_sidecars(self, S_EPOCH_END, &first, msg, sizeof msg);  /* the observers' too */
    }

    /* An input or a tower that saw the signal first (waiting for a batch)
     * ends the loop with TP_ERR_INTERRUPTED: it is the signal's stop all the
     * same, and the log says so */
    if (first == TP_ERR_INTERRUPTED)
        (void)s_stopping(self);
    int stop = atomic_load(&self->stop);
    if (stop)
        TP_INFO("training stopped at epoch %lld, global step %lld: %s",
                (long long)self->epoch_num, (long long)self->global_step,
                tp_trainer_stop_reason(self));
    for (size_t i = 0; i < self->ncbs; i++)
        if (self->cbs[i]->setup_done)
            s_keep(&first, msg, sizeof msg, tp_cb_after_train(self->cbs[i], self));
    /* Training returns when the sidecars are done and stopped (the
     * observing callbacks' files written), with their failure if one
     * failed. */
    s_sidecars(self, S_FINISH, &first, msg, sizeof msg);
    self->sidecars_started = 0;
    self->training = 0;
    if (first < 0) {
        tp_error(first, "%s", msg);
        return first;
    }
    if (stop == 2)
        return tp_error(TP_ERR_INTERRUPTED, "training interrupted: %s",
                        tp_trainer_stop_reason(self));
    return TP_OK;
}
