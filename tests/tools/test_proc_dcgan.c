/* towerpack tests: the zoo's GAN through tp-train, run as a user runs it
 * (tp-train --model dcgan on Fashion-MNIST, a few steps): the GAN
 * trainer's losses and the sample grids SampleGrid writes each epoch. Own
 * executable: it forks and execs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/image.h>
#include <towerpack/models.h>
#include "proc_testutil.h"

static char s_out[1 << 18];

/* The column `name` of steps.tsv, one value per step, into v[max]; the
 * number of rows read. */
static int s_column(const char *path, const char *name, double *v, int max) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[4096];
    cr_assert_not_null(fgets(line, sizeof line, f), "%s: empty", path);
    int col = -1, c = 0;
    for (char *save = NULL, *tok = strtok_r(line, "\t\n", &save); tok;
         tok = strtok_r(NULL, "\t\n", &save), c++)
        if (!strcmp(tok, name))
            col = c;
    cr_assert_geq(col, 0, "%s: no column %s", path, name);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        c = 0;
        for (char *save = NULL, *tok = strtok_r(line, "\t\n", &save); tok;
             tok = strtok_r(NULL, "\t\n", &save), c++)
            if (c == col)
                v[n++] = strtod(tok, NULL);
    }
    fclose(f);
    return n;
}

/* Must hold: DCGAN trains under the GAN trainer (both players' losses
 * finite at every step, and moving: the two updates change the weights
 * each step), and each epoch's grid of 64 samples is an 8 x 8 grid of 28 x
 * 28 tiles with 2 px between and around them (242 x 242, grey). */
Test(dcgan, tp_train_trains_it_and_writes_sample_grids, .timeout = 180) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK))
        cr_skip_test("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    char dir[] = "/tmp/tp-dcgan-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/run", dir);
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "dcgan", "--epochs", "2",
                    "--steps-per-epoch", "3", "--batch", "16", "--threads", "1",
                    "--logdir", logdir, "--no-tensorboard", NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    int rc = pu_run(argv, env, s_out, sizeof s_out);
    cr_assert_eq(rc, 0, "tp-train --model dcgan failed:\n%s", s_out);

    char path[256];
    snprintf(path, sizeof path, "%s/steps.tsv", logdir);
    static const char *const losses[2] = {"g_loss", "d_loss"};
    for (int k = 0; k < 2; k++) {
        double v[16];
        int n = s_column(path, losses[k], v, 16);
        cr_assert_eq(n, 6, "%s: %d steps of %s (6 trained)", path, n, losses[k]);
        int moved = 0;
        for (int i = 0; i < n; i++) {
            cr_assert(isfinite(v[i]) && v[i] > 0, "%s at step %d: %g", losses[k], i + 1, v[i]);
            moved |= fabs(v[i] - v[0]) > 1e-4;
        }
        cr_assert(moved, "%s stayed at %g for %d steps", losses[k], v[0], n);
    }
    for (int e = 1; e <= 2; e++) {
        snprintf(path, sizeof path, "%s/samples-%d.png", logdir, e);
        tp_tensor_t img;
        cr_assert_eq(tp_image_read(path, NULL, &img), TP_OK, "%s: %s", path, tp_last_error());
        cr_assert_eq(img.shape[0], 8 * 28 + 9 * 2, "%s: height %lld", path,
                     (long long)img.shape[0]);
        cr_assert_eq(img.shape[1], 8 * 28 + 9 * 2, "%s: width %lld", path,
                     (long long)img.shape[1]);
        cr_assert(img.ndim == 2 || img.shape[2] == 1, "%s: not grey", path);
        tp_tensor_fini(&img);
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
