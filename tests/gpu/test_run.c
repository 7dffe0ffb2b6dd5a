/* towerpack tests: tp_model_run, the one way to run a step, and each of its
 * options that can go wrong: forward only leaves the parameters alone, a
 * training step (one tower, every tower, or the phases one at a time) is
 * plain SGD computed here by hand, fetches give the named outputs, and a
 * bad option, feed count, fetch or cost name is refused before anything
 * runs, with a message naming it. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <towerpack/towerpack.h>

/* A softmax regression small enough to differentiate by hand:
 * logits = x @ W, x [B,3], W [3,2], cost = mean cross-entropy. */
#define B 4
#define F 3
#define K 2
#define LR 0.5

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    int64_t ws[2] = {F, K};
    tp_node_t *w = tp_variable(t, "W", 2, ws, (tp_init_t){TP_INIT_ZEROS, 0},
                               TP_VAR_TRAINABLE);
    tp_node_t *logits = tp_matmul(t, "logits", in[0], w);
    tp_tower_add_output(t, "logits", logits);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, tp_softmax_xent(t, "xent", logits, in[1]));
}

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(LR, 0.0, 0);
}

static const tp_input_desc_t s_desc[2] = {{"x", TP_FLOAT32, 2, {-1, F}},
                                          {"y", TP_INT32, 1, {-1}}};

/* W starts at fixed, distinct values (the same in `hand`). */
static const float s_w0[F * K] = {0.3f, -0.2f, 0.1f, 0.4f, -0.5f, 0.25f};

static tp_model_t *s_model(int towers) {
    tp_model_desc_t md = {s_desc, 2, s_tower, s_sgd, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = towers;
    cfg.batch = B;
    cfg.infer_batch = B;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    tp_tensor_t w;
    cr_assert_eq(tp_model_var(m, "W", &w), TP_OK);
    memcpy(w.data, s_w0, sizeof s_w0); /* CPU backend: host memory */
    return m;
}

/* Batch `s` of tower `tw`: fixed numbers, different per step and tower. */
static void s_batch(int s, int tw, float x[B * F], int32_t y[B], tp_tensor_t in[2]) {
    for (int i = 0; i < B * F; i++)
        x[i] = (float)sin(1.0 + 0.7 * i + 1.3 * s + 2.1 * tw);
    for (int i = 0; i < B; i++)
        y[i] = (i + s + tw) % K;
    int64_t xs[2] = {B, F}, ys[1] = {B};
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
}

/* One SGD step on rows x[n,F], y[n] in double: the gradient of the mean
 * cross-entropy is x^T (softmax(xW) - onehot(y)) / n. */
static void s_hand_step(double w[F * K], const float *x, const int32_t *y, int n) {
    double g[F * K] = {0};
    for (int i = 0; i < n; i++) {
        double l[K], mx = -1e300, sum = 0;
        for (int k = 0; k < K; k++) {
            l[k] = 0;
            for (int j = 0; j < F; j++)
                l[k] += x[i * F + j] * w[j * K + k];
            mx = l[k] > mx ? l[k] : mx;
        }
        for (int k = 0; k < K; k++)
            sum += (l[k] = exp(l[k] - mx));
        for (int k = 0; k < K; k++) {
            double d = (l[k] / sum - (y[i] == k)) / n;
            for (int j = 0; j < F; j++)
                g[j * K + k] += x[i * F + j] * d;
        }
    }
    for (int i = 0; i < F * K; i++)
        w[i] -= LR * g[i];
}

static void s_expect_w(tp_model_t *m, const double want[F * K], const char *what) {
    tp_tensor_t w;
    cr_assert_eq(tp_model_var(m, "W", &w), TP_OK);
    for (int i = 0; i < F * K; i++)
        cr_expect(fabs(((float *)w.data)[i] - want[i]) < 1e-5,
                  "%s: W[%d] is %.7f, by hand %.7f", what, i,
                  (double)((float *)w.data)[i], want[i]);
}

static void s_expect_w0(tp_model_t *m, const char *what) {
    double w0[F * K];
    for (int i = 0; i < F * K; i++)
        w0[i] = s_w0[i];
    s_expect_w(m, w0, what);
}

Test(run, forward_only_changes_no_parameter) {
    tp_model_t *m = s_model(1);
    float x[B * F];
    int32_t y[B];
    tp_tensor_t in[2];
    s_batch(0, 0, x, y, in);
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, &fwd), TP_OK, "%s",
                     tp_last_error());
        cr_assert_eq(tp_model_run(m, -1, in, 2, NULL, 0, &fwd), TP_OK, "%s",
                     tp_last_error());
    }
    s_expect_w0(m, "after forward runs");
    /* nor do gradients alone, and forward leaves no gradients to apply */
    tp_run_opts_t grads = {.stages = TP_RUN_GRADIENTS};
    cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, &grads), TP_OK);
    s_expect_w0(m, "after a gradients run");
    tp_tensor_t g;
    cr_assert_eq(tp_model_grad(m, 0, "W", &g), TP_OK);
    cr_expect_neq(((float *)g.data)[0], 0.0f);
    tp_model_destroy(&m);
}

/* The same SGD, three ways: a one-tower TP_RUN_TRAIN (the fused update),
 * a two-tower TP_RUN_TRAIN on TP_ALL_TOWERS, and the two-tower phases run
 * one at a time (gradients per tower, then reduce and update): each equals
 * SGD on all the step's rows computed by hand. */
Test(run, training_steps_equal_hand_written_sgd) {
    enum { STEPS = 6 };
    tp_model_t *one = s_model(1), *two = s_model(2), *phased = s_model(2);
    double w1[F * K], w2[F * K];
    for (int i = 0; i < F * K; i++)
        w1[i] = w2[i] = s_w0[i];
    float x[2][B * F];
    int32_t y[2][B];
    tp_tensor_t in[2][2]; /* tower 0's feeds, then tower 1's */
    tp_run_opts_t grads = {.stages = TP_RUN_GRADIENTS};
    tp_run_opts_t update = {.stages = TP_RUN_REDUCE | TP_RUN_UPDATE};
    for (int s = 0; s < STEPS; s++) {
        s_batch(s, 0, x[0], y[0], in[0]);
        s_batch(s, 1, x[1], y[1], in[1]);
        cr_assert_eq(tp_model_run(one, 0, in[0], 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        cr_assert_eq(tp_model_run(two, TP_ALL_TOWERS, in[0], 4, NULL, 0, NULL),
                     TP_OK, "%s", tp_last_error());
        for (int t = 0; t < 2; t++)
            cr_assert_eq(tp_model_run(phased, t, in[t], 2, NULL, 0, &grads), TP_OK,
                         "%s", tp_last_error());
        cr_assert_eq(tp_model_run(phased, TP_ALL_TOWERS, NULL, 0, NULL, 0, &update),
                     TP_OK, "%s", tp_last_error());
        s_hand_step(w1, x[0], y[0], B);
        /* two towers of B rows, averaged: the mean over 2B rows */
        float xx[2 * B * F];
        int32_t yy[2 * B];
        memcpy(xx, x[0], sizeof x[0]);
        memcpy(xx + B * F, x[1], sizeof x[1]);
        memcpy(yy, y[0], sizeof y[0]);
        memcpy(yy + B, y[1], sizeof y[1]);
        s_hand_step(w2, xx, yy, 2 * B);
        char what[64];
        snprintf(what, sizeof what, "one tower, step %d", s);
        s_expect_w(one, w1, what);
        snprintf(what, sizeof what, "two towers, step %d", s);
        s_expect_w(two, w2, what);
        snprintf(what, sizeof what, "two towers phased, step %d", s);
        s_expect_w(phased, w2, what);
    }
    tp_model_destroy(&one);
    tp_model_destroy(&two);
    tp_model_destroy(&phased);
}

Test(run, fetches_return_the_named_outputs) {
    tp_model_t *m = s_model(1);
    float x[B * F];
    int32_t y[B];
    tp_tensor_t in[2];
    s_batch(0, 0, x, y, in);
    tp_fetch_t f[3] = {{.name = "logits"}, {.name = "xent"}, {.name = "accuracy"}};
    cr_assert_eq(tp_model_run(m, 0, in, 2, f, 3, NULL), TP_OK, "%s", tp_last_error());
    /* the forward of the step saw W before its update */
    cr_assert_eq(f[0].value.dtype, TP_FLOAT32);
    cr_assert_eq(f[0].value.ndim, 2);
    cr_expect_eq(f[0].value.shape[0], B);
    cr_expect_eq(f[0].value.shape[1], K);
    const float *logits = f[0].value.data;
    double xent = 0;
    int right = 0;
    for (int i = 0; i < B; i++) {
        double l[K], mx = -1e300, sum = 0;
        for (int k = 0; k < K; k++) {
            l[k] = 0;
            for (int j = 0; j < F; j++)
                l[k] += x[i * F + j] * s_w0[j * K + k];
            cr_expect(fabs(logits[i * K + k] - l[k]) < 1e-5, "logits[%d][%d] %f, "
                      "by hand %f", i, k, (double)logits[i * K + k], l[k]);
            mx = l[k] > mx ? l[k] : mx;
        }
        for (int k = 0; k < K; k++)
            sum += exp(l[k] - mx);
        xent += (mx + log(sum) - l[y[i]]) / B;
        right += (l[1] > l[0]) == (y[i] == 1);
    }
    cr_expect(fabs(*(float *)f[1].value.data - xent) < 1e-5, "xent %f, by hand %f",
              (double)*(float *)f[1].value.data, xent);
    cr_expect(fabs(*(float *)f[2].value.data - (double)right / B) < 1e-6);
    /* the inference graph's own outputs, on fewer rows than planned */
    in[0].shape[0] = in[1].shape[0] = 3;
    in[0].nbytes = 3 * F * sizeof(float);
    in[1].nbytes = 3 * sizeof(int32_t);
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, -1, in, 2, f, 1, &fwd), TP_OK, "%s", tp_last_error());
    cr_expect_eq(f[0].value.shape[0], 3);
    tp_model_destroy(&m);
}

static void s_expect_error(tp_model_t *m, int tower, const tp_tensor_t *in,
                           int nin, tp_fetch_t *f, int nf, unsigned stages,
                           const char *cost, tp_status_t want, const char *needle) {
    tp_run_opts_t o = {.stages = stages, .cost = cost};
    tp_status_t rc = tp_model_run(m, tower, in, nin, f, nf, &o);
    cr_expect_eq(rc, want, "stages 0x%x, cost %s: %s, expected %s", stages,
                 cost ? cost : "(main)", tp_strerror(rc), tp_strerror(want));
    cr_expect(strstr(tp_last_error(), needle) != NULL, "'%s' not in: %s", needle,
              tp_last_error());
}

Test(run, bad_options_are_refused_by_name_before_anything_runs) {
    tp_model_t *m = s_model(1);
    float x[B * F];
    int32_t y[B];
    tp_tensor_t in[2];
    s_batch(0, 0, x, y, in);
    tp_fetch_t ok = {.name = "logits"}, bad[2] = {{.name = "logits"}, {.name = "logitz"}};
    const unsigned T = TP_RUN_TRAIN;
    /* stages: not a contiguous range, backward without a forward held,
     * unknown bits */
    s_expect_error(m, 0, in, 2, NULL, 0, TP_RUN_FORWARD | TP_RUN_UPDATE, NULL,
                   TP_ERR_INVALID, "stages 0x9");
    s_expect_error(m, 0, NULL, 0, NULL, 0, TP_RUN_BACKWARD, NULL, TP_ERR_STATE,
                   "holds no forward");
    s_expect_error(m, 0, in, 2, NULL, 0, 0x10, NULL, TP_ERR_INVALID, "stages 0x10");
    /* the inference graph has no backward */
    s_expect_error(m, -1, in, 2, NULL, 0, TP_RUN_GRADIENTS, NULL, TP_ERR_INVALID,
                   "inference");
    /* towers, feeds, fetches, costs */
    s_expect_error(m, 5, in, 2, NULL, 0, T, NULL, TP_ERR_INVALID, "tower 5");
    s_expect_error(m, 0, in, 1, NULL, 0, T, NULL, TP_ERR_SHAPE, "1 feeds");
    s_expect_error(m, 0, in, 2, NULL, 0, TP_RUN_UPDATE, NULL, TP_ERR_INVALID,
                   "without TP_RUN_FORWARD");
    s_expect_error(m, 0, in, 2, bad, 2, T, NULL, TP_ERR_NOT_FOUND, "'logitz'");
    s_expect_error(m, 0, in, 2, NULL, 0, T, "kost", TP_ERR_NOT_FOUND, "'kost'");
    s_expect_error(m, 0, in, 2, &ok, -1, T, NULL, TP_ERR_INVALID, "-1 fetches");
    /* none of them ran a step, or left gradients behind */
    s_expect_w0(m, "after refused runs");
    s_expect_error(m, 0, NULL, 0, NULL, 0, TP_RUN_UPDATE, NULL, TP_ERR_STATE,
                   "no fresh gradients");
    /* the same model runs fine afterwards */
    cr_assert_eq(tp_model_run(m, 0, in, 2, &ok, 1, NULL), TP_OK, "%s", tp_last_error());
    tp_model_destroy(&m);
}

/* Of every set of stage bits, exactly the contiguous ranges of forward,
 * backward, reduce, update are runs: F, FB, FBR, FBRU, B, BR, BRU (over the
 * held forward), R, RU, U. Every other set is refused for its stages (a run
 * that is a range may still fail for another reason: no fresh gradients,
 * no forward held). */
Test(run, exactly_the_contiguous_stage_ranges_are_runs) {
    tp_model_t *m = s_model(1);  /* one tower: a reduce waits for no other */
    float x[B * F];
    int32_t y[B];
    tp_tensor_t in[2];
    s_batch(0, 0, x, y, in);
    const unsigned Fw = TP_RUN_FORWARD, Bw = TP_RUN_BACKWARD, R = TP_RUN_REDUCE,
                   U = TP_RUN_UPDATE;
    const unsigned ranges[] = {Fw, Fw | Bw, Fw | Bw | R, Fw | Bw | R | U, Bw, Bw | R,
                               Bw | R | U, R, R | U, U};
    for (unsigned st = 1; st < 64; st++) {
        int range = 0;
        for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++)
            range |= st == ranges[i];
        tp_run_opts_t o = {.stages = st};
        int fwd = (st & Fw) != 0;
        tp_status_t rc = tp_model_run(m, 0, fwd ? in : NULL, fwd ? 2 : 0, NULL, 0, &o);
        int refused = rc < 0 && strstr(tp_last_error(), "contiguous range") != NULL;
        cr_expect_eq(refused, !range, "stages 0x%x: %s (%s)", st, tp_strerror(rc),
                     rc < 0 ? tp_last_error() : "ran");
        if (refused)
            cr_expect_eq(rc, TP_ERR_INVALID);
    }
    tp_model_destroy(&m);
}

/* Towers that apply their slices leave a step only the update run on
 * TP_ALL_TOWERS may close; with some slices missing it says which tower. */
Test(run, an_unfinished_sliced_step_names_the_missing_tower) {
    tp_model_t *m = s_model(2);
    float x[B * F];
    int32_t y[B];
    tp_tensor_t in[2];
    s_batch(0, 0, x, y, in);
    tp_run_opts_t grads = {.stages = TP_RUN_GRADIENTS};
    tp_run_opts_t slice = {.stages = TP_RUN_UPDATE};
    tp_run_opts_t close = {.stages = TP_RUN_UPDATE};
    cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, &grads), TP_OK);
    cr_assert_eq(tp_model_run(m, 1, in, 2, NULL, 0, &grads), TP_OK);
    /* tower 0's slice only (the all-reduce was skipped: one thread here) */
    cr_assert_eq(tp_model_run(m, 0, NULL, 0, NULL, 0, &slice), TP_OK, "%s",
                 tp_last_error());
    cr_expect_eq(tp_model_run(m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &close),
                 TP_ERR_STATE);
    cr_expect(strstr(tp_last_error(), "tower1 has not applied its slice"), "%s",
              tp_last_error());
    cr_assert_eq(tp_model_run(m, 1, NULL, 0, NULL, 0, &slice), TP_OK);
    cr_expect_eq(tp_model_run(m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &close), TP_OK,
                 "%s", tp_last_error());
    tp_model_destroy(&m);
}

/* stage_ns times a run's two halves: forward+backward, and reduce+update;
 * a forward-only run spends nothing in the second. */
Test(run, stage_ns_times_compute_and_reduce) {
    tp_model_t *m = s_model(2);
    float x[2][B * F];
    int32_t y[2][B];
    tp_tensor_t in[4];
    s_batch(0, 0, x[0], y[0], in);
    s_batch(0, 1, x[1], y[1], in + 2);
    uint64_t ns[2] = {123, 456};
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD, .stage_ns = ns};
    cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, &fwd), TP_OK, "%s", tp_last_error());
    cr_assert_gt(ns[0], 0);
    cr_assert_eq(ns[1], 0, "forward only: no reduce or update");
    tp_run_opts_t train = {.stages = TP_RUN_TRAIN, .stage_ns = ns};
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, in, 4, NULL, 0, &train), TP_OK, "%s",
                 tp_last_error());
    cr_assert_gt(ns[0], 0);
    cr_assert_gt(ns[1], 0, "a training step reduces and updates");
    tp_model_destroy(&m);
}
