/* towerpack tests: the image decoders and augmentors against tools nobody
 * here wrote. tests/dataflow/image_ref.py writes images with PIL and
 * OpenCV and what those decode; the augmentors are checked against numpy
 * (and cv2.resize, tensorpack's resizer) given the parameters the
 * augmentor draws. Skips when python3 lacks numpy, cv2 or PIL. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <tiffio.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/image.h>

#define M_PI_ 3.14159265358979323846
#define REF_PY TP_SOURCE_DIR "/tests/dataflow/image_ref.py"

/* Debian's python3 first: a pyenv python3 on the PATH often lacks its
 * modules. */
static const char *s_python(void) {
    static const char *const cands[] = {"/usr/bin/python3", "python3"};
    for (size_t i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import numpy, cv2, PIL' >/dev/null "
                 "2>&1", cands[i]);
        if (system(cmd) == 0)
            return cands[i];
    }
    return NULL;
}

static char s_dir[256];
static const char *s_py;

static void s_setup(void) {
    s_py = s_python();
    snprintf(s_dir, sizeof s_dir, "/tmp/tp_image_ref_%d", (int)getpid());
    cr_assert_eq(mkdir(s_dir, 0755), 0);
}

/* The test images and what PIL / OpenCV decode from them. */
static void s_gen(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s gen %s", s_py, REF_PY, s_dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void s_teardown(void) {
    if (s_dir[0]) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
        (void)system(cmd);
    }
}

#define NEED_PY()                                                             \
    do {                                                                      \
        if (!s_py)                                                            \
            cr_skip_test("python3 with numpy, cv2 (python3-opencv) and PIL "  \
                         "(python3-pil) is not installed");                   \
    } while (0)

/* Read a raw "H W C\n" + bytes file into t (uint8 [H,W,C]). */
static void s_read_raw(const char *path, tp_tensor_t *t) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "open %s", path);
    int h, w, c;
    cr_assert_eq(fscanf(f, "%d %d %d", &h, &w, &c), 3);
    cr_assert_eq(fgetc(f), '\n');
    int64_t shape[3] = {h, w, c};
    cr_assert_eq(tp_tensor_init(t, TP_UINT8, 3, shape), TP_OK);
    cr_assert_eq(fread(t->data, 1, t->nbytes, f), t->nbytes, "%s", path);
    fclose(f);
}

/* The bytes of s_dir's generated file NAME into buf (cap bytes): a file of
 * 1 to cap - 1 bytes, its length returned. */
static size_t s_read_small(const char *name, uint8_t *buf, size_t cap) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", s_dir, name);
    FILE *fh = fopen(p, "rb");
    cr_assert(fh, "%s", p);
    size_t n = fread(buf, 1, cap, fh);
    fclose(fh);
    cr_assert(n > 0 && n < cap, "%s: %zu bytes", p, n);
    return n;
}

static void s_write_raw(const char *path, const tp_tensor_t *t) {
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fprintf(f, "%d %d %d\n", (int)t->shape[0], (int)t->shape[1],
            t->ndim == 3 ? (int)t->shape[2] : 1);
    cr_assert_eq(fwrite(t->data, 1, t->nbytes, f), t->nbytes);
    fclose(f);
}

/* The largest difference of two images of the same size (asserted). */
static int s_maxdiff(const tp_tensor_t *a, const tp_tensor_t *ref,
                     const char *what) {
    int64_t ca = a->ndim == 3 ? a->shape[2] : 1;
    cr_assert_eq(a->shape[0], ref->shape[0], "%s: height %lld vs %lld", what,
                 (long long)a->shape[0], (long long)ref->shape[0]);
    cr_assert_eq(a->shape[1], ref->shape[1], "%s: width %lld vs %lld", what,
                 (long long)a->shape[1], (long long)ref->shape[1]);
    cr_assert_eq(ca, ref->shape[2], "%s: %lld channels vs %lld", what,
                 (long long)ca, (long long)ref->shape[2]);
    const uint8_t *p = a->data, *q = ref->data;
    int m = 0;
    for (size_t i = 0; i < a->nbytes; i++) {
        int d = abs((int)p[i] - (int)q[i]);
        if (d > m)
            m = d;
    }
    return m;
}

/* Decode DIR/file with mode (and min_short) and compare with DIR/ref.ref:
 * at most `tol` apart. */
static int s_exif;  /* the next s_check's opts.exif */

static void s_check(const char *file, const char *ref, tp_image_mode_t mode,
                    int min_short, int tol) {
    char p[512], r[512];
    snprintf(p, sizeof p, "%s/%s", s_dir, file);
    snprintf(r, sizeof r, "%s/%s.ref", s_dir, ref);
    tp_image_opts_t o;
    tp_image_opts_init(&o);
    o.mode = mode;
    o.min_short = min_short;
    o.exif = s_exif;
    tp_tensor_t img, want;
    cr_assert_eq(tp_image_read(p, &o, &img), TP_OK, "%s: %s", file,
                 tp_last_error());
    s_read_raw(r, &want);
    int d = s_maxdiff(&img, &want, file);
    cr_assert(d <= tol, "%s: largest difference from the reference %d (> %d)",
              file, d, tol);
    tp_tensor_fini(&img);
    tp_tensor_fini(&want);
}

/* A YCCK JPEG (TurboJPEG compresses CMYK pixels as YCCK, with the Adobe
 * marker, as Photoshop's "CMYK" JPEGs) into s_dir, for image_ref.py to
 * decode with PIL. */
static void s_ycck(void) {
    enum { H = 37, W = 53 };
    static uint8_t px[H * W * 4];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint8_t *q = px + (y * W + x) * 4;
            q[0] = (uint8_t)(128 + 100 * sin(x / 6.0));
            q[1] = (uint8_t)(128 + 100 * cos(y / 4.0));
            q[2] = (uint8_t)(x * 4 + y);
            q[3] = (uint8_t)(200 - y * 2);
        }
    tjhandle h = tjInitCompress();
    cr_assert(h);
    unsigned char *buf = NULL;
    unsigned long len = 0;
    cr_assert_eq(tjCompress2(h, px, W, 0, H, TJPF_CMYK, &buf, &len, TJSAMP_420,
                             92, 0), 0, "%s", tjGetErrorStr2(h));
    char p[512];
    snprintf(p, sizeof p, "%s/ycck.jpg", s_dir);
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
    tjFree(buf);
    tjDestroy(h);
}

/* TIFF layouts PIL cannot write, written with libtiff into s_dir for
 * image_ref.py to decode with PIL: tiled RGB (LZW), the same with the
 * Orientation tag bottom-left, right-top and left-bottom, separate colour
 * planes, 4-bit grey, tiled and separate-plane CMYK (all through
 * libtiff's RGBA interface here), and RGB strips bottom-left (the strip
 * reader). PIL turns a TIFF by its Orientation tag when it opens it; so
 * does towerpack. */
static void s_tiff_layouts(void) {
    enum { H = 37, W = 53 };
    static const struct {
        const char *file;
        int tiled, orient, planar, bps, spp;
    } t[] = {{"tiled.tif", 1, ORIENTATION_TOPLEFT, PLANARCONFIG_CONTIG, 8, 3},
             {"tiled_bl.tif", 1, ORIENTATION_BOTLEFT, PLANARCONFIG_CONTIG, 8, 3},
             {"planar.tif", 0, ORIENTATION_TOPLEFT, PLANARCONFIG_SEPARATE, 8, 3},
             {"grey4.tif", 0, ORIENTATION_TOPLEFT, PLANARCONFIG_CONTIG, 4, 1},
             {"strips_bl.tif", 0, ORIENTATION_BOTLEFT, PLANARCONFIG_CONTIG, 8, 3},
             {"tiled_rt.tif", 1, ORIENTATION_RIGHTTOP, PLANARCONFIG_CONTIG, 8, 3},
             {"tiled_lb.tif", 1, ORIENTATION_LEFTBOT, PLANARCONFIG_CONTIG, 8, 3},
             {"cmyk_tiled.tif", 1, ORIENTATION_TOPLEFT, PLANARCONFIG_CONTIG, 8, 4},
             {"cmyk_planar.tif", 0, ORIENTATION_TOPLEFT, PLANARCONFIG_SEPARATE, 8, 4}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", s_dir, t[k].file);
        TIFF *tf = TIFFOpen(p, "w");
        cr_assert(tf, "%s", p);
        TIFFSetField(tf, TIFFTAG_IMAGEWIDTH, W);
        TIFFSetField(tf, TIFFTAG_IMAGELENGTH, H);
        TIFFSetField(tf, TIFFTAG_BITSPERSAMPLE, t[k].bps);
        TIFFSetField(tf, TIFFTAG_SAMPLESPERPIXEL, t[k].spp);
        TIFFSetField(tf, TIFFTAG_PHOTOMETRIC,
                     t[k].spp == 3   ? PHOTOMETRIC_RGB
                     : t[k].spp == 4 ? PHOTOMETRIC_SEPARATED
                                     : PHOTOMETRIC_MINISBLACK);
        TIFFSetField(tf, TIFFTAG_PLANARCONFIG, t[k].planar);
        TIFFSetField(tf, TIFFTAG_ORIENTATION, t[k].orient);
        TIFFSetField(tf, TIFFTAG_COMPRESSION, COMPRESSION_LZW);
        /* a smooth picture, different in each channel and row */
        int spp = t[k].spp == 4 ? 4 : 3;  /* the samples a pixel (CMYK: 4) */
        uint8_t px[H][W][4];
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                px[y][x][0] = (uint8_t)(128 + 100 * sin(x / 6.0));
                px[y][x][1] = (uint8_t)(y * 6);
                px[y][x][2] = (uint8_t)(x * 4 + y);
                px[y][x][3] = (uint8_t)(x * 5 - y * 3);
            }
        if (t[k].tiled) {
            enum { T = 16 };
            TIFFSetField(tf, TIFFTAG_TILEWIDTH, T);
            TIFFSetField(tf, TIFFTAG_TILELENGTH, T);
            uint8_t tile[T * T * 4];
            for (int ty = 0; ty < H; ty += T)
                for (int tx = 0; tx < W; tx += T) {
                    memset(tile, 0, sizeof tile);
                    for (int y = 0; y < T && ty + y < H; y++)
                        for (int x = 0; x < T && tx + x < W; x++)
                            memcpy(tile + (y * T + x) * spp, px[ty + y][tx + x],
                                   (size_t)spp);
                    cr_assert(TIFFWriteTile(tf, tile, (uint32_t)tx, (uint32_t)ty, 0,
                                            0) > 0);
                }
        } else if (t[k].planar == PLANARCONFIG_SEPARATE) {
            TIFFSetField(tf, TIFFTAG_ROWSPERSTRIP, 8);
            for (int c = 0; c < spp; c++)
                for (int y = 0; y < H; y++) {
                    uint8_t row[W];
                    for (int x = 0; x < W; x++)
                        row[x] = px[y][x][c];
                    cr_assert(TIFFWriteScanline(tf, row, (uint32_t)y, (uint16_t)c) >= 0);
                }
        } else if (t[k].bps == 8) {  /* RGB strips */
            TIFFSetField(tf, TIFFTAG_ROWSPERSTRIP, 8);
            for (int y = 0; y < H; y++) {
                uint8_t row[W * 3];
                for (int x = 0; x < W; x++)
                    memcpy(row + x * 3, px[y][x], 3);
                cr_assert(TIFFWriteScanline(tf, row, (uint32_t)y, 0) >= 0);
            }
        } else {  /* 4-bit grey, two pixels a byte, high nibble first */
            TIFFSetField(tf, TIFFTAG_ROWSPERSTRIP, 8);
            for (int y = 0; y < H; y++) {
                uint8_t row[(W + 1) / 2];
                memset(row, 0, sizeof row);
                for (int x = 0; x < W; x++)
                    row[x / 2] |= (uint8_t)((px[y][x][0] >> 4) << (x % 2 ? 0 : 4));
                cr_assert(TIFFWriteScanline(tf, row, (uint32_t)y, 0) >= 0);
            }
        }
        TIFFClose(tf);
    }
}

/* the middle half of the image */
static void s_pick_mid(void *user, int height, int width, int rect[4]) {
    (void)user;
    rect[0] = height / 4;
    rect[1] = width / 4;
    rect[2] = height / 2;
    rect[3] = width / 2;
}

TestSuite(proc_image, .init = s_setup, .fini = s_teardown);

/* PNG: exactly PIL's pixels, in every colour type libpng expands. JPEG:
 * PIL's pixels (both on libjpeg-turbo's accurate IDCT; libjpeg-turbo
 * documents SIMD and C paths as agreeing to within 1), also DCT-scaled (a
 * 320x240 JPEG asked for a short side >= 60 is decoded at 1/4, as PIL's
 * draft mode decodes it) and turned by its EXIF orientation as PIL's
 * exif_transpose. One test: the references come from one interpreter. */
Test(proc_image, decoders_equal_pil_and_opencv) {
    NEED_PY();
    s_ycck();
    s_gen();
    s_check("grey.png", "grey", TP_IMAGE_ANY, 0, 0);
    s_check("rgb.png", "rgb", TP_IMAGE_ANY, 0, 0);
    s_check("rgba.png", "rgba", TP_IMAGE_ANY, 0, 0);
    s_check("la.png", "la", TP_IMAGE_ANY, 0, 0);
    s_check("pal.png", "pal", TP_IMAGE_RGB, 0, 0);
    s_check("rgb16.png", "rgb16", TP_IMAGE_ANY, 0, 0);
    s_check("rgb.png", "rgb_as_grey", TP_IMAGE_GREY, 0, 0);
    s_check("grey.png", "grey_as_rgb", TP_IMAGE_RGB, 0, 0);
    s_check("rgba.png", "rgba_as_rgb", TP_IMAGE_RGB, 0, 0);
    s_check("png_named.jpg", "png_named", TP_IMAGE_ANY, 0, 0);
    s_check("q90.jpg", "q90", TP_IMAGE_ANY, 0, 1);
    s_check("q95_444.jpg", "q95_444", TP_IMAGE_ANY, 0, 1);
    s_check("q75_422.jpg", "q75_422", TP_IMAGE_ANY, 0, 1);
    s_check("grey.jpg", "grey_jpg", TP_IMAGE_ANY, 0, 1);
    s_check("prog.jpg", "prog", TP_IMAGE_ANY, 0, 1);
    s_check("q90.jpg", "q90_as_grey", TP_IMAGE_GREY, 0, 1);
    s_check("big.jpg", "big_quarter", TP_IMAGE_RGB, 60, 1);
    for (int o = 1; o <= 8; o++) {
        char f[32], r[32];
        snprintf(f, sizeof f, "exif%d.jpg", o);
        snprintf(r, sizeof r, "exif%d", o);
        s_exif = 1;
        s_check(f, r, TP_IMAGE_ANY, 0, 1);
        s_exif = 0;
    }
    /* people's own files, against torchvision's loader,
     * Image.open(f).convert('RGB'): CMYK and YCCK JPEGs (libjpeg-turbo's
     * CMYK, then PIL's conversion: within JPEG's 1), EXIF not applied,
     * palette with transparency, 1-bit, grey with tRNS; 16-bit grey
     * keeps its high byte where PIL clips (docs/images.md) */
    s_check("cmyk.jpg", "cmyk", TP_IMAGE_RGB, 0, 1);
    s_check("cmyk.jpg", "cmyk", TP_IMAGE_ANY, 0, 1);
    s_check("ycck.jpg", "ycck", TP_IMAGE_RGB, 0, 1);
    s_check("exif6.jpg", "exif6_unturned", TP_IMAGE_RGB, 0, 1);
    s_check("pal_trns.png", "pal_trns", TP_IMAGE_RGB, 0, 0);
    s_check("bw.png", "bw", TP_IMAGE_RGB, 0, 0);
    s_check("grey_trns.png", "grey_trns", TP_IMAGE_RGB, 0, 0);
    s_check("grey16.png", "grey16_as_rgb", TP_IMAGE_RGB, 0, 0);
    /* a progressive and a CMYK JPEG's region (the band decode, or the
     * whole decode cut): the whole decode's pixels there */
    static const char *const cut[] = {"prog.jpg", "cmyk.jpg", "ycck.jpg"};
    for (int i = 0; i < 3; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", s_dir, cut[i]);
        tp_image_opts_t o;
        tp_image_opts_init(&o);
        o.mode = TP_IMAGE_RGB;
        tp_tensor_t whole, part;
        cr_assert_eq(tp_image_read(p, &o, &whole), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_image_read_region(p, &o, s_pick_mid, NULL, &part), TP_OK,
                     "%s", tp_last_error());
        int H = (int)whole.shape[0], W = (int)whole.shape[1];
        cr_assert_eq(part.shape[0], H / 2);
        cr_assert_eq(part.shape[1], W / 2);
        for (int y = 0; y < H / 2; y++)
            cr_assert_eq(memcmp((uint8_t *)part.data + (size_t)y * (W / 2) * 3,
                                (uint8_t *)whole.data +
                                    ((size_t)(y + H / 4) * W + W / 4) * 3,
                                (size_t)(W / 2) * 3), 0, "%s row %d", cut[i], y);
        tp_tensor_fini(&whole);
        tp_tensor_fini(&part);
    }
}

/* The rest of torchvision's IMG_EXTENSIONS: WebP (libwebp), TIFF
 * (libtiff), BMP and PGM/PPM (stb_image) against PIL's decode of the same
 * files, written by PIL (image_ref.py gen_formats): as
 * Image.open(f).convert('RGB') and convert('L') in the RGB and grey
 * modes, as PIL's own mode in ANY. Exact, except lossy WebP (both sides
 * libwebp: within 1) and JPEG-in-TIFF (libjpeg-turbo both sides, through
 * libtiff's RGBA interface here: within 1). */
Test(proc_image, other_formats_equal_pil) {
    NEED_PY();
    s_tiff_layouts();
    s_gen();
    static const struct {
        const char *file;
        int tol, own;  /* own: PIL's own mode is the ANY decode's */
    } f[] = {
        {"ll.webp", 0, 1},      {"ll_rgba.webp", 0, 1}, {"q80.webp", 1, 1},
        {"q80_rgba.webp", 1, 1}, {"anim.webp", 0, 1},   {"anim_rgba.webp", 0, 1},
        {"rgb.tif", 0, 1},      {"rgb_lzw.tif", 0, 1},
        {"rgb_zip.tiff", 0, 1}, {"grey_pb.tif", 0, 1},  {"la.tif", 0, 0},
        {"rgba.tif", 0, 1},     {"pal.tif", 0, 0},      {"bw.tif", 0, 0},
        {"bw_g4.tif", 0, 0},    {"jpeg.tif", 1, 1},     {"pages.tif", 0, 1},
        {"rgb.bmp", 0, 1},      {"rgba.bmp", 0, 1},     {"pal.bmp", 0, 0},
        {"grey.bmp", 0, 1},     {"bw.bmp", 0, 0},       {"topdown.bmp", 0, 1},
        {"rgb.ppm", 0, 1},      {"comment.ppm", 0, 1},  {"grey.pgm", 0, 1},
        {"tiled.tif", 0, 1},    {"tiled_bl.tif", 0, 1}, {"planar.tif", 0, 1},
        {"grey4.tif", 0, 1},    {"strips_bl.tif", 0, 1}, {"tiled_rt.tif", 0, 0},
        {"tiled_lb.tif", 0, 0}, {"orient2.tif", 0, 1},  {"orient3.tif", 0, 1},
        {"orient4.tif", 0, 1},  {"orient5.tif", 0, 0},  {"orient6.tif", 0, 0},
        {"orient7.tif", 0, 0},  {"orient8.tif", 0, 0},
        /* BMPs PIL does not write (image_ref.py bmp_hand): alpha in V4
         * and V5 headers (RGBA in ANY, as PIL), 32-bit without an alpha
         * mask (RGB), 4-bit palette, 16-bit 5-5-5 and 5-6-5 (PIL's
         * scaling, v * 255 / 31, not stb_image's repeated bits) */
        {"rgba_v5.bmp", 0, 1},  {"rgba_v4.bmp", 0, 1},  {"x_v5.bmp", 0, 1},
        {"bf32.bmp", 0, 1},     {"pal4.bmp", 0, 0},     {"rgb555.bmp", 0, 1},
        {"rgb565.bmp", 0, 1},
        /* run-length coded BMPs (image_ref.py bmp_rle; PIL reads RLE8
         * and RLE4, writes neither): colour, grey (PIL's "L": one
         * channel in ANY), top-down, and the stream's corners PIL 9.4
         * reads as the format says (runs cut at the row, absolute runs
         * going on into the next, end of line in a row, indices past the
         * palette as PIL's grey (i, i, i)); 32-bit with all masks 0
         * (PIL: BGRA); 4-bit of 16 spaced greys (PIL "P"); 8-bit with
         * indices past its palette */
        {"rle8.bmp", 0, 0},     {"rle4.bmp", 0, 0},     {"rle8_grey.bmp", 0, 1},
        {"rle4_grey.bmp", 0, 1}, {"rle8_topdown.bmp", 0, 0},
        {"rle8_quirks.bmp", 0, 0}, {"rle4_quirks.bmp", 0, 0},
        {"z32.bmp", 0, 1},      {"z32_v5.bmp", 0, 1},   {"pal4_grey17.bmp", 0, 0},
        /* indices past an uncompressed BMP's palette: PIL's grey (i, i, i) */
        {"pal8_short.bmp", 0, 0},
        /* where PIL 9.4 misreads the file, the palette's pixels (also
         * OpenCV's, checked by image_ref.py): deltas (9.4 takes the two
         * bytes after a delta's offsets; fixed upstream), odd absolute
         * RLE4 runs (9.4 reads a byte short; fixed upstream), a 4-bit
         * palette of the greys 0..15 (9.4's "L" reads the packed
         * indices as bytes), an 8-bit one of black and white (9.4's "1"
         * unpacks the bytes as bits): grey in ANY, as PIL's mode and
         * OpenCV */
        {"rle8_delta.bmp", 0, 1}, {"rle4_odd.bmp", 0, 1}, {"pal4_grey.bmp", 0, 1},
        {"pal8_bw.bmp", 0, 1},
        /* CMYK: strips exactly (PIL's cmyk2rgb here too); tiled and
         * separate planes through libtiff's RGBA interface, which rounds
         * (255-c)(255-k)/255 down where PIL rounds it: within 1. YCbCr:
         * both sides libtiff's RGBA interface */
        {"cmyk.tif", 0, 0},     {"cmyk_lzw.tif", 0, 0}, {"cmyk_tiled.tif", 1, 0},
        {"cmyk_planar.tif", 1, 0}, {"ycbcr_lzw.tif", 0, 1},
        /* (PIL's own mode of a TIFF turned by 90 degrees keeps the
         * stored size for numpy: no reference but the converted ones) */
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        char base[64], r[80];
        snprintf(base, sizeof base, "%s", f[i].file);
        *strchr(base, '.') = '_';
        snprintf(r, sizeof r, "%s_rgb", base);
        s_check(f[i].file, r, TP_IMAGE_RGB, 0, f[i].tol);
        snprintf(r, sizeof r, "%s_l", base);
        s_check(f[i].file, r, TP_IMAGE_GREY, 0, f[i].tol);
        if (f[i].own)
            s_check(f[i].file, base, TP_IMAGE_ANY, 0, f[i].tol);
    }
    /* RGBA as PIL's convert('RGBA'): a BMP's alpha where PIL reads one,
     * opaque where its fourth byte is padding (rgba.bmp: PIL writes
     * RGBA as 32-bit BI_RGB and reads it back as RGB) */
    static const char *const rgba[] = {"rgba_v5.bmp", "rgba_v4.bmp", "x_v5.bmp",
                                       "bf32.bmp", "rgba.bmp", "rgba.tif",
                                       "z32.bmp", "z32_v5.bmp"};
    for (size_t i = 0; i < sizeof rgba / sizeof rgba[0]; i++) {
        char base[64], r[80];
        snprintf(base, sizeof base, "%s", rgba[i]);
        *strchr(base, '.') = '_';
        snprintf(r, sizeof r, "%s_rgba", base);
        s_check(rgba[i], r, TP_IMAGE_RGBA, 0, 0);
    }
    /* an uncompressed YCbCr TIFF, which PIL 9.4 cannot read (its raw
     * mode for it wants 4 bytes a pixel): the LZW file's reference, the
     * same samples */
    s_check("ycbcr.tif", "ycbcr_lzw_tif_rgb", TP_IMAGE_RGB, 0, 0);
    s_check("ycbcr.tif", "ycbcr_lzw_tif_l", TP_IMAGE_GREY, 0, 0);
    /* a region (the decode cut, as for a PNG) */
    char p[512];
    snprintf(p, sizeof p, "%s/rgb.tif", s_dir);
    tp_tensor_t whole, part;
    cr_assert_eq(tp_image_read(p, NULL, &whole), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_image_read_region(p, NULL, s_pick_mid, NULL, &part), TP_OK);
    int H = (int)whole.shape[0], W = (int)whole.shape[1];
    for (int y = 0; y < H / 2; y++)
        cr_assert_eq(memcmp((uint8_t *)part.data + (size_t)y * (W / 2) * 3,
                            (uint8_t *)whole.data + ((size_t)(y + H / 4) * W + W / 4) * 3,
                            (size_t)(W / 2) * 3), 0, "row %d", y);
    tp_tensor_fini(&whole);
    tp_tensor_fini(&part);
    /* refused, each with its reason and the file's name */
    static const struct {
        const char *file, *why;
    } no[] = {{"grey16.tif", "16-bit"}, {"max4095.pgm", "maxval 4095"},
              {"ascii.pgm", "P2"},
              /* PIL refuses it too ("not enough image data") */
              {"rle8_early.bmp", "end-of-bitmap escape comes at byte 104, in "
                                 "stored row 3 of 4"}};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", s_dir, no[i].file);
        cr_assert_eq(tp_image_read(p, NULL, &whole), TP_ERR_FORMAT, "%s", no[i].file);
        cr_assert(strstr(tp_last_error(), p) && strstr(tp_last_error(), no[i].why),
                  "%s", tp_last_error());
        cr_assert_null(whole.data);
    }
}

/* Each new format cut short at many lengths, and with bytes flipped in
 * its header and its pixels: an error naming the file (a flip may leave
 * a decodable picture: then a picture of the right size), never a crash
 * or a read past the bytes (the ASan build runs this too). */
Test(proc_image, other_formats_cut_or_corrupt_are_named_errors) {
    NEED_PY();
    s_gen();
    static const char *const files[] = {
        "ll.webp", "q80_rgba.webp", "anim.webp", "rgb.tif", "rgb_lzw.tif", "pal.tif",
        "bw_g4.tif", "jpeg.tif", "rgb.bmp", "pal.bmp", "bw.bmp", "topdown.bmp",
        "rgb.ppm", "grey.pgm", "rgba_v5.bmp", "pal4.bmp", "rgb565.bmp", "cmyk.tif",
        "ycbcr_lzw.tif", "ycbcr.tif"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        static uint8_t buf[1 << 16];
        const size_t n = s_read_small(files[i], buf, sizeof buf);
        tp_tensor_t img;
        for (size_t cut = 1; cut < n; cut += n / 41 + 1) {
            uint8_t *c = malloc(cut);  /* exactly cut bytes: ASan sees past */
            memcpy(c, buf, cut);
            tp_status_t rc = tp_image_decode(c, cut, NULL, files[i], &img);
            free(c);
            cr_assert_lt(rc, 0, "%s cut at %zu of %zu bytes decoded", files[i],
                         cut, n);
            cr_assert(strstr(tp_last_error(), files[i]), "%s", tp_last_error());
            cr_assert_null(img.data);
        }
        for (size_t at = 0; at < n; at += n / 29 + 1) {
            uint8_t *c = malloc(n);
            memcpy(c, buf, n);
            for (size_t k = at; k < at + 4 && k < n; k++)
                c[k] ^= 0xA5;
            tp_status_t rc = tp_image_decode(c, n, NULL, files[i], &img);
            free(c);
            if (rc == TP_OK) {
                cr_assert(img.shape[0] >= 1 && img.shape[1] >= 1);
                tp_tensor_fini(&img);
            } else {
                cr_assert(strstr(tp_last_error(), files[i]), "%s", tp_last_error());
            }
        }
    }
}

/* Run-length coded BMPs cut at every length: an error naming the file
 * while pixels are missing; once the last run is in, the picture (PIL
 * reads a stream without its end-of-bitmap escape, or without the byte
 * that pads its last absolute run, too). Bytes flipped
 * anywhere: an error naming it or a picture of the right size, never a
 * read past the bytes (the ASan build runs this too). */
Test(proc_image, rle_bmps_cut_or_corrupt_are_named_errors) {
    NEED_PY();
    s_gen();
    static const char *const files[] = {"rle8.bmp", "rle4.bmp", "rle8_delta.bmp",
                                        "rle4_odd.bmp", "rle8_quirks.bmp"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        static uint8_t buf[1 << 16];
        const size_t n = s_read_small(files[i], buf, sizeof buf);
        /* the end-of-bitmap escape is the last two bytes of these */
        cr_assert(buf[n - 2] == 0 && buf[n - 1] == 1, "%s", files[i]);
        tp_tensor_t img;
        for (size_t cut = 1; cut < n; cut++) {
            uint8_t *c = malloc(cut);  /* exactly cut bytes: ASan sees past */
            memcpy(c, buf, cut);
            tp_status_t rc = tp_image_decode(c, cut, NULL, files[i], &img);
            free(c);
            /* the pixels are all there without the end of bitmap, and
             * without the byte that pads a last absolute run */
            if (cut >= n - 2 || (cut == n - 3 && rc == TP_OK)) {
                cr_assert_eq(rc, TP_OK, "%s cut at %zu: %s", files[i], cut,
                             tp_last_error());
                tp_tensor_fini(&img);
                continue;
            }
            cr_assert_lt(rc, 0, "%s cut at %zu of %zu bytes decoded", files[i],
                         cut, n);
            cr_assert(strstr(tp_last_error(), files[i]), "%s", tp_last_error());
            cr_assert_null(img.data);
        }
        for (size_t at = 0; at < n; at++) {
            uint8_t *c = malloc(n);
            memcpy(c, buf, n);
            c[at] ^= 0xA5;
            tp_status_t rc = tp_image_decode(c, n, NULL, files[i], &img);
            free(c);
            if (rc == TP_OK) {
                cr_assert(img.shape[0] >= 1 && img.shape[1] >= 1);
                tp_tensor_fini(&img);
            } else {
                cr_assert(strstr(tp_last_error(), files[i]), "%s", tp_last_error());
            }
        }
    }
}

/* The mean of an image's luma (PIL's weights; grey as it is). */
static double s_mean_luma(const tp_tensor_t *t) {
    const uint8_t *p = t->data;
    size_t n = (size_t)(t->shape[0] * t->shape[1]);
    int c = t->ndim == 3 ? (int)t->shape[2] : 1;
    double s = 0;
    for (size_t i = 0; i < n; i++, p += c)
        s += c == 1 ? p[0] : 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2];
    return s / (double)n;
}

/* A folder as people's are: every format in each class (image_ref.py's
 * mixed/), read as colour and as grey, each file once a pass with its
 * class, each decoded as the file decodes alone. */
Test(proc_image, a_folder_of_every_format_reads) {
    NEED_PY();
    s_gen();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/mixed", s_dir);
    for (int grey = 0; grey < 2; grey++) {
        tp_image_source_opts_t so;
        tp_image_source_opts_init(&so);
        so.decode.mode = grey ? TP_IMAGE_GREY : TP_IMAGE_RGB;
        so.shuffle = 0;
        tp_dataflow_t *df = tp_df_image_folder(dir, &so);
        cr_assert(df, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_size(df), 16);
        cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
        tp_datapoint_t *dp;
        int n = 0, per[2] = {0, 0};
        while (tp_dataflow_next(df, &dp) == TP_OK) {
            const tp_tensor_t *img = tp_datapoint_cget(dp, 0);
            int label = *(const int32_t *)tp_datapoint_cget(dp, 1)->data;
            cr_assert(label == 0 || label == 1);
            per[label]++;
            cr_assert_eq(img->shape[0], 45);
            cr_assert_eq(img->shape[1], 61);
            cr_assert_eq(img->ndim, grey ? 2 : 3);
            /* class a is the photo, class b its negative: the mean luma
             * tells them apart in every format, JPEG and the grey PGM
             * included (within 2 of the PNG's) */
            double m = s_mean_luma(img);
            tp_tensor_t a;
            char p[600];
            snprintf(p, sizeof p, "%s/mixed/a/x.png", s_dir);
            cr_assert_eq(tp_image_read(p, NULL, &a), TP_OK);
            double ref = s_mean_luma(&a);
            if (label == 1)
                ref = 255 - ref;
            cr_assert(fabs(m - ref) <= 2, "class %d: mean luma %.2f vs %.2f",
                      label, m, ref);
            tp_tensor_fini(&a);
            n++;
            tp_datapoint_destroy(&dp);
        }
        cr_assert_eq(n, 16);
        cr_assert(per[0] == 8 && per[1] == 8);
        tp_dataflow_destroy(&df);
    }
    /* what the trainer asks of a folder: its classes and channels, from
     * its first image whatever the format */
    tp_image_source_info_t info;
    tp_image_source_info_init(&info);
    static const struct {
        const char *sub;
        int ch;
    } one[] = {{"webponly", 3}, {"pgmonly", 1}, {"mixed", 3}};
    for (int i = 0; i < 3; i++) {
        char spec[600];
        snprintf(spec, sizeof spec, "imagefolder:%s/%s", s_dir, one[i].sub);
        cr_assert_eq(tp_image_source_info(spec, &info), TP_OK, "%s: %s", spec,
                     tp_last_error());
        cr_assert_eq(info.channels, one[i].ch, "%s: %d channels", spec,
                     info.channels);
        tp_image_source_info_fini(&info);
    }
}

/* A 16-bit TIFF (refused: towerpack reads 8 bits) in a folder is met as a
 * corrupt file is: the pass stops at it with an error naming the file,
 * the fix (convert it to 8 bits) and the way past it (skip-bad), or with
 * skip-bad it is skipped and counted; as a folder's first image it stops
 * the source's info (what tp-train reads before training) naming it. */
Test(proc_image, sixteen_bit_tiff_in_a_folder_is_named) {
    NEED_PY();
    s_gen();
    char cmd[4096], dir[512];
    snprintf(dir, sizeof dir, "%s/deep", s_dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/a %s/b && cp %s/rgb.tif %s/a/x.tif && "
             "cp %s/grey16.tif %s/a/y16.tif && cp %s/rgb.bmp %s/b/z.bmp", dir, dir,
             s_dir, dir, s_dir, dir, s_dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    for (int skip = 0; skip < 2; skip++) {
        tp_image_source_opts_t so;
        tp_image_source_opts_init(&so);
        so.decode.mode = TP_IMAGE_RGB;
        so.shuffle = 0;
        so.skip_bad = skip;
        tp_dataflow_t *df = tp_df_image_folder(dir, &so);
        cr_assert(df, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_size(df), 3);
        cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
        tp_datapoint_t *dp;
        tp_status_t rc;
        int n = 0;
        while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
            n++;
            tp_datapoint_destroy(&dp);
        }
        if (!skip) {
            cr_assert_eq(rc, TP_ERR_FORMAT, "%s", tp_last_error());
            const char *e = tp_last_error();
            cr_assert(strstr(e, "a/y16.tif") && strstr(e, "16-bit") &&
                      strstr(e, "convert it to 8 bits") &&
                      strstr(e, "imagefolder:DIR,skip-bad"), "%s", e);
        } else {
            cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
            cr_assert_eq(n, 2);
            cr_assert_eq(tp_df_image_skipped(df), 1);
        }
        tp_dataflow_destroy(&df);
    }
    /* the first image of the folder: the trainer's look at it fails */
    snprintf(cmd, sizeof cmd, "rm %s/a/x.tif", dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char spec[600];
    snprintf(spec, sizeof spec, "imagefolder:%s", dir);
    tp_image_source_info_t info;
    tp_image_source_info_init(&info);
    cr_assert_eq(tp_image_source_info(spec, &info), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "a/y16.tif") &&
              strstr(tp_last_error(), "convert it to 8 bits"), "%s",
              tp_last_error());
    tp_image_source_info_fini(&info);
}

/* ---- augmentors against numpy / cv2 ------------------------------------------ */

/* Augmentor checks are queued (the image, our result, the reference's
 * command line) and run by one interpreter in s_aug_run. */
typedef struct {
    char op[32];
    tp_tensor_t got;
    int tol;
    char args[160];
} job_t;
static job_t s_jobs[16];
static int s_njobs;

/* A photo-like 45x61 RGB test image, the same every time. */
static void s_photo(tp_tensor_t *t) {
    int64_t shape[3] = {45, 61, 3};
    cr_assert_eq(tp_tensor_init(t, TP_UINT8, 3, shape), TP_OK);
    uint8_t *p = t->data;
    tp_rng_t r;
    tp_rng_init(&r, 11, 0);
    for (int y = 0; y < 45; y++)
        for (int x = 0; x < 61; x++) {
            double v[3] = {128 + 100 * sin(x / 7.0), 128 + 100 * cos(y / 5.0),
                           (x * 3 + y * 2) % 256};
            for (int c = 0; c < 3; c++) {
                double n = v[c] + 12 * tp_rng_normal(&r);
                p[(y * 61 + x) * 3 + c] =
                    (uint8_t)(n < 0 ? 0 : n > 255 ? 255 : n);
            }
        }
}

/* Apply `aug` to the test image with rng seeded (7, 0) and queue the
 * reference `op` with `args` (at most tol apart). */
static void s_aug_check(tp_augment_t *aug, const char *op, const char *args,
                        int tol) {
    cr_assert_lt(s_njobs, 16);
    job_t *j = &s_jobs[s_njobs++];
    snprintf(j->op, sizeof j->op, "%s", op);
    snprintf(j->args, sizeof j->args, "%s", args);
    j->tol = tol;
    s_photo(&j->got);
    tp_rng_t rng;
    tp_rng_init(&rng, 7, 0);
    cr_assert_eq(tp_augment_apply(aug, &j->got, &rng), TP_OK, "%s: %s", op,
                 tp_last_error());
}

/* Run the queued references in one interpreter and compare. */
static void s_aug_run(void) {
    char in[512], jobs[512], cmd[1200];
    snprintf(in, sizeof in, "%s/aug_in.bin", s_dir);
    snprintf(jobs, sizeof jobs, "%s/jobs.txt", s_dir);
    tp_tensor_t img;
    s_photo(&img);
    s_write_raw(in, &img);
    tp_tensor_fini(&img);
    FILE *f = fopen(jobs, "w");
    cr_assert(f);
    for (int i = 0; i < s_njobs; i++)
        fprintf(f, "%s %s %s/aug_out%d.bin %s\n", s_jobs[i].op, in, s_dir, i,
                s_jobs[i].args);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s jobs %s", s_py, REF_PY, jobs);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    for (int i = 0; i < s_njobs; i++) {
        char out[600];
        snprintf(out, sizeof out, "%s/aug_out%d.bin", s_dir, i);
        tp_tensor_t want;
        s_read_raw(out, &want);
        int d = s_maxdiff(&s_jobs[i].got, &want, s_jobs[i].op);
        cr_assert(d <= s_jobs[i].tol, "%s (%s): largest difference from the "
                  "reference %d (> %d)", s_jobs[i].op, s_jobs[i].args, d,
                  s_jobs[i].tol);
        tp_tensor_fini(&want);
        tp_tensor_fini(&s_jobs[i].got);
    }
    s_njobs = 0;
}

Test(proc_image, resize_equals_cv2) {
    NEED_PY();
    static const int sizes[][2] = {{20, 30}, {90, 122}, {45, 17}, {7, 7}};
    for (size_t i = 0; i < 4; i++) {
        tp_augment_t *a = tp_augment_new();
        cr_assert_eq(tp_augment_add_resize(a, sizes[i][0], sizes[i][1],
                                           TP_INTERP_LINEAR), TP_OK);
        char args[64];
        snprintf(args, sizeof args, "%d %d 1", sizes[i][0], sizes[i][1]);
        /* OpenCV rounds its two passes in fixed point: within 1 */
        s_aug_check(a, "resize", args, 1);
        tp_augment_destroy(&a);
    }
    tp_augment_t *a = tp_augment_new();
    cr_assert_eq(tp_augment_add_resize(a, 30, 20, TP_INTERP_NEAREST), TP_OK);
    s_aug_check(a, "resize", "30 20 0", 0);
    tp_augment_destroy(&a);
    s_aug_run();
}

/* GoogleNetRandomCropAndResize: the rectangle tensorpack's algorithm draws
 * from the same random numbers, cropped in numpy and resized by cv2. */
Test(proc_image, random_resized_crop_equals_reference) {
    NEED_PY();
    for (uint64_t seed = 7; seed < 8; seed++) {
        tp_rng_t r;
        tp_rng_init(&r, 7, 0);
        int H = 45, W = 61, hh = 0, ww = 0, x1 = -1, y1 = -1;
        for (int i = 0; i < 10; i++) {
            double ta = (0.08 + 0.92 * tp_rng_double(&r)) * H * W;
            double ar = 0.75 + (1.333 - 0.75) * tp_rng_double(&r);
            ww = (int)(sqrt(ta * ar) + 0.5);
            hh = (int)(sqrt(ta / ar) + 0.5);
            if (tp_rng_double(&r) < 0.5) {
                int k = ww;
                ww = hh;
                hh = k;
            }
            if (hh <= H && ww <= W) {
                x1 = (int)tp_rng_below(&r, (uint64_t)(W - ww) + 1);
                y1 = (int)tp_rng_below(&r, (uint64_t)(H - hh) + 1);
                break;
            }
        }
        cr_assert(x1 >= 0, "no crop found in 10 tries for this seed");
        tp_augment_t *a = tp_augment_new();
        cr_assert_eq(tp_augment_add_random_resized_crop(
                         a, 24, 0.08, 1.0, 0.75, 1.333, TP_INTERP_LINEAR),
                     TP_OK);
        char args[96];
        snprintf(args, sizeof args, "%d %d %d %d 24", y1, x1, hh, ww);
        s_aug_check(a, "crop-resize", args, 1);
        tp_augment_destroy(&a);
    }
    s_aug_run();
}

Test(proc_image, crops_and_flips_equal_numpy) {
    NEED_PY();
    tp_augment_t *a = tp_augment_new();
    cr_assert_eq(tp_augment_add_center_crop(a, 20, 31), TP_OK);
    s_aug_check(a, "center-crop", "20 31", 0);
    tp_augment_destroy(&a);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_vflip(a, 1.0), TP_OK);
    s_aug_check(a, "vflip", "", 0);
    tp_augment_destroy(&a);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_flip(a, 1.0), TP_OK);
    s_aug_check(a, "hflip", "", 0);
    tp_augment_destroy(&a);
    s_aug_run();
}

/* The colour augmentors: the factor each draws from rng (7, 0), then the
 * formula of tensorpack's class in numpy. */
Test(proc_image, colour_augmentors_equal_numpy) {
    NEED_PY();
    tp_rng_t r;
    char args[128];
    tp_augment_t *a;

    tp_rng_init(&r, 7, 0);
    double v = -30 + 60 * tp_rng_double(&r);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_brightness(a, 30), TP_OK);
    snprintf(args, sizeof args, "%.17g", v);
    s_aug_check(a, "brightness", args, 0);
    tp_augment_destroy(&a);

    tp_rng_init(&r, 7, 0);
    v = 0.6 + 0.8 * tp_rng_double(&r);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_brightness_scale(a, 0.6, 1.4), TP_OK);
    snprintf(args, sizeof args, "%.17g", v);
    s_aug_check(a, "brightness-scale", args, 0);
    tp_augment_destroy(&a);

    tp_rng_init(&r, 7, 0);
    v = 0.6 + 0.8 * tp_rng_double(&r);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_contrast(a, 0.6, 1.4), TP_OK);
    snprintf(args, sizeof args, "%.17g", v);
    s_aug_check(a, "contrast", args, 0);
    tp_augment_destroy(&a);

    tp_rng_init(&r, 7, 0);
    v = 1 + (-0.4 + 0.8 * tp_rng_double(&r));
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_saturation(a, 0.4), TP_OK);
    snprintf(args, sizeof args, "%.17g", v);
    s_aug_check(a, "saturation", args, 0);
    tp_augment_destroy(&a);

    for (int k = 0; k < 2; k++) {  /* a positive and a negative shift */
        tp_rng_init(&r, 7, 0);
        double lo = k ? -60 : 0, hi = k ? 0 : 180;
        v = lo + (hi - lo) * tp_rng_double(&r);
        a = tp_augment_new();
        cr_assert_eq(tp_augment_add_hue(a, lo, hi), TP_OK);
        snprintf(args, sizeof args, "%.17g", v);
        s_aug_check(a, "hue", args, 1);
        tp_augment_destroy(&a);
    }

    static const float ev[3] = {55.46f, 4.794f, 1.148f};
    static const float evec[9] = {-0.5675f, 0.7192f, 0.4009f, -0.5808f,
                                  -0.0045f, -0.8140f, -0.5836f, -0.6948f,
                                  0.4203f};
    tp_rng_init(&r, 7, 0);
    double n[3], inc[3];
    for (int k = 0; k < 3; k++)
        n[k] = tp_rng_normal(&r) * 0.1 * ev[k];
    for (int k = 0; k < 3; k++)
        inc[k] = evec[k * 3] * n[0] + evec[k * 3 + 1] * n[1] +
                 evec[k * 3 + 2] * n[2];
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_lighting(a, 0.1, ev, evec), TP_OK);
    snprintf(args, sizeof args, "%.17g %.17g %.17g", inc[0], inc[1], inc[2]);
    s_aug_check(a, "lighting", args, 0);
    tp_augment_destroy(&a);

    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_grey(a, 1.0), TP_OK);
    s_aug_check(a, "grey", "", 0);
    tp_augment_destroy(&a);

    /* MinMaxNormalize(all_channel=False): each channel's own range, on an
     * image whose channels span different ranges (the photo's each reach
     * 0 and 255): numpy on the same image, run here */
    {
        tp_tensor_t img, want;
        s_photo(&img);
        uint8_t *p = img.data;
        for (size_t i = 0; i < img.nbytes; i++)
            p[i] = (uint8_t)(30 * (int)(i % 3) + p[i] * (3 - (int)(i % 3)) / 4);
        char in[600], out[600], cmd[1500];
        snprintf(in, sizeof in, "%s/mm_in.bin", s_dir);
        snprintf(out, sizeof out, "%s/mm_out.bin", s_dir);
        s_write_raw(in, &img);
        snprintf(cmd, sizeof cmd, "%s %s aug min-max-channels %s %s 10 200", s_py,
                 REF_PY, in, out);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        s_read_raw(out, &want);
        a = tp_augment_new();
        cr_assert_eq(tp_augment_add_min_max_channels(a, 10, 200), TP_OK);
        tp_rng_init(&r, 7, 0);
        cr_assert_eq(tp_augment_apply(a, &img, &r), TP_OK, "%s", tp_last_error());
        int d = s_maxdiff(&img, &want, "min-max-channels");
        cr_assert(d == 0, "min-max-channels: largest difference from numpy %d", d);
        tp_augment_destroy(&a);
        tp_tensor_fini(&img);
        tp_tensor_fini(&want);
    }
    s_aug_run();
}

/* Rotation (tensorpack's matrix, OpenCV's warpAffine: which quantises
 * source positions to 1/32 pixel, so within 3 on this noisy image),
 * Gaussian blur (cv2.GaussianBlur), motion blur (a line kernel built in
 * numpy, cv2.filter2D), per-image mean-variance normalisation
 * (numpy). */
Test(proc_image, warps_and_filters_equal_cv2) {
    NEED_PY();
    tp_rng_t r;
    char args[160];
    tp_augment_t *a;

    tp_rng_init(&r, 7, 0);
    double cx = 61 * tp_rng_double(&r), cy = 45 * tp_rng_double(&r);
    double deg = -30 + 60 * tp_rng_double(&r);
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_rotation(a, 30, 0, 1), TP_OK);
    snprintf(args, sizeof args, "%.17g %.17g %.17g", cx, cy, deg);
    s_aug_check(a, "rotation", args, 3);
    tp_augment_destroy(&a);

    /* Affine: tensorpack's construction of the matrix, written here */
    {
        tp_rng_init(&r, 7, 0);
        double sc = 0.8 + 0.4 * tp_rng_double(&r);
        double dx = rint(-0.1 * 61 + 0.2 * 61 * tp_rng_double(&r));
        double dy = rint(-0.1 * 45 + 0.2 * 45 * tp_rng_double(&r));
        double sh = (-10 + 20 * tp_rng_double(&r)) * M_PI_ / 180;
        double dg = (-15 + 30 * tp_rng_double(&r)) * M_PI_ / 180;
        double c0 = 61 * 0.5 - 0.5, c1 = 45 * 0.5 - 0.5;
        double al = sc * cos(dg), be = sc * sin(dg);
        double m[6] = {al, be, 0, -be, al, 0};
        double m01 = m[1] * cos(sh) + m[0] * sin(sh);
        double m11 = m[4] * cos(sh) + m[3] * sin(sh);
        m[1] = m01;
        m[4] = m11;
        m[2] = c0 * (1 - m[0]) - c1 * m[1] + dx;
        m[5] = -c0 * m[3] + c1 * (1 - m[4]) + dy;
        double scale[2] = {0.8, 1.2}, frac[2] = {0.1, 0.1};
        a = tp_augment_new();
        cr_assert_eq(tp_augment_add_affine(a, scale, frac, 15, 10), TP_OK);
        snprintf(args, sizeof args, "%.17g %.17g %.17g %.17g %.17g %.17g",
                 m[0], m[1], m[2], m[3], m[4], m[5]);
        s_aug_check(a, "affine", args, 3);
        tp_augment_destroy(&a);
    }

    for (int lo = 1; lo <= 3; lo++) {
        tp_rng_init(&r, 7, 0);
        int k = (lo + (int)tp_rng_below(&r, 1)) * 2 + 1;
        a = tp_augment_new();
        cr_assert_eq(tp_augment_add_gaussian_blur(a, lo, lo + 1, 0, 0), TP_OK);
        snprintf(args, sizeof args, "%d 0", k);
        s_aug_check(a, "gaussian-blur", args, 1);
        tp_augment_destroy(&a);
    }
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_gaussian_blur(a, 2, 3, 1.5, 1.5), TP_OK);
    s_aug_check(a, "gaussian-blur", "5 1.5", 1);
    tp_augment_destroy(&a);

    /* motion blur: the size and angle drawn from rng (7, 0), the kernel
     * built in numpy, cv2.filter2D with the border replicated */
    static const int mb[][2] = {{3, 3}, {5, 9}, {15, 15}};
    static const double mdeg[][2] = {{0, 0}, {0, 360}, {-45, 45}};
    for (int i = 0; i < 3; i++) {
        tp_rng_init(&r, 7, 0);
        int k = mb[i][0] +
                2 * (int)tp_rng_below(&r, (uint64_t)((mb[i][1] - mb[i][0]) / 2 + 1));
        double deg = mdeg[i][0] + (mdeg[i][1] - mdeg[i][0]) * tp_rng_double(&r);
        a = tp_augment_new();
        cr_assert_eq(tp_augment_add_motion_blur(a, mb[i][0], mb[i][1],
                                                mdeg[i][0], mdeg[i][1]), TP_OK);
        snprintf(args, sizeof args, "%d %.17g", k, deg);
        s_aug_check(a, "motion-blur", args, 1);
        tp_augment_destroy(&a);
    }

    /* float32 out: compared on the scale x * 16 + 128, rounded */
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_mean_var(a), TP_OK);
    s_aug_check(a, "mean-var", "", 1);
    tp_augment_destroy(&a);
    job_t *j = &s_jobs[s_njobs - 1];
    cr_assert_eq(j->got.dtype, TP_FLOAT32);
    tp_tensor_t u8;
    cr_assert_eq(tp_tensor_init(&u8, TP_UINT8, j->got.ndim, j->got.shape),
                 TP_OK);
    const float *fp = j->got.data;
    for (size_t i = 0; i < u8.nbytes; i++) {
        double v = floor(fp[i] * 16.0 + 128 + 0.5);
        ((uint8_t *)u8.data)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    tp_tensor_fini(&j->got);
    tp_tensor_move(&j->got, &u8);

    /* MeanVarianceNormalize(all_channel=False), on the same scale */
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_mean_var_channels(a), TP_OK);
    s_aug_check(a, "mean-var-channels", "", 1);
    tp_augment_destroy(&a);
    j = &s_jobs[s_njobs - 1];
    cr_assert_eq(j->got.dtype, TP_FLOAT32);
    cr_assert_eq(tp_tensor_init(&u8, TP_UINT8, j->got.ndim, j->got.shape), TP_OK);
    fp = j->got.data;
    for (size_t i = 0; i < u8.nbytes; i++) {
        double v = floor(fp[i] * 16.0 + 128 + 0.5);
        ((uint8_t *)u8.data)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    tp_tensor_fini(&j->got);
    tp_tensor_move(&j->got, &u8);
    s_aug_run();
}

/* ---- bad files counted across forked workers ------------------------------------ */

static void s_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A folder with 2 corrupt files, skip-bad, read by 2 forked workers: the
 * workers report what they skipped on their data sockets, and the parent
 * shows 2 (the distinct files: each worker reads the whole folder and
 * finds the same 2), in tp_df_skipped_files and in each worker's row. */
Test(proc_image, skipped_files_reported_by_workers) {
    char p[512];
    snprintf(p, sizeof p, "%s/sk", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/sk/c", s_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    for (int i = 0; i < 6; i++) {
        int64_t shape[2] = {4, 4};
        tp_tensor_t t;
        cr_assert_eq(tp_tensor_init(&t, TP_UINT8, 2, shape), TP_OK);
        memset(t.data, 40 * i, t.nbytes);
        void *png;
        size_t n;
        cr_assert_eq(tp_image_encode_png(&t, &png, &n), TP_OK);
        snprintf(p, sizeof p, "%s/sk/c/%d.png", s_dir, i);
        s_file(p, png, n);
        free(png);
        tp_tensor_fini(&t);
    }
    snprintf(p, sizeof p, "%s/sk/c/zero.jpg", s_dir);
    s_file(p, "", 0);
    snprintf(p, sizeof p, "%s/sk/c/trunc.png", s_dir);
    s_file(p, "\x89PNG\r\n\x1a\n\0\0", 10);
    char spec[700];
    snprintf(spec, sizeof spec, "imagefolder:%s/sk,skip-bad", s_dir);
    tp_dataflow_t *src = NULL;
    cr_assert_eq(tp_spec_parse(spec, &src), TP_OK, "%s", tp_last_error());
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.allow_threads = 1;  /* Criterion's own thread */
    tp_dataflow_t *df = tp_df_multiprocess(src, 2, &o);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_df_skipped_files(df), -1, "nothing reported before the start");
    cr_assert_eq(tp_dataflow_reset_state(df, 3, 0), TP_OK, "%s", tp_last_error());
    /* the reports travel behind the datapoints: read until they are in */
    int got = 0;
    for (int i = 0; i < 5000 && tp_df_skipped_files(df) != 2; i++) {
        tp_datapoint_t *dp = NULL;
        tp_status_t rc = tp_dataflow_next(df, &dp);
        cr_assert(rc == TP_OK || rc == TP_DONE, "%s", tp_last_error());
        got += rc == TP_OK;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(tp_df_skipped_files(df), 2, "after %d datapoints", got);
    tp_stats_row_t rows[4];
    int n = tp_df_multiprocess_rows(df, rows, 4);
    cr_assert_eq(n, 2);
    int named = 0;
    for (int i = 0; i < n; i++)
        named += strstr(rows[i].name, ", 2 bad files") != NULL;
    cr_assert_geq(named, 1, "rows: '%s', '%s'", rows[0].name, rows[1].name);
    tp_dataflow_destroy(&df);
}
