/* towerpack gpu/cuda: the elementwise family on the device (docs/ops.md):
 * broadcasting binary ops, the unary ops and activations beyond cuDNN's,
 * constants and stop_gradient. ops.cu's dispatch calls these for the kinds
 * tp_cuda_elementwise_kind accepts, and for an add whose operands differ
 * in shape. Semantics are the CPU's (gpu/cpu/ops_elementwise.c). C++ only. */
#ifndef TP_GPU_CUDA_OPS_ELEMENTWISE_H
#define TP_GPU_CUDA_OPS_ELEMENTWISE_H

#include "gpu/cuda/internal.h"

/* 1 when ops_elementwise.cu runs `kind` (add only when broadcasting). */
int tp_cuda_elementwise_kind(tp_op_kind_t kind);
tp_status_t tp_cuda_elementwise_forward(tp_stream_t *s, const tp_op_call_t *c);
tp_status_t tp_cuda_elementwise_backward(tp_stream_t *s, const tp_op_call_t *c);

#endif
