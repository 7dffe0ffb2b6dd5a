/* towerpack dataflow: image augmentors for uint8 images, HW or HWC (random
 * crop with zero padding, horizontal flip, per-channel normalisation to
 * float32, cast), chained and usable as a map.
 *
 * Normalisation of uint8 input goes through a 256-entry table per channel:
 * one load per pixel instead of a subtract and a divide. */
#include <math.h>
#include "df_internal.h"

typedef enum { AUG_CROP, AUG_FLIP, AUG_NORMALIZE, AUG_CAST, AUG_EXT } aug_kind_t;

#define AUG_MAX_CH 16

typedef struct {
    aug_kind_t kind;
    int h, w, pad;               /* crop */
    double prob;                 /* flip */
    int nch;                     /* normalize: 1 or the channel count */
    float mean[AUG_MAX_CH], std[AUG_MAX_CH];
    float *lut;                  /* normalize: [nch][256] for uint8 input */
    tp_dtype_t dtype;            /* cast */
    df_aug_fn ext;               /* ext: an augmentor of dataflow/image/ */
    void *ext_params;
    void (*ext_free)(void *params);
} aug_op_t;

struct tp_augment {
    aug_op_t *ops;  /* [count] */
    int count, cap;
};

tp_augment_t *tp_augment_new(void) {
    tp_augment_t *self = calloc(1, sizeof *self);
    if (!self)
        tp_error(TP_ERR_NOMEM, "augment");
    return self;
}

void tp_augment_destroy(tp_augment_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_augment_t *self = *self_p;
    for (int i = 0; i < self->count; i++) {
        free(self->ops[i].lut);
        if (self->ops[i].ext_free)
            self->ops[i].ext_free(self->ops[i].ext_params);
    }
    free(self->ops);
    free(self);
    *self_p = NULL;
}

static aug_op_t *s_push(tp_augment_t *self) {
    if (self->count == self->cap) {
        int cap = self->cap ? self->cap * 2 : 4;
        aug_op_t *n = realloc(self->ops, (size_t)cap * sizeof *n);
        if (!n)
            return NULL;
        self->ops = n;
        self->cap = cap;
    }
    aug_op_t *op = &self->ops[self->count++];
    memset(op, 0, sizeof *op);
    return op;
}

tp_status_t tp_augment_add_crop(tp_augment_t *self, int h, int w, int pad) {
    if (h < 1 || w < 1 || pad < 0 || h > 65536 || w > 65536 || pad > 65536)
        return tp_error(TP_ERR_INVALID, "augment crop: %dx%d with padding %d "
                        "(sizes >= 1, padding >= 0)", h, w, pad);
    aug_op_t *op = s_push(self);
    if (!op)
        return tp_error(TP_ERR_NOMEM, "augment");
    op->kind = AUG_CROP;
    op->h = h;
    op->w = w;
    op->pad = pad;
    return TP_OK;
}

tp_status_t tp_augment_add_flip(tp_augment_t *self, double prob) {
    if (!(prob >= 0 && prob <= 1))
        return tp_error(TP_ERR_INVALID, "augment flip: probability %g "
                        "(0..1)", prob);
    aug_op_t *op = s_push(self);
    if (!op)
        return tp_error(TP_ERR_NOMEM, "augment");
    op->kind = AUG_FLIP;
    op->prob = prob;
    return TP_OK;
}

tp_status_t tp_augment_add_normalize(tp_augment_t *self, int nch,
                                     const float *mean, const float *std) {
    if (nch < 1 || nch > AUG_MAX_CH)
        return tp_error(TP_ERR_INVALID, "augment normalize: %d channels "
                        "(1..%d)", nch, AUG_MAX_CH);
    for (int c = 0; c < nch; c++)
        if (!(std[c] > 0) || !isfinite(mean[c]) || !isfinite(std[c]))
            return tp_error(TP_ERR_INVALID, "augment normalize: channel %d "
                            "mean %g std %g (std must be > 0)", c, mean[c],
                            std[c]);
    float *lut = malloc((size_t)nch * 256 * sizeof *lut);
    aug_op_t *op = lut ? s_push(self) : NULL;
    if (!op) {
        free(lut);
        return tp_error(TP_ERR_NOMEM, "augment");
    }
    op->kind = AUG_NORMALIZE;
    op->nch = nch;
    op->lut = lut;
    for (int c = 0; c < nch; c++) {
        op->mean[c] = mean[c];
        op->std[c] = std[c];
        for (int v = 0; v < 256; v++)
            lut[c * 256 + v] = ((float)v - mean[c]) / std[c];
    }
    return TP_OK;
}

tp_status_t tp_augment_add_cast(tp_augment_t *self, tp_dtype_t dtype) {
    if (!tp_dtype_valid((int)dtype))
        return tp_error(TP_ERR_INVALID, "augment cast: invalid dtype %d",
                        (int)dtype);
    aug_op_t *op = s_push(self);
    if (!op)
        return tp_error(TP_ERR_NOMEM, "augment");
    op->kind = AUG_CAST;
    op->dtype = dtype;
    return TP_OK;
}

tp_status_t df_augment_add_ext(tp_augment_t *self, df_aug_fn fn, void *params,
                               void (*params_free)(void *params)) {
    aug_op_t *op = s_push(self);
    if (!op) {
        if (params_free)
            params_free(params);
        return tp_error(TP_ERR_NOMEM, "augment");
    }
    op->kind = AUG_EXT;
    op->ext = fn;
    op->ext_params = params;
    op->ext_free = params_free;
    return TP_OK;
}

/* Image geometry of t: rows, cols, channels; TP_ERR_SHAPE when t is not an
 * HW or HWC image. */
static tp_status_t s_geom(const tp_tensor_t *t, const char *who, int *h,
                          int *w, int *c) {
    if (t->ndim != 2 && t->ndim != 3) {
        char d[96];
        return tp_error(TP_ERR_SHAPE, "augment %s: image is %s, expected HW "
                        "or HWC", who, tp_tensor_describe(t, d, sizeof d));
    }
    if (t->shape[0] > INT32_MAX || t->shape[1] > INT32_MAX ||
        (t->ndim == 3 && t->shape[2] > INT32_MAX))
        return tp_error(TP_ERR_SHAPE, "augment %s: image too large", who);
    *h = (int)t->shape[0];
    *w = (int)t->shape[1];
    *c = t->ndim == 3 ? (int)t->shape[2] : 1;
    return TP_OK;
}

/* Points (x, y) pairs, pixel-edge coordinates (the image spans [0, W] x
 * [0, H], as tensorpack's coordinate transforms): moved along with the
 * image by the geometric augmentors; NULL when there are none. */
typedef struct {
    float *xy;
    size_t n;
} aug_pts_t;

/* A crop's geometry: t's height, width and channels, and the crop's
 * corner (oy, ox) in t drawn from rng (negative: in the padding). The
 * plain crop and the fused chain (s_fused) both draw here, so that they
 * draw the same numbers. */
static tp_status_t s_crop_draw(const aug_op_t *op, const tp_tensor_t *t, tp_rng_t *rng,
                               int *H, int *W, int *C, int *oy, int *ox) {
    TP_TRY(s_geom(t, "crop", H, W, C));
    int ph = *H + 2 * op->pad, pw = *W + 2 * op->pad;
    if (ph < op->h || pw < op->w)
        return tp_error(TP_ERR_SHAPE, "augment crop: %dx%d from a %dx%d image "
                        "padded by %d", op->h, op->w, *H, *W, op->pad);
    *oy = (int)tp_rng_below(rng, (uint64_t)(ph - op->h) + 1) - op->pad;
    *ox = (int)tp_rng_below(rng, (uint64_t)(pw - op->w) + 1) - op->pad;
    return TP_OK;
}

static tp_status_t s_crop(const aug_op_t *op, tp_tensor_t *t, tp_rng_t *rng,
                          aug_pts_t *pts) {
    int H = 0, W = 0, C = 1, oy, ox;
    TP_TRY(s_crop_draw(op, t, rng, &H, &W, &C, &oy, &ox));
    for (size_t i = 0; pts && i < pts->n; i++) {
        pts->xy[2 * i] -= (float)ox;
        pts->xy[2 * i + 1] -= (float)oy;
    }
    if (oy == 0 && ox == 0 && op->h == H && op->w == W)
        return TP_OK;  /* the identity crop */
    size_t es = tp_dtype_size(t->dtype) * (size_t)C;  /* bytes per pixel */
    int64_t shape[3] = {op->h, op->w, C};
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, t->dtype, t->ndim, shape));
    const uint8_t *src = t->data;
    uint8_t *dst = o.data;
    /* Columns x of the output that read inside the source: [x0, x1). */
    int x0 = ox < 0 ? -ox : 0;
    int x1 = W - ox < op->w ? W - ox : op->w;
    if (x1 < x0)
        x1 = x0;
    size_t row = (size_t)op->w * es;
    for (int y = 0; y < op->h; y++) {
        uint8_t *d = dst + (size_t)y * row;
        int sy = y + oy;
        if (sy < 0 || sy >= H) {
            memset(d, 0, row);
            continue;
        }
        if (x0 > 0)
            memset(d, 0, (size_t)x0 * es);
        if (x1 > x0)
            memcpy(d + (size_t)x0 * es,
                   src + ((size_t)sy * W + (size_t)(x0 + ox)) * es,
                   (size_t)(x1 - x0) * es);
        if (x1 < op->w)
            memset(d + (size_t)x1 * es, 0, (size_t)(op->w - x1) * es);
    }
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

static tp_status_t s_flip(const aug_op_t *op, tp_tensor_t *t, tp_rng_t *rng,
                          aug_pts_t *pts) {
    int H = 0, W = 0, C = 1;
    TP_TRY(s_geom(t, "flip", &H, &W, &C));
    if (!(tp_rng_double(rng) < op->prob))
        return TP_OK;
    for (size_t i = 0; pts && i < pts->n; i++)
        pts->xy[2 * i] = (float)W - pts->xy[2 * i];
    TP_TRY(tp_df_tensor_make_writable(t));  /* flips in place */
    size_t es = tp_dtype_size(t->dtype) * (size_t)C;
    uint8_t *p = t->data;
    if (es == 1) {
        for (int y = 0; y < H; y++) {
            uint8_t *r = p + (size_t)y * W;
            for (int a = 0, b = W - 1; a < b; a++, b--) {
                uint8_t tmp = r[a];
                r[a] = r[b];
                r[b] = tmp;
            }
        }
        return TP_OK;
    }
    if (es == 3) {
        /* RGB bytes, the usual colour image: three byte swaps (memcpy of
         * a run-time size of 3 was a libc call a pixel, 9% of the ImageNet
         * pipeline's CPU) */
        for (int y = 0; y < H; y++) {
            uint8_t *r = p + (size_t)y * W * 3;
            for (int a = 0, b = W - 1; a < b; a++, b--)
                for (int c = 0; c < 3; c++) {
                    uint8_t tmp = r[a * 3 + c];
                    r[a * 3 + c] = r[b * 3 + c];
                    r[b * 3 + c] = tmp;
                }
        }
        return TP_OK;
    }
    uint8_t tmp[AUG_MAX_CH * 8];
    if (es > sizeof tmp)
        return tp_error(TP_ERR_SHAPE, "augment flip: %zu bytes per pixel", es);
    for (int y = 0; y < H; y++) {
        uint8_t *r = p + (size_t)y * W * es;
        for (int a = 0, b = W - 1; a < b; a++, b--) {
            memcpy(tmp, r + a * es, es);
            memcpy(r + a * es, r + b * es, es);
            memcpy(r + b * es, tmp, es);
        }
    }
    return TP_OK;
}

static tp_status_t s_normalize(const aug_op_t *op, tp_tensor_t *t) {
    int H = 0, W = 0, C = 1;
    TP_TRY(s_geom(t, "normalize", &H, &W, &C));
    if (op->nch != 1 && op->nch != C)
        return tp_error(TP_ERR_SHAPE, "augment normalize: %d channel "
                        "statistics for an image of %d channels", op->nch, C);
    if (t->dtype != TP_UINT8 && t->dtype != TP_FLOAT32) {
        return tp_error(TP_ERR_SHAPE, "augment normalize: %s image (uint8 or "
                        "float32)", tp_dtype_name(t->dtype));
    }
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, TP_FLOAT32, t->ndim, t->shape));
    size_t npix = (size_t)H * W;
    float *d = o.data;
    if (t->dtype == TP_UINT8) {
        const uint8_t *s = t->data;
        if (op->nch == 1) {
            const float *lut = op->lut;
            size_t n = npix * (size_t)C;
            for (size_t i = 0; i < n; i++)
                d[i] = lut[s[i]];
        } else {
            for (size_t i = 0; i < npix; i++)
                for (int c = 0; c < C; c++)
                    d[i * C + c] = op->lut[c * 256 + s[i * C + c]];
        }
    } else {
        const float *s = t->data;
        for (size_t i = 0; i < npix; i++)
            for (int c = 0; c < C; c++) {
                int k = op->nch == 1 ? 0 : c;
                d[i * C + c] = (s[i * C + c] - op->mean[k]) / op->std[k];
            }
    }
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

static double s_get(const void *p, tp_dtype_t dt, size_t i) {
    switch (dt) {
    case TP_UINT8: return ((const uint8_t *)p)[i];
    case TP_INT32: return ((const int32_t *)p)[i];
    case TP_INT64: return (double)((const int64_t *)p)[i];
    case TP_FLOAT16: return tp_f16_to_f32(((const uint16_t *)p)[i]);
    case TP_BFLOAT16: return tp_bf16_to_f32(((const uint16_t *)p)[i]);
    case TP_FLOAT32: return ((const float *)p)[i];
    default: return ((const double *)p)[i];
    }
}

static void s_put(void *p, tp_dtype_t dt, size_t i, double v) {
    switch (dt) {
    case TP_UINT8:
        ((uint8_t *)p)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : lrint(v));
        break;
    case TP_INT32:
        ((int32_t *)p)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN
                                      : v > INT32_MAX ? INT32_MAX
                                                      : lrint(v));
        break;
    case TP_INT64: ((int64_t *)p)[i] = (int64_t)llrint(v); break;
    case TP_FLOAT16: ((uint16_t *)p)[i] = tp_f32_to_f16((float)v); break;
    case TP_BFLOAT16: ((uint16_t *)p)[i] = tp_f32_to_bf16((float)v); break;
    case TP_FLOAT32: ((float *)p)[i] = (float)v; break;
    default: ((double *)p)[i] = v; break;
    }
}

static tp_status_t s_cast(const aug_op_t *op, tp_tensor_t *t) {
    if (t->dtype == op->dtype)
        return TP_OK;
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, op->dtype, t->ndim, t->shape));
    size_t n = tp_tensor_numel(t);
    if (t->dtype == TP_UINT8 && op->dtype == TP_FLOAT32) {
        const uint8_t *s = t->data;
        float *d = o.data;
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    } else {
        for (size_t i = 0; i < n; i++)
            s_put(o.data, op->dtype, i, s_get(t->data, t->dtype, i));
    }
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

/* One output row of the fused grey path. restrict: the output never
 * aliases the table or the source, which lets the loops stay in registers. */
static void s_grey_row(float *restrict drow, int sy, int H, int W, int ox,
                       int w, int c0, int c1, int flipped,
                       const uint8_t *restrict src,
                       const float *restrict lut) {
    const float zero = lut[0];
    if (sy < 0 || sy >= H) {
        for (int x = 0; x < w; x++)
            drow[x] = zero;
        return;
    }
    const uint8_t *restrict s = src + (size_t)sy * W + ox; /* s[cx] */
    if (!flipped) {
        for (int cx = 0; cx < c0; cx++)
            drow[cx] = zero;
        for (int cx = c0; cx < c1; cx++)
            drow[cx] = lut[s[cx]];
        for (int cx = c1; cx < w; cx++)
            drow[cx] = zero;
    } else {
        for (int x = 0; x < w - c1; x++)          /* cx from w-1 down to c1 */
            drow[x] = zero;
        for (int x = w - c1; x < w - c0; x++)     /* cx = w-1-x in [c0, c1) */
            drow[x] = lut[s[w - 1 - x]];
        for (int x = w - c0; x < w; x++)
            drow[x] = zero;
    }
}

/* crop (+ flip) + normalize of a uint8 image in one pass, straight into
 * the float32 result: the usual training chain, with one allocation instead
 * of three. Draws the same random numbers as the separate steps, so the
 * result is identical. */
static tp_status_t s_fused(const aug_op_t *crop, const aug_op_t *flip,
                          const aug_op_t *norm, tp_tensor_t *t,
                          tp_rng_t *rng) {
    int H = 0, W = 0, C = 1, oy, ox;
    TP_TRY(s_crop_draw(crop, t, rng, &H, &W, &C, &oy, &ox));
    if (norm->nch != 1 && norm->nch != C)
        return tp_error(TP_ERR_SHAPE, "augment normalize: %d channel "
                        "statistics for an image of %d channels", norm->nch,
                        C);
    int flipped = flip && tp_rng_double(rng) < flip->prob;
    int h = crop->h, w = crop->w;
    int64_t shape[3] = {h, w, C};
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, TP_FLOAT32, t->ndim, shape));
    const uint8_t *src = t->data;
    float *dst = o.data;
    /* Output column x reads crop column cx = flipped ? w-1-x : x, i.e.
     * source column cx + ox; the source columns that exist give the range
     * of cx in [c0, c1), everything else is padding (value 0). */
    int c0 = ox < 0 ? -ox : 0;
    int c1 = W - ox < w ? W - ox : w;
    if (c1 < c0)
        c1 = c0;
    if (C == 1) {
        /* grey images: three straight runs per row (padding, pixels,
         * padding), written backwards when flipped */
        for (int y = 0; y < h; y++)
            s_grey_row(dst + (size_t)y * w, y + oy, H, W, ox, w, c0, c1,
                       flipped, src, norm->lut);
        tp_tensor_fini(t);
        tp_tensor_move(t, &o);
        return TP_OK;
    }
    for (int y = 0; y < h; y++) {
        int sy = y + oy;
        float *drow = dst + (size_t)y * w * C;
        const uint8_t *srow = src + (size_t)(sy < 0 ? 0 : sy) * W * C;
        int row_in = sy >= 0 && sy < H;
        for (int c = 0; c < C; c++) {
            const float *l = norm->lut + (norm->nch == 1 ? 0 : c * 256);
            const float zero = l[0];
            if (!row_in) {
                for (int x = 0; x < w; x++)
                    drow[(size_t)x * C + c] = zero;
                continue;
            }
            for (int cx = 0; cx < w; cx++) {
                int x = flipped ? w - 1 - cx : cx;
                drow[(size_t)x * C + c] =
                    cx >= c0 && cx < c1
                        ? l[srow[(size_t)(cx + ox) * C + c]]
                        : zero;
            }
        }
    }
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

/* The chain step by step (no fusion), moving the points along. */
static tp_status_t s_apply_steps(const tp_augment_t *self, tp_tensor_t *t,
                                 aug_pts_t *pts, tp_rng_t *rng) {
    for (int i = 0; i < self->count; i++) {
        const aug_op_t *op = &self->ops[i];
        tp_status_t rc;
        switch (op->kind) {
        case AUG_CROP: rc = s_crop(op, t, rng, pts); break;
        case AUG_FLIP: rc = s_flip(op, t, rng, pts); break;
        case AUG_NORMALIZE: rc = s_normalize(op, t); break;
        case AUG_EXT:
            rc = op->ext(op->ext_params, t, pts ? pts->xy : NULL,
                         pts ? pts->n : 0, rng);
            break;
        default: rc = s_cast(op, t); break;
        }
        if (rc != TP_OK)
            return rc;
    }
    return TP_OK;
}

tp_status_t tp_augment_apply(const tp_augment_t *self, tp_tensor_t *t,
                             tp_rng_t *rng) {
    const aug_op_t *o = self->ops;
    if (t->dtype == TP_UINT8 && self->count >= 2 && o[0].kind == AUG_CROP) {
        int k = 1;
        const aug_op_t *flip = o[1].kind == AUG_FLIP ? &o[k++] : NULL;
        if (k < self->count && o[k].kind == AUG_NORMALIZE) {
            TP_TRY(s_fused(&o[0], flip, &o[k], t, rng));
            for (int i = k + 1; i < self->count; i++) {
                tp_status_t rc = o[i].kind == AUG_EXT
                                     ? o[i].ext(o[i].ext_params, t, NULL, 0, rng)
                                 : o[i].kind == AUG_CAST ? s_cast(&o[i], t)
                                 : o[i].kind == AUG_NORMALIZE
                                     ? s_normalize(&o[i], t)
                                 : o[i].kind == AUG_FLIP ? s_flip(&o[i], t, rng, NULL)
                                                         : s_crop(&o[i], t, rng, NULL);
                if (rc != TP_OK)
                    return rc;
            }
            return TP_OK;
        }
    }
    return s_apply_steps(self, t, NULL, rng);
}

tp_status_t df_augment_apply_pts(const tp_augment_t *self, tp_tensor_t *t,
                                 float *xy, size_t n, tp_rng_t *rng) {
    aug_pts_t pts = {xy, n};
    return s_apply_steps(self, t, xy ? &pts : NULL, rng);
}

tp_status_t tp_augment_apply_coords(const tp_augment_t *self, tp_tensor_t *t,
                                    tp_tensor_t *coords, tp_rng_t *rng) {
    if (coords->dtype != TP_FLOAT32 || coords->ndim != 2 ||
        coords->shape[1] != 2) {
        char d[96];
        return tp_error(TP_ERR_SHAPE, "augment: coordinates are %s, expected "
                        "float32 [N,2] (x, y)",
                        tp_tensor_describe(coords, d, sizeof d));
    }
    TP_TRY(tp_df_tensor_make_writable(coords));
    aug_pts_t pts = {coords->data, (size_t)coords->shape[0]};
    return s_apply_steps(self, t, &pts, rng);
}

tp_status_t tp_augment_map_component(tp_tensor_t *t, tp_rng_t *rng,
                                     void *user) {
    return tp_augment_apply(user, t, rng);
}

static void s_aug_free(void *user) {
    tp_augment_t *a = user;
    tp_augment_destroy(&a);
}

tp_dataflow_t *tp_df_augment(tp_dataflow_t *inner, tp_augment_t *aug,
                             int component) {
    if (!aug) {
        tp_dataflow_destroy(&inner);
        tp_error(TP_ERR_INVALID, "augment: NULL augmentor chain");
        return NULL;
    }
    return tp_df_map_component(inner, tp_augment_map_component, aug,
                               s_aug_free, component);
}
