/* towerpack gpu: layer, group and instance norm on the CPU (docs/ops.md,
 * the linalg family).
 *
 * All three normalise contiguous rows of x: layer norm a row per slice of
 * its last axes (length D), group norm a row per (sample, group) of
 * C/G channels times the positions S (instance norm: G = C). gamma and
 * beta index the same way for both: element j of row r reads parameter
 * ((r mod G) L + j) / S, with G = S = 1 for layer norm. Statistics are
 * summed in double in fixed lanes (LANE_SUM: the mean first, then the
 * squared deviations, as torch's two-pass variance), so that the loops
 * vectorise.
 * The forward leaves each row's mean and 1/std in the workspace for the
 * backward; a call without one (the parity harness's) recomputes them.
 * The parameters' gradients add each row's per-parameter sums in row
 * order: deterministic. The backward's rows (dx) and then its parameters
 * (dgamma, dbeta) are cut over the pool, each with the bits of one thread. A gamma left out reads as 1 and a beta as 0
 * (attr.norm_absent, elementwise_affine=False); the loops then take
 * their own branches rather than reading a ones vector. */
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


/* Sums run in LANES independent double accumulators, added in a fixed
 * order at the end: the loops vectorise (one accumulator would be one long
 * chain of dependent adds, twice as slow here; float lanes measured slower
 * still) and the result does not depend on the machine. */
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

/* A row's mean and 1 / sqrt(var + eps), biased variance (two passes);
 * forced inline, as s_row_sums, so that each ISA's clone of a caller has
 * its own copy (an outlined one would be the baseline's). */
static inline __attribute__((always_inline)) void
s_stats(const float *restrict x, size_t len, float eps, float *mean, float *rstd) {
    double s, q;
    LANE_SUM(s, len, x[j]);
    const double mu = s / (double)len;
    LANE_SUM(q, len, (x[j] - mu) * (x[j] - mu));
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(q / (double)len + (double)eps));
}

/* The workspace (when the call has one): each row's mean and 1/std, from
 * the forward to the backward; without one the backward recomputes them. */
size_t tp_cpu_norm_workspace(const tp_op_call_t *c) {
    return 2 * tp_norm_rows(c).rows * sizeof(float);
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
        LANE_SUM(sg, len, dyr[j] * g[j]);
        LANE_SUM(sgx, len, dyr[j] * g[j] * ((xr[j] - mean) * rstd));
        if (dg && db) {
            for (size_t j = 0; j < len; j++) {
                dg[j] += fault * (dyr[j] * ((xr[j] - mean) * rstd));
                db[j] += fault * dyr[j];
            }
        } else if (dg) {
            for (size_t j = 0; j < len; j++)
                dg[j] += fault * (dyr[j] * ((xr[j] - mean) * rstd));
        } else if (db) {
            for (size_t j = 0; j < len; j++)
                db[j] += fault * dyr[j];
        }
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
 * parameters' gradients add the rows in order). Pass 1 cuts the rows:
 * each row's dx needs only its own sums (sg, sgx). Pass 2 cuts the
 * parameters: each parameter adds its rows' terms in row order, the same
 * float adds the serial loop made, so the bits are those of one thread
 * (and of the serial code) whatever the cut. */
typedef struct {
    const tp_op_call_t *c;
    tp_norm_rows_t r;
    const float *gamma, *stats; /* stats: [rows, 2] mean and 1/std */
    float *dg, *db, fault;
} s_bwd_t;

TP_CPU_CLONES static void s_backward_rows(void *arg, size_t lo, size_t hi) {
    const s_bwd_t *B = arg;
    const tp_op_call_t *c = B->c;
    const tp_norm_rows_t r = B->r;
    const float *x = c->x[0], *dy = c->dy;
    float *dx = c->dx[0];
    const int acc0 = c->dx_acc[0];
    const float fault = B->fault;
    for (size_t i = lo; i < hi; i++) {
        const float *restrict xr = x + i * r.len, *restrict dyr = dy + i * r.len;
        const size_t p0 = (i % r.groups) * r.len / r.sp;
        const float *restrict g = B->gamma ? B->gamma + p0 : NULL;
        const float mean = B->stats[2 * i], rstd = B->stats[2 * i + 1];
        double sg, sgx;
        s_row_sums(xr, dyr, g, r.len, r.sp, mean, rstd, NULL, NULL, fault, &sg, &sgx);
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

/* Parameters [lo, hi) (index P = group * len/sp + channel): dy xhat into
 * dg[P], dy into db[P], over the rows of P's group in row order. */
TP_CPU_CLONES static void s_backward_params(void *arg, size_t lo, size_t hi) {
    const s_bwd_t *B = arg;
    const tp_norm_rows_t r = B->r;
    const float *x = B->c->x[0], *dy = B->c->dy;
    float *restrict dg = B->dg, *restrict db = B->db;
    const float fault = B->fault;
    const size_t per = r.len / r.sp; /* parameters a row */
    if (r.sp == 1) { /* a parameter per element of a row (layer norm): columns */
        for (size_t i = 0; i < r.rows; i++) {
            const size_t p0 = (i % r.groups) * per;
            if (p0 + per <= lo || p0 >= hi)
                continue;
            const size_t a = lo > p0 ? lo - p0 : 0, e = hi < p0 + per ? hi - p0 : per;
            const float *restrict xr = x + i * r.len, *restrict dyr = dy + i * r.len;
            const float mean = B->stats[2 * i], rstd = B->stats[2 * i + 1];
            float *restrict g = dg ? dg + p0 : NULL, *restrict b = db ? db + p0 : NULL;
            if (g && b) {
                for (size_t j = a; j < e; j++) {
                    g[j] += fault * (dyr[j] * ((xr[j] - mean) * rstd));
                    b[j] += fault * dyr[j];
                }
            } else if (g) {
                for (size_t j = a; j < e; j++)
                    g[j] += fault * (dyr[j] * ((xr[j] - mean) * rstd));
            } else if (b) {
                for (size_t j = a; j < e; j++)
                    b[j] += fault * dyr[j];
            }
        }
        return;
    }
    for (size_t P = lo; P < hi; P++) { /* a parameter per channel of sp positions */
        const size_t grp = P / per, ch = P % per;
        for (size_t i = grp; i < r.rows; i += r.groups) {
            const float *restrict xc = x + i * r.len + ch * r.sp;
            const float *restrict dc = dy + i * r.len + ch * r.sp;
            const float mean = B->stats[2 * i], rstd = B->stats[2 * i + 1];
            if (dg) {
                double tg;
                LANE_SUM(tg, r.sp, dc[j] * ((xc[j] - mean) * rstd));
                dg[P] += fault * (float)tg;
            }
            if (db) {
                double tb;
                LANE_SUM(tb, r.sp, dc[j]);
                db[P] += fault * (float)tb;
            }
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
                 /* the gradient checks' deliberate fault (ops_elementwise.h; 1 outside them) */
                 .fault = tp_cpu_elementwise_grad_fault};
    const int acc_g = gi < 0 ? 0 : c->dx_acc[gi], acc_b = bi < 0 ? 0 : c->dx_acc[bi];
    const size_t np = r.groups * r.len / r.sp;
    /* a part is at least 16k floats of x */
    const size_t min_rows = r.len ? (16384 + r.len - 1) / r.len : 1;
    float *own = NULL;
    B.stats = s_saved(c, r.rows);
    if (!B.stats) {
        if (!(own = malloc(2 * (r.rows ? r.rows : 1) * sizeof(float))))
            return tp_error(TP_ERR_NOMEM, "%s: %zu rows of norm statistics for the backward",
                            c->name ? c->name : tp_op_name(c->kind), r.rows);
        B.stats = own;
        tp_cpu_parallel(r.rows, 1, min_rows, s_stats_rows, &B);
    }
    if (c->dx[0])
        tp_cpu_parallel(r.rows, 1, min_rows, s_backward_rows, &B);
    if (B.dg && !acc_g)
        memset(B.dg, 0, np * sizeof(float));
    if (B.db && !acc_b)
        memset(B.db, 0, np * sizeof(float));
    if (B.dg || B.db) {
        const size_t per_param = r.rows / r.groups * r.sp; /* floats of x a parameter reads */
        const size_t min_p = per_param ? (16384 + per_param - 1) / per_param : np;
        tp_cpu_parallel(np, r.sp == 1 ? 16 : 1, min_p, s_backward_params, &B);
    }
    free(own);
    return TP_OK;
}
