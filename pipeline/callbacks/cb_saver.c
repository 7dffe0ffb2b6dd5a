/* towerpack pipeline: checkpoint callbacks (ModelSaver, MinSaver, MaxSaver)
 * and finding the latest checkpoint of a log directory.
 *
 * A saver splits a save in two. At its trigger_epoch, on the trainer's
 * thread between two steps, it takes a snapshot (tp_checkpoint_snapshot_take:
 * the variables, optimizer slots and state copied into memory the saver
 * owns): that is the state at the end of the epoch, and all the towers wait
 * for. Its writer thread then does the slow part (serialise, write, fsync,
 * rename; for ModelSaver the `checkpoint` index and deleting checkpoints
 * beyond max_to_keep) while the towers run the next epoch. The file is the
 * one a synchronous tp_checkpoint_save would have written at the take.
 *
 * Bounded: two snapshot buffers per saver, reused every epoch, one being
 * written and one waiting. A checkpoint due while both are busy waits for
 * the older write to end (the towers then wait for the disk, as they always
 * did): none is dropped or replaced, so the files and the index are the ones
 * a synchronous saver leaves. A failed write is kept and ends training with
 * its message (naming the file) at the saver's next hook on the trainer's
 * thread: the next step boundary, the next epoch end or after_train.
 * after_train waits until every snapshot handed over is on disk, also after
 * a failure elsewhere or a signal: training returns with its checkpoints
 * written. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/checkpoint.h>
#include <towerpack/clock.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>

#define PATH_SIZE 4096
/* Room in a path for "/model-<step>.safetensors" after the directory. */
#define S_DIR_MAX (PATH_SIZE - 64)

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

/* ---- the writer: checkpoint files written off the step path ------------------------ */

enum { J_FREE = 0, J_FILLING, J_PENDING, J_WRITING };

typedef struct {
    tp_checkpoint_snapshot_t *snap;  /* reused: taken again every epoch */
    int state;                       /* J_*: FILLING is the trainer's, WRITING the writer's */
    char path[PATH_SIZE];
    long long epoch, step;
} s_job_t;

/* On the writer thread, after a job's file is written (ModelSaver: the
 * index and the pruning). */
typedef tp_status_t (*s_done_fn)(void *owner, const s_job_t *job);

typedef struct {
    const char *who;          /* "ModelSaver", ... (errors and logs) */
    s_done_fn done;
    void *owner;
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* a job changed state, or quit */
    pthread_t thread;
    int started, quit;
    s_job_t jobs[2];          /* at most one writing and one waiting */
    tp_status_t failed;       /* the first failed write (under mu) */
    char failmsg[PATH_SIZE + 2048];
    int failure_returned;     /* the trainer's side: said once */
    atomic_int any_failed;    /* peeked at every step without the lock */
} s_writer_t;

static void s_writer_init(s_writer_t *w, const char *who, s_done_fn done, void *owner) {
    memset(w, 0, sizeof *w);
    w->who = who;
    w->done = done;
    w->owner = owner;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    atomic_init(&w->any_failed, 0);
}

static void *s_writer_main(void *arg) {
    s_writer_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        /* The older of two waiting checkpoints first: the index must end
         * naming the newest. */
        s_job_t *j = NULL;
        for (int i = 0; i < 2; i++)
            if (w->jobs[i].state == J_PENDING && (!j || w->jobs[i].step < j->step))
                j = &w->jobs[i];
        if (!j) {
            if (w->quit)
                break;  /* only once nothing waits: no checkpoint is lost */
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        j->state = J_WRITING;
        pthread_mutex_unlock(&w->mu);
        uint64_t t0 = tp_now_ns();
        tp_status_t rc = tp_checkpoint_snapshot_write(j->snap, j->path);
        if (rc == TP_OK && w->done)
            rc = w->done(w->owner, j);
        double took = (double)(tp_now_ns() - t0) * 1e-9;
        char msg[sizeof w->failmsg];
        if (rc < 0)
            snprintf(msg, sizeof msg, "%s: saving %s failed (the checkpoint of epoch %lld, "
                     "global step %lld, written beside the steps): %s", w->who, j->path,
                     j->epoch, j->step, tp_last_error());
        else
            TP_DEBUG("[%s] wrote %s in %.3f s", w->who, j->path, took);
        pthread_mutex_lock(&w->mu);
        if (rc < 0 && w->failed >= 0) {
            w->failed = rc;
            memcpy(w->failmsg, msg, sizeof msg);
            atomic_store_explicit(&w->any_failed, 1, memory_order_release);
        }
        j->state = J_FREE;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void s_deadline(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Under mu: wait until `ready(w)`; says every 5 s what it waits for. */
static void s_writer_wait(s_writer_t *w, int (*ready)(const s_writer_t *), const char *why) {
    uint64_t t0 = tp_now_ns(), said = t0;
    while (!ready(w)) {
        struct timespec ts;
        s_deadline(&ts, 1000);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        uint64_t now = tp_now_ns();
        if (!ready(w) && now - said >= 5000000000ull) {
            said = now;
            for (int i = 0; i < 2; i++)
                if (w->jobs[i].state == J_WRITING)
                    TP_INFO("[%s] %s: %s is still being written (%.0f s so far)", w->who,
                            why, w->jobs[i].path, (double)(now - t0) * 1e-9);
        }
    }
}

static int s_has_free(const s_writer_t *w) {
    return w->jobs[0].state == J_FREE || w->jobs[1].state == J_FREE;
}
static int s_idle(const s_writer_t *w) {
    return (w->jobs[0].state == J_FREE || w->jobs[0].state == J_FILLING) &&
           (w->jobs[1].state == J_FREE || w->jobs[1].state == J_FILLING);
}

/* A failed write, once, on the trainer's thread. */
static tp_status_t s_writer_failure(s_writer_t *w) {
    if (!atomic_load_explicit(&w->any_failed, memory_order_acquire) || w->failure_returned)
        return TP_OK;
    pthread_mutex_lock(&w->mu);
    tp_status_t rc = tp_error(w->failed, "%s", w->failmsg);
    pthread_mutex_unlock(&w->mu);
    w->failure_returned = 1;
    return rc;
}

/* On the trainer's thread: take the snapshot now (the state between two
 * steps) and hand it to the writer for `path`. Waits only while the writer
 * is busy with an older checkpoint and another one waits. Returns an
 * earlier write's failure (once). */
static tp_status_t s_writer_submit(s_writer_t *w, tp_trainer_t *tr, const char *path) {
    pthread_mutex_lock(&w->mu);
    s_writer_wait(w, s_has_free, "the next checkpoint waits");
    s_job_t *j = w->jobs[0].state == J_FREE ? &w->jobs[0] : &w->jobs[1];
    j->state = J_FILLING;  /* the writer leaves a filling job alone */
    pthread_mutex_unlock(&w->mu);
    tp_status_t rc = TP_OK;
    if (!j->snap && !(j->snap = tp_checkpoint_snapshot_new()))
        rc = tp_error(TP_ERR_NOMEM, "%s: snapshot for %s", w->who, path);
    tp_train_state_t st;
    memset(&st, 0, sizeof st);
    st.epoch = tp_trainer_epoch_num(tr);
    st.global_step = tp_trainer_global_step(tr);
    tp_rng_init(&st.rng, 0, 0);
    if (rc == TP_OK && (rc = tp_checkpoint_snapshot_take(j->snap, tp_trainer_model(tr), &st)) < 0)
        rc = tp_error_wrap(rc, "%s: snapshot for %s", w->who, path);
    pthread_mutex_lock(&w->mu);
    if (rc == TP_OK) {
        snprintf(j->path, sizeof j->path, "%s", path);
        j->epoch = st.epoch;
        j->step = st.global_step;
        j->state = J_PENDING;
        pthread_cond_broadcast(&w->cv);
    } else {
        j->state = J_FREE;
    }
    pthread_mutex_unlock(&w->mu);
    if (rc == TP_OK && !w->started) {
        /* Started by the first checkpoint (a saver that never saves has no
         * thread); ended by after_train. */
        int err = pthread_create(&w->thread, NULL, s_writer_main, w);
        if (err != 0) {
            pthread_mutex_lock(&w->mu);
            j->state = J_FREE;
            pthread_mutex_unlock(&w->mu);
            return tp_error(TP_ERR_NOMEM, "%s: cannot start the checkpoint writer: %s",
                            w->who, strerror(err));
        }
        w->started = 1;
    }
    /* An earlier write that failed ends training now, but this epoch's
     * checkpoint is handed over first: it may still reach the disk. */
    return rc < 0 ? rc : s_writer_failure(w);
}

/* Wait until every checkpoint handed over is written, then end the
 * thread. */
static void s_writer_drain(s_writer_t *w) {
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        s_writer_wait(w, s_idle, "training ends when it is on disk");
        w->quit = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        w->started = 0;
        w->quit = 0;
    }
}

/* after_train: everything on disk; the first failed write if it was not
 * said yet. */
static tp_status_t s_writer_finish(s_writer_t *w) {
    s_writer_drain(w);
    return s_writer_failure(w);
}

static void s_writer_fini(s_writer_t *w) {
    s_writer_drain(w);  /* a trainer that never ran after_train: still written */
    for (int i = 0; i < 2; i++)
        tp_checkpoint_snapshot_destroy(&w->jobs[i].snap);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

/* trigger_step of every saver: a write that failed ends training at the
 * next step boundary (one atomic load per step otherwise). */
static tp_status_t s_writer_poll(s_writer_t *w) { return s_writer_failure(w); }

/* ---- ModelSaver --------------------------------------------------------------- */

typedef struct {
    long long step;
    double time;      /* wall seconds when written */
} s_ckpt_t;

typedef struct {
    int max_to_keep;
    double keep_hours;
    char dir[PATH_SIZE];    /* the log directory, for the writer */
    /* The writer's once training runs (before_train fills them first). */
    s_ckpt_t *kept;   /* [n], oldest first */
    size_t n, cap;
    double last_permanent;  /* wall time of the last checkpoint kept for good */
    s_writer_t w;
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
    if (strlen(tp_trainer_logdir(tr)) > S_DIR_MAX)
        return tp_error(TP_ERR_INVALID, "%s: the log directory's path is longer than "
                        "%d characters", who, S_DIR_MAX);
    return TP_OK;
}

static tp_status_t saver_setup(void *impl, tp_trainer_t *tr) {
    return s_need(tr, "ModelSaver");
}

/* A checkpoint's path (s_need refused a longer directory). */
static void s_path(char *buf, size_t size, const char *dir, long long step) {
    snprintf(buf, size, "%.*s/model-%lld.safetensors", S_DIR_MAX, dir, step);
}

/* Resume: adopt the checkpoints already there, oldest first, and remove
 * the temporary files of a killed run (they never became checkpoints). */
static tp_status_t saver_before_train(void *impl, tp_trainer_t *tr) {
    s_saver_t *s = impl;
    s->n = 0;
    s->last_permanent = tp_wall_s();
    snprintf(s->dir, sizeof s->dir, "%s", tp_trainer_logdir(tr));
    int swept = tp_atomic_file_sweep(s->dir);
    if (swept > 0)
        TP_INFO("[ModelSaver] removed %d temporary file%s left by a killed run", swept,
                swept > 1 ? "s" : "");
    DIR *d = opendir(s->dir);
    if (!d)
        return TP_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step = s_step_of(e->d_name);
        if (step < 0)
            continue;
        struct stat st;
        char p[PATH_SIZE];
        s_path(p, sizeof p, s->dir, step);
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

/* On the writer thread, once model-<step> is on disk: the index names it
 * (so it never names a file that is not complete), then the oldest beyond
 * max_to_keep go, except one every keep_hours. */
static tp_status_t saver_written(void *owner, const s_job_t *job) {
    s_saver_t *s = owner;
    long long step = job->step;
    char index[PATH_SIZE + 16], line[300];
    snprintf(index, sizeof index, "%s/checkpoint", s->dir);
    int len = snprintf(line, sizeof line, "model-%lld.safetensors\n", step);
    TP_TRY(tp_file_write_atomic(index, line, (size_t)len));
    TP_INFO("[ModelSaver] saved %s", job->path);
    if (s->n && s->kept[s->n - 1].step == step)
        s->n--;  /* the same step saved again (resumed run): one entry */
    TP_TRY(s_kept_push(s, (s_ckpt_t){step, tp_wall_s()}));
    while (s->n > (size_t)s->max_to_keep) {
        s_ckpt_t old = s->kept[0];
        memmove(s->kept, s->kept + 1, (s->n - 1) * sizeof *s->kept);
        s->n--;
        if (s->keep_hours > 0 && old.time - s->last_permanent >= s->keep_hours * 3600) {
            s->last_permanent = old.time;
            continue;  /* kept for good: no longer tracked */
        }
        char p[PATH_SIZE];
        s_path(p, sizeof p, s->dir, old.step);
        if (unlink(p) != 0 && errno != ENOENT)
            TP_WARN("[ModelSaver] cannot delete %s: %s", p, strerror(errno));
    }
    return TP_OK;
}

/* The snapshot now; the file, the index and the pruning on the writer. */
static tp_status_t saver_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_saver_t *s = impl;
    char path[PATH_SIZE];
    s_path(path, sizeof path, s->dir, tp_trainer_global_step(tr));
    return s_writer_submit(&s->w, tr, path);
}

static tp_status_t saver_trigger_step(void *impl, tp_trainer_t *tr) {
    (void)tr;
    return s_writer_poll(&((s_saver_t *)impl)->w);
}

static tp_status_t saver_after_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    return s_writer_finish(&((s_saver_t *)impl)->w);
}

static void saver_destroy(void *impl) {
    s_saver_t *s = impl;
    s_writer_fini(&s->w);
    free(s->kept);
    free(s);
}

static const tp_callback_ops_t s_saver_ops = {
    .name = "ModelSaver",
    .setup_graph = saver_setup,
    .before_train = saver_before_train,
    .trigger_step = saver_trigger_step,
    .trigger_epoch = saver_trigger_epoch,
    .after_train = saver_after_train,
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
    s_writer_init(&s->w, "ModelSaver", saver_written, s);
    return tp_callback_new(&s_saver_ops, s, 1);
}

/* ---- MinSaver / MaxSaver --------------------------------------------------------- */

typedef struct {
    char stat[128];
    char filename[256];
    int maximise;
    double best;
    s_writer_t w;
} s_best_t;

static const char *s_best_name(const s_best_t *b) { return b->maximise ? "MaxSaver" : "MinSaver"; }

static tp_status_t best_setup(void *impl, tp_trainer_t *tr) {
    return s_need(tr, s_best_name(impl));
}

/* On the writer thread: the file is there. */
static tp_status_t best_written(void *owner, const s_job_t *job) {
    s_best_t *b = owner;
    TP_INFO("[%s] %s reached a new best at global step %lld: saved %s", s_best_name(b),
            b->stat, job->step, job->path);
    return TP_OK;
}

static tp_status_t best_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_best_t *b = impl;
    double v;
    if (tp_trainer_get_scalar(tr, b->stat, &v) != TP_OK) {
        TP_WARN("[%s] no statistic '%s' yet", s_best_name(b), b->stat);
        return s_writer_poll(&b->w);
    }
    if (!isfinite(v) || (b->maximise ? v <= b->best : v >= b->best))
        return s_writer_poll(&b->w);
    b->best = v;
    char path[PATH_SIZE];
    snprintf(path, sizeof path, "%s/%s", tp_trainer_logdir(tr), b->filename);
    TP_INFO("[%s] %s reached %g: saving %s", s_best_name(b), b->stat, v, path);
    return s_writer_submit(&b->w, tr, path);
}

static tp_status_t best_trigger_step(void *impl, tp_trainer_t *tr) {
    (void)tr;
    return s_writer_poll(&((s_best_t *)impl)->w);
}

static tp_status_t best_after_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    return s_writer_finish(&((s_best_t *)impl)->w);
}

static void best_destroy(void *impl) {
    s_best_t *b = impl;
    s_writer_fini(&b->w);
    free(b);
}

static const tp_callback_ops_t s_best_ops = {
    .name = "MinMaxSaver",
    .setup_graph = best_setup,
    .trigger_step = best_trigger_step,
    .trigger_epoch = best_trigger_epoch,
    .after_train = best_after_train,
    .destroy = best_destroy,
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
    s_writer_init(&b->w, maximise ? "MaxSaver" : "MinSaver", best_written, b);
    return tp_callback_new(&s_best_ops, b, 1);
}

tp_callback_t *tp_cb_min_saver(const char *stat, const char *filename) {
    return s_best_new(stat, filename, 0);
}
tp_callback_t *tp_cb_max_saver(const char *stat, const char *filename) {
    return s_best_new(stat, filename, 1);
}
