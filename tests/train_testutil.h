/* towerpack tests: small dataflows and models shared by the training and
 * input tests, and the loss recorder of the GAN trainers' PyTorch checks. */
#ifndef TP_TRAIN_TESTUTIL_H
#define TP_TRAIN_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <towerpack/gan.h>
#include <towerpack/towerpack.h>

/* The training tests' easy problem: `npoints` Gaussian blobs in 2-D of
 * `spread` (standard deviation; 2 classes: centres (-2, 0) and (2, 0); 4
 * classes: (+-2, +-2)), point i of class i % classes, deterministic for a
 * seed, batched by `batch`. */
static inline tp_dataflow_t *tu_blobs(int npoints, int classes, float spread,
                                      uint64_t seed, int batch, int shuffle,
                                      int remainder) {
    static const float cx4[4] = {-2, 2, -2, 2}, cy4[4] = {-2, -2, 2, 2};
    static const float cx2[2] = {-2, 2}, cy2[2] = {0, 0};
    const float *cx = classes == 2 ? cx2 : cx4, *cy = classes == 2 ? cy2 : cy4;
    tp_datapoint_t **dps = calloc((size_t)npoints, sizeof *dps);
    tp_rng_t r;
    tp_rng_init(&r, seed, 0);
    for (int i = 0; i < npoints; i++) {
        int k = i % classes;
        int64_t two[] = {2};
        dps[i] = tp_datapoint_new(2);
        tp_tensor_init(tp_datapoint_get(dps[i], 0), TP_FLOAT32, 1, two);
        float *x = tp_datapoint_get(dps[i], 0)->data;
        x[0] = cx[k] + spread * (float)tp_rng_normal(&r);
        x[1] = cy[k] + spread * (float)tp_rng_normal(&r);
        tp_tensor_init(tp_datapoint_get(dps[i], 1), TP_INT32, 0, NULL);
        *(int32_t *)tp_datapoint_get(dps[i], 1)->data = k;
    }
    tp_dataflow_t *df = tp_df_from_list(dps, npoints, shuffle);
    free(dps);
    return tp_df_batch(df, batch, remainder);
}

/* tu_blobs' components: x [B,2] float32, label [B] int32. */
static const tp_input_desc_t tu_blob_inputs[2] = {
    {"x", TP_FLOAT32, 2, {-1, 2}},
    {"label", TP_INT32, 1, {-1}},
};

/* A two-layer classifier of tu_blobs' points, 4 classes: fc0 `hidden`
 * wide, relu, fc1; its cost and accuracy, the scalars of the tests about
 * what training reports. */
static inline tp_status_t tu_mlp(tp_tower_t *t, tp_node_t *const *in, int hidden) {
    tp_node_t *h = tp_relu(t, NULL, tp_fc(t, "fc0", in[0], hidden, 1));
    tp_node_t *logits = tp_fc(t, "fc1", h, 4, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, cost);
}

/* A linear classifier of tu_blobs' points (x [B,2] float32, label [B]
 * int32, 4 classes), trained by SGD (lr 0.1, momentum 0.9): the model of
 * the tests about the launch around it, not about the model. */
static inline tp_status_t tu_linear_tower(tp_tower_t *t, tp_node_t *const *in,
                                          void *user) {
    (void)user;
    tp_node_t *logits = tp_fc(t, "fc0", in[0], 4, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

/* The optimizer of tu_linear_model and tu_mlp's models: SGD, lr 0.1,
 * momentum 0.9. */
static inline tp_optimizer_t *tu_sgd_opt(void *user) {
    (void)user;
    return tp_optimizer_sgd(0.1, 0.9, 0);
}
static inline const tp_model_desc_t *tu_linear_model(void) {
    static const tp_model_desc_t md = {tu_blob_inputs, 2, tu_linear_tower, tu_sgd_opt, NULL};
    return &md;
}

/* n datapoints of one int32 component [4], every element = the index. */
static inline tp_dataflow_t *tu_counting(int n) {
    tp_datapoint_t **dps = calloc((size_t)n, sizeof *dps);
    for (int i = 0; i < n; i++) {
        int64_t four[] = {4};
        dps[i] = tp_datapoint_new(1);
        tp_tensor_init(tp_datapoint_get(dps[i], 0), TP_INT32, 1, four);
        for (int k = 0; k < 4; k++)
            ((int32_t *)tp_datapoint_get(dps[i], 0)->data)[k] = i;
    }
    tp_dataflow_t *df = tp_df_from_list(dps, (size_t)n, 0);
    free(dps);
    return df;
}

/* ---- the losses of every step (the GAN trainers' PyTorch checks) -------- */

typedef struct {
    int n, cap;
    float (*losses)[2];
} tu_gan_losses_t;

static inline tp_status_t tu_gl_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    (void)impl, (void)tr;
    TP_TRY(tp_fetches_request(f, "g_loss"));
    return tp_fetches_request(f, "d_loss");
}

static inline tp_status_t tu_gl_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    (void)tr;
    tu_gan_losses_t *l = impl;
    double g, d;
    TP_TRY(tp_fetches_get(f, "g_loss", &g));
    TP_TRY(tp_fetches_get(f, "d_loss", &d));
    if (l->n < l->cap) {
        l->losses[l->n][0] = (float)g;
        l->losses[l->n][1] = (float)d;
    }
    l->n++;
    return TP_OK;
}

/* A GAN trainer's run for a PyTorch check: saves m's initial weights to
 * dir/w0.safetensors, trains m by a GANTrainer (gc) on `in` for `steps`
 * steps (one epoch), recording g_loss and d_loss as read at each step's
 * starting weights in losses[step][0] and [1], saves the weights after the
 * last step to dir/w1.safetensors and destroys the trainer (the recorder has
 * no destroy of its own, so it must outlive the trainer). *seen: the steps
 * the recorder saw, for the caller to compare with steps. */
static inline tp_status_t tu_gan_train_losses(tp_model_t *m, tp_input_t *in,
                                              const tp_gan_config_t *gc, const char *dir,
                                              int steps, float (*losses)[2], int *seen) {
    static const tp_callback_ops_t ops = {
        .name = "Losses", .before_run = tu_gl_before_run, .after_run = tu_gl_after_run,
    };
    char path[512];
    snprintf(path, sizeof path, "%s/w0.safetensors", dir);
    tp_status_t st = tp_checkpoint_save(m, path, NULL);
    if (st != TP_OK) {
        tp_model_destroy(&m);
        tp_input_destroy(&in);
        return st;
    }
    tp_trainer_t *tr = tp_gan_trainer_new(m, in, gc);  /* NULL: m and in destroyed */
    if (!tr)
        return TP_ERR_INVALID;  /* tp_last_error() says why */
    tu_gan_losses_t l = {0, steps, losses};
    tp_callback_t *cb = tp_callback_new(&ops, &l, 0);
    st = tp_trainer_add_callback(tr, &cb);
    if (st == TP_OK) {
        tp_schedule_t sched = {1, 1, steps};
        st = tp_trainer_train(tr, &sched);
    }
    snprintf(path, sizeof path, "%s/w1.safetensors", dir);
    if (st == TP_OK)
        st = tp_checkpoint_save(tp_trainer_model(tr), path, NULL);
    tp_trainer_destroy(&tr);
    *seen = l.n;
    return st;
}

#endif
