/* towerpack gpu: the ResNet block end in one call on the CPU backend:
 * y = relu(bn(x) + skip) (the relu optional), forward and backward, on
 * NCHW or nChw16c (every operand in the call's one layout). Planned by
 * gpu/graph/fold.c's tp_plan_block_end_, which folds the add after a
 * batch norm (and the relu after the add) into the batch norm's call.
 *
 * Forward, per channel group (one channel on NCHW, sixteen on nChw16c):
 * one pass for the batch's mean and variance (training) and one that
 * reads x and the skip and writes y. Backward: one pass that masks dy by
 * y > 0, stores (or adds) the skip's gradient and sums dbeta and dgamma,
 * one that writes dx. Unfused the same work was batch norm's two passes
 * each way plus the add's pass forward, and the relu's mask and the add's
 * copy backward.
 *
 * The workspace is [mean C][1/std C] (kept from the forward for the
 * backward). A channel group is one item of the parallel range, its sums
 * made by one thread in one order: the numbers do not depend on the
 * thread count. They differ from oneDNN's (and ops_norm.c's) batch norm
 * by float reassociation only: the variance from shifted sums in double,
 * y as x * scale + shift.
 *
 * Streaming stores: on nChw16c with AVX-512 the forward's y and the
 * backward's dx (stored, not added) go out with non-temporal stores when
 * the tensor is TP_CPU_BLOCK_END_STREAM_MIN or more. A plain store of a
 * line not in cache reads it first (the read for ownership): for the zoo
 * ResNet's 12.8 MB tensors one stream more than the pass needs, the
 * forward's four becoming five, the backward's seven eight. Streamed, the
 * block ends took about 4-5 of their ~23-25 CPU ms a step less
 * (docs/performance.md, zoo6, issue 49). TP_CPU_BLOCK_END_STREAM=0 keeps
 * the plain stores (the same bits). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"
#include "gpu/cpu/cpu_block_end.h"
#include "gpu/cpu/cpu_math.h"
#include "gpu/cpu/cpu_pool.h"

typedef struct {
    const tp_op_call_t *c;
    int64_t n, ch, sp; /* x as [N, C, SP] (NCHW) or [N, C/16, SP, 16] */
    int blk;           /* nChw16c */
    int relu, training;
    int stream; /* the output (y forward, dx backward) streamed */
    float *mean, *inv; /* [C] each, the workspace's */
} s_args_t;

static void s_args(const tp_op_call_t *c, s_args_t *a) {
    const tp_shape_t *x = &c->xshape[0];
    a->c = c;
    a->n = x->d[0];
    a->ch = x->d[1];
    a->sp = 1;
    for (int i = 2; i < x->ndim; i++)
        a->sp *= x->d[i];
    a->blk = (c->blk16 & TP_BLK16_Y) != 0;
    a->relu = c->attr->act == TP_ACT_RELU;
    a->training = c->attr->training != 0;
    a->mean = c->workspace;
    a->inv = a->mean + a->ch;
    a->stream = 0;
}

/* ---- forward ------------------------------------------------------------- */

/* Group g's W channels (W 16 on nChw16c, 1 on NCHW): element (n, s, l) at
 * n C SP + g SP W + s W + l, channel g W + l. */
static inline __attribute__((always_inline)) void s_fwd_group(const s_args_t *a, int64_t g,
                                                              const int W) {
    const tp_op_call_t *c = a->c;
    const tp_op_attr_t *at = c->attr;
    const float *x = c->x[0], *gamma = c->x[1], *beta = c->x[2], *sk = c->skip;
    float *y = c->y;
    const int64_t cs = a->ch * a->sp, run = a->sp * W, c0 = g * W;
    float scale[16], shift[16];
    if (a->training) {
        /* sums of x - K (K: the group's first element per channel), which
         * keeps the variance's cancellation small; per image in float,
         * across images in double */
        float k[16];
        double s1[16] = {0}, s2[16] = {0};
        for (int l = 0; l < W; l++)
            k[l] = x[g * run + l];
        for (int64_t n = 0; n < a->n; n++) {
            const float *xp = x + n * cs + g * run;
            float p1[16] = {0}, p2[16] = {0};
            for (int64_t s = 0; s < a->sp; s++)
                for (int l = 0; l < W; l++) {
                    const float d = xp[s * W + l] - k[l];
                    p1[l] += d;
                    p2[l] += d * d;
                }
            for (int l = 0; l < W; l++) {
                s1[l] += p1[l];
                s2[l] += p2[l];
            }
        }
        const double m = (double)(a->n * a->sp);
        float *mm = c->state[0], *mv = c->state[1];
        for (int l = 0; l < W; l++) {
            const double d = s1[l] / m, var = fmax(s2[l] / m - d * d, 0.0);
            const float mean = (float)(k[l] + d), v = (float)var;
            a->mean[c0 + l] = mean;
            a->inv[c0 + l] = (float)(1.0 / sqrt((double)v + at->eps));
            if (at->update_state) { /* as dnnl_bnorm.c: the unbiased variance */
                const double unbiased = m > 1 ? v * m / (m - 1) : v;
                mm[c0 + l] = at->alpha * mm[c0 + l] + (1.0f - at->alpha) * mean;
                mv[c0 + l] = at->alpha * mv[c0 + l] + (1.0f - at->alpha) * (float)unbiased;
            }
        }
    } else { /* the moving averages, as dnnl_bnorm.c's inference */
        for (int l = 0; l < W; l++) {
            a->mean[c0 + l] = c->state[0][c0 + l];
            a->inv[c0 + l] = 1.0f / sqrtf(c->state[1][c0 + l] + at->eps);
        }
    }
    for (int l = 0; l < W; l++) {
        scale[l] = gamma[c0 + l] * a->inv[c0 + l];
        shift[l] = beta[c0 + l] - a->mean[c0 + l] * scale[l];
    }
    for (int64_t n = 0; n < a->n; n++) {
        const size_t o = (size_t)(n * cs + g * run);
        const float *restrict xp = x + o, *restrict sp = sk + o;
        float *restrict yp = y + o;
        for (int64_t s = 0; s < a->sp; s++)
            for (int l = 0; l < W; l++) {
                const float v = xp[s * W + l] * scale[l] + shift[l] + sp[s * W + l];
                yp[s * W + l] = a->relu ? (v > 0.0f ? v : 0.0f) : v;
            }
    }
}

TP_CPU_CLONES static void s_fwd16(void *arg, size_t lo, size_t hi) {
    for (size_t g = lo; g < hi; g++)
        s_fwd_group(arg, (int64_t)g, 16);
}

TP_CPU_CLONES static void s_fwd1(void *arg, size_t lo, size_t hi) {
    for (size_t g = lo; g < hi; g++)
        s_fwd_group(arg, (int64_t)g, 1);
}

/* ---- backward ------------------------------------------------------------ */

static inline __attribute__((always_inline)) void s_bwd_group(const s_args_t *a, int64_t g,
                                                              const int W) {
    const tp_op_call_t *c = a->c;
    const float *x = c->x[0], *gamma = c->x[1], *y = c->y, *dy = c->dy;
    float *dsk = c->dskip, *dx = c->dx[0];
    const int acc = c->dskip_acc, relu = a->relu;
    const int64_t cs = a->ch * a->sp, run = a->sp * W, c0 = g * W;
    float mean[16];
    double sg[16] = {0}, sgx[16] = {0};
    for (int l = 0; l < W; l++)
        mean[l] = a->mean[c0 + l];
    /* g = dy masked by y > 0: the skip's gradient, and the sums of g and
     * g (x - mean) */
    for (int64_t n = 0; n < a->n; n++) {
        const size_t o = (size_t)(n * cs + g * run);
        const float *restrict xp = x + o, *restrict yp = y + o, *restrict dp = dy + o;
        float *restrict kp = dsk ? dsk + o : NULL;
        float p1[16] = {0}, p2[16] = {0};
        for (int64_t s = 0; s < a->sp; s++)
            for (int l = 0; l < W; l++) {
                const int64_t i = s * W + l;
                const float gv = relu ? (yp[i] > 0.0f ? dp[i] : 0.0f) : dp[i];
                if (kp)
                    kp[i] = acc ? kp[i] + gv : gv;
                p1[l] += gv;
                p2[l] += gv * (xp[i] - mean[l]);
            }
        for (int l = 0; l < W; l++) {
            sg[l] += p1[l];
            sgx[l] += p2[l];
        }
    }
    const double m = (double)(a->n * a->sp);
    float k1[16], kx[16], k0[16];
    for (int l = 0; l < W; l++) {
        const float inv = a->inv[c0 + l];
        const float dbeta = (float)sg[l], dgamma = (float)sgx[l] * inv;
        if (c->dx[1])
            c->dx[1][c0 + l] = (c->dx_acc[1] ? c->dx[1][c0 + l] : 0.0f) + dgamma;
        if (c->dx[2])
            c->dx[2][c0 + l] = (c->dx_acc[2] ? c->dx[2][c0 + l] : 0.0f) + dbeta;
        /* dx = gamma inv (g - dbeta / M - (x - mean) inv dgamma / M) */
        k1[l] = gamma[c0 + l] * inv;
        kx[l] = (float)(-(double)k1[l] * inv * dgamma / m);
        k0[l] = (float)(-(double)k1[l] * dbeta / m - (double)kx[l] * mean[l]);
    }
    if (!dx)
        return;
    const int acc_x = c->dx_acc[0];
    /* g again: the skip's gradient where it was stored, else from dy */
    const int from_skip = dsk && !acc;
    for (int64_t n = 0; n < a->n; n++) {
        const size_t o = (size_t)(n * cs + g * run);
        const float *restrict xp = x + o, *restrict yp = y + o, *restrict dp = dy + o;
        const float *restrict kp = from_skip ? dsk + o : NULL;
        float *restrict op = dx + o;
        for (int64_t s = 0; s < a->sp; s++)
            for (int l = 0; l < W; l++) {
                const int64_t i = s * W + l;
                const float gv = kp ? kp[i] : relu ? (yp[i] > 0.0f ? dp[i] : 0.0f) : dp[i];
                const float v = k1[l] * gv + kx[l] * xp[i] + k0[l];
                op[i] = acc_x ? op[i] + v : v;
            }
    }
}

TP_CPU_CLONES static void s_bwd16(void *arg, size_t lo, size_t hi) {
    for (size_t g = lo; g < hi; g++)
        s_bwd_group(arg, (int64_t)g, 16);
}

TP_CPU_CLONES static void s_bwd1(void *arg, size_t lo, size_t hi) {
    for (size_t g = lo; g < hi; g++)
        s_bwd_group(arg, (int64_t)g, 1);
}

/* ---- nChw16c on AVX-512: one vector a channel group ---------------------
 * The same sums and expressions as the groups above, in vectors (the
 * generic loops, left to the compiler, ran 2-3x slower than the two
 * unfused calls). FMA where the C above has a multiply and an add. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define S_AVX512 __attribute__((target("avx512f")))

S_AVX512 static inline void s_acc_pd(__m512d *lo, __m512d *hi, __m512 v) {
    *lo = _mm512_add_pd(*lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    *hi = _mm512_add_pd(*hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(
                                 _mm512_castps_pd(v), 1))));
}

S_AVX512 static void s_fwd16_avx512(void *arg, size_t lo, size_t hi) {
    const s_args_t *a = arg;
    const tp_op_call_t *c = a->c;
    const tp_op_attr_t *at = c->attr;
    const float *x = c->x[0], *gamma = c->x[1], *beta = c->x[2], *sk = c->skip;
    float *y = c->y;
    const int64_t cs = a->ch * a->sp, run = a->sp * 16, N = a->n, SP = a->sp;
    const __m512 zero = _mm512_setzero_ps();
    for (size_t gi = lo; gi < hi; gi++) {
        const int64_t g = (int64_t)gi, c0 = g * 16;
        if (a->training) {
            const __m512 k = _mm512_loadu_ps(x + g * run);
            __m512d s1l = _mm512_setzero_pd(), s1h = s1l, s2l = s1l, s2h = s1l;
            for (int64_t n = 0; n < N; n++) {
                const float *xp = x + n * cs + g * run;
                __m512 p1 = zero, p2 = zero, q1 = zero, q2 = zero;
                int64_t s = 0;
                for (; s + 1 < SP; s += 2) {
                    const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(xp + s * 16), k);
                    const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(xp + s * 16 + 16), k);
                    p1 = _mm512_add_ps(p1, d0);
                    p2 = _mm512_fmadd_ps(d0, d0, p2);
                    q1 = _mm512_add_ps(q1, d1);
                    q2 = _mm512_fmadd_ps(d1, d1, q2);
                }
                if (s < SP) {
                    const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(xp + s * 16), k);
                    p1 = _mm512_add_ps(p1, d0);
                    p2 = _mm512_fmadd_ps(d0, d0, p2);
                }
                s_acc_pd(&s1l, &s1h, _mm512_add_ps(p1, q1));
                s_acc_pd(&s2l, &s2h, _mm512_add_ps(p2, q2));
            }
            double s1[16], s2[16];
            float kk[16];
            _mm512_storeu_pd(s1, s1l);
            _mm512_storeu_pd(s1 + 8, s1h);
            _mm512_storeu_pd(s2, s2l);
            _mm512_storeu_pd(s2 + 8, s2h);
            _mm512_storeu_ps(kk, k);
            const double m = (double)(N * SP);
            float *mm = c->state[0], *mv = c->state[1];
            for (int l = 0; l < 16; l++) {
                const double d = s1[l] / m, var = fmax(s2[l] / m - d * d, 0.0);
                const float mean = (float)(kk[l] + d), v = (float)var;
                a->mean[c0 + l] = mean;
                a->inv[c0 + l] = (float)(1.0 / sqrt((double)v + at->eps));
                if (at->update_state) {
                    const double unbiased = m > 1 ? v * m / (m - 1) : v;
                    mm[c0 + l] = at->alpha * mm[c0 + l] + (1.0f - at->alpha) * mean;
                    mv[c0 + l] = at->alpha * mv[c0 + l] + (1.0f - at->alpha) * (float)unbiased;
                }
            }
        } else {
            for (int l = 0; l < 16; l++) {
                a->mean[c0 + l] = c->state[0][c0 + l];
                a->inv[c0 + l] = 1.0f / sqrtf(c->state[1][c0 + l] + at->eps);
            }
        }
        float sc[16], sh[16];
        for (int l = 0; l < 16; l++) {
            sc[l] = gamma[c0 + l] * a->inv[c0 + l];
            sh[l] = beta[c0 + l] - a->mean[c0 + l] * sc[l];
        }
        const __m512 vs = _mm512_loadu_ps(sc), vh = _mm512_loadu_ps(sh);
        for (int64_t n = 0; n < N; n++) {
            const size_t o = (size_t)(n * cs + g * run);
            const float *xp = x + o, *kp = sk + o;
            float *yp = y + o;
            if (a->relu)
                for (int64_t s = 0; s < SP; s++) {
                    __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(xp + s * 16), vs, vh);
                    v = _mm512_max_ps(_mm512_add_ps(v, _mm512_loadu_ps(kp + s * 16)), zero);
                    if (a->stream)
                        _mm512_stream_ps(yp + s * 16, v);
                    else
                        _mm512_storeu_ps(yp + s * 16, v);
                }
            else
                for (int64_t s = 0; s < SP; s++) {
                    __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(xp + s * 16), vs, vh);
                    v = _mm512_add_ps(v, _mm512_loadu_ps(kp + s * 16));
                    if (a->stream)
                        _mm512_stream_ps(yp + s * 16, v);
                    else
                        _mm512_storeu_ps(yp + s * 16, v);
                }
        }
    }
    _mm_sfence(); /* the streamed stores seen before the pass's join */
}

S_AVX512 static void s_bwd16_avx512(void *arg, size_t lo, size_t hi) {
    const s_args_t *a = arg;
    const tp_op_call_t *c = a->c;
    const float *x = c->x[0], *gamma = c->x[1], *y = c->y, *dy = c->dy;
    float *dsk = c->dskip, *dx = c->dx[0];
    const int acc = c->dskip_acc, relu = a->relu, acc_x = c->dx_acc[0];
    const int64_t cs = a->ch * a->sp, run = a->sp * 16, N = a->n, SP = a->sp;
    const __m512 zero = _mm512_setzero_ps();
    for (size_t gi = lo; gi < hi; gi++) {
        const int64_t g = (int64_t)gi, c0 = g * 16;
        const __m512 vm = _mm512_loadu_ps(a->mean + c0);
        __m512d sgl = _mm512_setzero_pd(), sgh = sgl, sxl = sgl, sxh = sgl;
        for (int64_t n = 0; n < N; n++) {
            const size_t o = (size_t)(n * cs + g * run);
            const float *xp = x + o, *yp = y + o, *dp = dy + o;
            float *kp = dsk ? dsk + o : NULL;
            __m512 p1 = zero, p2 = zero;
            for (int64_t s = 0; s < SP; s++) {
                __m512 gv = _mm512_loadu_ps(dp + s * 16);
                if (relu)
                    gv = _mm512_maskz_mov_ps(
                        _mm512_cmp_ps_mask(_mm512_loadu_ps(yp + s * 16), zero, _CMP_GT_OQ), gv);
                if (kp)
                    _mm512_storeu_ps(kp + s * 16,
                                    acc ? _mm512_add_ps(_mm512_loadu_ps(kp + s * 16), gv) : gv);
                p1 = _mm512_add_ps(p1, gv);
                p2 = _mm512_fmadd_ps(gv, _mm512_sub_ps(_mm512_loadu_ps(xp + s * 16), vm), p2);
            }
            s_acc_pd(&sgl, &sgh, p1);
            s_acc_pd(&sxl, &sxh, p2);
        }
        double sg[16], sgx[16];
        _mm512_storeu_pd(sg, sgl);
        _mm512_storeu_pd(sg + 8, sgh);
        _mm512_storeu_pd(sgx, sxl);
        _mm512_storeu_pd(sgx + 8, sxh);
        const double m = (double)(N * SP);
        float k1[16], kx[16], k0[16];
        for (int l = 0; l < 16; l++) {
            const float inv = a->inv[c0 + l], mean = a->mean[c0 + l];
            const float dbeta = (float)sg[l], dgamma = (float)sgx[l] * inv;
            if (c->dx[1])
                c->dx[1][c0 + l] = (c->dx_acc[1] ? c->dx[1][c0 + l] : 0.0f) + dgamma;
            if (c->dx[2])
                c->dx[2][c0 + l] = (c->dx_acc[2] ? c->dx[2][c0 + l] : 0.0f) + dbeta;
            k1[l] = gamma[c0 + l] * inv;
            kx[l] = (float)(-(double)k1[l] * inv * dgamma / m);
            k0[l] = (float)(-(double)k1[l] * dbeta / m - (double)kx[l] * mean);
        }
        if (!dx)
            continue;
        const __m512 v1 = _mm512_loadu_ps(k1), vx = _mm512_loadu_ps(kx), v0 = _mm512_loadu_ps(k0);
        const int from_skip = dsk && !acc;
        for (int64_t n = 0; n < N; n++) {
            const size_t o = (size_t)(n * cs + g * run);
            const float *xp = x + o, *yp = y + o, *dp = dy + o, *kp = from_skip ? dsk + o : NULL;
            float *op = dx + o;
            for (int64_t s = 0; s < SP; s++) {
                __m512 gv;
                if (kp) {
                    gv = _mm512_loadu_ps(kp + s * 16);
                } else {
                    gv = _mm512_loadu_ps(dp + s * 16);
                    if (relu)
                        gv = _mm512_maskz_mov_ps(
                            _mm512_cmp_ps_mask(_mm512_loadu_ps(yp + s * 16), zero, _CMP_GT_OQ),
                            gv);
                }
                __m512 v = _mm512_fmadd_ps(v1, gv, _mm512_fmadd_ps(vx, _mm512_loadu_ps(xp + s * 16), v0));
                if (acc_x)
                    v = _mm512_add_ps(_mm512_loadu_ps(op + s * 16), v);
                if (a->stream)
                    _mm512_stream_ps(op + s * 16, v);
                else
                    _mm512_storeu_ps(op + s * 16, v);
            }
        }
    }
    _mm_sfence(); /* the streamed stores seen before the pass's join */
}

static int s_avx512(void) {
    static int have = -1;
    if (have < 0)
        have = __builtin_cpu_supports("avx512f") ? 1 : 0;
    return have;
}
#else
static int s_avx512(void) {
    return 0;
}
#define s_fwd16_avx512 s_fwd16
#define s_bwd16_avx512 s_bwd16
#endif

/* ---- entries ------------------------------------------------------------- */

int tp_cpu_block_end_streams(const tp_op_call_t *c, const float *out, int added) {
    const tp_shape_t *x = &c->xshape[0];
    const char *v = getenv("TP_CPU_BLOCK_END_STREAM");
    return out && !added && (c->blk16 & TP_BLK16_Y) && s_avx512() &&
           !((uintptr_t)out % 64) &&
           tp_shape_count(x) * sizeof(float) >= TP_CPU_BLOCK_END_STREAM_MIN &&
           !(v && !strcmp(v, "0"));
}

static tp_status_t s_check(const tp_op_call_t *c) {
    const tp_shape_t *x = &c->xshape[0];
    const int blk = (c->blk16 & TP_BLK16_Y) != 0;
    if (c->kind != TP_OP_BATCH_NORM || c->ninputs != 3 || x->ndim < 2 || !c->skip ||
        (blk && (x->ndim != 4 || x->d[1] % 16 || !(c->blk16 & 1u))) ||
        (!blk && (c->blk16 & 1u)))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: a block end (batch norm + add) that is "
                        "not [N, C, ...] with x, y and the skip in one layout "
                        "(cpu_block_end.c); TP_CPU_BLOCK_END=0 plans none", c->name);
    return TP_OK;
}

size_t tp_cpu_block_end_workspace(const tp_op_call_t *c) {
    const tp_shape_t *x = &c->xshape[0];
    return 2 * (size_t)(x->ndim > 1 ? x->d[1] : 1) * sizeof(float);
}

/* One pass of c over its channels (16 at a time when blocked): the forward
 * and the backward differ only in the three kernels they hand in. */
static tp_status_t s_dispatch(const tp_op_call_t *c, int stream, tp_cpu_range_fn plain,
                              tp_cpu_range_fn blk, tp_cpu_range_fn blk512) {
    s_args_t a;
    s_args(c, &a);
    a.stream = stream;
    if (a.n == 0 || a.sp == 0)
        return TP_OK;
    if (a.blk)
        tp_cpu_parallel((size_t)(a.ch / 16), 1, 1, s_avx512() ? blk512 : blk, &a);
    else
        tp_cpu_parallel((size_t)a.ch, 1, 1, plain, &a);
    return TP_OK;
}

tp_status_t tp_cpu_block_end_forward(const tp_op_call_t *c) {
    TP_TRY(s_check(c));
    return s_dispatch(c, tp_cpu_block_end_streams(c, c->y, 0), s_fwd1, s_fwd16, s_fwd16_avx512);
}

tp_status_t tp_cpu_block_end_backward(const tp_op_call_t *c) {
    TP_TRY(s_check(c));
    if (!c->attr->training)
        return tp_error(TP_ERR_UNSUPPORTED, "%s: the backward of an inference-mode block "
                        "end (batch norm + add) is not planned (cpu_block_end.c)", c->name);
    return s_dispatch(c, tp_cpu_block_end_streams(c, c->dx[0], c->dx_acc[0]), s_bwd1, s_bwd16,
                      s_bwd16_avx512);
}
