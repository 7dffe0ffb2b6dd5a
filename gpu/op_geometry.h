/* towerpack gpu: the geometry of an op call that the CPU and the CUDA
 * kernels of a family both need, written once (private to gpu/). */
#ifndef TP_GPU_OP_GEOMETRY_H
#define TP_GPU_OP_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* batch_matmul: the product's sizes and how the output's batches map onto
 * a's and b's (torch.matmul's broadcasting; a stride 0 is a broadcast). */
typedef struct {
    int m, n, k;              /* the product's sizes */
    int nd;                   /* batch dims of the output */
    int64_t od[TP_MAX_DIMS];  /* [nd] the output's batch dims */
    size_t sa[TP_MAX_DIMS], sb[TP_MAX_DIMS]; /* [nd] element strides of a's and
                                                b's batches (0: broadcast) */
    size_t nbat;              /* output batches */
    size_t na, nb;            /* a's and b's own batch counts */
} tp_bmm_geom_t;

/* The transposes as the kernels read them: a 1-d operand's is ignored. */
static inline int tp_bmm_trans_a(const tp_op_call_t *c) {
    return c->xshape[0].ndim > 1 && c->attr->trans_a;
}
static inline int tp_bmm_trans_b(const tp_op_call_t *c) {
    return c->xshape[1].ndim > 1 && c->attr->trans_b;
}

static inline void tp_bmm_geometry(const tp_op_call_t *c, tp_bmm_geom_t *g) {
    const tp_shape_t *a = &c->xshape[0], *b = &c->xshape[1];
    /* a 1-d operand (torch.matmul's promotion): a [K] is [1,K], b [K] is
     * [K,1] (never transposed: the builder clears that flag), with no
     * batch dims, and the output lacks that dim of size 1 */
    const int ra = a->ndim, rb = b->ndim;
    const int ta = tp_bmm_trans_a(c), tb = tp_bmm_trans_b(c);
    const int ea = ra < 2 ? 2 : ra, eb = rb < 2 ? 2 : rb;
    g->m = ra == 1 ? 1 : (int)a->d[ra - 2 + ta];
    g->k = ra == 1 ? (int)a->d[0] : (int)a->d[ra - 1 - ta];
    g->n = rb == 1 ? 1 : (int)b->d[rb - 1 - tb];
    g->nd = c->yshape.ndim - 2 + (ra == 1) + (rb == 1);
    size_t stride_a = ra == 1 ? (size_t)a->d[0] : (size_t)a->d[ra - 2] * (size_t)a->d[ra - 1];
    size_t stride_b = rb == 1 ? (size_t)b->d[0] : (size_t)b->d[rb - 2] * (size_t)b->d[rb - 1];
    g->nbat = g->na = g->nb = 1;
    for (int d = g->nd - 1; d >= 0; d--) {
        const int ia = d - (g->nd - (ea - 2)), ib = d - (g->nd - (eb - 2));
        const int64_t da = ia >= 0 ? a->d[ia] : 1, db = ib >= 0 ? b->d[ib] : 1;
        g->od[d] = c->yshape.d[d];
        g->sa[d] = da == 1 ? 0 : stride_a;
        g->sb[d] = db == 1 ? 0 : stride_b;
        stride_a *= (size_t)da;
        stride_b *= (size_t)db;
        g->nbat *= (size_t)g->od[d];
        g->na *= (size_t)da;
        g->nb *= (size_t)db;
    }
}

/* layer, group and instance norm: rows normalised, their length, groups
 * per sample and positions per channel. */
typedef struct {
    size_t rows, len, groups, sp;
} tp_norm_rows_t;

static inline tp_norm_rows_t tp_norm_rows(const tp_op_call_t *c) {
    const tp_shape_t *x = &c->xshape[0];
    const size_t n = tp_shape_count(x);
    tp_norm_rows_t r = {0, 1, 1, 1};
    if (c->kind == TP_OP_LAYER_NORM) {
        for (int i = x->ndim - c->attr->norm_axes; i < x->ndim; i++)
            r.len *= (size_t)x->d[i];
    } else {
        for (int i = 2; i < x->ndim; i++)
            r.sp *= (size_t)x->d[i];
        r.groups = (size_t)c->attr->norm_groups;
        r.len = (size_t)x->d[1] / r.groups * r.sp;
    }
    r.rows = r.len ? n / r.len : 0;
    return r;
}

/* The norms' parameters: gamma's and beta's input indices, -1 for one
 * left out (attr.norm_absent; the inputs are x, then those present). */
static inline void tp_norm_params(const tp_op_attr_t *a, int *gi, int *bi) {
    *gi = a->norm_absent & 1 ? -1 : 1;
    *bi = a->norm_absent & 2 ? -1 : (a->norm_absent & 1 ? 1 : 2);
}

/* The floating-point operations of one call, for the profile's GFLOPS (a
 * multiply-add counts 2, as a peak's FMA does): the forward's, and the
 * backward's per input gradient (bwd[0] the data's, bwd[1] the weights' or
 * the second operand's; a conv's bias is in the forward and in bwd[1]).
 * 0 for an op whose cost is its memory traffic, not arithmetic (the
 * elementwise, shape, pooling and norm families). */
typedef struct {
    double fwd;
    double bwd[2];
} tp_op_flops_t;

static inline tp_op_flops_t tp_op_flops(const tp_op_call_t *c) {
    tp_op_flops_t f = {0, {0, 0}};
    const tp_shape_t *x = &c->xshape[0], *y = &c->yshape;
    switch (c->kind) {
    case TP_OP_CONV2D:
    case TP_OP_CONV_TRANSPOSE: {
        /* every (output pixel, filter tap, input channel of its group) is
         * one multiply-add; a transposed conv's pixels are its input's */
        const double g = c->attr->groups > 0 ? c->attr->groups : 1;
        const tp_shape_t *px = c->kind == TP_OP_CONV2D ? y : x;
        const double cin = (double)(c->kind == TP_OP_CONV2D ? x->d[1] : y->d[1]);
        const double macs = (double)tp_shape_count(px) * (cin / g) *
                            (double)c->attr->kh * (double)c->attr->kw;
        const double bias = c->ninputs > 2 ? (double)tp_shape_count(y) : 0.0;
        f.fwd = 2.0 * macs + bias;
        f.bwd[0] = 2.0 * macs;
        f.bwd[1] = 2.0 * macs + bias;
        break;
    }
    case TP_OP_MATMUL: {
        /* x[N, K] (trailing dims flattened) @ W[K, M] */
        const double n = (double)x->d[0];
        const double k = (double)tp_shape_count(x) / (n > 0 ? n : 1.0);
        const double m = (double)c->xshape[1].d[1];
        f.fwd = f.bwd[0] = f.bwd[1] = 2.0 * n * k * m;
        break;
    }
    case TP_OP_BATCH_MATMUL: {
        tp_bmm_geom_t g;
        tp_bmm_geometry(c, &g);
        f.fwd = f.bwd[0] = f.bwd[1] = 2.0 * (double)g.nbat * g.m * g.n * g.k;
        break;
    }
    default:
        break;
    }
    return f;
}

/* Callable from a CUDA kernel too. */
#ifdef __CUDACC__
#define TP_GEOM_FN static inline __host__ __device__
#else
#define TP_GEOM_FN static inline
#endif

/* Bilinear upsampling: the two source taps of output index o along an
 * axis of `in` elements upsampled by f, and their weights: PyTorch's
 * area_pixel_compute_source_index in float (the scale 1/f, or
 * (in-1)/(out-1) with align_corners), clamped at 0. */
TP_GEOM_FN void tp_bilinear_taps(int o, int in, int f, int align, int *i0, int *i1,
                                 float *l0, float *l1) {
    const int out = in * f;
    float src;
    if (align) {
        const float scale = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
        src = scale * (float)o;
    } else {
        const float scale = 1.0f / (float)f;
        src = scale * ((float)o + 0.5f) - 0.5f;
        if (src < 0.0f)
            src = 0.0f;
    }
    int a = (int)src;
    if (a > in - 1)
        a = in - 1;
    *i0 = a;
    *i1 = a + (a < in - 1 ? 1 : 0);
    *l1 = src - (float)a;
    *l0 = 1.0f - *l1;
}

#endif
