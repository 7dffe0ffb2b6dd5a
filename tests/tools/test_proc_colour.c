/* towerpack tests: your own colour images, from a folder to ONNX (issue
 * 43). The test makes its data: coloured squares and discs on a grey
 * ground, three classes that differ only in hue at equal luminance (a grey
 * decoder sees the same picture for all three), written as PNG and JPEG
 * into class folders. tp-train must find the classes in the folder names
 * and train in colour; tp-predict must report the names; tp-export must
 * carry them. Independent references (tests/tools/colour_check.py, Debian's
 * python3-pil, python3-numpy, python3-opencv, python3-onnx; torchvision
 * when there) check the class order, the decoded and normalised pixels and
 * the exported model; those parts skip, saying what is missing, without
 * them. Own executable: it forks and execs the tools. */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "proc_testutil.h"
#include <towerpack/dataflow_spec.h>
#include <towerpack/image.h>
#include <towerpack/log.h>
#include <towerpack/models.h>
#include "dir_testutil.h"

#define PY "/usr/bin/python3"
#define CHECK TP_SOURCE_DIR "/tests/tools/colour_check.py"
#define SIDE 32

static char s_dir[64];
static char s_out[1 << 20];

/* Not in sorted order on purpose: strcmp (and Python's sorted) put the
 * capital first: Green, blue, red. Each colour has luminance 110 (BT.601),
 * as the ground has. */
static const char *const s_names[3] = {"red", "Green", "blue"};
static const uint8_t s_rgb[3][3] = {{190, 76, 76}, {65, 141, 65}, {93, 93, 238}};

static void s_setup(void) {
    tp_log_set_level(TP_LOG_WARN);
    dt_make(s_dir, sizeof s_dir, "tp-colour");
}

static void s_teardown(void) {
    dt_remove(s_dir);
}

static int s_run(char *const *argv) {
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    return pu_run(argv, env, s_out, sizeof s_out);
}

static void s_write(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(data, 1, size, f), size);
    cr_assert_eq(fclose(f), 0);
}

/* root/<class>/<i>.png|jpg: n images of SIDE x SIDE per class, a square or
 * a disc of the class's colour at a random place (a fixed generator). */
static void s_make_set(const char *root, int n, uint32_t seed) {
    mkdir(root, 0755);
    uint32_t r = seed;
#define RND(k) ((r = r * 1664525u + 1013904223u), (int)((r >> 8) % (uint32_t)(k)))
    for (int c = 0; c < 3; c++) {
        char dir[256];
        snprintf(dir, sizeof dir, "%s/%s", root, s_names[c]);
        cr_assert_eq(mkdir(dir, 0755), 0, "%s", dir);
        for (int i = 0; i < n; i++) {
            tp_tensor_t t;
            int64_t shape[3] = {SIDE, SIDE, 3};
            cr_assert_eq(tp_tensor_init(&t, TP_UINT8, 3, shape), TP_OK);
            uint8_t *p = t.data;
            memset(p, 110, t.nbytes);
            int s = 10 + RND(10), x0 = RND(SIDE - s), y0 = RND(SIDE - s), disc = i % 2;
            for (int y = y0; y < y0 + s; y++)
                for (int x = x0; x < x0 + s; x++) {
                    double dx = x - x0 - s / 2.0 + 0.5, dy = y - y0 - s / 2.0 + 0.5;
                    if (disc && dx * dx + dy * dy > s * s / 4.0)
                        continue;
                    memcpy(p + ((size_t)y * SIDE + x) * 3, s_rgb[c], 3);
                }
            void *data;
            size_t size;
            int jpeg = i % 3 == 0;
            cr_assert_eq(jpeg ? tp_image_encode_jpeg(&t, 95, &data, &size)
                              : tp_image_encode_png(&t, &data, &size), TP_OK);
            char path[320];
            snprintf(path, sizeof path, "%s/%03d.%s", dir, i, jpeg ? "jpg" : "png");
            s_write(path, data, size);
            free(data);
            tp_tensor_fini(&t);
        }
    }
#undef RND
}

/* Returns when the Python references are there; else skips, naming what is
 * missing (`what` says which check). */
static void s_need_python(const char *what) {
    if (access(PY, X_OK) != 0)
        cr_skip_test("%s skipped: no " PY " (install python3-pil, python3-numpy, "
                     "python3-opencv, python3-onnx; scripts/install-deps.sh does)", what);
    char *argv[] = {PY, CHECK, "check", NULL};
    if (s_run(argv) == 3)
        cr_skip_test("%s skipped: %s (install python3-pil, python3-numpy, python3-opencv, "
                     "python3-onnx; scripts/install-deps.sh does)", what, s_out);
}

static json_t *s_json_file(const char *path) {
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s: %s", path, err.text);
    return j;
}

/* The last line of s_out that starts with '{' (a tool's --json object). */
static json_t *s_json_out(void) {
    char *line = NULL;
    for (char *q = s_out; q && *q; q = strchr(q, '\n') ? strchr(q, '\n') + 1 : NULL)
        if (*q == '{')
            line = q;
    cr_assert_not_null(line, "no JSON in: %s", s_out);
    json_error_t err;
    json_t *j = json_loadb(line, strcspn(line, "\n"), 0, &err);
    cr_assert_not_null(j, "%s: %s", err.text, line);
    return j;
}

static double s_last_validation(const char *logdir) {
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_t *j = s_json_file(path);
    json_t *v = json_object_get(json_array_get(j, json_array_size(j) - 1), "validation_accuracy");
    cr_assert(json_is_number(v), "no validation_accuracy in %s", path);
    double acc = json_number_value(v);
    json_decref(j);
    return acc;
}

/* The folders a test trains from, under s_dir: train/ and test/ (each a
 * class folder per colour), their --data specs and the log directory. */
typedef struct {
    char train[128], test[128], tr[160], te[160], logdir[128];
} s_folders_t;

/* s_make_set into f's train (ntrain a class, seed 1) and, unless ntest is
 * 0, test (ntest a class, seed 2). */
static void s_make_folders(s_folders_t *f, int ntrain, int ntest) {
    memset(f, 0, sizeof *f);
    snprintf(f->train, sizeof f->train, "%s/train", s_dir);
    s_make_set(f->train, ntrain, 1);
    snprintf(f->tr, sizeof f->tr, "imagefolder:%s", f->train);
    if (ntest > 0) {
        snprintf(f->test, sizeof f->test, "%s/test", s_dir);
        s_make_set(f->test, ntest, 2);
        snprintf(f->te, sizeof f->te, "imagefolder:%s", f->test);
    }
    snprintf(f->logdir, sizeof f->logdir, "%s/log", s_dir);
}

/* tp-export --onnx of `load` (a run directory or a checkpoint alone) into
 * onnx: it says the input is RGB in [0, 1] and writes the folder's class
 * names beside the file, in the run's order. */
static void s_expect_onnx_export(const char *load, const char *onnx) {
    char *eargv[] = {TP_BINARY_DIR "/bin/tp-export", "--load", (char *)load, "--onnx",
                     (char *)onnx, NULL};
    cr_assert_eq(s_run(eargv), 0, "%s", s_out);
    cr_expect_not_null(strstr(s_out, "float32[batch,3,32,32] RGB in [0, 1]"), "%s", s_out);
    char path[256];
    snprintf(path, sizeof path, "%s.classes.txt", onnx);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char names[64] = "";
    size_t got = fread(names, 1, sizeof names - 1, f);
    fclose(f);
    names[got] = '\0';
    cr_expect_str_eq(names, "Green\nblue\nred\n");
}

Test(colour, a_colour_folder_trains_as_its_classes_in_colour_to_onnx, .init = s_setup,
     .fini = s_teardown, .timeout = 300) {
    s_folders_t f;
    s_make_folders(&f, 60, 20);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--data", f.tr, "--test-data", f.te,
                     "--model", "cnn-bn", "--epochs", "15", "--logdir", f.logdir,
                     "--no-tensorboard", "--stats", "off", NULL};
    cr_assert_eq(s_run(targv), 0, "%s", s_out);
    /* the classes from the folder, colour (today's tool said 10 and grey) */
    cr_assert_not_null(strstr(s_out, "32x32 images (colour), 3 classes"), "%s", s_out);
    double acc = s_last_validation(f.logdir);
    cr_expect_geq(acc, 0.95, "colour test accuracy %.4f", acc);
    char path[256];
    snprintf(path, sizeof path, "%s/data.json", f.logdir);
    json_t *info = s_json_file(path);
    json_t *cl = json_object_get(info, "classes");
    cr_assert_eq(json_array_size(cl), 3);
    /* sorted by name, as torchvision's ImageFolder */
    cr_expect_str_eq(json_string_value(json_array_get(cl, 0)), "Green");
    cr_expect_str_eq(json_string_value(json_array_get(cl, 1)), "blue");
    cr_expect_str_eq(json_string_value(json_array_get(cl, 2)), "red");
    cr_expect_eq(json_integer_value(json_object_get(info, "channels")), 3);
    json_decref(info);

    /* tp-predict: the same accuracy, the class names */
    char preds[160];
    snprintf(preds, sizeof preds, "%s/preds.jsonl", s_dir);
    char *pargv[] = {TP_BINARY_DIR "/bin/tp-predict", "--load", f.logdir, "--data", f.te,
                     "--json", "--output", preds, "--confusion", "none", NULL};
    cr_assert_eq(s_run(pargv), 0, "%s", s_out);
    json_t *j = s_json_out();
    cr_expect(fabs(json_number_value(json_object_get(j, "accuracy")) - acc) < 1e-9,
              "tp-predict %.4f, validation %.4f", json_number_value(json_object_get(j, "accuracy")),
              acc);
    cl = json_object_get(j, "classes");
    cr_assert_eq(json_array_size(cl), 3);
    cr_expect_str_eq(json_string_value(json_array_get(cl, 0)), "Green");
    cr_expect_str_eq(json_string_value(json_array_get(cl, 2)), "red");
    cr_expect_eq(json_integer_value(json_object_get(j, "samples")), 60);
    json_decref(j);

    /* tp-export: the names beside the file */
    char onnx[160];
    snprintf(onnx, sizeof onnx, "%s/model.onnx", s_dir);
    s_expect_onnx_export(f.logdir, onnx);

    /* OpenCV's DNN on the file, from RGB in [0, 1], against tp-predict */
    s_need_python("the OpenCV check of the ONNX export");
    char side[8];
    snprintf(side, sizeof side, "%d", SIDE);
    char *cargv[] = {PY, CHECK, "onnx", onnx, f.test, preds, side, side, NULL};
    cr_expect_eq(s_run(cargv), 0, "%s", s_out);
    cr_log_info("%s", s_out);
}

/* The same folder decoded grey (--channels 1): the classes differ only in
 * hue, so the grey model sees chance. This is what tp-train did with every
 * folder before. */
Test(colour, the_same_folder_in_grey_is_chance, .init = s_setup, .fini = s_teardown) {
    s_folders_t f;
    s_make_folders(&f, 60, 20);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--data", f.tr, "--test-data", f.te,
                     "--model", "cnn-bn", "--epochs", "6", "--channels", "1",
                     "--logdir", f.logdir, "--no-tensorboard", "--stats", "off", NULL};
    cr_assert_eq(s_run(targv), 0, "%s", s_out);
    cr_assert_not_null(strstr(s_out, "images (grey), 3 classes"), "%s", s_out);
    double acc = s_last_validation(f.logdir);
    cr_expect_leq(acc, 0.6, "grey accuracy %.4f on hue-only classes", acc);
}

/* The class order against torchvision's rule, and the pixels that enter the
 * model (decoded, channels first; normalised per channel for a run from
 * before the model did it) against PIL and numpy. */
Test(colour, class_order_and_pixels_match_pil_and_torchvision, .init = s_setup,
     .fini = s_teardown) {
    char root[128];
    snprintf(root, sizeof root, "%s/set", s_dir);
    s_make_set(root, 6, 3);
    s_need_python("the class order and pixel checks");
    char *argv[] = {PY, CHECK, "classes", root, NULL};
    cr_assert_eq(s_run(argv), 0, "%s", s_out);
    char **names;
    int n;
    cr_assert_eq(tp_image_folder_classes(root, &names, &n, NULL, 0), TP_OK);
    char ours[256] = "";
    for (int i = 0; i < n; i++) {
        strcat(ours, names[i]);
        strcat(ours, "\n");
        free(names[i]);
    }
    free(names);
    cr_expect_not_null(strstr(s_out, ours), "ours:\n%s\nreference:\n%s", ours, s_out);

    /* what tp-predict and tp-train's validation feed the model: uint8,
     * channels first (the model normalises: test_zoo's
     * the_models_normalisation_is_the_pipelines), and for a run from
     * before, float32 normalised per channel by the pipeline */
    for (int in_model = 1; in_model >= 0; in_model--) {
        tp_zoo_data_t d;
        tp_zoo_data_init(&d);
        d.channels = 3;
        d.nnorm = 3;
        d.in_model = in_model;
        const float mean[3] = {123.675f, 116.28f, 103.53f},
                    std[3] = {58.395f, 57.12f, 57.375f};
        memcpy(d.mean, mean, sizeof mean);
        memcpy(d.std, std, sizeof std);
        char src[160], spec[4096];
        snprintf(src, sizeof src, "imagefolder:%s", root);
        cr_assert_eq(tp_zoo_eval_spec(src, &d, SIDE, SIDE, spec, sizeof spec), TP_OK);
        tp_zoo_data_fini(&d);
        tp_dataflow_t *df = NULL;
        cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s: %s", spec, tp_last_error());
        cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK);
        char raw[160];
        snprintf(raw, sizeof raw, "%s/pixels.f32", s_dir);
        FILE *f = fopen(raw, "wb");
        tp_datapoint_t *dp = NULL;
        int count = 0;
        while (tp_dataflow_next(df, &dp) == TP_OK) {
            const tp_tensor_t *t = tp_datapoint_cget(dp, 0);
            cr_assert_eq(t->dtype, in_model ? TP_UINT8 : TP_FLOAT32, "%s", spec);
            cr_assert_eq(t->ndim, 3);
            cr_assert_eq(t->shape[0], 3, "channels first");
            if (in_model) {  /* the pixel values, as float32 for the check */
                const uint8_t *p = t->data;
                for (size_t k = 0; k < t->nbytes; k++) {
                    float v = p[k];
                    cr_assert_eq(fwrite(&v, sizeof v, 1, f), 1);
                }
            } else {
                cr_assert_eq(fwrite(t->data, 1, t->nbytes, f), t->nbytes);
            }
            tp_datapoint_destroy(&dp);
            count++;
        }
        fclose(f);
        tp_dataflow_destroy(&df);
        cr_assert_eq(count, 18);
        char side[8];
        snprintf(side, sizeof side, "%d", SIDE);
        char *pargv[] = {PY, CHECK, "pixels", root, raw, side, side,
                         in_model ? "0" : "123.675/116.28/103.53",
                         in_model ? "1" : "58.395/57.12/57.375", NULL};
        cr_expect_eq(s_run(pargv), 0, "%s", s_out);
        cr_log_info("%s", s_out);
    }
}

Test(colour, bad_folders_are_named, .init = s_setup, .fini = s_teardown) {
    char empty[200];
    s_folders_t f;
    s_make_folders(&f, 3, 3);
    /* a class folder missing from the test set */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -r %s/blue", f.test);
    cr_assert_eq(system(cmd), 0);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--data", f.tr, "--test-data", f.te,
                     "--model", "cnn", "--epochs", "1", "--logdir", f.logdir,
                     "--no-tensorboard", "--stats", "off", NULL};
    cr_assert_neq(s_run(targv), 0, "%s", s_out);
    cr_expect_not_null(strstr(s_out, "has no class folder 'blue'"), "%s", s_out);
    /* an empty class folder (in both sets: the sets agree) */
    snprintf(cmd, sizeof cmd, "cp -r %s/blue %s/ && mkdir %s/violet", f.train, f.test, f.test);
    cr_assert_eq(system(cmd), 0);
    snprintf(empty, sizeof empty, "%s/violet", f.train);
    cr_assert_eq(mkdir(empty, 0755), 0);
    cr_assert_neq(s_run(targv), 0, "%s", s_out);
    cr_expect_not_null(strstr(s_out, empty), "%s", s_out);
    cr_expect_not_null(strstr(s_out, "holds no images"), "%s", s_out);
    /* the folder above the splits given as the training set: its "classes"
     * would be test and train */
    snprintf(cmd, sizeof cmd, "rmdir %s/violet %s/violet", f.train, f.test);
    cr_assert_eq(system(cmd), 0);
    char above[128];
    snprintf(above, sizeof above, "imagefolder:%s", s_dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s", f.logdir);  /* the folder holds the log too */
    cr_assert_eq(system(cmd), 0);
    char *aargv[] = {TP_BINARY_DIR "/bin/tp-train", "--data", above, "--test-data", f.te,
                     "--model", "cnn", "--epochs", "1", "--logdir", "/tmp/tp-colour-nolog",
                     "--no-tensorboard", "--stats", "off", NULL};
    cr_assert_neq(s_run(aargv), 0, "%s", s_out);
    cr_expect_not_null(strstr(s_out, "its class folders are 'test', 'train'"), "%s", s_out);
    cr_expect_not_null(strstr(s_out, "--data imagefolder:DIR/train"), "%s", s_out);
    /* one class folder: a classifier of one class learns nothing */
    snprintf(cmd, sizeof cmd, "rm -r %s/blue %s/red %s/blue %s/red", f.train, f.train, f.test,
             f.test);
    cr_assert_eq(system(cmd), 0);
    cr_assert_neq(s_run(targv), 0, "%s", s_out);
    cr_expect_not_null(strstr(s_out, "holds 1 class ('Green')"), "%s", s_out);
    cr_expect_not_null(strstr(s_out, "a classifier needs 2 or more"), "%s", s_out);
}

/* A checkpoint copied without its log directory (no data.json beside it)
 * still knows its data: its safetensors metadata records channels, size,
 * classes and class names (read here by hand, as any safetensors reader
 * would), and tp-predict and tp-export take them from there. */
Test(colour, a_checkpoint_copied_alone_keeps_its_classes, .init = s_setup,
     .fini = s_teardown) {
    char alone[160], ckpt[192];
    s_folders_t f;
    s_make_folders(&f, 6, 3);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--data", f.tr, "--test-data", f.te,
                     "--model", "cnn", "--epochs", "1", "--batch", "4", "--logdir", f.logdir,
                     "--no-tensorboard", "--stats", "off", NULL};
    cr_assert_eq(s_run(targv), 0, "%s", s_out);
    snprintf(alone, sizeof alone, "%s/alone", s_dir);
    cr_assert_eq(mkdir(alone, 0755), 0);
    snprintf(ckpt, sizeof ckpt, "%s/copy.safetensors", alone);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp %s/model-*.safetensors %s", f.logdir, ckpt);  /* one epoch: one */
    cr_assert_eq(system(cmd), 0, "%s", cmd);

    char side[8];
    snprintf(side, sizeof side, "%d", SIDE);
    if (access(PY, X_OK) == 0) {  /* the standard library's json and struct only */
        char *margv[] = {PY, CHECK, "meta", ckpt, side, side, "Green,blue,red", NULL};
        cr_expect_eq(s_run(margv), 0, "%s", s_out);
        cr_log_info("%s", s_out);
    } else {
        cr_log_warn("the metadata read by Python skipped: no " PY);
    }

    char *pargv[] = {TP_BINARY_DIR "/bin/tp-predict", "--load", ckpt, "--data", f.te,
                     "--json", "--confusion", "none", NULL};
    cr_assert_eq(s_run(pargv), 0, "%s", s_out);
    json_t *j = s_json_out();
    json_t *cl = json_object_get(j, "classes");
    cr_assert_eq(json_array_size(cl), 3, "%s", s_out);
    cr_expect_str_eq(json_string_value(json_array_get(cl, 0)), "Green");
    cr_expect_str_eq(json_string_value(json_array_get(cl, 1)), "blue");
    cr_expect_str_eq(json_string_value(json_array_get(cl, 2)), "red");
    cr_expect_eq(json_integer_value(json_object_get(j, "samples")), 9);
    json_decref(j);

    char onnx[192];
    snprintf(onnx, sizeof onnx, "%s/model.onnx", alone);
    s_expect_onnx_export(ckpt, onnx);
}

/* --workers auto: the decoding and augmentation in one forked worker per
 * core the process may run on (its affinity; one core left to the trainer
 * above 2), which is also the default
 * for image files when the model runs on a GPU; on the CPU the default
 * stays 0 (the towers take the cores), and a number given wins. */
Test(colour, workers_auto_forks_one_decoder_per_core, .init = s_setup, .fini = s_teardown) {
    s_folders_t f;
    s_make_folders(&f, 12, 0);
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    long cores = CPU_COUNT(&set);
    long n = cores <= 2 ? cores : cores - 1;
    n = n < 1 ? 1 : n > 32 ? 32 : n;
    char want[64];
    snprintf(want, sizeof want, "| processes %ld restart=3 | batch", n);
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    const char *modes[4] = {"auto", NULL, "1", "auto"};
    for (int m = 0; m < 4; m++) {
        if (m == 3) {
            /* pinned to one core (as taskset or a container's cpuset
             * leaves a process fewer cores than the machine has): auto
             * counts the cores it may run on, not the machine's */
            CPU_ZERO(&set);
            CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &set);
            cr_assert_eq(sched_setaffinity(0, sizeof set, &set), 0);
        }
        char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--data", f.tr, "--test-data", f.tr,
                         "--model", "cnn-bn", "--epochs", "1", "--steps-per-epoch", "2",
                         "--batch", "4", "--towers", "1", "--devices", "cpu",
                         "--logdir", f.logdir, "--logdir-action", "delete",
                         "--no-tensorboard", "--stats", "off",
                         modes[m] ? "--workers" : NULL, (char *)modes[m], NULL};
        cr_assert_eq(pu_run(targv, env, s_out, sizeof s_out), 0, "%s", s_out);
        const char *line = strstr(s_out, "training data: ");
        cr_assert_not_null(line, "%s", s_out);
        size_t len = strcspn(line, "\n");
        if (m == 0)
            cr_expect_not_null(memmem(line, len, want, strlen(want)), "want '%s' in %.*s",
                               want, (int)len, line);
        else if (m == 1)  /* the CPU's default: the pipeline on one thread */
            cr_expect_null(memmem(line, len, "processes", 9), "%.*s", (int)len, line);
        else  /* --workers 1; auto on one core */
            cr_expect_not_null(memmem(line, len, "| processes 1 restart=3 |", 25), "%.*s",
                               (int)len, line);
    }
}

/* Must hold: tp-predict scores a test folder against the model's classes
 * by name. A folder with only some of the classes (here only 'red', the
 * model's class 2; the folder's own label 0) is counted in the model's row
 * of red, not of its class 0 ('Green'): every image is counted in row 2 of
 * the confusion matrix, whatever the model predicts, and the report gives
 * the classes with no image no accuracy ('-', not 0). A class folder the
 * model does not have is refused naming it and the model's classes. */
Test(colour, tp_predict_scores_a_folder_by_class_name, .init = s_setup, .fini = s_teardown) {
    char cmd[600];
    s_folders_t f;
    s_make_folders(&f, 6, 0);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--data", f.tr, "--test-data", f.tr,
                     "--model", "cnn", "--epochs", "1", "--batch", "6", "--towers", "1",
                     "--logdir", f.logdir, "--no-tensorboard", "--stats", "off", NULL};
    cr_assert_eq(s_run(targv), 0, "%s", s_out);
    char only[128], data[160];
    snprintf(only, sizeof only, "%s/only-red", s_dir);
    snprintf(cmd, sizeof cmd, "mkdir %s && cp -r %s/red %s/", only, f.train, only);
    cr_assert_eq(system(cmd), 0);
    snprintf(data, sizeof data, "imagefolder:%s", only);
    char *pargv[] = {TP_BINARY_DIR "/bin/tp-predict", "--load", f.logdir, "--data", data,
                     "--json", "--confusion", "none", NULL};
    cr_assert_eq(s_run(pargv), 0, "%s", s_out);
    json_t *j = s_json_out();
    cr_assert_eq(json_integer_value(json_object_get(j, "samples")), 6, "%s", s_out);
    json_t *cm = json_object_get(j, "confusion");
    cr_assert_eq(json_array_size(cm), 3, "%s", s_out);
    int64_t rows[3] = {0};
    for (size_t r = 0; r < 3; r++)
        for (size_t c = 0; c < 3; c++)
            rows[r] += json_integer_value(json_array_get(json_array_get(cm, r), c));
    cr_expect(rows[0] == 0 && rows[1] == 0 && rows[2] == 6,
              "the red folder's images counted in rows %lld %lld %lld, not all in red's (2)",
              (long long)rows[0], (long long)rows[1], (long long)rows[2]);
    json_decref(j);
    /* the report: the classes with no image have no accuracy (not 0) */
    char *rargv[] = {TP_BINARY_DIR "/bin/tp-predict", "--load", f.logdir, "--data", data,
                     "--confusion", "none", NULL};
    cr_assert_eq(s_run(rargv), 0, "%s", s_out);
    cr_expect_not_null(strstr(s_out, "per class: 0:- 1:- 2:"), "%s", s_out);
    snprintf(cmd, sizeof cmd, "mv %s/red %s/violet", only, only);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(s_run(pargv), 1, "%s", s_out);
    cr_expect_not_null(strstr(s_out, "has a class folder 'violet' that is not a class of the "
                                     "model ('Green', 'blue', 'red')"), "%s", s_out);
}
