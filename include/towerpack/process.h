/* towerpack: facts about processes: what decides whether forking is
 * safe, and what the kernel says about a process's memory.
 *
 * towerpack forks dataflow workers only before the process has started
 * threads of its own (the fork rule in docs/actors.md). Libraries that
 * start idle thread pools at load time and make them safe across fork
 * (OpenBLAS's pool, shut down by its own fork handler) declare those
 * threads here, so the check counts only threads that could hold locks. */
#ifndef TOWERPACK_PROCESS_H
#define TOWERPACK_PROCESS_H

#include <stdint.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Declare `n` more threads of this process as safe to fork past. */
void tp_forksafe_threads_add(int n);
/* How many threads have been declared safe to fork past. */
int tp_forksafe_threads(void);

/* Register a state of this process that makes fork() unsafe from now on,
 * for good (a loaded CUDA module: a child cannot use the parent's driver
 * state). `what` is a static string that completes "cannot fork workers
 * after ...", e.g. "the CUDA module is loaded (reset it before any CUDA
 * use)". The first registration is kept. */
void tp_fork_hazard_set(const char *what);
/* The registered hazard, or NULL when forking is not known to be unsafe. */
const char *tp_fork_hazard(void);

/* Resident memory of process `pid` (0: this one), in KiB: now (VmRSS) and
 * the peak since it started or since its last tp_process_reset_peak
 * (VmHWM). Either pointer may be NULL. TP_ERR_NOT_FOUND when the process is
 * gone (or a zombie). */
tp_status_t tp_process_memory(int pid, int64_t *rss_kib, int64_t *peak_kib);
/* Start a new peak for this process (the kernel's VmHWM drops to the
 * current VmRSS): a peak per epoch. TP_ERR_UNSUPPORTED where refused. */
tp_status_t tp_process_reset_peak(void);

#ifdef __cplusplus
}
#endif
#endif
