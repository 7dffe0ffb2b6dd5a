/* towerpack: optimizers (SGD with momentum, Adam, AdamW) over flat parameter
 * arenas, and the gradient processing they carry (clipping by global norm).
 *
 * An optimizer updates all trainable variables at once: the model lays them
 * out in one buffer, their gradients in a buffer of the same layout, and the
 * optimizer's slots (momentum; Adam's first and second moments) likewise.
 * Hyper-parameters are read by name at every update, so a schedule sets them
 * between steps.
 *
 * Gradient processing belongs to the optimizer, as tensorpack's gradient
 * processors wrap its optimizer: a model that owns the optimizer reads
 * "clip_norm" at every update and scales all the step's gradients first. */
#ifndef TOWERPACK_OPTIM_H
#define TOWERPACK_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/backend.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_optimizer tp_optimizer_t;

/* The constructors below return NULL with tp_last_error() saying why:
 * a hyper-parameter out of range (naming the kind and its values), or no
 * memory for the optimizer. */

/* SGD: v = momentum * v + g; w -= lr * v (Nesterov: w -= lr * (g +
 * momentum * v)). momentum 0 keeps no slot. With "weight_decay" C > 0
 * (tp_optimizer_set; momentum > 0, no Nesterov) g is g + C w first:
 * torch.optim.SGD's coupled L2 decay, per variable times its decay
 * multiplier (tp_optimizer_add_decay_mult). Caller owns. */
tp_optimizer_t *tp_optimizer_sgd(double lr, double momentum, int nesterov);
/* Adam with bias correction. Caller owns. */
tp_optimizer_t *tp_optimizer_adam(double lr, double beta1, double beta2,
                                  double eps);
/* AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW): Adam whose
 * weight decay is decoupled from the gradient: w *= 1 - lr * weight_decay,
 * then Adam's step. Every trainable variable decays (as torch's with one
 * parameter group). weight_decay 0 is Adam. Caller owns. */
tp_optimizer_t *tp_optimizer_adamw(double lr, double beta1, double beta2,
                                   double eps, double weight_decay);
void tp_optimizer_destroy(tp_optimizer_t **self_p);

/* "sgd", "adam" or "adamw". */
const char *tp_optimizer_kind(const tp_optimizer_t *o);

/* Set or read a hyper-parameter: "learning_rate" (all), "momentum" (sgd),
 * "beta1", "beta2", "epsilon" (adam, adamw), "weight_decay" (adamw; sgd:
 * coupled, needs momentum > 0 and no Nesterov), and
 * for every kind:
 *  - "clip_norm" (0, the default, is off): the model scales all the step's
 *    gradients by min(1, clip_norm / global norm), the norm over every
 *    trainable variable's all-reduced gradient (tensorpack's
 *    GlobalNormClip, torch.nn.utils.clip_grad_norm_);
 *  - "ema_decay" d in [0, 1) (0, the default, is off): the model keeps an
 *    exponential moving average of every trainable variable, ema = d x ema
 *    + (1 - d) x w after each update, starting from the initial weights
 *    (timm's ModelEmaV2). It must be set before the model is built (in the
 *    optimizer factory), which plans the averages' memory: a shadow
 *    model-only variable "optimizer/<var>/ema" per trainable variable,
 *    saved and resumed with the checkpoint as the optimizer's slots are
 *    (and skipped by a weights-only load). tp_model_use_ema puts the
 *    averages in the weights' place for validation or export;
 *  - "accumulate" K, an integer >= 1 (1, the default, is off): gradient
 *    accumulation. A training step (one batch per tower, what a trainer's
 *    global step counts and a schedule sees) adds its all-reduced
 *    gradients to a sum; every K-th step updates with their mean (clipped,
 *    then averaged into the EMA), so the optimizer's step (Adam's bias
 *    correction) counts updates, one per K steps. Set it in the factory
 *    (the model plans the sum, "optimizer/<var>/accum", and the count of
 *    steps in it, "optimizer/accumulated", which checkpoints keep: a
 *    resume mid-sum is exact). Not with named costs.
 * TP_ERR_NOT_FOUND names the known ones. */
tp_status_t tp_optimizer_set(tp_optimizer_t *o, const char *name, double v);
tp_status_t tp_optimizer_get(const tp_optimizer_t *o, const char *name,
                             double *v);

/* Slots per parameter (0, 1 or 2) and their names ("momentum", "m", "v"). */
int tp_optimizer_slot_count(const tp_optimizer_t *o);
const char *tp_optimizer_slot_name(const tp_optimizer_t *o, int i);

/* The global-norm clip in force (0: none): tp_optimizer_get's "clip_norm". */
double tp_optimizer_clip_norm(const tp_optimizer_t *o);
/* The weights' average's decay (0: none): tp_optimizer_get's "ema_decay". */
double tp_optimizer_ema_decay(const tp_optimizer_t *o);
/* Steps per update (1: every step): tp_optimizer_get's "accumulate". */
int tp_optimizer_accumulate(const tp_optimizer_t *o);

/* The model's EMA (ema_decay above) in the place of its trainable
 * variables (on 1) or its own weights back (on 0), in the model's own
 * copy (device 0: inference graph, tp_model_var, export, checkpoints):
 * between two steps, e.g. around validation or before an ONNX export.
 * Training must not run while it is on (a step then fails, saying so).
 * TP_ERR_STATE when the model keeps no average; on 1 twice is a no-op. */
typedef struct tp_model tp_model_t;
tp_status_t tp_model_use_ema(tp_model_t *m, int on);
/* 1 while tp_model_use_ema put the average in place. */
int tp_model_ema_in_use(const tp_model_t *m);

/* Per-pattern learning-rate multipliers (PyTorch's parameter groups by
 * name; tensorpack's ScaleGradient on the update): a trainable variable
 * whose name matches `pattern` (fnmatch, as tp_l2_decay's patterns) is
 * updated with learning_rate x mult (AdamW's decay too, as a
 * torch group's); the first pattern that matches wins, no match is 1.
 * mult 0 freezes: set it before the model is built (in the optimizer
 * factory), and the model builds those variables as not trainable: no
 * gradient is computed for them, they get no slots and no update, and
 * checkpoints keep them as plain variables. At most 16 patterns. */
tp_status_t tp_optimizer_add_lr_mult(tp_optimizer_t *o, const char *pattern,
                                     double mult);
/* The multiplier of variable `name` (1 when no pattern matches it), and
 * how many patterns there are. */
double tp_optimizer_lr_mult(const tp_optimizer_t *o, const char *name);
int tp_optimizer_lr_mult_count(const tp_optimizer_t *o);
/* Which pattern decides variable `name`'s multiplier: the index of the
 * first that matches, -1 when none does; and pattern i (0..count-1,
 * owned by o; NULL outside). For checks and messages. */
int tp_optimizer_lr_mult_index(const tp_optimizer_t *o, const char *name);
const char *tp_optimizer_lr_mult_pattern(const tp_optimizer_t *o, int i);

/* Per-pattern weight-decay multipliers, AdamW and SGD (torch's parameter
 * groups with their own weight_decay; nanoGPT decays matrices and
 * embeddings, not biases or layer norms: "*\/b" 0): a trainable variable
 * whose name matches `pattern` (fnmatch) decays at weight_decay x mult
 * (times its learning-rate multiplier's rate); the first pattern that
 * matches wins, no match is 1. At most 16 patterns. TP_ERR_INVALID on
 * Adam. */
tp_status_t tp_optimizer_add_decay_mult(tp_optimizer_t *o, const char *pattern,
                                        double mult);
/* The decay multiplier of variable `name` (1 when no pattern matches),
 * and how many patterns there are. */
double tp_optimizer_decay_mult(const tp_optimizer_t *o, const char *name);
int tp_optimizer_decay_mult_count(const tp_optimizer_t *o);

/* Updates applied so far (Adam's bias correction uses it; checkpoints keep
 * it). */
int64_t tp_optimizer_step(const tp_optimizer_t *o);
void tp_optimizer_set_step(tp_optimizer_t *o, int64_t step);

/* One update of n parameters with backend b; slots[i] has n floats. */
tp_status_t tp_optimizer_apply(tp_optimizer_t *o, tp_backend_t *b,
                               tp_stream_t *s, float *param,
                               const float *grad, float *const *slots,
                               size_t n);

/* Update elements [offset, offset + n) of the same buffers as part of the
 * current step without advancing the step counter: a model updates each
 * variable as soon as its gradient is final, while it is still in cache.
 * tp_optimizer_end_step then counts the step. */
tp_status_t tp_optimizer_update(tp_optimizer_t *o, tp_backend_t *b,
                                tp_stream_t *s, float *param,
                                const float *grad, float *const *slots,
                                size_t offset, size_t n);
void tp_optimizer_end_step(tp_optimizer_t *o);
/* tp_optimizer_update with the learning rate times lr_mult (a variable's
 * multiplier; 1.0 is tp_optimizer_update exactly). */
tp_status_t tp_optimizer_update_scaled(tp_optimizer_t *o, tp_backend_t *b,
                                       tp_stream_t *s, float *param,
                                       const float *grad, float *const *slots,
                                       size_t offset, size_t n, double lr_mult);
/* The same with the weight decay times decay_mult too (a variable's
 * tp_optimizer_decay_mult; 1.0 is tp_optimizer_update_scaled exactly). */
tp_status_t tp_optimizer_update_group(tp_optimizer_t *o, tp_backend_t *b,
                                      tp_stream_t *s, float *param,
                                      const float *grad, float *const *slots,
                                      size_t offset, size_t n, double lr_mult,
                                      double decay_mult);

#ifdef __cplusplus
}
#endif
#endif
