/* towerpack gpu: the CPU backend's convolutions on oneDNN (Debian's
 * libdnnl 2.6): conv2d's and conv2d_transpose's forward, backward-data
 * and backward-weights (with the bias and its gradient), stride, padding,
 * dilation, groups.
 * Primitives are made once per geometry and kept in a cache the backend
 * owns; a geometry oneDNN has no implementation for, and every other op of
 * the family, runs the im2col + OpenBLAS code of ops_conv.c. */
#ifndef TOWERPACK_GPU_DNNL_CONV_H
#define TOWERPACK_GPU_DNNL_CONV_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* The engine and the primitive cache of one CPU backend. */
typedef struct tp_dnnl_conv tp_dnnl_conv_t;

/* The convolution path TP_CPU_CONV names: "dnnl" (oneDNN, the layouts it
 * chooses, reordered at the edges), "dnnl-plain" (oneDNN on NCHW/OIHW
 * memory, no reorders), "im2col" (ops_conv.c). Unset or empty: the faster
 * one measured for a backend of `threads` threads: "dnnl" for one, and
 * for more when OpenBLAS is its OpenMP build (one team for the step);
 * "im2col" for more beside OpenBLAS's pthread pool (the two pools then
 * share the cores: docs/performance.md, issue 49). Anything else:
 * TP_ERR_INVALID. */
typedef enum { TP_CPU_CONV_IM2COL = 0, TP_CPU_CONV_DNNL, TP_CPU_CONV_DNNL_PLAIN } tp_cpu_conv_path_t;
tp_status_t tp_cpu_conv_path_from_env(int threads, tp_cpu_conv_path_t *path);

/* A cache for `path` (not im2col). Caller owns; NULL with tp_error when
 * oneDNN's CPU engine cannot be made. */
tp_dnnl_conv_t *tp_dnnl_conv_new(tp_cpu_conv_path_t path);
void tp_dnnl_conv_destroy(tp_dnnl_conv_t **self_p);

/* Scratch bytes of a conv2d or conv2d_transpose call (the primitives of its geometry are made
 * here, at planning, when they are not cached yet); falls back to ops_conv.c
 * for the other ops of the family and for geometries oneDNN lacks. */
size_t tp_dnnl_conv_workspace(tp_dnnl_conv_t *self, const tp_op_call_t *c);
/* Forward and backward of the convolution family through the cache (same
 * contract as tp_cpu_conv_forward/backward: dx_acc honoured). The forward
 * applies a folded relu (attr.act, gpu/graph/fold.c) itself, as the
 * primitive's eltwise post-op where oneDNN runs the call; the backward
 * takes dy masked already (ops_cpu.c). */
tp_status_t tp_dnnl_conv_forward(tp_dnnl_conv_t *self, const tp_op_call_t *c);
tp_status_t tp_dnnl_conv_backward(tp_dnnl_conv_t *self, const tp_op_call_t *c);

/* The backward of a call with a folded relu (attr.act): c is the call
 * before tp_act_inner (its workspace begins with the act's room, its dy
 * unmasked). Where the passes read dy as nChw16c the mask and the reorder
 * are one pass into the workspace's dy room; elsewhere dy is masked into
 * the act's room and tp_dnnl_conv_backward runs (ops_cpu.c's way). Same
 * numbers either way. */
tp_status_t tp_dnnl_conv_backward_relu(tp_dnnl_conv_t *self, const tp_op_call_t *c);

/* 1 when conv2d calls with nChw16c operands (tp_op_call_t.blk16) run on
 * that layout without reorders: TP_CPU_CONV=dnnl on AVX-512, whose
 * primitives choose nChw16c. (Any conv2d call with blk16 operands runs
 * correctly on the dnnl paths, reordered where the primitive differs.) */
int tp_dnnl_conv_nchw16c(const tp_dnnl_conv_t *self);

/* 1 when conv2d call c with NHWC x (c->nhwc: a transpose the graph folds,
 * gpu/graph/fold.c) runs here as planned: on oneDNN's three passes, x and
 * dx reordered by oneDNN where its primitives take another layout, or on
 * conv_thin.c with one input channel (the same memory); 0 elsewhere
 * (ops_conv.c's im2col and own-bias paths read NCHW only). */
int tp_dnnl_conv_nhwc(tp_dnnl_conv_t *self, const tp_op_call_t *c);

/* Geometries cached (each with its three passes), for the tests. */
int tp_dnnl_conv_cached(tp_dnnl_conv_t *self);

#endif
