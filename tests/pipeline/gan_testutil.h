/* towerpack tests: the tiny GAN the GAN trainers' tests train (2-D points,
 * fc layers; softmax cross-entropy over 2 logits standing in for sigmoid
 * cross-entropy until that op lands: class 1 is "real", and it is the
 * sigmoid cross-entropy of l1 - l0; its labels, all ones and all zeros,
 * come with the batches). Shared by test_trainer_gan.c and the PyTorch
 * check test_proc_gan_torch.c (tests/pipeline/torch_gan.py writes the same
 * model in PyTorch). */
#ifndef TP_GAN_TESTUTIL_H
#define TP_GAN_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <towerpack/towerpack.h>

#define ZDIM 4
#define NPOINTS 256

/* ---- the tiny GAN ------------------------------------------------------------ */

static const tp_input_desc_t s_inputs[] = {
    {"x", TP_FLOAT32, 2, {-1, 2}},
    {"one", TP_INT32, 1, {-1}},
    {"zero", TP_INT32, 1, {-1}},
    {"z", TP_FLOAT32, 2, {-1, ZDIM}},
};
#define S_NOISE_INPUT 3

/* A dense layer over variables made once and applied to several inputs. */
typedef struct {
    tp_node_t *w, *b;
} s_dense_t;

static inline s_dense_t s_dense_vars(tp_tower_t *t, const char *scope, int64_t in, int64_t out) {
    char n[64];
    int64_t ws[2] = {in, out}, bs[1] = {out};
    s_dense_t d;
    snprintf(n, sizeof n, "%s/W", scope);
    d.w = tp_variable(t, n, 2, ws, (tp_init_t){TP_INIT_GLOROT_UNIFORM, 0}, TP_VAR_TRAINABLE);
    snprintf(n, sizeof n, "%s/b", scope);
    d.b = tp_variable(t, n, 1, bs, (tp_init_t){TP_INIT_UNIFORM, 0.1f}, TP_VAR_TRAINABLE);
    return d;
}

static inline tp_node_t *s_dense(tp_tower_t *t, s_dense_t d, tp_node_t *x) {
    return tp_bias_add(t, NULL, tp_matmul(t, NULL, x, d.w), d.b);
}

static inline tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    s_dense_t g0 = s_dense_vars(t, "gen/fc0", ZDIM, 16), g1 = s_dense_vars(t, "gen/fc1", 16, 2);
    s_dense_t d0 = s_dense_vars(t, "discrim/fc0", 2, 16), d1 = s_dense_vars(t, "discrim/fc1", 16, 2);
    tp_node_t *fake = s_dense(t, g1, tp_tanh(t, NULL, s_dense(t, g0, in[S_NOISE_INPUT])));
    tp_node_t *lr = s_dense(t, d1, tp_tanh(t, NULL, s_dense(t, d0, in[0])));
    tp_node_t *lf = s_dense(t, d1, tp_tanh(t, NULL, s_dense(t, d0, fake)));
    /* GANModelDesc.build_losses, with the 2-class stand-in */
    tp_node_t *d_real = tp_softmax_xent(t, "gan/d_loss_real", lr, in[1]);
    tp_node_t *d_fake = tp_softmax_xent(t, "gan/d_loss_fake", lf, in[2]);
    tp_node_t *d_loss = tp_add(t, "gan/d_loss", tp_scale(t, NULL, d_real, 0.5f),
                               tp_scale(t, NULL, d_fake, 0.5f));
    tp_node_t *g_loss = tp_softmax_xent(t, "gan/g_loss", lf, in[1]);
    tp_node_t *acc_r = tp_accuracy(t, "gan/d_accuracy_real", lr, in[1]);
    tp_node_t *acc_f = tp_accuracy(t, "gan/d_accuracy_fake", lf, in[2]);
    tp_tower_add_output(t, "g_loss", g_loss);
    tp_tower_add_output(t, "d_loss", d_loss);
    tp_tower_add_output(t, "d_accuracy_real", acc_r);
    tp_tower_add_output(t, "d_accuracy_fake", acc_f);
    tp_tower_add_output(t, "d_accuracy", tp_add(t, "gan/d_accuracy", tp_scale(t, NULL, acc_r, 0.5f),
                                                tp_scale(t, NULL, acc_f, 0.5f)));
    tp_tower_add_output(t, "g_accuracy", tp_accuracy(t, "gan/g_accuracy", lf, in[1]));
    tp_tower_add_output(t, "fake", fake);
    TP_TRY(tp_tower_add_cost(t, "g_loss", g_loss, "gen/*"));
    return tp_tower_add_cost(t, "d_loss", d_loss, "discrim/*");
}

static inline tp_optimizer_t *s_adam(void *user) {
    (void)user;
    return tp_optimizer_adam(0.01, 0.5, 0.999, 1e-8);
}
static inline tp_optimizer_t *s_sgd(void *user) {
    (void)user;
    return tp_optimizer_sgd(0.05, 0.9, 0);
}
static inline tp_optimizer_t *s_adam_d(void *user) {  /* the discriminator's own lr */
    (void)user;
    return tp_optimizer_adam(0.02, 0.5, 0.999, 1e-8);
}

static inline tp_model_t *s_model(int towers, int64_t batch, tp_optimizer_fn opt) {
    static tp_model_desc_t d[2] = {{s_inputs, 4, s_tower, s_adam, NULL},
                                   {s_inputs, 4, s_tower, s_sgd, NULL}};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = towers;
    mc.batch = batch;
    mc.seed = 7;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&d[opt == s_sgd], &mc);
        return m;
}

/* The real points: a ring of radius 2, (x, 1, 0) per point, batched. */
static inline tp_dataflow_t *s_points(int batch) {
    tp_datapoint_t **dps = calloc(NPOINTS, sizeof *dps);
    tp_rng_t r;
    tp_rng_init(&r, 11, 0);
    for (int i = 0; i < NPOINTS; i++) {
        int64_t two[] = {2};
        dps[i] = tp_datapoint_new(3);
        tp_tensor_init(tp_datapoint_get(dps[i], 0), TP_FLOAT32, 1, two);
        float *x = tp_datapoint_get(dps[i], 0)->data;
        double a = 6.283185307179586 * tp_rng_double(&r);
        x[0] = (float)(2 * cos(a) + 0.1 * tp_rng_normal(&r));
        x[1] = (float)(2 * sin(a) + 0.1 * tp_rng_normal(&r));
        tp_tensor_init(tp_datapoint_get(dps[i], 1), TP_INT32, 0, NULL);
        *(int32_t *)tp_datapoint_get(dps[i], 1)->data = 1;
        tp_tensor_init(tp_datapoint_get(dps[i], 2), TP_INT32, 0, NULL);
        *(int32_t *)tp_datapoint_get(dps[i], 2)->data = 0;
    }
    tp_dataflow_t *df = tp_df_from_list(dps, NPOINTS, 0);
    free(dps);
    return tp_df_batch(df, batch, 0);
}

#endif
