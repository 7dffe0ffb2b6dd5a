/* towerpack: using a trained model (tensorpack's PredictConfig and
 * OfflinePredictor, MultiThreadAsyncPredictor, DataParallelOfflinePredictor,
 * SimpleDatasetPredictor).
 *
 * A predict config names the model (its input descriptions and tower
 * function), a checkpoint, the inputs the caller will give and the outputs
 * it wants. The predictor builds the tower function's inference graph only
 * (batch norm on its moving averages, dropout off), loads the weights, and
 * prunes the graph to what the outputs need, so an input no output reads
 * (the label of a classifier) is not asked for. A call takes a batch of any
 * size from 1 to the config's max_batch.
 *
 * Threads: one predictor serves one thread at a time (it owns its buffers).
 * For several threads, give each its own predictor, or use the async
 * predictor, whose pool of predictors serves any number of callers. */
#ifndef TOWERPACK_PREDICT_H
#define TOWERPACK_PREDICT_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/dataflow.h>
#include <towerpack/graph.h>
#include <towerpack/status.h>
#include <towerpack/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- checkpoints: what a trained model left behind ----------------------- */

#define TP_PREDICT_MAX_IO 16

/* What a checkpoint says about the model that wrote it. */
typedef struct tp_checkpoint_info {
    char model[64];        /* the model's name ("cnn"), "" when not recorded */
    int ninputs;           /* 0 when not recorded */
    tp_input_desc_t inputs[TP_PREDICT_MAX_IO]; /* names point into names[] */
    char names[TP_PREDICT_MAX_IO][64];
    int64_t epoch;         /* -1 when not recorded */
    int64_t global_step;   /* -1 when not recorded */
} tp_checkpoint_info_t;

/* `path` a checkpoint file, or a log directory (its latest checkpoint, as
 * its `checkpoint` file names it): the file's path into out[size]. */
tp_status_t tp_checkpoint_resolve(const char *path, char *out, size_t size);
/* Read a checkpoint's metadata (model name, inputs, epoch, step). */
tp_status_t tp_checkpoint_info(const char *path, tp_checkpoint_info_t *info);

/* ---- the offline predictor ----------------------------------------------- */

typedef struct tp_predict_config {
    const tp_model_desc_t *model;   /* required: inputs, tower function (the
                                       optimizer factory is not used) */
    const char *checkpoint;         /* a safetensors checkpoint or a log
                                       directory; NULL: the initial values */
    const char *const *input_names; /* the inputs each call gives, in order;
                                       NULL: every input the outputs need */
    int ninput_names;
    const char *const *output_names; /* required: outputs or node names */
    int noutput_names;
    int device;                     /* -1: the CPU (default); >= 0: that
                                       CUDA device */
    int64_t max_batch;              /* rows per call at most (default 256) */
    int threads;                    /* CPU: BLAS threads (0: its default) */
    int bf16;                       /* products on bf16 operands, fp32 sums:
                                       -1 (default) the environment decides
                                       ($TP_CPU_BF16, $TP_CUDA_BF16); 1 on,
                                       0 off. On the CPU it is the process's
                                       (tp_backend_cpu_bf16_ask: said in the
                                       log, a warning where the CPU lacks
                                       bf16); on a GPU the predictor's
                                       backend's (tp_cuda_options_t.bf16) */
} tp_predict_config_t;

/* Defaults: CPU, max_batch 256, every needed input, bf16 -1. */
void tp_predict_config_init(tp_predict_config_t *c);

typedef struct tp_predictor tp_predictor_t;

/* Build, load and prune. Caller owns; NULL with tp_last_error() naming what
 * is wrong: an unknown input or output name (listing the valid ones), an
 * output that needs an input not given, a checkpoint that does not fit the
 * model (each variable with both shapes). */
tp_predictor_t *tp_predictor_new(const tp_predict_config_t *c);
void tp_predictor_destroy(tp_predictor_t **self_p);

/* One call: inputs[i] for input_names[i] (the model's dtype and trailing
 * dims, the same batch 1..max_batch for all); outputs[j] receives a new
 * tensor (caller owns: tp_tensor_fini) for output_names[j]. */
tp_status_t tp_predictor_run(tp_predictor_t *p, const tp_tensor_t *inputs,
                             tp_tensor_t *outputs);

/* A predictor over a live model's weights (the way tensorpack's
 * InferenceRunner shares the trainer's variables): it borrows `model`'s
 * inference graph (tp_model_config_t.infer_batch > 0), which reads the
 * model's variables in place, so each call predicts with the weights as
 * they are then; nothing is copied or loaded (c->checkpoint must be NULL;
 * c->model, device, max_batch and threads are the live model's). It prunes
 * that graph to its outputs and restores the whole graph when destroyed:
 * one such predictor per model at a time, destroyed before the model, and
 * its calls must not overlap the model's training steps. */
tp_predictor_t *tp_predictor_new_shared(tp_model_t *model,
                                        const tp_predict_config_t *c);

/* The same call without copying: views[j] is a borrowed view of output j,
 * valid until the next call (read its data with tp_model_view_host on
 * tp_predictor_model(p): it is device memory on a GPU). Allocates
 * nothing, for loops that reduce each batch at once (validation). */
tp_status_t tp_predictor_run_views(tp_predictor_t *p, const tp_tensor_t *inputs,
                                   tp_tensor_t *views);

int tp_predictor_input_count(const tp_predictor_t *p);
const char *tp_predictor_input_name(const tp_predictor_t *p, int i);
/* The model's description of input i (dtype, dims). */
const tp_input_desc_t *tp_predictor_input_desc(const tp_predictor_t *p, int i);
int tp_predictor_output_count(const tp_predictor_t *p);
const char *tp_predictor_output_name(const tp_predictor_t *p, int i);
int64_t tp_predictor_max_batch(const tp_predictor_t *p);
/* The model inside (the pruned inference graph, for exporters). */
tp_model_t *tp_predictor_model(tp_predictor_t *p);

/* Write the predictor's graph (what its outputs need) as an ONNX model
 * (opset 13) at `path`: its inputs with their dtype and a symbolic batch
 * dimension "batch", the weights as initializers, batch norm in inference
 * form, no dropout; an output "logits" also gets "probabilities" (Softmax).
 * An op with no ONNX form is TP_ERR_UNSUPPORTED naming the op and node. */
tp_status_t tp_predictor_export_onnx(tp_predictor_t *p, const char *path);

/* What tp_predictor_export_onnx_opts adds (zeroed: nothing). */
typedef struct tp_onnx_export_opts {
    int nmeta;                      /* the model's metadata_props: */
    const char *const *meta_keys;   /* [nmeta] */
    const char *const *meta_values; /* [nmeta] */
    /* (An input normalisation is the model's own ops: the zoo's models
     * build it from tp_zoo_options_t.data, and it is exported with them.) */
} tp_onnx_export_opts_t;
/* tp_predictor_export_onnx with opts (NULL: the same). */
tp_status_t tp_predictor_export_onnx_opts(tp_predictor_t *p, const char *path,
                                          const tp_onnx_export_opts_t *opts);

/* ---- several predictors -------------------------------------------------- */

/* A result for the callback of an async request: status, and outputs the
 * callback may keep (tp_tensor_move) or leave (they are freed after it). */
typedef void (*tp_predict_cb)(tp_status_t status, tp_tensor_t *outputs,
                              int noutputs, void *user);

typedef struct tp_async_predictor tp_async_predictor_t;

/* `workers` threads, each with its own predictor from c, serving a queue of
 * at most `queue` requests (MultiThreadAsyncPredictor). Caller owns. */
tp_async_predictor_t *tp_async_predictor_new(const tp_predict_config_t *c,
                                             int workers, int queue);
/* Queue one request: the inputs are copied, so they need not outlive the
 * call. Blocks while the queue is full. cb runs once, on a worker thread,
 * with the result. Safe from any number of threads. */
tp_status_t tp_async_predictor_put(tp_async_predictor_t *ap,
                                   const tp_tensor_t *inputs, tp_predict_cb cb,
                                   void *user);
/* A result to come (tensorpack's put_task future): made by
 * tp_async_predictor_put_future, waited on, taken, destroyed by the caller
 * (from any one thread at a time; destroying before the result is fine). */
typedef struct tp_predict_future tp_predict_future_t;

/* Queue one request like tp_async_predictor_put (copies the inputs, blocks
 * while the queue is full) and give its future in *out (caller owns). */
tp_status_t tp_async_predictor_put_future(tp_async_predictor_t *ap,
                                          const tp_tensor_t *inputs,
                                          tp_predict_future_t **out);
/* Wait for the result up to timeout_s seconds (< 0: for ever): TP_OK when
 * it is there (a failed request too), TP_ERR_TIMEOUT when not. */
tp_status_t tp_predict_future_wait(tp_predict_future_t *f, double timeout_s);
/* 1 when the result is there (does not block). */
int tp_predict_future_done(tp_predict_future_t *f);
/* Wait, then move the outputs into outputs[0..noutputs) (caller owns:
 * tp_tensor_fini): TP_OK, or the request's error with the worker's
 * message; TP_ERR_STATE when taken already. */
tp_status_t tp_predict_future_take(tp_predict_future_t *f, tp_tensor_t *outputs);
void tp_predict_future_destroy(tp_predict_future_t **self_p);

/* Wait until every request put so far has had its callback. */
void tp_async_predictor_wait(tp_async_predictor_t *ap);
/* Finish the queued requests, stop the workers, free. */
void tp_async_predictor_destroy(tp_async_predictor_t **self_p);

typedef struct tp_dp_predictor tp_dp_predictor_t;

/* One predictor per entry of `devices` (-1: a CPU tower), each on a thread
 * of its own (DataParallelOfflinePredictor). Caller owns. */
tp_dp_predictor_t *tp_dp_predictor_new(const tp_predict_config_t *c,
                                       const int *devices, int ntowers);
/* One batch of up to ntowers x max_batch rows, split in contiguous slices
 * over the towers, run at once; outputs as tp_predictor_run, rows in the
 * order of the inputs. One caller at a time. */
tp_status_t tp_dp_predictor_run(tp_dp_predictor_t *dp,
                                const tp_tensor_t *inputs,
                                tp_tensor_t *outputs);
int tp_dp_predictor_towers(const tp_dp_predictor_t *dp);
void tp_dp_predictor_destroy(tp_dp_predictor_t **self_p);

/* Run every datapoint of `df` (reset here) through p, in order
 * (SimpleDatasetPredictor): component input_cols[i] of a datapoint is
 * input i (NULL: components 0..n-1); cb gets each batch's outputs and its
 * datapoint (for labels), both borrowed for the call. A callback's error
 * stops the run and is returned. */
typedef tp_status_t (*tp_dataset_cb)(const tp_datapoint_t *dp,
                                     tp_tensor_t *outputs, int noutputs,
                                     void *user);
tp_status_t tp_predict_dataflow(tp_predictor_t *p, tp_dataflow_t *df,
                                const int *input_cols, tp_dataset_cb cb,
                                void *user);

#ifdef __cplusplus
}
#endif
#endif
