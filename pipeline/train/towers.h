/* towerpack pipeline: tower executors as actors (internal to the trainer). */
#ifndef TP_PIPELINE_TOWERS_H
#define TP_PIPELINE_TOWERS_H

#include <towerpack/datapoint.h>
#include <towerpack/graph.h>

#define TP_TOWERS_MAX 64

typedef struct tp_towers tp_towers_t;

/* What a tower does after its backward pass. */
enum {
    TP_TOWERS_NO_ALLREDUCE = 0,    /* nothing (the trainer reduces) */
    TP_TOWERS_ALLREDUCE = 1,       /* joins the gradients' all-reduce */
    TP_TOWERS_ALLREDUCE_APPLY = 2  /* ... then updates its slice of the
                                      variables (tp_model_end_step after) */
};

/* One actor per tower of `m`; allreduce: one of the above (replicated
 * training all-reduces; with one tower there is nothing to reduce). */
tp_towers_t *tp_towers_new(tp_model_t *m, int n, int ninputs, int allreduce);
void tp_towers_destroy(tp_towers_t **self_p);

/* Run one step: batches[i] (taken) on tower i, all in parallel; returns
 * when every tower is done, with the first failure. A step still running
 * after watchdog_s seconds (and every watchdog_s after) is reported. */
tp_status_t tp_towers_step(tp_towers_t *self, tp_datapoint_t **batches,
                           double watchdog_s);

/* Seconds tower i spent computing. */
double tp_towers_busy_s(const tp_towers_t *self, int i);

/* Forward, backward and what `allreduce` says, for one tower on `dp`
 * (borrowed), on the calling thread. */
tp_status_t tp_tower_compute(tp_model_t *m, int index, int ninputs,
                             int allreduce, tp_datapoint_t *dp);

/* One whole step of a one-tower model on `dp` (borrowed): forward,
 * backward and the update, fused where the model can. */
tp_status_t tp_tower_train_step(tp_model_t *m, int ninputs, tp_datapoint_t *dp);

#endif
