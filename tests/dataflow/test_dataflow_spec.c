/* towerpack tests: pipeline spec strings (built-in sources and stages, errors
 * that point at the bad token, registration of new sources and stages) and
 * the image augmentors. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <towerpack/towerpack.h>

static tp_dataflow_t *parse_ok(const char *spec) {
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s: %s", spec,
                 tp_last_error());
    cr_assert_not_null(df);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    return df;
}

/* Parse must fail; the message must contain `msg` and carets under column
 * `col` (1-based) of the quoted spec. */
static void parse_bad(const char *spec, const char *msg, int col) {
    tp_dataflow_t *df = (tp_dataflow_t *)0x1;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_ERR_INVALID, "%s", spec);
    cr_assert_null(df);
    const char *e = tp_last_error();
    cr_assert(strstr(e, msg), "'%s': message '%s' lacks '%s'", spec, e, msg);
    const char *caret = strchr(e, '^');
    cr_assert_not_null(caret, "%s", e);
    const char *line = caret;
    while (line > e && line[-1] != '\n')
        line--;
    /* both the quoted spec and the caret line are indented by 2 */
    cr_assert_eq((int)(caret - line) - 2 + 1, col, "'%s': caret at %d: %s",
                 spec, (int)(caret - line) - 1, e);
}

Test(dataflow_spec, fake_and_batch) {
    tp_dataflow_t *df = parse_ok("fake:size=10 | batch 4");
    cr_assert_eq(tp_dataflow_size(df), 2);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(tp_datapoint_get(dp, 0)->dtype, TP_UINT8);
    cr_assert_eq(tp_datapoint_get(dp, 0)->shape[2], 28);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    df = parse_ok("  fake:shape=3x4:float32, shape=scalar:int32, size=5 |"
                  "batch 2 remainder|repeat 2");
    cr_assert_eq(tp_dataflow_size(df), 6);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    tp_tensor_t *t = tp_datapoint_get(dp, 0);
    cr_assert_eq(t->dtype, TP_FLOAT32);
    cr_assert_eq(t->ndim, 3);
    cr_assert_eq(t->shape[2], 4);
    cr_assert_eq(tp_datapoint_get(dp, 1)->ndim, 1);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    df = parse_ok("fake:size=30,const | shuffle 8 reuse=2 | cache | "
                  "fixed-size 7 | select 1,0 | print 0");
    cr_assert_eq(tp_dataflow_size(df), 7);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(tp_datapoint_get(dp, 0)->dtype, TP_INT32);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    df = parse_ok("fake:size=3 | repeat");
    cr_assert_eq(tp_dataflow_size(df), -1);
    tp_dataflow_destroy(&df);
}

Test(dataflow_spec, fashion_mnist_issue_example) {
    struct stat st;
    char p[512];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz",
             tp_df_fashion_mnist_dir());
    if (stat(p, &st) != 0)
        cr_skip_test("Fashion-MNIST not installed");
    tp_dataflow_t *df = parse_ok("fashion-mnist:train | shuffle 10000 | "
                                 "augment crop=28,pad=2,flip | batch 128");
    cr_assert_eq(tp_dataflow_size(df), 468);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    tp_tensor_t *im = tp_datapoint_get(dp, 0);
    cr_assert_eq(im->dtype, TP_FLOAT32);
    cr_assert_eq(im->shape[0], 128);
    cr_assert_eq(im->shape[1], 28);
    float lo = 1e9f, hi = -1e9f;
    for (size_t i = 0; i < tp_tensor_numel(im); i++) {
        float v = ((float *)im->data)[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    cr_assert(lo >= 0 && hi <= 1 && hi > 0.5f, "scaled to [0,1]: %g..%g", lo,
              hi);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    df = parse_ok("idx:/usr/share/datasets/fashion-mnist/t10k-images-idx3-"
                  "ubyte.gz,/usr/share/datasets/fashion-mnist/t10k-labels-idx1"
                  "-ubyte.gz,shuffle=0 | batch 100");
    cr_assert_eq(tp_dataflow_size(df), 100);
    tp_dataflow_destroy(&df);
}

Test(dataflow_spec, bad_specs_point_at_the_token) {
    parse_bad("", "expected a source", 1);
    parse_bad("fake:size=10 | bogus 3", "unknown stage 'bogus'", 16);
    parse_bad("fake:size=10 | batch x", "batch", 16);
    parse_bad("fake:size=10 | batch 0", "batch", 16);
    parse_bad("nope:1 | batch 2", "unknown source 'nope'", 1);
    parse_bad("fake:size=10 || batch 2", "empty stage", 15);
    parse_bad("fake:size=10 | batch 4 |", "empty stage", 25);
    parse_bad("fake:size=-1", "size", 1);
    parse_bad("fake:shape=3x4:float99", "float99", 1);
    parse_bad("fake:size=4 | shuffle 10 sideways=1", "sideways", 15);
    parse_bad("fake:size=4 | augment crop=28,spin=3", "spin", 15);
    parse_bad("fake:size=4 | map-threads 2 batch 3", "not a map stage", 15);
    parse_bad("fake:size=4 | map-threads x augment", "threads", 15);
    parse_bad("idx:/nonexistent/images.gz", "/nonexistent/images.gz", 1);
    parse_bad("lmdb:/nonexistent.lmdb | batch 2", "/nonexistent.lmdb", 1);
    parse_bad("fashion-mnist:validation", "split", 1);
    parse_bad("fake:size=4 | batch$ 2", "unexpected '$'", 20);
    tp_dataflow_t *df;
    cr_assert_eq(tp_spec_parse(NULL, &df), TP_ERR_INVALID);
}

/* ---- registration --------------------------------------------------------- */

static tp_datapoint_t *mk(int v) {
    tp_datapoint_t *dp = tp_datapoint_new(1);
    tp_tensor_init(tp_datapoint_get(dp, 0), TP_INT32, 0, NULL);
    *(int32_t *)tp_datapoint_get(dp, 0)->data = v;
    return dp;
}

static tp_status_t s_ints_source(const char *args, void *user,
                                 tp_dataflow_t **out) {
    int64_t n;
    TP_TRY(tp_spec_int(args, 0, 1000, "ints: count", &n));
    tp_datapoint_t *dps[1000];
    for (int i = 0; i < n; i++)
        dps[i] = mk(i * *(int *)user);
    *out = tp_df_from_list(dps, (size_t)n, 0);
    return *out ? TP_OK : TP_ERR_INVALID;
}

static tp_status_t s_add(tp_tensor_t *t, tp_rng_t *rng, void *user) {
    *(int32_t *)t->data += (int)(intptr_t)user;
    return TP_OK;
}

static tp_status_t s_add_stage(tp_dataflow_t *inner, const char *args,
                               void *user, tp_dataflow_t **out) {
    int64_t k;
    tp_status_t rc = tp_spec_int(args, -100, 100, "add: amount", &k);
    if (rc != TP_OK) {
        tp_dataflow_destroy(&inner);
        return rc;
    }
    *out = tp_df_map_component(inner, s_add, (void *)(intptr_t)k, NULL, 0);
    return *out ? TP_OK : TP_ERR_INVALID;
}

/* Found by fuzz/fuzz_spec.c: the size of a chain of stages that multiply
 * it (repeat, shuffle with reuse) overflowed int64_t (undefined behaviour);
 * a size that does not fit is now -1, "unknown". */
static int64_t spec_size(const char *spec) {
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s: %s", spec,
                 tp_last_error());
    int64_t n = tp_dataflow_size(df);
    tp_dataflow_destroy(&df);
    return n;
}

Test(dataflow_spec, sizes_that_overflow_are_unknown) {
    const char *half = "fake:size=4611686018427387903";  /* INT64_MAX / 2 */
    char spec[256];
    snprintf(spec, sizeof spec, "%s | repeat 2", half);
    cr_expect_eq(spec_size(spec), INT64_MAX - 1);
    snprintf(spec, sizeof spec, "%s | repeat 3", half);
    cr_expect_eq(spec_size(spec), -1);
    snprintf(spec, sizeof spec, "%s | repeat 2 | shuffle 10 reuse=2", half);
    cr_expect_eq(spec_size(spec), -1);
    /* batch with remainder rounds up without adding first */
    snprintf(spec, sizeof spec, "%s | repeat 2 | batch 1000 remainder", half);
    cr_expect_eq(spec_size(spec), (INT64_MAX - 1) / 1000 + 1);
    snprintf(spec, sizeof spec, "%s | repeat 2 | batch 1000", half);
    cr_expect_eq(spec_size(spec), (INT64_MAX - 1) / 1000);
    /* like the fuzzer's input: 60 nested shuffles with reuse=2 (2^60) */
    char chain[2048] = "fake:size=1000";
    for (int i = 0; i < 60; i++)
        strcat(chain, " | shuffle 100 reuse=2");
    cr_expect_eq(spec_size(chain), -1);
    cr_expect_eq(spec_size("fake:size=10 | shuffle 4 reuse=3 | repeat 2"), 60);
    cr_expect_eq(spec_size("fake:size=10 | batch 3 remainder"), 4);
    cr_expect_eq(spec_size("fake:size=10 | batch 3"), 3);
}

Test(dataflow_spec, registered_sources_and_stages) {
    static int mult = 1;
    cr_assert_eq(tp_spec_register_source("ints", s_ints_source, &mult), TP_OK);
    cr_assert_eq(tp_spec_register_stage("add", s_add_stage, NULL), TP_OK);
    cr_assert_eq(tp_spec_register_stage("bad name", s_add_stage, NULL),
                 TP_ERR_INVALID);
    tp_dataflow_t *df = parse_ok("ints:5 | add 10 | batch 5");
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    int32_t *v = tp_datapoint_get(dp, 0)->data;
    cr_assert_eq(v[0], 10);
    cr_assert_eq(v[4], 14);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
    parse_bad("ints:5 | add 1000", "add: amount", 10);

    static int mult3 = 3;  /* registering again replaces */
    cr_assert_eq(tp_spec_register_source("ints", s_ints_source, &mult3), TP_OK);
    df = parse_ok("ints:3 | batch 3");
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(((int32_t *)tp_datapoint_get(dp, 0)->data)[2], 6);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
}

/* ---- augmentors ------------------------------------------------------------ */

static tp_tensor_t image(int h, int w, int c) {
    tp_tensor_t t;
    int64_t shape[3] = {h, w, c};
    cr_assert_eq(tp_tensor_init(&t, TP_UINT8, c ? 3 : 2, shape), TP_OK);
    for (size_t i = 0; i < t.nbytes; i++)
        ((uint8_t *)t.data)[i] = (uint8_t)(i + 1);
    return t;
}

Test(dataflow_spec, augment_crop_flip_normalize_cast) {
    tp_rng_t rng;
    tp_rng_init(&rng, 1, 0);
    /* crop 2x2 of a 3x3 image without padding: one of the 4 sub-images */
    for (int trial = 0; trial < 20; trial++) {
        tp_augment_t *a = tp_augment_new();
        cr_assert_eq(tp_augment_add_crop(a, 2, 2, 0), TP_OK);
        tp_tensor_t t = image(3, 3, 0);
        cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
        cr_assert_eq(t.shape[0], 2);
        const uint8_t *p = t.data;
        int y = (p[0] - 1) / 3, x = (p[0] - 1) % 3;
        cr_assert(y <= 1 && x <= 1);
        cr_assert_eq(p[1], p[0] + 1);
        cr_assert_eq(p[2], p[0] + 3);
        cr_assert_eq(p[3], p[0] + 4);
        tp_tensor_fini(&t);
        tp_augment_destroy(&a);
    }
    /* padding brings in zeros; over many draws every offset appears */
    int zero_rows = 0;
    for (int trial = 0; trial < 50; trial++) {
        tp_augment_t *a = tp_augment_new();
        cr_assert_eq(tp_augment_add_crop(a, 4, 4, 2), TP_OK);
        tp_tensor_t t = image(4, 4, 3);
        cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
        cr_assert_eq(t.ndim, 3);
        cr_assert_eq(t.shape[2], 3);
        const uint8_t *p = t.data;
        int allzero = 1;
        for (int i = 0; i < 12; i++)
            allzero &= p[i] == 0;
        zero_rows += allzero;
        tp_tensor_fini(&t);
        tp_augment_destroy(&a);
    }
    cr_assert(zero_rows > 5 && zero_rows < 45, "%d", zero_rows);

    /* flip with probability 1 reverses every row, pixel by pixel */
    tp_augment_t *a = tp_augment_new();
    cr_assert_eq(tp_augment_add_flip(a, 1.0), TP_OK);
    tp_tensor_t t = image(2, 3, 2);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    const uint8_t *p = t.data;
    uint8_t want[12] = {5, 6, 3, 4, 1, 2, 11, 12, 9, 10, 7, 8};
    cr_assert_arr_eq(p, want, 12);
    tp_tensor_fini(&t);
    tp_augment_destroy(&a);

    /* per-channel normalisation to float32 */
    a = tp_augment_new();
    float mean[2] = {1, 2}, std[2] = {2, 4};
    cr_assert_eq(tp_augment_add_normalize(a, 2, mean, std), TP_OK);
    t = image(1, 2, 2);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    cr_assert_eq(t.dtype, TP_FLOAT32);
    const float *f = t.data;
    cr_assert_float_eq(f[0], 0.0f, 1e-6);   /* (1-1)/2 */
    cr_assert_float_eq(f[1], 0.0f, 1e-6);   /* (2-2)/4 */
    cr_assert_float_eq(f[3], 0.5f, 1e-6);   /* (4-2)/4 */
    tp_tensor_fini(&t);
    t = image(2, 2, 3);   /* 3 channels, 2 statistics */
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_ERR_SHAPE);
    tp_tensor_fini(&t);
    tp_augment_destroy(&a);

    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_cast(a, TP_FLOAT32), TP_OK);
    t = image(2, 2, 0);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_OK);
    cr_assert_float_eq(((float *)t.data)[3], 4.0f, 0);
    tp_tensor_fini(&t);
    tp_augment_destroy(&a);

    /* bad parameters and bad images */
    a = tp_augment_new();
    cr_assert_eq(tp_augment_add_crop(a, 0, 2, 0), TP_ERR_INVALID);
    cr_assert_eq(tp_augment_add_flip(a, 1.5), TP_ERR_INVALID);
    float zero = 0;
    cr_assert_eq(tp_augment_add_normalize(a, 1, &zero, &zero), TP_ERR_INVALID);
    cr_assert_eq(tp_augment_add_crop(a, 10, 10, 1), TP_OK);
    t = image(4, 4, 0);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_ERR_SHAPE);
    cr_assert(strstr(tp_last_error(), "10x10"), "%s", tp_last_error());
    tp_tensor_fini(&t);
    int64_t s1[1] = {5};
    tp_tensor_init_zero(&t, TP_UINT8, 1, s1);
    cr_assert_eq(tp_augment_apply(a, &t, &rng), TP_ERR_SHAPE);
    tp_tensor_fini(&t);
    tp_augment_destroy(&a);
}

Test(dataflow_spec, fused_augment_equals_the_separate_steps) {
    float mean[3] = {10, 20, 30}, std[3] = {2, 3, 4};
    for (int ch = 0; ch <= 3; ch += 3) {
        tp_augment_t *fused = tp_augment_new(), *steps = tp_augment_new();
        cr_assert_eq(tp_augment_add_crop(fused, 5, 6, 2), TP_OK);
        cr_assert_eq(tp_augment_add_flip(fused, 0.5), TP_OK);
        cr_assert_eq(tp_augment_add_normalize(fused, ch ? 3 : 1, mean, std),
                     TP_OK);
        /* a cast in between keeps the chain off the fused path */
        cr_assert_eq(tp_augment_add_crop(steps, 5, 6, 2), TP_OK);
        cr_assert_eq(tp_augment_add_flip(steps, 0.5), TP_OK);
        cr_assert_eq(tp_augment_add_cast(steps, TP_FLOAT32), TP_OK);
        cr_assert_eq(tp_augment_add_normalize(steps, ch ? 3 : 1, mean, std),
                     TP_OK);
        tp_rng_t r1, r2;
        tp_rng_init(&r1, 3, 0);
        tp_rng_init(&r2, 3, 0);
        for (int trial = 0; trial < 40; trial++) {
            tp_tensor_t a = image(6, 7, ch), b = image(6, 7, ch);
            cr_assert_eq(tp_augment_apply(fused, &a, &r1), TP_OK);
            cr_assert_eq(tp_augment_apply(steps, &b, &r2), TP_OK);
            cr_assert(tp_tensor_equal(&a, &b), "trial %d, %d channels", trial,
                      ch);
            tp_tensor_fini(&a);
            tp_tensor_fini(&b);
        }
        tp_augment_destroy(&fused);
        tp_augment_destroy(&steps);
    }
}
