/* towerpack tests: the fused attention's bf16 tile products (gpu/cpu/
 * attention_bf16.c, through ops_attention.c with tp_backend_cpu_bf16 on).
 * The kernel's y, dq, dk and dv against a double reference whose products
 * take q, k, v and dO rounded to bf16 as the kernel rounds them, within
 * the bound the kernel's other roundings allow (P and dS rounded to bf16
 * before their products: 2^-7 of each term's size, twice the most one
 * rounding can do, and what O's rounding does to rowsum(dO O)), at odd T and D, causal and not, with the scores
 * stashed and recomputed; the bf16 kernel really differs from the fp32
 * one; and a workspace planned with bf16 off keeps the fp32 bits when bf16
 * is turned on after. Skipped where the CPU has no AVX512_BF16. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "gpu/cpu/attention_bf16.h"
#include "gpu/cpu/ops_attention.h"
#include "gpu/cpu/ops_cpu.h"

TestSuite(attention_bf16, .timeout = 120);

static float s_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static double s_bf(float x) { return tp_bf16_to_f32(tp_f32_to_bf16(x)); }

static void s_need_bf16(void) {
    if (!tp_backend_cpu_bf16(1) || !tp_attn_bf16_usable())
        cr_skip_test("this CPU has no AVX512_BF16");
}

typedef struct {
    int64_t tq, tk, d;
    int causal;
    float *q, *k, *v, *dy; /* [2 heads, T, d] */
    float *y, *dq, *dk, *dv;
} run_t;

static float *s_buf(size_t n) {
    float *p = malloc(n * sizeof(float));
    cr_assert_not_null(p);
    return p;
}

static void s_run_init(run_t *r, int64_t tq, int64_t tk, int64_t d, int causal) {
    *r = (run_t){.tq = tq, .tk = tk, .d = d, .causal = causal};
    const size_t nq = (size_t)(2 * tq * d), nk = (size_t)(2 * tk * d);
    r->q = s_buf(nq), r->dy = s_buf(nq), r->y = s_buf(nq), r->dq = s_buf(nq);
    r->k = s_buf(nk), r->v = s_buf(nk), r->dk = s_buf(nk), r->dv = s_buf(nk);
    uint64_t seed = 11 + (uint64_t)(tq * 7 + d);
    for (size_t j = 0; j < nq; j++) {
        r->q[j] = 2.0f * s_rand(&seed);
        r->dy[j] = s_rand(&seed);
    }
    for (size_t j = 0; j < nk; j++) {
        r->k[j] = 2.0f * s_rand(&seed);
        r->v[j] = s_rand(&seed);
    }
}

static void s_run_free(run_t *r) {
    free(r->q), free(r->k), free(r->v), free(r->dy);
    free(r->y), free(r->dq), free(r->dk), free(r->dv);
}

/* Forward and backward of the kernel as planned now (bf16 as switched
 * when the workspace is sized: plan_bf16), run with bf16 run_bf16. */
static void s_kernel(run_t *r, int plan_bf16, int run_bf16) {
    tp_shape_t xs[3];
    xs[0] = (tp_shape_t){.ndim = 4, .d = {1, 2, r->tq, r->d}};
    xs[1] = xs[2] = (tp_shape_t){.ndim = 4, .d = {1, 2, r->tk, r->d}};
    const size_t nq = (size_t)(2 * r->tq * r->d), nk = (size_t)(2 * r->tk * r->d);
    for (size_t j = 0; j < nq; j++) /* stored, not added to */
        r->y[j] = r->dq[j] = NAN;
    for (size_t j = 0; j < nk; j++)
        r->dk[j] = r->dv[j] = NAN;
    tp_op_attr_t at = {.alpha = 0.3f, .beta = r->causal ? 1.0f : 0.0f};
    const void *xin[3] = {r->q, r->k, r->v};
    float *dx[3] = {r->dq, r->dk, r->dv};
    const int acc[3] = {0, 0, 0};
    tp_op_call_t c = {.kind = TP_OP_ATTENTION, .attr = &at, .name = "att", .ninputs = 3,
                      .x = xin, .xshape = xs, .y = r->y, .yshape = xs[0], .dx = dx,
                      .dx_acc = acc, .dy = r->dy};
    tp_backend_cpu_bf16(plan_bf16);
    c.workspace_bytes = tp_cpu_op_workspace(NULL, &c);
    c.workspace = malloc(c.workspace_bytes);
    cr_assert_not_null(c.workspace);
    tp_backend_cpu_bf16(run_bf16);
    cr_assert_eq(tp_cpu_op_forward(NULL, &c), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_cpu_op_backward(NULL, &c), TP_OK, "%s", tp_last_error());
    free(c.workspace);
}

/* Counts a value past its bound; says where for the first few. */
static void s_within(const char *what, float got, double want, double bound, int *bad,
                     const run_t *r, double *worst) {
    const double err = fabs(got - want), ratio = err / bound;
    *worst = ratio > *worst ? ratio : *worst;
    if (err <= bound)
        return;
    if (++*bad <= 4)
        cr_log_error("%s: %.7g, reference %.7g, bound %.3g (Tq %ld Tk %ld D %ld causal %d)",
                     what, (double)got, want, bound, (long)r->tq, (long)r->tk, (long)r->d,
                     r->causal);
}

/* The reference of one run, head by head, in double on the rounded
 * operands, and each output against it. A term w x whose weight w (P or
 * dS) the kernel rounds to bf16 before its product may be off by 2^-8 of
 * |w x| (half the spacing of 8 significant bits; the bound takes twice
 * that); rowsum(dO O) takes the kernel's O and the unrounded dO, off by
 * sum |dO| bound(y), which dS = P (dP - rowsum) scale carries into dq and
 * dk; 1e-6 absolute for fp32's sums. Returns the largest error as a
 * fraction of its bound. */
static double s_check(const run_t *r) {
    const int64_t tq = r->tq, tk = r->tk, d = r->d;
    const double scale = 0.3, eps = 1.0 / 128, tiny = 1e-6;
    double *p = calloc((size_t)(tq * tk), sizeof(double));
    double *ds = calloc((size_t)(tq * tk), sizeof(double));
    double *yb = calloc((size_t)d, sizeof(double)), *drow = calloc((size_t)tq, sizeof(double));
    cr_assert(p && ds && yb && drow);
    int bad = 0;
    double worst = 0;
    for (int64_t h = 0; h < 2; h++) {
        const float *q = r->q + h * tq * d, *k = r->k + h * tk * d, *v = r->v + h * tk * d;
        const float *dy = r->dy + h * tq * d;
        const size_t oq = (size_t)(h * tq * d), ok = (size_t)(h * tk * d);
        for (int64_t i = 0; i < tq; i++) {
            const int64_t lim = r->causal ? i + 1 : tk;
            double mx = -INFINITY, sum = 0, rowdot = 0;
            for (int64_t j = 0; j < tk; j++) {
                double sc = 0;
                for (int64_t e = 0; e < d && j < lim; e++)
                    sc += s_bf(q[i * d + e]) * s_bf(k[j * d + e]);
                p[i * tk + j] = j < lim ? sc * scale : -INFINITY;
                mx = p[i * tk + j] > mx ? p[i * tk + j] : mx;
            }
            for (int64_t j = 0; j < tk; j++)
                sum += p[i * tk + j] = j < lim ? exp(p[i * tk + j] - mx) : 0.0;
            for (int64_t e = 0; e < d; e++) {
                double yv = 0, ya = 0;
                for (int64_t j = 0; j < tk; j++) {
                    const double w = p[i * tk + j] / sum;
                    yv += w * s_bf(v[j * d + e]);
                    ya += w * fabs(v[j * d + e]);
                }
                yb[e] = eps * ya + tiny;
                s_within("y", r->y[oq + i * d + e], yv, yb[e], &bad, r, &worst);
                rowdot += (double)dy[i * d + e] * yv;
                drow[i] += fabs(dy[i * d + e]) * yb[e];
            }
            for (int64_t j = 0; j < tk; j++) {
                p[i * tk + j] /= sum;
                double g = 0;
                for (int64_t e = 0; e < d; e++)
                    g += s_bf(dy[i * d + e]) * s_bf(v[j * d + e]);
                ds[i * tk + j] = p[i * tk + j] * (g - rowdot) * scale;
            }
        }
        for (int64_t i = 0; i < tq; i++)
            for (int64_t e = 0; e < d; e++) {
                double gq = 0, ga = 0;
                for (int64_t j = 0; j < tk; j++) {
                    gq += ds[i * tk + j] * s_bf(k[j * d + e]);
                    ga += (eps * fabs(ds[i * tk + j]) + p[i * tk + j] * drow[i] * scale) *
                          fabs(k[j * d + e]);
                }
                s_within("dq", r->dq[oq + i * d + e], gq, ga + tiny, &bad, r, &worst);
            }
        for (int64_t j = 0; j < tk; j++)
            for (int64_t e = 0; e < d; e++) {
                double gk = 0, gv = 0, ka = 0, va = 0;
                for (int64_t i = 0; i < tq; i++) {
                    gk += ds[i * tk + j] * s_bf(q[i * d + e]);
                    gv += p[i * tk + j] * s_bf(dy[i * d + e]);
                    ka += (eps * fabs(ds[i * tk + j]) + p[i * tk + j] * drow[i] * scale) *
                          fabs(q[i * d + e]);
                    va += eps * p[i * tk + j] * fabs(dy[i * d + e]);
                }
                s_within("dk", r->dk[ok + j * d + e], gk, ka + tiny, &bad, r, &worst);
                s_within("dv", r->dv[ok + j * d + e], gv, va + tiny, &bad, r, &worst);
            }
        memset(drow, 0, (size_t)tq * sizeof(double));
    }
    cr_expect_eq(bad, 0, "%d values past their bound (Tq %ld Tk %ld D %ld causal %d)", bad,
                 (long)tq, (long)tk, (long)d, r->causal);
    free(p), free(ds), free(yb), free(drow);
    return worst;
}

static const int64_t s_cases[][4] = {
    {75, 75, 20, 1},   /* 2 key tiles, T odd */
    {136, 136, 64, 1}, /* the GPT's D, 3 tiles */
    {131, 131, 13, 1}, /* D odd: a zero after each row's last pair */
    {9, 83, 12, 0},    /* keys of their own: 2 key tiles, 1 query tile */
    {70, 70, 7, 0},    /* D odd, full */
};

Test(attention_bf16, kernel_within_the_bound_of_a_reference_on_rounded_operands) {
    s_need_bf16();
    const size_t limit = tp_cpu_attention_stash_limit_;
    double worst = 0;
    for (int stash = 1; stash >= 0; stash--) { /* scores stashed, then recomputed */
        tp_cpu_attention_stash_limit_ = stash ? limit : 0;
        for (size_t i = 0; i < sizeof s_cases / sizeof s_cases[0]; i++) {
            run_t r;
            s_run_init(&r, s_cases[i][0], s_cases[i][1], s_cases[i][2], (int)s_cases[i][3]);
            s_kernel(&r, 1, 1);
            const double w = s_check(&r);
            worst = w > worst ? w : worst;
            s_run_free(&r);
        }
    }
    tp_cpu_attention_stash_limit_ = limit;
    cr_log_info("the largest error, as a fraction of its bound: %.3f", worst);
}

/* bf16 is really there: against the fp32 kernel most values differ by
 * more than fp32's rounding (its test's 1e-5 + 1e-4 |x|). */
Test(attention_bf16, kernel_differs_from_fp32_past_its_rounding) {
    s_need_bf16();
    run_t a, b;
    s_run_init(&a, 136, 136, 64, 1);
    s_run_init(&b, 136, 136, 64, 1);
    s_kernel(&a, 0, 0);
    s_kernel(&b, 1, 1);
    const float *fa[4] = {a.y, a.dq, a.dk, a.dv}, *fb[4] = {b.y, b.dq, b.dk, b.dv};
    const size_t n = (size_t)(2 * 136 * 64);
    for (int o = 0; o < 4; o++) {
        size_t far = 0;
        for (size_t j = 0; j < n; j++)
            far += fabsf(fa[o][j] - fb[o][j]) > 1e-5f + 1e-4f * fabsf(fa[o][j]);
        cr_expect_gt(far, n / 2, "%s: %zu of %zu values past fp32's rounding",
                     (const char *[]){"y", "dq", "dk", "dv"}[o], far, n);
    }
    s_run_free(&a);
    s_run_free(&b);
}

/* Turned on after the workspace was planned without it: fp32 (the
 * workspace has no room for the pairs), the fp32 bits, no error. */
Test(attention_bf16, bf16_after_the_plan_keeps_the_fp32_bits) {
    s_need_bf16();
    run_t a, b;
    s_run_init(&a, 75, 75, 20, 1);
    s_run_init(&b, 75, 75, 20, 1);
    s_kernel(&a, 0, 0);
    s_kernel(&b, 0, 1);
    const size_t n = (size_t)(2 * 75 * 20);
    cr_expect_eq(memcmp(a.y, b.y, n * sizeof(float)), 0, "y");
    cr_expect_eq(memcmp(a.dq, b.dq, n * sizeof(float)), 0, "dq");
    cr_expect_eq(memcmp(a.dk, b.dk, n * sizeof(float)), 0, "dk");
    cr_expect_eq(memcmp(a.dv, b.dv, n * sizeof(float)), 0, "dv");
    s_run_free(&a);
    s_run_free(&b);
}
