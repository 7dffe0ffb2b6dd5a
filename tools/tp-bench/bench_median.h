/* tp-bench: the median of a bench's rounds (robust on a shared machine),
 * and the qsort comparator it sorts with. Two medians, as the benches
 * have always reported them: the middle round as it stands (a figure
 * some round measured), or the mean of the two middle ones for an even
 * count (the textbook median). Every bench sorts with the one comparator
 * here. */
#ifndef TP_BENCH_MEDIAN_H
#define TP_BENCH_MEDIAN_H

#include <stdlib.h>

/* qsort's comparator for doubles, ascending. */
static inline int tp_bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v[0..n) and gives v[n / 2]: the middle round, the upper one of the
 * two for an even n (no mean of two rounds); -1 for no rounds. */
static inline double tp_bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, tp_bench_cmp_double);
    return n ? v[n / 2] : -1;
}

/* Sorts v[0..n), n > 0, and gives its median: the middle round, or the
 * mean of the two middle ones for an even n. */
static inline double tp_bench_median_mean(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, tp_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
