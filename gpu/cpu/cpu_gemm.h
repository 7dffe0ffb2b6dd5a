/* towerpack gpu: the single-precision GEMM of our own (AVX-512), one
 * register kernel under two drivers.
 *
 * tp_gemm: c[m x n] (+)= op(a) b (+ bias) for the dense products
 * (dnnl_matmul.c, batch_matmul's linear layers): a read in place, plain
 * (a(i, l) = a[i * lda + l]) or transposed (a(i, l) = a[l * lda + i]: the
 * 8 rows of a block at one l are contiguous); b packed into panels of 32
 * columns (tp_gemm_pack), inside the call (into the caller's room) or
 * given already packed; one pass over all of k per register block of 8
 * rows x 32 columns, from zero, then + bias[j], then added to c's old
 * value where `acc` (the order oneDNN's brgemm keeps without k blocking:
 * its bits at K <= 512 on the GPT's shapes, docs/performance.md, branch
 * gpt20). One thread packs b a block of 256 columns (8 panels) at a
 * time, reusing the room's first block, and runs every row against it (b's
 * block in L2, a's 8 x k strip in L1); a team packs all of b first, then
 * splits rows (64 a part) and column blocks, never k: the bits do not
 * depend on the thread count. dnnl_matmul.c runs the dense products on it
 * under TP_CPU_GEMM=own only: it measured slower than oneDNN's brgemm with
 * b packed inside the call, and even with b packed ahead
 * (docs/performance.md, branch gpt20).
 *
 * tp_wino_gemms: the products of our Winograd F(4x4, 3x3) (cpu_winograd.h),
 * row-major and short (16 rows on ResNet-18's stage 4, where oneDNN's
 * sgemm ran at 41-49 GF/s and this one at 86-92: docs/performance.md,
 * branch wino6), batched over the transform's positions.
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
 * product per item, so the result does not depend on the thread count. */
#ifndef TOWERPACK_GPU_CPU_GEMM_H
#define TOWERPACK_GPU_CPU_GEMM_H

#include <stddef.h>

typedef struct {
    size_t m, n, k;
    const float *a;
    size_t lda;
    int ta;          /* a stored [k x m] */
    const float *b;  /* [k x n] row-major, or (tb) [n x k]; or packed */
    size_t ldb;
    int tb;
    int packed;      /* b is tp_gemm_pack's panels (ldb and tb unused) */
    float *c;
    size_t ldc;
    const float *bias; /* [n] or NULL */
    int acc;           /* c += the product (+ bias) */
    float *room;       /* tp_gemm_room_bytes, 64-byte aligned: b's panels
                          (unused when packed) */
} tp_gemm_t;

/* Bytes of b packed: k rows of n columns rounded up to 32. */
size_t tp_gemm_pack_bytes(size_t k, size_t n);

/* Bytes of g's room: b's panels, 0 when packed. */
size_t tp_gemm_room_bytes(const tp_gemm_t *g);

/* b [k x n] (tb: stored [n x k], ldb apart) into panels of 32 columns,
 * panel p at out + p * 32 * k, b(l, j) at l * 32 + j % 32, the columns
 * past n zero. out: tp_gemm_pack_bytes, 64-byte aligned. */
void tp_gemm_pack(const float *b, size_t ldb, int tb, size_t k, size_t n, float *out);

/* The product, on the calling thread's team (tp_cpu_parallel). */
void tp_gemm(const tp_gemm_t *g);

/* The kernels' epilogue for a partial panel (both GEMMs, cpu_gemm_bf16.h
 * too): rows x w sums of a tile (ldt apart) into c (ldc apart), + bias[t],
 * then added to c's old value where acc, in the kernels' order (the same
 * bits as a whole panel's). */
void tp_gemm_tile_out(const float *tile, size_t ldt, size_t rows, size_t w, float *c,
                      size_t ldc, const float *bias, int acc);

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
