/* towerpack tests: the log directory (pipeline/train/logdir.c) and how the
 * launch applies it: the lock a run holds (refused by every action while
 * another holds it, one lock per process, counted), what counts as a
 * directory that holds a run, the launch's log-directory policy (refusing
 * by default, each action), a kept directory that does not lose the new
 * run's checkpoints (issue 46), and a resume with no checkpoint that says
 * so and keeps the stats.json history (issue 48). In-process: the "other
 * run" is an open-file-description lock this test takes itself. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/launch.h>
#include <towerpack/log.h>
#include <towerpack/logdir.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/towerpack.h>
#include "train_testutil.h"

static char s_base[64];

static void s_setup(void) {
    snprintf(s_base, sizeof s_base, "/tmp/tp-logdir-XXXXXX");
    cr_assert_not_null(mkdtemp(s_base));
    /* never a question: the tests run where stdin may be a terminal */
    cr_assert_not_null(freopen("/dev/null", "r", stdin));
}

static void s_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_base);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", s_base);
}

TestSuite(logdir, .init = s_setup, .fini = s_teardown, .timeout = 120);

static void s_touch(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs("x\n", f);
    fclose(f);
}

static int s_exists(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* What another run does: an OFD lock on DIR/.lock (another open file than
 * this process's own), with `pid` written in it. The descriptor; close it
 * to end that "run". */
static int s_foreign_lock(const char *dir, int pid) {
    char path[512];
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    cr_assert_eq(fcntl(fd, F_OFD_SETLK, &fl), 0);
    char text[32];
    int len = snprintf(text, sizeof text, "%d\n", pid);
    cr_assert_eq(ftruncate(fd, 0), 0);
    cr_assert_eq(pwrite(fd, text, (size_t)len, 0), len);
    return fd;
}

/* 1 when another open file could lock DIR/.lock now. */
static int s_lockable(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    int ok = fcntl(fd, F_OFD_SETLK, &fl) == 0;
    close(fd);
    return ok;
}

Test(logdir, a_locked_directory_is_refused_by_every_action) {
    char dir[128], out[256], pidtext[32];
    snprintf(dir, sizeof dir, "%s/run", s_base);
    cr_assert_eq(tp_mkdirs(dir), TP_OK);
    s_touch(dir, "model-100.safetensors");
    int fd = s_foreign_lock(dir, 4242);
    cr_assert_eq(tp_logdir_lock_holder(dir), 4242);
    snprintf(pidtext, sizeof pidtext, "pid %d", 4242);
    tp_logdir_action_t actions[] = {TP_LOGDIR_ASK, TP_LOGDIR_KEEP, TP_LOGDIR_DELETE,
                                    TP_LOGDIR_BACKUP};
    for (size_t i = 0; i < sizeof actions / sizeof *actions; i++) {
        tp_logdir_lock_t *l = NULL;
        cr_assert_eq(tp_logdir_prepare(dir, actions[i], out, sizeof out, &l), TP_ERR_STATE,
                     "action %d", (int)actions[i]);
        cr_assert_null(l);
        cr_assert(strstr(tp_last_error(), dir) && strstr(tp_last_error(), pidtext),
                  "names the directory and the holder: %s", tp_last_error());
        cr_assert(s_exists(dir, "model-100.safetensors"), "nothing deleted or moved");
    }
    cr_assert_null(tp_logdir_lock_new(dir));
    /* new leaves it alone: the next free name, locked by us */
    tp_logdir_lock_t *l = NULL;
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_NEW, out, sizeof out, &l), TP_OK, "%s",
                 tp_last_error());
    char next[160];
    snprintf(next, sizeof next, "%s-1", dir);
    cr_assert_str_eq(out, next);
    cr_assert_eq(tp_logdir_lock_holder(next), getpid());
    tp_logdir_lock_destroy(&l);
    cr_assert_null(l);
    cr_assert_eq(tp_logdir_lock_holder(next), 0);
    /* the other run ends (its lock with it): now the directory is ours */
    close(fd);
    cr_assert_eq(tp_logdir_lock_holder(dir), 0);
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_KEEP, out, sizeof out, &l), TP_OK);
    cr_assert_eq(tp_logdir_lock_holder(dir), getpid());
    tp_logdir_lock_destroy(&l);
}

Test(logdir, one_lock_per_process_released_by_its_last_reference) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/run", s_base);
    cr_assert_eq(tp_mkdirs(dir), TP_OK);
    tp_logdir_lock_t *a = tp_logdir_lock_new(dir), *b = tp_logdir_lock_new(dir);
    cr_assert_not_null(a);
    cr_assert_not_null(b, "this process locking its own directory again: %s",
                       tp_last_error());
    cr_assert_eq(tp_logdir_lock_holder(dir), getpid(), "asking does not release it");
    cr_assert_not(s_lockable(dir));
    tp_logdir_lock_destroy(&a);
    cr_assert_not(s_lockable(dir), "still held by the other reference");
    tp_logdir_lock_destroy(&b);
    cr_assert(s_lockable(dir));
    cr_assert_eq(tp_logdir_lock_holder(dir), 0);
    tp_logdir_lock_destroy(&b);  /* NULL: nothing */
}

Test(logdir, only_a_failed_runs_log_is_no_run) {
    char dir[128], out[256];
    snprintf(dir, sizeof dir, "%s/run", s_base);
    cr_assert(tp_logdir_is_fresh(dir), "missing");
    cr_assert_eq(tp_mkdirs(dir), TP_OK);
    s_touch(dir, "log.log");  /* a run that failed before it wrote anything else */
    cr_assert(tp_logdir_is_fresh(dir));
    tp_logdir_lock_t *l = NULL;
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_ASK, out, sizeof out, &l), TP_OK, "%s",
                 tp_last_error());
    cr_assert(s_exists(dir, "log.log"), "the retry's log follows it");
    tp_logdir_lock_destroy(&l);
    s_touch(dir, "stats.json");
    cr_assert_not(tp_logdir_is_fresh(dir));
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_ASK, out, sizeof out, &l), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "not empty (stats.json)"), "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "keep (resume), delete, backup or new"));
    cr_assert_null(l);
    cr_assert_eq(tp_logdir_lock_holder(dir), 0, "a refusal holds nothing");
}

Test(logdir, delete_empties_the_directory_under_its_lock) {
    char dir[128], out[256];
    snprintf(dir, sizeof dir, "%s/run", s_base);
    cr_assert_eq(tp_mkdirs(dir), TP_OK);
    s_touch(dir, "stats.json");
    char sub[200];
    snprintf(sub, sizeof sub, "%s/plots", dir);
    cr_assert_eq(tp_mkdirs(sub), TP_OK);
    s_touch(sub, "a.png");
    tp_logdir_lock_t *l = NULL;
    cr_assert_eq(tp_logdir_prepare(dir, TP_LOGDIR_DELETE, out, sizeof out, &l), TP_OK, "%s",
                 tp_last_error());
    cr_assert_not(s_exists(dir, "stats.json"));
    cr_assert_not(s_exists(dir, "plots"));
    cr_assert(tp_logdir_is_fresh(dir));
    cr_assert_eq(tp_logdir_lock_holder(dir), getpid(), "held all along");
    tp_logdir_lock_destroy(&l);
}

/* ---- the launch -------------------------------------------------------------------- */

/* 8 steps an epoch (256 points, batch 32); no plots (fast). */
static void s_config(tp_train_config_t *c, const char *logdir, int64_t epochs) {
    tp_train_config_init(c);
    c->model = tu_linear_model();
    c->batch = 32;
    c->dataflow = tu_blobs(256, 4, 0.7f, 99, 32, 1, 0);
    c->max_epoch = epochs;
    c->logdir = logdir;
    c->threads = 1;
    c->curves = 0;
    c->tensorboard = 0;
    c->stats = "off";
}

static size_t s_records(const char *path) {
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s: %s", path, err.text);
    size_t n = json_array_size(j);
    json_decref(j);
    return n;
}

/* The name in dir that starts with `prefix` (into out), 1 if there is one. */
static int s_find(const char *dir, const char *prefix, char *out, size_t size) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            snprintf(out, size, "%s", e->d_name);
            found = 1;
        }
    closedir(d);
    return found;
}

Test(logdir, the_launch_refuses_a_directory_that_holds_a_run_and_applies_each_action) {
    char dir[128], stats[200], name[256], path[400];
    snprintf(dir, sizeof dir, "%s/run", s_base);
    snprintf(stats, sizeof stats, "%s/stats.json", dir);
    tp_train_config_t c;
    s_config(&c, dir, 1);
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(c.logdir, dir, "the caller's logdir is given back");
    cr_assert(s_exists(dir, "model-8.safetensors"));
    cr_assert_eq(tp_logdir_lock_holder(dir), 0, "released when the launch returns");
    /* Again, no action, stdin not a terminal: refused before anything is
     * written (tp-train's default, in the C API too). */
    s_config(&c, dir, 2);
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "not empty"), "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), dir), "%s", tp_last_error());
    cr_assert_eq(s_records(stats), 1);
    cr_assert_not(s_exists(dir, "model-16.safetensors"));
    /* keep: trains beside the old files */
    s_config(&c, dir, 2);
    c.logdir_action = TP_LOGDIR_KEEP;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert(s_exists(dir, "model-16.safetensors"));
    /* backup: the old directory moved aside whole */
    s_config(&c, dir, 1);
    c.logdir_action = TP_LOGDIR_BACKUP;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert(s_find(s_base, "run.", name, sizeof name), "a backup DIR.<stamp>");
    snprintf(path, sizeof path, "%s/%s", s_base, name);
    cr_assert(s_exists(path, "model-16.safetensors"));
    cr_assert_not(s_exists(dir, "model-16.safetensors"));
    cr_assert(s_exists(dir, "model-8.safetensors"));
    /* delete: only the new run's files */
    s_touch(dir, "old-notes.txt");
    s_config(&c, dir, 1);
    c.logdir_action = TP_LOGDIR_DELETE;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert_not(s_exists(dir, "old-notes.txt"));
    cr_assert(s_exists(dir, "model-8.safetensors"));
    /* new: DIR-1 */
    s_config(&c, dir, 1);
    c.logdir_action = TP_LOGDIR_NEW;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    snprintf(path, sizeof path, "%s-1", dir);
    cr_assert(s_exists(path, "model-8.safetensors"));
    cr_assert_str_eq(c.logdir, dir);
}

Test(logdir, the_launch_refuses_a_directory_another_run_holds) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/run", s_base);
    cr_assert_eq(tp_mkdirs(dir), TP_OK);
    s_touch(dir, "model-8.safetensors");
    int fd = s_foreign_lock(dir, 4343);
    tp_logdir_action_t actions[] = {TP_LOGDIR_KEEP, TP_LOGDIR_DELETE, TP_LOGDIR_BACKUP};
    for (size_t i = 0; i < 3; i++) {
        tp_train_config_t c;
        s_config(&c, dir, 1);
        c.logdir_action = actions[i];
        c.auto_resume = i == 0;
        cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_ERR_STATE);
        cr_assert(strstr(tp_last_error(), "pid 4343") && strstr(tp_last_error(), dir),
                  "%s", tp_last_error());
        cr_assert(s_exists(dir, "model-8.safetensors"));
    }
    close(fd);
}

/* Issue 46: a run that keeps a directory without resuming it adopted the
 * old run's checkpoint list; re-saving one of those steps put it at the
 * end a second time and pruned the first entry: the new file. */
Test(logdir, a_kept_directory_keeps_the_new_runs_checkpoints) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/run", s_base);
    tp_train_config_t c;
    tp_callback_t *cbs[1];
    s_config(&c, dir, 3);  /* model-8, -16, -24 */
    c.save_checkpoints = 0;
    cbs[0] = tp_cb_model_saver(3, 0);
    c.callbacks = cbs;
    c.ncallbacks = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert(s_exists(dir, "model-8.safetensors"));
    struct stat before;
    char path[256];
    snprintf(path, sizeof path, "%s/model-8.safetensors", dir);
    cr_assert_eq(stat(path, &before), 0);
    s_config(&c, dir, 1);  /* from scratch: its own model-8 */
    c.logdir_action = TP_LOGDIR_KEEP;
    c.save_checkpoints = 0;
    cbs[0] = tp_cb_model_saver(3, 0);
    c.callbacks = cbs;
    c.ncallbacks = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert(s_exists(dir, "model-8.safetensors"), "the new run's checkpoint is there");
    char latest[256];
    cr_assert_eq(tp_checkpoint_find_latest(dir, latest, sizeof latest), TP_OK);
    cr_assert_str_eq(latest, path, "and the index names it");
    cr_assert(s_exists(dir, "model-16.safetensors") && s_exists(dir, "model-24.safetensors"),
              "three kept");
}

/* Issue 48: a resume that finds no checkpoint says so, and the history of
 * the run whose checkpoints were removed is kept, not truncated. */
Test(logdir, a_resume_without_a_checkpoint_says_so_and_keeps_the_history) {
    char dir[128], stats[200], logfile[200], name[256], path[400];
    snprintf(dir, sizeof dir, "%s/run", s_base);
    snprintf(stats, sizeof stats, "%s/stats.json", dir);
    tp_train_config_t c;
    s_config(&c, dir, 2);
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert_eq(s_records(stats), 2);
    snprintf(path, sizeof path, "rm -f %s/model-*.safetensors %s/checkpoint", dir, dir);
    cr_assert_eq(system(path), 0);
    snprintf(logfile, sizeof logfile, "%s/test.log", s_base);
    cr_assert_eq(tp_log_set_file(logfile), TP_OK);
    s_config(&c, dir, 1);
    c.auto_resume = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    tp_log_set_file(NULL);
    char expect[256], text[65536] = "";
    FILE *f = fopen(logfile, "r");
    cr_assert_not_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    snprintf(expect, sizeof expect, "no checkpoint in %s: starting from scratch", dir);
    cr_assert(strstr(text, expect), "%s", text);
    cr_assert_eq(s_records(stats), 1, "this run's epoch");
    cr_assert(s_find(dir, "stats.json.", name, sizeof name), "the history kept beside");
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(s_records(path), 2);
    cr_assert(strstr(text, name), "the warning names it: %s", text);
}
