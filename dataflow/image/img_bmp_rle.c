/* towerpack dataflow/image: the run-length coded BMPs (BI_RLE8, 8-bit
 * palette, and BI_RLE4, 4-bit), which stb_image does not read: their
 * stream of palette indices, for img_decode_bmp to colour.
 *
 * Read as PIL's BmpRleDecoder reads them (Pillow 9.4, Debian's
 * python3-pil, which torchvision's loader uses), so the pixels agree,
 * with the two fixes Pillow has since made upstream, where 9.4 misreads
 * a well-formed stream: a delta's two offsets are the two bytes after
 * the escape (9.4 skips them and takes the next two), and an absolute
 * run of an odd number of 4-bit pixels takes its last pixel and the
 * half byte after it (9.4 reads one byte short). Pillow's model is one
 * line of pixels in the file's order, which the escapes fill:
 *   - a run (count > 0) repeats its index (RLE4: its two nibbles in
 *     turn), cut at the row's end;
 *   - end of line pads with index 0 up to the next row (nothing when the
 *     row is already whole);
 *   - a delta (dx, dy) skips dx + dy * width pixels, index 0;
 *   - an absolute run takes `count` indices as they are, not cut at the
 *     row (they go on into the next one), then the stream is aligned to
 *     an even file offset;
 *   - end of bitmap stops.
 * Decoding stops once width * height pixels are there (what follows is
 * not read). A stream that stops short of them (end of bitmap early, or
 * the file ends) is refused, as PIL refuses it ("not enough image
 * data"), with the byte and the row where it stopped. Every pixel is
 * written once and every escape takes at least two bytes, so the work
 * is bounded by the pixels and the file's length, whatever the stream
 * says. */
#include <string.h>
#include "dataflow/df_internal.h"
#include "dataflow/image/img_formats.h"

tp_status_t img_bmp_rle(const uint8_t *p, size_t n, size_t at, int64_t w,
                        int64_t h, int rle4, const char *name, uint8_t *idx) {
    const size_t total = (size_t)w * (size_t)h, uw = (size_t)w;
    const char *nm = name ? name : "(memory)", *kind = rle4 ? "RLE4" : "RLE8";
    size_t len = 0, i = at;
    int64_t x = 0;  /* Pillow's column: an absolute run may carry it past w */
    const char *why = "the file ends";
    while (len < total) {
        if (n < 2 || i > n - 2)
            break;
        unsigned c = p[i], v = p[i + 1];
        i += 2;
        if (c) {  /* a run, cut at the row's end */
            size_t k = x >= w ? 0 : (size_t)(w - x) < c ? (size_t)(w - x) : c;
            if (k > total - len)
                k = total - len;
            for (size_t j = 0; j < k; j++)
                idx[len + j] = (uint8_t)(!rle4 ? v : j & 1 ? v & 15 : v >> 4);
            len += k;
            x += (int64_t)k;
        } else if (v == 0) {  /* end of line */
            size_t end = (len + uw - 1) / uw * uw;
            memset(idx + len, 0, end - len);
            len = end;
            x = 0;
        } else if (v == 1) {  /* end of bitmap */
            why = "its end-of-bitmap escape comes";
            i -= 2;
            break;
        } else if (v == 2) {  /* delta: dx right, dy rows on */
            if (i > n - 2) {
                i -= 2;
                why = "the file ends inside a delta escape";
                break;
            }
            size_t skip = p[i] + (size_t)p[i + 1] * uw;
            i += 2;
            if (skip > total - len)
                skip = total - len;
            memset(idx + len, 0, skip);
            len += skip;
            x = (int64_t)(len % uw);
        } else {  /* an absolute run of v indices, word-aligned */
            size_t bytes = rle4 ? (v + 1) / 2 : v, have = n - i < bytes ? n - i : bytes;
            size_t k = rle4 ? (have * 2 < v ? have * 2 : v) : have;
            if (k > total - len)
                k = total - len;
            for (size_t j = 0; j < k; j++)
                idx[len + j] = !rle4 ? p[i + j]
                               : j & 1 ? p[i + j / 2] & 15 : p[i + j / 2] >> 4;
            len += k;
            if (have < bytes) {
                i -= 2;
                why = "the file ends inside an absolute run";
                break;
            }
            i += bytes;
            x += v;
            if (i & 1)
                i++;
        }
    }
    if (len < total) {
        /* the rows as stored: bottom-up, unless the height is negative */
        return tp_error(TP_ERR_FORMAT, "image %s: truncated or corrupt %s BMP: "
                        "%s at byte %zu, in stored row %zu of %lld (%zu of "
                        "%zu pixels decoded; PIL refuses it too)", nm, kind,
                        why, i > n ? n : i, len / uw + 1, (long long)h, len,
                        total);
    }
    return TP_OK;
}
