/* towerpack gpu/cuda: the loss family's kernels (docs/ops.md).
 *
 * The forward is one block of LOSS_THREADS threads: each sums its strided
 * share of the per-element terms in double, then a tree in shared memory
 * adds the shares in a fixed order, so the mean is deterministic (no
 * atomics) and agrees with the CPU's double sum to rounding. One block is
 * enough for the sizes losses see (a batch of images: 10^5 elements is a
 * few hundred loads a thread); the backward is a grid-stride kernel, one
 * thread an element, reading dy from device memory so a recorded step
 * (CUDA graph) replays it. The per-element formulas are the CPU's. */
#include <math.h>
#include "gpu/cuda/ops_loss.h"

#define LOSS_THREADS 256
#define TP_LOSS_LAUNCHED() TP_CUDA_CHECK(cudaGetLastError())

namespace {

__device__ float loss_term(tp_op_kind_t k, float a, float b, float delta) {
    const float d = a - b;
    switch (k) {
    case TP_OP_MSE: return d * d;
    case TP_OP_L1_LOSS: return fabsf(d);
    case TP_OP_HUBER_LOSS: {
        const float m = fabsf(d);
        return m < delta ? 0.5f * d * d : delta * (m - 0.5f * delta);
    }
    default: /* sigmoid xent, stable: never e^(positive) */
        return fmaxf(a, 0.0f) - a * b + log1pf(expf(-fabsf(a)));
    }
}

__global__ void k_loss_mean(tp_op_kind_t k, const float *a, const float *b,
                            float *y, size_t n, float delta) {
    __shared__ double part[LOSS_THREADS];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += LOSS_THREADS)
        s += (double)loss_term(k, a[i], b[i], delta);
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = LOSS_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *y = (float)(part[0] / (double)n);
}

__global__ void k_loss_grad(tp_op_kind_t k, const float *a, const float *b,
                            const float *dy, float *d0, int acc0, float *d1,
                            int acc1, size_t n, float delta) {
    const float scale = dy[0] / (float)n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float x = a[i], z = b[i], d = x - z;
        float g0, g1;
        switch (k) {
        case TP_OP_MSE: g0 = 2.0f * d; g1 = -g0; break;
        case TP_OP_L1_LOSS: g0 = (float)((d > 0.0f) - (d < 0.0f)); g1 = -g0; break;
        case TP_OP_HUBER_LOSS:
            g0 = d < -delta ? -delta : d > delta ? delta : d;
            g1 = -g0;
            break;
        default:
            g0 = 1.0f / (1.0f + expf(-x)) - z;
            g1 = -x;
            break;
        }
        if (d0)
            d0[i] = acc0 ? d0[i] + scale * g0 : scale * g0;
        if (d1)
            d1[i] = acc1 ? d1[i] + scale * g1 : scale * g1;
    }
}

} // namespace

int tp_cuda_loss_kind(tp_op_kind_t k) {
    return k == TP_OP_MSE || k == TP_OP_L1_LOSS || k == TP_OP_HUBER_LOSS ||
           k == TP_OP_SIGMOID_XENT;
}

tp_status_t tp_cuda_loss_forward(tp_stream_t *s, const tp_op_call_t *c) {
    if (!tp_cuda_loss_kind(c->kind))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA forward for op %s",
                        c->name, tp_op_name(c->kind));
    const size_t n = tp_shape_count(&c->xshape[0]);
    k_loss_mean<<<1, LOSS_THREADS, 0, s->cu>>>(
        c->kind, (const float *)c->x[0], (const float *)c->x[1], (float *)c->y,
        n, c->attr->alpha);
    TP_LOSS_LAUNCHED();
    return TP_OK;
}

tp_status_t tp_cuda_loss_backward(tp_stream_t *s, const tp_op_call_t *c) {
    if (!tp_cuda_loss_kind(c->kind))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA backward for op %s",
                        c->name, tp_op_name(c->kind));
    const size_t n = tp_shape_count(&c->xshape[0]);
    if (n == 0 || (!c->dx[0] && !c->dx[1]))
        return TP_OK;
    k_loss_grad<<<tp_cuda_blocks(n, 256), 256, 0, s->cu>>>(
        c->kind, (const float *)c->x[0], (const float *)c->x[1], c->dy,
        c->dx[0], c->dx[0] ? c->dx_acc[0] : 0, c->dx[1],
        c->dx[1] ? c->dx_acc[1] : 0, n, c->attr->alpha);
    TP_LOSS_LAUNCHED();
    return TP_OK;
}
