/* towerpack gpu: training batches made where the data lives (pad, crop,
 * mirror, normalise a resident data set's images), on any backend.
 *
 * The picks are checked here, once, for every backend. A backend with an
 * augment_batch entry (CUDA: one kernel) does the work on its stream; for
 * one without (the CPU backend, whose memory is host memory) the loop
 * below does, and it is also the reference the GPU is tested against. */
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

static tp_status_t s_check(const tp_augment_shape_t *sh, int64_t nsrc,
                           const tp_augment_pick_t *picks, int n) {
    if (sh->h < 1 || sh->w < 1 || sh->c < 1 || sh->c > 4 || sh->pad < 0 ||
        sh->crop_h < 1 || sh->crop_w < 1 || sh->crop_h > sh->h + 2 * sh->pad ||
        sh->crop_w > sh->w + 2 * sh->pad)
        return tp_error(TP_ERR_INVALID,
                        "augment_batch: images %dx%dx%d, pad %d, crop %dx%d "
                        "(need 1..4 channels and a crop inside the padded image)",
                        sh->h, sh->w, sh->c, sh->pad, sh->crop_h, sh->crop_w);
    int ymax = sh->h + 2 * sh->pad - sh->crop_h, xmax = sh->w + 2 * sh->pad - sh->crop_w;
    for (int i = 0; i < n; i++) {
        const tp_augment_pick_t *p = &picks[i];
        if (p->index < 0 || p->index >= nsrc || p->y < 0 || p->y > ymax ||
            p->x < 0 || p->x > xmax || (p->flip != 0 && p->flip != 1))
            return tp_error(TP_ERR_INVALID,
                            "augment_batch: pick %d {image %d, y %d, x %d, flip "
                            "%d} outside images 0..%lld, y 0..%d, x 0..%d, flip 0/1",
                            i, p->index, p->y, p->x, p->flip, (long long)nsrc - 1,
                            ymax, xmax);
    }
    return TP_OK;
}

/* The host loop: row by row, the padding rows and columns written as the
 * normalised zero, the inside copied (mirrored: read right to left). */
static void s_host(float *dst, int32_t *labels_dst, const uint8_t *images,
                   const int32_t *labels, const tp_augment_pick_t *picks, int n,
                   const tp_augment_shape_t *sh) {
    const int h = sh->h, w = sh->w, c = sh->c, ch = sh->crop_h, cw = sh->crop_w;
    const size_t src_size = (size_t)h * w * c, row = (size_t)cw * c;
    float zero[4];
    for (int k = 0; k < c; k++)
        zero[k] = (0.0f - sh->mean[k]) * sh->inv_std[k];
    for (int i = 0; i < n; i++) {
        const tp_augment_pick_t *p = &picks[i];
        const uint8_t *src = images + (size_t)p->index * src_size;
        float *out = dst + (size_t)i * ch * row;
        for (int y = 0; y < ch; y++) {
            int sy = p->y + y - sh->pad;
            float *o = out + (size_t)y * row;
            for (int x = 0; x < cw; x++) {
                int sx = p->x + (p->flip ? cw - 1 - x : x) - sh->pad;
                int inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
                const uint8_t *v = inside ? src + ((size_t)sy * w + sx) * c : NULL;
                for (int k = 0; k < c; k++)
                    o[x * c + k] = inside ? ((float)v[k] - sh->mean[k]) * sh->inv_std[k]
                                          : zero[k];
            }
        }
        if (labels && labels_dst)
            labels_dst[i] = labels[p->index];
    }
}

tp_status_t tp_backend_augment_batch(tp_backend_t *b, tp_stream_t *s, float *dst,
                                     int32_t *labels_dst, const uint8_t *images,
                                     const int32_t *labels, int64_t nsrc,
                                     const tp_augment_pick_t *picks, int n,
                                     const tp_augment_shape_t *shape) {
    if (!b || !dst || !images || !picks || !shape || n < 0)
        return tp_error(TP_ERR_INVALID, "augment_batch: a NULL argument or n < 0");
    TP_TRY(s_check(shape, nsrc, picks, n));
    if (n == 0)
        return TP_OK;
    if (b->ops->augment_batch)
        return b->ops->augment_batch(b, s, dst, labels_dst, images, labels, picks,
                                     n, shape);
    if (tp_backend_device(b) >= 0)
        return tp_error(TP_ERR_UNSUPPORTED, "augment_batch: the %s backend "
                        "cannot make batches in its memory", b->ops->name);
    s_host(dst, labels_dst, images, labels, picks, n, shape);
    return TP_OK;
}
