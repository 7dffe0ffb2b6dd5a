/* towerpack tests: every op's backward against central finite differences,
 * and the forward values of the ops that have no gradient.
 *
 * Each case builds a one-tower model whose cost is softmax cross-entropy of
 * a random linear head over the op's output; the op's input x is a
 * trainable variable, so the check covers dx, the op's parameters and the
 * head alike. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <towerpack/towerpack.h>

/* tp_model_run with only its stages set. */
static tp_status_t s_run(tp_model_t *m, int tower, const tp_tensor_t *in,
                         int nin, unsigned stages) {
    tp_run_opts_t o = {.stages = stages};
    return tp_model_run(m, tower, in, nin, NULL, 0, &o);
}

#define N 4
#define CLASSES 3

typedef tp_node_t *(*case_fn)(tp_tower_t *t, tp_node_t *x);

typedef struct {
    case_fn fn;
    int ndim;
    int64_t shape[4]; /* x; shape[0] must be N */
    int expect_bad;   /* the checker must find a wrong gradient (the
                         deliberate fault of ops_elementwise.h is on) */
    double fd_scale;  /* x's backward is this times the finite difference
                         (0: 1); stop_gradient's case blocks half of it */
} fd_case_t;

/* The elementwise kernels' test-only fault (gpu/cpu/ops_elementwise.h). */
extern float tp_cpu_elementwise_grad_fault;

/* The labels input (int32 [N]) of the tower being built: the shape
 * family's cases use it as indices. */
static tp_node_t *s_fd_labels;

static tp_status_t s_build(tp_tower_t *t, tp_node_t *const *in, void *user) {
    fd_case_t *c = user;
    s_fd_labels = in[0];
    tp_node_t *x = tp_variable(t, "x", c->ndim, c->shape,
                               (tp_init_t){TP_INIT_NORMAL, 1.0f},
                               TP_VAR_TRAINABLE);
    tp_node_t *y = c->fn(t, x);
    tp_node_t *cost;
    if (y && tp_node_shape(y)->ndim == 0) {
        tp_node_t *logits = tp_fc(t, "head", tp_flatten(t, NULL, x), CLASSES, 1);
        cost = tp_add(t, "cost", tp_softmax_xent(t, "xent", logits, in[0]), y);
    } else {
        tp_node_t *logits = tp_fc(t, "head", tp_flatten(t, NULL, y), CLASSES, 1);
        cost = tp_softmax_xent(t, "cost", logits, in[0]);
    }
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *s_opt(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.1, 0.0, 0);
}

static float s_cost(tp_model_t *m, const tp_tensor_t *in, const tp_rng_t *r0) {
    *tp_model_tower_rng(m, 0) = *r0;
    cr_assert_eq(s_run(m, 0, in, 1, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, 0, "cost", &v), TP_OK);
    return *(float *)v.data;
}

static void s_check(fd_case_t *c, const char *what) {
    tp_input_desc_t desc = {"labels", TP_INT32, 1, {-1}};
    tp_model_desc_t md = {&desc, 1, s_build, s_opt, c};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = N;
    cfg.seed = 7;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s: %s", what, tp_last_error());
    int32_t labels[N] = {0, 2, 1, 2};
    int64_t ls[1] = {N};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_INT32, 1, ls, labels, NULL, NULL);
    tp_rng_t r0 = *tp_model_tower_rng(m, 0);
    cr_assert_eq(s_run(m, 0, &in, 1, TP_RUN_GRADIENTS), TP_OK, "%s: %s", what, tp_last_error());
    const double eps = 1e-3;
    int checked = 0, bad = 0;
    for (int vi = 0; vi < tp_model_var_count(m); vi++) {
        if (!tp_model_var_trainable(m, vi))
            continue;
        const char *name = tp_model_var_name(m, vi);
        tp_tensor_t w, g;
        cr_assert_eq(tp_model_var(m, name, &w), TP_OK);
        cr_assert_eq(tp_model_grad(m, 0, name, &g), TP_OK);
        size_t n = tp_tensor_numel(&w);
        size_t stride = n > 48 ? n / 48 : 1;
        float *wd = w.data, *gd = g.data;
        for (size_t i = 0; i < n; i += stride) {
            float keep = wd[i];
            wd[i] = (float)(keep + eps);
            double up = s_cost(m, &in, &r0);
            wd[i] = (float)(keep - eps);
            double dn = s_cost(m, &in, &r0);
            wd[i] = keep;
            double num = (up - dn) / (2 * eps) *
                         (c->fd_scale && !strcmp(name, "x") ? c->fd_scale : 1.0),
                   ana = gd[i];
            const int ok = fabs(num - ana) <= 2e-3 + 3e-2 * fabs(num);
            bad += !ok;
            if (!c->expect_bad)
                cr_expect(ok, "%s: d cost / d %s[%zu]: backward %.6f, finite "
                          "difference %.6f", what, name, i, ana, num);
            checked++;
        }
    }
    cr_assert_gt(checked, 0);
    if (c->expect_bad)
        cr_expect_gt(bad, 0, "%s: a deliberately wrong gradient passed the "
                     "finite-difference check", what);
    tp_model_destroy(&m);
}

#define X4(c, h, w) 4, {N, c, h, w}

static tp_node_t *c_relu(tp_tower_t *t, tp_node_t *x) { return tp_relu(t, NULL, x); }
static tp_node_t *c_leaky(tp_tower_t *t, tp_node_t *x) {
    return tp_leaky_relu(t, NULL, x, 0.1f);
}
static tp_node_t *c_tanh(tp_tower_t *t, tp_node_t *x) { return tp_tanh(t, NULL, x); }
static tp_node_t *c_sigmoid(tp_tower_t *t, tp_node_t *x) {
    return tp_sigmoid(t, NULL, x);
}
static tp_node_t *c_scale(tp_tower_t *t, tp_node_t *x) {
    return tp_scale(t, NULL, x, -1.5f);
}
static tp_node_t *c_fc(tp_tower_t *t, tp_node_t *x) { return tp_fc(t, "fc", x, 5, 1); }
static tp_node_t *c_conv3(tp_tower_t *t, tp_node_t *x) {
    return tp_conv2d(t, "conv", x, 4, 3, 1, -1, 1);
}
static tp_node_t *c_conv_s2(tp_tower_t *t, tp_node_t *x) {
    return tp_conv2d(t, "conv", x, 3, 3, 2, 1, 0);
}
static tp_node_t *c_conv1x1(tp_tower_t *t, tp_node_t *x) {
    return tp_conv2d(t, "conv", x, 5, 1, 1, 0, 1);
}
static tp_node_t *c_conv_valid(tp_tower_t *t, tp_node_t *x) {
    return tp_conv2d(t, "conv", x, 2, 2, 1, 0, 1);
}
static tp_node_t *c_maxpool(tp_tower_t *t, tp_node_t *x) {
    return tp_max_pool(t, NULL, x, 2, 2, 0);
}
static tp_node_t *c_maxpool_pad(tp_tower_t *t, tp_node_t *x) {
    return tp_max_pool(t, NULL, x, 3, 2, 1);
}
static tp_node_t *c_avgpool(tp_tower_t *t, tp_node_t *x) {
    return tp_avg_pool(t, NULL, x, 3, 2, 1);
}
static tp_node_t *c_gap(tp_tower_t *t, tp_node_t *x) {
    return tp_global_avg_pool(t, NULL, x);
}
static tp_node_t *c_bn(tp_tower_t *t, tp_node_t *x) { return tp_batch_norm(t, "bn", x); }
static tp_node_t *c_dropout(tp_tower_t *t, tp_node_t *x) {
    return tp_dropout(t, NULL, x, 0.3f);
}
static tp_node_t *c_reshape(tp_tower_t *t, tp_node_t *x) {
    int64_t s[3] = {N, 6, 9};
    return tp_tanh(t, NULL, tp_reshape(t, NULL, x, 3, s));
}
static tp_node_t *c_add(tp_tower_t *t, tp_node_t *x) {
    return tp_add(t, NULL, x, tp_tanh(t, NULL, x)); /* x used twice */
}
static tp_node_t *c_concat(tp_tower_t *t, tp_node_t *x) {
    tp_node_t *xs[3] = {x, tp_sigmoid(t, NULL, x), x};
    return tp_concat(t, NULL, 3, xs);
}
static tp_node_t *c_l2(tp_tower_t *t, tp_node_t *x) {
    tp_node_t *h = tp_fc(t, "fc", x, 3, 1);
    (void)h;
    return tp_l2_decay(t, "l2", "*", 0.3f);
}
static tp_node_t *c_bias(tp_tower_t *t, tp_node_t *x) {
    int64_t s[1] = {3};
    tp_node_t *b = tp_variable(t, "b", 1, s, (tp_init_t){TP_INIT_NORMAL, 1.0f},
                               TP_VAR_TRAINABLE);
    return tp_bias_add(t, NULL, x, b);
}

#define FD_TEST(nm, fn_, ...)                                                \
    Test(ops_grad, nm) {                                                     \
        fd_case_t c = {fn_, __VA_ARGS__};                                    \
        s_check(&c, #nm);                                                    \
    }

FD_TEST(relu, c_relu, X4(2, 3, 3))
FD_TEST(leaky_relu, c_leaky, X4(2, 3, 3))
FD_TEST(tanh, c_tanh, X4(2, 3, 3))
FD_TEST(sigmoid, c_sigmoid, X4(2, 3, 3))
FD_TEST(scale, c_scale, 2, {N, 5})
FD_TEST(fc_matmul_bias, c_fc, X4(2, 3, 3))
FD_TEST(conv2d_3x3_same, c_conv3, X4(3, 5, 5))
FD_TEST(conv2d_stride2, c_conv_s2, X4(2, 6, 5))
FD_TEST(conv2d_1x1, c_conv1x1, X4(3, 3, 4))
FD_TEST(conv2d_valid, c_conv_valid, X4(2, 4, 4))
FD_TEST(max_pool, c_maxpool, X4(2, 4, 4))
FD_TEST(max_pool_padded, c_maxpool_pad, X4(2, 5, 5))
FD_TEST(avg_pool_padded, c_avgpool, X4(2, 5, 5))
FD_TEST(global_avg_pool, c_gap, X4(3, 3, 3))
FD_TEST(batch_norm_4d, c_bn, X4(3, 3, 3))
FD_TEST(batch_norm_2d, c_bn, 2, {N, 5})
FD_TEST(dropout, c_dropout, X4(2, 3, 3))
FD_TEST(reshape_flatten, c_reshape, X4(2, 3, 9))
FD_TEST(add_residual, c_add, X4(2, 3, 3))
FD_TEST(concat, c_concat, X4(2, 3, 3))
FD_TEST(l2_decay, c_l2, 2, {N, 4})
FD_TEST(bias_add_4d, c_bias, X4(3, 2, 2))

/* ---- the elementwise family: every op, broadcasting both ways ------------ */

/* A trainable operand of `ndim` dims for the binary ops' other side. */
static tp_node_t *s_var(tp_tower_t *t, const char *name, int ndim,
                        const int64_t *shape, float lo) {
    tp_node_t *v = tp_variable(t, name, ndim, shape,
                               (tp_init_t){TP_INIT_UNIFORM, 1.0f}, TP_VAR_TRAINABLE);
    /* lo > 0: kept away from 0 (a divisor) as v^2 + lo */
    return lo > 0 ? tp_add(t, NULL, tp_square(t, NULL, v), tp_scalar(t, NULL, lo)) : v;
}

typedef tp_node_t *(*bin_fn)(tp_tower_t *, const char *, tp_node_t *, tp_node_t *);
static tp_node_t *s_bin3(tp_tower_t *t, tp_node_t *x, bin_fn f, float lo) {
    /* x [N,2,3] against [3] (trailing), [2,1] (stretched inner) and a
     * scalar on the left */
    int64_t s3[1] = {3}, s21[2] = {2, 1};
    tp_node_t *y = f(t, NULL, x, s_var(t, "b3", 1, s3, lo));
    y = f(t, NULL, y, s_var(t, "b21", 2, s21, lo));
    y = f(t, NULL, s_var(t, "b0", 0, NULL, lo), y);
    return y;
}
static tp_node_t *c_add_bc(tp_tower_t *t, tp_node_t *x) { return s_bin3(t, x, tp_add, 0); }
static tp_node_t *c_sub_bc(tp_tower_t *t, tp_node_t *x) { return s_bin3(t, x, tp_sub, 0); }
static tp_node_t *c_mul_bc(tp_tower_t *t, tp_node_t *x) { return s_bin3(t, x, tp_mul, 0); }
static tp_node_t *c_div_bc(tp_tower_t *t, tp_node_t *x) {
    int64_t s3[1] = {3};
    /* x / b and b / (x^2 + 0.5) */
    tp_node_t *y = tp_div(t, NULL, x, s_var(t, "b3", 1, s3, 0.5f));
    tp_node_t *d = tp_add(t, NULL, tp_square(t, NULL, x), tp_scalar(t, NULL, 0.5f));
    return tp_add(t, NULL, y, tp_div(t, NULL, s_var(t, "b", 1, s3, 0), d));
}
static tp_node_t *c_max_bc(tp_tower_t *t, tp_node_t *x) { return s_bin3(t, x, tp_maximum, 0); }
static tp_node_t *c_min_bc(tp_tower_t *t, tp_node_t *x) { return s_bin3(t, x, tp_minimum, 0); }
static tp_node_t *c_x_twice_stretched(tp_tower_t *t, tp_node_t *x) {
    /* x as [N,6,1] times x as [N,1,6]: both operands stretched */
    int64_t a[3] = {N, 6, 1}, b[3] = {N, 1, 6};
    return tp_mul(t, NULL, tp_reshape(t, NULL, x, 3, a), tp_reshape(t, NULL, x, 3, b));
}
/* positive inputs for the ops with a domain: x^2 + 0.5 */
static tp_node_t *s_pos(tp_tower_t *t, tp_node_t *x) {
    return tp_add(t, NULL, tp_square(t, NULL, x), tp_scalar(t, NULL, 0.5f));
}
static tp_node_t *c_neg(tp_tower_t *t, tp_node_t *x) { return tp_neg(t, NULL, x); }
static tp_node_t *c_abs(tp_tower_t *t, tp_node_t *x) { return tp_abs(t, NULL, x); }
static tp_node_t *c_square(tp_tower_t *t, tp_node_t *x) { return tp_square(t, NULL, x); }
static tp_node_t *c_sqrt(tp_tower_t *t, tp_node_t *x) { return tp_sqrt(t, NULL, s_pos(t, x)); }
static tp_node_t *c_rsqrt(tp_tower_t *t, tp_node_t *x) { return tp_rsqrt(t, NULL, s_pos(t, x)); }
static tp_node_t *c_exp(tp_tower_t *t, tp_node_t *x) { return tp_exp(t, NULL, x); }
static tp_node_t *c_log(tp_tower_t *t, tp_node_t *x) { return tp_ln(t, NULL, s_pos(t, x)); }
static tp_node_t *c_pow(tp_tower_t *t, tp_node_t *x) { return tp_pow(t, NULL, s_pos(t, x), 2.5f); }
static tp_node_t *c_pow_neg(tp_tower_t *t, tp_node_t *x) {
    return tp_pow(t, NULL, s_pos(t, x), -1.5f);
}
static tp_node_t *c_clip(tp_tower_t *t, tp_node_t *x) { return tp_clip(t, NULL, x, -0.5f, 0.7f); }
static tp_node_t *c_gelu(tp_tower_t *t, tp_node_t *x) { return tp_gelu(t, NULL, x, 0); }
static tp_node_t *c_gelu_tanh(tp_tower_t *t, tp_node_t *x) { return tp_gelu(t, NULL, x, 1); }
static tp_node_t *c_silu(tp_tower_t *t, tp_node_t *x) { return tp_silu(t, NULL, x); }
static tp_node_t *c_softplus(tp_tower_t *t, tp_node_t *x) {
    /* x and 12x: both branches (12x passes the threshold of 20) */
    return tp_add(t, NULL, tp_softplus(t, NULL, x),
                  tp_softplus(t, NULL, tp_scale(t, NULL, x, 12.0f)));
}
static tp_node_t *c_constant(tp_tower_t *t, tp_node_t *x) {
    const float v[3] = {0.5f, -2.0f, 3.0f};
    int64_t s[2] = {1, 3};
    return tp_mul(t, NULL, x, tp_constant(t, "c", 2, s, v));
}
static tp_node_t *c_stop_gradient(tp_tower_t *t, tp_node_t *x) {
    /* x * stop(x): the backward gives stop(x) alone, half of d(x^2)/dx
     * that the finite difference sees (fd_scale 0.5) */
    return tp_mul(t, NULL, x, tp_stop_gradient(t, NULL, x));
}
static tp_node_t *c_broken_mul(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f; /* this forked test's process only */
    return c_mul_bc(t, x);
}

FD_TEST(add_broadcast, c_add_bc, 3, {N, 2, 3})
FD_TEST(sub_broadcast, c_sub_bc, 3, {N, 2, 3})
FD_TEST(mul_broadcast, c_mul_bc, 3, {N, 2, 3})
FD_TEST(div_broadcast, c_div_bc, 3, {N, 2, 3})
FD_TEST(maximum_broadcast, c_max_bc, 3, {N, 2, 3})
FD_TEST(minimum_broadcast, c_min_bc, 3, {N, 2, 3})
FD_TEST(mul_both_stretched, c_x_twice_stretched, 3, {N, 2, 3})
FD_TEST(neg, c_neg, 2, {N, 5})
FD_TEST(abs, c_abs, 2, {N, 5})
FD_TEST(square, c_square, 2, {N, 5})
FD_TEST(sqrt, c_sqrt, 2, {N, 5})
FD_TEST(rsqrt, c_rsqrt, 2, {N, 5})
FD_TEST(exp, c_exp, 2, {N, 5})
FD_TEST(log, c_log, 2, {N, 5})
FD_TEST(pow, c_pow, 2, {N, 5})
FD_TEST(pow_negative, c_pow_neg, 2, {N, 5})
FD_TEST(clip, c_clip, 2, {N, 5})
FD_TEST(gelu, c_gelu, 2, {N, 5})
FD_TEST(gelu_tanh, c_gelu_tanh, 2, {N, 5})
FD_TEST(silu, c_silu, 2, {N, 5})
FD_TEST(softplus, c_softplus, 2, {N, 5})
FD_TEST(constant, c_constant, 2, {N, 3})
FD_TEST(stop_gradient, c_stop_gradient, 2, {N, 5}, 0, 0.5)
/* the checker itself: a gradient 10% off must be reported */
FD_TEST(a_wrong_gradient_fails_the_check, c_broken_mul, 3, {N, 2, 3}, 1)

/* ---- the loss family: both inputs trainable, so both gradients are checked */

/* A second operand of x's shape [N,5], trainable ("target"). */
static tp_node_t *s_target(tp_tower_t *t) {
    int64_t s[2] = {N, 5};
    return tp_variable(t, "target", 2, s, (tp_init_t){TP_INIT_NORMAL, 1.0f},
                       TP_VAR_TRAINABLE);
}
static tp_node_t *c_mse(tp_tower_t *t, tp_node_t *x) { return tp_mse(t, NULL, x, s_target(t)); }
static tp_node_t *c_l1(tp_tower_t *t, tp_node_t *x) { return tp_l1_loss(t, NULL, x, s_target(t)); }
static tp_node_t *c_huber(tp_tower_t *t, tp_node_t *x) {
    /* delta 0.5 against differences of N(0, 2): both branches */
    return tp_huber_loss(t, NULL, x, s_target(t), 0.5f);
}
static tp_node_t *c_sigmoid_xent(tp_tower_t *t, tp_node_t *x) {
    /* labels in (0,1) as sigmoid(target); logits 6x reach the tails */
    return tp_sigmoid_xent(t, NULL, tp_scale(t, NULL, x, 6.0f),
                           tp_sigmoid(t, NULL, s_target(t)));
}
static tp_node_t *c_broken_mse(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f; /* this forked test's process only */
    return c_mse(t, x);
}

FD_TEST(mse, c_mse, 2, {N, 5})
FD_TEST(l1_loss, c_l1, 2, {N, 5})
FD_TEST(huber_loss, c_huber, 2, {N, 5})
FD_TEST(sigmoid_xent, c_sigmoid_xent, 2, {N, 5})
FD_TEST(a_wrong_loss_gradient_fails_the_check, c_broken_mse, 2, {N, 5}, 1)

/* ---- the shape family: every op, its axes both ways ---------------------- */

static tp_node_t *c_transpose(tp_tower_t *t, tp_node_t *x) {
    /* [N,2,3] -> [3,N,2] (dim 0 moved) -> [N,3,2] */
    const int p1[3] = {2, 0, 1}, p2[3] = {1, 0, -1};
    return tp_transpose(t, NULL, tp_transpose(t, NULL, x, p1), p2);
}
static tp_node_t *c_slice(tp_tower_t *t, tp_node_t *x) {
    /* [N,5,6][:, 1:-1, ::-2] -> [N,3,3], then every other row of dim 0
     * twice over (x[0::2] and x[-3::2] overlap nowhere: [N/2] each) */
    const int64_t b[3] = {0, 1, -1}, e[3] = {TP_SLICE_END, -1, -TP_SLICE_END},
                  st[3] = {1, 1, -2};
    tp_node_t *y = tp_slice(t, NULL, x, b, e, st);
    const int64_t b2[3] = {0, 0, 0}, b3[3] = {-3, 0, 0},
                  e2[3] = {TP_SLICE_END, TP_SLICE_END, TP_SLICE_END}, s2[3] = {2, 1, 1};
    tp_node_t *parts[2] = {tp_slice(t, NULL, y, b2, e2, s2), tp_slice(t, NULL, y, b3, e2, s2)};
    return tp_concat_axis(t, NULL, 0, 2, parts);
}
static tp_node_t *c_split_concat(tp_tower_t *t, tp_node_t *x) {
    /* [N,7] split into 2 + 5 along -1, concatenated the other way round */
    tp_node_t *p[2];
    const int64_t sizes[2] = {2, 5};
    if (tp_split(t, "sp", x, -1, 2, sizes, p) < 0)
        return NULL;
    tp_node_t *q[2] = {tp_tanh(t, NULL, p[1]), p[0]};
    return tp_concat_axis(t, NULL, 1, 2, q);
}
static tp_node_t *c_concat_last(tp_tower_t *t, tp_node_t *x) {
    tp_node_t *xs[3] = {x, tp_sigmoid(t, NULL, x), x}; /* x twice: adds */
    return tp_concat_axis(t, NULL, -1, 3, xs);
}
static tp_node_t *c_pad(tp_tower_t *t, tp_node_t *x) {
    /* [N,2,3] -> [N+1,3,6] -> its last N rows (dim 0's pad cut off) */
    const int64_t b[3] = {1, 1, 2}, a[3] = {0, 0, 1};
    tp_node_t *y = tp_pad(t, NULL, tp_tanh(t, NULL, x), b, a, 0.5f);
    const int64_t s[3] = {1, 0, 0}, e[3] = {TP_SLICE_END, TP_SLICE_END, TP_SLICE_END};
    return tp_slice(t, NULL, y, s, e, NULL);
}
static tp_node_t *c_broadcast(tp_tower_t *t, tp_node_t *x) {
    /* [N,1,3] -> [2,N,4,3] -> [N,2,4,3] */
    const int64_t s[4] = {2, N, 4, 3};
    const int p[4] = {1, 0, 2, 3};
    return tp_transpose(t, NULL, tp_broadcast_to(t, NULL, x, 4, s), p);
}
static tp_node_t *c_gather(tp_tower_t *t, tp_node_t *x) {
    /* table x [3,5] by the labels {0,2,1,2} (row 2 twice: its gradient
     * adds) and by [N,2] indices made of them (an int32 concat) */
    tp_node_t *y = tp_gather_rows(t, NULL, x, s_fd_labels);
    const int64_t s2[2] = {-1, 1};
    tp_node_t *l2 = tp_reshape(t, NULL, s_fd_labels, 2, s2);
    tp_node_t *ls[2] = {l2, l2};
    tp_node_t *z = tp_gather_rows(t, NULL, x, tp_concat_axis(t, NULL, 1, 2, ls));
    const int64_t flat[2] = {-1, 10};
    tp_node_t *ys[2] = {y, tp_reshape(t, NULL, z, 2, flat)};
    return tp_concat_axis(t, NULL, 1, 2, ys);
}
static tp_node_t *c_one_hot(tp_tower_t *t, tp_node_t *x) {
    /* one_hot(labels) [N,5] @ x [5,3]: x's gradient is one_hot^T dy */
    return tp_matmul(t, NULL, tp_one_hot(t, NULL, s_fd_labels, 5), x);
}
static tp_node_t *c_reshape_infer(tp_tower_t *t, tp_node_t *x) {
    const int64_t s[3] = {N, -1, 2};
    return tp_tanh(t, NULL, tp_reshape(t, NULL, x, 3, s)); /* [N,3,2] */
}
static tp_node_t *c_broken_gather(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f; /* this forked test's process only */
    return tp_gather_rows(t, NULL, x, s_fd_labels);
}

FD_TEST(transpose, c_transpose, 3, {N, 2, 3})
FD_TEST(slice_negative_and_stepped, c_slice, 3, {N, 5, 6})
FD_TEST(split_then_concat, c_split_concat, 2, {N, 7})
FD_TEST(concat_last_axis, c_concat_last, 3, {N, 2, 3})
FD_TEST(pad, c_pad, 3, {N, 2, 3})
FD_TEST(broadcast_to, c_broadcast, 3, {N, 1, 3})
FD_TEST(gather_rows, c_gather, 2, {3, 5})
FD_TEST(one_hot_matmul, c_one_hot, 2, {5, 3})
FD_TEST(reshape_infers_minus_one, c_reshape_infer, 3, {N, 2, 3})
FD_TEST(a_wrong_gather_gradient_fails_the_check, c_broken_gather, 2, {3, 5}, 1)
/* ---- the convolution family: W and b trainable, so every input's gradient */

static tp_node_t *s_wvar(tp_tower_t *t, const char *name, int64_t a, int64_t b,
                         int64_t kh, int64_t kw) {
    int64_t s[4] = {a, b, kh, kw};
    return tp_variable(t, name, 4, s, (tp_init_t){TP_INIT_NORMAL, 0.5f}, TP_VAR_TRAINABLE);
}
static tp_node_t *s_bvar(tp_tower_t *t, int64_t n) {
    int64_t s[1] = {n};
    return tp_variable(t, "b", 1, s, (tp_init_t){TP_INIT_NORMAL, 0.5f}, TP_VAR_TRAINABLE);
}
static tp_node_t *c_conv_dilated(tp_tower_t *t, tp_node_t *x) {
    /* x [N,2,7,6]: 3x3 taps 2 apart, stride 1, pad 1 */
    return tp_conv2d_ex(t, NULL, x, s_wvar(t, "W", 3, 2, 3, 3), s_bvar(t, 3), 1, 1, 2, 1);
}
static tp_node_t *c_conv_grouped(tp_tower_t *t, tp_node_t *x) {
    /* x [N,4,5,5]: 2 groups of 2 -> 6 channels (3 per group), stride 2 */
    return tp_conv2d_ex(t, NULL, x, s_wvar(t, "W", 6, 2, 3, 3), s_bvar(t, 6), 2, 1, 1, 2);
}
static tp_node_t *c_conv_depthwise(tp_tower_t *t, tp_node_t *x) {
    /* x [N,3,5,5]: one group per channel, two filters each, dilated */
    return tp_conv2d_ex(t, NULL, x, s_wvar(t, "W", 6, 1, 2, 2), NULL, 1, 1, 2, 3);
}
static tp_node_t *c_deconv(tp_tower_t *t, tp_node_t *x) {
    /* x [N,3,3,3] -> [N,2,6,6]: the autoencoder's 4x4 stride 2 pad 1 */
    return tp_conv2d_transpose_op(t, NULL, x, s_wvar(t, "W", 3, 2, 4, 4), s_bvar(t, 2),
                                  2, 1, 0, 1, 1);
}
static tp_node_t *c_deconv_odd(tp_tower_t *t, tp_node_t *x) {
    /* x [N,4,3,2]: 3x2 kernel, stride 3, pad 1, output padding 2, 2 groups
     * (W [4,1,3,2] -> 2 channels), dilation 1 */
    return tp_conv2d_transpose_op(t, NULL, x, s_wvar(t, "W", 4, 1, 3, 2), s_bvar(t, 2),
                                  3, 1, 2, 1, 2);
}
static tp_node_t *c_deconv_dilated(tp_tower_t *t, tp_node_t *x) {
    /* x [N,2,3,3]: dilation 2, stride 2, output padding 1, no bias */
    return tp_conv2d_transpose_op(t, NULL, x, s_wvar(t, "W", 2, 3, 3, 3), NULL, 2, 1, 1, 2, 1);
}
static tp_node_t *c_deconv_layer(tp_tower_t *t, tp_node_t *x) {
    return tp_sigmoid(t, NULL, tp_conv2d_transpose(t, "deconv", x, 2, 4, 2, 1, 0, 1));
}
static tp_node_t *c_up_nearest(tp_tower_t *t, tp_node_t *x) {
    return tp_upsample_nearest(t, NULL, x, 3);
}
static tp_node_t *c_up_bilinear(tp_tower_t *t, tp_node_t *x) {
    return tp_upsample_bilinear(t, NULL, x, 2, 0);
}
static tp_node_t *c_up_bilinear_ac(tp_tower_t *t, tp_node_t *x) {
    return tp_upsample_bilinear(t, NULL, x, 3, 1);
}
static tp_node_t *c_broken_deconv(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f; /* this forked test's process only */
    return c_deconv(t, x);
}

FD_TEST(conv2d_dilated, c_conv_dilated, X4(2, 7, 6))
FD_TEST(conv2d_grouped, c_conv_grouped, X4(4, 5, 5))
FD_TEST(conv2d_depthwise, c_conv_depthwise, X4(3, 5, 5))
FD_TEST(conv2d_transpose, c_deconv, X4(3, 3, 3))
FD_TEST(conv2d_transpose_odd_grouped, c_deconv_odd, X4(4, 3, 2))
FD_TEST(conv2d_transpose_dilated, c_deconv_dilated, X4(2, 3, 3))
FD_TEST(conv2d_transpose_layer, c_deconv_layer, X4(3, 2, 3))
FD_TEST(upsample_nearest, c_up_nearest, X4(2, 2, 3))
FD_TEST(upsample_bilinear, c_up_bilinear, X4(2, 3, 2))
FD_TEST(upsample_bilinear_align_corners, c_up_bilinear_ac, X4(2, 2, 3))
FD_TEST(a_wrong_deconv_gradient_fails_the_check, c_broken_deconv, X4(3, 3, 3), 1)
/* ---- the linalg family: batched matmul and the norms --------------------- */

/* A trainable operand N(0, 1) of the given shape. */
static tp_node_t *s_param(tp_tower_t *t, const char *name, int ndim,
                          const int64_t *shape) {
    return tp_variable(t, name, ndim, shape, (tp_init_t){TP_INIT_NORMAL, 1.0f},
                       TP_VAR_TRAINABLE);
}
static tp_node_t *c_bmm_shared_b(tp_tower_t *t, tp_node_t *x) {
    /* x [N,3,5] @ w [5,4]: w shared by the batches (one stacked product) */
    int64_t s[2] = {5, 4};
    return tp_batch_matmul(t, NULL, x, s_param(t, "w", 2, s), 0, 0);
}
static tp_node_t *c_bmm_trans_both(tp_tower_t *t, tp_node_t *x) {
    /* x [N,2,3] read as [N,3,2] times w [N,4,2] read as [N,2,4] */
    int64_t s[3] = {N, 4, 2};
    return tp_batch_matmul(t, NULL, x, s_param(t, "w", 3, s), 1, 1);
}
static tp_node_t *c_bmm_shared_a(tp_tower_t *t, tp_node_t *x) {
    /* w [2,3,5] @ x as [N,1,5,2] -> [N,2,3,2]: w shared over x's batches,
     * x over w's (both gradients summed back) */
    int64_t s[3] = {2, 3, 5}, xs[4] = {N, 1, 5, 2};
    return tp_batch_matmul(t, NULL, s_param(t, "w", 3, s),
                           tp_reshape(t, NULL, x, 4, xs), 0, 0);
}
static tp_node_t *c_bmm_self(tp_tower_t *t, tp_node_t *x) {
    /* x x^T (attention scores): both gradients reach x */
    return tp_batch_matmul(t, NULL, x, x, 0, 1);
}
/* fused attention (tp_attention): x [N,2,5,4] as q, k and v at once (every
 * gradient reaches x), causal and not; and x as q only, k and v parameters
 * of their own (Tk 3 != Tq 5, so not causal) */
static tp_node_t *c_attn_self_causal(tp_tower_t *t, tp_node_t *x) {
    return tp_attention(t, NULL, x, x, x, 1, 0.0f);
}
static tp_node_t *c_attn_self_full(tp_tower_t *t, tp_node_t *x) {
    return tp_attention(t, NULL, x, x, x, 0, 0.7f);
}
static tp_node_t *c_attn_kv_params(tp_tower_t *t, tp_node_t *x) {
    int64_t s[4] = {N, 2, 3, 4};
    return tp_attention(t, NULL, x, s_param(t, "k", 4, s), s_param(t, "v", 4, s), 0, 0.0f);
}
/* the packed form (tp_attention_qkv): x [N,5,12] as q, k and v side by
 * side, 2 heads of D 2, causal; x [N,2,4,18] as 3 heads of 2 over leading
 * dims [N,2], full: every gradient into x's columns in place */
static tp_node_t *c_attn_packed_causal(tp_tower_t *t, tp_node_t *x) {
    return tp_attention_qkv(t, NULL, x, 2, 1, 0.0f);
}
static tp_node_t *c_attn_packed_full(tp_tower_t *t, tp_node_t *x) {
    return tp_attention_qkv(t, NULL, x, 3, 0, 0.6f);
}
/* 1-d operands (torch.matmul's promotion): a vector on either side */
static tp_node_t *c_bmm_vec_right(tp_tower_t *t, tp_node_t *x) {
    /* x [N,5,3] read as [N,3,5] @ v [5] -> [N,3] */
    int64_t s[1] = {5};
    return tp_batch_matmul(t, NULL, x, s_param(t, "v", 1, s), 1, 0);
}
static tp_node_t *c_bmm_vec_left(tp_tower_t *t, tp_node_t *x) {
    /* v [5] @ x [N,5,2] -> [N,2] (v's transpose flag ignored) */
    int64_t s[1] = {5};
    return tp_batch_matmul(t, NULL, s_param(t, "v", 1, s), x, 1, 0);
}
static tp_node_t *c_bmm_rows_vec(tp_tower_t *t, tp_node_t *x) {
    /* x [N,5] @ v [5] -> [N]: the batch is the rows */
    int64_t s[1] = {5};
    return tp_batch_matmul(t, NULL, x, s_param(t, "v", 1, s), 0, 0);
}
static tp_node_t *c_broken_bmm_vec(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f;
    return c_bmm_vec_left(t, x);
}
/* gamma N(0,1) and beta N(0,1) of the shape the norm wants */
static tp_node_t *c_layer_norm(tp_tower_t *t, tp_node_t *x) {
    int64_t s[1] = {5};
    return tp_layer_norm_op(t, NULL, x, s_param(t, "g", 1, s), s_param(t, "b", 1, s),
                            1, 1e-5f);
}
static tp_node_t *c_layer_norm_2(tp_tower_t *t, tp_node_t *x) {
    int64_t s[2] = {2, 3};
    return tp_layer_norm_op(t, NULL, x, s_param(t, "g", 2, s), s_param(t, "b", 2, s),
                            2, 1e-5f);
}
static tp_node_t *c_group_norm(tp_tower_t *t, tp_node_t *x) {
    int64_t s[1] = {4};
    return tp_group_norm_op(t, NULL, x, s_param(t, "g", 1, s), s_param(t, "b", 1, s),
                            2, 1e-5f);
}
static tp_node_t *c_instance_norm(tp_tower_t *t, tp_node_t *x) {
    int64_t s[1] = {3};
    return tp_instance_norm_op(t, NULL, x, s_param(t, "g", 1, s),
                               s_param(t, "b", 1, s), 1e-5f);
}
/* gamma and beta left out (elementwise_affine=False), or one of them */
static tp_node_t *c_layer_norm_plain(tp_tower_t *t, tp_node_t *x) {
    return tp_layer_norm_op(t, NULL, x, NULL, NULL, 2, 1e-5f);
}
static tp_node_t *c_layer_norm_beta_only(tp_tower_t *t, tp_node_t *x) {
    int64_t s[1] = {5};
    return tp_layer_norm_op(t, NULL, x, NULL, s_param(t, "b", 1, s), 1, 1e-5f);
}
static tp_node_t *c_group_norm_gamma_only(tp_tower_t *t, tp_node_t *x) {
    int64_t s[1] = {4};
    return tp_group_norm_op(t, NULL, x, s_param(t, "g", 1, s), NULL, 2, 1e-5f);
}
static tp_node_t *c_instance_norm_plain(tp_tower_t *t, tp_node_t *x) {
    return tp_instance_norm_op(t, NULL, x, NULL, NULL, 1e-5f);
}
static tp_node_t *c_broken_plain_norm(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f;
    return c_layer_norm_plain(t, x);
}
static tp_node_t *c_norm_layers(tp_tower_t *t, tp_node_t *x) {
    /* the layer builders (gamma 1, beta 0) chained */
    return tp_layer_norm(t, "ln", tp_group_norm(t, "gn", tp_instance_norm(t, "in", x), 3), 2);
}
static tp_node_t *c_broken_group_norm(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f; /* this forked test's process only */
    return c_group_norm(t, x);
}
static tp_node_t *c_broken_bmm(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f;
    return c_bmm_trans_both(t, x);
}

FD_TEST(batch_matmul_shared_b, c_bmm_shared_b, 3, {N, 3, 5})
FD_TEST(batch_matmul_trans_both, c_bmm_trans_both, 3, {N, 2, 3})
FD_TEST(batch_matmul_shared_a, c_bmm_shared_a, 3, {N, 5, 2})
FD_TEST(batch_matmul_x_xt, c_bmm_self, 3, {N, 3, 4})
FD_TEST(layer_norm, c_layer_norm, 2, {N, 5})
FD_TEST(layer_norm_2_axes, c_layer_norm_2, 3, {N, 2, 3})
FD_TEST(group_norm, c_group_norm, X4(4, 2, 3))
FD_TEST(instance_norm, c_instance_norm, X4(3, 3, 2))
FD_TEST(norm_layers, c_norm_layers, X4(3, 2, 2))
FD_TEST(layer_norm_without_gamma_and_beta, c_layer_norm_plain, 3, {N, 2, 3})
FD_TEST(layer_norm_beta_only, c_layer_norm_beta_only, 2, {N, 5})
FD_TEST(group_norm_gamma_only, c_group_norm_gamma_only, X4(4, 2, 3))
FD_TEST(instance_norm_without_gamma_and_beta, c_instance_norm_plain, X4(3, 3, 2))
FD_TEST(a_wrong_plain_norm_gradient_fails_the_check, c_broken_plain_norm, 3, {N, 2, 3}, 1)
FD_TEST(a_wrong_norm_gradient_fails_the_check, c_broken_group_norm, X4(4, 2, 3), 1)
FD_TEST(a_wrong_matmul_gradient_fails_the_check, c_broken_bmm, 3, {N, 2, 3}, 1)
FD_TEST(batch_matmul_vector_right, c_bmm_vec_right, 3, {N, 5, 3})
FD_TEST(batch_matmul_vector_left, c_bmm_vec_left, 3, {N, 5, 2})
FD_TEST(batch_matmul_rows_times_vector, c_bmm_rows_vec, 2, {N, 5})
FD_TEST(attention_causal_qkv_one_tensor, c_attn_self_causal, 4, {N, 2, 5, 4})
FD_TEST(attention_full_qkv_one_tensor, c_attn_self_full, 4, {N, 2, 5, 4})
FD_TEST(attention_keys_and_values_of_their_own, c_attn_kv_params, 4, {N, 2, 5, 4})
FD_TEST(attention_packed_qkv_causal, c_attn_packed_causal, 3, {N, 5, 12})
FD_TEST(attention_packed_qkv_full, c_attn_packed_full, 4, {N, 2, 4, 18})
FD_TEST(a_wrong_vector_matmul_gradient_fails_the_check, c_broken_bmm_vec, 3, {N, 5, 2}, 1)

/* ---- the reduce family ------------------------------------------------------ */

static tp_node_t *c_reduce_sum(tp_tower_t *t, tp_node_t *x) {
    const int ax[1] = {-1};
    return tp_reduce_sum(t, NULL, x, 1, ax, 0);
}
/* over the batch axis and the last, kept, scaling x: x * sum(x) reaches
 * every element by two paths */
static tp_node_t *c_reduce_sum_02(tp_tower_t *t, tp_node_t *x) {
    const int ax[2] = {0, 2};
    return tp_mul(t, NULL, x, tp_reduce_sum(t, NULL, x, 2, ax, 1));
}
static tp_node_t *c_reduce_mean(tp_tower_t *t, tp_node_t *x) {
    const int ax[2] = {2, 0};
    tp_node_t *m = tp_mul(t, NULL, x, tp_reduce_mean(t, NULL, x, 2, ax, 1));
    const int one[1] = {1};
    return tp_reduce_mean(t, NULL, m, 1, one, 0);
}
static tp_node_t *c_reduce_mean_all(tp_tower_t *t, tp_node_t *x) {
    return tp_reduce_mean(t, NULL, tp_square(t, NULL, x), 0, NULL, 0); /* a scalar */
}
static tp_node_t *c_reduce_max(tp_tower_t *t, tp_node_t *x) {
    const int ax[1] = {2};
    return tp_reduce_max(t, NULL, x, 1, ax, 0);
}
static tp_node_t *c_reduce_max_01(tp_tower_t *t, tp_node_t *x) {
    const int ax[2] = {0, 1};
    return tp_mul(t, NULL, x, tp_reduce_max(t, NULL, x, 2, ax, 1));
}
static tp_node_t *c_softmax_mid(tp_tower_t *t, tp_node_t *x) {
    return tp_softmax(t, NULL, tp_scale(t, NULL, x, 2.0f), 1);
}
static tp_node_t *c_softmax_first(tp_tower_t *t, tp_node_t *x) {
    return tp_softmax(t, NULL, x, 0);
}
static tp_node_t *c_log_softmax_last(tp_tower_t *t, tp_node_t *x) {
    return tp_log_softmax(t, NULL, x, -1);
}
static tp_node_t *c_log_softmax_first(tp_tower_t *t, tp_node_t *x) {
    return tp_log_softmax(t, NULL, x, 0);
}
/* logits x [N,3,5] against labels [N,3] made by argmax over a fixed
 * (model, untrained) tensor; class 1 is the ignore label */
static tp_node_t *c_xent_seq(tp_tower_t *t, tp_node_t *x) {
    int64_t s[3] = {N, 3, 5};
    tp_node_t *src = tp_variable(t, "label_src", 3, s, (tp_init_t){TP_INIT_NORMAL, 1.0f},
                                 TP_VAR_MODEL);
    return tp_softmax_xent_seq(t, NULL, x, tp_argmax(t, NULL, src, 2, 0), 1);
}
static tp_node_t *c_broken_log_softmax(tp_tower_t *t, tp_node_t *x) {
    tp_cpu_elementwise_grad_fault = 1.1f; /* this forked test's process only */
    return c_log_softmax_last(t, x);
}

FD_TEST(reduce_sum_last, c_reduce_sum, 3, {N, 2, 3})
FD_TEST(reduce_sum_batch_and_last_kept, c_reduce_sum_02, 3, {N, 2, 3})
FD_TEST(reduce_mean, c_reduce_mean, 3, {N, 2, 3})
FD_TEST(reduce_mean_all, c_reduce_mean_all, 3, {N, 2, 3})
FD_TEST(reduce_max_last, c_reduce_max, 3, {N, 2, 3})
FD_TEST(reduce_max_batch_and_mid_kept, c_reduce_max_01, 3, {N, 2, 3})
FD_TEST(softmax_mid_axis, c_softmax_mid, 3, {N, 2, 3})
FD_TEST(softmax_batch_axis, c_softmax_first, 3, {N, 2, 3})
FD_TEST(log_softmax_last_axis, c_log_softmax_last, 3, {N, 2, 3})
FD_TEST(log_softmax_batch_axis, c_log_softmax_first, 3, {N, 2, 3})
FD_TEST(softmax_xent_seq_with_ignored_labels, c_xent_seq, 3, {N, 3, 5})
FD_TEST(a_wrong_reduce_family_gradient_fails_the_check, c_broken_log_softmax, 3, {N, 2, 3}, 1)

/* ---- forward values of ops without gradients ------------------------------ */

/* int32 tokens through the shape family: one-hot, a slice of the ids
 * (language models' inputs and targets), a gather; a bad id fails the
 * step naming the node, the id and the bound. */
static tp_status_t s_tokens(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    const int64_t b[2] = {0, 1}, e[2] = {TP_SLICE_END, TP_SLICE_END};
    const int64_t ts[2] = {6, 2};
    tp_node_t *tab = tp_variable(t, "table", 2, ts, (tp_init_t){TP_INIT_UNIFORM, 1.0f},
                                 TP_VAR_TRAINABLE);
    tp_tower_add_output(t, "hot", tp_one_hot(t, "hot", in[0], 4));
    tp_tower_add_output(t, "next", tp_slice(t, "next", in[0], b, e, NULL));
    tp_tower_add_output(t, "emb", tp_gather_rows(t, "emb", tab, in[0]));
    return tp_tower_status(t);
}

Test(ops_fwd, one_hot_int_slice_gather_and_bad_indices) {
    tp_input_desc_t desc = {"tok", TP_INT32, 2, {-1, 3}};
    tp_model_desc_t md = {&desc, 1, s_tokens, NULL, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 0;
    cfg.infer_batch = 4;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    int32_t tok[6] = {0, 3, 1, /**/ 2, 2, 0};
    int64_t ts[2] = {2, 3};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_INT32, 2, ts, tok, NULL, NULL);
    cr_assert_eq(s_run(m, -1, &in, 1, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
    tp_tensor_t v, tab;
    cr_assert_eq(tp_model_fetch(m, -1, "hot", &v), TP_OK);
    cr_assert_eq(v.ndim, 3);
    cr_expect_eq(v.shape[0], 2); /* the step's batch */
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++)
            cr_expect_eq(((float *)v.data)[i * 4 + j], j == tok[i] ? 1.0f : 0.0f);
    cr_assert_eq(tp_model_fetch(m, -1, "next", &v), TP_OK);
    cr_assert_eq(v.dtype, TP_INT32);
    cr_assert_eq(v.shape[1], 2);
    const int32_t want[4] = {3, 1, 2, 0};
    cr_expect_eq(memcmp(v.data, want, sizeof want), 0);
    cr_assert_eq(tp_model_fetch(m, -1, "emb", &v), TP_OK);
    cr_assert_eq(tp_model_var(m, "table", &tab), TP_OK);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 2; j++)
            cr_expect_eq(((float *)v.data)[i * 2 + j], ((float *)tab.data)[tok[i] * 2 + j]);
    /* 5 is a row of the table (V = 6) but not a class of the one-hot */
    tok[4] = 5;
    cr_expect_eq(s_run(m, -1, &in, 1, TP_RUN_FORWARD), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "'hot'") && strstr(tp_last_error(), "index 5") &&
              strstr(tp_last_error(), "[0, 4)"), "%s", tp_last_error());
    tok[4] = 7;
    cr_expect_eq(s_run(m, -1, &in, 1, TP_RUN_FORWARD), TP_ERR_INVALID);
    tok[4] = 1;
    tok[1] = -1; /* not Python's wrap-around: an error */
    cr_expect_eq(s_run(m, -1, &in, 1, TP_RUN_FORWARD), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "index -1") != NULL, "%s", tp_last_error());
    tp_model_destroy(&m);
}

static tp_status_t s_gather_only(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    const int64_t ts[2] = {6, 2};
    tp_node_t *tab = tp_variable(t, "table", 2, ts, (tp_init_t){TP_INIT_UNIFORM, 1.0f},
                                 TP_VAR_TRAINABLE);
    tp_tower_add_output(t, "emb", tp_gather_rows(t, "emb", tab, in[0]));
    return tp_tower_status(t);
}

Test(ops_fwd, gather_index_out_of_range_names_node_index_and_v) {
    tp_input_desc_t desc = {"tok", TP_INT32, 1, {-1}};
    tp_model_desc_t md = {&desc, 1, s_gather_only, NULL, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 0;
    cfg.infer_batch = 3;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    int32_t tok[3] = {5, 6, 0};
    int64_t ts[1] = {3};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_INT32, 1, ts, tok, NULL, NULL);
    cr_expect_eq(s_run(m, -1, &in, 1, TP_RUN_FORWARD), TP_ERR_INVALID);
    const char *e = tp_last_error();
    cr_expect(strstr(e, "'emb'") && strstr(e, "index 6") && strstr(e, "element 1") &&
              strstr(e, "V = 6"), "%s", e);
    tp_model_destroy(&m);
}



static tp_status_t s_metrics(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *logits = tp_cast(t, "logits", in[0], 0.5f);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "acc", logits, in[1]));
    tp_tower_add_metric(t, "errors", tp_error_count(t, "err", logits, in[1]));
    tp_tower_add_output(t, "scaled", logits);
    return tp_tower_status(t);
}

Test(ops_fwd, cast_accuracy_error_count) {
    tp_input_desc_t desc[2] = {{"x", TP_UINT8, 2, {-1, 3}},
                               {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_metrics, NULL, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 0;
    cfg.infer_batch = 8;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    uint8_t x[4 * 3] = {1, 9, 3, /**/ 200, 2, 100, /**/ 0, 0, 7, /**/ 5, 6, 4};
    int32_t y[4] = {1, 0, 2, 0};
    int64_t xs[2] = {4, 3}, ys[1] = {4};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_UINT8, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    cr_assert_eq(s_run(m, -1, in, 2, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
    cr_expect_float_eq(tp_model_metric_value(m, -1, 0), 0.75f, 1e-6);
    cr_expect_float_eq(tp_model_metric_value(m, -1, 1), 1.0f, 1e-6);
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, -1, "scaled", &v), TP_OK);
    cr_expect_eq(v.shape[0], 4); /* the step's batch, not the planned 8 */
    cr_expect_float_eq(((float *)v.data)[3], 100.0f, 1e-6);
    /* a label out of range fails the step, naming the node */
    y[2] = 3;
    cr_expect_eq(s_run(m, -1, in, 2, TP_RUN_FORWARD), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "acc") != NULL, "%s", tp_last_error());
    tp_model_destroy(&m);
}

static float s_cast_alpha;
static tp_status_t s_cast_model(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_tower_add_output(t, "y", tp_cast(t, "y", in[0], s_cast_alpha));
    return tp_tower_status(t);
}

static void s_cast_exact(void);
/* Each test runs in its own process: the kernel is chosen at the first cast. */
Test(ops_fwd, uint8_cast_is_exact_for_every_value_and_length) { s_cast_exact(); }
Test(ops_fwd, uint8_cast_is_exact_with_avx2_only) {
    setenv("TP_ISA", "avx2", 1);
    s_cast_exact();
}
Test(ops_fwd, uint8_cast_is_exact_in_plain_c) {
    setenv("TP_ISA", "plain", 1);
    s_cast_exact();
}

static void s_cast_exact(void) {
    /* 3 x 331 bytes: whole 64-byte blocks and a tail, every byte value */
    enum { CN = 3, CL = 331 };
    static const float alphas[] = {1.0f / 255, 0.3f, -2.5f};
    for (size_t k = 0; k < sizeof alphas / sizeof *alphas; k++) {
        s_cast_alpha = alphas[k];
        tp_input_desc_t desc[1] = {{"x", TP_UINT8, 2, {-1, CL}}};
        tp_model_desc_t md = {desc, 1, s_cast_model, NULL, NULL};
        tp_model_config_t cfg = tp_model_config_default();
        cfg.towers = 0;
        cfg.infer_batch = CN;
        tp_model_t *m = tp_model_new(&md, &cfg);
        cr_assert_not_null(m, "%s", tp_last_error());
        uint8_t x[CN * CL];
        for (int i = 0; i < CN * CL; i++)
            x[i] = (uint8_t)(i * 7 + k);
        int64_t xs[2] = {CN, CL};
        tp_tensor_t in;
        tp_tensor_init_wrap(&in, TP_UINT8, 2, xs, x, NULL, NULL);
        cr_assert_eq(s_run(m, -1, &in, 1, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
        tp_tensor_t v;
        cr_assert_eq(tp_model_fetch(m, -1, "y", &v), TP_OK);
        const float *y = v.data;
        for (int i = 0; i < CN * CL; i++) {
            float want = alphas[k] * (float)x[i];
            cr_assert(memcmp(&y[i], &want, sizeof want) == 0,
                      "alpha %g: element %d: %.9g, want %.9g", alphas[k], i, y[i], want);
        }
        tp_tensor_fini(&v);
        tp_model_destroy(&m);
    }
}

/* Batch norm in inference uses the moving averages that tower 0 updated. */
static tp_status_t s_bn_model(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *y = tp_batch_norm(t, "bn", in[0]);
    tp_tower_add_output(t, "y", y);
    tp_node_t *logits = tp_fc(t, "fc", y, 2, 1);
    if (tp_tower_is_training(t))
        return tp_tower_set_cost(t, tp_softmax_xent(t, "xent", logits, in[1]));
    return tp_tower_status(t);
}

Test(ops_fwd, batch_norm_moving_averages) {
    tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, 2}},
                               {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_bn_model, s_opt, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 4;
    cfg.infer_batch = 4;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    float x[8] = {1, 10, 2, 20, 3, 30, 6, 40};
    int32_t y[4] = {0, 1, 0, 1};
    int64_t xs[2] = {4, 2}, ys[1] = {4};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    cr_assert_eq(s_run(m, 0, in, 2, TP_RUN_GRADIENTS), TP_OK, "%s", tp_last_error());
    tp_tensor_t mm, mv, out;
    cr_assert_eq(tp_model_var(m, "bn/mean/EMA", &mm), TP_OK);
    cr_assert_eq(tp_model_var(m, "bn/variance/EMA", &mv), TP_OK);
    /* channel 0: mean 3, unbiased variance 14/3 */
    cr_expect_float_eq(((float *)mm.data)[0], 0.1f * 3.0f, 1e-5);
    cr_expect_float_eq(((float *)mv.data)[0], 0.9f + 0.1f * 14.0f / 3.0f, 1e-5);
    /* training output is normalised with batch statistics */
    cr_assert_eq(tp_model_fetch(m, 0, "y", &out), TP_OK);
    float s = 0;
    for (int i = 0; i < 4; i++)
        s += ((float *)out.data)[2 * i];
    cr_expect(fabsf(s) < 1e-4f);
    cr_assert_eq(s_run(m, -1, in, 2, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_fetch(m, -1, "y", &out), TP_OK);
    float want = (1.0f - ((float *)mm.data)[0]) /
                 sqrtf(((float *)mv.data)[0] + 1e-5f);
    cr_expect_float_eq(((float *)out.data)[0], want, 1e-5);
    tp_model_destroy(&m);
}

/* Cross-entropy's backward when its logits feed two costs: the second
 * accumulates into the first's gradient, so every gradient is exactly
 * twice the one-cost model's (scaling by 2 is exact in floating point). */
static tp_status_t s_xent_twice(tp_tower_t *t, tp_node_t *const *in, void *u) {
    int64_t xs[2] = {N, 5};
    tp_node_t *x = tp_variable(t, "x", 2, xs, (tp_init_t){TP_INIT_NORMAL, 1.0f},
                               TP_VAR_TRAINABLE);
    tp_node_t *logits = tp_fc(t, "head", x, CLASSES, 1);
    tp_node_t *cost = tp_softmax_xent(t, "xent", logits, in[0]);
    if (u)
        cost = tp_add(t, "cost", cost, tp_softmax_xent(t, "xent2", logits, in[0]));
    return tp_tower_set_cost(t, cost);
}

Test(ops_bwd, softmax_xent_accumulates_when_its_logits_feed_two_costs) {
    tp_input_desc_t desc = {"labels", TP_INT32, 1, {-1}};
    int32_t labels[N] = {2, 0, 0, 1};
    int64_t ls[1] = {N};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_INT32, 1, ls, labels, NULL, NULL);
    tp_model_t *m[2];
    for (int k = 0; k < 2; k++) {
        tp_model_desc_t md = {&desc, 1, s_xent_twice, s_opt, k ? (void *)1 : NULL};
        tp_model_config_t cfg = tp_model_config_default();
        cfg.batch = N;
        cfg.seed = 11;
        m[k] = tp_model_new(&md, &cfg);
        cr_assert_not_null(m[k], "%s", tp_last_error());
        cr_assert_eq(s_run(m[k], 0, &in, 1, TP_RUN_GRADIENTS), TP_OK, "%s", tp_last_error());
    }
    int compared = 0;
    for (int vi = 0; vi < tp_model_var_count(m[0]); vi++) {
        const char *name = tp_model_var_name(m[0], vi);
        if (!tp_model_var_trainable(m[0], vi))
            continue;
        tp_tensor_t g1, g2;
        cr_assert_eq(tp_model_grad(m[0], 0, name, &g1), TP_OK);
        cr_assert_eq(tp_model_grad(m[1], 0, name, &g2), TP_OK, "%s", tp_last_error());
        const float *a = g1.data, *b = g2.data;
        for (size_t i = 0; i < tp_tensor_numel(&g1); i++, compared++)
            cr_assert(b[i] == 2.0f * a[i],
                      "d cost / d %s[%zu]: %.9g with two costs, %.9g with one", name,
                      i, b[i], a[i]);
    }
    cr_assert_gt(compared, 20);
    tp_model_destroy(&m[0]);
    tp_model_destroy(&m[1]);
}

/* Dropout's masks: each call takes one key from the tower's generator and
 * element i's draw is SplitMix64's output for (key, i / 2), written out
 * here from its published definition (Steele, Lea and Flood 2014; Vigna's
 * splitmix64.c), not from towerpack's: the GPU's threads compute the
 * same function, so this pins both backends' masks. */
static uint64_t s_splitmix64_at(uint64_t seed, uint64_t k) {
    uint64_t z = seed + (k + 1) * 0x9e3779b97f4a7c15ull; /* the k-th state */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define DROP_W 4096
static tp_status_t s_drop_model(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *y = tp_dropout(t, "drop", in[0], 0.3f);
    tp_node_t *logits = tp_fc(t, "head", y, CLASSES, 1);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

Test(ops_fwd, dropout_masks_are_splitmix64_of_one_key_per_call) {
    tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, DROP_W}},
                               {"label", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_drop_model, s_opt, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = N;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    static float x[N * DROP_W];
    for (int i = 0; i < N * DROP_W; i++)
        x[i] = 1.0f;
    int32_t lab[N] = {0, 1, 2, 0};
    int64_t xs[2] = {N, DROP_W}, ys[1] = {N};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, lab, NULL, NULL);
    const uint32_t thr = (uint32_t)(0.3 * 16777216.0);
    static float first[N * DROP_W];
    for (int run = 0; run < 3; run++) {
        tp_rng_t r0 = *tp_model_tower_rng(m, 0), r1 = r0;
        uint64_t key = tp_rng_u64(&r1);
        cr_assert_eq(s_run(m, 0, in, 2, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
        /* one output of the generator per call, whatever the size */
        cr_assert(!memcmp(tp_model_tower_rng(m, 0), &r1, sizeof r1), "run %d", run);
        tp_tensor_t v;
        cr_assert_eq(tp_model_fetch(m, 0, "drop", &v), TP_OK);
        const float *y = v.data;
        size_t dropped = 0, same = 0;
        for (size_t i = 0; i < (size_t)N * DROP_W; i++) {
            uint64_t z = s_splitmix64_at(key, i / 2);
            int drop = ((uint32_t)(z >> (i % 2 ? 40 : 8)) & 0xffffffu) < thr;
            cr_assert_eq(y[i], drop ? 0.0f : 1.0f / (1.0f - 0.3f),
                         "run %d element %zu: %g", run, i, (double)y[i]);
            dropped += drop;
            if (run == 1)
                same += (y[i] == 0.0f) == (first[i] == 0.0f);
        }
        /* 16384 draws: the rate within 4 standard deviations (0.0036) */
        double rate = (double)dropped / (N * DROP_W);
        cr_assert(fabs(rate - 0.3) < 0.015, "run %d drops %.4f", run, rate);
        if (run == 0)
            memcpy(first, y, sizeof first);
        else if (run == 1)  /* another key: independent masks agree on 0.58 */
            cr_assert(fabs((double)same / (N * DROP_W) - 0.58) < 0.02, "%zu alike", same);
        if (run == 2) {  /* the same generator state: the same mask */
            *tp_model_tower_rng(m, 0) = r0;
            cr_assert_eq(s_run(m, 0, in, 2, TP_RUN_FORWARD), TP_OK);
            cr_assert_eq(tp_model_fetch(m, 0, "drop", &v), TP_OK);
            for (size_t i = 0; i < (size_t)N * DROP_W; i++)
                cr_assert_eq(((const float *)v.data)[i], y[i], "element %zu", i);
        }
    }
    tp_model_destroy(&m);
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>
/* OpenBLAS retries a failed mmap of its 128 MiB work buffer for ever
 * (issue 48): the CPU backend maps the buffers when it is made, each after
 * checking the address space, so under a limit that leaves no room for
 * one it fails at once, saying out of memory and which limit. (Criterion
 * runs each test in a process of its own, which no backend has used.) */
Test(ops_cpu, a_backend_under_ulimit_v_without_room_for_blas_fails_saying_so) {
    char statm[64];
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(statm, sizeof statm, f));
    fclose(f);
    unsigned long long mapped = strtoull(statm, NULL, 10) * (unsigned long long)sysconf(_SC_PAGESIZE);
    struct rlimit rl = {mapped + (64ull << 20), RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
    tp_backend_t *b = tp_backend_cpu_new(0);
    cr_assert_null(b, "a CPU backend with 64 MiB of address space to spare");
    cr_assert(strstr(tp_last_error(), "out of memory: ") &&
              strstr(tp_last_error(), "for a work buffer of OpenBLAS") &&
              strstr(tp_last_error(), "the address-space limit (ulimit -v)"), "%s",
              tp_last_error());
}
#endif

/* log and pow run a vectorised log and e^(p log x) on positive normal
 * floats and libm's logf and powf on everything else (ops_elementwise.c's
 * S_BLOCKED): zeros, negatives, a denormal, inf and NaN, placed in the
 * first and a later block of 256, get libm's answers exactly; the rest
 * within the parity suite's relative 1e-5 (here 2e-6). */
static tp_status_t s_log_pow(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_tower_add_output(t, "log", tp_ln(t, "log", in[0]));
    tp_tower_add_output(t, "pow15", tp_pow(t, "pow15", in[0], 1.5f));
    tp_tower_add_output(t, "pow3", tp_pow(t, "pow3", in[0], 3.0f));
    tp_tower_add_output(t, "pown", tp_pow(t, "pown", in[0], -0.5f));
    return tp_tower_status(t);
}

Test(ops_fwd, log_and_pow_off_the_positive_normals_are_libms) {
    enum { LEN = 600 };
    tp_input_desc_t desc = {"x", TP_FLOAT32, 2, {-1, LEN}};
    tp_model_desc_t md = {&desc, 1, s_log_pow, NULL, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 0;
    cfg.infer_batch = 1;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    static float x[LEN];
    for (int i = 0; i < LEN; i++)
        x[i] = 0.01f + 0.37f * (float)i; /* positive normals up to 222 */
    const float odd[] = {0.0f, -0.0f, -2.0f, 1e-40f, INFINITY, -INFINITY, NAN, -0.5f};
    const int n_odd = (int)(sizeof odd / sizeof *odd);
    for (int k = 0; k < n_odd; k++) {
        x[3 + k] = odd[k];
        x[300 + 7 * k] = odd[k];
    }
    int64_t xs[2] = {1, LEN};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_FLOAT32, 2, xs, x, NULL, NULL);
    cr_assert_eq(s_run(m, -1, &in, 1, TP_RUN_FORWARD), TP_OK, "%s", tp_last_error());
    const char *names[4] = {"log", "pow15", "pow3", "pown"};
    const float ps[4] = {0, 1.5f, 3.0f, -0.5f};
    for (int o = 0; o < 4; o++) {
        tp_tensor_t v;
        cr_assert_eq(tp_model_fetch(m, -1, names[o], &v), TP_OK);
        const float *y = v.data;
        for (int i = 0; i < LEN; i++) {
            const float want = o == 0 ? logf(x[i]) : powf(x[i], ps[o]);
            const int normal = x[i] >= 1.17549435e-38f && x[i] < INFINITY;
            if (!normal)
                cr_expect(memcmp(&y[i], &want, sizeof want) == 0 ||
                              (isnan(y[i]) && isnan(want)),
                          "%s(%g) = %g, libm %g", names[o], (double)x[i], (double)y[i],
                          (double)want);
            else
                cr_expect(fabsf(y[i] - want) <= 2e-6f * fabsf(want) + 1e-30f,
                          "%s(%g) = %.9g, libm %.9g", names[o], (double)x[i],
                          (double)y[i], (double)want);
        }
    }
    tp_model_destroy(&m);
}

/* ---- the loss kernels at the edges (gpu/cpu/ops_loss.c) ------------------- */

#include "gpu/backend_impl.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_loss.h"

/* One loss call on n same-shape elements, straight to the CPU kernel. */
typedef struct {
    tp_op_attr_t attr;
    tp_shape_t shape[2];
    const void *x[2];
    float *dx[2];
    int acc[2];
    float y, dy;
    tp_op_call_t c;
} s_loss_call_t;

static void s_loss_call_init(s_loss_call_t *l, tp_op_kind_t kind, const float *a,
                             const float *b, float *d0, float *d1, size_t n) {
    memset(l, 0, sizeof *l);
    l->shape[0].ndim = l->shape[1].ndim = 1;
    l->shape[0].d[0] = l->shape[1].d[0] = (int64_t)n;
    l->x[0] = a;
    l->x[1] = b;
    l->dx[0] = d0;
    l->dx[1] = d1;
    l->dy = 1.0f;
    l->attr.alpha = 1.0f;
    l->c = (tp_op_call_t){.kind = kind, .attr = &l->attr, .name = "loss", .ninputs = 2,
                          .x = l->x, .xshape = l->shape, .y = &l->y, .yshape = {0},
                          .dx = l->dx, .dx_acc = l->acc, .dy = &l->dy};
}

/* Sigmoid cross-entropy's vectorised log1p(e^-|x|) and sigmoid where they
 * matter: logits from 5 to 1e4 in size, whose term is a tiny log1p(e^-|x|)
 * (labels 1 for positive logits, 0 for negative: a naive log(1 + e^-|x|)
 * gives 0), |x| itself plus it (the opposite labels), or a mix. 37
 * elements: whole vectors of every ISA and a scalar tail. */
Test(ops_fwd, sigmoid_xent_is_exact_to_float_at_large_logits) {
    enum { LEN = 37 };
    const float xs[] = {0.5f, 5.0f, 15.0f, 17.5f, 20.0f, 30.0f, 50.0f, 80.0f, 86.0f, 88.0f,
                        89.0f, 100.0f, 1e4f};
    float a[LEN], b[LEN], d0[LEN], d1[LEN];
    for (size_t k = 0; k < sizeof xs / sizeof *xs; k++)
        for (int sign = -1; sign <= 1; sign += 2)
            for (int lab = 0; lab < 3; lab++) {
                const float x = (float)sign * xs[k];
                const float z = lab == 0 ? (x > 0.0f) : lab == 1 ? (x < 0.0f) : 0.25f;
                for (int i = 0; i < LEN; i++) {
                    a[i] = x;
                    b[i] = z;
                }
                s_loss_call_t l;
                s_loss_call_init(&l, TP_OP_SIGMOID_XENT, a, b, d0, d1, LEN);
                cr_assert_eq(tp_cpu_loss_forward(&l.c), TP_OK);
                const double xd = x, zd = z;
                const double want = (xd > 0 ? xd : 0) - xd * zd + log1p(exp(-fabs(xd)));
                /* 1e-37 absolute: below e^-87 the term is denormal, flushed */
                cr_expect(fabs(l.y - want) <= 2e-6 * fabs(want) + 1e-37,
                          "loss(x %g, z %g) = %.9g, want %.9g", xd, zd, (double)l.y, want);
                cr_assert_eq(tp_cpu_loss_backward(&l.c), TP_OK);
                const double sig = 1.0 / (1.0 + exp(-xd));
                const double g0 = (sig - zd) / LEN, g1 = -xd / LEN;
                for (int i = 0; i < LEN; i++) {
                    /* sigmoid near 1 rounds in float before z is taken off; denormals
                     * are flushed */
                    cr_expect(fabs(d0[i] - g0) <= 1e-5 * fabs(g0) + 1e-7 * (sig + zd) / LEN + 1e-37,
                              "dx(x %g, z %g)[%d] = %.9g, want %.9g", xd, zd, i,
                              (double)d0[i], g0);
                    cr_expect(fabs(d1[i] - g1) <= 1e-6 * fabs(g1), "dz(x %g)[%d] = %.9g", xd,
                              i, (double)d1[i]);
                    if (i > 0) /* the vector lanes and the tail agree */
                        cr_expect(d0[i] == d0[0] && d1[i] == d1[0]);
                }
            }
}

/* Every loss's mean is the same bits on 1 and 2 threads (the forward's
 * blocks depend on the element count only), and its backward adds into a
 * gradient where asked. */
Test(ops_fwd, loss_means_are_the_same_bits_on_one_and_two_threads) {
    enum { LEN = 300007 };
    float *a = malloc(LEN * sizeof *a), *b = malloc(LEN * sizeof *b);
    float *d0 = malloc(LEN * sizeof *d0), *d1 = malloc(LEN * sizeof *d1);
    cr_assert(a && b && d0 && d1);
    for (int i = 0; i < LEN; i++) {
        a[i] = (float)(((int64_t)i * 7919) % 2003) / 100.0f - 10.0f;
        b[i] = (float)(((int64_t)i * 104729) % 1009) / 1009.0f;
    }
    const tp_op_kind_t kinds[] = {TP_OP_MSE, TP_OP_L1_LOSS, TP_OP_HUBER_LOSS,
                                  TP_OP_SIGMOID_XENT};
    for (int k = 0; k < 4; k++) {
        float y[2];
        for (int th = 1; th <= 2; th++) {
            tp_cpu_pool_threads_override(th);
            s_loss_call_t l;
            s_loss_call_init(&l, kinds[k], a, b, d0, d1, LEN);
            cr_assert_eq(tp_cpu_loss_forward(&l.c), TP_OK);
            y[th - 1] = l.y;
        }
        tp_cpu_pool_threads_override(0);
        cr_expect(memcmp(&y[0], &y[1], sizeof y[0]) == 0, "%s: %.9g on 1 thread, %.9g on 2",
                  tp_op_name(kinds[k]), (double)y[0], (double)y[1]);
        /* the double-precision mean */
        double s = 0;
        for (int i = 0; i < LEN; i++) {
            const double d = (double)a[i] - b[i], m = fabs(d);
            s += kinds[k] == TP_OP_MSE ? d * d
                 : kinds[k] == TP_OP_L1_LOSS ? m
                 : kinds[k] == TP_OP_HUBER_LOSS
                     ? (m < 1 ? 0.5 * d * d : m - 0.5)
                     : (a[i] > 0 ? a[i] : 0) - (double)a[i] * b[i] + log1p(exp(-fabs(a[i])));
        }
        cr_expect(fabs(y[0] - s / LEN) <= 1e-6 * fabs(s / LEN), "%s: %.9g, want %.9g",
                  tp_op_name(kinds[k]), (double)y[0], s / LEN);
        /* backward stored, then added: twice the stored one */
        s_loss_call_t l;
        s_loss_call_init(&l, kinds[k], a, b, d0, d1, LEN);
        cr_assert_eq(tp_cpu_loss_backward(&l.c), TP_OK);
        const float g0 = d0[LEN - 1], g1 = d1[12345];
        l.acc[0] = l.acc[1] = 1;
        cr_assert_eq(tp_cpu_loss_backward(&l.c), TP_OK);
        cr_expect(d0[LEN - 1] == 2.0f * g0 && d1[12345] == 2.0f * g1, "%s accumulates",
                  tp_op_name(kinds[k]));
    }
    free(a);
    free(b);
    free(d0);
    free(d1);
}
