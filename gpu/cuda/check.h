/* towerpack gpu/cuda: the one checking macro for CUDA runtime, cuBLAS, cuDNN
 * and NCCL calls. Each maps its library's code to tp_status_t, records the
 * expression, file and line as the thread's last error, logs it, and returns
 * TP_ERR_DEVICE (TP_ERR_NOMEM for out-of-memory) from the calling function. */
#ifndef TP_GPU_CUDA_CHECK_H
#define TP_GPU_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>
#include <towerpack/log.h>
#include <towerpack/status.h>

static inline tp_status_t tp_cuda_code_(cudaError_t e, const char **msg) {
    *msg = cudaGetErrorString(e);
    return e == cudaSuccess ? TP_OK
         : e == cudaErrorMemoryAllocation ? TP_ERR_NOMEM : TP_ERR_DEVICE;
}
static inline tp_status_t tp_cuda_code_cublas_(cublasStatus_t e, const char **msg) {
    *msg = cublasGetStatusString(e);
    return e == CUBLAS_STATUS_SUCCESS ? TP_OK
         : e == CUBLAS_STATUS_ALLOC_FAILED ? TP_ERR_NOMEM : TP_ERR_DEVICE;
}
static inline tp_status_t tp_cuda_code_cudnn_(cudnnStatus_t e, const char **msg) {
    *msg = cudnnGetErrorString(e);
    return e == CUDNN_STATUS_SUCCESS ? TP_OK
         : e == CUDNN_STATUS_ALLOC_FAILED ? TP_ERR_NOMEM : TP_ERR_DEVICE;
}
static inline tp_status_t tp_cuda_code_nccl_(ncclResult_t e, const char **msg) {
    *msg = ncclGetErrorString(e);
    return e == ncclSuccess ? TP_OK : TP_ERR_DEVICE;
}

#ifdef __cplusplus
static inline tp_status_t tp_cuda_code(cudaError_t e, const char **m) { return tp_cuda_code_(e, m); }
static inline tp_status_t tp_cuda_code(cublasStatus_t e, const char **m) { return tp_cuda_code_cublas_(e, m); }
static inline tp_status_t tp_cuda_code(cudnnStatus_t e, const char **m) { return tp_cuda_code_cudnn_(e, m); }
static inline tp_status_t tp_cuda_code(ncclResult_t e, const char **m) { return tp_cuda_code_nccl_(e, m); }
#else
#define tp_cuda_code(e, msg) _Generic((e),                                    \
    cudaError_t: tp_cuda_code_,                                               \
    cublasStatus_t: tp_cuda_code_cublas_,                                     \
    cudnnStatus_t: tp_cuda_code_cudnn_,                                       \
    ncclResult_t: tp_cuda_code_nccl_)(e, msg)
#endif

/* Evaluate a CUDA-family call; on failure record, log and return. */
#define TP_CUDA_CHECK(expr)                                                   \
    do {                                                                      \
        const char *tp_cuda_msg_;                                             \
        tp_status_t tp_cuda_rc_ = tp_cuda_code((expr), &tp_cuda_msg_);        \
        if (tp_cuda_rc_ != TP_OK) {                                           \
            tp_error(tp_cuda_rc_, "%s failed: %s (%s:%d)", #expr,             \
                     tp_cuda_msg_, __FILE__, __LINE__);                       \
            TP_ERROR("%s", tp_last_error());                                  \
            return tp_cuda_rc_;                                               \
        }                                                                     \
    } while (0)

#endif
