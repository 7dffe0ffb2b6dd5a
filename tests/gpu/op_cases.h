/* towerpack tests: op cases described once, run by several checks.
 *
 * A row names an op, its attributes, its input shapes and the range its
 * inputs are drawn from, and the tolerances against PyTorch. The PyTorch
 * parity suite (test_proc_op_parity.c + tests/tools/op_parity.py) runs every
 * row on the CPU backend and has torch recompute it; the CUDA harness
 * (test_cuda_ops.c) runs every row on the device against the CPU. A later
 * op family adds rows here and one line to op_parity.py's table. */
#ifndef TOWERPACK_TESTS_OP_CASES_H
#define TOWERPACK_TESTS_OP_CASES_H

#include <stdint.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

typedef struct {
    const char *label;     /* unique: the row's files are named after it */
    tp_op_kind_t kind;
    float alpha, beta;     /* attributes (tp_op_attr_t) */
    int ninputs;
    int nd[3];             /* input ranks */
    int64_t d[3][4];       /* input shapes */
    float lo[3], hi[3];    /* inputs drawn from U(lo, hi) */
    float atol, rtol;      /* against PyTorch: |got - want| <= atol + rtol |want| */
    float step;            /* > 0: inputs rounded to multiples of it (ties) */
    /* the shape family: attributes, the output shape, integer inputs */
    int axis;              /* attr.axis (concat) */
    int64_t a[4], b[4];    /* attr.dims_a, dims_b (perm, start/step, pads) */
    int ynd;               /* > 0: the output shape is yd[0..ynd) */
    int64_t yd[4];
    int ints;              /* bit p: input p is int32, drawn from [lo, hi) */
    /* the convolution family (0: the default); upsampling's factor is
     * `stride`, bilinear's align_corners `align` */
    int stride, pad, dilation, groups, out_pad, align;
    /* the norms: attr.norm_absent (bit 0 no gamma, bit 1 no beta); the
     * inputs are then x and the parameters present */
    int absent;
    /* attention: the packed form's heads (attr.heads; one [...,T,3C] input) */
    int heads;
} op_case_t;

/* Gradients that are sums (broadcast, repeated gather rows): torch adds
 * in another order, 1e-6; the rest move values exactly, 0. */
#define S_SUMS(k) ((k) == TP_OP_BROADCAST_TO || (k) == TP_OP_GATHER ? 1e-6f : 0.0f)
/* A shape row: one or two inputs, attributes a/b/axis, output shape y. */
#define OP_SHAPE_ROW(nm, k, n, nd0, d0, nd1, d1, ax, a_, b_, ynd_, y_, alpha_, ints_, lo1, hi1) \
    {.label = nm, .kind = k, .alpha = alpha_, .ninputs = n, .nd = {nd0, nd1},           \
     .d = {d0, d1}, .lo = {-1, lo1}, .hi = {1, hi1}, .atol = S_SUMS(k), .rtol = S_SUMS(k), .axis = ax, \
     .a = a_, .b = b_, .ynd = ynd_, .yd = y_, .ints = ints_}
#define OPV(...) {__VA_ARGS__}


/* Binary rows: same shapes, trailing broadcast, stretched on both sides,
 * a scalar, batch 1, odd sizes. */
#define OP_BINARY_ROWS(nm, kind, lo0, hi0, lo1, hi1, atol, rtol)                   \
    {nm "_same", kind, 0, 0, 2, {2, 2}, {{3, 5}, {3, 5}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}, \
    {nm "_trailing", kind, 0, 0, 2, {3, 1}, {{4, 3, 5}, {5}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}, \
    {nm "_both_stretched", kind, 0, 0, 2, {3, 3}, {{3, 1, 5}, {1, 4, 1}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}, \
    {nm "_scalar_left", kind, 0, 0, 2, {0, 3}, {{0}, {2, 3, 7}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}, \
    {nm "_batch1", kind, 0, 0, 2, {2, 2}, {{1, 7}, {1, 1}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}, \
    {nm "_odd", kind, 0, 0, 2, {4, 2}, {{3, 1, 13, 1}, {13, 11}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}

/* Loss rows (attribute a: Huber's delta): a batch of rows, a multi-dim
 * shape with odd sizes, batch 1, a single element. */
#define OP_LOSS_ROWS(nm, kind, a, lo0, hi0, lo1, hi1, atol, rtol)             \
    {nm "_rows", kind, a, 0, 2, {2, 2}, {{8, 5}, {8, 5}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}, \
    {nm "_odd", kind, a, 0, 2, {4, 4}, {{3, 1, 7, 5}, {3, 1, 7, 5}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}, \
    {nm "_batch1", kind, a, 0, 2, {2, 2}, {{1, 13}, {1, 13}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}, \
    {nm "_single", kind, a, 0, 2, {1, 1}, {{1}, {1}}, {lo0, lo1}, {hi0, hi1}, atol, rtol, 0}

/* Reduce-family rows. Reductions, argmax and the softmaxes carry their
 * axes' bit set (attr.axes; bit i = input axis i) in alpha and keepdims in
 * beta (op_case_axes). The label ops (op_case_labels) take logits [.., V]
 * and int32 labels of the leading dims, drawn in [0, V). */
#define OP_REDUCE_ROW(nm, kind, nd, d0, d1, d2, d3, ax, keep, lo, hi, atol, rtol, step) \
    {nm, kind, ax, keep, 1, {nd, 0}, {{d0, d1, d2, d3}, {0}}, {lo, 0}, {hi, 0}, atol, rtol, step}
#define OP_REDUCE_ROWS(nm, kind, atol, rtol)                                  \
    OP_REDUCE_ROW(nm "_last", kind, 3, 3, 5, 7, 0, 4, 0, -2, 2, atol, rtol, 0),        \
    OP_REDUCE_ROW(nm "_first_keep", kind, 3, 4, 3, 5, 0, 1, 1, -2, 2, atol, rtol, 0),  \
    OP_REDUCE_ROW(nm "_axes_1_3", kind, 4, 2, 3, 4, 5, 10, 0, -2, 2, atol, rtol, 0),   \
    OP_REDUCE_ROW(nm "_axes_0_2_keep", kind, 3, 3, 1, 13, 0, 5, 1, -2, 2, atol, rtol, 0), \
    OP_REDUCE_ROW(nm "_all", kind, 3, 3, 1, 13, 0, 7, 0, -2, 2, atol, rtol, 0),         \
    OP_REDUCE_ROW(nm "_batch1", kind, 2, 1, 7, 0, 0, 2, 1, -2, 2, atol, rtol, 0)
#define OP_LABEL_ROW(nm, kind, a, nd, d0, d1, d2, d3, lo, hi, atol, rtol) \
    {nm, kind, a, 0, 2, {nd, nd - 1}, {{d0, d1, d2, d3}, {d0, d1, d2, 0}}, {lo, 0}, {hi, 0}, atol, rtol, 0}

#define OP_UNARY_ROW(nm, kind, a, b, lo, hi, atol, rtol)                     \
    {nm, kind, a, b, 1, {3, 0}, {{2, 7, 13}, {0}}, {lo, 0}, {hi, 0}, atol, rtol, 0}

/* Convolution-family rows: x [n,c,h,w] and W [a,b,kh,kw] (conv2d: [O,C/g,
 * KH,KW]; transpose: [C,O/g,KH,KW]); stride, pad, dilation, groups, output
 * padding. Upsampling: x only, the factor and align_corners. */
#define OP_CONV_ROW(nm, k, n, c, h, w, a, b, kh, kw, s, p, dl, g, op, at, rt)  \
    {.label = nm, .kind = k, .ninputs = 2, .nd = {4, 4},                       \
     .d = {{n, c, h, w}, {a, b, kh, kw}}, .lo = {-1, -1}, .hi = {1, 1},         \
     .atol = at, .rtol = rt, .stride = s, .pad = p, .dilation = dl, .groups = g, \
     .out_pad = op}
#define OP_UPSAMPLE_ROW(nm, k, n, c, h, w, f, al, at, rt)                     \
    {.label = nm, .kind = k, .ninputs = 1, .nd = {4}, .d = {{n, c, h, w}},      \
     .lo = {-1}, .hi = {1}, .atol = at, .rtol = rt, .stride = f, .align = al}

/* Pooling rows: x [n,c,h,w], the window (alpha), stride and padding
 * (max: padding never wins; average: it is not counted, PyTorch's
 * count_include_pad=False). */
#define OP_POOL_ROW(nm, k, n, c, h, w, win, s, p, at, rt)                     \
    {.label = nm, .kind = k, .alpha = win, .ninputs = 1, .nd = {4},             \
     .d = {{n, c, h, w}}, .lo = {-1}, .hi = {1}, .atol = at, .rtol = rt,        \
     .stride = s, .pad = p}

/* Rows written positionally (and other families' rows) leave the later
 * families' fields (axis, a, b, ynd, yd, ints; stride .. align) zero,
 * which is what they mean there. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
/* The linalg family's rows: a shape as an initializer; a batched matmul
 * (inputs U(-1, 1)); a norm of x U(-2, 3), gamma U(0.5, 1.5), beta
 * U(-1, 1) of the parameters' shape. Sums of K or of a row's length
 * order differently from torch's: 1e-5 + 1e-4 relative. */
#define OP_D(...) {__VA_ARGS__}
#define OP_BMM_ROW(nm, ta, tb, na, nb, da, db)                                \
    {nm, TP_OP_BATCH_MATMUL, ta, tb, 2, {na, nb}, {da, db}, {-1, -1}, {1, 1}, 1e-5f, 1e-4f, 0}
#define OP_NORM_ROW(nm, kind, eps, n, nx, np, dx, dp)                          \
    {nm, kind, eps, n, 3, {nx, np, np}, {dx, dp, dp}, {-2, 0.5f, -1}, {3, 1.5f, 1}, 1e-5f, 1e-4f, 0}
/* A norm without gamma (ab 1), without beta (2) or without both (3): x
 * and the one parameter left (U(0.5, 1.5) for gamma, U(-1, 1) for beta) */
#define OP_NORM_ROW_NO(nm, kd, eps, n, nx, np, dx, dp, ab)                     \
    {.label = nm, .kind = kd, .alpha = eps, .beta = n, .ninputs = (ab) == 3 ? 1 : 2, \
     .nd = {nx, np}, .d = {dx, dp}, .lo = {-2, (ab) == 2 ? 0.5f : -1},          \
     .hi = {3, (ab) == 2 ? 1.5f : 1}, .atol = 1e-5f, .rtol = 1e-4f, .absent = ab}

/* Fused attention: q of shape dq, k and v of shape dk, inputs U(-2, 2)
 * (scores of a few units: a peaked softmax) */
#define OP_ATTN_ROW(nm, scale, causal, nd_, dq, dk)                             \
    {nm, TP_OP_ATTENTION, scale, causal, 3, {nd_, nd_, nd_}, {dq, dk, dk}, {-2, -2, -2}, \
     {2, 2, 2}, 1e-5f, 1e-4f, 0}

/* The packed form (tp_attention_qkv): qkv of shape dx [...,T,3C], H heads */
#define OP_ATTN_QKV_ROW(nm, scale, causal, heads_, nd_, dx)                      \
    {.label = nm, .kind = TP_OP_ATTENTION, .alpha = scale, .beta = causal, .ninputs = 1, \
     .nd = {nd_}, .d = {dx}, .lo = {-2}, .hi = {2}, .atol = 1e-5f, .rtol = 1e-4f,       \
     .heads = heads_}

static const op_case_t op_cases[] = {
    OP_BINARY_ROWS("add", TP_OP_ADD, -1, 1, -1, 1, 1e-6f, 1e-5f),
    OP_BINARY_ROWS("sub", TP_OP_SUB, -1, 1, -1, 1, 1e-6f, 1e-5f),
    OP_BINARY_ROWS("mul", TP_OP_MUL, -1, 1, -1, 1, 1e-6f, 1e-5f),
    OP_BINARY_ROWS("div", TP_OP_DIV, -1, 1, 0.5f, 2, 1e-6f, 1e-5f),
    OP_BINARY_ROWS("maximum", TP_OP_MAXIMUM, -1, 1, -1, 1, 1e-6f, 1e-5f),
    OP_BINARY_ROWS("minimum", TP_OP_MINIMUM, -1, 1, -1, 1, 1e-6f, 1e-5f),
    /* ties: half the gradient to each side, as torch */
    {"maximum_ties", TP_OP_MAXIMUM, 0, 0, 2, {2, 1}, {{6, 5}, {5}}, {-1, -1}, {1, 1}, 1e-6f, 1e-5f, 0.5f},
    {"minimum_ties", TP_OP_MINIMUM, 0, 0, 2, {2, 1}, {{6, 5}, {5}}, {-1, -1}, {1, 1}, 1e-6f, 1e-5f, 0.5f},
    /* kinks at exactly 0 and at the bounds: torch's one-sided choices */
    {"relu_at_0", TP_OP_RELU, 0, 0, 1, {1, 0}, {{40}, {0}}, {-1, 0}, {1, 0}, 0, 0, 0.5f},
    {"abs_at_0", TP_OP_ABS, 0, 0, 1, {1, 0}, {{40}, {0}}, {-1, 0}, {1, 0}, 0, 0, 0.5f},
    {"clip_at_bounds", TP_OP_CLIP, -0.5f, 0.5f, 1, {1, 0}, {{40}, {0}}, {-1, 0}, {1, 0}, 0, 0, 0.5f},
    OP_UNARY_ROW("relu", TP_OP_RELU, 0, 0, -1, 1, 0, 0),
    OP_UNARY_ROW("leaky_relu", TP_OP_LEAKY_RELU, 0.1f, 0, -1, 1, 1e-7f, 1e-6f),
    OP_UNARY_ROW("tanh", TP_OP_TANH, 0, 0, -3, 3, 1e-6f, 1e-5f),
    OP_UNARY_ROW("sigmoid", TP_OP_SIGMOID, 0, 0, -6, 6, 1e-6f, 1e-5f),
    OP_UNARY_ROW("scale", TP_OP_SCALE, -0.37f, 0, -1, 1, 1e-7f, 1e-6f),
    OP_UNARY_ROW("neg", TP_OP_NEG, 0, 0, -1, 1, 0, 0),
    OP_UNARY_ROW("abs", TP_OP_ABS, 0, 0, -1, 1, 0, 0),
    OP_UNARY_ROW("square", TP_OP_SQUARE, 0, 0, -2, 2, 1e-7f, 1e-6f),
    OP_UNARY_ROW("sqrt", TP_OP_SQRT, 0, 0, 0.05f, 4, 1e-6f, 1e-5f),
    OP_UNARY_ROW("rsqrt", TP_OP_RSQRT, 0, 0, 0.05f, 4, 1e-5f, 1e-5f),
    OP_UNARY_ROW("exp", TP_OP_EXP, 0, 0, -4, 4, 1e-6f, 1e-5f),
    OP_UNARY_ROW("log", TP_OP_LOG, 0, 0, 0.05f, 4, 1e-6f, 1e-5f),
    OP_UNARY_ROW("pow_2.5", TP_OP_POW, 2.5f, 0, 0.05f, 3, 1e-5f, 1e-5f),
    OP_UNARY_ROW("pow_-1.5", TP_OP_POW, -1.5f, 0, 0.2f, 3, 1e-5f, 1e-5f),
    OP_UNARY_ROW("pow_3_negative_base", TP_OP_POW, 3.0f, 0, -2, 2, 1e-5f, 1e-5f),
    OP_UNARY_ROW("clip", TP_OP_CLIP, -0.5f, 0.7f, -1, 1, 0, 0),
    OP_UNARY_ROW("gelu", TP_OP_GELU, 0, 0, -4, 4, 1e-6f, 1e-5f),
    OP_UNARY_ROW("gelu_tanh", TP_OP_GELU_TANH, 0, 0, -4, 4, 1e-6f, 1e-5f),
    OP_UNARY_ROW("silu", TP_OP_SILU, 0, 0, -6, 6, 1e-6f, 1e-5f),
    OP_UNARY_ROW("softplus", TP_OP_SOFTPLUS, 0, 0, -25, 25, 1e-6f, 1e-5f),
    OP_UNARY_ROW("stop_gradient", TP_OP_STOP_GRADIENT, 0, 0, -1, 1, 0, 0),
    /* a size-1 tensor and batch 1 through the unary path */
    {"exp_single", TP_OP_EXP, 0, 0, 1, {1, 0}, {{1}, {0}}, {-1, 0}, {1, 0}, 1e-6f, 1e-5f, 0},
    /* the loss family: two same-shape inputs -> their mean, a scalar */
    OP_LOSS_ROWS("mse", TP_OP_MSE, 0, -1, 1, -1, 1, 1e-6f, 1e-5f),
    OP_LOSS_ROWS("l1_loss", TP_OP_L1_LOSS, 0, -1, 1, -1, 1, 1e-6f, 1e-5f),
    OP_LOSS_ROWS("huber_loss", TP_OP_HUBER_LOSS, 1.0f, -2, 2, -1, 1, 1e-6f, 1e-5f),
    OP_LOSS_ROWS("huber_loss_d0.3", TP_OP_HUBER_LOSS, 0.3f, -1, 1, -1, 1, 1e-6f, 1e-5f),
    OP_LOSS_ROWS("sigmoid_xent", TP_OP_SIGMOID_XENT, 0, -6, 6, 0, 1, 1e-6f, 1e-5f),
    /* logits far past where e^x overflows float: the stable form stays finite */
    {"sigmoid_xent_large", TP_OP_SIGMOID_XENT, 0, 0, 2, {2, 2}, {{4, 9}, {4, 9}}, {-200, 0}, {200, 1}, 1e-5f, 1e-5f, 0},
    /* equal elements (the kink of l1 at 0: gradient 0, torch's sign) */
    {"l1_loss_ties", TP_OP_L1_LOSS, 0, 0, 2, {1, 1}, {{40}, {40}}, {-1, -1}, {1, 1}, 1e-6f, 1e-5f, 0.5f},
    /* the shape family: values move exactly (tolerance 0), gradients are
     * sums of dy only where several outputs share an input (broadcast,
     * gather's repeated rows), exact for the sizes here up to rounding */
    OP_SHAPE_ROW("transpose_021", TP_OP_TRANSPOSE, 1, 3, OPV(2, 3, 5), 0, OPV(0), 0, OPV(0, 2, 1), OPV(0), 3, OPV(2, 5, 3), 0, 0, 0, 0),
    OP_SHAPE_ROW("transpose_2d", TP_OP_TRANSPOSE, 1, 2, OPV(7, 4), 0, OPV(0), 0, OPV(1, 0), OPV(0), 2, OPV(4, 7), 0, 0, 0, 0),
    OP_SHAPE_ROW("transpose_4d", TP_OP_TRANSPOSE, 1, 4, OPV(2, 3, 4, 5), 0, OPV(0), 0, OPV(3, 1, 0, 2), OPV(0), 4, OPV(5, 3, 2, 4), 0, 0, 0, 0),
    OP_SHAPE_ROW("transpose_batch1", TP_OP_TRANSPOSE, 1, 3, OPV(1, 6, 1), 0, OPV(0), 0, OPV(2, 0, 1), OPV(0), 3, OPV(1, 1, 6), 0, 0, 0, 0),
    /* NCHW -> NHWC with [HW, C] blocks of at least 8x8: the CPU's tiled
     * walk, its 4x4 register blocks (12x8) and its scalar tiles (9x9) */
    OP_SHAPE_ROW("transpose_nhwc_blocks", TP_OP_TRANSPOSE, 1, 4, OPV(2, 8, 3, 4), 0, OPV(0), 0, OPV(0, 2, 3, 1), OPV(0), 4, OPV(2, 3, 4, 8), 0, 0, 0, 0),
    OP_SHAPE_ROW("transpose_nhwc_odd_tiles", TP_OP_TRANSPOSE, 1, 4, OPV(2, 9, 3, 3), 0, OPV(0), 0, OPV(0, 2, 3, 1), OPV(0), 4, OPV(2, 3, 3, 9), 0, 0, 0, 0),
    OP_SHAPE_ROW("slice_rows_every_other_col", TP_OP_SLICE, 1, 2, OPV(5, 7), 0, OPV(0), 0, OPV(1, 0), OPV(1, 2), 2, OPV(3, 4), 0, 0, 0, 0),
    OP_SHAPE_ROW("slice_negative_steps", TP_OP_SLICE, 1, 2, OPV(6, 5), 0, OPV(0), 0, OPV(5, 4), OPV(-2, -1), 2, OPV(3, 5), 0, 0, 0, 0),
    OP_SHAPE_ROW("slice_4d", TP_OP_SLICE, 1, 4, OPV(3, 4, 5, 6), 0, OPV(0), 0, OPV(0, 1, 2, 3), OPV(1, 2, 1, 2), 4, OPV(3, 2, 3, 2), 0, 0, 0, 0),
    OP_SHAPE_ROW("slice_batch1", TP_OP_SLICE, 1, 2, OPV(1, 9), 0, OPV(0), 0, OPV(0, 8), OPV(1, -3), 2, OPV(1, 3), 0, 0, 0, 0),
    OP_SHAPE_ROW("concat_axis0", TP_OP_CONCAT, 2, 2, OPV(2, 3), 2, OPV(4, 3), 0, OPV(0), OPV(0), 2, OPV(6, 3), 0, 0, -1, 1),
    OP_SHAPE_ROW("concat_axis1", TP_OP_CONCAT, 2, 3, OPV(3, 2, 4), 3, OPV(3, 5, 4), 1, OPV(0), OPV(0), 3, OPV(3, 7, 4), 0, 0, -1, 1),
    OP_SHAPE_ROW("concat_axis2", TP_OP_CONCAT, 2, 3, OPV(2, 3, 4), 3, OPV(2, 3, 1), 2, OPV(0), OPV(0), 3, OPV(2, 3, 5), 0, 0, -1, 1),
    OP_SHAPE_ROW("concat_last_4d", TP_OP_CONCAT, 2, 4, OPV(2, 1, 3, 2), 4, OPV(2, 1, 3, 5), 3, OPV(0), OPV(0), 4, OPV(2, 1, 3, 7), 0, 0, -1, 1),
    OP_SHAPE_ROW("pad_2d", TP_OP_PAD, 1, 2, OPV(3, 4), 0, OPV(0), 0, OPV(1, 0), OPV(2, 3), 2, OPV(6, 7), 0.5f, 0, 0, 0),
    OP_SHAPE_ROW("pad_4d_spatial", TP_OP_PAD, 1, 4, OPV(2, 3, 4, 5), 0, OPV(0), 0, OPV(0, 0, 1, 2), OPV(0, 0, 2, 1), 4, OPV(2, 3, 7, 8), 0, 0, 0, 0),
    OP_SHAPE_ROW("pad_1d", TP_OP_PAD, 1, 1, OPV(5), 0, OPV(0), 0, OPV(3), OPV(0), 1, OPV(8), -1.0f, 0, 0, 0),
    OP_SHAPE_ROW("broadcast_to_trailing", TP_OP_BROADCAST_TO, 1, 1, OPV(3), 0, OPV(0), 0, OPV(0), OPV(0), 3, OPV(4, 2, 3), 0, 0, 0, 0),
    OP_SHAPE_ROW("broadcast_to_inner", TP_OP_BROADCAST_TO, 1, 3, OPV(3, 1, 5), 0, OPV(0), 0, OPV(0), OPV(0), 3, OPV(3, 4, 5), 0, 0, 0, 0),
    OP_SHAPE_ROW("broadcast_to_both", TP_OP_BROADCAST_TO, 1, 3, OPV(1, 4, 1), 0, OPV(0), 0, OPV(0), OPV(0), 4, OPV(2, 5, 4, 3), 0, 0, 0, 0),
    OP_SHAPE_ROW("broadcast_to_scalar", TP_OP_BROADCAST_TO, 1, 0, OPV(0), 0, OPV(0), 0, OPV(0), OPV(0), 2, OPV(2, 3), 0, 0, 0, 0),
    OP_SHAPE_ROW("gather_rows_2d_indices", TP_OP_GATHER, 2, 2, OPV(10, 4), 2, OPV(3, 5), 0, OPV(0), OPV(0), 3, OPV(3, 5, 4), 0, 2, 0, 10),
    OP_SHAPE_ROW("gather_rows_repeated", TP_OP_GATHER, 2, 2, OPV(3, 6), 1, OPV(9), 0, OPV(0), OPV(0), 2, OPV(9, 6), 0, 2, 0, 3),
    OP_SHAPE_ROW("gather_rows_3d_table", TP_OP_GATHER, 2, 3, OPV(5, 2, 3), 1, OPV(4), 0, OPV(0), OPV(0), 3, OPV(4, 2, 3), 0, 2, 0, 5),
    OP_SHAPE_ROW("gather_rows_batch1", TP_OP_GATHER, 2, 2, OPV(3, 8), 2, OPV(1, 1), 0, OPV(0), OPV(0), 3, OPV(1, 1, 8), 0, 2, 0, 3),
    {.label = "one_hot_2d", .kind = TP_OP_ONE_HOT, .ninputs = 1, .nd = {2}, .d = {{2, 5}},
     .lo = {0}, .hi = {6}, .ynd = 3, .yd = {2, 5, 6}, .ints = 1},
    {.label = "one_hot_1d", .kind = TP_OP_ONE_HOT, .ninputs = 1, .nd = {1}, .d = {{7}},
     .lo = {0}, .hi = {3}, .ynd = 2, .yd = {7, 3}, .ints = 1},
    /* pooling (oneDNN's or ops_cpu.c's, dnnl_ops.h): max moves values
     * (its gradient sums where windows overlap), average sums a window */
    OP_POOL_ROW("max_pool_2x2", TP_OP_MAX_POOL, 2, 3, 6, 8, 2, 2, 0, 1e-6f, 1e-6f),
    OP_POOL_ROW("max_pool_3s2p1", TP_OP_MAX_POOL, 2, 3, 7, 6, 3, 2, 1, 1e-6f, 1e-6f),
    OP_POOL_ROW("max_pool_odd", TP_OP_MAX_POOL, 1, 2, 5, 7, 2, 2, 0, 1e-6f, 1e-6f),
    OP_POOL_ROW("avg_pool_2x2", TP_OP_AVG_POOL, 2, 3, 6, 8, 2, 2, 0, 1e-6f, 1e-5f),
    OP_POOL_ROW("avg_pool_3s2p1", TP_OP_AVG_POOL, 2, 3, 7, 6, 3, 2, 1, 1e-6f, 1e-5f),
    OP_POOL_ROW("avg_pool_3s1p1", TP_OP_AVG_POOL, 2, 2, 5, 5, 3, 1, 1, 1e-6f, 1e-5f),
    /* the convolution family: sums of up to a few hundred products */
    OP_CONV_ROW("conv2d_plain", TP_OP_CONV2D, 2, 3, 7, 6, 4, 3, 3, 3, 1, 1, 1, 1, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_dilated", TP_OP_CONV2D, 2, 3, 9, 8, 4, 3, 3, 3, 1, 2, 2, 1, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_dilated_strided", TP_OP_CONV2D, 3, 2, 11, 10, 3, 2, 3, 2, 2, 1, 3, 1, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_groups", TP_OP_CONV2D, 2, 6, 5, 7, 4, 3, 3, 3, 2, 1, 1, 2, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_depthwise", TP_OP_CONV2D, 2, 4, 6, 6, 8, 1, 3, 3, 1, 1, 1, 4, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_1x1_groups", TP_OP_CONV2D, 2, 4, 3, 5, 6, 2, 1, 1, 1, 0, 1, 2, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_batch1", TP_OP_CONV2D, 1, 1, 5, 5, 2, 1, 2, 2, 2, 0, 1, 1, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_transpose", TP_OP_CONV_TRANSPOSE, 2, 4, 4, 4, 4, 3, 4, 4, 2, 1, 1, 1, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_transpose_outpad", TP_OP_CONV_TRANSPOSE, 2, 3, 3, 5, 3, 2, 3, 3, 2, 1, 1, 1, 1, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_transpose_odd", TP_OP_CONV_TRANSPOSE, 3, 2, 3, 2, 2, 3, 3, 2, 3, 0, 1, 1, 2, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_transpose_dilated", TP_OP_CONV_TRANSPOSE, 2, 3, 4, 3, 3, 2, 3, 3, 2, 2, 2, 1, 1, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_transpose_groups", TP_OP_CONV_TRANSPOSE, 2, 4, 3, 3, 4, 3, 2, 3, 1, 0, 1, 2, 0, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_transpose_depthwise", TP_OP_CONV_TRANSPOSE, 2, 3, 4, 4, 3, 1, 3, 3, 2, 1, 1, 3, 1, 1e-5f, 1e-4f),
    OP_CONV_ROW("conv2d_transpose_1x1_batch1", TP_OP_CONV_TRANSPOSE, 1, 3, 4, 5, 3, 2, 1, 1, 1, 0, 1, 1, 0, 1e-5f, 1e-4f),
    OP_UPSAMPLE_ROW("upsample_nearest_2", TP_OP_UPSAMPLE_NEAREST, 2, 3, 4, 5, 2, 0, 1e-6f, 1e-6f),
    OP_UPSAMPLE_ROW("upsample_nearest_3_batch1", TP_OP_UPSAMPLE_NEAREST, 1, 2, 3, 1, 3, 0, 1e-6f, 1e-6f),
    OP_UPSAMPLE_ROW("upsample_bilinear_2", TP_OP_UPSAMPLE_BILINEAR, 2, 3, 4, 5, 2, 0, 1e-6f, 1e-5f),
    OP_UPSAMPLE_ROW("upsample_bilinear_3_odd", TP_OP_UPSAMPLE_BILINEAR, 1, 2, 3, 7, 3, 0, 1e-6f, 1e-5f),
    OP_UPSAMPLE_ROW("upsample_bilinear_align_corners", TP_OP_UPSAMPLE_BILINEAR, 2, 2, 4, 3, 2, 1, 1e-6f, 1e-5f),
    OP_UPSAMPLE_ROW("upsample_bilinear_align_corners_1px", TP_OP_UPSAMPLE_BILINEAR, 1, 2, 1, 3, 4, 1, 1e-6f, 1e-5f),
    OP_UPSAMPLE_ROW("upsample_bilinear_factor1", TP_OP_UPSAMPLE_BILINEAR, 1, 2, 3, 3, 1, 0, 1e-6f, 1e-5f),
    /* the linalg family. batch_matmul: alpha trans_a, beta trans_b; plain,
     * either or both transposed, b shared by every batch (one stacked
     * product), a shared, both stretched, rank 2, batch 1, odd sizes */
    OP_BMM_ROW("bmm_plain", 0, 0, 3, 3, OP_D(2, 3, 5), OP_D(2, 5, 4)),
    OP_BMM_ROW("bmm_trans_a", 1, 0, 3, 3, OP_D(2, 5, 3), OP_D(2, 5, 4)),
    OP_BMM_ROW("bmm_trans_b", 0, 1, 3, 3, OP_D(2, 3, 5), OP_D(2, 4, 5)),
    OP_BMM_ROW("bmm_trans_both", 1, 1, 3, 3, OP_D(2, 5, 3), OP_D(2, 4, 5)),
    OP_BMM_ROW("bmm_b_shared", 0, 0, 4, 2, OP_D(3, 2, 7, 5), OP_D(5, 6)),
    OP_BMM_ROW("bmm_b_shared_trans", 1, 1, 3, 2, OP_D(2, 5, 3), OP_D(6, 5)),
    OP_BMM_ROW("bmm_a_shared", 0, 0, 2, 3, OP_D(3, 5), OP_D(4, 5, 2)),
    OP_BMM_ROW("bmm_both_stretched", 0, 1, 4, 4, OP_D(2, 1, 3, 5), OP_D(1, 3, 4, 5)),
    OP_BMM_ROW("bmm_rank2_odd", 0, 0, 2, 2, OP_D(7, 13), OP_D(13, 3)),
    OP_BMM_ROW("bmm_batch1_vectors", 0, 0, 3, 3, OP_D(1, 1, 6), OP_D(1, 6, 1)),
    /* 1-d operands (torch.matmul's promotion; the vector never transposed) */
    OP_BMM_ROW("bmm_1d_left", 0, 0, 1, 3, OP_D(5), OP_D(2, 5, 4)),
    OP_BMM_ROW("bmm_1d_left_trans_b", 0, 1, 1, 3, OP_D(5), OP_D(3, 4, 5)),
    OP_BMM_ROW("bmm_1d_right", 0, 0, 3, 1, OP_D(2, 3, 5), OP_D(5)),
    OP_BMM_ROW("bmm_1d_right_trans_a", 1, 0, 4, 1, OP_D(2, 1, 5, 3), OP_D(5)),
    OP_BMM_ROW("bmm_1d_matrix", 0, 0, 1, 2, OP_D(13), OP_D(13, 3)),
    OP_BMM_ROW("bmm_1d_dot", 0, 0, 1, 1, OP_D(7), OP_D(7)),
    OP_BMM_ROW("bmm_1d_batch1", 0, 0, 3, 1, OP_D(1, 1, 6), OP_D(6)),
    /* the norms: alpha eps, beta layer norm's axes or group norm's groups
     * (instance norm: C); gamma around 1, beta around 0 */
    OP_NORM_ROW("layer_norm_last", TP_OP_LAYER_NORM, 1e-5f, 1, 2, 1, OP_D(4, 7), OP_D(7)),
    OP_NORM_ROW("layer_norm_2_axes", TP_OP_LAYER_NORM, 1e-5f, 2, 3, 2, OP_D(3, 4, 5), OP_D(4, 5)),
    OP_NORM_ROW("layer_norm_batch1_eps", TP_OP_LAYER_NORM, 0.1f, 1, 3, 1, OP_D(1, 1, 9), OP_D(9)),
    OP_NORM_ROW("group_norm_4d", TP_OP_GROUP_NORM, 1e-5f, 3, 4, 1, OP_D(2, 6, 3, 3), OP_D(6)),
    OP_NORM_ROW("group_norm_2d", TP_OP_GROUP_NORM, 1e-5f, 2, 2, 1, OP_D(3, 4), OP_D(4)),
    OP_NORM_ROW("group_norm_1_group", TP_OP_GROUP_NORM, 1e-5f, 1, 3, 1, OP_D(2, 4, 5), OP_D(4)),
    OP_NORM_ROW("group_norm_batch1_odd", TP_OP_GROUP_NORM, 1e-3f, 2, 4, 1, OP_D(1, 6, 5, 3), OP_D(6)),
    OP_NORM_ROW("instance_norm_4d", TP_OP_INSTANCE_NORM, 1e-5f, 0, 4, 1, OP_D(2, 3, 4, 5), OP_D(3)),
    OP_NORM_ROW("instance_norm_3d", TP_OP_INSTANCE_NORM, 1e-5f, 0, 3, 1, OP_D(3, 2, 7), OP_D(2)),
    OP_NORM_ROW("instance_norm_batch1", TP_OP_INSTANCE_NORM, 1e-5f, 0, 4, 1, OP_D(1, 4, 3, 3), OP_D(4)),
    /* elementwise_affine=False, and one parameter alone */
    OP_NORM_ROW_NO("layer_norm_plain", TP_OP_LAYER_NORM, 1e-5f, 2, 3, 2, OP_D(3, 4, 5), OP_D(4, 5), 3),
    OP_NORM_ROW_NO("layer_norm_gamma_only", TP_OP_LAYER_NORM, 1e-5f, 1, 2, 1, OP_D(4, 7), OP_D(7), 2),
    OP_NORM_ROW_NO("layer_norm_beta_only", TP_OP_LAYER_NORM, 1e-5f, 1, 2, 1, OP_D(4, 7), OP_D(7), 1),
    OP_NORM_ROW_NO("group_norm_plain", TP_OP_GROUP_NORM, 1e-5f, 3, 4, 1, OP_D(2, 6, 3, 3), OP_D(6), 3),
    OP_NORM_ROW_NO("group_norm_beta_only", TP_OP_GROUP_NORM, 1e-5f, 2, 3, 1, OP_D(3, 4, 5), OP_D(4), 1),
    OP_NORM_ROW_NO("group_norm_gamma_only", TP_OP_GROUP_NORM, 1e-5f, 2, 4, 1, OP_D(1, 6, 5, 3), OP_D(6), 2),
    OP_NORM_ROW_NO("instance_norm_plain", TP_OP_INSTANCE_NORM, 1e-5f, 0, 4, 1, OP_D(2, 3, 4, 5), OP_D(3), 3),
    OP_NORM_ROW_NO("instance_norm_gamma_only", TP_OP_INSTANCE_NORM, 1e-5f, 0, 3, 1, OP_D(3, 2, 7), OP_D(2), 2),
    /* the reduce family: over the last, the first (kept), two apart, two
     * around a size-1 axis, every axis, batch 1 */
    OP_REDUCE_ROWS("reduce_sum", TP_OP_REDUCE_SUM, 1e-6f, 1e-5f),
    OP_REDUCE_ROWS("reduce_mean", TP_OP_REDUCE_MEAN, 1e-6f, 1e-5f),
    OP_REDUCE_ROWS("reduce_max", TP_OP_REDUCE_MAX, 0, 1e-6f),
    /* inputs on a grid of 0.5 in [-1,1]: tied maxima share the gradient */
    OP_REDUCE_ROW("reduce_max_ties", TP_OP_REDUCE_MAX, 2, 6, 8, 0, 0, 2, 0, -1, 1, 0, 1e-6f, 0.5f),
    OP_REDUCE_ROW("reduce_max_ties_all", TP_OP_REDUCE_MAX, 2, 5, 3, 0, 0, 3, 1, -1, 1, 0, 1e-6f, 0.5f),
    /* argmax: an int32 index, exact (tolerance 0); ties take the first */
    OP_REDUCE_ROW("argmax_mid", TP_OP_ARGMAX, 3, 3, 5, 7, 0, 2, 0, -2, 2, 0, 0, 0),
    OP_REDUCE_ROW("argmax_last_keep", TP_OP_ARGMAX, 2, 4, 9, 0, 0, 2, 1, -2, 2, 0, 0, 0),
    OP_REDUCE_ROW("argmax_first", TP_OP_ARGMAX, 2, 6, 5, 0, 0, 1, 0, -2, 2, 0, 0, 0),
    OP_REDUCE_ROW("argmax_ties", TP_OP_ARGMAX, 2, 8, 6, 0, 0, 2, 0, -1, 1, 0, 0, 0.5f),
    /* softmax and log-softmax along the last, a middle and the first axis,
     * batch 1, a single element, logits far past e^x's range */
    OP_REDUCE_ROW("softmax_last", TP_OP_SOFTMAX, 2, 4, 9, 0, 0, 2, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("softmax_mid", TP_OP_SOFTMAX, 3, 3, 5, 7, 0, 2, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("softmax_first", TP_OP_SOFTMAX, 4, 3, 2, 4, 5, 1, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("softmax_batch1", TP_OP_SOFTMAX, 2, 1, 13, 0, 0, 2, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("softmax_single", TP_OP_SOFTMAX, 1, 1, 0, 0, 0, 1, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("softmax_large", TP_OP_SOFTMAX, 2, 4, 9, 0, 0, 2, 0, -200, 200, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("log_softmax_last", TP_OP_LOG_SOFTMAX, 2, 4, 9, 0, 0, 2, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("log_softmax_mid", TP_OP_LOG_SOFTMAX, 3, 3, 5, 7, 0, 2, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("log_softmax_first", TP_OP_LOG_SOFTMAX, 4, 3, 2, 4, 5, 1, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("log_softmax_batch1", TP_OP_LOG_SOFTMAX, 2, 1, 13, 0, 0, 2, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("log_softmax_single", TP_OP_LOG_SOFTMAX, 1, 1, 0, 0, 0, 1, 0, -3, 3, 1e-6f, 1e-5f, 0),
    OP_REDUCE_ROW("log_softmax_large", TP_OP_LOG_SOFTMAX, 2, 4, 9, 0, 0, 2, 0, -200, 200, 1e-5f, 1e-5f, 0),
    /* the sequence cross-entropy (alpha: the ignore label): [B,T,V]; class
     * 2 ignored (a padding token); rows [N,V] with V = 1000; [B,T,U,V];
     * batch 1 */
    OP_LABEL_ROW("softmax_xent_seq", TP_OP_SOFTMAX_XENT_SEQ, -100, 3, 2, 5, 7, 0, -3, 3, 1e-6f, 1e-5f),
    OP_LABEL_ROW("softmax_xent_seq_ignore", TP_OP_SOFTMAX_XENT_SEQ, 2, 3, 3, 6, 5, 0, -3, 3, 1e-6f, 1e-5f),
    OP_LABEL_ROW("softmax_xent_seq_v1000", TP_OP_SOFTMAX_XENT_SEQ, -100, 2, 6, 1000, 0, 0, -3, 3, 1e-6f, 1e-5f),
    OP_LABEL_ROW("softmax_xent_seq_4d", TP_OP_SOFTMAX_XENT_SEQ, -100, 4, 2, 3, 2, 5, -3, 3, 1e-6f, 1e-5f),
    OP_LABEL_ROW("softmax_xent_seq_batch1", TP_OP_SOFTMAX_XENT_SEQ, -1, 3, 1, 1, 11, 0, -3, 3, 1e-6f, 1e-5f),
    /* the existing softmax_xent at class counts other than 10 (alpha:
     * label smoothing), K = 1 included */
    OP_LABEL_ROW("softmax_xent_k3", TP_OP_SOFTMAX_XENT, 0, 2, 8, 3, 0, 0, -3, 3, 1e-6f, 1e-5f),
    OP_LABEL_ROW("softmax_xent_k1000", TP_OP_SOFTMAX_XENT, 0, 2, 5, 1000, 0, 0, -3, 3, 1e-6f, 1e-5f),
    OP_LABEL_ROW("softmax_xent_k1", TP_OP_SOFTMAX_XENT, 0, 2, 4, 1, 0, 0, -3, 3, 1e-6f, 1e-5f),
    OP_LABEL_ROW("softmax_xent_k37_smoothed", TP_OP_SOFTMAX_XENT, 0.1f, 2, 9, 37, 0, 0, -3, 3, 1e-6f, 1e-5f),
    /* top-k accuracy (alpha: k): forward only, exact */
    OP_LABEL_ROW("top_k_accuracy_k3", TP_OP_TOP_K_ACCURACY, 3, 2, 40, 10, 0, 0, -2, 2, 0, 0),
    OP_LABEL_ROW("top_k_accuracy_k1", TP_OP_TOP_K_ACCURACY, 1, 2, 17, 5, 0, 0, -2, 2, 0, 0),
    OP_LABEL_ROW("top_k_accuracy_all", TP_OP_TOP_K_ACCURACY, 4, 2, 9, 4, 0, 0, -2, 2, 0, 0),
    OP_LABEL_ROW("top_k_accuracy_batch1", TP_OP_TOP_K_ACCURACY, 2, 2, 1, 6, 0, 0, -2, 2, 0, 0),
    /* fused attention (alpha: the scale, beta: causal): q [...,Tq,D], k and v
     * [...,Tk,D]; one tile (T 17), several tiles with a causal diagonal
     * that is not a tile edge (T 150, tiles of 64), non-causal with its own
     * scale, more keys than queries, rank 3; D 40 and 64 (the CPU's
     * 32-column blocks, with an 8-column edge at 40). Sums of D and of Tk order
     * differently from torch's: 1e-5 + 1e-4 relative. */
    OP_ATTN_ROW("attention_causal", 0.35355339f, 1, 4, OPV(2, 3, 17, 8), OPV(2, 3, 17, 8)),
    OP_ATTN_ROW("attention_causal_tiles", 0.25f, 1, 4, OPV(1, 2, 150, 16), OPV(1, 2, 150, 16)),
    OP_ATTN_ROW("attention_full", 0.5f, 0, 4, OPV(2, 2, 9, 8), OPV(2, 2, 9, 8)),
    OP_ATTN_ROW("attention_cross", 0.35355339f, 0, 4, OPV(2, 1, 5, 8), OPV(2, 1, 70, 8)),
    OP_ATTN_ROW("attention_rank3_causal", 0.5f, 1, 3, OPV(3, 20, 4), OPV(3, 20, 4)),
    OP_ATTN_ROW("attention_causal_d40", 0.15811388f, 1, 4, OPV(1, 2, 90, 40), OPV(1, 2, 90, 40)),
    OP_ATTN_ROW("attention_full_d64", 0.125f, 0, 4, OPV(1, 1, 33, 64), OPV(1, 1, 33, 64)),
    /* the packed form: heads read at a stride of 3C in place, the output
     * and qkv's gradient written at C and 3C; one tile, three tiles with
     * D 24 (off the 16-column blocks), rank 4 not causal */
    OP_ATTN_QKV_ROW("attention_packed_causal", 0.35355339f, 1, 2, 3, OPV(2, 17, 48)),
    OP_ATTN_QKV_ROW("attention_packed_tiles", 0.20412415f, 1, 3, 3, OPV(1, 150, 216)),
    OP_ATTN_QKV_ROW("attention_packed_full_rank4", 0.5f, 0, 2, 4, OPV(2, 2, 9, 24)),
};
#pragma GCC diagnostic pop

#define OP_NCASES ((int)(sizeof op_cases / sizeof op_cases[0]))

/* The reduce family: 1 for the ops whose input 1 is int32 labels in
 * [0, V), V input 0's last dim. */
static inline int op_case_labels(tp_op_kind_t k) {
    return k == TP_OP_SOFTMAX_XENT || k == TP_OP_SOFTMAX_XENT_SEQ ||
           k == TP_OP_TOP_K_ACCURACY;
}
/* The row's attr.axes: alpha for reductions, argmax and the softmaxes. */
static inline int op_case_axes(const op_case_t *k) {
    return k->kind == TP_OP_REDUCE_SUM || k->kind == TP_OP_REDUCE_MEAN ||
                   k->kind == TP_OP_REDUCE_MAX || k->kind == TP_OP_ARGMAX ||
                   k->kind == TP_OP_SOFTMAX || k->kind == TP_OP_LOG_SOFTMAX
               ? (int)k->alpha
               : 0;
}

/* 1 for the convolution family's rows. */
static inline int op_case_conv(const op_case_t *k) {
    return k->kind == TP_OP_CONV2D || k->kind == TP_OP_CONV_TRANSPOSE ||
           k->kind == TP_OP_UPSAMPLE_NEAREST || k->kind == TP_OP_UPSAMPLE_BILINEAR;
}

static inline tp_shape_t op_case_in(const op_case_t *k, int p);

/* The output shape of a row: its inputs broadcast (NumPy's rule); a
 * loss's is a scalar; the convolution family's as its builders say. */
static inline tp_shape_t op_case_out(const op_case_t *k) {
    tp_shape_t o = {0};
    if (k->ynd > 0) { /* the shape family's rows say it */
        o.ndim = k->ynd;
        for (int j = 0; j < k->ynd; j++)
            o.d[j] = k->yd[j];
        return o;
    }
    if (k->kind == TP_OP_MAX_POOL || k->kind == TP_OP_AVG_POOL) { /* as tp_max_pool's */
        const int64_t *x = k->d[0], win = (int64_t)k->alpha, s = k->stride, p = k->pad;
        o.ndim = 4;
        o.d[0] = x[0];
        o.d[1] = x[1];
        o.d[2] = (x[2] + 2 * p - win) / s + 1;
        o.d[3] = (x[3] + 2 * p - win) / s + 1;
        return o;
    }
    if (op_case_conv(k)) {
        const int64_t *x = k->d[0], *w = k->d[1];
        const int64_t s = k->stride, p = k->pad, dl = k->dilation;
        o.ndim = 4;
        o.d[0] = x[0];
        if (k->kind == TP_OP_CONV2D) {
            o.d[1] = w[0];
            o.d[2] = (x[2] + 2 * p - dl * (w[2] - 1) - 1) / s + 1;
            o.d[3] = (x[3] + 2 * p - dl * (w[3] - 1) - 1) / s + 1;
        } else if (k->kind == TP_OP_CONV_TRANSPOSE) {
            o.d[1] = w[1] * k->groups;
            o.d[2] = (x[2] - 1) * s - 2 * p + dl * (w[2] - 1) + k->out_pad + 1;
            o.d[3] = (x[3] - 1) * s - 2 * p + dl * (w[3] - 1) + k->out_pad + 1;
        } else {
            o.d[1] = x[1];
            o.d[2] = x[2] * s;
            o.d[3] = x[3] * s;
        }
        return o;
    }
    if (k->kind == TP_OP_MSE || k->kind == TP_OP_L1_LOSS ||
        k->kind == TP_OP_HUBER_LOSS || k->kind == TP_OP_SIGMOID_XENT)
        return o;
    /* the reduce family: label ops give a scalar, reductions drop or keep
     * their axes, the softmaxes keep the shape */
    if (op_case_labels(k->kind))
        return o;
    if (k->kind == TP_OP_REDUCE_SUM || k->kind == TP_OP_REDUCE_MEAN ||
        k->kind == TP_OP_REDUCE_MAX || k->kind == TP_OP_ARGMAX) {
        for (int j = 0; j < k->nd[0]; j++)
            if (!(op_case_axes(k) & (1 << j)))
                o.d[o.ndim++] = k->d[0][j];
            else if (k->beta != 0)
                o.d[o.ndim++] = 1;
        return o;
    }
    /* the linalg family: a norm keeps x's shape; a batched matmul
     * broadcasts the batch dims and ends in [M, N] */
    if (k->kind == TP_OP_LAYER_NORM || k->kind == TP_OP_GROUP_NORM ||
        k->kind == TP_OP_INSTANCE_NORM) {
        o.ndim = k->nd[0];
        for (int j = 0; j < o.ndim; j++)
            o.d[j] = k->d[0][j];
        return o;
    }
    if (k->kind == TP_OP_ATTENTION) { /* q's shape; the packed form's C of 3C */
        o = op_case_in(k, 0);
        if (k->heads > 0)
            o.d[o.ndim - 1] /= 3;
        return o;
    }
    if (k->kind == TP_OP_BATCH_MATMUL) {
        /* a 1-d operand counts as rank 2 and its dim of 1 is dropped */
        const int ra = k->nd[0], rb = k->nd[1];
        const int ea = ra < 2 ? 2 : ra, eb = rb < 2 ? 2 : rb, r = ea > eb ? ea : eb;
        for (int j = 0; j < r - 2; j++) {
            const int ia = j - (r - ea), ib = j - (r - eb);
            const int64_t da = ia >= 0 ? k->d[0][ia] : 1, db = ib >= 0 ? k->d[1][ib] : 1;
            o.d[j] = da == 1 ? db : da;
        }
        o.ndim = r - 2;
        if (ra > 1)
            o.d[o.ndim++] = k->d[0][ra - 2 + (k->alpha != 0)];
        if (rb > 1)
            o.d[o.ndim++] = k->d[1][rb - 1 - (k->beta != 0)];
        return o;
    }
    for (int p = 0; p < k->ninputs; p++)
        if (k->nd[p] > o.ndim)
            o.ndim = k->nd[p];
    for (int j = 0; j < o.ndim; j++) {
        o.d[j] = 1;
        for (int p = 0; p < k->ninputs; p++) {
            const int ip = j - (o.ndim - k->nd[p]);
            if (ip >= 0 && k->d[p][ip] != 1)
                o.d[j] = k->d[p][ip];
        }
    }
    return o;
}

/* The attributes of a row into a (zeroed by the caller), as its builder
 * would set them: alpha and beta, the linalg family's from them
 * (batch_matmul's transposes, the norms' eps, axes and groups), the shape
 * family's axis and dims, the convolution family's window. */
static inline void op_case_attr(const op_case_t *k, tp_op_attr_t *a) {
    a->alpha = k->alpha;
    a->beta = k->beta;
    a->heads = k->heads; /* the packed attention */
    a->axes = op_case_axes(k); /* the reduce family */
    switch (k->kind) {
    case TP_OP_BATCH_MATMUL:
        a->trans_a = k->alpha != 0;
        a->trans_b = k->beta != 0;
        break;
    case TP_OP_LAYER_NORM:
        a->eps = k->alpha;
        a->norm_axes = (int)k->beta;
        a->norm_absent = k->absent;
        break;
    case TP_OP_GROUP_NORM:
    case TP_OP_INSTANCE_NORM:
        a->eps = k->alpha;
        a->norm_absent = k->absent;
        a->norm_groups = k->kind == TP_OP_GROUP_NORM ? (int)k->beta : (int)k->d[0][1];
        break;
    default:
        break;
    }
    /* the shape family */
    a->axis = k->axis;
    memcpy(a->dims_a, k->a, sizeof k->a);
    memcpy(a->dims_b, k->b, sizeof k->b);
    if (k->kind == TP_OP_MAX_POOL || k->kind == TP_OP_AVG_POOL) { /* the window */
        a->kh = a->kw = (int)k->alpha;
        a->sh = a->sw = k->stride;
        a->ph = a->pw = k->pad;
    }
    if (op_case_conv(k)) { /* the convolution family */
        a->kh = (int)k->d[1][2];
        a->kw = (int)k->d[1][3];
        a->sh = a->sw = k->stride;
        a->ph = a->pw = k->pad;
        a->dh = a->dw = k->dilation;
        a->groups = k->groups;
        a->oph = a->opw = k->out_pad;
        a->align_corners = k->align;
    }
}

static inline tp_shape_t op_case_in(const op_case_t *k, int p) {
    tp_shape_t s = {.ndim = k->nd[p]};
    for (int j = 0; j < k->nd[p]; j++)
        s.d[j] = k->d[p][j];
    return s;
}

#endif
