/* towerpack: launching training (this header was train.h): the inputs,
 * tensorpack's TrainConfig, launch_train_with_config and the single-cost
 * trainers.
 *
 *   tp_train_config_t cfg;
 *   tp_train_config_init(&cfg);
 *   cfg.model = &my_model_desc;                  // inputs, tower fn, optimizer
 *   cfg.dataflow = batch(shuffle(fashion_mnist("train"), ...), 128);
 *   cfg.max_epoch = 10;
 *   tp_status_t rc = tp_launch_train_with_config(&cfg);
 *
 * Every tower takes its own batch from the input: the total batch is
 * batch x towers, as in tensorpack. */
#ifndef TOWERPACK_LAUNCH_H
#define TOWERPACK_LAUNCH_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/callback.h>
#include <towerpack/dataflow.h>
#include <towerpack/graph.h>
#include <towerpack/logdir.h>
#include <towerpack/supervisor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- input sources -------------------------------------------------------- */

typedef struct tp_input tp_input_t;
typedef struct tp_stats_row tp_stats_row_t;  /* towerpack/stats.h */

/* One number an input puts into stats.json after each epoch. */
#define TP_INPUT_SCALAR_NAME_MAX 48
typedef struct tp_input_scalar {
    char name[TP_INPUT_SCALAR_NAME_MAX];  /* "QueueInput/queue_fill" */
    double value;
} tp_input_scalar_t;

typedef struct tp_input_ops {
    const char *name;
    /* Prepare (seed the dataflow, start prefetching), first dropping `skip`
     * batches: a resumed run continues the data stream where the
     * checkpoint left it. */
    tp_status_t (*start)(void *impl, int towers, uint64_t seed, int64_t skip);
    /* The next batch for `tower` (caller owns). Passes wrap around: an
     * epoch is the trainer's period, not one pass of the data. */
    tp_status_t (*next)(void *impl, int tower, tp_datapoint_t **out);
    /* Batches per pass, or -1 when unknown. */
    int64_t (*size)(void *impl);
    /* Stop prefetching (may be NULL). */
    void (*stop)(void *impl);
    void (*destroy)(void *impl);
    /* Warn, naming what starves, when a tower waits longer than `seconds`
     * for a batch (0: never). May be NULL. */
    void (*set_watchdog)(void *impl, double seconds);
    /* Take back a batch from `next` that the caller is done with, to free
     * it off the caller's thread (any thread may call it). May be NULL:
     * the batch is destroyed on the caller's thread. */
    void (*release)(void *impl, int tower, tp_datapoint_t *dp);
    /* The rows this input contributes to the statistics the trainer
     * publishes for tp-top (its prefetch actor, its stages, its receiver):
     * at most `max` into `rows`, returns how many. An input that wraps
     * another passes on to it first and adds its own. Called between
     * steps on the trainer's thread: it must not wait for the input's
     * threads. May be NULL: no rows. */
    int (*stats)(void *impl, tp_stats_row_t *rows, int max);
    /* The same for the scalars that go into stats.json after each epoch.
     * May be NULL: none. */
    int (*scalars)(void *impl, tp_input_scalar_t *out, int max);
    /* The towers' backends, once the model is built (before the first
     * next): tower i's is backends[i % n] (n == 1: one for every tower;
     * towers on several devices: one each). An input that makes its
     * batches in the towers' memory (ResidentInput) moves there. May be
     * NULL: batches are host memory. */
    tp_status_t (*bind)(void *impl, tp_backend_t *const *backends, int n);
} tp_input_ops_t;

/* An input over `impl`; takes it. Caller owns. */
tp_input_t *tp_input_new(const tp_input_ops_t *ops, void *impl);
void tp_input_destroy(tp_input_t **self_p);
const char *tp_input_name(const tp_input_t *self);

/* Drive an input from a trainer's run_step (custom trainers): start it for
 * `towers` towers with the data seed (dropping `skip` batches first), take
 * the next batch of `tower` (caller owns it), ask its size (batches per
 * pass, -1: unknown). */
tp_status_t tp_input_start(tp_input_t *self, int towers, uint64_t seed,
                           int64_t skip);
tp_status_t tp_input_next(tp_input_t *self, int tower, tp_datapoint_t **out);
/* Give back a batch taken with tp_input_next once the step is done with it
 * (sets *dp_p to NULL). The same as tp_datapoint_destroy, except that an
 * input may free it on its own thread: QueueInput's prefetch actor does,
 * which keeps the allocator's work off the training thread. */
void tp_input_release(tp_input_t *self, int tower, tp_datapoint_t **dp_p);
int64_t tp_input_size(tp_input_t *self);
/* The step watchdog's period for this input (inputs without one ignore
 * it); inputs wrapping another pass it on. */
void tp_input_set_watchdog(tp_input_t *self, double seconds);
/* The input's statistics rows (its ops' stats entry): at most `max` rows,
 * returns how many (0 for an input without the entry). The trainer
 * publishes them with its own and the towers' rows. */
int tp_input_stats(tp_input_t *self, tp_stats_row_t *rows, int max);
/* The input's epoch scalars (its ops' scalars entry), as above. */
int tp_input_scalars(tp_input_t *self, tp_input_scalar_t *out, int max);
/* Tell the input the towers' backend (its ops' bind entry; TP_OK for an
 * input without one). The launch does, after building the model. An input
 * with a bind entry puts its batches in the towers' memory (ResidentInput
 * makes them there, StagingInput copies them there on a device). */
tp_status_t tp_input_bind(tp_input_t *self, tp_backend_t *backend);
/* The same for towers on several devices: tower i's backend is
 * backends[i % n] (tp_model_tower_backend). */
tp_status_t tp_input_bind_towers(tp_input_t *self, tp_backend_t *const *backends,
                                 int n);

/* ResidentInput: the whole data set in the towers' memory (device memory
 * on a GPU), made into augmented batches there; per step the host only
 * draws the picks (tp_backend_augment_batch, backend.h). One pass of `df`
 * (datapoints [image uint8 [h,w] or [h,w,c], label int32/int64]) is read
 * at start; its batches are [image float32 [batch, crop_h, crop_w(, c)],
 * label int32 [batch]]: each image padded by `pad` zeros, cropped at a
 * random place, mirrored with probability 1/2 when `flip`, normalised as
 * (v - mean) * (1 / std) (default 0 and 255: 0..1), the same chain as the
 * dataflow spec `augment crop=H,pad=P,flip`. A pass is a shuffled
 * permutation, the remainder dropped. Takes df. */
typedef struct tp_resident_opts {
    int64_t batch;       /* per tower (default 32) */
    int crop_h, crop_w;  /* 0: the image's own size */
    int pad;             /* zeros around each image before the crop */
    int flip;            /* 1: mirror left-right with probability 1/2 */
    int shuffle;         /* default 1 */
    int nstats;          /* 0: scale to 0..1; 1: one mean/std for every
                            channel; c: one per channel (at most 4) */
    float mean[4], std[4];
} tp_resident_opts_t;
void tp_resident_opts_init(tp_resident_opts_t *opts);
tp_input_t *tp_input_resident(tp_dataflow_t *df, const tp_resident_opts_t *opts);

/* FeedInput: batches straight from the dataflow on the trainer's thread,
 * synchronous (for debugging). Takes df. */
tp_input_t *tp_input_feed(tp_dataflow_t *df);

/* QueueInput: a prefetch actor runs the dataflow (taken) and keeps up to
 * `capacity` batches (0: 50) ready in a bounded inproc queue. The default
 * input for a dataflow. */
tp_input_t *tp_input_queue(tp_dataflow_t *df, int capacity);
/* The prefetch actor's counters (busy, blocked on a full queue; queue_fill:
 * batches ready in its queue over the capacity), as it last published them
 * (at most about 10 ms old; reading them never waits for the actor). A
 * StagingInput over a QueueInput answers for it. TP_ERR_INVALID for
 * another kind of input. tp_input_stats gives the same row. */
tp_status_t tp_input_queue_stats(tp_input_t *input, tp_stats_row_t *row);
/* Batches the trainer took from a QueueInput, and the seconds it waited for
 * them (0 for other inputs). */
uint64_t tp_input_queue_taken(tp_input_t *input);
/* Batches ready in the queue over its capacity, in [0, 1]; -1 for others. */
double tp_input_queue_fill(tp_input_t *input);
double tp_input_queue_waited_s(tp_input_t *input);
/* The implementation pointer, and the table it was made with (an input
 * that wraps another drives it through both). */
void *tp_input_impl(tp_input_t *self);
const tp_input_ops_t *tp_input_ops(const tp_input_t *self);

/* StagingInput: one staging actor (thread) per tower over `inner` (taken)
 * keeps `nr_stage` batches (0: 1; at most TP_STAGE_MAX) copied ahead into
 * the tower's own memory, so a step finds its batch in place while the
 * previous one computes. The stages take from `inner` in tower order:
 * batches per tower are the same as without staging. A batch handed out
 * borrows a slot until the datapoint is destroyed. The tower's memory:
 * `ops` when given; else, once bound to a device backend (tp_input_bind),
 * that backend's stages (pinned host buffers copied on its copy stream,
 * the copy done before a batch is handed over: the batch's data is then
 * device memory); else host memory. `inner` must give host batches (an
 * input with a bind entry is refused). The default on top of QueueInput
 * for more than one tower, and for towers on a GPU. */
#define TP_STAGE_MAX 8
typedef struct tp_stage_ops {
    /* The tower's memory for a staged component, and freeing it; NULL:
     * 64-byte aligned host memory. */
    void *(*alloc)(void *user, int tower, size_t bytes);
    void (*free)(void *user, int tower, void *ptr);
    /* Copy host `src` into tower memory `dst`, complete on return (a device
     * issues it on the tower's copy stream and waits); NULL: memcpy. */
    tp_status_t (*copy)(void *user, int tower, void *dst, const void *src,
                        size_t bytes);
    void *user;
} tp_stage_ops_t;
tp_input_t *tp_input_staging(tp_input_t *inner, int nr_stage,
                             const tp_stage_ops_t *ops);
/* The input a StagingInput stages (NULL for another kind). */
tp_input_t *tp_input_staging_inner(tp_input_t *input);
/* A stage's counters: batches staged (msgs_out), seconds copying (busy_s),
 * waiting for the inner input or a free slot (starved_s), staged slots
 * over nr_stage (queue_fill). */
tp_status_t tp_input_staging_stats(tp_input_t *input, int tower,
                                   tp_stats_row_t *row);
/* Seconds tower `tower` waited for its staged batch. */
double tp_input_staging_waited_s(tp_input_t *input, int tower);

/* ZMQInput: whole batches from tp-worker processes or other senders of the
 * wire format, received on a PULL socket at `endpoints` (RemoteDataZMQ's
 * syntax: comma-separated, '@' binds, '>' connects, else opts->bind) and
 * decoded on the trainer's thread without a prefetch actor. A malformed
 * message is counted and dropped. opts NULL: defaults (bind, hwm 50, no
 * timeout; signals end a wait). Size -1: set steps_per_epoch. NULL with
 * tp_last_error() on a bad endpoint list. */
typedef struct tp_remote_opts tp_remote_opts_t;
tp_input_t *tp_input_zmq(const char *endpoints, const tp_remote_opts_t *opts);
/* Batches received, messages dropped as malformed, seconds the trainer
 * waited for data (0 for another kind of input). */
uint64_t tp_input_zmq_received(tp_input_t *input);
uint64_t tp_input_zmq_malformed(tp_input_t *input);
double tp_input_zmq_waited_s(tp_input_t *input);

/* DummyConstantInput: one random batch per tower, built once from the
 * model's input descriptions and returned again and again (copies): the
 * speed of light of the step. `label_classes` bounds int inputs. */
tp_input_t *tp_input_dummy(const tp_model_desc_t *model, int64_t batch,
                           int label_classes, uint64_t seed);

/* ---- trainers ---------------------------------------------------------------- */

typedef enum {
    TP_TRAINER_SIMPLE = 0,            /* one tower */
    TP_TRAINER_REPLICATED = 1,        /* SyncMultiGPUTrainerReplicated */
    TP_TRAINER_PARAMETER_SERVER = 2,  /* SyncMultiGPUTrainerParameterServer */
} tp_trainer_kind_t;

/* An actor of your own in the training tree (tp_train_config_t.actors): a
 * reader that feeds a ZMQInput, an exporter of metrics, a sidecar. */
typedef struct tp_train_actor {
    const tp_actor_def_t *def;     /* borrowed for the whole run, with arg:
                                      a restart reuses both */
    void *arg;
    tp_restart_policy_t policy;    /* {0}: its failure ends training */
} tp_train_actor_t;

typedef struct tp_train_config {
    const tp_model_desc_t *model;  /* required */
    tp_dataflow_t *dataflow;       /* taken: the default input (QueueInput) */
    tp_input_t *input;             /* taken: instead of dataflow */
    tp_trainer_kind_t trainer;     /* default: SIMPLE for 1 tower, else REPLICATED */
    int towers;                    /* default 1 */
    int64_t batch;                 /* per tower; default 32 */
    uint64_t seed;                 /* default 1 */
    int threads;                   /* BLAS threads (0: backend default) */
    int device;                    /* -1 (default): the towers run on the
                                      CPU; N: every tower on CUDA device N
                                      (the backend is made after the input
                                      has started, so dataflow workers are
                                      forked before CUDA is loaded) */
    int devices[TP_MODEL_DEVICES_MAX]; /* ndevices > 1: the towers on these
                                      CUDA devices instead of `device`,
                                      tower i on devices[i], one each
                                      (towers == ndevices; the replicated
                                      trainer; each device holds a replica
                                      of the variables, the gradients
                                      all-reduced by NCCL) */
    int ndevices;
    int tf32;                      /* with device >= 0: 1 lets cuBLAS and
                                      cuDNN use TF32 tensor cores, 0 keeps
                                      exact fp32; -1 (default): as
                                      $TP_CUDA_TF32 says (unset: 0) */
    int bf16;                      /* with a device: 1 computes the fp32
                                      products (fully connected layers) on
                                      bf16 tensor cores (tp_cuda_options_t);
                                      -1 (default): as $TP_CUDA_BF16 says
                                      (unset: 0) */

    tp_callback_t **callbacks;     /* taken; user callbacks */
    size_t ncallbacks;
    tp_callback_t **monitors;      /* taken; after everything else */
    size_t nmonitors;
    int default_callbacks;         /* epoch means of progress_names,
                                      ProgressBar, throughput, ETA, time
                                      report, CheckNumerics, JSONWriter,
                                      ScalarPrinter (default 1) */
    const char *progress_names;    /* fetched every step ("cost") */
    int tensorboard;               /* with default_callbacks and a logdir:
                                      TFEventWriter next to JSONWriter
                                      (default 1) */
    int curves;                    /* with default_callbacks and a logdir:
                                      StepWriter (steps.tsv of
                                      progress_names) and CurvePlotter
                                      (curves.png every epoch) (default 1) */
    const char *hparams;           /* the run's hyper-parameters as text
                                      (key=value lines), written once to
                                      the event file as "hparams"; NULL:
                                      none. Not taken. */

    tp_dataflow_t *validation;     /* taken: InferenceRunner (ScalarStats of
                                      every metric) on it */
    int64_t infer_batch;           /* > 0: build an inference graph of this
                                      batch (default: batch with validation) */

    const char *model_name;        /* NULL, or the model's name: every
                                      checkpoint records it (metadata
                                      "model"), so tp-predict and tp-export
                                      find the tower function. Not taken. */
    const char *session_init;      /* load these weights before training */
    const char *logdir;            /* where checkpoints and stats go. Locked
                                      for the run (another process on it
                                      is refused, naming its pid) and
                                      prepared by logdir_action before
                                      anything is written (logdir.h) */
    tp_logdir_action_t logdir_action; /* when logdir exists and holds a
                                      run: TP_LOGDIR_ASK (default: KEEP
                                      with auto_resume; otherwise a
                                      question on a terminal, an error
                                      when stdin is not one), KEEP,
                                      DELETE, BACKUP or NEW (DIR-1, ...) */
    int auto_resume;               /* resume from logdir's latest checkpoint
                                      (none there: a warning, and training
                                      starts from scratch) */
    int save_checkpoints;          /* ModelSaver (default 1 with a logdir) */

    const tp_train_actor_t *actors; /* children of the training's
                                      supervisor, started in this order after
                                      the input has started: rows in tp-top,
                                      restarts under their policy (stats.json:
                                      supervisor/restarts), a failure beyond
                                      it ends training at the next step
                                      boundary (at once while a step waits
                                      for data); stopped after after_train.
                                      Not taken. */
    size_t nactors;
    const char *stats;             /* publish actor statistics for tp-top:
                                      NULL: ipc://LOGDIR/stats.sock with a
                                      logdir; "off"; "tcp", "tcp:PORT" or an
                                      endpoint (see stats.h) */

    int64_t starting_epoch;        /* default 1 */
    int64_t steps_per_epoch;       /* default: the input's size */
    int64_t max_epoch;             /* required */
    double watchdog_s;             /* report a step (towers) or a wait for
                                      input longer than this, naming the
                                      tower or input (default 10; <= 0: off) */

    const struct tp_train_dist *dist; /* data-parallel over processes
                                         (tp_dist_configure in dist.h);
                                         NULL: this process alone. Not
                                         taken. */
} tp_train_config_t;

/* The launch's hooks for data-parallel training over processes (filled by
 * tp_dist_configure, towerpack/dist.h). Rank 0 is the chief. */
typedef struct tp_train_dist {
    int rank, size;
    void *ctx;
    /* Rank 0's resume point to every rank: the global step of the
     * checkpoint it resumes from (-1: none) and the starting epoch. */
    tp_status_t (*agree_start)(void *ctx, int64_t *resume_step,
                               int64_t *starting_epoch);
    /* Rank 0's variables and optimizer state to every rank, once the model
     * is built (and rank 0 has loaded its checkpoint). */
    tp_status_t (*sync_model)(void *ctx, tp_model_t *m, uint64_t seed,
                              int64_t resume_step);
    /* Every step, after this rank's towers reduced onto tower 0 and before
     * the update: tower 0's gradients := their mean over the ranks. */
    tp_status_t (*allreduce_grads)(void *ctx, tp_model_t *m, int64_t step);
} tp_train_dist_t;

void tp_train_config_init(tp_train_config_t *cfg);
/* Free what the config still owns (after a launch it owns nothing). */
void tp_train_config_fini(tp_train_config_t *cfg);

/* Build the model and the trainer, register the callbacks in tensorpack's
 * order (trainer callbacks, user callbacks, default callbacks, monitors),
 * and train. Takes everything the config owns. When `out_model` is not
 * NULL the trained model is handed to the caller (who destroys it). */
tp_status_t tp_launch_train_with_config(tp_train_config_t *cfg,
                                        tp_model_t **out_model);

#ifdef __cplusplus
}
#endif
#endif
