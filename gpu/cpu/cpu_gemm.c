/* towerpack gpu: the GEMM of our own (cpu_gemm.h): one register kernel,
 * the dense products' driver (tp_gemm) and our Winograd's (tp_wino_gemms).
 *
 * One register block is RB rows of c by NV vectors of 16 columns, kept in
 * RB * NV accumulators over the whole k (no k blocking: with 16-row
 * products b is read once a product whatever the order, and a block of k
 * measured slower, 84-86 against 92 GF/s at 128-256); each step of k
 * loads b's NV vectors once and broadcasts a's RB elements. 8 x 2 (16
 * accumulators) measured fastest on stage 4's products against 12 x 2,
 * 14 x 2 and 16 x 2 (docs/performance.md, branch wino6), and on the GPT's
 * (8 x 32 at 99% of the peak in L1; 12 rows 6-8% slower at K 1,024, a's
 * strip past L1: branch gpt19); one vector of columns (the
 * backward-data's 16 tiles) takes 16 x 1 (16 accumulators: 4.1 against
 * 8 x 1's 4.4-5.0 ms for its 36 products), and the rows past those blocks
 * the 8-row and 1-row forms. */
#include "gpu/cpu/cpu_gemm.h"

#include <immintrin.h>
#include <string.h>

#include "gpu/cpu/cpu_pool.h"

#if defined(__clang__)
#define S_AVX512 __attribute__((target("avx512f")))
#else
#define S_AVX512 __attribute__((target("avx512f"), optimize("O3")))
#endif

/* The epilogue's flags: c's old value as the start (the Winograd's own
 * chunks of k), or added after the sum (+ bias) as oneDNN's sum post-op
 * adds it; prefetch c's rows for writing while the k loop runs (c is
 * not in cache between the dense products' blocks). */
enum { S_START_C = 1, S_ADD_C = 2, S_PREFETCH_C = 4 };

/* c[RB x 16 NV] = a[RB x k] b[k x 16 NV] (+ bias) (+ c), a's element
 * (i, l) at a[(l / 32) * ap + i * lda + l % 32] (TR 0) or a[(l / 32) * ap
 * + (l % 32) * lda + i] (TR 1: a transposed, ap = 32 lda), each variant
 * its own function so that the compiler sees the unit stride */
#define S_BLOCK(RB, NV, TR, LDB, SUFFIX)                                                  \
    S_AVX512 static void s_block_##RB##x##NV##_##TR##SUFFIX(                              \
        size_t k, const float *a, size_t lda, size_t ap, const float *b, size_t ldb_,     \
        float *c, size_t ldc, int how, const float *bias) {                               \
        const size_t ldb = (LDB) ? (size_t)(LDB) : ldb_;                                  \
        __m512 acc[RB][NV];                                                               \
        if (how & S_PREFETCH_C)                                                           \
            for (int r = 0; r < RB; r++)                                                  \
                for (int v = 0; v < NV; v++)                                              \
                    _mm_prefetch((const char *)(c + (size_t)r * ldc + (size_t)v * 16),    \
                                 _MM_HINT_ET0);                                           \
        for (int r = 0; r < RB; r++)                                                      \
            for (int v = 0; v < NV; v++)                                                  \
                acc[r][v] = how & S_START_C                                               \
                                ? _mm512_loadu_ps(c + (size_t)r * ldc + (size_t)v * 16)   \
                                : _mm512_setzero_ps();                                    \
        for (size_t l0 = 0; l0 < k; l0 += 32) {                                           \
            const float *ak = a + l0 / 32 * ap, *bk = b + l0 * ldb;                       \
            const size_t kc = k - l0 < 32 ? k - l0 : 32;                                  \
            for (size_t l = 0; l < kc; l++) {                                             \
                __m512 bv[NV];                                                            \
                for (int v = 0; v < NV; v++)                                              \
                    bv[v] = _mm512_loadu_ps(bk + l * ldb + (size_t)v * 16);               \
                for (int r = 0; r < RB; r++) {                                            \
                    const __m512 x = _mm512_set1_ps(TR ? ak[l * lda + (size_t)r]          \
                                                       : ak[(size_t)r * lda + l]);        \
                    for (int v = 0; v < NV; v++)                                          \
                        acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);                 \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
        for (int r = 0; r < RB; r++)                                                      \
            for (int v = 0; v < NV; v++) {                                                \
                float *p = c + (size_t)r * ldc + (size_t)v * 16;                          \
                if (bias)                                                                 \
                    acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_loadu_ps(bias + v * 16)); \
                if (how & S_ADD_C)                                                        \
                    acc[r][v] = _mm512_add_ps(_mm512_loadu_ps(p), acc[r][v]);             \
                _mm512_storeu_ps(p, acc[r][v]);                                           \
            }                                                                             \
    }
S_BLOCK(8, 2, 0, 0, )
S_BLOCK(1, 2, 0, 0, )
S_BLOCK(8, 1, 0, 0, )
S_BLOCK(16, 1, 0, 0, )
S_BLOCK(1, 1, 0, 0, )
/* tp_gemm's: b's rows a panel's 32 floats apart, a constant */
S_BLOCK(8, 2, 0, 32, p)
S_BLOCK(1, 2, 0, 32, p)
S_BLOCK(8, 2, 1, 32, p)
S_BLOCK(1, 2, 1, 32, p)

typedef void (*s_block_fn)(size_t, const float *, size_t, size_t, const float *, size_t,
                           float *, size_t, int, const float *);

/* Rows [i0, i1) (a multiple of 8, but a last one) of one chunk of k
 * (kn, from ak and bk) over columns [j0, j1). */
static void s_part(const tp_wino_gemm_t *g, size_t kn, const float *ak, const float *bk,
                   float *c, int add, size_t i0, size_t i1, size_t j0, size_t j1) {
    for (size_t j = j0; j < j1; j += 32) {
        const int wide = g->n - j >= 32;
        const s_block_fn rows8 = wide ? s_block_8x2_0 : s_block_8x1_0;
        const s_block_fn row1 = wide ? s_block_1x2_0 : s_block_1x1_0;
        size_t i = i0;
        if (!wide) /* one vector: 16 rows (16 accumulators) */
            for (; i + 16 <= i1; i += 16)
                s_block_16x1_0(kn, ak + i * g->lda, g->lda, g->ap, bk + j / 32 * g->bp, g->ldb,
                               c + i * g->ldc + j, g->ldc, add, NULL);
        for (; i + 8 <= i1; i += 8)
            rows8(kn, ak + i * g->lda, g->lda, g->ap, bk + j / 32 * g->bp, g->ldb,
                  c + i * g->ldc + j, g->ldc, add, NULL);
        for (; i < i1; i++)
            row1(kn, ak + i * g->lda, g->lda, g->ap, bk + j / 32 * g->bp, g->ldb,
                 c + i * g->ldc + j, g->ldc, add, NULL);
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

/* ---- tp_gemm: the dense products ---- */

enum { S_NR = 32, S_NC = 256 }; /* a panel's columns; a block's (8 panels) */

size_t tp_gemm_pack_bytes(size_t k, size_t n) {
    return k * ((n + S_NR - 1) / S_NR * S_NR) * sizeof(float);
}

size_t tp_gemm_room_bytes(const tp_gemm_t *g) {
    return g->packed ? 0 : tp_gemm_pack_bytes(g->k, g->n);
}

/* Panels [p0, p1) of b into out (the whole packed matrix's base). Rows
 * of a plain b are read in order, each spread over the panels; a
 * transposed b is read 32 rows (its columns) a panel. */
static void s_pack_panels(const float *b, size_t ldb, int tb, size_t k, size_t n, size_t p0,
                          size_t p1, float *out) {
    for (size_t p = p0; p < p1; p++) {
        const size_t j0 = p * S_NR, w = n - j0 < S_NR ? n - j0 : S_NR;
        float *o = out + p * S_NR * k;
        if (w < S_NR) /* the last panel's columns past n */
            for (size_t l = 0; l < k; l++)
                memset(o + l * S_NR + w, 0, (S_NR - w) * sizeof(float));
        if (tb)
            for (size_t t = 0; t < w; t++) {
                const float *src = b + (j0 + t) * ldb;
                for (size_t l = 0; l < k; l++)
                    o[l * S_NR + t] = src[l];
            }
    }
    if (!tb)
        for (size_t l = 0; l < k; l++)
            for (size_t p = p0; p < p1; p++) {
                const size_t j0 = p * S_NR;
                float *o = out + p * S_NR * k + l * S_NR;
                if (n - j0 >= S_NR) /* a whole panel's row: a copy of a known size */
                    memcpy(o, b + l * ldb + j0, S_NR * sizeof(float));
                else
                    memcpy(o, b + l * ldb + j0, (n - j0) * sizeof(float));
            }
}

void tp_gemm_pack(const float *b, size_t ldb, int tb, size_t k, size_t n, float *out) {
    s_pack_panels(b, ldb, tb, k, n, 0, (n + S_NR - 1) / S_NR, out);
}

void tp_gemm_tile_out(const float *tile, size_t ldt, size_t rows, size_t w, float *c,
                      size_t ldc, const float *bias, int acc) {
    for (size_t r = 0; r < rows; r++)
        for (size_t t = 0; t < w; t++) {
            float v = tile[r * ldt + t];
            float *p = c + r * ldc + t;
            if (bias)
                v = v + bias[t];
            *p = acc ? *p + v : v;
        }
}

/* Columns [j, j + w) (w < 32: the last panel) of rows [i, i + rows): the
 * kernel into a tile, then its columns with the kernel's epilogue in the
 * kernel's order (the same bits as a whole panel's). */
static void s_edge(const tp_gemm_t *g, s_block_fn f, size_t rows, size_t i, size_t j, size_t w,
                   const float *a, size_t ap, const float *bp) {
    float tile[8 * S_NR];
    f(g->k, a, g->lda, ap, bp, S_NR, tile, S_NR, 0, NULL);
    tp_gemm_tile_out(tile, S_NR, rows, w, g->c + i * g->ldc + j, g->ldc,
                     g->bias ? g->bias + j : NULL, g->acc);
}

/* Rows [i0, i1) (i0 a multiple of 8) of column block blk (S_NC columns)
 * from b's panels bp (panel p at bp + p * 32 k): rows 8 at a time, each
 * row block over the block's panels (a's 8 x k strip stays in L1, b's
 * block in L2). */
static void s_rows(const tp_gemm_t *g, const float *bp, size_t blk, size_t i0, size_t i1) {
    const size_t np = (g->n + S_NR - 1) / S_NR;
    const size_t p0 = blk * (S_NC / S_NR);
    const size_t p1 = p0 + S_NC / S_NR < np ? p0 + S_NC / S_NR : np;
    const size_t ap = g->ta ? 32 * g->lda : 32;
    const int how = (g->acc ? S_ADD_C : 0) | S_PREFETCH_C;
    for (size_t i = i0; i < i1;) {
        const size_t rows = i1 - i >= 8 ? 8 : 1;
        const s_block_fn f = rows == 8 ? (g->ta ? s_block_8x2_1p : s_block_8x2_0p)
                                       : (g->ta ? s_block_1x2_1p : s_block_1x2_0p);
        const float *a = g->ta ? g->a + i : g->a + i * g->lda;
        for (size_t p = p0; p < p1; p++) {
            const size_t j = p * S_NR;
            const float *b = bp + p * S_NR * g->k;
            if (g->n - j < S_NR)
                s_edge(g, f, rows, i, j, g->n - j, a, ap, b);
            else
                f(g->k, a, g->lda, ap, b, S_NR, g->c + i * g->ldc + j, g->ldc, how,
                  g->bias ? g->bias + j : NULL);
        }
        i += rows;
    }
}

/* One thread: column blocks [lo, hi), each packing its panels (unless b
 * came packed) into the room's first block just before its rows read
 * them: the same K x 256 floats every block, so they stay in L2 (a block
 * of its own for each, the whole of b's panels, left the pack's writes
 * missing cache: 6% slower than oneDNN instead of ~4% faster). */
static void s_gemm_blocks(void *arg, size_t lo, size_t hi) {
    const tp_gemm_t *g = arg;
    const size_t np = (g->n + S_NR - 1) / S_NR;
    for (size_t blk = lo; blk < hi; blk++) {
        const size_t p0 = blk * (S_NC / S_NR);
        const float *bp = g->b;
        if (!g->packed) {
            float *to = g->room - p0 * S_NR * g->k; /* panel p0 at the room's start */
            s_pack_panels(g->b, g->ldb, g->tb, g->k, g->n, p0,
                          p0 + S_NC / S_NR < np ? p0 + S_NC / S_NR : np, to);
            bp = to;
        }
        s_rows(g, bp, blk, 0, g->m);
    }
}

/* A team: b packed first (panels over the team), then parts of S_MP rows
 * of one column block each (the GPT's 256-column products have one block
 * and would leave the team idle). */
enum { S_MP = 64 };

static void s_pack_range(void *arg, size_t lo, size_t hi) {
    const tp_gemm_t *g = arg;
    s_pack_panels(g->b, g->ldb, g->tb, g->k, g->n, lo, hi, g->room);
}

static void s_parts(void *arg, size_t lo, size_t hi) {
    const tp_gemm_t *g = arg;
    const size_t nr = (g->m + S_MP - 1) / S_MP;
    for (size_t q = lo; q < hi; q++) {
        const size_t i0 = q % nr * S_MP;
        s_rows(g, g->packed ? g->b : g->room, q / nr, i0, g->m - i0 < S_MP ? g->m : i0 + S_MP);
    }
}

void tp_gemm(const tp_gemm_t *g) {
    if (!g->m || !g->n)
        return;
    /* k 0 is an empty sum: the kernel's zeros (+ bias) (+ c) */
    const size_t nblk = (g->n + S_NC - 1) / S_NC;
    if (tp_cpu_threads() <= 1) {
        s_gemm_blocks((void *)g, 0, nblk);
        return;
    }
    if (!g->packed)
        tp_cpu_parallel((g->n + S_NR - 1) / S_NR, 1, 1, s_pack_range, (void *)g);
    tp_cpu_parallel(nblk * ((g->m + S_MP - 1) / S_MP), 1, 1, s_parts, (void *)g);
}
