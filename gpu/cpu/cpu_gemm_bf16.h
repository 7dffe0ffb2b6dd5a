/* towerpack gpu: the bf16 GEMM of our own (AVX512_BF16's VDPBF16PS), for
 * the CPU's bf16 products (cpu_bf16.h, dnnl_matmul.c).
 *
 * c[m x n] (+)= op(a) op(b) (+ bias), both operands fp32 in memory,
 * rounded to bf16 (nearest even, as tp_cpu_f32_to_bf16) and summed in
 * fp32: the rounding is the packing. One pass over each operand converts
 * it straight into the layout the register kernel reads, pairs of k side
 * by side (VDPBF16PS multiplies a pair by a pair and adds both to one
 * fp32 lane):
 *   a: in blocks of 8 rows, row i's pair h at (i / 8) 8 kh + h 8 + i % 8
 *      (kh = k / 2 rounded up, k odd padded with a zero): one block's 8
 *      pairs at one h contiguous, a block's whole strip read in order;
 *      from a plain (a(i, l) = a[i * lda + l]) by 8 x 16 transposes in
 *      registers, from a transposed (a(i, l) = a[l * lda + i]) two of its
 *      rows a pair;
 *   b: panels of 32 columns, panel p's pair h of column j at
 *      p * 32 kh + h * 32 + j % 32 (a pair = two bf16, k even low), the
 *      columns past n zero, from b plain (b(l, j) = b[l * ldb + j]) or
 *      transposed (b[j * ldb + l]).
 * One register block is 8 rows by 32 columns (16 fp32 accumulators), one
 * pass over all of k from zero, then + bias[j], then added to c's old
 * value where `acc`: the order tp_gemm (cpu_gemm.h) keeps. The team splits
 * rows and column blocks, never k: the bits do not depend on the thread
 * count. Its own room (not grown cpu_gemm.c): the kernel, its packing and
 * its room differ from the fp32 one's in every line; only the drivers'
 * shape (column blocks of 256, parts of 64 rows) is the same.
 * dnnl_matmul.c runs the bf16 products on it by default (TP_CPU_GEMM=dnnl:
 * oneDNN's bf16 matmul): the GPT's fifteen products at 89-93% of the bf16
 * peak (235.6 GF/s a core, tp-bench step --bf16 --profile), the conversion counted,
 * 1.00-1.11x oneDNN's route (docs/performance.md, branch bf16gemm). */
#ifndef TOWERPACK_GPU_CPU_GEMM_BF16_H
#define TOWERPACK_GPU_CPU_GEMM_BF16_H

#include <stddef.h>

typedef struct {
    size_t m, n, k;
    const float *a;
    size_t lda;
    int ta;         /* a stored [k x m] */
    const float *b; /* [k x n] row-major, or (tb) [n x k] */
    size_t ldb;
    int tb;
    float *c;
    size_t ldc;
    const float *bias; /* [n] or NULL */
    int acc;           /* c += the product (+ bias) */
    void *room;        /* tp_gemm_bf16_room_bytes (any alignment): both
                          operands packed */
} tp_gemm_bf16_t;

/* 1 when this CPU runs VDPBF16PS (AVX512_BF16). */
int tp_gemm_bf16_ok(void);

/* Bytes of the room of an m x n x k product. */
size_t tp_gemm_bf16_room_bytes(size_t m, size_t n, size_t k);

/* The product, on the calling thread's team (tp_cpu_parallel); the CPU
 * must have AVX512_BF16 (tp_gemm_bf16_ok). */
void tp_gemm_bf16(const tp_gemm_bf16_t *g);

#endif
