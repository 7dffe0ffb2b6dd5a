/* Example: a convolutional autoencoder on Fashion-MNIST, with the
 * convolution family's transposed convolutions as its decoder.
 *
 *   encoder: conv 1->16 (3x3, stride 2, pad 1) + relu      [B,16,14,14]
 *            conv 16->32 (3x3, stride 2, pad 1) + relu     [B,32,7,7]
 *   decoder: conv-transpose 32->16 (4x4, stride 2, pad 1) + relu  [B,16,14,14]
 *            conv-transpose 16->1 (4x4, stride 2, pad 1) + sigmoid [B,1,28,28]
 *   cost:    mean squared error against the input pixels in [0,1];
 *            Adam 1e-3, batch 128.
 *
 *   build/bin/example-autoencoder [--epochs N] [--json] [--onnx FILE]
 *                                 [--recon FILE] [--device N] [--threads N]
 *                                 [--seed S] [--tiny] [--logdir DIR]
 *
 * Trains with the stock launcher, then runs the trained model's inference
 * graph over the whole test split: prints the test MSE (with --json, one
 * JSON line on stdout and nothing else there), writes LOGDIR/reconstructions.png
 * (16 test images, originals above their reconstructions) and, with
 * --onnx, exports the reconstruction as an ONNX model (--recon FILE: the
 * PNG's 16 reconstructions as raw float32 [16,1,28,28], which
 * tests/tools/autoencoder_check.py compares with OpenCV's DNN module
 * running the ONNX file). tests/tools/
 * autoencoder_torch.py is the same model in PyTorch; docs/performance.md
 * has both test MSEs. --tiny: 3 steps, two test batches (the ctest). */
#include <towerpack/towerpack.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/fileio.h>
#include <towerpack/image.h>
#include <towerpack/launch.h>
#include <towerpack/optim.h>
#include <towerpack/predict.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHOWN 16 /* test images in the PNG */

static const tp_input_desc_t inputs[] = {
    {"image", TP_UINT8, 3, {-1, 28, 28}},
    {"label", TP_INT32, 1, {-1}}, /* unused: the dataflow yields it */
};

static tp_status_t tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    int64_t nchw[] = {-1, 1, 28, 28};
    tp_node_t *x = tp_reshape(t, "nchw", tp_cast(t, "pixels", in[0], 1.0f / 255), 4, nchw);
    tp_node_t *h = tp_relu(t, NULL, tp_conv2d(t, "enc0", x, 16, 3, 2, 1, 1));
    h = tp_relu(t, NULL, tp_conv2d(t, "enc1", h, 32, 3, 2, 1, 1));
    h = tp_relu(t, NULL, tp_conv2d_transpose(t, "dec0", h, 16, 4, 2, 1, 0, 1));
    tp_node_t *y = tp_sigmoid(t, "recon", tp_conv2d_transpose(t, "dec1", h, 1, 4, 2, 1, 0, 1));
    tp_node_t *cost = tp_mse(t, "mse", y, x);
    tp_tower_add_output(t, "recon", y);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *optimizer(void *user) {
    (void)user;
    return tp_optimizer_adam(1e-3, 0.9, 0.999, 1e-8);
}

typedef struct {
    int tiny, json, epochs, device, threads;
    uint64_t seed; /* initial weights and the data's order (default 1) */
    const char *logdir, *onnx, *recon;
} args_t;

static void usage(const char *prog) {
    fprintf(stderr, "usage: %s [--epochs N] [--json] [--onnx FILE] [--recon FILE] "
                    "[--device N] [--threads N] [--seed S] [--tiny] [--logdir DIR]\n", prog);
    exit(2);
}

static args_t parse(int argc, char **argv) {
    args_t a = {0, 0, 5, -1, 0, 1, "train_log/example-autoencoder", NULL, NULL};
    int epochs_given = 0;
    for (int i = 1; i < argc; i++) {
        const int more = i + 1 < argc;
        if (!strcmp(argv[i], "--tiny"))
            a.tiny = 1;
        else if (!strcmp(argv[i], "--json"))
            a.json = 1;
        else if (!strcmp(argv[i], "--logdir") && more)
            a.logdir = argv[++i];
        else if (!strcmp(argv[i], "--onnx") && more)
            a.onnx = argv[++i];
        else if (!strcmp(argv[i], "--recon") && more)
            a.recon = argv[++i];
        else if (!strcmp(argv[i], "--epochs") && more && (a.epochs = atoi(argv[++i])) > 0)
            epochs_given = 1;
        else if (!strcmp(argv[i], "--device") && more)
            a.device = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && more)
            a.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && more)
            a.seed = strtoull(argv[++i], NULL, 10);
        else
            usage(argv[0]);
    }
    if (a.tiny && !epochs_given)
        a.epochs = 1;
    return a;
}

static int fail(const char *what) {
    fprintf(stderr, "example-autoencoder: %s: %s\n", what, tp_last_error());
    return 1;
}

/* Originals (top row) above their reconstructions: a [56, 28 SHOWN] grey
 * PNG in the log directory. */
static tp_status_t write_png(const char *logdir, const uint8_t *img, const float *rec,
                             const char *recon) {
    if (recon) /* the same reconstructions as raw float32, for the ONNX check */
        TP_TRY(tp_file_write_atomic(recon, rec, sizeof(float) * SHOWN * 784));
    enum { W = 28 * SHOWN, H = 56 };
    static uint8_t pix[H * W];
    for (int k = 0; k < SHOWN; k++)
        for (int y = 0; y < 28; y++)
            for (int x = 0; x < 28; x++) {
                const int i = (k * 28 + y) * 28 + x;
                float v = rec[i] * 255.0f + 0.5f;
                pix[y * W + k * 28 + x] = img[i];
                pix[(28 + y) * W + k * 28 + x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    int64_t shape[2] = {H, W};
    tp_tensor_t t;
    tp_tensor_init_wrap(&t, TP_UINT8, 2, shape, pix, NULL, NULL);
    void *png = NULL;
    size_t size = 0;
    TP_TRY(tp_image_encode_png(&t, &png, &size));
    char path[4096];
    snprintf(path, sizeof path, "%s/reconstructions.png", logdir);
    tp_status_t rc = tp_file_write_atomic(path, png, size);
    free(png);
    return rc;
}

/* The mean squared error of the reconstructions over the test split (or
 * its first `limit` batches), summed in double; the first SHOWN images and
 * reconstructions go to the PNG. */
static tp_status_t evaluate(tp_predictor_t *pr, int limit, const char *logdir,
                            const char *recon, double *mse, int64_t *images) {
    tp_dataflow_t *test = NULL;
    TP_TRY(tp_spec_parse("fashion-mnist:test,shuffle=0 | batch 500 remainder", &test));
    tp_status_t rc = tp_dataflow_reset_state(test, 1, 0);
    double sum = 0;
    int64_t n = 0;
    for (int b = 0; rc >= 0 && (limit <= 0 || b < limit); b++) {
        tp_datapoint_t *dp = NULL;
        rc = tp_dataflow_next(test, &dp);
        if (rc == TP_DONE) {
            rc = TP_OK;
            break;
        }
        if (rc < 0)
            break;
        tp_tensor_t views[2], out;
        tp_datapoint_views(dp, views, 2);
        rc = tp_predictor_run(pr, &views[0], &out);
        if (rc >= 0) {
            const uint8_t *img = views[0].data;
            const float *rec = out.data;
            const int64_t count = tp_tensor_numel(&views[0]);
            for (int64_t i = 0; i < count; i++) {
                const double d = (double)rec[i] - img[i] / 255.0;
                sum += d * d;
            }
            if (n == 0 && views[0].shape[0] >= SHOWN && logdir)
                rc = write_png(logdir, img, rec, recon);
            n += views[0].shape[0];
            tp_tensor_fini(&out);
        }
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&test);
    TP_TRY(rc);
    *mse = n ? sum / ((double)n * 784) : 0;
    *images = n;
    return TP_OK;
}

int main(int argc, char **argv) {
    args_t a = parse(argc, argv);
    if (a.json) /* stdout is the JSON line; the launcher's log stays on stderr */
        tp_log_set_level(TP_LOG_WARN);
    tp_model_desc_t model = {inputs, 2, tower, optimizer, NULL};
    tp_dataflow_t *train = NULL;
    if (tp_spec_parse("fashion-mnist:train | batch 128", &train) != TP_OK)
        return fail("training data");
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &model;
    cfg.dataflow = train;
    cfg.batch = 128;
    cfg.infer_batch = 500; /* the inference graph the test pass runs */
    cfg.device = a.device;
    cfg.threads = a.threads;
    cfg.seed = a.seed;
    cfg.max_epoch = a.epochs;
    cfg.steps_per_epoch = a.tiny ? 3 : 0;
    cfg.logdir = a.logdir;
    cfg.logdir_action = TP_LOGDIR_DELETE;
    cfg.model_name = "autoencoder";
    tp_model_t *m = NULL;
    if (tp_launch_train_with_config(&cfg, &m) != TP_OK || !m)
        return fail("training");

    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    const char *outs[1] = {"recon"};
    pc.output_names = outs;
    pc.noutput_names = 1;
    tp_predictor_t *pr = tp_predictor_new_shared(m, &pc);
    if (!pr) {
        tp_model_destroy(&m);
        return fail("predictor");
    }
    double mse = 0;
    int64_t images = 0;
    tp_status_t rc = evaluate(pr, a.tiny ? 2 : 0, a.logdir, a.recon, &mse, &images);
    if (rc >= 0 && a.onnx)
        rc = tp_predictor_export_onnx(pr, a.onnx);
    tp_predictor_destroy(&pr);
    tp_model_destroy(&m);
    if (rc < 0)
        return fail(a.onnx ? "test pass or ONNX export" : "test pass");
    if (a.json)
        printf("{\"model\": \"autoencoder\", \"epochs\": %d, \"test_mse\": %.6f, "
               "\"test_images\": %lld, \"device\": %d, \"seed\": %llu}\n",
               a.epochs, mse, (long long)images, a.device, (unsigned long long)a.seed);
    else
        printf("test MSE %.6f over %lld test images; %s/reconstructions.png%s%s\n", mse,
               (long long)images, a.logdir, a.onnx ? "; ONNX: " : "", a.onnx ? a.onnx : "");
    return 0;
}
