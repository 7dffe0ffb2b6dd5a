/* towerpack gpu: the CPU kernels of the shape family (docs/ops.md).
 *
 * Transpose, slice, concat, pad and broadcast_to are one primitive: a
 * walk over a contiguous tensor in row-major order, paired with a strided
 * view of another buffer (an offset plus one stride per dim; 0 repeats a
 * value, a negative one walks backwards). Forward copies values one way,
 * backward moves gradients the other: a transpose's view is the input read
 * in the output's order, a slice's the input at start with strides times
 * the steps, a concat's or a pad's the output at the piece's corner, a
 * broadcast's the input with stride 0 on every stretched dim. The walk
 * copies whole rows with memcpy where the inner stride is 1, and walks
 * inner two dims that swap (NCHW <-> NHWC) as a 2-D transpose in tiles.
 * Values move as 4-byte words, so float32 and int32 take the same path.
 *
 * Gradients that several output elements share (a broadcast's stretched
 * dims) are added in the walk's fixed order: deterministic. Gather and
 * one-hot check every index before writing anything, so a bad index
 * leaves the output as it was and the message names it. */
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_math.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_shape.h"

int tp_cpu_shape_kind(tp_op_kind_t k) {
    return k == TP_OP_TRANSPOSE || k == TP_OP_SLICE || k == TP_OP_CONCAT ||
           k == TP_OP_PAD || k == TP_OP_BROADCAST_TO || k == TP_OP_GATHER ||
           k == TP_OP_ONE_HOT;
}

/* The strided side of a walk: the contiguous side has shape n[0..nd). */
typedef struct {
    int nd;
    int64_t n[TP_MAX_DIMS];  /* the contiguous tensor's shape */
    int64_t st[TP_MAX_DIMS]; /* the strided buffer's step per dim, elements */
    int64_t base;            /* the strided buffer's offset of element 0 */
} s_view_t;

/* The next index of the view's dims 0..top (the last fastest), its strided
 * offset moved along: 0 when every index has wrapped (the walk is done). */
static int s_view_step(const s_view_t *v, int top, int64_t *idx, int64_t *off) {
    for (int q = top; q >= 0; q--) {
        *off += v->st[q];
        if (++idx[q] < v->n[q])
            return 1;
        *off -= v->st[q] * v->n[q];
        idx[q] = 0;
    }
    return 0;
}

/* What a walk does per element: contiguous c[j], strided s[off]. */
enum {
    S_GATHER,       /* c = s (words) */
    S_SCATTER,      /* s = c (words) */
    S_GATHER_GRAD,  /* c = (acc ? c : 0) + f s */
    S_SCATTER_GRAD, /* s = (acc ? s : 0) + f c (each s written once) */
    S_SCATTER_ADD,  /* s += f c (s zeroed before where not acc) */
};

static void s_strides(const tp_shape_t *s, int64_t *st) {
    int64_t m = 1;
    for (int i = s->ndim - 1; i >= 0; i--) {
        st[i] = m;
        m *= s->d[i];
    }
}

/* A 2-D block of the walk whose strided side is the transpose of the
 * contiguous one: c[j + a nb + b] against s[off + a + b sst] (a < na, b <
 * nb; the NHWC transpose's [HW, C] against [C, HW]). Walked in 16x16 tiles
 * so both sides' cache lines stay in L1 while a tile moves, instead of one
 * short strided run per row. Every s element is touched once (sst >= na). */
static void s_tile2d(int mode, void *sp, void *cp, int64_t na, int64_t nb, int64_t sst,
                     int64_t off, size_t j, int acc, float f) {
    enum { T = 16 };
    uint32_t *restrict su = (uint32_t *)sp + off, *restrict cu = (uint32_t *)cp + j;
    float *restrict sf = (float *)sp + off, *restrict cf = (float *)cp + j;
    /* one loop nest per mode (no switch in the inner loop) */
#define S_TILES(stmt)                                                          \
    for (int64_t a0 = 0; a0 < na; a0 += T) {                                   \
        const int64_t a1 = a0 + T < na ? a0 + T : na;                          \
        for (int64_t b0 = 0; b0 < nb; b0 += T) {                               \
            const int64_t b1 = b0 + T < nb ? b0 + T : nb;                      \
            for (int64_t a = a0; a < a1; a++)                                  \
                for (int64_t b = b0; b < b1; b++) {                            \
                    const int64_t ci = a * nb + b, si = a + b * sst;           \
                    stmt;                                                      \
                }                                                              \
        }                                                                      \
    }
#if defined(__SSE2__)
    /* 4x4 blocks transposed in registers (x86-64's baseline SSE): the moves
     * are bit copies, so int32 words go the same way; the grads scale by f
     * as the scalar loops do */
    if (na % 4 == 0 && nb % 4 == 0 && mode != S_SCATTER_ADD) {
        const __m128 vf = _mm_set1_ps(f);
        for (int64_t a0 = 0; a0 < na; a0 += T) {
            const int64_t a1 = a0 + T < na ? a0 + T : na;
            for (int64_t b0 = 0; b0 < nb; b0 += T) {
                const int64_t b1 = b0 + T < nb ? b0 + T : nb;
                for (int64_t a = a0; a < a1; a += 4)
                    for (int64_t b = b0; b < b1; b += 4) {
                        float *cq = cf + a * nb + b, *sq = sf + a + b * sst;
                        __m128 r0, r1, r2, r3;
                        if (mode == S_GATHER || mode == S_GATHER_GRAD) {
                            r0 = _mm_loadu_ps(sq);
                            r1 = _mm_loadu_ps(sq + sst);
                            r2 = _mm_loadu_ps(sq + 2 * sst);
                            r3 = _mm_loadu_ps(sq + 3 * sst);
                        } else {
                            r0 = _mm_loadu_ps(cq);
                            r1 = _mm_loadu_ps(cq + nb);
                            r2 = _mm_loadu_ps(cq + 2 * nb);
                            r3 = _mm_loadu_ps(cq + 3 * nb);
                        }
                        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
                        float *dq = (mode == S_GATHER || mode == S_GATHER_GRAD) ? cq : sq;
                        const int64_t dl = (mode == S_GATHER || mode == S_GATHER_GRAD) ? nb : sst;
                        if (mode == S_GATHER_GRAD || mode == S_SCATTER_GRAD) {
                            r0 = _mm_mul_ps(r0, vf);
                            r1 = _mm_mul_ps(r1, vf);
                            r2 = _mm_mul_ps(r2, vf);
                            r3 = _mm_mul_ps(r3, vf);
                            if (acc) {
                                r0 = _mm_add_ps(_mm_loadu_ps(dq), r0);
                                r1 = _mm_add_ps(_mm_loadu_ps(dq + dl), r1);
                                r2 = _mm_add_ps(_mm_loadu_ps(dq + 2 * dl), r2);
                                r3 = _mm_add_ps(_mm_loadu_ps(dq + 3 * dl), r3);
                            }
                        }
                        _mm_storeu_ps(dq, r0);
                        _mm_storeu_ps(dq + dl, r1);
                        _mm_storeu_ps(dq + 2 * dl, r2);
                        _mm_storeu_ps(dq + 3 * dl, r3);
                    }
            }
        }
        return;
    }
#endif
    switch (mode) {
    case S_GATHER:
        S_TILES(cu[ci] = su[si]);
        break;
    case S_SCATTER:
        S_TILES(su[si] = cu[ci]);
        break;
    case S_GATHER_GRAD:
        if (acc)
            S_TILES(cf[ci] += f * sf[si])
        else
            S_TILES(cf[ci] = f * sf[si])
        break;
    case S_SCATTER_GRAD:
        if (acc)
            S_TILES(sf[si] += f * cf[ci])
        else
            S_TILES(sf[si] = f * cf[ci])
        break;
    default: /* S_SCATTER_ADD */
        S_TILES(sf[si] += f * cf[ci]);
        break;
    }
#undef S_TILES
}

/* A unit-stride run of a gradient walk: d = (acc ? d : 0) + f s, as the
 * strided loop, in loops GCC vectorises (its stride known); stored with
 * f exactly 1 (no gradient check's fault), a copy, whose -0s stay -0
 * where 0 + -0 made them +0. A concat's and a pad's backward, a
 * transpose's inner rows: as fast as their forward's memcpy (the
 * concat's backward was 2.4 times its forward, a loop on a runtime
 * stride). */
static void s_grad_run(float *restrict d, const float *restrict src, int64_t n, int acc,
                       float f) {
    if (!acc && f == 1.0f) {
        memcpy(d, src, (size_t)n * sizeof(float));
    } else if (acc) {
        for (int64_t e = 0; e < n; e++)
            d[e] += f * src[e];
    } else {
        for (int64_t e = 0; e < n; e++)
            d[e] = 0.0f + f * src[e];
    }
}

static void s_walk(const s_view_t *view, int mode, void *sp, void *cp, int acc, float f) {
    size_t total = 1;
    for (int q = 0; q < view->nd; q++)
        total *= (size_t)view->n[q];
    if (!total)
        return;
    /* merge dims the strided side also holds in row-major order (a
     * concat's or pad's [C,H,W] block, a slice's whole inner rows) and
     * drop size-1 dims: fewer, longer runs, and memcpy where they are
     * unit-stride */
    s_view_t m = *view;
    int nd = 0;
    for (int q = 0; q < view->nd; q++) {
        if (view->n[q] == 1)
            continue;
        if (nd > 0 && m.st[nd - 1] == view->st[q] * view->n[q]) {
            m.n[nd - 1] *= view->n[q];
            m.st[nd - 1] = view->st[q];
        } else {
            m.n[nd] = view->n[q];
            m.st[nd] = view->st[q];
            nd++;
        }
    }
    m.nd = nd;
    const s_view_t *v = &m;
    /* the inner two dims a transpose of each other (and long enough for the
     * tiles to pay): walk them as one 2-D block per step of the outer dims */
    if (nd >= 2 && m.st[nd - 2] == 1 && m.st[nd - 1] >= m.n[nd - 2] &&
        m.n[nd - 2] >= 8 && m.n[nd - 1] >= 8) {
        const int64_t na = m.n[nd - 2], nb = m.n[nd - 1], sst = m.st[nd - 1];
        int64_t idx[TP_MAX_DIMS] = {0}, off = v->base;
        size_t j = 0;
        for (;;) {
            s_tile2d(mode, sp, cp, na, nb, sst, off, j, acc, f);
            j += (size_t)(na * nb);
            if (!s_view_step(v, nd - 3, idx, &off))
                return;
        }
    }
    const int64_t in_n = nd ? v->n[nd - 1] : 1, in_st = nd ? v->st[nd - 1] : 0;
    int64_t idx[TP_MAX_DIMS] = {0}, off = v->base;
    size_t j = 0;
    uint32_t *su = sp, *cu = cp;
    float *sf = sp, *cf = cp;
    for (;;) {
        switch (mode) {
        case S_GATHER:
            if (in_st == 1)
                memcpy(cu + j, su + off, (size_t)in_n * 4);
            else
                for (int64_t e = 0; e < in_n; e++)
                    cu[j + (size_t)e] = su[off + e * in_st];
            break;
        case S_SCATTER:
            if (in_st == 1)
                memcpy(su + off, cu + j, (size_t)in_n * 4);
            else
                for (int64_t e = 0; e < in_n; e++)
                    su[off + e * in_st] = cu[j + (size_t)e];
            break;
        case S_GATHER_GRAD:
            if (in_st == 1)
                s_grad_run(cf + j, sf + off, in_n, acc, f);
            else
                for (int64_t e = 0; e < in_n; e++) {
                    float *d = cf + j + (size_t)e;
                    *d = (acc ? *d : 0.0f) + f * sf[off + e * in_st];
                }
            break;
        case S_SCATTER_GRAD:
            if (in_st == 1)
                s_grad_run(sf + off, cf + j, in_n, acc, f);
            else
                for (int64_t e = 0; e < in_n; e++) {
                    float *d = sf + off + e * in_st;
                    *d = (acc ? *d : 0.0f) + f * cf[j + (size_t)e];
                }
            break;
        default: /* S_SCATTER_ADD */
            for (int64_t e = 0; e < in_n; e++)
                sf[off + e * in_st] += f * cf[j + (size_t)e];
            break;
        }
        j += (size_t)in_n;
        if (!s_view_step(v, nd - 2, idx, &off))
            return;
    }
}

/* A walk cut along the view's outermost dim into ranges of the calling
 * thread's team (gpu/cpu/cpu_pool.h): part [lo, hi) is the same walk on
 * n[0] = hi - lo, its strided base moved lo st[0] and its contiguous
 * side lo times the inner count. Each element is still moved by exactly
 * one part, in the walk's order within it. A scatter-add whose outer dim
 * is stretched (st[0] 0: every part would add into the same items) stays
 * one walk. Parts of at least S_WALK_MIN words. */
#define S_WALK_MIN 16384

typedef struct {
    const s_view_t *v;
    int mode, acc;
    void *sp, *cp;
    float f;
    size_t inner; /* words of the contiguous side per index of dim 0 */
} s_walk_arg_t;

static void s_walk_part(void *arg, size_t lo, size_t hi) {
    const s_walk_arg_t *a = arg;
    s_view_t v = *a->v;
    v.n[0] = (int64_t)(hi - lo);
    v.base += (int64_t)lo * v.st[0];
    s_walk(&v, a->mode, a->sp, (uint32_t *)a->cp + lo * a->inner, a->acc, a->f);
}

static void s_walk_par(const s_view_t *v, int mode, void *sp, void *cp, int acc, float f) {
    if (v->nd < 1 || v->n[0] < 2 || (mode == S_SCATTER_ADD && v->st[0] == 0)) {
        s_walk(v, mode, sp, cp, acc, f);
        return;
    }
    size_t inner = 1;
    for (int q = 1; q < v->nd; q++)
        inner *= (size_t)v->n[q];
    s_walk_arg_t a = {v, mode, acc, sp, cp, f, inner};
    tp_cpu_parallel((size_t)v->n[0], 1, (S_WALK_MIN + inner - 1) / inner, s_walk_part, &a);
}

/* The view each op walks (see the banner); `k` the concat input. */
static void s_view(const tp_op_call_t *c, int k, int64_t concat_off, s_view_t *v) {
    const tp_op_attr_t *a = c->attr;
    const tp_shape_t *x = &c->xshape[k], *y = &c->yshape;
    int64_t xst[TP_MAX_DIMS], yst[TP_MAX_DIMS];
    s_strides(x, xst);
    s_strides(y, yst);
    memset(v, 0, sizeof *v);
    switch (c->kind) {
    case TP_OP_TRANSPOSE: /* contiguous y, strided x */
        v->nd = y->ndim;
        for (int i = 0; i < y->ndim; i++) {
            v->n[i] = y->d[i];
            v->st[i] = xst[a->dims_a[i]];
        }
        break;
    case TP_OP_SLICE: /* contiguous y, strided x */
        v->nd = y->ndim;
        for (int i = 0; i < y->ndim; i++) {
            v->n[i] = y->d[i];
            v->st[i] = xst[i] * a->dims_b[i];
            v->base += a->dims_a[i] * xst[i];
        }
        break;
    case TP_OP_BROADCAST_TO: /* contiguous y, strided x (0: stretched) */
        v->nd = y->ndim;
        for (int i = 0; i < y->ndim; i++) {
            const int ix = i - (y->ndim - x->ndim);
            v->n[i] = y->d[i];
            v->st[i] = ix >= 0 && x->d[ix] != 1 ? xst[ix] : 0;
        }
        break;
    case TP_OP_CONCAT: /* contiguous x_k, strided y */
        v->nd = x->ndim;
        for (int i = 0; i < x->ndim; i++) {
            v->n[i] = x->d[i];
            v->st[i] = yst[i];
        }
        v->base = concat_off * yst[a->axis];
        break;
    default: /* TP_OP_PAD: contiguous x, strided y */
        v->nd = x->ndim;
        for (int i = 0; i < x->ndim; i++) {
            v->n[i] = x->d[i];
            v->st[i] = yst[i];
            v->base += a->dims_a[i] * yst[i];
        }
        break;
    }
}

/* An index out of [0, bound): the node, the index, where, and the bound. */
static tp_status_t s_check_index(const tp_op_call_t *c, const int32_t *idx, size_t n,
                                 int64_t bound, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= bound)
            return tp_error(TP_ERR_INVALID, "node '%s': %s index %d (element %zu of "
                            "the indices) outside [0, %lld): %s %lld", c->name,
                            tp_op_name(c->kind), idx[i], i, (long long)bound, what,
                            (long long)bound);
    return TP_OK;
}

/* Gather's rows: forward, the output rows [lo, hi); backward, the table
 * rows [lo, hi): zeroed (unless acc), then every dy row whose index falls
 * there added in, in index order (so a row picked several times sums in
 * the same order whatever the cut). Parts of at least S_WALK_MIN words. */
typedef struct {
    const tp_op_call_t *c;
    size_t d, n;   /* words per row, indices */
    float f;
    uint8_t *seen; /* backward, stored gradient: a row written yet (one a table row) */
} s_gather_t;

/* Rows of the table copied out: an inline vector loop, not a memcpy a
 * row (a GPT's embedding rows are 128-1024 floats; the call was 40% of
 * the 4,096-row forward). Words, so float32 and int32 tables alike. */
TP_CPU_CLONES static void s_gather_fwd(void *arg, size_t lo, size_t hi) {
    const s_gather_t *g = arg;
    const int32_t *idx = g->c->x[1];
    const uint32_t *tab = g->c->x[0];
    uint32_t *y = g->c->y;
    const size_t d = g->d;
    for (size_t i = lo; i < hi; i++) {
        const uint32_t *restrict src = tab + (size_t)idx[i] * d;
        uint32_t *restrict dst = y + i * d;
        for (size_t e = 0; e < d; e++)
            dst[e] = src[e];
    }
}

/* The table's gradient over rows [lo, hi): each index's row of dy added
 * into its row, in index order. Stored (no accumulation), a row's first
 * index writes 0 + f dy (the bits of adding into a zeroed row) and only
 * the rows no index names are zeroed after: a table of 10,000 rows read
 * by 4,096 indices zeroes some 6,600 rows, not all 10,000 and then
 * reads back 3,400 (the embedding's backward was memory-bound on them). */
TP_CPU_CLONES static void s_gather_bwd(void *arg, size_t lo, size_t hi) {
    const s_gather_t *g = arg;
    const int32_t *idx = g->c->x[1];
    float *dx = g->c->dx[0];
    const size_t d = g->d;
    const float f = g->f;
    uint8_t *seen = g->seen;
    if (!seen && !g->c->dx_acc[0]) /* stored, without the memory for seen */
        memset(dx + lo * d, 0, (hi - lo) * d * sizeof(float));
    for (size_t i = 0; i < g->n; i++) {
        const size_t r = (size_t)idx[i];
        if (r < lo || r >= hi)
            continue;
        float *restrict row = dx + r * d;
        const float *restrict gy = g->c->dy + i * d;
        if (seen && !seen[r]) {
            seen[r] = 1;
            for (size_t e = 0; e < d; e++)
                row[e] = 0.0f + f * gy[e];
        } else {
            for (size_t e = 0; e < d; e++)
                row[e] += f * gy[e];
        }
    }
    if (seen)
        for (size_t r = lo; r < hi;) {
            size_t e = r;
            while (e < hi && !seen[e])
                e++;
            if (e > r)
                memset(dx + r * d, 0, (e - r) * d * sizeof(float));
            r = e + 1;
        }
}

tp_status_t tp_cpu_shape_forward(const tp_op_call_t *c) {
    s_view_t v;
    switch (c->kind) {
    case TP_OP_TRANSPOSE:
    case TP_OP_SLICE:
    case TP_OP_BROADCAST_TO:
        s_view(c, 0, 0, &v);
        s_walk_par(&v, S_GATHER, (void *)c->x[0], c->y, 0, 1.0f);
        return TP_OK;
    case TP_OP_CONCAT: {
        int64_t off = 0;
        for (int k = 0; k < c->ninputs; k++) {
            s_view(c, k, off, &v);
            s_walk_par(&v, S_SCATTER, c->y, (void *)c->x[k], 0, 1.0f);
            off += c->xshape[k].d[c->attr->axis];
        }
        return TP_OK;
    }
    case TP_OP_PAD: {
        const size_t ny = tp_shape_count(&c->yshape);
        const float value = c->attr->alpha;
        if (c->attr->in_dtype == TP_INT32) {
            int32_t *y = c->y;
            for (size_t i = 0; i < ny; i++)
                y[i] = (int32_t)value;
        } else {
            float *y = c->y;
            for (size_t i = 0; i < ny; i++)
                y[i] = value;
        }
        s_view(c, 0, 0, &v);
        s_walk_par(&v, S_SCATTER, c->y, (void *)c->x[0], 0, 1.0f);
        return TP_OK;
    }
    case TP_OP_GATHER: {
        const int64_t vrows = c->xshape[0].d[0];
        const size_t d = tp_shape_count(&c->xshape[0]) / (size_t)vrows;
        const size_t n = tp_shape_count(&c->xshape[1]);
        const int32_t *idx = c->x[1];
        TP_TRY(s_check_index(c, idx, n, vrows, "the table's rows V ="));
        s_gather_t g = {c, d, n, 1.0f, NULL};
        tp_cpu_parallel(n, 1, (S_WALK_MIN + d - 1) / d, s_gather_fwd, &g);
        return TP_OK;
    }
    case TP_OP_ONE_HOT: {
        const int64_t depth = c->yshape.d[c->yshape.ndim - 1];
        const size_t n = tp_shape_count(&c->xshape[0]);
        const int32_t *idx = c->x[0];
        TP_TRY(s_check_index(c, idx, n, depth, "depth"));
        float *y = c->y;
        memset(y, 0, n * (size_t)depth * sizeof(float));
        for (size_t i = 0; i < n; i++)
            y[i * (size_t)depth + (size_t)idx[i]] = 1.0f;
        return TP_OK;
    }
    default:
        return tp_error(TP_ERR_UNSUPPORTED, "%s: op %s is not of the shape family",
                        c->name, tp_op_name(c->kind));
    }
}

tp_status_t tp_cpu_shape_backward(const tp_op_call_t *c) {
    /* the gradient checks' deliberate fault (ops_elementwise.h; exactly 1
     * outside them) */
    const float f = tp_cpu_elementwise_grad_fault;
    float *dx = c->dx[0];
    const int acc = dx && c->dx_acc[0];
    s_view_t v;
    switch (c->kind) {
    case TP_OP_TRANSPOSE: /* a permutation: every dx element written once */
        if (!dx)
            return TP_OK;
        s_view(c, 0, 0, &v);
        s_walk_par(&v, S_SCATTER_GRAD, dx, (void *)c->dy, acc, f);
        return TP_OK;
    case TP_OP_SLICE:        /* elements outside the slice get 0 */
    case TP_OP_BROADCAST_TO: /* stretched dims sum */
        if (!dx)
            return TP_OK;
        if (!acc)
            memset(dx, 0, tp_shape_count(&c->xshape[0]) * sizeof(float));
        s_view(c, 0, 0, &v);
        s_walk_par(&v, S_SCATTER_ADD, dx, (void *)c->dy, 1, f);
        return TP_OK;
    case TP_OP_CONCAT: {
        int64_t off = 0;
        for (int k = 0; k < c->ninputs; k++) {
            if (c->dx[k]) {
                s_view(c, k, off, &v);
                s_walk_par(&v, S_GATHER_GRAD, (void *)c->dy, c->dx[k], c->dx_acc[k], f);
            }
            off += c->xshape[k].d[c->attr->axis];
        }
        return TP_OK;
    }
    case TP_OP_PAD: /* the padding's gradient goes nowhere */
        if (!dx)
            return TP_OK;
        s_view(c, 0, 0, &v);
        s_walk_par(&v, S_GATHER_GRAD, (void *)c->dy, dx, acc, f);
        return TP_OK;
    case TP_OP_GATHER: { /* rows of dy added into the rows they came from */
        if (!dx)
            return TP_OK;
        const int64_t vrows = c->xshape[0].d[0];
        const size_t d = tp_shape_count(&c->xshape[0]) / (size_t)vrows;
        const size_t n = tp_shape_count(&c->xshape[1]);
        /* stored: which rows an index wrote (without the memory, zeroed
         * whole first) */
        s_gather_t g = {c, d, n, f, c->dx_acc[0] ? NULL : calloc((size_t)vrows, 1)};
        tp_cpu_parallel((size_t)vrows, 1, (S_WALK_MIN + d - 1) / d, s_gather_bwd, &g);
        free(g.seen);
        return TP_OK;
    }
    case TP_OP_ONE_HOT: /* no gradient: the indices are integers */
        return TP_OK;
    default:
        return tp_error(TP_ERR_UNSUPPORTED, "%s: op %s is not of the shape family",
                        c->name, tp_op_name(c->kind));
    }
}
