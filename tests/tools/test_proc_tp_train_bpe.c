/* towerpack tests: tp-train --model gpt on GPT-2's BPE tokens
 * (`--data text:FILE,vocab=encoder.json,merges=vocab.bpe`), run as a user
 * runs it: the token embedding takes the tokenizer's rows, validation_bpb
 * is bits per byte through the validation split's bytes per token, the
 * checkpoints name the tokenizer's files, and validation data of other
 * tokens are refused; the per-epoch sample and tp-generate read BPE
 * checkpoints through the tokenizer they name. Own executable: it forks
 * and execs tp-train and tp-generate. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "proc_testutil.h"
#include "tools/tp_train_testutil.h"
#include "dataflow/bpe_testutil.h"
#include <towerpack/dataflow_lib.h>

static char s_dir[64];
static char s_file[128];
static char s_out[1 << 20];

/* the repeated sentence (tpt_make_corpus) */
static void s_setup(void) {
    tpt_make_corpus(s_dir, sizeof s_dir, s_file, sizeof s_file, "tp-train-bpe");
}

static void s_teardown(void) { tpt_remove_dir(s_dir); }

static int s_run(char *const *argv) { return tpt_run(argv, s_out, sizeof s_out); }

static int s_generate(char *const *argv) { return tpt_generate(argv, s_out, sizeof s_out); }

TestSuite(tp_train_bpe, .init = s_setup, .fini = s_teardown, .timeout = 180);

/* A hand vocabulary in GPT-2's files for the corpus's sentence: byte b is
 * id b, six merges ("Ġ" is GPT-2's space) are 256..261. */
static void s_write_bpe_vocab(const char *enc, const char *bpe) {
    static const char *const merges[][2] = {{"h", "e"}, {"t", "he"}, {"Ġ", "the"},
                                            {"o", "x"}, {"Ġ", "f"}, {"Ġf", "ox"}};
    bpe_write_vocab(enc, bpe, merges, 6, NULL);
}

/* The vocabulary into s_dir's encoder.json (enc) and vocab.bpe (bpe), and
 * the corpus's --data spec through them into data[size]. */
static void s_bpe_data(char enc[128], char bpe[128], char *data, size_t size) {
    snprintf(enc, 128, "%s/encoder.json", s_dir);
    snprintf(bpe, 128, "%s/vocab.bpe", s_dir);
    s_write_bpe_vocab(enc, bpe);
    snprintf(data, size, "text:%s,vocab=%s,merges=%s", s_file, enc, bpe);
}

/* The embedding takes the tokenizer's 262 rows, validation_bpb is bits per
 * byte through the validation split's bytes per token, the checkpoint
 * names the files, and a --test-data of other tokens is refused. */
Test(tp_train_bpe, embedding_bits_per_byte_and_metadata) {
    char enc[128], bpe[128], logdir[128], data[512], ckpt[160];
    snprintf(logdir, sizeof logdir, "%s/bpe", s_dir);
    s_bpe_data(enc, bpe, data, sizeof data);
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
    json_t *j = tpt_stats(logdir);
    json_t *last = json_array_get(j, json_array_size(j) - 1);
    double vcost = tpt_num(last, "validation_cost"), bpb = tpt_num(last, "validation_bpb");
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

/* A BPE run logs its per-epoch sample (the prompt encoded, the tokens
 * drawn decoded); tp-generate on its checkpoint draws the same text with
 * the cache and without it (greedy, past the context), the learned
 * sentence; a vocabulary file that is gone is refused naming it, and
 * --vocab/--merges give it back. */
Test(tp_train_bpe, samples_and_tp_generate_read_the_tokenizer) {
    char enc[128], bpe[128], logdir[128], data[512], out[2][160];
    snprintf(logdir, sizeof logdir, "%s/gen", s_dir);
    s_bpe_data(enc, bpe, data, sizeof data);
    char *argv[] = {"tp-train", "--model", "gpt", "--data", data, "--context", "16",
                    "--layers", "1", "--heads", "2", "--embed", "32", "--batch", "8",
                    "--towers", "1", "--threads", "1", "--epochs", "1", "--lr", "0.01",
                    "--steps-per-epoch", "150", "--stats", "off", "--no-tensorboard",
                    "--sample-prompt", "the quick", "--sample-tokens", "12",
                    "--sample-temperature", "0", "--logdir", logdir, NULL};
    int rc = s_run(argv);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
    /* the prompt, then 12 tokens decoded: more than 12 bytes (a byte-level
     * sampler would print 12), the words of the sentence */
    const char *line = strstr(s_out, "[TextSample] epoch 1: the quick ");
    cr_assert_not_null(line, "no sample:\n%s", s_out);
    line += strlen("[TextSample] epoch 1: the quick");
    size_t n = strcspn(line, "\n");
    cr_assert_gt(n, 12, "'%.*s': 12 tokens of one byte each", (int)n, line);
    char sample[256];
    snprintf(sample, sizeof sample, "%.*s", (int)n, line);
    cr_assert(strstr(sample, "the"), "'%s'", sample);
    /* greedy, 40 tokens (past the context of 16) with and without the cache */
    char got[2][1024];
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof out[k], "%s/sample%d.txt", s_dir, k);
        char *gen[] = {"tp-generate", "--load", logdir, "--prompt", "the lazy", "--tokens",
                       "40", "--temperature", "0", "--output", out[k],
                       k ? "--no-cache" : NULL, NULL};
        rc = s_generate(gen);
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
        cr_assert(strstr(s_out, "40 tokens after a 6-token prompt"), "%s", s_out);
        cr_assert(strstr(s_out, "GPT-2 BPE tokens, vocabulary 262"), "%s", s_out);
        tpt_read_file(out[k], got[k], sizeof got[k]);
        cr_assert(!strncmp(got[k], "the lazy dog. the quick brown fox jumps over", 44),
                  "not the sentence: '%s'", got[k]);
        cr_assert(strstr(s_out, got[k]), "stdout is not the file's '%s':\n%s", got[k], s_out);
    }
    cr_expect_str_eq(got[0], got[1], "the cache drew other tokens");
    /* the tokenizer's file gone: refused, naming it; the flags give it back */
    char moved[160];
    snprintf(moved, sizeof moved, "%s/moved.json", s_dir);
    cr_assert_eq(rename(enc, moved), 0);
    char *gone[] = {"tp-generate", "--load", logdir, "--prompt", "the lazy", "--tokens", "40",
                    "--temperature", "0", NULL};
    rc = s_generate(gone);
    cr_assert_neq(rc, 0, "%s", s_out);
    cr_assert(strstr(s_out, enc) && strstr(s_out, "--vocab"), "%s", s_out);
    char *flags[] = {"tp-generate", "--load", logdir, "--prompt", "the lazy", "--tokens",
                     "40", "--temperature", "0", "--vocab", moved, "--merges", bpe,
                     "--output", out[1], NULL};
    rc = s_generate(flags);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, s_out);
    tpt_read_file(out[1], got[1], sizeof got[1]);
    cr_expect_str_eq(got[0], got[1]);
}
