/* tp-predict: the predictor it runs, also what `tp-bench predict` measures
 * (one definition, so that the benchmark times the tool's model). */
#ifndef TP_TOOLS_ZOO_PREDICTOR_H
#define TP_TOOLS_ZOO_PREDICTOR_H

#include <towerpack/models.h>
#include <towerpack/predict.h>

/* What the predictor's model points to: keep it while the predictor lives. */
typedef struct {
    tp_zoo_options_t zo;
    tp_model_desc_t desc;
} tpp_zoo_model_t;

/* The zoo classifier `zoo` over `inputs` (tp_zoo_from_checkpoint's) with
 * the classes and the normalisation `info` records (normalising inside the
 * model if the run did), its weights from ckpt: "image" in, "logits" out,
 * `batch` rows a call at most, on `threads` BLAS threads, bf16 products as
 * tp_predict_config_t.bf16 (-1: $TP_CPU_BF16 decides). keep, inputs and
 * info outlive it. NULL, the error set, on failure. Caller owns. */
static inline tp_predictor_t *tpp_zoo_predictor_new(tpp_zoo_model_t *keep,
                                                    const tp_zoo_model_t *zoo,
                                                    const tp_input_desc_t *inputs,
                                                    const tp_zoo_data_t *info,
                                                    const char *ckpt, int64_t batch,
                                                    int threads, int bf16) {
    static const char *const ins[] = {"image"}, *const outs[] = {"logits"};
    keep->zo = (tp_zoo_options_t){.classes = info->nclasses, .data = info};
    keep->desc = (tp_model_desc_t){inputs, 2, zoo->build, NULL, &keep->zo};
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    pc.model = &keep->desc;
    pc.checkpoint = ckpt;
    pc.input_names = ins;
    pc.ninput_names = 1;
    pc.output_names = outs;
    pc.noutput_names = 1;
    pc.max_batch = batch;
    pc.threads = threads;
    pc.bf16 = bf16;
    return tp_predictor_new(&pc);
}

#endif
