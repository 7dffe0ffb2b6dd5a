/* towerpack gpu: e^x, log, tanh and erf for the CPU kernels' loops, in a
 * form GCC vectorises (libm's are a call per element).
 *
 * Each is straight-line float arithmetic and selects, inlined into the
 * caller's loop; the file that uses them is compiled without trapping
 * math (`#pragma GCC optimize("no-trapping-math")` after its includes),
 * which lets GCC turn the selects into masks instead of branches, and
 * without jump threading ("no-thread-jumps": with it GCC duplicates
 * s_vexp's polynomial for its correlated clamps and selects, and the
 * vector loop computes both copies: ops_elementwise.c). That
 * changes no value: it only allows computing both sides of a select. A
 * vector lane and the scalar tail do the same operations in the same
 * order (no FMA in the baseline ISA), so an element's bits do not depend
 * on where a loop, or a thread's part of it, starts. One exception, by
 * choice: s_vgelu_tanh writes its fused multiply-adds out (fmaf), in
 * clones by x86-64 level (TP_CPU_CLONES_FMA), where v4 and v3 have the
 * instruction and the baseline calls libm's fmaf, correctly rounded as
 * the instruction is: the same bits on every clone, lane and tail still
 * (checked on every float of its range), about half the operations.
 *
 * Accuracy, measured against double-precision libm on every float of the
 * range: s_vexp within 2.5e-7 relative over [-87, 88.7], exactly 0 below
 * -87.3 (where the result is denormal, flushed anyway by the backend's
 * FTZ), inf above, NaN kept; over [-30, 30] s_vtanh within 1.5e-7
 * relative, s_vsigmoid 1.5e-7, s_vsoftplus 2.3e-7 (2e-6 absolute near 20),
 * s_verf 6.6e-7 absolute near 0 (Abramowitz & Stegun 7.1.26, the form
 * PyTorch's vectorised erf uses; 1.5e-7 in theory, float rounding adds);
 * the tanh GELU (s_vgelu_tanh, a sigmoid, in FMAs) 5.2e-7 absolute over
 * [-20, 20].
 * The PyTorch parity tolerances of these ops (tests/gpu/op_cases.h) are
 * 1e-6 absolute plus 1e-5 relative. tp_cpu_sum8, last, is the lane sum
 * several kernels share. */
#ifndef TOWERPACK_GPU_CPU_MATH_H
#define TOWERPACK_GPU_CPU_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A loop function three times: AVX-512 (sixteen lanes) or AVX2 (eight)
 * where the CPU has it, else the baseline SSE2, picked once at load (an
 * ifunc). With the includer's fp-contract off, no FMA in any, so all give
 * the same bits. Not under the sanitizers: their runtime is not up yet when
 * the loader runs an ifunc's (instrumented) resolver. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define TP_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TP_CPU_CLONES
#endif

/* The clones for a loop that calls fmaf (s_vgelu_tanh): by x86-64 level,
 * since "avx512f" and "avx2" alone have no FMA and their fmaf would be a
 * libm call per element (ops_attention.c's clones, the same reason). The
 * baseline's fmaf is that call: the same bits, slower. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define TP_CPU_CLONES_FMA                                                                 \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TP_CPU_CLONES_FMA
#endif

static inline float s_vbits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t s_vf_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* e^x: Cephes' expf (a degree-5 polynomial on r = x - n ln2, n rounded
 * to nearest, times 2^n built in the exponent bits). */
static inline float s_vexp(float x) {
    float xc = x > 88.72283935546875f ? 88.72283935546875f : x;
    xc = xc > -87.3f ? xc : -87.3f; /* NaN -> -87.3, restored below */
    const float t = xc * 1.44269504088896341f;
    float fn = (t + 12582912.0f) - 12582912.0f; /* round to nearest (|t| < 2^22) */
    fn = fn > 127.0f ? 127.0f : fn;              /* 2^128 is not a float */
    const float r = (xc - fn * 0.693359375f) - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = (p * (r * r) + r) + 1.0f;
    float v = e * s_vbits_f((uint32_t)((int32_t)fn + 127) << 23);
    v = x < -87.3f ? 0.0f : v;
    v = x > 88.72283935546875f ? INFINITY : v;
    return x == x ? v : x;
}

/* Cephes' logf's reduction of u (a positive normal float): u = 2^e (1 +
 * m) with 1 + m in [sqrt(1/2), sqrt(2)); returns m, sets *e. s_vlog's and
 * s_vlog_fma's (the same operations: the same m and e in both). */
static inline float s_vlog_reduce(float u, float *e) {
    const uint32_t b = s_vf_bits(u);
    const float e0 = (float)((int32_t)(b >> 23) - 126);
    const float m = s_vbits_f((b & 0x007fffffu) | 0x3f000000u); /* [0.5, 1) */
    const int lo = m < 0.707106781186547524f;
    *e = lo ? e0 - 1.0f : e0;
    return lo ? m + m - 1.0f : m - 1.0f;
}

/* log(u) for u a positive normal float (or +inf): Cephes' logf. */
static inline float s_vlog(float u) {
    float e;
    const float m = s_vlog_reduce(u, &e);
    const float z = m * m;
    float y = 7.0376836292e-2f;
    y = y * m - 1.1514610310e-1f;
    y = y * m + 1.1676998740e-1f;
    y = y * m - 1.2420140846e-1f;
    y = y * m + 1.4249322787e-1f;
    y = y * m - 1.6668057665e-1f;
    y = y * m + 2.0000714765e-1f;
    y = y * m - 2.4999993993e-1f;
    y = y * m + 3.3333331174e-1f;
    y = y * m * z;
    y += -2.12194440e-4f * e;
    y += -0.5f * z;
    float r = m + y;
    r += 0.693359375f * e;
    return u == INFINITY ? u : r;
}

/* log(1 + e^x), the softplus, for any x: x itself above 20 (as torch's
 * threshold), else log1p(e^x) as log(u) e^x / (u - 1), u = 1 + e^x (exact
 * where u rounds to 1: then e^x itself). */
static inline float s_vsoftplus(float x) {
    const float ex = s_vexp(x > 20.0f ? 20.0f : x);
    const float u = 1.0f + ex, d = u - 1.0f;
    const float q = ex / (d == 0.0f ? 1.0f : d);
    float r = s_vlog(u) * q;
    r = d == 0.0f ? ex : r;
    return x > 20.0f ? x : r;
}

/* 1 / (1 + e^-x). */
static inline float s_vsigmoid(float x) { return 1.0f / (1.0f + s_vexp(-x)); }

/* tanh: Cephes' tanhf, an odd polynomial below |x| 0.625, else
 * 1 - 2 / (e^2|x| + 1) with the sign of x (1 from |x| 9 on). */
static inline float s_vtanh(float x) {
    const float z = fabsf(x);
    const float zc = z > 9.0f ? 9.0f : z;
    const float s = s_vexp(zc + zc);
    float big = 1.0f - 2.0f / (s + 1.0f);
    big = x < 0.0f ? -big : big;
    const float w = x * x;
    float p = -5.70498872745e-3f;
    p = p * w + 2.06390887954e-2f;
    p = p * w - 5.37397155531e-2f;
    p = p * w + 1.33314422036e-1f;
    p = p * w - 3.33332819422e-1f;
    const float small = p * w * x + x;
    return z < 0.625f ? small : big; /* NaN: big, which is NaN */
}

/* erf: Abramowitz & Stegun 7.1.26, 1 - (a1 t + ... + a5 t^5) e^-x^2 with
 * t = 1 / (1 + p |x|), the sign of x. */
static inline float s_verf(float x) {
    const float z = fabsf(x);
    const float t = 1.0f / (1.0f + 0.3275911f * z);
    float p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    const float r = 1.0f - p * t * s_vexp(-z * z);
    return x < 0.0f ? -r : r;
}

/* GELU's derivatives: erf's (s_vgelu_grad_fma, below) and the tanh
 * approximation's (s_vgelu_tanh_grad): the gelu op's backward
 * (ops_elementwise.c) and batch_matmul's folded GELU (ops_linalg.c), the
 * same bits in both. */
/* e^z = e^r 2^n for z in [-87.3, 88] (the caller clamps), in fused
 * multiply-adds: returns e^r and sets *two_n, so that a caller can fuse
 * the product with what follows (s_vgelu_tanh's 1 + e^z). n = round(z /
 * ln 2) by the 1.5 x 2^23 trick, whose sum also holds n's bits for 2^n
 * (n in [-126, 127]: 2^n a normal float), r = z - n ln 2 in two FMAs
 * (Cephes' split of ln 2), e^r a degree-6 polynomial in Horner's FMAs (a
 * least-squares fit on Chebyshev nodes, 3.6e-9 relative over |r| <= ln 2
 * / 2, under a float's rounding; Cephes' degree 7 in s_vexp is more than
 * a float holds). s_vgelu_tanh's e^z (issue 45, branch gpt12) and
 * s_vexp_fma's. */
static inline float s_vexp_fma_poly(float r) {
    float p = 1.3753952e-3f;
    p = fmaf(p, r, 8.3689103e-3f);
    p = fmaf(p, r, 4.1669488e-2f);
    p = fmaf(p, r, 1.6666518e-1f);
    p = fmaf(p, r, 4.9999988e-1f);
    p = fmaf(p, r, 1.0f);
    return fmaf(p, r, 1.0f); /* e^r */
}

static inline float s_vexp_fma_parts(float z, float *two_n) {
    const float t = fmaf(z, 1.44269504088896341f, 12582912.0f);
    const float n = t - 12582912.0f; /* z / ln 2 rounded; t's low bits hold it */
    float r = fmaf(n, -0.693359375f, z);
    r = fmaf(n, 2.12194440e-4f, r);
    *two_n = s_vbits_f((s_vf_bits(t) << 23) + (127u << 23));
    return s_vexp_fma_poly(r);
}

/* The tanh approximation without a tanh: 0.5 (1 + tanh u) is the
 * sigmoid of 2u, so gelu_tanh(v) = v sigmoid(2u) = v / (1 + e^z), z =
 * -2u = v (-2k - 2k a v^2) (k = sqrt(2 / pi), a = 0.044715). The one
 * function here in fused multiply-adds (fmaf: the caller's clones must be
 * TP_CPU_CLONES_FMA's, below), and with its own e^z rather than s_vexp's:
 * the GPT's MLP runs it on 1,024 x 1,024 floats a layer inside its folded
 * product (ops_linalg.c), where it was a fifth of the fc node's forward.
 * e^z here: z clamped to [-87, 88] (so n fits the exponent without a
 * clamp of its own, and no selects after: past 88, y is set to -0 below;
 * under -87, 1 + e^z is 1 either way), then s_vexp_fma_parts, its
 * product with 2^n fused into 1 + e^z. Some 22 vector operations against
 * s_vexp's 35 and the division: 0.72 -> 0.36 ns a float over 1,024 x
 * 1,024 (one EPYC core, AVX-512; issue 45, branch gpt12,
 * docs/performance.md). Measured on every float of [-20, 20] against the
 * double formula: 5.2e-7 absolute (the result's own rounding at v 4.7; as
 * before), 1.2e-6 relative over |v| < 4 (1.5e-6 before); the default
 * clone's bits (libm's fmaf) equal the AVX-512 clone's on all 2.2e9 of
 * them. -0 where z > 88 (v below about -10.03, |y| < 1e-37; -inf gives -0,
 * its limit), +inf for +inf, NaN for NaN. */
static inline float s_vgelu_tanh(float v) {
    const float z0 = v * fmaf(v * v, -1.5957692f * 0.044715f, -1.5957692f);
    float z = z0 > 88.0f ? 88.0f : z0;
    z = z > -87.0f ? z : -87.0f; /* NaN -> -87: y is v's NaN */
    float two_n;
    const float p = s_vexp_fma_parts(z, &two_n);
    const float y = v / fmaf(p, two_n, 1.0f);
    return z0 > 88.0f ? -0.0f : y;
}

/* e^x in FMAs (s_vexp_fma_parts; the caller's clones TP_CPU_CLONES_FMA's
 * or x86-64 levels, as s_vgelu_tanh's): the attention's softmax, where
 * x = score - running max <= 0 (ops_attention.c, which has an AVX-512
 * twin of it, operation for operation). About 17 operations against
 * s_vexp's 35. 0 below -87.3 (as s_vexp), inf above 88 (where s_vexp is
 * finite up to 88.72: a range the softmax never reaches), NaN for NaN.
 * Within 7.6e-8 relative of double-precision exp over [-87.3, 88]
 * (every float there, worst at -70.35; s_vexp 8.2e-8 on the same floats;
 * tests/gpu/test_cpu_pool.c holds 8e-8). */
static inline float s_vexp_fma(float x) {
    float z = x < 88.0f ? x : 88.0f;
    z = z > -87.3f ? z : -87.3f; /* NaN -> -87.3, selected away below */
    float two_n;
    const float y = s_vexp_fma_parts(z, &two_n) * two_n;
    return x < -87.3f ? 0.0f : x > 88.0f ? INFINITY : x == x ? y : x;
}

/* e^x for x in [-87.3, 88] alone, in fused multiply-adds, without
 * clamps or selects (s_vexp_fma's reduction and polynomial: within 7.6e-8
 * relative of double precision there): the caller checks the range a
 * block at a time and takes s_vexp for the items outside it
 * (ops_elementwise.c's S_FIXED), so the vector loop is the arithmetic
 * alone, some 14 operations against s_vexp's 35 and their masks. The
 * caller's clones TP_CPU_CLONES_FMA's. Outside the range its value is
 * meaningless (never a trap: no float-to-integer conversion). */
static inline float s_vexp_fma_core(float x) {
    float two_n;
    const float p = s_vexp_fma_parts(x, &two_n);
    return p * two_n;
}

/* s_verf in fused multiply-adds for |x| <= 9.3 (x^2 within e^x's fast
 * range, s_vexp_fma_core; the caller takes s_verf outside, where erf is
 * +-1 to the float), the caller's clones TP_CPU_CLONES_FMA's: the gelu
 * op's forward (ops_elementwise.c). */
/* |erf(z)| for z = |x| >= 0 given e = e^-z^2: A&S 7.1.26's 1 - (a1 t +
 * ... + a5 t^5) e, t = 1 / (1 + p z), in FMAs (s_verf_fma's and
 * s_vgelu_grad_fma's). */
static inline float s_verf_abs_fma(float z, float e) {
    const float t = 1.0f / fmaf(0.3275911f, z, 1.0f);
    float p = 1.061405429f;
    p = fmaf(p, t, -1.453152027f);
    p = fmaf(p, t, 1.421413741f);
    p = fmaf(p, t, -0.284496736f);
    p = fmaf(p, t, 0.254829592f);
    return fmaf(-(p * t), e, 1.0f);
}

static inline float s_verf_fma(float x) {
    const float z = fabsf(x);
    const float r = s_verf_abs_fma(z, s_vexp_fma_core(-z * z));
    return x < 0.0f ? -r : r;
}

/* Phi(v) + v phi(v), erf's GELU's derivative: erf's e^-z^2 (z = v /
 * sqrt 2) is phi's e^(-v^2 / 2), computed once (s_verf_fma's steps) in
 * fused multiply-adds, for any v: e^-z^2 by
 * s_vexp_fma_core with -z^2 held at -87.3 (e^-87.3 is 1.2e-38 where it
 * was 0: the derivative moves by under 1e-36, past |v| 13.2), NaN kept
 * (through t). The caller's clones TP_CPU_CLONES_FMA's: the gelu op's
 * backward and batch_matmul's folded GELU (ops_linalg.c), the same bits
 * in both. */
static inline float s_vgelu_grad_fma(float v) {
    const float z = v * (float)0.70710678118654752440, az = fabsf(z); /* 1 / sqrt 2 */
    const float q = -az * az;
    const float e = s_vexp_fma_core(q > -87.3f ? q : -87.3f);
    const float r = s_verf_abs_fma(az, e);
    const float cdf = 0.5f * (1.0f + (z < 0.0f ? -r : r));
    return fmaf(v * 0.3989422804014327f, e, cdf);
}

/* s_vlog in fused multiply-adds (Cephes' polynomial in Horner's FMAs, its
 * two-part ln 2 fused too): log(u) for u a positive normal float or +inf,
 * the caller's clones TP_CPU_CLONES_FMA's. About 20 operations against
 * s_vlog's 30; within 8.1e-8 relative of double precision where |log u|
 * > 0.05 and 2e-9 absolute nearer u = 1, as s_vlog (every seventh float
 * of the normal range; tests/gpu/test_cpu_pool.c). */
static inline float s_vlog_fma(float u) {
    float e;
    const float m = s_vlog_reduce(u, &e);
    const float z = m * m;
    float y = 7.0376836292e-2f;
    y = fmaf(y, m, -1.1514610310e-1f);
    y = fmaf(y, m, 1.1676998740e-1f);
    y = fmaf(y, m, -1.2420140846e-1f);
    y = fmaf(y, m, 1.4249322787e-1f);
    y = fmaf(y, m, -1.6668057665e-1f);
    y = fmaf(y, m, 2.0000714765e-1f);
    y = fmaf(y, m, -2.4999993993e-1f);
    y = fmaf(y, m, 3.3333331174e-1f);
    y = y * m * z;
    y = fmaf(e, -2.12194440e-4f, y);
    y = fmaf(z, -0.5f, y);
    const float r = fmaf(e, 0.693359375f, m + y);
    return u == INFINITY ? u : r;
}

/* log(1 + e^x) as s_vsoftplus for x in [-87.3, 20] (the caller takes
 * s_vsoftplus outside), its e^x and log in FMAs (the caller's clones
 * TP_CPU_CLONES_FMA's). */
static inline float s_vsoftplus_fma(float x) {
    const float ex = s_vexp_fma_core(x);
    const float u = 1.0f + ex, d = u - 1.0f;
    const float q = ex / (d == 0.0f ? 1.0f : d);
    const float r = s_vlog_fma(u) * q;
    return d == 0.0f ? ex : r;
}

/* 0.5 (1 + t) + 0.5 v (1 - t^2) u' with s = 0.5 (1 + t): 1 - t^2 is
 * 4 s (1 - s). The sigmoid s is read back from the forward's y =
 * s_vgelu_tanh(v) as y / v, silu's way (ops_elementwise.c): a division
 * instead of an e^x and a division, 0.95 -> 0.39-0.45 ms over the GPT's
 * 1,024 x 1,024 pre-activations with the bias gradient's sums, one core
 * (issue 45, branch gpt8; docs/performance.md). s is then within 1 ulp
 * of 1 / (1 + e^-2u) (two roundings for one), the derivative within
 * 3.6e-6 absolute of the double formula over [-20, 20] (2e-6 computing s
 * afresh: the bits of 1 - s lost near s = 1, times 2 v u', worst at v
 * 4-5). Below |v| 1e-30 (v 0, or y flushed to 0) s is 0.5, its value
 * rounded; a NaN or infinite v gives NaN, as before. */
static inline float s_vgelu_tanh_grad(float v, float y) {
    const float s = fabsf(v) < 1e-30f ? 0.5f : y / v;
    const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * v * v);
    return s + 2.0f * v * s * (1.0f - s) * du;
}

/* Sum of n floats in 8 interleaved lanes: GCC vectorises it, and the
 * order is fixed (the same bits wherever it runs). The bias gradients and
 * the pooling means of ops_cpu.c and ops_conv.c. */
static inline float tp_cpu_sum8(const float *restrict r, size_t n) {
    float lane[8] = {0};
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            lane[l] += r[j + (size_t)l];
    float s = 0.0f;
    for (; j < n; j++)
        s += r[j];
    for (int l = 0; l < 8; l++)
        s += lane[l];
    return s;
}

#endif
