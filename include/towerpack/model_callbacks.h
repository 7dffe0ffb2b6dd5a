/* towerpack: callbacks that work on the trained model: checkpoints
 * (ModelSaver, MinSaver, MaxSaver) and validation (InferenceRunner with
 * ScalarStats and ClassificationError). They need a trainer whose ops give
 * the model (tp_trainer_model) and, for the savers, a log directory. */
#ifndef TOWERPACK_MODEL_CALLBACKS_H
#define TOWERPACK_MODEL_CALLBACKS_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/callback.h>
#include <towerpack/dataflow.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ModelSaver: after every epoch, LOGDIR/model-<global_step>.safetensors
 * (variables, optimizer slots, epoch and global step), written atomically,
 * and LOGDIR/checkpoint naming it. Keeps the newest `max_to_keep` (10 in
 * tensorpack) and, beyond those, one every `keep_every_n_hours` of training
 * (<= 0: none). Chief only. Its trigger_epoch only copies the state (a
 * snapshot); a thread of its own writes the file while training goes on
 * (docs/callbacks.md, "Where hooks run"). A failed write ends training at
 * the next step or epoch end, at the latest when training ends; training
 * returns once every checkpoint is on disk. */
tp_callback_t *tp_cb_model_saver(int max_to_keep, double keep_every_n_hours);

/* MinSaver / MaxSaver: after every epoch, when scalar `stat` reaches a new
 * minimum (maximum), save the model to LOGDIR/<filename> (default
 * "min-<stat>.safetensors" / "max-<stat>.safetensors"), snapshot and
 * writer actor as for ModelSaver. Chief only. */
tp_callback_t *tp_cb_min_saver(const char *stat, const char *filename);
tp_callback_t *tp_cb_max_saver(const char *stat, const char *filename);

/* SampleGrid: after every epoch, the model's output `output` on a fixed
 * batch of inputs (a generator's noise, a few test images) as one grid
 * image (tp_image_grid), written to LOGDIR/<prefix>-<epoch>.png and shown
 * to the monitors as image `tag` (TensorBoard's Images tab, through
 * tp_trainer_put_image). The output is float32 [N, C, H, W] (C 1 or 3) or
 * [N, H, W]; values in [lo, hi] become 0..255. It runs the model's
 * inference graph with the weights as they are: a model built with one
 * (validation data, or tp_train_config_t.infer_batch >= N). Chief only. */
typedef struct tp_sample_grid_opts {
    const char *output;              /* required: an output or node name */
    const char *const *input_names;  /* the inputs the output needs */
    const tp_tensor_t *inputs;       /* their fixed values, [N, ...]: copied */
    int ninputs;
    float lo, hi;                    /* default 0, 1 (a tanh output: -1, 1) */
    int columns;                     /* default 0: a square */
    const char *prefix;              /* default "samples"; "": no file */
    const char *tag;                 /* default: output */
} tp_sample_grid_opts_t;

void tp_sample_grid_opts_init(tp_sample_grid_opts_t *opts);
/* NULL with tp_last_error() when the options are wrong (no output, no
 * inputs, inputs of different row counts). */
tp_callback_t *tp_cb_sample_grid(const tp_sample_grid_opts_t *opts);

/* TextSample: after every epoch, a short continuation of a fixed prompt
 * drawn from the model as it is then, printed to the log (info) as one
 * line, "[TextSample] epoch E: <prompt and continuation>" (newlines, tabs,
 * backslashes and bytes outside printable ASCII escaped as in C), so a user
 * sees a language model learn. The drawing is the caller's: `generate`
 * (a GPT's, models/zoo_gpt_decode.c for tp-train --model gpt) writes the
 * prompt and `tokens` bytes after it into text; the same seed every epoch,
 * so two epochs' samples differ by the weights only. Chief only. */
typedef struct tp_text_sample_opts tp_text_sample_opts_t;
/* prompt[plen] the prompt's tokens (plen >= 1); ids holds plen + tokens:
 * the prompt, then the tokens drawn. */
typedef tp_status_t (*tp_text_sample_fn)(void *gen, tp_model_t *model,
                                         const tp_text_sample_opts_t *o,
                                         const int32_t *prompt, size_t plen, int32_t *ids);
struct tp_text_sample_opts {
    const char *prompt;       /* copied; NULL or "": a newline */
    long tokens;              /* tokens drawn after it, >= 1 */
    double temperature;       /* 0: the likeliest token each time */
    int top_k;                /* 0: all */
    uint64_t seed;
    /* the tokens: vocab NULL or "": bytes (id b is byte b); else GPT-2's
     * BPE, loaded here as tp_tokenizer_load(vocab, merges) does (merges
     * NULL or "": a .tiktoken vocab), which encodes the prompt and turns
     * the tokens drawn back into bytes for the log */
    const char *vocab, *merges;
    tp_text_sample_fn generate;       /* required */
    void *gen;                        /* its state: taken */
    void (*gen_destroy)(void *gen);   /* frees gen (NULL: not freed) */
};
/* NULL with tp_last_error() when the options are wrong (no generate, tokens
 * < 1, temperature < 0, top_k < 0); gen is freed then too. */
tp_callback_t *tp_cb_text_sample(const tp_text_sample_opts_t *opts);

/* The newest checkpoint in `logdir` into out[size]: the one LOGDIR/checkpoint
 * names if it exists, else the model-<N>.safetensors with the largest N.
 * Only regular files count (a FIFO named like a checkpoint is skipped).
 * TP_ERR_NOT_FOUND when there is none. */
tp_status_t tp_checkpoint_find_latest(const char *logdir, char *out,
                                      size_t size);
/* The model-<N>.safetensors of `logdir` with the largest N below the step
 * of `than` (a checkpoint's path), for falling back from a damaged one.
 * TP_ERR_NOT_FOUND when there is none. */
tp_status_t tp_checkpoint_find_older(const char *logdir, const char *than, char *out,
                                     size_t size);

/* What an InferenceRunner computes over a validation pass. */
typedef enum {
    TP_INFER_SCALAR_STATS = 0,       /* mean of an output over all its elements
                                        (a scalar or per-row), weighted by rows */
    TP_INFER_CLASSIFICATION_ERROR,   /* sum of a wrong-count output / rows */
    /* test-time augmentation by mirroring: the share of rows whose class
     * (the argmax of a float32 [rows, classes] logits output, summed over
     * the batch and the batch mirrored) is the label. Input 0 is mirrored
     * along its last axis (the width of [B,H,W] or [B,C,H,W] images); the
     * labels are the last input (int32 [rows]). The batch runs twice. */
    TP_INFER_FLIP_ACCURACY,
    /* FlipAccuracy with shifts as well: the logits of the batch and its
     * mirror (each counted twice) and of both shifted by one pixel up and
     * left and by one down and right (the pixels shifted in are zero, as a
     * padded crop's), six runs summed (airbench's multi-view weighting).
     * The images need a height axis: [B,H,W] or [B,C,H,W]. */
    TP_INFER_FLIP_SHIFT_ACCURACY,
} tp_inferencer_kind_t;

typedef struct tp_inferencer {
    tp_inferencer_kind_t kind;
    const char *output;   /* the model's output or metric name */
    /* the scalar's name; NULL: "validation_<output>" for ScalarStats,
     * "validation_error" for ClassificationError, "validation_flip_accuracy"
     * for FlipAccuracy, "validation_flip_shift_accuracy" for
     * FlipShiftAccuracy */
    const char *summary;
} tp_inferencer_t;

/* InferenceRunner: after every epoch, one pass of `df` (taken; batches with
 * the model's inputs as components, last one may be smaller) through the
 * model's inference graph, each inferencer's result put as a scalar. The
 * model must have been built with an inference graph (infer_batch > 0). */
tp_callback_t *tp_cb_inference_runner(tp_dataflow_t *df,
                                      const tp_inferencer_t *infs, size_t n);

#ifdef __cplusplus
}
#endif
#endif
