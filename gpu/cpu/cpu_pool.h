/* towerpack gpu: the CPU backend's pool of threads for its own kernels
 * (the elementwise and reduce families): one range of work cut into
 * contiguous parts run on the calling thread and the pool's workers.
 *
 * The pool's size is the CPU backend's thread count (tp_backend_cpu_threads,
 * OpenBLAS's setting, --threads): the workers run only while no product
 * does (a tower calls its ops one after the other), so the two pools take
 * turns on the same cores instead of competing. One parallel range at a
 * time in the process: a second tower that asks while another's range runs
 * does its range alone on its own thread (towers already keep the cores
 * busy, so no core gets two threads of ours). */
#ifndef TOWERPACK_GPU_CPU_POOL_H
#define TOWERPACK_GPU_CPU_POOL_H

#include <stddef.h>

/* Work on items [lo, hi) of a range. It must give every item the same
 * result whatever the cut (each item written by exactly one call, from
 * nothing but its own inputs): that is what keeps results independent of
 * the thread count. */
typedef void (*tp_cpu_range_fn)(void *arg, size_t lo, size_t hi);

/* Runs fn over [0, n): in one call on this thread when the backend has one
 * thread or n < 2 * min_items; else cut into parts of at least min_items
 * items, each a multiple of `align` items (but the last), and spread over
 * the pool. Returns when every part is done. */
void tp_cpu_parallel(size_t n, size_t align, size_t min_items, tp_cpu_range_fn fn,
                     void *arg);

/* Test-only: the thread count the pool uses instead of the backend's (0:
 * the backend's again). The determinism tests compare 1 and 2 threads. */
void tp_cpu_pool_threads_override(int threads);

#endif
