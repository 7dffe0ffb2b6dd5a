/* towerpack pipeline: what the trainer's own callbacks and wrappers need of
 * the trainer and of each other, not part of the public API. It sits in
 * pipeline/, above its two users pipeline/train/ (the trainer, which owns
 * the callback objects) and pipeline/callbacks/ (the wrappers and the
 * progress monitors): a private header lives in the lowest folder that holds
 * all of its users (scripts/check-layout.sh). */
#ifndef TP_PIPELINE_TRAINER_INTERNAL_H
#define TP_PIPELINE_TRAINER_INTERNAL_H

#include <towerpack/callback.h>

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

size_t tp_trainer_ncallbacks(const tp_trainer_t *self);
tp_callback_t *tp_trainer_callback(tp_trainer_t *self, size_t i);

#endif
