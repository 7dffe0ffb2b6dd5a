/* towerpack gpu/cuda: batched matmul on the device (docs/ops.md, the linalg
 * family). ops.cu's dispatch calls these for TP_OP_BATCH_MATMUL; the
 * semantics are the CPU's (gpu/cpu/ops_linalg.c). C++ only. */
#ifndef TP_GPU_CUDA_OPS_LINALG_H
#define TP_GPU_CUDA_OPS_LINALG_H

#include "gpu/cuda/internal.h"

tp_status_t tp_cuda_batch_matmul_forward(tp_stream_t *s, const tp_op_call_t *c);
tp_status_t tp_cuda_batch_matmul_backward(tp_stream_t *s, const tp_op_call_t *c);

#endif
