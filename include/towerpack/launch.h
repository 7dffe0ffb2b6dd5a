/* towerpack: launching training (this header was train.h): tensorpack's
 * TrainConfig, launch_train_with_config and the single-cost trainers. The
 * inputs it takes are in input.h (included here).
 *
 *   tp_train_config_t cfg;
 *   tp_train_config_init(&cfg);
 *   cfg.model = &my_model_desc;                  // inputs, tower fn, optimizer
 *   cfg.dataflow = tp_df_batch(tp_df_locally_shuffle(
 *       tp_df_fashion_mnist("train", 1), 10000, 1, 0), 128, 0);
 *   cfg.max_epoch = 10;
 *   tp_status_t rc = tp_launch_train_with_config(&cfg, NULL);
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
#include <towerpack/input.h>
#include <towerpack/logdir.h>
#include <towerpack/supervisor.h>

#ifdef __cplusplus
extern "C" {
#endif

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
                                      (unset: 0). On the CPU: 1 or 0 sets
                                      tp_backend_cpu_bf16 for the process
                                      (oneDNN's products on bf16 operands,
                                      fp32 sums); -1 leaves it as it is
                                      ($TP_CPU_BF16 unless set) */

    tp_callback_t **callbacks;     /* taken; user callbacks */
    size_t ncallbacks;
    tp_callback_t **monitors;      /* taken; after everything else */
    size_t nmonitors;
    int default_callbacks;         /* StepScalars (log_every_n_steps),
                                      epoch means of progress_names,
                                      ProgressBar, throughput, ETA, time
                                      report, CheckNumerics, JSONWriter,
                                      ScalarPrinter (default 1) */
    const char *progress_names;    /* fetched every step ("cost") */
    int64_t tokens_per_sample;     /* > 0: the data are text, each sample
                                      this many tokens (the context T):
                                      the progress bar shows tokens/s and
                                      stats.json gets tokens_per_s
                                      (TokenThroughput) and validation_bpb
                                      from validation_cost (BitsPerByte).
                                      Default 0: not text */
    double bytes_per_token;        /* with tokens_per_sample: the bytes a
                                      token stands for on average, for
                                      validation_bpb (default 0: 1, bytes
                                      as tokens) */
    int tensorboard;               /* with default_callbacks and a logdir:
                                      TFEventWriter next to JSONWriter
                                      (default 1) */
    int curves;                    /* with default_callbacks and a logdir:
                                      StepWriter (steps.tsv of
                                      progress_names) and CurvePlotter
                                      (curves.png every epoch) (default 1) */
    int plots;                     /* with curves: the CurvePlotter; 0
                                      keeps steps.tsv and draws no
                                      curves.png (default 1): for timing
                                      runs, where the drawing, on the
                                      callback actor beside the next
                                      epoch's first step, takes a core */
    int64_t log_every_n_steps;     /* with default_callbacks: the training
                                      scalars (progress_names and the
                                      towers' metrics, smoothed as the
                                      progress bar shows them) go to the
                                      monitors (TensorBoard, stats) every
                                      this many steps, besides the epoch's
                                      means (default 50, as Lightning's
                                      log_every_n_steps; 0: once an epoch
                                      only) */
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

    const struct tp_gan_config *gan; /* NULL; or a GAN (towerpack/gan.h):
                                      each step is the GAN trainer's
                                      (GANTrainer, SeparateGANTrainer) over
                                      the towers, its noise rows of
                                      `batch`; its seed is the noise's.
                                      One device, not distributed. Not
                                      taken. */

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
