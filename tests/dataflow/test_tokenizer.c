/* towerpack tests: GPT-2's BPE (dataflow/tokenizer.c) on a vocabulary
 * written here by hand, in both file formats: the pattern's pre-tokens on
 * chosen cases (contractions, runs of spaces, Unicode letters, numbers,
 * marks, NBSP, invalid UTF-8), merges by rank, decode(encode(x)) == x for
 * any bytes, and bad files as errors naming the file and line. The check
 * against Python's regex module and GPT-2's encoder.py is
 * test_proc_tokenizer.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include <towerpack/tokenizer.h>
#include "dataflow/bpe_testutil.h"
#include "dir_testutil.h"

static char s_dir[256];

static void setup(void) { dt_make(s_dir, sizeof s_dir, "tp_tokenizer"); }

static void teardown(void) { dt_remove(s_dir); }

TestSuite(tokenizer, .init = setup, .fini = teardown, .timeout = 60);

static const char *path(const char *name) { return dt_path(s_dir, name); }

static void write_str(const char *p, const char *text) {
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

/* The merges of the hand vocabulary, by rank; the merged token of rank r
 * is id 256 + r. "Ġ" is GPT-2's space. */
static const char *const s_merges[][2] = {
    {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"},
    {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}, {"r", "l"}};
#define NMERGES 10

/* encoder.json (bytes b as id b, merges as 256 + rank, "<|endoftext|>" as
 * 300: ids may leave gaps) and vocab.bpe; also r.tiktoken, the same tokens
 * with the id as rank. */
static void write_vocab(void) {
    bpe_write_vocab(path("encoder.json"), path("vocab.bpe"), s_merges, NMERGES,
                    "\"<|endoftext|>\": 300");
    FILE *t = fopen(path("r.tiktoken"), "wb");
    cr_assert_not_null(t);
    static const char b64[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; b++)
        fprintf(t, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);  /* one byte */
    /* the merged tokens' bytes in base64, written out by hand */
    static const char *const merged64[NMERGES] = {"aGU=", "bGw=", "aGVsbA==", "aGVsbG8=",
                                                  "IHc=", "b3I=", "IHdvcg==", "bGQ=",
                                                  "IHdvcmxk", "cmw="};
    for (int r = 0; r < NMERGES; r++)
        fprintf(t, "%s %d\n", merged64[r], 256 + r);
    fclose(t);
}

static tp_tokenizer_t *load_gpt2(void) {
    write_vocab();
    tp_tokenizer_t *tk = tp_tokenizer_load(path("encoder.json"), path("vocab.bpe"));
    cr_assert_not_null(tk, "%s", tp_last_error());
    return tk;
}

/* The pre-tokens of text joined by '|'. */
static const char *split(const char *text) {
    static char out[512];
    size_t n = strlen(text), at = 0, o = 0;
    while (at < n) {
        size_t m = tp_tokenizer_pretoken((const uint8_t *)text + at, n - at);
        cr_assert_gt(m, 0);
        if (at)
            out[o++] = '|';
        memcpy(out + o, text + at, m);
        o += m;
        at += m;
    }
    out[o] = 0;
    return out;
}

Test(tokenizer, pretokens_follow_gpt2s_pattern) {
    static const char *const cases[][2] = {
        {"I'm here", "I|'m| here"},
        {"don't they'll we've you're she'd", "don|'t| they|'ll| we|'ve| you|'re| she|'d"},
        {"it'S", "it|'|S"},  /* case-sensitive, as GPT-2's */
        {"'said", "'s|aid"},
        {"?'s", "?'|s"},
        {"abc123def", "abc|123|def"},
        {"a  b", "a| | b"},
        {"a\n\nb", "a|\n|\n|b"},
        {"end   ", "end|   "},
        {" !!x", " !!|x"},
        {"  hi", " | hi"},
        {"h\xc3\xa9llo w\xc3\xb6rld", "h\xc3\xa9llo| w\xc3\xb6rld"},        /* é ö */
        {"x\xc2\xa0y", "x|\xc2\xa0|y"},                                     /* NBSP */
        {"e\xcc\x81t", "e|\xcc\x81|t"},                     /* a combining mark */
        {"n\xc2\xb2\xc2\xb3 ", "n|\xc2\xb2\xc2\xb3| "},     /* superscripts: N */
        {"\xe6\x97\xa5\xe6\x9c\xac go", "\xe6\x97\xa5\xe6\x9c\xac| go"},    /* CJK */
        {"\xff\xfe" "ab", "\xff\xfe|ab"},                           /* not UTF-8 */
        {"a\xe2\x80\x83\xe2\x80\x83z", "a|\xe2\x80\x83|\xe2\x80\x83|z"},  /* em spaces */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        cr_expect_str_eq(split(cases[i][0]), cases[i][1], "case %zu", i);
}

/* Only U+0020 joins a word as ' ?'; another space before a word (here
 * an em space) stands alone. */
Test(tokenizer, only_the_ascii_space_joins_the_next_word) {
    cr_assert_str_eq(split("a\xe2\x80\x83z"), "a|\xe2\x80\x83|z");
    cr_assert_str_eq(split("a z"), "a| z");
}

static void expect_ids(tp_tokenizer_t *tk, const char *text, const int32_t *want,
                       int64_t nwant) {
    int32_t *ids = NULL;
    int64_t n = 0;
    cr_assert_eq(tp_tokenizer_encode(tk, text, strlen(text), &ids, &n), TP_OK);
    cr_assert_eq(n, nwant, "'%s': %lld tokens, want %lld", text, (long long)n,
                 (long long)nwant);
    for (int64_t i = 0; i < n; i++)
        cr_expect_eq(ids[i], want[i], "'%s' token %lld: %d, want %d", text, (long long)i,
                     ids[i], want[i]);
    free(ids);
}

static void check_merges(tp_tokenizer_t *tk) {
    cr_assert_eq(tp_tokenizer_vocab_size(tk), 301);
    expect_ids(tk, "hello world", (int32_t[]){259, 264}, 2);
    expect_ids(tk, "hello  world", (int32_t[]){259, 32, 264}, 3);
    /* every occurrence of the best pair: he he, then ll ll, then hell hell,
     * then hello once */
    expect_ids(tk, "hellhello", (int32_t[]){258, 259}, 2);
    /* the rank decides: "o r" (5) before "r l" (9) */
    expect_ids(tk, "orl", (int32_t[]){261, 'l'}, 2);
    /* the cache answers the second time the same */
    expect_ids(tk, "orl orl orl", (int32_t[]){261, 'l', ' ', 261, 'l', ' ', 261, 'l'}, 8);
    expect_ids(tk, "Hi!", (int32_t[]){'H', 'i', '!'}, 3);
}

Test(tokenizer, merges_by_rank_from_gpt2s_files) {
    tp_tokenizer_t *tk = load_gpt2();
    check_merges(tk);
    size_t len;
    const uint8_t *p = tp_tokenizer_token(tk, 264, &len);
    cr_assert(p && len == 6 && !memcmp(p, " world", 6));
    p = tp_tokenizer_token(tk, 300, &len);
    cr_assert(p && len == 13 && !memcmp(p, "<|endoftext|>", 13));
    cr_assert_null(tp_tokenizer_token(tk, 299, &len), "a gap in the ids is no token");
    cr_assert_null(tp_tokenizer_token(tk, 301, &len));
    cr_assert_null(tp_tokenizer_token(tk, -1, &len));
    tp_tokenizer_destroy(&tk);
    cr_assert_null(tk);
    tp_tokenizer_destroy(&tk);
}

Test(tokenizer, a_tiktoken_file_gives_the_same_tokens) {
    write_vocab();
    tp_tokenizer_t *tk = tp_tokenizer_load(path("r.tiktoken"), NULL);
    cr_assert_not_null(tk, "%s", tp_last_error());
    /* no "<|endoftext|>" in a .tiktoken file: the vocabulary ends at 266 */
    cr_assert_eq(tp_tokenizer_vocab_size(tk), 266);
    expect_ids(tk, "hello world", (int32_t[]){259, 264}, 2);
    expect_ids(tk, "hellhello", (int32_t[]){258, 259}, 2);
    expect_ids(tk, "orl", (int32_t[]){261, 'l'}, 2);
    tp_tokenizer_destroy(&tk);
}

Test(tokenizer, decode_gives_back_any_bytes) {
    tp_tokenizer_t *tk = load_gpt2();
    uint8_t text[4096];
    uint64_t x = 12345;
    for (size_t i = 0; i < sizeof text; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        /* half English-ish, half any byte (invalid UTF-8 included) */
        text[i] = i % 512 < 256 ? (uint8_t)"hello world, orl'd \n"[(x >> 33) % 20]
                                : (uint8_t)(x >> 56);
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    cr_assert_eq(tp_tokenizer_encode(tk, text, sizeof text, &ids, &n), TP_OK);
    cr_assert_lt(n, (int64_t)sizeof text, "some merges happened");
    uint8_t back[4097];
    cr_assert_eq(tp_tokenizer_decode(tk, ids, n, back, sizeof back), (int64_t)sizeof text);
    cr_assert_eq(memcmp(back, text, sizeof text), 0);
    /* measuring, and a buffer too small: the length all the same, cut */
    cr_assert_eq(tp_tokenizer_decode(tk, ids, n, NULL, 0), (int64_t)sizeof text);
    char small[5];
    cr_assert_eq(tp_tokenizer_decode(tk, (int32_t[]){259, 264}, 2, small, sizeof small), 11);
    cr_assert_str_eq(small, "hell");
    /* an id that is no token */
    cr_assert_eq(tp_tokenizer_decode(tk, (int32_t[]){259, 299}, 2, back, sizeof back), -1);
    cr_assert(strstr(tp_last_error(), "299"), "%s", tp_last_error());
    free(ids);
    /* nothing to encode */
    cr_assert_eq(tp_tokenizer_encode(tk, "", 0, &ids, &n), TP_OK);
    cr_assert_eq(n, 0);
    free(ids);
    tp_tokenizer_destroy(&tk);
}

Test(tokenizer, bad_files_are_errors_naming_them) {
    write_vocab();
    cr_assert_null(tp_tokenizer_load(path("none.json"), path("vocab.bpe")));
    cr_assert(strstr(tp_last_error(), "none.json"), "%s", tp_last_error());
    cr_assert_null(tp_tokenizer_load(path("encoder.json"), path("none.bpe")));
    cr_assert(strstr(tp_last_error(), "none.bpe"), "%s", tp_last_error());
    /* a merge of tokens the vocabulary lacks, on line 3 */
    write_str(path("bad.bpe"), "#version: 0.2\nh e\nq z\n");
    cr_assert_null(tp_tokenizer_load(path("encoder.json"), path("bad.bpe")));
    cr_assert(strstr(tp_last_error(), "bad.bpe line 3"), "%s", tp_last_error());
    write_str(path("bad2.bpe"), "h e x\n");
    cr_assert_null(tp_tokenizer_load(path("encoder.json"), path("bad2.bpe")));
    cr_assert(strstr(tp_last_error(), "line 1"), "%s", tp_last_error());
    /* a vocabulary without every byte */
    write_str(path("few.json"), "{\"a\": 0, \"b\": 1}");
    cr_assert_null(tp_tokenizer_load(path("few.json"), path("vocab.bpe")));
    cr_assert(strstr(tp_last_error(), "byte 0x00"), "%s", tp_last_error());
    /* ... is the vocabulary's fault: the message names it, not the merges
     * (it named vocab.bpe) */
    cr_assert(strstr(tp_last_error(), "few.json") && !strstr(tp_last_error(), "vocab.bpe"),
              "%s", tp_last_error());
    write_str(path("notjson.json"), "[1, 2]");
    cr_assert_null(tp_tokenizer_load(path("notjson.json"), path("vocab.bpe")));
    cr_assert(strstr(tp_last_error(), "notjson.json"), "%s", tp_last_error());
    write_str(path("x.tiktoken"), "aGU= 1\n!!! 2\n");
    cr_assert_null(tp_tokenizer_load(path("x.tiktoken"), NULL));
    cr_assert(strstr(tp_last_error(), "x.tiktoken line 2"), "%s", tp_last_error());
    write_str(path("y.tiktoken"), "aGU=\n");
    cr_assert_null(tp_tokenizer_load(path("y.tiktoken"), NULL));
    cr_assert(strstr(tp_last_error(), "y.tiktoken line 1"), "%s", tp_last_error());
}

/* A directory or a FIFO where a tokenizer file goes is refused by name at
 * once, for each of the three files: before, a FIFO's open (or jansson's
 * read of it) waited for a writer forever, and encoder.json as a directory
 * read as an empty document ("'[' or '{' expected near end of file"); a
 * missing encoder.json said "line -1". */
Test(tokenizer, a_directory_or_fifo_is_refused_by_name) {
    write_vocab();
    char fifo[320];
    snprintf(fifo, sizeof fifo, "%s", path("fifo"));
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const char *const bad[] = {s_dir, fifo};
    const char *const kind[] = {"a directory, not a regular file",
                                "a FIFO (named pipe), not a regular file"};
    for (int i = 0; i < 2; i++) {
        cr_assert_null(tp_tokenizer_load(bad[i], path("vocab.bpe")));
        cr_assert(strstr(tp_last_error(), bad[i]) && strstr(tp_last_error(), kind[i]),
                  "encoder.json: %s", tp_last_error());
        cr_assert_null(tp_tokenizer_load(path("encoder.json"), bad[i]));
        cr_assert(strstr(tp_last_error(), bad[i]) && strstr(tp_last_error(), kind[i]),
                  "vocab.bpe: %s", tp_last_error());
        cr_assert_null(tp_tokenizer_load(bad[i], NULL));
        cr_assert(strstr(tp_last_error(), bad[i]) && strstr(tp_last_error(), kind[i]),
                  "tiktoken: %s", tp_last_error());
    }
    cr_assert_null(tp_tokenizer_load(path("none.json"), path("vocab.bpe")));
    cr_assert(strstr(tp_last_error(), "No such file") && !strstr(tp_last_error(), "line -1"),
              "%s", tp_last_error());
}
