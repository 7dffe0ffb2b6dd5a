/* Example: a custom trainer with its own run_step, in the manner of
 * tensorpack's GAN trainers. The model has two costs over two groups of
 * variables; the trainer alternates them: even steps minimise "feat_cost"
 * over the feature extractor (feat/...), odd steps minimise "head_cost" over
 * the classifier head (head/...). Everything else (the input, the epoch
 * loop, callbacks, checkpoints, stats.json) is the stock engine.
 *
 *   build/bin/example-custom-trainer [--logdir DIR] [--tiny]
 *
 * The recipe (docs/training.md, "Writing a trainer"):
 *   1. the tower function declares its costs with tp_tower_add_cost, each
 *      with a pattern naming the variables it trains;
 *   2. a tp_trainer_ops_t whose run_step takes a batch (tp_input_next),
 *      runs a training step of the chosen cost (tp_model_run with
 *      tp_run_opts_t.cost), and fills the fetches callbacks asked for;
 *   3. tp_trainer_new, callbacks, tp_trainer_train. */
#include <towerpack/towerpack.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/optim.h>
#include <towerpack/launch.h>
#include <towerpack/trainer_loop.h>
#include "common.h"

static const tp_input_desc_t inputs[] = {
    {"image", TP_UINT8, 3, {-1, 28, 28}},
    {"label", TP_INT32, 1, {-1}},
};

static tp_status_t tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *x = tp_flatten(t, "flat", tp_cast(t, "input", in[0], 1.0f / 255));
    x = tp_relu(t, NULL, tp_fc(t, "feat/fc0", x, 256, 1));
    tp_node_t *logits = tp_fc(t, "head/linear", x, 10, 1);
    tp_node_t *xent = tp_softmax_xent(t, "xent", logits, in[1]);
    /* the head also pays a weight decay: two different costs */
    tp_node_t *head_cost = tp_add(t, "head_cost", xent,
                                  tp_l2_decay(t, "decay", "head/*/W", 1e-4f));
    tp_tower_add_output(t, "xent", xent);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    TP_TRY(tp_tower_add_cost(t, "feat_cost", xent, "feat/*"));
    return tp_tower_add_cost(t, "head_cost", head_cost, "head/*");
}

static tp_optimizer_t *optimizer(void *user) { return tp_optimizer_sgd(0.05, 0.9, 0); }

/* ---- the trainer ---------------------------------------------------------- */

typedef struct {
    tp_model_t *model;
    tp_input_t *input;
    int64_t batch;
} alt_trainer_t;

static const char *const costs[2] = {"feat_cost", "head_cost"};

static tp_status_t alt_run_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    alt_trainer_t *a = impl;
    /* The global step decides, so a resumed run alternates as before. */
    const char *cost = costs[tp_trainer_global_step(tr) % 2];
    tp_datapoint_t *dp = NULL;
    TP_TRY(tp_input_next(a->input, 0, &dp));
    tp_tensor_t views[2];
    tp_datapoint_views(dp, views, 2);
    /* forward, backward and update of this cost's variables only */
    tp_run_opts_t o = {.stages = TP_RUN_TRAIN, .cost = cost};
    tp_status_t rc = tp_model_run(a->model, 0, views, 2, NULL, 0, &o);
    tp_input_release(a->input, 0, &dp);  /* the input frees it off this thread */
    TP_TRY(rc);
    /* Fetches: whatever scalar outputs the callbacks asked for. */
    for (int k = 0; k < tp_fetches_count(f); k++) {
        tp_tensor_t v;
        float x;
        const float *p = NULL;
        /* a fetched view is device memory on a GPU: read it through the
         * model (no copy on the CPU) */
        if (tp_model_fetch(a->model, 0, tp_fetches_name(f, k), &v) == TP_OK &&
            v.dtype == TP_FLOAT32)
            p = tp_model_view_host(a->model, &v, &x, sizeof x);
        if (p)
            tp_fetches_set(f, tp_fetches_name(f, k), p[0]);
    }
    tp_clear_error();  /* a name this model lacks is not an error */
    return TP_OK;
}

static tp_status_t alt_set_hp(void *impl, const char *name, double v) {
    return tp_model_set_hparam(((alt_trainer_t *)impl)->model, name, v);
}
static tp_status_t alt_get_hp(void *impl, const char *name, double *v) {
    return tp_model_get_hparam(((alt_trainer_t *)impl)->model, name, v);
}
static int64_t alt_samples(void *impl) { return ((alt_trainer_t *)impl)->batch; }
static tp_model_t *alt_model(void *impl) { return ((alt_trainer_t *)impl)->model; }
static void alt_destroy(void *impl) {
    alt_trainer_t *a = impl;
    tp_input_destroy(&a->input);
    tp_model_destroy(&a->model);
    free(a);
}

static const tp_trainer_ops_t alt_ops = {
    .name = "AlternatingTrainer", .run_step = alt_run_step,
    .set_hyperparam = alt_set_hp, .get_hyperparam = alt_get_hp,
    .samples_per_step = alt_samples, .model = alt_model, .destroy = alt_destroy,
};

static int fail(const char *what) {
    fprintf(stderr, "example-custom-trainer: %s: %s\n", what, tp_last_error());
    return 1;
}

int main(int argc, char **argv) {
    example_args_t args = example_args(argc, argv, "train_log/example-custom-trainer");
    tp_model_desc_t desc = {inputs, 2, tower, optimizer, NULL};
    tp_dataflow_t *train = NULL, *test = NULL;
    if (tp_spec_parse("fashion-mnist:train | batch 128", &train) != TP_OK)
        return fail("training data");
    if (tp_spec_parse("fashion-mnist:test,shuffle=0 | batch 500 remainder", &test) != TP_OK) {
        tp_dataflow_destroy(&train);
        return fail("test data");
    }
    if (args.tiny)
        test = tp_df_fixed_size(test, 2, 0);

    alt_trainer_t *a = calloc(1, sizeof *a);
    if (!a)
        return 1;
    a->batch = 128;
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 128;
    mc.infer_batch = 500;   /* the InferenceRunner's graph */
    mc.seed = 1;
    a->model = tp_model_new(&desc, &mc);
    a->input = tp_input_queue(train, 0);  /* the prefetching default */
    tp_trainer_t *tr = tp_trainer_new(&alt_ops, a);  /* takes a */
    if (!tr || !a->model || !a->input || tp_input_start(a->input, 1, 1, 0) < 0) {
        tp_dataflow_destroy(&test);
        tp_trainer_destroy(&tr);
        return fail("setting up");
    }
    tp_trainer_set_logdir(tr, args.logdir);
    if (tp_mkdirs(args.logdir) < 0) {
        tp_dataflow_destroy(&test);
        tp_trainer_destroy(&tr);
        return fail("log directory");
    }
    tp_inferencer_t inf = {TP_INFER_SCALAR_STATS, "accuracy", NULL};
    tp_callback_t *cbs[] = {
        tp_cb_inference_runner(test, &inf, 1),
        tp_cb_model_saver(3, 0),
        tp_cb_epoch_mean("xent"),
        tp_cb_progress_bar("xent", NULL),
        tp_cb_throughput(),
        tp_cb_json_writer(),
        tp_cb_scalar_printer(),
    };
    tp_status_t rc = TP_OK;
    for (size_t i = 0; i < sizeof cbs / sizeof cbs[0]; i++)
        if (rc >= 0)
            rc = tp_trainer_add_callback(tr, &cbs[i]);
        else
            tp_callback_destroy(&cbs[i]);
    tp_schedule_t sched = {1, args.tiny ? 1 : 10, args.tiny ? 6 : tp_input_size(a->input)};
    if (rc >= 0)
        rc = tp_trainer_train(tr, &sched);
    double acc = 0;
    int have = tp_trainer_get_scalar(tr, "validation_accuracy", &acc) == TP_OK;
    tp_trainer_destroy(&tr);
    if (rc < 0)
        return fail("training");
    if (have)
        printf("validation accuracy %.4f\n", acc);
    return 0;
}
