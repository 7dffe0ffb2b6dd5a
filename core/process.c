/* towerpack core: facts about processes. What decides whether forking is
 * safe: the count of threads declared safe to fork past, and the registry
 * of states that make a fork unsafe (registered by the rooms that create
 * them, such as gpu's CUDA module, so that the dataflows that fork need not
 * know about them). And what the kernel says about a process's memory
 * (/proc/PID/status), for the memory monitors. */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/process.h>

static atomic_int s_forksafe;
static _Atomic(const char *) s_hazard;

void tp_forksafe_threads_add(int n) { atomic_fetch_add(&s_forksafe, n); }

int tp_forksafe_threads(void) { return atomic_load(&s_forksafe); }

void tp_fork_hazard_set(const char *what) {
    /* The first hazard stays: it is the one that explains the refusal. */
    const char *none = NULL;
    atomic_compare_exchange_strong(&s_hazard, &none, what);
}

const char *tp_fork_hazard(void) { return atomic_load(&s_hazard); }

tp_status_t tp_process_memory(int pid, int64_t *rss_kib, int64_t *peak_kib) {
    char path[64], line[256];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/status", pid);
    else
        snprintf(path, sizeof path, "/proc/self/status");
    FILE *f = fopen(path, "r");
    if (!f)
        return tp_error(TP_ERR_NOT_FOUND, "memory of process %d: %s: %s", pid, path,
                        strerror(errno));
    int64_t rss = -1, peak = -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6))
            rss = strtoll(line + 6, NULL, 10);
        else if (!strncmp(line, "VmHWM:", 6))
            peak = strtoll(line + 6, NULL, 10);
    }
    fclose(f);
    if (rss < 0 || peak < 0)  /* a zombie has no memory lines */
        return tp_error(TP_ERR_NOT_FOUND, "memory of process %d: no VmRSS/VmHWM in %s",
                        pid, path);
    if (rss_kib)
        *rss_kib = rss;
    if (peak_kib)
        *peak_kib = peak;
    return TP_OK;
}

tp_status_t tp_process_reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return tp_error(TP_ERR_UNSUPPORTED, "resetting the peak memory: "
                        "/proc/self/clear_refs: %s", strerror(errno));
    int ok = fputs("5", f) >= 0;  /* 5: reset the peak resident set size */
    ok = fclose(f) == 0 && ok;
    return ok ? TP_OK : tp_error(TP_ERR_UNSUPPORTED, "resetting the peak memory: "
                                 "/proc/self/clear_refs refused it");
}
