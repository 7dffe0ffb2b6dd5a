/* towerpack gpu: the CPU backend's large buffers (the activation arena;
 * the gradients and the optimizer's slots of a model with 1M+ weights:
 * backend_cpu.c's alloc) advised to the kernel's transparent huge pages.
 *
 * Why: Debian's kernels default THP to "madvise" (only advised memory gets
 * 2 MiB pages), and glibc advises nothing, so a model's arena (401 MB for
 * the zoo ResNet at batch 128) was on 4 KiB pages. Its passes stream
 * through tens of MB at a time (a batch norm's 12.8 MB tensors, oneDNN's
 * Winograd transforms), a TLB miss every 4 KiB, each a page walk that a VM
 * makes in two dimensions. On 2 MiB pages ResNet-18's one-thread step at
 * 112 px took about 6% less CPU time, the zoo ResNet's about 2% (loaded
 * host; docs/performance.md, branch zoo5, issue 49).
 *
 * The cost: a huge page is backed whole once touched, so the resident set
 * grows by the untouched parts of huge pages (433 -> 521 MB RSS for the
 * zoo ResNet); TP_CPU_HUGEPAGES=0 turns the advice off. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "gpu/cpu/cpu_hugepage.h"

#define S_HUGE ((uintptr_t)2 << 20)

int tp_cpu_hugepage_advise(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const char *v = getenv("TP_CPU_HUGEPAGES");
    if (!p || bytes < TP_CPU_HUGEPAGE_MIN || (v && !strcmp(v, "0")))
        return 0;
    /* the whole huge pages inside the buffer: madvise wants a page-aligned
     * start, and a partial huge page at either end would back memory that
     * another allocation owns */
    const uintptr_t lo = ((uintptr_t)p + S_HUGE - 1) & ~(S_HUGE - 1);
    const uintptr_t hi = ((uintptr_t)p + bytes) & ~(S_HUGE - 1);
    if (hi <= lo)
        return 0;
    return madvise((void *)lo, hi - lo, MADV_HUGEPAGE) == 0;
#else
    (void)p, (void)bytes;
    return 0;
#endif
}
