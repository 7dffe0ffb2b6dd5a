/* towerpack tests: the learning-rate schedules of the common recipes
 * (tp_lr_schedule_t: linear, cosine and step, each with a linear warm-up)
 * against PyTorch's schedulers (LinearLR, CosineAnnealingLR, MultiStepLR,
 * chained as SequentialLR and ChainedScheduler do; tests/pipeline/
 * lr_schedule_torch.py), the rate of every step within 1e-6. Skips, saying
 * so, without Debian's python3-torch. And tp-train's flags for them
 * (--lr-schedule, --lr-gamma, --warmup-epochs): the rate stats.json records
 * after each epoch, bad flags named. Own executable: it forks and execs
 * Python and tp-train. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>
#include "proc_testutil.h"
#include <towerpack/callback.h>

#define PY "/usr/bin/python3"
#define REF TP_SOURCE_DIR "/tests/pipeline/lr_schedule_torch.py"

static char s_out[1 << 16];

/* Our rates at steps 0..total into a file, then the reference compares. */
static void s_agree(const char *kind, const tp_lr_schedule_t *s, int64_t total) {
    cr_assert_eq(tp_lr_schedule_check(s), TP_OK, "%s", tp_last_error());
    char path[] = "/tmp/tp-lr-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    for (int64_t k = 0; k <= total; k++)
        fprintf(f, "%.17g\n", tp_lr_schedule_at(s, k));
    fclose(f);
    char num[6][32], ms[256] = "-";
    snprintf(num[0], 32, "%.17g", s->base);
    snprintf(num[1], 32, "%.17g", s->warmup_from);
    snprintf(num[2], 32, "%.17g", s->end);
    snprintf(num[3], 32, "%.17g", s->gamma);
    snprintf(num[4], 32, "%lld", (long long)s->warmup);
    snprintf(num[5], 32, "%lld", (long long)total);
    for (int i = 0, o = 0; i < s->nmilestones; i++)
        o += snprintf(ms + o, sizeof ms - (size_t)o, "%s%lld", i ? "," : "",
                      (long long)s->milestones[i]);
    char *argv[] = {PY, REF, (char *)kind, num[0], num[1], num[2], num[3], num[4], num[5],
                    ms, path, NULL};
    int rc = pu_run(argv, NULL, s_out, sizeof s_out);
    unlink(path);
    if (rc == 3)
        cr_skip_test("%s (scripts/install-deps.sh installs it)", s_out);
    cr_expect_eq(rc, 0, "%s", s_out);
    cr_log_info("%s", s_out);
}

static void s_need_python(void) {
    if (access(PY, X_OK) != 0)
        cr_skip_test("no " PY " (python3-torch): the PyTorch comparison skipped");
}

Test(proc_lr_schedule, cosine_with_warmup_is_torchs) {
    s_need_python();
    /* per step: 5 epochs of 20 steps, a warm-up of 1.5 epochs */
    tp_lr_schedule_t s = {.kind = TP_LR_COSINE, .base = 0.1, .warmup_from = 0.1,
                          .end = 0, .warmup = 30, .total = 100};
    s_agree("cosine", &s, s.total);
    /* per epoch (one step an epoch), no warm-up, eta_min = base / 20 */
    tp_lr_schedule_t e = {.kind = TP_LR_COSINE, .base = 0.4, .end = 0.05, .total = 90};
    s_agree("cosine", &e, e.total);
}

Test(proc_lr_schedule, step_with_warmup_is_torchs) {
    s_need_python();
    /* Goyal et al.'s recipe in epochs: 5 of warm-up, x 0.1 at 30, 60, 80 */
    tp_lr_schedule_t s = {.kind = TP_LR_STEP, .base = 0.1, .warmup_from = 0.1, .gamma = 0.1,
                          .warmup = 5, .milestones = {30, 60, 80}, .nmilestones = 3};
    s_agree("step", &s, 90);
    /* per step, a milestone inside the warm-up, no warm-up at all */
    tp_lr_schedule_t t = {.kind = TP_LR_STEP, .base = 1, .warmup_from = 0.25, .gamma = 0.5,
                          .warmup = 40, .milestones = {20, 100, 150}, .nmilestones = 3};
    s_agree("step", &t, 200);
    t.warmup = 0;
    s_agree("step", &t, 200);
}

Test(proc_lr_schedule, linear_with_warmup_is_torchs) {
    s_need_python();
    /* tp-train's default: a tenth of the rate up, then down to a twentieth */
    tp_lr_schedule_t s = {.kind = TP_LR_LINEAR, .base = 0.05, .warmup_from = 0.1,
                          .end = 0.05, .warmup = 47, .total = 470};
    s_agree("linear", &s, s.total);
}

#define TEST_SPEC "fashion-mnist:test,shuffle=0 | batch 100 | fixed-size 2"

static int s_train(const char *logdir, const char *const *flags) {
    char *argv[32] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--epochs", "4",
                      "--steps-per-epoch", "5", "--towers", "1", "--threads", "1",
                      "--lr", "0.2", "--test-spec", TEST_SPEC, "--no-tensorboard",
                      "--logdir", (char *)logdir};
    int n = 18;
    for (int i = 0; flags[i] && n < 31; i++)
        argv[n++] = (char *)flags[i];
    argv[n] = NULL;
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    return pu_run(argv, env, s_out, sizeof s_out);
}

/* stats.json's learning_rate after epoch e: the rate of global step 5e */
static void s_expect_rates(const char *logdir, const tp_lr_schedule_t *s) {
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s: %s", path, err.text);
    cr_assert_eq(json_array_size(j), 4, "%s", path);
    for (int e = 1; e <= 4; e++) {
        json_t *v = json_object_get(json_array_get(j, (size_t)e - 1), "learning_rate");
        cr_expect_float_eq(json_number_value(v), tp_lr_schedule_at(s, 5 * e), 1e-9,
                           "after epoch %d", e);
    }
    json_decref(j);
}

Test(proc_lr_schedule, tp_train_takes_the_schedules_as_flags) {
    char dir[] = "/tmp/tp-lr-train-XXXXXX", logdir[64];
    cr_assert_not_null(mkdtemp(dir));
    /* cosine to 0 after a warm-up of 1.5 epochs (7.5 steps: 8) */
    snprintf(logdir, sizeof logdir, "%s/cos", dir);
    const char *cos_flags[] = {"--lr-schedule", "cosine", "--warmup-epochs", "1.5", NULL};
    cr_assert_eq(s_train(logdir, cos_flags), 0, "%s", s_out);
    tp_lr_schedule_t cos = {.kind = TP_LR_COSINE, .base = 0.2, .warmup_from = 0.1,
                            .end = 0, .warmup = 8, .total = 20};
    s_expect_rates(logdir, &cos);
    /* x 0.5 after epochs 1 and 3 */
    snprintf(logdir, sizeof logdir, "%s/step", dir);
    const char *step_flags[] = {"--lr-schedule", "step:1,3", "--lr-gamma", "0.5", NULL};
    cr_assert_eq(s_train(logdir, step_flags), 0, "%s", s_out);
    tp_lr_schedule_t st = {.kind = TP_LR_STEP, .base = 0.2, .gamma = 0.5,
                           .milestones = {5, 15}, .nmilestones = 2};
    s_expect_rates(logdir, &st);
    /* refused, naming the flag */
    snprintf(logdir, sizeof logdir, "%s/bad", dir);
    const char *late[] = {"--lr-schedule", "step:2,5", NULL};
    cr_expect_neq(s_train(logdir, late), 0);
    cr_expect(strstr(s_out, "milestone '5'"), "%s", s_out);
    const char *end[] = {"--lr-schedule", "step:2", "--lr-end", "0.1", NULL};
    cr_expect_neq(s_train(logdir, end), 0);
    cr_expect(strstr(s_out, "--lr-end"), "%s", s_out);
    const char *what[] = {"--lr-schedule", "exp", NULL};
    cr_expect_neq(s_train(logdir, what), 0);
    cr_expect(strstr(s_out, "linear, cosine or step"), "%s", s_out);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}
