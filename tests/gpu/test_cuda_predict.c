/* towerpack tests: predictors on a CUDA device against the CPU predictor.
 *
 * The same checkpoint through a predictor on device 0 and one on the CPU:
 * logits within fp32 tolerance and the same top-1 at every batch size; a
 * data-parallel predictor over the GPU and a CPU tower gives each row the
 * logits of the one CPU predictor. Where no GPU answers the GPU tests skip
 * with tp_cuda_status()'s reason, and the test of the error a device
 * predictor gives there runs instead. Own executable: it initialises CUDA.
 *
 * NOTE: written without a GPU; the first session with one runs it through
 * scripts/gpu-check.sh. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/models.h>
#include <towerpack/predict.h>
#include <towerpack/towerpack.h>
#include "pipeline/predict_testutil.h"
#include "dir_testutil.h"

#define B 16

static char s_dir[256];
static char s_ckpt[320];
static tp_model_desc_t s_md;
static const char *s_ins[] = {"image"}, *s_outs[] = {"logits"};

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.05, 0.9, 0);
}

/* Deterministic images [n,28,28] and labels [n] from row `first`. */
static void s_batch(int64_t first, int64_t n, tp_tensor_t *img, tp_tensor_t *lab) {
    pt_batch(first, n, 3, img, lab);
}

/* cnn-bn (conv, batch norm, pooling, dense) trained a few steps on the CPU,
 * so the moving averages are not their initial values. */
static void s_setup(void) {
    tp_log_set_level(TP_LOG_WARN);
    dt_make(s_dir, sizeof s_dir, "tp_cuda_predict");
    snprintf(s_ckpt, sizeof s_ckpt, "%s/cnn-bn.safetensors", s_dir);
    const tp_zoo_model_t *z = tp_zoo_find("cnn-bn");
    cr_assert_not_null(z);
    s_md = (tp_model_desc_t){tp_zoo_inputs(), 2, z->build, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = B;
    mc.seed = 11;
    tp_model_t *m = tp_model_new(&s_md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_assert_eq(tp_model_set_name(m, "cnn-bn"), TP_OK);
    for (int s = 0; s < 4; s++) {
        tp_tensor_t in[2];
        s_batch(s * B, B, &in[0], &in[1]);
        cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
        tp_tensor_fini(&in[0]);
        tp_tensor_fini(&in[1]);
    }
    cr_assert_eq(tp_checkpoint_save(m, s_ckpt, NULL), TP_OK, "%s", tp_last_error());
    tp_model_destroy(&m);
}

static void s_teardown(void) {
    if (s_dir[0])
        dt_remove(s_dir);
}

static void s_config(tp_predict_config_t *c, int device) {
    tp_predict_config_init(c);
    c->model = &s_md;
    c->checkpoint = s_ckpt;
    c->input_names = s_ins;
    c->ninput_names = 1;
    c->output_names = s_outs;
    c->noutput_names = 1;
    c->device = device;
    c->max_batch = 64;
}

static void s_need_gpu(void) {
    if (tp_cuda_device_count() <= 0) {
        dt_remove(s_dir);  /* a skipped test's .fini does not run */
        s_dir[0] = '\0';
        cr_skip_test("no GPU: %s", tp_cuda_status());
    }
}

static int s_argmax(const float *row) {
    int best = 0;
    for (int k = 1; k < 10; k++)
        if (row[k] > row[best])
            best = k;
    return best;
}

/* |a - b| <= 1e-4 (1 + |b|) for every logit, the same top-1 for every row. */
static void s_expect_close(const tp_tensor_t *a, const tp_tensor_t *b, const char *what) {
    cr_assert_eq(a->nbytes, b->nbytes, "%s", what);
    const float *x = a->data, *y = b->data;
    int64_t n = a->shape[0];
    double worst = 0;
    for (int64_t i = 0; i < n * 10; i++) {
        double d = fabs((double)x[i] - y[i]) / (1 + fabs((double)y[i]));
        if (d > worst)
            worst = d;
    }
    cr_expect_leq(worst, 1e-4, "%s: logits differ by %g (relative)", what, worst);
    for (int64_t r = 0; r < n; r++)
        cr_expect_eq(s_argmax(x + r * 10), s_argmax(y + r * 10), "%s: top-1 of row %lld",
                     what, (long long)r);
}

TestSuite(cuda_predict, .init = s_setup, .fini = s_teardown);

Test(cuda_predict, logits_agree_with_the_cpu_predictor) {
    s_need_gpu();
    tp_predict_config_t c;
    s_config(&c, -1);
    tp_predictor_t *cpu = tp_predictor_new(&c);
    cr_assert_not_null(cpu, "%s", tp_last_error());
    s_config(&c, 0);
    tp_predictor_t *gpu = tp_predictor_new(&c);
    cr_assert_not_null(gpu, "%s", tp_last_error());
    const int64_t sizes[] = {1, 7, 64};
    for (int i = 0; i < 3; i++) {
        tp_tensor_t img, lab, a, b;
        s_batch(5000 + 100 * i, sizes[i], &img, &lab);
        cr_assert_eq(tp_predictor_run(gpu, &img, &a), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_predictor_run(cpu, &img, &b), TP_OK, "%s", tp_last_error());
        char what[64];
        snprintf(what, sizeof what, "batch %lld", (long long)sizes[i]);
        s_expect_close(&a, &b, what);
        tp_tensor_fini(&a);
        tp_tensor_fini(&b);
        tp_tensor_fini(&img);
        tp_tensor_fini(&lab);
    }
    tp_predictor_destroy(&gpu);
    tp_predictor_destroy(&cpu);
}

Test(cuda_predict, data_parallel_over_the_gpu_and_a_cpu_tower) {
    s_need_gpu();
    tp_predict_config_t c;
    s_config(&c, -1);
    c.max_batch = 100; /* the CPU reference takes the whole batch at once */
    tp_predictor_t *cpu = tp_predictor_new(&c);
    cr_assert_not_null(cpu, "%s", tp_last_error());
    int devices[2] = {0, -1};
    tp_dp_predictor_t *dp = tp_dp_predictor_new(&c, devices, 2);
    cr_assert_not_null(dp, "%s", tp_last_error());
    cr_assert_eq(tp_dp_predictor_towers(dp), 2);
    tp_tensor_t img, lab, a, b;
    s_batch(9000, 100, &img, &lab); /* 50 rows a tower */
    cr_assert_eq(tp_dp_predictor_run(dp, &img, &a), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_predictor_run(cpu, &img, &b), TP_OK, "%s", tp_last_error());
    s_expect_close(&a, &b, "data-parallel");
    tp_tensor_fini(&a);
    tp_tensor_fini(&b);
    tp_tensor_fini(&img);
    tp_tensor_fini(&lab);
    tp_dp_predictor_destroy(&dp);
    tp_predictor_destroy(&cpu);
}

Test(cuda_predict, without_a_gpu_a_device_predictor_says_why) {
    if (tp_cuda_device_count() > 0)
        cr_skip_test("a GPU answers: the error path is for machines without one");
    tp_predict_config_t c;
    s_config(&c, 0);
    tp_predictor_t *p = tp_predictor_new(&c);
    cr_expect_null(p, "a predictor on device 0 without a GPU");
    cr_expect(strstr(tp_last_error(), "device 0"), "%s", tp_last_error());
    tp_predictor_destroy(&p);
}
