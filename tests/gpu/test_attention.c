/* towerpack tests: the fused attention op (tp_attention, gpu/cpu/
 * ops_attention.c). Through the graph it gives what the decomposed form
 * (batch_matmul, scale, the causal mask, softmax, batch_matmul) gives,
 * forward and gradients, over several tiles and with q and k one node; the
 * kernel gives the same bits on 1, 2 and 3 threads and, at sizes off its
 * 8 x 8 transposes and 64-key tiles, what a double reference gives, with
 * the forward's scores stashed for the backward and recomputed alike (the
 * same bits); past the stash's limit its workspace grows
 * linearly in T (no T x T scores); the packed form gives the heads cut
 * out's bits, with the tile products in bf16 too; the builder's errors
 * name the node and the shapes. PyTorch parity is in op_cases.h's rows;
 * the bf16 products against a reference in test_attention_bf16.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_attention.h"
#include "gpu/cpu/ops_cpu.h"

TestSuite(attention, .timeout = 120);

static float s_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 4.0f - 2.0f;
}

/* ---- through the graph: fused against decomposed ------------------------- */

/* A cost that weighs every output of y (of `shape`) differently:
 * sum(y * w), w drawn from `seed`. */
static tp_status_t s_weighted_cost(tp_tower_t *t, tp_node_t *y, int ndim,
                                   const int64_t *shape, uint64_t seed) {
    int64_t count = 1;
    for (int d = 0; d < ndim; d++)
        count *= shape[d];
    float *w = malloc((size_t)count * sizeof *w);
    cr_assert_not_null(w);
    for (int64_t i = 0; i < count; i++)
        w[i] = s_rand(&seed);
    tp_node_t *wc = tp_constant(t, "w", ndim, shape, w);
    free(w);
    return tp_tower_set_cost(t, tp_reduce_sum(t, "cost", tp_mul(t, "weighted", y, wc), 0,
                                              NULL, 0));
}

enum { GB = 2, GH = 2, GT = 150, GD = 8 }; /* T 150: three query and key tiles */

typedef struct {
    int fused, causal, self; /* self: k is q's node */
} g_case_t;

static tp_status_t s_build(tp_tower_t *t, tp_node_t *const *in, void *user) {
    const g_case_t *c = user;
    (void)in;
    int64_t s[4] = {GB, GH, GT, GD};
    tp_init_t init = {TP_INIT_NORMAL, 1.0f};
    tp_node_t *q = tp_variable(t, "q", 4, s, init, TP_VAR_TRAINABLE);
    tp_node_t *k = c->self ? q : tp_variable(t, "k", 4, s, init, TP_VAR_TRAINABLE);
    tp_node_t *v = tp_variable(t, "v", 4, s, init, TP_VAR_TRAINABLE);
    const float scale = 1.0f / sqrtf((float)GD);
    tp_node_t *y;
    if (c->fused) {
        y = tp_attention(t, "att", q, k, v, c->causal, 0.0f); /* 0: 1/sqrt(D) */
    } else {
        float *m = malloc(GT * GT * sizeof *m);
        cr_assert_not_null(m);
        for (int i = 0; i < GT; i++)
            for (int j = 0; j < GT; j++)
                m[i * GT + j] = c->causal && j > i ? -1e9f : 0.0f;
        int64_t ms[2] = {GT, GT};
        tp_node_t *mask = tp_constant(t, "mask", 2, ms, m);
        free(m);
        tp_node_t *sc = tp_scale(t, "scores", tp_batch_matmul(t, "qk", q, k, 0, 1), scale);
        y = tp_batch_matmul(t, "av", tp_softmax(t, "p", tp_add(t, "masked", sc, mask), -1),
                            v, 0, 0);
    }
    return s_weighted_cost(t, y, 4, s, 3);
}

static tp_optimizer_t *s_opt(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.1, 0.0, 0);
}

/* A model of `build` (its variables drawn from `seed`, 2 threads) after
 * one pass of gradients; *cost its cost. The caller destroys it. */
static tp_model_t *s_gradients(tp_tower_fn build, void *user, uint64_t seed,
                               float *cost) {
    tp_input_desc_t desc = {"unused", TP_FLOAT32, 2, {-1, 1}};
    tp_model_desc_t md = {&desc, 1, build, s_opt, user};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 1;
    cfg.seed = seed;
    cfg.threads = 2;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    float x = 0.0f;
    int64_t xs[2] = {1, 1};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_FLOAT32, 2, xs, &x, NULL, NULL);
    tp_run_opts_t ro = {.stages = TP_RUN_GRADIENTS};
    cr_assert_eq(tp_model_run(m, 0, &in, 1, NULL, 0, &ro), TP_OK, "%s", tp_last_error());
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, 0, "cost", &v), TP_OK);
    *cost = *(const float *)v.data;
    return m;
}

/* A model of `build` is refused with every one of `parts` in the error
 * (NULL: it is made). */
static void s_expect_model(tp_tower_fn build, void *user, const char *const *parts) {
    tp_input_desc_t desc = {"unused", TP_FLOAT32, 2, {-1, 1}};
    tp_model_desc_t md = {&desc, 1, build, s_opt, user};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 1;
    tp_model_t *m = tp_model_new(&md, &cfg);
    if (!parts) {
        cr_expect_not_null(m, "%s", tp_last_error());
        tp_model_destroy(&m);
        return;
    }
    cr_assert_null(m);
    for (int i = 0; parts[i]; i++)
        cr_expect(strstr(tp_last_error(), parts[i]), "'%s' not in: %s", parts[i],
                  tp_last_error());
}

/* The cost and the gradients of q, k, v (k's absent when self) of one
 * form; the caller frees *grads. */
static float s_graph_run(g_case_t c, float **grads, size_t *n) {
    float cost;
    tp_model_t *m = s_gradients(s_build, &c, 11, &cost); /* the same q, k, v in both forms */
    const char *names[3] = {"q", "k", "v"};
    *n = (size_t)GB * GH * GT * GD;
    *grads = calloc(3 * *n, sizeof(float));
    cr_assert_not_null(*grads);
    for (int i = 0; i < 3; i++) {
        if (c.self && i == 1)
            continue;
        tp_tensor_t g;
        cr_assert_eq(tp_model_grad(m, 0, names[i], &g), TP_OK, "%s", tp_last_error());
        memcpy(*grads + (size_t)i * *n, g.data, *n * sizeof(float));
    }
    tp_model_destroy(&m);
    return cost;
}

static void s_graph_case(int causal, int self) {
    float *gf, *gd;
    size_t n;
    const float cf = s_graph_run((g_case_t){1, causal, self}, &gf, &n);
    const float cd = s_graph_run((g_case_t){0, causal, self}, &gd, &n);
    cr_expect(fabsf(cf - cd) <= 1e-4f + 1e-5f * fabsf(cd), "cost: fused %.7g, decomposed %.7g",
              (double)cf, (double)cd);
    double worst = 0;
    for (size_t i = 0; i < 3 * n; i++) {
        const double err = fabs((double)gf[i] - gd[i]);
        const double tol = 1e-5 + 1e-4 * fabs(gd[i]);
        if (err > tol)
            cr_assert_fail("gradient of %c[%zu]: fused %.7g, decomposed %.7g", "qkv"[i / n],
                           i % n, (double)gf[i], (double)gd[i]);
        worst = err > worst ? err : worst;
    }
    double mag = 0;
    for (size_t i = 0; i < 3 * n; i++)
        mag += fabs(gd[i]);
    cr_assert_gt(mag, 1.0, "the gradients are not all zero");
    cr_log_info("causal %d self %d: largest gradient difference %.3g", causal, self, worst);
    free(gf);
    free(gd);
}

Test(attention, causal_through_the_graph_matches_the_decomposed_form) { s_graph_case(1, 0); }
Test(attention, full_through_the_graph_matches_the_decomposed_form) { s_graph_case(0, 0); }
/* q and k one node: its gradient is the sum of both roles' */
Test(attention, q_and_k_one_node_sums_both_gradients) { s_graph_case(1, 1); }

/* ---- the packed form: tp_attention_qkv against the heads cut out ----------
 * qkv [B,T,3C] as one projection writes it: the packed op reads each
 * head's rows in place (strides of 3C, its output and gradients at C and
 * 3C); the three-input op on the heads cut out (reshape, transpose,
 * split) and merged back does the same arithmetic per head on copies, so
 * the cost and qkv's gradient are the same bits. T 150 (three tiles), D
 * 24 (off the 8 x 8 transposes' and the 16-column blocks' multiples), 3
 * heads; causal and not, with the products AVX-512's and portable. */

enum { PB = 2, PT = 150, PH = 3, PD = 24, PC = PH * PD };

static tp_status_t s_build_packed(tp_tower_t *t, tp_node_t *const *in, void *user) {
    const int *c = user; /* {packed, causal} */
    (void)in;
    int64_t s[3] = {PB, PT, 3 * PC};
    tp_node_t *qkv = tp_variable(t, "qkv", 3, s, (tp_init_t){TP_INIT_NORMAL, 1.0f},
                                 TP_VAR_TRAINABLE);
    tp_node_t *y;
    if (c[0]) {
        y = tp_attention_qkv(t, "att", qkv, PH, c[1], 0.0f);
    } else {
        int64_t hs[4] = {PB, PT, 3 * PH, PD}, sizes[3] = {PH, PH, PH}, ms[3] = {PB, PT, PC};
        static const int perm[4] = {0, 2, 1, 3};
        tp_node_t *p[3] = {NULL, NULL, NULL};
        tp_node_t *heads = tp_transpose(t, "heads", tp_reshape(t, "split", qkv, 4, hs), perm);
        cr_assert_eq(tp_split(t, "parts", heads, 1, 3, sizes, p), TP_OK, "%s", tp_last_error());
        y = tp_attention(t, "att", p[0], p[1], p[2], c[1], 0.0f);
        y = tp_reshape(t, "merge", tp_transpose(t, "unheads", y, perm), 3, ms);
    }
    cr_assert_not_null(y, "%s", tp_last_error());
    int64_t ys[3] = {PB, PT, PC};
    return s_weighted_cost(t, y, 3, ys, 5);
}

/* the cost and qkv's gradient (*g, PB PT 3PC floats, the caller frees) */
static float s_packed_run(int packed, int causal, float **g) {
    int c[2] = {packed, causal};
    float cost;
    tp_model_t *m = s_gradients(s_build_packed, c, 13, &cost);
    tp_tensor_t v;
    const size_t n = (size_t)PB * PT * 3 * PC;
    *g = malloc(n * sizeof(float));
    cr_assert_not_null(*g);
    cr_assert_eq(tp_model_grad(m, 0, "qkv", &v), TP_OK, "%s", tp_last_error());
    memcpy(*g, v.data, n * sizeof(float));
    tp_model_destroy(&m);
    return cost;
}

static void s_packed_case(int causal, const char *isa) {
    char *old = getenv("TP_ISA") ? strdup(getenv("TP_ISA")) : NULL;
    if (isa)
        setenv("TP_ISA", isa, 1);
    float *gp, *gc;
    const float cp = s_packed_run(1, causal, &gp), cc = s_packed_run(0, causal, &gc);
    if (old)
        setenv("TP_ISA", old, 1);
    else
        unsetenv("TP_ISA");
    free(old);
    cr_expect_eq(memcmp(&cp, &cc, sizeof cp), 0, "cost: packed %.9g, heads cut out %.9g",
                 (double)cp, (double)cc);
    const size_t n = (size_t)PB * PT * 3 * PC;
    double mag = 0;
    for (size_t i = 0; i < n; i++) {
        mag += fabs(gc[i]);
        if (memcmp(&gp[i], &gc[i], sizeof(float)))
            cr_assert_fail("qkv's gradient [%zu] (row %zu, column %zu): packed %.9g, heads "
                           "cut out %.9g", i, i / (3 * PC), i % (3 * PC), (double)gp[i],
                           (double)gc[i]);
    }
    cr_assert_gt(mag, 1.0, "the gradients are not all zero");
    free(gp);
    free(gc);
}

Test(attention, packed_qkv_gives_the_heads_cut_outs_bits_causal) { s_packed_case(1, NULL); }
Test(attention, packed_qkv_gives_the_heads_cut_outs_bits_full) { s_packed_case(0, NULL); }
Test(attention, packed_qkv_gives_the_heads_cut_outs_bits_portable) { s_packed_case(1, "avx2"); }

/* With the tile products in bf16 (ops_attention.c, attention_bf16.c) the
 * packed form reads its strided heads into the same pairs: the same bits
 * again, and not fp32's (the products really went bf16). */
Test(attention, packed_qkv_gives_the_heads_cut_outs_bits_bf16) {
    if (!tp_backend_cpu_bf16(1))
        cr_skip_test("this CPU has no bf16 dot products");
    s_packed_case(1, NULL);
    float *g16, *g32;
    const float c16 = s_packed_run(1, 1, &g16);
    tp_backend_cpu_bf16(0);
    const float c32 = s_packed_run(1, 1, &g32);
    const size_t n = (size_t)PB * PT * 3 * PC;
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += g16[i] != g32[i];
    cr_expect_neq(c16, c32, "the cost is fp32's bits (%.9g)", (double)c32);
    cr_expect_gt(differ, n / 2, "%zu of %zu gradients differ from fp32's", differ, n);
    free(g16);
    free(g32);
}

/* The packed builder's errors name the node, the input and what is wrong. */
typedef struct {
    int64_t width;
    int heads;
} bad_packed_t;

static tp_status_t s_build_bad_packed(tp_tower_t *t, tp_node_t *const *in, void *user) {
    const bad_packed_t *c = user;
    (void)in;
    int64_t s[3] = {2, 8, c->width};
    tp_node_t *x = tp_variable(t, "x", 3, s, (tp_init_t){TP_INIT_NORMAL, 1.0f},
                               TP_VAR_TRAINABLE);
    tp_node_t *y = tp_attention_qkv(t, "att", x, c->heads, 1, 0.0f);
    return tp_tower_set_cost(t, tp_reduce_sum(t, "cost", y, 0, NULL, 0));
}

Test(attention, packed_qkv_shape_errors_name_the_node_and_the_heads) {
    const char *heads[] = {"'att'", "[2,8,30]", "4 heads do not divide its width C = 10",
                           NULL};
    s_expect_model(s_build_bad_packed, &(bad_packed_t){30, 4}, heads);
    const char *width[] = {"'att'", "[2,8,31]", "need [...,T,3C]", NULL};
    s_expect_model(s_build_bad_packed, &(bad_packed_t){31, 1}, width);
    s_expect_model(s_build_bad_packed, &(bad_packed_t){30, 5}, NULL); /* C 10, 5 heads of 2 */
}

/* ---- the kernel: the same bits at any thread count ----------------------- */

enum { KB = 3, KH = 4, KT = 130, KD = 24 };

typedef struct {
    float *y, *dx[3];
} k_out_t;

/* Forward and backward on `threads` threads: dq accumulated onto 0.25s,
 * dk and dv stored. */
static k_out_t s_kernel(int threads, int causal) {
    tp_shape_t xs[3], ys = {.ndim = 4, .d = {KB, KH, KT, KD}};
    const size_t n = (size_t)KB * KH * KT * KD;
    uint64_t seed = 42;
    float *x[3];
    k_out_t o;
    for (int i = 0; i < 3; i++) {
        xs[i] = ys;
        x[i] = malloc(n * sizeof(float));
        o.dx[i] = malloc(n * sizeof(float));
        cr_assert(x[i] && o.dx[i]);
        for (size_t j = 0; j < n; j++) {
            x[i][j] = s_rand(&seed);
            o.dx[i][j] = 0.25f;
        }
    }
    o.y = malloc(n * sizeof(float));
    float *dy = malloc(n * sizeof(float));
    cr_assert(o.y && dy);
    for (size_t j = 0; j < n; j++)
        dy[j] = s_rand(&seed);
    tp_op_attr_t at = {.alpha = 0.2f, .beta = causal ? 1.0f : 0.0f};
    const void *xin[3] = {x[0], x[1], x[2]};
    const int acc[3] = {1, 0, 0};
    tp_op_call_t c = {.kind = TP_OP_ATTENTION, .attr = &at, .name = "att", .ninputs = 3,
                      .x = xin, .xshape = xs, .y = o.y, .yshape = ys, .dx = o.dx,
                      .dx_acc = acc, .dy = dy};
    c.workspace_bytes = tp_cpu_op_workspace(NULL, &c);
    c.workspace = malloc(c.workspace_bytes);
    cr_assert_not_null(c.workspace);
    tp_cpu_pool_threads_override(threads);
    cr_assert_eq(tp_cpu_op_forward(NULL, &c), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_cpu_op_backward(NULL, &c), TP_OK, "%s", tp_last_error());
    tp_cpu_pool_threads_override(0);
    free(c.workspace);
    free(dy);
    for (int i = 0; i < 3; i++)
        free(x[i]);
    return o;
}

static void s_free(k_out_t *o) {
    free(o->y);
    for (int i = 0; i < 3; i++)
        free(o->dx[i]);
}

Test(attention, same_bits_on_one_two_and_three_threads) {
    const size_t n = (size_t)KB * KH * KT * KD;
    for (int causal = 0; causal < 2; causal++) {
        k_out_t one = s_kernel(1, causal);
        for (int th = 2; th <= 3; th++) {
            k_out_t many = s_kernel(th, causal);
            cr_expect_eq(memcmp(one.y, many.y, n * sizeof(float)), 0,
                         "y differs on %d threads (causal %d)", th, causal);
            for (int i = 0; i < 3; i++)
                cr_expect_eq(memcmp(one.dx[i], many.dx[i], n * sizeof(float)), 0,
                             "d%c differs on %d threads (causal %d)", "qkv"[i], th, causal);
            s_free(&many);
        }
        s_free(&one);
    }
}

/* The stash (the forward's e^(s - m) and m, read by the backward)
 * against the backward's recomputing them: the same bits, and the stash
 * really there (the workspace larger by its tiles). */
Test(attention, stashed_scores_give_the_recomputed_bits) {
    const size_t n = (size_t)KB * KH * KT * KD;
    const size_t limit = tp_cpu_attention_stash_limit_;
    for (int causal = 0; causal < 2; causal++) {
        tp_shape_t xs[3];
        for (int i = 0; i < 3; i++)
            xs[i] = (tp_shape_t){.ndim = 4, .d = {KB, KH, KT, KD}};
        tp_op_attr_t at = {.alpha = 0.2f, .beta = causal ? 1.0f : 0.0f};
        tp_op_call_t c = {.kind = TP_OP_ATTENTION, .attr = &at, .ninputs = 3, .xshape = xs,
                          .yshape = xs[0]};
        const size_t with = tp_cpu_op_workspace(NULL, &c);
        k_out_t stashed = s_kernel(2, causal);
        tp_cpu_attention_stash_limit_ = 0;
        const size_t without = tp_cpu_op_workspace(NULL, &c);
        k_out_t recomputed = s_kernel(2, causal);
        tp_cpu_attention_stash_limit_ = limit;
        /* 3 x 3 tiles of 64 x 64 a head, 6 of them causal, and each tile
         * row's max */
        cr_expect_eq(with - without,
                     (size_t)KB * KH * (causal ? 6 : 9) * (64 * 64 + 64) * sizeof(float),
                     "workspace %zu with the stash, %zu without (causal %d)", with, without,
                     causal);
        cr_expect_eq(memcmp(stashed.y, recomputed.y, n * sizeof(float)), 0, "y (causal %d)",
                     causal);
        for (int i = 0; i < 3; i++)
            cr_expect_eq(memcmp(stashed.dx[i], recomputed.dx[i], n * sizeof(float)), 0,
                         "d%c differs stashed / recomputed (causal %d)", "qkv"[i], causal);
        s_free(&stashed);
        s_free(&recomputed);
    }
}

/* ---- the kernel against a double reference --------------------------- */

/* Counts a value off its double reference; says where for the first few
 * (a broken kernel is off almost everywhere). */
static void s_near(const char *what, float got, double want, int *bad, int64_t tq, int64_t tk,
                   int64_t d, int causal) {
    if (fabs(got - want) <= 1e-5 + 1e-4 * fabs(want))
        return;
    if (++*bad <= 4)
        cr_log_error("%s: %.7g, reference %.7g (Tq %ld Tk %ld D %ld causal %d)", what,
                     (double)got, want, (long)tq, (long)tk, (long)d, causal);
}

/* One (Tq, Tk, D) case on 1 item pair (batch 1, 2 heads): y, dq, dk, dv
 * of the kernel against softmax(scale q k^T + mask) v and its gradients in
 * double. Sizes off the multiples of 8 and 64 reach the transposes' 8 x 8
 * blocks and their scalar edges, and the key tiles' last partial one. */
/* q and dy (nq floats), k and v (nk) from seed, in the order both kernel
 * tests have always drawn them (q, dy pairwise; then k, v pairwise). */
static void s_fill_qkv(uint64_t seed, float *q, float *dy, size_t nq, float *k, float *v,
                       size_t nk) {
    for (size_t j = 0; j < nq; j++) {
        q[j] = s_rand(&seed);
        dy[j] = s_rand(&seed);
    }
    for (size_t j = 0; j < nk; j++) {
        k[j] = s_rand(&seed);
        v[j] = s_rand(&seed);
    }
}

static void s_reference_case(int64_t tq, int64_t tk, int64_t d, int causal) {
    const int64_t hh = 2;
    tp_shape_t xs[3];
    xs[0] = (tp_shape_t){.ndim = 4, .d = {1, hh, tq, d}};
    xs[1] = xs[2] = (tp_shape_t){.ndim = 4, .d = {1, hh, tk, d}};
    const size_t nq = (size_t)(hh * tq * d), nk = (size_t)(hh * tk * d);
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float));
    float *v = malloc(nk * sizeof(float)), *y = malloc(nq * sizeof(float));
    float *dy = malloc(nq * sizeof(float)), *dq = malloc(nq * sizeof(float));
    float *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    double *p = malloc((size_t)(tq * tk) * sizeof(double));
    double *dp = malloc((size_t)(tq * tk) * sizeof(double));
    cr_assert(q && k && v && y && dy && dq && dk && dv && p && dp);
    s_fill_qkv(7, q, dy, nq, k, v, nk);
    /* y and the gradients are stored, not added to (the kernel clears
     * none of them first): what was there must not show */
    for (size_t j = 0; j < nq; j++)
        y[j] = dq[j] = NAN;
    for (size_t j = 0; j < nk; j++)
        dk[j] = dv[j] = NAN;
    const float scale = 0.3f;
    int bad = 0;
    tp_op_attr_t at = {.alpha = scale, .beta = causal ? 1.0f : 0.0f};
    const void *xin[3] = {q, k, v};
    float *dx[3] = {dq, dk, dv};
    const int acc[3] = {0, 0, 0};
    tp_op_call_t c = {.kind = TP_OP_ATTENTION, .attr = &at, .name = "att", .ninputs = 3,
                      .x = xin, .xshape = xs, .y = y, .yshape = xs[0], .dx = dx,
                      .dx_acc = acc, .dy = dy};
    c.workspace_bytes = tp_cpu_op_workspace(NULL, &c);
    c.workspace = malloc(c.workspace_bytes);
    cr_assert_not_null(c.workspace);
    cr_assert_eq(tp_cpu_op_forward(NULL, &c), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_cpu_op_backward(NULL, &c), TP_OK, "%s", tp_last_error());
    for (int64_t h = 0; h < hh; h++) {
        const float *qh = q + h * tq * d, *kh = k + h * tk * d, *vh = v + h * tk * d;
        const float *dyh = dy + h * tq * d;
        for (int64_t i = 0; i < tq; i++) { /* P, y and dP row by row */
            double mx = -INFINITY, sum = 0;
            const int64_t lim = causal ? i + 1 : tk;
            for (int64_t j = 0; j < lim; j++) {
                double sc = 0;
                for (int64_t e = 0; e < d; e++)
                    sc += (double)qh[i * d + e] * kh[j * d + e];
                p[i * tk + j] = sc * scale;
                mx = p[i * tk + j] > mx ? p[i * tk + j] : mx;
            }
            for (int64_t j = 0; j < tk; j++) {
                p[i * tk + j] = j < lim ? exp(p[i * tk + j] - mx) : 0.0;
                sum += p[i * tk + j];
            }
            double rowdot = 0;
            for (int64_t j = 0; j < tk; j++) {
                p[i * tk + j] /= sum;
                double g = 0;
                for (int64_t e = 0; e < d; e++)
                    g += (double)dyh[i * d + e] * vh[j * d + e];
                dp[i * tk + j] = g;
                rowdot += g * p[i * tk + j];
            }
            for (int64_t j = 0; j < tk; j++) /* dS, scaled */
                dp[i * tk + j] = p[i * tk + j] * (dp[i * tk + j] - rowdot) * scale;
            for (int64_t e = 0; e < d; e++) {
                double yv = 0, gq = 0;
                for (int64_t j = 0; j < tk; j++) {
                    yv += p[i * tk + j] * vh[j * d + e];
                    gq += dp[i * tk + j] * kh[j * d + e];
                }
                const size_t at_ = (size_t)(h * tq * d + i * d + e);
                s_near("y", y[at_], yv, &bad, tq, tk, d, causal);
                s_near("dq", dq[at_], gq, &bad, tq, tk, d, causal);
            }
        }
        for (int64_t j = 0; j < tk; j++)
            for (int64_t e = 0; e < d; e++) {
                double gk = 0, gv = 0;
                for (int64_t i = 0; i < tq; i++) {
                    gk += dp[i * tk + j] * qh[i * d + e];
                    gv += p[i * tk + j] * dyh[i * d + e];
                }
                const size_t at_ = (size_t)(h * tk * d + j * d + e);
                s_near("dk", dk[at_], gk, &bad, tq, tk, d, causal);
                s_near("dv", dv[at_], gv, &bad, tq, tk, d, causal);
            }
    }
    cr_expect_eq(bad, 0, "%d values off the reference (Tq %ld Tk %ld D %ld causal %d)", bad,
                 (long)tq, (long)tk, (long)d, causal);
    free(c.workspace);
    free(q), free(k), free(v), free(y), free(dy), free(dq), free(dk), free(dv);
    free(p), free(dp);
}

Test(attention, kernel_matches_a_double_reference_at_odd_sizes) {
    const size_t limit = tp_cpu_attention_stash_limit_;
    for (int stash = 1; stash >= 0; stash--) { /* scores stashed, then recomputed */
        tp_cpu_attention_stash_limit_ = stash ? limit : 0;
        s_reference_case(75, 75, 20, 1);  /* 2 key tiles, D and T off the 8 x 8 blocks */
        s_reference_case(136, 136, 64, 1); /* the GPT's D, 3 tiles, whole 8 x 8 blocks */
        s_reference_case(9, 83, 12, 0);   /* keys of their own: 2 key tiles, 1 query tile */
        s_reference_case(70, 70, 8, 0);
    }
    tp_cpu_attention_stash_limit_ = limit;
}

/* ---- the AVX-512 products against the portable ones ------------------- */

/* y, dq, dk, dv of one (Tq, Tk, D) case on 2 heads, the products picked
 * by TP_ISA (isa NULL: the widest the CPU has), into out (4 buffers of
 * at least 2 max(Tq, Tk) D floats); q times qmul, and k's element
 * inf_at (if >= 0) +inf. */
static void s_isa_run(const char *isa, int64_t tq, int64_t tk, int64_t d, int causal,
                      float qmul, int64_t inf_at, float *const out[4]) {
    tp_shape_t xs[3];
    xs[0] = (tp_shape_t){.ndim = 4, .d = {1, 2, tq, d}};
    xs[1] = xs[2] = (tp_shape_t){.ndim = 4, .d = {1, 2, tk, d}};
    const size_t nq = (size_t)(2 * tq * d), nk = (size_t)(2 * tk * d);
    float *q = malloc(nq * sizeof(float)), *dy = malloc(nq * sizeof(float));
    float *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float));
    cr_assert(q && dy && k && v);
    s_fill_qkv(5, q, dy, nq, k, v, nk);
    for (size_t j = 0; j < nq; j++)
        q[j] *= qmul;
    if (inf_at >= 0)
        k[inf_at] = INFINITY;
    for (size_t j = 0; j < nq; j++)
        out[1][j] = 0.5f; /* dq accumulates */
    tp_op_attr_t at = {.alpha = 0.15f, .beta = causal ? 1.0f : 0.0f};
    const void *xin[3] = {q, k, v};
    float *dx[3] = {out[1], out[2], out[3]};
    const int acc[3] = {1, 0, 0};
    tp_op_call_t c = {.kind = TP_OP_ATTENTION, .attr = &at, .name = "att", .ninputs = 3,
                      .x = xin, .xshape = xs, .y = out[0], .yshape = xs[0], .dx = dx,
                      .dx_acc = acc, .dy = dy};
    c.workspace_bytes = tp_cpu_op_workspace(NULL, &c);
    c.workspace = malloc(c.workspace_bytes);
    cr_assert_not_null(c.workspace);
    if (isa)
        setenv("TP_ISA", isa, 1);
    else
        unsetenv("TP_ISA");
    cr_assert_eq(tp_cpu_op_forward(NULL, &c), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_cpu_op_backward(NULL, &c), TP_OK, "%s", tp_last_error());
    unsetenv("TP_ISA");
    free(c.workspace);
    free(q), free(dy), free(k), free(v);
}

/* The tile products' AVX-512 blocks (4 rows x 64 columns, masked at D's
 * edge) and row passes (the softmax's and the backward's P and dS, 16
 * columns a vector, masked at a row's keys) give the portable 4 x 16
 * blocks' and scalar loops' bits: D of 1-3 vectors with a masked last
 * one, of two 64-column panels, rows off the 4-row blocks and the
 * 16-column vectors, the causal diagonal, key tiles of 19 and 5 keys,
 * stashed and recomputed alike. On a CPU without AVX-512 both runs are
 * the portable ones. */
Test(attention, wide_products_and_rows_give_the_portable_bits) {
    static const int64_t cases[][4] = {
        {130, 130, 64, 1}, {75, 75, 40, 1}, {150, 150, 72, 1}, {9, 83, 12, 0}, {70, 133, 24, 0},
    };
    const size_t limit = tp_cpu_attention_stash_limit_;
    for (int stash = 1; stash >= 0; stash--) {
        tp_cpu_attention_stash_limit_ = stash ? limit : 0;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const int64_t tq = cases[ci][0], tk = cases[ci][1], d = cases[ci][2];
            const int causal = (int)cases[ci][3];
            const size_t n = (size_t)(2 * (tq > tk ? tq : tk) * d);
            float *wide[4], *plain[4];
            for (int i = 0; i < 4; i++) {
                wide[i] = calloc(n, sizeof(float));
                plain[i] = calloc(n, sizeof(float));
                cr_assert(wide[i] && plain[i]);
            }
            s_isa_run(NULL, tq, tk, d, causal, 1.0f, -1, wide);
            s_isa_run("plain", tq, tk, d, causal, 1.0f, -1, plain);
            for (int i = 0; i < 4; i++) {
                cr_expect_eq(memcmp(wide[i], plain[i], n * sizeof(float)), 0,
                             "%s differs (Tq %ld Tk %ld D %ld causal %d stash %d)",
                             (const char *[]){"y", "dq", "dk", "dv"}[i], (long)tq, (long)tk,
                             (long)d, causal, stash);
                free(wide[i]);
                free(plain[i]);
            }
        }
    }
    tp_cpu_attention_stash_limit_ = limit;
}

/* The wide forward's e^x (s_wide_exp_neg: no clamps, for e^(s - max) <=
 * 1) where its argument leaves the ordinary range: scores hundreds apart
 * (e^x of -87.3 and below is 0, near it subnormal), and a key with an
 * infinite component (scores of +-inf: inf - inf is NaN, -inf - m
 * -inf), causal and not, stashed and recomputed: the portable clamped
 * e^x's bits, NaNs included. */
Test(attention, wide_softmax_keeps_the_portable_bits_past_the_exp_range) {
    static const int64_t cases[][4] = {{130, 130, 64, 1}, {70, 133, 24, 0}};
    const size_t limit = tp_cpu_attention_stash_limit_;
    for (int stash = 1; stash >= 0; stash--) {
        tp_cpu_attention_stash_limit_ = stash ? limit : 0;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int inf = 0; inf < 2; inf++) {
                const int64_t tq = cases[ci][0], tk = cases[ci][1], d = cases[ci][2];
                const int causal = (int)cases[ci][3];
                const size_t n = (size_t)(2 * (tq > tk ? tq : tk) * d);
                /* key 3 of head 0 (and so the queries at 3 and after, causal) */
                const int64_t inf_at = inf ? 3 * d + 1 : -1;
                float *wide[4], *plain[4];
                for (int i = 0; i < 4; i++) {
                    wide[i] = calloc(n, sizeof(float));
                    plain[i] = calloc(n, sizeof(float));
                    cr_assert(wide[i] && plain[i]);
                }
                s_isa_run(NULL, tq, tk, d, causal, 40.0f, inf_at, wide);
                s_isa_run("plain", tq, tk, d, causal, 40.0f, inf_at, plain);
                size_t nans = 0;
                for (size_t j = 0; j < n; j++)
                    nans += isnan(plain[0][j]);
                if (inf)
                    cr_expect_gt(nans, 0, "an infinite key gives some NaN rows");
                for (int i = 0; i < 4; i++) {
                    cr_expect_eq(memcmp(wide[i], plain[i], n * sizeof(float)), 0,
                                 "%s differs (Tq %ld Tk %ld D %ld causal %d stash %d inf %d)",
                                 (const char *[]){"y", "dq", "dk", "dv"}[i], (long)tq, (long)tk,
                                 (long)d, causal, stash, inf);
                    free(wide[i]);
                    free(plain[i]);
                }
            }
    }
    tp_cpu_attention_stash_limit_ = limit;
}

/* ---- no T x T scores ------------------------------------------------------ */

static size_t s_workspace(int64_t t) {
    tp_shape_t xs[3];
    for (int i = 0; i < 3; i++)
        xs[i] = (tp_shape_t){.ndim = 4, .d = {2, 4, t, 64}};
    tp_op_attr_t at = {.alpha = 0.125f, .beta = 1.0f};
    tp_op_call_t c = {.kind = TP_OP_ATTENTION, .attr = &at, .ninputs = 3, .xshape = xs,
                      .yshape = xs[0]};
    return tp_cpu_op_workspace(NULL, &c);
}

Test(attention, workspace_grows_linearly_in_the_context) {
    /* past the stash's 16 MiB (T 1024 on 8 heads: 17.8 MB of score
     * tiles), 8 heads: three floats per query row (log-sum-exp, dO.O,
     * the backward's running max) and a fixed tile scratch per head,
     * nothing of T x T */
    const size_t w1 = s_workspace(1024), w2 = s_workspace(2048), w4 = s_workspace(4096);
    cr_expect_eq(w2 - w1, (size_t)8 * 1024 * 3 * sizeof(float), "%zu -> %zu", w1, w2);
    cr_expect_eq(w4 - w2, (size_t)8 * 2048 * 3 * sizeof(float), "%zu -> %zu", w2, w4);
    cr_expect_lt(w4, (size_t)4096 * 4096 * sizeof(float) / 8,
                 "%zu bytes at T 4096: less than one head's scores", w4);
}

/* ---- the builder's checks --------------------------------------------- */

typedef struct {
    int64_t q[4], k[4];
    int causal;
} bad_case_t;

static tp_status_t s_build_bad(tp_tower_t *t, tp_node_t *const *in, void *user) {
    const bad_case_t *c = user;
    (void)in;
    tp_init_t init = {TP_INIT_NORMAL, 1.0f};
    tp_node_t *q = tp_variable(t, "q", 4, c->q, init, TP_VAR_TRAINABLE);
    tp_node_t *k = tp_variable(t, "k", 4, c->k, init, TP_VAR_TRAINABLE);
    tp_node_t *v = tp_variable(t, "v", 4, c->k, init, TP_VAR_TRAINABLE);
    tp_node_t *y = tp_attention(t, "my_attention", q, k, v, c->causal, 0.0f);
    return tp_tower_set_cost(t, tp_reduce_sum(t, "cost", y, 0, NULL, 0));
}

Test(attention, shape_errors_name_the_node_and_the_shapes) {
    const char *d[] = {"my_attention", "[1,2,5,8]", "[1,2,5,4]", NULL};
    s_expect_model(s_build_bad, &(bad_case_t){{1, 2, 5, 8}, {1, 2, 5, 4}, 0}, d);
    const char *heads[] = {"my_attention", "[1,2,5,8]", "[1,3,5,8]", NULL};
    s_expect_model(s_build_bad, &(bad_case_t){{1, 2, 5, 8}, {1, 3, 5, 8}, 0}, heads);
    const char *causal[] = {"my_attention", "causal", "Tq 5, Tk 7", NULL};
    s_expect_model(s_build_bad, &(bad_case_t){{1, 2, 5, 8}, {1, 2, 7, 8}, 1}, causal);
}
