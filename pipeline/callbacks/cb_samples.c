/* towerpack pipeline: SampleGrid, what people look at while a generative
 * model trains. After every epoch it runs the model's inference graph on a
 * fixed batch (a generator's noise drawn once, test images), tiles the
 * output into one image and hands it to the monitors (tp_trainer_put_image:
 * TensorBoard's Images tab) and to LOGDIR/<prefix>-<epoch>.png. The
 * predictor is made for the call and dropped after it, so it borrows the
 * model only while it runs (InferenceRunner's takes turns with it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/fileio.h>
#include <towerpack/image.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/predict.h>

typedef struct {
    char *output, *prefix, *tag;
    char **names;
    tp_tensor_t *inputs;
    int ninputs;
    float lo, hi;
    int columns;
} s_grid_t;

void tp_sample_grid_opts_init(tp_sample_grid_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    opts->hi = 1.f;
    opts->prefix = "samples";
}

static void s_free(void *impl) {
    s_grid_t *g = impl;
    if (!g)
        return;
    for (int i = 0; i < g->ninputs; i++) {
        free(g->names ? g->names[i] : NULL);
        if (g->inputs)
            tp_tensor_fini(&g->inputs[i]);
    }
    free(g->names);
    free(g->inputs);
    free(g->output);
    free(g->prefix);
    free(g->tag);
    free(g);
}

/* The output on the fixed batch, as a grid image (*grid made). */
static tp_status_t s_render(s_grid_t *g, tp_model_t *m, tp_tensor_t *grid) {
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    pc.input_names = (const char *const *)g->names;
    pc.ninput_names = g->ninputs;
    const char *outs[1] = {g->output};
    pc.output_names = outs;
    pc.noutput_names = 1;
    tp_predictor_t *p = tp_predictor_new_shared(m, &pc);
    if (!p)
        return tp_error_wrap(TP_ERR_INVALID, "SampleGrid");
    tp_tensor_t out;
    tp_status_t rc = tp_predictor_run(p, g->inputs, &out);
    tp_predictor_destroy(&p);
    if (rc < 0)
        return tp_error_wrap(rc, "SampleGrid");
    rc = tp_image_grid(&out, g->lo, g->hi, g->columns, 2, grid);
    tp_tensor_fini(&out);
    return rc < 0 ? tp_error_wrap(rc, "SampleGrid: output '%s'", g->output) : TP_OK;
}

static tp_status_t grid_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_grid_t *g = impl;
    tp_model_t *m = tp_trainer_model(tr);
    if (!m)
        return tp_error(TP_ERR_STATE, "SampleGrid needs a trainer with a model");
    tp_tensor_t grid;
    TP_TRY(s_render(g, m, &grid));
    tp_status_t rc = tp_trainer_put_image(tr, g->tag, &grid);
    const char *dir = tp_trainer_logdir(tr);
    if (rc == TP_OK && *g->prefix && dir) {
        tp_tensor_t view = grid;  /* grey: the encoder takes [H, W] */
        if (view.shape[2] == 1)
            view.ndim = 2;
        void *png = NULL;
        size_t size = 0;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s-%lld.png", dir, g->prefix,
                 (long long)tp_trainer_epoch_num(tr));
        rc = tp_image_encode_png(&view, &png, &size);
        if (rc == TP_OK)
            rc = tp_file_write_atomic(path, png, size);
        free(png);
        if (rc < 0)
            rc = tp_error_wrap(rc, "SampleGrid: %s", path);
    }
    tp_tensor_fini(&grid);
    return rc;
}

static const tp_callback_ops_t s_grid_ops = {
    .name = "SampleGrid",
    .trigger_epoch = grid_trigger_epoch,
    .destroy = s_free,
};

static tp_status_t s_check(const tp_sample_grid_opts_t *o) {
    if (!o || !o->output || !*o->output)
        return tp_error(TP_ERR_INVALID, "SampleGrid: no output named");
    if (o->ninputs < 1 || !o->inputs || !o->input_names)
        return tp_error(TP_ERR_INVALID, "SampleGrid '%s': no fixed inputs", o->output);
    if (!(o->hi > o->lo))
        return tp_error(TP_ERR_INVALID, "SampleGrid '%s': value range [%g, %g]", o->output,
                        (double)o->lo, (double)o->hi);
    for (int i = 0; i < o->ninputs; i++)
        if (!o->input_names[i] || o->inputs[i].ndim < 1 ||
            o->inputs[i].shape[0] != o->inputs[0].shape[0])
            return tp_error(TP_ERR_INVALID, "SampleGrid '%s': input %d (%s) is not a batch "
                            "of the first one's %lld rows", o->output, i,
                            o->input_names[i] ? o->input_names[i] : "unnamed",
                            o->inputs[0].ndim ? (long long)o->inputs[0].shape[0] : 0LL);
    return TP_OK;
}

tp_callback_t *tp_cb_sample_grid(const tp_sample_grid_opts_t *o) {
    if (s_check(o) < 0)
        return NULL;
    s_grid_t *g = calloc(1, sizeof *g);
    int ok = g && (g->names = calloc((size_t)o->ninputs, sizeof *g->names)) &&
             (g->inputs = calloc((size_t)o->ninputs, sizeof *g->inputs)) &&
             (g->output = strdup(o->output)) &&
             (g->prefix = strdup(o->prefix ? o->prefix : "")) &&
             (g->tag = strdup(o->tag ? o->tag : o->output));
    if (g)
        g->ninputs = o->ninputs;
    for (int i = 0; ok && i < o->ninputs; i++) {
        tp_tensor_init_empty(&g->inputs[i]);
        ok = (g->names[i] = strdup(o->input_names[i])) &&
             tp_tensor_copy(&g->inputs[i], &o->inputs[i]) == TP_OK;
    }
    if (!ok) {
        s_free(g);
        tp_error(TP_ERR_NOMEM, "SampleGrid '%s'", o->output);
        return NULL;
    }
    g->lo = o->lo;
    g->hi = o->hi;
    g->columns = o->columns;
    return tp_callback_new(&s_grid_ops, g, /*chief_only=*/1);
}
