/* towerpack tests: the model zoo's data sources (tp_zoo_source), the names
 * tp-train and tp-predict both take: each becomes a spec that parses and
 * yields what the zoo's models take; anything else names the valid forms. */
#include <criterion/criterion.h>
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
