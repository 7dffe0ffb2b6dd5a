/* tp-bench: the median of a bench's rounds (robust on a shared machine),
 * and the qsort comparator it sorts with, for the benches that report
 * the middle round as it stands. */
#ifndef TP_BENCH_MEDIAN_H
#define TP_BENCH_MEDIAN_H

#include <stdlib.h>

/* qsort's comparator for doubles, ascending. */
static inline int tp_bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v[0..n) and gives v[n / 2]: the middle round, the upper one of the
 * two for an even n (no mean of two rounds). */
static inline double tp_bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, tp_bench_cmp_double);
    return v[n / 2];
}

#endif
