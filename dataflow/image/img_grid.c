/* towerpack dataflow/image: a batch of images as one grid image, for the
 * pictures people look at while a model trains (a generator's samples,
 * an autoencoder's reconstructions beside their inputs). */
#include <math.h>
#include <string.h>
#include <towerpack/image.h>

static uint8_t s_byte(float v, float lo, float scale) {
    float x = (v - lo) * scale;
    if (!(x > 0))  /* below the range, or NaN */
        return 0;
    return x >= 255.f ? 255 : (uint8_t)lrintf(x);
}

tp_status_t tp_image_grid(const tp_tensor_t *batch, float lo, float hi, int columns,
                          int pad, tp_tensor_t *grid) {
    tp_tensor_init_empty(grid);
    if (!batch || batch->dtype != TP_FLOAT32 || (batch->ndim != 3 && batch->ndim != 4))
        return tp_error(TP_ERR_INVALID, "image grid: the batch is float32 [N, C, H, W] or "
                        "[N, H, W] (got %s of rank %d)",
                        batch ? tp_dtype_name(batch->dtype) : "nothing", batch ? batch->ndim : 0);
    int64_t n = batch->shape[0], c = batch->ndim == 4 ? batch->shape[1] : 1;
    int64_t h = batch->shape[batch->ndim - 2], w = batch->shape[batch->ndim - 1];
    if (n < 1 || h < 1 || w < 1 || (c != 1 && c != 3))
        return tp_error(TP_ERR_INVALID, "image grid: %lld images of %lld channels, %lldx%lld: "
                        "needs at least one image of 1 or 3 channels", (long long)n,
                        (long long)c, (long long)h, (long long)w);
    if (!(hi > lo) || pad < 0)
        return tp_error(TP_ERR_INVALID, "image grid: value range [%g, %g], padding %d",
                        (double)lo, (double)hi, pad);
    int64_t cols = columns > 0 ? columns : (int64_t)ceil(sqrt((double)n));
    if (cols > n)
        cols = n;
    int64_t rows = (n + cols - 1) / cols;
    int64_t shape[3] = {rows * (h + pad) + pad, cols * (w + pad) + pad, c};
    TP_TRY(tp_tensor_init_zero(grid, TP_UINT8, 3, shape));
    const float *src = batch->data;
    uint8_t *dst = grid->data;
    float scale = 255.f / (hi - lo);
    for (int64_t i = 0; i < n; i++) {
        int64_t y0 = pad + (i / cols) * (h + pad), x0 = pad + (i % cols) * (w + pad);
        for (int64_t ch = 0; ch < c; ch++) {
            const float *plane = src + (i * c + ch) * h * w;
            for (int64_t y = 0; y < h; y++) {
                uint8_t *row = dst + ((y0 + y) * shape[1] + x0) * c + ch;
                for (int64_t x = 0; x < w; x++)
                    row[x * c] = s_byte(plane[y * w + x], lo, scale);
            }
        }
    }
    return TP_OK;
}
