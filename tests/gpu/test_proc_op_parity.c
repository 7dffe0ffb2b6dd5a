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
        op_case_attr(k, &attr);
        tp_shape_t xs[3], ys = op_case_out(k);
        float *x[3] = {NULL, NULL, NULL}, *dx[3] = {NULL, NULL, NULL};
        int32_t *xi[3] = {NULL, NULL, NULL}; /* int32 inputs (the files hold floats) */
        const void *xc[3];
        for (int p = 0; p < k->ninputs; p++) {
            xs[p] = op_case_in(k, p);
            size_t n = tp_shape_count(&xs[p]);
            x[p] = malloc(n * sizeof(float) + 4);
            dx[p] = calloc(n + 1, sizeof(float)); /* stays 0 where no gradient flows */
            xi[p] = malloc(n * sizeof(int32_t) + 4);
            for (size_t i = 0; i < n; i++) {
                x[p][i] = (float)(k->lo[p] + (k->hi[p] - k->lo[p]) * tp_rng_double(&r));
                if (k->step > 0)
                    x[p][i] = k->step * roundf(x[p][i] / k->step);
                if ((k->ints >> p) & 1) {
                    xi[p][i] = (int32_t)floorf(x[p][i]);
                    x[p][i] = (float)xi[p][i];
                }
            }
            xc[p] = (k->ints >> p) & 1 ? (const void *)xi[p] : (const void *)x[p];
            if (p == 1 && op_case_labels(k->kind)) { /* the reduce family's labels */
                for (size_t i = 0; i < n; i++) {  /* in [0, V); the files hold floats */
                    xi[p][i] = (int32_t)(tp_rng_u64(&r) % (uint64_t)xs[0].d[xs[0].ndim - 1]);
                    x[p][i] = (float)xi[p][i];
                }
                xc[p] = xi[p];
            }
        }
        float *dxc[3] = {dx[0], dx[1], dx[2]};
        for (int p = 0; p < k->ninputs; p++)
            if (((k->ints >> p) & 1) || k->kind == TP_OP_ONE_HOT ||
                (p == 1 && op_case_labels(k->kind))) { /* no gradient */
                memset(dx[p], 0, tp_shape_count(&xs[p]) * sizeof(float));
                dxc[p] = NULL;
            }
        size_t ny = tp_shape_count(&ys);
        float *y = malloc(ny * sizeof(float)), *dy = malloc(ny * sizeof(float));
        for (size_t i = 0; i < ny; i++)
            dy[i] = (float)(2.0 * tp_rng_double(&r) - 1.0);
        int acc[3] = {0, 0, 0};
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
        float *ws = NULL; /* the op's scratch */
        c.workspace_bytes = b->ops->op_workspace(b, &c);
        if (c.workspace_bytes) {
            ws = calloc(1, c.workspace_bytes + 64);
            c.workspace = ws;
        }
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
        fprintf(m, "], ");
        fprintf(m, "\"axis\": %d, \"ints\": %d, \"a\": [%lld,%lld,%lld,%lld], "
                   "\"b\": [%lld,%lld,%lld,%lld], \"y\": ", k->axis, k->ints,
                (long long)k->a[0], (long long)k->a[1], (long long)k->a[2],
                (long long)k->a[3], (long long)k->b[0], (long long)k->b[1],
                (long long)k->b[2], (long long)k->b[3]);
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
        fprintf(m, "], \"stride\": %d, \"pad\": %d, \"dilation\": %d, \"groups\": %d, "
                   "\"out_pad\": %d, \"align\": %d, \"absent\": %d, \"heads\": %d}\n",
                k->stride, k->pad, k->dilation, k->groups, k->out_pad, k->align, k->absent,
                k->heads);
        free(ws);
        s_write(k->label, "y", y, ny);
        s_write(k->label, "dy", dy, ny);
        for (int p = 0; p < k->ninputs; p++) {
            free(x[p]);
            free(dx[p]);
            free(xi[p]);
        }
        free(y);
        free(dy);
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
/* An inference-only model of the tower `fn` (user `user`) over the one
 * input `desc`, batch `batch`, in *m, and a predictor sharing it that
 * fetches its output "y". `tag` names the case in a failure. */
static tp_predictor_t *s_y_predictor(const tp_input_desc_t *desc, tp_tower_fn fn, void *user,
                                     int batch, const char *tag, tp_model_t **m) {
    static const char *outs[1] = {"y"};
    tp_model_desc_t md = {desc, 1, fn, NULL, user};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = 0;
    cfg.infer_batch = batch;
    *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(*m, "%s: %s", tag, tp_last_error());
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    pc.output_names = outs;
    pc.noutput_names = 1;
    tp_predictor_t *pr = tp_predictor_new_shared(*m, &pc);
    cr_assert_not_null(pr, "%s: %s", tag, tp_last_error());
    return pr;
}

/* The second half of an ONNX round trip: write the input x (nx floats, of
 * shape `xshape` as "4,2,3") and the predictor's output `out` under `tag`,
 * export the model, free out, the predictor and the model, then have the
 * numpy evaluator run the export on x and compare with out (its report in
 * s_out). Skips, saying why, without python3 or onnx. */
static void s_onnx_evaluate(const char *tag, tp_predictor_t **pr, tp_model_t **m,
                            const float *x, size_t nx, tp_tensor_t *out, const char *xshape) {
    s_write(tag, "x", x, nx);
    s_write(tag, "y", out->data, (size_t)tp_tensor_numel(out));
    char model[128], xp[128], yp[128];
    snprintf(model, sizeof model, "%s/%s.onnx", s_dir, tag);
    snprintf(xp, sizeof xp, "%s/%s.x.f32", s_dir, tag);
    snprintf(yp, sizeof yp, "%s/%s.y.f32", s_dir, tag);
    cr_assert_eq(tp_predictor_export_onnx(*pr, model), TP_OK, "%s", tp_last_error());
    tp_tensor_fini(out);
    tp_predictor_destroy(pr);
    tp_model_destroy(m);
    if (access(PY, X_OK) != 0)
        cr_skip_test("ONNX check skipped: no " PY);
    char *argv[] = {PY, SCRIPT, "onnx", model, xp, (char *)xshape, yp, NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    int rc = pu_run(argv, env, s_out, sizeof s_out);
    if (rc == 3)
        cr_skip_test("ONNX check skipped: %s", s_out);
    cr_log_info("%s", s_out);
    cr_assert_eq(rc, 0, "%s", s_out);
}

static void s_onnx_round_trip(tp_tower_fn fn, const char *tag, uint64_t seed,
                              size_t numel) {
    tp_input_desc_t desc = {"x", TP_FLOAT32, 3, {-1, 2, 3}};
    tp_model_t *m;
    tp_predictor_t *pr = s_y_predictor(&desc, fn, NULL, 4, tag, &m);
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
    s_onnx_evaluate(tag, &pr, &m, x, 24, &out, "4,2,3");
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

/* ---- ONNX export of the shape family --------------------------------------- */

/* Transpose, Slice (a negative step past element 0 among them), Concat
 * along the last axis, Pad, a split's two Slices and Expand, on the
 * [4,2,3] input: one [4,4,6] output. */
static tp_status_t s_every_shape(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    const int64_t E = TP_SLICE_END;
    tp_node_t *tr = tp_transpose(t, "tr", in[0], (const int[]){0, 2, 1}); /* [B,3,2] */
    tp_node_t *rev = tp_slice(t, "rev", tr, (const int64_t[]){0, 2, 0},
                              (const int64_t[]){E, -E, E}, (const int64_t[]){1, -1, 1});
    tp_node_t *two[2] = {rev, tr};
    tp_node_t *cat = tp_concat_axis(t, "cat", -1, 2, two);                 /* [B,3,4] */
    tp_node_t *pad = tp_pad(t, "pad", cat, (const int64_t[]){0, 1, 0},
                            (const int64_t[]){0, 0, 2}, 0.25f);            /* [B,4,6] */
    tp_node_t *p[2];
    tp_split(t, "sp", pad, 2, 2, (const int64_t[]){4, 2}, p);
    tp_node_t *col = tp_slice(t, "col", in[0], (const int64_t[]){0, 1, 1},
                              (const int64_t[]){E, 2, E}, (const int64_t[]){1, 1, 2}); /* [B,1,1] */
    tp_node_t *e = tp_broadcast_to(t, "e", col, 3, (const int64_t[]){-1, 4, 2});
    tp_node_t *parts[2] = {p[0], tp_add(t, "p1e", p[1], e)};
    tp_tower_add_output(t, "y", tp_concat_axis(t, "y", 2, 2, parts));
    return tp_tower_status(t);
}

Test(op_parity, onnx_export_of_every_shape_op_evaluates_the_same) {
    s_onnx_round_trip(s_every_shape, "onnx_shape", 7, 4 * 4 * 6);
}

/* Gather rows and one-hot on int32 ids [4,3] in [0,5): one [4,3,7]
 * output, the ids read by the evaluator as the graph's int32 input. */
static tp_status_t s_ids(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *tab = tp_variable(t, "table", 2, (const int64_t[]){5, 2},
                                 (tp_init_t){TP_INIT_UNIFORM, 1.0f}, TP_VAR_TRAINABLE);
    tp_node_t *two[2] = {tp_gather_rows(t, "emb", tab, in[0]), tp_one_hot(t, "hot", in[0], 5)};
    tp_tower_add_output(t, "y", tp_concat_axis(t, "y", -1, 2, two));
    return tp_tower_status(t);
}

Test(op_parity, onnx_export_of_gather_and_one_hot_evaluates_the_same) {
    tp_input_desc_t desc = {"ids", TP_INT32, 2, {-1, 3}};
    tp_model_t *m;
    tp_predictor_t *pr = s_y_predictor(&desc, s_ids, NULL, 4, "s_ids", &m);
    int32_t ids[12];
    float idf[12];
    for (int i = 0; i < 12; i++) {
        ids[i] = (i * 7 + 3) % 5;
        idf[i] = (float)ids[i];
    }
    tp_tensor_t in, out;
    tp_tensor_init_wrap(&in, TP_INT32, 2, (int64_t[]){4, 3}, ids, NULL, NULL);
    cr_assert_eq(tp_predictor_run(pr, &in, &out), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_tensor_numel(&out), 4 * 3 * 7);
    s_onnx_evaluate("onnx_ids", &pr, &m, idf, 12, &out, "4,3");
}

/* ---- ONNX export of the convolution family --------------------------------
 * Conv with dilation and groups (and a depthwise one), ConvTranspose with
 * output padding, Resize nearest and bilinear (half-pixel and
 * align_corners), summed into one [4,3,10,8] output that the evaluator
 * (Conv/ConvTranspose as ONNX defines them, Resize from its formulas) must
 * reproduce from a [4,2,5,4] input. */
static tp_node_t *s_w4(tp_tower_t *t, const char *name, int64_t a, int64_t b, int64_t k) {
    int64_t s[4] = {a, b, k, k};
    return tp_variable(t, name, 4, s, (tp_init_t){TP_INIT_UNIFORM, 0.5f}, TP_VAR_TRAINABLE);
}
static tp_node_t *s_b1(tp_tower_t *t, const char *name, int64_t n) {
    int64_t s[1] = {n};
    return tp_variable(t, name, 1, s, (tp_init_t){TP_INIT_UNIFORM, 0.5f}, TP_VAR_TRAINABLE);
}
static tp_status_t s_every_conv(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0];
    /* [4,2,5,4] -> [4,4,5,4] (dilation 2, 2 groups) -> [4,3,10,8] */
    tp_node_t *h = tp_relu(t, NULL, tp_conv2d_ex(t, "dil", x, s_w4(t, "w1", 4, 1, 3),
                                                 s_b1(t, "b1", 4), 1, 2, 2, 2));
    tp_node_t *y = tp_conv2d_transpose_op(t, "deconv", h, s_w4(t, "w2", 4, 3, 3),
                                          s_b1(t, "b2", 3), 2, 1, 1, 1, 1);
    tp_node_t *up = tp_upsample_bilinear(t, "bil", x, 2, 0);
    y = tp_add(t, NULL, y, tp_conv2d_ex(t, "mix1", up, s_w4(t, "w3", 3, 2, 1), NULL, 1, 0, 1, 1));
    tp_node_t *dw = tp_conv2d_ex(t, "dw", x, s_w4(t, "w4", 2, 1, 3), NULL, 1, 1, 1, 2);
    up = tp_upsample_bilinear(t, "bil_ac", dw, 2, 1);
    y = tp_add(t, NULL, y, tp_conv2d_ex(t, "mix2", up, s_w4(t, "w5", 3, 2, 1), NULL, 1, 0, 1, 1));
    up = tp_upsample_nearest(t, "near", tp_sigmoid(t, NULL, x), 2);
    y = tp_add(t, "y", y, tp_conv2d_ex(t, "mix3", up, s_w4(t, "w6", 3, 2, 1), NULL, 1, 0, 1, 1));
    tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

Test(op_parity, onnx_export_of_the_convolution_family_evaluates_the_same) {
    tp_input_desc_t desc = {"x", TP_FLOAT32, 4, {-1, 2, 5, 4}};
    tp_model_t *m;
    tp_predictor_t *pr = s_y_predictor(&desc, s_every_conv, NULL, 4, "s_every_conv", &m);
    enum { NX = 4 * 2 * 5 * 4, NY = 4 * 3 * 10 * 8 };
    static float x[NX];
    tp_rng_t r;
    tp_rng_init(&r, 7, 1);
    for (int i = 0; i < NX; i++)
        x[i] = (float)(4.0 * tp_rng_double(&r) - 2.0);
    int64_t xs[4] = {4, 2, 5, 4};
    tp_tensor_t tin, out;
    tp_tensor_init_wrap(&tin, TP_FLOAT32, 4, xs, x, NULL, NULL);
    cr_assert_eq(tp_predictor_run(pr, &tin, &out), TP_OK, "%s", tp_last_error());
    cr_assert_eq((size_t)tp_tensor_numel(&out), (size_t)NY);
    s_onnx_evaluate("onnx_conv", &pr, &m, x, NX, &out, "4,2,5,4");
    cr_assert(strstr(s_out, "ConvTranspose") && strstr(s_out, "Resize"), "%s", s_out);
}


/* The linalg family's ONNX forms (MatMul with Transposes; layer and group
 * norm decomposed at opset 13; InstanceNormalization), each [N,2,3],
 * summed into one output the numpy evaluator must reproduce. */
static tp_status_t s_every_linalg(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0]; /* [N,2,3] */
    tp_init_t ui = {TP_INIT_UNIFORM, 1.0f};
#define LA_VAR(nm, ...) tp_variable(t, nm, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), \
                                    (int64_t[]){__VA_ARGS__}, ui, TP_VAR_TRAINABLE)
    tp_node_t *terms[] = {
        tp_batch_matmul(t, "xxt_x", tp_batch_matmul(t, "xxt", x, x, 0, 1), x, 0, 0),
        tp_batch_matmul(t, "x_xtx", x, tp_batch_matmul(t, "xtx", x, x, 1, 0), 0, 0),
        tp_batch_matmul(t, "xw", x, LA_VAR("w33", 3, 3), 0, 0),
        tp_batch_matmul(t, "wx", LA_VAR("w22", 2, 2), x, 1, 0),
        tp_layer_norm_op(t, "ln", x, LA_VAR("ln_g", 2, 3), LA_VAR("ln_b", 2, 3), 2, 1e-5f),
        tp_layer_norm_op(t, "ln1", x, LA_VAR("ln1_g", 3), LA_VAR("ln1_b", 3), 1, 0.1f),
        tp_group_norm_op(t, "gn", x, LA_VAR("gn_g", 2), LA_VAR("gn_b", 2), 1, 1e-5f),
        tp_instance_norm_op(t, "in", x, LA_VAR("in_g", 2), LA_VAR("in_b", 2), 1e-5f),
        /* gamma and beta left out, or one of them */
        tp_layer_norm_op(t, "ln_plain", x, NULL, NULL, 2, 1e-5f),
        tp_layer_norm_op(t, "ln_b_only", x, NULL, LA_VAR("lnb_b", 3), 1, 1e-5f),
        tp_group_norm_op(t, "gn_g_only", x, LA_VAR("gng_g", 2), NULL, 2, 1e-5f),
        tp_group_norm_op(t, "gn_plain", x, NULL, NULL, 1, 1e-5f),
        tp_instance_norm_op(t, "in_plain", x, NULL, NULL, 1e-5f),
        tp_instance_norm_op(t, "in_b_only", x, NULL, LA_VAR("inb_b", 2), 1e-5f),
        /* 1-d operands: [N,2,3] @ [3] -> [N,2] and [2] @ [N,2,3] -> [N,3],
         * reshaped to broadcast against [N,2,3] */
        tp_reshape(t, NULL, tp_batch_matmul(t, "xv", x, LA_VAR("v3", 3), 0, 0), 3,
                   (const int64_t[]){-1, 2, 1}),
        tp_reshape(t, NULL, tp_batch_matmul(t, "vx", LA_VAR("v2", 2), x, 0, 0), 3,
                   (const int64_t[]){-1, 1, 3})};
#undef LA_VAR
    tp_node_t *y = terms[0];
    for (size_t i = 1; i < sizeof terms / sizeof terms[0]; i++)
        y = tp_add(t, i + 1 < sizeof terms / sizeof terms[0] ? NULL : "y", y, terms[i]);
    tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

Test(op_parity, onnx_export_of_every_linalg_op_evaluates_the_same) {
    s_onnx_round_trip(s_every_linalg, "onnx_linalg", 7, 24);
}


/* Fused attention's ONNX form (MatMul, Mul by the scale, Add the causal
 * mask, Softmax, MatMul): x [N,T=2,D=3] as q, k and v (rank 3: N the
 * leading dim), causal and not, with k and v from products so that they
 * differ from q, and the packed form's; summed into the [4,2,3] output. */
static tp_status_t s_every_attention(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *x = in[0];
    tp_init_t ui = {TP_INIT_UNIFORM, 1.0f};
    tp_node_t *k = tp_batch_matmul(t, "k", x, tp_variable(t, "wk", 2, (int64_t[]){3, 3}, ui,
                                                          TP_VAR_TRAINABLE), 0, 0);
    tp_node_t *v = tp_batch_matmul(t, "v", x, tp_variable(t, "wv", 2, (int64_t[]){3, 3}, ui,
                                                          TP_VAR_TRAINABLE), 0, 0);
    tp_node_t *y = tp_add(t, NULL, tp_attention(t, "causal", x, k, v, 1, 0.0f),
                          tp_attention(t, "full", x, v, k, 0, 0.7f));
    /* the packed form (tp_attention_qkv): Reshape, Transpose and Slices of
     * a [N,2,9] qkv around the same, the heads merged back to [N,2,3]; 3
     * heads of 1 causal, 1 head of 3 full */
    tp_node_t *qkv = tp_batch_matmul(t, "qkv", x, tp_variable(t, "wqkv", 2, (int64_t[]){3, 9},
                                                              ui, TP_VAR_TRAINABLE), 0, 0);
    y = tp_add(t, NULL, y, tp_attention_qkv(t, "packed3", qkv, 3, 1, 0.0f));
    y = tp_add(t, "y", y, tp_attention_qkv(t, "packed1", qkv, 1, 0, 0.6f));
    tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

Test(op_parity, onnx_export_of_attention_evaluates_the_same) {
    s_onnx_round_trip(s_every_attention, "onnx_attention", 9, 24);
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


/* ---- OpenCV's DNN importer on the shape, linalg and reduce exports --------
 * One graph per op (or per form of an op's export), each on x float32
 * [2,3,4,5] (or int32 ids [2,3] for gather and one-hot), exported and run
 * by OpenCV 4.6's cv2.dnn.readNetFromONNX (op_parity.py opencv). `cv` says
 * what OpenCV does with it: 1 reads it and agrees within 1e-5, 0 cannot
 * read it or differs (docs/ops.md lists those); a row whose outcome moves
 * fails the test, so that the list in the docs stays true. */
typedef struct {
    const char *tag;
    int ids;   /* 1: the int32 ids input */
    int cv;    /* 1: OpenCV reads it and agrees */
    int batch; /* 0: 2 */
} s_cv_row_t;

/* What OpenCV 4.6 (Debian's python3-opencv) does, as found: the reasons
 * are in docs/ops.md. */
static const s_cv_row_t s_cv_rows[] = {
    /* the shape family */
    {"cv_transpose", 0, 1, 0}, {"cv_slice", 0, 1, 0},
    {"cv_slice_reversed", 0, 0, 0}, /* Slice with a negative step */
    {"cv_concat", 0, 1, 0}, {"cv_pad", 0, 1, 0}, {"cv_split", 0, 1, 0},
    {"cv_broadcast_to", 0, 1, 0}, {"cv_reshape", 0, 1, 0},
    {"cv_gather", 1, 0, 0}, /* Gather of a table by the input's ids */
    {"cv_one_hot", 1, 0, 0}, /* OneHot */
    /* the linalg family */
    {"cv_matmul_w", 0, 1, 0}, {"cv_matmul_x_xt", 0, 1, 0}, {"cv_matmul_trans_a", 0, 1, 0},
    {"cv_matmul_vector", 0, 1, 0},
    /* the norms' centring x - mean: a Sub of two computed tensors that
     * broadcasts, which OpenCV 4.6 cannot shape */
    {"cv_layer_norm", 0, 0, 0}, {"cv_layer_norm_plain", 0, 0, 0},
    {"cv_group_norm", 0, 0, 0}, {"cv_group_norm_plain", 0, 0, 0},
    /* InstanceNormalization: OpenCV 4.6 applies scale and B to the first
     * sample of the batch only, so a batch of 2 differs and batch 1 agrees */
    {"cv_instance_norm", 0, 0, 0}, {"cv_instance_norm_batch1", 0, 1, 1},
    {"cv_instance_norm_plain", 0, 1, 0},
    /* the reduce family */
    {"cv_reduce_sum", 0, 0, 0}, {"cv_reduce_sum_keep", 0, 0, 0}, /* opset 13's axes input */
    {"cv_reduce_mean", 0, 1, 0}, {"cv_reduce_max", 0, 1, 0}, {"cv_argmax", 0, 1, 0},
    {"cv_softmax_axis1", 0, 1, 0}, {"cv_softmax_last", 0, 1, 0}, {"cv_log_softmax", 0, 1, 0},
    {"cv_softmax_xent_seq", 0, 0, 0}, /* SoftmaxCrossEntropyLoss */
    {"cv_top_k_accuracy", 0, 0, 0},   /* TopK */
};
#define S_NCV ((int)(sizeof s_cv_rows / sizeof s_cv_rows[0]))

static tp_status_t s_cv_graph(tp_tower_t *t, tp_node_t *const *in, void *u) {
    const char *tag = s_cv_rows[*(const int *)u].tag + 3;
    tp_node_t *x = in[0], *y = NULL;
    const int64_t E = TP_SLICE_END;
    tp_init_t ui = {TP_INIT_UNIFORM, 1.0f};
#define CV_VAR(nm, ...) tp_variable(t, nm, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), \
                                    (int64_t[]){__VA_ARGS__}, ui, TP_VAR_TRAINABLE)
    if (!strcmp(tag, "transpose")) {
        y = tp_transpose(t, "y", x, (const int[]){0, 2, 3, 1});
    } else if (!strcmp(tag, "slice")) {
        y = tp_slice(t, "y", x, (const int64_t[]){0, 1, 0, 1}, (const int64_t[]){E, 3, E, E},
                     (const int64_t[]){1, 1, 1, 2});
    } else if (!strcmp(tag, "slice_reversed")) {
        y = tp_slice(t, "y", x, (const int64_t[]){0, 0, 0, 4}, (const int64_t[]){E, E, E, -E},
                     (const int64_t[]){1, 1, 1, -1});
    } else if (!strcmp(tag, "concat")) {
        tp_node_t *two[2] = {x, x};
        y = tp_concat_axis(t, "y", 2, 2, two);
    } else if (!strcmp(tag, "pad")) {
        y = tp_pad(t, "y", x, (const int64_t[]){0, 0, 1, 2}, (const int64_t[]){0, 0, 0, 1},
                   0.5f);
    } else if (!strcmp(tag, "split")) {
        tp_node_t *p[2];
        tp_split(t, "sp", x, 3, 2, (const int64_t[]){2, 3}, p);
        y = p[1];
    } else if (!strcmp(tag, "broadcast_to")) {
        tp_node_t *col = tp_slice(t, "col", x, (const int64_t[]){0, 1, 0, 0},
                                  (const int64_t[]){E, 2, E, E}, (const int64_t[]){1, 1, 1, 1});
        y = tp_broadcast_to(t, "y", col, 4, (const int64_t[]){-1, 3, 4, 5});
    } else if (!strcmp(tag, "reshape")) {
        y = tp_reshape(t, "y", x, 3, (const int64_t[]){-1, 12, 5});
    } else if (!strcmp(tag, "gather")) {
        y = tp_gather_rows(t, "y", CV_VAR("table", 5, 4), x);
    } else if (!strcmp(tag, "one_hot")) {
        y = tp_one_hot(t, "y", x, 5);
    } else if (!strcmp(tag, "matmul_w")) {
        y = tp_batch_matmul(t, "y", x, CV_VAR("w", 5, 6), 0, 0);
    } else if (!strcmp(tag, "matmul_x_xt")) {
        y = tp_batch_matmul(t, "y", x, x, 0, 1);
    } else if (!strcmp(tag, "matmul_trans_a")) {
        y = tp_batch_matmul(t, "y", x, CV_VAR("w", 4, 2), 1, 0);
    } else if (!strcmp(tag, "matmul_vector")) {
        y = tp_batch_matmul(t, "y", x, CV_VAR("v", 5), 0, 0);
    } else if (!strcmp(tag, "layer_norm")) {
        y = tp_layer_norm_op(t, "y", x, CV_VAR("g", 4, 5), CV_VAR("b", 4, 5), 2, 1e-5f);
    } else if (!strcmp(tag, "layer_norm_plain")) {
        y = tp_layer_norm_op(t, "y", x, NULL, NULL, 1, 1e-5f);
    } else if (!strcmp(tag, "group_norm")) {
        y = tp_group_norm_op(t, "y", x, CV_VAR("g", 3), CV_VAR("b", 3), 3, 1e-5f);
    } else if (!strcmp(tag, "group_norm_plain")) {
        y = tp_group_norm_op(t, "y", x, NULL, NULL, 1, 1e-5f);
    } else if (!strcmp(tag, "instance_norm") || !strcmp(tag, "instance_norm_batch1")) {
        y = tp_instance_norm_op(t, "y", x, CV_VAR("g", 3), CV_VAR("b", 3), 1e-5f);
    } else if (!strcmp(tag, "instance_norm_plain")) {
        y = tp_instance_norm_op(t, "y", x, NULL, NULL, 1e-5f);
    } else if (!strcmp(tag, "reduce_sum")) {
        y = tp_reduce_sum(t, "y", x, 1, (const int[]){3}, 0);
    } else if (!strcmp(tag, "reduce_sum_keep")) {
        y = tp_reduce_sum(t, "y", x, 2, (const int[]){1, 3}, 1);
    } else if (!strcmp(tag, "reduce_mean")) {
        y = tp_reduce_mean(t, "y", x, 2, (const int[]){2, 3}, 1);
    } else if (!strcmp(tag, "reduce_max")) {
        y = tp_reduce_max(t, "y", x, 1, (const int[]){1}, 0);
    } else if (!strcmp(tag, "argmax")) {
        y = tp_argmax(t, "y", x, 3, 0);
    } else if (!strcmp(tag, "softmax_axis1")) {
        y = tp_softmax(t, "y", x, 1);
    } else if (!strcmp(tag, "softmax_last")) {
        y = tp_softmax(t, "y", x, -1);
    } else if (!strcmp(tag, "log_softmax")) {
        y = tp_log_softmax(t, "y", x, -1);
    } else if (!strcmp(tag, "softmax_xent_seq")) {
        y = tp_softmax_xent_seq(t, "y", x, tp_argmax(t, "lab", tp_neg(t, NULL, x), -1, 0),
                                -100);
    } else if (!strcmp(tag, "top_k_accuracy")) {
        tp_node_t *flat = tp_reshape(t, "flat", x, 2, (const int64_t[]){-1, 60});
        y = tp_top_k_accuracy(t, "y", flat, tp_argmax(t, "lab", tp_neg(t, NULL, flat), 1, 0),
                              2);
    }
#undef CV_VAR
    if (y)
        tp_tower_add_output(t, "y", y);
    return tp_tower_status(t);
}

/* Export row i's graph, its input and towerpack's output into s_dir, and
 * add its "MODEL X DIMS Y" to argv (4 strings, kept in `keep`). */
static void s_cv_row(int i, char **argv, char (*keep)[128]) {
    const s_cv_row_t *r = &s_cv_rows[i];
    tp_input_desc_t desc = r->ids ? (tp_input_desc_t){"x", TP_INT32, 2, {-1, 3}}
                                  : (tp_input_desc_t){"x", TP_FLOAT32, 4, {-1, 3, 4, 5}};
    const int nb = r->batch ? r->batch : 2;
    tp_model_t *m;
    tp_predictor_t *pr = s_y_predictor(&desc, s_cv_graph, &i, nb, r->tag, &m);
    enum { NX = 2 * 3 * 4 * 5 }; /* at most 2 samples */
    float x[NX];
    int32_t ids[6];
    tp_rng_t g;
    tp_rng_init(&g, 11 + (uint64_t)i, 1);
    for (int j = 0; j < NX; j++)
        x[j] = (float)(4.0 * tp_rng_double(&g) - 2.0);
    for (int j = 0; j < 6; j++) {
        ids[j] = (int32_t)(tp_rng_u64(&g) % 5);
        x[j] = r->ids ? (float)ids[j] : x[j];
    }
    tp_tensor_t in, out;
    if (r->ids)
        tp_tensor_init_wrap(&in, TP_INT32, 2, (int64_t[]){2, 3}, ids, NULL, NULL);
    else
        tp_tensor_init_wrap(&in, TP_FLOAT32, 4, (int64_t[]){nb, 3, 4, 5}, x, NULL, NULL);
    cr_assert_eq(tp_predictor_run(pr, &in, &out), TP_OK, "%s: %s", r->tag, tp_last_error());
    const size_t ny = (size_t)tp_tensor_numel(&out);
    float *y = malloc((ny ? ny : 1) * sizeof(float));
    cr_assert_not_null(y);
    for (size_t j = 0; j < ny; j++) /* argmax gives int32 */
        y[j] = out.dtype == TP_INT32 ? (float)((int32_t *)out.data)[j] : ((float *)out.data)[j];
    s_write(r->tag, "x", x, r->ids ? 6 : (size_t)nb * NX / 2);
    s_write(r->tag, "y", y, ny);
    free(y);
    char model[128], xp[128], yp[128];
    snprintf(model, sizeof model, "%s/%s.onnx", s_dir, r->tag);
    snprintf(xp, sizeof xp, "%s/%s.x.f32", s_dir, r->tag);
    snprintf(yp, sizeof yp, "%s/%s.y.f32", s_dir, r->tag);
    cr_assert_eq(tp_predictor_export_onnx(pr, model), TP_OK, "%s: %s", r->tag, tp_last_error());
    tp_tensor_fini(&out);
    tp_predictor_destroy(&pr);
    tp_model_destroy(&m);
    snprintf(keep[0], 128, "%s", model);
    snprintf(keep[1], 128, "%s", xp);
    snprintf(keep[2], 128, r->ids ? "%d,3" : "%d,3,4,5", nb);
    snprintf(keep[3], 128, "%s", yp);
    for (int j = 0; j < 4; j++)
        argv[j] = keep[j];
}

Test(op_parity, opencv_reads_the_shape_linalg_and_reduce_exports_it_supports) {
    if (access(PY, X_OK) != 0)
        cr_skip_test("OpenCV check skipped: no " PY);
    static char keep[S_NCV * 4][128];
    char *argv[3 + S_NCV * 4 + 1] = {PY, SCRIPT, "opencv"};
    for (int i = 0; i < S_NCV; i++)
        s_cv_row(i, argv + 3 + 4 * i, keep + 4 * i);
    argv[3 + S_NCV * 4] = NULL;
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    const int rc = pu_run(argv, env, s_out, sizeof s_out);
    if (rc == 3)
        cr_skip_test("OpenCV check skipped: %s", s_out);
    cr_log_info("%s", s_out);
    int moved = 0;
    for (int i = 0; i < S_NCV; i++) { /* its line: "TAG.onnx (OPS): OpenCV V WHAT" */
        char head[64];
        snprintf(head, sizeof head, "\n%s.onnx (", s_cv_rows[i].tag);
        const char *l = strstr(s_out, head + 1) == s_out ? s_out : strstr(s_out, head);
        cr_assert_not_null(l, "%s: no line in:\n%s", s_cv_rows[i].tag, s_out);
        const char *end = strchr(l + 1, '\n');
        const char *ag = strstr(l, ": max |diff|");
        const int agrees = ag && (!end || ag < end) && ag - l > 7 && !strncmp(ag - 7, " agrees", 7);
        if (agrees != (s_cv_rows[i].cv == 1)) {
            cr_log_error("%s: OpenCV %s, the table says it %s (update docs/ops.md)",
                         s_cv_rows[i].tag, agrees ? "agrees" : "fails",
                         s_cv_rows[i].cv ? "agrees" : "fails");
            moved++;
        }
    }
    cr_assert_eq(moved, 0, "%d rows moved:\n%s", moved, s_out);
}
