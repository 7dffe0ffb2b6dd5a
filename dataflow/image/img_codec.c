/* towerpack dataflow/image: JPEG and PNG decoding and encoding, and the
 * dispatch by magic bytes to the other formats' decoders (img_formats.c:
 * WebP, TIFF, BMP, PGM/PPM).
 *
 * JPEG goes through libjpeg-turbo's TurboJPEG API (SIMD IDCT and colour
 * conversion, DCT-domain scaling by 1/8 .. 1), PNG through libpng; nothing
 * here decodes pixels by hand. What is ours: telling the formats apart by
 * their magic bytes, the limits checked before any pixel buffer is made,
 * the EXIF orientation (read by libexif, applied here) and the channel
 * conversions, which follow PIL's so results compare with it.
 *
 * A TurboJPEG handle costs a few allocations, so each thread keeps one
 * (a pthread key frees it when the thread ends). */
#include <errno.h>
#include <libexif/exif-data.h>
#include <png.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <turbojpeg.h>
#include <jpeglib.h>
#include <towerpack/image.h>
#include "dataflow/df_internal.h"
#include "dataflow/image/img_formats.h"

void tp_image_opts_init(tp_image_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    opts->mode = TP_IMAGE_ANY;
    /* EXIF orientation off by default: PIL's Image.open(f).convert('RGB'),
     * torchvision ImageFolder's loader, does not turn the pixels, so a
     * model trained here sees what one trained there sees (exif=1 turns
     * them upright, as ImageOps.exif_transpose) */
    opts->exif = 0;
    opts->max_pixels = (int64_t)1 << 26;
}

static const char *s_nm(const char *name) { return name ? name : "(memory)"; }

/* ---- per-thread TurboJPEG handles ----------------------------------------- */

static pthread_key_t s_key_d, s_key_c;
static pthread_once_t s_key_once = PTHREAD_ONCE_INIT;

static void s_tj_free(void *h) {
    if (h)
        tjDestroy(h);
}

static void s_keys(void) {
    pthread_key_create(&s_key_d, s_tj_free);
    pthread_key_create(&s_key_c, s_tj_free);
}

static tjhandle s_handle(int compress) {
    pthread_once(&s_key_once, s_keys);
    pthread_key_t k = compress ? s_key_c : s_key_d;
    tjhandle h = pthread_getspecific(k);
    if (!h) {
        h = compress ? tjInitCompress() : tjInitDecompress();
        if (h && pthread_setspecific(k, h) != 0) {
            tjDestroy(h);
            h = NULL;
        }
    }
    return h;
}

/* ---- channel conversions (PIL's formulas) ---------------------------------- */

/* PIL's RGB -> L: (r*19595 + g*38470 + b*7471 + 0x8000) >> 16 (ITU-R 601). */
static inline uint8_t s_luma(const uint8_t *p) {
    return (uint8_t)((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >>
                     16);
}

/* Convert `src` (c channels) to `want` channels into a new tensor; grey is
 * [H,W]. Alpha is dropped (as PIL's RGBA -> RGB) or made opaque. */
static tp_status_t s_convert(tp_tensor_t *t, int c, int want) {
    if (c == want)
        return TP_OK;
    int64_t H = t->shape[0], W = t->shape[1];
    int64_t shape[3] = {H, W, want};
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, TP_UINT8, want == 1 ? 2 : 3, shape));
    const uint8_t *s = t->data;
    uint8_t *d = o.data;
    size_t n = (size_t)H * (size_t)W;
    for (size_t i = 0; i < n; i++, s += c, d += want) {
        if (want == 1) {
            d[0] = c >= 3 ? s_luma(s) : s[0];
            continue;
        }
        if (c >= 3) {
            d[0] = s[0];
            d[1] = s[1];
            d[2] = s[2];
        } else {
            d[0] = d[1] = d[2] = s[0];
        }
        if (want == 4)
            d[3] = c == 4 ? s[3] : c == 2 ? s[1] : 255;
    }
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

/* CMYK (as libjpeg-turbo gives a CMYK or YCCK JPEG's samples: Adobe's
 * inverted convention, which Photoshop writes and PIL assumes for every
 * CMYK JPEG, "CMYK;I") to RGB, in place in *t's first three channels
 * then cut to [H,W,3]: PIL's cmyk2rgb after its inversion,
 * r = (255-k) - (255-c)(255-k)/255 rounded as its MULDIV255. */
static tp_status_t s_cmyk_rgb(tp_tensor_t *t) {
    int64_t H = t->shape[0], W = t->shape[1];
    int64_t shape[3] = {H, W, 3};
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, TP_UINT8, 3, shape));
    const uint8_t *s = t->data;
    uint8_t *d = o.data;
    for (size_t i = 0, n = (size_t)H * (size_t)W; i < n; i++, s += 4, d += 3) {
        unsigned nk = s[3];  /* 255 - k, k = 255 - stored */
        for (int c = 0; c < 3; c++) {
            unsigned tmp = (255u - s[c]) * nk + 128u;
            d[c] = (uint8_t)(nk - (((tmp >> 8) + tmp) >> 8));
        }
    }
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

/* ---- EXIF orientation ---------------------------------------------------------- */

/* The orientation (1..8) of a JPEG's Exif APP1 segment, 1 when there is
 * none. The marker walk only finds the segment; libexif parses it. */
static int s_exif_orientation(const uint8_t *p, size_t n) {
    size_t i = 2;
    while (i + 4 <= n && p[i] == 0xFF) {
        uint8_t m = p[i + 1];
        if (m == 0xDA || m == 0xD9)  /* start of scan, end of image */
            break;
        size_t len = ((size_t)p[i + 2] << 8) | p[i + 3];
        if (len < 2 || i + 2 + len > n)
            break;
        if (m == 0xE1 && len >= 8 && !memcmp(p + i + 4, "Exif\0\0", 6)) {
            ExifData *ed = exif_data_new_from_data(p + i + 4, (unsigned)len - 2);
            int o = 1;
            if (ed) {
                ExifEntry *e = exif_data_get_entry(ed, EXIF_TAG_ORIENTATION);
                if (e && e->format == EXIF_FORMAT_SHORT && e->components >= 1 &&
                    e->size >= 2) {
                    o = exif_get_short(e->data, exif_data_get_byte_order(ed));
                    if (o < 1 || o > 8)
                        o = 1;
                }
                exif_data_unref(ed);
            }
            return o;
        }
        i += 2 + len;
    }
    return 1;
}

/* Turn the stored image so it displays upright (EXIF orientation o), as
 * PIL's ImageOps.exif_transpose. */
static tp_status_t s_orient(tp_tensor_t *t, int o) {
    if (o <= 1 || o > 8)
        return TP_OK;
    int64_t H = t->shape[0], W = t->shape[1];
    int64_t C = t->ndim == 3 ? t->shape[2] : 1;
    int swap = o >= 5;
    int64_t oh = swap ? W : H, ow = swap ? H : W;
    int64_t shape[3] = {oh, ow, C};
    tp_tensor_t out;
    TP_TRY(tp_tensor_init(&out, TP_UINT8, t->ndim, shape));
    const uint8_t *s = t->data;
    uint8_t *d = out.data;
    for (int64_t y = 0; y < oh; y++)
        for (int64_t x = 0; x < ow; x++) {
            int64_t sy, sx;
            switch (o) {
            case 2: sy = y; sx = W - 1 - x; break;
            case 3: sy = H - 1 - y; sx = W - 1 - x; break;
            case 4: sy = H - 1 - y; sx = x; break;
            case 5: sy = x; sx = y; break;
            case 6: sy = H - 1 - x; sx = y; break;
            case 7: sy = H - 1 - x; sx = W - 1 - y; break;
            default: sy = x; sx = W - 1 - y; break;  /* 8 */
            }
            memcpy(d + (y * ow + x) * C, s + (sy * W + sx) * C, (size_t)C);
        }
    tp_tensor_fini(t);
    tp_tensor_move(t, &out);
    return TP_OK;
}

/* ---- JPEG -------------------------------------------------------------------------- */

/* ---- a rectangle of a decoded image ------------------------------------------------ */

/* The rectangle pick chooses in an image of height x width, checked. */
static tp_status_t s_pick(tp_image_pick_fn pick, void *user, int height, int width,
                          const char *name, int r[4]) {
    r[0] = r[1] = 0;
    r[2] = height;
    r[3] = width;
    pick(user, height, width, r);
    if (r[0] < 0 || r[1] < 0 || r[2] < 1 || r[3] < 1 || r[0] + r[2] > height ||
        r[1] + r[3] > width)
        return tp_error(TP_ERR_INVALID, "image %s: region %dx%d at (%d, %d) is not "
                        "inside the %dx%d image", s_nm(name), r[2], r[3], r[0], r[1],
                        height, width);
    return TP_OK;
}

/* *t (uint8 [H, W(, C)]) cut to the rectangle pick chooses. */
static tp_status_t s_cut(tp_tensor_t *t, tp_image_pick_fn pick, void *user,
                         const char *name) {
    int H = (int)t->shape[0], W = (int)t->shape[1];
    size_t C = t->ndim == 3 ? (size_t)t->shape[2] : 1;
    int r[4];
    TP_TRY(s_pick(pick, user, H, W, name, r));
    if (r[2] == H && r[3] == W)
        return TP_OK;
    int64_t shape[3] = {r[2], r[3], (int64_t)C};
    tp_tensor_t o;
    TP_TRY(tp_tensor_init(&o, TP_UINT8, t->ndim, shape));
    for (int y = 0; y < r[2]; y++)
        memcpy((uint8_t *)o.data + (size_t)y * r[3] * C,
               (const uint8_t *)t->data + ((size_t)(r[0] + y) * W + r[1]) * C, (size_t)r[3] * C);
    tp_tensor_fini(t);
    tp_tensor_move(t, &o);
    return TP_OK;
}

/* libjpeg's errors and warnings end the decode (as TJFLAG_STOPONWARNING):
 * back to the setjmp with the message. */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} s_jerr_t;

static void s_jerr_exit(j_common_ptr c) {
    s_jerr_t *e = (s_jerr_t *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

static void s_jerr_emit(j_common_ptr c, int level) {
    if (level < 0)  /* a warning: corrupt data */
        s_jerr_exit(c);
}

/* The rows and columns of rectangle r (of the image decoded at scale
 * num/den, sw x sh, dch channels) and no more than a margin around them:
 * libjpeg-turbo's jpeg_crop_scanline (whole iMCU columns) and
 * jpeg_skip_scanlines (no IDCT or colour conversion above), and nothing
 * below. The margin (32 pixels, two iMCUs at the largest sampling) keeps
 * the edges of the decoded band, where the upsampling has no neighbours,
 * out of the rectangle: its pixels are the whole decode's, byte for byte
 * (test image::a_region_decodes_as_the_whole_image_cut). */
static tp_status_t s_jpeg_band(const uint8_t *p, size_t n, int num, int den, int dch,
                               const int r[4], const char *name, tp_tensor_t *out) {
    enum { MARGIN = 32 };
    struct jpeg_decompress_struct d;
    s_jerr_t e;
    memset(&d, 0, sizeof d);
    d.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = s_jerr_exit;
    e.pub.emit_message = s_jerr_emit;
    e.msg[0] = '\0';
    /* Set before setjmp and read after a longjmp: volatile. */
    uint8_t *volatile row = NULL;
    volatile int made = 0;
    if (setjmp(e.jb)) {
        jpeg_destroy_decompress(&d);
        free(row);
        if (made)
            tp_tensor_fini(out);
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated JPEG: %s",
                        s_nm(name), e.msg);
    }
    jpeg_create_decompress(&d);
    jpeg_mem_src(&d, p, (unsigned long)n);
    jpeg_read_header(&d, TRUE);
    d.scale_num = (unsigned)num;
    d.scale_denom = (unsigned)den;
    d.out_color_space = dch == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&d);
    int W = (int)d.output_width;
    int x0 = r[1] - MARGIN > 0 ? r[1] - MARGIN : 0;
    int x1 = r[1] + r[3] + MARGIN < W ? r[1] + r[3] + MARGIN : W;
    JDIMENSION cx = (JDIMENSION)x0, cw = (JDIMENSION)(x1 - x0);
    if (cw < (JDIMENSION)W)
        jpeg_crop_scanline(&d, &cx, &cw);
    row = malloc((size_t)cw * (size_t)dch);
    int64_t shape[3] = {r[2], r[3], dch};
    if (!row || tp_tensor_init(out, TP_UINT8, dch == 1 ? 2 : 3, shape) != TP_OK) {
        jpeg_destroy_decompress(&d);
        free(row);
        return tp_error(TP_ERR_NOMEM, "image %s: %dx%d region", s_nm(name), r[2], r[3]);
    }
    made = 1;
    int y0 = r[0] - MARGIN > 0 ? r[0] - MARGIN : 0;
    if (y0 > 0)
        jpeg_skip_scanlines(&d, (JDIMENSION)y0);
    size_t off = (size_t)(r[1] - (int)cx) * (size_t)dch, len = (size_t)r[3] * (size_t)dch;
    while ((int)d.output_scanline < r[0] + r[2]) {
        int y = (int)d.output_scanline;
        JSAMPROW rp = row;
        if (jpeg_read_scanlines(&d, &rp, 1) != 1)
            s_jerr_exit((j_common_ptr)&d);  /* no row: the data ran out */
        if (y >= r[0])
            memcpy((uint8_t *)out->data + (size_t)(y - r[0]) * len, row + off, len);
    }
    jpeg_abort_decompress(&d);  /* the rows below are not wanted */
    jpeg_destroy_decompress(&d);
    free(row);
    return TP_OK;
}

static tp_status_t s_jpeg(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                          const char *name, tp_image_pick_fn pick, void *user,
                          tp_tensor_t *out) {
    if (n > 0xFFFFFFFFu)
        return tp_error(TP_ERR_SHAPE, "image %s: %zu bytes is too large",
                        s_nm(name), n);
    tjhandle h = s_handle(0);
    if (!h)
        return tp_error(TP_ERR_NOMEM, "image %s: TurboJPEG: %s", s_nm(name),
                        tjGetErrorStr2(NULL));
    int w = 0, hh = 0, sub = 0, cs = 0;
    if (tjDecompressHeader3(h, p, (unsigned long)n, &w, &hh, &sub, &cs) != 0)
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt JPEG: %s",
                        s_nm(name), tjGetErrorStr2(h));
    if (w < 1 || hh < 1 || (int64_t)w * hh > o->max_pixels)
        return tp_error(TP_ERR_SHAPE, "image %s: JPEG of %dx%d pixels (limit "
                        "%lld pixels)", s_nm(name), w, hh,
                        (long long)o->max_pixels);
    int grey = cs == TJCS_GRAY;
    int want = o->mode == TP_IMAGE_ANY ? (grey ? 1 : 3) : (int)o->mode;
    /* Luma straight from the decoder for grey output (as OpenCV's
     * IMREAD_GRAYSCALE): no colour conversion at all. */
    int dch = want == 1 ? 1 : 3;
    int sw = w, sh = hh, num = 1, den = 1;
    if (o->min_short > 0) {
        int nsf = 0;
        tjscalingfactor *sf = tjGetScalingFactors(&nsf);
        /* the smallest scale whose short side still reaches min_short */
        int best = -1;
        for (int i = 0; sf && i < nsf; i++) {
            /* 1/2, 1/4, 1/8 only (PIL's draft scales): the other eighths
             * (3/8, 5/8, 7/8) run libjpeg-turbo's generic scaled IDCT and
             * plain upsampling, slower than the whole image's SIMD decode
             * (docs/performance.md, issue 43) */
            if (sf[i].num != 1 || (sf[i].denom != 1 && sf[i].denom != 2 &&
                                   sf[i].denom != 4 && sf[i].denom != 8))
                continue;
            int tw = TJSCALED(w, sf[i]), th = TJSCALED(hh, sf[i]);
            int s = tw < th ? tw : th;
            if (s >= o->min_short && (best < 0 || tw < sw)) {
                best = i;
                sw = tw;
                sh = th;
                num = sf[i].num;
                den = sf[i].denom;
            }
        }
        if (best < 0) {
            sw = w;
            sh = hh;
            num = den = 1;
        }
    }
    /* A region of a colour or grey JPEG that needs no rotation: decode
     * only its band; else decode whole, then cut (below). */
    if (pick && (cs == TJCS_RGB || cs == TJCS_YCbCr || cs == TJCS_GRAY) &&
        !(o->exif && s_exif_orientation(p, n) > 1)) {
        int r[4];
        TP_TRY(s_pick(pick, user, sh, sw, name, r));
        TP_TRY(s_jpeg_band(p, n, num, den, dch, r, name, out));
        tp_status_t rc = s_convert(out, dch, want);
        if (rc != TP_OK)
            tp_tensor_fini(out);
        return rc;
    }
    /* CMYK and YCCK (Photoshop's "CMYK" JPEGs): libjpeg-turbo gives
     * CMYK, PIL's conversion makes it RGB (s_cmyk_rgb) */
    int cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    if (cmyk)
        dch = 4;
    int64_t shape[3] = {sh, sw, dch};
    TP_TRY(tp_tensor_init(out, TP_UINT8, dch == 1 ? 2 : 3, shape));
    /* Warnings (a truncated file, corrupt data) stop the decode: a damaged
     * image is an error, not a half-grey picture. */
    if (tjDecompress2(h, p, (unsigned long)n, out->data, sw, 0, sh,
                      cmyk ? TJPF_CMYK : dch == 1 ? TJPF_GRAY : TJPF_RGB,
                      TJFLAG_STOPONWARNING) != 0) {
        tp_tensor_fini(out);
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated JPEG: "
                        "%s", s_nm(name), tjGetErrorStr2(h));
    }
    tp_status_t rc = cmyk ? s_cmyk_rgb(out) : TP_OK;
    if (cmyk)
        dch = 3;
    if (rc == TP_OK && o->exif)
        rc = s_orient(out, s_exif_orientation(p, n));
    if (rc == TP_OK)
        rc = s_convert(out, dch, want);
    if (rc == TP_OK && pick)
        rc = s_cut(out, pick, user, name);
    if (rc != TP_OK)
        tp_tensor_fini(out);
    return rc;
}

/* ---- PNG ---------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    size_t n, off;
    char msg[160];
} png_src_t;

static void s_png_read(png_structp png, png_bytep buf, png_size_t len) {
    png_src_t *s = png_get_io_ptr(png);
    if (len > s->n - s->off)
        png_error(png, "truncated file");
    memcpy(buf, s->p + s->off, len);
    s->off += len;
}

static void s_png_err(png_structp png, png_const_charp msg) {
    png_src_t *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void s_png_warn(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static tp_status_t s_png(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                         const char *name, tp_tensor_t *out) {
    png_src_t src = {.p = p, .n = n};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src,
                                             s_png_err, s_png_warn);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return tp_error(TP_ERR_NOMEM, "image %s: libpng", s_nm(name));
    }
    /* Set before setjmp and read after a longjmp: volatile. */
    png_bytep *volatile rows = NULL;
    tp_tensor_t *volatile res = out;
    tp_tensor_init_empty(out);
    if (setjmp(png_jmpbuf(png))) {
        free(rows);
        tp_tensor_fini(res);
        png_destroy_read_struct(&png, &info, NULL);
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated PNG: "
                        "%s", s_nm(name), src.msg);
    }
    png_set_read_fn(png, &src, s_png_read);
    /* Our own pixel limit is checked below; libpng's own stays as a
     * second line (1M x 1M by default). */
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info);
    png_uint_32 h = png_get_image_height(png, info);
    if (w < 1 || h < 1 || (int64_t)w * (int64_t)h > o->max_pixels) {
        png_destroy_read_struct(&png, &info, NULL);
        return tp_error(TP_ERR_SHAPE, "image %s: PNG of %ux%u pixels (limit "
                        "%lld pixels)", s_nm(name), (unsigned)w, (unsigned)h,
                        (long long)o->max_pixels);
    }
    int ct = png_get_color_type(png, info);
    /* 8 bits per channel, palettes and low-bit grey expanded, tRNS as an
     * alpha channel, 16-bit samples cut to their high byte (as PIL). */
    png_set_expand(png);
    png_set_strip_16(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int c = png_get_channels(png, info);
    (void)ct;
    if (c < 1 || c > 4 || png_get_rowbytes(png, info) != (size_t)w * c) {
        png_destroy_read_struct(&png, &info, NULL);
        return tp_error(TP_ERR_FORMAT, "image %s: PNG with %d channels",
                        s_nm(name), c);
    }
    int64_t shape[3] = {h, w, c};
    if (tp_tensor_init(out, TP_UINT8, c == 1 ? 2 : 3, shape) != TP_OK ||
        !(rows = malloc(h * sizeof *rows))) {
        tp_tensor_fini(out);
        png_destroy_read_struct(&png, &info, NULL);
        return tp_error(TP_ERR_NOMEM, "image %s: %ux%u pixels", s_nm(name),
                        (unsigned)w, (unsigned)h);
    }
    for (png_uint_32 y = 0; y < h; y++)
        rows[y] = (uint8_t *)out->data + (size_t)y * w * c;
    png_read_image(png, rows);
    /* the chunks after the pixels up to IEND, CRCs checked: a file cut
     * short anywhere is an error, as PIL's verify() would say */
    png_read_end(png, NULL);
    free(rows);
    png_destroy_read_struct(&png, &info, NULL);
    int want = o->mode != TP_IMAGE_ANY ? (int)o->mode
               : c == 1            ? 1
               : c == 3            ? 3
                                   : 4;  /* grey+alpha and RGBA */
    tp_status_t rc = s_convert(out, c, want);
    if (rc != TP_OK)
        tp_tensor_fini(out);
    return rc;
}

/* ---- entry points ------------------------------------------------------------- */

static tp_status_t s_decode(const void *data, size_t size, const tp_image_opts_t *opts,
                           const char *name, tp_image_pick_fn pick, void *user,
                           tp_tensor_t *out) {
    tp_image_opts_t def;
    if (!opts) {
        tp_image_opts_init(&def);
        opts = &def;
    }
    tp_tensor_init_empty(out);
    if (opts->mode != TP_IMAGE_ANY && opts->mode != TP_IMAGE_GREY &&
        opts->mode != TP_IMAGE_RGB && opts->mode != TP_IMAGE_RGBA)
        return tp_error(TP_ERR_INVALID, "image %s: mode %d (0, 1, 3 or 4)",
                        s_nm(name), (int)opts->mode);
    const uint8_t *p = data;
    if (size == 0)
        return tp_error(TP_ERR_FORMAT, "image %s: empty file (0 bytes)",
                        s_nm(name));
    if (size >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF)
        return s_jpeg(p, size, opts, name, pick, user, out);
    if (size >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8)) {
        TP_TRY(s_png(p, size, opts, name, out));
        tp_status_t rc = pick ? s_cut(out, pick, user, name) : TP_OK;
        if (rc != TP_OK)
            tp_tensor_fini(out);
        return rc;
    }
    /* WebP, TIFF, BMP, PGM/PPM (img_formats.c): the image's own channels,
     * then the same conversion and cut as a PNG's */
    img_decode_fn fn = img_format_by_magic(p, size);
    if (!fn)
        return tp_error(TP_ERR_FORMAT, "image %s: not a JPEG, PNG, WebP, TIFF, "
                        "BMP, PGM or PPM file (the first bytes are no such "
                        "format's signature)", s_nm(name));
    int orient = 1;
    TP_TRY(fn(p, size, opts, name, out, &orient));
    int c = out->ndim == 3 ? (int)out->shape[2] : 1;
    int want = opts->mode != TP_IMAGE_ANY ? (int)opts->mode
               : c == 1 || c == 3         ? c
                                          : 4;  /* grey+alpha and RGBA */
    /* a TIFF's Orientation tag, as PIL turns it on open (exif_transpose's
     * turns), before the cut: the rectangle is picked in the upright image */
    tp_status_t rc = s_orient(out, orient);
    if (rc == TP_OK)
        rc = s_convert(out, c, want);
    if (rc == TP_OK && pick)
        rc = s_cut(out, pick, user, name);
    if (rc != TP_OK)
        tp_tensor_fini(out);
    return rc;
}

tp_status_t tp_image_decode(const void *data, size_t size,
                            const tp_image_opts_t *opts, const char *name,
                            tp_tensor_t *out) {
    return s_decode(data, size, opts, name, NULL, NULL, out);
}

tp_status_t tp_image_decode_region(const void *data, size_t size,
                                   const tp_image_opts_t *opts, const char *name,
                                   tp_image_pick_fn pick, void *user, tp_tensor_t *out) {
    return s_decode(data, size, opts, name, pick, user, out);
}

tp_status_t tp_image_read(const char *path, const tp_image_opts_t *opts,
                          tp_tensor_t *out) {
    return tp_image_read_region(path, opts, NULL, NULL, out);
}

tp_status_t tp_image_read_region(const char *path, const tp_image_opts_t *opts,
                                 tp_image_pick_fn pick, void *user, tp_tensor_t *out) {
    tp_tensor_init_empty(out);
    FILE *f;
    int64_t size;
    TP_TRY(df_open_regular("image", path, &f, &size));
    /* One read of the size fstat gave, plus one byte to see the end: no
     * copy, no growing buffer (a file that grows meanwhile is read on). */
    size_t cap = (size_t)size + 1, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return tp_error(TP_ERR_NOMEM, "image %s", path);
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        uint8_t *nb = realloc(buf, cap * 2);
        if (!nb)
            free(buf);
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return tp_error(TP_ERR_IO, "image %s: read error", path);
    }
    tp_status_t rc = s_decode(buf, n, opts, path, pick, user, out);
    free(buf);
    return rc;
}

/* ---- encoders ------------------------------------------------------------------- */

static tp_status_t s_img_geom(const tp_tensor_t *img, const char *who, int *h,
                              int *w, int *c) {
    if (img->dtype != TP_UINT8 || (img->ndim != 2 && img->ndim != 3) ||
        img->shape[0] < 1 || img->shape[1] < 1 || img->shape[0] > 65535 ||
        img->shape[1] > 65535)
        return tp_error(TP_ERR_SHAPE, "%s: expected a uint8 HW or HWC image "
                        "of at most 65535 x 65535", who);
    *h = (int)img->shape[0];
    *w = (int)img->shape[1];
    *c = img->ndim == 3 ? (int)img->shape[2] : 1;
    return TP_OK;
}

tp_status_t tp_image_encode_jpeg(const tp_tensor_t *img, int quality,
                                 void **data, size_t *size) {
    int h = 0, w = 0, c = 0;
    TP_TRY(s_img_geom(img, "encode JPEG", &h, &w, &c));
    if (c != 1 && c != 3)
        return tp_error(TP_ERR_SHAPE, "encode JPEG: %d channels (1 or 3)", c);
    if (quality < 1 || quality > 100)
        return tp_error(TP_ERR_INVALID, "encode JPEG: quality %d (1..100)",
                        quality);
    tjhandle hd = s_handle(1);
    if (!hd)
        return tp_error(TP_ERR_NOMEM, "encode JPEG: TurboJPEG");
    unsigned char *buf = NULL;
    unsigned long len = 0;
    if (tjCompress2(hd, img->data, w, 0, h, c == 1 ? TJPF_GRAY : TJPF_RGB,
                    &buf, &len, c == 1 ? TJSAMP_GRAY : TJSAMP_420, quality,
                    0) != 0) {
        tjFree(buf);
        return tp_error(TP_ERR_FORMAT, "encode JPEG: %s", tjGetErrorStr2(hd));
    }
    /* hand back a malloc'ed copy: callers free() it */
    *data = malloc(len ? len : 1);
    if (!*data) {
        tjFree(buf);
        return tp_error(TP_ERR_NOMEM, "encode JPEG");
    }
    memcpy(*data, buf, len);
    *size = len;
    tjFree(buf);
    return TP_OK;
}

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} png_dst_t;

static void s_png_write(png_structp png, png_bytep buf, png_size_t len) {
    png_dst_t *d = png_get_io_ptr(png);
    if (d->n + len > d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4096;
        while (nc < d->n + len)
            nc *= 2;
        uint8_t *np = realloc(d->p, nc);
        if (!np) {
            d->oom = 1;
            png_error(png, "out of memory");
        }
        d->p = np;
        d->cap = nc;
    }
    memcpy(d->p + d->n, buf, len);
    d->n += len;
}

static void s_png_flush(png_structp png) { (void)png; }

/* The header and rows of img (checked by the caller); libpng's errors
 * longjmp out to the caller's setjmp. */
static void s_png_write_image(png_structp png, png_infop info,
                              const tp_tensor_t *img) {
    int h = (int)img->shape[0], w = (int)img->shape[1];
    int c = img->ndim == 3 ? (int)img->shape[2] : 1;
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8,
                 c == 1 ? PNG_COLOR_TYPE_GRAY
                 : c == 3 ? PNG_COLOR_TYPE_RGB
                          : PNG_COLOR_TYPE_RGB_ALPHA,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++)
        png_write_row(png, (png_const_bytep)img->data + (size_t)y * w * c);
    png_write_end(png, NULL);
}

tp_status_t tp_image_encode_png(const tp_tensor_t *img, void **data,
                                size_t *size) {
    int h = 0, w = 0, c = 0;
    TP_TRY(s_img_geom(img, "encode PNG", &h, &w, &c));
    if (c != 1 && c != 3 && c != 4)
        return tp_error(TP_ERR_SHAPE, "encode PNG: %d channels (1, 3 or 4)",
                        c);
    png_src_t err = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &err,
                                              s_png_err, s_png_warn);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        return tp_error(TP_ERR_NOMEM, "encode PNG");
    }
    png_dst_t dst = {0};
    png_dst_t *volatile dp = &dst;
    if (setjmp(png_jmpbuf(png))) {
        free(dp->p);
        png_destroy_write_struct(&png, &info);
        return tp_error(TP_ERR_NOMEM, "encode PNG: %s", err.msg);
    }
    png_set_write_fn(png, &dst, s_png_write, s_png_flush);
    s_png_write_image(png, info, img);
    png_destroy_write_struct(&png, &info);
    *data = dst.p;
    *size = dst.n;
    return TP_OK;
}
