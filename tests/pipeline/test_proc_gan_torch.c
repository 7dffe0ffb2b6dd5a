/* towerpack tests: the GAN trainers against PyTorch (tests/pipeline/
 * torch_gan.py, float64): the tiny GAN of gan_testutil.h trained a few steps
 * by GANTrainer and by SeparateGANTrainer (d_period 1, g_period 2), each
 * group with its own Adam, from the same initial weights (towerpack's
 * checkpoint), batches and noise (written here); the losses every step
 * (read at the step's starting weights) and every variable after the last
 * step must agree. A separate executable: it starts python3. Skips when
 * python3 lacks torch. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/gan.h>
#include "gan_testutil.h"
#include "proc_testutil.h"

#define REF_PY TP_SOURCE_DIR "/tests/pipeline/torch_gan.py"
#define STEPS 6
#define BATCH 16

typedef struct {
    int n;
    float losses[STEPS][2];
} s_losses_t;

static tp_status_t l_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    (void)impl, (void)tr;
    TP_TRY(tp_fetches_request(f, "g_loss"));
    return tp_fetches_request(f, "d_loss");
}

static tp_status_t l_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    (void)tr;
    s_losses_t *l = impl;
    double g, d;
    TP_TRY(tp_fetches_get(f, "g_loss", &g));
    TP_TRY(tp_fetches_get(f, "d_loss", &d));
    l->losses[l->n][0] = (float)g;
    l->losses[l->n][1] = (float)d;
    l->n++;
    return TP_OK;
}

static const tp_callback_ops_t s_losses_ops = {
    .name = "Losses", .before_run = l_before_run, .after_run = l_after_run,
};

static void s_write(const char *dir, const char *name, const void *data, size_t bytes) {
    cr_assert_eq(pu_write_file(dir, name, data, bytes), 0, "%s/%s", dir, name);
}

static void s_check(int d_period, int g_period) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-gan-torch-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.batch = BATCH;
    gc.noise_input = S_NOISE_INPUT;
    gc.d_period = d_period;
    gc.g_period = g_period;
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam_d;
    /* what PyTorch needs: the recipe, the batches and the noise */
    char text[128];
    int len = snprintf(text, sizeof text, "%d %d %d %d %d\n", STEPS, BATCH, ZDIM,
                       d_period, g_period);
    s_write(dir, "recipe.txt", text, (size_t)len);
    static float x[STEPS][BATCH][2], z[STEPS][BATCH][ZDIM];
    tp_dataflow_t *df = s_points(BATCH);
    cr_assert_eq(tp_dataflow_reset_state(df, gc.seed, 0), TP_OK);
    for (int s = 0; s < STEPS; s++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        memcpy(x[s], tp_datapoint_get(dp, 0)->data, sizeof x[s]);
        tp_datapoint_destroy(&dp);
        tp_gan_noise_fill(&gc, s, 0, BATCH, ZDIM, &z[s][0][0]);
    }
    tp_dataflow_destroy(&df);
    s_write(dir, "x.bin", x, sizeof x);
    s_write(dir, "z.bin", z, sizeof z);

    tp_model_t *m = s_model(1, BATCH, s_adam);
    cr_assert_not_null(m, "%s", tp_last_error());
    char path[512];
    snprintf(path, sizeof path, "%s/w0.safetensors", dir);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    tp_trainer_t *tr = tp_gan_trainer_new(m, tp_input_feed(s_points(BATCH)), &gc);
    cr_assert_not_null(tr, "%s", tp_last_error());
    s_losses_t *l = calloc(1, sizeof *l);
    tp_callback_t *cb = tp_callback_new(&s_losses_ops, l, 0);
    cr_assert_eq(tp_trainer_add_callback(tr, &cb), TP_OK);
    tp_schedule_t sched = {1, 1, STEPS};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    cr_assert_eq(l->n, STEPS);
    s_write(dir, "losses.bin", l->losses, sizeof l->losses);
    snprintf(path, sizeof path, "%s/w1.safetensors", dir);
    cr_assert_eq(tp_checkpoint_save(tp_trainer_model(tr), path, NULL), TP_OK, "%s",
                 tp_last_error());
    tp_trainer_destroy(&tr);  /* the callback has no destroy: l is ours */
    free(l);
    PU_PYTHON_EXPECT(REF_PY, dir, "pytorch agrees");
}

Test(gan_torch, gan_trainer_agrees_with_pytorch) { s_check(0, 0); }

Test(gan_torch, separate_gan_trainer_agrees_with_pytorch) { s_check(1, 2); }
