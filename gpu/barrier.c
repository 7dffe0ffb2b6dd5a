/* towerpack gpu: the barrier the towers of one communicator meet at, and
 * the all-reduce's first meeting (do all ranks bring the same count?).
 *
 * Both backends' all-reduce rendezvous here (the CPU backend in-process,
 * the CUDA module through libtowerpack, which exports this): one copy, so
 * a fix to the abort path reaches both. A plain pthread barrier will not
 * do: it cannot be interrupted, and a tower that failed must not leave the
 * others waiting for it forever. */
#include <pthread.h>
#include "gpu/backend_impl.h"

void tp_barrier_init(tp_barrier_t *b, int nranks) {
    b->nranks = nranks;
    b->arrived = 0;
    b->generation = 0;
    b->aborted = 0;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
}

void tp_barrier_fini(tp_barrier_t *b) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

void tp_barrier_abort(tp_barrier_t *b) {
    pthread_mutex_lock(&b->mu);
    b->aborted = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

int tp_barrier_wait(tp_barrier_t *b) {
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        pthread_mutex_unlock(&b->mu);
        return -1;
    }
    /* A generation count, not the arrival count, tells a waiter that its
     * round completed: the last rank resets `arrived` for the next round
     * before the waiters wake. */
    uint64_t gen = b->generation;
    if (++b->arrived == b->nranks) {
        b->arrived = 0;
        b->generation++;
        pthread_cond_broadcast(&b->cv);
    } else {
        while (gen == b->generation && !b->aborted)
            pthread_cond_wait(&b->cv, &b->mu);
    }
    int rc = gen == b->generation ? -1 : 0;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

tp_status_t tp_barrier_sync(tp_barrier_t *b, int rank) {
    if (tp_barrier_wait(b) < 0)
        return tp_error(TP_ERR_INTERRUPTED, "allreduce: aborted (rank %d)",
                        rank);
    return TP_OK;
}

tp_status_t tp_barrier_agree(tp_barrier_t *b, int rank, size_t *counts,
                             int *averages, size_t count, int average) {
    counts[rank] = count;
    averages[rank] = average;
    TP_TRY(tp_barrier_sync(b, rank));
    for (int r = 0; r < b->nranks; r++)
        if (counts[r] != count || averages[r] != average) {
            /* every rank sees the same mismatch and fails alike; the
             * extra round lets all of them read counts[] before any
             * returns and could publish again */
            tp_status_t st = tp_error(TP_ERR_INVALID,
                                      "allreduce: rank %d gave %zu floats, "
                                      "rank %d gave %zu",
                                      r, counts[r], rank, count);
            tp_barrier_wait(b);
            return st;
        }
    return TP_OK;
}
