/* tp-bench predict: a trained model's inference speed through the offline
 * predictor, on Fashion-MNIST test images: batch-1 latency (the median of
 * many single-image calls) and batch-B throughput (images per second of the
 * fastest of several rounds).
 *
 *   tp-bench predict --load CHECKPOINT|LOGDIR [--model NAME] [--threads T]
 *                    [--latency-iters N] [--batch B] [--rounds R] [--json]
 *                    [--bf16]
 *
 * The peer is bench/peers/predict_torch.py (the same model in PyTorch with
 * the same weights); bench/predict.sh runs both and prints the ratios. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "tools/tp-bench/bench_median.h"
#include "tools/tp-predict/zoo_predictor.h"

int tp_bench_predict(int argc, char **argv) {
    const char *load = NULL, *model = NULL;
    int threads = 1, iters = 2000, batch = 256, rounds = 5, json = 0, bf16 = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--load") && i + 1 < argc)
            load = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--latency-iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--bf16"))  /* tp-predict --bf16 */
            bf16 = 1;
        else {
            printf("usage: tp-bench predict --load CHECKPOINT|LOGDIR [--model NAME] "
                   "[--threads T] [--latency-iters N] [--batch B] [--rounds R] [--json] [--bf16]\n"
                   "  batch-1 latency and batch-B throughput of a trained model\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (!load || threads < 1 || iters < 1 || batch < 1 || batch > 10000 || rounds < 1) {
        fprintf(stderr, "tp-bench predict: --load is required; --threads, "
                "--latency-iters, --batch (<= 10000), --rounds >= 1\n");
        return 2;
    }
    tp_log_set_level(TP_LOG_WARN);
    char ckpt[4096];
    tp_input_desc_t inputs[2];
    const tp_zoo_model_t *zoo = tp_zoo_from_checkpoint(load, model, ckpt, sizeof ckpt, inputs);
    if (!zoo) {
        fprintf(stderr, "tp-bench predict: %s\n", tp_last_error());
        return 1;
    }
    /* the classes and normalisation the run recorded, as tp-predict builds
     * the model (a run that normalised in the model does it here too) */
    tp_zoo_data_t info;
    tp_zoo_data_init(&info);
    int have_info = 0;
    if (tp_zoo_data_load(ckpt, &info, &have_info) != TP_OK) {
        fprintf(stderr, "tp-bench predict: %s\n", tp_last_error());
        return 1;
    }
    tpp_zoo_model_t keep;
    tp_predictor_t *p = tpp_zoo_predictor_new(&keep, zoo, inputs, &info, ckpt, batch,
                                              threads, bf16);
    if (!p) {
        fprintf(stderr, "tp-bench predict: %s\n", tp_last_error());
        tp_zoo_data_fini(&info);
        return 1;
    }
    /* the first `batch` test images, as the model takes them: at the size
     * the checkpoint records (resized when it is not 28x28) */
    int64_t h = inputs[0].shape[1], w = inputs[0].shape[2];
    char src[256], spec[320];
    tp_dataflow_t *df = NULL;
    tp_datapoint_t *dp = NULL;
    if (tp_zoo_source_sized("fashion-mnist:test", 1, (int)h, (int)w, src, sizeof src) < 0 ||
        (snprintf(spec, sizeof spec, "%s | batch %d", src, batch),
         tp_spec_parse(spec, &df) < 0) ||
        tp_dataflow_reset_state(df, 0, 0) < 0 || tp_dataflow_next(df, &dp) < 0) {
        fprintf(stderr, "tp-bench predict: data: %s\n", tp_last_error());
        tp_dataflow_destroy(&df);
        tp_predictor_destroy(&p);
        tp_zoo_data_fini(&info);
        return 1;
    }
    tp_tensor_t img = *tp_datapoint_cget(dp, 0), one, f32;
    tp_tensor_init_empty(&f32);
    if (inputs[0].dtype == TP_FLOAT32) {  /* a model trained on normalised images */
        tp_tensor_init(&f32, TP_FLOAT32, img.ndim, img.shape);
        for (size_t i = 0; i < img.nbytes; i++)
            ((float *)f32.data)[i] = ((const uint8_t *)img.data)[i] / 255.0f;
        img = f32;
    }
    int64_t shape1[3] = {1, h, w};
    tp_tensor_init_wrap(&one, img.dtype, 3, shape1, img.data, NULL, NULL);
    tp_tensor_t out;
    /* warm up, then the latency of single images, one at a time */
    for (int i = 0; i < 20; i++) {
        if (tp_predictor_run(p, &one, &out) < 0)
            break;
        tp_tensor_fini(&out);
    }
    double *lat = malloc(sizeof *lat * (size_t)iters);
    tp_status_t rc = lat ? TP_OK : TP_ERR_NOMEM;
    for (int i = 0; i < iters && rc == TP_OK; i++) {
        double t0 = tp_now_s();
        rc = tp_predictor_run(p, &one, &out);
        lat[i] = tp_now_s() - t0;
        tp_tensor_fini(&out);
    }
    double best_rate = 0;
    for (int r = 0; r < rounds && rc == TP_OK; r++) {
        int reps = 4;
        double t0 = tp_now_s();
        for (int k = 0; k < reps && rc == TP_OK; k++) {
            rc = tp_predictor_run(p, &img, &out);
            tp_tensor_fini(&out);
        }
        double rate = (double)batch * reps / (tp_now_s() - t0);
        best_rate = rate > best_rate ? rate : best_rate;
    }
    if (rc < 0) {
        fprintf(stderr, "tp-bench predict: %s\n", tp_last_error());
    } else {
        qsort(lat, (size_t)iters, sizeof *lat, tp_bench_cmp_double);
        double median = lat[iters / 2], p90 = lat[iters * 9 / 10];
        if (json)
            printf("{\"model\": \"%s\", \"threads\": %d, \"latency_ms\": %.4f, "
                   "\"latency_p90_ms\": %.4f, \"batch\": %d, \"images_per_s\": %.1f, "
                   "\"bf16\": %s}\n",
                   zoo->name, threads, median * 1e3, p90 * 1e3, batch, best_rate,
                   tp_backend_cpu_bf16_ask(-1) ? "true" : "false");
        else
            printf("tp-bench predict: %s, %d thread%s: batch-1 latency %.3f ms "
                   "(median of %d, p90 %.3f ms); batch %d: %.0f images/s%s\n",
                   zoo->name, threads, threads == 1 ? "" : "s", median * 1e3, iters,
                   p90 * 1e3, batch, best_rate,
                   tp_backend_cpu_bf16_ask(-1) ? " (bf16 products)" : "");
    }
    free(lat);
    tp_tensor_fini(&f32);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
    tp_predictor_destroy(&p);
    tp_zoo_data_fini(&info);  /* the predictor built its model from it */
    return rc < 0 ? 1 : 0;
}
