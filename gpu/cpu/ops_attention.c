/* towerpack gpu: fused attention on the CPU (docs/ops.md, TP_OP_ATTENTION).
 *
 * y = softmax(scale q k^T + mask) v for q [...,Tq,D], k and v [...,Tk,D],
 * one (batch, head) slice (an "item") at a time, the items spread over the
 * backend's pool (cpu_pool.h). Within an item the work goes in tiles of
 * S_BQ queries x S_BK keys, FlashAttention's way: the forward keeps each
 * query row's running max and sum (the online softmax) and rescales its
 * output row when the max grows, so no more than one row of a tile's
 * scores exists at a time; it saves each row's log-sum-exp and, while
 * they fit (s_geom's stash), every visited tile's e^(score - m), m the
 * row's running max at that tile, with m. The backward
 * (FlashAttention-2's) walks key tiles and takes each row's
 * probabilities in a factorised form, e^(score - m) e^(m - log-sum-exp):
 * from the stash one e^x a row and tile instead of one an element, or,
 * past the stash, recomputing the scores from q and k and the running
 * max the same way (the same bits); it accumulates dV, dK (into the key
 * tile's rows) and dQ (into the query row) in a fixed order. A causal
 * mask is applied by not visiting the keys past the query (key tiles
 * past the diagonal are skipped whole). The packed form (attr heads,
 * tp_attention_qkv) is the same per head on strided views: an item's q,
 * k and v rows (and their gradients) are read and written in the one
 * [...,T,3C] input at a stride of 3C, its y and dy at C (s_geom_t).
 *
 * Determinism: every item is computed by one thread from its own inputs
 * in one fixed order, so the bits do not depend on the thread count. The
 * loops are written for GCC's vectoriser (inner loops over contiguous
 * keys of a transposed tile, or over D), compiled for x86-64-v4, v3 and
 * the baseline and picked at load; the tiles' products and e^x
 * (cpu_math.h's s_vexp_fma, since issue 45's branch gpt17) are explicit
 * fused multiply-adds (fmaf), nothing else is contracted, so every clone
 * gives the same bits; measured faster here than OpenBLAS sgemm on tiles
 * this small (docs/performance.md). Where the CPU has AVX-512 the
 * products go through s_wide's 4 x 64 register blocks instead (the same
 * fused multiply-adds in the same order per element: the same bits), and
 * the row passes (the softmax, the backward's P and dS) through
 * s_softmax_rows_wide and s_grad_rows_wide (the same operations per
 * element, masked at a row's edge: the same bits).
 *
 * bf16 (tp_cpu_bf16_on when the workspace is sized, AVX-512 with
 * AVX512_BF16): the six tile products (q k^T, P v; dO v^T, P^T dO, dS^T q,
 * dS k) take operands rounded to bf16, as pairs along each product's
 * inner dimension (attention_bf16.h), and sum in fp32 (VDPBF16PS, twice
 * an FMA's multiply-adds an instruction); q and dO are rounded once an
 * item, k and v once a key tile, P and dS once a tile, into the item's
 * scratch (s_bf_t). The softmax, its statistics, the stash, dS itself
 * and every output stay fp32, and so do the row passes; the fp32 path
 * is untouched (its bits as above). The GPT's attention 1.4x as fast
 * (docs/performance.md, branch bf16attn). A workspace sized with bf16
 * off keeps the products fp32 (s_geom_call). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/attention_bf16.h"
#include "gpu/cpu/cpu_bf16.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_attention.h"

/* no-thread-jumps: GCC otherwise threads the exp's correlated clamps and
 * selects into two copies of its polynomial (ops_elementwise.c says more). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno", "fp-contract=off", "no-thread-jumps")
#endif
#include "gpu/cpu/cpu_math.h"

/* Clones per ISA as cpu_math.h's TP_CPU_CLONES, but by x86-64 level: the
 * tiles' products are fused multiply-adds (fmaf, s_block), and v3 and v4
 * have FMA where "avx2" and "avx512f" alone do not. The baseline clone's
 * fmaf is libm's, correctly rounded like the instruction: every clone
 * gives the same bits, only slower on a CPU without FMA (none since 2013). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define S_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define S_CLONES
#endif

/* queries x keys of a tile: a key tile transposed is D x S_BK floats (8
 * KiB at D 32), cache-resident while the query rows stream past it */
#define S_BQ 64
#define S_BK 64
_Static_assert(S_BQ == S_BK, "the causal loops start a key tile's query tiles at its own index");
/* a region of the workspace starts on 64 bytes */
#define S_ROUND(n) (((n) + 15) & ~(size_t)15)

typedef struct {
    const tp_op_call_t *c;
    size_t items;          /* the product of the leading dims */
    int64_t tq, tk, d;
    /* where an item's rows lie (the packed input's heads are strided
     * views): item it is head it % nh of leading row it / nh; its q rows
     * start at xq + (it / nh) bq + (it % nh) d, k's and v's at xk and xv
     * + (it / nh) bk + (it % nh) d, all ld floats apart (the gradients
     * alike in dq, dk, dv), y's and dy's at (it / nh) bo + (it % nh) d,
     * ldo apart. Three inputs: nh 1, ld = ldo = d, [T, d] blocks. */
    int64_t nh, ld, ldo;
    size_t bq, bk, bo;
    const float *xq, *xk, *xv;
    float *dq, *dk, *dv;   /* NULL: not asked */
    int accq, acck, accv;  /* dx_acc of each */
    float scale;
    int causal;
    int wide;              /* the products through s_wide (s_pick_wide) */
    int bf16;              /* the products on bf16 pairs (attention_bf16.h) */
    int64_t dh;            /* pairs a row of d: (d + 1) / 2 */
    float *lse;            /* [items, Tq] log-sum-exp of each query row */
    float *dot;            /* [items, Tq] rowsum(dO * O) (backward) */
    float *mrun;           /* [items, Tq] the backward's running max (no stash) */
    float *scratch;        /* [items, per] tile scratch, per item */
    size_t per;
    float *stash;          /* [items, spi] the forward's e^(s - m) tiles, then each
                            * tile row's m ([pairs, S_BQ]), or NULL */
    size_t spi;            /* floats an item stashes; 0: no stash (recompute) */
    size_t smax;           /* where an item's maxes start in its stash */
} s_geom_t;

/* The tile pairs (key tile, query tile) an item visits, in the key-tile-
 * outer order of both passes: causal (Tq = Tk), key tile jt meets query
 * tiles jt..nt-1, so the pairs before jt's are jt nt - jt (jt - 1) / 2. */
static size_t s_pair(int causal, int64_t nqt, int64_t jt, int64_t it) {
    if (!causal)
        return (size_t)(jt * nqt + it);
    return (size_t)(jt * nqt - jt * (jt - 1) / 2 + (it - jt));
}

size_t tp_cpu_attention_stash_limit_ = (size_t)16 << 20;

/* an item's scratch: two transposed key tiles (k, v), two query x key
 * tiles (P, dS; the forward uses one row of P and the row statistics) */
static size_t s_per_f32(int64_t d) {
    return S_ROUND((size_t)(2 * d * S_BK + 2 * S_BQ * S_BK + 2 * S_BQ));
}

/* With bf16 products, past that, the operands as bf16 pairs (s_bf_t):
 * the item's q and dO rows along d, and along the queries; a key tile's
 * k and v along d (from the transposed tiles) and k or v along the keys;
 * a tile's P and dS along the queries and dS along the keys. */
typedef struct {
    uint32_t *qr, *or_, *qp, *op; /* [tq, dh], [tq, dh], [(tq + 1) / 2, d] x 2 */
    uint32_t *kd, *vd;            /* [dh, S_BK] */
    uint32_t *kp;                 /* [S_BK / 2, d]: k's (backward) or v's (forward) */
    uint32_t *pp, *sp;            /* [S_BQ / 2, S_BK] */
    uint32_t *pr;                 /* [S_BQ, S_BK / 2]: P's (forward) or dS's (backward) */
} s_bf_t;

static size_t s_bf_layout(int64_t tq, int64_t d, uint32_t *base, s_bf_t *b) {
    const int64_t dh = (d + 1) / 2, tp = (tq + 1) / 2;
    const size_t n[10] = {S_ROUND((size_t)(tq * dh)), S_ROUND((size_t)(tq * dh)),
                          S_ROUND((size_t)(tp * d)), S_ROUND((size_t)(tp * d)),
                          S_ROUND((size_t)(dh * S_BK)), S_ROUND((size_t)(dh * S_BK)),
                          S_ROUND((size_t)(S_BK / 2 * d)), S_ROUND((size_t)(S_BQ / 2 * S_BK)),
                          S_ROUND((size_t)(S_BQ / 2 * S_BK)), S_ROUND((size_t)(S_BQ * S_BK / 2))};
    uint32_t **at[10];
    s_bf_t dummy;
    if (!b)
        b = &dummy;
    at[0] = &b->qr, at[1] = &b->or_, at[2] = &b->qp, at[3] = &b->op, at[4] = &b->kd;
    at[5] = &b->vd, at[6] = &b->kp, at[7] = &b->pp, at[8] = &b->sp, at[9] = &b->pr;
    size_t off = 0;
    for (int i = 0; i < 10; i++) {
        *at[i] = base ? base + off : NULL;
        off += n[i];
    }
    return off;
}

static size_t s_per(const s_geom_t *g) {
    return s_per_f32(g->d) + (g->bf16 ? s_bf_layout(g->tq, g->d, NULL, NULL) : 0);
}

/* the bf16 pairs of the item whose scratch starts at scratch */
static s_bf_t s_bf_of(const s_geom_t *g, float *scratch) {
    s_bf_t b;
    s_bf_layout(g->tq, g->d, (uint32_t *)(scratch + s_per_f32(g->d)), &b);
    return b;
}

static int s_pick_wide(void);

static void s_geom(const tp_op_call_t *c, s_geom_t *g, int allow_bf16) {
    const tp_shape_t *qs = &c->xshape[0];
    const int r = qs->ndim;
    g->c = c;
    g->items = 1;
    for (int i = 0; i < r - 2; i++)
        g->items *= (size_t)qs->d[i];
    g->tq = qs->d[r - 2];
    if (c->attr->heads > 0) { /* one packed [...,T,3C] input (tp_attention_qkv) */
        const int64_t cw = qs->d[r - 1] / 3;
        g->nh = c->attr->heads;
        g->items *= (size_t)g->nh;
        g->tk = g->tq;
        g->d = cw / g->nh;
        g->ld = 3 * cw;
        g->ldo = cw;
        g->bq = g->bk = (size_t)(g->tq * 3 * cw);
        g->bo = (size_t)(g->tq * cw);
        const float *x = c->x ? c->x[0] : NULL;
        float *dx = c->dx ? c->dx[0] : NULL;
        g->xq = x;
        g->xk = x ? x + cw : NULL;
        g->xv = x ? x + 2 * cw : NULL;
        g->dq = dx;
        g->dk = dx ? dx + cw : NULL;
        g->dv = dx ? dx + 2 * cw : NULL;
        g->accq = g->acck = g->accv = c->dx_acc ? c->dx_acc[0] : 0;
    } else {
        g->nh = 1;
        g->tk = c->xshape[1].d[r - 2];
        g->d = qs->d[r - 1];
        g->ld = g->ldo = g->d;
        g->bq = g->bo = (size_t)(g->tq * g->d);
        g->bk = (size_t)(g->tk * g->d);
        g->xq = c->x ? c->x[0] : NULL;
        g->xk = c->x ? c->x[1] : NULL;
        g->xv = c->x ? c->x[2] : NULL;
        g->dq = c->dx ? c->dx[0] : NULL;
        g->dk = c->dx ? c->dx[1] : NULL;
        g->dv = c->dx ? c->dx[2] : NULL;
        g->accq = c->dx_acc ? c->dx_acc[0] : 0;
        g->acck = c->dx_acc ? c->dx_acc[1] : 0;
        g->accv = c->dx_acc ? c->dx_acc[2] : 0;
    }
    g->scale = c->attr->alpha;
    g->causal = c->attr->beta != 0.0f;
    g->wide = s_pick_wide();
    g->bf16 = allow_bf16 && g->wide && tp_cpu_bf16_on() && tp_attn_bf16_usable();
    g->dh = (g->d + 1) / 2;
    g->per = s_per(g);
    /* the stash: every visited tile's S_BQ x S_BK e^(score - m) and its
     * rows' m, so the backward need neither recompute q k^T (nor
     * transpose k) nor take e^x an element; only while it is small (2.6
     * MB a layer for the GPT's 16 heads at T 256): past the limit the
     * backward recomputes them, the scratch staying O(T) */
    const int64_t nqt = (g->tq + S_BQ - 1) / S_BQ, nkt = (g->tk + S_BK - 1) / S_BK;
    const size_t pairs = g->causal ? s_pair(1, nqt, nkt, nkt) : (size_t)(nqt * nkt);
    g->smax = pairs * S_BQ * S_BK;
    g->spi = g->smax + pairs * S_BQ;
    if (g->items * g->spi * sizeof(float) > tp_cpu_attention_stash_limit_)
        g->spi = 0;
    float *ws = c->workspace;
    const size_t rows = S_ROUND(g->items * (size_t)g->tq);
    g->lse = ws;
    g->dot = ws ? ws + rows : NULL;
    g->mrun = ws ? ws + 2 * rows : NULL;
    g->scratch = ws ? ws + 3 * rows : NULL;
    g->stash = ws && g->spi ? g->scratch + g->items * g->per : NULL;
}

/* where item it's rows start in a tensor of blk floats a leading row */
static inline size_t s_at(const s_geom_t *g, size_t it, size_t blk) {
    return it / (size_t)g->nh * blk + it % (size_t)g->nh * (size_t)g->d;
}

/* rows x d floats, rows ld apart, set to 0 */
static void s_clear_rows(float *p, int64_t rows, int64_t d, int64_t ld) {
    if (ld == d) {
        memset(p, 0, (size_t)(rows * d) * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < rows; i++)
        memset(p + i * ld, 0, (size_t)d * sizeof(float));
}

static size_t s_bytes(const s_geom_t *g) {
    return (3 * S_ROUND(g->items * (size_t)g->tq) + g->items * (g->per + g->spi)) * sizeof(float);
}

size_t tp_cpu_attention_workspace(const tp_op_call_t *c) {
    s_geom_t g;
    s_geom(c, &g, 1);
    return s_bytes(&g);
}

/* 8 x 8 floats transposed in registers: rows of src (stride ls) become
 * rows of dst (stride ld). Generic vectors (__builtin_shufflevector: GCC 12
 * and clang), so every clone (AVX-512, AVX2, SSE2) has it; pure moves, so
 * the bits are those of a scalar copy. */
typedef float s_v8 __attribute__((vector_size(32)));

static inline void s_transpose8(const float *restrict src, int64_t ls, float *restrict dst,
                                int64_t ld) {
    s_v8 r[8], s[8], u[8];
    for (int i = 0; i < 8; i++)
        memcpy(&r[i], src + i * ls, sizeof(s_v8));
    for (int i = 0; i < 8; i += 2) { /* s[i]: columns 0 1 4 5 of rows i, i+1 */
        s[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        s[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int h = 0; h < 8; h += 4) { /* u[h + c]: columns c, c + 4 of 4 rows */
        u[h] = __builtin_shufflevector(s[h], s[h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[h + 1] = __builtin_shufflevector(s[h], s[h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[h + 2] = __builtin_shufflevector(s[h + 1], s[h + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[h + 3] = __builtin_shufflevector(s[h + 1], s[h + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int c = 0; c < 4; c++) {
        const s_v8 a = __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        const s_v8 b = __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        memcpy(dst + c * ld, &a, sizeof(s_v8));
        memcpy(dst + (c + 4) * ld, &b, sizeof(s_v8));
    }
}

/* kt[d][j] = k[j0 + j][d] for j < nk (k's rows ld floats apart): a key
 * tile with the keys contiguous, zeros after them up to a multiple of 16
 * keys (the scores' blocks of 16 then need no scalar edge). In 8 x 8
 * blocks where both counts allow (the strided scalar reads were 7-14% of
 * the kernel). */
static inline void s_transpose(const float *restrict k, int64_t ld, int64_t d, int64_t nk,
                               float *restrict kt) {
    const int64_t pad = (nk + 15) & ~(int64_t)15;
    const int64_t nk8 = nk & ~(int64_t)7, d8 = d & ~(int64_t)7;
    for (int64_t j = 0; j < nk8; j += 8)
        for (int64_t e = 0; e < d8; e += 8)
            s_transpose8(k + j * ld + e, ld, kt + e * S_BK + j, S_BK);
    for (int64_t e = 0; e < d; e++) { /* the edges: written in rows */
        float *restrict row = kt + e * S_BK;
        for (int64_t j = e < d8 ? nk8 : 0; j < nk; j++)
            row[j] = k[j * ld + e];
        for (int64_t j = nk; j < pad; j++)
            row[j] = 0.0f;
    }
}

/* The one product of every tile: C[r][c] (+)= sum over k in [k0, k1) of
 * A[r lda + k ak] B[k ldb + c], for rows <= 4 and cols <= 16 (a 4 x 16
 * block of C, kept in registers while k runs; A's stride ak lets it be a
 * transposed tile). Every element starts from C (acc) or 0 and adds its
 * terms in k order, in the full block and at the edges alike: the bits of
 * an element do not depend on the blocking, so the forward's scores and
 * the backward's recomputed ones are the same. Always inlined, as the
 * three s_tile_ below: an outlined copy is a plain function outside the
 * clones, its fmaf a call into libm (30x slower, seen while trying 4 x 32
 * blocks, which were slower than 4 x 16 here: 35 against 27.6 ms). */
static inline __attribute__((always_inline)) void
s_block(float *restrict cm, int64_t ldc, const float *restrict am, int64_t lda, int64_t ak,
        const float *restrict bm, int64_t ldb, int64_t k0, int64_t k1, int acc, int64_t rows,
        int64_t cols) {
    if (rows == 4 && cols == 16) {
        float r0[16], r1[16], r2[16], r3[16];
        for (int c = 0; c < 16; c++) {
            r0[c] = acc ? cm[c] : 0.0f;
            r1[c] = acc ? cm[ldc + c] : 0.0f;
            r2[c] = acc ? cm[2 * ldc + c] : 0.0f;
            r3[c] = acc ? cm[3 * ldc + c] : 0.0f;
        }
        for (int64_t k = k0; k < k1; k++) {
            const float *restrict b = bm + k * ldb;
            const float a0 = am[k * ak], a1 = am[lda + k * ak];
            const float a2 = am[2 * lda + k * ak], a3 = am[3 * lda + k * ak];
            for (int c = 0; c < 16; c++) {
                r0[c] = fmaf(a0, b[c], r0[c]);
                r1[c] = fmaf(a1, b[c], r1[c]);
                r2[c] = fmaf(a2, b[c], r2[c]);
                r3[c] = fmaf(a3, b[c], r3[c]);
            }
        }
        for (int c = 0; c < 16; c++) {
            cm[c] = r0[c];
            cm[ldc + c] = r1[c];
            cm[2 * ldc + c] = r2[c];
            cm[3 * ldc + c] = r3[c];
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float v = acc ? cm[r * ldc + c] : 0.0f;
            for (int64_t k = k0; k < k1; k++)
                v = fmaf(am[r * lda + k * ak], bm[k * ldb + c], v);
            cm[r * ldc + c] = v;
        }
}

/* The same products with AVX-512 intrinsics, picked at run time where the
 * CPU has them (TP_ISA=avx2 or plain says not, as ops_cpu.c's cast): a
 * block of up to 4 rows x 64 columns of C in registers while k runs (16
 * accumulators where s_block's 4 x 16 has 4, so the fused multiply-adds'
 * latency is hidden and each broadcast of A feeds 4 of them; s_block's
 * 4 x 32 through GCC's vectoriser was slower). Every element still starts
 * from C or 0 and adds its terms in k order, one correctly rounded fused
 * multiply-add each (the instruction fmaf is): the bits of s_block. */
#if defined(__x86_64__) && defined(__GNUC__)
#define S_WIDE 1
#include <immintrin.h>

#define S_WIDE_TARGET __attribute__((target("avx512f,fma")))

/* R rows x NC vectors of 16 columns, the last vector's lanes past the
 * columns masked off (zeros loaded, nothing stored). */
static inline __attribute__((always_inline)) S_WIDE_TARGET void
s_wide_block(const int R, const int NC, __mmask16 last, float *restrict cm, int64_t ldc,
             const float *restrict am, int64_t lda, int64_t ak, const float *restrict bm,
             int64_t ldb, int64_t k0, int64_t k1, int acc) {
    __m512 cr[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NC; v++) {
            const __mmask16 mk = v == NC - 1 ? last : (__mmask16)0xffff;
            cr[r][v] = acc ? _mm512_maskz_loadu_ps(mk, cm + r * ldc + 16 * v)
                           : _mm512_setzero_ps();
        }
    for (int64_t k = k0; k < k1; k++) {
        const float *restrict b = bm + k * ldb;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NC; v++)
            bv[v] = v == NC - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v)
                                : _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(am[r * lda + k * ak]);
#pragma GCC unroll 4
            for (int v = 0; v < NC; v++)
                cr[r][v] = _mm512_fmadd_ps(a, bv[v], cr[r][v]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NC; v++)
            _mm512_mask_storeu_ps(cm + r * ldc + 16 * v,
                                  v == NC - 1 ? last : (__mmask16)0xffff, cr[r][v]);
}

/* s_block's product for rows <= 4 and any cols, in column panels of 64. */
static S_WIDE_TARGET __attribute__((noinline)) void
s_wide(float *restrict cm, int64_t ldc, const float *restrict am, int64_t lda, int64_t ak,
       const float *restrict bm, int64_t ldb, int64_t k0, int64_t k1, int acc, int64_t rows,
       int64_t cols) {
    for (int64_t cb = 0; cb < cols; cb += 64) {
        const int64_t w = cols - cb < 64 ? cols - cb : 64;
        const int nc = (int)((w + 15) / 16);
        const __mmask16 last = (__mmask16)(0xffffu >> (16 * nc - w));
#define S_WIDE_CASE(R, NC)                                                                  \
    case (R) * 8 + (NC):                                                                    \
        s_wide_block(R, NC, last, cm + cb, ldc, am, lda, ak, bm + cb, ldb, k0, k1, acc);    \
        break;
        switch (rows * 8 + nc) {
            S_WIDE_CASE(4, 4) S_WIDE_CASE(4, 3) S_WIDE_CASE(4, 2) S_WIDE_CASE(4, 1)
            S_WIDE_CASE(3, 4) S_WIDE_CASE(3, 3) S_WIDE_CASE(3, 2) S_WIDE_CASE(3, 1)
            S_WIDE_CASE(2, 4) S_WIDE_CASE(2, 3) S_WIDE_CASE(2, 2) S_WIDE_CASE(2, 1)
            S_WIDE_CASE(1, 4) S_WIDE_CASE(1, 3) S_WIDE_CASE(1, 2) S_WIDE_CASE(1, 1)
        default:
            break;
        }
#undef S_WIDE_CASE
    }
}
#endif

/* Whether the products go through s_wide: the CPU has AVX-512 and TP_ISA
 * does not cap it. Read at each call (a test switches it). */
static int s_pick_wide(void) {
#ifdef S_WIDE
    const char *cap = getenv("TP_ISA");
    __builtin_cpu_init();
    return (!cap || !strcmp(cap, "avx512")) && __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

/* C[rows][cols] (+)= A B over k in [k0, k1), rows <= 4: s_wide's panels
 * where picked, else s_block's 16 columns at a time (the same bits). */
static inline __attribute__((always_inline)) void
s_rows_product(int wide, float *restrict cm, int64_t ldc, const float *restrict am,
               int64_t lda, int64_t ak, const float *restrict bm, int64_t ldb, int64_t k0,
               int64_t k1, int acc, int64_t rows, int64_t cols) {
#ifdef S_WIDE
    if (wide) {
        s_wide(cm, ldc, am, lda, ak, bm, ldb, k0, k1, acc, rows, cols);
        return;
    }
#else
    (void)wide;
#endif
    for (int64_t cb = 0; cb < cols; cb += 16)
        s_block(cm + cb, ldc, am, lda, ak, bm + cb, ldb, k0, k1, acc, rows,
                cols - cb < 16 ? cols - cb : 16);
}

/* The keys query i sees in the tile at j0 of nk keys: all, or up to i. */
static inline int64_t s_visible(int causal, int64_t i, int64_t j0, int64_t nk) {
    if (!causal)
        return nk;
    const int64_t lim = i - j0 + 1;
    return lim < 0 ? 0 : lim < nk ? lim : nk;
}

/* The first query of the tile at i0 that sees key j: the tile's first,
 * or key j's own row (s_visible's other side). */
static inline int64_t s_first_seeing(int causal, int64_t j, int64_t i0) {
    const int64_t lo = causal ? j - i0 : 0;
    return lo < 0 ? 0 : lo;
}

/* The next block's rows of a product's operand (up to 4 rows of d
 * floats, ld apart: C's rows, which the block reads and writes, or the
 * scores' A) asked for into L1 while this block's product runs. A row is
 * 4 lines and the rows 1-3 KiB apart (the packed input's heads), which
 * the hardware's prefetchers do not reach in time: without this the
 * block's first fused multiply-adds wait on its 16 loads of C from L2,
 * the backward 4-5% slower (docs/performance.md, gpt10). */
static inline __attribute__((always_inline)) void
s_prefetch_next(const float *p, int64_t rows, int64_t ld, int64_t d, int write) {
    for (int64_t r = 0; r < rows && r < 4; r++)
        for (int64_t e = 0; e < d; e += 16) {
            if (write)
                __builtin_prefetch(p + r * ld + e, 1, 3);
            else
                __builtin_prefetch(p + r * ld + e, 0, 3);
        }
}

/* scores[r][j] = a_r . k_j of a query tile's nq rows (a: q or dO, [nq,
 * d], rows lda apart) against the transposed key tile bt (k or v, s_transpose's), in
 * blocks of 16 columns up to the last some row of a 4-row block sees; the
 * others are left as they were. The scale
 * comes after, in the softmax's pass, the same in the forward and the
 * backward. */
static inline __attribute__((always_inline)) void
s_tile_scores(int wide, const float *restrict a, int64_t lda, const float *restrict bt, int64_t d,
              int64_t nq, int64_t nk, int64_t i0, int64_t j0, int causal, float *restrict scores) {
    for (int64_t rb = 0; rb < nq; rb += 4) {
        const int64_t rows = nq - rb < 4 ? nq - rb : 4;
        /* whole blocks of 16: the columns past the keys are zeros in bt */
        const int64_t ncols = s_visible(causal, i0 + rb + rows - 1, j0, nk);
        s_prefetch_next(a + (rb + 4) * lda, nq - rb - 4, lda, d, 0);
        s_rows_product(wide, scores + rb * S_BK, S_BK, a + rb * lda, lda, 1, bt, S_BK, 0, d, 0,
                       rows, (ncols + 15) & ~(int64_t)15);
    }
}

/* out[nq][d] += w[nq][nk] rows[nk][d] (out's rows ldo floats apart,
 * rows' ldr): each 4-row block only over the keys it sees (w is 0 past a
 * row's own). */
static inline __attribute__((always_inline)) void
s_tile_rows(int wide, int acc, float *restrict out, int64_t ldo, const float *restrict w,
            const float *restrict rows_, int64_t ldr, int64_t d, int64_t nq, int64_t nk,
            int64_t i0, int64_t j0, int causal) {
    for (int64_t rb = 0; rb < nq; rb += 4) {
        const int64_t rows = nq - rb < 4 ? nq - rb : 4;
        const int64_t kh = s_visible(causal, i0 + rb + rows - 1, j0, nk);
        s_prefetch_next(out + (rb + 4) * ldo, nq - rb - 4, ldo, d, 1);
        s_rows_product(wide, out + rb * ldo, ldo, w + rb * S_BK, S_BK, 1, rows_, ldr, 0, kh,
                       acc, rows, d);
    }
}

/* out[nk][d] += w^T[nk][nq] rows[nq][d] (dV from P and dO, dK from dS and
 * q; out's rows ldo floats apart, rows' ldr): each 4-key block only over
 * the queries that see it. */
static inline __attribute__((always_inline)) void
s_tile_cols(int wide, int acc, float *restrict out, int64_t ldo, const float *restrict w,
            const float *restrict rows_, int64_t ldr, int64_t d, int64_t nq, int64_t nk,
            int64_t i0, int64_t j0, int causal) {
    for (int64_t kb = 0; kb < nk; kb += 4) {
        const int64_t keys = nk - kb < 4 ? nk - kb : 4;
        const int64_t lo = s_first_seeing(causal, j0 + kb, i0);
        if (lo >= nq)
            continue;
        s_prefetch_next(out + (kb + 4) * ldo, nk - kb - 4, ldo, d, 1);
        s_rows_product(wide, out + kb * ldo, ldo, w + kb, 1, S_BK, rows_, ldr, lo, nq, acc,
                       keys, d);
    }
}

/* s_tile_scores, s_tile_rows and s_tile_cols on bf16 pairs (g->bf16,
 * attention_bf16.h), over the same blocks, keys and queries, the inner
 * ranges in whole pairs: an odd end's partner is a zero, and a causal
 * start rounded down to even meets only P's and dS's zeros (0 past a
 * row's keys). a: rows of dh pairs along d (q or dO); bt: a key tile's
 * k or v along d, dh x S_BK pairs. */
static void s_bf_scores(const uint32_t *a, int64_t lda, const uint32_t *bt, int64_t dh,
                        int64_t nq, int64_t nk, int64_t i0, int64_t j0, int causal,
                        float *scores) {
    for (int64_t rb = 0; rb < nq; rb += 4) {
        const int64_t rows = nq - rb < 4 ? nq - rb : 4;
        const int64_t ncols = s_visible(causal, i0 + rb + rows - 1, j0, nk);
        tp_attn_bf16_product(scores + rb * S_BK, S_BK, a + rb * lda, lda, 1, bt, S_BK, 0, dh, 0,
                             rows, (ncols + 15) & ~(int64_t)15);
    }
}

/* out[nq][d] += w[nq][nk] rows[nk][d]: w a tile's rows along the keys
 * (S_BK / 2 pairs apart), rows the key tile's along the keys ([S_BK / 2,
 * d]) */
static void s_bf_tile_rows(int acc, float *out, int64_t ldo, const uint32_t *w,
                           const uint32_t *rows_, int64_t d, int64_t nq, int64_t nk, int64_t i0,
                           int64_t j0, int causal) {
    for (int64_t rb = 0; rb < nq; rb += 4) {
        const int64_t rows = nq - rb < 4 ? nq - rb : 4;
        const int64_t kh = s_visible(causal, i0 + rb + rows - 1, j0, nk);
        s_prefetch_next(out + (rb + 4) * ldo, nq - rb - 4, ldo, d, 1);
        tp_attn_bf16_product(out + rb * ldo, ldo, w + rb * (S_BK / 2), S_BK / 2, 1, rows_, d, 0,
                             (kh + 1) / 2, acc, rows, d);
    }
}

/* out[nk][d] += w^T[nk][nq] rows[nq][d]: w a tile along the queries
 * ([S_BQ / 2, S_BK] pairs), rows the query tile's along the queries
 * ([., d]) */
static void s_bf_tile_cols(int acc, float *out, int64_t ldo, const uint32_t *w,
                           const uint32_t *rows_, int64_t d, int64_t nq, int64_t nk, int64_t i0,
                           int64_t j0, int causal) {
    for (int64_t kb = 0; kb < nk; kb += 4) {
        const int64_t keys = nk - kb < 4 ? nk - kb : 4;
        const int64_t lo = s_first_seeing(causal, j0 + kb, i0);
        if (lo >= nq)
            continue;
        s_prefetch_next(out + (kb + 4) * ldo, nk - kb - 4, ldo, d, 1);
        tp_attn_bf16_product(out + kb * ldo, ldo, w + kb, 1, S_BK, rows_, d, lo / 2,
                             (nq + 1) / 2, acc, keys, d);
    }
}

/* row[j] *= scale for j < lim, and the max of m and the scaled values, in
 * 16 lanes (exact: any order gives the same max). The forward and the
 * recomputing backward both take their running max here: the same bits. */
static inline __attribute__((always_inline)) float s_scale_max(float *restrict row,
                                                               int64_t lim, float scale,
                                                               float m) {
    float lane[16];
    for (int e = 0; e < 16; e++)
        lane[e] = m;
    int64_t j = 0;
    for (; j + 16 <= lim; j += 16)
        for (int e = 0; e < 16; e++) {
            const float sv = row[j + e] * scale;
            row[j + e] = sv;
            lane[e] = sv > lane[e] ? sv : lane[e];
        }
    for (; j < lim; j++) {
        const float sv = row[j] * scale;
        row[j] = sv;
        lane[0] = sv > lane[0] ? sv : lane[0];
    }
    float mx = lane[0];
    for (int e = 1; e < 16; e++)
        mx = lane[e] > mx ? lane[e] : mx;
    return mx;
}

/* out[j] = e^(s[j] - mx) for j < lim; out may be s (in place). */
static inline __attribute__((always_inline)) void s_exp_rows(float *out, const float *s,
                                                             int64_t lim, float mx) {
    if (out == s)
        for (int64_t j = 0; j < lim; j++)
            out[j] = s_vexp_fma(out[j] - mx);
    else {
        float *restrict o = out;
        const float *restrict in = s;
        for (int64_t j = 0; j < lim; j++)
            o[j] = s_vexp_fma(in[j] - mx);
    }
}

/* The forward's online softmax over a tile's nq score rows (pt, scaled in
 * place): each row's max m and sum l (the item's [tq] rows, at query i0)
 * updated, P = e^(s - m) written into the stash's row where there is one
 * (st, with the row's m into smax: the backward's e^(s - m)), else in
 * place, 0 past the row's keys up to nk, and its output row (o, [tq, d],
 * rows ldo floats apart) rescaled when the max grows. */
static inline __attribute__((always_inline)) void
s_softmax_rows(float *pt, float *st, float *smax, int64_t nq, int64_t i0, int64_t j0,
               int64_t nk, int causal, float scale, float *m, float *l, float *o, int64_t ldo,
               int64_t d) {
    for (int64_t r = 0; r < nq; r++) {
        float *restrict prow = pt + r * S_BK;
        const int64_t i = i0 + r, lim = s_visible(causal, i, j0, nk);
        /* the scale (in place) and the max in one pass, the max in 16
         * lanes (exact: any order gives the same max) */
        const float mx = s_scale_max(prow, lim, scale, m[i]);
        float *prow_out = st ? st + r * S_BK : prow;
        if (lim > 0) {
            /* the row's first visible tile: m was -inf, alpha 0 */
            const float alpha = s_vexp_fma(m[i] - mx);
            s_exp_rows(prow_out, prow, lim, mx);
            l[i] = l[i] * alpha + tp_cpu_sum8(prow_out, (size_t)lim);
            m[i] = mx;
            float *restrict orow = o + i * ldo;
            if (alpha != 1.0f && j0 > 0)
                for (int64_t e = 0; e < d; e++)
                    orow[e] *= alpha;
        }
        if (smax)
            smax[r] = mx;
        for (int64_t j = lim; j < nk; j++)
            prow_out[j] = 0.0f;
    }
}

/* The backward's P = e^(s - m) e^(m - lse) of a tile's nq rows into pt
 * (e^(s - m) from the stash's rows st with their m in smax; else from the
 * scores in pt, scaled in place, m the running max mrun as the forward
 * took it) and, when need_ds, dS = P (dO v^T - rowsum(dO O)) scale in
 * place of dO v^T in dst; both 0 past a row's keys up to nk. */
static inline __attribute__((always_inline)) void
s_grad_rows(float *pt, float *dst, const float *st, const float *smax, float *mrun,
            const float *lse, const float *dot, int64_t nq, int64_t i0, int64_t j0, int64_t nk,
            int causal, float scale, int need_ds) {
    for (int64_t r = 0; r < nq; r++) {
        const int64_t i = i0 + r, lim = s_visible(causal, i, j0, nk);
        float *restrict prow = pt + r * S_BK, *restrict dsrow = dst + r * S_BK;
        const float li = lse[i], di = dot[i];
        float mx;
        if (st) { /* the forward's e^(s - m): the same bits */
            mx = smax[r];
            const float *restrict srow = st + r * S_BK;
            const float f = s_vexp_fma(mx - li);
            for (int64_t j = 0; j < lim; j++)
                prow[j] = srow[j] * f;
        } else {
            mx = s_scale_max(prow, lim, scale, mrun[i]);
            mrun[i] = mx;
            const float f = s_vexp_fma(mx - li);
            for (int64_t j = 0; j < lim; j++)
                prow[j] = s_vexp_fma(prow[j] - mx) * f;
        }
        for (int64_t j = lim; j < nk; j++)
            prow[j] = 0.0f;
        if (!need_ds)
            continue;
        for (int64_t j = 0; j < lim; j++)
            dsrow[j] = prow[j] * (dsrow[j] - di) * scale;
        for (int64_t j = lim; j < nk; j++)
            dsrow[j] = 0.0f;
    }
}

#ifdef S_WIDE
/* The two row passes above in AVX-512 intrinsics, each 16-column vector
 * of a row in one go, the row's edge a mask (the portable loops, as GCC
 * vectorises them, run the last lim % 16 columns one at a time: on the
 * causal diagonal up to 15 of a row's 64). The same operations on each
 * element as the portable passes (no fused multiply-add but e^x's; the
 * file's fp-contract is off), tp_cpu_sum8's lanes and order for the row
 * sum, s_vexp_fma's for e^x: the same bits. */

/* s_vexp_fma's core (cpu_math.h) in 16 lanes: 2^n p(r) for z already
 * in range, its operations one for one (its fmaf the instruction here,
 * as in the portable loops' v4 and v3 clones; libm's correctly rounded
 * one in the baseline's: the same bits). */
static inline __attribute__((always_inline)) S_WIDE_TARGET __m512 s_wide_exp_core(__m512 z) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 t = _mm512_fmadd_ps(z, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 n = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), z);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.3753952e-3f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3689103e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1669488e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666518e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.9999988e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i two_n = _mm512_add_epi32(_mm512_slli_epi32(_mm512_castps_si512(t), 23),
                                           _mm512_set1_epi32(127 << 23));
    return _mm512_mul_ps(p, _mm512_castsi512_ps(two_n));
}

/* s_vexp_fma (cpu_math.h) in 16 lanes: the range's clamps around the
 * core, then NaN, overflow to inf and underflow to 0 as it does them. */
static inline __attribute__((always_inline)) S_WIDE_TARGET __m512 s_wide_exp(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.0f), lo = _mm512_set1_ps(-87.3f);
    __m512 z = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_LT_OQ), hi, x);
    z = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, lo, _CMP_GT_OQ), lo, z);
    __m512 y = s_wide_exp_core(z);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), x, y);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), y,
                             _mm512_set1_ps(INFINITY));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), y, _mm512_setzero_ps());
}

/* s_wide_exp for x <= 0 or NaN, the softmax's e^(s - max) and its
 * rescale factors e^(m_old - m) (a max is at least every value it
 * covers; inf - inf and -inf - -inf are NaN): the same bits there with 6
 * of its 31 operations fewer (the forward 3-5% shorter at the GPT's
 * shape, docs/performance.md, gpt21). Past 88 it is not s_wide_exp (no clamp,
 * no inf); below -87.3 the clamp to -87.3 was only there for the lanes
 * that the last blend sets to 0, and a NaN goes through the polynomial
 * to the blend that returns x, as it did clamped. */
static inline __attribute__((always_inline)) S_WIDE_TARGET __m512 s_wide_exp_neg(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3f);
    __m512 y = s_wide_exp_core(x);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), x, y);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), y, _mm512_setzero_ps());
}

/* the lanes of columns [j, j + 16) below lim */
static inline __attribute__((always_inline)) __mmask16 s_wide_below(int64_t j, int64_t lim) {
    const int64_t n = lim - j;
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* s_scale_max in 16-column vectors: the scale in place, the max of m and
 * the scaled values (a max is exact in any order; a tie of -0 and +0 may
 * keep the other zero, which changes no value computed from it) */
static inline __attribute__((always_inline)) S_WIDE_TARGET float
s_wide_scale_max(float *row, int64_t lim, float scale, float m) {
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 lane = _mm512_set1_ps(m);
    for (int64_t j = 0; j < lim; j += 16) {
        const __mmask16 k = s_wide_below(j, lim);
        const __m512 sv = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), sc);
        _mm512_mask_storeu_ps(row + j, k, sv);
        /* sv > lane ? sv : lane, as s_scale_max (a NaN score is skipped) */
        lane = _mm512_mask_blend_ps(_mm512_mask_cmp_ps_mask(k, sv, lane, _CMP_GT_OQ), lane, sv);
    }
    /* the lanes' max in a tree of shuffles (exact; no lane holds a NaN)
     * where a chain of 15 dependent scalar compares a row made the forward
     * 1.5-2.5% slower (docs/performance.md, gpt10) */
    return _mm512_reduce_max_ps(lane);
}

/* out[j] = e^(s[j] - mx) for j < lim (s[j] <= mx: s_wide_exp_neg), 0 for
 * lim <= j < nk (out may be s), and the sum of out[0, lim) as
 * tp_cpu_sum8 adds it: 8 lanes over the whole blocks of 8, the rest one
 * by one, then the lanes */
static inline __attribute__((always_inline)) S_WIDE_TARGET float
s_wide_exp_sum(float *out, const float *s, int64_t lim, int64_t nk, float mx) {
    const __m512 vm = _mm512_set1_ps(mx);
    const int64_t whole = lim & ~(int64_t)7;
    __m256 lane = _mm256_setzero_ps();
    float rest[16]; /* the vector holding columns [whole, lim): one, as whole is 8k */
    int64_t rest_at = 0;
    for (int64_t j = 0; j < nk; j += 16) {
        const __mmask16 k = s_wide_below(j, lim);
        const __m512 e = k ? s_wide_exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm))
                           : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(out + j, s_wide_below(j, nk), _mm512_maskz_mov_ps(k, e));
        if (j + 8 <= whole)
            lane = _mm256_add_ps(lane, _mm512_castps512_ps256(e));
        if (j + 16 <= whole)
            lane = _mm256_add_ps(lane, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
        if (whole < lim && j <= whole && whole < j + 16) {
            _mm512_storeu_ps(rest, e);
            rest_at = j;
        }
    }
    float sum = 0.0f, ln[8];
    for (int64_t t = whole; t < lim; t++)
        sum += rest[t - rest_at];
    _mm256_storeu_ps(ln, lane);
    for (int e = 0; e < 8; e++)
        sum += ln[e];
    return sum;
}

/* e^(a[r] - b[r]) for r < n (n <= S_BQ) into out, 16 rows a vector: the
 * rows' rescale factors, one vector e^x for 16 rows instead of a scalar
 * one a row; neg: a[r] <= b[r] (s_wide_exp_neg's range) */
static inline __attribute__((always_inline)) S_WIDE_TARGET void
s_wide_exp_diff(float *out, const float *a, const float *b, int64_t n, int neg) {
    for (int64_t r = 0; r < n; r += 16) {
        const __mmask16 k = s_wide_below(r, n);
        const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, a + r),
                                       _mm512_maskz_loadu_ps(k, b + r));
        _mm512_mask_storeu_ps(out + r, k, neg ? s_wide_exp_neg(x) : s_wide_exp(x));
    }
}

/* s_softmax_rows with the passes above (the same bits), in three passes
 * over the tile's rows: their maxes, the rescale factors e^(m_old - m)
 * of 16 rows a vector, then e^(s - m) and the sums */
static S_WIDE_TARGET __attribute__((noinline)) void
s_softmax_rows_wide(float *pt, float *st, float *smax, int64_t nq, int64_t i0, int64_t j0,
                    int64_t nk, int causal, float scale, float *m, float *l, float *o,
                    int64_t ldo, int64_t d) {
    float mx[S_BQ], alpha[S_BQ];
    for (int64_t r = 0; r < nq; r++)
        mx[r] = s_wide_scale_max(pt + r * S_BK, s_visible(causal, i0 + r, j0, nk), scale,
                                 m[i0 + r]);
    /* the row's first visible tile: m was -inf, alpha 0 */
    s_wide_exp_diff(alpha, m + i0, mx, nq, 1); /* mx is at least m */
    for (int64_t r = 0; r < nq; r++) {
        float *restrict prow = pt + r * S_BK;
        const int64_t i = i0 + r, lim = s_visible(causal, i, j0, nk);
        float *prow_out = st ? st + r * S_BK : prow;
        if (lim > 0) {
            const float sum = s_wide_exp_sum(prow_out, prow, lim, nk, mx[r]);
            l[i] = l[i] * alpha[r] + sum;
            m[i] = mx[r];
            float *restrict orow = o + i * ldo;
            if (alpha[r] != 1.0f && j0 > 0)
                for (int64_t e = 0; e < d; e++)
                    orow[e] *= alpha[r];
        } else
            for (int64_t j = 0; j < nk; j++)
                prow_out[j] = 0.0f;
        if (smax)
            smax[r] = mx[r];
    }
}

/* s_grad_rows, each vector of a row in one pass: P, then dS from it in
 * registers (the same operations, the same bits); the rows' factors
 * e^(m - lse) first, 16 rows a vector */
static S_WIDE_TARGET __attribute__((noinline)) void
s_grad_rows_wide(float *pt, float *dst, const float *st, const float *smax, float *mrun,
                 const float *lse, const float *dot, int64_t nq, int64_t i0, int64_t j0,
                 int64_t nk, int causal, float scale, int need_ds) {
    const __m512 vsc = _mm512_set1_ps(scale);
    float f[S_BQ];
    if (!st) /* the running max as the forward took it */
        for (int64_t r = 0; r < nq; r++)
            mrun[i0 + r] = s_wide_scale_max(pt + r * S_BK, s_visible(causal, i0 + r, j0, nk),
                                            scale, mrun[i0 + r]);
    const float *mx = st ? smax : mrun + i0;
    s_wide_exp_diff(f, mx, lse + i0, nq, 0);
    for (int64_t r = 0; r < nq; r++) {
        const int64_t i = i0 + r, lim = s_visible(causal, i, j0, nk);
        float *restrict prow = pt + r * S_BK, *restrict dsrow = dst + r * S_BK;
        const float *srow = st ? st + r * S_BK : NULL;
        const __m512 vf = _mm512_set1_ps(f[r]), vm = _mm512_set1_ps(mx[r]);
        const __m512 vdi = _mm512_set1_ps(dot[i]);
        for (int64_t j = 0; j < nk; j += 16) {
            const __mmask16 k = s_wide_below(j, lim), kn = s_wide_below(j, nk);
            __m512 p = _mm512_setzero_ps();
            if (k && srow)
                p = _mm512_maskz_mul_ps(k, _mm512_maskz_loadu_ps(k, srow + j), vf);
            else if (k)
                p = _mm512_maskz_mul_ps(
                    k, s_wide_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, prow + j), vm)), vf);
            _mm512_mask_storeu_ps(prow + j, kn, p);
            if (!need_ds)
                continue;
            const __m512 ds = _mm512_mul_ps(
                _mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dsrow + j), vdi)), vsc);
            _mm512_mask_storeu_ps(dsrow + j, kn, _mm512_maskz_mov_ps(k, ds));
        }
    }
}
#endif

/* The call's geometry, its workspace there and, when its size is known
 * (0: not said), large enough. bf16 products where asked, unless the
 * workspace was planned without them (bf16 turned on after the model was
 * built): then fp32, as the plan had it, in both passes alike. */
static tp_status_t s_geom_call(const tp_op_call_t *c, s_geom_t *g) {
    s_geom(c, g, 1);
    if (g->bf16 && c->workspace_bytes && c->workspace_bytes < s_bytes(g))
        s_geom(c, g, 0);
    const size_t need = s_bytes(g);
    if (!c->workspace || (c->workspace_bytes && c->workspace_bytes < need))
        return tp_error(TP_ERR_INVALID, "attention '%s': workspace of %zu bytes at %p, "
                        "needs %zu", c->name ? c->name : "?", c->workspace_bytes,
                        c->workspace, need);
    return TP_OK;
}

/* The running max and sum of every query row of the item live in the
 * workspace (the log-sum-exp's and dO.O's rows, free until the end and the
 * backward), so the key tiles can be the outer loop: each key tile is
 * transposed once per item, not once per query tile that reaches it (at T
 * 256, 4 transposes instead of 10). Every row still meets its key tiles
 * in increasing order with the same operations, so the bits are those of
 * the query-tile-outer loop. */
S_CLONES static void s_forward_item(const s_geom_t *g, size_t it, float *scratch) {
    const tp_op_call_t *c = g->c;
    const int64_t tq = g->tq, tk = g->tk, d = g->d;
    const int causal = g->causal;
    const float scale = g->scale;
    const int64_t ld = g->ld, ldo = g->ldo;
    const float *q = g->xq + s_at(g, it, g->bq);
    const float *k = g->xk + s_at(g, it, g->bk);
    const float *v = g->xv + s_at(g, it, g->bk);
    float *o = (float *)c->y + s_at(g, it, g->bo);
    float *lse = g->lse + it * (size_t)tq;
    /* [tq] running max (becomes the log-sum-exp) and running sum */
    float *m = lse, *l = g->dot + it * (size_t)tq;
    float *kt = scratch, *pt = kt + 2 * d * S_BK;
    float *stash = g->stash ? g->stash + it * g->spi : NULL;
    const int64_t nqt = (tq + S_BQ - 1) / S_BQ;
    const s_bf_t bf = g->bf16 ? s_bf_of(g, scratch) : (s_bf_t){0};
    for (int64_t i = 0; i < tq; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    if (g->bf16) /* q's rows in pairs once an item */
        tp_attn_bf16_rows(bf.qr, g->dh, q, ld, tq, d);
    /* no clear of o: every row meets key tile 0 first (causal or not), whose
     * product stores where the later ones add (from 0 either way: the
     * same bits as a clear, without writing o twice) */
    for (int64_t j0 = 0; j0 < tk; j0 += S_BK) {
        const int64_t nk = tk - j0 < S_BK ? tk - j0 : S_BK;
        s_transpose(k + j0 * ld, ld, d, nk, kt);
        if (g->bf16) { /* the key tile's k along d, v along the keys */
            tp_attn_bf16_pairs(bf.kd, S_BK, kt, S_BK, d, (nk + 15) & ~(int64_t)15);
            tp_attn_bf16_pairs(bf.kp, d, v + j0 * ld, ld, nk, d);
        }
        /* causal: the query tiles that reach this key tile (Tq = Tk) */
        for (int64_t i0 = causal ? j0 : 0; i0 < tq; i0 += S_BQ) {
            const int64_t nq = tq - i0 < S_BQ ? tq - i0 : S_BQ;
            if (g->bf16)
                s_bf_scores(bf.qr + i0 * g->dh, g->dh, bf.kd, g->dh, nq, nk, i0, j0, causal, pt);
            else
                s_tile_scores(g->wide, q + i0 * ld, ld, kt, d, nq, nk, i0, j0, causal, pt);
            const size_t pair = s_pair(causal, nqt, j0 / S_BK, i0 / S_BQ);
            float *st = stash ? stash + pair * S_BQ * S_BK : NULL;
            float *smax = stash ? stash + g->smax + pair * S_BQ : NULL;
            /* each row's online softmax: P = e^(s - max), 0 past its keys,
             * its output row rescaled when the max grows */
#ifdef S_WIDE
            if (g->wide)
                s_softmax_rows_wide(pt, st, smax, nq, i0, j0, nk, causal, scale, m, l, o, ldo,
                                    d);
            else
#endif
                s_softmax_rows(pt, st, smax, nq, i0, j0, nk, causal, scale, m, l, o, ldo, d);
            if (g->bf16) {
                tp_attn_bf16_rows(bf.pr, S_BK / 2, st ? st : pt, S_BK, nq, nk);
                s_bf_tile_rows(j0 > 0, o + i0 * ldo, ldo, bf.pr, bf.kp, d, nq, nk, i0, j0, causal);
            } else
                s_tile_rows(g->wide, j0 > 0, o + i0 * ldo, ldo, st ? st : pt, v + j0 * ld, ld, d,
                            nq, nk, i0, j0, causal);
        }
    }
    for (int64_t i = 0; i < tq; i++) {
        float *restrict orow = o + i * ldo;
        const float inv = 1.0f / l[i];
        for (int64_t e = 0; e < d; e++)
            orow[e] *= inv;
        lse[i] = m[i] + logf(l[i]);
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
    TP_TRY(s_geom_call(c, &g));
    tp_cpu_parallel(g.items, 1, 1, s_forward_range, &g);
    return TP_OK;
}

S_CLONES static void s_backward_item(const s_geom_t *g, size_t it, float *scratch) {
    const tp_op_call_t *c = g->c;
    const int64_t tq = g->tq, tk = g->tk, d = g->d;
    const int causal = g->causal;
    const int64_t ld = g->ld, ldo = g->ldo;
    const size_t oq = s_at(g, it, g->bq), ok = s_at(g, it, g->bk), oo = s_at(g, it, g->bo);
    const float *q = g->xq + oq;
    const float *k = g->xk + ok;
    const float *v = g->xv + ok;
    const float *o = (const float *)c->y + oo, *dout = c->dy + oo;
    const float *lse = g->lse + it * (size_t)tq;
    float *dot = g->dot + it * (size_t)tq;
    float *dq = g->dq ? g->dq + oq : NULL;
    float *dk = g->dk ? g->dk + ok : NULL;
    float *dv = g->dv ? g->dv + ok : NULL;
    /* the key tile and v's, transposed; the query tile's P and dS */
    float *kt = scratch, *vt = kt + d * S_BK, *pt = vt + d * S_BK, *dst = pt + S_BQ * S_BK;
    const float *stash = g->stash ? g->stash + it * g->spi : NULL;
    /* without the stash, each row's running max as the forward had it at
     * each key tile (the key tiles are walked in the same order) */
    float *mrun = g->mrun + it * (size_t)tq;
    const int64_t nqt = (tq + S_BQ - 1) / S_BQ;
    if (!stash)
        for (int64_t i = 0; i < tq; i++)
            mrun[i] = -INFINITY;
    /* A gradient not accumulated into and in a buffer of its own is not
     * cleared: its first product stores, from 0 (dQ's rows at key tile 0,
     * which every row meets first; dK's and dV's at the first query tile
     * of their key tile, which reaches every key of it), the same bits as
     * a clear and adding, one write fewer. Two inputs may be one node (q =
     * k), the second then adding into the first's buffer: such a buffer is
     * cleared, every clear before any sum. (The packed input's three are
     * disjoint columns of one buffer: each its own.) */
    const int own_q = dq && dq != dk && dq != dv, own_k = dk && dk != dq && dk != dv;
    const int own_v = dv && dv != dq && dv != dk;
    const int fresh_q = own_q && !g->accq, fresh_k = own_k && !g->acck;
    const int fresh_v = own_v && !g->accv;
    if (dq && !g->accq && !fresh_q)
        s_clear_rows(dq, tq, d, ld);
    if (dk && !g->acck && !fresh_k)
        s_clear_rows(dk, tk, d, ld);
    if (dv && !g->accv && !fresh_v)
        s_clear_rows(dv, tk, d, ld);
    /* rowsum(dO O) in 16 lanes, added in a fixed order (one chain of d
     * dependent adds a row was ~1 ms a GPT step) */
    for (int64_t i = 0; i < tq; i++) {
        const float *restrict dr = dout + i * ldo, *restrict orow = o + i * ldo;
        float lane[16] = {0};
        int64_t e = 0;
        for (; e + 16 <= d; e += 16)
            for (int l = 0; l < 16; l++)
                lane[l] += dr[e + l] * orow[e + l];
        float acc = 0.0f;
        for (; e < d; e++)
            acc += dr[e] * orow[e];
        for (int l = 0; l < 16; l++)
            acc += lane[l];
        dot[i] = acc;
    }
    const int need_ds = dq || dk;
    const s_bf_t bf = g->bf16 ? s_bf_of(g, scratch) : (s_bf_t){0};
    if (g->bf16) { /* the item's q and dO in pairs: along d, along the queries */
        if (!stash)
            tp_attn_bf16_rows(bf.qr, g->dh, q, ld, tq, d);
        if (need_ds)
            tp_attn_bf16_rows(bf.or_, g->dh, dout, ldo, tq, d);
        if (dk)
            tp_attn_bf16_pairs(bf.qp, d, q, ld, tq, d);
        if (dv)
            tp_attn_bf16_pairs(bf.op, d, dout, ldo, tq, d);
    }
    for (int64_t j0 = 0; j0 < tk; j0 += S_BK) {
        const int64_t nk = tk - j0 < S_BK ? tk - j0 : S_BK;
        const int64_t pad = (nk + 15) & ~(int64_t)15;
        if (!stash)
            s_transpose(k + j0 * ld, ld, d, nk, kt);
        if (need_ds)
            s_transpose(v + j0 * ld, ld, d, nk, vt);
        if (g->bf16) { /* k and v along d, k along the keys */
            if (!stash)
                tp_attn_bf16_pairs(bf.kd, S_BK, kt, S_BK, d, pad);
            if (need_ds)
                tp_attn_bf16_pairs(bf.vd, S_BK, vt, S_BK, d, pad);
            if (dq)
                tp_attn_bf16_pairs(bf.kp, d, k + j0 * ld, ld, nk, d);
        }
        /* causal: the query tiles that reach this key tile */
        const int64_t i0_first = causal ? j0 / S_BQ * S_BQ : 0;
        for (int64_t i0 = i0_first; i0 < tq; i0 += S_BQ) {
            const int64_t nq = tq - i0 < S_BQ ? tq - i0 : S_BQ;
            /* P = e^(s - m) e^(m - lse), m the row's running max at this
             * tile: e^(s - m) from the stash, else recomputed as the
             * forward took it; dS = P (dO v^T - rowsum(dO O)) scale; both
             * 0 past a row's keys */
            const size_t pair = s_pair(causal, nqt, j0 / S_BK, i0 / S_BQ);
            const float *st = stash ? stash + pair * S_BQ * S_BK : NULL;
            const float *smax = stash ? stash + g->smax + pair * S_BQ : NULL;
            if (g->bf16) {
                if (!st)
                    s_bf_scores(bf.qr + i0 * g->dh, g->dh, bf.kd, g->dh, nq, nk, i0, j0, causal,
                                pt);
                if (need_ds)
                    s_bf_scores(bf.or_ + i0 * g->dh, g->dh, bf.vd, g->dh, nq, nk, i0, j0, causal,
                                dst);
            } else {
                if (!st)
                    s_tile_scores(g->wide, q + i0 * ld, ld, kt, d, nq, nk, i0, j0, causal, pt);
                if (need_ds)
                    s_tile_scores(g->wide, dout + i0 * ldo, ldo, vt, d, nq, nk, i0, j0, causal,
                                  dst);
            }
#ifdef S_WIDE
            if (g->wide)
                s_grad_rows_wide(pt, dst, st, smax, mrun, lse, dot, nq, i0, j0, nk, causal,
                                 g->scale, need_ds);
            else
#endif
                s_grad_rows(pt, dst, st, smax, mrun, lse, dot, nq, i0, j0, nk, causal, g->scale,
                            need_ds);
            const int first_i = i0 == i0_first; /* the key tile's first query tile */
            if (g->bf16) { /* P and dS along the queries, dS along the keys */
                const uint32_t *qp = bf.qp + i0 / 2 * d, *op = bf.op + i0 / 2 * d;
                if (dv) {
                    tp_attn_bf16_pairs(bf.pp, S_BK, pt, S_BK, nq, nk);
                    s_bf_tile_cols(!(fresh_v && first_i), dv + j0 * ld, ld, bf.pp, op, d, nq, nk,
                                   i0, j0, causal);
                }
                if (dk) {
                    tp_attn_bf16_pairs(bf.sp, S_BK, dst, S_BK, nq, nk);
                    s_bf_tile_cols(!(fresh_k && first_i), dk + j0 * ld, ld, bf.sp, qp, d, nq, nk,
                                   i0, j0, causal);
                }
                if (dq) {
                    tp_attn_bf16_rows(bf.pr, S_BK / 2, dst, S_BK, nq, nk);
                    s_bf_tile_rows(!(fresh_q && j0 == 0), dq + i0 * ld, ld, bf.pr, bf.kp, d, nq,
                                   nk, i0, j0, causal);
                }
                continue;
            }
            if (dv)
                s_tile_cols(g->wide, !(fresh_v && first_i), dv + j0 * ld, ld, pt,
                            dout + i0 * ldo, ldo, d, nq, nk, i0, j0, causal);
            if (dk)
                s_tile_cols(g->wide, !(fresh_k && first_i), dk + j0 * ld, ld, dst, q + i0 * ld, ld,
                            d, nq, nk, i0, j0, causal);
            if (dq)
                s_tile_rows(g->wide, !(fresh_q && j0 == 0), dq + i0 * ld, ld, dst, k + j0 * ld, ld,
                            d, nq, nk, i0, j0, causal);
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
    TP_TRY(s_geom_call(c, &g));
    if (!g.dq && !g.dk && !g.dv)
        return TP_OK;
    tp_cpu_parallel(g.items, 1, 1, s_backward_range, &g);
    return TP_OK;
}
