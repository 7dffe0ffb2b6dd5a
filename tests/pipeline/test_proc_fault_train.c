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

/* 1: the next s_start passes --worker-restarts 0. */
static int s_no_restarts;

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
    if (s_no_restarts) {
        argv[n++] = "--worker-restarts";
        argv[n++] = "0";
    }
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
    int nk = fu_descendants(pid, kids, 16);
    cr_assert_geq(nk, 3, "the zygote and the dataflow workers under it descend from tp-train");
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

/* The forked dataflow workers of tp-train: the grandchildren (under the
 * zygote, tp-train's child) into out; how many. */
static int s_workers(int pid, int *out, int n) {
    int kids[16], k = 0;
    int nk = fu_children(pid, kids, 16);
    for (int i = 0; i < nk && k < n; i++)
        k += fu_children(kids[i], out + k, n - k);
    return k;
}

static int s_in(int pid, const int *pids, int n) {
    for (int i = 0; i < n; i++)
        if (pids[i] == pid)
            return 1;
    return 0;
}

/* Must hold (issue 23): SIGKILL of a forked dataflow worker in the middle
 * of an epoch: the zygote forks a replacement, tp-train exits 0 with every
 * epoch and step (stats.json: one entry per epoch with its epoch_num and
 * global_step), the restart is counted in stats.json
 * (dataflow/worker_restarts: 0 before the kill, >= 1 at the end) and
 * logged, and no process of the run is left. */
Test(fault_train, sigkill_of_a_dataflow_worker_mid_epoch) {
    enum { EPOCHS = 3, STEPS = 300 };
    int pid = s_start(EPOCHS, STEPS, 2, 0, 0);
    int before[8], nb = 0;
    for (int i = 0; i < 6000 && nb < 2; i++) {  /* up to 60 s: exec, data loading */
        nb = s_workers(pid, before, 8);
        if (nb < 2)
            usleep(10000);
    }
    cr_assert_eq(nb, 2, "two workers under tp-train's zygote; output:\n%s", s_output());
    int kids[8];  /* the zygote */
    int nkids = fu_children(pid, kids, 8);
    /* Into epoch 2: epoch 1's checkpoint is there; the kill lands in the
     * steps of epoch 2 (300 steps: about a second). */
    char p[256];
    s_path(p, sizeof p, STEPS);
    cr_assert(fu_wait_file(p, 60000), "no checkpoint; output:\n%s", s_output());
    cr_assert_eq(kill(before[0], SIGKILL), 0);
    /* The replacement: a new worker under the zygote (an event: bounded). */
    int after[8], na = 0, fresh = 0;
    for (int i = 0; i < 1000 && !fresh; i++) {
        na = s_workers(pid, after, 8);
        for (int k = 0; k < na; k++)
            fresh |= !s_in(after[k], before, nb);
        if (!fresh)
            usleep(10000);
    }
    int st = fu_wait(pid, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-train (%d):\n%s", st, s_output());
    cr_assert(fresh, "no replacement worker appeared under the zygote");
    cr_assert(strstr(s_output(), "killed by signal 9") && strstr(s_output(), "restarting it"),
              "the restart is logged:\n%s", s_output());
    char stats[256], buf[1 << 16];
    snprintf(stats, sizeof stats, "%s/stats.json", s_logdir);
    json_error_t err;
    json_t *j = json_loads(fu_slurp(stats, buf, sizeof buf), 0, &err);
    cr_assert_not_null(j, "stats.json: %s", err.text);
    cr_assert_eq(json_array_size(j), EPOCHS, "one entry per epoch:\n%s", buf);
    for (int e = 0; e < EPOCHS; e++) {
        json_t *o = json_array_get(j, (size_t)e);
        cr_assert_eq(json_integer_value(json_object_get(o, "epoch_num")), e + 1);
        cr_assert_eq(json_integer_value(json_object_get(o, "global_step")), (e + 1) * STEPS);
        cr_assert(json_is_number(json_object_get(o, "dataflow/worker_restarts")),
                  "epoch %d: no dataflow/worker_restarts:\n%s", e + 1, buf);
    }
    double first = json_number_value(
        json_object_get(json_array_get(j, 0), "dataflow/worker_restarts"));
    double last = json_number_value(
        json_object_get(json_array_get(j, EPOCHS - 1), "dataflow/worker_restarts"));
    cr_assert_eq(first, 0, "no restart in epoch 1 (the kill came after it)");
    cr_assert_geq(last, 1, "the restart is counted:\n%s", buf);
    json_decref(j);
    /* Nothing of the run is left: workers (old and new) and the zygote. */
    for (int k = 0; k < na; k++)
        cr_assert(pu_wait_gone(after[k], 2000), "worker %d left", after[k]);
    for (int k = 0; k < nb; k++)
        cr_assert(pu_wait_gone(before[k], 2000), "worker %d left", before[k]);
    for (int k = 0; k < nkids; k++)
        cr_assert(pu_wait_gone(kids[k], 2000), "child %d of tp-train left", kids[k]);
    cr_assert_eq(pu_dir_entries(s_tmp), 0, "the private ipc dir is left");
}

/* Must hold: with --worker-restarts 0 (the old policy) a worker killed
 * mid-epoch ends training with an error that names the worker and its
 * signal (exit 1, not a hang), nothing of the run is left, and the
 * checkpoint of the epoch before loads. */
Test(fault_train, sigkill_of_a_worker_without_restarts_ends_training) {
    s_no_restarts = 1;
    int pid = s_start(3, 300, 2, 0, 0);
    s_no_restarts = 0;
    int before[8], nb = 0;
    for (int i = 0; i < 6000 && nb < 2; i++) {
        nb = s_workers(pid, before, 8);
        if (nb < 2)
            usleep(10000);
    }
    cr_assert_eq(nb, 2, "two workers; output:\n%s", s_output());
    int kids[8];
    int nkids = fu_children(pid, kids, 8);
    char p[256];
    s_path(p, sizeof p, 300);
    cr_assert(fu_wait_file(p, 60000), "no checkpoint; output:\n%s", s_output());
    cr_assert_eq(kill(before[0], SIGKILL), 0);
    int st = fu_wait(pid, 30000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "tp-train (%d):\n%s", st, s_output());
    char who[64];
    snprintf(who, sizeof who, "(pid %d) killed by signal 9", before[0]);
    cr_assert(strstr(s_output(), who), "the error names the worker (%s):\n%s", who,
              s_output());
    for (int k = 0; k < nb; k++)
        cr_assert(pu_wait_gone(before[k], 2000), "worker %d left", before[k]);
    for (int k = 0; k < nkids; k++)
        cr_assert(pu_wait_gone(kids[k], 2000), "child %d of tp-train left", kids[k]);
    int64_t step = 0;
    s_assert_latest_loads(&step);
    cr_assert_geq(step, 300);
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
        int nk = fu_descendants(pid, kids, 16);
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
