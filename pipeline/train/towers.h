/* towerpack pipeline: tower executors as actors (internal to the trainer). */
#ifndef TP_PIPELINE_TOWERS_H
#define TP_PIPELINE_TOWERS_H

#include <towerpack/datapoint.h>
#include <towerpack/graph.h>

#define TP_TOWERS_MAX 64

typedef struct tp_towers tp_towers_t;

/* One actor per tower of `m`, each running `stages` (TP_RUN_* of
 * tp_model_run) on its own batch: TP_RUN_GRADIENTS when the trainer reduces
 * and updates, TP_RUN_FORWARD..TP_RUN_REDUCE to join the all-reduce too,
 * TP_RUN_TRAIN to also update the tower's slice of the variables (the
 * trainer closes the step with TP_RUN_UPDATE on TP_ALL_TOWERS). */
tp_towers_t *tp_towers_new(tp_model_t *m, int n, unsigned stages);
void tp_towers_destroy(tp_towers_t **self_p);

/* Run one step: batches[i] (taken) on tower i, all in parallel; returns
 * when every tower is done, with the first failure. A step still running
 * after watchdog_s seconds (and every watchdog_s after) is reported. */
tp_status_t tp_towers_step(tp_towers_t *self, tp_datapoint_t **batches,
                           double watchdog_s);

/* Seconds tower i spent computing. */
double tp_towers_busy_s(const tp_towers_t *self, int i);

/* `stages` of tower `index` (TP_ALL_TOWERS: all, from this thread) on
 * `dp` (borrowed), its components the feeds, on the calling thread. */
tp_status_t tp_tower_compute(tp_model_t *m, int index, unsigned stages,
                             tp_datapoint_t *dp);

#endif
