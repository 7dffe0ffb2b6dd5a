/* towerpack gpu/graph: the all-reduce of gradient buffers, in buckets
 * beside the backward pass when the backend can, else the whole buffer
 * after it; from each rank's thread, or from one thread holding every
 * buffer. Plain arrays only (collective.h): which buffers, when, and what
 * the step does with the sums is model.c's. */
#include <stdlib.h>
#include "gpu/graph/collective.h"

static int s_cmp_bucket(const void *a, const void *b) {
    const struct tp_bucket *x = a, *y = b;
    if (x->after != y->after)
        return y->after - x->after;
    return x->lo < y->lo ? 1 : -1;  /* ties: the buffer's end first */
}

tp_status_t tp_buckets_plan_(const size_t *offset, const int *after, int n,
                             size_t end, int never, size_t floats,
                             struct tp_bucket **out, int *nout) {
    struct tp_bucket *bk = calloc((size_t)n + 1, sizeof *bk);
    *out = bk;
    *nout = 0;
    if (!bk)
        return tp_error(TP_ERR_NOMEM, "planning %d buckets", n);
    /* from the last variable: a bucket closes once it holds `floats` (or
     * at the buffer's start), begun after the earliest last writer of its
     * variables */
    size_t hi = end;
    int when = never, nb = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (after[i] < when)
            when = after[i];
        if (hi - offset[i] >= floats || offset[i] == 0) {
            bk[nb++] = (struct tp_bucket){offset[i], hi, when};
            hi = offset[i];
            when = never;
        }
    }
    qsort(bk, (size_t)nb, sizeof *bk, s_cmp_bucket);
    *nout = nb;
    return TP_OK;
}

tp_status_t tp_buckets_begin_(const tp_reduce_rank_t *r,
                              const struct tp_bucket *bk, int nb, int *k,
                              int done) {
    tp_backend_t *b = r->backend;
    for (; *k < nb && bk[*k].after >= done; ++*k) {
        tp_status_t rc = b->ops->allreduce_begin(b, r->comm, r->rank, r->stream,
                                                 r->grads + bk[*k].lo,
                                                 bk[*k].hi - bk[*k].lo,
                                                 r->average);
        if (rc < 0)
            return tp_error_wrap(rc, "%s: all-reduce of bucket %d (floats %zu..%zu)",
                                 r->who, *k, bk[*k].lo, bk[*k].hi);
    }
    return TP_OK;
}

tp_status_t tp_buckets_end_(const tp_reduce_rank_t *r) {
    tp_backend_t *b = r->backend;
    return b->ops->allreduce_end(b, r->comm, r->rank, r->stream);
}

tp_status_t tp_allreduce_(const tp_reduce_rank_t *r) {
    tp_backend_t *b = r->backend;
    return b->ops->allreduce(b, r->comm, r->rank, r->stream, r->grads, r->n,
                             r->average);
}

tp_status_t tp_allreduce_root_(tp_backend_t *b, float *const *bufs, int n,
                               size_t count, int average) {
    return b->ops->allreduce_local(b, bufs, n, count, average, 1);
}
