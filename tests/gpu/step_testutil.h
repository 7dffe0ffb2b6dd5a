/* towerpack tests: what the whole-step tests of tests/gpu share
 * (test_cuda_ops.c on a GPU, test_graph_replay.c on the CPU): a small CNN
 * with every op a step records (conv, batch norm, dropout, concat, both
 * poolings, scale, matmul, L2 decay, the label ops), its inputs, and the
 * run of the same steps on two models. */
#ifndef TP_TESTS_GPU_STEP_TESTUTIL_H
#define TP_TESTS_GPU_STEP_TESTUTIL_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <towerpack/towerpack.h>

/* x: uint8 [B,12,12] images, y: int32 [B] labels in [0,5) */
static const tp_input_desc_t stu_inputs[2] = {{"x", TP_UINT8, 3, {-1, 12, 12}},
                                              {"y", TP_INT32, 1, {-1}}};

static tp_status_t stu_cnn(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    int64_t shape[4] = {-1, 1, 12, 12};
    tp_node_t *x = tp_reshape(t, "img", tp_cast(t, "cast", in[0], 1.0f / 255), 4, shape);
    tp_node_t *h = tp_relu(t, NULL, tp_batch_norm(t, "bn1", tp_conv2d(t, "conv1", x, 8, 3, 1, -1, 0)));
    tp_node_t *skip = h;
    h = tp_leaky_relu(t, NULL, tp_conv2d(t, "conv2", h, 8, 3, 1, -1, 1), 0.1f);
    h = tp_add(t, "res", h, skip);
    tp_node_t *cat[2] = {h, skip};
    h = tp_max_pool(t, "pool", tp_concat(t, "cat", 2, cat), 2, 2, 0);
    h = tp_avg_pool(t, "apool", h, 3, 1, 1);
    h = tp_tanh(t, NULL, tp_global_avg_pool(t, "gap", h));
    h = tp_sigmoid(t, NULL, tp_fc(t, "fc1", tp_dropout(t, "drop", h, 0.2f), 32, 1));
    tp_node_t *logits = tp_fc(t, "fc2", tp_scale(t, "sc", h, 2.0f), 5, 1);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "acc", logits, in[1]));
    if (!tp_tower_is_training(t))
        return tp_tower_status(t);
    tp_node_t *cost = tp_add(t, "cost", tp_softmax_xent(t, "xent", logits, in[1]),
                             tp_l2_decay(t, "wd", "*/W", 1e-3f));
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

/* The whole-step tests' config: `towers` towers of 16, seed 42, one BLAS
 * thread, the CPU backend. */
static inline tp_model_config_t stu_config(int towers) {
    tp_model_config_t c = tp_model_config_default();
    c.towers = towers;
    c.batch = 16;
    c.seed = 42;
    c.threads = 1;
    return c;
}

/* Nesterov SGD (0.05, momentum 0.9) and Adam (0.01). */
static tp_optimizer_t *stu_nesterov(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.05, 0.9, 1);
}
static tp_optimizer_t *stu_adam(void *u) {
    (void)u;
    return tp_optimizer_adam(0.01, 0.9, 0.999, 1e-8);
}

/* The same `steps` steps on m0 and m1: random batches of 16 (of 7 at step
 * 4, a smaller batch in between), the learning rate lr0 * (1 - s / 10) set
 * on both before step s; after_step(s, arg) after each (may be NULL). */
static inline void stu_train_pair(tp_model_t *m0, tp_model_t *m1, int steps, double lr0,
                           void (*after_step)(int s, void *arg), void *arg) {
    tp_rng_t r;
    tp_rng_init(&r, 35, 0);
    static uint8_t x[16 * 144];
    static int32_t y[16];
    for (int s = 0; s < steps; s++) {
        int64_t b = s == 4 ? 7 : 16, xs[3] = {b, 12, 12}, ys[1] = {b};
        for (int i = 0; i < b * 144; i++)
            x[i] = (uint8_t)tp_rng_u64(&r);
        for (int i = 0; i < b; i++)
            y[i] = (int32_t)(tp_rng_u64(&r) % 5);
        tp_tensor_t in[2];
        tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, x, NULL, NULL);
        tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
        double lr = lr0 * (1.0 - s / 10.0);
        cr_assert_eq(tp_model_set_hparam(m0, "learning_rate", lr), TP_OK);
        cr_assert_eq(tp_model_set_hparam(m1, "learning_rate", lr), TP_OK);
        cr_assert_eq(tp_model_run(m0, 0, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        cr_assert_eq(tp_model_run(m1, 0, in, 2, NULL, 0, NULL), TP_OK, "step %d: %s",
                     s, tp_last_error());
        if (after_step)
            after_step(s, arg);
    }
}

/* A step of 16 whose row 3 has label 7, outside [0,5): it must fail,
 * naming the label (one step ahead, config.ahead, the step may return
 * before it ran: then what waits for it next fails, here reading a
 * variable). */
static inline void stu_bad_label_fails(tp_model_t *m) {
    static uint8_t x[16 * 144];
    int32_t y[16];
    for (int i = 0; i < 16; i++)
        y[i] = i % 5;
    y[3] = 7;
    int64_t xs[3] = {16, 12, 12}, ys[1] = {16};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    tp_status_t rc = tp_model_run(m, 0, in, 2, NULL, 0, NULL);
    if (rc == TP_OK) {
        tp_tensor_t v;
        rc = tp_model_var(m, tp_model_var_name(m, 0), &v);
    }
    cr_assert_lt(rc, 0);
    cr_assert(strstr(tp_last_error(), "label 7"), "%s", tp_last_error());
}

/* Step s's batch for tower i (16 random images and labels), the same for
 * every model of a test: x and y are the caller's, one per tower. */
static inline void stu_batch(int s, int i, uint8_t x[16 * 144], int32_t y[16],
                             tp_tensor_t in[2]) {
    tp_rng_t r;
    tp_rng_init(&r, 77 + (uint64_t)s, (uint64_t)i);
    for (int k = 0; k < 16 * 144; k++)
        x[k] = (uint8_t)tp_rng_u64(&r);
    for (int k = 0; k < 16; k++)
        y[k] = (int32_t)(tp_rng_u64(&r) % 5);
    int64_t xs[3] = {16, 12, 12}, ys[1] = {16};
    tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
}

/* A step as the replicated trainer runs it: each tower (at most 4) on a
 * thread of its own (forward, backward, its part of the all-reduce, its
 * slice of the update) on stu_batch(s, tower), then the update run that
 * closes the step. */
typedef struct {
    tp_model_t *m;
    int tower;
    tp_tensor_t in[2];
    tp_status_t rc;
    char err[256];
} stu_job_t;

static inline void *stu_tower_main(void *arg) {
    stu_job_t *j = arg;
    tp_run_opts_t o = {.stages = TP_RUN_TRAIN};
    j->rc = tp_model_run(j->m, j->tower, j->in, 2, NULL, 0, &o);
    snprintf(j->err, sizeof j->err, "%s", j->rc < 0 ? tp_last_error() : "");
    return NULL;
}

static inline void stu_step_threads(tp_model_t *m, int s) {
    static uint8_t x[4][16 * 144];
    static int32_t y[4][16];
    int n = tp_model_tower_count(m);
    cr_assert_leq(n, 4);
    stu_job_t jobs[4];
    pthread_t th[4];
    for (int i = 0; i < n; i++) {
        jobs[i] = (stu_job_t){.m = m, .tower = i};
        stu_batch(s, i, x[i], y[i], jobs[i].in);
        cr_assert_eq(pthread_create(&th[i], NULL, stu_tower_main, &jobs[i]), 0);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(jobs[i].rc, TP_OK, "step %d, tower%d: %s", s, i, jobs[i].err);
    }
    tp_run_opts_t o = {.stages = TP_RUN_UPDATE};
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &o), TP_OK,
                 "step %d: %s", s, tp_last_error());
}

#endif
