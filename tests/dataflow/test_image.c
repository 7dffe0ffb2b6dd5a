/* towerpack tests: dataflow/image without outside tools: round trips
 * through the encoders, every kind of bad file (each an error naming the
 * file, or skipped and counted), the image folder, list and CIFAR sources,
 * their spec strings, and the augmentors' reproducibility. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/image.h>

static char s_dir[256];

static void s_setup(void) {
    snprintf(s_dir, sizeof s_dir, "/tmp/tp_image_%d", (int)getpid());
    cr_assert_eq(mkdir(s_dir, 0755), 0);
}

static void s_teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    (void)system(cmd);
}

TestSuite(image, .init = s_setup, .fini = s_teardown);

/* A test picture: uint8 [h,w,c] (c 1: [h,w]) of a smooth pattern. */
static void s_pattern(tp_tensor_t *t, int h, int w, int c, int seed) {
    int64_t shape[3] = {h, w, c};
    cr_assert_eq(tp_tensor_init(t, TP_UINT8, c == 1 ? 2 : 3, shape), TP_OK);
    uint8_t *p = t->data;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++)
                p[((size_t)y * w + x) * c + k] =
                    (uint8_t)(x * 4 + y * 3 + k * 60 + seed * 17);
}

static void s_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "%s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Encode t as a JPEG of quality 90 to path, then release t. */
static void s_write_jpeg(const char *path, tp_tensor_t *t) {
    void *d;
    size_t n;
    cr_assert_eq(tp_image_encode_jpeg(t, 90, &d, &n), TP_OK, "%s: %s", path, tp_last_error());
    s_write(path, d, n);
    free(d);
    tp_tensor_fini(t);
}

static void s_write_png(const char *path, int h, int w, int c, int seed) {
    tp_tensor_t t;
    s_pattern(&t, h, w, c, seed);
    void *d;
    size_t n;
    cr_assert_eq(tp_image_encode_png(&t, &d, &n), TP_OK, "%s", tp_last_error());
    s_write(path, d, n);
    free(d);
    tp_tensor_fini(&t);
}

Test(image, png_round_trip_is_exact) {
    for (int c = 1; c <= 4; c++) {
        if (c == 2)
            continue;
        tp_tensor_t t, back;
        s_pattern(&t, 13, 21, c, c);
        void *d;
        size_t n;
        cr_assert_eq(tp_image_encode_png(&t, &d, &n), TP_OK);
        cr_assert_eq(tp_image_decode(d, n, NULL, "x.png", &back), TP_OK, "%s",
                     tp_last_error());
        cr_assert(tp_tensor_equal(&t, &back), "%d channels", c);
        free(d);
        tp_tensor_fini(&t);
        tp_tensor_fini(&back);
    }
}

Test(image, jpeg_round_trip_is_close) {
    tp_tensor_t t, back;
    s_pattern(&t, 32, 48, 3, 1);
    void *d;
    size_t n;
    cr_assert_eq(tp_image_encode_jpeg(&t, 95, &d, &n), TP_OK);
    cr_assert_eq(tp_image_decode(d, n, NULL, "x.jpg", &back), TP_OK);
    cr_assert_eq(back.ndim, 3);
    cr_assert_eq(back.shape[0], 32);
    cr_assert_eq(back.shape[1], 48);
    double err = 0;
    for (size_t i = 0; i < t.nbytes; i++)
        err += abs((int)((uint8_t *)t.data)[i] - (int)((uint8_t *)back.data)[i]);
    /* the pattern wraps at 256 (sharp edges): q95 keeps it within ~7 on
     * average; a wrong decode is off by ~80 */
    cr_assert_lt(err / (double)t.nbytes, 12.0, "mean error %g",
                 err / (double)t.nbytes);
    /* grey output of a colour JPEG: [H,W] */
    tp_image_opts_t o;
    tp_image_opts_init(&o);
    o.mode = TP_IMAGE_GREY;
    tp_tensor_t g;
    cr_assert_eq(tp_image_decode(d, n, &o, "x.jpg", &g), TP_OK);
    cr_assert_eq(g.ndim, 2);
    /* DCT scaling: 1/2 is the smallest scale with a short side >= 16 */
    o.mode = TP_IMAGE_RGB;
    o.min_short = 16;
    tp_tensor_t s;
    cr_assert_eq(tp_image_decode(d, n, &o, "x.jpg", &s), TP_OK);
    cr_assert_eq(s.shape[0], 16);
    cr_assert_eq(s.shape[1], 24);
    free(d);
    tp_tensor_fini(&t);
    tp_tensor_fini(&back);
    tp_tensor_fini(&g);
    tp_tensor_fini(&s);
}

/* Every bad input is an error that names the file; none crashes. */
Test(image, bad_files_are_named_errors) {
    tp_tensor_t t, img;
    s_pattern(&t, 40, 40, 3, 2);
    void *jpg, *png;
    size_t nj, np;
    cr_assert_eq(tp_image_encode_jpeg(&t, 90, &jpg, &nj), TP_OK);
    cr_assert_eq(tp_image_encode_png(&t, &png, &np), TP_OK);
    /* zero bytes */
    cr_assert_eq(tp_image_decode(jpg, 0, NULL, "empty.jpg", &img), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "empty.jpg"), "%s", tp_last_error());
    /* truncated, at many lengths */
    for (size_t cut = 1; cut < nj; cut += nj / 23 + 1) {
        tp_status_t rc = tp_image_decode(jpg, cut, NULL, "cut.jpg", &img);
        cr_assert_lt(rc, 0, "JPEG cut at %zu of %zu decoded", cut, nj);
        cr_assert(strstr(tp_last_error(), "cut.jpg"), "%s", tp_last_error());
    }
    for (size_t cut = 1; cut < np; cut += np / 23 + 1) {
        tp_status_t rc = tp_image_decode(png, cut, NULL, "cut.png", &img);
        cr_assert_lt(rc, 0, "PNG cut at %zu of %zu decoded", cut, np);
        cr_assert(strstr(tp_last_error(), "cut.png"), "%s", tp_last_error());
    }
    /* corrupt: bytes flipped in the middle of the PNG (CRC) */
    uint8_t *bad = malloc(np);
    memcpy(bad, png, np);
    for (size_t i = np / 2; i < np / 2 + 16; i++)
        bad[i] ^= 0x5A;
    cr_assert_lt(tp_image_decode(bad, np, NULL, "bad.png", &img), 0);
    cr_assert(strstr(tp_last_error(), "bad.png"));
    free(bad);
    /* not an image at all (whatever the name says) */
    cr_assert_eq(tp_image_decode("hello world", 11, NULL, "text.jpg", &img),
                 TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "text.jpg"));
    /* huge dimensions: refused before any pixel buffer is made */
    tp_image_opts_t o;
    tp_image_opts_init(&o);
    o.max_pixels = 1000;
    cr_assert_eq(tp_image_decode(jpg, nj, &o, "big.jpg", &img), TP_ERR_SHAPE);
    cr_assert(strstr(tp_last_error(), "big.jpg"));
    cr_assert_eq(tp_image_decode(png, np, &o, "big.png", &img), TP_ERR_SHAPE);
    /* a PNG header claiming 100000 x 100000 (CRC fixed up by hand is not
     * needed: libpng checks the header's CRC after our size check would
     * pass, so make it valid) */
    uint8_t *hdr = malloc(np);
    memcpy(hdr, png, np);
    hdr[16] = 0x00, hdr[17] = 0x01, hdr[18] = 0x86, hdr[19] = 0xA0;
    hdr[20] = 0x00, hdr[21] = 0x01, hdr[22] = 0x86, hdr[23] = 0xA0;
    cr_assert_lt(tp_image_decode(hdr, np, NULL, "huge.png", &img), 0);
    cr_assert(strstr(tp_last_error(), "huge.png"), "%s", tp_last_error());
    free(hdr);
    /* a missing file */
    cr_assert_eq(tp_image_read("/nonexistent/x.png", NULL, &img), TP_ERR_IO);
    cr_assert(strstr(tp_last_error(), "/nonexistent/x.png"));
    free(jpg);
    free(png);
    tp_tensor_fini(&t);
}

/* A run-length coded BMP in memory (issue 43): a 40-byte header, w x h
 * (bottom-up), `bpp` bits (8: RLE8, 4: RLE4), `colors` palette entries
 * (entry i is (10 + i, 20 + i, 30 + i) as red, green, blue) and the RLE
 * stream; its length in *n, malloc'ed exactly (ASan sees past it). */
static uint8_t *s_rle_bmp(int w, int h, int bpp, unsigned colors,
                          const uint8_t *rle, size_t nrle, size_t *n) {
    size_t off = 14 + 40 + 4 * (size_t)colors;
    *n = off + nrle;
    uint8_t *b = calloc(1, *n);
    cr_assert(b);
    uint32_t v[] = {(uint32_t)*n, 0, (uint32_t)off, 40, (uint32_t)w, (uint32_t)h};
    b[0] = 'B', b[1] = 'M';
    for (int k = 0; k < 6; k++)
        for (int j = 0; j < 4; j++)
            b[2 + 4 * k + j] = (uint8_t)(v[k] >> (8 * j));
    b[26] = 1;                    /* planes */
    b[28] = (uint8_t)bpp;
    b[30] = bpp == 8 ? 1 : 2;     /* BI_RLE8, BI_RLE4 */
    b[46] = (uint8_t)colors, b[47] = (uint8_t)(colors >> 8);
    for (unsigned i = 0; i < colors; i++) {
        b[54 + 4 * i] = (uint8_t)(30 + i);
        b[55 + 4 * i] = (uint8_t)(20 + i);
        b[56 + 4 * i] = (uint8_t)(10 + i);
    }
    memcpy(b + off, rle, nrle);
    return b;
}

/* Hostile run-length BMPs stay inside their rows and their bytes (runs
 * past the row or the image, an absolute run past the image, a delta
 * past the end, indices past the palette: each decodes to what PIL
 * gives), and a stream that stops short, or a header that does not fit
 * RLE, is an error naming the file, the byte and the row. */
Test(image, hostile_rle_bmps_stay_bounded) {
    tp_tensor_t img;
    size_t n;
    /* 4x2: a run of 255 in each row (cut at the row), then a run while
     * past the row (nothing), an absolute run of 255 past the image's
     * end (the first 4 taken), index 9 of a 2-entry palette (the grey
     * (9, 9, 9), PIL's) */
    static const uint8_t a[] = {255, 1, 3, 9, 0, 0, 0, 255};
    uint8_t rle[8 + 256];
    memcpy(rle, a, sizeof a);
    for (int i = 0; i < 256; i++)
        rle[8 + i] = (uint8_t)(i % 2 ? 9 : 0);
    uint8_t *b = s_rle_bmp(4, 2, 8, 2, rle, sizeof rle, &n);
    cr_assert_eq(tp_image_decode(b, n, NULL, "runs.bmp", &img), TP_OK, "%s",
                 tp_last_error());
    cr_assert_eq(img.ndim, 3);
    const uint8_t *px = img.data;
    /* top row (stored second): the absolute run 0 9 0 9 */
    static const uint8_t want[2][4][3] = {
        {{10, 20, 30}, {9, 9, 9}, {10, 20, 30}, {9, 9, 9}},
        {{11, 21, 31}, {11, 21, 31}, {11, 21, 31}, {11, 21, 31}}};
    cr_assert_eq(memcmp(px, want, sizeof want), 0);
    tp_tensor_fini(&img);
    free(b);
    /* a delta of (255, 255) past the image's end: index 0 to the end */
    static const uint8_t d[] = {2, 1, 0, 2, 255, 255, 0, 1};
    b = s_rle_bmp(3, 3, 8, 4, d, sizeof d, &n);
    cr_assert_eq(tp_image_decode(b, n, NULL, "delta.bmp", &img), TP_OK);
    px = img.data;
    cr_assert(px[6 * 3] == 11 && px[7 * 3] == 11 && px[8 * 3] == 10 &&
              px[0] == 10, "%d %d %d %d", px[18], px[21], px[24], px[0]);
    tp_tensor_fini(&img);
    free(b);
    /* RLE4: a run of two nibbles alternating, an odd absolute run (its
     * last pixel, then the half byte and the byte of padding) */
    static const uint8_t r4[] = {5, 0x12, 0, 0, 0, 3, 0x34, 0x50, 2, 0x66, 0, 1};
    b = s_rle_bmp(5, 2, 4, 16, r4, sizeof r4, &n);
    cr_assert_eq(tp_image_decode(b, n, NULL, "r4.bmp", &img), TP_OK, "%s",
                 tp_last_error());
    static const uint8_t want4[10] = {3, 4, 5, 6, 6, 1, 2, 1, 2, 1};
    for (int i = 0; i < 10; i++)
        cr_assert_eq(((uint8_t *)img.data)[i * 3], 10 + want4[i], "pixel %d", i);
    tp_tensor_fini(&img);
    free(b);
    /* RLE4 and a delta (1 right, 1 row on; OpenCV 4.6 cannot read this
     * one, PIL 9.4 misreads any delta): skipped pixels index 0 */
    static const uint8_t d4[] = {2, 0x11, 0, 2, 1, 1, 1, 0x22, 0, 1};
    b = s_rle_bmp(4, 2, 4, 16, d4, sizeof d4, &n);
    cr_assert_eq(tp_image_decode(b, n, NULL, "d4.bmp", &img), TP_OK, "%s",
                 tp_last_error());
    static const uint8_t wantd[8] = {0, 0, 0, 2, 1, 1, 0, 0};
    for (int i = 0; i < 8; i++)
        cr_assert_eq(((uint8_t *)img.data)[i * 3], 10 + wantd[i], "pixel %d", i);
    tp_tensor_fini(&img);
    free(b);
    /* cut short: end of bitmap early, the file ending in a delta, in an
     * absolute run, or between escapes; each names the file, what
     * stopped it and the row */
    static const struct {
        uint8_t rle[8];
        size_t n;
        const char *why;
    } cut[] = {{{4, 1, 0, 1}, 4, "end-of-bitmap escape comes at byte 60, in stored row 2"},
               {{4, 1, 0, 2, 1}, 5, "ends inside a delta escape at byte 60"},
               {{4, 1, 0, 5, 1, 2}, 6, "ends inside an absolute run"},
               {{4, 1, 2, 1}, 4, "the file ends at byte 62, in stored row 2"}};
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        b = s_rle_bmp(4, 2, 8, 1, cut[i].rle, cut[i].n, &n);
        cr_assert_eq(tp_image_decode(b, n, NULL, "cut.bmp", &img), TP_ERR_FORMAT);
        cr_assert(strstr(tp_last_error(), "cut.bmp") &&
                  strstr(tp_last_error(), "RLE8") &&
                  strstr(tp_last_error(), cut[i].why), "%s", tp_last_error());
        cr_assert_null(img.data);
        free(b);
    }
    /* RLE8 of 4 bits a pixel, a palette of 300 colours, one past the end */
    b = s_rle_bmp(4, 2, 8, 1, a, sizeof a, &n);
    b[28] = 4;
    cr_assert_eq(tp_image_decode(b, n, NULL, "bits.bmp", &img), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "bits.bmp") &&
              strstr(tp_last_error(), "RLE8 compression with 4 bits"), "%s",
              tp_last_error());
    b[28] = 8, b[46] = 0x2C, b[47] = 1;
    cr_assert_eq(tp_image_decode(b, n, NULL, "pal.bmp", &img), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "a palette of 300 colours (256 at most)"),
              "%s", tp_last_error());
    b[46] = 200, b[47] = 0;
    cr_assert_eq(tp_image_decode(b, n, NULL, "pal.bmp", &img), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "truncated RLE8 BMP: a palette of 200"),
              "%s", tp_last_error());
    free(b);
    /* 4000 x 4000 from a few bytes of deltas: bounded by the pixels */
    uint8_t big[18 * 4];
    for (int i = 0; i < 18; i++)
        big[4 * i] = 0, big[4 * i + 1] = 2, big[4 * i + 2] = 255, big[4 * i + 3] = 255;
    b = s_rle_bmp(4000, 4000, 8, 1, big, sizeof big, &n);
    cr_assert_eq(tp_image_decode(b, n, NULL, "big.bmp", &img), TP_OK, "%s",
                 tp_last_error());
    cr_assert_eq(img.shape[0], 4000);
    tp_tensor_fini(&img);
    free(b);
}

/* DIR/<class>/... : classes sorted by name, labels their index, every
 * image once a pass, nested folders and both formats included. */
Test(image, image_folder_layout) {
    char p[512];
    static const char *cls[] = {"b-cat", "a-dog", "c-eel"};
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/%s", s_dir, cls[k]);
        cr_assert_eq(mkdir(p, 0755), 0);
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "%s/%s/%d.png", s_dir, cls[k], i);
            s_write_png(p, 8, 8 + k, 1, i);  /* the width tells the folder */
        }
    }
    snprintf(p, sizeof p, "%s/c-eel/sub", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/c-eel/sub/x.PNG", s_dir);
    s_write_png(p, 8, 10, 1, 9);
    snprintf(p, sizeof p, "%s/c-eel/notes.txt", s_dir);
    s_write(p, "x", 1);
    tp_dataflow_t *df = tp_df_image_folder(s_dir, NULL);
    cr_assert(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_size(df), 10);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    int count[3] = {0};
    tp_datapoint_t *dp;
    while (tp_dataflow_next(df, &dp) == TP_OK) {
        const tp_tensor_t *img = tp_datapoint_cget(dp, 0);
        cr_assert_eq(img->ndim, 2);
        int label = *(const int32_t *)tp_datapoint_cget(dp, 1)->data;
        cr_assert(label >= 0 && label < 3);
        int folder = (int)img->shape[1] - 8;
        const int want[3] = {1, 0, 2};  /* a-dog 0, b-cat 1, c-eel 2 */
        cr_assert_eq(label, want[folder], "image of %s has label %d",
                     cls[folder], label);
        count[label]++;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(count[0], 3);
    cr_assert_eq(count[1], 3);
    cr_assert_eq(count[2], 4);
    tp_dataflow_destroy(&df);
}

/* A FIFO (or socket) with an image's name in a class folder: refused by
 * path when the folder is scanned; before, the pass's open waited for a
 * writer forever. An image list naming one: refused at the read, not
 * waited on. */
Test(image, image_folder_refuses_a_fifo_by_path, .timeout = 60) {
    char p[512], list[512];
    snprintf(p, sizeof p, "%s/k", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/k/0.png", s_dir);
    s_write_png(p, 5, 5, 1, 0);
    snprintf(p, sizeof p, "%s/k/pipe.jpg", s_dir);
    cr_assert_eq(mkfifo(p, 0644), 0);
    cr_assert_null(tp_df_image_folder(s_dir, NULL));
    cr_assert(strstr(tp_last_error(), p) && strstr(tp_last_error(), "FIFO"), "%s",
              tp_last_error());
    /* the spec and the source's description say the same */
    char spec[600];
    tp_dataflow_t *df = NULL;
    snprintf(spec, sizeof spec, "imagefolder:%s", s_dir);
    cr_assert_lt(tp_spec_parse(spec, &df), 0);
    cr_assert(strstr(tp_last_error(), "pipe.jpg"), "%s", tp_last_error());

    snprintf(list, sizeof list, "%s/list.txt", s_dir);
    const char *text = "k/pipe.jpg 0\n";
    s_write(list, text, strlen(text));
    df = tp_df_image_list(list, NULL, NULL);
    cr_assert(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    cr_assert_lt(tp_dataflow_next(df, &dp), 0);
    cr_assert(strstr(tp_last_error(), "pipe.jpg") &&
              strstr(tp_last_error(), "not a regular file"), "%s", tp_last_error());
    tp_dataflow_destroy(&df);
}

/* The last error refuses `path` by name as a FIFO (the sources' opens go
 * through df_open_regular rather than blocking on one). */
static void s_assert_fifo_refused(const char *path) {
    cr_assert(strstr(tp_last_error(), path) &&
              strstr(tp_last_error(), "a FIFO (named pipe), not a regular file"), "%s",
              tp_last_error());
}

/* The image list itself a FIFO: refused by name at once; before, its
 * open waited for a writer forever (the list source's regular-file check
 * came after the open, and the source info had none). */
Test(image, image_list_that_is_a_fifo_is_refused, .timeout = 60) {
    char list[512];
    snprintf(list, sizeof list, "%s/list.fifo", s_dir);
    cr_assert_eq(mkfifo(list, 0644), 0);
    cr_assert_null(tp_df_image_list(list, NULL, NULL));
    s_assert_fifo_refused(list);
    /* the look at the source before it is made (tp-train's classes and
     * channels) reads the list too */
    char source[600];
    snprintf(source, sizeof source, "imagelist:%s", list);
    tp_image_source_info_t info;
    tp_image_source_info_init(&info);
    cr_assert_lt(tp_image_source_info(source, &info), 0);
    s_assert_fifo_refused(list);
    tp_image_source_info_fini(&info);
}

/* CIFAR's class names file beside the records is read when there
 * (batches.meta.txt, one name a line); one that is a FIFO is refused by
 * name rather than blocking the look at the source (it hung before). */
Test(image, cifar_names_file_is_read_and_a_fifo_refused, .timeout = 60) {
    char dir[512], p[600], source[700];
    snprintf(dir, sizeof dir, "%s/cf", s_dir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/batches.meta.txt", dir);
    FILE *f = fopen(p, "w");
    for (int i = 0; i < 10; i++)
        fprintf(f, "thing%d\n", i);
    fclose(f);
    snprintf(source, sizeof source, "cifar:%s/data_batch_1.bin", dir);
    tp_image_source_info_t info;
    tp_image_source_info_init(&info);
    cr_assert_eq(tp_image_source_info(source, &info), TP_OK, "%s", tp_last_error());
    cr_expect_str_eq(info.classes[9], "thing9");
    tp_image_source_info_fini(&info);
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(mkfifo(p, 0644), 0);
    tp_image_source_info_init(&info);
    cr_assert_lt(tp_image_source_info(source, &info), 0);
    s_assert_fifo_refused(p);
    tp_image_source_info_fini(&info);
}

/* A bad file fails the pass naming it, or with skip_bad is skipped and
 * counted. */
Test(image, bad_file_in_folder_fails_or_is_skipped) {
    char p[512];
    snprintf(p, sizeof p, "%s/k", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/k/%d.png", s_dir, i);
        s_write_png(p, 5, 5, 3, i);
    }
    snprintf(p, sizeof p, "%s/k/zero.jpg", s_dir);
    s_write(p, "", 0);
    snprintf(p, sizeof p, "%s/k/trunc.png", s_dir);
    s_write(p, "\x89PNG\r\n\x1a\n\0\0", 10);
    tp_dataflow_t *df = tp_df_image_folder(s_dir, NULL);
    cr_assert(df);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK)
        tp_datapoint_destroy(&dp);
    cr_assert_lt(rc, 0);
    cr_assert(strstr(tp_last_error(), "zero.jpg") ||
              strstr(tp_last_error(), "trunc.png"), "%s", tp_last_error());
    /* and says the way past it */
    cr_assert(strstr(tp_last_error(), "imagefolder:DIR,skip-bad"), "%s", tp_last_error());
    tp_dataflow_destroy(&df);

    tp_image_source_opts_t o;
    tp_image_source_opts_init(&o);
    o.skip_bad = 1;
    df = tp_df_image_folder(s_dir, &o);
    cr_assert(df);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    int n = 0;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
        n++;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
    cr_assert_eq(n, 4);
    cr_assert_eq(tp_df_image_skipped(df), 2);
    /* a second pass skips them unread: still 2 distinct bad files */
    n = 0;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
        n++;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
    cr_assert_eq(n, 4);
    cr_assert_eq(tp_df_image_skipped(df), 2);
    cr_assert_eq(tp_df_skipped_files(df), 2);
    tp_dataflow_destroy(&df);
}

/* PATH LABEL lines; bad lines are errors naming the line. Spec strings of
 * the list, the folder (raw) and the decode map. */
Test(image, image_list_and_specs) {
    char p[512], list[512];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/img %d.png", s_dir, i);
        s_write_png(p, 6, 7, 3, i);
    }
    snprintf(list, sizeof list, "%s/list.txt", s_dir);
    const char *text = "# comment\nimg 0.png 5\n\nimg 1.png 7\nimg 2.png 9\n";
    s_write(list, text, strlen(text));
    char spec[1024];
    snprintf(spec, sizeof spec, "imagelist:%s,shuffle=0 | batch 3", list);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    const tp_tensor_t *img = tp_datapoint_cget(dp, 0);
    cr_assert_eq(img->ndim, 4);
    cr_assert_eq(img->shape[0], 3);
    cr_assert_eq(img->shape[3], 3);
    const int32_t *lab = tp_datapoint_cget(dp, 1)->data;
    cr_assert(lab[0] == 5 && lab[1] == 7 && lab[2] == 9);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    /* raw bytes, then decode as a later stage: the same pixels */
    snprintf(spec, sizeof spec, "imagelist:%s,shuffle=0,raw | decode mode=grey",
             list);
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_datapoint_cget(dp, 0)->ndim, 2);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    const char *badtext = "img 0.png 5\nimg 1.png minus\n";
    s_write(list, badtext, strlen(badtext));
    cr_assert_null(tp_df_image_list(list, NULL, NULL));
    cr_assert(strstr(tp_last_error(), "list.txt:2"), "%s", tp_last_error());
    snprintf(spec, sizeof spec, "imagefolder:%s,colour=1", s_dir);
    cr_assert_eq(tp_spec_parse(spec, &df), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "colour"), "%s", tp_last_error());
    cr_assert_eq(tp_spec_parse("imgaug spin=3", &df), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "spin"), "%s", tp_last_error());
}

/* CIFAR-10 binary: label byte then R, G and B planes -> HWC. */
Test(image, cifar_binary) {
    char p[512];
    snprintf(p, sizeof p, "%s/data.bin", s_dir);
    size_t n = 3 * 3073;
    uint8_t *b = calloc(1, n);
    for (int r = 0; r < 3; r++) {
        b[r * 3073] = (uint8_t)(r + 4);
        for (int c = 0; c < 3; c++)
            b[r * 3073 + 1 + c * 1024 + 33] = (uint8_t)(10 * r + c + 1);
    }
    s_write(p, b, n);
    tp_dataflow_t *df = tp_df_cifar(p, 0, 0, 0);
    cr_assert(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_size(df), 3);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    for (int r = 0; r < 3; r++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        const uint8_t *px = tp_datapoint_cget(dp, 0)->data;
        cr_assert_eq(tp_datapoint_cget(dp, 0)->shape[2], 3);
        /* pixel 33 = (row 1, col 1) */
        for (int c = 0; c < 3; c++)
            cr_assert_eq(px[33 * 3 + c], 10 * r + c + 1);
        cr_assert_eq(*(const int32_t *)tp_datapoint_cget(dp, 1)->data, r + 4);
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&df);
    s_write(p, b, n - 1);
    cr_assert_null(tp_df_cifar(p, 0, 0, 0));
    cr_assert(strstr(tp_last_error(), "data.bin"), "%s", tp_last_error());
    free(b);

    /* CIFAR-100: coarse then fine label byte, then the planes; spec */
    uint8_t *c = calloc(2, 3074);
    c[0] = 3, c[1] = 77, c[3074] = 19, c[3075] = 99;
    c[2 + 2048] = 200;  /* blue of pixel 0 of record 0 */
    s_write(p, c, 2 * 3074);
    char spec[600];
    snprintf(spec, sizeof spec, "cifar:%s,cifar100,fine,shuffle=0", p);
    tp_dataflow_t *d100 = NULL;
    cr_assert_eq(tp_spec_parse(spec, &d100), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(d100, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(d100, &dp), TP_OK);
    cr_assert_eq(*(const int32_t *)tp_datapoint_cget(dp, 1)->data, 77);
    cr_assert_eq(((const uint8_t *)tp_datapoint_cget(dp, 0)->data)[2], 200);
    tp_datapoint_destroy(&dp);
    cr_assert_eq(tp_dataflow_next(d100, &dp), TP_OK);
    cr_assert_eq(*(const int32_t *)tp_datapoint_cget(dp, 1)->data, 99);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&d100);
    c[3075] = 100;  /* a fine label out of range */
    s_write(p, c, 2 * 3074);
    cr_assert_null(tp_df_cifar(p, 1, 1, 0));
    cr_assert(strstr(tp_last_error(), "record 1"), "%s", tp_last_error());
    free(c);
}

/* The ImageNet chain from a spec: shapes, float32 out, and the same
 * result for the same seed (reproducible per datapoint). */
Test(image, imgaug_chain_is_reproducible) {
    char p[512];
    snprintf(p, sizeof p, "%s/k", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    for (int i = 0; i < 4; i++) {
        tp_tensor_t t;
        s_pattern(&t, 75, 100, 3, i);
        snprintf(p, sizeof p, "%s/k/%d.jpg", s_dir, i);
        s_write_jpeg(p, &t);
    }
    char spec[1024];
    snprintf(spec, sizeof spec,
             "imagefolder:%s,shuffle=0 | map-threads 2 strict imgaug "
             "random-resized-crop=32, flip, brightness=30, contrast=0.6:1.4, "
             "saturation=0.4, lighting=0.1, motion-blur=3:7, "
             "mean=123.7/116.3/103.5, "
             "std=58.4/57.1/57.4 | batch 4", s_dir);
    tp_datapoint_t *b[2];
    for (int run = 0; run < 2; run++) {
        tp_dataflow_t *df = NULL;
        cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_reset_state(df, 42, 0), TP_OK);
        cr_assert_eq(tp_dataflow_next(df, &b[run]), TP_OK, "%s",
                     tp_last_error());
        tp_dataflow_destroy(&df);
    }
    const tp_tensor_t *x = tp_datapoint_cget(b[0], 0);
    cr_assert_eq(x->dtype, TP_FLOAT32);
    cr_assert_eq(x->ndim, 4);
    cr_assert(x->shape[1] == 32 && x->shape[2] == 32 && x->shape[3] == 3);
    cr_assert(tp_datapoint_equal(b[0], b[1]), "same seed, different batch");
    tp_datapoint_destroy(&b[0]);
    tp_datapoint_destroy(&b[1]);
}

/* Geometry of the resizers and crops; bad images are shape errors. */
Test(image, resize_shapes_and_errors) {
    tp_tensor_t t;
    tp_rng_t rng;
    tp_rng_init(&rng, 1, 0);
    s_pattern(&t, 30, 40, 3, 0);
    tp_augment_t *a = tp_augment_new();
    cr_assert_eq(tp_augment_add_resize_short(a, 15, TP_INTERP_LINEAR), TP_OK);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    cr_assert(t.shape[0] == 15 && t.shape[1] == 20);
    tp_augment_destroy(&a);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_random_resize_short(a, 10, 12, TP_INTERP_LINEAR),
                 TP_OK);
    cr_assert_eq(tp_augment_add_center_crop(a, 10, 10), TP_OK);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    cr_assert(t.shape[0] == 10 && t.shape[1] == 10);
    tp_augment_destroy(&a);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_center_crop(a, 11, 11), TP_OK);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_ERR_SHAPE);
    tp_augment_destroy(&a);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_gaussian_noise(a, 3), TP_OK);
    cr_assert_eq(tp_augment_add_vflip(a, 0.5), TP_OK);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    tp_augment_destroy(&a);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_saturation(a, 0.4), TP_OK);
    tp_tensor_t g;
    s_pattern(&g, 5, 5, 1, 0);
    cr_assert_eq(tp_augment_apply(a, &g, &rng), TP_ERR_SHAPE);
    tp_augment_destroy(&a);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_contrast(a, 2, 1), TP_ERR_INVALID);
    tp_augment_destroy(&a);
    tp_tensor_fini(&t);
    tp_tensor_fini(&g);
}

/* OpenCV's INTER_LINEAR, one output pixel at a time (both directions
 * blended per pixel, weights in 1/2048, sums rounded at 2^22): what the
 * separable resize (each source row blended along x once, kept for the
 * output rows that use it) must give byte for byte. */
static uint8_t s_bilinear_ref(const uint8_t *src, int H, int W, int C, int oh, int ow,
                              int y, int x, int c) {
    int s[2], wgt[2];
    int n[2] = {H, W}, o[2] = {oh, ow}, d[2] = {y, x};
    for (int k = 0; k < 2; k++) {
        double f = (d[k] + 0.5) * ((double)n[k] / o[k]) - 0.5;
        int i = (int)floor(f);
        f -= i;
        if (i < 0)
            i = 0, f = 0;
        if (i >= n[k] - 1)
            i = n[k] - 1, f = 0;
        s[k] = i;
        wgt[k] = (int)lrint((1 - f) * 2048);
    }
    int y1 = s[0] + 1 < H ? s[0] + 1 : s[0], x1 = s[1] + 1 < W ? s[1] + 1 : s[1];
    const uint8_t *r0 = src + (size_t)s[0] * W * C, *r1 = src + (size_t)y1 * W * C;
    int a0 = wgt[1], a1 = 2048 - a0, b0 = wgt[0], b1 = 2048 - b0;
    int h0 = r0[s[1] * C + c] * a0 + r0[x1 * C + c] * a1;
    int h1 = r1[s[1] * C + c] * a0 + r1[x1 * C + c] * a1;
    return (uint8_t)((h0 * b0 + h1 * b1 + (1 << 21)) >> 22);
}

/* The bilinear resize, up (a small crop to 224 rows: each source row
 * serves many output rows), down and mixed, for 1, 3 and 4 channels, is
 * OpenCV's per-pixel formula byte for byte; a flip of RGB pixels mirrors
 * them whole. */
Test(image, bilinear_resize_is_opencvs_per_pixel_formula) {
    static const int sizes[][4] = {{7, 5, 224, 224}, {37, 300, 9, 41}, {1, 6, 5, 1},
                                   {50, 3, 11, 17}, {256, 256, 224, 224}};
    static const int chans[] = {1, 3, 4};
    uint32_t z = 12345;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (size_t ci = 0; ci < 3; ci++) {
            int H = sizes[k][0], W = sizes[k][1], oh = sizes[k][2], ow = sizes[k][3];
            int C = chans[ci];
            tp_tensor_t t;
            int64_t shape[3] = {H, W, C};
            cr_assert_eq(tp_tensor_init(&t, TP_UINT8, C == 1 ? 2 : 3, shape), TP_OK);
            uint8_t *src = malloc(t.nbytes);
            cr_assert_not_null(src);
            for (size_t i = 0; i < t.nbytes; i++) {
                z = z * 1664525u + 1013904223u;
                src[i] = ((uint8_t *)t.data)[i] = (uint8_t)(z >> 24);
            }
            tp_augment_t *a = tp_augment_new();
            cr_assert_eq(tp_augment_add_resize(a, oh, ow, TP_INTERP_LINEAR), TP_OK);
            tp_rng_t rng;
            tp_rng_init(&rng, 1, 0);
            cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
            cr_assert(t.shape[0] == oh && t.shape[1] == ow);
            const uint8_t *got = t.data;
            for (int y = 0; y < oh; y++)
                for (int x = 0; x < ow; x++)
                    for (int c = 0; c < C; c++) {
                        uint8_t want = s_bilinear_ref(src, H, W, C, oh, ow, y, x, c);
                        uint8_t g = got[((size_t)y * ow + x) * C + c];
                        if (g != want)
                            cr_assert_fail("%dx%dx%d to %dx%d: (%d,%d,%d) is %d, want %d", H,
                                           W, C, oh, ow, y, x, c, g, want);
                    }
            tp_augment_destroy(&a);
            if (C == 3) {  /* flip with probability 1: the pixels mirrored */
                uint8_t *before = malloc(t.nbytes);
                cr_assert_not_null(before);
                memcpy(before, t.data, t.nbytes);
                a = tp_augment_new();
                cr_assert_eq(tp_augment_add_flip(a, 1.0), TP_OK);
                cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
                const uint8_t *f = t.data;
                for (int y = 0; y < oh; y++)
                    for (int x = 0; x < ow; x++)
                        cr_assert_eq(memcmp(f + ((size_t)y * ow + x) * 3,
                                            before + ((size_t)y * ow + ow - 1 - x) * 3, 3),
                                     0, "flip %dx%d at (%d,%d)", oh, ow, y, x);
                tp_augment_destroy(&a);
                free(before);
            }
            free(src);
            tp_tensor_fini(&t);
        }
}

/* tensorpack's recipe: encoded bytes in an LMDB record file (written from
 * a raw source), decoded by a later stage: the same pixels as decoding
 * the files. */
Test(image, encoded_records_decode_later) {
    char p[512], db[512];
    snprintf(p, sizeof p, "%s/k", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    for (int i = 0; i < 5; i++) {
        tp_tensor_t t;
        s_pattern(&t, 20 + i, 30, 3, i);
        snprintf(p, sizeof p, "%s/k/%d.jpg", s_dir, i);
        s_write_jpeg(p, &t);
    }
    char spec[1024];
    snprintf(spec, sizeof spec, "imagefolder:%s,shuffle=0,raw", s_dir);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    snprintf(db, sizeof db, "%s/images.lmdb", s_dir);
    tp_records_opts_t ro;
    tp_records_opts_init(&ro);
    int64_t saved = 0;
    cr_assert_eq(tp_records_save(df, db, &ro, &saved), TP_OK, "%s",
                 tp_last_error());
    cr_assert_eq(saved, 5);
    tp_dataflow_destroy(&df);

    snprintf(spec, sizeof spec, "lmdb:%s | map-threads 2 strict decode", db);
    tp_dataflow_t *a = NULL, *b;
    tp_image_source_opts_t o;
    tp_image_source_opts_init(&o);
    o.shuffle = 0;
    b = tp_df_image_folder(s_dir, &o);
    cr_assert_eq(tp_spec_parse(spec, &a), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(a, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_reset_state(b, 1, 0), TP_OK);
    for (int i = 0; i < 5; i++) {
        tp_datapoint_t *x, *y;
        cr_assert_eq(tp_dataflow_next(a, &x), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_next(b, &y), TP_OK);
        cr_assert(tp_datapoint_equal(x, y), "record %d differs", i);
        tp_datapoint_destroy(&x);
        tp_datapoint_destroy(&y);
    }
    tp_dataflow_destroy(&a);
    tp_dataflow_destroy(&b);
}

/* The bright pixels of an image: their bounding box (pixel edges). */
static void s_bright_box(const tp_tensor_t *t, float *box) {
    int H = (int)t->shape[0], W = (int)t->shape[1];
    int C = t->ndim == 3 ? (int)t->shape[2] : 1;
    const uint8_t *p = t->data;
    int x1 = W, y1 = H, x2 = -1, y2 = -1;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            if (p[((size_t)y * W + x) * C] > 128) {
                x1 = x < x1 ? x : x1;
                y1 = y < y1 ? y : y1;
                x2 = x > x2 ? x : x2;
                y2 = y > y2 ? y : y2;
            }
    box[0] = (float)x1;
    box[1] = (float)y1;
    box[2] = (float)x2 + 1;
    box[3] = (float)y2 + 1;
}

/* Points and boxes move with the image: a bright rectangle's box, moved by
 * the chain, is where the rectangle ends up (within a pixel of rounding),
 * for every geometric augmentor and over many random draws. */
Test(image, coords_and_boxes_follow_the_image) {
    tp_augment_t *a = tp_augment_new();
    tp_augment_t *sub[2] = {tp_augment_new(), tp_augment_new()};
    cr_assert_eq(tp_augment_add_resize(a, 90, 120, TP_INTERP_NEAREST), TP_OK);
    cr_assert_eq(tp_augment_add_rotation(a, 20, 0.4, 0.6), TP_OK);
    double sc[2] = {0.9, 1.1}, fr[2] = {0.05, 0.05};
    cr_assert_eq(tp_augment_add_affine(a, sc, fr, 5, 5), TP_OK);
    cr_assert_eq(tp_augment_add_crop(a, 80, 110, 4), TP_OK);
    cr_assert_eq(tp_augment_add_flip(a, 0.5), TP_OK);
    cr_assert_eq(tp_augment_add_vflip(sub[0], 1.0), TP_OK);
    cr_assert_eq(tp_augment_add_center_crop(sub[1], 70, 100), TP_OK);
    cr_assert_eq(tp_augment_add_random_order(a, sub, 2), TP_OK);
    cr_assert_null(sub[0]);
    cr_assert_eq(tp_augment_add_random_resized_crop(a, 64, 0.5, 1.0, 0.75,
                                                    1.333, TP_INTERP_NEAREST),
                 TP_OK);
    cr_assert_eq(tp_augment_add_brightness(a, 10), TP_OK);
    tp_rng_t rng;
    tp_rng_init(&rng, 3, 0);
    int compared = 0;
    for (int round = 0; round < 40; round++) {
        tp_tensor_t img;
        int64_t shape[3] = {60, 80, 3};
        cr_assert_eq(tp_tensor_init_zero(&img, TP_UINT8, 3, shape), TP_OK);
        /* a bright rectangle [30, 50) x [20, 35) */
        for (int y = 20; y < 35; y++)
            memset((uint8_t *)img.data + ((size_t)y * 80 + 30) * 3, 255, 20 * 3);
        int64_t bs[2] = {1, 4}, ps[2] = {1, 2};
        tp_tensor_t boxes, pts;
        cr_assert_eq(tp_tensor_init(&boxes, TP_FLOAT32, 2, bs), TP_OK);
        cr_assert_eq(tp_tensor_init(&pts, TP_FLOAT32, 2, ps), TP_OK);
        float *b = boxes.data;
        b[0] = 30, b[1] = 20, b[2] = 50, b[3] = 35;
        tp_rng_t r2 = rng;
        tp_tensor_t img2;
        cr_assert_eq(tp_tensor_copy(&img2, &img), TP_OK);
        cr_assert_eq(tp_augment_apply_boxes(a, &img, &boxes, &rng), TP_OK,
                     "%s", tp_last_error());
        /* the same draws through apply_coords: the box's centre */
        ((float *)pts.data)[0] = 40, ((float *)pts.data)[1] = 27.5f;
        cr_assert_eq(tp_augment_apply_coords(a, &img2, &pts, &r2), TP_OK);
        cr_assert(tp_tensor_equal(&img, &img2));
        float got[4];
        s_bright_box(&img, got);
        if (got[2] <= got[0]) {  /* the crop missed the rectangle */
            tp_tensor_fini(&img);
            tp_tensor_fini(&img2);
            tp_tensor_fini(&boxes);
            tp_tensor_fini(&pts);
            continue;
        }
        /* compare when the moved box lies inside the image: a crop that
         * cut the (turned) rectangle leaves a smaller bright region */
        float W = (float)img.shape[1], H = (float)img.shape[0];
        float want[4] = {b[0], b[1], b[2], b[3]};
        if (b[0] < 0 || b[1] < 0 || b[2] > W || b[3] > H) {
            tp_tensor_fini(&img);
            tp_tensor_fini(&img2);
            tp_tensor_fini(&boxes);
            tp_tensor_fini(&pts);
            continue;
        }
        /* a pixel of rounding, and the rotation's half-pixel centre
         * (tensorpack turns pixel-edge points by its pixel-centre matrix) */
        for (int k = 0; k < 4; k++)
            cr_assert(fabsf(got[k] - want[k]) <= 1.75f,
                      "round %d: box edge %d at %g, the image's at %g", round,
                      k, want[k], got[k]);
        compared++;
        float cx = ((float *)pts.data)[0], cy = ((float *)pts.data)[1];
        cr_assert(fabsf(cx - (b[0] + b[2]) / 2) < 1e-3f &&
                  fabsf(cy - (b[1] + b[3]) / 2) < 1e-3f,
                  "round %d: the centre moved to (%g, %g), the box to %g..%g",
                  round, cx, cy, b[0], b[2]);
        tp_tensor_fini(&img);
        tp_tensor_fini(&img2);
        tp_tensor_fini(&boxes);
        tp_tensor_fini(&pts);
    }
    cr_assert_gt(compared, 10, "only %d of 40 crops kept the rectangle",
                 compared);
    tp_augment_destroy(&a);
}

/* The smaller augmentors: clip, min-max stretch, salt and pepper, JPEG
 * re-encode, random apply and choice. */
Test(image, small_augmentors) {
    tp_rng_t rng;
    tp_rng_init(&rng, 5, 0);
    tp_tensor_t t;
    s_pattern(&t, 16, 16, 3, 0);
    tp_augment_t *a = tp_augment_new();
    cr_assert_eq(tp_augment_add_clip(a, 40, 200), TP_OK);
    cr_assert_eq(tp_augment_add_min_max(a, 0, 255), TP_OK);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    int lo = 255, hi = 0;
    for (size_t i = 0; i < t.nbytes; i++) {
        int v = ((uint8_t *)t.data)[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    cr_assert(lo == 0 && hi == 255, "stretched to %d..%d", lo, hi);
    tp_augment_destroy(&a);

    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_salt_pepper(a, 0.1, 0.1), TP_OK);
    tp_tensor_t g;
    int64_t shape[2] = {100, 100};
    cr_assert_eq(tp_tensor_init(&g, TP_UINT8, 2, shape), TP_OK);
    memset(g.data, 100, g.nbytes);
    cr_assert_eq(tp_augment_apply(a, &g, &rng), TP_OK);
    int white = 0, black = 0;
    for (size_t i = 0; i < g.nbytes; i++) {
        white += ((uint8_t *)g.data)[i] == 255;
        black += ((uint8_t *)g.data)[i] == 0;
    }
    cr_assert(white > 850 && white < 1150 && black > 850 && black < 1150,
              "white %d black %d of 10000 (about 1000 each)", white, black);
    tp_augment_destroy(&a);

    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_jpeg_noise(a, 30, 60), TP_OK);
    tp_tensor_t before;
    cr_assert_eq(tp_tensor_copy(&before, &t), TP_OK);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    cr_assert(tp_tensor_same_shape(&t, &before));
    cr_assert(!tp_tensor_equal(&t, &before), "re-encoding changed nothing");
    tp_augment_destroy(&a);

    /* random-apply with p 0 never runs, random-choice of one always does */
    a = tp_augment_new();
    tp_augment_t *sub = tp_augment_new();
    cr_assert_eq(tp_augment_add_vflip(sub, 1), TP_OK);
    cr_assert_eq(tp_augment_add_random_apply(a, &sub, 0.0), TP_OK);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    cr_assert_eq(tp_augment_add_random_choice(a, (tp_augment_t *[]){NULL}, 1),
                 TP_ERR_INVALID);
    tp_augment_destroy(&a);
    tp_tensor_fini(&t);
    tp_tensor_fini(&g);
    tp_tensor_fini(&before);
}

/* Motion blur at 0 degrees, length 3, is the mean of a pixel and its left
 * and right neighbours (the border replicated); at 90 degrees, of the ones
 * above and below. Bad ranges are errors, in the C API and the spec. */
Test(image, motion_blur_lines_and_errors) {
    tp_tensor_t t;
    s_pattern(&t, 9, 11, 1, 3);
    for (size_t i = 0; i < t.nbytes; i++)  /* not linear: a blur shows */
        ((uint8_t *)t.data)[i] = (uint8_t)((i * 101 + (i * i) % 7 * 37) & 255);
    for (int vert = 0; vert < 2; vert++) {
        tp_tensor_t o;
        cr_assert_eq(tp_tensor_copy(&o, &t), TP_OK);
        tp_augment_t *a = tp_augment_new();
        double d = vert ? 90 : 0;
        cr_assert_eq(tp_augment_add_motion_blur(a, 3, 3, d, d), TP_OK);
        tp_rng_t rng;
        tp_rng_init(&rng, 1, 0);
        cr_assert_eq(tp_augment_apply(a, &o, &rng), TP_OK, "%s",
                     tp_last_error());
        const uint8_t *p = t.data, *q = o.data;
        for (int y = 0; y < 9; y++)
            for (int x = 0; x < 11; x++) {
                int s = 0;
                for (int i = -1; i <= 1; i++) {
                    int yy = vert ? y + i : y, xx = vert ? x : x + i;
                    yy = yy < 0 ? 0 : yy > 8 ? 8 : yy;
                    xx = xx < 0 ? 0 : xx > 10 ? 10 : xx;
                    s += p[yy * 11 + xx];
                }
                int want = (int)floor(s / 3.0 + 0.5);
                cr_assert(abs(q[y * 11 + x] - want) <= 1,
                          "%s blur at (%d,%d): %d, want %d",
                          vert ? "vertical" : "horizontal", y, x,
                          q[y * 11 + x], want);
            }
        tp_augment_destroy(&a);
        tp_tensor_fini(&o);
    }
    tp_tensor_fini(&t);
    tp_augment_t *a = tp_augment_new();
    cr_assert_eq(tp_augment_add_motion_blur(a, 4, 7, 0, 360), TP_ERR_INVALID);
    cr_assert_eq(tp_augment_add_motion_blur(a, 3, 33, 0, 360), TP_ERR_INVALID);
    cr_assert_eq(tp_augment_add_motion_blur(a, 7, 3, 0, 360), TP_ERR_INVALID);
    cr_assert_eq(tp_augment_add_motion_blur(a, 3, 5, 90, 0), TP_ERR_INVALID);
    tp_augment_destroy(&a);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse("fake:shape=8x8x3:uint8 | imgaug motion-blur=3",
                               &df), TP_ERR_INVALID);
    cr_assert_eq(tp_spec_parse("fake:shape=8x8x3:uint8 | imgaug "
                               "motion-blur=1e30:3", &df), TP_ERR_INVALID);
    cr_assert_eq(tp_spec_parse("fake:shape=8x8x3:uint8 | imgaug "
                               "min-max-channels=1e30:3", &df), TP_ERR_INVALID);
    cr_assert_eq(tp_spec_parse("fake:shape=8x8x3:uint8,size=2 | imgaug "
                               "min-max-channels=0:255, mean-var-channels", &df),
                 TP_OK, "%s", tp_last_error());
    tp_dataflow_destroy(&df);
    cr_assert_eq(tp_spec_parse("fake:shape=8x8x3:uint8,size=2 | imgaug "
                               "motion-blur=3:9:-30:30", &df), TP_OK, "%s",
                 tp_last_error());
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
}

/* random-order / random-choice / random-apply group other augmentors in a
 * spec (';' between them): tensorpack's fbresnet colour jitter is
 * RandomOrderAug over four of them. */
Test(image, random_groups_in_a_spec) {
    tp_dataflow_t *df = NULL;
    const char *spec =
        "fake:shape=20x30x3:uint8,size=8 | imgaug random-order="
        "brightness-scale=0.6:1.4;contrast=0.6:1.4;saturation=0.4;"
        "lighting=0.1, random-apply=0.5;flip=1;vflip=1, "
        "random-choice=grey;noise=3;clip=10:240 | batch 8";
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_datapoint_cget(dp, 0)->shape[3], 3);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    /* probability 0: the group never runs, the image is untouched */
    cr_assert_eq(tp_spec_parse("fake:shape=6x7x3:uint8,size=4,random=0 | "
                               "imgaug random-apply=0;vflip=1;flip=1", &df),
                 TP_OK, "%s", tp_last_error());
    tp_dataflow_t *plain = NULL;
    cr_assert_eq(tp_spec_parse("fake:shape=6x7x3:uint8,size=4,random=0", &plain),
                 TP_OK);
    cr_assert_eq(tp_dataflow_reset_state(df, 3, 0), TP_OK);
    cr_assert_eq(tp_dataflow_reset_state(plain, 3, 0), TP_OK);
    tp_datapoint_t *x, *y;
    cr_assert_eq(tp_dataflow_next(df, &x), TP_OK);
    cr_assert_eq(tp_dataflow_next(plain, &y), TP_OK);
    cr_assert(tp_datapoint_equal(x, y));
    tp_datapoint_destroy(&x);
    tp_datapoint_destroy(&y);
    tp_dataflow_destroy(&df);
    tp_dataflow_destroy(&plain);

    cr_assert_eq(tp_spec_parse("fake | imgaug random-order=flip;spin=3", &df),
                 TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "spin"), "%s", tp_last_error());
    cr_assert_eq(tp_spec_parse("fake | imgaug random-apply=0.5", &df),
                 TP_ERR_INVALID);
}

/* ---- what a source holds, channels first (issue 43) ------------------------- */

/* The classes are the sub-folders in tp_df_image_folder's label order (the
 * first image's channels say grey or colour); a class folder without an
 * image is an error naming it. */
Test(image, folder_classes_and_source_info) {
    char p[512];
    static const char *cls[] = {"b", "B", "a_2", "10", "9"};
    for (int k = 0; k < 5; k++) {
        snprintf(p, sizeof p, "%s/%s", s_dir, cls[k]);
        cr_assert_eq(mkdir(p, 0755), 0);
        snprintf(p, sizeof p, "%s/%s/0.png", s_dir, cls[k]);
        s_write_png(p, 8, 8, k == 3 ? 1 : 3, k);  /* "10" is first and grey */
    }
    char **names, first[512];
    int n;
    cr_assert_eq(tp_image_folder_classes(s_dir, &names, &n, first, sizeof first), TP_OK);
    cr_assert_eq(n, 5);
    static const char *want[] = {"10", "9", "B", "a_2", "b"};  /* byte order */
    for (int i = 0; i < n; i++) {
        cr_expect_str_eq(names[i], want[i]);
        free(names[i]);
    }
    free(names);
    snprintf(p, sizeof p, "%s/10/0.png", s_dir);
    cr_expect_str_eq(first, p);
    tp_image_source_info_t info;
    tp_image_source_info_init(&info);
    snprintf(p, sizeof p, "imagefolder:%s,shuffle=0", s_dir);
    cr_assert_eq(tp_image_source_info(p, &info), TP_OK, "%s", tp_last_error());
    cr_expect_eq(info.nclasses, 5);
    /* the first image is grey, the other classes' are colour: a grey
     * image in a colour folder, the folder is colour */
    cr_expect_eq(info.channels, 3, "grey first image, colour classes");
    cr_expect_str_eq(info.classes[2], "B");
    tp_image_source_info_fini(&info);
    /* all grey: grey */
    snprintf(p, sizeof p, "%s/grey", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/grey/c%d", s_dir, k);
        cr_assert_eq(mkdir(p, 0755), 0);
        snprintf(p, sizeof p, "%s/grey/c%d/0.png", s_dir, k);
        s_write_png(p, 8, 8, 1, k);
    }
    snprintf(p, sizeof p, "imagefolder:%s/grey", s_dir);
    cr_assert_eq(tp_image_source_info(p, &info), TP_OK, "%s", tp_last_error());
    cr_expect_eq(info.channels, 1);
    tp_image_source_info_fini(&info);
    /* a list: the largest label + 1, the first image's channels */
    snprintf(p, sizeof p, "%s/list.txt", s_dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "# comment\nb/0.png 4\n10/0.png 0\n");
    fclose(f);
    snprintf(p, sizeof p, "imagelist:%s/list.txt", s_dir);
    cr_assert_eq(tp_image_source_info(p, &info), TP_OK, "%s", tp_last_error());
    cr_expect_eq(info.nclasses, 5);
    cr_expect_eq(info.channels, 3);
    cr_expect_str_eq(info.classes[4], "4");
    tp_image_source_info_fini(&info);
    /* CIFAR-10: its names; another source: unsupported */
    cr_assert_eq(tp_image_source_info("cifar:/nowhere/data_batch_1.bin", &info), TP_OK);
    cr_expect_eq(info.nclasses, 10);
    cr_expect_eq(info.channels, 3);
    cr_expect_str_eq(info.classes[9], "truck");
    cr_assert_eq(tp_image_source_info("cifar:/nowhere/train.bin,cifar100,fine", &info), TP_OK);
    cr_expect_eq(info.nclasses, 100);
    cr_expect_eq(tp_image_source_info("fashion-mnist:train", &info), TP_ERR_UNSUPPORTED);
    tp_image_source_info_fini(&info);
    /* an empty class folder: named when the source is made */
    snprintf(p, sizeof p, "%s/empty", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    cr_expect_null(tp_df_image_folder(s_dir, NULL));
    cr_expect(strstr(tp_last_error(), p) && strstr(tp_last_error(), "holds no images"),
              "%s", tp_last_error());
}

/* imgaug chw: HWC to CHW for uint8 and float32 (after normalisation); an
 * HW image stays as it is. */
Test(image, chw_puts_the_channels_first) {
    tp_tensor_t t;
    s_pattern(&t, 2, 3, 3, 1);
    tp_tensor_t want;
    cr_assert_eq(tp_tensor_copy(&want, &t), TP_OK);
    tp_augment_t *a = tp_augment_new();
    cr_assert_eq(tp_augment_add_to_chw(a), TP_OK);
    tp_rng_t rng;
    tp_rng_init(&rng, 1, 0);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK, "%s", tp_last_error());
    cr_assert_eq(t.ndim, 3);
    cr_assert(t.shape[0] == 3 && t.shape[1] == 2 && t.shape[2] == 3);
    const uint8_t *o = t.data, *w = want.data;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 6; i++)
            cr_expect_eq(o[c * 6 + i], w[i * 3 + c]);
    tp_tensor_fini(&t);
    /* float32 through the spec: normalise, then chw */
    tp_augment_destroy(&a);
    tp_dataflow_t *df = NULL;
    char spec[256];
    snprintf(spec, sizeof spec, "fake:shape=4x5x3:uint8,size=2 | augment mean=1/2/3,"
             "std=2 | imgaug chw");
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    const tp_tensor_t *x = tp_datapoint_cget(dp, 0);
    cr_expect_eq(x->dtype, TP_FLOAT32);
    cr_expect(x->ndim == 3 && x->shape[0] == 3 && x->shape[1] == 4 && x->shape[2] == 5);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
    /* HW: untouched */
    s_pattern(&t, 2, 3, 1, 1);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_to_chw(a), TP_OK);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    cr_expect(t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3);
    tp_augment_destroy(&a);
    tp_tensor_fini(&t);
    tp_tensor_fini(&want);
}

/* tp-train's crop and cifar presets send uint8 (the model normalises):
 * `imgaug random-crop=HxW:PAD,flip` draws the crops and flips that
 * `augment crop=H,pad=PAD,flip` drew when it normalised to float32, so the
 * model sees the same pictures (grey and colour, channels first). */
Test(image, the_uint8_crop_draws_what_the_normalising_one_drew) {
    const char *shapes[2] = {"28x28:uint8", "20x24x3:uint8"};
    const char *chw[2] = {"", " | imgaug chw"}, *chw2[2] = {"", ",chw"};
    const char *mean[2] = {"0", "10/20/30"}, *std[2] = {"255", "50/60/70"};
    for (int k = 0; k < 2; k++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "fake:shape=%s,size=16 | augment crop=18,pad=3,flip,mean=%s,"
                 "std=%s%s | batch 16", shapes[k], mean[k], std[k], chw[k]);
        snprintf(b, sizeof b, "fake:shape=%s,size=16 | imgaug random-crop=18x18:3,flip%s "
                 "| batch 16", shapes[k], chw2[k]);
        tp_dataflow_t *fa = NULL, *fb = NULL;
        cr_assert_eq(tp_spec_parse(a, &fa), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_spec_parse(b, &fb), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_reset_state(fa, 7, 0), TP_OK);
        cr_assert_eq(tp_dataflow_reset_state(fb, 7, 0), TP_OK);
        tp_datapoint_t *da, *db;
        cr_assert_eq(tp_dataflow_next(fa, &da), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_next(fb, &db), TP_OK, "%s", tp_last_error());
        const tp_tensor_t *x = tp_datapoint_cget(da, 0), *y = tp_datapoint_cget(db, 0);
        cr_assert_eq(x->dtype, TP_FLOAT32);
        cr_assert_eq(y->dtype, TP_UINT8);
        cr_assert_eq(x->ndim, y->ndim);
        for (int d = 0; d < x->ndim; d++)
            cr_assert_eq(x->shape[d], y->shape[d], "%s: dim %d", shapes[k], d);
        const float *xf = x->data;
        const uint8_t *yu = y->data;
        size_t n = (size_t)tp_tensor_numel(y), plane = 18 * 18, bad = 0;
        float m[3] = {0, 10, 20}, sd[3] = {255, 50, 60};
        if (k == 1)
            m[0] = 10, m[1] = 20, m[2] = 30, sd[0] = 50, sd[1] = 60, sd[2] = 70;
        for (size_t i = 0; i < n; i++) {
            int c = k ? (int)(i / plane % 3) : 0;
            bad += fabsf(xf[i] - ((float)yu[i] - m[c]) / sd[c]) > 1e-5f;
        }
        cr_expect_eq(bad, 0, "%s: %zu of %zu pixels differ", shapes[k], bad, n);
        tp_datapoint_destroy(&da);
        tp_datapoint_destroy(&db);
        tp_dataflow_destroy(&fa);
        tp_dataflow_destroy(&fb);
    }
    tp_dataflow_t *df = NULL;
    cr_expect_eq(tp_spec_parse("fake | imgaug random-crop=8x8:-1", &df), TP_ERR_INVALID);
}

/* Must hold: a grid puts image i at row i / columns, column i % columns,
 * after `pad` black pixels and pad between tiles; [lo, hi] maps to 0..255
 * (clamped, NaN 0); colour stays HWC; a bad batch is refused naming it. */
Test(image, grid_tiles_and_scales) {
    /* 5 grey 2x3 images, values -1 .. 1 (a tanh output), 3 columns, pad 1 */
    int64_t shape[4] = {5, 1, 2, 3};
    tp_tensor_t b, g;
    cr_assert_eq(tp_tensor_init(&b, TP_FLOAT32, 4, shape), TP_OK);
    float *v = b.data;
    for (int i = 0; i < 5 * 6; i++)
        v[i] = -1.f + (float)(i % 6) / 2.5f;  /* -1, -0.6, ..., 1 */
    v[6] = NAN;
    v[7] = 7.f;
    cr_assert_eq(tp_image_grid(&b, -1.f, 1.f, 3, 1, &g), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g.dtype, TP_UINT8);
    cr_assert_eq(g.ndim, 3);
    cr_assert_eq(g.shape[0], 2 * 3 + 1);  /* 2 rows of 2 + pad */
    cr_assert_eq(g.shape[1], 3 * 4 + 1);
    cr_assert_eq(g.shape[2], 1);
    const uint8_t *p = g.data;
    int64_t W = g.shape[1];
    cr_assert_eq(p[0], 0, "padding is black");
    cr_assert_eq(p[1 * W + 1], 0, "image 0 pixel (0,0) = -1 -> 0");
    cr_assert_eq(p[2 * W + 3], 255, "image 0 pixel (1,2) = 1 -> 255");
    cr_assert_eq(p[1 * W + 2], 51, "-0.6 -> 51 (%d)", p[1 * W + 2]);
    cr_assert_eq(p[1 * W + 5], 0, "image 1 pixel (0,0): NaN -> 0");
    cr_assert_eq(p[1 * W + 6], 255, "image 1 pixel (0,1): 7 clamps to 255");
    cr_assert_eq(p[4 * W + 1], 0, "image 3 starts the second row (at y 4): -1");
    cr_assert_eq(p[5 * W + 3], 255, "image 3 (1,2)");
    cr_assert_eq(p[5 * W + 11], 0, "no image 5: black");
    tp_tensor_fini(&g);
    tp_tensor_fini(&b);
    /* colour: [2, 3, 1, 1], red and blue */
    int64_t cs[4] = {2, 3, 1, 1};
    cr_assert_eq(tp_tensor_init_zero(&b, TP_FLOAT32, 4, cs), TP_OK);
    v = b.data;
    v[0] = 1.f;  /* image 0, R */
    v[5] = 1.f;  /* image 1, B */
    cr_assert_eq(tp_image_grid(&b, 0.f, 1.f, 0, 0, &g), TP_OK, "%s", tp_last_error());
    cr_assert_eq(g.shape[0], 1);  /* 2 images: a 2-column square of 1 row */
    cr_assert_eq(g.shape[1], 2);
    cr_assert_eq(g.shape[2], 3);
    p = g.data;
    cr_assert(p[0] == 255 && p[1] == 0 && p[2] == 0 && p[3] == 0 && p[4] == 0 && p[5] == 255,
              "%d %d %d | %d %d %d", p[0], p[1], p[2], p[3], p[4], p[5]);
    tp_tensor_fini(&g);
    tp_tensor_fini(&b);
    /* refused: 2 channels, an integer batch, an empty range */
    int64_t bad[4] = {1, 2, 2, 2};
    cr_assert_eq(tp_tensor_init_zero(&b, TP_FLOAT32, 4, bad), TP_OK);
    cr_assert_eq(tp_image_grid(&b, 0.f, 1.f, 0, 0, &g), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "1 or 3 channels"), "%s", tp_last_error());
    tp_tensor_fini(&b);
    int64_t ok[3] = {1, 2, 2};
    cr_assert_eq(tp_tensor_init_zero(&b, TP_INT32, 3, ok), TP_OK);
    cr_assert_eq(tp_image_grid(&b, 0.f, 1.f, 0, 0, &g), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "float32"), "%s", tp_last_error());
    tp_tensor_fini(&b);
    cr_assert_eq(tp_tensor_init_zero(&b, TP_FLOAT32, 3, ok), TP_OK);
    cr_assert_eq(tp_image_grid(&b, 1.f, 1.f, 0, 0, &g), TP_ERR_INVALID);
    tp_tensor_fini(&b);
}

/* A picture with detail everywhere (noise on a gradient): JPEG's blocks and
 * its chroma upsampling differ from place to place. */
static void s_noisy(tp_tensor_t *t, int h, int w, int c, uint32_t seed) {
    s_pattern(t, h, w, c, (int)seed);
    uint8_t *p = t->data;
    for (size_t i = 0; i < t->nbytes; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(p[i] / 2 + (seed >> 25));
    }
}

typedef struct {
    int rect[4];
    int h, w;  /* the size pick was shown */
} fixed_pick_t;

static void s_fixed_pick(void *user, int height, int width, int rect[4]) {
    fixed_pick_t *f = user;
    f->h = height;
    f->w = width;
    memcpy(rect, f->rect, sizeof f->rect);
}

/* tp_image_decode_region decodes only a JPEG's band around the rectangle
 * (libjpeg-turbo's crop and skip): the result must be the whole decode's
 * pixels there, byte for byte, for 4:2:0 colour, grey, decoded to RGB from
 * grey, and at a reduced DCT scale (min_short), at the edges and inside.
 * (Without the margin around the band, the upsampling's edge differs.) */
Test(image, a_region_decodes_as_the_whole_image_cut) {
    static const struct { int c, mode, min_short; } cases[] = {
        {3, TP_IMAGE_RGB, 0}, {1, TP_IMAGE_GREY, 0}, {1, TP_IMAGE_RGB, 0},
        {3, TP_IMAGE_RGB, 100}, {3, TP_IMAGE_GREY, 0}};
    uint32_t r = 7;
#define RND(k) ((r = r * 1664525u + 1013904223u), (int)((r >> 8) % (uint32_t)(k)))
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        tp_tensor_t img;
        s_noisy(&img, 237, 311, cases[k].c, (uint32_t)k + 1);
        void *jpg;
        size_t n;
        cr_assert_eq(tp_image_encode_jpeg(&img, 90, &jpg, &n), TP_OK, "%s", tp_last_error());
        tp_tensor_fini(&img);
        tp_image_opts_t o;
        tp_image_opts_init(&o);
        o.mode = (tp_image_mode_t)cases[k].mode;
        o.min_short = cases[k].min_short;
        tp_tensor_t whole;
        cr_assert_eq(tp_image_decode(jpg, n, &o, "whole", &whole), TP_OK, "%s", tp_last_error());
        int H = (int)whole.shape[0], W = (int)whole.shape[1];
        size_t C = whole.ndim == 3 ? (size_t)whole.shape[2] : 1;
        if (cases[k].min_short)
            cr_assert_lt(H, 237, "min_short %d decodes smaller", cases[k].min_short);
        for (int t = 0; t < 40; t++) {
            fixed_pick_t f;
            f.rect[2] = 1 + RND(H);
            f.rect[3] = 1 + RND(W);
            f.rect[0] = RND(H - f.rect[2] + 1);
            f.rect[1] = RND(W - f.rect[3] + 1);
            if (t == 0)  /* the whole image */
                f.rect[0] = f.rect[1] = 0, f.rect[2] = H, f.rect[3] = W;
            if (t == 1)  /* the bottom-right corner */
                f.rect[2] = 9, f.rect[3] = 13, f.rect[0] = H - 9, f.rect[1] = W - 13;
            tp_tensor_t part;
            cr_assert_eq(tp_image_decode_region(jpg, n, &o, "part", s_fixed_pick, &f, &part),
                         TP_OK, "%s", tp_last_error());
            cr_assert_eq(f.h, H);
            cr_assert_eq(f.w, W);
            cr_assert_eq(part.ndim, whole.ndim);
            cr_assert_eq(part.shape[0], f.rect[2]);
            cr_assert_eq(part.shape[1], f.rect[3]);
            for (int y = 0; y < f.rect[2]; y++)
                cr_assert_eq(memcmp((uint8_t *)part.data + (size_t)y * f.rect[3] * C,
                                    (uint8_t *)whole.data +
                                        ((size_t)(f.rect[0] + y) * W + f.rect[1]) * C,
                                    (size_t)f.rect[3] * C), 0,
                             "case %zu: row %d of %dx%d at (%d, %d) differs", k, y,
                             f.rect[2], f.rect[3], f.rect[0], f.rect[1]);
            tp_tensor_fini(&part);
        }
        /* a rectangle outside the image is refused, naming it */
        fixed_pick_t bad = {{H - 4, 0, 8, 8}, 0, 0};
        tp_tensor_t part;
        cr_assert_eq(tp_image_decode_region(jpg, n, &o, "bad.jpg", s_fixed_pick, &bad, &part),
                     TP_ERR_INVALID);
        cr_assert_not_null(strstr(tp_last_error(), "bad.jpg"), "%s", tp_last_error());
        /* the file cut in half: a region in its lost rows is an error naming
         * it (libjpeg's warning stops the decode, as TurboJPEG's does) */
        fixed_pick_t low = {{H - 10, 0, 10, W}, 0, 0};
        cr_assert_eq(tp_image_decode_region(jpg, n / 2, &o, "cut.jpg", s_fixed_pick, &low,
                                            &part), TP_ERR_FORMAT, "case %zu", k);
        cr_assert_not_null(strstr(tp_last_error(), "cut.jpg"), "%s", tp_last_error());
        tp_tensor_fini(&whole);
        free(jpg);
    }
    /* a PNG is decoded whole and cut */
    tp_tensor_t img;
    s_noisy(&img, 40, 50, 3, 3);
    void *png;
    size_t n;
    cr_assert_eq(tp_image_encode_png(&img, &png, &n), TP_OK);
    fixed_pick_t f = {{5, 7, 20, 30}, 0, 0};
    tp_tensor_t part;
    cr_assert_eq(tp_image_decode_region(png, n, NULL, "p.png", s_fixed_pick, &f, &part), TP_OK);
    for (int y = 0; y < 20; y++)
        cr_assert_eq(memcmp((uint8_t *)part.data + (size_t)y * 30 * 3,
                            (uint8_t *)img.data + ((size_t)(5 + y) * 50 + 7) * 3, 30 * 3), 0);
    tp_tensor_fini(&part);
    tp_tensor_fini(&img);
    free(png);
#undef RND
}

/* The sources' random-resized-crop= draws the crop before decoding and
 * decodes only its band: with the crop's area and aspect pinned to the
 * whole square image it is imgaug's resize of the whole image, byte for
 * byte; drawn, every image is SIZE x SIZE and the crops vary; with raw it
 * is refused. */
Test(image, a_source_decodes_only_its_random_resized_crop) {
    char p[512];
    snprintf(p, sizeof p, "%s/c", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    for (int i = 0; i < 4; i++) {
        tp_tensor_t img;
        s_noisy(&img, 120, 120, 3, (uint32_t)i + 10);
        snprintf(p, sizeof p, "%s/c/%d.jpg", s_dir, i);
        s_write_jpeg(p, &img);
    }
    char fused[600], two[600], drawn[600];
    snprintf(fused, sizeof fused, "imagefolder:%s,mode=rgb,shuffle=0,"
             "random-resized-crop=48:1:1:1:1", s_dir);
    snprintf(two, sizeof two, "imagefolder:%s,mode=rgb,shuffle=0 | imgaug resize=48x48", s_dir);
    snprintf(drawn, sizeof drawn, "imagefolder:%s,mode=rgb,shuffle=0,random-resized-crop=48",
             s_dir);
    tp_dataflow_t *a, *b, *c;
    cr_assert_eq(tp_spec_parse(fused, &a), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_spec_parse(two, &b), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_spec_parse(drawn, &c), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(a, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_reset_state(b, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_reset_state(c, 1, 0), TP_OK);
    int differ = 0;
    for (int i = 0; i < 4; i++) {
        tp_datapoint_t *x, *y, *z;
        cr_assert_eq(tp_dataflow_next(a, &x), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_next(b, &y), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_next(c, &z), TP_OK, "%s", tp_last_error());
        const tp_tensor_t *tx = tp_datapoint_cget(x, 0), *ty = tp_datapoint_cget(y, 0),
                          *tz = tp_datapoint_cget(z, 0);
        cr_assert_eq(tx->shape[0], 48);
        cr_assert_eq(tx->shape[1], 48);
        cr_assert_eq(tx->nbytes, ty->nbytes);
        cr_assert_eq(memcmp(tx->data, ty->data, tx->nbytes), 0, "image %d", i);
        cr_assert_eq(tz->ndim, 3);
        cr_assert_eq(tz->shape[0], 48);
        cr_assert_eq(tz->shape[1], 48);
        cr_assert_eq(tz->shape[2], 3);
        differ += memcmp(tz->data, ty->data, tz->nbytes) != 0;
        tp_datapoint_destroy(&x);
        tp_datapoint_destroy(&y);
        tp_datapoint_destroy(&z);
    }
    cr_expect_geq(differ, 3, "the drawn crops are the whole image %d times of 4", 4 - differ);
    tp_dataflow_destroy(&a);
    tp_dataflow_destroy(&b);
    tp_dataflow_destroy(&c);
    snprintf(drawn, sizeof drawn, "imagefolder:%s,raw,random-resized-crop=48", s_dir);
    cr_assert_neq(tp_spec_parse(drawn, &c), TP_OK);
    cr_assert_not_null(strstr(tp_last_error(), "raw"), "%s", tp_last_error());
}

/* min_short picks among the DCT scales 1, 1/2, 1/4, 1/8 only: libjpeg-
 * turbo's other eighths (7/8 for a 256-pixel side and 224, say) run its
 * generic scaled IDCT, slower than decoding the whole image. */
Test(image, min_short_takes_only_the_fast_scales) {
    tp_tensor_t img;
    s_noisy(&img, 200, 256, 3, 5);
    void *jpg;
    size_t n;
    cr_assert_eq(tp_image_encode_jpeg(&img, 90, &jpg, &n), TP_OK);
    static const struct { int min_short, h, w; } cases[] = {
        {170, 200, 256}, {101, 200, 256}, {100, 100, 128}, {26, 50, 64}, {25, 25, 32},
        {1, 25, 32}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        tp_image_opts_t o;
        tp_image_opts_init(&o);
        o.min_short = cases[k].min_short;
        tp_tensor_t t;
        cr_assert_eq(tp_image_decode(jpg, n, &o, "x.jpg", &t), TP_OK, "%s", tp_last_error());
        cr_expect(t.shape[0] == cases[k].h && t.shape[1] == cases[k].w,
                  "min_short %d: %lldx%lld, want %dx%d", cases[k].min_short,
                  (long long)t.shape[0], (long long)t.shape[1], cases[k].h, cases[k].w);
        tp_tensor_fini(&t);
    }
    free(jpg);
    tp_tensor_fini(&img);
}

/* A list's lines read alike by the imagelist source and by the source info's
 * scan of it (one parser, dataflow/image/img_sources.c): a relative PATH
 * beside the list, under root= when given, an absolute PATH as it stands
 * (the first image's channels say which file the scan found: a grey one
 * beside the list, a colour one elsewhere); a bad line named whole. */
Test(image, a_lists_paths_resolve_alike_in_the_source_and_the_scan) {
    char p[512], list[512], spec[1024];
    const char *dirs[] = {"lst", "rt", "abs"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", s_dir, dirs[i]);
        cr_assert_eq(mkdir(p, 0755), 0);
        snprintf(p, sizeof p, "%s/%s/a b.png", s_dir, dirs[i]);
        s_write_png(p, 5, 4, i ? 3 : 1, i);
    }
    snprintf(list, sizeof list, "%s/lst/l.txt", s_dir);
    const char *rel = "  # spaces, then a comment\n\na b.png\t 2 \r\n";
    s_write(list, rel, strlen(rel));
    const char *roots[] = {"", ",root=", ""};
    for (int i = 0; i < 3; i++) {
        if (i == 2) { /* an absolute path, whatever the list's folder */
            snprintf(p, sizeof p, "%s/abs/a b.png 2\n", s_dir);
            s_write(list, p, strlen(p));
        }
        snprintf(spec, sizeof spec, "imagelist:%s%s%s%s", list, roots[i],
                 i == 1 ? s_dir : "", i == 1 ? "/rt" : "");
        tp_image_source_info_t info;
        tp_image_source_info_init(&info);
        cr_assert_eq(tp_image_source_info(spec, &info), TP_OK, "%s: %s", spec,
                     tp_last_error());
        cr_expect_eq(info.nclasses, 3, "%s", spec);
        cr_expect_eq(info.channels, i ? 3 : 1, "%s: the scan's first image", spec);
        tp_image_source_info_fini(&info);
        char src[1100];
        snprintf(src, sizeof src, "%s,shuffle=0", spec);
        tp_dataflow_t *df = NULL;
        cr_assert_eq(tp_spec_parse(src, &df), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s: %s", spec, tp_last_error());
        const tp_tensor_t *img = tp_datapoint_cget(dp, 0);
        cr_expect_eq(img->ndim == 3 ? img->shape[2] : 1, i ? 3 : 1, "%s: the source's", spec);
        cr_expect_eq(*(const int32_t *)tp_datapoint_cget(dp, 1)->data, 2);
        tp_datapoint_destroy(&dp);
        tp_dataflow_destroy(&df);
    }
    const char *bad = "a b.png 2\na b.png seven \n";
    s_write(list, bad, strlen(bad));
    cr_assert_null(tp_df_image_list(list, NULL, NULL));
    cr_expect(strstr(tp_last_error(), "l.txt:2") && strstr(tp_last_error(), "'a b.png seven'"),
              "%s", tp_last_error());
    tp_image_source_info_t info;
    tp_image_source_info_init(&info);
    snprintf(spec, sizeof spec, "imagelist:%s", list);
    cr_assert_eq(tp_image_source_info(spec, &info), TP_ERR_FORMAT);
    cr_expect(strstr(tp_last_error(), "l.txt:2") && strstr(tp_last_error(), "'a b.png seven'"),
              "%s", tp_last_error());
    tp_image_source_info_fini(&info);
}

/* ---- people's own folders: the edges torchvision's ImageFolder meets ---------- */

/* A folder as people's are: upper-case extensions, a README and a
 * .DS_Store (skipped), a hidden .ipynb_checkpoints folder (skipped: not a
 * class, unlike torchvision, docs/images.md), a class folder that is a
 * link (entered, as torchvision's is_dir() enters it). Then a link back
 * up (a loop: an error naming it) and a .bmp (taken, as torchvision
 * takes it). */
Test(image, own_folders_links_hidden_and_other_formats) {
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/data", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/data/a", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    static const char *names[] = {"x.JPG", "y.JPEG", "z.PNG"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/data/a/%s", s_dir, names[i]);
        if (i < 2) {
            tp_tensor_t t;
            s_pattern(&t, 8, 8, 3, i);
            s_write_jpeg(p, &t);
        } else {
            s_write_png(p, 8, 8, 3, i);
        }
    }
    snprintf(p, sizeof p, "%s/data/a/README.txt", s_dir);
    s_write(p, "my photos\n", 10);
    snprintf(p, sizeof p, "%s/data/a/.DS_Store", s_dir);
    s_write(p, "\0\0\0\1Bud1", 8);
    snprintf(p, sizeof p, "%s/data/.ipynb_checkpoints", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/data/.ipynb_checkpoints/c.png", s_dir);
    s_write_png(p, 8, 8, 3, 5);
    /* class b lives elsewhere, linked in */
    snprintf(p, sizeof p, "%s/elsewhere", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/elsewhere/b.png", s_dir);
    s_write_png(p, 8, 9, 3, 6);
    snprintf(p, sizeof p, "%s/data/b", s_dir);
    snprintf(q, sizeof q, "%s/elsewhere", s_dir);
    cr_assert_eq(symlink(q, p), 0);
    snprintf(p, sizeof p, "%s/data", s_dir);
    tp_dataflow_t *df = tp_df_image_folder(p, NULL);
    cr_assert(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_size(df), 4);
    char **cls;
    int ncls;
    cr_assert_eq(tp_image_folder_classes(p, &cls, &ncls, NULL, 0), TP_OK);
    cr_assert_eq(ncls, 2);
    cr_assert_str_eq(cls[0], "a");
    cr_assert_str_eq(cls[1], "b");
    for (int i = 0; i < ncls; i++)
        free(cls[i]);
    free(cls);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    int n = 0;
    while (tp_dataflow_next(df, &dp) == TP_OK) {
        const tp_tensor_t *img = tp_datapoint_cget(dp, 0);
        int label = *(const int32_t *)tp_datapoint_cget(dp, 1)->data;
        cr_assert_eq(label, img->shape[1] == 9 ? 1 : 0);
        n++;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(n, 4);
    tp_dataflow_destroy(&df);

    /* a link back up: an error naming it, not a walk without end */
    snprintf(q, sizeof q, "%s/data/a/loop", s_dir);
    cr_assert_eq(symlink("..", q), 0);
    cr_assert_null(tp_df_image_folder(p, NULL));
    cr_assert(strstr(tp_last_error(), "a/loop") && strstr(tp_last_error(), "loop"),
              "%s", tp_last_error());
    cr_assert_eq(unlink(q), 0);

    /* a BMP torchvision would read: in the folder now (issue 43); this
     * one is two bytes, so its read is an error naming it */
    snprintf(q, sizeof q, "%s/data/a/w.Bmp", s_dir);
    s_write(q, "BM", 2);
    df = tp_df_image_folder(p, NULL);
    cr_assert(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_size(df), 5);
    tp_dataflow_destroy(&df);
    tp_tensor_t bad;
    cr_assert_eq(tp_image_read(q, NULL, &bad), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "a/w.Bmp") && strstr(tp_last_error(), "BMP"),
              "%s", tp_last_error());
}

/* Images smaller than the crop, 1x1, 1 x 400 and 3 x 900: the random resized
 * crop still gives crop x crop (torchvision's fallback: the centre crop
 * of the allowed ratio, scaled up), in RGB whatever the file held (a grey
 * JPEG in a colour folder, an RGBA PNG). */
Test(image, tiny_and_wide_images_crop_to_size) {
    char p[512];
    snprintf(p, sizeof p, "%s/c", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/c/one.png", s_dir);
    s_write_png(p, 1, 1, 4, 1);
    snprintf(p, sizeof p, "%s/c/wide.png", s_dir);
    s_write_png(p, 1, 400, 3, 2);
    snprintf(p, sizeof p, "%s/c/tall.png", s_dir);
    s_write_png(p, 300, 2, 1, 3);
    tp_tensor_t t;
    s_pattern(&t, 5, 7, 1, 4);
    snprintf(p, sizeof p, "%s/c/grey.jpg", s_dir);
    s_write_jpeg(p, &t);
    /* JPEGs go through the band decode (only the crop's rows) */
    s_pattern(&t, 1, 1, 3, 5);
    snprintf(p, sizeof p, "%s/c/one.jpg", s_dir);
    s_write_jpeg(p, &t);
    s_pattern(&t, 3, 900, 3, 6);
    snprintf(p, sizeof p, "%s/c/wide.jpg", s_dir);
    s_write_jpeg(p, &t);
    tp_image_source_opts_t o;
    tp_image_source_opts_init(&o);
    o.decode.mode = TP_IMAGE_RGB;
    o.crop_size = 24;
    tp_dataflow_t *df = tp_df_image_folder(s_dir, &o);
    cr_assert(df, "%s", tp_last_error());
    for (int epoch = 0; epoch < 3; epoch++) {
        cr_assert_eq(tp_dataflow_reset_state(df, 1 + (uint64_t)epoch, 0), TP_OK);
        tp_datapoint_t *dp;
        int n = 0;
        tp_status_t rc;
        while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
            const tp_tensor_t *img = tp_datapoint_cget(dp, 0);
            cr_assert_eq(img->ndim, 3);
            cr_assert_eq(img->shape[0], 24);
            cr_assert_eq(img->shape[1], 24);
            cr_assert_eq(img->shape[2], 3);
            n++;
            tp_datapoint_destroy(&dp);
        }
        cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
        cr_assert_eq(n, 6);
    }
    tp_dataflow_destroy(&df);
}
