/* towerpack tests: training curves drawn from stats.json into a PNG. The
 * test decodes the PNG it gets (zlib) and looks for the series' colours. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <towerpack/plot.h>
#include <towerpack/towerpack.h>

static uint32_t s_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Decode our own PNG (RGB, filter 0) into *rgb; returns width*height. */
static size_t s_decode(const char *path, uint8_t **rgb, uint32_t *w, uint32_t *h) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    static uint8_t buf[4 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert(n > 33);
    cr_assert_eq(memcmp(buf, "\x89PNG\r\n\x1a\n", 8), 0, "PNG signature");
    cr_assert_eq(memcmp(buf + 12, "IHDR", 4), 0);
    *w = s_be32(buf + 16);
    *h = s_be32(buf + 20);
    cr_assert_eq(buf[24], 8);
    cr_assert_eq(buf[25], 2, "RGB");
    size_t off = 8;
    uint8_t *idat = NULL;
    size_t idat_len = 0;
    while (off + 12 <= n) {
        uint32_t len = s_be32(buf + off);
        uint32_t crc = (uint32_t)crc32(0, buf + off + 4, 4 + len);
        cr_assert_eq(crc, s_be32(buf + off + 8 + len), "chunk CRC");
        if (!memcmp(buf + off + 4, "IDAT", 4)) {
            idat = buf + off + 8;
            idat_len = len;
        }
        off += 12 + len;
    }
    cr_assert_not_null(idat);
    uLongf raw_len = (uLongf)(*h) * (1 + (*w) * 3);
    uint8_t *raw = malloc(raw_len);
    cr_assert_eq(uncompress(raw, &raw_len, idat, (uLong)idat_len), Z_OK);
    *rgb = malloc((size_t)(*w) * (*h) * 3);
    for (uint32_t y = 0; y < *h; y++) {
        cr_assert_eq(raw[y * (1 + *w * 3)], 0, "filter none");
        memcpy(*rgb + (size_t)y * (*w) * 3, raw + y * (1 + *w * 3) + 1, (size_t)(*w) * 3);
    }
    free(raw);
    return (size_t)(*w) * (*h);
}

static size_t s_count(const uint8_t *rgb, size_t npx, uint8_t r, uint8_t g, uint8_t b) {
    size_t k = 0;
    for (size_t i = 0; i < npx; i++)
        k += rgb[3 * i] == r && rgb[3 * i + 1] == g && rgb[3 * i + 2] == b;
    return k;
}

Test(plot, draws_every_series) {
    char dir[] = "/tmp/tp-plot-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char js[64], png[64];
    snprintf(js, sizeof js, "%s/stats.json", dir);
    snprintf(png, sizeof png, "%s/curves.png", dir);
    FILE *f = fopen(js, "w");
    fputs("[", f);
    for (int e = 1; e <= 6; e++)
        fprintf(f, "%s{\"epoch_num\":%d,\"global_step\":%d,\"loss\":%g,"
                   "\"validation_accuracy\":%g,\"learning_rate\":0.1,"
                   "\"throughput\":%d}", e > 1 ? "," : "", e, e * 10,
                1.0 / e, 0.5 + 0.05 * e, 1000 + e);
    fputs("]", f);
    fclose(f);
    cr_assert_eq(tp_plot_stats(js, png), TP_OK, "%s", tp_last_error());
    uint8_t *rgb;
    uint32_t w, h;
    size_t npx = s_decode(png, &rgb, &w, &h);
    cr_assert_eq(w, 1200);
    cr_assert_eq(h, 860);
    size_t blue = s_count(rgb, npx, 31, 119, 180);
    size_t orange = s_count(rgb, npx, 255, 127, 14);
    cr_assert(blue > 2000, "first series (loss, accuracy, lr, throughput) drawn: %zu px", blue);
    cr_assert(orange < 10, "no second series in any panel: %zu px", orange);
    cr_assert(s_count(rgb, npx, 255, 255, 255) > npx / 2, "mostly background");
    free(rgb);
    unlink(js);
    unlink(png);
    rmdir(dir);
}

Test(plot, bad_input_is_a_clear_error) {
    char dir[] = "/tmp/tp-plot-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char js[64], png[64];
    snprintf(js, sizeof js, "%s/stats.json", dir);
    snprintf(png, sizeof png, "%s/curves.png", dir);
    cr_assert_eq(tp_plot_stats(js, png), TP_ERR_FORMAT, "missing file");
    cr_assert(strstr(tp_last_error(), "stats.json"));
    FILE *f = fopen(js, "w");
    fputs("{\"epoch_num\": 1}", f);
    fclose(f);
    cr_assert_eq(tp_plot_stats(js, png), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "not a list"));
    f = fopen(js, "w");
    fputs("[]", f);
    fclose(f);
    cr_assert_eq(tp_plot_stats(js, png), TP_OK, "an empty run still plots");
    cr_assert_eq(access(png, R_OK), 0);
    unlink(js);
    unlink(png);
    rmdir(dir);
}
