/* towerpack fuzzing: the image decoders (dataflow/image/img_codec.c,
 * img_formats.c): tp_image_decode on the raw bytes (JPEG through
 * TurboJPEG, PNG through libpng, the EXIF segment walk and libexif; WebP
 * through libwebp, TIFF through libtiff's client I/O, BMP and PGM/PPM
 * through our header checks and stb_image; our limits and channel
 * conversions), in each output mode and once with DCT scaling. The seeds
 * (fuzz/corpus/image, gen_corpus.c) hold each format; the dispatch is by
 * magic bytes, so one target covers them all.
 *
 * Properties: an accepted image is uint8 [H,W] or [H,W,C] with the channels
 * asked for and at most max_pixels pixels; an error leaves no tensor. */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const tp_image_mode_t modes[] = {TP_IMAGE_ANY, TP_IMAGE_GREY,
                                            TP_IMAGE_RGB, TP_IMAGE_RGBA};
    for (int m = 0; m < 5; m++) {
        tp_image_opts_t o;
        tp_image_opts_init(&o);
        o.max_pixels = 1 << 20;  /* keep each run fast */
        o.exif = 1;  /* the EXIF walk and turn too (off by default since issue 43) */
        o.mode = modes[m % 4];
        if (m == 4)
            o.min_short = 8;
        tp_tensor_t t;
        tp_status_t rc = tp_image_decode(data, size, &o, "fuzz", &t);
        fuzz_note("image", rc);
        if (rc != TP_OK) {
            FUZZ_CHECK(t.data == NULL && t.nbytes == 0, "error left a tensor");
            continue;
        }
        FUZZ_CHECK(t.dtype == TP_UINT8 && (t.ndim == 2 || t.ndim == 3),
                   "not a uint8 image");
        FUZZ_CHECK(t.shape[0] * t.shape[1] <= o.max_pixels, "over the limit");
        int c = t.ndim == 3 ? (int)t.shape[2] : 1;
        if (o.mode != TP_IMAGE_ANY)
            FUZZ_CHECK(c == (int)o.mode, "%d channels for mode %d", c,
                       (int)o.mode);
        tp_tensor_fini(&t);
    }
    return 0;
}
