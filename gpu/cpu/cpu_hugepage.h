/* towerpack gpu: the CPU backend's large buffers on transparent huge pages
 * (cpu_hugepage.c). */
#ifndef TOWERPACK_GPU_CPU_HUGEPAGE_H
#define TOWERPACK_GPU_CPU_HUGEPAGE_H

#include <stddef.h>

/* The size from which an allocation is advised: two huge pages, so that
 * at least one whole 2 MiB page lies inside it wherever it starts. */
#define TP_CPU_HUGEPAGE_MIN ((size_t)4 << 20)

/* Advise the whole 2 MiB pages inside [p, p + bytes) to the kernel's
 * transparent huge pages (madvise MADV_HUGEPAGE), before they are first
 * touched; 1 when advised, 0 when not: a buffer under
 * TP_CPU_HUGEPAGE_MIN, TP_CPU_HUGEPAGES=0 (read per call), or a kernel
 * without THP (the advice is only advice: nothing fails). */
int tp_cpu_hugepage_advise(void *p, size_t bytes);

#endif
