/* towerpack gpu/cuda: layer, group and instance norm (docs/ops.md, the
 * linalg family).
 *
 * The rows are the CPU's (gpu/cpu/ops_norm.c): contiguous slices of x of
 * length L, parameter ((r mod G) L + j) / S for element j of row r. The
 * forward is one block a row: the mean, then the squared deviations (the
 * CPU's two passes), each summed in double and reduced in shared memory in
 * a fixed order, then the row's output. The backward's first kernel, one
 * block a row, recomputes the statistics (the op keeps nothing between its
 * passes), sums dy gamma and dy gamma xhat the same way and writes dx; it
 * leaves each row's mean and 1/std in the workspace for the second, one
 * block a parameter, which sums dy xhat and dy over the parameter's
 * elements (every row of layer norm; every sample's positions of a
 * channel for group norm) into dgamma and dbeta: no atomics, so every sum
 * is deterministic. A gamma left out (attr.norm_absent) reads as 1 and a
 * beta as 0: the kernels take NULL for them. */
#include <math.h>
#include "gpu/cuda/ops_norm.h"
#include "gpu/op_geometry.h"

#define NORM_THREADS 256
#define TP_NORM_LAUNCHED() TP_CUDA_CHECK(cudaGetLastError())

namespace {


/* The block's sum of v (all threads get it), in a fixed order. */
__device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = NORM_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    const double s = sh[0];
    __syncthreads();
    return s;
}

/* The row's float mean and 1 / sqrt(var + eps), as the CPU's s_stats. */
__device__ void row_stats(const float *xr, size_t len, float eps, double *sh,
                          float *mean, float *rstd) {
    double s = 0.0;
    for (size_t j = threadIdx.x; j < len; j += NORM_THREADS)
        s += xr[j];
    const double mu = block_sum(s, sh) / (double)len;
    double q = 0.0;
    for (size_t j = threadIdx.x; j < len; j += NORM_THREADS) {
        const double d = xr[j] - mu;
        q += d * d;
    }
    q = block_sum(q, sh);
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(q / (double)len + (double)eps));
}

__global__ void k_norm_fwd(const float *x, const float *gamma, const float *beta,
                           float *y, size_t len, size_t groups, size_t sp, float eps) {
    __shared__ double sh[NORM_THREADS];
    const size_t r = blockIdx.x;
    const float *xr = x + r * len;
    float *yr = y + r * len;
    float mean, rstd;
    row_stats(xr, len, eps, sh, &mean, &rstd);
    const size_t p0 = (r % groups) * len / sp;
    for (size_t j = threadIdx.x; j < len; j += NORM_THREADS) {
        const size_t p = p0 + j / sp;
        const float g = gamma ? gamma[p] : 1.0f, b = beta ? beta[p] : 0.0f;
        yr[j] = sp == 1 ? (xr[j] - mean) * rstd * g + b
                        : xr[j] * (rstd * g) + (b - mean * (rstd * g));
    }
}

__global__ void k_norm_bwd_x(const float *x, const float *gamma, const float *dy,
                             float *dx, int acc, float *stats, size_t len,
                             size_t groups, size_t sp, float eps) {
    __shared__ double sh[NORM_THREADS];
    const size_t r = blockIdx.x;
    const float *xr = x + r * len, *dyr = dy + r * len;
    float mean, rstd;
    row_stats(xr, len, eps, sh, &mean, &rstd);
    if (stats && threadIdx.x == 0) {
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
    }
    if (!dx)
        return;
    const size_t p0 = (r % groups) * len / sp;
    double sg = 0.0, sgx = 0.0;
    for (size_t j = threadIdx.x; j < len; j += NORM_THREADS) {
        const float g = gamma ? dyr[j] * gamma[p0 + j / sp] : dyr[j];
        sg += g;
        sgx += (double)g * ((xr[j] - mean) * rstd);
    }
    const float mg = (float)(block_sum(sg, sh) / (double)len);
    const float mgx = (float)(block_sum(sgx, sh) / (double)len);
    float *dxr = dx + r * len;
    for (size_t j = threadIdx.x; j < len; j += NORM_THREADS) {
        const float xh = (xr[j] - mean) * rstd;
        const float dg = gamma ? dyr[j] * gamma[p0 + j / sp] : dyr[j];
        const float v = rstd * (dg - mg - xh * mgx);
        dxr[j] = acc ? dxr[j] + v : v;
    }
}

/* Parameter p's sums: its elements are, for each of the rows / groups
 * samples, the sp positions of its channel in row (n groups + g). */
__global__ void k_norm_bwd_params(const float *x, const float *dy, const float *stats,
                                  float *dg, int acc_g, float *db, int acc_b,
                                  size_t rows, size_t len, size_t groups, size_t sp) {
    __shared__ double sh[NORM_THREADS];
    const size_t p = blockIdx.x;
    const size_t g = p * sp / len;                 /* the group */
    const size_t j0 = p * sp - g * len;            /* its first element in a row */
    const size_t per = rows / groups * sp;         /* elements of p */
    double pg = 0.0, pb = 0.0;
    for (size_t e = threadIdx.x; e < per; e += NORM_THREADS) {
        const size_t r = (e / sp) * groups + g, i = r * len + j0 + e % sp;
        const float xh = (x[i] - stats[2 * r]) * stats[2 * r + 1];
        pg += (double)dy[i] * xh;
        pb += dy[i];
    }
    pg = block_sum(pg, sh);
    pb = block_sum(pb, sh);
    if (threadIdx.x == 0) {
        if (dg)
            dg[p] = acc_g ? dg[p] + (float)pg : (float)pg;
        if (db)
            db[p] = acc_b ? db[p] + (float)pb : (float)pb;
    }
}

} // namespace

int tp_cuda_norm_kind(tp_op_kind_t k) {
    return k == TP_OP_LAYER_NORM || k == TP_OP_GROUP_NORM || k == TP_OP_INSTANCE_NORM;
}

size_t tp_cuda_norm_workspace(const tp_op_call_t *c) {
    return 2 * tp_norm_rows(c).rows * sizeof(float);
}

tp_status_t tp_cuda_norm_forward(tp_stream_t *s, const tp_op_call_t *c) {
    const tp_norm_rows_t r = tp_norm_rows(c);
    if (!r.rows || !r.len)
        return TP_OK;
    if (r.rows > 0x7fffffffu)
        return tp_error(TP_ERR_UNSUPPORTED, "%s: %zu rows (at most 2^31 - 1 blocks)",
                        c->name, r.rows);
    int gi, bi;
    tp_norm_params(c->attr, &gi, &bi);
    k_norm_fwd<<<(unsigned)r.rows, NORM_THREADS, 0, s->cu>>>(
        (const float *)c->x[0], gi < 0 ? NULL : (const float *)c->x[gi],
        bi < 0 ? NULL : (const float *)c->x[bi], (float *)c->y, r.len, r.groups, r.sp,
        c->attr->eps);
    TP_NORM_LAUNCHED();
    return TP_OK;
}

tp_status_t tp_cuda_norm_backward(tp_stream_t *s, const tp_op_call_t *c) {
    const tp_norm_rows_t r = tp_norm_rows(c);
    const size_t np = r.groups * r.len / r.sp;
    int gi, bi;
    tp_norm_params(c->attr, &gi, &bi);
    float *dg = gi < 0 ? NULL : c->dx[gi], *db = bi < 0 ? NULL : c->dx[bi];
    const int acc_g = gi < 0 ? 0 : c->dx_acc[gi], acc_b = bi < 0 ? 0 : c->dx_acc[bi];
    const float *gamma = gi < 0 ? NULL : (const float *)c->x[gi];
    if (!r.rows || !r.len) { /* no elements: the parameters' sums are 0 */
        if (dg && !acc_g)
            TP_CUDA_CHECK(cudaMemsetAsync(dg, 0, np * sizeof(float), s->cu));
        if (db && !acc_b)
            TP_CUDA_CHECK(cudaMemsetAsync(db, 0, np * sizeof(float), s->cu));
        return TP_OK;
    }
    if (r.rows > 0x7fffffffu)
        return tp_error(TP_ERR_UNSUPPORTED, "%s: %zu rows (at most 2^31 - 1 blocks)",
                        c->name, r.rows);
    float *stats = (dg || db) ? (float *)c->workspace : NULL;
    if ((dg || db) && c->workspace_bytes && c->workspace_bytes < tp_cuda_norm_workspace(c))
        return tp_error(TP_ERR_INVALID, "%s: workspace of %zu bytes, needs %zu", c->name,
                        c->workspace_bytes, tp_cuda_norm_workspace(c));
    if (!c->dx[0] && !stats)
        return TP_OK;
    k_norm_bwd_x<<<(unsigned)r.rows, NORM_THREADS, 0, s->cu>>>(
        (const float *)c->x[0], gamma, c->dy, c->dx[0],
        c->dx[0] ? c->dx_acc[0] : 0, stats, r.len, r.groups, r.sp, c->attr->eps);
    TP_NORM_LAUNCHED();
    if (stats) {
        k_norm_bwd_params<<<(unsigned)np, NORM_THREADS, 0, s->cu>>>(
            (const float *)c->x[0], c->dy, stats, dg, acc_g, db, acc_b, r.rows, r.len,
            r.groups, r.sp);
        TP_NORM_LAUNCHED();
    }
    return TP_OK;
}
