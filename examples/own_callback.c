/* Example: a callback of your own. "Patience" watches the training cost:
 * before each step it asks for the step's "cost" (before_run), adds it up
 * after the step (after_run), and at each epoch's end puts the epoch's mean
 * as the scalar "patience/cost" (which stats.json and every monitor see)
 * and asks the trainer to stop when the cost has not improved for
 * `patience` epochs (early stopping). The model is examples/mlp.c's with one
 * hidden layer.
 *
 *   build/bin/example-own-callback [--logdir DIR] [--tiny]
 *
 * The recipe (docs/callbacks.md, "Writing a callback"): fill a static
 * tp_callback_ops_t with the hooks you need (every one may be NULL), wrap
 * your state with tp_callback_new, and hand the callback to the config
 * (tp_train_config_t.callbacks) or to a trainer (tp_trainer_add_callback). */
#include <towerpack/towerpack.h>
#include "common.h"

/* ---- the callback ------------------------------------------------------------ */

typedef struct {
    int patience;      /* epochs without a better cost before stopping */
    double sum;        /* this epoch's costs, added up */
    int64_t steps;     /* ... over this many steps */
    double best;       /* the lowest epoch mean so far */
    int stale;         /* epochs since it improved */
} patience_t;

static tp_status_t s_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    return tp_fetches_request(f, "cost");
}

static tp_status_t s_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    patience_t *p = impl;
    double cost;
    if (tp_fetches_get(f, "cost", &cost) == TP_OK) {
        p->sum += cost;
        p->steps++;
    }
    return TP_OK;
}

static tp_status_t s_trigger_epoch(void *impl, tp_trainer_t *tr) {
    patience_t *p = impl;
    if (p->steps == 0)
        return TP_OK;
    double mean = p->sum / (double)p->steps;
    p->sum = 0;
    p->steps = 0;
    tp_trainer_put_scalar(tr, "patience/cost", mean);
    if (mean < p->best) {
        p->best = mean;
        p->stale = 0;
    } else if (++p->stale >= p->patience) {
        tp_trainer_request_stop(tr, "Patience: the cost stopped improving", 0);
    }
    return TP_OK;
}

static const tp_callback_ops_t patience_ops = {
    .name = "Patience",
    .before_run = s_before_run,
    .after_run = s_after_run,
    .trigger_epoch = s_trigger_epoch,
    .destroy = free,
};

/* A Patience callback (caller owns), or NULL with tp_last_error(). */
static tp_callback_t *patience_new(int patience) {
    patience_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->patience = patience;
    p->best = 1e300;
    return tp_callback_new(&patience_ops, p, /*chief_only=*/0);
}

int main(int argc, char **argv) {
    example_args_t a = example_args(argc, argv, "train_log/example-own-callback");
    /* the model is beside the point here: common.h's MLP */
    tp_model_desc_t model = {example_mlp_inputs, 2, example_mlp_tower,
                             example_mlp_optimizer, NULL};
    tp_dataflow_t *train = NULL;
    if (tp_spec_parse("fashion-mnist:train | batch 128", &train) != TP_OK) {
        fprintf(stderr, "example-own-callback: %s\n", tp_last_error());
        return 1;
    }
    tp_callback_t *cbs[] = {patience_new(2)};
    if (!cbs[0]) {
        fprintf(stderr, "example-own-callback: %s\n", tp_last_error());
        tp_dataflow_destroy(&train);
        return 1;
    }
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &model;
    cfg.dataflow = train;
    cfg.batch = 128;
    cfg.callbacks = cbs;            /* taken */
    cfg.ncallbacks = 1;
    cfg.max_epoch = a.tiny ? 2 : 20;
    cfg.steps_per_epoch = a.tiny ? 5 : 0;
    cfg.logdir = a.logdir;
    if (tp_launch_train_with_config(&cfg, NULL) != TP_OK) {
        fprintf(stderr, "example-own-callback: %s\n", tp_last_error());
        return 1;
    }
    return 0;
}
