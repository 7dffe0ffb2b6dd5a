/* towerpack gpu: batched matmul on the CPU (docs/ops.md, the linalg family).
 *
 * One OpenBLAS sgemm per output batch, each operand addressed through its
 * broadcast batch strides (0 along a dim it is stretched over). When b has
 * no batch of its own and a is not transposed, every batch shares b: the
 * batches of a then stack into one [B*M, K] matrix and the whole product,
 * and both gradients, are one sgemm each (the common x[B,T,K] @ W[K,N]).
 * A broadcast operand's gradient is the sum over the batches that read it:
 * its sgemms accumulate (beta 1) in batch order, after one clear when the
 * call overwrites, so the sums are deterministic.
 *
 * Where the backend has oneDNN, that common case (one [R,K] @ [K,N] after
 * stacking, neither operand transposed: a Transformer's linear layers)
 * runs as the dense layer's product does, on oneDNN's matmul
 * (dnnl_matmul.c): its brgemm kernels, and no pass that zeroes the output
 * before a product that overwrites it (OpenBLAS's sgemm with beta 0 does
 * one). A product of whole batches (neither operand broadcast: attention's
 * q k^T and p v when written out) runs there too, as one batched
 * primitive per product instead of one sgemm call per batch.
 *
 * Folds (gpu/graph/fold.c, issue 45): a bias b[N] added to every row of
 * y (c->bias; oneDNN's own bias on the dense path, one pass after the
 * product elsewhere) and a GELU after it (attr.act). The GELU's forward
 * writes the product (+ bias), its pre-activation z, into the act's room
 * at the start of the workspace (tp_act_room), kept to the backward, and
 * runs the gelu op's own kernel from there into y; the backward turns
 * dy into dz = dy gelu'(z) over z in place (the tanh GELU's sigmoid read
 * back from y, as the gelu op's backward does) and sums the bias gradient
 * in the same pass, then runs the products on dz. */
#include <cblas.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/dnnl_matmul.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_linalg.h"
#include "gpu/op_geometry.h"

/* The GELU's derivative vectorised and rounded as the gelu op's own
 * (ops_elementwise.c's pragma and cpu_math.h): the same bits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno", "fp-contract=off", "no-thread-jumps")
#endif
#include "gpu/cpu/cpu_math.h"


/* Offsets of a's and b's matrices in output batch o. */
static void s_offsets(const tp_bmm_geom_t *g, size_t o, size_t *oa, size_t *ob) {
    *oa = *ob = 0;
    for (int d = g->nd - 1; d >= 0; d--) {
        const size_t i = o % (size_t)g->od[d];
        o /= (size_t)g->od[d];
        *oa += i * g->sa[d];
        *ob += i * g->sb[d];
    }
}

/* Row-major C = alpha op(A) op(B) + beta C. */
static void s_gemm(int ta, int tb, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *b, int ldb, float beta,
                   float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
                beta, c, ldc);
}

/* b shared by every batch and a not transposed: the batches of a stack
 * into one matrix (the product is then one sgemm). */
static void s_stack(tp_bmm_geom_t *g, int ta) {
    if (!ta && g->nb == 1 && g->na == g->nbat && g->nbat > 1) {
        g->m *= (int)g->nbat;
        g->nbat = g->na = 1;
        g->nd = 0;
    }
}

/* The call as the dense layer's (TP_OP_MATMUL: x[R,K] @ W[K,N], no bias
 * (the forward sets d->bias to the folded one), no activation) into *d, its shapes in sh and attributes in attr, when
 * the product is one such matrix product after stacking; 0 otherwise
 * (and for the gradient checks' deliberate fault, which OpenBLAS's alpha
 * carries). */
static int s_as_dense(const tp_op_call_t *c, tp_op_call_t *d, tp_shape_t sh[2],
                      tp_op_attr_t *attr) {
    if (tp_bmm_trans_a(c) || tp_bmm_trans_b(c) || c->xshape[0].ndim < 2 ||
        c->xshape[1].ndim != 2 || tp_cpu_elementwise_grad_fault != 1.0f)
        return 0;
    tp_bmm_geom_t g;
    tp_bmm_geometry(c, &g);
    s_stack(&g, 0);
    if (g.nbat != 1 || g.na != 1 || g.nb != 1 || !g.m || !g.n || !g.k)
        return 0;
    *attr = *c->attr;
    attr->act = TP_ACT_NONE;
    sh[0] = (tp_shape_t){.ndim = 2, .d = {g.m, g.k}};
    sh[1] = (tp_shape_t){.ndim = 2, .d = {g.k, g.n}};
    *d = *c;
    d->kind = TP_OP_MATMUL;
    d->attr = attr;
    d->xshape = sh;
    d->yshape = (tp_shape_t){.ndim = 2, .d = {g.m, g.n}};
    d->bias = NULL;
    d->dbias = NULL;
    return 1;
}

/* The products of a call whose operands both have every batch (no
 * broadcast), after stacking (a b shared by every batch under a not
 * transposed: the GPT's logits x wte^T, b read transposed), as oneDNN's
 * batched products: p[0] the forward, p[1] dA's, p[2] dB's
 * (tp_dnnl_bmm_t; the gradients' acc unset); 0 when the call is not one
 * (or for the gradient checks' deliberate fault). The gradients are
 * ops_linalg's sgemms below, written as products of whole batches. */
static int s_as_batched(const tp_op_call_t *c, tp_dnnl_bmm_t p[3]) {
    if (c->xshape[0].ndim < 2 || c->xshape[1].ndim < 2 ||
        tp_cpu_elementwise_grad_fault != 1.0f)
        return 0;
    tp_bmm_geom_t g;
    tp_bmm_geometry(c, &g);
    const int ta = tp_bmm_trans_a(c), tb = tp_bmm_trans_b(c);
    s_stack(&g, ta);
    if (g.na != g.nbat || g.nb != g.nbat || !g.m || !g.n || !g.k || !g.nbat)
        return 0;
    const int64_t nb = (int64_t)g.nbat, m = g.m, n = g.n, k = g.k;
    p[0] = (tp_dnnl_bmm_t){nb, m, n, k, ta, tb, 0};
    /* dA [M,K] = dY op(B)^T, or stored [K,M] = op(B) dY^T */
    p[1] = !ta ? (tp_dnnl_bmm_t){nb, m, k, n, 0, !tb, 0}
               : (tp_dnnl_bmm_t){nb, k, m, n, tb, 1, 0};
    /* dB [K,N] = op(A)^T dY, or stored [N,K] = dY^T op(A) */
    p[2] = !tb ? (tp_dnnl_bmm_t){nb, k, n, m, !ta, 0, 0}
               : (tp_dnnl_bmm_t){nb, n, k, m, 1, ta, 0};
    return 1;
}

static tp_status_t s_backward_blas(const tp_op_call_t *c);

/* How a call's products run (the one dispatch the workspace, forward and
 * backward share): as the dense layer's (d, its shapes and attributes),
 * as oneDNN's batched products (p), or on OpenBLAS. */
enum { S_BLAS = 0, S_DENSE = 1, S_BATCHED = 2 };
typedef struct {
    int how;
    tp_op_call_t d;
    tp_shape_t sh[2];
    tp_op_attr_t attr;
    tp_dnnl_bmm_t p[3];
} s_route_t;

static int s_route(const tp_op_call_t *c, int dnnl, s_route_t *r) {
    r->how = !dnnl                                  ? S_BLAS
             : s_as_dense(c, &r->d, r->sh, &r->attr) ? S_DENSE
             : s_as_batched(c, r->p)                 ? S_BATCHED
                                                     : S_BLAS;
    return r->how;
}

/* y[rows, n] += bias[n] on every row: the folded bias where oneDNN's
 * primitive did not add it. */
static void s_add_bias(float *restrict y, size_t rows, size_t n, const float *restrict bias) {
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < n; j++)
            y[i * n + j] += bias[j];
}

/* the folded bias's width (y's last dim) and rows */
static void s_bias_dims(const tp_op_call_t *c, size_t *rows, size_t *n) {
    *n = c->yshape.ndim ? (size_t)c->yshape.d[c->yshape.ndim - 1] : 1;
    *rows = *n ? tp_shape_count(&c->yshape) / *n : 0;
}

size_t tp_cpu_batch_matmul_workspace(const tp_op_call_t *c, int dnnl) {
    s_route_t r;
    size_t most = 0;
    switch (s_route(c, dnnl, &r)) {
    case S_DENSE:
        r.d.bias = c->bias; /* the bias's primitive (its scratchpad may differ) */
        return tp_dnnl_matmul_workspace(&r.d);
    case S_BATCHED:
        for (int i = 0; i < 3; i++)
            for (int acc = 0; acc <= (i > 0); acc++) {
                r.p[i].acc = acc;
                const size_t w = tp_dnnl_bmm_workspace(c, &r.p[i]);
                most = w > most ? w : most;
            }
        return most;
    default:
        return 0;
    }
}

/* y = the product (+ the folded bias), act not applied: c's y and its
 * workspace are those the product writes and uses. */
static tp_status_t s_forward(const tp_op_call_t *c, int dnnl) {
    s_route_t r;
    int done = 0;
    switch (s_route(c, dnnl, &r)) {
    case S_DENSE:
        r.d.bias = c->bias; /* oneDNN adds it (dnnl_matmul.c) */
        TP_TRY(tp_dnnl_matmul_forward(&r.d, &done));
        if (done)
            return TP_OK;
        break;
    case S_BATCHED:
        TP_TRY(tp_dnnl_bmm(c, &r.p[0], c->x[0], c->x[1], c->y, &done));
        break;
    default:
        break;
    }
    tp_bmm_geom_t g;
    tp_bmm_geometry(c, &g);
    const int ta = tp_bmm_trans_a(c), tb = tp_bmm_trans_b(c);
    s_stack(&g, ta);
    const float *a = c->x[0], *b = c->x[1];
    float *y = c->y;
    const size_t my = (size_t)g.m * (size_t)g.n;
    if (!my || !g.nbat) /* nothing to write (and sgemm refuses a 0 leading dim) */
        return TP_OK;
    if (done) {
        /* oneDNN's batched product: only the bias is left */
    } else if (g.k == 0) { /* an empty sum: zeros, as torch (sgemm may leave y) */
        memset(y, 0, g.nbat * my * sizeof(float));
    } else {
        for (size_t o = 0; o < g.nbat; o++) {
            size_t oa, ob;
            s_offsets(&g, o, &oa, &ob);
            s_gemm(ta, tb, g.m, g.n, g.k, 1.0f, a + oa, ta ? g.m : g.k, b + ob,
                   tb ? g.k : g.n, 0.0f, y + o * my, g.n);
        }
    }
    if (c->bias) {
        size_t rows, n;
        s_bias_dims(c, &rows, &n);
        s_add_bias(y, rows, n, c->bias);
    }
    return TP_OK;
}

tp_status_t tp_cpu_batch_matmul_forward(const tp_op_call_t *c, int dnnl) {
    const int act = c->attr->act;
    if (act != TP_ACT_GELU && act != TP_ACT_GELU_TANH)
        return s_forward(c, dnnl);
    /* z (the pre-activation) into the act's room, kept for the backward;
     * y = gelu(z) by the gelu op's own kernel */
    tp_op_call_t in = tp_act_inner(c, NULL);
    in.y = c->workspace;
    TP_TRY(s_forward(&in, dnnl));
    const void *z[1] = {c->workspace};
    tp_op_call_t g = {0};
    g.kind = act == TP_ACT_GELU ? TP_OP_GELU : TP_OP_GELU_TANH;
    g.attr = c->attr;
    g.name = c->name;
    g.ninputs = 1;
    g.x = z;
    g.xshape = &c->yshape;
    g.y = c->y;
    g.yshape = c->yshape;
    g.node = c->node;
    return tp_cpu_elementwise_forward(&g);
}

/* The GELU's backward over columns [lo, hi) of every row: dz = dy
 * gelu'(z) written over z, and the bias gradient's column sums (rows in
 * order: the same bits whatever the cut) in the same pass; without a
 * GELU, the bias gradient's sums of dy alone. */
typedef struct {
    float *z;        /* [rows, n]: z in, dz out */
    const float *y;  /* [rows, n]: the forward's gelu(z) (the tanh's sigmoid from it) */
    const float *dy; /* [rows, n] */
    float *db;       /* [n] or NULL */
    size_t rows, n;
    int act, acc; /* act: TP_ACT_NONE (db alone), TP_ACT_GELU, _GELU_TANH */
} s_act_bwd_t;

/* One row's columns: dz over z in place (zd), and db += dz where db is
 * given; restrict on each, the one pointer zd both read and written.
 * GRAD: the derivative at column j (zd[j] before the write, yd[j]). */
#define S_GELU_ROW(GRAD)                                                       \
    do {                                                                       \
        if (db)                                                                \
            for (size_t j = 0; j < w; j++) {                                   \
                const float d = dy[j] * (GRAD);                                \
                zd[j] = d;                                                     \
                db[j] += d;                                                    \
            }                                                                  \
        else                                                                   \
            for (size_t j = 0; j < w; j++)                                     \
                zd[j] = dy[j] * (GRAD);                                        \
    } while (0)

TP_CPU_CLONES_FMA static void s_act_bwd_cols(void *arg, size_t lo, size_t hi) {
    const s_act_bwd_t *a = arg;
    const size_t w = hi - lo;
    float *restrict db = a->db ? a->db + lo : NULL; /* this part's columns */
    if (db && !a->acc)
        memset(db, 0, w * sizeof(float));
    for (size_t i = 0; i < a->rows; i++) {
        float *restrict zd = a->z ? a->z + i * a->n + lo : NULL; /* NULL: no GELU */
        const float *restrict dy = a->dy + i * a->n + lo;
        const float *restrict yd = a->y ? a->y + i * a->n + lo : NULL;
        if (a->act == TP_ACT_GELU)
            S_GELU_ROW(s_vgelu_grad_fma(zd[j]));
        else if (a->act == TP_ACT_GELU_TANH)
            S_GELU_ROW(s_vgelu_tanh_grad(zd[j], yd[j]));
        else
            for (size_t j = 0; j < w; j++)
                db[j] += dy[j];
    }
}
#undef S_GELU_ROW

/* The products' backward on dy (c->dy), the folded bias's gradient
 * already summed. */
static tp_status_t s_backward(const tp_op_call_t *c, int dnnl) {
    s_route_t r;
    int done = 0;
    switch (s_route(c, dnnl, &r)) {
    case S_DENSE:
        TP_TRY(tp_dnnl_matmul_backward(&r.d, &done));
        return done ? TP_OK : s_backward_blas(c);
    case S_BATCHED: {
        /* dA first, then dB, each whole: where one falls back the other
         * may still run on oneDNN (the two write different buffers; q = k
         * twice is two inputs of one node, whose second gradient adds) */
        const float *a = c->x[0], *b = c->x[1];
        int done_a = !c->dx[0], done_b = !c->dx[1];
        if (c->dx[0]) {
            r.p[1].acc = c->dx_acc && c->dx_acc[0];
            TP_TRY(tp_dnnl_bmm(c, &r.p[1], !tp_bmm_trans_a(c) ? c->dy : b,
                               !tp_bmm_trans_a(c) ? b : c->dy, c->dx[0], &done_a));
        }
        if (done_a && c->dx[1]) {
            r.p[2].acc = c->dx_acc && c->dx_acc[1];
            TP_TRY(tp_dnnl_bmm(c, &r.p[2], !tp_bmm_trans_b(c) ? a : c->dy,
                               !tp_bmm_trans_b(c) ? c->dy : a, c->dx[1], &done_b));
        }
        if (done_a && done_b)
            return TP_OK;
        if (done_a) { /* dB alone on OpenBLAS: the loop below, without dA */
            tp_op_call_t rest = *c;
            float *const dx[2] = {NULL, c->dx[1]};
            rest.dx = dx;
            return s_backward_blas(&rest);
        }
        return s_backward_blas(c);
    }
    default:
        return s_backward_blas(c);
    }
}

tp_status_t tp_cpu_batch_matmul_backward(const tp_op_call_t *c, int dnnl) {
    const int act = c->attr->act;
    const int gelu = act == TP_ACT_GELU || act == TP_ACT_GELU_TANH;
    size_t rows, n;
    s_bias_dims(c, &rows, &n);
    /* with a GELU, dz over z in the act's room and the bias's gradient
     * beside it; without, the bias's gradient alone; then the products
     * on dz (the workspace past the room) or dy */
    if (gelu || c->dbias) {
        s_act_bwd_t a = {gelu ? c->workspace : NULL, gelu ? c->y : NULL, c->dy, c->dbias,
                          rows, n, gelu ? act : TP_ACT_NONE, c->dbias_acc};
        /* a part of the columns is worth a thread past ~16k items */
        const size_t min_cols = rows ? (16384 + rows - 1) / rows : n;
        tp_cpu_parallel(n, 16, min_cols < 16 ? 16 : min_cols, s_act_bwd_cols, &a);
    }
    if (!gelu)
        return s_backward(c, dnnl);
    tp_op_call_t in = tp_act_inner(c, c->workspace);
    in.dbias = NULL;
    return s_backward(&in, dnnl);
}

/* The backward on OpenBLAS: one sgemm per batch and operand. */
static tp_status_t s_backward_blas(const tp_op_call_t *c) {
    tp_bmm_geom_t g;
    tp_bmm_geometry(c, &g);
    const int ta = tp_bmm_trans_a(c), tb = tp_bmm_trans_b(c);
    s_stack(&g, ta);
    const float *a = c->x[0], *b = c->x[1], *dy = c->dy;
    float *da = c->dx[0], *db = c->dx[1];
    const size_t my = (size_t)g.m * (size_t)g.n;
    const size_t ma = (size_t)g.m * (size_t)g.k, mb = (size_t)g.k * (size_t)g.n;
    /* the gradient checks' deliberate fault (ops_elementwise.h; 1 outside them) */
    const float alpha = tp_cpu_elementwise_grad_fault;
    /* a broadcast operand sums over batches: clear once, then add */
    const int sum_a = g.na < g.nbat, sum_b = g.nb < g.nbat;
    float beta_a = c->dx_acc && c->dx_acc[0] ? 1.0f : 0.0f;
    float beta_b = c->dx_acc && c->dx_acc[1] ? 1.0f : 0.0f;
    if (da && (sum_a || g.n == 0) && beta_a == 0.0f) {
        memset(da, 0, g.na * ma * sizeof(float));
        beta_a = 1.0f;
    }
    if (db && (sum_b || g.m == 0) && beta_b == 0.0f) {
        memset(db, 0, g.nb * mb * sizeof(float));
        beta_b = 1.0f;
    }
    for (size_t o = 0; o < g.nbat; o++) {
        size_t oa, ob;
        s_offsets(&g, o, &oa, &ob);
        const float *dyo = dy + o * my;
        if (da && ma && g.n) {
            if (!ta) /* dA[M,K] = dY op(B)^T */
                s_gemm(0, !tb, g.m, g.k, g.n, alpha, dyo, g.n, b + ob,
                       tb ? g.k : g.n, beta_a, da + oa, g.k);
            else /* dA[K,M] = op(B) dY^T */
                s_gemm(tb, 1, g.k, g.m, g.n, alpha, b + ob, tb ? g.k : g.n, dyo,
                       g.n, beta_a, da + oa, g.m);
        }
        if (db && mb && g.m) {
            if (!tb) /* dB[K,N] = op(A)^T dY */
                s_gemm(!ta, 0, g.k, g.n, g.m, alpha, a + oa, ta ? g.m : g.k, dyo,
                       g.n, beta_b, db + ob, g.n);
            else /* dB[N,K] = dY^T op(A) */
                s_gemm(1, ta, g.n, g.k, g.m, alpha, dyo, g.n, a + oa,
                       ta ? g.m : g.k, beta_b, db + ob, g.k);
        }
    }
    return TP_OK;
}
