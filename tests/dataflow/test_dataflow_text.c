/* towerpack tests: the text source (tp_df_text, `text:` specs): windows
 * and their shifted targets, the train / validation split, seeded random
 * offsets, the batching fast path, sizes, huge (sparse) files, and every
 * bad input as an error naming the file. The check against numpy is in
 * test_proc_text.c (it runs python3). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <towerpack/towerpack.h>
#include <towerpack/tokenizer.h>
#include "dataflow/bpe_testutil.h"
#include "dir_testutil.h"

static char s_dir[256];

static void setup(void) { dt_make(s_dir, sizeof s_dir, "tp_df_text"); }

static void teardown(void) { dt_remove(s_dir); }

TestSuite(dataflow_text, .init = setup, .fini = teardown, .timeout = 60);

static const char *path(const char *name) { return dt_path(s_dir, name); }

static void write_file(const char *p, const void *data, size_t n) {
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* n bytes: byte i is (i * 7 + 3) % 256, so a window's values give away
 * where it starts. */
static const char *write_pattern(const char *name, size_t n) {
    uint8_t *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 7 + 3);
    const char *p = path(name);
    write_file(p, b, n);
    free(b);
    return p;
}

static tp_dataflow_t *text(const char *p, int64_t T, tp_text_split_t split,
                           int random) {
    tp_df_text_opts_t o;
    tp_df_text_opts_init(&o);
    o.context = T;
    o.split = split;
    o.random = random;
    return tp_df_text(p, &o);
}

/* The offset of a window of the pattern file, from its first byte and
 * checking every byte of input and target against it. */
static int64_t pattern_offset(const tp_datapoint_t *dp, int64_t T, int64_t n) {
    const tp_tensor_t *x = tp_datapoint_cget(dp, 0), *y = tp_datapoint_cget(dp, 1);
    cr_assert_eq(x->dtype, TP_INT32);
    cr_assert_eq(y->dtype, TP_INT32);
    cr_assert_eq(x->ndim, 1);
    cr_assert_eq(x->shape[0], T);
    cr_assert_eq(y->shape[0], T);
    const int32_t *xs = x->data, *ys = y->data;
    /* 7 is invertible mod 256 (7 * 183 = 1281 = 5 * 256 + 1) */
    int64_t off = (int64_t)(((xs[0] - 3) * 183) & 255);
    for (int64_t base = off; base < n; base += 256) {
        int ok = 1;
        for (int64_t t = 0; t < T && ok; t++)
            ok = xs[t] == (int32_t)(uint8_t)((base + t) * 7 + 3) &&
                 ys[t] == (int32_t)(uint8_t)((base + t + 1) * 7 + 3);
        if (ok)
            return base;  /* the first candidate (a 256-periodic file) */
    }
    cr_assert_fail("a window that is no window of the file");
    return -1;
}

Test(dataflow_text, consecutive_windows_are_the_bytes_and_the_targets_shifted_by_one) {
    const char *p = write_pattern("a.txt", 1000);
    tp_dataflow_t *df = text(p, 16, TP_TEXT_ALL, 0);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), (1000 - 1) / 16);
    for (int pass = 0; pass < 2; pass++) {
        tp_datapoint_t *dp;
        int64_t k = 0;
        while (tp_dataflow_next(df, &dp) == TP_OK) {
            const int32_t *x = tp_datapoint_get(dp, 0)->data;
            const int32_t *y = tp_datapoint_get(dp, 1)->data;
            for (int64_t t = 0; t < 16; t++) {
                cr_assert_eq(x[t], (uint8_t)((k * 16 + t) * 7 + 3));
                cr_assert_eq(y[t], (uint8_t)((k * 16 + t + 1) * 7 + 3));
            }
            tp_datapoint_destroy(&dp);
            k++;
        }
        cr_assert_eq(k, 62, "every pass gives the same 62 windows (pass %d)", pass);
    }
    tp_dataflow_destroy(&df);
}

Test(dataflow_text, splits_hold_out_the_last_tenth_and_windows_never_cross_it) {
    /* 1000 bytes: train [0, 900), val [900, 1000); lowercase then upper */
    char b[1000];
    for (int i = 0; i < 1000; i++)
        b[i] = i < 900 ? (char)('a' + i % 26) : (char)('A' + i % 26);
    const char *p = path("s.txt");
    write_file(p, b, sizeof b);
    /* train, random: no byte of the validation tail in any window */
    tp_df_text_opts_t o;
    tp_df_text_opts_init(&o);
    o.context = 8;
    o.size = 20000;
    tp_dataflow_t *df = tp_df_text(p, &o);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 7, 0), TP_OK);
    tp_datapoint_t *dp;
    int64_t n = 0;
    while (tp_dataflow_next(df, &dp) == TP_OK) {
        const int32_t *x = tp_datapoint_get(dp, 0)->data;
        const int32_t *y = tp_datapoint_get(dp, 1)->data;
        for (int t = 0; t < 8; t++) {
            cr_assert(x[t] >= 'a' && x[t] <= 'z', "a validation byte in training");
            cr_assert(y[t] >= 'a' && y[t] <= 'z', "a validation byte in training");
        }
        tp_datapoint_destroy(&dp);
        n++;
    }
    cr_assert_eq(n, 20000);
    tp_dataflow_destroy(&df);

    /* val: consecutive by default, all uppercase, (100 - 1) / 8 windows */
    df = text(p, 8, TP_TEXT_VAL, -1);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 7, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), 12);
    int64_t k = 0;
    while (tp_dataflow_next(df, &dp) == TP_OK) {
        const int32_t *x = tp_datapoint_get(dp, 0)->data;
        cr_assert_eq(x[0], 'A' + (900 + k * 8) % 26);
        for (int t = 0; t < 8; t++)
            cr_assert(x[t] >= 'A' && x[t] <= 'Z');
        tp_datapoint_destroy(&dp);
        k++;
    }
    cr_assert_eq(k, 12);
    tp_dataflow_destroy(&df);
}

/* The windows of one pass as offsets. */
static void offsets(tp_dataflow_t *df, int64_t T, int64_t n, int64_t *out,
                    int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        out[i] = pattern_offset(dp, T, n);
        tp_datapoint_destroy(&dp);
    }
}

Test(dataflow_text, random_offsets_follow_the_seed) {
    const char *p = write_pattern("r.txt", 200);  /* < 256: offsets unique */
    int64_t a[50], b[50], c[50], d[50];
    tp_dataflow_t *df = text(p, 10, TP_TEXT_ALL, 1);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 42, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), 19);
    offsets(df, 10, 200, a, 19);
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_DONE);
    offsets(df, 10, 200, a + 19, 19);  /* the next pass goes on drawing */
    tp_dataflow_destroy(&df);

    df = text(p, 10, TP_TEXT_ALL, 1);
    cr_assert_eq(tp_dataflow_reset_state(df, 42, 0), TP_OK);
    offsets(df, 10, 200, b, 19);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_DONE);
    offsets(df, 10, 200, b + 19, 19);
    tp_dataflow_destroy(&df);
    cr_assert_arr_eq(a, b, sizeof(int64_t) * 38, "the same seed, the same windows");

    df = text(p, 10, TP_TEXT_ALL, 1);
    cr_assert_eq(tp_dataflow_reset_state(df, 43, 0), TP_OK);
    offsets(df, 10, 200, c, 19);
    tp_dataflow_destroy(&df);
    cr_assert(memcmp(a, c, sizeof(int64_t) * 19) != 0, "another seed, other windows");

    /* what the generator draws: below(n - T), after the "text" derivation */
    tp_rng_t rng;
    tp_df_rng_derive(&rng, 42, 0, "text");
    for (int i = 0; i < 38; i++)
        d[i] = (int64_t)tp_rng_below(&rng, 200 - 10);
    cr_assert_arr_eq(a, d, sizeof(int64_t) * 38);
    int distinct_passes = memcmp(a, a + 19, sizeof(int64_t) * 19) != 0;
    cr_assert(distinct_passes, "each pass draws new windows");
}

Test(dataflow_text, batch_fast_path_gives_the_windows_of_next) {
    const char *p = write_pattern("b.txt", 5000);
    tp_dataflow_t *one = NULL, *batched = NULL;
    char spec[600];
    snprintf(spec, sizeof spec, "text:%s,context=32", p);
    cr_assert_eq(tp_spec_parse(spec, &one), TP_OK, "%s", tp_last_error());
    snprintf(spec, sizeof spec, "text:%s, context=32 | batch 8", p);
    cr_assert_eq(tp_spec_parse(spec, &batched), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(one, 5, 3), TP_OK);
    cr_assert_eq(tp_dataflow_reset_state(batched, 5, 3), TP_OK);
    /* the training split is 4500 bytes: (4500 - 1) / 32 = 140 windows */
    cr_assert_eq(tp_dataflow_size(one), 140);
    cr_assert_eq(tp_dataflow_size(batched), 17);
    for (int s = 0; s < 17; s++) {
        tp_datapoint_t *b = NULL;
        cr_assert_eq(tp_dataflow_next(batched, &b), TP_OK, "%s", tp_last_error());
        const tp_tensor_t *x = tp_datapoint_cget(b, 0), *y = tp_datapoint_cget(b, 1);
        cr_assert_eq(x->ndim, 2);
        cr_assert_eq(x->shape[0], 8);
        cr_assert_eq(x->shape[1], 32);
        cr_assert_eq(y->shape[1], 32);
        for (int i = 0; i < 8; i++) {
            tp_datapoint_t *dp = NULL;
            cr_assert_eq(tp_dataflow_next(one, &dp), TP_OK);
            cr_assert_arr_eq((int32_t *)x->data + i * 32, tp_datapoint_get(dp, 0)->data,
                             32 * sizeof(int32_t));
            cr_assert_arr_eq((int32_t *)y->data + i * 32, tp_datapoint_get(dp, 1)->data,
                             32 * sizeof(int32_t));
            tp_datapoint_destroy(&dp);
        }
        tp_datapoint_destroy(&b);
    }
    tp_dataflow_destroy(&one);
    tp_dataflow_destroy(&batched);
}

Test(dataflow_text, spec_options) {
    const char *p = write_pattern("o.txt", 1000);
    char spec[600];
    tp_dataflow_t *df = NULL;
    snprintf(spec, sizeof spec, "text:%s,context=9,split=val,random=1,size=5", p);
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), 5);
    int64_t off[5];
    offsets(df, 9, 1000, off, 5);
    /* in the file at 900 + [0, 100 - 9]; pattern_offset gives it mod 256 */
    for (int i = 0; i < 5; i++)
        cr_assert(off[i] % 256 >= 900 % 256 && off[i] % 256 <= 900 % 256 + 91,
                  "offset %lld", (long long)off[i]);
    tp_dataflow_destroy(&df);
    /* val=0.5: the validation split is [500, 1000) */
    snprintf(spec, sizeof spec, "text:%s,context=9,split=val,val=0.5", p);
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), (500 - 1) / 9);
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(((int32_t *)tp_datapoint_get(dp, 0)->data)[0], (uint8_t)(500 * 7 + 3));
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
    /* bad options name themselves */
    const char *bad[] = {"context=0", "split=test", "val=1", "random=2", "colour=1",
                         "extra"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(spec, sizeof spec, "text:%s,%s", p, bad[i]);
        cr_assert_neq(tp_spec_parse(spec, &df), TP_OK, "%s", spec);
        cr_assert_null(df);
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(bad[i], "="), bad[i]);
        cr_assert_not_null(strstr(tp_last_error(), key), "%s: %s", spec, tp_last_error());
    }
    cr_assert_neq(tp_spec_parse("text:", &df), TP_OK);
    cr_assert_not_null(strstr(tp_last_error(), "FILE"), "%s", tp_last_error());
}

Test(dataflow_text, bad_files_are_errors_naming_the_file) {
    tp_dataflow_t *df;
    /* missing */
    char missing[320];  /* path()'s buffers rotate: keep a copy */
    snprintf(missing, sizeof missing, "%s", path("nothing.txt"));
    df = text(missing, 8, TP_TEXT_TRAIN, -1);
    cr_assert_null(df);
    cr_assert_not_null(strstr(tp_last_error(), missing), "%s", tp_last_error());
    cr_assert_not_null(strstr(tp_last_error(), "No such file"), "%s", tp_last_error());
    /* a directory */
    df = text(s_dir, 8, TP_TEXT_TRAIN, -1);
    cr_assert_null(df);
    cr_assert_not_null(strstr(tp_last_error(), s_dir), "%s", tp_last_error());
    cr_assert_not_null(strstr(tp_last_error(), "directory"), "%s", tp_last_error());
    /* a FIFO: refused at once (its open blocked until a writer came) */
    char fifo[320];
    snprintf(fifo, sizeof fifo, "%s", path("fifo.txt"));
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    df = text(fifo, 8, TP_TEXT_TRAIN, -1);
    cr_assert_null(df);
    cr_assert_not_null(strstr(tp_last_error(), fifo), "%s", tp_last_error());
    cr_assert_not_null(strstr(tp_last_error(), "a special file, not a regular file"), "%s",
                       tp_last_error());
    /* empty, and one byte short of context + 1 */
    const char *empty = write_pattern("empty.txt", 0);
    df = text(empty, 8, TP_TEXT_ALL, -1);
    cr_assert_null(df);
    cr_assert_not_null(strstr(tp_last_error(), empty), "%s", tp_last_error());
    cr_assert_not_null(strstr(tp_last_error(), "context + 1 = 9"), "%s", tp_last_error());
    const char *short8 = write_pattern("short.txt", 8);
    df = text(short8, 8, TP_TEXT_ALL, -1);
    cr_assert_null(df, "8 bytes cannot give a window of 9");
    cr_assert_not_null(strstr(tp_last_error(), "8 bytes"), "%s", tp_last_error());
    const char *nine = write_pattern("nine.txt", 9);
    df = text(nine, 8, TP_TEXT_ALL, -1);
    cr_assert_not_null(df, "exactly context + 1 bytes is one window: %s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), 1);
    tp_dataflow_destroy(&df);
    /* the validation tail of a 50-byte file is 5 bytes: too short for 8 */
    const char *small = write_pattern("small.txt", 50);
    df = text(small, 8, TP_TEXT_VAL, -1);
    cr_assert_null(df);
    cr_assert_not_null(strstr(tp_last_error(), small), "%s", tp_last_error());
    cr_assert_not_null(strstr(tp_last_error(), "validation split is 5 bytes"), "%s",
                       tp_last_error());
    /* through a spec, the message keeps the file's name */
    char spec[600];
    snprintf(spec, sizeof spec, "text:%s,context=8 | batch 2", missing);
    cr_assert_neq(tp_spec_parse(spec, &df), TP_OK);
    cr_assert_not_null(strstr(tp_last_error(), missing), "%s", tp_last_error());
}

Test(dataflow_text, huge_sparse_file_is_mapped_not_read) {
    /* 6 GiB, sparse: offsets past 4 GiB must work, and nothing is copied
     * (a copy would need 6 GiB of memory, or 24 as int32) */
    const char *p = path("huge.txt");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    int64_t n = (int64_t)6 << 30;
    if (ftruncate(fd, n) != 0) {
        close(fd);
        cr_skip_test("no sparse 6 GiB file here");
    }
    const char tail[] = "the end of a very long text.";
    int64_t at = n - (int64_t)sizeof tail + 1;  /* the last bytes of the file */
    cr_assert_eq(pwrite(fd, tail, sizeof tail - 1, at), (ssize_t)(sizeof tail - 1));
    close(fd);
    tp_dataflow_t *df = text(p, (int64_t)sizeof tail - 2, TP_TEXT_VAL, 0);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    int64_t T = (int64_t)sizeof tail - 2;
    int64_t cut = n - (int64_t)((double)n * 0.1);
    cr_assert_eq(tp_dataflow_size(df), (n - cut - 1) / T);
    tp_dataflow_destroy(&df);
    /* a validation split of exactly the tail (T + 1 bytes): its one window
     * is the file's last bytes, read from past 6 GiB */
    tp_df_text_opts_t o;
    tp_df_text_opts_init(&o);
    o.context = T;
    o.split = TP_TEXT_VAL;
    o.val_fraction = ((double)T + 1.5) / (double)n;  /* floor: T + 1 */
    o.random = 1;
    o.size = 3;
    df = tp_df_text(p, &o);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    const int32_t *x = tp_datapoint_get(dp, 0)->data, *y = tp_datapoint_get(dp, 1)->data;
    for (int64_t t = 0; t < T; t++) {
        cr_assert_eq(x[t], (uint8_t)tail[t]);
        cr_assert_eq(y[t], (uint8_t)tail[t + 1]);
    }
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
}

/* ---- GPT-2's BPE tokens (vocab=, merges=) -------------------------------- */

/* A hand vocabulary in GPT-2's files: byte b is id b ("Ġ" is GPT-2's
 * space), merges by rank are ids 256..264; 265 tokens. */
static void write_bpe_vocab(void) {
    static const char *const merges[][2] = {
        {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"},
        {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}};
    bpe_write_vocab(path("encoder.json"), path("vocab.bpe"), merges, 9, NULL);
}

/* n copies of a line the vocabulary merges well, and one it does not */
static const char *write_words(const char *name, int n) {
    static char p[320];  /* path()'s buffers turn over */
    snprintf(p, sizeof p, "%s", path(name));
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++)
        fprintf(f, i % 3 ? "hello world, orl %d\n" : "Zebra quiz %d\n", i);
    fclose(f);
    return p;
}

/* The ids of bytes [start, end) of file p, by the tokenizer itself. */
static int32_t *encode_range(const char *p, int64_t start, int64_t end, int64_t *n) {
    tp_tokenizer_t *tk = tp_tokenizer_load(path("encoder.json"), path("vocab.bpe"));
    cr_assert_not_null(tk, "%s", tp_last_error());
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f);
    char *buf = malloc((size_t)(end - start));
    fseek(f, (long)start, SEEK_SET);
    cr_assert_eq(fread(buf, 1, (size_t)(end - start), f), (size_t)(end - start));
    fclose(f);
    int32_t *ids = NULL;
    cr_assert_eq(tp_tokenizer_encode(tk, buf, (size_t)(end - start), &ids, n), TP_OK);
    free(buf);
    tp_tokenizer_destroy(&tk);
    return ids;
}

static tp_dataflow_t *bpe_text(const char *p, int64_t T, tp_text_split_t split,
                               int random, int64_t size) {
    tp_df_text_opts_t o;
    tp_df_text_opts_init(&o);
    o.context = T;
    o.split = split;
    o.random = random;
    o.size = size;
    o.vocab = path("encoder.json");
    o.merges = path("vocab.bpe");
    return tp_df_text(p, &o);
}

static int64_t file_size(const char *p) {
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    return st.st_size;
}

Test(dataflow_text, bpe_windows_are_the_encoded_file_and_targets_shifted_by_one) {
    write_bpe_vocab();
    const char *p = write_words("w.txt", 300);
    int64_t nbytes = file_size(p), ntok = 0;
    int32_t *ids = encode_range(p, 0, nbytes, &ntok);
    cr_assert_lt(ntok * 3, nbytes * 2, "merges happened: %lld tokens of %lld bytes",
                 (long long)ntok, (long long)nbytes);
    tp_dataflow_t *df = bpe_text(p, 8, TP_TEXT_ALL, 0, 0);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), (ntok - 1) / 8, "a pass is the tokens, not bytes");
    tp_datapoint_t *dp;
    int64_t k = 0;
    while (tp_dataflow_next(df, &dp) == TP_OK) {
        const int32_t *x = tp_datapoint_get(dp, 0)->data;
        const int32_t *y = tp_datapoint_get(dp, 1)->data;
        for (int64_t t = 0; t < 8; t++) {
            cr_assert_eq(x[t], ids[k * 8 + t], "window %lld token %lld", (long long)k,
                         (long long)t);
            cr_assert_eq(y[t], ids[k * 8 + t + 1]);
        }
        tp_datapoint_destroy(&dp);
        k++;
    }
    cr_assert_eq(k, (ntok - 1) / 8);
    free(ids);
    tp_dataflow_destroy(&df);
}

Test(dataflow_text, bpe_splits_encode_their_own_bytes_and_follow_the_seed) {
    write_bpe_vocab();
    const char *p = write_words("w.txt", 400);
    int64_t n = file_size(p), cut = n - (int64_t)floor((double)n * 0.1);
    int64_t ntrain, nval;
    int32_t *train = encode_range(p, 0, cut, &ntrain);
    int32_t *val = encode_range(p, cut, n, &nval);
    /* validation: consecutive windows of the tail's own tokens */
    tp_dataflow_t *df = bpe_text(p, 6, TP_TEXT_VAL, -1, 0);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), (nval - 1) / 6);
    tp_datapoint_t *dp;
    for (int64_t k = 0; tp_dataflow_next(df, &dp) == TP_OK; k++) {
        const int32_t *x = tp_datapoint_get(dp, 0)->data;
        cr_assert_eq(memcmp(x, val + k * 6, 6 * sizeof *x), 0, "validation window %lld",
                     (long long)k);
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&df);
    /* training: random windows of the head's tokens, the same for the
     * same seed (a resumed run replays them) */
    tp_dataflow_t *a = bpe_text(p, 6, TP_TEXT_TRAIN, -1, 200);
    tp_dataflow_t *b = bpe_text(p, 6, TP_TEXT_TRAIN, -1, 200);
    cr_assert(a && b, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(a, 42, 0), TP_OK);
    cr_assert_eq(tp_dataflow_reset_state(b, 42, 0), TP_OK);
    int64_t distinct = 0, last = -1;
    tp_datapoint_t *da, *db;
    while (tp_dataflow_next(a, &da) == TP_OK) {
        cr_assert_eq(tp_dataflow_next(b, &db), TP_OK);
        const int32_t *x = tp_datapoint_get(da, 0)->data;
        const int32_t *y = tp_datapoint_get(da, 1)->data;
        cr_assert_eq(memcmp(x, tp_datapoint_get(db, 0)->data, 6 * sizeof *x), 0);
        int64_t off = -1;
        for (int64_t o = 0; o + 6 < ntrain && off < 0; o++)
            if (!memcmp(train + o, x, 6 * sizeof *x) && !memcmp(train + o + 1, y, 6 * sizeof *y))
                off = o;
        cr_assert_geq(off, 0, "a training window that is no window of the head's tokens");
        distinct += off != last;
        last = off;
        tp_datapoint_destroy(&da);
        tp_datapoint_destroy(&db);
    }
    cr_assert_gt(distinct, 100);
    tp_dataflow_destroy(&a);
    tp_dataflow_destroy(&b);
    free(train);
    free(val);
}

Test(dataflow_text, bpe_spec_info_gives_the_vocabulary_and_bytes_per_token) {
    write_bpe_vocab();
    const char *p = write_words("w.txt", 200);
    char spec[1200];
    snprintf(spec, sizeof spec, "text:%s,context=4,vocab=%s,merges=%s,split=val | batch 3",
             p, path("encoder.json"), path("vocab.bpe"));
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *b = NULL;
    cr_assert_eq(tp_dataflow_next(df, &b), TP_OK);
    const tp_tensor_t *x = tp_datapoint_cget(b, 0);
    cr_assert(x->ndim == 2 && x->shape[0] == 3 && x->shape[1] == 4);
    tp_datapoint_destroy(&b);
    tp_dataflow_destroy(&df);

    int64_t n = file_size(p), cut = n - (int64_t)floor((double)n * 0.1), nval;
    free(encode_range(p, cut, n, &nval));
    tp_text_info_t info;
    cr_assert_eq(tp_df_text_spec_info(spec, 1, &info), TP_OK, "%s", tp_last_error());
    cr_assert_eq(info.vocab, 265);
    cr_assert_eq(info.bytes, n - cut);
    cr_assert_eq(info.tokens, nval);
    cr_assert_float_eq(info.bytes_per_token, (double)(n - cut) / (double)nval, 1e-12);
    cr_assert_gt(info.bytes_per_token, 1.3);
    /* the vocabulary alone: nothing encoded */
    cr_assert_eq(tp_df_text_spec_info(spec, 0, &info), TP_OK, "%s", tp_last_error());
    cr_assert_eq(info.vocab, 265);
    cr_assert_eq(info.tokens, 0);
    /* bytes: 256, one byte a token */
    snprintf(spec, sizeof spec, "text:%s,context=4 | batch 3", p);
    cr_assert_eq(tp_df_text_spec_info(spec, 1, &info), TP_OK, "%s", tp_last_error());
    cr_assert_eq(info.vocab, 256);
    cr_assert_float_eq(info.bytes_per_token, 1.0, 0);
    cr_assert_neq(tp_df_text_spec_info("fashion-mnist | batch 3", 0, &info), TP_OK);
}

Test(dataflow_text, bpe_bad_options_are_errors_naming_the_file) {
    write_bpe_vocab();
    const char *p = write_words("w.txt", 3);
    tp_dataflow_t *df = NULL;
    char spec[1200];
    snprintf(spec, sizeof spec, "text:%s,merges=%s", p, path("vocab.bpe"));
    cr_assert_neq(tp_spec_parse(spec, &df), TP_OK);
    cr_assert(strstr(tp_last_error(), "without vocab="), "%s", tp_last_error());
    snprintf(spec, sizeof spec, "text:%s,vocab=%s,merges=%s", p, path("nope.json"),
             path("vocab.bpe"));
    cr_assert_neq(tp_spec_parse(spec, &df), TP_OK);
    cr_assert(strstr(tp_last_error(), "nope.json") && strstr(tp_last_error(), p), "%s",
              tp_last_error());
    /* 3 lines are ~50 bytes but ~25 tokens: too short for context 40 in
     * tokens, though not in bytes */
    df = bpe_text(p, 40, TP_TEXT_ALL, 0, 0);
    cr_assert_null(df);
    cr_assert(strstr(tp_last_error(), "tokens") && strstr(tp_last_error(), p), "%s",
              tp_last_error());
}
