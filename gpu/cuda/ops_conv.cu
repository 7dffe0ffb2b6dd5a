/* towerpack gpu/cuda: the convolution family's own kernels (docs/ops.md):
 * nearest and bilinear upsampling by an integer factor, forward and
 * backward.
 *
 * One thread per output element forward; backward one thread per INPUT
 * element, gathering the output gradients that read it (a nearest input
 * pixel: its f x f block; a bilinear one: the outputs within two source
 * pixels whose taps name it), so the sums are deterministic and need no
 * atomics, and dx_acc is a plain store or add. The source taps are the
 * CPU's s_taps (ops_conv.c), computed in float in the same order, so both
 * backends read the same pixels with the same weights. */
#include <math.h>
#include "gpu/cuda/ops_conv.h"
#include "gpu/op_geometry.h"

#define UP_THREADS 256
#define TP_UP_LAUNCHED() TP_CUDA_CHECK(cudaGetLastError())

namespace {


/* The weight output o gives input i along one axis (0 when it reads it
 * not at all). */
__device__ float up_weight(int i, int o, int in, int f, int align) {
    int i0, i1;
    float l0, l1;
    tp_bilinear_taps(o, in, f, align, &i0, &i1, &l0, &l1);
    return (i0 == i ? l0 : 0.0f) + (i1 == i ? l1 : 0.0f);
}

/* The outputs whose taps can name input i: two source pixels either side
 * (the taps are floor(src) and the one after), bounds kept generous. */
__device__ void up_range(int i, int in, int f, int align, int *lo, int *hi) {
    const int out = in * f;
    if (align && out > 1 && in > 1) {
        const float per = (float)(out - 1) / (float)(in - 1); /* outputs per source */
        *lo = (int)floorf((float)(i - 1) * per) - 1;
        *hi = (int)ceilf((float)(i + 1) * per) + 1;
    } else if (align) {
        *lo = 0;
        *hi = out - 1;
    } else {
        *lo = (i - 1) * f - 1;
        *hi = (i + 2) * f;
    }
    *lo = *lo < 0 ? 0 : *lo;
    *hi = *hi > out - 1 ? out - 1 : *hi;
}

__global__ void k_up_fwd(const float *x, float *y, size_t planes, int h, int w,
                         int f, int bilinear, int align) {
    const int oh = h * f, ow = w * f;
    const size_t n = planes * (size_t)oh * ow;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int ox = (int)(i % ow), oy = (int)(i / ow % oh);
        const float *xp = x + i / ((size_t)oh * ow) * (size_t)h * w;
        if (!bilinear) {
            y[i] = xp[(size_t)(oy / f) * w + ox / f];
            continue;
        }
        int h0, h1, w0, w1;
        float lh0, lh1, lw0, lw1;
        tp_bilinear_taps(oy, h, f, align, &h0, &h1, &lh0, &lh1);
        tp_bilinear_taps(ox, w, f, align, &w0, &w1, &lw0, &lw1);
        const float *r0 = xp + (size_t)h0 * w, *r1 = xp + (size_t)h1 * w;
        y[i] = lh0 * (lw0 * r0[w0] + lw1 * r0[w1]) + lh1 * (lw0 * r1[w0] + lw1 * r1[w1]);
    }
}

__global__ void k_up_bwd(const float *dy, float *dx, int acc, size_t planes,
                         int h, int w, int f, int bilinear, int align) {
    const int oh = h * f, ow = w * f;
    const size_t n = planes * (size_t)h * w;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int ix = (int)(i % w), iy = (int)(i / w % h);
        const float *yp = dy + i / ((size_t)h * w) * (size_t)oh * ow;
        float s = 0.0f;
        if (!bilinear) {
            for (int a = 0; a < f; a++)
                for (int b = 0; b < f; b++)
                    s += yp[(size_t)(iy * f + a) * ow + ix * f + b];
        } else {
            int ylo, yhi, xlo, xhi;
            up_range(iy, h, f, align, &ylo, &yhi);
            up_range(ix, w, f, align, &xlo, &xhi);
            for (int oy = ylo; oy <= yhi; oy++) {
                const float wy = up_weight(iy, oy, h, f, align);
                if (wy == 0.0f)
                    continue;
                float r = 0.0f;
                for (int ox = xlo; ox <= xhi; ox++) {
                    const float wx = up_weight(ix, ox, w, f, align);
                    if (wx != 0.0f)
                        r += wx * yp[(size_t)oy * ow + ox];
                }
                s += wy * r;
            }
        }
        dx[i] = acc ? dx[i] + s : s;
    }
}

} // namespace

int tp_cuda_upsample_kind(tp_op_kind_t k) {
    return k == TP_OP_UPSAMPLE_NEAREST || k == TP_OP_UPSAMPLE_BILINEAR;
}

tp_status_t tp_cuda_upsample_forward(tp_stream_t *s, const tp_op_call_t *c) {
    if (!tp_cuda_upsample_kind(c->kind))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA forward for op %s",
                        c->name, tp_op_name(c->kind));
    const tp_shape_t *xs = &c->xshape[0];
    const size_t planes = (size_t)xs->d[0] * (size_t)xs->d[1];
    const size_t n = tp_shape_count(&c->yshape);
    if (n == 0)
        return TP_OK;
    k_up_fwd<<<tp_cuda_blocks(n, UP_THREADS), UP_THREADS, 0, s->cu>>>(
        (const float *)c->x[0], (float *)c->y, planes, (int)xs->d[2], (int)xs->d[3],
        c->attr->sh, c->kind == TP_OP_UPSAMPLE_BILINEAR, c->attr->align_corners);
    TP_UP_LAUNCHED();
    return TP_OK;
}

tp_status_t tp_cuda_upsample_backward(tp_stream_t *s, const tp_op_call_t *c) {
    if (!tp_cuda_upsample_kind(c->kind))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no CUDA backward for op %s",
                        c->name, tp_op_name(c->kind));
    const tp_shape_t *xs = &c->xshape[0];
    const size_t n = tp_shape_count(xs);
    if (!c->dx[0] || n == 0)
        return TP_OK;
    k_up_bwd<<<tp_cuda_blocks(n, UP_THREADS), UP_THREADS, 0, s->cu>>>(
        c->dy, c->dx[0], c->dx_acc[0], (size_t)xs->d[0] * (size_t)xs->d[1],
        (int)xs->d[2], (int)xs->d[3], c->attr->sh,
        c->kind == TP_OP_UPSAMPLE_BILINEAR, c->attr->align_corners);
    TP_UP_LAUNCHED();
    return TP_OK;
}
