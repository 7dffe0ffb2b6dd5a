/* towerpack tests: graph building (variables, scopes, shape errors), the
 * model executor (XOR, towers, all-reduce, determinism, inference graph). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <towerpack/towerpack.h>

/* tp_model_run with only its stages set (every model here has 2 inputs). */
static tp_status_t s_run(tp_model_t *m, int tower, const tp_tensor_t *in,
                         unsigned stages) {
    tp_run_opts_t o = {.stages = stages};
    return tp_model_run(m, tower, in, in ? 2 : 0, NULL, 0, &o);
}

/* ---- XOR ------------------------------------------------------------------ */

static tp_status_t s_xor(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *h = tp_tanh(t, "h", tp_fc(t, "fc1", in[0], 8, 1));
    tp_node_t *logits = tp_fc(t, "fc2", h, 2, 1);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "acc", logits, in[1]));
    if (!tp_tower_is_training(t))
        return tp_tower_status(t);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

static tp_optimizer_t *s_adam(void *u) {
    (void)u;
    return tp_optimizer_adam(0.05, 0.9, 0.999, 1e-8);
}

Test(graph, tiny_mlp_learns_xor) {
    tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, 2}},
                               {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_xor, s_adam, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 4;
    cfg.infer_batch = 4;
    cfg.seed = 3;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    float x[8] = {0, 0, 0, 1, 1, 0, 1, 1};
    int32_t y[4] = {0, 1, 1, 0};
    int64_t xs[2] = {4, 2}, ys[1] = {4};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    for (int i = 0; i < 300; i++)
        cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
    tp_tensor_t cost;
    cr_assert_eq(tp_model_fetch(m, 0, "cost", &cost), TP_OK);
    cr_expect_lt(*(float *)cost.data, 0.05f, "XOR cost %f", *(float *)cost.data);
    /* the CPU backend's views are host memory: read in place, no copy */
    cr_expect_eq(tp_model_view_host(m, &cost, NULL, sizeof(float)), cost.data);
    cr_assert_eq(s_run(m, -1, in, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
    cr_expect_eq(tp_model_metric_count(m, -1), 1);
    cr_expect_str_eq(tp_model_metric_name(m, -1, 0), "accuracy");
    cr_expect_float_eq(tp_model_metric_value(m, -1, 0), 1.0f, 1e-6);
    tp_model_destroy(&m);
    cr_expect_null(m);
}

/* ---- towers ------------------------------------------------------------- */

#define FEAT 6
#define CLS 3

static tp_status_t s_mlp(tp_tower_t *t, tp_node_t *const *in, void *u) {
    int dropout = u != NULL;
    tp_node_t *h = tp_relu(t, NULL, tp_fc(t, "fc1", in[0], 16, 1));
    if (dropout)
        h = tp_dropout(t, "drop", h, 0.5f);
    tp_node_t *logits = tp_fc(t, "fc2", h, CLS, 1);
    tp_node_t *cost = tp_add(t, "cost", tp_softmax_xent(t, "xent", logits, in[1]),
                             tp_l2_decay(t, "wd", "*/W", 1e-2f));
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.1, 0.9, 1);
}

static void s_data(int n, float *x, int32_t *y, uint64_t seed) {
    tp_rng_t r;
    tp_rng_init(&r, seed, 0);
    for (int i = 0; i < n * FEAT; i++)
        x[i] = (float)tp_rng_normal(&r);
    for (int i = 0; i < n; i++)
        y[i] = (int32_t)tp_rng_below(&r, CLS);
}

static tp_model_t *s_new_mlp(int towers, int batch, void *user) {
    tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, FEAT}},
                               {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_mlp, s_sgd, user};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = towers;
    cfg.batch = batch;
    cfg.seed = 11;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

static void s_inputs(tp_tensor_t in[2], float *x, int32_t *y, int n) {
    int64_t xs[2] = {n, FEAT}, ys[1] = {n};
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
}

Test(graph, two_towers_match_one_tower_of_double_batch) {
    enum { B = 8, STEPS = 4 };
    tp_model_t *two = s_new_mlp(2, B, NULL), *one = s_new_mlp(1, 2 * B, NULL);
    float x[2 * B * FEAT];
    int32_t y[2 * B];
    for (int s = 0; s < STEPS; s++) {
        s_data(2 * B, x, y, 100 + (uint64_t)s);
        tp_tensor_t a[2], b[2], full[2];
        s_inputs(a, x, y, B);
        s_inputs(b, x + B * FEAT, y + B, B);
        s_inputs(full, x, y, 2 * B);
        tp_tensor_t ab[4] = {a[0], a[1], b[0], b[1]};
        cr_assert_eq(tp_model_run(two, TP_ALL_TOWERS, ab, 4, NULL, 0, NULL), TP_OK,
                     "%s", tp_last_error());
        cr_assert_eq(tp_model_run(one, 0, full, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
    }
    cr_assert_eq(tp_model_var_count(one), tp_model_var_count(two));
    for (int i = 0; i < tp_model_var_count(one); i++) {
        const char *name = tp_model_var_name(one, i);
        tp_tensor_t v1, v2;
        cr_assert_eq(tp_model_var(one, name, &v1), TP_OK);
        cr_assert_eq(tp_model_var(two, name, &v2), TP_OK);
        for (size_t k = 0; k < tp_tensor_numel(&v1); k++) {
            float p = ((float *)v1.data)[k], q = ((float *)v2.data)[k];
            cr_assert(fabsf(p - q) <= 1e-5f + 1e-4f * fabsf(p),
                      "%s[%zu]: one tower %g, two towers %g", name, k, p, q);
        }
    }
    tp_model_destroy(&two);
    tp_model_destroy(&one);
}

/* What a trainer hands its callbacks: the mean of a fetch over the
 * towers (each tower's own cost on its own half of the batch), and none
 * for a name no tower gives. */
Test(graph, fetch_mean_is_the_towers_mean) {
    enum { B = 8 };
    tp_model_t *m = s_new_mlp(2, B, NULL);
    float x[2 * B * FEAT];
    int32_t y[2 * B];
    s_data(2 * B, x, y, 7);
    for (int i = 0; i < 2 * B; i++)  /* the towers' halves differ */
        if (i >= B)
            x[i * FEAT] += 3.0f;
    tp_tensor_t a[2], b[2];
    s_inputs(a, x, y, B);
    s_inputs(b, x + B * FEAT, y + B, B);
    tp_tensor_t ab[4] = {a[0], a[1], b[0], b[1]};
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, ab, 4, NULL, 0, NULL), TP_OK, "%s",
                 tp_last_error());
    double c[2];
    for (int t = 0; t < 2; t++) {
        tp_tensor_t v;
        cr_assert_eq(tp_model_fetch(m, t, "cost", &v), TP_OK);
        c[t] = ((const float *)v.data)[0];
        tp_tensor_fini(&v);
    }
    cr_assert(c[0] != c[1], "the towers' costs should differ: %g", c[0]);
    double mean = -1;
    cr_assert_eq(tp_model_fetch_mean(m, 2, "cost", &mean), 2);
    cr_assert_float_eq(mean, (c[0] + c[1]) / 2, 1e-12);
    cr_assert_eq(tp_model_fetch_mean(m, 1, "cost", &mean), 1);
    cr_assert_float_eq(mean, c[0], 1e-12);
    mean = -1;
    cr_assert_eq(tp_model_fetch_mean(m, 2, "no_such_output", &mean), 0);
    cr_assert_eq(mean, -1, "untouched when no tower gives it");
    tp_clear_error();
    tp_model_destroy(&m);
}

typedef struct {
    tp_model_t *m;
    int tower;
    tp_tensor_t *in;
    tp_status_t rc;
    int apply;  /* also update the tower's slice of the variables */
} s_job_t;

/* A tower's thread: forward, backward, the collective all-reduce and,
 * with apply, its slice of the update: one run. */
static void *s_tower_thread(void *arg) {
    s_job_t *j = arg;
    j->rc = s_run(j->m, j->tower, j->in,
                  j->apply ? TP_RUN_TRAIN
                           : TP_RUN_FORWARD | TP_RUN_BACKWARD | TP_RUN_REDUCE);
    return NULL;
}

/* Every variable of seq is bit-identical in par. */
static void s_assert_same_vars(tp_model_t *seq, tp_model_t *par) {
    for (int i = 0; i < tp_model_var_count(seq); i++) {
        tp_tensor_t v1, v2;
        cr_assert_eq(tp_model_var(seq, tp_model_var_name(seq, i), &v1), TP_OK);
        cr_assert_eq(tp_model_var(par, tp_model_var_name(seq, i), &v2), TP_OK);
        cr_assert(tp_tensor_equal(&v1, &v2), "%s differs", tp_model_var_name(seq, i));
    }
}

/* Towers on their own threads with the collective all-reduce give exactly
 * what one thread driving both gives (sums in rank order). */
Test(graph, threaded_towers_collective_allreduce_is_bit_exact) {
    enum { B = 8 };
    tp_model_t *seq = s_new_mlp(2, B, NULL), *par = s_new_mlp(2, B, NULL);
    float x[2 * B * FEAT];
    int32_t y[2 * B];
    for (int s = 0; s < 3; s++) {
        s_data(2 * B, x, y, 7 + (uint64_t)s);
        tp_tensor_t a[2], b[2];
        s_inputs(a, x, y, B);
        s_inputs(b, x + B * FEAT, y + B, B);
        cr_assert_eq(s_run(seq, 0, a, TP_RUN_GRADIENTS), TP_OK);
        cr_assert_eq(s_run(seq, 1, b, TP_RUN_GRADIENTS), TP_OK);
        cr_assert_eq(s_run(seq, TP_ALL_TOWERS, NULL, TP_RUN_REDUCE | TP_RUN_UPDATE),
                     TP_OK, "%s", tp_last_error());
        s_job_t jobs[2] = {{par, 0, a, 0, 0}, {par, 1, b, 0, 0}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&th[i], NULL, s_tower_thread, &jobs[i]);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        cr_assert_eq(jobs[0].rc, TP_OK, "%s", tp_last_error());
        cr_assert_eq(jobs[1].rc, TP_OK);
        /* replicated: both towers hold the same averaged gradient */
        tp_tensor_t g0, g1;
        cr_assert_eq(tp_model_grad(par, 0, "fc1/W", &g0), TP_OK);
        cr_assert_eq(tp_model_grad(par, 1, "fc1/W", &g1), TP_OK);
        cr_assert(tp_tensor_equal(&g0, &g1));
        cr_assert_eq(s_run(par, TP_ALL_TOWERS, NULL, TP_RUN_UPDATE), TP_OK, "%s",
                     tp_last_error());
    }
    s_assert_same_vars(seq, par);
    tp_model_destroy(&seq);
    tp_model_destroy(&par);
}

/* Three towers each updating their slice of the variables (uneven: the
 * variable count is not a multiple of 3) give exactly what one apply of
 * the all-reduced gradients gives, step after step (momentum slots too);
 * and a step whose slices were applied is closed by an update run on
 * TP_ALL_TOWERS. */
Test(graph, towers_applying_slices_match_one_apply) {
    enum { B = 4, T = 3 };
    tp_model_t *seq = s_new_mlp(T, B, NULL), *par = s_new_mlp(T, B, NULL);
    float x[T * B * FEAT];
    int32_t y[T * B];
    for (int s = 0; s < 4; s++) {
        s_data(T * B, x, y, 31 + (uint64_t)s);
        tp_tensor_t in[T][2];
        for (int i = 0; i < T; i++) {
            s_inputs(in[i], x + i * B * FEAT, y + i * B, B);
            cr_assert_eq(s_run(seq, i, in[i], TP_RUN_GRADIENTS), TP_OK);
        }
        cr_assert_eq(s_run(seq, TP_ALL_TOWERS, NULL, TP_RUN_REDUCE | TP_RUN_UPDATE),
                     TP_OK, "%s", tp_last_error());
        s_job_t jobs[T];
        pthread_t th[T];
        for (int i = 0; i < T; i++) {
            jobs[i] = (s_job_t){par, i, in[i], 0, 1};
            pthread_create(&th[i], NULL, s_tower_thread, &jobs[i]);
        }
        for (int i = 0; i < T; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < T; i++)
            cr_assert_eq(jobs[i].rc, TP_OK, "tower %d", i);
        cr_assert_eq(s_run(par, TP_ALL_TOWERS, NULL, TP_RUN_UPDATE), TP_OK, "%s",
                     tp_last_error());
        cr_assert_eq(s_run(par, TP_ALL_TOWERS, NULL, TP_RUN_UPDATE), TP_ERR_STATE,
                     "gradients are used once");
    }
    s_assert_same_vars(seq, par);
    tp_model_destroy(&seq);
    tp_model_destroy(&par);
}

Test(graph, aborted_collective_does_not_hang) {
    tp_model_t *m = s_new_mlp(2, 4, NULL);
    float x[4 * FEAT];
    int32_t y[4];
    s_data(4, x, y, 9);
    tp_tensor_t in[2];
    s_inputs(in, x, y, 4);
    /* tower 1 fails (one feed of two) and will never contribute: its run
     * releases the collective, which tower 0 would otherwise wait in */
    tp_run_opts_t o = {.stages = TP_RUN_FORWARD | TP_RUN_BACKWARD | TP_RUN_REDUCE};
    cr_expect_eq(tp_model_run(m, 1, in, 1, NULL, 0, &o), TP_ERR_SHAPE);
    cr_expect_eq(tp_model_run(m, 0, in, 2, NULL, 0, &o), TP_ERR_INTERRUPTED);
    tp_model_destroy(&m);
}

Test(graph, gradients_are_used_once) {
    tp_model_t *m = s_new_mlp(1, 4, NULL);
    float x[4 * FEAT];
    int32_t y[4];
    s_data(4, x, y, 9);
    tp_tensor_t in[2];
    s_inputs(in, x, y, 4);
    cr_expect_eq(s_run(m, 0, NULL, TP_RUN_UPDATE), TP_ERR_STATE);
    cr_assert_eq(s_run(m, 0, in, TP_RUN_FORWARD), TP_OK);
    cr_expect_eq(s_run(m, 0, NULL, TP_RUN_UPDATE), TP_ERR_STATE);
    cr_assert_eq(s_run(m, 0, in, TP_RUN_GRADIENTS), TP_OK);
    cr_assert_eq(s_run(m, 0, in, TP_RUN_FORWARD), TP_OK); /* leaves gradients */
    cr_expect_eq(s_run(m, 0, NULL, TP_RUN_UPDATE), TP_OK);
    cr_expect_eq(s_run(m, 0, NULL, TP_RUN_UPDATE), TP_ERR_STATE);
    cr_expect(strstr(tp_last_error(), "tower0") != NULL, "%s", tp_last_error());
    tp_model_destroy(&m);
}

Test(graph, same_seed_same_result_with_dropout) {
    enum { B = 8 };
    int on = 1;
    tp_model_t *m1 = s_new_mlp(1, B, &on), *m2 = s_new_mlp(1, B, &on);
    float x[B * FEAT];
    int32_t y[B];
    for (int s = 0; s < 5; s++) {
        s_data(B, x, y, 50 + (uint64_t)s);
        tp_tensor_t in[2];
        s_inputs(in, x, y, B);
        cr_assert_eq(s_run(m1, 0, in, TP_RUN_TRAIN), TP_OK, "%s", tp_last_error());
        cr_assert_eq(s_run(m2, 0, in, TP_RUN_TRAIN), TP_OK);
    }
    tp_tensor_t a, b;
    cr_assert_eq(tp_model_var(m1, "fc1/W", &a), TP_OK);
    cr_assert_eq(tp_model_var(m2, "fc1/W", &b), TP_OK);
    cr_expect(tp_tensor_equal(&a, &b));
    tp_model_destroy(&m1);
    tp_model_destroy(&m2);
}

Test(graph, smaller_batch_than_planned) {
    tp_model_t *m = s_new_mlp(1, 16, NULL);
    float x[5 * FEAT];
    int32_t y[5];
    s_data(5, x, y, 1);
    tp_tensor_t in[2];
    s_inputs(in, x, y, 5);
    cr_assert_eq(s_run(m, 0, in, TP_RUN_GRADIENTS), TP_OK, "%s", tp_last_error());
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, 0, "fc2/output", &v), TP_OK);
    cr_expect_eq(v.shape[0], 5);
    /* too large a batch, a wrong dtype, a wrong trailing dim */
    float big[17 * FEAT];
    int32_t ybig[17];
    s_inputs(in, big, ybig, 17);
    cr_expect_eq(s_run(m, 0, in, TP_RUN_GRADIENTS), TP_ERR_SHAPE);
    cr_expect(strstr(tp_last_error(), "planned") != NULL, "%s", tp_last_error());
    s_inputs(in, x, y, 5);
    in[1].dtype = TP_INT64;
    cr_expect_eq(s_run(m, 0, in, TP_RUN_GRADIENTS), TP_ERR_SHAPE);
    cr_expect(strstr(tp_last_error(), "'y'") != NULL, "%s", tp_last_error());
    /* the message names what the model takes */
    cr_expect(strstr(tp_last_error(), "the model takes int32[batch]") != NULL, "%s",
              tp_last_error());
    cr_expect_eq(s_run(m, 3, in, TP_RUN_GRADIENTS), TP_ERR_INVALID);
    tp_model_destroy(&m);
}

Test(graph, hyper_parameters_by_name) {
    tp_model_t *m = s_new_mlp(1, 4, NULL);
    double v = 0;
    cr_expect_eq(tp_model_get_hparam(m, "learning_rate", &v), TP_OK);
    cr_expect_float_eq(v, 0.1, 1e-12);
    cr_expect_eq(tp_model_set_hparam(m, "learning_rate", 0.01), TP_OK);
    cr_expect_eq(tp_model_get_hparam(m, "learning_rate", &v), TP_OK);
    cr_expect_float_eq(v, 0.01, 1e-12);
    cr_expect_eq(tp_model_set_hparam(m, "warp_speed", 1), TP_ERR_NOT_FOUND);
    cr_expect(strstr(tp_last_error(), "momentum") != NULL);
    cr_expect_eq(tp_model_set_hparam(m, "momentum", 2.0), TP_ERR_INVALID);
    tp_model_destroy(&m);
}

/* ---- build errors ------------------------------------------------------- */

static int s_case;

static tp_status_t s_bad(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    int64_t ws[2] = {5, 3};
    switch (s_case) {
    case 0: { /* inner dimension mismatch */
        tp_node_t *w = tp_variable(t, "W", 2, ws, (tp_init_t){0, 0}, 0);
        return tp_tower_set_cost(t, tp_softmax_xent(t, "xent",
                                 tp_matmul(t, "proj", in[0], w), in[1]));
    }
    case 1: /* one variable twice in one tower */
        tp_fc(t, "fc", in[0], 3, 1);
        tp_fc(t, "fc", in[0], 3, 1);
        return tp_tower_status(t);
    case 2: /* tower 1 makes a variable tower 0 did not */
        if (tp_tower_index(t) == 1)
            tp_fc(t, "extra", in[0], 3, 1);
        return tp_tower_set_cost(t, tp_softmax_xent(t, "xent",
                                 tp_fc(t, "fc", in[0], 3, 1), in[1]));
    case 3: /* no cost */
        tp_fc(t, "fc", in[0], 3, 1);
        return TP_OK;
    case 4: /* conv on a 2-d input */
        return tp_tower_set_cost(t, tp_softmax_xent(t, "xent",
                                 tp_conv2d(t, "conv1", in[0], 4, 3, 1, -1, 1), in[1]));
    case 5: { /* same variable name with another shape in a later tower */
        int64_t s2[2] = {FEAT, tp_tower_index(t) + 2};
        tp_node_t *w = tp_variable(t, "W", 2, s2, (tp_init_t){0, 0}, 0);
        return tp_tower_set_cost(t, tp_softmax_xent(t, "xent",
                                 tp_matmul(t, "mm", in[0], w), in[1]));
    }
    case 7: /* a transposed conv on a 2-d input */
        tp_conv2d_transpose(t, "up", in[0], 4, 3, 1, 1, 0, 1);
        return tp_tower_status(t);
    case 8: /* a layer given no input */
        tp_batch_norm(t, "bn", NULL);
        return tp_tower_status(t);
    default: /* a duplicate node name */
        tp_relu(t, "r", in[0]);
        tp_relu(t, "r", in[0]);
        return tp_tower_status(t);
    }
}

static void s_expect_build_error(int which, int towers, const char *needle) {
    s_case = which;
    tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, FEAT}},
                               {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_bad, s_sgd, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = towers;
    cfg.batch = 4;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_expect_null(m, "case %d built", which);
    cr_expect(strstr(tp_last_error(), needle) != NULL,
              "case %d: '%s' lacks '%s'", which, tp_last_error(), needle);
    tp_model_destroy(&m);
}

Test(graph_errors, shape_mismatch_names_the_node) {
    s_expect_build_error(0, 1, "proj");
}
Test(graph_errors, variable_twice_in_one_tower) {
    s_expect_build_error(1, 1, "fc/W");
}
Test(graph_errors, later_tower_creates_a_variable) {
    s_expect_build_error(2, 2, "extra/W");
}
Test(graph_errors, missing_cost) { s_expect_build_error(3, 1, "cost"); }
Test(graph_errors, conv_needs_nchw) { s_expect_build_error(4, 1, "conv1"); }
Test(graph_errors, variable_shape_differs_across_towers) {
    s_expect_build_error(5, 2, "tower1");
}
Test(graph_errors, duplicate_node_name) { s_expect_build_error(6, 1, "'r'"); }

/* The layers' common opening (s_layer_scope, s_conv_vars) names the layer
 * and what is wrong with its input; the plain conv adds the usual fix. */
Test(graph_errors, layers_name_a_wrong_input) {
    s_expect_build_error(4, 1, "'conv1': a conv needs a [N,C,H,W] input (rank 4), got [4,");
    s_expect_build_error(4, 1, "(rank 2): reshape it first");
    s_expect_build_error(7, 1, "'up': a transposed conv needs a [N,C,H,W] input (rank 4)");
    s_expect_build_error(8, 1, "'bn': input is NULL");
}

Test(graph_errors, bad_descriptions) {
    tp_model_desc_t md = {NULL, 0, NULL, NULL, NULL};
    cr_expect_null(tp_model_new(&md, NULL));
    tp_input_desc_t desc[1] = {{"x", TP_FLOAT32, 2, {-1, 0}}};
    tp_model_desc_t md2 = {desc, 1, s_bad, NULL, NULL};
    cr_expect_null(tp_model_new(&md2, NULL));
    cr_expect(strstr(tp_last_error(), "'x'") != NULL);
}

/* ---- a small CNN builds, shares variables and runs ------------------------ */

static tp_status_t s_cnn(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    int64_t shape[4] = {-1, 1, 8, 8};
    tp_node_t *x = tp_reshape(t, "img", tp_cast(t, "cast", in[0], 1.0f / 255), 4, shape);
    tp_node_t *h = tp_relu(t, NULL, tp_batch_norm(t, "bn1", tp_conv2d(t, "conv1", x, 4, 3, 1, -1, 0)));
    tp_node_t *skip = h;
    h = tp_relu(t, NULL, tp_conv2d(t, "conv2", h, 4, 3, 1, -1, 1));
    h = tp_add(t, "res", h, skip);
    tp_node_t *cat[2] = {h, skip};
    h = tp_max_pool(t, "pool", tp_concat(t, "cat", 2, cat), 2, 2, 0);
    h = tp_global_avg_pool(t, "gap", h);
    tp_node_t *logits = tp_fc(t, "fc", tp_dropout(t, "drop", h, 0.2f), 3, 1);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "acc", logits, in[1]));
    if (!tp_tower_is_training(t))
        return tp_tower_status(t);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "xent", logits, in[1]));
}

Test(graph, cnn_towers_share_variables) {
    tp_input_desc_t desc[2] = {{"x", TP_UINT8, 3, {-1, 8, 8}},
                               {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_cnn, s_adam, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 2;
    cfg.batch = 4;
    cfg.infer_batch = 6;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    /* conv1 W, bn1 gamma/beta/mean/var, conv2 W/b, fc W/b */
    cr_expect_eq(tp_model_var_count(m), 9);
    int model_only = 0;
    for (int i = 0; i < tp_model_var_count(m); i++)
        model_only += !tp_model_var_trainable(m, i);
    cr_expect_eq(model_only, 2);
    uint8_t x[4 * 64];
    int32_t y[4] = {0, 1, 2, 1};
    for (int i = 0; i < 4 * 64; i++)
        x[i] = (uint8_t)(i * 37);
    int64_t xs[3] = {4, 8, 8}, ys[1] = {4};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    tp_tensor_t step[4] = {in[0], in[1], in[0], in[1]}; /* both towers' */
    tp_tensor_t w0, w1;
    cr_assert_eq(tp_model_var(m, "conv2/W", &w0), TP_OK);
    float before = ((float *)w0.data)[0];
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, step, 4, NULL, 0, NULL), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_var(m, "conv2/W", &w1), TP_OK);
    cr_expect_neq(before, ((float *)w1.data)[0]);
    cr_assert_eq(s_run(m, -1, in, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
    cr_expect_gt(tp_model_memory(m), 0);
    tp_model_destroy(&m);
}

Test(graph, per_op_profile) {
    tp_model_t *m = s_new_mlp(1, 8, NULL);
    float x[8 * FEAT];
    int32_t y[8];
    s_data(8, x, y, 3);
    tp_tensor_t in[2];
    s_inputs(in, x, y, 8);
    tp_model_set_profiling(m, 1);
    cr_assert_eq(s_run(m, 0, in, TP_RUN_TRAIN), TP_OK);
    cr_assert_eq(s_run(m, 0, in, TP_RUN_TRAIN), TP_OK);
    tp_op_profile_t pr[32];
    int n = tp_model_profile(m, 0, pr, 32);
    cr_assert_gt(n, 4);
    int found = 0;
    for (int i = 0; i < n && i < 32; i++) {
        cr_expect_eq(pr[i].calls, 2, "%s", pr[i].name);
        /* fc1's bias add and relu are folded into its matmul's row (the
         * default config fold): they have no rows of their own */
        cr_expect(strcmp(pr[i].name, "fc1/output") != 0);
        if (!strcmp(pr[i].name, "fc1/matmul")) {
            found = 1;
            cr_expect_eq(pr[i].kind, TP_OP_MATMUL);
            cr_expect_eq(pr[i].folds, 2);
            cr_expect_gt(pr[i].forward_ns + pr[i].backward_ns, 0);
        }
    }
    cr_expect(found);
    /* the device's time (the CPU's timer marks: its clock, its calls
     * ending done): each call's marks bracket the host's clock around it,
     * so a call timed to another node's row would fall below its host
     * time; the calls' sum fits in the runs' */
    uint64_t calls_dev = 0, run_dev = tp_model_profile_device_ns(m, 0);
    for (int i = 0; i < n && i < 32; i++) {
        cr_expect_geq(pr[i].device_forward_ns, pr[i].forward_ns, "%s", pr[i].name);
        cr_expect_geq(pr[i].device_backward_ns, pr[i].backward_ns, "%s", pr[i].name);
        calls_dev += pr[i].device_forward_ns + pr[i].device_backward_ns;
    }
    cr_expect_gt(calls_dev, 0);
    cr_expect_leq(calls_dev, run_dev, "the calls' %llu ns, the runs' %llu",
                  (unsigned long long)calls_dev, (unsigned long long)run_dev);
    /* CPU times: the tower thread's, and the process's, which holds it.
     * Both columns must be filled; their order is not asserted over this
     * ~0.5 ms profile: Linux may sample a process clock at the scheduler's
     * tick, and under TSan on a loaded 2-core host it read 57-86% of the
     * thread's here (3 runs of 22 with two busy loops beside it). */
    uint64_t thr = 0, proc = 0;
    for (int i = 0; i < n && i < 32; i++) {
        thr += pr[i].thread_forward_ns + pr[i].thread_backward_ns;
        proc += pr[i].process_forward_ns + pr[i].process_backward_ns;
    }
    cr_expect_gt(thr, 0, "no thread CPU time in the profile");
    cr_expect_gt(proc, 0, "no process CPU time in the profile");
    tp_model_set_profiling(m, 1);  /* on again: the sums start over */
    cr_expect_eq(tp_model_profile_device_ns(m, 0), 0);
    n = tp_model_profile(m, 0, pr, 32);
    for (int i = 0; i < n && i < 32; i++)
        cr_expect_eq(pr[i].device_forward_ns + pr[i].device_backward_ns + pr[i].calls +
                         pr[i].thread_forward_ns + pr[i].process_backward_ns, 0);
    tp_model_destroy(&m);
}

/* conv 3x3 (1 -> 4 channels, same padding, bias) on 8x8 images, then an
 * fc to 5 classes: the profile's FLOPs per call by hand. */
static tp_status_t s_conv_fc(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    int64_t shape[4] = {-1, 1, 8, 8};
    tp_node_t *x = tp_reshape(t, "img", in[0], 4, shape);
    tp_node_t *h = tp_relu(t, NULL, tp_conv2d(t, "conv", x, 4, 3, 1, -1, 1));
    tp_node_t *logits = tp_fc(t, "fc", h, 5, 1);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

Test(graph, profile_counts_the_flops_of_a_conv_and_an_fc) {
    tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, 64}}, {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_conv_fc, s_adam, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 6;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    float x[3 * 64] = {0};
    int32_t y[3] = {0, 1, 2};
    int64_t xs[2] = {3, 64}, ys[1] = {3}; /* a smaller batch than planned */
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    tp_model_set_profiling(m, 1);
    cr_assert_eq(s_run(m, 0, in, TP_RUN_TRAIN), TP_OK, "%s", tp_last_error());
    tp_op_profile_t pr[16];
    int n = tp_model_profile(m, 0, pr, 16), seen = 0;
    for (int i = 0; i < n && i < 16; i++) {
        if (!strcmp(pr[i].name, "conv/output")) {
            /* 3 images x 4 filters x 64 pixels x 9 taps x 1 channel
             * multiply-adds, 2 FLOPs each, + the bias's 3 x 4 x 64 adds;
             * the backward makes only dW and db (x is the data) */
            cr_expect_float_eq(pr[i].flops_forward, 2.0 * 3 * 4 * 64 * 9 + 3 * 4 * 64, 1e-9);
            cr_expect_float_eq(pr[i].flops_backward, 2.0 * 3 * 4 * 64 * 9 + 3 * 4 * 64, 1e-9);
            seen++;
        } else if (!strcmp(pr[i].name, "fc/matmul")) {
            /* [3, 256] @ [256, 5]; backward: dW and dx (the conv's) */
            cr_expect_float_eq(pr[i].flops_forward, 2.0 * 3 * 256 * 5, 1e-9);
            cr_expect_float_eq(pr[i].flops_backward, 2 * 2.0 * 3 * 256 * 5, 1e-9);
            seen++;
        } else {
            cr_expect_eq(pr[i].flops_forward + pr[i].flops_backward, 0, "%s", pr[i].name);
        }
    }
    cr_expect_eq(seen, 2);
    tp_model_destroy(&m);
}

/* The fused update (one tower's TP_RUN_TRAIN) is the same arithmetic as
 * gradients, then an update run. */
Test(graph, fused_update_equals_run_then_apply) {
    int on = 1;
    tp_model_t *a = s_new_mlp(1, 8, &on), *b = s_new_mlp(1, 8, &on);
    float x[8 * FEAT];
    int32_t y[8];
    for (int s = 0; s < 4; s++) {
        s_data(8, x, y, 20 + (uint64_t)s);
        tp_tensor_t in[2];
        s_inputs(in, x, y, 8);
        cr_assert_eq(s_run(a, 0, in, TP_RUN_TRAIN), TP_OK);
        cr_assert_eq(s_run(b, 0, in, TP_RUN_GRADIENTS), TP_OK);
        cr_assert_eq(s_run(b, 0, NULL, TP_RUN_REDUCE | TP_RUN_UPDATE), TP_OK);
    }
    for (int i = 0; i < tp_model_var_count(a); i++) {
        tp_tensor_t va, vb;
        cr_assert_eq(tp_model_var(a, tp_model_var_name(a, i), &va), TP_OK);
        cr_assert_eq(tp_model_var(b, tp_model_var_name(a, i), &vb), TP_OK);
        cr_expect(tp_tensor_equal(&va, &vb), "%s differs", tp_model_var_name(a, i));
    }
    tp_model_destroy(&a);
    tp_model_destroy(&b);
}

/* Steps do not grow the heap: the bytes in use are the same after many
 * steps (a malloc/free pair inside a step would not show; under ASan, whose
 * allocator glibc does not see, the check is vacuous). */
#include <malloc.h>
Test(graph, steps_do_not_grow_the_heap) {
    tp_model_t *m = s_new_mlp(2, 8, &s_case);
    float x[16 * FEAT];
    int32_t y[16];
    s_data(16, x, y, 4);
    tp_tensor_t a[2], b[2];
    s_inputs(a, x, y, 8);
    s_inputs(b, x + 8 * FEAT, y + 8, 8);
    tp_tensor_t p[4] = {a[0], a[1], b[0], b[1]};
    tp_fetch_t f = {.name = "cost"};
    cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, p, 4, &f, 1, NULL), TP_OK);
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < 50; i++) {
        /* fetches included: a run allocates nothing */
        cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, p, 4, &f, 1, NULL), TP_OK);
        cr_assert_not_null(f.value.data);
    }
    struct mallinfo2 after = mallinfo2();
    cr_expect_eq(before.uordblks, after.uordblks);
    cr_expect_eq(before.hblkhd, after.hblkhd);
    tp_model_destroy(&m);
}

/* ---- the shape-rule tests' shared steps ----------------------------------
 * Each family below builds an inference-only model from a tower function that
 * switches on a case number (0: the shapes that work; 1..n: one bad node
 * each), checks the good case's shapes and values, then that every bad case
 * fails to build with an error naming the node and the shapes. */

static tp_model_t *s_infer_model(const tp_input_desc_t *d, int ninputs, tp_tower_fn build,
                                 int infer_batch) {
    tp_model_desc_t md = {d, ninputs, build, NULL, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 0;
    cfg.infer_batch = infer_batch;
    return tp_model_new(&md, &cfg);
}

/* A forward run of x as the one input [2,3,5]: the run's batch, 2 of the planned 4. */
static void s_forward_2x3x5(tp_model_t *m, float *x) {
    int64_t xs[3] = {2, 3, 5};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_FLOAT32, 3, xs, x, NULL, NULL);
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, -1, &in, 1, NULL, 0, &fwd), TP_OK, "%s", tp_last_error());
}

/* Cases 1..n of build each fail; the error holds all three of the case's strings. */
static void s_expect_case_errors(tp_model_t *(*build)(int which), const char *const want[][3],
                                 int n) {
    for (int k = 0; k < n; k++) {
        tp_model_t *m = build(k + 1);
        cr_expect_null(m, "case %d built", k + 1);
        for (int j = 0; j < 3; j++)
            cr_expect(strstr(tp_last_error(), want[k][j]) != NULL, "case %d: '%s' not in: %s",
                      k + 1, want[k][j], tp_last_error());
        tp_model_destroy(&m);
    }
}

/* ---- the elementwise family's shape rule (NumPy broadcasting) ------------ */

static int s_bcast_case;

static tp_status_t s_bcast(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0]; /* batched [N,3,5] */
    int64_t s5[1] = {5}, s4[1] = {4}, s315[3] = {1, 3, 1}, s35[2] = {3, 5},
            s235[3] = {2, 3, 5};
    tp_init_t one = {TP_INIT_CONST, 1.0f};
    tp_node_t *y = NULL;
    switch (s_bcast_case) {
    case 0: /* fine: [5], [1,3,1], a scalar; the result keeps x's shape */
        y = tp_mul(t, "ok", x, tp_variable(t, "v5", 1, s5, one, TP_VAR_TRAINABLE));
        y = tp_add(t, "ok2", tp_variable(t, "v131", 3, s315, one, TP_VAR_TRAINABLE), y);
        y = tp_div(t, "ok3", y, tp_scalar(t, "two", 2.0f));
        break;
    case 1: /* [N,3,5] with [4] */
        y = tp_sub(t, "bad_dims", x, tp_variable(t, "v4", 1, s4, one, TP_VAR_TRAINABLE));
        break;
    case 2: /* an unbatched operand of the result's rank with dim 0 = 2 */
        y = tp_maximum(t, "bad_batch", x,
                       tp_variable(t, "v235", 3, s235, one, TP_VAR_TRAINABLE));
        break;
    case 3: /* a batched operand of lower rank than the other */
        y = tp_minimum(t, "bad_rank", tp_variable(t, "v1135", 4, (int64_t[]){1, 1, 3, 5},
                                                  one, TP_VAR_TRAINABLE), x);
        break;
    default: /* clip bounds the wrong way round */
        y = tp_clip(t, "bad_clip", tp_variable(t, "v35", 2, s35, one, TP_VAR_TRAINABLE),
                    1.0f, -1.0f);
        break;
    }
    if (y)
        tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

static tp_model_t *s_bcast_model(int which) {
    s_bcast_case = which;
    tp_input_desc_t d = {"x", TP_FLOAT32, 3, {-1, 3, 5}};
    return s_infer_model(&d, 1, s_bcast, 4);
}

Test(graph, broadcast_shapes_and_errors_naming_node_and_shapes) {
    tp_model_t *m = s_bcast_model(0);
    cr_assert_not_null(m, "%s", tp_last_error());
    const tp_shape_t *s = tp_node_shape(tp_model_lookup(m, -1, "y"));
    cr_expect(s->ndim == 3 && s->d[1] == 3 && s->d[2] == 5);
    cr_expect_eq(tp_node_batched(tp_model_lookup(m, -1, "y")), 1);
    /* the run's batch (2 of the planned 4) reaches the broadcast */
    float x[2 * 15];
    for (int i = 0; i < 30; i++)
        x[i] = (float)i;
    s_forward_2x3x5(m, x);
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, -1, "y", &v), TP_OK);
    cr_expect_eq(v.shape[0], 2);
    for (int i = 0; i < 30; i++) /* (1 + x * 1) / 2 */
        cr_expect_float_eq(((float *)v.data)[i], (1.0f + (float)i) / 2.0f, 1e-6);
    tp_model_destroy(&m);

    const char *const want[][3] = {
        {"'bad_dims'", "[4,3,5] with [4]", "dim 2 of the result is 5 in one and 4"},
        {"'bad_batch'", "[4,3,5] with [2,3,5]", "not batched, so its dim 0 must be 1"},
        {"'bad_rank'", "[1,1,3,5] with [4,3,5]", "must have the result's 4 dims"},
        {"'bad_clip'", "clip bounds [1, -1]", "lo <= hi"},
    };
    s_expect_case_errors(s_bcast_model, want, 4);
}

/* ---- the loss family's shape rule: same shapes -> a scalar -------------- */

static int s_loss_case;

static tp_status_t s_losses(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0]; /* batched [N,3,5] */
    tp_init_t one = {TP_INIT_CONST, 1.0f};
    tp_node_t *y = NULL;
    switch (s_loss_case) {
    case 0: /* fine: mse(x, 0.5 x) = mean (x/2)^2 */
        y = tp_mse(t, "ok", x, tp_mul(t, NULL, x, tp_scalar(t, "half", 0.5f)));
        break;
    case 1: /* the other side's dims differ */
        y = tp_l1_loss(t, "bad_shape", x,
                       tp_reshape(t, "r", x, 3, (int64_t[]){-1, 5, 3}));
        break;
    case 2: /* an unbatched target of the planned batch's shape */
        y = tp_sigmoid_xent(t, "bad_batched", x,
                            tp_variable(t, "v435", 3, (int64_t[]){4, 3, 5}, one,
                                        TP_VAR_TRAINABLE));
        break;
    default: /* Huber's delta must be > 0 */
        y = tp_huber_loss(t, "bad_delta", x, x, 0.0f);
        break;
    }
    if (y)
        tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

static tp_model_t *s_loss_model(int which) {
    s_loss_case = which;
    tp_input_desc_t d = {"x", TP_FLOAT32, 3, {-1, 3, 5}};
    return s_infer_model(&d, 1, s_losses, 4);
}

Test(graph, loss_shapes_and_errors_naming_node_and_shapes) {
    tp_model_t *m = s_loss_model(0);
    cr_assert_not_null(m, "%s", tp_last_error());
    const tp_node_t *y = tp_model_lookup(m, -1, "y");
    cr_expect_eq(tp_node_shape(y)->ndim, 0, "a loss is a scalar");
    cr_expect_eq(tp_node_batched(y), 0);
    /* the run's batch (2 of the planned 4): the mean over its 30 elements */
    float x[2 * 15];
    double want = 0.0;
    for (int i = 0; i < 30; i++) {
        x[i] = (float)i * 0.1f;
        want += 0.25 * (double)x[i] * x[i] / 30.0;
    }
    s_forward_2x3x5(m, x);
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, -1, "y", &v), TP_OK);
    cr_expect_float_eq(*(float *)v.data, (float)want, 1e-5, "mse %g, want %g",
                       (double)*(float *)v.data, want);
    tp_model_destroy(&m);

    const char *const want_err[][3] = {
        {"'bad_shape'", "[4,3,5] ('x', batched)", "[4,5,3] ('r', batched)"},
        {"'bad_batched'", "logits and float labels", "[4,3,5] ('v435')"},
        {"'bad_delta'", "huber delta 0", "> 0"},
    };
    s_expect_case_errors(s_loss_model, want_err, 3);
}

/* ---- the linalg family's shape rules ------------------------------------- */

static int s_la_case;

static tp_status_t s_linalg(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0]; /* batched [N,3,5] */
    tp_init_t one = {TP_INIT_CONST, 1.0f};
#define LA_VAR(nm, ...) tp_variable(t, nm, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), \
                                    (int64_t[]){__VA_ARGS__}, one, TP_VAR_TRAINABLE)
    tp_node_t *xf = tp_flatten(t, "xf", x);
    switch (s_la_case) {
    case 0: /* fine: x @ w, x^T x per sample, the gram over the batch, norms */
        tp_tower_add_output(t, "xw", tp_batch_matmul(t, "xw", x, LA_VAR("w52", 5, 2), 0, 0));
        tp_tower_add_output(t, "xtx", tp_batch_matmul(t, "xtx", x, x, 1, 0));
        tp_tower_add_output(t, "gram", tp_batch_matmul(t, "gram", xf, xf, 1, 0));
        tp_tower_add_output(t, "ln", tp_layer_norm(t, "ln", x, 2));
        tp_tower_add_output(t, "gn", tp_group_norm(t, "gn", x, 3));
        break;
    case 1: /* K differs */
        tp_batch_matmul(t, "bad_k", x, LA_VAR("w42", 4, 2), 0, 0);
        break;
    case 2: /* an unbatched dim 0 of 7 against the batch */
        tp_batch_matmul(t, "bad_batch", LA_VAR("v743", 7, 4, 3), x, 0, 0);
        break;
    case 3: /* the batch would be the result's last dim */
        tp_batch_matmul(t, "bad_col", LA_VAR("w34", 3, 15), xf, 0, 1);
        break;
    case 4: /* the batch is never a normalised axis */
        tp_layer_norm_op(t, "bad_axes", x, LA_VAR("g", 4, 3, 5), LA_VAR("b", 4, 3, 5), 3,
                         1e-5f);
        break;
    case 5: /* 2 groups of 3 channels */
        tp_group_norm_op(t, "bad_groups", x, LA_VAR("g", 3), LA_VAR("b", 3), 2, 1e-5f);
        break;
    case 6: /* gamma of the wrong shape */
        tp_layer_norm_op(t, "bad_gamma", x, LA_VAR("g3", 3), LA_VAR("b", 5), 1, 1e-5f);
        break;
    case 7: /* no gamma, and beta of the wrong shape */
        tp_layer_norm_op(t, "bad_beta", x, NULL, LA_VAR("b4", 4), 1, 1e-5f);
        break;
    case 8: /* a vector against a matrix of another K */
        tp_batch_matmul(t, "bad_vec", LA_VAR("v4", 4), x, 0, 0);
        break;
    case 9: /* the batch as a vector */
        tp_batch_matmul(t, "bad_bvec", x, tp_reduce_sum(t, "xs", xf, 1, (const int[]){1}, 0),
                        0, 0);
        break;
    default: /* vectors: [N,3,5] @ [5] and [3] @ [N,3,5]; norms without parameters */
        tp_tower_add_output(t, "xv", tp_batch_matmul(t, "xv", x, LA_VAR("v5", 5), 0, 0));
        tp_tower_add_output(t, "vx", tp_batch_matmul(t, "vx", LA_VAR("v3", 3), x, 1, 0));
        tp_tower_add_output(t, "dot", tp_batch_matmul(t, "dot", LA_VAR("u3", 3),
                                                      LA_VAR("w3", 3), 0, 0));
        tp_tower_add_output(t, "ln0", tp_layer_norm_op(t, "ln0", x, NULL, NULL, 2, 1e-5f));
        tp_tower_add_output(t, "gn0", tp_group_norm_op(t, "gn0", x, NULL, LA_VAR("b3", 3),
                                                       3, 1e-5f));
        break;
    }
#undef LA_VAR
    return tp_tower_status(t);
}

static tp_model_t *s_la_model(int which) {
    s_la_case = which;
    tp_input_desc_t d = {"x", TP_FLOAT32, 3, {-1, 3, 5}};
    return s_infer_model(&d, 1, s_linalg, 4);
}

/* A node the linalg model should hold: its batched flag, rank and dims. */
typedef struct {
    const char *name;
    int batched, ndim;
    int64_t d[3];
} s_la_node_t;

static void s_la_expect_nodes(tp_model_t *m, const s_la_node_t *want, int n) {
    for (int i = 0; i < n; i++) {
        const tp_node_t *nd = tp_model_lookup(m, -1, want[i].name);
        cr_assert_not_null(nd, "%s", want[i].name);
        cr_expect_eq(tp_node_batched(nd), want[i].batched, "%s batched", want[i].name);
        cr_expect_eq(tp_node_shape(nd)->ndim, want[i].ndim, "%s rank", want[i].name);
        for (int j = 0; j < want[i].ndim; j++)
            cr_expect_eq(tp_node_shape(nd)->d[j], want[i].d[j], "%s dim %d", want[i].name, j);
    }
}

Test(graph, linalg_shapes_and_errors_naming_node_and_shapes) {
    tp_model_t *m = s_la_model(0);
    cr_assert_not_null(m, "%s", tp_last_error());
    const s_la_node_t want[] = {
        {"xw", 1, 3, {4, 3, 2}}, {"xtx", 1, 3, {4, 5, 5}}, {"gram", 0, 2, {15, 15}},
        {"ln/output", 1, 3, {4, 3, 5}}, {"gn/output", 1, 3, {4, 3, 5}}};
    s_la_expect_nodes(m, want, 5);
    /* the run's batch (2 of the planned 4): the gram sums over those 2 */
    float x[2 * 15];
    for (int i = 0; i < 30; i++)
        x[i] = (float)(i % 7) * 0.25f - 0.5f;
    s_forward_2x3x5(m, x);
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, -1, "gram", &v), TP_OK);
    for (int i = 0; i < 15; i++)
        for (int j = 0; j < 15; j++) {
            const float g = x[i] * x[j] + x[15 + i] * x[15 + j];
            cr_expect_float_eq(((float *)v.data)[i * 15 + j], g, 1e-5, "gram[%d,%d]", i, j);
        }
    cr_assert_eq(tp_model_fetch(m, -1, "xw", &v), TP_OK);
    cr_expect_eq(v.shape[0], 2, "xw at the run's batch");
    tp_model_destroy(&m);

    /* 1-d operands drop their dim of 1; norms without gamma and beta */
    m = s_la_model(10);
    cr_assert_not_null(m, "%s", tp_last_error());
    const s_la_node_t vec[] = {
        {"xv", 1, 2, {4, 3}}, {"vx", 1, 2, {4, 5}}, {"dot", 0, 0, {0}},
        {"ln0", 1, 3, {4, 3, 5}}, {"gn0", 1, 3, {4, 3, 5}}};
    s_la_expect_nodes(m, vec, 5);
    tp_node_attrs_t at;
    tp_node_attrs(tp_model_lookup(m, -1, "gn0"), &at);
    cr_expect_eq(at.norm_absent, 1, "gn0: gamma left out, beta given");
    cr_expect_eq(tp_node_input_count(tp_model_lookup(m, -1, "gn0")), 2, "gn0: x and beta");
    tp_node_attrs(tp_model_lookup(m, -1, "ln0"), &at);
    cr_expect_eq(at.norm_absent, 3, "ln0: both left out");
    s_forward_2x3x5(m, x);
    cr_assert_eq(tp_model_fetch(m, -1, "dot", &v), TP_OK);
    cr_expect_float_eq(((float *)v.data)[0], 3.0f, 1e-6, "[1,1,1] . [1,1,1]");
    cr_assert_eq(tp_model_fetch(m, -1, "xv", &v), TP_OK);
    for (int i = 0; i < 6; i++) { /* row sums of x (v is ones) */
        float want = 0;
        for (int j = 0; j < 5; j++)
            want += x[i * 5 + j];
        cr_expect_float_eq(((float *)v.data)[i], want, 1e-5, "xv[%d]", i);
    }
    tp_model_destroy(&m);

    const char *const want_err[][3] = {
        {"'bad_k'", "a [4,3,5] and b [4,2]", "K is 5 in a and 4 in b"},
        {"'bad_batch'", "'v743' is not batched", "dim 0 must be 1"},
        {"'bad_col'", "b [4,15] (transposed)", "the result's last dim"},
        {"'bad_axes'", "x [4,3,5], batched", "last 3 axes"},
        {"'bad_groups'", "x [4,3,5]", "2 groups do not divide its 3 channels"},
        {"'bad_gamma'", "gamma ('g3') is [3]", "must be [5]"},
        {"'bad_beta'", "beta ('b4') is [4]", "must be [5]"},
        {"'bad_vec'", "a [4] and b [4,3,5]", "K is 4 in a and 3 in b"},
        {"'bad_bvec'", "'xs' is a batched vector", "reshape it"},
    };
    s_expect_case_errors(s_la_model, want_err, 9);
}

/* ---- the reduce family's shape rules and errors --------------------------- */

static int s_red_case;

static tp_status_t s_reduces(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0]; /* batched [N,3,5] */
    const int last[1] = {-1}, batch[1] = {0}, twice[2] = {1, -2}, far[1] = {3};
    switch (s_red_case) {
    case 0: /* fine: every rule's shapes; the batch's mean at the run's batch */
        tp_tower_add_output(t, "sum_last", tp_reduce_sum(t, "sum_last", x, 1, last, 0));
        tp_tower_add_output(t, "max_keep", tp_reduce_max(t, "max_keep", x, 1, last, 1));
        tp_tower_add_output(t, "mean_batch", tp_reduce_mean(t, "mean_batch", x, 1, batch, 0));
        tp_tower_add_output(t, "all", tp_reduce_sum(t, "all", x, 0, NULL, 0));
        tp_tower_add_output(t, "am", tp_argmax(t, "am", x, 1, 0));
        tp_tower_add_output(t, "sm", tp_softmax(t, "sm", x, 1));
        tp_tower_add_output(t, "seq", tp_softmax_xent_seq(t, "seq", x,
                                                          tp_argmax(t, NULL, x, 2, 0), -100));
        break;
    case 1:
        tp_reduce_sum(t, "bad_axis", x, 1, far, 0);
        break;
    case 2:
        tp_reduce_mean(t, "twice", x, 2, twice, 1);
        break;
    case 3: /* labels [N,5] for logits [N,3,5] */
        tp_softmax_xent_seq(t, "bad_labels", x, tp_argmax(t, "lab", x, 1, 0), -100);
        break;
    case 4: {
        const int64_t s2[2] = {-1, 15};
        tp_node_t *l2 = tp_reshape(t, "l2", x, 2, s2);
        tp_top_k_accuracy(t, "bad_k", l2, tp_argmax(t, "lab", l2, 1, 0), 16);
        break;
    }
    default:
        tp_log_softmax(t, "bad_softmax_axis", x, -4);
        break;
    }
    return tp_tower_status(t);
}

static tp_model_t *s_red_model(int which) {
    s_red_case = which;
    tp_input_desc_t d = {"x", TP_FLOAT32, 3, {-1, 3, 5}};
    return s_infer_model(&d, 1, s_reduces, 4);
}

static void s_red_expect_shape(tp_model_t *m, const char *name, int ndim, const int64_t *d,
                           int batched, tp_dtype_t dt) {
    const tp_node_t *n = tp_model_lookup(m, -1, name);
    cr_assert_not_null(n, "%s", name);
    cr_expect_eq(tp_node_shape(n)->ndim, ndim, "%s: %d dims", name, tp_node_shape(n)->ndim);
    for (int i = 0; i < ndim; i++)
        cr_expect_eq(tp_node_shape(n)->d[i], d[i], "%s dim %d", name, i);
    cr_expect_eq(tp_node_batched(n), batched, "%s batched", name);
    cr_expect_eq(tp_node_dtype(n), dt, "%s dtype", name);
}

Test(graph, reduce_family_shapes_and_errors_naming_node_and_shapes) {
    tp_model_t *m = s_red_model(0);
    cr_assert_not_null(m, "%s", tp_last_error());
    s_red_expect_shape(m, "sum_last", 2, (int64_t[]){4, 3}, 1, TP_FLOAT32);
    s_red_expect_shape(m, "max_keep", 3, (int64_t[]){4, 3, 1}, 1, TP_FLOAT32);
    s_red_expect_shape(m, "mean_batch", 2, (int64_t[]){3, 5}, 0, TP_FLOAT32);
    s_red_expect_shape(m, "all", 0, NULL, 0, TP_FLOAT32);
    s_red_expect_shape(m, "am", 2, (int64_t[]){4, 5}, 1, TP_INT32);
    s_red_expect_shape(m, "sm", 3, (int64_t[]){4, 3, 5}, 1, TP_FLOAT32);
    s_red_expect_shape(m, "seq", 0, NULL, 0, TP_FLOAT32);
    /* the run's batch (2 of the planned 4): the mean over axis 0 divides by 2 */
    float x[2 * 15];
    for (int i = 0; i < 30; i++)
        x[i] = (float)i;
    s_forward_2x3x5(m, x);
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, -1, "mean_batch", &v), TP_OK);
    cr_expect_eq(tp_tensor_numel(&v), 15);
    for (int i = 0; i < 15; i++)
        cr_expect_float_eq(((float *)v.data)[i], (float)i + 7.5f, 1e-6, "mean[%d]", i);
    cr_assert_eq(tp_model_fetch(m, -1, "am", &v), TP_OK);
    cr_expect_eq(tp_tensor_numel(&v), 10);
    for (int i = 0; i < 10; i++) /* increasing values: the last of 3 rows */
        cr_expect_eq(((int32_t *)v.data)[i], 2, "argmax[%d]", i);
    cr_assert_eq(tp_model_fetch(m, -1, "all", &v), TP_OK);
    cr_expect_float_eq(*(float *)v.data, 435.0f, 1e-6);
    tp_model_destroy(&m);

    const char *const want_err[][3] = {
        {"'bad_axis'", "axis 3 out of range", "[4,3,5] ('x', 3 dims)"},
        {"'twice'", "axis -2 named twice", "[4,3,5]"},
        {"'bad_labels'", "logits [4,3,5] ('x', batched)", "int32 [4,5] ('lab', batched)"},
        {"'bad_k'", "k 16 for logits [4,15] ('l2')", "<= 15 classes"},
        {"'bad_softmax_axis'", "axis -4 out of range", "[4,3,5]"},
    };
    s_expect_case_errors(s_red_model, want_err, 5);
}

/* A label outside [0, V) that is not the ignore label fails the run,
 * naming the node, the row and the label. */
static tp_status_t s_seq_labels(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    const int64_t s[3] = {2, 2, 3};
    tp_node_t *logits = tp_variable(t, "logits", 3, s, (tp_init_t){TP_INIT_CONST, 0.5f},
                                    TP_VAR_TRAINABLE);
    tp_node_t *y = tp_softmax_xent_seq(t, "seq_xent", logits, in[0], -1);
    tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

Test(graph, softmax_xent_seq_ignores_its_label_and_names_a_bad_one) {
    tp_input_desc_t d = {"labels", TP_INT32, 2, {2, 2}};
    tp_model_desc_t md = {&d, 1, s_seq_labels, NULL, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 0;
    cfg.infer_batch = 2;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    int32_t lab[4] = {0, -1, 2, -1};
    int64_t ls[2] = {2, 2};
    tp_tensor_t in, v;
    tp_tensor_init_wrap(&in, TP_INT32, 2, ls, lab, NULL, NULL);
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, -1, &in, 1, NULL, 0, &fwd), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_fetch(m, -1, "y", &v), TP_OK);
    /* equal logits: ln 3 for each of the 2 counted labels */
    cr_expect_float_eq(*(float *)v.data, logf(3.0f), 1e-6);
    lab[3] = 3;
    cr_expect_neq(tp_model_run(m, -1, &in, 1, NULL, 0, &fwd), TP_OK);
    cr_expect(strstr(tp_last_error(), "seq_xent") && strstr(tp_last_error(), "label 3 at row 3"),
              "%s", tp_last_error());
    tp_model_destroy(&m);
}

/* ---- gradients with respect to a data input ---------------------------- */

static int s_ask_labels;

static tp_status_t s_saliency(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *h = tp_mul(t, "sq", in[0], tp_tanh(t, NULL, in[0]));
    tp_node_t *logits = tp_fc(t, "fc", h, 3, 1);
    TP_TRY(tp_tower_input_gradient(t, in[s_ask_labels ? 1 : 0]));
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

Test(graph, gradient_with_respect_to_a_data_input) {
    tp_input_desc_t d[2] = {{"x", TP_FLOAT32, 2, {-1, 5}}, {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {d, 2, s_saliency, s_adam, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 4;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    enum { B = 3 }; /* fewer rows than planned */
    float x[B * 5];
    int32_t y[B] = {0, 2, 1};
    for (int i = 0; i < B * 5; i++)
        x[i] = sinf((float)i * 1.3f);
    int64_t xs[2] = {B, 5}, ys[1] = {B};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    tp_tensor_t g;
    cr_expect_eq(tp_model_input_grad(m, 0, "y", &g), TP_ERR_NOT_FOUND);
    cr_assert_eq(s_run(m, 0, in, TP_RUN_GRADIENTS), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_input_grad(m, 0, "x", &g), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g.ndim, 2);
    cr_assert_eq(g.shape[0], B);
    float ana[B * 5];
    memcpy(ana, g.data, sizeof ana);
    const double eps = 1e-3;
    for (int i = 0; i < B * 5; i++) {
        const float keep = x[i];
        double c[2];
        for (int s = 0; s < 2; s++) {
            x[i] = (float)(keep + (s ? -eps : eps));
            cr_assert_eq(s_run(m, 0, in, TP_RUN_FORWARD), TP_OK);
            tp_tensor_t v;
            cr_assert_eq(tp_model_fetch(m, 0, "cost", &v), TP_OK);
            c[s] = *(float *)v.data;
        }
        x[i] = keep;
        const double num = (c[0] - c[1]) / (2 * eps);
        cr_expect(fabs(num - ana[i]) <= 2e-3 + 3e-2 * fabs(num),
                  "d cost / d x[%d]: backward %.6f, finite difference %.6f", i,
                  (double)ana[i], num);
    }
    tp_model_destroy(&m);
    /* an int32 input has no gradient to give */
    s_ask_labels = 1;
    cr_expect_null(tp_model_new(&md, &cfg));
    cr_expect(strstr(tp_last_error(), "'y'") && strstr(tp_last_error(), "float32 data input"),
              "%s", tp_last_error());
    s_ask_labels = 0;
}

/* ---- the shape family's rules: Python's slices, the batch kept whole ---- */

static int s_shape_case;

static tp_status_t s_shapes(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0]; /* batched [N,3,5] */
    tp_init_t one = {TP_INIT_CONST, 1.0f};
    const int64_t E = TP_SLICE_END;
    tp_node_t *y = NULL, *xs[2] = {x, x};
    switch (s_shape_case) {
    case 0: { /* every op fine on a batched x */
        tp_tower_add_output(t, "tr", tp_transpose(t, "tr", x, (const int[]){0, -1, 1}));
        tp_tower_add_output(t, "sl", tp_slice(t, "sl", x, (const int64_t[]){0, 1, 0},
                                               (const int64_t[]){E, 3, E},
                                               (const int64_t[]){1, 1, 2}));
        tp_tower_add_output(t, "cat", tp_concat_axis(t, "cat", -1, 2, xs));
        tp_node_t *p[2];
        tp_split(t, "sp", x, 2, 2, (const int64_t[]){2, 3}, p);
        tp_tower_add_output(t, "sp1", p[1]);
        tp_tower_add_output(t, "pad", tp_pad(t, "pad", x, (const int64_t[]){0, 1, 0},
                                             (const int64_t[]){0, 0, 2}, 0.0f));
        tp_node_t *col = tp_slice(t, "col", x, (const int64_t[]){0, 0, 4},
                                  (const int64_t[]){E, E, E}, NULL);
        tp_tower_add_output(t, "bc", tp_broadcast_to(t, "bc", col, 3,
                                                     (const int64_t[]){-1, 3, 4}));
        y = tp_reshape(t, "flat", x, 2, (const int64_t[]){-1, -1});
        break;
    }
    case 1:
        y = tp_transpose(t, "bad_perm", x, (const int[]){1, 0, 2});
        break;
    case 2:
        y = tp_transpose(t, "bad_axes", x, (const int[]){0, 2, 2});
        break;
    case 3:
        y = tp_slice(t, "bad_slice", x, (const int64_t[]){1, 0, 0},
                     (const int64_t[]){E, E, E}, NULL);
        break;
    case 4:
        y = tp_slice(t, "bad_step", x, (const int64_t[]){0, 0, 0},
                     (const int64_t[]){E, E, E}, (const int64_t[]){1, 0, 1});
        break;
    case 5: {
        tp_node_t *two[2] = {x, tp_slice(t, "r2", x, (const int64_t[]){0, 0, 0},
                                         (const int64_t[]){E, 2, E}, NULL)};
        y = tp_concat_axis(t, "bad_cat", 2, 2, two);
        break;
    }
    case 6:
        y = tp_concat_axis(t, "bad_cat0", 0, 2, xs);
        break;
    case 7:
        y = tp_pad(t, "bad_pad", x, (const int64_t[]){0, -1, 0}, (const int64_t[]){0, 0, 0}, 0);
        break;
    case 8:
        y = tp_pad(t, "bad_pad0", x, (const int64_t[]){0, 0, 0}, (const int64_t[]){1, 0, 0}, 0);
        break;
    case 9:
        y = tp_broadcast_to(t, "bad_bc", x, 3, (const int64_t[]){-1, 2, 5});
        break;
    case 10:
        y = tp_gather_rows(t, "bad_idx", tp_variable(t, "tab", 2, (const int64_t[]){4, 2}, one,
                                                     TP_VAR_TRAINABLE), x);
        break;
    case 11:
        y = tp_one_hot(t, "bad_hot", in[1], 0);
        break;
    case 12: {
        tp_node_t *p[2];
        tp_split(t, "bad_split", x, 1, 2, (const int64_t[]){2, 2}, p);
        break;
    }
    case 13:
        y = tp_reshape(t, "bad_infer", x, 3, (const int64_t[]){-1, -1, -1});
        break;
    default:
        y = tp_reshape(t, "bad_infer2", x, 3, (const int64_t[]){-1, 4, -1});
        break;
    }
    if (y)
        tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

static tp_model_t *s_shape_model(int which) {
    s_shape_case = which;
    tp_input_desc_t d[2] = {{"x", TP_FLOAT32, 3, {-1, 3, 5}}, {"tok", TP_INT32, 1, {-1}}};
    return s_infer_model(d, 2, s_shapes, 4);
}

static void s_expect_shape(tp_model_t *m, const char *name, int ndim, const int64_t *d) {
    const tp_node_t *n = tp_model_lookup(m, -1, name);
    cr_assert_not_null(n, "%s", name);
    const tp_shape_t *s = tp_node_shape(n);
    cr_expect_eq(s->ndim, ndim, "%s: %d dims", name, s->ndim);
    for (int i = 0; i < ndim && i < s->ndim; i++)
        cr_expect_eq(s->d[i], d[i], "%s: dim %d is %lld, want %lld", name, i,
                     (long long)s->d[i], (long long)d[i]);
    cr_expect_eq(tp_node_batched(n), 1, "%s keeps the batch", name);
}

Test(graph, shape_family_rules_and_errors_naming_node_and_shapes) {
    tp_model_t *m = s_shape_model(0);
    cr_assert_not_null(m, "%s", tp_last_error());
    s_expect_shape(m, "tr", 3, (const int64_t[]){4, 5, 3});
    s_expect_shape(m, "sl", 3, (const int64_t[]){4, 2, 3});
    s_expect_shape(m, "cat", 3, (const int64_t[]){4, 3, 10});
    s_expect_shape(m, "sp_1", 3, (const int64_t[]){4, 3, 3});
    s_expect_shape(m, "pad", 3, (const int64_t[]){4, 4, 7});
    s_expect_shape(m, "bc", 3, (const int64_t[]){4, 3, 4});
    s_expect_shape(m, "flat", 2, (const int64_t[]){4, 15});
    /* a run at batch 2 of the planned 4: values at the run's shapes */
    float x[2 * 15];
    int32_t tok[2] = {0, 1};
    for (int i = 0; i < 30; i++)
        x[i] = (float)i;
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 3, (int64_t[]){2, 3, 5}, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, (int64_t[]){2}, tok, NULL, NULL);
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, -1, in, 2, NULL, 0, &fwd), TP_OK, "%s", tp_last_error());
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, -1, "tr", &v), TP_OK);
    cr_expect_eq(v.shape[0], 2);
    for (int b = 0; b < 2; b++) /* tr[b][j][i] = x[b][i][j] */
        for (int j = 0; j < 5; j++)
            for (int i = 0; i < 3; i++)
                cr_expect_eq(((float *)v.data)[b * 15 + j * 3 + i], x[b * 15 + i * 5 + j]);
    cr_assert_eq(tp_model_fetch(m, -1, "bc", &v), TP_OK);
    for (int k = 0; k < 24; k++) /* column 4 of each row, stretched */
        cr_expect_eq(((float *)v.data)[k], x[(k / 12) * 15 + ((k / 4) % 3) * 5 + 4]);
    cr_assert_eq(tp_model_fetch(m, -1, "pad", &v), TP_OK);
    cr_expect_eq(((float *)v.data)[0], 0.0f);      /* the padded row */
    cr_expect_eq(((float *)v.data)[7], x[0]);      /* x[0][0][0] at [0][1][0] */
    cr_expect_eq(((float *)v.data)[28 + 7 + 4], x[15 + 4]);
    tp_model_destroy(&m);

    const char *const want[][3] = {
        {"'bad_perm'", "x [4,3,5] is batched", "perm[0] must be 0"},
        {"'bad_axes'", "perm[2] = 2", "each axis of 0..2 once"},
        {"'bad_slice'", "x [4,3,5] is batched", "axis 0 (the batch) must be taken whole"},
        {"'bad_step'", "step of axis 1 is 0", "[4,3,5]"},
        {"'bad_cat'", "input 1 is [4,2,5] (batched), input 0 is [4,3,5] (batched)",
         "only dim 2 may differ"},
        {"'bad_cat0'", "[4,3,5] is batched", "along axis 0 (the batch)"},
        {"'bad_pad'", "axis 1", "pads -1 before"},
        {"'bad_pad0'", "x [4,3,5] is batched", "cannot be padded"},
        {"'bad_bc'", "cannot broadcast [4,3,5] to [4,2,5]", "dim 1 is 3 in x"},
        {"'bad_idx'", "indices 'x' are float32", "need int32"},
        {"'bad_hot'", "depth 0 on indices [4]", "depth >= 1"},
        {"bad_split", "cannot split x [4,3,5] (batched) along axis 1",
         "2 pieces summing to 4"},
        {"'bad_infer'", "dims 1 and 2 are both -1", "at most one"},
        {"'bad_infer2'", "cannot infer dim 2", "60 elements"},
    };
    s_expect_case_errors(s_shape_model, want, 14);
}

/* Python's slice.indices on one axis: (len, start, stop, step) -> the
 * count and the first index, as python3 gives them ("None" written as
 * 0/TP_SLICE_END for a positive step, TP_SLICE_END/-TP_SLICE_END for a
 * negative one). */
static int64_t s_py[][6] = {
    {10, -3, TP_SLICE_END, 1, 3, 7},    {10, TP_SLICE_END, -TP_SLICE_END, -1, 10, 9},
    {10, 8, 2, -3, 2, 8},               {10, -100, 100, 2, 5, 0},
    {10, 5, -100, -2, 3, 5},            {10, 3, 3, 1, 0, 0},
    {10, 7, 2, 1, 0, 0},                {5, -1, -6, -1, 5, 4},
    {7, 2, -2, 3, 1, 2},
};
static int s_py_case;

static tp_status_t s_py_slice(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    (void)in;
    const int64_t *c = s_py[s_py_case];
    tp_node_t *v = tp_variable(t, "v", 1, &c[0], (tp_init_t){TP_INIT_ZEROS, 0},
                               TP_VAR_TRAINABLE);
    tp_tower_add_output(t, "y", tp_slice(t, "y", v, &c[1], &c[2], &c[3]));
    return tp_tower_status(t);
}

Test(graph, slice_follows_python_slice_indices) {
    for (s_py_case = 0; s_py_case < (int)(sizeof s_py / sizeof s_py[0]); s_py_case++) {
        tp_input_desc_t d = {"x", TP_FLOAT32, 2, {-1, 1}};
        tp_model_desc_t md = {&d, 1, s_py_slice, NULL, NULL};
        tp_model_config_t cfg = tp_model_config_default();
        cfg.towers = 0;
        cfg.infer_batch = 1;
        tp_model_t *m = tp_model_new(&md, &cfg);
        cr_assert_not_null(m, "%s", tp_last_error());
        const tp_node_t *y = tp_model_lookup(m, -1, "y");
        tp_node_attrs_t a;
        tp_node_attrs(y, &a);
        const int64_t *c = s_py[s_py_case];
        cr_expect_eq(tp_node_shape(y)->d[0], c[4], "case %d: %lld elements, python %lld",
                     s_py_case, (long long)tp_node_shape(y)->d[0], (long long)c[4]);
        if (c[4])
            cr_expect_eq(a.dims_a[0], c[5], "case %d: starts at %lld, python %lld", s_py_case,
                         (long long)a.dims_a[0], (long long)c[5]);
        tp_model_destroy(&m);
    }
}

/* ---- the convolution family's shape rules ------------------------------ */

static int s_conv_case;

static tp_node_t *s_w(tp_tower_t *t, const char *name, int64_t a, int64_t b,
                      int64_t kh, int64_t kw) {
    int64_t s[4] = {a, b, kh, kw};
    return tp_variable(t, name, 4, s, (tp_init_t){TP_INIT_NORMAL, 0.1f}, TP_VAR_TRAINABLE);
}

static tp_status_t s_convs(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0]; /* [B,4,6,6] */
    switch (s_conv_case) {
    case 0: {
        /* dilation 2, 2 groups, pad 2: 6 + 4 - 4 - 1 = 5, +1 -> [B,6,6,6] */
        tp_node_t *a = tp_conv2d_ex(t, "dil", x, s_w(t, "w0", 6, 2, 3, 3), NULL, 1, 2, 2, 2);
        /* (6-1) 2 - 2 + 2 + 1 + 1 = 12 -> [B,3,12,12] */
        tp_node_t *b = tp_conv2d_transpose_op(t, "deconv", a, s_w(t, "w1", 6, 3, 3, 3),
                                              NULL, 2, 1, 1, 1, 1);
        tp_node_t *c = tp_upsample_bilinear(t, "up", b, 3, 1); /* [B,3,36,36] */
        tp_node_t *d = tp_conv2d_transpose(t, "layer", x, 5, 4, 2, 1, 0, 1); /* [B,5,12,12] */
        tp_tower_add_output(t, "b", b);
        tp_tower_add_output(t, "d", d);
        return tp_tower_add_output(t, "c", c);
    }
    case 1: /* 4 channels in 3 groups */
        tp_conv2d_ex(t, "bad_groups", x, s_w(t, "w", 6, 1, 3, 3), NULL, 1, 1, 1, 3);
        break;
    case 2: /* a transposed conv's W has the input channels first */
        tp_conv2d_transpose_op(t, "bad_deconv_w", x, s_w(t, "w", 3, 4, 3, 3), NULL, 2, 1, 0, 1, 1);
        break;
    case 3:
        tp_conv2d_transpose_op(t, "bad_outpad", x, s_w(t, "w", 4, 2, 3, 3), NULL, 2, 1, 2, 1, 1);
        break;
    case 4:
        tp_upsample_nearest(t, "bad_factor", x, 0);
        break;
    case 5: /* a 3x3 kernel dilated 4 spans 9 pixels: more than 6 */
        tp_conv2d_ex(t, "bad_dilation", x, s_w(t, "w", 2, 4, 3, 3), NULL, 1, 1, 4, 1);
        break;
    }
    return tp_tower_status(t);
}

static tp_model_t *s_conv_model(int which) {
    s_conv_case = which;
    tp_input_desc_t d = {"x", TP_FLOAT32, 4, {-1, 4, 6, 6}};
    return s_infer_model(&d, 1, s_convs, 2);
}

Test(graph, convolution_family_shapes_and_errors_naming_node_and_shapes) {
    tp_model_t *m = s_conv_model(0);
    cr_assert_not_null(m, "%s", tp_last_error());
    const int64_t want[3][4] = {{2, 3, 12, 12}, {2, 5, 12, 12}, {2, 3, 36, 36}};
    const char *names[3] = {"b", "d", "c"};
    for (int k = 0; k < 3; k++) {
        const tp_shape_t *s = tp_node_shape(tp_model_lookup(m, -1, names[k]));
        cr_assert_eq(s->ndim, 4);
        for (int j = 0; j < 4; j++)
            cr_expect_eq(s->d[j], want[k][j], "%s dim %d: %lld, want %lld", names[k], j,
                         (long long)s->d[j], (long long)want[k][j]);
    }
    tp_node_attrs_t a;
    tp_node_attrs(tp_model_lookup(m, -1, "dil"), &a);
    cr_expect(a.dilation[0] == 2 && a.groups == 2, "dilation %d, groups %d", a.dilation[0],
              a.groups);
    tp_node_attrs(tp_model_lookup(m, -1, "deconv"), &a);
    cr_expect(a.output_pad[0] == 1 && a.stride[0] == 2 && a.dilation[0] == 1);
    tp_model_destroy(&m);

    const char *const want_err[][3] = {
        {"'bad_groups'", "x is [2,4,6,6], W is [6,1,3,3], 3 groups", "multiples"},
        {"'bad_deconv_w'", "x is [2,4,6,6], W is [3,4,3,3]", "input channels first"},
        {"'bad_outpad'", "output padding 2 with stride 2", "below the stride"},
        {"'bad_factor'", "x is [2,4,6,6], factor 0", ">= 1"},
        {"'bad_dilation'", "kernel [2,4,3,3] (dilated)", "padded input [2,4,6,6]"},
    };
    s_expect_case_errors(s_conv_model, want_err, 5);
}
