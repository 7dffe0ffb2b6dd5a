/* towerpack core: Philox4x32-10, a counter-based generator, and the noise
 * it draws (the GAN trainers' z, towerpack/gan.h).
 *
 * Counter-based: a number is a pure function of (key, counter), so any
 * element of a noise batch can be computed alone, in any order, by any
 * thread of any device. The host (tp_gan_noise_fill) and the CUDA kernel
 * (gpu/cuda/noise.cu, which includes this header) run the SAME code, so a
 * GPU run draws the host's numbers to the bit and CPU and GPU runs stay
 * comparable. Philox4x32-10 as Salmon et al., "Parallel random numbers:
 * as easy as 1, 2, 3" (SC'11) define it (Random123's philox4x32, its
 * known-answer vectors checked in tests/core/test_philox.c).
 *
 * Bit-equality needs the same IEEE operations in the same order on both
 * sides: the normal draw uses only +, -, *, / and sqrt (each correctly
 * rounded on a CPU and, in double, on a CUDA device), never libm's log or
 * cos (whose last bits differ between glibc and CUDA), and no operation a
 * compiler may fuse (a * b + c into an FMA rounds once, not twice): the
 * products and sums go through TP_PHILOX_DMUL / TP_PHILOX_DADD, which the
 * host makes with a volatile store and the CUDA file defines as
 * __dmul_rn / __dadd_rn. TP_PHILOX_FN is the functions' qualifier (the
 * CUDA file adds __device__). Header only: nothing else compiles
 * differently for CUDA. */
#ifndef TOWERPACK_PHILOX_H
#define TOWERPACK_PHILOX_H

#include <stdint.h>

#ifndef TP_PHILOX_FN
#define TP_PHILOX_FN static inline
#endif
#ifndef TP_PHILOX_DMUL
/* a rounded product the compiler cannot fuse with a following add */
static inline double tp_philox_dmul_(double a, double b) {
    volatile double r = a * b;
    return r;
}
static inline double tp_philox_dadd_(double a, double b) {
    volatile double r = a + b;
    return r;
}
#define TP_PHILOX_DMUL(a, b) tp_philox_dmul_((a), (b))
#define TP_PHILOX_DADD(a, b) tp_philox_dadd_((a), (b))
#endif
#ifndef TP_PHILOX_DSQRT
#include <math.h>
#define TP_PHILOX_DSQRT(a) sqrt(a) /* correctly rounded (IEEE 754) */
#endif

/* Four 32-bit words of output, the counter or the key's two. */
typedef struct {
    uint32_t v[4];
} tp_philox4_t;

/* Philox4x32 with 10 rounds: out = philox(counter, key {k0, k1}). */
TP_PHILOX_FN tp_philox4_t tp_philox4x32_10(tp_philox4_t c, uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c.v[0];
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * c.v[2];
        tp_philox4_t n;
        n.v[0] = (uint32_t)(p1 >> 32) ^ c.v[1] ^ k0;
        n.v[1] = (uint32_t)p1;
        n.v[2] = (uint32_t)(p0 >> 32) ^ c.v[3] ^ k1;
        n.v[3] = (uint32_t)p0;
        c = n;
        k0 += 0x9E3779B9u; /* the Weyl sequence of the key */
        k1 += 0xBB67AE85u;
    }
    return c;
}

/* ln(s) for s in (0, 1], from + - * / alone: s = m 2^e with m in
 * [sqrt(1/2), sqrt(2)), ln m = 2 atanh(f), f = (m - 1) / (m + 1),
 * |f| <= 0.172, its series to f^17 (next term < 1e-15 relative). The
 * exponent is taken by halving and doubling, which are exact. */
TP_PHILOX_FN double tp_philox_ln_(double s) {
    int e = 0;
    while (s < 0.70710678118654752) { /* s >= 2^-64 here (polar's s) */
        s = s * 2.0;
        e--;
    }
    const double f = (s - 1.0) / (s + 1.0);
    const double z = TP_PHILOX_DMUL(f, f);
    /* Horner's rule, one rounded product and one rounded sum a term */
#define TP_PHILOX_H_(p, c) TP_PHILOX_DADD(TP_PHILOX_DMUL((p), z), (c))
    double p = 1.0 / 17.0;
    p = TP_PHILOX_H_(p, 1.0 / 15.0);
    p = TP_PHILOX_H_(p, 1.0 / 13.0);
    p = TP_PHILOX_H_(p, 1.0 / 11.0);
    p = TP_PHILOX_H_(p, 1.0 / 9.0);
    p = TP_PHILOX_H_(p, 1.0 / 7.0);
    p = TP_PHILOX_H_(p, 1.0 / 5.0);
    p = TP_PHILOX_H_(p, 1.0 / 3.0);
    p = TP_PHILOX_H_(p, 1.0);
#undef TP_PHILOX_H_
    return TP_PHILOX_DADD(TP_PHILOX_DMUL((double)e, 0.69314718055994531),
                          TP_PHILOX_DMUL(2.0 * f, p));
}

/* A 32-bit word as a double in (-1, 1): (w + 0.5) 2^-31 - 1, exact. */
TP_PHILOX_FN double tp_philox_sym_(uint32_t w) {
    return ((double)w + 0.5) * (1.0 / 2147483648.0) - 1.0;
}

/* Element k of noise row `row` of step `step` under `seed`: uniform in
 * [-scale, scale) (normal 0) or N(0, scale^2) (normal 1). The counter is
 * (block, row, step + 1 low, step + 1 high ^ row high), the key the seed;
 * step -1 (a draw outside training: tp-generate, sample grids) is counter
 * word 0. Uniform: word k % 4 of block k / 4, its top 24 bits u, 2u - 1.
 * Normal: Marsaglia's polar method for the pair k / 2 (element k takes
 * the pair's first or second number), attempt a (0..15) the words 2(a%2),
 * 2(a%2)+1 of block (k / 2) x 8 + a / 2; after 16 rejected attempts
 * (probability 2e-11) the pair is 0. */
TP_PHILOX_FN float tp_philox_noise(uint64_t seed, int64_t step, int64_t row, int64_t k,
                                   int normal, float scale) {
    const uint64_t st = (uint64_t)(step + 1);
    const uint64_t rw = (uint64_t)row;
    tp_philox4_t c;
    c.v[1] = (uint32_t)rw;
    c.v[2] = (uint32_t)st;
    c.v[3] = (uint32_t)(st >> 32) ^ (uint32_t)(rw >> 32);
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    if (!normal) {
        c.v[0] = (uint32_t)(k >> 2);
        const tp_philox4_t o = tp_philox4x32_10(c, k0, k1);
        const float u = (float)(o.v[k & 3] >> 8) * (1.0f / 16777216.0f);
        return scale * (2.0f * u - 1.0f); /* 2u - 1 is exact */
    }
    const uint64_t pair = (uint64_t)k >> 1;
    for (int a = 0; a < 16; a++) {
        c.v[0] = (uint32_t)(pair * 8 + (uint64_t)(a >> 1));
        const tp_philox4_t o = tp_philox4x32_10(c, k0, k1);
        const double x = tp_philox_sym_(o.v[2 * (a & 1)]);
        const double y = tp_philox_sym_(o.v[2 * (a & 1) + 1]);
        const double s = TP_PHILOX_DADD(TP_PHILOX_DMUL(x, x), TP_PHILOX_DMUL(y, y));
        if (s >= 1.0 || s < 1e-19)
            continue;
        const double t = TP_PHILOX_DSQRT(TP_PHILOX_DMUL(-2.0, tp_philox_ln_(s)) / s);
        return scale * (float)TP_PHILOX_DMUL((k & 1) ? y : x, t);
    }
    return 0.0f;
}

/* rows x dim noise into out[rows x dim]: row r is the step's row row0 + r
 * (tp_philox_noise of each element). */
TP_PHILOX_FN void tp_philox_noise_fill(uint64_t seed, int64_t step, int64_t row0,
                                       int64_t rows, int64_t dim, int normal,
                                       float scale, float *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < dim; k++)
            out[r * dim + k] = tp_philox_noise(seed, step, row0 + r, k, normal, scale);
}

#endif
