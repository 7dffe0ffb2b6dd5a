/* towerpack: the op graph a tower function builds, and the model that runs it.
 *
 * Define, then run. A model description names the inputs (dtype and shape,
 * dim 0 the free batch dimension), a tower function and an optimizer
 * factory. tp_model_new calls the tower function once per training tower
 * (and once more in inference mode when asked): it receives a tower context
 * and its input nodes, creates variables by scoped name, adds op nodes and
 * sets the cost. Tower 0 creates the variables; later towers and the
 * inference tower reuse them by name. Shapes are checked as nodes are added.
 * Then every buffer (values, gradients, workspaces, optimizer slots) is
 * planned and allocated once: a step allocates nothing.
 *
 * Builders return NULL on error and record the first error in the tower
 * (naming the node); a builder given a NULL input returns NULL quietly, so a
 * tower function can chain calls and check once at the end. */
#ifndef TOWERPACK_GRAPH_H
#define TOWERPACK_GRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/backend.h>
#include <towerpack/rng.h>
#include <towerpack/status.h>
#include <towerpack/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_tower tp_tower_t;
typedef struct tp_node tp_node_t;
typedef struct tp_model tp_model_t;
typedef struct tp_optimizer tp_optimizer_t;

/* ---- tower context ------------------------------------------------------ */

/* "tower0", "tower1", ..., "infer". */
const char *tp_tower_name(const tp_tower_t *t);
/* 0..N-1 for training towers, -1 for the inference tower. */
int tp_tower_index(const tp_tower_t *t);
/* The device the tower runs on (-1: CPU). */
int tp_tower_device(const tp_tower_t *t);
/* 1 in training towers, 0 in the inference tower. */
int tp_tower_is_training(const tp_tower_t *t);
/* The batch size the tower's buffers are planned for. */
int64_t tp_tower_batch(const tp_tower_t *t);
/* The first build error in this tower (TP_OK when none). */
tp_status_t tp_tower_status(const tp_tower_t *t);

/* Name scopes: names given to builders and variables get "scope/" prefixed.
 * Push returns TP_ERR_INVALID when scopes nest too deep. */
tp_status_t tp_tower_push_scope(tp_tower_t *t, const char *scope);
void tp_tower_pop_scope(tp_tower_t *t);

/* The single-cost contract: the scalar the optimizer minimises. */
tp_status_t tp_tower_set_cost(tp_tower_t *t, tp_node_t *cost);
/* A further named cost (several costs: GAN-like trainers alternate them).
 * A run naming it (tp_run_opts_t.cost) reaches, in backward, only the
 * trainable variables whose full names match the fnmatch pattern
 * `var_pattern` (NULL: all), and updates only those. "cost" names the main cost. A
 * tower with named costs may leave the main cost unset. */
tp_status_t tp_tower_add_cost(tp_tower_t *t, const char *name,
                              tp_node_t *cost, const char *var_pattern);
/* A named tensor readable after each step (tp_model_fetch). */
tp_status_t tp_tower_add_output(tp_tower_t *t, const char *name, tp_node_t *n);
/* A named scalar metric (also an output); listed by tp_model_metric_*. */
tp_status_t tp_tower_add_metric(tp_tower_t *t, const char *name, tp_node_t *n);

/* A node's full name, shape (dim 0 at the planned batch for batched nodes)
 * and dtype. */
const char *tp_node_name(const tp_node_t *n);
const tp_shape_t *tp_node_shape(const tp_node_t *n);
tp_dtype_t tp_node_dtype(const tp_node_t *n);

/* Reading a built graph (predictors, exporters). A node's kind, its
 * inputs (nodes earlier in the tower's list) and whether dim 0 is the
 * batch dimension. */
tp_op_kind_t tp_node_kind(const tp_node_t *n);
int tp_node_input_count(const tp_node_t *n);
tp_node_t *tp_node_input(const tp_node_t *n, int i);
int tp_node_batched(const tp_node_t *n);
/* Batch norm: the moving mean (i = 0) and variance (1) variable nodes;
 * NULL for other kinds. */
tp_node_t *tp_node_state(const tp_node_t *n, int i);
/* CONSTANT: its values (count of its shape, row-major); else NULL. */
const float *tp_node_constant_values(const tp_node_t *n);
/* INPUT: the index of its input description; else -1. */
int tp_node_input_index(const tp_node_t *n);

/* The static parameters of an op node, as the graph was built. */
typedef struct tp_node_attrs {
    int kernel[2];     /* conv kernel or pool window (h, w) */
    int stride[2];
    int pad[2];        /* each side */
    float alpha;       /* leaky slope, drop rate, scale, BN momentum */
    float eps;         /* batch norm */
    float beta;        /* clip: the upper bound (alpha: the lower) */
    int training;      /* 1: training semantics (batch norm, dropout) */
    tp_dtype_t in_dtype; /* cast: the input's dtype */
    int axes;          /* the reduce family: bit i set = input axis i */
    /* the shape family */
    int axis;                    /* concat */
    int64_t dims_a[TP_MAX_DIMS]; /* transpose: perm; slice: start; pad: before */
    int64_t dims_b[TP_MAX_DIMS]; /* slice: step; pad: after */
    /* the convolution family */
    int dilation[2];   /* conv2d, conv2d_transpose (h, w); 1: none */
    int groups;        /* conv2d, conv2d_transpose; 1: none */
    int output_pad[2]; /* conv2d_transpose (h, w) */
    int align_corners; /* upsample_bilinear */
    /* the linalg family: batch_matmul's transposed operands; layer norm's
     * trailing axes; group (and instance) norm's groups. eps above. */
    int trans_a, trans_b;
    int norm_axes;
    int norm_groups;
    int norm_absent;   /* the norms: bit 0 gamma NULL, bit 1 beta NULL */
    int heads;         /* attention: 0 q, k, v apart; H the packed qkv's heads */
} tp_node_attrs_t;
void tp_node_attrs(const tp_node_t *n, tp_node_attrs_t *out);

/* ---- variables ---------------------------------------------------------- */

typedef enum {
    TP_INIT_ZEROS = 0,
    TP_INIT_CONST,          /* value */
    TP_INIT_UNIFORM,        /* U(-value, value) */
    TP_INIT_NORMAL,         /* N(0, value^2) */
    TP_INIT_GLOROT_UNIFORM, /* U(-a, a), a = sqrt(6 / (fan_in + fan_out)) */
    TP_INIT_HE_NORMAL,      /* N(0, 2 / fan_in) */
} tp_init_kind_t;

typedef struct tp_init {
    tp_init_kind_t kind;
    float value;
} tp_init_t;

/* Collections: trainable (updated by the optimizer) or model-only (saved and
 * restored, never trained: batch-norm moving averages). */
typedef enum {
    TP_VAR_TRAINABLE = 0,
    TP_VAR_MODEL = 1,
} tp_var_collection_t;

/* Get or create float32 variable `name` (scoped). Tower 0 creates it and
 * draws its initial value from (model seed, hash of the full name); other
 * towers get the same variable and must ask with the same shape. Asking one
 * name twice in one tower is an error. */
tp_node_t *tp_variable(tp_tower_t *t, const char *name, int ndim,
                       const int64_t *shape, tp_init_t init,
                       tp_var_collection_t collection);

/* ---- ops ----------------------------------------------------------------
 * `name` may be NULL for an automatic one ("relu_7"); names are scoped and
 * unique within a tower. All float ops take and give float32. */

tp_node_t *tp_matmul(tp_tower_t *t, const char *name, tp_node_t *x,
                     tp_node_t *w);
tp_node_t *tp_conv2d_op(tp_tower_t *t, const char *name, tp_node_t *x,
                        tp_node_t *w, int stride, int pad);
tp_node_t *tp_bias_add(tp_tower_t *t, const char *name, tp_node_t *x,
                       tp_node_t *b);
tp_node_t *tp_relu(tp_tower_t *t, const char *name, tp_node_t *x);
tp_node_t *tp_leaky_relu(tp_tower_t *t, const char *name, tp_node_t *x,
                         float alpha);
tp_node_t *tp_tanh(tp_tower_t *t, const char *name, tp_node_t *x);
tp_node_t *tp_sigmoid(tp_tower_t *t, const char *name, tp_node_t *x);
tp_node_t *tp_max_pool(tp_tower_t *t, const char *name, tp_node_t *x,
                       int window, int stride, int pad);
tp_node_t *tp_avg_pool(tp_tower_t *t, const char *name, tp_node_t *x,
                       int window, int stride, int pad);
tp_node_t *tp_global_avg_pool(tp_tower_t *t, const char *name, tp_node_t *x);
/* Batch statistics in training towers, the moving averages in inference;
 * only tower 0 updates the moving averages (x momentum + batch x (1 -
 * momentum), unbiased variance). x is [N,C] or [N,C,H,W]. */
tp_node_t *tp_batch_norm_op(tp_tower_t *t, const char *name, tp_node_t *x,
                            tp_node_t *gamma, tp_node_t *beta,
                            tp_node_t *moving_mean, tp_node_t *moving_var,
                            float momentum, float eps);
/* Drops with probability `rate` and scales the rest by 1/(1-rate) when
 * training; identity in inference. Masks come from the tower's generator. */
tp_node_t *tp_dropout(tp_tower_t *t, const char *name, tp_node_t *x,
                      float rate);
/* [N, ...] -> [N, prod(...)]. */
tp_node_t *tp_flatten(tp_tower_t *t, const char *name, tp_node_t *x);
/* New shape; for a batched x, shape[0] must be -1 (the batch dim). One
 * other entry may be -1: it is inferred from the element count (as
 * PyTorch's view), and must divide it. */
tp_node_t *tp_reshape(tp_tower_t *t, const char *name, tp_node_t *x,
                      int ndim, const int64_t *shape);
/* ---- the elementwise family (docs/ops.md has one row per op) ----------
 * Binary ops broadcast as NumPy does: shapes align at their last dims, and
 * a dim of size 1 (or a missing leading dim) stretches to the other's. A
 * batched operand keeps the batch in dim 0 of the result, so it must have
 * the result's rank, and an unbatched operand of that rank must have 1 in
 * dim 0. The gradient of a stretched operand is summed over the dims it
 * was stretched along. */
tp_node_t *tp_add(tp_tower_t *t, const char *name, tp_node_t *a,
                  tp_node_t *b);
tp_node_t *tp_sub(tp_tower_t *t, const char *name, tp_node_t *a,
                  tp_node_t *b);
tp_node_t *tp_mul(tp_tower_t *t, const char *name, tp_node_t *a,
                  tp_node_t *b);
tp_node_t *tp_div(tp_tower_t *t, const char *name, tp_node_t *a,
                  tp_node_t *b);
/* Where a == b each side gets half the gradient (as PyTorch). */
tp_node_t *tp_maximum(tp_tower_t *t, const char *name, tp_node_t *a,
                      tp_node_t *b);
tp_node_t *tp_minimum(tp_tower_t *t, const char *name, tp_node_t *a,
                      tp_node_t *b);
/* Unary ops: the result has x's shape. abs's gradient at 0 is 0. */
tp_node_t *tp_neg(tp_tower_t *t, const char *name, tp_node_t *x);
tp_node_t *tp_abs(tp_tower_t *t, const char *name, tp_node_t *x);
tp_node_t *tp_square(tp_tower_t *t, const char *name, tp_node_t *x);
tp_node_t *tp_sqrt(tp_tower_t *t, const char *name, tp_node_t *x);
/* 1 / sqrt(x). */
tp_node_t *tp_rsqrt(tp_tower_t *t, const char *name, tp_node_t *x);
tp_node_t *tp_exp(tp_tower_t *t, const char *name, tp_node_t *x);
/* Natural logarithm (tp_log is the logging macro of log.h). */
tp_node_t *tp_ln(tp_tower_t *t, const char *name, tp_node_t *x);
/* x^exponent for a constant exponent. */
tp_node_t *tp_pow(tp_tower_t *t, const char *name, tp_node_t *x,
                  float exponent);
/* min(max(x, lo), hi), lo <= hi; the gradient passes where lo <= x <= hi. */
tp_node_t *tp_clip(tp_tower_t *t, const char *name, tp_node_t *x, float lo,
                   float hi);
/* GELU, x * Phi(x): exact (erf) with approximate 0, the tanh
 * approximation (PyTorch's approximate='tanh') with 1. */
tp_node_t *tp_gelu(tp_tower_t *t, const char *name, tp_node_t *x,
                   int approximate);
/* x * sigmoid(x). */
tp_node_t *tp_silu(tp_tower_t *t, const char *name, tp_node_t *x);
/* ln(1 + e^x), and x itself above 20 (PyTorch's threshold). */
tp_node_t *tp_softplus(tp_tower_t *t, const char *name, tp_node_t *x);

/* ---- constants and control of gradients ---------------------------------
 * A constant tensor: `values` (count of the shape, row-major) copied into
 * the graph; not batched, never trained, not in checkpoints. */
tp_node_t *tp_constant(tp_tower_t *t, const char *name, int ndim,
                       const int64_t *shape, const float *values);
/* A scalar constant (shape []): broadcasts against anything. */
tp_node_t *tp_scalar(tp_tower_t *t, const char *name, float value);
/* x unchanged forward; backward, no gradient flows through to x. */
tp_node_t *tp_stop_gradient(tp_tower_t *t, const char *name, tp_node_t *x);
/* Ask for the gradient of the tower's costs with respect to a float32
 * data input (one of the nodes the tower function received): saliency
 * maps, adversarial inputs. After a run with backward in a training tower,
 * tp_model_input_grad reads it. TP_ERR_INVALID for a node that is not a
 * float32 input. */
tp_status_t tp_tower_input_gradient(tp_tower_t *t, tp_node_t *input);
tp_node_t *tp_scale(tp_tower_t *t, const char *name, tp_node_t *x,
                    float factor);
/* Along dim 1 (channels); other dims must agree. */
tp_node_t *tp_concat(tp_tower_t *t, const char *name, int n,
                     tp_node_t *const *xs);
/* Mean softmax cross-entropy of logits [N,K] against int32 labels [N]. A
 * label outside [0,K) fails the step with an error naming the node. */
tp_node_t *tp_softmax_xent(tp_tower_t *t, const char *name,
                           tp_node_t *logits, tp_node_t *labels);
/* The same against labels smoothed by `smoothing` in [0,1): the target is
 * 1 - smoothing + smoothing/K at the label and smoothing/K elsewhere (as
 * PyTorch's cross_entropy(label_smoothing=...)); 0 is tp_softmax_xent. */
tp_node_t *tp_softmax_xent_smoothed(tp_tower_t *t, const char *name,
                                    tp_node_t *logits, tp_node_t *labels,
                                    float smoothing);
/* ---- the reduce family (docs/ops.md) ------------------------------------
 * Axes count from 0, or from the end when negative (-1: the last);
 * naxes 0 (axes NULL) means every axis. keepdims 1 keeps reduced axes as
 * size 1, 0 drops them. The result is batched when x is and its axis 0 is
 * not reduced. */
/* Sum over the axes (torch.sum(x, dims, keepdim)). */
tp_node_t *tp_reduce_sum(tp_tower_t *t, const char *name, tp_node_t *x,
                         int naxes, const int *axes, int keepdims);
/* Mean over the axes (torch.mean). */
tp_node_t *tp_reduce_mean(tp_tower_t *t, const char *name, tp_node_t *x,
                          int naxes, const int *axes, int keepdims);
/* Max over the axes (torch.amax): tied maxima share the gradient evenly. */
tp_node_t *tp_reduce_max(tp_tower_t *t, const char *name, tp_node_t *x,
                         int naxes, const int *axes, int keepdims);
/* Index of the first maximum along one axis, an int32 tensor (torch.argmax;
 * NaN counts as the maximum). No gradient. */
tp_node_t *tp_argmax(tp_tower_t *t, const char *name, tp_node_t *x, int axis,
                     int keepdims);
/* Softmax and log-softmax along one axis (any, not only the last). */
tp_node_t *tp_softmax(tp_tower_t *t, const char *name, tp_node_t *x, int axis);
tp_node_t *tp_log_softmax(tp_tower_t *t, const char *name, tp_node_t *x,
                          int axis);
/* Softmax cross-entropy over a sequence (or any leading dims): logits
 * float32 [..., V], labels int32 [...] -> the mean loss over the labels
 * that are not ignore_label (F.cross_entropy with ignore_index: -100 is
 * PyTorch's default; a class such as a padding token may be ignored too,
 * |ignore_label| <= 2^24). No label counted: NaN, as torch. A label
 * outside [0, V) and not ignored fails the run. */
tp_node_t *tp_softmax_xent_seq(tp_tower_t *t, const char *name,
                               tp_node_t *logits, tp_node_t *labels,
                               int ignore_label);
/* Fraction of rows of logits [N,K] whose int32 label [N] is among the k
 * largest logits: fewer than k logits strictly above the label's (a scalar,
 * no gradient; k = 1 is tp_accuracy but for ties, which count as hits). */
tp_node_t *tp_top_k_accuracy(tp_tower_t *t, const char *name, tp_node_t *logits,
                             tp_node_t *labels, int k);
/* ---- the loss family (docs/ops.md) --------------------------------------
 * Two float32 inputs of the same shape (no broadcasting) -> a scalar [],
 * the mean over every element (PyTorch's reduction='mean'). Gradients flow
 * to both inputs where the graph asks (a data-input target gets none). */
/* Mean squared error: mean (pred - target)^2 (PyTorch's mse_loss). */
tp_node_t *tp_mse(tp_tower_t *t, const char *name, tp_node_t *pred,
                  tp_node_t *target);
/* Mean absolute error: mean |pred - target| (l1_loss); gradient 0 where
 * they are equal. */
tp_node_t *tp_l1_loss(tp_tower_t *t, const char *name, tp_node_t *pred,
                      tp_node_t *target);
/* Huber (huber_loss): with d = pred - target, d^2/2 where |d| <= delta,
 * else delta (|d| - delta/2); delta > 0. */
tp_node_t *tp_huber_loss(tp_tower_t *t, const char *name, tp_node_t *pred,
                         tp_node_t *target, float delta);
/* Sigmoid cross-entropy with logits (binary_cross_entropy_with_logits),
 * binary or multi-label: labels are floats in [0,1] of the logits' shape.
 * Computed as max(x,0) - x z + ln(1 + e^-|x|), stable for any logit. */
tp_node_t *tp_sigmoid_xent(tp_tower_t *t, const char *name, tp_node_t *logits,
                           tp_node_t *labels);
/* ---- the shape family (docs/ops.md) -------------------------------------
 * transpose, slice, concat, split, pad and broadcast_to move float32 or
 * int32 values (token ids slice like activations); gradients flow for
 * float32. Axes may be negative (counted from the end, as Python's). A
 * batched input keeps its batch at dim 0: these ops never move, cut, pad
 * or stretch it, and say so naming the node when asked to. */
/* y.d[i] = x.d[perm[i]] (torch's permute); perm: x's rank entries, each
 * axis once; a batched x needs perm[0] = 0. */
tp_node_t *tp_transpose(tp_tower_t *t, const char *name, tp_node_t *x,
                        const int *perm);
/* stop past the end of an axis (TP_SLICE_END for "to the end"). */
#define TP_SLICE_END INT64_MAX
/* x[start[0]:stop[0]:step[0], ...] with Python's rules per axis: negative
 * start/stop count from the end, out-of-range ones clamp, step != 0 (a
 * negative step walks backwards; NULL: every step 1). start/stop/step have
 * x's rank entries. A batched x's dim 0 must be taken whole (0, END, 1). */
tp_node_t *tp_slice(tp_tower_t *t, const char *name, tp_node_t *x,
                    const int64_t *start, const int64_t *stop,
                    const int64_t *step);
/* Concatenation along `axis`; every other dim must agree, and the inputs
 * share a dtype and batching (a batched concat cannot be along dim 0).
 * tp_concat is this with axis 1. */
tp_node_t *tp_concat_axis(tp_tower_t *t, const char *name, int axis, int n,
                          tp_node_t *const *xs);
/* x cut along `axis` into `n` pieces of sizes[0..n-1] (summing to that
 * dim) written to out[0..n-1]: each piece is a slice node named
 * "<name>_<i>" (the graph's nodes have one output each). The tower's
 * status: TP_OK, or the error (named after the node). */
tp_status_t tp_split(tp_tower_t *t, const char *name, tp_node_t *x, int axis,
                     int n, const int64_t *sizes, tp_node_t **out);
/* x with before[i] and after[i] elements of `value` around each axis i
 * (both >= 0; x's rank entries; a batched x's dim 0 gets none). */
tp_node_t *tp_pad(tp_tower_t *t, const char *name, tp_node_t *x,
                  const int64_t *before, const int64_t *after, float value);
/* x stretched to `shape` by NumPy's rule (x's dims align at the end, each
 * equal or 1); the gradient sums over the stretched dims. A batched x
 * keeps its rank and shape[0] is -1 (the batch). */
tp_node_t *tp_broadcast_to(tp_tower_t *t, const char *name, tp_node_t *x,
                           int ndim, const int64_t *shape);
/* Rows of table (float32 [V, ...], not batched) picked by int32 indices of
 * any shape: [idx dims..., table dims 1..] (an embedding lookup). The
 * gradient scatter-adds into the table; an index outside [0, V) fails the
 * step naming the node, the index and V. */
tp_node_t *tp_gather_rows(tp_tower_t *t, const char *name, tp_node_t *table,
                          tp_node_t *indices);
/* int32 [...] -> float32 [..., depth]: 1 at the index, 0 elsewhere (no
 * gradient). An index outside [0, depth) fails the step naming the node. */
tp_node_t *tp_one_hot(tp_tower_t *t, const char *name, tp_node_t *indices,
                      int depth);
/* ---- the convolution family (docs/ops.md) ------------------------------
 * NCHW throughout. conv2d with dilation d (the kernel's taps d apart) and
 * g groups (input and output channels in g blocks, block i of the output
 * seeing block i of the input; g = C is depthwise): x [N,C,H,W], W
 * [O,C/g,KH,KW], b [O] or NULL -> [N,O,OH,OW], OH = (H + 2p - d(KH-1) - 1)
 * / s + 1, as PyTorch's Conv2d. tp_conv2d_op is this with d = g = 1. */
tp_node_t *tp_conv2d_ex(tp_tower_t *t, const char *name, tp_node_t *x,
                        tp_node_t *w, tp_node_t *b, int stride, int pad,
                        int dilation, int groups);
/* The transposed convolution (deconvolution), PyTorch's ConvTranspose2d:
 * the gradient of conv2d with respect to its input, as an op. x [N,C,H,W],
 * W [C,O/g,KH,KW] (input channels first), b [O] or NULL -> [N,O,OH,OW],
 * OH = (H-1) s - 2p + d(KH-1) + output_pad + 1; 0 <= output_pad < max(s, d). */
tp_node_t *tp_conv2d_transpose_op(tp_tower_t *t, const char *name,
                                  tp_node_t *x, tp_node_t *w, tp_node_t *b,
                                  int stride, int pad, int output_pad,
                                  int dilation, int groups);
/* Upsampling of [N,C,H,W] by an integer factor >= 1 -> [N,C,fH,fW].
 * Nearest: out[y][x] = in[y/f][x/f] (PyTorch's mode='nearest'). Bilinear
 * (mode='bilinear'): with align_corners 0, source coordinate (o + 0.5)/f -
 * 0.5 clamped at 0 (the half-pixel rule); with 1, o (H-1)/(fH-1). */
tp_node_t *tp_upsample_nearest(tp_tower_t *t, const char *name, tp_node_t *x,
                               int factor);
tp_node_t *tp_upsample_bilinear(tp_tower_t *t, const char *name, tp_node_t *x,
                                int factor, int align_corners);
/* Fraction of rows whose argmax equals the label (a scalar, no gradient). */
tp_node_t *tp_accuracy(tp_tower_t *t, const char *name, tp_node_t *logits,
                       tp_node_t *labels);
/* Number of rows whose argmax differs from the label (float scalar). */
tp_node_t *tp_error_count(tp_tower_t *t, const char *name,
                          tp_node_t *logits, tp_node_t *labels);
/* coeff * sum(w^2) / 2 over the trainable variables (created so far) whose
 * full names match the fnmatch pattern, e.g. "*\/W". No match is an error. */
tp_node_t *tp_l2_decay(tp_tower_t *t, const char *name, const char *pattern,
                       float coeff);
/* uint8 (or float32) -> float32, times `scale` (1/255 for images). */
tp_node_t *tp_cast(tp_tower_t *t, const char *name, tp_node_t *x,
                   float scale);

/* ---- layers: variables plus ops under a scope ----------------------------
 * tp_fc: scope/W [K,units] (Glorot uniform), scope/b [units] (zeros) when
 * `bias`; the output node is "scope/output". */
tp_node_t *tp_fc(tp_tower_t *t, const char *scope, tp_node_t *x, int units,
                 int bias);
/* NCHW convolution, square kernel: scope/W [filters,C,k,k] (He normal),
 * scope/b [filters] when `bias` (added inside the convolution kernel), one
 * node "scope/output". pad < 0 means "same" (k/2). */
tp_node_t *tp_conv2d(tp_tower_t *t, const char *scope, tp_node_t *x,
                     int filters, int kernel, int stride, int pad, int bias);
/* Transposed convolution layer, square kernel: scope/W [C,filters,k,k] (He
 * normal over fan-in filters*k*k, PyTorch's convention for this layout),
 * scope/b [filters] (zeros) when `bias`, one node "scope/output". */
tp_node_t *tp_conv2d_transpose(tp_tower_t *t, const char *scope, tp_node_t *x,
                               int filters, int kernel, int stride, int pad,
                               int output_pad, int bias);
/* scope/gamma (ones), scope/beta (zeros): trainable; scope/mean/EMA (zeros),
 * scope/variance/EMA (ones): model-only. Momentum 0.9, eps 1e-5. */
tp_node_t *tp_batch_norm(tp_tower_t *t, const char *scope, tp_node_t *x);

/* ---- the linalg family (docs/ops.md) -------------------------------------
 * Batched matrix products and the normalisations beside batch norm. */
/* a [...,M,K] @ b [...,K,N] -> [...,M,N] (torch.matmul): the leading
 * (batch) dims broadcast as NumPy's; trans_a 1 reads a stored as
 * [...,K,M], trans_b 1 reads b stored as [...,N,K]. A 1-d operand is
 * promoted as torch.matmul does: a [K] as [1,K], b [K] as [K,1], that dim
 * then dropped from the result ([K] @ [K] is a scalar); its transpose flag
 * is ignored, and it cannot be batched. A batched operand's batch lands in
 * dim 0 of the result (or is summed over when it is the contracted K of a
 * rank-2 operand). */
tp_node_t *tp_batch_matmul(tp_tower_t *t, const char *name, tp_node_t *a,
                           tp_node_t *b, int trans_a, int trans_b);
/* Layer norm over the last `axes` dims of x (F.layer_norm): each slice
 * (x - mean) / sqrt(var + eps) * gamma + beta, biased variance; gamma and
 * beta have the shape of those dims. The batch (dim 0) is never one of
 * them. In all three norms gamma, beta or both may be NULL (PyTorch's
 * elementwise_affine=False): no scale (1), no shift (0). */
tp_node_t *tp_layer_norm_op(tp_tower_t *t, const char *name, tp_node_t *x,
                            tp_node_t *gamma, tp_node_t *beta, int axes,
                            float eps);
/* Group norm (F.group_norm): x [N,C,...], C split in `groups` groups, each
 * (sample, group) normalised over its channels and positions; gamma, beta
 * [C]. */
tp_node_t *tp_group_norm_op(tp_tower_t *t, const char *name, tp_node_t *x,
                            tp_node_t *gamma, tp_node_t *beta, int groups,
                            float eps);
/* Instance norm (F.instance_norm with the input's statistics): x
 * [N,C,D1,...] (rank >= 3), each (sample, channel) normalised over its
 * positions; gamma, beta [C]. Group norm with C groups. */
tp_node_t *tp_instance_norm_op(tp_tower_t *t, const char *name, tp_node_t *x,
                               tp_node_t *gamma, tp_node_t *beta, float eps);
/* The layers: scope/gamma (ones) and scope/beta (zeros), trainable, of the
 * shape the op wants; eps 1e-5 (PyTorch's default). */
tp_node_t *tp_layer_norm(tp_tower_t *t, const char *scope, tp_node_t *x,
                         int axes);
tp_node_t *tp_group_norm(tp_tower_t *t, const char *scope, tp_node_t *x,
                         int groups);
tp_node_t *tp_instance_norm(tp_tower_t *t, const char *scope, tp_node_t *x);

/* ---- fused attention (docs/ops.md) ---------------------------------------
 * softmax(scale q k^T + mask) v in one op (F.scaled_dot_product_attention):
 * q [...,Tq,D], k and v [...,Tk,D] with the same leading dims (e.g.
 * [B,H,T,D]) -> [...,Tq,D]. causal 1 masks key j from query i when j > i
 * (needs Tq == Tk; is_causal=True). scale 0 means 1/sqrt(D). The kernels
 * work in tiles of queries x keys with an online softmax, keeping only each
 * row's log-sum-exp for the backward: the [Tq,Tk] scores are never stored
 * whole. */
tp_node_t *tp_attention(tp_tower_t *t, const char *name, tp_node_t *q,
                        tp_node_t *k, tp_node_t *v, int causal, float scale);
/* The same from the packed qkv [...,T,3C] of one projection (q, k and v
 * side by side in each row, each `heads` heads of D = C/heads, the
 * layout of x W_qkv) -> [...,T,C], the heads side by side again: what
 * tp_attention gives on the heads cut out as [...,H,T,D] and merged back,
 * the same numbers, without those copies (the kernels read and write the
 * heads where they lie, the gradient straight into qkv's). scale 0 means
 * 1/sqrt(D). */
tp_node_t *tp_attention_qkv(tp_tower_t *t, const char *name, tp_node_t *qkv, int heads,
                            int causal, float scale);

/* ---- models ------------------------------------------------------------- */

/* One model input. shape[0] is the batch dimension (its value is ignored);
 * the other dims are fixed. */
typedef struct tp_input_desc {
    const char *name;
    tp_dtype_t dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
} tp_input_desc_t;

/* Builds one replica: `inputs[i]` is the node of input description i. */
typedef tp_status_t (*tp_tower_fn)(tp_tower_t *t, tp_node_t *const *inputs,
                                   void *user);
/* Returns a new optimizer; the model takes it. */
typedef tp_optimizer_t *(*tp_optimizer_fn)(void *user);

/* The ModelDesc: inputs, tower function, optimizer factory. */
typedef struct tp_model_desc {
    const tp_input_desc_t *inputs;
    int ninputs;
    tp_tower_fn build;
    tp_optimizer_fn optimizer; /* NULL: an inference-only model */
    void *user;
} tp_model_desc_t;

/* Devices one model's towers may span (tp_model_config_t.devices). */
#define TP_MODEL_DEVICES_MAX 8

typedef struct tp_model_config {
    int towers;          /* training towers (0: inference only) */
    int64_t batch;       /* per-tower batch the buffers are planned for */
    int64_t infer_batch; /* > 0: also build an inference graph */
    uint64_t seed;       /* initializers and dropout */
    int threads;         /* CPU backend: OpenBLAS threads (0: its default) */
    int average;         /* all-reduce averages gradients (default 1) */
    tp_backend_t *backend; /* NULL: a CPU backend the model owns */
    int own_backend;     /* 1: the model takes `backend` (and `devices`):
                            destroyed with the model, or by tp_model_new
                            when it fails */
    /* Towers on several devices: ndevices > 1 backends, one per device
     * (`backend` then NULL or devices[0]; ndevices 1 is `backend`). Training tower i runs on
     * devices[i % ndevices], which holds a replica of every variable and
     * optimizer slot; the towers all-reduce their gradients, and each
     * replica applies the same update, so the replicas stay equal. Replica
     * 0 is the model's: the inference graph, tp_model_var, checkpoints
     * (a load writes every replica). Each tower runs from its own thread
     * (the replicated trainer, tp_towers); one thread reducing for every
     * tower (TP_ALL_TOWERS with TP_RUN_REDUCE) is refused. */
    tp_backend_t *devices[TP_MODEL_DEVICES_MAX];
    int ndevices;        /* 0 or 1: every tower on `backend` */
    int64_t bucket_bytes; /* towers > 1: the gradients all-reduced in
                            buckets of about this many bytes (whole
                            variables), each begun once the backward pass
                            has made its gradients final, beside the rest of
                            the pass; 0: one all-reduce after the backward
                            pass. Default -1: 25 MiB (as PyTorch's DDP) on
                            a device, 0 on the CPU (whose tower threads do
                            the sums themselves: nothing to overlap); a
                            backend without buckets reduces after the pass. */
    int graphs;          /* 1: a one-tower model records its training step
                            as a CUDA graph once a step at that batch ran
                            call by call, and replays it after (the CUDA
                            backend; ignored elsewhere). Default from
                            $TP_CUDA_GRAPHS (unset: 0). docs/cuda.md */
    int ahead;           /* 1: a one-tower model's training step returns
                            once the step before it is done, not itself,
                            so the host queues the next step while this
                            one runs (a backend that can: CUDA). Its
                            scalar outputs read through tp_model_view_host
                            and tp_model_metric_value are then the step
                            before's, and a bad label fails the step after
                            it; anything else that reads the model (its
                            variables, checkpoints, other runs) first waits
                            for every step. Default from $TP_CUDA_AHEAD
                            (unset: 0). docs/cuda.md */
    int fold;            /* 1: a bias add after a matmul, and a relu after
                            a matmul, convolution, batch norm, bias add or
                            add, run inside that op's call (one pass over
                            its output, one kernel on a GPU) where no
                            number changes; the value under a fold (the
                            product before the bias, the input of the
                            relu) is then not kept, and fetching or pruning
                            to it is TP_ERR_INVALID. Default from $TP_FOLD
                            (unset: 1; 0 turns it off). docs/compute.md */
} tp_model_config_t;

/* Defaults: 1 tower, batch 32, no inference graph, seed 0, threads 0,
 * averaging on, CPU backend, graphs as $TP_CUDA_GRAPHS says, ahead as
 * $TP_CUDA_AHEAD says. */
tp_model_config_t tp_model_config_default(void);

/* Build the towers and plan all memory. Caller owns; NULL on failure with
 * tp_last_error() naming the tower and node. */
tp_model_t *tp_model_new(const tp_model_desc_t *desc,
                         const tp_model_config_t *config);
void tp_model_destroy(tp_model_t **self_p);

int tp_model_tower_count(const tp_model_t *m);
/* The model's name ("cnn"), which checkpoints record (metadata "model",
 * with "inputs", the input descriptions), so a predictor finds the tower
 * function again. NULL until set; set copies it. */
tp_status_t tp_model_set_name(tp_model_t *m, const char *name);
const char *tp_model_name(const tp_model_t *m);
/* The backend of replica 0 (the inference graph's, checkpoints'). */
tp_backend_t *tp_model_backend(tp_model_t *m);
/* The backend tower `tower` (-1: the inference graph) runs on; NULL for
 * a tower out of range. */
tp_backend_t *tp_model_tower_backend(tp_model_t *m, int tower);
/* Devices (replicas of the variables) the towers span: 1 unless
 * config.ndevices > 1. */
int tp_model_device_count(const tp_model_t *m);
/* 1 when tower `tower`'s training step has been recorded as a graph
 * (config.graphs on a backend that records) and runs by replay at its
 * batch; 0 otherwise. */
int tp_model_graphed(const tp_model_t *m, int tower);
/* Nanoseconds the host has spent blocked on the device at the end of the
 * towers' training steps (summed over towers): near the steps' whole time
 * when the device's work bounds them, near zero when the host's does (or
 * on the CPU, whose steps end done). Read it between runs. */
uint64_t tp_model_device_wait_ns(const tp_model_t *m);
/* Wait for every step queued ahead (config.ahead) and report a failure
 * found in one (a bad label); TP_OK at once when none is. Reading the
 * model does this itself; a benchmark's clock needs it. */
tp_status_t tp_model_wait(tp_model_t *m);

/* ---- running a step ----------------------------------------------------- */

/* The stages of a step, in order. One run does a contiguous range of them:
 * TP_RUN_FORWARD to evaluate, TP_RUN_TRAIN for a whole training step, and
 * the shorter ranges for a trainer that runs towers on threads of their
 * own (compute.md, "Running a step"). A range that begins with
 * TP_RUN_BACKWARD differentiates the activations of the tower's last
 * forward (a second cost's gradients from one forward, as a GAN step);
 * TP_ERR_STATE when an update (or none) came after that forward. */
enum {
    TP_RUN_FORWARD = 1u << 0,  /* outputs and metrics, in the tower's mode */
    TP_RUN_BACKWARD = 1u << 1, /* gradients of opts->cost (training towers) */
    TP_RUN_REDUCE = 1u << 2,   /* the towers' gradients summed (the mean
                                  when averaging) */
    TP_RUN_UPDATE = 1u << 3,   /* the optimizer applies them to the shared
                                  variables */
    TP_RUN_GRADIENTS = TP_RUN_FORWARD | TP_RUN_BACKWARD,
    TP_RUN_TRAIN = TP_RUN_FORWARD | TP_RUN_BACKWARD | TP_RUN_REDUCE |
                   TP_RUN_UPDATE
};

/* The `tower` of a run over every training tower from the calling thread.
 * In a one-tower model tower 0 means the same. */
#define TP_ALL_TOWERS (-2)

/* What a run does. Zeroed (or a NULL pointer): a whole training step of
 * the main cost. */
typedef struct tp_run_opts {
    unsigned stages;  /* TP_RUN_* bits (0: TP_RUN_TRAIN) */
    const char *cost; /* NULL or "cost": the main cost; else a name given
                         to tp_tower_add_cost (backward and update reach
                         only that cost's variables) */
    uint64_t *stage_ns; /* NULL, or out [2]: nanoseconds of this run in
                           forward+backward ([0]) and in reduce+update
                           ([1]: waiting for the other towers included);
                           two more clock reads, for a tower's counters */
} tp_run_opts_t;

/* A fetch: in, the name of an output, metric or node of the run's tower
 * (tower 0 for TP_ALL_TOWERS); out, a borrowed view of its value with the
 * step's batch size, valid until the next step (as tp_model_fetch). */
typedef struct tp_fetch {
    const char *name;
    tp_tensor_t value;
} tp_fetch_t;

/* Run one step on `tower` (0..N-1, -1 the inference graph, TP_ALL_TOWERS):
 * the one way to run a model. feeds: with TP_RUN_FORWARD, one tensor per
 * input desc (for TP_ALL_TOWERS, tower i's at feeds[i * ninputs]), each
 * matching its desc in dtype and trailing dims, 1..planned batch rows, all
 * the same; they need not outlive the call (the CPU reads them in place,
 * devices copy them); without it, none. Fetch names are checked before
 * anything runs. Allocates nothing. What the stages mean for the tower:
 *   one tower i of several, on that tower's thread (towers run
 *   concurrently): TP_RUN_REDUCE joins the collective all-reduce (it returns
 *   when every tower has contributed; a run that fails releases the others
 *   with TP_ERR_INTERRUPTED, for good), TP_RUN_UPDATE then applies this
 *   tower's slice (1/N) of the update; after every tower has, a run of
 *   TP_RUN_UPDATE on TP_ALL_TOWERS closes the step.
 *   TP_ALL_TOWERS: forward and backward tower by tower, TP_RUN_REDUCE sums
 *   into tower 0, TP_RUN_UPDATE applies tower 0's gradients (a one-tower
 *   TP_RUN_TRAIN updates each variable as soon as its gradient is final).
 * Gradients are used once: reducing or updating without fresh ones is
 * TP_ERR_STATE. A bad option, feed count or name is TP_ERR_INVALID,
 * TP_ERR_SHAPE or TP_ERR_NOT_FOUND with a message naming it. */
tp_status_t tp_model_run(tp_model_t *m, int tower, const tp_tensor_t *feeds,
                         int nfeeds, tp_fetch_t *fetches, int nfetches,
                         const tp_run_opts_t *opts);

/* Draw noise into input `input` of `tower` (-1: inference) on the tower's
 * device, in place: rows x (the input's trailing dims) floats, row r being
 * row row0 + r of step `step`'s noise under `seed`, uniform in
 * [-scale, scale) (normal 0) or N(0, scale^2) (normal 1), the numbers of
 * tp_philox_noise_fill (towerpack/philox.h; tp_gan_noise_fill) to the bit
 * on every backend. *feed becomes the input's feed for that tower's next
 * runs (a view of its planned buffer, valid until the next fill; a run
 * given it copies nothing): the GAN trainers' z, never shipped through
 * the host->device copy. Call by call, between runs. TP_ERR_INVALID for
 * a bad tower or an input that is not float32; TP_ERR_SHAPE for rows
 * outside 1..the planned batch. */
tp_status_t tp_model_fill_noise(tp_model_t *m, int tower, int input, uint64_t seed,
                                int64_t step, int64_t row0, int64_t rows, int normal,
                                float scale, tp_tensor_t *feed);

/* The nodes of `tower` (-1: inference) in topological order; NULL for a
 * bad tower or index. */
int tp_model_node_count(const tp_model_t *m, int tower);
tp_node_t *tp_model_node(const tp_model_t *m, int tower, int i);
/* The named outputs and metrics of `tower` (tp_tower_add_output/metric),
 * in the order they were added. */
int tp_model_output_count(const tp_model_t *m, int tower);
const char *tp_model_output_name(const tp_model_t *m, int tower, int i);
/* The node an output, metric or node name of `tower` refers to, or NULL. */
tp_node_t *tp_model_lookup(const tp_model_t *m, int tower, const char *name);

/* Prune the inference graph (tower -1) to what the n named outputs or
 * nodes need: later forward runs compute only those nodes, and an input
 * none of them reads is neither checked nor read (feed an empty tensor,
 * tp_tensor_init_empty). n = 0 restores the whole graph. TP_ERR_NOT_FOUND
 * names an unknown name; on any error the graph is unchanged. */
tp_status_t tp_model_prune(tp_model_t *m, const char *const *names, int n);
/* Successful tp_model_prune calls so far: a borrower of the inference
 * graph (a predictor over a live model) sees whether someone pruned it
 * differently since it did. */
uint64_t tp_model_prune_serial(const tp_model_t *m);
/* 1 when the (possibly pruned) inference graph reads input i. */
int tp_model_input_needed(const tp_model_t *m, int i);
/* The model's input descriptions (a copy of its description's; names
 * point into the description), and the rows its inference graph was
 * planned for (0: none), for code handed a model it did not build (a
 * predictor over a trainer's live model). */
int tp_model_input_count(const tp_model_t *m);
const tp_input_desc_t *tp_model_input_desc(const tp_model_t *m, int i);
int64_t tp_model_infer_batch(const tp_model_t *m);

/* Costs of the training towers: "cost" first, then tp_tower_add_cost's. */
int tp_model_cost_count(const tp_model_t *m);
const char *tp_model_cost_name(const tp_model_t *m, int i);

/* A named output, metric or node of the last step of `tower` (-1:
 * inference) as a borrowed float/int view with the step's batch size; valid
 * until the next step. TP_ERR_NOT_FOUND for an unknown name. On the CPU an
 * input node (or a reshape of one) views the caller's input tensor, which
 * the step read in place. */
tp_status_t tp_model_fetch(tp_model_t *m, int tower, const char *name,
                           tp_tensor_t *view);
/* Host-readable data of a view this model gave out (tp_model_fetch, a
 * fetch's value, tp_model_var, tp_model_grad): views point to the backend's
 * memory, which is device memory on a GPU. On the CPU backend, the view's
 * own data (no copy); else its first `bytes` (at most the view's size)
 * copied through the backend into `host`, which must hold `bytes`. NULL,
 * with the error, on failure. Host code reads model values only this way. */
const void *tp_model_view_host(tp_model_t *m, const tp_tensor_t *view,
                               void *host, size_t bytes);
/* The mean over the first `towers` towers of the named fetch's first
 * float (a cost, a metric) from the last step, read through the backend:
 * what a trainer hands its callbacks. Returns how many towers gave a
 * float32 value (0: none, *mean untouched); leaves the error of a tower
 * that lacks the name set (the caller clears it where absence is fine). */
int tp_model_fetch_mean(tp_model_t *m, int towers, const char *name, double *mean);
/* Metrics declared by tower 0 (the inference tower declares its own). */
int tp_model_metric_count(const tp_model_t *m, int tower);
const char *tp_model_metric_name(const tp_model_t *m, int tower, int i);
/* The metric's scalar value from the last step. */
float tp_model_metric_value(const tp_model_t *m, int tower, int i);

/* Variables: count, and by index or name a borrowed view of the value. */
int tp_model_var_count(const tp_model_t *m);
const char *tp_model_var_name(const tp_model_t *m, int i);
int tp_model_var_trainable(const tp_model_t *m, int i);
tp_status_t tp_model_var(tp_model_t *m, const char *name, tp_tensor_t *view);
/* The gradient of the cost with respect to data input `name` in training
 * tower `tower` after its last run with backward (the step's batch in dim
 * 0), asked for by tp_tower_input_gradient; a borrowed view valid until
 * the next step. TP_ERR_NOT_FOUND for an input whose gradient was not
 * asked for. */
tp_status_t tp_model_input_grad(tp_model_t *m, int tower, const char *name,
                                tp_tensor_t *view);
/* The gradient of trainable variable `name` in `tower` after its last run. */
tp_status_t tp_model_grad(tp_model_t *m, int tower, const char *name,
                          tp_tensor_t *view);

/* Hyper-parameters of the optimizer by name ("learning_rate", "momentum",
 * "beta1", "beta2", "epsilon"); settable between steps. */
tp_status_t tp_model_set_hparam(tp_model_t *m, const char *name, double value);
tp_status_t tp_model_get_hparam(const tp_model_t *m, const char *name,
                                double *value);
tp_optimizer_t *tp_model_optimizer(tp_model_t *m);

/* A tower's dropout generator (checkpoints save and restore it). */
tp_rng_t *tp_model_tower_rng(tp_model_t *m, int tower);

/* Per-node timing, to find bottlenecks: with profiling on, every op's
 * forward and backward call is timed per node: the host's clock around
 * the call (on a device, that is the launch), and, on a backend with
 * timer marks (the CUDA backend's events; the CPU's clock, whose calls end
 * done), the device's time from before the call's work to after it. */
typedef struct tp_op_profile {
    const char *name;      /* the node's name (valid while the model lives) */
    tp_op_kind_t kind;
    uint64_t forward_ns;   /* the host's, summed since profiling was switched on */
    uint64_t backward_ns;
    uint64_t calls;        /* forward calls */
    uint64_t device_forward_ns;  /* the device's; 0 without timer marks */
    uint64_t device_backward_ns;
    int folds;             /* nodes folded into this op's calls (config
                              fold): their time is in this row, and they
                              have none of their own */
    double flops_forward;  /* floating-point operations of one forward call
                              at the last run's shapes (a multiply-add is
                              2); 0 for an op bound by memory, not
                              arithmetic (elementwise, shape, pool, norm) */
    double flops_backward; /* of one backward call: the gradients it makes */
    /* CPU time over the same calls, summed: the calling (tower) thread's,
     * and the whole process's (every thread: the op's OpenMP team, its
     * spin waits, and any other thread of the process). Thread time is
     * the step's critical path whatever the host's load; process time /
     * thread time near the thread count says the op ran on the team. */
    uint64_t thread_forward_ns, thread_backward_ns;
    uint64_t process_forward_ns, process_backward_ns;
} tp_op_profile_t;

/* Switch profiling on (1) or off (0); switching on clears the sums. While
 * it is on, training steps run call by call and synchronised (no CUDA
 * graph, nothing queued ahead), so that each call can be timed. */
void tp_model_set_profiling(tp_model_t *m, int on);
/* The device's time of tower `tower`'s profiled runs, from before their
 * first op call to after their last (the fused updates and fills between
 * calls included), summed; 0 on a backend without timer marks. */
uint64_t tp_model_profile_device_ns(const tp_model_t *m, int tower);
/* Fill up to `max` records for the op nodes of `tower` in graph order;
 * returns how many op nodes there are. */
int tp_model_profile(const tp_model_t *m, int tower, tp_op_profile_t *out,
                     int max);

/* Bytes the model planned: variables, gradients, activations, slots. */
size_t tp_model_memory(const tp_model_t *m);

#ifdef __cplusplus
}
#endif
#endif
