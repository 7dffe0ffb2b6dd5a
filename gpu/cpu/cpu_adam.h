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

/* sum g[i]^2 over [0, n) in double, in a fixed order (eight lanes per
 * block of 4096 elements, the blocks' sums added in order): the same bits
 * on any thread count and any ISA. */
double tp_cpu_sumsq(const float *g, size_t n);

#endif
