/* Example: a multi-layer perceptron on Fashion-MNIST, written with the C
 * API the way a user would: describe the inputs, write the tower function,
 * pick an optimizer, and hand everything to launch_train_with_config.
 *
 *   build/bin/example-mlp [--logdir DIR] [--tiny]
 * Reaches about 0.88 test accuracy in 10 epochs. */
#include <towerpack/towerpack.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/optim.h>
#include <towerpack/launch.h>
#include "common.h"

/* The inputs: a batch of images and their labels; dim 0 is the batch. */
static const tp_input_desc_t inputs[] = {
    {"image", TP_UINT8, 3, {-1, 28, 28}},
    {"label", TP_INT32, 1, {-1}},
};

/* The tower function: called once per tower to build the graph. */
static tp_status_t tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *x = tp_cast(t, "input", in[0], 1.0f / 255);  /* [B,28,28] in [0,1] */
    x = tp_flatten(t, "flat", x);                            /* [B,784] */
    x = tp_relu(t, NULL, tp_fc(t, "fc0", x, 512, 1));
    x = tp_relu(t, NULL, tp_fc(t, "fc1", x, 256, 1));
    tp_node_t *logits = tp_fc(t, "linear", x, 10, 1);        /* [B,10] */
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *optimizer(void *user) { return tp_optimizer_sgd(0.05, 0.9, 0); }

int main(int argc, char **argv) {
    example_args_t a = example_args(argc, argv, "train_log/example-mlp");
    tp_model_desc_t model = {inputs, 2, tower, optimizer, NULL};

    tp_dataflow_t *train = NULL, *test = NULL;
    if (tp_spec_parse("fashion-mnist:train | batch 128", &train) != TP_OK ||
        tp_spec_parse("fashion-mnist:test,shuffle=0 | batch 500 remainder", &test) != TP_OK) {
        fprintf(stderr, "example-mlp: %s\n", tp_last_error());
        tp_dataflow_destroy(&train);
        return 1;
    }
    if (a.tiny)  /* a few validation batches are enough to show it works */
        test = tp_df_fixed_size(test, 2, 0);
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &model;
    cfg.dataflow = train;
    cfg.validation = test;          /* validation_accuracy after every epoch */
    cfg.infer_batch = 500;
    cfg.batch = 128;
    cfg.max_epoch = a.tiny ? 1 : 10;
    cfg.steps_per_epoch = a.tiny ? 5 : 0;
    cfg.logdir = a.logdir;
    tp_status_t rc = tp_launch_train_with_config(&cfg, NULL);
    if (rc != TP_OK) {
        fprintf(stderr, "example-mlp: %s\n", tp_last_error());
        return 1;
    }
    return 0;
}
