/* towerpack tests: the offline predictor. Its outputs are bit for bit the
 * training graph's forward pass on the same checkpoint; the label is not
 * needed; bad names and checkpoints that do not fit say what is wrong; the
 * async, data-parallel and dataset predictors give every result once, with
 * the request it belongs to. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/models.h>
#include <towerpack/predict.h>
#include <towerpack/towerpack.h>
#include "pipeline/predict_testutil.h"
#include "dir_testutil.h"

#define B 16

static char s_dir[256];

static void s_setup(void) {
    tp_log_set_level(TP_LOG_WARN);
    dt_make(s_dir, sizeof s_dir, "tp_predict");
}

static void s_teardown(void) {
    dt_remove(s_dir);
}

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.05, 0.9, 0);
}

/* Deterministic images [n,28,28] and labels [n] from row `first`. */
static void s_batch(int64_t first, int64_t n, tp_tensor_t *img, tp_tensor_t *lab) {
    pt_batch(first, n, 1, img, lab);
}

/* A zoo model trained for a few steps, saved with its name. */
static tp_model_t *s_trained(const char *name, const char *path) {
    const tp_zoo_model_t *z = tp_zoo_find(name);
    cr_assert_not_null(z);
    tp_model_desc_t md = {tp_zoo_inputs(), 2, z->build, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = B;
    mc.infer_batch = B;
    mc.seed = 7;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_model_set_name(m, name), TP_OK);
    for (int s = 0; s < 3; s++) {
        tp_tensor_t in[2];
        s_batch(s * B, B, &in[0], &in[1]);
        cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        tp_tensor_fini(&in[0]);
        tp_tensor_fini(&in[1]);
    }
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    return m;
}

static tp_predictor_t *s_predictor(const char *name, const char *ckpt,
                                   int64_t max_batch) {
    static tp_model_desc_t md;
    md = (tp_model_desc_t){tp_zoo_inputs(), 2, tp_zoo_find(name)->build, NULL, NULL};
    static const char *ins[] = {"image"}, *outs[] = {"logits"};
    tp_predict_config_t c;
    tp_predict_config_init(&c);
    c.model = &md;
    c.checkpoint = ckpt;
    c.input_names = ins;
    c.ninput_names = 1;
    c.output_names = outs;
    c.noutput_names = 1;
    c.max_batch = max_batch;
    tp_predictor_t *p = tp_predictor_new(&c);
    cr_assert_not_null(p, "%s", tp_last_error());
    return p;
}

/* The predictor's logits against `tower`'s forward pass of the training
 * model (fed the labels too), rows [0, n). */
static void s_compare(tp_model_t *m, int tower, tp_predictor_t *p, int64_t n) {
    tp_tensor_t in[2], out;
    s_batch(1000, n, &in[0], &in[1]);
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    tp_fetch_t f = {.name = "logits"};
    cr_assert_eq(tp_model_run(m, tower, in, 2, &f, 1, &fwd), TP_OK, "%s",
                 tp_last_error());
    cr_assert_eq(tp_predictor_run(p, &in[0], &out), TP_OK, "%s", tp_last_error());
    cr_assert_eq(out.ndim, 2);
    cr_assert_eq(out.shape[0], n);
    cr_assert_eq(out.shape[1], 10);
    cr_assert_eq(f.value.nbytes, out.nbytes);
    cr_expect_eq(memcmp(f.value.data, out.data, out.nbytes), 0,
                 "logits differ from the training graph's: %g %g / %g %g",
                 (double)((float *)f.value.data)[0], (double)((float *)f.value.data)[11],
                 (double)((float *)out.data)[0], (double)((float *)out.data)[11]);
    tp_tensor_fini(&out);
    tp_tensor_fini(&in[0]);
    tp_tensor_fini(&in[1]);
}

TestSuite(predict, .init = s_setup, .fini = s_teardown);

Test(predict, same_logits_as_the_training_forward_pass) {
    char path[300];
    snprintf(path, sizeof path, "%s/cnn.safetensors", s_dir);
    tp_model_t *m = s_trained("cnn", path);
    tp_predictor_t *p = s_predictor("cnn", path, B);
    /* no batch norm, no dropout: the training tower computes the same */
    s_compare(m, 0, p, B);
    s_compare(m, -1, p, B);
    s_compare(m, -1, p, 5);
    s_compare(m, -1, p, 1);
    tp_predictor_destroy(&p);
    cr_expect_null(p);
    tp_model_destroy(&m);
}

Test(predict, batch_norm_and_dropout_in_inference_form) {
    char path[300];
    snprintf(path, sizeof path, "%s/cnn-bn.safetensors", s_dir);
    tp_model_t *m = s_trained("cnn-bn", path);
    tp_predictor_t *p = s_predictor("cnn-bn", path, B);
    /* the training model's inference graph: moving averages, no dropout */
    s_compare(m, -1, p, B);
    s_compare(m, -1, p, 3);
    tp_predictor_destroy(&p);
    tp_model_destroy(&m);
}

Test(predict, checkpoint_records_the_model) {
    char path[300];
    snprintf(path, sizeof path, "%s/model-3.safetensors", s_dir);
    tp_model_t *m = s_trained("mlp", path);
    tp_checkpoint_info_t info;
    cr_assert_eq(tp_checkpoint_info(path, &info), TP_OK, "%s", tp_last_error());
    cr_expect_str_eq(info.model, "mlp");
    cr_assert_eq(info.ninputs, 2);
    cr_expect_str_eq(info.inputs[0].name, "image");
    cr_expect_eq(info.inputs[0].dtype, TP_UINT8);
    cr_expect_eq(info.inputs[0].ndim, 3);
    cr_expect_eq(info.inputs[0].shape[1], 28);
    cr_expect_eq(info.inputs[0].shape[2], 28);
    cr_expect_str_eq(info.inputs[1].name, "label");
    cr_expect_eq(info.inputs[1].dtype, TP_INT32);
    cr_expect_eq(info.inputs[1].ndim, 1);
    /* a log directory resolves to the checkpoint its `checkpoint` file names */
    char listing[300], got[400];
    snprintf(listing, sizeof listing, "%s/checkpoint", s_dir);
    FILE *f = fopen(listing, "w");
    cr_assert_not_null(f);
    fprintf(f, "model-3.safetensors\n");
    fclose(f);
    cr_assert_eq(tp_checkpoint_resolve(s_dir, got, sizeof got), TP_OK, "%s",
                 tp_last_error());
    cr_expect(strstr(got, "/model-3.safetensors"), "%s", got);
    tp_model_destroy(&m);
}

Test(predict, names_that_do_not_exist_list_the_valid_ones) {
    tp_model_desc_t md = {tp_zoo_inputs(), 2, tp_zoo_find("mlp")->build, NULL, NULL};
    const char *ins[] = {"imgae"}, *outs[] = {"logits"}, *bad_outs[] = {"logit"};
    tp_predict_config_t c;
    tp_predict_config_init(&c);
    c.model = &md;
    c.input_names = ins;
    c.ninput_names = 1;
    c.output_names = outs;
    c.noutput_names = 1;
    cr_expect_null(tp_predictor_new(&c));
    cr_expect(strstr(tp_last_error(), "'imgae'") && strstr(tp_last_error(), "image, label"),
              "%s", tp_last_error());
    c.input_names = NULL;
    c.ninput_names = 0;
    c.output_names = bad_outs;
    cr_expect_null(tp_predictor_new(&c));
    cr_expect(strstr(tp_last_error(), "'logit'") && strstr(tp_last_error(), "linear/output"),
              "%s", tp_last_error());
    /* the accuracy needs the label: asking for it without the label fails */
    const char *acc[] = {"accuracy"}, *only_image[] = {"image"};
    c.output_names = acc;
    c.input_names = only_image;
    c.ninput_names = 1;
    cr_expect_null(tp_predictor_new(&c));
    cr_expect(strstr(tp_last_error(), "need input 'label'"), "%s", tp_last_error());
    /* with every needed input by default, the label is one of them */
    c.input_names = NULL;
    c.ninput_names = 0;
    tp_predictor_t *p = tp_predictor_new(&c);
    cr_assert_not_null(p, "%s", tp_last_error());
    cr_expect_eq(tp_predictor_input_count(p), 2);
    tp_predictor_destroy(&p);
    /* a logits-only predictor takes the image alone */
    c.output_names = outs;
    p = tp_predictor_new(&c);
    cr_assert_not_null(p, "%s", tp_last_error());
    cr_expect_eq(tp_predictor_input_count(p), 1);
    cr_expect_str_eq(tp_predictor_input_name(p, 0), "image");
    /* a batch over the limit says the limit */
    tp_tensor_t img, lab, out;
    s_batch(0, 300, &img, &lab);
    cr_expect_eq(tp_predictor_run(p, &img, &out), TP_ERR_SHAPE);
    cr_expect(strstr(tp_last_error(), "1..256"), "%s", tp_last_error());
    tp_tensor_fini(&img);
    tp_tensor_fini(&lab);
    tp_predictor_destroy(&p);
}

static int s_units = 32;
static tp_status_t s_small(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = tp_flatten(t, "flat", tp_cast(t, "x", in[0], 1.0f / 255));
    tp_node_t *logits = tp_fc(t, "fc1", tp_relu(t, NULL, tp_fc(t, "fc0", x, s_units, 1)), 10, 1);
    tp_tower_add_output(t, "logits", logits);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

Test(predict, a_checkpoint_that_does_not_fit_names_the_variable_and_both_shapes) {
    char path[300];
    snprintf(path, sizeof path, "%s/small.safetensors", s_dir);
    tp_model_desc_t md = {tp_zoo_inputs(), 2, s_small, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 4;
    s_units = 32;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK);
    tp_model_destroy(&m);
    s_units = 16;
    const char *outs[] = {"logits"};
    tp_predict_config_t c;
    tp_predict_config_init(&c);
    c.model = &md;
    c.checkpoint = path;
    c.output_names = outs;
    c.noutput_names = 1;
    cr_expect_null(tp_predictor_new(&c));
    const char *e = tp_last_error();
    cr_expect(strstr(e, "fc0/W") && strstr(e, "float32[784,32] in the file") &&
              strstr(e, "float32[784,16] in the model"), "%s", e);
    /* a missing file names it */
    c.checkpoint = "/nonexistent/model.safetensors";
    cr_expect_null(tp_predictor_new(&c));
    cr_expect(strstr(tp_last_error(), "/nonexistent/model.safetensors"), "%s",
              tp_last_error());
}

/* ---- several predictors -------------------------------------------------- */

#define NREQ 48

typedef struct {
    pthread_mutex_t mu;
    int calls[NREQ];
    float logits[NREQ][8][10];
    int64_t rows[NREQ];
    int failures;
} s_results_t;

typedef struct {
    s_results_t *res;
    int index;
} s_tag_t;

/* Each request answered once (`how`: "called back", "taken") and with
 * what one predictor says for that request's rows; frees res's lock. */
static void s_expect_results(const tp_predict_config_t *c, s_results_t *res,
                             const char *how) {
    tp_predictor_t *p = tp_predictor_new(c);
    cr_assert_not_null(p, "%s", tp_last_error());
    cr_expect_eq(res->failures, 0);
    for (int i = 0; i < NREQ; i++) {
        cr_expect_eq(res->calls[i], 1, "request %d %s %d times", i, how, res->calls[i]);
        tp_tensor_t img, lab, out;
        s_batch(i * 8, res->rows[i], &img, &lab);
        cr_assert_eq(tp_predictor_run(p, &img, &out), TP_OK);
        cr_expect_eq(memcmp(out.data, res->logits[i], out.nbytes), 0,
                     "request %d got another request's logits", i);
        tp_tensor_fini(&out);
        tp_tensor_fini(&img);
        tp_tensor_fini(&lab);
    }
    tp_predictor_destroy(&p);
    pthread_mutex_destroy(&res->mu);
}

static void s_on_result(tp_status_t st, tp_tensor_t *out, int nout, void *user) {
    s_tag_t *tag = user;
    s_results_t *r = tag->res;
    pthread_mutex_lock(&r->mu);
    r->calls[tag->index]++;
    if (st != TP_OK || nout != 1 || out[0].shape[0] != r->rows[tag->index])
        r->failures++;
    else
        memcpy(r->logits[tag->index], out[0].data, out[0].nbytes);
    pthread_mutex_unlock(&r->mu);
}

typedef struct {
    tp_async_predictor_t *ap;
    s_results_t *res;
    s_tag_t *tags;
    int first, step;
} s_putter_t;

static void *s_put_main(void *arg) {
    s_putter_t *pt = arg;
    for (int i = pt->first; i < NREQ; i += pt->step) {
        tp_tensor_t img, lab;
        s_batch(i * 8, pt->res->rows[i], &img, &lab);
        tp_status_t rc = tp_async_predictor_put(pt->ap, &img, s_on_result, &pt->tags[i]);
        tp_tensor_fini(&img);  /* copied by put */
        tp_tensor_fini(&lab);
        if (rc != TP_OK)
            return (void *)1;
    }
    return NULL;
}

Test(predict, async_gives_every_result_once_to_its_request) {
    char path[300];
    snprintf(path, sizeof path, "%s/cnn.safetensors", s_dir);
    tp_model_t *m = s_trained("mlp", path);
    tp_model_destroy(&m);
    tp_model_desc_t md = {tp_zoo_inputs(), 2, tp_zoo_find("mlp")->build, NULL, NULL};
    const char *outs[] = {"logits"};
    tp_predict_config_t c;
    tp_predict_config_init(&c);
    c.model = &md;
    c.checkpoint = path;
    c.output_names = outs;
    c.noutput_names = 1;
    c.max_batch = 8;
    c.threads = 1;
    static s_results_t res;
    memset(&res, 0, sizeof res);
    pthread_mutex_init(&res.mu, NULL);
    static s_tag_t tags[NREQ];
    for (int i = 0; i < NREQ; i++) {
        tags[i] = (s_tag_t){&res, i};
        res.rows[i] = 1 + i % 8;  /* every batch size */
    }
    tp_async_predictor_t *ap = tp_async_predictor_new(&c, 3, 4);
    cr_assert_not_null(ap, "%s", tp_last_error());
    /* three threads put at once into a queue of four */
    pthread_t th[3];
    s_putter_t pt[3];
    for (int k = 0; k < 3; k++) {
        pt[k] = (s_putter_t){ap, &res, tags, k, 3};
        cr_assert_eq(pthread_create(&th[k], NULL, s_put_main, &pt[k]), 0);
    }
    for (int k = 0; k < 3; k++) {
        void *ret;
        pthread_join(th[k], &ret);
        cr_expect_null(ret);
    }
    tp_async_predictor_wait(ap);
    tp_async_predictor_destroy(&ap);
    cr_expect_null(ap);
    s_expect_results(&c, &res, "called back");
}

Test(predict, data_parallel_joins_the_towers_in_order) {
    char path[300];
    snprintf(path, sizeof path, "%s/cnn.safetensors", s_dir);
    tp_model_t *m = s_trained("mlp", path);
    tp_model_destroy(&m);
    tp_model_desc_t md = {tp_zoo_inputs(), 2, tp_zoo_find("mlp")->build, NULL, NULL};
    const char *outs[] = {"logits", "linear/output"};
    tp_predict_config_t c;
    tp_predict_config_init(&c);
    c.model = &md;
    c.checkpoint = path;
    c.output_names = outs;
    c.noutput_names = 2;
    c.max_batch = 8;
    c.threads = 1;
    int devices[3] = {-1, -1, -1};
    tp_dp_predictor_t *dp = tp_dp_predictor_new(&c, devices, 3);
    cr_assert_not_null(dp, "%s", tp_last_error());
    cr_expect_eq(tp_dp_predictor_towers(dp), 3);
    tp_predictor_t *p = tp_predictor_new(&c);
    cr_assert_not_null(p, "%s", tp_last_error());
    int64_t sizes[] = {24, 1, 17, 9, 2};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t n = sizes[k];
        tp_tensor_t img, lab, out[2];
        s_batch(100 * (int64_t)k, n, &img, &lab);
        cr_assert_eq(tp_dp_predictor_run(dp, &img, out), TP_OK, "%s", tp_last_error());
        cr_assert_eq(out[0].shape[0], n);
        /* row by row, the single predictor on that row alone */
        for (int64_t r = 0; r < n; r++) {
            tp_tensor_t one, ol, po[2];
            s_batch(100 * (int64_t)k + r, 1, &one, &ol);
            cr_assert_eq(tp_predictor_run(p, &one, po), TP_OK);
            float *a = (float *)out[0].data + r * 10, *b = po[0].data;
            for (int j = 0; j < 10; j++)
                cr_expect(fabsf(a[j] - b[j]) <= 1e-5f * (1 + fabsf(b[j])),
                          "batch %lld row %lld class %d: %g vs %g", (long long)n,
                          (long long)r, j, (double)a[j], (double)b[j]);
            tp_tensor_fini(&po[0]);
            tp_tensor_fini(&po[1]);
            tp_tensor_fini(&one);
            tp_tensor_fini(&ol);
        }
        tp_tensor_fini(&out[0]);
        tp_tensor_fini(&out[1]);
        tp_tensor_fini(&img);
        tp_tensor_fini(&lab);
    }
    tp_tensor_t img, lab, out[2];
    s_batch(0, 25, &img, &lab);
    cr_expect_eq(tp_dp_predictor_run(dp, &img, out), TP_ERR_SHAPE);
    cr_expect(strstr(tp_last_error(), "1..24"), "%s", tp_last_error());
    tp_tensor_fini(&img);
    tp_tensor_fini(&lab);
    tp_predictor_destroy(&p);
    tp_dp_predictor_destroy(&dp);
}

typedef struct {
    int64_t rows, calls, correct;
    int32_t first_label;
} s_tally_t;

static tp_status_t s_tally(const tp_datapoint_t *dp, tp_tensor_t *out, int nout,
                           void *user) {
    s_tally_t *t = user;
    const tp_tensor_t *lab = tp_datapoint_cget(dp, 1);
    if (t->calls++ == 0)
        t->first_label = ((const int32_t *)lab->data)[0];
    for (int64_t r = 0; r < out[0].shape[0]; r++) {
        const float *l = (const float *)out[0].data + r * 10;
        int best = 0;
        for (int j = 1; j < 10; j++)
            if (l[j] > l[best])
                best = j;
        t->correct += best == ((const int32_t *)lab->data)[r];
    }
    t->rows += out[0].shape[0];
    return nout == 1 ? TP_OK : TP_ERR_STATE;
}

Test(predict, dataset_predictor_runs_a_dataflow_in_order) {
    tp_model_desc_t md = {tp_zoo_inputs(), 2, tp_zoo_find("mlp")->build, NULL, NULL};
    const char *outs[] = {"logits"};
    tp_predict_config_t c;
    tp_predict_config_init(&c);
    c.model = &md;
    c.output_names = outs;
    c.noutput_names = 1;
    c.max_batch = 32;
    tp_predictor_t *p = tp_predictor_new(&c);
    cr_assert_not_null(p, "%s", tp_last_error());
    tp_datapoint_t *dps[5];
    for (int i = 0; i < 5; i++) {
        tp_tensor_t img, lab;
        s_batch(i * 10, 10, &img, &lab);
        dps[i] = tp_datapoint_new(0);
        cr_assert_eq(tp_datapoint_append(dps[i], &img), TP_OK);
        cr_assert_eq(tp_datapoint_append(dps[i], &lab), TP_OK);
    }
    tp_dataflow_t *df = tp_df_from_list(dps, 5, 0);
    cr_assert_not_null(df);
    s_tally_t t = {0};
    cr_assert_eq(tp_predict_dataflow(p, df, NULL, s_tally, &t), TP_OK, "%s",
                 tp_last_error());
    cr_expect_eq(t.calls, 5);
    cr_expect_eq(t.rows, 50);
    cr_expect_eq(t.first_label, 0);
    cr_expect(t.correct >= 0 && t.correct <= 50);
    tp_dataflow_destroy(&df);
    tp_predictor_destroy(&p);
}

/* ---- the InferenceRunner runs through a predictor ------------------------ */

/* A list dataflow of batches of the given sizes, rows numbered from first. */
static tp_dataflow_t *s_list(int64_t first, const int64_t *sizes, int n) {
    tp_datapoint_t *dps[8];
    for (int i = 0; i < n; i++) {
        tp_tensor_t img, lab;
        s_batch(first, sizes[i], &img, &lab);
        first += sizes[i];
        dps[i] = tp_datapoint_new(0);
        cr_assert_eq(tp_datapoint_append(dps[i], &img), TP_OK);
        cr_assert_eq(tp_datapoint_append(dps[i], &lab), TP_OK);
    }
    tp_dataflow_t *df = tp_df_from_list(dps, (size_t)n, 0);
    cr_assert_not_null(df);
    return df;
}

/* A monitor keeping the last value of every validation scalar. */
typedef struct {
    char names[8][64];
    double values[8];
    int n;
} s_seen_t;

static void s_on_scalar(void *impl, tp_trainer_t *tr, const char *name,
                        double value) {
    (void)tr;
    s_seen_t *s = impl;
    if (strncmp(name, "validation_", 11) && strncmp(name, "v2_", 3))
        return;
    int i = 0;
    while (i < s->n && strcmp(s->names[i], name))
        i++;
    if (i == s->n && s->n < 8)
        snprintf(s->names[s->n++], sizeof s->names[0], "%s", name);
    if (i < 8)
        s->values[i] = value;
}

static void s_seen_free(void *impl) { (void)impl; }

static const tp_callback_ops_t s_seen_ops = {
    .name = "SeenScalars", .on_scalar = s_on_scalar, .destroy = s_seen_free,
};

static double s_seen(const s_seen_t *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name))
            return s->values[i];
    cr_assert_fail("no scalar %s", name);
    return NAN;
}

/* The runner's scalar `name` is exactly `want`, as `by` computed it. */
static void s_expect_seen(const s_seen_t *s, const char *name, double want, const char *by) {
    double got = s_seen(s, name);
    cr_expect_eq(got, want, "%s: runner %.9g, %s %.9g", name, got, by, want);
}

/* The InferenceRunner's reduction of a predictor's outputs over the
 * validation batches: accuracy and cost weighted by rows, wrong summed. */
static void s_validate(tp_predictor_t *p, const int64_t *sizes, int n,
                       double *acc, double *cost, double *err) {
    double sums[3] = {0, 0, 0}, rows = 0;
    int64_t first = 5000;
    for (int i = 0; i < n; i++) {
        tp_tensor_t in[2], out[3];
        s_batch(first, sizes[i], &in[0], &in[1]);
        first += sizes[i];
        cr_assert_eq(tp_predictor_run(p, in, out), TP_OK, "%s", tp_last_error());
        double b = (double)sizes[i];
        sums[0] += ((const float *)out[0].data)[0] * b;
        sums[1] += ((const float *)out[1].data)[0] * b;
        sums[2] += out[2].dtype == TP_INT32 ? ((const int32_t *)out[2].data)[0]
                                            : ((const float *)out[2].data)[0];
        rows += b;
        for (int j = 0; j < 3; j++)
            tp_tensor_fini(&out[j]);
        tp_tensor_fini(&in[0]);
        tp_tensor_fini(&in[1]);
    }
    *acc = sums[0] / rows;
    *cost = sums[1] / rows;
    *err = sums[2] / rows;
}

/* cnn-bn trained for `epochs` of 4 steps on 4 batches of B, one runner with
 * the given inferencers on the validation batches (B, B, 8), no default
 * callbacks; with `seen`, a monitor keeping the validation scalars in it
 * (mons[0]). */
static void s_runner_config(tp_train_config_t *c, tp_model_desc_t *md, int epochs,
                            const tp_inferencer_t *infs, size_t n, tp_callback_t **cbs,
                            s_seen_t *seen, tp_callback_t **mons) {
    static const int64_t train_sizes[] = {B, B, B, B}, val_sizes[] = {B, B, 8};
    *md = (tp_model_desc_t){tp_zoo_inputs(), 2, tp_zoo_find("cnn-bn")->build, s_sgd, NULL};
    tp_train_config_init(c);
    c->model = md;
    c->model_name = "cnn-bn";
    c->dataflow = s_list(0, train_sizes, 4);
    c->batch = B;
    c->infer_batch = B;
    c->max_epoch = epochs;
    c->steps_per_epoch = 4;
    c->threads = 1;
    c->seed = 7;
    c->default_callbacks = 0;
    c->stats = "off";
    cbs[0] = tp_cb_inference_runner(s_list(5000, val_sizes, 3), infs, n);
    cr_assert_not_null(cbs[0]);
    c->callbacks = cbs;
    c->ncallbacks = 1;
    if (seen) {
        mons[0] = tp_callback_new(&s_seen_ops, seen, 0);
        c->monitors = mons;
        c->nmonitors = 1;
    }
}

/* Training with two InferenceRunners on the same model (the default one on
 * the config's validation data, with accuracy; one like tp-train's, with
 * accuracy, cost and wrong): each one's numbers equal a predictor's over the
 * same data, from the checkpoint written after the last epoch and over the
 * live model the training returns. The two runners borrow the same
 * inference graph and prune it differently, in turn. */
Test(predict, inference_runner_numbers_are_a_predictors) {
    static tp_model_desc_t md;
    const int64_t val_sizes[] = {B, B, 8};
    char logdir[300];
    snprintf(logdir, sizeof logdir, "%s/run", s_dir);
    tp_inferencer_t infs[] = {
        {TP_INFER_SCALAR_STATS, "accuracy", "v2_accuracy"},
        {TP_INFER_SCALAR_STATS, "cost", "v2_cost"},
        {TP_INFER_CLASSIFICATION_ERROR, "wrong", "v2_error"},
    };
    tp_train_config_t c;
    tp_callback_t *cbs[1], *mons[1];
    s_seen_t seen = {0};
    s_runner_config(&c, &md, 2, infs, 3, cbs, &seen, mons);
    c.logdir = logdir;
    c.validation = s_list(5000, val_sizes, 3);
    tp_model_t *m = NULL;
    cr_assert_eq(tp_launch_train_with_config(&c, &m), TP_OK, "%s", tp_last_error());
    tp_train_config_fini(&c);
    cr_assert_not_null(m);

    const char *outs[] = {"accuracy", "cost", "wrong"};
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    pc.model = &md;
    pc.output_names = outs;
    pc.noutput_names = 3;
    pc.max_batch = B;
    /* from the checkpoint, and over the live model's own weights */
    pc.checkpoint = logdir;
    tp_predictor_t *from_file = tp_predictor_new(&pc);
    cr_assert_not_null(from_file, "%s", tp_last_error());
    pc.checkpoint = NULL;
    tp_predictor_t *live = tp_predictor_new_shared(m, &pc);
    cr_assert_not_null(live, "%s", tp_last_error());
    cr_assert_eq(tp_predictor_input_count(live), 2, "the outputs need the label");
    cr_assert_eq(tp_predictor_max_batch(live), B);
    double a1, c1, e1, a2, c2, e2;
    s_validate(from_file, val_sizes, 3, &a1, &c1, &e1);
    s_validate(live, val_sizes, 3, &a2, &c2, &e2);
    cr_expect_eq(a1, a2);
    cr_expect_eq(c1, c2);
    cr_expect_eq(e1, e2);
    s_expect_seen(&seen, "validation_accuracy", a1, "predictor");
    s_expect_seen(&seen, "v2_accuracy", a1, "predictor");
    s_expect_seen(&seen, "v2_cost", c1, "predictor");
    s_expect_seen(&seen, "v2_error", e1, "predictor");
    cr_expect_float_eq(a1 + e1, 1.0, 1e-9, "accuracy %g and error %g", a1, e1);
    cr_expect(c1 > 0 && isfinite(c1));
    tp_predictor_destroy(&live);
    tp_predictor_destroy(&from_file);

    /* the live model's graph is whole again: a full forward pass runs */
    tp_tensor_t in[2];
    s_batch(0, B, &in[0], &in[1]);
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    tp_fetch_t f = {.name = "cost"};
    cr_expect_eq(tp_model_input_needed(m, 1), 1);
    cr_expect_eq(tp_model_run(m, -1, in, 2, &f, 1, &fwd), TP_OK, "%s", tp_last_error());
    tp_tensor_fini(&in[0]);
    tp_tensor_fini(&in[1]);
    /* a live model takes no checkpoint */
    pc.checkpoint = logdir;
    cr_expect_null(tp_predictor_new_shared(m, &pc));
    cr_expect(strstr(tp_last_error(), "live model"), "%s", tp_last_error());
    tp_model_destroy(&m);
}

/* ---- futures ------------------------------------------------------------- */

static tp_predict_config_t s_mlp_config(const char *path) {
    static tp_model_desc_t md;
    static const char *outs[] = {"logits"};
    md = (tp_model_desc_t){tp_zoo_inputs(), 2, tp_zoo_find("mlp")->build, NULL, NULL};
    tp_predict_config_t c;
    tp_predict_config_init(&c);
    c.model = &md;
    c.checkpoint = path;
    c.output_names = outs;
    c.noutput_names = 1;
    c.max_batch = 8;
    c.threads = 1;
    return c;
}

typedef struct {
    tp_async_predictor_t *ap;
    s_results_t *res;
    int first, step;
} s_taker_t;

/* Put this thread's requests, each with a future, then take them in the
 * reverse order: each future's rows are its own request's. */
static void *s_future_main(void *arg) {
    s_taker_t *tk = arg;
    tp_predict_future_t *fs[NREQ] = {0};
    for (int i = tk->first; i < NREQ; i += tk->step) {
        tp_tensor_t img, lab;
        s_batch(i * 8, tk->res->rows[i], &img, &lab);
        tp_status_t rc = tp_async_predictor_put_future(tk->ap, &img, &fs[i]);
        tp_tensor_fini(&img);
        tp_tensor_fini(&lab);
        if (rc != TP_OK)
            return (void *)1;
    }
    for (int i = NREQ - 1; i >= 0; i--) {
        if (!fs[i])
            continue;
        tp_tensor_t out;
        tp_status_t rc = tp_predict_future_take(fs[i], &out);
        pthread_mutex_lock(&tk->res->mu);
        tk->res->calls[i]++;
        if (rc != TP_OK || out.shape[0] != tk->res->rows[i])
            tk->res->failures++;
        else
            memcpy(tk->res->logits[i], out.data, out.nbytes);
        pthread_mutex_unlock(&tk->res->mu);
        if (rc == TP_OK)
            tp_tensor_fini(&out);
        /* a second take has nothing left */
        if (tp_predict_future_take(fs[i], &out) != TP_ERR_STATE)
            return (void *)2;
        tp_predict_future_destroy(&fs[i]);
    }
    return NULL;
}

Test(predict, futures_give_every_result_once_to_their_request) {
    char path[300];
    snprintf(path, sizeof path, "%s/mlp.safetensors", s_dir);
    tp_model_t *m = s_trained("mlp", path);
    tp_model_destroy(&m);
    tp_predict_config_t c = s_mlp_config(path);
    static s_results_t res;
    memset(&res, 0, sizeof res);
    pthread_mutex_init(&res.mu, NULL);
    for (int i = 0; i < NREQ; i++)
        res.rows[i] = 1 + (i * 5) % 8;
    tp_async_predictor_t *ap = tp_async_predictor_new(&c, 3, 4);
    cr_assert_not_null(ap, "%s", tp_last_error());
    pthread_t th[3];
    s_taker_t tk[3];
    for (int k = 0; k < 3; k++) {
        tk[k] = (s_taker_t){ap, &res, k, 3};
        cr_assert_eq(pthread_create(&th[k], NULL, s_future_main, &tk[k]), 0);
    }
    for (int k = 0; k < 3; k++) {
        void *ret;
        pthread_join(th[k], &ret);
        cr_expect_null(ret, "taker %d: %p", k, ret);
    }
    tp_async_predictor_destroy(&ap);
    s_expect_results(&c, &res, "taken");
}

/* A callback that holds its worker until the test opens the gate. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, entered;
} s_gate_t;

static void s_gated(tp_status_t st, tp_tensor_t *out, int nout, void *user) {
    (void)st, (void)out, (void)nout;
    s_gate_t *g = user;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

Test(predict, a_future_times_out_fails_with_the_message_and_may_go_first) {
    char path[300];
    snprintf(path, sizeof path, "%s/mlp.safetensors", s_dir);
    tp_model_t *m = s_trained("mlp", path);
    tp_model_destroy(&m);
    tp_predict_config_t c = s_mlp_config(path);
    tp_async_predictor_t *ap = tp_async_predictor_new(&c, 1, 4);
    cr_assert_not_null(ap, "%s", tp_last_error());
    /* the one worker is held in a callback: what comes after cannot run */
    s_gate_t g = {.open = 0};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    tp_tensor_t img, lab, big, blab;
    s_batch(0, 3, &img, &lab);
    s_batch(0, 9, &big, &blab);  /* over max_batch 8 */
    cr_assert_eq(tp_async_predictor_put(ap, &img, s_gated, &g), TP_OK);
    pthread_mutex_lock(&g.mu);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    tp_predict_future_t *ok = NULL, *bad = NULL, *dropped = NULL;
    cr_assert_eq(tp_async_predictor_put_future(ap, &img, &ok), TP_OK);
    cr_assert_eq(tp_async_predictor_put_future(ap, &big, &bad), TP_OK);
    cr_assert_eq(tp_async_predictor_put_future(ap, &img, &dropped), TP_OK);
    cr_expect_eq(tp_predict_future_wait(ok, 0.01), TP_ERR_TIMEOUT);
    cr_expect(strstr(tp_last_error(), "no result after"), "%s", tp_last_error());
    cr_expect_eq(tp_predict_future_done(ok), 0);
    /* destroyed before its result: the worker frees it later */
    tp_predict_future_destroy(&dropped);
    cr_expect_null(dropped);
    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    cr_expect_eq(tp_predict_future_wait(ok, -1), TP_OK);
    cr_expect_eq(tp_predict_future_done(ok), 1);
    tp_tensor_t out;
    cr_assert_eq(tp_predict_future_take(ok, &out), TP_OK, "%s", tp_last_error());
    cr_expect_eq(out.shape[0], 3);
    cr_expect_eq(out.shape[1], 10);
    tp_tensor_fini(&out);
    /* a request that fails: the worker's message, through take */
    cr_expect_eq(tp_predict_future_take(bad, &out), TP_ERR_SHAPE);
    cr_expect(strstr(tp_last_error(), "9 rows") && strstr(tp_last_error(), "1..8"),
              "%s", tp_last_error());
    tp_predict_future_destroy(&ok);
    tp_predict_future_destroy(&bad);
    tp_async_predictor_destroy(&ap);
    tp_tensor_fini(&img);
    tp_tensor_fini(&lab);
    tp_tensor_fini(&big);
    tp_tensor_fini(&blab);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

/* ---- test-time augmentation: FlipAccuracy, FlipShiftAccuracy ------------ */

/* View (mirror, dy, dx) of n 28x28 images: pixel (h, w) is the image's
 * (h + dy, w' + dx), w' = 27 - w when mirrored, 0 outside. */
static void s_view(const uint8_t *a, uint8_t *v, int64_t n, int mirror, int dy, int dx) {
    for (int64_t i = 0; i < n; i++)
        for (int h = 0; h < 28; h++)
            for (int w = 0; w < 28; w++) {
                int sh = h + dy, sw = (mirror ? 27 - w : w) + dx;
                v[(i * 28 + h) * 28 + w] =
                    sh >= 0 && sh < 28 && sw >= 0 && sw < 28 ? a[(i * 28 + sh) * 28 + sw] : 0;
            }
}

/* The share of rows whose logits, summed over views of the batch, pick the
 * label, counted here from a predictor's logits over views this test makes
 * itself: the batch and its mirror (FlipAccuracy), or those twice and
 * both shifted a pixel up-left and down-right (FlipShiftAccuracy: six,
 * summed in the runner's order with its weights). */
static double s_tta_expected(tp_predictor_t *p, const int64_t *sizes, int n, int shift) {
    static const int vw[6][3] = {{0, 0, 0}, {1, 0, 0}, {0, -1, -1},
                                 {1, -1, -1}, {0, 1, 1}, {1, 1, 1}};
    const int nv = shift ? 6 : 2;
    double right = 0, rows = 0;
    int64_t first = 5000;
    for (int i = 0; i < n; i++) {
        tp_tensor_t in[2], view, out[6];
        s_batch(first, sizes[i], &in[0], &in[1]);
        first += sizes[i];
        cr_assert_eq(tp_tensor_init(&view, TP_UINT8, 3, in[0].shape), TP_OK);
        for (int k = 0; k < nv; k++) {
            s_view(in[0].data, view.data, sizes[i], vw[k][0], vw[k][1], vw[k][2]);
            tp_tensor_t vi[2] = {view, in[1]};
            cr_assert_eq(tp_predictor_run(p, vi, &out[k]), TP_OK, "%s", tp_last_error());
        }
        for (int64_t r = 0; r < sizes[i]; r++) {
            float sum[10];
            for (int c = 0; c < 10; c++) {
                sum[c] = (shift ? 2.0f : 1.0f) * ((const float *)out[0].data)[r * 10 + c];
                for (int k = 1; k < nv; k++)
                    sum[c] += (shift && k < 2 ? 2.0f : 1.0f) *
                              ((const float *)out[k].data)[r * 10 + c];
            }
            int best = 0;
            for (int c = 1; c < 10; c++)
                if (sum[c] > sum[best])
                    best = c;
            right += best == ((const int32_t *)in[1].data)[r];
        }
        rows += (double)sizes[i];
        for (int k = 0; k < nv; k++)
            tp_tensor_fini(&out[k]);
        tp_tensor_fini(&view);
        tp_tensor_fini(&in[0]);
        tp_tensor_fini(&in[1]);
    }
    return right / rows;
}

/* One epoch of the runner's model with the inferencers `infs` (their
 * scalars into *seen), then a predictor of the logits over the live model
 * (*m, the caller's). */
static tp_predictor_t *s_tta_trained(const tp_inferencer_t *infs, size_t n, s_seen_t *seen,
                                     tp_model_t **m) {
    static tp_model_desc_t md;
    tp_train_config_t c;
    tp_callback_t *cbs[1], *mons[1];
    s_runner_config(&c, &md, 1, infs, n, cbs, seen, mons);
    *m = NULL;
    cr_assert_eq(tp_launch_train_with_config(&c, m), TP_OK, "%s", tp_last_error());
    tp_train_config_fini(&c);
    const char *outs[] = {"logits"};
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    pc.output_names = outs;
    pc.noutput_names = 1;
    pc.max_batch = B;
    tp_predictor_t *live = tp_predictor_new_shared(*m, &pc);
    cr_assert_not_null(live, "%s", tp_last_error());
    return live;
}

/* A runner with FlipAccuracy on the logits, beside plain accuracy: its
 * scalar is the count above over the live model; an inferencer on an
 * output that is no [rows, classes] logits ends training naming it. */
Test(predict, flip_accuracy_sums_the_batch_and_its_mirror) {
    const int64_t val_sizes[] = {B, B, 8};
    tp_inferencer_t infs[] = {
        {TP_INFER_SCALAR_STATS, "accuracy", NULL},
        {TP_INFER_FLIP_ACCURACY, "logits", NULL},
    };
    s_seen_t seen = {0};
    tp_model_t *m;
    tp_predictor_t *live = s_tta_trained(infs, 2, &seen, &m);
    double want = s_tta_expected(live, val_sizes, 3, 0);
    s_expect_seen(&seen, "validation_flip_accuracy", want, "by hand");
    cr_expect(s_seen(&seen, "validation_accuracy") >= 0);
    tp_predictor_destroy(&live);
    tp_model_destroy(&m);

    /* on a scalar output: training fails, naming the inferencer's output */
    static tp_model_desc_t md;
    tp_train_config_t c;
    tp_callback_t *cbs[1];
    tp_inferencer_t bad[] = {{TP_INFER_FLIP_ACCURACY, "accuracy", NULL}};
    s_runner_config(&c, &md, 1, bad, 1, cbs, NULL, NULL);
    cr_expect_neq(tp_launch_train_with_config(&c, NULL), TP_OK);
    cr_expect(strstr(tp_last_error(), "FlipAccuracy: output accuracy must be float32"),
              "%s", tp_last_error());
    tp_train_config_fini(&c);
}

/* FlipShiftAccuracy beside FlipAccuracy in one runner: six views for the
 * one, two for the other, each the count above. */
Test(predict, flip_shift_accuracy_sums_six_views) {
    const int64_t val_sizes[] = {B, B, 8};
    tp_inferencer_t infs[] = {
        {TP_INFER_FLIP_SHIFT_ACCURACY, "logits", NULL},
        {TP_INFER_FLIP_ACCURACY, "logits", NULL},
    };
    s_seen_t seen = {0};
    tp_model_t *m;
    tp_predictor_t *live = s_tta_trained(infs, 2, &seen, &m);
    double shift = s_tta_expected(live, val_sizes, 3, 1),
           flip = s_tta_expected(live, val_sizes, 3, 0);
    s_expect_seen(&seen, "validation_flip_shift_accuracy", shift, "by hand");
    s_expect_seen(&seen, "validation_flip_accuracy", flip, "by hand");
    tp_predictor_destroy(&live);
    tp_model_destroy(&m);
}

/* The config's bf16 reaches the CPU backend before the model is built:
 * -1 by default (the environment decides), 1 turns the process's
 * products to bf16 (the logits move by bf16's rounding, top-1 stays),
 * 0 back to fp32 (the logits bit for bit the fp32 predictor's again).
 * A CPU without bf16 dot products: 1 leaves them fp32, nothing refused. */
Test(predict, the_configs_bf16_reaches_the_cpu_backend) {
    char path[300];
    snprintf(path, sizeof path, "%s/mlp.safetensors", s_dir);
    tp_model_t *m = s_trained("mlp", path);
    tp_model_destroy(&m);
    tp_predict_config_t c = s_mlp_config(path);
    cr_assert_eq(c.bf16, -1, "the default leaves bf16 to $TP_CPU_BF16");
    const int has = tp_backend_cpu_bf16(1);
    tp_backend_cpu_bf16(0);
    tp_tensor_t img, lab, out[3];
    s_batch(0, 8, &img, &lab);
    const int asked[3] = {0, 1, 0};
    for (int k = 0; k < 3; k++) {
        c.bf16 = asked[k];
        tp_predictor_t *p = tp_predictor_new(&c);
        cr_assert_not_null(p, "bf16 %d: %s", c.bf16, tp_last_error());
        cr_assert_eq(tp_backend_cpu_bf16_ask(-1), asked[k] && has, "bf16 %d", c.bf16);
        cr_assert_eq(tp_predictor_run(p, &img, &out[k]), TP_OK, "%s", tp_last_error());
        tp_predictor_destroy(&p);
    }
    const float *f32 = out[0].data, *b16 = out[1].data, *again = out[2].data;
    double most = 0, scale = 0;
    for (int64_t i = 0; i < 8 * 10; i++) {
        double d = fabs((double)f32[i] - (double)b16[i]);
        most = d > most ? d : most;
        scale = fabs(f32[i]) > scale ? fabs(f32[i]) : scale;
    }
    if (has)  /* bf16 keeps 8 significant bits: a few hundredths of 1 */
        cr_expect(most > 0 && most < 0.02 * (scale > 1 ? scale : 1),
                  "bf16 logits differ from fp32 by %g (largest %g)", most, scale);
    else
        cr_expect_eq(most, 0, "fp32 without bf16 dot products, yet %g apart", most);
    cr_expect_eq(memcmp(f32, again, out[0].nbytes), 0, "bf16 0 did not give fp32 back");
    for (int k = 0; k < 3; k++)
        tp_tensor_fini(&out[k]);
    tp_tensor_fini(&img);
    tp_tensor_fini(&lab);
}
