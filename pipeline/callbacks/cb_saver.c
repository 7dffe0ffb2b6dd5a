/* towerpack pipeline: checkpoint callbacks (ModelSaver, MinSaver, MaxSaver)
 * and finding the latest checkpoint of a log directory. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/checkpoint.h>
#include <towerpack/clock.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>

#define PATH_SIZE 4096

/* "model-123.safetensors" -> 123; -1 for any other name. */
static long long s_step_of(const char *name) {
    long long step;
    int end = 0;
    if (sscanf(name, "model-%lld.safetensors%n", &step, &end) == 1 &&
        name[end] == '\0' && step >= 0)
        return step;
    return -1;
}

tp_status_t tp_checkpoint_find_latest(const char *logdir, char *out,
                                      size_t size) {
    char path[PATH_SIZE];
    snprintf(path, sizeof path, "%s/checkpoint", logdir);
    FILE *f = fopen(path, "r");
    if (f) {
        char name[256] = "";
        int ok = fgets(name, sizeof name, f) != NULL;
        fclose(f);
        name[strcspn(name, "\r\n")] = '\0';
        if (ok && s_step_of(name) >= 0) {
            snprintf(out, size, "%s/%s", logdir, name);
            if (access(out, R_OK) == 0)
                return TP_OK;
            TP_WARN("%s names %s, which is missing: looking for another", path, name);
        }
    }
    DIR *d = opendir(logdir);
    if (!d)
        return tp_error(TP_ERR_NOT_FOUND, "no checkpoint: cannot open %s: %s",
                        logdir, strerror(errno));
    long long best = -1;
    char best_name[256] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s = s_step_of(e->d_name);
        if (s > best && strlen(e->d_name) < sizeof best_name) {
            best = s;
            snprintf(best_name, sizeof best_name, "%s", e->d_name);
        }
    }
    closedir(d);
    if (best < 0)
        return tp_error(TP_ERR_NOT_FOUND, "no checkpoint (model-<step>.safetensors) in %s", logdir);
    snprintf(out, size, "%s/%s", logdir, best_name);
    return TP_OK;
}

/* ---- ModelSaver --------------------------------------------------------------- */

typedef struct {
    long long step;
    double time;      /* wall seconds when written */
} s_ckpt_t;

typedef struct {
    int max_to_keep;
    double keep_hours;
    s_ckpt_t *kept;   /* [n], oldest first */
    size_t n, cap;
    double last_permanent;  /* wall time of the last checkpoint kept for good */
} s_saver_t;

/* Append a checkpoint to the kept list, growing it as needed. */
static tp_status_t s_kept_push(s_saver_t *s, s_ckpt_t c) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        s_ckpt_t *k = realloc(s->kept, cap * sizeof *k);
        if (!k)
            return tp_error(TP_ERR_NOMEM, "ModelSaver");
        s->kept = k;
        s->cap = cap;
    }
    s->kept[s->n++] = c;
    return TP_OK;
}

static tp_status_t s_need(tp_trainer_t *tr, const char *who) {
    if (!tp_trainer_model(tr))
        return tp_error(TP_ERR_STATE, "%s needs a trainer with a model", who);
    if (!tp_trainer_logdir(tr))
        return tp_error(TP_ERR_STATE, "%s needs a log directory", who);
    return TP_OK;
}

static tp_status_t s_save(tp_trainer_t *tr, const char *path) {
    tp_train_state_t st;
    memset(&st, 0, sizeof st);
    st.epoch = tp_trainer_epoch_num(tr);
    st.global_step = tp_trainer_global_step(tr);
    tp_rng_init(&st.rng, 0, 0);
    return tp_checkpoint_save(tp_trainer_model(tr), path, &st);
}

static tp_status_t saver_setup(void *impl, tp_trainer_t *tr) {
    return s_need(tr, "ModelSaver");
}

static void s_path(char *buf, size_t size, tp_trainer_t *tr, long long step) {
    snprintf(buf, size, "%s/model-%lld.safetensors", tp_trainer_logdir(tr), step);
}

/* Resume: adopt the checkpoints already there, oldest first, and remove
 * the temporary files of a killed run (they never became checkpoints). */
static tp_status_t saver_before_train(void *impl, tp_trainer_t *tr) {
    s_saver_t *s = impl;
    s->n = 0;
    s->last_permanent = tp_wall_s();
    int swept = tp_atomic_file_sweep(tp_trainer_logdir(tr));
    if (swept > 0)
        TP_INFO("[ModelSaver] removed %d temporary file%s left by a killed run", swept,
                swept > 1 ? "s" : "");
    DIR *d = opendir(tp_trainer_logdir(tr));
    if (!d)
        return TP_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step = s_step_of(e->d_name);
        if (step < 0)
            continue;
        struct stat st;
        char p[PATH_SIZE];
        s_path(p, sizeof p, tr, step);
        if (s_kept_push(s, (s_ckpt_t){step, stat(p, &st) == 0 ? (double)st.st_mtime : 0}) < 0) {
            closedir(d);
            return tp_error(TP_ERR_NOMEM, "ModelSaver");
        }
    }
    closedir(d);
    for (size_t i = 1; i < s->n; i++)  /* insertion sort by step */
        for (size_t j = i; j > 0 && s->kept[j - 1].step > s->kept[j].step; j--) {
            s_ckpt_t t = s->kept[j];
            s->kept[j] = s->kept[j - 1];
            s->kept[j - 1] = t;
        }
    return TP_OK;
}

static tp_status_t saver_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_saver_t *s = impl;
    long long step = tp_trainer_global_step(tr);
    char path[PATH_SIZE];
    s_path(path, sizeof path, tr, step);
    TP_TRY(s_save(tr, path));
    char index[PATH_SIZE], line[300];
    snprintf(index, sizeof index, "%s/checkpoint", tp_trainer_logdir(tr));
    int len = snprintf(line, sizeof line, "model-%lld.safetensors\n", step);
    TP_TRY(tp_file_write_atomic(index, line, (size_t)len));
    TP_INFO("[ModelSaver] saved %s", path);
    if (s->n && s->kept[s->n - 1].step == step)
        s->n--;  /* the same step saved again (resumed run): one entry */
    TP_TRY(s_kept_push(s, (s_ckpt_t){step, tp_wall_s()}));
    /* Drop the oldest beyond max_to_keep, except one every keep_hours. */
    while (s->n > (size_t)s->max_to_keep) {
        s_ckpt_t old = s->kept[0];
        memmove(s->kept, s->kept + 1, (s->n - 1) * sizeof *s->kept);
        s->n--;
        if (s->keep_hours > 0 && old.time - s->last_permanent >= s->keep_hours * 3600) {
            s->last_permanent = old.time;
            continue;  /* kept for good: no longer tracked */
        }
        char p[PATH_SIZE];
        s_path(p, sizeof p, tr, old.step);
        if (unlink(p) != 0 && errno != ENOENT)
            TP_WARN("[ModelSaver] cannot delete %s: %s", p, strerror(errno));
    }
    return TP_OK;
}

static void saver_destroy(void *impl) {
    s_saver_t *s = impl;
    free(s->kept);
    free(s);
}

static const tp_callback_ops_t s_saver_ops = {
    .name = "ModelSaver",
    .setup_graph = saver_setup,
    .before_train = saver_before_train,
    .trigger_epoch = saver_trigger_epoch,
    .destroy = saver_destroy,
};

tp_callback_t *tp_cb_model_saver(int max_to_keep, double keep_every_n_hours) {
    if (max_to_keep < 1) {
        tp_error(TP_ERR_INVALID, "ModelSaver: max_to_keep %d < 1", max_to_keep);
        return NULL;
    }
    s_saver_t *s = calloc(1, sizeof *s);
    if (!s) {
        tp_error(TP_ERR_NOMEM, "ModelSaver");
        return NULL;
    }
    s->max_to_keep = max_to_keep;
    s->keep_hours = keep_every_n_hours;
    return tp_callback_new(&s_saver_ops, s, 1);
}

/* ---- MinSaver / MaxSaver --------------------------------------------------------- */

typedef struct {
    char stat[128];
    char filename[256];
    int maximise;
    double best;
} s_best_t;

static tp_status_t best_setup(void *impl, tp_trainer_t *tr) {
    return s_need(tr, ((s_best_t *)impl)->maximise ? "MaxSaver" : "MinSaver");
}

static tp_status_t best_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_best_t *b = impl;
    double v;
    if (tp_trainer_get_scalar(tr, b->stat, &v) != TP_OK) {
        TP_WARN("[%s] no statistic '%s' yet", b->maximise ? "MaxSaver" : "MinSaver", b->stat);
        return TP_OK;
    }
    if (!isfinite(v) || (b->maximise ? v <= b->best : v >= b->best))
        return TP_OK;
    b->best = v;
    char path[PATH_SIZE];
    snprintf(path, sizeof path, "%s/%s", tp_trainer_logdir(tr), b->filename);
    TP_TRY(s_save(tr, path));
    TP_INFO("[%s] %s reached %g: saved %s", b->maximise ? "MaxSaver" : "MinSaver",
            b->stat, v, path);
    return TP_OK;
}

static const tp_callback_ops_t s_best_ops = {
    .name = "MinMaxSaver",
    .setup_graph = best_setup,
    .trigger_epoch = best_trigger_epoch,
    .destroy = free,
};

static tp_callback_t *s_best_new(const char *stat, const char *filename, int maximise) {
    s_best_t *b = calloc(1, sizeof *b);
    if (!b) {
        tp_error(TP_ERR_NOMEM, "MinSaver");
        return NULL;
    }
    snprintf(b->stat, sizeof b->stat, "%s", stat);
    if (filename)
        snprintf(b->filename, sizeof b->filename, "%s", filename);
    else
        snprintf(b->filename, sizeof b->filename, "%s-%s.safetensors",
                 maximise ? "max" : "min", stat);
    b->maximise = maximise;
    b->best = maximise ? -INFINITY : INFINITY;
    return tp_callback_new(&s_best_ops, b, 1);
}

tp_callback_t *tp_cb_min_saver(const char *stat, const char *filename) {
    return s_best_new(stat, filename, 0);
}
tp_callback_t *tp_cb_max_saver(const char *stat, const char *filename) {
    return s_best_new(stat, filename, 1);
}
