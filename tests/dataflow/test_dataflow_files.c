/* towerpack tests: data on disk: IDX files (plain, gzip, Fashion-MNIST) and
 * LMDB record files, including missing, truncated and corrupt ones (each a
 * clear error, never a crash). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <lmdb.h>
#include <towerpack/towerpack.h>
#include "dir_testutil.h"

static char s_dir[256];

static void setup(void) {
    dt_make(s_dir, sizeof s_dir, "tp_df_files");
}

static void teardown(void) {
    dt_remove(s_dir);
}

static const char *path(const char *name) {
    static char buf[4][320];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", s_dir, name);
    return buf[k];
}

static void write_bytes(const char *p, const void *data, size_t n, int gz) {
    if (gz) {
        gzFile f = gzopen(p, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(gzwrite(f, data, (unsigned)n), (int)n);
        gzclose(f);
    } else {
        FILE *f = fopen(p, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(data, 1, n, f), n);
        fclose(f);
    }
}

/* An IDX file of n images h x w (pixel = i + y + x) and its labels (i%10). */
static void write_idx(const char *img, const char *lab, int n, int h, int w,
                      int gz) {
    size_t isz = 16 + (size_t)n * h * w;
    uint8_t *b = malloc(isz);
    uint8_t hdr[16] = {0, 0, 8, 3, 0, 0, 0, (uint8_t)n, 0, 0, 0, (uint8_t)h,
                       0, 0, 0, (uint8_t)w};
    memcpy(b, hdr, 16);
    for (int i = 0; i < n; i++)
        for (int p = 0; p < h * w; p++)
            b[16 + (size_t)i * h * w + p] = (uint8_t)(i + p / w + p % w);
    write_bytes(img, b, isz, gz);
    free(b);
    uint8_t l[8 + 256] = {0, 0, 8, 1, 0, 0, 0, (uint8_t)n};
    for (int i = 0; i < n; i++)
        l[8 + i] = (uint8_t)(i % 10);
    write_bytes(lab, l, 8 + (size_t)n, gz);
}

TestSuite(dataflow_files, .init = setup, .fini = teardown);

/* ---- IDX ------------------------------------------------------------------- */

Test(dataflow_files, idx_plain_and_gzip) {
    for (int gz = 0; gz < 2; gz++) {
        const char *img = path(gz ? "i.gz" : "i"), *lab = path(gz ? "l.gz" : "l");
        write_idx(img, lab, 12, 4, 5, gz);
        tp_tensor_t t;
        cr_assert_eq(tp_idx_read(img, &t), TP_OK, "%s", tp_last_error());
        cr_assert_eq(t.ndim, 3);
        cr_assert_eq(t.shape[2], 5);
        tp_tensor_fini(&t);
        tp_dataflow_t *df = tp_df_idx(img, lab, 0);
        cr_assert_not_null(df, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
        cr_assert_eq(tp_dataflow_size(df), 12);
        for (int i = 0; i < 12; i++) {
            tp_datapoint_t *dp;
            cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
            tp_tensor_t *im = tp_datapoint_get(dp, 0), *lb = tp_datapoint_get(dp, 1);
            cr_assert_eq(im->dtype, TP_UINT8);
            cr_assert_eq(im->ndim, 2);
            cr_assert_eq(im->shape[0], 4);
            cr_assert_eq(((uint8_t *)im->data)[6], (uint8_t)(i + 1 + 1));
            cr_assert_eq(lb->dtype, TP_INT32);
            cr_assert_eq(lb->ndim, 0);
            cr_assert_eq(*(int32_t *)lb->data, i % 10);
            ((uint8_t *)im->data)[0] = 99; /* datapoints own their bytes */
            tp_datapoint_destroy(&dp);
        }
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_DONE);
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        cr_assert_eq(((uint8_t *)tp_datapoint_get(dp, 0)->data)[0], 0);
        tp_datapoint_destroy(&dp);
        tp_dataflow_destroy(&df);
    }
}

Test(dataflow_files, idx_batch_fast_path_matches_slow_path) {
    write_idx(path("i"), path("l"), 50, 3, 3, 0);
    /* Batch takes next_into from the IDX source; a map in between forces
     * the datapoint path. Both give the same batches. */
    tp_dataflow_t *fast = tp_df_batch(tp_df_idx(path("i"), path("l"), 1), 8, 1);
    tp_dataflow_t *slow = tp_df_idx(path("i"), path("l"), 1);
    cr_assert_eq(tp_dataflow_reset_state(fast, 3, 0), TP_OK);
    cr_assert_eq(tp_dataflow_reset_state(slow, 3, 0), TP_OK);
    slow = tp_df_batch(tp_df_select_component(slow, (int[]){0, 1}, 2), 8, 1);
    cr_assert_eq(tp_dataflow_reset_state(slow, 3, 0), TP_OK);
    for (int p = 0; p < 2; p++) {
        int n = 0;
        for (;;) {
            tp_datapoint_t *a, *b;
            tp_status_t ra = tp_dataflow_next(fast, &a);
            tp_status_t rb = tp_dataflow_next(slow, &b);
            cr_assert_eq(ra, rb);
            if (ra == TP_DONE)
                break;
            cr_assert(tp_datapoint_equal(a, b), "batch %d differs", n);
            n++;
            tp_datapoint_destroy(&a);
            tp_datapoint_destroy(&b);
        }
        cr_assert_eq(n, 7); /* 6 full + remainder of 2 */
    }
    tp_dataflow_destroy(&fast);
    tp_dataflow_destroy(&slow);
}

Test(dataflow_files, idx_bad_files_are_clear_errors) {
    tp_tensor_t t;
    cr_assert_eq(tp_idx_read(path("nope"), &t), TP_ERR_NOT_FOUND);
    cr_assert(strstr(tp_last_error(), "nope"));
    cr_assert_null(tp_df_idx(path("nope"), NULL, 0));

    write_idx(path("i"), path("l"), 12, 4, 5, 0);
    /* truncated payload, plain and gzip */
    FILE *f = fopen(path("i"), "rb");
    uint8_t buf[400];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(path("short"), buf, n - 10, 0);
    cr_assert_eq(tp_idx_read(path("short"), &t), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "truncated") ||
                  strstr(tp_last_error(), "shorter"), "%s", tp_last_error());
    write_bytes(path("short.gz"), buf, n - 10, 1);
    cr_assert_eq(tp_idx_read(path("short.gz"), &t), TP_ERR_FORMAT);
    /* a gzip stream cut in the middle */
    write_idx(path("g.gz"), path("gl.gz"), 12, 4, 5, 1);
    f = fopen(path("g.gz"), "rb");
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(path("cut.gz"), buf, n / 2, 0);
    cr_assert_eq(tp_idx_read(path("cut.gz"), &t), TP_ERR_FORMAT, "%s",
                 tp_last_error());
    /* corrupt compressed bytes */
    buf[n / 2] ^= 0xff;
    buf[n / 2 + 1] ^= 0x55;
    write_bytes(path("bad.gz"), buf, n, 0);
    cr_assert_eq(tp_idx_read(path("bad.gz"), &t), TP_ERR_FORMAT);
    /* bad magic, bad type, header claiming far more than the file */
    uint8_t m1[8] = {1, 2, 8, 1, 0, 0, 0, 1};
    write_bytes(path("m1"), m1, 8, 0);
    cr_assert_eq(tp_idx_read(path("m1"), &t), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "magic"));
    uint8_t m2[9] = {0, 0, 9, 1, 0, 0, 0, 1, 5};
    write_bytes(path("m2"), m2, 9, 0);
    cr_assert_eq(tp_idx_read(path("m2"), &t), TP_ERR_FORMAT);
    uint8_t m3[12] = {0, 0, 8, 2, 0x7f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff};
    write_bytes(path("m3"), m3, 12, 0);
    cr_assert_eq(tp_idx_read(path("m3"), &t), TP_ERR_FORMAT);
    uint8_t m4[4] = {0, 0, 8, 0};
    write_bytes(path("m4"), m4, 4, 0);
    cr_assert_eq(tp_idx_read(path("m4"), &t), TP_ERR_FORMAT);
    write_bytes(path("empty"), m4, 0, 0);
    cr_assert_eq(tp_idx_read(path("empty"), &t), TP_ERR_FORMAT);
    /* trailing garbage */
    uint8_t m5[10] = {0, 0, 8, 1, 0, 0, 0, 1, 5, 6};
    write_bytes(path("m5"), m5, 10, 0);
    cr_assert_eq(tp_idx_read(path("m5"), &t), TP_ERR_FORMAT);
    /* labels that do not match the images */
    write_idx(path("i2"), path("l2"), 11, 4, 5, 0);
    cr_assert_null(tp_df_idx(path("i"), path("l2"), 0));
    cr_assert(strstr(tp_last_error(), "labels"), "%s", tp_last_error());
    /* random garbage of every length up to 64 never crashes */
    uint8_t g[64];
    for (int len = 0; len <= 64; len++) {
        for (int i = 0; i < len; i++)
            g[i] = (uint8_t)(i * 37 + len);
        if (len > 3)
            g[0] = g[1] = 0;
        write_bytes(path("garbage"), g, (size_t)len, 0);
        if (tp_idx_read(path("garbage"), &t) == TP_OK)
            tp_tensor_fini(&t);
    }
}

Test(dataflow_files, fashion_mnist_train_and_test) {
    struct stat st;
    char p[512];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz",
             tp_df_fashion_mnist_dir());
    if (stat(p, &st) != 0)
        cr_skip_test("Fashion-MNIST not installed (%s)", p);
    tp_dataflow_t *df = tp_df_batch(tp_df_fashion_mnist("train", 1), 128, 0);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), 60000 / 128);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    tp_tensor_t *im = tp_datapoint_get(dp, 0), *lb = tp_datapoint_get(dp, 1);
    cr_assert_eq(im->dtype, TP_UINT8);
    cr_assert_eq(im->ndim, 3);
    cr_assert_eq(im->shape[0], 128);
    cr_assert_eq(im->shape[1], 28);
    cr_assert_eq(im->shape[2], 28);
    cr_assert_eq(lb->dtype, TP_INT32);
    cr_assert_eq(lb->ndim, 1);
    int hist[10] = {0};
    for (int i = 0; i < 128; i++) {
        int32_t l = ((int32_t *)lb->data)[i];
        cr_assert(l >= 0 && l < 10);
        hist[l]++;
    }
    int classes = 0;
    for (int i = 0; i < 10; i++)
        classes += hist[i] > 0;
    cr_assert_geq(classes, 8, "a shuffled batch holds most classes");
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    df = tp_df_fashion_mnist("test", 0);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), 10000);
    int n = 0;
    while (tp_dataflow_next(df, &dp) == TP_OK) {
        n++;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(n, 10000);
    tp_dataflow_destroy(&df);
    cr_assert_null(tp_df_fashion_mnist("validation", 0));
    cr_assert(strstr(tp_last_error(), "split"));
}

Test(dataflow_files, fashion_mnist_missing_dir) {
    setenv("TP_FASHION_MNIST_DIR", path("none"), 1);
    cr_assert_null(tp_df_fashion_mnist("train", 1));
    cr_assert(strstr(tp_last_error(), "dataset-fashion-mnist"), "%s",
              tp_last_error());
    unsetenv("TP_FASHION_MNIST_DIR");
}

/* ---- LMDB records -------------------------------------------------------------- */

static tp_dataflow_t *mixed(int n) {
    /* uint8 [30,30] (lz4 shrinks it), int32 scalar, float32 [3] */
    tp_datapoint_t **dps = calloc((size_t)n, sizeof *dps);
    for (int i = 0; i < n; i++) {
        dps[i] = tp_datapoint_new(3);
        int64_t s1[2] = {30, 30}, s3[1] = {3};
        tp_tensor_init_zero(tp_datapoint_get(dps[i], 0), TP_UINT8, 2, s1);
        ((uint8_t *)tp_datapoint_get(dps[i], 0)->data)[i % 900] = (uint8_t)i;
        tp_tensor_init(tp_datapoint_get(dps[i], 1), TP_INT32, 0, NULL);
        *(int32_t *)tp_datapoint_get(dps[i], 1)->data = i;
        tp_tensor_init(tp_datapoint_get(dps[i], 2), TP_FLOAT32, 1, s3);
        for (int k = 0; k < 3; k++)
            ((float *)tp_datapoint_get(dps[i], 2)->data)[k] = (float)i / (k + 1);
    }
    tp_dataflow_t *df = tp_df_from_list(dps, (size_t)n, 0);
    free(dps);
    return df;
}

static int lab(const tp_datapoint_t *dp) {
    return *(const int32_t *)tp_datapoint_cget(dp, 1)->data;
}

Test(dataflow_files, lmdb_round_trip_sequential_and_shuffled) {
    for (int variant = 0; variant < 3; variant++) {
        tp_records_opts_t opts;
        tp_records_opts_init(&opts);
        opts.commit_every = 7;
        opts.lz4 = variant != 1;
        opts.checksum = variant == 2;
        opts.chunk = variant == 0 ? 64 : variant == 1 ? 1 : 7;
        tp_dataflow_t *src = mixed(25);
        cr_assert_eq(tp_dataflow_reset_state(src, 1, 0), TP_OK);
        int64_t count;
        cr_assert_eq(tp_records_save(src, path("r.lmdb"), &opts, &count),
                     TP_OK, "%s", tp_last_error());
        cr_assert_eq(count, 25);
        tp_dataflow_t *ref = mixed(25);
        tp_dataflow_t *df = tp_df_lmdb(path("r.lmdb"), 0);
        cr_assert_not_null(df, "%s", tp_last_error());
        cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
        cr_assert_eq(tp_dataflow_reset_state(ref, 1, 0), TP_OK);
        cr_assert_eq(tp_dataflow_size(df), 25);
        for (int p = 0; p < 2; p++) {
            for (int i = 0; i < 25; i++) {
                tp_datapoint_t *a, *b;
                cr_assert_eq(tp_dataflow_next(df, &a), TP_OK, "%s",
                             tp_last_error());
                cr_assert_eq(tp_dataflow_next(ref, &b), TP_OK);
                cr_assert(tp_datapoint_equal(a, b), "record %d", i);
                tp_datapoint_destroy(&a);
                tp_datapoint_destroy(&b);
            }
            tp_datapoint_t *x;
            cr_assert_eq(tp_dataflow_next(df, &x), TP_DONE);
            cr_assert_eq(tp_dataflow_next(ref, &x), TP_DONE);
        }
        tp_dataflow_destroy(&df);
        tp_dataflow_destroy(&ref);
        tp_dataflow_destroy(&src);

        /* batched (next_into) equals batched datapoints */
        tp_dataflow_t *fast = tp_df_batch(tp_df_lmdb(path("r.lmdb"), 0), 4, 1);
        tp_dataflow_t *slow = tp_df_batch(mixed(25), 4, 1);
        cr_assert_eq(tp_dataflow_reset_state(fast, 1, 0), TP_OK);
        cr_assert_eq(tp_dataflow_reset_state(slow, 1, 0), TP_OK);
        for (int b = 0; b < 7; b++) {
            tp_datapoint_t *a, *c;
            cr_assert_eq(tp_dataflow_next(fast, &a), TP_OK, "%s",
                         tp_last_error());
            cr_assert_eq(tp_dataflow_next(slow, &c), TP_OK);
            cr_assert(tp_datapoint_equal(a, c), "batch %d", b);
            tp_datapoint_destroy(&a);
            tp_datapoint_destroy(&c);
        }
        tp_dataflow_destroy(&fast);
        tp_dataflow_destroy(&slow);
    }

    tp_dataflow_t *df = tp_df_lmdb(path("r.lmdb"), 1);
    cr_assert_eq(tp_dataflow_reset_state(df, 5, 0), TP_OK);
    int seen[25] = {0}, first[25], second[25];
    for (int p = 0; p < 2; p++) {
        tp_datapoint_t *a;
        for (int i = 0; i < 25; i++) {
            cr_assert_eq(tp_dataflow_next(df, &a), TP_OK, "%s",
                         tp_last_error());
            (p ? second : first)[i] = lab(a);
            if (!p)
                seen[lab(a)]++;
            tp_datapoint_destroy(&a);
        }
        cr_assert_eq(tp_dataflow_next(df, &a), TP_DONE);
    }
    for (int i = 0; i < 25; i++)
        cr_assert_eq(seen[i], 1);
    cr_assert(memcmp(first, second, sizeof first) != 0);
    tp_dataflow_destroy(&df);
}

Test(dataflow_files, lmdb_bad_files_are_clear_errors) {
    cr_assert_null(tp_df_lmdb(path("missing.lmdb"), 0));
    cr_assert(strstr(tp_last_error(), "missing.lmdb"));

    /* garbage of several sizes */
    uint8_t g[20000];
    for (size_t i = 0; i < sizeof g; i++)
        g[i] = (uint8_t)(i * 131 + 7);
    size_t sizes[] = {0, 10, 4096, 8192, 20000};
    for (size_t k = 0; k < 5; k++) {
        write_bytes(path("g.lmdb"), g, sizes[k], 0);
        cr_assert_null(tp_df_lmdb(path("g.lmdb"), 0), "size %zu", sizes[k]);
    }

    /* a valid file cut short */
    tp_dataflow_t *src = mixed(300);
    tp_dataflow_reset_state(src, 1, 0);
    cr_assert_eq(tp_records_save(src, path("ok.lmdb"), NULL, NULL), TP_OK);
    tp_dataflow_destroy(&src);
    struct stat st;
    stat(path("ok.lmdb"), &st);
    cr_assert_eq(truncate(path("ok.lmdb"), st.st_size / 2), 0);
    cr_assert_null(tp_df_lmdb(path("ok.lmdb"), 0));
    cr_assert(strstr(tp_last_error(), "truncated") ||
                  strstr(tp_last_error(), "ok.lmdb"), "%s", tp_last_error());

    /* LMDB files made by hand: no format record, a wrong version, a bad
     * count, a corrupt value, a missing record */
    struct {
        const char *format, *count, *value;
        int vlen;
        tp_status_t open_rc, next_rc;
        const char *msg;
    } cases[] = {
        {NULL, "1", "x", 1, TP_ERR_FORMAT, 0, "__format__"},
        {"towerpack-records 99", "1", "x", 1, TP_ERR_FORMAT, 0, "version"},
        {"something else", "1", "x", 1, TP_ERR_FORMAT, 0, "format"},
        {"towerpack-records 1", "-3", "x", 1, TP_ERR_FORMAT, 0, "count"},
        {"towerpack-records 1", "1", "garbage!", 1, TP_OK, TP_ERR_FORMAT,
         "0000000000"},
        {"towerpack-records 1", "2", NULL, 1, TP_OK, TP_ERR_FORMAT, "missing"},
        /* chunked files: a chunk whose header lies */
        {"towerpack-records 1", "4", "\x04\0\0\0", 4, TP_OK, TP_ERR_FORMAT,
         "chunk"},
        {"towerpack-records 1", "4", "\x03\0\0\0\x01\0\0\0\x02\0\0\0"
         "\x09\0\0\0ab", 18, TP_OK, TP_ERR_FORMAT, "chunk"},
        {"towerpack-records 1", "99", "x", 1, TP_ERR_FORMAT, 0, "values"},
    };
    tp_datapoint_t *one = tp_datapoint_new(1);
    tp_tensor_init_zero(tp_datapoint_get(one, 0), TP_INT32, 0, NULL);
    void *good;
    size_t good_n;
    cr_assert_eq(tp_records_encode(one, NULL, &good, &good_n), TP_OK);
    tp_datapoint_destroy(&one);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const char *p = path("hand.lmdb");
        unlink(p);
        MDB_env *env;
        MDB_txn *txn;
        MDB_dbi dbi;
        cr_assert_eq(mdb_env_create(&env), 0);
        cr_assert_eq(mdb_env_open(env, p, MDB_NOSUBDIR | MDB_NOLOCK, 0644), 0);
        cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
        cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
        const char *keys[3] = {"__format__", "__count__", "0000000000"};
        const char *vals[3] = {cases[k].format, cases[k].count,
                               cases[k].value};
        for (int i = 0; i < 3; i++) {
            MDB_val kv = {strlen(keys[i]), (void *)keys[i]};
            size_t vl = vals[i] ? strlen(vals[i]) : good_n;
            if (i == 2 && vals[i] && cases[k].vlen > 1)
                vl = (size_t)cases[k].vlen;
            MDB_val vv = {vl, vals[i] ? (void *)vals[i] : good};
            if (i == 0 && !vals[i])
                continue;
            cr_assert_eq(mdb_put(txn, dbi, &kv, &vv, 0), 0);
        }
        if (k >= 6) {
            MDB_val kv = {9, "__chunk__"}, vv = {1, "4"};
            cr_assert_eq(mdb_put(txn, dbi, &kv, &vv, 0), 0);
        }
        cr_assert_eq(mdb_txn_commit(txn), 0);
        mdb_env_close(env);
        tp_dataflow_t *df = tp_df_lmdb(p, 0);
        if (cases[k].open_rc != TP_OK) {
            cr_assert_null(df, "case %zu", k);
        } else {
            cr_assert_not_null(df, "case %zu: %s", k, tp_last_error());
            cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
            tp_datapoint_t *dp = NULL;
            tp_status_t rc = tp_dataflow_next(df, &dp);
            if (rc == TP_OK) { /* the missing record is the second */
                tp_datapoint_destroy(&dp);
                rc = tp_dataflow_next(df, &dp);
            }
            cr_assert_eq(rc, cases[k].next_rc, "case %zu", k);
            tp_dataflow_destroy(&df);
        }
        cr_assert(strstr(tp_last_error(), cases[k].msg), "case %zu: %s", k,
                  tp_last_error());
    }
    free(good);
}

Test(dataflow_files, records_decode_rejects_garbage) {
    tp_datapoint_t *dp = tp_datapoint_new(2);
    int64_t s[2] = {40, 40};
    tp_tensor_init_zero(tp_datapoint_get(dp, 0), TP_UINT8, 2, s);
    tp_tensor_init(tp_datapoint_get(dp, 1), TP_INT32, 0, NULL);
    *(int32_t *)tp_datapoint_get(dp, 1)->data = 5;
    tp_records_opts_t opts;
    tp_records_opts_init(&opts);
    opts.checksum = 1;
    void *val;
    size_t n;
    cr_assert_eq(tp_records_encode(dp, &opts, &val, &n), TP_OK);
    cr_assert_lt(n, 1600, "lz4 shrank the zero image");
    tp_datapoint_t *out;
    cr_assert_eq(tp_records_decode(val, n, &out), TP_OK);
    cr_assert(tp_datapoint_equal(dp, out));
    tp_datapoint_destroy(&out);
    /* every truncation and every single-byte corruption: an error or a
     * datapoint, never a crash (ASan watches the reads) */
    uint8_t *copy = malloc(n);
    for (size_t len = 0; len < n; len++) {
        cr_assert_eq(tp_records_decode(val, len, &out), TP_ERR_FORMAT);
        cr_assert_null(out);
    }
    int rejected = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(copy, val, n);
        copy[i] ^= 0xa5;
        tp_status_t rc = tp_records_decode(copy, n, &out);
        if (rc == TP_OK)
            tp_datapoint_destroy(&out);
        else
            rejected++;
    }
    cr_assert_eq((size_t)rejected, n, "the checksum catches every flip");
    cr_assert_eq(tp_records_decode(NULL, 0, &out), TP_ERR_FORMAT);
    free(copy);
    free(val);
    tp_datapoint_destroy(&dp);
}

Test(dataflow_files, idx_decode_from_memory) {
    uint8_t ok[12] = {0, 0, 0x0C, 1, 0, 0, 0, 1, 0, 0, 1, 2};
    tp_tensor_t t;
    cr_assert_eq(tp_idx_decode(ok, 12, &t), TP_OK);
    cr_assert_eq(t.dtype, TP_INT32);
    cr_assert_eq(*(int32_t *)t.data, 258, "big-endian");
    tp_tensor_fini(&t);
    for (size_t len = 0; len < 12; len++)
        cr_assert_eq(tp_idx_decode(ok, len, &t), TP_ERR_FORMAT, "%zu", len);
    /* every byte flip: an error or a tensor, never a crash */
    for (size_t i = 0; i < 12; i++)
        for (int bit = 0; bit < 8; bit++) {
            uint8_t c[12];
            memcpy(c, ok, 12);
            c[i] ^= (uint8_t)(1 << bit);
            if (tp_idx_decode(c, 12, &t) == TP_OK)
                tp_tensor_fini(&t);
        }
    cr_assert_eq(tp_idx_decode(NULL, 0, &t), TP_ERR_FORMAT);
}
