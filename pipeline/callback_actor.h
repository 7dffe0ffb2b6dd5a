/* towerpack pipeline: the callback actor as the run's supervision sees it
 * (pipeline/callbacks/callback_actor.c): its tp-top row and the steps the
 * latest-only observers skipped. Used by pipeline/train/train.c; the
 * trainer loop (trainer.c) does not include it: it reaches the actor only
 * through the sidecar ops table (trainer_internal.h). */
#ifndef TP_PIPELINE_CALLBACK_ACTOR_H
#define TP_PIPELINE_CALLBACK_ACTOR_H

#include <stdint.h>
#include <towerpack/stats.h>
#include <towerpack/trainer_loop.h>

typedef struct tp_cb_actor tp_cb_actor_t;

/* The callback actor attached to `tr` (by its first observing callback's
 * setup_graph), or NULL. */
tp_cb_actor_t *tp_cb_actor_of(const tp_trainer_t *tr);
/* Its row for tp-top ("callbacks"). */
void tp_cb_actor_row(const tp_cb_actor_t *a, tp_stats_row_t *row);
/* The per-step events the latest-only observers skipped because they were
 * behind. */
uint64_t tp_cb_actor_skipped(const tp_cb_actor_t *a);

#endif
