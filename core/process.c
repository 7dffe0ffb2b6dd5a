/* towerpack core: facts about processes. What decides whether forking is
 * safe: the count of threads declared safe to fork past, and the registry
 * of states that make a fork unsafe (registered by the rooms that create
 * them, such as gpu's CUDA module, so that the dataflows that fork need not
 * know about them). And what the kernel says about a process's memory
 * (/proc/PID/status), for the memory monitors, and how much more memory
 * this process can get, so that a plan too large for it is refused before
 * anything is allocated. */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
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

/* ---- memory room ---------------------------------------------------------- */

/* A /proc/meminfo field in bytes (its unit is kB), or -1. */
static int64_t s_meminfo(const char *text, const char *key) {
    const char *p = strstr(text, key);
    if (!p)
        return -1;
    return strtoll(p + strlen(key), NULL, 10) * 1024;
}

static int s_read_small(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (int)n;
}

/* The cgroup v2 memory.max of this process, or -1 when none applies. */
static int64_t s_cgroup_max(void) {
    char cg[512], path[700], v[64];
    if (s_read_small("/proc/self/cgroup", cg, sizeof cg) <= 0 || strncmp(cg, "0::", 3))
        return -1;
    cg[strcspn(cg, "\n")] = '\0';
    snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", cg + 3);
    if (s_read_small(path, v, sizeof v) <= 0 || !strncmp(v, "max", 3))
        return -1;
    return strtoll(v, NULL, 10);
}

static const char *s_human(uint64_t bytes, char *buf, size_t size) {
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

void tp_mem_room(tp_mem_room_t *room, char *why, size_t why_size) {
    room->space = UINT64_MAX;
    room->machine = UINT64_MAX;
    if (why && why_size)
        why[0] = '\0';
    char h1[32], h2[32];
    /* Address space: what is mapped now (statm's first field, pages) against
     * RLIMIT_AS; a mapping past it fails with ENOMEM at once. */
    uint64_t mapped = 0;
    char statm[128];
    if (s_read_small("/proc/self/statm", statm, sizeof statm) > 0)
        mapped = strtoull(statm, NULL, 10) * (uint64_t)sysconf(_SC_PAGESIZE);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        uint64_t lim = (uint64_t)rl.rlim_cur;
        room->space = lim > mapped ? lim - mapped : 0;
        if (why && why_size)
            snprintf(why, why_size, "the address-space limit (ulimit -v) of %s, %s in use",
                     s_human(lim, h1, sizeof h1), s_human(mapped, h2, sizeof h2));
    }
    char *mi = malloc(8192);
    if (!mi)
        return;
    if (s_read_small("/proc/meminfo", mi, 8192) > 0) {
        char oc[16];
        if (s_read_small("/proc/sys/vm/overcommit_memory", oc, sizeof oc) > 0 && oc[0] == '2') {
            int64_t cl = s_meminfo(mi, "CommitLimit:"), ca = s_meminfo(mi, "Committed_AS:");
            if (cl >= 0 && ca >= 0) {
                uint64_t left = cl > ca ? (uint64_t)(cl - ca) : 0;
                if (left < room->space) {
                    room->space = left;
                    if (why && why_size)
                        snprintf(why, why_size, "the commit limit (vm.overcommit_memory=2) "
                                 "of %s, %s committed", s_human((uint64_t)cl, h1, sizeof h1),
                                 s_human((uint64_t)ca, h2, sizeof h2));
                }
            }
        }
        int64_t ram = s_meminfo(mi, "MemTotal:"), swap = s_meminfo(mi, "SwapTotal:");
        int64_t cg = s_cgroup_max();
        const char *which = "RAM";
        if (cg >= 0 && (ram < 0 || cg < ram)) {
            ram = cg;
            which = "the cgroup's memory.max";
        }
        if (ram > 0) {
            room->machine = (uint64_t)ram + (uint64_t)(swap > 0 ? swap : 0);
            if (room->machine < room->space && why && why_size)
                snprintf(why, why_size, "this machine's memory (%s %s + swap %s)", which,
                         s_human((uint64_t)ram, h1, sizeof h1),
                         s_human((uint64_t)(swap > 0 ? swap : 0), h2, sizeof h2));
        }
    }
    free(mi);
}

/* "out of memory: N bytes (X GiB) <what>" into buf. */
static void s_nomem_text(char *buf, size_t size, uint64_t bytes, const char *what,
                         va_list ap) {
    char h[32], w[768];
    vsnprintf(w, sizeof w, what, ap);
    snprintf(buf, size, "out of memory: %llu bytes (%s) %s", (unsigned long long)bytes,
             s_human(bytes, h, sizeof h), w);
}

tp_status_t tp_mem_check(uint64_t bytes, const char *hint, const char *what, ...) {
    tp_mem_room_t room;
    char why[256];
    tp_mem_room(&room, why, sizeof why);
    uint64_t have = room.space < room.machine ? room.space : room.machine;
    if (bytes <= have)
        return TP_OK;
    char text[1024];
    va_list ap;
    va_start(ap, what);
    s_nomem_text(text, sizeof text, bytes, what, ap);
    va_end(ap);
    return tp_error(TP_ERR_NOMEM, "%s: more than %s allows%s%s", text, why,
                    hint && *hint ? "; " : "", hint ? hint : "");
}

tp_status_t tp_error_nomem(uint64_t bytes, const char *what, ...) {
    tp_mem_room_t room;
    char why[256];
    tp_mem_room(&room, why, sizeof why);
    char text[1024];
    va_list ap;
    va_start(ap, what);
    s_nomem_text(text, sizeof text, bytes, what, ap);
    va_end(ap);
    if (why[0])
        return tp_error(TP_ERR_NOMEM, "%s (under %s)", text, why);
    return tp_error(TP_ERR_NOMEM, "%s", text);
}
