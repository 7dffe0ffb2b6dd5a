/* towerpack pipeline: InferenceRunner (validation after every epoch) with
 * ScalarStats and ClassificationError. As tensorpack's runs an
 * OfflinePredictor-like callable over the trainer's variables, this one runs
 * its batches through a predictor (pipeline/predict) made over the trainer's
 * live model: the same run path tp-predict uses, the inference graph pruned
 * to the inferencers' outputs, the weights borrowed as they are at the
 * epoch barrier. It runs on the trainer's thread; the input actors keep
 * prefetching training data meanwhile. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <towerpack/graph.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/predict.h>

typedef struct {
    tp_inferencer_kind_t kind;
    char output[128];
    char summary[160];
    double sum;       /* weighted sum (scalar stats) or wrong count */
} s_inf_t;

typedef struct {
    tp_dataflow_t *df;
    s_inf_t *infs;
    size_t n;
    tp_predictor_t *pred;  /* over the trainer's model, before..after train */
} s_runner_t;

static tp_status_t runner_before_train(void *impl, tp_trainer_t *tr) {
    s_runner_t *r = impl;
    tp_model_t *m = tp_trainer_model(tr);
    if (!m)
        return tp_error(TP_ERR_STATE, "InferenceRunner needs a trainer with a model");
    tp_predictor_destroy(&r->pred);
    if (r->n > TP_PREDICT_MAX_IO)
        return tp_error(TP_ERR_INVALID, "InferenceRunner: %zu inferencers "
                        "(at most %d)", r->n, TP_PREDICT_MAX_IO);
    int nin = tp_model_input_count(m);
    if (nin > TP_PREDICT_MAX_IO)
        return tp_error(TP_ERR_INVALID, "InferenceRunner: the model has %d "
                        "inputs (at most %d)", nin, TP_PREDICT_MAX_IO);
    if (r->n > 0) {
        /* every input by name, so component i of a batch is input i (as the
         * training towers take them); the outputs may need the label */
        const char *ins[TP_PREDICT_MAX_IO], *outs[TP_PREDICT_MAX_IO];
        for (int i = 0; i < nin; i++)
            ins[i] = tp_model_input_desc(m, i)->name;
        for (size_t i = 0; i < r->n; i++)
            outs[i] = r->infs[i].output;
        tp_predict_config_t pc;
        tp_predict_config_init(&pc);
        pc.input_names = ins;
        pc.ninput_names = nin;
        pc.output_names = outs;
        pc.noutput_names = (int)r->n;
        r->pred = tp_predictor_new_shared(m, &pc);
        if (!r->pred)
            return tp_error_wrap(TP_ERR_INVALID, "InferenceRunner");
    }
    return tp_dataflow_reset_state(r->df, 0, 0);
}

static tp_status_t runner_after_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_runner_t *r = impl;
    /* while the model lives: the trainer gets its whole graph back */
    tp_predictor_destroy(&r->pred);
    return TP_OK;
}

/* One batch through the predictor; each inferencer's scalar added. */
static tp_status_t s_batch(s_runner_t *r, const tp_tensor_t *inputs, double b) {
    tp_tensor_t views[TP_PREDICT_MAX_IO];
    TP_TRY(tp_predictor_run_views(r->pred, inputs, views));
    tp_model_t *m = tp_predictor_model(r->pred);
    for (size_t i = 0; i < r->n; i++) {
        const tp_tensor_t *v = &views[i];
        /* through the backend: on a GPU the view is device memory */
        union { float f; int32_t i; } u;
        int scalar = v->dtype == TP_FLOAT32 || v->dtype == TP_INT32;
        const void *p = scalar ? tp_model_view_host(m, v, &u, sizeof u) : NULL;
        if (scalar && !p)
            return tp_error_wrap(TP_ERR_DEVICE, "InferenceRunner: reading %s",
                                 r->infs[i].output);
        double x = v->dtype == TP_FLOAT32 ? ((const float *)p)[0]
                 : v->dtype == TP_INT32 ? ((const int32_t *)p)[0]
                 : NAN;
        r->infs[i].sum += r->infs[i].kind == TP_INFER_SCALAR_STATS ? x * b : x;
    }
    return TP_OK;
}

static tp_status_t runner_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_runner_t *r = impl;
    if (r->n > 0 && !r->pred)
        return tp_error(TP_ERR_STATE, "InferenceRunner: no predictor (before_train did not run)");
    for (size_t i = 0; i < r->n; i++)
        r->infs[i].sum = 0;
    double rows = 0;
    tp_datapoint_t *dp = NULL;
    tp_status_t rc;
    int64_t batches = 0;
    int nin = r->pred ? tp_predictor_input_count(r->pred) : 0;
    while ((rc = tp_dataflow_next(r->df, &dp)) == TP_OK) {
        int nc = tp_datapoint_size(dp);
        tp_tensor_t inputs[TP_PREDICT_MAX_IO];
        if (nc > TP_PREDICT_MAX_IO || (r->pred && nc != nin)) {
            tp_datapoint_destroy(&dp);
            return tp_error(TP_ERR_SHAPE, "InferenceRunner: batch %lld has %d "
                            "components, the model has %d inputs",
                            (long long)batches, nc, nin);
        }
        tp_datapoint_views(dp, inputs, nc);
        double b = nc > 0 && inputs[0].ndim > 0 ? (double)inputs[0].shape[0] : 1;
        rc = r->pred ? s_batch(r, inputs, b) : TP_OK;
        tp_datapoint_destroy(&dp);
        if (rc < 0)
            return tp_error_wrap(rc, "InferenceRunner: batch %lld", (long long)batches);
        rows += b;
        batches++;
    }
    if (rc < 0)
        return tp_error_wrap(rc, "InferenceRunner: validation data");
    if (rows == 0)
        return tp_error(TP_ERR_STATE, "InferenceRunner: the validation dataflow is empty");
    for (size_t i = 0; i < r->n; i++)
        tp_trainer_put_scalar(tr, r->infs[i].summary, r->infs[i].sum / rows);
    return TP_OK;
}

static void runner_destroy(void *impl) {
    s_runner_t *r = impl;
    tp_predictor_destroy(&r->pred);
    tp_dataflow_destroy(&r->df);
    free(r->infs);
    free(r);
}

static const tp_callback_ops_t s_runner_ops = {
    .name = "InferenceRunner",
    .before_train = runner_before_train,
    .trigger_epoch = runner_trigger_epoch,
    .after_train = runner_after_train,
    .destroy = runner_destroy,
};

tp_callback_t *tp_cb_inference_runner(tp_dataflow_t *df,
                                      const tp_inferencer_t *infs, size_t n) {
    if (!df)
        return NULL;
    s_runner_t *r = calloc(1, sizeof *r);
    if (r)
        r->infs = calloc(n ? n : 1, sizeof *r->infs);
    if (!r || !r->infs) {
        free(r);
        tp_dataflow_destroy(&df);
        tp_error(TP_ERR_NOMEM, "InferenceRunner");
        return NULL;
    }
    r->df = df;
    r->n = n;
    for (size_t i = 0; i < n; i++) {
        s_inf_t *s = &r->infs[i];
        s->kind = infs[i].kind;
        snprintf(s->output, sizeof s->output, "%s", infs[i].output);
        if (infs[i].summary)
            snprintf(s->summary, sizeof s->summary, "%s", infs[i].summary);
        else if (s->kind == TP_INFER_SCALAR_STATS)
            snprintf(s->summary, sizeof s->summary, "validation_%s", infs[i].output);
        else
            snprintf(s->summary, sizeof s->summary, "validation_error");
    }
    return tp_callback_new(&s_runner_ops, r, 0);
}
