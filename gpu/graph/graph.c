/* towerpack gpu: the graph builder a tower function calls.
 *
 * Nodes are appended in call order, which is a topological order (an op can
 * only take nodes that exist). Every builder checks dtypes and shapes right
 * away, so an error names the node the user wrote, not a kernel deep in a
 * step. The first error sticks in the tower; later builders return NULL. */
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/graph.h>

#include "gpu/graph/graph_internal.h"

static const char *const s_op_names[] = {
    "input",       "variable",   "matmul",     "conv2d",
    "bias_add",    "relu",       "leaky_relu", "tanh",
    "sigmoid",     "max_pool",   "avg_pool",   "global_avg_pool",
    "batch_norm",  "dropout",    "reshape",    "add",
    "concat",      "softmax_xent", "accuracy", "error_count",
    "l2_decay",    "cast",       "scale",      "sub",
    "mul",         "div",        "maximum",    "minimum",
    "neg",         "abs",        "square",     "sqrt",
    "rsqrt",       "exp",        "log",        "pow",
    "clip",        "gelu",       "gelu_tanh",  "silu",
    "softplus",    "constant",   "stop_gradient", "mse",
    "l1_loss",     "huber_loss", "sigmoid_xent",
    /* the shape family */
    "transpose",   "slice",      "pad",        "broadcast_to",
    "gather",      "one_hot",
    /* the convolution family */
    "conv2d_transpose", "upsample_nearest", "upsample_bilinear",
    /* the linalg family */
    "batch_matmul", "layer_norm", "group_norm", "instance_norm",
    /* the reduce family */
    "reduce_sum",  "reduce_mean", "reduce_max", "argmax",
    "softmax",     "log_softmax", "softmax_xent_seq", "top_k_accuracy",
    /* fused attention */
    "attention"};
_Static_assert(sizeof s_op_names / sizeof s_op_names[0] == TP_OP_COUNT,
               "one name per op kind");

const char *tp_op_name(tp_op_kind_t kind) {
    return (kind >= 0 && kind < TP_OP_COUNT) ? s_op_names[kind] : "invalid";
}

size_t tp_shape_count(const tp_shape_t *s) {
    size_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        n *= (size_t)s->d[i];
    return n;
}

int tp_shape_same(const tp_shape_t *a, const tp_shape_t *b) {
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->d[i] != b->d[i])
            return 0;
    return 1;
}

static char *s_shape_str(const tp_shape_t *s, char *buf, size_t size) {
    size_t len = 0;
    len += (size_t)snprintf(buf + len, size - len, "[");
    for (int i = 0; i < s->ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? "," : "",
                                (long long)s->d[i]);
    if (len < size)
        snprintf(buf + len, size - len, "]");
    return buf;
}

/* ---- tower context ------------------------------------------------------ */

tp_tower_t *tp_tower_new_(tp_model_t *m, int index, int training,
                          int64_t batch) {
    tp_tower_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->model = m;
    t->index = index;
    t->training = training;
    t->replica = index >= 0 ? index % m->nrep : 0; /* devices round robin */
    t->batch = batch;
    t->ncosts = 1;
    t->cost_names[0] = "cost";
    if (index >= 0)
        snprintf(t->name, sizeof t->name, "tower%d", index);
    else
        snprintf(t->name, sizeof t->name, "infer");
    return t;
}

void tp_tower_destroy_(tp_tower_t **t_p) {
    if (!t_p || !*t_p)
        return;
    tp_tower_t *t = *t_p;
    for (int i = 0; i < t->nnodes; i++) {
        free(t->nodes[i]->name);
        free(t->nodes[i]->inputs);
        free(t->nodes[i]->dx_acc);
        free((float *)t->nodes[i]->attr.data);
        free(t->nodes[i]);
    }
    free(t->nodes);
    free(t->input_nodes);
    for (int i = 0; i < t->noutputs; i++)
        free(t->outputs[i].name);
    free(t->outputs);
    for (int i = 0; i < t->nscopes; i++)
        free(t->scopes[i]);
    for (int i = 1; i < t->ncosts; i++) {
        free(t->cost_names[i]);
        free(t->cost_vars[i]);
    }
    free(t->var_seen);
    free(t->fuse);
    free(t->buckets);
    free(t->fuse_rest);
    free(t);
    *t_p = NULL;
}

const char *tp_tower_name(const tp_tower_t *t) { return t->name; }
int tp_tower_index(const tp_tower_t *t) { return t->index; }
int tp_tower_device(const tp_tower_t *t) { return tp_tower_backend_(t)->device; }
int tp_tower_is_training(const tp_tower_t *t) { return t->training; }
int64_t tp_tower_batch(const tp_tower_t *t) { return t->batch; }
tp_status_t tp_tower_status(const tp_tower_t *t) { return t->status; }

const char *tp_node_name(const tp_node_t *n) { return n->name; }
const tp_shape_t *tp_node_shape(const tp_node_t *n) { return &n->shape; }
tp_dtype_t tp_node_dtype(const tp_node_t *n) { return n->dtype; }
tp_op_kind_t tp_node_kind(const tp_node_t *n) { return n->kind; }
int tp_node_input_count(const tp_node_t *n) { return n->ninputs; }
tp_node_t *tp_node_input(const tp_node_t *n, int i) {
    return i >= 0 && i < n->ninputs ? n->inputs[i] : NULL;
}
int tp_node_batched(const tp_node_t *n) { return n->batched; }
tp_node_t *tp_node_state(const tp_node_t *n, int i) {
    return n->kind == TP_OP_BATCH_NORM && (i == 0 || i == 1) ? n->state[i] : NULL;
}
const float *tp_node_constant_values(const tp_node_t *n) {
    return n->kind == TP_OP_CONSTANT ? n->attr.data : NULL;
}
int tp_node_input_index(const tp_node_t *n) {
    return n->kind == TP_OP_INPUT ? n->input : -1;
}
void tp_node_attrs(const tp_node_t *n, tp_node_attrs_t *o) {
    memset(o, 0, sizeof *o);
    o->kernel[0] = n->attr.kh;
    o->kernel[1] = n->attr.kw;
    o->stride[0] = n->attr.sh;
    o->stride[1] = n->attr.sw;
    o->axes = n->attr.axes;
    o->pad[0] = n->attr.ph;
    o->pad[1] = n->attr.pw;
    o->alpha = n->attr.alpha;
    o->eps = n->attr.eps;
    o->beta = n->attr.beta;
    o->training = n->attr.training;
    o->in_dtype = n->attr.in_dtype;
    o->axis = n->attr.axis;
    memcpy(o->dims_a, n->attr.dims_a, sizeof o->dims_a);
    memcpy(o->dims_b, n->attr.dims_b, sizeof o->dims_b);
    /* the convolution family: the attributes' 0 means 1 */
    o->dilation[0] = n->attr.dh > 0 ? n->attr.dh : 1;
    o->dilation[1] = n->attr.dw > 0 ? n->attr.dw : 1;
    o->groups = n->attr.groups > 0 ? n->attr.groups : 1;
    o->output_pad[0] = n->attr.oph;
    o->output_pad[1] = n->attr.opw;
    o->align_corners = n->attr.align_corners;
    /* the linalg family */
    o->trans_a = n->attr.trans_a;
    o->trans_b = n->attr.trans_b;
    o->norm_axes = n->attr.norm_axes;
    o->norm_groups = n->attr.norm_groups;
    o->norm_absent = n->attr.norm_absent;
    o->heads = n->attr.heads;
}

/* Record the tower's first error, naming the tower and node. */
__attribute__((format(printf, 4, 5))) static void
s_fail(tp_tower_t *t, tp_status_t st, const char *node, const char *fmt,
       ...) {
    if (t->status < 0)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t->status = tp_error(st, "%s: node '%s': %s", t->name, node ? node : "?",
                         msg);
}

tp_status_t tp_tower_push_scope(tp_tower_t *t, const char *scope) {
    if (t->nscopes >= TP_SCOPE_DEPTH)
        return tp_error(TP_ERR_INVALID, "%s: scopes nest deeper than %d",
                        t->name, TP_SCOPE_DEPTH);
    if (!scope || !*scope || strchr(scope, '/') == scope)
        return tp_error(TP_ERR_INVALID, "%s: empty scope name", t->name);
    t->scopes[t->nscopes] = strdup(scope);
    if (!t->scopes[t->nscopes])
        return tp_error(TP_ERR_NOMEM, "scope name");
    t->nscopes++;
    return TP_OK;
}

void tp_tower_pop_scope(tp_tower_t *t) {
    if (t->nscopes > 0)
        free(t->scopes[--t->nscopes]);
}

/* Full scoped name into buf; 0 when it does not fit. */
static int s_full_name(tp_tower_t *t, const char *name, char *buf,
                       size_t size) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < t->nscopes; i++) {
        int w = snprintf(buf + len, size - len, "%s/", t->scopes[i]);
        if (w < 0 || (size_t)w >= size - len)
            return 0;
        len += (size_t)w;
    }
    int w = snprintf(buf + len, size - len, "%s", name);
    return w >= 0 && (size_t)w < size - len;
}

static tp_node_t *s_find_node(tp_tower_t *t, const char *name) {
    for (int i = 0; i < t->nnodes; i++)
        if (strcmp(t->nodes[i]->name, name) == 0)
            return t->nodes[i];
    return NULL;
}

/* Append a node named `name` (scoped; NULL: "<op>_<id>"), checking that the
 * inputs exist in this tower. Returns NULL after recording an error. */
static tp_node_t *s_node(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                         int ninputs, tp_node_t *const *inputs) {
    if (t->status < 0)
        return NULL;
    char full[TP_NAME_MAX], autoname[64];
    if (!name) {
        snprintf(autoname, sizeof autoname, "%s_%d", tp_op_name(kind),
                 t->nnodes);
        name = autoname;
    }
    if (!s_full_name(t, name, full, sizeof full)) {
        s_fail(t, TP_ERR_INVALID, name, "name longer than %d bytes",
               TP_NAME_MAX - 1);
        return NULL;
    }
    for (int i = 0; i < ninputs; i++) {
        if (!inputs[i]) {
            s_fail(t, TP_ERR_INVALID, full, "input %d is NULL", i);
            return NULL;
        }
        if (inputs[i]->id >= t->nnodes || t->nodes[inputs[i]->id] != inputs[i]) {
            s_fail(t, TP_ERR_INVALID, full,
                   "input %d ('%s') belongs to another tower", i,
                   inputs[i]->name);
            return NULL;
        }
    }
    if (s_find_node(t, full)) {
        s_fail(t, TP_ERR_INVALID, full, "a node of this name already exists");
        return NULL;
    }
    if (t->nnodes == t->cap_nodes) {
        int cap = t->cap_nodes ? 2 * t->cap_nodes : 64;
        tp_node_t **nn = realloc(t->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            s_fail(t, TP_ERR_NOMEM, full, "out of memory");
            return NULL;
        }
        t->nodes = nn;
        t->cap_nodes = cap;
    }
    tp_node_t *n = calloc(1, sizeof *n);
    if (n) {
        n->name = strdup(full);
        n->inputs = calloc((size_t)(ninputs ? ninputs : 1), sizeof *n->inputs);
        n->dx_acc = calloc((size_t)(ninputs ? ninputs : 1), sizeof(int));
    }
    if (!n || !n->name || !n->inputs || !n->dx_acc) {
        if (n) {
            free(n->name);
            free(n->inputs);
            free(n->dx_acc);
            free(n);
        }
        s_fail(t, TP_ERR_NOMEM, full, "out of memory");
        return NULL;
    }
    n->id = t->nnodes;
    n->kind = kind;
    n->dtype = TP_FLOAT32;
    n->ninputs = ninputs;
    n->var = -1;
    n->input = -1;
    n->attr.training = t->training;
    for (int i = 0; i < ninputs; i++)
        n->inputs[i] = inputs[i];
    if (ninputs > 0) {
        n->shape = inputs[0]->shape;
        n->batched = inputs[0]->batched;
    }
    t->nodes[t->nnodes++] = n;
    return n;
}

/* Undo the last s_node after a shape error (keeps names reusable). */
static tp_node_t *s_drop_last(tp_tower_t *t) {
    tp_node_t *n = t->nodes[--t->nnodes];
    free((float *)n->attr.data);
    free(n->name);
    free(n->inputs);
    free(n->dx_acc);
    free(n);
    return NULL;
}

#define FAIL(t, n, ...)                                                      \
    do {                                                                     \
        s_fail(t, TP_ERR_SHAPE, (n)->name, __VA_ARGS__);                     \
        return s_drop_last(t);                                               \
    } while (0)

static int s_check_float(tp_tower_t *t, tp_node_t *n, int i) {
    if (n->inputs[i]->dtype != TP_FLOAT32) {
        s_fail(t, TP_ERR_SHAPE, n->name, "input %d ('%s') is %s, not float32",
               i, n->inputs[i]->name, tp_dtype_name(n->inputs[i]->dtype));
        return 0;
    }
    return 1;
}

/* The builders' first step: s_node, then its first `nfloat` inputs checked
 * to be float32 (the node dropped again when one is not). */
static tp_node_t *s_node_float(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                               int ninputs, tp_node_t *const *inputs, int nfloat) {
    tp_node_t *n = s_node(t, name, kind, ninputs, inputs);
    if (!n)
        return NULL;
    for (int i = 0; i < nfloat; i++)
        if (!s_check_float(t, n, i))
            return s_drop_last(t);
    return n;
}

tp_node_t *tp_input_node_(tp_tower_t *t, int index, const tp_input_desc_t *d,
                          int64_t batch);
tp_node_t *tp_input_node_(tp_tower_t *t, int index, const tp_input_desc_t *d,
                          int64_t batch) {
    tp_node_t *n = s_node(t, d->name, TP_OP_INPUT, 0, NULL);
    if (!n)
        return NULL;
    n->input = index;
    n->dtype = d->dtype;
    n->batched = 1;
    n->shape.ndim = d->ndim;
    for (int i = 0; i < d->ndim; i++)
        n->shape.d[i] = d->shape[i];
    n->shape.d[0] = batch;
    return n;
}

/* ---- variables ---------------------------------------------------------- */

uint64_t tp_hash_name_(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static int s_find_var(tp_model_t *m, const char *name) {
    for (int i = 0; i < m->nvars; i++)
        if (strcmp(m->vars[i].name, name) == 0)
            return i;
    return -1;
}

tp_node_t *tp_variable(tp_tower_t *t, const char *name, int ndim,
                       const int64_t *shape, tp_init_t init,
                       tp_var_collection_t collection) {
    if (t->status < 0)
        return NULL;
    tp_model_t *m = t->model;
    char full[TP_NAME_MAX];
    if (!name || !*name || !s_full_name(t, name, full, sizeof full)) {
        s_fail(t, TP_ERR_INVALID, name, "bad variable name");
        return NULL;
    }
    if (ndim < 0 || ndim > TP_MAX_DIMS) {
        s_fail(t, TP_ERR_SHAPE, full, "variable with %d dims", ndim);
        return NULL;
    }
    tp_shape_t s = {.ndim = ndim};
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0) {
            s_fail(t, TP_ERR_SHAPE, full, "variable dim %d is %lld", i,
                   (long long)shape[i]);
            return NULL;
        }
        s.d[i] = shape[i];
    }
    int creator = (t == (m->ntowers > 0 ? m->towers[0] : m->infer));
    int vi = s_find_var(m, full);
    if (vi >= 0 && vi < t->var_seen_cap && t->var_seen[vi]) {
        s_fail(t, TP_ERR_INVALID, full,
               "variable asked for twice in one tower (a scope used twice?)");
        return NULL;
    }
    if (vi < 0) {
        if (!creator) {
            s_fail(t, TP_ERR_INVALID, full,
                   "variable was not created by the first tower (a tower "
                   "function must create the same variables every call)");
            return NULL;
        }
        if (m->nvars == m->cap_vars) {
            int cap = m->cap_vars ? 2 * m->cap_vars : 32;
            tp_var_t *nv = realloc(m->vars, (size_t)cap * sizeof *nv);
            if (!nv) {
                s_fail(t, TP_ERR_NOMEM, full, "out of memory");
                return NULL;
            }
            m->vars = nv;
            m->cap_vars = cap;
        }
        tp_var_t *v = &m->vars[m->nvars];
        memset(v, 0, sizeof *v);
        v->name = strdup(full);
        if (!v->name) {
            s_fail(t, TP_ERR_NOMEM, full, "out of memory");
            return NULL;
        }
        v->shape = s;
        v->count = tp_shape_count(&s);
        v->trainable = collection == TP_VAR_TRAINABLE;
        v->init = init;
        vi = m->nvars++;
    } else {
        tp_var_t *v = &m->vars[vi];
        char a[96], b[96];
        if (v->shape.ndim != s.ndim ||
            memcmp(v->shape.d, s.d, sizeof(int64_t) * (size_t)s.ndim)) {
            s_fail(t, TP_ERR_SHAPE, full,
                   "variable exists with shape %s, asked for %s",
                   s_shape_str(&v->shape, a, sizeof a),
                   s_shape_str(&s, b, sizeof b));
            return NULL;
        }
        if (v->trainable != (collection == TP_VAR_TRAINABLE)) {
            s_fail(t, TP_ERR_INVALID, full,
                   "variable exists in another collection");
            return NULL;
        }
    }
    if (vi >= t->var_seen_cap) {
        int cap = t->var_seen_cap ? t->var_seen_cap : 32;
        while (cap <= vi)
            cap *= 2;
        unsigned char *ns = realloc(t->var_seen, (size_t)cap);
        if (!ns) {
            s_fail(t, TP_ERR_NOMEM, full, "out of memory");
            return NULL;
        }
        memset(ns + t->var_seen_cap, 0, (size_t)(cap - t->var_seen_cap));
        t->var_seen = ns;
        t->var_seen_cap = cap;
    }
    t->var_seen[vi] = 1;
    /* The node carries the variable's full name; scopes are already in it. */
    int saved = t->nscopes;
    t->nscopes = 0;
    tp_node_t *n = s_node(t, full, TP_OP_VARIABLE, 0, NULL);
    t->nscopes = saved;
    if (!n)
        return NULL;
    n->var = vi;
    n->shape = s;
    n->batched = 0;
    return n;
}

/* ---- ops ---------------------------------------------------------------- */

tp_node_t *tp_matmul(tp_tower_t *t, const char *name, tp_node_t *x,
                     tp_node_t *w) {
    tp_node_t *in[2] = {x, w};
    tp_node_t *n = s_node_float(t, name, TP_OP_MATMUL, 2, in, 2);
    if (!n)
        return NULL;
    char a[96], b[96];
    if (x->shape.ndim < 2)
        FAIL(t, n, "x is %s: needs [N,K...]", s_shape_str(&x->shape, a, 96));
    int64_t k = 1;
    for (int i = 1; i < x->shape.ndim; i++)
        k *= x->shape.d[i];
    if (w->batched || w->shape.ndim != 2 || w->shape.d[0] != k)
        FAIL(t, n, "x is %s (K=%lld) but W is %s: W must be [K,M]",
             s_shape_str(&x->shape, a, 96), (long long)k,
             s_shape_str(&w->shape, b, 96));
    n->shape.ndim = 2;
    n->shape.d[0] = x->shape.d[0];
    n->shape.d[1] = w->shape.d[1];
    n->batched = x->batched;
    return n;
}

/* conv2d with an optional fused bias b[O] (input 2), dilation and groups
 * (1 and 1: the plain convolution, whose attributes leave both 0). */
static tp_node_t *s_conv(tp_tower_t *t, const char *name, tp_node_t *x,
                         tp_node_t *w, tp_node_t *bias, int stride, int pad,
                         int dilation, int groups) {
    tp_node_t *in[3] = {x, w, bias};
    const int nin = bias ? 3 : 2;
    tp_node_t *n = s_node_float(t, name, TP_OP_CONV2D, nin, in, nin);
    if (!n)
        return NULL;
    char a[96], b[96];
    if (bias && (bias->batched || bias->shape.ndim != 1 ||
                 w->shape.ndim != 4 || bias->shape.d[0] != w->shape.d[0]))
        FAIL(t, n, "bias is %s, W is %s: bias must be [O]",
             s_shape_str(&bias->shape, a, 96), s_shape_str(&w->shape, b, 96));
    if (groups < 1 || dilation < 1)
        FAIL(t, n, "dilation %d, groups %d: both must be >= 1", dilation, groups);
    if (groups == 1 && (x->shape.ndim != 4 || w->shape.ndim != 4 || w->batched ||
                        x->shape.d[1] != w->shape.d[1]))
        FAIL(t, n, "x is %s, W is %s: need x [N,C,H,W] and W [O,C,KH,KW]",
             s_shape_str(&x->shape, a, 96), s_shape_str(&w->shape, b, 96));
    if (groups > 1 && (x->shape.ndim != 4 || w->shape.ndim != 4 || w->batched ||
                       x->shape.d[1] % groups || w->shape.d[0] % groups ||
                       x->shape.d[1] / groups != w->shape.d[1]))
        FAIL(t, n, "x is %s, W is %s, %d groups: need x [N,C,H,W] and W "
             "[O,C/groups,KH,KW] with C and O multiples of the groups",
             s_shape_str(&x->shape, a, 96), s_shape_str(&w->shape, b, 96), groups);
    if (stride < 1 || pad < 0)
        FAIL(t, n, "stride %d, pad %d", stride, pad);
    const int64_t ekh = (int64_t)dilation * (w->shape.d[2] - 1) + 1,
                  ekw = (int64_t)dilation * (w->shape.d[3] - 1) + 1;
    int64_t oh = (x->shape.d[2] + 2 * pad - ekh) / stride + 1;
    int64_t ow = (x->shape.d[3] + 2 * pad - ekw) / stride + 1;
    if (x->shape.d[2] + 2 * pad < ekh || x->shape.d[3] + 2 * pad < ekw ||
        oh < 1 || ow < 1)
        FAIL(t, n, "kernel %s%s larger than the padded input %s",
             s_shape_str(&w->shape, b, 96), dilation > 1 ? " (dilated)" : "",
             s_shape_str(&x->shape, a, 96));
    n->attr.kh = (int)w->shape.d[2];
    n->attr.kw = (int)w->shape.d[3];
    n->attr.sh = n->attr.sw = stride;
    n->attr.ph = n->attr.pw = pad;
    /* defaults stay 0 (backend_impl.h): a plain conv's attributes, and so
     * its descriptor cache keys and fold, are what they always were */
    n->attr.dh = n->attr.dw = dilation > 1 ? dilation : 0;
    n->attr.groups = groups > 1 ? groups : 0;
    n->shape.d[1] = w->shape.d[0];
    n->shape.d[2] = oh;
    n->shape.d[3] = ow;
    return n;
}

tp_node_t *tp_conv2d_op(tp_tower_t *t, const char *name, tp_node_t *x,
                        tp_node_t *w, int stride, int pad) {
    return s_conv(t, name, x, w, NULL, stride, pad, 1, 1);
}

/* ---- the convolution family --------------------------------------------- */

tp_node_t *tp_conv2d_ex(tp_tower_t *t, const char *name, tp_node_t *x,
                        tp_node_t *w, tp_node_t *b, int stride, int pad,
                        int dilation, int groups) {
    return s_conv(t, name, x, w, b, stride, pad, dilation, groups);
}

tp_node_t *tp_conv2d_transpose_op(tp_tower_t *t, const char *name,
                                  tp_node_t *x, tp_node_t *w, tp_node_t *bias,
                                  int stride, int pad, int output_pad,
                                  int dilation, int groups) {
    tp_node_t *in[3] = {x, w, bias};
    const int nin = bias ? 3 : 2;
    tp_node_t *n = s_node_float(t, name, TP_OP_CONV_TRANSPOSE, nin, in, nin);
    if (!n)
        return NULL;
    char a[96], b[96];
    if (groups < 1 || dilation < 1 || stride < 1 || pad < 0)
        FAIL(t, n, "stride %d, pad %d, dilation %d, groups %d: need stride, "
             "dilation, groups >= 1 and pad >= 0", stride, pad, dilation, groups);
    if (x->shape.ndim != 4 || w->shape.ndim != 4 || w->batched ||
        x->shape.d[1] != w->shape.d[0] || x->shape.d[1] % groups)
        FAIL(t, n, "x is %s, W is %s, %d group%s: need x [N,C,H,W] and W "
             "[C,O/groups,KH,KW] (input channels first), C a multiple of the groups",
             s_shape_str(&x->shape, a, 96), s_shape_str(&w->shape, b, 96), groups,
             groups > 1 ? "s" : "");
    const int64_t o = w->shape.d[1] * groups;
    if (bias && (bias->batched || bias->shape.ndim != 1 || bias->shape.d[0] != o))
        FAIL(t, n, "bias is %s, W is %s, %d group%s: bias must be [O] = [%lld]",
             s_shape_str(&bias->shape, a, 96), s_shape_str(&w->shape, b, 96),
             groups, groups > 1 ? "s" : "", (long long)o);
    if (output_pad < 0 || (output_pad >= stride && output_pad >= dilation))
        FAIL(t, n, "output padding %d with stride %d, dilation %d: must be "
             "below the stride or the dilation", output_pad, stride, dilation);
    const int64_t oh = (x->shape.d[2] - 1) * stride - 2 * pad +
                       (int64_t)dilation * (w->shape.d[2] - 1) + output_pad + 1;
    const int64_t ow = (x->shape.d[3] - 1) * stride - 2 * pad +
                       (int64_t)dilation * (w->shape.d[3] - 1) + output_pad + 1;
    if (oh < 1 || ow < 1)
        FAIL(t, n, "x %s, W %s, stride %d, pad %d: the output would be %lldx%lld",
             s_shape_str(&x->shape, a, 96), s_shape_str(&w->shape, b, 96), stride,
             pad, (long long)oh, (long long)ow);
    n->attr.kh = (int)w->shape.d[2];
    n->attr.kw = (int)w->shape.d[3];
    n->attr.sh = n->attr.sw = stride;
    n->attr.ph = n->attr.pw = pad;
    n->attr.dh = n->attr.dw = dilation;
    n->attr.groups = groups;
    n->attr.oph = n->attr.opw = output_pad;
    n->shape.d[1] = o;
    n->shape.d[2] = oh;
    n->shape.d[3] = ow;
    return n;
}

static tp_node_t *s_upsample(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                             tp_node_t *x, int factor, int align) {
    tp_node_t *in[1] = {x};
    tp_node_t *n = s_node_float(t, name, kind, 1, in, 1);
    if (!n)
        return NULL;
    char a[96];
    if (x->shape.ndim != 4 || factor < 1)
        FAIL(t, n, "x is %s, factor %d: need x [N,C,H,W] and a factor >= 1",
             s_shape_str(&x->shape, a, 96), factor);
    n->attr.sh = n->attr.sw = factor;
    n->attr.align_corners = align ? 1 : 0;
    n->shape.d[2] = x->shape.d[2] * factor;
    n->shape.d[3] = x->shape.d[3] * factor;
    return n;
}

tp_node_t *tp_upsample_nearest(tp_tower_t *t, const char *name, tp_node_t *x,
                               int factor) {
    return s_upsample(t, name, TP_OP_UPSAMPLE_NEAREST, x, factor, 0);
}

tp_node_t *tp_upsample_bilinear(tp_tower_t *t, const char *name, tp_node_t *x,
                                int factor, int align_corners) {
    return s_upsample(t, name, TP_OP_UPSAMPLE_BILINEAR, x, factor, align_corners);
}

tp_node_t *tp_bias_add(tp_tower_t *t, const char *name, tp_node_t *x,
                       tp_node_t *b) {
    tp_node_t *in[2] = {x, b};
    tp_node_t *n = s_node_float(t, name, TP_OP_BIAS_ADD, 2, in, 2);
    if (!n)
        return NULL;
    char a[96], c[96];
    if (x->shape.ndim < 2 || b->shape.ndim != 1 || b->batched ||
        b->shape.d[0] != x->shape.d[1])
        FAIL(t, n, "x is %s, b is %s: b must be [C] for x [N,C,...]",
             s_shape_str(&x->shape, a, 96), s_shape_str(&b->shape, c, 96));
    return n;
}

static tp_node_t *s_unary(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                          tp_node_t *x, float alpha) {
    tp_node_t *n = s_node_float(t, name, kind, 1, &x, 1);
    if (!n)
        return NULL;
    n->attr.alpha = alpha;
    return n;
}

/* The plain elementwise builders (no attribute, no check of their own)
 * differ in their op kind alone: one line each here, the definition written
 * once; their declarations and docs are in towerpack/graph.h. */
#define S_UNARY_BUILDER(fn, kind)                                             \
    tp_node_t *fn(tp_tower_t *t, const char *name, tp_node_t *x) {            \
        return s_unary(t, name, kind, x, 0);                                  \
    }
S_UNARY_BUILDER(tp_relu, TP_OP_RELU)
S_UNARY_BUILDER(tp_tanh, TP_OP_TANH)
S_UNARY_BUILDER(tp_sigmoid, TP_OP_SIGMOID)
S_UNARY_BUILDER(tp_neg, TP_OP_NEG)
S_UNARY_BUILDER(tp_abs, TP_OP_ABS)
S_UNARY_BUILDER(tp_square, TP_OP_SQUARE)
S_UNARY_BUILDER(tp_sqrt, TP_OP_SQRT)
S_UNARY_BUILDER(tp_rsqrt, TP_OP_RSQRT)
S_UNARY_BUILDER(tp_exp, TP_OP_EXP)
S_UNARY_BUILDER(tp_ln, TP_OP_LOG)
S_UNARY_BUILDER(tp_silu, TP_OP_SILU)
S_UNARY_BUILDER(tp_softplus, TP_OP_SOFTPLUS)
S_UNARY_BUILDER(tp_stop_gradient, TP_OP_STOP_GRADIENT)
#undef S_UNARY_BUILDER

tp_node_t *tp_leaky_relu(tp_tower_t *t, const char *name, tp_node_t *x,
                         float alpha) {
    return s_unary(t, name, TP_OP_LEAKY_RELU, x, alpha);
}
tp_node_t *tp_scale(tp_tower_t *t, const char *name, tp_node_t *x,
                    float factor) {
    return s_unary(t, name, TP_OP_SCALE, x, factor);
}

tp_node_t *tp_dropout(tp_tower_t *t, const char *name, tp_node_t *x,
                      float rate) {
    tp_node_t *n = s_unary(t, name, TP_OP_DROPOUT, x, rate);
    if (n && !(rate >= 0.0f && rate < 1.0f))
        FAIL(t, n, "drop rate %g outside [0,1)", (double)rate);
    return n;
}

static tp_node_t *s_pool(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                         tp_node_t *x, int window, int stride, int pad) {
    tp_node_t *n = s_node_float(t, name, kind, 1, &x, 1);
    if (!n)
        return NULL;
    char a[96];
    if (x->shape.ndim != 4)
        FAIL(t, n, "x is %s: needs [N,C,H,W]", s_shape_str(&x->shape, a, 96));
    if (kind == TP_OP_GLOBAL_AVG_POOL) {
        n->shape.ndim = 2;
        return n;
    }
    if (window < 1 || stride < 1 || pad < 0 || pad >= window)
        FAIL(t, n, "window %d, stride %d, pad %d (need pad < window)", window,
             stride, pad);
    int64_t oh = (x->shape.d[2] + 2 * pad - window) / stride + 1;
    int64_t ow = (x->shape.d[3] + 2 * pad - window) / stride + 1;
    if (x->shape.d[2] + 2 * pad < window || x->shape.d[3] + 2 * pad < window)
        FAIL(t, n, "window %d larger than the padded input %s", window,
             s_shape_str(&x->shape, a, 96));
    n->attr.kh = n->attr.kw = window;
    n->attr.sh = n->attr.sw = stride;
    n->attr.ph = n->attr.pw = pad;
    n->shape.d[2] = oh;
    n->shape.d[3] = ow;
    return n;
}

tp_node_t *tp_max_pool(tp_tower_t *t, const char *name, tp_node_t *x,
                       int window, int stride, int pad) {
    return s_pool(t, name, TP_OP_MAX_POOL, x, window, stride, pad);
}
tp_node_t *tp_avg_pool(tp_tower_t *t, const char *name, tp_node_t *x,
                       int window, int stride, int pad) {
    return s_pool(t, name, TP_OP_AVG_POOL, x, window, stride, pad);
}
tp_node_t *tp_global_avg_pool(tp_tower_t *t, const char *name, tp_node_t *x) {
    return s_pool(t, name, TP_OP_GLOBAL_AVG_POOL, x, 1, 1, 0);
}

tp_node_t *tp_batch_norm_op(tp_tower_t *t, const char *name, tp_node_t *x,
                            tp_node_t *gamma, tp_node_t *beta,
                            tp_node_t *moving_mean, tp_node_t *moving_var,
                            float momentum, float eps) {
    tp_node_t *in[3] = {x, gamma, beta};
    if (t->status >= 0 && (!moving_mean || !moving_var)) {
        s_fail(t, TP_ERR_INVALID, name, "moving mean or variance is NULL");
        return NULL;
    }
    tp_node_t *n = s_node_float(t, name, TP_OP_BATCH_NORM, 3, in, 3);
    if (!n)
        return NULL;
    char a[96];
    if (x->shape.ndim != 2 && x->shape.ndim != 4)
        FAIL(t, n, "x is %s: needs [N,C] or [N,C,H,W]",
             s_shape_str(&x->shape, a, 96));
    int64_t c = x->shape.d[1];
    tp_node_t *p[4] = {gamma, beta, moving_mean, moving_var};
    for (int i = 0; i < 4; i++) {
        if (p[i]->shape.ndim != 1 || p[i]->shape.d[0] != c || p[i]->batched)
            FAIL(t, n, "'%s' is %s, must be [%lld]", p[i]->name,
                 s_shape_str(&p[i]->shape, a, 96), (long long)c);
    }
    if (moving_mean->kind != TP_OP_VARIABLE || moving_var->kind != TP_OP_VARIABLE ||
        t->model->vars[moving_mean->var].trainable ||
        t->model->vars[moving_var->var].trainable)
        FAIL(t, n, "moving mean and variance must be model-only variables");
    if (!(momentum >= 0.0f && momentum <= 1.0f) || !(eps > 0.0f))
        FAIL(t, n, "momentum %g, eps %g", (double)momentum, (double)eps);
    n->state[0] = moving_mean;
    n->state[1] = moving_var;
    n->attr.alpha = momentum;
    n->attr.eps = eps;
    n->attr.update_state = t->training && t->index == 0;
    return n;
}

tp_node_t *tp_reshape(tp_tower_t *t, const char *name, tp_node_t *x,
                      int ndim, const int64_t *shape) {
    tp_node_t *n = s_node(t, name, TP_OP_RESHAPE, 1, &x);
    if (!n)
        return NULL;
    char a[96];
    if (ndim < 1 || ndim > TP_MAX_DIMS)
        FAIL(t, n, "%d dims", ndim);
    tp_shape_t s = {.ndim = ndim};
    for (int i = 0; i < ndim; i++)
        s.d[i] = shape[i];
    if (x->batched) {
        if (shape[0] != -1)
            FAIL(t, n, "x %s is batched: the new shape's dim 0 must be -1",
                 s_shape_str(&x->shape, a, 96));
        s.d[0] = x->shape.d[0];
    }
    /* one -1 (past a batched x's dim 0) is inferred from the count */
    int infer = -1;
    int64_t known = 1;
    for (int i = x->batched ? 1 : 0; i < ndim; i++) {
        if (s.d[i] == -1 && infer < 0) {
            infer = i;
            continue;
        }
        if (s.d[i] == -1)
            FAIL(t, n, "dims %d and %d are both -1: at most one is inferred", infer, i);
        if (s.d[i] < 0)
            FAIL(t, n, "dim %d is %lld", i, (long long)s.d[i]);
        known *= s.d[i];
    }
    if (infer >= 0) {
        const int64_t total = (int64_t)tp_shape_count(&x->shape);
        const int64_t rest = x->batched ? known * s.d[0] : known;
        if (rest == 0 || total % rest)
            FAIL(t, n, "cannot infer dim %d: %s has %lld elements, not a multiple "
                 "of the other dims' %lld", infer, s_shape_str(&x->shape, a, 96),
                 (long long)total, (long long)rest);
        s.d[infer] = total / rest;
    }
    if (tp_shape_count(&s) != tp_shape_count(&x->shape)) {
        char b[96];
        FAIL(t, n, "cannot reshape %s to %s", s_shape_str(&x->shape, a, 96),
             s_shape_str(&s, b, 96));
    }
    n->shape = s;
    n->dtype = x->dtype;
    return n;
}

tp_node_t *tp_flatten(tp_tower_t *t, const char *name, tp_node_t *x) {
    if (!x || t->status < 0)
        return s_node(t, name, TP_OP_RESHAPE, 1, &x);
    int64_t k = 1;
    for (int i = 1; i < x->shape.ndim; i++)
        k *= x->shape.d[i];
    int64_t s[2] = {x->batched ? -1 : x->shape.d[0], k};
    if (x->shape.ndim == 0) {
        int64_t one = 1;
        return tp_reshape(t, name, x, 1, &one);
    }
    return tp_reshape(t, name, x, 2, s);
}

/* NumPy broadcasting of a and b into n's shape (the shape rule of every
 * binary elementwise op). Records the error naming both shapes; 0 then. */
static int s_broadcast(tp_tower_t *t, tp_node_t *n, const tp_node_t *a,
                       const tp_node_t *b) {
    char x[96], y[96];
    const tp_node_t *in[2] = {a, b};
    const int r = a->shape.ndim > b->shape.ndim ? a->shape.ndim : b->shape.ndim;
    const int batched = a->batched || b->batched;
    for (int i = 0; i < 2; i++) {
        const tp_node_t *p = in[i];
        /* the batch stays dim 0: a batched operand of lower rank would put
         * it elsewhere, and an unbatched dim 0 would have to match a batch
         * that changes from step to step */
        if (p->batched && p->shape.ndim != r) {
            s_fail(t, TP_ERR_SHAPE, n->name,
                   "cannot broadcast %s with %s: the batched input %d ('%s') "
                   "must have the result's %d dims", s_shape_str(&a->shape, x, 96),
                   s_shape_str(&b->shape, y, 96), i, p->name, r);
            return 0;
        }
        if (batched && !p->batched && p->shape.ndim == r && p->shape.d[0] != 1) {
            s_fail(t, TP_ERR_SHAPE, n->name,
                   "cannot broadcast %s with %s: input %d ('%s') is not batched, "
                   "so its dim 0 must be 1 against the batch",
                   s_shape_str(&a->shape, x, 96), s_shape_str(&b->shape, y, 96),
                   i, p->name);
            return 0;
        }
    }
    tp_shape_t o = {.ndim = r};
    for (int d = 0; d < r; d++) {
        const int ia = d - (r - a->shape.ndim), ib = d - (r - b->shape.ndim);
        const int64_t da = ia >= 0 ? a->shape.d[ia] : 1;
        const int64_t db = ib >= 0 ? b->shape.d[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            s_fail(t, TP_ERR_SHAPE, n->name,
                   "cannot broadcast %s with %s: dim %d of the result is %lld "
                   "in one and %lld in the other (need equal, or 1)",
                   s_shape_str(&a->shape, x, 96), s_shape_str(&b->shape, y, 96),
                   d, (long long)da, (long long)db);
            return 0;
        }
        o.d[d] = da == 1 ? db : da;
    }
    n->shape = o;
    n->batched = batched;
    return 1;
}

static tp_node_t *s_binary(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                           tp_node_t *a, tp_node_t *b) {
    tp_node_t *in[2] = {a, b};
    tp_node_t *n = s_node_float(t, name, kind, 2, in, 2);
    if (!n)
        return NULL;
    if (!s_broadcast(t, n, a, b))
        return s_drop_last(t);
    return n;
}

/* The binary elementwise builders differ in their op kind alone. */
#define S_BINARY_BUILDER(fn, kind)                                            \
    tp_node_t *fn(tp_tower_t *t, const char *name, tp_node_t *a,              \
                  tp_node_t *b) {                                             \
        return s_binary(t, name, kind, a, b);                                 \
    }
S_BINARY_BUILDER(tp_add, TP_OP_ADD)
S_BINARY_BUILDER(tp_sub, TP_OP_SUB)
S_BINARY_BUILDER(tp_mul, TP_OP_MUL)
S_BINARY_BUILDER(tp_div, TP_OP_DIV)
S_BINARY_BUILDER(tp_maximum, TP_OP_MAXIMUM)
S_BINARY_BUILDER(tp_minimum, TP_OP_MINIMUM)
#undef S_BINARY_BUILDER

tp_node_t *tp_pow(tp_tower_t *t, const char *name, tp_node_t *x,
                  float exponent) {
    tp_node_t *n = s_unary(t, name, TP_OP_POW, x, exponent);
    if (n && !isfinite(exponent))
        FAIL(t, n, "exponent %g is not finite", (double)exponent);
    return n;
}
tp_node_t *tp_clip(tp_tower_t *t, const char *name, tp_node_t *x, float lo,
                   float hi) {
    tp_node_t *n = s_unary(t, name, TP_OP_CLIP, x, lo);
    if (n && !(lo <= hi))
        FAIL(t, n, "clip bounds [%g, %g]: need lo <= hi", (double)lo, (double)hi);
    if (n)
        n->attr.beta = hi;
    return n;
}
tp_node_t *tp_gelu(tp_tower_t *t, const char *name, tp_node_t *x,
                   int approximate) {
    return s_unary(t, name, approximate ? TP_OP_GELU_TANH : TP_OP_GELU, x, 0);
}

tp_node_t *tp_constant(tp_tower_t *t, const char *name, int ndim,
                       const int64_t *shape, const float *values) {
    if (t->status < 0)
        return NULL;
    tp_node_t *n = s_node(t, name, TP_OP_CONSTANT, 0, NULL);
    if (!n)
        return NULL;
    if (ndim < 0 || ndim > TP_MAX_DIMS || (ndim > 0 && !shape) || !values)
        FAIL(t, n, "constant of %d dims (0..%d) needs a shape and values", ndim,
             TP_MAX_DIMS);
    n->shape.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            FAIL(t, n, "constant dim %d is %lld", i, (long long)shape[i]);
        n->shape.d[i] = shape[i];
    }
    n->batched = 0;
    size_t count = tp_shape_count(&n->shape);
    float *v = malloc(count * sizeof *v);
    if (!v) {
        s_fail(t, TP_ERR_NOMEM, n->name, "out of memory");
        return s_drop_last(t);
    }
    memcpy(v, values, count * sizeof *v);
    n->attr.data = v;
    return n;
}

tp_status_t tp_tower_input_gradient(tp_tower_t *t, tp_node_t *input) {
    if (t->status < 0)
        return t->status;
    if (!input || input->kind != TP_OP_INPUT || input->dtype != TP_FLOAT32 ||
        input->id >= t->nnodes || t->nodes[input->id] != input) {
        s_fail(t, TP_ERR_INVALID, input ? input->name : "?",
               "a gradient can be asked for a float32 data input of this tower only");
        return t->status;
    }
    input->want_grad = 1;
    return TP_OK;
}

tp_node_t *tp_scalar(tp_tower_t *t, const char *name, float value) {
    return tp_constant(t, name, 0, NULL, &value);
}

tp_node_t *tp_concat(tp_tower_t *t, const char *name, int count,
                     tp_node_t *const *xs) {
    /* dim 1, as it always was: the concat of the shape family at axis 1 */
    return tp_concat_axis(t, name, 1, count, xs);
}

static tp_node_t *s_labels_op(tp_tower_t *t, const char *name,
                              tp_op_kind_t kind, tp_node_t *logits,
                              tp_node_t *labels) {
    tp_node_t *in[2] = {logits, labels};
    tp_node_t *n = s_node_float(t, name, kind, 2, in, 1);
    if (!n)
        return NULL;
    char a[96], b[96];
    if (logits->shape.ndim != 2 || labels->shape.ndim != 1 ||
        labels->dtype != TP_INT32 || labels->shape.d[0] != logits->shape.d[0] ||
        logits->shape.d[1] < 1)
        FAIL(t, n, "logits %s and labels %s %s: need float32 [N,K] and int32 [N]",
             s_shape_str(&logits->shape, a, 96), tp_dtype_name(labels->dtype),
             s_shape_str(&labels->shape, b, 96));
    n->shape.ndim = 0;
    n->batched = 0;
    return n;
}

/* The loss family's shape rule: two float inputs of one shape (batched
 * alike, no broadcasting, as the losses are meant on matching tensors) ->
 * a scalar, the mean over every element. */
static tp_node_t *s_loss(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                         tp_node_t *a, tp_node_t *b, const char *what) {
    tp_node_t *in[2] = {a, b};
    tp_node_t *n = s_node_float(t, name, kind, 2, in, 2);
    if (!n)
        return NULL;
    char x[96], y[96];
    if (a->shape.ndim != b->shape.ndim || a->batched != b->batched ||
        memcmp(a->shape.d, b->shape.d, sizeof(int64_t) * (size_t)a->shape.ndim))
        FAIL(t, n, "%s %s ('%s'%s) and %s ('%s'%s): need the same shape, batched alike", what,
             s_shape_str(&a->shape, x, 96), a->name, a->batched ? ", batched" : "",
             s_shape_str(&b->shape, y, 96), b->name, b->batched ? ", batched" : "");
    n->shape.ndim = 0;
    n->batched = 0;
    return n;
}

tp_node_t *tp_mse(tp_tower_t *t, const char *name, tp_node_t *pred,
                  tp_node_t *target) {
    return s_loss(t, name, TP_OP_MSE, pred, target, "pred and target:");
}
tp_node_t *tp_l1_loss(tp_tower_t *t, const char *name, tp_node_t *pred,
                      tp_node_t *target) {
    return s_loss(t, name, TP_OP_L1_LOSS, pred, target, "pred and target:");
}
tp_node_t *tp_huber_loss(tp_tower_t *t, const char *name, tp_node_t *pred,
                         tp_node_t *target, float delta) {
    tp_node_t *n = s_loss(t, name, TP_OP_HUBER_LOSS, pred, target,
                          "pred and target:");
    if (n && !(delta > 0.0f && isfinite(delta)))
        FAIL(t, n, "huber delta %g: must be finite and > 0", (double)delta);
    if (n)
        n->attr.alpha = delta;
    return n;
}
tp_node_t *tp_sigmoid_xent(tp_tower_t *t, const char *name, tp_node_t *logits,
                           tp_node_t *labels) {
    return s_loss(t, name, TP_OP_SIGMOID_XENT, logits, labels,
                  "logits and float labels:");
}

/* ---- the shape family (docs/ops.md) --------------------------------------
 * Shape rules checked here, naming the node and the shapes; the kernels
 * (gpu/cpu/ops_shape.c, gpu/cuda/ops_shape.cu) read attr.dims_a/dims_b/axis
 * and the run shapes. A batched input's dim 0 is the step's batch, which
 * may be smaller than planned, so these ops leave dim 0 whole and in place. */

/* Values these ops move: float32, or int32 (token ids, labels). */
static int s_check_movable(tp_tower_t *t, tp_node_t *n, int i) {
    const tp_dtype_t d = n->inputs[i]->dtype;
    if (d != TP_FLOAT32 && d != TP_INT32) {
        s_fail(t, TP_ERR_SHAPE, n->name, "input %d ('%s') is %s: %s moves float32 "
               "or int32", i, n->inputs[i]->name, tp_dtype_name(d), tp_op_name(n->kind));
        return 0;
    }
    n->dtype = d;
    n->attr.in_dtype = d;
    return 1;
}

/* The movers' first step (one input x): s_node, then x checked to be a
 * dtype they move, which the node takes. */
static tp_node_t *s_node_movable(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                                 tp_node_t *x) {
    tp_node_t *n = s_node(t, name, kind, 1, &x);
    if (!n)
        return NULL;
    if (!s_check_movable(t, n, 0))
        return s_drop_last(t);
    return n;
}

/* axis in [-ndim, ndim) -> [0, ndim); -1 when out of range. */
static int s_axis(int axis, int ndim) {
    if (axis < -ndim || axis >= ndim)
        return -1;
    return axis < 0 ? axis + ndim : axis;
}

tp_node_t *tp_transpose(tp_tower_t *t, const char *name, tp_node_t *x,
                        const int *perm) {
    tp_node_t *n = s_node_movable(t, name, TP_OP_TRANSPOSE, x);
    if (!n)
        return NULL;
    char a[96];
    const int r = x->shape.ndim;
    if (!perm && r > 0)
        FAIL(t, n, "no permutation for x %s", s_shape_str(&x->shape, a, 96));
    int seen[TP_MAX_DIMS] = {0};
    for (int i = 0; i < r; i++) {
        const int p = s_axis(perm[i], r);
        if (p < 0 || seen[p]++)
            FAIL(t, n, "perm[%d] = %d: x %s needs each axis of 0..%d once", i, perm[i],
                 s_shape_str(&x->shape, a, 96), r - 1);
        n->attr.dims_a[i] = p;
        n->shape.d[i] = x->shape.d[p];
    }
    if (x->batched && r > 0 && n->attr.dims_a[0] != 0)
        FAIL(t, n, "x %s is batched: perm[0] must be 0 (the batch stays dim 0), "
             "not %d", s_shape_str(&x->shape, a, 96), perm[0]);
    return n;
}

tp_node_t *tp_slice(tp_tower_t *t, const char *name, tp_node_t *x,
                    const int64_t *start, const int64_t *stop,
                    const int64_t *step) {
    tp_node_t *n = s_node_movable(t, name, TP_OP_SLICE, x);
    if (!n)
        return NULL;
    char a[96];
    const int r = x->shape.ndim;
    if (r > 0 && (!start || !stop))
        FAIL(t, n, "x %s: start and stop need %d entries", s_shape_str(&x->shape, a, 96), r);
    for (int i = 0; i < r; i++) {
        const int64_t len = x->shape.d[i], st = step ? step[i] : 1;
        if (st == 0)
            FAIL(t, n, "step of axis %d is 0 (x %s)", i, s_shape_str(&x->shape, a, 96));
        /* Python's slice.indices(len) */
        int64_t b = start[i], e = stop[i], cnt;
        const int64_t lo = st > 0 ? 0 : -1, hi = st > 0 ? len : len - 1;
        if (b < 0)
            b = b < -len ? lo : b + len;
        else if (b > hi)
            b = hi;
        if (e < 0)
            e = e < -len ? lo : e + len;
        else if (e > hi)
            e = hi;
        if (st > 0)
            cnt = e > b ? (e - b + st - 1) / st : 0;
        else
            cnt = b > e ? (b - e - st - 1) / -st : 0;
        if (x->batched && i == 0 && !(b == 0 && st == 1 && cnt == len))
            FAIL(t, n, "x %s is batched: axis 0 (the batch) must be taken whole "
                 "(start 0, stop TP_SLICE_END, step 1), not %lld:%lld:%lld",
                 s_shape_str(&x->shape, a, 96), (long long)start[0],
                 (long long)stop[0], (long long)st);
        /* an empty slice reads nothing: its start is never used */
        n->attr.dims_a[i] = cnt ? b : 0;
        n->attr.dims_b[i] = st;
        n->shape.d[i] = cnt;
    }
    return n;
}

tp_node_t *tp_concat_axis(tp_tower_t *t, const char *name, int axis, int count,
                          tp_node_t *const *xs) {
    if (t->status < 0)
        return NULL;
    if (count < 1 || count > TP_OP_MAX_INPUTS) {
        s_fail(t, TP_ERR_INVALID, name, "concat of %d inputs (1..%d)", count,
               TP_OP_MAX_INPUTS);
        return NULL;
    }
    tp_node_t *n = s_node(t, name, TP_OP_CONCAT, count, xs);
    if (!n)
        return NULL;
    char a[96], b[96];
    const int r = xs[0]->shape.ndim, ax = s_axis(axis, r);
    if (ax < 0)
        FAIL(t, n, "axis %d outside input 0's %d dims (%s)", axis, r,
             s_shape_str(&xs[0]->shape, a, 96));
    if (xs[0]->batched && ax == 0)
        FAIL(t, n, "input 0 %s is batched: a concat along axis 0 (the batch) would "
             "change the batch", s_shape_str(&xs[0]->shape, a, 96));
    int64_t c = 0;
    for (int i = 0; i < count; i++) {
        if (!s_check_movable(t, n, i))
            return s_drop_last(t);
        if (xs[i]->dtype != xs[0]->dtype)
            FAIL(t, n, "input %d ('%s') is %s, input 0 is %s: one dtype", i,
                 xs[i]->name, tp_dtype_name(xs[i]->dtype), tp_dtype_name(xs[0]->dtype));
        const tp_shape_t *s = &xs[i]->shape;
        int ok = s->ndim == r && xs[i]->batched == xs[0]->batched;
        for (int d = 0; ok && d < s->ndim; d++)
            if (d != ax && s->d[d] != xs[0]->shape.d[d])
                ok = 0;
        if (!ok)
            FAIL(t, n, "input %d is %s%s, input 0 is %s%s: only dim %d may differ", i,
                 s_shape_str(s, a, 96), xs[i]->batched ? " (batched)" : "",
                 s_shape_str(&xs[0]->shape, b, 96), xs[0]->batched ? " (batched)" : "",
                 ax);
        c += s->d[ax];
    }
    n->attr.axis = ax;
    n->shape.d[ax] = c;
    return n;
}

tp_status_t tp_split(tp_tower_t *t, const char *name, tp_node_t *x, int axis,
                     int count, const int64_t *sizes, tp_node_t **out) {
    if (t->status < 0)
        return t->status;
    char base[TP_NAME_MAX], a[96];
    snprintf(base, sizeof base, "%s", name ? name : "split");
    if (!x || !out || !sizes || count < 1) {
        s_fail(t, TP_ERR_INVALID, base, "split needs x, %d > 0 sizes and room for "
               "the pieces", count);
        return t->status;
    }
    const int r = x->shape.ndim, ax = s_axis(axis, r);
    int64_t sum = 0;
    for (int i = 0; i < count; i++)
        sum += sizes[i] < 0 ? -1 : sizes[i];
    if (ax < 0 || (x->batched && ax == 0) || sum != x->shape.d[ax]) {
        s_fail(t, TP_ERR_SHAPE, base, "cannot split x %s%s along axis %d into %d "
               "pieces summing to %lld (each >= 0, summing to the dim; not the batch)",
               s_shape_str(&x->shape, a, 96), x->batched ? " (batched)" : "", axis,
               count, (long long)sum);
        return t->status;
    }
    int64_t start[TP_MAX_DIMS] = {0}, stop[TP_MAX_DIMS];
    for (int i = 0; i < r; i++)
        stop[i] = TP_SLICE_END;
    for (int i = 0; i < count; i++) {
        char piece[TP_NAME_MAX + 16];
        snprintf(piece, sizeof piece, "%s_%d", base, i);
        stop[ax] = start[ax] + sizes[i];
        out[i] = tp_slice(t, piece, x, start, stop, NULL);
        if (!out[i])
            return t->status;
        start[ax] = stop[ax];
    }
    return TP_OK;
}

tp_node_t *tp_pad(tp_tower_t *t, const char *name, tp_node_t *x,
                  const int64_t *before, const int64_t *after, float value) {
    tp_node_t *n = s_node_movable(t, name, TP_OP_PAD, x);
    if (!n)
        return NULL;
    char a[96];
    const int r = x->shape.ndim;
    if (r > 0 && (!before || !after))
        FAIL(t, n, "x %s: before and after need %d entries", s_shape_str(&x->shape, a, 96), r);
    if (!isfinite(value))
        FAIL(t, n, "pad value %g is not finite", (double)value);
    for (int i = 0; i < r; i++) {
        if (before[i] < 0 || after[i] < 0)
            FAIL(t, n, "axis %d: pads %lld before, %lld after (need >= 0)", i,
                 (long long)before[i], (long long)after[i]);
        if (x->batched && i == 0 && (before[0] || after[0]))
            FAIL(t, n, "x %s is batched: axis 0 (the batch) cannot be padded",
                 s_shape_str(&x->shape, a, 96));
        n->attr.dims_a[i] = before[i];
        n->attr.dims_b[i] = after[i];
        n->shape.d[i] = x->shape.d[i] + before[i] + after[i];
    }
    n->attr.alpha = value;
    return n;
}

tp_node_t *tp_broadcast_to(tp_tower_t *t, const char *name, tp_node_t *x,
                           int ndim, const int64_t *shape) {
    tp_node_t *n = s_node_movable(t, name, TP_OP_BROADCAST_TO, x);
    if (!n)
        return NULL;
    char a[96], b[96];
    const int r = x->shape.ndim;
    if (ndim < r || ndim > TP_MAX_DIMS || (ndim > 0 && !shape))
        FAIL(t, n, "x %s has %d dims: the target needs %d..%d", s_shape_str(&x->shape, a, 96),
             r, r, TP_MAX_DIMS);
    tp_shape_t o = {.ndim = ndim};
    for (int i = 0; i < ndim; i++)
        o.d[i] = shape[i];
    if (x->batched) {
        if (ndim != r || shape[0] != -1)
            FAIL(t, n, "x %s is batched: the target keeps its %d dims and its dim 0 "
                 "is -1 (the batch)", s_shape_str(&x->shape, a, 96), r);
        o.d[0] = x->shape.d[0];
    }
    for (int i = 0; i < ndim; i++) {
        const int ix = i - (ndim - r);
        const int64_t dx = ix >= 0 ? x->shape.d[ix] : 1;
        if (o.d[i] < 0 || (dx != 1 && dx != o.d[i]))
            FAIL(t, n, "cannot broadcast %s to %s: dim %d is %lld in x (need equal, or 1)",
                 s_shape_str(&x->shape, a, 96), s_shape_str(&o, b, 96), i, (long long)dx);
    }
    n->shape = o;
    return n;
}

tp_node_t *tp_gather_rows(tp_tower_t *t, const char *name, tp_node_t *table,
                          tp_node_t *indices) {
    tp_node_t *in[2] = {table, indices};
    tp_node_t *n = s_node_float(t, name, TP_OP_GATHER, 2, in, 1);
    if (!n)
        return NULL;
    char a[96], b[96];
    const tp_shape_t *ts = &table->shape, *is = &indices->shape;
    if (indices->dtype != TP_INT32)
        FAIL(t, n, "indices '%s' are %s: need int32", indices->name,
             tp_dtype_name(indices->dtype));
    if (ts->ndim < 1 || table->batched || ts->d[0] < 1 || is->ndim + ts->ndim - 1 > TP_MAX_DIMS)
        FAIL(t, n, "table %s%s, indices %s: need an unbatched table [V>=1, ...] and at "
             "most %d dims out", s_shape_str(ts, a, 96), table->batched ? " (batched)" : "",
             s_shape_str(is, b, 96), TP_MAX_DIMS);
    n->shape.ndim = is->ndim + ts->ndim - 1;
    for (int i = 0; i < is->ndim; i++)
        n->shape.d[i] = is->d[i];
    for (int i = 1; i < ts->ndim; i++)
        n->shape.d[is->ndim + i - 1] = ts->d[i];
    n->batched = indices->batched;
    return n;
}

tp_node_t *tp_one_hot(tp_tower_t *t, const char *name, tp_node_t *indices,
                      int depth) {
    tp_node_t *n = s_node(t, name, TP_OP_ONE_HOT, 1, &indices);
    if (!n)
        return NULL;
    char a[96];
    if (indices->dtype != TP_INT32)
        FAIL(t, n, "indices '%s' are %s: need int32", indices->name,
             tp_dtype_name(indices->dtype));
    if (depth < 1 || indices->shape.ndim >= TP_MAX_DIMS)
        FAIL(t, n, "depth %d on indices %s: need depth >= 1 and fewer than %d dims",
             depth, s_shape_str(&indices->shape, a, 96), TP_MAX_DIMS);
    n->dtype = TP_FLOAT32;
    n->shape.d[n->shape.ndim++] = depth;
    return n;
}

/* ---- the reduce family (docs/ops.md) ------------------------------------ */

/* Axes as the user wrote them (negative from the end; none: every axis)
 * -> a bit set of x's axes, or -1 after recording the error on n. */
static int s_axes(tp_tower_t *t, tp_node_t *n, const tp_node_t *x, int naxes,
                  const int *axes) {
    char a[96];
    const int nd = x->shape.ndim;
    if (naxes < 0 || (naxes > 0 && !axes)) {
        s_fail(t, TP_ERR_INVALID, n->name, "%d axes%s", naxes,
               axes ? "" : " and no axis array");
        return -1;
    }
    if (naxes == 0)
        return nd ? (1 << nd) - 1 : 0;
    int mask = 0;
    for (int i = 0; i < naxes; i++) {
        const int ax = axes[i] < 0 ? axes[i] + nd : axes[i];
        if (ax < 0 || ax >= nd) {
            s_fail(t, TP_ERR_SHAPE, n->name, "axis %d out of range for x %s ('%s', %d dims)",
                   axes[i], s_shape_str(&x->shape, a, 96), x->name, nd);
            return -1;
        }
        if (mask & (1 << ax)) {
            s_fail(t, TP_ERR_SHAPE, n->name, "axis %d named twice for x %s ('%s')",
                   axes[i], s_shape_str(&x->shape, a, 96), x->name);
            return -1;
        }
        mask |= 1 << ax;
    }
    return mask;
}

/* The output shape of reducing x over `mask`: those dims become 1 or go.
 * Batched when x is and its batch axis stays. */
static void s_reduced_shape(tp_node_t *n, const tp_node_t *x, int mask,
                            int keepdims) {
    int o = 0;
    for (int d = 0; d < x->shape.ndim; d++) {
        if (!(mask & (1 << d)))
            n->shape.d[o++] = x->shape.d[d];
        else if (keepdims)
            n->shape.d[o++] = 1;
    }
    n->shape.ndim = o;
    n->batched = x->batched && !(mask & 1);
}

static tp_node_t *s_reduce(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                           tp_node_t *x, int naxes, const int *axes,
                           int keepdims) {
    tp_node_t *n = s_node_float(t, name, kind, 1, &x, 1);
    if (!n)
        return NULL;
    const int mask = s_axes(t, n, x, naxes, axes);
    if (mask < 0)
        return s_drop_last(t);
    char a[96];
    for (int d = 0; d < x->shape.ndim; d++)
        if ((mask & (1 << d)) && x->shape.d[d] == 0 && kind == TP_OP_REDUCE_MAX)
            FAIL(t, n, "max over axis %d of x %s ('%s'): the axis is empty", d,
                 s_shape_str(&x->shape, a, 96), x->name);
    n->attr.axes = mask;
    s_reduced_shape(n, x, mask, keepdims);
    return n;
}

tp_node_t *tp_reduce_sum(tp_tower_t *t, const char *name, tp_node_t *x,
                         int naxes, const int *axes, int keepdims) {
    return s_reduce(t, name, TP_OP_REDUCE_SUM, x, naxes, axes, keepdims);
}
tp_node_t *tp_reduce_mean(tp_tower_t *t, const char *name, tp_node_t *x,
                          int naxes, const int *axes, int keepdims) {
    return s_reduce(t, name, TP_OP_REDUCE_MEAN, x, naxes, axes, keepdims);
}
tp_node_t *tp_reduce_max(tp_tower_t *t, const char *name, tp_node_t *x,
                         int naxes, const int *axes, int keepdims) {
    return s_reduce(t, name, TP_OP_REDUCE_MAX, x, naxes, axes, keepdims);
}

/* One axis of x, not empty, for argmax and the softmaxes. */
static int s_one_axis(tp_tower_t *t, tp_node_t *n, tp_node_t *x, int axis) {
    const int mask = s_axes(t, n, x, 1, &axis);
    if (mask < 0)
        return -1;
    const int ax = axis < 0 ? axis + x->shape.ndim : axis;
    if (x->shape.d[ax] < 1) {
        char a[96];
        s_fail(t, TP_ERR_SHAPE, n->name, "axis %d of x %s ('%s') is empty", axis,
               s_shape_str(&x->shape, a, 96), x->name);
        return -1;
    }
    return mask;
}

/* argmax and the softmaxes: a node over one axis of float x (attr.axes). */
static tp_node_t *s_along_axis(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                               tp_node_t *x, int axis) {
    tp_node_t *n = s_node_float(t, name, kind, 1, &x, 1);
    if (!n)
        return NULL;
    const int mask = s_one_axis(t, n, x, axis);
    if (mask < 0)
        return s_drop_last(t);
    n->attr.axes = mask;
    return n;
}

tp_node_t *tp_argmax(tp_tower_t *t, const char *name, tp_node_t *x, int axis,
                     int keepdims) {
    tp_node_t *n = s_along_axis(t, name, TP_OP_ARGMAX, x, axis);
    if (!n)
        return NULL;
    n->dtype = TP_INT32;
    s_reduced_shape(n, x, n->attr.axes, keepdims);
    return n;
}

tp_node_t *tp_softmax(tp_tower_t *t, const char *name, tp_node_t *x, int axis) {
    return s_along_axis(t, name, TP_OP_SOFTMAX, x, axis);
}
tp_node_t *tp_log_softmax(tp_tower_t *t, const char *name, tp_node_t *x,
                          int axis) {
    return s_along_axis(t, name, TP_OP_LOG_SOFTMAX, x, axis);
}

tp_node_t *tp_softmax_xent_seq(tp_tower_t *t, const char *name,
                               tp_node_t *logits, tp_node_t *labels,
                               int ignore_label) {
    tp_node_t *in[2] = {logits, labels};
    tp_node_t *n = s_node_float(t, name, TP_OP_SOFTMAX_XENT_SEQ, 2, in, 1);
    if (!n)
        return NULL;
    char a[96], b[96];
    const tp_shape_t *ls = &logits->shape, *ys = &labels->shape;
    int ok = ls->ndim >= 2 && ys->ndim == ls->ndim - 1 && labels->dtype == TP_INT32 &&
             ls->d[ls->ndim - 1] >= 1;
    for (int d = 0; ok && d < ys->ndim; d++)
        ok = ys->d[d] == ls->d[d];
    if (!ok)
        FAIL(t, n, "logits %s ('%s'%s) and labels %s %s ('%s'%s): need float32 "
             "[...,V] and int32 [...] of the same leading dims",
             s_shape_str(ls, a, 96), logits->name, logits->batched ? ", batched" : "",
             tp_dtype_name(labels->dtype), s_shape_str(ys, b, 96), labels->name,
             labels->batched ? ", batched" : "");
    /* any value, a class too (a padding token, as ignore_index allows);
     * held in a float, exact within 2^24 */
    if (ignore_label < -(1 << 24) || ignore_label > (1 << 24))
        FAIL(t, n, "ignore label %d: outside [-2^24, 2^24]", ignore_label);
    n->attr.alpha = (float)ignore_label;
    n->shape.ndim = 0;
    n->batched = 0;
    return n;
}

tp_node_t *tp_top_k_accuracy(tp_tower_t *t, const char *name, tp_node_t *logits,
                             tp_node_t *labels, int k) {
    tp_node_t *n = s_labels_op(t, name, TP_OP_TOP_K_ACCURACY, logits, labels);
    if (!n)
        return NULL;
    char a[96];
    if (k < 1 || k > logits->shape.d[1])
        FAIL(t, n, "k %d for logits %s ('%s'): need 1 <= k <= %lld classes", k,
             s_shape_str(&logits->shape, a, 96), logits->name,
             (long long)logits->shape.d[1]);
    n->attr.alpha = (float)k;
    return n;
}

tp_node_t *tp_softmax_xent(tp_tower_t *t, const char *name, tp_node_t *logits,
                           tp_node_t *labels) {
    return s_labels_op(t, name, TP_OP_SOFTMAX_XENT, logits, labels);
}
tp_node_t *tp_softmax_xent_smoothed(tp_tower_t *t, const char *name,
                                    tp_node_t *logits, tp_node_t *labels,
                                    float smoothing) {
    tp_node_t *n = s_labels_op(t, name, TP_OP_SOFTMAX_XENT, logits, labels);
    if (!n)
        return NULL;
    if (!(smoothing >= 0.0f && smoothing < 1.0f)) {
        s_fail(t, TP_ERR_INVALID, n->name, "label smoothing %g: must be in [0, 1)",
               (double)smoothing);
        return s_drop_last(t);
    }
    n->attr.alpha = smoothing;
    return n;
}
tp_node_t *tp_accuracy(tp_tower_t *t, const char *name, tp_node_t *logits,
                       tp_node_t *labels) {
    return s_labels_op(t, name, TP_OP_ACCURACY, logits, labels);
}
tp_node_t *tp_error_count(tp_tower_t *t, const char *name, tp_node_t *logits,
                          tp_node_t *labels) {
    return s_labels_op(t, name, TP_OP_ERROR_COUNT, logits, labels);
}

tp_node_t *tp_l2_decay(tp_tower_t *t, const char *name, const char *pattern,
                       float coeff) {
    if (t->status < 0)
        return NULL;
    tp_node_t *in[TP_OP_MAX_INPUTS];
    int count = 0;
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *v = t->nodes[i];
        if (v->kind != TP_OP_VARIABLE || !t->model->vars[v->var].trainable ||
            fnmatch(pattern, v->name, 0) != 0)
            continue;
        if (count == TP_OP_MAX_INPUTS) {
            s_fail(t, TP_ERR_INVALID, name ? name : "l2_decay",
                   "pattern '%s' matches more than %d variables", pattern,
                   TP_OP_MAX_INPUTS);
            return NULL;
        }
        in[count++] = v;
    }
    if (count == 0) {
        s_fail(t, TP_ERR_NOT_FOUND, name ? name : "l2_decay",
               "pattern '%s' matches no trainable variable", pattern);
        return NULL;
    }
    tp_node_t *n = s_node(t, name, TP_OP_L2_DECAY, count, in);
    if (!n)
        return NULL;
    n->shape.ndim = 0;
    n->batched = 0;
    n->attr.alpha = coeff;
    return n;
}

tp_node_t *tp_cast(tp_tower_t *t, const char *name, tp_node_t *x,
                   float scale) {
    tp_node_t *n = s_node(t, name, TP_OP_CAST, 1, &x);
    if (!n)
        return NULL;
    if (x->dtype != TP_UINT8 && x->dtype != TP_FLOAT32)
        FAIL(t, n, "input '%s' is %s: cast takes uint8 or float32", x->name,
             tp_dtype_name(x->dtype));
    n->attr.alpha = scale;
    n->attr.in_dtype = x->dtype;
    return n;
}

/* ---- outputs ------------------------------------------------------------ */

tp_status_t tp_tower_set_cost(tp_tower_t *t, tp_node_t *cost) {
    if (t->status < 0)
        return t->status;
    if (!cost) {
        s_fail(t, TP_ERR_INVALID, "cost", "cost is NULL");
        return t->status;
    }
    if (cost->shape.ndim != 0 || cost->dtype != TP_FLOAT32) {
        s_fail(t, TP_ERR_SHAPE, cost->name, "the cost must be a float32 scalar");
        return t->status;
    }
    t->cost = cost;
    return TP_OK;
}

tp_status_t tp_tower_add_cost(tp_tower_t *t, const char *name,
                              tp_node_t *cost, const char *var_pattern) {
    if (t->status < 0)
        return t->status;
    if (!name || !*name || !cost) {
        s_fail(t, TP_ERR_INVALID, name ? name : "cost",
               "a named cost needs a name and a node");
        return t->status;
    }
    if (cost->shape.ndim != 0 || cost->dtype != TP_FLOAT32) {
        s_fail(t, TP_ERR_SHAPE, cost->name, "the cost '%s' must be a float32 "
               "scalar", name);
        return t->status;
    }
    for (int i = 0; i < t->ncosts; i++)
        if (strcmp(t->cost_names[i], name) == 0) {
            s_fail(t, TP_ERR_INVALID, name, "cost name used twice (\"cost\" is "
                   "the main cost's)");
            return t->status;
        }
    if (t->ncosts >= TP_COSTS_MAX) {
        s_fail(t, TP_ERR_INVALID, name, "more than %d costs in one tower",
               TP_COSTS_MAX - 1);
        return t->status;
    }
    char *nm = strdup(name);
    char *pat = var_pattern ? strdup(var_pattern) : NULL;
    if (!nm || (var_pattern && !pat)) {
        free(nm);
        free(pat);
        s_fail(t, TP_ERR_NOMEM, name, "out of memory");
        return t->status;
    }
    /* A pattern that selects no trainable variable is a typo worth naming
     * now, not a cost that silently trains nothing. */
    int any = !pat;
    for (int i = 0; pat && i < t->model->nvars; i++)
        any |= t->model->vars[i].trainable &&
               fnmatch(pat, t->model->vars[i].name, 0) == 0;
    if (!any) {
        s_fail(t, TP_ERR_INVALID, name, "the variable pattern '%s' matches no "
               "trainable variable created so far", pat);
        free(nm);
        free(pat);
        return t->status;
    }
    int k = t->ncosts++;
    t->costs[k] = cost;
    t->cost_names[k] = nm;
    t->cost_vars[k] = pat;
    return TP_OK;
}

static tp_status_t s_add_output(tp_tower_t *t, const char *name, tp_node_t *n,
                                int metric) {
    if (t->status < 0)
        return t->status;
    if (!n || !name || !*name) {
        s_fail(t, TP_ERR_INVALID, name, "output node or name is NULL");
        return t->status;
    }
    for (int i = 0; i < t->noutputs; i++)
        if (strcmp(t->outputs[i].name, name) == 0) {
            s_fail(t, TP_ERR_INVALID, name, "output name used twice");
            return t->status;
        }
    if (metric && (n->shape.ndim != 0 || n->dtype != TP_FLOAT32)) {
        s_fail(t, TP_ERR_SHAPE, n->name, "metric '%s' must be a float scalar",
               name);
        return t->status;
    }
    if (t->noutputs == t->cap_outputs) {
        int cap = t->cap_outputs ? 2 * t->cap_outputs : 8;
        tp_output_t *no = realloc(t->outputs, (size_t)cap * sizeof *no);
        if (!no) {
            s_fail(t, TP_ERR_NOMEM, name, "out of memory");
            return t->status;
        }
        t->outputs = no;
        t->cap_outputs = cap;
    }
    char *dup = strdup(name);
    if (!dup) {
        s_fail(t, TP_ERR_NOMEM, name, "out of memory");
        return t->status;
    }
    t->outputs[t->noutputs++] = (tp_output_t){dup, n, metric};
    return TP_OK;
}

tp_status_t tp_tower_add_output(tp_tower_t *t, const char *name, tp_node_t *n) {
    return s_add_output(t, name, n, 0);
}
tp_status_t tp_tower_add_metric(tp_tower_t *t, const char *name, tp_node_t *n) {
    return s_add_output(t, name, n, 1);
}

/* ---- layers ------------------------------------------------------------- */

/* A layer's opening: its scope pushed and its input x there. 0 when the
 * tower has failed already or after recording why, the scope then not
 * left pushed; on 1 the layer pops it when done. */
static int s_layer_scope(tp_tower_t *t, const char *scope, const tp_node_t *x) {
    if (t->status < 0)
        return 0;
    tp_status_t rc = tp_tower_push_scope(t, scope);
    if (rc < 0) {
        t->status = rc;
        return 0;
    }
    if (!x) {
        s_fail(t, TP_ERR_INVALID, scope, "input is NULL");
        tp_tower_pop_scope(t);
        return 0;
    }
    return 1;
}

tp_node_t *tp_fc(tp_tower_t *t, const char *scope, tp_node_t *x, int units,
                 int bias) {
    if (!s_layer_scope(t, scope, x))
        return NULL;
    tp_node_t *y = NULL;
    if (units < 1) {
        s_fail(t, TP_ERR_SHAPE, scope, "%d units", units);
    } else {
        int64_t k = 1;
        for (int i = 1; i < x->shape.ndim; i++)
            k *= x->shape.d[i];
        int64_t ws[2] = {k, units}, bs[1] = {units};
        tp_node_t *w = tp_variable(t, "W", 2, ws,
                                   (tp_init_t){TP_INIT_GLOROT_UNIFORM, 0},
                                   TP_VAR_TRAINABLE);
        y = tp_matmul(t, bias ? "matmul" : "output", x, w);
        if (bias) {
            tp_node_t *b = tp_variable(t, "b", 1, bs,
                                       (tp_init_t){TP_INIT_ZEROS, 0},
                                       TP_VAR_TRAINABLE);
            y = tp_bias_add(t, "output", y, b);
        }
    }
    tp_tower_pop_scope(t);
    return y;
}

/* The conv layers' variables in their scope, for x [N,C,H,W]: W (He
 * normal) of [filters, C, kernel, kernel], or [C, filters, ...] when
 * `transposed`, and, with `bias`, b [filters] (zeros, else NULL). 0 after
 * recording the error (x not of rank 4, filters or kernel below 1, or a
 * variable not made). */
static int s_conv_vars(tp_tower_t *t, const char *scope, const tp_node_t *x, int filters,
                       int kernel, int transposed, int bias, tp_node_t **w, tp_node_t **b) {
    if (x->shape.ndim != 4) {
        /* the common mistake: images fed as [N,H,W] or flat [N,H*W] */
        char a[96];
        s_fail(t, TP_ERR_SHAPE, scope, "a %s needs a [N,C,H,W] input (rank 4), got %s "
               "(rank %d)%s", transposed ? "transposed conv" : "conv",
               s_shape_str(&x->shape, a, 96), x->shape.ndim,
               transposed ? "" : ": reshape it first (e.g. tp_reshape to [N,1,H,W])");
        return 0;
    }
    if (filters < 1 || kernel < 1) {
        char a[96];
        s_fail(t, TP_ERR_SHAPE, scope, "%d filters of %dx%d on %s", filters,
               kernel, kernel, s_shape_str(&x->shape, a, 96));
        return 0;
    }
    const int64_t c = x->shape.d[1], bs[1] = {filters};
    const int64_t ws[4] = {transposed ? c : filters, transposed ? filters : c, kernel, kernel};
    *w = tp_variable(t, "W", 4, ws, (tp_init_t){TP_INIT_HE_NORMAL, 0}, TP_VAR_TRAINABLE);
    *b = bias ? tp_variable(t, "b", 1, bs, (tp_init_t){TP_INIT_ZEROS, 0}, TP_VAR_TRAINABLE)
              : NULL;
    return *w && (!bias || *b);
}

tp_node_t *tp_conv2d(tp_tower_t *t, const char *scope, tp_node_t *x,
                     int filters, int kernel, int stride, int pad, int bias) {
    if (!s_layer_scope(t, scope, x))
        return NULL;
    tp_node_t *w, *b, *y = NULL; /* b fused into the convolution: no pass of its own */
    if (s_conv_vars(t, scope, x, filters, kernel, 0, bias, &w, &b))
        y = s_conv(t, "output", x, w, b, stride, pad < 0 ? kernel / 2 : pad, 1, 1);
    tp_tower_pop_scope(t);
    return y;
}

tp_node_t *tp_conv2d_transpose(tp_tower_t *t, const char *scope, tp_node_t *x,
                               int filters, int kernel, int stride, int pad,
                               int output_pad, int bias) {
    if (!s_layer_scope(t, scope, x))
        return NULL;
    tp_node_t *w, *b, *y = NULL; /* b added inside the op: no pass of its own */
    if (s_conv_vars(t, scope, x, filters, kernel, 1, bias, &w, &b))
        y = tp_conv2d_transpose_op(t, "output", x, w, b, stride, pad, output_pad, 1, 1);
    tp_tower_pop_scope(t);
    return y;
}

tp_node_t *tp_batch_norm(tp_tower_t *t, const char *scope, tp_node_t *x) {
    if (!s_layer_scope(t, scope, x))
        return NULL;
    tp_node_t *y = NULL;
    if (x->shape.ndim < 2) {
        s_fail(t, TP_ERR_SHAPE, scope, "input has %d dims", x->shape.ndim);
    } else {
        int64_t cs[1] = {x->shape.d[1]};
        tp_node_t *g = tp_variable(t, "gamma", 1, cs,
                                   (tp_init_t){TP_INIT_CONST, 1.0f},
                                   TP_VAR_TRAINABLE);
        tp_node_t *b = tp_variable(t, "beta", 1, cs,
                                   (tp_init_t){TP_INIT_ZEROS, 0},
                                   TP_VAR_TRAINABLE);
        tp_node_t *mm = tp_variable(t, "mean/EMA", 1, cs,
                                    (tp_init_t){TP_INIT_ZEROS, 0},
                                    TP_VAR_MODEL);
        tp_node_t *mv = tp_variable(t, "variance/EMA", 1, cs,
                                    (tp_init_t){TP_INIT_CONST, 1.0f},
                                    TP_VAR_MODEL);
        y = tp_batch_norm_op(t, "output", x, g, b, mm, mv, 0.9f, 1e-5f);
    }
    tp_tower_pop_scope(t);
    return y;
}

/* ---- the linalg family (docs/ops.md): batched matmul and the norms ------- */

/* Where a batched operand's batch (its dim 0) goes in a batched matmul. */
enum { S_BM_NONE, S_BM_BATCH, S_BM_ROW, S_BM_K, S_BM_COL };

tp_node_t *tp_batch_matmul(tp_tower_t *t, const char *name, tp_node_t *a,
                           tp_node_t *b, int trans_a, int trans_b) {
    tp_node_t *in[2] = {a, b};
    tp_node_t *n = s_node_float(t, name, TP_OP_BATCH_MATMUL, 2, in, 2);
    if (!n)
        return NULL;
    char x[96], y[96];
    const int ra = a->shape.ndim, rb = b->shape.ndim;
    /* a 1-d operand (torch.matmul's promotion): a [K] reads as [1,K] and b
     * [K] as [K,1], that dim then dropped from the result; a vector's
     * transpose is itself */
    if (ra == 1)
        trans_a = 0;
    if (rb == 1)
        trans_b = 0;
    const char *ta = trans_a ? " (transposed)" : "", *tb = trans_b ? " (transposed)" : "";
    s_shape_str(&a->shape, x, 96);
    s_shape_str(&b->shape, y, 96);
    const int ea = ra < 2 ? 2 : ra, eb = rb < 2 ? 2 : rb, r = ea > eb ? ea : eb;
    if (ra < 1 || rb < 1)
        FAIL(t, n, "a %s and b %s: a scalar operand has no product (use tp_mul)", x, y);
    if ((ra == 1 && a->batched) || (rb == 1 && b->batched))
        FAIL(t, n, "a %s and b %s: '%s' is a batched vector (its one dim is the batch); "
             "reshape it to [N,1] or [N,K,1] first", x, y,
             ra == 1 && a->batched ? a->name : b->name);
    const int64_t m = ra == 1 ? 1 : a->shape.d[ra - 2 + !!trans_a];
    const int64_t ka = ra == 1 ? a->shape.d[0] : a->shape.d[ra - 1 - !!trans_a];
    const int64_t kb = rb == 1 ? b->shape.d[0] : b->shape.d[rb - 2 + !!trans_b];
    const int64_t nn = rb == 1 ? 1 : b->shape.d[rb - 1 - !!trans_b];
    if (ka != kb)
        FAIL(t, n, "a %s%s and b %s%s: K is %lld in a and %lld in b", x, ta, y, tb,
             (long long)ka, (long long)kb);
    /* the batch of a batched operand: a batch dim (rank > 2), or a row,
     * column or K of a rank-2 operand */
    const int role_a = !a->batched ? S_BM_NONE : ra > 2 ? S_BM_BATCH
                       : trans_a ? S_BM_K : S_BM_ROW;
    const int role_b = !b->batched ? S_BM_NONE : rb > 2 ? S_BM_BATCH
                       : trans_b ? S_BM_COL : S_BM_K;
    if ((role_a == S_BM_BATCH && ra != r) || (role_b == S_BM_BATCH && rb != r))
        FAIL(t, n, "a %s and b %s: the batched operand ('%s') must have the "
             "result's %d dims (the batch stays dim 0)", x, y,
             role_a == S_BM_BATCH && ra != r ? a->name : b->name, r);
    if (role_a == S_BM_ROW && r != 2)
        FAIL(t, n, "a %s and b %s: the batch of a ('%s') is its rows M, which "
             "land in dim %d of the result, not dim 0", x, y, a->name, r - 2);
    if (role_b == S_BM_COL)
        FAIL(t, n, "a %s and b %s%s: the batch of b ('%s') would be the result's "
             "last dim (transpose the product instead)", x, y, tb, b->name);
    if ((role_a == S_BM_K) != (role_b == S_BM_K))
        FAIL(t, n, "a %s%s and b %s%s: K is the batch in %s ('%s') but a fixed "
             "%lld in the other", x, ta, y, tb, role_a == S_BM_K ? "a" : "b",
             role_a == S_BM_K ? a->name : b->name, (long long)ka);
    const int batched = role_a == S_BM_BATCH || role_a == S_BM_ROW ||
                        role_b == S_BM_BATCH;
    tp_shape_t o = {.ndim = r - (ra == 1) - (rb == 1)};
    for (int d = 0; d < r - 2; d++) {
        const int ia = d - (r - ea), ib = d - (r - eb);
        const int64_t da = ia >= 0 ? a->shape.d[ia] : 1;
        const int64_t db = ib >= 0 ? b->shape.d[ib] : 1;
        /* an unbatched operand's dim 0 against the batch, which changes
         * from step to step: only 1 broadcasts */
        if (d == 0 && batched && ((ia == 0 && !a->batched && da != 1) ||
                                  (ib == 0 && !b->batched && db != 1)))
            FAIL(t, n, "a %s and b %s: '%s' is not batched, so its dim 0 must be "
                 "1 against the batch", x, y, ia == 0 && !a->batched && da != 1
                 ? a->name : b->name);
        if (da != db && da != 1 && db != 1)
            FAIL(t, n, "a %s and b %s: batch dim %d is %lld in one and %lld in "
                 "the other (need equal, or 1)", x, y, d, (long long)da, (long long)db);
        o.d[d] = da == 1 ? db : da;
    }
    int od = r - 2;
    if (ra > 1)
        o.d[od++] = m;
    if (rb > 1)
        o.d[od++] = nn;
    n->shape = o;
    n->batched = batched;
    n->attr.trans_a = !!trans_a;
    n->attr.trans_b = !!trans_b;
    return n;
}

/* A norm node on x and the parameters given: gamma and beta each may be
 * NULL (elementwise_affine=False, or one of them alone, as F.layer_norm's
 * weight and bias), the node's inputs then x and those present, in order,
 * and attr.norm_absent says which are left out (tp_norm_params). */
static tp_node_t *s_norm_node(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                              tp_node_t *x, tp_node_t *gamma, tp_node_t *beta) {
    tp_node_t *in[3] = {x, NULL, NULL};
    int n_in = 1;
    if (gamma)
        in[n_in++] = gamma;
    if (beta)
        in[n_in++] = beta;
    tp_node_t *n = s_node(t, name, kind, n_in, in);
    if (n)
        n->attr.norm_absent = (gamma ? 0 : 1) | (beta ? 0 : 2);
    return n;
}

/* x and the parameters present as floats, those unbatched of shape `ps`,
 * eps positive: the norms' common checks. 0 after recording the error. */
static int s_norm_params(tp_tower_t *t, tp_node_t *n, const tp_shape_t *ps,
                         float eps, const char *what) {
    for (int i = 0; i < n->ninputs; i++)
        if (!s_check_float(t, n, i))
            return 0;
    char a[96], b[96], c[96];
    const int gi = n->attr.norm_absent & 1 ? -1 : 1; /* gamma's input, if any */
    for (int i = 1; i < n->ninputs; i++) {
        const tp_node_t *p = n->inputs[i];
        if (p->batched || p->shape.ndim != ps->ndim ||
            memcmp(p->shape.d, ps->d, sizeof(int64_t) * (size_t)ps->ndim)) {
            s_fail(t, TP_ERR_SHAPE, n->name, "x %s: %s ('%s') is %s%s, must be %s (%s)",
                   s_shape_str(&n->inputs[0]->shape, a, 96), i == gi ? "gamma" : "beta",
                   p->name, s_shape_str(&p->shape, b, 96), p->batched ? ", batched" : "",
                   s_shape_str(ps, c, 96), what);
            return 0;
        }
    }
    if (!(eps > 0.0f && isfinite(eps))) {
        s_fail(t, TP_ERR_SHAPE, n->name, "eps %g: must be finite and > 0", (double)eps);
        return 0;
    }
    n->attr.eps = eps;
    return 1;
}

tp_node_t *tp_layer_norm_op(tp_tower_t *t, const char *name, tp_node_t *x,
                            tp_node_t *gamma, tp_node_t *beta, int axes,
                            float eps) {
    tp_node_t *n = s_norm_node(t, name, TP_OP_LAYER_NORM, x, gamma, beta);
    if (!n)
        return NULL;
    char a[96];
    const int lo = x->batched ? 1 : 0;
    if (axes < 1 || axes > x->shape.ndim - lo)
        FAIL(t, n, "x %s%s: cannot normalise over its last %d axes (1 to %d%s)",
             s_shape_str(&x->shape, a, 96), x->batched ? ", batched" : "", axes,
             x->shape.ndim - lo, lo ? ": never the batch" : "");
    tp_shape_t ps = {.ndim = axes};
    for (int i = 0; i < axes; i++)
        ps.d[i] = x->shape.d[x->shape.ndim - axes + i];
    if (!s_norm_params(t, n, &ps, eps, "x's last axes"))
        return s_drop_last(t);
    n->attr.norm_axes = axes;
    return n;
}

/* Group norm with `groups` groups (instance norm: C, kind INSTANCE_NORM). */
static tp_node_t *s_group_norm(tp_tower_t *t, const char *name, tp_op_kind_t kind,
                               tp_node_t *x, tp_node_t *gamma, tp_node_t *beta,
                               int groups, float eps) {
    tp_node_t *n = s_norm_node(t, name, kind, x, gamma, beta);
    if (!n)
        return NULL;
    char a[96];
    const int rmin = kind == TP_OP_INSTANCE_NORM ? 3 : 2;
    if (x->shape.ndim < rmin)
        FAIL(t, n, "x is %s: needs [N,C%s...] (rank >= %d)",
             s_shape_str(&x->shape, a, 96), rmin == 3 ? ",D1" : "", rmin);
    const int64_t c = x->shape.d[1];
    if (kind == TP_OP_INSTANCE_NORM)
        groups = (int)c;
    if (groups < 1 || c % groups)
        FAIL(t, n, "x %s: %d groups do not divide its %lld channels",
             s_shape_str(&x->shape, a, 96), groups, (long long)c);
    tp_shape_t ps = {.ndim = 1, .d = {c}};
    if (!s_norm_params(t, n, &ps, eps, "one per channel"))
        return s_drop_last(t);
    n->attr.norm_groups = groups;
    return n;
}

tp_node_t *tp_group_norm_op(tp_tower_t *t, const char *name, tp_node_t *x,
                            tp_node_t *gamma, tp_node_t *beta, int groups,
                            float eps) {
    return s_group_norm(t, name, TP_OP_GROUP_NORM, x, gamma, beta, groups, eps);
}

tp_node_t *tp_instance_norm_op(tp_tower_t *t, const char *name, tp_node_t *x,
                               tp_node_t *gamma, tp_node_t *beta, float eps) {
    return s_group_norm(t, name, TP_OP_INSTANCE_NORM, x, gamma, beta, 0, eps);
}

/* A norm layer: gamma (ones) and beta (zeros) in `scope`, of the shape
 * the op wants (count: layer norm's axes, group norm's groups). */
static tp_node_t *s_norm_layer(tp_tower_t *t, const char *scope, tp_node_t *x,
                               tp_op_kind_t kind, int count) {
    if (!s_layer_scope(t, scope, x))
        return NULL;
    tp_node_t *y = NULL;
    int64_t ps[TP_MAX_DIMS];
    int nd = 1;
    if (kind == TP_OP_LAYER_NORM && (count < 1 || count > x->shape.ndim)) {
        char a[96];
        s_fail(t, TP_ERR_SHAPE, scope, "layer norm of x %s over its last %d axes",
               s_shape_str(&x->shape, a, 96), count);
    } else if (kind != TP_OP_LAYER_NORM && x->shape.ndim < 2) {
        char a[96];
        s_fail(t, TP_ERR_SHAPE, scope, "%s of x %s: needs [N,C,...]",
               tp_op_name(kind), s_shape_str(&x->shape, a, 96));
    } else {
        if (kind == TP_OP_LAYER_NORM) {
            nd = count;
            for (int i = 0; i < nd; i++)
                ps[i] = x->shape.d[x->shape.ndim - nd + i];
        } else {
            ps[0] = x->shape.d[1];
        }
        tp_node_t *g = tp_variable(t, "gamma", nd, ps,
                                   (tp_init_t){TP_INIT_CONST, 1.0f}, TP_VAR_TRAINABLE);
        tp_node_t *b = tp_variable(t, "beta", nd, ps, (tp_init_t){TP_INIT_ZEROS, 0},
                                   TP_VAR_TRAINABLE);
        if (kind == TP_OP_LAYER_NORM)
            y = tp_layer_norm_op(t, "output", x, g, b, count, 1e-5f);
        else if (kind == TP_OP_GROUP_NORM)
            y = tp_group_norm_op(t, "output", x, g, b, count, 1e-5f);
        else
            y = tp_instance_norm_op(t, "output", x, g, b, 1e-5f);
    }
    tp_tower_pop_scope(t);
    return y;
}

tp_node_t *tp_layer_norm(tp_tower_t *t, const char *scope, tp_node_t *x,
                         int axes) {
    return s_norm_layer(t, scope, x, TP_OP_LAYER_NORM, axes);
}
tp_node_t *tp_group_norm(tp_tower_t *t, const char *scope, tp_node_t *x,
                         int groups) {
    return s_norm_layer(t, scope, x, TP_OP_GROUP_NORM, groups);
}
tp_node_t *tp_instance_norm(tp_tower_t *t, const char *scope, tp_node_t *x) {
    return s_norm_layer(t, scope, x, TP_OP_INSTANCE_NORM, 0);
}

/* ---- fused attention (docs/ops.md) ---------------------------------------- */

tp_node_t *tp_attention(tp_tower_t *t, const char *name, tp_node_t *q,
                        tp_node_t *k, tp_node_t *v, int causal, float scale) {
    tp_node_t *in[3] = {q, k, v};
    tp_node_t *n = s_node_float(t, name, TP_OP_ATTENTION, 3, in, 3);
    if (!n)
        return NULL;
    char a[96], b[96], c[96];
    const tp_shape_t *qs = &q->shape, *ks = &k->shape, *vs = &v->shape;
    s_shape_str(qs, a, 96);
    s_shape_str(ks, b, 96);
    s_shape_str(vs, c, 96);
    const int r = qs->ndim;
    int ok = r >= 2 && ks->ndim == r && vs->ndim == r &&
             !memcmp(ks->d, vs->d, sizeof(int64_t) * (size_t)r) &&
             qs->d[r - 1] == ks->d[r - 1] && qs->d[r - 1] >= 1 && qs->d[r - 2] >= 1 &&
             ks->d[r - 2] >= 1;
    for (int d = 0; ok && d < r - 2; d++)
        ok = qs->d[d] == ks->d[d];
    if (!ok)
        FAIL(t, n, "q %s ('%s'), k %s ('%s'), v %s ('%s'): need q [...,Tq,D] and k, v "
             "[...,Tk,D] of one shape, the leading dims equal", a, q->name, b, k->name,
             c, v->name);
    if (q->batched != k->batched || q->batched != v->batched)
        FAIL(t, n, "q %s ('%s'%s), k %s ('%s'%s), v %s ('%s'%s): all batched or none",
             a, q->name, q->batched ? ", batched" : "", b, k->name,
             k->batched ? ", batched" : "", c, v->name, v->batched ? ", batched" : "");
    if (causal && qs->d[r - 2] != ks->d[r - 2])
        FAIL(t, n, "q %s ('%s') and k %s ('%s'): causal attention needs as many "
             "queries as keys (Tq %lld, Tk %lld)", a, q->name, b, k->name,
             (long long)qs->d[r - 2], (long long)ks->d[r - 2]);
    if (!(scale >= 0.0f && isfinite(scale)))
        FAIL(t, n, "scale %g: must be finite and >= 0 (0: 1/sqrt(D))", (double)scale);
    n->attr.alpha = scale > 0.0f ? scale : 1.0f / sqrtf((float)qs->d[r - 1]);
    n->attr.beta = causal ? 1.0f : 0.0f;
    return n;
}

/* The packed form: one input, the qkv projection's [...,T,3C] as it lies
 * (q, k and v side by side in each row, each H heads of D = C/H), the
 * output [...,T,C] with the heads side by side as the output projection
 * reads them. The kernels read each head's rows at a stride of 3C and
 * write its output and its gradients (into the qkv's gradient, whole) at
 * C and 3C: no reshape, transpose or slice of the heads around the op,
 * forward or backward, and the same arithmetic per head as tp_attention
 * on the copies (docs/ops.md). */
tp_node_t *tp_attention_qkv(tp_tower_t *t, const char *name, tp_node_t *qkv, int heads,
                            int causal, float scale) {
    tp_node_t *in[1] = {qkv};
    tp_node_t *n = s_node_float(t, name, TP_OP_ATTENTION, 1, in, 1);
    if (!n)
        return NULL;
    char a[96];
    const tp_shape_t *xs = &qkv->shape;
    s_shape_str(xs, a, 96);
    const int r = xs->ndim;
    if (r < 2 || xs->d[r - 2] < 1 || xs->d[r - 1] < 3 || xs->d[r - 1] % 3)
        FAIL(t, n, "qkv %s ('%s'): need [...,T,3C], q, k and v side by side in each row", a,
             qkv->name);
    const int64_t C = xs->d[r - 1] / 3;
    if (heads < 1 || C % heads)
        FAIL(t, n, "qkv %s ('%s'): %d heads do not divide its width C = %lld", a, qkv->name,
             heads, (long long)C);
    if (!(scale >= 0.0f && isfinite(scale)))
        FAIL(t, n, "scale %g: must be finite and >= 0 (0: 1/sqrt(D))", (double)scale);
    n->shape.d[r - 1] = C;
    n->attr.heads = heads;
    n->attr.alpha = scale > 0.0f ? scale : 1.0f / sqrtf((float)(C / heads));
    n->attr.beta = causal ? 1.0f : 0.0f;
    return n;
}
