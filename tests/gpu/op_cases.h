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
#include <towerpack/backend.h>

typedef struct {
    const char *label;     /* unique: the row's files are named after it */
    tp_op_kind_t kind;
    float alpha, beta;     /* attributes (tp_op_attr_t) */
    int ninputs;
    int nd[2];             /* input ranks */
    int64_t d[2][4];       /* input shapes */
    float lo[2], hi[2];    /* inputs drawn from U(lo, hi) */
    float atol, rtol;      /* against PyTorch: |got - want| <= atol + rtol |want| */
    float step;            /* > 0: inputs rounded to multiples of it (ties) */
} op_case_t;


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
};

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

/* The output shape of a row: its inputs broadcast (NumPy's rule); a
 * loss's is a scalar. */
static inline tp_shape_t op_case_out(const op_case_t *k) {
    tp_shape_t o = {0};
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

static inline tp_shape_t op_case_in(const op_case_t *k, int p) {
    tp_shape_t s = {.ndim = k->nd[p]};
    for (int j = 0; j < k->nd[p]; j++)
        s.d[j] = k->d[p][j];
    return s;
}

#endif
