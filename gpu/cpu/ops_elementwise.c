/* towerpack gpu: the CPU kernels of the elementwise family (docs/ops.md).
 *
 * Binary ops broadcast as NumPy does. The shapes are reduced to a few
 * "coalesced" dims (neighbours merged where both operands walk them as one
 * run), so the inner loop is long and has fixed strides (1, or 0 for a
 * stretched operand): the same-shape case is one flat loop. A stretched
 * operand's gradient is summed over the stretched dims into its own buffer
 * in the output's order. The activations the image models used first
 * (relu, leaky relu, tanh, scale) and the same-shape add keep their loops
 * as they were, so those models train to the same bits; the sigmoid went
 * to the FMA forms with exp and log (s_math_fma_fwd), its values within 4
 * ulp of before (the better e^x: 2,000,001 points over [-87, 87]). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"

/* Selects become masks, not branches (gpu/cpu/cpu_math.h), and sqrtf
 * one instruction without the errno check: values are unchanged, and the
 * loops below vectorise. (GCC reads math-errno when it declares its
 * builtins, before this pragma: CMakeLists.txt gives this file
 * -fno-math-errno, without which sqrt and rsqrt stay a scalar sqrtss and
 * a branch per item.) No contraction into FMA (which the AVX-512 clone
 * below would otherwise do): every clone rounds each operation alike.
 * No jump threading: s_vexp's clamps (x against -87.3 and 88.7) and its
 * final selects (the same tests) are correlated conditions, and GCC
 * threaded them into two copies of the polynomial that the vectoriser
 * then computed both of under masks, some 60 vector operations a lane
 * group instead of 35 (exp's forward 280 -> 183 us at one thread for
 * 128x16x14x14, tanh, sigmoid, gelu, softplus and pow alike: the same
 * bits, only the control flow changes). After the includes, so that what
 * they inline keeps the command line's options. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno", "fp-contract=off", "no-thread-jumps")
#endif
#include "gpu/cpu/cpu_math.h"

/* The unary loops three times, per ISA (TP_CPU_CLONES, cpu_math.h). */
#define S_CLONES TP_CPU_CLONES

/* Items of a range worth a thread of their own (gpu/cpu/cpu_pool.h): a
 * memory-bound op (an add, relu) moves 12 bytes an item, a transcendental
 * one computes some 40 operations. Below twice that, one thread. Parts
 * start at multiples of S_ALIGN items (whole vectors). */
#define S_MIN_CHEAP 16384
#define S_MIN_MATH 4096
#define S_ALIGN 16

float tp_cpu_elementwise_grad_fault = 1.0f;

static size_t s_count(const tp_shape_t *s) { return tp_shape_count(s); }

static int s_same(const tp_shape_t *a, const tp_shape_t *b) {
    return a->ndim == b->ndim &&
           !memcmp(a->d, b->d, sizeof(int64_t) * (size_t)a->ndim);
}

/* ---- broadcasting ------------------------------------------------------- */

/* The output's dims, coalesced, with each operand's stride per dim (0
 * where it is stretched). nd >= 1. */
typedef struct {
    int nd;
    int64_t d[TP_MAX_DIMS];
    int64_t s[2][TP_MAX_DIMS];
} s_bc_t;

static void s_bc_init(s_bc_t *bc, const tp_shape_t *y, const tp_shape_t *const *xs) {
    const int r = y->ndim;
    int64_t d[TP_MAX_DIMS], st[2][TP_MAX_DIMS];
    for (int p = 0; p < 2; p++) {
        int64_t acc = 1;
        for (int j = r - 1; j >= 0; j--) {
            const int ip = j - (r - xs[p]->ndim);
            const int64_t n = ip >= 0 ? xs[p]->d[ip] : 1;
            st[p][j] = n == 1 ? 0 : acc;
            acc *= n;
        }
    }
    for (int j = 0; j < r; j++)
        d[j] = y->d[j];
    /* drop size-1 dims, then merge an outer dim into the next inner one
     * where both operands step through them as one run */
    int nd = 0;
    for (int j = 0; j < r; j++) {
        if (d[j] == 1)
            continue;
        if (nd > 0 && bc->s[0][nd - 1] == st[0][j] * d[j] &&
            bc->s[1][nd - 1] == st[1][j] * d[j]) {
            bc->d[nd - 1] *= d[j];
            bc->s[0][nd - 1] = st[0][j];
            bc->s[1][nd - 1] = st[1][j];
            continue;
        }
        bc->d[nd] = d[j];
        bc->s[0][nd] = st[0][j];
        bc->s[1][nd] = st[1][j];
        nd++;
    }
    if (nd == 0) {
        bc->d[0] = 1;
        bc->s[0][0] = bc->s[1][0] = 0;
        nd = 1;
    }
    bc->nd = nd;
}

/* Runs BODY for every output element o of a part, with ia and ib the
 * operands' elements: coalesced dim K's index over [LO, HI), every other
 * dim over all of it, in the order of the whole walk (so an element that
 * several outputs add into sees them in the same order, whatever the
 * cut). The inner loop is the last coalesced dim, with constant strides
 * where they are 1 and 0 (GCC vectorises those). */
#define BC_INNER(SA, SB, BODY)                                               \
    for (int64_t j_ = jlo_; j_ < jhi_; j_++) {                               \
        const size_t o = o0_ + (size_t)j_;                                   \
        const size_t ia = a0_ + (size_t)(j_ * (SA));                         \
        const size_t ib = b0_ + (size_t)(j_ * (SB));                         \
        (void)ia;                                                            \
        (void)ib;                                                            \
        BODY;                                                                \
    }
#define BC_PART(bc, K, LO, HI, ROW)                                          \
    do {                                                                     \
        const s_bc_t *bc_ = (bc);                                            \
        const int nd_ = bc_->nd, k_split_ = (K);                             \
        const int64_t sa_ = bc_->s[0][nd_ - 1], sb_ = bc_->s[1][nd_ - 1];    \
        int64_t os_[TP_MAX_DIMS], idx_[TP_MAX_DIMS] = {0},                   \
            lim_[TP_MAX_DIMS] = {0}, st_[TP_MAX_DIMS] = {0};                 \
        os_[nd_ - 1] = 1;                                                    \
        for (int k_ = nd_ - 2; k_ >= 0; k_--)                                \
            os_[k_] = os_[k_ + 1] * bc_->d[k_ + 1];                          \
        size_t o0_ = 0, a0_ = 0, b0_ = 0;                                    \
        int64_t outer_ = 1;                                                  \
        for (int k_ = 0; k_ < nd_; k_++) {                                   \
            st_[k_] = k_ == k_split_ ? (int64_t)(LO) : 0;                    \
            lim_[k_] = k_ == k_split_ ? (int64_t)(HI) : bc_->d[k_];          \
            idx_[k_] = st_[k_];                                              \
            if (k_ < nd_ - 1) {                                              \
                outer_ *= lim_[k_] - st_[k_];                                \
                o0_ += (size_t)(st_[k_] * os_[k_]);                          \
                a0_ += (size_t)(st_[k_] * bc_->s[0][k_]);                    \
                b0_ += (size_t)(st_[k_] * bc_->s[1][k_]);                    \
            }                                                                \
        }                                                                    \
        const int64_t jlo_ = st_[nd_ - 1], jhi_ = lim_[nd_ - 1];             \
        for (int64_t q_ = 0; q_ < outer_; q_++) {                            \
            ROW;                                                             \
            for (int k_ = nd_ - 2; k_ >= 0; k_--) {                          \
                o0_ += (size_t)os_[k_];                                      \
                a0_ += (size_t)bc_->s[0][k_];                                \
                b0_ += (size_t)bc_->s[1][k_];                                \
                if (++idx_[k_] < lim_[k_])                                   \
                    break;                                                   \
                const int64_t back_ = lim_[k_] - st_[k_];                    \
                o0_ -= (size_t)(os_[k_] * back_);                            \
                a0_ -= (size_t)(bc_->s[0][k_] * back_);                      \
                b0_ -= (size_t)(bc_->s[1][k_] * back_);                      \
                idx_[k_] = st_[k_];                                          \
            }                                                                \
        }                                                                    \
    } while (0)

/* A row of BODY with the inner strides as constants where they can be. */
#define BC_ROW(BODY)                                                         \
    do {                                                                     \
        if (sa_ == 1 && sb_ == 1) {                                          \
            BC_INNER(1, 1, BODY)                                             \
        } else if (sa_ == 1 && sb_ == 0) {                                   \
            BC_INNER(1, 0, BODY)                                             \
        } else if (sa_ == 0 && sb_ == 1) {                                   \
            BC_INNER(0, 1, BODY)                                             \
        } else {                                                             \
            BC_INNER(sa_, sb_, BODY)                                         \
        }                                                                    \
    } while (0)

/* One binary call and the part of it a thread runs. */
typedef struct {
    const tp_op_call_t *c;
    s_bc_t bc;
    int k;    /* the coalesced dim the parts cut (-1: none) */
    int p;    /* the backward's operand */
} s_bin_t;

/* The dim to cut for the forward (p -1) or for operand p's gradient: the
 * outermost dim the operand is not stretched along, so that two parts
 * never add into one element of its gradient (-1 when it is stretched
 * along all: one part). */
static int s_bc_cut(const s_bc_t *bc, int p) {
    for (int k = 0; k < bc->nd; k++)
        if (bc->d[k] > 1 && (p < 0 || bc->s[p][k] != 0))
            return k;
    return -1;
}

/* Runs fn over the parts of dim b->k (one part when it is -1). */
static void s_bin_par(s_bin_t *b, tp_cpu_range_fn fn) {
    if (b->k < 0) {
        b->k = 0;
        fn(b, 0, (size_t)b->bc.d[0]);
        return;
    }
    /* output elements per index of dim k: a part walks every other dim
     * whole (the dims outside k too: a stretched operand's gradient cut
     * along its channels sums all the samples of each) */
    size_t per = 1;
    for (int k = 0; k < b->bc.nd; k++)
        if (k != b->k)
            per *= (size_t)b->bc.d[k];
    const size_t min = (S_MIN_CHEAP + per - 1) / per;
    tp_cpu_parallel((size_t)b->bc.d[b->k], b->k == b->bc.nd - 1 ? S_ALIGN : 1, min, fn, b);
}

S_CLONES static void s_binary_fwd_part(void *arg, size_t lo, size_t hi) {
    const s_bin_t *bn = arg;
    const tp_op_call_t *c = bn->c;
    const float *restrict a = c->x[0], *restrict b = c->x[1];
    float *restrict y = c->y;
    switch (c->kind) {
    case TP_OP_ADD: BC_PART(&bn->bc, bn->k, lo, hi, BC_ROW(y[o] = a[ia] + b[ib])); break;
    case TP_OP_SUB: BC_PART(&bn->bc, bn->k, lo, hi, BC_ROW(y[o] = a[ia] - b[ib])); break;
    case TP_OP_MUL: BC_PART(&bn->bc, bn->k, lo, hi, BC_ROW(y[o] = a[ia] * b[ib])); break;
    case TP_OP_DIV: BC_PART(&bn->bc, bn->k, lo, hi, BC_ROW(y[o] = a[ia] / b[ib])); break;
    /* a NaN on either side is the result, as torch.maximum/minimum */
    case TP_OP_MAXIMUM:
        BC_PART(&bn->bc, bn->k, lo, hi,
                BC_ROW(y[o] = a[ia] >= b[ib] || a[ia] != a[ia] ? a[ia] : b[ib]));
        break;
    case TP_OP_MINIMUM:
        BC_PART(&bn->bc, bn->k, lo, hi,
                BC_ROW(y[o] = a[ia] <= b[ib] || a[ia] != a[ia] ? a[ia] : b[ib]));
        break;
    default: break;
    }
}

/* The same-shape add, items [lo, hi). */
static void s_add_same(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const float *restrict a = (const float *)c->x[0] + lo, *restrict b = (const float *)c->x[1] + lo;
    float *restrict y = (float *)c->y + lo;
    for (size_t i = 0; i < hi - lo; i++)
        y[i] = a[i] + b[i];
}

/* The other binary ops on operands of the output's shape, items [lo, hi):
 * one flat loop per ISA, where the broadcasting walk (BC_PART) ran its
 * general row loop and, backward, zeroed each gradient before adding into
 * it. The same expressions, so the same values; a stored gradient is
 * 0 + g as the zeroed buffer's add made it (a -0 stays +0). */
S_CLONES static void s_bin_same(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const size_t n = hi - lo;
    const float *restrict a = (const float *)c->x[0] + lo, *restrict b = (const float *)c->x[1] + lo;
    float *restrict y = (float *)c->y + lo;
    switch (c->kind) {
    case TP_OP_SUB: for (size_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;
    case TP_OP_MUL: for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;
    case TP_OP_DIV: for (size_t i = 0; i < n; i++) y[i] = a[i] / b[i]; break;
    case TP_OP_MAXIMUM:
        for (size_t i = 0; i < n; i++)
            y[i] = a[i] >= b[i] || a[i] != a[i] ? a[i] : b[i];
        break;
    case TP_OP_MINIMUM:
        for (size_t i = 0; i < n; i++)
            y[i] = a[i] <= b[i] || a[i] != a[i] ? a[i] : b[i];
        break;
    default: break;
    }
}

S_CLONES static void s_bin_same_bwd(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const size_t n = hi - lo;
    const float *restrict a = (const float *)c->x[0] + lo, *restrict b = (const float *)c->x[1] + lo;
    const float *restrict dy = c->dy + lo;
#define S_SAME_GRAD(P, EXPR)                                                   \
    do {                                                                       \
        if (c->dx[P]) {                                                        \
            float *restrict g_ = c->dx[P] + lo;                                \
            if (c->dx_acc[P])                                                  \
                for (size_t i = 0; i < n; i++)                                 \
                    g_[i] += (EXPR);                                           \
            else                                                               \
                for (size_t i = 0; i < n; i++)                                 \
                    g_[i] = 0.0f + (EXPR);                                     \
        }                                                                      \
    } while (0)
    switch (c->kind) {
    case TP_OP_SUB:
        S_SAME_GRAD(0, dy[i]);
        S_SAME_GRAD(1, -dy[i]);
        break;
    case TP_OP_MUL:
        S_SAME_GRAD(0, dy[i] * b[i]);
        S_SAME_GRAD(1, dy[i] * a[i]);
        break;
    case TP_OP_DIV:
        S_SAME_GRAD(0, dy[i] / b[i]);
        S_SAME_GRAD(1, -dy[i] * a[i] / (b[i] * b[i]));
        break;
    case TP_OP_MAXIMUM:
        S_SAME_GRAD(0, a[i] > b[i] ? dy[i] : a[i] == b[i] ? 0.5f * dy[i] : 0.0f);
        S_SAME_GRAD(1, b[i] > a[i] ? dy[i] : a[i] == b[i] ? 0.5f * dy[i] : 0.0f);
        break;
    case TP_OP_MINIMUM:
        S_SAME_GRAD(0, a[i] < b[i] ? dy[i] : a[i] == b[i] ? 0.5f * dy[i] : 0.0f);
        S_SAME_GRAD(1, b[i] < a[i] ? dy[i] : a[i] == b[i] ? 0.5f * dy[i] : 0.0f);
        break;
    default: break;
    }
#undef S_SAME_GRAD
}

static void s_binary_fwd(const tp_op_call_t *c) {
    if (c->kind == TP_OP_ADD && s_same(&c->xshape[0], &c->yshape) &&
        s_same(&c->xshape[1], &c->yshape)) {
        /* the image models' residual add: as it always ran */
        tp_cpu_parallel(s_count(&c->yshape), S_ALIGN, S_MIN_CHEAP, s_add_same, (void *)c);
        return;
    }
    if (s_same(&c->xshape[0], &c->yshape) && s_same(&c->xshape[1], &c->yshape)) {
        tp_cpu_parallel(s_count(&c->yshape), S_ALIGN, S_MIN_CHEAP, s_bin_same, (void *)c);
        return;
    }
    const tp_shape_t *xs[2] = {&c->xshape[0], &c->xshape[1]};
    s_bin_t b = {.c = c, .p = -1};
    s_bc_init(&b.bc, &c->yshape, xs);
    b.k = s_bc_cut(&b.bc, -1);
    s_bin_par(&b, s_binary_fwd_part);
}

/* dx[p] of a binary op: GA (operand 0) or GB (operand 1) of dy[o], a[ia],
 * b[ib], summed into dx[p] at the operand's own index (its stretched dims
 * add up). Where the operand is stretched along the inner dim, a row adds
 * into one element: in eight lanes (element j into lane j mod 8), added
 * pairwise, then into the element, so the row is not one chain of adds
 * each waiting for the last. */
#define BINARY_GRAD_ROW(IDX, BASE, SP, EXPR)                                    \
    do {                                                                     \
        if (SP == 0) {                                                       \
            float l_[8] = {0, 0, 0, 0, 0, 0, 0, 0};                          \
            int64_t j8_ = jlo_;                                              \
            for (; j8_ + 8 <= jhi_; j8_ += 8)                                \
                for (int t_ = 0; t_ < 8; t_++) {                             \
                    const int64_t j_ = j8_ + t_;                             \
                    const size_t o = o0_ + (size_t)j_;                       \
                    const size_t ia = a0_ + (size_t)(j_ * sa_);              \
                    const size_t ib = b0_ + (size_t)(j_ * sb_);              \
                    (void)ia;                                                \
                    (void)ib;                                                \
                    l_[t_] += (EXPR);                                        \
                }                                                            \
            for (int64_t j_ = j8_; j_ < jhi_; j_++) {                        \
                const size_t o = o0_ + (size_t)j_;                           \
                const size_t ia = a0_ + (size_t)(j_ * sa_);                  \
                const size_t ib = b0_ + (size_t)(j_ * sb_);                  \
                (void)ia;                                                    \
                (void)ib;                                                    \
                l_[0] += (EXPR);                                             \
            }                                                                \
            g_[BASE] += ((l_[0] + l_[1]) + (l_[2] + l_[3])) +             \
                           ((l_[4] + l_[5]) + (l_[6] + l_[7]));              \
        } else {                                                             \
            BC_ROW(g_[IDX] += (EXPR));                                       \
        }                                                                    \
    } while (0)

S_CLONES static void s_binary_grad_part(void *arg, size_t lo, size_t hi) {
    const s_bin_t *bn = arg;
    const tp_op_call_t *c = bn->c;
    const float *restrict a = c->x[0], *restrict b = c->x[1], *restrict dy = c->dy;
    float *restrict g_ = c->dx[bn->p];
    const int p = bn->p;
#define GRAD(GA, GB)                                                          \
    do {                                                                      \
        if (p == 0)                                                           \
            BC_PART(&bn->bc, bn->k, lo, hi, BINARY_GRAD_ROW(ia, a0_, sa_, GA));    \
        else                                                                  \
            BC_PART(&bn->bc, bn->k, lo, hi, BINARY_GRAD_ROW(ib, b0_, sb_, GB));    \
    } while (0)
    switch (c->kind) {
    case TP_OP_ADD: GRAD(dy[o], dy[o]); break;
    case TP_OP_SUB: GRAD(dy[o], -dy[o]); break;
    case TP_OP_MUL: GRAD(dy[o] * b[ib], dy[o] * a[ia]); break;
    case TP_OP_DIV: GRAD(dy[o] / b[ib], -dy[o] * a[ia] / (b[ib] * b[ib])); break;
    /* ties: half to each side, as PyTorch */
    case TP_OP_MAXIMUM:
        GRAD(a[ia] > b[ib] ? dy[o] : a[ia] == b[ib] ? 0.5f * dy[o] : 0.0f,
             b[ib] > a[ia] ? dy[o] : a[ia] == b[ib] ? 0.5f * dy[o] : 0.0f);
        break;
    case TP_OP_MINIMUM:
        GRAD(a[ia] < b[ib] ? dy[o] : a[ia] == b[ib] ? 0.5f * dy[o] : 0.0f,
             b[ib] < a[ia] ? dy[o] : a[ia] == b[ib] ? 0.5f * dy[o] : 0.0f);
        break;
    default:
        break;
    }
#undef GRAD
}

/* add, sub and mul of a full operand q ([N, C, S] as coalesced, or
 * [C, S] when N is 1) and a per-channel one p (strides 0, 1, 0: a conv's
 * bias as 1xCx1x1): both gradients in one pass over dy, by channels. The
 * general walk ran three: a memset of dx[q], dx[q] += dy, then dy again
 * for p's sums (add_bcast's backward, 128x16x14x14: 8 MB of traffic
 * instead of 3). Each row is stored into dx[q] and then summed from L1
 * in BINARY_GRAD_ROW's lanes and order, and a channel's rows in sample
 * order, so both gradients keep their bits (dx[q] as 0 + g, as the
 * zeroed buffer's add made it), whatever the cut. */
typedef float s_v8 __attribute__((vector_size(32)));

typedef struct {
    const tp_op_call_t *c;
    int p, q;
    size_t n, ch, sp;
    float *rs; /* the rows' sums for dx[p] (NULL: not wanted) */
} s_chan_t;

/* p and q when the call is that shape (0 when not). */
static int s_chan_init(s_chan_t *t, const tp_op_call_t *c, const s_bc_t *bc) {
    if (c->kind != TP_OP_ADD && c->kind != TP_OP_SUB && c->kind != TP_OP_MUL)
        return 0;
    const int nd = bc->nd;
    if (nd != 2 && nd != 3)
        return 0;
    const int64_t ch = bc->d[nd - 2], sp = bc->d[nd - 1];
    for (int p = 0; p < 2; p++) {
        const int q = 1 - p;
        const int64_t *sp_ = bc->s[p] + nd - 2, *sq_ = bc->s[q] + nd - 2;
        if (sp_[0] != 1 || sp_[1] != 0 || sq_[0] != sp || sq_[1] != 1)
            continue;
        if (nd == 3 && (bc->s[p][0] != 0 || bc->s[q][0] != ch * sp))
            continue;
        *t = (s_chan_t){c, p, q, nd == 3 ? (size_t)bc->d[0] : 1, (size_t)ch, (size_t)sp, NULL};
        return 1;
    }
    return 0;
}

/* Rows [lo, hi) of the N C rows: dx[q]'s row stored, and the row's sum
 * for p into rs[row] (BINARY_GRAD_ROW's lanes and order, the eight lanes
 * as one vector: GCC's own vectorising of the lane array shuffled 16-lane
 * registers into 8). The rows are cut as they lie in memory (the cores
 * never share a line but at a part's ends), and s_chan_sums adds rs into
 * dx[p] afterwards, a channel's rows in sample order, one thread: the
 * cut by channels that this replaced wrote every part's sums into one
 * cache line of dx[p] per row (2,048 bounces a call at 128x16, most of
 * the backward's 130 us on two threads). */
S_CLONES static void s_chan_rows(void *arg, size_t lo, size_t hi) {
    const s_chan_t *t = arg;
    const tp_op_call_t *c = t->c;
    const float *restrict xp = c->x[t->p], *restrict xq = c->x[t->q], *restrict dy = c->dy;
    float *restrict gq = c->dx[t->q], *restrict rs = t->rs;
    const int mul = c->kind == TP_OP_MUL, accq = c->dx_acc[t->q];
    /* sub: -dy for operand 1 (dy times -1: the same bits as -dy) */
    const float sgp = c->kind == TP_OP_SUB && t->p == 1 ? -1.0f : 1.0f;
    const float sgq = c->kind == TP_OP_SUB && t->q == 1 ? -1.0f : 1.0f;
    const size_t sp = t->sp;
    for (size_t r = lo; r < hi; r++) {
        const size_t k = r % t->ch, o = r * sp;
        const float *restrict d = dy + o;
        if (gq) {
            const float m = mul ? xp[k] : sgq;
            float *restrict g = gq + o;
            if (accq)
                for (size_t j = 0; j < sp; j++) g[j] += d[j] * m;
            else
                for (size_t j = 0; j < sp; j++) g[j] = 0.0f + d[j] * m;
        }
        if (rs) {
            s_v8 lv = {0, 0, 0, 0, 0, 0, 0, 0}, dv, vv;
            size_t j8 = 0;
            float l[8];
            if (mul) {
                const float *restrict v = xq + o;
                for (; j8 + 8 <= sp; j8 += 8) {
                    memcpy(&dv, d + j8, sizeof dv);
                    memcpy(&vv, v + j8, sizeof vv);
                    lv += dv * vv;
                }
                memcpy(l, &lv, sizeof l);
                for (size_t j = j8; j < sp; j++) l[0] += d[j] * v[j];
            } else {
                for (; j8 + 8 <= sp; j8 += 8) {
                    memcpy(&dv, d + j8, sizeof dv);
                    lv += dv * sgp;
                }
                memcpy(l, &lv, sizeof l);
                for (size_t j = j8; j < sp; j++) l[0] += d[j] * sgp;
            }
            rs[r] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
        }
    }
}

/* The same-shape add's gradients, items [lo, hi). */
static void s_add_same_bwd(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const float *restrict dy = c->dy + lo;
    const size_t n = hi - lo;
    for (int k = 0; k < 2; k++)
        if (c->dx[k]) {
            float *restrict dx = c->dx[k] + lo;
            GRAD_STORE(dx, c->dx_acc[k], n, dy[i]);
        }
}

static void s_binary_bwd(const tp_op_call_t *c) {
    if (c->kind == TP_OP_ADD && s_same(&c->xshape[0], &c->yshape) &&
        s_same(&c->xshape[1], &c->yshape)) {
        tp_cpu_parallel(s_count(&c->yshape), S_ALIGN, S_MIN_CHEAP, s_add_same_bwd, (void *)c);
        return;
    }
    if (s_same(&c->xshape[0], &c->yshape) && s_same(&c->xshape[1], &c->yshape)) {
        tp_cpu_parallel(s_count(&c->yshape), S_ALIGN, S_MIN_CHEAP, s_bin_same_bwd, (void *)c);
        return;
    }
    const tp_shape_t *xs[2] = {&c->xshape[0], &c->xshape[1]};
    s_bin_t b = {.c = c};
    s_bc_init(&b.bc, &c->yshape, xs);
    s_chan_t ct;
    if (s_chan_init(&ct, c, &b.bc) &&
        (!c->dx[ct.p] || (ct.rs = malloc(ct.n * ct.ch * sizeof(float))))) {
        const size_t rows = ct.n * ct.ch;
        tp_cpu_parallel(rows, 1, (S_MIN_CHEAP + ct.sp - 1) / ct.sp, s_chan_rows, &ct);
        if (ct.rs) {
            float *restrict gp = c->dx[ct.p];
            if (!c->dx_acc[ct.p])
                memset(gp, 0, ct.ch * sizeof(float));
            for (size_t r = 0; r < rows; r++)
                gp[r % ct.ch] += ct.rs[r];
            free(ct.rs);
        }
        return;
    }
    for (int p = 0; p < 2; p++) {
        if (!c->dx[p])
            continue;
        if (!c->dx_acc[p])
            memset(c->dx[p], 0, s_count(&c->xshape[p]) * sizeof(float));
        b.p = p;
        b.k = s_bc_cut(&b.bc, p);
        s_bin_par(&b, s_binary_grad_part);
    }
}

/* ---- the image models' activations ------------------------------------- */

/* Items [lo, hi) of the call (the pool's range functions). */
S_CLONES static void s_unary_fwd(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const size_t n = hi - lo;
    const float *restrict x = (const float *)c->x[0] + lo;
    float *restrict y = (float *)c->y + lo;
    const float a = c->attr->alpha;
    switch (c->kind) {
    case TP_OP_RELU:
        for (size_t i = 0; i < n; i++) {
            const float v = x[i];
            y[i] = v > 0.0f ? v : 0.0f;
        }
        break;
    case TP_OP_LEAKY_RELU: /* v or a v, as before, as a mask */
        for (size_t i = 0; i < n; i++) {
            const float v = x[i], vl = a * v;
            y[i] = v > 0.0f ? v : vl;
        }
        break;
    case TP_OP_TANH:
        for (size_t i = 0; i < n; i++)
            y[i] = s_vtanh(x[i]);
        break;
    case TP_OP_SCALE:
        for (size_t i = 0; i < n; i++)
            y[i] = a * x[i];
        break;
    default:
        break;
    }
}

/* Branch-free forms: relu masks are data-dependent coin flips that a
 * branch predictor cannot learn. */
S_CLONES static void s_unary_bwd(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const size_t n = hi - lo;
    const float *restrict x = (const float *)c->x[0] + lo,
                          *restrict y = (const float *)c->y + lo,
                          *restrict dy = c->dy + lo;
    float *restrict dx = c->dx[0] + lo;
    const int acc = c->dx_acc[0];
    const float a = c->attr->alpha;
    switch (c->kind) {
    case TP_OP_RELU:
        /* an unconditional load and a select against 0: GCC vectorises
         * exactly this form */
        if (acc) {
            for (size_t i = 0; i < n; i++) {
                const float g = dy[i];
                dx[i] += x[i] > 0.0f ? g : 0.0f;
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                const float g = dy[i];
                dx[i] = x[i] > 0.0f ? g : 0.0f;
            }
        }
        break;
    case TP_OP_LEAKY_RELU:
        GRAD_STORE(dx, acc, n, x[i] > 0.0f ? dy[i] : a * dy[i]);
        break;
    case TP_OP_TANH:
        GRAD_STORE(dx, acc, n, dy[i] * (1.0f - y[i] * y[i]));
        break;
    case TP_OP_SIGMOID:
        GRAD_STORE(dx, acc, n, dy[i] * y[i] * (1.0f - y[i]));
        break;
    case TP_OP_SCALE:
        GRAD_STORE(dx, acc, n, a * dy[i]);
        break;
    default:
        break;
    }
}


/* ---- the other unary ops ------------------------------------------------ */

/* The ops of e^x and log check their items' range block by block rather
 * than item by item: on a positive normal float log and pow run cpu_math.h's
 * vectorised log and e^x (log within Cephes' 1-2 ulp; pow as e^(p log x),
 * relative error about |p log x| 1e-7, inside the parity suite's 1e-5),
 * and zero, negatives, denormals, inf and NaN take libm's answer; e^x's
 * fast form covers [-87.3, 88], the rest takes s_vexp's clamps. S_BLOCKED
 * runs `DST FAST` over blocks of 256 items (a loop GCC vectorises, with
 * an OR of the items' !OK; FAST computed for every item, then selected,
 * since GCC does not if-convert a conditional fmaf), then, only in a
 * block that had one, `DST SLOW` where !OK (FAST is 0 there, so a +=
 * adds SLOW alone). S_FIXED, for a plain store: FAST unselected, the
 * bad items' garbage overwritten by SLOW (a select and its compare less a
 * vector). i is the item. */
#define S_POS_NORMAL(v) ((v) >= 1.17549435e-38f && (v) < INFINITY)
#define S_BLOCKED(DST, OK, FAST, SLOW)                                         \
    for (size_t b_ = 0; b_ < n; b_ += 256) {                                   \
        const size_t e_ = n - b_ < 256 ? n : b_ + 256;                         \
        int bad_ = 0;                                                          \
        for (size_t i = b_; i < e_; i++) {                                     \
            const float f_ = (FAST);                                           \
            bad_ |= !(OK);                                                     \
            DST(OK) ? f_ : 0.0f;                                               \
        }                                                                      \
        if (bad_)                                                              \
            for (size_t i = b_; i < e_; i++)                                   \
                if (!(OK))                                                     \
                    DST SLOW;                                                  \
    }
#define S_FIXED(DST, OK, FAST, SLOW)                                           \
    for (size_t b_ = 0; b_ < n; b_ += 256) {                                   \
        const size_t e_ = n - b_ < 256 ? n : b_ + 256;                         \
        int bad_ = 0;                                                          \
        for (size_t i = b_; i < e_; i++) {                                     \
            bad_ |= !(OK);                                                     \
            DST FAST;                                                          \
        }                                                                      \
        if (bad_)                                                              \
            for (size_t i = b_; i < e_; i++)                                   \
                if (!(OK))                                                     \
                    DST SLOW;                                                  \
    }
/* x inside e^x's fast range (s_vexp_fma_core) */
#define S_EXP_OK(v) ((v) >= -87.3f && (v) <= 88.0f)


S_CLONES static void s_math_fwd(void *arg, size_t lo, size_t end) {
    const tp_op_call_t *c = arg;
    const size_t n = end - lo;
    const float *restrict x = (const float *)c->x[0] + lo;
    float *restrict y = (float *)c->y + lo;
    const float p = c->attr->alpha, hi = c->attr->beta;
    switch (c->kind) {
    case TP_OP_NEG: for (size_t i = 0; i < n; i++) y[i] = -x[i]; break;
    case TP_OP_ABS: for (size_t i = 0; i < n; i++) y[i] = fabsf(x[i]); break;
    case TP_OP_SQUARE: for (size_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;
    case TP_OP_SQRT: for (size_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
    case TP_OP_RSQRT: for (size_t i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]); break;
    case TP_OP_POW: /* p == 2 (s_math_fma_fwd: the others): powf's own
                     * answer, x x is one rounding */
        for (size_t i = 0; i < n; i++) y[i] = x[i] * x[i];
        break;
    case TP_OP_CLIP:
        for (size_t i = 0; i < n; i++) {
            const float v = x[i] < p ? p : x[i];
            y[i] = v > hi ? hi : v;
        }
        break;
    case TP_OP_STOP_GRADIENT:
        if (y != x)
            memcpy(y, x, n * sizeof(float));
        break;
    case TP_OP_CONSTANT:
        memcpy(y, (const float *)c->attr->data + lo, n * sizeof(float));
        break;
    default:
        break;
    }
}

/* The tanh GELU, v sigmoid(2u) (cpu_math.h), alone in clones by x86-64
 * level: its fused multiply-adds need v3's or v4's FMA, and the other
 * unary loops keep their clones (and bits) as they were. */
TP_CPU_CLONES_FMA static void s_gelu_tanh_fwd(void *arg, size_t lo, size_t end) {
    const tp_op_call_t *c = arg;
    const size_t n = end - lo;
    const float *restrict x = (const float *)c->x[0] + lo;
    float *restrict y = (float *)c->y + lo;
    for (size_t i = 0; i < n; i++)
        y[i] = s_vgelu_tanh(x[i]);
}

/* The ops made of e^x and log in clones by x86-64 level, their e^x and
 * log in fused multiply-adds (cpu_math.h's s_vexp_fma_core, s_vlog_fma:
 * some 20 operations where s_vexp and s_vlog take 30-35, and as exact):
 * on AVX-512 PyTorch's own e^x and log are FMA polynomials, and these
 * rows were its equal or 10% slower with the unfused forms (issue 42,
 * docs/performance.md). The baseline clone calls libm's fmaf: the same
 * bits, slower. */
static int s_fma_kind(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_EXP: case TP_OP_LOG: case TP_OP_SIGMOID: case TP_OP_SILU:
    case TP_OP_SOFTPLUS: case TP_OP_GELU:
        return 1;
    case TP_OP_POW:
        return c->attr->alpha != 2.0f;
    default:
        return 0;
    }
}

TP_CPU_CLONES_FMA static void s_math_fma_fwd(void *arg, size_t lo, size_t end) {
    const tp_op_call_t *c = arg;
    const size_t n = end - lo;
    const float *restrict x = (const float *)c->x[0] + lo;
    float *restrict y = (float *)c->y + lo;
    const float p = c->attr->alpha;
    switch (c->kind) {
    case TP_OP_EXP: S_FIXED(y[i] =, S_EXP_OK(x[i]), s_vexp_fma_core(x[i]), s_vexp(x[i])); break;
    case TP_OP_LOG: S_FIXED(y[i] =, S_POS_NORMAL(x[i]), s_vlog_fma(x[i]), logf(x[i])); break;
    case TP_OP_POW: /* e^(p log x) where x is positive normal and p log x in range */
        S_FIXED(y[i] =, S_POS_NORMAL(x[i]) && S_EXP_OK(p * s_vlog_fma(x[i])),
                s_vexp_fma_core(p * s_vlog_fma(x[i])), powf(x[i], p));
        break;
    case TP_OP_SIGMOID:
        S_FIXED(y[i] =, S_EXP_OK(-x[i]), 1.0f / (1.0f + s_vexp_fma_core(-x[i])),
                s_vsigmoid(x[i]));
        break;
    case TP_OP_SILU:
        S_FIXED(y[i] =, S_EXP_OK(-x[i]), x[i] / (1.0f + s_vexp_fma_core(-x[i])),
                x[i] / (1.0f + s_vexp(-x[i])));
        break;
    case TP_OP_GELU: /* erf's e^-z^2 in range up to |x| 13.2 */
        S_FIXED(y[i] =, x[i] * x[i] <= 174.0f,
                0.5f * x[i] * (1.0f + s_verf_fma(x[i] * (float)M_SQRT1_2)),
                0.5f * x[i] * (1.0f + s_verf(x[i] * (float)M_SQRT1_2)));
        break;
    case TP_OP_SOFTPLUS: /* s_vsoftplus's steps, its e^x and log fused */
        S_FIXED(y[i] =, x[i] >= -87.3f && x[i] <= 20.0f, s_vsoftplus_fma(x[i]),
                s_vsoftplus(x[i]));
        break;
    default:
        break;
    }
}

/* The backward of the FMA forms' ops whose gradient computes e^x again
 * (pow, softplus, gelu); the others' read y or x alone (s_math_bwd,
 * s_unary_bwd). */
TP_CPU_CLONES_FMA static void s_math_fma_bwd(void *arg, size_t lo, size_t end) {
    const tp_op_call_t *c = arg;
    const size_t n = end - lo;
    const float *restrict x = (const float *)c->x[0] + lo, *restrict dy = c->dy + lo;
    float *restrict dx = c->dx[0] + lo;
    const int acc = c->dx_acc[0];
    const float p = c->attr->alpha;
    switch (c->kind) {
    case TP_OP_POW:
        if (p == 0.0f) {
            GRAD_STORE(dx, acc, n, 0.0f);
        } else if (acc) {
            S_BLOCKED(dx[i] +=,
                      S_POS_NORMAL(x[i]) && S_EXP_OK((p - 1.0f) * s_vlog_fma(x[i])),
                      dy[i] * p * s_vexp_fma_core((p - 1.0f) * s_vlog_fma(x[i])),
                      dy[i] * p * powf(x[i], p - 1.0f));
        } else {
            S_FIXED(dx[i] =, S_POS_NORMAL(x[i]) && S_EXP_OK((p - 1.0f) * s_vlog_fma(x[i])),
                    dy[i] * p * s_vexp_fma_core((p - 1.0f) * s_vlog_fma(x[i])),
                    dy[i] * p * powf(x[i], p - 1.0f));
        }
        break;
    case TP_OP_GELU: GRAD_STORE(dx, acc, n, dy[i] * s_vgelu_grad_fma(x[i])); break;
    case TP_OP_SOFTPLUS: /* the sigmoid of x, as the forward's e^x */
        if (acc) {
            S_BLOCKED(dx[i] +=, x[i] >= -88.0f && x[i] <= 20.0f,
                      dy[i] / (1.0f + s_vexp_fma_core(-x[i])),
                      x[i] > 20.0f ? dy[i] : dy[i] / (1.0f + s_vexp(-x[i])));
        } else {
            S_FIXED(dx[i] =, x[i] >= -88.0f && x[i] <= 20.0f,
                    dy[i] / (1.0f + s_vexp_fma_core(-x[i])),
                    x[i] > 20.0f ? dy[i] : dy[i] / (1.0f + s_vexp(-x[i])));
        }
        break;
    default:
        break;
    }
}

/* GELU's derivatives: cpu_math.h's s_vgelu_grad_fma (s_math_fma_bwd)
 * and s_vgelu_tanh_grad (ops_linalg.c's folded GELU runs them too). */

/* silu' = s (1 + v (1 - s)), s the sigmoid, read back from the forward's
 * y = v / (1 + e^-v) as s = y / v: a division instead of an exponential
 * and a division (the exponential was half of silu's time, forward and
 * backward). s is then within 1 ulp of 1 / (1 + e^-v) (two roundings
 * instead of one), the gradient within 2e-7 (1 + |v|) of the exact one
 * (test_cpu_pool: silu_gradient_reads_the_sigmoid_back_from_y); the same
 * bits on every ISA path and thread count, as before. Below |v| 1e-30 (v
 * 0, or y flushed to 0) s is 0.5, its value rounded; a NaN v gives NaN. */
static inline float s_silu_grad(float v, float y) {
    const float s = fabsf(v) < 1e-30f ? 0.5f : y / v;
    return s * (1.0f + v * (1.0f - s));
}

S_CLONES static void s_math_bwd(void *arg, size_t lo, size_t end) {
    const tp_op_call_t *c = arg;
    const size_t n = end - lo;
    const float *restrict x = (const float *)c->x[0] + lo,
                          *restrict y = (const float *)c->y + lo,
                          *restrict dy = c->dy + lo;
    float *restrict dx = c->dx[0] + lo;
    const int acc = c->dx_acc[0];
    const float p = c->attr->alpha, hi = c->attr->beta;
    switch (c->kind) {
    case TP_OP_NEG: GRAD_STORE(dx, acc, n, -dy[i]); break;
    case TP_OP_ABS: /* dy times the sign as a number (selects stay branches here) */
        GRAD_STORE(dx, acc, n, dy[i] * ((float)(x[i] > 0.0f) - (float)(x[i] < 0.0f)));
        break;
    case TP_OP_SQUARE: GRAD_STORE(dx, acc, n, 2.0f * x[i] * dy[i]); break;
    case TP_OP_SQRT: GRAD_STORE(dx, acc, n, dy[i] / (2.0f * y[i])); break;
    case TP_OP_RSQRT: GRAD_STORE(dx, acc, n, -0.5f * dy[i] * y[i] * y[i] * y[i]); break;
    case TP_OP_EXP: GRAD_STORE(dx, acc, n, dy[i] * y[i]); break;
    case TP_OP_LOG: GRAD_STORE(dx, acc, n, dy[i] / x[i]); break;
    case TP_OP_POW: /* p == 2 (s_math_fma_bwd: the others) */
        GRAD_STORE(dx, acc, n, dy[i] * p * x[i]);
        break;
    case TP_OP_CLIP:
        GRAD_STORE(dx, acc, n, ((x[i] >= p) & (x[i] <= hi)) ? dy[i] : 0.0f);
        break;
    case TP_OP_GELU_TANH: /* its sigmoid read back from y (cpu_math.h) */
        GRAD_STORE(dx, acc, n, dy[i] * s_vgelu_tanh_grad(x[i], y[i]));
        break;
    case TP_OP_SILU: GRAD_STORE(dx, acc, n, dy[i] * s_silu_grad(x[i], y[i])); break;
    default: /* constants and stop_gradient: nothing flows back */
        break;
    }
}

/* ---- dispatch ----------------------------------------------------------- */

/* Items of `k` worth a thread (S_MIN_*). */
static size_t s_min_items(tp_op_kind_t k) {
    switch (k) {
    case TP_OP_TANH: case TP_OP_SIGMOID: case TP_OP_EXP: case TP_OP_LOG: case TP_OP_POW:
    case TP_OP_GELU: case TP_OP_GELU_TANH: case TP_OP_SILU: case TP_OP_SOFTPLUS:
        return S_MIN_MATH;
    default:
        return S_MIN_CHEAP;
    }
}

/* fn over the call's output items, on the backend's threads. */
static void s_par(const tp_op_call_t *c, tp_cpu_range_fn fn) {
    tp_cpu_parallel(s_count(&c->yshape), S_ALIGN, s_min_items(c->kind), fn, (void *)c);
}

int tp_cpu_elementwise_kind(tp_op_kind_t k) {
    switch (k) {
    case TP_OP_RELU: case TP_OP_LEAKY_RELU: case TP_OP_TANH: case TP_OP_SIGMOID:
    case TP_OP_SCALE: case TP_OP_ADD: case TP_OP_SUB: case TP_OP_MUL:
    case TP_OP_DIV: case TP_OP_MAXIMUM: case TP_OP_MINIMUM: case TP_OP_NEG:
    case TP_OP_ABS: case TP_OP_SQUARE: case TP_OP_SQRT: case TP_OP_RSQRT:
    case TP_OP_EXP: case TP_OP_LOG: case TP_OP_POW: case TP_OP_CLIP:
    case TP_OP_GELU: case TP_OP_GELU_TANH: case TP_OP_SILU: case TP_OP_SOFTPLUS:
    case TP_OP_CONSTANT: case TP_OP_STOP_GRADIENT:
        return 1;
    default:
        return 0;
    }
}

tp_status_t tp_cpu_elementwise_forward(const tp_op_call_t *c) {
    if (s_fma_kind(c)) {
        s_par(c, s_math_fma_fwd);
        return TP_OK;
    }
    switch (c->kind) {
    case TP_OP_RELU: case TP_OP_LEAKY_RELU: case TP_OP_TANH: case TP_OP_SCALE:
        s_par(c, s_unary_fwd);
        return TP_OK;
    case TP_OP_ADD: case TP_OP_SUB: case TP_OP_MUL: case TP_OP_DIV:
    case TP_OP_MAXIMUM: case TP_OP_MINIMUM:
        s_binary_fwd(c);
        return TP_OK;
    default:
        if (!tp_cpu_elementwise_kind(c->kind))
            return tp_error(TP_ERR_UNSUPPORTED, "%s: no CPU forward for op %s",
                            c->name, tp_op_name(c->kind));
        s_par(c, c->kind == TP_OP_GELU_TANH ? s_gelu_tanh_fwd : s_math_fwd);
        return TP_OK;
    }
}

tp_status_t tp_cpu_elementwise_backward(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_RELU: case TP_OP_LEAKY_RELU: case TP_OP_TANH: case TP_OP_SIGMOID:
    case TP_OP_SCALE:
        if (c->dx[0])
            s_par(c, s_unary_bwd);
        break;
    case TP_OP_ADD: case TP_OP_SUB: case TP_OP_MUL: case TP_OP_DIV:
    case TP_OP_MAXIMUM: case TP_OP_MINIMUM:
        s_binary_bwd(c);
        break;
    default:
        if (!tp_cpu_elementwise_kind(c->kind))
            return tp_error(TP_ERR_UNSUPPORTED, "%s: no CPU backward for op %s",
                            c->name, tp_op_name(c->kind));
        if (c->dx[0])
            s_par(c, (c->kind == TP_OP_POW || c->kind == TP_OP_SOFTPLUS ||
                      c->kind == TP_OP_GELU) && s_fma_kind(c)
                         ? s_math_fma_bwd
                         : s_math_bwd);
        break;
    }
    /* the gradient checks' deliberate fault (ops_elementwise.h); a multiply
     * by exactly 1 is skipped, so normal runs are untouched */
    if (tp_cpu_elementwise_grad_fault != 1.0f)
        for (int k = 0; k < c->ninputs; k++)
            if (c->dx[k])
                for (size_t i = 0, n = s_count(&c->xshape[k]); i < n; i++)
                    c->dx[k][i] *= tp_cpu_elementwise_grad_fault;
    return TP_OK;
}
