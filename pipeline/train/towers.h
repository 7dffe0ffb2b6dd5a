/* towerpack pipeline: tower executors as actors (internal to the trainer). */
#ifndef TP_PIPELINE_TOWERS_H
#define TP_PIPELINE_TOWERS_H

#include <stdatomic.h>
#include <stdint.h>
#include <towerpack/datapoint.h>
#include <towerpack/graph.h>
#include <towerpack/stats.h>

#define TP_TOWERS_MAX 64

typedef struct tp_towers tp_towers_t;

/* A tower's own counters: steps, time computing forward and backward
 * (busy), waiting for its next batch (starved: from the end of one step to
 * the start of the next), and in the all-reduce and the update of its
 * slice (blocked: waiting for the other towers, and the reduction itself).
 * Written only by the thread that runs the tower, two or three clock reads
 * a step and relaxed atomic stores (plain stores on x86-64: no lock, no
 * fence on the step path); read by any thread. Held by value: init. */
typedef struct tp_tower_meter {
    atomic_uint_fast64_t steps, busy_ns, starved_ns, blocked_ns;
    uint64_t start_ns;    /* set by init */
    uint64_t idle_since;  /* the runner's: when its last step ended */
} tp_tower_meter_t;

void tp_tower_meter_init(tp_tower_meter_t *m);
/* Tower `index`'s row ("towerN") from its counters, as of now. */
void tp_tower_meter_row(const tp_tower_meter_t *m, int index, tp_stats_row_t *row);

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

/* The towers' rows, one per tower ("tower0", ...), at most `max`;
 * returns how many. Any thread (the counters are the towers' own). */
int tp_towers_stats(const tp_towers_t *self, tp_stats_row_t *rows, int max);

/* Forward, backward and what `allreduce` says, for one tower on `dp`
 * (borrowed), on the calling thread, counted in `meter` (may be NULL). */
tp_status_t tp_tower_compute(tp_model_t *m, int index, int ninputs,
                             int allreduce, tp_datapoint_t *dp,
                             tp_tower_meter_t *meter);

/* One whole step of a one-tower model on `dp` (borrowed): forward,
 * backward and the update, fused where the model can; counted in `meter`
 * (may be NULL) as busy. */
tp_status_t tp_tower_train_step(tp_model_t *m, int ninputs, tp_datapoint_t *dp,
                                tp_tower_meter_t *meter);

#endif
