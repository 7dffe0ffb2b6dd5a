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
#include "train_testutil.h"

#define REF_PY TP_SOURCE_DIR "/tests/pipeline/torch_gan.py"
#define STEPS 6
#define BATCH 16

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
    static float losses[STEPS][2];
    int seen = 0;
    cr_assert_eq(tu_gan_train_losses(m, tp_input_feed(s_points(BATCH)), &gc, dir, STEPS, losses,
                                     &seen),
                 TP_OK, "%s", tp_last_error());
    cr_assert_eq(seen, STEPS);
    s_write(dir, "losses.bin", losses, sizeof losses);
    PU_PYTHON_EXPECT(REF_PY, dir, "pytorch agrees");
}

Test(gan_torch, gan_trainer_agrees_with_pytorch) { s_check(0, 0); }

Test(gan_torch, separate_gan_trainer_agrees_with_pytorch) { s_check(1, 2); }
