/* towerpack pipeline: the offline predictor (tensorpack's PredictConfig +
 * OfflinePredictor) and what a checkpoint says about its model.
 *
 * A predictor is a model with no training tower and one inference graph of
 * max_batch rows, its weights loaded from a checkpoint (weights only: the
 * optimizer's slots and the trainer's state stay in the file), and the
 * graph pruned to the wanted outputs. A call binds the caller's inputs in
 * the model's order (an input no output reads gets an empty tensor), runs
 * forward and copies each output out, so the results outlive the next call
 * and the predictor can serve another thread afterwards.
 *
 * A predictor can also borrow a live model (tp_predictor_new_shared): the
 * trainer's own inference graph, which reads the training variables in
 * place, so it predicts with the weights as they are now; nothing is
 * copied or loaded. It prunes that graph to its outputs while it lives and
 * gives the whole graph back when destroyed. Both kinds run a batch through
 * the same s_forward, with or without copying the outputs out. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <towerpack/checkpoint.h>
#include <towerpack/device.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/predict.h>

struct tp_predictor {
    tp_model_t *model;         /* owned, or borrowed (shared) */
    int shared;                /* the model is a live one we borrow */
    int pruned;                /* we pruned its inference graph */
    uint64_t prune_serial;     /* the model's prune serial after ours */
    tp_backend_t *backend;     /* owned when device >= 0 */
    const tp_input_desc_t *descs; /* the model description's, [nmodel_in] */
    int nmodel_in;
    int nin, nout;
    int in_index[TP_PREDICT_MAX_IO];  /* call input i -> model input */
    char *in_names[TP_PREDICT_MAX_IO];
    char *out_names[TP_PREDICT_MAX_IO];
    int64_t max_batch;
    tp_tensor_t *feeds;        /* [nmodel_in] */
    tp_fetch_t *fetches;       /* [nout] */
};

void tp_predict_config_init(tp_predict_config_t *c) {
    memset(c, 0, sizeof *c);
    c->device = -1;
    c->max_batch = 256;
    c->bf16 = -1;
}

/* ---- checkpoints --------------------------------------------------------- */

tp_status_t tp_checkpoint_resolve(const char *path, char *out, size_t size) {
    struct stat sb;
    if (!path || !*path)
        return tp_error(TP_ERR_INVALID, "no checkpoint given");
    if (stat(path, &sb) != 0)
        return tp_error(TP_ERR_IO, "checkpoint %s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        tp_status_t rc = tp_checkpoint_find_latest(path, out, size);
        if (rc < 0)
            return tp_error_wrap(rc, "log directory %s has no checkpoint", path);
        return TP_OK;
    }
    if ((size_t)snprintf(out, size, "%s", path) >= size)
        return tp_error(TP_ERR_INVALID, "checkpoint path too long: %s", path);
    return TP_OK;
}

/* "image:uint8:28x28;label:int32:" -> input descriptions. */
static tp_status_t s_parse_inputs(const char *text, const char *path,
                                  tp_checkpoint_info_t *info) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    int n = 0;
    for (char *item = strtok_r(buf, ";", &save); item;
         item = strtok_r(NULL, ";", &save)) {
        char *c1 = strchr(item, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || n == TP_PREDICT_MAX_IO)
            return tp_error(TP_ERR_FORMAT, "checkpoint %s: metadata 'inputs' "
                            "item '%s' is not name:dtype:dims", path, item);
        *c1 = *c2 = '\0';
        tp_input_desc_t *d = &info->inputs[n];
        snprintf(info->names[n], sizeof info->names[n], "%s", item);
        d->name = info->names[n];
        if (tp_dtype_parse(c1 + 1, &d->dtype) < 0)
            return tp_error(TP_ERR_FORMAT, "checkpoint %s: input '%s' has "
                            "dtype '%s'", path, item, c1 + 1);
        d->ndim = 1;
        d->shape[0] = -1;
        for (char *p = c2 + 1; *p;) {
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p || v <= 0 || d->ndim == TP_MAX_DIMS ||
                (*end && *end != 'x'))
                return tp_error(TP_ERR_FORMAT, "checkpoint %s: input '%s' "
                                "has dims '%s'", path, item, c2 + 1);
            d->shape[d->ndim++] = v;
            p = *end ? end + 1 : end;
        }
        n++;
    }
    info->ninputs = n;
    return TP_OK;
}

tp_status_t tp_checkpoint_info(const char *path, tp_checkpoint_info_t *info) {
    memset(info, 0, sizeof *info);
    info->epoch = info->global_step = -1;
    tp_safetensors_t *st = NULL;
    TP_TRY(tp_safetensors_open(path, &st));
    const char *model = tp_safetensors_meta(st, "model");
    const char *inputs = tp_safetensors_meta(st, "inputs");
    const char *ep = tp_safetensors_meta(st, "epoch");
    const char *gs = tp_safetensors_meta(st, "global_step");
    if (model)
        snprintf(info->model, sizeof info->model, "%s", model);
    if (ep)
        info->epoch = strtoll(ep, NULL, 10);
    if (gs)
        info->global_step = strtoll(gs, NULL, 10);
    tp_status_t rc = inputs ? s_parse_inputs(inputs, path, info) : TP_OK;
    tp_safetensors_destroy(&st);
    return rc;
}

/* ---- the predictor ------------------------------------------------------- */

static void s_list(char *buf, size_t size, const char *const *names, int n) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? ", " : "", names[i]);
}

/* The valid output names, for a message: the named outputs and metrics,
 * then the nodes. */
static void s_output_list(tp_model_t *m, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = '\0';
    int no = tp_model_output_count(m, -1);
    for (int i = 0; i < no && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%s", o ? ", " : "",
                              tp_model_output_name(m, -1, i));
    if (o < size)
        o += (size_t)snprintf(buf + o, size - o, "%snodes: ", o ? "; " : "");
    size_t nodes_at = o;
    int n = tp_model_node_count(m, -1), shown = 0;
    for (int i = 0; i < n && o < size; i++) {
        tp_node_t *x = tp_model_node(m, -1, i);
        tp_op_kind_t k = tp_node_kind(x);
        if (k == TP_OP_VARIABLE || k == TP_OP_INPUT)
            continue;
        if (shown++ == 24) {
            snprintf(buf + o, size - o, ", ...");
            break;
        }
        o += (size_t)snprintf(buf + o, size - o, "%s%s", o > nodes_at ? ", " : "",
                              tp_node_name(x));
    }
}

void tp_predictor_destroy(tp_predictor_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_predictor_t *p = *self_p;
    if (p->shared) {
        /* give the owner its whole inference graph back, unless another
         * borrower has pruned it for itself since */
        if (p->pruned && tp_model_prune_serial(p->model) == p->prune_serial)
            (void)tp_model_prune(p->model, NULL, 0);
        p->model = NULL;
    }
    tp_model_destroy(&p->model);
    tp_backend_destroy(&p->backend);
    for (int i = 0; i < TP_PREDICT_MAX_IO; i++) {
        free(p->in_names[i]);
        free(p->out_names[i]);
    }
    free(p->feeds);
    free(p->fetches);
    free(p);
    *self_p = NULL;
}

static tp_status_t s_check_names(const tp_predict_config_t *c) {
    if (c->noutput_names < 1 || !c->output_names ||
        c->noutput_names > TP_PREDICT_MAX_IO)
        return tp_error(TP_ERR_INVALID, "predict config: %d output names "
                        "(1..%d)", c->noutput_names, TP_PREDICT_MAX_IO);
    if (c->ninput_names < 0 || c->ninput_names > TP_PREDICT_MAX_IO ||
        (c->ninput_names > 0 && !c->input_names))
        return tp_error(TP_ERR_INVALID, "predict config: %d input names",
                        c->ninput_names);
    return TP_OK;
}

static tp_status_t s_setup_io(tp_predictor_t *p, const tp_predict_config_t *c);

/* A model of our own: built, loaded from the checkpoint. */
static tp_status_t s_setup(tp_predictor_t *p, const tp_predict_config_t *c) {
    const tp_model_desc_t *d = c->model;
    if (!d || !d->build)
        return tp_error(TP_ERR_INVALID, "predict config: no model");
    TP_TRY(s_check_names(c));
    if (c->max_batch < 1)
        return tp_error(TP_ERR_INVALID, "predict config: max_batch %lld",
                        (long long)c->max_batch);
    p->max_batch = c->max_batch;
    p->descs = d->inputs;
    p->nmodel_in = d->ninputs;
    if (c->device >= 0) {
        tp_cuda_options_t co = tp_cuda_options_default();
        co.device = c->device;
        if (c->bf16 >= 0)
            co.bf16 = c->bf16 != 0;
        p->backend = tp_backend_cuda_new(&co);
        if (!p->backend)
            return tp_error_wrap(TP_ERR_DEVICE, "predictor on device %d", c->device);
    } else {
        /* the CPU's bf16 products (before the model plans its workspaces) */
        tp_backend_cpu_bf16_ask(c->bf16);
    }
    /* inference only: no training tower, so no optimizer and no slots */
    tp_model_desc_t md = *d;
    md.optimizer = NULL;
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = 0;
    mc.infer_batch = c->max_batch;
    mc.threads = c->threads;
    mc.backend = p->backend;
    p->model = tp_model_new(&md, &mc);
    if (!p->model)
        return tp_error_wrap(TP_ERR_INVALID, "predictor: building the model");
    if (c->checkpoint) {
        char path[4096];
        TP_TRY(tp_checkpoint_resolve(c->checkpoint, path, sizeof path));
        TP_TRY(tp_checkpoint_load(p->model, path, TP_LOAD_WEIGHTS_ONLY, NULL));
        tp_checkpoint_info_t info;
        if (tp_checkpoint_info(path, &info) == TP_OK && info.model[0])
            TP_TRY(tp_model_set_name(p->model, info.model));
    }
    return s_setup_io(p, c);
}

/* Outputs, pruning, inputs and the feed and fetch arrays, over p->model
 * (ours or a live one) and its input descriptions p->descs. */
static tp_status_t s_setup_io(tp_predictor_t *p, const tp_predict_config_t *c) {
    const int nmodel = p->nmodel_in;
    /* outputs: each must name something of the inference graph */
    for (int j = 0; j < c->noutput_names; j++) {
        const char *name = c->output_names[j];
        if (!name || !tp_model_lookup(p->model, -1, name)) {
            char list[1024];
            s_output_list(p->model, list, sizeof list);
            return tp_error(TP_ERR_NOT_FOUND, "predictor: no output named "
                            "'%s'; the model has: %s", name ? name : "(null)",
                            list);
        }
        if (!(p->out_names[j] = strdup(name)))
            return tp_error(TP_ERR_NOMEM, "predictor");
    }
    p->nout = c->noutput_names;
    TP_TRY(tp_model_prune(p->model, c->output_names, c->noutput_names));
    p->pruned = 1;
    p->prune_serial = tp_model_prune_serial(p->model);
    /* inputs: by name, or every one the outputs read */
    const char *model_names[TP_PREDICT_MAX_IO];
    if (nmodel > TP_PREDICT_MAX_IO)
        return tp_error(TP_ERR_INVALID, "predictor: %d inputs (at most %d)",
                        nmodel, TP_PREDICT_MAX_IO);
    for (int i = 0; i < nmodel; i++)
        model_names[i] = p->descs[i].name;
    int given[TP_PREDICT_MAX_IO] = {0};
    if (c->input_names) {
        for (int i = 0; i < c->ninput_names; i++) {
            const char *name = c->input_names[i];
            int k = -1;
            for (int m = 0; name && m < nmodel; m++)
                if (!strcmp(model_names[m], name))
                    k = m;
            if (k < 0) {
                char list[512];
                s_list(list, sizeof list, model_names, nmodel);
                return tp_error(TP_ERR_NOT_FOUND, "predictor: no input named "
                                "'%s'; the model's inputs are: %s",
                                name ? name : "(null)", list);
            }
            if (given[k])
                return tp_error(TP_ERR_INVALID, "predictor: input '%s' named "
                                "twice", name);
            given[k] = 1;
            p->in_index[p->nin++] = k;
        }
    } else {
        for (int m = 0; m < nmodel; m++)
            if (tp_model_input_needed(p->model, m)) {
                given[m] = 1;
                p->in_index[p->nin++] = m;
            }
    }
    for (int m = 0; m < nmodel; m++)
        if (tp_model_input_needed(p->model, m) && !given[m]) {
            char outs[512];
            s_list(outs, sizeof outs, c->output_names, c->noutput_names);
            return tp_error(TP_ERR_INVALID, "predictor: the outputs (%s) need "
                            "input '%s', which is not among the input names",
                            outs, model_names[m]);
        }
    for (int i = 0; i < p->nin; i++)
        if (!(p->in_names[i] = strdup(model_names[p->in_index[i]])))
            return tp_error(TP_ERR_NOMEM, "predictor");
    p->feeds = calloc((size_t)nmodel + 1, sizeof *p->feeds);
    p->fetches = calloc((size_t)p->nout, sizeof *p->fetches);
    if (!p->feeds || !p->fetches)
        return tp_error(TP_ERR_NOMEM, "predictor");
    for (int m = 0; m < nmodel; m++)
        tp_tensor_init_empty(&p->feeds[m]);
    for (int j = 0; j < p->nout; j++)
        p->fetches[j].name = p->out_names[j];
    return TP_OK;
}

/* A constructor's failure (rc): the half-made predictor destroyed, its
 * error message kept (a destroy may leave another), NULL. */
static tp_predictor_t *s_new_failed(tp_predictor_t **p, tp_status_t rc) {
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", tp_last_error());
    tp_predictor_destroy(p);
    tp_error(rc, "%s", msg);
    return NULL;
}

tp_predictor_t *tp_predictor_new(const tp_predict_config_t *c) {
    tp_predictor_t *p = c ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        tp_error(c ? TP_ERR_NOMEM : TP_ERR_INVALID, "predictor");
        return NULL;
    }
    tp_status_t rc = s_setup(p, c);
    if (rc < 0)
        return s_new_failed(&p, rc);
    return p;
}

tp_predictor_t *tp_predictor_new_shared(tp_model_t *model,
                                        const tp_predict_config_t *c) {
    tp_predictor_t *p = c && model ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        tp_error(c && model ? TP_ERR_NOMEM : TP_ERR_INVALID, "predictor");
        return NULL;
    }
    p->model = model;
    p->shared = 1;
    p->descs = tp_model_input_desc(model, 0);
    p->nmodel_in = tp_model_input_count(model);
    p->max_batch = tp_model_infer_batch(model);
    tp_status_t rc = TP_OK;
    if (c->checkpoint)
        rc = tp_error(TP_ERR_INVALID, "predictor over a live model: it "
                      "predicts with the model's own weights, not checkpoint "
                      "%s", c->checkpoint);
    else if (p->max_batch < 1)
        rc = tp_error(TP_ERR_INVALID, "predictor over a live model: the "
                      "model has no inference graph (tp_model_config_t."
                      "infer_batch)");
    else if ((rc = s_check_names(c)) == TP_OK)
        rc = s_setup_io(p, c);
    if (rc < 0)
        return s_new_failed(&p, rc);
    return p;
}

/* The one run path: bind the call's inputs in the model's order, run the
 * (pruned) inference graph forward; p->fetches then hold views of the
 * outputs, valid until the next run. Allocates nothing. */
static tp_status_t s_forward(tp_predictor_t *p, const tp_tensor_t *inputs) {
    /* a live model's graph pruned by another borrower since: ours again
     * (allocates, but only when two borrowers take turns) */
    if (p->shared && tp_model_prune_serial(p->model) != p->prune_serial) {
        TP_TRY(tp_model_prune(p->model, (const char *const *)p->out_names,
                              p->nout));
        p->prune_serial = tp_model_prune_serial(p->model);
    }
    for (int i = 0; i < p->nin; i++) {
        const tp_tensor_t *x = &inputs[i];
        if (x->ndim < 1 || x->shape[0] < 1 || x->shape[0] > p->max_batch)
            return tp_error(TP_ERR_SHAPE, "predictor: input '%s' has %s%lld "
                            "rows; this predictor takes 1..%lld",
                            p->in_names[i], x->ndim < 1 ? "no batch dim, " : "",
                            x->ndim < 1 ? 0LL : (long long)x->shape[0],
                            (long long)p->max_batch);
        p->feeds[p->in_index[i]] = *x;  /* a borrowed view: read in place */
    }
    tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
    tp_status_t rc = tp_model_run(p->model, -1, p->feeds, p->nmodel_in,
                                  p->fetches, p->nout, &fwd);
    for (int i = 0; i < p->nin; i++)
        tp_tensor_init_empty(&p->feeds[p->in_index[i]]);
    return rc < 0 ? tp_error_wrap(rc, "predictor") : TP_OK;
}

tp_status_t tp_predictor_run_views(tp_predictor_t *p, const tp_tensor_t *inputs,
                                   tp_tensor_t *views) {
    if (!p || (p->nin && !inputs) || !views)
        return tp_error(TP_ERR_INVALID, "predictor run: NULL argument");
    for (int j = 0; j < p->nout; j++)
        tp_tensor_init_empty(&views[j]);
    TP_TRY(s_forward(p, inputs));
    for (int j = 0; j < p->nout; j++)
        views[j] = p->fetches[j].value;
    return TP_OK;
}

tp_status_t tp_predictor_run(tp_predictor_t *p, const tp_tensor_t *inputs,
                             tp_tensor_t *outputs) {
    if (!p || (p->nin && !inputs) || !outputs)
        return tp_error(TP_ERR_INVALID, "predictor run: NULL argument");
    for (int j = 0; j < p->nout; j++)
        tp_tensor_init_empty(&outputs[j]);
    tp_status_t rc = s_forward(p, inputs);
    if (rc < 0)
        return rc;
    for (int j = 0; j < p->nout && rc == TP_OK; j++) {
        const tp_tensor_t *v = &p->fetches[j].value;
        rc = tp_tensor_init(&outputs[j], v->dtype, v->ndim, v->shape);
        if (rc < 0 || !v->nbytes)
            continue;
        /* the CPU gives its own memory back, a device copies into ours */
        const void *h = tp_model_view_host(p->model, v, outputs[j].data, v->nbytes);
        if (!h)
            rc = tp_error_wrap(TP_ERR_DEVICE, "predictor: reading '%s'",
                               p->out_names[j]);
        else if (h != outputs[j].data)
            memcpy(outputs[j].data, h, v->nbytes);
    }
    if (rc < 0)
        for (int j = 0; j < p->nout; j++)
            tp_tensor_fini(&outputs[j]);
    return rc;
}

int tp_predictor_input_count(const tp_predictor_t *p) { return p->nin; }
const char *tp_predictor_input_name(const tp_predictor_t *p, int i) {
    return i >= 0 && i < p->nin ? p->in_names[i] : NULL;
}
const tp_input_desc_t *tp_predictor_input_desc(const tp_predictor_t *p, int i) {
    return i >= 0 && i < p->nin ? &p->descs[p->in_index[i]] : NULL;
}
int tp_predictor_output_count(const tp_predictor_t *p) { return p->nout; }
const char *tp_predictor_output_name(const tp_predictor_t *p, int i) {
    return i >= 0 && i < p->nout ? p->out_names[i] : NULL;
}
int64_t tp_predictor_max_batch(const tp_predictor_t *p) { return p->max_batch; }
tp_model_t *tp_predictor_model(tp_predictor_t *p) { return p->model; }

/* ---- a dataflow through a predictor (SimpleDatasetPredictor) ------------- */

tp_status_t tp_predict_dataflow(tp_predictor_t *p, tp_dataflow_t *df,
                                const int *input_cols, tp_dataset_cb cb,
                                void *user) {
    if (!p || !df || !cb)
        return tp_error(TP_ERR_INVALID, "predict dataflow: NULL argument");
    TP_TRY(tp_dataflow_reset_state(df, 0, 0));
    tp_tensor_t in[TP_PREDICT_MAX_IO], out[TP_PREDICT_MAX_IO];
    tp_datapoint_t *dp = NULL;
    tp_status_t rc;
    int64_t index = 0;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
        int nc = tp_datapoint_size(dp);
        for (int i = 0; i < p->nin && rc == TP_OK; i++) {
            int col = input_cols ? input_cols[i] : i;
            if (col < 0 || col >= nc)
                rc = tp_error(TP_ERR_SHAPE, "predict dataflow: datapoint %lld "
                              "has %d components, input '%s' is component %d",
                              (long long)index, nc, p->in_names[i], col);
            else
                in[i] = *tp_datapoint_cget(dp, col);
        }
        if (rc == TP_OK) {
            rc = tp_predictor_run(p, in, out);
            if (rc < 0)
                rc = tp_error_wrap(rc, "predict dataflow: datapoint %lld",
                                   (long long)index);
        }
        if (rc == TP_OK) {
            rc = cb(dp, out, p->nout, user);
            for (int j = 0; j < p->nout; j++)
                tp_tensor_fini(&out[j]);
        }
        tp_datapoint_destroy(&dp);
        if (rc < 0)
            return rc;
        index++;
    }
    return rc == TP_DONE ? TP_OK : tp_error_wrap(rc, "predict dataflow: the data");
}
