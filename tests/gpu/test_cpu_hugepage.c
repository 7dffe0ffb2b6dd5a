/* towerpack tests: the CPU backend's large buffers on transparent huge
 * pages (gpu/cpu/cpu_hugepage.c, backend_cpu.c's alloc): a buffer of the
 * backend's from TP_CPU_HUGEPAGE_MIN up carries the kernel's huge page
 * advice (the "hg" flag of its mapping in /proc/self/smaps) over its whole
 * 2 MiB pages, a small one and TP_CPU_HUGEPAGES=0 do not. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "gpu/cpu/cpu_hugepage.h"

#define HUGE ((uintptr_t)2 << 20)
/* over tp_alloc's block cache (64 MiB): a fresh mapping of glibc's */
#define BIG ((size_t)80 << 20)

/* THP built into the kernel (it may be set to never: the advice is still
 * kept as the mapping's flag) */
static void s_need_thp(void) {
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0)
        cr_skip_test("a kernel without transparent huge pages");
}

/* 1 when the mapping that holds address a has the huge page advice
 * (VmFlags "hg"), 0 when not, -1 when no mapping holds it */
static int s_advised(uintptr_t a) {
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert_not_null(f);
    char line[512];
    int in = 0, found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = a >= lo && a < hi;
            continue;
        }
        if (in && !strncmp(line, "VmFlags:", 8)) {
            found = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

/* the first and the last whole huge page of [p, p + bytes) */
static uintptr_t s_first(const void *p) {
    return ((uintptr_t)p + HUGE - 1) & ~(HUGE - 1);
}

static uintptr_t s_last(const void *p, size_t bytes) {
    return (((uintptr_t)p + bytes) & ~(HUGE - 1)) - HUGE;
}

Test(cpu_hugepage, a_large_buffer_of_the_backend_is_advised_over_its_whole_huge_pages) {
    s_need_thp();
    unsetenv("TP_CPU_HUGEPAGES");
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    float *p = tp_backend_alloc(b, BIG);
    cr_assert_not_null(p);
    cr_expect_eq(s_advised(s_first(p)), 1, "the first whole 2 MiB page of the buffer");
    cr_expect_eq(s_advised(s_last(p, BIG)), 1, "the last whole 2 MiB page of the buffer");
    /* the partial huge pages at its ends are not the buffer's alone */
    if ((uintptr_t)p % HUGE)
        cr_expect_eq(s_advised((uintptr_t)p), 0, "the buffer's start, before its first "
                     "whole huge page");
    p[0] = p[BIG / sizeof(float) - 1] = 1.0f; /* usable as any buffer */
    tp_backend_free(b, p);
    tp_backend_destroy(&b);
}

Test(cpu_hugepage, tp_cpu_hugepages_0_leaves_the_buffer_on_small_pages) {
    s_need_thp();
    setenv("TP_CPU_HUGEPAGES", "0", 1);
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    float *p = tp_backend_alloc(b, BIG);
    cr_assert_not_null(p);
    cr_expect_eq(s_advised(s_first(p)), 0);
    tp_backend_free(b, p);
    tp_backend_destroy(&b);
    unsetenv("TP_CPU_HUGEPAGES");
}

Test(cpu_hugepage, only_buffers_from_the_minimum_and_whole_pages_are_advised) {
    s_need_thp();
    unsetenv("TP_CPU_HUGEPAGES");
    char *p = aligned_alloc(HUGE, 3 * HUGE);
    cr_assert_not_null(p);
    cr_expect_eq(tp_cpu_hugepage_advise(p, TP_CPU_HUGEPAGE_MIN - 1), 0, "under the minimum");
    cr_expect_eq(s_advised((uintptr_t)p), 0);
    /* from the minimum, starting one byte into a huge page: the one whole
     * page after it is advised, not the page the start lies in */
    cr_expect_eq(tp_cpu_hugepage_advise(p + 1, TP_CPU_HUGEPAGE_MIN), 1);
    cr_expect_eq(s_advised((uintptr_t)p), 0, "the partial page at the start");
    cr_expect_eq(s_advised((uintptr_t)p + HUGE), 1, "the whole page inside");
    cr_expect_eq(tp_cpu_hugepage_advise(NULL, BIG), 0, "no buffer");
    free(p);
}
