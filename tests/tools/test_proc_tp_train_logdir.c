/* towerpack tests: tp-train and its log directory, as a user meets them
 * (issue 48): two runs started on one directory (the second refused at
 * once, naming the directory and the first one's pid, whatever its
 * --logdir-action; the first ends with its own results), a lock that a
 * kill -9 does not leave behind (also with forked dataflow workers),
 * --resume into an empty and into a missing directory, the fatal error in
 * log.log, and the retry after a failed run. Own executable: it forks and
 * execs. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proc_testutil.h"
#include <towerpack/clock.h>
#include <towerpack/logdir.h>
#include "dir_testutil.h"

#define TEST_SPEC "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 2"
#define TP_TRAIN TP_BINARY_DIR "/bin/tp-train"

static char s_dir[64];

static void s_setup(void) {
    dt_make(s_dir, sizeof s_dir, "tp-train-logdir");
}

static void s_teardown(void) {
    dt_remove(s_dir);
}

TestSuite(tp_train_logdir, .init = s_setup, .fini = s_teardown, .timeout = 240);

static const char *const s_env[] = {"TP_LOG_LEVEL=info", NULL};

/* Run tp-train with argv (argv[0] ignored, NULL-terminated), its output
 * into out[size]; the exit status. */
static int s_run(char *const *argv, char *out, size_t size) {
    char *full[64] = {TP_TRAIN};
    for (int i = 1; i < 63 && (full[i] = argv[i]); i++) {}
    return pu_run(full, s_env, out, size);
}

/* Start tp-train in the background, its output appended to `log`. */
static pid_t s_start(char *const *argv, const char *log) {
    char *full[64] = {TP_TRAIN};
    for (int i = 1; i < 63 && (full[i] = argv[i]); i++) {}
    pu_spawn_opts_t o = {.out = log, .env = s_env};
    pid_t pid = pu_spawn(full, &o);
    cr_assert_gt(pid, 0);
    return pid;
}

/* Wait (at most ms) until pid holds dir's lock. */
static void s_wait_holder(const char *dir, pid_t pid, int ms) {
    for (int i = 0; i <= ms / 10; i++) {
        if (tp_logdir_lock_holder(dir) == pid)
            return;
        cr_assert_not(pu_gone(pid), "tp-train %d ended before it locked %s", (int)pid, dir);
        usleep(10000);
    }
    cr_assert_fail("tp-train %d did not lock %s in %d ms (holder %d)", (int)pid, dir, ms,
                   tp_logdir_lock_holder(dir));
}

static char *s_slurp(const char *path) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static char s_out[1 << 20];

Test(tp_train_logdir, a_second_run_is_refused_at_once_and_the_first_keeps_its_results) {
    char logdir[128], log[160], path[256], pidtext[32];
    snprintf(logdir, sizeof logdir, "%s/run", s_dir);
    snprintf(log, sizeof log, "%s/a.txt", s_dir);
    char *a[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "150",
                 "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir, NULL};
    pid_t pa = s_start(a, log);
    s_wait_holder(logdir, pa, 60000);
    snprintf(pidtext, sizeof pidtext, "pid %d", (int)pa);
    /* the run B (--resume), and one that would delete the directory */
    char *b1[] = {"tp-train", "--model", "mlp", "--epochs", "2", "--threads", "1",
                  "--test-spec", TEST_SPEC, "--logdir", logdir, "--resume", NULL};
    char *b2[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--threads", "1",
                  "--test-spec", TEST_SPEC, "--logdir", logdir, "--logdir-action", "delete",
                  NULL};
    char *b3[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--threads", "1",
                  "--test-spec", TEST_SPEC, "--logdir", logdir, "--logdir-action", "backup",
                  NULL};
    char *const *bs[] = {b1, b2, b3};
    /* A is stopped while the others try, so it still holds the directory
     * however fast the machine runs its 150 steps (on a Zen 5 it once
     * finished before the third) */
    cr_assert_eq(kill(pa, SIGSTOP), 0);
    static char outs[3][1 << 18];
    int rcs[3];
    double took[3];
    for (int i = 0; i < 3; i++) {
        double t0 = tp_now_s();
        rcs[i] = s_run(bs[i], outs[i], sizeof outs[i]);
        took[i] = tp_now_s() - t0;
    }
    cr_assert_eq(kill(pa, SIGCONT), 0); /* before any assertion can end the test */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rcs[i], 1, "run %d: exit %d:\n%s", i, rcs[i], outs[i]);
        cr_assert(strstr(outs[i], logdir) && strstr(outs[i], pidtext) &&
                  strstr(outs[i], "in use by another run"), "run %d:\n%s", i, outs[i]);
        cr_assert_lt(took[i], 5.0, "refused at once, not after loading data (%.1f s)", took[i]);
    }
    int st = pu_waitpid(pa, 120000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "run A: status %d:\n%s", st,
              s_slurp(log));
    /* A's results, A's alone */
    snprintf(path, sizeof path, "%s/model-150.safetensors", logdir);
    cr_assert_eq(access(path, R_OK), 0, "%s", s_slurp(log));
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s", err.text);
    cr_assert_eq(json_array_size(j), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(j, 0), "global_step")), 150);
    json_decref(j);
    snprintf(path, sizeof path, "%s/log.log", logdir);
    const char *text = s_slurp(path);
    cr_assert_null(strstr(text, "in use by another run"), "the refused runs wrote into "
                   "A's log:\n%s", text);
    cr_assert_eq(tp_logdir_lock_holder(logdir), 0, "released when A ended");
}

/* How many processes descend from pid (its zygote and the workers the
 * zygote forks), from /proc; -1 when /proc does not say. */
static int s_descendants(pid_t pid) {
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int kids[64], n = 0, c;
    while (n < 64 && fscanf(f, "%d", &c) == 1)
        kids[n++] = c;
    fclose(f);
    int total = n;
    for (int i = 0; i < n; i++) {
        int more = s_descendants(kids[i]);
        total += more > 0 ? more : 0;
    }
    return total;
}

Test(tp_train_logdir, kill_9_leaves_no_lock_even_with_forked_workers) {
    char logdir[128], log[160];
    snprintf(logdir, sizeof logdir, "%s/run", s_dir);
    snprintf(log, sizeof log, "%s/a.txt", s_dir);
    char *a[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch",
                 "1000000", "--workers", "2", "--threads", "1", "--test-spec", TEST_SPEC,
                 "--logdir", logdir, NULL};
    pid_t pa = s_start(a, log);
    s_wait_holder(logdir, pa, 60000);
    /* until its dataflow workers are forked (a zygote and its two
     * workers): they must not hold the lock */
    int kids = 0;
    for (int i = 0; i < 6000 && (kids = s_descendants(pa)) < 3; i++)
        usleep(10000);
    if (kids < 0)
        cr_skip_test("/proc/PID/task/TID/children is not available here");
    cr_assert_geq(kids, 3, "no workers forked:\n%s", s_slurp(log));
    cr_assert_eq(kill(pa, SIGKILL), 0);
    int st;
    cr_assert_eq(waitpid(pa, &st, 0), pa);
    /* at once: the workers still dying must not hold it */
    cr_assert_eq(tp_logdir_lock_holder(logdir), 0, "the lock outlived its owner");
    /* and the next run takes the directory: --resume, no checkpoint there */
    char *b[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "5",
                 "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir, "--resume",
                 NULL};
    int rc = s_run(b, s_out, sizeof s_out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
    char expect[256];
    snprintf(expect, sizeof expect, "no checkpoint in %s: starting from scratch", logdir);
    cr_assert(strstr(s_out, expect), "%s", s_out);
}

Test(tp_train_logdir, resume_into_an_empty_or_a_missing_directory) {
    char logdir[128], expect[256];
    snprintf(logdir, sizeof logdir, "%s/run", s_dir);
    /* missing: a mistyped path is refused, and not made */
    char *a[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "5",
                 "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir, "--resume",
                 NULL};
    int rc = s_run(a, s_out, sizeof s_out);
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, s_out);
    cr_assert(strstr(s_out, logdir) && strstr(s_out, "does not exist") &&
              strstr(s_out, "--create-logdir"), "%s", s_out);
    cr_assert_neq(access(logdir, F_OK), 0, "the directory was made");
    /* asked to create it: a new run, saying there was nothing to resume */
    char *b[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "5",
                 "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir, "--resume",
                 "--create-logdir", NULL};
    rc = s_run(b, s_out, sizeof s_out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
    snprintf(expect, sizeof expect, "no checkpoint in %s: starting from scratch", logdir);
    cr_assert(strstr(s_out, expect), "%s", s_out);
    /* empty: the same words */
    char empty[128];
    snprintf(empty, sizeof empty, "%s/empty", s_dir);
    cr_assert_eq(mkdir(empty, 0755), 0);
    char *c[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "5",
                 "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", empty, "--resume",
                 NULL};
    rc = s_run(c, s_out, sizeof s_out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
    snprintf(expect, sizeof expect, "no checkpoint in %s: starting from scratch", empty);
    cr_assert(strstr(s_out, expect), "%s", s_out);
}

Test(tp_train_logdir, the_fatal_error_is_in_log_log_and_the_retry_needs_no_action) {
    char logdir[128], path[256], images[128], data[160];
    snprintf(logdir, sizeof logdir, "%s/run", s_dir);
    /* fails after the log directory is made: its data are no IDX file (a
     * file that does not exist is refused with the flags, before it) */
    snprintf(images, sizeof images, "%s/not-idx-images", s_dir);
    FILE *f = fopen(images, "w");
    cr_assert_not_null(f);
    fputs("not an IDX file\n", f);
    fclose(f);
    snprintf(data, sizeof data, "idx:%s", images);
    char *a[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "5",
                 "--threads", "1", "--data", data,
                 "--test-spec", TEST_SPEC, "--logdir", logdir, NULL};
    int rc = s_run(a, s_out, sizeof s_out);
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, s_out);
    cr_assert(strstr(s_out, "tp-train: training data: "), "%s", s_out);
    snprintf(path, sizeof path, "%s/log.log", logdir);
    const char *text = s_slurp(path);
    cr_assert(strstr(text, "fatal: training data: ") && strstr(text, "not-idx-images"),
              "log.log does not say why the run stopped:\n%s", text);
    /* the retry, same directory, no --logdir-action: only a log was there */
    char *b[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "5",
                 "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir, NULL};
    rc = s_run(b, s_out, sizeof s_out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
    text = s_slurp(path);
    cr_assert(strstr(text, "fatal: training data: "), "the failure's log is kept");
    cr_assert(strstr(text, "saved"), "the retry's log follows it:\n%s", text);
    /* a directory that holds a run: the refusal names the flag */
    rc = s_run(b, s_out, sizeof s_out);
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, s_out);
    cr_assert(strstr(s_out, "--logdir-action keep, delete, backup or new"), "%s", s_out);
    text = s_slurp(path);
    cr_assert_null(strstr(text, "is not empty"), "a refused run writes nothing there");
}

/* Must hold: a run into a new directory, or one emptied by
 * --logdir-action delete, does not warn that an old run is kept beside it
 * (tp-train's own data.json, written before the launch, is this run's). */
Test(tp_train_logdir, a_new_run_does_not_warn_of_an_old_one) {
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/run", s_dir);
    for (int k = 0; k < 2; k++) {  /* missing, then holding the first run */
        char *a[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "3",
                     "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir,
                     "--logdir-action", "delete", NULL};
        int rc = s_run(a, s_out, sizeof s_out);
        cr_assert_eq(rc, 0, "run %d: exit %d:\n%s", k, rc, s_out);
        cr_assert_not(strstr(s_out, "is kept and this run does not resume it"),
                      "run %d: a warning of an old run:\n%s", k, s_out);
    }
    /* kept on purpose: the warning stays */
    char *b[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "3",
                 "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir,
                 "--logdir-action", "keep", NULL};
    int rc = s_run(b, s_out, sizeof s_out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
    cr_assert(strstr(s_out, "is kept and this run does not resume it"), "%s", s_out);
}
