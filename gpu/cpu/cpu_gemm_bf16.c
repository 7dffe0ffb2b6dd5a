/* towerpack gpu: the bf16 GEMM of our own (cpu_gemm_bf16.h).
 *
 * The register block is 8 rows by two vectors of 16 columns (16
 * accumulators, as tp_gemm's 8 x 32): each pair of k loads b's two
 * vectors of 16 pairs and broadcasts a's 8 pairs, 16 VDPBF16PS (in its k
 * loop 96-97% of the kernel's time in the GPT's step: perf annotate). The
 * packing converts with VCVTNE2PS2BF16 (round to nearest even, NaNs stay
 * NaNs: tp_cpu_f32_to_bf16's rounding); where a pair is two rows of the
 * source (a plain b, a transposed a) it interleaves the two rows' halves
 * with one VPERMW, where it is two neighbours in a row (a plain a, a
 * transposed b) it transposes 8 rows in registers (s_pack8). A 6 x 64
 * or 12 x 32 block measured within 1-2% of 8 x 32 in a kernel-only loop
 * (96-97% against 94-96% of the peak, a loaded host): not worth a second
 * layout. */
#include "gpu/cpu/cpu_gemm_bf16.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "gpu/cpu/cpu_gemm.h"
#include "gpu/cpu/cpu_pool.h"

#if defined(__clang__)
#define S_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#else
#define S_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16"), optimize("O3")))
#endif

enum { S_NR = 32, S_NC = 256, S_MP = 64 }; /* a panel's columns, a block's, a part's rows */

/* The epilogue's flags: c's old value added after the sum (+ bias);
 * prefetch c's rows for writing while the k loop runs. */
enum { S_ADD_C = 1, S_PREFETCH_C = 2 };

int tp_gemm_bf16_ok(void) {
    static int ok = -1;
    if (ok < 0)
        ok = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
    return ok;
}

static size_t s_kh(size_t k) { return (k + 1) / 2; }
static size_t s_round64(size_t b) { return (b + 63) & ~(size_t)63; }
static size_t s_a_bytes(size_t m, size_t k) { return s_round64((m + 7) / 8 * 8 * s_kh(k) * 4); }

/* the room's start rounded up to 64 bytes (b's panels are read aligned),
 * then a's blocks, then b's panels */
size_t tp_gemm_bf16_room_bytes(size_t m, size_t n, size_t k) {
    return 64 + s_a_bytes(m, k) + (n + S_NR - 1) / S_NR * S_NR * s_kh(k) * 4;
}

/* c[RB x 32] = a's RB rows x b's panel (+ bias) (+ c): a's pair (r, h)
 * at a[h * 8 + r] (a block of 8 rows), b's panel row h at b + h * 32
 * (pairs). Every loop over rows and vectors unrolled (the pragmas): the
 * accumulators then stay in registers around the k loop (without them
 * GCC 12 kept them on the stack outside it, 9% of the kernel's time at k
 * 256). */
#define S_BLOCK(RB)                                                                       \
    S_BF16 static void s_block_##RB(size_t kh, const uint32_t *a, const uint32_t *b,      \
                                    float *c, size_t ldc, int how, const float *bias) {   \
        __m512 acc[RB][2];                                                                \
        if (how & S_PREFETCH_C)                                                           \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                        \
                _mm_prefetch((const char *)(c + (size_t)r * ldc), _MM_HINT_ET0);          \
                _mm_prefetch((const char *)(c + (size_t)r * ldc + 16), _MM_HINT_ET0);     \
            }                                                                             \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] =      \
            _mm512_setzero_ps();                                                          \
        for (const uint32_t *end = a + kh * 8; a < end; a += 8, b += 32) {                \
            const __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)b);             \
            const __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(b + 16));      \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                        \
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r]);                \
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);                           \
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);                           \
            }                                                                             \
        }                                                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++)                              \
            _Pragma("GCC unroll 2") for (int v = 0; v < 2; v++) {                         \
                float *p = c + (size_t)r * ldc + (size_t)v * 16;                          \
                if (bias)                                                                 \
                    acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_loadu_ps(bias + v * 16)); \
                if (how & S_ADD_C)                                                        \
                    acc[r][v] = _mm512_add_ps(_mm512_loadu_ps(p), acc[r][v]);             \
                _mm512_storeu_ps(p, acc[r][v]);                                           \
            }                                                                             \
    }
S_BLOCK(8)
S_BLOCK(1)

typedef void (*s_block_fn)(size_t, const uint32_t *, const uint32_t *, float *, size_t, int,
                           const float *);

/* ---- packing: the conversion to bf16 writes the kernel's layout ---- */

static __mmask16 s_mask16(size_t n) { return (__mmask16)(n >= 16 ? 0xffffu : (1u << n) - 1); }

/* Two source rows (r0 the even k, r1 the odd one or NULL past k: zeros)
 * over columns [j, j + 16) (zeros past w) as 16 pairs, column j + q's in
 * lane q. */
S_BF16 static __m512i s_pairs16(const float *r0, const float *r1, size_t j, size_t w) {
    /* lane 2q from r0's column q (the low half of cvtne2ps), 2q + 1 from r1's */
    static const uint16_t ix[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __mmask16 ml = s_mask16(w > j ? w - j : 0);
    const __m512 lo = _mm512_maskz_loadu_ps(ml, r0 + j);
    const __m512 hi = r1 ? _mm512_maskz_loadu_ps(ml, r1 + j) : _mm512_setzero_ps();
    return _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)ix),
                                    (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* Elements [l0, l0 + 32) of a contiguous source row (zeros past k) as
 * 16 pairs, pair q in lane q. */
S_BF16 static __m512i s_row32(const float *src, size_t l0, size_t k) {
    const size_t nv = k - l0 < 32 ? k - l0 : 32;
    const __m512 lo = _mm512_maskz_loadu_ps(s_mask16(nv), src + l0);
    const __m512 hi = _mm512_maskz_loadu_ps(s_mask16(nv > 16 ? nv - 16 : 0), src + l0 + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* Four rows of 16 lanes, v[0..3], as four vectors whose 128-bit lane j
 * holds the four rows' element 4j + x (vector x): a 4 x 4 transpose in
 * each lane. */
S_BF16 static void s_t4(const __m512i *v, __m512i *t) {
    const __m512i a0 = _mm512_unpacklo_epi32(v[0], v[1]), a1 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i a2 = _mm512_unpacklo_epi32(v[2], v[3]), a3 = _mm512_unpackhi_epi32(v[2], v[3]);
    t[0] = _mm512_unpacklo_epi64(a0, a2);
    t[1] = _mm512_unpackhi_epi64(a0, a2);
    t[2] = _mm512_unpacklo_epi64(a1, a3);
    t[3] = _mm512_unpackhi_epi64(a1, a3);
}

/* 8 source rows of k (contiguous, ld apart; those past `rows` zeros) as
 * pairs, row r's pair h at out[h * stride + r]: a's blocks of 8 rows
 * (stride 8) and a transposed b's panels (stride 32, 8 of its columns).
 * Per 32 of k: 8 rows of 16 pairs, 4 x 4 transposes in each 128-bit lane
 * (s_t4), then the lanes (a 4 x 4 transpose of 128-bit pieces), so that
 * each output vector holds two pairs' 8 rows, stored as two halves. */
S_BF16 static void s_pack8(const float *src, size_t ld, size_t k, size_t rows, uint32_t *out,
                           size_t stride) {
    const size_t kh = s_kh(k);
    for (size_t l0 = 0; l0 < k; l0 += 32) {
        __m512i v[8], t[8];
        for (size_t r = 0; r < 8; r++)
            v[r] = r < rows ? s_row32(src + r * ld, l0, k) : _mm512_setzero_si512();
        s_t4(v, t);
        s_t4(v + 4, t + 4);
        /* t[x] lane j: rows 0-3 of pair 4j + x; t[4 + x]: rows 4-7 */
        for (size_t x = 0; x < 4; x += 2) {
            const __m512i u0 = _mm512_shuffle_i32x4(t[x], t[4 + x], 0x44);
            const __m512i u1 = _mm512_shuffle_i32x4(t[x], t[4 + x], 0xee);
            const __m512i u2 = _mm512_shuffle_i32x4(t[x + 1], t[5 + x], 0x44);
            const __m512i u3 = _mm512_shuffle_i32x4(t[x + 1], t[5 + x], 0xee);
            const __m512i o[4] = {_mm512_shuffle_i32x4(u0, u2, 0x88),
                                  _mm512_shuffle_i32x4(u0, u2, 0xdd),
                                  _mm512_shuffle_i32x4(u1, u3, 0x88),
                                  _mm512_shuffle_i32x4(u1, u3, 0xdd)};
            for (size_t j = 0; j < 4; j++) { /* o[j]: pairs 4j + x and 4j + x + 1 */
                const size_t h = l0 / 2 + 4 * j + x;
                if (h < kh)
                    _mm256_storeu_si256((__m256i *)(out + h * stride),
                                        _mm512_castsi512_si256(o[j]));
                if (h + 1 < kh)
                    _mm256_storeu_si256((__m256i *)(out + (h + 1) * stride),
                                        _mm512_extracti64x4_epi64(o[j], 1));
            }
        }
    }
}

/* One pair h of a transposed a's rows [i, i + 16) (those past m not
 * written) into their two blocks. */
S_BF16 static void s_pack_a_pair16(__m512i v, size_t i, size_t m, size_t kh, size_t h,
                                   uint32_t *out) {
    const __mmask16 mk = s_mask16(m - i);
    _mm512_mask_storeu_epi32(out + i * kh + h * 8, (__mmask16)(mk & 0xff), v);
    if (mk >> 8)
        _mm512_mask_storeu_epi32(out + (i + 8) * kh + h * 8 - 8, (__mmask16)(mk & 0xff00), v);
}

/* a transposed, pairs [h0, h1): two pairs' 16 rows at a time, each
 * block's 8 rows of both pairs one whole line; the rows in strips of 128
 * (16 blocks), so that a pair's stores go to 16 pages, not m / 8 (a's
 * 1,024 rows over 128 pages took 19% of a dW product at k 1,024). */
enum { S_AT = 128 };

S_BF16 static void s_pack_a_pairs(const float *a, size_t lda, size_t m, size_t k, size_t h0,
                                  size_t h1, uint32_t *out) {
    const size_t kh = s_kh(k);
    for (size_t i0 = 0; i0 < m; i0 += S_AT) {
        const size_t i1 = m - i0 < S_AT ? m : i0 + S_AT;
        for (size_t h = h0; h < h1; h += 2) {
            const float *r0 = a + 2 * h * lda, *r1 = 2 * h + 1 < k ? r0 + lda : NULL;
            const float *r2 = r0 + 2 * lda, *r3 = 2 * h + 3 < k ? r2 + lda : NULL;
            const int two = h + 1 < h1;
            for (size_t i = i0; i < i1; i += 16) {
                const __m512i v0 = s_pairs16(r0, r1, i, m);
                if (!two || m - i < 16) {
                    s_pack_a_pair16(v0, i, m, kh, h, out);
                    if (two)
                        s_pack_a_pair16(s_pairs16(r2, r3, i, m), i, m, kh, h + 1, out);
                    continue;
                }
                const __m512i v1 = s_pairs16(r2, r3, i, m);
                _mm512_storeu_si512((void *)(out + i * kh + h * 8),
                                    _mm512_shuffle_i64x2(v0, v1, 0x44));
                _mm512_storeu_si512((void *)(out + (i + 8) * kh + h * 8),
                                    _mm512_shuffle_i64x2(v0, v1, 0xee));
            }
        }
    }
}

/* b's panels [p0, p1) into out (the whole packed matrix's base): a plain
 * b two rows a pair, in order over the panels; a transposed b 8 source
 * rows (columns of b) at a time (s_pack8). */
S_BF16 static void s_pack_b(const float *b, size_t ldb, int tb, size_t k, size_t n, size_t p0,
                            size_t p1, uint32_t *out) {
    const size_t kh = s_kh(k);
    if (!tb) {
        for (size_t h = 0; h < kh; h++)
            for (size_t p = p0; p < p1; p++) {
                const size_t j0 = p * S_NR;
                const float *r0 = b + 2 * h * ldb + j0, *r1 = 2 * h + 1 < k ? r0 + ldb : NULL;
                uint32_t *o = out + p * S_NR * kh + h * S_NR;
                _mm512_store_si512((void *)o, s_pairs16(r0, r1, 0, n - j0));
                _mm512_store_si512((void *)(o + 16), s_pairs16(r0, r1, 16, n - j0));
            }
        return;
    }
    for (size_t p = p0; p < p1; p++) /* 8 columns at a time, zeros past n */
        for (size_t t = 0; t < S_NR; t += 8) {
            const size_t j = p * S_NR + t;
            s_pack8(b + j * ldb, ldb, k, j < n ? (n - j < 8 ? n - j : 8) : 0,
                    out + p * S_NR * kh + t, S_NR);
        }
}

/* ---- the drivers ---- */

typedef struct {
    const tp_gemm_bf16_t *g;
    uint32_t *ap, *bp; /* the room's packed a and b */
} s_job_t;

/* Columns [j, j + w) (w < 32: the last panel) of rows [i, i + rows): the
 * kernel into a tile, then its columns with the kernel's epilogue in the
 * kernel's order (the same bits as a whole panel's). */
static void s_edge(const tp_gemm_bf16_t *g, s_block_fn f, size_t rows, size_t i, size_t j,
                   size_t w, const uint32_t *a, const uint32_t *b) {
    float tile[8 * S_NR];
    f(s_kh(g->k), a, b, tile, S_NR, 0, NULL);
    tp_gemm_tile_out(tile, S_NR, rows, w, g->c + i * g->ldc + j, g->ldc,
                     g->bias ? g->bias + j : NULL, g->acc);
}

/* Rows [i0, i1) (i0 a multiple of 8) of column block blk, b's panel p at
 * bp + p * 32 kh: 8 rows at a time over the block's panels (a's 8 rows
 * in L1, b's block in L2). */
static void s_rows(const s_job_t *jb, const uint32_t *bp, size_t blk, size_t i0, size_t i1) {
    const tp_gemm_bf16_t *g = jb->g;
    const size_t kh = s_kh(g->k), np = (g->n + S_NR - 1) / S_NR;
    const size_t p0 = blk * (S_NC / S_NR);
    const size_t p1 = p0 + S_NC / S_NR < np ? p0 + S_NC / S_NR : np;
    const int how = (g->acc ? S_ADD_C : 0) | S_PREFETCH_C;
    for (size_t i = i0; i < i1;) {
        const size_t rows = i1 - i >= 8 ? 8 : 1;
        const s_block_fn f = rows == 8 ? s_block_8 : s_block_1;
        const uint32_t *a = jb->ap + i / 8 * 8 * kh + i % 8; /* its block, its row */
        for (size_t p = p0; p < p1; p++) {
            const size_t j = p * S_NR;
            const uint32_t *b = bp + p * S_NR * kh;
            if (g->n - j < S_NR)
                s_edge(g, f, rows, i, j, g->n - j, a, b);
            else
                f(kh, a, b, g->c + i * g->ldc + j, g->ldc, how, g->bias ? g->bias + j : NULL);
        }
        i += rows;
    }
}

/* a's packing over a range: blocks of 8 rows (plain) or pairs
 * (transposed) */
static void s_pack_a_range(void *arg, size_t lo, size_t hi) {
    const s_job_t *jb = arg;
    const tp_gemm_bf16_t *g = jb->g;
    if (g->ta) {
        s_pack_a_pairs(g->a, g->lda, g->m, g->k, lo, hi, jb->ap);
        return;
    }
    for (size_t q = lo; q < hi; q++)
        s_pack8(g->a + q * 8 * g->lda, g->lda, g->k, g->m - q * 8 < 8 ? g->m - q * 8 : 8,
                jb->ap + q * 8 * s_kh(g->k), 8);
}

static void s_pack_b_range(void *arg, size_t lo, size_t hi) {
    const s_job_t *jb = arg;
    const tp_gemm_bf16_t *g = jb->g;
    s_pack_b(g->b, g->ldb, g->tb, g->k, g->n, lo, hi, jb->bp);
}

/* a team's parts: S_MP rows of one column block each */
static void s_parts(void *arg, size_t lo, size_t hi) {
    const s_job_t *jb = arg;
    const tp_gemm_bf16_t *g = jb->g;
    const size_t nr = (g->m + S_MP - 1) / S_MP;
    for (size_t q = lo; q < hi; q++) {
        const size_t i0 = q % nr * S_MP;
        s_rows(jb, jb->bp, q / nr, i0, g->m - i0 < S_MP ? g->m : i0 + S_MP);
    }
}

/* One thread packs a whole, then b a block of 256 columns at a time into
 * the room's first block, each just before its rows read it (b's block
 * stays in L2, as tp_gemm's); a team packs both whole (rows or pairs of
 * a, panels of b over the team), then splits rows and column blocks. */
void tp_gemm_bf16(const tp_gemm_bf16_t *g) {
    if (!g->m || !g->n)
        return;
    /* k 0 is an empty sum: the kernel's zeros (+ bias) (+ c) */
    uint32_t *ap = (uint32_t *)(((uintptr_t)g->room + 63) & ~(uintptr_t)63);
    s_job_t jb = {g, ap, (uint32_t *)((char *)ap + s_a_bytes(g->m, g->k))};
    const size_t kh = s_kh(g->k), np = (g->n + S_NR - 1) / S_NR;
    const size_t nblk = (g->n + S_NC - 1) / S_NC;
    const size_t na = g->ta ? kh : (g->m + 7) / 8;
    if (tp_cpu_threads() <= 1) {
        s_pack_a_range(&jb, 0, na);
        for (size_t blk = 0; blk < nblk; blk++) {
            const size_t p0 = blk * (S_NC / S_NR);
            uint32_t *to = jb.bp - p0 * S_NR * kh; /* panel p0 at b's room's start */
            s_pack_b(g->b, g->ldb, g->tb, g->k, g->n, p0,
                     p0 + S_NC / S_NR < np ? p0 + S_NC / S_NR : np, to);
            s_rows(&jb, to, blk, 0, g->m);
        }
        return;
    }
    tp_cpu_parallel(na, 1, 1, s_pack_a_range, &jb);
    tp_cpu_parallel(np, 1, 1, s_pack_b_range, &jb);
    tp_cpu_parallel(nblk * ((g->m + S_MP - 1) / S_MP), 1, 1, s_parts, &jb);
}
