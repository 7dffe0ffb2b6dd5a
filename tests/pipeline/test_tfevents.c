/* towerpack tests: TFEventWriter. A tiny training writes an event file that
 * Python's protobuf (the schema compiled by protoc) and crcmod read: every
 * record's two CRCs hold, the first record is brain.Event:2, the scalars
 * equal stats.json's and the hyper-parameters are there as text. A file
 * that cannot be opened or written stops training with an error that names
 * it. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <towerpack/callback.h>
#include <towerpack/launch.h>
#include <towerpack/towerpack.h>
#include "train_testutil.h"
#include "tfevents_testutil.h"

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    return tu_mlp(t, in, 16);
}

static const tp_model_desc_t s_model = {tu_blob_inputs, 2, s_tower, tu_sgd_opt, NULL};

/* 3 epochs of 8 steps; the learning rate set every step (a step-based
 * linear schedule), so per-step scalars reach the file too. */
static void s_train(const char *dir, int tensorboard) {
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &s_model;
    c.batch = 32;
    c.dataflow = tu_blobs(256, 4, 0.7f, 5, 32, 1, 0);
    c.validation = tu_blobs(100, 4, 0.7f, 6, 100, 0, 1);
    c.infer_batch = 100;
    c.max_epoch = 3;
    c.logdir = dir;
    c.threads = 1;
    c.progress_names = "cost";
    c.tensorboard = tensorboard;
    c.hparams = "    batch = 32\n    lr = 0.1\n";
    tp_hp_point_t pts[2] = {{0, 0.1}, {24, 0.01}};
    tp_callback_t *cbs[1] = {tp_cb_hp_schedule("learning_rate", pts, 2, 1, 1)};
    c.callbacks = cbs;
    c.ncallbacks = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
}

static int s_count_events(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, "events.out.tfevents.", 20);
    closedir(d);
    return n;
}

static void s_rm(const char *d) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    cr_assert_eq(system(cmd), 0);
}

Test(tfevents, python_reads_every_record_and_the_scalars_equal_stats_json,
     .timeout = 240) {
    char why[256];
    const char *py = te_python(why, sizeof why);
    if (!py)
        cr_skip_test("cannot read event files here: %s", why);
    char dir[] = "/tmp/tp-tfevents-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    s_train(dir, 1);
    cr_assert_eq(s_count_events(dir), 1);
    char out[8192];
    int rc = te_check(py, dir, "--stats --hparams", out, sizeof out);
    if (rc == 77)
        cr_skip_test("%s", out);
    cr_assert_eq(rc, 0, "check_tfevents.py:\n%s", out);
    /* the schedule's per-step values are there: more scalar events than
     * stats.json has numbers */
    cr_assert(strstr(out, "OK:"), "%s", out);
    unsigned nev = 0;
    cr_assert(sscanf(strstr(out, "records, ") + 9, "%u", &nev) == 1, "%s", out);
    cr_assert_geq(nev, 24u, "per-step learning_rate events: %s", out);
    s_rm(dir);
}

Test(tfevents, off_writes_no_event_file, .timeout = 240) {
    char dir[] = "/tmp/tp-tfevents-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    s_train(dir, 0);
    cr_assert_eq(s_count_events(dir), 0);
    s_rm(dir);
}

/* ---- errors: a bare trainer whose every step puts a scalar ----------------- */

static tp_status_t s_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    tp_trainer_put_scalar(tr, "a_rather_long_scalar_name_for_the_test/loss",
                          1.0 / (double)(tp_trainer_global_step(tr) + 1));
    return TP_OK;
}

static const tp_trainer_ops_t s_bare_ops = {.name = "bare", .run_step = s_step};

static tp_status_t s_train_bare(const char *logdir, int64_t epochs) {
    tp_trainer_t *tr = tp_trainer_new(&s_bare_ops, NULL);
    cr_assert_not_null(tr);
    cr_assert_eq(tp_trainer_set_logdir(tr, logdir), TP_OK);
    tp_callback_t *cb = tp_cb_tfevent_writer(NULL);
    cr_assert_eq(tp_trainer_add_callback(tr, &cb), TP_OK);
    tp_schedule_t s = {.starting_epoch = 1, .max_epoch = epochs, .steps_per_epoch = 10};
    tp_status_t rc = tp_trainer_train(tr, &s);
    tp_trainer_destroy(&tr);
    return rc;
}

Test(tfevents, a_file_that_cannot_be_opened_is_an_error_naming_it) {
    tp_status_t rc = s_train_bare("/nonexistent-tp-logdir/run", 2);
    cr_assert_eq(rc, TP_ERR_IO, "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "TFEventWriter") &&
              strstr(tp_last_error(), "/nonexistent-tp-logdir/run/events.out.tfevents.") &&
              strstr(tp_last_error(), "No such file"), "%s", tp_last_error());
}

/* A full disk, as the file size limit makes it: the write fails, training
 * stops at the epoch's end with the file's name, and what was written
 * before is whole records. */
Test(tfevents, a_failed_write_stops_training_with_the_file_name) {
    char dir[] = "/tmp/tp-tfevents-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    struct rlimit old, rl;
    getrlimit(RLIMIT_FSIZE, &old);
    rl = old;
    rl.rlim_cur = 1000;  /* the header records fit, an epoch's scalars do not */
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    tp_status_t rc = s_train_bare(dir, 20);
    setrlimit(RLIMIT_FSIZE, &old);
    cr_assert_eq(rc, TP_ERR_IO, "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "trigger_epoch") &&
              strstr(tp_last_error(), "events.out.tfevents.") &&
              strstr(tp_last_error(), "write: File too large"), "%s", tp_last_error());
    char why[256], out[8192];
    const char *py = te_python(why, sizeof why);
    if (py)
        cr_assert_eq(te_check(py, dir, "--partial-tail-ok", out, sizeof out), 0, "%s", out);
    s_rm(dir);
}
