/* towerpack: the trainer loop (was trainer.h): the base trainer, its loop, and the callbacks and monitors it
 * drives (tensorpack's Trainer, Callback and Monitor, in C).
 *
 * The only assumption the trainer makes is the seeds' loop:
 *
 *   for epoch_num in starting_epoch .. max_epoch:       (1-based, inclusive)
 *       for local_step in 0 .. steps_per_epoch - 1:
 *           run_step()
 *
 * An epoch is the period of the callbacks, not necessarily one pass of the
 * data. Hooks run in tensorpack's order:
 *
 *   setup_graph, before_train,
 *   (before_epoch, (before_run, run_step, after_run, trigger_step)*,
 *    after_epoch, trigger_epoch -> trigger)*,
 *   after_train            (always: also after an error or a stop request)
 *
 * and, within one hook, in registration order. What a step is belongs to a
 * trainer implementation (tp_trainer_ops_t): a single-cost trainer runs the
 * towers; a custom one may alternate two costs. */
#ifndef TOWERPACK_TRAINER_LOOP_H
#define TOWERPACK_TRAINER_LOOP_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/status.h>
#include <towerpack/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_trainer tp_trainer_t;
typedef struct tp_callback tp_callback_t;
typedef struct tp_model tp_model_t;   /* towerpack/graph.h */

/* ---- the step's fetches: the before_run / after_run contract -------------- */

/* Named scalar values of one step. A callback's before_run asks for names
 * (tp_fetches_request); the trainer's run_step provides values for the
 * names asked (tp_fetches_set); after_run reads them (tp_fetches_get). */
typedef struct tp_fetches tp_fetches_t;

/* Ask for `name` in this step (idempotent). */
tp_status_t tp_fetches_request(tp_fetches_t *f, const char *name);
/* Number of names asked for this step, and the i-th. */
int tp_fetches_count(const tp_fetches_t *f);
const char *tp_fetches_name(const tp_fetches_t *f, int i);
/* 1 when `name` was asked for. */
int tp_fetches_wanted(const tp_fetches_t *f, const char *name);
/* Provide a value (run_step). Names not asked for are ignored. */
void tp_fetches_set(tp_fetches_t *f, const char *name, double value);
/* Read a value (after_run): TP_ERR_NOT_FOUND when the step did not give it. */
tp_status_t tp_fetches_get(const tp_fetches_t *f, const char *name,
                           double *value);

/* ---- trainers ---------------------------------------------------------------- */

typedef struct tp_trainer_ops {
    const char *name;
    /* Build what a step needs (the graph, the input). May be NULL. */
    tp_status_t (*setup)(void *impl, tp_trainer_t *tr);
    /* One iteration. Fill the requested fetches it can. */
    tp_status_t (*run_step)(void *impl, tp_trainer_t *tr, tp_fetches_t *f);
    /* Set / read a hyper-parameter by name ("learning_rate"). May be NULL:
     * then no hyper-parameters exist (TP_ERR_NOT_FOUND). */
    tp_status_t (*set_hyperparam)(void *impl, const char *name, double value);
    tp_status_t (*get_hyperparam)(void *impl, const char *name, double *value);
    /* Samples a step consumes (batch x towers), for throughput; may be NULL. */
    int64_t (*samples_per_step)(void *impl);
    /* The model the trainer trains, for callbacks that save, validate or
     * inspect it (ModelSaver, InferenceRunner); may be NULL. */
    tp_model_t *(*model)(void *impl);
    /* Free impl (may be NULL). */
    void (*destroy)(void *impl);
} tp_trainer_ops_t;

/* A trainer over `impl`. Takes impl (destroyed with the trainer, or at once
 * on failure). Caller owns. */
tp_trainer_t *tp_trainer_new(const tp_trainer_ops_t *ops, void *impl);
void tp_trainer_destroy(tp_trainer_t **self_p);

/* Register a callback: takes it, nulls *cb_p. Callbacks run in the order
 * they are registered. Not allowed once training has started. */
tp_status_t tp_trainer_add_callback(tp_trainer_t *self, tp_callback_t **cb_p);

/* 0 for a non-chief rank in distributed training: chief-only callbacks are
 * then not registered (they are destroyed). Default 1. */
void tp_trainer_set_chief(tp_trainer_t *self, int is_chief);
int tp_trainer_is_chief(const tp_trainer_t *self);

typedef struct tp_schedule {
    int64_t starting_epoch;   /* first epoch, 1-based (default 1) */
    int64_t max_epoch;        /* last epoch, inclusive */
    int64_t steps_per_epoch;  /* > 0 */
} tp_schedule_t;

/* Run the loop. Returns the first error of a hook or a step (after_train
 * has run all the same), TP_ERR_INTERRUPTED after tp_trainer_request_stop
 * from a signal, or TP_OK (also when a callback stopped training). */
tp_status_t tp_trainer_train(tp_trainer_t *self, const tp_schedule_t *sched);

/* Ask the loop to stop. Asked during a step (before_run .. trigger_step,
 * or a step itself): the loop stops after that step's hooks, after_epoch
 * and trigger_epoch of the unfinished epoch are skipped. Asked at the
 * epoch's end (after_epoch, trigger_epoch): that end finishes, every
 * callback's after_epoch and trigger_epoch of the epoch run (its statistics
 * written, its checkpoint saved), and no further epoch starts. after_train
 * runs in both cases. `reason` is logged and
 * kept (tp_trainer_stop_reason). Async-signal-safe when `reason` is a string
 * literal and `interrupted` says it came from a signal. */
void tp_trainer_request_stop(tp_trainer_t *self, const char *reason,
                             int interrupted);
const char *tp_trainer_stop_reason(const tp_trainer_t *self);

/* The loop's counters. epoch_num is the current (or last) epoch; local_step
 * counts steps in the epoch from 0; global_step counts every step of the
 * run, resumed runs included: (starting_epoch - 1) x steps_per_epoch at the
 * start. */
int64_t tp_trainer_epoch_num(const tp_trainer_t *self);
int64_t tp_trainer_local_step(const tp_trainer_t *self);
int64_t tp_trainer_global_step(const tp_trainer_t *self);
/* When the hook running now was due (tp_now_ns's clock): now, on the
 * trainer's thread; for an observing callback (tp_cb_observe), when the
 * trainer reached that hook, which may be a while before the callback
 * actor runs it. Callbacks that time steps use this. */
uint64_t tp_trainer_hook_time_ns(const tp_trainer_t *self);
const tp_schedule_t *tp_trainer_schedule(const tp_trainer_t *self);
/* Override the global step (resume from a checkpoint's state). */
void tp_trainer_set_global_step(tp_trainer_t *self, int64_t step);
int64_t tp_trainer_samples_per_step(const tp_trainer_t *self);

/* Hyper-parameters, forwarded to the trainer implementation. */
tp_status_t tp_trainer_set_hyperparam(tp_trainer_t *self, const char *name,
                                      double value);
tp_status_t tp_trainer_get_hyperparam(tp_trainer_t *self, const char *name,
                                      double *value);

/* The implementation pointer. */
void *tp_trainer_impl(tp_trainer_t *self);

/* The trained model (ops->model), or NULL for a trainer without one. */
tp_model_t *tp_trainer_model(tp_trainer_t *self);

/* ---- monitors: where scalars go ------------------------------------------- */

/* Record a scalar (a metric, a validation result, a learning rate). Every
 * registered monitor sees it; the trainer keeps the latest value and a
 * history per name for callbacks that react to statistics. */
void tp_trainer_put_scalar(tp_trainer_t *self, const char *name,
                           double value);
/* Show an image (a sample grid, a reconstruction) to every monitor that
 * takes images (TFEventWriter: TensorBoard's Images tab, at the current
 * global step): uint8 [H, W, C] with C 1 (grey) or 3 (RGB), HWC order.
 * Not kept by the trainer. An image put by an observing callback reaches
 * only the observers. TP_ERR_INVALID for another dtype or shape. */
tp_status_t tp_trainer_put_image(tp_trainer_t *self, const char *tag,
                                 const tp_tensor_t *image);

/* The latest value of `name`: TP_ERR_NOT_FOUND when none was put. */
tp_status_t tp_trainer_get_scalar(const tp_trainer_t *self, const char *name,
                                  double *value);
/* The history of `name` (epoch-end values, oldest first): *n values in
 * *values (owned by the trainer, valid until the next put). */
tp_status_t tp_trainer_scalar_history(const tp_trainer_t *self,
                                      const char *name, const double **values,
                                      size_t *n);
/* Number of distinct scalar names, and the i-th (stable order: first put). */
size_t tp_trainer_scalar_count(const tp_trainer_t *self);
const char *tp_trainer_scalar_name(const tp_trainer_t *self, size_t i);

/* Log directory of the run (NULL when none); callbacks that write files
 * (savers, JSONWriter) use it. The string is copied. */
tp_status_t tp_trainer_set_logdir(tp_trainer_t *self, const char *dir);
const char *tp_trainer_logdir(const tp_trainer_t *self);

#ifdef __cplusplus
}
#endif
#endif
