/* towerpack tests: the batches ResidentInput makes (tp_backend_augment_batch
 * on the CPU, the reference the GPU kernel is held to) against numpy's
 * reading of the same picks (tests/pipeline/augment_ref.py: np.pad,
 * slicing, a mirror, float32 arithmetic), to the bit. Skips when python3
 * lacks numpy. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/backend.h>
#include <towerpack/rng.h>
#include "proc_testutil.h"

#define REF_PY TP_SOURCE_DIR "/tests/pipeline/augment_ref.py"

static void s_write(const char *dir, const char *name, const void *data, size_t bytes) {
    cr_assert_eq(pu_write_file(dir, name, data, bytes), 0, "%s/%s", dir, name);
}

Test(resident_numpy, numpy_makes_the_same_batch) {
    enum { NSRC = 40, H = 9, W = 7, C = 3, N = 60, CH = 8, CW = 6, PAD = 2 };
    static uint8_t img[NSRC * H * W * C];
    static float out[N * CH * CW * C];
    tp_augment_pick_t picks[N];
    tp_rng_t r;
    tp_rng_init(&r, 5, 0);
    for (size_t i = 0; i < sizeof img; i++)
        img[i] = (uint8_t)tp_rng_u32(&r);
    for (int i = 0; i < N; i++)
        picks[i] = (tp_augment_pick_t){(int32_t)tp_rng_below(&r, NSRC),
                                       (int32_t)tp_rng_below(&r, H + 2 * PAD - CH + 1),
                                       (int32_t)tp_rng_below(&r, W + 2 * PAD - CW + 1),
                                       (int32_t)tp_rng_below(&r, 2)};
    /* Fashion-MNIST-like statistics per channel, and a corner pick */
    picks[0] = (tp_augment_pick_t){3, 0, 0, 1};
    tp_augment_shape_t sh = {H, W, C, CH, CW, PAD, {72.94f, 10, 200, 0},
                             {1 / 90.02f, 1 / 3.0f, 1 / 255.0f, 1}};
    tp_backend_t *b = tp_backend_cpu_new(0);
    cr_assert_eq(tp_backend_augment_batch(b, NULL, out, NULL, img, NULL, NSRC, picks, N, &sh),
                 TP_OK, "%s", tp_last_error());
    tp_backend_destroy(&b);

    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-augref-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char shape[128];
    int len = snprintf(shape, sizeof shape, "%d %d %d %d %d %d %d %d\n", NSRC, H, W, C, N,
                       CH, CW, PAD);
    s_write(dir, "shape.txt", shape, (size_t)len);
    s_write(dir, "images.bin", img, sizeof img);
    s_write(dir, "picks.bin", picks, sizeof picks);
    float norm[8];
    memcpy(norm, sh.mean, sizeof sh.mean);
    memcpy(norm + 4, sh.inv_std, sizeof sh.inv_std);
    s_write(dir, "norm.bin", norm, sizeof norm);
    s_write(dir, "out.bin", out, sizeof out);
    PU_PYTHON_EXPECT(REF_PY, dir, "numpy agrees on 60 images of 8x6x3");
}
