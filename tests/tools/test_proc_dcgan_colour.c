/* towerpack tests: the zoo's GAN on colour images through tp-train and
 * tp-generate, run as a user runs them, on data the tests write (no
 * download): a small CIFAR-format file (32x32 RGB records: the 32 px
 * DCGAN, fc 256x4x4 and three conv-transposes) and an image folder of
 * colour PNGs resized to the generator's size (--image-size 16). The
 * sample grids must be RGB (PIL reads them back, gan_colour_check.py), the
 * TensorBoard image summary the same colour PNG, and tp-generate's .npy
 * uint8 [N, H, W, 3]. Own executable: it forks and execs. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/fileio.h>
#include <towerpack/image.h>
#include "pipeline/tfevents_testutil.h"
#include "proc_testutil.h"

static char s_out[1 << 18];

/* n CIFAR-10 records (a label byte, then the R, G and B planes of 32x32)
 * into path: red high, green noise, blue a horizontal ramp, so a generator
 * that learns anything learns channels that differ. */
static void s_write_cifar(const char *path, int n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    uint32_t r = 12345;
    for (int i = 0; i < n; i++) {
        uint8_t rec[1 + 3 * 1024];
        rec[0] = (uint8_t)(i % 10);
        for (int p = 0; p < 1024; p++) {
            r = r * 1103515245u + 12345u;
            rec[1 + p] = (uint8_t)(180 + i % 60);
            rec[1 + 1024 + p] = (uint8_t)((r >> 16) % 100);
            rec[1 + 2048 + p] = (uint8_t)((p % 32) * 8);
        }
        cr_assert_eq(fwrite(rec, 1, sizeof rec, f), sizeof rec);
    }
    cr_assert_eq(fclose(f), 0);
}

/* dir/cls/k.png, colour 36x40 (resized to the generator's size). */
static void s_write_folder(const char *dir) {
    static const char *const cls[2] = {"warm", "cool"};
    for (int c = 0; c < 2; c++) {
        char sub[320];
        snprintf(sub, sizeof sub, "%s/%s", dir, cls[c]);
        cr_assert_eq(mkdir(sub, 0755), 0, "%s", sub);
        for (int k = 0; k < 8; k++) {
            tp_tensor_t img;
            int64_t shape[3] = {36, 40, 3};
            cr_assert_eq(tp_tensor_init(&img, TP_UINT8, 3, shape), TP_OK);
            uint8_t *px = img.data;
            for (int y = 0; y < 36; y++)
                for (int x = 0; x < 40; x++) {
                    uint8_t *p = px + (y * 40 + x) * 3;
                    p[0] = (uint8_t)(c ? 30 + 4 * x : 220 - 2 * y);
                    p[1] = (uint8_t)(60 + 10 * k);
                    p[2] = (uint8_t)(c ? 200 : 6 * x);
                }
            void *png = NULL;
            size_t size = 0;
            cr_assert_eq(tp_image_encode_png(&img, &png, &size), TP_OK, "%s", tp_last_error());
            char path[360];
            snprintf(path, sizeof path, "%s/%d.png", sub, k);
            cr_assert_eq(tp_file_write_atomic(path, png, size), TP_OK, "%s", path);
            free(png);
            tp_tensor_fini(&img);
        }
    }
}

/* tp-train --model dcgan on `data` (extra flags after), `epochs` epochs of
 * 2 steps, batch 16, into dir/run with TensorBoard's events; then
 * tp-generate --count `count` (the run's seed) into dir/g.npy, and
 * dir/expect.txt for gan_colour_check.py. */
static void s_train_generate(const char *dir, const char *data, const char *size_flag,
                             int size, int epochs, int count) {
    char logdir[256], ep[8], npy[256], png[256], cnt[16];
    snprintf(logdir, sizeof logdir, "%s/run", dir);
    snprintf(ep, sizeof ep, "%d", epochs);
    snprintf(npy, sizeof npy, "%s/g.npy", dir);
    snprintf(png, sizeof png, "%s/g.png", dir);
    snprintf(cnt, sizeof cnt, "%d", count);
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "dcgan", "--data", (char *)data,
                    "--epochs", ep, "--steps-per-epoch", "2", "--batch", "16", "--threads",
                    "1", "--logdir", logdir, size_flag ? (char *)size_flag : NULL,
                    size_flag ? "16" : NULL, NULL};
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "tp-train --model dcgan --data %s "
                 "failed:\n%s", data, s_out);
    char want[64];
    snprintf(want, sizeof want, "on colour %dx%d images", size, size);
    cr_assert(strstr(s_out, want), "tp-train did not say '%s':\n%s", want, s_out);
    char *gen[] = {TP_BINARY_DIR "/bin/tp-generate", "--load", logdir, "--count", cnt,
                   "--output", npy, "--png", png, NULL};
    cr_assert_eq(pu_run(gen, env, s_out, sizeof s_out), 0, "tp-generate:\n%s", s_out);
    snprintf(want, sizeof want, "[%d, %d, %d, 3]", count, size, size);
    cr_assert(strstr(s_out, want), "tp-generate did not say %s:\n%s", want, s_out);
    /* the Images tab: one colour grid per epoch, each the epoch's PNG */
    char why[256], *py = (char *)te_python(why, sizeof why);
    if (py) {
        char flags[64], out[8192];
        snprintf(flags, sizeof flags, "--images=samples:%d:samples", epochs);
        int rc = te_check(py, logdir, flags, out, sizeof out);
        cr_assert(rc == 0 || rc == 77, "check_tfevents.py %s (rc %d):\n%s", flags, rc, out);
    }
    char ex[64];
    snprintf(ex, sizeof ex, "%d %d %d\n", size, epochs, count);
    cr_assert_eq(pu_write_file(dir, "expect.txt", ex, strlen(ex)), 0);
}

/* Must hold: tp-train --model dcgan --data cifar:FILE builds the 32 px
 * colour DCGAN from the data, trains it and writes RGB sample grids of 8 x
 * 8 tiles of 32 px (274 x 274) each epoch, in TensorBoard too; tp-generate
 * reads the generator's shape from the checkpoint and writes uint8
 * [64, 32, 32, 3] whose samples are the last grid's tiles, and --png that
 * very grid, byte for byte. */
Test(dcgan_colour, cifar_file_trains_the_32px_colour_gan, .timeout = 240) {
    char dir[] = "/tmp/tp-dcganc-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char bin[256], data[280];
    snprintf(bin, sizeof bin, "%s/data_batch_1.bin", dir);
    s_write_cifar(bin, 64);
    snprintf(data, sizeof data, "cifar:%s", bin);
    s_train_generate(dir, data, NULL, 32, 2, 64);
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/g.png", dir);
    snprintf(b, sizeof b, "%s/run/samples-2.png", dir);
    size_t nx, ny;
    cr_assert(pu_same_file(a, b, &nx, &ny), "tp-generate --png %s (%zu bytes) is not the "
              "run's %s (%zu bytes)", a, nx, b, ny);
    PU_PYTHON_EXPECT(TP_SOURCE_DIR "/tests/tools/gan_colour_check.py", dir, "numpy agrees");
}

/* Must hold: --data imagefolder:DIR of colour PNGs (36x40) trains a colour
 * DCGAN at --image-size 16 (the images resized to it; fc 128x4x4 and two
 * conv-transposes), its grids RGB, tp-generate's samples [5, 16, 16, 3]. */
Test(dcgan_colour, image_folder_resized_to_the_generator, .timeout = 240) {
    char dir[] = "/tmp/tp-dcganc-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char folder[256], data[280];
    snprintf(folder, sizeof folder, "%s/images", dir);
    cr_assert_eq(mkdir(folder, 0755), 0);
    s_write_folder(folder);
    snprintf(data, sizeof data, "imagefolder:%s", folder);
    s_train_generate(dir, data, "--image-size", 16, 1, 5);
    PU_PYTHON_EXPECT(TP_SOURCE_DIR "/tests/tools/gan_colour_check.py", dir, "numpy agrees");
}

/* Must hold: a size the DCGAN does not build at is refused before any
 * training, naming the size and the ones it takes. */
Test(dcgan_colour, other_sizes_are_refused_naming_them, .timeout = 240) {
    char dir[] = "/tmp/tp-dcganc-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char bin[256], data[280], logdir[256];
    snprintf(bin, sizeof bin, "%s/data_batch_1.bin", dir);
    s_write_cifar(bin, 4);
    snprintf(data, sizeof data, "cifar:%s", bin);
    snprintf(logdir, sizeof logdir, "%s/run", dir);
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "dcgan", "--data", data,
                    "--image-size", "30", "--logdir", logdir, "--no-tensorboard", NULL};
    cr_assert_neq(pu_run(argv, env, s_out, sizeof s_out), 0, "size 30 trained:\n%s", s_out);
    cr_assert(strstr(s_out, "image size 30") && strstr(s_out, "power of two"), "%s", s_out);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
