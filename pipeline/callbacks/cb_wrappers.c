/* towerpack pipeline: callbacks that wrap callbacks (PeriodicTrigger,
 * PeriodicCallback, EnableCallbackIf). Each forwards the hooks of the
 * callback it owns, gated as its contract in callback.h says. */
#include <string.h>
#include <towerpack/callback.h>
#include "pipeline/trainer_internal.h"

typedef struct {
    tp_callback_t *inner;
    int64_t every_k_steps, every_k_epochs;   /* PeriodicTrigger */
    int64_t every_k;                         /* PeriodicCallback */
    tp_cb_pred_fn pred;                      /* EnableCallbackIf */
    void *arg;
    int enabled_run;                         /* before_run ran this step */
} s_wrap_t;

static void s_destroy(void *impl) {
    s_wrap_t *w = impl;
    tp_callback_destroy(&w->inner);
    free(w);
}

static tp_callback_t *s_new(const tp_callback_ops_t *ops, tp_callback_t *inner,
                            s_wrap_t proto) {
    if (!inner)
        return NULL;
    s_wrap_t *w = malloc(sizeof *w);
    if (!w) {
        tp_callback_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "%s", ops->name);
        return NULL;
    }
    *w = proto;
    w->inner = inner;
    return tp_callback_new(ops, w, tp_callback_chief_only(inner));
}

/* Forwarders shared by all wrappers. */
static tp_status_t f_setup_graph(void *i, tp_trainer_t *tr) { return tp_cb_setup_graph(((s_wrap_t *)i)->inner, tr); }
static tp_status_t f_before_train(void *i, tp_trainer_t *tr) { return tp_cb_before_train(((s_wrap_t *)i)->inner, tr); }
static tp_status_t f_after_train(void *i, tp_trainer_t *tr) { return tp_cb_after_train(((s_wrap_t *)i)->inner, tr); }
static tp_status_t f_before_epoch(void *i, tp_trainer_t *tr) { return tp_cb_before_epoch(((s_wrap_t *)i)->inner, tr); }
static tp_status_t f_after_epoch(void *i, tp_trainer_t *tr) { return tp_cb_after_epoch(((s_wrap_t *)i)->inner, tr); }
static tp_status_t f_before_run(void *i, tp_trainer_t *tr, tp_fetches_t *f) { return tp_cb_before_run(((s_wrap_t *)i)->inner, tr, f); }
static tp_status_t f_after_run(void *i, tp_trainer_t *tr, const tp_fetches_t *f) { return tp_cb_after_run(((s_wrap_t *)i)->inner, tr, f); }
static tp_status_t f_trigger_step(void *i, tp_trainer_t *tr) { return tp_cb_trigger_step(((s_wrap_t *)i)->inner, tr); }
static void f_on_scalar(void *i, tp_trainer_t *tr, const char *n, double v) { tp_cb_on_scalar(((s_wrap_t *)i)->inner, tr, n, v); }
static void f_on_image(void *i, tp_trainer_t *tr, const char *g, const tp_tensor_t *m) { tp_cb_on_image(((s_wrap_t *)i)->inner, tr, g, m); }

/* ---- PeriodicTrigger ---------------------------------------------------------- */

static tp_status_t pt_trigger_step(void *impl, tp_trainer_t *tr) {
    s_wrap_t *w = impl;
    TP_TRY(tp_cb_trigger_step(w->inner, tr));
    if (w->every_k_steps > 0 && tp_trainer_global_step(tr) % w->every_k_steps == 0)
        return tp_cb_trigger(w->inner, tr);
    return TP_OK;
}

static tp_status_t pt_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_wrap_t *w = impl;
    if (w->every_k_epochs > 0 && tp_trainer_epoch_num(tr) % w->every_k_epochs == 0)
        return tp_cb_trigger(w->inner, tr);
    return TP_OK;
}

static const tp_callback_ops_t s_periodic_trigger_ops = {
    .name = "PeriodicTrigger",
    .setup_graph = f_setup_graph, .before_train = f_before_train,
    .before_epoch = f_before_epoch, .before_run = f_before_run,
    .after_run = f_after_run, .trigger_step = pt_trigger_step,
    .after_epoch = f_after_epoch, .trigger_epoch = pt_trigger_epoch,
    .after_train = f_after_train, .on_scalar = f_on_scalar, .on_image = f_on_image, .destroy = s_destroy,
};

tp_callback_t *tp_cb_periodic_trigger(tp_callback_t *cb, int64_t every_k_steps,
                                      int64_t every_k_epochs) {
    if (cb && (every_k_steps < 0 || every_k_epochs < 0 ||
               (every_k_steps == 0 && every_k_epochs == 0))) {
        tp_error(TP_ERR_INVALID, "PeriodicTrigger(%s): every_k_steps %lld, "
                 "every_k_epochs %lld: give at least one positive period",
                 tp_callback_name(cb), (long long)every_k_steps,
                 (long long)every_k_epochs);
        tp_callback_destroy(&cb);
        return NULL;
    }
    return s_new(&s_periodic_trigger_ops, cb,
                 (s_wrap_t){.every_k_steps = every_k_steps,
                            .every_k_epochs = every_k_epochs});
}

/* ---- PeriodicCallback ---------------------------------------------------------- */

static int pc_on(s_wrap_t *w, tp_trainer_t *tr) {
    return tp_trainer_epoch_num(tr) % w->every_k == 0;
}
static tp_status_t pc_before_epoch(void *i, tp_trainer_t *tr) {
    return pc_on(i, tr) ? f_before_epoch(i, tr) : TP_OK;
}
static tp_status_t pc_before_run(void *i, tp_trainer_t *tr, tp_fetches_t *f) {
    s_wrap_t *w = i;
    w->enabled_run = pc_on(w, tr);
    return w->enabled_run ? f_before_run(i, tr, f) : TP_OK;
}
static tp_status_t pc_after_run(void *i, tp_trainer_t *tr, const tp_fetches_t *f) {
    return ((s_wrap_t *)i)->enabled_run ? f_after_run(i, tr, f) : TP_OK;
}
static tp_status_t pc_trigger_step(void *i, tp_trainer_t *tr) {
    return pc_on(i, tr) ? f_trigger_step(i, tr) : TP_OK;
}
static tp_status_t pc_after_epoch(void *i, tp_trainer_t *tr) {
    return pc_on(i, tr) ? f_after_epoch(i, tr) : TP_OK;
}
static tp_status_t pc_trigger_epoch(void *i, tp_trainer_t *tr) {
    return pc_on(i, tr) ? tp_cb_trigger_epoch(((s_wrap_t *)i)->inner, tr) : TP_OK;
}

static const tp_callback_ops_t s_periodic_callback_ops = {
    .name = "PeriodicCallback",
    .setup_graph = f_setup_graph, .before_train = f_before_train,
    .before_epoch = pc_before_epoch, .before_run = pc_before_run,
    .after_run = pc_after_run, .trigger_step = pc_trigger_step,
    .after_epoch = pc_after_epoch, .trigger_epoch = pc_trigger_epoch,
    .after_train = f_after_train, .on_scalar = f_on_scalar, .on_image = f_on_image, .destroy = s_destroy,
};

tp_callback_t *tp_cb_periodic_callback(tp_callback_t *cb, int64_t every_k_epochs) {
    if (cb && every_k_epochs < 1) {
        tp_error(TP_ERR_INVALID, "PeriodicCallback(%s): every_k_epochs %lld < 1",
                 tp_callback_name(cb), (long long)every_k_epochs);
        tp_callback_destroy(&cb);
        return NULL;
    }
    return s_new(&s_periodic_callback_ops, cb, (s_wrap_t){.every_k = every_k_epochs});
}

/* ---- EnableCallbackIf ------------------------------------------------------------ */

static int ei_on(s_wrap_t *w, tp_trainer_t *tr) { return w->pred(tr, w->arg); }
static tp_status_t ei_before_train(void *i, tp_trainer_t *tr) { return ei_on(i, tr) ? f_before_train(i, tr) : TP_OK; }
static tp_status_t ei_before_epoch(void *i, tp_trainer_t *tr) { return ei_on(i, tr) ? f_before_epoch(i, tr) : TP_OK; }
static tp_status_t ei_before_run(void *i, tp_trainer_t *tr, tp_fetches_t *f) {
    s_wrap_t *w = i;
    w->enabled_run = ei_on(w, tr);
    return w->enabled_run ? f_before_run(i, tr, f) : TP_OK;
}
static tp_status_t ei_trigger_step(void *i, tp_trainer_t *tr) { return ei_on(i, tr) ? f_trigger_step(i, tr) : TP_OK; }
static tp_status_t ei_after_epoch(void *i, tp_trainer_t *tr) { return ei_on(i, tr) ? f_after_epoch(i, tr) : TP_OK; }
static tp_status_t ei_trigger_epoch(void *i, tp_trainer_t *tr) {
    return ei_on(i, tr) ? tp_cb_trigger_epoch(((s_wrap_t *)i)->inner, tr) : TP_OK;
}
static tp_status_t ei_after_train(void *i, tp_trainer_t *tr) { return ei_on(i, tr) ? f_after_train(i, tr) : TP_OK; }

static const tp_callback_ops_t s_enable_if_ops = {
    .name = "EnableCallbackIf",
    .setup_graph = f_setup_graph, .before_train = ei_before_train,
    .before_epoch = ei_before_epoch, .before_run = ei_before_run,
    .after_run = pc_after_run, .trigger_step = ei_trigger_step,
    .after_epoch = ei_after_epoch, .trigger_epoch = ei_trigger_epoch,
    .after_train = ei_after_train, .on_scalar = f_on_scalar, .on_image = f_on_image, .destroy = s_destroy,
};

tp_callback_t *tp_cb_enable_if(tp_callback_t *cb, tp_cb_pred_fn pred, void *arg) {
    TP_ASSERT(pred);
    return s_new(&s_enable_if_ops, cb, (s_wrap_t){.pred = pred, .arg = arg});
}

tp_callback_t *tp_cb_unwrap(tp_callback_t *cb) {
    while (cb && (tp_callback_ops(cb) == &s_periodic_trigger_ops ||
                  tp_callback_ops(cb) == &s_periodic_callback_ops ||
                  tp_callback_ops(cb) == &s_enable_if_ops))
        cb = ((s_wrap_t *)tp_callback_impl(cb))->inner;
    return cb;
}
