/* towerpack tests: training on text. The language-model monitors that
 * need no model (monitor_text.c): validation_bpb from validation_cost,
 * tokens_per_s, the progress bar's tokens/s; their wiring in the launch
 * (tp_train_config_t.tokens_per_sample); and a resumed run on the text
 * source that ends bit-identical. The model is a stand-in until the GPT's
 * ops exist: a next-byte classifier from a window's bytes (one fc). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/launch.h>
#include <towerpack/towerpack.h>

TestSuite(train_text, .timeout = 120);

Test(train_text, bits_per_byte_arithmetic) {
    cr_assert_float_eq(tp_bits_per_byte(8 * M_LN2, 1), 8.0, 1e-12);
    cr_assert_float_eq(tp_bits_per_byte(log(256.0), 0), 8.0, 1e-12, "0: bytes as tokens");
    cr_assert_float_eq(tp_bits_per_byte(1.0, 1), 1.0 / M_LN2, 1e-12);
    /* a BPE token of 4 bytes on average: a quarter of the bits per byte */
    cr_assert_float_eq(tp_bits_per_byte(8 * M_LN2, 4), 2.0, 1e-12);
}

/* ---- a trainer that only counts steps ------------------------------------- */

typedef struct {
    int64_t samples;
    long sleep_us;
} s_stub_t;

static tp_status_t stub_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_stub_t *s = impl;
    if (s->sleep_us)
        usleep((useconds_t)s->sleep_us);
    return TP_OK;
}

static int64_t stub_samples(void *impl) { return ((s_stub_t *)impl)->samples; }

static void stub_destroy(void *impl) { free(impl); }

static const tp_trainer_ops_t s_stub_ops = {.name = "Stub",
                                            .run_step = stub_step,
                                            .samples_per_step = stub_samples,
                                            .destroy = stub_destroy};

/* Puts validation_cost = 0.5 + epoch at each epoch's end, as the
 * InferenceRunner does. */
static tp_status_t cost_trigger(void *impl, tp_trainer_t *tr) {
    tp_trainer_put_scalar(tr, "validation_cost", 0.5 + (double)tp_trainer_epoch_num(tr));
    return TP_OK;
}
static const tp_callback_ops_t s_cost_ops = {.name = "FakeValidation",
                                             .trigger_epoch = cost_trigger};

static tp_trainer_t *s_stub(int64_t samples, long sleep_us) {
    s_stub_t *s = calloc(1, sizeof *s);
    s->samples = samples;
    s->sleep_us = sleep_us;
    tp_trainer_t *tr = tp_trainer_new(&s_stub_ops, s);
    cr_assert_not_null(tr);
    return tr;
}

static void s_add(tp_trainer_t *tr, tp_callback_t *cb) {
    cr_assert_not_null(cb, "%s", tp_last_error());
    cr_assert_eq(tp_trainer_add_callback(tr, &cb), TP_OK, "%s", tp_last_error());
}

Test(train_text, validation_bpb_follows_every_validation_cost) {
    tp_trainer_t *tr = s_stub(4, 0);
    s_add(tr, tp_callback_new(&s_cost_ops, NULL, 0));
    s_add(tr, tp_cb_bits_per_byte(NULL, NULL, 0));
    s_add(tr, tp_cb_bits_per_byte("validation_cost", "validation_bpb_bpe", 4));
    tp_schedule_t sched = {.starting_epoch = 1, .max_epoch = 3, .steps_per_epoch = 2};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    const double *bpb, *bpe;
    size_t n, m;
    cr_assert_eq(tp_trainer_scalar_history(tr, "validation_bpb", &bpb, &n), TP_OK);
    cr_assert_eq(tp_trainer_scalar_history(tr, "validation_bpb_bpe", &bpe, &m), TP_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(m, 3);
    for (size_t e = 0; e < 3; e++) {
        double nats = 0.5 + (double)(e + 1);
        cr_assert_float_eq(bpb[e], nats / M_LN2, 1e-12, "epoch %zu", e + 1);
        cr_assert_float_eq(bpe[e], nats / M_LN2 / 4, 1e-12, "epoch %zu", e + 1);
    }
    tp_trainer_destroy(&tr);
    /* names that would loop are refused */
    cr_assert_null(tp_cb_bits_per_byte("x", "x", 1));
}

Test(train_text, tokens_per_s_is_throughput_times_context) {
    /* 8 samples a step of 64 tokens, 2 ms a step */
    tp_trainer_t *tr = s_stub(8, 2000);
    s_add(tr, tp_cb_throughput());
    s_add(tr, tp_cb_token_throughput(64));
    tp_schedule_t sched = {.starting_epoch = 1, .max_epoch = 2, .steps_per_epoch = 25};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    double tput, tokens;
    cr_assert_eq(tp_trainer_get_scalar(tr, "throughput", &tput), TP_OK);
    cr_assert_eq(tp_trainer_get_scalar(tr, "tokens_per_s", &tokens), TP_OK);
    /* timed separately, a few microseconds apart */
    cr_assert(fabs(tokens / (tput * 64) - 1) < 0.02, "tokens_per_s %g, throughput %g", tokens,
              tput);
    /* 2 ms a step at most: below 8 * 64 / 0.002 = 256000 tokens/s */
    cr_assert(tokens > 1000 && tokens < 256000, "tokens_per_s %g", tokens);
    tp_trainer_destroy(&tr);
    cr_assert_null(tp_cb_token_throughput(0));
}

/* The progress bar's lines (not a terminal: one line per tenth). */
static void s_bar(int64_t tokens, char *out, size_t size) {
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    tp_trainer_t *tr = s_stub(8, 500);
    s_add(tr, tokens ? tp_cb_progress_bar_tokens("", f, tokens) : tp_cb_progress_bar("", f));
    tp_schedule_t sched = {.starting_epoch = 1, .max_epoch = 1, .steps_per_epoch = 20};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    tp_trainer_destroy(&tr);
    rewind(f);
    size_t n = fread(out, 1, size - 1, f);
    out[n] = '\0';
    fclose(f);
}

Test(train_text, progress_bar_shows_tokens_per_s_for_text) {
    char text[8192], plain[8192];
    s_bar(128, text, sizeof text);
    s_bar(0, plain, sizeof plain);
    cr_assert_not_null(strstr(text, " tokens/s"), "%s", text);
    cr_assert_null(strstr(text, "samples/s"), "%s", text);
    cr_assert_not_null(strstr(plain, " samples/s"), "%s", plain);
    cr_assert_null(strstr(plain, "tokens/s"), "%s", plain);
    /* the last line's rate is samples/s x 128 */
    const char *last = strrchr(text, '\n');
    while (last > text && last[-1] != '\n')
        last--;
    double its = 0, tok = 0;
    const char *p = strstr(last, "it/s");
    cr_assert_not_null(p, "%s", last);
    while (p > last && p[-1] != ' ')
        p--;
    while (p > last && p[-1] == ' ')
        p--;
    while (p > last && p[-1] != ' ')
        p--;
    cr_assert_eq(sscanf(p, "%lf it/s %lf tokens/s", &its, &tok), 2, "%s", last);
    cr_assert(its > 0 && fabs(tok / (its * 8 * 128) - 1) < 0.01, "%s", last);
}

/* ---- through the launch, with a stand-in model on the text source ---------- */

#define T 16

/* window -> (float [T] bytes / 255, the byte after the window) */
static tp_status_t s_next_byte(tp_datapoint_t **dp, tp_rng_t *rng, void *user) {
    const int32_t *x = tp_datapoint_get(*dp, 0)->data, *y = tp_datapoint_get(*dp, 1)->data;
    int64_t shape[1] = {T};
    tp_datapoint_t *out = tp_datapoint_new(2);
    cr_assert_not_null(out);
    cr_assert_eq(tp_tensor_init(tp_datapoint_get(out, 0), TP_FLOAT32, 1, shape), TP_OK);
    cr_assert_eq(tp_tensor_init(tp_datapoint_get(out, 1), TP_INT32, 0, NULL), TP_OK);
    for (int t = 0; t < T; t++)
        ((float *)tp_datapoint_get(out, 0)->data)[t] = (float)x[t] / 255.0f;
    *(int32_t *)tp_datapoint_get(out, 1)->data = y[T - 1];
    tp_datapoint_destroy(dp);
    *dp = out;
    return TP_OK;
}

static tp_dataflow_t *s_text(const char *file, const char *split, int batch) {
    char spec[512];
    snprintf(spec, sizeof spec, "text:%s,context=%d,split=%s", file, T, split);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    return tp_df_batch(tp_df_map(df, s_next_byte, NULL, NULL), batch, 0);
}

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *logits = tp_fc(t, "fc", in[0], 256, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    /* a metric: validation puts it as validation_cost (nats per byte) */
    tp_tower_add_metric(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *s_opt(void *user) { return tp_optimizer_adam(0.01, 0.9, 0.999, 1e-8); }

static const tp_input_desc_t s_inputs[] = {
    {"x", TP_FLOAT32, 2, {-1, T}},
    {"label", TP_INT32, 1, {-1}},
};
static const tp_model_desc_t s_model = {s_inputs, 2, s_tower, s_opt, NULL};

Test(train_text, launch_puts_tokens_per_s_and_validation_bpb_in_stats_json) {
    char dir[64] = "/tmp/tp-monitor-text-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char file[128];
    snprintf(file, sizeof file, "%s/corpus.txt", dir);
    FILE *f = fopen(file, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < 400; i++)
        fprintf(f, "line %d: the quick brown fox jumps over the lazy dog.\n", i);
    fclose(f);
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/log", dir);
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &s_model;
    c.batch = 32;
    c.dataflow = s_text(file, "train", 32);
    c.validation = s_text(file, "val", 32);
    c.max_epoch = 2;
    c.logdir = logdir;
    c.threads = 1;
    c.tokens_per_sample = T;
    c.tensorboard = 0;
    c.curves = 0;
    c.save_checkpoints = 0;
    c.stats = "off";
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s", err.text);
    cr_assert_eq(json_array_size(j), 2);
    for (size_t e = 0; e < 2; e++) {
        json_t *r = json_array_get(j, e);
        double cost = json_number_value(json_object_get(r, "validation_cost"));
        double bpb = json_number_value(json_object_get(r, "validation_bpb"));
        double tput = json_number_value(json_object_get(r, "throughput"));
        double tokens = json_number_value(json_object_get(r, "tokens_per_s"));
        cr_assert(cost > 0 && isfinite(cost), "validation_cost %g", cost);
        cr_assert_float_eq(bpb, cost / M_LN2, 1e-9, "bpb %g, cost %g", bpb, cost);
        /* two trackers timing a sub-second epoch on their own clocks: the
         * same rate within 2x (a wrong factor, e.g. not x T, is 16x off;
         * a loaded host has moved them 30% apart) */
        const double ratio = tput > 0 ? tokens / (tput * T) : 0;
        cr_assert(ratio > 0.5 && ratio < 2, "tokens_per_s %g, throughput %g (x T = %g)",
                  tokens, tput, tput * T);
    }
    /* it learns the next byte a little: under 8 bits of a uniform guess */
    double bpb = json_number_value(json_object_get(json_array_get(j, 1), "validation_bpb"));
    cr_assert(bpb < 7, "validation_bpb %g", bpb);
    json_decref(j);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* ---- resume: the windows are replayed ------------------------------------------ */

static void s_resume_config(tp_train_config_t *c, const char *file, const char *logdir,
                            int64_t epochs, uint64_t seed) {
    tp_train_config_init(c);
    c->model = &s_model;
    c->batch = 16;
    c->dataflow = s_text(file, "train", 16);
    c->max_epoch = epochs;
    c->steps_per_epoch = 10;  /* a fifth of a pass: epochs end mid-pass */
    c->logdir = logdir;
    c->threads = 1;
    c->seed = seed;
    c->tokens_per_sample = T;
    c->tensorboard = 0;
    c->curves = 0;
    c->stats = "off";
}

/* 1 when every variable of a and b is equal bit for bit. */
static int s_same(tp_model_t *a, tp_model_t *b) {
    int same = tp_model_var_count(a) == tp_model_var_count(b);
    for (int i = 0; same && i < tp_model_var_count(a); i++) {
        tp_tensor_t va, vb;
        cr_assert_eq(tp_model_var(a, tp_model_var_name(a, i), &va), TP_OK);
        cr_assert_eq(tp_model_var(b, tp_model_var_name(a, i), &vb), TP_OK);
        same = va.nbytes == vb.nbytes && !memcmp(va.data, vb.data, va.nbytes);
        tp_tensor_fini(&va);
        tp_tensor_fini(&vb);
    }
    return same;
}

Test(train_text, resumed_run_on_text_ends_bit_identical) {
    char dir[64] = "/tmp/tp-train-text-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char file[128], straight[128], broken[128], other[128];
    snprintf(file, sizeof file, "%s/corpus.txt", dir);
    snprintf(straight, sizeof straight, "%s/straight", dir);
    snprintf(broken, sizeof broken, "%s/broken", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    FILE *f = fopen(file, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < 300; i++)
        fprintf(f, "%d bottles of beer on the wall, take %d down.\n", 300 - i, i % 7 + 1);
    fclose(f);
    tp_train_config_t c;
    tp_model_t *a = NULL, *b = NULL, *o = NULL;
    s_resume_config(&c, file, straight, 4, 3);
    cr_assert_eq(tp_launch_train_with_config(&c, &a), TP_OK, "%s", tp_last_error());
    s_resume_config(&c, file, broken, 2, 3);
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    s_resume_config(&c, file, broken, 4, 3);
    c.auto_resume = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, &b), TP_OK, "%s", tp_last_error());
    cr_assert(s_same(a, b), "the resumed run ends where the unbroken one does");
    /* and the windows matter: the same run on the text's first half only
     * (the same seed, so the same initial weights) ends elsewhere */
    s_resume_config(&c, file, other, 4, 3);
    tp_dataflow_destroy(&c.dataflow);
    char spec[256];
    snprintf(spec, sizeof spec, "text:%s,context=%d,val=0.5", file, T);
    cr_assert_eq(tp_spec_parse(spec, &c.dataflow), TP_OK, "%s", tp_last_error());
    c.dataflow = tp_df_batch(tp_df_map(c.dataflow, s_next_byte, NULL, NULL), 16, 0);
    cr_assert_eq(tp_launch_train_with_config(&c, &o), TP_OK, "%s", tp_last_error());
    cr_assert_not(s_same(a, o), "other windows, the same weights: the windows did not count");
    tp_model_destroy(&a);
    tp_model_destroy(&b);
    tp_model_destroy(&o);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
