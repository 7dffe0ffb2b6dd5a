/* towerpack gpu: the fused attention's tile products on bf16 operands
 * (ops_attention.c, when tp_cpu_bf16_on). An operand is held as bf16
 * pairs along the product's inner dimension, one uint32_t a pair (low
 * half the even element, rounded to nearest even as tp_f32_to_bf16), so
 * that one VDPBF16PS adds two terms a lane: C[r][c] (+)= sum over pairs p
 * of A[r][2p] B[2p][c] + A[r][2p+1] B[2p+1][c], the two products exact
 * and summed in fp32 into fp32 outputs. Only where the CPU has
 * AVX512_BF16 (tp_attn_bf16_usable); the callers go nowhere near these
 * otherwise. */
#ifndef TOWERPACK_GPU_CPU_ATTENTION_BF16_H
#define TOWERPACK_GPU_CPU_ATTENTION_BF16_H

#include <stddef.h>
#include <stdint.h>

/* 1 when the CPU has the instructions below (AVX512_BF16 and AVX512BW). */
int tp_attn_bf16_usable(void);

/* Rows along the inner dimension: dst[r][p] = (src[r][2p], src[r][2p+1])
 * for r < rows, p < (n + 1) / 2 (a zero after an odd n); src's rows lds
 * floats apart, dst's ldd pairs. */
void tp_attn_bf16_rows(uint32_t *dst, int64_t ldd, const float *src, int64_t lds,
                       int64_t rows, int64_t n);

/* Columns along the inner dimension: dst[p][c] = (src[2p][c],
 * src[2p+1][c]) for p < (n + 1) / 2, c < cols (row n of an odd n zeros);
 * src's rows lds floats apart, dst's ldd pairs. */
void tp_attn_bf16_pairs(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                        int64_t cols);

/* C[r][c] (+)= sum over pairs p in [p0, p1) of A's pair at a[r lda + p
 * ak] dotted with B's at b[p ldb + c], for r < rows (at most 4), c < cols;
 * C's rows ldc floats apart; acc 0 stores (from 0). In blocks of 4 rows x
 * 64 columns held in registers while p runs; each element adds its pairs
 * in p order. */
void tp_attn_bf16_product(float *c, int64_t ldc, const uint32_t *a, int64_t lda, int64_t ak,
                          const uint32_t *b, int64_t ldb, int64_t p0, int64_t p1, int acc,
                          int64_t rows, int64_t cols);

#endif
