/* towerpack gpu: the CPU kernels of the loss family (docs/ops.md).
 *
 * Each loss is the mean over every element of a per-element term of two
 * same-shape inputs. The sum runs in double, so the mean of a large batch
 * (the autoencoder's 128 x 784 pixels) keeps float precision whatever the
 * order; the CUDA kernels sum in double too and agree to rounding.
 *
 * Sigmoid cross-entropy uses max(x,0) - x z + log1p(e^-|x|), which never
 * exponentiates a positive number: finite for any finite logit, and equal
 * to PyTorch's binary_cross_entropy_with_logits. log1p(e^-|x|) is
 * cpu_math.h's s_vsoftplus(-|x|), which keeps log1p's precision where
 * e^-|x| is tiny (it returns e^-|x| itself once 1 + e^-|x| rounds to 1).
 *
 * Forward and backward are one pass each, per loss a loop without a switch
 * inside (the forward's terms and the backward in the per-ISA clones of
 * cpu_math.h; no libm call per element, so GCC vectorises them), on the
 * pool for big tensors. The forward's sum
 * is cut into fixed blocks that depend only on the element count, each
 * summed in eight double lanes, then the block sums in order: the same
 * bits for any thread count. */
#include <math.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_loss.h"

/* Selects become masks (gpu/cpu/cpu_math.h); no FMA contraction, so every
 * clone and the scalar tails round each operation alike. After the
 * includes, so that what they inline keeps the command line's options. */
/* no-thread-jumps: GCC otherwise threads the exp's correlated clamps and
 * selects into two copies of its polynomial (ops_elementwise.c says more). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno", "fp-contract=off", "no-thread-jumps")
#endif
#include "gpu/cpu/cpu_math.h"

/* Elements of one forward block (the unit of the fixed summation order),
 * and at most this many blocks (bigger blocks for bigger tensors). */
#define S_BLOCK 4096
#define S_MAX_BLOCKS 256
/* Elements worth a thread of their own: the cheap losses move 8 bytes an
 * element; sigmoid xent computes an exp and a log. */
#define S_MIN_CHEAP 16384
#define S_MIN_MATH 4096

int tp_cpu_loss_kind(tp_op_kind_t k) {
    return k == TP_OP_MSE || k == TP_OP_L1_LOSS || k == TP_OP_HUBER_LOSS ||
           k == TP_OP_SIGMOID_XENT;
}

/* ---- the per-element terms and gradients --------------------------------- */

static inline float s_mse_t(float a, float b) {
    const float d = a - b;
    return d * d;
}

static inline float s_l1_t(float a, float b) { return fabsf(a - b); }

static inline float s_huber_t(float a, float b, float delta) {
    const float d = a - b, m = fabsf(d);
    return m < delta ? 0.5f * d * d : delta * (m - 0.5f * delta);
}

/* a the logit, b the label. max(a, 0) as a select (fmaxf is a call or a
 * NaN dance): a NaN logit gives NaN either way, through a * b. */
static inline float s_xent_t(float a, float b) {
    const float pos = a > 0.0f ? a : 0.0f;
    return pos - a * b + s_vsoftplus(-fabsf(a));
}

static inline float s_mse_g(float a, float b) { return 2.0f * (a - b); }

/* sign(d), 0 at d == 0 (torch's) */
static inline float s_l1_g(float a, float b) {
    const float d = a - b;
    return (float)((d > 0.0f) - (d < 0.0f));
}

static inline float s_huber_g(float a, float b, float delta) {
    const float d = a - b;
    return d < -delta ? -delta : d > delta ? delta : d;
}

/* d/dx = sigmoid(x) - z (d/dz = -x): e^-x is inf below -88.7, giving 0. */
static inline float s_xent_g(float a, float b) { return 1.0f / (1.0f + s_vexp(-a)) - b; }

/* ---- forward ------------------------------------------------------------- */

typedef struct {
    const tp_op_call_t *c;
    size_t n, block; /* elements, elements per block */
    double *part;    /* one sum per block */
} s_fwd_t;

/* The terms of elements [0, m) into t: a plain float loop per loss, in
 * the per-ISA clones (GCC vectorises each). */
#define S_TERMS(TERM)                                                        \
    do {                                                                     \
        for (size_t j = 0; j < m; j++)                                       \
            t[j] = TERM(a[j], b[j]);                                         \
    } while (0)
#define S_HUBER(x, z) s_huber_t(x, z, delta)

TP_CPU_CLONES static void s_terms(tp_op_kind_t kind, const float *restrict a,
                                  const float *restrict b, float delta, float *restrict t,
                                  size_t m) {
    switch (kind) {
    case TP_OP_MSE: S_TERMS(s_mse_t); break;
    case TP_OP_L1_LOSS: S_TERMS(s_l1_t); break;
    case TP_OP_HUBER_LOSS: S_TERMS(S_HUBER); break;
    default: S_TERMS(s_xent_t); break;
    }
}

/* Blocks [blo, bhi) of a forward: each block's terms S_CHUNK at a time
 * (s_terms), summed in eight double lanes (element i into lane (i - lo)
 * mod 8), added pairwise, then the block's last odd elements in order.
 * This loop stays in the baseline ISA: its double adds measured twice as
 * slow in the AVX-512 and AVX2 clones. */
#define S_CHUNK 512
static void s_fwd_blocks(void *arg, size_t blo, size_t bhi) {
    const s_fwd_t *f = arg;
    const tp_op_call_t *c = f->c;
    const float *a = c->x[0], *b = c->x[1];
    float t[S_CHUNK];
    for (size_t k = blo; k < bhi; k++) {
        const size_t lo = k * f->block, hi = lo + f->block < f->n ? lo + f->block : f->n;
        double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        size_t m = 0, j = 0;
        for (size_t i = lo; i < hi; i += m) {
            m = hi - i < S_CHUNK ? hi - i : S_CHUNK;
            s_terms(c->kind, a + i, b + i, c->attr->alpha, t, m);
            for (j = 0; j + 8 <= m; j += 8)
                for (size_t q = 0; q < 8; q++)
                    l[q] += (double)t[j + q];
        }
        double s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
        for (; j < m; j++) /* the last chunk's odd elements */
            s += (double)t[j];
        f->part[k] = s;
    }
}

tp_status_t tp_cpu_loss_forward(const tp_op_call_t *c) {
    const size_t n = tp_shape_count(&c->xshape[0]);
    /* the block size depends on n alone: the order of the sum does too */
    size_t block = S_BLOCK;
    if ((n + block - 1) / block > S_MAX_BLOCKS)
        block = ((n + S_MAX_BLOCKS - 1) / S_MAX_BLOCKS + 15) / 16 * 16;
    const size_t nb = (n + block - 1) / block;
    double part[S_MAX_BLOCKS];
    s_fwd_t f = {c, n, block, part};
    const size_t min_el = c->kind == TP_OP_SIGMOID_XENT ? S_MIN_MATH : S_MIN_CHEAP;
    tp_cpu_parallel(nb, 1, (min_el + block - 1) / block, s_fwd_blocks, &f);
    double s = 0.0;
    for (size_t k = 0; k < nb; k++)
        s += part[k];
    /* the mean of no elements is NaN, as torch's */
    *(float *)c->y = (float)(s / (double)n);
    return TP_OK;
}

/* ---- backward ------------------------------------------------------------ */

/* dx0 and dx1 over [lo, hi) from G0 (the gradient of one term with
 * respect to input 0) and G1 (input 1), expressions of a[i] and b[i],
 * both scaled by dy / n: one loop
 * writing both where both are asked with the same accumulation, else a
 * loop each. */
#define S_BWD(G0, G1)                                                        \
    do {                                                                     \
        if (d0 && d1 && acc0 == acc1) {                                      \
            if (acc0)                                                        \
                for (size_t i = 0; i < m; i++) {                             \
                    d0[i] += scale * (G0);                                   \
                    d1[i] += scale * (G1);                                   \
                }                                                            \
            else                                                             \
                for (size_t i = 0; i < m; i++) {                             \
                    d0[i] = scale * (G0);                                    \
                    d1[i] = scale * (G1);                                    \
                }                                                            \
            break;                                                           \
        }                                                                    \
        if (d0)                                                              \
            GRAD_STORE(d0, acc0, m, scale * (G0));                           \
        if (d1)                                                              \
            GRAD_STORE(d1, acc1, m, scale * (G1));                           \
    } while (0)

TP_CPU_CLONES static void s_bwd(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const size_t n = tp_shape_count(&c->xshape[0]), m = hi - lo;
    const float *restrict a = (const float *)c->x[0] + lo;
    const float *restrict b = (const float *)c->x[1] + lo;
    const float delta = c->attr->alpha;
    /* dy / n, and the gradient checks' deliberate fault (ops_elementwise.h;
     * exactly 1 outside them) */
    const float scale = c->dy[0] / (float)n * tp_cpu_elementwise_grad_fault;
    float *restrict d0 = c->dx[0] ? c->dx[0] + lo : NULL;
    float *restrict d1 = c->dx[1] ? c->dx[1] + lo : NULL;
    const int acc0 = d0 && c->dx_acc[0], acc1 = d1 && c->dx_acc[1];
    switch (c->kind) {
    case TP_OP_MSE: S_BWD(s_mse_g(a[i], b[i]), -s_mse_g(a[i], b[i])); break;
    case TP_OP_L1_LOSS: S_BWD(s_l1_g(a[i], b[i]), -s_l1_g(a[i], b[i])); break;
    case TP_OP_HUBER_LOSS:
        S_BWD(s_huber_g(a[i], b[i], delta), -s_huber_g(a[i], b[i], delta));
        break;
    default: S_BWD(s_xent_g(a[i], b[i]), -a[i]); break;
    }
}

tp_status_t tp_cpu_loss_backward(const tp_op_call_t *c) {
    const size_t n = tp_shape_count(&c->xshape[0]);
    tp_cpu_parallel(n, 16, c->kind == TP_OP_SIGMOID_XENT ? S_MIN_MATH : S_MIN_CHEAP, s_bwd,
                    (void *)c);
    return TP_OK;
}
