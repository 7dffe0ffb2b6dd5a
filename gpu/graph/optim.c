/* towerpack gpu: SGD with momentum (optionally Nesterov; optionally
 * torch's coupled weight decay), Adam and AdamW, and the global-norm clip
 * the model applies before their update.
 *
 * An optimizer is only its hyper-parameters and a step counter; the model
 * owns the slot buffers, so the same object serves any backend. */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/optim.h>
#include "gpu/backend_impl.h"
#include "gpu/graph/graph_internal.h"

typedef enum { S_SGD, S_ADAM, S_ADAMW } s_kind_t;

#define S_MULTS_MAX 16

/* Glob patterns over parameter names, each with a multiplier; the first
 * that matches a name decides. lr_mult and decay_mult are both such lists. */
typedef struct {
    char *pattern[S_MULTS_MAX]; /* owned */
    double mult[S_MULTS_MAX];
    int n;
} s_rules_t;

struct tp_optimizer {
    s_kind_t kind;
    double lr;
    double momentum; /* sgd */
    int nesterov;
    double beta1, beta2, eps; /* adam, adamw */
    double weight_decay;      /* adamw: decoupled; sgd: coupled (L2, torch's) */
    double clip_norm;         /* any: 0 off */
    double ema_decay;         /* any: 0 off */
    double accumulate;        /* any: steps per update, an integer >= 1 */
    s_rules_t lr_rules;    /* learning-rate multipliers, in order */
    s_rules_t decay_rules; /* weight-decay multipliers, in order */
    int64_t step;
};

static const char *const s_names[] = {"sgd", "adam", "adamw"};

/* An optimizer of `kind` at learning rate lr, updating every step (the
 * rest 0: off); NULL with tp_error set (TP_ERR_NOMEM) when out of memory. */
static tp_optimizer_t *s_new(s_kind_t kind, double lr) {
    tp_optimizer_t *o = calloc(1, sizeof *o);
    if (!o) {
        tp_error(TP_ERR_NOMEM, "%s: no memory for the optimizer (%zu bytes)", s_names[kind],
                 sizeof *o);
        return NULL;
    }
    o->kind = kind;
    o->accumulate = 1;
    o->lr = lr;
    return o;
}

tp_optimizer_t *tp_optimizer_sgd(double lr, double momentum, int nesterov) {
    if (!(lr >= 0) || !(momentum >= 0 && momentum < 1)) {
        tp_error(TP_ERR_INVALID, "sgd: learning rate %g, momentum %g", lr,
                 momentum);
        return NULL;
    }
    tp_optimizer_t *o = s_new(S_SGD, lr);
    if (!o)
        return NULL;
    o->momentum = momentum;
    o->nesterov = nesterov;
    return o;
}

/* Adam or AdamW (kind) with these hyper-parameters; NULL with tp_error
 * naming the kind and what is wrong. */
static tp_optimizer_t *s_adam(s_kind_t kind, double lr, double beta1, double beta2,
                              double eps) {
    if (!(lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) ||
        !(eps > 0)) {
        tp_error(TP_ERR_INVALID, "%s: lr %g, beta1 %g, beta2 %g, eps %g", s_names[kind],
                 lr, beta1, beta2, eps);
        return NULL;
    }
    tp_optimizer_t *o = s_new(kind, lr);
    if (!o)
        return NULL;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    return o;
}

tp_optimizer_t *tp_optimizer_adam(double lr, double beta1, double beta2,
                                  double eps) {
    return s_adam(S_ADAM, lr, beta1, beta2, eps);
}

tp_optimizer_t *tp_optimizer_adamw(double lr, double beta1, double beta2,
                                   double eps, double weight_decay) {
    if (!(weight_decay >= 0 && weight_decay < 1e30)) {
        tp_error(TP_ERR_INVALID, "adamw: weight decay %g (>= 0)", weight_decay);
        return NULL;
    }
    tp_optimizer_t *o = s_adam(S_ADAMW, lr, beta1, beta2, eps);
    if (o)
        o->weight_decay = weight_decay;
    return o;
}

static void s_rules_fini(s_rules_t *r) {
    for (int i = 0; i < r->n; i++)
        free(r->pattern[i]);
}

void tp_optimizer_destroy(tp_optimizer_t **self_p) {
    if (!self_p || !*self_p)
        return;
    s_rules_fini(&(*self_p)->lr_rules);
    s_rules_fini(&(*self_p)->decay_rules);
    free(*self_p);
    *self_p = NULL;
}

const char *tp_optimizer_kind(const tp_optimizer_t *o) { return s_names[o->kind]; }

static double *s_param(tp_optimizer_t *o, const char *name) {
    if (!name)
        return NULL;
    if (!strcmp(name, "learning_rate") || !strcmp(name, "lr"))
        return &o->lr;
    if (!strcmp(name, "clip_norm"))
        return &o->clip_norm;
    if (!strcmp(name, "ema_decay"))
        return &o->ema_decay;
    if (!strcmp(name, "accumulate"))
        return &o->accumulate;
    if (o->kind == S_SGD && !strcmp(name, "momentum"))
        return &o->momentum;
    if (o->kind != S_ADAM && !strcmp(name, "weight_decay"))
        return &o->weight_decay;
    if (o->kind != S_SGD) {
        if (!strcmp(name, "beta1"))
            return &o->beta1;
        if (!strcmp(name, "beta2"))
            return &o->beta2;
        if (!strcmp(name, "epsilon"))
            return &o->eps;
    }
    return NULL;
}

static tp_status_t s_unknown(const tp_optimizer_t *o, const char *name) {
    return tp_error(TP_ERR_NOT_FOUND,
                    "%s optimizer has no hyper-parameter '%s' (it has %s)",
                    tp_optimizer_kind(o), name ? name : "(null)",
                    o->kind == S_SGD    ? "learning_rate, momentum, weight_decay, clip_norm, "
                                          "ema_decay, accumulate"
                    : o->kind == S_ADAM ? "learning_rate, beta1, beta2, epsilon, "
                                          "clip_norm, ema_decay, accumulate"
                                        : "learning_rate, beta1, beta2, epsilon, "
                                          "weight_decay, clip_norm, ema_decay, accumulate");
}

tp_status_t tp_optimizer_set(tp_optimizer_t *o, const char *name, double v) {
    double *p = s_param(o, name);
    if (!p)
        return s_unknown(o, name);
    int ok = v >= 0 && v < 1e30;
    if (p == &o->accumulate)  /* a count of steps */
        ok = v >= 1 && v <= 1 << 20 && v == (double)(int)v;
    else if (p != &o->lr && p != &o->clip_norm && p != &o->weight_decay)
        ok = ok && v < 1.0 && (p != &o->eps || v > 0);
    if (o->kind == S_SGD && p == &o->momentum && v > 0 && o->momentum == 0)
        ok = 0; /* no momentum slot was planned */
    if (o->kind == S_SGD && ok &&
        ((p == &o->weight_decay && v > 0 && (o->momentum == 0 || o->nesterov)) ||
         (p == &o->momentum && o->weight_decay > 0 && v == 0)))
        return tp_error(TP_ERR_INVALID, "sgd: weight_decay needs momentum > 0 and "
                        "no Nesterov (the decayed gradient goes through the momentum "
                        "slot; momentum %g%s)", o->momentum, o->nesterov ? ", nesterov" : "");
    if (!ok)
        return tp_error(TP_ERR_INVALID, "%s: '%s' = %g is out of range",
                        tp_optimizer_kind(o), name, v);
    *p = v;
    return TP_OK;
}

tp_status_t tp_optimizer_get(const tp_optimizer_t *o, const char *name,
                             double *v) {
    double *p = s_param((tp_optimizer_t *)o, name);
    if (!p)
        return s_unknown(o, name);
    *v = *p;
    return TP_OK;
}

int tp_optimizer_slot_count(const tp_optimizer_t *o) {
    if (o->kind != S_SGD)
        return 2;
    return o->momentum > 0 ? 1 : 0;
}

const char *tp_optimizer_slot_name(const tp_optimizer_t *o, int i) {
    if (o->kind != S_SGD)
        return i == 0 ? "m" : i == 1 ? "v" : NULL;
    return (i == 0 && o->momentum > 0) ? "momentum" : NULL;
}

double tp_optimizer_clip_norm(const tp_optimizer_t *o) { return o->clip_norm; }
double tp_optimizer_ema_decay(const tp_optimizer_t *o) { return o->ema_decay; }
int tp_optimizer_accumulate(const tp_optimizer_t *o) { return (int)o->accumulate; }

/* Appends (pattern, mult) to `r`; `what` names the option in errors and
 * `zero` says what a multiplier of 0 does. */
static tp_status_t s_rules_add(s_rules_t *r, const char *what,
                               const char *zero, const char *pattern,
                               double mult) {
    if (!(mult >= 0 && mult < 1e30))
        return tp_error(TP_ERR_INVALID, "%s '%s': multiplier %g (>= 0; 0 %s)",
                        what, pattern, mult, zero);
    if (r->n == S_MULTS_MAX)
        return tp_error(TP_ERR_INVALID, "%s '%s': more than %d patterns", what,
                        pattern, S_MULTS_MAX);
    if (!(r->pattern[r->n] = strdup(pattern)))
        return tp_error(TP_ERR_NOMEM, "%s '%s'", what, pattern);
    r->mult[r->n++] = mult;
    return TP_OK;
}

/* The first rule whose pattern matches `name`, or -1 (also for no name). */
static int s_rules_find(const s_rules_t *r, const char *name) {
    for (int i = 0; name && i < r->n; i++)
        if (fnmatch(r->pattern[i], name, 0) == 0)
            return i;
    return -1;
}

tp_status_t tp_optimizer_add_lr_mult(tp_optimizer_t *o, const char *pattern,
                                     double mult) {
    if (!pattern || !*pattern)
        return tp_error(TP_ERR_INVALID, "lr_mult: no pattern");
    return s_rules_add(&o->lr_rules, "lr_mult", "freezes", pattern, mult);
}

double tp_optimizer_lr_mult(const tp_optimizer_t *o, const char *name) {
    int i = s_rules_find(&o->lr_rules, name);
    return i >= 0 ? o->lr_rules.mult[i] : 1.0;
}

int tp_optimizer_lr_mult_count(const tp_optimizer_t *o) { return o->lr_rules.n; }

int tp_optimizer_lr_mult_index(const tp_optimizer_t *o, const char *name) {
    return s_rules_find(&o->lr_rules, name);
}

const char *tp_optimizer_lr_mult_pattern(const tp_optimizer_t *o, int i) {
    return i >= 0 && i < o->lr_rules.n ? o->lr_rules.pattern[i] : NULL;
}

tp_status_t tp_optimizer_add_decay_mult(tp_optimizer_t *o, const char *pattern,
                                        double mult) {
    if (!pattern || !*pattern)
        return tp_error(TP_ERR_INVALID, "decay_mult: no pattern");
    if (o->kind == S_ADAM)
        return tp_error(TP_ERR_INVALID, "decay_mult '%s': adam decays no weights (adamw "
                        "and sgd do)", pattern);
    return s_rules_add(&o->decay_rules, "decay_mult", "exempts", pattern, mult);
}

double tp_optimizer_decay_mult(const tp_optimizer_t *o, const char *name) {
    int i = s_rules_find(&o->decay_rules, name);
    return i >= 0 ? o->decay_rules.mult[i] : 1.0;
}

int tp_optimizer_decay_mult_count(const tp_optimizer_t *o) { return o->decay_rules.n; }

int64_t tp_optimizer_step(const tp_optimizer_t *o) { return o->step; }
void tp_optimizer_set_step(tp_optimizer_t *o, int64_t step) { o->step = step; }

tp_status_t tp_optimizer_update_group(tp_optimizer_t *o, tp_backend_t *b,
                                      tp_stream_t *s, float *param,
                                      const float *grad, float *const *slots,
                                      size_t off, size_t n, double lr_mult,
                                      double decay_mult) {
    /* (float)(lr * 1.0) is (float)lr: unscaled updates stay bit for bit */
    const double lr = o->lr * lr_mult;
    const double wd = o->weight_decay * decay_mult;
    if (o->kind == S_SGD && wd > 0) {
        if (!(o->momentum > 0) || o->nesterov || !slots[0])
            return tp_error(TP_ERR_INVALID, "sgd: weight_decay %g needs momentum > 0 "
                            "and no Nesterov", o->weight_decay);
        /* torch.optim.SGD's coupled decay in the update's own pass: one
         * read of g, w and v and one write of w and v, where the two calls
         * below make two of each (the ResNet-18 step's update, 11.2 M
         * weights, is a memory-bound pass) */
        if (b->ops->sgd_wd_update)
            return b->ops->sgd_wd_update(b, s, param + off, grad + off, slots[0] + off, n,
                                         (float)lr, (float)o->momentum, 0, (float)wd);
        /* A backend without it: d = g + wd w, v = mu v + d,
         * w -= lr v. First v += (wd / mu) w (sgd_update's w -= lr g with
         * the slot in w's place, the weights in g's, rate -wd / mu), then
         * the plain momentum step makes mu v + g = mu v_old + wd w + g.
         * Two calls of every backend's sgd kernel (already run on a GPU),
         * no new kernel per backend; the weight_decay setter keeps mu > 0
         * and Nesterov off. */
        TP_TRY(b->ops->sgd_update(b, s, slots[0] + off, param + off, NULL, n,
                                  (float)(-wd / o->momentum), 0.0f, 0));
    }
    if (o->kind == S_SGD)
        return b->ops->sgd_update(b, s, param + off, grad + off,
                                  o->momentum > 0 ? slots[0] + off : NULL, n,
                                  (float)lr, (float)o->momentum,
                                  o->nesterov);
    return b->ops->adam_update(b, s, param + off, grad + off, slots[0] + off,
                               slots[1] + off, n, (float)lr,
                               (float)o->beta1, (float)o->beta2, (float)o->eps,
                               o->kind == S_ADAMW ? (float)wd : 0.0f,
                               o->step + 1);
}

int tp_optimizer_plain_sgd_(const tp_optimizer_t *o, float *lr, float *momentum,
                            int *nesterov) {
    if (o->kind != S_SGD || o->weight_decay > 0)
        return 0;
    /* the casts tp_optimizer_update_group makes at lr_mult 1 */
    *lr = (float)(o->lr * 1.0);
    *momentum = o->momentum > 0 ? (float)o->momentum : 0.0f;
    *nesterov = o->nesterov;
    return 1;
}

int tp_optimizer_sgd_wd_(const tp_optimizer_t *o, float *lr, float *momentum,
                         int *nesterov, double *weight_decay) {
    if (o->kind != S_SGD)
        return 0;
    *lr = (float)(o->lr * 1.0);
    *momentum = o->momentum > 0 ? (float)o->momentum : 0.0f;
    *nesterov = o->nesterov;
    *weight_decay = o->weight_decay;
    return 1;
}

int tp_optimizer_adam_(const tp_optimizer_t *o, float *lr, float *beta1, float *beta2,
                       float *eps, double *weight_decay, int64_t *step) {
    if (o->kind != S_ADAM && o->kind != S_ADAMW)
        return 0;
    /* the arguments tp_optimizer_update_group passes adam_update */
    *lr = (float)(o->lr * 1.0);
    *beta1 = (float)o->beta1;
    *beta2 = (float)o->beta2;
    *eps = (float)o->eps;
    *weight_decay = o->kind == S_ADAMW ? o->weight_decay : 0.0;
    *step = o->step + 1;
    return 1;
}

tp_status_t tp_optimizer_update_scaled(tp_optimizer_t *o, tp_backend_t *b,
                                       tp_stream_t *s, float *param,
                                       const float *grad, float *const *slots,
                                       size_t off, size_t n, double lr_mult) {
    return tp_optimizer_update_group(o, b, s, param, grad, slots, off, n, lr_mult, 1.0);
}

tp_status_t tp_optimizer_update(tp_optimizer_t *o, tp_backend_t *b,
                                tp_stream_t *s, float *param,
                                const float *grad, float *const *slots,
                                size_t off, size_t n) {
    return tp_optimizer_update_scaled(o, b, s, param, grad, slots, off, n, 1.0);
}

void tp_optimizer_end_step(tp_optimizer_t *o) { o->step++; }

tp_status_t tp_optimizer_apply(tp_optimizer_t *o, tp_backend_t *b,
                               tp_stream_t *s, float *param,
                               const float *grad, float *const *slots,
                               size_t n) {
    tp_status_t rc = tp_optimizer_update(o, b, s, param, grad, slots, 0, n);
    if (rc == TP_OK)
        o->step++;
    return rc;
}
