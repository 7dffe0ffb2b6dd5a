/* towerpack tests: the CUDA backend against the CPU backend.
 *
 * Every op, forward and backward (with both dx_acc settings), on fresh
 * random inputs, compared within tolerance; the optimizer updates, gemm,
 * the collectives, staging, out-of-memory and bad-label errors; then whole
 * training steps of a small CNN (conv, batch norm, pooling, concat, dropout,
 * L2 decay...) on the GPU against the CPU, one tower and two.
 *
 * Where no GPU answers (CI, a machine without a driver) each GPU test skips
 * visibly with tp_cuda_status()'s reason; the tests of the fallback paths
 * (no device -> CPU, host-memory stages) run everywhere. Own executable:
 * it initialises CUDA. Linked against the shared libtowerpack (see
 * tests/CMakeLists.txt) so the module's error messages reach this thread.
 *
 * They ran on an H200 on 2026-11-26 (docs/cuda.md); a GPU session runs
 * them through scripts/gpu-check.sh.
 *
 * TP_CUDA_OPS_ON_CPU=1 (the ctest entries test_cuda_ops_harness and
 * test_cuda_step_harness) puts a
 * second CPU backend where the GPU would be: every comparison must then
 * hold exactly, which checks the harness itself on machines without a
 * GPU (its first GPU run found a harness bug that this catches). */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include "gpu/op_cases.h"
#include "gpu/backend_impl.h"  /* a white-box test of the backends' table */
#include "gpu/graph/graph_internal.h" /* the replicas of a model on two GPUs */
#include "gpu/step_testutil.h"
#include "gpu/gpt_linear_testutil.h"
#include "pipeline/gan_testutil.h" /* the GAN trainers' tiny GAN */

/* Criterion lists skipped tests only with --verbose: say it in every run
 * (ctest logs included) so a CI log shows the GPU tests did not run. */
ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
    if (stats->tests_skipped)
        fprintf(stderr,
                "test_cuda_ops: %zu test(s) SKIPPED: no CUDA device "
                "answered, or filtered out (--verbose says which; "
                "scripts/gpu-check.sh runs them on a GPU)\n",
                stats->tests_skipped);
}

/* ---- helpers ------------------------------------------------------------- */

static int s_on_cpu(void) {
    const char *v = getenv("TP_CUDA_OPS_ON_CPU");
    return v && *v && strcmp(v, "0");
}

static tp_backend_t *s_gpu(void) {
    if (s_on_cpu()) {
        tp_backend_t *b = tp_backend_cpu_new(1);
        cr_assert_not_null(b, "%s", tp_last_error());
        return b;
    }
    if (tp_cuda_device_count() <= 0) {
        cr_skip_test("no GPU: %s", tp_cuda_status());
        return NULL;
    }
    tp_cuda_options_t o = tp_cuda_options_default();
    o.tf32 = 0; /* exact fp32: the comparison is against the CPU */
    tp_backend_t *b = tp_backend_cuda_new(&o);
    cr_assert_not_null(b, "%s", tp_last_error());
    cr_assert_str_eq(b->ops->name, "cuda");
    return b;
}

static tp_shape_t s_shape(int ndim, const int64_t *d) {
    tp_shape_t s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        s.d[i] = d[i];
    return s;
}

static void s_rand(tp_rng_t *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * tp_rng_float(r);
}

static void *s_to_dev(tp_backend_t *g, const void *host, size_t bytes) {
    void *d = g->ops->alloc(g, bytes ? bytes : 4);
    cr_assert_not_null(d, "%s", tp_last_error());
    cr_assert_eq(g->ops->copy(g, NULL, d, host, bytes, TP_COPY_H2D), TP_OK,
                 "%s", tp_last_error());
    return d;
}

static void s_to_host(tp_backend_t *g, void *host, const void *dev,
                      size_t bytes) {
    cr_assert_eq(g->ops->copy(g, NULL, host, dev, bytes, TP_COPY_D2H), TP_OK,
                 "%s", tp_last_error());
}

/* max |a - b| / (atol + rtol |b|) <= 1 */
static void s_close(const char *what, const float *got, const float *want,
                    size_t n, float atol, float rtol) {
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(got[i] - want[i]);
        if (!(d <= atol + rtol * fabsf(want[i])))
            cr_assert_fail("%s[%zu]: GPU %.7g, CPU %.7g (|d| %.3g)", what, i,
                           (double)got[i], (double)want[i], (double)d);
    }
}

/* One op case: inputs (float unless dtypes says so), output shape, and
 * which inputs get gradients. */
typedef struct {
    tp_op_kind_t kind;
    tp_op_attr_t attr;
    int ninputs;
    tp_shape_t xs[8];
    tp_dtype_t dt[8];     /* TP_FLOAT32 (s_base) unless set */
    int grad[8];          /* 1: dx wanted */
    tp_shape_t ys;
    int label_k;          /* int32 inputs draw labels in [0, label_k) */
    int backward;
    float atol, rtol;
    int nostate_check;
    int bias;             /* matmul, batch_matmul: a folded bias [the last dim
                             of ys] and its gradient */
    float lo[8], hi[8];   /* float inputs from U(lo, hi); both 0: U(-1, 1) */
} s_case_t;

static size_t s_bytes(const s_case_t *c, int i) {
    return tp_shape_count(&c->xs[i]) * tp_dtype_size(c->dt[i]);
}

/* Run the case on both backends (forward, then backward with acc 0 and
 * acc 1) and compare every output. */
static void s_check_op(const s_case_t *k, uint64_t seed) {
    tp_backend_t *g = s_gpu();
    tp_backend_t *cpu = tp_backend_cpu_new(1);
    cr_assert_not_null(cpu);
    tp_rng_t r;
    tp_rng_init(&r, seed, 1);
    const char *name = tp_op_name(k->kind);

    void *hx[8], *dx_in[8];
    const void *xc[8], *xg[8];
    for (int i = 0; i < k->ninputs; i++) {
        size_t nb = s_bytes(k, i), n = tp_shape_count(&k->xs[i]);
        hx[i] = calloc(1, nb + 4);
        if (k->dt[i] == TP_INT32) {
            for (size_t j = 0; j < n; j++)
                ((int32_t *)hx[i])[j] = (int32_t)(tp_rng_u64(&r) % (uint64_t)k->label_k);
        } else if (k->dt[i] == TP_UINT8) {
            for (size_t j = 0; j < n; j++)
                ((uint8_t *)hx[i])[j] = (uint8_t)tp_rng_u64(&r);
        } else if (k->lo[i] != 0.0f || k->hi[i] != 0.0f) {
            s_rand(&r, hx[i], n, k->lo[i], k->hi[i]);
        } else {
            s_rand(&r, hx[i], n, -1.0f, 1.0f);
        }
        xc[i] = hx[i];
        dx_in[i] = s_to_dev(g, hx[i], nb);
        xg[i] = dx_in[i];
    }
    /* batch norm: positive gammas, and the moving statistics */
    float st_c[2][256], st_g_host[2][256];
    float *st_g[2] = {NULL, NULL};
    if (k->kind == TP_OP_BATCH_NORM) {
        size_t ch = (size_t)k->xs[0].d[1];
        s_rand(&r, st_c[0], ch, -0.5f, 0.5f);
        s_rand(&r, st_c[1], ch, 0.5f, 1.5f);
        for (int s = 0; s < 2; s++)
            st_g[s] = s_to_dev(g, st_c[s], ch * 4);
    }
    /* a folded bias (matmul): its values, and its gradient's start below */
    const size_t nb = k->bias ? (size_t)k->ys.d[k->ys.ndim - 1] : 0;
    float *bc = NULL, *bg = NULL, *dbc = NULL, *dbg = NULL, *db_init = NULL;
    if (nb) {
        bc = calloc(nb, 4);
        s_rand(&r, bc, nb, -1.0f, 1.0f);
        bg = s_to_dev(g, bc, nb * 4);
        dbc = calloc(nb, 4);
        db_init = calloc(nb, 4);
        s_rand(&r, db_init, nb, -1.0f, 1.0f);
        dbg = g->ops->alloc(g, nb * 4);
    }
    size_t ny = tp_shape_count(&k->ys);
    float *yc = calloc(ny + 1, 4), *yg_host = calloc(ny + 1, 4);
    float *yg = g->ops->alloc(g, (ny + 1) * 4);
    tp_op_call_t cc = {0}, cg = {0};
    cc.kind = cg.kind = k->kind;
    cc.attr = cg.attr = &k->attr;
    cc.name = cg.name = name;
    cc.ninputs = cg.ninputs = k->ninputs;
    cc.x = xc;
    cg.x = xg;
    cc.xshape = cg.xshape = k->xs;
    cc.y = yc;
    cg.y = yg;
    cc.yshape = cg.yshape = k->ys;
    cc.bias = bc;
    cg.bias = bg;
    tp_rng_t rc, rg;
    tp_rng_init(&rc, seed, 7);
    rg = rc;
    cc.rng = &rc;
    cg.rng = &rg;
    cc.state[0] = st_c[0];
    cc.state[1] = st_c[1];
    cg.state[0] = st_g[0];
    cg.state[1] = st_g[1];
    size_t wsc = cpu->ops->op_workspace(cpu, &cc);
    size_t wsg = g->ops->op_workspace(g, &cg);
    cc.workspace = calloc(1, wsc + 64);
    cg.workspace = g->ops->alloc(g, wsg + 64);
    cr_assert_not_null(cg.workspace);
    tp_stream_t *s = g->ops->stream_new(g);
    cr_assert_not_null(s, "%s", tp_last_error());

    cr_assert_eq(cpu->ops->op_forward(cpu, NULL, &cc), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g->ops->op_forward(g, s, &cg), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g->ops->stream_sync(g, s), TP_OK, "%s", tp_last_error());
    s_to_host(g, yg_host, yg, ny * 4);
    char what[96];
    snprintf(what, sizeof what, "%s forward", name);
    s_close(what, yg_host, yc, ny, k->atol, k->rtol);
    if (k->kind == TP_OP_BATCH_NORM && k->attr.update_state) {
        size_t ch = (size_t)k->xs[0].d[1];
        for (int q = 0; q < 2; q++) {
            s_to_host(g, st_g_host[q], st_g[q], ch * 4);
            snprintf(what, sizeof what, "batch_norm moving %s",
                     q ? "variance" : "mean");
            s_close(what, st_g_host[q], st_c[q], ch, k->atol, k->rtol);
        }
    }
    if (k->kind == TP_OP_DROPOUT)
        cr_expect_eq(memcmp(&rc, &rg, sizeof rc), 0,
                     "dropout leaves both generators in the same state");

    if (k->backward) {
        float *dyc = calloc(ny + 1, 4);
        s_rand(&r, dyc, ny, -1.0f, 1.0f);
        float *dyg = s_to_dev(g, dyc, ny * 4);
        float *gc[8] = {0}, *gg[8] = {0}, *init[8] = {0};
        int acc[8] = {0};
        for (int a = 0; a < 2; a++) {
            for (int i = 0; i < k->ninputs; i++) {
                if (!k->grad[i])
                    continue;
                size_t n = tp_shape_count(&k->xs[i]);
                if (!init[i]) {
                    init[i] = calloc(n + 1, 4);
                    s_rand(&r, init[i], n, -1.0f, 1.0f);
                    gc[i] = calloc(n + 1, 4);
                    gg[i] = g->ops->alloc(g, n * 4 + 4);
                }
                /* acc 1 adds into a random start, acc 0 must overwrite it */
                memcpy(gc[i], init[i], n * 4);
                cr_assert_eq(g->ops->copy(g, NULL, gg[i], init[i], n * 4,
                                          TP_COPY_H2D), TP_OK);
                acc[i] = a;
            }
            if (nb) {
                memcpy(dbc, db_init, nb * 4);
                cr_assert_eq(g->ops->copy(g, NULL, dbg, db_init, nb * 4, TP_COPY_H2D),
                             TP_OK);
                cc.dbias = dbc;
                cg.dbias = dbg;
                cc.dbias_acc = cg.dbias_acc = a;
            }
            cc.dx = gc;
            cg.dx = gg;
            cc.dx_acc = cg.dx_acc = acc;
            cc.dy = dyc;
            cg.dy = dyg;
            cr_assert_eq(cpu->ops->op_backward(cpu, NULL, &cc), TP_OK, "%s",
                         tp_last_error());
            cr_assert_eq(g->ops->op_backward(g, s, &cg), TP_OK, "%s",
                         tp_last_error());
            cr_assert_eq(g->ops->stream_sync(g, s), TP_OK, "%s",
                         tp_last_error());
            for (int i = 0; i < k->ninputs; i++) {
                if (!k->grad[i])
                    continue;
                size_t n = tp_shape_count(&k->xs[i]);
                float *h = calloc(n + 1, 4);
                s_to_host(g, h, gg[i], n * 4);
                snprintf(what, sizeof what, "%s backward dx[%d] (acc %d)",
                         name, i, a);
                s_close(what, h, gc[i], n, k->atol, k->rtol);
                free(h);
            }
            if (nb) {
                float *h = calloc(nb, 4);
                s_to_host(g, h, dbg, nb * 4);
                snprintf(what, sizeof what, "%s backward dbias (acc %d)", name, a);
                s_close(what, h, dbc, nb, k->atol, k->rtol);
                free(h);
            }
        }
        for (int i = 0; i < 8; i++) {
            free(gc[i]);
            free(init[i]);
            if (gg[i])
                g->ops->free(g, gg[i]);
        }
        free(dyc);
        g->ops->free(g, dyg);
    }
    g->ops->stream_destroy(g, s);
    for (int i = 0; i < k->ninputs; i++) {
        free(hx[i]);
        g->ops->free(g, dx_in[i]);
    }
    for (int q = 0; q < 2; q++)
        if (st_g[q])
            g->ops->free(g, st_g[q]);
    if (nb) {
        g->ops->free(g, bg);
        g->ops->free(g, dbg);
    }
    free(bc);
    free(dbc);
    free(db_init);
    free(yc);
    free(yg_host);
    g->ops->free(g, yg);
    free(cc.workspace);
    g->ops->free(g, cg.workspace);
    tp_backend_destroy(&cpu);
    tp_backend_destroy(&g);
}

#define SH(...) s_shape((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static s_case_t s_base(tp_op_kind_t kind) {
    s_case_t k;
    memset(&k, 0, sizeof k);
    k.kind = kind;
    /* not 0: 0 is TP_UINT8 (a zeroed case once filled its float inputs
     * with random bytes, NaNs among them, on both backends alike) */
    for (int i = 0; i < 8; i++)
        k.dt[i] = TP_FLOAT32;
    k.backward = 1;
    k.atol = 1e-5f;
    k.rtol = 1e-4f;
    return k;
}

/* ---- every op --------------------------------------------------------- */

Test(cuda_ops, matmul) {
    s_case_t k = s_base(TP_OP_MATMUL);
    k.ninputs = 2;
    k.xs[0] = SH(37, 3, 5, 4); /* trailing dims flatten to K = 60 */
    k.xs[1] = SH(60, 29);
    k.ys = SH(37, 29);
    k.grad[0] = k.grad[1] = 1;
    k.atol = 1e-4f;
    s_check_op(&k, 1);
}

/* folds (gpu/graph/fold.c): a matmul with its bias add, with and without
 * the relu after it, [75, 45] past one block of the bias's column sums
 * (3 slices of 25 rows); then [601, 2085]: 66 column tiles, 8 uneven
 * slices of the rows, and the bias pass's grid with rows left to stride */
Test(cuda_ops, matmul_folded_bias_and_relu) {
    s_case_t k = s_base(TP_OP_MATMUL);
    k.ninputs = 2;
    k.xs[0] = SH(75, 20);
    k.xs[1] = SH(20, 45);
    k.ys = SH(75, 45);
    k.grad[0] = k.grad[1] = 1;
    k.bias = 1;
    k.atol = 1e-4f;
    k.attr.act = TP_ACT_RELU;
    s_check_op(&k, 41);
    k.attr.act = TP_ACT_NONE;
    s_check_op(&k, 42);
    /* a relu with no bias; only the weights' gradient */
    k.bias = 0;
    k.grad[0] = 0;
    k.attr.act = TP_ACT_RELU;
    s_check_op(&k, 43);
    k.xs[0] = SH(601, 16);
    k.xs[1] = SH(16, 2085);
    k.ys = SH(601, 2085);
    k.grad[0] = 1;
    k.bias = 1;
    s_check_op(&k, 50);
}

/* batch_matmul's folds (fold.c, issue 45; ops.cu's s_bmm_fold_*): a GPT's
 * linear, [B,T,K] against an unbatched W [K,N], with its bias b[N] and a
 * GELU after it, tanh and erf; a GELU without a bias (dz alone, no column
 * sum); the bias alone; then [2,301,16] x [16,2085]: 66 column tiles of
 * the bias gradient, uneven slices of the 602 rows */
Test(cuda_ops, batch_matmul_folded_bias_and_gelu) {
    s_case_t k = s_base(TP_OP_BATCH_MATMUL);
    k.ninputs = 2;
    k.xs[0] = SH(3, 25, 20);
    k.xs[1] = SH(20, 45);
    k.ys = SH(3, 25, 45);
    k.grad[0] = k.grad[1] = 1;
    k.bias = 1;
    k.atol = 2e-4f;
    k.rtol = 2e-4f;
    k.attr.act = TP_ACT_GELU_TANH;
    s_check_op(&k, 61);
    k.attr.act = TP_ACT_GELU;
    s_check_op(&k, 62);
    k.bias = 0;
    s_check_op(&k, 63);
    k.bias = 1;
    k.attr.act = TP_ACT_NONE;
    s_check_op(&k, 64);
    k.xs[0] = SH(2, 301, 16);
    k.xs[1] = SH(16, 2085);
    k.ys = SH(2, 301, 2085);
    k.attr.act = TP_ACT_GELU_TANH;
    s_check_op(&k, 65);
}

static s_case_t s_conv_case(int bias, int stride, int pad, int ksz) {
    s_case_t k = s_base(TP_OP_CONV2D);
    k.attr.kh = k.attr.kw = ksz;
    k.attr.sh = k.attr.sw = stride;
    k.attr.ph = k.attr.pw = pad;
    k.ninputs = bias ? 3 : 2;
    int64_t h = 11, w = 9, oh = (h + 2 * pad - ksz) / stride + 1,
            ow = (w + 2 * pad - ksz) / stride + 1;
    k.xs[0] = SH(5, 3, h, w);
    k.xs[1] = SH(7, 3, ksz, ksz);
    if (bias)
        k.xs[2] = SH(7);
    k.ys = s_shape(4, (int64_t[]){5, 7, oh, ow});
    k.grad[0] = k.grad[1] = k.grad[2] = 1;
    k.atol = 2e-4f;
    k.rtol = 2e-4f;
    return k;
}

static void s_conv(int bias, int stride, int pad, int ksz, uint64_t seed) {
    s_case_t k = s_conv_case(bias, stride, pad, ksz);
    s_check_op(&k, seed);
}

Test(cuda_ops, conv2d_same_bias) { s_conv(1, 1, 1, 3, 2); }
Test(cuda_ops, conv2d_strided_padded) { s_conv(0, 2, 2, 5, 3); }
Test(cuda_ops, conv2d_1x1) { s_conv(1, 1, 0, 1, 4); }

Test(cuda_ops, bias_add) {
    s_case_t k = s_base(TP_OP_BIAS_ADD);
    k.ninputs = 2;
    k.xs[0] = SH(6, 5, 4, 3);
    k.xs[1] = SH(5);
    k.ys = k.xs[0];
    k.grad[0] = k.grad[1] = 1;
    s_check_op(&k, 5);
    k.xs[0] = SH(9, 13);
    k.xs[1] = SH(13);
    k.ys = k.xs[0];
    s_check_op(&k, 6);
    /* rows and columns past one block's 32 x 32, neither a multiple (3
     * slices of the rows), then 66 column tiles over 8 uneven slices */
    k.xs[0] = SH(75, 45);
    k.xs[1] = SH(45);
    k.ys = k.xs[0];
    s_check_op(&k, 7);
    k.xs[0] = SH(601, 2085);
    k.xs[1] = SH(2085);
    k.ys = k.xs[0];
    s_check_op(&k, 8);
}

static void s_unary(tp_op_kind_t kind, float alpha, uint64_t seed) {
    s_case_t k = s_base(kind);
    k.attr.alpha = alpha;
    k.ninputs = 1;
    k.xs[0] = SH(7, 3, 5, 5);
    k.ys = k.xs[0];
    k.grad[0] = 1;
    s_check_op(&k, seed);
}

Test(cuda_ops, relu) { s_unary(TP_OP_RELU, 0.0f, 7); }
Test(cuda_ops, leaky_relu) { s_unary(TP_OP_LEAKY_RELU, 0.1f, 8); }
Test(cuda_ops, tanh) { s_unary(TP_OP_TANH, 0.0f, 9); }
Test(cuda_ops, sigmoid) { s_unary(TP_OP_SIGMOID, 0.0f, 10); }
Test(cuda_ops, scale) { s_unary(TP_OP_SCALE, -0.37f, 11); }

static void s_pool(tp_op_kind_t kind, int win, int stride, int pad,
                   uint64_t seed) {
    s_case_t k = s_base(kind);
    k.attr.kh = k.attr.kw = win;
    k.attr.sh = k.attr.sw = stride;
    k.attr.ph = k.attr.pw = pad;
    k.ninputs = 1;
    int64_t h = 12, w = 10;
    k.xs[0] = SH(4, 3, 12, 10);
    k.ys = s_shape(4, (int64_t[]){4, 3, (h + 2 * pad - win) / stride + 1,
                                  (w + 2 * pad - win) / stride + 1});
    k.grad[0] = 1;
    s_check_op(&k, seed);
}

Test(cuda_ops, max_pool_2x2) { s_pool(TP_OP_MAX_POOL, 2, 2, 0, 12); }
Test(cuda_ops, max_pool_3x3_padded) { s_pool(TP_OP_MAX_POOL, 3, 2, 1, 13); }
Test(cuda_ops, avg_pool_padded) { s_pool(TP_OP_AVG_POOL, 3, 2, 1, 14); }

Test(cuda_ops, global_avg_pool) {
    s_case_t k = s_base(TP_OP_GLOBAL_AVG_POOL);
    k.ninputs = 1;
    k.xs[0] = SH(6, 5, 7, 3);
    k.ys = SH(6, 5);
    k.grad[0] = 1;
    s_check_op(&k, 15);
}

static s_case_t s_bn_case(int training, int update, tp_shape_t x) {
    s_case_t k = s_base(TP_OP_BATCH_NORM);
    k.attr.alpha = 0.9f;
    k.attr.eps = 1e-5f;
    k.attr.training = training;
    k.attr.update_state = update;
    k.ninputs = 3;
    k.xs[0] = x;
    k.xs[1] = SH(x.d[1]);
    k.xs[2] = SH(x.d[1]);
    k.ys = k.xs[0];
    k.grad[0] = k.grad[1] = k.grad[2] = 1;
    k.atol = 1e-4f;
    k.rtol = 1e-3f;
    return k;
}

static void s_bn_shaped(int training, int update, tp_shape_t x, uint64_t seed) {
    s_case_t k = s_bn_case(training, update, x);
    s_check_op(&k, seed);
}

static void s_bn(int training, int update, int ndim, uint64_t seed) {
    s_bn_shaped(training, update, ndim == 4 ? SH(8, 6, 5, 4) : SH(16, 6), seed);
}

Test(cuda_ops, batch_norm_training) { s_bn(1, 1, 4, 16); }
/* cuDNN's batch norm (TP_CUDA_BN=cudnn): the training cases */
Test(cuda_ops, batch_norm_training_by_cudnn) {
    setenv("TP_CUDA_BN", "cudnn", 1);  /* this child's backends */
    s_bn(1, 1, 4, 16);
    s_bn(1, 0, 2, 17);
    s_bn_shaped(1, 1, SH(20, 40, 5, 5), 20);
}
/* towerpack's batch norm (the default): the sums in slices of the batch:
 * 3 channels in 64 slices of one sample; 40 channels in 14 uneven slices
 * of 20 samples; 128 x 32 x 28 x 28 (cnn-bn's first block: 16 slices of 8) */
Test(cuda_ops, batch_norm_training_sliced) {
    s_bn_shaped(1, 1, SH(64, 3, 9, 7), 19);
    s_bn_shaped(1, 1, SH(20, 40, 5, 5), 20);
    s_bn_shaped(1, 0, SH(128, 32, 28, 28), 21);
}
Test(cuda_ops, batch_norm_training_2d_no_update) { s_bn(1, 0, 2, 17); }
Test(cuda_ops, batch_norm_inference) { s_bn(0, 0, 4, 18); }

Test(cuda_ops, dropout_same_masks) {
    s_case_t k = s_base(TP_OP_DROPOUT);
    k.attr.alpha = 0.3f;
    k.attr.training = 1;
    k.ninputs = 1;
    k.xs[0] = SH(9, 77); /* odd count: the last 64-bit draw is half used */
    k.ys = k.xs[0];
    k.grad[0] = 1;
    /* The forward is one product per element: the same masks give the
     * same bits (it matched exactly on an H200). The backward with acc 1
     * is init + dy * mask / keep, a fused multiply-add on the GPU: an ulp
     * of the operands (|x| < 2.5) apart, 2.5e-8 measured. A different mask
     * would differ by the size of the values. */
    k.atol = 1e-6f;
    k.rtol = 1e-6f;
    s_check_op(&k, 19);
    k.attr.training = 0; /* identity */
    s_check_op(&k, 20);
}

Test(cuda_ops, reshape_copy) {
    s_case_t k = s_base(TP_OP_RESHAPE);
    k.ninputs = 1;
    k.xs[0] = SH(4, 3, 2);
    k.ys = SH(4, 6);
    k.grad[0] = 1;
    s_check_op(&k, 21);
}

Test(cuda_ops, add) {
    s_case_t k = s_base(TP_OP_ADD);
    k.ninputs = 2;
    k.xs[0] = k.xs[1] = SH(5, 4, 3);
    k.ys = k.xs[0];
    k.grad[0] = k.grad[1] = 1;
    s_check_op(&k, 22);
}

/* Broadcast operands whose gradient sums many positions (a bias under
 * [B,T,C], a scalar under a whole tensor, a middle axis): a block of
 * threads sums each element there (k_binary_grad_rows), not one thread. */
Test(cuda_ops, broadcast_gradients_summed_by_blocks) {
    const struct { tp_op_kind_t kind; tp_shape_t a, b; } rows[] = {
        {TP_OP_ADD, SH(32, 64, 96), SH(96)},
        {TP_OP_MUL, SH(16, 32, 48), SH(1)},
        {TP_OP_DIV, SH(8, 128, 16), SH(8, 1, 16)},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        s_case_t k = s_base(rows[i].kind);
        k.ninputs = 2;
        k.xs[0] = k.ys = rows[i].a;
        k.xs[1] = rows[i].b;
        k.lo[1] = 0.5f; /* away from zero for div */
        k.hi[1] = 2.0f;
        k.grad[0] = k.grad[1] = 1;
        k.atol = 1e-3f; /* sums of up to 24576 terms in another order */
        k.rtol = 1e-3f;
        s_check_op(&k, 40 + (uint64_t)i);
    }
}

/* the elementwise family: every row of op_cases.h (the PyTorch parity
 * suite's), forward and both accumulation modes of every gradient */
Test(cuda_ops, elementwise_every_op_case) {
    for (int ci = 0; ci < OP_NCASES; ci++) {
        const op_case_t *row = &op_cases[ci];
        s_case_t k = s_base(row->kind);
        op_case_attr(row, &k.attr);
        k.ninputs = row->ninputs;
        for (int p = 0; p < row->ninputs; p++) {
            k.xs[p] = op_case_in(row, p);
            k.lo[p] = row->lo[p];
            k.hi[p] = row->hi[p];
            k.grad[p] = row->kind != TP_OP_STOP_GRADIENT;
            if ((row->ints >> p) & 1) { /* indices in [0, hi) */
                k.dt[p] = TP_INT32;
                k.label_k = (int)row->hi[p];
                k.grad[p] = 0;
            }
        }
        k.ys = op_case_out(row);
        /* the reduce family: axes; int32 labels in [0, V), no gradient for
         * them; argmax and top-k have none at all (argmax's int32 output
         * compares bit for bit at tolerance 0) */
        k.attr.axes = op_case_axes(row);
        if (op_case_labels(row->kind)) {
            k.dt[1] = TP_INT32;
            k.label_k = (int)row->d[0][row->nd[0] - 1];
            k.grad[1] = 0;
        }
        if (row->kind == TP_OP_ARGMAX || row->kind == TP_OP_TOP_K_ACCURACY)
            k.backward = 0;
        cr_log_info("elementwise case %s", row->label);
        s_check_op(&k, 100 + (uint64_t)ci);
    }
}

/* the linalg family at sizes past the parity rows': attention-sized
 * products (each path: strided batched, stacked, shared a, both sides
 * stretched, per batch), norm rows longer than a block's 256 threads and
 * parameters summed over many rows */
static void s_bmm_case(const tp_shape_t a, const tp_shape_t b, int ta, int tb,
                       const tp_shape_t y, uint64_t seed) {
    s_case_t k = s_base(TP_OP_BATCH_MATMUL);
    k.ninputs = 2;
    k.xs[0] = a;
    k.xs[1] = b;
    k.attr.trans_a = ta;
    k.attr.trans_b = tb;
    k.ys = y;
    k.grad[0] = k.grad[1] = 1;
    s_check_op(&k, seed);
}

static void s_norm_case(tp_op_kind_t kind, const tp_shape_t x, const tp_shape_t p,
                        int n, uint64_t seed) {
    s_case_t k = s_base(kind);
    k.ninputs = 3;
    k.xs[0] = x;
    k.xs[1] = k.xs[2] = p;
    k.attr.eps = 1e-5f;
    k.attr.norm_axes = kind == TP_OP_LAYER_NORM ? n : 0;
    k.attr.norm_groups = kind == TP_OP_LAYER_NORM ? 0 : n;
    k.ys = x;
    k.grad[0] = k.grad[1] = k.grad[2] = 1;
    k.lo[0] = -2.0f;
    k.hi[0] = 3.0f;
    k.lo[1] = 0.5f;
    k.hi[1] = 1.5f;
    s_check_op(&k, seed);
}

Test(cuda_ops, linalg_large_shapes) {
    s_bmm_case(SH(8, 64, 32), SH(8, 64, 32), 0, 1, SH(8, 64, 64), 300);
    s_bmm_case(SH(4, 50, 96), SH(96, 40), 0, 0, SH(4, 50, 40), 301);
    s_bmm_case(SH(24, 16), SH(6, 16, 10), 0, 0, SH(6, 24, 10), 302);
    s_bmm_case(SH(3, 1, 20, 16), SH(1, 5, 10, 16), 0, 1, SH(3, 5, 20, 10), 303);
    s_bmm_case(SH(6, 16, 20), SH(6, 10, 16), 1, 1, SH(6, 20, 10), 304);
    s_norm_case(TP_OP_LAYER_NORM, SH(64, 300), SH(300), 1, 310);
    s_norm_case(TP_OP_LAYER_NORM, SH(4, 16, 6, 50), SH(6, 50), 2, 311);
    s_norm_case(TP_OP_GROUP_NORM, SH(8, 32, 9, 9), SH(32), 8, 312);
    s_norm_case(TP_OP_INSTANCE_NORM, SH(4, 6, 20, 20), SH(6), 6, 313);
}

/* a constant: its values, [5,300] (two launches of the device's chunks) */
Test(cuda_ops, elementwise_constant) {
    s_case_t k = s_base(TP_OP_CONSTANT);
    static float v[1500];
    for (int i = 0; i < 1500; i++)
        v[i] = (float)i * 0.25f - 100.0f;
    k.attr.data = v;
    k.ninputs = 0;
    k.ys = SH(5, 300);
    k.backward = 0;
    s_check_op(&k, 99);
}

/* a relu folded into a convolution, a batch norm (towerpack's training
 * passes, inference, cuDNN's training passes), an add and a bias add: the relu after
 * the output, the mask before the op's own backward (room at the start of
 * the workspace, the op's own after it) */
Test(cuda_ops, folded_relu_after_conv_batch_norm_add_and_bias_add) {
    s_case_t k = s_conv_case(1, 1, 1, 3);
    k.attr.act = TP_ACT_RELU;
    s_check_op(&k, 44);
    k = s_bn_case(1, 1, SH(8, 6, 5, 4));
    k.attr.act = TP_ACT_RELU;
    s_check_op(&k, 45);
    k = s_bn_case(0, 0, SH(8, 6, 5, 4));
    k.attr.act = TP_ACT_RELU;
    s_check_op(&k, 46);
    setenv("TP_CUDA_BN", "cudnn", 1); /* this child's backends */
    k = s_bn_case(1, 1, SH(20, 40, 5, 5));
    k.attr.act = TP_ACT_RELU;
    s_check_op(&k, 47);
    unsetenv("TP_CUDA_BN");
    k = s_base(TP_OP_ADD);
    k.ninputs = 2;
    k.xs[0] = k.xs[1] = SH(5, 4, 3);
    k.ys = k.xs[0];
    k.grad[0] = k.grad[1] = 1;
    k.attr.act = TP_ACT_RELU;
    s_check_op(&k, 48);
    k = s_base(TP_OP_BIAS_ADD);
    k.ninputs = 2;
    k.xs[0] = SH(6, 5, 4, 3);
    k.xs[1] = SH(5);
    k.ys = k.xs[0];
    k.grad[0] = k.grad[1] = 1;
    k.attr.act = TP_ACT_RELU;
    s_check_op(&k, 49);
}

Test(cuda_ops, concat) {
    s_case_t k = s_base(TP_OP_CONCAT);
    k.attr.axis = 1;
    k.ninputs = 3;
    k.xs[0] = SH(3, 2, 4, 5);
    k.xs[1] = SH(3, 5, 4, 5);
    k.xs[2] = SH(3, 1, 4, 5);
    k.ys = SH(3, 8, 4, 5);
    k.grad[0] = k.grad[2] = 1; /* input 1 wants no gradient */
    s_check_op(&k, 23);
}

static void s_xent(float smoothing, uint64_t seed) {
    s_case_t k = s_base(TP_OP_SOFTMAX_XENT);
    k.attr.alpha = smoothing;
    k.ninputs = 2;
    k.xs[0] = SH(300, 10);
    k.xs[1] = SH(300);
    k.dt[1] = TP_INT32;
    k.label_k = 10;
    k.ys = s_shape(0, NULL);
    k.grad[0] = 1;
    k.atol = 1e-5f;
    s_check_op(&k, seed);
}

Test(cuda_ops, softmax_xent) { s_xent(0.0f, 24); }
/* label smoothing (attr alpha): the loss's mean over the log-probabilities
 * and the gradient's smoothed target */
Test(cuda_ops, softmax_xent_smoothed) { s_xent(0.2f, 25); }

Test(cuda_ops, accuracy_and_error_count) {
    s_case_t k = s_base(TP_OP_ACCURACY);
    k.ninputs = 2;
    k.xs[0] = SH(257, 7);
    k.xs[1] = SH(257);
    k.dt[1] = TP_INT32;
    k.label_k = 7;
    k.ys = s_shape(0, NULL);
    k.backward = 0;
    s_check_op(&k, 25);
    k.kind = TP_OP_ERROR_COUNT;
    s_check_op(&k, 26);
}

Test(cuda_ops, l2_decay) {
    s_case_t k = s_base(TP_OP_L2_DECAY);
    k.attr.alpha = 1e-3f;
    k.ninputs = 3;
    k.xs[0] = SH(40, 30);
    k.xs[1] = SH(30);
    k.xs[2] = SH(7, 3, 3, 3);
    k.ys = s_shape(0, NULL);
    k.grad[0] = k.grad[2] = 1;
    s_check_op(&k, 27);
}

Test(cuda_ops, cast_u8_and_f32) {
    s_case_t k = s_base(TP_OP_CAST);
    k.attr.alpha = 1.0f / 255;
    k.attr.in_dtype = TP_UINT8;
    k.ninputs = 1;
    k.xs[0] = SH(6, 28, 28);
    k.dt[0] = TP_UINT8;
    k.ys = k.xs[0];
    k.backward = 0;
    s_check_op(&k, 28);
    k.attr.in_dtype = TP_FLOAT32;
    k.dt[0] = TP_FLOAT32;
    k.attr.alpha = 3.0f;
    s_check_op(&k, 29);
}

/* ---- gemm, optimizers ------------------------------------------------------ */

Test(cuda_ops, gemm_transposes) {
    tp_backend_t *g = s_gpu();
    tp_backend_t *cpu = tp_backend_cpu_new(1);
    tp_rng_t r;
    tp_rng_init(&r, 30, 0);
    const int m = 19, n = 23, k = 31;
    float a[31 * 31], b[31 * 31], c0[31 * 31], cc[31 * 31], cg[31 * 31];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            s_rand(&r, a, sizeof a / 4, -1, 1);
            s_rand(&r, b, sizeof b / 4, -1, 1);
            s_rand(&r, c0, sizeof c0 / 4, -1, 1);
            int lda = ta ? m : k, ldb = tb ? k : n;
            memcpy(cc, c0, sizeof cc);
            cpu->ops->gemm(cpu, NULL, ta, tb, m, n, k, 0.7f, a, lda, b, ldb,
                           0.5f, cc, n);
            float *da = s_to_dev(g, a, sizeof a), *db = s_to_dev(g, b, sizeof b),
                  *dc = s_to_dev(g, c0, sizeof c0);
            cr_assert_eq(g->ops->gemm(g, NULL, ta, tb, m, n, k, 0.7f, da, lda,
                                      db, ldb, 0.5f, dc, n), TP_OK, "%s",
                         tp_last_error());
            s_to_host(g, cg, dc, sizeof cg);
            s_close("gemm", cg, cc, (size_t)m * n, 1e-4f, 1e-4f);
            g->ops->free(g, da);
            g->ops->free(g, db);
            g->ops->free(g, dc);
        }
    tp_backend_destroy(&cpu);
    tp_backend_destroy(&g);
}

/* bf16 products (tp_cuda_options_t.bf16, tp-train --bf16): cuBLAS's
 * CUBLAS_COMPUTE_32F_FAST_16BF lets it use bf16 tensor cores with fp32
 * accumulation; how it converts the inputs is its own choice. On the H100
 * (cuBLAS 13, 2026-11-26) the 128x256x512 product was 0.009 from the fp32
 * product and 0.067 from the product of the inputs rounded once to bf16
 * (values ~ 7): not a plain rounding. What holds: the product is no
 * further from fp32's than rounding the inputs to bf16 puts it, and it is
 * not fp32's (a different summation order alone is ~ 1e-5 here), so the
 * flag took effect. GPU only: the CPU has no bf16 path to stand in. */
static float s_bf16(float x) { return tp_bf16_to_f32(tp_f32_to_bf16(x)); }

Test(cuda_ops, bf16_products_are_reduced_precision_within_bf16s_error) {
    if (s_on_cpu())
        cr_skip_test("TP_CUDA_OPS_ON_CPU: bf16 tensor cores are the device's");
    if (tp_cuda_device_count() <= 0)
        cr_skip_test("no GPU: %s", tp_cuda_status());
    tp_cuda_options_t o = tp_cuda_options_default();
    o.tf32 = 0;
    o.bf16 = 1;
    tp_backend_t *g = tp_backend_cuda_new(&o);
    cr_assert_not_null(g, "%s", tp_last_error());
    tp_backend_t *cpu = tp_backend_cpu_new(1);
    tp_rng_t r;
    tp_rng_init(&r, 31, 0);
    /* shapes cuBLAS runs on tensor cores (FAST_16BF only allows them) */
    enum { M = 128, N = 256, K = 512 };
    static float a[M * K], b[K * N], ar[M * K], br[K * N], exact[M * N],
        rounded[M * N], got[M * N];
    s_rand(&r, a, M * K, -1, 1);
    s_rand(&r, b, K * N, -1, 1);
    for (int i = 0; i < M * K; i++)
        ar[i] = s_bf16(a[i]);
    for (int i = 0; i < K * N; i++)
        br[i] = s_bf16(b[i]);
    memset(exact, 0, sizeof exact);
    memset(rounded, 0, sizeof rounded);
    cpu->ops->gemm(cpu, NULL, 0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, exact, N);
    cpu->ops->gemm(cpu, NULL, 0, 0, M, N, K, 1.0f, ar, K, br, N, 0.0f, rounded, N);
    float *da = s_to_dev(g, a, sizeof a), *db = s_to_dev(g, b, sizeof b),
          *dc = s_to_dev(g, exact, sizeof exact);
    cr_assert_eq(g->ops->gemm(g, NULL, 0, 0, M, N, K, 1.0f, da, K, db, N, 0.0f, dc, N),
                 TP_OK, "%s", tp_last_error());
    s_to_host(g, got, dc, sizeof got);
    float bf16_err = 0, to_exact = 0;
    for (int i = 0; i < M * N; i++) {
        bf16_err = fmaxf(bf16_err, fabsf(rounded[i] - exact[i]));
        to_exact = fmaxf(to_exact, fabsf(got[i] - exact[i]));
    }
    cr_assert_leq(to_exact, 1.5f * bf16_err + 1e-3f, "bf16 gemm: %g from the fp32 "
                  "product, more than rounding the inputs to bf16 gives (%g)",
                  to_exact, bf16_err);
    cr_assert_gt(to_exact, 1e-3f, "bf16 gemm: %g from the fp32 product: fp32's own "
                 "(bf16 not used; rounding the inputs to bf16 gives %g)", to_exact,
                 bf16_err);
    g->ops->free(g, da);
    g->ops->free(g, db);
    g->ops->free(g, dc);
    tp_backend_destroy(&cpu);
    tp_backend_destroy(&g);
}

/* Batches made on the device from resident images (ResidentInput's
 * kernel) against the host reference, to the bit: 250 picks (more than
 * one launch's 192), 3 channels, padding, mirrored and not. */
Test(cuda_ops, augment_batch_matches_the_host) {
    tp_backend_t *g = s_gpu();
    tp_backend_t *cpu = tp_backend_cpu_new(1);
    tp_rng_t r;
    tp_rng_init(&r, 41, 0);
    enum { NSRC = 300, H = 7, W = 6, C = 3, N = 250, CH = 7, CW = 5, PAD = 2 };
    static uint8_t img[NSRC * H * W * C];
    static int32_t lab[NSRC], lc[N], lg[N];
    static float oc[N * CH * CW * C], og[N * CH * CW * C];
    tp_augment_pick_t picks[N];
    for (size_t i = 0; i < sizeof img; i++)
        img[i] = (uint8_t)tp_rng_u32(&r);
    for (int i = 0; i < NSRC; i++)
        lab[i] = (int32_t)tp_rng_below(&r, 10);
    for (int i = 0; i < N; i++)
        picks[i] = (tp_augment_pick_t){(int32_t)tp_rng_below(&r, NSRC),
                                       (int32_t)tp_rng_below(&r, H + 2 * PAD - CH + 1),
                                       (int32_t)tp_rng_below(&r, W + 2 * PAD - CW + 1),
                                       (int32_t)(i & 1)};
    tp_augment_shape_t sh = {H, W, C, CH, CW, PAD, {10, 20, 30, 0}, {1 / 50.f, 1 / 60.f, 1 / 70.f, 1}};
    cr_assert_eq(tp_backend_augment_batch(cpu, NULL, oc, lc, img, lab, NSRC, picks, N, &sh),
                 TP_OK, "%s", tp_last_error());
    uint8_t *dimg = s_to_dev(g, img, sizeof img);
    int32_t *dlab = s_to_dev(g, lab, sizeof lab);
    float *dout = g->ops->alloc(g, sizeof og);
    int32_t *dl = g->ops->alloc(g, sizeof lg);
    cr_assert(dout && dl);
    cr_assert_eq(tp_backend_augment_batch(g, NULL, dout, dl, dimg, dlab, NSRC, picks, N, &sh),
                 TP_OK, "%s", tp_last_error());
    s_to_host(g, og, dout, sizeof og);
    s_to_host(g, lg, dl, sizeof lg);
    cr_assert_eq(memcmp(og, oc, sizeof og), 0, "the device's batch differs from the host's");
    cr_assert_eq(memcmp(lg, lc, sizeof lg), 0, "the device's labels differ from the host's");
    /* a pick outside the images is refused before anything runs */
    picks[7].index = NSRC;
    cr_assert_eq(tp_backend_augment_batch(g, NULL, dout, dl, dimg, dlab, NSRC, picks, N, &sh),
                 TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "pick 7"), "%s", tp_last_error());
    g->ops->free(g, dimg);
    g->ops->free(g, dlab);
    g->ops->free(g, dout);
    g->ops->free(g, dl);
    tp_backend_destroy(&cpu);
    tp_backend_destroy(&g);
}

/* The GAN's noise drawn on the device (gpu/cuda/noise.cu) is the host's
 * (tp_gan_noise_fill, towerpack/philox.h) to the bit: uniform and normal,
 * a row offset, a seed with high bits, a training step and step -1
 * (tp-generate's), 300 x 100 (more than one block a row). */
Test(cuda_ops, noise_fill_is_the_hosts) {
    tp_backend_t *g = s_gpu();
    enum { ROWS = 300, DIM = 100 };
    static float host[ROWS * DIM], dev[ROWS * DIM];
    float *d = g->ops->alloc(g, sizeof dev);
    cr_assert_not_null(d, "%s", tp_last_error());
    tp_stream_t *s = g->ops->stream_new(g);
    cr_assert_not_null(s, "%s", tp_last_error());
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.seed = 0xfeedface12345ull;
    for (int normal = 0; normal < 2; normal++) {
        for (int64_t step = -1; step < 40000; step += 12346) {
            gc.noise = normal ? TP_GAN_NOISE_NORMAL : TP_GAN_NOISE_UNIFORM;
            gc.noise_scale = normal ? 1.0f : 0.75f;
            tp_gan_noise_fill(&gc, step, 7, ROWS, DIM, host);
            cr_assert_eq(tp_backend_noise_fill(g, s, d, gc.seed, step, 7, ROWS, DIM, normal,
                                               gc.noise_scale),
                         TP_OK, "%s", tp_last_error());
            cr_assert_eq(g->ops->stream_sync(g, s), TP_OK, "%s", tp_last_error());
            s_to_host(g, dev, d, sizeof dev);
            for (int i = 0; i < ROWS * DIM; i++)
                if (memcmp(&dev[i], &host[i], sizeof(float)))
                    cr_assert_fail("noise (normal %d, step %lld) [%d]: device %.9g, "
                                   "host %.9g", normal, (long long)step, i,
                                   (double)dev[i], (double)host[i]);
        }
    }
    g->ops->stream_destroy(g, s);
    g->ops->free(g, d);
    tp_backend_destroy(&g);
}

/* Gather's gradient (the embedding's backward) is the CPU's to the bit,
 * and the same every run: a table row picked 2,000 times of 4,000 (and
 * rows picked once, or never), summed by its one owner in the positions'
 * order; into zeros (acc 0) and onto a random start (acc 1). With
 * atomicAdd (before 2026-11-28) the picked-often row differed from the
 * CPU in its last bits and from run to run. */
Test(cuda_ops, gather_gradient_is_the_cpus_bit_for_bit) {
    tp_backend_t *g = s_gpu();
    tp_backend_t *cpu = tp_backend_cpu_new(1);
    tp_rng_t r;
    tp_rng_init(&r, 53, 0);
    enum { V = 50, D = 70, N = 4000 };
    static float tab[V * D], dy[N * D], init[V * D], want[V * D], got[V * D], again[V * D];
    static int32_t idx[N];
    s_rand(&r, tab, V * D, -1, 1);
    s_rand(&r, dy, N * D, -1, 1);
    s_rand(&r, init, V * D, -1, 1);
    for (int i = 0; i < N; i++)  /* half row 3; the rest rows 10..39 */
        idx[i] = (i % 2) ? 3 : 10 + (int32_t)tp_rng_below(&r, 30);
    const int64_t ts[2] = {V, D}, is[1] = {N}, ys[2] = {N, D};
    tp_shape_t xs[2] = {s_shape(2, ts), s_shape(1, is)};
    tp_op_attr_t attr;
    memset(&attr, 0, sizeof attr);
    float *dtab = s_to_dev(g, tab, sizeof tab), *ddy = s_to_dev(g, dy, sizeof dy);
    int32_t *didx = s_to_dev(g, idx, sizeof idx);
    float *ddx = g->ops->alloc(g, sizeof got), *dyv = g->ops->alloc(g, sizeof dy);
    cr_assert(ddx && dyv);
    tp_stream_t *s = g->ops->stream_new(g);
    cr_assert_not_null(s, "%s", tp_last_error());
    for (int acc = 0; acc < 2; acc++) {
        const void *xc[2] = {tab, idx}, *xg[2] = {dtab, didx};
        float *dxc[2] = {want, NULL}, *dxg[2] = {ddx, NULL};
        const int accs[2] = {acc, 0};
        static float yc[N * D];
        tp_op_call_t cc = {0}, cg = {0};
        cc.kind = cg.kind = TP_OP_GATHER;
        cc.attr = cg.attr = &attr;
        cc.name = cg.name = "gather";
        cc.ninputs = cg.ninputs = 2;
        cc.x = xc;
        cg.x = xg;
        cc.xshape = cg.xshape = xs;
        cc.yshape = cg.yshape = s_shape(2, ys);
        cc.y = yc;
        cg.y = dyv;
        cc.dx = dxc;
        cg.dx = dxg;
        cc.dx_acc = cg.dx_acc = accs;
        cc.dy = dy;
        cg.dy = ddy;
        size_t wsg = g->ops->op_workspace(g, &cg);
        cg.workspace = g->ops->alloc(g, wsg + 64);
        cg.workspace_bytes = wsg;
        cr_assert_not_null(cg.workspace);
        cc.workspace = calloc(1, cpu->ops->op_workspace(cpu, &cc) + 64);
        memcpy(want, init, sizeof want);
        cr_assert_eq(cpu->ops->op_backward(cpu, NULL, &cc), TP_OK, "%s", tp_last_error());
        for (int run = 0; run < 2; run++) {
            cr_assert_eq(g->ops->copy(g, NULL, ddx, init, sizeof init, TP_COPY_H2D), TP_OK);
            cr_assert_eq(g->ops->op_backward(g, s, &cg), TP_OK, "%s", tp_last_error());
            cr_assert_eq(g->ops->stream_sync(g, s), TP_OK, "%s", tp_last_error());
            s_to_host(g, run ? again : got, ddx, sizeof got);
        }
        for (int i = 0; i < V * D; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)))
                cr_assert_fail("gather gradient (acc %d) row %d col %d: GPU %.9g, CPU %.9g",
                               acc, i / D, i % D, (double)got[i], (double)want[i]);
        cr_assert_eq(memcmp(got, again, sizeof got), 0, "acc %d: two runs differ", acc);
        g->ops->free(g, cg.workspace);
        free(cc.workspace);
    }
    g->ops->stream_destroy(g, s);
    g->ops->free(g, dtab);
    g->ops->free(g, ddy);
    g->ops->free(g, didx);
    g->ops->free(g, ddx);
    g->ops->free(g, dyv);
    tp_backend_destroy(&cpu);
    tp_backend_destroy(&g);
}

Test(cuda_ops, optimizer_updates) {
    tp_backend_t *g = s_gpu();
    tp_backend_t *cpu = tp_backend_cpu_new(1);
    tp_rng_t r;
    tp_rng_init(&r, 31, 0);
    enum { N = 5003 };
    static float w[N], gr[N], m1[N], v1[N], out[N];
    for (int variant = 0; variant < 6; variant++) {  /* 3 adam, 4 adamw, 5 sgd_wd_update */
        s_rand(&r, w, N, -1, 1);
        s_rand(&r, gr, N, -1, 1);
        s_rand(&r, m1, N, -0.1f, 0.1f);
        s_rand(&r, v1, N, 0.0f, 0.1f);
        float *dw = s_to_dev(g, w, sizeof w), *dg = s_to_dev(g, gr, sizeof gr),
              *dm = s_to_dev(g, m1, sizeof m1), *dv = s_to_dev(g, v1, sizeof v1);
        for (int step = 1; step <= 3; step++) {
            if (variant == 5) {  /* SGD's coupled decay in the update's pass */
                cpu->ops->sgd_wd_update(cpu, NULL, w, gr, m1, N, 0.1f, 0.9f, 0, 0.05f);
                cr_assert_not_null(g->ops->sgd_wd_update);
                cr_assert_eq(g->ops->sgd_wd_update(g, NULL, dw, dg, dm, N, 0.1f, 0.9f, 0,
                                                   0.05f), TP_OK);
            } else if (variant < 3) {
                float *slot = variant == 0 ? NULL : m1, *dslot = variant == 0 ? NULL : dm;
                cpu->ops->sgd_update(cpu, NULL, w, gr, slot, N, 0.1f, 0.9f,
                                     variant == 2);
                cr_assert_eq(g->ops->sgd_update(g, NULL, dw, dg, dslot, N, 0.1f,
                                                0.9f, variant == 2), TP_OK);
            } else {
                const float wd = variant == 4 ? 0.05f : 0.0f;
                cpu->ops->adam_update(cpu, NULL, w, gr, m1, v1, N, 1e-3f, 0.9f,
                                      0.999f, 1e-8f, wd, step);
                cr_assert_eq(g->ops->adam_update(g, NULL, dw, dg, dm, dv, N,
                                                 1e-3f, 0.9f, 0.999f, 1e-8f,
                                                 wd, step), TP_OK);
            }
        }
        s_to_host(g, out, dw, sizeof out);
        s_close(variant == 5   ? "sgd_wd"
                : variant == 4 ? "adamw"
                : variant == 3 ? "adam"
                               : "sgd",
                out, w, N, 1e-6f, 1e-5f);
        g->ops->free(g, dw);
        g->ops->free(g, dg);
        g->ops->free(g, dm);
        g->ops->free(g, dv);
    }
    tp_backend_destroy(&cpu);
    tp_backend_destroy(&g);
}

/* The global-norm clip (grad_sumsq, grad_clip) on the device against the
 * CPU: the sum of squares set and added to, a clip that scales and one
 * that leaves the gradients alone. */
Test(cuda_ops, gradient_clip_by_global_norm) {
    tp_backend_t *g = s_gpu();
    tp_backend_t *cpu = tp_backend_cpu_new(1);
    tp_rng_t r;
    tp_rng_init(&r, 37, 0);
    enum { N = 70001 };
    static float gr[N], out[N];
    for (int variant = 0; variant < 2; variant++) {
        s_rand(&r, gr, N, -1, 1);
        float *dg = s_to_dev(g, gr, sizeof gr);
        float acc = 0, dacc_h = 0, *dacc = s_to_dev(g, &dacc_h, sizeof dacc_h);
        /* two pieces, the second added: as a named cost's variables */
        cr_assert_eq(cpu->ops->grad_sumsq(cpu, NULL, gr, 1000, &acc, 0), TP_OK);
        cr_assert_eq(cpu->ops->grad_sumsq(cpu, NULL, gr + 1000, N - 1000, &acc, 1), TP_OK);
        cr_assert_eq(g->ops->grad_sumsq(g, NULL, dg, 1000, dacc, 0), TP_OK);
        cr_assert_eq(g->ops->grad_sumsq(g, NULL, dg + 1000, N - 1000, dacc, 1), TP_OK);
        s_to_host(g, &dacc_h, dacc, sizeof dacc_h);
        cr_expect(fabsf(dacc_h - acc) <= 1e-5f * acc, "sum of squares %g vs %g",
                  dacc_h, acc);
        /* variant 0 clips to a tenth of the norm; 1 to more than it */
        const float clip = variant == 0 ? 0.1f * sqrtf(acc) : 2.0f * sqrtf(acc);
        cr_assert_eq(cpu->ops->grad_clip(cpu, NULL, gr, N, clip, &acc), TP_OK);
        cr_assert_eq(g->ops->grad_clip(g, NULL, dg, N, clip, dacc), TP_OK);
        s_to_host(g, out, dg, sizeof out);
        s_close(variant == 0 ? "clipped" : "unclipped", out, gr, N, 1e-6f, 1e-5f);
        g->ops->free(g, dg);
        g->ops->free(g, dacc);
    }
    tp_backend_destroy(&cpu);
    tp_backend_destroy(&g);
}

/* ---- collectives ----------------------------------------------------------- */

typedef struct {
    tp_backend_t *g;
    tp_comm_t *comm;
    tp_stream_t *s;
    float *buf;
    int rank;
    size_t n;
    tp_status_t rc;
} s_rank_t;

static void *s_rank_main(void *p) {
    s_rank_t *r = p;
    r->rc = r->g->ops->allreduce(r->g, r->comm, r->rank, r->s, r->buf, r->n, 1);
    return NULL;
}

Test(cuda_ops, allreduce_three_towers_one_device) {
    tp_backend_t *g = s_gpu();
    enum { R = 3, N = 100003 };
    static float h[R][N], want[N], got[N];
    tp_rng_t rng;
    tp_rng_init(&rng, 32, 0);
    for (int i = 0; i < R; i++)
        s_rand(&rng, h[i], N, -1, 1);
    for (size_t j = 0; j < N; j++)
        want[j] = ((h[0][j] + h[1][j]) + h[2][j]) * (1.0f / 3.0f);
    tp_comm_t *comm = g->ops->comm_new(g, R);
    cr_assert_not_null(comm, "%s", tp_last_error());
    s_rank_t rk[R];
    pthread_t th[R];
    for (int i = 0; i < R; i++) {
        rk[i] = (s_rank_t){g, comm, g->ops->stream_new(g), s_to_dev(g, h[i], sizeof h[i]),
                           i, N, TP_OK};
        pthread_create(&th[i], NULL, s_rank_main, &rk[i]);
    }
    for (int i = 0; i < R; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < R; i++) {
        cr_assert_eq(rk[i].rc, TP_OK, "rank %d", i);
        s_to_host(g, got, rk[i].buf, sizeof got);
        cr_assert_eq(memcmp(got, want, sizeof got), 0,
                     "rank %d holds the rank-order mean, bit for bit", i);
    }
    /* the one-caller form, root only */
    float *bufs[R];
    for (int i = 0; i < R; i++) {
        bufs[i] = rk[i].buf;
        cr_assert_eq(g->ops->copy(g, NULL, bufs[i], h[i], sizeof h[i], TP_COPY_H2D), TP_OK);
    }
    cr_assert_eq(g->ops->allreduce_local(g, bufs, R, N, 1, 1), TP_OK, "%s", tp_last_error());
    s_to_host(g, got, bufs[0], sizeof got);
    cr_assert_eq(memcmp(got, want, sizeof got), 0);
    s_to_host(g, got, bufs[1], sizeof got);
    cr_assert_eq(memcmp(got, h[1], sizeof got), 0, "root_only leaves rank 1");
    for (int i = 0; i < R; i++) {
        g->ops->stream_destroy(g, rk[i].s);
        g->ops->free(g, rk[i].buf);
    }
    g->ops->comm_destroy(g, comm);
    tp_backend_destroy(&g);
}

Test(cuda_ops, allreduce_abort_wakes_waiters) {
    tp_backend_t *g = s_gpu();
    tp_comm_t *comm = g->ops->comm_new(g, 2);
    float *buf = g->ops->alloc(g, 64);
    s_rank_t rk = {g, comm, NULL, buf, 0, 16, TP_OK};
    pthread_t th;
    pthread_create(&th, NULL, s_rank_main, &rk);
    usleep(50000);
    g->ops->comm_abort(g, comm);
    pthread_join(th, NULL);
    cr_assert_eq(rk.rc, TP_ERR_INTERRUPTED);
    g->ops->free(g, buf);
    g->ops->comm_destroy(g, comm);
    tp_backend_destroy(&g);
}

/* ---- errors ----------------------------------------------------------------- */

/* The two error paths below are the device's own: no stand-in. */
static void s_device_only(void) {
    if (s_on_cpu())
        cr_skip_test("TP_CUDA_OPS_ON_CPU: a device-only error path");
}

/* Profiling's hold: the stream waits the time asked on the device's clock
 * (marks around a 2 ms hold are at least 1.9 ms apart), and a mark after
 * the hold times only what was queued after it (a copy of 4 bytes, while
 * the host slept 1 ms before queuing it: well under the host's time). */
Test(cuda_ops, a_hold_keeps_the_stream_and_marks_after_it_time_the_work) {
    if (s_on_cpu())  /* the CPU's calls end done: it has no hold */
        cr_skip_test("the hold is the CUDA backend's");
    tp_backend_t *g = s_gpu();
    cr_assert_not_null(g->ops->timer_hold);
    tp_stream_t *st = g->ops->stream_new(g);
    cr_assert_not_null(st, "%s", tp_last_error());
    tp_timer_t *t = g->ops->timer_new(g, 4);
    cr_assert_not_null(t, "%s", tp_last_error());
    float *d = g->ops->alloc(g, 4), one = 1;
    cr_assert_not_null(d);
    cr_assert_eq(g->ops->timer_mark(g, st, t, 0), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g->ops->timer_hold(g, st, 2000000), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g->ops->timer_mark(g, st, t, 1), TP_OK);
    cr_assert_eq(g->ops->timer_hold(g, st, 5000000), TP_OK);
    cr_assert_eq(g->ops->timer_mark(g, st, t, 2), TP_OK);
    usleep(1000);  /* the host's launching, slow */
    cr_assert_eq(g->ops->copy(g, st, d, &one, 4, TP_COPY_H2D), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g->ops->timer_mark(g, st, t, 3), TP_OK);
    cr_assert_eq(g->ops->stream_sync(g, st), TP_OK, "%s", tp_last_error());
    float held = 0, work = 0;
    cr_assert_eq(g->ops->timer_ms(g, t, 0, 1, &held), TP_OK);
    cr_assert_eq(g->ops->timer_ms(g, t, 2, 3, &work), TP_OK);
    cr_expect_geq(held, 1.9f, "a 2 ms hold took %.3f ms", (double)held);
    cr_expect_lt(held, 50.0f, "a 2 ms hold took %.3f ms", (double)held);
    cr_expect_lt(work, 0.5f, "4 bytes queued during a hold took %.3f ms on the device "
                 "(the host's 1 ms counted)", (double)work);
    g->ops->free(g, d);
    g->ops->timer_destroy(g, t);
    g->ops->stream_destroy(g, st);
    tp_backend_destroy(&g);
}

Test(cuda_ops, out_of_memory_names_the_size) {
    s_device_only();
    tp_backend_t *g = s_gpu();
    void *p = g->ops->alloc(g, (size_t)1 << 50);
    cr_assert_null(p);
    cr_assert(strstr(tp_last_error(), "out of device memory"), "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "1125899906842624 bytes"), "%s", tp_last_error());
    /* the device still works afterwards */
    float one = 1.0f, back = 0.0f;
    float *d = s_to_dev(g, &one, 4);
    s_to_host(g, &back, d, 4);
    cr_assert_eq(back, 1.0f);
    g->ops->free(g, d);
    tp_backend_destroy(&g);
}

Test(cuda_ops, bad_label_fails_the_sync_naming_the_node) {
    s_device_only();
    tp_backend_t *g = s_gpu();
    float logits[4 * 3] = {0};
    int32_t labels[4] = {0, 2, 3, 1}; /* 3 is outside [0,3) */
    tp_shape_t xs[2] = {SH(4, 3), SH(4)};
    const void *x[2] = {s_to_dev(g, logits, sizeof logits), s_to_dev(g, labels, sizeof labels)};
    tp_op_attr_t attr = {0};
    tp_op_call_t c = {0};
    c.kind = TP_OP_SOFTMAX_XENT;
    c.attr = &attr;
    c.name = "tower0/xent";
    c.ninputs = 2;
    c.x = x;
    c.xshape = xs;
    c.y = g->ops->alloc(g, 4);
    c.yshape = s_shape(0, NULL);
    c.workspace = g->ops->alloc(g, g->ops->op_workspace(g, &c) + 4);
    tp_stream_t *s = g->ops->stream_new(g);
    cr_assert_eq(g->ops->op_forward(g, s, &c), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g->ops->stream_sync(g, s), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "tower0/xent: label 3 at row 2 outside [0,3)"),
              "%s", tp_last_error());
    cr_assert_eq(g->ops->stream_sync(g, s), TP_OK, "reported once");
    g->ops->stream_destroy(g, s);
    tp_backend_destroy(&g); /* frees the arena chunks */
}

/* ---- staging --------------------------------------------------------------- */

static void s_stage_roundtrip(tp_backend_t *b) {
    enum { N = 1 << 16 };
    tp_stage_t *st[2] = {tp_backend_stage_new(b, N), tp_backend_stage_new(b, N)};
    cr_assert(st[0] && st[1], "%s", tp_last_error());
    tp_stream_t *s = b->ops->stream_new(b);
    static uint8_t back[N];
    for (int step = 0; step < 6; step++) {
        tp_stage_t *x = st[step % 2];
        cr_assert_eq(tp_backend_stage_host_wait(b, x), TP_OK);
        uint8_t *h = tp_backend_stage_host(b, x);
        for (int i = 0; i < N; i++)
            h[i] = (uint8_t)(i * 7 + step);
        cr_assert_eq(tp_backend_stage_begin(b, x, N), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_backend_stage_wait(b, x, s), TP_OK);
        cr_assert_eq(b->ops->copy(b, s, back, tp_backend_stage_device(b, x), N,
                                  TP_COPY_D2H), TP_OK);
        cr_assert_eq(tp_backend_stage_release(b, x, s), TP_OK);
        for (int i = 0; i < N; i++)
            cr_assert_eq(back[i], (uint8_t)(i * 7 + step), "step %d byte %d", step, i);
    }
    cr_assert_eq(tp_backend_stage_begin(b, st[0], N + 1), TP_ERR_INVALID);
    b->ops->stream_destroy(b, s);
    tp_backend_stage_destroy(b, &st[0]);
    tp_backend_stage_destroy(b, &st[1]);
    cr_assert_null(st[0]);
}

Test(cuda_ops, staging_roundtrip_gpu) {
    tp_backend_t *g = s_gpu();
    s_stage_roundtrip(g);
    tp_backend_destroy(&g);
}

/* Runs everywhere: the host-memory stages of a backend without staging. */
Test(cuda_fallback, staging_on_the_cpu_backend) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    s_stage_roundtrip(b);
    tp_stage_t *st = tp_backend_stage_new(b, 100);
    cr_assert_eq(tp_backend_stage_host(b, st), tp_backend_stage_device(b, st),
                 "host and device are one buffer on the CPU");
    tp_backend_stage_destroy(b, &st);
    tp_backend_destroy(&b);
}

/* Runs everywhere: no device means the CPU, with the reason. */
Test(cuda_fallback, default_backend_falls_back_to_the_cpu) {
    setenv("TP_NO_CUDA", "1", 1);
    cr_assert_null(tp_backend_cuda_new(NULL));
    cr_assert(strstr(tp_last_error(), "TP_NO_CUDA"), "%s", tp_last_error());
    tp_backend_t *b = tp_backend_default_new(1);
    cr_assert_not_null(b);
    cr_assert_str_eq(b->ops->name, "cpu");
    cr_assert_eq(b->device, -1);
    tp_backend_destroy(&b);
}

Test(cuda_fallback, default_backend_is_cuda_when_a_device_answers) {
    tp_backend_t *b = tp_backend_default_new(1);
    cr_assert_not_null(b, "%s", tp_last_error());
    if (tp_cuda_device_count() > 0) {
        cr_expect_str_eq(b->ops->name, "cuda");
        cr_expect_eq(b->device, 0);
    } else {
        cr_expect_str_eq(b->ops->name, "cpu");
        cr_log_info("%s", tp_cuda_status());
    }
    tp_backend_destroy(&b);
}

Test(cuda_fallback, a_bad_ordinal_is_an_error) {
    if (tp_cuda_device_count() <= 0) {
        cr_assert_null(tp_backend_cuda_new(NULL));
        cr_assert(strstr(tp_last_error(), "no CUDA devices"), "%s", tp_last_error());
        return;
    }
    tp_cuda_options_t o = tp_cuda_options_default();
    o.device = 999;
    cr_assert_null(tp_backend_cuda_new(&o));
    cr_assert(strstr(tp_last_error(), "device 999"), "%s", tp_last_error());
}

/* ---- whole training steps: GPU against CPU ---------------------------------- */

static tp_optimizer_t *s_momentum(void *u);

/* tp_train_config_t.device: training on a GPU through the launcher (what
 * tp-train --devices 0 does); the model handed out keeps its backend.
 * Without a GPU the launch fails at once, saying which device and why. */
Test(cuda_fallback, launch_train_on_device_0) {
    static const tp_model_desc_t md = {stu_inputs, 2, stu_cnn, s_momentum, NULL};
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &md;
    c.batch = 16;
    c.input = tp_input_dummy(&md, 16, 5, 1);
    c.max_epoch = 2;
    c.steps_per_epoch = 10;
    c.default_callbacks = 0;
    c.device = 0;
    tp_model_t *m = NULL;
    tp_status_t rc = tp_launch_train_with_config(&c, &m);
    if (tp_cuda_device_count() <= 0) {
        cr_assert_lt(rc, 0);
        cr_assert_null(m);
        cr_assert(strstr(tp_last_error(), "towers on CUDA device 0") &&
                  strstr(tp_last_error(), "no CUDA devices"), "%s", tp_last_error());
        return;
    }
    cr_assert_eq(rc, TP_OK, "%s", tp_last_error());
    cr_assert_not_null(m);
    cr_assert_str_eq(tp_model_backend(m)->ops->name, "cuda");
    /* 20 steps each ended in a wait for the GPU (trainer/device_wait_s) */
    cr_expect_gt(tp_model_device_wait_ns(m), 0);
    tp_tensor_t w;  /* the trained weights, read back from the device */
    cr_assert_eq(tp_model_var(m, "fc2/W", &w), TP_OK, "%s", tp_last_error());
    float host[32 * 5];
    cr_assert_eq(tp_tensor_numel(&w), 32 * 5);
    cr_assert_not_null(tp_model_view_host(m, &w, host, sizeof host), "%s", tp_last_error());
    for (int i = 0; i < 32 * 5; i++)
        cr_assert(isfinite(host[i]), "fc2/W[%d] = %g", i, (double)host[i]);
    tp_model_destroy(&m);  /* and the backend it took */
}



/* Not Adam for whole steps: its first update is lr * sign(g), so a gradient
 * component near zero could flip between CPU and GPU rounding and move by
 * the whole step; optimizer_updates checks Adam's arithmetic itself. */
static tp_optimizer_t *s_momentum(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.05, 0.9, 0);
}

/* The same model, seed and batches on both backends; after `steps` steps
 * every variable (trainable and moving averages) agrees. */
static void s_train_compare(int towers, tp_optimizer_fn opt, int steps) {
    tp_backend_t *g = s_gpu();
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, opt, NULL};
    tp_model_config_t cfg = stu_config(towers);
    cfg.infer_batch = 16;
    tp_model_t *mc = tp_model_new(&md, &cfg);
    cr_assert_not_null(mc, "%s", tp_last_error());
    cfg.backend = g;
    tp_model_t *mg = tp_model_new(&md, &cfg);
    cr_assert_not_null(mg, "%s", tp_last_error());
    tp_rng_t r;
    tp_rng_init(&r, 33, 0);
    static uint8_t x[4][16 * 144];
    static int32_t y[4][16];
    int64_t xs[3] = {16, 12, 12}, ys[1] = {16};
    tp_tensor_t in[4][2]; /* the towers' feeds, one after another */
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    for (int s = 0; s < steps; s++) {
        for (int t = 0; t < towers; t++) {
            for (int i = 0; i < 16 * 144; i++)
                x[t][i] = (uint8_t)tp_rng_u64(&r);
            for (int i = 0; i < 16; i++)
                y[t][i] = (int32_t)(tp_rng_u64(&r) % 5);
            tp_tensor_init_wrap(&in[t][0], TP_UINT8, 3, xs, x[t], NULL, NULL);
            tp_tensor_init_wrap(&in[t][1], TP_INT32, 1, ys, y[t], NULL, NULL);
        }
        cr_assert_eq(tp_model_run(mc, TP_ALL_TOWERS, in[0], 2 * towers, NULL, 0, NULL),
                     TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_model_run(mg, TP_ALL_TOWERS, in[0], 2 * towers, NULL, 0, NULL),
                     TP_OK, "%s", tp_last_error());
        /* one row's argmax may flip on a near-tie: 1/16 */
        cr_expect_float_eq(tp_model_metric_value(mg, 0, 0),
                           tp_model_metric_value(mc, 0, 0), 0.07,
                           "accuracy of step %d", s);
    }
    for (int i = 0; i < tp_model_var_count(mc); i++) {
        const char *name = tp_model_var_name(mc, i);
        tp_tensor_t vc, vg;
        cr_assert_eq(tp_model_var(mc, name, &vc), TP_OK);
        cr_assert_eq(tp_model_var(mg, name, &vg), TP_OK);
        size_t n = vc.nbytes / 4;
        float *h = malloc(vc.nbytes + 4);
        /* the GPU's views are device memory: read through the backend (the
         * CPU stand-in's are the views themselves) */
        const float *p = tp_model_view_host(mg, &vg, h, vc.nbytes);
        cr_assert_not_null(p, "%s", tp_last_error());
        char what[160];
        snprintf(what, sizeof what, "%s after %d steps (%d towers)", name,
                 steps, towers);
        s_close(what, p, vc.data, n, 2e-4f, 2e-3f);
        free(h);
    }
    /* the inference graph on the trained weights */
    cr_assert_eq(tp_model_run(mc, -1, in[0], 2, NULL, 0, &fwd), TP_OK, "%s",
                 tp_last_error());
    cr_assert_eq(tp_model_run(mg, -1, in[0], 2, NULL, 0, &fwd), TP_OK, "%s",
                 tp_last_error());
    cr_expect_float_eq(tp_model_metric_value(mg, -1, 0),
                       tp_model_metric_value(mc, -1, 0), 0.07);
    tp_model_destroy(&mg);
    tp_model_destroy(&mc);
    tp_backend_destroy(&g);
}

Test(cuda_step, one_tower_sgd_matches_the_cpu) { s_train_compare(1, stu_nesterov, 4); }

/* A GPT's linears as the zoo builds them (batch_matmul against an
 * unbatched W [K,N], add of a [N] bias) on the images' rows ([B,12,12] as
 * [B,T,C]): a tanh GELU after the first, an erf GELU after the second (no
 * bias), the third with a bias alone; the MSE against the rows. */
static tp_status_t s_gpt_linears(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    const int64_t btc[3] = {-1, 12, 12};
    tp_node_t *x = tp_reshape(t, "rows", tp_cast(t, "cast", in[0], 1.0f / 255), 3, btc);
    tp_node_t *h = tp_gelu(t, "fc/gelu", tt_gpt_linear(t, "fc", x, 12, 64, 1), 1);
    h = tp_gelu(t, "mid/gelu", tt_gpt_linear(t, "mid", h, 64, 48, 0), 0);
    tp_node_t *y = tt_gpt_linear(t, "proj", h, 48, 12, 1);
    tp_node_t *cost = tp_mse(t, "mse", y, x);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

/* The GPT's linears folded on the device (TP_CUDA_BMM_FOLD=1: fold.c asks
 * ops->bmm_fold; ops.cu's s_bmm_fold_*) train as the unfolded calls
 * (batch_matmul, the add's broadcast backward, the gelu ops) from the same
 * start over the same batches, within rounding: the folded bias gradient
 * is a column sum in double, the add's a sum of rows in float. Four folds
 * (two biases, two GELUs) must have happened, or the test says so. */
Test(cuda_step, gpt_linears_folded_train_as_unfolded) {
    setenv("TP_CUDA_BMM_FOLD", "1", 0); /* (scripts/gpu/steps sets it too) */
    tp_backend_t *g = s_gpu();
    tp_model_desc_t md = {stu_inputs, 2, s_gpt_linears, stu_nesterov, NULL};
    tp_model_config_t cfg = stu_config(1);
    cfg.backend = g;
    cfg.fold = 1;
    tp_model_t *on = tp_model_new(&md, &cfg);
    cr_assert_not_null(on, "%s", tp_last_error());
    cfg.fold = 0;
    tp_model_t *off = tp_model_new(&md, &cfg);
    cr_assert_not_null(off, "%s", tp_last_error());
    tp_model_set_profiling(on, 1);
    static uint8_t x[16 * 144];
    static int32_t y[16];
    for (int s = 0; s < 5; s++) {
        tp_tensor_t in[2];
        stu_batch(s, 0, x, y, in);
        cr_assert_eq(tp_model_run(on, TP_ALL_TOWERS, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        cr_assert_eq(tp_model_run(off, TP_ALL_TOWERS, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
    }
    tp_op_profile_t p[64];
    int n = tp_model_profile(on, 0, p, 64), folds = 0;
    for (int i = 0; i < n && i < 64; i++)
        folds += p[i].folds;
    cr_expect_eq(folds, 4, "%d folds (TP_CUDA_BMM_FOLD=%s)", folds,
                 getenv("TP_CUDA_BMM_FOLD"));
    for (int i = 0; i < tp_model_var_count(off); i++) {
        const char *name = tp_model_var_name(off, i);
        tp_tensor_t va, vb;
        cr_assert_eq(tp_model_var(on, name, &va), TP_OK);
        cr_assert_eq(tp_model_var(off, name, &vb), TP_OK);
        float *ha = malloc(va.nbytes + 4), *hb = malloc(vb.nbytes + 4);
        const float *pa = tp_model_view_host(on, &va, ha, va.nbytes);
        const float *pb = tp_model_view_host(off, &vb, hb, vb.nbytes);
        cr_assert(pa && pb, "%s", tp_last_error());
        char what[160];
        snprintf(what, sizeof what, "%s after 5 steps, folded", name);
        s_close(what, pa, pb, va.nbytes / 4, 2e-4f, 2e-3f);
        free(ha);
        free(hb);
    }
    tp_model_destroy(&on);
    tp_model_destroy(&off);
    tp_backend_destroy(&g);
}

/* Two towers on one GPU, each on its own thread as the replicated trainer
 * runs them, the gradients all-reduced in buckets of 1 KiB during the
 * backward pass (the comm streams, the one-device kernel): as the CPU's
 * one all-reduce after the pass, within the whole-step tolerances. */
Test(cuda_step, buckets_reduced_during_backward_match_the_cpu) {
    tp_backend_t *g = s_gpu();
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, s_momentum, NULL};
    tp_model_config_t cfg = stu_config(2);
    cfg.bucket_bytes = 0;
    tp_model_t *mc = tp_model_new(&md, &cfg);
    cr_assert_not_null(mc, "%s", tp_last_error());
    cfg.backend = g;
    cfg.own_backend = 1;
    cfg.bucket_bytes = 1024;
    tp_model_t *mg = tp_model_new(&md, &cfg);
    cr_assert_not_null(mg, "%s", tp_last_error());
    cr_assert_geq(mg->towers[0]->nbuckets, 3);
    for (int s = 0; s < 3; s++) {
        stu_step_threads(mc, s);
        stu_step_threads(mg, s);
    }
    size_t bytes = mg->ntrain * sizeof(float);
    float *h = malloc(bytes);
    cr_assert_eq(g->ops->copy(g, NULL, h, mg->rep[0].train_arena, bytes, TP_COPY_D2H),
                 TP_OK, "%s", tp_last_error());
    s_close("the variables (buckets)", h, mc->rep[0].train_arena, mg->ntrain, 2e-4f, 2e-3f);
    free(h);
    tp_model_destroy(&mg);
    tp_model_destroy(&mc);
}

/* Towers on two GPUs (tp_model_config_t.devices, a replica of the
 * variables on each, the gradients all-reduced by NCCL) train as two towers
 * on the CPU, and the replicas stay equal bit for bit. Needs two GPUs; the
 * harness runs it on two CPU backends. */
Test(cuda_step, towers_on_two_gpus_train_as_on_the_cpu) {
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, s_momentum, NULL};
    tp_model_config_t cfg = stu_config(2);
    if (!s_on_cpu() && tp_cuda_device_count() < 2)
        cr_skip_test("needs two GPUs (%d found: %s)", tp_cuda_device_count(),
                     tp_cuda_status());
    tp_model_t *mc = tp_model_new(&md, &cfg);
    cr_assert_not_null(mc, "%s", tp_last_error());
    for (int r = 0; r < 2; r++) {
        tp_cuda_options_t o = tp_cuda_options_default();
        o.device = r;
        o.tf32 = 0;
        cfg.devices[r] = s_on_cpu() ? tp_backend_cpu_new(1) : tp_backend_cuda_new(&o);
        cr_assert_not_null(cfg.devices[r], "%s", tp_last_error());
    }
    cfg.ndevices = 2;
    cfg.own_backend = 1;
    tp_model_t *mg = tp_model_new(&md, &cfg);
    cr_assert_not_null(mg, "%s", tp_last_error());
    cr_assert_eq(tp_tower_device(mg->towers[1]), s_on_cpu() ? -1 : 1);
    for (int s = 0; s < 3; s++) {
        stu_step_threads(mc, s);
        stu_step_threads(mg, s);
    }
    size_t bytes = mg->ntrain * sizeof(float);
    float *h[3] = {malloc(bytes), malloc(bytes), malloc(bytes)};
    for (int r = 0; r < 2; r++) {
        tp_backend_t *b = mg->rep[r].backend;
        cr_assert_eq(b->ops->copy(b, NULL, h[r], mg->rep[r].train_arena, bytes,
                                  TP_COPY_D2H), TP_OK, "%s", tp_last_error());
    }
    cr_expect_eq(memcmp(h[0], h[1], bytes), 0, "the replicas differ");
    memcpy(h[2], mc->rep[0].train_arena, bytes);
    s_close("the variables on two GPUs", h[0], h[2], mg->ntrain, 2e-4f, 2e-3f);
    for (int k = 0; k < 3; k++)
        free(h[k]);
    tp_model_destroy(&mg);
    tp_model_destroy(&mc);
}

/* config.graphs: the training step recorded once (its second step at a
 * batch) and replayed, against the same model run call by call on the same
 * device: the same variables after steps whose learning rate changes every
 * step, with a smaller batch in between (call by call), dropout, batch
 * norm and label checks; then a bad label in a replayed step fails it. */
typedef struct {
    tp_model_t *m[2]; /* call by call; graphed (and maybe ahead) */
    int ahead;        /* m[1] runs one step ahead on a device */
    float prev;       /* m[0]'s accuracy of the step before */
} s_gpair_t;

static void s_graph_step(int s, void *arg) {
    s_gpair_t *p = arg;
    float now = tp_model_metric_value(p->m[0], 0, 0);
    /* one step ahead, a read after step s gets step s - 1's (the first
     * step's read waits for it) */
    float want = p->ahead && s > 0 ? p->prev : now;
    cr_expect_float_eq(tp_model_metric_value(p->m[1], 0, 0), want, 1e-6,
                       "accuracy of step %d", s);
    p->prev = now;
    /* recorded at the second full-batch step, replayed from the third */
    if (!s_on_cpu())
        cr_assert_eq(tp_model_graphed(p->m[1], 0), s >= 1, "step %d", s);
}

static void s_graph_compare(tp_optimizer_fn opt, double lr0, int ahead) {
    tp_backend_t *g = s_gpu();
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, opt, NULL};
    tp_model_config_t cfg = stu_config(1);
    cfg.infer_batch = 16;
    cfg.backend = g;
    cfg.graphs = 0;
    tp_model_t *m[2];
    m[0] = tp_model_new(&md, &cfg);
    cr_assert_not_null(m[0], "%s", tp_last_error());
    cfg.graphs = 1;
    cfg.ahead = ahead;
    m[1] = tp_model_new(&md, &cfg);
    cr_assert_not_null(m[1], "%s", tp_last_error());
    const int steps = 8;
    s_gpair_t pair = {{m[0], m[1]}, ahead && tp_backend_device(g) >= 0, 0};
    stu_train_pair(m[0], m[1], steps, lr0, s_graph_step, &pair);
    for (int i = 0; i < tp_model_var_count(m[0]); i++) {
        const char *name = tp_model_var_name(m[0], i);
        tp_tensor_t v0, v1;
        cr_assert_eq(tp_model_var(m[0], name, &v0), TP_OK);
        cr_assert_eq(tp_model_var(m[1], name, &v1), TP_OK);
        size_t n = v0.nbytes / 4;
        float *h0 = malloc(v0.nbytes + 4), *h1 = malloc(v0.nbytes + 4);
        /* device memory read through the backend (on the CPU stand-in, the
         * views themselves) */
        const float *p0 = tp_model_view_host(m[0], &v0, h0, v0.nbytes);
        const float *p1 = tp_model_view_host(m[1], &v1, h1, v0.nbytes);
        cr_assert(p0 && p1, "%s", tp_last_error());
        char what[160];
        snprintf(what, sizeof what, "%s after %d steps, replayed vs call by call",
                 name, steps);
        /* the same kernels on the same device: equal but for the order of a
         * reduction cuDNN may choose per call */
        s_close(what, p1, p0, n, 1e-6f, 1e-5f);
        free(h0);
        free(h1);
    }
    stu_bad_label_fails(m[1]);  /* in a replayed step */
    tp_model_destroy(&m[1]);
    tp_model_destroy(&m[0]);
    tp_backend_destroy(&g);
}

Test(cuda_step, graphs_replay_the_sgd_step) { s_graph_compare(stu_nesterov, 0.05, 0); }
Test(cuda_step, graphs_replay_the_adam_step) { s_graph_compare(stu_adam, 0.01, 0); }
/* One step ahead (TP_CUDA_AHEAD): the host queues step N + 1 while N runs;
 * the same training, reads one step behind, a bad label failing what
 * waits next. */
Test(cuda_step, ahead_steps_train_as_the_synchronised_ones) {
    s_graph_compare(stu_nesterov, 0.05, 1);
}
Test(cuda_step, two_towers_match_the_cpu) { s_train_compare(2, s_momentum, 3); }

Test(cuda_step, a_smaller_last_batch_runs) {
    tp_backend_t *g = s_gpu();
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, stu_nesterov, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 16;
    cfg.infer_batch = 16;
    cfg.backend = g;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    static uint8_t x[5 * 144];
    int32_t y[5] = {0, 1, 2, 3, 4};
    int64_t xs[3] = {5, 12, 12}, ys[1] = {5};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, NULL), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(m, -1, in, 2, NULL, 0, &fwd), TP_OK, "%s", tp_last_error());
    /* A bad label fails the step with the bad label's value and row. Not
     * a node's name: the accuracy metric ("acc") checks the same labels and
     * is defined before the cross-entropy, so the first check slot the sync
     * collects can be its, and the message then names "acc", not "xent". */
    y[3] = 7;
    cr_assert_lt(tp_model_run(m, 0, in, 2, NULL, 0, NULL), 0);
    cr_assert(strstr(tp_last_error(), "label 7 at row 3 outside [0,5)"), "%s",
              tp_last_error());
    tp_model_destroy(&m);
    tp_backend_destroy(&g);
}

/* A batch staged on the device (pinned host buffer, copy stream) feeds a
 * model exactly like the same batch from host memory: the model's input
 * copy becomes device-to-device. */
/* Every variable of mb equals ma's (both on g). */
static void s_same_vars(tp_backend_t *g, tp_model_t *ma, tp_model_t *mb) {
    for (int i = 0; i < tp_model_var_count(ma); i++) {
        const char *name = tp_model_var_name(ma, i);
        tp_tensor_t va, vb;
        cr_assert_eq(tp_model_var(ma, name, &va), TP_OK);
        cr_assert_eq(tp_model_var(mb, name, &vb), TP_OK);
        float *ha = malloc(va.nbytes), *hb = malloc(va.nbytes);
        s_to_host(g, ha, va.data, va.nbytes);
        s_to_host(g, hb, vb.data, va.nbytes);
        /* deterministic cuDNN algorithms are preferred, not guaranteed */
        s_close(name, hb, ha, va.nbytes / 4, 1e-6f, 1e-5f);
        free(ha);
        free(hb);
    }
}

/* Two equal test CNNs on g, batch 16: one fed host batches, one staged. */
static void s_cnn_pair(tp_backend_t *g, tp_model_t **ma, tp_model_t **mb) {
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, stu_nesterov, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 16;
    cfg.seed = 7;
    cfg.backend = g;
    *ma = tp_model_new(&md, &cfg);
    *mb = tp_model_new(&md, &cfg);
    cr_assert(*ma && *mb, "%s", tp_last_error());
}

Test(cuda_step, staged_batches_feed_the_model) {
    tp_backend_t *g = s_gpu();
    tp_model_t *ma, *mb;
    s_cnn_pair(g, &ma, &mb);
    tp_stage_t *sx[2], *sy[2];
    for (int i = 0; i < 2; i++) {
        sx[i] = tp_backend_stage_new(g, 16 * 144);
        sy[i] = tp_backend_stage_new(g, 16 * 4);
        cr_assert(sx[i] && sy[i], "%s", tp_last_error());
    }
    tp_rng_t r;
    tp_rng_init(&r, 34, 0);
    int64_t xs[3] = {16, 12, 12}, ys[1] = {16};
    for (int step = 0; step < 4; step++) {
        int k = step % 2;
        cr_assert_eq(tp_backend_stage_host_wait(g, sx[k]), TP_OK);
        cr_assert_eq(tp_backend_stage_host_wait(g, sy[k]), TP_OK);
        uint8_t *hx = tp_backend_stage_host(g, sx[k]);
        int32_t *hy = tp_backend_stage_host(g, sy[k]);
        for (int i = 0; i < 16 * 144; i++)
            hx[i] = (uint8_t)tp_rng_u64(&r);
        for (int i = 0; i < 16; i++)
            hy[i] = (int32_t)(tp_rng_u64(&r) % 5);
        cr_assert_eq(tp_backend_stage_begin(g, sx[k], 16 * 144), TP_OK);
        cr_assert_eq(tp_backend_stage_begin(g, sy[k], 16 * 4), TP_OK);
        /* host-fed model: the same bytes from the pinned buffers */
        tp_tensor_t in[2];
        tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, hx, NULL, NULL);
        tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, hy, NULL, NULL);
        cr_assert_eq(tp_model_run(ma, 0, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        /* device-fed model: wait for the copies, then run on them */
        cr_assert_eq(tp_backend_stage_host_wait(g, sx[k]), TP_OK);
        cr_assert_eq(tp_backend_stage_host_wait(g, sy[k]), TP_OK);
        tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs,
                            tp_backend_stage_device(g, sx[k]), NULL, NULL);
        tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys,
                            tp_backend_stage_device(g, sy[k]), NULL, NULL);
        cr_assert_eq(tp_model_run(mb, 0, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        cr_assert_eq(tp_backend_stage_release(g, sx[k], NULL), TP_OK);
        cr_assert_eq(tp_backend_stage_release(g, sy[k], NULL), TP_OK);
    }
    s_same_vars(g, ma, mb);
    for (int i = 0; i < 2; i++) {
        tp_backend_stage_destroy(g, &sx[i]);
        tp_backend_stage_destroy(g, &sy[i]);
    }
    tp_model_destroy(&ma);
    tp_model_destroy(&mb);
    tp_backend_destroy(&g);
}

/* StagingInput bound to the device (tp-train's default on a GPU): each
 * batch reaches the device through a pinned stage on the copy stream, and
 * the model trains from it as from the same batches in host memory. */
Test(cuda_step, staging_input_feeds_the_model_from_the_device) {
    tp_backend_t *g = s_gpu();
    tp_model_t *ma, *mb;
    s_cnn_pair(g, &ma, &mb);
    enum { N = 5 };
    static uint8_t hx[N][16 * 144];
    static int32_t hy[N][16];
    int64_t xs[3] = {16, 12, 12}, ys[1] = {16};
    tp_rng_t r;
    tp_rng_init(&r, 35, 0);
    tp_datapoint_t *dps[N];
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < 16 * 144; i++)
            hx[k][i] = (uint8_t)tp_rng_u64(&r);
        for (int i = 0; i < 16; i++)
            hy[k][i] = (int32_t)(tp_rng_u64(&r) % 5);
        dps[k] = tp_datapoint_new(2);
        cr_assert_eq(tp_tensor_init(tp_datapoint_get(dps[k], 0), TP_UINT8, 3, xs), TP_OK);
        cr_assert_eq(tp_tensor_init(tp_datapoint_get(dps[k], 1), TP_INT32, 1, ys), TP_OK);
        memcpy(tp_datapoint_get(dps[k], 0)->data, hx[k], sizeof hx[k]);
        memcpy(tp_datapoint_get(dps[k], 1)->data, hy[k], sizeof hy[k]);
    }
    tp_input_t *in = tp_input_staging(tp_input_feed(tp_df_from_list(dps, N, 0)), 1, NULL);
    cr_assert_not_null(in, "%s", tp_last_error());
    cr_assert_eq(tp_input_bind(in, g), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    for (int step = 0; step < 2 * N; step++) {
        int k = step % N;
        tp_tensor_t host[2];
        tp_tensor_init_wrap(&host[0], TP_UINT8, 3, xs, hx[k], NULL, NULL);
        tp_tensor_init_wrap(&host[1], TP_INT32, 1, ys, hy[k], NULL, NULL);
        cr_assert_eq(tp_model_run(ma, 0, host, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_input_next(in, 0, &dp), TP_OK, "%s", tp_last_error());
        const tp_tensor_t *sx = tp_datapoint_cget(dp, 0);
        if (tp_backend_device(g) >= 0) {  /* the staged batch is on the device */
            uint8_t back[16 * 144];
            s_to_host(g, back, sx->data, sizeof back);
            cr_assert(!memcmp(back, hx[k], sizeof back), "step %d: staged bytes differ", step);
        }
        tp_tensor_t staged[2] = {*tp_datapoint_get(dp, 0), *tp_datapoint_get(dp, 1)};
        cr_assert_eq(tp_model_run(mb, 0, staged, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    s_same_vars(g, ma, mb);
    tp_input_destroy(&in);
    tp_model_destroy(&ma);
    tp_model_destroy(&mb);
    tp_backend_destroy(&g);
}

/* ---- the GAN trainer's noise on the device (issue 44) --------------------- */

/* The tiny GAN of the GAN trainers' tests on g: `towers` towers, batch 8. */
static tp_model_t *s_gan_on(tp_backend_t *g, int towers) {
    tp_model_desc_t d = {s_inputs, 4, s_tower, s_adam, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = towers;
    mc.batch = 8;
    mc.seed = 7;
    mc.threads = 1;
    mc.backend = g;
    tp_model_t *m = tp_model_new(&d, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

/* The GAN trainer on the device draws each step's noise there, into each
 * tower's own noise input (tp_model_fill_noise -> the backend's
 * noise_fill, gpu/cuda/noise.cu): after 3 steps of 2 towers, tower i's z
 * is its planned device buffer and holds step 2's rows i x 8 ..., the
 * host's tp_gan_noise_fill to the bit (normal noise, a seed with high
 * bits). And runs fed the device's noise train as runs fed the host's
 * noise through the input copy, d then g, each its own forward (the
 * second reads the filled input again). */
Test(cuda_step, gan_trainer_draws_its_noise_on_the_device) {
    tp_backend_t *g = s_gpu();
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.batch = 8;
    gc.noise_input = S_NOISE_INPUT;
    gc.noise = TP_GAN_NOISE_NORMAL;
    gc.seed = 0xfeedface12345ull;
    gc.g_optimizer = s_adam;
    gc.d_optimizer = s_adam_d;
    tp_trainer_t *tr = tp_gan_trainer_new(s_gan_on(g, 2), tp_input_feed(s_points(8)), &gc);
    cr_assert_not_null(tr, "%s", tp_last_error());
    tp_schedule_t sched = {1, 1, 3};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    tp_model_t *m = tp_trainer_model(tr);
    float want[8 * ZDIM], buf[8 * ZDIM];
    for (int i = 0; i < 2; i++) {
        tp_tensor_t z, again;
        cr_assert_eq(tp_model_fetch(m, i, "z", &z), TP_OK, "%s", tp_last_error());
        cr_assert_eq(z.nbytes, sizeof buf);
        const float *got = tp_model_view_host(m, &z, buf, sizeof buf);
        cr_assert_not_null(got, "%s", tp_last_error());
        tp_gan_noise_fill(&gc, 2, i * 8, 8, ZDIM, want);
        for (int k = 0; k < 8 * ZDIM; k++)
            if (memcmp(&got[k], &want[k], sizeof(float)))
                cr_assert_fail("tower%d's z[%d]: device %.9g, host %.9g", i, k,
                               (double)got[k], (double)want[k]);
        cr_assert_eq(tp_model_fill_noise(m, i, S_NOISE_INPUT, gc.seed, 2, i * 8, 8, 1, 1.0f,
                                         &again),
                     TP_OK, "%s", tp_last_error());
        cr_assert_eq(again.data, z.data, "tower%d ran on a noise buffer not its own", i);
        tp_tensor_fini(&again);
        tp_tensor_fini(&z);
    }
    tp_trainer_destroy(&tr);

    tp_model_t *ma = s_gan_on(g, 1), *mb = s_gan_on(g, 1);
    tp_dataflow_t *df = s_points(8);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK, "%s", tp_last_error());
    static float host[8 * ZDIM];
    int64_t zs[2] = {8, ZDIM};
    const char *costs[2] = {"d_loss", "g_loss"};
    for (int64_t step = 0; step < 4; step++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_tensor_t fa[4], fb[4];
        tp_datapoint_views(dp, fa, 3);
        tp_datapoint_views(dp, fb, 3);
        tp_gan_noise_fill(&gc, step, 0, 8, ZDIM, host);
        tp_tensor_init_wrap(&fa[3], TP_FLOAT32, 2, zs, host, NULL, NULL);
        cr_assert_eq(tp_model_fill_noise(mb, 0, S_NOISE_INPUT, gc.seed, step, 0, 8, 1, 1.0f,
                                         &fb[3]),
                     TP_OK, "%s", tp_last_error());
        for (int c = 0; c < 2; c++) {
            tp_run_opts_t ro = {.stages = TP_RUN_TRAIN, .cost = costs[c]};
            cr_assert_eq(tp_model_run(ma, 0, fa, 4, NULL, 0, &ro), TP_OK, "%s", tp_last_error());
            cr_assert_eq(tp_model_run(mb, 0, fb, 4, NULL, 0, &ro), TP_OK, "%s", tp_last_error());
        }
        tp_datapoint_destroy(&dp);
    }
    s_same_vars(g, ma, mb);
    tp_dataflow_destroy(&df);
    tp_model_destroy(&ma);
    tp_model_destroy(&mb);
    tp_backend_destroy(&g);
}
