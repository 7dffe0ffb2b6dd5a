/* towerpack tests: the dense layer's matmul on oneDNN (gpu/cpu/dnnl_matmul.c)
 * against ops_cpu.c's OpenBLAS path, the reference the finite-difference
 * and PyTorch step suites check, through the backend's op entries (a
 * one-thread backend: the one that runs oneDNN): the output with a folded
 * bias and relu, dW and dX stored and added (dx_acc), a flattened [N,A,B]
 * input, the first layer's call without dX; calls that allocate nothing
 * once a geometry ran; two threads (two towers) running the same cached
 * primitives at once; TP_CPU_MATMUL choosing the path; bf16 products
 * (tp_backend_cpu_bf16) against the rounded operands' exact products. */
#include <criterion/criterion.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>
#include "gpu/cpu/cpu_bf16.h"
#include "gpu/op_call_testutil.h"

TestSuite(dnnl_matmul, .timeout = 60);

typedef oct_call_t call_t;

/* x [xs] @ W [K, m] (+ b) (relu); gradients preset to 1 (an added one
 * shows), dX absent when !want_dx; the workspace as the backend plans. */
static void s_call(call_t *t, tp_backend_t *b, tp_shape_t xs, int m, int bias, int relu,
                   int acc, int want_dx) {
    const int64_t k = (int64_t)(tp_shape_count(&xs) / (size_t)xs.d[0]);
    const tp_shape_t in[2] = {xs, {2, {k, m}}};
    oct_call_init(t, TP_OP_MATMUL, "fc/matmul", 2, in, (tp_shape_t){2, {xs.d[0], m}}, acc,
                  -1.0f, 1.0f);
    t->b = malloc((size_t)m * sizeof(float));
    t->db = malloc((size_t)m * sizeof(float));
    oct_fill(t->b, (size_t)m, 5u, -0.5f, 0.5f);
    t->attr.act = relu ? TP_ACT_RELU : TP_ACT_NONE;
    if (bias) {
        t->c.bias = t->b;
        t->c.dbias = t->db;
    }
    if (!want_dx) {
        free(t->dx[0]);
        t->dx[0] = NULL;
    }
    oct_plan(b, &t->c, &t->ws);
}

static void s_run(call_t *t, tp_backend_t *b) {
    oct_run(b, &t->c);
}

static void s_free(call_t *t) {
    oct_call_free(t);
}

/* sums of up to 784 products of [-1, 1] values, added in other orders,
 * differ by ~1e-5 where they cancel: 1e-4 of 1 + |b| */
static void s_close(const float *a, const float *b, size_t n, float tol, const char *what) {
    oct_close(a, b, n, tol, what);
}

Test(dnnl_matmul, matches_openblas_with_bias_relu_stored_and_added) {
    const struct { tp_shape_t xs; int m; } g[] = {
        {{2, {64, 784}}, 512}, /* the MLP's layers, a tower's batch */
        {{2, {64, 512}}, 256},
        {{2, {64, 256}}, 10},
        {{2, {7, 13}}, 5},     /* odd sizes */
        {{3, {5, 3, 4}}, 9},   /* [N,A,B] flattened to [N,12] */
    };
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b, "%s", tp_last_error());
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        for (int v = 0; v < 8; v++) {
            const int bias = v & 1, relu = (v >> 1) & 1, acc = (v >> 2) & 1;
            call_t t[2];
            for (int p = 0; p < 2; p++) {
                setenv("TP_CPU_MATMUL", p ? "own" : "dnnl", 1);
                s_call(&t[p], b, g[i].xs, g[i].m, bias, relu, acc, 1);
                s_run(&t[p], b);
            }
            s_close(t[0].y, t[1].y, tp_shape_count(&t[0].ys), 1e-4f, "y");
            for (int j = 0; j < 2; j++)
                s_close(t[0].dx[j], t[1].dx[j], tp_shape_count(&t[0].xs[j]), 1e-4f, "dx");
            if (bias)
                s_close(t[0].db, t[1].db, (size_t)g[i].m, 1e-4f, "dbias");
            s_free(&t[0]);
            s_free(&t[1]);
        }
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&b);
}

/* The first layer's matmul: no gradient for the data, dX NULL; dW as
 * OpenBLAS's. */
Test(dnnl_matmul, a_call_without_dx_writes_dw_only) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    call_t t[2];
    for (int p = 0; p < 2; p++) {
        setenv("TP_CPU_MATMUL", p ? "own" : "dnnl", 1);
        s_call(&t[p], b, (tp_shape_t){2, {32, 100}}, 48, 1, 1, 0, 0);
        s_run(&t[p], b);
    }
    s_close(t[0].dx[1], t[1].dx[1], 100 * 48, 1e-4f, "dW");
    s_free(&t[0]);
    s_free(&t[1]);
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&b);
}

/* What a step does on oneDNN allocates nothing once the geometry ran (the
 * primitives cached, the thread's memory objects pointed at each call's
 * buffers): the heap's bytes in use are the same after many calls. */
Test(dnnl_matmul, calls_after_the_first_allocate_nothing) {
    setenv("TP_CPU_MATMUL", "dnnl", 1);
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    call_t t;
    s_call(&t, b, (tp_shape_t){2, {16, 40}}, 24, 1, 1, 1, 1);
    s_run(&t, b);
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < 50; i++)
        s_run(&t, b);
    struct mallinfo2 after = mallinfo2();
    cr_expect_eq(before.uordblks, after.uordblks, "%zu bytes before, %zu after",
                 before.uordblks, after.uordblks);
    s_free(&t);
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&b);
}

/* Which path runs: the two paths sum in different orders, so a 784-long
 * dot product differs in its last bits between them; the same path twice
 * is bit for bit the same. */
Test(dnnl_matmul, the_environment_chooses_the_path) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    const char *paths[3] = {"dnnl", "own", NULL}; /* NULL: unset, the default */
    call_t t[3];
    for (int p = 0; p < 3; p++) {
        if (paths[p])
            setenv("TP_CPU_MATMUL", paths[p], 1);
        else
            unsetenv("TP_CPU_MATMUL");
        s_call(&t[p], b, (tp_shape_t){2, {64, 784}}, 512, 0, 0, 0, 1);
        s_run(&t[p], b);
    }
    const size_t n = 64 * 512 * sizeof(float);
    cr_expect_neq(memcmp(t[0].y, t[1].y, n), 0, "oneDNN's and OpenBLAS's sums agree bit "
                  "for bit: one path ran twice");
    cr_expect_eq(memcmp(t[0].y, t[2].y, n), 0, "the default is not oneDNN's");
    for (int p = 0; p < 3; p++)
        s_free(&t[p]);
    tp_backend_destroy(&b);
}

/* Two towers run the same cached primitives at once, each on its own
 * buffers and scratchpad (the op's workspace): each gets, 30 times over,
 * bit for bit what one thread alone got. */
typedef struct {
    call_t t;
    const call_t *ref;
    int bad;
} tower_t;

static void *s_tower(void *arg) {
    tower_t *w = arg;
    tp_backend_t *b = tp_backend_cpu_new(1);
    if (!b) {
        w->bad = -1;
        return NULL;
    }
    const size_t ny = tp_shape_count(&w->t.ys), nw = tp_shape_count(&w->t.xs[1]);
    const size_t nx = tp_shape_count(&w->t.xs[0]);
    for (int i = 0; i < 30; i++) {
        if (b->ops->op_forward(b, NULL, &w->t.c) != TP_OK ||
            b->ops->op_backward(b, NULL, &w->t.c) != TP_OK) {
            w->bad = -1;
            break;
        }
        w->bad += memcmp(w->t.y, w->ref->y, ny * sizeof(float)) != 0;
        w->bad += memcmp(w->t.dx[1], w->ref->dx[1], nw * sizeof(float)) != 0;
        w->bad += memcmp(w->t.dx[0], w->ref->dx[0], nx * sizeof(float)) != 0;
    }
    tp_backend_destroy(&b);
    return NULL;
}

Test(dnnl_matmul, two_towers_share_the_cached_primitives) {
    setenv("TP_CPU_MATMUL", "dnnl", 1);
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    const tp_shape_t xs = {2, {64, 256}};
    call_t ref;
    s_call(&ref, b, xs, 128, 1, 1, 0, 1);
    s_run(&ref, b);
    tower_t w[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        s_call(&w[i].t, b, xs, 128, 1, 1, 0, 1);
        w[i].ref = &ref;
        w[i].bad = 0;
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, s_tower, &w[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        cr_expect_eq(w[i].bad, 0, "tower %d: %d results differ (-1: a call failed)", i,
                     w[i].bad);
        s_free(&w[i].t);
    }
    s_free(&ref);
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&b);
}

/* ---- bf16 products ------------------------------------------------------ */

/* c[i] (+)= the sum over p of op(a)[i, p] op(b)[p, j] in double, each
 * operand rounded to bf16 first when `round`: what a bf16 product with
 * exact sums gives. a [m, k] or (ta) stored [k, m]; b [k, n] or (tb) [n, k]. */
static void s_ref(double *c, const float *a, int ta, const float *b, int tb, int m, int n,
                  int k, int round) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = 0;
            for (int p = 0; p < k; p++) {
                float u = ta ? a[p * m + i] : a[i * k + p], v = tb ? b[j * k + p] : b[p * n + j];
                if (round) {
                    u = tp_bf16_to_f32(tp_f32_to_bf16(u));
                    v = tp_bf16_to_f32(tp_f32_to_bf16(v));
                }
                sum += (double)u * (double)v;
            }
            c[i * n + j] += sum;
        }
}

/* got against the rounded product (ref_bf: fp32 sums of exact products,
 * 1e-5 of 1 + |ref|) and far from the unrounded one (ref_32: bf16's 8
 * bits show, the largest difference over 10x that bound). */
static void s_bf16_close(const float *got, const double *ref_bf, const double *ref_32, size_t n,
                         const char *what) {
    double far = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(got[i] - ref_bf[i]) <= 1e-5 * (1 + fabs(ref_bf[i])),
                  "%s[%zu]: %.7g, the bf16 operands' product %.7g", what, i, (double)got[i],
                  ref_bf[i]);
        const double d = fabs(got[i] - ref_32[i]) / (1 + fabs(ref_32[i]));
        far = d > far ? d : far;
    }
    cr_assert(far > 1e-4, "%s: within %.2g of the fp32 product: the operands were not "
              "rounded to bf16", what, far);
}

static double *s_zeros(size_t n) {
    double *v = calloc(n, sizeof *v);
    cr_assert_not_null(v);
    return v;
}

/* The dense layer (forward with its bias, dW added, dX stored) and
 * batch_matmul (forward, dA and dB) with bf16 on: each output the fp32 sum
 * of the rounded operands' products, and not the fp32 product; off again,
 * the fp32 one. */
Test(dnnl_matmul, bf16_products_sum_the_rounded_operands_in_fp32) {
    if (!tp_backend_cpu_bf16(1))
        cr_skip_test("this CPU has no bf16 dot products (AVX512_BF16, AMX)");
    cr_assert(tp_cpu_bf16_on());
    tp_backend_t *b = oct_backend();
    const int n = 24, k = 300, m = 40;
    call_t t;
    s_call(&t, b, (tp_shape_t){2, {n, k}}, m, 1, 0, 1, 1);
    t.acc[0] = 0; /* dX stored, dW added to its preset 1 */
    s_run(&t, b);
    double *r[2] = {s_zeros((size_t)n * m), s_zeros((size_t)n * m)};
    for (int q = 0; q < 2; q++) {
        for (int i = 0; i < n * m; i++)
            r[q][i] = t.b[i % m]; /* the bias, added in fp32 */
        s_ref(r[q], t.x[0], 0, t.x[1], 0, n, m, k, q == 0);
    }
    s_bf16_close(t.y, r[0], r[1], (size_t)n * m, "y");
    double *dw[2] = {s_zeros((size_t)k * m), s_zeros((size_t)k * m)};
    double *dx[2] = {s_zeros((size_t)n * k), s_zeros((size_t)n * k)};
    for (int q = 0; q < 2; q++) {
        for (int i = 0; i < k * m; i++)
            dw[q][i] = 1.0; /* added */
        s_ref(dw[q], t.x[0], 1, t.dy, 0, k, m, n, q == 0);
        s_ref(dx[q], t.dy, 0, t.x[1], 1, n, k, m, q == 0);
    }
    s_bf16_close(t.dx[1], dw[0], dw[1], (size_t)k * m, "dW");
    s_bf16_close(t.dx[0], dx[0], dx[1], (size_t)n * k, "dX");

    /* batch_matmul [3, 20, 70] @ [3, 70, 17], every batch its own */
    const int nb = 3, bm = 20, bk = 70, bn = 17;
    const tp_shape_t in[2] = {{3, {nb, bm, bk}}, {3, {nb, bk, bn}}};
    call_t u;
    oct_call_init(&u, TP_OP_BATCH_MATMUL, "attn/bmm", 2, in, (tp_shape_t){3, {nb, bm, bn}}, 0,
                  -1.0f, 1.0f);
    oct_plan(b, &u.c, &u.ws);
    oct_run(b, &u.c);
    double *by[2] = {s_zeros((size_t)nb * bm * bn), s_zeros((size_t)nb * bm * bn)};
    double *da[2] = {s_zeros((size_t)nb * bm * bk), s_zeros((size_t)nb * bm * bk)};
    double *db[2] = {s_zeros((size_t)nb * bk * bn), s_zeros((size_t)nb * bk * bn)};
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < nb; i++) {
            const float *a = u.x[0] + i * bm * bk, *bb = u.x[1] + i * bk * bn,
                        *dy = u.dy + i * bm * bn;
            s_ref(by[q] + i * bm * bn, a, 0, bb, 0, bm, bn, bk, q == 0);
            s_ref(da[q] + i * bm * bk, dy, 0, bb, 1, bm, bk, bn, q == 0);
            s_ref(db[q] + i * bk * bn, a, 1, dy, 0, bk, bn, bm, q == 0);
        }
    s_bf16_close(u.y, by[0], by[1], (size_t)nb * bm * bn, "bmm y");
    s_bf16_close(u.dx[0], da[0], da[1], (size_t)nb * bm * bk, "bmm dA");
    s_bf16_close(u.dx[1], db[0], db[1], (size_t)nb * bk * bn, "bmm dB");

    /* off: the fp32 product again (its own primitives, planned anew; the
     * same operands, from the same seeds) */
    cr_assert_eq(tp_backend_cpu_bf16(0), 0);
    s_free(&t);
    s_call(&t, b, (tp_shape_t){2, {n, k}}, m, 1, 0, 0, 1);
    oct_forward(b, &t.c);
    for (int i = 0; i < n * m; i++)
        cr_assert(fabs(t.y[i] - r[1][i]) <= 1e-5 * (1 + fabs(r[1][i])), "y[%d] off: %.7g, "
                  "want the fp32 product %.7g", i, (double)t.y[i], r[1][i]);
    for (int q = 0; q < 2; q++) {
        free(r[q]), free(dw[q]), free(dx[q]), free(by[q]), free(da[q]), free(db[q]);
    }
    s_free(&t);
    oct_call_free(&u);
    tp_backend_destroy(&b);
}

/* A CPU without bf16 dot products (oneDNN capped below AVX512_BF16, as
 * ONEDNN_MAX_CPU_ISA=AVX512_CORE does): asking says no, and the products
 * stay fp32, bit for bit those of bf16 never asked. */
Test(dnnl_matmul, bf16_asked_where_the_cpu_lacks_it_keeps_fp32) {
    cr_assert_eq(dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core), dnnl_success);
    tp_backend_t *b = oct_backend();
    call_t t[2];
    for (int p = 0; p < 2; p++) {
        cr_assert_eq(tp_backend_cpu_bf16(p), 0, "bf16 %d said on", p);
        cr_assert_eq(tp_cpu_bf16_on(), 0);
        s_call(&t[p], b, (tp_shape_t){2, {16, 200}}, 32, 1, 0, 0, 1);
        s_run(&t[p], b);
    }
    cr_expect_eq(memcmp(t[0].y, t[1].y, 16 * 32 * sizeof(float)), 0);
    cr_expect_eq(memcmp(t[0].dx[1], t[1].dx[1], 200 * 32 * sizeof(float)), 0);
    for (int p = 0; p < 2; p++)
        s_free(&t[p]);
    tp_backend_destroy(&b);
}

/* The operands' conversion: every float as tp_f32_to_bf16 rounds it
 * (nearest, ties to even; infinities kept; NaNs stay NaNs), sixteen at a
 * time where the CPU converts and one by one in the tail. */
Test(dnnl_matmul, the_bf16_conversion_rounds_as_the_scalar_one) {
    enum { N = 1000 }; /* past 31 x 32, a tail */
    float *v = malloc(N * sizeof(float));
    uint16_t *got = malloc(N * sizeof(uint16_t));
    cr_assert(v && got);
    oct_fill(v, N, 3u, -1e3f, 1e3f);
    const uint32_t special[] = {0x3f808000u /* a tie, to even (down) */,
                                0x3f818000u /* a tie, to even (up) */,
                                0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u,
                                0x00000001u /* a denormal */, 0x80000000u, 0x7f7fffffu};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        memcpy(&v[i * 37], &special[i], 4);         /* in the sixteens */
        memcpy(&v[N - 1 - i], &special[i], 4);      /* and in the tail */
    }
    tp_cpu_f32_to_bf16(got, v, N);
    for (int i = 0; i < N; i++) {
        const uint16_t want = tp_f32_to_bf16(v[i]);
        const int nan = (want & 0x7f80u) == 0x7f80u && (want & 0x7fu);
        if (nan)
            cr_assert((got[i] & 0x7f80u) == 0x7f80u && (got[i] & 0x7fu), "[%d]: a NaN "
                      "became 0x%04x", i, got[i]);
        else
            cr_assert_eq(got[i], want, "[%d] %a: 0x%04x, want 0x%04x", i, (double)v[i],
                         got[i], want);
    }
    free(v);
    free(got);
}
