/* towerpack gpu: the CPU kernels of the reduce family (docs/ops.md).
 *
 * A reduction walks its input once, in memory order, carrying the index of
 * the output element each input element folds into (an odometer over the
 * input's axes whose reduced axes have output stride 0): one pass for any
 * set of axes, no transposes, and every load sequential. Sums run in
 * double (the workspace holds one double per output), as the loss family
 * does, so a mean over a whole batch keeps float precision.
 *
 * Softmax and log-softmax along an axis see x as [outer, n, inner] and
 * work a whole [n, inner] slab at a time, inner-most loops over the
 * contiguous inner axis (the workspace holds a max and a sum per inner
 * position), so a softmax over axis 1 of [N,C,H,W] is as sequential as
 * one over the last axis. The backward uses the output y: softmax
 * dx = y (dy - sum dy y), log-softmax dx = dy - e^y sum dy.
 *
 * The sequence cross-entropy recomputes each row's softmax in its backward
 * rather than keeping [N, V] probabilities: a language model's logits are
 * the largest tensor of its step. */
#include <math.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_reduce.h"

int tp_cpu_reduce_kind(tp_op_kind_t k) {
    return k == TP_OP_REDUCE_SUM || k == TP_OP_REDUCE_MEAN || k == TP_OP_REDUCE_MAX ||
           k == TP_OP_ARGMAX || k == TP_OP_SOFTMAX || k == TP_OP_LOG_SOFTMAX ||
           k == TP_OP_SOFTMAX_XENT_SEQ || k == TP_OP_TOP_K_ACCURACY;
}

/* ---- reductions over a set of axes ---------------------------------------- */

/* x's axes with the output stride of each (0 for a reduced one). */
typedef struct {
    int nd;
    size_t dim[TP_MAX_DIMS];
    size_t ost[TP_MAX_DIMS];
    size_t nx, ny; /* element counts of x and of the output */
} s_map_t;

static void s_map(const tp_shape_t *x, int axes, s_map_t *m) {
    size_t st = 1;
    m->nd = x->ndim;
    m->nx = tp_shape_count(x);
    for (int d = x->ndim - 1; d >= 0; d--) {
        m->dim[d] = (size_t)x->d[d];
        m->ost[d] = (axes & (1 << d)) ? 0 : st;
        if (!(axes & (1 << d)))
            st *= (size_t)x->d[d];
    }
    m->ny = st;
}

/* Run BODY for every input element i with o its output element, i in
 * memory order; the last axis is the inner loop. */
#define S_WALK(m, ...)                                                        \
    do {                                                                      \
        const size_t in_ = (m)->nd ? (m)->dim[(m)->nd - 1] : 1;               \
        const size_t is_ = (m)->nd ? (m)->ost[(m)->nd - 1] : 0;               \
        size_t idx_[TP_MAX_DIMS] = {0}, o0_ = 0;                              \
        for (size_t i0_ = 0; in_ && i0_ < (m)->nx; i0_ += in_) {              \
            for (size_t j_ = 0; j_ < in_; j_++) {                             \
                const size_t i = i0_ + j_, o = o0_ + j_ * is_;                \
                __VA_ARGS__;                                                  \
            }                                                                 \
            for (int d_ = (m)->nd - 2; d_ >= 0; d_--) {                       \
                if (++idx_[d_] < (m)->dim[d_]) {                              \
                    o0_ += (m)->ost[d_];                                      \
                    break;                                                    \
                }                                                             \
                o0_ -= (m)->ost[d_] * ((m)->dim[d_] - 1);                     \
                idx_[d_] = 0;                                                 \
            }                                                                 \
        }                                                                     \
    } while (0)

/* Elements folded into each output element: nx / ny (0 when empty). */
static double s_per_out(const s_map_t *m) {
    return m->ny ? (double)m->nx / (double)m->ny : 0.0;
}

static void s_reduce_fwd(const tp_op_call_t *c) {
    s_map_t m;
    s_map(&c->xshape[0], c->attr->axes, &m);
    const float *restrict x = c->x[0];
    float *restrict y = c->y;
    if (c->kind == TP_OP_REDUCE_MAX) {
        for (size_t o = 0; o < m.ny; o++)
            y[o] = -INFINITY;
        /* NaN wins and stays, as torch.amax */
        S_WALK(&m, { if (x[i] > y[o] || isnan(x[i])) y[o] = x[i]; });
        return;
    }
    double *restrict acc = c->workspace;
    memset(acc, 0, m.ny * sizeof(double));
    S_WALK(&m, acc[o] += (double)x[i]);
    /* the mean of no elements is NaN (0/0), as torch's */
    const double scale = c->kind == TP_OP_REDUCE_MEAN ? 1.0 / s_per_out(&m) : 1.0;
    for (size_t o = 0; o < m.ny; o++)
        y[o] = (float)(acc[o] * scale);
}

static void s_reduce_bwd(const tp_op_call_t *c) {
    float *restrict dx = c->dx[0];
    if (!dx)
        return;
    s_map_t m;
    s_map(&c->xshape[0], c->attr->axes, &m);
    const float *restrict dy = c->dy;
    const int acc = c->dx_acc[0];
    const float fault = tp_cpu_elementwise_grad_fault; /* 1 outside the checks */
    if (c->kind == TP_OP_REDUCE_MAX) {
        /* the gradient splits evenly over the elements equal to the max */
        const float *restrict x = c->x[0], *restrict y = c->y;
        float *restrict cnt = c->workspace;
        memset(cnt, 0, m.ny * sizeof(float));
        S_WALK(&m, cnt[o] += (float)(x[i] == y[o]));
        S_WALK(&m, {
            const float g = x[i] == y[o] ? dy[o] / cnt[o] * fault : 0.0f;
            dx[i] = acc ? dx[i] + g : g;
        });
        return;
    }
    const float scale =
        (c->kind == TP_OP_REDUCE_MEAN ? (float)(1.0 / s_per_out(&m)) : 1.0f) * fault;
    S_WALK(&m, dx[i] = acc ? dx[i] + dy[o] * scale : dy[o] * scale);
}

/* ---- along one axis: x as [outer, n, inner] -------------------------------- */

static void s_split(const tp_shape_t *x, int axes, size_t *outer, size_t *n,
                    size_t *inner) {
    *outer = *n = *inner = 1;
    int ax = 0;
    while (ax < x->ndim - 1 && !(axes & (1 << ax)))
        ax++;
    for (int d = 0; d < x->ndim; d++) {
        if (d < ax)
            *outer *= (size_t)x->d[d];
        else if (d == ax)
            *n = (size_t)x->d[d];
        else
            *inner *= (size_t)x->d[d];
    }
}

static void s_argmax_fwd(const tp_op_call_t *c) {
    size_t outer, n, inner;
    s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
    const float *x = c->x[0];
    int32_t *y = c->y;
    for (size_t o = 0; o < outer; o++)
        for (size_t i = 0; i < inner; i++) {
            const float *r = x + o * n * inner + i;
            size_t best = 0;
            float bv = r[0];
            /* the first maximum; a NaN is the maximum (torch.argmax) */
            for (size_t j = 1; j < n && !isnan(bv); j++)
                if (r[j * inner] > bv || isnan(r[j * inner])) {
                    bv = r[j * inner];
                    best = j;
                }
            y[o * inner + i] = (int32_t)best;
        }
}

static void s_softmax_fwd(const tp_op_call_t *c) {
    size_t outer, n, inner;
    s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
    const int lg = c->kind == TP_OP_LOG_SOFTMAX;
    float *restrict mx = c->workspace, *restrict sum = mx + inner;
    for (size_t o = 0; o < outer; o++) {
        const float *restrict x = (const float *)c->x[0] + o * n * inner;
        float *restrict y = (float *)c->y + o * n * inner;
        memcpy(mx, x, inner * sizeof(float));
        for (size_t j = 1; j < n; j++)
            for (size_t i = 0; i < inner; i++)
                mx[i] = x[j * inner + i] > mx[i] ? x[j * inner + i] : mx[i];
        memset(sum, 0, inner * sizeof(float));
        for (size_t j = 0; j < n; j++)
            for (size_t i = 0; i < inner; i++) {
                const float e = expf(x[j * inner + i] - mx[i]);
                sum[i] += e;
                y[j * inner + i] = e;
            }
        if (lg) {
            for (size_t i = 0; i < inner; i++)
                sum[i] = mx[i] + logf(sum[i]);
            for (size_t j = 0; j < n; j++)
                for (size_t i = 0; i < inner; i++)
                    y[j * inner + i] = x[j * inner + i] - sum[i];
        } else {
            for (size_t i = 0; i < inner; i++)
                sum[i] = 1.0f / sum[i];
            for (size_t j = 0; j < n; j++)
                for (size_t i = 0; i < inner; i++)
                    y[j * inner + i] *= sum[i];
        }
    }
}

static void s_softmax_bwd(const tp_op_call_t *c) {
    if (!c->dx[0])
        return;
    size_t outer, n, inner;
    s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
    const int lg = c->kind == TP_OP_LOG_SOFTMAX, acc = c->dx_acc[0];
    const float fault = tp_cpu_elementwise_grad_fault;
    float *restrict dot = c->workspace;
    for (size_t o = 0; o < outer; o++) {
        const size_t base = o * n * inner;
        const float *restrict y = (const float *)c->y + base, *restrict dy = c->dy + base;
        float *restrict dx = c->dx[0] + base;
        memset(dot, 0, inner * sizeof(float));
        /* softmax: sum dy y; log-softmax: sum dy */
        for (size_t j = 0; j < n; j++)
            for (size_t i = 0; i < inner; i++)
                dot[i] += lg ? dy[j * inner + i] : dy[j * inner + i] * y[j * inner + i];
        for (size_t j = 0; j < n; j++)
            for (size_t i = 0; i < inner; i++) {
                const size_t e = j * inner + i;
                const float g = (lg ? dy[e] - expf(y[e]) * dot[i] : y[e] * (dy[e] - dot[i])) *
                                fault;
                dx[e] = acc ? dx[e] + g : g;
            }
    }
}

/* ---- labels: the sequence cross-entropy and top-k accuracy ------------------ */

/* Rows of logits [..., V] as [rows, V]. */
static void s_rows(const tp_op_call_t *c, size_t *rows, size_t *v) {
    const tp_shape_t *s = &c->xshape[0];
    *v = (size_t)s->d[s->ndim - 1];
    *rows = *v ? tp_shape_count(s) / *v : 0;
}

static tp_status_t s_bad_label(const tp_op_call_t *c, size_t row, int32_t l, size_t v) {
    return tp_error(TP_ERR_INVALID, "%s: label %d at row %zu outside [0,%zu)%s", c->name,
                    l, row, v,
                    c->kind == TP_OP_SOFTMAX_XENT_SEQ ? " and not the ignore label" : "");
}

/* log sum_j e^r_j, and r's max. */
static float s_logsumexp(const float *r, size_t v, float *mx_out) {
    float mx = r[0];
    for (size_t j = 1; j < v; j++)
        mx = r[j] > mx ? r[j] : mx;
    float s = 0.0f;
    for (size_t j = 0; j < v; j++)
        s += expf(r[j] - mx);
    *mx_out = mx;
    return mx + logf(s);
}

static tp_status_t s_xent_seq_fwd(const tp_op_call_t *c) {
    size_t rows, v;
    s_rows(c, &rows, &v);
    if (tp_shape_count(&c->xshape[1]) != rows) /* batched on one side only */
        return tp_error(TP_ERR_SHAPE, "%s: %zu rows of logits but %zu labels", c->name,
                        rows, tp_shape_count(&c->xshape[1]));
    const float *x = c->x[0];
    const int32_t *lab = c->x[1];
    const int32_t ignore = (int32_t)c->attr->alpha;
    double loss = 0.0;
    size_t counted = 0;
    for (size_t r = 0; r < rows; r++) {
        if (lab[r] == ignore)
            continue;
        if (lab[r] < 0 || (size_t)lab[r] >= v)
            return s_bad_label(c, r, lab[r], v);
        float mx;
        loss += (double)s_logsumexp(x + r * v, v, &mx) - x[r * v + (size_t)lab[r]];
        counted++;
    }
    /* nothing counted: 0/0, NaN, as F.cross_entropy */
    *(float *)c->y = (float)(loss / (double)counted);
    return TP_OK;
}

static void s_xent_seq_bwd(const tp_op_call_t *c) {
    float *dx = c->dx[0];
    if (!dx)
        return;
    size_t rows, v;
    s_rows(c, &rows, &v);
    const float *x = c->x[0];
    const int32_t *lab = c->x[1];
    const int32_t ignore = (int32_t)c->attr->alpha;
    const int acc = c->dx_acc[0];
    size_t counted = 0;
    for (size_t r = 0; r < rows; r++)
        counted += lab[r] != ignore; /* in range: checked in forward */
    const float g = c->dy[0] / (float)counted * tp_cpu_elementwise_grad_fault;
    for (size_t r = 0; r < rows; r++) {
        float *d = dx + r * v;
        if (lab[r] == ignore) {
            if (!acc)
                memset(d, 0, v * sizeof(float));
            continue;
        }
        const float *row = x + r * v;
        float mx;
        const float lse = s_logsumexp(row, v, &mx);
        for (size_t j = 0; j < v; j++) {
            const float p = expf(row[j] - lse);
            const float gj = g * (j == (size_t)lab[r] ? p - 1.0f : p);
            d[j] = acc ? d[j] + gj : gj;
        }
    }
}

static tp_status_t s_top_k_fwd(const tp_op_call_t *c) {
    const size_t n = (size_t)c->xshape[0].d[0], v = (size_t)c->xshape[0].d[1];
    const size_t k = (size_t)c->attr->alpha;
    const float *x = c->x[0];
    const int32_t *lab = c->x[1];
    if (c->xshape[1].d[0] != (int64_t)n)
        return tp_error(TP_ERR_SHAPE, "%s: %zu rows of logits but %lld labels", c->name, n,
                        (long long)c->xshape[1].d[0]);
    size_t hits = 0;
    for (size_t r = 0; r < n; r++) {
        if (lab[r] < 0 || (size_t)lab[r] >= v)
            return s_bad_label(c, r, lab[r], v);
        const float *row = x + r * v, at = row[lab[r]];
        size_t above = 0;
        for (size_t j = 0; j < v; j++)
            above += row[j] > at;
        hits += above < k;
    }
    *(float *)c->y = (float)hits / (float)n;
    return TP_OK;
}

/* ---- dispatch ---------------------------------------------------------------- */

size_t tp_cpu_reduce_workspace(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
        return tp_shape_count(&c->yshape) * sizeof(double); /* sums; max: tie counts */
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX: {
        size_t outer, n, inner;
        s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
        return 2 * inner * sizeof(float); /* a max and a sum per inner position */
    }
    default:
        return 0;
    }
}

tp_status_t tp_cpu_reduce_forward(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
        s_reduce_fwd(c);
        return TP_OK;
    case TP_OP_ARGMAX:
        s_argmax_fwd(c);
        return TP_OK;
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
        s_softmax_fwd(c);
        return TP_OK;
    case TP_OP_SOFTMAX_XENT_SEQ:
        return s_xent_seq_fwd(c);
    case TP_OP_TOP_K_ACCURACY:
        return s_top_k_fwd(c);
    default:
        return tp_error(TP_ERR_UNSUPPORTED, "%s: %s is not a reduce-family op", c->name,
                        tp_op_name(c->kind));
    }
}

tp_status_t tp_cpu_reduce_backward(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
        s_reduce_bwd(c);
        return TP_OK;
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
        s_softmax_bwd(c);
        return TP_OK;
    case TP_OP_SOFTMAX_XENT_SEQ:
        s_xent_seq_bwd(c);
        return TP_OK;
    default: /* argmax, top-k accuracy: no gradient */
        return TP_OK;
    }
}
