/* towerpack gpu/cuda: layer, group and instance norm on the device
 * (docs/ops.md, the linalg family). ops.cu's dispatch calls these for the
 * kinds tp_cuda_norm_kind accepts; the semantics are the CPU's
 * (gpu/cpu/ops_norm.c). C++ only. */
#ifndef TP_GPU_CUDA_OPS_NORM_H
#define TP_GPU_CUDA_OPS_NORM_H

#include "gpu/cuda/internal.h"

int tp_cuda_norm_kind(tp_op_kind_t kind);
/* Bytes of workspace the backward wants: each row's mean and 1/std. */
size_t tp_cuda_norm_workspace(const tp_op_call_t *c);
tp_status_t tp_cuda_norm_forward(tp_stream_t *s, const tp_op_call_t *c);
tp_status_t tp_cuda_norm_backward(tp_stream_t *s, const tp_op_call_t *c);

#endif
