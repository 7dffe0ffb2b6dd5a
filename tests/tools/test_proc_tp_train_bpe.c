/* towerpack tests: tp-train --model gpt on GPT-2's BPE tokens
 * (`--data text:FILE,vocab=encoder.json,merges=vocab.bpe`), run as a user
 * runs it: the token embedding takes the tokenizer's rows, validation_bpb
 * is bits per byte through the validation split's bytes per token, the
 * checkpoints name the tokenizer's files, and validation data of other
 * tokens are refused. Own executable: it forks and execs tp-train. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "proc_testutil.h"
#include <towerpack/dataflow_lib.h>

static char s_dir[64];
static char s_file[128];
static char s_out[1 << 20];

/* A repeated sentence, 36 kB, as test_proc_tp_train_gpt.c's. */
static void s_setup(void) {
    snprintf(s_dir, sizeof s_dir, "/tmp/tp-train-bpe-XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
    snprintf(s_file, sizeof s_file, "%s/corpus.txt", s_dir);
    FILE *f = fopen(s_file, "wb");
    cr_assert_not_null(f, "%s", s_file);
    for (int i = 0; i < 800; i++)
        fputs("the quick brown fox jumps over the lazy dog. ", f);
    cr_assert_eq(fclose(f), 0, "%s", s_file);
}

static void s_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", s_dir);
}

static int s_run(char *const *argv) {
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    char *full[64] = {TP_BINARY_DIR "/bin/tp-train"};
    for (int i = 1; i < 63 && (full[i] = argv[i]); i++) {}
    return pu_run(full, env, s_out, sizeof s_out);
}

static json_t *s_stats(const char *logdir) {
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s: %s", path, err.text);
    return j;
}

static double s_num(json_t *rec, const char *key) {
    json_t *v = json_object_get(rec, key);
    cr_assert(json_is_number(v), "stats.json has no number '%s'", key);
    return json_number_value(v);
}

TestSuite(tp_train_bpe, .init = s_setup, .fini = s_teardown, .timeout = 180);

/* A hand vocabulary in GPT-2's files for the corpus's sentence: byte b is
 * id b, six merges ("Ġ" is GPT-2's space) are 256..261. */
static void s_write_bpe_vocab(const char *enc, const char *bpe) {
    static const char *const merges[][2] = {{"h", "e"}, {"t", "he"}, {"Ġ", "the"},
                                            {"o", "x"}, {"Ġ", "f"}, {"Ġf", "ox"}};
    FILE *e = fopen(enc, "wb"), *m = fopen(bpe, "wb");
    cr_assert(e && m);
    fputs("{", e);
    for (int b = 0, n = 0; b < 256; b++) {
        /* GPT-2's byte-to-unicode map */
        int pr = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = pr ? b : 256 + n++;
        if (cp < 0x80)
            fprintf(e, b == '"' || b == '\\' ? "\"\\%c\": %d, " : "\"%c\": %d, ", cp, b);
        else
            fprintf(e, "\"%c%c\": %d, ", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F), b);
    }
    fputs("#version: 0.2\n", m);
    for (int r = 0; r < 6; r++) {
        fprintf(e, "%s\"%s%s\": %d", r ? ", " : "", merges[r][0], merges[r][1], 256 + r);
        fprintf(m, "%s %s\n", merges[r][0], merges[r][1]);
    }
    fputs("}", e);
    cr_assert_eq(fclose(e) | fclose(m), 0);
}

/* The embedding takes the tokenizer's 262 rows, validation_bpb is bits per
 * byte through the validation split's bytes per token, the checkpoint
 * names the files, and a --test-data of other tokens is refused. */
Test(tp_train_bpe, embedding_bits_per_byte_and_metadata) {
    char enc[128], bpe[128], logdir[128], data[512], ckpt[160];
    snprintf(enc, sizeof enc, "%s/encoder.json", s_dir);
    snprintf(bpe, sizeof bpe, "%s/vocab.bpe", s_dir);
    snprintf(logdir, sizeof logdir, "%s/bpe", s_dir);
    s_write_bpe_vocab(enc, bpe);
    snprintf(data, sizeof data, "text:%s,vocab=%s,merges=%s", s_file, enc, bpe);
    char *argv[] = {"tp-train", "--model", "gpt", "--data", data, "--context", "16",
                    "--layers", "1", "--heads", "2", "--embed", "32", "--batch", "8",
                    "--towers", "1", "--threads", "1", "--epochs", "1",
                    "--steps-per-epoch", "30", "--stats", "off", "--no-tensorboard",
                    "--logdir", logdir, NULL};
    int rc = s_run(argv);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
    cr_assert(strstr(s_out, "context 16 (GPT-2 BPE tokens, vocabulary 262)"), "%s", s_out);
    /* bits per byte: nats per token / ln 2 / the validation split's bytes
     * per token */
    tp_text_info_t vi;
    char val[600];
    snprintf(val, sizeof val, "%s,context=16,split=val", data);
    cr_assert_eq(tp_df_text_spec_info(val, 1, &vi), TP_OK, "%s", tp_last_error());
    cr_assert_gt(vi.bytes_per_token, 1.2, "the merges shorten the text");
    json_t *j = s_stats(logdir);
    json_t *last = json_array_get(j, json_array_size(j) - 1);
    double vcost = s_num(last, "validation_cost"), bpb = s_num(last, "validation_bpb");
    cr_assert_float_eq(bpb, vcost / log(2.0) / vi.bytes_per_token, 1e-9 * (1 + bpb),
                       "bpb %g, cost %g nats a token, %g bytes a token", bpb, vcost,
                       vi.bytes_per_token);
    json_decref(j);
    /* wte is [262, 32]; the metadata names the tokens and the files */
    snprintf(ckpt, sizeof ckpt, "%s/model-30.safetensors", logdir);
    FILE *f = fopen(ckpt, "rb");
    cr_assert_not_null(f, "%s", ckpt);
    uint64_t hn = 0;
    cr_assert_eq(fread(&hn, 8, 1, f), 1);
    char *h = calloc(1, hn + 1);
    cr_assert_eq(fread(h, 1, hn, f), hn);
    fclose(f);
    json_error_t err;
    json_t *hdr = json_loads(h, 0, &err);
    cr_assert_not_null(hdr, "%s", err.text);
    json_t *shape = json_object_get(json_object_get(hdr, "wte"), "shape");
    cr_assert_eq(json_integer_value(json_array_get(shape, 0)), 262);
    cr_assert_eq(json_integer_value(json_array_get(shape, 1)), 32);
    json_t *meta = json_object_get(hdr, "__metadata__");
    cr_assert_str_eq(json_string_value(json_object_get(meta, "tokens")), "gpt2-bpe");
    cr_assert_str_eq(json_string_value(json_object_get(meta, "vocab_size")), "262");
    cr_assert(strstr(json_string_value(json_object_get(meta, "merges")), "/vocab.bpe"));
    json_decref(hdr);
    free(h);
    /* validation data of other tokens (bytes) are refused */
    char test_data[160];
    snprintf(test_data, sizeof test_data, "text:%s", s_file);
    snprintf(logdir, sizeof logdir, "%s/bpe-mixed", s_dir);
    char *mixed[] = {"tp-train", "--model", "gpt", "--data", data, "--test-data", test_data,
                     "--context", "16", "--layers", "1", "--embed", "32", "--heads", "2",
                     "--epochs", "1", "--steps-per-epoch", "2", "--logdir", logdir, NULL};
    cr_assert_neq(s_run(mixed), 0);
    cr_assert(strstr(s_out, "not --data's (262)"), "%s", s_out);
}
