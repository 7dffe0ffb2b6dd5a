/* towerpack tests: an untrained checkpoint recorded as a given model, for
 * the tools' tests of what a tool refuses by the model a checkpoint holds
 * (test_proc_export.c, test_proc_predict.c). Include after Criterion,
 * towerpack/models.h and towerpack/towerpack.h. */
#ifndef TP_TESTS_NAMED_CKPT_TESTUTIL_H
#define TP_TESTS_NAMED_CKPT_TESTUTIL_H

#include <string.h>

/* An untrained checkpoint at path saved as model `name`
 * (tp_model_set_name, what the tools read): "gpt" a real GPT (1 layer,
 * width 8, context 8), any other name the zoo's mlp recorded under that
 * name. The test fails if it cannot be written. */
static inline void tt_named_checkpoint(const char *name, const char *path) {
    tp_input_desc_t in[2];
    tp_zoo_gpt_options_t go = {.layers = 1, .heads = 1, .embed = 8};
    int gpt = !strcmp(name, "gpt");
    if (gpt)
        cr_assert_eq(tp_zoo_gpt_inputs(8, in), TP_OK, "%s", tp_last_error());
    else
        cr_assert_eq(tp_zoo_inputs_sized(28, 28, in), TP_OK, "%s", tp_last_error());
    tp_model_desc_t md = {in, 2, gpt ? tp_zoo_gpt_build : tp_zoo_find("mlp")->build, NULL,
                          gpt ? &go : NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = 0;
    mc.infer_batch = 2;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_model_set_name(m, name), TP_OK);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    tp_model_destroy(&m);
}

#endif
