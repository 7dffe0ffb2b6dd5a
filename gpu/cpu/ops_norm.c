/* towerpack gpu: layer, group and instance norm on the CPU (docs/ops.md,
 * the linalg family), and batch norm on plain NCHW (its own section at
 * the end: channels over the pool).
 *
 * All three normalise contiguous rows of x: layer norm a row per slice of
 * its last axes (length D), group norm a row per (sample, group) of
 * C/G channels times the positions S (instance norm: G = C). gamma and
 * beta index the same way for both: element j of row r reads parameter
 * ((r mod G) L + j) / S, with G = S = 1 for layer norm. Statistics are
 * summed in fixed float lanes, each chunk of a row into a double (s_fsum:
 * the mean first, then the squared deviations, as torch's two-pass
 * variance); the backward's row sums likewise for layer norm with
 * gamma (s_fsum_dy), in double lanes (LANE_SUM) for the other forms.
 * The forward leaves each row's mean and 1/std in the workspace for the
 * backward; a call without one (the parity harness's) recomputes them.
 * The parameters' gradients add each row's per-parameter sums in row
 * order within fixed blocks of rows, then the blocks in order: the same
 * bits whatever the thread count (tp_cpu_norm_backward). A gamma left
 * out reads as 1 and a beta as 0 (attr.norm_absent,
 * elementwise_affine=False); the loops then take their own branches
 * rather than reading a ones vector. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_norm.h"
#include "gpu/op_geometry.h"

/* The row loops are compiled per ISA (TP_CPU_CLONES: AVX-512, AVX2,
 * SSE2, picked at load) without FMA contraction: the lanes are the same
 * accumulators in every width, so the bits are those of the SSE2 build. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "gpu/cpu/cpu_math.h"

int tp_cpu_norm_kind(tp_op_kind_t k) {
    return k == TP_OP_LAYER_NORM || k == TP_OP_GROUP_NORM || k == TP_OP_INSTANCE_NORM;
}


/* The backward's sums run in LANES independent double accumulators,
 * added in a fixed order at the end: the loops vectorise (one accumulator
 * would be one long chain of dependent adds, twice as slow here) and the
 * result does not depend on the machine. (The forward's statistics run in
 * s_fsum's float lanes, below: a wider tree with fewer adds in a chain.) */
#define LANES 8

/* sum f(j) for j in [0, n), f an expression of j. */
#define LANE_SUM(out, n, f)                                                  \
    do {                                                                     \
        double l_[LANES] = {0};                                              \
        size_t j0_ = 0;                                                      \
        for (; j0_ + LANES <= (n); j0_ += LANES)                             \
            for (int i_ = 0; i_ < LANES; i_++) {                             \
                const size_t j = j0_ + (size_t)i_;                           \
                l_[i_] += (double)(f);                                       \
            }                                                                \
        for (size_t j = j0_; j < (n); j++)                                   \
            l_[j % LANES] += (double)(f);                                    \
        double t_ = 0.0;                                                     \
        for (int i_ = 0; i_ < LANES; i_++)                                   \
            t_ += l_[i_];                                                    \
        (out) = t_;                                                          \
    } while (0)

/* The statistics' sums (sq 0: sum x; 1: sum (x - mu)^2) in float: 4
 * vectors of 16 lanes over a chunk of at most 1,024 floats (j by 64), then
 * 16-float steps into the first, the last n mod 16 in a scalar of their
 * own; the four vectors added pairwise, the 16 lanes in a tree of halves
 * (shuffles: in registers, where a loop over an array of the lanes went
 * through the stack), the chunk and the scalar into a double. A fixed
 * order: the same bits in every clone and at every cut. The double lanes
 * before (LANE_SUM, 8 dependent chains of len / 8 adds a row and pass)
 * made the GPT's layer norm wait on its adds: its forward 0.108 -> 0.07
 * ms a node of 1,024 x 256 alone (issue 45, branch gpt17,
 * docs/performance.md). */
typedef float s_f16 __attribute__((vector_size(16 * sizeof(float))));
#define S_F16_LOAD(v, p) memcpy(&(v), (p), sizeof(s_f16))

static inline __attribute__((always_inline)) double
s_fsum(const float *restrict x, size_t n, int sq, float mu) {
    double total = 0.0;
    const s_f16 mv = (s_f16){0} + mu;
    for (size_t c0 = 0; c0 < n; c0 += 1024) {
        const size_t len = n - c0 < 1024 ? n - c0 : 1024;
        const float *restrict xc = x + c0;
        s_f16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, v0, v1, v2, v3;
        size_t j = 0;
        for (; j + 64 <= len; j += 64) {
            S_F16_LOAD(v0, xc + j);
            S_F16_LOAD(v1, xc + j + 16);
            S_F16_LOAD(v2, xc + j + 32);
            S_F16_LOAD(v3, xc + j + 48);
            if (sq) {
                v0 -= mv, v1 -= mv, v2 -= mv, v3 -= mv;
                v0 *= v0, v1 *= v1, v2 *= v2, v3 *= v3;
            }
            a0 += v0, a1 += v1, a2 += v2, a3 += v3;
        }
        for (; j + 16 <= len; j += 16) {
            S_F16_LOAD(v0, xc + j);
            if (sq) {
                v0 -= mv;
                v0 *= v0;
            }
            a0 += v0;
        }
        float t = 0.0f;
        for (; j < len; j++)
            t += sq ? (xc[j] - mu) * (xc[j] - mu) : xc[j];
        a0 = (a0 + a1) + (a2 + a3);
        /* lane i += lane i + w for w 8, 4, 2, 1, in registers (lane 0
         * ends with the tree; the other lanes' sums are not used) */
        /* (__builtin_shufflevector: GCC 12 and clang alike; GCC's own
         * __builtin_shuffle is not clang's, which builds the fuzzers) */
        a0 += __builtin_shufflevector(a0, a0, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12,
                                      13, 14, 15);
        a0 += __builtin_shufflevector(a0, a0, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
        a0 += __builtin_shufflevector(a0, a0, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
        a0 += __builtin_shufflevector(a0, a0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
        total += (double)a0[0] + (double)t;
    }
    return total;
}

/* Layer norm's backward row sums with gamma (sp 1), sg = sum dy g and sgx
 * = sum dy g xhat (xhat = (x - mean) rstd, each term the float product
 * as before), both in one pass in s_fsum's order: 4 vectors of 16 float
 * lanes over a chunk of at most 1,024 floats, 16-float steps into the
 * first, the last n mod 16 in a scalar, the vectors pairwise and the lanes
 * in a tree of halves, the chunk and the scalar into a double. In the
 * same pass the parameters' terms, dg[j] += fault dy xhat and db[j] +=
 * fault dy (the same operations per element as a loop of their own: the
 * same bits). LANE_SUM's 8 double lanes took two passes of len / 8
 * dependent adds each (docs/performance.md, gpt21). */
static inline __attribute__((always_inline)) void
s_fsum_dy(const float *restrict x, const float *restrict dy, const float *restrict g, size_t n,
          float mean, float rstd, float *restrict dg, float *restrict db, float fault,
          double *sg_out, double *sgx_out) {
    double sg = 0.0, sgx = 0.0;
    const s_f16 mv = (s_f16){0} + mean, rv = (s_f16){0} + rstd, fv = (s_f16){0} + fault;
    for (size_t c0 = 0; c0 < n; c0 += 1024) {
        const size_t len = n - c0 < 1024 ? n - c0 : 1024;
        s_f16 a[4] = {{0}}, b[4] = {{0}};
        size_t j = 0;
        /* one 16-float step into lanes v: its terms, and dg's and db's */
#define S_DY_STEP(v, at)                                                                  \
    do {                                                                                  \
        s_f16 x_, d_, g_, h_, t_;                                                         \
        S_F16_LOAD(x_, x + (at));                                                         \
        S_F16_LOAD(d_, dy + (at));                                                        \
        S_F16_LOAD(g_, g + (at));                                                         \
        h_ = (x_ - mv) * rv;                                                              \
        t_ = d_ * g_;                                                                     \
        a[v] += t_;                                                                       \
        b[v] += t_ * h_;                                                                  \
        if (dg) {                                                                         \
            s_f16 p_;                                                                     \
            S_F16_LOAD(p_, dg + (at));                                                    \
            p_ += fv * (d_ * h_);                                                         \
            memcpy(dg + (at), &p_, sizeof(s_f16));                                        \
        }                                                                                 \
        if (db) {                                                                         \
            s_f16 p_;                                                                     \
            S_F16_LOAD(p_, db + (at));                                                    \
            p_ += fv * d_;                                                                \
            memcpy(db + (at), &p_, sizeof(s_f16));                                        \
        }                                                                                 \
    } while (0)
        for (; j + 64 <= len; j += 64) {
            S_DY_STEP(0, c0 + j);
            S_DY_STEP(1, c0 + j + 16);
            S_DY_STEP(2, c0 + j + 32);
            S_DY_STEP(3, c0 + j + 48);
        }
        for (; j + 16 <= len; j += 16)
            S_DY_STEP(0, c0 + j);
#undef S_DY_STEP
        float tg = 0.0f, tgx = 0.0f;
        for (; j < len; j++) {
            const size_t e = c0 + j;
            const float h = (x[e] - mean) * rstd, t = dy[e] * g[e];
            tg += t;
            tgx += t * h;
            if (dg)
                dg[e] += fault * (dy[e] * h);
            if (db)
                db[e] += fault * dy[e];
        }
        s_f16 u = (a[0] + a[1]) + (a[2] + a[3]), w = (b[0] + b[1]) + (b[2] + b[3]);
        /* s_fsum's tree of halves, both sums side by side */
        u += __builtin_shufflevector(u, u, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13,
                                     14, 15);
        w += __builtin_shufflevector(w, w, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13,
                                     14, 15);
        u += __builtin_shufflevector(u, u, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
        w += __builtin_shufflevector(w, w, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
        u += __builtin_shufflevector(u, u, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
        w += __builtin_shufflevector(w, w, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
        u += __builtin_shufflevector(u, u, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
        w += __builtin_shufflevector(w, w, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
        sg += (double)u[0] + (double)tg;
        sgx += (double)w[0] + (double)tgx;
    }
    *sg_out = sg;
    *sgx_out = sgx;
}

/* A row's mean and 1 / sqrt(var + eps), biased variance (two passes: the
 * mean, rounded to float, then the squared deviations from it); forced
 * inline, as s_row_sums, so that each ISA's clone of a caller has its own
 * copy (an outlined one would be the baseline's). */
static inline __attribute__((always_inline)) void
s_stats(const float *restrict x, size_t len, float eps, float *mean, float *rstd) {
    const float mu = (float)(s_fsum(x, len, 0, 0.0f) / (double)len);
    const double q = s_fsum(x, len, 1, mu);
    *mean = mu;
    *rstd = (float)(1.0 / sqrt(q / (double)len + (double)eps));
}

/* The workspace (when the call has one): each row's mean and 1/std, from
 * the forward to the backward; without one the backward recomputes them. */
size_t tp_cpu_norm_workspace(const tp_op_call_t *c) {
    /* and the backward's partial sums: [blocks, parameters] for gamma and
     * for beta (tp_cpu_norm_backward) */
    const tp_norm_rows_t r = tp_norm_rows(c);
    const size_t block = r.len >= 16384 ? 1 : 16384 / (r.len ? r.len : 1);
    const size_t np = r.groups * r.len / r.sp;
    return (2 * r.rows + 2 * ((r.rows + block - 1) / block) * np) * sizeof(float);
}

static float *s_saved(const tp_op_call_t *c, size_t rows) {
    if (!c->workspace || (c->workspace_bytes && c->workspace_bytes < 2 * rows * sizeof(float)))
        return NULL;
    return c->workspace;
}

typedef struct {
    const tp_op_call_t *c;
    tp_norm_rows_t r;
    const float *gamma, *beta;
    float *saved;
} s_fwd_t;

/* Rows [lo, hi) of the forward: each row from its own inputs, so any cut
 * over the pool gives the same bits. */
TP_CPU_CLONES static void s_forward_rows(void *arg, size_t lo, size_t hi) {
    const s_fwd_t *f = arg;
    const tp_norm_rows_t r = f->r;
    const float *x = f->c->x[0], *gamma = f->gamma, *beta = f->beta;
    float *y = f->c->y, *saved = f->saved;
    for (size_t i = lo; i < hi; i++) {
        const float *restrict xr = x + i * r.len;
        float *restrict yr = y + i * r.len;
        float mean, rstd;
        s_stats(xr, r.len, f->c->attr->eps, &mean, &rstd);
        if (saved) {
            saved[2 * i] = mean;
            saved[2 * i + 1] = rstd;
        }
        /* the row's parameters: p0 + j / sp */
        const size_t p0 = (i % r.groups) * r.len / r.sp;
        const float *restrict g = gamma ? gamma + p0 : NULL;
        const float *restrict b = beta ? beta + p0 : NULL;
        if (!g || !b) { /* a parameter left out: 1 for gamma, 0 for beta */
            for (size_t j = 0; j < r.len; j++)
                yr[j] = (xr[j] - mean) * rstd * (g ? g[j / r.sp] : 1.0f) +
                        (b ? b[j / r.sp] : 0.0f);
        } else if (r.sp == 1) {
            for (size_t j = 0; j < r.len; j++)
                yr[j] = (xr[j] - mean) * rstd * g[j] + b[j];
        } else {
            for (size_t ch = 0; ch < r.len / r.sp; ch++) {
                const float sc = rstd * g[ch], sh = b[ch] - mean * sc;
                for (size_t j = ch * r.sp; j < (ch + 1) * r.sp; j++)
                    yr[j] = xr[j] * sc + sh;
            }
        }
    }
}

tp_status_t tp_cpu_norm_forward(const tp_op_call_t *c) {
    int gi, bi;
    tp_norm_params(c->attr, &gi, &bi);
    s_fwd_t f = {.c = c, .r = tp_norm_rows(c), .gamma = gi < 0 ? NULL : c->x[gi],
                 .beta = bi < 0 ? NULL : c->x[bi]};
    f.saved = s_saved(c, f.r.rows);
    /* rows over the pool: a part is at least 16k floats */
    const size_t min_rows = f.r.len ? (16384 + f.r.len - 1) / f.r.len : 1;
    tp_cpu_parallel(f.r.rows, 1, min_rows, s_forward_rows, &f);
    return TP_OK;
}

/* One row's backward sums: over the row, sg = sum dy gamma and sgx = sum
 * dy gamma xhat; per parameter, dy xhat into dg and dy into db (each
 * added in float, rows in order). */
static inline __attribute__((always_inline)) void
s_row_sums(const float *restrict xr, const float *restrict dyr, const float *restrict g,
           size_t len, size_t sp, float mean, float rstd, float *restrict dg,
           float *restrict db, float fault, double *sg_out, double *sgx_out) {
    double sg = 0.0, sgx = 0.0;
    if (!g) { /* no gamma: dy itself (the parameter sums as group norm's) */
        LANE_SUM(sg, len, dyr[j]);
        LANE_SUM(sgx, len, dyr[j] * ((xr[j] - mean) * rstd));
        if (db)
            for (size_t ch = 0; ch < len / sp; ch++) {
                double tb;
                LANE_SUM(tb, sp, dyr[ch * sp + j]);
                db[ch] += fault * (float)tb;
            }
    } else if (sp == 1) { /* layer norm: a parameter per element */
        if (dg && db)
            s_fsum_dy(xr, dyr, g, len, mean, rstd, dg, db, fault, &sg, &sgx);
        else if (dg)
            s_fsum_dy(xr, dyr, g, len, mean, rstd, dg, NULL, fault, &sg, &sgx);
        else if (db)
            s_fsum_dy(xr, dyr, g, len, mean, rstd, NULL, db, fault, &sg, &sgx);
        else
            s_fsum_dy(xr, dyr, g, len, mean, rstd, NULL, NULL, fault, &sg, &sgx);
    } else { /* group norm: a parameter per channel of sp positions */
        for (size_t ch = 0; ch < len / sp; ch++) {
            const float *restrict xc = xr + ch * sp, *restrict dc = dyr + ch * sp;
            double tg, tb;
            LANE_SUM(tg, sp, dc[j] * ((xc[j] - mean) * rstd));
            LANE_SUM(tb, sp, dc[j]);
            sg += tb * g[ch];
            sgx += tg * g[ch];
            if (dg)
                dg[ch] += fault * (float)tg;
            if (db)
                db[ch] += fault * (float)tb;
        }
    }
    *sg_out = sg;
    *sgx_out = sgx;
}

/* The backward in two passes over the pool (it was serial: the
 * parameters' gradients add the rows in order). Pass 1 cuts the rows in
 * blocks of a fixed size (about 16k floats of x, from the shape alone):
 * each row's dx needs only its own sums, and each block adds its rows'
 * parameter terms in row order into a partial sum of its own. Pass 2 adds
 * the blocks' partials in block order for each parameter. The cut into
 * blocks does not depend on the thread count, so neither do the bits. */
typedef struct {
    const tp_op_call_t *c;
    tp_norm_rows_t r;
    const float *gamma, *stats; /* stats: [rows, 2] mean and 1/std */
    float *dg, *db;             /* [np] the parameters' gradients, or NULL */
    float *pg, *pb;             /* [nblocks, np] the blocks' partial sums */
    size_t block, nblocks, np;  /* rows a block */
    float fault;
} s_bwd_t;

/* Rows a block: about 16k floats of x. */
static size_t s_block_rows(const tp_norm_rows_t *r) {
    return r->len >= 16384 ? 1 : 16384 / (r->len ? r->len : 1);
}

TP_CPU_CLONES static void s_backward_blocks(void *arg, size_t lo, size_t hi) {
    const s_bwd_t *B = arg;
    const tp_op_call_t *c = B->c;
    const tp_norm_rows_t r = B->r;
    const float *x = c->x[0], *dy = c->dy;
    float *dx = c->dx[0];
    const int acc0 = dx && c->dx_acc[0];
    const float fault = B->fault;
    for (size_t blk = lo; blk < hi; blk++) {
        float *pg = B->pg ? B->pg + blk * B->np : NULL, *pb = B->pb ? B->pb + blk * B->np : NULL;
        if (pg)
            memset(pg, 0, B->np * sizeof(float));
        if (pb)
            memset(pb, 0, B->np * sizeof(float));
        const size_t i1 = (blk + 1) * B->block < r.rows ? (blk + 1) * B->block : r.rows;
        for (size_t i = blk * B->block; i < i1; i++) {
            const float *restrict xr = x + i * r.len, *restrict dyr = dy + i * r.len;
            const size_t p0 = (i % r.groups) * r.len / r.sp;
            const float *restrict g = B->gamma ? B->gamma + p0 : NULL;
            const float mean = B->stats[2 * i], rstd = B->stats[2 * i + 1];
            double sg, sgx;
            s_row_sums(xr, dyr, g, r.len, r.sp, mean, rstd, pg ? pg + p0 : NULL,
                       pb ? pb + p0 : NULL, fault, &sg, &sgx);
            if (!dx)
                continue;
            /* dx = rstd (dy gamma - mean(dy gamma) - xhat mean(dy gamma xhat)) */
            const float mg = (float)(sg / (double)r.len), mgx = (float)(sgx / (double)r.len);
            float *restrict dxr = dx + i * r.len;
            /* one straight loop per case, so that each vectorises */
            const float k = fault * rstd;
            if (!g) { /* no gamma: dy in its place */
                for (size_t j = 0; j < r.len; j++) {
                    const float v = k * (dyr[j] - mg - (xr[j] - mean) * rstd * mgx);
                    dxr[j] = acc0 ? dxr[j] + v : v;
                }
            } else if (r.sp == 1 && acc0) {
                for (size_t j = 0; j < r.len; j++)
                    dxr[j] += k * (dyr[j] * g[j] - mg - (xr[j] - mean) * rstd * mgx);
            } else if (r.sp == 1) {
                for (size_t j = 0; j < r.len; j++)
                    dxr[j] = k * (dyr[j] * g[j] - mg - (xr[j] - mean) * rstd * mgx);
            } else {
                for (size_t ch = 0; ch < r.len / r.sp; ch++) {
                    const float gc = g[ch];
                    float *restrict dc = dxr + ch * r.sp;
                    const float *restrict xc = xr + ch * r.sp, *restrict yc = dyr + ch * r.sp;
                    if (acc0)
                        for (size_t j = 0; j < r.sp; j++)
                            dc[j] += k * (yc[j] * gc - mg - (xc[j] - mean) * rstd * mgx);
                    else
                        for (size_t j = 0; j < r.sp; j++)
                            dc[j] = k * (yc[j] * gc - mg - (xc[j] - mean) * rstd * mgx);
                }
            }
        }
    }
}

/* Parameters [lo, hi): the blocks' partials added in block order. */
TP_CPU_CLONES static void s_backward_params(void *arg, size_t lo, size_t hi) {
    const s_bwd_t *B = arg;
    for (int w = 0; w < 2; w++) {
        float *restrict out = w ? B->db : B->dg;
        const float *part = w ? B->pb : B->pg;
        if (!out)
            continue;
        for (size_t blk = 0; blk < B->nblocks; blk++) {
            const float *restrict pp = part + blk * B->np;
            for (size_t P = lo; P < hi; P++)
                out[P] += pp[P];
        }
    }
}

/* Each row's statistics, when the forward left none (the parity harness). */
TP_CPU_CLONES static void s_stats_rows(void *arg, size_t lo, size_t hi) {
    const s_bwd_t *B = arg;
    float *st = (float *)B->stats;
    for (size_t i = lo; i < hi; i++)
        s_stats((const float *)B->c->x[0] + i * B->r.len, B->r.len, B->c->attr->eps,
                &st[2 * i], &st[2 * i + 1]);
}

tp_status_t tp_cpu_norm_backward(const tp_op_call_t *c) {
    const tp_norm_rows_t r = tp_norm_rows(c);
    int gi, bi;
    tp_norm_params(c->attr, &gi, &bi);
    s_bwd_t B = {.c = c, .r = r, .gamma = gi < 0 ? NULL : c->x[gi],
                 .dg = gi < 0 ? NULL : c->dx[gi], .db = bi < 0 ? NULL : c->dx[bi],
                 .block = s_block_rows(&r), .np = r.groups * r.len / r.sp,
                 /* the gradient checks' deliberate fault (ops_elementwise.h; 1 outside them) */
                 .fault = tp_cpu_elementwise_grad_fault};
    B.nblocks = (r.rows + B.block - 1) / B.block;
    const int acc_g = gi < 0 ? 0 : c->dx_acc[gi], acc_b = bi < 0 ? 0 : c->dx_acc[bi];
    /* the workspace: the forward's statistics, then the blocks' partials
     * (tp_cpu_norm_workspace); a call with less has its own */
    const size_t nstats = 2 * r.rows, npart = (B.dg != NULL) + (B.db != NULL);
    const size_t need = (nstats + npart * B.nblocks * B.np) * sizeof(float);
    float *ws = s_saved(c, r.rows), *own = NULL;
    const int have_stats = ws != NULL;
    if (!ws || c->workspace_bytes < need) {
        if (!(own = malloc(need ? need : sizeof(float))))
            return tp_error(TP_ERR_NOMEM, "%s: %zu bytes for the norm's backward",
                            c->name ? c->name : tp_op_name(c->kind), need);
        if (have_stats)
            memcpy(own, ws, nstats * sizeof(float));
        ws = own;
    }
    B.stats = ws;
    B.pg = B.dg ? ws + nstats : NULL;
    B.pb = B.db ? ws + nstats + (B.dg ? B.nblocks * B.np : 0) : NULL;
    if (!have_stats) /* a part is at least 16k floats of x */
        tp_cpu_parallel(r.rows, 1, B.block, s_stats_rows, &B);
    if (c->dx[0] || B.dg || B.db)
        tp_cpu_parallel(B.nblocks, 1, 1, s_backward_blocks, &B);
    if (B.dg && !acc_g)
        memset(B.dg, 0, B.np * sizeof(float));
    if (B.db && !acc_b)
        memset(B.db, 0, B.np * sizeof(float));
    if (B.dg || B.db)
        tp_cpu_parallel(B.np, 16, 16384 / (B.nblocks ? B.nblocks : 1) + 1, s_backward_params,
                        &B);
    free(own);
    return TP_OK;
}

/* ---- batch norm, plain NCHW (ops_cpu.c's dispatch; the nChw16c chains
 * run oneDNN's, dnnl_bnorm.c) ------------------------------------------- */

/* The channels over the pool, each channel whole on one thread: its
 * statistics, its parameters' gradients and its dx come from its own
 * [n, sp] slice alone, so the bits do not depend on the cut or the thread
 * count. A channel of cnn-bn (128 x 784 floats, 400 kB; 800 kB with dy)
 * stays in a core's L2 between its passes, so the second pass over x (the
 * squared deviations, torch's two-pass variance) and the dx pass after
 * the backward's sums read from cache, not memory. The sums run in
 * BN_LANES float lanes over chunks of at most BN_CHUNK floats of a row
 * (a chunk's tail adds into lane j mod BN_LANES), each chunk's lanes then
 * added in lane order into a double: the loops are plain float vector
 * adds, a float lane adds at most 64 numbers, and every ISA clone adds
 * the same numbers in the same order. */
#define BN_LANES 16
#define BN_CHUNK 1024

/* Sixteen float lanes as one GCC vector: one zmm in the AVX-512 clone,
 * two ymm or four xmm in the others, the same adds in each lane (plain
 * loops over a lane array let GCC's vectoriser interleave them with
 * permutes, slower than the scalar code). Loaded with memcpy: unaligned. */
typedef float s_bn_v __attribute__((vector_size(BN_LANES * sizeof(float))));

#define S_BN_LOAD(v, p) memcpy(&(v), (p), sizeof(s_bn_v))

/* Over a row of n floats, chunk by chunk, each chunk's lanes added in
 * lane order into doubles: *s0 += sum d (what 0: d; 1: (d - mu)^2;
 * 2: d and, into *s1, d (r - mu)). */
static inline __attribute__((always_inline)) void
s_bn_row_sums(int what, const float *restrict d, const float *restrict r, size_t n, float mu,
              double *s0, double *s1) {
    const s_bn_v muv = (s_bn_v){0} + mu;
    for (size_t c0 = 0; c0 < n; c0 += BN_CHUNK) {
        const size_t len = n - c0 < BN_CHUNK ? n - c0 : BN_CHUNK;
        const float *restrict dc = d + c0;
        s_bn_v l0 = {0}, l1 = {0};
        size_t j = 0;
        if (what == 0) {
            for (; j + BN_LANES <= len; j += BN_LANES) {
                s_bn_v dv;
                S_BN_LOAD(dv, dc + j);
                l0 += dv;
            }
            for (; j < len; j++)
                l0[j % BN_LANES] += dc[j];
        } else if (what == 1) {
            for (; j + BN_LANES <= len; j += BN_LANES) {
                s_bn_v e;
                S_BN_LOAD(e, dc + j);
                e -= muv;
                l0 += e * e;
            }
            for (; j < len; j++)
                l0[j % BN_LANES] += (dc[j] - mu) * (dc[j] - mu);
        } else {
            const float *restrict rc = r + c0;
            for (; j + BN_LANES <= len; j += BN_LANES) {
                s_bn_v dv, rv;
                S_BN_LOAD(dv, dc + j);
                S_BN_LOAD(rv, rc + j);
                l0 += dv;
                l1 += dv * (rv - muv);
            }
            for (; j < len; j++) {
                l0[j % BN_LANES] += dc[j];
                l1[j % BN_LANES] += dc[j] * (rc[j] - mu);
            }
        }
        for (int q = 0; q < BN_LANES; q++) {
            *s0 += (double)l0[q];
            *s1 += (double)l1[q];
        }
    }
}

typedef struct {
    const tp_op_call_t *c;
    size_t n, ch, sp;
} s_bn_t;

static s_bn_t s_bn_geometry(const tp_op_call_t *c) {
    const tp_shape_t *s = &c->xshape[0];
    s_bn_t b = {.c = c, .n = (size_t)s->d[0], .ch = s->ndim > 1 ? (size_t)s->d[1] : 1, .sp = 1};
    for (int i = 2; i < s->ndim; i++)
        b.sp *= (size_t)s->d[i];
    return b;
}

/* Channels [lo, hi) of the forward. */
TP_CPU_CLONES static void s_bn_forward_channels(void *arg, size_t lo, size_t hi) {
    const s_bn_t *B = arg;
    const tp_op_call_t *c = B->c;
    const tp_op_attr_t *a = c->attr;
    const size_t n = B->n, ch = B->ch, sp = B->sp, stride = ch * sp;
    const float *x = c->x[0], *g = c->x[1], *be = c->x[2];
    float *y = c->y, *mean = c->workspace, *inv = mean + ch;
    float *mm = c->state[0], *mv = c->state[1];
    const int relu = a->act == TP_ACT_RELU;
    const double m = (double)(n * sp);
    for (size_t k = lo; k < hi; k++) {
        const float *xk = x + k * sp;
        float mu, is;
        if (a->training) {
            /* the sum, then the squared deviations from the mean (the
             * channel again, from L2); `unused` takes the lanes l1 that
             * these two cases leave at 0 */
            double s = 0.0, v = 0.0, unused = 0.0;
            for (size_t i = 0; i < n; i++)
                s_bn_row_sums(0, xk + i * stride, NULL, sp, 0.0f, &s, &unused);
            const double mu_d = s / m;
            for (size_t i = 0; i < n; i++)
                s_bn_row_sums(1, xk + i * stride, NULL, sp, (float)mu_d, &v, &unused);
            const double var = v / m;
            mu = (float)mu_d;
            is = (float)(1.0 / sqrt(var + (double)a->eps));
            if (a->update_state) {
                const double unbiased = m > 1 ? var * m / (m - 1) : var;
                mm[k] = a->alpha * mm[k] + (1.0f - a->alpha) * mu;
                mv[k] = a->alpha * mv[k] + (1.0f - a->alpha) * (float)unbiased;
            }
        } else {
            mu = mm[k];
            is = 1.0f / sqrtf(mv[k] + a->eps);
        }
        mean[k] = mu;
        inv[k] = is;
        /* normalise, scale and shift in one multiply-add, the folded relu
         * in the same pass */
        const float sc = g[k] * is, sh = be[k] - mu * sc;
        for (size_t i = 0; i < n; i++) {
            const float *restrict r = xk + i * stride;
            float *restrict yr = y + k * sp + i * stride;
            if (relu)
                for (size_t j = 0; j < sp; j++) {
                    const float v = r[j] * sc + sh;
                    yr[j] = v > 0.0f ? v : 0.0f;
                }
            else
                for (size_t j = 0; j < sp; j++)
                    yr[j] = r[j] * sc + sh;
        }
    }
}

/* Channels [lo, hi) of the backward: sum dy and sum dy (x - mean) in one
 * pass over dy and x, then dx in one more (from L2). */
TP_CPU_CLONES static void s_bn_backward_channels(void *arg, size_t lo, size_t hi) {
    const s_bn_t *B = arg;
    const tp_op_call_t *c = B->c;
    const size_t n = B->n, ch = B->ch, sp = B->sp, stride = ch * sp;
    const float *x = c->x[0], *g = c->x[1], *dy = c->dy;
    const float *mean = c->workspace, *inv = mean + ch;
    const float m = (float)(n * sp);
    const int training = c->attr->training, acc = c->dx[0] && c->dx_acc[0];
    float *dx = c->dx[0];
    for (size_t k = lo; k < hi; k++) {
        const float *xk = x + k * sp, *dk = dy + k * sp;
        const float mu = mean[k], is = inv[k];
        /* the two sums in one pass over dy and x */
        double sdy = 0.0, sdyx = 0.0;
        for (size_t i = 0; i < n; i++)
            s_bn_row_sums(2, dk + i * stride, xk + i * stride, sp, mu, &sdy, &sdyx);
        const float dbeta = (float)sdy, dgamma = (float)(sdyx * is);
        if (c->dx[1])
            c->dx[1][k] = (c->dx_acc[1] ? c->dx[1][k] : 0.0f) + dgamma;
        if (c->dx[2])
            c->dx[2][k] = (c->dx_acc[2] ? c->dx[2][k] : 0.0f) + dbeta;
        if (!dx)
            continue;
        /* training: dx = g is / m (m dy - dbeta - xhat dgamma) */
        const float a = g[k] * is;
        const float b = training ? a * dbeta / m : 0.0f;
        const float cc = training ? a * dgamma * is / m : 0.0f;
        for (size_t i = 0; i < n; i++) {
            const float *restrict r = xk + i * stride, *restrict d = dk + i * stride;
            float *restrict o = dx + k * sp + i * stride;
            if (acc)
                for (size_t j = 0; j < sp; j++)
                    o[j] += a * d[j] - b - cc * (r[j] - mu);
            else
                for (size_t j = 0; j < sp; j++)
                    o[j] = a * d[j] - b - cc * (r[j] - mu);
        }
    }
}

/* Channels a part: at least 16k floats of x. */
static size_t s_bn_min_channels(const s_bn_t *B) {
    const size_t per = B->n * B->sp > 0 ? B->n * B->sp : 1;
    return (16384 + per - 1) / per;
}

/* A pass over the channels (fn: the forward's or the backward's), the
 * workspace checked first: the forward leaves each channel's mean and
 * 1/std there, the backward reads them. */
static tp_status_t s_bn_pass(const tp_op_call_t *c, tp_cpu_range_fn fn) {
    s_bn_t B = s_bn_geometry(c);
    if (!c->workspace)
        return tp_error(TP_ERR_INVALID, "%s: batch norm without its workspace (2 x %zu floats)",
                        c->name ? c->name : "batch_norm", B.ch);
    tp_cpu_parallel(B.ch, 1, s_bn_min_channels(&B), fn, &B);
    return TP_OK;
}

tp_status_t tp_cpu_bnorm_forward(const tp_op_call_t *c) {
    return s_bn_pass(c, s_bn_forward_channels);
}

tp_status_t tp_cpu_bnorm_backward(const tp_op_call_t *c) {
    return s_bn_pass(c, s_bn_backward_channels);
}
