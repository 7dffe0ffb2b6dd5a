/* towerpack gpu: the fused attention's bf16 tile products
 * (attention_bf16.h). Where the compiler or the CPU lacks AVX512_BF16
 * these are never called (tp_attn_bf16_usable says 0). */
#include <stdatomic.h>
#include "gpu/cpu/attention_bf16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define S_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,fma")))

int tp_attn_bf16_usable(void) {
    static atomic_int has = -1;
    int h = atomic_load(&has);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
        atomic_store(&has, h);
    }
    return h;
}

/* the lanes of [j, j + 16) below lim */
static inline __attribute__((always_inline)) __mmask16 s_below(int64_t j, int64_t lim) {
    const int64_t n = lim - j;
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* 32 floats of a row into 16 pairs: VCVTNE2PS2BF16 puts lo's sixteen
 * first, which is a row's order */
S_TARGET void tp_attn_bf16_rows(uint32_t *dst, int64_t ldd, const float *src, int64_t lds,
                                int64_t rows, int64_t n) {
    const int64_t np = (n + 1) / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        uint32_t *o = dst + r * ldd;
        for (int64_t e = 0; e < n; e += 32) {
            const __m512 lo = _mm512_maskz_loadu_ps(s_below(e, n), s + e);
            const __m512 hi = _mm512_maskz_loadu_ps(s_below(e + 16, n), s + e + 16);
            _mm512_mask_storeu_epi32(o + e / 2, s_below(e / 2, np),
                                     (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* two rows' sixteen columns converted in one go (the even row first),
 * then interleaved column by column with one VPERMW */
S_TARGET void tp_attn_bf16_pairs(uint32_t *dst, int64_t ldd, const float *src, int64_t lds,
                                 int64_t n, int64_t cols) {
    static const uint16_t mix[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                     21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                     11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_loadu_si512((const void *)mix);
    for (int64_t p = 0; p < (n + 1) / 2; p++) {
        const float *even = src + 2 * p * lds, *odd = even + lds;
        const int has_odd = 2 * p + 1 < n;
        uint32_t *o = dst + p * ldd;
        for (int64_t c = 0; c < cols; c += 16) {
            const __mmask16 k = s_below(c, cols);
            const __m512 lo = _mm512_maskz_loadu_ps(k, even + c);
            const __m512 hi = has_odd ? _mm512_maskz_loadu_ps(k, odd + c) : _mm512_setzero_ps();
            const __m512i two = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            _mm512_mask_storeu_epi32(o + c, k, _mm512_permutexvar_epi16(idx, two));
        }
    }
}

/* R rows x NC vectors of 16 columns, the last vector's lanes past the
 * columns masked off (zeros loaded, nothing stored): 16 accumulators, each
 * broadcast pair of A feeding NC of them */
static inline __attribute__((always_inline)) S_TARGET void
s_block(const int R, const int NC, __mmask16 last, float *restrict cm, int64_t ldc,
        const uint32_t *restrict am, int64_t lda, int64_t ak, const uint32_t *restrict bm,
        int64_t ldb, int64_t p0, int64_t p1, int acc) {
    __m512 cr[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NC; v++) {
            const __mmask16 mk = v == NC - 1 ? last : (__mmask16)0xffff;
            cr[r][v] = acc ? _mm512_maskz_loadu_ps(mk, cm + r * ldc + 16 * v)
                           : _mm512_setzero_ps();
        }
    for (int64_t p = p0; p < p1; p++) {
        const uint32_t *restrict b = bm + p * ldb;
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NC; v++)
            bv[v] = (__m512bh)(v == NC - 1 ? _mm512_maskz_loadu_epi32(last, b + 16 * v)
                                           : _mm512_loadu_si512((const void *)(b + 16 * v)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)am[r * lda + p * ak]);
#pragma GCC unroll 4
            for (int v = 0; v < NC; v++)
                cr[r][v] = _mm512_dpbf16_ps(cr[r][v], a, bv[v]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NC; v++)
            _mm512_mask_storeu_ps(cm + r * ldc + 16 * v,
                                  v == NC - 1 ? last : (__mmask16)0xffff, cr[r][v]);
}

S_TARGET void tp_attn_bf16_product(float *c, int64_t ldc, const uint32_t *a, int64_t lda,
                                   int64_t ak, const uint32_t *b, int64_t ldb, int64_t p0,
                                   int64_t p1, int acc, int64_t rows, int64_t cols) {
    for (int64_t cb = 0; cb < cols; cb += 64) {
        const int64_t w = cols - cb < 64 ? cols - cb : 64;
        const int nc = (int)((w + 15) / 16);
        const __mmask16 last = (__mmask16)(0xffffu >> (16 * nc - w));
#define S_CASE(R, NC)                                                                       \
    case (R) * 8 + (NC):                                                                    \
        s_block(R, NC, last, c + cb, ldc, a, lda, ak, b + cb, ldb, p0, p1, acc);            \
        break;
        switch (rows * 8 + nc) {
            S_CASE(4, 4) S_CASE(4, 3) S_CASE(4, 2) S_CASE(4, 1)
            S_CASE(3, 4) S_CASE(3, 3) S_CASE(3, 2) S_CASE(3, 1)
            S_CASE(2, 4) S_CASE(2, 3) S_CASE(2, 2) S_CASE(2, 1)
            S_CASE(1, 4) S_CASE(1, 3) S_CASE(1, 2) S_CASE(1, 1)
        default:
            break;
        }
#undef S_CASE
    }
}

#else /* no AVX-512: never called */

int tp_attn_bf16_usable(void) { return 0; }

void tp_attn_bf16_rows(uint32_t *dst, int64_t ldd, const float *src, int64_t lds,
                       int64_t rows, int64_t n) {
    (void)dst, (void)ldd, (void)src, (void)lds, (void)rows, (void)n;
}

void tp_attn_bf16_pairs(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                        int64_t cols) {
    (void)dst, (void)ldd, (void)src, (void)lds, (void)n, (void)cols;
}

void tp_attn_bf16_product(float *c, int64_t ldc, const uint32_t *a, int64_t lda, int64_t ak,
                          const uint32_t *b, int64_t ldb, int64_t p0, int64_t p1, int acc,
                          int64_t rows, int64_t cols) {
    (void)c, (void)ldc, (void)a, (void)lda, (void)ak, (void)b, (void)ldb, (void)p0, (void)p1;
    (void)acc, (void)rows, (void)cols;
}
#endif
