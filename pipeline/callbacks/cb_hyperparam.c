/* towerpack pipeline: hyper-parameter setters (ScheduledHyperParamSetter,
 * HyperParamSetterWithFunc, StatMonitorParamSetter), with tensorpack's
 * semantics: a schedule point (ep, v) takes effect after epoch ep; and the
 * common recipes' learning-rate schedules (linear, cosine, step, each with
 * a linear warm-up) in PyTorch's closed forms, set step by step. */
#include <math.h>
#include <stdlib.h>
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

/* ---- learning-rate schedules (tp_lr_schedule_t) --------------------------------- */

tp_status_t tp_lr_schedule_check(const tp_lr_schedule_t *s) {
    const char *kind = s->kind == TP_LR_LINEAR ? "linear" : s->kind == TP_LR_COSINE
                     ? "cosine" : s->kind == TP_LR_STEP ? "step" : NULL;
    if (!kind)
        return tp_error(TP_ERR_INVALID, "learning-rate schedule: kind %d (linear, cosine "
                        "or step)", (int)s->kind);
    if (!(s->base > 0 && isfinite(s->base)))
        return tp_error(TP_ERR_INVALID, "%s schedule: base rate %g (> 0)", kind, s->base);
    if (s->warmup > 0 && !(s->warmup_from > 0 && s->warmup_from <= 1))
        return tp_error(TP_ERR_INVALID, "%s schedule: warm-up start %g (a fraction of the "
                        "base rate in (0, 1], as PyTorch's LinearLR start_factor)", kind,
                        s->warmup_from);
    if (s->warmup < 0 || (s->kind != TP_LR_STEP && s->warmup >= s->total))
        return tp_error(TP_ERR_INVALID, "%s schedule: warm-up of %lld steps (at least 0%s%lld)",
                        kind, (long long)s->warmup, s->kind != TP_LR_STEP
                        ? ", and the schedule's length in steps must exceed it: " : "",
                        (long long)(s->kind != TP_LR_STEP ? s->total : 0));
    if (s->kind != TP_LR_STEP && !(s->end >= 0 && s->end <= 1))
        return tp_error(TP_ERR_INVALID, "%s schedule: end %g (a fraction of the base rate "
                        "in [0, 1])", kind, s->end);
    if (s->kind == TP_LR_STEP) {
        if (!(s->gamma > 0 && s->gamma <= 1))
            return tp_error(TP_ERR_INVALID, "step schedule: gamma %g (in (0, 1])", s->gamma);
        if (s->nmilestones < 1 || s->nmilestones > TP_LR_MAX_MILESTONES)
            return tp_error(TP_ERR_INVALID, "step schedule: %d milestones (1 to %d)",
                            s->nmilestones, TP_LR_MAX_MILESTONES);
        for (int i = 0; i < s->nmilestones; i++)
            if (s->milestones[i] < 1 || (i && s->milestones[i] <= s->milestones[i - 1]))
                return tp_error(TP_ERR_INVALID, "step schedule: milestone %d at step %lld "
                                "(milestones are positive and increasing)", i,
                                (long long)s->milestones[i]);
    }
    return TP_OK;
}

double tp_lr_schedule_at(const tp_lr_schedule_t *s, int64_t step) {
    double t = (double)(step < 0 ? 0 : step), w = (double)s->warmup;
    /* the warm-up's factor: LinearLR's closed form */
    double warm = t < w ? s->warmup_from + (1 - s->warmup_from) * t / w : 1.0;
    if (s->kind == TP_LR_STEP) {
        double f = 1.0;
        for (int i = 0; i < s->nmilestones && s->milestones[i] <= step; i++)
            f *= s->gamma;
        return s->base * warm * f;
    }
    if (t < w)
        return s->base * warm;
    double span = (double)s->total - w, x = t >= (double)s->total ? 1.0 : (t - w) / span;
    if (s->kind == TP_LR_LINEAR)
        return s->base * (1 + (s->end - 1) * x);
    /* cosine, down to base x end at `total` and staying there (PyTorch's
     * CosineAnnealingLR climbs again past T_max: no recipe wants that) */
    double eta = s->base * s->end;
    return eta + (s->base - eta) * (1 + cos(3.14159265358979323846 * x)) / 2;
}

typedef struct {
    char *param;
    tp_lr_schedule_t s;
} s_lr_t;

static void s_lr_destroy(void *impl) {
    s_lr_t *l = impl;
    free(l->param);
    free(l);
}

/* The rate of the coming step, global step g: set after step g - 1 ends
 * (trigger_step) and before the first (before_train, also on resume). */
static tp_status_t lr_set(void *impl, tp_trainer_t *tr) {
    s_lr_t *l = impl;
    int64_t g = tp_trainer_global_step(tr);
    double v = tp_lr_schedule_at(&l->s, g);
    double old = NAN;
    tp_trainer_get_hyperparam(tr, l->param, &old);
    TP_TRY(tp_trainer_set_hyperparam(tr, l->param, v));
    /* it changes every step: the debug log (stats.json has each epoch's) */
    if (old != v)
        TP_DEBUG("[LRSchedule] at global_step %lld, %s changes from %g to %g",
                 (long long)g, l->param, old, v);
    return TP_OK;
}

static const tp_callback_ops_t s_lr_ops = {
    .name = "LRSchedule",
    .before_train = lr_set,
    .trigger_step = lr_set,
    .destroy = s_lr_destroy,
};

tp_callback_t *tp_cb_lr_schedule(const char *param, const tp_lr_schedule_t *s) {
    if (tp_lr_schedule_check(s) != TP_OK)
        return NULL;
    s_lr_t *l = calloc(1, sizeof *l);
    if (!l || !(l->param = strdup(param))) {
        free(l);
        tp_error(TP_ERR_NOMEM, "learning-rate schedule");
        return NULL;
    }
    l->s = *s;
    return tp_callback_new(&s_lr_ops, l, 0);
}
