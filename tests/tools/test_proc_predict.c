/* towerpack tests: tp-predict run as a user runs it. A short tp-train run
 * records a validation accuracy in stats.json; tp-predict on the same
 * checkpoint and data gives the same accuracy, finds the model from the
 * checkpoint, writes its predictions and picture, and names what is wrong
 * with bad input. Own executable: it forks and execs. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proc_testutil.h"
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "tools/named_ckpt_testutil.h"
#include "dir_testutil.h"

#define TEST_SPEC "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 2"

static char s_dir[64];
static char s_out[1 << 20];

static void s_setup(void) {
    dt_make(s_dir, sizeof s_dir, "tp-predict-cli");
}

static void s_teardown(void) {
    dt_remove(s_dir);
}

/* Run bin/<tool> with argv (argv[0] ignored), stdout+stderr into s_out;
 * the exit status. */
static int s_run(const char *tool, char *const *argv) {
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    char path[256];
    snprintf(path, sizeof path, TP_BINARY_DIR "/bin/%s", tool);
    char *full[64] = {path};
    for (int i = 1; i < 63 && (full[i] = argv[i]); i++) {}
    return pu_run(full, env, s_out, sizeof s_out);
}

/* The last JSON object line of s_out. */
static json_t *s_json(void) {
    char *last = NULL;
    for (char *p = s_out; (p = strchr(p, '{')); p++)
        if (p == s_out || p[-1] == '\n') {
            last = p;
            break;
        }
    cr_assert_not_null(last, "no JSON in: %s", s_out);
    json_error_t err;
    json_t *j = json_loads(last, JSON_DISABLE_EOF_CHECK, &err);
    cr_assert_not_null(j, "%s: %s", err.text, last);
    return j;
}

Test(tp_predict, accuracy_equals_the_validation_that_training_recorded,
     .init = s_setup, .fini = s_teardown) {
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/run", s_dir);
    char *train[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "15",
                     "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir, NULL};
    cr_assert_eq(s_run("tp-train", train), 0, "%s", s_out);
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_error_t err;
    json_t *stats = json_load_file(path, 0, &err);
    cr_assert_not_null(stats, "%s", err.text);
    double val = json_real_value(json_object_get(json_array_get(stats, json_array_size(stats) - 1),
                                                 "validation_accuracy"));
    json_decref(stats);
    cr_assert(val > 0.3, "validation accuracy %g", val);

    /* the log directory: its latest checkpoint, the model it records */
    char csv[192], png[192];
    snprintf(csv, sizeof csv, "%s/pred.csv", s_dir);
    snprintf(png, sizeof png, "%s/confusion.png", s_dir);
    char *pred[] = {"tp-predict", "--load", logdir, "--spec", TEST_SPEC, "--json",
                    "--output", csv, "--top-k", "3", "--confusion", png, NULL};
    cr_assert_eq(s_run("tp-predict", pred), 0, "%s", s_out);
    json_t *j = s_json();
    double acc = json_real_value(json_object_get(j, "accuracy"));
    cr_expect(fabs(acc - val) < 1e-6, "tp-predict %.7f, stats.json %.7f", acc, val);
    cr_expect_eq(json_integer_value(json_object_get(j, "samples")), 1000);
    cr_expect(json_real_value(json_object_get(j, "samples_per_s")) > 0);
    cr_expect_str_eq(json_string_value(json_object_get(j, "model")), "mlp");
    json_t *conf = json_object_get(j, "confusion");
    cr_assert_eq(json_array_size(conf), 10);
    int64_t total = 0, diag = 0;
    for (size_t r = 0; r < 10; r++)
        for (size_t c = 0; c < 10; c++) {
            int64_t v = json_integer_value(json_array_get(json_array_get(conf, r), c));
            total += v;
            diag += r == c ? v : 0;
        }
    cr_expect_eq(total, 1000);
    cr_expect_eq(diag, json_integer_value(json_object_get(j, "correct")));
    cr_expect_eq(json_array_size(json_object_get(j, "per_class_accuracy")), 10);
    json_decref(j);

    /* the predictions: a header and one line per image, top 3 */
    FILE *f = fopen(csv, "r");
    cr_assert_not_null(f);
    char line[512];
    int lines = 0;
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_expect_str_eq(line, "index,class1,prob1,class2,prob2,class3,prob3,label\n");
    while (fgets(line, sizeof line, f))
        lines++;
    fclose(f);
    cr_expect_eq(lines, 1000);
    /* the picture is a PNG */
    f = fopen(png, "rb");
    cr_assert_not_null(f, "no %s", png);
    unsigned char sig[8] = {0};
    cr_expect_eq(fread(sig, 1, 8, f), 8);
    fclose(f);
    cr_expect_eq(memcmp(sig, "\x89PNG\r\n\x1a\n", 8), 0);

    /* JSON lines, and the text report */
    char jl[192];
    snprintf(jl, sizeof jl, "%s/pred.jsonl", s_dir);
    char *pred2[] = {"tp-predict", "--load", logdir, "--spec", TEST_SPEC, "--output", jl,
                     "--confusion", "none", NULL};
    cr_assert_eq(s_run("tp-predict", pred2), 0, "%s", s_out);
    cr_expect(strstr(s_out, "accuracy: 0."), "%s", s_out);
    cr_expect(strstr(s_out, "confusion (rows: true class"), "%s", s_out);
    f = fopen(jl, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof line, f));
    fclose(f);
    json_t *first = json_loads(line, 0, &err);
    cr_assert_not_null(first, "%s", line);
    cr_expect_eq(json_integer_value(json_object_get(first, "index")), 0);
    cr_expect_eq(json_array_size(json_object_get(first, "classes")), 1);
    cr_expect_eq(json_integer_value(json_object_get(first, "label")), 9);
    json_decref(first);
}

/* The logits of every line of a tp-predict --logits JSON lines file into
 * v[n * 10]; the line count. */
static int s_logits(const char *path, double *v, int n) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[1024];
    int rows = 0;
    while (rows < n && fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        cr_assert_not_null(j, "%s: %s", err.text, line);
        json_t *l = json_object_get(j, "logits");
        cr_assert_eq(json_array_size(l), 10, "%s", line);
        for (int c = 0; c < 10; c++)
            v[rows * 10 + c] = json_number_value(json_array_get(l, c));
        json_decref(j);
        rows++;
    }
    fclose(f);
    return rows;
}

/* tp-predict --bf16 on a trained checkpoint: the products on bf16
 * operands (the report says so), every logit moved by bf16's rounding
 * (measured: at most 0.016 on logits up to 6.6, 998 of 1000 top-1 the
 * same, accuracy 0.664 against fp32's 0.662), the accuracy within 0.01
 * of fp32's. Where oneDNN sees no bf16 instructions (capped, as on a CPU
 * without them): a warning, and fp32's logits bit for bit. */
Test(tp_predict, bf16_predicts_as_fp32_within_its_rounding, .init = s_setup,
     .fini = s_teardown) {
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/run", s_dir);
    char *train[] = {"tp-train", "--model", "mlp", "--epochs", "1", "--steps-per-epoch", "15",
                     "--threads", "1", "--test-spec", TEST_SPEC, "--logdir", logdir, NULL};
    cr_assert_eq(s_run("tp-train", train), 0, "%s", s_out);
    const int has = tp_backend_cpu_bf16(1);
    static double logits[3][1000 * 10];
    double acc[3];
    for (int k = 0; k < 3; k++) {
        if (k == 2)
            setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE", 1);
        char jl[192];
        snprintf(jl, sizeof jl, "%s/pred%d.jsonl", s_dir, k);
        char *pred[] = {"tp-predict", "--load", logdir, "--spec", TEST_SPEC, "--json",
                        "--logits", "--output", jl, "--confusion", "none",
                        k ? "--bf16" : NULL, NULL};
        cr_assert_eq(s_run("tp-predict", pred), 0, "%s", s_out);
        json_t *j = s_json();
        acc[k] = json_real_value(json_object_get(j, "accuracy"));
        const int on = json_is_true(json_object_get(j, "bf16"));
        json_decref(j);
        cr_assert_eq(on, k == 1 && has, "run %d: bf16 %d\n%s", k, on, s_out);
        cr_assert_eq(strstr(s_out, "this CPU has no bf16 dot products") != NULL,
                     k == 2 || (k == 1 && !has), "run %d:\n%s", k, s_out);
        cr_assert_eq(s_logits(jl, logits[k], 1000), 1000);
    }
    unsetenv("ONEDNN_MAX_CPU_ISA");
    double most = 0, scale = 0;
    int agree = 0;
    for (int r = 0; r < 1000; r++) {
        int a = 0, b = 0;
        for (int c = 0; c < 10; c++) {
            const double x = logits[0][r * 10 + c], y = logits[1][r * 10 + c];
            most = fabs(x - y) > most ? fabs(x - y) : most;
            scale = fabs(x) > scale ? fabs(x) : scale;
            a = x > logits[0][r * 10 + a] ? c : a;
            b = y > logits[1][r * 10 + b] ? c : b;
        }
        agree += a == b;
    }
    cr_assert_eq(memcmp(logits[2], logits[0], sizeof logits[0]), 0,
                 "bf16 unavailable, yet not fp32's logits");
    if (!has)
        return;
    cr_assert(most > 0, "--bf16 gave fp32's logits: it did not run bf16");
    cr_assert(most < 0.02 * scale, "--bf16 moved a logit by %g (largest %g)", most, scale);
    cr_assert(agree >= 990, "top-1 the same for %d of 1000", agree);
    cr_assert(fabs(acc[1] - acc[0]) <= 0.01, "accuracy: bf16 %g, fp32 %g", acc[1], acc[0]);
    cr_log_info("bf16: logits within %g (largest %g), top-1 %d/1000, accuracy %g vs %g", most,
                scale, agree, acc[1], acc[0]);
}

static tp_status_t s_net(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = tp_flatten(t, "flat", tp_cast(t, "x", in[0], 1.0f / 255));
    tp_node_t *logits = tp_fc(t, "linear", x, 10, 1);
    tp_tower_add_output(t, "logits", logits);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

Test(tp_predict, bad_input_says_what_and_where, .init = s_setup, .fini = s_teardown) {
    /* a checkpoint that does not record its model */
    tp_input_desc_t in[2] = {{"image", TP_UINT8, 3, {-1, 28, 28}}, {"label", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {in, 2, s_net, NULL, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = 0;
    mc.infer_batch = 4;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    char ckpt[192];
    snprintf(ckpt, sizeof ckpt, "%s/old.safetensors", s_dir);
    cr_assert_eq(tp_checkpoint_save(m, ckpt, NULL), TP_OK);
    tp_model_destroy(&m);
    char *a1[] = {"tp-predict", "--load", ckpt, "--data", "fashion-mnist", NULL};
    cr_expect_eq(s_run("tp-predict", a1), 1);
    cr_expect(strstr(s_out, "does not record its model") && strstr(s_out, "--model"), "%s", s_out);
    /* the wrong model for it: the variables, with both shapes */
    char *a2[] = {"tp-predict", "--load", ckpt, "--model", "mlp", "--data", "fashion-mnist", NULL};
    cr_expect_eq(s_run("tp-predict", a2), 1);
    cr_expect(strstr(s_out, "linear/W") && strstr(s_out, "float32[784,10] in the file") &&
              strstr(s_out, "float32[256,10] in the model"), "%s", s_out);
    char *a3[] = {"tp-predict", "--load", ckpt, "--model", "transformer", "--data", "fashion-mnist", NULL};
    cr_expect_eq(s_run("tp-predict", a3), 1);
    cr_expect(strstr(s_out, "'transformer'") && strstr(s_out, "cnn-bn"), "%s", s_out);
    /* a log directory with no checkpoint */
    char *a4[] = {"tp-predict", "--load", s_dir, "--model", "mlp", "--data", "fashion-mnist", NULL};
    snprintf(ckpt, sizeof ckpt, "%s/old.safetensors", s_dir);
    unlink(ckpt);
    cr_expect_eq(s_run("tp-predict", a4), 1);
    cr_expect(strstr(s_out, "no checkpoint"), "%s", s_out);
    /* a corrupt data file names the file */
    char bad[192];
    snprintf(bad, sizeof bad, "%s/images.idx", s_dir);
    FILE *f = fopen(bad, "wb");
    cr_assert_not_null(f);
    fwrite("\x00\x00\x08\x03\x00\x00\x00\x05\x00\x00\x00\x1c\x00\x00\x00\x1c" "abc", 1, 19, f);
    fclose(f);
    tp_model_desc_t zoo = {tp_zoo_inputs(), 2, tp_zoo_find("mlp")->build, NULL, NULL};
    m = tp_model_new(&zoo, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_model_set_name(m, "mlp"), TP_OK);
    snprintf(ckpt, sizeof ckpt, "%s/mlp.safetensors", s_dir);
    cr_assert_eq(tp_checkpoint_save(m, ckpt, NULL), TP_OK);
    tp_model_destroy(&m);
    char data[256];
    snprintf(data, sizeof data, "idx:%s", bad);
    char *a5[] = {"tp-predict", "--load", ckpt, "--data", data, NULL};
    cr_expect_eq(s_run("tp-predict", a5), 1);
    cr_expect(strstr(s_out, "images.idx"), "%s", s_out);
    /* a file that is no checkpoint */
    char *a7[] = {"tp-predict", "--load", TP_SOURCE_DIR "/README.md", "--data", "fashion-mnist", NULL};
    cr_expect_eq(s_run("tp-predict", a7), 1);
    cr_expect(strstr(s_out, "README.md"), "%s", s_out);
    char *a6[] = {"tp-predict", "--data", data, NULL};
    cr_expect_eq(s_run("tp-predict", a6), 2);
    cr_expect(strstr(s_out, "--load is required"), "%s", s_out);
    /* a number flag names itself and what it got: "12abc" was taken for
     * 12, and a bad one got a line listing every flag's range */
    char *b1[] = {"tp-predict", "--load", ckpt, "--data", "fashion-mnist", "--batch", "12abc",
                  NULL};
    cr_expect_eq(s_run("tp-predict", b1), 2);
    cr_expect(strstr(s_out, "bad flag: --batch: '12abc' is not an integer in [1, 65536]"),
              "%s", s_out);
    char *b2[] = {"tp-predict", "--load", ckpt, "--data", "fashion-mnist", "--top-k", "0", NULL};
    cr_expect_eq(s_run("tp-predict", b2), 2);
    cr_expect(strstr(s_out, "bad flag: --top-k: '0' is not an integer in [1, 64]") &&
              !strstr(s_out, "--batch"), "%s", s_out);
    /* an --output that cannot be made says why */
    char nodir[256];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/out.csv", s_dir);
    char *b3[] = {"tp-predict", "--load", ckpt, "--data", "fashion-mnist", "--output", nodir,
                  "--confusion", "none", NULL};
    cr_expect_eq(s_run("tp-predict", b3), 1);
    cr_expect(strstr(s_out, "--output: cannot write") && strstr(s_out, nodir) &&
              strstr(s_out, "No such file or directory"), "%s", s_out);
    /* so does a --confusion picture, before the prediction pass (it was
     * cairo's "error while writing to output stream", after the pass) */
    char nopng[256], said[400];
    snprintf(nopng, sizeof nopng, "%s/no/such/dir/c.png", s_dir);
    char *b4[] = {"tp-predict", "--load", ckpt, "--data", "fashion-mnist", "--confusion", nopng,
                  NULL};
    cr_expect_eq(s_run("tp-predict", b4), 1);
    snprintf(said, sizeof said, "--confusion: cannot write %s: %s/no/such/dir: No such file "
             "or directory", nopng, s_dir);
    cr_expect(strstr(s_out, said), "%s", s_out);
    cr_expect(!strstr(s_out, "accuracy"), "refused after the pass:\n%s", s_out);
    /* a folder given as the picture */
    char *b5[] = {"tp-predict", "--load", ckpt, "--data", "fashion-mnist", "--confusion", s_dir,
                  NULL};
    cr_expect_eq(s_run("tp-predict", b5), 1);
    snprintf(said, sizeof said, "--confusion: cannot write %s: Is a directory", s_dir);
    cr_expect(strstr(s_out, said) && !strstr(s_out, "accuracy"), "%s", s_out);
    /* the default picture beside the checkpoint, where it cannot be made
     * (a folder in its place here; a folder this user may not write in
     * for real): said before the pass, and the pass's report kept (it
     * failed after the pass, the report lost) */
    char dflt[300];
    snprintf(dflt, sizeof dflt, "%s/mlp.confusion.png", s_dir);
    cr_assert_eq(mkdir(dflt, 0755), 0);
    char *b6[] = {"tp-predict", "--load", ckpt, "--spec", TEST_SPEC, "--json", NULL};
    cr_expect_eq(s_run("tp-predict", b6), 0, "%s", s_out);
    snprintf(said, sizeof said, "warning: no confusion picture: cannot write %s: Is a directory",
             dflt);
    cr_expect(strstr(s_out, said), "%s", s_out);
    json_t *j = s_json();
    cr_expect_eq(json_integer_value(json_object_get(j, "samples")), 1000);
    cr_expect_null(json_object_get(j, "confusion_png"), "%s", s_out);
    cr_expect_not_null(json_object_get(j, "confusion"), "%s", s_out);
    json_decref(j);
    rmdir(dflt);
}

/* Record r's image: bytes no other record has (a xorshift stream). */
static void s_pixels(int64_t r, uint8_t *p) {
    uint64_t x = (uint64_t)(r + 1) * 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < 784; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[k] = (uint8_t)(x >> 56);
    }
}

/* A towerpack record file of n images and labels (tp_records_save, the
 * writer tp-bench uses) with record `bad`'s header zeroed: the magic and
 * everything up to its pixels. `chunk`: records per LMDB value. */
static void s_corrupt_records(const char *path, int n, int64_t bad, size_t chunk) {
    tp_datapoint_t *dps[64];
    cr_assert(n <= 64);
    for (int r = 0; r < n; r++) {
        tp_tensor_t img, lab;
        int64_t is[2] = {28, 28};
        cr_assert_eq(tp_tensor_init(&img, TP_UINT8, 2, is), TP_OK);
        cr_assert_eq(tp_tensor_init(&lab, TP_INT32, 0, NULL), TP_OK);
        s_pixels(r, img.data);
        *(int32_t *)lab.data = r % 10;
        dps[r] = tp_datapoint_new(0);
        cr_assert_eq(tp_datapoint_append(dps[r], &img), TP_OK);
        cr_assert_eq(tp_datapoint_append(dps[r], &lab), TP_OK);
    }
    tp_dataflow_t *df = tp_df_from_list(dps, (size_t)n, 0);
    cr_assert_not_null(df);
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK);
    tp_records_opts_t o;
    tp_records_opts_init(&o);
    o.chunk = chunk;
    int64_t count = 0;
    cr_assert_eq(tp_records_save(df, path, &o, &count), TP_OK, "%s", tp_last_error());
    cr_assert_eq(count, n);
    tp_dataflow_destroy(&df);
    /* find record bad's pixels in the file, zero the header before them
     * (the wire header and the two components' headers: 72 bytes) */
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    cr_assert(size > 0);
    uint8_t *buf = malloc((size_t)size), want[784];
    cr_assert_not_null(buf);
    rewind(f);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    s_pixels(bad, want);
    long at = -1;
    for (long i = 72; i + 784 <= size && at < 0; i++)
        if (buf[i] == want[0] && !memcmp(buf + i, want, 784))
            at = i;
    cr_assert(at >= 72, "record %lld's pixels not found in %s", (long long)bad, path);
    uint32_t magic;
    memcpy(&magic, buf + at - 72, 4);
    cr_assert_eq(magic, TP_WIRE_MAGIC, "the record's header is 72 bytes before its pixels");
    memset(buf + at - 72, 0, 72);
    rewind(f);
    cr_assert_eq(fwrite(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    free(buf);
}

/* A record file with one corrupt record: tp-predict fails naming the file
 * and the record (its key, or its index inside a chunk). */
Test(tp_predict, a_corrupt_record_names_the_file_and_the_record, .init = s_setup,
     .fini = s_teardown) {
    tp_model_desc_t zoo = {tp_zoo_inputs(), 2, tp_zoo_find("mlp")->build, NULL, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = 0;
    mc.infer_batch = 4;
    tp_model_t *m = tp_model_new(&zoo, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_model_set_name(m, "mlp"), TP_OK);
    char ckpt[192], path[192], data[256];
    snprintf(ckpt, sizeof ckpt, "%s/mlp.safetensors", s_dir);
    cr_assert_eq(tp_checkpoint_save(m, ckpt, NULL), TP_OK);
    tp_model_destroy(&m);
    /* the sound file first: every record predicted */
    snprintf(path, sizeof path, "%s/good.lmdb", s_dir);
    tp_dataflow_t *df = NULL;
    {
        tp_datapoint_t *dps[1];
        tp_tensor_t img, lab;
        int64_t is[2] = {28, 28};
        cr_assert_eq(tp_tensor_init(&img, TP_UINT8, 2, is), TP_OK);
        cr_assert_eq(tp_tensor_init(&lab, TP_INT32, 0, NULL), TP_OK);
        s_pixels(0, img.data);
        *(int32_t *)lab.data = 3;
        dps[0] = tp_datapoint_new(0);
        cr_assert_eq(tp_datapoint_append(dps[0], &img), TP_OK);
        cr_assert_eq(tp_datapoint_append(dps[0], &lab), TP_OK);
        df = tp_df_from_list(dps, 1, 0);
        cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK);
        cr_assert_eq(tp_records_save(df, path, NULL, NULL), TP_OK, "%s", tp_last_error());
        tp_dataflow_destroy(&df);
    }
    snprintf(data, sizeof data, "lmdb:%s", path);
    char *ok[] = {"tp-predict", "--load", ckpt, "--data", data, "--json", "--confusion",
                  "none", NULL};
    cr_assert_eq(s_run("tp-predict", ok), 0, "%s", s_out);
    json_t *j = s_json();
    cr_expect_eq(json_integer_value(json_object_get(j, "samples")), 1);
    json_decref(j);

    /* records in chunks of 64 (tp_records_save's default): record 37 */
    snprintf(path, sizeof path, "%s/chunked.lmdb", s_dir);
    s_corrupt_records(path, 50, 37, 64);
    snprintf(data, sizeof data, "lmdb:%s", path);
    char *a1[] = {"tp-predict", "--load", ckpt, "--data", data, "--confusion", "none", NULL};
    cr_expect_eq(s_run("tp-predict", a1), 1);
    cr_expect(strstr(s_out, path) && strstr(s_out, "record #37") &&
              strstr(s_out, "bad magic"), "%s", s_out);
    /* one record a value: its key */
    snprintf(path, sizeof path, "%s/single.lmdb", s_dir);
    s_corrupt_records(path, 30, 21, 1);
    snprintf(data, sizeof data, "lmdb:%s", path);
    char *a2[] = {"tp-predict", "--load", ckpt, "--data", data, "--confusion", "none", NULL};
    cr_expect_eq(s_run("tp-predict", a2), 1);
    cr_expect(strstr(s_out, path) && strstr(s_out, "record 0000000021") &&
              strstr(s_out, "bad magic"), "%s", s_out);
}

/* Must hold: what tp-predict cannot run is refused naming it and the tool
 * that can: a gpt's checkpoint (tp-generate --prompt) and a GAN's
 * (tp-generate --count), before a model is built (whose own error would
 * be about input shapes); a text: source given to an image classifier (it
 * is a gpt's data, not grey images); a checkpoint cut in the middle, named
 * as cut short. */
Test(tp_predict, a_gpt_a_gan_text_data_and_a_cut_checkpoint_are_refused_by_name,
     .init = s_setup, .fini = s_teardown) {
    char ckpt[128], text[128], data[160];
    static const char *const names[] = {"gpt", "dcgan"};
    static const char *const said[] = {"holds model 'gpt', a language model",
                                       "holds model 'dcgan', a GAN"};
    static const char *const use[] = {"--prompt TEXT", "--count N --output FILE.npy"};
    for (int i = 0; i < 2; i++) {
        snprintf(ckpt, sizeof ckpt, "%s/%s.safetensors", s_dir, names[i]);
        tt_named_checkpoint(names[i], ckpt);
        char *a[] = {"tp-predict", "--load", ckpt, "--data", "fashion-mnist", NULL};
        cr_expect_eq(s_run("tp-predict", a), 1, "%s", s_out);
        cr_expect(strstr(s_out, ckpt) && strstr(s_out, said[i]) &&
                      strstr(s_out, "tp-generate") && strstr(s_out, use[i]), "%s", s_out);
    }
    snprintf(ckpt, sizeof ckpt, "%s/mlp.safetensors", s_dir);
    tt_named_checkpoint("mlp", ckpt);
    snprintf(text, sizeof text, "%s/corpus.txt", s_dir);
    FILE *f = fopen(text, "w");
    cr_assert_not_null(f);
    fputs("the quick brown fox jumps over the lazy dog\n", f);
    fclose(f);
    snprintf(data, sizeof data, "text:%s", text);
    char *t[] = {"tp-predict", "--load", ckpt, "--data", data, NULL};
    cr_expect_eq(s_run("tp-predict", t), 1, "%s", s_out);
    cr_expect(strstr(s_out, "corpus.txt' is text (a gpt's data)") &&
                  !strstr(s_out, "grey images"), "%s", s_out);
    struct stat st;
    cr_assert_eq(stat(ckpt, &st), 0);
    cr_assert_eq(truncate(ckpt, st.st_size / 2), 0);
    char *cut[] = {"tp-predict", "--load", ckpt, "--data", "fashion-mnist", NULL};
    cr_expect_eq(s_run("tp-predict", cut), 1, "%s", s_out);
    cr_expect(strstr(s_out, "mlp.safetensors") && strstr(s_out, "cut short"), "%s", s_out);
}
