/* towerpack tests: every op row of op_cases.h against PyTorch's autograd.
 *
 * The C side runs each row on the CPU backend (forward, then backward with
 * a random dy) and writes the inputs, dy, the output and the gradients as
 * raw little-endian float32 files plus one JSON line per row (manifest.jsonl);
 * tests/tools/op_parity.py recomputes them with torch and compares, with
 * the row's tolerances. Skipped, saying so, without Debian's python3-torch.
 * A second test writes the same rows with a deliberately wrong gradient
 * (the elementwise kernels' test-only fault) and asserts that the script
 * reports it. Own executable: it forks and execs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "proc_testutil.h"
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "gpu/op_cases.h"

#define PY "/usr/bin/python3"
#define SCRIPT TP_SOURCE_DIR "/tests/tools/op_parity.py"

/* The elementwise kernels' test-only fault (gpu/cpu/ops_elementwise.h). */
extern float tp_cpu_elementwise_grad_fault;

static char s_dir[64];
static char s_out[1 << 16];

static void s_setup(void) {
    tp_log_set_level(TP_LOG_WARN);
    snprintf(s_dir, sizeof s_dir, "/tmp/tp-parity-XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
}

static void s_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", s_dir);
}

static void s_write(const char *label, const char *what, const float *v, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%s.f32", s_dir, label, what);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(v, sizeof(float), n, f), n);
    fclose(f);
}

static void s_json_shape(FILE *m, const tp_shape_t *s) {
    fputc('[', m);
    for (int i = 0; i < s->ndim; i++)
        fprintf(m, "%s%lld", i ? "," : "", (long long)s->d[i]);
    fputc(']', m);
}

/* Run every row on the CPU backend into s_dir. */
static void s_dump(void) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    char path[512];
    snprintf(path, sizeof path, "%s/manifest.jsonl", s_dir);
    FILE *m = fopen(path, "w");
    cr_assert_not_null(m);
    tp_rng_t r;
    tp_rng_init(&r, 42, 1);
    for (int ci = 0; ci < OP_NCASES; ci++) {
        const op_case_t *k = &op_cases[ci];
        tp_op_attr_t attr = {0};
        attr.alpha = k->alpha;
        attr.beta = k->beta;
        attr.axes = op_case_axes(k);
        tp_shape_t xs[2], ys = op_case_out(k);
        float *x[2] = {NULL, NULL}, *dx[2] = {NULL, NULL};
        const void *xc[2];
        int32_t *lab = NULL; /* the reduce family's int32 labels (input 1) */
        for (int p = 0; p < k->ninputs; p++) {
            xs[p] = op_case_in(k, p);
            size_t n = tp_shape_count(&xs[p]);
            x[p] = malloc(n * sizeof(float));
            dx[p] = calloc(n, sizeof(float)); /* stays 0 where no gradient flows */
            for (size_t i = 0; i < n; i++) {
                x[p][i] = (float)(k->lo[p] + (k->hi[p] - k->lo[p]) * tp_rng_double(&r));
                if (k->step > 0)
                    x[p][i] = k->step * roundf(x[p][i] / k->step);
            }
            xc[p] = x[p];
            if (p == 1 && op_case_labels(k->kind)) { /* the files hold them as floats */
                lab = malloc(n * sizeof(int32_t));
                for (size_t i = 0; i < n; i++) {
                    lab[i] = (int32_t)(tp_rng_u64(&r) % (uint64_t)xs[0].d[xs[0].ndim - 1]);
                    x[p][i] = (float)lab[i];
                }
                xc[p] = lab;
            }
        }
        float *dxc[2] = {dx[0], lab ? NULL : dx[1]};
        size_t ny = tp_shape_count(&ys);
        float *y = malloc(ny * sizeof(float)), *dy = malloc(ny * sizeof(float));
        for (size_t i = 0; i < ny; i++)
            dy[i] = (float)(2.0 * tp_rng_double(&r) - 1.0);
        int acc[2] = {0, 0};
        tp_op_call_t c = {0};
        c.kind = k->kind;
        c.attr = &attr;
        c.name = k->label;
        c.ninputs = k->ninputs;
        c.x = xc;
        c.xshape = xs;
        c.y = y;
        c.yshape = ys;
        c.dx = dxc;
        c.dx_acc = acc;
        c.dy = dy;
        /* softmax_xent's probabilities, the reductions' sums */
        c.workspace_bytes = b->ops->op_workspace(b, &c);
        c.workspace = calloc(1, c.workspace_bytes + 64);
        cr_assert_eq(b->ops->op_forward(b, NULL, &c), TP_OK, "%s", tp_last_error());
        cr_assert_eq(b->ops->op_backward(b, NULL, &c), TP_OK, "%s", tp_last_error());
        if (k->kind == TP_OP_ARGMAX) /* int32 indices, written as floats */
            for (size_t i = 0; i < ny; i++)
                y[i] = (float)((int32_t *)y)[i];
        fprintf(m, "{\"label\": \"%s\", \"op\": \"%s\", \"alpha\": %.9g, \"beta\": %.9g, "
                   "\"atol\": %.9g, \"rtol\": %.9g, \"keepdims\": %d, \"axes\": [",
                k->label, tp_op_name(k->kind), (double)k->alpha, (double)k->beta,
                (double)k->atol, (double)k->rtol, k->beta != 0);
        for (int j = 0, first = 1; j < 8; j++)
            if (op_case_axes(k) & (1 << j)) {
                fprintf(m, "%s%d", first ? "" : ",", j);
                first = 0;
            }
        fprintf(m, "], \"y\": ");
        s_json_shape(m, &ys);
        fprintf(m, ", \"inputs\": [");
        for (int p = 0; p < k->ninputs; p++) {
            char what[16];
            fprintf(m, "%s", p ? ", " : "");
            s_json_shape(m, &xs[p]);
            snprintf(what, sizeof what, "x%d", p);
            s_write(k->label, what, x[p], tp_shape_count(&xs[p]));
            snprintf(what, sizeof what, "dx%d", p);
            s_write(k->label, what, dx[p], tp_shape_count(&xs[p]));
        }
        fprintf(m, "]}\n");
        s_write(k->label, "y", y, ny);
        s_write(k->label, "dy", dy, ny);
        for (int p = 0; p < k->ninputs; p++) {
            free(x[p]);
            free(dx[p]);
        }
        free(y);
        free(dy);
        free(lab);
        free(c.workspace);
    }
    fclose(m);
    tp_backend_destroy(&b);
}

/* The script's exit status on s_dir (0 all close, 1 a mismatch, 3 no torch). */
static int s_check(void) {
    if (access(PY, X_OK) != 0)
        cr_skip_test("PyTorch parity skipped: no " PY " (install python3-torch; "
                     "scripts/install-deps.sh does)");
    char *argv[] = {PY, SCRIPT, s_dir, NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    int rc = pu_run(argv, env, s_out, sizeof s_out);
    if (rc == 3)
        cr_skip_test("PyTorch parity skipped: %s", s_out);
    return rc;
}

TestSuite(op_parity, .init = s_setup, .fini = s_teardown, .timeout = 120);

Test(op_parity, every_row_matches_pytorch_forward_and_gradients) {
    s_dump();
    int rc = s_check();
    cr_log_info("%s", s_out);
    cr_assert_eq(rc, 0, "op_parity.py: %s", s_out);
    cr_assert(strstr(s_out, "rows checked") != NULL, "%s", s_out);
}

Test(op_parity, a_wrong_gradient_is_reported) {
    tp_cpu_elementwise_grad_fault = 1.001f; /* 0.1% off, this process only */
    s_dump();
    int rc = s_check();
    cr_assert_eq(rc, 1, "op_parity.py passed a gradient 0.1%% off: %s", s_out);
    cr_assert(strstr(s_out, "MISMATCH") != NULL, "%s", s_out);
}

/* ---- ONNX export of the elementwise family -------------------------------- */

static tp_status_t s_every_op(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0];
    int64_t s3[1] = {3}, s21[2] = {2, 1};
    const float cv[2] = {0.25f, -0.5f};
    tp_node_t *w = tp_variable(t, "w", 1, s3, (tp_init_t){TP_INIT_UNIFORM, 1.0f},
                               TP_VAR_TRAINABLE);
    tp_node_t *c = tp_constant(t, "c", 2, s21, cv);
    tp_node_t *p = tp_add(t, "pos", tp_square(t, NULL, x), tp_scalar(t, "half", 0.5f));
    tp_node_t *terms[] = {
        tp_sub(t, NULL, x, w), tp_mul(t, NULL, x, w), tp_div(t, NULL, x, p),
        tp_maximum(t, NULL, x, c), tp_minimum(t, NULL, c, x), tp_neg(t, NULL, x),
        tp_abs(t, NULL, x), tp_sqrt(t, NULL, p), tp_rsqrt(t, NULL, p),
        tp_exp(t, NULL, x), tp_ln(t, NULL, p), tp_pow(t, NULL, p, 1.5f),
        tp_clip(t, NULL, x, -0.3f, 0.4f), tp_gelu(t, NULL, x, 0), tp_gelu(t, NULL, x, 1),
        tp_silu(t, NULL, x), tp_softplus(t, NULL, x), tp_stop_gradient(t, NULL, x)};
    tp_node_t *y = terms[0];
    for (size_t i = 1; i < sizeof terms / sizeof terms[0]; i++)
        y = tp_add(t, NULL, y, terms[i]);
    tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

/* Build `fn`'s inference graph on a [4,2,3] input of seeded values in
 * [-2, 2), run it, export it as `tag`.onnx, and have the numpy evaluator
 * of the ONNX file reproduce the output (`numel` floats). */
static void s_onnx_round_trip(tp_tower_fn fn, const char *tag, uint64_t seed,
                              size_t numel) {
    tp_input_desc_t desc = {"x", TP_FLOAT32, 3, {-1, 2, 3}};
    tp_model_desc_t md = {&desc, 1, fn, NULL, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 0;
    cfg.infer_batch = 4;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    const char *outs[1] = {"y"};
    pc.output_names = outs;
    pc.noutput_names = 1;
    tp_predictor_t *pr = tp_predictor_new_shared(m, &pc);
    cr_assert_not_null(pr, "%s", tp_last_error());
    float x[4 * 6];
    tp_rng_t r;
    tp_rng_init(&r, seed, 1);
    for (int i = 0; i < 24; i++)
        x[i] = (float)(4.0 * tp_rng_double(&r) - 2.0);
    int64_t xs[3] = {4, 2, 3};
    tp_tensor_t in, out;
    tp_tensor_init_wrap(&in, TP_FLOAT32, 3, xs, x, NULL, NULL);
    cr_assert_eq(tp_predictor_run(pr, &in, &out), TP_OK, "%s", tp_last_error());
    cr_assert_eq((size_t)tp_tensor_numel(&out), numel, "%s: %lld outputs, not %zu", tag,
                 (long long)tp_tensor_numel(&out), numel);
    s_write(tag, "x", x, 24);
    s_write(tag, "y", out.data, numel);
    char model[128], xp[128], yp[128];
    snprintf(model, sizeof model, "%s/%s.onnx", s_dir, tag);
    snprintf(xp, sizeof xp, "%s/%s.x.f32", s_dir, tag);
    snprintf(yp, sizeof yp, "%s/%s.y.f32", s_dir, tag);
    cr_assert_eq(tp_predictor_export_onnx(pr, model), TP_OK, "%s", tp_last_error());
    tp_tensor_fini(&out);
    tp_predictor_destroy(&pr);
    tp_model_destroy(&m);
    if (access(PY, X_OK) != 0)
        cr_skip_test("ONNX check skipped: no " PY);
    char *argv[] = {PY, SCRIPT, "onnx", model, xp, "4,2,3", yp, NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    int rc = pu_run(argv, env, s_out, sizeof s_out);
    if (rc == 3)
        cr_skip_test("ONNX check skipped: %s", s_out);
    cr_log_info("%s", s_out);
    cr_assert_eq(rc, 0, "%s", s_out);
}

Test(op_parity, onnx_export_of_every_elementwise_op_evaluates_the_same) {
    s_onnx_round_trip(s_every_op, "onnx", 5, 24);
}

/* The loss family's ONNX forms (Sub/Mul/Abs/Min/Max/Exp/Log/ReduceMean),
 * each against a target computed from the same input, summed to one
 * scalar that the numpy evaluator must reproduce. */
static tp_status_t s_every_loss(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0];
    tp_node_t *th = tp_tanh(t, "th", x), *sg = tp_sigmoid(t, "sg", x);
    tp_node_t *big = tp_mul(t, "big", x, tp_scalar(t, "k", 30.0f));
    tp_node_t *y = tp_add(t, NULL, tp_mse(t, "mse", x, th), tp_l1_loss(t, "l1", x, sg));
    y = tp_add(t, NULL, y, tp_huber_loss(t, "huber", x, tp_neg(t, NULL, th), 0.7f));
    y = tp_add(t, "y", y, tp_sigmoid_xent(t, "bce", big, sg));
    tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

Test(op_parity, onnx_export_of_every_loss_evaluates_the_same) {
    s_onnx_round_trip(s_every_loss, "onnx_loss", 6, 1);  /* the losses' sum: one scalar */
}

/* The reduce family's ONNX forms (ReduceSum/ReduceMean/ReduceMax with axes
 * and keepdims, ArgMax + Cast, Softmax/LogSoftmax along an axis, the
 * sequence cross-entropy as SoftmaxCrossEntropyLoss behind a Transpose,
 * top-k accuracy from TopK), argmax feeding the label ops, all added into
 * the [4,2,3] output the numpy evaluator must reproduce. */
static tp_status_t s_every_reduce(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0]; /* batched [4,2,3] */
    const int a1[1] = {1}, a02[2] = {0, 2}, alast[1] = {-1};
    tp_node_t *y = tp_add(t, NULL, tp_softmax(t, "sm", x, 1), tp_log_softmax(t, "lsm", x, 0));
    y = tp_add(t, NULL, y, tp_reduce_sum(t, "sum1", x, 1, a1, 1));
    y = tp_add(t, NULL, y, tp_reduce_mean(t, "mean02", x, 2, a02, 1));
    y = tp_add(t, NULL, y, tp_reduce_max(t, "maxlast", x, 1, alast, 1));
    y = tp_add(t, NULL, y, tp_reduce_sum(t, "sumall", tp_square(t, NULL, x), 0, NULL, 0));
    /* labels [4,2] from another tensor; class 0 ignored */
    tp_node_t *lab = tp_argmax(t, "lab", tp_neg(t, NULL, x), -1, 0);
    y = tp_add(t, NULL, y, tp_softmax_xent_seq(t, "seq_xent", x, lab, 0));
    const int64_t s46[2] = {-1, 6};
    tp_node_t *flat = tp_reshape(t, "flat", x, 2, s46);
    tp_node_t *lab2 = tp_argmax(t, "lab2", tp_reshape(t, NULL, tp_square(t, NULL, tp_add(t, NULL, x, tp_scalar(t, "shift", 0.3f))), 2, s46), 1, 0);
    y = tp_add(t, "y", y, tp_top_k_accuracy(t, "top2", flat, lab2, 2));
    tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

Test(op_parity, onnx_export_of_every_reduce_op_evaluates_the_same) {
    s_onnx_round_trip(s_every_reduce, "onnx_reduce", 7, 24);
}

