/* towerpack gpu: the CPU kernels of the reduce family (docs/ops.md).
 *
 * A reduction walks its input once, in memory order, carrying the index of
 * the output element each input element folds into (an odometer over the
 * input's axes whose reduced axes have output stride 0): one pass for any
 * set of axes, no transposes, and every load sequential. Sums run in
 * double (the workspace holds one double per output), as the loss family
 * does, so a mean over a whole batch keeps float precision.
 *
 * Softmax and log-softmax along an axis see x as [outer, n, inner] and
 * work a whole [n, inner] slab at a time, inner-most loops over the
 * contiguous inner axis (the workspace holds a max and a sum per inner
 * position), so a softmax over axis 1 of [N,C,H,W] is as sequential as
 * one over the last axis. The backward uses the output y: softmax
 * dx = y (dy - sum dy y), log-softmax dx = dy - e^y sum dy.
 *
 * The sequence cross-entropy recomputes each row's softmax in its backward
 * rather than keeping [N, V] probabilities: a language model's logits are
 * the largest tensor of its step. It keeps one float a row, the forward's
 * log-sum-exp, so the backward is one exp pass (p written into dx, then
 * scaled) instead of three (max, sum, p). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_math.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_reduce.h"

/* Elements of input worth a thread of their own (gpu/cpu/cpu_pool.h). */
#define S_MIN_ITEMS 16384

/* The sum and mean loops per ISA (cpu_math.h's clones): the double lanes
 * of a sum are two to a baseline SSE2 register, eight to an AVX-512 one.
 * Every lane adds its elements in the same order in each clone, and no
 * FMA contraction (the backward's dx += dy scale), so all give the same
 * bits. */
#if defined(__clang__) /* (the fuzzing build): no optimize attribute */
#pragma STDC FP_CONTRACT OFF
#define S_CLONES TP_CPU_CLONES
#else
#define S_CLONES TP_CPU_CLONES __attribute__((optimize("fp-contract=off")))
#endif

int tp_cpu_reduce_kind(tp_op_kind_t k) {
    return k == TP_OP_REDUCE_SUM || k == TP_OP_REDUCE_MEAN || k == TP_OP_REDUCE_MAX ||
           k == TP_OP_ARGMAX || k == TP_OP_SOFTMAX || k == TP_OP_LOG_SOFTMAX ||
           k == TP_OP_SOFTMAX_XENT_SEQ || k == TP_OP_TOP_K_ACCURACY;
}

/* ---- reductions over a set of axes ---------------------------------------- */

/* x's axes with the output stride of each (0 for a reduced one). */
typedef struct {
    int nd;
    size_t dim[TP_MAX_DIMS];
    size_t ost[TP_MAX_DIMS];
    size_t nx, ny; /* element counts of x and of the output */
} s_map_t;

/* Neighbouring axes that are both reduced, or both kept, are merged into
 * one (the walk visits the elements in the same order): a sum over h and
 * w of [N,C,H,W] walks runs of H*W, not of W. */
static void s_map(const tp_shape_t *x, int axes, s_map_t *m) {
    size_t st = 1, dim[TP_MAX_DIMS], ost[TP_MAX_DIMS];
    m->nx = tp_shape_count(x);
    for (int d = x->ndim - 1; d >= 0; d--) {
        dim[d] = (size_t)x->d[d];
        ost[d] = (axes & (1 << d)) ? 0 : st;
        if (!(axes & (1 << d)))
            st *= (size_t)x->d[d];
    }
    m->ny = st;
    int nd = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (nd > 0 && (m->ost[nd - 1] == 0) == (ost[d] == 0) &&
            m->ost[nd - 1] == ost[d] * dim[d]) {
            m->dim[nd - 1] *= dim[d];
            m->ost[nd - 1] = ost[d];
            continue;
        }
        m->dim[nd] = dim[d];
        m->ost[nd] = ost[d];
        nd++;
    }
    m->nd = nd;
}

/* Run the body for every run of x's last axis: i0 the run's first
 * element, o0 the output element of i0, len the run's length, os 0 (the
 * last axis reduced: the whole run folds into o0) or 1 (kept: element
 * i0 + j into o0 + j). */
#define S_RUNS(m, ...)                                                        \
    do {                                                                      \
        const size_t len = (m)->nd ? (m)->dim[(m)->nd - 1] : 1;               \
        const size_t os = (m)->nd ? (m)->ost[(m)->nd - 1] : 0;                \
        size_t idx_[TP_MAX_DIMS] = {0}, o0 = 0;                               \
        for (size_t i0 = 0; len && i0 < (m)->nx; i0 += len) {                 \
            __VA_ARGS__;                                                      \
            for (int d_ = (m)->nd - 2; d_ >= 0; d_--) {                       \
                if (++idx_[d_] < (m)->dim[d_]) {                              \
                    o0 += (m)->ost[d_];                                       \
                    break;                                                    \
                }                                                             \
                o0 -= (m)->ost[d_] * ((m)->dim[d_] - 1);                      \
                idx_[d_] = 0;                                                 \
            }                                                                 \
        }                                                                     \
    } while (0)

/* S_RUNS over a part: axis K's index over [LO, HI), every other axis over
 * all of it, in the order of the whole walk (K the last axis: the runs are
 * [LO, HI) of each). An output element's inputs all lie in one part when
 * K is a kept axis, and fold in the same order as in the whole walk. */
#define S_RUNS_PART(m, K, LO, HI, ...)                                        \
    do {                                                                      \
        const int nd_ = (m)->nd, k_ = (K);                                    \
        size_t xst_[TP_MAX_DIMS], st_[TP_MAX_DIMS] = {0}, lim_[TP_MAX_DIMS] = {0}, \
            idx_[TP_MAX_DIMS] = {0};                                          \
        size_t i0 = 0, o0 = 0, runs_ = 1;                                     \
        for (int d_ = nd_ - 1; d_ >= 0; d_--)                                 \
            xst_[d_] = d_ == nd_ - 1 ? 1 : xst_[d_ + 1] * (m)->dim[d_ + 1];    \
        for (int d_ = 0; d_ < nd_; d_++) {                                    \
            st_[d_] = d_ == k_ ? (size_t)(LO) : 0;                            \
            lim_[d_] = d_ == k_ ? (size_t)(HI) : (m)->dim[d_];                \
            idx_[d_] = st_[d_];                                               \
            i0 += st_[d_] * xst_[d_];                                         \
            o0 += st_[d_] * (m)->ost[d_];                                     \
            if (d_ < nd_ - 1)                                                 \
                runs_ *= lim_[d_] - st_[d_];                                  \
        }                                                                     \
        const size_t len = nd_ ? lim_[nd_ - 1] - st_[nd_ - 1] : 1;            \
        const size_t os = nd_ ? (m)->ost[nd_ - 1] : 0;                        \
        for (size_t r_ = 0; len && r_ < runs_; r_++) {                        \
            __VA_ARGS__;                                                      \
            for (int d_ = nd_ - 2; d_ >= 0; d_--) {                           \
                i0 += xst_[d_];                                               \
                o0 += (m)->ost[d_];                                           \
                if (++idx_[d_] < lim_[d_])                                    \
                    break;                                                    \
                i0 -= xst_[d_] * (lim_[d_] - st_[d_]);                        \
                o0 -= (m)->ost[d_] * (lim_[d_] - st_[d_]);                    \
                idx_[d_] = st_[d_];                                           \
            }                                                                 \
        }                                                                     \
    } while (0)

/* A reduction call and the axis its parts cut. */
typedef struct {
    const tp_op_call_t *c;
    s_map_t m;
    int k;
} s_red_t;

/* The outermost kept axis longer than 1 (-1: none, the reduction of
 * everything into one element: one part). */
static int s_red_cut(const s_map_t *m) {
    for (int d = 0; d < m->nd; d++)
        if (m->ost[d] != 0 && m->dim[d] > 1)
            return d;
    return -1;
}

/* fn over the parts of r->k (one part, the whole walk, when -1). */
static void s_red_par(s_red_t *r, tp_cpu_range_fn fn) {
    if (r->m.nd == 0) { /* a 0-d input: the walk is its one element */
        fn(r, 0, 1);
        return;
    }
    if (r->k < 0) {
        r->k = 0;
        fn(r, 0, r->m.dim[0]);
        return;
    }
    const size_t per = r->m.nx / r->m.dim[r->k]; /* inputs per index of k */
    const size_t min = (S_MIN_ITEMS + per - 1) / per;
    tp_cpu_parallel(r->m.dim[r->k], r->k == r->m.nd - 1 ? 16 : 1, min, fn, r);
}

/* Run the body for every input element i with o its output element. */
#define S_WALK(m, ...)                                                        \
    S_RUNS(m, for (size_t j_ = 0; j_ < len; j_++) {                           \
        const size_t i = i0 + j_, o = o0 + j_ * os;                           \
        __VA_ARGS__;                                                          \
    })

/* max that keeps NaN, as torch.amax */
static inline float s_nan_max(float v, float e) { return (e > v || isnan(e)) ? e : v; }

/* The max of x[0..n) that keeps NaN: four lanes of maxps, any NaN seen
 * flagged on the side (maxps alone would drop one). -inf for n 0. */
static float s_run_max(const float *x, size_t n) {
    float mx = -INFINITY;
    size_t j = 0;
#if defined(__SSE2__)
    if (n >= 4) {
        __m128 m = _mm_loadu_ps(x), nan = _mm_cmpunord_ps(m, m);
        for (j = 4; j + 4 <= n; j += 4) {
            const __m128 v = _mm_loadu_ps(x + j);
            m = _mm_max_ps(m, v);
            nan = _mm_or_ps(nan, _mm_cmpunord_ps(v, v));
        }
        if (_mm_movemask_ps(nan))
            return NAN;
        float lanes[4];
        _mm_storeu_ps(lanes, m);
        for (int l = 0; l < 4; l++)
            mx = s_nan_max(mx, lanes[l]);
    }
#endif
    for (; j < n; j++)
        mx = s_nan_max(mx, x[j]);
    return mx;
}

/* Elements folded into each output element: nx / ny (0 when empty). */
static double s_per_out(const s_map_t *m) {
    return m->ny ? (double)m->nx / (double)m->ny : 0.0;
}

S_CLONES static void s_reduce_fwd_part(void *arg, size_t lo, size_t hi) {
    const s_red_t *rd = arg;
    const tp_op_call_t *c = rd->c;
    const s_map_t *mp = &rd->m;
    const float *restrict x = c->x[0];
    float *restrict y = c->y;
    double *restrict acc = c->workspace;
    if (c->kind == TP_OP_REDUCE_MAX) {
        S_RUNS_PART(mp, rd->k, lo, hi, {
            if (os == 0) {
                y[o0] = s_nan_max(y[o0], s_run_max(x + i0, len));
            } else {
                for (size_t j = 0; j < len; j++)
                    y[o0 + j] = s_nan_max(y[o0 + j], x[i0 + j]);
            }
        });
        return;
    }
    /* a reduced last axis: eight lanes (element j into lane j mod 8,
     * vectorised), added pairwise, then the tail in order; a kept one:
     * independent outputs, vectorised */
    S_RUNS_PART(mp, rd->k, lo, hi, {
        if (os == 0) {
            double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            size_t j = 0;
            for (; j + 8 <= len; j += 8)
                for (int t = 0; t < 8; t++)
                    l[t] += (double)x[i0 + j + t];
            double s0 = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
            for (; j < len; j++)
                s0 += (double)x[i0 + j];
            acc[o0] += s0;
        } else {
            for (size_t j = 0; j < len; j++)
                acc[o0 + j] += (double)x[i0 + j];
        }
    });
}

/* Parts cut along a kept axis (s_red_cut): each output's inputs fold in
 * one part, in the order of the single-threaded walk, so the sums are the
 * same bits whatever the thread count. A reduction of everything to one
 * element is one part. */
static void s_reduce_fwd(const tp_op_call_t *c) {
    s_red_t rd = {.c = c};
    s_map(&c->xshape[0], c->attr->axes, &rd.m);
    rd.k = s_red_cut(&rd.m);
    float *restrict y = c->y;
    if (c->kind == TP_OP_REDUCE_MAX) {
        for (size_t o = 0; o < rd.m.ny; o++)
            y[o] = -INFINITY;
        s_red_par(&rd, s_reduce_fwd_part);
        return;
    }
    double *restrict acc = c->workspace;
    memset(acc, 0, rd.m.ny * sizeof(double));
    s_red_par(&rd, s_reduce_fwd_part);
    /* the mean of no elements is NaN (0/0), as torch's */
    const double scale = c->kind == TP_OP_REDUCE_MEAN ? 1.0 / s_per_out(&rd.m) : 1.0;
    for (size_t o = 0; o < rd.m.ny; o++)
        y[o] = (float)(acc[o] * scale);
}

S_CLONES static void s_reduce_bwd_part(void *arg, size_t lo, size_t hi) {
    const s_red_t *rd = arg;
    const tp_op_call_t *c = rd->c;
    const s_map_t *mp = &rd->m;
    float *restrict dx = c->dx[0];
    const float *restrict dy = c->dy;
    const int acc = c->dx_acc[0];
    const float fault = tp_cpu_elementwise_grad_fault; /* 1 outside the checks */
    if (c->kind == TP_OP_REDUCE_MAX) {
        /* the gradient splits evenly over the elements equal to the max */
        const float *restrict x = c->x[0], *restrict y = c->y;
        float *restrict cnt = c->workspace;
        S_RUNS_PART(mp, rd->k, lo, hi, {
            if (os == 0) { /* a reduced last axis: an integer count, vectorised */
                const float m0 = y[o0];
                uint32_t k = 0;
                for (size_t j = 0; j < len; j++)
                    k += x[i0 + j] == m0;
                cnt[o0] += (float)k;
            } else {
                for (size_t j = 0; j < len; j++)
                    cnt[o0 + j] += (float)(x[i0 + j] == y[o0 + j]);
            }
        });
        S_RUNS_PART(mp, rd->k, lo, hi, {
            if (os == 0) {
                const float m0 = y[o0], g0 = dy[o0] / cnt[o0] * fault;
                for (size_t j = 0; j < len; j++) {
                    const float g = x[i0 + j] == m0 ? g0 : 0.0f;
                    dx[i0 + j] = acc ? dx[i0 + j] + g : g;
                }
            } else {
                for (size_t j = 0; j < len; j++) {
                    const float g =
                        x[i0 + j] == y[o0 + j] ? dy[o0 + j] / cnt[o0 + j] * fault : 0.0f;
                    dx[i0 + j] = acc ? dx[i0 + j] + g : g;
                }
            }
        });
        return;
    }
    const float scale =
        (c->kind == TP_OP_REDUCE_MEAN ? (float)(1.0 / s_per_out(mp)) : 1.0f) * fault;
    /* by runs, the run's dy in a register where the last axis is reduced */
    S_RUNS_PART(mp, rd->k, lo, hi, {
        if (os == 0) {
            const float g = dy[o0] * scale;
            if (acc)
                for (size_t j = 0; j < len; j++)
                    dx[i0 + j] += g;
            else
                for (size_t j = 0; j < len; j++)
                    dx[i0 + j] = g;
        } else if (acc) {
            for (size_t j = 0; j < len; j++)
                dx[i0 + j] += dy[o0 + j] * scale;
        } else {
            for (size_t j = 0; j < len; j++)
                dx[i0 + j] = dy[o0 + j] * scale;
        }
    });
}

static void s_reduce_bwd(const tp_op_call_t *c) {
    if (!c->dx[0])
        return;
    s_red_t rd = {.c = c};
    s_map(&c->xshape[0], c->attr->axes, &rd.m);
    rd.k = s_red_cut(&rd.m);
    if (c->kind == TP_OP_REDUCE_MAX)
        memset(c->workspace, 0, rd.m.ny * sizeof(float));
    s_red_par(&rd, s_reduce_bwd_part);
}

/* ---- along one axis: x as [outer, n, inner] -------------------------------- */

static void s_split(const tp_shape_t *x, int axes, size_t *outer, size_t *n,
                    size_t *inner) {
    *outer = *n = *inner = 1;
    int ax = 0;
    while (ax < x->ndim - 1 && !(axes & (1 << ax)))
        ax++;
    for (int d = 0; d < x->ndim; d++) {
        if (d < ax)
            *outer *= (size_t)x->d[d];
        else if (d == ax)
            *n = (size_t)x->d[d];
        else
            *inner *= (size_t)x->d[d];
    }
}

static void s_argmax_fwd(const tp_op_call_t *c) {
    size_t outer, n, inner;
    s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
    const float *x = c->x[0];
    int32_t *y = c->y;
    for (size_t o = 0; o < outer; o++)
        for (size_t i = 0; i < inner; i++) {
            const float *r = x + o * n * inner + i;
            size_t best = 0;
            float bv = r[0];
            /* the first maximum; a NaN is the maximum (torch.argmax) */
            for (size_t j = 1; j < n && !isnan(bv); j++)
                if (r[j * inner] > bv || isnan(r[j * inner])) {
                    bv = r[j * inner];
                    best = j;
                }
            y[o * inner + i] = (int32_t)best;
        }
}

/* e^x for x <= 0 (every exponent here is a value minus its row's max, or
 * a log-probability): Cephes' expf, a degree-6 polynomial on x - n ln2
 * times 2^n, four lanes at a time in SSE2 (libm's expf is a call per
 * element: ten times PyTorch's vectorised softmax). The scalar form does
 * the same operations in the same order, so a tail element gets the bits
 * a lane would. Within 1 ulp of e^x (8e-8 relative, measured over
 * [-87, 0]); below -87.3 exactly 0 (a logit masked with -inf); NaN stays
 * NaN (in the lanes by maxps/minps's operand order, no select). */
#define S_LOG2E 1.44269504088896341f
#define S_LN2_HI 0.693359375f
#define S_LN2_LO 2.12194440e-4f
#define S_P0 1.9875691500e-4f
#define S_P1 1.3981999507e-3f
#define S_P2 8.3334519073e-3f
#define S_P3 4.1665795894e-2f
#define S_P4 1.6666665459e-1f
#define S_P5 5.0000001201e-1f

static inline float s_exp(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 0.0f ? 0.0f : xc;
    /* n = round(x log2 e), by truncating a non-positive number */
    const int n = (int)(xc * S_LOG2E - 0.5f);
    const float fn = (float)n;
    const float r = (xc - fn * S_LN2_HI) + fn * S_LN2_LO;
    float p = S_P0;
    p = p * r + S_P1;
    p = p * r + S_P2;
    p = p * r + S_P3;
    p = p * r + S_P4;
    p = p * r + S_P5;
    const float e = (p * (r * r) + r) + 1.0f;
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float two;
    memcpy(&two, &bits, sizeof two);
    return x < -87.3f ? 0.0f : x == x ? e * two : x;
}

#if defined(__SSE2__)
static inline __m128 s_exp4(__m128 x) {
    /* maxps returns its second operand when either is NaN: a NaN x flows
     * through every step (its payload kept) to the result, as s_exp's
     * `x == x ? ... : x`, with no select of its own */
    __m128 xc = _mm_max_ps(_mm_set1_ps(-87.3f), x);
    xc = _mm_min_ps(_mm_setzero_ps(), xc); /* NaN: the second operand again */
    const __m128i n = _mm_cvttps_epi32(_mm_sub_ps(_mm_mul_ps(xc, _mm_set1_ps(S_LOG2E)),
                                                  _mm_set1_ps(0.5f)));
    const __m128 fn = _mm_cvtepi32_ps(n);
    const __m128 r = _mm_add_ps(_mm_sub_ps(xc, _mm_mul_ps(fn, _mm_set1_ps(S_LN2_HI))),
                                _mm_mul_ps(fn, _mm_set1_ps(S_LN2_LO)));
    __m128 p = _mm_set1_ps(S_P0);
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(S_P1));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(S_P2));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(S_P3));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(S_P4));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(S_P5));
    const __m128 e = _mm_add_ps(_mm_add_ps(_mm_mul_ps(p, _mm_mul_ps(r, r)), r), _mm_set1_ps(1.0f));
    const __m128 two = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(n, _mm_set1_epi32(127)), 23));
    /* below -87.3: 0 (a masked logit, -inf, gives exactly 0) */
    return _mm_andnot_ps(_mm_cmplt_ps(x, _mm_set1_ps(-87.3f)), _mm_mul_ps(e, two));
}
#endif

/* The exponential sums' last steps, which the SSE2 and the AVX2 forms
 * below share (written once: the same operations, so the same bits in
 * either). The tail: e^(x[j] - sub) of elements j.. in order, added to
 * sum. */
static inline float s_exp_sub_tail(const float *restrict x, const float *restrict sub, int vec,
                                   float *restrict out, size_t j, size_t n, float sum) {
    for (; j < n; j++) {
        const float e = s_exp(x[j] - (vec ? sub[j] : sub[0]));
        if (out)
            out[j] = e;
        sum += e;
    }
    return sum;
}

#if defined(__SSE2__)
/* A last block of 4 (from *j, when there is one; *j then past it) into
 * the first of the two four-lane sums, the two added lane by lane, then
 * the four lanes pairwise. */
static inline float s_exp_sub_lanes(const float *restrict x, const float *restrict sub, int vec,
                                    float *restrict out, size_t n, size_t *j, __m128 a0,
                                    __m128 a1) {
    if (*j + 4 <= n) {
        const __m128 e0 = s_exp4(_mm_sub_ps(_mm_loadu_ps(x + *j),
                                            vec ? _mm_loadu_ps(sub + *j) : _mm_set1_ps(sub[0])));
        if (out)
            _mm_storeu_ps(out + *j, e0);
        a0 = _mm_add_ps(a0, e0);
        *j += 4;
    }
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_add_ps(a0, a1));
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}
#endif

/* out[j] = e^(x[j] - sub), sub one value (vec 0) or sub[j] (vec 1); out
 * may be NULL. Returns the sum of the exponentials in one fixed order
 * whatever the ISA: blocks of 8 into two four-lane sums (elements 8k + l
 * and 8k + 4 + l), a block of 4 into the first, the two added lane by
 * lane, the four lanes pairwise, then the tail in order. The AVX2 form
 * (one eight-lane sum, no FMA) gives the same bits as the SSE2 form. */
static float s_exp_sub_sse2(const float *restrict x, const float *restrict sub, int vec,
                            float *restrict out, size_t n) {
    size_t j = 0;
    float sum = 0.0f;
#if defined(__SSE2__)
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps();
    const __m128 s0 = _mm_set1_ps(sub[0]);
    for (; j + 8 <= n; j += 8) {
        const __m128 e0 = s_exp4(_mm_sub_ps(_mm_loadu_ps(x + j), vec ? _mm_loadu_ps(sub + j) : s0));
        const __m128 e1 =
            s_exp4(_mm_sub_ps(_mm_loadu_ps(x + j + 4), vec ? _mm_loadu_ps(sub + j + 4) : s0));
        if (out) {
            _mm_storeu_ps(out + j, e0);
            _mm_storeu_ps(out + j + 4, e1);
        }
        a0 = _mm_add_ps(a0, e0);
        a1 = _mm_add_ps(a1, e1);
    }
    sum = s_exp_sub_lanes(x, sub, vec, out, n, &j, a0, a1);
#endif
    return s_exp_sub_tail(x, sub, vec, out, j, n, sum);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* s_exp4's operations on eight lanes (no FMA: the same roundings) */
__attribute__((target("avx2"))) static inline __m256 s_exp8(__m256 x) {
    __m256 xc = _mm256_max_ps(_mm256_set1_ps(-87.3f), x); /* NaN flows through */
    xc = _mm256_min_ps(_mm256_setzero_ps(), xc);
    const __m256i n = _mm256_cvttps_epi32(
        _mm256_sub_ps(_mm256_mul_ps(xc, _mm256_set1_ps(S_LOG2E)), _mm256_set1_ps(0.5f)));
    const __m256 fn = _mm256_cvtepi32_ps(n);
    const __m256 r = _mm256_add_ps(_mm256_sub_ps(xc, _mm256_mul_ps(fn, _mm256_set1_ps(S_LN2_HI))),
                                   _mm256_mul_ps(fn, _mm256_set1_ps(S_LN2_LO)));
    __m256 p = _mm256_set1_ps(S_P0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(S_P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(S_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(S_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(S_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(S_P5));
    const __m256 e = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
                                   _mm256_set1_ps(1.0f));
    const __m256 two =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ),
                            _mm256_mul_ps(e, two));
}

__attribute__((target("avx2"))) static float s_exp_sub_avx2(const float *restrict x,
                                                            const float *restrict sub, int vec,
                                                            float *restrict out, size_t n) {
    size_t j = 0;
    __m256 a = _mm256_setzero_ps();
    const __m256 s8 = _mm256_set1_ps(sub[0]);
    for (; j + 8 <= n; j += 8) {
        const __m256 e =
            s_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vec ? _mm256_loadu_ps(sub + j) : s8));
        if (out)
            _mm256_storeu_ps(out + j, e);
        a = _mm256_add_ps(a, e);
    }
    const float sum = s_exp_sub_lanes(x, sub, vec, out, n, &j, _mm256_castps256_ps128(a),
                                      _mm256_extractf128_ps(a, 1));
    return s_exp_sub_tail(x, sub, vec, out, j, n, sum);
}
#endif

typedef float (*s_exp_sub_fn)(const float *, const float *, int, float *, size_t);

/* AVX2 where the CPU has it; TP_ISA=plain keeps SSE2 (to compare). */
static s_exp_sub_fn s_exp_sub_pick(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    const char *cap = getenv("TP_ISA");
    __builtin_cpu_init();
    if ((!cap || strcmp(cap, "plain")) && __builtin_cpu_supports("avx2"))
        return s_exp_sub_avx2;
#endif
    return s_exp_sub_sse2;
}

static float s_exp_sub(const float *restrict x, const float *restrict sub, int vec,
                       float *restrict out, size_t n) {
    static _Atomic(s_exp_sub_fn) fn; /* racing first calls store the same pointer */
    s_exp_sub_fn f = atomic_load_explicit(&fn, memory_order_relaxed);
    if (!f) {
        f = s_exp_sub_pick();
        atomic_store_explicit(&fn, f, memory_order_relaxed);
    }
    return f(x, sub, vec, out, n);
}

/* The row loops around the exponentials (max, scale, the backward's
 * elementwise step) in eight lanes where the CPU has AVX2: each element's
 * operations are the same roundings in either width (no FMA), and a max
 * does not depend on its order, so the bits are those of the SSE2 loops.
 * At one thread these loops were a third of softmax's time in four lanes
 * (the max one dependent chain of maxps). */
static int s_avx2(void) {
    static _Atomic int have; /* 0 unknown, 1 no, 2 yes */
    int h = atomic_load_explicit(&have, memory_order_relaxed);
    if (!h) {
        h = s_exp_sub_pick() == s_exp_sub_sse2 ? 1 : 2;
        atomic_store_explicit(&have, h, memory_order_relaxed);
    }
    return h == 2;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static float s_row_max_avx2(const float *x, size_t n) {
    size_t j = 0;
    float mx = x[0];
    if (n >= 32) { /* four independent maxima, so that maxps does not wait on itself */
        __m256 m0 = _mm256_loadu_ps(x), m1 = _mm256_loadu_ps(x + 8),
               m2 = _mm256_loadu_ps(x + 16), m3 = _mm256_loadu_ps(x + 24);
        for (j = 32; j + 32 <= n; j += 32) {
            m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
            m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
            m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + j + 16));
            m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + j + 24));
        }
        const __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
        float lanes[8];
        _mm256_storeu_ps(lanes, m);
        mx = lanes[0];
        for (int l = 1; l < 8; l++)
            mx = lanes[l] > mx ? lanes[l] : mx;
    }
    for (; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* y[j] = x[j] * s (y may be x) */
__attribute__((target("avx2"))) static void s_scale_avx2(const float *x, float s, float *y,
                                                         size_t n) {
    size_t j = 0;
    const __m256 s8 = _mm256_set1_ps(s);
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), s8));
    for (; j < n; j++)
        y[j] = x[j] * s;
}

/* y[j] = x[j] - s */
__attribute__((target("avx2"))) static void s_shift_avx2(const float *restrict x, float s,
                                                         float *restrict y, size_t n) {
    size_t j = 0;
    const __m256 s8 = _mm256_set1_ps(s);
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(y + j, _mm256_sub_ps(_mm256_loadu_ps(x + j), s8));
    for (; j < n; j++)
        y[j] = x[j] - s;
}

/* softmax's row backward, dx = y (dy - d) f (acc: dx +=) */
__attribute__((target("avx2"))) static void s_sm_grad_avx2(const float *restrict y,
                                                           const float *restrict dy, float d,
                                                           float f, int acc,
                                                           float *restrict dx, size_t n) {
    size_t j = 0;
    const __m256 d8 = _mm256_set1_ps(d), f8 = _mm256_set1_ps(f);
    for (; j + 8 <= n; j += 8) {
        __m256 g = _mm256_mul_ps(
            _mm256_mul_ps(_mm256_loadu_ps(y + j), _mm256_sub_ps(_mm256_loadu_ps(dy + j), d8)),
            f8);
        if (acc)
            g = _mm256_add_ps(_mm256_loadu_ps(dx + j), g);
        _mm256_storeu_ps(dx + j, g);
    }
    for (; j < n; j++) {
        const float g = y[j] * (dy[j] - d) * f;
        dx[j] = acc ? dx[j] + g : g;
    }
}

/* log-softmax's row backward with e^y already in dx: dx = (dy - dx d) f */
__attribute__((target("avx2"))) static void s_lsm_fin_avx2(const float *restrict dy, float d,
                                                           float f, float *restrict dx,
                                                           size_t n) {
    size_t j = 0;
    const __m256 d8 = _mm256_set1_ps(d), f8 = _mm256_set1_ps(f);
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(dx + j, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(dy + j),
                                                             _mm256_mul_ps(_mm256_loadu_ps(dx + j), d8)),
                                               f8));
    for (; j < n; j++)
        dx[j] = (dy[j] - dx[j] * d) * f;
}
#endif

static float s_row_max_sse2(const float *x, size_t n);

static float s_row_max(const float *x, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (s_avx2())
        return s_row_max_avx2(x, n);
#endif
    return s_row_max_sse2(x, n);
}

static void s_scale(const float *x, float s, float *y, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (s_avx2()) {
        s_scale_avx2(x, s, y, n);
        return;
    }
#endif
    for (size_t j = 0; j < n; j++)
        y[j] = x[j] * s;
}

static void s_shift(const float *restrict x, float s, float *restrict y, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (s_avx2()) {
        s_shift_avx2(x, s, y, n);
        return;
    }
#endif
    for (size_t j = 0; j < n; j++)
        y[j] = x[j] - s;
}

static void s_sm_grad(const float *restrict y, const float *restrict dy, float d, float f,
                      int acc, float *restrict dx, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (s_avx2()) {
        s_sm_grad_avx2(y, dy, d, f, acc, dx, n);
        return;
    }
#endif
    for (size_t j = 0; j < n; j++) {
        const float g = y[j] * (dy[j] - d) * f;
        dx[j] = acc ? dx[j] + g : g;
    }
}

static void s_lsm_fin(const float *restrict dy, float d, float f, float *restrict dx,
                      size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (s_avx2()) {
        s_lsm_fin_avx2(dy, d, f, dx, n);
        return;
    }
#endif
    for (size_t j = 0; j < n; j++)
        dx[j] = (dy[j] - dx[j] * d) * f;
}

/* The largest of x[0..n) (n >= 1), four lanes. */
static float s_row_max_sse2(const float *x, size_t n) {
    size_t j = 0;
    float mx = x[0];
#if defined(__SSE2__)
    if (n >= 4) {
        __m128 m = _mm_loadu_ps(x);
        for (j = 4; j + 4 <= n; j += 4)
            m = _mm_max_ps(m, _mm_loadu_ps(x + j));
        float lanes[4];
        _mm_storeu_ps(lanes, m);
        mx = lanes[0];
        for (int l = 1; l < 4; l++)
            mx = lanes[l] > mx ? lanes[l] : mx;
    }
#endif
    for (; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* sum_j a[j] b[j] (b NULL: sum_j a[j]) in eight independent lanes, then
 * pairwise and the tail in order: one addss chain a row cost the softmax
 * backward four cycles an element. */
static float s_dot(const float *restrict a, const float *restrict b, size_t n) {
    size_t j = 0;
    float sum = 0.0f;
#if defined(__SSE2__)
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m128 v0 = _mm_loadu_ps(a + j), v1 = _mm_loadu_ps(a + j + 4);
        if (b) {
            v0 = _mm_mul_ps(v0, _mm_loadu_ps(b + j));
            v1 = _mm_mul_ps(v1, _mm_loadu_ps(b + j + 4));
        }
        a0 = _mm_add_ps(a0, v0);
        a1 = _mm_add_ps(a1, v1);
    }
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_add_ps(a0, a1));
    sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
    for (; j < n; j++)
        sum += b ? a[j] * b[j] : a[j];
    return sum;
}

#define S_CHUNK 256 /* floats of e^x the backward keeps on the stack at a time */

/* A softmax call as [outer, n, inner], cut into parts: rows (inner 1)
 * or ranges of the inner positions (each with its own slice of the
 * workspace's maxima and sums), so every element is computed as the
 * whole call computes it, whatever the cut. */
typedef struct {
    const tp_op_call_t *c;
    size_t outer, n, inner;
} s_sm_t;

static void s_sm_par(const tp_op_call_t *c, tp_cpu_range_fn fn) {
    s_sm_t sm = {.c = c};
    s_split(&c->xshape[0], c->attr->axes, &sm.outer, &sm.n, &sm.inner);
    const size_t items = sm.inner == 1 ? sm.outer : sm.inner;
    const size_t per = sm.n * (sm.inner == 1 ? 1 : sm.outer); /* elements per item */
    tp_cpu_parallel(items, sm.inner == 1 ? 1 : 16, (S_MIN_ITEMS + per - 1) / (per ? per : 1),
                    fn, &sm);
}

static void s_softmax_fwd_part(void *arg, size_t lo, size_t hi) {
    const s_sm_t *sm = arg;
    const tp_op_call_t *c = sm->c;
    const size_t n = sm->n, inner = sm->inner;
    const int lg = c->kind == TP_OP_LOG_SOFTMAX;
    if (inner == 1) { /* rows: max, e^(x - max) and its sum, then the scale or the log */
        for (size_t o = lo; o < hi; o++) {
            const float *restrict x = (const float *)c->x[0] + o * n;
            float *restrict y = (float *)c->y + o * n;
            const float mx = s_row_max(x, n);
            if (lg) {
                const float l = mx + logf(s_exp_sub(x, &mx, 0, NULL, n));
                s_shift(x, l, y, n);
            } else {
                const float is = 1.0f / s_exp_sub(x, &mx, 0, y, n);
                s_scale(y, is, y, n);
            }
        }
        return;
    }
    /* inner positions [lo, hi) of every slab */
    const size_t w = hi - lo;
    float *restrict mx = (float *)c->workspace + lo, *restrict sum = (float *)c->workspace + inner + lo;
    for (size_t o = 0; o < sm->outer; o++) {
        const float *restrict x = (const float *)c->x[0] + o * n * inner + lo;
        float *restrict y = (float *)c->y + o * n * inner + lo;
        memcpy(mx, x, w * sizeof(float));
        for (size_t j = 1; j < n; j++)
            for (size_t i = 0; i < w; i++)
                mx[i] = x[j * inner + i] > mx[i] ? x[j * inner + i] : mx[i];
        memset(sum, 0, w * sizeof(float));
        for (size_t j = 0; j < n; j++) {
            s_exp_sub(x + j * inner, mx, 1, y + j * inner, w);
            for (size_t i = 0; i < w; i++)
                sum[i] += y[j * inner + i];
        }
        if (lg) {
            for (size_t i = 0; i < w; i++)
                sum[i] = mx[i] + logf(sum[i]);
            for (size_t j = 0; j < n; j++)
                for (size_t i = 0; i < w; i++)
                    y[j * inner + i] = x[j * inner + i] - sum[i];
        } else {
            for (size_t i = 0; i < w; i++)
                sum[i] = 1.0f / sum[i];
            for (size_t j = 0; j < n; j++)
                for (size_t i = 0; i < w; i++)
                    y[j * inner + i] *= sum[i];
        }
    }
}

static void s_softmax_fwd(const tp_op_call_t *c) { s_sm_par(c, s_softmax_fwd_part); }

/* dx[e] (+)= (dy[e] - e^y[e] d[e or 0]) f over n elements: the
 * log-softmax backward, e^y in stack chunks. */
static void s_lsm_grad(const float *restrict y, const float *restrict dy, const float *d,
                       int vec, float f, int acc, float *restrict dx, size_t n) {
    float ey[S_CHUNK];
    const float zero = 0.0f;
    for (size_t j0 = 0; j0 < n; j0 += S_CHUNK) {
        const size_t m = n - j0 < S_CHUNK ? n - j0 : S_CHUNK;
        s_exp_sub(y + j0, &zero, 0, ey, m);
        for (size_t j = 0; j < m; j++) {
            const float g = (dy[j0 + j] - ey[j] * (vec ? d[j0 + j] : d[0])) * f;
            dx[j0 + j] = acc ? dx[j0 + j] + g : g;
        }
    }
}

static void s_softmax_bwd_part(void *arg, size_t lo, size_t hi) {
    const s_sm_t *sm = arg;
    const tp_op_call_t *c = sm->c;
    const size_t n = sm->n, inner = sm->inner;
    const int lg = c->kind == TP_OP_LOG_SOFTMAX, acc = c->dx_acc[0];
    const float fault = tp_cpu_elementwise_grad_fault;
    if (inner == 1) { /* rows: the dot product in a register */
        for (size_t o = lo; o < hi; o++) {
            const size_t base = o * n;
            const float *restrict y = (const float *)c->y + base, *restrict dy = c->dy + base;
            float *restrict dx = c->dx[0] + base;
            if (lg && !acc) { /* e^y straight into dx, then the gradient in place */
                const float d = s_dot(dy, NULL, n), zero = 0.0f;
                s_exp_sub(y, &zero, 0, dx, n);
                s_lsm_fin(dy, d, fault, dx, n);
            } else if (lg) {
                const float d = s_dot(dy, NULL, n);
                s_lsm_grad(y, dy, &d, 0, fault, acc, dx, n);
            } else {
                s_sm_grad(y, dy, s_dot(dy, y, n), fault, acc, dx, n);
            }
        }
        return;
    }
    const size_t w = hi - lo;
    float *restrict dot = (float *)c->workspace + lo;
    for (size_t o = 0; o < sm->outer; o++) {
        const size_t base = o * n * inner + lo;
        const float *restrict y = (const float *)c->y + base, *restrict dy = c->dy + base;
        float *restrict dx = c->dx[0] + base;
        memset(dot, 0, w * sizeof(float));
        /* softmax: sum dy y; log-softmax: sum dy */
        for (size_t j = 0; j < n; j++)
            for (size_t i = 0; i < w; i++)
                dot[i] += lg ? dy[j * inner + i] : dy[j * inner + i] * y[j * inner + i];
        for (size_t j = 0; j < n; j++) {
            const size_t e0 = j * inner;
            if (lg) {
                s_lsm_grad(y + e0, dy + e0, dot, 1, fault, acc, dx + e0, w);
                continue;
            }
            for (size_t i = 0; i < w; i++) {
                const float g = y[e0 + i] * (dy[e0 + i] - dot[i]) * fault;
                dx[e0 + i] = acc ? dx[e0 + i] + g : g;
            }
        }
    }
}

static void s_softmax_bwd(const tp_op_call_t *c) {
    if (c->dx[0])
        s_sm_par(c, s_softmax_bwd_part);
}

/* ---- labels: the sequence cross-entropy and top-k accuracy ------------------ */

/* Rows of logits [..., V] as [rows, V]. */
static void s_rows(const tp_op_call_t *c, size_t *rows, size_t *v) {
    const tp_shape_t *s = &c->xshape[0];
    *v = (size_t)s->d[s->ndim - 1];
    *rows = *v ? tp_shape_count(s) / *v : 0;
}

static tp_status_t s_bad_label(const tp_op_call_t *c, size_t row, int32_t l, size_t v) {
    return tp_error(TP_ERR_INVALID, "%s: label %d at row %zu outside [0,%zu)%s", c->name,
                    l, row, v,
                    c->kind == TP_OP_SOFTMAX_XENT_SEQ ? " and not the ignore label" : "");
}

/* log sum_j e^r_j. */
static float s_logsumexp(const float *r, size_t v) {
    const float mx = s_row_max(r, v);
    return mx + logf(s_exp_sub(r, &mx, 0, NULL, v));
}

/* The sequence cross-entropy's workspace: each row's term (doubles), then
 * each row's log-sum-exp (floats), which the backward reuses rather than
 * walking the row twice more (its max and its exponentials' sum): the
 * backward is then one exp pass a row. NULL when the call has no
 * workspace or less than that (the parity harness's): recompute. */
static float *s_xent_seq_lse(const tp_op_call_t *c, size_t rows) {
    const size_t need = rows * (sizeof(double) + sizeof(float));
    if (!c->workspace || (c->workspace_bytes && c->workspace_bytes < need))
        return NULL;
    return (float *)((double *)c->workspace + rows);
}

/* Each row's -log p(label) (0 for an ignored row), rows [lo, hi), into
 * the workspace's doubles, and its log-sum-exp for the backward. */
static void s_xent_seq_terms(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const size_t v = (size_t)c->xshape[0].d[c->xshape[0].ndim - 1];
    const size_t rows = tp_shape_count(&c->xshape[1]);
    const float *x = c->x[0];
    const int32_t *lab = c->x[1];
    const int32_t ignore = (int32_t)c->attr->alpha;
    double *term = c->workspace;
    float *lse = s_xent_seq_lse(c, rows);
    for (size_t r = lo; r < hi; r++) {
        if (lab[r] == ignore) {
            term[r] = 0.0;
            continue;
        }
        const float l = s_logsumexp(x + r * v, v);
        if (lse)
            lse[r] = l;
        term[r] = (double)l - x[r * v + (size_t)lab[r]];
    }
}

/* The labels checked first (an error names the row), the rows' terms on
 * the backend's threads, then their sum in row order, in double: the bits
 * of one thread. */
static tp_status_t s_xent_seq_fwd(const tp_op_call_t *c) {
    size_t rows, v;
    s_rows(c, &rows, &v);
    if (tp_shape_count(&c->xshape[1]) != rows) /* batched on one side only */
        return tp_error(TP_ERR_SHAPE, "%s: %zu rows of logits but %zu labels", c->name,
                        rows, tp_shape_count(&c->xshape[1]));
    const int32_t *lab = c->x[1];
    const int32_t ignore = (int32_t)c->attr->alpha;
    for (size_t r = 0; r < rows; r++)
        if (lab[r] != ignore && (lab[r] < 0 || (size_t)lab[r] >= v))
            return s_bad_label(c, r, lab[r], v);
    double loss = 0.0;
    size_t counted = 0;
    if (c->workspace && rows) {
        tp_cpu_parallel(rows, 1, v ? (S_MIN_ITEMS + v - 1) / v : rows, s_xent_seq_terms,
                        (void *)c);
        const double *term = c->workspace;
        for (size_t r = 0; r < rows; r++)
            if (lab[r] != ignore) {
                loss += term[r];
                counted++;
            }
    } else { /* no workspace planned: the same terms, one by one */
        const float *x = c->x[0];
        for (size_t r = 0; r < rows; r++) {
            if (lab[r] == ignore)
                continue;
            loss += (double)s_logsumexp(x + r * v, v) - x[r * v + (size_t)lab[r]];
            counted++;
        }
    }
    /* nothing counted: 0/0, NaN, as F.cross_entropy */
    *(float *)c->y = (float)(loss / (double)counted);
    return TP_OK;
}

/* The sequence cross-entropy's backward for rows [lo, hi) (each row
 * writes only its own gradient row). */
typedef struct {
    const tp_op_call_t *c;
    size_t v;
    float g;
    const float *lse; /* each row's, from the forward, or NULL */
} s_xs_t;

static void s_xent_seq_bwd_part(void *arg, size_t lo, size_t hi) {
    const s_xs_t *xs = arg;
    const tp_op_call_t *c = xs->c;
    const size_t v = xs->v;
    const float g = xs->g;
    float *dx = c->dx[0];
    const float *x = c->x[0];
    const int32_t *lab = c->x[1];
    const int32_t ignore = (int32_t)c->attr->alpha;
    const int acc = c->dx_acc[0];
    for (size_t r = lo; r < hi; r++) {
        float *d = dx + r * v;
        if (lab[r] == ignore) {
            if (!acc)
                memset(d, 0, v * sizeof(float));
            continue;
        }
        const float *row = x + r * v;
        /* the forward's log-sum-exp (the same bits as recomputing it) */
        const float lse = xs->lse ? xs->lse[r] : s_logsumexp(row, v);
        const size_t at = (size_t)lab[r];
        if (!acc) { /* p straight into the gradient row, then scaled */
            s_exp_sub(row, &lse, 0, d, v);
            const float pl = d[at];
            s_scale(d, g, d, v); /* g p, as p g */
            d[at] = g * (pl - 1.0f);
            continue;
        }
        float p[S_CHUNK]; /* the probabilities, in stack chunks */
        for (size_t j0 = 0; j0 < v; j0 += S_CHUNK) {
            const size_t m = v - j0 < S_CHUNK ? v - j0 : S_CHUNK;
            s_exp_sub(row + j0, &lse, 0, p, m);
            for (size_t j = 0; j < m; j++) {
                const float gj = g * (j0 + j == (size_t)lab[r] ? p[j] - 1.0f : p[j]);
                d[j0 + j] = acc ? d[j0 + j] + gj : gj;
            }
        }
    }
}

static void s_xent_seq_bwd(const tp_op_call_t *c) {
    if (!c->dx[0])
        return;
    size_t rows, v;
    s_rows(c, &rows, &v);
    const int32_t *lab = c->x[1];
    const int32_t ignore = (int32_t)c->attr->alpha;
    size_t counted = 0;
    for (size_t r = 0; r < rows; r++)
        counted += lab[r] != ignore; /* in range: checked in forward */
    s_xs_t xs = {.c = c, .v = v,
                 .g = c->dy[0] / (float)counted * tp_cpu_elementwise_grad_fault,
                 .lse = s_xent_seq_lse(c, rows)};
    tp_cpu_parallel(rows, 1, v ? (S_MIN_ITEMS + v - 1) / v : rows, s_xent_seq_bwd_part, &xs);
}

static tp_status_t s_top_k_fwd(const tp_op_call_t *c) {
    const size_t n = (size_t)c->xshape[0].d[0], v = (size_t)c->xshape[0].d[1];
    const size_t k = (size_t)c->attr->alpha;
    const float *x = c->x[0];
    const int32_t *lab = c->x[1];
    if (c->xshape[1].d[0] != (int64_t)n)
        return tp_error(TP_ERR_SHAPE, "%s: %zu rows of logits but %lld labels", c->name, n,
                        (long long)c->xshape[1].d[0]);
    size_t hits = 0;
    for (size_t r = 0; r < n; r++) {
        if (lab[r] < 0 || (size_t)lab[r] >= v)
            return s_bad_label(c, r, lab[r], v);
        const float *row = x + r * v, at = row[lab[r]];
        size_t above = 0;
        for (size_t j = 0; j < v; j++)
            above += row[j] > at;
        hits += above < k;
    }
    *(float *)c->y = (float)hits / (float)n;
    return TP_OK;
}

/* ---- dispatch ---------------------------------------------------------------- */

size_t tp_cpu_reduce_workspace(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
        return tp_shape_count(&c->yshape) * sizeof(double); /* sums; max: tie counts */
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX: {
        size_t outer, n, inner;
        s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
        return 2 * inner * sizeof(float); /* a max and a sum per inner position */
    }
    case TP_OP_SOFTMAX_XENT_SEQ: /* each row's term, summed in row order, and its lse */
        return tp_shape_count(&c->xshape[1]) * (sizeof(double) + sizeof(float));
    default:
        return 0;
    }
}

tp_status_t tp_cpu_reduce_forward(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
        s_reduce_fwd(c);
        return TP_OK;
    case TP_OP_ARGMAX:
        s_argmax_fwd(c);
        return TP_OK;
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
        s_softmax_fwd(c);
        return TP_OK;
    case TP_OP_SOFTMAX_XENT_SEQ:
        return s_xent_seq_fwd(c);
    case TP_OP_TOP_K_ACCURACY:
        return s_top_k_fwd(c);
    default:
        return tp_error(TP_ERR_UNSUPPORTED, "%s: %s is not a reduce-family op", c->name,
                        tp_op_name(c->kind));
    }
}

tp_status_t tp_cpu_reduce_backward(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
        s_reduce_bwd(c);
        return TP_OK;
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
        s_softmax_bwd(c);
        return TP_OK;
    case TP_OP_SOFTMAX_XENT_SEQ:
        s_xent_seq_bwd(c);
        return TP_OK;
    default: /* argmax, top-k accuracy: no gradient */
        return TP_OK;
    }
}
