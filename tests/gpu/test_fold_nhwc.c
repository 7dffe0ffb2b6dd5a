/* towerpack tests: the NHWC fold (gpu/graph/fold.c's tp_plan_nhwc_): a
 * transpose NHWC -> NCHW whose one reader is a conv2d is read by the conv
 * itself (oneDNN's nhwc source on the CPU). The folded model gives the
 * transposed model's outputs and gradients (the filter's, the bias's, and
 * the NHWC input's when asked: a saliency map) on odd sizes with stride,
 * padding, dilation and groups; the fold makes one call fewer; the
 * transpose's value is refused by name; where the plan cannot (the
 * transposed tensor an output or read twice, the im2col path) or
 * TP_FOLD=0 / TP_NHWC_FOLD=0 says so, the transpose runs as before. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>

/* one geometry: input [N, H, W, C] -> O filters k x k */
typedef struct {
    int n, h, w, c, o, k, stride, pad, dil, groups;
    int want_dx; /* the input's gradient asked for */
    int deep;    /* a second conv after the first's relu (an nChw16c
                    chain between them on AVX-512, tp_plan_blk16_) */
} s_case_t;

static s_case_t s_cur;
static int s_expose; /* 1: the transposed tensor is also an output; 2: a
                        second reader (a relu of it in the cost) */

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.01, 0.0, 0);
}

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    const s_case_t *k = &s_cur;
    const int perm[4] = {0, 3, 1, 2};
    tp_node_t *x = tp_transpose(t, "nchw", in[0], perm);
    const int64_t ws[4] = {k->o, k->c / k->groups, k->k, k->k}, bs[1] = {k->o};
    tp_node_t *w = tp_variable(t, "W", 4, ws, (tp_init_t){TP_INIT_HE_NORMAL, 0}, TP_VAR_TRAINABLE);
    tp_node_t *b = tp_variable(t, "b", 1, bs, (tp_init_t){TP_INIT_UNIFORM, 0.5f}, TP_VAR_TRAINABLE);
    tp_node_t *y = tp_relu(t, "out",
                           tp_conv2d_ex(t, "conv", x, w, b, k->stride, k->pad, k->dil, k->groups));
    if (k->deep) {
        const int64_t w2s[4] = {16, k->o, 3, 3};
        tp_node_t *w2 = tp_variable(t, "W2", 4, w2s, (tp_init_t){TP_INIT_HE_NORMAL, 0},
                                    TP_VAR_TRAINABLE);
        y = tp_relu(t, "out2", tp_conv2d_ex(t, "conv2", y, w2, NULL, 1, 1, 1, 1));
    }
    /* a cost whose dy differs from pixel to pixel */
    tp_node_t *cost = tp_reduce_mean(t, "cost", tp_square(t, NULL, y), 0, NULL, 0);
    if (k->want_dx)
        TP_TRY(tp_tower_input_gradient(t, in[0]));
    tp_tower_add_output(t, k->deep ? "out2" : "out", y);
    if (s_expose == 1)
        tp_tower_add_output(t, "nchw", x);
    if (s_expose == 2)
        cost = tp_add(t, "cost2", cost,
                      tp_reduce_mean(t, NULL, tp_relu(t, NULL, x), 0, NULL, 0));
    return tp_tower_set_cost(t, cost);
}

static tp_model_t *s_model(int fold) {
    tp_input_desc_t d[1] = {
        {"img", TP_FLOAT32, 4, {-1, s_cur.h, s_cur.w, s_cur.c}}};
    tp_model_desc_t md = {d, 1, s_tower, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = s_cur.n;
    mc.infer_batch = s_cur.n;
    mc.seed = 5;
    mc.threads = 1;
    mc.fold = fold;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

/* the model's profile rows (calls) and the folds counted on them */
static int s_rows(tp_model_t *m, int *folds) {
    tp_op_profile_t p[32];
    int n = tp_model_profile(m, 0, p, 32);
    *folds = 0;
    for (int i = 0; i < n && i < 32; i++)
        *folds += p[i].folds;
    return n;
}

typedef struct {
    float *out, *dw, *db, *dx;
    size_t nout, ndw, ndb, ndx;
    int rows, folds;
} s_result_t;

static float *s_copy(const tp_tensor_t *v, size_t *n) {
    *n = v->nbytes / sizeof(float);
    float *c = malloc(v->nbytes);
    cr_assert_not_null(c);
    memcpy(c, v->data, v->nbytes);
    return c;
}

/* one forward + backward on a fixed image batch */
static s_result_t s_run(int fold) {
    tp_model_t *m = s_model(fold);
    const s_case_t *k = &s_cur;
    const size_t count = (size_t)k->n * k->h * k->w * k->c;
    float *img = malloc(count * sizeof *img);
    cr_assert_not_null(img);
    for (size_t i = 0; i < count; i++)
        img[i] = sinf((float)i * 0.37f) + 0.25f * cosf((float)i * 1.9f);
    int64_t shape[4] = {k->n, k->h, k->w, k->c};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_FLOAT32, 4, shape, img, NULL, NULL);
    tp_run_opts_t ro = {.stages = TP_RUN_GRADIENTS};
    cr_assert_eq(tp_model_run(m, 0, &in, 1, NULL, 0, &ro), TP_OK, "%s", tp_last_error());
    s_result_t r = {0};
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, 0, k->deep ? "out2" : "out", &v), TP_OK, "%s",
                 tp_last_error());
    r.out = s_copy(&v, &r.nout);
    tp_tensor_fini(&v);
    cr_assert_eq(tp_model_grad(m, 0, "W", &v), TP_OK, "%s", tp_last_error());
    r.dw = s_copy(&v, &r.ndw);
    cr_assert_eq(tp_model_grad(m, 0, "b", &v), TP_OK, "%s", tp_last_error());
    r.db = s_copy(&v, &r.ndb);
    if (k->want_dx) {
        cr_assert_eq(tp_model_input_grad(m, 0, "img", &v), TP_OK, "%s", tp_last_error());
        cr_assert_eq(v.ndim, 4);
        cr_assert_eq(v.shape[3], k->c, "the input's gradient is NHWC");
        r.dx = s_copy(&v, &r.ndx);
    }
    r.rows = s_rows(m, &r.folds);
    tp_model_destroy(&m);
    free(img);
    return r;
}

static void s_free(s_result_t *r) {
    free(r->out);
    free(r->dw);
    free(r->db);
    free(r->dx);
}

/* a and b within rounding: |a - b| <= 1e-5 * (largest |b|) + 1e-6 */
static void s_near(const char *what, const float *a, const float *b, size_t n) {
    double big = 0.0, d = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        big = fmax(big, fabs((double)b[i]));
        if (fabs((double)a[i] - (double)b[i]) > d) {
            d = fabs((double)a[i] - (double)b[i]);
            at = i;
        }
    }
    cr_expect(d <= 1e-5 * big + 1e-6, "%s: %g apart at %zu (%g vs %g; largest %g)", what, d,
              at, n ? (double)a[at] : 0.0, n ? (double)b[at] : 0.0, big);
}

/* The case folded (folded 1: one call fewer, a fold counted) or not,
 * against TP_NHWC_FOLD=0's transpose + conv. */
static void s_check(s_case_t k, int folded) {
    s_cur = k;
    setenv("TP_NHWC_FOLD", "0", 1);
    s_result_t ref = s_run(1);
    unsetenv("TP_NHWC_FOLD");
    s_result_t got = s_run(1);
    cr_expect_eq(got.rows, ref.rows - folded, "calls: %d folded, %d not", got.rows, ref.rows);
    cr_expect_eq(got.folds, ref.folds + folded, "folds: %d, %d", got.folds, ref.folds);
    cr_assert_eq(got.nout, ref.nout);
    s_near("out", got.out, ref.out, ref.nout);
    s_near("dW", got.dw, ref.dw, ref.ndw);
    s_near("db", got.db, ref.db, ref.ndb);
    if (k.want_dx) {
        cr_assert_eq(got.ndx, ref.ndx);
        s_near("dx", got.dx, ref.dx, ref.ndx);
    }
    s_free(&ref);
    s_free(&got);
}

/* n h w c o k stride pad dil groups want_dx */
Test(fold_nhwc, colour_image_conv_folded_as_transpose_and_conv) {
    s_check((s_case_t){4, 13, 11, 3, 32, 3, 1, 1, 1, 1, 0, 0}, 1);
}

Test(fold_nhwc, stride_pad_dilation_odd_sizes) {
    s_check((s_case_t){3, 17, 15, 3, 16, 3, 2, 2, 2, 1, 0, 0}, 1);
    s_check((s_case_t){2, 23, 21, 3, 64, 7, 2, 3, 1, 1, 0, 0}, 1);
}

/* the input's gradient, NHWC, from oneDNN's backward-data (8 channels
 * and more), grouped too */
Test(fold_nhwc, input_gradient_is_nhwc) {
    s_check((s_case_t){3, 9, 7, 8, 16, 3, 1, 1, 1, 1, 1, 0}, 1);
    s_check((s_case_t){2, 11, 10, 24, 18, 3, 2, 1, 1, 3, 1, 0}, 1);
    /* 16 channels: NHWC is nChw16c's memory, read and written in place */
    s_check((s_case_t){3, 7, 9, 16, 32, 3, 1, 1, 1, 1, 1, 0}, 1);
    /* tp-bench ops' conv2d/enc2_nhwc row (the autoencoder's enc2), at a
     * smaller batch: 16 channels, stride 2 */
    s_check((s_case_t){4, 14, 14, 16, 32, 3, 2, 1, 1, 1, 1, 0}, 1);
}

/* the conv's output kept nChw16c for the next conv (AVX-512): NHWC in,
 * blocked out */
Test(fold_nhwc, nhwc_input_with_a_blocked_output) {
    s_check((s_case_t){3, 14, 13, 3, 32, 3, 1, 1, 1, 1, 0, 1}, 1);
    s_check((s_case_t){2, 12, 12, 16, 32, 3, 1, 1, 1, 1, 1, 1}, 1);
}

/* TP_CPU_CONV=dnnl-plain: the primitives on plain NCHW, the NHWC source
 * turned by our own pass (3 channels in registers, 8 plainly), dx NHWC
 * by oneDNN's reorder */
Test(fold_nhwc, plain_layout_primitives) {
    setenv("TP_CPU_CONV", "dnnl-plain", 1);
    s_check((s_case_t){3, 13, 11, 3, 16, 3, 1, 1, 1, 1, 0, 0}, 1);
    s_check((s_case_t){2, 9, 7, 8, 16, 3, 2, 1, 2, 1, 1, 0}, 1);
    unsetenv("TP_CPU_CONV");
}

/* one channel: conv_thin.c reads NHWC as NCHW (the same memory) */
Test(fold_nhwc, one_channel_image) {
    s_check((s_case_t){2, 10, 9, 1, 8, 3, 1, 1, 1, 1, 1, 0}, 1);
}

/* a 3-channel image's gradient (a saliency map) runs im2col's
 * backward-data, NCHW, turned NHWC after it; with a folded relu too */
Test(fold_nhwc, few_channel_input_gradient) {
    s_check((s_case_t){2, 9, 9, 3, 16, 3, 1, 1, 1, 1, 1, 0}, 1);
    s_check((s_case_t){3, 15, 13, 3, 32, 5, 2, 2, 1, 1, 1, 0}, 1);
    s_check((s_case_t){2, 14, 13, 3, 32, 3, 1, 1, 1, 1, 1, 1}, 1);
}

/* where the plan does not fold: the transposed tensor an output or read
 * twice, the im2col path (TP_CPU_CONV=im2col) */
Test(fold_nhwc, not_folded_where_it_cannot) {
    const s_case_t k = {2, 9, 8, 3, 16, 3, 1, 1, 1, 1, 0, 0};
    s_expose = 1;
    s_check(k, 0);
    s_expose = 2;
    s_check(k, 0);
    s_expose = 0;
    setenv("TP_CPU_CONV", "im2col", 1);
    s_check(k, 0);
    unsetenv("TP_CPU_CONV");
    s_check(k, 1);
}

/* The transpose's value is never made: fetching or pruning to it is
 * refused by name, naming the conv and the input to fetch instead;
 * unfolded (TP_FOLD=0, TP_NHWC_FOLD=0) it is fetched. */
Test(fold_nhwc, transpose_value_refused_by_name) {
    s_cur = (s_case_t){2, 8, 8, 3, 16, 3, 1, 1, 1, 1, 0, 0};
    float img[2 * 8 * 8 * 3];
    for (int i = 0; i < 2 * 8 * 8 * 3; i++)
        img[i] = (float)(i % 7) - 3.0f;
    int64_t shape[4] = {2, 8, 8, 3};
    tp_tensor_t in;
    tp_tensor_init_wrap(&in, TP_FLOAT32, 4, shape, img, NULL, NULL);
    tp_run_opts_t ro = {.stages = TP_RUN_FORWARD};
    for (int mode = 0; mode < 3; mode++) {
        if (mode == 2)
            setenv("TP_NHWC_FOLD", "0", 1);
        tp_model_t *m = s_model(mode != 1);
        unsetenv("TP_NHWC_FOLD");
        tp_fetch_t f = {"nchw", {0}};
        tp_status_t rc = tp_model_run(m, -1, &in, 1, &f, 1, &ro);
        if (mode == 0) {
            cr_expect_eq(rc, TP_ERR_INVALID);
            cr_expect(strstr(tp_last_error(), "'nchw'") && strstr(tp_last_error(), "'conv'") &&
                          strstr(tp_last_error(), "'img'") &&
                          strstr(tp_last_error(), "TP_NHWC_FOLD=0"),
                      "%s", tp_last_error());
            const char *names[1] = {"nchw"};
            cr_expect_eq(tp_model_prune(m, names, 1), TP_ERR_INVALID);
            tp_fetch_t o = {"out", {0}};
            cr_expect_eq(tp_model_run(m, -1, &in, 1, &o, 1, &ro), TP_OK, "%s", tp_last_error());
            tp_tensor_fini(&o.value);
        } else {
            cr_assert_eq(rc, TP_OK, "mode %d: %s", mode, tp_last_error());
            cr_assert_eq(f.value.shape[1], 3);
            /* [n, c, h, w] = img[n, h, w, c] */
            const float *v = f.value.data;
            cr_expect_eq(v[1 * 64 + 2 * 8 + 5], img[(2 * 8 + 5) * 3 + 1]);
            tp_tensor_fini(&f.value);
        }
        tp_model_destroy(&m);
    }
}
