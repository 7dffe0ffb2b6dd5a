/* towerpack gpu: a Winograd tile's 2-D transform as its two 1-D passes,
 * written once for both tiles (cpu_winograd.c's F(2x2, 3x3) and
 * cpu_winograd4.c's F(4x4, 3x3)).
 *
 * Each transform of a tile (B^T d B, G g G^T, A^T m A and the backward
 * passes' transposes) is its 1-D form f on each column, then on each row
 * of the result. The two tiles differ in f and in the sizes (4 or 6
 * positions a side, 2 or 4 outputs, 3 taps), not in the passes, nor in
 * how a tile is read from nChw16c pixels (zeros past the edges) or from
 * positions `plane` floats apart (position (r, s) the (r * side + s)-th),
 * nor in how an output tile lands in nChw16c (bias, relu, the edge
 * dropped; the backward-data's tiles added, overlapping). Those are here;
 * the weights' taps and F(4x4)'s gathers and scatters stay with their
 * file.
 *
 * Every helper is inlined into its caller, an AVX-512 function of the two
 * files, where f and the sizes are constants: the loops unroll and f
 * inlines as before, the same operations in the same order (the same
 * bits). */
#ifndef TOWERPACK_GPU_CPU_WINOGRAD_TILE_H
#define TOWERPACK_GPU_CPU_WINOGRAD_TILE_H
#include <immintrin.h>
#include <stddef.h>

#include "gpu/cpu/cpu_winograd.h"

#define TP_WINO_TILE static inline __attribute__((always_inline, target("avx512f")))

/* A 1-D transform: 16 channels a vector, in[] to out[] (sizes its own) */
typedef void (*tp_wino_1d_t)(const __m512 *in, __m512 *out);

/* One job of the transforms: what a range's items read and write. */
typedef struct {
    const tp_wino_t *g;
    const float *src, *b;
    float *dst;
    int relu, add;
} tp_wino_job_t;

/* The column pass on a tile of ni x ni pixels of an nChw16c block (16
 * channels, g->h x g->w) from row h0 - pad and column w0 - pad (pad 1:
 * the input tiles, which start a pixel before their output tile's; 0: the
 * output's, which never start before the block), zeros past the edges:
 * t [no x ni] = f on each column, read as it is transformed (a whole 6x6
 * tile read first left F(4x4)'s 36 vectors on the stack). */
TP_WINO_TILE void tp_wino_cols_pixels(tp_wino_1d_t f, int ni, int no, const tp_wino_t *g,
                                      const float *src, size_t h0, size_t w0, int pad,
                                      __m512 *t) {
    __m512 col[6], row[6];
    for (int s = 0; s < ni; s++) {
        const long w = (long)w0 - pad + s;
        for (int r = 0; r < ni; r++) {
            const long h = (long)h0 - pad + r;
            col[r] = (pad && (h < 0 || w < 0)) || h >= (long)g->h || w >= (long)g->w
                         ? _mm512_setzero_ps()
                         : _mm512_loadu_ps(src + ((size_t)h * g->w + (size_t)w) * 16);
        }
        f(col, row);
        for (int r = 0; r < no; r++)
            t[r * ni + s] = row[r];
    }
}

/* The column pass on a tile of ni x ni positions `plane` floats apart
 * from src: t [no x ni] = f on each column. */
TP_WINO_TILE void tp_wino_cols_load(tp_wino_1d_t f, int ni, int no, const float *src,
                                    size_t plane, __m512 *t) {
    __m512 col[6], row[6];
    for (int s = 0; s < ni; s++) {
        for (int r = 0; r < ni; r++)
            col[r] = _mm512_loadu_ps(src + (size_t)(r * ni + s) * plane);
        f(col, row);
        for (int r = 0; r < no; r++)
            t[r * ni + s] = row[r];
    }
}

/* The row pass into a tile of no x no positions `plane` floats apart at
 * dst: f on each of the nr rows of t [nr x ni]. */
TP_WINO_TILE void tp_wino_rows_store(tp_wino_1d_t f, int nr, int ni, int no, const __m512 *t,
                                     float *dst, size_t plane) {
    __m512 row[6];
    for (int r = 0; r < nr; r++) {
        f(t + r * ni, row);
        for (int s = 0; s < no; s++)
            _mm512_storeu_ps(dst + (size_t)(r * no + s) * plane, row[s]);
    }
}

/* The dW transforms' row pass: f (three out) on each of t's three rows
 * of ni, into the tap-major tap[3 r + q] (tp_wino_taps_out's). */
TP_WINO_TILE void tp_wino_rows_taps(tp_wino_1d_t f, int ni, const __m512 *t,
                                    float tap[9][16]) {
    __m512 row[3];
    for (int r = 0; r < 3; r++) {
        f(t + r * ni, row);
        for (int q = 0; q < 3; q++)
            _mm512_store_ps(tap[3 * r + q], row[q]);
    }
}

/* The backward-data's row pass: f on the rows of t [no x no] (B dV B^T's
 * columns done), added into dx's block (16 channels, g->h x g->w) at
 * rows h0.., columns w0.. (-1: the tile starts past the top or left
 * edge); what falls past an edge dropped. */
TP_WINO_TILE void tp_wino_rows_add(tp_wino_1d_t f, int no, const __m512 *t,
                                   const tp_wino_t *g, float *dx, long h0, long w0) {
    __m512 row[6];
    for (int r = 0; r < no; r++) {
        const long h = h0 + r;
        if (h < 0 || h >= (long)g->h)
            continue;
        f(t + r * no, row);
        for (int s = 0; s < no; s++) {
            const long w = w0 + s;
            if (w < 0 || w >= (long)g->w)
                continue;
            float *at = dx + ((size_t)h * g->w + (size_t)w) * 16;
            _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), row[s]));
        }
    }
}

/* The forward's way out, both tiles: blocks [lo, hi) of y (image n, 16
 * channels b: item n * O/16 + b) from M (F(2x2)'s layout, which F(4x4)'s
 * forward keeps: [positions][T][O]): A^T M A of each r x r output tile
 * (at, from a = r + 2 positions a side), plus the bias, through the
 * relu; the tiles' parts past the edge dropped. */
TP_WINO_TILE void tp_wino_output_range(const tp_wino_job_t *j, size_t lo, size_t hi,
                                       tp_wino_1d_t at, int r, int a) {
    const tp_wino_t *g = j->g;
    const size_t ob = g->o / 16, plane = g->t * g->o;
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / ob, b = it % ob;
        const __m512 bias = j->b ? _mm512_loadu_ps(j->b + b * 16) : _mm512_setzero_ps();
        float *y = j->dst + it * g->h * g->w * 16;
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                const float *m = j->src + ((n * g->th + ti) * g->tw + tj) * g->o + b * 16;
                __m512 t[4 * 6], row[6];
                tp_wino_cols_load(at, a, r, m, plane, t);
                for (int i = 0; i < r; i++) {
                    const size_t h = (size_t)r * ti + (size_t)i;
                    if (h >= g->h)
                        continue;
                    at(t + i * a, row);
                    for (int s = 0; s < r; s++) {
                        const size_t w = (size_t)r * tj + (size_t)s;
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

#endif
