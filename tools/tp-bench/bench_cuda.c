/* tp-bench cuda: measurements of the CUDA backend (run on a GPU machine;
 * without a device each mode says so and exits 77, "skipped").
 *
 *   tp-bench cuda gemm  [--batch B] [--width W] [--iters N] [--rounds R]
 *                       [--tf32] [--input host|device] [--json]
 *       A GEMM-heavy step (MLP 784-W-W-10, SGD momentum) against the same
 *       matrix products called directly on cuBLAS (the backend's gemm) in
 *       the same run: ratio = step time / products time. Goal <= 1.1.
 *       --input host (default) copies the uint8 batch in from pageable
 *       host memory every step (which also makes CUDA finish the step
 *       before); device feeds it from device memory: the step alone.
 *   tp-bench cuda steps [--model cnn-bn] [--batch B] [--steps N] [--towers T]
 *                       [--tf32] [--profile] [--json]
 *       Step rate of a zoo model on the GPU fed one constant host batch per
 *       tower (DummyConstantInput-style: copy in, forward, backward, update):
 *       steps/s, images/s, the implied epoch time for 60000 images, and
 *       the share of the time the host sat blocked on the device at the
 *       steps' ends (tp_model_device_wait_ns: near 100% when the device's
 *       work bounds the step, near 0 when the host's does).
 *       scripts/gpu-check.sh samples nvidia-smi's utilisation meanwhile for
 *       the busy fraction. --profile adds the host time spent in each op
 *       call (launch overhead on the GPU: what keeps it idle).
 *       --input picks what feeds the steps: host (default: the constant
 *       uint8 host batch, copied in every step), device (a constant float32
 *       batch already in device memory: the reference for input hiding),
 *       resident (ResidentInput over fashion-mnist:train: crop 28, pad 2,
 *       flip, made on the device each step), staged (tp-train's default
 *       on a GPU: fashion-mnist:train batched by a QueueInput, StagingInput
 *       copying each batch from pinned memory on the copy stream); device
 *       and resident feed the model float32 images, so their ratio is the
 *       input's cost; host and staged feed uint8 images.
 *       --replicated runs each tower on a thread of its own, as tp-train's
 *       replicated trainer does (the towers' all-reduce and their slices
 *       of the update, then the update run that closes the step); without
 *       it one thread runs every tower and reduces onto tower 0.
 *       --bucket-mb X sets tp_model_config_t.bucket_bytes (0: one
 *       all-reduce after the backward pass; default: the model's).
 *
 * --cpu runs either mode on the CPU backend instead (a reference, and a
 * check of the bench itself on a machine without a GPU).
 *
 * Times are wall-clock around whole steps; every step ends with the model's
 * stream sync, so they include all device work. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include <towerpack/models.h>
#include "tools/tp-bench/bench_median.h"

static int s_cpu; /* --cpu: the same measurement on the CPU backend */

static tp_backend_t *s_backend(int tf32) {
    if (s_cpu)
        return tp_backend_cpu_new(0);
    if (tp_cuda_device_count() <= 0) {
        fprintf(stderr, "tp-bench cuda: skipped: %s\n", tp_cuda_status());
        return NULL;
    }
    tp_cuda_options_t o = tp_cuda_options_default();
    o.tf32 = tf32;
    tp_backend_t *b = tp_backend_cuda_new(&o);
    if (!b)
        fprintf(stderr, "tp-bench cuda: %s\n", tp_last_error());
    return b;
}

static int s_width = 2048;

static tp_status_t s_mlp(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = tp_flatten(t, "flat", tp_cast(t, "cast", in[0], 1.0f / 255));
    x = tp_relu(t, NULL, tp_fc(t, "fc0", x, s_width, 1));
    x = tp_relu(t, NULL, tp_fc(t, "fc1", x, s_width, 1));
    tp_node_t *logits = tp_fc(t, "fc2", x, 10, 1);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.01, 0.9, 0);
}

/* Fill a constant batch of B images and labels. */
static void s_batch(int64_t b, uint8_t *x, int32_t *y, tp_tensor_t in[2]) {
    for (int64_t i = 0; i < b * 784; i++)
        x[i] = (uint8_t)(i * 131 + 7);
    for (int64_t i = 0; i < b; i++)
        y[i] = (int32_t)(i % 10);
    int64_t xs[3] = {b, 28, 28}, ys[1] = {b};
    tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
}

/* 50 steps with profiling on, then where a step's time goes: per op
 * call, the host's time (on an asynchronous device that is the launch
 * overhead, which bounds how busy the device can be) and the device's
 * (timer marks around each call; the profiled steps run call by call and
 * synchronised, whatever the timed loop's mode), and the step's whole
 * device time, of which what fell between the calls (the fused updates,
 * fills). `step_us`: the timed loop's step. */
static int s_profile(tp_model_t *m, int tower, tp_tensor_t *feeds, int nfeeds,
                     double step_us) {
    enum { RUNS = 50 };
    tp_model_set_profiling(m, 1);
    for (int i = 0; i < RUNS; i++)
        if (tp_model_run(m, tower, feeds, nfeeds, NULL, 0, NULL) < 0) {
            fprintf(stderr, "tp-bench cuda: --profile: %s\n", tp_last_error());
            return -1;
        }
    tp_op_profile_t pr[256];
    int n = tp_model_profile(m, 0, pr, 256);
    uint64_t host = 0, dev = 0;
    for (int i = 0; i < n && i < 256; i++) {
        host += pr[i].forward_ns + pr[i].backward_ns;
        dev += pr[i].device_forward_ns + pr[i].device_backward_ns;
    }
    uint64_t run_dev = tp_model_profile_device_ns(m, 0);
    printf("host time in op calls: %.1f us per step (%d ops; the step takes %.1f us):\n",
           host / (double)RUNS / 1e3, n, step_us);
    if (run_dev)
        printf("device time: %.1f us per step (profiled call by call), %.1f us of it "
               "in the op calls, the rest (updates, fills, between calls) %.1f us\n",
               run_dev / (double)RUNS / 1e3, dev / (double)RUNS / 1e3,
               ((double)run_dev - (double)dev) / RUNS / 1e3);
    printf("  %-28s %-16s %9s %9s %9s %9s   (us per step)\n", "op", "kind", "fwd host",
           "fwd dev", "bwd host", "bwd dev");
    for (int i = 0; i < n && i < 256; i++) {
        char kind[32]; /* "+N": nodes folded into the op's calls (config fold) */
        snprintf(kind, sizeof kind, pr[i].folds ? "%s+%d" : "%s", tp_op_name(pr[i].kind),
                 pr[i].folds);
        printf("  %-28s %-16s %9.1f %9.1f %9.1f %9.1f\n", pr[i].name, kind,
               pr[i].forward_ns / (double)RUNS / 1e3,
               pr[i].device_forward_ns / (double)RUNS / 1e3,
               pr[i].backward_ns / (double)RUNS / 1e3,
               pr[i].device_backward_ns / (double)RUNS / 1e3);
    }
    tp_model_set_profiling(m, 0);
    return 0;
}

static int s_gemm_mode(int argc, char **argv) {
    int64_t batch = 1024;
    int iters = 50, rounds = 7, tf32 = 0, json = 0, on_device = 0, profile = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--input") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "host") || !strcmp(argv[i + 1], "device")))
            on_device = !strcmp(argv[++i], "device");
        else if (!strcmp(argv[i], "--width") && i + 1 < argc)
            s_width = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tf32"))
            tf32 = 1;
        else if (!strcmp(argv[i], "--cpu"))
            s_cpu = 1;
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--profile"))
            profile = 1;
        else {
            fprintf(stderr, "tp-bench cuda gemm: unknown flag '%s'\n", argv[i]);
            return 2;
        }
    }
    if (batch < 1 || s_width < 1 || iters < 1 || rounds < 1 || rounds > 99) {
        fprintf(stderr, "tp-bench cuda gemm: bad sizes\n");
        return 2;
    }
    tp_backend_t *b = s_backend(tf32);
    if (!b)
        return tp_cuda_device_count() <= 0 ? 77 : 1;
    tp_input_desc_t desc[2] = {{"image", TP_UINT8, 3, {-1, 28, 28}},
                               {"label", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_mlp, s_sgd, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = batch;
    cfg.backend = b;
    tp_model_t *m = tp_model_new(&md, &cfg);
    if (!m) {
        fprintf(stderr, "tp-bench cuda gemm: %s\n", tp_last_error());
        tp_backend_destroy(&b);
        return 1;
    }
    uint8_t *x = malloc((size_t)batch * 784);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    tp_tensor_t in[2];
    s_batch(batch, x, y, in);
    void *dx = NULL, *dy = NULL; /* --input device: the batch in device memory */
    if (on_device) {
        dx = tp_backend_alloc(b, (size_t)batch * 784);
        dy = tp_backend_alloc(b, (size_t)batch * sizeof *y);
        if (!dx || !dy || tp_backend_copy(b, dx, x, (size_t)batch * 784) < 0 ||
            tp_backend_copy(b, dy, y, (size_t)batch * sizeof *y) < 0) {
            fprintf(stderr, "tp-bench cuda gemm: %s\n", tp_last_error());
            return 1;
        }
        int64_t xs[3] = {batch, 28, 28}, ys[1] = {batch};
        tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, dx, NULL, NULL);
        tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, dy, NULL, NULL);
    }
    tp_tensor_t *p = in; /* one tower's feeds */
    /* the products of one step, row-major (m, n, k, ta, tb): forward
     * x@W0, h0@W1, h1@W2; backward dW2, dh1, dW1, dh0, dW0 (the input needs
     * no gradient) */
    const int B = (int)batch, W = s_width;
    const int shapes[8][5] = {{B, W, 784, 0, 0}, {B, W, W, 0, 0},
                              {B, 10, W, 0, 0},  {W, 10, B, 1, 0},
                              {B, W, 10, 0, 1},  {W, W, B, 1, 0},
                              {B, W, W, 0, 1},   {784, W, B, 1, 0}};
    size_t maxe = 0;
    for (int g = 0; g < 8; g++) {
        size_t mk = (size_t)shapes[g][0] * (size_t)shapes[g][2],
               kn = (size_t)shapes[g][2] * (size_t)shapes[g][1],
               mn = (size_t)shapes[g][0] * (size_t)shapes[g][1];
        maxe = mk > maxe ? mk : maxe;
        maxe = kn > maxe ? kn : maxe;
        maxe = mn > maxe ? mn : maxe;
    }
    float *ga = tp_backend_alloc(b, maxe * 4), *gb = tp_backend_alloc(b, maxe * 4),
          *gc = tp_backend_alloc(b, maxe * 4);
    tp_stream_t *s = tp_backend_stream_new(b);
    if (!ga || !gb || !gc || !s) {
        fprintf(stderr, "tp-bench cuda gemm: %s\n", tp_last_error());
        return 1;
    }
    tp_backend_fill(b, s, ga, 0.01f, maxe);
    tp_backend_fill(b, s, gb, 0.02f, maxe);
    double step_s[99], ref_s[99], ratio[99];
    for (int w = 0; w < 5; w++)
        if (tp_model_run(m, 0, p, 2, NULL, 0, NULL) < 0) {
            fprintf(stderr, "tp-bench cuda gemm: %s\n", tp_last_error());
            return 1;
        }
    for (int r = 0; r < rounds; r++) {
        double t0 = tp_now_s();
        for (int i = 0; i < iters; i++)
            if (tp_model_run(m, 0, p, 2, NULL, 0, NULL) < 0) {
                fprintf(stderr, "tp-bench cuda gemm: %s\n", tp_last_error());
                return 1;
            }
        if (tp_model_wait(m) < 0) {  /* a step queued ahead (TP_CUDA_AHEAD) */
            fprintf(stderr, "tp-bench cuda gemm: %s\n", tp_last_error());
            return 1;
        }
        double t1 = tp_now_s();
        for (int i = 0; i < iters; i++) {
            for (int g = 0; g < 8; g++) {
                const int *q = shapes[g];
                int lda = q[3] ? q[0] : q[2], ldb = q[4] ? q[2] : q[1];
                tp_backend_gemm(b, s, q[3], q[4], q[0], q[1], q[2], 1.0f, ga, lda,
                             gb, ldb, 0.0f, gc, q[1]);
            }
            tp_backend_stream_sync(b, s); /* the step syncs once too */
        }
        double t2 = tp_now_s();
        step_s[r] = (t1 - t0) / iters;
        ref_s[r] = (t2 - t1) / iters;
        ratio[r] = step_s[r] / ref_s[r];
    }
    double med = tp_bench_median(ratio, rounds);
    double st = tp_bench_median(step_s, rounds), rt = tp_bench_median(ref_s, rounds);
    double flops = 0;
    for (int g = 0; g < 8; g++)
        flops += 2.0 * shapes[g][0] * shapes[g][1] * shapes[g][2];
    if (json)
        printf("{\"bench\":\"cuda-gemm\",\"batch\":%lld,\"width\":%d,\"tf32\":%d,"
               "\"input\":\"%s\",\"step_ms\":%.4f,\"cublas_ms\":%.4f,\"ratio\":%.4f,"
               "\"tflops_step\":%.2f}\n",
               (long long)batch, W, tf32, on_device ? "device" : "host", st * 1e3,
               rt * 1e3, med,
               flops / st / 1e12);
    else
        printf("cuda gemm: MLP 784-%d-%d-10, batch %lld, TF32 %s, input %s: step "
               "%.3f ms, its 8 cuBLAS products alone %.3f ms: ratio %.3f (median of "
               "%d rounds; goal <= 1.1); %.1f TFLOP/s in the step\n",
               W, W, (long long)batch, tf32 ? "on" : "off",
               on_device ? "device" : "host", st * 1e3, rt * 1e3,
               med, rounds, flops / st / 1e12);
    if (profile && s_profile(m, 0, p, 2, st * 1e6) < 0)
        return 1;
    tp_backend_stream_destroy(b, s);
    tp_backend_free(b, dx);
    tp_backend_free(b, dy);
    tp_backend_free(b, ga);
    tp_backend_free(b, gb);
    tp_backend_free(b, gc);
    tp_model_destroy(&m);
    tp_backend_destroy(&b);
    free(x);
    free(y);
    return 0;
}

/* --replicated: the towers on threads of their own, started together for
 * each step (a barrier) and waited for (another), as the trainer runs
 * them. */
typedef struct {
    tp_model_t *m;
    int towers;
    tp_tensor_t *feeds;      /* [towers][2], the step's, set by the caller */
    pthread_barrier_t start, done;
    int stop;
    tp_status_t rc[8];
    pthread_t th[8];
} s_pool_t;

typedef struct {
    s_pool_t *p;
    int tower;
} s_worker_t;

static void *s_worker(void *arg) {
    s_worker_t *w = arg;
    s_pool_t *p = w->p;
    tp_run_opts_t o = {.stages = TP_RUN_TRAIN};
    for (;;) {
        pthread_barrier_wait(&p->start);
        if (p->stop)
            return NULL;
        p->rc[w->tower] = tp_model_run(p->m, w->tower, p->feeds + 2 * w->tower, 2,
                                       NULL, 0, &o);
        pthread_barrier_wait(&p->done);
    }
}

/* One replicated step on the pool: every tower, then the closing update. */
static tp_status_t s_pool_step(s_pool_t *p) {
    pthread_barrier_wait(&p->start);
    pthread_barrier_wait(&p->done);
    for (int t = 0; t < p->towers; t++)
        if (p->rc[t] < 0)
            return p->rc[t];
    tp_run_opts_t u = {.stages = TP_RUN_UPDATE};
    return tp_model_run(p->m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &u);
}

static void s_pool_start(s_pool_t *p, s_worker_t *w) {
    pthread_barrier_init(&p->start, NULL, (unsigned)p->towers + 1);
    pthread_barrier_init(&p->done, NULL, (unsigned)p->towers + 1);
    for (int t = 0; t < p->towers; t++) {
        w[t] = (s_worker_t){p, t};
        pthread_create(&p->th[t], NULL, s_worker, &w[t]);
    }
}

static void s_pool_stop(s_pool_t *p) {
    p->stop = 1;
    pthread_barrier_wait(&p->start);
    for (int t = 0; t < p->towers; t++)
        pthread_join(p->th[t], NULL);
    pthread_barrier_destroy(&p->start);
    pthread_barrier_destroy(&p->done);
}

static int s_steps_mode(int argc, char **argv) {
    const char *model = "cnn-bn";
    int64_t batch = 128;
    int steps = 300, towers = 1, tf32 = 0, json = 0, profile = 0, replicated = 0;
    double bucket_mb = -1;
    const char *input = "host";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--profile"))
            profile = 1;
        else if (!strcmp(argv[i], "--replicated"))
            replicated = 1;
        else if (!strcmp(argv[i], "--bucket-mb") && i + 1 < argc)
            bucket_mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--input") && i + 1 < argc)
            input = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--towers") && i + 1 < argc)
            towers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tf32"))
            tf32 = 1;
        else if (!strcmp(argv[i], "--cpu"))
            s_cpu = 1;
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "tp-bench cuda steps: unknown flag '%s'\n", argv[i]);
            return 2;
        }
    }
    const tp_zoo_model_t *z = tp_zoo_find(model);
    int mode = !strcmp(input, "host") ? 0 : !strcmp(input, "device") ? 1
             : !strcmp(input, "resident") ? 2 : !strcmp(input, "staged") ? 3 : -1;
    if (!z || batch < 1 || steps < 10 || towers < 1 || towers > 8 || mode < 0 ||
        (replicated && (profile || towers < 2))) {
        fprintf(stderr, "tp-bench cuda steps: %s\n",
                !z ? tp_last_error() : mode < 0 ? "--input: host, device, resident or staged"
                : replicated ? "--replicated: two towers or more, and no --profile (one thread)"
                                        : "bad --batch/--steps/--towers");
        return 2;
    }
    tp_backend_t *b = s_backend(tf32);
    if (!b)
        return tp_cuda_device_count() <= 0 ? 77 : 1;
    tp_input_desc_t fin[2];  /* device, resident: float32 images */
    memcpy(fin, tp_zoo_inputs(), sizeof fin);
    fin[0].dtype = TP_FLOAT32;
    tp_model_desc_t md = {mode == 1 || mode == 2 ? fin : tp_zoo_inputs(), 2, z->build,
                          s_sgd, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = batch;
    cfg.towers = towers;
    cfg.backend = b;
    if (bucket_mb >= 0)
        cfg.bucket_bytes = (int64_t)(bucket_mb * (1 << 20));
    tp_model_t *m = tp_model_new(&md, &cfg);
    if (!m) {
        fprintf(stderr, "tp-bench cuda steps: %s\n", tp_last_error());
        tp_backend_destroy(&b);
        return 1;
    }
    uint8_t *x = malloc((size_t)batch * 784);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    tp_tensor_t in[2];
    s_batch(batch, x, y, in);
    float *dx = NULL;       /* --input device: the batch in device memory */
    int32_t *dy = NULL;
    tp_input_t *res = NULL; /* --input resident or staged: each step's batches */
    if (mode == 1) {
        float *fx = malloc((size_t)batch * 784 * sizeof *fx);
        for (int64_t i = 0; i < batch * 784; i++)
            fx[i] = x[i] * (1.0f / 255.0f);
        dx = tp_backend_alloc(b, (size_t)batch * 784 * sizeof *dx);
        dy = tp_backend_alloc(b, (size_t)batch * sizeof *dy);
        if (!dx || !dy || tp_backend_copy(b, dx, fx, (size_t)batch * 784 * sizeof *fx) < 0 ||
            tp_backend_copy(b, dy, y, (size_t)batch * sizeof *dy) < 0) {
            fprintf(stderr, "tp-bench cuda steps: %s\n", tp_last_error());
            return 1;
        }
        free(fx);
        int64_t xs[3] = {batch, 28, 28}, ys[1] = {batch};
        tp_tensor_init_wrap(&in[0], TP_FLOAT32, 3, xs, dx, NULL, NULL);
        tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, dy, NULL, NULL);
    } else if (mode == 2) {
        char source[512];
        tp_dataflow_t *df = NULL;
        tp_resident_opts_t ro;
        tp_resident_opts_init(&ro);
        ro.batch = batch;
        ro.crop_h = ro.crop_w = 28;
        ro.pad = 2;
        ro.flip = 1;
        if (tp_zoo_source("fashion-mnist:train", 0, source, sizeof source) < 0 ||
            tp_spec_parse(source, &df) < 0 || !(res = tp_input_resident(df, &ro)) ||
            tp_input_start(res, towers, 1, 0) < 0 || tp_input_bind(res, b) < 0) {
            fprintf(stderr, "tp-bench cuda steps: --input resident: %s\n", tp_last_error());
            return 1;
        }
    } else if (mode == 3) {
        char source[512], spec[600];
        tp_dataflow_t *df = NULL;
        if (tp_zoo_source("fashion-mnist:train", 0, source, sizeof source) < 0 ||
            snprintf(spec, sizeof spec, "%s | batch %lld", source, (long long)batch) >=
                (int)sizeof spec ||
            tp_spec_parse(spec, &df) < 0 ||
            !(res = tp_input_staging(tp_input_queue(df, 50), 1, NULL)) ||
            tp_input_start(res, towers, 1, 0) < 0 || tp_input_bind(res, b) < 0) {
            fprintf(stderr, "tp-bench cuda steps: --input staged: %s\n", tp_last_error());
            return 1;
        }
    }
    tp_tensor_t p[8 * 2]; /* every tower's feeds, one after another */
    for (int t = 0; t < towers; t++)
        p[2 * t] = in[0], p[2 * t + 1] = in[1];
    tp_datapoint_t *dps[8] = {NULL};
    s_pool_t pool = {.m = m, .towers = towers, .feeds = p};
    s_worker_t workers[8];
    if (replicated)
        s_pool_start(&pool, workers);
    int warm = steps / 10;
    double t0 = 0;
    uint64_t wait0 = 0;
    for (int i = 0; i < steps + warm; i++) {
        if (i == warm) {
            t0 = tp_now_s();
            wait0 = tp_model_device_wait_ns(m);
        }
        for (int t = 0; res && t < towers; t++) {  /* this step's batches */
            if (tp_input_next(res, t, &dps[t]) < 0) {
                fprintf(stderr, "tp-bench cuda steps: %s\n", tp_last_error());
                return 1;
            }
            p[2 * t] = *tp_datapoint_get(dps[t], 0);
            p[2 * t + 1] = *tp_datapoint_get(dps[t], 1);
        }
        tp_status_t rc = replicated ? s_pool_step(&pool)
                                    : tp_model_run(m, TP_ALL_TOWERS, p, 2 * towers,
                                                   NULL, 0, NULL);
        if (rc < 0) {
            fprintf(stderr, "tp-bench cuda steps: %s\n", tp_last_error());
            return 1;
        }
        for (int t = 0; res && t < towers; t++)
            tp_input_release(res, t, &dps[t]);
    }
    if (replicated)
        s_pool_stop(&pool);
    if (tp_model_wait(m) < 0) {  /* a step queued ahead (TP_CUDA_AHEAD) */
        fprintf(stderr, "tp-bench cuda steps: %s\n", tp_last_error());
        return 1;
    }
    double dt = tp_now_s() - t0;
    double rate = steps / dt, ips = rate * (double)batch * towers;
    /* the share of the time the host sat waiting for the device (per
     * tower): near 1 when the device's work bounds the step, near 0 when
     * the host's does */
    double waited = (double)(tp_model_device_wait_ns(m) - wait0) * 1e-9 / dt / towers;
    if (profile && s_profile(m, TP_ALL_TOWERS, p, 2 * towers, 1e6 / rate) < 0)
        return 1;
    if (json)
        printf("{\"bench\":\"cuda-steps\",\"model\":\"%s\",\"input\":\"%s\","
               "\"batch\":%lld,\"towers\":%d,\"replicated\":%d,\"bucket_mb\":%g,"
               "\"tf32\":%d,\"steps_per_s\":%.2f,\"images_per_s\":%.1f,"
               "\"epoch_s\":%.3f,\"device_wait\":%.3f}\n",
               model, input, (long long)batch, towers, replicated, bucket_mb, tf32,
               rate, ips, 60000.0 / ips, waited);
    else
        printf("cuda steps: %s, batch %lld x %d tower(s)%s%s, TF32 %s, input %s: "
               "%.1f steps/s, %.0f images/s, %.2f s per 60000-image epoch; the host "
               "waited for the device %.0f%% of the time\n",
               model, (long long)batch, towers, replicated ? " on their threads" : "",
               bucket_mb == 0 ? ", all-reduce after the pass"
               : bucket_mb > 0 ? ", all-reduce in buckets" : "",
               tf32 ? "on" : "off", input, rate, ips, 60000.0 / ips, 100.0 * waited);
    tp_model_destroy(&m);
    tp_input_destroy(&res);
    tp_backend_free(b, dx);
    tp_backend_free(b, dy);
    tp_backend_destroy(&b);
    free(x);
    free(y);
    return 0;
}

int tp_bench_cuda(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: tp-bench cuda gemm [--batch B] [--width W] [--iters N] "
               "[--rounds R] [--tf32] [--input host|device] [--cpu] [--json]\n"
               "                     [--profile]\n"
               "       tp-bench cuda steps [--model NAME] [--batch B] "
               "[--steps N] [--towers T] [--tf32] [--profile] [--replicated]\n"
               "                       [--bucket-mb X] [--cpu] [--json]\n"
               "                       [--input host|device|resident|staged]\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "gemm"))
        return s_gemm_mode(argc - 1, argv + 1);
    if (!strcmp(argv[1], "steps"))
        return s_steps_mode(argc - 1, argv + 1);
    fprintf(stderr, "tp-bench cuda: unknown mode '%s' (gemm, steps)\n", argv[1]);
    return 2;
}
