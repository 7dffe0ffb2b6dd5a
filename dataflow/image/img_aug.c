/* towerpack dataflow/image: tensorpack's image augmentors (imgaug) on uint8
 * images, [H,W] or [H,W,C], added to a tp_augment_t chain.
 *
 * Semantics and random draws follow tensorpack's classes (named beside
 * each function), with three differences a user may meet: the result stays
 * uint8 (each step rounds to nearest and clips to 0..255, where tensorpack
 * keeps float32 after the first colour step), resizing is bilinear with
 * OpenCV's pixel centres and 11-bit weights (results within 1 of
 * cv2.resize INTER_LINEAR), and random numbers come from the chain's rng.
 *
 * Written by hand, not through a library: each of these is one pass over a
 * 224x224 picture, next to a JPEG decode (libjpeg-turbo) that costs ten
 * times more; the colour steps go through a 256-entry table built per
 * image. docs/dataflow.md has the measurement. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/image.h>
#include "dataflow/df_internal.h"

typedef enum {
    IA_RESIZE, IA_RESIZE_SHORT, IA_RANDOM_RESIZE_SHORT, IA_CENTER_CROP,
    IA_RRC, IA_VFLIP, IA_BRIGHTNESS, IA_CONTRAST, IA_SATURATION,
    IA_LIGHTING, IA_GREY, IA_NOISE, IA_BRIGHTNESS_SCALE, IA_CLIP, IA_MINMAX,
    IA_SALT_PEPPER, IA_JPEG, IA_ROTATE, IA_BLUR, IA_MEANVAR,
    IA_AFFINE, IA_HUE, IA_MOTION_BLUR
} ia_kind_t;

typedef struct {
    ia_kind_t kind;
    int h, w, lo, hi;            /* sizes */
    tp_interp_t interp;
    double a, b, c, d;           /* the kind's numbers (see the adders) */
    float eigval[3], eigvec[9];  /* lighting */
    double scale[2], frac[2], shear; /* affine (rotation max in c) */
    int has_scale, has_frac;
} ia_t;

static tp_status_t s_geom(const tp_tensor_t *t, const char *who, int *H,
                          int *W, int *C) {
    if (t->dtype != TP_UINT8 || (t->ndim != 2 && t->ndim != 3) ||
        t->shape[0] < 1 || t->shape[1] < 1 || t->shape[0] > INT32_MAX / 8 ||
        t->shape[1] > INT32_MAX / 8 || (t->ndim == 3 && (t->shape[2] < 1 ||
                                                        t->shape[2] > 16))) {
        char d[96];
        return tp_error(TP_ERR_SHAPE, "imgaug %s: image is %s, expected uint8 "
                        "HW or HWC", who, tp_tensor_describe(t, d, sizeof d));
    }
    *H = (int)t->shape[0];
    *W = (int)t->shape[1];
    *C = t->ndim == 3 ? (int)t->shape[2] : 1;
    return TP_OK;
}

static inline uint8_t s_u8(double v) {
    return (uint8_t)(v <= 0 ? 0 : v >= 255 ? 255 : (int)(v + 0.5));
}

/* ---- resize of a rectangle ----------------------------------------------------- */

/* Source row r (the rectangle's, from its column 0) interpolated along x
 * into one of hrow[2] (ow * C sums, weights in 1/2048), unless one holds
 * row `row` already: the slot that does not hold the other row the caller
 * blends (rows come in increasing order) is overwritten. */
static const int *s_hrow(const uint8_t *restrict r, int C, int ow, int cw,
                         const int *xo, const short *xa, int *hrow[2], int held[2],
                         int row) {
    for (int k = 0; k < 2; k++)
        if (held[k] == row)
            return hrow[k];
    int k = held[0] < held[1] ? 0 : 1;  /* the older (lower) row */
    held[k] = row;
    int *restrict h = hrow[k];
    if (C == 3) {  /* the usual case, unrolled over the channels */
        for (int x = 0; x < ow; x++) {
            int a0 = xa[x], a1 = 2048 - a0;
            int o0 = xo[x] * 3, o1 = xo[x] + 1 < cw ? o0 + 3 : o0;
            h[x * 3] = r[o0] * a0 + r[o1] * a1;
            h[x * 3 + 1] = r[o0 + 1] * a0 + r[o1 + 1] * a1;
            h[x * 3 + 2] = r[o0 + 2] * a0 + r[o1 + 2] * a1;
        }
        return h;
    }
    for (int x = 0; x < ow; x++) {
        int a0 = xa[x], a1 = 2048 - a0;
        const uint8_t *p = r + (size_t)xo[x] * C;
        int nx = xo[x] + 1 < cw ? C : 0;
        for (int c = 0; c < C; c++)
            h[x * C + c] = p[c] * a0 + p[c + nx] * a1;
    }
    return h;
}

/* The rectangle (y0, x0, ch, cw) of *t resized to oh x ow into a new image
 * that replaces *t. Bilinear: OpenCV's INTER_LINEAR (source coordinate
 * (d + 0.5) * scale - 0.5, clamped at the borders, weights in 1/2048). */
static tp_status_t s_resize_rect(tp_tensor_t *t, int y0, int x0, int ch,
                                 int cw, int oh, int ow, tp_interp_t interp,
                                 float *xy, size_t npts) {
    int H = (int)t->shape[0], W = (int)t->shape[1];
    for (size_t i = 0; i < npts; i++) {  /* the rectangle onto [0,ow]x[0,oh] */
        xy[2 * i] = (float)((xy[2 * i] - x0) * ((double)ow / cw));
        xy[2 * i + 1] = (float)((xy[2 * i + 1] - y0) * ((double)oh / ch));
    }
    int C = t->ndim == 3 ? (int)t->shape[2] : 1;
    TP_ASSERT(y0 >= 0 && x0 >= 0 && ch >= 1 && cw >= 1 && y0 + ch <= H &&
              x0 + cw <= W);
    if (oh == ch && ow == cw && y0 == 0 && x0 == 0 && ch == H && cw == W)
        return TP_OK;
    int64_t shape[3] = {oh, ow, C};
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, TP_UINT8, t->ndim, shape));
    const uint8_t *src = t->data;
    uint8_t *dst = o.data;
    size_t srow = (size_t)W * C;
    /* xo[ow], xa[ow] (shorts in the space of ints), then two horizontally
     * interpolated source rows hrow[2][ow * C] (bilinear only) */
    size_t nrow = (size_t)ow * C;
    int *xo = malloc(sizeof(int) * ((size_t)ow * 2 + 2 * nrow));
    if (!xo) {
        tp_tensor_fini(&o);
        return tp_error(TP_ERR_NOMEM, "imgaug resize");
    }
    short *xa = (short *)(xo + ow);  /* [ow] weight of the left pixel */
    double sx = (double)cw / ow, sy = (double)ch / oh;
    if (interp == TP_INTERP_NEAREST) {
        for (int x = 0; x < ow; x++) {
            int s = (int)floor(x * sx);
            xo[x] = (x0 + (s < cw - 1 ? s : cw - 1)) * C;
        }
        for (int y = 0; y < oh; y++) {
            int s = (int)floor(y * sy);
            const uint8_t *r = src + (size_t)(y0 + (s < ch - 1 ? s : ch - 1)) * srow;
            uint8_t *d = dst + (size_t)y * ow * C;
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < C; c++)
                    d[x * C + c] = r[xo[x] + c];
        }
    } else {
        for (int x = 0; x < ow; x++) {
            double f = (x + 0.5) * sx - 0.5;
            int s = (int)floor(f);
            f -= s;
            if (s < 0) {
                s = 0;
                f = 0;
            }
            if (s >= cw - 1) {
                s = cw - 1;
                f = 0;
            }
            xo[x] = s;
            xa[x] = (short)lrint((1 - f) * 2048);
        }
        int *hrow[2] = {xo + 2 * (size_t)ow, xo + 2 * (size_t)ow + nrow};
        int held[2] = {-1, -1};  /* the source row each of hrow holds */
        for (int y = 0; y < oh; y++) {
            double f = (y + 0.5) * sy - 0.5;
            int s = (int)floor(f);
            f -= s;
            if (s < 0) {
                s = 0;
                f = 0;
            }
            if (s >= ch - 1) {
                s = ch - 1;
                f = 0;
            }
            int b0 = (int)lrint((1 - f) * 2048), b1 = 2048 - b0;
            /* separable, as OpenCV's resize: each source row is
             * interpolated along x once and kept while the output rows
             * that blend it are made (an upscaled crop blends each source
             * row into about 2 oh / ch output rows); the same integer
             * sums as blending both directions per pixel, so the same
             * bytes */
            int sr0 = s, sr1 = s + 1 < ch ? s + 1 : s;
            const int *h0 = s_hrow(src + (size_t)(y0 + sr0) * srow + (size_t)x0 * C, C,
                                   ow, cw, xo, xa, hrow, held, sr0);
            const int *h1 = sr1 == sr0 ? h0
                          : s_hrow(src + (size_t)(y0 + sr1) * srow + (size_t)x0 * C, C,
                                   ow, cw, xo, xa, hrow, held, sr1);
            uint8_t *restrict d = dst + (size_t)y * nrow;
            for (size_t i = 0; i < nrow; i++)
                d[i] = (uint8_t)((h0[i] * b0 + h1[i] * b1 + (1 << 21)) >> 22);
        }
    }
    free(xo);
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

/* tensorpack's ResizeShortestEdge sizes for short side `size`. */
static void s_short_size(int H, int W, int size, int *oh, int *ow) {
    double scale = (double)size / (H < W ? H : W);
    if (H < W) {
        *oh = size;
        *ow = (int)(scale * W + 0.5);
    } else {
        *oh = (int)(scale * H + 0.5);
        *ow = size;
    }
    if (*oh < 1)
        *oh = 1;
    if (*ow < 1)
        *ow = 1;
}

/* ---- warps and filters ---------------------------------------------------------------- */

/* dst(x, y) = src(M^-1 (x, y)) for the 2x3 matrix m (OpenCV's warpAffine:
 * m maps source pixel centres to destination ones), bilinear, the border
 * replicated. The image keeps its size. */
static tp_status_t s_warp(tp_tensor_t *t, const double *m) {
    int H = (int)t->shape[0], W = (int)t->shape[1];
    int C = t->ndim == 3 ? (int)t->shape[2] : 1;
    double det = m[0] * m[4] - m[1] * m[3];
    if (fabs(det) < 1e-12)
        return tp_error(TP_ERR_INVALID, "imgaug warp: singular matrix");
    /* the inverse map */
    double i0 = m[4] / det, i1 = -m[1] / det, i3 = -m[3] / det, i4 = m[0] / det;
    double i2 = -(i0 * m[2] + i1 * m[5]), i5 = -(i3 * m[2] + i4 * m[5]);
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, TP_UINT8, t->ndim, t->shape));
    const uint8_t *src = t->data;
    uint8_t *dst = o.data;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            double sx = i0 * x + i1 * y + i2, sy = i3 * x + i4 * y + i5;
            double fx = floor(sx), fy = floor(sy);
            double ax = sx - fx, ay = sy - fy;
            int x0 = (int)(fx < -1 ? -1 : fx > W ? W : fx);
            int y0 = (int)(fy < -1 ? -1 : fy > H ? H : fy);
            int xs[2] = {x0 < 0 ? 0 : x0 >= W ? W - 1 : x0,
                         x0 + 1 < 0 ? 0 : x0 + 1 >= W ? W - 1 : x0 + 1};
            int ys[2] = {y0 < 0 ? 0 : y0 >= H ? H - 1 : y0,
                         y0 + 1 < 0 ? 0 : y0 + 1 >= H ? H - 1 : y0 + 1};
            for (int c = 0; c < C; c++) {
                double v00 = src[((size_t)ys[0] * W + xs[0]) * C + c];
                double v01 = src[((size_t)ys[0] * W + xs[1]) * C + c];
                double v10 = src[((size_t)ys[1] * W + xs[0]) * C + c];
                double v11 = src[((size_t)ys[1] * W + xs[1]) * C + c];
                double v = (v00 * (1 - ax) + v01 * ax) * (1 - ay) +
                           (v10 * (1 - ax) + v11 * ax) * ay;
                dst[((size_t)y * W + x) * C + c] = s_u8(v);
            }
        }
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

/* OpenCV's getGaussianKernel: its fixed small kernels for sigma <= 0 and
 * sizes up to 7, else sampled and normalised. k odd, <= 31. */
static void s_gauss_kernel(int k, double sigma, double *w) {
    static const double small[4][7] = {
        {1}, {0.25, 0.5, 0.25}, {0.0625, 0.25, 0.375, 0.25, 0.0625},
        {0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125}};
    if (sigma <= 0 && k <= 7) {
        memcpy(w, small[k / 2], sizeof(double) * (size_t)k);
        return;
    }
    if (sigma <= 0)
        sigma = 0.3 * ((k - 1) * 0.5 - 1) + 0.8;
    double sum = 0;
    for (int i = 0; i < k; i++) {
        double d = i - (k - 1) * 0.5;
        w[i] = exp(-d * d / (2 * sigma * sigma));
        sum += w[i];
    }
    for (int i = 0; i < k; i++)
        w[i] /= sum;
}

/* Separable blur with kernels kx (rows) and ky (columns), border
 * replicated (cv2.GaussianBlur(..., borderType=BORDER_REPLICATE)). */
static tp_status_t s_blur(tp_tensor_t *t, int kx, const double *wx, int ky,
                          const double *wy) {
    int H = (int)t->shape[0], W = (int)t->shape[1];
    int C = t->ndim == 3 ? (int)t->shape[2] : 1;
    size_t n = (size_t)H * W * C;
    float *tmp = malloc(n * sizeof *tmp);
    if (!tmp)
        return tp_error(TP_ERR_NOMEM, "imgaug gaussian-blur");
    TP_TRY(tp_df_tensor_make_writable(t));
    uint8_t *p = t->data;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < C; c++) {
                double v = 0;
                for (int i = 0; i < kx; i++) {
                    int sx = x + i - kx / 2;
                    sx = sx < 0 ? 0 : sx >= W ? W - 1 : sx;
                    v += wx[i] * p[((size_t)y * W + sx) * C + c];
                }
                tmp[((size_t)y * W + x) * C + c] = (float)v;
            }
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < C; c++) {
                double v = 0;
                for (int i = 0; i < ky; i++) {
                    int sy = y + i - ky / 2;
                    sy = sy < 0 ? 0 : sy >= H ? H - 1 : sy;
                    v += wy[i] * tmp[((size_t)sy * W + x) * C + c];
                }
                p[((size_t)y * W + x) * C + c] = s_u8(v);
            }
    free(tmp);
    return TP_OK;
}

/* The motion-blur kernel, k x k (k odd, <= 31), into w: a line of length
 * k through the centre at `deg` degrees (counter-clockwise from the x
 * axis, y pointing down), rasterised as 4 k points a quarter pixel apart,
 * each counted in its nearest cell, then normalised to sum 1 (at 0 or 90
 * degrees: k ones in the middle row or column, the usual definition).
 * tests/dataflow/image_ref.py builds the same kernel in Python for its
 * cv2.filter2D reference. */
static void s_motion_kernel(int k, double deg, double *w) {
    for (int i = 0; i < k * k; i++)
        w[i] = 0;
    double r = deg * 3.14159265358979323846 / 180, c = (k - 1) * 0.5;
    double cs = cos(r), sn = sin(r);
    int n = 4 * k, sum = 0;
    for (int i = 0; i < n; i++) {
        double t = -k * 0.5 + (i + 0.5) * 0.25;
        int x = (int)floor(c + t * cs + 0.5), y = (int)floor(c - t * sn + 0.5);
        if (x < 0 || y < 0 || x >= k || y >= k)
            continue;
        w[y * k + x] += 1;
        sum++;
    }
    for (int i = 0; i < k * k; i++)
        w[i] /= sum;
}

/* A k x k correlation (cv2.filter2D, anchor at the centre, border
 * replicated), over the kernel's non-zero taps only: a line has about 2 k
 * of its k * k cells set. */
static tp_status_t s_filter2d(tp_tensor_t *t, int k, const double *w) {
    int H = (int)t->shape[0], W = (int)t->shape[1];
    int C = t->ndim == 3 ? (int)t->shape[2] : 1;
    int ntap = 0, tx[31 * 31], ty[31 * 31];
    double tw[31 * 31];
    for (int i = 0; i < k * k; i++)
        if (w[i] != 0) {
            tx[ntap] = i % k - k / 2;
            ty[ntap] = i / k - k / 2;
            tw[ntap++] = w[i];
        }
    uint8_t *src = malloc(t->nbytes);
    if (!src)
        return tp_error(TP_ERR_NOMEM, "imgaug motion-blur");
    memcpy(src, t->data, t->nbytes);
    tp_status_t rc = tp_df_tensor_make_writable(t);
    if (rc != TP_OK) {
        free(src);
        return rc;
    }
    uint8_t *p = t->data;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < C; c++) {
                double v = 0;
                for (int i = 0; i < ntap; i++) {
                    int sy = y + ty[i], sx = x + tx[i];
                    sy = sy < 0 ? 0 : sy >= H ? H - 1 : sy;
                    sx = sx < 0 ? 0 : sx >= W ? W - 1 : sx;
                    v += tw[i] * src[((size_t)sy * W + sx) * C + c];
                }
                p[((size_t)y * W + x) * C + c] = s_u8(v);
            }
    free(src);
    return TP_OK;
}

/* Hue shift of an RGB image through OpenCV's 8-bit HSV (H in 0..179):
 * RGB2HSV with its fixed-point division tables, H + hue mod 180 truncated
 * to uint8 (numpy's assignment), HSV2RGB in single precision. */
static void s_hue(uint8_t *p, size_t npx, double hue) {
    int sdiv[256], hdiv[256];
    sdiv[0] = hdiv[0] = 0;
    for (int i = 1; i < 256; i++) {
        sdiv[i] = (int)lrint((255 << 12) / (1.0 * i));
        hdiv[i] = (int)lrint((180 << 12) / (6.0 * i));
    }
    static const int sect[6][3] = {{1, 3, 0}, {1, 0, 2}, {3, 0, 1},
                                   {0, 2, 1}, {0, 1, 3}, {2, 1, 0}};
    for (size_t i = 0; i < npx; i++, p += 3) {
        int r = p[0], g = p[1], b = p[2];
        int v = r > g ? r : g, vmin = r < g ? r : g;
        v = b > v ? b : v;
        vmin = b < vmin ? b : vmin;
        int diff = v - vmin;
        int vr = v == r ? -1 : 0, vg = v == g ? -1 : 0;
        int sv = (diff * sdiv[v] + (1 << 11)) >> 12;
        int h = (vr & (g - b)) +
                (~vr & ((vg & (b - r + 2 * diff)) + (~vg & (r - g + 4 * diff))));
        h = (h * hdiv[diff] + (1 << 11)) >> 12;
        h += h < 0 ? 180 : 0;
        double hh = fmod(h + hue, 180);
        if (hh < 0)
            hh += 180;
        int h8 = (int)hh;  /* numpy's float -> uint8 assignment truncates */
        float fh = (float)h8, fs = sv / 255.0f, fv = v / 255.0f;
        float rgb[3];
        if (fs == 0) {
            rgb[0] = rgb[1] = rgb[2] = fv;
        } else {
            fh *= 6.0f / 180.0f;
            while (fh >= 6)
                fh -= 6;
            int sc = (int)floorf(fh);
            fh -= (float)sc;
            if (sc < 0 || sc >= 6) {
                sc = 0;
                fh = 0;
            }
            float tab[4] = {fv, fv * (1 - fs), fv * (1 - fs * fh),
                            fv * (1 - fs * (1 - fh))};
            /* OpenCV's b, g, r */
            rgb[2] = tab[sect[sc][0]];
            rgb[1] = tab[sect[sc][1]];
            rgb[0] = tab[sect[sc][2]];
        }
        for (int c = 0; c < 3; c++) {
            float x = rgb[c] * 255.0f;
            p[c] = (uint8_t)(x <= 0 ? 0 : x >= 255 ? 255 : (int)lrintf(x));
        }
    }
}

/* ---- the augmentors ---------------------------------------------------------------- */

/* luma as cv2's RGB2GRAY on floats: 0.299 R + 0.587 G + 0.114 B */
static inline double s_grey(const uint8_t *p) {
    return 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2];
}

/* s_grey's three products for every byte value (t?[i] == weight * i). */
static void s_grey_tables(double tr[256], double tg[256], double tb[256]) {
    for (int i = 0; i < 256; i++) {
        tr[i] = 0.299 * i;
        tg[i] = 0.587 * i;
        tb[i] = 0.114 * i;
    }
}

static tp_status_t s_lut_apply(tp_tensor_t *t, const uint8_t *lut) {
    TP_TRY(tp_df_tensor_make_writable(t));
    uint8_t *p = t->data;
    size_t n = t->nbytes;
    for (size_t i = 0; i < n; i++)
        p[i] = lut[p[i]];
    return TP_OK;
}

int df_rrc_draw(tp_rng_t *rng, int H, int W, double area_lo, double area_hi,
                double ratio_lo, double ratio_hi, int rect[4]) {
    double area = (double)H * W;
    for (int i = 0; i < 10; i++) {
        double ta = (area_lo + (area_hi - area_lo) * tp_rng_double(rng)) * area;
        double ar = ratio_lo + (ratio_hi - ratio_lo) * tp_rng_double(rng);
        int ww = (int)(sqrt(ta * ar) + 0.5), hh = (int)(sqrt(ta / ar) + 0.5);
        if (tp_rng_double(rng) < 0.5) {
            int k = ww;
            ww = hh;
            hh = k;
        }
        if (hh <= H && ww <= W && hh >= 1 && ww >= 1) {
            rect[1] = (int)tp_rng_below(rng, (uint64_t)(W - ww) + 1);
            rect[0] = (int)tp_rng_below(rng, (uint64_t)(H - hh) + 1);
            rect[2] = hh;
            rect[3] = ww;
            return 1;
        }
    }
    rect[0] = rect[1] = 0;
    rect[2] = H;
    rect[3] = W;
    return 0;
}

static tp_status_t s_apply(const void *params, tp_tensor_t *t, float *xy,
                           size_t npts, tp_rng_t *rng);

tp_status_t df_rrc_finish(tp_tensor_t *t, int drawn, int size, tp_interp_t interp) {
    int H = 0, W = 0, C = 0;
    TP_TRY(s_geom(t, "random-resized-crop", &H, &W, &C));
    if (drawn)
        return s_resize_rect(t, 0, 0, H, W, size, size, interp, NULL, 0);
    int oh, ow;  /* IA_RRC's fallback */
    s_short_size(H, W, size, &oh, &ow);
    TP_TRY(s_resize_rect(t, 0, 0, H, W, oh, ow, interp, NULL, 0));
    ia_t cc = {.kind = IA_CENTER_CROP, .h = size, .w = size};
    return s_apply(&cc, t, NULL, 0, NULL);
}

static tp_status_t s_apply(const void *params, tp_tensor_t *t, float *xy,
                           size_t npts, tp_rng_t *rng) {
    const ia_t *a = params;
    int H = 0, W = 0, C = 0;
    static const char *names[] = {
        "resize", "resize-short", "random-resize-short", "center-crop",
        "random-resized-crop", "vflip", "brightness", "contrast",
        "saturation", "lighting", "grey", "noise", "brightness-scale", "clip",
        "min-max", "salt-pepper", "jpeg-noise", "rotation", "gaussian-blur",
        "mean-var", "affine", "hue", "motion-blur"};
    TP_TRY(s_geom(t, names[a->kind], &H, &W, &C));
    uint8_t lut[256];
    switch (a->kind) {
    case IA_RESIZE:  /* Resize */
        return s_resize_rect(t, 0, 0, H, W, a->h, a->w, a->interp, xy, npts);
    case IA_RESIZE_SHORT: {  /* ResizeShortestEdge */
        int oh, ow;
        s_short_size(H, W, a->h, &oh, &ow);
        return s_resize_rect(t, 0, 0, H, W, oh, ow, a->interp, xy, npts);
    }
    case IA_RANDOM_RESIZE_SHORT: {  /* RandomResize, aspect kept */
        int s = a->lo + (int)tp_rng_below(rng, (uint64_t)(a->hi - a->lo) + 1);
        int oh, ow;
        s_short_size(H, W, s, &oh, &ow);
        return s_resize_rect(t, 0, 0, H, W, oh, ow, a->interp, xy, npts);
    }
    case IA_CENTER_CROP: {  /* CenterCrop */
        if (H < a->h || W < a->w)
            return tp_error(TP_ERR_SHAPE, "imgaug center-crop: %dx%d from a "
                            "%dx%d image", a->h, a->w, H, W);
        int y0 = (int)((H - a->h) * 0.5), x0 = (int)((W - a->w) * 0.5);
        for (size_t i = 0; i < npts; i++) {
            xy[2 * i] -= (float)x0;
            xy[2 * i + 1] -= (float)y0;
        }
        int64_t shape[3] = {a->h, a->w, C};
        tp_tensor_t o;
        TP_TRY(tp_tensor_init(&o, TP_UINT8, t->ndim, shape));
        for (int y = 0; y < a->h; y++)
            memcpy((uint8_t *)o.data + (size_t)y * a->w * C,
                   (const uint8_t *)t->data + ((size_t)(y0 + y) * W + x0) * C,
                   (size_t)a->w * C);
        tp_tensor_fini(t);
        tp_tensor_move(t, &o);
        return TP_OK;
    }
    case IA_RRC: {  /* GoogleNetRandomCropAndResize */
        int r[4];
        if (df_rrc_draw(rng, H, W, a->a, a->b, a->c, a->d, r))
            return s_resize_rect(t, r[0], r[1], r[2], r[3], a->h, a->h, a->interp,
                                 xy, npts);
        /* resize the short side, then the center (as one rectangle of the
         * source when the sizes allow, else in two steps) */
        int oh, ow;
        s_short_size(H, W, a->h, &oh, &ow);
        TP_TRY(s_resize_rect(t, 0, 0, H, W, oh, ow, a->interp, xy, npts));
        ia_t cc = {.kind = IA_CENTER_CROP, .h = a->h, .w = a->h};
        return s_apply(&cc, t, xy, npts, rng);
    }
    case IA_VFLIP: {  /* Flip(vert=True) */
        if (!(tp_rng_double(rng) < a->a))
            return TP_OK;
        for (size_t i = 0; i < npts; i++)
            xy[2 * i + 1] = (float)H - xy[2 * i + 1];
        TP_TRY(tp_df_tensor_make_writable(t));
        size_t row = (size_t)W * C;
        uint8_t *p = t->data, tmp[4096];
        for (int y0 = 0, y1 = H - 1; y0 < y1; y0++, y1--)
            for (size_t off = 0; off < row; off += sizeof tmp) {
                size_t n = row - off < sizeof tmp ? row - off : sizeof tmp;
                memcpy(tmp, p + y0 * row + off, n);
                memcpy(p + y0 * row + off, p + y1 * row + off, n);
                memcpy(p + y1 * row + off, tmp, n);
            }
        return TP_OK;
    }
    case IA_BRIGHTNESS: {  /* Brightness: x + U(-delta, delta) */
        double v = -a->a + 2 * a->a * tp_rng_double(rng);
        for (int i = 0; i < 256; i++)
            lut[i] = s_u8(i + v);
        return s_lut_apply(t, lut);
    }
    case IA_BRIGHTNESS_SCALE: {  /* BrightnessScale: x * U(lo, hi) */
        double r = a->a + (a->b - a->a) * tp_rng_double(rng);
        for (int i = 0; i < 256; i++)
            lut[i] = s_u8(i * r);
        return s_lut_apply(t, lut);
    }
    case IA_CLIP: {  /* Clip(min, max) */
        for (int i = 0; i < 256; i++)
            lut[i] = (uint8_t)(i < a->a ? a->a : i > a->b ? a->b : i);
        return s_lut_apply(t, lut);
    }
    case IA_MINMAX: {  /* MinMaxNormalize(min, max, all_channel) */
        if (!a->lo) {  /* all channels together */
            const uint8_t *p = t->data;
            int lo = 255, hi = 0;
            for (size_t i = 0; i < t->nbytes; i++) {
                lo = p[i] < lo ? p[i] : lo;
                hi = p[i] > hi ? p[i] : hi;
            }
            double span = hi > lo ? hi - lo : 1;
            for (int i = 0; i < 256; i++)
                lut[i] = s_u8((i - lo) / span * (a->b - a->a) + a->a);
            return s_lut_apply(t, lut);
        }
        /* all_channel=False: each channel's own range, a table each */
        TP_TRY(tp_df_tensor_make_writable(t));
        uint8_t *p = t->data;
        size_t npx = (size_t)H * W;
        for (int c = 0; c < C; c++) {
            int lo = 255, hi = 0;
            for (size_t i = 0; i < npx; i++) {
                int v = p[i * C + c];
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            double span = hi > lo ? hi - lo : 1;
            for (int i = 0; i < 256; i++)
                lut[i] = s_u8((i - lo) / span * (a->b - a->a) + a->a);
            for (size_t i = 0; i < npx; i++)
                p[i * C + c] = lut[p[i * C + c]];
        }
        return TP_OK;
    }
    case IA_SALT_PEPPER: {  /* SaltPepperNoise(white_prob, black_prob) */
        TP_TRY(tp_df_tensor_make_writable(t));
        uint8_t *p = t->data;
        for (size_t i = 0; i < t->nbytes; i++) {
            double u = tp_rng_double(rng);
            if (u > 1 - a->a)
                p[i] = 255;
            else if (u < a->b)
                p[i] = 0;
        }
        return TP_OK;
    }
    case IA_JPEG: {  /* JpegNoise(quality_range): re-encode at q in [lo, hi) */
        if (C != 1 && C != 3)
            return tp_error(TP_ERR_SHAPE, "imgaug jpeg-noise: %d channels "
                            "(grey or RGB)", C);
        int q = a->lo + (int)tp_rng_below(rng, (uint64_t)(a->hi - a->lo));
        void *enc = NULL;
        size_t n = 0;
        TP_TRY(tp_image_encode_jpeg(t, q, &enc, &n));
        tp_image_opts_t o;
        tp_image_opts_init(&o);
        o.mode = C == 1 ? TP_IMAGE_GREY : TP_IMAGE_RGB;
        tp_tensor_t d;
        tp_status_t rc = tp_image_decode(enc, n, &o, "(jpeg-noise)", &d);
        free(enc);
        if (rc != TP_OK)
            return rc;
        tp_tensor_fini(t);
        tp_tensor_move(t, &d);
        return TP_OK;
    }
    case IA_ROTATE: {  /* Rotation(max_deg, center_range), border replicated */
        double cx = W * (a->a + (a->b - a->a) * tp_rng_double(rng));
        double cy = H * (a->a + (a->b - a->a) * tp_rng_double(rng));
        double deg = -a->c + 2 * a->c * tp_rng_double(rng);
        /* cv2.getRotationMatrix2D(center - 0.5, deg, 1) */
        double r = deg * 3.14159265358979323846 / 180, al = cos(r), be = sin(r);
        cx -= 0.5;
        cy -= 0.5;
        double m[6] = {al, be, (1 - al) * cx - be * cy,
                       -be, al, be * cx + (1 - al) * cy};
        for (size_t i = 0; i < npts; i++) {  /* tensorpack: coords . M^T */
            double x = xy[2 * i], y = xy[2 * i + 1];
            xy[2 * i] = (float)(m[0] * x + m[1] * y + m[2]);
            xy[2 * i + 1] = (float)(m[3] * x + m[4] * y + m[5]);
        }
        return s_warp(t, m);
    }
    case IA_AFFINE: {  /* Affine(scale, translate_frac, rotate_max_deg, shear) */
        double sc = 1, dx = 0, dy = 0, ss = 0, cs = 1;
        if (a->has_scale)
            sc = a->scale[0] + (a->scale[1] - a->scale[0]) * tp_rng_double(rng);
        if (a->has_frac) {
            double mx = a->frac[0] * W, my = a->frac[1] * H;
            dx = rint(-mx + 2 * mx * tp_rng_double(rng));  /* np.round */
            dy = rint(-my + 2 * my * tp_rng_double(rng));
        }
        if (a->shear > 0) {
            double sh = (-a->shear + 2 * a->shear * tp_rng_double(rng)) *
                        3.14159265358979323846 / 180;
            ss = sin(sh);
            cs = cos(sh);
        }
        double deg = -a->c + 2 * a->c * tp_rng_double(rng);
        double cx = W * 0.5 - 0.5, cy = H * 0.5 - 0.5;
        double r = deg * 3.14159265358979323846 / 180;
        double al = sc * cos(r), be = sc * sin(r);
        double m[6] = {al, be, (1 - al) * cx - be * cy,
                       -be, al, be * cx + (1 - al) * cy};
        if (a->shear > 0) {
            double m00 = m[0], m01 = m[1], m10 = m[3], m11 = m[4];
            m[1] = m01 * cs + m00 * ss;
            m[4] = m11 * cs + m10 * ss;
            m[2] = cx * (1 - m00) - cy * m[1];
            m[5] = -cx * m10 + cy * (1 - m[4]);
        }
        m[2] += dx;
        m[5] += dy;
        for (size_t i = 0; i < npts; i++) {
            double x = xy[2 * i], y = xy[2 * i + 1];
            xy[2 * i] = (float)(m[0] * x + m[1] * y + m[2]);
            xy[2 * i + 1] = (float)(m[3] * x + m[4] * y + m[5]);
        }
        return s_warp(t, m);
    }
    case IA_HUE: {  /* Hue(range, rgb=True) */
        if (C != 3)
            return tp_error(TP_ERR_SHAPE, "imgaug hue: %d channels (RGB only)",
                            C);
        double hue = a->a + (a->b - a->a) * tp_rng_double(rng);
        TP_TRY(tp_df_tensor_make_writable(t));
        s_hue(t->data, (size_t)H * W, hue);
        return TP_OK;
    }
    case IA_BLUR: {  /* GaussianBlur(size_range, sigma_range, symmetric) */
        int kx = (a->lo + (int)tp_rng_below(rng, (uint64_t)(a->hi - a->lo))) * 2 + 1;
        int ky = (a->lo + (int)tp_rng_below(rng, (uint64_t)(a->hi - a->lo))) * 2 + 1;
        double sx = a->a + (a->b - a->a) * tp_rng_double(rng);
        double sy = a->a + (a->b - a->a) * tp_rng_double(rng);
        (void)ky;
        (void)sy;
        double w[31];
        s_gauss_kernel(kx, sx, w);  /* symmetric: x's size and sigma */
        return s_blur(t, kx, w, kx, w);
    }
    case IA_MOTION_BLUR: {  /* a line kernel, odd k in [lo, hi], angle */
        int k = a->lo + 2 * (int)tp_rng_below(rng, (uint64_t)((a->hi - a->lo) / 2 + 1));
        double deg = a->a + (a->b - a->a) * tp_rng_double(rng);
        double w[31 * 31];
        s_motion_kernel(k, deg, w);
        return s_filter2d(t, k, w);
    }
    case IA_MEANVAR: {  /* MeanVarianceNormalize(all_channel) */
        const uint8_t *p = t->data;
        /* groups: the whole image, or (all_channel=False) each channel;
         * the floor on the std is 1/sqrt(all values) either way, as
         * tensorpack's np.prod(img.shape) */
        int G = a->lo ? C : 1, S = a->lo ? C : 1;
        double mean[16], sd[16], lo = 1 / sqrt((double)t->nbytes);
        for (int g = 0; g < G; g++) {
            double sum = 0, sq = 0;
            size_t cnt = 0;
            for (size_t i = (size_t)g; i < t->nbytes; i += (size_t)S, cnt++) {
                sum += p[i];
                sq += (double)p[i] * p[i];
            }
            mean[g] = sum / (double)cnt;
            double var = sq / (double)cnt - mean[g] * mean[g];
            sd[g] = sqrt(var > 0 ? var : 0);
            sd[g] = sd[g] > lo ? sd[g] : lo;
        }
        tp_tensor_t o;
        TP_TRY(tp_tensor_init(&o, TP_FLOAT32, t->ndim, t->shape));
        float *d = o.data;
        for (size_t i = 0; i < t->nbytes; i++) {
            int g = a->lo ? (int)(i % (size_t)C) : 0;
            d[i] = (float)((p[i] - mean[g]) / sd[g]);
        }
        tp_tensor_fini(t);
        tp_tensor_move(t, &o);
        return TP_OK;
    }
    case IA_CONTRAST: {  /* Contrast(rgb=True): (x - mean) r + mean */
        double r = a->a + (a->b - a->a) * tp_rng_double(rng);
        const uint8_t *p = t->data;
        size_t npx = (size_t)H * W;
        double sum = 0;
        if (C == 3) {
            /* s_grey's products from tables: the same doubles, summed in
             * the same order, without three conversions a pixel */
            double tr[256], tg[256], tb[256];
            s_grey_tables(tr, tg, tb);
            for (size_t i = 0; i < npx; i++, p += 3)
                sum += tr[p[0]] + tg[p[1]] + tb[p[2]];
            sum /= (double)npx;
        } else {
            uint64_t s = 0;
            for (size_t i = 0; i < t->nbytes; i++)
                s += p[i];
            sum = (double)s / (double)t->nbytes;
        }
        for (int i = 0; i < 256; i++)
            lut[i] = s_u8(i * r + sum * (1 - r));
        return s_lut_apply(t, lut);
    }
    case IA_SATURATION: {  /* Saturation(rgb=True): x v + grey (1 - v) */
        if (C != 3)
            return tp_error(TP_ERR_SHAPE, "imgaug saturation: %d channels "
                            "(RGB only)", C);
        double v = 1 + (-a->a + 2 * a->a * tp_rng_double(rng));
        TP_TRY(tp_df_tensor_make_writable(t));
        uint8_t *p = t->data;
        size_t npx = (size_t)H * W;
        /* x v and s_grey's products from tables: the same doubles as
         * computing them a pixel at a time (no FMA in this file), so the
         * same bytes, without six conversions and four products a pixel */
        double tr[256], tg[256], tb[256], tv[256], w = 1 - v;
        s_grey_tables(tr, tg, tb);
        for (int i = 0; i < 256; i++)
            tv[i] = i * v;
        for (size_t i = 0; i < npx; i++, p += 3) {
            uint8_t r = p[0], gr = p[1], b = p[2];
            double g = (tr[r] + tg[gr] + tb[b]) * w;
            p[0] = s_u8(tv[r] + g);
            p[1] = s_u8(tv[gr] + g);
            p[2] = s_u8(tv[b] + g);
        }
        return TP_OK;
    }
    case IA_LIGHTING: {  /* Lighting: x + eigvec (N(0, std) * eigval) */
        if (C != 3)
            return tp_error(TP_ERR_SHAPE, "imgaug lighting: %d channels "
                            "(RGB only)", C);
        double v[3], inc[3];
        for (int k = 0; k < 3; k++)
            v[k] = tp_rng_normal(rng) * a->a * a->eigval[k];
        for (int r = 0; r < 3; r++)
            inc[r] = a->eigvec[r * 3] * v[0] + a->eigvec[r * 3 + 1] * v[1] +
                     a->eigvec[r * 3 + 2] * v[2];
        uint8_t l3[3][256];
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < 256; i++)
                l3[c][i] = s_u8(i + inc[c]);
        TP_TRY(tp_df_tensor_make_writable(t));
        uint8_t *p = t->data;
        size_t npx = (size_t)H * W;
        for (size_t i = 0; i < npx; i++, p += 3) {
            p[0] = l3[0][p[0]];
            p[1] = l3[1][p[1]];
            p[2] = l3[2][p[2]];
        }
        return TP_OK;
    }
    case IA_GREY: {  /* Grayscale(keepshape=True) with a probability */
        if (C != 3)
            return tp_error(TP_ERR_SHAPE, "imgaug grey: %d channels (RGB "
                            "only)", C);
        if (!(tp_rng_double(rng) < a->a))
            return TP_OK;
        TP_TRY(tp_df_tensor_make_writable(t));
        uint8_t *p = t->data;
        size_t npx = (size_t)H * W;
        for (size_t i = 0; i < npx; i++, p += 3)
            p[0] = p[1] = p[2] = s_u8(s_grey(p));
        return TP_OK;
    }
    default: {  /* GaussianNoise: x + N(0, sigma) per value */
        TP_TRY(tp_df_tensor_make_writable(t));
        uint8_t *p = t->data;
        for (size_t i = 0; i < t->nbytes; i++)
            p[i] = s_u8(p[i] + tp_rng_normal(rng) * a->a);
        return TP_OK;
    }
    }
}

static tp_status_t s_add(tp_augment_t *self, const ia_t *a) {
    ia_t *p = malloc(sizeof *p);
    if (!p)
        return tp_error(TP_ERR_NOMEM, "imgaug");
    *p = *a;
    return df_augment_add_ext(self, s_apply, p, free);
}

static int s_size_ok(int v) { return v >= 1 && v <= 65536; }

static tp_status_t s_interp_ok(tp_interp_t i, const char *who) {
    if (i != TP_INTERP_NEAREST && i != TP_INTERP_LINEAR)
        return tp_error(TP_ERR_INVALID, "imgaug %s: interpolation %d", who,
                        (int)i);
    return TP_OK;
}

tp_status_t tp_augment_add_resize(tp_augment_t *self, int h, int w,
                                  tp_interp_t interp) {
    if (!s_size_ok(h) || !s_size_ok(w))
        return tp_error(TP_ERR_INVALID, "imgaug resize: %dx%d (1..65536)", h,
                        w);
    TP_TRY(s_interp_ok(interp, "resize"));
    ia_t a = {.kind = IA_RESIZE, .h = h, .w = w, .interp = interp};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_resize_short(tp_augment_t *self, int size,
                                        tp_interp_t interp) {
    if (!s_size_ok(size))
        return tp_error(TP_ERR_INVALID, "imgaug resize-short: %d (1..65536)",
                        size);
    TP_TRY(s_interp_ok(interp, "resize-short"));
    ia_t a = {.kind = IA_RESIZE_SHORT, .h = size, .interp = interp};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_random_resize_short(tp_augment_t *self, int lo,
                                               int hi, tp_interp_t interp) {
    if (!s_size_ok(lo) || !s_size_ok(hi) || lo > hi)
        return tp_error(TP_ERR_INVALID, "imgaug random-resize-short: %d..%d "
                        "(1 <= lo <= hi <= 65536)", lo, hi);
    TP_TRY(s_interp_ok(interp, "random-resize-short"));
    ia_t a = {.kind = IA_RANDOM_RESIZE_SHORT, .lo = lo, .hi = hi,
              .interp = interp};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_center_crop(tp_augment_t *self, int h, int w) {
    if (!s_size_ok(h) || !s_size_ok(w))
        return tp_error(TP_ERR_INVALID, "imgaug center-crop: %dx%d", h, w);
    ia_t a = {.kind = IA_CENTER_CROP, .h = h, .w = w};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_random_resized_crop(tp_augment_t *self, int size,
                                               double area_lo, double area_hi,
                                               double ratio_lo,
                                               double ratio_hi,
                                               tp_interp_t interp) {
    if (!s_size_ok(size) || !(area_lo > 0 && area_lo <= area_hi &&
                              area_hi <= 1) ||
        !(ratio_lo > 0 && ratio_lo <= ratio_hi && ratio_hi < 100))
        return tp_error(TP_ERR_INVALID, "imgaug random-resized-crop: size %d, "
                        "area %g..%g (in (0,1]), ratio %g..%g (> 0)", size,
                        area_lo, area_hi, ratio_lo, ratio_hi);
    TP_TRY(s_interp_ok(interp, "random-resized-crop"));
    ia_t a = {.kind = IA_RRC, .h = size, .interp = interp, .a = area_lo,
              .b = area_hi, .c = ratio_lo, .d = ratio_hi};
    return s_add(self, &a);
}

static tp_status_t s_prob(tp_augment_t *self, ia_kind_t k, double p,
                          const char *who) {
    if (!(p >= 0 && p <= 1))
        return tp_error(TP_ERR_INVALID, "imgaug %s: probability %g (0..1)",
                        who, p);
    ia_t a = {.kind = k, .a = p};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_vflip(tp_augment_t *self, double prob) {
    return s_prob(self, IA_VFLIP, prob, "vflip");
}

tp_status_t tp_augment_add_grey(tp_augment_t *self, double prob) {
    return s_prob(self, IA_GREY, prob, "grey");
}

tp_status_t tp_augment_add_brightness(tp_augment_t *self, double delta) {
    if (!(delta >= 0 && delta <= 255))
        return tp_error(TP_ERR_INVALID, "imgaug brightness: delta %g (0..255)",
                        delta);
    ia_t a = {.kind = IA_BRIGHTNESS, .a = delta};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_brightness_scale(tp_augment_t *self, double lo,
                                           double hi) {
    if (!(lo >= 0 && lo <= hi && hi < 100))
        return tp_error(TP_ERR_INVALID, "imgaug brightness-scale: range "
                        "%g..%g (0 <= lo <= hi)", lo, hi);
    ia_t a = {.kind = IA_BRIGHTNESS_SCALE, .a = lo, .b = hi};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_contrast(tp_augment_t *self, double lo, double hi) {
    if (!(lo >= 0 && lo <= hi && hi < 100))
        return tp_error(TP_ERR_INVALID, "imgaug contrast: range %g..%g "
                        "(0 <= lo <= hi)", lo, hi);
    ia_t a = {.kind = IA_CONTRAST, .a = lo, .b = hi};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_saturation(tp_augment_t *self, double alpha) {
    if (!(alpha >= 0 && alpha <= 1))
        return tp_error(TP_ERR_INVALID, "imgaug saturation: alpha %g (0..1)",
                        alpha);
    ia_t a = {.kind = IA_SATURATION, .a = alpha};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_lighting(tp_augment_t *self, double std,
                                    const float *eigval, const float *eigvec) {
    if (!(std >= 0 && std < 1e6) || !eigval || !eigvec)
        return tp_error(TP_ERR_INVALID, "imgaug lighting: std %g and the "
                        "eigenvalues and eigenvectors", std);
    ia_t a = {.kind = IA_LIGHTING, .a = std};
    memcpy(a.eigval, eigval, sizeof a.eigval);
    memcpy(a.eigvec, eigvec, sizeof a.eigvec);
    return s_add(self, &a);
}

tp_status_t tp_augment_add_gaussian_noise(tp_augment_t *self, double sigma) {
    if (!(sigma >= 0 && sigma < 1e6))
        return tp_error(TP_ERR_INVALID, "imgaug noise: sigma %g (>= 0)", sigma);
    ia_t a = {.kind = IA_NOISE, .a = sigma};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_clip(tp_augment_t *self, int lo, int hi) {
    if (lo < 0 || hi > 255 || lo > hi)
        return tp_error(TP_ERR_INVALID, "imgaug clip: %d..%d (0 <= lo <= hi "
                        "<= 255)", lo, hi);
    ia_t a = {.kind = IA_CLIP, .a = lo, .b = hi};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_min_max(tp_augment_t *self, int lo, int hi) {
    if (lo < 0 || hi > 255 || lo > hi)
        return tp_error(TP_ERR_INVALID, "imgaug min-max: %d..%d (0 <= lo <= "
                        "hi <= 255)", lo, hi);
    ia_t a = {.kind = IA_MINMAX, .a = lo, .b = hi};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_salt_pepper(tp_augment_t *self, double white,
                                       double black) {
    if (!(white >= 0 && black >= 0 && white + black <= 1))
        return tp_error(TP_ERR_INVALID, "imgaug salt-pepper: white %g black "
                        "%g (>= 0, sum <= 1)", white, black);
    ia_t a = {.kind = IA_SALT_PEPPER, .a = white, .b = black};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_jpeg_noise(tp_augment_t *self, int qlo, int qhi) {
    if (qlo < 1 || qhi > 101 || qlo >= qhi)
        return tp_error(TP_ERR_INVALID, "imgaug jpeg-noise: quality %d..%d "
                        "(1 <= lo < hi <= 101)", qlo, qhi);
    ia_t a = {.kind = IA_JPEG, .lo = qlo, .hi = qhi};
    return s_add(self, &a);
}

/* ---- random apply / choice / order of sub-chains ------------------------------ */

typedef struct {
    int kind;              /* 0 apply, 1 choice, 2 order */
    double prob;
    int n;
    tp_augment_t **subs;   /* [n], owned */
} meta_t;

static void s_meta_free(void *p) {
    meta_t *m = p;
    for (int i = 0; i < m->n; i++)
        tp_augment_destroy(&m->subs[i]);
    free(m->subs);
    free(m);
}

static tp_status_t s_meta(const void *params, tp_tensor_t *t, float *xy,
                          size_t npts, tp_rng_t *rng) {
    const meta_t *m = params;
    if (m->kind == 0) {  /* RandomApplyAug */
        if (!(tp_rng_double(rng) < m->prob))
            return TP_OK;
        return df_augment_apply_pts(m->subs[0], t, xy, npts, rng);
    }
    if (m->kind == 1) {  /* RandomChooseAug (uniform) */
        int k = (int)tp_rng_below(rng, (uint64_t)m->n);
        return df_augment_apply_pts(m->subs[k], t, xy, npts, rng);
    }
    /* RandomOrderAug: a random permutation, then each in turn */
    int idx[64];
    for (int i = 0; i < m->n; i++)
        idx[i] = i;
    for (int i = m->n - 1; i > 0; i--) {
        int j = (int)tp_rng_below(rng, (uint64_t)i + 1);
        int k = idx[i];
        idx[i] = idx[j];
        idx[j] = k;
    }
    for (int i = 0; i < m->n; i++)
        TP_TRY(df_augment_apply_pts(m->subs[idx[i]], t, xy, npts, rng));
    return TP_OK;
}

static tp_status_t s_add_meta(tp_augment_t *self, int kind, double prob,
                              tp_augment_t **subs, int n, const char *who) {
    meta_t *m = calloc(1, sizeof *m);
    tp_augment_t **v = m ? calloc((size_t)(n > 0 ? n : 1), sizeof *v) : NULL;
    int bad = n < 1 || n > 64;
    for (int i = 0; i < n && !bad; i++)
        bad = subs[i] == NULL;
    if (!v || bad) {
        for (int i = 0; i < n; i++)
            tp_augment_destroy(&subs[i]);
        free(v);
        free(m);
        return bad ? tp_error(TP_ERR_INVALID, "imgaug %s: %d chains (1..64, "
                              "none NULL)", who, n)
                   : tp_error(TP_ERR_NOMEM, "imgaug %s", who);
    }
    for (int i = 0; i < n; i++) {
        v[i] = subs[i];
        subs[i] = NULL;
    }
    m->kind = kind;
    m->prob = prob;
    m->n = n;
    m->subs = v;
    return df_augment_add_ext(self, s_meta, m, s_meta_free);
}

tp_status_t tp_augment_add_random_apply(tp_augment_t *self, tp_augment_t **sub,
                                        double prob) {
    if (!(prob >= 0 && prob <= 1)) {
        tp_augment_destroy(sub);
        return tp_error(TP_ERR_INVALID, "imgaug random-apply: probability %g",
                        prob);
    }
    return s_add_meta(self, 0, prob, sub, 1, "random-apply");
}

tp_status_t tp_augment_add_random_choice(tp_augment_t *self,
                                         tp_augment_t **subs, int n) {
    return s_add_meta(self, 1, 0, subs, n, "random-choice");
}

tp_status_t tp_augment_add_random_order(tp_augment_t *self,
                                        tp_augment_t **subs, int n) {
    return s_add_meta(self, 2, 0, subs, n, "random-order");
}

/* ---- boxes ------------------------------------------------------------------ */

tp_status_t tp_augment_apply_boxes(const tp_augment_t *self, tp_tensor_t *t,
                                   tp_tensor_t *boxes, tp_rng_t *rng) {
    if (boxes->dtype != TP_FLOAT32 || boxes->ndim != 2 ||
        boxes->shape[1] != 4) {
        char d[96];
        return tp_error(TP_ERR_SHAPE, "imgaug: boxes are %s, expected float32 "
                        "[N,4] (x1, y1, x2, y2)",
                        tp_tensor_describe(boxes, d, sizeof d));
    }
    TP_TRY(tp_df_tensor_make_writable(boxes));
    size_t n = (size_t)boxes->shape[0];
    float *b = boxes->data;
    /* tensorpack's box_to_point4: the four corners, moved, then their
     * bounding box */
    float *pts = malloc(sizeof(float) * 8 * (n ? n : 1));
    if (!pts)
        return tp_error(TP_ERR_NOMEM, "imgaug boxes");
    for (size_t i = 0; i < n; i++) {
        const float *q = b + 4 * i;
        float c[8] = {q[0], q[1], q[2], q[3], q[0], q[3], q[2], q[1]};
        memcpy(pts + 8 * i, c, sizeof c);
    }
    tp_status_t rc = df_augment_apply_pts(self, t, pts, 4 * n, rng);
    for (size_t i = 0; rc == TP_OK && i < n; i++) {
        const float *p = pts + 8 * i;
        float x1 = p[0], y1 = p[1], x2 = p[0], y2 = p[1];
        for (int k = 1; k < 4; k++) {
            x1 = p[2 * k] < x1 ? p[2 * k] : x1;
            x2 = p[2 * k] > x2 ? p[2 * k] : x2;
            y1 = p[2 * k + 1] < y1 ? p[2 * k + 1] : y1;
            y2 = p[2 * k + 1] > y2 ? p[2 * k + 1] : y2;
        }
        float *q = b + 4 * i;
        q[0] = x1;
        q[1] = y1;
        q[2] = x2;
        q[3] = y2;
    }
    free(pts);
    return rc;
}

tp_status_t tp_augment_add_rotation(tp_augment_t *self, double max_deg,
                                    double center_lo, double center_hi) {
    if (!(max_deg >= 0 && max_deg <= 180) ||
        !(center_lo >= 0 && center_lo <= center_hi && center_hi <= 1))
        return tp_error(TP_ERR_INVALID, "imgaug rotation: max %g degrees "
                        "(0..180), centre %g..%g (in [0,1])", max_deg,
                        center_lo, center_hi);
    ia_t a = {.kind = IA_ROTATE, .a = center_lo, .b = center_hi, .c = max_deg};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_gaussian_blur(tp_augment_t *self, int size_lo,
                                         int size_hi, double sigma_lo,
                                         double sigma_hi) {
    if (size_lo < 0 || size_hi > 16 || size_lo >= size_hi ||
        !(sigma_lo >= 0 && sigma_lo <= sigma_hi && sigma_hi < 100))
        return tp_error(TP_ERR_INVALID, "imgaug gaussian-blur: size %d..%d "
                        "(0 <= lo < hi <= 16), sigma %g..%g", size_lo, size_hi,
                        sigma_lo, sigma_hi);
    ia_t a = {.kind = IA_BLUR, .lo = size_lo, .hi = size_hi, .a = sigma_lo,
              .b = sigma_hi};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_motion_blur(tp_augment_t *self, int size_lo,
                                       int size_hi, double deg_lo,
                                       double deg_hi) {
    if (size_lo < 1 || size_hi > 31 || size_lo > size_hi || !(size_lo & 1) ||
        !(size_hi & 1) || !(deg_lo >= -360 && deg_lo <= deg_hi && deg_hi <= 360))
        return tp_error(TP_ERR_INVALID, "imgaug motion-blur: size %d..%d (odd, "
                        "1 <= lo <= hi <= 31), angle %g..%g degrees (in "
                        "[-360, 360])", size_lo, size_hi, deg_lo, deg_hi);
    ia_t a = {.kind = IA_MOTION_BLUR, .lo = size_lo, .hi = size_hi, .a = deg_lo,
              .b = deg_hi};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_mean_var(tp_augment_t *self) {
    ia_t a = {.kind = IA_MEANVAR};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_mean_var_channels(tp_augment_t *self) {
    ia_t a = {.kind = IA_MEANVAR, .lo = 1};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_min_max_channels(tp_augment_t *self, int lo, int hi) {
    if (lo < 0 || hi > 255 || lo > hi)
        return tp_error(TP_ERR_INVALID, "imgaug min-max-channels: %d..%d (0 <= "
                        "lo <= hi <= 255)", lo, hi);
    ia_t a = {.kind = IA_MINMAX, .a = lo, .b = hi, .lo = 1};
    return s_add(self, &a);
}

tp_status_t tp_augment_add_affine(tp_augment_t *self, const double *scale,
                                  const double *translate_frac,
                                  double rotate_max_deg, double shear) {
    if ((scale && !(scale[0] > 0 && scale[0] <= scale[1] && scale[1] < 100)) ||
        (translate_frac && !(translate_frac[0] >= 0 && translate_frac[0] <= 1 &&
                             translate_frac[1] >= 0 && translate_frac[1] <= 1)) ||
        !(rotate_max_deg >= 0 && rotate_max_deg <= 180) ||
        !(shear >= 0 && shear < 90))
        return tp_error(TP_ERR_INVALID, "imgaug affine: scale in (0, 100), "
                        "translation fractions in [0, 1], rotation 0..180, "
                        "shear 0..90 degrees");
    ia_t a = {.kind = IA_AFFINE, .c = rotate_max_deg, .shear = shear};
    if (scale) {
        a.has_scale = 1;
        a.scale[0] = scale[0];
        a.scale[1] = scale[1];
    }
    if (translate_frac) {
        a.has_frac = 1;
        a.frac[0] = translate_frac[0];
        a.frac[1] = translate_frac[1];
    }
    return s_add(self, &a);
}

tp_status_t tp_augment_add_hue(tp_augment_t *self, double lo, double hi) {
    if (!(lo >= -90 && lo <= hi && hi <= 180))
        return tp_error(TP_ERR_INVALID, "imgaug hue: range %g..%g (OpenCV's "
                        "8-bit hue units, -90 <= lo <= hi <= 180)", lo, hi);
    ia_t a = {.kind = IA_HUE, .a = lo, .b = hi};
    return s_add(self, &a);
}

/* ---- channels first ------------------------------------------------------------ */

/* HWC -> CHW for any element size (uint8 before normalisation, float32
 * after): the layout the NCHW convolutions take, so a colour image enters
 * the model without a transpose op. An HW image has one channel and is
 * left as it is. Points are not moved (no pixel moves within its plane). */
static tp_status_t s_to_chw(const void *params, tp_tensor_t *t, float *xy,
                            size_t npts, tp_rng_t *rng) {
    (void)params, (void)xy, (void)npts, (void)rng;
    if (t->ndim == 2)
        return TP_OK;
    if (t->ndim != 3 || t->shape[2] < 1 || t->shape[2] > 16) {
        char d[96];
        return tp_error(TP_ERR_SHAPE, "imgaug chw: image is %s, expected HWC "
                        "(C 1..16) or HW", tp_tensor_describe(t, d, sizeof d));
    }
    size_t H = (size_t)t->shape[0], W = (size_t)t->shape[1], C = (size_t)t->shape[2];
    size_t es = tp_dtype_size(t->dtype), npx = H * W;
    int64_t shape[3] = {(int64_t)C, (int64_t)H, (int64_t)W};
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, t->dtype, 3, shape));
    const uint8_t *s = t->data;
    uint8_t *d = o.data;
    if (es == 1)
        for (size_t i = 0; i < npx; i++)
            for (size_t c = 0; c < C; c++)
                d[c * npx + i] = s[i * C + c];
    else if (es == 4)
        for (size_t i = 0; i < npx; i++)
            for (size_t c = 0; c < C; c++)
                memcpy(d + (c * npx + i) * 4, s + (i * C + c) * 4, 4);
    else
        for (size_t i = 0; i < npx; i++)
            for (size_t c = 0; c < C; c++)
                memcpy(d + (c * npx + i) * es, s + (i * C + c) * es, es);
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

tp_status_t tp_augment_add_to_chw(tp_augment_t *self) {
    return df_augment_add_ext(self, s_to_chw, NULL, NULL);
}
