/* towerpack tests: SIGINT in the middle of an epoch ends tp-train in order:
 * after_train runs (the stop is logged), the exit status says interrupted,
 * and the latest checkpoint is complete and loads. Own executable: it
 * forks and execs tp-train. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proc_testutil.h"
#include <towerpack/checkpoint.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/models.h>
#include <towerpack/optim.h>
#include <towerpack/towerpack.h>

static tp_optimizer_t *s_opt(void *user) { return tp_optimizer_sgd(0.05, 0.9, 0); }

Test(train_signal, sigint_mid_epoch_leaves_a_loadable_checkpoint, .timeout = 120) {
    char dir[] = "/tmp/tp-sigint-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128], ckpt[256];
    snprintf(logdir, sizeof logdir, "%s/run", dir);
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp",
                    "--epochs", "1000", "--steps-per-epoch", "20", "--threads", "1",
                    "--test-spec", "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 1",
                    "--logdir", logdir, NULL};
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};  /* the stop is logged at info */
    pu_spawn_opts_t o = {.out = "/dev/null", .env = env};
    pid_t pid = pu_spawn(argv, &o);
    /* Wait for the second checkpoint, then interrupt mid-epoch. */
    char second[256];
    snprintf(second, sizeof second, "%s/model-40.safetensors", logdir);
    for (int i = 0; i < 600 && access(second, F_OK) != 0; i++)
        usleep(50000);
    cr_assert_eq(access(second, F_OK), 0, "tp-train made no checkpoints");
    usleep(30000);
    kill(pid, SIGINT);
    int status = 0;
    pid_t w = 0;
    for (int i = 0; i < 100 && (w = waitpid(pid, &status, WNOHANG)) == 0; i++)
        usleep(50000);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        cr_assert_fail("tp-train did not stop within 5 s of SIGINT");
    }
    cr_assert(WIFEXITED(status), "tp-train died of a signal");
    cr_assert_eq(WEXITSTATUS(status), 130, "exit status %d", WEXITSTATUS(status));
    /* The log says why it stopped; the newest checkpoint loads. */
    char log[256], buf[1 << 16] = {0};
    snprintf(log, sizeof log, "%s/log.log", logdir);
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cr_assert(strstr(buf, "training stopped") && strstr(buf, "SIGINT"), "log:\n%s", buf);
    cr_assert_eq(tp_checkpoint_find_latest(logdir, ckpt, sizeof ckpt), TP_OK);
    tp_input_desc_t inputs[2];
    memcpy(inputs, tp_zoo_inputs(), sizeof inputs);
    tp_model_desc_t desc = {inputs, 2, tp_zoo_find("mlp")->build, s_opt, NULL};
    tp_model_config_t mc = tp_model_config_default();
    tp_model_t *m = tp_model_new(&desc, &mc);
    cr_assert_not_null(m);
    tp_train_state_t st;
    cr_assert_eq(tp_checkpoint_load(m, ckpt, TP_LOAD_STRICT, &st), TP_OK, "%s: %s", ckpt, tp_last_error());
    cr_assert(st.global_step >= 40 && st.global_step % 20 == 0, "step %lld", (long long)st.global_step);
    tp_model_destroy(&m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Stopped before its first epoch ends: no statistics yet, and the summary
 * says so instead of plotting nothing or printing "nan". */
Test(train_signal, sigint_before_the_first_epoch_says_nothing_ran, .timeout = 120) {
    char dir[] = "/tmp/tp-sigint-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128], out[160], log[160];
    snprintf(logdir, sizeof logdir, "%s/run", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(log, sizeof log, "%s/log.log", logdir);
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp",
                    "--epochs", "1", "--steps-per-epoch", "1000000", "--threads", "1",
                    "--logdir", logdir, NULL};
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    pu_spawn_opts_t o = {.out = out, .env = env};
    pid_t pid = pu_spawn(argv, &o);
    /* training has started once the trainer's statistics are announced */
    char buf[1 << 16];
    for (int i = 0; i < 600; i++) {
        buf[0] = '\0';
        FILE *f = fopen(log, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = '\0';
            fclose(f);
        }
        if (strstr(buf, "statistics for tp-top"))
            break;
        usleep(50000);
    }
    cr_assert(strstr(buf, "statistics for tp-top"), "training did not start:\n%s", buf);
    usleep(200000);
    kill(pid, SIGINT);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status %d", status);
    FILE *f = fopen(out, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cr_assert(strstr(buf, "tp-train: no epoch finished: no statistics to plot"), "%s", buf);
    cr_assert(strstr(buf, "test accuracy - (no validation ran)"), "%s", buf);
    cr_assert_null(strstr(buf, "plotting:"), "%s", buf);
    cr_assert_null(strstr(buf, "accuracy nan"), "%s", buf);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
