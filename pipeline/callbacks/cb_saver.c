/* towerpack pipeline: checkpoint callbacks (ModelSaver, MinSaver, MaxSaver)
 * and finding the latest checkpoint of a log directory.
 *
 * A saver splits a save in two. At its trigger_epoch, on the trainer's
 * thread between two steps, it takes a snapshot (tp_checkpoint_snapshot_take:
 * the variables, optimizer slots and state copied into memory the saver
 * owns): that is the state at the end of the epoch, and all the towers wait
 * for. Its writer, an actor fed by messages, then does the slow part
 * (serialise, write, fsync, rename; for ModelSaver the `checkpoint` index
 * and deleting checkpoints beyond max_to_keep) while the towers run the
 * next epoch. The file is the
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
#include <fcntl.h>
#include <math.h>
#include <czmq.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/actor.h>  /* tp_actors_init, TP_HANDOFF_* */
#include <towerpack/checkpoint.h>
#include <towerpack/clock.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>
#include "pipeline/callbacks/cb_internal.h"

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

/* 1 when dir/name is a regular file (following a link). A FIFO, socket or
 * device named like a checkpoint is never offered: opening one to read it
 * would block or read forever. */
static int s_regular(int dirfd, const char *name) {
    struct stat sb;
    return fstatat(dirfd, name, &sb, 0) == 0 && S_ISREG(sb.st_mode);
}

/* The model-<step>.safetensors of logdir with the largest step below
 * `below` (-1: any), regular files only, into out. */
static tp_status_t s_find_newest(const char *logdir, long long below, char *out,
                                 size_t size) {
    DIR *d = opendir(logdir);
    if (!d)
        return tp_error(TP_ERR_NOT_FOUND, "no checkpoint: cannot open %s: %s",
                        logdir, strerror(errno));
    long long best = -1;
    char best_name[256] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s = s_step_of(e->d_name);
        if (s < 0 || (below >= 0 && s >= below))
            continue;
        if (!s_regular(dirfd(d), e->d_name)) {
            TP_WARN("%s/%s is not a regular file: not a checkpoint", logdir, e->d_name);
            continue;
        }
        if (s > best && strlen(e->d_name) < sizeof best_name) {
            best = s;
            snprintf(best_name, sizeof best_name, "%s", e->d_name);
        }
    }
    closedir(d);
    if (best < 0)
        return tp_error(TP_ERR_NOT_FOUND, "no %scheckpoint (model-<step>.safetensors) in %s",
                        below >= 0 ? "older " : "", logdir);
    snprintf(out, size, "%s/%s", logdir, best_name);
    return TP_OK;
}

tp_status_t tp_checkpoint_find_latest(const char *logdir, char *out,
                                      size_t size) {
    char path[PATH_SIZE];
    snprintf(path, sizeof path, "%s/checkpoint", logdir);
    /* O_NONBLOCK and the fstat: an index that is a FIFO must not block */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat sb;
    FILE *f = NULL;
    if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode))
        f = fdopen(fd, "r");
    else if (fd >= 0)
        TP_WARN("%s is not a regular file: ignored", path);
    if (!f && fd >= 0)
        close(fd);
    if (f) {
        char name[256] = "";
        int ok = fgets(name, sizeof name, f) != NULL;
        fclose(f);
        name[strcspn(name, "\r\n")] = '\0';
        if (ok && s_step_of(name) >= 0) {
            snprintf(out, size, "%s/%s", logdir, name);
            if (access(out, R_OK) == 0 && stat(out, &sb) == 0 && S_ISREG(sb.st_mode))
                return TP_OK;
            TP_WARN("%s names %s, which is missing or not a regular file: looking for "
                    "another", path, name);
        }
    }
    return s_find_newest(logdir, -1, out, size);
}

tp_status_t tp_checkpoint_find_older(const char *logdir, const char *than, char *out,
                                     size_t size) {
    const char *base = strrchr(than, '/');
    long long step = s_step_of(base ? base + 1 : than);
    if (step < 0)
        return tp_error(TP_ERR_INVALID, "%s is not a model-<step>.safetensors", than);
    return s_find_newest(logdir, step, out, size);
}

/* ---- the writer: checkpoint files written off the step path ------------------------
 *
 * An actor (a zactor: its own thread) fed by messages on its pipe:
 *   trainer -> writer   WRITE: one frame, the job's pointer (the snapshot,
 *                       the path; the job is the writer's until answered)
 *   writer -> trainer   WRITTEN: one frame of s_written_t (the job, the
 *                       status, the message when it failed)
 * Jobs are written in the order they were sent: the index always ends
 * naming the newest. The trainer's side owns the job states; it takes the
 * answers without waiting at each of the saver's hooks (an atomic count of
 * answers sent tells it when there are any), and waits for them only when
 * both buffers are out or at the end. */

typedef struct {
    tp_checkpoint_snapshot_t *snap;  /* reused: taken again every epoch */
    int out;                         /* sent to the writer, not answered yet */
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
    zactor_t *actor;          /* started by the first checkpoint */
    s_job_t jobs[2];          /* at most one writing and one waiting */
    atomic_uint answers;      /* WRITTEN frames sent (the writer's count) */
    unsigned taken;           /* ... and taken (the trainer's) */
    tp_status_t failed;       /* the first failed write */
    char failmsg[PATH_SIZE + 2048];
    int failure_returned;     /* said once */
} s_writer_t;

typedef struct {
    s_job_t *job;
    int32_t rc;
    char msg[PATH_SIZE + 1024];
} s_written_t;

static void s_writer_init(s_writer_t *w, const char *who, s_done_fn done, void *owner) {
    memset(w, 0, sizeof *w);
    w->who = who;
    w->done = done;
    w->owner = owner;
    atomic_init(&w->answers, 0);
}

static void s_writer_actor(zsock_t *pipe, void *arg) {
    s_writer_t *w = arg;
    void *sock = zsock_resolve(pipe);
    zsock_signal(pipe, 0);
    for (;;) {
        s_job_t *j = NULL;
        int n = zmq_recv(sock, &j, sizeof j, 0);
        if (n < 0 && zmq_errno() == EINTR)
            continue;
        if (n != (int)sizeof j || !j)
            break;  /* $TERM: only sent once every job was answered */
        TP_HANDOFF_ACQUIRE(j);
        uint64_t t0 = tp_now_ns();
        tp_status_t rc = tp_checkpoint_snapshot_write(j->snap, j->path);
        if (rc == TP_OK && w->done)
            rc = w->done(w->owner, j);
        s_written_t a = {.job = j, .rc = (int32_t)rc};
        if (rc < 0)
            snprintf(a.msg, sizeof a.msg, "%s: saving %s failed (the checkpoint of epoch "
                     "%lld, global step %lld, written beside the steps): %s", w->who,
                     j->path, j->epoch, j->step, tp_last_error());
        else
            TP_DEBUG("[%s] wrote %s in %.3f s", w->who, j->path,
                     (double)(tp_now_ns() - t0) * 1e-9);
        TP_HANDOFF_RELEASE(j);
        atomic_fetch_add_explicit(&w->answers, 1, memory_order_release);
        while (zmq_send(sock, &a, offsetof(s_written_t, msg) + strlen(a.msg) + 1, 0) < 0 &&
               zmq_errno() == EINTR)
            ;
    }
}

/* Take one answer, waiting up to timeout_ms (-1: none there is a bug:
 * only called when one is owed). 1 taken, 0 not yet. */
static int s_writer_take(s_writer_t *w, int timeout_ms) {
    void *pipe = zsock_resolve(w->actor);
    zmq_pollitem_t it = {pipe, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return 0;
    s_written_t a;
    int n = zmq_recv(pipe, &a, sizeof a, 0);
    if (n < (int)offsetof(s_written_t, msg))
        return 0;
    TP_HANDOFF_ACQUIRE(a.job);
    a.job->out = 0;
    w->taken++;
    if (a.rc < 0 && w->failed >= 0) {
        w->failed = (tp_status_t)a.rc;
        a.msg[sizeof a.msg - 1] = '\0';
        snprintf(w->failmsg, sizeof w->failmsg, "%s", a.msg);
    }
    return 1;
}

/* Take the answers already sent; never waits (an atomic load when none). */
static void s_writer_collect(s_writer_t *w) {
    while (w->actor &&
           atomic_load_explicit(&w->answers, memory_order_acquire) != w->taken &&
           s_writer_take(w, 0))
        ;
}

static int s_writer_outstanding(const s_writer_t *w) {
    return w->jobs[0].out + w->jobs[1].out;
}

/* Wait until at most `most` jobs are out; says every 5 s what it waits for. */
static void s_writer_wait(s_writer_t *w, int most, const char *why) {
    uint64_t t0 = tp_now_ns(), said = t0;
    while (s_writer_outstanding(w) > most) {
        if (s_writer_take(w, 1000))
            continue;
        uint64_t now = tp_now_ns();
        if (now - said >= 5000000000ull) {
            said = now;
            for (int i = 0; i < 2; i++)
                if (w->jobs[i].out)
                    TP_INFO("[%s] %s: %s is still being written (%.0f s so far)", w->who,
                            why, w->jobs[i].path, (double)(now - t0) * 1e-9);
        }
    }
}

/* A failed write, once. */
static tp_status_t s_writer_failure(s_writer_t *w) {
    s_writer_collect(w);
    if (w->failed >= 0 || w->failure_returned)
        return TP_OK;
    w->failure_returned = 1;
    return tp_error(w->failed, "%s", w->failmsg);
}

/* On the trainer's thread: take the snapshot now (the state between two
 * steps) and send it to the writer for `path`. Waits only while the writer
 * is busy with an older checkpoint and another one waits. Returns an
 * earlier write's failure (once). */
static tp_status_t s_writer_submit(s_writer_t *w, tp_trainer_t *tr, const char *path) {
    if (!w->actor) {
        /* Started by the first checkpoint (a saver that never saves has no
         * thread); ended by after_train. */
        tp_actors_init();
        if (!(w->actor = zactor_new(s_writer_actor, w)))
            return tp_error(TP_ERR_NOMEM, "%s: cannot start the checkpoint writer", w->who);
    }
    s_writer_collect(w);
    s_writer_wait(w, 1, "the next checkpoint waits");
    s_job_t *j = !w->jobs[0].out ? &w->jobs[0] : &w->jobs[1];
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
    if (rc == TP_OK) {
        snprintf(j->path, sizeof j->path, "%s", path);
        j->epoch = st.epoch;
        j->step = st.global_step;
        j->out = 1;
        TP_HANDOFF_RELEASE(j);
        int sent;
        while ((sent = zmq_send(zsock_resolve(w->actor), &j, sizeof j, 0)) < 0 &&
               zmq_errno() == EINTR)
            ;
        if (sent < 0) {
            j->out = 0;
            rc = tp_error(TP_ERR_IO, "%s: the checkpoint writer takes no work: %s", w->who,
                          zmq_strerror(zmq_errno()));
        }
    }
    /* An earlier write that failed ends training now, but this epoch's
     * checkpoint is handed over first: it may still reach the disk. */
    return rc < 0 ? rc : s_writer_failure(w);
}

/* Wait until every checkpoint handed over is written, then end the
 * actor. */
static void s_writer_drain(s_writer_t *w) {
    if (w->actor) {
        s_writer_wait(w, 0, "training ends when it is on disk");
        zactor_destroy(&w->actor);
    }
}

/* after_train: everything on disk; the first failed write if it was not
 * said yet. */
static tp_status_t s_writer_finish(s_writer_t *w) {
    s_writer_drain(w);
    if (w->failed >= 0 || w->failure_returned)
        return TP_OK;
    w->failure_returned = 1;
    return tp_error(w->failed, "%s", w->failmsg);
}

static void s_writer_fini(s_writer_t *w) {
    s_writer_drain(w);  /* a trainer that never ran after_train: still written */
    for (int i = 0; i < 2; i++)
        tp_checkpoint_snapshot_destroy(&w->jobs[i].snap);
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
    /* The same step saved again: one entry, the new file's, at the end. Not
     * only the last: a run that kept a directory without resuming it
     * adopted the old run's model-100..300, and its own model-100 must not
     * be pruned as the oldest of them (issue 46). */
    for (size_t i = s->n; i-- > 0;)
        if (s->kept[i].step == step) {
            memmove(s->kept + i, s->kept + i + 1, (s->n - i - 1) * sizeof *s->kept);
            s->n--;
        }
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

/* The snapshot now; the file, the index and the pruning on the writer.
 * Its trigger (tensorpack's ModelSaver._trigger), which trigger_epoch runs
 * when no wrapper says otherwise: PeriodicTrigger(ModelSaver, every k
 * steps or epochs) saves then (as trigger_epoch it never saved). */
static tp_status_t saver_trigger(void *impl, tp_trainer_t *tr) {
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
    .trigger = saver_trigger,
    .after_train = saver_after_train,
    .destroy = saver_destroy,
};

tp_callback_t *tp_cb_model_saver(int max_to_keep, double keep_every_n_hours) {
    if (max_to_keep < 1) {
        tp_error(TP_ERR_INVALID, "ModelSaver: max_to_keep %d < 1", max_to_keep);
        return NULL;
    }
    s_saver_t *s = tp_cb_impl_alloc(sizeof *s, "ModelSaver");
    if (!s)
        return NULL;
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
    s_best_t *b = tp_cb_impl_alloc(sizeof *b, "MinSaver");
    if (!b)
        return NULL;
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
