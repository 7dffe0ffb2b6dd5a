/* towerpack pipeline: InferenceRunner (validation after every epoch) with
 * ScalarStats, ClassificationError, FlipAccuracy and FlipShiftAccuracy
 * (test-time augmentation: the batch and its mirror image; those and the
 * two shifted by a pixel each way). As tensorpack's runs an
 * OfflinePredictor-like callable over the trainer's variables, this one runs
 * its batches through a predictor (pipeline/predict) made over the trainer's
 * live model: the same run path tp-predict uses, the inference graph pruned
 * to the inferencers' outputs, the weights borrowed as they are at the
 * epoch barrier. It runs on the trainer's thread; the input actors keep
 * prefetching training data meanwhile. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/graph.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/predict.h>

typedef struct {
    tp_inferencer_kind_t kind;
    char output[128];
    char summary[160];
    double sum;       /* weighted sum (scalar stats), wrong or right count */
    float *logits;    /* test-time augmentation: the views' logits, summed */
    size_t cap;       /* floats logits holds */
} s_inf_t;

/* Test-time augmentation's views of input 0 (images [B,H,W] or [B,C,H,W]):
 * view k's pixel (h, w) is the batch's (h + dy, w' + dx), w' = W - 1 - w
 * when mirrored, zero outside the image. FlipAccuracy sums views 0 and 1;
 * FlipShiftAccuracy all six, views 0 and 1 twice (the weights of airbench's
 * multi-view evaluation: the mirror pair half, the shifted pairs half). */
typedef struct {
    int mirror, dy, dx;
} s_view_t;
static const s_view_t s_views[6] = {{0, 0, 0},   {1, 0, 0},  {0, -1, -1},
                                    {1, -1, -1}, {0, 1, 1},  {1, 1, 1}};

static int s_tta(tp_inferencer_kind_t k) {
    return k == TP_INFER_FLIP_ACCURACY || k == TP_INFER_FLIP_SHIFT_ACCURACY;
}

static const char *s_tta_name(tp_inferencer_kind_t k) {
    return k == TP_INFER_FLIP_SHIFT_ACCURACY ? "FlipShiftAccuracy" : "FlipAccuracy";
}

/* How much view k weighs in inferencer kind k's sum (0: not its view). */
static float s_view_weight(tp_inferencer_kind_t kind, int k) {
    if (kind == TP_INFER_FLIP_ACCURACY)
        return k < 2 ? 1.0f : 0.0f;
    if (kind == TP_INFER_FLIP_SHIFT_ACCURACY)
        return k < 2 ? 2.0f : 1.0f;
    return 0.0f;
}

typedef struct {
    tp_dataflow_t *df;
    s_inf_t *infs;
    size_t n;
    int nviews;            /* the views the inferencers need: 1, 2 or 6 */
    tp_predictor_t *pred;  /* over the trainer's model, before..after train */
    tp_tensor_t view;      /* input 0 as a view (s_views) */
    void *host;            /* an output's host copy, hostcap bytes */
    size_t hostcap;
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

/* A test-time augmentation's logits of view k, float32 [b, classes],
 * added with the view's weight into s->logits[0, n) (view 0 sets them);
 * [n, 2n) takes the view's copy from the device. */
static tp_status_t s_tta_logits(tp_model_t *m, s_inf_t *s, const tp_tensor_t *v,
                                int64_t b, int k) {
    const float wt = s_view_weight(s->kind, k);
    if (wt == 0.0f)
        return TP_OK;
    if (v->dtype != TP_FLOAT32 || v->ndim != 2 || v->shape[0] != b || v->shape[1] < 1)
        return tp_error(TP_ERR_SHAPE, "%s: output %s must be float32 "
                        "[%lld, classes] (logits)", s_tta_name(s->kind), s->output,
                        (long long)b);
    const size_t n = (size_t)(v->shape[0] * v->shape[1]);
    if (2 * n > s->cap) {
        float *p = realloc(s->logits, 2 * n * sizeof *p);
        if (!p)
            return tp_error(TP_ERR_NOMEM, "%s: %zu logits", s_tta_name(s->kind), n);
        s->logits = p;
        s->cap = 2 * n;
    }
    const float *h = tp_model_view_host(m, v, s->logits + n, n * sizeof(float));
    if (!h)
        return tp_error_wrap(TP_ERR_DEVICE, "%s: reading %s", s_tta_name(s->kind),
                             s->output);
    for (size_t i = 0; i < n; i++)
        s->logits[i] = k ? s->logits[i] + wt * h[i] : wt * h[i];
    return TP_OK;
}

/* View k of input 0 (s_views) into r->view. */
static tp_status_t s_make_view(s_runner_t *r, const tp_tensor_t *x, int k,
                               tp_inferencer_kind_t kind) {
    const s_view_t *vw = &s_views[k];
    const int need = vw->dy || vw->dx ? 3 : 2;
    if (x->ndim < need || x->shape[x->ndim - 1] < 1)
        return tp_error(TP_ERR_SHAPE, "%s: input 0 has %d axes; it %s images "
                        "[B,H,W] or [B,C,H,W]", s_tta_name(kind), x->ndim,
                        need == 3 ? "shifts and mirrors" : "mirrors");
    tp_tensor_t *o = &r->view;
    if (o->dtype != x->dtype || o->ndim != x->ndim ||
        memcmp(o->shape, x->shape, (size_t)x->ndim * sizeof *x->shape) != 0) {
        tp_tensor_fini(o);
        TP_TRY(tp_tensor_init(o, x->dtype, x->ndim, x->shape));
    }
    const size_t es = tp_dtype_size(x->dtype), w = (size_t)x->shape[x->ndim - 1];
    const size_t h = x->ndim >= 3 ? (size_t)x->shape[x->ndim - 2] : 1;
    const size_t planes = x->nbytes / (es * w * h), row = w * es;
    const unsigned char *src = x->data;
    unsigned char *dst = o->data;
    memset(dst, 0, o->nbytes);  /* the pixels shifted in: zero, as the crop pads */
    for (size_t p = 0; p < planes; p++)
        for (size_t i = 0; i < h; i++) {
            const long si = (long)i + vw->dy;
            if (si < 0 || si >= (long)h)
                continue;
            const unsigned char *in = src + (p * h + (size_t)si) * row;
            unsigned char *out = dst + (p * h + i) * row;
            for (size_t j = 0; j < w; j++) {
                const long sj = (long)(vw->mirror ? w - 1 - j : j) + vw->dx;
                if (sj >= 0 && sj < (long)w)
                    memcpy(out + j * es, in + (size_t)sj * es, es);
            }
        }
    return TP_OK;
}

/* A test-time augmentation's count: rows whose summed logits' argmax is
 * the label. */
static tp_status_t s_tta_count(s_inf_t *s, const tp_tensor_t *labels, int64_t b,
                               int64_t classes) {
    if (labels->dtype != TP_INT32 || labels->ndim != 1 || labels->shape[0] != b)
        return tp_error(TP_ERR_SHAPE, "%s: the last input must be int32 "
                        "labels [%lld]", s_tta_name(s->kind), (long long)b);
    const int32_t *y = labels->data;
    for (int64_t i = 0; i < b; i++) {
        const float *l = s->logits + i * classes;
        int64_t best = 0;
        for (int64_t k = 1; k < classes; k++)
            if (l[k] > l[best])
                best = k;
        s->sum += best == y[i];
    }
    return TP_OK;
}

/* One batch through the predictor; each inferencer's scalar added; with
 * test-time augmentation, the views of the batch after it (s_views). */
static tp_status_t s_batch(s_runner_t *r, const tp_tensor_t *inputs, int nin, double b) {
    tp_tensor_t views[TP_PREDICT_MAX_IO];
    TP_TRY(tp_predictor_run_views(r->pred, inputs, views));
    tp_model_t *m = tp_predictor_model(r->pred);
    const int64_t rows = (int64_t)b;
    for (size_t i = 0; i < r->n; i++) {
        const tp_tensor_t *v = &views[i];
        if (s_tta(r->infs[i].kind)) {
            TP_TRY(s_tta_logits(m, &r->infs[i], v, rows, 0));
            continue;
        }
        /* Every element, as tensorpack's ScalarStats takes np.mean of an
         * output: a per-row output ([b] or [b, k]) is averaged over all its
         * elements, then weighted by the batch's rows (issue 46: reading
         * element [0] alone reported one row's value). ClassificationError
         * sums its count, a scalar or a per-row 0/1 vector alike. */
        if (v->dtype != TP_FLOAT32 && v->dtype != TP_INT32)
            return tp_error(TP_ERR_INVALID, "InferenceRunner: output %s is not "
                            "float32 or int32", r->infs[i].output);
        const size_t numel = v->nbytes / 4;
        if (numel == 0)
            return tp_error(TP_ERR_SHAPE, "InferenceRunner: output %s is empty",
                            r->infs[i].output);
        if (v->nbytes > r->hostcap) {
            void *h = realloc(r->host, v->nbytes);
            if (!h)
                return tp_error(TP_ERR_NOMEM, "InferenceRunner: reading %s",
                                r->infs[i].output);
            r->host = h;
            r->hostcap = v->nbytes;
        }
        /* through the backend: on a GPU the view is device memory */
        const void *p = tp_model_view_host(m, v, r->host, v->nbytes);
        if (!p)
            return tp_error_wrap(TP_ERR_DEVICE, "InferenceRunner: reading %s",
                                 r->infs[i].output);
        double total = 0;
        for (size_t e = 0; e < numel; e++)
            total += v->dtype == TP_FLOAT32 ? (double)((const float *)p)[e]
                                            : (double)((const int32_t *)p)[e];
        r->infs[i].sum += r->infs[i].kind == TP_INFER_SCALAR_STATS
                              ? total / (double)numel * b : total;
    }
    if (r->nviews < 2)
        return TP_OK;
    tp_tensor_t seen[TP_PREDICT_MAX_IO];
    memcpy(seen, inputs, (size_t)nin * sizeof *inputs);
    for (int k = 1; k < r->nviews; k++) {
        /* the name its messages give: a shifted view is FlipShiftAccuracy's */
        TP_TRY(s_make_view(r, &inputs[0], k,
                           r->nviews > 2 ? TP_INFER_FLIP_SHIFT_ACCURACY
                                         : TP_INFER_FLIP_ACCURACY));
        seen[0] = r->view;
        TP_TRY(tp_predictor_run_views(r->pred, seen, views));
        for (size_t i = 0; i < r->n; i++)
            if (s_tta(r->infs[i].kind))
                TP_TRY(s_tta_logits(m, &r->infs[i], &views[i], rows, k));
    }
    /* the last view's outputs say each one's classes (checked per view) */
    for (size_t i = 0; i < r->n; i++)
        if (s_tta(r->infs[i].kind))
            TP_TRY(s_tta_count(&r->infs[i], &inputs[nin - 1], rows, views[i].shape[1]));
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
        rc = r->pred ? s_batch(r, inputs, nc, b) : TP_OK;
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
    for (size_t i = 0; i < r->n; i++)
        free(r->infs[i].logits);
    tp_tensor_fini(&r->view);
    free(r->host);
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
        else if (s->kind == TP_INFER_FLIP_ACCURACY)
            snprintf(s->summary, sizeof s->summary, "validation_flip_accuracy");
        else if (s->kind == TP_INFER_FLIP_SHIFT_ACCURACY)
            snprintf(s->summary, sizeof s->summary, "validation_flip_shift_accuracy");
        else
            snprintf(s->summary, sizeof s->summary, "validation_error");
        const int nv = s->kind == TP_INFER_FLIP_SHIFT_ACCURACY ? 6
                       : s->kind == TP_INFER_FLIP_ACCURACY    ? 2
                                                              : 1;
        r->nviews = nv > r->nviews ? nv : r->nviews;
    }
    return tp_callback_new(&s_runner_ops, r, 0);
}
