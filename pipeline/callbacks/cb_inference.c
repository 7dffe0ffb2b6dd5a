/* towerpack pipeline: InferenceRunner (validation after every epoch) with
 * ScalarStats and ClassificationError. Runs the model's inference graph on
 * the trainer's thread, at the epoch barrier; the input actors keep
 * prefetching training data meanwhile. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <towerpack/graph.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>

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
} s_runner_t;

static tp_status_t runner_before_train(void *impl, tp_trainer_t *tr) {
    s_runner_t *r = impl;
    if (!tp_trainer_model(tr))
        return tp_error(TP_ERR_STATE, "InferenceRunner needs a trainer with a model");
    return tp_dataflow_reset_state(r->df, 0, 0);
}

static tp_status_t runner_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_runner_t *r = impl;
    tp_model_t *m = tp_trainer_model(tr);
    for (size_t i = 0; i < r->n; i++)
        r->infs[i].sum = 0;
    double rows = 0;
    tp_datapoint_t *dp = NULL;
    tp_status_t rc;
    int64_t batches = 0;
    while ((rc = tp_dataflow_next(r->df, &dp)) == TP_OK) {
        int nc = tp_datapoint_size(dp);
        tp_tensor_t inputs[16];
        if (nc > 16) {
            tp_datapoint_destroy(&dp);
            return tp_error(TP_ERR_SHAPE, "InferenceRunner: %d components", nc);
        }
        tp_datapoint_views(dp, inputs, nc);
        double b = nc > 0 && inputs[0].ndim > 0 ? (double)inputs[0].shape[0] : 1;
        tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
        rc = tp_model_run(m, -1, inputs, nc, NULL, 0, &fwd);
        if (rc < 0) {
            tp_datapoint_destroy(&dp);
            return tp_error_wrap(rc, "InferenceRunner: batch %lld", (long long)batches);
        }
        for (size_t i = 0; i < r->n; i++) {
            tp_tensor_t v;
            rc = tp_model_fetch(m, -1, r->infs[i].output, &v);
            if (rc < 0) {
                tp_datapoint_destroy(&dp);
                return tp_error_wrap(rc, "InferenceRunner");
            }
            /* through the backend: on a GPU the view is device memory */
            union { float f; int32_t i; } u;
            const void *p = v.dtype == TP_FLOAT32 || v.dtype == TP_INT32
                                ? tp_model_view_host(m, &v, &u, sizeof u)
                                : NULL;
            if (!p && (v.dtype == TP_FLOAT32 || v.dtype == TP_INT32)) {
                tp_tensor_fini(&v);
                tp_datapoint_destroy(&dp);
                return tp_error_wrap(TP_ERR_DEVICE, "InferenceRunner: reading %s",
                                     r->infs[i].output);
            }
            double x = v.dtype == TP_FLOAT32 ? ((const float *)p)[0]
                     : v.dtype == TP_INT32 ? ((const int32_t *)p)[0]
                     : NAN;
            tp_tensor_fini(&v);
            r->infs[i].sum += r->infs[i].kind == TP_INFER_SCALAR_STATS ? x * b : x;
        }
        rows += b;
        batches++;
        tp_datapoint_destroy(&dp);
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
    tp_dataflow_destroy(&r->df);
    free(r->infs);
    free(r);
}

static const tp_callback_ops_t s_runner_ops = {
    .name = "InferenceRunner",
    .before_train = runner_before_train,
    .trigger_epoch = runner_trigger_epoch,
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
