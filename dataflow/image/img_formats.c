/* towerpack dataflow/image: WebP, TIFF, BMP and PGM/PPM decoding, the rest
 * of torchvision's IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif
 * .tiff .webp), so a photo folder ImageFolder reads is read here too.
 *
 * Pixels come from maintained libraries: libwebp (WebP, lossy and
 * lossless), libtiff (TIFF), stb_image from Debian's libstb-dev (16, 24
 * and 32-bit BMP and binary PNM, compiled in img_stb.c with only those
 * two readers). Ours: palette BMPs (their rows of 1, 4 or 8-bit indices
 * here, run-length coded ones in img_bmp_rle.c) and 32-bit BMPs whose
 * masks are all 0, coloured as PIL colours them; the checks made before
 * any pixel buffer (the pixel limit, and
 * for BMP and PNM the pixel data's length against the file's, since
 * stb_image reads past the end of a BMP as zeros), the refusals with
 * their reasons, and the channel layout PIL gives, so that
 * Image.open(f).convert('RGB') and these agree (tests/dataflow/
 * test_proc_image.c). */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tiffio.h>
#include <webp/decode.h>
#include <webp/demux.h>
#include "dataflow/df_internal.h"
#include "dataflow/image/img_formats.h"


static const char *s_nm(const char *name) { return name ? name : "(memory)"; }

/* The pixel limit, checked before anything is allocated. */
static tp_status_t s_limit(const char *fmt, int64_t w, int64_t h,
                           const tp_image_opts_t *o, const char *name) {
    if (w < 1 || h < 1 || w * h > o->max_pixels)
        return tp_error(TP_ERR_SHAPE, "image %s: %s of %lldx%lld pixels (limit "
                        "%lld pixels)", s_nm(name), fmt, (long long)w,
                        (long long)h, (long long)o->max_pixels);
    return TP_OK;
}

static tp_status_t s_alloc(tp_tensor_t *out, int64_t h, int64_t w, int c,
                           const char *name) {
    int64_t shape[3] = {h, w, c};
    if (tp_tensor_init(out, TP_UINT8, c == 1 ? 2 : 3, shape) != TP_OK)
        return tp_error(TP_ERR_NOMEM, "image %s: %lldx%lld pixels", s_nm(name),
                        (long long)w, (long long)h);
    return TP_OK;
}

img_decode_fn img_format_by_magic(const uint8_t *p, size_t n) {
    if (n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4))
        return img_decode_webp;
    /* little- and big-endian TIFF, and BigTIFF (43) */
    if (n >= 4 && ((p[0] == 'I' && p[1] == 'I' && (p[2] == 42 || p[2] == 43) &&
                    p[3] == 0) ||
                   (p[0] == 'M' && p[1] == 'M' && p[2] == 0 &&
                    (p[3] == 42 || p[3] == 43))))
        return img_decode_tiff;
    if (n >= 2 && p[0] == 'B' && p[1] == 'M')
        return img_decode_bmp;
    if (n >= 3 && p[0] == 'P' && p[1] >= '1' && p[1] <= '7' &&
        (p[2] == ' ' || p[2] == '\t' || p[2] == '\n' || p[2] == '\r'))
        return img_decode_pnm;
    return NULL;
}

/* ---- WebP ------------------------------------------------------------------ */

static const char *s_webp_status(VP8StatusCode st) {
    switch (st) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "the data ends early";
    default: return "error";
    }
}

/* An animated WebP's first frame, as PIL's Image.open gives it: libwebp's
 * animation decoder (libwebpdemux) composes it on the canvas; RGBA, cut
 * to RGB when the file has no alpha. */
static tp_status_t s_webp_anim(const uint8_t *p, size_t n, int w, int h, int c,
                               const char *name, tp_tensor_t *out) {
    WebPAnimDecoderOptions ao;
    if (!WebPAnimDecoderOptionsInit(&ao))
        return tp_error(TP_ERR_UNSUPPORTED, "image %s: libwebpdemux's ABI does "
                        "not match its header", s_nm(name));
    ao.color_mode = MODE_RGBA;
    ao.use_threads = 0;
    WebPData wd = {p, n};
    WebPAnimDecoder *dec = WebPAnimDecoderNew(&wd, &ao);
    WebPAnimInfo ai;
    uint8_t *frame = NULL;
    int ts = 0;
    if (!dec || !WebPAnimDecoderGetInfo(dec, &ai) || (int)ai.canvas_width != w ||
        (int)ai.canvas_height != h || !WebPAnimDecoderGetNext(dec, &frame, &ts)) {
        WebPAnimDecoderDelete(dec);
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated animated "
                        "WebP", s_nm(name));
    }
    tp_status_t rc = s_alloc(out, h, w, c, name);
    if (rc == TP_OK) {
        uint8_t *d = out->data;
        for (size_t i = 0, np = (size_t)w * h; i < np; i++, d += c)
            memcpy(d, frame + i * 4, (size_t)c);
    }
    WebPAnimDecoderDelete(dec);
    return rc;
}

/* Lossy and lossless alike through libwebp's WebPDecode into our buffer:
 * RGB, or RGBA when the file has alpha (dropped later for an RGB folder,
 * as PIL's convert('RGB')); an animation's first frame (s_webp_anim). */
tp_status_t img_decode_webp(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                            const char *name, tp_tensor_t *out, int *orient) {
    *orient = 1;
    tp_tensor_init_empty(out);
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg))
        return tp_error(TP_ERR_UNSUPPORTED, "image %s: libwebp's decoder ABI "
                        "does not match its header", s_nm(name));
    VP8StatusCode st = WebPGetFeatures(p, n, &cfg.input);
    if (st != VP8_STATUS_OK)
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated WebP: %s",
                        s_nm(name), s_webp_status(st));
    int w = cfg.input.width, h = cfg.input.height;
    TP_TRY(s_limit("WebP", w, h, o, name));
    int c = cfg.input.has_alpha ? 4 : 3;
    if (cfg.input.has_animation)
        return s_webp_anim(p, n, w, h, c, name, out);
    TP_TRY(s_alloc(out, h, w, c, name));
    cfg.output.colorspace = c == 4 ? MODE_RGBA : MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = out->data;
    cfg.output.u.RGBA.stride = w * c;
    cfg.output.u.RGBA.size = out->nbytes;
    st = WebPDecode(p, n, &cfg);
    WebPFreeDecBuffer(&cfg.output);  /* nothing of its own: our buffer */
    if (st != VP8_STATUS_OK) {
        tp_tensor_fini(out);
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated WebP: %s",
                        s_nm(name), s_webp_status(st));
    }
    return TP_OK;
}

/* ---- TIFF -------------------------------------------------------------------- */

/* The file in memory, as libtiff's client I/O, with libtiff's messages
 * caught per handle (TIFFOpenOptions, libtiff 4.5: no global handler, so
 * threads decoding at once keep their own). */
typedef struct {
    const uint8_t *p;
    size_t n, off;
    char msg[200];
} tif_src_t;

static tmsize_t s_tif_read(thandle_t h, void *buf, tmsize_t len) {
    tif_src_t *s = h;
    if (len < 0 || s->off >= s->n)
        return 0;
    size_t k = (size_t)len < s->n - s->off ? (size_t)len : s->n - s->off;
    memcpy(buf, s->p + s->off, k);
    s->off += k;
    return (tmsize_t)k;
}

static tmsize_t s_tif_write(thandle_t h, void *buf, tmsize_t len) {
    (void)h;
    (void)buf;
    (void)len;
    return -1;
}

static toff_t s_tif_seek(thandle_t h, toff_t off, int whence) {
    tif_src_t *s = h;
    int64_t base = whence == SEEK_CUR ? (int64_t)s->off
                   : whence == SEEK_END ? (int64_t)s->n : 0;
    /* beyond the end is allowed (a read there gets nothing), before the
     * start or past 2^62 is not */
    int64_t d = (int64_t)off;
    if ((whence == SEEK_SET && d < 0) || d > ((int64_t)1 << 62) ||
        d < -((int64_t)1 << 62) || base + d < 0)
        return (toff_t)-1;
    s->off = (size_t)(base + d);
    return (toff_t)s->off;
}

static int s_tif_close(thandle_t h) {
    (void)h;
    return 0;
}

static toff_t s_tif_size(thandle_t h) { return ((tif_src_t *)h)->n; }

static int s_tif_map(thandle_t h, void **base, toff_t *size) {
    tif_src_t *s = h;
    *base = (void *)s->p;
    *size = s->n;
    return 1;
}

static void s_tif_unmap(thandle_t h, void *base, toff_t size) {
    (void)h;
    (void)base;
    (void)size;
}

static int s_tif_err(TIFF *tif, void *user, const char *module, const char *fmt,
                     va_list ap) {
    (void)tif;
    tif_src_t *s = user;
    if (!s->msg[0]) {  /* the first error is the cause */
        int k = snprintf(s->msg, sizeof s->msg, "%s: ", module ? module : "libtiff");
        if (k > 0 && (size_t)k < sizeof s->msg)
            vsnprintf(s->msg + k, sizeof s->msg - (size_t)k, fmt, ap);
    }
    return 1;  /* handled: nothing on stderr */
}

static int s_tif_warn(TIFF *tif, void *user, const char *module, const char *fmt,
                      va_list ap) {
    (void)tif;
    (void)user;
    (void)module;
    (void)fmt;
    (void)ap;
    return 1;
}

/* The 8-bit strip layouts PIL reads byte for byte, row by row
 * (TIFFReadScanline, any compression libtiff has): grey (min-is-black or
 * min-is-white, with an alpha sample or not), RGB, RGBA, 8-bit palette
 * (its 16-bit colour map cut to the high byte, as PIL does), CMYK (made
 * RGB by PIL's cmyk2rgb: libtiff's RGBA interface rounds down where PIL
 * rounds, 1 apart) and 1-bit black and white. *c is the channels given. */
static tp_status_t s_tif_rows(TIFF *tif, tif_src_t *src, uint32_t w, uint32_t h,
                              uint16_t bps, uint16_t spp, uint16_t photo,
                              const char *name, tp_tensor_t *out) {
    int grey = photo == PHOTOMETRIC_MINISBLACK || photo == PHOTOMETRIC_MINISWHITE;
    int cmyk = photo == PHOTOMETRIC_SEPARATED;
    int c = photo == PHOTOMETRIC_PALETTE || cmyk ? 3 : spp;
    uint16_t *cmap[3] = {NULL, NULL, NULL};
    if (photo == PHOTOMETRIC_PALETTE &&
        !TIFFGetField(tif, TIFFTAG_COLORMAP, &cmap[0], &cmap[1], &cmap[2]))
        return tp_error(TP_ERR_FORMAT, "image %s: palette TIFF without a colour "
                        "map%s%s", s_nm(name), src->msg[0] ? ": " : "", src->msg);
    tmsize_t line = TIFFScanlineSize(tif);
    size_t want = bps == 1 ? ((size_t)w + 7) / 8 : (size_t)w * spp;
    if (line <= 0 || (size_t)line < want)
        return tp_error(TP_ERR_FORMAT, "image %s: TIFF row of %lld bytes for %u "
                        "pixels", s_nm(name), (long long)line, (unsigned)w);
    uint8_t *row = malloc((size_t)line);
    if (!row)
        return tp_error(TP_ERR_NOMEM, "image %s: TIFF row", s_nm(name));
    tp_status_t rc = s_alloc(out, h, w, c, name);
    for (uint32_t y = 0; rc == TP_OK && y < h; y++) {
        if (TIFFReadScanline(tif, row, y, 0) < 0) {
            tp_tensor_fini(out);
            rc = tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated TIFF "
                          "(row %u): %s", s_nm(name), (unsigned)y,
                          src->msg[0] ? src->msg : "no data");
            break;
        }
        uint8_t *d = (uint8_t *)out->data + (size_t)y * w * c;
        if (bps == 1) {  /* grey, one bit a pixel, high bit first */
            for (uint32_t x = 0; x < w; x++) {
                int on = (row[x >> 3] >> (7 - (x & 7))) & 1;
                d[x] = (uint8_t)((on ^ (photo == PHOTOMETRIC_MINISWHITE)) ? 255 : 0);
            }
        } else if (cmyk) {
            /* PIL's cmyk2rgb: r = (255-k) - c(255-k)/255, the product
             * rounded as its MULDIV255; a fifth sample (CMYKX) dropped,
             * as PIL's CMYK mode has none */
            for (uint32_t x = 0; x < w; x++) {
                const uint8_t *s = row + (size_t)x * spp;
                unsigned nk = 255u - s[3];
                for (int k = 0; k < 3; k++) {
                    unsigned t = s[k] * nk + 128u;
                    d[x * 3 + k] = (uint8_t)(nk - (((t >> 8) + t) >> 8));
                }
            }
        } else if (photo == PHOTOMETRIC_PALETTE) {
            for (uint32_t x = 0; x < w; x++)
                for (int k = 0; k < 3; k++)
                    d[x * 3 + k] = (uint8_t)(cmap[k][row[x]] >> 8);
        } else {
            memcpy(d, row, (size_t)w * c);
            if (grey && photo == PHOTOMETRIC_MINISWHITE)
                for (uint32_t x = 0; x < w; x++)
                    d[x * c] = (uint8_t)(255 - d[x * c]);
        }
    }
    free(row);
    return rc;
}

/* Everything else of 8 bits or fewer that libtiff's RGBA interface knows
 * (tiles, separate planes, YCbCr and JPEG-in-TIFF, tiled or separate-plane
 * CMYK (within 1 of PIL: libtiff rounds its product down), 2- and 4-bit
 * samples): TIFFReadRGBAImageOriented, stored row first. Grey stays grey;
 * alpha is kept as libtiff gives it. */
static tp_status_t s_tif_rgba(TIFF *tif, tif_src_t *src, uint32_t w, uint32_t h,
                              uint16_t spp, uint16_t photo, const char *name,
                              tp_tensor_t *out) {
    char emsg[1024] = "";
    if (!TIFFRGBAImageOK(tif, emsg))
        return tp_error(TP_ERR_FORMAT, "image %s: a TIFF towerpack cannot read: "
                        "%s (convert it to an 8-bit RGB or grey TIFF or PNG)",
                        s_nm(name), emsg);
    int grey = photo == PHOTOMETRIC_MINISBLACK || photo == PHOTOMETRIC_MINISWHITE;
    /* CMYK's extra sample too is no alpha: PIL opens CMYK plus one
     * unspecified sample as CMYK and refuses CMYK with alpha */
    int alpha = photo != PHOTOMETRIC_SEPARATED && spp > (grey ? 1 : 3);
    int c = grey ? (alpha ? 2 : 1) : (alpha ? 4 : 3);
    uint32_t *rgba = _TIFFmalloc((tmsize_t)((uint64_t)w * h * 4));
    if (!rgba)
        return tp_error(TP_ERR_NOMEM, "image %s: %ux%u pixels", s_nm(name),
                        (unsigned)w, (unsigned)h);
    /* the rows in the order they are stored, as the strip reader gives
     * them: asked for the file's own orientation, libtiff flips nothing
     * (both are turned alike afterwards, by img_codec.c) */
    uint16_t orient = ORIENTATION_TOPLEFT;
    TIFFGetFieldDefaulted(tif, TIFFTAG_ORIENTATION, &orient);
    if (orient < ORIENTATION_TOPLEFT || orient > ORIENTATION_LEFTBOT)
        orient = ORIENTATION_TOPLEFT;
    if (!TIFFReadRGBAImageOriented(tif, w, h, rgba, orient, 1)) {
        _TIFFfree(rgba);
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated TIFF: %s",
                        s_nm(name), src->msg[0] ? src->msg : "no data");
    }
    tp_status_t rc = s_alloc(out, h, w, c, name);
    if (rc == TP_OK) {
        uint8_t *d = out->data;
        for (size_t i = 0, np = (size_t)w * h; i < np; i++, d += c) {
            uint32_t v = rgba[i];
            d[0] = (uint8_t)TIFFGetR(v);
            if (!grey) {
                d[1] = (uint8_t)TIFFGetG(v);
                d[2] = (uint8_t)TIFFGetB(v);
            }
            if (alpha)
                d[c - 1] = (uint8_t)TIFFGetA(v);
        }
    }
    _TIFFfree(rgba);
    return rc;
}

/* The first page (directory) of a TIFF, as PIL's Image.open gives it,
 * turned by its Orientation tag as PIL turns it.
 * Refused, each by name: samples of more than 8 bits (16-bit scans, HDR),
 * floating-point or signed samples. */
tp_status_t img_decode_tiff(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                            const char *name, tp_tensor_t *out, int *orient) {
    *orient = 1;
    tp_tensor_init_empty(out);
    tif_src_t src = {.p = p, .n = n};
    TIFFOpenOptions *opts = TIFFOpenOptionsAlloc();
    if (!opts)
        return tp_error(TP_ERR_NOMEM, "image %s: libtiff", s_nm(name));
    TIFFOpenOptionsSetErrorHandlerExtR(opts, s_tif_err, &src);
    TIFFOpenOptionsSetWarningHandlerExtR(opts, s_tif_warn, &src);
    /* no single allocation beyond what the pixel limit allows (a corrupt
     * header claiming a huge strip is an error, not a huge malloc) */
    int64_t cap = o->max_pixels * 8 + ((int64_t)1 << 20);
    TIFFOpenOptionsSetMaxSingleMemAlloc(opts, (tmsize_t)cap);
    TIFF *tif = TIFFClientOpenExt(s_nm(name), "rm", &src, s_tif_read, s_tif_write,
                                  s_tif_seek, s_tif_close, s_tif_size, s_tif_map,
                                  s_tif_unmap, opts);
    TIFFOpenOptionsFree(opts);
    if (!tif)
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated TIFF: %s",
                        s_nm(name), src.msg[0] ? src.msg : "no header");
    uint32_t w = 0, h = 0;
    uint16_t bps = 1, spp = 1, photo = 0, planar = PLANARCONFIG_CONTIG,
             fmt = SAMPLEFORMAT_UINT, inks = INKSET_CMYK;
    tp_status_t rc = TP_OK;
    if (!TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &w) ||
        !TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &h))
        rc = tp_error(TP_ERR_FORMAT, "image %s: TIFF without a width or height",
                      s_nm(name));
    else
        rc = s_limit("TIFF", w, h, o, name);
    if (rc == TP_OK) {
        TIFFGetFieldDefaulted(tif, TIFFTAG_BITSPERSAMPLE, &bps);
        TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLESPERPIXEL, &spp);
        TIFFGetFieldDefaulted(tif, TIFFTAG_PLANARCONFIG, &planar);
        TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLEFORMAT, &fmt);
        TIFFGetFieldDefaulted(tif, TIFFTAG_INKSET, &inks);
        if (!TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &photo))
            photo = spp >= 3 ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK;
        if (bps > 8)
            rc = tp_error(TP_ERR_FORMAT, "image %s: a TIFF of %u-bit samples; "
                          "towerpack reads 8-bit TIFFs and fewer bits (convert "
                          "it to 8 bits: ImageMagick's mogrify -depth 8)",
                          s_nm(name), (unsigned)bps);
        else if (fmt != SAMPLEFORMAT_UINT)
            rc = tp_error(TP_ERR_FORMAT, "image %s: a TIFF of %s samples; "
                          "towerpack reads unsigned integer samples", s_nm(name),
                          fmt == SAMPLEFORMAT_IEEEFP ? "floating-point" : "signed");
    }
    if (rc == TP_OK) {
        int grey = photo == PHOTOMETRIC_MINISBLACK || photo == PHOTOMETRIC_MINISWHITE;
        int rows = !TIFFIsTiled(tif) && planar == PLANARCONFIG_CONTIG &&
                   ((bps == 8 && ((grey && (spp == 1 || spp == 2)) ||
                                  (photo == PHOTOMETRIC_RGB && (spp == 3 || spp == 4)) ||
                                  (photo == PHOTOMETRIC_PALETTE && spp == 1) ||
                                  (photo == PHOTOMETRIC_SEPARATED &&
                                   inks == INKSET_CMYK && (spp == 4 || spp == 5)))) ||
                    (bps == 1 && grey && spp == 1));
        rc = rows ? s_tif_rows(tif, &src, w, h, bps, spp, photo, name, out)
                  : s_tif_rgba(tif, &src, w, h, spp, photo, name, out);
    }
    /* the Orientation tag: PIL's Image.open applies it to a TIFF (unlike
     * a JPEG's EXIF orientation), so torchvision's loader sees it turned;
     * the caller turns the pixels */
    uint16_t ot = ORIENTATION_TOPLEFT;
    if (rc == TP_OK && TIFFGetFieldDefaulted(tif, TIFFTAG_ORIENTATION, &ot) &&
        ot > ORIENTATION_TOPLEFT && ot <= ORIENTATION_LEFTBOT)
        *orient = ot;
    TIFFClose(tif);
    return rc;
}

/* ---- BMP and PNM (stb_image) ------------------------------------------------- */

static uint32_t s_le32(const uint8_t *p) {
    return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t s_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* stb_image's pixels (req channels) into *out. */
static tp_status_t s_stb(const uint8_t *p, size_t n, int req, const char *fmt,
                         const char *name, tp_tensor_t *out) {
    int w = 0, h = 0;
    const char *why = NULL;
    uint8_t *px = img_stb_load(p, (int)n, req, &w, &h, &why);
    if (!px)
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or unsupported %s: %s",
                        s_nm(name), fmt, why ? why : "unknown");
    tp_status_t rc = s_alloc(out, h, w, req, name);
    if (rc == TP_OK)
        memcpy(out->data, px, out->nbytes);
    img_stb_free(px);
    return rc;
}

/* A palette BMP's colours as PIL has them (BmpImagePlugin): biClrUsed
 * entries of 4 bytes after the header (2^bpp when 0; an OS/2 header's
 * 2^bpp entries of 3 bytes), an index past them the grey (i, i, i) (PIL's
 * palette is the grey ramp where the file's ends; stb_image would read
 * its own uninitialised table there). grey: PIL's test, entry i is
 * (i, i, i), or black and white when there are two entries; PIL then
 * reads the indices as grey levels ("L", or "1"), which for 4 bits, or
 * 8 bits of two entries, misreads them (it unpacks 4-bit indices as
 * bytes); here the pixels are the palette's either way, in one grey
 * channel, as OpenCV gives them. *off moves past the palette when
 * bfOffBits points at it (PIL's rule). */
typedef struct {
    uint8_t rgb[256][3];
    int grey;
} s_bmp_pal_t;

static tp_status_t s_bmp_palette(const uint8_t *p, size_t n, uint32_t hs,
                                 unsigned bpp, const char *kind, const char *name,
                                 s_bmp_pal_t *pal, uint32_t *off) {
    size_t at = 14 + (size_t)hs, esz = hs == 12 ? 3 : 4;
    uint32_t colors = hs >= 40 && n >= 50 ? s_le32(p + 46) : 0;
    if (!colors)
        colors = 1u << bpp;
    if (colors > 256 || at + esz * colors > n)
        return tp_error(TP_ERR_FORMAT, "image %s: %s %s: a palette of %u "
                        "colours%s", s_nm(name), colors > 256 ? "corrupt" :
                        "truncated", kind, (unsigned)colors,
                        colors > 256 ? " (256 at most)" : " past the file's end");
    pal->grey = 1;
    for (unsigned i = 0; i < 256; i++) {
        uint8_t *c = pal->rgb[i];
        c[0] = c[1] = c[2] = (uint8_t)i;
        if (i >= colors)
            continue;
        const uint8_t *e = p + at + esz * i;  /* blue, green, red */
        c[0] = e[2], c[1] = e[1], c[2] = e[0];
        unsigned v = colors == 2 ? (i ? 255u : 0u) : i;
        if (e[0] != v || e[1] != v || e[2] != v)
            pal->grey = 0;
    }
    if (*off == at)
        *off += 4 * colors;
    return TP_OK;
}

/* The bits set in a bit-field mask (a BMP's 16- and 32-bit layouts). */
static int s_popcount(uint32_t m) {
    int k = 0;
    for (; m; m &= m - 1)
        k++;
    return k;
}

/* A 16-bit BMP's channels as PIL scales them: stb_image widens a field of
 * b bits by repeating its bits ((v << 3) | (v >> 2) for 5), PIL's unpacker
 * (BGR;15, BGR;16) by v * 255 / (2^b - 1) rounded down, up to 1 apart
 * (v = 16 of 5 bits: 132 and 131). The field's value is the widened
 * byte's top b bits, so a table per channel turns one into the other. */
static void s_bmp16_pil(const uint8_t *p, uint32_t comp, tp_tensor_t *out) {
    /* the masks: 5-5-5 without bit fields; with them, the three after
     * the 40-byte header, which is also where a V4 or V5 header has them */
    uint32_t mask[3] = {0x7C00, 0x03E0, 0x001F};
    if (comp == 3)
        for (int k = 0; k < 3; k++)
            mask[k] = s_le32(p + 54 + 4 * k);
    uint8_t lut[3][256];
    for (int k = 0; k < 3; k++) {
        int b = s_popcount(mask[k]);
        for (unsigned v = 0; v < 256; v++)
            lut[k][v] = b < 1 || b > 7 ? (uint8_t)v
                        : (uint8_t)((v >> (8 - b)) * 255u / ((1u << b) - 1));
    }
    uint8_t *d = out->data;
    for (size_t i = 0; i < out->nbytes; i++)
        d[i] = lut[i % 3][d[i]];
}

/* A BMP of palette indices: 1, 4 or 8 bits uncompressed, or run-length
 * coded (BI_RLE8 or BI_RLE4; img_bmp_rle.c reads its indices as PIL
 * does), coloured by its palette as PIL colours it (s_bmp_palette). */
static tp_status_t s_bmp_indexed(const uint8_t *p, size_t n, uint32_t hs,
                                 uint32_t off, int64_t w, int64_t h, int topdown,
                                 unsigned bpp, uint32_t comp, const char *name,
                                 tp_tensor_t *out) {
    const char *kind = comp == 1 ? "RLE8 BMP" : comp == 2 ? "RLE4 BMP" : "BMP";
    if (comp && bpp != (comp == 1 ? 8u : 4u))
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt BMP: %s compression "
                        "with %u bits a pixel (RLE8 is 8, RLE4 4)", s_nm(name),
                        comp == 1 ? "RLE8" : "RLE4", bpp);
    s_bmp_pal_t pal;
    TP_TRY(s_bmp_palette(p, n, hs, bpp, kind, name, &pal, &off));
    size_t stride = ((size_t)w * bpp + 31) / 32 * 4;
    if (!comp && (uint64_t)off + (uint64_t)stride * (uint64_t)h > n)
        return tp_error(TP_ERR_FORMAT, "image %s: truncated BMP: %llu bytes of "
                        "header and pixels, the file has %zu", s_nm(name),
                        (unsigned long long)off + (unsigned long long)stride * h, n);
    uint8_t *idx = malloc((size_t)w * (size_t)h);
    if (!idx)
        return tp_error(TP_ERR_NOMEM, "image %s: %lldx%lld pixels", s_nm(name),
                        (long long)w, (long long)h);
    tp_status_t rc = TP_OK;
    if (comp) {
        rc = img_bmp_rle(p, n, off, w, h, comp == 2, name, idx);
    } else {  /* rows of 1, 4 or 8 bits, the first pixel in the high bits */
        for (int64_t r = 0; r < h; r++) {
            const uint8_t *row = p + off + (size_t)r * stride;
            uint8_t *d = idx + (size_t)r * (size_t)w;
            for (int64_t x = 0; x < w; x++)
                d[x] = bpp == 8 ? row[x]
                       : bpp == 4 ? (uint8_t)(x & 1 ? row[x / 2] & 15 : row[x / 2] >> 4)
                                  : (uint8_t)(row[x / 8] >> (7 - x % 8) & 1);
        }
    }
    int c = pal.grey ? 1 : 3;
    if (rc == TP_OK)
        rc = s_alloc(out, h, w, c, name);
    if (rc == TP_OK) {
        uint8_t *d = out->data;
        for (int64_t r = 0; r < h; r++) {  /* r: the rows as stored */
            const uint8_t *s = idx + (size_t)r * (size_t)w;
            uint8_t *o = d + (size_t)(topdown ? r : h - 1 - r) * (size_t)w * c;
            for (int64_t x = 0; x < w; x++, o += c)
                memcpy(o, pal.rgb[s[x]], (size_t)c);
        }
    }
    free(idx);
    return rc;
}

/* Whether a 32-bit BMP with bit fields has all its masks 0 (three after
 * a 40-byte header, four in a longer one): PIL reads it as BGRA, the
 * layout of an uncompressed 32-bit BMP with its fourth byte as alpha. */
static int s_bmp_zero_masks(const uint8_t *p, size_t n, uint32_t hs) {
    size_t k = hs == 40 ? 3 : hs >= 56 ? 4 : 0;
    if (!k || n < 54 + 4 * k)
        return 0;
    for (size_t i = 0; i < k; i++)
        if (s_le32(p + 54 + 4 * i))
            return 0;
    return 1;
}

/* A 32-bit BMP as BGRA rows at off (the caller checked their length): RGBA. */
static tp_status_t s_bmp_bgra(const uint8_t *p, uint32_t off, int64_t w,
                              int64_t h, int topdown, const char *name,
                              tp_tensor_t *out) {
    TP_TRY(s_alloc(out, h, w, 4, name));
    for (int64_t r = 0; r < h; r++) {
        const uint8_t *s = p + off + (size_t)r * (size_t)w * 4;
        uint8_t *d = (uint8_t *)out->data +
                     (size_t)(topdown ? r : h - 1 - r) * (size_t)w * 4;
        for (int64_t x = 0; x < w; x++, s += 4, d += 4) {
            d[0] = s[2];
            d[1] = s[1];
            d[2] = s[0];
            d[3] = s[3];
        }
    }
    return TP_OK;
}

/* Windows bitmaps: 1, 4, 8-bit palette (read here, s_bmp_indexed), 16,
 * 24, 32-bit, rows bottom-up or top-down (negative height), uncompressed
 * or with bit fields. RGB, as
 * PIL opens them (a 32-bit BMP's fourth byte is padding to PIL, also in
 * a V4 or V5 header), except PIL's RGBA: a 32-bit BMP with bit fields in
 * a V4 or V5 header (108 or 124 bytes) whose alpha mask is not 0, the
 * BMPs with alpha that image editors save. The header is read here first:
 * the pixel limit, and the rows' bytes against the file's length, since
 * stb_image would read a file cut short as black rows. Run-length coded
 * ones (RLE8, RLE4) and 32-bit ones whose masks are all 0 (BGRA to PIL)
 * stb_image does not read: read here. Refused: JPEG or PNG inside. */
tp_status_t img_decode_bmp(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                           const char *name, tp_tensor_t *out, int *orient) {
    *orient = 1;
    tp_tensor_init_empty(out);
    if (n < 26 || n > INT_MAX)
        return tp_error(TP_ERR_FORMAT, "image %s: %s BMP (%zu bytes)", s_nm(name),
                        n < 26 ? "truncated" : "too large a", n);
    uint32_t off = s_le32(p + 10), hs = s_le32(p + 14), comp = 0;
    int64_t w, h;
    unsigned bpp;
    if (hs == 12) {  /* OS/2 1.x core header */
        w = s_le16(p + 18);
        h = s_le16(p + 20);
        bpp = s_le16(p + 24);
    } else if (hs >= 40 && n >= 34) {
        w = (int32_t)s_le32(p + 18);
        h = (int32_t)s_le32(p + 22);
        bpp = s_le16(p + 28);
        comp = s_le32(p + 30);
    } else {
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt BMP: a header of %u "
                        "bytes", s_nm(name), (unsigned)hs);
    }
    int topdown = h < 0;
    if (topdown)
        h = -h;
    TP_TRY(s_limit("BMP", w, h, o, name));
    if (comp == 1 || comp == 2)
        return s_bmp_indexed(p, n, hs, off, w, h, topdown, bpp, comp, name, out);
    if (comp != 0 && comp != 3 && comp != 6)
        return tp_error(TP_ERR_FORMAT, "image %s: a BMP of compression %u (JPEG "
                        "or PNG inside); towerpack reads uncompressed BMPs",
                        s_nm(name), (unsigned)comp);
    if (bpp != 1 && bpp != 4 && bpp != 8 && bpp != 16 && bpp != 24 && bpp != 32)
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt BMP: %u bits a pixel",
                        s_nm(name), bpp);
    if (bpp <= 8 && comp == 0)
        return s_bmp_indexed(p, n, hs, off, w, h, topdown, bpp, comp, name, out);
    uint64_t row = ((uint64_t)w * bpp + 31) / 32 * 4;
    uint64_t need = (uint64_t)off + row * (uint64_t)h;
    if (off < 26 || need > n)
        return tp_error(TP_ERR_FORMAT, "image %s: truncated BMP: %llu bytes of "
                        "header and pixels, the file has %zu", s_nm(name),
                        (unsigned long long)need, n);
    /* PIL reads the alpha mask from a V4 or V5 header only (a 40-byte
     * header's fourth byte is "reserved", not alpha); the masks start at
     * byte 54, inside the header */
    int alpha = bpp == 32 && comp == 3 && (hs == 108 || hs == 124) &&
                n >= 70 && s_le32(p + 66) != 0;
    if (bpp == 32 && comp == 3 && s_bmp_zero_masks(p, n, hs))
        return s_bmp_bgra(p, off, w, h, topdown, name, out);
    TP_TRY(s_stb(p, n, alpha ? 4 : 3, "BMP", name, out));
    if (bpp == 16 && hs >= 40 &&
        (comp == 0 || ((hs == 40 || hs == 108 || hs == 124) && n >= 66)))
        s_bmp16_pil(p, comp, out);
    return TP_OK;
}

/* One number of a PNM header, after blanks and # comments. */
static int s_pnm_num(const uint8_t *p, size_t n, size_t *i, uint64_t *v) {
    for (;;) {
        while (*i < n && (p[*i] == ' ' || p[*i] == '\t' || p[*i] == '\n' ||
                          p[*i] == '\r' || p[*i] == '\v' || p[*i] == '\f'))
            (*i)++;
        if (*i < n && p[*i] == '#') {
            while (*i < n && p[*i] != '\n' && p[*i] != '\r')
                (*i)++;
            continue;
        }
        break;
    }
    if (*i >= n || p[*i] < '0' || p[*i] > '9')
        return 0;
    for (*v = 0; *i < n && p[*i] >= '0' && p[*i] <= '9'; (*i)++)
        if ((*v = *v * 10 + (uint64_t)(p[*i] - '0')) > INT_MAX)
            return 0;
    return 1;
}

/* Netpbm's binary grey (P5, .pgm) and colour (P6, .ppm) maps of maxval
 * 255, the ones PIL writes and people's tools save. Refused by name: the
 * ASCII forms (P1-P3), bitmaps (P4), PAM (P7), other maxvals (PIL
 * rescales those; 16-bit ones it cuts). */
tp_status_t img_decode_pnm(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                           const char *name, tp_tensor_t *out, int *orient) {
    *orient = 1;
    tp_tensor_init_empty(out);
    char kind = (char)p[1];
    if (kind != '5' && kind != '6')
        return tp_error(TP_ERR_FORMAT, "image %s: a P%c netpbm file; towerpack "
                        "reads binary PGM (P5) and PPM (P6) only (convert it: "
                        "ImageMagick's mogrify -format png)", s_nm(name), kind);
    size_t i = 2;
    uint64_t w, h, maxval;
    if (!s_pnm_num(p, n, &i, &w) || !s_pnm_num(p, n, &i, &h) ||
        !s_pnm_num(p, n, &i, &maxval) || i >= n)
        return tp_error(TP_ERR_FORMAT, "image %s: corrupt or truncated P%c "
                        "header", s_nm(name), kind);
    if (maxval != 255)
        return tp_error(TP_ERR_FORMAT, "image %s: a P%c file of maxval %llu; "
                        "towerpack reads maxval 255 (8-bit) only", s_nm(name),
                        kind, (unsigned long long)maxval);
    TP_TRY(s_limit(kind == '5' ? "PGM" : "PPM", (int64_t)w, (int64_t)h, o, name));
    int c = kind == '5' ? 1 : 3;
    size_t need = i + 1 + (size_t)w * h * c;  /* one blank, then the pixels */
    if (need > n || n > INT_MAX)
        return tp_error(TP_ERR_FORMAT, "image %s: truncated P%c: %zu bytes of "
                        "header and pixels, the file has %zu", s_nm(name), kind,
                        need, n);
    return s_stb(p, n, c, kind == '5' ? "PGM" : "PPM", name, out);
}
