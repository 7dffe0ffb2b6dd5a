/* towerpack fuzzing: the small model whose checkpoint seeds the
 * safetensors target (fuzz/gen_corpus.c writes it, fuzz_safetensors.c
 * loads inputs into it): x[5] -> fc 4 -> relu -> fc 3, SGD with momentum
 * (one optimizer slot per variable, so the optimizer/ names are there). */
#ifndef TOWERPACK_FUZZ_MODEL_H
#define TOWERPACK_FUZZ_MODEL_H

#include <towerpack/towerpack.h>

static tp_status_t fuzz_model_net(tp_tower_t *t, tp_node_t *const *in,
                                  void *u) {
    (void)u;
    tp_node_t *h = tp_relu(t, NULL, tp_fc(t, "fc1", in[0], 4, 0));
    tp_node_t *logits = tp_fc(t, "fc2", h, 3, 1);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "xent", logits, in[1]));
}

static tp_optimizer_t *fuzz_model_opt(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.1, 0.9, 0);
}

/* NULL with tp_last_error() on failure. */
static inline tp_model_t *fuzz_model_new(void) {
    static const tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, 5}},
                                            {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, fuzz_model_net, fuzz_model_opt, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 2;
    cfg.threads = 1;
    cfg.seed = 7;
    return tp_model_new(&md, &cfg);
}

#endif
