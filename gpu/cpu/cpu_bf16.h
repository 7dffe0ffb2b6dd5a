/* towerpack gpu: bf16 products on the CPU (tp_backend_cpu_bf16). With it
 * on, the matrix products (dnnl_matmul.c: the dense layers and
 * batch_matmul), oneDNN's direct convolutions (dnnl_conv.c) and the fused
 * attention's tile products (attention_bf16.h) take their two operands rounded to bf16 (round to
 * nearest even, 8 significant bits) and sum in fp32 into fp32 outputs,
 * as the CUDA backend's bf16 does with cuBLAS; tensors, weights and the
 * optimizer stay fp32 (the attention's softmax too). For the matrix
 * products: oneDNN 2.6's fp32 primitives do not round for us
 * on AVX-512 (its fpmath mode acts on AMX only), so the operands are
 * converted here into the op's workspace before each product. That is
 * oneDNN's route (TP_CPU_GEMM=dnnl); by default the products run on our
 * bf16 GEMM (cpu_gemm_bf16.h), whose packing does the rounding. */
#ifndef TOWERPACK_GPU_CPU_BF16_H
#define TOWERPACK_GPU_CPU_BF16_H

#include <stddef.h>
#include <stdint.h>

/* 1 when the products run in bf16: asked (tp_backend_cpu_bf16, else
 * $TP_CPU_BF16 not empty or "0") and the CPU has bf16 dot products
 * (AVX512_BF16 or AMX, as oneDNN reads the CPU). */
int tp_cpu_bf16_on(void);

/* dst[i] = src[i] rounded to bf16, as tp_f32_to_bf16 (NaNs stay NaNs). */
void tp_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n);

#endif
