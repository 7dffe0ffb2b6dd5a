/* towerpack gpu: the CPU backend's Adam/AdamW update and the gradients'
 * sum of squares (the global-norm clip), as vectorised loops over the
 * backend's pool (backend_cpu.c's adam_update and grad_sumsq call these). */
#ifndef TOWERPACK_GPU_CPU_ADAM_H
#define TOWERPACK_GPU_CPU_ADAM_H

#include <stddef.h>
#include <stdint.h>

/* One Adam step of w [n] from g [n] with the moments m, v [n]; wd > 0:
 * AdamW's decoupled decay w *= 1 - lr wd first (torch.optim.AdamW's
 * order), in the same pass. step counts from 1 (the bias corrections). */
void tp_cpu_adam(float *w, const float *g, float *m, float *v, size_t n, float lr,
                 float b1, float b2, float eps, float wd, int64_t step);
/* The same from the gradient g[i] x gscale, rounded to float as a
 * separate multiply would (grad_clip's g *= scale, then the update: one
 * read of g where the two make three passes); gscale 1 is tp_cpu_adam. */
void tp_cpu_adam_scaled(float *w, const float *g, float *m, float *v, size_t n,
                        float lr, float b1, float b2, float eps, float wd,
                        int64_t step, float gscale);

/* sum g[i]^2 over [0, n) in double, in a fixed order (eight lanes per
 * block of 4096 elements, the blocks' sums added in order): the same bits
 * on any thread count and any ISA. The blocks run over the pool
 * (cpu_pool.h), their sums added on the calling thread. */
double tp_cpu_sumsq(const float *g, size_t n);

/* tp_cpu_sumsq's blocks: its sum over n floats is, in double,
 * ((0 + b(0)) + b(1)) + ... with b(k) this function's value on floats
 * [k B, min((k + 1) B, n)) for B = TP_CPU_SUMSQ_BLOCK, so that threads
 * holding different blocks may each compute theirs and one of them add
 * them in order to the same bits (backend_cpu.c's allreduce_adam). */
#define TP_CPU_SUMSQ_BLOCK 4096
double tp_cpu_sumsq_block(const float *g, size_t n);

/* Two ranks' all-reduce block and its squares in one loop: dst[i] = (a[i]
 * + b[i]) x scale (scale 1: no multiply) for i in [0, n), n at most
 * TP_CPU_SUMSQ_BLOCK, returning tp_cpu_sumsq_block(dst, n): the bits of
 * the sums stored and then their squares read back, with the lanes' chain
 * of adds beside the loads and stores rather than after them
 * (allreduce_adam's first pass; dst may be a or b, element for element). */
double tp_cpu_sum2_sumsq_block(float *dst, const float *a, const float *b, size_t n,
                               float scale);

#endif
