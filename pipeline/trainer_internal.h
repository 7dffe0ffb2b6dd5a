/* towerpack pipeline: what the trainer's own callbacks and wrappers need of
 * the trainer and of each other, not part of the public API. It sits in
 * pipeline/, above its two users pipeline/train/ (the trainer, which owns
 * the callback objects) and pipeline/callbacks/ (the wrappers and the
 * progress monitors): a private header lives in the lowest folder that holds
 * all of its users (scripts/check-layout.sh). */
#ifndef TP_PIPELINE_TRAINER_INTERNAL_H
#define TP_PIPELINE_TRAINER_INTERNAL_H

#include <towerpack/callback.h>
#include <towerpack/stats.h>

/* Run one hook of a callback (timed, errors wrapped with its name). */
tp_status_t tp_cb_setup_graph(tp_callback_t *cb, tp_trainer_t *tr);
tp_status_t tp_cb_before_train(tp_callback_t *cb, tp_trainer_t *tr);
tp_status_t tp_cb_before_epoch(tp_callback_t *cb, tp_trainer_t *tr);
tp_status_t tp_cb_before_run(tp_callback_t *cb, tp_trainer_t *tr, tp_fetches_t *f);
tp_status_t tp_cb_after_run(tp_callback_t *cb, tp_trainer_t *tr, const tp_fetches_t *f);
tp_status_t tp_cb_trigger_step(tp_callback_t *cb, tp_trainer_t *tr);
tp_status_t tp_cb_after_epoch(tp_callback_t *cb, tp_trainer_t *tr);
tp_status_t tp_cb_trigger_epoch(tp_callback_t *cb, tp_trainer_t *tr);
tp_status_t tp_cb_trigger(tp_callback_t *cb, tp_trainer_t *tr);
tp_status_t tp_cb_after_train(tp_callback_t *cb, tp_trainer_t *tr);
void tp_cb_on_scalar(tp_callback_t *cb, tp_trainer_t *tr, const char *name,
                     double value);

/* Seconds the callback spent in after_epoch + trigger_epoch of the last
 * epoch. */
double tp_callback_epoch_end_seconds(const tp_callback_t *self);
void *tp_callback_impl(tp_callback_t *self);
const tp_callback_ops_t *tp_callback_ops(const tp_callback_t *self);

/* The watchdog's period in seconds (0: off, the default): launch sets the
 * TrainConfig's; the callback actor names an observer stuck in one hook
 * that long. */
void tp_trainer_set_watchdog(tp_trainer_t *self, double seconds);
double tp_trainer_watchdog(const tp_trainer_t *self);

size_t tp_trainer_ncallbacks(const tp_trainer_t *self);
tp_callback_t *tp_trainer_callback(tp_trainer_t *self, size_t i);

/* A fetches table of one's own (the callback actor's, for an observing
 * callback's before_run/after_run); begin clears what was asked. */
tp_fetches_t *tp_fetches_new(void);
void tp_fetches_destroy(tp_fetches_t **f_p);
void tp_fetches_begin(tp_fetches_t *f);

/* ---- the callback actor (pipeline/callbacks/callback_actor.c) ----------------
 * Observing callbacks (tp_cb_observe, tp_cb_observe_latest) run on one
 * actor per trainer, fed by messages; the trainer loop drains what they
 * send back at each step boundary and waits for them at the end. */
typedef struct tp_cb_actor tp_cb_actor_t;

/* The trainer's slot for its callback actor (NULL until the first
 * observing callback's setup_graph makes it). */
tp_cb_actor_t **tp_trainer_cb_actor_slot(tp_trainer_t *self);
/* What the observers sent back (scalars they put, the first failure):
 * never waits. */
tp_status_t tp_cb_actor_poll(tp_cb_actor_t *a, tp_trainer_t *tr);
/* After the trainer's epoch end: the observers' scalar history too. */
tp_status_t tp_cb_actor_epoch_end(tp_cb_actor_t *a, tp_trainer_t *tr);
/* After every after_train was sent: wait until the observers ran all of
 * their hooks, take what they sent back; their first failure. */
tp_status_t tp_cb_actor_finish(tp_cb_actor_t *a, tp_trainer_t *tr);
/* On the actor (a view's put): the scalar goes back to the trainer. */
void tp_cb_actor_put_back(tp_cb_actor_t *a, const char *name, double value);
/* The actor's row for tp-top ("callbacks") and the per-step events the
 * latest-only observers skipped because they were behind. */
void tp_cb_actor_row(const tp_cb_actor_t *a, tp_stats_row_t *row);
uint64_t tp_cb_actor_skipped(const tp_cb_actor_t *a);
void tp_cb_actor_destroy(tp_cb_actor_t **a_p);
/* 1 for an observing callback (one that runs on the callback actor). */
int tp_callback_observes(const tp_callback_t *cb);

/* A view: the trainer as the callback actor shows it to observing
 * callbacks. It mirrors `of`'s schedule, counters (set per event) and
 * scalars (sent by the trainer); stop requests go to `of`; it refuses to
 * set hyper-parameters and has no model. */
tp_trainer_t *tp_trainer_view_new(tp_trainer_t *of);
/* Add an observing callback's inner callback (chief_only already decided). */
tp_status_t tp_trainer_view_add(tp_trainer_t *view, tp_callback_t **cb_p);
/* When the actor starts (on the trainer's thread): the scalars so far. */
void tp_trainer_view_start(tp_trainer_t *view);
void tp_trainer_view_set(tp_trainer_t *view, int64_t epoch, int64_t local_step,
                         int64_t global_step, uint64_t t_ns);
void tp_trainer_view_epoch_end(tp_trainer_t *view);
/* Store a scalar and tell the callbacks that are not observers: for a
 * scalar that came over the actor's socket (it is not sent on again). */
void tp_trainer_put_scalar_local(tp_trainer_t *self, const char *name, double value);

#endif
