/* towerpack tests: a custom trainer with its own run_step (tensorpack's GAN
 * trainers' pattern): two named costs over two variable groups, alternated
 * step by step. Checks the graph's multi-cost backward against the
 * single-cost one, that each step moves only its own group, and that the
 * alternating trainer learns. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include <towerpack/optim.h>
#include <towerpack/launch.h>
#include <towerpack/trainer_loop.h>
#include "train_testutil.h"

#define NPOINTS 256
#define BATCH 32

static tp_dataflow_t *s_blobs(int batch) { return tu_blobs(NPOINTS, 4, 0.6f, 5, batch, 1, 0); }

/* user: NULL builds the single-cost reference; non-NULL the two costs:
 * "cost_a" (the cross-entropy) over the a group, "cost_b" (cross-entropy plus a
 * weight decay of the b group) over the b group. */
static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *h = tp_relu(t, NULL, tp_fc(t, "a/fc0", in[0], 16, 1));
    tp_node_t *logits = tp_fc(t, "b/fc1", h, 4, 1);
    tp_node_t *xent = tp_softmax_xent(t, "xent", logits, in[1]);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    tp_tower_add_output(t, "xent", xent);
    if (!user)
        return tp_tower_set_cost(t, xent);
    tp_node_t *cost_b = tp_add(t, "cost_b", xent, tp_l2_decay(t, "wd", "b/*/W", 1e-4f));
    tp_tower_add_output(t, "cost_b", cost_b);
    TP_TRY(tp_tower_add_cost(t, "cost_a", xent, "a/*"));
    return tp_tower_add_cost(t, "cost_b", cost_b, "b/*");
}

static tp_optimizer_t *s_opt(void *user) { return tp_optimizer_sgd(0.1, 0.9, 0); }

static const tp_input_desc_t s_inputs[] = {
    {"x", TP_FLOAT32, 2, {-1, 2}},
    {"label", TP_INT32, 1, {-1}},
};
static int s_two = 1;
static const tp_model_desc_t s_single = {s_inputs, 2, s_tower, s_opt, NULL};
static const tp_model_desc_t s_double = {s_inputs, 2, s_tower, s_opt, &s_two};

static tp_model_t *s_model(const tp_model_desc_t *d) {
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = BATCH;
    mc.seed = 3;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(d, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

static void s_batch(tp_dataflow_t *df, tp_datapoint_t **dp, tp_tensor_t *views) {
    cr_assert_eq(tp_dataflow_next(df, dp), TP_OK, "%s", tp_last_error());
    tp_datapoint_views(*dp, views, 2);
}

/* A copy of every trainable variable, to see what a step changed. */
typedef struct {
    int n;
    float *v[8];
    size_t count[8];
} s_snap_t;

static void s_snap_take(tp_model_t *m, s_snap_t *s) {
    s->n = 0;
    for (int i = 0; i < tp_model_var_count(m); i++) {
        tp_tensor_t v;
        cr_assert_eq(tp_model_var(m, tp_model_var_name(m, i), &v), TP_OK);
        cr_assert_lt(s->n, 8);
        s->count[s->n] = tp_tensor_numel(&v);
        s->v[s->n] = malloc(v.nbytes);
        memcpy(s->v[s->n], v.data, v.nbytes);
        s->n++;
    }
}

static void s_snap_free(s_snap_t *s) {
    for (int i = 0; i < s->n; i++)
        free(s->v[i]);
    s->n = 0;
}

/* 1 when variable i differs from the snapshot. */
static int s_changed(tp_model_t *m, const s_snap_t *s, int i) {
    tp_tensor_t v;
    cr_assert_eq(tp_model_var(m, tp_model_var_name(m, i), &v), TP_OK);
    return memcmp(v.data, s->v[i], s->count[i] * sizeof(float)) != 0;
}

/* Only the variables whose names start with `group` changed. */
static void s_assert_moved(tp_model_t *m, const s_snap_t *s, const char *group) {
    for (int i = 0; i < tp_model_var_count(m); i++) {
        const char *name = tp_model_var_name(m, i);
        int mine = strncmp(name, group, strlen(group)) == 0;
        cr_assert_eq(s_changed(m, s, i), mine, "%s %s after a %s step", name,
                     mine ? "did not change" : "changed", group);
    }
}

/* tp_model_run of `stages` and `cost` on tower 0 (the models have 2 inputs). */
static tp_status_t s_run(tp_model_t *m, const tp_tensor_t *views, unsigned stages,
                         const char *cost) {
    tp_run_opts_t o = {.stages = stages, .cost = cost};
    return tp_model_run(m, 0, views, views ? 2 : 0, NULL, 0, &o);
}

Test(custom, named_cost_gradients_match_the_single_cost_graph) {
    tp_model_t *ref = s_model(&s_single), *two = s_model(&s_double);
    cr_assert_eq(tp_model_cost_count(two), 3);
    cr_assert_str_eq(tp_model_cost_name(two, 1), "cost_a");
    tp_dataflow_t *df = s_blobs(BATCH);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp = NULL;
    tp_tensor_t views[2];
    s_batch(df, &dp, views);
    cr_assert_eq(s_run(ref, views, TP_RUN_GRADIENTS, NULL), TP_OK, "%s", tp_last_error());
    /* cost_a's backward over the a group: the same gradients as the full backward */
    cr_assert_eq(s_run(two, views, TP_RUN_GRADIENTS, "cost_a"), TP_OK, "%s", tp_last_error());
    const char *avars[] = {"a/fc0/W", "a/fc0/b"};
    for (int k = 0; k < 2; k++) {
        tp_tensor_t g1, g2;
        cr_assert_eq(tp_model_grad(ref, 0, avars[k], &g1), TP_OK);
        cr_assert_eq(tp_model_grad(two, 0, avars[k], &g2), TP_OK);
        const float *x = g1.data, *y = g2.data;
        float norm = 0;
        for (size_t i = 0; i < tp_tensor_numel(&g1); i++) {
            cr_assert_float_eq(x[i], y[i], 1e-6f, "%s[%zu]", avars[k], i);
            norm += fabsf(x[i]);
        }
        cr_assert_gt(norm, 0, "%s has no gradient", avars[k]);
    }
    /* cost_b over the b group: the cross-entropy's gradient plus the decay's */
    cr_assert_eq(s_run(two, views, TP_RUN_GRADIENTS, "cost_b"), TP_OK, "%s", tp_last_error());
    tp_tensor_t g1, g2, w;
    cr_assert_eq(tp_model_grad(ref, 0, "b/fc1/W", &g1), TP_OK);
    cr_assert_eq(tp_model_grad(two, 0, "b/fc1/W", &g2), TP_OK);
    cr_assert_eq(tp_model_var(two, "b/fc1/W", &w), TP_OK);
    for (size_t i = 0; i < tp_tensor_numel(&g1); i++)
        cr_assert_float_eq(((float *)g1.data)[i] + 1e-4f * ((float *)w.data)[i],
                           ((float *)g2.data)[i], 1e-6f, "b/fc1/W[%zu]", i);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
    tp_model_destroy(&ref);
    tp_model_destroy(&two);
}

Test(custom, apply_moves_only_the_costs_variables_and_misuse_is_named) {
    tp_model_t *m = s_model(&s_double);
    tp_dataflow_t *df = s_blobs(BATCH);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp = NULL;
    tp_tensor_t views[2];
    s_batch(df, &dp, views);
    /* no main cost: a run of it says what to do instead */
    cr_assert_eq(s_run(m, views, TP_RUN_GRADIENTS, NULL), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "tp_run_opts_t.cost"), "%s", tp_last_error());
    cr_assert_eq(s_run(m, views, TP_RUN_GRADIENTS, "cost_c"), TP_ERR_NOT_FOUND);
    cr_assert(strstr(tp_last_error(), "'cost_a'") && strstr(tp_last_error(), "'cost_b'"),
              "%s", tp_last_error());
    s_snap_t s;
    for (int round = 0; round < 2; round++) {
        const char *cost = round ? "cost_b" : "cost_a";
        s_snap_take(m, &s);
        cr_assert_eq(s_run(m, views, TP_RUN_GRADIENTS, cost), TP_OK, "%s", tp_last_error());
        cr_assert_eq(s_run(m, NULL, TP_RUN_UPDATE, round ? "cost_a" : "cost_b"),
                     TP_ERR_STATE);
        cr_assert(strstr(tp_last_error(), cost), "%s", tp_last_error());
        cr_assert_eq(s_run(m, NULL, TP_RUN_UPDATE, NULL), TP_ERR_STATE);
        cr_assert_eq(s_run(m, NULL, TP_RUN_REDUCE | TP_RUN_UPDATE, cost), TP_OK, "%s",
                     tp_last_error());
        s_assert_moved(m, &s, round ? "b/" : "a/");
        s_snap_free(&s);
        /* the gradients are used once */
        cr_assert_eq(s_run(m, NULL, TP_RUN_UPDATE, cost), TP_ERR_STATE);
    }
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
    tp_model_destroy(&m);
}

static tp_status_t s_typo_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *logits = tp_fc(t, "a/fc0", in[0], 4, 1);
    tp_node_t *xent = tp_softmax_xent(t, "xent", logits, in[1]);
    return tp_tower_add_cost(t, "cost_a", xent, "nope/*");
}

Test(custom, a_cost_pattern_matching_nothing_is_named_at_build) {
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 4;
    tp_model_desc_t d = {s_inputs, 2, s_typo_tower, s_opt, NULL};
    tp_model_t *m = tp_model_new(&d, &mc);
    cr_assert_null(m);
    cr_assert(strstr(tp_last_error(), "nope/*") && strstr(tp_last_error(), "cost_a"),
              "%s", tp_last_error());
}

/* ---- the custom trainer ------------------------------------------------- */

typedef struct {
    tp_model_t *model;
    tp_input_t *input;
    int64_t ran[2];
} s_alt_t;

static const char *const s_costs[2] = {"cost_a", "cost_b"};

/* Even global steps minimise cost_a over the a group, odd ones cost_b over the b group. */
static tp_status_t alt_run_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_alt_t *a = impl;
    int which = (int)(tp_trainer_global_step(tr) % 2);
    tp_datapoint_t *dp = NULL;
    TP_TRY(tp_input_next(a->input, 0, &dp));
    tp_tensor_t views[2];
    tp_datapoint_views(dp, views, 2);
    tp_status_t rc = s_run(a->model, views, TP_RUN_TRAIN, s_costs[which]);
    tp_input_release(a->input, 0, &dp);
    TP_TRY(rc);
    a->ran[which]++;
    for (int k = 0; k < tp_fetches_count(f); k++) {
        tp_tensor_t v;
        if (tp_model_fetch(a->model, 0, tp_fetches_name(f, k), &v) == TP_OK &&
            v.dtype == TP_FLOAT32)
            tp_fetches_set(f, tp_fetches_name(f, k), ((float *)v.data)[0]);
    }
    return TP_OK;
}

static tp_model_t *alt_model(void *impl) { return ((s_alt_t *)impl)->model; }

static void alt_destroy(void *impl) {
    s_alt_t *a = impl;
    tp_input_destroy(&a->input);
    tp_model_destroy(&a->model);
    free(a);
}

static const tp_trainer_ops_t s_alt_ops = {
    .name = "AlternatingTrainer", .run_step = alt_run_step,
    .model = alt_model, .destroy = alt_destroy,
};

/* A callback that watches every step: which group moved, and the accuracy
 * of the last epoch. */
typedef struct {
    s_snap_t snap;
    int64_t checked;
    double acc_sum;
    int64_t acc_n;
} s_watch_t;

static tp_status_t watch_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_watch_t *w = impl;
    s_snap_take(tp_trainer_model(tr), &w->snap);
    return tp_fetches_request(f, "accuracy");
}

static tp_status_t watch_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_watch_t *w = impl;
    /* global_step has counted this step: it ran at global_step - 1 */
    int even = (tp_trainer_global_step(tr) - 1) % 2 == 0;
    s_assert_moved(tp_trainer_model(tr), &w->snap, even ? "a/" : "b/");
    s_snap_free(&w->snap);
    w->checked++;
    double acc;
    if (tp_trainer_epoch_num(tr) == tp_trainer_schedule(tr)->max_epoch &&
        tp_fetches_get(f, "accuracy", &acc) == TP_OK) {
        w->acc_sum += acc;
        w->acc_n++;
    }
    return TP_OK;
}

static const tp_callback_ops_t s_watch_ops = {
    .name = "Watch", .before_run = watch_before_run, .after_run = watch_after_run,
};

Test(custom, alternating_trainer_alternates_and_learns) {
    s_alt_t *a = calloc(1, sizeof *a);
    a->model = s_model(&s_double);
    a->input = tp_input_queue(s_blobs(BATCH), 0);
    cr_assert_eq(tp_input_start(a->input, 1, 1, 0), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_input_size(a->input), NPOINTS / BATCH);
    tp_trainer_t *tr = tp_trainer_new(&s_alt_ops, a);
    cr_assert_not_null(tr);
    s_watch_t w = {0};
    tp_callback_t *cb = tp_callback_new(&s_watch_ops, &w, 0);
    cr_assert_eq(tp_trainer_add_callback(tr, &cb), TP_OK);
    tp_schedule_t sched = {1, 6, NPOINTS / BATCH};
    cr_assert_eq(tp_trainer_train(tr, &sched), TP_OK, "%s", tp_last_error());
    cr_assert_eq(w.checked, 6 * NPOINTS / BATCH);
    cr_assert_eq(a->ran[0], 3 * NPOINTS / BATCH);
    cr_assert_eq(a->ran[1], 3 * NPOINTS / BATCH);
    cr_assert_gt(w.acc_n, 0);
    cr_assert_gt(w.acc_sum / (double)w.acc_n, 0.9, "last-epoch accuracy %g",
                 w.acc_sum / (double)w.acc_n);
    tp_trainer_destroy(&tr);
}
