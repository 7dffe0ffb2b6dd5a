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

#define REF_PY TP_SOURCE_DIR "/tests/models/torch_dcgan.py"
#define FMNIST "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
#define STEPS 50
#define BATCH 16
#define IMG (28 * 28)
/* The forward passes a GANTrainer step makes (one per player's gradients,
 * pipeline/train/trainer_gan.c): each moves the batch norms' moving
 * averages, so the reference moves them as often. */
#define FORWARDS 2

/* Adam at the zoo GAN's settings ({lr, beta1}), one per player. */
static tp_optimizer_t *s_adam(void *user) {
    const double *hp = user;
    return tp_optimizer_adam(hp[0], hp[1], 0.999, 1e-8);
}

typedef struct {
    int n;
    float losses[STEPS][2]; /* g_loss, d_loss at each step's starting weights */
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
    if (l->n < STEPS) {
        l->losses[l->n][0] = (float)g;
        l->losses[l->n][1] = (float)d;
    }
    l->n++;
    return TP_OK;
}

static const tp_callback_ops_t s_losses_ops = {
    .name = "Losses", .before_run = l_before_run, .after_run = l_after_run,
};

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
    char path[512];
    snprintf(path, sizeof path, "%s/w0.safetensors", dir);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());

    tp_input_t *in = tp_input_feed(tp_df_from_list(dps, STEPS, 0));
    tp_trainer_t *tr = tp_gan_trainer_new(m, in, &gc);
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
    tp_trainer_destroy(&tr); /* the callback has no destroy: l is ours */
    free(l);
    PU_PYTHON_EXPECT(REF_PY, dir, "pytorch agrees");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
