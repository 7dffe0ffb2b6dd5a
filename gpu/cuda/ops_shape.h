/* towerpack gpu/cuda: the shape family on the device (docs/ops.md):
 * transpose, slice, concat along any axis, pad, broadcast_to, gather rows
 * and one-hot. ops.cu's dispatch calls these for the kinds
 * tp_cuda_shape_kind accepts. Semantics are the CPU's
 * (gpu/cpu/ops_shape.c). C++ only. */
#ifndef TP_GPU_CUDA_OPS_SHAPE_H
#define TP_GPU_CUDA_OPS_SHAPE_H

#include "gpu/cuda/internal.h"

int tp_cuda_shape_kind(tp_op_kind_t kind);
tp_status_t tp_cuda_shape_forward(tp_stream_t *s, const tp_op_call_t *c);
tp_status_t tp_cuda_shape_backward(tp_stream_t *s, const tp_op_call_t *c);
/* A replayed step's host part (ops.cu's tp_cuda_op_forward_host): the
 * index checks' slots of gather and one-hot, taken in the recorded order. */
tp_status_t tp_cuda_shape_forward_host(tp_stream_t *s, const tp_op_call_t *c);
/* gather's workspace: its backward sorts the indices with their positions
 * (one owner a table row: a deterministic gradient). */
size_t tp_cuda_gather_workspace(const tp_op_call_t *c);

#endif
