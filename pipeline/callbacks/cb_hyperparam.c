/* towerpack pipeline: hyper-parameter setters (ScheduledHyperParamSetter,
 * HyperParamSetterWithFunc, StatMonitorParamSetter), with tensorpack's
 * semantics: a schedule point (ep, v) takes effect after epoch ep. */
#include <math.h>
#include <string.h>
#include <towerpack/callback.h>
#include <towerpack/log.h>

typedef struct {
    char *param;
    tp_hp_point_t *points;   /* [n], increasing `at` */
    size_t n;
    int interp, step_based;
    tp_hp_fn fn;             /* with-func and stat-monitor */
    void *arg;
    char *stat;              /* stat-monitor */
    double threshold;
    int last_k, reverse;
    int64_t last_changed_epoch;
} s_hp_t;

static void s_hp_destroy(void *impl) {
    s_hp_t *h = impl;
    free(h->param);
    free(h->points);
    free(h->stat);
    free(h);
}

static tp_status_t s_set(s_hp_t *h, tp_trainer_t *tr, double v) {
    double old = NAN;
    tp_trainer_get_hyperparam(tr, h->param, &old);
    TP_TRY(tp_trainer_set_hyperparam(tr, h->param, v));
    if (old == v)
        return TP_OK;
    /* A step-based linear schedule changes the value every step: that goes
     * to the debug log (the epoch's value is in stats.json anyway). */
    if (h->step_based && h->interp)
        TP_DEBUG("[HyperParamSetter] at global_step %lld, %s changes from %g to %g",
                 (long long)tp_trainer_global_step(tr), h->param, old, v);
    else
        TP_INFO("[HyperParamSetter] at global_step %lld, %s changes from %g to %g",
                (long long)tp_trainer_global_step(tr), h->param, old, v);
    return TP_OK;
}

/* The value the schedule gives at `point`, or NAN for "no change". Without
 * interpolation only exact points set a value; with it, values between two
 * points are linear and past the last point nothing changes. */
static double s_value_at(const s_hp_t *h, double point) {
    if (!h->interp) {
        for (size_t i = 0; i < h->n; i++)
            if (h->points[i].at == point)
                return h->points[i].value;
        return NAN;
    }
    if (point < h->points[0].at || point > h->points[h->n - 1].at)
        return NAN;
    for (size_t i = 0; i + 1 < h->n; i++) {
        const tp_hp_point_t *a = &h->points[i], *b = &h->points[i + 1];
        if (point >= a->at && point <= b->at) {
            double t = (point - a->at) / (b->at - a->at);
            return a->value + t * (b->value - a->value);
        }
    }
    return h->points[h->n - 1].value;
}

static double s_current_point(const s_hp_t *h, tp_trainer_t *tr) {
    return h->step_based ? (double)tp_trainer_global_step(tr)
                         : (double)tp_trainer_epoch_num(tr);
}

/* Before training (also on resume): the value of the latest point at or
 * before where training starts. */
static tp_status_t sched_before_train(void *impl, tp_trainer_t *tr) {
    s_hp_t *h = impl;
    double now = s_current_point(h, tr);
    double v = NAN;
    if (h->interp) {
        v = s_value_at(h, now);
        if (isnan(v) && now > h->points[h->n - 1].at)
            v = h->points[h->n - 1].value;
    } else {
        for (size_t i = 0; i < h->n && h->points[i].at <= now; i++)
            v = h->points[i].value;
    }
    return isnan(v) ? TP_OK : s_set(h, tr, v);
}

static tp_status_t sched_trigger(s_hp_t *h, tp_trainer_t *tr) {
    double v = s_value_at(h, s_current_point(h, tr));
    return isnan(v) ? TP_OK : s_set(h, tr, v);
}
static tp_status_t sched_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_hp_t *h = impl;
    return h->step_based ? TP_OK : sched_trigger(h, tr);
}
static tp_status_t sched_trigger_step(void *impl, tp_trainer_t *tr) {
    s_hp_t *h = impl;
    return h->step_based ? sched_trigger(h, tr) : TP_OK;
}

static const tp_callback_ops_t s_sched_ops = {
    .name = "ScheduledHyperParamSetter",
    .before_train = sched_before_train,
    .trigger_epoch = sched_trigger_epoch,
    .trigger_step = sched_trigger_step,
    .destroy = s_hp_destroy,
};

static s_hp_t *s_hp_alloc(const char *param) {
    s_hp_t *h = calloc(1, sizeof *h);
    if (h && !(h->param = strdup(param))) {
        free(h);
        h = NULL;
    }
    if (!h)
        tp_error(TP_ERR_NOMEM, "hyper-parameter setter");
    return h;
}

tp_callback_t *tp_cb_hp_schedule(const char *param, const tp_hp_point_t *points,
                                 size_t n, int interp_linear, int step_based) {
    if (n == 0) {
        tp_error(TP_ERR_INVALID, "ScheduledHyperParamSetter(%s): empty schedule", param);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (points[i].at < 0 || (i && points[i].at <= points[i - 1].at) ||
            !isfinite(points[i].value)) {
            tp_error(TP_ERR_INVALID,
                     "ScheduledHyperParamSetter(%s): point %zu (%g, %g): points "
                     "must be finite, non-negative and strictly increasing",
                     param, i, points[i].at, points[i].value);
            return NULL;
        }
    }
    s_hp_t *h = s_hp_alloc(param);
    if (!h)
        return NULL;
    h->points = malloc(n * sizeof *h->points);
    if (!h->points) {
        s_hp_destroy(h);
        tp_error(TP_ERR_NOMEM, "schedule");
        return NULL;
    }
    memcpy(h->points, points, n * sizeof *points);
    h->n = n;
    h->interp = interp_linear;
    h->step_based = step_based;
    return tp_callback_new(&s_sched_ops, h, 0);
}

/* ---- HyperParamSetterWithFunc -------------------------------------------------- */

static tp_status_t func_trigger(void *impl, tp_trainer_t *tr) {
    s_hp_t *h = impl;
    double cur = NAN;
    TP_TRY(tp_trainer_get_hyperparam(tr, h->param, &cur));
    double v = h->fn(tp_trainer_epoch_num(tr), cur, h->arg);
    if (!isfinite(v))
        return tp_error(TP_ERR_INVALID, "HyperParamSetterWithFunc(%s): the "
                        "function returned %g at epoch %lld", h->param, v,
                        (long long)tp_trainer_epoch_num(tr));
    return s_set(h, tr, v);
}

static const tp_callback_ops_t s_func_ops = {
    .name = "HyperParamSetterWithFunc",
    .before_train = func_trigger,
    .trigger_epoch = func_trigger,
    .destroy = s_hp_destroy,
};

tp_callback_t *tp_cb_hp_func(const char *param, tp_hp_fn fn, void *arg) {
    TP_ASSERT(fn);
    s_hp_t *h = s_hp_alloc(param);
    if (!h)
        return NULL;
    h->fn = fn;
    h->arg = arg;
    return tp_callback_new(&s_func_ops, h, 0);
}

/* ---- StatMonitorParamSetter ------------------------------------------------------ */

static tp_status_t stat_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_hp_t *h = impl;
    int64_t ep = tp_trainer_epoch_num(tr);
    if (h->last_changed_epoch + h->last_k >= ep)
        return TP_OK;
    const double *hist;
    size_t n;
    double latest;
    if (tp_trainer_scalar_history(tr, h->stat, &hist, &n) != TP_OK ||
        tp_trainer_get_scalar(tr, h->stat, &latest) != TP_OK) {
        TP_WARN("[StatMonitorParamSetter] no statistic '%s' yet", h->stat);
        return TP_OK;
    }
    /* The window: the last k epoch-end values plus this epoch's latest. */
    if (n < (size_t)h->last_k)
        return TP_OK;
    const double *win = hist + n - (size_t)h->last_k;
    double first = win[0];
    double best = latest;
    for (int i = 1; i < h->last_k; i++)
        best = h->reverse ? fmax(best, win[i]) : fmin(best, win[i]);
    if (!h->reverse && best < first - h->threshold)
        return TP_OK;
    if (h->reverse && best > first + h->threshold)
        return TP_OK;
    TP_INFO("[StatMonitorParamSetter] %s has not %s by more than %g in %d "
            "epochs: changing %s", h->stat, h->reverse ? "increased" : "decreased",
            h->threshold, h->last_k, h->param);
    h->last_changed_epoch = ep;
    return func_trigger(impl, tr);
}

static const tp_callback_ops_t s_stat_ops = {
    .name = "StatMonitorParamSetter",
    .trigger_epoch = stat_trigger_epoch,
    .destroy = s_hp_destroy,
};

tp_callback_t *tp_cb_hp_stat_monitor(const char *param, const char *stat,
                                     tp_hp_fn fn, void *arg, double threshold,
                                     int last_k, int reverse) {
    TP_ASSERT(fn);
    if (last_k < 1) {
        tp_error(TP_ERR_INVALID, "StatMonitorParamSetter(%s): last_k %d < 1", param, last_k);
        return NULL;
    }
    s_hp_t *h = s_hp_alloc(param);
    if (!h)
        return NULL;
    if (!(h->stat = strdup(stat))) {
        s_hp_destroy(h);
        tp_error(TP_ERR_NOMEM, "StatMonitorParamSetter");
        return NULL;
    }
    h->fn = fn;
    h->arg = arg;
    h->threshold = threshold;
    h->last_k = last_k;
    h->reverse = reverse;
    h->last_changed_epoch = 0;
    return tp_callback_new(&s_stat_ops, h, 0);
}
