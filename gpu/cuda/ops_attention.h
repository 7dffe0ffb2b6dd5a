/* towerpack gpu/cuda: fused attention on the device (docs/ops.md,
 * TP_OP_ATTENTION). ops.cu's dispatch calls these; the semantics are the
 * CPU's (gpu/cpu/ops_attention.c). C++ only. */
#ifndef TP_GPU_CUDA_OPS_ATTENTION_H
#define TP_GPU_CUDA_OPS_ATTENTION_H

#include "gpu/cuda/internal.h"

/* Bytes of workspace: each query row's log-sum-exp (forward -> backward)
 * and its rowsum(dO * O) (backward). */
size_t tp_cuda_attention_workspace(const tp_op_call_t *c);
tp_status_t tp_cuda_attention_forward(tp_stream_t *s, const tp_op_call_t *c);
tp_status_t tp_cuda_attention_backward(tp_stream_t *s, const tp_op_call_t *c);

#endif
