/* towerpack bench: this CPU's peak for the bf16 products (issue 45), so
 * that "% of peak" is measured, not assumed. Three loops of 12 independent
 * accumulators in registers (each a chain of its own, more than the
 * instructions' latency in flight), one thread, wall time:
 *   VDPBF16PS zmm   32 bf16 pairs multiplied and added into 16 fp32 lanes:
 *                   64 flops an instruction
 *   VFMADD zmm      16 lanes, 32 flops
 *   VFMADD ymm      8 lanes, 16 flops
 * Zen 4 runs 512-bit operations as two 256-bit halves, so FMA zmm and ymm
 * give the same flops a cycle; the bf16 dot product's ratio to FMA zmm is
 * the bf16 products' headroom over fp32 (docs/performance.md, branch
 * bf16gemm). The accumulators start apart (1, 2, ...) so that the
 * compiler cannot merge them into one.
 *
 *   cmake --build build --target bf16_peak && build/bench/bf16_peak [ROUNDS] */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double s_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define S_12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define S_ZMM(i) __m512 a##i = _mm512_set1_ps((float)(i));
#define S_YMM(i) __m256 a##i = _mm256_set1_ps((float)(i));
#define S_SUMZ(i) s = _mm512_add_ps(s, a##i);
#define S_SUMY(i) s = _mm256_add_ps(s, a##i);

enum { S_ITERS = 20000000 };

/* GF/s of 12 x S_ITERS VDPBF16PS zmm */
__attribute__((target("avx512f,avx512bf16"))) static double s_dpbf16(void) {
    S_12(S_ZMM)
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(1);
    const double t = s_now();
    for (long r = 0; r < S_ITERS; r++) {
#define S_DP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
        S_12(S_DP)
        __asm__ volatile("" : "+v"(x), "+v"(y)); /* not hoisted */
    }
    const double dt = s_now() - t;
    __m512 s = _mm512_setzero_ps();
    S_12(S_SUMZ)
    volatile float keep = _mm512_reduce_add_ps(s);
    (void)keep;
    return 12.0 * S_ITERS * 64 / dt * 1e-9;
}

__attribute__((target("avx512f"))) static double s_fma_zmm(void) {
    S_12(S_ZMM)
    __m512 x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.0f);
    const double t = s_now();
    for (long r = 0; r < S_ITERS; r++) {
#define S_FZ(i) a##i = _mm512_fmadd_ps(x, y, a##i);
        S_12(S_FZ)
        __asm__ volatile("" : "+v"(x), "+v"(y));
    }
    const double dt = s_now() - t;
    __m512 s = _mm512_setzero_ps();
    S_12(S_SUMZ)
    volatile float keep = _mm512_reduce_add_ps(s);
    (void)keep;
    return 12.0 * S_ITERS * 32 / dt * 1e-9;
}

__attribute__((target("avx2,fma"))) static double s_fma_ymm(void) {
    S_12(S_YMM)
    __m256 x = _mm256_set1_ps(1e-9f), y = _mm256_set1_ps(1.0f);
    const double t = s_now();
    for (long r = 0; r < S_ITERS; r++) {
#define S_FY(i) a##i = _mm256_fmadd_ps(x, y, a##i);
        S_12(S_FY)
        __asm__ volatile("" : "+x"(x), "+x"(y));
    }
    const double dt = s_now() - t;
    __m256 s = _mm256_setzero_ps();
    S_12(S_SUMY)
    float o[8];
    _mm256_storeu_ps(o, s);
    volatile float keep = o[0];
    (void)keep;
    return 12.0 * S_ITERS * 16 / dt * 1e-9;
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (!__builtin_cpu_supports("avx512bf16")) {
        fprintf(stderr, "bf16-peak: this CPU has no AVX512_BF16\n");
        return 1;
    }
    printf("GF/s, one thread: VDPBF16PS zmm | FMA zmm | FMA ymm | bf16 / FMA zmm\n");
    for (int r = 0; r < rounds; r++) {
        const double d = s_dpbf16(), z = s_fma_zmm(), y = s_fma_ymm();
        printf("%.1f | %.1f | %.1f | %.2f\n", d, z, y, d / z);
    }
    return 0;
}
