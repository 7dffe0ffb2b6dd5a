/* towerpack gpu/cuda: the CUDA backend's table: device memory (an arena of
 * large chunks taken at plan time), streams with their own cuBLAS/cuDNN
 * handles, copies, fills, cuBLAS products, the optimizer updates, the
 * all-reduce across the towers of this process, and staging (pinned host
 * buffers, a copy stream, events). The graph ops live in ops.cu, the
 * helpers every CUDA file runs on a stream with in stream.cu.
 *
 * Nothing here allocates device memory inside a step: arenas, stream
 * workspaces and label-check slots are all taken when a model is planned.
 * The one exception is NCCL's communicators, made on the first collective
 * call over buffers on several devices (once per communicator).
 *
 * Built on machines without a GPU; it runs on one H100 or H200 through
 * scripts/gpu-check.sh, which is where its tests run (docs/cuda.md says
 * what has run and on which device). */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <nccl.h>
#include "gpu/cuda/internal.h"

#define TP_CUDA_BLAS_WS (32u << 20)   /* cuBLAS workspace per stream */
#define TP_CUDA_COMM_MAX 64
#define TP_CUDA_BUCKET_FLOATS (8u << 20) /* NCCL bucket: 32 MiB of floats */

/* ---- device, streams ---------------------------------------------------- */

static void s_stream_free(tp_stream_t *s) {
    if (!s)
        return;
    if (s->dnn)
        cudnnDestroy(s->dnn);
    if (s->blas)
        cublasDestroy(s->blas);
    if (s->blas_ws)
        cudaFree(s->blas_ws);
    if (s->checks)
        cudaFree(s->checks);
    if (s->checks_host)
        cudaFreeHost(s->checks_host);
    for (int i = 0; i < 2; i++)
        if (s->snap[i])
            cudaFreeHost(s->snap[i]);
    if (s->mark)
        cudaEventDestroy(s->mark);
    if (s->cu)
        cudaStreamDestroy(s->cu);
    if (s->params_host)
        cudaFreeHost(s->params_host);
    if (s->params_dev)
        cudaFree(s->params_dev);
    free(s);
}

static tp_status_t s_stream_init(tp_cuda_backend_t *cb, tp_stream_t *s) {
    TP_TRY(tp_cuda_use(cb));
    TP_CUDA_CHECK(cudaStreamCreateWithFlags(&s->cu, cudaStreamNonBlocking));
    TP_CUDA_CHECK(cublasCreate(&s->blas));
    TP_CUDA_CHECK(cublasSetStream(s->blas, s->cu));
    TP_CUDA_CHECK(cudaMalloc(&s->blas_ws, TP_CUDA_BLAS_WS));
    TP_CUDA_CHECK(cublasSetWorkspace(s->blas, s->blas_ws, TP_CUDA_BLAS_WS));
    TP_CUDA_CHECK(cublasSetMathMode(s->blas, cb->tf32
                                                 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                 : CUBLAS_DEFAULT_MATH));
    s->bf16 = cb->bf16;
    TP_CUDA_CHECK(cublasSetPointerMode(s->blas, CUBLAS_POINTER_MODE_HOST));
    TP_CUDA_CHECK(cudnnCreate(&s->dnn));
    TP_CUDA_CHECK(cudnnSetStream(s->dnn, s->cu));
    size_t cb_bytes = sizeof(int) * 2 * TP_CUDA_MAX_CHECKS;
    TP_CUDA_CHECK(cudaMalloc((void **)&s->checks, cb_bytes));
    TP_CUDA_CHECK(cudaHostAlloc((void **)&s->checks_host, cb_bytes,
                                cudaHostAllocPortable));
    for (int i = 0; i < 2; i++)
        TP_CUDA_CHECK(cudaHostAlloc((void **)&s->snap[i], cb_bytes,
                                    cudaHostAllocPortable));
    TP_CUDA_CHECK(cudaEventCreateWithFlags(&s->mark, cudaEventDisableTiming));
    TP_CUDA_CHECK(cudaMemsetAsync(s->checks, 0, cb_bytes, s->cu));
    TP_CUDA_CHECK(cudaStreamSynchronize(s->cu));
    return TP_OK;
}

static tp_stream_t *s_stream_new(tp_backend_t *b) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    tp_stream_t *s = (tp_stream_t *)calloc(1, sizeof *s);
    if (!s) {
        tp_error(TP_ERR_NOMEM, "CUDA stream");
        return NULL;
    }
    if (s_stream_init(cb, s) < 0) {
        s_stream_free(s);
        return NULL;
    }
    return s;
}

static void s_stream_destroy(tp_backend_t *b, tp_stream_t *s) {
    if (s && tp_cuda_use(tp_cuda_of(b)) == TP_OK)
        cudaStreamSynchronize(s->cu);
    s_stream_free(s);
}

static tp_status_t s_stream_sync(tp_backend_t *b, tp_stream_t *s) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    TP_TRY(tp_cuda_use(cb));
    s = tp_cuda_stream(cb, s);
    if (s->nchecks) {  /* the checks' copy, then the one sync */
        tp_status_t rc = tp_cuda_checks_collect(s);
        tp_status_t sr = tp_cuda_snaps_read(s, -1);
        return rc < 0 ? rc : sr;
    }
    TP_CUDA_CHECK(cudaStreamSynchronize(s->cu));
    return tp_cuda_snaps_read(s, -1);  /* steps run ahead, now all done */
}

static tp_status_t s_stream_mark(tp_backend_t *b, tp_stream_t *s) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    TP_TRY(tp_cuda_use(cb));
    s = tp_cuda_stream(cb, s);
    TP_CUDA_CHECK(cudaEventRecord(s->mark, s->cu));
    return TP_OK;
}

/* The step queued since the last wait: its label checks copied behind it
 * into snapshot `at` (the device slots cleared for the next step); then
 * the host waits for the mark, after which the snapshot the last wait
 * filled is complete and is read. */
static tp_status_t s_stream_wait_mark(tp_backend_t *b, tp_stream_t *s) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    TP_TRY(tp_cuda_use(cb));
    s = tp_cuda_stream(cb, s);
    int at = s->snap_at, n = s->nchecks;
    if (n) {
        size_t bytes = sizeof(int) * 2 * (size_t)n;
        TP_CUDA_CHECK(cudaMemcpyAsync(s->snap[at], s->checks, bytes,
                                      cudaMemcpyDeviceToHost, s->cu));
        TP_CUDA_CHECK(cudaMemsetAsync(s->checks, 0, bytes, s->cu));
        memcpy(s->snap_name[at], s->check_name, (size_t)n * sizeof s->check_name[0]);
        memcpy(s->snap_k[at], s->check_k, (size_t)n * sizeof s->check_k[0]);
        s->snap_n[at] = n;
        s->nchecks = 0;
    }
    s->snap_at = 1 - at;
    TP_CUDA_CHECK(cudaEventSynchronize(s->mark));
    return tp_cuda_snaps_read(s, 1 - at);
}

/* ---- memory: the arena -------------------------------------------------- */

static char *s_human(size_t bytes, char *buf, size_t size) {
    if (bytes >= (1ull << 30))
        snprintf(buf, size, "%.2f GiB", (double)bytes / (double)(1ull << 30));
    else
        snprintf(buf, size, "%.1f MiB", (double)bytes / (double)(1ull << 20));
    return buf;
}

static void *s_alloc(tp_backend_t *b, size_t bytes) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (tp_cuda_use(cb) < 0)
        return NULL;
    if (bytes > ((size_t)1 << 62)) {
        tp_error(TP_ERR_NOMEM, "CUDA device %d (%s): out of device memory: "
                 "asked for %zu bytes", cb->device, cb->device_name, bytes);
        return NULL;
    }
    size_t need = (bytes + 255) & ~(size_t)255; /* 256: cuDNN, vector loads */
    if (need == 0)
        need = 256;
    pthread_mutex_lock(&cb->mu);
    for (struct tp_cuda_chunk *c = cb->chunks; c; c = c->next)
        if (c->size - c->used >= need) {
            void *p = c->base + c->used;
            c->used += need;
            c->live++;
            pthread_mutex_unlock(&cb->mu);
            return p;
        }
    size_t size = need > cb->chunk_bytes ? need : cb->chunk_bytes;
    void *base = NULL;
    cudaError_t e = cudaMalloc(&base, size);
    if (e != cudaSuccess && size > need) {
        cudaGetLastError();
        size = need;
        e = cudaMalloc(&base, size);
    }
    struct tp_cuda_chunk *c = NULL;
    if (e == cudaSuccess)
        c = (struct tp_cuda_chunk *)calloc(1, sizeof *c);
    if (!c) {
        if (base)
            cudaFree(base);
        cudaGetLastError(); /* clear the sticky-free error state */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        char a[32], f[32], t[32];
        int oom = e == cudaErrorMemoryAllocation || e == cudaSuccess;
        tp_error(oom ? TP_ERR_NOMEM : TP_ERR_DEVICE,
                 "CUDA device %d (%s): %s: asked for %s (%zu bytes), %s free "
                 "of %s (%s)",
                 cb->device, cb->device_name,
                 oom ? "out of device memory" : "cudaMalloc failed",
                 s_human(bytes, a, sizeof a), bytes, s_human(fr, f, sizeof f),
                 s_human(tot, t, sizeof t),
                 e == cudaSuccess ? "no host memory for the chunk record"
                                  : cudaGetErrorString(e));
        TP_ERROR("%s", tp_last_error());
        pthread_mutex_unlock(&cb->mu);
        return NULL;
    }
    c->base = (char *)base;
    c->size = size;
    c->used = need;
    c->live = 1;
    c->next = cb->chunks;
    cb->chunks = c;
    pthread_mutex_unlock(&cb->mu);
    return base;
}

/* A chunk goes back to CUDA when its last allocation is freed. */
static void s_free(tp_backend_t *b, void *p) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (!p)
        return;
    pthread_mutex_lock(&cb->mu);
    for (struct tp_cuda_chunk **cp = &cb->chunks; *cp; cp = &(*cp)->next) {
        struct tp_cuda_chunk *c = *cp;
        if ((char *)p < c->base || (char *)p >= c->base + c->size)
            continue;
        if (--c->live == 0) {
            *cp = c->next;
            if (tp_cuda_use(cb) == TP_OK) {
                cudaDeviceSynchronize(); /* teardown only: nothing may still read it */
                cudaFree(c->base);
            }
            free(c);
        }
        break;
    }
    pthread_mutex_unlock(&cb->mu);
}

namespace {
__global__ void k_fill(float *dst, float v, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = v;
}
}  // namespace

/* Page-locked host memory (cudaHostAlloc, cudaHostRegister): copies read
 * it asynchronously. */
static int s_pinned_host(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeHost;
}

static tp_status_t s_copy(tp_backend_t *b, tp_stream_t *s, void *dst,
                          const void *src, size_t bytes, tp_copy_kind_t kind) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (bytes == 0 || dst == src || (s && s->mode == TP_CUDA_REPLAYING))
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    tp_stream_t *st = tp_cuda_stream(cb, s);
    /* The direction comes from the pointers (unified addressing), not from
     * `kind`: a model input that already sits on the device (a staged
     * batch, tp_backend_stage_device) is then a device-to-device copy on
     * the tower's stream although the model asks for host-to-device. */
    TP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st->cu));
    /* The contract of copy: a host destination is readable on return, and
     * a host source may be rewritten on return. CUDA stages a pageable
     * source before cudaMemcpyAsync returns, but reads a pinned one (a
     * stage's host buffer, cudaHostAlloc'd memory) while the copy runs:
     * wait for it then, or the caller's next fill races the copy. */
    if (kind == TP_COPY_D2H || s_pinned_host(src))
        TP_CUDA_CHECK(cudaStreamSynchronize(st->cu));
    return tp_cuda_def_mark(cb, s);
}

/* Page-locked host memory for copy_async's destinations. */
static void *s_host_alloc(tp_backend_t *b, size_t bytes) {
    if (tp_cuda_use(tp_cuda_of(b)) < 0)
        return NULL;
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        tp_error(TP_ERR_NOMEM, "%zu bytes of pinned host memory: %s", bytes,
                 cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void s_host_free(tp_backend_t *b, void *p) {
    if (p && tp_cuda_use(tp_cuda_of(b)) == TP_OK)
        cudaFreeHost(p);
}

/* A copy behind the stream's work, waited for by its next sync (captured
 * as a memcpy node in a recorded step; nothing to do in a replay). */
static tp_status_t s_copy_async(tp_backend_t *b, tp_stream_t *s, void *dst,
                                const void *src, size_t bytes) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (bytes == 0 || (s && s->mode == TP_CUDA_REPLAYING))
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    TP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                  tp_cuda_stream(cb, s)->cu));
    return tp_cuda_def_mark(cb, s);
}

static tp_status_t s_fill(tp_backend_t *b, tp_stream_t *s, float *dst,
                          float value, size_t count) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (count == 0 || (s && s->mode == TP_CUDA_REPLAYING))
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    tp_stream_t *st = tp_cuda_stream(cb, s);
    if (value == 0.0f) {
        TP_CUDA_CHECK(cudaMemsetAsync(dst, 0, count * sizeof(float), st->cu));
        return tp_cuda_def_mark(cb, s);
    }
    k_fill<<<tp_cuda_blocks(count, 256), 256, 0, st->cu>>>(dst, value, count);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}

/* ---- products ----------------------------------------------------------- */

/* Row-major C = alpha op(A) op(B) + beta C is column-major
 * C^T = alpha op(B)^T op(A)^T + beta C^T: swap the operands. */
static tp_status_t s_gemm(tp_backend_t *b, tp_stream_t *s, int ta, int tb,
                          int m, int n, int k, float alpha, const float *a,
                          int lda, const float *bm, int ldb, float beta,
                          float *c, int ldc) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (s && s->mode == TP_CUDA_REPLAYING)
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    tp_stream_t *st = tp_cuda_stream(cb, s);
    if (!s)
        pthread_mutex_lock(&cb->mu);
    cublasStatus_t e = tp_cuda_sgemm(st, ta, tb, m, n, k, &alpha, a, lda, bm, ldb,
                                     &beta, c, ldc);
    if (!s)
        pthread_mutex_unlock(&cb->mu);
    TP_CUDA_CHECK(e);
    return tp_cuda_def_mark(cb, s);
}

/* ---- optimizers: the CPU backend's arithmetic, element by element ------- */

namespace {
/* Each update once, as a device function: the kernels that take their
 * scalars by value (call by call) and those that read them from a
 * stream's params (a recorded step, whose learning rate changes between
 * replays) run the same arithmetic. */
__device__ __forceinline__ void d_sgd(float *w, const float *g, size_t n,
                                      float lr) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] -= lr * g[i];
}

__device__ __forceinline__ void d_sgd_momentum(float *w, const float *g,
                                               float *v, size_t n, float lr,
                                               float mu, int nesterov) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float vi = mu * v[i] + g[i];
        v[i] = vi;
        w[i] -= nesterov ? lr * (g[i] + mu * vi) : lr * vi;
    }
}

/* torch.optim.SGD's coupled decay in the same pass (the CPU backend's
 * s_sgd_wd_part): d = g + wd w through the momentum */
__device__ __forceinline__ void d_sgd_wd(float *w, const float *g, float *v,
                                         size_t n, float lr, float mu,
                                         int nesterov, float wd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float d = g[i] + wd * w[i];
        if (!v || mu == 0.0f) {
            w[i] -= lr * d;
            continue;
        }
        const float vi = mu * v[i] + d;
        v[i] = vi;
        w[i] -= nesterov ? lr * (d + mu * vi) : lr * vi;
    }
}

__device__ __forceinline__ void d_adam(float *w, const float *g, float *m,
                                       float *v, size_t n, float lr_t,
                                       float b1, float b2, float eps_t) {
    const float ob1 = 1.0f - b1, ob2 = 1.0f - b2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = b1 * m[i] + ob1 * gi;
        float vi = b2 * v[i] + ob2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr_t * mi / (sqrtf(vi) + eps_t);
    }
}

/* AdamW's decoupled decay, before Adam's step (the CPU backend's order) */
__device__ __forceinline__ void d_decay(float *w, size_t n, float keep) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] *= keep;
}

__global__ void k_sgd(float *w, const float *g, size_t n, float lr) {
    d_sgd(w, g, n, lr);
}
__global__ void k_sgd_momentum(float *w, const float *g, float *v, size_t n,
                               float lr, float mu, int nesterov) {
    d_sgd_momentum(w, g, v, n, lr, mu, nesterov);
}
__global__ void k_sgd_wd(float *w, const float *g, float *v, size_t n, float lr,
                         float mu, int nesterov, float wd) {
    d_sgd_wd(w, g, v, n, lr, mu, nesterov, wd);
}
/* p: {lr, mu, wd} in a stream's params */
__global__ void k_sgd_wd_p(float *w, const float *g, float *v, size_t n,
                           const float *p, int nesterov) {
    d_sgd_wd(w, g, v, n, p[0], p[1], nesterov, p[2]);
}
__global__ void k_adam(float *w, const float *g, float *m, float *v,
                       size_t n, float lr_t, float b1, float b2, float eps_t) {
    d_adam(w, g, m, v, n, lr_t, b1, b2, eps_t);
}
__global__ void k_decay(float *w, size_t n, float keep) { d_decay(w, n, keep); }
/* p: {lr, mu} and {lr_t, eps_t} in a stream's params */
__global__ void k_sgd_p(float *w, const float *g, size_t n, const float *p) {
    d_sgd(w, g, n, p[0]);
}
__global__ void k_sgd_momentum_p(float *w, const float *g, float *v, size_t n,
                                 const float *p, int nesterov) {
    d_sgd_momentum(w, g, v, n, p[0], p[1], nesterov);
}
__global__ void k_adam_p(float *w, const float *g, float *m, float *v,
                         size_t n, const float *p, float b1, float b2) {
    d_adam(w, g, m, v, n, p[0], b1, b2, p[1]);
}
/* p: {keep} (AdamW's 1 - lr * weight_decay, which a schedule changes) */
__global__ void k_decay_p(float *w, size_t n, const float *p) { d_decay(w, n, p[0]); }

/* The sum of g's squares by one block in an order fixed by n (each thread
 * a grid stride, then a tree in shared memory): the same bits every run.
 * One block reads a whole arena at a few hundred GB/s, a few microseconds
 * for the models here; more blocks would need a second pass. */
__global__ void k_sumsq(const float *g, size_t n, float *acc, int add) {
    __shared__ float part[1024];
    float sum = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        sum += g[i] * g[i];
    part[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k)
            part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        acc[0] = add ? acc[0] + part[0] : part[0];
}

__device__ __forceinline__ void d_ema(float *ema, const float *w, size_t n,
                                      float decay) {
    const float keep = 1.0f - decay;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        ema[i] = decay * ema[i] + keep * w[i];
}
__global__ void k_ema(float *ema, const float *w, size_t n, float decay) {
    d_ema(ema, w, n, decay);
}
/* p: {decay} */
__global__ void k_ema_p(float *ema, const float *w, size_t n, const float *p) {
    d_ema(ema, w, n, p[0]);
}

__global__ void k_accumulate(float *sum, float *g, size_t n, int last, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (last)
            g[i] = (sum[i] + g[i]) * scale;
        else
            sum[i] += g[i];
    }
}

__global__ void k_clip(float *g, size_t n, float clip, const float *acc) {
    const float norm = sqrtf(acc[0]);
    if (!(norm > clip))
        return;
    const float scale = clip / norm;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        g[i] *= scale;
}
}  // namespace

static tp_status_t s_sgd(tp_backend_t *b, tp_stream_t *s, float *w,
                         const float *g, float *v, size_t n, float lr,
                         float mu, int nesterov) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (n == 0)
        return TP_OK;
    if (s && s->mode != TP_CUDA_EAGER) {
        const float sc[2] = {lr, mu};
        const float *p;
        TP_TRY(tp_cuda_step_scalars(s, sc, 2, &p));
        if (s->mode == TP_CUDA_REPLAYING)
            return TP_OK;
        TP_TRY(tp_cuda_use(cb));
        TP_TRY(tp_cuda_order(cb, s));
        unsigned blocks = tp_cuda_blocks(n, 256);
        if (!v || mu == 0.0f)
            k_sgd_p<<<blocks, 256, 0, s->cu>>>(w, g, n, p);
        else
            k_sgd_momentum_p<<<blocks, 256, 0, s->cu>>>(w, g, v, n, p, nesterov);
        TP_CUDA_CHECK(cudaGetLastError());
        return TP_OK;
    }
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    cudaStream_t cs = tp_cuda_stream(cb, s)->cu;
    unsigned blocks = tp_cuda_blocks(n, 256);
    if (!v || mu == 0.0f)
        k_sgd<<<blocks, 256, 0, cs>>>(w, g, n, lr);
    else
        k_sgd_momentum<<<blocks, 256, 0, cs>>>(w, g, v, n, lr, mu, nesterov);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}

/* backend_impl.h's sgd_wd_update: s_sgd's two modes, one kernel */
static tp_status_t s_sgd_wd(tp_backend_t *b, tp_stream_t *s, float *w,
                            const float *g, float *v, size_t n, float lr,
                            float mu, int nesterov, float wd) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (n == 0)
        return TP_OK;
    if (s && s->mode != TP_CUDA_EAGER) {
        const float sc[3] = {lr, mu, wd};
        const float *p;
        TP_TRY(tp_cuda_step_scalars(s, sc, 3, &p));
        if (s->mode == TP_CUDA_REPLAYING)
            return TP_OK;
        TP_TRY(tp_cuda_use(cb));
        TP_TRY(tp_cuda_order(cb, s));
        k_sgd_wd_p<<<tp_cuda_blocks(n, 256), 256, 0, s->cu>>>(w, g, v, n, p, nesterov);
        TP_CUDA_CHECK(cudaGetLastError());
        return TP_OK;
    }
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    cudaStream_t cs = tp_cuda_stream(cb, s)->cu;
    k_sgd_wd<<<tp_cuda_blocks(n, 256), 256, 0, cs>>>(w, g, v, n, lr, mu, nesterov, wd);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}

static tp_status_t s_adam(tp_backend_t *b, tp_stream_t *s, float *w,
                          const float *g, float *m, float *v, size_t n,
                          float lr, float b1, float b2, float eps,
                          float wd, int64_t step) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (n == 0)
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    const float keep = 1.0f - lr * wd;  /* AdamW (wd 0: Adam, no decay kernel) */
    /* the bias corrections folded into the step size and epsilon, computed
     * on the host exactly as the CPU backend does */
    const double c1 = 1.0 - pow(b1, (double)step);
    const double c2 = 1.0 - pow(b2, (double)step);
    const float lr_t = (float)(lr * sqrt(c2) / c1);
    const float eps_t = (float)(eps * sqrt(c2));
    if (s && s->mode != TP_CUDA_EAGER) {
        const float sc[2] = {lr_t, eps_t};
        const float *p;
        TP_TRY(tp_cuda_step_scalars(s, sc, 2, &p));
        const float *pk = NULL;
        if (wd != 0.0f)
            TP_TRY(tp_cuda_step_scalars(s, &keep, 1, &pk));
        if (s->mode == TP_CUDA_REPLAYING)
            return TP_OK;
        TP_TRY(tp_cuda_order(cb, s));
        if (pk) {
            k_decay_p<<<tp_cuda_blocks(n, 256), 256, 0, s->cu>>>(w, n, pk);
            TP_CUDA_CHECK(cudaGetLastError());
        }
        k_adam_p<<<tp_cuda_blocks(n, 256), 256, 0, s->cu>>>(w, g, m, v, n, p,
                                                            b1, b2);
        TP_CUDA_CHECK(cudaGetLastError());
        return TP_OK;
    }
    TP_TRY(tp_cuda_order(cb, s));
    if (wd != 0.0f) {
        k_decay<<<tp_cuda_blocks(n, 256), 256, 0, tp_cuda_stream(cb, s)->cu>>>(
            w, n, keep);
        TP_CUDA_CHECK(cudaGetLastError());
    }
    k_adam<<<tp_cuda_blocks(n, 256), 256, 0, tp_cuda_stream(cb, s)->cu>>>(
        w, g, m, v, n, lr_t, b1, b2, eps_t);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}

/* ---- gradient processing: the global-norm clip, read on the device --- */

static tp_status_t s_grad_sumsq(tp_backend_t *b, tp_stream_t *s, const float *g,
                                size_t n, float *acc, int add) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (s && s->mode == TP_CUDA_REPLAYING)
        return TP_OK;  /* no scalars: the recorded kernel does it all */
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    k_sumsq<<<1, 1024, 0, tp_cuda_stream(cb, s)->cu>>>(g, n, acc, add);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}

static tp_status_t s_grad_clip(tp_backend_t *b, tp_stream_t *s, float *g,
                               size_t n, float clip, const float *acc) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (n == 0 || (s && s->mode == TP_CUDA_REPLAYING))
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    k_clip<<<tp_cuda_blocks(n, 256), 256, 0, tp_cuda_stream(cb, s)->cu>>>(g, n, clip,
                                                                           acc);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}

/* The weights' moving average: as the optimizers, its decay a step
 * scalar in a recorded step (a schedule may change it between replays). */
static tp_status_t s_ema_update(tp_backend_t *b, tp_stream_t *s, float *ema,
                                const float *w, size_t n, float decay) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (n == 0)
        return TP_OK;
    if (s && s->mode != TP_CUDA_EAGER) {
        const float *p;
        TP_TRY(tp_cuda_step_scalars(s, &decay, 1, &p));
        if (s->mode == TP_CUDA_REPLAYING)
            return TP_OK;
        TP_TRY(tp_cuda_use(cb));
        TP_TRY(tp_cuda_order(cb, s));
        k_ema_p<<<tp_cuda_blocks(n, 256), 256, 0, s->cu>>>(ema, w, n, p);
        TP_CUDA_CHECK(cudaGetLastError());
        return TP_OK;
    }
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    k_ema<<<tp_cuda_blocks(n, 256), 256, 0, tp_cuda_stream(cb, s)->cu>>>(ema, w, n,
                                                                          decay);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}

/* Gradient accumulation: never in a recorded step (the model runs those
 * call by call), so its scalars go by value. */
static tp_status_t s_grad_accumulate(tp_backend_t *b, tp_stream_t *s, float *sum,
                                     float *g, size_t n, int last, float scale) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (n == 0 || (s && s->mode == TP_CUDA_REPLAYING))
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    k_accumulate<<<tp_cuda_blocks(n, 256), 256, 0, tp_cuda_stream(cb, s)->cu>>>(
        sum, g, n, last, scale);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}

/* ---- collectives ---------------------------------------------------------
 * Towers whose buffers share one device (the usual case: several towers on
 * one GPU) reduce with a kernel: each rank sums its slice of every buffer in
 * rank order and writes it back to all, ordered by events, so the result is
 * bit-identical to the CPU backend's order. Towers on distinct devices use
 * NCCL: one communicator per device (ncclCommInitAll), the buffer cut into
 * pieces of TP_CUDA_BUCKET_FLOATS issued in one group.
 *
 * Either runs on the rank's comm stream, after the work its tower queued
 * before the call (the `ready` event) and beside what the tower queues
 * after it: allreduce_begin queues a bucket there and returns, and
 * allreduce_end puts the tower's stream after the comm stream and waits on
 * the host. allreduce is the two at once. Reusing the events from call to
 * call is safe: a stream waits for an event's record as of the wait call,
 * and the barriers of a call put every rank's waits on a peer's event
 * before that peer records it again. */

struct tp_ptrs {
    float *p[TP_CUDA_COMM_MAX];
};

struct tp_comm {
    int nranks;
    tp_barrier_t barrier; /* gpu/barrier.c, in libtowerpack */
    float *bufs[TP_CUDA_COMM_MAX];
    size_t counts[TP_CUDA_COMM_MAX];
    int average[TP_CUDA_COMM_MAX];
    cudaEvent_t ready[TP_CUDA_COMM_MAX]; /* the rank's gradients are final */
    cudaEvent_t done[TP_CUDA_COMM_MAX];  /* the rank's slice is reduced */
    cudaStream_t cstream[TP_CUDA_COMM_MAX]; /* the rank's reductions */
    cudaEvent_t cdone[TP_CUDA_COMM_MAX]; /* its comm stream's work so far */
    int pending[TP_CUDA_COMM_MAX];       /* buckets begun, not yet ended */
    int evdev[TP_CUDA_COMM_MAX];         /* the device the rank's events and
                                            comm stream were made on: its
                                            tower stream's, -1 none */
    int mode;                            /* 0 unknown, 1 one device, 2 NCCL */
    /* A failed call aborts the communicator (s_comm_fail): NCCL's
     * communicators first (their kernels would wait forever for the
     * failed rank), then the barrier, which wakes every rank. */
    pthread_mutex_t fail_mu;             /* aborted, why, nccl[] teardown */
    int aborted;                         /* read with __atomic too */
    char why[256];                       /* the first failure's message */
    ncclComm_t nccl[TP_CUDA_COMM_MAX];
    int devs[TP_CUDA_COMM_MAX];
};

namespace {
/* dst[i] = sum over ranks (in rank order) of p[r][i], for i in [lo, hi),
 * written to every rank's buffer, or only rank 0's when root_only. */
__global__ void k_reduce(tp_ptrs ptrs, int nranks, size_t lo, size_t hi,
                         float scale, int average, int root_only) {
    for (size_t i = lo + blockIdx.x * (size_t)blockDim.x + threadIdx.x;
         i < hi; i += (size_t)gridDim.x * blockDim.x) {
        float s = ptrs.p[0][i];
        for (int r = 1; r < nranks; r++)
            s += ptrs.p[r][i];
        if (average)
            s *= scale;
        if (root_only)
            ptrs.p[0][i] = s;
        else
            for (int r = 0; r < nranks; r++)
                ptrs.p[r][i] = s;
    }
}
}  // namespace

static tp_comm_t *s_comm_new(tp_backend_t *b, int nranks) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (nranks < 1 || nranks > TP_CUDA_COMM_MAX) {
        tp_error(TP_ERR_INVALID, "communicator of %d ranks (1..%d)", nranks,
                 TP_CUDA_COMM_MAX);
        return NULL;
    }
    if (tp_cuda_use(cb) < 0)
        return NULL;
    tp_comm_t *c = (tp_comm_t *)calloc(1, sizeof *c);
    if (!c) {
        tp_error(TP_ERR_NOMEM, "communicator");
        return NULL;
    }
    c->nranks = nranks;
    tp_barrier_init(&c->barrier, nranks);
    pthread_mutex_init(&c->fail_mu, NULL);
    /* A rank's events are made on its stream's device at its first
     * allreduce (s_rank_events): the ranks may sit on several devices, and
     * an event can be recorded only on a stream of the device it was made
     * on. */
    for (int r = 0; r < nranks; r++)
        c->evdev[r] = -1;
    return c;
}

/* Destroy rank r's events and comm stream (on their device). */
static void s_rank_events_free(tp_comm_t *c, int r) {
    if (c->evdev[r] < 0)
        return;
    cudaSetDevice(c->evdev[r]);
    if (c->cstream[r])
        cudaStreamSynchronize(c->cstream[r]);
    cudaEvent_t *evs[3] = {&c->ready[r], &c->done[r], &c->cdone[r]};
    for (int k = 0; k < 3; k++)
        if (*evs[k]) {
            cudaEventDestroy(*evs[k]);
            *evs[k] = NULL;
        }
    if (c->cstream[r])
        cudaStreamDestroy(c->cstream[r]);
    c->cstream[r] = NULL;
    c->pending[r] = 0;
    c->evdev[r] = -1;
}

/* Rank r's events and comm stream on `dev`, the device of its stream,
 * which is current. Only rank r's thread touches them before the first
 * barrier of a call. */
static tp_status_t s_rank_events(tp_comm_t *c, int r, int dev) {
    if (c->evdev[r] == dev)
        return TP_OK;
    s_rank_events_free(c, r);
    TP_CUDA_CHECK(cudaSetDevice(dev));
    c->evdev[r] = dev; /* what was made is freed from here on */
    cudaEvent_t *evs[3] = {&c->ready[r], &c->done[r], &c->cdone[r]};
    for (int k = 0; k < 3; k++) {
        cudaError_t e = cudaEventCreateWithFlags(evs[k], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            s_rank_events_free(c, r);
            TP_CUDA_CHECK(e);
        }
    }
    cudaError_t e = cudaStreamCreateWithFlags(&c->cstream[r], cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        s_rank_events_free(c, r);
        TP_CUDA_CHECK(e);
    }
    return TP_OK;
}

static void s_comm_destroy(tp_backend_t *b, tp_comm_t *c) {
    if (!c)
        return;
    for (int r = 0; r < c->nranks; r++) {
        s_rank_events_free(c, r);
        if (c->nccl[r]) {
            cudaSetDevice(c->devs[r]);
            ncclCommDestroy(c->nccl[r]);
        }
    }
    tp_cuda_use(tp_cuda_of(b));
    pthread_mutex_destroy(&c->fail_mu);
    tp_barrier_fini(&c->barrier);
    free(c);
}

/* Abort the communicator for good, remembering `why` (the first failure):
 * ncclCommAbort on every rank's NCCL communicator, which ends their
 * uncompleted operations (a rank that failed before issuing its part would
 * otherwise leave the others' kernels waiting for it), then the barrier,
 * which wakes every rank waiting there, now and in later calls. */
static void s_comm_fail(tp_comm_t *c, const char *why) {
    pthread_mutex_lock(&c->fail_mu);
    if (!c->aborted) {
        snprintf(c->why, sizeof c->why, "%s", why ? why : "aborted");
        for (int r = 0; r < c->nranks; r++)
            if (c->nccl[r]) {
                cudaSetDevice(c->devs[r]);
                ncclCommAbort(c->nccl[r]); /* frees it: never destroy it */
                c->nccl[r] = NULL;
            }
        __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&c->fail_mu);
    tp_barrier_abort(&c->barrier);
}

/* Across processes: NCCL's unique id, made by rank 0 and carried to the
 * others by the launcher (dist/: MPI's broadcast). */
static tp_status_t s_comm_id(tp_backend_t *b, void *id, size_t cap, size_t *len) {
    ncclUniqueId u;
    if (cap < sizeof u)
        return tp_error(TP_ERR_INVALID, "communicator id: %zu bytes of room, "
                        "NCCL's takes %zu", cap, sizeof u);
    TP_TRY(tp_cuda_use(tp_cuda_of(b)));
    TP_CUDA_CHECK(ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof u);
    *len = sizeof u;
    return TP_OK;
}

/* This process's rank of a communicator across processes: one local rank
 * (rank 0 of the in-process calls), already in NCCL's mode, on the
 * backend's device. */
static tp_comm_t *s_comm_join(tp_backend_t *b, int nranks, int rank,
                              const void *id, size_t len) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    ncclUniqueId u;
    if (len != sizeof u || nranks < 1 || rank < 0 || rank >= nranks) {
        tp_error(TP_ERR_INVALID, "joining a communicator: rank %d of %d, an id "
                 "of %zu bytes (NCCL's has %zu)", rank, nranks, len, sizeof u);
        return NULL;
    }
    tp_comm_t *c = s_comm_new(b, 1);
    if (!c)
        return NULL;
    memcpy(&u, id, sizeof u);
    ncclResult_t e = ncclCommInitRank(&c->nccl[0], nranks, u, rank);
    if (e != ncclSuccess) {
        tp_error(TP_ERR_PEER, "NCCL: joining rank %d of %d on CUDA device %d: %s",
                 rank, nranks, cb->device, ncclGetErrorString(e));
        c->nccl[0] = NULL;
        s_comm_destroy(b, c);
        return NULL;
    }
    c->devs[0] = cb->device;
    c->mode = 2;
    return c;
}

static void s_comm_abort(tp_backend_t *b, tp_comm_t *c) {
    (void)b;
    s_comm_fail(c, "aborted by a failed tower");
}

/* The device of a device pointer, or -1. */
static int s_device_of(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

/* Decide once (rank 0, between barriers) how this communicator reduces:
 * all buffers on one device, or one per device (NCCL). */
static tp_status_t s_comm_mode(tp_comm_t *c) {
    if (c->mode)
        return TP_OK;
    int same = 1, distinct = 1;
    for (int r = 0; r < c->nranks; r++) {
        c->devs[r] = s_device_of(c->bufs[r]);
        if (c->devs[r] < 0)
            return tp_error(TP_ERR_INVALID,
                            "allreduce: rank %d's buffer is not device memory",
                            r);
        same &= c->devs[r] == c->devs[0];
        for (int q = 0; q < r; q++)
            distinct &= c->devs[q] != c->devs[r];
    }
    if (same) {
        c->mode = 1;
        return TP_OK;
    }
    if (!distinct)
        return tp_error(TP_ERR_UNSUPPORTED,
                        "allreduce: %d ranks share some but not all devices "
                        "(one tower per device, or all towers on one)",
                        c->nranks);
    TP_CUDA_CHECK(ncclCommInitAll(c->nccl, c->nranks, c->devs));
    c->mode = 2;
    return TP_OK;
}

/* NCCL: rank's buffer in pieces, one group, queued on its comm stream. */
static tp_status_t s_nccl_issue(tp_comm_t *c, int rank, float *buf, size_t count,
                                int average) {
    TP_CUDA_CHECK(ncclGroupStart());
    for (size_t off = 0; off < count; off += TP_CUDA_BUCKET_FLOATS) {
        size_t n = count - off < TP_CUDA_BUCKET_FLOATS ? count - off
                                                        : TP_CUDA_BUCKET_FLOATS;
        ncclResult_t e = ncclAllReduce(buf + off, buf + off, n, ncclFloat,
                                       average ? ncclAvg : ncclSum,
                                       c->nccl[rank], c->cstream[rank]);
        if (e != ncclSuccess) {
            ncclGroupEnd();
            TP_CUDA_CHECK(e);
        }
    }
    TP_CUDA_CHECK(ncclGroupEnd());
    return TP_OK;
}

/* Wait on the host for rank's comm stream (its `cdone` record). Polled,
 * not synchronised: if a peer fails, its abort (s_comm_fail) ends this
 * rank's wait, and NCCL's own errors (a peer gone) surface through
 * ncclCommGetAsyncError, as NCCL advises. */
static tp_status_t s_comm_wait(tp_comm_t *c, int rank) {
    for (;;) {
        cudaError_t q = cudaEventQuery(c->cdone[rank]);
        if (q == cudaSuccess)
            return TP_OK;
        if (q != cudaErrorNotReady)
            TP_CUDA_CHECK(q);
        pthread_mutex_lock(&c->fail_mu);
        ncclResult_t ae = ncclSuccess;
        int aborted = c->aborted;
        if (!aborted && c->nccl[rank] &&
            ncclCommGetAsyncError(c->nccl[rank], &ae) != ncclSuccess)
            ae = ncclInternalError;
        pthread_mutex_unlock(&c->fail_mu);
        if (aborted)
            return tp_error(TP_ERR_INTERRUPTED, "allreduce: aborted (rank %d)",
                            rank);
        if (ae != ncclSuccess && ae != ncclInProgress)
            TP_CUDA_CHECK(ae);
        sched_yield();
    }
}

/* A bucket's reduction queued on rank's comm stream, after the work
 * queued on s so far; *alike set when every rank fails alike (the first
 * meeting's count check), which needs no abort. */
static tp_status_t s_begin_run(tp_cuda_backend_t *cb, tp_comm_t *c,
                               int rank, tp_stream_t *s, float *buf,
                               size_t count, int average, int *alike) {
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    tp_stream_t *st = tp_cuda_stream(cb, s);
    /* Record and wait this rank's events with its stream's device current
     * (towers on several devices: the backend's device is not theirs). */
    int dev = 0;
    TP_CUDA_CHECK(cudaStreamGetDevice(st->cu, &dev));
    TP_CUDA_CHECK(cudaSetDevice(dev));
    TP_TRY(s_rank_events(c, rank, dev));
    c->bufs[rank] = buf;
    TP_CUDA_CHECK(cudaEventRecord(c->ready[rank], st->cu));
    tp_status_t agree = tp_barrier_agree(&c->barrier, rank, c->counts,
                                         c->average, count, average);
    if (agree == TP_ERR_INVALID)
        *alike = 1;
    TP_TRY(agree);
    tp_status_t mode_rc = TP_OK;
    if (rank == 0)
        mode_rc = s_comm_mode(c);
    TP_TRY(tp_barrier_sync(&c->barrier, rank));
    if (mode_rc < 0)
        return mode_rc;
    if (c->mode != 1 && c->mode != 2)
        return tp_error(TP_ERR_STATE, "allreduce: rank 0 failed to set up "
                                      "the communicator");
    cudaStream_t cs = c->cstream[rank];
    c->pending[rank] = 1; /* from here on, end waits for the comm stream */
    if (c->mode == 2) {
        TP_CUDA_CHECK(cudaStreamWaitEvent(cs, c->ready[rank], 0));
        return s_nccl_issue(c, rank, buf, count, average);
    }
    for (int r = 0; r < c->nranks; r++)
        TP_CUDA_CHECK(cudaStreamWaitEvent(cs, c->ready[r], 0));
    size_t chunk = (count + (size_t)c->nranks - 1) / (size_t)c->nranks;
    size_t lo = chunk * (size_t)rank, hi = lo + chunk;
    lo = lo > count ? count : lo;
    hi = hi > count ? count : hi;
    if (hi > lo) {
        tp_ptrs p;
        memset(&p, 0, sizeof p);
        for (int r = 0; r < c->nranks; r++)
            p.p[r] = c->bufs[r];
        k_reduce<<<tp_cuda_blocks(hi - lo, 256), 256, 0, cs>>>(
            p, c->nranks, lo, hi, 1.0f / (float)c->nranks, average, 0);
        TP_CUDA_CHECK(cudaGetLastError());
    }
    TP_CUDA_CHECK(cudaEventRecord(c->done[rank], cs));
    TP_TRY(tp_barrier_sync(&c->barrier, rank));
    for (int r = 0; r < c->nranks; r++)
        if (r != rank)
            TP_CUDA_CHECK(cudaStreamWaitEvent(cs, c->done[r], 0));
    return TP_OK;
}

/* The tower's stream after every bucket the rank began, and the host after
 * them too. */
static tp_status_t s_end_run(tp_cuda_backend_t *cb, tp_comm_t *c, int rank,
                             tp_stream_t *s) {
    if (!c->pending[rank])
        return TP_OK;
    c->pending[rank] = 0;
    tp_stream_t *st = tp_cuda_stream(cb, s);
    TP_CUDA_CHECK(cudaSetDevice(c->evdev[rank])); /* the rank's, not cb's */
    TP_CUDA_CHECK(cudaEventRecord(c->cdone[rank], c->cstream[rank]));
    TP_CUDA_CHECK(cudaStreamWaitEvent(st->cu, c->cdone[rank], 0));
    return s_comm_wait(c, rank);
}

/* A rank that fails between two meetings would leave the others waiting
 * at the next one (or NCCL's kernels waiting for its part) forever: abort
 * the communicator, and the woken ranks report the failure that did it. */
static tp_status_t s_comm_failed(tp_comm_t *c, int rank, tp_status_t rc) {
    if (rc != TP_ERR_INTERRUPTED) {
        char why[256];
        snprintf(why, sizeof why, "rank %d failed: %s", rank, tp_last_error());
        s_comm_fail(c, why);
        return rc;
    }
    /* woken by another rank's abort: say which failure it was */
    pthread_mutex_lock(&c->fail_mu);
    if (c->aborted)
        rc = tp_error(TP_ERR_INTERRUPTED, "allreduce: rank %d: aborted: %s",
                      rank, c->why);
    pthread_mutex_unlock(&c->fail_mu);
    return rc;
}

static tp_status_t s_comm_check(tp_comm_t *c, int rank) {
    if (rank < 0 || rank >= c->nranks)
        return tp_error(TP_ERR_INVALID, "allreduce: rank %d of %d", rank,
                        c->nranks);
    if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&c->fail_mu);
        tp_status_t rc = tp_error(TP_ERR_INTERRUPTED,
                                  "allreduce: rank %d: communicator aborted: %s",
                                  rank, c->why);
        pthread_mutex_unlock(&c->fail_mu);
        return rc;
    }
    return TP_OK;
}

static tp_status_t s_allreduce_begin(tp_backend_t *b, tp_comm_t *c, int rank,
                                     tp_stream_t *s, float *buf, size_t count,
                                     int average) {
    TP_TRY(s_comm_check(c, rank));
    int alike = 0;
    tp_status_t rc = s_begin_run(tp_cuda_of(b), c, rank, s, buf, count,
                                 average, &alike);
    return rc >= 0 || alike ? rc : s_comm_failed(c, rank, rc);
}

static tp_status_t s_allreduce_end(tp_backend_t *b, tp_comm_t *c, int rank,
                                   tp_stream_t *s) {
    TP_TRY(s_comm_check(c, rank));
    tp_status_t rc = s_end_run(tp_cuda_of(b), c, rank, s);
    return rc >= 0 ? rc : s_comm_failed(c, rank, rc);
}

/* The whole buffer at once: on return every rank's buffer holds the sum. */
static tp_status_t s_allreduce(tp_backend_t *b, tp_comm_t *c, int rank,
                               tp_stream_t *s, float *buf, size_t count,
                               int average) {
    TP_TRY(s_allreduce_begin(b, c, rank, s, buf, count, average));
    return s_allreduce_end(b, c, rank, s);
}

static tp_status_t s_allreduce_local(tp_backend_t *b, float *const *bufs,
                                     int n, size_t count, int average,
                                     int root_only) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (n < 1 || n > TP_CUDA_COMM_MAX)
        return tp_error(TP_ERR_INVALID, "allreduce of %d buffers (1..%d)", n,
                        TP_CUDA_COMM_MAX);
    if (n == 1 || count == 0)
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    int dev0 = s_device_of(bufs[0]);
    for (int r = 1; r < n; r++)
        if (s_device_of(bufs[r]) != dev0)
            return tp_error(TP_ERR_UNSUPPORTED,
                            "allreduce_local: buffers on several devices (use "
                            "the collective allreduce, one thread per tower)");
    tp_ptrs p;
    memset(&p, 0, sizeof p);
    for (int r = 0; r < n; r++)
        p.p[r] = bufs[r];
    cudaStream_t cs = cb->def->cu;
    /* The towers' streams were synchronised by their runs (the model's
     * contract); the default stream only orders this kernel. */
    k_reduce<<<tp_cuda_blocks(count, 256), 256, 0, cs>>>(
        p, n, 0, count, 1.0f / (float)n, average, root_only);
    TP_CUDA_CHECK(cudaGetLastError());
    TP_CUDA_CHECK(cudaStreamSynchronize(cs));
    return TP_OK;
}

/* ---- staging ------------------------------------------------------------ */

struct tp_stage {
    void *host;          /* pinned */
    void *dev;
    size_t bytes;
    cudaEvent_t copied;  /* recorded on the copy stream after the H2D copy */
    cudaEvent_t used;    /* recorded on the consumer's stream after its reads */
    int used_recorded;
    int begun;           /* `copied` was recorded: a copy may read host */
};

static void s_stage_destroy(tp_backend_t *b, tp_stage_t *st) {
    if (!st)
        return;
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (tp_cuda_use(cb) == TP_OK)
        cudaStreamSynchronize(cb->copy);
    if (st->copied)
        cudaEventDestroy(st->copied);
    if (st->used)
        cudaEventDestroy(st->used);
    if (st->host)
        cudaFreeHost(st->host);
    if (st->dev)
        s_free(b, st->dev);
    free(st);
}

static tp_stage_t *s_stage_new(tp_backend_t *b, size_t bytes) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (tp_cuda_use(cb) < 0)
        return NULL;
    tp_stage_t *st = (tp_stage_t *)calloc(1, sizeof *st);
    if (!st) {
        tp_error(TP_ERR_NOMEM, "stage");
        return NULL;
    }
    st->bytes = bytes;
    size_t n = bytes ? bytes : 1;
    cudaError_t e = cudaHostAlloc(&st->host, n, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        st->host = NULL;
        tp_error(TP_ERR_NOMEM, "stage: %zu bytes of pinned host memory: %s",
                 bytes, cudaGetErrorString(e));
        s_stage_destroy(b, st);
        return NULL;
    }
    st->dev = s_alloc(b, n);
    if (!st->dev ||
        cudaEventCreateWithFlags(&st->copied, cudaEventDisableTiming) !=
            cudaSuccess ||
        cudaEventCreateWithFlags(&st->used, cudaEventDisableTiming) !=
            cudaSuccess) {
        if (st->dev)
            tp_error(TP_ERR_DEVICE, "stage events");
        s_stage_destroy(b, st);
        return NULL;
    }
    return st;
}

/* The host buffer, handed out to be filled: first wait for the copy still
 * reading it (the last stage_begin), so a producer that refills it right
 * away cannot race that copy even if it skipped stage_host_wait. Nearly
 * free when the copy is done. NULL, with the error, if the wait fails. */
static void *s_stage_host(tp_backend_t *b, tp_stage_t *st) {
    if (st->begun) {
        if (tp_cuda_use(tp_cuda_of(b)) < 0)
            return NULL;
        cudaError_t e = cudaEventSynchronize(st->copied);
        if (e != cudaSuccess) {
            tp_error(TP_ERR_DEVICE, "stage: waiting for the copy out of the "
                     "host buffer: %s", cudaGetErrorString(e));
            TP_ERROR("%s", tp_last_error());
            return NULL;
        }
    }
    return st->host;
}

static void *s_stage_device(tp_backend_t *b, tp_stage_t *st) {
    (void)b;
    return st->dev;
}

static tp_status_t s_stage_begin(tp_backend_t *b, tp_stage_t *st,
                                 size_t bytes) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (bytes > st->bytes)
        return tp_error(TP_ERR_INVALID, "stage: %zu bytes into a %zu-byte "
                                        "stage", bytes, st->bytes);
    TP_TRY(tp_cuda_use(cb));
    /* the previous consumer of this device buffer must be done reading */
    if (st->used_recorded)
        TP_CUDA_CHECK(cudaStreamWaitEvent(cb->copy, st->used, 0));
    if (bytes)
        TP_CUDA_CHECK(cudaMemcpyAsync(st->dev, st->host, bytes,
                                      cudaMemcpyHostToDevice, cb->copy));
    TP_CUDA_CHECK(cudaEventRecord(st->copied, cb->copy));
    st->begun = 1;
    return TP_OK;
}

static tp_status_t s_stage_wait(tp_backend_t *b, tp_stage_t *st,
                                tp_stream_t *s) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    TP_CUDA_CHECK(cudaStreamWaitEvent(tp_cuda_stream(cb, s)->cu, st->copied, 0));
    /* a consumer on the default stream: the towers order after this wait,
     * hence after the copy, too */
    return tp_cuda_def_mark(cb, s);
}

static tp_status_t s_stage_release(tp_backend_t *b, tp_stage_t *st,
                                   tp_stream_t *s) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    TP_TRY(tp_cuda_use(cb));
    TP_CUDA_CHECK(cudaEventRecord(st->used, tp_cuda_stream(cb, s)->cu));
    st->used_recorded = 1;
    return TP_OK;
}

static tp_status_t s_stage_host_wait(tp_backend_t *b, tp_stage_t *st) {
    TP_TRY(tp_cuda_use(tp_cuda_of(b)));
    TP_CUDA_CHECK(cudaEventSynchronize(st->copied));
    return TP_OK;
}

/* ---- ops, lifetime ------------------------------------------------------ */

static size_t s_op_workspace(tp_backend_t *b, const tp_op_call_t *c) {
    return tp_cuda_op_workspace(tp_cuda_of(b), c);
}

static tp_status_t s_op_forward(tp_backend_t *b, tp_stream_t *s,
                                const tp_op_call_t *c) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (s && s->mode == TP_CUDA_REPLAYING)
        return tp_cuda_op_forward_host(s, c);
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    TP_TRY(tp_cuda_op_forward(cb, tp_cuda_stream(cb, s), c));
    return tp_cuda_def_mark(cb, s);
}

static tp_status_t s_op_backward(tp_backend_t *b, tp_stream_t *s,
                                 const tp_op_call_t *c) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (s && s->mode == TP_CUDA_REPLAYING)
        return TP_OK;  /* no backward has a host part */
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    TP_TRY(tp_cuda_op_backward(cb, tp_cuda_stream(cb, s), c));
    return tp_cuda_def_mark(cb, s);
}

/* ---- timing marks for profiling (backend_impl.h, timer_new) ------------ */

struct tp_timer {
    int n;
    cudaEvent_t *ev;
};

static void s_timer_destroy(tp_backend_t *b, tp_timer_t *t) {
    if (!t)
        return;
    if (tp_cuda_use(tp_cuda_of(b)) == TP_OK)
        for (int i = 0; i < t->n; i++)
            if (t->ev[i])
                cudaEventDestroy(t->ev[i]);
    free(t->ev);
    free(t);
}

static tp_timer_t *s_timer_new(tp_backend_t *b, int n) {
    if (n < 1 || tp_cuda_use(tp_cuda_of(b)) < 0)
        return NULL;
    tp_timer_t *t = (tp_timer_t *)calloc(1, sizeof *t);
    if (t)
        t->ev = (cudaEvent_t *)calloc((size_t)n, sizeof *t->ev);
    if (!t || !t->ev) {
        free(t);
        tp_error(TP_ERR_NOMEM, "timer: %d marks", n);
        return NULL;
    }
    t->n = n;
    for (int i = 0; i < n; i++) {
        cudaError_t e = cudaEventCreate(&t->ev[i]);  /* timing on */
        if (e != cudaSuccess) {
            tp_error(TP_ERR_DEVICE, "timer: cudaEventCreate: %s", cudaGetErrorString(e));
            s_timer_destroy(b, t);
            return NULL;
        }
    }
    return t;
}

static tp_status_t s_timer_mark(tp_backend_t *b, tp_stream_t *s, tp_timer_t *t, int i) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (!t || i < 0 || i >= t->n)
        return tp_error(TP_ERR_INVALID, "timer: mark %d of %d", i, t ? t->n : 0);
    TP_TRY(tp_cuda_use(cb));
    TP_CUDA_CHECK(cudaEventRecord(t->ev[i], tp_cuda_stream(cb, s)->cu));
    return TP_OK;
}

static tp_status_t s_timer_ms(tp_backend_t *b, tp_timer_t *t, int i, int j, float *ms) {
    if (!t || i < 0 || j < 0 || i >= t->n || j >= t->n)
        return tp_error(TP_ERR_INVALID, "timer: marks %d and %d of %d", i, j, t ? t->n : 0);
    TP_TRY(tp_cuda_use(tp_cuda_of(b)));
    TP_CUDA_CHECK(cudaEventElapsedTime(ms, t->ev[i], t->ev[j]));
    return TP_OK;
}

/* One thread spinning on the device's global timer (nanoseconds). */
__global__ static void k_hold(uint64_t ns) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

static tp_status_t s_timer_hold(tp_backend_t *b, tp_stream_t *s, uint64_t ns) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    TP_TRY(tp_cuda_use(cb));
    k_hold<<<1, 1, 0, tp_cuda_stream(cb, s)->cu>>>(ns);
    TP_CUDA_CHECK(cudaGetLastError());
    return TP_OK;
}

/* ---- whole steps as CUDA graphs (backend_impl.h, graph_begin) ---------- */

struct tp_graph {
    cudaGraphExec_t exec;
};

#define TP_CUDA_PARAMS 4096 /* floats of step scalars per stream */

static tp_status_t s_graph_begin(tp_backend_t *b, tp_stream_t *s,
                                 tp_graph_t *g) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (!s || s == cb->def || s->mode != TP_CUDA_EAGER)
        return tp_error(TP_ERR_STATE, "CUDA graph: a tower's stream, not "
                        "already recording or replaying");
    TP_TRY(tp_cuda_use(cb));
    /* what the default stream did before, ordered now: no wait on it
     * inside the record */
    TP_TRY(tp_cuda_order(cb, s));
    /* the same places as when recorded: the label checks' slots start
     * from the beginning */
    if (s->nchecks) {
        TP_CUDA_CHECK(cudaStreamSynchronize(s->cu));
        TP_TRY(tp_cuda_checks_collect(s));
    }
    if (!s->params_host) {
        TP_CUDA_CHECK(cudaHostAlloc((void **)&s->params_host,
                                    TP_CUDA_PARAMS * sizeof(float),
                                    cudaHostAllocPortable));
        TP_CUDA_CHECK(cudaMalloc((void **)&s->params_dev,
                                 TP_CUDA_PARAMS * sizeof(float)));
        s->params_cap = TP_CUDA_PARAMS;
    }
    s->params_used = 0;
    if (g) {
        s->mode = TP_CUDA_REPLAYING;
        return TP_OK;
    }
    TP_CUDA_CHECK(cudaStreamBeginCapture(s->cu, cudaStreamCaptureModeThreadLocal));
    s->mode = TP_CUDA_RECORDING;
    return TP_OK;
}

static void s_graph_abort(tp_backend_t *b, tp_stream_t *s) {
    (void)b;
    if (!s)
        return;
    if (s->mode == TP_CUDA_RECORDING) {
        cudaGraph_t graph = NULL;
        cudaStreamEndCapture(s->cu, &graph);
        if (graph)
            cudaGraphDestroy(graph);
        cudaGetLastError(); /* a failed capture's sticky-free error */
    }
    s->mode = TP_CUDA_EAGER;
}

/* Before a step's graph runs: its scalars (written by the host during the
 * recording or replay) to the device in one block, then the stream's mark
 * (the step's inputs and scalars are on the device once it is reached:
 * the host may rewrite them; see stream_wait_mark). */
static tp_status_t s_params_in(tp_stream_t *s) {
    if (s->params_used)
        TP_CUDA_CHECK(cudaMemcpyAsync(s->params_dev, s->params_host,
                                      s->params_used * sizeof(float),
                                      cudaMemcpyHostToDevice, s->cu));
    TP_CUDA_CHECK(cudaEventRecord(s->mark, s->cu));
    return TP_OK;
}

static tp_status_t s_graph_end(tp_backend_t *b, tp_stream_t *s, tp_graph_t **g) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (!s || s->mode == TP_CUDA_EAGER)
        return tp_error(TP_ERR_STATE, "CUDA graph: graph_end without graph_begin");
    if (s->mode == TP_CUDA_REPLAYING) {
        s->mode = TP_CUDA_EAGER;
        TP_TRY(tp_cuda_use(cb));
        TP_TRY(tp_cuda_order(cb, s));
        TP_TRY(s_params_in(s));
        TP_CUDA_CHECK(cudaGraphLaunch((*g)->exec, s->cu));
        return TP_OK;
    }
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(s->cu, &graph);
    s->mode = TP_CUDA_EAGER;
    if (e != cudaSuccess) {
        if (graph)
            cudaGraphDestroy(graph);
        cudaGetLastError();
        return tp_error(TP_ERR_DEVICE, "CUDA graph: recording the step failed: "
                        "%s", cudaGetErrorString(e));
    }
    tp_graph_t *ng = (tp_graph_t *)calloc(1, sizeof *ng);
    if (!ng) {
        cudaGraphDestroy(graph);
        return tp_error(TP_ERR_NOMEM, "CUDA graph");
    }
    e = cudaGraphInstantiate(&ng->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        free(ng);
        return tp_error(TP_ERR_DEVICE, "CUDA graph: instantiating the step: %s",
                        cudaGetErrorString(e));
    }
    tp_status_t pr = s_params_in(s);
    e = pr < 0 ? cudaErrorUnknown : cudaGraphLaunch(ng->exec, s->cu);
    if (e != cudaSuccess) {
        cudaGraphExecDestroy(ng->exec);
        free(ng);
        if (pr < 0)
            return pr;
        return tp_error(TP_ERR_DEVICE, "CUDA graph: launching the step: %s",
                        cudaGetErrorString(e));
    }
    *g = ng;
    return TP_OK;
}

static void s_graph_destroy(tp_backend_t *b, tp_graph_t *g) {
    if (!g)
        return;
    if (tp_cuda_use(tp_cuda_of(b)) == TP_OK)
        cudaGraphExecDestroy(g->exec);
    free(g);
}

static void s_destroy(tp_backend_t *b) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (tp_cuda_use(cb) == TP_OK)
        cudaDeviceSynchronize(); /* teardown: everything must have finished */
    tp_cuda_cache_free(cb);
    s_stream_free(cb->def);
    if (cb->def_done)
        cudaEventDestroy(cb->def_done);
    if (cb->copy)
        cudaStreamDestroy(cb->copy);
    while (cb->chunks) {
        struct tp_cuda_chunk *c = cb->chunks;
        cb->chunks = c->next;
        if (c->live)
            TP_WARN("CUDA backend: %d allocations still live at destroy",
                    c->live);
        cudaFree(c->base);
        free(c);
    }
    pthread_mutex_destroy(&cb->mu);
    free(cb);
}

/* batch_matmul's bias and GELU folds (fold.c; ops.cu's s_bmm_fold_*):
 * only with TP_CUDA_BMM_FOLD=1 until a GPU run has checked them
 * (docs/cuda.md, "GPU checks not yet run") */
static int s_bmm_fold(tp_backend_t *b) {
    return tp_cuda_of(b)->bmm_fold;
}

static const tp_backend_ops_t s_cuda_ops = {
    /* .name = */ "cuda",
    /* .alloc = */ s_alloc,
    /* .free = */ s_free,
    /* .copy = */ s_copy,
    /* .fill = */ s_fill,
    /* .stream_new = */ s_stream_new,
    /* .stream_destroy = */ s_stream_destroy,
    /* .stream_sync = */ s_stream_sync,
    /* .op_workspace = */ s_op_workspace,
    /* .op_forward = */ s_op_forward,
    /* .op_backward = */ s_op_backward,
    /* .gemm = */ s_gemm,
    /* .sgd_update = */ s_sgd,
    /* .adam_update = */ s_adam,
    /* .comm_new = */ s_comm_new,
    /* .comm_destroy = */ s_comm_destroy,
    /* .allreduce = */ s_allreduce,
    /* .comm_abort = */ s_comm_abort,
    /* .allreduce_local = */ s_allreduce_local,
    /* .destroy = */ s_destroy,
    /* .stage_new = */ s_stage_new,
    /* .stage_destroy = */ s_stage_destroy,
    /* .stage_host = */ s_stage_host,
    /* .stage_device = */ s_stage_device,
    /* .stage_begin = */ s_stage_begin,
    /* .stage_wait = */ s_stage_wait,
    /* .stage_release = */ s_stage_release,
    /* .stage_host_wait = */ s_stage_host_wait,
    /* .graph_begin = */ s_graph_begin,
    /* .graph_end = */ s_graph_end,
    /* .graph_abort = */ s_graph_abort,
    /* .graph_destroy = */ s_graph_destroy,
    /* .augment_batch = */ tp_cuda_augment_batch,
    /* .host_alloc = */ s_host_alloc,
    /* .host_free = */ s_host_free,
    /* .copy_async = */ s_copy_async,
    /* .stream_mark = */ s_stream_mark,
    /* .stream_wait_mark = */ s_stream_wait_mark,
    /* .allreduce_begin = */ s_allreduce_begin,
    /* .allreduce_end = */ s_allreduce_end,
    /* .comm_id = */ s_comm_id,
    /* .comm_join = */ s_comm_join,
    /* .timer_new = */ s_timer_new,
    /* .timer_mark = */ s_timer_mark,
    /* .timer_ms = */ s_timer_ms,
    /* .timer_destroy = */ s_timer_destroy,
    /* .timer_hold = */ s_timer_hold,
    /* .grad_sumsq = */ s_grad_sumsq,
    /* .grad_clip = */ s_grad_clip,
    /* .ema_update = */ s_ema_update,
    /* .grad_accumulate = */ s_grad_accumulate,
    /* .noise_fill = */ tp_cuda_noise_fill,
    /* .allreduce_sgd = */ NULL,
    /* .nchw16c = */ NULL,
    /* .bmm_fold = */ s_bmm_fold,
    /* .bnorm_add = */ NULL,
    /* .conv_nhwc = */ NULL,
    /* .sgd_wd_update = */ s_sgd_wd,
    /* .allreduce_sgd_wd = */ NULL,
};

/* Exported for gpu/device.c (dlsym): a backend on opt->device, or NULL with
 * the reason in err[size]. */
extern "C" __attribute__((visibility("default"))) tp_backend_t *
tp_cuda_module_backend_new(const tp_cuda_options_t *opt, char *err,
                           size_t size) {
    tp_cuda_backend_t *cb = (tp_cuda_backend_t *)calloc(1, sizeof *cb);
    if (!cb) {
        snprintf(err, size, "out of host memory");
        return NULL;
    }
    cb->base.ops = &s_cuda_ops;
    cb->base.impl = cb;
    cb->base.device = opt->device;
    cb->device = opt->device;
    cb->tf32 = opt->tf32 != 0;
    cb->bf16 = opt->bf16 != 0;
    /* heuristic (default: cuDNN's ranking without a run), or measure:
     * rank by running each algorithm once when planned, which chose
     * slower steps on an H100 (docs/history.md, the third GPU run) */
    const char *search = getenv("TP_CUDNN_SEARCH");
    cb->conv_measure = search && strcmp(search, "measure") == 0;
    /* batch norm's training passes by ours (default: cnn-bn's step 1.18x
     * faster than with cuDNN's on an H100, docs/cuda.md "Current results on a GPU")
     * or, with TP_CUDA_BN=cudnn, by cuDNN's legacy calls */
    const char *bn = getenv("TP_CUDA_BN");
    cb->bn_cudnn = bn && strcmp(bn, "cudnn") == 0;
    if (bn && *bn && !cb->bn_cudnn && strcmp(bn, "towerpack") != 0)
        TP_WARN("TP_CUDA_BN='%s' is neither 'towerpack' nor 'cudnn': towerpack's "
                "batch norm runs", bn);
    const char *bf = getenv("TP_CUDA_BMM_FOLD");
    cb->bmm_fold = bf && strcmp(bf, "1") == 0;
    if (bf && *bf && !cb->bmm_fold && strcmp(bf, "0") != 0)
        TP_WARN("TP_CUDA_BMM_FOLD='%s' is neither '0' nor '1': batch_matmul's bias "
                "and GELU stay unfolded", bf);
    cb->chunk_bytes = (opt->chunk_mb ? opt->chunk_mb : 256) << 20;
    pthread_mutex_init(&cb->mu, NULL);
    struct cudaDeviceProp prop;
    cudaError_t e = cudaSetDevice(cb->device);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, cb->device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&cb->copy, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&cb->def_done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        snprintf(err, size, "%s", cudaGetErrorString(e));
        if (cb->copy)
            cudaStreamDestroy(cb->copy);
        pthread_mutex_destroy(&cb->mu);
        free(cb);
        return NULL;
    }
    snprintf(cb->device_name, sizeof cb->device_name, "%s", prop.name);
    cb->def = s_stream_new(&cb->base);
    if (!cb->def) {
        snprintf(err, size, "%s", tp_last_error());
        s_destroy(&cb->base);
        return NULL;
    }
    TP_INFO("CUDA backend: device %d (%s, sm_%d%d, %zu MiB), TF32 %s, bf16 "
            "products %s, cuDNN %zu, NCCL %d.%d", cb->device, prop.name,
            prop.major, prop.minor, prop.totalGlobalMem >> 20,
            cb->tf32 ? "on" : "off", cb->bf16 ? "on" : "off", cudnnGetVersion(),
            NCCL_MAJOR, NCCL_MINOR);
    return &cb->base;
}
