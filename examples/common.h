/* towerpack examples: the small things the examples share (reading the
 * two command-line settings they take; the Fashion-MNIST MLP of the
 * examples whose subject is not the model). Not part of the library. */
#ifndef TP_EXAMPLES_COMMON_H
#define TP_EXAMPLES_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>

/* Examples take `--tiny` (a few steps: what the tests run) and `--logdir
 * DIR`. */
typedef struct {
    int tiny;
    const char *logdir;
} example_args_t;

static inline example_args_t example_args(int argc, char **argv, const char *logdir) {
    example_args_t a = {0, logdir};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tiny"))
            a.tiny = 1;
        else if (!strcmp(argv[i], "--logdir") && i + 1 < argc)
            a.logdir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--tiny] [--logdir DIR]\n", argv[0]);
            exit(2);
        }
    }
    return a;
}

/* The model of the examples about something else (a callback, remote
 * workers): Fashion-MNIST images [B,28,28] uint8 and labels, one hidden
 * layer of 256, softmax cross-entropy, SGD (lr 0.05, momentum 0.9).
 * examples/mlp.c walks through a model like it. */
static const tp_input_desc_t example_mlp_inputs[] = {
    {"image", TP_UINT8, 3, {-1, 28, 28}},
    {"label", TP_INT32, 1, {-1}},
};

static inline tp_status_t example_mlp_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *x = tp_flatten(t, "flat", tp_cast(t, "input", in[0], 1.0f / 255));
    x = tp_relu(t, NULL, tp_fc(t, "fc0", x, 256, 1));
    tp_node_t *logits = tp_fc(t, "linear", x, 10, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, cost);
}

static inline tp_optimizer_t *example_mlp_optimizer(void *user) {
    (void)user;
    return tp_optimizer_sgd(0.05, 0.9, 0);
}

#endif
