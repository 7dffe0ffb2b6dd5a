/* towerpack pipeline: the trainer's narrow interface, for what is built on
 * it inside pipeline/ and is not part of the public API: the hook runners
 * the wrappers call, the callback table, the watchdog's period, sidecars
 * (what runs beside the loop) and a trainer that follows a loop run
 * elsewhere. Everything here is defined in pipeline/train/trainer.c, which
 * calls nothing of its users: the callback actor
 * (pipeline/callbacks/callback_actor.c) depends on the trainer through this
 * header and trainer_loop.h, never the other way (the trainer reaches a
 * sidecar only through the ops table it was given). It sits in pipeline/,
 * above its users in pipeline/train/ and pipeline/callbacks/: a private
 * header lives in the lowest folder that holds all of its users
 * (scripts/check-layout.sh). */
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
void tp_cb_on_image(tp_callback_t *cb, tp_trainer_t *tr, const char *tag,
                    const tp_tensor_t *image);
void tp_cb_on_scalar(tp_callback_t *cb, tp_trainer_t *tr, const char *name,
                     double value);

/* Seconds the callback spent in after_epoch + trigger_epoch of the last
 * epoch. */
double tp_callback_epoch_end_seconds(const tp_callback_t *self);
void *tp_callback_impl(tp_callback_t *self);
const tp_callback_ops_t *tp_callback_ops(const tp_callback_t *self);
/* The callback a wrapper (PeriodicTrigger, PeriodicCallback,
 * EnableCallbackIf, nested) runs; cb itself when it is none. Borrowed. The
 * launch asks it which callbacks are ModelSavers. */
tp_callback_t *tp_cb_unwrap(tp_callback_t *cb);

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

/* ---- sidecars: what runs beside the loop ------------------------------------
 * A callback's setup_graph may attach a sidecar (the callback actor is one);
 * the loop then calls it by name at fixed points and knows nothing else of
 * it (czmq's zactor: the owner holds a handle and calls its methods). Each
 * hook may be NULL; errors stop training as a hook's would. */
typedef struct tp_sidecar_ops {
    const char *name;
    /* After every setup_graph (also after one failed: the callbacks set up
     * are owed their after_train), before any before_train: start, and
     * return once running. */
    tp_status_t (*start)(void *impl, tp_trainer_t *tr);
    /* At each step boundary, after trigger_step: what it sent back. Never
     * waits long. */
    tp_status_t (*poll)(void *impl, tp_trainer_t *tr);
    /* After an epoch's trigger_epoch, once the scalars' history has the
     * epoch. */
    tp_status_t (*epoch_end)(void *impl, tp_trainer_t *tr);
    /* After every after_train: wait until it is done, and stop. */
    tp_status_t (*finish)(void *impl, tp_trainer_t *tr);
    /* With the trainer, before its callbacks: stop if it still runs (and
     * return only once stopped), free impl. */
    void (*destroy)(void *impl);
} tp_sidecar_ops_t;

#define TP_TRAINER_MAX_SIDECARS 4

/* Attach `impl` (the trainer owns it from now on, also on failure: then it
 * is destroyed at once). Only before training, or from setup_graph. */
tp_status_t tp_trainer_attach(tp_trainer_t *self, const tp_sidecar_ops_t *ops, void *impl);
/* The impl attached with `ops`, or NULL. */
void *tp_trainer_sidecar(const tp_trainer_t *self, const tp_sidecar_ops_t *ops);

/* ---- a trainer that follows a loop run elsewhere ---------------------------
 * What observing callbacks see is a plain trainer of the callback actor's
 * own (its ops say what it can do: no steps, no hyper-parameters to set),
 * whose counters, schedule and scalars the actor keeps in step with the
 * messages of the trainer whose loop runs. It holds no link to that
 * trainer: stop requests and scalars put on it go back as messages. */

/* Follow a loop with schedule `sched`: no callback can be added from now. */
void tp_trainer_follow(tp_trainer_t *self, const tp_schedule_t *sched);
/* Where the loop was (its counters) and when (tp_now_ns's clock): what
 * tp_trainer_hook_time_ns answers from now on. */
void tp_trainer_follow_at(tp_trainer_t *self, int64_t epoch, int64_t local_step,
                          int64_t global_step, uint64_t t_ns);
/* The loop's epoch ended: every scalar's latest value joins its history. */
void tp_trainer_follow_epoch_end(tp_trainer_t *self);
/* 0: no stop requested; 1: requested; 2: requested by a signal
 * (tp_trainer_request_stop's `interrupted`). */
int tp_trainer_stop_requested(const tp_trainer_t *self);

#endif
