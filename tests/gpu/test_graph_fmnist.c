/* towerpack tests: an MLP (784-256-10 with batch norm; Adam, batch 32, the
 * learning rate decayed linearly by name each step) learns Fashion-MNIST to
 * >= 0.85 test accuracy in one epoch (Debian's dataset-fashion-mnist).
 *
 * The IDX reader here is deliberately tiny and private to the test: the
 * dataflow library has its own. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include <zlib.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Read an IDX gz file: magic 0x0000080N (uint8), dims big-endian. Returns
 * malloc'ed bytes and the item count, or NULL. */
static uint8_t *s_idx(const char *name, int want_dims, size_t *items) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", FMNIST_DIR, name);
    gzFile f = gzopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char hdr[4];
    uint32_t dims[3] = {0, 1, 1};
    uint8_t *data = NULL;
    if (gzread(f, hdr, 4) != 4 || hdr[2] != 0x08 || hdr[3] != want_dims)
        goto out;
    for (int i = 0; i < want_dims; i++) {
        unsigned char b[4];
        if (gzread(f, b, 4) != 4)
            goto out;
        dims[i] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 |
                  (uint32_t)b[2] << 8 | b[3];
    }
    size_t n = (size_t)dims[0] * dims[1] * dims[2];
    data = malloc(n);
    if (data && gzread(f, data, (unsigned)n) != (int)n) {
        free(data);
        data = NULL;
    }
    *items = dims[0];
out:
    gzclose(f);
    return data;
}

static tp_status_t s_mlp(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = tp_cast(t, "scale", in[0], 1.0f / 255.0f);
    /* fc (no bias: batch norm's beta is the bias) -> batch norm -> relu */
    tp_node_t *h = tp_fc(t, "fc1", x, 256, 0);
    h = tp_relu(t, "relu1", tp_batch_norm(t, "bn1", h));
    tp_node_t *logits = tp_fc(t, "fc2", h, 10, 1);
    tp_tower_add_metric(t, "errors", tp_error_count(t, "err", logits, in[1]));
    if (!tp_tower_is_training(t))
        return tp_tower_status(t);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

static tp_optimizer_t *s_adam(void *u) {
    (void)u;
    return tp_optimizer_adam(2e-3, 0.9, 0.999, 1e-8);
}

Test(fmnist, mlp_one_epoch_reaches_085, .timeout = 240) {
    size_t ntr = 0, nte = 0, nl = 0, nlt = 0;
    uint8_t *xtr = s_idx("train-images-idx3-ubyte.gz", 3, &ntr);
    uint8_t *ytr = s_idx("train-labels-idx1-ubyte.gz", 1, &nl);
    uint8_t *xte = s_idx("t10k-images-idx3-ubyte.gz", 3, &nte);
    uint8_t *yte = s_idx("t10k-labels-idx1-ubyte.gz", 1, &nlt);
    if (!xtr || !ytr || !xte || !yte)
        cr_skip_test("Fashion-MNIST not found in " FMNIST_DIR
                     " (apt-get install dataset-fashion-mnist)");
    cr_assert_eq(ntr, nl);
    cr_assert_eq(nte, nlt);
    enum { B = 32, EB = 1000 };
    tp_input_desc_t desc[2] = {{"image", TP_UINT8, 3, {-1, 28, 28}},
                               {"label", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_mlp, s_adam, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = B;
    cfg.infer_batch = EB;
    cfg.seed = 1;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());

    uint32_t *order = malloc(ntr * sizeof *order);
    for (size_t i = 0; i < ntr; i++)
        order[i] = (uint32_t)i;
    tp_rng_t r;
    tp_rng_init(&r, 1, 0);
    tp_rng_shuffle_u32(&r, order, ntr);
    uint8_t *xb = malloc((size_t)EB * 784);
    int32_t *yb = malloc(EB * sizeof *yb);
    tp_tensor_t in[2];
    for (size_t s = 0; s + B <= ntr; s += B) {
        for (int i = 0; i < B; i++) {
            memcpy(xb + (size_t)i * 784, xtr + (size_t)order[s + i] * 784, 784);
            yb[i] = ytr[order[s + i]];
        }
        int64_t xs[3] = {B, 28, 28}, ys[1] = {B};
        tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, xb, NULL, NULL);
        tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, yb, NULL, NULL);
        /* a schedule: the learning rate decays linearly to 0 over the epoch */
        double lr = 2e-3 * (1.0 - (double)s / (double)ntr);
        cr_assert_eq(tp_model_set_hparam(m, "learning_rate", lr), TP_OK);
        cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, NULL), TP_OK, "%s", tp_last_error());
    }
    double wrong = 0;
    for (size_t s = 0; s < nte; s += EB) {
        int n = (int)(nte - s < EB ? nte - s : EB);
        memcpy(xb, xte + s * 784, (size_t)n * 784);
        for (int i = 0; i < n; i++)
            yb[i] = yte[s + (size_t)i];
        int64_t xs[3] = {n, 28, 28}, ys[1] = {n};
        tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, xb, NULL, NULL);
        tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, yb, NULL, NULL);
        tp_run_opts_t fwd = {.stages = TP_RUN_FORWARD};
        cr_assert_eq(tp_model_run(m, -1, in, 2, NULL, 0, &fwd), TP_OK, "%s",
                     tp_last_error());
        wrong += tp_model_metric_value(m, -1, 0);
    }
    double acc = 1.0 - wrong / (double)nte;
    cr_log_info("Fashion-MNIST MLP, one epoch: test accuracy %.4f", acc);
    cr_expect_geq(acc, 0.85, "test accuracy %.4f < 0.85", acc);
    free(order);
    free(xb);
    free(yb);
    free(xtr);
    free(ytr);
    free(xte);
    free(yte);
    tp_model_destroy(&m);
}
