/* towerpack tests: the zoo's GAN through tp-train, run as a user runs it
 * (tp-train --model dcgan on Fashion-MNIST, a few steps): the GAN
 * trainer's losses, the sample grids SampleGrid writes each epoch,
 * tp-generate's samples of the trained generator (read back by NumPy,
 * generate_check.py), and a run killed with SIGKILL and resumed, which
 * must end bit for bit where an unbroken run ends. Own executable: it
 * forks and execs. */
#include <signal.h>
#include <sys/wait.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/image.h>
#include <towerpack/models.h>
#include "proc_testutil.h"

static char s_out[1 << 18];

/* The column `name` of steps.tsv, one value per step, into v[max]; the
 * number of rows read. */
static int s_column(const char *path, const char *name, double *v, int max) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[4096];
    cr_assert_not_null(fgets(line, sizeof line, f), "%s: empty", path);
    int col = -1, c = 0;
    for (char *save = NULL, *tok = strtok_r(line, "\t\n", &save); tok;
         tok = strtok_r(NULL, "\t\n", &save), c++)
        if (!strcmp(tok, name))
            col = c;
    cr_assert_geq(col, 0, "%s: no column %s", path, name);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        c = 0;
        for (char *save = NULL, *tok = strtok_r(line, "\t\n", &save); tok;
             tok = strtok_r(NULL, "\t\n", &save), c++)
            if (c == col)
                v[n++] = strtod(tok, NULL);
    }
    fclose(f);
    return n;
}

/* Must hold: DCGAN trains under the GAN trainer (both players' losses
 * finite at every step, and moving: the two updates change the weights
 * each step), and each epoch's grid of 64 samples is an 8 x 8 grid of 28 x
 * 28 tiles with 2 px between and around them (242 x 242, grey). */
/* A short run of tp-train --model dcgan (2 epochs of 3 steps, batch 16)
 * into dir/run (logdir[size]); skips without Fashion-MNIST. */
static void s_train(const char *dir, char *logdir, size_t size) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK))
        cr_skip_test("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    snprintf(logdir, size, "%s/run", dir);
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "dcgan", "--epochs", "2",
                    "--steps-per-epoch", "3", "--batch", "16", "--threads", "1",
                    "--logdir", logdir, "--no-tensorboard", NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    int rc = pu_run(argv, env, s_out, sizeof s_out);
    cr_assert_eq(rc, 0, "tp-train --model dcgan failed:\n%s", s_out);
}

Test(dcgan, tp_train_trains_it_and_writes_sample_grids, .timeout = 180) {
    char dir[] = "/tmp/tp-dcgan-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128];
    s_train(dir, logdir, sizeof logdir);

    char path[256];
    snprintf(path, sizeof path, "%s/steps.tsv", logdir);
    static const char *const losses[2] = {"g_loss", "d_loss"};
    for (int k = 0; k < 2; k++) {
        double v[16];
        int n = s_column(path, losses[k], v, 16);
        cr_assert_eq(n, 6, "%s: %d steps of %s (6 trained)", path, n, losses[k]);
        int moved = 0;
        for (int i = 0; i < n; i++) {
            cr_assert(isfinite(v[i]) && v[i] > 0, "%s at step %d: %g", losses[k], i + 1, v[i]);
            moved |= fabs(v[i] - v[0]) > 1e-4;
        }
        cr_assert(moved, "%s stayed at %g for %d steps", losses[k], v[0], n);
    }
    for (int e = 1; e <= 2; e++) {
        snprintf(path, sizeof path, "%s/samples-%d.png", logdir, e);
        tp_tensor_t img;
        cr_assert_eq(tp_image_read(path, NULL, &img), TP_OK, "%s: %s", path, tp_last_error());
        cr_assert_eq(img.shape[0], 8 * 28 + 9 * 2, "%s: height %lld", path,
                     (long long)img.shape[0]);
        cr_assert_eq(img.shape[1], 8 * 28 + 9 * 2, "%s: width %lld", path,
                     (long long)img.shape[1]);
        cr_assert(img.ndim == 2 || img.shape[2] == 1, "%s: not grey", path);
        tp_tensor_fini(&img);
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Must hold: tp-generate draws from the run's generator (its latest
 * checkpoint, through the log directory) uint8 [N, 28, 28] .npy files that
 * NumPy reads; 300 samples (two predictor calls) start with the 64 of
 * --count 64, and those, with the run's seed, are the tiles of the run's
 * last sample grid: --png writes that very PNG, byte for byte. */
Test(dcgan, tp_generate_samples_the_trained_generator, .timeout = 180) {
    char dir[] = "/tmp/tp-dcgan-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128], npy[160], npy64[160], png[160];
    s_train(dir, logdir, sizeof logdir);
    snprintf(npy, sizeof npy, "%s/g.npy", dir);
    snprintf(npy64, sizeof npy64, "%s/g64.npy", dir);
    snprintf(png, sizeof png, "%s/g64.png", dir);
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    char *a300[] = {TP_BINARY_DIR "/bin/tp-generate", "--load", logdir, "--count", "300",
                    "--output", npy, NULL};
    cr_assert_eq(pu_run(a300, env, s_out, sizeof s_out), 0, "tp-generate:\n%s", s_out);
    char *a64[] = {TP_BINARY_DIR "/bin/tp-generate", "--load", logdir, "--count", "64",
                   "--output", npy64, "--png", png, "--seed", "1", NULL};
    cr_assert_eq(pu_run(a64, env, s_out, sizeof s_out), 0, "tp-generate:\n%s", s_out);
    char grid[160];
    snprintf(grid, sizeof grid, "%s/samples-2.png", logdir);
    size_t nx, ny;
    cr_assert(pu_same_file(png, grid, &nx, &ny), "%s (%zu bytes) is not %s (%zu bytes)", png,
              nx, grid, ny);
    /* a checkpoint of another model is refused, naming it */
    char *bad[] = {TP_BINARY_DIR "/bin/tp-generate", "--load", logdir, "--model", "cnn",
                   "--count", "4", "--output", npy, NULL};
    cr_assert_neq(pu_run(bad, env, s_out, sizeof s_out), 0);
    cr_assert(strstr(s_out, "not a generator"), "%s", s_out);
    /* samples are a .npy: another name is refused, naming the flag */
    char txt[160];
    snprintf(txt, sizeof txt, "%s/g.txt", dir);
    char *named[] = {TP_BINARY_DIR "/bin/tp-generate", "--load", logdir, "--count", "4",
                     "--output", txt, NULL};
    cr_assert_neq(pu_run(named, env, s_out, sizeof s_out), 0);
    cr_assert(strstr(s_out, "name the file FILE.npy") && access(txt, F_OK) != 0, "%s", s_out);
    PU_PYTHON_EXPECT(TP_SOURCE_DIR "/tests/tools/generate_check.py", dir, "numpy agrees");
}

/* tp-train --model dcgan into logdir (--resume when `resume`), 2 epochs of
 * 8 steps, batch 16, seed 5, its output appended to `log`: its pid. */
static pid_t s_start_run(const char *logdir, const char *log, int resume) {
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "dcgan", "--epochs", "2",
                    "--steps-per-epoch", "8", "--batch", "16", "--threads", "1", "--seed",
                    "5", "--logdir", (char *)logdir, "--no-tensorboard",
                    resume ? "--resume" : NULL, NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    pu_spawn_opts_t o = {.out = log, .env = env};
    pid_t pid = pu_spawn(argv, &o);
    cr_assert_gt(pid, 0, "tp-train did not start");
    return pid;
}

static int s_exists(const char *dir, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* 1 when dir_a/name and dir_b/name hold the same bytes. */
static int s_same_file(const char *dir_a, const char *dir_b, const char *name) {
    char pa[256], pb[256];
    snprintf(pa, sizeof pa, "%s/%s", dir_a, name);
    snprintf(pb, sizeof pb, "%s/%s", dir_b, name);
    size_t nx, ny;
    return pu_same_file(pa, pb, &nx, &ny);
}

/* Must hold (issue 44): a DCGAN run killed with SIGKILL once its epoch-1
 * checkpoint is written, then resumed (--resume), ends with a checkpoint
 * byte-identical to an unbroken run's: both players' weights and Adam
 * moments, the batch norms' moving averages, the generators' states; its
 * noise (a function of the seed and the global step), its batches
 * (replayed to the step) and each player's Adam update count (a function
 * of the global step) are those of the unbroken run, and so is the
 * resumed run's sample grid. */
Test(dcgan, sigkill_after_epoch_1_then_resume_ends_bit_for_bit, .timeout = 180) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK))
        cr_skip_test("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    char dir[] = "/tmp/tp-dcgan-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char whole[128], broken[128], log[160];
    snprintf(whole, sizeof whole, "%s/whole", dir);
    snprintf(broken, sizeof broken, "%s/broken", dir);
    snprintf(log, sizeof log, "%s/log.txt", dir);
    int st = pu_waitpid(s_start_run(whole, log, 0), 150000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the unbroken run failed (%d)", st);

    /* the second run dies the moment its epoch-1 checkpoint is there
     * (written by rename: whole once it exists), inside epoch 2 */
    pid_t pid = s_start_run(broken, log, 0);
    int i = 0;
    for (; i < 120000 && !s_exists(broken, "model-8.safetensors"); i++) {
        usleep(1000);
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the run ended before its checkpoint");
    }
    cr_assert_lt(i, 120000, "no epoch-1 checkpoint in 120 s");
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    cr_assert(!s_exists(broken, "model-16.safetensors"),
              "the run finished before the kill: nothing is resumed (a slower step is needed)");

    st = pu_waitpid(s_start_run(broken, log, 1), 150000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the resumed run failed (%d)", st);
    cr_assert(s_same_file(whole, broken, "model-8.safetensors"), "epoch 1 differs");
    cr_assert(s_same_file(whole, broken, "model-16.safetensors"),
              "the resumed run's last checkpoint is not the unbroken run's");
    cr_assert(s_same_file(whole, broken, "samples-2.png"),
              "the resumed run's epoch-2 sample grid is not the unbroken run's");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Run bin/<argv[0]> (a tool's name) with TP_LOG_LEVEL=warn, output into
 * s_out: its exit status. */
static int s_tool(char **argv) {
    char path[256];
    snprintf(path, sizeof path, TP_BINARY_DIR "/bin/%s", argv[0]);
    char *full[32] = {path};
    for (int i = 1; i < 31 && (full[i] = argv[i]); i++) {}
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    return pu_run(full, env, s_out, sizeof s_out);
}

/* Must hold: what a user gets wrong with a GAN is refused, saying what and
 * what to use: tp-train --model dcgan with a flag it does not read (the
 * classifiers' --classes, --test-data, --augment, the gpt's --context, a
 * text: source, --job) names that flag instead of ignoring it, and the
 * flags it does read (--curve, --tf32) are not ignored either; tp-generate asked
 * for text (--prompt) from a dcgan checkpoint says it draws images; a
 * --load that is not there is named; a count of 0 or below and a negative seed are refused; a checkpoint cut
 * in the middle is named as cut short. No run hangs (pu_run's limit). */
Test(dcgan, mistakes_are_refused_saying_why, .timeout = 180) {
    char dir[] = "/tmp/tp-dcgan-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128], npy[160];
    snprintf(logdir, sizeof logdir, "%s/bad", dir);
    snprintf(npy, sizeof npy, "%s/g.npy", dir);
    static const struct {
        const char *flag, *value, *said;
    } unread[] = {{"--classes", "3", "--classes (a GAN has no classes)"},
                  {"--test-data", "fashion-mnist:test", "--test-data"},
                  {"--augment", "imagenet", "--augment"},
                  {"--context", "32", "--context"},
                  {"--optimizer", "sgd", "--optimizer"},
                  {"--data", "text:/etc/hostname", "--data text:FILE"},
                  {"--job", "j1", "--job"}};
    for (size_t i = 0; i < sizeof unread / sizeof unread[0]; i++) {
        char *a[] = {"tp-train", "--model", "dcgan", (char *)unread[i].flag,
                     (char *)unread[i].value, "--epochs", "1", "--steps-per-epoch", "1",
                     "--logdir", logdir, "--no-tensorboard", NULL};
        cr_expect_eq(s_tool(a), 1, "%s %s was taken:\n%s", unread[i].flag, unread[i].value,
                     s_out);
        cr_expect(strstr(s_out, "--model dcgan does not take") &&
                      strstr(s_out, unread[i].said),
                  "%s %s:\n%s", unread[i].flag, unread[i].value, s_out);
    }
    /* --curve is read (the keys of a tcp --stats socket): keys that are
     * not there are named, not ignored; --tf32 on the CPU says it changes
     * nothing, as for the classifiers (both before any data is read) */
    char *curve[] = {"tp-train", "--model", "dcgan", "--curve", "/nonexistent/keys",
                     "--tf32", "--devices", "cpu", "--data", "imagefolder:/nonexistent",
                     "--logdir", logdir, "--no-tensorboard", NULL};
    cr_expect_eq(s_tool(curve), 1, "%s", s_out);
    cr_expect(strstr(s_out, "--curve") && strstr(s_out, "/nonexistent/keys"), "%s", s_out);
    cr_expect(strstr(s_out, "--tf32: the towers run on the CPU"), "%s", s_out);
    /* --resume into a log directory that is not there (a typo): named,
     * as for the classifiers, not a new run started there */
    char gone_dir[160];
    snprintf(gone_dir, sizeof gone_dir, "%s/typo", dir);
    char *resume[] = {"tp-train", "--model", "dcgan", "--resume", "--logdir", gone_dir,
                      "--epochs", "1", "--steps-per-epoch", "1", "--no-tensorboard", NULL};
    cr_expect_eq(s_tool(resume), 1, "%s", s_out);
    cr_expect(strstr(s_out, "--resume: the log directory") && strstr(s_out, gone_dir) &&
                  strstr(s_out, "--create-logdir"), "%s", s_out);
    cr_expect_neq(access(gone_dir, F_OK), 0, "a refused --resume made %s", gone_dir);
    /* a --load that is not there: named, before the flags it lacks */
    char *gone[] = {"tp-generate", "--load", logdir, NULL};
    cr_expect_eq(s_tool(gone), 1, "%s", s_out);
    cr_expect(strstr(s_out, "--load: checkpoint") && strstr(s_out, logdir) &&
                  !strstr(s_out, "are required"), "%s", s_out);
    s_train(dir, logdir, sizeof logdir);
    char *prompt[] = {"tp-generate", "--load", logdir, "--prompt", "The ", NULL};
    cr_expect_eq(s_tool(prompt), 1, "%s", s_out);
    cr_expect(strstr(s_out, "holds model 'dcgan', a GAN: it draws images") &&
                  strstr(s_out, "--count N --output FILE.npy"), "%s", s_out);
    /* a flag missing is named; a gpt's flag among a GAN's is named, with
     * the model the checkpoint holds */
    char *nout[] = {"tp-generate", "--load", logdir, "--count", "2", NULL};
    cr_expect_eq(s_tool(nout), 2, "%s", s_out);
    cr_expect(strstr(s_out, ": --output missing"), "%s", s_out);
    char *mixed[] = {"tp-generate", "--load", logdir, "--count", "2", "--output", npy,
                     "--temperature", "0.5", NULL};
    cr_expect_eq(s_tool(mixed), 2, "%s", s_out);
    cr_expect(strstr(s_out, "--temperature is a gpt's") && strstr(s_out, "--count a GAN's") &&
                  strstr(s_out, "holds model 'dcgan'"), "%s", s_out);
    const char *counts[] = {"0", "-3", "2x"};
    for (int i = 0; i < 3; i++) {
        char *a[] = {"tp-generate", "--load", logdir, "--count", (char *)counts[i],
                     "--output", npy, NULL};
        cr_expect_eq(s_tool(a), 2, "--count %s:\n%s", counts[i], s_out);
        cr_expect(strstr(s_out, "--count") && strstr(s_out, "1..1000000"), "%s", s_out);
    }
    char *seed[] = {"tp-generate", "--load", logdir, "--count", "2", "--output", npy,
                    "--seed", "-1", NULL};
    cr_expect_eq(s_tool(seed), 2, "%s", s_out);
    cr_expect(strstr(s_out, "--seed '-1': an integer >= 0"), "%s", s_out);
    /* the checkpoint cut in the middle: named, and said to be cut short */
    char ckpt[200];
    snprintf(ckpt, sizeof ckpt, "%s/model-6.safetensors", logdir);
    FILE *f = fopen(ckpt, "rb");
    cr_assert_not_null(f, "%s", ckpt);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    cr_assert_eq(truncate(ckpt, size / 2), 0);
    char *cut[] = {"tp-generate", "--load", logdir, "--count", "2", "--output", npy, NULL};
    cr_expect_eq(s_tool(cut), 1, "%s", s_out);
    cr_expect(strstr(s_out, "model-6.safetensors") && strstr(s_out, "cut short"), "%s", s_out);
    cr_expect_neq(access(npy, F_OK), 0, "a .npy was written from a cut checkpoint");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
