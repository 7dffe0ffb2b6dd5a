/* towerpack core: xoshiro256** seeding, normal deviates, shuffles, jumps. */
#include <math.h>
#include <towerpack/rng.h>

static uint64_t s_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tp_rng_init(tp_rng_t *r, uint64_t seed, uint64_t stream) {
    /* Mix the stream through its own splitmix round first so that
     * (seed, stream) and (seed + 1, stream - 1) do not collide. */
    uint64_t st = stream;
    uint64_t x = seed ^ s_splitmix64(&st);
    for (int i = 0; i < 4; i++)
        r->s[i] = s_splitmix64(&x);
    if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0)
        r->s[0] = 1;
}

double tp_rng_normal(tp_rng_t *r) {
    double u1 = tp_rng_double(r);
    double u2 = tp_rng_double(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void tp_rng_shuffle_u32(tp_rng_t *r, uint32_t *idx, size_t n) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)tp_rng_below(r, i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

void tp_rng_jump(tp_rng_t *r) {
    static const uint64_t jump[] = {0x180ec6d33cfd0abaull,
                                    0xd5a61266f0c9392cull,
                                    0xa9582618e03fc9aaull,
                                    0x39abdc4529b1661cull};
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int i = 0; i < 4; i++) {
        for (int b = 0; b < 64; b++) {
            if (jump[i] & (1ull << b)) {
                s0 ^= r->s[0];
                s1 ^= r->s[1];
                s2 ^= r->s[2];
                s3 ^= r->s[3];
            }
            tp_rng_u64(r);
        }
    }
    r->s[0] = s0;
    r->s[1] = s1;
    r->s[2] = s2;
    r->s[3] = s3;
}
