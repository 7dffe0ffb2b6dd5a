/* towerpack tests: the savers' writer (pipeline/callbacks/cb_saver.c).
 * ModelSaver takes its snapshot at trigger_epoch and writes the file on a
 * thread of its own while the next epoch's steps run. What must hold: the
 * write happens beside the steps (shown without timing: the temporary file
 * is made a FIFO beforehand, so the write can only progress while a reader
 * drains it, and the reader runs in a step of the next epoch); the file is
 * byte for byte a synchronous tp_checkpoint_save of the state at the
 * trigger; after_train waits until it is on disk; a write that fails ends
 * training with an error naming the file; a step that fails leaves the
 * checkpoints already taken on disk; a third checkpoint due while the writer
 * is busy and one waits is not dropped (the trainer waits for the disk). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/checkpoint.h>
#include <towerpack/clock.h>
#include <towerpack/launch.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/towerpack.h>
#include "train_testutil.h"
#include "dir_testutil.h"

/* A model whose checkpoint (about 650 KB with the momentum slots) takes a
 * disk a few milliseconds: long against the microseconds between an
 * epoch's last trigger_epoch and after_train. */
#define HIDDEN 16384
#define STEPS 3

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *h = tp_relu(t, NULL, tp_fc(t, "fc0", in[0], HIDDEN, 1));
    tp_node_t *logits = tp_fc(t, "linear", h, 2, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}
static tp_optimizer_t *s_opt(void *user) {
    (void)user;
    return tp_optimizer_sgd(0.1, 0.9, 0);
}
static const tp_input_desc_t s_inputs[] = {
    {"x", TP_FLOAT32, 2, {-1, 2}},
    {"label", TP_INT32, 1, {-1}},
};
static const tp_model_desc_t s_model = {s_inputs, 2, s_tower, s_opt, NULL};

static char s_dir[64];

static void setup(void) {
    dt_make(s_dir, sizeof s_dir, "tp-saver");
}

static void teardown(void) {
    dt_remove(s_dir);
}

/* No per-test .timeout: the TSan build's shim sets it (override-init). */
TestSuite(saver, .init = setup, .fini = teardown, .timeout = 120);

static void s_file(char *out, size_t size, const char *name) {
    snprintf(out, size, "%s/%s", s_dir, name);
}

static void s_ckpt(char *out, size_t size, long long step) {
    snprintf(out, size, "%s/model-%lld.safetensors", s_dir, step);
}

/* The temporary file the atomic write of `final` uses (core/fileio.c). */
static void s_tmp_of(char *out, size_t size, const char *final) {
    snprintf(out, size, "%s.tmp.%d", final, (int)getpid());
}

/* Train `epochs` x STEPS steps with cbs (taken); the error in err. */
static tp_status_t s_train(tp_callback_t **cbs, int n, int epochs, char *err, size_t errsize) {
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &s_model;
    c.batch = 16;
    c.dataflow = tu_blobs(192, 2, 0.5f, 3, 16, 1, 0);
    c.callbacks = cbs;
    c.ncallbacks = (size_t)n;
    c.save_checkpoints = 0;  /* only the ModelSaver of the test */
    c.max_epoch = epochs;
    c.steps_per_epoch = STEPS;
    c.threads = 1;
    c.stats = "off";
    c.default_callbacks = 0;
    c.logdir = s_dir;
    c.logdir_action = TP_LOGDIR_KEEP;  /* the tests plant files there first */
    tp_status_t rc = tp_launch_train_with_config(&c, NULL);
    snprintf(err, errsize, "%s", rc < 0 ? tp_last_error() : "");
    return rc;
}

static unsigned char *s_slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static void s_assert_same_bytes(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = s_slurp(a, &na), *y = s_slurp(b, &nb);
    cr_assert_eq(na, nb, "%s has %zu bytes, %s %zu", a, na, b, nb);
    cr_assert(memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x);
    free(y);
}

/* Read a FIFO to its end (the writer closed it after writing), at most
 * `ms` milliseconds. Returns the bytes read; *eof whether the end came. */
static size_t s_drain_fifo(const char *path, unsigned char *buf, size_t cap, int ms, int *eof) {
    *eof = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t got = 0;
    uint64_t end = tp_now_ns() + (uint64_t)ms * 1000000ull;
    while (tp_now_ns() < end) {
        unsigned char scratch[65536];
        unsigned char *to = got < cap ? buf + got : scratch;
        size_t room = got < cap ? cap - got : sizeof scratch;
        ssize_t r = read(fd, to, room);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r == 0 && got > 0) {  /* the writer came, wrote and closed */
            *eof = 1;
            break;
        }
        /* no writer yet (0), or no data yet (EAGAIN) */
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 10) < 0 && errno != EINTR)
            break;
        if (r == 0)
            usleep(1000);  /* before any writer a FIFO reads as ended */
    }
    close(fd);
    return got;
}

/* ---- a probe: synchronous hooks that record and check -------------------------- */

typedef struct s_watchdog s_watchdog_t;
static void s_watchdog_calm(s_watchdog_t *w);

typedef struct {
    int sync_save;            /* trigger_epoch: tp_checkpoint_save to sync-<step> */
    const char *fifo;         /* trigger_step of read_epoch's first step: drain it */
    int read_epoch;
    s_watchdog_t *wd;         /* told when the reader is done */
    unsigned char *fifo_buf;  /* [FIFO_CAP] what the reader got */
    size_t fifo_got;
    int fifo_eof;
    int64_t read_at_step;     /* the global step the reader ran at */
    int fail_epoch;           /* trigger_step of its second step fails */
    long long expect_step;    /* after_train: model-<step> and the index on disk */
    int after_train_saw;      /* 1: file complete and named by the index */
} s_probe_t;

#define FIFO_CAP (4u << 20)

static tp_status_t probe_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_probe_t *p = impl;
    if (!p->sync_save)
        return TP_OK;
    tp_train_state_t st;
    memset(&st, 0, sizeof st);
    st.epoch = tp_trainer_epoch_num(tr);
    st.global_step = tp_trainer_global_step(tr);
    tp_rng_init(&st.rng, 0, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/sync-%lld.safetensors", s_dir, (long long)st.global_step);
    return tp_checkpoint_save(tp_trainer_model(tr), path, &st);
}

static tp_status_t probe_trigger_step(void *impl, tp_trainer_t *tr) {
    s_probe_t *p = impl;
    if (p->fifo && tp_trainer_epoch_num(tr) == p->read_epoch && tp_trainer_local_step(tr) == 0) {
        p->read_at_step = tp_trainer_global_step(tr);
        p->fifo_got = s_drain_fifo(p->fifo, p->fifo_buf, FIFO_CAP, 30000, &p->fifo_eof);
        if (p->wd)
            s_watchdog_calm(p->wd);
    }
    if (p->fail_epoch && tp_trainer_epoch_num(tr) == p->fail_epoch &&
        tp_trainer_local_step(tr) == 1)
        return tp_error(TP_ERR_STATE, "probe: a step fails on purpose");
    return TP_OK;
}

static tp_status_t probe_after_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_probe_t *p = impl;
    if (!p->expect_step)
        return TP_OK;
    char path[256], index[256], want[64], line[64] = "";
    s_ckpt(path, sizeof path, p->expect_step);
    s_file(index, sizeof index, "checkpoint");
    snprintf(want, sizeof want, "model-%lld.safetensors\n", p->expect_step);
    FILE *f = fopen(index, "r");
    if (f) {
        if (!fgets(line, sizeof line, f))
            line[0] = '\0';
        fclose(f);
    }
    tp_safetensors_t *st = NULL;
    p->after_train_saw = tp_safetensors_open(path, &st) == TP_OK && !strcmp(line, want);
    tp_safetensors_destroy(&st);
    tp_clear_error();
    return TP_OK;
}

static const tp_callback_ops_t s_probe_ops = {
    .name = "Probe",
    .trigger_step = probe_trigger_step,
    .trigger_epoch = probe_trigger_epoch,
    .after_train = probe_after_train,
};

/* A watchdog for the FIFO tests: were the write on the trainer's thread,
 * the trainer would block in open() of the FIFO for good; after `ms` the
 * watchdog reads the FIFO itself (so training goes on and the test fails
 * instead of hanging) and says so. */
struct s_watchdog {
    const char *fifo;
    int ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, fired;
};

/* The reader got what it waited for: the watchdog stands down. */
static void s_watchdog_calm(s_watchdog_t *w) {
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void *s_watchdog_main(void *arg) {
    s_watchdog_t *w = arg;
    pthread_mutex_lock(&w->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += w->ms / 1000;
    while (!w->done)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT)
            break;
    int fire = !w->done;
    w->fired = fire;
    pthread_mutex_unlock(&w->mu);
    if (fire) {
        static unsigned char sink[1 << 16];
        int eof;
        s_drain_fifo(w->fifo, sink, sizeof sink, 30000, &eof);
    }
    return NULL;
}

static void s_watchdog_start(s_watchdog_t *w, pthread_t *th, const char *fifo, int ms) {
    memset(w, 0, sizeof *w);
    w->fifo = fifo;
    w->ms = ms;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    cr_assert_eq(pthread_create(th, NULL, s_watchdog_main, w), 0);
}

static int s_watchdog_stop(s_watchdog_t *w, pthread_t th) {
    s_watchdog_calm(w);
    pthread_join(th, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    return w->fired;
}

/* Must hold: the checkpoint of epoch 1 is written while epoch 2's steps
 * run, on another thread, from a snapshot of the end of epoch 1. Its
 * temporary file is a FIFO: the write can only progress while the probe, in
 * the trigger_step of epoch 2's first step on the trainer's thread, drains
 * it. A saver writing on the trainer's thread would block at epoch 1's end
 * for good (the watchdog then reads instead, and the test fails). The bytes
 * that came through are those of a synchronous tp_checkpoint_save at epoch
 * 1's trigger, although a step has changed the variables since. A FIFO
 * cannot be fsync'ed: the write then fails, and training ends with an error
 * naming the file; no file of that checkpoint stays. */
Test(saver, writes_beside_the_next_epochs_steps_from_a_snapshot) {
    char final[256], fifo[300];
    s_ckpt(final, sizeof final, STEPS);
    s_tmp_of(fifo, sizeof fifo, final);
    cr_assert_eq(mkfifo(fifo, 0600), 0, "%s: %s", fifo, strerror(errno));
    s_probe_t *p = calloc(1, sizeof *p);
    p->sync_save = 1;
    p->fifo = fifo;
    p->read_epoch = 2;
    p->fifo_buf = malloc(FIFO_CAP);
    s_watchdog_t wd;
    pthread_t th;
    s_watchdog_start(&wd, &th, fifo, 20000);
    p->wd = &wd;
    tp_callback_t *cbs[2] = {tp_cb_model_saver(5, 0), tp_callback_new(&s_probe_ops, p, 0)};
    char err[1024];
    tp_status_t rc = s_train(cbs, 2, 2, err, sizeof err);
    int fired = s_watchdog_stop(&wd, th);
    cr_assert_not(fired, "the trainer's thread blocked in the checkpoint write (the write is "
                  "not beside the steps)");
    cr_assert_eq(p->read_at_step, STEPS + 1, "the reader ran at global step %lld",
                 (long long)p->read_at_step);
    cr_assert(p->fifo_eof && p->fifo_got > 0, "the write did not come through the FIFO "
              "(%zu bytes, eof %d)", p->fifo_got, p->fifo_eof);
    char sync[256];
    snprintf(sync, sizeof sync, "%s/sync-%d.safetensors", s_dir, STEPS);
    size_t n;
    unsigned char *want = s_slurp(sync, &n);
    cr_assert_eq(p->fifo_got, n, "the writer wrote %zu bytes, a synchronous save %zu",
                 p->fifo_got, n);
    cr_assert(memcmp(p->fifo_buf, want, n) == 0,
              "the bytes written beside epoch 2 are not the state at the end of epoch 1");
    free(want);
    /* fsync of a FIFO fails: a clean error naming the checkpoint */
    cr_assert_lt(rc, 0, "training did not fail");
    cr_assert(strstr(err, "ModelSaver") && strstr(err, "model-3.safetensors"), "%s", err);
    cr_assert_eq(access(final, F_OK), -1, "a failed checkpoint is there");
    cr_assert_eq(access(fifo, F_OK), -1, "the temporary file is left");
    free(p->fifo_buf);
    free(p);
}

/* Must hold: when training returns, every checkpoint is on disk, and
 * already when ModelSaver's after_train returns (a later callback's
 * after_train finds the last one complete and named by the index); each
 * is byte for byte a synchronous save at the same trigger; the newest
 * max_to_keep stay and the latest loads. */
Test(saver, after_train_waits_and_each_file_is_the_synchronous_save) {
    s_probe_t *p = calloc(1, sizeof *p);
    p->sync_save = 1;
    p->expect_step = 4 * STEPS;
    tp_callback_t *cbs[2] = {tp_cb_model_saver(2, 0), tp_callback_new(&s_probe_ops, p, 0)};
    char err[1024];
    cr_assert_eq(s_train(cbs, 2, 4, err, sizeof err), TP_OK, "%s", err);
    cr_assert(p->after_train_saw, "after ModelSaver's after_train the last checkpoint was not "
              "complete or not named by the index");
    for (int e = 1; e <= 4; e++) {
        char a[256], b[256];
        s_ckpt(a, sizeof a, e * STEPS);
        snprintf(b, sizeof b, "%s/sync-%d.safetensors", s_dir, e * STEPS);
        if (e <= 2) {
            cr_assert_eq(access(a, F_OK), -1, "%s: beyond max_to_keep 2", a);
            continue;
        }
        s_assert_same_bytes(a, b);
    }
    char latest[256], want[256];
    cr_assert_eq(tp_checkpoint_find_latest(s_dir, latest, sizeof latest), TP_OK);
    s_ckpt(want, sizeof want, 4 * STEPS);
    cr_assert_str_eq(latest, want);
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 16;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&s_model, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    tp_train_state_t st;
    cr_assert_eq(tp_checkpoint_load(m, latest, TP_LOAD_STRICT, &st), TP_OK, "%s",
                 tp_last_error());
    cr_assert_eq(st.epoch, 4);
    cr_assert_eq(st.global_step, 4 * STEPS);
    tp_model_destroy(&m);
    free(p);
}

/* Must hold: a write that fails (here the temporary file cannot be made:
 * a directory is in the way) ends training with an error that names the
 * checkpoint and the cause; the previous checkpoint stays the latest and
 * loads. */
Test(saver, a_failed_write_ends_training_naming_the_file) {
    char final[256], tmp[300];
    s_ckpt(final, sizeof final, 2 * STEPS);
    s_tmp_of(tmp, sizeof tmp, final);
    cr_assert_eq(mkdir(tmp, 0700), 0);
    tp_callback_t *cbs[1] = {tp_cb_model_saver(5, 0)};
    char err[1024];
    tp_status_t rc = s_train(cbs, 1, 2, err, sizeof err);
    cr_assert_lt(rc, 0, "training did not fail");
    cr_assert(strstr(err, "callback ModelSaver") && strstr(err, final) &&
              strstr(err, "Is a directory"), "%s", err);
    char latest[256], want[256];
    cr_assert_eq(tp_checkpoint_find_latest(s_dir, latest, sizeof latest), TP_OK);
    s_ckpt(want, sizeof want, STEPS);
    cr_assert_str_eq(latest, want);
    tp_safetensors_t *st = NULL;
    cr_assert_eq(tp_safetensors_open(latest, &st), TP_OK, "%s", tp_last_error());
    tp_safetensors_destroy(&st);
}

/* Must hold: a step that fails (here a callback's trigger_step in epoch 3)
 * ends training with its error, and the checkpoints taken before (epochs 1
 * and 2, the second maybe still being written when the step failed) are on
 * disk when training returns; the index names the newest. */
Test(saver, a_failing_step_keeps_every_checkpoint_taken) {
    s_probe_t *p = calloc(1, sizeof *p);
    p->fail_epoch = 3;
    tp_callback_t *cbs[2] = {tp_cb_model_saver(5, 0), tp_callback_new(&s_probe_ops, p, 0)};
    char err[1024];
    tp_status_t rc = s_train(cbs, 2, 5, err, sizeof err);
    cr_assert_lt(rc, 0);
    cr_assert(strstr(err, "a step fails on purpose"), "%s", err);
    char latest[256], want[256];
    cr_assert_eq(tp_checkpoint_find_latest(s_dir, latest, sizeof latest), TP_OK);
    s_ckpt(want, sizeof want, 2 * STEPS);
    cr_assert_str_eq(latest, want);
    for (int e = 1; e <= 2; e++) {
        char path[256];
        s_ckpt(path, sizeof path, e * STEPS);
        tp_safetensors_t *st = NULL;
        cr_assert_eq(tp_safetensors_open(path, &st), TP_OK, "%s", tp_last_error());
        tp_safetensors_destroy(&st);
    }
    free(p);
}

/* ---- a third checkpoint while the writer is busy and one waits ------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int reached;       /* the trainer is at epoch 3's trigger_epoch, before the saver */
    int after_ran;     /* the saver's trigger_epoch of epoch 3 returned TP_OK */
    int first_ended;   /* and by then the first write had ended (its temporary
                          FIFO was removed) */
    const char *fifo;
    size_t got;
    int eof;
} s_third_t;

static tp_status_t before_saver(void *impl, tp_trainer_t *tr) {
    s_third_t *t = impl;
    if (tp_trainer_epoch_num(tr) == 3) {
        pthread_mutex_lock(&t->mu);
        t->reached = 1;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
    }
    return TP_OK;
}
static tp_status_t after_saver(void *impl, tp_trainer_t *tr) {
    s_third_t *t = impl;
    if (tp_trainer_epoch_num(tr) == 3) {
        /* the writer removes the FIFO (fsync failed) before it frees the
         * first job's buffer: gone means the saver waited for that */
        t->after_ran = 1;
        t->first_ended = access(t->fifo, F_OK) != 0;
    }
    return TP_OK;
}
static const tp_callback_ops_t s_before_ops = {.name = "BeforeSaver",
                                               .trigger_epoch = before_saver};
static const tp_callback_ops_t s_after_ops = {.name = "AfterSaver",
                                              .trigger_epoch = after_saver};

/* Waits (at most 30 s) until the trainer reaches epoch 3's end, then lets
 * the first checkpoint's write through its FIFO. */
static void *s_third_reader(void *arg) {
    s_third_t *t = arg;
    static unsigned char buf[1 << 16];
    pthread_mutex_lock(&t->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    while (!t->reached)
        if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&t->mu);
    t->got = s_drain_fifo(t->fifo, buf, sizeof buf, 30000, &t->eof);
    return NULL;
}

/* Must hold: with the first write held (its FIFO not read) and the second
 * checkpoint waiting, the third one's trigger_epoch waits until the writer
 * is free again: no checkpoint is dropped or replaced. When the first write
 * has failed (a FIFO cannot be fsync'ed), the second and third are still
 * written (the third is handed over before the failure is reported), the
 * index names the third, and training ends with the error. */
Test(saver, a_third_checkpoint_waits_for_the_writer_and_none_is_dropped) {
    char final[256], fifo[300];
    s_ckpt(final, sizeof final, STEPS);
    s_tmp_of(fifo, sizeof fifo, final);
    cr_assert_eq(mkfifo(fifo, 0600), 0, "%s: %s", fifo, strerror(errno));
    s_third_t *t = calloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->fifo = fifo;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, s_third_reader, t), 0);
    tp_callback_t *cbs[3] = {tp_callback_new(&s_before_ops, t, 0), tp_cb_model_saver(5, 0),
                             tp_callback_new(&s_after_ops, t, 0)};
    char err[1024];
    tp_status_t rc = s_train(cbs, 3, 3, err, sizeof err);
    pthread_join(th, NULL);
    cr_assert(t->reached, "the trainer never reached epoch 3's end");
    cr_assert(t->got > 0 && t->eof, "the first write did not come through (%zu bytes)", t->got);
    cr_assert_lt(rc, 0, "the failed first write was not reported");
    cr_assert(strstr(err, "model-3.safetensors"), "%s", err);
    /* The saver's trigger (its trigger_epoch) of epoch 3 returned after the first write
     * ended: either TP_OK (the probe after it saw the FIFO gone) or that
     * write's failure (which it can only know once the write ended). */
    if (t->after_ran)
        cr_assert(t->first_ended, "the third checkpoint was taken while the first was still "
                  "being written and the second waited (it did not wait for the writer)");
    else
        cr_assert(strstr(err, "ModelSaver: trigger"), "%s", err);
    for (int e = 2; e <= 3; e++) {
        char path[256];
        s_ckpt(path, sizeof path, e * STEPS);
        tp_safetensors_t *st = NULL;
        cr_assert_eq(tp_safetensors_open(path, &st), TP_OK, "%s", tp_last_error());
        tp_safetensors_destroy(&st);
    }
    char latest[256], want[256];
    cr_assert_eq(tp_checkpoint_find_latest(s_dir, latest, sizeof latest), TP_OK);
    s_ckpt(want, sizeof want, 3 * STEPS);
    cr_assert_str_eq(latest, want);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
