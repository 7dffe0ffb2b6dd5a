/* towerpack gpu: the CPU kernels of the elementwise family (docs/ops.md).
 *
 * Binary ops broadcast as NumPy does. The shapes are reduced to a few
 * "coalesced" dims (neighbours merged where both operands walk them as one
 * run), so the inner loop is long and has fixed strides (1, or 0 for a
 * stretched operand): the same-shape case is one flat loop. A stretched
 * operand's gradient is summed over the stretched dims into its own buffer
 * in the output's order. The activations the image models used first
 * (relu, leaky relu, tanh, sigmoid, scale) and the same-shape add keep
 * their loops as they were, so those models train to the same bits. */
#include <math.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"

float tp_cpu_elementwise_grad_fault = 1.0f;

static size_t s_count(const tp_shape_t *s) { return tp_shape_count(s); }

static int s_same(const tp_shape_t *a, const tp_shape_t *b) {
    return a->ndim == b->ndim &&
           !memcmp(a->d, b->d, sizeof(int64_t) * (size_t)a->ndim);
}

/* ---- broadcasting ------------------------------------------------------- */

/* The output's dims, coalesced, with each operand's stride per dim (0
 * where it is stretched). nd >= 1. */
typedef struct {
    int nd;
    int64_t d[TP_MAX_DIMS];
    int64_t s[2][TP_MAX_DIMS];
} s_bc_t;

static void s_bc_init(s_bc_t *bc, const tp_shape_t *y, const tp_shape_t *const *xs) {
    const int r = y->ndim;
    int64_t d[TP_MAX_DIMS], st[2][TP_MAX_DIMS];
    for (int p = 0; p < 2; p++) {
        int64_t acc = 1;
        for (int j = r - 1; j >= 0; j--) {
            const int ip = j - (r - xs[p]->ndim);
            const int64_t n = ip >= 0 ? xs[p]->d[ip] : 1;
            st[p][j] = n == 1 ? 0 : acc;
            acc *= n;
        }
    }
    for (int j = 0; j < r; j++)
        d[j] = y->d[j];
    /* drop size-1 dims, then merge an outer dim into the next inner one
     * where both operands step through them as one run */
    int nd = 0;
    for (int j = 0; j < r; j++) {
        if (d[j] == 1)
            continue;
        if (nd > 0 && bc->s[0][nd - 1] == st[0][j] * d[j] &&
            bc->s[1][nd - 1] == st[1][j] * d[j]) {
            bc->d[nd - 1] *= d[j];
            bc->s[0][nd - 1] = st[0][j];
            bc->s[1][nd - 1] = st[1][j];
            continue;
        }
        bc->d[nd] = d[j];
        bc->s[0][nd] = st[0][j];
        bc->s[1][nd] = st[1][j];
        nd++;
    }
    if (nd == 0) {
        bc->d[0] = 1;
        bc->s[0][0] = bc->s[1][0] = 0;
        nd = 1;
    }
    bc->nd = nd;
}

/* Runs BODY for every output element o, with ia and ib the operands'
 * elements; the inner loop is the last coalesced dim. */
#define BC_LOOP(bc, BODY)                                                    \
    do {                                                                     \
        const s_bc_t *bc_ = (bc);                                            \
        const int nd_ = bc_->nd;                                             \
        const int64_t in_ = bc_->d[nd_ - 1], sa_ = bc_->s[0][nd_ - 1],       \
                      sb_ = bc_->s[1][nd_ - 1];                              \
        int64_t outer_ = 1, idx_[TP_MAX_DIMS] = {0};                         \
        for (int k_ = 0; k_ < nd_ - 1; k_++)                                 \
            outer_ *= bc_->d[k_];                                            \
        size_t o = 0, a0_ = 0, b0_ = 0;                                      \
        for (int64_t q_ = 0; q_ < outer_; q_++) {                            \
            for (int64_t j_ = 0; j_ < in_; j_++, o++) {                      \
                const size_t ia = a0_ + (size_t)(j_ * sa_);                  \
                const size_t ib = b0_ + (size_t)(j_ * sb_);                  \
                (void)ia;                                                    \
                (void)ib;                                                    \
                BODY;                                                        \
            }                                                                \
            for (int k_ = nd_ - 2; k_ >= 0; k_--) {                          \
                a0_ += (size_t)bc_->s[0][k_];                                \
                b0_ += (size_t)bc_->s[1][k_];                                \
                if (++idx_[k_] < bc_->d[k_])                                 \
                    break;                                                   \
                a0_ -= (size_t)(bc_->s[0][k_] * bc_->d[k_]);                 \
                b0_ -= (size_t)(bc_->s[1][k_] * bc_->d[k_]);                 \
                idx_[k_] = 0;                                                \
            }                                                                \
        }                                                                    \
    } while (0)

static void s_binary_fwd(const tp_op_call_t *c) {
    const float *restrict a = c->x[0], *restrict b = c->x[1];
    float *restrict y = c->y;
    if (c->kind == TP_OP_ADD && s_same(&c->xshape[0], &c->yshape) &&
        s_same(&c->xshape[1], &c->yshape)) {
        /* the image models' residual add: as it always ran */
        const size_t n = s_count(&c->yshape);
        for (size_t i = 0; i < n; i++)
            y[i] = a[i] + b[i];
        return;
    }
    const tp_shape_t *xs[2] = {&c->xshape[0], &c->xshape[1]};
    s_bc_t bc;
    s_bc_init(&bc, &c->yshape, xs);
    switch (c->kind) {
    case TP_OP_ADD: BC_LOOP(&bc, y[o] = a[ia] + b[ib]); break;
    case TP_OP_SUB: BC_LOOP(&bc, y[o] = a[ia] - b[ib]); break;
    case TP_OP_MUL: BC_LOOP(&bc, y[o] = a[ia] * b[ib]); break;
    case TP_OP_DIV: BC_LOOP(&bc, y[o] = a[ia] / b[ib]); break;
    /* a NaN on either side is the result, as torch.maximum/minimum */
    case TP_OP_MAXIMUM:
        BC_LOOP(&bc, y[o] = a[ia] >= b[ib] || a[ia] != a[ia] ? a[ia] : b[ib]);
        break;
    case TP_OP_MINIMUM:
        BC_LOOP(&bc, y[o] = a[ia] <= b[ib] || a[ia] != a[ia] ? a[ia] : b[ib]);
        break;
    default: break;
    }
}

/* dx[p] of a binary op: GA (operand 0) or GB (operand 1) of dy[o], a[ia],
 * b[ib], summed into dx[p] at the operand's own index (its stretched dims
 * add up); overwritten first unless dx_acc. */
#define BINARY_GRAD(p, EXPR)                                                 \
    do {                                                                     \
        float *restrict g_ = c->dx[p];                                       \
        if (!g_)                                                             \
            break;                                                           \
        if (!c->dx_acc[p])                                                   \
            memset(g_, 0, s_count(&c->xshape[p]) * sizeof(float));           \
        if ((p) == 0)                                                        \
            BC_LOOP(&bc, g_[ia] += (EXPR));                                  \
        else                                                                 \
            BC_LOOP(&bc, g_[ib] += (EXPR));                                  \
    } while (0)

static void s_binary_bwd(const tp_op_call_t *c) {
    const float *restrict a = c->x[0], *restrict b = c->x[1],
                          *restrict dy = c->dy;
    if (c->kind == TP_OP_ADD && s_same(&c->xshape[0], &c->yshape) &&
        s_same(&c->xshape[1], &c->yshape)) {
        const size_t n = s_count(&c->yshape);
        for (int k = 0; k < 2; k++)
            if (c->dx[k]) {
                float *restrict dx = c->dx[k];
                GRAD_STORE(dx, c->dx_acc[k], n, dy[i]);
            }
        return;
    }
    const tp_shape_t *xs[2] = {&c->xshape[0], &c->xshape[1]};
    s_bc_t bc;
    s_bc_init(&bc, &c->yshape, xs);
    switch (c->kind) {
    case TP_OP_ADD:
        BINARY_GRAD(0, dy[o]);
        BINARY_GRAD(1, dy[o]);
        break;
    case TP_OP_SUB:
        BINARY_GRAD(0, dy[o]);
        BINARY_GRAD(1, -dy[o]);
        break;
    case TP_OP_MUL:
        BINARY_GRAD(0, dy[o] * b[ib]);
        BINARY_GRAD(1, dy[o] * a[ia]);
        break;
    case TP_OP_DIV:
        BINARY_GRAD(0, dy[o] / b[ib]);
        BINARY_GRAD(1, -dy[o] * a[ia] / (b[ib] * b[ib]));
        break;
    /* ties: half to each side, as PyTorch */
    case TP_OP_MAXIMUM:
        BINARY_GRAD(0, a[ia] > b[ib] ? dy[o] : a[ia] == b[ib] ? 0.5f * dy[o] : 0.0f);
        BINARY_GRAD(1, b[ib] > a[ia] ? dy[o] : a[ia] == b[ib] ? 0.5f * dy[o] : 0.0f);
        break;
    case TP_OP_MINIMUM:
        BINARY_GRAD(0, a[ia] < b[ib] ? dy[o] : a[ia] == b[ib] ? 0.5f * dy[o] : 0.0f);
        BINARY_GRAD(1, b[ib] < a[ia] ? dy[o] : a[ia] == b[ib] ? 0.5f * dy[o] : 0.0f);
        break;
    default:
        break;
    }
}

/* ---- the image models' activations (loops unchanged) -------------------- */

static void s_unary_fwd(const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float *restrict x = c->x[0];
    float *restrict y = c->y;
    const float a = c->attr->alpha;
    switch (c->kind) {
    case TP_OP_RELU:
        for (size_t i = 0; i < n; i++) {
            const float v = x[i];
            y[i] = v > 0.0f ? v : 0.0f;
        }
        break;
    case TP_OP_LEAKY_RELU:
        for (size_t i = 0; i < n; i++) {
            const float v = x[i], vl = a * v;
            y[i] = v > 0.0f ? v : vl;
        }
        break;
    case TP_OP_TANH:
        for (size_t i = 0; i < n; i++)
            y[i] = tanhf(x[i]);
        break;
    case TP_OP_SIGMOID:
        for (size_t i = 0; i < n; i++)
            y[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    case TP_OP_SCALE:
        for (size_t i = 0; i < n; i++)
            y[i] = a * x[i];
        break;
    default:
        break;
    }
}

/* Branch-free forms: relu masks are data-dependent coin flips that a
 * branch predictor cannot learn. */
static void s_unary_bwd(const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float *restrict x = c->x[0], *restrict y = c->y,
                          *restrict dy = c->dy;
    float *restrict dx = c->dx[0];
    const int acc = c->dx_acc[0];
    const float a = c->attr->alpha;
    if (!dx)
        return;
    switch (c->kind) {
    case TP_OP_RELU:
        /* an unconditional load and a select against 0: GCC vectorises
         * exactly this form */
        if (acc) {
            for (size_t i = 0; i < n; i++) {
                const float g = dy[i];
                dx[i] += x[i] > 0.0f ? g : 0.0f;
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                const float g = dy[i];
                dx[i] = x[i] > 0.0f ? g : 0.0f;
            }
        }
        break;
    case TP_OP_LEAKY_RELU:
        GRAD_STORE(dx, acc, n, x[i] > 0.0f ? dy[i] : a * dy[i]);
        break;
    case TP_OP_TANH:
        GRAD_STORE(dx, acc, n, dy[i] * (1.0f - y[i] * y[i]));
        break;
    case TP_OP_SIGMOID:
        GRAD_STORE(dx, acc, n, dy[i] * y[i] * (1.0f - y[i]));
        break;
    case TP_OP_SCALE:
        GRAD_STORE(dx, acc, n, a * dy[i]);
        break;
    default:
        break;
    }
}


/* ---- the other unary ops ------------------------------------------------ */

#define S_SQRT_2_OVER_PI 0.7978845608028654f
#define S_GELU_C 0.044715f
#define S_INV_SQRT_2PI 0.3989422804014327f

static void s_math_fwd(const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float *restrict x = c->x[0];
    float *restrict y = c->y;
    const float p = c->attr->alpha, hi = c->attr->beta;
    switch (c->kind) {
    case TP_OP_NEG: for (size_t i = 0; i < n; i++) y[i] = -x[i]; break;
    case TP_OP_ABS: for (size_t i = 0; i < n; i++) y[i] = fabsf(x[i]); break;
    case TP_OP_SQUARE: for (size_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;
    case TP_OP_SQRT: for (size_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
    case TP_OP_RSQRT: for (size_t i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]); break;
    case TP_OP_EXP: for (size_t i = 0; i < n; i++) y[i] = expf(x[i]); break;
    case TP_OP_LOG: for (size_t i = 0; i < n; i++) y[i] = logf(x[i]); break;
    case TP_OP_POW: for (size_t i = 0; i < n; i++) y[i] = powf(x[i], p); break;
    case TP_OP_CLIP:
        for (size_t i = 0; i < n; i++) {
            const float v = x[i] < p ? p : x[i];
            y[i] = v > hi ? hi : v;
        }
        break;
    case TP_OP_GELU:
        for (size_t i = 0; i < n; i++)
            y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
        break;
    case TP_OP_GELU_TANH:
        for (size_t i = 0; i < n; i++) {
            const float v = x[i];
            y[i] = 0.5f * v * (1.0f + tanhf(S_SQRT_2_OVER_PI * (v + S_GELU_C * v * v * v)));
        }
        break;
    case TP_OP_SILU:
        for (size_t i = 0; i < n; i++)
            y[i] = x[i] / (1.0f + expf(-x[i]));
        break;
    case TP_OP_SOFTPLUS:
        for (size_t i = 0; i < n; i++)
            y[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
        break;
    case TP_OP_STOP_GRADIENT:
        if (y != x)
            memcpy(y, x, n * sizeof(float));
        break;
    case TP_OP_CONSTANT:
        memcpy(y, c->attr->data, n * sizeof(float));
        break;
    default:
        break;
    }
}

static float s_gelu_grad(float v) {
    const float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
    return cdf + v * S_INV_SQRT_2PI * expf(-0.5f * v * v);
}

static float s_gelu_tanh_grad(float v) {
    const float u = S_SQRT_2_OVER_PI * (v + S_GELU_C * v * v * v);
    const float t = tanhf(u);
    const float du = S_SQRT_2_OVER_PI * (1.0f + 3.0f * S_GELU_C * v * v);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

static float s_silu_grad(float v) {
    const float s = 1.0f / (1.0f + expf(-v));
    return s * (1.0f + v * (1.0f - s));
}

static void s_math_bwd(const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float *restrict x = c->x[0], *restrict y = c->y,
                          *restrict dy = c->dy;
    float *restrict dx = c->dx[0];
    const int acc = c->dx_acc[0];
    const float p = c->attr->alpha, hi = c->attr->beta;
    if (!dx)
        return;
    switch (c->kind) {
    case TP_OP_NEG: GRAD_STORE(dx, acc, n, -dy[i]); break;
    case TP_OP_ABS:
        GRAD_STORE(dx, acc, n, x[i] > 0.0f ? dy[i] : x[i] < 0.0f ? -dy[i] : 0.0f);
        break;
    case TP_OP_SQUARE: GRAD_STORE(dx, acc, n, 2.0f * x[i] * dy[i]); break;
    case TP_OP_SQRT: GRAD_STORE(dx, acc, n, dy[i] / (2.0f * y[i])); break;
    case TP_OP_RSQRT: GRAD_STORE(dx, acc, n, -0.5f * dy[i] * y[i] * y[i] * y[i]); break;
    case TP_OP_EXP: GRAD_STORE(dx, acc, n, dy[i] * y[i]); break;
    case TP_OP_LOG: GRAD_STORE(dx, acc, n, dy[i] / x[i]); break;
    case TP_OP_POW:
        GRAD_STORE(dx, acc, n, p == 0.0f ? 0.0f : dy[i] * p * powf(x[i], p - 1.0f));
        break;
    case TP_OP_CLIP:
        GRAD_STORE(dx, acc, n, x[i] >= p && x[i] <= hi ? dy[i] : 0.0f);
        break;
    case TP_OP_GELU: GRAD_STORE(dx, acc, n, dy[i] * s_gelu_grad(x[i])); break;
    case TP_OP_GELU_TANH: GRAD_STORE(dx, acc, n, dy[i] * s_gelu_tanh_grad(x[i])); break;
    case TP_OP_SILU: GRAD_STORE(dx, acc, n, dy[i] * s_silu_grad(x[i])); break;
    case TP_OP_SOFTPLUS:
        GRAD_STORE(dx, acc, n, x[i] > 20.0f ? dy[i] : dy[i] / (1.0f + expf(-x[i])));
        break;
    default: /* constants and stop_gradient: nothing flows back */
        break;
    }
}

/* ---- dispatch ----------------------------------------------------------- */

int tp_cpu_elementwise_kind(tp_op_kind_t k) {
    switch (k) {
    case TP_OP_RELU: case TP_OP_LEAKY_RELU: case TP_OP_TANH: case TP_OP_SIGMOID:
    case TP_OP_SCALE: case TP_OP_ADD: case TP_OP_SUB: case TP_OP_MUL:
    case TP_OP_DIV: case TP_OP_MAXIMUM: case TP_OP_MINIMUM: case TP_OP_NEG:
    case TP_OP_ABS: case TP_OP_SQUARE: case TP_OP_SQRT: case TP_OP_RSQRT:
    case TP_OP_EXP: case TP_OP_LOG: case TP_OP_POW: case TP_OP_CLIP:
    case TP_OP_GELU: case TP_OP_GELU_TANH: case TP_OP_SILU: case TP_OP_SOFTPLUS:
    case TP_OP_CONSTANT: case TP_OP_STOP_GRADIENT:
        return 1;
    default:
        return 0;
    }
}

tp_status_t tp_cpu_elementwise_forward(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_RELU: case TP_OP_LEAKY_RELU: case TP_OP_TANH: case TP_OP_SIGMOID:
    case TP_OP_SCALE:
        s_unary_fwd(c);
        return TP_OK;
    case TP_OP_ADD: case TP_OP_SUB: case TP_OP_MUL: case TP_OP_DIV:
    case TP_OP_MAXIMUM: case TP_OP_MINIMUM:
        s_binary_fwd(c);
        return TP_OK;
    default:
        if (!tp_cpu_elementwise_kind(c->kind))
            return tp_error(TP_ERR_UNSUPPORTED, "%s: no CPU forward for op %s",
                            c->name, tp_op_name(c->kind));
        s_math_fwd(c);
        return TP_OK;
    }
}

tp_status_t tp_cpu_elementwise_backward(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_RELU: case TP_OP_LEAKY_RELU: case TP_OP_TANH: case TP_OP_SIGMOID:
    case TP_OP_SCALE:
        s_unary_bwd(c);
        break;
    case TP_OP_ADD: case TP_OP_SUB: case TP_OP_MUL: case TP_OP_DIV:
    case TP_OP_MAXIMUM: case TP_OP_MINIMUM:
        s_binary_bwd(c);
        break;
    default:
        if (!tp_cpu_elementwise_kind(c->kind))
            return tp_error(TP_ERR_UNSUPPORTED, "%s: no CPU backward for op %s",
                            c->name, tp_op_name(c->kind));
        s_math_bwd(c);
        break;
    }
    /* the gradient checks' deliberate fault (ops_elementwise.h); a multiply
     * by exactly 1 is skipped, so normal runs are untouched */
    if (tp_cpu_elementwise_grad_fault != 1.0f)
        for (int k = 0; k < c->ninputs; k++)
            if (c->dx[k])
                for (size_t i = 0, n = s_count(&c->xshape[k]); i < n; i++)
                    c->dx[k][i] *= tp_cpu_elementwise_grad_fault;
    return TP_OK;
}
