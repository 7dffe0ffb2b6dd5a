/* towerpack tests: the image path of the programs, run as a user runs
 * them: tp-train on an image folder of colour JPEGs of another size (decoded
 * grey and resized to the models' 28x28, the class table in the log) and
 * tp-export-images' usage. Own executable: it forks and execs. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <towerpack/image.h>
#include "proc_testutil.h"

static char s_dir[64];

static void s_setup(void) {
    snprintf(s_dir, sizeof s_dir, "/tmp/tp-images-cli-XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
}

static void s_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", s_dir);
}

/* Run argv (NULL-terminated), stdout+stderr into out[size]; the exit
 * status, -1 when killed. */
static int s_run(char *const *argv, char *out, size_t size) {
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    return pu_run(argv, env, out, size);
}

static char s_out[1 << 18];

/* Two classes of 60x40 RGB JPEGs, dark and bright: with --channels 1
 * tp-train decodes them grey at a DCT scale (colour by default:
 * test_proc_colour), resizes to 28x28, trains and validates. */
Test(tp_images, tp_train_on_an_image_folder, .init = s_setup,
     .fini = s_teardown) {
    static const char *cls[2] = {"bright", "dark"};
    char img[96];
    snprintf(img, sizeof img, "%s/img", s_dir);
    cr_assert_eq(mkdir(img, 0755), 0);
    for (int k = 0; k < 2; k++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", img, cls[k]);
        cr_assert_eq(mkdir(p, 0755), 0);
        for (int i = 0; i < 40; i++) {
            int64_t shape[3] = {40, 60, 3};
            tp_tensor_t t;
            cr_assert_eq(tp_tensor_init(&t, TP_UINT8, 3, shape), TP_OK);
            for (size_t j = 0; j < t.nbytes; j++)
                ((uint8_t *)t.data)[j] =
                    (uint8_t)((k == 0 ? 180 : 40) + (j * 7 + i) % 50);
            void *d;
            size_t n;
            cr_assert_eq(tp_image_encode_jpeg(&t, 90, &d, &n), TP_OK);
            snprintf(p, sizeof p, "%s/%s/%02d.jpg", img, cls[k], i);
            FILE *f = fopen(p, "wb");
            cr_assert(f);
            cr_assert_eq(fwrite(d, 1, n, f), n);
            fclose(f);
            free(d);
            tp_tensor_fini(&t);
        }
    }
    char data[128], test[128], logdir[128];
    snprintf(data, sizeof data, "imagefolder:%s", img);
    snprintf(test, sizeof test, "imagefolder:%s,shuffle=0", img);
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp",
                    "--epochs", "10", "--batch", "16", "--channels", "1", "--data", data,
                    "--test-data", test, "--logdir", logdir,
                    "--no-tensorboard", NULL};
    int rc = s_run(argv, s_out, sizeof s_out);
    cr_assert_eq(rc, 0, "tp-train failed:\n%s", s_out);
    cr_assert(strstr(s_out, "imagefolder:") && strstr(s_out, "resize=28x28"),
              "%s", s_out);
    cr_assert(strstr(s_out, "2 classes: 0=bright 1=dark"), "no class table "
              "in the log:\n%s", s_out);
    /* dark against bright: a linear model separates them */
    const char *acc = strstr(s_out, "test accuracy ");
    cr_assert(acc, "%s", s_out);
    double a = atof(acc + 14);
    cr_assert_gt(a, 0.9, "accuracy %g on two trivially separable classes", a);
}

Test(tp_images, export_usage) {
    char *argv[] = {TP_BINARY_DIR "/bin/tp-export-images", "--help", NULL};
    cr_assert_eq(s_run(argv, s_out, sizeof s_out), 0);
    cr_assert(strstr(s_out, "ImageFolder"), "%s", s_out);
    char *bad[] = {TP_BINARY_DIR "/bin/tp-export-images", NULL};
    cr_assert_eq(s_run(bad, s_out, sizeof s_out), 2);
}
