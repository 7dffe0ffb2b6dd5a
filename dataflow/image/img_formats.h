/* towerpack dataflow/image: the decoders of the formats torchvision's
 * ImageFolder reads besides JPEG and PNG (WebP, TIFF, BMP, PGM/PPM), in
 * img_formats.c; img_codec.c tells the formats apart by their magic bytes
 * and calls these.
 *
 * Each gives the image's own channels (1 grey, 2 grey + alpha, 3 RGB,
 * 4 RGBA) as uint8 [H, W] or [H, W, C] and leaves the conversion to the
 * folder's mode, the cut and the limits' errors to the caller's common
 * path; each checks opts->max_pixels before it makes a pixel buffer, and
 * on an error leaves *out empty with a message naming `name`. *orient
 * (1..8, 1 when upright) is how the caller turns the pixels: a TIFF's
 * Orientation tag, which PIL applies when it opens a TIFF. */
#ifndef TP_IMG_FORMATS_H
#define TP_IMG_FORMATS_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/image.h>

/* The format of the bytes by their signature, or NULL when none of these
 * (the caller has already tried JPEG and PNG). */
typedef tp_status_t (*img_decode_fn)(const uint8_t *p, size_t n,
                                     const tp_image_opts_t *o, const char *name,
                                     tp_tensor_t *out, int *orient);
img_decode_fn img_format_by_magic(const uint8_t *p, size_t n);

tp_status_t img_decode_webp(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                            const char *name, tp_tensor_t *out, int *orient);
tp_status_t img_decode_tiff(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                            const char *name, tp_tensor_t *out, int *orient);
tp_status_t img_decode_bmp(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                           const char *name, tp_tensor_t *out, int *orient);
tp_status_t img_decode_pnm(const uint8_t *p, size_t n, const tp_image_opts_t *o,
                           const char *name, tp_tensor_t *out, int *orient);

/* A run-length coded BMP's palette indices (BI_RLE8, or BI_RLE4 when
 * rle4), from byte `at` of the file's n bytes, into idx: w * h of them, in
 * the file's row order (img_bmp_rle.c). An error names `name`, the byte
 * and the row where the stream stops short. */
tp_status_t img_bmp_rle(const uint8_t *p, size_t n, size_t at, int64_t w,
                        int64_t h, int rle4, const char *name, uint8_t *idx);

/* Whether a file name ends in one of torchvision's IMG_EXTENSIONS (any
 * case): the files an image folder takes (img_sources.c). */
int img_is_image_name(const char *name);
#define IMG_EXTENSIONS_TEXT ".jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp"

/* stb_image's BMP and PNM reader (img_stb.c): malloc'ed pixels of `req`
 * channels, or NULL with *why its reason. */
uint8_t *img_stb_load(const uint8_t *p, int n, int req, int *w, int *h,
                      const char **why);
void img_stb_free(void *px);

#endif
