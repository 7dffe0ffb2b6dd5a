/* towerpack tests: folds (gpu/graph/fold.c, tp_model_config_t.fold): a
 * bias add and a relu done inside the call before them change no number.
 * Every zoo model, trained with folds and without from the same weights
 * over the same batches, ends with the same variables bit for bit (one
 * tower and two; conv, batch norm, add and matmul folds, dropout after a
 * fold); a value a fold overwrote is an error to fetch, naming what to
 * fetch instead. Last, the nChw16c chains of a folded model on the CPU
 * (tp_plan_blk16_): the ResNet and the CNN-BN train as without them
 * within rounding. And a GPT's linears (batch_matmul, add of a [N] bias,
 * gelu: issue 45) folded into one call train as unfolded.
 * And the ResNet's block ends in one call (tp_plan_block_end_) train as
 * without them, within rounding. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "gpu/gpt_linear_testutil.h"

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.05, 0.9, 1);
}

/* examples/autoencoder.c's tower: two convs and a conv-transpose each
 * with a relu after it, a conv-transpose and a sigmoid, the MSE against
 * the scaled pixels (the labels unused). */
static tp_status_t s_ae_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    const int64_t nchw[4] = {-1, 1, 28, 28};
    tp_node_t *x = tp_reshape(t, "nchw", tp_cast(t, "pixels", in[0], 1.0f / 255), 4, nchw);
    tp_node_t *h = tp_relu(t, NULL, tp_conv2d(t, "enc0", x, 16, 3, 2, 1, 1));
    h = tp_relu(t, NULL, tp_conv2d(t, "enc1", h, 32, 3, 2, 1, 1));
    h = tp_relu(t, NULL, tp_conv2d_transpose(t, "dec0", h, 16, 4, 2, 1, 0, 1));
    tp_node_t *y = tp_sigmoid(t, "logits", tp_conv2d_transpose(t, "dec1", h, 1, 4, 2, 1, 0, 1));
    tp_node_t *cost = tp_mse(t, "mse", y, x);
    tp_tower_add_output(t, "logits", y);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

/* A GPT's MLP on the images' rows ([B, 28, 28] as [B, T, C]): linears as
 * the zoo GPT builds them (batch_matmul against an unbatched [K,N] W, add
 * of a [N] bias), a tanh GELU after the first (the MLP's fc), an erf GELU
 * after the second (no bias), the third with a bias alone; the MSE
 * against the rows. Four folds. */
static tp_status_t s_gpt_mlp_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    const int64_t btc[3] = {-1, 28, 28};
    tp_node_t *x = tp_reshape(t, "rows", tp_cast(t, "pixels", in[0], 1.0f / 255), 3, btc);
    tp_node_t *h = tp_gelu(t, "fc/gelu", tt_gpt_linear(t, "fc", x, 28, 64, 1), 1);
    h = tp_gelu(t, "mid/gelu", tt_gpt_linear(t, "mid", h, 64, 48, 0), 0);
    tp_node_t *y = tt_gpt_linear(t, "proj", h, 48, 28, 1);
    tp_node_t *cost = tp_mse(t, "mse", y, x);
    tp_tower_add_output(t, "logits", y);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

static tp_model_t *s_model(const char *name, int fold, int towers, int batch) {
    tp_tower_fn build = !strcmp(name, "autoencoder") ? s_ae_tower
                        : !strcmp(name, "gpt-mlp")    ? s_gpt_mlp_tower
                                                      : tp_zoo_find(name)->build;
    tp_model_desc_t md = {tp_zoo_inputs(), 2, build, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = towers;
    mc.batch = batch;
    mc.infer_batch = batch;
    mc.seed = 9;
    mc.threads = 1;
    mc.fold = fold;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s (fold %d): %s", name, fold, tp_last_error());
    return m;
}

/* Step s's batch of n images: pixels and labels from a fixed generator. */
static void s_batch(tp_tensor_t feeds[2], int n, int s) {
    int64_t ishape[3] = {n, 28, 28}, lshape[1] = {n};
    cr_assert_eq(tp_tensor_init(&feeds[0], TP_UINT8, 3, ishape), TP_OK);
    cr_assert_eq(tp_tensor_init(&feeds[1], TP_INT32, 1, lshape), TP_OK);
    tp_rng_t r;
    tp_rng_init(&r, 77, (uint64_t)s);
    for (size_t i = 0; i < feeds[0].nbytes; i++)
        ((uint8_t *)feeds[0].data)[i] = (uint8_t)tp_rng_below(&r, 256);
    for (int i = 0; i < n; i++)
        ((int32_t *)feeds[1].data)[i] = (int32_t)tp_rng_below(&r, 10);
}

static void s_train(tp_model_t *m, int towers, int batch, int steps) {
    for (int s = 0; s < steps; s++) {
        tp_tensor_t f[4];
        for (int k = 0; k < towers; k++)
            s_batch(f + 2 * k, batch, s * towers + k);
        cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, f, 2 * towers, NULL, 0, NULL),
                     TP_OK, "%s", tp_last_error());
        for (int k = 0; k < 2 * towers; k++)
            tp_tensor_fini(&f[k]);
    }
}

/* The folded model made fewer calls (its profile has fewer rows, with the
 * folds counted on them), and every variable and the inference logits are
 * the unfolded model's, bit for bit. */
static void s_same(const char *name, int towers, int batch, int steps) {
    tp_model_t *on = s_model(name, 1, towers, batch), *off = s_model(name, 0, towers, batch);
    tp_model_set_profiling(on, 1);
    tp_model_set_profiling(off, 1);
    s_train(on, towers, batch, steps);
    s_train(off, towers, batch, steps);
    tp_op_profile_t pon[128], poff[128];
    int non = tp_model_profile(on, 0, pon, 128), noff = tp_model_profile(off, 0, poff, 128);
    int folds = 0;
    for (int i = 0; i < non && i < 128; i++)
        folds += pon[i].folds;
    for (int i = 0; i < noff && i < 128; i++)
        cr_expect_eq(poff[i].folds, 0);
    cr_expect_gt(folds, 0, "%s: nothing folded", name);
    cr_expect_eq(non + folds, noff, "%s: %d rows + %d folds, unfolded %d rows", name,
                 non, folds, noff);
    cr_assert_eq(tp_model_var_count(on), tp_model_var_count(off));
    for (int i = 0; i < tp_model_var_count(on); i++) {
        const char *v = tp_model_var_name(on, i);
        tp_tensor_t a, b;
        cr_assert_eq(tp_model_var(on, v, &a), TP_OK);
        cr_assert_eq(tp_model_var(off, v, &b), TP_OK);
        cr_expect(tp_tensor_equal(&a, &b), "%s (%d towers): %s differs with folds",
                  name, towers, v);
    }
    tp_tensor_t f[2];
    s_batch(f, batch, 99);
    tp_fetch_t lon = {"logits", {0}}, loff = {"logits", {0}};
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(on, -1, f, 2, &lon, 1, &ro), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(off, -1, f, 2, &loff, 1, &ro), TP_OK, "%s", tp_last_error());
    cr_expect(tp_tensor_equal(&lon.value, &loff.value), "%s: inference logits differ", name);
    tp_tensor_fini(&lon.value);
    tp_tensor_fini(&loff.value);
    tp_tensor_fini(&f[0]);
    tp_tensor_fini(&f[1]);
    tp_model_destroy(&on);
    tp_model_destroy(&off);
}

Test(fold, mlp_and_cnn_train_bit_for_bit_as_unfolded) {
    s_same("mlp", 1, 16, 3);
    s_same("cnn", 1, 8, 3);
}

/* batch norm + relu, dropout after a folded fc layer (without the
 * nChw16c chains: the last tests) */
Test(fold, cnn_bn_trains_bit_for_bit_as_unfolded) {
    setenv("TP_BLK16_CHAIN", "0", 1);
    s_same("cnn-bn", 1, 8, 3);
}

/* add + relu (the residual joins), batch norm + relu; without the
 * nChw16c chains of a folded model (fold.c's tp_plan_blk16_: batch norm
 * on oneDNN's blocked kernel, another rounding; the last test below) */
Test(fold, resnet_trains_bit_for_bit_as_unfolded, .timeout = 120) {
    setenv("TP_BLK16_CHAIN", "0", 1);
    setenv("TP_CPU_BLOCK_END", "0", 1); /* another summation order: its own test */
    s_same("resnet", 1, 4, 2);
    unsetenv("TP_CPU_BLOCK_END");
}

/* a relu after each transposed convolution (the autoencoder's decoder):
 * one fold per relu, three in all (without the conv-transpose's fold, two) */
Test(fold, autoencoder_trains_bit_for_bit_as_unfolded) {
    s_same("autoencoder", 1, 8, 3);
    tp_model_t *m = s_model("autoencoder", 1, 1, 8);
    tp_model_set_profiling(m, 1);
    s_train(m, 1, 8, 1);
    tp_op_profile_t p[64];
    int n = tp_model_profile(m, 0, p, 64), folds = 0, relus = 0;
    for (int i = 0; i < n && i < 64; i++) {
        folds += p[i].folds;
        relus += p[i].kind == TP_OP_RELU;
    }
    cr_expect_eq(folds, 3, "%d folds in the autoencoder", folds);
    cr_expect_eq(relus, 0, "%d relu rows left", relus);
    tp_model_destroy(&m);
}

/* batch_matmul + bias add + gelu (fold.c's own loop, issue 45): four
 * folds, the gelu rows gone, and the variables (so every gradient) and
 * the inference output the unfolded model's bit for bit: the folded
 * GELU runs the gelu op's kernels (cpu_math.h), and its bias gradient
 * sums rows in order as the add's did; one tower and two. */
Test(fold, gpt_linears_with_bias_and_gelu_train_bit_for_bit_as_unfolded) {
    s_same("gpt-mlp", 1, 8, 3);
    s_same("gpt-mlp", 2, 4, 2);
    tp_model_t *m = s_model("gpt-mlp", 1, 1, 8);
    tp_model_set_profiling(m, 1);
    s_train(m, 1, 8, 1);
    tp_op_profile_t p[64];
    int n = tp_model_profile(m, 0, p, 64), folds = 0, gelus = 0, adds = 0;
    for (int i = 0; i < n && i < 64; i++) {
        folds += p[i].folds;
        gelus += p[i].kind == TP_OP_GELU || p[i].kind == TP_OP_GELU_TANH;
        adds += p[i].kind == TP_OP_ADD;
    }
    cr_expect_eq(folds, 4, "%d folds in the GPT's MLP", folds);
    cr_expect_eq(gelus, 0, "%d gelu rows left", gelus);
    cr_expect_eq(adds, 0, "%d add rows left", adds);
    /* the pre-activation is gone, the gelu's output is the product's */
    tp_tensor_t f[2];
    s_batch(f, 8, 0);
    tp_fetch_t under = {"fc/output", {0}}, gelu = {"fc/gelu", {0}};
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    cr_expect_eq(tp_model_run(m, -1, f, 2, &under, 1, &ro), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "fetch 'fc/gelu'"), "%s", tp_last_error());
    cr_expect_eq(tp_model_run(m, -1, f, 2, &gelu, 1, &ro), TP_OK, "%s", tp_last_error());
    tp_tensor_fini(&gelu.value);
    tp_tensor_fini(&f[0]);
    tp_tensor_fini(&f[1]);
    tp_model_destroy(&m);
}

/* two towers: the all-reduce and the update after it see the folded
 * matmul's bias gradient where the bias add's was */
Test(fold, two_towers_train_bit_for_bit_as_unfolded) {
    s_same("cnn", 2, 4, 2);
    s_same("mlp", 2, 8, 2);
}

/* A value a fold overwrote: fetching it (run and after) or pruning to it
 * is TP_ERR_INVALID naming the node whose value it became; that node, and
 * everything unfolded, fetch as before. TP_FOLD=0 is the default off. */
Test(fold, a_value_under_a_fold_is_not_fetched) {
    tp_model_t *m = s_model("mlp", 1, 1, 4);
    tp_tensor_t f[2];
    s_batch(f, 4, 0);
    tp_fetch_t under = {"fc0/matmul", {0}};
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    cr_expect_eq(tp_model_run(m, -1, f, 2, &under, 1, &ro), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "'fc0/matmul' is folded") &&
                  strstr(tp_last_error(), "relu") && strstr(tp_last_error(), "TP_FOLD=0"),
              "%s", tp_last_error());
    tp_tensor_t v;
    cr_expect_eq(tp_model_fetch(m, -1, "fc0/output", &v), TP_ERR_INVALID);
    const char *names[1] = {"fc0/output"};
    cr_expect_eq(tp_model_prune(m, names, 1), TP_ERR_INVALID);
    /* the relu after the fold holds the layer's output; the logits (a
     * bias folded into a matmul, no relu) are the output node's */
    tp_node_t *relu = NULL;
    for (int i = 0; i < tp_model_node_count(m, -1); i++) {
        tp_node_t *n = tp_model_node(m, -1, i);
        if (tp_node_kind(n) == TP_OP_RELU && !relu)
            relu = n;
    }
    cr_assert_not_null(relu);
    tp_fetch_t ok[2] = {{tp_node_name(relu), {0}}, {"linear/output", {0}}};
    cr_assert_eq(tp_model_run(m, -1, f, 2, ok, 2, &ro), TP_OK, "%s", tp_last_error());
    const float *h = ok[0].value.data;
    size_t nh = ok[0].value.nbytes / sizeof(float), positive = 0;
    for (size_t i = 0; i < nh; i++) {
        cr_expect_geq(h[i], 0.0f);
        positive += h[i] > 0.0f;
    }
    cr_expect_gt(positive, 0);
    cr_expect_eq(ok[1].value.shape[1], 10);
    tp_tensor_fini(&ok[0].value);
    tp_tensor_fini(&ok[1].value);
    tp_model_destroy(&m);
    /* without folds every value is kept */
    m = s_model("mlp", 0, 1, 4);
    cr_expect_eq(tp_model_run(m, -1, f, 2, &under, 1, &ro), TP_OK, "%s", tp_last_error());
    tp_tensor_fini(&under.value);
    tp_model_destroy(&m);
    setenv("TP_FOLD", "0", 1);
    cr_expect_eq(tp_model_config_default().fold, 0);
    unsetenv("TP_FOLD");
    cr_expect_eq(tp_model_config_default().fold, 1);
    tp_tensor_fini(&f[0]);
    tp_tensor_fini(&f[1]);
}

/* ---- nChw16c chains (fold.c's tp_plan_blk16_, on the CPU backend where
 * its convolutions run on oneDNN's blocked layouts) ------------------------ */

/* Variables of a and b: the largest difference over the largest magnitude,
 * the worst variable's. */
static double s_apart(tp_model_t *a, tp_model_t *b) {
    double worst = 0.0;
    for (int i = 0; i < tp_model_var_count(a); i++) {
        const char *v = tp_model_var_name(a, i);
        tp_tensor_t x, y;
        cr_assert_eq(tp_model_var(a, v, &x), TP_OK);
        cr_assert_eq(tp_model_var(b, v, &y), TP_OK);
        const float *p = x.data, *q = y.data;
        double big = 0.0, d = 0.0;
        for (size_t j = 0; j < y.nbytes / sizeof(float); j++) {
            big = fmax(big, fabs((double)q[j]));
            d = fmax(d, fabs((double)p[j] - (double)q[j]));
        }
        if (d / (big + 1e-6) > worst)
            cr_log_info("  %s: %g apart (largest %g)", v, d, big);
        worst = fmax(worst, d / (big + 1e-6));
    }
    return worst;
}

/* The zoo ResNet and the CNN-BN with their activations kept nChw16c
 * between conv, batch norm, pooling, add and relu train as with
 * TP_BLK16_CHAIN=0 within rounding: oneDNN's blocked batch norm sums in
 * another order than ops_cpu.c's (the convolutions are the same
 * primitives); a blocked value is refused on fetch by name, and fetches
 * with the chain off. */
/* Model `name` trained 2 steps with the chains (returned, the caller
 * destroys it) and without: within 1e-3 of each variable's largest
 * magnitude (the ResNet 1.3e-5, the CNN-BN 2.6e-4: its first conv's
 * weights, where a relu mask that one rounding flips moves a gradient;
 * oneDNN's plain batch norm and pooling, logged beside, ended 0.05 and
 * 3.9e-6 apart), and not the same numbers (chains were made). A layout
 * mixed up moves every variable by its own size. */
static tp_model_t *s_chains(const char *name, int batch) {
    /* the chains alone: the block ends' own summation order moves the
     * ResNet as much as oneDNN's plain batch norm does (its own test) */
    setenv("TP_CPU_BLOCK_END", "0", 1);
    unsetenv("TP_BLK16_CHAIN");
    unsetenv("TP_CPU_CONV");
    unsetenv("TP_CPU_BNORM");
    unsetenv("TP_CPU_POOL");
    tp_model_t *on = s_model(name, 1, 1, batch);
    setenv("TP_BLK16_CHAIN", "0", 1);
    tp_model_t *off = s_model(name, 1, 1, batch);
    setenv("TP_CPU_BNORM", "dnnl", 1); /* planned and run so */
    setenv("TP_CPU_POOL", "dnnl", 1);
    tp_model_t *dnnl = s_model(name, 1, 1, batch);
    s_train(dnnl, 1, batch, 2);
    unsetenv("TP_CPU_BNORM");
    unsetenv("TP_CPU_POOL");
    s_train(on, 1, batch, 2);
    s_train(off, 1, batch, 2);
    const double chain = s_apart(on, off), plain = s_apart(dnnl, off);
    cr_log_info("%s, 2 steps: chains %.3g apart, oneDNN's plain batch norm and pooling %.3g",
                name, chain, plain);
    cr_expect_gt(chain, 0.0, "%s: no chain: the same numbers as ops_cpu.c's", name);
    cr_expect(chain <= 1e-3, "%s: chains %g apart, plain oneDNN %g", name, chain, plain);
    tp_model_destroy(&dnnl);
    tp_model_destroy(&off);
    unsetenv("TP_CPU_BLOCK_END");
    return on;
}

Test(fold, cnn_bn_in_nchw16c_chains_trains_as_in_nchw_within_rounding) {
    tp_model_t *m = s_chains("cnn-bn", 8);
    tp_model_destroy(&m);
}

Test(fold, resnet_in_nchw16c_chains_trains_as_in_nchw_within_rounding, .timeout = 120) {
    tp_model_t *on = s_chains("resnet", 4);
    setenv("TP_BLK16_CHAIN", "0", 1);
    tp_model_t *off = s_model("resnet", 1, 1, 4);
    tp_tensor_t f[2];
    s_batch(f, 4, 99);
    tp_fetch_t conv = {"stage1/block0/conv1/output", {0}};
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    cr_expect_eq(tp_model_run(on, -1, f, 2, &conv, 1, &ro), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "nChw16c") && strstr(tp_last_error(), "TP_BLK16_CHAIN=0"),
              "%s", tp_last_error());
    cr_expect_eq(tp_model_run(off, -1, f, 2, &conv, 1, &ro), TP_OK, "%s", tp_last_error());
    tp_tensor_fini(&conv.value);
    tp_tensor_fini(&f[0]);
    tp_tensor_fini(&f[1]);
    tp_model_destroy(&on);
    tp_model_destroy(&off);
}

/* ---- the block end in one call (fold.c's tp_plan_block_end_, the CPU's
 * cpu_block_end.c) ---------------------------------------------------------- */

/* One residual block with a projection: relu(bn2(conv2(h)) + bn_p(conv_p(h)))
 * and an identity one, relu(bn3(conv3(r)) + r), then the global average
 * pool and a classifier: the later batch norm of each add makes the call;
 * the only relus are the block ends', so a rounding seldom flips a mask
 * and the variables can be compared tightly. */
static tp_status_t s_res_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    const int64_t nchw[4] = {-1, 1, 28, 28};
    tp_node_t *x = tp_reshape(t, "nchw", tp_cast(t, "pixels", in[0], 1.0f / 255), 4, nchw);
    tp_node_t *h = tp_conv2d(t, "c1", x, 16, 3, 1, 1, 1);
    tp_node_t *y = tp_batch_norm(t, "b2", tp_conv2d(t, "c2", h, 32, 3, 1, 1, 0));
    tp_node_t *p = tp_batch_norm(t, "bp", tp_conv2d(t, "cp", h, 32, 1, 1, 0, 0));
    tp_node_t *r = tp_relu(t, "r1", tp_add(t, "a1", y, p));
    y = tp_batch_norm(t, "b3", tp_conv2d(t, "c3", r, 32, 3, 1, 1, 0));
    r = tp_relu(t, "r2", tp_add(t, "a2", y, r));
    tp_node_t *logits = tp_fc(t, "linear", tp_global_avg_pool(t, "gap", r), 10, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "logits", logits);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

static tp_model_t *s_res_model(int batch) {
    tp_model_desc_t md = {tp_zoo_inputs(), 2, s_res_tower, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = batch;
    mc.infer_batch = batch;
    mc.seed = 9;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

static int s_rows_folds(tp_model_t *m, int *folds) {
    tp_op_profile_t p[160];
    int n = tp_model_profile(m, 0, p, 160);
    *folds = 0;
    for (int i = 0; i < n && i < 160; i++)
        *folds += p[i].folds;
    return n;
}

/* The block ends in one call against TP_CPU_BLOCK_END=0, with the nChw16c
 * chains and without (the kernel's two layouts): two rows fewer (the
 * adds'), as many folds more; 3 steps within 3e-4 of each variable's
 * largest magnitude (measured 2.3e-5 NCHW, 7.2e-5 nChw16c: float
 * reassociation; a layout,
 * a mask or a gradient mixed up moves variables by their own size), the
 * inference logits within 1e-4; the block's output fetches, the batch
 * norm folded under it is refused, naming the fold. */
Test(fold, block_ends_in_one_call_train_as_unfused_within_rounding, .timeout = 120) {
    for (int chain = 0; chain < 2; chain++) {
        if (chain)
            unsetenv("TP_BLK16_CHAIN");
        else
            setenv("TP_BLK16_CHAIN", "0", 1);
        unsetenv("TP_CPU_BLOCK_END");
        tp_model_t *on = s_res_model(8);
        setenv("TP_CPU_BLOCK_END", "0", 1);
        tp_model_t *off = s_res_model(8);
        unsetenv("TP_CPU_BLOCK_END");
        tp_model_set_profiling(on, 1);
        tp_model_set_profiling(off, 1);
        s_train(on, 1, 8, 3);
        s_train(off, 1, 8, 3);
        int fon, foff;
        const int ron = s_rows_folds(on, &fon), roff = s_rows_folds(off, &foff);
        cr_expect_eq(roff - ron, 2, "chain %d: %d rows, unfused %d", chain, ron, roff);
        cr_expect_eq(fon - foff, 2, "chain %d: %d folds, unfused %d", chain, fon, foff);
        const double d = s_apart(on, off);
        cr_log_info("residual tower, 3 steps, chain %d: block ends %.3g apart", chain, d);
        cr_expect_gt(d, 0.0, "chain %d: the same bits: nothing fused?", chain);
        cr_expect(d <= 3e-4, "chain %d: block ends %g apart", chain, d);
        tp_tensor_t f[2];
        s_batch(f, 8, 99);
        tp_fetch_t lon[2] = {{"logits", {0}}, {"r2", {0}}}, loff[2] = {{"logits", {0}}, {"r2", {0}}};
        tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
        const int nf = chain ? 1 : 2; /* (a chain's r2 is nChw16c) */
        cr_assert_eq(tp_model_run(on, -1, f, 2, lon, nf, &ro), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_model_run(off, -1, f, 2, loff, nf, &ro), TP_OK, "%s", tp_last_error());
        for (int k = 0; k < nf; k++) {
            const float *a = lon[k].value.data, *b = loff[k].value.data;
            for (size_t i = 0; i < loff[k].value.nbytes / sizeof(float); i++)
                cr_assert(fabsf(a[i] - b[i]) <= 1e-4f * (1.0f + fabsf(b[i])), "%s %zu: %g, %g",
                          lon[k].name, i, (double)a[i], (double)b[i]);
            tp_tensor_fini(&lon[k].value);
            tp_tensor_fini(&loff[k].value);
        }
        if (!chain) {
            tp_fetch_t bn = {"b3/output", {0}};
            cr_expect_eq(tp_model_run(on, -1, f, 2, &bn, 1, &ro), TP_ERR_INVALID);
            cr_expect(strstr(tp_last_error(), "folded") && strstr(tp_last_error(), "r2"), "%s",
                      tp_last_error());
            cr_expect_eq(tp_model_run(off, -1, f, 2, &bn, 1, &ro), TP_OK, "%s",
                         tp_last_error());
            tp_tensor_fini(&bn.value);
        }
        tp_tensor_fini(&f[0]);
        tp_tensor_fini(&f[1]);
        tp_model_destroy(&on);
        tp_model_destroy(&off);
    }
    unsetenv("TP_BLK16_CHAIN");
}

/* The zoo ResNet: each of its six blocks' ends in one call (a row fewer
 * each, as many folds more); its first cost (no update yet) within 1e-5
 * of the unfused one's and the next three within 1e-2 (measured: 3e-7,
 * then 4e-7, 3e-4, 1e-3). Its variables are no tight check: at a batch
 * of 4 or 8 a rounding anywhere flips relu masks downstream and the
 * updates carry it (oneDNN's plain batch norm against ops_cpu.c's ends
 * 0.05 apart, above); the tower above is the tight one. */
Test(fold, resnet_block_ends_in_one_call_track_the_unfused_cost, .timeout = 120) {
    unsetenv("TP_BLK16_CHAIN");
    unsetenv("TP_CPU_BLOCK_END");
    tp_model_t *on = s_model("resnet", 1, 1, 8);
    setenv("TP_CPU_BLOCK_END", "0", 1);
    tp_model_t *off = s_model("resnet", 1, 1, 8);
    unsetenv("TP_CPU_BLOCK_END");
    tp_model_set_profiling(on, 1);
    tp_model_set_profiling(off, 1);
    for (int s = 0; s < 4; s++) {
        tp_tensor_t f[2];
        s_batch(f, 8, s);
        tp_fetch_t con = {"cost", {0}}, coff = {"cost", {0}};
        cr_assert_eq(tp_model_run(on, TP_ALL_TOWERS, f, 2, &con, 1, NULL), TP_OK, "%s",
                     tp_last_error());
        cr_assert_eq(tp_model_run(off, TP_ALL_TOWERS, f, 2, &coff, 1, NULL), TP_OK, "%s",
                     tp_last_error());
        const float a = *(const float *)con.value.data, b = *(const float *)coff.value.data;
        cr_log_info("step %d: cost %.7g, unfused %.7g", s, (double)a, (double)b);
        cr_expect(fabsf(a - b) <= (s ? 1e-2f : 1e-5f) * fabsf(b), "step %d: cost %g, unfused %g",
                  s, (double)a, (double)b);
        tp_tensor_fini(&con.value);
        tp_tensor_fini(&coff.value);
        tp_tensor_fini(&f[0]);
        tp_tensor_fini(&f[1]);
    }
    int fon, foff;
    const int ron = s_rows_folds(on, &fon), roff = s_rows_folds(off, &foff);
    cr_expect_eq(roff - ron, 6, "%d rows, unfused %d", ron, roff);
    cr_expect_eq(fon - foff, 6, "%d folds, unfused %d", fon, foff);
    tp_model_destroy(&on);
    tp_model_destroy(&off);
}
