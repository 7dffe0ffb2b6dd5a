/* towerpack tests: tp-export's ONNX files, checked by tools nobody here
 * wrote: onnx.checker accepts every zoo model, and OpenCV's DNN module runs
 * the exported CNN on the Fashion-MNIST test split with the top-1 class of
 * tp-predict on >= 99.9% of the images and logits within 1e-4. Skipped,
 * saying which package is missing, without Debian's python3-onnx,
 * python3-opencv and python3-numpy. Own executable: it forks and execs. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proc_testutil.h"
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "tools/named_ckpt_testutil.h"
#include "dir_testutil.h"

#define PY "/usr/bin/python3"
#define CHECK TP_SOURCE_DIR "/tests/tools/onnx_check.py"
#define IMAGES "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"

static char s_dir[64];
static char s_out[1 << 16];

static void s_setup(void) {
    tp_log_set_level(TP_LOG_WARN);
    dt_make(s_dir, sizeof s_dir, "tp-export");
}

static void s_teardown(void) {
    dt_remove(s_dir);
}

/* Run argv (argv[0] a path), stdout+stderr into s_out; the exit status. */
static int s_run(char *const *argv) {
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    return pu_run(argv, env, s_out, sizeof s_out);
}

/* Skip, saying what is missing, when the Python references are not there. */
static void s_need_python(void) {
    if (access(PY, X_OK) != 0)
        cr_skip_test("ONNX checks skipped: no " PY " (install python3-onnx, "
                     "python3-opencv, python3-numpy; scripts/install-deps.sh does)");
    char *argv[] = {PY, CHECK, "check", NULL};
    if (s_run(argv) == 3)
        cr_skip_test("ONNX checks skipped: %s (install python3-onnx, python3-opencv, "
                     "python3-numpy; scripts/install-deps.sh does)", s_out);
}

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.02, 0.9, 0);
}

/* A zoo model at h x w after two SGD steps on Fashion-MNIST (resized
 * unless 28x28; batch-norm averages that are not their initial values),
 * saved with its name. */
static void s_checkpoint_sized(const char *name, int h, int w, const char *path) {
    tp_input_desc_t in[2];
    cr_assert_eq(tp_zoo_inputs_sized(h, w, in), TP_OK, "%s", tp_last_error());
    tp_model_desc_t md = {in, 2, tp_zoo_find(name)->build, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 8;
    mc.seed = 3;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_model_set_name(m, name), TP_OK);
    char src[256], spec[300];
    cr_assert_eq(tp_zoo_source_sized("fashion-mnist:test", 1, h, w, src, sizeof src), TP_OK);
    snprintf(spec, sizeof spec, "%s | batch 8", src);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s: %s", spec, tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK, "%s", tp_last_error());
    for (int s = 0; s < 2; s++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_tensor_t in[2];
        tp_datapoint_views(dp, in, 2);
        cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, NULL), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&df);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    tp_model_destroy(&m);
}

static void s_checkpoint(const char *name, const char *path) {
    s_checkpoint_sized(name, 28, 28, path);
}

/* The zoo's models but ResNet-50 (100 MB of weights; its ops are
 * ResNet-18's), NULL-terminated. */
static void s_models(const tp_zoo_model_t *out[8]) {
    const tp_zoo_model_t *const *all = tp_zoo_all();
    int k = 0;
    for (int i = 0; all[i] && k < 7; i++)
        if (strcmp(all[i]->name, "resnet50"))
            out[k++] = all[i];
    out[k] = NULL;
}

TestSuite(tp_export, .init = s_setup, .fini = s_teardown);

Test(tp_export, the_onnx_checker_accepts_every_zoo_model) {
    s_need_python();
    const tp_zoo_model_t *all[8];
    s_models(all);
    char onnx[8][128];
    char *check[12] = {PY, CHECK, "check"};
    int n = 0;
    for (; all[n] && n < 8; n++) {
        char ckpt[128];
        snprintf(ckpt, sizeof ckpt, "%s/%s.safetensors", s_dir, all[n]->name);
        snprintf(onnx[n], sizeof onnx[n], "%s/%s.onnx", s_dir, all[n]->name);
        s_checkpoint(all[n]->name, ckpt);
        char *exp[] = {TP_BINARY_DIR "/bin/tp-export", "--load", ckpt, "--onnx", onnx[n], NULL};
        cr_assert_eq(s_run(exp), 0, "%s: %s", all[n]->name, s_out);
        check[3 + n] = onnx[n];
    }
    cr_assert_eq(n, 5);
    cr_assert_eq(s_run(check), 0, "%s", s_out);
    /* batch norm in inference form, no dropout, the residual adds */
    cr_expect(strstr(s_out, "cnn-bn.onnx: ok") && strstr(s_out, "BatchNormalization"), "%s", s_out);
    cr_expect(!strstr(s_out, "Dropout"), "%s", s_out);
    cr_expect(strstr(s_out, "resnet.onnx: ok") && strstr(s_out, "GlobalAveragePool"), "%s", s_out);
}

/* Every zoo model trained at 32x32 (and the CNN at 20x24) exports with
 * that input, [batch,H,W], from the checkpoint alone; onnx's full check
 * (shape inference through every node) accepts the files and infers the
 * logits as [batch,10]. */
Test(tp_export, the_input_shape_follows_the_trained_size) {
    s_need_python();
    const tp_zoo_model_t *all[8];
    s_models(all);
    char onnx[8][128];
    char *shape[12] = {PY, CHECK, "shape"};
    int n = 0;
    for (; all[n] && n < 8; n++) {
        int h = all[n + 1] ? 32 : 20, w = all[n + 1] ? 32 : 24;  /* the last not square */
        char ckpt[128];
        snprintf(ckpt, sizeof ckpt, "%s/%s-%d.safetensors", s_dir, all[n]->name, h);
        snprintf(onnx[n], sizeof onnx[n], "%s/%s-%d.onnx", s_dir, all[n]->name, h);
        s_checkpoint_sized(all[n]->name, h, w, ckpt);
        char *exp[] = {TP_BINARY_DIR "/bin/tp-export", "--load", ckpt, "--onnx", onnx[n], NULL};
        cr_assert_eq(s_run(exp), 0, "%s: %s", all[n]->name, s_out);
        char want[64];
        snprintf(want, sizeof want, "input image uint8[batch,%d,%d]", h, w);
        cr_expect(strstr(s_out, want), "%s", s_out);
        shape[3 + n] = onnx[n];
    }
    cr_assert_eq(n, 5);
    cr_assert_eq(s_run(shape), 0, "%s", s_out);
    for (int i = 0; i < n; i++) {
        char want[sizeof onnx[0] + 64];
        snprintf(want, sizeof want, "%.127s: image=batch,%s logits=batch,10", onnx[i],
                 all[i + 1] ? "32,32" : "20,24");
        cr_expect(strstr(s_out, want), "want '%s' in:\n%s", want, s_out);
    }
}

/* Export `name`, run tp-predict on the first `batches` x 100 images of the
 * test split and OpenCV on the same: top-1 agreement and logit distance. */
static void s_agree(const char *name, int batches) {
    char ckpt[128], onnx[128], csv[128], spec[128];
    snprintf(ckpt, sizeof ckpt, "%s/%s.safetensors", s_dir, name);
    snprintf(onnx, sizeof onnx, "%s/%s.onnx", s_dir, name);
    snprintf(csv, sizeof csv, "%s/%s.csv", s_dir, name);
    s_checkpoint(name, ckpt);
    char *exp[] = {TP_BINARY_DIR "/bin/tp-export", "--load", ckpt, "--onnx", onnx, NULL};
    cr_assert_eq(s_run(exp), 0, "%s", s_out);
    snprintf(spec, sizeof spec, "fashion-mnist:test,shuffle=0 | batch 100 | fixed-size %d",
             batches);
    char *pred[] = {TP_BINARY_DIR "/bin/tp-predict", "--load", ckpt, "--spec", spec,
                    "--output", csv, "--logits", "--confusion", "none", NULL};
    cr_assert_eq(s_run(pred), 0, "%s", s_out);
    char *cv[] = {PY, CHECK, "opencv", onnx, csv, IMAGES, NULL};
    cr_assert_eq(s_run(cv), 0, "%s", s_out);
    json_error_t err;
    json_t *j = json_loads(strrchr(s_out, '{'), JSON_DISABLE_EOF_CHECK, &err);
    cr_assert_not_null(j, "%s", s_out);
    double agree = json_real_value(json_object_get(j, "agree"));
    double max_abs = json_real_value(json_object_get(j, "max_abs"));
    int64_t n = json_integer_value(json_object_get(j, "n"));
    json_decref(j);
    cr_expect_eq(n, batches * 100, "%s: %lld images", name, (long long)n);
    cr_expect(agree >= 0.999, "%s: top-1 agrees on %.4f of %lld images", name, agree,
              (long long)n);
    cr_expect(max_abs <= 1e-4, "%s: logits differ by up to %g", name, max_abs);
}

/* The CNN on the first 1000 images of the split (a Debug build's
 * convolutions are slow; TP_TEST_FULL_SPLIT=1 takes all 10000), the other
 * zoo models on fewer. */
Test(tp_export, opencv_agrees_with_tp_predict_on_the_test_split) {
    s_need_python();
    const char *full = getenv("TP_TEST_FULL_SPLIT");
    s_agree("cnn", full && *full == '1' ? 100 : 10);
    s_agree("mlp", 5);
    s_agree("cnn-bn", 3);
    s_agree("resnet", 1);
}

Test(tp_export, an_op_with_no_onnx_form_is_named) {
    char ckpt[128], onnx[128];
    snprintf(ckpt, sizeof ckpt, "%s/mlp.safetensors", s_dir);
    snprintf(onnx, sizeof onnx, "%s/cost.onnx", s_dir);
    s_checkpoint("mlp", ckpt);
    char *exp[] = {TP_BINARY_DIR "/bin/tp-export", "--load", ckpt, "--onnx", onnx,
                   "--output", "cost", NULL};
    cr_expect_eq(s_run(exp), 1, "%s", s_out);
    cr_expect(strstr(s_out, "'softmax_xent'") && strstr(s_out, "no ONNX form"), "%s", s_out);
    cr_expect_neq(access(onnx, F_OK), 0, "a failed export left %s", onnx);
    char *bad[] = {TP_BINARY_DIR "/bin/tp-export", "--load", ckpt, "--onnx", onnx,
                   "--output", "logit", NULL};
    cr_expect_eq(s_run(bad), 1, "%s", s_out);
    cr_expect(strstr(s_out, "'logit'") && strstr(s_out, "linear/output"), "%s", s_out);
}

/* Must hold: tp-export of a checkpoint it has no export for (a gpt, a
 * GAN) is refused naming the model and the tool that runs it, before any
 * model is built, and writes nothing; a checkpoint cut in the middle is
 * named as cut short. */
Test(tp_export, a_gpt_a_gan_and_a_cut_checkpoint_are_refused_by_name) {
    char ckpt[128], onnx[128];
    snprintf(onnx, sizeof onnx, "%s/x.onnx", s_dir);
    static const char *const names[] = {"gpt", "dcgan"};
    static const char *const said[] = {"holds model 'gpt' (a language model)",
                                       "holds model 'dcgan' (a GAN)"};
    for (int i = 0; i < 2; i++) {
        snprintf(ckpt, sizeof ckpt, "%s/%s.safetensors", s_dir, names[i]);
        tt_named_checkpoint(names[i], ckpt);
        char *exp[] = {TP_BINARY_DIR "/bin/tp-export", "--load", ckpt, "--onnx", onnx, NULL};
        cr_expect_eq(s_run(exp), 1, "%s", s_out);
        cr_expect(strstr(s_out, ckpt) && strstr(s_out, said[i]) &&
                      strstr(s_out, "tp-generate"), "%s", s_out);
        cr_expect_neq(access(onnx, F_OK), 0, "a refused export left %s", onnx);
    }
    snprintf(ckpt, sizeof ckpt, "%s/mlp.safetensors", s_dir);
    tt_named_checkpoint("mlp", ckpt);
    struct stat st;
    cr_assert_eq(stat(ckpt, &st), 0);
    cr_assert_eq(truncate(ckpt, st.st_size / 2), 0);
    char *cut[] = {TP_BINARY_DIR "/bin/tp-export", "--load", ckpt, "--onnx", onnx, NULL};
    cr_expect_eq(s_run(cut), 1, "%s", s_out);
    cr_expect(strstr(s_out, "mlp.safetensors") && strstr(s_out, "cut short"), "%s", s_out);
    cr_expect_neq(access(onnx, F_OK), 0, "an export of a cut checkpoint left %s", onnx);
}
