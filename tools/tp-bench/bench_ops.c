/* tp-bench ops: each graph op's forward+backward time against PyTorch's,
 * in the same run, on shapes from the example models.
 *
 *   tp-bench ops [--op PATTERN[,PATTERN...]] [--seconds S] [--rounds R]
 *                [--quick] [--threads T] [--no-torch] [--python PY]
 *                [--peer SCRIPT] [--list] [--json] [--cpu-time] [--device N]
 *
 * The benchmark is a table of rows (s_rows below): an op, a builder that
 * applies it to the row's inputs, the inputs' kinds and shapes, up to six
 * numeric attributes, and the example model the shapes come from. A new
 * op is one row here and one entry in the PyTorch peer's OPS table
 * (bench/peers/torch_ops.py) under the same `op` key.
 *
 * towerpack's side: one model per row (CPU backend, fold off so the op is
 * its own call; folds on in conv2d/enc2_nhwc, whose transpose the conv
 * reads NHWC itself: s_row_folds, "folds" in --json), whose tower applies
 * the op to data inputs (gradients asked with tp_tower_input_gradient)
 * and variables (trainable), and, when the op's output is not a scalar,
 * an MSE head against half of its own stopped value (so a non-zero
 * gradient flows back). The op's time is its node's forward plus
 * backward from the model's profiler, per step: the head, the update and
 * the engine around the op are not in it.
 *
 * PyTorch's side: the peer (one python3 process for the whole run, on two
 * pipes) builds the same inputs (requires_grad as here), and times
 * `y = op(inputs); y.backward(g)` (g fixed; a scalar's backward takes
 * none) in eager mode, with torch.set_num_threads(1) and (2); the table's
 * torch column is the better of the two. Its time holds eager mode's
 * dispatch and autograd bookkeeping, which are PyTorch's real cost per op,
 * a few microseconds: for the smallest ops that is part of the difference.
 *
 * Each side runs a row for about S seconds (--seconds, default 1) in R
 * rounds (--rounds, default 3) that alternate the sides (towerpack, torch
 * at 1 thread, at 2), so that both see the same load on a shared machine;
 * a round is two warm-up steps, then one op per step for S/R seconds (at
 * least 10 steps), and gives its median step; each side's figure is the
 * median of its rounds'. --quick is one round of 0.05 s (at least 3 steps),
 * a smoke test. The ratio is towerpack over torch: below 1 is
 * faster than PyTorch. The exit status is 0 whatever the ratios (a
 * benchmark, not a test); 1 when a row fails to build or run.
 *
 * --cpu-time: the *_step rows are timed in process CPU time on both sides
 * (CLOCK_PROCESS_CPUTIME_ID here; in the peer its thread's time at 1
 * thread, as a 2-thread round leaves OpenMP workers spinning, else its
 * process's), not
 * wall time: on a shared host whose load makes each side wait for a core
 * most of a step, the work itself. Meaningful at one thread (--threads 1
 * against PyTorch's 1-thread column): at two, it counts both threads,
 * and their spin-waits. Op rows keep the profiler's wall time.
 *
 * --device N: the same table on a GPU (docs/cuda.md). One CUDA backend on
 * device N serves every row's model, the inputs copied once into its
 * memory; an op row's figure is the device's time of its calls (the
 * profiler's CUDA events around each call, profiling running the step
 * call by call and synchronised), a step row's the wall time of the step
 * until tp_model_wait says the device is done. The peer runs on cuda:N
 * (torch_ops.py --device N): events around an op row's forward and
 * backward after torch.cuda.synchronize(), wall time between synchronize()s
 * around a step row; one request a round (threads do not matter there).
 * TF32 is $TP_CUDA_TF32's on both sides. A row whose kernel the CUDA
 * backend lacks (a run failing TP_ERR_UNSUPPORTED) is listed as "not on
 * CUDA", torch's time beside it. No device answering (no driver, no GPU, a
 * build without the CUDA module) is one line on stderr and exit 77, as
 * tp-bench cuda's "skipped"; CUDA is asked in a forked probe, so that the
 * peer's fork still comes before this process loads it. */
#include <fnmatch.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include "tools/tp-bench/bench_median.h"

#define MAX_IN 9 /* the autoencoder's step: images and 8 weights */
#define MAX_ATTR 6
#define MAX_ROWS 128
#define MAX_ROUNDS 16

/* One input of a row. Kinds: 'x' data input, values in [-1,1], gradient
 * asked; 'p' the same in [0.5,1.5] (sqrt, log, a divisor); 't' a data
 * input in [0,1] without gradient (a loss's target); 'l' int32 labels in
 * [0, K), K the row's attr[5] if set, else the last dim of input 0; 'w' a
 * trainable variable (no batch dim: its
 * shape is whole). Data inputs share dim 0, the batch. */
typedef struct {
    char kind;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
} bench_in_t;

typedef struct bench_row bench_row_t;
/* Applies the row's op to `in` (one node per input, in order); the node it
 * returns is the one timed. */
typedef tp_node_t *(*bench_build_fn)(tp_tower_t *t, tp_node_t *const *in,
                                     const bench_row_t *r);

struct bench_row {
    const char *name;      /* unique label of the row (--op matches it) */
    const char *op;        /* the key of the peer's OPS table */
    const char *from;      /* the example model the shapes come from */
    bench_build_fn build;
    double attr[MAX_ATTR]; /* the op's numbers (each builder says which) */
    int nin;
    bench_in_t in[MAX_IN];
};

/* A row named "*_step" is a whole model: its builder returns the model's
 * cost, and the figure is its whole training step (forward, backward, SGD
 * update, folds as by default) against PyTorch's forward, backward and the
 * same update. */
static int s_is_step(const bench_row_t *r) {
    size_t n = strlen(r->name);
    return n > 5 && !strcmp(r->name + n - 5, "_step");
}

/* ---- builders: one per op, reading the row's attributes -------------------- */

#define UNARY(fn) \
    static tp_node_t *s_##fn(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) { \
        (void)r;                                                                          \
        return tp_##fn(t, "op", in[0]);                                                   \
    }
#define BINARY(fn) \
    static tp_node_t *s_##fn(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) { \
        (void)r;                                                                          \
        return tp_##fn(t, "op", in[0], in[1]);                                            \
    }
UNARY(relu)
UNARY(tanh)
UNARY(sigmoid)
UNARY(neg)
UNARY(abs)
UNARY(square)
UNARY(sqrt)
UNARY(rsqrt)
UNARY(exp)
UNARY(ln)
UNARY(silu)
UNARY(softplus)
UNARY(global_avg_pool)
BINARY(add)
BINARY(sub)
BINARY(mul)
BINARY(div)
BINARY(maximum)
BINARY(minimum)
BINARY(bias_add)
BINARY(matmul)
BINARY(mse)
BINARY(l1_loss)
BINARY(sigmoid_xent)
BINARY(softmax_xent)
#undef UNARY
#undef BINARY

/* attr[0]: alpha */
static tp_node_t *s_leaky_relu(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_leaky_relu(t, "op", in[0], (float)r->attr[0]);
}
/* attr[0]: factor */
static tp_node_t *s_scale(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_scale(t, "op", in[0], (float)r->attr[0]);
}
/* attr[0]: exponent */
static tp_node_t *s_pow(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_pow(t, "op", in[0], (float)r->attr[0]);
}
/* attr[0], attr[1]: lo, hi */
static tp_node_t *s_clip(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_clip(t, "op", in[0], (float)r->attr[0], (float)r->attr[1]);
}
/* attr[0]: 1 for the tanh approximation */
static tp_node_t *s_gelu(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_gelu(t, "op", in[0], (int)r->attr[0]);
}
/* attr[0]: delta */
static tp_node_t *s_huber_loss(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_huber_loss(t, "op", in[0], in[1], (float)r->attr[0]);
}
/* attr[0], attr[1]: stride, pad (no bias: the layer's bias is a separate
 * add on the torch side too) */
static tp_node_t *s_conv2d(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_conv2d_op(t, "op", in[0], in[1], (int)r->attr[0], (int)r->attr[1]);
}
/* attr[0], attr[1], attr[2]: window, stride, pad */
static tp_node_t *s_max_pool(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_max_pool(t, "op", in[0], (int)r->attr[0], (int)r->attr[1], (int)r->attr[2]);
}
static tp_node_t *s_avg_pool(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_avg_pool(t, "op", in[0], (int)r->attr[0], (int)r->attr[1], (int)r->attr[2]);
}
/* training mode (batch statistics), the layer's defaults: momentum 0.9
 * (PyTorch's 0.1), eps 1e-5; gamma, beta, the moving averages are the
 * layer's variables */
static tp_node_t *s_batch_norm(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return tp_batch_norm(t, "op", in[0]);
}
/* along dim 1 */
static tp_node_t *s_concat(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_concat(t, "op", r->nin, in);
}

/* ---- the op families that landed after the first table ----------------- */

/* attr[0], attr[1]: stride, pad (no bias, output padding 0) */
static tp_node_t *s_deconv(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_conv2d_transpose_op(t, "op", in[0], in[1], NULL, (int)r->attr[0],
                                  (int)r->attr[1], 0, 1, 1);
}
/* attr[0]: the factor */
static tp_node_t *s_up_nearest(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_upsample_nearest(t, "op", in[0], (int)r->attr[0]);
}
static tp_node_t *s_up_bilinear(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_upsample_bilinear(t, "op", in[0], (int)r->attr[0], 0);
}
/* NCHW -> NHWC */
static tp_node_t *s_to_nhwc(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    static const int perm[4] = {0, 2, 3, 1};
    return tp_transpose(t, "op", in[0], perm);
}
/* NHWC -> NCHW: an NHWC input as a convolution reads it */
static tp_node_t *s_to_nchw(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    static const int perm[4] = {0, 3, 1, 2};
    return tp_transpose(t, "op", in[0], perm);
}
/* conv2d on an NHWC input: the graph folds the transpose into the
 * convolution where the backend reads NHWC (docs/ops.md, "An NHWC
 * input"; TP_NHWC_FOLD=0 runs it as its own op), so its row plans folds
 * (s_row_folds): a model fed NHWC images runs it so, and PyTorch's side
 * copies nothing either (channels_last) */
static tp_node_t *s_conv2d_nhwc(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    static const int perm[4] = {0, 3, 1, 2};
    tp_node_t *x = tp_transpose(t, "nchw", in[0], perm);
    return tp_conv2d_op(t, "op", x, in[1], (int)r->attr[0], (int)r->attr[1]);
}
/* over the spatial axes (2, 3), dropped */
static tp_node_t *s_sum_hw(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    static const int axes[2] = {2, 3};
    return tp_reduce_sum(t, "op", in[0], 2, axes, 0);
}
static tp_node_t *s_mean_hw(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    static const int axes[2] = {2, 3};
    return tp_reduce_mean(t, "op", in[0], 2, axes, 0);
}
/* along the last axis */
static tp_node_t *s_softmax(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return tp_softmax(t, "op", in[0], -1);
}
static tp_node_t *s_log_softmax(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return tp_log_softmax(t, "op", in[0], -1);
}
/* q k^T: both [B,T,D], the second read transposed */
static tp_node_t *s_qk(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return tp_batch_matmul(t, "op", in[0], in[1], 0, 1);
}
/* over the last axis; gamma, beta variables; eps 1e-5 */
static tp_node_t *s_layer_norm(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return tp_layer_norm_op(t, "op", in[0], in[1], in[2], 1, 1e-5f);
}
/* attr[0]: groups */
static tp_node_t *s_group_norm(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    return tp_group_norm_op(t, "op", in[0], in[1], in[2], (int)r->attr[0], 1e-5f);
}
/* a table [V, D] (variable) by int32 ids [B, T] */
static tp_node_t *s_gather(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return tp_gather_rows(t, "op", in[1], in[0]);
}
/* logits [B,T,V], labels [B,T]; nothing ignored */
static tp_node_t *s_xent_seq(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return tp_softmax_xent_seq(t, "op", in[0], in[1], -100);
}

/* fused causal attention, q, k, v [B,H,T,D], scale 1/sqrt(D) */
static tp_node_t *s_attention(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return tp_attention(t, "op", in[0], in[1], in[2], 1, 0.0f);
}

/* Step rows around attention: the mean square of its output, with the
 * fused op, or with the decomposed form the GPT used before it (q k^T,
 * scale, a constant causal mask of -1e9 above the diagonal, softmax,
 * x v), to compare the two in the same run. */
static tp_node_t *s_att_cost(tp_tower_t *t, tp_node_t *y) {
    return tp_reduce_mean(t, "op", tp_square(t, NULL, y), 0, NULL, 0);
}
static tp_node_t *s_attention_step(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    return s_att_cost(t, tp_attention(t, NULL, in[0], in[1], in[2], 1, 0.0f));
}
static tp_node_t *s_attention_decomposed_step(tp_tower_t *t, tp_node_t *const *in,
                                              const bench_row_t *r) {
    (void)r;
    const tp_shape_t *qs = tp_node_shape(in[0]);
    const int64_t T = qs->d[2], D = qs->d[3];
    float *m = malloc((size_t)(T * T) * sizeof *m);
    if (!m)
        return NULL;
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            m[i * T + j] = j > i ? -1e9f : 0.0f;
    const int64_t ms[2] = {T, T};
    tp_node_t *mask = tp_constant(t, "mask", 2, ms, m);
    free(m);
    tp_node_t *s = tp_scale(t, NULL, tp_batch_matmul(t, NULL, in[0], in[1], 0, 1),
                            1.0f / sqrtf((float)D));
    tp_node_t *p = tp_softmax(t, NULL, tp_add(t, NULL, s, mask), -1);
    return s_att_cost(t, tp_batch_matmul(t, NULL, p, in[2], 0, 0));
}

/* A whole model for a step row: examples/mlp.c's MLP 784-512-256-10 on
 * inputs x [B,784], labels [B], and its weights and biases as 'w' inputs
 * 2..7, to softmax cross-entropy. */
static tp_node_t *s_mlp_step(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    tp_node_t *h = tp_relu(t, NULL, tp_bias_add(t, NULL, tp_matmul(t, NULL, in[0], in[2]), in[3]));
    h = tp_relu(t, NULL, tp_bias_add(t, NULL, tp_matmul(t, NULL, h, in[4]), in[5]));
    tp_node_t *logits = tp_bias_add(t, NULL, tp_matmul(t, NULL, h, in[6]), in[7]);
    return tp_softmax_xent(t, "op", logits, in[1]);
}

/* examples/autoencoder.c's model on images x [B,1,28,28] in [0,1], its
 * weights and biases as 'w' inputs 1..8 (enc0, enc1 convs 3x3 stride 2 pad
 * 1; dec0, dec1 conv-transposes 4x4 stride 2 pad 1, biases inside the
 * kernels as the example's layers add them), to the MSE of its sigmoid
 * reconstruction against x. */
static tp_node_t *s_ae_step(tp_tower_t *t, tp_node_t *const *in, const bench_row_t *r) {
    (void)r;
    tp_node_t *h = tp_relu(t, NULL, tp_conv2d_ex(t, NULL, in[0], in[1], in[2], 2, 1, 1, 1));
    h = tp_relu(t, NULL, tp_conv2d_ex(t, NULL, h, in[3], in[4], 2, 1, 1, 1));
    h = tp_relu(t, NULL, tp_conv2d_transpose_op(t, NULL, h, in[5], in[6], 2, 1, 0, 1, 1));
    tp_node_t *y = tp_sigmoid(t, NULL, tp_conv2d_transpose_op(t, NULL, h, in[7], in[8],
                                                              2, 1, 0, 1, 1));
    return tp_mse(t, "op", y, in[0]);
}

/* ---- the rows ----------------------------------------------------------- */

/* Shapes (batch 128, as the examples train):
 *   autoencoder (issue 42's model): [128,1,28,28] images and
 *     reconstructions, [128,16,14,14] and [128,32,7,7] activations;
 *   mlp (examples/mlp.c): [128,784] x [784,512], [128,512] x [512,256];
 *   cnn-bn (examples/cnn_bn.c): conv0's [128,32,28,28] before its pool,
 *     conv1 32->64 on [128,32,14,14];
 *   resnet (examples/resnet.c): [128,128,7,7] into global average pooling;
 *   classifiers: [128,10] logits, [128,1000] for ImageNet's classes;
 *   transformer (issue 45's small GPT): [16,64,128] activations, 64
 *     tokens of 256 byte values, 4 heads' scores as [32,64,32] products,
 *     an embedding table of 10000 rows. */
#define AE16 {'x', 4, {128, 16, 14, 14}}
#define AE16P {'p', 4, {128, 16, 14, 14}}
#define IMG {'x', 4, {128, 1, 28, 28}}
#define IMGT {'t', 4, {128, 1, 28, 28}}
#define CNN32 {'x', 4, {128, 32, 28, 28}}
#define AE "autoencoder"
#define U(nm, fn, ...) {nm, nm, AE, s_##fn, {__VA_ARGS__}, 1, {AE16}}
#define B(nm, fn) {nm, nm, AE, s_##fn, {0}, 2, {AE16, AE16}}

static const bench_row_t s_rows[] = {
    /* the elementwise family: binary ops on two activations */
    B("add", add),
    B("sub", sub),
    B("mul", mul),
    {"div", "div", AE, s_div, {0}, 2, {AE16, AE16P}},
    B("maximum", maximum),
    B("minimum", minimum),
    /* broadcasting: a per-channel [1,16,1,1] variable */
    {"add_bcast", "add", AE, s_add, {0}, 2, {AE16, {'w', 4, {1, 16, 1, 1}}}},
    {"bias_add", "bias_add", AE, s_bias_add, {0}, 2, {AE16, {'w', 1, {16}}}},
    /* unary ops and activations */
    U("neg", neg, 0),
    U("abs", abs, 0),
    U("square", square, 0),
    {"sqrt", "sqrt", AE, s_sqrt, {0}, 1, {AE16P}},
    {"rsqrt", "rsqrt", AE, s_rsqrt, {0}, 1, {AE16P}},
    U("exp", exp, 0),
    {"log", "log", AE, s_ln, {0}, 1, {AE16P}},
    {"pow", "pow", AE, s_pow, {1.5}, 1, {AE16P}},
    U("clip", clip, -0.5, 0.5),
    U("scale", scale, 0.5),
    U("relu", relu, 0),
    U("leaky_relu", leaky_relu, 0.2),
    U("sigmoid", sigmoid, 0),
    U("tanh", tanh, 0),
    U("gelu", gelu, 0),
    {"gelu_tanh", "gelu", AE, s_gelu, {1}, 1, {AE16}},
    U("silu", silu, 0),
    U("softplus", softplus, 0),
    /* shape: concat along channels */
    {"concat", "concat", AE, s_concat, {0}, 2, {AE16, AE16}},
    /* the loss family on the autoencoder's output; softmax cross-entropy
     * on a classifier's logits */
    {"mse", "mse", AE, s_mse, {0}, 2, {IMG, IMGT}},
    {"l1_loss", "l1_loss", AE, s_l1_loss, {0}, 2, {IMG, IMGT}},
    {"huber_loss", "huber_loss", AE, s_huber_loss, {1.0}, 2, {IMG, IMGT}},
    {"sigmoid_xent", "sigmoid_xent", AE, s_sigmoid_xent, {0}, 2, {IMG, IMGT}},
    {"softmax_xent", "softmax_xent", "mlp", s_softmax_xent, {0}, 2,
     {{'x', 2, {128, 10}}, {'l', 1, {128}}}},
    /* matmul: the MLP's first two layers */
    {"matmul/mlp0", "matmul", "mlp", s_matmul, {0}, 2,
     {{'x', 2, {128, 784}}, {'w', 2, {784, 512}}}},
    {"matmul/mlp1", "matmul", "mlp", s_matmul, {0}, 2,
     {{'x', 2, {128, 512}}, {'w', 2, {512, 256}}}},
    /* conv2d: the autoencoder's encoder (3x3, stride 2, pad 1), cnn-bn's
     * second convolution (3x3, stride 1, pad 1) */
    {"conv2d/enc1", "conv2d", AE, s_conv2d, {2, 1}, 2, {IMG, {'w', 4, {16, 1, 3, 3}}}},
    {"conv2d/enc2", "conv2d", AE, s_conv2d, {2, 1}, 2, {AE16, {'w', 4, {32, 16, 3, 3}}}},
    {"conv2d/cnn1", "conv2d", "cnn-bn", s_conv2d, {1, 1}, 2,
     {{'x', 4, {128, 32, 14, 14}}, {'w', 4, {64, 32, 3, 3}}}},
    /* normalisation */
    {"batch_norm", "batch_norm", "cnn-bn", s_batch_norm, {0}, 1, {CNN32}},
    /* pools */
    {"max_pool", "max_pool", "cnn-bn", s_max_pool, {2, 2, 0}, 1, {CNN32}},
    {"avg_pool", "avg_pool", "cnn-bn", s_avg_pool, {2, 2, 0}, 1, {CNN32}},
    {"global_avg_pool", "global_avg_pool", "resnet", s_global_avg_pool, {0}, 1,
     {{'x', 4, {128, 128, 7, 7}}}},
    /* whole training steps ("*_step" rows): mlp_step and autoencoder_step
     * below */
    /* the convolution family: the autoencoder's decoder */
    {"conv2d_transpose/dec1", "conv2d_transpose", AE, s_deconv, {2, 1}, 2,
     {{'x', 4, {128, 32, 7, 7}}, {'w', 4, {32, 16, 4, 4}}}},
    {"conv2d_transpose/dec2", "conv2d_transpose", AE, s_deconv, {2, 1}, 2,
     {AE16, {'w', 4, {16, 1, 4, 4}}}},
    {"upsample_nearest", "upsample_nearest", AE, s_up_nearest, {2}, 1, {AE16}},
    {"upsample_bilinear", "upsample_bilinear", AE, s_up_bilinear, {2}, 1, {AE16}},
    /* the shape family */
    {"transpose/nhwc", "transpose_nhwc", AE, s_to_nhwc, {0}, 1, {AE16}},
    /* an NHWC input: its transpose to NCHW alone, and the autoencoder's
     * enc2 convolution behind it (against conv2d/enc2 on NCHW) */
    {"transpose/nchw", "transpose_nchw", AE, s_to_nchw, {0}, 1,
     {{'x', 4, {128, 14, 14, 16}}}},
    {"conv2d/enc2_nhwc", "conv2d_nhwc", AE, s_conv2d_nhwc, {2, 1}, 2,
     {{'x', 4, {128, 14, 14, 16}}, {'w', 4, {32, 16, 3, 3}}}},
    {"gather/embedding", "gather", "transformer", s_gather, {0, 0, 0, 0, 0, 10000}, 2,
     {{'l', 2, {128, 32}}, {'w', 2, {10000, 128}}}},
    /* the reduce family */
    {"reduce_sum/hw", "reduce_sum_hw", AE, s_sum_hw, {0}, 1, {AE16}},
    {"reduce_mean/hw", "reduce_mean_hw", AE, s_mean_hw, {0}, 1, {AE16}},
    {"softmax/1000", "softmax", "classifier", s_softmax, {0}, 1, {{'x', 2, {128, 1000}}}},
    {"log_softmax/1000", "log_softmax", "classifier", s_log_softmax, {0}, 1,
     {{'x', 2, {128, 1000}}}},
    {"softmax_xent_seq", "softmax_xent_seq", "transformer", s_xent_seq, {0}, 2,
     {{'x', 3, {16, 64, 256}}, {'l', 2, {16, 64}}}},
    /* the linalg family: attention's scores, a Transformer's norm, a
     * GroupNorm on the autoencoder's activations */
    {"batch_matmul/qk", "batch_matmul_qk", "transformer", s_qk, {0}, 2,
     {{'x', 3, {32, 64, 32}}, {'x', 3, {32, 64, 32}}}},
    {"layer_norm", "layer_norm", "transformer", s_layer_norm, {0}, 3,
     {{'x', 3, {16, 64, 128}}, {'w', 1, {128}}, {'w', 1, {128}}}},
    {"group_norm", "group_norm", AE, s_group_norm, {4}, 3,
     {AE16, {'w', 1, {16}}, {'w', 1, {16}}}},
    /* fused causal attention: the small GPT's 4 heads of 32 at context 64
     * (batch 16), and at context 512 (batch 4) */
    {"attention/t64", "attention_causal", "transformer", s_attention, {0}, 3,
     {{'x', 4, {16, 4, 64, 32}}, {'x', 4, {16, 4, 64, 32}}, {'x', 4, {16, 4, 64, 32}}}},
    {"attention/t512", "attention_causal", "transformer", s_attention, {0}, 3,
     {{'x', 4, {4, 4, 512, 32}}, {'x', 4, {4, 4, 512, 32}}, {'x', 4, {4, 4, 512, 32}}}},
    /* whole steps around it (the mean square of the output), fused and
     * decomposed, against the same PyTorch step */
#define ATT64 {{'x', 4, {16, 4, 64, 32}}, {'x', 4, {16, 4, 64, 32}}, {'x', 4, {16, 4, 64, 32}}}
#define ATT512 {{'x', 4, {4, 4, 512, 32}}, {'x', 4, {4, 4, 512, 32}}, {'x', 4, {4, 4, 512, 32}}}
    {"attention_t64_step", "attention_sq_step", "transformer", s_attention_step, {0}, 3, ATT64},
    {"attention_decomposed_t64_step", "attention_sq_step", "transformer",
     s_attention_decomposed_step, {0}, 3, ATT64},
    {"attention_t512_step", "attention_sq_step", "transformer", s_attention_step, {0}, 3, ATT512},
    {"attention_decomposed_t512_step", "attention_sq_step", "transformer",
     s_attention_decomposed_step, {0}, 3, ATT512},
#undef ATT64
#undef ATT512
    {"mlp_step", "mlp_step", "mlp", s_mlp_step, {0, 0, 0, 0, 0, 10}, 8,
     {{'t', 2, {128, 784}}, {'l', 1, {128}}, {'w', 2, {784, 512}}, {'w', 1, {512}},
      {'w', 2, {512, 256}}, {'w', 1, {256}}, {'w', 2, {256, 10}}, {'w', 1, {10}}}},
    /* the autoencoder of examples/autoencoder.c (issue 42: its step at most
     * 0.5x PyTorch's) */
    {"autoencoder_step", "autoencoder_step", AE, s_ae_step, {0}, 9,
     {IMGT, {'w', 4, {16, 1, 3, 3}}, {'w', 1, {16}}, {'w', 4, {32, 16, 3, 3}},
      {'w', 1, {32}}, {'w', 4, {32, 16, 4, 4}}, {'w', 1, {16}}, {'w', 4, {16, 1, 4, 4}},
      {'w', 1, {1}}}},
    /* Rows to add with their families (issue 42): reductions (sum, mean,
     * max, softmax, log-softmax), shape ops (transpose, slice, pad, gather),
     * batched matmul, layer/group/instance norm, conv2d transpose and
     * upsampling (the autoencoder's decoder shapes). */
};
#undef U
#undef B
#define NROWS ((int)(sizeof s_rows / sizeof s_rows[0]))

/* ---- towerpack's side --------------------------------------------------- */

typedef struct {
    const bench_row_t *row;
    char timed[128]; /* the timed node's name, set by the tower */
} tower_arg_t;

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *data, void *user) {
    tower_arg_t *a = user;
    const bench_row_t *r = a->row;
    tp_node_t *in[MAX_IN];
    int d = 0;
    for (int i = 0; i < r->nin; i++) {
        const bench_in_t *b = &r->in[i];
        if (b->kind == 'w') {
            char n[16];
            snprintf(n, sizeof n, "w%d", i);
            in[i] = tp_variable(t, n, b->ndim, b->shape,
                                (tp_init_t){TP_INIT_UNIFORM, 0.1f}, TP_VAR_TRAINABLE);
        } else {
            in[i] = data[d++];
            if (b->kind == 'x' || b->kind == 'p')
                TP_TRY(tp_tower_input_gradient(t, in[i]));
        }
    }
    tp_node_t *y = r->build(t, in, r);
    TP_TRY(tp_tower_status(t));
    snprintf(a->timed, sizeof a->timed, "%s", tp_node_name(y));
    tp_node_t *cost = y;
    if (!s_is_step(r) && tp_node_shape(y)->ndim > 0) {
        tp_node_t *half = tp_stop_gradient(t, "head/target",
                                           tp_scale(t, "head/half", y, 0.5f));
        cost = tp_mse(t, "head/mse", y, half);
    }
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(1e-6, 0, 0);
}

/* --device N: the CUDA backend every row's model runs on (NULL: each
 * model its own CPU backend) */
static tp_backend_t *s_backend;

/* The row's own forward+backward nanoseconds summed so far: every node the
 * builder made (the timed one, and any it applies first, as the NHWC row's
 * transpose where no fold takes it into the convolution), not the MSE
 * head's; -1 when the profile has no node `name`, -2 when a head node took
 * a fold (its time, or the row's, would be on the wrong side). *folds:
 * the nodes folded into the row's calls. On the CPU the host's
 * time around each call (its calls end done); on a GPU the device's, from
 * the CUDA events around each call (profiling runs call by call,
 * synchronised). */
static double s_op_ns(tp_model_t *m, const char *name, int *folds) {
    static tp_op_profile_t pr[256];
    int n = tp_model_profile(m, 0, pr, 256), found = 0;
    double ns = 0;
    *folds = 0;
    for (int i = 0; i < n && i < 256; i++) {
        if (!strncmp(pr[i].name, "head/", 5)) {
            if (pr[i].folds)
                return -2;
            continue;
        }
        *folds += pr[i].folds;
        found |= !strcmp(pr[i].name, name);
        ns += s_backend ? (double)(pr[i].device_forward_ns + pr[i].device_backward_ns)
                        : (double)(pr[i].forward_ns + pr[i].backward_ns);
    }
    return found ? ns : -1;
}

/* Whether the row's model plans the graph's folds (config fold) though it
 * is no step: a row whose builder makes the nodes a fold joins (the NHWC
 * row's transpose, read NHWC by the conv itself), so that every node a
 * fold takes is timed in the row; s_op_ns refuses a fold that takes the
 * MSE head in. The other op rows: fold off, each op its own call. */
static int s_row_folds(const bench_row_t *r) {
    return r->build == s_conv2d_nhwc;
}

/* One row's model and its inputs' values, built once and timed in rounds. */
typedef struct {
    const bench_row_t *row;
    tower_arg_t arg;
    tp_model_t *model;
    int nfeeds;
    tp_tensor_t feeds[MAX_IN];
    void *bufs[MAX_IN];
    void *dev[MAX_IN];  /* --device: the inputs' copies in device memory */
    double prev; /* the op's profile sum after the last step */
    int absent;  /* the backend has no kernel for the row (not on CUDA) */
    int folds;   /* nodes folded into the row's calls (s_row_folds) */
} tp_side_t;

static void s_tp_fini(tp_side_t *s) {
    for (int i = 0; i < s->nfeeds; i++) {
        tp_free(s->bufs[i]);
        if (s->dev[i])
            tp_backend_free(s_backend, s->dev[i]);
    }
    tp_model_destroy(&s->model);
}

/* Builds the row's model (CPU backend, or --device's; fold off but where
 * s_row_folds says) and draws its inputs' values (on a GPU copied once
 * into device memory, so that a step copies nothing in); -1 with the
 * error printed. */
static int s_tp_init(tp_side_t *s, const bench_row_t *r, int threads) {
    memset(s, 0, sizeof *s);
    s->row = r;
    s->arg.row = r;
    static tp_input_desc_t desc[MAX_IN];
    static char names[MAX_IN][16]; /* "in%d" for any int i (-Wformat-truncation) */
    int nd = 0;
    int64_t batch = 0;
    for (int i = 0; i < r->nin; i++) {
        const bench_in_t *b = &r->in[i];
        if (b->kind == 'w')
            continue;
        snprintf(names[nd], sizeof names[nd], "in%d", i);
        desc[nd] = (tp_input_desc_t){names[nd], b->kind == 'l' ? TP_INT32 : TP_FLOAT32,
                                     b->ndim, {0}};
        memcpy(desc[nd].shape, b->shape, sizeof b->shape);
        desc[nd].shape[0] = -1;
        batch = b->shape[0];
        nd++;
    }
    tp_model_desc_t md = {desc, nd, s_tower, s_sgd, &s->arg};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = batch;
    cfg.threads = threads;
    cfg.backend = s_backend; /* NULL: a CPU backend of the model's own */
    cfg.own_backend = 0;
    if (!s_is_step(r) && !s_row_folds(r))
        cfg.fold = 0; /* the op in its own call: its time is its own */
    s->model = tp_model_new(&md, &cfg);
    if (!s->model) {
        fprintf(stderr, "tp-bench ops: %s: %s\n", r->name, tp_last_error());
        return -1;
    }
    tp_rng_t rng;
    tp_rng_init(&rng, 7, 0);
    for (int i = 0, k = 0; i < r->nin; i++) {
        const bench_in_t *b = &r->in[i];
        if (b->kind == 'w')
            continue;
        size_t n = 1;
        for (int d = 0; d < b->ndim; d++)
            n *= (size_t)b->shape[d];
        s->bufs[k] = tp_alloc(n * 4);
        s->nfeeds = k + 1;
        if (b->kind == 'l') {
            int64_t classes = r->attr[5] > 0 ? (int64_t)r->attr[5]
                                             : r->in[0].shape[r->in[0].ndim - 1];
            for (size_t e = 0; e < n; e++)
                ((int32_t *)s->bufs[k])[e] = (int32_t)tp_rng_below(&rng, (uint64_t)classes);
        } else {
            float lo = b->kind == 'x' ? -1 : b->kind == 'p' ? 0.5f : 0;
            float span = b->kind == 'x' ? 2 : 1;
            for (size_t e = 0; e < n; e++)
                ((float *)s->bufs[k])[e] = lo + span * tp_rng_float(&rng);
        }
        void *data = s->bufs[k];
        if (s_backend) {
            s->dev[k] = tp_backend_alloc(s_backend, n * 4);
            if (!s->dev[k] || tp_backend_copy(s_backend, s->dev[k], s->bufs[k], n * 4) < 0) {
                fprintf(stderr, "tp-bench ops: %s: input %d into device memory: %s\n",
                        r->name, i, tp_last_error());
                return -1;
            }
            data = s->dev[k];
        }
        tp_tensor_init_wrap(&s->feeds[k], desc[k].dtype, b->ndim, b->shape, data, NULL,
                            NULL);
        k++;
    }
    if (!s_is_step(r))
        tp_model_set_profiling(s->model, 1);
    return 0;
}

/* Median microseconds of the op per step over about `seconds` (at least
 * `min_iters` steps, after two warm-up steps), or -1 with the error
 * printed (s->absent set when the backend has no kernel for it). On a GPU
 * a step row's clock is read once the step is done on the device
 * (tp_model_wait: a step queued ahead too), as tp-bench cuda times its
 * steps. */
/* --cpu-time: step rows in the process's CPU time (file comment) */
static int s_cpu_time;

/* The clock a step row is timed by: wall, or this process's CPU time. */
static uint64_t s_step_ns(void) {
    if (!s_cpu_time)
        return tp_now_ns();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double s_tp_time(tp_side_t *s, double seconds, int min_iters) {
    static double t[100000];
    int n = 0;
    uint64_t start = 0;
    for (int it = 0;; it++) {
        uint64_t t0 = s_step_ns();
        tp_status_t rc = tp_model_run(s->model, 0, s->feeds, s->nfeeds, NULL, 0, NULL);
        if (rc == TP_OK && s_backend && s_is_step(s->row))
            rc = tp_model_wait(s->model);
        if (rc < 0) {
            /* a kernel the CUDA backend lacks ("no CUDA forward for op
             * ..."): the row is listed as not on CUDA, not as a failure */
            s->absent = s_backend && rc == TP_ERR_UNSUPPORTED;
            fprintf(stderr, "tp-bench ops: %s: %s%s\n", s->row->name, tp_last_error(),
                    s->absent ? " (listed as not on CUDA)" : "");
            return -1;
        }
        /* a step row: the step's wall time; an op row: its node's time */
        double now = s_is_step(s->row) ? s->prev + (double)(s_step_ns() - t0)
                                  : s_op_ns(s->model, s->arg.timed, &s->folds);
        if (now < 0) {
            if (now == -2)
                fprintf(stderr, "tp-bench ops: %s: a fold took the MSE head into a call\n",
                        s->row->name);
            else
                fprintf(stderr, "tp-bench ops: %s: no profile of node '%s'\n", s->row->name,
                        s->arg.timed);
            return -1;
        }
        if (it == 1)
            start = tp_now_ns();
        if (it >= 2)
            t[n++] = (now - s->prev) / 1e3;
        s->prev = now;
        if (n >= (int)(sizeof t / sizeof t[0]) ||
            (n >= min_iters && (double)(tp_now_ns() - start) / 1e9 >= seconds))
            break;
    }
    return tp_bench_median_mean(t, n);
}

/* ---- PyTorch's side: the peer script, one process for the whole run ------- */

/* The peer script: --peer, else bench/peers/torch_ops.py under the current
 * directory, else beside the build tree (build/bin/tp-bench -> ../../). */
static const char *s_find_peer(const char *peer, char *buf, size_t cap) {
    if (peer)
        return peer;
    if (access("bench/peers/torch_ops.py", R_OK) == 0)
        return "bench/peers/torch_ops.py";
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            int w = snprintf(buf, cap, "%s/../../bench/peers/torch_ops.py", exe);
            if (w > 0 && (size_t)w < cap && access(buf, R_OK) == 0)
                return buf;
        }
    }
    return NULL;
}

typedef struct {
    pid_t pid;
    FILE *to;   /* its stdin: one request line per chunk */
    FILE *from; /* its stdout: one answer line per request */
    char version[64];
    char device[128]; /* --device: the GPU's name as torch gives it */
} peer_t;

/* Starts `python script --serve` on two pipes (with --device N [--tf32]
 * when `device` >= 0: the rows on cuda:N) and reads its first line,
 * {"torch":VERSION[,"device":NAME]}. Called before any model exists, so
 * the fork happens before OpenBLAS's threads start and before this
 * process loads CUDA. `python` is a path or a name on $PATH. 0, or -1
 * with the reason printed. */
static int s_peer_start(peer_t *p, const char *python, const char *script, int device,
                        int tf32) {
    memset(p, 0, sizeof *p);
    int in[2], out[2];
    if (pipe(in) != 0)
        return -1;
    if (pipe(out) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    fflush(NULL);
    signal(SIGPIPE, SIG_IGN); /* a peer that died is an error, not our end */
    p->pid = fork();
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        char dev[16];
        snprintf(dev, sizeof dev, "%d", device);
        if (device < 0)
            execlp(python, python, script, "--serve", (char *)NULL);
        else
            execlp(python, python, script, "--serve", "--device", dev,
                   tf32 ? "--tf32" : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (p->pid < 0) {
        close(in[1]);
        close(out[0]);
        return -1;
    }
    p->to = fdopen(in[1], "w");
    p->from = fdopen(out[0], "r");
    char line[512];
    if (p->to && p->from && fgets(line, sizeof line, p->from)) {
        const char *v = strstr(line, "\"torch\":\"");
        if (v) {
            v += strlen("\"torch\":\"");
            snprintf(p->version, sizeof p->version, "%.*s", (int)strcspn(v, "\""), v);
            const char *d = strstr(line, "\"device\":\"");
            if (d) {
                d += strlen("\"device\":\"");
                snprintf(p->device, sizeof p->device, "%.*s", (int)strcspn(d, "\""), d);
            }
            return 0;
        }
    }
    return -1;
}

/* Closes its stdin (it exits at the end of its input) and waits for it;
 * its exit status (3: torch missing), or -1. */
static int s_peer_stop(peer_t *p) {
    if (p->to)
        fclose(p->to);
    if (p->from)
        fclose(p->from);
    int st = 0;
    if (p->pid <= 0 || waitpid(p->pid, &st, 0) != p->pid)
        return -1;
    p->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* One chunk of the row on the peer at `threads`: its median microseconds,
 * or -1 (the peer's complaint, on its stderr, says why). */
static double s_peer_time(peer_t *p, const bench_row_t *r, int threads, double seconds,
                          int min_iters) {
    FILE *f = p->to;
    fprintf(f, "{\"seconds\":%g,\"min_iters\":%d,\"threads\":%d,\"name\":\"%s\",\"op\":\"%s\","
               "\"step\":%d,\"cpu\":%d,\"attr\":[", seconds, min_iters, threads, r->name, r->op,
            s_is_step(r), s_cpu_time);
    for (int k = 0; k < MAX_ATTR; k++)
        fprintf(f, "%s%g", k ? "," : "", r->attr[k]);
    fprintf(f, "],\"inputs\":[");
    for (int i = 0; i < r->nin; i++) {
        fprintf(f, "%s{\"kind\":\"%c\",\"shape\":[", i ? "," : "", r->in[i].kind);
        for (int k = 0; k < r->in[i].ndim; k++)
            fprintf(f, "%s%lld", k ? "," : "", (long long)r->in[i].shape[k]);
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
    char line[512];
    if (fflush(f) != 0 || !fgets(line, sizeof line, p->from))
        return -1;
    const char *us = strstr(line, "\"median_us\":");
    return us ? atof(us + strlen("\"median_us\":")) : -1;
}

/* ---- the command -------------------------------------------------------- */

static void s_usage(FILE *o) {
    fprintf(o,
            "usage: tp-bench ops [--op PATTERN[,PATTERN...]] [--seconds S] [--rounds R] [--quick]\n"
            "                    [--threads T] [--no-torch] [--python PY] [--peer SCRIPT]\n"
            "                    [--list] [--json] [--cpu-time] [--device N] [--bf16]\n"
            "  each op's forward+backward median time against PyTorch's (best of 1 and 2\n"
            "  threads) on shapes from the example models; ratio = towerpack / torch.\n"
            "  --op: rows whose name matches a shell pattern (\"conv2d/*\", \"relu\")\n"
            "  --seconds: per row and side (default 1), in --rounds (default 3) that\n"
            "  alternate the sides; the median of the rounds' medians; --quick: 0.05 s\n"
            "  in 1 round (a smoke run)\n"
            "  --threads: towerpack's OpenBLAS threads (default 0: OpenBLAS's own)\n"
            "  --python: default /usr/bin/python3; --peer: bench/peers/torch_ops.py\n"
            "  --cpu-time: *_step rows in process CPU time on both sides, not wall time\n"
            "  (a loaded host; meaningful at --threads 1)\n"
            "  --bf16: towerpack's CPU rows with the matrix products and direct\n"
            "  convolutions on bf16 operands, fp32 sums (as tp-train --bf16 and\n"
            "  TP_CPU_BF16=1; PyTorch's side stays fp32)\n"
            "  --device N: towerpack's rows on CUDA device N (the inputs in device memory;\n"
            "  op rows in the device's time from CUDA events around each call, step rows\n"
            "  in wall time once the device is done), PyTorch's on cuda:N (events around\n"
            "  each op row, torch.cuda.synchronize() around each step row); TF32 as\n"
            "  $TP_CUDA_TF32 says (off by default) on both sides; rows the CUDA backend\n"
            "  has no kernel for are listed as \"not on CUDA\". Exit 77 when no CUDA\n"
            "  device answers (or the build has none)\n");
}

static int s_selected(const char *name, const char *patterns) {
    if (!patterns)
        return 1;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", patterns);
    for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
        if (!fnmatch(p, name, 0))
            return 1;
    return 0;
}

static void s_shapes(const bench_row_t *r, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < r->nin && o < cap; i++) {
        o += (size_t)snprintf(buf + o, cap - o, "%s", i ? ", " : "");
        for (int k = 0; k < r->in[i].ndim && o < cap; k++)
            o += (size_t)snprintf(buf + o, cap - o, "%s%lld", k ? "x" : "",
                                  (long long)r->in[i].shape[k]);
    }
}

int tp_bench_ops(int argc, char **argv) {
    const char *patterns = NULL, *python = "/usr/bin/python3", *peer = NULL;
    double seconds = 1.0;
    int threads = 0, torch = 1, json = 0, list = 0, quick = 0, rounds = 3, device = -1, bf16 = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--op") && i + 1 < argc)
            patterns = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-torch"))
            torch = 0;
        else if (!strcmp(argv[i], "--python") && i + 1 < argc)
            python = argv[++i];
        else if (!strcmp(argv[i], "--peer") && i + 1 < argc)
            peer = argv[++i];
        else if (!strcmp(argv[i], "--list"))
            list = 1;
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--cpu-time"))
            s_cpu_time = 1;
        else if (!strcmp(argv[i], "--bf16"))  /* as $TP_CPU_BF16=1 */
            bf16 = 1;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            char *end;
            long d = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end || d < 0 || d > 1023) {
                fprintf(stderr, "tp-bench ops: --device '%s': a CUDA device number (0, 1, "
                                "...)\n", argv[i]);
                return 2;
            }
            device = (int)d;
        }
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            s_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "tp-bench ops: unknown option '%s'\n", argv[i]);
            s_usage(stderr);
            return 2;
        }
    }
    /* the CPU's bf16 products, before any row builds its op */
    tp_backend_cpu_bf16_ask(bf16);
    if (quick) {
        seconds = 0.05;
        rounds = 1;
    }
    if (!(seconds > 0) || threads < 0 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "tp-bench ops: --seconds > 0, --threads >= 0, --rounds 1..%d\n",
                MAX_ROUNDS);
        return 2;
    }
    int sel[MAX_ROWS], nsel = 0;
    for (int i = 0; i < NROWS && nsel < MAX_ROWS; i++)
        if (s_selected(s_rows[i].name, patterns))
            sel[nsel++] = i;
    if (list) {
        for (int i = 0; i < NROWS; i++) {
            char sh[256];
            s_shapes(&s_rows[i], sh, sizeof sh);
            printf("%-16s %-16s %-12s %s\n", s_rows[i].name, s_rows[i].op, s_rows[i].from, sh);
        }
        return 0;
    }
    if (!nsel) {
        fprintf(stderr, "tp-bench ops: no row matches '%s' (--list names them)\n", patterns);
        return 2;
    }
    if (device >= 0 && s_cpu_time) {
        fprintf(stderr, "tp-bench ops: --cpu-time is for the CPU; on --device the steps are "
                        "timed until the device is done\n");
        return 2;
    }
    /* --device: ask CUDA in a forked probe first (this process loads no
     * CUDA before the peer's fork), and stop here, in one line, when no
     * device answers: no driver, no device, or a build without CUDA */
    tp_cuda_options_t copt = tp_cuda_options_default();
    if (device >= 0) {
        char why[512];
        int count = tp_cuda_probe_isolated(why, sizeof why);
        if (count <= 0) {
            fprintf(stderr, "tp-bench ops: --device %d: %s\n", device, why);
            return 77;
        }
        if (device >= count) {
            fprintf(stderr, "tp-bench ops: --device %d: there is no GPU %d (%d CUDA device%s)\n",
                    device, device, count, count == 1 ? "" : "s");
            return 2;
        }
        copt.device = device;
    }
    /* the peer first: its fork happens before any model's threads */
    peer_t pr = {0};
    int have_torch = 0;
    if (torch) {
        char buf[4096];
        const char *script = s_find_peer(peer, buf, sizeof buf);
        if (!script)
            fprintf(stderr, "tp-bench ops: bench/peers/torch_ops.py not found (run from the "
                            "source tree or give --peer)\n");
        else if (s_peer_start(&pr, python, script, device, copt.tf32) == 0)
            have_torch = 1;
        else {
            int rc = s_peer_stop(&pr);
            fprintf(stderr, "tp-bench ops: the PyTorch peer (%s %s) did not start%s\n", python,
                    script, rc == 3   ? ": python3-torch missing (apt-get install python3-torch)"
                            : rc == 4 ? ": its torch sees no such CUDA device"
                                      : "");
        }
    }
    if (device >= 0) {
        s_backend = tp_backend_cuda_new(&copt);
        if (!s_backend) {
            fprintf(stderr, "tp-bench ops: --device %d: %s\n", device, tp_last_error());
            if (have_torch)
                s_peer_stop(&pr);
            return 1;
        }
    }
    tp_log_set_level(TP_LOG_WARN);
    const int min_iters = quick ? 3 : 10;
    const double chunk = seconds / rounds;
    static double tp_us[MAX_ROWS], tr[MAX_ROWS][3];
    static int absent[MAX_ROWS]; /* --device: the row is not on CUDA */
    static int folds[MAX_ROWS];  /* nodes folded into the row's calls */
    int failed = 0, nabsent = 0;
    /* on a GPU torch's threads do not matter: one request a round */
    const int max_th = s_backend ? 1 : 2;
    for (int s = 0; s < nsel; s++) {
        const bench_row_t *r = &s_rows[sel[s]];
        tp_side_t side;
        double rt[3][MAX_ROUNDS]; /* [0] towerpack, [1], [2] torch at 1, 2 threads */
        int ok = s_tp_init(&side, r, threads) == 0, tp_ok = ok;
        /* the sides alternate round by round, so that both see the same
         * load from whatever else the machine runs; a row not on CUDA
         * keeps torch's rounds, for the reference */
        for (int k = 0; k < rounds && ok; k++) {
            if (tp_ok) {
                rt[0][k] = s_tp_time(&side, chunk, min_iters);
                tp_ok = rt[0][k] >= 0;
                ok = tp_ok || side.absent;
            }
            for (int th = 1; th <= max_th && ok && have_torch; th++) {
                rt[th][k] = s_peer_time(&pr, r, th, chunk, min_iters);
                if (rt[th][k] < 0) {
                    fprintf(stderr, "tp-bench ops: %s: the PyTorch peer gave no time; it "
                                    "stops here\n", r->name);
                    have_torch = 0;
                    s_peer_stop(&pr);
                }
            }
        }
        s_tp_fini(&side);
        absent[s] = side.absent;
        folds[s] = side.folds;
        nabsent += side.absent;
        tp_us[s] = tp_ok ? tp_bench_median_mean(rt[0], rounds) : -1;
        failed += !ok;
        for (int th = 1; th <= 2; th++)
            tr[s][th] = ok && have_torch && th <= max_th ? tp_bench_median_mean(rt[th], rounds) : 0;
    }
    int tp_threads = tp_backend_cpu_threads();
    char where[192] = "cpu"; /* the device the rows ran on */
    if (s_backend)
        snprintf(where, sizeof where, "cuda:%d%s%s%s", device, pr.device[0] ? " (" : "",
                 pr.device, pr.device[0] ? ")" : "");
    char version[64];
    snprintf(version, sizeof version, "%s", pr.version);
    if (have_torch && s_peer_stop(&pr) != 0)
        fprintf(stderr, "tp-bench ops: the PyTorch peer failed at its end\n");
    int slower = 0, compared = 0;
    char slow_names[1024] = "";
    if (json)
        printf("{\"bench\":\"ops\",\"threads\":%d,\"fold\":0,\"seconds\":%g,\"rounds\":%d,"
               "\"step_clock\":\"%s\",\"device\":\"%s\",\"tf32\":%d,\"torch\":\"%s\","
               "\"rows\":[",
               tp_threads, seconds, rounds, s_cpu_time ? "cpu" : "wall", where,
               s_backend ? copt.tf32 : 0, have_torch ? version : "");
    else if (s_backend) {
        printf("tp-bench ops: forward+backward of each op, median per step (us), on %s, "
               "TF32 %s; towerpack's CUDA backend, fold off, the inputs in device memory:\n"
               "op rows in the device's time (CUDA events around each call, run call by "
               "call);\n*_step rows: a whole training step with its SGD update, folds on, "
               "in wall time until the device is done;\n", where, copt.tf32 ? "on" : "off");
        if (have_torch)
            printf("PyTorch %s eager on the same device: op rows between CUDA events after "
                   "torch.cuda.synchronize(),\nstep rows between synchronize()s; ratio = "
                   "towerpack / torch\n", version);
        else
            printf("PyTorch: not run\n");
        printf("%-16s %-12s %-34s %12s %12s %4s %7s\n", "op", "from", "inputs", "towerpack",
               "torch", "dev", "ratio");
    } else {
        printf("tp-bench ops: forward+backward of each op, median per step (us); towerpack on "
               "%d OpenBLAS thread(s), fold off (but conv2d/enc2_nhwc's transpose, read by\n"
               "its conv; *_step rows: a whole training step with its SGD update, folds "
               "on%s);\n", tp_threads,
               s_cpu_time ? ", in process CPU time" : "");
        /* libgomp's idle threads (both sides' teams): at 2 threads its
         * default spin puts a plateau of some 400-560 us under ops whose
         * own work is tens of us (docs/performance.md), so the table says
         * which policy it ran under */
        const char *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT");
        printf("OpenMP idle threads: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s\n",
               wp ? wp : "(unset)", sc ? sc : "(unset)");
        if (have_torch)
            printf("PyTorch %s eager, best of 1 and 2 threads (torch.set_num_threads); ratio = "
                   "towerpack / torch\n", version);
        else
            printf("PyTorch: not run\n");
        printf("%-16s %-12s %-34s %12s %12s %4s %7s\n", "op", "from", "inputs", "towerpack",
               "torch", "thr", "ratio");
    }
    for (int s = 0; s < nsel; s++) {
        const bench_row_t *r = &s_rows[sel[s]];
        double t1 = tr[s][1], t2 = tr[s][2];
        int best = t1 > 0 && (t2 <= 0 || t1 <= t2) ? 1 : t2 > 0 ? 2 : 0;
        double ref = best ? tr[s][best] : 0;
        double ratio = ref > 0 && tp_us[s] > 0 ? tp_us[s] / ref : 0;
        if (ratio > 0) {
            compared++;
            if (ratio > 1) {
                slower++;
                size_t o = strlen(slow_names);
                snprintf(slow_names + o, sizeof slow_names - o, "%s%s", o ? ", " : "", r->name);
            }
        }
        char sh[256];
        s_shapes(r, sh, sizeof sh);
        if (json)
            printf("%s{\"name\":\"%s\",\"op\":\"%s\",\"from\":\"%s\",\"inputs\":\"%s\","
                   "\"towerpack_us\":%.2f,\"torch1_us\":%.2f,\"torch2_us\":%.2f,"
                   "\"torch_us\":%.2f,\"torch_threads\":%d,\"ratio\":%.3f,\"folds\":%d,"
                   "\"status\":\"%s\"}",
                   s ? "," : "", r->name, r->op, r->from, sh, tp_us[s], t1, t2, ref, best,
                   ratio, folds[s], tp_us[s] >= 0 ? "ok" : absent[s] ? "not on CUDA" : "failed");
        else {
            char a[32] = "failed", b[32] = "-", c[8] = "-", d[16] = "-";
            if (tp_us[s] >= 0)
                snprintf(a, sizeof a, "%.1f", tp_us[s]);
            else if (absent[s])
                snprintf(a, sizeof a, "not on CUDA");
            if (ref > 0) {
                snprintf(b, sizeof b, "%.1f", ref);
                snprintf(c, sizeof c, s_backend ? "gpu" : "%d", best);
            }
            if (ratio > 0)
                snprintf(d, sizeof d, "%.2f%s", ratio, ratio > 1 ? "*" : "");
            printf("%-16s %-12s %-34s %12s %12s %4s %7s\n", r->name, r->from, sh, a, b, c, d);
        }
    }
    if (json)
        printf("],\"not_on_device\":%d,\"compared\":%d,\"slower\":%d}\n", nabsent, compared,
               slower);
    else {
        if (have_torch)
            printf("slower than PyTorch (*): %d of %d%s%s\n", slower, compared,
                   slower ? ": " : "", slow_names);
        if (s_backend)
            printf("not on CUDA: %d row(s)%s\n", nabsent, nabsent ? " (tp-bench's stderr "
                   "says which kernel each lacks)" : "");
    }
    tp_backend_destroy(&s_backend);
    return failed ? 1 : 0;
}
