/* towerpack: callbacks (tensorpack's Callback) and the ones towerpack ships.
 *
 * A callback is a table of hooks over private state. Every hook may be
 * NULL. A hook that fails stops training: its status is what
 * tp_trainer_train returns, and after_train still runs. trigger_epoch
 * defaults to trigger when NULL. See trainer_loop.h for the order of hooks. */
#ifndef TOWERPACK_CALLBACK_H
#define TOWERPACK_CALLBACK_H

#include <towerpack/trainer_loop.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_callback_ops {
    const char *name;
    tp_status_t (*setup_graph)(void *impl, tp_trainer_t *tr);
    tp_status_t (*before_train)(void *impl, tp_trainer_t *tr);
    tp_status_t (*before_epoch)(void *impl, tp_trainer_t *tr);
    /* Ask for named values of the coming step (tp_fetches_request). */
    tp_status_t (*before_run)(void *impl, tp_trainer_t *tr, tp_fetches_t *f);
    tp_status_t (*after_run)(void *impl, tp_trainer_t *tr,
                             const tp_fetches_t *f);
    tp_status_t (*trigger_step)(void *impl, tp_trainer_t *tr);
    tp_status_t (*after_epoch)(void *impl, tp_trainer_t *tr);
    tp_status_t (*trigger_epoch)(void *impl, tp_trainer_t *tr);
    tp_status_t (*trigger)(void *impl, tp_trainer_t *tr);
    tp_status_t (*after_train)(void *impl, tp_trainer_t *tr);
    /* Monitors: every tp_trainer_put_scalar. */
    void (*on_scalar)(void *impl, tp_trainer_t *tr, const char *name,
                      double value);
    /* Monitors: every tp_trainer_put_image (uint8 [H, W, C], C 1 or 3;
     * valid during the call). */
    void (*on_image)(void *impl, tp_trainer_t *tr, const char *tag,
                     const tp_tensor_t *image);
    void (*destroy)(void *impl);
} tp_callback_ops_t;

/* A callback over `impl` (ops must outlive it: static storage). Takes impl.
 * chief_only: registered only on the chief rank. Caller owns. */
tp_callback_t *tp_callback_new(const tp_callback_ops_t *ops, void *impl,
                               int chief_only);
void tp_callback_destroy(tp_callback_t **self_p);
const char *tp_callback_name(const tp_callback_t *self);
int tp_callback_chief_only(const tp_callback_t *self);
/* Seconds spent in this callback's hooks so far (for the slow-callback
 * report). */
double tp_callback_seconds(const tp_callback_t *self);

/* ---- wrappers (each takes the callback it wraps) --------------------------- */

/* Run cb's trigger every `every_k_steps` global steps and/or every
 * `every_k_epochs` epochs (0 = never by that measure); every other hook of
 * cb runs as usual. */
tp_callback_t *tp_cb_periodic_trigger(tp_callback_t *cb, int64_t every_k_steps,
                                      int64_t every_k_epochs);
/* Run all of cb's epoch hooks (before_epoch .. trigger_epoch) only every
 * `every_k_epochs` epochs; its other hooks as usual. */
tp_callback_t *tp_cb_periodic_callback(tp_callback_t *cb, int64_t every_k_epochs);
/* Run cb's hooks only while pred(trainer, arg) is true (checked per hook;
 * after_run runs exactly when its before_run did). */
typedef int (*tp_cb_pred_fn)(tp_trainer_t *tr, void *arg);
tp_callback_t *tp_cb_enable_if(tp_callback_t *cb, tp_cb_pred_fn pred, void *arg);

/* ---- observing callbacks: off the step path ------------------------------- */

/* Run cb on the trainer's callback actor (a thread of its own, fed by
 * messages) instead of on the trainer's thread, so that its hooks never
 * hold up a step: for callbacks that only watch (progress, monitors,
 * writing files). Its hooks run in tensorpack's order, each with the epoch
 * and steps of the moment it was due, against a trainer of the actor's
 * own that follows the loop: it has the schedule, the counters and every
 * scalar, but no model and no hyper-parameters to set
 * (tp_trainer_set_hyperparam fails there);
 * tp_trainer_request_stop from it ends training after the step that is
 * running when the request arrives. Its before_run runs once at setup on
 * the trainer's thread: the names it asks for then are fetched for it
 * (and its before_run runs again beside each after_run). Scalars it puts
 * reach the trainer's own callbacks within a step. A failing hook stops
 * training at the next step boundary with its message. Training returns
 * only when every observer has run all of its hooks. tp_cb_observe
 * delivers every hook (the trainer waits only when the actor falls a full
 * queue behind); tp_cb_observe_latest skips a step's hooks while the actor
 * is behind, or sooner than interval_s after the last step it delivered
 * (an epoch's last step, and epoch and training hooks, always arrive). Takes cb. docs/callbacks.md. */
tp_callback_t *tp_cb_observe(tp_callback_t *cb);
tp_callback_t *tp_cb_observe_latest(tp_callback_t *cb, double interval_s);

/* ---- monitors ------------------------------------------------------------- */

/* JSONWriter: after every epoch, DIR/stats.json holds a list of objects,
 * one per epoch: {"epoch_num", "global_step", <every scalar>: latest}.
 * Written atomically (temporary file, fsync, rename); on resume the existing
 * records before starting_epoch are kept and later ones dropped. DIR is the
 * trainer's logdir. */
tp_callback_t *tp_cb_json_writer(void);
/* ScalarPrinter: logs every scalar at the end of each epoch. */
tp_callback_t *tp_cb_scalar_printer(void);
/* TFEventWriter: DIR/events.out.tfevents.<secs>.<hostname>, TensorBoard's
 * event file (TFRecord framing, masked CRC32C). Every scalar put goes in
 * as a simple_value at the global step it was put at; `hparams` (copied;
 * NULL: none) once as the text summary "hparams" before training. Written
 * after each epoch and at least every 2 s while scalars arrive; a killed
 * run leaves whole records and at most one partial tail. Chief only. */
tp_callback_t *tp_cb_tfevent_writer(const char *hparams);
/* StepWriter: DIR/steps.tsv, the per-step values of the comma-separated
 * fetches `names` ("cost,accuracy"), at most TP_STEP_POINTS_PER_EPOCH lines
 * per epoch (means over equal runs of steps), appended after each epoch
 * (towerpack/plot.h). Synchronous: it fetches. */
tp_callback_t *tp_cb_step_writer(const char *names);
/* CurvePlotter: redraws DIR/curves.png from stats.json and steps.tsv after
 * every epoch (tp_plot_stats); register it after JSONWriter, as an
 * observer (tp_cb_observe). A drawing that fails is a warning. */
tp_callback_t *tp_cb_curve_plotter(void);

/* ---- progress and time ------------------------------------------------------ */

/* ProgressBar: a live bar (steps, it/s, samples/s, ETA, the fetched
 * `names`, comma-separated, e.g. "loss,accuracy") on a terminal, redrawn at
 * most 10 times a second; on anything else one plain line every 10% of an
 * epoch. `stream` NULL means stderr. */
tp_callback_t *tp_cb_progress_bar(const char *names, void *stream);
/* ThroughputTracker: puts "throughput" (samples/s) and "steps_per_s" for
 * each epoch, counting step time only (not epoch-end callbacks). */
tp_callback_t *tp_cb_throughput(void);
/* The mean over each epoch's steps of the fetched `names` (comma-separated,
 * e.g. "cost,accuracy"), put as scalars of the same names after the epoch:
 * the training curves of stats.json. */
tp_callback_t *tp_cb_epoch_mean(const char *names);
/* StepScalars: every `every_n_steps` global steps, the mean of each fetched
 * name (comma-separated) over the steps since its last put, put as scalar
 * "<name>_step" (TensorBoard's curve between epochs; the launch adds it
 * with TrainConfig.log_every_n_steps). */
tp_callback_t *tp_cb_step_scalars(const char *names, int64_t every_n_steps);
/* EstimatedTimeLeft: logs the time left after each epoch (median epoch
 * time x epochs left). */
tp_callback_t *tp_cb_eta(void);
/* Report hooks that took longer than `threshold_s` at epoch end (by name,
 * slowest first) and put "callback_seconds" (their total). */
tp_callback_t *tp_cb_slow_callback_report(double threshold_s);
/* PeakMemoryTracker: after each epoch "memory/peak_rss_mb" (this process's
 * peak resident memory during the epoch, MB) and "memory/rss_mb" (at its
 * end). Host memory; a device's is not tracked yet. */
tp_callback_t *tp_cb_peak_memory(void);
/* GPUUtilizationTracker: on by default. Through NVML (libnvidia-ml.so.1,
 * loaded at run time; TP_NVML_LIBRARY overrides the path) samples each GPU
 * (CUDA_VISIBLE_DEVICES' indices, else all) every 200 ms of an epoch and
 * puts GPUUtil/<i> and GPUMemUtil/<i> (mean %) and GPUMem/<i>_peak_mb after
 * it. Without NVML or a GPU it logs "GPUUtilizationTracker: off: <why>"
 * once at before_train and puts nothing. */
tp_callback_t *tp_cb_gpu_utilization(void);

/* ---- language models --------------------------------------------------------- */

/* ProgressBar for a language model: as tp_cb_progress_bar, with tokens/s
 * (samples/s x tokens_per_sample, the context) instead of samples/s when
 * tokens_per_sample > 0. */
tp_callback_t *tp_cb_progress_bar_tokens(const char *names, void *stream,
                                         int64_t tokens_per_sample);
/* TokenThroughput: puts "tokens_per_s" (steps x samples per step x
 * tokens_per_sample over the epoch's step time, as ThroughputTracker counts
 * it) after each epoch. */
tp_callback_t *tp_cb_token_throughput(int64_t tokens_per_sample);
/* BitsPerByte: whenever the scalar `cost` (NULL: "validation_cost", a
 * cross-entropy in nats per token) is put, puts `out` (NULL:
 * "validation_bpb") = tp_bits_per_byte(value, bytes_per_token) at once, so
 * both reach stats.json in the same epoch. bytes_per_token <= 0 means 1
 * (bytes as tokens). */
tp_callback_t *tp_cb_bits_per_byte(const char *cost, const char *out,
                                   double bytes_per_token);
/* Bits per byte of a cross-entropy of `nats_per_token`:
 * nats / ln 2 / bytes_per_token (for bytes as tokens, bits per token). */
double tp_bits_per_byte(double nats_per_token, double bytes_per_token);

/* ---- guards ------------------------------------------------------------------ */

/* Stop training with TP_ERR_STATE and a message naming the value, step and
 * epoch when any of `names` (comma-separated, e.g. "loss") is NaN or Inf.
 * Checked every `every_k_steps` steps (1 = every step). */
tp_callback_t *tp_cb_check_numerics(const char *names, int64_t every_k_steps);
/* Stop (successfully) after `max_steps` global steps. */
tp_callback_t *tp_cb_stop_after(int64_t max_steps);

/* ---- hyper-parameters -------------------------------------------------------- */

typedef struct tp_hp_point {
    double at;      /* epoch (or global step when step_based) */
    double value;
} tp_hp_point_t;

/* ScheduledHyperParamSetter: each (ep, v) sets `param` to v after epoch ep
 * completes (ep 0: before the first epoch). With `interp_linear`, values
 * between points are interpolated. `step_based`: points are global steps.
 * On resume the value for the current point is restored before training. */
tp_callback_t *tp_cb_hp_schedule(const char *param, const tp_hp_point_t *points,
                                 size_t n, int interp_linear, int step_based);
/* HyperParamSetterWithFunc: before training and after each epoch,
 * param = fn(epoch_num, current value, arg). */
typedef double (*tp_hp_fn)(int64_t epoch_num, double current, void *arg);
tp_callback_t *tp_cb_hp_func(const char *param, tp_hp_fn fn, void *arg);
/* StatMonitorParamSetter: when scalar `stat` has not improved (decreased,
 * or increased when `reverse`) by more than `threshold` over the last
 * `last_k` epochs, param = fn(epoch, param); then wait last_k epochs. */
tp_callback_t *tp_cb_hp_stat_monitor(const char *param, const char *stat,
                                     tp_hp_fn fn, void *arg, double threshold,
                                     int last_k, int reverse);

/* ---- learning-rate schedules, as the common recipes ------------------------
 * A linear warm-up from base x warmup_from to base over the first `warmup`
 * steps (PyTorch's LinearLR(start_factor=warmup_from, total_iters=warmup)),
 * then:
 *   TP_LR_LINEAR  base down to base x end at step `total`, linearly
 *                 (LinearLR(1, end, total - warmup) after the warm-up);
 *   TP_LR_COSINE  base x end + base (1 - end) (1 + cos(pi (t - warmup) /
 *                 (total - warmup))) / 2 (CosineAnnealingLR(T_max = total -
 *                 warmup, eta_min = base x end) after the warm-up, as
 *                 SequentialLR chains them); base x end from `total` on;
 *   TP_LR_STEP    x gamma at each milestone (global steps, increasing),
 *                 counted from step 0, the warm-up's factor times it
 *                 (MultiStepLR(milestones, gamma) and the warm-up's LinearLR
 *                 in a ChainedScheduler).
 * Step t is the t-th step from 0 (its rate is the value at t); epochs are
 * steps_per_epoch steps each (an epoch schedule: 1 step per epoch). */
#define TP_LR_MAX_MILESTONES 16
typedef enum { TP_LR_LINEAR = 0, TP_LR_COSINE = 1, TP_LR_STEP = 2 } tp_lr_kind_t;
typedef struct tp_lr_schedule {
    tp_lr_kind_t kind;
    double base;         /* the rate after the warm-up (> 0) */
    double warmup_from;  /* the warm-up's first rate / base, in (0, 1] */
    double end;          /* linear, cosine: the rate at `total` / base, [0, 1] */
    double gamma;        /* step: the factor at each milestone, in (0, 1] */
    int64_t warmup;      /* steps of the warm-up (0: none); < total */
    int64_t total;       /* the schedule's length in steps (linear, cosine) */
    int64_t milestones[TP_LR_MAX_MILESTONES]; /* step: [nmilestones] */
    int nmilestones;
} tp_lr_schedule_t;
/* TP_ERR_INVALID naming the field when *s is not a schedule as above. */
tp_status_t tp_lr_schedule_check(const tp_lr_schedule_t *s);
/* The rate at step t (t >= 0) of a checked schedule. */
double tp_lr_schedule_at(const tp_lr_schedule_t *s, int64_t step);
/* A callback setting `param` to tp_lr_schedule_at(s, global step) before
 * every step (and before training, also on resume). *s is copied; NULL
 * with tp_last_error() for a schedule tp_lr_schedule_check refuses. */
tp_callback_t *tp_cb_lr_schedule(const char *param, const tp_lr_schedule_t *s);

#ifdef __cplusplus
}
#endif
#endif
