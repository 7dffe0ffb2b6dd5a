/* towerpack gpu: the CPU kernels of the loss family (docs/ops.md).
 *
 * Each loss is the mean over every element of a per-element term of two
 * same-shape inputs. The sum runs in double, so the mean of a large batch
 * (the autoencoder's 128 x 784 pixels) keeps float precision whatever the
 * order; the CUDA kernels sum in double too and agree to rounding.
 *
 * Sigmoid cross-entropy uses max(x,0) - x z + log1p(e^-|x|), which never
 * exponentiates a positive number: finite for any finite logit, and equal
 * to PyTorch's binary_cross_entropy_with_logits. */
#include <math.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_loss.h"

int tp_cpu_loss_kind(tp_op_kind_t k) {
    return k == TP_OP_MSE || k == TP_OP_L1_LOSS || k == TP_OP_HUBER_LOSS ||
           k == TP_OP_SIGMOID_XENT;
}

static inline float s_term(tp_op_kind_t k, float a, float b, float delta) {
    const float d = a - b;
    switch (k) {
    case TP_OP_MSE: return d * d;
    case TP_OP_L1_LOSS: return fabsf(d);
    case TP_OP_HUBER_LOSS: {
        const float m = fabsf(d);
        return m < delta ? 0.5f * d * d : delta * (m - 0.5f * delta);
    }
    default: /* sigmoid xent: a the logit, b the label */
        return fmaxf(a, 0.0f) - a * b + log1pf(expf(-fabsf(a)));
    }
}

/* MSE's sum: eight double lanes (element i into lane i mod 8), added
 * pairwise, then the tail in order; one chain of double adds was bound by
 * the add's latency. The order is fixed, so the bits are too. */
static double s_mse_sum(const float *restrict a, const float *restrict b, size_t n) {
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int t = 0; t < 8; t++) {
            const float d = a[i + t] - b[i + t];
            l[t] += (double)(d * d);
        }
    double s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++) {
        const float d = a[i] - b[i];
        s += (double)(d * d);
    }
    return s;
}

tp_status_t tp_cpu_loss_forward(const tp_op_call_t *c) {
    const size_t n = tp_shape_count(&c->xshape[0]);
    const float *a = c->x[0], *b = c->x[1];
    const float delta = c->attr->alpha;
    double s = 0.0;
    if (c->kind == TP_OP_MSE)
        s = s_mse_sum(a, b, n);
    else
        for (size_t i = 0; i < n; i++)
            s += (double)s_term(c->kind, a[i], b[i], delta);
    /* the mean of no elements is NaN, as torch's */
    *(float *)c->y = (float)(s / (double)n);
    return TP_OK;
}

/* The gradient of one term with respect to input 0 (g0) and 1 (g1). */
static inline void s_dterm(tp_op_kind_t k, float a, float b, float delta,
                           float *g0, float *g1) {
    const float d = a - b;
    switch (k) {
    case TP_OP_MSE:
        *g0 = 2.0f * d;
        *g1 = -*g0;
        return;
    case TP_OP_L1_LOSS: /* sign(d), 0 at d == 0 (torch's) */
        *g0 = (float)((d > 0.0f) - (d < 0.0f));
        *g1 = -*g0;
        return;
    case TP_OP_HUBER_LOSS:
        *g0 = d < -delta ? -delta : d > delta ? delta : d;
        *g1 = -*g0;
        return;
    default: /* d/dx = sigmoid(x) - z, d/dz = -x */
        *g0 = 1.0f / (1.0f + expf(-a)) - b;
        *g1 = -a;
        return;
    }
}

/* MSE's gradients for elements [lo, hi): one loop per case, no switch
 * inside (GCC vectorises each). */
static void s_mse_bwd(void *arg, size_t lo, size_t hi) {
    const tp_op_call_t *c = arg;
    const size_t n = tp_shape_count(&c->xshape[0]), m = hi - lo;
    const float *restrict a = (const float *)c->x[0] + lo, *restrict b = (const float *)c->x[1] + lo;
    const float scale = c->dy[0] / (float)n * tp_cpu_elementwise_grad_fault;
    for (int k = 0; k < 2; k++) {
        if (!c->dx[k])
            continue;
        float *restrict d = c->dx[k] + lo;
        /* the same products as s_dterm's: g0 = 2 (a - b), g1 = -g0 */
        if (k == 0)
            GRAD_STORE(d, c->dx_acc[0], m, scale * (2.0f * (a[i] - b[i])));
        else
            GRAD_STORE(d, c->dx_acc[1], m, scale * -(2.0f * (a[i] - b[i])));
    }
}

tp_status_t tp_cpu_loss_backward(const tp_op_call_t *c) {
    const size_t n = tp_shape_count(&c->xshape[0]);
    if (c->kind == TP_OP_MSE) {
        tp_cpu_parallel(n, 16, 16384, s_mse_bwd, (void *)c);
        return TP_OK;
    }
    const float *a = c->x[0], *b = c->x[1];
    const float delta = c->attr->alpha;
    /* dy / n, and the gradient checks' deliberate fault (ops_elementwise.h;
     * exactly 1 outside them) */
    const float scale = c->dy[0] / (float)n * tp_cpu_elementwise_grad_fault;
    float *d0 = c->dx[0], *d1 = c->dx[1];
    const int acc0 = d0 && c->dx_acc[0], acc1 = d1 && c->dx_acc[1];
    for (size_t i = 0; i < n; i++) {
        float g0, g1;
        s_dterm(c->kind, a[i], b[i], delta, &g0, &g1);
        if (d0)
            d0[i] = acc0 ? d0[i] + scale * g0 : scale * g0;
        if (d1)
            d1[i] = acc1 ? d1[i] + scale * g1 : scale * g1;
    }
    return TP_OK;
}
