/* towerpack gpu/cuda: the GAN's noise drawn on the device (the backend's
 * noise_fill entry, gpu/backend_impl.h): one thread an element, each
 * computing tp_philox_noise (towerpack/philox.h), the function the host's
 * tp_gan_noise_fill runs, so the device's numbers are the host's to the
 * bit. That needs the device to round as the host does: the header's
 * double products, sums and square root are the round-to-nearest
 * intrinsics here (__dmul_rn, __dadd_rn: never fused into an FMA, as
 * nvcc's default -fmad=true would fuse a * b + c; __dsqrt_rn), and its
 * divisions are IEEE's (nvcc's default -prec-div=true; no
 * --use_fast_math in this module). The uniform draw's float arithmetic
 * is exact (2u - 1 of a 24-bit u) up to the one rounding of the scale's
 * product, the same on both sides.
 *
 * Not yet run on a GPU (written 2026-11-28, docs/cuda.md): the check is
 * cuda_ops/noise_fill_is_the_hosts (tests/gpu/test_cuda_ops.c). */
#define TP_PHILOX_FN static __host__ __device__ inline
#ifdef __CUDA_ARCH__
#define TP_PHILOX_DMUL(a, b) __dmul_rn((a), (b))
#define TP_PHILOX_DADD(a, b) __dadd_rn((a), (b))
#define TP_PHILOX_DSQRT(a) __dsqrt_rn(a)
#endif
#include <towerpack/philox.h>
#include "gpu/cuda/internal.h"

namespace {
__global__ void k_noise(float *__restrict__ dst, uint64_t seed, int64_t step, int64_t row0,
                        int64_t rows, int64_t dim, int normal, float scale) {
    const size_t n = (size_t)rows * (size_t)dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const int64_t r = (int64_t)(e / (size_t)dim), k = (int64_t)(e % (size_t)dim);
        dst[e] = tp_philox_noise(seed, step, row0 + r, k, normal, scale);
    }
}
}  // namespace

extern "C" tp_status_t tp_cuda_noise_fill(tp_backend_t *b, tp_stream_t *s, float *dst,
                                          uint64_t seed, int64_t step, int64_t row0,
                                          int64_t rows, int64_t dim, int normal,
                                          float scale) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (rows < 0 || dim < 0 || (rows * dim && !dst))
        return tp_error(TP_ERR_INVALID, "noise_fill: %lld x %lld floats into %p",
                        (long long)rows, (long long)dim, (void *)dst);
    /* the step is a kernel parameter: a replayed graph would draw the
     * recorded step's numbers again */
    if (s && s->mode != TP_CUDA_EAGER)
        return tp_error(TP_ERR_STATE, "noise_fill: not inside a recorded step");
    if (!rows || !dim)
        return TP_OK;
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    tp_stream_t *st = tp_cuda_stream(cb, s);
    const size_t n = (size_t)rows * (size_t)dim;
    k_noise<<<tp_cuda_blocks(n, 256), 256, 0, st->cu>>>(dst, seed, step, row0, rows, dim,
                                                         normal, scale);
    TP_CUDA_CHECK(cudaGetLastError());
    return tp_cuda_def_mark(cb, s);
}
