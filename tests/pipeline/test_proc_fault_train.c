/* towerpack fault injection: the trainer program (tp-train) killed,
 * interrupted at random points, killed while it writes checkpoints, and
 * stopped by the file-size limit. Each case states what must hold. Own
 * executable: it forks and execs tp-train (tiny runs: mlp, a few steps). */
#include <dirent.h>
#include <jansson.h>
#include <sys/stat.h>
#include <time.h>
#include "fault_util.h"

#define TP_TRAIN TP_BINARY_DIR "/bin/tp-train"
#define TEST_SPEC "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 1"

static char s_dir[64], s_logdir[128], s_tmp[128], s_out[160];

static void setup(void) {
    snprintf(s_dir, sizeof s_dir, "/tmp/tp-fault-XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
    snprintf(s_logdir, sizeof s_logdir, "%s/run", s_dir);
    snprintf(s_tmp, sizeof s_tmp, "%s/tmp", s_dir);
    snprintf(s_out, sizeof s_out, "%s/out.txt", s_dir);
    cr_assert_eq(mkdir(s_tmp, 0700), 0);
}

static void teardown(void) { fu_rmrf(s_dir); }

TestSuite(fault_train, .init = setup, .fini = teardown, .timeout = 120);

/* Start tp-train (mlp, one BLAS thread, one tower) for `epochs` epochs of
 * `steps` steps; workers > 0 adds forked dataflow workers; resume adds
 * --resume. */
static int s_start(int epochs, int steps, int workers, int resume, long fsize) {
    char e[16], s[16], w[16];
    snprintf(e, sizeof e, "%d", epochs);
    snprintf(s, sizeof s, "%d", steps);
    snprintf(w, sizeof w, "%d", workers);
    char *argv[32] = {TP_TRAIN, "--model", "mlp", "--epochs", e, "--steps-per-epoch", s,
                      "--threads", "1", "--towers", "1", "--batch", "32",
                      "--test-spec", TEST_SPEC, "--logdir", s_logdir, "--no-augment"};
    int n = 18;
    if (workers > 0) {
        argv[n++] = "--workers";
        argv[n++] = w;
    }
    if (resume)
        argv[n++] = "--resume";
    argv[n] = NULL;
    return fu_spawn(argv, s_out, s_tmp, fsize);
}

static const char *s_output(void) {
    static char buf[1 << 18];
    return fu_slurp(s_out, buf, sizeof buf);
}

/* Files in the log directory whose name contains `part`. */
static int s_count_named(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, part))
            n++;
    if (d)
        closedir(d);
    return n;
}

static void s_path(char *out, size_t size, long long step) {
    snprintf(out, size, "%s/model-%lld.safetensors", s_logdir, step);
}

/* The latest checkpoint must load; its step in *step. */
static void s_assert_latest_loads(int64_t *step) {
    char ckpt[256];
    cr_assert_eq(tp_checkpoint_find_latest(s_logdir, ckpt, sizeof ckpt), TP_OK, "%s",
                 tp_last_error());
    cr_assert_eq(fu_load("mlp", ckpt, step), TP_OK, "%s: %s", ckpt, tp_last_error());
}

/* Must hold: killing the trainer with SIGKILL mid-run takes its forked
 * dataflow workers with it (no orphan within 2 s), the latest checkpoint
 * loads, and --resume continues from it to the end. */
Test(fault_train, sigkill_of_the_trainer_then_resume) {
    int pid = s_start(1000, 10, 2, 0, 0);
    char p[256];
    s_path(p, sizeof p, 20);
    cr_assert(fu_wait_file(p, 60000), "no checkpoint; output:\n%s", s_output());
    int kids[16];
    int nk = fu_children(pid, kids, 16);
    cr_assert_geq(nk, 2, "the dataflow workers are children of tp-train");
    kill(pid, SIGKILL);
    int st = fu_wait(pid, 5000);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    for (int i = 0; i < nk; i++)
        cr_assert(pu_wait_gone(kids[i], 2000), "worker %d outlived the trainer", kids[i]);
    int64_t step = 0;
    s_assert_latest_loads(&step);
    cr_assert(step >= 10 && step % 10 == 0, "step %lld", (long long)step);
    /* Resume two epochs past the latest checkpoint. */
    int epochs = (int)(step / 10) + 2;
    pid = s_start(epochs, 10, 2, 1, 0);
    st = fu_wait(pid, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "resume failed (%d):\n%s", st, s_output());
    cr_assert(strstr(s_output(), "resum") || strstr(s_output(), "Resum") ||
              strstr(s_output(), "loaded"), "the resume is logged:\n%s", s_output());
    int64_t end = 0;
    s_assert_latest_loads(&end);
    cr_assert_eq(end, (int64_t)epochs * 10, "resumed to step %lld", (long long)end);
}

/* Must hold, for SIGINT and SIGTERM sent at random points of a run
 * (during setup, steps, validation or a checkpoint write): tp-train ends
 * within 5 s with 130 (SIGINT) or 143 (SIGTERM), the stop is logged when
 * training had started, every checkpoint present loads, its workers are
 * gone, and neither its private ipc directory nor the stats socket nor a
 * temporary checkpoint file is left. The seed of the random points is
 * logged. */
Test(fault_train, sigint_and_sigterm_at_random_points) {
    unsigned seed = (unsigned)time(NULL);
    cr_log_info("random points: seed %u", seed);
    srand(seed);
    for (int round = 0; round < 6; round++) {
        int sig = round % 2 ? SIGTERM : SIGINT;
        fu_rmrf(s_logdir);
        if (truncate(s_out, 0) != 0) { /* first round: no file yet */ }
        int pid = s_start(1000, 5, 2, 0, 0);
        /* rounds 0-1 anywhere in the first 1.2 s of main (setup included), later
         * ones after the first checkpoint plus up to 0.6 s */
        if (round >= 2) {
            char p[256];
            s_path(p, sizeof p, 5);
            cr_assert(fu_wait_file(p, 60000), "no checkpoint:\n%s", s_output());
            usleep((useconds_t)(rand() % 600000));
        } else {
            /* From the first line tp-train prints (its handlers are in
             * place; a signal in the first milliseconds of exec takes the
             * default action, as for any program). */
            for (int i = 0; i < 1000 && !strstr(s_output(), "devices:"); i++)
                usleep(10000);
            usleep((useconds_t)(rand() % 1200000));
        }
        int kids[16];
        int nk = fu_children(pid, kids, 16);
        kill(pid, sig);
        int st = fu_wait(pid, 5000);
        cr_assert_neq(st, -1, "round %d: tp-train did not stop within 5 s of signal %d:\n%s",
                      round, sig, s_output());
        cr_assert(WIFEXITED(st), "round %d: died of signal %d:\n%s", round,
                  WIFSIGNALED(st) ? WTERMSIG(st) : 0, s_output());
        int code = WEXITSTATUS(st);
        /* A run that finished setup trained at least a step: the trainer
         * saw the signal. 0 is allowed only if it ended before (not here:
         * 1000 epochs). */
        cr_assert_eq(code, 128 + sig, "round %d: exit %d:\n%s", round, code, s_output());
        for (int i = 0; i < nk; i++)
            cr_assert(pu_wait_gone(kids[i], 2000), "round %d: child %d left", round, kids[i]);
        char ckpt[256];
        if (tp_checkpoint_find_latest(s_logdir, ckpt, sizeof ckpt) == TP_OK) {
            int64_t step;
            cr_assert_eq(fu_load("mlp", ckpt, &step), TP_OK, "round %d: %s: %s", round,
                         ckpt, tp_last_error());
        } else {
            cr_assert_lt(round, 2, "round %d: no checkpoint after the first one", round);
        }
        if (round >= 2) {
            char log[256], buf[1 << 16];
            snprintf(log, sizeof log, "%s/log.log", s_logdir);
            cr_assert(strstr(fu_slurp(log, buf, sizeof buf), "training stopped"),
                      "round %d: the stop is logged:\n%s", round, buf);
        }
        cr_assert_eq(pu_dir_entries(s_tmp), 0, "round %d: the private ipc dir is left", round);
        cr_assert_eq(s_count_named(s_logdir, ".sock"), 0, "round %d: stats socket left", round);
        cr_assert_eq(s_count_named(s_logdir, ".tmp"), 0, "round %d: temporary file left", round);
    }
}

/* Must hold: SIGKILL while checkpoints are being written (one step per
 * epoch: the run is mostly saving) never makes a partial file the latest:
 * after each kill the latest checkpoint loads, and a resume runs to the
 * end. Stale temporary files of the killed run are removed by the resume. */
Test(fault_train, sigkill_while_writing_checkpoints) {
    unsigned seed = (unsigned)time(NULL);
    cr_log_info("kill points: seed %u", seed);
    srand(seed);
    int64_t last = 0;
    for (int round = 0; round < 4; round++) {
        if (truncate(s_out, 0) != 0) { /* first round: no file yet */ }
        int pid = s_start(100000, 1, 0, round > 0, 0);
        char p[256];
        s_path(p, sizeof p, last + 3);
        cr_assert(fu_wait_file(p, 60000), "round %d: no checkpoint:\n%s", round, s_output());
        usleep((useconds_t)(rand() % 300000));
        kill(pid, SIGKILL);
        cr_assert_neq(fu_wait(pid, 5000), -1);
        int64_t step = 0;
        s_assert_latest_loads(&step);
        cr_assert_geq(step, last, "round %d: the latest went back", round);
        last = step;
    }
    /* The resume ends the run; the temporary files a kill left are gone. */
    int pid = s_start((int)last + 2, 1, 0, 1, 0);
    int st = fu_wait(pid, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "resume (%d):\n%s", st, s_output());
    int64_t end = 0;
    s_assert_latest_loads(&end);
    cr_assert_eq(end, last + 2);
    cr_assert_eq(s_count_named(s_logdir, ".tmp."), 0, "temporary files left");
}

/* Must hold: when the file-size limit stops a checkpoint write (EFBIG),
 * tp-train fails with an error naming the file and the cause, exit 1, no
 * temporary file stays, and the previous checkpoint stays the latest and
 * loads. */
Test(fault_train, file_size_limit_while_writing_a_checkpoint) {
    int pid = s_start(1, 10, 0, 0, 0);
    int st = fu_wait(pid, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", s_output());
    char stats[256], before[1 << 14], after[1 << 14];
    snprintf(stats, sizeof stats, "%s/stats.json", s_logdir);
    fu_slurp(stats, before, sizeof before);
    cr_assert(strlen(before) > 10);
    /* A checkpoint is 4 MiB: 1 MiB stops it; logs and stats fit. */
    pid = s_start(2, 10, 0, 1, 1 << 20);
    st = fu_wait(pid, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit %d:\n%s", st, s_output());
    cr_assert(strstr(s_output(), "model-20.safetensors") &&
              strstr(s_output(), "File too large"), "the error names file and cause:\n%s",
              s_output());
    cr_assert_eq(s_count_named(s_logdir, ".tmp"), 0, "temporary file left");
    char ckpt[256];
    cr_assert_eq(tp_checkpoint_find_latest(s_logdir, ckpt, sizeof ckpt), TP_OK);
    cr_assert(strstr(ckpt, "model-10.safetensors"), "latest %s", ckpt);
    int64_t step;
    cr_assert_eq(fu_load("mlp", ckpt, &step), TP_OK, "%s", tp_last_error());
    cr_assert_eq(step, 10);
    /* stats.json is still whole JSON (it is only ever replaced whole). */
    fu_slurp(stats, after, sizeof after);
    json_error_t err;
    json_t *j = json_loads(after, 0, &err);
    cr_assert_not_null(j, "stats.json: %s", err.text);
    json_decref(j);
}
