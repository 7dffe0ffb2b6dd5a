/* towerpack gpu/cuda: the convolution family on the device (docs/ops.md).
 * conv2d (dilation, groups) and conv2d_transpose run on cuDNN through
 * ops.cu's descriptor cache (the transposed convolution is cuDNN's
 * backward-data pass as its forward); this file has the upsampling
 * kernels, which no library has in a form that matches PyTorch's
 * semantics. ops.cu's dispatch calls these for the kinds
 * tp_cuda_upsample_kind accepts. Semantics are the CPU's
 * (gpu/cpu/ops_conv.c). C++ only. */
#ifndef TP_GPU_CUDA_OPS_CONV_H
#define TP_GPU_CUDA_OPS_CONV_H

#include "gpu/cuda/internal.h"

int tp_cuda_upsample_kind(tp_op_kind_t kind);
tp_status_t tp_cuda_upsample_forward(tp_stream_t *s, const tp_op_call_t *c);
tp_status_t tp_cuda_upsample_backward(tp_stream_t *s, const tp_op_call_t *c);

#endif
