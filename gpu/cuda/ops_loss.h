/* towerpack gpu/cuda: the loss family on the device (docs/ops.md): mean
 * squared error, L1, Huber, sigmoid cross-entropy with logits. ops.cu's
 * dispatch calls these for the kinds tp_cuda_loss_kind accepts. Semantics
 * are the CPU's (gpu/cpu/ops_loss.c). C++ only. */
#ifndef TP_GPU_CUDA_OPS_LOSS_H
#define TP_GPU_CUDA_OPS_LOSS_H

#include "gpu/cuda/internal.h"

int tp_cuda_loss_kind(tp_op_kind_t kind);
tp_status_t tp_cuda_loss_forward(tp_stream_t *s, const tp_op_call_t *c);
tp_status_t tp_cuda_loss_backward(tp_stream_t *s, const tp_op_call_t *c);

#endif
