/* towerpack gpu/cuda: the shape family's kernels (docs/ops.md).
 *
 * The host builds the CPU's views (gpu/cpu/ops_shape.c): a contiguous
 * tensor walked in row-major order against a strided view of another
 * buffer, with the same dims merged. A thread per contiguous element
 * finds its strided offset by dividing its index down the dims; forward
 * copies 4-byte words (float32 and int32 alike), backward moves gradients
 * back. Every gradient element is written by one thread, except two:
 *  - broadcast_to: one thread per input element sums its stretched
 *    positions of dy in the CPU's order (no atomics; the CPU's numbers);
 *  - gather: each table row has one owner. The indices are sorted with
 *    their positions (CUB's radix sort, stable: a row's positions stay in
 *    increasing order) in the op's workspace; the first thread of a row's
 *    run, one a column, adds that row's dy rows in the order of their
 *    positions onto the row (zeroed first unless accumulating): the CPU's
 *    order of additions, so its numbers to the bit, every run. (Until
 *    2026-11-28 atomicAdd summed a row picked many times in an order that
 *    varied from run to run; the sorted form is not yet run on a GPU.)
 * Gather and one-hot check indices on the device: a bad one takes a slot
 * of the stream's label checks (ops.cu), which the next sync reports
 * naming the node, the index (as "label"), its element and the bound. */
#include <string.h>
#include <cub/device/device_radix_sort.cuh>
#include "gpu/cuda/ops_shape.h"

#define SH_THREADS 256
#define SH_LAUNCHED() TP_CUDA_CHECK(cudaGetLastError())
#define SH_LOOP(i, n)                                                          \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);    \
         i += (size_t)gridDim.x * blockDim.x)

namespace {

struct sh_view {
    int nd;
    int64_t n[TP_MAX_DIMS];  /* the contiguous tensor's shape */
    int64_t st[TP_MAX_DIMS]; /* the strided buffer's step per dim */
    int64_t base;
};

void sh_strides(const tp_shape_t *s, int64_t *st) {
    int64_t m = 1;
    for (int i = s->ndim - 1; i >= 0; i--) {
        st[i] = m;
        m *= s->d[i];
    }
}

/* The CPU's views (ops_shape.c s_view), dims merged as its walk does. */
size_t sh_view_of(const tp_op_call_t *c, int k, int64_t concat_off, sh_view *out) {
    const tp_op_attr_t *a = c->attr;
    const tp_shape_t *x = &c->xshape[k], *y = &c->yshape;
    int64_t xst[TP_MAX_DIMS], yst[TP_MAX_DIMS];
    sh_strides(x, xst);
    sh_strides(y, yst);
    sh_view v;
    memset(&v, 0, sizeof v);
    switch (c->kind) {
    case TP_OP_TRANSPOSE:
        v.nd = y->ndim;
        for (int i = 0; i < y->ndim; i++) {
            v.n[i] = y->d[i];
            v.st[i] = xst[a->dims_a[i]];
        }
        break;
    case TP_OP_SLICE:
        v.nd = y->ndim;
        for (int i = 0; i < y->ndim; i++) {
            v.n[i] = y->d[i];
            v.st[i] = xst[i] * a->dims_b[i];
            v.base += a->dims_a[i] * xst[i];
        }
        break;
    case TP_OP_BROADCAST_TO:
        v.nd = y->ndim;
        for (int i = 0; i < y->ndim; i++) {
            const int ix = i - (y->ndim - x->ndim);
            v.n[i] = y->d[i];
            v.st[i] = ix >= 0 && x->d[ix] != 1 ? xst[ix] : 0;
        }
        break;
    case TP_OP_CONCAT:
        v.nd = x->ndim;
        for (int i = 0; i < x->ndim; i++) {
            v.n[i] = x->d[i];
            v.st[i] = yst[i];
        }
        v.base = concat_off * yst[a->axis];
        break;
    default: /* TP_OP_PAD */
        v.nd = x->ndim;
        for (int i = 0; i < x->ndim; i++) {
            v.n[i] = x->d[i];
            v.st[i] = yst[i];
            v.base += a->dims_a[i] * yst[i];
        }
        break;
    }
    size_t total = 1;
    for (int q = 0; q < v.nd; q++)
        total *= (size_t)v.n[q];
    memset(out, 0, sizeof *out);
    out->base = v.base;
    int nd = 0;
    for (int q = 0; q < v.nd; q++) {
        if (v.n[q] == 1)
            continue;
        if (nd > 0 && out->st[nd - 1] == v.st[q] * v.n[q]) {
            out->n[nd - 1] *= v.n[q];
            out->st[nd - 1] = v.st[q];
        } else {
            out->n[nd] = v.n[q];
            out->st[nd] = v.st[q];
            nd++;
        }
    }
    out->nd = nd;
    return total;
}

__device__ int64_t sh_off(const sh_view &v, size_t i) {
    int64_t off = v.base;
    for (int q = v.nd - 1; q >= 0; q--) {
        const int64_t n = v.n[q];
        off += (int64_t)(i % (size_t)n) * v.st[q];
        i /= (size_t)n;
    }
    return off;
}

enum { SH_GATHER, SH_SCATTER, SH_GATHER_GRAD, SH_SCATTER_GRAD, SH_SCATTER_ADD };

/* The CPU walk's modes (ops_shape.c), one element a thread. */
__global__ void k_walk(sh_view v, int mode, void *sp, void *cp, size_t total, int acc) {
    uint32_t *su = (uint32_t *)sp, *cu = (uint32_t *)cp;
    float *sf = (float *)sp, *cf = (float *)cp;
    SH_LOOP(i, total) {
        const int64_t off = sh_off(v, i);
        switch (mode) {
        case SH_GATHER: cu[i] = su[off]; break;
        case SH_SCATTER: su[off] = cu[i]; break;
        case SH_GATHER_GRAD: cf[i] = (acc ? cf[i] : 0.0f) + sf[off]; break;
        case SH_SCATTER_GRAD: sf[off] = (acc ? sf[off] : 0.0f) + cf[i]; break;
        default: sf[off] += cf[i]; break; /* positions unique (slice) */
        }
    }
}

__global__ void k_fill_word(uint32_t *y, uint32_t w, size_t n) {
    SH_LOOP(i, n) y[i] = w;
}

/* broadcast_to's gradient: per input element, the sum over its stretched
 * positions of dy in row-major order (the CPU's order). kept: the output
 * dims the input spans (their sizes and dy strides, in order); spread:
 * the stretched ones. */
struct sh_reduce {
    int nk, ns;
    int64_t kn[TP_MAX_DIMS], kst[TP_MAX_DIMS];
    int64_t sn[TP_MAX_DIMS], sst[TP_MAX_DIMS];
    size_t nspread;
};

__global__ void k_bcast_bwd(sh_reduce r, const float *dy, float *dx, size_t nx, int acc) {
    SH_LOOP(j, nx) {
        int64_t base = 0;
        size_t rem = j;
        for (int q = r.nk - 1; q >= 0; q--) {
            base += (int64_t)(rem % (size_t)r.kn[q]) * r.kst[q];
            rem /= (size_t)r.kn[q];
        }
        float s = acc ? dx[j] : 0.0f;
        for (size_t e = 0; e < r.nspread; e++) {
            int64_t off = base;
            size_t m = e;
            for (int q = r.ns - 1; q >= 0; q--) {
                off += (int64_t)(m % (size_t)r.sn[q]) * r.sst[q];
                m /= (size_t)r.sn[q];
            }
            s += dy[off];
        }
        dx[j] = s;
    }
}

/* A bad index's first sighting in a check slot: element + 1, the index
 * (ops.cu's flag_label layout). */
__device__ void sh_flag(int *checks, int slot, size_t at, int32_t id) {
    if (!checks)
        return;
    if (atomicCAS(&checks[2 * slot], 0, (int)at + 1) == 0)
        checks[2 * slot + 1] = id;
}

__global__ void k_gather_rows(const float *tab, const int32_t *idx, float *y, size_t n,
                              size_t d, int64_t rows, int *checks, int slot) {
    SH_LOOP(i, n * d) {
        const size_t r = i / d, e = i % d;
        const int32_t id = idx[r];
        if (id < 0 || id >= rows) {
            if (e == 0)
                sh_flag(checks, slot, r, id);
            y[i] = 0.0f;
            continue;
        }
        y[i] = tab[(size_t)id * d + e];
    }
}

__global__ void k_iota(int32_t *p, size_t n) {
    SH_LOOP(i, n) p[i] = (int32_t)i;
}

/* ids[n] sorted, pos[n] their positions in dy (increasing within a run of
 * one id): thread (j, e) with j the first of its id's run owns column e of
 * that row and adds the run's dy rows in order, as the CPU does. A bad id
 * (flagged by the forward) is skipped. */
__global__ void k_gather_rows_bwd(const float *dy, const int32_t *ids, const int32_t *pos,
                                  float *dtab, size_t n, size_t d, int64_t rows) {
    SH_LOOP(i, n * d) {
        const size_t j = i / d, e = i % d;
        const int32_t id = ids[j];
        if ((j > 0 && ids[j - 1] == id) || id < 0 || id >= rows)
            continue;
        float *t = &dtab[(size_t)id * d + e];
        float acc = *t;
        for (size_t q = j; q < n && ids[q] == id; q++)
            acc += dy[(size_t)pos[q] * d + e];
        *t = acc;
    }
}

size_t sh_round(size_t b) { return (b + 255) & ~(size_t)255; }

/* CUB's scratch for sorting n (id, position) pairs on all 32 bits. */
size_t sh_sort_temp(size_t n) {
    size_t t = 0;
    cub::DeviceRadixSort::SortPairs(NULL, t, (const int32_t *)NULL, (int32_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)n);
    return t;
}

__global__ void k_one_hot(const int32_t *idx, float *y, size_t n, int64_t depth,
                          int *checks, int slot) {
    SH_LOOP(i, n * (size_t)depth) {
        const size_t r = i / (size_t)depth;
        const int64_t j = (int64_t)(i % (size_t)depth);
        const int32_t id = idx[r];
        if ((id < 0 || id >= depth) && j == 0)
            sh_flag(checks, slot, r, id);
        y[i] = id == j ? 1.0f : 0.0f;
    }
}

/* A label-check slot for this call (ops.cu's s_check_slot): -1 when the
 * stream's slots are used up (the step then goes unchecked, as there). */
int sh_slot(tp_stream_t *s, const tp_op_call_t *c, int64_t bound) {
    if (s->nchecks >= TP_CUDA_MAX_CHECKS)
        return -1;
    const int slot = s->nchecks++;
    s->check_name[slot] = c->name;
    s->check_k[slot] = (int)bound;
    return slot;
}

tp_status_t sh_walk(tp_stream_t *s, const tp_op_call_t *c, int k, int64_t off, int mode,
                    void *sp, void *cp, int acc) {
    sh_view v;
    const size_t total = sh_view_of(c, k, off, &v);
    if (!total)
        return TP_OK;
    k_walk<<<tp_cuda_blocks(total, SH_THREADS), SH_THREADS, 0, s->cu>>>(v, mode, sp, cp,
                                                                        total, acc);
    SH_LAUNCHED();
    return TP_OK;
}

tp_status_t sh_bcast_bwd(tp_stream_t *s, const tp_op_call_t *c) {
    const tp_shape_t *x = &c->xshape[0], *y = &c->yshape;
    int64_t yst[TP_MAX_DIMS];
    sh_strides(y, yst);
    sh_reduce r;
    memset(&r, 0, sizeof r);
    r.nspread = 1;
    for (int i = 0; i < y->ndim; i++) {
        const int ix = i - (y->ndim - x->ndim);
        if (ix >= 0 && x->d[ix] != 1) {
            r.kn[r.nk] = y->d[i];
            r.kst[r.nk++] = yst[i];
        } else if (y->d[i] != 1) {
            r.sn[r.ns] = y->d[i];
            r.sst[r.ns++] = yst[i];
            r.nspread *= (size_t)y->d[i];
        }
    }
    const size_t nx = tp_shape_count(x);
    if (!nx)
        return TP_OK;
    if (!tp_shape_count(y)) { /* nothing to sum: zeros */
        if (!c->dx_acc[0])
            TP_CUDA_CHECK(cudaMemsetAsync(c->dx[0], 0, nx * sizeof(float), s->cu));
        return TP_OK;
    }
    k_bcast_bwd<<<tp_cuda_blocks(nx, SH_THREADS), SH_THREADS, 0, s->cu>>>(
        r, c->dy, c->dx[0], nx, c->dx_acc[0]);
    SH_LAUNCHED();
    return TP_OK;
}

} // namespace

int tp_cuda_shape_kind(tp_op_kind_t k) {
    return k == TP_OP_TRANSPOSE || k == TP_OP_SLICE || k == TP_OP_CONCAT ||
           k == TP_OP_PAD || k == TP_OP_BROADCAST_TO || k == TP_OP_GATHER ||
           k == TP_OP_ONE_HOT;
}

tp_status_t tp_cuda_shape_forward_host(tp_stream_t *s, const tp_op_call_t *c) {
    if (c->kind == TP_OP_GATHER)
        sh_slot(s, c, c->xshape[0].d[0]);
    else if (c->kind == TP_OP_ONE_HOT)
        sh_slot(s, c, c->yshape.d[c->yshape.ndim - 1]);
    return TP_OK;
}

tp_status_t tp_cuda_shape_forward(tp_stream_t *s, const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_TRANSPOSE:
    case TP_OP_SLICE:
    case TP_OP_BROADCAST_TO:
        return sh_walk(s, c, 0, 0, SH_GATHER, (void *)c->x[0], c->y, 0);
    case TP_OP_CONCAT: {
        int64_t off = 0;
        for (int k = 0; k < c->ninputs; k++) {
            TP_TRY(sh_walk(s, c, k, off, SH_SCATTER, c->y, (void *)c->x[k], 0));
            off += c->xshape[k].d[c->attr->axis];
        }
        return TP_OK;
    }
    case TP_OP_PAD: {
        const size_t ny = tp_shape_count(&c->yshape);
        uint32_t w;
        if (c->attr->in_dtype == TP_INT32) {
            const int32_t iv = (int32_t)c->attr->alpha;
            memcpy(&w, &iv, 4);
        } else {
            memcpy(&w, &c->attr->alpha, 4);
        }
        if (ny) {
            k_fill_word<<<tp_cuda_blocks(ny, SH_THREADS), SH_THREADS, 0, s->cu>>>(
                (uint32_t *)c->y, w, ny);
            SH_LAUNCHED();
        }
        return sh_walk(s, c, 0, 0, SH_SCATTER, c->y, (void *)c->x[0], 0);
    }
    case TP_OP_GATHER: {
        const int64_t rows = c->xshape[0].d[0];
        const size_t d = tp_shape_count(&c->xshape[0]) / (size_t)rows;
        const size_t n = tp_shape_count(&c->xshape[1]);
        const int slot = sh_slot(s, c, rows);
        if (!n || !d)
            return TP_OK;
        k_gather_rows<<<tp_cuda_blocks(n * d, SH_THREADS), SH_THREADS, 0, s->cu>>>(
            (const float *)c->x[0], (const int32_t *)c->x[1], (float *)c->y, n, d, rows,
            slot >= 0 ? s->checks : NULL, slot);
        SH_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_ONE_HOT: {
        const int64_t depth = c->yshape.d[c->yshape.ndim - 1];
        const size_t n = tp_shape_count(&c->xshape[0]);
        const int slot = sh_slot(s, c, depth);
        if (!n)
            return TP_OK;
        k_one_hot<<<tp_cuda_blocks(n * (size_t)depth, SH_THREADS), SH_THREADS, 0, s->cu>>>(
            (const int32_t *)c->x[0], (float *)c->y, n, depth,
            slot >= 0 ? s->checks : NULL, slot);
        SH_LAUNCHED();
        return TP_OK;
    }
    default:
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA forward for op %s", c->name,
                        tp_op_name(c->kind));
    }
}

tp_status_t tp_cuda_shape_backward(tp_stream_t *s, const tp_op_call_t *c) {
    float *dx = c->dx[0];
    const int acc = dx && c->dx_acc[0];
    switch (c->kind) {
    case TP_OP_TRANSPOSE:
        return dx ? sh_walk(s, c, 0, 0, SH_SCATTER_GRAD, dx, (void *)c->dy, acc) : TP_OK;
    case TP_OP_SLICE:
        if (!dx)
            return TP_OK;
        if (!acc && tp_shape_count(&c->xshape[0]))
            TP_CUDA_CHECK(cudaMemsetAsync(dx, 0, tp_shape_count(&c->xshape[0]) * sizeof(float),
                                          s->cu));
        return sh_walk(s, c, 0, 0, SH_SCATTER_ADD, dx, (void *)c->dy, 1);
    case TP_OP_BROADCAST_TO:
        return dx ? sh_bcast_bwd(s, c) : TP_OK;
    case TP_OP_CONCAT: {
        int64_t off = 0;
        for (int k = 0; k < c->ninputs; k++) {
            if (c->dx[k])
                TP_TRY(sh_walk(s, c, k, off, SH_GATHER_GRAD, (void *)c->dy, c->dx[k],
                               c->dx_acc[k]));
            off += c->xshape[k].d[c->attr->axis];
        }
        return TP_OK;
    }
    case TP_OP_PAD:
        return dx ? sh_walk(s, c, 0, 0, SH_GATHER_GRAD, (void *)c->dy, dx, acc) : TP_OK;
    case TP_OP_GATHER: {
        if (!dx)
            return TP_OK;
        const int64_t rows = c->xshape[0].d[0];
        const size_t d = tp_shape_count(&c->xshape[0]) / (size_t)rows;
        const size_t n = tp_shape_count(&c->xshape[1]);
        if (!acc)
            TP_CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)rows * d * sizeof(float), s->cu));
        if (!n || !d)
            return TP_OK;
        /* the workspace (tp_cuda_gather_workspace): sorted ids, positions,
         * sorted positions, CUB's scratch */
        const size_t a = sh_round(n * sizeof(int32_t));
        size_t temp = sh_sort_temp(n);
        if (!c->workspace || (c->workspace_bytes && c->workspace_bytes < 3 * a + temp))
            return tp_error(TP_ERR_INVALID, "%s: gather's gradient sorts %zu indices in "
                            "%zu bytes of workspace, has %zu", c->name, n, 3 * a + temp,
                            c->workspace ? c->workspace_bytes : (size_t)0);
        char *ws = (char *)c->workspace;
        int32_t *ids = (int32_t *)ws, *pos_in = (int32_t *)(ws + a),
                *pos = (int32_t *)(ws + 2 * a);
        k_iota<<<tp_cuda_blocks(n, SH_THREADS), SH_THREADS, 0, s->cu>>>(pos_in, n);
        SH_LAUNCHED();
        TP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
            ws + 3 * a, temp, (const int32_t *)c->x[1], ids, pos_in, pos, (int)n, 0, 32,
            s->cu));
        k_gather_rows_bwd<<<tp_cuda_blocks(n * d, SH_THREADS), SH_THREADS, 0, s->cu>>>(
            c->dy, ids, pos, dx, n, d, rows);
        SH_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_ONE_HOT:
        return TP_OK;
    default:
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA backward for op %s", c->name,
                        tp_op_name(c->kind));
    }
}

size_t tp_cuda_gather_workspace(const tp_op_call_t *c) {
    const size_t n = tp_shape_count(&c->xshape[1]);
    if (!n)
        return 0;
    return 3 * sh_round(n * sizeof(int32_t)) + sh_round(sh_sort_temp(n));
}
