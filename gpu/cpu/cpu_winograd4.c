/* towerpack gpu: Winograd F(4x4, 3x3) of our own (cpu_winograd4.h): the
 * transforms, 16 channels a vector, and the 36 products of each pass
 * (cpu_gemm.c).
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
 * O (537), at 86-92 GF/s on our GEMM (docs/performance.md, branch wino6).
 * U, 2.25 times F(2x2)'s (37.7 MB a layer at 512 channels), is made in
 * blocks inside the forward's and the backward-data's products instead of
 * whole and kept (branch wino8: below, at the passes). */
#include "gpu/cpu/cpu_winograd4.h"

#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/cpu_gemm.h"
#include "gpu/cpu/cpu_winograd_tile.h"

#if defined(__clang__)
#define S_AVX512 __attribute__((target("avx512f")))
#else
#define S_AVX512 __attribute__((target("avx512f"), optimize("O3")))
#endif

enum { S_A = 6, S_R = 4, S_P = 36 };

/* V's floats from one position to the next (its panels of 32 channels:
 * C rounded up to 32) */
static size_t s_v_plane(const tp_wino_t *g) { return g->t * ((g->c + 31) / 32 * 32); }


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

/* r, 16 rows of 16 floats, transposed in place: pairs of rows interleaved,
 * then pairs of pairs, then the 128-bit lanes of four rows a time */
S_AVX512 static inline void s_transpose16(__m512 *r) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) /* r[i + m]'s lane k: column 4k + m of rows i.. */
        for (int h = 0; h < 2; h++) {
            const __m512d a = _mm512_castps_pd(t[i + h]), b = _mm512_castps_pd(t[i + h + 2]);
            r[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int m = 0; m < 4; m++) {
        const __m512 a = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
        const __m512 b = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xdd);
        const __m512 c = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
        const __m512 d = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xdd);
        r[m] = _mm512_shuffle_f32x4(a, c, 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(a, c, 0xdd);
        r[4 + m] = _mm512_shuffle_f32x4(b, d, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(b, d, 0xdd);
    }
}

/* U of output channels [o0, o1) (o0 a multiple of 32) and input channels
 * [c0, c1) (c0 a multiple of 16): U(p, o, c) at u + p * plane + (o - o0) /
 * 32 * ps + (c - c0) * 32 + (o - o0) % 32, 16 output channels a vector.
 * 16 kernels x 16 input channels at a time: each kernel row's 144 floats
 * (16 channels x 9 taps, contiguous) read as 9 vectors and turned
 * tap-major by 9 16 x 16 transposes (a tap's 16 kernels are 9 C floats
 * apart: a scalar copy through a buffer took ~3 ms for stage 4's 262,144
 * kernels, in cache, most of what the whole U took; a gather a tap ~2;
 * this 1.3-1.5 with the caller's positions padded, docs/performance.md,
 * branch wino8). The columns of a last panel of 16 are left as they were
 * (no product reads them). */
S_AVX512 static void s_u_block(const tp_wino_t *g, const float *w, size_t o0, size_t o1,
                               size_t c0, size_t c1, float *u, size_t plane, size_t ps) {
    const size_t c = g->c;
    __m512 tap[9][16]; /* tap[b][j]: float 16 b + j of the 16 kernel rows */
    for (size_t kp = o0; kp < o1; kp += 32)
        for (size_t cb = c0; cb < c1; cb += 16)
            for (size_t k0 = kp; k0 < kp + 32 && k0 < o1; k0 += 16) {
                for (int b = 0; b < 9; b++) {
                    for (int l = 0; l < 16; l++)
                        tap[b][l] = _mm512_loadu_ps(w + ((k0 + (size_t)l) * c + cb) * 9 +
                                                    (size_t)b * 16);
                    s_transpose16(tap[b]);
                }
                for (int ci = 0; ci < 16; ci++) {
                    __m512 t[S_A][3], col[3], row[S_A];
                    for (int q = 0; q < 3; q++) {
                        for (int r = 0; r < 3; r++) {
                            const int f = ci * 9 + 3 * r + q; /* tap 3r + q of channel ci */
                            col[r] = tap[f / 16][f % 16];
                        }
                        s_g(col, row);
                        for (int r = 0; r < S_A; r++)
                            t[r][q] = row[r];
                    }
                    float *uo = u + (kp - o0) / 32 * ps + (cb - c0 + (size_t)ci) * 32 + k0 % 32;
                    tp_wino_rows_store(s_g, S_A, 3, S_A, t[0], uo, plane);
                }
            }
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
            __m512 t[3][S_A];
            tp_wino_cols_load(s_gt, S_A, 3, d, plane, t[0]);
            tp_wino_rows_taps(s_gt, S_A, t[0], tap);
            tp_wino_taps_out(w, (const float(*)[16])tap, add);
        }
}

/* ---- the activations ------------------------------------------------------- */

/* Blocks [lo, hi) of x (image n, 16 channels b): V's rows of the image's
 * tiles in panel b / 2, columns b % 2 * 16.. */
S_AVX512 static void s_input_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t cb = g->c / 16, plane = s_v_plane(g);
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / cb, b = it % cb;
        const float *x = j->src + it * g->h * g->w * 16;
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                __m512 t[S_A][S_A];
                tp_wino_cols_pixels(s_bt, S_A, S_A, g, x, S_R * ti, S_R * tj, 1, t[0]);
                const size_t tile = (n * g->th + ti) * g->tw + tj;
                float *v = j->dst + b / 2 * g->t * 32 + tile * 32 + b % 2 * 16;
                tp_wino_rows_store(s_bt, S_A, S_A, S_A, t[0], v, plane);
            }
    }
}

void tp_wino4_input(const tp_wino_t *g, const float *x, float *v) {
    tp_wino_job_t j = {g, x, NULL, v, 0, 0};
    tp_cpu_parallel(g->n * (g->c / 16), 1, 4, s_input_range, &j);
}

/* Blocks [lo, hi) of y: A^T M A of its 4x4 tiles, plus the bias, through
 * the relu (tp_wino_output_range). */
S_AVX512 static void s_output_range(void *arg, size_t lo, size_t hi) {
    tp_wino_output_range(arg, lo, hi, s_at, S_R, S_A);
}

/* Blocks [lo, hi) of dy (image n, 16 channels b): dM = A dy A^T of its
 * 4x4 tiles, written with the tiles contiguous (16 channels Tp apart). */
S_AVX512 static void s_grad_output_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_job_t *j = arg;
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
                __m512 t[S_A][S_R], row[S_A];
                tp_wino_cols_pixels(s_a, S_R, S_A, g, dy, S_R * ti, S_R * tj, 0, t[0]);
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
    tp_wino_job_t j = {g, dy, NULL, dm, 0, 0};
    tp_cpu_parallel(g->n * (g->o / 16), 1, 4, s_grad_output_range, &j);
}

/* Blocks [lo, hi) of dx (image n, 16 channels b): the sum of B dV B^T
 * over the image's tiles (neighbours overlap by two rows or columns: one
 * item owns all of a block's tiles). dV's 16 channels are Tp apart. */
S_AVX512 static void s_grad_input_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_job_t *j = arg;
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
                tp_wino_rows_add(s_b, S_A, t[0], g, dx, (long)(S_R * ti) - 1,
                                 (long)(S_R * tj) - 1);
            }
    }
}

/* ---- the passes ------------------------------------------------------------ */

/* U is not kept: each pass makes it in blocks from the weights just
 * before its products read them, while they are in L2 (made whole, U
 * is 37.7 MB at 512 channels, 3.5 ms a layer to make, read back by the
 * forward's and the backward-data's products from memory: making it
 * twice in cache costs less; docs/performance.md, branch wino8). A
 * block is S_P x 32 output channels x S_FC input
 * channels for the forward (one column panel of M, k in chunks), S_P x
 * S_BC x S_BO for the backward-data (S_BC rows of dV, k in chunks). A
 * block's positions are S_PAD floats more than a multiple of 4 KB apart:
 * the 36 rows a group of kernels writes fell in one set of L1 (8 ways),
 * and the transform took 2.8-3.0 ms for stage 4's U against 1.3-1.5
 * padded. The sums run over k in the same order as on a whole U.
 *
 * U's room is g->rooms rooms of one block each (the largest of the three
 * passes', the backward-weights' dU block below included): a range takes
 * a free room for its items and gives it back at its end, so a thread
 * reuses its room for its next range and the rooms in use at once are at
 * most the team's threads (branch wino9: 0.6 MB a room at 512 channels
 * against 37.7 MB when the rooms were placed by range across a whole U).
 * A team larger than the plan's (more ranges at once than rooms) waits
 * for a room rather than writing past U's. */
enum { S_FC = 128, S_BC = 32, S_BO = 128, S_PAD = 16, S_ROOMS_MAX = 64 };

/* The backward-weights' blocks of output channels (below) */
enum { S_ROWS = 8 };

typedef struct {
    const tp_wino_t *g;
    const float *w, *x; /* the weights; V (forward) or dM (backward-data) */
    float *room, *out;  /* U's rooms; M or dV */
    _Atomic uint64_t taken; /* the rooms in use, a bit each */
} s_pass_t;

static size_t s_min(size_t a, size_t b) { return a < b ? a : b; }

/* The rooms a pass uses: the plan's, at most S_ROOMS_MAX (one bit each) */
static size_t s_rooms(const tp_wino_t *g) {
    return g->rooms < 1 ? 1 : s_min(g->rooms, S_ROOMS_MAX);
}

/* Floats of one room: the largest block of the three passes (the
 * backward-data's last block of rows may run past C), in whole lines */
static size_t s_room_floats(const tp_wino_t *g) {
    const size_t op = (g->o + 31) / 32 * 32, bc = s_min(S_BC, g->c);
    const size_t fw = S_P * (32 * s_min(S_FC, g->c) + S_PAD);
    const size_t bd = S_P * (bc * s_min(S_BO, op) + S_PAD);
    const size_t du = S_P * S_ROWS * g->c;
    const size_t most = fw > bd ? (fw > du ? fw : du) : (bd > du ? bd : du);
    return (most + 15) / 16 * 16;
}

size_t tp_wino4_u_floats(const tp_wino_t *g) { return s_rooms(g) * s_room_floats(g); }

/* A free room of the pass's, taken (waits while all are in use: only a
 * team larger than the plan knew, whose holders work for milliseconds, so
 * the wait gives its core away rather than spin on it) */
static float *s_room_take(s_pass_t *j, size_t *at) {
    const size_t rooms = s_rooms(j->g);
    for (;;) {
        uint64_t t = atomic_load_explicit(&j->taken, memory_order_relaxed);
        size_t i = 0;
        while (i < rooms && t >> i & 1)
            i++;
        if (i == rooms) {
            sched_yield();
            continue;
        }
        if (atomic_compare_exchange_weak_explicit(&j->taken, &t, t | (uint64_t)1 << i,
                                                  memory_order_acquire, memory_order_relaxed)) {
            *at = i;
            return j->room + i * s_room_floats(j->g);
        }
    }
}

static void s_room_give(s_pass_t *j, size_t at) {
    atomic_fetch_and_explicit(&j->taken, ~((uint64_t)1 << at), memory_order_release);
}

/* The forward's column panels [lo, hi) of 32 output channels: M_p [T x
 * 32] = V_p [T x C] U_p [C x 32], k in chunks of S_FC (V's k and U's
 * block in panels of 32) */
static void s_forward_range(void *arg, size_t lo, size_t hi) {
    s_pass_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t fc = s_min(S_FC, g->c);
    size_t at;
    float *ub = s_room_take(j, &at);
    for (size_t kp = lo; kp < hi; kp++) {
        const size_t o0 = kp * 32, on = s_min(32, g->o - o0);
        for (size_t c0 = 0; c0 < g->c; c0 += fc) {
            const size_t cn = s_min(fc, g->c - c0);
            s_u_block(g, j->w, o0, o0 + on, c0, c0 + cn, ub, 32 * cn + S_PAD, 32 * cn);
            const tp_wino_gemm_t p = {g->t, on, cn, j->x + c0 / 32 * 32 * g->t, ub,
                                      j->out + o0, 32, 32 * g->t, 32, 32 * cn, g->o, 0,
                                      s_v_plane(g), 32 * cn + S_PAD, g->t * g->o, c0 > 0};
            for (size_t q = 0; q < S_P; q++)
                tp_wino_gemm(&p, q);
        }
    }
    s_room_give(j, at);
}

void tp_wino4_forward(const tp_wino_t *g, const float *v, const float *w, float *room,
                      const float *b, int relu, float *m, float *y) {
    s_pass_t f = {g, w, v, room, m, 0};
    tp_cpu_parallel((g->o + 31) / 32, 1, 1, s_forward_range, &f);
    tp_wino_job_t j = {g, m, b, y, relu, 0};
    tp_cpu_parallel(g->n * (g->o / 16), 1, 4, s_output_range, &j);
}

/* The backward-data's blocks [lo, hi) of S_BC input channels: dV_p [rows
 * x Tp] = U_p [rows x O] dM_p [O x Tp], k (O) in chunks of S_BO (U's
 * block in panels of 32 along k) */
static void s_backward_data_range(void *arg, size_t lo, size_t hi) {
    s_pass_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t bc = s_min(S_BC, g->c), bo = s_min(S_BO, (g->o + 31) / 32 * 32);
    size_t at;
    float *ub = s_room_take(j, &at);
    for (size_t it = lo; it < hi; it++) {
        const size_t c0 = it * bc, cn = s_min(bc, g->c - c0);
        for (size_t o0 = 0; o0 < g->o; o0 += bo) {
            const size_t on = s_min(bo, g->o - o0), plane = (on + 31) / 32 * 32 * cn + S_PAD;
            s_u_block(g, j->w, o0, o0 + on, c0, c0 + cn, ub, plane, 32 * cn);
            const tp_wino_gemm_t p = {cn, g->tp, on, ub, j->x + o0 * g->tp, j->out + c0 * g->tp,
                                      32, 32 * cn, g->tp, 32, g->tp, 0, plane, g->o * g->tp,
                                      g->c * g->tp, o0 > 0};
            for (size_t q = 0; q < S_P; q++)
                tp_wino_gemm(&p, q);
        }
    }
    s_room_give(j, at);
}

void tp_wino4_backward_data(const tp_wino_t *g, const float *dm, const float *w, float *room,
                            float *dv, float *dx, int add) {
    s_pass_t d = {g, w, dm, room, dv, 0};
    tp_cpu_parallel((g->c + S_BC - 1) / S_BC, 1, 1, s_backward_data_range, &d);
    tp_wino_job_t j = {g, dv, NULL, dx, 0, add};
    tp_cpu_parallel(g->n * (g->c / 16), 1, 4, s_grad_input_range, &j);
}

/* The backward-weights' blocks of S_ROWS output channels [lo, hi): dU's
 * 36 products for the block's rows, into a room of U's (the range's own
 * while it runs), then dW's rows from it while it is in cache. Made
 * whole, dU is 37.7 MB at 512 channels: writing it and reading it back
 * took 8.6 + 2.9 ms a layer, the products alone 3.8. */
typedef struct {
    s_pass_t pass;  /* x: dM; room: U's rooms */
    const float *v; /* V */
    float *dw;
    int add;
} s_weights_pass_t;

static void s_backward_weights_range(void *arg, size_t lo, size_t hi) {
    s_weights_pass_t *j = arg;
    const tp_wino_t *g = j->pass.g;
    const float *dm = j->pass.x, *v = j->v;
    size_t at;
    float *du = s_room_take(&j->pass, &at);
    for (size_t it = lo; it < hi; it++) {
        const size_t k0 = it * S_ROWS, k1 = k0 + S_ROWS < g->o ? k0 + S_ROWS : g->o;
        /* dU_p [rows x C] = dM_p [rows x T] V_p [T x C] (dM's rows Tp apart,
         * V's columns in panels of 32) */
        const tp_wino_gemm_t p = {k1 - k0, g->c, g->t, dm + k0 * g->tp, v, du, g->tp, 32, 32,
                                  32 * g->t, g->c, 0, g->o * g->tp, s_v_plane(g),
                                  S_ROWS * g->c, 0};
        for (size_t q = 0; q < S_P; q++)
            tp_wino_gemm(&p, q);
        s_dweights(g, du, S_ROWS * g->c, k0, k1, j->dw, j->add);
    }
    s_room_give(&j->pass, at);
}

void tp_wino4_backward_weights(const tp_wino_t *g, const float *dm, const float *v, float *du,
                               float *dw, int add) {
    s_weights_pass_t j = {{g, NULL, dm, du, NULL, 0}, v, dw, add};
    tp_cpu_parallel((g->o + S_ROWS - 1) / S_ROWS, 1, 4, s_backward_weights_range, &j);
}
