/* towerpack tests: SGD (plain, momentum, Nesterov), Adam and AdamW against
 * reference arithmetic in double, hyper-parameters by name, and the
 * gradient processing a model applies for its optimizer (the global-norm
 * clip) on every update path: fused, all towers from one thread, slices. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "gpu/cpu/cpu_pool.h"

extern atomic_size_t tp_cpu_pool_worker_parts; /* cpu_pool.c, for tests */

#define NP 5

static void s_run(tp_optimizer_t *o, float *w, float g[][NP], int steps,
                  float *slot0, float *slot1) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    float *slots[2] = {slot0, slot1};
    for (int s = 0; s < steps; s++)
        cr_assert_eq(tp_optimizer_apply(o, b, NULL, w, g[s], slots, NP), TP_OK);
    tp_backend_destroy(&b);
    cr_expect_null(b);
}

static float s_g[3][NP] = {{0.5f, -1.0f, 2.0f, 0.0f, 0.25f},
                           {-0.5f, 0.3f, 1.0f, -2.0f, 0.75f},
                           {1.5f, 0.1f, -0.2f, 0.4f, -1.0f}};

Test(optim, sgd_momentum_and_nesterov_match_reference) {
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        tp_optimizer_t *o = tp_optimizer_sgd(0.1, 0.9, nesterov);
        cr_assert_not_null(o);
        cr_expect_eq(tp_optimizer_slot_count(o), 1);
        cr_expect_str_eq(tp_optimizer_slot_name(o, 0), "momentum");
        float w[NP] = {1, 2, 3, 4, 5}, v[NP] = {0};
        s_run(o, w, s_g, 3, v, NULL);
        for (int i = 0; i < NP; i++) {
            double rw = i + 1, rv = 0;
            for (int s = 0; s < 3; s++) {
                rv = 0.9 * rv + s_g[s][i];
                rw -= 0.1 * (nesterov ? s_g[s][i] + 0.9 * rv : rv);
            }
            cr_expect(fabs(w[i] - rw) < 1e-5, "nesterov %d w[%d] %f vs %f",
                      nesterov, i, w[i], rw);
        }
        cr_expect_eq(tp_optimizer_step(o), 3);
        tp_optimizer_destroy(&o);
        cr_expect_null(o);
    }
}

/* SGD's coupled weight decay (torch.optim.SGD's weight_decay): g + C w
 * goes through the momentum, per variable times its decay multiplier;
 * it needs the momentum slot and no Nesterov, and says so. (20 steps of
 * an MLP against torch: test_proc_torch_step.) */
Test(optim, sgd_weight_decay_is_coupled_as_torchs) {
    tp_optimizer_t *o = tp_optimizer_sgd(0.1, 0.9, 0);
    cr_assert_eq(tp_optimizer_set(o, "weight_decay", 0.5), TP_OK, "%s", tp_last_error());
    double v;
    cr_expect_eq(tp_optimizer_get(o, "weight_decay", &v), TP_OK);
    cr_expect_float_eq(v, 0.5, 1e-12);
    float w[NP] = {1, 2, 3, 4, 5}, m[NP] = {0};
    s_run(o, w, s_g, 3, m, NULL);
    for (int i = 0; i < NP; i++) {
        double rw = i + 1, rv = 0;
        for (int s = 0; s < 3; s++) {
            rv = 0.9 * rv + s_g[s][i] + 0.5 * rw;
            rw -= 0.1 * rv;
        }
        cr_expect(fabs(w[i] - rw) < 1e-5, "w[%d] %f vs %f", i, w[i], rw);
    }
    /* the momentum cannot go to 0 under it */
    cr_expect_eq(tp_optimizer_set(o, "momentum", 0), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "momentum > 0"), "%s", tp_last_error());
    cr_expect_eq(tp_optimizer_add_decay_mult(o, "*/b", 0), TP_OK);
    tp_optimizer_destroy(&o);
    o = tp_optimizer_sgd(0.1, 0, 0);
    cr_expect_eq(tp_optimizer_set(o, "weight_decay", 0.5), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_set(o, "weight_decay", 0), TP_OK);
    tp_optimizer_destroy(&o);
    o = tp_optimizer_sgd(0.1, 0.9, 1);
    cr_expect_eq(tp_optimizer_set(o, "weight_decay", 0.5), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "Nesterov"), "%s", tp_last_error());
    tp_optimizer_destroy(&o);
}

Test(optim, plain_sgd_keeps_no_slot) {
    tp_optimizer_t *o = tp_optimizer_sgd(0.5, 0.0, 0);
    cr_expect_eq(tp_optimizer_slot_count(o), 0);
    float w[NP] = {0};
    s_run(o, w, s_g, 1, NULL, NULL);
    cr_expect_float_eq(w[1], 0.5f, 1e-7);
    /* momentum cannot be switched on later: no slot was planned */
    cr_expect_eq(tp_optimizer_set(o, "momentum", 0.9), TP_ERR_INVALID);
    tp_optimizer_destroy(&o);
}

/* torch.optim.Adam (wd 0) or AdamW (wd: the decoupled decay, first, then
 * Adam's step) at lr, betas 0.9 and 0.999, eps 1e-8, in double: parameter
 * i from w0 after s_g's three steps. */
static double s_adam_ref(double w0, int i, double lr, double wd) {
    double rw = w0, rm = 0, rv = 0;
    for (int s = 0; s < 3; s++) {
        double g = s_g[s][i];
        rw *= 1 - lr * wd;
        rm = 0.9 * rm + 0.1 * g;
        rv = 0.999 * rv + 0.001 * g * g;
        double mh = rm / (1 - pow(0.9, s + 1)), vh = rv / (1 - pow(0.999, s + 1));
        rw -= lr * mh / (sqrt(vh) + 1e-8);
    }
    return rw;
}

Test(optim, adam_matches_reference) {
    tp_optimizer_t *o = tp_optimizer_adam(0.01, 0.9, 0.999, 1e-8);
    cr_assert_not_null(o);
    cr_expect_eq(tp_optimizer_slot_count(o), 2);
    cr_expect_str_eq(tp_optimizer_slot_name(o, 1), "v");
    float w[NP] = {1, -1, 0.5f, 0, 2}, m[NP] = {0}, v[NP] = {0};
    float w0[NP];
    memcpy(w0, w, sizeof w);
    s_run(o, w, s_g, 3, m, v);
    for (int i = 0; i < NP; i++) {
        const double rw = s_adam_ref(w0[i], i, 0.01, 0);
        cr_expect(fabs(w[i] - rw) < 1e-5, "w[%d] %f vs %f", i, w[i], rw);
    }
    tp_optimizer_destroy(&o);
}

Test(optim, hyper_parameters_by_name) {
    tp_optimizer_t *o = tp_optimizer_adam(0.001, 0.9, 0.999, 1e-7);
    double v;
    cr_expect_eq(tp_optimizer_set(o, "learning_rate", 0.5), TP_OK);
    cr_expect_eq(tp_optimizer_get(o, "learning_rate", &v), TP_OK);
    cr_expect_float_eq(v, 0.5, 1e-12);
    cr_expect_eq(tp_optimizer_set(o, "beta1", 0.8), TP_OK);
    cr_expect_eq(tp_optimizer_get(o, "beta1", &v), TP_OK);
    cr_expect_float_eq(v, 0.8, 1e-12);
    cr_expect_eq(tp_optimizer_set(o, "beta1", 1.5), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_set(o, "epsilon", 0.0), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_set(o, "learning_rate", -1), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_get(o, "momentum", &v), TP_ERR_NOT_FOUND);
    cr_expect(strstr(tp_last_error(), "beta2") != NULL, "%s", tp_last_error());
    cr_expect_str_eq(tp_optimizer_kind(o), "adam");
    tp_optimizer_destroy(&o);
    cr_expect_null(tp_optimizer_sgd(0.1, 1.0, 0));
    cr_expect_null(tp_optimizer_adam(0.1, 0.9, 0.999, 0.0));
}

Test(optim, adamw_matches_reference) {
    const double lr = 0.01, wd = 0.1;
    tp_optimizer_t *o = tp_optimizer_adamw(lr, 0.9, 0.999, 1e-8, wd);
    cr_assert_not_null(o, "%s", tp_last_error());
    cr_expect_str_eq(tp_optimizer_kind(o), "adamw");
    cr_expect_eq(tp_optimizer_slot_count(o), 2);
    float w[NP] = {1, -1, 0.5f, 0, 2}, m[NP] = {0}, v[NP] = {0};
    float w0[NP];
    memcpy(w0, w, sizeof w);
    s_run(o, w, s_g, 3, m, v);
    for (int i = 0; i < NP; i++) {
        const double rw = s_adam_ref(w0[i], i, lr, wd);
        cr_expect(fabs(w[i] - rw) < 1e-6, "w[%d] %.9f vs %.9f", i, w[i], rw);
    }
    /* the decay is a hyper-parameter a schedule can set; Adam has none */
    double d;
    cr_expect_eq(tp_optimizer_set(o, "weight_decay", 0.3), TP_OK);
    cr_expect_eq(tp_optimizer_get(o, "weight_decay", &d), TP_OK);
    cr_expect_float_eq(d, 0.3, 1e-12);
    cr_expect_eq(tp_optimizer_set(o, "weight_decay", -1), TP_ERR_INVALID);
    tp_optimizer_destroy(&o);
    cr_expect_null(tp_optimizer_adamw(0.1, 0.9, 0.999, 1e-8, -0.1));
    tp_optimizer_t *a = tp_optimizer_adam(0.1, 0.9, 0.999, 1e-8);
    cr_expect_eq(tp_optimizer_get(a, "weight_decay", &d), TP_ERR_NOT_FOUND);
    tp_optimizer_destroy(&a);
}

Test(optim, clip_norm_is_every_optimizers_hyper_parameter) {
    tp_optimizer_t *o[3] = {tp_optimizer_sgd(0.1, 0.9, 0),
                            tp_optimizer_adam(0.1, 0.9, 0.999, 1e-8),
                            tp_optimizer_adamw(0.1, 0.9, 0.999, 1e-8, 0.01)};
    for (int i = 0; i < 3; i++) {
        double v = -1;
        cr_expect_eq(tp_optimizer_clip_norm(o[i]), 0.0, "off by default");
        cr_expect_eq(tp_optimizer_set(o[i], "clip_norm", 5.0), TP_OK);
        cr_expect_eq(tp_optimizer_get(o[i], "clip_norm", &v), TP_OK);
        cr_expect_eq(v, 5.0);
        cr_expect_eq(tp_optimizer_clip_norm(o[i]), 5.0);
        cr_expect_eq(tp_optimizer_set(o[i], "clip_norm", -1), TP_ERR_INVALID);
        tp_optimizer_destroy(&o[i]);
    }
}

/* ---- the global-norm clip in a model ------------------------------------
 * A softmax regression x [4,3] @ W [3,2] with plain SGD (lr 1): a step
 * moves W by exactly the (processed) gradient. */

#define CB 4
static const float s_w0[6] = {0.3f, -0.2f, 0.1f, 0.4f, -0.5f, 0.25f};

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    int64_t ws[2] = {3, 2};
    tp_node_t *w = tp_variable(t, "W", 2, ws, (tp_init_t){TP_INIT_ZEROS, 0},
                               TP_VAR_TRAINABLE);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "xent", tp_matmul(t, "logits", in[0], w),
                                                in[1]));
}

static tp_optimizer_t *s_sgd1(void *u) {
    (void)u;
    return tp_optimizer_sgd(1.0, 0.0, 0);
}

static const tp_input_desc_t s_desc[2] = {{"x", TP_FLOAT32, 2, {-1, 3}},
                                          {"y", TP_INT32, 1, {-1}}};

static double s_ema_decay; /* s_sgd_ema's, set before building */
static tp_optimizer_t *s_sgd_ema(void *u) {
    (void)u;
    tp_optimizer_t *o = tp_optimizer_sgd(1.0, 0.0, 0);
    if (o && tp_optimizer_set(o, "ema_decay", s_ema_decay) < 0)
        tp_optimizer_destroy(&o);
    return o;
}

static tp_model_t *s_model(int towers, double clip) {
    tp_model_desc_t md = {s_desc, 2, s_tower, s_ema_decay > 0 ? s_sgd_ema : s_sgd1, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = towers;
    cfg.batch = CB;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    tp_tensor_t w;
    cr_assert_eq(tp_model_var(m, "W", &w), TP_OK);
    memcpy(w.data, s_w0, sizeof s_w0); /* CPU backend: host memory */
    /* the average starts at the weights the model was built with: these */
    if (s_ema_decay > 0 && tp_model_var(m, "optimizer/W/ema", &w) == TP_OK)
        memcpy(w.data, s_w0, sizeof s_w0);
    cr_assert_eq(tp_optimizer_set(tp_model_optimizer(m), "clip_norm", clip), TP_OK);
    return m;
}

static float s_x[CB * 3];
static int32_t s_y[CB];
static void s_feeds(tp_tensor_t in[4]) {
    for (int i = 0; i < CB * 3; i++)
        s_x[i] = (float)(3.0 * sin(1.0 + 0.7 * i));
    for (int i = 0; i < CB; i++)
        s_y[i] = i % 2;
    int64_t xs[2] = {CB, 3}, ys[1] = {CB};
    /* both towers take the same batch: their mean is either's gradient */
    for (int k = 0; k < 2; k++) {
        tp_tensor_init_wrap(&in[2 * k], TP_FLOAT32, 2, xs, s_x, NULL, NULL);
        tp_tensor_init_wrap(&in[2 * k + 1], TP_INT32, 1, ys, s_y, NULL, NULL);
    }
}

/* One step by `path`: 0 one tower (the fused update), 1 two towers from
 * one thread (TP_ALL_TOWERS), 2 two towers each applying its slice. */
static void s_run_path(tp_model_t *m, int path, tp_tensor_t in[4]) {
    if (path < 2) {
        cr_assert_eq(tp_model_run(m, path ? TP_ALL_TOWERS : 0, in, path ? 4 : 2, NULL,
                                  0, NULL), TP_OK, "%s", tp_last_error());
    } else {
        tp_run_opts_t grads = {.stages = TP_RUN_GRADIENTS};
        tp_run_opts_t update = {.stages = TP_RUN_UPDATE};
        for (int k = 0; k < 2; k++)  /* equal gradients: nothing to reduce */
            cr_assert_eq(tp_model_run(m, k, in, 2, NULL, 0, &grads), TP_OK);
        for (int k = 0; k < 2; k++)
            cr_assert_eq(tp_model_run(m, k, NULL, 0, NULL, 0, &update), TP_OK,
                         "%s", tp_last_error());
        cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &update),
                     TP_OK, "%s", tp_last_error());
    }
}

/* W after one step by `path` (s_run_path). */
static void s_step(int path, double clip, float w_out[6]) {
    tp_model_t *m = s_model(path == 0 ? 1 : 2, clip);
    tp_tensor_t in[4];
    s_feeds(in);
    s_run_path(m, path, in);
    tp_tensor_t w;
    cr_assert_eq(tp_model_var(m, "W", &w), TP_OK);
    memcpy(w_out, w.data, sizeof s_w0);
    tp_model_destroy(&m);
}

Test(optim, clip_norm_scales_the_step_on_every_update_path) {
    float w1[6];
    s_step(0, 0.0, w1);
    double g[6], norm = 0;
    for (int i = 0; i < 6; i++) {
        g[i] = (double)s_w0[i] - w1[i];
        norm += g[i] * g[i];
    }
    norm = sqrt(norm);
    cr_assert(norm > 0.1, "the batch gives a gradient worth clipping (%g)", norm);
    for (int path = 0; path < 3; path++) {
        float w[6];
        /* a quarter of the norm: every gradient scaled by 1/4 */
        s_step(path, norm / 4, w);
        for (int i = 0; i < 6; i++)
            cr_expect(fabs(w[i] - (s_w0[i] - g[i] / 4)) < 1e-6,
                      "path %d: W[%d] %.8f, want %.8f", path, i, w[i],
                      s_w0[i] - g[i] / 4);
        /* above the norm: the step as without a clip, bit for bit */
        s_step(path, norm * 2, w);
        float w_plain[6];
        s_step(path, 0.0, w_plain);
        cr_expect_eq(memcmp(w, w_plain, sizeof w), 0, "path %d: clip above the norm "
                     "changed the step", path);
    }
}

/* ---- the weights' average in a model ----------------------------------- */

static void s_read(tp_model_t *m, const char *name, float out[6]) {
    tp_tensor_t v;
    cr_assert_eq(tp_model_var(m, name, &v), TP_OK, "%s: %s", name, tp_last_error());
    cr_assert_eq(v.nbytes, 6 * sizeof(float));
    memcpy(out, v.data, 6 * sizeof(float));
    tp_tensor_fini(&v);
}

Test(optim, ema_follows_every_update_path_and_takes_the_weights_place) {
    s_ema_decay = 0.75;
    for (int path = 0; path < 3; path++) {
        tp_model_t *m = s_model(path == 0 ? 1 : 2, 0.0);
        tp_tensor_t in[4];
        s_feeds(in);
        double ema[6];
        float w[6], e[6];
        s_read(m, "optimizer/W/ema", e);
        for (int i = 0; i < 6; i++) {  /* it starts at the initial weights */
            cr_expect_eq(e[i], s_w0[i], "path %d: ema[%d] starts at %g", path, i, e[i]);
            ema[i] = s_w0[i];
        }
        for (int step = 0; step < 3; step++) {
            s_run_path(m, path, in);
            s_read(m, "W", w);
            for (int i = 0; i < 6; i++)
                ema[i] = 0.75 * ema[i] + 0.25 * w[i];
        }
        s_read(m, "optimizer/W/ema", e);
        for (int i = 0; i < 6; i++)
            cr_expect(fabs(e[i] - ema[i]) < 1e-6, "path %d: ema[%d] %.8f, want %.8f",
                      path, i, e[i], ema[i]);
        /* in the weights' place: what the inference graph and export read */
        cr_assert_eq(tp_model_use_ema(m, 1), TP_OK, "%s", tp_last_error());
        cr_expect(tp_model_ema_in_use(m));
        float in_place[6];
        s_read(m, "W", in_place);
        cr_expect_eq(memcmp(in_place, e, sizeof e), 0, "path %d: W is not the average", path);
        cr_expect_eq(tp_model_run(m, path ? TP_ALL_TOWERS : 0, in, path ? 4 : 2, NULL, 0,
                                  NULL), TP_ERR_STATE, "training with the average in place");
        cr_expect(strstr(tp_last_error(), "tp_model_use_ema"), "%s", tp_last_error());
        cr_assert_eq(tp_model_use_ema(m, 0), TP_OK);
        s_read(m, "W", in_place);
        cr_expect_eq(memcmp(in_place, w, sizeof w), 0, "path %d: the weights came back "
                     "changed", path);
        tp_model_destroy(&m);
    }
    /* a model without the average says how to get one */
    s_ema_decay = 0;
    tp_model_t *m = s_model(1, 0.0);
    cr_expect_eq(tp_model_use_ema(m, 1), TP_ERR_STATE);
    cr_expect(strstr(tp_last_error(), "ema_decay"), "%s", tp_last_error());
    tp_tensor_t v;
    cr_expect_eq(tp_model_var(m, "optimizer/W/ema", &v), TP_ERR_NOT_FOUND);
    tp_model_destroy(&m);
}

/* ---- learning-rate multipliers and freezing ----------------------------
 * fc 3->2 (fc/W, fc/b) and SGD at rate 1: a step moves each variable by
 * its gradient times its multiplier; a frozen one neither moves nor has a
 * gradient, and the others' gradients are what they were. */

static double s_mult_w = 1, s_mult_b = 1;
static tp_status_t s_fc_tower(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    return tp_tower_set_cost(t, tp_softmax_xent(t, "xent", tp_fc(t, "fc", in[0], 2, 1),
                                                in[1]));
}
static tp_optimizer_t *s_sgd_mults(void *u) {
    (void)u;
    tp_optimizer_t *o = tp_optimizer_sgd(1.0, 0.0, 0);
    if (o && (tp_optimizer_add_lr_mult(o, "*/W", s_mult_w) < 0 ||
              tp_optimizer_add_lr_mult(o, "fc/?", s_mult_b) < 0))
        tp_optimizer_destroy(&o);
    return o;
}

/* The fc model of s_fc_tower on `towers` (batch CB, seed 3), trained by
 * `opt`. */
static tp_model_t *s_fc_model(int towers, tp_optimizer_fn opt) {
    tp_model_desc_t md = {s_desc, 2, s_fc_tower, opt, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = towers;
    cfg.batch = CB;
    cfg.seed = 3;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

/* m's fc/W (6 floats) into w and fc/b (2) into b. */
static void s_fc_vars(tp_model_t *m, float w[6], float b[2]) {
    tp_tensor_t v;
    cr_assert_eq(tp_model_var(m, "fc/W", &v), TP_OK);
    memcpy(w, v.data, 6 * sizeof *w);
    tp_tensor_fini(&v);
    cr_assert_eq(tp_model_var(m, "fc/b", &v), TP_OK);
    memcpy(b, v.data, 2 * sizeof *b);
    tp_tensor_fini(&v);
}

/* fc/W (6 floats) and fc/b (2) before and after a step on `towers`. */
static tp_model_t *s_fc_step(int towers, float w[2][6], float b[2][2]) {
    tp_model_t *m = s_fc_model(towers, s_sgd_mults);
    tp_tensor_t in[4];
    s_feeds(in);
    for (int k = 0; k < 2; k++) {
        if (k == 1)
            cr_assert_eq(tp_model_run(m, towers > 1 ? TP_ALL_TOWERS : 0, in, 2 * towers,
                                      NULL, 0, NULL), TP_OK, "%s", tp_last_error());
        s_fc_vars(m, w[k], b[k]);
    }
    return m;
}

Test(optim, lr_multipliers_scale_each_variables_step_and_zero_freezes) {
    tp_optimizer_t *o = tp_optimizer_sgd(0.1, 0, 0);
    cr_expect_eq(tp_optimizer_add_lr_mult(o, "a/*", 0.5), TP_OK);
    cr_expect_eq(tp_optimizer_add_lr_mult(o, "*", 2), TP_OK);
    cr_expect_eq(tp_optimizer_lr_mult(o, "a/W"), 0.5, "the first match wins");
    cr_expect_eq(tp_optimizer_lr_mult(o, "b/W"), 2.0);
    cr_expect_eq(tp_optimizer_add_lr_mult(o, "c", -1), TP_ERR_INVALID);
    tp_optimizer_destroy(&o);
    for (int towers = 1; towers <= 2; towers++) {
        float w[2][6], b[2][2], rw[2][6], rb[2][2];
        s_mult_w = s_mult_b = 1;
        tp_model_t *ref = s_fc_step(towers, rw, rb);
        tp_model_destroy(&ref);
        /* W at a quarter of the rate, b at three times */
        s_mult_w = 0.25, s_mult_b = 3;
        tp_model_t *m = s_fc_step(towers, w, b);
        cr_expect_eq(memcmp(w[0], rw[0], sizeof w[0]), 0, "same initial weights");
        for (int i = 0; i < 6; i++)
            cr_expect(fabsf((w[0][i] - w[1][i]) - 0.25f * (rw[0][i] - rw[1][i])) < 1e-7f,
                      "towers %d: W[%d] moved %g, want %g", towers, i, w[0][i] - w[1][i],
                      0.25f * (rw[0][i] - rw[1][i]));
        for (int i = 0; i < 2; i++)
            cr_expect(fabsf((b[0][i] - b[1][i]) - 3 * (rb[0][i] - rb[1][i])) < 1e-6f,
                      "towers %d: b[%d] moved %g, want %g", towers, i, b[0][i] - b[1][i],
                      3 * (rb[0][i] - rb[1][i]));
        tp_model_destroy(&m);
        /* W frozen: not trainable, no gradient, never moves; b as before */
        s_mult_w = 0, s_mult_b = 1;
        m = s_fc_step(towers, w, b);
        cr_expect_eq(memcmp(w[0], w[1], sizeof w[0]), 0, "towers %d: frozen W moved", towers);
        cr_expect_eq(memcmp(b[1], rb[1], sizeof b[1]), 0, "towers %d: b's step changed",
                     towers);
        for (int i = 0; i < tp_model_var_count(m); i++)
            if (!strcmp(tp_model_var_name(m, i), "fc/W"))
                cr_expect_eq(tp_model_var_trainable(m, i), 0);
        tp_tensor_t g;
        cr_expect_eq(tp_model_grad(m, 0, "fc/W", &g), TP_ERR_NOT_FOUND);
        tp_model_destroy(&m);
    }
}

static tp_optimizer_t *s_sgd_typo(void *u) {
    (void)u;
    tp_optimizer_t *o = tp_optimizer_sgd(1.0, 0.0, 0);
    if (o && (tp_optimizer_add_lr_mult(o, "fc/*", 0.5) < 0 ||
              tp_optimizer_add_lr_mult(o, "fc/b", 0) < 0 ||  /* shadowed: never first */
              tp_optimizer_add_lr_mult(o, "conv9/*", 0) < 0))
        tp_optimizer_destroy(&o);
    return o;
}

/* Every trainable variable frozen (tp-train --freeze '*'): the model is
 * refused when it is built, naming the pattern, instead of its first step
 * failing with "no fresh gradients". A pattern that decides no variable
 * (a typo, or one an earlier pattern shadows) is refused naming it and
 * the variables, instead of changing nothing unseen. */
Test(optim, freezing_every_variable_is_refused_at_build_naming_the_pattern) {
    s_mult_w = 0, s_mult_b = 0;
    tp_model_desc_t md = {s_desc, 2, s_fc_tower, s_sgd_mults, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = CB;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_expect_null(m);
    cr_expect(strstr(tp_last_error(), "pattern 'fc/?'") &&
                  strstr(tp_last_error(), "nothing is left to train"), "%s",
              tp_last_error());
    tp_model_destroy(&m);
    s_mult_w = 1, s_mult_b = 1;
    md.optimizer = s_sgd_typo;
    m = tp_model_new(&md, &cfg);
    cr_expect_null(m);
    cr_expect(strstr(tp_last_error(), "pattern 'fc/b' decides no trainable variable") &&
                  strstr(tp_last_error(), "fc/W, fc/b"), "%s", tp_last_error());
    tp_model_destroy(&m);
}

/* ---- weight-decay multipliers (nanoGPT's no-decay group) ---------------
 * AdamW at rate 0.1, decay 0.5, with fc/b exempt: fc/W takes exactly the
 * step of AdamW with no patterns, fc/b exactly Adam's (decay 0). */

static double s_decay_wd, s_decay_b;
static tp_optimizer_t *s_adamw_decay(void *u) {
    (void)u;
    tp_optimizer_t *o = tp_optimizer_adamw(0.1, 0.9, 0.95, 1e-8, s_decay_wd);
    if (o && s_decay_b != 1 && tp_optimizer_add_decay_mult(o, "fc/b", s_decay_b) < 0)
        tp_optimizer_destroy(&o);
    return o;
}

static void s_decay_step(int towers, float w[6], float b[2]) {
    tp_model_t *m = s_fc_model(towers, s_adamw_decay);
    tp_tensor_t in[4];
    s_feeds(in);
    cr_assert_eq(tp_model_run(m, towers > 1 ? TP_ALL_TOWERS : 0, in, 2 * towers, NULL, 0,
                              NULL), TP_OK, "%s", tp_last_error());
    s_fc_vars(m, w, b);
    tp_model_destroy(&m);
}

Test(optim, decay_multipliers_exempt_matching_variables_from_adamw_decay) {
    tp_optimizer_t *o = tp_optimizer_adamw(0.1, 0.9, 0.999, 1e-8, 0.1);
    cr_expect_eq(tp_optimizer_add_decay_mult(o, "*/b", 0), TP_OK);
    cr_expect_eq(tp_optimizer_add_decay_mult(o, "*", 2), TP_OK);
    cr_expect_eq(tp_optimizer_decay_mult(o, "fc/b"), 0.0, "the first match wins");
    cr_expect_eq(tp_optimizer_decay_mult(o, "fc/W"), 2.0);
    cr_expect_eq(tp_optimizer_decay_mult_count(o), 2);
    cr_expect_eq(tp_optimizer_add_decay_mult(o, "c", -1), TP_ERR_INVALID);
    tp_optimizer_destroy(&o);
    o = tp_optimizer_adam(0.1, 0.9, 0.999, 1e-8);
    cr_expect_eq(tp_optimizer_add_decay_mult(o, "*/b", 0), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "adam decays no weights"), "%s", tp_last_error());
    tp_optimizer_destroy(&o);
    for (int towers = 1; towers <= 2; towers++) {
        float w[3][6], b[3][2];
        s_decay_wd = 0.5, s_decay_b = 1;  /* everything decays */
        s_decay_step(towers, w[0], b[0]);
        s_decay_wd = 0, s_decay_b = 1;    /* nothing decays */
        s_decay_step(towers, w[1], b[1]);
        s_decay_wd = 0.5, s_decay_b = 0;  /* fc/b exempt */
        s_decay_step(towers, w[2], b[2]);
        cr_expect_eq(memcmp(w[2], w[0], sizeof w[0]), 0, "towers %d: fc/W did not decay "
                     "as with no pattern", towers);
        cr_expect_eq(memcmp(b[2], b[1], sizeof b[1]), 0, "towers %d: fc/b decayed", towers);
        cr_expect_neq(memcmp(w[0], w[1], sizeof w[0]), 0, "the decay changed nothing");
    }
}

/* ---- gradient accumulation ---------------------------------------------
 * SGD at rate 1 with accumulate 3: the first two steps leave W alone, the
 * third moves it by the mean of the three steps' gradients (each step a
 * different batch), on every update path; the optimizer counts one
 * update. */

static int s_accumulate_k;
static tp_optimizer_t *s_sgd_acc(void *u) {
    (void)u;
    tp_optimizer_t *o = tp_optimizer_sgd(1.0, 0.0, 0);
    if (o && tp_optimizer_set(o, "accumulate", s_accumulate_k) < 0)
        tp_optimizer_destroy(&o);
    return o;
}

/* W (fc/W) before and after each of 3 steps by `path`, the inputs of
 * step s scaled by scale x s. */
static void s_acc_steps(int path, int k, double scale, float w[4][6]) {
    s_accumulate_k = k;
    tp_model_t *m = s_fc_model(path == 0 ? 1 : 2, s_sgd_acc);
    tp_tensor_t in[4], v;
    s_feeds(in);
    float x0[CB * 3];
    memcpy(x0, s_x, sizeof x0);
    for (int step = 0; step <= 3; step++) {
        if (step > 0) {
            for (int i = 0; i < CB * 3; i++)
                s_x[i] = x0[i] * (float)(scale * step);
            s_run_path(m, path, in);
        }
        cr_assert_eq(tp_model_var(m, "fc/W", &v), TP_OK);
        memcpy(w[step], v.data, sizeof w[step]);
        tp_tensor_fini(&v);
    }
    memcpy(s_x, x0, sizeof x0);
    cr_expect_eq(tp_optimizer_step(tp_model_optimizer(m)), k == 3 ? 1 : 3, "updates");
    tp_model_destroy(&m);
}

Test(optim, accumulate_updates_every_kth_step_with_the_mean) {
    tp_optimizer_t *o = tp_optimizer_adam(0.1, 0.9, 0.999, 1e-8);
    cr_expect_eq(tp_optimizer_accumulate(o), 1);
    cr_expect_eq(tp_optimizer_set(o, "accumulate", 0), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_set(o, "accumulate", 2.5), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_set(o, "accumulate", 4), TP_OK);
    cr_expect_eq(tp_optimizer_accumulate(o), 4);
    tp_optimizer_destroy(&o);
    s_mult_w = s_mult_b = 1;
    for (int path = 0; path < 3; path++) {
        float w[4][6];
        s_acc_steps(path, 3, 1.0, w);
        cr_expect_eq(memcmp(w[1], w[0], sizeof w[0]), 0, "path %d: step 1 updated", path);
        cr_expect_eq(memcmp(w[2], w[0], sizeof w[0]), 0, "path %d: step 2 updated", path);
        /* the mean of the three steps' gradients, all at the initial W:
         * each the first step of a run without accumulation whose inputs
         * are scaled as that step's */
        double mean[6] = {0};
        for (int sc = 1; sc <= 3; sc++) {
            float one[4][6];
            s_acc_steps(path, 1, sc, one);
            cr_expect_eq(memcmp(one[0], w[0], sizeof w[0]), 0, "same initial W");
            for (int i = 0; i < 6; i++)
                mean[i] += ((double)one[0][i] - one[1][i]) / 3;
        }
        for (int i = 0; i < 6; i++)
            cr_expect(fabs((w[0][i] - w[3][i]) - mean[i]) < 1e-6,
                      "path %d: W[%d] moved %.8f, the mean gradient is %.8f", path, i,
                      w[0][i] - w[3][i], mean[i]);
    }
}

/* The CPU's SGD runs over the tower's team (a one-tower step at --threads
 * 2 updated on one core before): on 1 and 2 threads the same bits as the
 * plain loop, for momentum, Nesterov and plain SGD, and a part on a
 * worker thread. */
Test(optim, cpu_sgd_over_the_team_gives_the_same_bits_on_one_and_two_threads) {
    enum { N = (1 << 20) + 5 }; /* 32 parts; a tail past every vector width */
    float *init = malloc(3 * N * sizeof(float)), *ref = malloc(2 * N * sizeof(float));
    float *run = malloc(2 * N * sizeof(float));
    cr_assert(init && ref && run);
    for (size_t j = 0; j < 3 * (size_t)N; j++)  /* w, v, g */
        init[j] = (float)((int)((j * 2654435761u) % 2001) - 1000) * 1e-3f;
    const float *g = init + 2 * (size_t)N;
    tp_backend_t *b = tp_backend_cpu_new(2);
    cr_assert_not_null(b, "%s", tp_last_error());
    const size_t before = atomic_load(&tp_cpu_pool_worker_parts);
    const struct { float mu; int nesterov; } cases[] = {{0.9f, 0}, {0.9f, 1}, {0.0f, 0}};
    for (int c = 0; c < 3; c++) {
        const float lr = 0.05f, mu = cases[c].mu;
        memcpy(ref, init, 2 * N * sizeof(float));
        float *w = ref, *v = ref + N;
        for (size_t i = 0; i < N; i++) {  /* backend_cpu.c's arithmetic */
            if (mu == 0.0f) {
                w[i] -= lr * g[i];
            } else {
                v[i] = mu * v[i] + g[i];
                w[i] -= cases[c].nesterov ? lr * (g[i] + mu * v[i]) : lr * v[i];
            }
        }
        /* 1 thread, then 2 until a part ran on a worker (on a loaded
         * machine the caller may take every part first), at most 50 runs */
        const size_t parts = atomic_load(&tp_cpu_pool_worker_parts);
        for (int threads = 1, r = 0; r < 50; r++, threads = 2) {
            if (r > 1 && atomic_load(&tp_cpu_pool_worker_parts) > parts)
                break;
            memcpy(run, init, 2 * N * sizeof(float));
            tp_cpu_pool_threads_override(threads);
            cr_assert_eq(b->ops->sgd_update(b, NULL, run, g, mu > 0 ? run + N : NULL, N,
                                            lr, mu, cases[c].nesterov), TP_OK);
            tp_cpu_pool_threads_override(0);
            cr_assert_eq(memcmp(run, ref, 2 * N * sizeof(float)), 0,
                         "momentum %g nesterov %d, %d thread(s): not the loop's bits",
                         (double)mu, cases[c].nesterov, threads);
        }
    }
    cr_expect_gt(atomic_load(&tp_cpu_pool_worker_parts), before,
                 "sgd: no part ran on a worker thread");
    tp_backend_destroy(&b);
    free(init);
    free(ref);
    free(run);
}

/* SGD's coupled decay in the update's own pass (backend_impl.h's
 * sgd_wd_update, which tp_optimizer_update_group calls when the backend
 * has it): torch.optim.SGD's float arithmetic (d = g + C w, v = mu v + d,
 * w -= lr v) to the bit, one backend call a step and no sgd_update; the
 * two-call path it replaced (a backend without it) within rounding. A
 * pass that dropped the decay, doubled it or left v without it fails. */
static atomic_int s_sgd_calls, s_sgd_wd_calls;
static const tp_backend_ops_t *s_cpu_ops;
static tp_status_t s_count_sgd(tp_backend_t *b, tp_stream_t *s, float *w, const float *g,
                               float *v, size_t n, float lr, float mu, int nesterov) {
    atomic_fetch_add(&s_sgd_calls, 1);
    return s_cpu_ops->sgd_update(b, s, w, g, v, n, lr, mu, nesterov);
}
static tp_status_t s_count_sgd_wd(tp_backend_t *b, tp_stream_t *s, float *w, const float *g,
                                  float *v, size_t n, float lr, float mu, int nesterov,
                                  float wd) {
    atomic_fetch_add(&s_sgd_wd_calls, 1);
    return s_cpu_ops->sgd_wd_update(b, s, w, g, v, n, lr, mu, nesterov, wd);
}

Test(optim, sgd_weight_decay_in_the_updates_pass_is_torchs_float_arithmetic) {
    enum { N = 70001, STEPS = 4 };
    float *g = malloc((size_t)STEPS * N * sizeof *g), *w[3], *v[3];
    cr_assert_not_null(g);
    for (int k = 0; k < 3; k++) {
        w[k] = malloc(N * sizeof(float));
        v[k] = calloc(N, sizeof(float));
        cr_assert(w[k] && v[k]);
    }
    for (size_t j = 0; j < (size_t)STEPS * N; j++)
        g[j] = (float)((int)((j * 2654435761u) % 2001) - 1000) * 1e-3f;
    for (size_t i = 0; i < N; i++)
        w[0][i] = w[1][i] = w[2][i] = (float)((int)((i * 40503u) % 1999) - 999) * 2e-3f;
    const float lr = 0.1f, mu = 0.9f, wd = 0.05f;
    for (int s = 0; s < STEPS; s++)  /* [0]: the reference, in float */
        for (size_t i = 0; i < N; i++) {
            v[0][i] = mu * v[0][i] + (g[(size_t)s * N + i] + wd * w[0][i]);
            w[0][i] -= lr * v[0][i];
        }
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    cr_assert_not_null(b->ops->sgd_wd_update, "the CPU backend fuses the decay");
    s_cpu_ops = b->ops;
    tp_backend_ops_t ops = *b->ops;
    ops.sgd_update = s_count_sgd;
    ops.sgd_wd_update = s_count_sgd_wd;
    for (int k = 1; k < 3; k++) {  /* [1]: this backend; [2]: without the fused op */
        tp_optimizer_t *o = tp_optimizer_sgd(lr, mu, 0);
        cr_assert_eq(tp_optimizer_set(o, "weight_decay", wd), TP_OK, "%s", tp_last_error());
        ops.sgd_wd_update = k == 1 ? s_count_sgd_wd : NULL;
        b->ops = &ops;
        atomic_store(&s_sgd_calls, 0);
        atomic_store(&s_sgd_wd_calls, 0);
        float *slots[2] = {v[k], NULL};
        for (int s = 0; s < STEPS; s++)
            cr_assert_eq(tp_optimizer_apply(o, b, NULL, w[k], g + (size_t)s * N, slots, N),
                         TP_OK, "%s", tp_last_error());
        cr_expect_eq(atomic_load(&s_sgd_wd_calls), k == 1 ? STEPS : 0, "fused calls");
        cr_expect_eq(atomic_load(&s_sgd_calls), k == 1 ? 0 : 2 * STEPS, "sgd_update calls");
        b->ops = s_cpu_ops;
        tp_optimizer_destroy(&o);
    }
    cr_expect_eq(memcmp(w[1], w[0], N * sizeof(float)), 0, "fused weights: not torch's bits");
    cr_expect_eq(memcmp(v[1], v[0], N * sizeof(float)), 0, "fused momentum: not torch's bits");
    double worst = 0;  /* the two calls: mu (v + (C / mu) w) rounds apart */
    for (size_t i = 0; i < N; i++)
        worst = fmax(worst, fabs((double)w[2][i] - w[0][i]));
    /* |w| <= 2: a few float32 ulps; the decay's own share of the 4 steps
     * is about lr x C x |w| x 4 = 0.02 x |w| */
    cr_expect_lt(worst, 2e-6, "two calls against one pass: %g apart", worst);
    cr_expect_gt(worst, 0.0, "the two-call path ran (it rounds differently)");
    tp_backend_destroy(&b);
    for (int k = 0; k < 3; k++)
        free(w[k]), free(v[k]);
    free(g);
}

/* ---- two towers, each on its thread: the all-reduce fused with SGD's
 * coupled decay (allreduce_sgd_wd), the decay multipliers as segments of
 * the arena. x @ W + x @ V, V spared (decay multiplier 0); each tower
 * its own batch. Against the same model whose learning-rate multiplier
 * (1, on V: the same rate) keeps the reduce and the update apart: the same
 * bits in W and V after 3 steps (the momentum in them). */
static tp_status_t s_tower_wv(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    int64_t ws[2] = {3, 2};
    tp_node_t *w = tp_variable(t, "W", 2, ws, (tp_init_t){TP_INIT_ZEROS, 0}, TP_VAR_TRAINABLE);
    tp_node_t *v = tp_variable(t, "V", 2, ws, (tp_init_t){TP_INIT_ZEROS, 0}, TP_VAR_TRAINABLE);
    tp_node_t *l = tp_add(t, "logits", tp_matmul(t, "xw", in[0], w), tp_matmul(t, "xv", in[0], v));
    return tp_tower_set_cost(t, tp_softmax_xent(t, "xent", l, in[1]));
}

static tp_optimizer_t *s_sgd_wd(void *u) {
    tp_optimizer_t *o = tp_optimizer_sgd(0.1, 0.9, 0);
    if (o && (tp_optimizer_set(o, "weight_decay", 0.3) < 0 ||
              tp_optimizer_add_decay_mult(o, "V", 0.0) < 0 ||
              (u && tp_optimizer_add_lr_mult(o, "V", 1.0) < 0)))
        tp_optimizer_destroy(&o);
    return o;
}

typedef struct {
    tp_model_t *m;
    int tower;
    tp_tensor_t in[2];
    tp_status_t rc;
} s_tower_run_t;

static void *s_tower_thread(void *p) {
    s_tower_run_t *r = p;
    r->rc = tp_model_run(r->m, r->tower, r->in, 2, NULL, 0, NULL);
    return NULL;
}

/* all-reduce, clip and Adam fused (allreduce_adam), counted */
static atomic_int s_adam_fused_calls;
static tp_status_t s_count_allreduce_adam(tp_backend_t *b, tp_comm_t *c, int rank,
                                          tp_stream_t *s, float *buf, size_t count,
                                          int average, float *w, float *m, float *v,
                                          float lr, float b1, float b2, float eps,
                                          int64_t step, float clip, const size_t *seg,
                                          const float *decay, int nseg) {
    atomic_fetch_add(&s_adam_fused_calls, 1);
    return s_cpu_ops->allreduce_adam(b, c, rank, s, buf, count, average, w, m, v, lr, b1,
                                     b2, eps, step, clip, seg, decay, nseg);
}

/* 3 steps of the W, V model on two towers, each on its thread with its
 * own batch, trained by opt(u): W and V after them in out[0], out[1]; the
 * fused all-reduce and Adam calls counted (the backend's op wrapped). */
static void s_wv_train(tp_optimizer_fn opt, void *u, float out[2][6], int *adam_fused) {
    static float x[2][CB * 3];
    static int32_t y[2][CB];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < CB * 3; i++)
            x[k][i] = (float)((k + 1) * sin(1.0 + 0.7 * i));
        for (int i = 0; i < CB; i++)
            y[k][i] = (i + k) % 2;
    }
    tp_model_desc_t md = {s_desc, 2, s_tower_wv, opt, u};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 2;
    cfg.batch = CB;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    tp_backend_t *b = tp_model_tower_backend(m, 0);
    s_cpu_ops = b->ops;
    static tp_backend_ops_t ops;
    ops = *b->ops;
    if (ops.allreduce_adam)
        ops.allreduce_adam = s_count_allreduce_adam;
    b->ops = &ops;
    atomic_store(&s_adam_fused_calls, 0);
    const char *names[2] = {"W", "V"};
    for (int j = 0; j < 2; j++) {
        tp_tensor_t w;
        cr_assert_eq(tp_model_var(m, names[j], &w), TP_OK);
        memcpy(w.data, s_w0, sizeof s_w0);
    }
    for (int s = 0; s < 3; s++) {
        s_tower_run_t r[2];
        pthread_t th[2];
        int64_t xs[2] = {CB, 3}, ys[1] = {CB};
        for (int k = 0; k < 2; k++) {
            r[k] = (s_tower_run_t){.m = m, .tower = k};
            tp_tensor_init_wrap(&r[k].in[0], TP_FLOAT32, 2, xs, x[k], NULL, NULL);
            tp_tensor_init_wrap(&r[k].in[1], TP_INT32, 1, ys, y[k], NULL, NULL);
            cr_assert_eq(pthread_create(&th[k], NULL, s_tower_thread, &r[k]), 0);
        }
        for (int k = 0; k < 2; k++) {
            pthread_join(th[k], NULL);
            cr_assert_eq(r[k].rc, TP_OK, "tower %d: %s", k, tp_last_error());
        }
    }
    for (int j = 0; j < 2; j++) {
        tp_tensor_t w;
        cr_assert_eq(tp_model_var(m, names[j], &w), TP_OK, "%s", names[j]);
        memcpy(out[j], w.data, sizeof s_w0);
    }
    *adam_fused = atomic_load(&s_adam_fused_calls);
    b->ops = s_cpu_ops;
    tp_model_destroy(&m);
}

Test(optim, two_towers_fuse_the_decayed_update_into_the_all_reduce_with_the_same_bits) {
    float out[2][2][6];
    int fused;
    for (int apart = 0; apart < 2; apart++)
        s_wv_train(s_sgd_wd, apart ? (void *)1 : NULL, out[apart], &fused);
    cr_expect_eq(memcmp(out[0][0], out[1][0], sizeof s_w0), 0, "W");
    cr_expect_eq(memcmp(out[0][1], out[1][1], sizeof s_w0), 0, "V (spared)");
    cr_expect(memcmp(out[0][0], s_w0, sizeof s_w0) != 0, "W moved");
}

/* The same with AdamW, the global-norm clip and V spared by its decay
 * multiplier (the GPT's recipe on 2 towers x 1 thread, issue 45): the
 * all-reduce, the clip and the update in one call a tower a step
 * (allreduce_adam), the same bits in W and V as the unfused calls (the
 * learning-rate multiplier keeps them apart); a clip under the norm (it
 * scales) and above it. */
static double s_adamw_clip;
static tp_optimizer_t *s_adamw_wd(void *u) {
    tp_optimizer_t *o = tp_optimizer_adamw(0.05, 0.9, 0.95, 1e-8, 0.3);
    if (o && (tp_optimizer_set(o, "clip_norm", s_adamw_clip) < 0 ||
              tp_optimizer_add_decay_mult(o, "V", 0.0) < 0 ||
              (u && tp_optimizer_add_lr_mult(o, "V", 1.0) < 0)))
        tp_optimizer_destroy(&o);
    return o;
}

Test(optim, two_towers_fuse_clip_and_adamw_into_the_all_reduce_with_the_same_bits) {
    const double clips[] = {0.05, 100.0, 0.0};
    for (int c = 0; c < 3; c++) {
        s_adamw_clip = clips[c];
        float out[2][2][6];
        int fused[2];
        for (int apart = 0; apart < 2; apart++)
            s_wv_train(s_adamw_wd, apart ? (void *)1 : NULL, out[apart], &fused[apart]);
        cr_expect_eq(fused[0], 2 * 3, "clip %g: one fused call a tower a step", clips[c]);
        cr_expect_eq(fused[1], 0, "clip %g: a learning-rate multiplier keeps them apart",
                     clips[c]);
        cr_expect_eq(memcmp(out[0][0], out[1][0], sizeof s_w0), 0, "clip %g: W", clips[c]);
        cr_expect_eq(memcmp(out[0][1], out[1][1], sizeof s_w0), 0, "clip %g: V (spared)",
                     clips[c]);
        cr_expect(memcmp(out[0][0], s_w0, sizeof s_w0) != 0, "W moved");
    }
}
