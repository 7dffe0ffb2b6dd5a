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

#include <stddef.h>
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

/* How much more memory this process can get, in bytes (UINT64_MAX where
 * nothing limits it), and why:
 *  - space: the address space left under RLIMIT_AS (ulimit -v) and, under
 *    strict overcommit (vm.overcommit_memory=2), under CommitLimit; a
 *    mapping larger than this fails at once;
 *  - machine: RAM (or the cgroup's memory.max when lower) plus swap; more
 *    than this can never be resident, whatever the kernel promises.
 * `limit_why` (may be NULL) gets the name of the tighter limit, e.g.
 * "the address-space limit (ulimit -v) of 524288000 bytes, 499 MB in use". */
typedef struct {
    uint64_t space;
    uint64_t machine;
} tp_mem_room_t;
void tp_mem_room(tp_mem_room_t *room, char *limit_why, size_t why_size);

/* TP_OK when `bytes` more fit in tp_mem_room (the smaller of its two);
 * otherwise TP_ERR_NOMEM with "out of memory: N bytes (X GiB) <what>: more
 * than <the limit>" and the caller's hint. `what` is printf-formatted. */
tp_status_t tp_mem_check(uint64_t bytes, const char *hint, const char *what, ...)
    __attribute__((format(printf, 3, 4)));

/* TP_ERR_NOMEM "out of memory: N bytes (X GiB) <what>" with the limit that
 * applies appended: the message for an allocation that failed. */
tp_status_t tp_error_nomem(uint64_t bytes, const char *what, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
