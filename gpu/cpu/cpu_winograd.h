/* towerpack gpu: Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions of our own for the CPU
 * backend's blocked chain (dnnl_conv.c takes them where they measured
 * faster than oneDNN's: ResNet-18's stage 4, docs/compute.md).
 *
 * A 3x3 convolution with stride 1, padding 1, no dilation or groups, on
 * nChw16c activations (x [N, C, H, W], y [N, O, H, W], C and O multiples
 * of 16) and plain OIHW weights. The output is cut into 2x2 tiles (T of
 * them: N * ceil(H/2) * ceil(W/2)), each read from a 4x4 input tile; in
 * the transformed domain a tile's 16 positions are 16 independent
 * products over the channels, so each pass is 16 GEMMs:
 *
 *   forward          M_p  = V_p  U_p^T    [T x C] [C x O]  (V = B^T d B)
 *   backward-data    dV_p = dM_p U_p      [T x O] [O x C]  (dM = A dY A^T)
 *   backward-weights dU_p = dM_p^T V_p    [O x T] [T x C]
 *
 * with U = G g G^T of each 3x3 kernel, y = A^T M A of each tile, dx the
 * sum over the tiles of B dV B^T and dW = G^T dU G: the backward passes
 * are the forward's adjoint (transposes of its linear maps), so the
 * forward's U serves the backward-data unchanged (no second weight
 * transform) and the forward's V serves the backward-weights. The arrays,
 * all [16 positions][rows][columns] row-major floats: U [16][O][C],
 * V and dV [16][T][C], M and dM [16][T][O].
 *
 * Every function needs AVX-512 (the blocked chain's condition,
 * tp_dnnl_conv_nchw16c); the transforms split their work over the
 * backend's team (tp_cpu_parallel), the GEMMs are oneDNN's (dnnl_sgemm, on
 * the calling thread's OpenMP team). */
#ifndef TOWERPACK_GPU_CPU_WINOGRAD_H
#define TOWERPACK_GPU_CPU_WINOGRAD_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/status.h>

typedef struct {
    size_t n, c, o, h, w; /* x [n, c, h, w], y [n, o, h, w] */
    size_t r;             /* the output tile's side: 2 (F(2x2, 3x3)) or 4 */
    size_t p;             /* positions of a tile: (r + 2)^2 */
    size_t th, tw, t;     /* tiles down, across, in all (n * th * tw) */
    size_t tp;            /* F(4x4)'s t rounded up to 16 (F(2x2): t) */
    size_t rooms;         /* F(4x4)'s rooms in U's: one a thread that runs
                             its passes at once (the plan's team size;
                             tp_wino_geom: 1) */
} tp_wino_t;

/* The geometry of x [n, c, h, w] -> y [n, o, h, w] in r x r output tiles
 * (r 2 or 4). F(4x4, 3x3) (cpu_winograd4.h) has 36 positions and its own
 * layouts (U [36][C][O], dM and dV with the tiles contiguous); what this
 * header says of the arrays' layouts is F(2x2)'s. The functions below
 * take either. */
tp_wino_t tp_wino_geom(int64_t n, int64_t c, int64_t o, int64_t h, int64_t w, int r);

/* Floats of U (also dU), of V (also dV), of M (also dM). */
size_t tp_wino_u_floats(const tp_wino_t *g);
size_t tp_wino_v_floats(const tp_wino_t *g);
size_t tp_wino_m_floats(const tp_wino_t *g);

/* U = G w G^T of the OIHW weights w [o, c, 3, 3]. F(4x4): nothing (its
 * passes make U from w in blocks, in u's room: cpu_winograd4.h). */
void tp_wino_weights(const tp_wino_t *g, const float *w, float *u);

/* V = B^T d B of x's 4x4 tiles (nChw16c; zero past the edges). */
void tp_wino_input(const tp_wino_t *g, const float *x, float *v);

/* The forward: m = the 16 products of v and u; y (nChw16c) = A^T m A,
 * plus b[o] (b NULL: none), through a relu when `relu`. F(2x2) reads u
 * (tp_wino_weights') and not w; F(4x4) makes U from the weights w in
 * blocks, u its room. */
tp_status_t tp_wino_forward(const tp_wino_t *g, const float *v, float *u, const float *w,
                            const float *b, int relu, float *m, float *y, const char *name);

/* dm = A dy A^T of dy's 2x2 tiles (nChw16c; zero past the edges). */
void tp_wino_grad_output(const tp_wino_t *g, const float *dy, float *dm);

/* The backward-data: dv = the 16 products of dm and u; dx (nChw16c) =
 * the sum over the tiles of B dv B^T, stored or added (`add`). u and w
 * as the forward's. */
tp_status_t tp_wino_backward_data(const tp_wino_t *g, const float *dm, float *u,
                                  const float *w, float *dv, float *dx, int add,
                                  const char *name);

/* The backward-weights: du = the 16 products of dm and v; dw (OIHW) =
 * G^T du G, stored or added (`add`). du may be u's memory. */
tp_status_t tp_wino_backward_weights(const tp_wino_t *g, const float *dm, const float *v,
                                     float *du, float *dw, int add, const char *name);

/* The dW transforms' way out, both tiles: 16 consecutive kernels' 9 taps
 * (kernel l's tap i at w[l * 9 + i]) from the tap-major tap[i][l], stored
 * or added (a plain loop: 30% faster than 9 scatters of 16 taps 9 floats
 * apart). */
static inline void tp_wino_taps_out(float *w, const float tap[9][16], int add) {
    if (add)
        for (int l = 0; l < 16; l++)
            for (int i = 0; i < 9; i++)
                w[l * 9 + i] += tap[i][l];
    else
        for (int l = 0; l < 16; l++)
            for (int i = 0; i < 9; i++)
                w[l * 9 + i] = tap[i][l];
}

#endif
