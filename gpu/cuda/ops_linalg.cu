/* towerpack gpu/cuda: batched matmul on cuBLAS (docs/ops.md, the linalg
 * family).
 *
 * The batch geometry is the CPU's (gpu/cpu/ops_linalg.c): when b is shared
 * by every batch and a is not transposed, a's batches stack into one
 * [B*M, K] matrix and each pass is one GEMM. Otherwise, when each operand
 * either has every batch or is shared by all (the strides are then
 * uniform), a pass is one cublasSgemmStridedBatched (stride 0 for a shared
 * operand); stretched dims of both sides at once fall back to one GEMM per
 * batch. A shared operand's gradient sums over the batches: its GEMMs run
 * one after another on the stream adding into it (beta 1, after one clear
 * when the call overwrites), in batch order, so the sum is deterministic.
 * The products follow the stream's math like every other product
 * (tp_cuda_sgemm: fp32, TF32 by the handle's mode, or bf16 tensor
 * cores). */
#include <string.h>
#include "gpu/cuda/ops_linalg.h"
#include "gpu/op_geometry.h"

namespace {

typedef tp_bmm_geom_t bm_geom;

/* The shared geometry (gpu/op_geometry.h), then a stack of a's batches
 * against one b as one product. */
void bm_geometry(const tp_op_call_t *c, bm_geom *g) {
    tp_bmm_geometry(c, g);
    const int ta = tp_bmm_trans_a(c);
    if (!ta && g->nb == 1 && g->na == g->nbat && g->nbat > 1) { /* stack */
        g->m *= (int)g->nbat;
        g->nbat = g->na = 1;
        g->nd = 0;
    }
}

void bm_offsets(const bm_geom *g, size_t o, size_t *oa, size_t *ob) {
    *oa = *ob = 0;
    for (int d = g->nd - 1; d >= 0; d--) {
        const size_t i = o % (size_t)g->od[d];
        o /= (size_t)g->od[d];
        *oa += i * g->sa[d];
        *ob += i * g->sb[d];
    }
}

/* Row-major C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, the
 * matrices `sa`, `sb`, `sc` floats apart (column-major with the operands
 * swapped, as tp_cuda_sgemm). */
tp_status_t bm_gemm(tp_stream_t *st, int ta, int tb, int m, int n, int k,
                    float alpha, const float *a, int lda, long long sa,
                    const float *b, int ldb, long long sb, float beta, float *c,
                    int ldc, long long sc, int count) {
    if (count == 1) {
        TP_CUDA_CHECK(tp_cuda_sgemm(st, ta, tb, m, n, k, &alpha, a, lda, b, ldb,
                                    &beta, c, ldc));
        return TP_OK;
    }
    const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!st->bf16) {
        TP_CUDA_CHECK(cublasSgemmStridedBatched(st->blas, ob, oa, n, m, k, &alpha, b,
                                                ldb, sb, a, lda, sa, &beta, c, ldc,
                                                sc, count));
    } else {
        TP_CUDA_CHECK(cublasGemmStridedBatchedEx(
            st->blas, ob, oa, n, m, k, &alpha, b, CUDA_R_32F, ldb, sb, a, CUDA_R_32F,
            lda, sa, &beta, c, CUDA_R_32F, ldc, sc, count,
            CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    }
    return TP_OK;
}

/* Each operand's stride when both are uniform over the batches (every
 * batch its own, or one shared by all); 0 when they are not. */
int bm_uniform(const bm_geom *g, size_t ma, size_t mb, long long *sa, long long *sb) {
    if ((g->na != g->nbat && g->na != 1) || (g->nb != g->nbat && g->nb != 1))
        return 0;
    *sa = g->na == 1 ? 0 : (long long)ma;
    *sb = g->nb == 1 ? 0 : (long long)mb;
    return 1;
}

} // namespace

tp_status_t tp_cuda_batch_matmul_forward(tp_stream_t *s, const tp_op_call_t *c) {
    bm_geom g;
    bm_geometry(c, &g);
    const int ta = tp_bmm_trans_a(c), tb = tp_bmm_trans_b(c);
    const float *a = (const float *)c->x[0], *b = (const float *)c->x[1];
    float *y = (float *)c->y;
    const size_t my = (size_t)g.m * g.n, ma = (size_t)g.m * g.k, mb = (size_t)g.k * g.n;
    if (!g.nbat || !my)
        return TP_OK;
    if (g.k == 0) { /* an empty sum: zeros */
        TP_CUDA_CHECK(cudaMemsetAsync(y, 0, g.nbat * my * sizeof(float), s->cu));
        return TP_OK;
    }
    const int lda = ta ? g.m : g.k, ldb = tb ? g.k : g.n;
    long long sa, sb;
    if (bm_uniform(&g, ma, mb, &sa, &sb))
        return bm_gemm(s, ta, tb, g.m, g.n, g.k, 1.0f, a, lda, sa, b, ldb, sb, 0.0f, y,
                       g.n, (long long)my, (int)g.nbat);
    for (size_t o = 0; o < g.nbat; o++) {
        size_t oa, ob;
        bm_offsets(&g, o, &oa, &ob);
        TP_TRY(bm_gemm(s, ta, tb, g.m, g.n, g.k, 1.0f, a + oa, lda, 0, b + ob, ldb, 0,
                       0.0f, y + o * my, g.n, 0, 1));
    }
    return TP_OK;
}

/* One operand's gradient pass: every batch its own (one strided call), or
 * summed into a shared operand one GEMM at a time. which 0: dA, 1: dB. */
static tp_status_t bm_grad(tp_stream_t *s, const tp_op_call_t *c, const bm_geom *g,
                           int which) {
    const int ta = tp_bmm_trans_a(c), tb = tp_bmm_trans_b(c);
    const float *a = (const float *)c->x[0], *b = (const float *)c->x[1], *dy = c->dy;
    float *d = c->dx[which];
    const size_t my = (size_t)g->m * g->n, ma = (size_t)g->m * g->k,
                 mb = (size_t)g->k * g->n;
    const size_t own = which ? g->nb : g->na, msz = which ? mb : ma;
    float beta = c->dx_acc[which] ? 1.0f : 0.0f;
    const int summed = own < g->nbat, empty = which ? g->m == 0 : g->n == 0;
    if (!msz)
        return TP_OK;
    if ((summed || empty) && beta == 0.0f) {
        TP_CUDA_CHECK(cudaMemsetAsync(d, 0, own * msz * sizeof(float), s->cu));
        beta = 1.0f;
    }
    if (empty || !g->nbat)
        return TP_OK;
    const int lda = ta ? g->m : g->k, ldb = tb ? g->k : g->n;
    long long sa, sb;
    const int uni = !summed && bm_uniform(g, ma, mb, &sa, &sb);
    const size_t calls = uni ? 1 : g->nbat;
    for (size_t o = 0; o < calls; o++) {
        size_t oa = 0, ob = 0;
        if (!uni)
            bm_offsets(g, o, &oa, &ob);
        const int cnt = uni ? (int)g->nbat : 1;
        const long long sy = uni ? (long long)my : 0;
        const long long sa_ = uni ? sa : 0, sb_ = uni ? sb : 0;
        const float *dyo = dy + o * my;
        if (which == 0) {
            if (!ta) /* dA[M,K] = dY op(B)^T */
                TP_TRY(bm_gemm(s, 0, !tb, g->m, g->k, g->n, 1.0f, dyo, g->n, sy, b + ob,
                               ldb, sb_, beta, d + oa, g->k, sa_, cnt));
            else /* dA[K,M] = op(B) dY^T */
                TP_TRY(bm_gemm(s, tb, 1, g->k, g->m, g->n, 1.0f, b + ob, ldb, sb_, dyo,
                               g->n, sy, beta, d + oa, g->m, sa_, cnt));
        } else {
            if (!tb) /* dB[K,N] = op(A)^T dY */
                TP_TRY(bm_gemm(s, !ta, 0, g->k, g->n, g->m, 1.0f, a + oa, lda, sa_, dyo,
                               g->n, sy, beta, d + ob, g->n, sb_, cnt));
            else /* dB[N,K] = dY^T op(A) */
                TP_TRY(bm_gemm(s, 1, ta, g->n, g->k, g->m, 1.0f, dyo, g->n, sy, a + oa,
                               lda, sa_, beta, d + ob, g->k, sb_, cnt));
        }
    }
    return TP_OK;
}

tp_status_t tp_cuda_batch_matmul_backward(tp_stream_t *s, const tp_op_call_t *c) {
    bm_geom g;
    bm_geometry(c, &g);
    if (c->dx[0])
        TP_TRY(bm_grad(s, c, &g, 0));
    if (c->dx[1])
        TP_TRY(bm_grad(s, c, &g, 1));
    return TP_OK;
}
