/* towerpack gpu: Winograd F(4x4, 3x3) of our own, the half of
 * cpu_winograd.h's functions for geometries with r == 4 (cpu_winograd.c
 * calls these; nothing else should). The layouts (P = 36 positions, Tp =
 * the tiles rounded up to 16):
 *
 *   U  [P][O/32][C][32]  the weights' transform in panels of 32 output
 *                  channels (O rounded up to 32): rows 128 bytes apart;
 *                  never made whole: each pass makes the blocks of it
 *                  its products read next, in this layout, in a room of
 *                  U's (one a thread of the team: cpu_winograd4.c)
 *   V  [P][C/32][T][32]  the input's, in panels of 32 channels (C
 *                  rounded up to 32)
 *   M  [P][T][O]   the forward's products (as F(2x2)'s)
 *   dM [P][O][Tp]  dy's transform, tiles contiguous (in M's room)
 *   dV [P][C][Tp]  the backward-data's products, tiles contiguous
 *   dU [P][O][C]   the backward-weights' products, 8 rows of O at a
 *                  time (in a room of U's)
 *
 * so that every product is cpu_gemm.h's c = a b with b's rows
 * contiguous and no operand copied: M = V U, dV = U' dM' (U read by rows
 * of C, dM by rows of O), dU = dM' V. U's panels keep the forward's b
 * 128 bytes a row: as a plain [C][O] its rows were 2 KB apart and the
 * forward ran at half speed (L2's sets); V's panels do the same for the
 * backward-weights' b (28 against 71 GF/s). */
#ifndef TOWERPACK_GPU_CPU_WINOGRAD4_H
#define TOWERPACK_GPU_CPU_WINOGRAD4_H

#include "gpu/cpu/cpu_winograd.h"

/* Floats of U's room (g->rooms rooms of the largest block of U or dU
 * a pass makes at once: not a whole U) and of V (and dV). */
size_t tp_wino4_u_floats(const tp_wino_t *g);
size_t tp_wino4_v_floats(const tp_wino_t *g);

/* The forward and the backward-data take the OIHW weights w and make U
 * in blocks in `room` (tp_wino4_u_floats). */
void tp_wino4_input(const tp_wino_t *g, const float *x, float *v);
void tp_wino4_forward(const tp_wino_t *g, const float *v, const float *w, float *room,
                      const float *b, int relu, float *m, float *y);
void tp_wino4_grad_output(const tp_wino_t *g, const float *dy, float *dm);
void tp_wino4_backward_data(const tp_wino_t *g, const float *dm, const float *w, float *room,
                            float *dv, float *dx, int add);
void tp_wino4_backward_weights(const tp_wino_t *g, const float *dm, const float *v, float *du,
                               float *dw, int add);

#endif
