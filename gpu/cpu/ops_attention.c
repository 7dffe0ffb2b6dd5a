/* towerpack gpu: fused attention on the CPU (docs/ops.md, TP_OP_ATTENTION).
 *
 * y = softmax(scale q k^T + mask) v for q [...,Tq,D], k and v [...,Tk,D],
 * one (batch, head) slice (an "item") at a time, the items spread over the
 * backend's pool (cpu_pool.h). Within an item the work goes in tiles of
 * S_BQ queries x S_BK keys, FlashAttention's way: the forward keeps each
 * query row's running max and sum (the online softmax) and rescales its
 * output row when the max grows, so no more than one row of a tile's
 * scores exists at a time; it saves only each row's log-sum-exp. The
 * backward (FlashAttention-2's) walks key tiles, recomputes each row's
 * probabilities from q, k and the saved log-sum-exp, and accumulates dV,
 * dK (into the key tile's rows) and dQ (into the query row) in a fixed
 * order. A causal mask is applied by not visiting the keys past the query
 * (key tiles past the diagonal are skipped whole).
 *
 * Determinism: every item is computed by one thread from its own inputs
 * in one fixed order, so the bits do not depend on the thread count. The
 * loops are written for GCC's vectoriser (inner loops over contiguous
 * keys of a transposed tile, or over D), compiled for AVX-512, AVX2 and
 * SSE2 and picked at load, without FMA contraction; measured faster here
 * than OpenBLAS sgemm on tiles this small (docs/performance.md). */
#include <math.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_attention.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno", "fp-contract=off")
#endif
#include "gpu/cpu/cpu_math.h"

/* As ops_elementwise.c: clones per ISA, not under the sanitizers (their
 * runtime is not up when the loader runs an ifunc's resolver). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define S_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define S_CLONES
#endif

/* queries x keys of a tile: a key tile transposed is D x S_BK floats (8
 * KiB at D 32), cache-resident while the query rows stream past it */
#define S_BQ 64
#define S_BK 64
/* a region of the workspace starts on 64 bytes */
#define S_ROUND(n) (((n) + 15) & ~(size_t)15)

typedef struct {
    const tp_op_call_t *c;
    size_t items;          /* the product of the leading dims */
    int64_t tq, tk, d;
    float scale;
    int causal;
    float *lse;            /* [items, Tq] log-sum-exp of each query row */
    float *dot;            /* [items, Tq] rowsum(dO * O) (backward) */
    float *scratch;        /* [items, per] tile scratch, per item */
    size_t per;
} s_geom_t;

/* an item's scratch: two transposed key tiles (k, v), two query x key
 * tiles (P, dS; the forward uses one row of P and the row statistics) */
static size_t s_per(int64_t d) {
    return S_ROUND((size_t)(2 * d * S_BK + 2 * S_BQ * S_BK + 2 * S_BQ));
}

static void s_geom(const tp_op_call_t *c, s_geom_t *g) {
    const tp_shape_t *qs = &c->xshape[0];
    const int r = qs->ndim;
    g->c = c;
    g->items = 1;
    for (int i = 0; i < r - 2; i++)
        g->items *= (size_t)qs->d[i];
    g->tq = qs->d[r - 2];
    g->tk = c->xshape[1].d[r - 2];
    g->d = qs->d[r - 1];
    g->scale = c->attr->alpha;
    g->causal = c->attr->beta != 0.0f;
    g->per = s_per(g->d);
    float *ws = c->workspace;
    const size_t rows = S_ROUND(g->items * (size_t)g->tq);
    g->lse = ws;
    g->dot = ws ? ws + rows : NULL;
    g->scratch = ws ? ws + 2 * rows : NULL;
}

size_t tp_cpu_attention_workspace(const tp_op_call_t *c) {
    s_geom_t g;
    s_geom(c, &g);
    return (2 * S_ROUND(g.items * (size_t)g.tq) + g.items * g.per) * sizeof(float);
}

/* kt[d][j] = k[j0 + j][d] for j < nk: a key tile with the keys contiguous. */
static inline void s_transpose(const float *restrict k, int64_t d, int64_t nk,
                               float *restrict kt) {
    for (int64_t j = 0; j < nk; j++)
        for (int64_t e = 0; e < d; e++)
            kt[e * S_BK + j] = k[j * d + e];
}

/* srow[j] = scale q . k_j for j < nk, from the transposed tile, 16 keys
 * at a time in registers; every element sums over D in the same order
 * (the tail's too), and the forward and the backward call this same code,
 * so the backward's probabilities are the forward's bit for bit. */
static inline void s_scores(const float *restrict q, const float *restrict kt, int64_t d,
                            int64_t nk, float scale, float *restrict srow) {
    int64_t j0 = 0;
    for (; j0 + 16 <= nk; j0 += 16) {
        float acc[16] = {0};
        for (int64_t e = 0; e < d; e++) {
            const float qe = q[e] * scale;
            const float *restrict kte = kt + e * S_BK + j0;
            for (int jj = 0; jj < 16; jj++)
                acc[jj] += qe * kte[jj];
        }
        for (int jj = 0; jj < 16; jj++)
            srow[j0 + jj] = acc[jj];
    }
    for (; j0 < nk; j0++) {
        float acc = 0.0f;
        for (int64_t e = 0; e < d; e++)
            acc += q[e] * scale * kt[e * S_BK + j0];
        srow[j0] = acc;
    }
}

/* out[e] += sum over j < n of c[j cs] rows[j d + e], for e < d: 16 columns
 * at a time in registers, j ascending for every element (the tail's too).
 * The P v, dS k, P^T dO and dS^T q products of a tile. */
static inline void s_rows_axpy(float *restrict out, const float *restrict c, int64_t cs,
                               const float *restrict rows, int64_t d, int64_t n) {
    int64_t e0 = 0;
    for (; e0 + 16 <= d; e0 += 16) {
        float acc[16];
        for (int ee = 0; ee < 16; ee++)
            acc[ee] = out[e0 + ee];
        for (int64_t j = 0; j < n; j++) {
            const float cj = c[j * cs];
            const float *restrict r = rows + j * d + e0;
            for (int ee = 0; ee < 16; ee++)
                acc[ee] += cj * r[ee];
        }
        for (int ee = 0; ee < 16; ee++)
            out[e0 + ee] = acc[ee];
    }
    for (; e0 < d; e0++) {
        float acc = out[e0];
        for (int64_t j = 0; j < n; j++)
            acc += c[j * cs] * rows[j * d + e0];
        out[e0] = acc;
    }
}

/* The keys query i sees in the tile at j0 of nk keys: all, or up to i. */
static inline int64_t s_visible(const s_geom_t *g, int64_t i, int64_t j0, int64_t nk) {
    if (!g->causal)
        return nk;
    const int64_t lim = i - j0 + 1;
    return lim < 0 ? 0 : lim < nk ? lim : nk;
}

S_CLONES static void s_forward_item(const s_geom_t *g, size_t it, float *scratch) {
    const tp_op_call_t *c = g->c;
    const int64_t tq = g->tq, tk = g->tk, d = g->d;
    const float *q = (const float *)c->x[0] + it * (size_t)(tq * d);
    const float *k = (const float *)c->x[1] + it * (size_t)(tk * d);
    const float *v = (const float *)c->x[2] + it * (size_t)(tk * d);
    float *o = (float *)c->y + it * (size_t)(tq * d);
    float *lse = g->lse + it * (size_t)tq;
    float *kt = scratch, *srow = kt + 2 * d * S_BK, *m = srow + 2 * S_BK, *l = m + S_BQ;
    for (int64_t i0 = 0; i0 < tq; i0 += S_BQ) {
        const int64_t nq = tq - i0 < S_BQ ? tq - i0 : S_BQ;
        for (int64_t r = 0; r < nq; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        memset(o + i0 * d, 0, (size_t)(nq * d) * sizeof(float));
        const int64_t kend = g->causal ? i0 + nq : tk;
        for (int64_t j0 = 0; j0 < kend; j0 += S_BK) {
            const int64_t nk = kend - j0 < S_BK ? kend - j0 : S_BK;
            s_transpose(k + j0 * d, d, nk, kt);
            for (int64_t r = 0; r < nq; r++) {
                const int64_t i = i0 + r, lim = s_visible(g, i, j0, nk);
                if (lim == 0)
                    continue;
                s_scores(q + i * d, kt, d, lim, g->scale, srow);
                float mx = m[r];
                for (int64_t j = 0; j < lim; j++)
                    mx = srow[j] > mx ? srow[j] : mx;
                /* the row's first visible tile: m was -inf, alpha 0 */
                const float alpha = s_vexp(m[r] - mx);
                for (int64_t j = 0; j < lim; j++)
                    srow[j] = s_vexp(srow[j] - mx);
                l[r] = l[r] * alpha + tp_cpu_sum8(srow, (size_t)lim);
                m[r] = mx;
                float *restrict orow = o + i * d;
                if (alpha != 1.0f)
                    for (int64_t e = 0; e < d; e++)
                        orow[e] *= alpha;
                s_rows_axpy(orow, srow, 1, v + j0 * d, d, lim);
            }
        }
        for (int64_t r = 0; r < nq; r++) {
            float *restrict orow = o + (i0 + r) * d;
            const float inv = 1.0f / l[r];
            for (int64_t e = 0; e < d; e++)
                orow[e] *= inv;
            lse[i0 + r] = m[r] + logf(l[r]);
        }
    }
}

static void s_forward_range(void *arg, size_t lo, size_t hi) {
    const s_geom_t *g = arg;
    /* the part's scratch: its first item's slot (parts never share one) */
    float *scratch = g->scratch + lo * g->per;
    for (size_t it = lo; it < hi; it++)
        s_forward_item(g, it, scratch);
}

tp_status_t tp_cpu_attention_forward(const tp_op_call_t *c) {
    s_geom_t g;
    s_geom(c, &g);
    if (!c->workspace || c->workspace_bytes < tp_cpu_attention_workspace(c))
        return tp_error(TP_ERR_INVALID, "attention '%s': workspace of %zu bytes, "
                        "needs %zu", c->name ? c->name : "?", c->workspace_bytes,
                        tp_cpu_attention_workspace(c));
    tp_cpu_parallel(g.items, 1, 1, s_forward_range, &g);
    return TP_OK;
}

S_CLONES static void s_backward_item(const s_geom_t *g, size_t it, float *scratch) {
    const tp_op_call_t *c = g->c;
    const int64_t tq = g->tq, tk = g->tk, d = g->d;
    const size_t oq = it * (size_t)(tq * d), ok = it * (size_t)(tk * d);
    const float *q = (const float *)c->x[0] + oq;
    const float *k = (const float *)c->x[1] + ok;
    const float *v = (const float *)c->x[2] + ok;
    const float *o = (const float *)c->y + oq, *dout = c->dy + oq;
    const float *lse = g->lse + it * (size_t)tq;
    float *dot = g->dot + it * (size_t)tq;
    float *dq = c->dx[0] ? c->dx[0] + oq : NULL;
    float *dk = c->dx[1] ? c->dx[1] + ok : NULL;
    float *dv = c->dx[2] ? c->dx[2] + ok : NULL;
    /* the key tile and v's, transposed; the query tile's P and dS */
    float *kt = scratch, *vt = kt + d * S_BK, *pt = vt + d * S_BK, *dst = pt + S_BQ * S_BK;
    /* every clear before any sum: two inputs may be one node (q = k), the
     * second then adding into the first's buffer */
    if (dq && !c->dx_acc[0])
        memset(dq, 0, (size_t)(tq * d) * sizeof(float));
    if (dk && !c->dx_acc[1])
        memset(dk, 0, (size_t)(tk * d) * sizeof(float));
    if (dv && !c->dx_acc[2])
        memset(dv, 0, (size_t)(tk * d) * sizeof(float));
    for (int64_t i = 0; i < tq; i++) {
        float acc = 0.0f;
        for (int64_t e = 0; e < d; e++)
            acc += dout[i * d + e] * o[i * d + e];
        dot[i] = acc;
    }
    const int need_ds = dq || dk;
    for (int64_t j0 = 0; j0 < tk; j0 += S_BK) {
        const int64_t nk = tk - j0 < S_BK ? tk - j0 : S_BK;
        s_transpose(k + j0 * d, d, nk, kt);
        if (need_ds)
            s_transpose(v + j0 * d, d, nk, vt);
        /* causal: the query tiles that reach this key tile */
        for (int64_t i0 = g->causal ? j0 / S_BQ * S_BQ : 0; i0 < tq; i0 += S_BQ) {
            const int64_t nq = tq - i0 < S_BQ ? tq - i0 : S_BQ;
            for (int64_t r = 0; r < nq; r++) {
                const int64_t i = i0 + r, lim = s_visible(g, i, j0, nk);
                if (lim == 0)
                    continue;
                float *restrict prow = pt + r * S_BK, *restrict dsrow = dst + r * S_BK;
                s_scores(q + i * d, kt, d, lim, g->scale, prow);
                const float li = lse[i];
                for (int64_t j = 0; j < lim; j++)
                    prow[j] = s_vexp(prow[j] - li);
                if (!need_ds)
                    continue;
                /* dP = dO v^T, then dS = P (dP - rowsum(dO O)) scale */
                s_scores(dout + i * d, vt, d, lim, 1.0f, dsrow);
                const float di = dot[i];
                for (int64_t j = 0; j < lim; j++)
                    dsrow[j] = prow[j] * (dsrow[j] - di) * g->scale;
                if (dq)
                    s_rows_axpy(dq + i * d, dsrow, 1, k + j0 * d, d, lim);
            }
            /* key j's column: the tile's rows that see it (causal: i >= j) */
            for (int64_t j = 0; j < nk; j++) {
                int64_t r0 = g->causal ? j0 + j - i0 : 0;
                r0 = r0 < 0 ? 0 : r0;
                if (r0 >= nq)
                    continue;
                if (dv)
                    s_rows_axpy(dv + (j0 + j) * d, pt + r0 * S_BK + j, S_BK,
                                dout + (i0 + r0) * d, d, nq - r0);
                if (dk)
                    s_rows_axpy(dk + (j0 + j) * d, dst + r0 * S_BK + j, S_BK,
                                q + (i0 + r0) * d, d, nq - r0);
            }
        }
    }
}

static void s_backward_range(void *arg, size_t lo, size_t hi) {
    const s_geom_t *g = arg;
    float *scratch = g->scratch + lo * g->per;
    for (size_t it = lo; it < hi; it++)
        s_backward_item(g, it, scratch);
}

tp_status_t tp_cpu_attention_backward(const tp_op_call_t *c) {
    s_geom_t g;
    s_geom(c, &g);
    if (!c->workspace || c->workspace_bytes < tp_cpu_attention_workspace(c))
        return tp_error(TP_ERR_INVALID, "attention '%s': workspace of %zu bytes, "
                        "needs %zu", c->name ? c->name : "?", c->workspace_bytes,
                        tp_cpu_attention_workspace(c));
    if (!c->dx[0] && !c->dx[1] && !c->dx[2])
        return TP_OK;
    tp_cpu_parallel(g.items, 1, 1, s_backward_range, &g);
    return TP_OK;
}
