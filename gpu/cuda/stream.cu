/* towerpack gpu/cuda: what every CUDA file does on a stream: make the
 * backend's device current, pick the stream (the default one for NULL),
 * order a stream after work on the default stream and mark that work done,
 * run a cuBLAS product (FP32, or BF16 inputs when the stream asks), and
 * hand out a recorded step's scalars. The backend's table (backend.cu), the
 * graph ops (ops.cu) and augmentation (augment.cu) all call these, and these
 * call none of them: the files depend one way. */
#include <string.h>
#include "gpu/cuda/internal.h"

/* ---- device, streams ---------------------------------------------------- */

tp_status_t tp_cuda_use(tp_cuda_backend_t *cb) {
    TP_CUDA_CHECK(cudaSetDevice(cb->device));
    return TP_OK;
}

tp_stream_t *tp_cuda_stream(tp_cuda_backend_t *cb, tp_stream_t *s) {
    return s ? s : cb->def;
}

tp_status_t tp_cuda_order(tp_cuda_backend_t *cb, tp_stream_t *s) {
    if (!s || s == cb->def)
        return TP_OK;
    /* The common case (nothing new on the default stream) takes no lock;
     * a generation bumped concurrently by another thread is work the
     * caller did not order before this call anyway. */
    uint64_t gen = __atomic_load_n(&cb->def_gen, __ATOMIC_ACQUIRE);
    if (s->def_seen == gen)
        return TP_OK;
    pthread_mutex_lock(&cb->mu);
    gen = cb->def_gen;
    cudaError_t e = cudaStreamWaitEvent(s->cu, cb->def_done, 0);
    pthread_mutex_unlock(&cb->mu);
    TP_CUDA_CHECK(e);
    s->def_seen = gen;
    return TP_OK;
}

tp_status_t tp_cuda_def_mark(tp_cuda_backend_t *cb, tp_stream_t *s) {
    if (s && s != cb->def)
        return TP_OK;
    pthread_mutex_lock(&cb->mu);
    cudaError_t e = cudaEventRecord(cb->def_done, cb->def->cu);
    if (e == cudaSuccess)
        __atomic_store_n(&cb->def_gen, cb->def_gen + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&cb->mu);
    TP_CUDA_CHECK(e);
    return TP_OK;
}

/* ---- products ----------------------------------------------------------- */

cublasStatus_t tp_cuda_sgemm(tp_stream_t *st, int ta, int tb, int m, int n,
                             int k, const float *alpha, const float *a, int lda,
                             const float *b, int ldb, const float *beta,
                             float *c, int ldc) {
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!st->bf16)
        return cublasSgemm(st->blas, ob, oa, n, m, k, alpha, b, ldb, a, lda, beta,
                           c, ldc);
    return cublasGemmEx(st->blas, ob, oa, n, m, k, alpha, b, CUDA_R_32F, ldb, a,
                        CUDA_R_32F, lda, beta, c, CUDA_R_32F, ldc,
                        CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT);
}

/* ---- a recorded step's scalars ------------------------------------------ */

float *tp_cuda_params(tp_stream_t *s, size_t n, float **host) {
    if (!s->params_host || s->params_used + n > s->params_cap)
        return NULL;
    *host = s->params_host + s->params_used;
    float *dev = s->params_dev + s->params_used;
    s->params_used += n;
    return dev;
}

tp_status_t tp_cuda_step_scalars(tp_stream_t *st, const float *v, size_t n,
                                 const float **dev) {
    float *host;
    float *d = tp_cuda_params(st, n, &host);
    if (!d)
        return tp_error(TP_ERR_STATE, "CUDA graph: more step scalars (optimizer "
                        "scalars, dropout keys) than %zu in one step",
                        st->params_cap);
    memcpy(host, v, n * sizeof *v);
    *dev = d;
    return TP_OK;
}
