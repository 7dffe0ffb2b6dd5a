/* towerpack gpu: the products of our Winograd F(4x4, 3x3)
 * (cpu_wino_gemm.h).
 *
 * One register block is RB rows of c by NV vectors of 16 columns, kept in
 * RB * NV accumulators over the whole k (no k blocking: with 16-row
 * products b is read once a product whatever the order, and a block of k
 * measured slower, 84-86 against 92 GF/s at 128-256); each step of k
 * loads b's NV vectors once and broadcasts a's RB elements. 8 x 2 (16
 * accumulators) measured fastest on stage 4's products against 12 x 2,
 * 14 x 2 and 16 x 2 (docs/performance.md, branch wino6); one vector of
 * columns (the backward-data's 16 tiles) takes 16 x 1 (16 accumulators:
 * 4.1 against 8 x 1's 4.4-5.0 ms for its 36 products), and the rows past
 * those blocks the 8-row and 1-row forms. */
#include "gpu/cpu/cpu_wino_gemm.h"

#include <immintrin.h>

#include "gpu/cpu/cpu_pool.h"

#if defined(__clang__)
#define S_AVX512 __attribute__((target("avx512f")))
#else
#define S_AVX512 __attribute__((target("avx512f"), optimize("O3")))
#endif

/* c[RB x 16 NV] = a[RB x k] b[k x 16 NV], or += when `add` */
#define S_BLOCK(RB, NV)                                                                   \
    S_AVX512 static void s_block_##RB##x##NV(size_t k, const float *a, size_t lda,         \
                                             size_t ap, const float *b, size_t ldb,       \
                                             float *c, size_t ldc, int add) {             \
        __m512 acc[RB][NV];                                                               \
        for (int r = 0; r < RB; r++)                                                      \
            for (int v = 0; v < NV; v++)                                                  \
                acc[r][v] = add ? _mm512_loadu_ps(c + (size_t)r * ldc + (size_t)v * 16)   \
                                : _mm512_setzero_ps();                                    \
        for (size_t l0 = 0; l0 < k; l0 += 32) {                                           \
            const float *ak = a + l0 / 32 * ap, *bk = b + l0 * ldb;                       \
            const size_t kc = k - l0 < 32 ? k - l0 : 32;                                  \
            for (size_t l = 0; l < kc; l++) {                                             \
                __m512 bv[NV];                                                            \
                for (int v = 0; v < NV; v++)                                              \
                    bv[v] = _mm512_loadu_ps(bk + l * ldb + (size_t)v * 16);               \
                for (int r = 0; r < RB; r++) {                                            \
                    const __m512 x = _mm512_set1_ps(ak[(size_t)r * lda + l]);             \
                    for (int v = 0; v < NV; v++)                                          \
                        acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);                 \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
        for (int r = 0; r < RB; r++)                                                      \
            for (int v = 0; v < NV; v++)                                                  \
                _mm512_storeu_ps(c + (size_t)r * ldc + (size_t)v * 16, acc[r][v]);        \
    }
S_BLOCK(8, 2)
S_BLOCK(1, 2)
S_BLOCK(8, 1)
S_BLOCK(16, 1)
S_BLOCK(1, 1)

typedef void (*s_block_fn)(size_t, const float *, size_t, size_t, const float *, size_t,
                           float *, size_t, int);

/* Rows [i0, i1) (a multiple of 8, but a last one) of one chunk of k
 * (kn, from ak and bk) over columns [j0, j1). */
static void s_part(const tp_wino_gemm_t *g, size_t kn, const float *ak, const float *bk,
                   float *c, int add, size_t i0, size_t i1, size_t j0, size_t j1) {
    for (size_t j = j0; j < j1; j += 32) {
        const int wide = g->n - j >= 32;
        const s_block_fn rows8 = wide ? s_block_8x2 : s_block_8x1;
        const s_block_fn row1 = wide ? s_block_1x2 : s_block_1x1;
        size_t i = i0;
        if (!wide) /* one vector: 16 rows (16 accumulators) */
            for (; i + 16 <= i1; i += 16)
                s_block_16x1(kn, ak + i * g->lda, g->lda, g->ap, bk + j / 32 * g->bp, g->ldb,
                             c + i * g->ldc + j, g->ldc, add);
        for (; i + 8 <= i1; i += 8)
            rows8(kn, ak + i * g->lda, g->lda, g->ap, bk + j / 32 * g->bp, g->ldb,
                  c + i * g->ldc + j, g->ldc, add);
        for (; i < i1; i++)
            row1(kn, ak + i * g->lda, g->lda, g->ap, bk + j / 32 * g->bp, g->ldb,
                 c + i * g->ldc + j, g->ldc, add);
    }
}

/* One product: k in chunks of g->kc (all of it when 0), each over column
 * panels of 32 (a last one of 16), rows 8 at a time, a column panel's rows
 * first (b's panel stays in cache for all of them). When all of k is one
 * panel of a (32 or fewer: the backward-weights' T) 8 rows go first, over
 * all columns: c is then written a whole row at a time (down a column
 * panel its rows were 2 KB apart, and the backward-weights ran at 34 GF/s
 * against 71). */
static void s_product(const tp_wino_gemm_t *g, const float *a, const float *b, float *c) {
    const size_t kc = g->kc ? g->kc : g->k;
    if (g->k <= 32) {
        for (size_t i = 0; i < g->m; i += 8)
            s_part(g, g->k, a, b, c, g->add, i, i + 8 <= g->m ? i + 8 : g->m, 0, g->n);
        return;
    }
    for (size_t k0 = 0; k0 < g->k; k0 += kc)
        s_part(g, g->k - k0 < kc ? g->k - k0 : kc, a + k0 / 32 * g->ap, b + k0 * g->ldb, c,
               k0 > 0 || g->add, 0, g->m, 0, g->n);
}

static void s_products_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_gemm_t *g = arg;
    for (size_t q = lo; q < hi; q++)
        s_product(g, g->a + q * g->sa, g->b + q * g->sb, g->c + q * g->sc);
}

void tp_wino_gemm(const tp_wino_gemm_t *g, size_t q) { s_products_range((void *)g, q, q + 1); }

void tp_wino_gemms(const tp_wino_gemm_t *g, size_t count) {
    tp_cpu_parallel(count, 1, 1, s_products_range, (void *)g);
}
