/* towerpack gpu: layer, group and instance norm on the CPU (docs/ops.md,
 * the linalg family).
 *
 * All three normalise contiguous rows of x: layer norm a row per slice of
 * its last axes (length D), group norm a row per (sample, group) of
 * C/G channels times the positions S (instance norm: G = C). gamma and
 * beta index the same way for both: element j of row r reads parameter
 * ((r mod G) L + j) / S, with G = S = 1 for layer norm. Statistics are
 * summed in double (mean first, then the squared deviations, as torch's
 * two-pass variance) and recomputed by the backward, so the op keeps no
 * state between its passes. The parameters' gradients add each row's
 * per-parameter sums (in double) in row order: deterministic. */
#include <math.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_norm.h"

int tp_cpu_norm_kind(tp_op_kind_t k) {
    return k == TP_OP_LAYER_NORM || k == TP_OP_GROUP_NORM || k == TP_OP_INSTANCE_NORM;
}

/* Rows, their length, groups per sample and positions per channel. */
typedef struct {
    size_t rows, len, groups, sp;
} s_rows_t;

static s_rows_t s_rows(const tp_op_call_t *c) {
    const tp_shape_t *x = &c->xshape[0];
    const size_t n = tp_shape_count(x);
    s_rows_t r = {0, 1, 1, 1};
    if (c->kind == TP_OP_LAYER_NORM) {
        for (int i = x->ndim - c->attr->norm_axes; i < x->ndim; i++)
            r.len *= (size_t)x->d[i];
    } else {
        for (int i = 2; i < x->ndim; i++)
            r.sp *= (size_t)x->d[i];
        r.groups = (size_t)c->attr->norm_groups;
        r.len = (size_t)x->d[1] / r.groups * r.sp;
    }
    r.rows = r.len ? n / r.len : 0;
    return r;
}

/* A row's mean and 1 / sqrt(var + eps), biased variance. */
static void s_stats(const float *x, size_t len, float eps, float *mean, float *rstd) {
    double s = 0.0, q = 0.0;
    for (size_t j = 0; j < len; j++)
        s += x[j];
    const double mu = s / (double)len;
    for (size_t j = 0; j < len; j++) {
        const double d = x[j] - mu;
        q += d * d;
    }
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(q / (double)len + (double)eps));
}

tp_status_t tp_cpu_norm_forward(const tp_op_call_t *c) {
    const s_rows_t r = s_rows(c);
    const float *x = c->x[0], *gamma = c->x[1], *beta = c->x[2];
    float *y = c->y;
    for (size_t i = 0; i < r.rows; i++) {
        const float *xr = x + i * r.len;
        float *yr = y + i * r.len;
        float mean, rstd;
        s_stats(xr, r.len, c->attr->eps, &mean, &rstd);
        /* the row's parameters: p0 + j / sp */
        const float *g = gamma + (i % r.groups) * r.len / r.sp;
        const float *b = beta + (i % r.groups) * r.len / r.sp;
        if (r.sp == 1) {
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
    return TP_OK;
}

tp_status_t tp_cpu_norm_backward(const tp_op_call_t *c) {
    const s_rows_t r = s_rows(c);
    const float *x = c->x[0], *gamma = c->x[1], *dy = c->dy;
    float *dx = c->dx[0], *dg = c->dx[1], *db = c->dx[2];
    const int acc0 = dx && c->dx_acc[0];
    const size_t np = r.groups * r.len / r.sp;
    /* the gradient checks' deliberate fault (ops_elementwise.h; 1 outside them) */
    const float fault = tp_cpu_elementwise_grad_fault;
    if (dg && !c->dx_acc[1])
        memset(dg, 0, np * sizeof(float));
    if (db && !c->dx_acc[2])
        memset(db, 0, np * sizeof(float));
    for (size_t i = 0; i < r.rows; i++) {
        const float *xr = x + i * r.len, *dyr = dy + i * r.len;
        const size_t p0 = (i % r.groups) * r.len / r.sp;
        const float *g = gamma + p0;
        float mean, rstd;
        s_stats(xr, r.len, c->attr->eps, &mean, &rstd);
        /* the row's sums of dy gamma and dy gamma xhat; per parameter,
         * dy xhat and dy */
        double sg = 0.0, sgx = 0.0;
        for (size_t ch = 0; ch < r.len / r.sp; ch++) {
            double pg = 0.0, pb = 0.0;
            for (size_t j = ch * r.sp; j < (ch + 1) * r.sp; j++) {
                const float xh = (xr[j] - mean) * rstd;
                pg += (double)dyr[j] * xh;
                pb += dyr[j];
            }
            sg += pb * g[ch];
            sgx += pg * g[ch];
            if (dg)
                dg[p0 + ch] += fault * (float)pg;
            if (db)
                db[p0 + ch] += fault * (float)pb;
        }
        if (!dx)
            continue;
        /* dx = rstd (dy gamma - mean(dy gamma) - xhat mean(dy gamma xhat)) */
        const float mg = (float)(sg / (double)r.len), mgx = (float)(sgx / (double)r.len);
        float *dxr = dx + i * r.len;
        for (size_t ch = 0; ch < r.len / r.sp; ch++) {
            const float gc = g[ch];
            for (size_t j = ch * r.sp; j < (ch + 1) * r.sp; j++) {
                const float xh = (xr[j] - mean) * rstd;
                const float v = fault * rstd * (dyr[j] * gc - mg - xh * mgx);
                dxr[j] = acc0 ? dxr[j] + v : v;
            }
        }
    }
    return TP_OK;
}
