/* towerpack gpu: Adam/AdamW and the gradients' sum of squares on the CPU.
 *
 * The update is one pass over the variable's floats: the decoupled decay,
 * both moments and the step for an element together, so each float of w,
 * g, m and v is read once (the decay used to be a pass of its own). The
 * loop is compiled per ISA (TP_CPU_CLONES) without errno from sqrt (so it
 * vectorises: -fno-math-errno for this file in CMakeLists.txt, the pragma
 * below not reaching the builtin) and without FMA contraction: sqrt and divide are correctly
 * rounded in every lane width, so the bits are those of the scalar loop
 * on any machine and any cut of the range over the pool. */
#include <math.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#include "gpu/cpu/cpu_adam.h"
#include "gpu/cpu/cpu_pool.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "gpu/cpu/cpu_math.h"

typedef struct {
    float *w, *m, *v;
    const float *g;
    float keep, lr_t, eps_t, b1, b2, ob1, ob2;
    float gs;  /* the gradient's scale (the clip's; 1: none, exact) */
    int decay;
} s_adam_t;

/* Denormals flushed to zero (x86 FTZ and DAZ) on the thread running a
 * part, as backend_cpu.c's kernels do on theirs: a pool thread's MXCSR is
 * its own, and the bits must not depend on which thread ran an element
 * (a moment decaying through the denormal range also costs ~100x). */
static inline void s_ftz(void) {
#if defined(__SSE__)
    const unsigned int csr = _mm_getcsr();
    if ((csr & 0x8040u) != 0x8040u)
        _mm_setcsr(csr | 0x8040u);
#endif
}

TP_CPU_CLONES static void s_adam_part(void *arg, size_t lo, size_t hi) {
    s_ftz();
    const s_adam_t *a = arg;
    float *restrict w = a->w + lo, *restrict m = a->m + lo, *restrict v = a->v + lo;
    const float *restrict g = a->g + lo;
    const size_t n = hi - lo;
    const float keep = a->keep, lr_t = a->lr_t, eps_t = a->eps_t;
    const float b1 = a->b1, b2 = a->b2, ob1 = a->ob1, ob2 = a->ob2, gs = a->gs;
    if (a->decay) {
        for (size_t i = 0; i < n; i++) {
            const float gi = g[i] * gs;
            const float mi = b1 * m[i] + ob1 * gi;
            const float vi = b2 * v[i] + ob2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            w[i] = w[i] * keep - lr_t * mi / (sqrtf(vi) + eps_t);
        }
    } else { /* Adam: no multiply by 1 (the bits of the unfused loop) */
        for (size_t i = 0; i < n; i++) {
            const float gi = g[i] * gs;
            const float mi = b1 * m[i] + ob1 * gi;
            const float vi = b2 * v[i] + ob2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            w[i] -= lr_t * mi / (sqrtf(vi) + eps_t);
        }
    }
}

void tp_cpu_adam(float *w, const float *g, float *m, float *v, size_t n, float lr,
                 float b1, float b2, float eps, float wd, int64_t step) {
    tp_cpu_adam_scaled(w, g, m, v, n, lr, b1, b2, eps, wd, step, 1.0f);
}

void tp_cpu_adam_scaled(float *w, const float *g, float *m, float *v, size_t n,
                        float lr, float b1, float b2, float eps, float wd,
                        int64_t step, float gscale) {
    const double c1 = 1.0 - pow(b1, (double)step);
    const double c2 = 1.0 - pow(b2, (double)step);
    /* the bias corrections folded into the step size and epsilon */
    s_adam_t a = {.w = w, .m = m, .v = v, .g = g, .keep = 1.0f - lr * wd,
                  .lr_t = (float)(lr * sqrt(c2) / c1), .eps_t = (float)(eps * sqrt(c2)),
                  .b1 = b1, .b2 = b2, .ob1 = 1.0f - b1, .ob2 = 1.0f - b2,
                  .gs = gscale, .decay = wd != 0.0f};
    /* elementwise: any cut gives the same bits */
    tp_cpu_parallel(n, 16, 1 << 15, s_adam_part, &a);
}

/* The sum of squares in blocks of TP_CPU_SUMSQ_BLOCK floats, each in
 * eight double lanes; the blocks' sums then added in block order. */
#define S_SQ_BLOCK TP_CPU_SUMSQ_BLOCK

TP_CPU_CLONES static double s_sumsq_block(const float *restrict g, size_t n) {
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int t = 0; t < 8; t++)
            l[t] += (double)g[i + t] * (double)g[i + t];
    for (; i < n; i++)
        l[i % 8] += (double)g[i] * (double)g[i];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

double tp_cpu_sumsq_block(const float *g, size_t n) { return s_sumsq_block(g, n); }

/* s_sumsq_block's lanes over sums made in the same loop: element i's
 * square into lane i % 8, each lane's adds in element order, as there.
 * ivdep: dst is a or b, but element i is read before it is written and
 * no other element is, so the vector loop is exact (without it the
 * compiler's overlap check sends dst == a down a scalar loop). */
#if defined(__GNUC__) && !defined(__clang__)
#define S_IVDEP _Pragma("GCC ivdep")
#else
#define S_IVDEP
#endif
#define S_SUM2_SQ(MUL)                                                        \
    do {                                                                      \
        size_t i = 0;                                                         \
        S_IVDEP for (; i + 8 <= n; i += 8) for (int t = 0; t < 8; t++) {      \
            const float x = (a[i + t] + b[i + t]) MUL;                        \
            dst[i + t] = x;                                                   \
            l[t] += (double)x * (double)x;                                    \
        }                                                                     \
        for (; i < n; i++) {                                                  \
            const float x = (a[i] + b[i]) MUL;                                \
            dst[i] = x;                                                       \
            l[i % 8] += (double)x * (double)x;                                \
        }                                                                     \
    } while (0)

TP_CPU_CLONES static double s_sum2_sumsq_block(float *dst, const float *a, const float *b,
                                               size_t n, float scale) {
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (scale == 1.0f)
        S_SUM2_SQ();
    else
        S_SUM2_SQ(*scale);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
#undef S_SUM2_SQ
#undef S_IVDEP

double tp_cpu_sum2_sumsq_block(float *dst, const float *a, const float *b, size_t n,
                               float scale) {
    return s_sum2_sumsq_block(dst, a, b, n, scale);
}

/* Blocks [lo, hi) of a group: each block's sum into sq[k] (a range over
 * the pool; a block's sum is its own floats' alone, whatever the cut). */
typedef struct {
    const float *g;
    size_t n;   /* the group's floats */
    double *sq; /* [blocks] */
} s_sumsq_t;

TP_CPU_CLONES static void s_sumsq_blocks(void *arg, size_t lo, size_t hi) {
    const s_sumsq_t *a = arg;
    for (size_t k = lo; k < hi; k++) {
        const size_t i = k * S_SQ_BLOCK;
        a->sq[k] = s_sumsq_block(a->g + i, a->n - i < S_SQ_BLOCK ? a->n - i : S_SQ_BLOCK);
    }
}

/* The blocks' sums over the pool, S_SQ_GROUP blocks (4 MB of floats) a
 * parallel range, then added on this thread in block order: the sum of
 * the serial loop, bit for bit, at any thread count. With one tower the
 * global-norm clip runs this over every gradient each step (3.2 M floats
 * in the GPT, 0.4-1 ms of one core): split, a 1 x 2 run no longer leaves
 * its second core idle through it. */
enum { S_SQ_GROUP = 256 };

double tp_cpu_sumsq(const float *g, size_t n) {
    double sq[S_SQ_GROUP], s = 0.0;
    for (size_t i = 0; i < n; i += (size_t)S_SQ_GROUP * S_SQ_BLOCK) {
        const size_t m = n - i < (size_t)S_SQ_GROUP * S_SQ_BLOCK ? n - i
                                                                 : (size_t)S_SQ_GROUP * S_SQ_BLOCK;
        const size_t nb = (m + S_SQ_BLOCK - 1) / S_SQ_BLOCK;
        s_sumsq_t a = {.g = g + i, .n = m, .sq = sq};
        /* a part is at least 8 blocks (32k floats), as AdamW's */
        tp_cpu_parallel(nb, 1, 8, s_sumsq_blocks, &a);
        for (size_t k = 0; k < nb; k++)
            s += sq[k];
    }
    return s;
}
