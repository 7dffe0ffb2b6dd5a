/* tp-export-images: write Fashion-MNIST (the IDX files) as a folder of PNG
 * images in torchvision's ImageFolder layout, so the image pipeline
 * (imagefolder:, decode, imgaug) can be tried end to end on real data:
 *
 *   tp-export-images OUT            OUT/train/<k>-<name>/<n>.png (60000)
 *                                   OUT/test/<k>-<name>/<n>.png  (10000)
 *
 * The class folders sort in label order (0-tshirt .. 9-ankle-boot), so
 * imagefolder's class indices are Fashion-MNIST's labels. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <towerpack/towerpack.h>

static const char *s_names[10] = {"0-tshirt", "1-trouser", "2-pullover",
                                  "3-dress", "4-coat", "5-sandal", "6-shirt",
                                  "7-sneaker", "8-bag", "9-ankle-boot"};

static int s_mkdir(const char *p) {
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "tp-export-images: mkdir %s: %s\n", p, strerror(errno));
        return -1;
    }
    return 0;
}

static int s_export(const char *out, const char *split) {
    tp_dataflow_t *df = tp_df_fashion_mnist(split, 0);
    if (!df || tp_dataflow_reset_state(df, 0, 0) != TP_OK) {
        fprintf(stderr, "tp-export-images: %s\n", tp_last_error());
        tp_dataflow_destroy(&df);
        return -1;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", out, split);
    if (s_mkdir(dir) != 0) {
        tp_dataflow_destroy(&df);
        return -1;
    }
    for (int k = 0; k < 10; k++) {
        snprintf(dir, sizeof dir, "%s/%s/%s", out, split, s_names[k]);
        if (s_mkdir(dir) != 0) {
            tp_dataflow_destroy(&df);
            return -1;
        }
    }
    long n = 0;
    tp_datapoint_t *dp;
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
        const tp_tensor_t *img = tp_datapoint_cget(dp, 0);
        int label = *(const int32_t *)tp_datapoint_cget(dp, 1)->data;
        void *png = NULL;
        size_t size = 0;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s/%s/%05ld.png", out, split,
                 s_names[label % 10], n++);
        rc = tp_image_encode_png(img, &png, &size);
        /* a plain write: an fsync per file made 70000 files take minutes,
         * and a half-written export is simply made again */
        FILE *f = rc == TP_OK ? fopen(path, "wb") : NULL;
        if (rc == TP_OK && (!f || fwrite(png, 1, size, f) != size))
            rc = tp_error(TP_ERR_IO, "write %s: %s", path, strerror(errno));
        if (f && fclose(f) != 0 && rc == TP_OK)
            rc = tp_error(TP_ERR_IO, "write %s: %s", path, strerror(errno));
        free(png);
        tp_datapoint_destroy(&dp);
        if (rc != TP_OK)
            break;
    }
    tp_dataflow_destroy(&df);
    if (rc < 0) {
        fprintf(stderr, "tp-export-images: %s\n", tp_last_error());
        return -1;
    }
    printf("tp-export-images: %ld %s images in %s/%s\n", n, split, out, split);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: tp-export-images OUT\n"
                "Write Fashion-MNIST (%s) as PNG files in the ImageFolder\n"
                "layout: OUT/train/<k>-<class>/<n>.png and OUT/test/...\n"
                "Then: tp-train --data imagefolder:OUT/train "
                "--test-data imagefolder:OUT/test,shuffle=0\n",
                tp_df_fashion_mnist_dir());
        return argc == 2 ? 0 : 2;
    }
    if (s_mkdir(argv[1]) != 0 || s_export(argv[1], "train") != 0 ||
        s_export(argv[1], "test") != 0)
        return 1;
    return 0;
}
