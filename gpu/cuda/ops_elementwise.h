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

/* GELU (erf) and its tanh approximation, and their gradients g * gelu'(v):
 * one definition for the gelu ops (ops_elementwise.cu) and batch_matmul's
 * folded GELU (ops.cu, fold.c), so that both give the same numbers. */
#define TP_CUDA_SQRT_2_OVER_PI 0.7978845608028654f
#define TP_CUDA_GELU_C 0.044715f
#define TP_CUDA_INV_SQRT_2PI 0.3989422804014327f
#define TP_CUDA_SQRT1_2 0.70710678118654752f
__device__ __forceinline__ float tp_cuda_gelu(float v) {
    return 0.5f * v * (1.0f + erff(v * TP_CUDA_SQRT1_2));
}
__device__ __forceinline__ float tp_cuda_gelu_tanh(float v) {
    return 0.5f * v *
           (1.0f + tanhf(TP_CUDA_SQRT_2_OVER_PI * (v + TP_CUDA_GELU_C * v * v * v)));
}
__device__ __forceinline__ float tp_cuda_gelu_grad(float g, float v) {
    const float cdf = 0.5f * (1.0f + erff(v * TP_CUDA_SQRT1_2));
    return g * (cdf + v * TP_CUDA_INV_SQRT_2PI * expf(-0.5f * v * v));
}
__device__ __forceinline__ float tp_cuda_gelu_tanh_grad(float g, float v) {
    const float u = TP_CUDA_SQRT_2_OVER_PI * (v + TP_CUDA_GELU_C * v * v * v);
    const float t = tanhf(u);
    const float du = TP_CUDA_SQRT_2_OVER_PI * (1.0f + 3.0f * TP_CUDA_GELU_C * v * v);
    return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
}

#endif
