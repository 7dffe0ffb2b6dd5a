/* towerpack: a fast seedable RNG (xoshiro256**) with independent streams.
 *
 * tp_rng_init(&r, seed, stream) gives a generator whose sequence depends on
 * both numbers: workers share the seed and take their index as the stream,
 * so each gets its own sequence and a run is reproducible. The state is a
 * plain struct: checkpoints save and restore it as four words. */
#ifndef TOWERPACK_RNG_H
#define TOWERPACK_RNG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_rng {
    uint64_t s[4];
} tp_rng_t;

/* Seed from (seed, stream) through splitmix64; never an all-zero state. */
void tp_rng_init(tp_rng_t *r, uint64_t seed, uint64_t stream);

static inline uint64_t tp_rng_rotl_(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

/* Next 64 random bits. */
static inline uint64_t tp_rng_u64(tp_rng_t *r) {
    uint64_t *s = r->s;
    uint64_t result = tp_rng_rotl_(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = tp_rng_rotl_(s[3], 45);
    return result;
}

static inline uint32_t tp_rng_u32(tp_rng_t *r) {
    return (uint32_t)(tp_rng_u64(r) >> 32);
}

/* Uniform in [0, 1). */
static inline double tp_rng_double(tp_rng_t *r) {
    return (double)(tp_rng_u64(r) >> 11) * 0x1.0p-53;
}
static inline float tp_rng_float(tp_rng_t *r) {
    return (float)(tp_rng_u64(r) >> 40) * 0x1.0p-24f;
}

/* Uniform integer in [0, n) without modulo bias (Lemire); n > 0. */
static inline uint64_t tp_rng_below(tp_rng_t *r, uint64_t n) {
    uint64_t x = tp_rng_u64(r);
    __uint128_t m = (__uint128_t)x * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t thresh = (0 - n) % n;
        while (lo < thresh) {
            x = tp_rng_u64(r);
            m = (__uint128_t)x * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

/* Standard normal (Box-Muller). */
double tp_rng_normal(tp_rng_t *r);

/* Fisher-Yates shuffle of n indices in place. */
void tp_rng_shuffle_u32(tp_rng_t *r, uint32_t *idx, size_t n);

/* Advance by 2^128 steps: a non-overlapping sub-sequence. */
void tp_rng_jump(tp_rng_t *r);

#ifdef __cplusplus
}
#endif
#endif
