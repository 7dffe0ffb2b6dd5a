/* Example: a small ResNet (basic residual blocks with batch norm, 32-64-128
 * channels, global average pooling) on augmented Fashion-MNIST. Slow on a
 * laptop CPU; made for a GPU or a long run.
 *
 *   build/bin/example-resnet [--logdir DIR] [--tiny] */
#include <towerpack/towerpack.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/optim.h>
#include <towerpack/launch.h>
#include "common.h"

static const tp_input_desc_t inputs[] = {
    {"image", TP_FLOAT32, 3, {-1, 28, 28}},
    {"label", TP_INT32, 1, {-1}},
};

/* relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)) */
static tp_node_t *residual(tp_tower_t *t, const char *scope, tp_node_t *x,
                           int filters, int stride) {
    char name[6][96];
    const char *parts[6] = {"conv1", "bn1", "conv2", "bn2", "proj", "bn_proj"};
    for (int i = 0; i < 6; i++)
        snprintf(name[i], sizeof name[i], "%s/%s", scope, parts[i]);
    tp_node_t *y = tp_conv2d(t, name[0], x, filters, 3, stride, 1, 0);
    y = tp_relu(t, NULL, tp_batch_norm(t, name[1], y));
    y = tp_batch_norm(t, name[3], tp_conv2d(t, name[2], y, filters, 3, 1, 1, 0));
    tp_node_t *shortcut = x;
    if (stride != 1 || tp_node_shape(x)->d[1] != filters)
        shortcut = tp_batch_norm(t, name[5], tp_conv2d(t, name[4], x, filters, 1, stride, 0, 0));
    return tp_relu(t, NULL, tp_add(t, NULL, y, shortcut));
}

static tp_status_t tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    int64_t nchw[] = {-1, 1, 28, 28};
    tp_node_t *x = tp_reshape(t, "nchw", in[0], 4, nchw);
    x = tp_relu(t, NULL, tp_batch_norm(t, "stem/bn", tp_conv2d(t, "stem", x, 32, 3, 1, 1, 0)));
    if (!x)
        return tp_tower_status(t);
    const int filters[3] = {32, 64, 128};
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 2; b++) {
            char scope[32];
            snprintf(scope, sizeof scope, "stage%d/block%d", s + 1, b);
            x = residual(t, scope, x, filters[s], s > 0 && b == 0 ? 2 : 1);
            if (!x)
                return tp_tower_status(t);
        }
    tp_node_t *logits = tp_fc(t, "linear", tp_global_avg_pool(t, "gap", x), 10, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *optimizer(void *user) { return tp_optimizer_sgd(0.02, 0.9, 1); }

int main(int argc, char **argv) {
    example_args_t a = example_args(argc, argv, "train_log/example-resnet");
    tp_model_desc_t model = {inputs, 2, tower, optimizer, NULL};
    int batch = a.tiny ? 16 : 128;
    char spec[128];
    snprintf(spec, sizeof spec, "fashion-mnist:train | augment crop=28,pad=2,flip | batch %d", batch);
    tp_dataflow_t *train = NULL, *test = NULL;
    if (tp_spec_parse(spec, &train) != TP_OK ||
        tp_spec_parse("fashion-mnist:test,shuffle=0 | augment crop=28 | batch 500 remainder", &test) != TP_OK) {
        fprintf(stderr, "example-resnet: %s\n", tp_last_error());
        tp_dataflow_destroy(&train);
        return 1;
    }
    tp_hp_point_t schedule[] = {{0, 0.02}, {15, 0.002}, {25, 0.0002}};
    tp_callback_t *callbacks[] = {tp_cb_hp_schedule("learning_rate", schedule, 3, 0, 0)};
    if (a.tiny)  /* a few validation batches are enough to show it works */
        test = tp_df_fixed_size(test, 2, 0);
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &model;
    cfg.dataflow = train;
    cfg.validation = test;
    cfg.infer_batch = 500;
    cfg.batch = batch;
    cfg.callbacks = callbacks;
    cfg.ncallbacks = 1;
    cfg.max_epoch = a.tiny ? 1 : 30;
    cfg.steps_per_epoch = a.tiny ? 2 : 0;
    cfg.logdir = a.logdir;
    if (tp_launch_train_with_config(&cfg, NULL) != TP_OK) {
        fprintf(stderr, "example-resnet: %s\n", tp_last_error());
        return 1;
    }
    return 0;
}
