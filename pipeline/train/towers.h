/* towerpack pipeline: tower executors as actors (internal to the trainer). */
#ifndef TP_PIPELINE_TOWERS_H
#define TP_PIPELINE_TOWERS_H

#include <stdatomic.h>
#include <stdint.h>
#include <towerpack/datapoint.h>
#include <towerpack/graph.h>
#include <towerpack/launch.h>
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

/* One actor per tower of `m`, each running `stages` (TP_RUN_* of
 * tp_model_run) on its own batch: TP_RUN_GRADIENTS when the supervisor
 * reduces and updates, TP_RUN_FORWARD..TP_RUN_REDUCE to join the
 * all-reduce too, TP_RUN_TRAIN to also update the tower's slice of the
 * variables (the supervisor closes the step with TP_RUN_UPDATE on
 * TP_ALL_TOWERS). A tower gives its batch back with
 * tp_input_release(input, its index, ...) when done with it. */
tp_towers_t *tp_towers_new(tp_model_t *m, int n, unsigned stages, tp_input_t *input);
void tp_towers_destroy(tp_towers_t **self_p);

/* Run one step: batches[i] (taken) on tower i, all in parallel; returns
 * when every tower is done, with the first failure (the cause, not the
 * other towers' aborted collective). While waiting it calls
 * tp_actor_wait_tick every 100 ms (the caller's wait phase runs there; a
 * step is never abandoned half-way, so its answer is the caller's to act
 * on after the step); a step still running after watchdog_s seconds (and
 * every watchdog_s after) is reported, naming the towers not done. */
tp_status_t tp_towers_step(tp_towers_t *self, tp_datapoint_t **batches,
                           double watchdog_s);

/* The towers' rows, one per tower ("tower0", ...), at most `max`;
 * returns how many. Any thread (the counters are the towers' own). */
int tp_towers_stats(const tp_towers_t *self, tp_stats_row_t *rows, int max);

/* `stages` of tower `index` (TP_ALL_TOWERS: all, from this thread) on
 * `dp` (borrowed), its components the feeds, on the calling thread;
 * counted in `meter` (may be NULL): compute as busy, the all-reduce and the
 * update as blocked. */
tp_status_t tp_tower_compute(tp_model_t *m, int index, unsigned stages,
                             tp_datapoint_t *dp, tp_tower_meter_t *meter);

#endif
