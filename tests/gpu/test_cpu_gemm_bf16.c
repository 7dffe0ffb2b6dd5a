/* towerpack tests: the bf16 GEMM of our own (gpu/cpu/cpu_gemm_bf16.c)
 * against double sums of the bf16-rounded operands, on odd shapes (m, n,
 * k not multiples of 8 or 32, k 0, 1 and odd) and the GPT's, a and b each
 * plain and transposed, with a bias and added to c (acc); the same bits
 * on one thread and two (the team splits rows and columns, never k), and
 * whichever way an operand is stored (the packing is one layout); and
 * dnnl_matmul.c's bf16 products on it by default, on oneDNN's under
 * TP_CPU_GEMM=dnnl. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/tensor.h>
#include "gpu/cpu/cpu_bf16.h"
#include "gpu/cpu/cpu_gemm_bf16.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/op_call_testutil.h"

TestSuite(cpu_gemm_bf16, .timeout = 240);

typedef struct {
    size_t m, n, k;
    int ta, tb, bias, acc;
    float *a, *b, *bv, *c, *c0;
    void *room;
} s_case_t;

/* a [m x k] and b [k x n] filled as stored plain, then (ta, tb) stored
 * transposed: the same matrices either way */
static void s_init(s_case_t *t, size_t m, size_t n, size_t k, int ta, int tb, int bias,
                   int acc) {
    *t = (s_case_t){.m = m, .n = n, .k = k, .ta = ta, .tb = tb, .bias = bias, .acc = acc};
    float *a = malloc((m * k + 1) * sizeof(float)), *b = malloc((k * n + 1) * sizeof(float));
    t->a = malloc((m * k + 1) * sizeof(float));
    t->b = malloc((k * n + 1) * sizeof(float));
    t->bv = malloc(n * sizeof(float));
    t->c = malloc(m * n * sizeof(float));
    t->c0 = malloc(m * n * sizeof(float));
    t->room = malloc(tp_gemm_bf16_room_bytes(m, n, k) + 64);
    cr_assert(a && b && t->a && t->b && t->bv && t->c && t->c0 && t->room);
    oct_fill(a, m * k, 3u, -1.0f, 1.0f);
    oct_fill(b, k * n, 4u, -1.0f, 1.0f);
    oct_fill(t->bv, n, 5u, -1.0f, 1.0f);
    oct_fill(t->c, m * n, 6u, -1.0f, 1.0f);
    memcpy(t->c0, t->c, m * n * sizeof(float));
    for (size_t i = 0; i < m; i++)
        for (size_t l = 0; l < k; l++)
            t->a[ta ? l * m + i : i * k + l] = a[i * k + l];
    for (size_t l = 0; l < k; l++)
        for (size_t j = 0; j < n; j++)
            t->b[tb ? j * k + l : l * n + j] = b[l * n + j];
    free(a);
    free(b);
}

/* the room at any alignment: 4 bytes past the allocation's */
static void s_run(s_case_t *t) {
    const tp_gemm_bf16_t g = {t->m, t->n, t->k, t->a, t->ta ? t->m : t->k, t->ta, t->b,
                              t->tb ? t->k : t->n, t->tb, t->c, t->n,
                              t->bias ? t->bv : NULL, t->acc, (char *)t->room + 4};
    tp_gemm_bf16(&g);
}

static void s_free(s_case_t *t) {
    free(t->a);
    free(t->b);
    free(t->bv);
    free(t->c);
    free(t->c0);
    free(t->room);
}

static double s_r(float x) { return tp_bf16_to_f32(tp_f32_to_bf16(x)); }

/* Every element within 1e-5 of the double sum of the rounded operands'
 * products (+ bias) (+ c's old value), relative to the sum of their
 * magnitudes. */
static void s_check(const s_case_t *t) {
    const size_t m = t->m, n = t->n, k = t->k;
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (size_t l = 0; l < k; l++) {
                const double x = s_r(t->ta ? t->a[l * m + i] : t->a[i * k + l]);
                const double y = s_r(t->tb ? t->b[j * k + l] : t->b[l * n + j]);
                s += x * y;
                mag += fabs(x * y);
            }
            if (t->bias) {
                s += t->bv[j];
                mag += fabs(t->bv[j]);
            }
            if (t->acc) {
                s += t->c0[i * n + j];
                mag += fabs(t->c0[i * n + j]);
            }
            const double got = t->c[i * n + j];
            cr_assert(fabs(got - s) <= 1e-5 * mag,
                      "m %zu n %zu k %zu ta %d tb %d bias %d acc %d: c[%zu][%zu] %.9g, want "
                      "%.9g",
                      m, n, k, t->ta, t->tb, t->bias, t->acc, i, j, got, s);
        }
}

static void s_skip_without_bf16(void) {
    if (!tp_gemm_bf16_ok())
        cr_skip_test("this CPU has no AVX512_BF16");
}

Test(cpu_gemm_bf16, sums_the_rounded_operands_on_odd_shapes) {
    s_skip_without_bf16();
    const size_t ms[] = {1, 7, 9, 17, 70}, ns[] = {5, 31, 33, 64, 300}, ks[] = {0, 1, 3, 33, 70};
    for (size_t mi = 0; mi < 5; mi++)
        for (size_t ni = 0; ni < 5; ni++)
            for (size_t ki = 0; ki < 5; ki++)
                for (int v = 0; v < 16; v++) {
                    s_case_t t;
                    s_init(&t, ms[mi], ns[ni], ks[ki], v & 1, (v >> 1) & 1, (v >> 2) & 1,
                           (v >> 3) & 1);
                    s_run(&t);
                    s_check(&t);
                    s_free(&t);
                }
}

/* The GPT's products (width 256, 4 heads, context 256) at 72 rows: the
 * dense layers' forward (a plain), dW (a transposed) and dX (b
 * transposed), attention's scores (k 64) and its values (k 256). */
Test(cpu_gemm_bf16, sums_the_rounded_operands_on_the_gpts_shapes) {
    s_skip_without_bf16();
    const struct { size_t n, k; int ta, tb, bias, acc; } g[] = {
        {768, 256, 0, 0, 1, 0},  {1024, 256, 0, 0, 1, 0}, {256, 1024, 0, 0, 1, 1},
        {256, 256, 1, 0, 0, 1},  {1024, 256, 1, 0, 0, 0}, {256, 1024, 0, 1, 0, 1},
        {256, 768, 0, 1, 0, 0},  {256, 64, 0, 1, 0, 0},   {64, 256, 0, 0, 0, 0},
        {64, 256, 1, 0, 0, 1}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        s_case_t t;
        s_init(&t, 72, g[i].n, g[i].k, g[i].ta, g[i].tb, g[i].bias, g[i].acc);
        s_run(&t);
        s_check(&t);
        s_free(&t);
    }
}

/* Two threads split rows and column blocks, each element one kernel's:
 * the bits of one thread; and a and b stored transposed give the bits of
 * them stored plain. */
Test(cpu_gemm_bf16, the_bits_depend_on_neither_threads_nor_storage) {
    s_skip_without_bf16();
    const size_t m = 203, n = 600, k = 77;
    s_case_t ref;
    s_init(&ref, m, n, k, 0, 0, 1, 1);
    s_run(&ref);
    for (int v = 0; v < 8; v++) {
        const int threads = v & 4 ? 2 : 1;
        tp_cpu_threads_set(threads);
        tp_cpu_team(threads);
        s_case_t t;
        s_init(&t, m, n, k, v & 1, (v >> 1) & 1, 1, 1);
        s_run(&t);
        tp_cpu_threads_set(1);
        tp_cpu_team(1);
        cr_expect_eq(memcmp(ref.c, t.c, m * n * sizeof(float)), 0,
                     "ta %d tb %d threads %d: not one thread's plain bits", v & 1, (v >> 1) & 1,
                     threads);
        s_free(&t);
    }
    s_free(&ref);
}

/* The dense layer's call with bf16 on (x [72, 1024] @ W [1024, 256] +
 * bias, both gradients): by default on ours, y, dW (x^T dy) and dX (dy
 * W^T) tp_gemm_bf16's bits; with TP_CPU_GEMM=dnnl on oneDNN's bf16
 * matmul, whose y at k 1,024 sums in another order (other bits, within
 * 1e-5). */
Test(cpu_gemm_bf16, the_dense_layers_bf16_products_run_on_it) {
    s_skip_without_bf16();
    if (!tp_backend_cpu_bf16(1))
        cr_skip_test("oneDNN reads no bf16 dot products on this CPU");
    const int64_t r = 72, k = 1024, m = 256;
    tp_backend_t *b = oct_backend();
    oct_call_t t[2];
    for (int p = 0; p < 2; p++) {
        if (p)
            setenv("TP_CPU_GEMM", "dnnl", 1);
        const tp_shape_t in[2] = {{2, {r, k}}, {2, {k, m}}};
        oct_call_init(&t[p], TP_OP_MATMUL, "fc/matmul", 2, in, (tp_shape_t){2, {r, m}}, 0,
                      -1.0f, 1.0f);
        t[p].b = malloc((size_t)m * sizeof(float));
        cr_assert_not_null(t[p].b);
        oct_fill(t[p].b, (size_t)m, 5u, -0.5f, 0.5f);
        t[p].c.bias = t[p].b;
        oct_plan(b, &t[p].c, &t[p].ws);
        oct_run(b, &t[p].c);
    }
    unsetenv("TP_CPU_GEMM");
    cr_assert(tp_cpu_bf16_on());
    /* ours called directly on the same operands */
    const size_t ny = (size_t)(r * m), nw = (size_t)(k * m), nx = (size_t)(r * k);
    float *y = malloc(ny * sizeof(float)), *dw = malloc(nw * sizeof(float)),
          *dx = malloc(nx * sizeof(float));
    /* one room, enough for any of the three (y's, dW's, dX's) */
    void *room = malloc(tp_gemm_bf16_room_bytes((size_t)k, (size_t)m, (size_t)r) +
                        tp_gemm_bf16_room_bytes((size_t)r, (size_t)k, (size_t)m) +
                        tp_gemm_bf16_room_bytes((size_t)r, (size_t)m, (size_t)k));
    cr_assert(y && dw && dx && room);
    const tp_gemm_bf16_t gy = {(size_t)r, (size_t)m, (size_t)k, t[0].x[0], (size_t)k, 0,
                               t[0].x[1], (size_t)m, 0, y, (size_t)m, t[0].b, 0, room};
    const tp_gemm_bf16_t gw = {(size_t)k, (size_t)m, (size_t)r, t[0].x[0], (size_t)k, 1,
                               t[0].dy, (size_t)m, 0, dw, (size_t)m, NULL, 0, room};
    const tp_gemm_bf16_t gx = {(size_t)r, (size_t)k, (size_t)m, t[0].dy, (size_t)m, 0,
                               t[0].x[1], (size_t)m, 1, dx, (size_t)k, NULL, 0, room};
    tp_gemm_bf16(&gy);
    tp_gemm_bf16(&gw);
    tp_gemm_bf16(&gx);
    cr_expect_eq(memcmp(t[0].y, y, ny * sizeof(float)), 0, "y: not ours");
    cr_expect_eq(memcmp(t[0].dx[1], dw, nw * sizeof(float)), 0, "dW: not ours");
    cr_expect_eq(memcmp(t[0].dx[0], dx, nx * sizeof(float)), 0, "dX: not ours");
    cr_expect_neq(memcmp(t[1].y, y, ny * sizeof(float)), 0,
                  "y: TP_CPU_GEMM=dnnl gave ours' bits (not oneDNN's route?)");
    oct_close(t[1].y, y, ny, 1e-5f, "y, oneDNN against ours");
    oct_close(t[1].dx[1], dw, nw, 1e-5f, "dW, oneDNN against ours");
    oct_close(t[1].dx[0], dx, nx, 1e-5f, "dX, oneDNN against ours");
    free(y);
    free(dw);
    free(dx);
    free(room);
    oct_call_free(&t[0]);
    oct_call_free(&t[1]);
    cr_assert_eq(tp_backend_cpu_bf16(0), 0);
    tp_backend_destroy(&b);
}
