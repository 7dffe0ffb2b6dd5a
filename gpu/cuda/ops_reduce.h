/* towerpack gpu/cuda: the reduce family on the device (docs/ops.md): sum,
 * mean and max over a set of axes, argmax, softmax and log-softmax along an
 * axis, the sequence cross-entropy with an ignore label, top-k accuracy.
 * ops.cu's dispatch calls these for the kinds tp_cuda_reduce_kind accepts.
 * Semantics are the CPU's (gpu/cpu/ops_reduce.c). C++ only. */
#ifndef TP_GPU_CUDA_OPS_REDUCE_H
#define TP_GPU_CUDA_OPS_REDUCE_H

#include "gpu/cuda/internal.h"

int tp_cuda_reduce_kind(tp_op_kind_t kind);
/* Workspace bytes of such a call (kept from forward to backward). */
size_t tp_cuda_reduce_workspace(const tp_op_call_t *c);
tp_status_t tp_cuda_reduce_forward(tp_stream_t *s, const tp_op_call_t *c);
tp_status_t tp_cuda_reduce_backward(tp_stream_t *s, const tp_op_call_t *c);
/* A replayed step's host part: the label ops take their check slots in
 * the order the recording did (ops.cu, tp_cuda_op_forward_host). */
tp_status_t tp_cuda_reduce_forward_host(tp_stream_t *s, const tp_op_call_t *c);

#endif
