/* towerpack core: the datapoint's layout, private to core (datapoint.c).
 * Not installed; every other room goes through datapoint.h (the actors'
 * byte counters call tp_datapoint_nbytes, QueueInput tp_datapoint_link). */
#ifndef TOWERPACK_CORE_DATAPOINT_INTERNAL_H
#define TOWERPACK_CORE_DATAPOINT_INTERNAL_H

#include <towerpack/datapoint.h>

#define TP_DP_INLINE 4

struct tp_datapoint {
    int size;
    int capacity;
    tp_tensor_t *comp;                 /* [capacity] */
    tp_tensor_t inline_comp[TP_DP_INLINE];
    /* Free for whoever owns the datapoint to chain it in a list (QueueInput
     * collects the batches given back to it); never read by datapoint.c. */
    struct tp_datapoint *link;
};

/* tp_datapoint_nbytes, inlined. */
static inline size_t tp_dp_nbytes_inline(const tp_datapoint_t *dp) {
    size_t n = 0;
    for (int i = 0; i < dp->size; i++)
        n += dp->comp[i].nbytes;
    return n;
}

#endif
