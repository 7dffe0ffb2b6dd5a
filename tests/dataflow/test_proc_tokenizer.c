/* towerpack tests: GPT-2's BPE (dataflow/tokenizer.c) against a reference
 * nobody here wrote the rules of: tests/dataflow/bpe_ref.py, GPT-2's
 * encoder.py algorithm and tiktoken's merge with Python's `regex` module
 * for the pattern's \p{L}, \p{N} and \s. The vocabulary is learned by the
 * script from a text of this repository (nothing is downloaded). A file
 * of its own because it runs python3; it skips when python3 lacks regex. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include <towerpack/tokenizer.h>
#include "dir_testutil.h"

#define REF_PY TP_SOURCE_DIR "/tests/dataflow/bpe_ref.py"

static char s_dir[256];

static void s_setup(void) { dt_make(s_dir, sizeof s_dir, "tp_bpe_ref"); }

static void s_teardown(void) { dt_remove(s_dir); }

TestSuite(proc_tokenizer, .init = s_setup, .fini = s_teardown, .timeout = 120);

static void s_need_regex(void) {
    if (system("/usr/bin/python3 -c 'import regex' >/dev/null 2>&1") != 0)
        cr_skip_test("/usr/bin/python3 has no regex module (Debian's python3-regex; "
                     "scripts/install-deps.sh installs it)");
}

static void s_py(const char *fmt, const char *a, const char *b, const char *c) {
    char cmd[2048];
    char args[1500];
    snprintf(args, sizeof args, fmt, a, b, c);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s", REF_PY, args);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void *s_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    void *p = malloc((size_t)len + 1);
    cr_assert_eq(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

static const char *s_path(const char *name) { return dt_path(s_dir, name); }

/* The pre-tokens of `file` (C) against regex.findall's (Python). */
static void s_check_pretokens(const char *file) {
    s_py("pretok %s %s%s", file, s_path("pretok.bin"), "");
    size_t n, nref;
    uint8_t *text = s_read(file, &n);
    int64_t *ref = s_read(s_path("pretok.bin"), &nref);
    nref /= sizeof *ref;
    size_t at = 0, k = 0;
    while (at < n) {
        size_t m = tp_tokenizer_pretoken(text + at, n - at);
        cr_assert_lt(k, nref, "%s: more pre-tokens than regex finds (at byte %zu)", file, at);
        cr_assert_eq((int64_t)m, ref[k], "%s: pre-token %zu at byte %zu: %zu bytes, regex "
                     "%lld ('%.*s')", file, k, at, m, (long long)ref[k], (int)(m < 40 ? m : 40),
                     text + at);
        at += m;
        k++;
    }
    cr_assert_eq(k, nref, "%s: %zu pre-tokens, regex %zu", file, k, nref);
    free(text);
    free(ref);
}

Test(proc_tokenizer, pretokens_match_the_regex_module_over_unicode) {
    s_need_regex();
    /* random characters from all of Unicode, weighted towards the classes'
     * edges (combining marks, NBSP, em space, CJK, Arabic digits, emoji,
     * contractions, runs of spaces) */
    for (int seed = 1; seed <= 4; seed++) {
        char sd[16];
        snprintf(sd, sizeof sd, "%d", seed);
        s_py("randtext %s 30000 %s%s", sd, s_path("rand.txt"), "");
        s_check_pretokens(s_path("rand.txt"));
    }
    s_check_pretokens(TP_SOURCE_DIR "/docs/training.md");
}

/* ids (C) against the reference's ids file. */
static void s_check_ids(const int32_t *ids, int64_t n, const char *ref_path,
                        const char *what) {
    size_t nb;
    int32_t *ref = s_read(ref_path, &nb);
    int64_t nref = (int64_t)(nb / sizeof *ref);
    int64_t i = 0;
    while (i < n && i < nref && ids[i] == ref[i])
        i++;
    cr_assert(i == n && n == nref, "%s: %lld ids, the reference %lld; the first "
              "difference at %lld (%d vs %d)", what, (long long)n, (long long)nref,
              (long long)i, i < n ? ids[i] : -1, i < nref ? ref[i] : -1);
    free(ref);
}

static void s_check_encode(const char *file_arg, int tiktoken_ref) {
    char file[320];  /* s_path's buffers turn over */
    snprintf(file, sizeof file, "%s", file_arg);
    tp_tokenizer_t *tk = tp_tokenizer_load(s_path("encoder.json"), s_path("vocab.bpe"));
    cr_assert_not_null(tk, "%s", tp_last_error());
    tp_tokenizer_t *tt = tp_tokenizer_load(s_path("r.tiktoken"), NULL);
    cr_assert_not_null(tt, "%s", tp_last_error());
    size_t n;
    uint8_t *text = s_read(file, &n);
    int32_t *ids = NULL, *ids2 = NULL;
    int64_t k = 0, k2 = 0;
    cr_assert_eq(tp_tokenizer_encode(tk, text, n, &ids, &k), TP_OK);
    s_py("encode %s %s %s", s_dir, file, s_path("ids.bin"));
    s_check_ids(ids, k, s_path("ids.bin"), "GPT-2's files vs encoder.py");
    cr_assert_eq(tp_tokenizer_encode(tt, text, n, &ids2, &k2), TP_OK);
    if (tiktoken_ref) {
        s_py("encode-tiktoken %s %s %s", s_dir, file, s_path("ids_tt.bin"));
        s_check_ids(ids2, k2, s_path("ids_tt.bin"), ".tiktoken vs tiktoken's merge");
    }
    s_check_ids(ids2, k2, s_path("ids.bin"), ".tiktoken vs encoder.py");
    /* and back: the bytes exactly */
    char *back = malloc(n + 1);
    cr_assert_eq(tp_tokenizer_decode(tk, ids, k, back, n + 1), (int64_t)n);
    cr_assert_eq(memcmp(back, text, n), 0);
    free(back);
    free(ids);
    free(ids2);
    free(text);
    tp_tokenizer_destroy(&tk);
    tp_tokenizer_destroy(&tt);
}

Test(proc_tokenizer, encode_matches_gpt2s_encoder_and_tiktoken) {
    s_need_regex();
    /* learned on one text, checked on others (unseen words fall apart into
     * smaller tokens, down to bytes) */
    s_py("gen %s %s %s", TP_SOURCE_DIR "/docs/training.md", s_dir, "400");
    s_check_encode(TP_SOURCE_DIR "/README.md", 1);
    s_check_encode(TP_SOURCE_DIR "/docs/training.md", 1);
    s_py("randtext 7 20000 %s%s%s", s_path("rand.txt"), "", "");
    s_check_encode(s_path("rand.txt"), 0);
}
