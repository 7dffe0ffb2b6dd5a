/* towerpack pipeline: progress and time callbacks (ProgressBar,
 * ThroughputTracker, EstimatedTimeLeft, the slow-callback report) and the
 * guards (NaN/Inf check, stop after N steps). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/callback.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include "pipeline/trainer_internal.h"
#include "pipeline/callbacks/cb_internal.h"

/* Split "a,b,c" into at most `max` names of at most 63 chars. */
static int s_split_names(const char *names, char out[][64], int max) {
    int n = 0;
    const char *p = names ? names : "";
    while (*p && n < max) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > 0 && len < 64) {
            memcpy(out[n], p, len);
            out[n][len] = '\0';
            n++;
        }
        p += len + (e ? 1 : 0);
    }
    return n;
}

static void s_fmt_duration(double s, char *buf, size_t size) {
    if (!isfinite(s) || s < 0)
        s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, size, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else
        snprintf(buf, size, "%02ld:%02ld", t / 60, t % 60);
}

/* ---- ProgressBar ------------------------------------------------------------------ */

#define PB_MAX_NAMES 8

typedef struct {
    FILE *out;
    int tty;
    char names[PB_MAX_NAMES][64];
    int nnames;
    double values[PB_MAX_NAMES];
    int have[PB_MAX_NAMES];
    uint64_t epoch_t0, last_draw;
    int64_t last_decile;
    int64_t tokens_per_sample;  /* > 0: a language model's bar (tokens/s) */
} s_pb_t;

static tp_status_t pb_before_epoch(void *impl, tp_trainer_t *tr) {
    s_pb_t *p = impl;
    p->epoch_t0 = tp_trainer_hook_time_ns(tr);
    p->last_draw = 0;
    p->last_decile = 0;
    memset(p->have, 0, sizeof p->have);
    return TP_OK;
}

static tp_status_t pb_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_pb_t *p = impl;
    for (int i = 0; i < p->nnames; i++)
        TP_TRY(tp_fetches_request(f, p->names[i]));
    return TP_OK;
}

static void pb_draw(s_pb_t *p, tp_trainer_t *tr, int final) {
    const tp_schedule_t *s = tp_trainer_schedule(tr);
    int64_t done = tp_trainer_local_step(tr) + (final ? 0 : 1);
    if (done > s->steps_per_epoch)
        done = s->steps_per_epoch;
    double el = (double)(tp_trainer_hook_time_ns(tr) - p->epoch_t0) * 1e-9;
    double its = el > 0 ? (double)done / el : 0;
    double sps = its * (double)tp_trainer_samples_per_step(tr);
    char eta[32], elapsed[32];
    s_fmt_duration(its > 0 ? (double)(s->steps_per_epoch - done) / its : 0, eta, sizeof eta);
    s_fmt_duration(el, elapsed, sizeof elapsed);
    char line[512];
    int width = 24, fill = (int)(width * done / s->steps_per_epoch);
    char bar[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    int n = snprintf(line, sizeof line, "epoch %lld/%lld [%s] %lld/%lld %s<%s %.1f it/s",
                     (long long)tp_trainer_epoch_num(tr), (long long)s->max_epoch, bar,
                     (long long)done, (long long)s->steps_per_epoch, elapsed, eta, its);
    if (sps > 0 && p->tokens_per_sample > 0 && n > 0 && (size_t)n < sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, " %.0f tokens/s",
                      sps * (double)p->tokens_per_sample);
    else if (sps > 0 && n > 0 && (size_t)n < sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, " %.0f samples/s", sps);
    for (int i = 0; i < p->nnames && n > 0 && (size_t)n < sizeof line; i++)
        if (p->have[i])
            n += snprintf(line + n, sizeof line - (size_t)n, " %s=%.4g", p->names[i], p->values[i]);
    if (p->tty)
        fprintf(p->out, "\r%s\033[K%s", line, final ? "\n" : "");
    else
        fprintf(p->out, "%s\n", line);
    fflush(p->out);
}

static tp_status_t pb_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_pb_t *p = impl;
    for (int i = 0; i < p->nnames; i++)
        if (tp_fetches_get(f, p->names[i], &p->values[i]) == TP_OK)
            p->have[i] = 1;
    const tp_schedule_t *s = tp_trainer_schedule(tr);
    int64_t done = tp_trainer_local_step(tr) + 1;
    if (done >= s->steps_per_epoch)
        return TP_OK;  /* the final line comes from after_epoch */
    if (p->tty) {
        uint64_t now = tp_trainer_hook_time_ns(tr);
        if (now - p->last_draw >= 100000000ull) {
            p->last_draw = now;
            pb_draw(p, tr, 0);
        }
    } else {
        int64_t decile = done * 10 / s->steps_per_epoch;
        if (decile > p->last_decile) {
            p->last_decile = decile;
            pb_draw(p, tr, 0);
        }
    }
    return TP_OK;
}

static tp_status_t pb_after_epoch(void *impl, tp_trainer_t *tr) {
    pb_draw(impl, tr, 1);
    return TP_OK;
}

static tp_status_t pb_after_train(void *impl, tp_trainer_t *tr) {
    s_pb_t *p = impl;
    if (p->tty)
        fprintf(p->out, "\033[K");
    fflush(p->out);
    return TP_OK;
}

static void pb_destroy(void *impl) { free(impl); }

static const tp_callback_ops_t s_pb_ops = {
    .name = "ProgressBar",
    .before_epoch = pb_before_epoch, .before_run = pb_before_run,
    .after_run = pb_after_run, .after_epoch = pb_after_epoch,
    .after_train = pb_after_train, .destroy = pb_destroy,
};

tp_callback_t *tp_cb_progress_bar(const char *names, void *stream) {
    return tp_cb_progress_bar_tokens(names, stream, 0);
}

tp_callback_t *tp_cb_progress_bar_tokens(const char *names, void *stream,
                                         int64_t tokens_per_sample) {
    s_pb_t *p = tp_cb_impl_alloc(sizeof *p, "ProgressBar");
    if (!p)
        return NULL;
    p->tokens_per_sample = tokens_per_sample;
    p->out = stream ? stream : stderr;
    p->tty = isatty(fileno(p->out));
    p->nnames = s_split_names(names, p->names, PB_MAX_NAMES);
    return tp_callback_new(&s_pb_ops, p, 1);
}

/* ---- ThroughputTracker ---------------------------------------------------------------- */

typedef struct {
    tp_cb_epoch_clock_t clock;
} s_tput_t;

static tp_status_t tput_before_epoch(void *impl, tp_trainer_t *tr) {
    tp_cb_epoch_clock_start(&((s_tput_t *)impl)->clock, tr);
    return TP_OK;
}

static tp_status_t tput_after_epoch(void *impl, tp_trainer_t *tr) {
    double steps, el = tp_cb_epoch_clock_read(&((s_tput_t *)impl)->clock, tr, &steps);
    if (el <= 0)
        return TP_OK;
    tp_trainer_put_scalar(tr, "steps_per_s", steps / el);
    int64_t sps = tp_trainer_samples_per_step(tr);
    if (sps > 0)
        tp_trainer_put_scalar(tr, "throughput", steps * (double)sps / el);
    return TP_OK;
}

static const tp_callback_ops_t s_tput_ops = {
    .name = "ThroughputTracker",
    .before_epoch = tput_before_epoch, .after_epoch = tput_after_epoch,
    .destroy = pb_destroy,
};

tp_callback_t *tp_cb_throughput(void) {
    s_tput_t *t = tp_cb_impl_alloc(sizeof *t, "ThroughputTracker");
    if (!t)
        return NULL;
    return tp_callback_new(&s_tput_ops, t, 0);
}

/* ---- epoch means ------------------------------------------------------------------------ */

typedef struct {
    char names[PB_MAX_NAMES][64];
    int nnames;
    double sum[PB_MAX_NAMES];
    int64_t count[PB_MAX_NAMES];
} s_mean_t;

static tp_status_t mean_before_epoch(void *impl, tp_trainer_t *tr) {
    s_mean_t *m = impl;
    memset(m->sum, 0, sizeof m->sum);
    memset(m->count, 0, sizeof m->count);
    return TP_OK;
}

static tp_status_t mean_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_mean_t *m = impl;
    for (int i = 0; i < m->nnames; i++)
        TP_TRY(tp_fetches_request(f, m->names[i]));
    return TP_OK;
}

static tp_status_t mean_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_mean_t *m = impl;
    for (int i = 0; i < m->nnames; i++) {
        double v;
        if (tp_fetches_get(f, m->names[i], &v) == TP_OK && isfinite(v)) {
            m->sum[i] += v;
            m->count[i]++;
        }
    }
    return TP_OK;
}

static tp_status_t mean_after_epoch(void *impl, tp_trainer_t *tr) {
    s_mean_t *m = impl;
    for (int i = 0; i < m->nnames; i++)
        if (m->count[i])
            tp_trainer_put_scalar(tr, m->names[i], m->sum[i] / (double)m->count[i]);
    return TP_OK;
}

static const tp_callback_ops_t s_mean_ops = {
    .name = "EpochMean",
    .before_epoch = mean_before_epoch, .before_run = mean_before_run,
    .after_run = mean_after_run, .after_epoch = mean_after_epoch,
    .destroy = pb_destroy,
};

tp_callback_t *tp_cb_epoch_mean(const char *names) {
    s_mean_t *m = tp_cb_impl_alloc(sizeof *m, "EpochMean");
    if (!m)
        return NULL;
    m->nnames = s_split_names(names, m->names, PB_MAX_NAMES);
    return tp_callback_new(&s_mean_ops, m, 0);
}

/* ---- EstimatedTimeLeft -------------------------------------------------------------------- */

#define ETA_KEEP 64

typedef struct {
    uint64_t t0;
    double times[ETA_KEEP];   /* the last epochs' durations, ring */
    int n;
} s_eta_t;

static tp_status_t eta_before_train(void *impl, tp_trainer_t *tr) {
    ((s_eta_t *)impl)->t0 = tp_trainer_hook_time_ns(tr);
    return TP_OK;
}

static int s_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static tp_status_t eta_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_eta_t *e = impl;
    uint64_t now = tp_trainer_hook_time_ns(tr);
    e->times[e->n % ETA_KEEP] = (double)(now - e->t0) * 1e-9;
    e->n++;
    e->t0 = now;
    int64_t left = tp_trainer_schedule(tr)->max_epoch - tp_trainer_epoch_num(tr);
    if (left <= 0)
        return TP_OK;
    double sorted[ETA_KEEP];
    int k = e->n < ETA_KEEP ? e->n : ETA_KEEP;
    memcpy(sorted, e->times, (size_t)k * sizeof *sorted);
    qsort(sorted, (size_t)k, sizeof *sorted, s_cmp_double);
    char buf[32];
    s_fmt_duration(sorted[k / 2] * (double)left, buf, sizeof buf);
    TP_INFO("estimated time left: %s (%lld epochs)", buf, (long long)left);
    return TP_OK;
}

static const tp_callback_ops_t s_eta_ops = {
    .name = "EstimatedTimeLeft",
    .before_train = eta_before_train, .trigger_epoch = eta_trigger_epoch,
    .destroy = pb_destroy,
};

tp_callback_t *tp_cb_eta(void) {
    s_eta_t *e = tp_cb_impl_alloc(sizeof *e, "EstimatedTimeLeft");
    if (!e)
        return NULL;
    return tp_callback_new(&s_eta_ops, e, 1);
}

/* ---- the slow-callback report ---------------------------------------------------------------- */

typedef struct {
    double threshold;
} s_slow_t;

typedef struct {
    const char *name;
    double s;
} s_slow_row_t;

static int s_cmp_row(const void *a, const void *b) {
    double x = ((const s_slow_row_t *)a)->s, y = ((const s_slow_row_t *)b)->s;
    return (x < y) - (x > y);
}

/* Registered late (a default callback), it sees the epoch-end time of every
 * callback that ran before it in this epoch. */
static tp_status_t slow_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_slow_t *sl = impl;
    size_t n = tp_trainer_ncallbacks(tr);
    s_slow_row_t rows[64];
    size_t nrows = 0;
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        tp_callback_t *cb = tp_trainer_callback(tr, i);
        if (tp_callback_impl(cb) == impl)
            break;
        double s = tp_callback_epoch_end_seconds(cb);
        total += s;
        if (s > sl->threshold && nrows < 64)
            rows[nrows++] = (s_slow_row_t){tp_callback_name(cb), s};
    }
    tp_trainer_put_scalar(tr, "callback_seconds", total);
    if (!nrows)
        return TP_OK;
    qsort(rows, nrows, sizeof *rows, s_cmp_row);
    char line[512];
    int off = 0;
    for (size_t i = 0; i < nrows && off >= 0 && (size_t)off < sizeof line; i++)
        off += snprintf(line + off, sizeof line - (size_t)off, "%s%s %.2fs",
                        i ? ", " : "", rows[i].name, rows[i].s);
    TP_INFO("callbacks that took long at the end of epoch %lld: %s",
            (long long)tp_trainer_epoch_num(tr), line);
    return TP_OK;
}

static const tp_callback_ops_t s_slow_ops = {
    .name = "CallbackTimeReport",
    .trigger_epoch = slow_trigger_epoch,
    .destroy = pb_destroy,
};

tp_callback_t *tp_cb_slow_callback_report(double threshold_s) {
    s_slow_t *s = tp_cb_impl_alloc(sizeof *s, "CallbackTimeReport");
    if (!s)
        return NULL;
    s->threshold = threshold_s;
    return tp_callback_new(&s_slow_ops, s, 0);
}

/* ---- guards --------------------------------------------------------------------------------- */

typedef struct {
    char names[PB_MAX_NAMES][64];
    int nnames;
    int64_t every, max_steps;
    int asked;
} s_guard_t;

static tp_status_t num_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_guard_t *g = impl;
    g->asked = tp_trainer_global_step(tr) % g->every == 0;
    for (int i = 0; g->asked && i < g->nnames; i++)
        TP_TRY(tp_fetches_request(f, g->names[i]));
    return TP_OK;
}

static tp_status_t num_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_guard_t *g = impl;
    if (!g->asked)
        return TP_OK;
    for (int i = 0; i < g->nnames; i++) {
        double v;
        if (tp_fetches_get(f, g->names[i], &v) != TP_OK)
            continue;
        if (!isfinite(v))
            return tp_error(TP_ERR_STATE,
                            "%s is %s at global step %lld (epoch %lld, step %lld): "
                            "training stopped; lower the learning rate or check "
                            "the input", g->names[i], isnan(v) ? "NaN" : "Inf",
                            (long long)tp_trainer_global_step(tr),
                            (long long)tp_trainer_epoch_num(tr),
                            (long long)tp_trainer_local_step(tr));
    }
    return TP_OK;
}

static const tp_callback_ops_t s_num_ops = {
    .name = "CheckNumerics",
    .before_run = num_before_run, .after_run = num_after_run,
    .destroy = pb_destroy,
};

tp_callback_t *tp_cb_check_numerics(const char *names, int64_t every_k_steps) {
    s_guard_t *g = tp_cb_impl_alloc(sizeof *g, "CheckNumerics");
    if (!g)
        return NULL;
    g->nnames = s_split_names(names, g->names, PB_MAX_NAMES);
    g->every = every_k_steps > 0 ? every_k_steps : 1;
    return tp_callback_new(&s_num_ops, g, 0);
}

static tp_status_t stop_trigger_step(void *impl, tp_trainer_t *tr) {
    s_guard_t *g = impl;
    if (tp_trainer_global_step(tr) >= g->max_steps)
        tp_trainer_request_stop(tr, "reached the step limit", 0);
    return TP_OK;
}

static const tp_callback_ops_t s_stop_ops = {
    .name = "StopAfter",
    .trigger_step = stop_trigger_step,
    .destroy = pb_destroy,
};

tp_callback_t *tp_cb_stop_after(int64_t max_steps) {
    s_guard_t *g = tp_cb_impl_alloc(sizeof *g, "StopAfter");
    if (!g)
        return NULL;
    g->max_steps = max_steps;
    return tp_callback_new(&s_stop_ops, g, 0);
}

/* ---- StepScalars ------------------------------------------------------------------------- */

/* The training curve between epochs (issue 46): one epoch of Fashion-MNIST
 * gave TensorBoard a single point of the loss. Every `every` global steps
 * the mean of each fetched name over the steps since the last put goes to
 * the monitors as "<name>_step" (Lightning's train_loss_step): a window
 * mean, so a noisy loss reads as a curve. */
typedef struct {
    s_mean_t m;
    int64_t every;
} s_stepsc_t;

static tp_status_t stepsc_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    return mean_before_run(&((s_stepsc_t *)impl)->m, tr, f);
}

static tp_status_t stepsc_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    return mean_after_run(&((s_stepsc_t *)impl)->m, tr, f);
}

static tp_status_t stepsc_trigger_step(void *impl, tp_trainer_t *tr) {
    s_stepsc_t *s = impl;
    if (tp_trainer_global_step(tr) % s->every != 0)
        return TP_OK;
    for (int i = 0; i < s->m.nnames; i++)
        if (s->m.count[i]) {
            char name[80];
            snprintf(name, sizeof name, "%s_step", s->m.names[i]);
            tp_trainer_put_scalar(tr, name, s->m.sum[i] / (double)s->m.count[i]);
        }
    return mean_before_epoch(&s->m, tr);  /* a new window */
}

static const tp_callback_ops_t s_stepsc_ops = {
    .name = "StepScalars",
    .before_run = stepsc_before_run, .after_run = stepsc_after_run,
    .trigger_step = stepsc_trigger_step, .destroy = pb_destroy,
};

tp_callback_t *tp_cb_step_scalars(const char *names, int64_t every_n_steps) {
    if (every_n_steps < 1) {
        tp_error(TP_ERR_INVALID, "StepScalars: every_n_steps must be >= 1 (got %lld)",
                 (long long)every_n_steps);
        return NULL;
    }
    s_stepsc_t *s = tp_cb_impl_alloc(sizeof *s, "StepScalars");
    if (!s)
        return NULL;
    s->m.nnames = s_split_names(names, s->m.names, PB_MAX_NAMES);
    s->every = every_n_steps;
    return tp_callback_new(&s_stepsc_ops, s, 0);
}
