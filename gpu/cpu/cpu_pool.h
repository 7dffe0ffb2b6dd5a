/* towerpack gpu: the CPU backend's parallel ranges for its own kernels
 * (the elementwise and reduce families): one range of work cut into
 * contiguous parts run by the calling thread's OpenMP team.
 *
 * One pool for the whole step: oneDNN (Debian's libdnnl, OpenMP runtime)
 * and OpenBLAS (its OpenMP build, libopenblas0-openmp) run their parallel
 * regions on the same team, libgomp's threads of the calling (tower)
 * thread, whose size the backend sets at every op entry to its thread
 * count (tp_backend_cpu_threads, --threads). A tower calls its ops one
 * after the other, so the team goes from product to convolution to
 * elementwise op without a second set of threads waiting for the cores.
 * One parallel range at a time in the process: a second tower that asks
 * while another's range runs does its range alone on its own thread
 * (towers already keep the cores busy, so no core gets two threads). */
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
 * the calling thread's OpenMP team. Returns when every part is done. */
void tp_cpu_parallel(size_t n, size_t align, size_t min_items, tp_cpu_range_fn fn,
                     void *arg);

/* Test-only: the thread count the pool uses instead of the backend's (0:
 * the backend's again). The determinism tests compare 1 and 2 threads;
 * under it a team thread other than the caller always takes the first
 * part of a range, so two threads really share it however loaded the
 * machine is. */
void tp_cpu_pool_threads_override(int threads);

/* The CPU backends' thread count (a tower's team, --threads): set by the
 * backend (tp_backend_cpu_new; at load, OpenBLAS's default), read by the
 * ranges, oneDNN's calls and tp_backend_cpu_threads; 1 in a child forked
 * after a team ran. Process-wide, as OpenBLAS's setting was. */
void tp_cpu_threads_set(int threads);
int tp_cpu_threads(void);

/* The calling thread's OpenMP team set to `threads` (the backend's count;
 * 1 in a child forked after a team ran: see cpu_pool.c): called at every
 * op entry of the CPU backend, before OpenBLAS, oneDNN or a range runs. */
void tp_cpu_team(int threads);

/* 1 when this process is a child forked after an OpenMP team of more than
 * one thread ran in its parent: libgomp's pool is not usable there, so
 * every team of the child has one thread. */
int tp_cpu_team_forked(void);

#endif
