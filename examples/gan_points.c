/* Example: a GAN, trained by towerpack's GAN trainers (towerpack/gan.h,
 * docs/training.md "Writing a GAN"): a generator learns to draw points of a
 * ring of radius 2 from uniform noise, against a discriminator that tells
 * its points from real ones.
 *
 *   build/bin/example-gan-points [--logdir DIR] [--tiny]
 *
 * The recipe:
 *   1. the tower function builds both players, the generator's variables
 *      under gen/, the discriminator's under discrim/ (applied to the real
 *      and the fake points with the same variables), and declares the two
 *      costs with their groups (tp_tower_add_cost) and the numbers
 *      GANModelDesc.build_losses reports (TP_GAN_MONITORS);
 *   2. a tp_gan_config_t names the noise input and an optimizer per group;
 *   3. tp_train_config_t.gan = &it, and launch as for any model.
 * Sigmoid cross-entropy is not an op yet: softmax cross-entropy over two
 * logits stands in for it (class 1 "real"; it is the sigmoid
 * cross-entropy of l1 - l0), its labels (all ones, all zeros) coming with
 * the batches. After training, the inference graph, pruned to the
 * generator's output, draws samples; it prints their mean radius. */
#include <math.h>
#include <towerpack/towerpack.h>
#include <towerpack/gan.h>
#include <towerpack/launch.h>
#include <towerpack/optim.h>
#include "common.h"

#define ZDIM 2
#define HIDDEN 32

static const tp_input_desc_t inputs[] = {
    {"x", TP_FLOAT32, 2, {-1, 2}},     /* real points */
    {"one", TP_INT32, 1, {-1}},        /* labels of the stand-in loss */
    {"zero", TP_INT32, 1, {-1}},
    {"z", TP_FLOAT32, 2, {-1, ZDIM}},  /* the noise: the trainer's */
};

/* A dense layer whose variables are made once and applied to several
 * inputs (the discriminator sees real and fake points). */
typedef struct {
    tp_node_t *w, *b;
} dense_t;

static dense_t dense_vars(tp_tower_t *t, const char *scope, int64_t in, int64_t out) {
    char n[64];
    int64_t ws[2] = {in, out}, bs[1] = {out};
    dense_t d;
    snprintf(n, sizeof n, "%s/W", scope);
    d.w = tp_variable(t, n, 2, ws, (tp_init_t){TP_INIT_GLOROT_UNIFORM, 0}, TP_VAR_TRAINABLE);
    snprintf(n, sizeof n, "%s/b", scope);
    d.b = tp_variable(t, n, 1, bs, (tp_init_t){TP_INIT_ZEROS, 0}, TP_VAR_TRAINABLE);
    return d;
}

static tp_node_t *dense(tp_tower_t *t, dense_t d, tp_node_t *x) {
    return tp_bias_add(t, NULL, tp_matmul(t, NULL, x, d.w), d.b);
}

static tp_node_t *discrim(tp_tower_t *t, const dense_t *d, tp_node_t *x) {
    x = tp_leaky_relu(t, NULL, dense(t, d[0], x), 0.2f);
    x = tp_leaky_relu(t, NULL, dense(t, d[1], x), 0.2f);
    return dense(t, d[2], x);
}

static tp_status_t tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *h = tp_relu(t, NULL, tp_fc(t, "gen/fc0", in[3], HIDDEN, 1));
    h = tp_relu(t, NULL, tp_fc(t, "gen/fc1", h, HIDDEN, 1));
    tp_node_t *fake = tp_fc(t, "gen/out", h, 2, 1);
    tp_tower_add_output(t, "fake", fake);
    const dense_t d[3] = {dense_vars(t, "discrim/fc0", 2, HIDDEN),
                          dense_vars(t, "discrim/fc1", HIDDEN, HIDDEN),
                          dense_vars(t, "discrim/out", HIDDEN, 2)};
    tp_node_t *lr = discrim(t, d, in[0]), *lf = discrim(t, d, fake);
    /* GANModelDesc.build_losses */
    tp_node_t *d_loss = tp_add(t, "d_loss",
                               tp_scale(t, NULL, tp_softmax_xent(t, "d_loss_real", lr, in[1]), 0.5f),
                               tp_scale(t, NULL, tp_softmax_xent(t, "d_loss_fake", lf, in[2]), 0.5f));
    tp_node_t *g_loss = tp_softmax_xent(t, "g_loss", lf, in[1]);
    tp_node_t *acc_r = tp_accuracy(t, "d_accuracy_real", lr, in[1]);
    tp_node_t *acc_f = tp_accuracy(t, "d_accuracy_fake", lf, in[2]);
    tp_tower_add_output(t, "g_loss", g_loss);
    tp_tower_add_output(t, "d_loss", d_loss);
    tp_tower_add_output(t, "d_accuracy_real", acc_r);
    tp_tower_add_output(t, "d_accuracy_fake", acc_f);
    tp_tower_add_output(t, "d_accuracy", tp_add(t, "d_accuracy", tp_scale(t, NULL, acc_r, 0.5f),
                                                tp_scale(t, NULL, acc_f, 0.5f)));
    tp_tower_add_output(t, "g_accuracy", tp_accuracy(t, "g_accuracy", lf, in[1]));
    TP_TRY(tp_tower_add_cost(t, "g_loss", g_loss, "gen/*"));
    return tp_tower_add_cost(t, "d_loss", d_loss, "discrim/*");
}

static tp_optimizer_t *adam(void *user) {
    (void)user;
    return tp_optimizer_adam(1e-3, 0.5, 0.999, 1e-8);
}

/* The real points: a ring of radius 2, (x, 1, 0) each. */
static tp_dataflow_t *ring(int n, int batch) {
    tp_datapoint_t **dps = calloc((size_t)n, sizeof *dps);
    if (!dps)
        return NULL;
    tp_rng_t r;
    tp_rng_init(&r, 11, 0);
    for (int i = 0; i < n; i++) {
        int64_t two[] = {2};
        dps[i] = tp_datapoint_new(3);
        tp_tensor_init(tp_datapoint_get(dps[i], 0), TP_FLOAT32, 1, two);
        float *x = tp_datapoint_get(dps[i], 0)->data;
        double a = 6.283185307179586 * tp_rng_double(&r);
        x[0] = (float)(2 * cos(a) + 0.05 * tp_rng_normal(&r));
        x[1] = (float)(2 * sin(a) + 0.05 * tp_rng_normal(&r));
        tp_tensor_init(tp_datapoint_get(dps[i], 1), TP_INT32, 0, NULL);
        *(int32_t *)tp_datapoint_get(dps[i], 1)->data = 1;
        tp_tensor_init(tp_datapoint_get(dps[i], 2), TP_INT32, 0, NULL);
        *(int32_t *)tp_datapoint_get(dps[i], 2)->data = 0;
    }
    tp_dataflow_t *df = tp_df_from_list(dps, (size_t)n, 1);
    free(dps);
    return tp_df_batch(df, batch, 0);
}

static int fail(const char *what) {
    fprintf(stderr, "example-gan-points: %s: %s\n", what, tp_last_error());
    return 1;
}

int main(int argc, char **argv) {
    example_args_t args = example_args(argc, argv, "train_log/example-gan-points");
    enum { BATCH = 64, SAMPLES = 512 };
    tp_model_desc_t desc = {inputs, 4, tower, adam, NULL};
    tp_gan_config_t gan;
    tp_gan_config_init(&gan);
    gan.noise_input = 3;
    gan.g_optimizer = adam;  /* one per group */
    gan.d_optimizer = adam;

    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &desc;
    cfg.dataflow = ring(4096, BATCH);
    cfg.gan = &gan;
    cfg.batch = BATCH;
    cfg.infer_batch = SAMPLES;  /* the graph that draws samples afterwards */
    cfg.logdir = args.logdir;
    cfg.logdir_action = TP_LOGDIR_DELETE;
    cfg.progress_names = TP_GAN_MONITORS;
    cfg.max_epoch = args.tiny ? 2 : 30;
    cfg.steps_per_epoch = args.tiny ? 5 : 100;
    tp_model_t *m = NULL;
    if (tp_launch_train_with_config(&cfg, &m) < 0)
        return fail("training");

    /* Samples: the inference graph pruned to the generator's output reads
     * only z (the other inputs are fed empty). */
    const char *want = "fake";
    static float z[SAMPLES * ZDIM];
    tp_gan_noise_fill(&gan, -1, 0, SAMPLES, ZDIM, z);  /* a step no run trains */
    tp_tensor_t feeds[4];
    for (int i = 0; i < 3; i++)
        tp_tensor_init_empty(&feeds[i]);
    int64_t zs[2] = {SAMPLES, ZDIM};
    tp_fetch_t out = {"fake", {0}};
    if (tp_model_prune(m, &want, 1) < 0 ||
        tp_tensor_init_wrap(&feeds[3], TP_FLOAT32, 2, zs, z, NULL, NULL) < 0 ||
        tp_model_run(m, -1, feeds, 4, &out, 1, &(tp_run_opts_t){.stages = TP_RUN_FORWARD}) < 0) {
        tp_model_destroy(&m);
        return fail("sampling");
    }
    const float *p = out.value.data;  /* the CPU's memory */
    double sum = 0, sum2 = 0;
    for (int i = 0; i < SAMPLES; i++) {
        double r = sqrt((double)p[2 * i] * p[2 * i] + (double)p[2 * i + 1] * p[2 * i + 1]);
        sum += r;
        sum2 += r * r;
    }
    double mean = sum / SAMPLES;
    printf("samples: mean radius %.3f (real: 2), std %.3f\n", mean,
           sqrt(sum2 / SAMPLES - mean * mean));
    tp_model_destroy(&m);
    return 0;
}
