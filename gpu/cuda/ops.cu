/* towerpack gpu/cuda: every graph op on the device, forward and backward.
 *
 * cuBLAS for matrix products; cuDNN (its long-standing descriptor API,
 * still in cuDNN 9) for convolution, pooling, batch norm, relu/tanh/sigmoid
 * and the log-softmax; own kernels for the rest (bias, leaky relu, scale,
 * add, the elementwise family in ops_elementwise.cu, the shape family
 * (concat among them) in ops_shape.cu, global average pooling, dropout, the cross-entropy loss and
 * gradient, accuracy, L2 decay, casts). Semantics are the CPU backend's
 * (gpu/cpu/ops_cpu.c), including dx_acc (overwrite or add) and the workspace
 * contract: what forward leaves there, backward reads.
 *
 * Descriptors and convolution algorithms are made once per (node, shapes)
 * and cached. Labels are checked on the device: a bad label sets a flag
 * that the stream's next sync turns into the CPU backend's error message.
 * Dropout takes one key per call from the tower's generator, as the CPU
 * does, and each thread draws its element from (key, i) with the CPU's
 * function (backend_impl.h): the same masks, no mask made on the host.
 *
 * Built on machines without a GPU; tests/gpu/test_cuda_ops.c checks every
 * op against the CPU backend on an H100 or H200 through
 * scripts/gpu-check.sh (docs/cuda.md says what has run, and where). */
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/log.h>
#include "gpu/cuda/internal.h"
#include "gpu/cuda/ops_elementwise.h"
#include "gpu/cuda/ops_loss.h"
#include "gpu/cuda/ops_reduce.h"
#include "gpu/cuda/ops_shape.h"
#include "gpu/cuda/ops_conv.h"
/* the linalg family */
#include "gpu/cuda/ops_linalg.h"
#include "gpu/cuda/ops_norm.h"
#include "gpu/cuda/ops_attention.h"

#define TP_CONV_WS_MAX ((size_t)64 << 20) /* cuDNN workspace per conv node */
#define TP_L2_BLOCKS 64

static const float s_one = 1.0f, s_zero = 0.0f;

/* ---- the descriptor cache ----------------------------------------------- */

/* The three directions of a convolution, each with its own descriptor and
 * algorithm (see s_conv_pick). */
enum { S_CONV_FWD, S_CONV_BWD_DATA, S_CONV_BWD_FILTER, S_CONV_DIRS };

struct tp_cuda_entry {
    tp_op_kind_t kind;
    tp_op_attr_t attr;
    const void *key;
    tp_shape_t x0, x1;
    cudnnTensorDescriptor_t xd, yd, bd;
    cudnnFilterDescriptor_t wd;
    /* one convolution per direction, alike but for the math type of the
     * direction's own algorithm */
    cudnnConvolutionDescriptor_t cd[S_CONV_DIRS];
    cudnnPoolingDescriptor_t pd;
    cudnnActivationDescriptor_t ad;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t ws; /* cuDNN workspace bytes of the chosen algorithms */
    struct tp_cuda_entry *next;
};

/* The node a call runs, the cache's key: its attributes' address only for
 * calls that name no node (the op tests), since two nodes may share one
 * attribute record and must not share a workspace budget. */
static const void *s_key(const tp_op_call_t *c) {
    return c->node ? c->node : (const void *)c->attr;
}

static size_t s_hash(const void *key, tp_op_kind_t kind) {
    uintptr_t h = (uintptr_t)key;
    h ^= h >> 17;
    h *= 0x9e3779b97f4a7c15ull;
    return (size_t)((h >> 20) ^ (uintptr_t)kind) % TP_CUDA_CACHE_BUCKETS;
}

static void s_entry_free(struct tp_cuda_entry *e) {
    if (e->xd)
        cudnnDestroyTensorDescriptor(e->xd);
    if (e->yd)
        cudnnDestroyTensorDescriptor(e->yd);
    if (e->bd)
        cudnnDestroyTensorDescriptor(e->bd);
    if (e->wd)
        cudnnDestroyFilterDescriptor(e->wd);
    for (int d = 0; d < S_CONV_DIRS; d++)
        if (e->cd[d])
            cudnnDestroyConvolutionDescriptor(e->cd[d]);
    if (e->pd)
        cudnnDestroyPoolingDescriptor(e->pd);
    if (e->ad)
        cudnnDestroyActivationDescriptor(e->ad);
    free(e);
}

void tp_cuda_cache_free(tp_cuda_backend_t *cb) {
    for (int i = 0; i < TP_CUDA_CACHE_BUCKETS; i++)
        while (cb->cache[i]) {
            struct tp_cuda_entry *e = cb->cache[i];
            cb->cache[i] = e->next;
            s_entry_free(e);
        }
}

static int s_dim(int64_t v) { return (int)v; }

/* [N, C, S, 1]: batch, channels, everything after (1 for [N] or [N,C]). */
static tp_status_t s_ncs_desc(cudnnTensorDescriptor_t d, const tp_shape_t *s) {
    int64_t n = s->ndim > 0 ? s->d[0] : 1, c = s->ndim > 1 ? s->d[1] : 1,
            sp = 1;
    for (int i = 2; i < s->ndim; i++)
        sp *= s->d[i];
    TP_CUDA_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW,
                                             CUDNN_DATA_FLOAT, s_dim(n),
                                             s_dim(c), s_dim(sp), 1));
    return TP_OK;
}

static tp_status_t s_nchw_desc(cudnnTensorDescriptor_t d, const tp_shape_t *s) {
    TP_CUDA_CHECK(cudnnSetTensor4dDescriptor(
        d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s_dim(s->d[0]), s_dim(s->d[1]),
        s_dim(s->d[2]), s_dim(s->d[3])));
    return TP_OK;
}

/* Workspace budget of a conv node at a shape it was not planned at (a
 * smaller batch): the bytes its workspace holds, which the call says when a
 * model makes it; else what op_workspace planned for the same node (the
 * largest entry of its key). Keyed by node, never by the attributes'
 * address: two nodes sharing attributes must not take each other's budget,
 * which could overrun the smaller one's workspace. */
static size_t s_conv_budget(tp_cuda_backend_t *cb, const tp_op_call_t *c,
                            int planning) {
    if (planning)
        return TP_CONV_WS_MAX;
    if (c->workspace_bytes)
        return c->workspace_bytes;
    const void *key = s_key(c);
    size_t best = 0;
    for (struct tp_cuda_entry *e = cb->cache[s_hash(key, c->kind)]; e;
         e = e->next)
        if (e->key == key && e->kind == c->kind && e->ws > best)
            best = e->ws;
    return best;
}

/* TF32 off: only plain fp32 FMA algorithms (no tensor-op conversion). */
static int s_math_ok(const tp_cuda_backend_t *cb, cudnnMathType_t m) {
    return cb->tf32 || m == CUDNN_FMA_MATH;
}

/* ---- the convolution algorithm search -----------------------------------
 * The three directions of a convolution choose their algorithms by one rule
 * (s_conv_pick). cuDNN gives each direction its own perf type, argument
 * order and workspace query; s_conv_list and s_conv_ws are the only places
 * that tell the directions apart. */

/* the longest list a direction can return */
static constexpr int s_imax(int a, int b) { return a > b ? a : b; }
static constexpr int S_CONV_ALGO_MAX =
    s_imax(CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
           s_imax(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT));

/* What the choice needs of any direction's cudnn*AlgoPerf_t. */
struct s_conv_perf {
    int algo;
    cudnnStatus_t status;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
    float ms;  /* measured (cudnnFind*) or cuDNN's estimate; -1: none */
};

/* What a direction runs with. */
struct s_conv_choice {
    int algo;             /* a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    size_t ws;            /* its workspace bytes */
    cudnnMathType_t math; /* the math it was ranked in (set on cd[dir]) */
};

template <typename P>
static void s_perf_copy(const P *perf, int n, s_conv_perf *out) {
    for (int i = 0; i < n; i++)
        out[i] = {(int)perf[i].algo, perf[i].status, perf[i].determinism,
                  perf[i].mathType, perf[i].time};
}

/* cuDNN's list for one direction, fastest first, in the math type cd[dir]
 * carries: ranked by running each algorithm once on scratch buffers
 * (measure: cudnnFind*, which allocates and synchronises, so only when a
 * model is planned) or by cuDNN's heuristics (cudnnGet*_v7: no run). */
static tp_status_t s_conv_list(cudnnHandle_t h, const struct tp_cuda_entry *e,
                               int dir, int measure, s_conv_perf *out, int *n) {
    switch (dir) {
    case S_CONV_FWD: {
        cudnnConvolutionFwdAlgoPerf_t p[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        if (measure)
            TP_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithm(
                h, e->xd, e->wd, e->cd[dir], e->yd,
                CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, p));
        else
            TP_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
                h, e->xd, e->wd, e->cd[dir], e->yd,
                CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, p));
        s_perf_copy(p, *n, out);
        return TP_OK;
    }
    case S_CONV_BWD_DATA: {
        cudnnConvolutionBwdDataAlgoPerf_t
            p[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        if (measure)
            TP_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
                h, e->wd, e->yd, e->cd[dir], e->xd,
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, p));
        else
            TP_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                h, e->wd, e->yd, e->cd[dir], e->xd,
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, p));
        s_perf_copy(p, *n, out);
        return TP_OK;
    }
    default: {
        cudnnConvolutionBwdFilterAlgoPerf_t
            p[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        if (measure)
            TP_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
                h, e->xd, e->yd, e->cd[dir], e->wd,
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n, p));
        else
            TP_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                h, e->xd, e->yd, e->cd[dir], e->wd,
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n, p));
        s_perf_copy(p, *n, out);
        return TP_OK;
    }
    }
}

/* Workspace bytes of one algorithm of one direction. */
static cudnnStatus_t s_conv_ws(cudnnHandle_t h, const struct tp_cuda_entry *e,
                               int dir, int algo, size_t *need) {
    switch (dir) {
    case S_CONV_FWD:
        return cudnnGetConvolutionForwardWorkspaceSize(
            h, e->xd, e->wd, e->cd[dir], e->yd,
            (cudnnConvolutionFwdAlgo_t)algo, need);
    case S_CONV_BWD_DATA:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, e->wd, e->yd, e->cd[dir], e->xd,
            (cudnnConvolutionBwdDataAlgo_t)algo, need);
    default:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, e->xd, e->yd, e->cd[dir], e->wd,
            (cudnnConvolutionBwdFilterAlgo_t)algo, need);
    }
}

/* The fastest algorithm of direction `dir` within `budget` bytes of
 * workspace. Leaves cd[dir] in the chosen algorithm's math type: cuDNN
 * runs an algorithm in the math its descriptor carries, and ranked it in
 * the math its perf entry names. */
static tp_status_t s_conv_pick(tp_cuda_backend_t *cb, cudnnHandle_t h,
                               struct tp_cuda_entry *e, const tp_op_call_t *c,
                               int dir, size_t budget, int planning,
                               s_conv_choice *out) {
    static const char *const what[S_CONV_DIRS] = {
        "forward convolution", "backward-data", "backward-filter"};
    s_conv_perf perf[S_CONV_ALGO_MAX];
    int n = 0;
    TP_TRY(s_conv_list(h, e, dir, planning && cb->conv_measure, perf, &n));
    /* pass 0: deterministic (reproducible runs) in the asked math;
     * pass 1: the asked math; pass 2: anything that fits */
    for (int i = 0; i < 3 * n; i++) {
        const int j = i % n, pass = i / n;
        size_t need = 0;
        if (perf[j].status != CUDNN_STATUS_SUCCESS ||
            (pass == 0 && perf[j].determinism != CUDNN_DETERMINISTIC) ||
            (pass < 2 && !s_math_ok(cb, perf[j].math)))
            continue;
        /* the workspace is asked in the math the algorithm will run in */
        TP_CUDA_CHECK(cudnnSetConvolutionMathType(e->cd[dir], perf[j].math));
        if (s_conv_ws(h, e, dir, perf[j].algo, &need) !=
                CUDNN_STATUS_SUCCESS ||
            need > budget)
            continue;
        out->algo = perf[j].algo;
        out->ws = need;
        out->math = perf[j].math;
        TP_DEBUG("%s: %s algorithm %d (%s%s math, %zu bytes of workspace, "
                 "%.3f ms %s; %d ranked)", c->name, what[dir], out->algo,
                 perf[j].determinism == CUDNN_DETERMINISTIC ? "deterministic, " : "",
                 perf[j].math == CUDNN_FMA_MATH ? "fma" : "tensor-op", need,
                 (double)perf[j].ms, planning && cb->conv_measure ? "measured" : "estimated", n);
        return TP_OK;
    }
    return tp_error(TP_ERR_UNSUPPORTED,
                    "%s: no cuDNN %s algorithm fits %zu bytes of workspace",
                    c->name, what[dir], budget);
}

static tp_status_t s_conv_setup(tp_cuda_backend_t *cb, cudnnHandle_t h,
                                struct tp_cuda_entry *e,
                                const tp_op_call_t *c, size_t budget,
                                int planning) {
    const tp_op_attr_t *a = c->attr;
    /* the convolution family: a transposed convolution is the conv from
     * its output to its input (xd its y, yd its x; W [C,O/g,KH,KW] is that
     * conv's filter as it stands), run backward-data first */
    const int tr = c->kind == TP_OP_CONV_TRANSPOSE;
    if (tr && (a->oph >= a->sh || a->opw >= a->sw))
        /* the conv from y back to x would make x one row larger */
        return tp_error(TP_ERR_UNSUPPORTED, "%s: output padding %d not below the "
                        "stride %d (allowed by dilation %d): cuDNN's transposed "
                        "convolution needs it below the stride", c->name, a->oph,
                        a->sh, a->dh);
    TP_TRY(s_nchw_desc(e->xd, tr ? &c->yshape : &c->xshape[0]));
    TP_TRY(s_nchw_desc(e->yd, tr ? &c->xshape[0] : &c->yshape));
    const tp_shape_t *w = &c->xshape[1];
    TP_CUDA_CHECK(cudnnSetFilter4dDescriptor(e->wd, CUDNN_DATA_FLOAT,
                                             CUDNN_TENSOR_NCHW, s_dim(w->d[0]),
                                             s_dim(w->d[1]), s_dim(w->d[2]),
                                             s_dim(w->d[3])));
    TP_CUDA_CHECK(cudnnSetTensor4dDescriptor(e->bd, CUDNN_TENSOR_NCHW,
                                             CUDNN_DATA_FLOAT, 1,
                                             s_dim(c->yshape.d[1]), 1, 1));
    s_conv_choice ch[S_CONV_DIRS];
    size_t ws = 0;
    for (int d = 0; d < S_CONV_DIRS; d++) {
        TP_CUDA_CHECK(cudnnSetConvolution2dDescriptor(
            e->cd[d], a->ph, a->pw, a->sh, a->sw, a->dh > 0 ? a->dh : 1,
            a->dw > 0 ? a->dw : 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
        if (a->groups > 1)
            TP_CUDA_CHECK(cudnnSetConvolutionGroupCount(e->cd[d], a->groups));
        /* the math the search may rank in; s_conv_pick then sets the
         * chosen algorithm's own */
        TP_CUDA_CHECK(cudnnSetConvolutionMathType(
            e->cd[d], cb->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
        TP_TRY(s_conv_pick(cb, h, e, c, d, budget, planning, &ch[d]));
        ws = ch[d].ws > ws ? ch[d].ws : ws;
    }
    e->fwd = (cudnnConvolutionFwdAlgo_t)ch[S_CONV_FWD].algo;
    e->bwd_data = (cudnnConvolutionBwdDataAlgo_t)ch[S_CONV_BWD_DATA].algo;
    e->bwd_filter =
        (cudnnConvolutionBwdFilterAlgo_t)ch[S_CONV_BWD_FILTER].algo;
    e->ws = ws; /* one workspace serves the three in turn */
    return TP_OK;
}

static tp_status_t s_entry_setup(tp_cuda_backend_t *cb, cudnnHandle_t h,
                                 struct tp_cuda_entry *e,
                                 const tp_op_call_t *c, int planning) {
    const tp_op_attr_t *a = c->attr;
    TP_CUDA_CHECK(cudnnCreateTensorDescriptor(&e->xd));
    TP_CUDA_CHECK(cudnnCreateTensorDescriptor(&e->yd));
    TP_CUDA_CHECK(cudnnCreateTensorDescriptor(&e->bd));
    switch (c->kind) {
    case TP_OP_CONV2D:
    case TP_OP_CONV_TRANSPOSE: /* the convolution family */
        TP_CUDA_CHECK(cudnnCreateFilterDescriptor(&e->wd));
        for (int d = 0; d < S_CONV_DIRS; d++)
            TP_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&e->cd[d]));
        return s_conv_setup(cb, h, e, c, s_conv_budget(cb, c, planning),
                            planning);
    case TP_OP_MAX_POOL:
    case TP_OP_AVG_POOL:
        TP_TRY(s_nchw_desc(e->xd, &c->xshape[0]));
        TP_TRY(s_nchw_desc(e->yd, &c->yshape));
        TP_CUDA_CHECK(cudnnCreatePoolingDescriptor(&e->pd));
        TP_CUDA_CHECK(cudnnSetPooling2dDescriptor(
            e->pd,
            c->kind == TP_OP_MAX_POOL
                ? CUDNN_POOLING_MAX_DETERMINISTIC
                : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
            CUDNN_NOT_PROPAGATE_NAN, a->kh, a->kw, a->ph, a->pw, a->sh, a->sw));
        return TP_OK;
    case TP_OP_BATCH_NORM:
        TP_TRY(s_ncs_desc(e->xd, &c->xshape[0]));
        TP_CUDA_CHECK(
            cudnnDeriveBNTensorDescriptor(e->bd, e->xd, CUDNN_BATCHNORM_SPATIAL));
        return TP_OK;
    case TP_OP_RELU:
    case TP_OP_TANH:
    case TP_OP_SIGMOID:
        TP_TRY(s_ncs_desc(e->xd, &c->yshape));
        TP_CUDA_CHECK(cudnnCreateActivationDescriptor(&e->ad));
        TP_CUDA_CHECK(cudnnSetActivationDescriptor(
            e->ad,
            c->kind == TP_OP_RELU   ? CUDNN_ACTIVATION_RELU
            : c->kind == TP_OP_TANH ? CUDNN_ACTIVATION_TANH
                                    : CUDNN_ACTIVATION_SIGMOID,
            CUDNN_NOT_PROPAGATE_NAN, 0.0));
        return TP_OK;
    case TP_OP_SOFTMAX_XENT:
        TP_TRY(s_ncs_desc(e->xd, &c->xshape[0]));
        return TP_OK;
    default:
        return TP_OK;
    }
}

/* The cached entry of this op at these shapes, made on first use. */
static tp_status_t s_entry(tp_cuda_backend_t *cb, cudnnHandle_t h,
                           const tp_op_call_t *c, int planning,
                           struct tp_cuda_entry **out) {
    const void *key = s_key(c);
    size_t b = s_hash(key, c->kind);
    const tp_shape_t none = {0, {0}};
    const tp_shape_t *x1 = c->ninputs > 1 ? &c->xshape[1] : &none;
    pthread_mutex_lock(&cb->mu);
    /* An entry whose workspace exceeds what this node's call holds is
     * another node's that lived at the same address (a destroyed model's):
     * pass it by and choose again within this node's budget. */
    for (struct tp_cuda_entry *e = cb->cache[b]; e; e = e->next)
        if (e->key == key && e->kind == c->kind &&
            memcmp(&e->attr, c->attr, sizeof e->attr) == 0 &&
            tp_shape_same(&e->x0, &c->xshape[0]) && tp_shape_same(&e->x1, x1) &&
            (planning || !c->workspace_bytes || e->ws <= c->workspace_bytes)) {
            pthread_mutex_unlock(&cb->mu);
            *out = e;
            return TP_OK;
        }
    struct tp_cuda_entry *e =
        (struct tp_cuda_entry *)calloc(1, sizeof *e);
    if (!e) {
        pthread_mutex_unlock(&cb->mu);
        return tp_error(TP_ERR_NOMEM, "%s: descriptor cache", c->name);
    }
    e->kind = c->kind;
    e->attr = *c->attr;
    e->key = key;
    e->x0 = c->xshape[0];
    e->x1 = *x1;
    tp_status_t rc = s_entry_setup(cb, h, e, c, planning);
    if (rc < 0) {
        pthread_mutex_unlock(&cb->mu);
        s_entry_free(e);
        return tp_error_wrap(rc, "%s: cuDNN descriptors", c->name);
    }
    e->next = cb->cache[b];
    cb->cache[b] = e;
    pthread_mutex_unlock(&cb->mu);
    *out = e;
    return TP_OK;
}

/* ---- kernels -------------------------------------------------------------- */

#define TP_GRID_LOOP(i, n)                                                   \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

namespace {

/* dst[i] = f(i), or dst[i] += f(i) when acc: the CPU's GRAD_STORE. */
template <typename F>
__global__ void k_store(float *dst, int acc, size_t n, F f) {
    TP_GRID_LOOP(i, n) {
        float v = f(i);
        dst[i] = acc ? dst[i] + v : v;
    }
}

struct f_copy {
    const float *s;
    __device__ float operator()(size_t i) const { return s[i]; }
};
struct f_const {
    float v;
    __device__ float operator()(size_t) const { return v; }
};
struct f_scale {
    const float *s;
    float a;
    __device__ float operator()(size_t i) const { return a * s[i]; }
};
struct f_add {
    const float *a, *b;
    __device__ float operator()(size_t i) const { return a[i] + b[i]; }
};
struct f_leaky {
    const float *x;
    float a;
    __device__ float operator()(size_t i) const {
        float v = x[i];
        return v > 0.0f ? v : a * v;
    }
};
struct f_leaky_bwd {
    const float *x, *dy;
    float a;
    __device__ float operator()(size_t i) const {
        return x[i] > 0.0f ? dy[i] : a * dy[i];
    }
};
struct f_bias {
    const float *x, *b;
    size_t c, sp;
    __device__ float operator()(size_t i) const { return x[i] + b[(i / sp) % c]; }
};
struct f_relu {
    const float *y;
    __device__ float operator()(size_t i) const { return fmaxf(y[i], 0.0f); }
};
/* a folded relu's backward: dy where the output is positive */
struct f_relu_mask {
    const float *y, *dy;
    __device__ float operator()(size_t i) const { return y[i] > 0.0f ? dy[i] : 0.0f; }
};
/* a folded GELU's backward without a bias gradient: dz = dy gelu'(z) */
struct f_gelu_bwd {
    const float *dy, *z;
    int act;
    __device__ float operator()(size_t i) const {
        return act == TP_ACT_GELU ? tp_cuda_gelu_grad(dy[i], z[i])
                                  : tp_cuda_gelu_tanh_grad(dy[i], z[i]);
    }
};
struct f_gap_bwd {
    const float *dy;
    size_t sp;
    float inv;
    __device__ float operator()(size_t i) const { return dy[i / sp] * inv; }
};
struct f_mul {
    const float *a, *b;
    __device__ float operator()(size_t i) const { return a[i] * b[i]; }
};
struct f_xent_bwd {
    const float *logp, *dy;
    const int32_t *lab;
    size_t k;
    float inv_n;
    float off, on; /* the target: off everywhere, on at the label */
    __device__ float operator()(size_t i) const {
        float g = dy[0] * inv_n;
        float target = (size_t)lab[i / k] == i % k ? on : off;
        return g * (expf(logp[i]) - target);
    }
};
struct f_l2_bwd {
    const float *w, *dy;
    float a;
    __device__ float operator()(size_t i) const { return a * dy[0] * w[i]; }
};

/* Sum over a block of 256 threads; the result in thread 0. */
template <typename T>
__device__ T block_sum(T v, T *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

/* out[c] (+)= sum over batch and pixels of v[(i*C + c)*sp + s]; one block
 * per channel, fixed order (deterministic). */
__global__ void k_channel_sum(const float *v, size_t n, size_t C, size_t sp,
                              float *out, int acc) {
    __shared__ double sh[256];
    const size_t c = blockIdx.x, m = n * sp;
    double s = 0.0;
    for (size_t j = threadIdx.x; j < m; j += blockDim.x)
        s += v[((j / sp) * C + c) * sp + j % sp];
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        out[c] = acc ? out[c] + (float)s : (float)s;
}

/* v[i], or with a folded relu's output y: v[i] where y[i] > 0, else 0,
 * also stored in masked[i] (the masked gradient the products then read) */
__device__ __forceinline__ float s_masked_ld(const float *v, const float *y,
                                             float *masked, size_t i, int act) {
    float d = v[i];
    if (y) {
        /* a folded GELU's y is its pre-activation z (masked may be y:
         * dz over z, read before written) */
        if (act == TP_ACT_GELU)
            d = tp_cuda_gelu_grad(d, y[i]);
        else if (act == TP_ACT_GELU_TANH)
            d = tp_cuda_gelu_tanh_grad(d, y[i]);
        else
            d = y[i] > 0.0f ? d : 0.0f;
        masked[i] = d;
    }
    return d;
}

/* The column sums of [rows, C] row-major v (a fully connected layer's bias
 * gradient). A block takes 32 columns, so a warp reads a row's 32 adjacent
 * floats at once (one column a block read a 32-byte sector per float); its
 * 8 row lanes each sum every 8th row, four rows in flight, and the first
 * lane adds the lanes' sums in order. The rows are cut into S slices,
 * grid.y of them (one block a 32 columns left a 1024 x 2048 gradient 64
 * blocks on 132 SMs, each thread walking 32 dependent groups of rows:
 * memory latency, not bandwidth): block (tile, s) sums rows
 * [s * rows / S, (s + 1) * rows / S) into part[s * C + c] (double), and
 * k_column_finish adds a column's S sums in order; with one slice and no
 * `part`, out[c] (+)= the sum directly. Deterministic either way. With y,
 * a folded relu's mask is applied on the way (s_masked_ld): one pass over
 * dy where there were two; act TP_ACT_GELU(_TANH): y is a folded GELU's
 * pre-activation and dy becomes its gradient the same way (batch_matmul's
 * fold: the bias gradient summed as a coalesced column sum beside it). */
__global__ void k_column_partial(const float *v, const float *y, float *masked,
                                 size_t rows, size_t C, size_t S, double *part,
                                 float *out, int acc, int act) {
    __shared__ double sh[8][32];
    const size_t c = blockIdx.x * (size_t)32 + threadIdx.x;
    const size_t sl = blockIdx.y;
    const size_t r1 = (sl + 1) * rows / S;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    if (c < C) {
        size_t r = sl * rows / S + threadIdx.y;
        for (; r + 24 < r1; r += 32) {
            s0 += s_masked_ld(v, y, masked, r * C + c, act);
            s1 += s_masked_ld(v, y, masked, (r + 8) * C + c, act);
            s2 += s_masked_ld(v, y, masked, (r + 16) * C + c, act);
            s3 += s_masked_ld(v, y, masked, (r + 24) * C + c, act);
        }
        for (; r < r1; r += 8)
            s0 += s_masked_ld(v, y, masked, r * C + c, act);
    }
    sh[threadIdx.y][threadIdx.x] = (s0 + s1) + (s2 + s3);
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double t = 0.0;
        for (int k = 0; k < 8; k++)
            t += sh[k][threadIdx.x];
        if (part)
            part[sl * C + c] = t;
        else
            out[c] = acc ? out[c] + (float)t : (float)t;
    }
}

__global__ void k_column_finish(const double *part, size_t S, size_t C, float *out,
                                int acc) {
    TP_GRID_LOOP(c, C) {
        double t = 0.0;
        for (size_t sl = 0; sl < S; sl++)
            t += part[sl * C + c];
        out[c] = acc ? out[c] + (float)t : (float)t;
    }
}

/* A folded bias and relu over a matmul's [rows, m] product, in place (attr
 * act; backend_impl.h): a thread a column, its bias read once, the rows
 * strided over grid.y; no index division. A folded GELU (batch_matmul's,
 * act TP_ACT_GELU(_TANH)): y holds the product, kept as the pre-activation
 * z = y + b, and out = gelu(z). */
__global__ void k_bias_act(float *y, const float *b, size_t rows, size_t m, int act,
                           float *out) {
    const size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (c >= m)
        return;
    const float bc = b ? b[c] : 0.0f;
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        float v = b ? y[r * m + c] + bc : y[r * m + c];
        if (act == TP_ACT_GELU || act == TP_ACT_GELU_TANH) {
            if (b)
                y[r * m + c] = v;
            out[r * m + c] = act == TP_ACT_GELU ? tp_cuda_gelu(v) : tp_cuda_gelu_tanh(v);
        } else {
            y[r * m + c] = act == TP_ACT_RELU ? fmaxf(v, 0.0f) : v;
        }
    }
}

/* Batch norm's sums in slices: block (c, s) sums, over the samples [s*n/S,
 * (s+1)*n/S) of channel c, u and u * (v - mean[c]) (mean NULL: 0) in
 * double, into part[2 * (c*S + s)] and the next: the forward pass's sums of
 * x and x^2 (u = v = x), the backward's of dy and dy * (x - mean). S slices
 * a channel so that small channel counts still fill the device (one block
 * per channel left 100 of 132 SMs idle at 32 channels); the order is fixed
 * (deterministic). Indices are 32-bit (s_bn_fits). With `relu` (the
 * backward of a folded relu: the op's output y) u counts only where y > 0. */
__global__ void k_bn_partial(const float *u, const float *v, const float *mean,
                             const float *relu, unsigned n, unsigned C,
                             unsigned sp, unsigned S, double *part) {
    __shared__ double sh[256];
    const unsigned c = blockIdx.x, sl = blockIdx.y;
    const unsigned i0 = (unsigned)((unsigned long long)sl * n / S);
    const unsigned i1 = (unsigned)((unsigned long long)(sl + 1) * n / S);
    const unsigned cnt = (i1 - i0) * sp;
    const float mu = mean ? mean[c] : 0.0f;
    double a = 0.0, b = 0.0;
    for (unsigned e = threadIdx.x; e < cnt; e += blockDim.x) {
        const unsigned o = ((i0 + e / sp) * C + c) * sp + e % sp;
        const float uu = !relu || relu[o] > 0.0f ? u[o] : 0.0f;
        a += uu;
        b += (double)uu * (v[o] - mu);
    }
    a = block_sum(a, sh);
    __syncthreads();
    b = block_sum(b, sh);
    if (threadIdx.x == 0) {
        part[2 * ((size_t)c * S + sl)] = a;
        part[2 * ((size_t)c * S + sl) + 1] = b;
    }
}

/* The forward pass's statistics from the slices' sums (m values a channel):
 * mean and 1/sqrt(var + eps) (the CPU's layout), and the moving averages
 * with the unbiased variance, as the CPU and cuDNN keep them. */
__global__ void k_bn_stats(const double *part, unsigned C, unsigned S, double m,
                           float eps, float alpha, int update, float *mm,
                           float *mv, float *mean, float *inv) {
    TP_GRID_LOOP(c, C) {
        double a = 0.0, b = 0.0;
        for (unsigned sl = 0; sl < S; sl++) {
            a += part[2 * (c * S + sl)];
            b += part[2 * (c * S + sl) + 1];
        }
        const double mu = a / m;
        double var = b / m - mu * mu;
        var = var > 0.0 ? var : 0.0;
        mean[c] = (float)mu;
        inv[c] = (float)(1.0 / sqrt(var + (double)eps));
        if (update) {
            const double unbiased = m > 1 ? var * m / (m - 1) : var;
            mm[c] = alpha * mm[c] + (1.0f - alpha) * (float)mu;
            mv[c] = alpha * mv[c] + (1.0f - alpha) * (float)unbiased;
        }
    }
}

/* y = (x - mean) * inv * gamma + beta, as the CPU rounds it; then a
 * folded relu's max when `relu`. */
__global__ void k_bn_apply(const float *x, const float *g, const float *be,
                           const float *mean, const float *inv, unsigned C,
                           unsigned sp, unsigned total, int relu, float *y) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        const unsigned c = (i / sp) % C;
        const float sc = g[c] * inv[c], sh = be[c] - mean[c] * sc;
        const float v = x[i] * sc + sh;
        y[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

/* The parameters' gradients from the backward slices' sums: dbeta = sum
 * dy, dgamma = inv * sum dy (x - mean); kept in scratch (dg, db) for dx,
 * and stored by each one's own dx_acc. */
__global__ void k_bn_grads(const double *part, unsigned C, unsigned S,
                           const float *inv, float *dg, float *db, float *odg,
                           int acc_g, float *odb, int acc_b) {
    TP_GRID_LOOP(c, C) {
        double a = 0.0, b = 0.0;
        for (unsigned sl = 0; sl < S; sl++) {
            a += part[2 * (c * S + sl)];
            b += part[2 * (c * S + sl) + 1];
        }
        const float gb = (float)a, gg = (float)(b * inv[c]);
        dg[c] = gg;
        db[c] = gb;
        if (odg)
            odg[c] = acc_g ? odg[c] + gg : gg;
        if (odb)
            odb[c] = acc_b ? odb[c] + gb : gb;
    }
}

/* dx = gamma*inv/m * (m*dy - dbeta - xhat*dgamma) in training; in
 * inference the statistics are constants: dx = gamma*inv*dy. With `relu`
 * (a folded relu's output) dy counts only where it is positive. */
__global__ void k_bn_dx(const float *x, const float *dy, const float *relu,
                        const float *g, const float *mean, const float *inv,
                        const float *dg, const float *db, unsigned C, unsigned sp,
                        unsigned total, float m, int training, float *dx, int acc) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        const unsigned c = (i / sp) % C;
        const float is = inv[c], a = g[c] * is;
        const float b = training ? a * db[c] / m : 0.0f;
        const float cc = training ? a * dg[c] * is / m : 0.0f;
        const float d = !relu || relu[i] > 0.0f ? dy[i] : 0.0f;
        const float v = a * d - b - cc * (x[i] - mean[c]);
        dx[i] = acc ? dx[i] + v : v;
    }
}

/* Inference-mode statistics for a later backward: mean, 1/sqrt(var+eps). */
__global__ void k_bn_infer_stats(const float *mm, const float *mv, float eps,
                                 size_t C, float *mean, float *inv) {
    TP_GRID_LOOP(c, C) {
        mean[c] = mm[c];
        inv[c] = 1.0f / sqrtf(mv[c] + eps);
    }
}

/* dst[c] (+)= src[c] */
__global__ void k_store_small(float *dst, const float *src, size_t n, int acc) {
    TP_GRID_LOOP(i, n) dst[i] = acc ? dst[i] + src[i] : src[i];
}

/* y[r] = mean of x[r*sp .. r*sp+sp), one warp per row (grid-stride over
 * rows; a warp's rows are uniform across its lanes). */
__global__ void k_row_mean(const float *x, size_t rows, size_t sp, float *y) {
    const size_t nwarps = (size_t)gridDim.x * blockDim.x / 32;
    const unsigned lane = threadIdx.x % 32;
    for (size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
         w < rows; w += nwarps) {
        const float *r = x + w * sp;
        float s = 0.0f;
        for (size_t j = lane; j < sp; j += 32)
            s += r[j];
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0)
            y[w] = s / (float)sp;
    }
}

/* mask[i] = dropped ? 0 : keep; y = x * mask. The key: `key`, or, in a
 * recorded step, the two floats' bits at pkey (the step's params). */
__global__ void k_dropout(const float *x, float *y, float *mask, size_t n,
                          float keep, uint32_t thr, uint64_t key,
                          const float *pkey) {
    if (pkey)
        key = (uint64_t)__float_as_uint(pkey[0]) |
              ((uint64_t)__float_as_uint(pkey[1]) << 32);
    TP_GRID_LOOP(i, n) {
        float m = tp_dropout_drops(key, thr, i) ? 0.0f : keep;
        mask[i] = m;
        y[i] = x[i] * m;
    }
}

/* Record the first bad label of a check slot: row + 1, then the label. */
__device__ void flag_label(int *checks, int slot, size_t row, int32_t l) {
    if (!checks)
        return;
    if (atomicCAS(&checks[2 * slot], 0, (int)row + 1) == 0)
        checks[2 * slot + 1] = l;
}

/* Mean of -sum_j q_j logp[i, j] over rows, q the label's one-hot or,
 * with smoothing eps, 1 - eps + eps/k there and eps/k elsewhere; one block
 * (deterministic). */
__global__ void k_xent_loss(const float *logp, const int32_t *lab, size_t n,
                            size_t k, float eps, float *y, int *checks,
                            int slot) {
    __shared__ double sh[256];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        int32_t l = lab[i];
        if (l < 0 || (size_t)l >= k) {
            flag_label(checks, slot, i, l);
            continue;
        }
        double t = logp[i * k + (size_t)l];
        if (eps > 0.0f) {
            double mean = 0.0;
            for (size_t j = 0; j < k; j++)
                mean += logp[i * k + j];
            t = (1.0 - eps) * t + eps * mean / (double)k;
        }
        s -= t;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        *y = (float)(s / (double)n);
}

/* Rows whose first argmax equals the label: fraction or wrong count. */
__global__ void k_correct(const float *x, const int32_t *lab, size_t n,
                          size_t k, float *y, int fraction, int *checks,
                          int slot) {
    __shared__ long long sh[256];
    long long correct = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float *r = x + i * k;
        size_t best = 0;
        for (size_t j = 1; j < k; j++)
            if (r[j] > r[best])
                best = j;
        int32_t l = lab[i];
        if (l < 0 || (size_t)l >= k)
            flag_label(checks, slot, i, l);
        correct += best == (size_t)l;
    }
    correct = block_sum(correct, sh);
    if (threadIdx.x == 0)
        *y = fraction ? (float)correct / (float)n : (float)(n - (size_t)correct);
}

/* partial[b] = sum of w^2 over block b's grid-stride share. */
__global__ void k_sumsq(const float *w, size_t n, double *partial) {
    __shared__ double sh[256];
    double s = 0.0;
    TP_GRID_LOOP(i, n) s += (double)w[i] * w[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

__global__ void k_l2_final(const double *partial, size_t n, float alpha,
                           float *y) {
    __shared__ double sh[256];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        s += partial[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        *y = (float)(0.5 * alpha * s);
}

}  // namespace

template <typename F>
static tp_status_t s_store(tp_stream_t *s, float *dst, int acc, size_t n, F f) {
    if (n == 0)
        return TP_OK;
    k_store<<<tp_cuda_blocks(n, 256), 256, 0, s->cu>>>(dst, acc, n, f);
    TP_CUDA_CHECK(cudaGetLastError());
    return TP_OK;
}

#define TP_LAUNCHED() TP_CUDA_CHECK(cudaGetLastError())

static size_t s_count(const tp_shape_t *s) { return tp_shape_count(s); }

/* Column sums of a [rows, C] row-major tensor (a fully connected layer's
 * bias gradient) in slices of the rows: about 4 blocks per SM, at least 32
 * rows a slice, at most 64 slices; 1: one pass, no partial sums. */
static size_t s_colsum_slices(size_t rows, size_t C) {
    const size_t tiles = (C + 31) / 32;
    const size_t want = (528 + tiles - 1) / (tiles ? tiles : 1);
    size_t S = (rows + 31) / 32;
    S = want < S ? want : S;
    S = S < 64 ? S : 64;
    return S ? S : 1;
}

/* the workspace the slices' partial sums take (0: one pass) */
static size_t s_colsum_room(size_t rows, size_t C) {
    const size_t S = s_colsum_slices(rows, C);
    return S > 1 ? S * C * sizeof(double) : 0;
}

/* out (+)= the column sums of v: in slices where `ws` holds their partial
 * sums, else in one pass. With y (a folded relu's output), of v masked by
 * y > 0, the masked values stored in `masked` as well. */
static tp_status_t s_column_sum(tp_stream_t *s, const float *v, const float *y,
                                float *masked, size_t rows, size_t C, float *out,
                                int acc, void *ws, size_t ws_bytes,
                                int act = TP_ACT_RELU) {
    if (C == 0)
        return TP_OK;
    size_t S = s_colsum_slices(rows, C);
    if (!ws || ws_bytes < S * C * sizeof(double))
        S = 1;
    const unsigned tiles = (unsigned)((C + 31) / 32);
    double *part = S > 1 ? (double *)ws : NULL;
    k_column_partial<<<dim3(tiles, (unsigned)S), dim3(32, 8), 0, s->cu>>>(
        v, y, masked, rows, C, S, part, out, acc, act);
    TP_LAUNCHED();
    if (part) {
        k_column_finish<<<tp_cuda_blocks(C, 256), 256, 0, s->cu>>>(part, S, C, out, acc);
        TP_LAUNCHED();
    }
    return TP_OK;
}

/* y = act(y + b) (b NULL: no bias; act TP_ACT_NONE or TP_ACT_RELU) over
 * [rows, m]; act TP_ACT_GELU(_TANH): y += b and out = gelu(y) */
static tp_status_t s_bias_act(tp_stream_t *s, float *y, const float *b, size_t rows,
                              size_t m, int act, float *out = NULL) {
    if (rows == 0 || m == 0)
        return TP_OK;
    const unsigned threads = m >= 256 ? 256 : (unsigned)((m + 31) / 32 * 32);
    const size_t gx = (m + threads - 1) / threads;
    size_t gy = (1056 + gx - 1) / gx; /* ~8 blocks per SM in all */
    gy = gy < rows ? gy : rows;
    gy = gy < 65535 ? gy : 65535;
    k_bias_act<<<dim3((unsigned)gx, (unsigned)gy), threads, 0, s->cu>>>(y, b, rows, m,
                                                                        act, out);
    TP_LAUNCHED();
    return TP_OK;
}

static void s_ncs(const tp_shape_t *s, size_t *n, size_t *c, size_t *sp) {
    *n = s->ndim > 0 ? (size_t)s->d[0] : 1;
    *c = s->ndim > 1 ? (size_t)s->d[1] : 1;
    *sp = 1;
    for (int i = 2; i < s->ndim; i++)
        *sp *= (size_t)s->d[i];
}

/* Batch norm's training passes by towerpack's kernels (k_bn_*; the
 * default) or, with TP_CUDA_BN=cudnn, by cuDNN's legacy calls (spatial
 * mode). Ours slice each channel's sums over the batch (s_bn_slices) and
 * need 32-bit indices (s_bn_fits; larger tensors take cuDNN's). The
 * parameters' gradients without dx, and inference mode's backward, are
 * always ours. */
static size_t s_bn_slices(size_t n, size_t ch) {
    const size_t want = (528 + ch - 1) / (ch ? ch : 1); /* ~4 blocks per SM */
    return want < n ? want : (n ? n : 1);
}

/* The slices a call's workspace holds: s_bn_slices at its shape, fewer
 * if it was planned smaller (at least 1: 4 x C floats + 2 x C doubles). */
static size_t s_bn_call_slices(const tp_op_call_t *c, size_t n, size_t ch) {
    size_t S = s_bn_slices(n, ch);
    if (c->workspace_bytes > 4 * ch * sizeof(float)) {
        size_t room = (c->workspace_bytes - 4 * ch * sizeof(float)) / (2 * ch * sizeof(double));
        S = room && room < S ? room : S;
    }
    return S;
}

static int s_bn_fits(const tp_cuda_backend_t *cb, size_t n, size_t ch, size_t sp) {
    return !cb->bn_cudnn && n * ch * sp < (1u << 31);
}

/* The slices' sums, after mean, inv, dgamma, dbeta (4 x C floats: a
 * multiple of 8 bytes) in the op's workspace. */
static double *s_bn_part(void *ws, size_t ch) {
    return (double *)((char *)ws + 4 * ch * sizeof(float));
}


/* Row-major C = alpha op(A) op(B) + beta C on the stream's cuBLAS handle. */
static tp_status_t s_gemm_rm(tp_stream_t *s, int ta, int tb, int m, int n,
                             int k, const float *a, int lda, const float *b,
                             int ldb, float beta, float *c, int ldc) {
    TP_CUDA_CHECK(tp_cuda_sgemm(s, ta, tb, m, n, k, &s_one, a, lda, b, ldb, &beta,
                                c, ldc));
    return TP_OK;
}

/* ---- label checks --------------------------------------------------------- */

static int s_check_slot(tp_stream_t *s, const tp_op_call_t *c, size_t k) {
    if (s->nchecks >= TP_CUDA_MAX_CHECKS)
        return -1; /* more label ops than slots between two syncs: unchecked */
    int slot = s->nchecks++;
    s->check_name[slot] = c->name;
    s->check_k[slot] = (int)k;
    return slot;
}

/* The checks' flags copied into pinned memory behind the stream's work,
 * then one synchronisation (the stream's sync is this one when checks are
 * pending: a step pays one sync, not two). */
tp_status_t tp_cuda_checks_collect(tp_stream_t *s) {
    if (s->nchecks == 0)
        return TP_OK;
    int *host = s->checks_host;
    int n = s->nchecks;
    s->nchecks = 0;
    TP_CUDA_CHECK(cudaMemcpyAsync(host, s->checks, sizeof(int) * 2 * (size_t)n,
                                  cudaMemcpyDeviceToHost, s->cu));
    TP_CUDA_CHECK(cudaStreamSynchronize(s->cu));
    for (int i = 0; i < n; i++)
        if (host[2 * i]) {
            TP_CUDA_CHECK(cudaMemsetAsync(s->checks, 0,
                                          sizeof(int) * 2 * (size_t)n, s->cu));
            return tp_error(TP_ERR_INVALID,
                            "%s: label %d at row %d outside [0,%d)",
                            s->check_name[i], host[2 * i + 1], host[2 * i] - 1,
                            s->check_k[i]);
        }
    return TP_OK;
}

tp_status_t tp_cuda_snaps_read(tp_stream_t *s, int which) {
    tp_status_t rc = TP_OK;
    for (int i = which < 0 ? 0 : which; i < (which < 0 ? 2 : which + 1); i++) {
        int n = s->snap_n[i];
        s->snap_n[i] = 0;
        for (int k = 0; k < n && rc == TP_OK; k++)
            if (s->snap[i][2 * k])
                rc = tp_error(TP_ERR_INVALID, "%s: label %d at row %d outside [0,%d)",
                              s->snap_name[i][k], s->snap[i][2 * k + 1],
                              s->snap[i][2 * k] - 1, s->snap_k[i][k]);
    }
    return rc;
}

/* ---- workspace ------------------------------------------------------------ */


static size_t s_workspace(tp_cuda_backend_t *cb, const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_CONV2D:
    case TP_OP_CONV_TRANSPOSE: {
        struct tp_cuda_entry *e = NULL;
        if (tp_cuda_use(cb) < 0 || s_entry(cb, cb->def->dnn, c, 1, &e) < 0) {
            /* planning goes on; the step reports the failure */
            TP_WARN("%s", tp_last_error());
            return 0;
        }
        return e->ws;
    }
    case TP_OP_BATCH_NORM: {
        /* mean[C], inv[C] (the CPU's layout), then dgamma[C], dbeta[C],
         * then the slices' sums (s_bn_part) */
        size_t n, ch, sp;
        s_ncs(&c->xshape[0], &n, &ch, &sp);
        return 4 * ch * sizeof(float) + 2 * ch * s_bn_slices(n, ch) * sizeof(double);
    }
    case TP_OP_DROPOUT: {
        size_t n = s_count(&c->yshape);
        return n * sizeof(float);  /* the mask, for backward */
    }
    case TP_OP_MATMUL: /* a folded bias's gradient, summed in slices */
        return s_colsum_room((size_t)c->xshape[0].d[0], (size_t)c->xshape[1].d[1]);
    case TP_OP_BIAS_ADD: {
        size_t n, ch, sp;
        s_ncs(&c->xshape[0], &n, &ch, &sp);
        return sp == 1 ? s_colsum_room(n, ch) : 0;
    }
    case TP_OP_SOFTMAX_XENT:
        return s_count(&c->xshape[0]) * sizeof(float); /* log-probabilities */
    case TP_OP_BATCH_MATMUL: { /* a folded bias's gradient, summed in slices
                                  (the bias may not be allocated yet when
                                  planned: the backend's flag decides) */
        const tp_shape_t *ys = &c->yshape;
        if (!cb->bmm_fold || ys->ndim < 2 || c->xshape[1].ndim != 2)
            return 0;
        const size_t n = (size_t)ys->d[ys->ndim - 1];
        return n ? s_colsum_room(s_count(ys) / n, n) : 0;
    }
    case TP_OP_L2_DECAY:
        return (size_t)c->ninputs * TP_L2_BLOCKS * sizeof(double);
    /* the linalg family: the norms' row statistics for the backward */
    case TP_OP_LAYER_NORM: case TP_OP_GROUP_NORM: case TP_OP_INSTANCE_NORM:
        return tp_cuda_norm_workspace(c);
    case TP_OP_REDUCE_MAX: case TP_OP_SOFTMAX_XENT_SEQ: /* the reduce family */
        return tp_cuda_reduce_workspace(c);
    case TP_OP_ATTENTION: /* fused attention: ops_attention.cu */
        return tp_cuda_attention_workspace(c);
    case TP_OP_GATHER: /* its backward's sort: ops_shape.cu */
        /* CUB sizes its scratch for the current device */
        if (tp_cuda_use(cb) < 0) {
            TP_WARN("%s", tp_last_error());
            return 0;
        }
        return tp_cuda_gather_workspace(c);
    default:
        return 0;
    }
}

/* ---- forward -------------------------------------------------------------- */

static tp_status_t s_conv_fwd(tp_cuda_backend_t *cb, tp_stream_t *s,
                              const tp_op_call_t *c) {
    struct tp_cuda_entry *e;
    TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
    TP_CUDA_CHECK(cudnnConvolutionForward(
        s->dnn, &s_one, e->xd, c->x[0], e->wd, c->x[1], e->cd[S_CONV_FWD],
        e->fwd, c->workspace, e->ws, &s_zero, e->yd, c->y));
    if (c->ninputs > 2)
        TP_CUDA_CHECK(cudnnAddTensor(s->dnn, &s_one, e->bd, c->x[2], &s_one,
                                     e->yd, c->y));
    return TP_OK;
}

/* The transposed convolution: cuDNN's backward-data pass of the conv
 * from y to x, then the bias per output channel. */
static tp_status_t s_deconv_fwd(tp_cuda_backend_t *cb, tp_stream_t *s,
                                const tp_op_call_t *c) {
    struct tp_cuda_entry *e;
    TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
    TP_CUDA_CHECK(cudnnConvolutionBackwardData(
        s->dnn, &s_one, e->wd, c->x[1], e->yd, c->x[0], e->cd[S_CONV_BWD_DATA],
        e->bwd_data, c->workspace, e->ws, &s_zero, e->xd, c->y));
    if (c->ninputs > 2)
        TP_CUDA_CHECK(cudnnAddTensor(s->dnn, &s_one, e->bd, c->x[2], &s_one,
                                     e->xd, c->y));
    return TP_OK;
}

static tp_status_t s_bn_fwd(tp_cuda_backend_t *cb, tp_stream_t *s,
                            const tp_op_call_t *c) {
    struct tp_cuda_entry *e;
    TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
    const tp_op_attr_t *a = c->attr;
    size_t n, ch, sp;
    s_ncs(&c->xshape[0], &n, &ch, &sp);
    float *mean = (float *)c->workspace, *inv = mean + ch;
    if (a->training && s_bn_fits(cb, n, ch, sp)) {
        const size_t S = s_bn_call_slices(c, n, ch), total = n * ch * sp;
        const float *x = (const float *)c->x[0];
        double *part = s_bn_part(c->workspace, ch);
        k_bn_partial<<<dim3((unsigned)ch, (unsigned)S), 256, 0, s->cu>>>(
            x, x, NULL, NULL, (unsigned)n, (unsigned)ch, (unsigned)sp, (unsigned)S, part);
        TP_LAUNCHED();
        k_bn_stats<<<tp_cuda_blocks(ch, 128), 128, 0, s->cu>>>(
            part, (unsigned)ch, (unsigned)S, (double)(n * sp), a->eps, a->alpha,
            a->update_state, (float *)c->state[0], (float *)c->state[1], mean, inv);
        TP_LAUNCHED();
        k_bn_apply<<<tp_cuda_blocks(total, 256), 256, 0, s->cu>>>(
            x, (const float *)c->x[1], (const float *)c->x[2], mean, inv,
            (unsigned)ch, (unsigned)sp, (unsigned)total, a->act == TP_ACT_RELU,
            (float *)c->y);
        TP_LAUNCHED();
        return TP_OK;
    }
    if (a->training) {
        int upd = a->update_state;
        TP_CUDA_CHECK(cudnnBatchNormalizationForwardTraining(
            s->dnn, CUDNN_BATCHNORM_SPATIAL, &s_one, &s_zero, e->xd, c->x[0],
            e->xd, c->y, e->bd, c->x[1], c->x[2], 1.0 - (double)a->alpha,
            upd ? c->state[0] : NULL, upd ? c->state[1] : NULL, (double)a->eps,
            mean, inv));
        return TP_OK;
    }
    TP_CUDA_CHECK(cudnnBatchNormalizationForwardInference(
        s->dnn, CUDNN_BATCHNORM_SPATIAL, &s_one, &s_zero, e->xd, c->x[0], e->xd,
        c->y, e->bd, c->x[1], c->x[2], c->state[0], c->state[1],
        (double)a->eps));
    k_bn_infer_stats<<<tp_cuda_blocks(ch, 256), 256, 0, s->cu>>>(
        c->state[0], c->state[1], a->eps, ch, mean, inv);
    TP_LAUNCHED();
    return TP_OK;
}

/* Dropout's host part: the call's key from the tower's generator; in a
 * recorded or replayed step also put in the step's params (*pkey, where
 * the kernel reads it). Also all a replayed step does for the op. */
static tp_status_t s_dropout_key(tp_stream_t *s, const tp_op_call_t *c,
                                 uint64_t *key, const float **pkey) {
    *key = tp_rng_u64(c->rng);
    *pkey = NULL;
    if (s->mode == TP_CUDA_EAGER)
        return TP_OK;
    float v[2];
    memcpy(v, key, sizeof v);  /* bits, never arithmetic */
    return tp_cuda_step_scalars(s, v, 2, pkey);
}

static tp_status_t s_dropout_fwd(tp_stream_t *s, const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float *x = (const float *)c->x[0];
    float *y = (float *)c->y, *mask = (float *)c->workspace;
    const float rate = c->attr->alpha;
    if (n == 0)
        return TP_OK;
    if (!c->attr->training || rate <= 0.0f) {
        if (y != x)
            TP_CUDA_CHECK(cudaMemcpyAsync(y, x, n * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s->cu));
        return s_store(s, mask, 0, n, f_const{1.0f});
    }
    uint64_t key;
    const float *pkey;
    TP_TRY(s_dropout_key(s, c, &key, &pkey));
    k_dropout<<<tp_cuda_blocks(n, 256), 256, 0, s->cu>>>(
        x, y, mask, n, 1.0f / (1.0f - rate), tp_dropout_threshold(rate), key, pkey);
    TP_LAUNCHED();
    return TP_OK;
}

static tp_status_t s_xent_fwd(tp_cuda_backend_t *cb, tp_stream_t *s,
                              const tp_op_call_t *c) {
    struct tp_cuda_entry *e;
    TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
    const size_t n = (size_t)c->xshape[0].d[0], k = (size_t)c->xshape[0].d[1];
    if (c->xshape[1].d[0] != (int64_t)n)
        return tp_error(TP_ERR_SHAPE, "%s: %lld rows of logits but %lld labels",
                        c->name, (long long)n, (long long)c->xshape[1].d[0]);
    float *logp = (float *)c->workspace;
    TP_CUDA_CHECK(cudnnSoftmaxForward(s->dnn, CUDNN_SOFTMAX_LOG,
                                      CUDNN_SOFTMAX_MODE_INSTANCE, &s_one,
                                      e->xd, c->x[0], &s_zero, e->xd, logp));
    int slot = s_check_slot(s, c, k);
    k_xent_loss<<<1, 256, 0, s->cu>>>(logp, (const int32_t *)c->x[1], n, k,
                                      c->attr->alpha, (float *)c->y,
                                      slot >= 0 ? s->checks : NULL, slot);
    TP_LAUNCHED();
    return TP_OK;
}

static tp_status_t s_correct_fwd(tp_stream_t *s, const tp_op_call_t *c) {
    const size_t n = (size_t)c->xshape[0].d[0], k = (size_t)c->xshape[0].d[1];
    if (c->xshape[1].d[0] != (int64_t)n)
        return tp_error(TP_ERR_SHAPE, "%s: %lld rows of logits but %lld labels",
                        c->name, (long long)n, (long long)c->xshape[1].d[0]);
    int slot = s_check_slot(s, c, k);
    k_correct<<<1, 256, 0, s->cu>>>((const float *)c->x[0],
                                    (const int32_t *)c->x[1], n, k,
                                    (float *)c->y, c->kind == TP_OP_ACCURACY,
                                    slot >= 0 ? s->checks : NULL, slot);
    TP_LAUNCHED();
    return TP_OK;
}

static tp_status_t s_l2_fwd(tp_stream_t *s, const tp_op_call_t *c) {
    double *partial = (double *)c->workspace;
    for (int k = 0; k < c->ninputs; k++) {
        k_sumsq<<<TP_L2_BLOCKS, 256, 0, s->cu>>>((const float *)c->x[k],
                                                  s_count(&c->xshape[k]),
                                                  partial + k * TP_L2_BLOCKS);
        TP_LAUNCHED();
    }
    k_l2_final<<<1, 256, 0, s->cu>>>(partial,
                                     (size_t)c->ninputs * TP_L2_BLOCKS,
                                     c->attr->alpha, (float *)c->y);
    TP_LAUNCHED();
    return TP_OK;
}

/* A replayed step (backend.cu, graph_begin): what each op does on the
 * host, in the order the recording did it, and nothing on the device:
 * dropout takes its key into the step's params, which graph_end copies
 * to the device in one block before the launch; the label ops take their
 * check slots, which the next sync reads. */
tp_status_t tp_cuda_op_forward_host(tp_stream_t *s, const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_DROPOUT: {
        uint64_t key;
        const float *pkey;
        if (s_count(&c->yshape) == 0 || !c->attr->training || c->attr->alpha <= 0.0f)
            return TP_OK;
        return s_dropout_key(s, c, &key, &pkey);
    }
    case TP_OP_SOFTMAX_XENT:
    case TP_OP_ACCURACY:
    case TP_OP_ERROR_COUNT:
        if (c->xshape[1].d[0] != c->xshape[0].d[0])
            return tp_error(TP_ERR_SHAPE, "%s: %lld rows of logits but %lld labels",
                            c->name, (long long)c->xshape[0].d[0],
                            (long long)c->xshape[1].d[0]);
        s_check_slot(s, c, (size_t)c->xshape[0].d[1]);
        return TP_OK;
    case TP_OP_GATHER: case TP_OP_ONE_HOT: /* the shape family's index checks */
        return tp_cuda_shape_forward_host(s, c);
    case TP_OP_SOFTMAX_XENT_SEQ: case TP_OP_TOP_K_ACCURACY: /* the reduce family */
        return tp_cuda_reduce_forward_host(s, c);
    default:
        return TP_OK;
    }
}

static tp_status_t s_forward(tp_cuda_backend_t *cb, tp_stream_t *s,
                             const tp_op_call_t *c) {
    const size_t ny = s_count(&c->yshape);
    const float *x0 = (const float *)c->x[0];
    float *y = (float *)c->y;
    const float a = c->attr->alpha;
    switch (c->kind) {
    case TP_OP_MATMUL: {
        const tp_shape_t *xs = &c->xshape[0];
        int n = (int)xs->d[0], k = (int)(s_count(xs) / (size_t)xs->d[0]);
        int m = (int)c->xshape[1].d[1];
        TP_TRY(s_gemm_rm(s, 0, 0, n, m, k, x0, k, (const float *)c->x[1], m,
                         0.0f, y, m));
        if (c->bias || c->attr->act == TP_ACT_RELU)
            return s_bias_act(s, y, c->bias, (size_t)n, (size_t)m,
                              c->attr->act == TP_ACT_RELU ? TP_ACT_RELU : TP_ACT_NONE);
        return TP_OK;
    }
    case TP_OP_CONV2D:
        return s_conv_fwd(cb, s, c);
    case TP_OP_BIAS_ADD: {
        size_t n, ch, sp;
        s_ncs(&c->xshape[0], &n, &ch, &sp);
        return s_store(s, y, 0, ny, f_bias{x0, (const float *)c->x[1], ch, sp});
    }
    case TP_OP_RELU:
    case TP_OP_TANH:
    case TP_OP_SIGMOID: {
        struct tp_cuda_entry *e;
        TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
        TP_CUDA_CHECK(cudnnActivationForward(s->dnn, e->ad, &s_one, e->xd, x0,
                                             &s_zero, e->xd, y));
        return TP_OK;
    }
    case TP_OP_LEAKY_RELU:
        return s_store(s, y, 0, ny, f_leaky{x0, a});
    case TP_OP_SCALE:
        return s_store(s, y, 0, ny, f_scale{x0, a});
    case TP_OP_MAX_POOL:
    case TP_OP_AVG_POOL: {
        struct tp_cuda_entry *e;
        TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
        TP_CUDA_CHECK(cudnnPoolingForward(s->dnn, e->pd, &s_one, e->xd, x0,
                                          &s_zero, e->yd, y));
        return TP_OK;
    }
    case TP_OP_GLOBAL_AVG_POOL: {
        size_t n, ch, sp;
        s_ncs(&c->xshape[0], &n, &ch, &sp);
        size_t rows = n * ch;
        k_row_mean<<<tp_cuda_blocks(rows * 32, 256), 256, 0, s->cu>>>(x0, rows,
                                                                       sp, y);
        TP_LAUNCHED();
        return TP_OK;
    }
    case TP_OP_BATCH_NORM:
        return s_bn_fwd(cb, s, c);
    case TP_OP_DROPOUT:
        return s_dropout_fwd(s, c);
    case TP_OP_RESHAPE:
        if (c->y != c->x[0] && ny)
            TP_CUDA_CHECK(cudaMemcpyAsync(c->y, c->x[0], ny * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s->cu));
        return TP_OK;
    case TP_OP_ADD:
        if (!tp_shape_same(&c->xshape[0], &c->yshape) ||
            !tp_shape_same(&c->xshape[1], &c->yshape))
            return tp_cuda_elementwise_forward(s, c); /* broadcasting */
        return s_store(s, y, 0, ny, f_add{x0, (const float *)c->x[1]});
    case TP_OP_SOFTMAX_XENT:
        return s_xent_fwd(cb, s, c);
    case TP_OP_ACCURACY:
    case TP_OP_ERROR_COUNT:
        return s_correct_fwd(s, c);
    case TP_OP_L2_DECAY:
        return s_l2_fwd(s, c);
    case TP_OP_CAST:
        if (c->attr->in_dtype == TP_FLOAT32)
            return s_store(s, y, 0, ny, f_scale{x0, a});
        if (c->attr->in_dtype == TP_UINT8)
            return tp_cuda_cast_u8_f32((const uint8_t *)c->x[0], y, ny, a,
                                       s->cu);
        return tp_error(TP_ERR_UNSUPPORTED, "%s: cast from %s", c->name,
                        tp_dtype_name(c->attr->in_dtype));
    case TP_OP_MSE: case TP_OP_L1_LOSS: case TP_OP_HUBER_LOSS:
    case TP_OP_SIGMOID_XENT: /* the loss family: ops_loss.cu */
        return tp_cuda_loss_forward(s, c);
    case TP_OP_TRANSPOSE: case TP_OP_SLICE: case TP_OP_CONCAT: case TP_OP_PAD:
    case TP_OP_BROADCAST_TO: case TP_OP_GATHER:
    case TP_OP_ONE_HOT: /* the shape family: ops_shape.cu */
        return tp_cuda_shape_forward(s, c);
    case TP_OP_CONV_TRANSPOSE: /* the convolution family (ops_conv.cu) */
        return s_deconv_fwd(cb, s, c);
    case TP_OP_UPSAMPLE_NEAREST: case TP_OP_UPSAMPLE_BILINEAR:
        return tp_cuda_upsample_forward(s, c);
    /* the linalg family: ops_linalg.cu, ops_norm.cu */
    case TP_OP_BATCH_MATMUL: return tp_cuda_batch_matmul_forward(s, c);
    case TP_OP_LAYER_NORM: case TP_OP_GROUP_NORM: case TP_OP_INSTANCE_NORM:
        return tp_cuda_norm_forward(s, c);
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
    case TP_OP_ARGMAX: case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
    case TP_OP_SOFTMAX_XENT_SEQ: case TP_OP_TOP_K_ACCURACY: /* the reduce family: ops_reduce.cu */
        return tp_cuda_reduce_forward(s, c);
    case TP_OP_ATTENTION: return tp_cuda_attention_forward(s, c); /* ops_attention.cu */
    default: /* the elementwise family: ops_elementwise.cu */
        return tp_cuda_elementwise_forward(s, c);
    }
}

/* ---- backward ------------------------------------------------------------- */

static tp_status_t s_conv_bwd(tp_cuda_backend_t *cb, tp_stream_t *s,
                              const tp_op_call_t *c) {
    struct tp_cuda_entry *e;
    TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
    if (c->ninputs > 2 && c->dx[2]) {
        const float beta = c->dx_acc[2] ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnConvolutionBackwardBias(s->dnn, &s_one, e->yd, c->dy,
                                                   &beta, e->bd, c->dx[2]));
    }
    if (c->dx[1]) {
        const float beta = c->dx_acc[1] ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnConvolutionBackwardFilter(
            s->dnn, &s_one, e->xd, c->x[0], e->yd, c->dy,
            e->cd[S_CONV_BWD_FILTER], e->bwd_filter, c->workspace, e->ws,
            &beta, e->wd, c->dx[1]));
    }
    if (c->dx[0]) {
        const float beta = c->dx_acc[0] ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnConvolutionBackwardData(
            s->dnn, &s_one, e->wd, c->x[1], e->yd, c->dy,
            e->cd[S_CONV_BWD_DATA], e->bwd_data, c->workspace, e->ws, &beta,
            e->xd, c->dx[0]));
    }
    return TP_OK;
}

/* Its gradients: dx is the conv's forward of dy, dW the conv's filter
 * gradient with dy as the image and x as the output gradient, db the
 * channel sums of dy. */
static tp_status_t s_deconv_bwd(tp_cuda_backend_t *cb, tp_stream_t *s,
                                const tp_op_call_t *c) {
    struct tp_cuda_entry *e;
    TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
    if (c->ninputs > 2 && c->dx[2]) {
        const float beta = c->dx_acc[2] ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnConvolutionBackwardBias(s->dnn, &s_one, e->xd, c->dy,
                                                   &beta, e->bd, c->dx[2]));
    }
    if (c->dx[1]) {
        const float beta = c->dx_acc[1] ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnConvolutionBackwardFilter(
            s->dnn, &s_one, e->xd, c->dy, e->yd, c->x[0],
            e->cd[S_CONV_BWD_FILTER], e->bwd_filter, c->workspace, e->ws,
            &beta, e->wd, c->dx[1]));
    }
    if (c->dx[0]) {
        const float beta = c->dx_acc[0] ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnConvolutionForward(
            s->dnn, &s_one, e->xd, c->dy, e->wd, c->x[1], e->cd[S_CONV_FWD],
            e->fwd, c->workspace, e->ws, &beta, e->yd, c->dx[0]));
    }
    return TP_OK;
}

static tp_status_t s_bn_bwd(tp_cuda_backend_t *cb, tp_stream_t *s,
                            const tp_op_call_t *c) {
    struct tp_cuda_entry *e;
    TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
    size_t n, ch, sp;
    s_ncs(&c->xshape[0], &n, &ch, &sp);
    const float *mean = (const float *)c->workspace, *inv = mean + ch;
    float *dg = (float *)c->workspace + 2 * ch, *db = dg + ch;
    const int training = c->attr->training;
    if (training && c->dx[0] && !s_bn_fits(cb, n, ch, sp)) {
        /* cuDNN: dx (blended by dx_acc), the parameter gradients into
         * scratch, stored below by each one's own dx_acc */
        const float beta = c->dx_acc[0] ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnBatchNormalizationBackward(
            s->dnn, CUDNN_BATCHNORM_SPATIAL, &s_one, &beta, &s_one, &s_zero,
            e->xd, c->x[0], e->xd, c->dy, e->xd, c->dx[0], e->bd, c->x[1], dg,
            db, (double)c->attr->eps, mean, inv));
        if (c->dx[1]) {
            k_store_small<<<tp_cuda_blocks(ch, 256), 256, 0, s->cu>>>(
                c->dx[1], dg, ch, c->dx_acc[1]);
            TP_LAUNCHED();
        }
        if (c->dx[2]) {
            k_store_small<<<tp_cuda_blocks(ch, 256), 256, 0, s->cu>>>(
                c->dx[2], db, ch, c->dx_acc[2]);
            TP_LAUNCHED();
        }
        return TP_OK;
    }
    if (n * ch * sp >= (1u << 31))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: batch norm's backward of %zu "
                        "values (at most 2^31 without cuDNN's training path)",
                        c->name, n * ch * sp);
    /* the sums (also for dx in training), then dx */
    const size_t S = s_bn_call_slices(c, n, ch), total = n * ch * sp;
    const float *x = (const float *)c->x[0];
    /* a folded relu: dy masked as the kernels read it (s_act_native) */
    const float *relu = c->attr->act == TP_ACT_RELU ? (const float *)c->y : NULL;
    double *part = s_bn_part(c->workspace, ch);
    if (training || c->dx[1] || c->dx[2]) {
        k_bn_partial<<<dim3((unsigned)ch, (unsigned)S), 256, 0, s->cu>>>(
            c->dy, x, mean, relu, (unsigned)n, (unsigned)ch, (unsigned)sp, (unsigned)S,
            part);
        TP_LAUNCHED();
        k_bn_grads<<<tp_cuda_blocks(ch, 128), 128, 0, s->cu>>>(
            part, (unsigned)ch, (unsigned)S, inv, dg, db, c->dx[1],
            c->dx_acc[1], c->dx[2], c->dx_acc[2]);
        TP_LAUNCHED();
    }
    if (c->dx[0]) {
        k_bn_dx<<<tp_cuda_blocks(total, 256), 256, 0, s->cu>>>(
            x, c->dy, relu, (const float *)c->x[1], mean, inv, dg, db, (unsigned)ch,
            (unsigned)sp, (unsigned)total, (float)(n * sp), training, c->dx[0],
            c->dx_acc[0]);
        TP_LAUNCHED();
    }
    return TP_OK;
}

static tp_status_t s_backward(tp_cuda_backend_t *cb, tp_stream_t *s,
                              const tp_op_call_t *c) {
    const size_t ny = s_count(&c->yshape);
    const float *x0 = (const float *)c->x[0], *dy = c->dy;
    float *dx0 = c->dx[0];
    const int acc0 = c->dx_acc ? c->dx_acc[0] : 0;
    const float a = c->attr->alpha;
    switch (c->kind) {
    case TP_OP_MATMUL: {
        const tp_shape_t *xs = &c->xshape[0];
        int n = (int)xs->d[0], k = (int)(s_count(xs) / (size_t)xs->d[0]);
        int m = (int)c->xshape[1].d[1];
        if (c->dbias) /* a folded bias add's gradient */
            TP_TRY(s_column_sum(s, dy, NULL, NULL, (size_t)n, (size_t)m, c->dbias,
                                c->dbias_acc, c->workspace, c->workspace_bytes));
        if (c->dx[1])
            TP_TRY(s_gemm_rm(s, 1, 0, k, m, n, x0, k, dy, m,
                             c->dx_acc[1] ? 1.0f : 0.0f, c->dx[1], m));
        if (dx0)
            TP_TRY(s_gemm_rm(s, 0, 1, n, k, m, dy, m, (const float *)c->x[1],
                             m, acc0 ? 1.0f : 0.0f, dx0, k));
        return TP_OK;
    }
    case TP_OP_CONV2D:
        return s_conv_bwd(cb, s, c);
    case TP_OP_BIAS_ADD: {
        size_t n, ch, sp;
        s_ncs(&c->xshape[0], &n, &ch, &sp);
        if (dx0)
            TP_TRY(s_store(s, dx0, acc0, n * ch * sp, f_copy{dy}));
        if (c->dx[1] && sp == 1) {
            TP_TRY(s_column_sum(s, dy, NULL, NULL, n, ch, c->dx[1], c->dx_acc[1],
                                c->workspace, c->workspace_bytes));
        } else if (c->dx[1]) {
            k_channel_sum<<<(unsigned)ch, 256, 0, s->cu>>>(dy, n, ch, sp,
                                                           c->dx[1],
                                                           c->dx_acc[1]);
            TP_LAUNCHED();
        }
        return TP_OK;
    }
    case TP_OP_RELU:
    case TP_OP_TANH:
    case TP_OP_SIGMOID: {
        if (!dx0)
            return TP_OK;
        struct tp_cuda_entry *e;
        TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
        const float beta = acc0 ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnActivationBackward(s->dnn, e->ad, &s_one, e->xd,
                                              c->y, e->xd, dy, e->xd, x0,
                                              &beta, e->xd, dx0));
        return TP_OK;
    }
    case TP_OP_LEAKY_RELU:
        return dx0 ? s_store(s, dx0, acc0, ny, f_leaky_bwd{x0, dy, a}) : TP_OK;
    case TP_OP_SCALE:
        return dx0 ? s_store(s, dx0, acc0, ny, f_scale{dy, a}) : TP_OK;
    case TP_OP_MAX_POOL:
    case TP_OP_AVG_POOL: {
        if (!dx0)
            return TP_OK;
        struct tp_cuda_entry *e;
        TP_TRY(s_entry(cb, s->dnn, c, 0, &e));
        const float beta = acc0 ? 1.0f : 0.0f;
        TP_CUDA_CHECK(cudnnPoolingBackward(s->dnn, e->pd, &s_one, e->yd, c->y,
                                           e->yd, dy, e->xd, x0, &beta, e->xd,
                                           dx0));
        return TP_OK;
    }
    case TP_OP_GLOBAL_AVG_POOL: {
        if (!dx0)
            return TP_OK;
        size_t n, ch, sp;
        s_ncs(&c->xshape[0], &n, &ch, &sp);
        return s_store(s, dx0, acc0, n * ch * sp,
                       f_gap_bwd{dy, sp, 1.0f / (float)sp});
    }
    case TP_OP_BATCH_NORM:
        return s_bn_bwd(cb, s, c);
    case TP_OP_DROPOUT:
        return dx0 ? s_store(s, dx0, acc0, ny,
                             f_mul{dy, (const float *)c->workspace})
                   : TP_OK;
    case TP_OP_ADD:
        if (!tp_shape_same(&c->xshape[0], &c->yshape) ||
            !tp_shape_same(&c->xshape[1], &c->yshape))
            return tp_cuda_elementwise_backward(s, c); /* broadcasting */
        [[fallthrough]]; /* the same shapes: the identity */
    case TP_OP_RESHAPE:
        for (int k = 0; k < c->ninputs; k++)
            if (c->dx[k])
                TP_TRY(s_store(s, c->dx[k], c->dx_acc[k], ny, f_copy{dy}));
        return TP_OK;
    case TP_OP_SOFTMAX_XENT: {
        if (!dx0)
            return TP_OK;
        const size_t n = (size_t)c->xshape[0].d[0],
                     k = (size_t)c->xshape[0].d[1];
        const float eps = c->attr->alpha, off = eps / (float)k;
        return s_store(s, dx0, acc0, n * k,
                       f_xent_bwd{(const float *)c->workspace, dy,
                                  (const int32_t *)c->x[1], k,
                                  1.0f / (float)n, off, 1.0f - eps + off});
    }
    case TP_OP_L2_DECAY:
        for (int k = 0; k < c->ninputs; k++)
            if (c->dx[k])
                TP_TRY(s_store(s, c->dx[k], c->dx_acc[k],
                               s_count(&c->xshape[k]),
                               f_l2_bwd{(const float *)c->x[k], dy, a}));
        return TP_OK;
    case TP_OP_MSE: case TP_OP_L1_LOSS: case TP_OP_HUBER_LOSS:
    case TP_OP_SIGMOID_XENT:
        return tp_cuda_loss_backward(s, c);
    case TP_OP_TRANSPOSE: case TP_OP_SLICE: case TP_OP_CONCAT: case TP_OP_PAD:
    case TP_OP_BROADCAST_TO: case TP_OP_GATHER: case TP_OP_ONE_HOT:
        return tp_cuda_shape_backward(s, c);
    case TP_OP_CONV_TRANSPOSE: /* the convolution family */
        return s_deconv_bwd(cb, s, c);
    case TP_OP_UPSAMPLE_NEAREST: case TP_OP_UPSAMPLE_BILINEAR:
        return tp_cuda_upsample_backward(s, c);
    /* the linalg family */
    case TP_OP_BATCH_MATMUL: return tp_cuda_batch_matmul_backward(s, c);
    case TP_OP_LAYER_NORM: case TP_OP_GROUP_NORM: case TP_OP_INSTANCE_NORM:
        return tp_cuda_norm_backward(s, c);
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
    case TP_OP_ARGMAX: case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
    case TP_OP_SOFTMAX_XENT_SEQ: case TP_OP_TOP_K_ACCURACY:
        return tp_cuda_reduce_backward(s, c);
    case TP_OP_ATTENTION: return tp_cuda_attention_backward(s, c);
    default:
        return tp_cuda_elementwise_backward(s, c);
    }
}

/* ---- folded activations (backend_impl.h, tp_act_room) --------------------- */

/* batch_matmul's folds (fold.c, only where cb->bmm_fold: TP_CUDA_BMM_FOLD=1;
 * the CPU's contract, gpu/cpu/ops_linalg.c): y = act(x W + b) with the
 * bias b[N] added to every row and act a GELU (erf or tanh). The forward
 * runs the cuBLAS product, into the act's room with a GELU, then one pass
 * (k_bias_act) that adds b, keeps the pre-activation z there and writes
 * y = gelu(z): the gelu op's own arithmetic (ops_elementwise.h). The
 * backward turns dy into dz = dy gelu'(z) over z and sums b's gradient in
 * the same pass, a coalesced column sum in slices (k_column_partial, not
 * the add's strided k_binary_grad_rows), then runs the products on dz. */
static int s_bmm_folded(const tp_op_call_t *c) {
    return c->kind == TP_OP_BATCH_MATMUL &&
           (c->bias || c->dbias || c->attr->act == TP_ACT_GELU ||
            c->attr->act == TP_ACT_GELU_TANH);
}

static void s_bmm_rows(const tp_op_call_t *c, size_t *rows, size_t *n) {
    *n = c->yshape.ndim ? (size_t)c->yshape.d[c->yshape.ndim - 1] : 1;
    *rows = *n ? s_count(&c->yshape) / *n : 0;
}

static tp_status_t s_bmm_fold_fwd(tp_stream_t *s, const tp_op_call_t *c) {
    const int act = c->attr->act;
    const int gelu = act == TP_ACT_GELU || act == TP_ACT_GELU_TANH;
    tp_op_call_t in = tp_act_inner(c, NULL);
    in.bias = NULL;
    in.dbias = NULL;
    float *z = gelu ? (float *)c->workspace : (float *)c->y;
    in.y = z;
    TP_TRY(tp_cuda_batch_matmul_forward(s, &in));
    size_t rows, n;
    s_bmm_rows(c, &rows, &n);
    if (!gelu)
        return c->bias ? s_bias_act(s, z, c->bias, rows, n, TP_ACT_NONE) : TP_OK;
    return s_bias_act(s, z, c->bias, rows, n, act, (float *)c->y);
}

static tp_status_t s_bmm_fold_bwd(tp_stream_t *s, const tp_op_call_t *c) {
    const int act = c->attr->act;
    const int gelu = act == TP_ACT_GELU || act == TP_ACT_GELU_TANH;
    size_t rows, n;
    s_bmm_rows(c, &rows, &n);
    float *z = gelu ? (float *)c->workspace : NULL;
    tp_op_call_t in = tp_act_inner(c, z); /* the products on dz over z */
    in.bias = NULL;
    in.dbias = NULL;
    if (c->dbias)
        TP_TRY(s_column_sum(s, c->dy, z, z, rows, n, c->dbias, c->dbias_acc,
                            in.workspace, in.workspace_bytes, act));
    else if (gelu)
        TP_TRY(s_store(s, z, 0, rows * n, f_gelu_bwd{c->dy, z, act}));
    return tp_cuda_batch_matmul_backward(s, &in);
}

/* The op's own work with its workspace past the act's room; relu over the
 * output after the forward (the matmul's bias pass does it itself), and
 * the backward on dy masked by y > 0 into the room: the numbers of the op
 * and a relu node after it, one relu kernel fewer each way. */
size_t tp_cuda_op_workspace(tp_cuda_backend_t *cb, const tp_op_call_t *c) {
    const tp_op_call_t in = tp_act_inner(c, NULL);
    return tp_act_room(c) + s_workspace(cb, &in);
}

/* Where an op's own kernels apply a folded relu: the matmul's bias pass,
 * and batch norm's where towerpack's kernels run it (k_bn_apply's output;
 * backward, k_bn_partial's and k_bn_dx's reads of dy); elsewhere the
 * relu's kernel after the op, the mask before it. */
static int s_act_native(const tp_cuda_backend_t *cb, const tp_op_call_t *c, int bwd) {
    if (c->kind == TP_OP_MATMUL)
        return !bwd;
    if (c->kind != TP_OP_BATCH_NORM)
        return 0;
    size_t n, ch, sp;
    s_ncs(&c->xshape[0], &n, &ch, &sp);
    const int fits = s_bn_fits(cb, n, ch, sp);
    if (!bwd)
        return c->attr->training && fits;
    return !(c->attr->training && c->dx[0] && !fits) && n * ch * sp < (1u << 31);
}

tp_status_t tp_cuda_op_forward(tp_cuda_backend_t *cb, tp_stream_t *s,
                               const tp_op_call_t *c) {
    if (s_bmm_folded(c))
        return s_bmm_fold_fwd(s, c);
    if (c->attr->act == TP_ACT_NONE)
        return s_forward(cb, s, c);
    const tp_op_call_t in = tp_act_inner(c, NULL);
    TP_TRY(s_forward(cb, s, &in));
    if (s_act_native(cb, c, 0))
        return TP_OK;
    float *y = (float *)c->y;
    return s_store(s, y, 0, s_count(&c->yshape), f_relu{y});
}

tp_status_t tp_cuda_op_backward(tp_cuda_backend_t *cb, tp_stream_t *s,
                                const tp_op_call_t *c) {
    if (s_bmm_folded(c))
        return s_bmm_fold_bwd(s, c);
    if (c->attr->act == TP_ACT_NONE)
        return s_backward(cb, s, c);
    if (s_act_native(cb, c, 1)) {
        const tp_op_call_t in = tp_act_inner(c, NULL);
        return s_backward(cb, s, &in);
    }
    float *masked = (float *)c->workspace;
    tp_op_call_t in = tp_act_inner(c, masked);
    if (c->kind == TP_OP_MATMUL && c->dbias) {
        /* the mask and the folded bias's gradient in one pass over dy */
        const size_t n = (size_t)c->xshape[0].d[0], m = (size_t)c->xshape[1].d[1];
        TP_TRY(s_column_sum(s, c->dy, (const float *)c->y, masked, n, m, c->dbias,
                            c->dbias_acc, in.workspace, in.workspace_bytes));
        in.dbias = NULL;
        return s_backward(cb, s, &in);
    }
    TP_TRY(s_store(s, masked, 0, s_count(&c->yshape),
                   f_relu_mask{(const float *)c->y, c->dy}));
    return s_backward(cb, s, &in);
}
