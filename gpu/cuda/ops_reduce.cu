/* towerpack gpu/cuda: the reduce family's kernels (docs/ops.md).
 *
 * Reductions over a set of axes see x as kept axes (the output's, row
 * major) and reduced axes, each with its input strides. When x's last axis
 * is reduced, a warp takes an output element and its lanes read
 * neighbouring elements (coalesced); otherwise a thread takes an output
 * element and neighbouring threads read neighbouring elements. Sums run in
 * double in a fixed order (no atomics): deterministic, and equal to the
 * CPU's double sums to rounding. Max keeps NaN, and its backward splits dy
 * evenly over the tied maxima (a count per output in the workspace).
 *
 * Softmax, log-softmax and argmax see x as [outer, n, inner]: with inner 1
 * a warp takes a row, else a thread takes a column of n strided elements
 * (neighbouring threads: neighbouring columns). The sequence cross-entropy
 * keeps each row's log-sum-exp and the counted labels in the workspace;
 * one block sums the loss in double (deterministic), and the backward is
 * one thread an element reading dy and the count from device memory, so a
 * recorded step replays it. Bad labels set the stream's check flags, which
 * its next sync reports as the CPU does. Every formula is the CPU's. */
#include <math.h>
#include <string.h>
#include "gpu/cuda/ops_reduce.h"

#define RED_THREADS 256
#define TP_RED_LAUNCHED() TP_CUDA_CHECK(cudaGetLastError())
#define FULL_MASK 0xffffffffu

namespace {

/* x's axes split into kept and reduced ones; by value as a kernel
 * argument. */
struct rmap {
    int nd, nk, nr;
    long long xdim[TP_MAX_DIMS], ost[TP_MAX_DIMS]; /* per axis: size, output stride (0 reduced) */
    long long kdim[TP_MAX_DIMS], kst[TP_MAX_DIMS]; /* kept axes: size, input stride */
    long long rdim[TP_MAX_DIMS], rst[TP_MAX_DIMS]; /* reduced axes: likewise */
    long long nx, nout, nred;
};

rmap s_rmap(const tp_shape_t *x, int axes) {
    rmap m;
    memset(&m, 0, sizeof m);
    m.nd = x->ndim;
    long long ist[TP_MAX_DIMS], st = 1, os = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        ist[d] = st;
        st *= x->d[d];
        m.xdim[d] = x->d[d];
        m.ost[d] = (axes & (1 << d)) ? 0 : os;
        if (!(axes & (1 << d)))
            os *= x->d[d];
    }
    m.nx = st;
    m.nout = os;
    m.nred = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (axes & (1 << d)) {
            m.rdim[m.nr] = x->d[d];
            m.rst[m.nr++] = ist[d];
            m.nred *= x->d[d];
        } else {
            m.kdim[m.nk] = x->d[d];
            m.kst[m.nk++] = ist[d];
        }
    }
    return m;
}

/* The input offset of the r-th element (row major) of axes dim/st. */
__device__ long long off_of(long long r, int n, const long long *dim, const long long *st) {
    long long off = 0;
    for (int k = n - 1; k >= 0; k--) {
        const long long q = r / dim[k];
        off += (r - q * dim[k]) * st[k];
        r = q;
    }
    return off;
}

/* max that keeps NaN, as the CPU's */
__device__ __forceinline__ float nan_max(float v, float e) { return (e > v || isnan(e)) ? e : v; }

/* One thread an output element: sum (times scale) or max. */
__global__ void k_reduce_thread(rmap m, int is_max, const float *x, float *y, double scale) {
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < m.nout;
         o += (long long)gridDim.x * blockDim.x) {
        const float *b = x + off_of(o, m.nk, m.kdim, m.kst);
        if (is_max) {
            float v = -INFINITY;
            for (long long r = 0; r < m.nred; r++)
                v = nan_max(v, b[off_of(r, m.nr, m.rdim, m.rst)]);
            y[o] = v;
        } else {
            double s = 0.0;
            for (long long r = 0; r < m.nred; r++)
                s += (double)b[off_of(r, m.nr, m.rdim, m.rst)];
            y[o] = (float)(s * scale);
        }
    }
}

/* One warp an output element (x's last axis reduced: lanes read
 * neighbours); a fixed shuffle tree combines the lanes. */
__global__ void k_reduce_warp(rmap m, int is_max, const float *x, float *y, double scale) {
    const unsigned lane = threadIdx.x & 31;
    const long long nw = (long long)gridDim.x * blockDim.x / 32;
    for (long long o = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; o < m.nout;
         o += nw) {
        const float *b = x + off_of(o, m.nk, m.kdim, m.kst);
        if (is_max) {
            float v = -INFINITY;
            for (long long r = lane; r < m.nred; r += 32)
                v = nan_max(v, b[off_of(r, m.nr, m.rdim, m.rst)]);
            for (int w = 16; w > 0; w >>= 1)
                v = nan_max(v, __shfl_xor_sync(FULL_MASK, v, w));
            if (lane == 0)
                y[o] = v;
        } else {
            double s = 0.0;
            for (long long r = lane; r < m.nred; r += 32)
                s += (double)b[off_of(r, m.nr, m.rdim, m.rst)];
            for (int w = 16; w > 0; w >>= 1)
                s += __shfl_xor_sync(FULL_MASK, s, w);
            if (lane == 0)
                y[o] = (float)(s * scale);
        }
    }
}

/* cnt[o] = how many elements equal the max y[o] */
__global__ void k_max_ties(rmap m, const float *x, const float *y, float *cnt) {
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < m.nout;
         o += (long long)gridDim.x * blockDim.x) {
        const float *b = x + off_of(o, m.nk, m.kdim, m.kst);
        float c = 0.0f;
        for (long long r = 0; r < m.nred; r++)
            c += (float)(b[off_of(r, m.nr, m.rdim, m.rst)] == y[o]);
        cnt[o] = c;
    }
}

/* One thread an input element: dy of its output, times scale (sum, mean)
 * or shared by the tied maxima (cnt non-NULL). */
__global__ void k_reduce_bwd(rmap m, const float *dy, float *dx, int acc, float scale,
                             const float *x, const float *y, const float *cnt) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < m.nx;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i, o = 0;
        for (int d = m.nd - 1; d >= 0; d--) {
            const long long q = r / m.xdim[d];
            o += (r - q * m.xdim[d]) * m.ost[d];
            r = q;
        }
        const float g = cnt ? (x[i] == y[o] ? dy[o] / cnt[o] : 0.0f) : dy[o] * scale;
        dx[i] = acc ? dx[i] + g : g;
    }
}

/* ---- along one axis: [outer, n, inner], rows = outer * inner --------------- */

template <int W> __device__ __forceinline__ float warp_max(float v) {
    for (int w = W / 2; w > 0; w >>= 1)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, w));
    return v;
}
template <int W> __device__ __forceinline__ float warp_sum(float v) {
    for (int w = W / 2; w > 0; w >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, w);
    return v;
}

/* W lanes a row (32: a warp, with inner 1; 1: a thread a column). The
 * grid-stride step is a multiple of 32, so a warp's lanes stay on one row. */
template <int W>
__global__ void k_softmax(const float *x, float *y, long long rows, long long n, long long inner,
                          int lg) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < rows * W;
         t += (long long)gridDim.x * blockDim.x) {
        const long long row = t / W, lane = t % W;
        const long long base = (row / inner) * n * inner + row % inner;
        const float *xr = x + base;
        float *yr = y + base;
        float mx = -INFINITY;
        for (long long j = lane; j < n; j += W)
            mx = fmaxf(mx, xr[j * inner]);
        mx = warp_max<W>(mx);
        float s = 0.0f;
        for (long long j = lane; j < n; j += W)
            s += expf(xr[j * inner] - mx);
        s = warp_sum<W>(s);
        if (lg) {
            const float l = mx + logf(s);
            for (long long j = lane; j < n; j += W)
                yr[j * inner] = xr[j * inner] - l;
        } else {
            const float is = 1.0f / s;
            for (long long j = lane; j < n; j += W)
                yr[j * inner] = expf(xr[j * inner] - mx) * is;
        }
    }
}

/* softmax: dx = y (dy - sum dy y); log-softmax: dx = dy - e^y sum dy */
template <int W>
__global__ void k_softmax_bwd(const float *y, const float *dy, float *dx, int acc,
                              long long rows, long long n, long long inner, int lg) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < rows * W;
         t += (long long)gridDim.x * blockDim.x) {
        const long long row = t / W, lane = t % W;
        const long long base = (row / inner) * n * inner + row % inner;
        float dot = 0.0f;
        for (long long j = lane; j < n; j += W) {
            const long long e = base + j * inner;
            dot += lg ? dy[e] : dy[e] * y[e];
        }
        dot = warp_sum<W>(dot);
        for (long long j = lane; j < n; j += W) {
            const long long e = base + j * inner;
            const float g = lg ? dy[e] - expf(y[e]) * dot : y[e] * (dy[e] - dot);
            dx[e] = acc ? dx[e] + g : g;
        }
    }
}

/* the first maximum along the axis; NaN is the maximum (torch.argmax) */
__global__ void k_argmax(const float *x, int32_t *y, long long rows, long long n,
                         long long inner) {
    for (long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x; row < rows;
         row += (long long)gridDim.x * blockDim.x) {
        const float *r = x + (row / inner) * n * inner + row % inner;
        long long best = 0;
        float bv = r[0];
        for (long long j = 1; j < n && !isnan(bv); j++) {
            const float v = r[j * inner];
            if (v > bv || isnan(v)) {
                bv = v;
                best = j;
            }
        }
        y[row] = (int32_t)best;
    }
}

/* ---- labels ------------------------------------------------------------------ */

/* Record the first bad label of a check slot: row + 1, then the label
 * (ops.cu's flag_label, which the stream's sync reads). */
__device__ void flag_bad(int *checks, int slot, long long row, int32_t l) {
    if (!checks)
        return;
    if (atomicCAS(&checks[2 * slot], 0, (int)row + 1) == 0)
        checks[2 * slot + 1] = l;
}

__device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = RED_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    return sh[0];
}

/* lse[r] = log sum_j e^x[r, j], a warp a row */
__global__ void k_row_lse(const float *x, float *lse, long long rows, long long v) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < rows * 32;
         t += (long long)gridDim.x * blockDim.x) {
        const long long row = t / 32, lane = t % 32;
        const float *xr = x + row * v;
        float mx = -INFINITY;
        for (long long j = lane; j < v; j += 32)
            mx = fmaxf(mx, xr[j]);
        mx = warp_max<32>(mx);
        float s = 0.0f;
        for (long long j = lane; j < v; j += 32)
            s += expf(xr[j] - mx);
        s = warp_sum<32>(s);
        if (lane == 0)
            lse[row] = mx + logf(s);
    }
}

/* One block: the mean of lse - x[label] over the counted labels, and
 * their count (for the backward). */
__global__ void k_xent_seq_loss(const float *x, const float *lse, const int32_t *lab,
                                long long rows, long long v, int32_t ignore, float *y,
                                float *count, int *checks, int slot) {
    __shared__ double sh[RED_THREADS];
    double s = 0.0, c = 0.0;
    for (long long r = threadIdx.x; r < rows; r += RED_THREADS) {
        const int32_t l = lab[r];
        if (l == ignore)
            continue;
        if (l < 0 || (long long)l >= v) {
            flag_bad(checks, slot, r, l);
            continue;
        }
        s += (double)lse[r] - (double)x[r * v + l];
        c += 1.0;
    }
    s = block_sum(s, sh);
    __syncthreads();
    c = block_sum(c, sh);
    if (threadIdx.x == 0) {
        *y = (float)(s / c); /* nothing counted: 0/0, NaN, as the CPU */
        *count = (float)c;
    }
}

__global__ void k_xent_seq_bwd(const float *x, const float *lse, const float *count,
                               const int32_t *lab, const float *dy, float *dx, int acc,
                               long long rows, long long v, int32_t ignore) {
    const float g = dy[0] / count[0];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < rows * v;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / v, j = i - r * v;
        const int32_t l = lab[r];
        float d = 0.0f;
        if (l != ignore && l >= 0 && (long long)l < v) {
            const float p = expf(x[i] - lse[r]);
            d = g * (j == l ? p - 1.0f : p);
        }
        dx[i] = acc ? dx[i] + d : d;
    }
}

/* One block: the fraction of rows with fewer than k logits above the
 * label's. */
__global__ void k_top_k(const float *x, const int32_t *lab, long long n, long long v,
                        long long k, float *y, int *checks, int slot) {
    __shared__ double sh[RED_THREADS];
    double hits = 0.0;
    for (long long r = threadIdx.x; r < n; r += RED_THREADS) {
        const int32_t l = lab[r];
        if (l < 0 || (long long)l >= v) {
            flag_bad(checks, slot, r, l);
            continue;
        }
        const float *row = x + r * v, at = row[l];
        long long above = 0;
        for (long long j = 0; j < v; j++)
            above += row[j] > at;
        hits += above < k;
    }
    hits = block_sum(hits, sh);
    if (threadIdx.x == 0)
        *y = (float)hits / (float)n;
}

/* [outer, n, inner] of x for the one axis of attr.axes */
void s_split(const tp_shape_t *x, int axes, long long *outer, long long *n, long long *inner) {
    *outer = *n = *inner = 1;
    int ax = 0;
    while (ax < x->ndim - 1 && !(axes & (1 << ax)))
        ax++;
    for (int d = 0; d < x->ndim; d++) {
        if (d < ax)
            *outer *= x->d[d];
        else if (d == ax)
            *n = x->d[d];
        else
            *inner *= x->d[d];
    }
}

/* A check slot of the stream's pending label checks (ops.cu's
 * s_check_slot: the same counter, so a replay takes the same slots). */
int s_slot(tp_stream_t *s, const tp_op_call_t *c, long long v) {
    if (s->nchecks >= TP_CUDA_MAX_CHECKS)
        return -1; /* more label ops than slots between two syncs: unchecked */
    const int slot = s->nchecks++;
    s->check_name[slot] = c->name;
    s->check_k[slot] = (int)v;
    return slot;
}

/* rows and V of logits [..., V] */
void s_rows(const tp_op_call_t *c, long long *rows, long long *v) {
    const tp_shape_t *s = &c->xshape[0];
    *v = s->d[s->ndim - 1];
    *rows = *v ? (long long)tp_shape_count(s) / *v : 0;
}

tp_status_t s_label_shapes(const tp_op_call_t *c, long long rows) {
    if ((long long)tp_shape_count(&c->xshape[1]) != rows)
        return tp_error(TP_ERR_SHAPE, "%s: %lld rows of logits but %zu labels", c->name, rows,
                        tp_shape_count(&c->xshape[1]));
    return TP_OK;
}

unsigned s_blocks(long long n) { return tp_cuda_blocks(n > 0 ? (size_t)n : 1, RED_THREADS); }

} // namespace

int tp_cuda_reduce_kind(tp_op_kind_t k) {
    return k == TP_OP_REDUCE_SUM || k == TP_OP_REDUCE_MEAN || k == TP_OP_REDUCE_MAX ||
           k == TP_OP_ARGMAX || k == TP_OP_SOFTMAX || k == TP_OP_LOG_SOFTMAX ||
           k == TP_OP_SOFTMAX_XENT_SEQ || k == TP_OP_TOP_K_ACCURACY;
}

size_t tp_cuda_reduce_workspace(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_REDUCE_MAX: /* the tie counts */
        return tp_shape_count(&c->yshape) * sizeof(float);
    case TP_OP_SOFTMAX_XENT_SEQ: { /* each row's log-sum-exp, the count */
        long long rows, v;
        s_rows(c, &rows, &v);
        return ((size_t)rows + 1) * sizeof(float);
    }
    default:
        return 0;
    }
}

tp_status_t tp_cuda_reduce_forward_host(tp_stream_t *s, const tp_op_call_t *c) {
    if (c->kind == TP_OP_SOFTMAX_XENT_SEQ || c->kind == TP_OP_TOP_K_ACCURACY) {
        long long rows, v;
        s_rows(c, &rows, &v);
        TP_TRY(s_label_shapes(c, rows));
        s_slot(s, c, v);
    }
    return TP_OK;
}

tp_status_t tp_cuda_reduce_forward(tp_stream_t *s, const tp_op_call_t *c) {
    const float *x = (const float *)c->x[0];
    switch (c->kind) {
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX: {
        const rmap m = s_rmap(&c->xshape[0], c->attr->axes);
        if (m.nout == 0)
            return TP_OK;
        const int is_max = c->kind == TP_OP_REDUCE_MAX;
        /* the mean of no elements is NaN (0/0), as the CPU's */
        const double per = (double)m.nx / (double)m.nout;
        const double scale = c->kind == TP_OP_REDUCE_MEAN ? 1.0 / per : 1.0;
        const int last = c->xshape[0].ndim > 0 && (c->attr->axes & (1 << (c->xshape[0].ndim - 1)));
        if (last)
            k_reduce_warp<<<s_blocks(m.nout * 32), RED_THREADS, 0, s->cu>>>(m, is_max, x,
                                                                             (float *)c->y, scale);
        else
            k_reduce_thread<<<s_blocks(m.nout), RED_THREADS, 0, s->cu>>>(m, is_max, x,
                                                                          (float *)c->y, scale);
        TP_RED_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_ARGMAX: {
        long long outer, n, inner;
        s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
        if (outer * inner == 0)
            return TP_OK;
        k_argmax<<<s_blocks(outer * inner), RED_THREADS, 0, s->cu>>>(x, (int32_t *)c->y,
                                                                      outer * inner, n, inner);
        TP_RED_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX: {
        long long outer, n, inner;
        s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
        const long long rows = outer * inner;
        const int lg = c->kind == TP_OP_LOG_SOFTMAX;
        if (rows == 0)
            return TP_OK;
        if (inner == 1)
            k_softmax<32><<<s_blocks(rows * 32), RED_THREADS, 0, s->cu>>>(x, (float *)c->y, rows,
                                                                          n, inner, lg);
        else
            k_softmax<1><<<s_blocks(rows), RED_THREADS, 0, s->cu>>>(x, (float *)c->y, rows, n,
                                                                    inner, lg);
        TP_RED_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_SOFTMAX_XENT_SEQ: {
        long long rows, v;
        s_rows(c, &rows, &v);
        TP_TRY(s_label_shapes(c, rows));
        float *lse = (float *)c->workspace;
        if (rows > 0) {
            k_row_lse<<<s_blocks(rows * 32), RED_THREADS, 0, s->cu>>>(x, lse, rows, v);
            TP_RED_LAUNCHED();
        }
        const int slot = s_slot(s, c, v);
        k_xent_seq_loss<<<1, RED_THREADS, 0, s->cu>>>(
            x, lse, (const int32_t *)c->x[1], rows, v, (int32_t)c->attr->alpha, (float *)c->y,
            lse + rows, slot >= 0 ? s->checks : NULL, slot);
        TP_RED_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_TOP_K_ACCURACY: {
        long long rows, v;
        s_rows(c, &rows, &v);
        TP_TRY(s_label_shapes(c, rows));
        const int slot = s_slot(s, c, v);
        k_top_k<<<1, RED_THREADS, 0, s->cu>>>(x, (const int32_t *)c->x[1], rows, v,
                                              (long long)c->attr->alpha, (float *)c->y,
                                              slot >= 0 ? s->checks : NULL, slot);
        TP_RED_LAUNCHED();
        return TP_OK;
    }
    default:
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA forward for op %s", c->name,
                        tp_op_name(c->kind));
    }
}

tp_status_t tp_cuda_reduce_backward(tp_stream_t *s, const tp_op_call_t *c) {
    float *dx = c->dx[0];
    const int acc = dx ? c->dx_acc[0] : 0;
    switch (c->kind) {
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX: {
        const rmap m = s_rmap(&c->xshape[0], c->attr->axes);
        if (!dx || m.nx == 0)
            return TP_OK;
        const float *x = (const float *)c->x[0], *y = (const float *)c->y;
        float *cnt = NULL;
        float scale = 1.0f;
        if (c->kind == TP_OP_REDUCE_MAX) {
            cnt = (float *)c->workspace;
            k_max_ties<<<s_blocks(m.nout), RED_THREADS, 0, s->cu>>>(m, x, y, cnt);
            TP_RED_LAUNCHED();
        } else if (c->kind == TP_OP_REDUCE_MEAN) {
            scale = (float)(1.0 / ((double)m.nx / (double)m.nout));
        }
        k_reduce_bwd<<<s_blocks(m.nx), RED_THREADS, 0, s->cu>>>(m, c->dy, dx, acc, scale, x, y,
                                                                 cnt);
        TP_RED_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX: {
        long long outer, n, inner;
        s_split(&c->xshape[0], c->attr->axes, &outer, &n, &inner);
        const long long rows = outer * inner;
        const int lg = c->kind == TP_OP_LOG_SOFTMAX;
        if (!dx || rows == 0)
            return TP_OK;
        const float *y = (const float *)c->y;
        if (inner == 1)
            k_softmax_bwd<32><<<s_blocks(rows * 32), RED_THREADS, 0, s->cu>>>(
                y, c->dy, dx, acc, rows, n, inner, lg);
        else
            k_softmax_bwd<1><<<s_blocks(rows), RED_THREADS, 0, s->cu>>>(y, c->dy, dx, acc, rows,
                                                                        n, inner, lg);
        TP_RED_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_SOFTMAX_XENT_SEQ: {
        long long rows, v;
        s_rows(c, &rows, &v);
        if (!dx || rows * v == 0)
            return TP_OK;
        const float *lse = (const float *)c->workspace;
        k_xent_seq_bwd<<<s_blocks(rows * v), RED_THREADS, 0, s->cu>>>(
            (const float *)c->x[0], lse, lse + rows, (const int32_t *)c->x[1], c->dy, dx, acc,
            rows, v, (int32_t)c->attr->alpha);
        TP_RED_LAUNCHED();
        return TP_OK;
    }
    default: /* argmax, top-k accuracy: no gradient */
        return TP_OK;
    }
}
