/* towerpack gpu/cuda: the elementwise family's kernels (docs/ops.md).
 *
 * Binary ops broadcast as NumPy does: the host coalesces the output's dims
 * as the CPU does (gpu/cpu/ops_elementwise.c) and a thread per output
 * element finds its operands' elements by the coalesced strides. A
 * stretched operand's gradient is a gather, not atomics: one thread per
 * element of that operand sums its stretched positions in the output's
 * order (the CPU's order, so the sums agree closely and are deterministic).
 * Unary ops are one grid-stride kernel over a switch on the kind, with the
 * CPU's formulas (1 / sqrtf rather than rsqrtf, whose last bits differ).
 * A constant's values travel as kernel parameters, 960 floats a launch, so
 * a recorded step (CUDA graph) replays them with no host copy. */
#include <math.h>
#include <string.h>
#include "gpu/cuda/ops_elementwise.h"

#define TP_EW_GRID_LOOP(i, n)                                                \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);  \
         i += (size_t)gridDim.x * blockDim.x)

namespace {

/* The output's coalesced dims with each operand's stride (0: stretched)
 * and the output's own contiguous strides. */
struct ew_bc {
    int nd;
    int64_t d[TP_MAX_DIMS];
    int64_t s[2][TP_MAX_DIMS];
    int64_t os[TP_MAX_DIMS];
};

void ew_bc_init(ew_bc *bc, const tp_shape_t *y, const tp_shape_t *a,
                const tp_shape_t *b) {
    const tp_shape_t *xs[2] = {a, b};
    const int r = y->ndim;
    int64_t st[2][TP_MAX_DIMS];
    for (int p = 0; p < 2; p++) {
        int64_t acc = 1;
        for (int j = r - 1; j >= 0; j--) {
            const int ip = j - (r - xs[p]->ndim);
            const int64_t n = ip >= 0 ? xs[p]->d[ip] : 1;
            st[p][j] = n == 1 ? 0 : acc;
            acc *= n;
        }
    }
    int nd = 0;
    for (int j = 0; j < r; j++) {
        const int64_t dj = y->d[j];
        if (dj == 1)
            continue;
        if (nd > 0 && bc->s[0][nd - 1] == st[0][j] * dj &&
            bc->s[1][nd - 1] == st[1][j] * dj) {
            bc->d[nd - 1] *= dj;
            bc->s[0][nd - 1] = st[0][j];
            bc->s[1][nd - 1] = st[1][j];
            continue;
        }
        bc->d[nd] = dj;
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
    int64_t acc = 1;
    for (int k = nd - 1; k >= 0; k--) {
        bc->os[k] = acc;
        acc *= bc->d[k];
    }
}

__device__ float ew_bin(tp_op_kind_t k, float a, float b) {
    switch (k) {
    case TP_OP_ADD: return a + b;
    case TP_OP_SUB: return a - b;
    case TP_OP_MUL: return a * b;
    case TP_OP_DIV: return a / b;
    case TP_OP_MAXIMUM: return a >= b || a != a ? a : b; /* NaN wins */
    case TP_OP_MINIMUM: return a <= b || a != a ? a : b;
    default: return 0.0f;
    }
}

/* d y / d operand p, times g (ties of maximum/minimum: half each) */
__device__ float ew_bin_grad(tp_op_kind_t k, int p, float g, float a, float b) {
    switch (k) {
    case TP_OP_ADD: return g;
    case TP_OP_SUB: return p ? -g : g;
    case TP_OP_MUL: return p ? g * a : g * b;
    case TP_OP_DIV: return p ? -g * a / (b * b) : g / b;
    case TP_OP_MAXIMUM: {
        const float mine = p ? b : a, other = p ? a : b;
        return mine > other ? g : mine == other ? 0.5f * g : 0.0f;
    }
    case TP_OP_MINIMUM: {
        const float mine = p ? b : a, other = p ? a : b;
        return mine < other ? g : mine == other ? 0.5f * g : 0.0f;
    }
    default: return 0.0f;
    }
}

__global__ void k_binary(tp_op_kind_t k, ew_bc bc, const float *a, const float *b,
                         float *y, size_t n) {
    TP_EW_GRID_LOOP(o, n) {
        size_t rem = o, ia = 0, ib = 0;
        for (int q = bc.nd - 1; q >= 0; q--) {
            const size_t i = rem % (size_t)bc.d[q];
            rem /= (size_t)bc.d[q];
            ia += i * (size_t)bc.s[0][q];
            ib += i * (size_t)bc.s[1][q];
        }
        y[o] = ew_bin(k, a[ia], b[ib]);
    }
}

/* The two gradient kernels below share these. Element e of operand p:
 * its kept coordinates' offsets in the output (*base) and in the other
 * operand (*other). */
static __device__ __forceinline__ void ew_grad_origin(ew_bc bc, int p, size_t e,
                                                      size_t *base, size_t *other) {
    size_t ob = 0, oo = 0;
    for (int q = bc.nd - 1; q >= 0; q--) {
        if (!bc.s[p][q])
            continue;
        const size_t i = (e / (size_t)bc.s[p][q]) % (size_t)bc.d[q];
        ob += i * (size_t)bc.os[q];
        oo += i * (size_t)bc.s[1 - p][q];
    }
    *base = ob;
    *other = oo;
}

/* The r-th stretched position of element e (row-major over operand p's
 * broadcast dims): its term of dx[e]. */
static __device__ __forceinline__ float ew_grad_term(tp_op_kind_t k, int p, ew_bc bc,
                                                     const float *a, const float *b,
                                                     const float *dy, size_t e,
                                                     size_t base, size_t other, size_t r) {
    size_t rem = r, o = base, io = other;
    for (int q = bc.nd - 1; q >= 0; q--) {
        if (bc.s[p][q])
            continue;
        const size_t i = rem % (size_t)bc.d[q];
        rem /= (size_t)bc.d[q];
        o += i * (size_t)bc.os[q];
        io += i * (size_t)bc.s[1 - p][q];
    }
    const float av = p ? a[io] : a[e], bv = p ? b[e] : b[io];
    return ew_bin_grad(k, p, dy[o], av, bv);
}

/* dx of operand p: one thread per element e of the operand; its kept
 * coordinates from e, then every stretched position summed in the
 * output's (row-major) order. */
__global__ void k_binary_grad(tp_op_kind_t k, int p, ew_bc bc, const float *a,
                              const float *b, const float *dy, float *dx,
                              int acc, size_t count, size_t reduced) {
    TP_EW_GRID_LOOP(e, count) {
        size_t base, other;
        ew_grad_origin(bc, p, e, &base, &other);
        float sum = 0.0f;
        for (size_t r = 0; r < reduced; r++)
            sum += ew_grad_term(k, p, bc, a, b, dy, e, base, other, r);
        dx[e] = acc ? dx[e] + sum : sum;
    }
}

/* The same gradient when each operand element sums many stretched
 * positions (a bias [C] under [B,T,C], a scalar under a whole tensor): one
 * thread an element there leaves the GPU nearly idle, each thread walking
 * thousands of dependent loads (the GPT's bias gradients took 87% of its
 * step, 6 ms each, on an H200). Here a block sums one element: its
 * threads stride over the reduced positions, then a tree in shared memory
 * adds the partial sums, always in the same order (deterministic). */
#define EW_ROWS_THREADS 256
__global__ void k_binary_grad_rows(tp_op_kind_t k, int p, ew_bc bc, const float *a,
                                   const float *b, const float *dy, float *dx,
                                   int acc, size_t count, size_t reduced) {
    __shared__ float part[EW_ROWS_THREADS];
    for (size_t e = blockIdx.x; e < count; e += gridDim.x) {
        size_t base, other;
        ew_grad_origin(bc, p, e, &base, &other);
        float sum = 0.0f;
        for (size_t r = threadIdx.x; r < reduced; r += blockDim.x)
            sum += ew_grad_term(k, p, bc, a, b, dy, e, base, other, r);
        part[threadIdx.x] = sum;
        __syncthreads();
        for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
            if (threadIdx.x < w)
                part[threadIdx.x] += part[threadIdx.x + w];
            __syncthreads();
        }
        if (threadIdx.x == 0)
            dx[e] = acc ? dx[e] + part[0] : part[0];
        __syncthreads(); /* part[] is reused by the next element */
    }
}


__device__ float ew_un(tp_op_kind_t k, float v, float p, float hi) {
    switch (k) {
    case TP_OP_NEG: return -v;
    case TP_OP_ABS: return fabsf(v);
    case TP_OP_SQUARE: return v * v;
    case TP_OP_SQRT: return sqrtf(v);
    case TP_OP_RSQRT: return 1.0f / sqrtf(v);
    case TP_OP_EXP: return expf(v);
    case TP_OP_LOG: return logf(v);
    case TP_OP_POW: return powf(v, p);
    case TP_OP_CLIP: {
        const float w = v < p ? p : v;
        return w > hi ? hi : w;
    }
    case TP_OP_GELU: return tp_cuda_gelu(v);
    case TP_OP_GELU_TANH: return tp_cuda_gelu_tanh(v);
    case TP_OP_SILU: return v / (1.0f + expf(-v));
    case TP_OP_SOFTPLUS: return v > 20.0f ? v : log1pf(expf(v));
    case TP_OP_STOP_GRADIENT: return v;
    default: return 0.0f;
    }
}

__device__ float ew_un_grad(tp_op_kind_t k, float g, float v, float y, float p,
                            float hi) {
    switch (k) {
    case TP_OP_NEG: return -g;
    case TP_OP_ABS: return v > 0.0f ? g : v < 0.0f ? -g : 0.0f;
    case TP_OP_SQUARE: return 2.0f * v * g;
    case TP_OP_SQRT: return g / (2.0f * y);
    case TP_OP_RSQRT: return -0.5f * g * y * y * y;
    case TP_OP_EXP: return g * y;
    case TP_OP_LOG: return g / v;
    case TP_OP_POW: return p == 0.0f ? 0.0f : g * p * powf(v, p - 1.0f);
    case TP_OP_CLIP: return v >= p && v <= hi ? g : 0.0f;
    case TP_OP_GELU: return tp_cuda_gelu_grad(g, v);
    case TP_OP_GELU_TANH: return tp_cuda_gelu_tanh_grad(g, v);
    case TP_OP_SILU: {
        const float s = 1.0f / (1.0f + expf(-v));
        return g * s * (1.0f + v * (1.0f - s));
    }
    case TP_OP_SOFTPLUS: return v > 20.0f ? g : g / (1.0f + expf(-v));
    default: return 0.0f;
    }
}

__global__ void k_unary(tp_op_kind_t k, const float *x, float *y, size_t n,
                        float p, float hi) {
    TP_EW_GRID_LOOP(i, n) y[i] = ew_un(k, x[i], p, hi);
}

__global__ void k_unary_grad(tp_op_kind_t k, const float *x, const float *y,
                             const float *dy, float *dx, int acc, size_t n,
                             float p, float hi) {
    TP_EW_GRID_LOOP(i, n) {
        const float g = ew_un_grad(k, dy[i], x[i], y[i], p, hi);
        dx[i] = acc ? dx[i] + g : g;
    }
}

#define EW_CONST_CHUNK 960
struct ew_chunk {
    float v[EW_CONST_CHUNK];
};

__global__ void k_constant(ew_chunk c, float *y, size_t n) {
    TP_EW_GRID_LOOP(i, n) y[i] = c.v[i];
}

}  // namespace

#define TP_EW_LAUNCHED() TP_CUDA_CHECK(cudaGetLastError())

int tp_cuda_elementwise_kind(tp_op_kind_t k) {
    switch (k) {
    case TP_OP_ADD: case TP_OP_SUB: case TP_OP_MUL: case TP_OP_DIV:
    case TP_OP_MAXIMUM: case TP_OP_MINIMUM: case TP_OP_NEG: case TP_OP_ABS:
    case TP_OP_SQUARE: case TP_OP_SQRT: case TP_OP_RSQRT: case TP_OP_EXP:
    case TP_OP_LOG: case TP_OP_POW: case TP_OP_CLIP: case TP_OP_GELU:
    case TP_OP_GELU_TANH: case TP_OP_SILU: case TP_OP_SOFTPLUS:
    case TP_OP_CONSTANT: case TP_OP_STOP_GRADIENT:
        return 1;
    default:
        return 0;
    }
}

static int s_binary(tp_op_kind_t k) {
    return k == TP_OP_ADD || k == TP_OP_SUB || k == TP_OP_MUL || k == TP_OP_DIV ||
           k == TP_OP_MAXIMUM || k == TP_OP_MINIMUM;
}

tp_status_t tp_cuda_elementwise_forward(tp_stream_t *s, const tp_op_call_t *c) {
    const size_t ny = tp_shape_count(&c->yshape);
    float *y = (float *)c->y;
    if (!tp_cuda_elementwise_kind(c->kind))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA forward for op %s",
                        c->name, tp_op_name(c->kind));
    if (ny == 0)
        return TP_OK;
    if (s_binary(c->kind)) {
        ew_bc bc;
        ew_bc_init(&bc, &c->yshape, &c->xshape[0], &c->xshape[1]);
        k_binary<<<tp_cuda_blocks(ny, 256), 256, 0, s->cu>>>(
            c->kind, bc, (const float *)c->x[0], (const float *)c->x[1], y, ny);
        TP_EW_LAUNCHED();
        return TP_OK;
    }
    if (c->kind == TP_OP_CONSTANT) {
        for (size_t off = 0; off < ny; off += EW_CONST_CHUNK) {
            const size_t n = ny - off < EW_CONST_CHUNK ? ny - off : EW_CONST_CHUNK;
            ew_chunk ch;
            memset(&ch, 0, sizeof ch);
            memcpy(ch.v, c->attr->data + off, n * sizeof(float));
            k_constant<<<tp_cuda_blocks(n, 256), 256, 0, s->cu>>>(ch, y + off, n);
            TP_EW_LAUNCHED();
        }
        return TP_OK;
    }
    k_unary<<<tp_cuda_blocks(ny, 256), 256, 0, s->cu>>>(
        c->kind, (const float *)c->x[0], y, ny, c->attr->alpha, c->attr->beta);
    TP_EW_LAUNCHED();
    return TP_OK;
}

tp_status_t tp_cuda_elementwise_backward(tp_stream_t *s, const tp_op_call_t *c) {
    const size_t ny = tp_shape_count(&c->yshape);
    if (!tp_cuda_elementwise_kind(c->kind))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA backward for op %s",
                        c->name, tp_op_name(c->kind));
    if (c->kind == TP_OP_CONSTANT || c->kind == TP_OP_STOP_GRADIENT)
        return TP_OK; /* nothing flows back */
    if (s_binary(c->kind)) {
        ew_bc bc;
        ew_bc_init(&bc, &c->yshape, &c->xshape[0], &c->xshape[1]);
        for (int p = 0; p < 2; p++) {
            if (!c->dx[p])
                continue;
            const size_t count = tp_shape_count(&c->xshape[p]);
            if (count == 0)
                continue;
            const size_t reduced = count ? ny / count : 0;
            if (reduced >= 64) { /* a block sums each element */
                const unsigned grid = (unsigned)(count < (1u << 20) ? count : (1u << 20));
                k_binary_grad_rows<<<grid, EW_ROWS_THREADS, 0, s->cu>>>(
                    c->kind, p, bc, (const float *)c->x[0], (const float *)c->x[1],
                    c->dy, c->dx[p], c->dx_acc[p], count, reduced);
            } else {
                k_binary_grad<<<tp_cuda_blocks(count, 256), 256, 0, s->cu>>>(
                    c->kind, p, bc, (const float *)c->x[0], (const float *)c->x[1],
                    c->dy, c->dx[p], c->dx_acc[p], count, reduced);
            }
            TP_EW_LAUNCHED();
        }
        return TP_OK;
    }
    if (!c->dx[0] || ny == 0)
        return TP_OK;
    k_unary_grad<<<tp_cuda_blocks(ny, 256), 256, 0, s->cu>>>(
        c->kind, (const float *)c->x[0], (const float *)c->y, c->dy, c->dx[0],
        c->dx_acc[0], ny, c->attr->alpha, c->attr->beta);
    TP_EW_LAUNCHED();
    return TP_OK;
}
