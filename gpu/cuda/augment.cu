/* towerpack gpu/cuda: batches made on the device from a resident data set
 * (tp_backend_augment_batch, backend.h): pad, crop, mirror, normalise and
 * gather the labels, in one kernel. The picks travel in the launch's
 * parameters (S_PICKS per launch), so a batch copies and allocates
 * nothing. The arithmetic is the host reference's (gpu/augment.c) to the
 * bit: (v - mean) * inv_std, which nvcc cannot contract into an FMA. */
#include <cstdint>
#include <cstring>
#include "gpu/cuda/internal.h"

namespace {
constexpr int S_PICKS = 192;  // 3 KB: inside the 4 KB of kernel parameters

struct picks_t {
    tp_augment_pick_t p[S_PICKS];
};

__global__ void k_augment(float *__restrict__ dst, int32_t *__restrict__ labels_dst,
                          const uint8_t *__restrict__ images,
                          const int32_t *__restrict__ labels, picks_t picks, int n,
                          tp_augment_shape_t sh) {
    const size_t per = (size_t)sh.crop_h * sh.crop_w * sh.c;
    const size_t total = per * (size_t)n;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(e / per);
        const size_t r = e - (size_t)i * per;
        const int k = (int)(r % (size_t)sh.c);
        const size_t px = r / (size_t)sh.c;
        const int x = (int)(px % (size_t)sh.crop_w), y = (int)(px / (size_t)sh.crop_w);
        const tp_augment_pick_t p = picks.p[i];
        const int sy = p.y + y - sh.pad;
        const int sx = p.x + (p.flip ? sh.crop_w - 1 - x : x) - sh.pad;
        float v = 0.0f;
        if (sy >= 0 && sy < sh.h && sx >= 0 && sx < sh.w)
            v = (float)images[(((size_t)p.index * sh.h + sy) * sh.w + sx) * sh.c + k];
        dst[e] = (v - sh.mean[k]) * sh.inv_std[k];
        if (labels_dst && r == 0)
            labels_dst[i] = labels[p.index];
    }
}
}  // namespace

extern "C" tp_status_t tp_cuda_augment_batch(tp_backend_t *b, tp_stream_t *s,
                                             float *dst, int32_t *labels_dst,
                                             const uint8_t *images,
                                             const int32_t *labels,
                                             const tp_augment_pick_t *picks, int n,
                                             const tp_augment_shape_t *shape) {
    tp_cuda_backend_t *cb = tp_cuda_of(b);
    if (s && s->mode != TP_CUDA_EAGER)
        return tp_error(TP_ERR_STATE, "augment_batch: not inside a recorded step");
    TP_TRY(tp_cuda_use(cb));
    TP_TRY(tp_cuda_order(cb, s));
    tp_stream_t *st = tp_cuda_stream(cb, s);
    const size_t per = (size_t)shape->crop_h * shape->crop_w * shape->c;
    if (!labels)  /* as the host: labels only when both are given */
        labels_dst = NULL;
    for (int first = 0; first < n; first += S_PICKS) {
        const int m = n - first < S_PICKS ? n - first : S_PICKS;
        picks_t pk;
        memset(&pk, 0, sizeof pk);
        memcpy(pk.p, picks + first, (size_t)m * sizeof *picks);
        k_augment<<<tp_cuda_blocks(per * (size_t)m, 256), 256, 0, st->cu>>>(
            dst + (size_t)first * per, labels_dst ? labels_dst + first : NULL, images,
            labels, pk, m, *shape);
        TP_CUDA_CHECK(cudaGetLastError());
    }
    return tp_cuda_def_mark(cb, s);
}
