/* towerpack tests: the zoo's DCGAN (models/models.c) trained 50 steps by
 * GANTrainer (pipeline/train/trainer_gan.c) against the same DCGAN and the
 * same training semantics written in PyTorch (tests/models/torch_dcgan.py,
 * float64): from towerpack's initial checkpoint, on the same batches and
 * the same noise (both written here), the g_loss and d_loss of every step
 * and every variable after the last step (both players' weights, the batch
 * norms' moving averages) agree within the tolerances torch_dcgan.py states
 * and justifies. Two models: the 28 px grey one on Fashion-MNIST, and the
 * 32 px colour one (fc 256x4x4, three conv-transposes, three convolutions)
 * on a CIFAR-format file written here, through the pipeline tp-train
 * builds for it (cifar: | imgaug chw | batch). This pins the architecture
 * the zoo claims, the losses of GANModelDesc.build_losses, the order of the
 * two updates and the per-player Adam. A separate executable: it starts
 * python3. Skips without torch (and the grey one without Fashion-MNIST). */
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

/* CIFAR-10 records (a label byte, then the R, G and B planes of 32x32)
 * into path: smooth colour fields that differ per image and per channel
 * (a red level, a green diagonal, a blue ramp, a bright square), so the
 * discriminator has structure to learn and every channel its own values. */
static void s_write_cifar(const char *path, int n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    uint32_t r = 2024;
    for (int i = 0; i < n; i++) {
        uint8_t rec[1 + 3 * 1024];
        rec[0] = (uint8_t)(i % 10);
        r = r * 1103515245u + 12345u;
        int cx = (int)(r >> 16) % 24, cy = (int)(r >> 8) % 24;
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++) {
                int p = y * 32 + x, sq = x >= cx && x < cx + 8 && y >= cy && y < cy + 8;
                rec[1 + p] = (uint8_t)(sq ? 250 : 40 + (i * 37) % 160);
                rec[1 + 1024 + p] = (uint8_t)(sq ? 250 : ((x + y) * 4 + i) % 256);
                rec[1 + 2048 + p] = (uint8_t)(sq ? 20 : x * 8);
            }
        cr_assert_eq(fwrite(rec, 1, sizeof rec, f), sizeof rec);
    }
    cr_assert_eq(fclose(f), 0);
}

/* STEPS GANTrainer steps of the zoo's DCGAN at channels x size x size,
 * batch BATCH, on the first STEPS x BATCH items of `spec` (a pipeline
 * ending in "| batch BATCH", in file order) against torch_dcgan.py, in dir
 * (removed after). */
static void s_parity(char *dir, const char *spec, int channels, int size) {
    const tp_zoo_gan_t *gz = tp_zoo_find_gan("dcgan");
    cr_assert_not_null(gz);
    double hp[2] = {gz->lr, gz->beta1};
    tp_input_desc_t inputs[4];
    cr_assert_eq(tp_zoo_gan_inputs_shaped(gz, channels, size, inputs), TP_OK, "%s",
                 tp_last_error());
    const size_t img = (size_t)channels * (size_t)size * (size_t)size;

    /* the batches, fed as they are (no shuffle) and written for PyTorch */
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK, "%s", tp_last_error());
    uint8_t *x = malloc(STEPS * BATCH * img);
    cr_assert_not_null(x);
    tp_datapoint_t *dps[STEPS];
    for (int s = 0; s < STEPS; s++) {
        cr_assert_eq(tp_dataflow_next(df, &dps[s]), TP_OK, "%s", tp_last_error());
        const tp_tensor_t *im = tp_datapoint_get(dps[s], 0);
        cr_assert(im->dtype == TP_UINT8 && im->nbytes == BATCH * img, "batch %d: %zu bytes",
                  s, im->nbytes);
        memcpy(x + (size_t)s * BATCH * img, im->data, BATCH * img);
    }
    tp_dataflow_destroy(&df);
    s_write(dir, "x.bin", x, STEPS * BATCH * img);
    free(x);

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
    char text[160];
    int len = snprintf(text, sizeof text, "%d %d %.17g %.17g %d %d %d\n", STEPS, BATCH, hp[0],
                       hp[1], FORWARDS, channels, size);
    s_write(dir, "recipe.txt", text, (size_t)len);

    tp_model_desc_t desc = {inputs, gz->ninputs, gz->build, s_adam, hp};
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
    /* PU_PYTHON_EXPECT, with the measures in the log (--verbose) when it
     * passes: the numbers docs/training.md quotes */
    static char msg[4096];
    int rc = pu_python_check(REF_PY, dir, msg, sizeof msg);
    if (rc == 77)
        cr_skip_test("%s", msg);
    cr_assert_eq(rc, 0, "%s", msg);
    cr_assert(strstr(msg, "pytorch agrees"), "%s", msg);
    cr_log_info("%dx%dx%d:\n%s", channels, size, size, msg);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Must hold: 50 GANTrainer steps of the zoo's DCGAN (batch 16) give the
 * losses and the weights PyTorch gives from the same start. */
Test(torch_dcgan, fifty_gan_trainer_steps_agree_with_pytorch, .timeout = 600) {
    if (access(FMNIST, R_OK))
        cr_skip_test("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-torchdcgan-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    /* the first STEPS x BATCH training images in file order */
    char source[1024], spec[1100];
    cr_assert_eq(tp_zoo_source("fashion-mnist:train", 1, source, sizeof source), TP_OK, "%s",
                 tp_last_error());
    snprintf(spec, sizeof spec, "%s | batch %d", source, BATCH);
    s_parity(dir, spec, 1, 28);
}

/* Must hold: the same for the colour DCGAN at 32 px (CIFAR's size; its
 * generator fc 256x4x4 and three conv-transposes to 3x32x32) on colour
 * records fed channels first as tp-train feeds them: the losses and every
 * variable PyTorch's from the same start. */
Test(torch_dcgan, colour_32px_fifty_steps_agree_with_pytorch, .timeout = 600) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-torchdcganc-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char bin[128], data[160], source[1024], spec[1100];
    snprintf(bin, sizeof bin, "%s/data_batch_1.bin", dir);
    s_write_cifar(bin, STEPS * BATCH);
    snprintf(data, sizeof data, "cifar:%s", bin);
    cr_assert_eq(tp_zoo_source_shaped(data, 1, 3, 32, 32, source, sizeof source), TP_OK, "%s",
                 tp_last_error());
    snprintf(spec, sizeof spec, "%s | imgaug chw | batch %d", source, BATCH);
    s_parity(dir, spec, 3, 32);
}
