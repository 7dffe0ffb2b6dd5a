/* towerpack gpu: the products of our Winograd F(4x4, 3x3) (cpu_winograd.h):
 * a row-major single-precision GEMM of our own for short products (16
 * rows on ResNet-18's stage 4, where oneDNN's sgemm ran at 41-49 GF/s and
 * this one at 86-92: docs/performance.md, branch wino6), batched over the
 * transform's positions.
 *
 * c = a b for each of `count` products: a [m x k] read one element at a
 * time, b [k x n] one row of vectors at a time (n a multiple of 16), c [m x
 * n] written (row i at c + i * ldc). Both operands come in panels of 32
 * along k (a) or n (b), so that a plain row-major matrix and one packed in
 * panels (U's layout: a 512 x 512 row-major b, rows 2 KB apart, left the
 * kernel at half its speed from L2 conflicts) are one case:
 *   a(i, l) = a[(l / 32) * ap + i * lda + l % 32]  (row-major: ap = 32)
 *   b(l, j) = b[(j / 32) * bp + l * ldb + j % 32]  (row-major: bp = 32)
 * A chunked k (kc) keeps a read in order when a's rows are panels (a
 * row block of 8 would read 16 pieces of 1 KB 64 KB apart: 28 GF/s).
 * Product q reads a + q * sa and b + q * sb and writes c + q * sc. The
 * products are split over the backend's team (tp_cpu_parallel), one
 * product per item, so the result does not depend on the thread count.
 * AVX-512. */
#ifndef TOWERPACK_GPU_CPU_WINO_GEMM_H
#define TOWERPACK_GPU_CPU_WINO_GEMM_H

#include <stddef.h>

typedef struct {
    size_t m, n, k;
    const float *a, *b;
    float *c;
    size_t lda, ap;  /* a's rows apart, its k panels apart (floats) */
    size_t ldb, bp;  /* b's rows apart, its column panels apart */
    size_t ldc;      /* c's rows apart */
    size_t kc;       /* k in chunks of kc (a multiple of 32), each over all
                        of c, added to c after the first; 0: one chunk */
    size_t sa, sb, sc; /* one product's to the next */
    int add;           /* c += a b from the first chunk (a caller's own
                          chunks of k: U made in blocks, cpu_winograd4.c) */
} tp_wino_gemm_t;

void tp_wino_gemms(const tp_wino_gemm_t *g, size_t count);

/* Product q alone, on the calling thread (a caller's own parallel range). */
void tp_wino_gemm(const tp_wino_gemm_t *g, size_t q);

#endif
