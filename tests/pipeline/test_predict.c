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

#define B 16

static char s_dir[256];

static void s_setup(void) {
    tp_log_set_level(TP_LOG_WARN);
    snprintf(s_dir, sizeof s_dir, "/tmp/tp_predict_XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
}

static void s_teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    cr_expect_eq(system(cmd), 0);
}

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.05, 0.9, 0);
}

/* Deterministic images and labels: row r of a batch starting at `first`. */
static void s_batch(int64_t first, int64_t n, tp_tensor_t *img, tp_tensor_t *lab) {
    int64_t is[3] = {n, 28, 28}, ls[1] = {n};
    cr_assert_eq(tp_tensor_init(img, TP_UINT8, 3, is), TP_OK);
    cr_assert_eq(tp_tensor_init(lab, TP_INT32, 1, ls), TP_OK);
    uint8_t *p = img->data;
    for (int64_t r = 0; r < n; r++) {
        uint64_t x = (uint64_t)(first + r) * 0x9e3779b97f4a7c15ull + 1;
        for (int k = 0; k < 784; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p[r * 784 + k] = (uint8_t)(x >> 56);
        }
        ((int32_t *)lab->data)[r] = (int32_t)((first + r) % 10);
    }
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
    /* each result equals what one predictor says for that request's rows */
    tp_predictor_t *p = tp_predictor_new(&c);
    cr_assert_not_null(p, "%s", tp_last_error());
    cr_expect_eq(res.failures, 0);
    for (int i = 0; i < NREQ; i++) {
        cr_expect_eq(res.calls[i], 1, "request %d called back %d times", i, res.calls[i]);
        tp_tensor_t img, lab, out;
        s_batch(i * 8, res.rows[i], &img, &lab);
        cr_assert_eq(tp_predictor_run(p, &img, &out), TP_OK);
        cr_expect_eq(memcmp(out.data, res.logits[i], out.nbytes), 0,
                     "request %d got another request's logits", i);
        tp_tensor_fini(&out);
        tp_tensor_fini(&img);
        tp_tensor_fini(&lab);
    }
    tp_predictor_destroy(&p);
    pthread_mutex_destroy(&res.mu);
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
