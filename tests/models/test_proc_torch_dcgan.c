/* towerpack tests: the zoo's DCGAN (models/models.c) trained 50 steps by
 * GANTrainer (pipeline/train/trainer_gan.c) against the same DCGAN and the
 * same training semantics written in PyTorch (tests/models/torch_dcgan.py,
 * float64): from towerpack's initial checkpoint, on the same Fashion-MNIST
 * batches and the same noise (both written here), the g_loss and d_loss of
 * every step and every variable after the last step (both players'
 * weights, the batch norms' moving averages) agree within the tolerances
 * torch_dcgan.py states and justifies. This pins the architecture the zoo
 * claims, the losses of GANModelDesc.build_losses, the order of the two
 * updates and the per-player Adam. A separate executable: it starts
 * python3. Skips without torch or Fashion-MNIST. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/gan.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "proc_testutil.h"
#include "train_testutil.h"

#define REF_PY TP_SOURCE_DIR "/tests/models/torch_dcgan.py"
#define FMNIST "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
#define STEPS 50
#define BATCH 16
#define IMG (28 * 28)
/* The forward passes a GANTrainer step makes (pipeline/train/trainer_gan.c:
 * one, both players' gradients from it, as tensorpack's graph): each moves
 * the batch norms' moving averages, so the reference moves them as often
 * (a reference that moves them twice, the trainer's old step, fails). */
#define FORWARDS 1

/* Adam at the zoo GAN's settings ({lr, beta1}), one per player. */
static tp_optimizer_t *s_adam(void *user) {
    const double *hp = user;
    return tp_optimizer_adam(hp[0], hp[1], 0.999, 1e-8);
}

static void s_write(const char *dir, const char *name, const void *data, size_t bytes) {
    cr_assert_eq(pu_write_file(dir, name, data, bytes), 0, "%s/%s", dir, name);
}

/* Must hold: 50 GANTrainer steps of the zoo's DCGAN (batch 16) give the
 * losses and the weights PyTorch gives from the same start. */
Test(torch_dcgan, fifty_gan_trainer_steps_agree_with_pytorch, .timeout = 600) {
    if (access(FMNIST, R_OK))
        cr_skip_test("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-torchdcgan-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    const tp_zoo_gan_t *gz = tp_zoo_find_gan("dcgan");
    cr_assert_not_null(gz);
    double hp[2] = {gz->lr, gz->beta1};

    /* the batches: the first STEPS x BATCH training images in file order,
     * fed as they are (no shuffle) and written for PyTorch */
    char source[1024], spec[1100];
    cr_assert_eq(tp_zoo_source("fashion-mnist:train", 1, source, sizeof source), TP_OK, "%s",
                 tp_last_error());
    snprintf(spec, sizeof spec, "%s | batch %d", source, BATCH);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK, "%s", tp_last_error());
    static uint8_t x[STEPS][BATCH * IMG];
    tp_datapoint_t *dps[STEPS];
    for (int s = 0; s < STEPS; s++) {
        cr_assert_eq(tp_dataflow_next(df, &dps[s]), TP_OK, "%s", tp_last_error());
        const tp_tensor_t *img = tp_datapoint_get(dps[s], 0);
        cr_assert(img->dtype == TP_UINT8 && img->nbytes == sizeof x[s], "batch %d: %zu bytes",
                  s, img->nbytes);
        memcpy(x[s], img->data, sizeof x[s]);
    }
    tp_dataflow_destroy(&df);
    s_write(dir, "x.bin", x, sizeof x);

    /* the noise each step draws (uniform in [-1, 1], as tp-train's) */
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.batch = BATCH;
    gc.noise_input = gz->noise_input;
    gc.seed = 3;
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam;
    gc.optimizer_user = hp;
    static float z[STEPS][BATCH * TP_ZOO_DCGAN_Z];
    for (int s = 0; s < STEPS; s++)
        tp_gan_noise_fill(&gc, s, 0, BATCH, TP_ZOO_DCGAN_Z, z[s]);
    s_write(dir, "z.bin", z, sizeof z);
    char text[128];
    int len = snprintf(text, sizeof text, "%d %d %.17g %.17g %d\n", STEPS, BATCH, hp[0], hp[1],
                       FORWARDS);
    s_write(dir, "recipe.txt", text, (size_t)len);

    tp_model_desc_t desc = {gz->inputs, gz->ninputs, gz->build, s_adam, hp};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = BATCH;
    mc.seed = 7;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&desc, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    static float losses[STEPS][2];
    int seen = 0;
    cr_assert_eq(tu_gan_train_losses(m, tp_input_feed(tp_df_from_list(dps, STEPS, 0)), &gc, dir,
                                     STEPS, losses, &seen),
                 TP_OK, "%s", tp_last_error());
    cr_assert_eq(seen, STEPS);
    s_write(dir, "losses.bin", losses, sizeof losses);
    PU_PYTHON_EXPECT(REF_PY, dir, "pytorch agrees");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
