/* towerpack tests: a hand GPT-2 BPE vocabulary in GPT-2's two files, for
 * the suites that load one (test_tokenizer.c, test_dataflow_text.c,
 * test_proc_tp_train_bpe.c): GPT-2's byte-to-unicode map, and
 * encoder.json + vocab.bpe with byte b as id b and the merges by rank as
 * ids 256... Include after Criterion. */
#ifndef TP_TESTS_BPE_TESTUTIL_H
#define TP_TESTS_BPE_TESTUTIL_H

#include <stdio.h>

/* GPT-2's published byte-to-unicode map, as UTF-8 into out: printable
 * Latin-1 stands for itself, the other 68 bytes are U+0100.. in order. */
static inline void bpe_byte_char(int b, char out[4]) {
    int cp = b, n = 0;
#define BPE_PRINTABLE(x) (((x) >= '!' && (x) <= '~') || ((x) >= 0xA1 && (x) <= 0xAC) || \
                          ((x) >= 0xAE && (x) <= 0xFF))
    if (!BPE_PRINTABLE(b)) {
        for (int c = 0; c < b; c++)
            n += !BPE_PRINTABLE(c);
        cp = 256 + n;
    }
#undef BPE_PRINTABLE
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* encoder.json at enc and vocab.bpe at bpe: byte b is id b, merges[r]
 * (a pair of tokens, "Ġ" is GPT-2's space) is id 256 + r; `extra`, when
 * not NULL, is one more encoder.json entry (`"<|endoftext|>": 300`: ids
 * may leave gaps). The test fails when a file cannot be written. */
static inline void bpe_write_vocab(const char *enc, const char *bpe,
                                   const char *const merges[][2], int nmerges,
                                   const char *extra) {
    FILE *e = fopen(enc, "wb"), *m = fopen(bpe, "wb");
    cr_assert(e && m, "%s, %s", enc, bpe);
    fputs("{", e);
    char c[4];
    for (int b = 0; b < 256; b++) {
        bpe_byte_char(b, c);
        fprintf(e, b == '"' || b == '\\' ? "\"\\%s\": %d" : "\"%s\": %d", c, b);
        fputs(b < 255 || nmerges || extra ? ", " : "", e);
    }
    fputs("#version: 0.2\n", m);
    for (int r = 0; r < nmerges; r++) {
        fprintf(e, "\"%s%s\": %d%s", merges[r][0], merges[r][1], 256 + r,
                r + 1 < nmerges || extra ? ", " : "");
        fprintf(m, "%s %s\n", merges[r][0], merges[r][1]);
    }
    fprintf(e, "%s}", extra ? extra : "");
    cr_assert_eq(fclose(e) | fclose(m), 0, "%s, %s", enc, bpe);
}

#endif
