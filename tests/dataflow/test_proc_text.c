/* towerpack tests: the text source against numpy (tests/dataflow/
 * text_ref.py): the batched windows of `text:FILE,... | batch B` are the
 * file's bytes at the offsets the source's generator draws, split where
 * numpy splits; and in forked workers (`processes N`), which share the
 * file's mapping. A file of its own because it runs python3 and forks.
 * The numpy check skips when python3 lacks numpy. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/actor_dataflow.h>
#include "dir_testutil.h"

#define REF_PY TP_SOURCE_DIR "/tests/dataflow/text_ref.py"

static const char *s_python(void) {
    static const char *const cands[] = {"/usr/bin/python3", "python3"};
    for (size_t i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0)
            return cands[i];
    }
    return NULL;
}

static char s_dir[256];

static void s_setup(void) {
    snprintf(s_dir, sizeof s_dir, "/tmp/tp_text_ref_%d", (int)getpid());
    cr_assert_eq(mkdir(s_dir, 0755), 0);
}

static void s_teardown(void) {
    dt_remove(s_dir);
}

TestSuite(proc_text, .init = s_setup, .fini = s_teardown, .timeout = 120);

/* About `bytes` of English-looking text (words from a small list, with
 * punctuation and newlines), drawn from a fixed seed. */
static void s_write_text(const char *path, size_t bytes) {
    static const char *const words[] = {
        "the", "engine", "trains", "a", "model", "on", "text", "and", "every",
        "byte", "is", "token", "while", "towers", "share", "their", "gradients",
        "of", "language", "windows", "random", "offsets", "validation", "split"};
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    tp_rng_t rng;
    tp_rng_init(&rng, 99, 0);
    size_t n = 0;
    while (n < bytes) {
        const char *w = words[tp_rng_below(&rng, sizeof words / sizeof *words)];
        uint64_t r = tp_rng_below(&rng, 20);
        n += (size_t)fprintf(f, "%s%s", w, r == 0 ? ".\n" : r == 1 ? ", " : " ");
    }
    fclose(f);
}

/* Run `spec` (a text source and a batch stage) for `nbatches`, write its
 * windows and the offsets `off` to files, and have numpy check them. */
static void s_check(const char *py, const char *file, const char *spec, int64_t T,
                    const char *split, double val, const int64_t *off, int64_t nbatches,
                    int64_t B, uint64_t seed, int expect_ok) {
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, seed, 0), TP_OK);
    char wpath[320], opath[320], cmd[2048];
    snprintf(wpath, sizeof wpath, "%s/windows.bin", s_dir);
    snprintf(opath, sizeof opath, "%s/offsets.bin", s_dir);
    FILE *w = fopen(wpath, "wb"), *o = fopen(opath, "wb");
    cr_assert(w && o);
    for (int64_t s = 0; s < nbatches; s++) {
        tp_datapoint_t *b = NULL;
        cr_assert_eq(tp_dataflow_next(df, &b), TP_OK, "batch %lld: %s", (long long)s,
                     tp_last_error());
        const int32_t *x = tp_datapoint_get(b, 0)->data, *y = tp_datapoint_get(b, 1)->data;
        for (int64_t i = 0; i < B; i++) {
            cr_assert_eq(fwrite(x + i * T, sizeof(int32_t), (size_t)T, w), (size_t)T);
            cr_assert_eq(fwrite(y + i * T, sizeof(int32_t), (size_t)T, w), (size_t)T);
        }
        tp_datapoint_destroy(&b);
    }
    cr_assert_eq(fwrite(off, sizeof *off, (size_t)(nbatches * B), o), (size_t)(nbatches * B));
    fclose(w);
    fclose(o);
    tp_dataflow_destroy(&df);
    snprintf(cmd, sizeof cmd, "%s %s %s %lld %s %.17g %s %s%s", py, REF_PY, file,
             (long long)T, split, val, opath, wpath, expect_ok ? "" : " >/dev/null");
    int rc = system(cmd);
    if (expect_ok)
        cr_assert_eq(rc, 0, "%s: exit %d", cmd, rc);
    else
        cr_assert_neq(rc, 0, "the reference must catch a wrong window: %s", cmd);
}

Test(proc_text, windows_match_numpy_over_the_same_bytes_and_offsets) {
    const char *py = s_python();
    if (!py)
        cr_skip_test("python3 with numpy (python3-numpy) is not installed");
    char file[320], spec[1024];
    snprintf(file, sizeof file, "%s/corpus.txt", s_dir);
    s_write_text(file, 500001);
    struct stat st;
    cr_assert_eq(stat(file, &st), 0);
    int64_t n = st.st_size, T = 64, B = 16, nb = 40;
    int64_t cut = n - (int64_t)floor((double)n * 0.1);
    int64_t off[40 * 16];

    /* training split, random offsets: the generator's draws */
    tp_rng_t rng;
    tp_df_rng_derive(&rng, 1234, 0, "text");
    for (int64_t i = 0; i < nb * B; i++)
        off[i] = (int64_t)tp_rng_below(&rng, (uint64_t)(cut - T));
    snprintf(spec, sizeof spec, "text:%s,context=%lld | batch %lld", file, (long long)T,
             (long long)B);
    s_check(py, file, spec, T, "train", 0.1, off, nb, B, 1234, 1);

    /* validation split: consecutive windows from the split point */
    for (int64_t i = 0; i < nb * B; i++)
        off[i] = i * T;
    snprintf(spec, sizeof spec, "text:%s,context=%lld,split=val | batch %lld", file,
             (long long)T, (long long)B);
    cr_assert_leq(nb * B * T + 1, n - cut);
    s_check(py, file, spec, T, "val", 0.1, off, nb, B, 1234, 1);

    /* the whole file with another held-out fraction (which `all` ignores)
     * and another context, random */
    T = 33;
    tp_df_rng_derive(&rng, 5, 0, "text");
    for (int64_t i = 0; i < nb * B; i++)
        off[i] = (int64_t)tp_rng_below(&rng, (uint64_t)(n - T));
    snprintf(spec, sizeof spec, "text:%s,context=%lld,split=all,val=0.25 | batch %lld", file,
             (long long)T, (long long)B);
    s_check(py, file, spec, T, "all", 0.25, off, nb, B, 5, 1);

    /* a reference that is wrong fails: one offset shifted by one */
    T = 64;
    tp_df_rng_derive(&rng, 1234, 0, "text");
    for (int64_t i = 0; i < nb * B; i++)
        off[i] = (int64_t)tp_rng_below(&rng, (uint64_t)(cut - T)) + (i == 7);
    snprintf(spec, sizeof spec, "text:%s,context=%lld | batch %lld", file, (long long)T,
             (long long)B);
    s_check(py, file, spec, T, "train", 0.1, off, nb, B, 1234, 0);
}

Test(proc_text, forked_workers_read_the_shared_mapping) {
    char file[320], spec[1024];
    snprintf(file, sizeof file, "%s/pattern.txt", s_dir);
    /* byte i is i % 251: a window's first byte and length say it is one */
    FILE *f = fopen(file, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < 100000; i++)
        fputc(i % 251, f);
    fclose(f);
    snprintf(spec, sizeof spec, "text:%s,context=32", file);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.allow_threads = 1;  /* Criterion's own thread */
    o.timeout_s = 20;
    df = tp_df_batch(tp_df_multiprocess(df, 2, &o), 8, 0);
    cr_assert_not_null(df, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 11, 0), TP_OK, "%s", tp_last_error());
    for (int s = 0; s < 50; s++) {
        tp_datapoint_t *b = NULL;
        cr_assert_eq(tp_dataflow_next(df, &b), TP_OK, "batch %d: %s", s, tp_last_error());
        const tp_tensor_t *x = tp_datapoint_cget(b, 0), *y = tp_datapoint_cget(b, 1);
        cr_assert_eq(x->ndim, 2);
        cr_assert_eq(x->shape[0], 8);
        cr_assert_eq(x->shape[1], 32);
        for (int i = 0; i < 8; i++)
            for (int t = 0; t < 32; t++) {
                int32_t a = ((const int32_t *)x->data)[i * 32 + t];
                int32_t first = ((const int32_t *)x->data)[i * 32];
                cr_assert_eq(a, (first + t) % 251);
                cr_assert_eq(((const int32_t *)y->data)[i * 32 + t], (first + t + 1) % 251);
            }
        tp_datapoint_destroy(&b);
    }
    tp_dataflow_destroy(&df);
}
