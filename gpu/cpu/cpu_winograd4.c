/* towerpack gpu: Winograd F(4x4, 3x3) of our own (cpu_winograd4.h): the
 * transforms, 16 channels a vector, and the 36 products of each pass
 * (cpu_wino_gemm.c).
 *
 * The matrices (one 4x4 output tile from one 6x6 input tile), from the
 * points 0, a, -a, b, -b and infinity with a = 5/8, b = 3/2:
 *   A^T = [1 1 1 1 1 0; 0 a -a b -b 0; 0 a^2 a^2 b^2 b^2 0;
 *          0 a^3 -a^3 b^3 -b^3 1]                    (the points' powers)
 *   B^T's row of point p: M(x) / (x - p)'s coefficients, M(x) = x (x^2 -
 *       a^2)(x^2 - b^2) (rows 0 and 5: a^2 b^2, -(a^2 + b^2) and 1)
 *   G   = [256/225 0 0; -2048/2975 -256/595 -32/119;
 *          -2048/2975 256/595 -32/119; 128/1071 64/357 32/119;
 *          128/1071 -64/357 32/119; 0 0 1]       (what makes A^T, B^T exact)
 * Lavin and Gray's points 0, +-1, +-2 (B^T's 4s and 5s, A^T's 8s, G's
 * 1/24) rounded 3-4 times worse: stage 4's y 1.64e-5 of its largest value
 * against 4.9e-6 here (oneDNN's F(4x4) 0.9-2.9e-6; docs/performance.md,
 * branch wino7). A^T's and B^T's entries are exact in float32; the 1-D
 * transforms take as many operations as Lavin's within a few (B^T 12
 * against 15, B 16 against 20, G and G^T one or two fewer, A^T and A one
 * or two more).
 * The backward passes apply their transposes in the reverse order, as
 * F(2x2)'s do (cpu_winograd.c). Why F(4x4) on stage 4: 36 products of
 * N x C x O (302 MFLOP a pass at batch 16) against F(2x2)'s 16 of 4N x C x
 * O (537), at 86-92 GF/s on our GEMM; U is 2.25 times F(2x2)'s (37.7 MB a
 * layer at 512 channels), made once a step by the forward and kept for
 * the backward-data (docs/performance.md, branch wino6). */
#include "gpu/cpu/cpu_winograd4.h"

#include <immintrin.h>
#include <string.h>

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/cpu_wino_gemm.h"

#if defined(__clang__)
#define S_AVX512 __attribute__((target("avx512f")))
#else
#define S_AVX512 __attribute__((target("avx512f"), optimize("O3")))
#endif

enum { S_A = 6, S_R = 4, S_P = 36 };

typedef struct {
    const tp_wino_t *g;
    const float *src, *b;
    float *dst;
    int relu, add;
    float *out; /* the backward-weights' dw (dst: dU's room) */
} s_job_t;

/* U's and V's floats from one position to the next (their panels of 32
 * channels: O and C rounded up to 32) */
static size_t s_u_plane(const tp_wino_t *g) { return g->c * ((g->o + 31) / 32 * 32); }
static size_t s_v_plane(const tp_wino_t *g) { return g->t * ((g->c + 31) / 32 * 32); }

size_t tp_wino4_u_floats(const tp_wino_t *g) { return S_P * s_u_plane(g); }

size_t tp_wino4_v_floats(const tp_wino_t *g) {
    const size_t v = s_v_plane(g), dv = g->c * g->tp; /* V's room is dV's too */
    return S_P * (v > dv ? v : dv);
}

/* ---- the 1-D transforms ---------------------------------------------------- */

#define S_SET(x) _mm512_set1_ps(x)
#define S_FMA(a, b, c) _mm512_fmadd_ps(S_SET(a), b, c)

/* The points a = 5/8, b = 3/2 and the powers the transforms take */
#define S_PA 0.625f          /* a */
#define S_PB 1.5f            /* b */
#define S_PA2 0.390625f      /* a^2 */
#define S_PB2 2.25f          /* b^2 */
#define S_PA3 0.244140625f   /* a^3 */
#define S_PB3 3.375f         /* b^3 */
#define S_PAB2 0.87890625f   /* a^2 b^2 */
#define S_PS2 2.640625f      /* a^2 + b^2 */

/* B^T d (six in, six out) */
S_AVX512 static inline void s_bt(const __m512 *d, __m512 *o) {
    const __m512 e12 = S_FMA(-S_PB2, d[2], d[4]), o12 = S_FMA(-S_PB2, d[1], d[3]);
    const __m512 e34 = S_FMA(-S_PA2, d[2], d[4]), o34 = S_FMA(-S_PA2, d[1], d[3]);
    o[0] = S_FMA(S_PAB2, d[0], S_FMA(-S_PS2, d[2], d[4]));
    o[1] = S_FMA(S_PA, o12, e12);
    o[2] = S_FMA(-S_PA, o12, e12);
    o[3] = S_FMA(S_PB, o34, e34);
    o[4] = S_FMA(-S_PB, o34, e34);
    o[5] = S_FMA(S_PAB2, d[1], S_FMA(-S_PS2, d[3], d[5]));
}

/* B v (B^T's transpose: six in, six out) */
S_AVX512 static inline void s_b(const __m512 *v, __m512 *o) {
    const __m512 d21 = _mm512_sub_ps(v[2], v[1]), d43 = _mm512_sub_ps(v[4], v[3]);
    const __m512 s12 = _mm512_add_ps(v[1], v[2]), s34 = _mm512_add_ps(v[3], v[4]);
    o[0] = _mm512_mul_ps(S_SET(S_PAB2), v[0]);
    o[1] = S_FMA(S_PA * S_PB2, d21, S_FMA(S_PB * S_PA2, d43, _mm512_mul_ps(S_SET(S_PAB2), v[5])));
    o[2] = S_FMA(-S_PS2, v[0], S_FMA(-S_PB2, s12, _mm512_mul_ps(S_SET(-S_PA2), s34)));
    o[3] = S_FMA(-S_PA, d21, S_FMA(-S_PB, d43, _mm512_mul_ps(S_SET(-S_PS2), v[5])));
    o[4] = _mm512_add_ps(_mm512_add_ps(v[0], s12), s34);
    o[5] = v[5];
}

/* G's entries (the header's G) */
#define S_G0 (256.0f / 225.0f)
#define S_G1A (2048.0f / 2975.0f)
#define S_G1B (256.0f / 595.0f)
#define S_G3A (128.0f / 1071.0f)
#define S_G3B (64.0f / 357.0f)
#define S_GC (32.0f / 119.0f)

/* G g (three in, six out) */
S_AVX512 static inline void s_g(const __m512 *g, __m512 *o) {
    const __m512 c2 = _mm512_mul_ps(S_SET(S_GC), g[2]);
    const __m512 e12 = S_FMA(S_G1A, g[0], c2), e34 = S_FMA(S_G3A, g[0], c2);
    o[0] = _mm512_mul_ps(S_SET(S_G0), g[0]);
    o[1] = _mm512_fnmsub_ps(S_SET(S_G1B), g[1], e12); /* -(e12 + G1B g1) */
    o[2] = _mm512_fmsub_ps(S_SET(S_G1B), g[1], e12);
    o[3] = S_FMA(S_G3B, g[1], e34);
    o[4] = S_FMA(-S_G3B, g[1], e34);
    o[5] = g[2];
}

/* G^T u (six in, three out) */
S_AVX512 static inline void s_gt(const __m512 *u, __m512 *o) {
    const __m512 s12 = _mm512_add_ps(u[1], u[2]), s34 = _mm512_add_ps(u[3], u[4]);
    o[0] = S_FMA(S_G0, u[0], S_FMA(-S_G1A, s12, _mm512_mul_ps(S_SET(S_G3A), s34)));
    o[1] = S_FMA(S_G1B, _mm512_sub_ps(u[2], u[1]),
                 _mm512_mul_ps(S_SET(S_G3B), _mm512_sub_ps(u[3], u[4])));
    o[2] = S_FMA(S_GC, _mm512_sub_ps(s34, s12), u[5]);
}

/* A^T m (six in, four out) */
S_AVX512 static inline void s_at(const __m512 *m, __m512 *o) {
    const __m512 s12 = _mm512_add_ps(m[1], m[2]), d12 = _mm512_sub_ps(m[1], m[2]);
    const __m512 s34 = _mm512_add_ps(m[3], m[4]), d34 = _mm512_sub_ps(m[3], m[4]);
    o[0] = _mm512_add_ps(_mm512_add_ps(m[0], s12), s34);
    o[1] = S_FMA(S_PA, d12, _mm512_mul_ps(S_SET(S_PB), d34));
    o[2] = S_FMA(S_PA2, s12, _mm512_mul_ps(S_SET(S_PB2), s34));
    o[3] = S_FMA(S_PA3, d12, S_FMA(S_PB3, d34, m[5]));
}

/* A y (four in, six out) */
S_AVX512 static inline void s_a(const __m512 *y, __m512 *o) {
    const __m512 ea = S_FMA(S_PA2, y[2], y[0]), eb = S_FMA(S_PB2, y[2], y[0]);
    const __m512 oa = S_FMA(S_PA, y[1], _mm512_mul_ps(S_SET(S_PA3), y[3]));
    const __m512 ob = S_FMA(S_PB, y[1], _mm512_mul_ps(S_SET(S_PB3), y[3]));
    o[0] = y[0];
    o[1] = _mm512_add_ps(ea, oa);
    o[2] = _mm512_sub_ps(ea, oa);
    o[3] = _mm512_add_ps(eb, ob);
    o[4] = _mm512_sub_ps(eb, ob);
    o[5] = y[3];
}

/* ---- the weights ----------------------------------------------------------- */

/* Panels [lo, hi) of 32 output channels: U[p][panel][c][0..31] for every
 * input channel c, 16 output channels a vector, from the 16 kernels' 9
 * taps turned tap-major through a small buffer (as F(2x2)'s). */
S_AVX512 static void s_weights_range(void *arg, size_t lo, size_t hi) {
    const s_job_t *j = arg;
    const size_t c = j->g->c, o = j->g->o, plane = s_u_plane(j->g);
    float tap[9][16] __attribute__((aligned(64)));
    for (size_t kp = lo; kp < hi; kp++)
        for (size_t ci = 0; ci < c; ci++)
            for (size_t k0 = kp * 32; k0 < kp * 32 + 32 && k0 < o; k0 += 16) {
                const float *w = j->src + (k0 * c + ci) * 9;
                for (int l = 0; l < 16; l++)
                    for (int i = 0; i < 9; i++)
                        tap[i][l] = w[(size_t)l * c * 9 + (size_t)i];
                __m512 t[S_A][3], col[3], row[S_A];
                for (int q = 0; q < 3; q++) {
                    for (int r = 0; r < 3; r++)
                        col[r] = _mm512_load_ps(tap[3 * r + q]);
                    s_g(col, row);
                    for (int r = 0; r < S_A; r++)
                        t[r][q] = row[r];
                }
                float *u = j->dst + kp * c * 32 + ci * 32 + k0 % 32;
                for (int r = 0; r < S_A; r++) {
                    s_g(t[r], row);
                    for (int s = 0; s < S_A; s++)
                        _mm512_storeu_ps(u + (size_t)(r * S_A + s) * plane, row[s]);
                }
            }
}

void tp_wino4_weights(const tp_wino_t *g, const float *w, float *u) {
    s_job_t j = {g, w, NULL, u, 0, 0, NULL};
    tp_cpu_parallel((g->o + 31) / 32, 1, 1, s_weights_range, &j);
}

/* Output channels [k0, k1): dw[k][c..c+15] = G^T dU G, stored or added,
 * from dU's rows k - k0 (positions `plane` floats apart). */
S_AVX512 static void s_dweights(const tp_wino_t *g, const float *du, size_t plane, size_t k0,
                                size_t k1, float *dw, int add) {
    const size_t c = g->c;
    float tap[9][16] __attribute__((aligned(64)));
    for (size_t k = k0; k < k1; k++)
        for (size_t c0 = 0; c0 < c; c0 += 16) {
            const float *d = du + (k - k0) * c + c0;
            float *w = dw + (k * c + c0) * 9;
            __m512 t[3][S_A], col[S_A], row[3];
            for (int s = 0; s < S_A; s++) {
                for (int r = 0; r < S_A; r++)
                    col[r] = _mm512_loadu_ps(d + (size_t)(r * S_A + s) * plane);
                s_gt(col, row);
                for (int r = 0; r < 3; r++)
                    t[r][s] = row[r];
            }
            for (int r = 0; r < 3; r++) {
                s_gt(t[r], row);
                for (int q = 0; q < 3; q++)
                    _mm512_store_ps(tap[3 * r + q], row[q]);
            }
            tp_wino_taps_out(w, (const float(*)[16])tap, add);
        }
}

/* ---- the activations ------------------------------------------------------- */

/* Blocks [lo, hi) of x (image n, 16 channels b): V's rows of the image's
 * tiles in panel b / 2, columns b % 2 * 16.. */
S_AVX512 static void s_input_range(void *arg, size_t lo, size_t hi) {
    const s_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t cb = g->c / 16, plane = s_v_plane(g);
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / cb, b = it % cb;
        const float *x = j->src + it * g->h * g->w * 16;
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                __m512 t[S_A][S_A], col[S_A], row[S_A];
                for (int s = 0; s < S_A; s++) {
                    const long w = (long)(S_R * tj) - 1 + s;
                    for (int r = 0; r < S_A; r++) {
                        const long h = (long)(S_R * ti) - 1 + r;
                        col[r] = h < 0 || w < 0 || h >= (long)g->h || w >= (long)g->w
                                     ? _mm512_setzero_ps()
                                     : _mm512_loadu_ps(x + ((size_t)h * g->w + (size_t)w) * 16);
                    }
                    s_bt(col, row);
                    for (int r = 0; r < S_A; r++)
                        t[r][s] = row[r];
                }
                const size_t tile = (n * g->th + ti) * g->tw + tj;
                float *v = j->dst + b / 2 * g->t * 32 + tile * 32 + b % 2 * 16;
                for (int r = 0; r < S_A; r++) {
                    s_bt(t[r], row);
                    for (int s = 0; s < S_A; s++)
                        _mm512_storeu_ps(v + (size_t)(r * S_A + s) * plane, row[s]);
                }
            }
    }
}

void tp_wino4_input(const tp_wino_t *g, const float *x, float *v) {
    s_job_t j = {g, x, NULL, v, 0, 0, NULL};
    tp_cpu_parallel(g->n * (g->c / 16), 1, 4, s_input_range, &j);
}

/* Blocks [lo, hi) of y (image n, 16 channels b): A^T M A of its tiles,
 * plus the bias, through the relu; the tiles' parts past the edge dropped. */
S_AVX512 static void s_output_range(void *arg, size_t lo, size_t hi) {
    const s_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t ob = g->o / 16, plane = g->t * g->o;
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / ob, b = it % ob;
        const __m512 bias = j->b ? _mm512_loadu_ps(j->b + b * 16) : _mm512_setzero_ps();
        float *y = j->dst + it * g->h * g->w * 16;
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                const float *m = j->src + ((n * g->th + ti) * g->tw + tj) * g->o + b * 16;
                __m512 t[S_R][S_A], col[S_A], row[S_R];
                for (int s = 0; s < S_A; s++) {
                    for (int r = 0; r < S_A; r++)
                        col[r] = _mm512_loadu_ps(m + (size_t)(r * S_A + s) * plane);
                    s_at(col, row);
                    for (int r = 0; r < S_R; r++)
                        t[r][s] = row[r];
                }
                for (int r = 0; r < S_R; r++) {
                    const size_t h = S_R * ti + (size_t)r;
                    if (h >= g->h)
                        continue;
                    s_at(t[r], row);
                    for (int s = 0; s < S_R; s++) {
                        const size_t w = S_R * tj + (size_t)s;
                        if (w >= g->w)
                            continue;
                        __m512 v = _mm512_add_ps(row[s], bias);
                        if (j->relu)
                            v = _mm512_max_ps(v, _mm512_setzero_ps());
                        _mm512_storeu_ps(y + (h * g->w + w) * 16, v);
                    }
                }
            }
    }
}

/* Blocks [lo, hi) of dy (image n, 16 channels b): dM = A dy A^T of its
 * 4x4 tiles, written with the tiles contiguous (16 channels Tp apart). */
S_AVX512 static void s_grad_output_range(void *arg, size_t lo, size_t hi) {
    const s_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t ob = g->o / 16, plane = g->o * g->tp;
    const __m512i at = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)g->tp));
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / ob, b = it % ob;
        const float *dy = j->src + it * g->h * g->w * 16;
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                __m512 t[S_A][S_R], col[S_R], row[S_A];
                for (int s = 0; s < S_R; s++) {
                    const size_t w = S_R * tj + (size_t)s;
                    for (int r = 0; r < S_R; r++) {
                        const size_t h = S_R * ti + (size_t)r;
                        col[r] = h >= g->h || w >= g->w
                                     ? _mm512_setzero_ps()
                                     : _mm512_loadu_ps(dy + (h * g->w + w) * 16);
                    }
                    s_a(col, row);
                    for (int r = 0; r < S_A; r++)
                        t[r][s] = row[r];
                }
                const size_t tile = (n * g->th + ti) * g->tw + tj;
                float *m = j->dst + b * 16 * g->tp + tile;
                for (int r = 0; r < S_A; r++) {
                    s_a(t[r], row);
                    for (int s = 0; s < S_A; s++)
                        _mm512_i32scatter_ps(m + (size_t)(r * S_A + s) * plane, at, row[s], 4);
                }
            }
    }
}

void tp_wino4_grad_output(const tp_wino_t *g, const float *dy, float *dm) {
    /* the columns past the tiles (T rounded up to 16) zeroed: the
     * backward-data's products read them (and write columns nobody reads) */
    if (g->tp > g->t)
        for (size_t r = 0; r < S_P * g->o; r++)
            memset(dm + r * g->tp + g->t, 0, (g->tp - g->t) * sizeof(float));
    s_job_t j = {g, dy, NULL, dm, 0, 0, NULL};
    tp_cpu_parallel(g->n * (g->o / 16), 1, 4, s_grad_output_range, &j);
}

/* Blocks [lo, hi) of dx (image n, 16 channels b): the sum of B dV B^T
 * over the image's tiles (neighbours overlap by two rows or columns: one
 * item owns all of a block's tiles). dV's 16 channels are Tp apart. */
S_AVX512 static void s_grad_input_range(void *arg, size_t lo, size_t hi) {
    const s_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t cb = g->c / 16, plane = g->c * g->tp;
    const __m512i at = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)g->tp));
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / cb, b = it % cb;
        float *dx = j->dst + it * g->h * g->w * 16;
        if (!j->add)
            memset(dx, 0, g->h * g->w * 16 * sizeof(float));
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                const size_t tile = (n * g->th + ti) * g->tw + tj;
                const float *v = j->src + b * 16 * g->tp + tile;
                __m512 t[S_A][S_A], col[S_A], row[S_A];
                for (int s = 0; s < S_A; s++) {
                    for (int r = 0; r < S_A; r++)
                        col[r] = _mm512_i32gather_ps(at, v + (size_t)(r * S_A + s) * plane, 4);
                    s_b(col, row);
                    for (int r = 0; r < S_A; r++)
                        t[r][s] = row[r];
                }
                for (int r = 0; r < S_A; r++) {
                    const long h = (long)(S_R * ti) - 1 + r;
                    if (h < 0 || h >= (long)g->h)
                        continue;
                    s_b(t[r], row);
                    for (int s = 0; s < S_A; s++) {
                        const long w = (long)(S_R * tj) - 1 + s;
                        if (w < 0 || w >= (long)g->w)
                            continue;
                        float *to = dx + ((size_t)h * g->w + (size_t)w) * 16;
                        _mm512_storeu_ps(to, _mm512_add_ps(_mm512_loadu_ps(to), row[s]));
                    }
                }
            }
    }
}

/* ---- the passes ------------------------------------------------------------ */

void tp_wino4_forward(const tp_wino_t *g, const float *v, const float *u, const float *b,
                      int relu, float *m, float *y) {
    /* M_p [T x O] = V_p [T x C] U_p [C x O] (V's k and U's columns in
     * panels of 32) */
    const tp_wino_gemm_t p = {g->t, g->o, g->c, v, u, m, 32, 32 * g->t, 32, 32 * g->c, g->o, 0,
                              s_v_plane(g), s_u_plane(g), g->t * g->o};
    tp_wino_gemms(&p, S_P);
    s_job_t j = {g, m, b, y, relu, 0, NULL};
    tp_cpu_parallel(g->n * (g->o / 16), 1, 4, s_output_range, &j);
}

void tp_wino4_backward_data(const tp_wino_t *g, const float *dm, const float *u, float *dv,
                            float *dx, int add) {
    /* dV_p [C x Tp] = U_p [C x O] dM_p [O x Tp] (U's k panels 32 C apart:
     * k in chunks of one panel, read in order) */
    const tp_wino_gemm_t p = {g->c, g->tp, g->o, u, dm, dv, 32, 32 * g->c, g->tp, 32, g->tp, 32,
                              s_u_plane(g), g->o * g->tp, g->c * g->tp};
    tp_wino_gemms(&p, S_P);
    s_job_t j = {g, dv, NULL, dx, 0, add, NULL};
    tp_cpu_parallel(g->n * (g->c / 16), 1, 4, s_grad_input_range, &j);
}

/* The backward-weights' blocks of S_ROWS output channels [lo, hi): dU's
 * 36 products for the block's rows, into the room of U at block lo (one
 * room a range: ranges do not overlap), then dW's rows from it while it
 * is in cache. Made whole, dU is 37.7 MB at 512 channels: writing it and
 * reading it back took 8.6 + 2.9 ms a layer, the products alone 3.8. */
enum { S_ROWS = 8 };

static void s_backward_weights_range(void *arg, size_t lo, size_t hi) {
    const s_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const float *dm = j->src, *v = j->b;
    float *du = j->dst + lo * S_P * S_ROWS * g->c; /* the range's own room */
    for (size_t it = lo; it < hi; it++) {
        const size_t k0 = it * S_ROWS, k1 = k0 + S_ROWS < g->o ? k0 + S_ROWS : g->o;
        /* dU_p [rows x C] = dM_p [rows x T] V_p [T x C] (dM's rows Tp apart,
         * V's columns in panels of 32) */
        const tp_wino_gemm_t p = {k1 - k0, g->c, g->t, dm + k0 * g->tp, v, du, g->tp, 32, 32,
                                  32 * g->t, g->c, 0, g->o * g->tp, s_v_plane(g),
                                  S_ROWS * g->c};
        for (size_t q = 0; q < S_P; q++)
            tp_wino_gemm(&p, q);
        s_dweights(g, du, S_ROWS * g->c, k0, k1, j->out, j->add);
    }
}

void tp_wino4_backward_weights(const tp_wino_t *g, const float *dm, const float *v, float *du,
                               float *dw, int add) {
    s_job_t j = {g, dm, v, du, 0, add, dw};
    tp_cpu_parallel((g->o + S_ROWS - 1) / S_ROWS, 1, 4, s_backward_weights_range, &j);
}
