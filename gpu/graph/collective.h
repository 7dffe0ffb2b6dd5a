/* towerpack gpu/graph: the all-reduce of gradient buffers, on plain arrays
 * (a buffer and its size, bucket ranges of it, the ranks' buffers). It
 * knows nothing of the model: model.c's step decides what is reduced and
 * when, and keeps the step's state. Not installed. */
#ifndef TOWERPACK_GPU_GRAPH_COLLECTIVE_H
#define TOWERPACK_GPU_GRAPH_COLLECTIVE_H

#include <stddef.h>
#include <towerpack/status.h>
#include "gpu/backend_impl.h"

/* A range of a gradient buffer, floats [lo, hi), all-reduced once node
 * `after`'s backward ran (the last to write one of its gradients). */
struct tp_bucket {
    size_t lo, hi;
    int after;
};

/* One rank's part of an all-reduce: the communicator and the rank it is,
 * the stream it queues on, and its buffer grads [n]; `who` names it in
 * errors ("tower1"). */
typedef struct tp_reduce_rank {
    tp_backend_t *backend;
    tp_comm_t *comm;
    int rank;
    tp_stream_t *stream;
    float *grads;      /* [n] */
    size_t n;
    int average;       /* the mean, not the sum */
    const char *who;
} tp_reduce_rank_t;

/* Cut a gradient buffer of `end` floats into buckets of about `floats`
 * (whole variables), from its end (the last layers, whose gradients are
 * final first). The buffer holds n variables at offset[0] < offset[1] <
 * ...; variable i's gradient is final once node after[i]'s backward ran
 * (`never`: never written, final from the start). Buckets come in the
 * order they are begun (*out [*nout], caller owns), the same on every
 * rank given the same arrays, as the collective needs. */
tp_status_t tp_buckets_plan_(const size_t *offset, const int *after, int n,
                             size_t end, int never, size_t floats,
                             struct tp_bucket **out, int *nout);
/* Begin the all-reduce of buckets bk[*k..nb) whose gradients are final
 * once node `done`'s backward ran (all of them: INT_MIN); *k moves past
 * the ones begun. */
tp_status_t tp_buckets_begin_(const tp_reduce_rank_t *r,
                              const struct tp_bucket *bk, int nb, int *k,
                              int done);
/* Wait for every bucket the rank began: its buffer holds the sum. */
tp_status_t tp_buckets_end_(const tp_reduce_rank_t *r);
/* The whole buffer at once, from the rank's own thread. */
tp_status_t tp_allreduce_(const tp_reduce_rank_t *r);
/* One thread holding all n buffers [count] each: the sum (the mean) lands
 * in bufs[0] only (parameter-server style). */
tp_status_t tp_allreduce_root_(tp_backend_t *b, float *const *bufs, int n,
                               size_t count, int average);

#endif
