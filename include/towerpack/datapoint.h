/* towerpack: the datapoint, an ordered list of components, each a tensor.
 *
 * A datapoint owns its components. Inside a process it moves between actors
 * by pointer (ownership moves with it); only at a process or host boundary
 * is it serialised (towerpack/wire.h). */
#ifndef TOWERPACK_DATAPOINT_H
#define TOWERPACK_DATAPOINT_H

#include <towerpack/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_datapoint tp_datapoint_t;

/* A datapoint with `ncomp` empty components (0 is fine). Caller owns.
 * NULL when out of memory or ncomp is negative or above TP_DP_MAX_COMPONENTS. */
#define TP_DP_MAX_COMPONENTS 1024
tp_datapoint_t *tp_datapoint_new(int ncomp);

/* Free the datapoint and every component; accepts NULL, nulls *self_p. */
void tp_datapoint_destroy(tp_datapoint_t **self_p);

/* Number of components. */
int tp_datapoint_size(const tp_datapoint_t *self);

/* Component i (0 <= i < size); asserts on a bad index. The datapoint still
 * owns it: move out with tp_tensor_move to take it. */
tp_tensor_t *tp_datapoint_get(tp_datapoint_t *self, int i);
const tp_tensor_t *tp_datapoint_cget(const tp_datapoint_t *self, int i);

/* Move *t into a new last component (t becomes empty). */
tp_status_t tp_datapoint_append(tp_datapoint_t *self, tp_tensor_t *t);

/* Grow or shrink to n components (new ones empty, dropped ones finished). */
tp_status_t tp_datapoint_resize(tp_datapoint_t *self, int n);

/* Borrowed views of the first `max` components into views[] (tensors that
 * point at the datapoint's memory and free nothing: valid while it lives).
 * Returns the number of components viewed. */
int tp_datapoint_views(const tp_datapoint_t *self, tp_tensor_t *views, int max);

/* Deep copy. Caller owns; NULL on out of memory. */
tp_datapoint_t *tp_datapoint_copy(const tp_datapoint_t *self);

/* Sum of the components' byte sizes. */
size_t tp_datapoint_nbytes(const tp_datapoint_t *self);

/* A pointer slot in the datapoint that towerpack itself never reads: the
 * datapoint's owner may chain it into a list through it without allocating
 * (QueueInput collects the batches given back to it this way). Returns the
 * slot's address, so that lock-free pushes can compare-and-swap on it. */
tp_datapoint_t **tp_datapoint_link(tp_datapoint_t *self);

/* 1 when both have the same number of equal components. */
int tp_datapoint_equal(const tp_datapoint_t *a, const tp_datapoint_t *b);

#ifdef __cplusplus
}
#endif
#endif
