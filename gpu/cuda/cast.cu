/* towerpack gpu/cuda: elementwise cast kernels (uint8 -> float32 with a
 * scale), used to normalise image batches on the device. */
#include <cstdint>
#include "gpu/cuda/check.h"

namespace {
__global__ void cast_u8_f32(const uint8_t *__restrict__ src,
                            float *__restrict__ dst, size_t n, float scale) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        dst[i] = (float)src[i] * scale;
}
}  // namespace

/* dst[n] = src[n] * scale on `stream`; checks the launch. */
extern "C" tp_status_t tp_cuda_cast_u8_f32(const uint8_t *src, float *dst,
                                           size_t n, float scale,
                                           cudaStream_t stream) {
    if (n == 0)
        return TP_OK;
    int threads = 256;
    size_t want = (n + threads - 1) / threads;
    int blocks = want > 4096 ? 4096 : (int)want;
    cast_u8_f32<<<blocks, threads, 0, stream>>>(src, dst, n, scale);
    TP_CUDA_CHECK(cudaGetLastError());
    return TP_OK;
}
