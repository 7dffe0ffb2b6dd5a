/* towerpack tests: training a model through launch_train_with_config:
 * validation, checkpoints, resume that ends bit-identical, towers sharing the
 * total batch, hyper-parameter schedules reaching the optimizer. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/models.h>
#include <towerpack/launch.h>
#include <towerpack/towerpack.h>
#include "tfevents_testutil.h"
#include "train_testutil.h"
#include "dir_testutil.h"

#define NPOINTS 512

/* Four Gaussian blobs in 2-D: an easy, fast, deterministic problem. */
static tp_dataflow_t *s_blobs(int batch, int shuffle, int remainder) {
    return tu_blobs(NPOINTS, 4, 0.7f, 99, batch, shuffle, remainder);
}

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    return tu_mlp(t, in, 32);
}

static const tp_model_desc_t s_model = {tu_blob_inputs, 2, s_tower, tu_sgd_opt, NULL};

/* AdamW with the global-norm clip and the weights' average: more
 * optimizer state to resume (the moments, the step count in the bias
 * corrections, the average) */
static tp_optimizer_t *s_opt_adamw(void *user) {
    (void)user;
    tp_optimizer_t *o = tp_optimizer_adamw(0.01, 0.9, 0.999, 1e-8, 0.05);
    if (o && (tp_optimizer_set(o, "clip_norm", 0.5) < 0 ||
              tp_optimizer_set(o, "ema_decay", 0.9) < 0))
        tp_optimizer_destroy(&o);
    return o;
}
static const tp_model_desc_t s_model_adamw = {tu_blob_inputs, 2, s_tower, s_opt_adamw, NULL};

/* Adam accumulating 3 steps' gradients: 16 steps an epoch leave a partial
 * sum in every epoch's checkpoint */
static tp_optimizer_t *s_opt_accumulate(void *user) {
    (void)user;
    tp_optimizer_t *o = tp_optimizer_adam(0.01, 0.9, 0.999, 1e-8);
    if (o && tp_optimizer_set(o, "accumulate", 3) < 0)
        tp_optimizer_destroy(&o);
    return o;
}
static const tp_model_desc_t s_model_accumulate = {tu_blob_inputs, 2, s_tower, s_opt_accumulate,
                                                   NULL};
static const tp_model_desc_t *s_desc = &s_model; /* s_config's */

static void s_config(tp_train_config_t *c, const char *logdir, int towers,
                     int batch, int64_t epochs) {
    tp_train_config_init(c);
    c->model = s_desc;
    c->towers = towers;
    c->batch = batch;
    c->dataflow = s_blobs(batch, 1, 0);
    c->max_epoch = epochs;
    c->logdir = logdir;
    c->threads = 1;
    c->seed = 7;
    c->progress_names = "cost";
}

Test(train, learns_validates_saves_and_writes_stats) {
    char *dir = dt_new("tp-train");
    tp_train_config_t c;
    s_config(&c, dir, 1, 32, 3);
    c.validation = s_blobs(100, 0, 1);
    c.infer_batch = 100;
    tp_model_t *m = NULL;
    tp_free(tp_alloc((size_t)1 << 20));  /* a block kept for reuse (not under ASan) */
    cr_assert_eq(tp_launch_train_with_config(&c, &m), TP_OK, "%s", tp_last_error());
    cr_assert_not_null(m);
    cr_assert_eq(tp_alloc_cached_bytes(), 0, "blocks kept for reuse are freed after training");
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s", err.text);
    cr_assert_eq(json_array_size(j), 3);
    json_t *last = json_array_get(j, 2);
    double acc = json_real_value(json_object_get(last, "validation_accuracy"));
    cr_assert(acc > 0.9, "validation_accuracy %g", acc);
    cr_assert_eq(json_integer_value(json_object_get(last, "global_step")), 3 * 16);
    cr_assert(json_real_value(json_object_get(last, "throughput")) > 0);
    json_decref(j);
    char ckpt[256];
    cr_assert_eq(tp_checkpoint_find_latest(dir, ckpt, sizeof ckpt), TP_OK);
    snprintf(path, sizeof path, "%s/model-48.safetensors", dir);
    cr_assert_str_eq(ckpt, path);
    tp_model_destroy(&m);
    dt_remove(dir);
}

/* Every variable of two models, bit for bit. */
static void s_same_vars(tp_model_t *a, tp_model_t *b, float tol) {
    cr_assert_eq(tp_model_var_count(a), tp_model_var_count(b));
    for (int i = 0; i < tp_model_var_count(a); i++) {
        const char *name = tp_model_var_name(a, i);
        tp_tensor_t va, vb;
        cr_assert_eq(tp_model_var(a, name, &va), TP_OK);
        cr_assert_eq(tp_model_var(b, name, &vb), TP_OK);
        cr_assert_eq(va.nbytes, vb.nbytes);
        const float *x = va.data, *y = vb.data;
        for (size_t k = 0; k < va.nbytes / 4; k++) {
            if (tol == 0)
                cr_assert_eq(memcmp(&x[k], &y[k], 4), 0, "%s[%zu]: %.9g vs %.9g", name, k, x[k], y[k]);
            else
                cr_assert(fabsf(x[k] - y[k]) <= tol, "%s[%zu]: %.9g vs %.9g", name, k, x[k], y[k]);
        }
        tp_tensor_fini(&va);
        tp_tensor_fini(&vb);
    }
}

static void s_resume_case(int towers, int batch) {
    char *straight = dt_new("tp-train"), *broken = dt_new("tp-train");
    tp_train_config_t c;
    tp_model_t *a = NULL, *b = NULL;
    s_config(&c, straight, towers, batch, 4);
    cr_assert_eq(tp_launch_train_with_config(&c, &a), TP_OK, "%s", tp_last_error());
    s_config(&c, broken, towers, batch, 2);
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    s_config(&c, broken, towers, batch, 4);
    c.auto_resume = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, &b), TP_OK, "%s", tp_last_error());
    s_same_vars(a, b, 0);
    /* stats.json continued: 4 records, epochs 1..4 */
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", broken);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_eq(json_array_size(j), 4);
    json_decref(j);
    tp_model_destroy(&a);
    tp_model_destroy(&b);
    dt_remove(straight);
    dt_remove(broken);
}

Test(train, resume_ends_bit_identical) { s_resume_case(1, 32); }

/* Two tower actors: the data order and the all-reduce order are fixed, so
 * a resumed run is still bit for bit the unbroken one. */
Test(train, resume_with_two_towers_ends_bit_identical) { s_resume_case(2, 16); }

/* AdamW's moments and step, under a clip, and the weights' average
 * (s_same_vars compares optimizer/<var>/ema too), on one tower (the fused
 * update) and two (the sliced one) */
Test(train, resume_with_adamw_clip_and_ema_ends_bit_identical) {
    s_desc = &s_model_adamw;
    s_resume_case(1, 32);
    s_resume_case(2, 16);
}

/* a checkpoint mid-sum (optimizer/<var>/accum, optimizer/accumulated) */
Test(train, resume_mid_accumulation_ends_bit_identical) {
    s_desc = &s_model_accumulate;
    s_resume_case(1, 32);
    s_resume_case(2, 16);
}

Test(train, two_towers_share_the_total_batch) {
    tp_train_config_t c;
    tp_model_t *one = NULL, *two = NULL, *ps = NULL;
    s_config(&c, NULL, 1, 32, 2);
    c.dataflow = (tp_dataflow_destroy(&c.dataflow), s_blobs(32, 0, 0));
    c.default_callbacks = 0;
    cr_assert_eq(tp_launch_train_with_config(&c, &one), TP_OK, "%s", tp_last_error());
    s_config(&c, NULL, 2, 16, 2);
    c.dataflow = (tp_dataflow_destroy(&c.dataflow), s_blobs(16, 0, 0));
    c.steps_per_epoch = 16;
    c.default_callbacks = 0;
    cr_assert_eq(tp_launch_train_with_config(&c, &two), TP_OK, "%s", tp_last_error());
    s_config(&c, NULL, 2, 16, 2);
    c.dataflow = (tp_dataflow_destroy(&c.dataflow), s_blobs(16, 0, 0));
    c.steps_per_epoch = 16;
    c.default_callbacks = 0;
    c.trainer = TP_TRAINER_PARAMETER_SERVER;
    cr_assert_eq(tp_launch_train_with_config(&c, &ps), TP_OK, "%s", tp_last_error());
    s_same_vars(one, two, 1e-5f);
    s_same_vars(one, ps, 1e-5f);
    tp_model_destroy(&one);
    tp_model_destroy(&two);
    tp_model_destroy(&ps);
}

Test(train, schedule_reaches_the_optimizer_and_bad_config_is_refused) {
    tp_train_config_t c;
    tp_model_t *m = NULL;
    s_config(&c, NULL, 1, 32, 3);
    c.default_callbacks = 0;
    tp_hp_point_t pts[] = {{0, 0.05}, {2, 0.005}};
    tp_callback_t *cbs[] = {tp_cb_hp_schedule("learning_rate", pts, 2, 0, 0)};
    c.callbacks = cbs;
    c.ncallbacks = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, &m), TP_OK, "%s", tp_last_error());
    double lr;
    cr_assert_eq(tp_model_get_hparam(m, "learning_rate", &lr), TP_OK);
    cr_assert_float_eq(lr, 0.005, 1e-12);
    tp_model_destroy(&m);

    s_config(&c, NULL, 1, 32, 0);
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "max_epoch >= 1 (got 0)"));
}

Test(train, dummy_input_and_a_wrong_input_shape) {
    tp_train_config_t c;
    s_config(&c, NULL, 1, 32, 1);
    tp_dataflow_destroy(&c.dataflow);
    c.input = tp_input_dummy(&s_model, 32, 4, 1);
    c.steps_per_epoch = 5;
    c.default_callbacks = 0;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    /* A dataflow with one component for a two-input model. */
    s_config(&c, NULL, 1, 32, 1);
    tp_dataflow_destroy(&c.dataflow);
    int idx[] = {0};
    c.dataflow = tp_df_select_component(s_blobs(32, 0, 0), idx, 1);
    c.default_callbacks = 0;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_ERR_SHAPE);
    cr_assert(strstr(tp_last_error(), "the dataflow's first datapoint has 1 component, "
                                      "the model has 2 inputs (x, label)"),
              "%s", tp_last_error());
}

/* InferenceRunner's numbers equal a separate evaluation of the same model
 * on the same data; MaxSaver saves exactly when the statistic improves. */
Test(train, inference_runner_matches_a_separate_evaluation) {
    char *dir = dt_new("tp-train");
    tp_train_config_t c;
    s_config(&c, dir, 1, 32, 3);
    c.validation = s_blobs(100, 0, 1);
    c.infer_batch = 100;
    tp_callback_t *cbs[] = {tp_cb_max_saver("validation_accuracy", NULL)};
    c.callbacks = cbs;
    c.ncallbacks = 1;
    tp_model_t *m = NULL;
    cr_assert_eq(tp_launch_train_with_config(&c, &m), TP_OK, "%s", tp_last_error());
    /* Evaluate by hand: forward every validation batch, weight by rows. */
    tp_dataflow_t *val = s_blobs(100, 0, 1);
    cr_assert_eq(tp_dataflow_reset_state(val, 0, 0), TP_OK);
    tp_datapoint_t *dp;
    double correct = 0, rows = 0;
    while (tp_dataflow_next(val, &dp) == TP_OK) {
        tp_tensor_t in[2];
        tp_datapoint_views(dp, in, 2);
        tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
        cr_assert_eq(tp_model_run(m, -1, in, 2, NULL, 0, &fwd), TP_OK, "%s",
                     tp_last_error());
        tp_tensor_t acc;
        cr_assert_eq(tp_model_fetch(m, -1, "accuracy", &acc), TP_OK);
        correct += ((const float *)acc.data)[0] * (double)in[0].shape[0];
        rows += (double)in[0].shape[0];
        tp_tensor_fini(&acc);
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&val);
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j);
    double best = -1;
    int best_epoch = 0;
    for (size_t i = 0; i < json_array_size(j); i++) {
        double v = json_real_value(json_object_get(json_array_get(j, i), "validation_accuracy"));
        if (v > best) {
            best = v;
            best_epoch = (int)i + 1;
        }
    }
    double last = json_real_value(json_object_get(json_array_get(j, 2), "validation_accuracy"));
    cr_assert_float_eq(last, correct / rows, 1e-6, "runner %g, by hand %g", last, correct / rows);
    json_decref(j);
    /* The best epoch's model was saved: its weights give the best accuracy. */
    snprintf(path, sizeof path, "%s/max-validation_accuracy.safetensors", dir);
    cr_assert_eq(access(path, R_OK), 0, "MaxSaver wrote %s", path);
    cr_assert_eq(tp_checkpoint_load(m, path, TP_LOAD_STRICT, NULL), TP_OK, "%s", tp_last_error());
    tp_train_state_t st;
    cr_assert_eq(tp_checkpoint_load(m, path, TP_LOAD_STRICT, &st), TP_OK);
    cr_assert_eq(st.epoch, best_epoch, "saved after epoch %lld, best was %d",
                 (long long)st.epoch, best_epoch);
    tp_model_destroy(&m);
    dt_remove(dir);
}

/* The tower of s_model plus a per-row output: the input x itself ([b, 2]). */
static tp_status_t s_tower_rows(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_tower_add_output(t, "x_copy", tp_scale(t, "x_copy", in[0], 1.0f));
    return s_tower(t, in, user);
}
static const tp_model_desc_t s_model_rows = {tu_blob_inputs, 2, s_tower_rows, tu_sgd_opt,
                                             NULL};

/* ScalarStats of a non-scalar output is the mean over all its elements
 * (tensorpack's np.mean), weighted by rows: not element [0] of each batch
 * (issue 46 bug 1). */
Test(train, scalar_stats_average_every_element_of_an_output) {
    char *dir = dt_new("tp-train");
    tp_train_config_t c;
    s_config(&c, dir, 1, 32, 1);
    c.model = &s_model_rows;
    c.infer_batch = 100;
    tp_inferencer_t inf = {TP_INFER_SCALAR_STATS, "x_copy", NULL};
    tp_callback_t *cbs[] = {tp_cb_inference_runner(s_blobs(100, 0, 1), &inf, 1)};
    c.callbacks = cbs;
    c.ncallbacks = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    /* by hand: every element of every batch, and element [0] alone */
    tp_dataflow_t *val = s_blobs(100, 0, 1);
    cr_assert_eq(tp_dataflow_reset_state(val, 0, 0), TP_OK);
    tp_datapoint_t *dp;
    double all = 0, first = 0, rows = 0;
    while (tp_dataflow_next(val, &dp) == TP_OK) {
        tp_tensor_t in[2];
        tp_datapoint_views(dp, in, 2);
        const float *x = in[0].data;
        for (int64_t k = 0; k < in[0].shape[0] * 2; k++)
            all += x[k];
        first += x[0] * (double)in[0].shape[0];
        rows += (double)in[0].shape[0];
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&val);
    const double want = all / (rows * 2);
    cr_assert(fabs(want - first / rows) > 0.05, "the data tells the two apart");
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s", err.text);
    double got = json_real_value(json_object_get(json_array_get(j, 0), "validation_x_copy"));
    json_decref(j);
    cr_assert_float_eq(got, want, 1e-5, "validation_x_copy %g, the mean of every element %g "
                       "(element [0]'s: %g)", got, want, first / rows);
    dt_remove(dir);
}

/* ---- a newcomer's mistakes (issue 46): said at launch, before any file ---- */

/* A log directory the launch is to make: it must not exist afterwards. */
/* the parent s_unmade made, removed when the test's process ends (a
 * refused launch leaves it empty) */
static char s_unmade_parent[64];

static void s_unmade_remove(void) {
    if (s_unmade_parent[0])
        dt_remove(s_unmade_parent);
}

static const char *s_unmade(char *buf, size_t size) {
    if (!s_unmade_parent[0]) {
        snprintf(s_unmade_parent, sizeof s_unmade_parent, "%s", dt_new("tp-train"));
        atexit(s_unmade_remove);
    }
    snprintf(buf, size, "%s/run", s_unmade_parent);
    return buf;
}

/* The launch fails with `want` in its message and leaves no trace. */
static void s_refused(tp_train_config_t *c, const char *logdir, tp_status_t rc,
                      const char *want) {
    tp_status_t got = tp_launch_train_with_config(c, NULL);
    cr_assert_eq(got, rc, "status %d, want %d: %s", got, rc, tp_last_error());
    cr_assert(strstr(tp_last_error(), want), "message: %s\nwant: %s", tp_last_error(), want);
    cr_assert_neq(access(logdir, F_OK), 0, "the failed launch made %s", logdir);
}

static const tp_model_desc_t s_model_no_opt = {tu_blob_inputs, 2, s_tower, NULL, NULL};

Test(train, a_model_without_optimizer_is_refused_before_the_logdir) {
    char dir[128];
    tp_train_config_t c;
    s_config(&c, s_unmade(dir, sizeof dir), 1, 32, 1);
    c.model = &s_model_no_opt;
    s_refused(&c, dir, TP_ERR_INVALID, "tp_model_desc_t.optimizer is NULL");
}

Test(train, config_errors_name_the_broken_rule) {
    char dir[128];
    tp_train_config_t c;
    s_config(&c, s_unmade(dir, sizeof dir), 1, 32, 1);
    tp_dataflow_destroy(&c.dataflow);
    s_refused(&c, dir, TP_ERR_INVALID, "no dataflow and no input");
    s_config(&c, dir, 0, 32, 1);
    s_refused(&c, dir, TP_ERR_INVALID, "TrainConfig.towers: need 1..64 towers (got 0)");
    s_config(&c, dir, 1, 32, 1);
    c.batch = 0;
    s_refused(&c, dir, TP_ERR_INVALID, "TrainConfig.batch: need batch >= 1 (got 0)");
    s_config(&c, dir, 1, 32, 1);
    c.model = NULL;
    s_refused(&c, dir, TP_ERR_INVALID, "TrainConfig.model is NULL");
    s_config(&c, dir, 1, 32, 1);
    c.trainer = (tp_trainer_kind_t)3;
    s_refused(&c, dir, TP_ERR_INVALID, "TrainConfig.trainer: 3 is no trainer kind");
}

/* The model takes 3 features, the data gives 2. */
static const tp_input_desc_t s_inputs3[] = {
    {"x", TP_FLOAT32, 2, {-1, 3}},
    {"label", TP_INT32, 1, {-1}},
};
static const tp_model_desc_t s_model3 = {s_inputs3, 2, s_tower, tu_sgd_opt, NULL};

Test(train, the_first_datapoint_is_checked_against_the_inputs_at_launch) {
    char dir[128];
    tp_train_config_t c;
    s_config(&c, s_unmade(dir, sizeof dir), 1, 32, 1);
    c.model = &s_model3;
    s_refused(&c, dir, TP_ERR_SHAPE, "input 'x' (input 0): the model takes float32 [?,3], "
                                     "the dataflow's first datapoint gives float32 [32,2]");
    /* two towers: each one's first batch */
    s_config(&c, dir, 2, 16, 1);
    c.model = &s_model3;
    s_refused(&c, dir, TP_ERR_SHAPE, "input 'x' (input 0)");
}

/* A conv straight on [N,H*W]-like data. */
static tp_status_t s_tower_conv(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *h = tp_conv2d(t, "conv0", in[0], 8, 3, 1, 1, 1);
    tp_node_t *logits = tp_fc(t, "fc1", h, 4, 1);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}
static const tp_model_desc_t s_model_conv = {tu_blob_inputs, 2, s_tower_conv, tu_sgd_opt,
                                             NULL};

Test(train, a_conv_on_a_tensor_that_is_not_nchw_says_so) {
    char dir[128];
    tp_train_config_t c;
    s_config(&c, s_unmade(dir, sizeof dir), 1, 32, 1);
    c.model = &s_model_conv;
    s_refused(&c, dir, TP_ERR_INVALID, "a conv needs a [N,C,H,W] input (rank 4), got [32,2] (rank 2)");
}

/* One ModelSaver of one's own and the default save_checkpoints: the default
 * steps aside (two wrote the same files and training failed at the end);
 * two of one's own are refused before anything is made. */
Test(train, an_own_model_saver_replaces_the_default_one) {
    char *dir = dt_new("tp-train");
    tp_train_config_t c;
    s_config(&c, dir, 1, 32, 3);
    c.default_callbacks = 0;
    tp_callback_t *cbs[] = {tp_cb_periodic_trigger(tp_cb_model_saver(2, 0), 0, 1)};
    c.callbacks = cbs;
    c.ncallbacks = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    char path[256];
    for (int step = 16; step <= 48; step += 16) {
        snprintf(path, sizeof path, "%s/model-%d.safetensors", dir, step);
        cr_assert_eq(access(path, F_OK) == 0, step > 16, "%s (max_to_keep 2)", path);
    }
    dt_remove(dir);
    /* the case: a plain ModelSaver, the default callbacks on */
    dir = dt_new("tp-train");
    s_config(&c, dir, 1, 32, 3);
    tp_callback_t *own[] = {tp_cb_model_saver(3, 0)};
    c.callbacks = own;
    c.ncallbacks = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    snprintf(path, sizeof path, "%s/model-48.safetensors", dir);
    cr_assert_eq(access(path, F_OK), 0, "%s", path);
    dt_remove(dir);

    char unmade[128];
    s_config(&c, s_unmade(unmade, sizeof unmade), 1, 32, 1);
    tp_callback_t *two[] = {tp_cb_model_saver(2, 0), tp_cb_model_saver(5, 0)};
    c.callbacks = two;
    c.ncallbacks = 2;
    s_refused(&c, unmade, TP_ERR_INVALID, "2 ModelSavers: they would write the same "
                                          "model-STEP.safetensors files");
}

/* A fetch nobody gives: one warning naming it; the launch's failure is
 * logged as well as returned. */
Test(train, an_unknown_fetch_is_warned_once_and_a_failure_is_logged) {
    char *dir = dt_new("tp-train"), log[160];
    snprintf(log, sizeof log, "%s/test.log", dir);
    cr_assert_eq(tp_log_set_file(log), TP_OK);
    tp_train_config_t c;
    s_config(&c, NULL, 1, 32, 2);
    c.progress_names = "cost,loss";
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    s_config(&c, NULL, 1, 32, 1);
    c.model = &s_model_no_opt;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_ERR_INVALID);
    tp_log_set_file(NULL);
    char text[65536] = "";
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    const char *w = "fetch 'loss' asked for by a callback: no tower gives it";
    const char *first = strstr(text, w);
    cr_assert(first, "no warning about 'loss' in:\n%s", text);
    cr_assert_null(strstr(first + 1, w), "warned more than once:\n%s", text);
    cr_assert_null(strstr(text, "fetch 'cost'"), "%s", text);
    cr_assert(strstr(text, "tp_model_desc_t.optimizer is NULL"), "not logged:\n%s", text);
    dt_remove(dir);
}

/* TensorBoard gets the cost and the metrics every log_every_n_steps steps,
 * each the mean of the steps since the last point (issue 46). */
Test(train, tensorboard_gets_the_cost_every_n_steps) {
    char why[256], out[8192];
    const char *py = te_python(why, sizeof why);
    if (!py)
        cr_skip_test("%s", why);
    char *dir = dt_new("tp-train");
    tp_train_config_t c;
    s_config(&c, dir, 1, 32, 2);   /* 16 steps an epoch */
    c.log_every_n_steps = 4;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert_eq(te_check(py, dir, "--stats --print=cost_step --print=accuracy_step", out,
                          sizeof out), 0, "%s", out);
    const char *p = strstr(out, "check_tfevents: cost_step ");
    cr_assert(p, "%s", out);
    int steps[16], n = 0;
    double first = 0, last = 0;
    p += strlen("check_tfevents: cost_step ");
    while (n < 16 && *p && *p != '\n') {
        double v;
        int k;
        cr_assert_eq(sscanf(p, "%d=%lf%n", &steps[n], &v, &k), 2, "%s", p);
        if (n == 0)
            first = v;
        last = v;
        n++;
        p += k;
        while (*p == ' ')
            p++;
    }
    cr_assert_eq(n, 8, "8 points in 32 steps: %s", out);
    for (int i = 0; i < n; i++)
        cr_assert_eq(steps[i], 4 * (i + 1), "%s", out);
    cr_assert_lt(last, first, "the loss goes down: %s", out);
    cr_assert(strstr(out, "check_tfevents: accuracy_step 4="), "%s", out);
    dt_remove(dir);
}

/* ---- a steady-state step touches no fresh pages ------------------------------ */

/* Each step's buffers must be the previous step's: a buffer freed and
 * allocated again every step above glibc's mmap threshold (or trimmed off
 * the heap's top) is unmapped and faulted back in, each page zeroed by the
 * kernel (a few percent of a small model's step; docs/performance.md,
 * "Page faults in a training step"). The GPT on two towers, after a
 * warm-up, counts the process's minor page faults over STEADY steps. */
#define WARMUP 6
#define STEADY 24

typedef struct {
    long minflt[2];  /* after step WARMUP and after step WARMUP + STEADY */
} s_faults_t;

static long s_minflt(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static tp_status_t s_faults_step(void *impl, tp_trainer_t *tr) {
    s_faults_t *f = impl;
    int64_t step = tp_trainer_global_step(tr);
    if (step == WARMUP)
        f->minflt[0] = s_minflt();
    else if (step == WARMUP + STEADY)
        f->minflt[1] = s_minflt();
    return TP_OK;
}
static const tp_callback_ops_t s_faults_ops = {.name = "PageFaults",
                                               .trigger_step = s_faults_step};

static tp_optimizer_t *s_opt_gpt(void *user) {
    (void)user;
    return tp_optimizer_adamw(1e-3, 0.9, 0.95, 1e-8, 0.1);
}

Test(train, steady_state_steps_fault_no_fresh_pages) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    cr_skip_test("the sanitizers' allocators map fresh memory on purpose");
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    cr_skip_test("the sanitizers' allocators map fresh memory on purpose");
#endif
#endif
    char *dir = dt_new("tp-train");
    char file[128], spec[256];
    snprintf(file, sizeof file, "%s/corpus.txt", dir);
    FILE *fp = fopen(file, "wb");
    cr_assert_not_null(fp);
    for (int i = 0; i < 600; i++)
        fprintf(fp, "%d: the quick brown fox jumps over the lazy dog %d times.\n", i, i % 9);
    fclose(fp);
    /* activations of 2 x 64 x 128 floats (64 KiB), the MLP's 4x (256 KiB),
     * AdamW's moments: blocks on both sides of the mmap threshold */
    enum { CONTEXT = 64, BATCH = 2 };
    tp_input_desc_t inputs[2];
    cr_assert_eq(tp_zoo_gpt_inputs(CONTEXT, inputs), TP_OK, "%s", tp_last_error());
    tp_zoo_gpt_options_t opts = {.layers = 2, .heads = 4, .embed = 128};
    tp_model_desc_t desc = {inputs, 2, tp_zoo_gpt_build, s_opt_gpt, &opts};
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &desc;
    c.towers = 2;
    c.batch = BATCH;
    c.threads = 1;
    c.seed = 5;
    snprintf(spec, sizeof spec, "text:%s,context=%d | batch %d", file, CONTEXT, BATCH);
    cr_assert_eq(tp_spec_parse(spec, &c.dataflow), TP_OK, "%s", tp_last_error());
    c.max_epoch = 1;
    c.steps_per_epoch = WARMUP + STEADY + 2;
    c.default_callbacks = 0;
    s_faults_t *f = calloc(1, sizeof *f);
    tp_callback_t *cb = tp_callback_new(&s_faults_ops, f, 0);
    cr_assert_not_null(cb);
    c.callbacks = &cb;
    c.ncallbacks = 1;
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    cr_assert(f->minflt[0] > 0 && f->minflt[1] > 0, "both counts taken");
    long per_step = (f->minflt[1] - f->minflt[0]) / STEADY;
    /* measured 0-1 a step; one 256 KiB buffer faulted in again each step
     * would add 64 */
    cr_assert_lt(per_step, 8, "%ld minor page faults a steady step (%ld over %d steps)",
                 per_step, f->minflt[1] - f->minflt[0], STEADY);
    free(f);
    dt_remove(dir);
}
