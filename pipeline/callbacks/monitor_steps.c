/* towerpack pipeline: StepWriter, the per-step series behind the curves.
 *
 * LOGDIR/steps.tsv (TP_PLOT_STEPS_FILE): a header "global_step<TAB>name..."
 * and one line per point, each the mean of the named fetches (the step's
 * cost, accuracy) over the steps since the previous line. An epoch gives at
 * most TP_STEP_POINTS_PER_EPOCH lines (every step when the epoch has no
 * more steps than that), so the file grows by at most that many lines per
 * epoch and one line per step. The lines are formatted in memory and
 * appended with one write() per epoch: nothing on the step path but sums.
 * A resumed run keeps the lines up to the step it resumes from. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/callback.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/plot.h>
#include "pipeline/callbacks/cb_internal.h"

#define MAX_NAMES 8

typedef struct {
    char names[MAX_NAMES][64];
    int nnames;
    char path[4200];
    int fd;
    int64_t stride;          /* steps per line */
    double sum[MAX_NAMES];
    int64_t count[MAX_NAMES];
    int64_t in_bucket;       /* steps summed since the last line */
    int64_t last_step;       /* global step of the last step summed */
    char *buf;               /* lines not yet written */
    size_t len, cap;
} s_steps_t;

static tp_status_t s_fail(s_steps_t *s, const char *what) {
    return tp_error(TP_ERR_IO, "StepWriter: %s: %s: %s", s->path, what, strerror(errno));
}

static int s_append(s_steps_t *s, const char *text, size_t n) {
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 16384;
        while (cap < s->len + n)
            cap *= 2;
        char *q = realloc(s->buf, cap);
        if (!q)
            return -1;
        s->buf = q;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, n);
    s->len += n;
    return 0;
}

/* The header this writer writes, with its newline. */
static size_t s_header(const s_steps_t *s, char *out, size_t size) {
    size_t n = (size_t)snprintf(out, size, "global_step");
    for (int i = 0; i < s->nnames && n < size; i++)
        n += (size_t)snprintf(out + n, size - n, "\t%s", s->names[i]);
    if (n < size)
        n += (size_t)snprintf(out + n, size - n, "\n");
    return n < size ? n : size - 1;
}

/* Resume: the old file's header and its lines up to `upto` (inclusive);
 * lines of steps that will run again go. A file of other names starts over. */
static tp_status_t s_keep_old(s_steps_t *s, int64_t upto) {
    FILE *f = fopen(s->path, "r");
    if (!f)
        return errno == ENOENT ? TP_OK : s_fail(s, "open");
    char header[1024], line[4096];
    s_header(s, header, sizeof header);
    int same = 0;
    size_t kept = 0;
    while (fgets(line, sizeof line, f)) {
        if (!same) {
            if (strcmp(line, header))
                break;
            same = 1;
            if (s_append(s, line, strlen(line)) < 0)
                break;
            continue;
        }
        char *end;
        long long step = strtoll(line, &end, 10);
        if (end == line || *end != '\t' || step > upto || !strchr(line, '\n'))
            break;
        kept++;
        if (s_append(s, line, strlen(line)) < 0) {
            fclose(f);
            return tp_error(TP_ERR_NOMEM, "StepWriter: %s", s->path);
        }
    }
    fclose(f);
    if (!same)
        s->len = 0;
    else
        TP_INFO("StepWriter: %s keeps %zu lines up to step %lld", s->path, kept,
                (long long)upto);
    return TP_OK;
}

static tp_status_t steps_before_train(void *impl, tp_trainer_t *tr) {
    s_steps_t *s = impl;
    const char *dir = tp_trainer_logdir(tr);
    if (!dir)
        return tp_error(TP_ERR_STATE, "StepWriter needs a log directory "
                        "(tp_trainer_set_logdir)");
    snprintf(s->path, sizeof s->path, "%s/%s", dir, TP_PLOT_STEPS_FILE);
    int64_t spe = tp_trainer_schedule(tr)->steps_per_epoch;
    s->stride = spe > TP_STEP_POINTS_PER_EPOCH
                    ? (spe + TP_STEP_POINTS_PER_EPOCH - 1) / TP_STEP_POINTS_PER_EPOCH : 1;
    s->len = 0;
    char header[1024];
    size_t hn = s_header(s, header, sizeof header);
    TP_TRY(s_keep_old(s, tp_trainer_global_step(tr)));
    if (s->len == 0 && s_append(s, header, hn) < 0)
        return tp_error(TP_ERR_NOMEM, "StepWriter");
    /* the kept lines replace the file at once; then lines are appended */
    TP_TRY(tp_file_write_atomic(s->path, s->buf, s->len));
    s->len = 0;
    s->fd = open(s->path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (s->fd < 0)
        return s_fail(s, "open");
    return TP_OK;
}

static tp_status_t steps_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    (void)tr;
    s_steps_t *s = impl;
    for (int i = 0; i < s->nnames; i++)
        TP_TRY(tp_fetches_request(f, s->names[i]));
    return TP_OK;
}

/* The bucket as one line (nan for a name no step of it gave). */
static void s_emit(s_steps_t *s) {
    if (!s->in_bucket)
        return;
    char line[64 + MAX_NAMES * 24];
    size_t n = (size_t)snprintf(line, sizeof line, "%lld", (long long)s->last_step);
    for (int i = 0; i < s->nnames; i++) {
        n += (size_t)snprintf(line + n, sizeof line - n, "\t%.9g",
                              s->count[i] ? s->sum[i] / (double)s->count[i] : NAN);
        s->sum[i] = 0;
        s->count[i] = 0;
    }
    line[n++] = '\n';
    if (s_append(s, line, n) < 0)
        TP_WARN("StepWriter: a line of %s dropped: out of memory", s->path);
    s->in_bucket = 0;
}

static tp_status_t steps_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_steps_t *s = impl;
    for (int i = 0; i < s->nnames; i++) {
        double v;
        if (tp_fetches_get(f, s->names[i], &v) == TP_OK && isfinite(v)) {
            s->sum[i] += v;
            s->count[i]++;
        }
    }
    s->last_step = tp_trainer_global_step(tr);
    if (++s->in_bucket >= s->stride)
        s_emit(s);
    return TP_OK;
}

static tp_status_t s_flush(s_steps_t *s) {
    s_emit(s);
    size_t off = 0;
    while (s->fd >= 0 && off < s->len) {
        ssize_t w = write(s->fd, s->buf + off, s->len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            s->len = 0;
            return s_fail(s, "write");
        }
        off += (size_t)w;
    }
    s->len = 0;
    return TP_OK;
}

/* after_epoch: the lines are in the file before the observers' trigger_epoch
 * (CurvePlotter) is even queued. */
static tp_status_t steps_after_epoch(void *impl, tp_trainer_t *tr) {
    (void)tr;
    return s_flush(impl);
}

static tp_status_t steps_after_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_steps_t *s = impl;
    tp_status_t rc = s_flush(s);
    if (s->fd >= 0 && close(s->fd) < 0 && rc == TP_OK)
        rc = s_fail(s, "close");
    s->fd = -1;
    return rc;
}

static void steps_destroy(void *impl) {
    s_steps_t *s = impl;
    if (s->fd >= 0)
        close(s->fd);
    free(s->buf);
    free(s);
}

static const tp_callback_ops_t s_steps_ops = {
    .name = "StepWriter",
    .before_train = steps_before_train,
    .before_run = steps_before_run,
    .after_run = steps_after_run,
    .after_epoch = steps_after_epoch,
    .after_train = steps_after_train,
    .destroy = steps_destroy,
};

tp_callback_t *tp_cb_step_writer(const char *names) {
    s_steps_t *s = tp_cb_impl_alloc(sizeof *s, "StepWriter");
    if (!s)
        return NULL;
    s->fd = -1;
    const char *p = names ? names : "";
    while (*p && s->nnames < MAX_NAMES) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof s->names[0]) {
            memcpy(s->names[s->nnames], p, n);
            s->names[s->nnames++][n] = '\0';
        }
        p += n + (p[n] == ',');
    }
    if (s->nnames == 0) {
        free(s);
        tp_error(TP_ERR_INVALID, "StepWriter: no names in '%s' (e.g. \"cost\")",
                 names ? names : "");
        return NULL;
    }
    return tp_callback_new(&s_steps_ops, s, 1);
}
