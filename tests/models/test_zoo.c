/* towerpack tests: the model zoo's data sources (tp_zoo_source), the names
 * tp-train and tp-predict both take: each becomes a spec that parses and
 * yields what the zoo's models take; anything else names the valid forms.
 * And the models themselves: sizes, colour, weight decay, the GPT's
 * dropout. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>

Test(zoo, sources_become_specs_in_the_order_asked) {
    char b[512];
    cr_assert_eq(tp_zoo_source("fashion-mnist:test", 1, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "fashion-mnist:test,shuffle=0");
    cr_assert_eq(tp_zoo_source("fashion-mnist:train", 0, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "fashion-mnist:train");
    /* the user's own shuffle setting wins */
    cr_assert_eq(tp_zoo_source("idx:a,b,shuffle=1", 1, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "idx:a,b,shuffle=1");
    cr_assert_eq(tp_zoo_source("lmdb:/x.lmdb", 1, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "lmdb:/x.lmdb");
    cr_assert_eq(tp_zoo_source("tensorpack-lmdb:/t.lmdb", 0, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "tensorpack-lmdb:/t.lmdb,int32");
    cr_assert_eq(tp_zoo_source("imagefolder:/d", 1, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "imagefolder:/d,shuffle=0,mode=grey,min-short=28 | imgaug resize=28x28");
    cr_assert_eq(tp_zoo_source("imagelist:/l.txt", 0, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "imagelist:/l.txt,mode=grey,min-short=28 | imgaug resize=28x28");
}

Test(zoo, unknown_sources_name_the_valid_forms) {
    char b[512];
    cr_expect_eq(tp_zoo_source("mnist", 0, b, sizeof b), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "'mnist'") && strstr(tp_last_error(), "imagefolder:DIR"),
              "%s", tp_last_error());
    char small[16];
    cr_expect_eq(tp_zoo_source("imagefolder:/a/long/path", 0, small, sizeof small),
                 TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "too long"), "%s", tp_last_error());
}

/* An image folder through the spec tp_zoo_source makes gives the zoo's
 * input: uint8 [28,28] and an int32 label, whatever the files' size. */
Test(zoo, an_image_folder_yields_the_zoo_input) {
    char dir[] = "/tmp/tp_zoo_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[300];
    for (int c = 0; c < 2; c++) {
        snprintf(path, sizeof path, "%s/class%d", dir, c);
        cr_assert_eq(mkdir(path, 0755), 0);
        int64_t shape[3] = {40, 60, 3};
        tp_tensor_t t;
        cr_assert_eq(tp_tensor_init(&t, TP_UINT8, 3, shape), TP_OK);
        memset(t.data, c ? 200 : 30, t.nbytes);
        void *png;
        size_t n;
        cr_assert_eq(tp_image_encode_png(&t, &png, &n), TP_OK, "%s", tp_last_error());
        snprintf(path, sizeof path, "%s/class%d/a.png", dir, c);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(png, 1, n, f), n);
        fclose(f);
        free(png);
        tp_tensor_fini(&t);
    }
    char src[400], spec[600];
    snprintf(src, sizeof src, "imagefolder:%s", dir);
    cr_assert_eq(tp_zoo_source(src, 1, spec, sizeof spec), TP_OK);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s: %s", spec, tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK, "%s", tp_last_error());
    for (int i = 0; i < 2; i++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        const tp_tensor_t *img = tp_datapoint_get(dp, 0), *lab = tp_datapoint_get(dp, 1);
        cr_expect_eq(img->dtype, TP_UINT8);
        cr_expect_eq(img->ndim, 2);
        cr_expect_eq(img->shape[0], 28);
        cr_expect_eq(img->shape[1], 28);
        cr_expect_eq(lab->dtype, TP_INT32);
        cr_expect_eq(*(int32_t *)lab->data, i, "file order: class %d", i);
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&df);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* ---- the zoo at other image sizes (issue 28) ------------------------------ */

/* Build `name` for h x w images as an inference graph of `batch` rows,
 * with `opts` as the build's user pointer (seed 5: the same weights). */
static tp_model_t *s_model_with(const char *name, int h, int w, int batch,
                                const tp_zoo_options_t *opts, tp_input_desc_t in[2]) {
    cr_assert_eq(tp_zoo_inputs_sized(h, w, in), TP_OK, "%s", tp_last_error());
    tp_model_desc_t md = {in, 2, tp_zoo_find(name)->build, NULL, (void *)opts};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = 0;
    mc.infer_batch = batch;
    mc.seed = 5;
    return tp_model_new(&md, &mc);
}

static tp_model_t *s_model_at(const char *name, int h, int w, tp_input_desc_t in[2]) {
    return s_model_with(name, h, w, 3, NULL, in);
}

/* A fixed batch of n h x w images (pixel i is i * mul mod 256) and labels
 * 0, step, 2 step... */
static void s_feeds(tp_tensor_t feeds[2], int n, int h, int w, int mul, int step) {
    int64_t ishape[3] = {n, h, w}, lshape[1] = {n};
    cr_assert_eq(tp_tensor_init(&feeds[0], TP_UINT8, 3, ishape), TP_OK);
    cr_assert_eq(tp_tensor_init(&feeds[1], TP_INT32, 1, lshape), TP_OK);
    for (size_t i = 0; i < feeds[0].nbytes; i++)
        ((uint8_t *)feeds[0].data)[i] = (uint8_t)(i * (size_t)mul % 256);
    for (int i = 0; i < n; i++)
        ((int32_t *)feeds[1].data)[i] = i * step;
}

/* One forward pass of 3 images (a gradient, so every pixel matters):
 * logits [3,10], finite. */
static void s_forward(const char *name, int h, int w) {
    tp_input_desc_t in[2];
    tp_model_t *m = s_model_at(name, h, w, in);
    cr_assert_not_null(m, "%s at %dx%d: %s", name, h, w, tp_last_error());
    tp_tensor_t feeds[2];
    s_feeds(feeds, 3, h, w, 7, 1);
    tp_fetch_t f = {"logits", {0}};
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, -1, feeds, 2, &f, 1, &ro), TP_OK, "%s at %dx%d: %s",
                 name, h, w, tp_last_error());
    cr_expect_eq(f.value.ndim, 2, "%s at %dx%d", name, h, w);
    cr_expect_eq(f.value.shape[0], 3, "%s at %dx%d", name, h, w);
    cr_expect_eq(f.value.shape[1], 10, "%s at %dx%d", name, h, w);
    const float *l = f.value.data;
    for (int i = 0; i < 30; i++)
        cr_expect(l[i] == l[i] && l[i] > -1e6 && l[i] < 1e6, "%s at %dx%d: logit %g",
                  name, h, w, (double)l[i]);
    tp_model_destroy(&m);
    tp_tensor_fini(&feeds[0]);
    tp_tensor_fini(&feeds[1]);
}

Test(zoo, every_model_runs_at_32x32_and_20x20) {
    const tp_zoo_model_t *const *all = tp_zoo_all();
    for (int i = 0; all[i]; i++) {
        s_forward(all[i]->name, 32, 32);
        s_forward(all[i]->name, 20, 20);
    }
    s_forward("cnn", 24, 36);  /* not square */
}

/* A model whose summary says "weight decay" minimises the cross-entropy
 * plus the L2 penalty (a weight_decay node in its graph); the others do
 * not. resnet gained it in session 18 (0.9418 without, 0.950 with). */
Test(zoo, weight_decay_is_where_the_summary_says) {
    const tp_zoo_model_t *const *all = tp_zoo_all();
    for (int i = 0; all[i]; i++) {
        tp_input_desc_t in[2];
        tp_model_t *m = s_model_at(all[i]->name, 28, 28, in);
        cr_assert_not_null(m, "%s: %s", all[i]->name, tp_last_error());
        int said = strstr(all[i]->summary, "weight decay") != NULL;
        int built = tp_model_lookup(m, -1, "weight_decay") != NULL;
        cr_expect_eq(built, said, "%s: the summary %s weight decay, the graph %s it",
                     all[i]->name, said ? "says" : "does not say", built ? "has" : "lacks");
        tp_model_destroy(&m);
        /* no_l2 (tp-train --weight-decay with SGD: the optimizer decays) */
        const tp_zoo_options_t off = {.no_l2 = 1};
        m = s_model_with(all[i]->name, 28, 28, 3, &off, in);
        cr_assert_not_null(m, "%s: %s", all[i]->name, tp_last_error());
        cr_expect_null(tp_model_lookup(m, -1, "weight_decay"), "%s: no_l2", all[i]->name);
        tp_model_destroy(&m);
    }
    cr_expect(strstr(tp_zoo_find("resnet")->summary, "weight decay"));
}

/* The cost of `name` over one fixed batch, built with `opts` as its user
 * pointer (the same seed: the same weights). */
static double s_cost_with(const char *name, const tp_zoo_options_t *opts) {
    tp_input_desc_t in[2];
    tp_model_t *m = s_model_with(name, 28, 28, 4, opts, in);
    cr_assert_not_null(m, "%s: %s", name, tp_last_error());
    tp_tensor_t feeds[2];
    s_feeds(feeds, 4, 28, 28, 13, 3);
    tp_fetch_t f = {"cost", {0}};
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, -1, feeds, 2, &f, 1, &ro), TP_OK, "%s", tp_last_error());
    double cost = ((const float *)f.value.data)[0];
    tp_tensor_fini(&f.value);
    tp_tensor_fini(&feeds[0]);
    tp_tensor_fini(&feeds[1]);
    tp_model_destroy(&m);
    return cost;
}

/* tp_zoo_options_t reaches every model's cost: smoothing 0 is the plain
 * cross-entropy (NULL options), 0.3 another cost (the op itself is held to
 * PyTorch's in test_proc_torch_step). */
Test(zoo, label_smoothing_reaches_every_models_cost) {
    const tp_zoo_options_t none = {.label_smoothing = 0.0f}, some = {.label_smoothing = 0.3f};
    const tp_zoo_model_t *const *all = tp_zoo_all();
    for (int i = 0; all[i]; i++) {
        double plain = s_cost_with(all[i]->name, NULL);
        cr_expect_eq(s_cost_with(all[i]->name, &none), plain, "%s", all[i]->name);
        double smoothed = s_cost_with(all[i]->name, &some);
        cr_expect(fabs(smoothed - plain) > 1e-4, "%s: %g with smoothing 0.3, %g without",
                  all[i]->name, smoothed, plain);
    }
}

/* min_size is what the graph allows: each model builds and runs there, and
 * one pixel less fails when the model is built, naming the model and the
 * size (not a shape error deep in the graph). */
Test(zoo, the_smallest_size_runs_and_one_less_is_named) {
    const tp_zoo_model_t *const *all = tp_zoo_all();
    for (int i = 0; all[i]; i++) {
        const tp_zoo_model_t *z = all[i];
        s_forward(z->name, z->min_size, z->min_size);
        if (z->min_size < 2)
            continue;
        int s = z->min_size - 1;
        tp_input_desc_t in[2];
        tp_model_t *m = s_model_at(z->name, s, s, in);
        cr_expect_null(m, "%s built at %dx%d", z->name, s, s);
        tp_model_destroy(&m);
        char want[64], model[64];
        snprintf(want, sizeof want, "%dx%d is too small", s, s);
        snprintf(model, sizeof model, "model %s:", z->name);
        cr_expect(strstr(tp_last_error(), want) && strstr(tp_last_error(), model),
                  "%s", tp_last_error());
        cr_expect_eq(tp_zoo_check_size(z, s, s), TP_ERR_INVALID);
        cr_expect(strstr(tp_last_error(), want) && strstr(tp_last_error(), model),
                  "%s", tp_last_error());
        cr_expect_eq(tp_zoo_check_size(z, z->min_size, z->min_size), TP_OK);
    }
    cr_expect_eq(tp_zoo_find("cnn")->min_size, 4);
    cr_expect_eq(tp_zoo_find("cnn-bn")->min_size, 8);
}

Test(zoo, sized_inputs_and_their_limits) {
    tp_input_desc_t in[2];
    cr_assert_eq(tp_zoo_inputs_sized(28, 28, in), TP_OK);
    cr_expect_eq(memcmp(&in[0], &tp_zoo_inputs()[0], sizeof in[0]), 0,
                 "28x28 is tp_zoo_inputs()");
    cr_expect_eq(memcmp(&in[1], &tp_zoo_inputs()[1], sizeof in[1]), 0);
    cr_assert_eq(tp_zoo_inputs_sized(32, 20, in), TP_OK);
    cr_expect_str_eq(in[0].name, "image");
    cr_expect_eq(in[0].dtype, TP_UINT8);
    cr_expect_eq(in[0].ndim, 3);
    cr_expect_eq(in[0].shape[0], -1);
    cr_expect_eq(in[0].shape[1], 32);
    cr_expect_eq(in[0].shape[2], 20);
    cr_expect_str_eq(in[1].name, "label");
    cr_expect_eq(tp_zoo_inputs()[0].shape[1], 28, "the default is untouched");
    static const int bad[][2] = {{0, 28}, {28, 0}, {-3, -3}, {TP_ZOO_MAX_SIZE + 1, 28},
                                 {100000, 100000}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(tp_zoo_inputs_sized(bad[i][0], bad[i][1], in), TP_ERR_INVALID);
        char want[64];
        snprintf(want, sizeof want, "%dx%d", bad[i][0], bad[i][1]);
        cr_expect(strstr(tp_last_error(), want), "%s", tp_last_error());
    }
    cr_expect_eq(tp_zoo_check_size(tp_zoo_find("resnet"), 2000, 2000), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "resnet") && strstr(tp_last_error(), "2000x2000"),
              "%s", tp_last_error());
}

Test(zoo, sized_sources_resize_to_the_model_input) {
    char b[512];
    /* 28x28: the same specs as tp_zoo_source */
    cr_assert_eq(tp_zoo_source_sized("fashion-mnist:test", 1, 28, 28, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "fashion-mnist:test,shuffle=0");
    cr_assert_eq(tp_zoo_source_sized("fashion-mnist:train", 0, 32, 32, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "fashion-mnist:train | imgaug resize=32x32");
    cr_assert_eq(tp_zoo_source_sized("idx:a,b", 1, 20, 24, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "idx:a,b,shuffle=0 | imgaug resize=20x24");
    cr_assert_eq(tp_zoo_source_sized("lmdb:/x.lmdb", 1, 32, 32, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "lmdb:/x.lmdb | imgaug resize=32x32");
    cr_assert_eq(tp_zoo_source_sized("tensorpack-lmdb:/t.lmdb", 0, 32, 32, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "tensorpack-lmdb:/t.lmdb,int32 | imgaug resize=32x32");
    cr_assert_eq(tp_zoo_source_sized("imagefolder:/d", 1, 32, 32, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "imagefolder:/d,shuffle=0,mode=grey,min-short=32 | imgaug resize=32x32");
    cr_assert_eq(tp_zoo_source_sized("imagelist:/l", 0, 40, 20, b, sizeof b), TP_OK);
    cr_expect_str_eq(b, "imagelist:/l,mode=grey,min-short=20 | imgaug resize=40x20");
    cr_expect_eq(tp_zoo_source_sized("fashion-mnist:test", 1, 0, 28, b, sizeof b),
                 TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "0x28"), "%s", tp_last_error());
    /* Fashion-MNIST through the spec: uint8 [32,32] images */
    cr_assert_eq(tp_zoo_source_sized("fashion-mnist:test", 1, 32, 32, b, sizeof b), TP_OK);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(b, &df), TP_OK, "%s: %s", b, tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK, "%s", tp_last_error());
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    const tp_tensor_t *img = tp_datapoint_get(dp, 0);
    cr_expect_eq(img->dtype, TP_UINT8);
    cr_expect_eq(img->ndim, 2);
    cr_expect_eq(img->shape[0], 32);
    cr_expect_eq(img->shape[1], 32);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
}

/* A checkpoint of a 32x32 model gives back its size (and dtype); one of a
 * size its model does not build at is refused, naming both. */
Test(zoo, a_checkpoint_gives_back_its_image_size) {
    char dir[] = "/tmp/tp_zoo_ckpt_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[300], ckpt[400];
    snprintf(path, sizeof path, "%s/cnn32.safetensors", dir);
    tp_input_desc_t in[2];
    tp_model_t *m = s_model_at("cnn", 32, 32, in);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_model_set_name(m, "cnn"), TP_OK);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    tp_model_destroy(&m);
    tp_input_desc_t got[2];
    const tp_zoo_model_t *z = tp_zoo_from_checkpoint(path, NULL, ckpt, sizeof ckpt, got);
    cr_assert_not_null(z, "%s", tp_last_error());
    cr_expect_str_eq(z->name, "cnn");
    cr_expect_eq(got[0].ndim, 3);
    cr_expect_eq(got[0].shape[1], 32);
    cr_expect_eq(got[0].shape[2], 32);
    cr_expect_eq(got[0].dtype, TP_UINT8);
    cr_expect_str_eq(got[1].name, "label");
    /* an mlp at 6x6 read as cnn-bn (--model overrides): too small for it */
    snprintf(path, sizeof path, "%s/mlp6.safetensors", dir);
    m = s_model_at("mlp", 6, 6, in);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_model_set_name(m, "mlp"), TP_OK);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    tp_model_destroy(&m);
    cr_expect_null(tp_zoo_from_checkpoint(path, "cnn-bn", ckpt, sizeof ckpt, got));
    cr_expect(strstr(tp_last_error(), "cnn-bn") && strstr(tp_last_error(), "6x6"),
              "%s", tp_last_error());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* ---- colour and any number of classes (issue 43) --------------------------- */

/* ImageNet's statistics, as tp-train's default for colour, normalised in
 * the model. */
static void s_imagenet_data(tp_zoo_data_t *d) {
    static const float m[3] = {123.675f, 116.28f, 103.53f}, sd[3] = {58.395f, 57.12f, 57.375f};
    tp_zoo_data_init(d);
    d->channels = 3;
    d->nnorm = 3;
    memcpy(d->mean, m, sizeof m);
    memcpy(d->std, sd, sizeof sd);
    d->in_model = 1;
}

/* Every model builds for colour (uint8 [B,3,H,W], channels first, the
 * model normalising) and K classes: logits [B,K]; one forward pass is
 * finite. */
Test(zoo, every_model_takes_colour_and_its_classes) {
    const tp_zoo_model_t *const *all = tp_zoo_all();
    tp_zoo_data_t d;
    s_imagenet_data(&d);
    for (int i = 0; all[i]; i++) {
        tp_input_desc_t in[2];
        cr_assert_eq(tp_zoo_inputs_shaped(3, 32, 32, in), TP_OK, "%s", tp_last_error());
        cr_assert_eq(in[0].ndim, 4);
        cr_assert_eq(in[0].dtype, TP_UINT8);
        tp_zoo_options_t o = {.classes = 3, .data = &d};
        tp_model_desc_t md = {in, 2, all[i]->build, NULL, &o};
        tp_model_config_t mc = tp_model_config_default();
        mc.towers = 0;
        mc.infer_batch = 2;
        mc.seed = 5;
        tp_model_t *m = tp_model_new(&md, &mc);
        cr_assert_not_null(m, "%s: %s", all[i]->name, tp_last_error());
        tp_tensor_t feeds[2];
        int64_t ishape[4] = {2, 3, 32, 32}, lshape[1] = {2};
        cr_assert_eq(tp_tensor_init(&feeds[0], TP_UINT8, 4, ishape), TP_OK);
        cr_assert_eq(tp_tensor_init(&feeds[1], TP_INT32, 1, lshape), TP_OK);
        uint8_t *x = feeds[0].data;
        for (size_t k = 0; k < feeds[0].nbytes; k++)
            x[k] = (uint8_t)((k * 37) % 256);
        ((int32_t *)feeds[1].data)[0] = 0;
        ((int32_t *)feeds[1].data)[1] = 2;
        tp_fetch_t f = {"logits", {0}};
        tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
        cr_assert_eq(tp_model_run(m, -1, feeds, 2, &f, 1, &ro), TP_OK, "%s: %s",
                     all[i]->name, tp_last_error());
        cr_expect_eq(f.value.ndim, 2);
        cr_expect_eq(f.value.shape[0], 2, "%s", all[i]->name);
        cr_expect_eq(f.value.shape[1], 3, "%s: 3 classes", all[i]->name);
        for (int k = 0; k < 6; k++) {
            float l = ((const float *)f.value.data)[k];
            cr_expect(l == l && fabsf(l) < 1e6, "%s: logit %g", all[i]->name, (double)l);
        }
        tp_tensor_fini(&f.value);
        tp_tensor_fini(&feeds[0]);
        tp_tensor_fini(&feeds[1]);
        tp_model_destroy(&m);
    }
    tp_input_desc_t in[2];
    cr_expect_eq(tp_zoo_inputs_shaped(2, 32, 32, in), TP_ERR_INVALID);
    tp_zoo_data_fini(&d);
}

/* The logits of `name` (3 classes, seed 5) for 2 colour images 16x16:
 * uint8 pixels with the normalisation in the model (data), or the same
 * pixels normalised here as the pipeline did before, as float32. */
static void s_colour_logits(const char *name, const tp_zoo_data_t *data, int in_model,
                            float out[6]) {
    tp_input_desc_t in[2];
    cr_assert_eq(tp_zoo_inputs_shaped(3, 16, 16, in), TP_OK);
    in[0].dtype = in_model ? TP_UINT8 : TP_FLOAT32;
    tp_zoo_data_t d = *data;
    d.in_model = in_model;
    d.classes = NULL;
    tp_zoo_options_t o = {.classes = 3, .data = &d};
    tp_model_desc_t md = {in, 2, tp_zoo_find(name)->build, NULL, &o};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = 0;
    mc.infer_batch = 2;
    mc.seed = 5;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s: %s", name, tp_last_error());
    tp_tensor_t feeds[2];
    int64_t ishape[4] = {2, 3, 16, 16}, lshape[1] = {2};
    cr_assert_eq(tp_tensor_init(&feeds[0], in[0].dtype, 4, ishape), TP_OK);
    cr_assert_eq(tp_tensor_init(&feeds[1], TP_INT32, 1, lshape), TP_OK);
    size_t n = (size_t)tp_tensor_numel(&feeds[0]);
    for (size_t k = 0; k < n; k++) {
        uint8_t v = (uint8_t)((k * 37 + k / 7) % 256);
        int c = (int)(k / 256 % 3);  /* [B,3,16,16]: the channel of element k */
        if (in_model)
            ((uint8_t *)feeds[0].data)[k] = v;
        else  /* torchvision's ToTensor then Normalize */
            ((float *)feeds[0].data)[k] = ((float)v / 255.0f - data->mean[c] / 255.0f) /
                                          (data->std[c] / 255.0f);
    }
    ((int32_t *)feeds[1].data)[0] = 0;
    ((int32_t *)feeds[1].data)[1] = 2;
    tp_fetch_t f = {"logits", {0}};
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, -1, feeds, 2, &f, 1, &ro), TP_OK, "%s", tp_last_error());
    memcpy(out, f.value.data, 6 * sizeof *out);
    tp_tensor_fini(&f.value);
    tp_tensor_fini(&feeds[0]);
    tp_tensor_fini(&feeds[1]);
    tp_model_destroy(&m);
}

/* uint8 images normalised by the model's first ops give the logits that
 * float32 images normalised before the model gave (torchvision's
 * Normalize): the pipeline may ship a quarter of the bytes. */
Test(zoo, the_models_normalisation_is_the_pipelines) {
    tp_zoo_data_t d;
    s_imagenet_data(&d);
    const char *names[] = {"mlp", "cnn-bn", "resnet"};
    for (int i = 0; i < 3; i++) {
        float a[6], b[6];
        s_colour_logits(names[i], &d, 1, a);
        s_colour_logits(names[i], &d, 0, b);
        for (int k = 0; k < 6; k++)
            cr_expect(fabsf(a[k] - b[k]) <= 1e-4f * (1 + fabsf(b[k])),
                      "%s: logit %d %g in the model, %g before it", names[i], k,
                      (double)a[k], (double)b[k]);
    }
    /* grey's [0, 1] is the identity: no ops added */
    tp_zoo_data_t g;
    tp_zoo_data_init(&g);
    float sc[4], sh[4];
    cr_expect_eq(tp_zoo_data_affine(&g, sc, sh), 1);
    cr_expect_eq(tp_zoo_data_affine(&d, sc, sh), 0);
    cr_expect_float_eq(sc[0], 255.0f / 58.395f, 1e-6);
    cr_expect_float_eq(sh[2], -103.53f / 57.375f, 1e-6);
    tp_zoo_data_fini(&d);
}

/* ResNet-18 in ImageNet's layout: the 7x7 stride-2 stem and max pool, four
 * stages of two basic blocks, 11.2M weights for 1000 classes (torchvision's
 * resnet18 has 11,689,512 with its biases and batch norm: 11.69M). */
Test(zoo, resnet18_is_imagenets) {
    tp_input_desc_t in[2];
    cr_assert_eq(tp_zoo_inputs_shaped(3, 64, 64, in), TP_OK);
    tp_zoo_options_t o = {.classes = 1000};
    tp_model_desc_t md = {in, 2, tp_zoo_find("resnet18")->build, NULL, &o};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = 0;
    mc.infer_batch = 1;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    tp_node_t *stem = tp_model_lookup(m, -1, "stem/W");
    cr_assert_not_null(stem);
    const tp_shape_t *s = tp_node_shape(stem);
    cr_expect(s->ndim == 4 && s->d[0] == 64 && s->d[1] == 3 && s->d[2] == 7 && s->d[3] == 7);
    cr_expect_not_null(tp_model_lookup(m, -1, "stage4/block1/conv2/W"));
    cr_expect_null(tp_model_lookup(m, -1, "stage4/block2/conv2/W"));
    /* every trainable weight and bias: torchvision's count */
    int64_t total = 0;
    for (int i = 0; i < tp_model_node_count(m, -1); i++) {
        tp_node_t *x = tp_model_node(m, -1, i);
        if (tp_node_kind(x) != TP_OP_VARIABLE || strstr(tp_node_name(x), "/EMA"))
            continue;
        int64_t c = 1;
        for (int k = 0; k < tp_node_shape(x)->ndim; k++)
            c *= tp_node_shape(x)->d[k];
        total += c;
    }
    cr_expect_eq(total, 11689512, "%lld parameters", (long long)total);
    tp_model_destroy(&m);
}

/* Colour sources: image folders and lists decoded as RGB, CIFAR as it is;
 * grey-only sources refuse colour; the evaluation chain normalises per
 * channel and puts the channels first. */
Test(zoo, colour_sources_and_the_evaluation_chain) {
    char buf[1024];
    cr_assert_eq(tp_zoo_source_shaped("imagefolder:/x", 1, 3, 64, 64, buf, sizeof buf), TP_OK);
    cr_expect_str_eq(buf, "imagefolder:/x,shuffle=0,mode=rgb,min-short=64 | imgaug resize=64x64");
    cr_assert_eq(tp_zoo_source_shaped("cifar:/c/data_batch_1.bin", 0, 3, 32, 32, buf,
                                      sizeof buf), TP_OK);
    cr_expect_str_eq(buf, "cifar:/c/data_batch_1.bin");
    cr_expect_eq(tp_zoo_source_shaped("fashion-mnist:test", 1, 3, 28, 28, buf, sizeof buf),
                 TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "holds grey images"), "%s", tp_last_error());
    cr_expect_eq(tp_zoo_source_shaped("cifar:/c/x.bin", 1, 1, 32, 32, buf, sizeof buf),
                 TP_ERR_INVALID);
    /* grey is what it was */
    cr_assert_eq(tp_zoo_source_shaped("imagefolder:/x", 0, 1, 28, 28, buf, sizeof buf), TP_OK);
    cr_expect_str_eq(buf, "imagefolder:/x,mode=grey,min-short=28 | imgaug resize=28x28");
    tp_zoo_data_t d;
    tp_zoo_data_init(&d);
    d.channels = 3;
    d.nnorm = 3;
    d.mean[0] = 1, d.mean[1] = 2, d.mean[2] = 3;
    d.std[0] = 4, d.std[1] = 5, d.std[2] = 6;
    cr_assert_eq(tp_zoo_eval_spec("imagefolder:/x", &d, 32, 32, buf, sizeof buf), TP_OK);
    cr_expect_str_eq(buf, "imagefolder:/x,shuffle=0,mode=rgb,min-short=32 | imgaug "
                          "resize=32x32 | augment crop=32x32,mean=1/2/3,std=4/5/6 | imgaug chw");
    d.resize_short = 37;  /* --augment imagenet: short side 256/224, centre crop */
    cr_assert_eq(tp_zoo_eval_spec("imagefolder:/x", &d, 32, 32, buf, sizeof buf), TP_OK);
    cr_expect_str_eq(buf, "imagefolder:/x,shuffle=0,mode=rgb,min-short=37 | imgaug "
                          "resize-short=37,center-crop=32x32 | augment crop=32x32,mean=1/2/3,"
                          "std=4/5/6 | imgaug chw");
    /* normalised in the model: uint8 through, channels first */
    d.in_model = 1;
    d.resize_short = 0;
    cr_assert_eq(tp_zoo_eval_spec("imagefolder:/x", &d, 32, 32, buf, sizeof buf), TP_OK);
    cr_expect_str_eq(buf, "imagefolder:/x,shuffle=0,mode=rgb,min-short=32 | imgaug "
                          "resize=32x32 | imgaug random-crop=32x32,chw");
    tp_zoo_data_fini(&d);
}

/* data.json: written and read back (class names with spaces and quotes
 * kept, the normalisation, the centre crop); a folder without one is a run
 * from before it: grey, 10 classes. */
Test(zoo, the_data_description_round_trips) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-zoo-data-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    tp_zoo_data_t d, back;
    tp_zoo_data_init(&d);
    tp_zoo_data_init(&back);
    int found = -1;
    char ckpt[128];
    snprintf(ckpt, sizeof ckpt, "%s/model-10.safetensors", dir);
    cr_assert_eq(tp_zoo_data_load(ckpt, &back, &found), TP_OK);
    cr_expect_eq(found, 0);
    cr_expect_eq(back.channels, 1);
    cr_expect_eq(back.nclasses, 10);
    const char *names[3] = {"golden retriever", "say \"cheese\"", "ünïcode"};
    cr_assert_eq(tp_zoo_data_set_classes(&d, 3, names), TP_OK);
    d.channels = 3;
    d.nnorm = 3;
    d.mean[2] = 103.53f;
    d.std[0] = d.std[1] = d.std[2] = 57.5f;
    d.resize_short = 73;
    d.in_model = 1;
    cr_assert_eq(tp_zoo_data_save(&d, dir), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_zoo_data_load(ckpt, &back, &found), TP_OK, "%s", tp_last_error());
    cr_expect_eq(found, 1);
    cr_expect_eq(back.channels, 3);
    cr_assert_eq(back.nclasses, 3);
    for (int i = 0; i < 3; i++)
        cr_expect_str_eq(back.classes[i], names[i]);
    cr_expect_eq(back.nnorm, 3);
    cr_expect_float_eq(back.mean[2], 103.53f, 1e-4);
    cr_expect_float_eq(back.std[1], 57.5f, 1e-6);
    cr_expect_eq(back.resize_short, 73);
    cr_expect_eq(back.in_model, 1);
    /* a log directory reads the same file */
    cr_assert_eq(tp_zoo_data_load(dir, &back, &found), TP_OK);
    cr_expect_eq(found, 1);
    /* malformed: named */
    char path[128], cmd[200];
    snprintf(path, sizeof path, "%s/data.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"channels\": 2, \"classes\": []}\n", f);
    fclose(f);
    cr_expect_eq(tp_zoo_data_load(ckpt, &back, &found), TP_ERR_FORMAT);
    cr_expect(strstr(tp_last_error(), path), "%s", tp_last_error());
    tp_zoo_data_fini(&d);
    tp_zoo_data_fini(&back);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* ---- the GPT's dropout (issue 45) -----------------------------------------
 * The gpt with dropout 0.3 and without, from the same seed (dropout adds no
 * variable: the same weights): in inference both give the same cost bit for
 * bit (dropout is the identity there); in training the model without it
 * gives that cost too, the one with it another, and another on the next
 * forward (new masks); a training step runs. */

static tp_optimizer_t *s_sgd_opt(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.01, 0.9, 0);
}

static float s_gpt_cost(tp_model_t *m, int tower, tp_tensor_t feeds[2]) {
    tp_fetch_t f = {.name = "cost"};
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(m, tower, feeds, 2, &f, 1, &ro), TP_OK, "%s", tp_last_error());
    return *(const float *)f.value.data;
}

Test(zoo, gpt_dropout_acts_in_training_only) {
    enum { B = 2, T = 8 };
    tp_input_desc_t in[2];
    cr_assert_eq(tp_zoo_gpt_inputs(T, in), TP_OK);
    int32_t x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) {
        x[i] = (i * 37) % 256;
        y[i] = (i * 91 + 5) % 256;
    }
    int64_t sh[2] = {B, T};
    tp_tensor_t feeds[2];
    tp_tensor_init_wrap(&feeds[0], TP_INT32, 2, sh, x, NULL, NULL);
    tp_tensor_init_wrap(&feeds[1], TP_INT32, 2, sh, y, NULL, NULL);
    float infer[2], train[2][2];
    int drops[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        tp_zoo_gpt_options_t o = {.layers = 2, .heads = 2, .embed = 16,
                                  .dropout = k ? 0.3f : 0.0f};
        tp_model_desc_t md = {in, 2, tp_zoo_gpt_build, s_sgd_opt, &o};
        tp_model_config_t mc = tp_model_config_default();
        mc.batch = B;
        mc.infer_batch = B;
        mc.seed = 5;
        mc.threads = 1;
        tp_model_t *m = tp_model_new(&md, &mc);
        cr_assert_not_null(m, "%s", tp_last_error());
        for (int i = 0; i < tp_model_node_count(m, 0); i++)
            drops[k] += strstr(tp_node_name(tp_model_node(m, 0, i)), "drop") != NULL;
        infer[k] = s_gpt_cost(m, -1, feeds);
        train[k][0] = s_gpt_cost(m, 0, feeds);
        train[k][1] = s_gpt_cost(m, 0, feeds);
        cr_assert_eq(tp_model_run(m, 0, feeds, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        tp_model_destroy(&m);
    }
    /* nanoGPT's places: the embeddings, and per block the attention
     * weights and the two residual branches */
    cr_expect_eq(drops[0], 0, "dropout nodes at rate 0");
    cr_expect_eq(drops[1], 1 + 3 * 2, "dropout nodes at rate 0.3");
    cr_expect_eq(infer[1], infer[0], "inference with dropout: %g, without: %g", infer[1],
                 infer[0]);
    cr_expect_eq(train[0][0], infer[0], "training without dropout: %g, inference %g",
                 train[0][0], infer[0]);
    cr_expect_eq(train[0][1], train[0][0]);
    cr_expect_neq(train[1][0], infer[0], "dropout changed nothing in training");
    cr_expect_neq(train[1][1], train[1][0], "the same masks twice");
    tp_zoo_gpt_options_t bad = {.dropout = 1.0f};
    tp_model_desc_t md = {in, 2, tp_zoo_gpt_build, s_sgd_opt, &bad};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = B;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_expect_null(m);
    cr_expect(strstr(tp_last_error(), "dropout 1 outside [0, 1)"), "%s", tp_last_error());
    tp_model_destroy(&m);
}

/* ---- the GPT's attention on the packed qkv (issue 45) ---------------------
 * Without dropout every block's attention is one node on the qkv
 * projection's [B,T,3C] as it lies (tp_attention_qkv): no reshape,
 * transpose or slice of the heads around it (they were 8 transposes and
 * 12 slices of the 4-layer GPT's step, ~2.3% of it), its output [B,T,C]
 * read by the output projection. With dropout the training tower keeps
 * the decomposed attention (its weights are dropped) and its copies. */
Test(zoo, gpt_attention_reads_the_qkv_where_it_lies) {
    enum { T = 8, L = 2 };
    tp_input_desc_t in[2];
    cr_assert_eq(tp_zoo_gpt_inputs(T, in), TP_OK);
    for (int k = 0; k < 2; k++) {
        tp_zoo_gpt_options_t o = {.layers = L, .heads = 2, .embed = 16,
                                  .dropout = k ? 0.3f : 0.0f};
        tp_model_desc_t md = {in, 2, tp_zoo_gpt_build, s_sgd_opt, &o};
        tp_model_config_t mc = tp_model_config_default();
        mc.batch = 2;
        mc.threads = 1;
        tp_model_t *m = tp_model_new(&md, &mc);
        cr_assert_not_null(m, "%s", tp_last_error());
        int att = 0, copies = 0;
        for (int i = 0; i < tp_model_node_count(m, 0); i++) {
            const tp_node_t *n = tp_model_node(m, 0, i);
            const tp_op_kind_t kd = tp_node_kind(n);
            copies += kd == TP_OP_TRANSPOSE || kd == TP_OP_SLICE ||
                      (kd == TP_OP_RESHAPE && strstr(tp_node_name(n), "/attn/"));
            if (kd != TP_OP_ATTENTION)
                continue;
            att++;
            cr_expect_eq(tp_node_input_count(n), 1, "'%s': %d inputs", tp_node_name(n),
                         tp_node_input_count(n));
            const tp_shape_t *xs = tp_node_shape(tp_node_input(n, 0));
            const tp_shape_t *ys = tp_node_shape(n);
            cr_expect(xs->ndim == 3 && xs->d[2] == 48 && ys->ndim == 3 && ys->d[2] == 16,
                      "'%s': [B,T,3C] in, [B,T,C] out", tp_node_name(n));
            tp_node_attrs_t a;
            tp_node_attrs(n, &a);
            cr_expect_eq(a.heads, 2);
        }
        if (k == 0) {
            cr_expect_eq(att, L, "%d packed attention nodes", att);
            cr_expect_eq(copies, 0, "%d reshapes, transposes or slices of the heads", copies);
        } else { /* the training tower's decomposed attention */
            cr_expect_eq(att, 0, "%d fused attention nodes with dropout", att);
            cr_expect_gt(copies, 0);
        }
        tp_model_destroy(&m);
    }
}

/* Must hold: a mistyped model's error lists every model tp-train takes,
 * the GANs (tp_zoo_find_gan's) too. */
Test(zoo, an_unknown_model_is_told_the_gans_too) {
    cr_assert_null(tp_zoo_find("dcgna"));
    cr_assert(strstr(tp_last_error(), "'dcgna'") && strstr(tp_last_error(), "dcgan"), "%s",
              tp_last_error());
    cr_assert_null(tp_zoo_find_gan("dcgna"));
    cr_assert_not_null(tp_zoo_find_gan("dcgan"));
}

/* Adam for the DCGAN's shapes test (tp_model_new wants an optimizer). */
static tp_optimizer_t *s_gan_adam(void *user) {
    (void)user;
    return tp_optimizer_adam(2e-4, 0.5, 0.999, 1e-8);
}

/* The DCGAN at channels x size x size: nvars variables, names[i]'s shape
 * want[i] (its dims until a 0). */
static void s_gan_shapes(int channels, int size, const char *const *names,
                         const int64_t (*want)[4], int n, int nvars) {
    const tp_zoo_gan_t *gz = tp_zoo_find_gan("dcgan");
    tp_input_desc_t in[4];
    cr_assert_eq(tp_zoo_gan_inputs_shaped(gz, channels, size, in), TP_OK, "%s",
                 tp_last_error());
    tp_model_desc_t md = {in, gz->ninputs, gz->build, s_gan_adam, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 2;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "dcgan %dx%dx%d: %s", channels, size, size, tp_last_error());
    cr_assert_eq(tp_model_var_count(m), nvars, "dcgan %dx%dx%d: %d variables", channels, size,
                 size, tp_model_var_count(m));
    for (int i = 0; i < n; i++) {
        tp_tensor_t v;
        cr_assert_eq(tp_model_var(m, names[i], &v), TP_OK, "%s: %s", names[i], tp_last_error());
        for (int k = 0; k < 4 && want[i][k]; k++)
            cr_assert_eq(v.shape[k], want[i][k], "%s dim %d: %lld, not %lld", names[i], k,
                         (long long)v.shape[k], (long long)want[i][k]);
    }
    tp_model_destroy(&m);
}

/* Must hold: the DCGAN's shape is its image input's. Grey 28 px is the
 * Fashion-MNIST model as it was (21 variables, fc 128x7x7, two
 * conv-transposes; its inputs gz->inputs); colour 32 px is the usual
 * CIFAR DCGAN (fc 256x4x4 -> 128x8x8 -> 64x16x16 -> 3x32x32, the
 * discriminator mirrored: 3 convolutions, fc from 256x4x4); other sizes
 * are refused naming them. */
Test(zoo, dcgan_takes_its_shape_from_the_image_input) {
    const tp_zoo_gan_t *gz = tp_zoo_find_gan("dcgan");
    cr_assert_not_null(gz);
    tp_input_desc_t in[4];
    cr_assert_eq(tp_zoo_gan_inputs_shaped(gz, 1, 28, in), TP_OK);
    cr_assert(in[0].ndim == 3 && in[0].shape[1] == 28 && in[0].shape[2] == 28 &&
              in[0].dtype == TP_UINT8 && !strcmp(in[0].name, gz->inputs[0].name));
    cr_assert_eq(memcmp(&in[0], &gz->inputs[0], sizeof in[0]), 0, "grey 28 is the zoo's input");
    static const char *const grey[] = {"gen/fc0/W", "gen/deconv1/W", "gen/deconv2/W",
                                       "gen/deconv2/b", "discrim/conv0/W", "discrim/conv1/W",
                                       "discrim/fc/W"};
    static const int64_t gw[][4] = {{100, 6272}, {128, 64, 4, 4}, {64, 1, 4, 4}, {1},
                                    {64, 1, 4, 4}, {128, 64, 4, 4}, {6272, 1}};
    s_gan_shapes(1, 28, grey, gw, 7, 21);
    cr_assert_eq(tp_zoo_gan_inputs_shaped(gz, 3, 32, in), TP_OK);
    cr_assert(in[0].ndim == 4 && in[0].shape[1] == 3 && in[0].shape[2] == 32 &&
              in[0].shape[3] == 32);
    static const char *const colour[] = {"gen/fc0/W", "gen/deconv1/W", "gen/deconv2/W",
                                         "gen/deconv3/W", "gen/deconv3/b", "discrim/conv0/W",
                                         "discrim/conv1/W", "discrim/conv2/W",
                                         "discrim/bn2/gamma", "discrim/fc/W"};
    static const int64_t cw[][4] = {{100, 4096}, {256, 128, 4, 4}, {128, 64, 4, 4},
                                    {64, 3, 4, 4}, {3}, {64, 3, 4, 4}, {128, 64, 4, 4},
                                    {256, 128, 4, 4}, {256}, {4096, 1}};
    /* 21 + a stage each: gen's deconv + bn (5), discrim's conv + bn (5) */
    s_gan_shapes(3, 32, colour, cw, 10, 31);
    cr_assert_eq(tp_zoo_gan_inputs_shaped(gz, 3, 30, in), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "image size 30"), "%s", tp_last_error());
    cr_assert_eq(tp_zoo_gan_inputs_shaped(gz, 2, 32, in), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "2 image channels"), "%s", tp_last_error());
}
