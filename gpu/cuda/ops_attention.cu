/* towerpack gpu/cuda: fused attention (docs/ops.md, TP_OP_ATTENTION), a
 * straightforward kernel: one warp a query row (forward, dQ) or a key row
 * (dK, dV), the row's D values spread over the lanes in registers (D up to
 * 256), every dot product a fixed-order warp reduction. The forward is the
 * online softmax key by key (running max and sum, the output rescaled as
 * the max grows) and saves each row's log-sum-exp; the backward recomputes
 * the probabilities from it (FlashAttention-2's equations) in two kernels,
 * one over query rows for dQ and one over key rows for dK and dV, so no
 * atomics and deterministic sums. The [Tq,Tk] scores are never stored.
 * Not tuned (no shared-memory tiles, no tensor cores): a reference the
 * graph can run on the device; not yet run on a GPU (docs/cuda.md). The
 * packed form (attr heads > 0, tp_attention_qkv) reads each head's rows
 * where they lie in the one [...,T,3C] input and writes y [...,T,C] and
 * the gradient the same way (att_geom's strides), as the CPU's kernel. */
#include <math.h>
#include "gpu/cuda/ops_attention.h"

#define ATT_WARPS 4 /* warps (rows) per block */
#define TP_ATT_LAUNCHED() TP_CUDA_CHECK(cudaGetLastError())

namespace {

struct att_geom {
    size_t items;   /* the product of the leading dims (and the heads) */
    int tq, tk, d;
    float scale;
    int causal;
    /* item it is head it % nh of leading row it / nh; row i of its q (k,
     * v) at (it / nh) bq (bk) + (it % nh) d + i ld, of y and dy at
     * (it / nh) bo + (it % nh) d + i ldo. Three inputs: nh 1, ld = ldo = d. */
    int nh, ld, ldo;
    size_t bq, bk, bo;
};

att_geom geom(const tp_op_call_t *c) {
    const tp_shape_t *qs = &c->xshape[0];
    const int r = qs->ndim;
    att_geom g;
    g.items = 1;
    for (int i = 0; i < r - 2; i++)
        g.items *= (size_t)qs->d[i];
    g.tq = (int)qs->d[r - 2];
    if (c->attr->heads > 0) { /* one packed [...,T,3C] input */
        const int cw = (int)(qs->d[r - 1] / 3);
        g.nh = c->attr->heads;
        g.items *= (size_t)g.nh;
        g.tk = g.tq;
        g.d = cw / g.nh;
        g.ld = 3 * cw;
        g.ldo = cw;
        g.bq = g.bk = (size_t)g.tq * 3 * cw;
        g.bo = (size_t)g.tq * cw;
    } else {
        g.nh = 1;
        g.tk = (int)c->xshape[1].d[r - 2];
        g.d = (int)qs->d[r - 1];
        g.ld = g.ldo = g.d;
        g.bq = g.bo = (size_t)g.tq * g.d;
        g.bk = (size_t)g.tk * g.d;
    }
    g.scale = c->attr->alpha;
    g.causal = c->attr->beta != 0.0f;
    return g;
}

/* where row i of item it starts in a tensor of blk floats a leading row
 * and rows ld apart */
__device__ size_t at(const att_geom &g, size_t it, size_t blk, int i, int ld) {
    return it / (size_t)g.nh * blk + it % (size_t)g.nh * (size_t)g.d + (size_t)i * ld;
}

/* The warp's sum of v, every lane gets it, in one fixed order. */
__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* a row's lane-strided values: element lane + 32 e of the row */
template <int NPL>
__device__ void load_row(float (&r)[NPL], const float *p, int d) {
    for (int e = 0; e < NPL; e++) {
        const int i = threadIdx.x % 32 + 32 * e;
        r[e] = i < d ? p[i] : 0.0f;
    }
}

template <int NPL>
__device__ float dot_row(const float (&r)[NPL], const float *p, int d) {
    float s = 0.0f;
    for (int e = 0; e < NPL; e++) {
        const int i = threadIdx.x % 32 + 32 * e;
        s += i < d ? r[e] * p[i] : 0.0f;
    }
    return warp_sum(s);
}

/* The row of the calling warp (one warp a row, ATT_WARPS rows a block) among
 * g.items x `per_item` rows, its item and its index in the item; false
 * past the last row. */
__device__ bool warp_row(const att_geom &g, int per_item, size_t &row, size_t &it, int &at) {
    row = (size_t)blockIdx.x * ATT_WARPS + threadIdx.x / 32;
    if (row >= g.items * (size_t)per_item)
        return false;
    it = row / (size_t)per_item;
    at = (int)(row % (size_t)per_item);
    return true;
}

template <int NPL>
__device__ void zero_row(float (&r)[NPL]) {
    for (int e = 0; e < NPL; e++)
        r[e] = 0.0f;
}

/* r += b * the row at p (lane-strided, as load_row) */
template <int NPL>
__device__ void add_scaled_row(float (&r)[NPL], float b, const float *p, int d) {
    for (int e = 0; e < NPL; e++) {
        const int i = threadIdx.x % 32 + 32 * e;
        r[e] += i < d ? b * p[i] : 0.0f;
    }
}

/* The row at p = r * scale (store) or += r (add), the lanes' d values. */
template <int NPL>
__device__ void store_row(float *p, const float (&r)[NPL], float scale, int d) {
    for (int e = 0; e < NPL; e++) {
        const int i = threadIdx.x % 32 + 32 * e;
        if (i < d)
            p[i] = r[e] * scale;
    }
}

template <int NPL>
__device__ void add_row(float *p, const float (&r)[NPL], int d) {
    for (int e = 0; e < NPL; e++) {
        const int i = threadIdx.x % 32 + 32 * e;
        if (i < d)
            p[i] += r[e];
    }
}

/* One warp a query row: y, lse. */
template <int NPL>
__global__ void k_att_fwd(const float *q, const float *k, const float *v, float *y,
                          float *lse, att_geom g) {
    size_t row, it;
    int i;
    if (!warp_row(g, g.tq, row, it, i))
        return;
    const int d = g.d, ld = g.ld;
    const float *kb = k + at(g, it, g.bk, 0, ld), *vb = v + at(g, it, g.bk, 0, ld);
    float qr[NPL], acc[NPL];
    load_row(qr, q + at(g, it, g.bq, i, ld), d);
    zero_row(acc);
    float m = -INFINITY, l = 0.0f;
    const int kend = g.causal ? i + 1 : g.tk;
    for (int j = 0; j < kend; j++) {
        const float s = dot_row(qr, kb + (size_t)j * ld, d) * g.scale;
        const float mx = fmaxf(m, s);
        const float alpha = expf(m - mx), p = expf(s - mx);
        l = l * alpha + p;
        m = mx;
        for (int e = 0; e < NPL; e++) {
            const int c = threadIdx.x % 32 + 32 * e;
            acc[e] = acc[e] * alpha + (c < d ? p * vb[(size_t)j * ld + c] : 0.0f);
        }
    }
    store_row(y + at(g, it, g.bo, i, g.ldo), acc, 1.0f / l, d);
    if (threadIdx.x % 32 == 0)
        lse[row] = m + logf(l);
}

/* One warp a query row: dot = rowsum(dO * O), then dQ (added: the caller
 * cleared it when the call overwrites). */
template <int NPL>
__global__ void k_att_bwd_q(const float *q, const float *k, const float *v, const float *y,
                            const float *dy, const float *lse, float *dot, float *dq,
                            att_geom g) {
    size_t row, it;
    int i;
    if (!warp_row(g, g.tq, row, it, i))
        return;
    const int d = g.d, ld = g.ld;
    const float *kb = k + at(g, it, g.bk, 0, ld), *vb = v + at(g, it, g.bk, 0, ld);
    float dor[NPL], qr[NPL], acc[NPL];
    const size_t oo = at(g, it, g.bo, i, g.ldo), oq = at(g, it, g.bq, i, ld);
    load_row(dor, dy + oo, d);
    const float di = dot_row(dor, y + oo, d);
    if (threadIdx.x % 32 == 0)
        dot[row] = di;
    if (!dq)
        return;
    load_row(qr, q + oq, d);
    zero_row(acc);
    const float li = lse[row];
    const int kend = g.causal ? i + 1 : g.tk;
    for (int j = 0; j < kend; j++) {
        const float p = expf(dot_row(qr, kb + (size_t)j * ld, d) * g.scale - li);
        const float ds = p * (dot_row(dor, vb + (size_t)j * ld, d) - di) * g.scale;
        add_scaled_row(acc, ds, kb + (size_t)j * ld, d);
    }
    add_row(dq + oq, acc, d);
}

/* One warp a key row: dK and dV (added), over the queries that see it. */
template <int NPL>
__global__ void k_att_bwd_kv(const float *q, const float *k, const float *v, const float *dy,
                             const float *lse, const float *dot, float *dk, float *dv,
                             att_geom g) {
    size_t row, it;
    int j;
    if (!warp_row(g, g.tk, row, it, j))
        return;
    const int d = g.d, ld = g.ld;
    const size_t qrow0 = it * (size_t)g.tq, ok = at(g, it, g.bk, j, ld);
    float kr[NPL], vr[NPL], ak[NPL], av[NPL];
    load_row(kr, k + ok, d);
    load_row(vr, v + ok, d);
    zero_row(ak);
    zero_row(av);
    for (int i = g.causal ? j : 0; i < g.tq; i++) {
        const float *qi = q + at(g, it, g.bq, i, ld), *doi = dy + at(g, it, g.bo, i, g.ldo);
        const float p = expf(dot_row(kr, qi, d) * g.scale - lse[qrow0 + i]);
        const float ds = p * (dot_row(vr, doi, d) - dot[qrow0 + i]) * g.scale;
        add_scaled_row(av, p, doi, d);
        add_scaled_row(ak, ds, qi, d);
    }
    if (dk)
        add_row(dk + ok, ak, d);
    if (dv)
        add_row(dv + ok, av, d);
}

unsigned blocks(size_t rows) { return (unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS); }

/* D up to 256 in registers: NPL values a lane. */
int npl(int d) { return d <= 32 ? 1 : d <= 64 ? 2 : d <= 128 ? 4 : d <= 256 ? 8 : 0; }

/* q, k and v (and their gradients, NULL where not asked): three inputs,
 * or the packed one's three column blocks */
void operands(const tp_op_call_t *c, const att_geom &g, const float *x[3], float *dx[3]) {
    const int packed = c->attr->heads > 0;
    for (int i = 0; i < 3; i++) {
        const int j = packed ? 0 : i;
        const size_t off = packed ? (size_t)i * (size_t)g.ldo : 0; /* ldo: C */
        x[i] = (const float *)c->x[j] + off;
        dx[i] = c->dx && c->dx[j] ? c->dx[j] + off : NULL;
    }
}

template <int NPL>
void launch_fwd(tp_stream_t *s, const tp_op_call_t *c, const att_geom &g, float *lse) {
    const float *x[3];
    float *dx[3];
    operands(c, g, x, dx);
    k_att_fwd<NPL><<<blocks(g.items * g.tq), 32 * ATT_WARPS, 0, s->cu>>>(
        x[0], x[1], x[2], (float *)c->y, lse, g);
}

template <int NPL>
void launch_bwd(tp_stream_t *s, const tp_op_call_t *c, const att_geom &g, const float *lse,
                float *dot) {
    const float *x[3];
    float *dx[3];
    operands(c, g, x, dx);
    k_att_bwd_q<NPL><<<blocks(g.items * g.tq), 32 * ATT_WARPS, 0, s->cu>>>(
        x[0], x[1], x[2], (const float *)c->y, c->dy, lse, dot, dx[0], g);
    if (dx[1] || dx[2])
        k_att_bwd_kv<NPL><<<blocks(g.items * g.tk), 32 * ATT_WARPS, 0, s->cu>>>(
            x[0], x[1], x[2], c->dy, lse, dot, dx[1], dx[2], g);
}

tp_status_t check(const tp_op_call_t *c, const att_geom &g) {
    if (!npl(g.d))
        return tp_error(TP_ERR_UNSUPPORTED, "attention '%s': D %d on the GPU (at most 256 "
                        "a head)", c->name, g.d);
    if (g.items * (size_t)(g.tq > g.tk ? g.tq : g.tk) / ATT_WARPS > 0x7fffffffu)
        return tp_error(TP_ERR_UNSUPPORTED, "attention '%s': too many rows for one grid",
                        c->name);
    if (!c->workspace || (c->workspace_bytes &&
                          c->workspace_bytes < tp_cuda_attention_workspace(c)))
        return tp_error(TP_ERR_INVALID, "attention '%s': workspace of %zu bytes, needs %zu",
                        c->name, c->workspace_bytes, tp_cuda_attention_workspace(c));
    return TP_OK;
}

} // namespace

size_t tp_cuda_attention_workspace(const tp_op_call_t *c) {
    const att_geom g = geom(c);
    return 2 * g.items * (size_t)g.tq * sizeof(float);
}

tp_status_t tp_cuda_attention_forward(tp_stream_t *s, const tp_op_call_t *c) {
    const att_geom g = geom(c);
    if (!g.items || !g.tq)
        return TP_OK;
    TP_TRY(check(c, g));
    float *lse = (float *)c->workspace;
    switch (npl(g.d)) {
    case 1: launch_fwd<1>(s, c, g, lse); break;
    case 2: launch_fwd<2>(s, c, g, lse); break;
    case 4: launch_fwd<4>(s, c, g, lse); break;
    default: launch_fwd<8>(s, c, g, lse); break;
    }
    TP_ATT_LAUNCHED();
    return TP_OK;
}

tp_status_t tp_cuda_attention_backward(tp_stream_t *s, const tp_op_call_t *c) {
    const att_geom g = geom(c);
    const int nin = c->attr->heads > 0 ? 1 : 3;
    int asked = 0;
    for (int i = 0; i < nin; i++)
        asked |= c->dx[i] != NULL;
    if (!g.items || !g.tq || !asked)
        return TP_OK;
    TP_TRY(check(c, g));
    /* every clear first, then the kernels add: two inputs may be one node
     * (q = k), the second then adding into the first's buffer (the packed
     * input's gradient: the whole [...,T,3C]) */
    const size_t lead = g.items / (size_t)g.nh, nq = lead * g.bq, nk = lead * g.bk;
    for (int i = 0; i < nin; i++)
        if (c->dx[i] && !c->dx_acc[i])
            TP_CUDA_CHECK(cudaMemsetAsync(c->dx[i], 0, (i ? nk : nq) * sizeof(float), s->cu));
    float *lse = (float *)c->workspace, *dot = lse + g.items * (size_t)g.tq;
    switch (npl(g.d)) {
    case 1: launch_bwd<1>(s, c, g, lse, dot); break;
    case 2: launch_bwd<2>(s, c, g, lse, dot); break;
    case 4: launch_bwd<4>(s, c, g, lse, dot); break;
    default: launch_bwd<8>(s, c, g, lse, dot); break;
    }
    TP_ATT_LAUNCHED();
    return TP_OK;
}
