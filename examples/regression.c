/* Example: a regression with mean squared error. An MLP learns a known
 * function of two inputs from noisy samples,
 *
 *     y = sin(x1) + 0.5 x2^2,   x1, x2 uniform in [-2, 2],
 *
 * the training targets carrying Gaussian noise of standard deviation 0.1
 * (variance 0.01), the test targets none: the test MSE measures how well
 * the function itself was learned (the function's own variance over the
 * square is about 0.77, so predicting its mean scores 0.77).
 *
 *   build/bin/example-regression [--logdir DIR] [--tiny]
 *
 * It prints one JSON line, {"example":"regression","test_mse":...,
 * "bound":...}, the MSE over the whole test set (4096 points) computed by
 * the inference graph, and exits 1 when that is above the stated bound:
 * 0.005 after the full run (20 epochs of 250 steps, a few seconds), 0.01
 * after --tiny's 2 epochs of 150 (what the test example_regression runs). */
#include <math.h>
#include <towerpack/towerpack.h>
#include <towerpack/launch.h>
#include <towerpack/optim.h>
#include "common.h"

enum { TRAIN = 16384, TEST = 4096, BATCH = 64, HIDDEN = 64 };

/* A batch of points and their targets; dim 0 is the batch. */
static const tp_input_desc_t inputs[] = {
    {"x", TP_FLOAT32, 2, {-1, 2}},
    {"y", TP_FLOAT32, 2, {-1, 1}},
};

static double target(double x1, double x2) { return sin(x1) + 0.5 * x2 * x2; }

/* Two tanh layers of 64 and a linear output; the cost is the mean squared
 * error against y (tp_mse), which is also the metric validation reports. */
static tp_status_t tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *h = tp_tanh(t, NULL, tp_fc(t, "fc0", in[0], HIDDEN, 1));  /* [B,64] */
    h = tp_tanh(t, NULL, tp_fc(t, "fc1", h, HIDDEN, 1));                /* [B,64] */
    tp_node_t *pred = tp_fc(t, "linear", h, 1, 1);                      /* [B,1] */
    tp_node_t *cost = tp_mse(t, "mse", pred, in[1]);                     /* [] */
    tp_tower_add_output(t, "cost", cost);
    tp_tower_add_metric(t, "mse", cost);
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *optimizer(void *user) {
    (void)user;
    return tp_optimizer_adam(3e-3, 0.9, 0.999, 1e-8);
}

/* n points (x1, x2) uniform in [-2,2]^2 with target f(x) + N(0, noise^2),
 * as datapoints (x [2], y [1]); the caller owns the array and the points. */
static tp_datapoint_t **points(int n, uint64_t seed, double noise) {
    tp_datapoint_t **dps = calloc((size_t)n, sizeof *dps);
    if (!dps)
        return NULL;
    tp_rng_t r;
    tp_rng_init(&r, seed, 0);
    for (int i = 0; i < n; i++) {
        int64_t two[] = {2}, one[] = {1};
        dps[i] = tp_datapoint_new(2);
        tp_tensor_init(tp_datapoint_get(dps[i], 0), TP_FLOAT32, 1, two);
        tp_tensor_init(tp_datapoint_get(dps[i], 1), TP_FLOAT32, 1, one);
        float *x = tp_datapoint_get(dps[i], 0)->data, *y = tp_datapoint_get(dps[i], 1)->data;
        x[0] = (float)(4 * tp_rng_double(&r) - 2);
        x[1] = (float)(4 * tp_rng_double(&r) - 2);
        y[0] = (float)(target(x[0], x[1]) + noise * tp_rng_normal(&r));
    }
    return dps;
}

static int fail(const char *what) {
    fprintf(stderr, "example-regression: %s: %s\n", what, tp_last_error());
    return 1;
}

int main(int argc, char **argv) {
    example_args_t a = example_args(argc, argv, "train_log/example-regression");
    const double bound = a.tiny ? 0.01 : 0.005;
    tp_model_desc_t desc = {inputs, 2, tower, optimizer, NULL};

    tp_datapoint_t **train = points(TRAIN, 1, 0.1);
    if (!train)
        return fail("points");
    tp_dataflow_t *df = tp_df_batch(tp_df_from_list(train, TRAIN, 1), BATCH, 0);
    free(train);  /* the list took the points */

    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &desc;
    cfg.dataflow = df;
    cfg.batch = BATCH;
    cfg.infer_batch = TEST;  /* the whole test set in one inference run */
    cfg.logdir = a.logdir;
    cfg.logdir_action = TP_LOGDIR_DELETE;
    cfg.max_epoch = a.tiny ? 2 : 20;
    cfg.steps_per_epoch = a.tiny ? 150 : 250;
    tp_model_t *m = NULL;
    if (tp_launch_train_with_config(&cfg, &m) < 0)
        return fail("training");

    /* The test set: other points, no noise. The inference graph's "cost"
     * is tp_mse over the whole batch, i.e. the test MSE. */
    static float tx[TEST * 2], ty[TEST];
    tp_rng_t r;
    tp_rng_init(&r, 2, 0);
    for (int i = 0; i < TEST; i++) {
        tx[2 * i] = (float)(4 * tp_rng_double(&r) - 2);
        tx[2 * i + 1] = (float)(4 * tp_rng_double(&r) - 2);
        ty[i] = (float)target(tx[2 * i], tx[2 * i + 1]);
    }
    int64_t xs[2] = {TEST, 2}, ys[2] = {TEST, 1};
    tp_tensor_t feeds[2];
    tp_fetch_t out = {"cost", {0}};
    if (tp_tensor_init_wrap(&feeds[0], TP_FLOAT32, 2, xs, tx, NULL, NULL) < 0 ||
        tp_tensor_init_wrap(&feeds[1], TP_FLOAT32, 2, ys, ty, NULL, NULL) < 0 ||
        tp_model_run(m, -1, feeds, 2, &out, 1, &(tp_run_opts_t){.stages = TP_RUN_FORWARD}) < 0) {
        tp_model_destroy(&m);
        return fail("test");
    }
    double mse = *(const float *)out.value.data;  /* the CPU's memory */
    tp_model_destroy(&m);
    printf("{\"example\":\"regression\",\"epochs\":%lld,\"test_points\":%d,"
           "\"test_mse\":%.6f,\"bound\":%g}\n",
           (long long)(a.tiny ? 2 : 20), TEST, mse, bound);
    if (!(mse <= bound)) {
        fprintf(stderr, "example-regression: test MSE %.6f is above the bound %g\n", mse,
                bound);
        return 1;
    }
    return 0;
}
