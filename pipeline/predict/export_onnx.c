/* towerpack pipeline: a predictor's graph as an ONNX model.
 *
 * The messages are ONNX's own schema (Debian's /usr/include/onnx/onnx.proto)
 * compiled to C by protoc-c at build time; protobuf-c encodes them. The
 * graph is the predictor's pruned inference graph, walked in its
 * topological order: inputs become graph inputs with a symbolic batch
 * dimension ("batch"), variables become initializers, and each op node one
 * ONNX node (a few two: the cast of uint8 images is Cast then Mul, a global
 * average pool is GlobalAveragePool then Flatten). Batch norm is
 * BatchNormalization in inference form on the moving averages; dropout is
 * the identity and vanishes; a matmul followed by its bias is one Gemm. The
 * ops used are those OpenCV's DNN importer knows, at opset 13. An op with
 * no ONNX form (the losses and metrics) fails, naming the op and node. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/fileio.h>
#include <towerpack/predict.h>
#include "onnx.pb-c.h"

#define S_OPSET 13
#define S_IR_VERSION 7 /* the IR version of opset 13 (ONNX 1.8) */

typedef struct {
    void **allocs;         /* everything below, freed at the end */
    size_t nallocs, capallocs;
    Onnx__NodeProto **nodes;
    size_t nnodes, capnodes;
    Onnx__TensorProto **inits;
    size_t ninits, capinits;
    tp_model_t *m;
    const tp_onnx_export_opts_t *o;  /* may be NULL */
} s_ex_t;

static void *s_keep(s_ex_t *ex, void *p) {
    if (!p)
        return NULL;
    if (ex->nallocs == ex->capallocs) {
        size_t cap = ex->capallocs ? ex->capallocs * 2 : 256;
        void **a = realloc(ex->allocs, cap * sizeof *a);
        if (!a) {
            free(p);
            return NULL;
        }
        ex->allocs = a;
        ex->capallocs = cap;
    }
    return ex->allocs[ex->nallocs++] = p;
}

static void *s_new(s_ex_t *ex, size_t size) { return s_keep(ex, calloc(1, size ? size : 1)); }
static char *s_str(s_ex_t *ex, const char *s) { return s_keep(ex, strdup(s)); }

static int s_push(s_ex_t *ex, void ***arr, size_t *n, size_t *cap, void *item) {
    if (!item)
        return 0;
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        void **a = realloc(*arr, c * sizeof *a);
        if (!a)
            return 0;
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = item;
    return 1;
}

#define NOMEM() tp_error(TP_ERR_NOMEM, "ONNX export")

static Onnx__NodeProto *s_node(s_ex_t *ex, const char *op, const char *out,
                               int nin, const char *const *ins) {
    Onnx__NodeProto *n = s_new(ex, sizeof *n);
    if (!n)
        return NULL;
    onnx__node_proto__init(n);
    n->op_type = s_str(ex, op);
    n->name = s_str(ex, out);
    n->n_input = (size_t)nin;
    n->input = s_new(ex, sizeof(char *) * (size_t)(nin ? nin : 1));
    n->n_output = 1;
    n->output = s_new(ex, sizeof(char *));
    if (!n->op_type || !n->name || !n->input || !n->output)
        return NULL;
    for (int i = 0; i < nin; i++)
        if (!(n->input[i] = s_str(ex, ins[i])))
            return NULL;
    if (!(n->output[0] = s_str(ex, out)))
        return NULL;
    if (!s_push(ex, (void ***)&ex->nodes, &ex->nnodes, &ex->capnodes, n))
        return NULL;
    return n;
}

/* A new attribute `name` of `type` on node n, its value for the caller to
 * set; NULL on failure, or when n is NULL (a node that could not be made:
 * its error is set, and a caller's chain of attributes ends there). */
static Onnx__AttributeProto *s_attr(s_ex_t *ex, Onnx__NodeProto *n, const char *name,
                                    Onnx__AttributeProto__AttributeType type) {
    if (!n)
        return NULL;
    Onnx__AttributeProto *a = s_new(ex, sizeof *a);
    Onnx__AttributeProto **arr = s_new(ex, sizeof *arr * (n->n_attribute + 1));
    if (!a || !arr)
        return NULL;
    onnx__attribute_proto__init(a);
    if (!(a->name = s_str(ex, name)))
        return NULL;
    a->has_type = 1;
    a->type = type;
    if (n->n_attribute)
        memcpy(arr, n->attribute, sizeof *arr * n->n_attribute);
    arr[n->n_attribute++] = a;
    n->attribute = arr;
    return a;
}

static int s_attr_i(s_ex_t *ex, Onnx__NodeProto *n, const char *name, int64_t v) {
    Onnx__AttributeProto *a = s_attr(ex, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (!a)
        return 0;
    a->has_i = 1;
    a->i = v;
    return 1;
}

static int s_attr_f(s_ex_t *ex, Onnx__NodeProto *n, const char *name, float v) {
    Onnx__AttributeProto *a = s_attr(ex, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (!a)
        return 0;
    a->has_f = 1;
    a->f = v;
    return 1;
}

static int s_attr_ints(s_ex_t *ex, Onnx__NodeProto *n, const char *name,
                       const int64_t *v, int count) {
    Onnx__AttributeProto *a = s_attr(ex, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    int64_t *vals = s_new(ex, sizeof *vals * (size_t)count);
    if (!a || !vals)
        return 0;
    memcpy(vals, v, sizeof *vals * (size_t)count);
    a->n_ints = (size_t)count;
    a->ints = vals;
    return 1;
}

static int s_attr_str(s_ex_t *ex, Onnx__NodeProto *n, const char *name, const char *v) {
    Onnx__AttributeProto *a = s_attr(ex, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    char *sv = s_str(ex, v);
    if (!a || !sv)
        return 0;
    a->has_s = 1;
    a->s.data = (uint8_t *)sv;
    a->s.len = strlen(sv);
    return 1;
}

/* A Transpose of `in` (rank r) swapping its axes a and a + 1, into
 * `out`; 1 on success. */
static int s_transpose_pair(s_ex_t *ex, const char *out, const char *in, int r, int a) {
    int64_t perm[TP_MAX_DIMS + 1];
    for (int d = 0; d < r; d++)
        perm[d] = d;
    perm[a] = a + 1;
    perm[a + 1] = a;
    const char *ti[1] = {in};
    Onnx__NodeProto *n = s_node(ex, "Transpose", out, 1, ti);
    return n && s_attr_ints(ex, n, "perm", perm, r);
}

/* An initializer from host bytes (copied). */
static int s_init(s_ex_t *ex, const char *name, int32_t type, int ndim,
                  const int64_t *dims, const void *data, size_t bytes) {
    Onnx__TensorProto *t = s_new(ex, sizeof *t);
    int64_t *d = s_new(ex, sizeof *d * (size_t)(ndim ? ndim : 1));
    void *raw = s_new(ex, bytes);
    if (!t || !d || !raw)
        return 0;
    onnx__tensor_proto__init(t);
    memcpy(d, dims, sizeof *d * (size_t)ndim);
    memcpy(raw, data, bytes);
    t->n_dims = (size_t)ndim;
    t->dims = d;
    t->has_data_type = 1;
    t->data_type = type;
    t->name = s_str(ex, name);
    t->has_raw_data = 1;
    t->raw_data.len = bytes;
    t->raw_data.data = raw;
    return t->name && s_push(ex, (void ***)&ex->inits, &ex->ninits, &ex->capinits, t);
}

/* A float initializer [n] of one value (the norms' left-out parameters). */
static int s_fill(s_ex_t *ex, const char *name, int64_t n, float v) {
    float *f = s_new(ex, sizeof *f * (size_t)(n ? n : 1));
    if (!f)
        return 0;
    for (int64_t i = 0; i < n; i++)
        f[i] = v;
    return s_init(ex, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, &n, f,
                  sizeof *f * (size_t)n);
}

static int s_init_var(s_ex_t *ex, tp_node_t *v, const char *as, int ndim,
                      const int64_t *dims) {
    tp_tensor_t view;
    if (tp_model_var(ex->m, tp_node_name(v), &view) < 0)
        return 0;
    void *host = s_new(ex, view.nbytes);
    const void *h = host ? tp_model_view_host(ex->m, &view, host, view.nbytes) : NULL;
    if (!h)
        return 0;
    return s_init(ex, as ? as : tp_node_name(v), ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT,
                  as ? ndim : view.ndim, as ? dims : view.shape, h, view.nbytes);
}

/* A [K,M] weight as the [M,K] initializer "<name>/T" for Gemm with
 * transB = 1 (the layout exporters use, and the one OpenCV's importer reads
 * the output count from). Returns the name, or NULL. */
static const char *s_init_transposed(s_ex_t *ex, tp_node_t *w) {
    tp_tensor_t view;
    if (tp_model_var(ex->m, tp_node_name(w), &view) < 0 || view.ndim != 2)
        return NULL;
    void *host = s_new(ex, view.nbytes);
    float *t = s_new(ex, view.nbytes);
    const float *h = host ? tp_model_view_host(ex->m, &view, host, view.nbytes) : NULL;
    char *name = s_new(ex, strlen(tp_node_name(w)) + 3);
    if (!h || !t || !name)
        return NULL;
    int64_t k = view.shape[0], m = view.shape[1], dims[2] = {m, k};
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < m; j++)
            t[j * k + i] = h[i * m + j];
    sprintf(name, "%s/T", tp_node_name(w));
    return s_init(ex, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, dims, t, view.nbytes)
               ? name : NULL;
}

static int32_t s_onnx_type(tp_dtype_t d) {
    switch (d) {
    case TP_FLOAT32: return ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    case TP_UINT8: return ONNX__TENSOR_PROTO__DATA_TYPE__UINT8;
    case TP_INT32: return ONNX__TENSOR_PROTO__DATA_TYPE__INT32;
    case TP_INT64: return ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    default: return ONNX__TENSOR_PROTO__DATA_TYPE__UNDEFINED;
    }
}

/* A graph input or output: dtype, dim 0 the symbolic batch when batched. */
static Onnx__ValueInfoProto *s_value_info(s_ex_t *ex, const char *name,
                                          tp_dtype_t dtype, int ndim,
                                          const int64_t *dims, int batched) {
    Onnx__ValueInfoProto *vi = s_new(ex, sizeof *vi);
    Onnx__TypeProto *tp = s_new(ex, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = s_new(ex, sizeof *tt);
    Onnx__TensorShapeProto *sh = s_new(ex, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dim = s_new(ex, sizeof *dim * (size_t)(ndim ? ndim : 1));
    if (!vi || !tp || !tt || !sh || !dim)
        return NULL;
    onnx__value_info_proto__init(vi);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    for (int k = 0; k < ndim; k++) {
        Onnx__TensorShapeProto__Dimension *d = s_new(ex, sizeof *d);
        if (!d)
            return NULL;
        onnx__tensor_shape_proto__dimension__init(d);
        if (k == 0 && batched) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            if (!(d->dim_param = s_str(ex, "batch")))
                return NULL;
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[k];
        }
        dim[k] = d;
    }
    sh->n_dim = (size_t)ndim;
    sh->dim = dim;
    tt->has_elem_type = 1;
    tt->elem_type = s_onnx_type(dtype);
    tt->shape = sh;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    vi->name = s_str(ex, name);
    vi->type = tp;
    return vi->name ? vi : NULL;
}

static int s_pool_attrs(s_ex_t *ex, Onnx__NodeProto *n, const tp_node_attrs_t *a) {
    int64_t k[2] = {a->kernel[0], a->kernel[1]}, s[2] = {a->stride[0], a->stride[1]};
    int64_t p[4] = {a->pad[0], a->pad[1], a->pad[0], a->pad[1]};
    return s_attr_ints(ex, n, "kernel_shape", k, 2) && s_attr_ints(ex, n, "strides", s, 2) &&
           s_attr_ints(ex, n, "pads", p, 4);
}

/* A float scalar initializer "<out>/<what>"; its name into buf. */
static const char *s_scalar(s_ex_t *ex, const char *out, const char *what,
                            float v, char *buf, size_t size) {
    snprintf(buf, size, "%s/%s", out, what);
    int64_t none[1] = {0};
    return s_init(ex, buf, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, none, &v,
                  sizeof v) ? buf : NULL;
}

/* A chain step: op(a[, b]) into "<out>/<step>" (or `out` itself when
 * step is NULL); the value's name, or NULL. */
static const char *s_step(s_ex_t *ex, const char *op, const char *out, const char *step,
                          const char *a, const char *b, char *buf, size_t size) {
    /* a failed step before (NULL) fails this one; the one-input ops are
     * the unary ones, b then ignored */
    const int unary = !strcmp(op, "Erf") || !strcmp(op, "Tanh") || !strcmp(op, "Sigmoid") ||
                      !strcmp(op, "Sqrt") || !strcmp(op, "Reciprocal") || !strcmp(op, "Abs") ||
                      !strcmp(op, "Neg") || !strcmp(op, "Exp") || !strcmp(op, "Log");
    if (!a || (!unary && !b))
        return NULL;
    if (unary)
        b = NULL;
    if (step)
        snprintf(buf, size, "%s/%s", out, step);
    else
        snprintf(buf, size, "%s", out);
    const char *in[2] = {a, b};
    return s_node(ex, op, buf, b ? 2 : 1, in) ? buf : NULL;
}

/* The loss family (docs/ops.md) composed from opset-13 ops: the per-element
 * term, then ReduceMean over every axis (keepdims 0: a scalar). Huber is
 * c (|d| - c/2) with c = min(|d|, delta), which is d^2/2 inside delta and
 * delta (|d| - delta/2) outside, with no Where; sigmoid cross-entropy is
 * the stable max(x,0) - x z + log(1 + exp(-|x|)). 1 on success. */
static int s_emit_loss(s_ex_t *ex, tp_op_kind_t k, const char *out,
                       const char *const *in, const tp_node_attrs_t *a) {
    char c1[700], t1[700], t2[700], t3[700], t4[700], t5[700], t6[700], t7[700];
    const char *x = in[0], *z = in[1], *term = NULL;
    switch (k) {
    case TP_OP_MSE: {
        const char *d = s_step(ex, "Sub", out, "diff", x, z, t1, sizeof t1);
        term = s_step(ex, "Mul", out, "term", d, d, t2, sizeof t2);
        break;
    }
    case TP_OP_L1_LOSS:
        term = s_step(ex, "Abs", out, "term",
                      s_step(ex, "Sub", out, "diff", x, z, t1, sizeof t1), NULL, t2,
                      sizeof t2);
        break;
    case TP_OP_HUBER_LOSS: {
        const char *m = s_step(ex, "Abs", out, "absdiff",
                               s_step(ex, "Sub", out, "diff", x, z, t1, sizeof t1), NULL,
                               t2, sizeof t2);
        const char *c = s_step(ex, "Min", out, "clipped", m,
                               s_scalar(ex, out, "delta", a->alpha, c1, sizeof c1), t3,
                               sizeof t3);
        char h[700];
        const char *hc = s_step(ex, "Mul", out, "half_c", c,
                                s_scalar(ex, out, "half", 0.5f, h, sizeof h), t4, sizeof t4);
        term = s_step(ex, "Mul", out, "term", c,
                      s_step(ex, "Sub", out, "rest", m, hc, t5, sizeof t5), t6, sizeof t6);
        break;
    }
    case TP_OP_SIGMOID_XENT: {
        char zero[700], one[700];
        const char *relu = s_step(ex, "Max", out, "relu", x,
                                  s_scalar(ex, out, "zero", 0.0f, zero, sizeof zero), t1,
                                  sizeof t1);
        const char *lin = s_step(ex, "Sub", out, "lin", relu,
                                 s_step(ex, "Mul", out, "xz", x, z, t2, sizeof t2), t3,
                                 sizeof t3);
        const char *e = s_step(ex, "Exp", out, "exp",
                               s_step(ex, "Neg", out, "negabs",
                                      s_step(ex, "Abs", out, "abs", x, NULL, t4, sizeof t4),
                                      NULL, t5, sizeof t5),
                               NULL, t6, sizeof t6);
        const char *l = s_step(ex, "Log", out, "log1p",
                               s_step(ex, "Add", out, "one_plus", e,
                                      s_scalar(ex, out, "one", 1.0f, one, sizeof one), t7,
                                      sizeof t7),
                               NULL, c1, sizeof c1);
        char t8[700];
        term = s_step(ex, "Add", out, "term", lin, l, t8, sizeof t8);
        /* term names t8, which must live until the ReduceMean below */
        const char *ri[1] = {term};
        if (!term)
            return 0;
        Onnx__NodeProto *n = s_node(ex, "ReduceMean", out, 1, ri);
        return n && s_attr_i(ex, n, "keepdims", 0);
    }
    default: return 0;
    }
    if (!term)
        return 0;
    const char *ri[1] = {term};
    Onnx__NodeProto *n = s_node(ex, "ReduceMean", out, 1, ri);
    return n && s_attr_i(ex, n, "keepdims", 0);
}

/* Both GELUs end as 0.5 x (1 + v) (v: erf's or tanh's), into `out`; 1 on
 * success. */
static int s_gelu_end(s_ex_t *ex, const char *out, const char *x, const char *v) {
    char c1[700], c2[700], t1[700], t2[700], t3[700];
    const char *p = s_step(ex, "Add", out, "one_plus", v,
                           s_scalar(ex, out, "one", 1.0f, c1, sizeof c1), t1, sizeof t1);
    const char *h = s_step(ex, "Mul", out, "x_times", x, p, t2, sizeof t2);
    return s_step(ex, "Mul", out, NULL, h, s_scalar(ex, out, "half", 0.5f, c2, sizeof c2),
                  t3, sizeof t3) != NULL;
}

/* The elementwise family (docs/ops.md): NumPy broadcasting is ONNX's
 * multidirectional broadcasting, so binary ops map one to one; opset 13
 * has no GELU, which becomes its formula. 1 on success. */
static int s_emit_elementwise(s_ex_t *ex, tp_op_kind_t k, const char *out,
                              const char *const *in, const tp_node_attrs_t *a) {
    char c1[700], c2[700], t1[700], t2[700], t3[700], t4[700];
    const char *x = in[0];
    switch (k) {
    case TP_OP_SUB: return s_node(ex, "Sub", out, 2, in) != NULL;
    case TP_OP_MUL: return s_node(ex, "Mul", out, 2, in) != NULL;
    case TP_OP_DIV: return s_node(ex, "Div", out, 2, in) != NULL;
    case TP_OP_MAXIMUM: return s_node(ex, "Max", out, 2, in) != NULL;
    case TP_OP_MINIMUM: return s_node(ex, "Min", out, 2, in) != NULL;
    case TP_OP_NEG: return s_node(ex, "Neg", out, 1, in) != NULL;
    case TP_OP_ABS: return s_node(ex, "Abs", out, 1, in) != NULL;
    case TP_OP_SQUARE: return s_step(ex, "Mul", out, NULL, x, x, t1, sizeof t1) != NULL;
    case TP_OP_SQRT: return s_node(ex, "Sqrt", out, 1, in) != NULL;
    case TP_OP_RSQRT:
        return s_step(ex, "Reciprocal", out, NULL,
                      s_step(ex, "Sqrt", out, "sqrt", x, NULL, t1, sizeof t1), NULL, t2,
                      sizeof t2) != NULL;
    case TP_OP_EXP: return s_node(ex, "Exp", out, 1, in) != NULL;
    case TP_OP_LOG: return s_node(ex, "Log", out, 1, in) != NULL;
    case TP_OP_POW:
        return s_step(ex, "Pow", out, NULL, x, s_scalar(ex, out, "exponent", a->alpha, c1, sizeof c1),
                      t1, sizeof t1) != NULL;
    case TP_OP_CLIP: {
        const char *ci[3] = {x, s_scalar(ex, out, "min", a->alpha, c1, sizeof c1),
                             s_scalar(ex, out, "max", a->beta, c2, sizeof c2)};
        return ci[1] && ci[2] && s_node(ex, "Clip", out, 3, ci) != NULL;
    }
    case TP_OP_GELU: {
        /* 0.5 x (1 + erf(x / sqrt 2)) */
        const char *e = s_step(ex, "Erf", out, "erf",
                               s_step(ex, "Mul", out, "scaled", x,
                                      s_scalar(ex, out, "inv_sqrt2", 0.70710678f, c1, sizeof c1),
                                      t1, sizeof t1), NULL, t2, sizeof t2);
        return s_gelu_end(ex, out, x, e);
    }
    case TP_OP_GELU_TANH: {
        /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
        char t5[700], t6[700];
        const char *x2 = s_step(ex, "Mul", out, "x2", x, x, t1, sizeof t1);
        const char *x3 = s_step(ex, "Mul", out, "x3", x2, x, t2, sizeof t2);
        const char *cx3 = s_step(ex, "Mul", out, "cx3", x3,
                                 s_scalar(ex, out, "c", 0.044715f, c1, sizeof c1), t3, sizeof t3);
        const char *in_ = s_step(ex, "Add", out, "inner", x, cx3, t4, sizeof t4);
        const char *th = s_step(ex, "Tanh", out, "tanh",
                                s_step(ex, "Mul", out, "scaled", in_,
                                       s_scalar(ex, out, "k", 0.7978845608f, c2, sizeof c2),
                                       t5, sizeof t5), NULL, t6, sizeof t6);
        return s_gelu_end(ex, out, x, th);
    }
    case TP_OP_SILU:
        return s_step(ex, "Mul", out, NULL, x,
                      s_step(ex, "Sigmoid", out, "sigmoid", x, NULL, t1, sizeof t1), t2,
                      sizeof t2) != NULL;
    case TP_OP_SOFTPLUS: return s_node(ex, "Softplus", out, 1, in) != NULL;
    case TP_OP_STOP_GRADIENT: return s_node(ex, "Identity", out, 1, in) != NULL;
    default: return 0;
    }
}

/* An int64 [n] initializer "<out>/<what>"; its name into buf. */
static const char *s_ints(s_ex_t *ex, const char *out, const char *what,
                          const int64_t *v, int n, char *buf, size_t size) {
    snprintf(buf, size, "%s/%s", out, what);
    int64_t dims[1] = {n};
    return s_init(ex, buf, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, dims, v,
                  sizeof(int64_t) * (size_t)n) ? buf : NULL;
}

/* The shape family (docs/ops.md) at opset 13: Transpose, Slice with
 * int64 starts/ends/axes/steps inputs (a batched dim 0, always whole, left
 * out of axes), Pad (mode constant) with its pads and value as inputs,
 * Expand (a batched dim 0 as 1, which broadcasts to the batch), Gather
 * (axis 0) and OneHot (depth 1-element int64, values [0, 1], axis -1). 1 on
 * success. */
static int s_emit_shape(s_ex_t *ex, tp_node_t *x, const char *out,
                        const char *const *in, const tp_node_attrs_t *a) {
    char b1[700], b2[700], b3[700], b4[700];
    const tp_node_t *x0 = tp_node_input(x, 0);
    const tp_shape_t *xs = tp_node_shape(x0), *ys = tp_node_shape(x);
    const int r = ys->ndim;
    switch (tp_node_kind(x)) {
    case TP_OP_TRANSPOSE: {
        Onnx__NodeProto *n = s_node(ex, "Transpose", out, 1, in);
        return n && s_attr_ints(ex, n, "perm", a->dims_a, r);
    }
    case TP_OP_SLICE: {
        int64_t st[TP_MAX_DIMS], en[TP_MAX_DIMS], ax[TP_MAX_DIMS], sp[TP_MAX_DIMS];
        int k = 0;
        for (int i = tp_node_batched(x0) ? 1 : 0; i < r; i++) {
            const int64_t cnt = ys->d[i], step = a->dims_b[i];
            st[k] = a->dims_a[i];
            en[k] = st[k] + cnt * step;
            /* walking back past element 0: an end of -1 would mean the
             * last element, so below -dim (ONNX clamps it to before 0) */
            if (step < 0 && en[k] < 0)
                en[k] = -xs->d[i] - 1;
            ax[k] = i;
            sp[k++] = step;
        }
        if (k == 0)
            return s_node(ex, "Identity", out, 1, in) != NULL;
        const char *si[5] = {in[0], s_ints(ex, out, "starts", st, k, b1, sizeof b1),
                             s_ints(ex, out, "ends", en, k, b2, sizeof b2),
                             s_ints(ex, out, "axes", ax, k, b3, sizeof b3),
                             s_ints(ex, out, "steps", sp, k, b4, sizeof b4)};
        return si[1] && si[2] && si[3] && si[4] && s_node(ex, "Slice", out, 5, si);
    }
    case TP_OP_PAD: {
        int64_t pads[2 * TP_MAX_DIMS];
        for (int i = 0; i < r; i++) {
            pads[i] = a->dims_a[i];
            pads[r + i] = a->dims_b[i];
        }
        int64_t none[1] = {0};
        const int32_t iv = (int32_t)a->alpha;
        const int is_int = tp_node_dtype(x0) == TP_INT32;
        snprintf(b2, sizeof b2, "%s/value", out);
        const int vok = s_init(ex, b2, is_int ? ONNX__TENSOR_PROTO__DATA_TYPE__INT32
                                              : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT,
                               0, none, is_int ? (const void *)&iv : (const void *)&a->alpha, 4);
        const char *pi[3] = {in[0], s_ints(ex, out, "pads", pads, 2 * r, b1, sizeof b1),
                             vok ? b2 : NULL};
        Onnx__NodeProto *n = pi[1] && pi[2] ? s_node(ex, "Pad", out, 3, pi) : NULL;
        return n != NULL;
    }
    case TP_OP_BROADCAST_TO: {
        int64_t shape[TP_MAX_DIMS];
        memcpy(shape, ys->d, sizeof shape);
        if (tp_node_batched(x))
            shape[0] = 1;
        const char *ei[2] = {in[0], s_ints(ex, out, "shape", shape, r, b1, sizeof b1)};
        return ei[1] && s_node(ex, "Expand", out, 2, ei);
    }
    case TP_OP_GATHER: {
        Onnx__NodeProto *n = s_node(ex, "Gather", out, 2, in);
        return n && s_attr_i(ex, n, "axis", 0);
    }
    case TP_OP_ONE_HOT: {
        const int64_t depth = ys->d[r - 1];
        const float vals[2] = {0.0f, 1.0f};
        int64_t two[1] = {2};
        snprintf(b2, sizeof b2, "%s/values", out);
        const int vok = s_init(ex, b2, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, two, vals,
                               sizeof vals);
        const char *oi[3] = {in[0], s_ints(ex, out, "depth", &depth, 1, b1, sizeof b1),
                             vok ? b2 : NULL};
        Onnx__NodeProto *n = oi[1] && oi[2] ? s_node(ex, "OneHot", out, 3, oi) : NULL;
        return n && s_attr_i(ex, n, "axis", -1);
    }
    default:
        return 0;
    }
}

/* The linalg family (docs/ops.md) at opset 13. batch_matmul is MatMul
 * (NumPy's matmul broadcasting, as ours), a transposed operand first
 * through a Transpose of its last two axes. Layer norm (LayerNormalization
 * is opset 17) is ReduceMean over its axes, Sub, the mean square, Add eps,
 * Sqrt, Div, then Mul gamma and Add beta; group norm (GroupNormalization
 * is opset 18) the same over x reshaped to [N, G, -1], reshaped back to
 * x's shape, with gamma and beta as [C,1,...] initializers; instance norm
 * is InstanceNormalization (opset 6). A gamma or beta left out
 * (elementwise_affine=False) drops its Mul or Add (InstanceNormalization,
 * whose scale and B are required, gets 1s and 0s). 1 on success. */
static int s_emit_linalg(s_ex_t *ex, tp_node_t *x, const char *out,
                         const char *const *in, const tp_node_attrs_t *a) {
    char t1[700], t2[700], t3[700], t4[700], t5[700], t6[700], t7[700], t8[700];
    char t9[700];
    const tp_op_kind_t k = tp_node_kind(x);
    if (k == TP_OP_BATCH_MATMUL) {
        const char *mi[2] = {in[0], in[1]};
        char *tn[2] = {t1, t2};
        const int tr[2] = {a->trans_a, a->trans_b};
        for (int i = 0; i < 2; i++) {
            if (!tr[i])
                continue;
            snprintf(tn[i], 700, "%s/%s_t", out, i ? "b" : "a");
            const int r = tp_node_shape(tp_node_input(x, i))->ndim;
            if (!s_transpose_pair(ex, tn[i], in[i], r, r - 2))
                return 0;
            mi[i] = tn[i];
        }
        return s_node(ex, "MatMul", out, 2, mi) != NULL;
    }
    /* the parameters present (gi, bi: their inputs; -1 left out) */
    const int gi = a->norm_absent & 1 ? -1 : 1;
    const int bi = a->norm_absent & 2 ? -1 : (a->norm_absent & 1 ? 1 : 2);
    const tp_shape_t *xs = tp_node_shape(x);
    if (k == TP_OP_INSTANCE_NORM) { /* scale and B are required: 1s and 0s */
        const char *ii[3] = {in[0], gi < 0 ? t1 : in[gi], bi < 0 ? t2 : in[bi]};
        snprintf(t1, sizeof t1, "%s/scale_ones", out);
        snprintf(t2, sizeof t2, "%s/bias_zeros", out);
        if ((gi < 0 && !s_fill(ex, t1, xs->d[1], 1.0f)) ||
            (bi < 0 && !s_fill(ex, t2, xs->d[1], 0.0f)))
            return 0;
        Onnx__NodeProto *n = s_node(ex, "InstanceNormalization", out, 3, ii);
        return s_attr_f(ex, n, "epsilon", a->eps);
    }
    const char *src = in[0], *gamma = gi < 0 ? NULL : in[gi], *beta = bi < 0 ? NULL : in[bi];
    int64_t axes[TP_MAX_DIMS];
    int naxes;
    if (k == TP_OP_LAYER_NORM) {
        naxes = a->norm_axes;
        for (int i = 0; i < naxes; i++)
            axes[i] = xs->ndim - naxes + i;
    } else { /* group norm: over [N, G, -1]'s last axis */
        int64_t shape[3] = {0, a->norm_groups, -1}, d1[1] = {3};
        snprintf(t8, sizeof t8, "%s/groups_shape", out);
        const char *ri[2] = {in[0], t8};
        snprintf(t1, sizeof t1, "%s/groups", out);
        if (!s_init(ex, t8, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, d1, shape,
                    sizeof shape) || !s_node(ex, "Reshape", t1, 2, ri))
            return 0;
        src = t1;
        naxes = 1;
        axes[0] = 2;
    }
    snprintf(t2, sizeof t2, "%s/mean", out);
    Onnx__NodeProto *n = s_node(ex, "ReduceMean", t2, 1, &src);
    if (!s_attr_ints(ex, n, "axes", axes, naxes) || !s_attr_i(ex, n, "keepdims", 1))
        return 0;
    const char *d = s_step(ex, "Sub", out, "centred", src, t2, t3, sizeof t3);
    const char *sq = s_step(ex, "Mul", out, "square", d, d, t4, sizeof t4);
    snprintf(t5, sizeof t5, "%s/var", out);
    n = sq ? s_node(ex, "ReduceMean", t5, 1, &sq) : NULL;
    if (!s_attr_ints(ex, n, "axes", axes, naxes) || !s_attr_i(ex, n, "keepdims", 1))
        return 0;
    char eps[700];
    const char *e = s_scalar(ex, out, "eps", a->eps, eps, sizeof eps);
    const char *v = s_step(ex, "Add", out, "var_eps", t5, e, t6, sizeof t6);
    const char *sd = s_step(ex, "Sqrt", out, "std", v, NULL, t7, sizeof t7);
    const char *xh = s_step(ex, "Div", out, "normed", d, sd, t9, sizeof t9);
    if (!xh)
        return 0;
    if (k == TP_OP_GROUP_NORM) {
        /* back to x's shape; gamma and beta as [C,1,...] to broadcast */
        char shp[700], back[700];
        snprintf(shp, sizeof shp, "%s/x_shape", out);
        snprintf(back, sizeof back, "%s/normed_x", out);
        const char *ri[2] = {xh, shp};
        if (!s_node(ex, "Shape", shp, 1, &in[0]) || !s_node(ex, "Reshape", back, 2, ri))
            return 0;
        snprintf(t9, sizeof t9, "%s", back);
        int64_t dims[TP_MAX_DIMS];
        dims[0] = xs->d[1];
        for (int i = 1; i < xs->ndim - 1; i++)
            dims[i] = 1;
        snprintf(t2, sizeof t2, "%s/gamma_c", out);
        snprintf(t8, sizeof t8, "%s/beta_c", out);
        if ((gamma && !s_init_var(ex, tp_node_input(x, gi), t2, xs->ndim - 1, dims)) ||
            (beta && !s_init_var(ex, tp_node_input(x, bi), t8, xs->ndim - 1, dims)))
            return 0;
        gamma = gamma ? t2 : NULL;
        beta = beta ? t8 : NULL;
    }
    /* then Mul gamma and Add beta, each only when present (the last step
     * writes `out`; with neither, an Identity does) */
    const char *v9 = t9;
    if (gamma)
        v9 = s_step(ex, "Mul", out, beta ? "scaled" : NULL, v9, gamma, t3, sizeof t3);
    if (beta)
        return s_step(ex, "Add", out, NULL, v9, beta, t4, sizeof t4) != NULL;
    if (gamma)
        return v9 != NULL;
    return s_node(ex, "Identity", out, 1, &v9) != NULL;
}

/* The reduce family (docs/ops.md) at opset 13: ReduceSum (axes an int64
 * input), ReduceMean/ReduceMax (axes an attribute), keepdims when the node
 * kept its rank; ArgMax then Cast to int32 (ArgMax gives int64); Softmax and
 * LogSoftmax along the axis (opset 13's one-axis form); the sequence
 * cross-entropy as SoftmaxCrossEntropyLoss (mean, ignore_index), its class
 * axis moved to 1 by a Transpose when the logits have more than 2 dims;
 * top-k accuracy as TopK, Equal against the labels, ReduceMax over k and
 * ReduceMean (ties: TopK keeps the lower index, towerpack counts a tie as a
 * hit). 1 on success. */
static int s_emit_reduce(s_ex_t *ex, tp_node_t *x, const char *out, const char *const *in,
                         const tp_node_attrs_t *a) {
    const tp_op_kind_t k = tp_node_kind(x);
    const tp_shape_t *xs = tp_node_shape(tp_node_input(x, 0));
    int64_t axes[TP_MAX_DIMS];
    int nax = 0;
    for (int d = 0; d < xs->ndim; d++)
        if (a->axes & (1 << d))
            axes[nax++] = d;
    const int keep = tp_node_shape(x)->ndim == xs->ndim;
    char t1[700], t2[700], t3[700], t4[700], t5[700], t6[700];
    Onnx__NodeProto *n;
    switch (k) {
    case TP_OP_REDUCE_SUM: {
        const char *ri[2] = {in[0], t1};
        snprintf(t1, sizeof t1, "%s/axes", out);
        int64_t d1[1] = {nax};
        if (nax && !s_init(ex, t1, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, d1, axes,
                           sizeof(int64_t) * (size_t)nax))
            return 0;
        n = s_node(ex, "ReduceSum", out, nax ? 2 : 1, ri);
        return s_attr_i(ex, n, "keepdims", keep);
    }
    case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
        n = s_node(ex, k == TP_OP_REDUCE_MEAN ? "ReduceMean" : "ReduceMax", out, 1, in);
        return s_attr_i(ex, n, "keepdims", keep) && (!nax || s_attr_ints(ex, n, "axes", axes, nax));
    case TP_OP_ARGMAX:
        snprintf(t1, sizeof t1, "%s/int64", out);
        n = s_node(ex, "ArgMax", t1, 1, in);
        if (!s_attr_i(ex, n, "axis", axes[0]) || !s_attr_i(ex, n, "keepdims", keep))
            return 0;
        {
            const char *ci[1] = {t1};
            n = s_node(ex, "Cast", out, 1, ci);
        }
        return s_attr_i(ex, n, "to", ONNX__TENSOR_PROTO__DATA_TYPE__INT32);
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
        n = s_node(ex, k == TP_OP_SOFTMAX ? "Softmax" : "LogSoftmax", out, 1, in);
        return s_attr_i(ex, n, "axis", axes[0]);
    case TP_OP_SOFTMAX_XENT_SEQ: {
        const char *li[2] = {in[0], in[1]};
        if (xs->ndim > 2) { /* [B, T.., V] -> [B, V, T..] */
            int64_t perm[TP_MAX_DIMS];
            perm[0] = 0;
            perm[1] = xs->ndim - 1;
            for (int d = 2; d < xs->ndim; d++)
                perm[d] = d - 1;
            snprintf(t1, sizeof t1, "%s/classes_at_1", out);
            n = s_node(ex, "Transpose", t1, 1, in);
            if (!s_attr_ints(ex, n, "perm", perm, xs->ndim))
                return 0;
            li[0] = t1;
        }
        n = s_node(ex, "SoftmaxCrossEntropyLoss", out, 2, li);
        return s_attr_str(ex, n, "reduction", "mean") &&
               s_attr_i(ex, n, "ignore_index", (int64_t)a->alpha);
    }
    case TP_OP_TOP_K_ACCURACY: {
        int64_t kk[1] = {(int64_t)a->alpha}, d1[1] = {1}, one[1] = {1};
        snprintf(t1, sizeof t1, "%s/k", out);
        if (!s_init(ex, t1, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, d1, kk, sizeof kk))
            return 0;
        const char *ti[2] = {in[0], t1};
        snprintf(t2, sizeof t2, "%s/topk", out);
        n = s_node(ex, "TopK", t2, 2, ti);
        if (!n || !s_attr_i(ex, n, "axis", 1))
            return 0;
        /* TopK's second output: the indices [N, k] (int64) */
        char **o2 = s_new(ex, sizeof(char *) * 2);
        snprintf(t3, sizeof t3, "%s/topk_index", out);
        if (!o2 || !(o2[0] = s_str(ex, t2)) || !(o2[1] = s_str(ex, t3)))
            return 0;
        n->output = o2;
        n->n_output = 2;
        snprintf(t4, sizeof t4, "%s/label64", out);
        const char *ci[1] = {in[1]};
        n = s_node(ex, "Cast", t4, 1, ci);
        if (!s_attr_i(ex, n, "to", ONNX__TENSOR_PROTO__DATA_TYPE__INT64))
            return 0;
        snprintf(t5, sizeof t5, "%s/axis1", out);
        if (!s_init(ex, t5, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, d1, one, sizeof one))
            return 0;
        const char *ui[2] = {t4, t5};
        snprintf(t6, sizeof t6, "%s/label_n1", out);
        if (!s_node(ex, "Unsqueeze", t6, 2, ui))
            return 0;
        const char *ei[2] = {t3, t6};
        snprintf(t1, sizeof t1, "%s/equal", out);
        if (!s_node(ex, "Equal", t1, 2, ei))
            return 0;
        const char *fi[1] = {t1};
        snprintf(t2, sizeof t2, "%s/hit_float", out);
        n = s_node(ex, "Cast", t2, 1, fi);
        if (!s_attr_i(ex, n, "to", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT))
            return 0;
        const char *hi[1] = {t2};
        snprintf(t3, sizeof t3, "%s/hit", out);
        n = s_node(ex, "ReduceMax", t3, 1, hi);
        if (!s_attr_i(ex, n, "keepdims", 0) || !s_attr_ints(ex, n, "axes", one, 1))
            return 0;
        const char *mi[1] = {t3};
        n = s_node(ex, "ReduceMean", out, 1, mi);
        return s_attr_i(ex, n, "keepdims", 0);
    }
    default:
        return 0;
    }
}

/* Fused attention (TP_OP_ATTENTION) as the decomposed graph ONNX has:
 * MatMul(q, Transpose(k)), Mul by the scale, Add a [Tq,Tk] mask of 0 and
 * -1e9 above the diagonal when causal, Softmax over the last axis, MatMul
 * by v; q, k, v of rank r, into `out`. (ONNX's Attention operator is
 * opset 23.) 1 on success. */
static int s_emit_attention_core(s_ex_t *ex, const char *out, const char *q, const char *k,
                                 const char *v, int r, int64_t tq, int64_t tk,
                                 const tp_node_attrs_t *a) {
    char t1[700], t2[700], t3[700], t4[700], t5[700], c1[700];
    snprintf(t1, sizeof t1, "%s/k_t", out);
    if (!s_transpose_pair(ex, t1, k, r, r - 2))
        return 0;
    const char *s = s_step(ex, "Mul", out, "scores",
                           s_step(ex, "MatMul", out, "qk", q, t1, t2, sizeof t2),
                           s_scalar(ex, out, "scale", a->alpha, c1, sizeof c1), t3, sizeof t3);
    if (s && a->beta != 0.0f) {
        const int64_t dims[2] = {tq, tk};
        float *m = s_new(ex, sizeof *m * (size_t)(tq * tk));
        if (!m)
            return 0;
        for (int64_t i = 0; i < tq; i++)
            for (int64_t j = 0; j < tk; j++)
                m[i * tk + j] = j > i ? -1e9f : 0.0f;
        snprintf(t4, sizeof t4, "%s/causal_mask", out);
        if (!s_init(ex, t4, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, dims, m,
                    sizeof *m * (size_t)(tq * tk)))
            return 0;
        s = s_step(ex, "Add", out, "masked", s, t4, t5, sizeof t5);
    }
    if (!s)
        return 0;
    snprintf(t4, sizeof t4, "%s/weights", out);
    const char *si[1] = {s};
    Onnx__NodeProto *n = s_node(ex, "Softmax", t4, 1, si);
    if (!s_attr_i(ex, n, "axis", -1))
        return 0;
    const char *mi[2] = {t4, v};
    return s_node(ex, "MatMul", out, 2, mi) != NULL;
}

/* The packed form (attr heads H, tp_attention_qkv): qkv [...,T,3C]
 * reshaped to [...,T,3H,D], its T and head axes swapped, q, k and v
 * sliced off as [...,H,T,D] each, the attention above, then the heads
 * swapped back and merged to [...,T,C] (Reshape's 0 keeps a dim). */
static int s_emit_attention_qkv(s_ex_t *ex, tp_node_t *x, const char *out,
                                const char *const *in, const tp_node_attrs_t *a, int heads) {
    char t1[700], t2[700], t3[700], t4[700], t5[700], b1[700], b2[700], b3[700], b4[700];
    char qkv[3][700];
    const tp_shape_t *xs = tp_node_shape(tp_node_input(x, 0));
    const int r = xs->ndim; /* the heads' views have rank r + 1 */
    const int64_t C = xs->d[r - 1] / 3, D = C / heads, T = xs->d[r - 2];
    int64_t split[TP_MAX_DIMS + 1];
    for (int d = 0; d < r - 1; d++)
        split[d] = 0;
    split[r - 1] = 3 * (int64_t)heads;
    split[r] = D;
    const int64_t sd[1] = {r + 1};
    snprintf(t1, sizeof t1, "%s/heads_shape", out);
    snprintf(t2, sizeof t2, "%s/heads_split", out);
    const char *ri[2] = {in[0], t1};
    if (!s_init(ex, t1, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, sd, split,
                sizeof(int64_t) * (size_t)(r + 1)) ||
        !s_node(ex, "Reshape", t2, 2, ri))
        return 0;
    snprintf(t3, sizeof t3, "%s/heads", out);
    if (!s_transpose_pair(ex, t3, t2, r + 1, r - 2)) /* T and the heads */
        return 0;
    static const char *const part[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) { /* heads [i H, (i + 1) H) of axis r - 2 */
        char what[16];
        const int64_t st[1] = {(int64_t)i * heads}, en[1] = {(int64_t)(i + 1) * heads},
                      ax[1] = {r - 2}, one[1] = {1};
        snprintf(qkv[i], sizeof qkv[i], "%s/%s", out, part[i]);
        snprintf(what, sizeof what, "%s_starts", part[i]);
        const char *s1 = s_ints(ex, out, what, st, 1, b1, sizeof b1);
        snprintf(what, sizeof what, "%s_ends", part[i]);
        const char *s2 = s_ints(ex, out, what, en, 1, b2, sizeof b2);
        snprintf(what, sizeof what, "%s_axes", part[i]);
        const char *s3 = s_ints(ex, out, what, ax, 1, b3, sizeof b3);
        snprintf(what, sizeof what, "%s_steps", part[i]);
        const char *s4 = s_ints(ex, out, what, one, 1, b4, sizeof b4);
        const char *si[5] = {t3, s1, s2, s3, s4};
        if (!s1 || !s2 || !s3 || !s4 || !s_node(ex, "Slice", qkv[i], 5, si))
            return 0;
    }
    snprintf(t4, sizeof t4, "%s/attention", out);
    if (!s_emit_attention_core(ex, t4, qkv[0], qkv[1], qkv[2], r + 1, T, T, a))
        return 0;
    snprintf(t5, sizeof t5, "%s/unheads", out);
    if (!s_transpose_pair(ex, t5, t4, r + 1, r - 2))
        return 0;
    int64_t merged[TP_MAX_DIMS];
    for (int d = 0; d < r - 1; d++)
        merged[d] = 0;
    merged[r - 1] = C;
    const int64_t md[1] = {r};
    snprintf(t1, sizeof t1, "%s/merge_shape", out);
    const char *mi[2] = {t5, t1};
    return s_init(ex, t1, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, md, merged,
                  sizeof(int64_t) * (size_t)r) &&
           s_node(ex, "Reshape", out, 2, mi) != NULL;
}

/* TP_OP_ATTENTION: three inputs, or the packed one */
static int s_emit_attention(s_ex_t *ex, tp_node_t *x, const char *out,
                            const char *const *in, const tp_node_attrs_t *a) {
    if (a->heads > 0)
        return s_emit_attention_qkv(ex, x, out, in, a, a->heads);
    const tp_shape_t *qs = tp_node_shape(tp_node_input(x, 0));
    const tp_shape_t *ks = tp_node_shape(tp_node_input(x, 1));
    const int r = qs->ndim;
    return s_emit_attention_core(ex, out, in[0], in[1], in[2], r, qs->d[r - 2], ks->d[r - 2],
                                 a);
}

/* One op node into ONNX nodes; *ok 0 on failure (with the error set). */
/* ---- the convolution family ------------------------------------------------ */

/* Conv (dilations and group written only when not 1, so a plain conv's
 * node is what it always was), ConvTranspose (W [C,O/g,KH,KW] is ONNX's
 * layout; output_padding), and Resize for the upsampling: scales [1,1,f,f];
 * nearest as asymmetric + floor (out[o] = in[floor(o / f)]), bilinear as
 * linear with pytorch_half_pixel, or align_corners. 1 on success. */
static int s_emit_conv(s_ex_t *ex, tp_op_kind_t k, const char *out, int nin,
                       const char *const *in, const tp_node_attrs_t *a) {
    const int64_t dil[2] = {a->dilation[0], a->dilation[1]};
    if (k == TP_OP_CONV2D || k == TP_OP_CONV_TRANSPOSE) {
        Onnx__NodeProto *n =
            s_node(ex, k == TP_OP_CONV2D ? "Conv" : "ConvTranspose", out, nin, in);
        if (!n || !s_pool_attrs(ex, n, a))
            return 0;
        if ((dil[0] != 1 || dil[1] != 1) && !s_attr_ints(ex, n, "dilations", dil, 2))
            return 0;
        if (a->groups != 1 && !s_attr_i(ex, n, "group", a->groups))
            return 0;
        const int64_t op[2] = {a->output_pad[0], a->output_pad[1]};
        if (k == TP_OP_CONV_TRANSPOSE && (op[0] || op[1]) &&
            !s_attr_ints(ex, n, "output_padding", op, 2))
            return 0;
        return 1;
    }
    char scales[640];
    snprintf(scales, sizeof scales, "%s/scales", out);
    const float sv[4] = {1.0f, 1.0f, (float)a->stride[0], (float)a->stride[1]};
    const int64_t four[1] = {4};
    if (!s_init(ex, scales, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, four, sv, sizeof sv))
        return 0;
    const char *ri[3] = {in[0], "", scales}; /* no roi */
    Onnx__NodeProto *n = s_node(ex, "Resize", out, 3, ri);
    if (k == TP_OP_UPSAMPLE_NEAREST)
        return s_attr_str(ex, n, "mode", "nearest") &&
               s_attr_str(ex, n, "coordinate_transformation_mode", "asymmetric") &&
               s_attr_str(ex, n, "nearest_mode", "floor");
    return s_attr_str(ex, n, "mode", "linear") &&
           s_attr_str(ex, n, "coordinate_transformation_mode",
                      a->align_corners ? "align_corners" : "pytorch_half_pixel");
}

static tp_status_t s_emit(s_ex_t *ex, tp_node_t *x, char **vname, const int *uses,
                          const unsigned char *fused, int nnodes) {
    tp_op_kind_t k = tp_node_kind(x);
    int id = -1;
    for (int i = 0; i < nnodes; i++)
        if (tp_model_node(ex->m, -1, i) == x)
            id = i;
    const char *out = vname[id];
    const char *in[4] = {NULL, NULL, NULL, NULL};
    int nin = tp_node_input_count(x);
    for (int i = 0; i < nin && i < 4; i++) {
        tp_node_t *xi = tp_node_input(x, i);
        for (int j = 0; j < nnodes; j++)
            if (tp_model_node(ex->m, -1, j) == xi)
                in[i] = vname[j];
    }
    tp_node_attrs_t a;
    tp_node_attrs(x, &a);
    Onnx__NodeProto *n = NULL;
    char tmp[600];
    int ok = 1;
    (void)uses;
    switch (k) {
    case TP_OP_CAST: {
        /* uint8 -> float (Cast), then the scale (Mul) unless it is 1 */
        const char *src = in[0];
        if (a.in_dtype != TP_FLOAT32) {
            snprintf(tmp, sizeof tmp, "%s%s", out, a.alpha == 1.0f ? "" : "/float");
            n = s_node(ex, "Cast", tmp, 1, in);
            ok = s_attr_i(ex, n, "to", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
            src = tmp;
        } else if (a.alpha == 1.0f) {
            n = s_node(ex, "Identity", out, 1, in);
        }
        if (!ok || a.alpha == 1.0f)
            break;
        char scale[640];
        snprintf(scale, sizeof scale, "%s/scale", out);
        int64_t none[1] = {0};
        ok = s_init(ex, scale, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, none, &a.alpha,
                    sizeof a.alpha);
        const char *mi[2] = {src, scale};
        n = ok ? s_node(ex, "Mul", out, 2, mi) : NULL;
        break;
    }
    case TP_OP_SCALE: {
        char scale[640];
        snprintf(scale, sizeof scale, "%s/scale", out);
        int64_t none[1] = {0};
        ok = s_init(ex, scale, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, none, &a.alpha,
                    sizeof a.alpha);
        const char *mi[2] = {in[0], scale};
        n = ok ? s_node(ex, "Mul", out, 2, mi) : NULL;
        break;
    }
    case TP_OP_RESHAPE: {
        const tp_shape_t *s = tp_node_shape(x);
        if (s->ndim == 2 && tp_node_batched(x)) {
            n = s_node(ex, "Flatten", out, 1, in);
            ok = s_attr_i(ex, n, "axis", 1);
        } else {
            int64_t shape[TP_MAX_DIMS], d1[1] = {s->ndim};
            memcpy(shape, s->d, sizeof shape);
            if (tp_node_batched(x))
                shape[0] = -1;
            snprintf(tmp, sizeof tmp, "%s/shape", out);
            ok = s_init(ex, tmp, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, d1, shape,
                        sizeof(int64_t) * (size_t)s->ndim);
            const char *ri[2] = {in[0], tmp};
            n = ok ? s_node(ex, "Reshape", out, 2, ri) : NULL;
        }
        break;
    }
    case TP_OP_MATMUL:
        if (fused[id])
            return TP_OK; /* emitted as the Gemm of its bias */
        if (tp_node_shape(tp_node_input(x, 0))->ndim != 2) {
            snprintf(tmp, sizeof tmp, "%s/flat", out);
            n = s_node(ex, "Flatten", tmp, 1, in);
            ok = s_attr_i(ex, n, "axis", 1);
            in[0] = tmp;
        }
        in[1] = ok ? s_init_transposed(ex, tp_node_input(x, 1)) : NULL;
        n = in[1] ? s_node(ex, "Gemm", out, 2, in) : NULL;
        ok = s_attr_i(ex, n, "transB", 1);
        break;
    case TP_OP_BIAS_ADD: {
        tp_node_t *mm = tp_node_input(x, 0);
        int mid = -1;
        for (int j = 0; j < nnodes; j++)
            if (tp_model_node(ex->m, -1, j) == mm)
                mid = j;
        if (mid >= 0 && fused[mid]) {
            /* Gemm(A, W, b): the matmul's inputs and this bias */
            const char *gi[3] = {NULL, NULL, in[1]};
            for (int i = 0; i < 2; i++) {
                tp_node_t *xi = tp_node_input(mm, i);
                for (int j = 0; j < nnodes; j++)
                    if (tp_model_node(ex->m, -1, j) == xi)
                        gi[i] = vname[j];
            }
            if (tp_node_shape(tp_node_input(mm, 0))->ndim != 2) {
                snprintf(tmp, sizeof tmp, "%s/flat", vname[mid]);
                n = s_node(ex, "Flatten", tmp, 1, gi);
                ok = s_attr_i(ex, n, "axis", 1);
                gi[0] = tmp;
            }
            gi[1] = ok ? s_init_transposed(ex, tp_node_input(mm, 1)) : NULL;
            n = gi[1] ? s_node(ex, "Gemm", out, 3, gi) : NULL;
            ok = s_attr_i(ex, n, "transB", 1);
            break;
        }
        const tp_shape_t *s = tp_node_shape(x);
        if (s->ndim > 2) {
            /* b[C] against [N,C,H,W]: as [C,1,1] so it broadcasts */
            int64_t dims[TP_MAX_DIMS];
            dims[0] = s->d[1];
            for (int d = 1; d < s->ndim - 1; d++)
                dims[d] = 1;
            snprintf(tmp, sizeof tmp, "%s/channels", out);
            ok = s_init_var(ex, tp_node_input(x, 1), tmp, s->ndim - 1, dims);
            in[1] = tmp;
        }
        n = ok ? s_node(ex, "Add", out, 2, in) : NULL;
        break;
    }
    case TP_OP_CONV2D: case TP_OP_CONV_TRANSPOSE: case TP_OP_UPSAMPLE_NEAREST:
    case TP_OP_UPSAMPLE_BILINEAR: /* the convolution family */
        return s_emit_conv(ex, k, out, nin, in, &a) ? TP_OK : NOMEM();
    case TP_OP_RELU: n = s_node(ex, "Relu", out, 1, in); break;
    case TP_OP_TANH: n = s_node(ex, "Tanh", out, 1, in); break;
    case TP_OP_SIGMOID: n = s_node(ex, "Sigmoid", out, 1, in); break;
    case TP_OP_LEAKY_RELU:
        n = s_node(ex, "LeakyRelu", out, 1, in);
        ok = s_attr_f(ex, n, "alpha", a.alpha);
        break;
    case TP_OP_MAX_POOL:
    case TP_OP_AVG_POOL:
        n = s_node(ex, k == TP_OP_MAX_POOL ? "MaxPool" : "AveragePool", out, 1, in);
        ok = n && s_pool_attrs(ex, n, &a);
        break;
    case TP_OP_GLOBAL_AVG_POOL: {
        snprintf(tmp, sizeof tmp, "%s/nc11", out);
        n = s_node(ex, "GlobalAveragePool", tmp, 1, in);
        const char *fi[1] = {tmp};
        n = n ? s_node(ex, "Flatten", out, 1, fi) : NULL;
        ok = s_attr_i(ex, n, "axis", 1);
        break;
    }
    case TP_OP_BATCH_NORM: {
        const char *bi[5] = {in[0], in[1], in[2], NULL, NULL};
        for (int s = 0; s < 2; s++) {
            tp_node_t *st = tp_node_state(x, s);
            for (int j = 0; j < nnodes; j++)
                if (tp_model_node(ex->m, -1, j) == st)
                    bi[3 + s] = vname[j];
        }
        n = s_node(ex, "BatchNormalization", out, 5, bi);
        ok = s_attr_f(ex, n, "epsilon", a.eps);
        break;
    }
    case TP_OP_ADD: n = s_node(ex, "Add", out, 2, in); break;
    case TP_OP_SUB: case TP_OP_MUL: case TP_OP_DIV: case TP_OP_MAXIMUM:
    case TP_OP_MINIMUM: case TP_OP_NEG: case TP_OP_ABS: case TP_OP_SQUARE:
    case TP_OP_SQRT: case TP_OP_RSQRT: case TP_OP_EXP: case TP_OP_LOG:
    case TP_OP_POW: case TP_OP_CLIP: case TP_OP_GELU: case TP_OP_GELU_TANH:
    case TP_OP_SILU: case TP_OP_SOFTPLUS: case TP_OP_STOP_GRADIENT:
        return s_emit_elementwise(ex, k, out, in, &a) ? TP_OK : NOMEM();
    case TP_OP_MSE: case TP_OP_L1_LOSS: case TP_OP_HUBER_LOSS:
    case TP_OP_SIGMOID_XENT:
        return s_emit_loss(ex, k, out, in, &a) ? TP_OK : NOMEM();
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
    case TP_OP_ARGMAX: case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
    case TP_OP_SOFTMAX_XENT_SEQ: case TP_OP_TOP_K_ACCURACY: /* the reduce family */
        return s_emit_reduce(ex, x, out, in, &a) ? TP_OK : NOMEM();
    /* the linalg family */
    case TP_OP_BATCH_MATMUL: case TP_OP_LAYER_NORM: case TP_OP_GROUP_NORM:
    case TP_OP_INSTANCE_NORM:
        return s_emit_linalg(ex, x, out, in, &a) ? TP_OK : NOMEM();
    case TP_OP_ATTENTION: /* fused attention, decomposed */
        return s_emit_attention(ex, x, out, in, &a) ? TP_OK : NOMEM();
    case TP_OP_CONCAT: {
        const char **ci = s_new(ex, sizeof *ci * (size_t)nin);
        if (!ci)
            return NOMEM();
        for (int i = 0; i < nin; i++) {
            tp_node_t *xi = tp_node_input(x, i);
            for (int j = 0; j < nnodes; j++)
                if (tp_model_node(ex->m, -1, j) == xi)
                    ci[i] = vname[j];
        }
        n = s_node(ex, "Concat", out, nin, ci);
        ok = s_attr_i(ex, n, "axis", a.axis);
        break;
    }
    case TP_OP_TRANSPOSE: case TP_OP_SLICE: case TP_OP_PAD: case TP_OP_BROADCAST_TO:
    case TP_OP_GATHER: case TP_OP_ONE_HOT: /* the shape family */
        return s_emit_shape(ex, x, out, in, &a) ? TP_OK : NOMEM();
    default:
        return tp_error(TP_ERR_UNSUPPORTED, "ONNX export: op '%s' (node '%s') has no "
                        "ONNX form; export outputs that do not need it (the "
                        "logits, not the cost or metrics)", tp_op_name(k),
                        tp_node_name(x));
    }
    return n && ok ? TP_OK : NOMEM();
}

static tp_status_t s_build(s_ex_t *ex, tp_predictor_t *p, Onnx__ModelProto *model) {
    tp_model_t *m = ex->m;
    int nn = tp_model_node_count(m, -1);
    unsigned char *keep = s_new(ex, (size_t)nn + 1);
    unsigned char *fused = s_new(ex, (size_t)nn + 1);
    int *uses = s_new(ex, sizeof(int) * ((size_t)nn + 1));
    char **vname = s_new(ex, sizeof(char *) * ((size_t)nn + 1));
    if (!keep || !fused || !uses || !vname)
        return NOMEM();
    int nout = tp_predictor_output_count(p);
    int out_id[TP_PREDICT_MAX_IO];
    for (int j = 0; j < nout; j++) {
        tp_node_t *o = tp_model_lookup(m, -1, tp_predictor_output_name(p, j));
        out_id[j] = -1;
        for (int i = 0; i < nn; i++)
            if (tp_model_node(m, -1, i) == o)
                out_id[j] = i;
        if (out_id[j] < 0)
            return tp_error(TP_ERR_NOT_FOUND, "ONNX export: no output '%s'",
                            tp_predictor_output_name(p, j));
        keep[out_id[j]] = 1;
    }
    /* what the outputs need, and how many kept nodes read each node */
    for (int i = nn - 1; i >= 0; i--) {
        if (!keep[i])
            continue;
        tp_node_t *x = tp_model_node(m, -1, i);
        for (int j = 0; j < tp_node_input_count(x) + 2; j++) {
            tp_node_t *xi = j < tp_node_input_count(x) ? tp_node_input(x, j)
                                                       : tp_node_state(x, j - tp_node_input_count(x));
            for (int q = 0; xi && q < i; q++)
                if (tp_model_node(m, -1, q) == xi) {
                    keep[q] = 1;
                    uses[q]++;
                }
        }
    }
    /* names: a node's own, the requested name for an output, the input's
     * for a dropout (the identity) */
    for (int i = 0; i < nn; i++) {
        tp_node_t *x = tp_model_node(m, -1, i);
        vname[i] = (char *)tp_node_name(x);
        if (keep[i] && tp_node_kind(x) == TP_OP_DROPOUT) {
            tp_node_t *xi = tp_node_input(x, 0);
            for (int q = 0; q < i; q++)
                if (tp_model_node(m, -1, q) == xi)
                    vname[i] = vname[q];
        }
        if (keep[i] && tp_node_kind(x) == TP_OP_MATMUL && uses[i] == 1) {
            for (int q = i + 1; q < nn; q++) {
                tp_node_t *c = tp_model_node(m, -1, q);
                if (keep[q] && tp_node_kind(c) == TP_OP_BIAS_ADD && tp_node_input(c, 0) == x &&
                    tp_node_shape(c)->ndim == 2)
                    fused[i] = 1;
            }
        }
    }
    for (int j = 0; j < nout; j++) {
        int i = out_id[j];
        tp_op_kind_t k = tp_node_kind(tp_model_node(m, -1, i));
        if (k == TP_OP_DROPOUT || k == TP_OP_INPUT || k == TP_OP_VARIABLE ||
            k == TP_OP_CONSTANT || fused[i])
            return tp_error(TP_ERR_UNSUPPORTED, "ONNX export: output '%s' is a %s "
                            "node; export a computed one", tp_predictor_output_name(p, j),
                            tp_op_name(k));
        int dup = 0;
        for (int q = 0; q < j; q++)
            dup |= out_id[q] == i;
        if (dup)
            return tp_error(TP_ERR_INVALID, "ONNX export: output '%s' named twice",
                            tp_predictor_output_name(p, j));
        vname[i] = (char *)tp_predictor_output_name(p, j);
    }
    /* inputs, initializers, nodes, in graph order */
    Onnx__ValueInfoProto **gin = s_new(ex, sizeof *gin * TP_PREDICT_MAX_IO);
    Onnx__ValueInfoProto **gout = s_new(ex, sizeof *gout * (TP_PREDICT_MAX_IO + 1));
    if (!gin || !gout)
        return NOMEM();
    size_t ngin = 0, ngout = 0;
    for (int i = 0; i < nn; i++) {
        if (!keep[i])
            continue;
        tp_node_t *x = tp_model_node(m, -1, i);
        tp_op_kind_t k = tp_node_kind(x);
        if (k == TP_OP_INPUT) {
            const tp_shape_t *s = tp_node_shape(x);
            if (!(gin[ngin++] = s_value_info(ex, vname[i], tp_node_dtype(x), s->ndim, s->d,
                                             tp_node_batched(x))))
                return NOMEM();
        } else if (k == TP_OP_VARIABLE) {
            /* a weight only products read is written transposed by them */
            int as_weight = 0;
            for (int q = i + 1; q < nn; q++) {
                tp_node_t *cq = tp_model_node(m, -1, q);
                as_weight += keep[q] && tp_node_kind(cq) == TP_OP_MATMUL &&
                             tp_node_input(cq, 1) == x;
            }
            if (as_weight == uses[i])
                continue;
            if (!s_init_var(ex, x, NULL, 0, NULL))
                return tp_error_wrap(TP_ERR_NOMEM, "ONNX export: variable '%s'",
                                     tp_node_name(x));
        } else if (k == TP_OP_CONSTANT) {
            /* a constant is an initializer under the node's name */
            const tp_shape_t *s = tp_node_shape(x);
            if (!s_init(ex, vname[i], ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, s->ndim, s->d,
                        tp_node_constant_values(x), sizeof(float) * tp_shape_count(s)))
                return tp_error_wrap(TP_ERR_NOMEM, "ONNX export: constant '%s'",
                                     tp_node_name(x));
        } else if (k != TP_OP_DROPOUT) {
            TP_TRY(s_emit(ex, x, vname, uses, fused, nn));
        }
    }
    for (int j = 0; j < nout; j++) {
        tp_node_t *x = tp_model_node(m, -1, out_id[j]);
        const tp_shape_t *s = tp_node_shape(x);
        if (!(gout[ngout++] = s_value_info(ex, vname[out_id[j]], tp_node_dtype(x), s->ndim, s->d,
                                           tp_node_batched(x))))
            return NOMEM();
    }
    /* the class probabilities next to the logits */
    if (nout >= 1 && !strcmp(tp_predictor_output_name(p, 0), "logits")) {
        tp_node_t *x = tp_model_node(m, -1, out_id[0]);
        const tp_shape_t *s = tp_node_shape(x);
        const char *li[1] = {"logits"};
        Onnx__NodeProto *sm = s->ndim == 2 ? s_node(ex, "Softmax", "probabilities", 1, li) : NULL;
        if (sm) {
            if (!s_attr_i(ex, sm, "axis", 1) ||
                !(gout[ngout++] = s_value_info(ex, "probabilities", TP_FLOAT32, 2, s->d, 1)))
                return NOMEM();
        }
    }
    Onnx__GraphProto *g = s_new(ex, sizeof *g);
    Onnx__OperatorSetIdProto *ops = s_new(ex, sizeof *ops);
    Onnx__OperatorSetIdProto **opsv = s_new(ex, sizeof *opsv);
    if (!g || !ops || !opsv)
        return NOMEM();
    onnx__graph_proto__init(g);
    onnx__operator_set_id_proto__init(ops);
    const char *name = tp_model_name(m);
    g->name = s_str(ex, name ? name : "towerpack");
    g->n_node = ex->nnodes;
    g->node = ex->nodes;
    g->n_initializer = ex->ninits;
    g->initializer = ex->inits;
    g->n_input = ngin;
    g->input = gin;
    g->n_output = ngout;
    g->output = gout;
    ops->domain = s_str(ex, "");
    ops->has_version = 1;
    ops->version = S_OPSET;
    opsv[0] = ops;
    model->has_ir_version = 1;
    model->ir_version = S_IR_VERSION;
    model->n_opset_import = 1;
    model->opset_import = opsv;
    model->producer_name = s_str(ex, "towerpack");
    if (ex->o && ex->o->nmeta > 0) {
        Onnx__StringStringEntryProto **props = s_new(ex, sizeof *props * (size_t)ex->o->nmeta);
        if (!props)
            return NOMEM();
        for (int i = 0; i < ex->o->nmeta; i++) {
            Onnx__StringStringEntryProto *e = s_new(ex, sizeof *e);
            if (!e)
                return NOMEM();
            onnx__string_string_entry_proto__init(e);
            if (!(e->key = s_str(ex, ex->o->meta_keys[i])) ||
                !(e->value = s_str(ex, ex->o->meta_values[i])))
                return NOMEM();
            props[i] = e;
        }
        model->n_metadata_props = (size_t)ex->o->nmeta;
        model->metadata_props = props;
    }
    model->producer_version = s_str(ex, "0.1");
    model->graph = g;
    return g->name && ops->domain && model->producer_name ? TP_OK : NOMEM();
}

tp_status_t tp_predictor_export_onnx(tp_predictor_t *p, const char *path) {
    return tp_predictor_export_onnx_opts(p, path, NULL);
}

tp_status_t tp_predictor_export_onnx_opts(tp_predictor_t *p, const char *path,
                                          const tp_onnx_export_opts_t *opts) {
    if (!p || !path)
        return tp_error(TP_ERR_INVALID, "ONNX export: NULL argument");
    s_ex_t ex;
    memset(&ex, 0, sizeof ex);
    ex.m = tp_predictor_model(p);
    ex.o = opts;
    Onnx__ModelProto model;
    onnx__model_proto__init(&model);
    tp_status_t rc = s_build(&ex, p, &model);
    if (rc == TP_OK) {
        size_t size = onnx__model_proto__get_packed_size(&model);
        uint8_t *buf = malloc(size ? size : 1);
        if (!buf) {
            rc = NOMEM();
        } else {
            onnx__model_proto__pack(&model, buf);
            rc = tp_file_write_atomic(path, buf, size);
            free(buf);
        }
    }
    for (size_t i = 0; i < ex.nallocs; i++)
        free(ex.allocs[i]);
    free(ex.allocs);
    free(ex.nodes);
    free(ex.inits);
    return rc;
}
