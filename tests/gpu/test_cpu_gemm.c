/* towerpack tests: the GEMM of our own (gpu/cpu/cpu_gemm.c) against a
 * plain double-precision reference on odd shapes (m, n, k not multiples of
 * 8 or 32, k 0 and 1), a plain and transposed, b plain, transposed and
 * packed ahead, with a bias and added to c (acc); the same bits on one
 * thread and two (the team splits rows and columns, never k); and, through
 * the backend's matmul entries (dnnl_matmul.c routes the GPT's products to
 * it), oneDNN's bits on the GPT's fc shapes at k <= 512 (the order one pass
 * over k keeps, which the training's losses rely on). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/cpu/cpu_gemm.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/op_call_testutil.h"

TestSuite(cpu_gemm, .timeout = 120);

typedef struct {
    size_t m, n, k;
    int ta, tb, packed, bias, acc;
    float *a, *b, *bp, *bv, *c, *room;
} s_case_t;

static void s_init(s_case_t *t, size_t m, size_t n, size_t k, int ta, int tb, int packed,
                   int bias, int acc) {
    *t = (s_case_t){.m = m, .n = n, .k = k, .ta = ta, .tb = tb, .packed = packed,
                    .bias = bias, .acc = acc};
    t->a = malloc((m * k + 1) * sizeof(float));
    t->b = malloc((k * n + 1) * sizeof(float));
    t->bv = malloc(n * sizeof(float));
    t->c = malloc(m * n * sizeof(float));
    t->bp = aligned_alloc(64, tp_gemm_pack_bytes(k, n) + 64);
    t->room = aligned_alloc(64, tp_gemm_pack_bytes(k, n) + 64);
    cr_assert(t->a && t->b && t->bv && t->c && t->bp && t->room);
    oct_fill(t->a, m * k, 3u, -1.0f, 1.0f);
    oct_fill(t->b, k * n, 4u, -1.0f, 1.0f);
    oct_fill(t->bv, n, 5u, -1.0f, 1.0f);
    oct_fill(t->c, m * n, 6u, -1.0f, 1.0f);
    if (packed)
        tp_gemm_pack(t->b, tb ? k : n, tb, k, n, t->bp);
}

static void s_run(s_case_t *t) {
    const tp_gemm_t g = {t->m, t->n, t->k, t->a, t->ta ? t->m : t->k, t->ta,
                         t->packed ? t->bp : t->b, t->tb ? t->k : t->n, t->tb, t->packed,
                         t->c, t->n, t->bias ? t->bv : NULL, t->acc, t->room};
    tp_gemm(&g);
}

static void s_free(s_case_t *t) {
    free(t->a);
    free(t->b);
    free(t->bv);
    free(t->c);
    free(t->bp);
    free(t->room);
}

Test(cpu_gemm, matches_a_plain_reference_on_odd_shapes) {
    const size_t ms[] = {1, 7, 9, 17, 70}, ns[] = {5, 31, 33, 64, 300}, ks[] = {0, 1, 3, 33, 70};
    for (size_t mi = 0; mi < 5; mi++)
        for (size_t ni = 0; ni < 5; ni++)
            for (size_t ki = 0; ki < 5; ki++)
                for (int v = 0; v < 32; v++) {
                    const size_t m = ms[mi], n = ns[ni], k = ks[ki];
                    s_case_t t;
                    s_init(&t, m, n, k, v & 1, (v >> 1) & 1, (v >> 2) & 1, (v >> 3) & 1,
                           (v >> 4) & 1);
                    float *c0 = malloc(m * n * sizeof(float));
                    cr_assert_not_null(c0);
                    memcpy(c0, t.c, m * n * sizeof(float));
                    s_run(&t);
                    for (size_t i = 0; i < m; i++)
                        for (size_t j = 0; j < n; j++) {
                            double s = 0, mag = 0;
                            for (size_t l = 0; l < k; l++) {
                                const double x = t.ta ? t.a[l * m + i] : t.a[i * k + l];
                                const double y = t.tb ? t.b[j * k + l] : t.b[l * n + j];
                                s += x * y;
                                mag += fabs(x * y);
                            }
                            if (t.bias)
                                s += t.bv[j];
                            if (t.acc)
                                s += c0[i * n + j];
                            const double got = t.c[i * n + j];
                            cr_assert(fabs(got - s) <= 1e-6 * (mag + 2.0),
                                      "m %zu n %zu k %zu ta %d tb %d packed %d bias %d acc %d: "
                                      "c[%zu][%zu] %g, want %g",
                                      m, n, k, t.ta, t.tb, t.packed, t.bias, t.acc, i, j, got,
                                      s);
                        }
                    free(c0);
                    s_free(&t);
                }
}

/* Two threads split rows and columns, each element one kernel's: the bits
 * of one thread, with b packed inside the call and ahead. */
Test(cpu_gemm, two_threads_give_the_bits_of_one) {
    for (int v = 0; v < 8; v++) {
        s_case_t t[2];
        for (int p = 0; p < 2; p++) {
            tp_cpu_threads_set(p ? 2 : 1);
            tp_cpu_team(p ? 2 : 1);
            s_init(&t[p], 203, 600, 77, v & 1, (v >> 1) & 1, (v >> 2) & 1, 1, 1);
            s_run(&t[p]);
        }
        tp_cpu_threads_set(1);
        tp_cpu_team(1);
        cr_expect_eq(memcmp(t[0].c, t[1].c, 203 * 600 * sizeof(float)), 0, "variant %d", v);
        s_free(&t[0]);
        s_free(&t[1]);
    }
}

/* The dense layer's call (x [r, k] @ W [k, m] + bias, both gradients)
 * with TP_CPU_GEMM=dnnl (oneDNN) and =own (ours): the same bits at k <=
 * 512 (the GPT's fc forward and its dW at 512 rows), oneDNN's order. */
Test(cpu_gemm, the_gpt_fc_products_give_onednns_bits) {
    const struct { int64_t r, k, m; } g[] = {{512, 256, 1024}, {512, 256, 768}, {64, 256, 256}};
    tp_backend_t *b = oct_backend();
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        oct_call_t t[2];
        for (int p = 0; p < 2; p++) {
            setenv("TP_CPU_GEMM", p ? "own" : "dnnl", 1);
            const tp_shape_t in[2] = {{2, {g[i].r, g[i].k}}, {2, {g[i].k, g[i].m}}};
            oct_call_init(&t[p], TP_OP_MATMUL, "fc/matmul", 2, in,
                          (tp_shape_t){2, {g[i].r, g[i].m}}, 0, -1.0f, 1.0f);
            t[p].b = malloc((size_t)g[i].m * sizeof(float));
            cr_assert_not_null(t[p].b);
            oct_fill(t[p].b, (size_t)g[i].m, 5u, -0.5f, 0.5f);
            t[p].c.bias = t[p].b;
            oct_plan(b, &t[p].c, &t[p].ws);
            oct_run(b, &t[p].c);
        }
        unsetenv("TP_CPU_GEMM");
        const size_t ny = (size_t)(g[i].r * g[i].m), nw = (size_t)(g[i].k * g[i].m);
        cr_expect_eq(memcmp(t[0].y, t[1].y, ny * sizeof(float)), 0, "y, shape %zu", i);
        cr_expect_eq(memcmp(t[0].dx[1], t[1].dx[1], nw * sizeof(float)), 0, "dW, shape %zu",
                     i);
            /* dX (k = m, b transposed) sums in oneDNN's blocks at m 1,024:
         * within test_dnnl_matmul.c's bound */
        oct_close(t[1].dx[0], t[0].dx[0], (size_t)(g[i].r * g[i].k), 1e-4f, "dX");
        oct_call_free(&t[0]);
        oct_call_free(&t[1]);
    }
    tp_backend_destroy(&b);
}
