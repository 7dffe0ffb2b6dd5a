/* Example: a CNN with batch normalisation and dropout, trained on augmented
 * images (random crop with 2 pixels of padding, horizontal flip), with a
 * step schedule for the learning rate and a saver that keeps the best
 * model. The augmentor normalises images to float32, so the image input is
 * float32 here.
 *
 *   build/bin/example-cnn-bn [--logdir DIR] [--tiny]
 * The same network as tp-train's `--model cnn-bn` (three blocks, weight
 * decay); docs/training.md has its measured accuracy. */
#include <towerpack/towerpack.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/optim.h>
#include <towerpack/launch.h>
#include "common.h"

static const tp_input_desc_t inputs[] = {
    {"image", TP_FLOAT32, 3, {-1, 28, 28}},
    {"label", TP_INT32, 1, {-1}},
};

/* conv 3x3 -> batch norm -> relu -> 2x2 max pool */
static tp_node_t *block(tp_tower_t *t, const char *scope, tp_node_t *x, int filters) {
    char bn[64];
    snprintf(bn, sizeof bn, "%s/bn", scope);
    x = tp_conv2d(t, scope, x, filters, 3, 1, -1, 0);
    x = tp_relu(t, NULL, tp_batch_norm(t, bn, x));
    return tp_max_pool(t, NULL, x, 2, 2, 0);
}

static tp_status_t tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    int64_t nchw[] = {-1, 1, 28, 28};
    tp_node_t *x = tp_reshape(t, "nchw", in[0], 4, nchw);
    x = block(t, "conv0", x, 32);                            /* [B,32,14,14] */
    x = block(t, "conv1", x, 64);                            /* [B,64,7,7] */
    x = block(t, "conv2", x, 128);                           /* [B,128,3,3] */
    x = tp_relu(t, NULL, tp_fc(t, "fc0", tp_flatten(t, "flat", x), 256, 1));
    x = tp_dropout(t, "dropout", x, 0.3f);
    tp_node_t *logits = tp_fc(t, "linear", x, 10, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    /* Weight decay: an L2 penalty on every weight ("<scope>/W"), added to
     * the cost that is minimised; "cost" stays the cross-entropy. */
    tp_node_t *decay = tp_l2_decay(t, "weight_decay", "*/W", 5e-4f);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, tp_add(t, "total_cost", cost, decay));
}

static tp_optimizer_t *optimizer(void *user) { return tp_optimizer_sgd(0.02, 0.9, 0); }

int main(int argc, char **argv) {
    example_args_t a = example_args(argc, argv, "train_log/example-cnn-bn");
    tp_model_desc_t model = {inputs, 2, tower, optimizer, NULL};
    tp_dataflow_t *train = NULL, *test = NULL;
    if (tp_spec_parse("fashion-mnist:train | augment crop=28,pad=2,flip | batch 128", &train) != TP_OK ||
        tp_spec_parse("fashion-mnist:test,shuffle=0 | augment crop=28 | batch 500 remainder", &test) != TP_OK) {
        fprintf(stderr, "example-cnn-bn: %s\n", tp_last_error());
        tp_dataflow_destroy(&train);
        return 1;
    }
    int epochs = a.tiny ? 1 : 20;
    tp_hp_point_t schedule[] = {{0, 0.02}, {10, 0.002}, {15, 0.0002}};
    tp_callback_t *callbacks[] = {
        tp_cb_hp_schedule("learning_rate", schedule, 3, 0, 0),
        tp_cb_max_saver("validation_accuracy", NULL),
    };
    if (a.tiny)  /* a few validation batches are enough to show it works */
        test = tp_df_fixed_size(test, 2, 0);
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &model;
    cfg.dataflow = train;
    cfg.validation = test;
    cfg.infer_batch = 500;
    cfg.batch = 128;
    cfg.callbacks = callbacks;
    cfg.ncallbacks = 2;
    cfg.max_epoch = epochs;
    cfg.steps_per_epoch = a.tiny ? 3 : 0;
    cfg.logdir = a.logdir;
    if (tp_launch_train_with_config(&cfg, NULL) != TP_OK) {
        fprintf(stderr, "example-cnn-bn: %s\n", tp_last_error());
        return 1;
    }
    return 0;
}
