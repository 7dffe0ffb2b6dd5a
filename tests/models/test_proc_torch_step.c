/* towerpack tests: one training step of the zoo's cnn-bn on the CPU against
 * the same step in PyTorch (tests/models/torch_step.py, float64): the same
 * initial weights (read from towerpack's checkpoint), batch and dropout
 * mask; the loss and every variable after the step (conv kernels, batch
 * norm's scale, shift and moving averages, fc weights and biases) must
 * agree. This pins what the PyTorch peer of the GPU checks
 * (scripts/gpu/pytorch_cnn_bn.py) must write to train the same model with
 * the same recipe: batch norm's conventions, weight decay on the kernels
 * and weights only, SGD's momentum. Skips when python3 lacks torch. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "proc_testutil.h"

#define REF_PY TP_SOURCE_DIR "/tests/models/torch_step.py"

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.02, 0.9, 0);  /* tp-train's for cnn-bn */
}

static void s_write(const char *dir, const char *name, const void *data, size_t bytes) {
    cr_assert_eq(pu_write_file(dir, name, data, bytes), 0, "%s/%s", dir, name);
}

static void s_write_node(tp_model_t *m, const char *dir, const char *node) {
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, 0, node, &v), TP_OK, "%s", tp_last_error());
    char name[64];
    snprintf(name, sizeof name, "%s.bin", node);
    s_write(dir, name, v.data, v.nbytes);
}

Test(torch_step, pytorch_takes_the_same_cnn_bn_step) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-torchstep-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    tp_input_desc_t in[2];
    memcpy(in, tp_zoo_inputs(), sizeof in);
    tp_model_desc_t md = {in, 2, tp_zoo_find("cnn-bn")->build, s_sgd, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 8;
    cfg.seed = 5;
    cfg.threads = 1;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    char path[512];
    snprintf(path, sizeof path, "%s/w0.safetensors", dir);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    static uint8_t x[8 * 784];
    int32_t y[8];
    tp_rng_t r;
    tp_rng_init(&r, 11, 0);
    for (size_t i = 0; i < sizeof x; i++)
        x[i] = (uint8_t)tp_rng_u64(&r);
    for (int i = 0; i < 8; i++)
        y[i] = (int32_t)(tp_rng_u64(&r) % 10);
    s_write(dir, "x.bin", x, sizeof x);
    s_write(dir, "y.bin", y, sizeof y);
    int64_t xs[3] = {8, 28, 28}, ys[1] = {8};
    tp_tensor_t feeds[2];
    tp_tensor_init_wrap(&feeds[0], TP_UINT8, 3, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&feeds[1], TP_INT32, 1, ys, y, NULL, NULL);
    cr_assert_eq(tp_model_run(m, 0, feeds, 2, NULL, 0, NULL), TP_OK, "%s", tp_last_error());
    s_write_node(m, dir, "dropout");  /* its mask, for PyTorch to apply */
    s_write_node(m, dir, "cost");
    snprintf(path, sizeof path, "%s/w1.safetensors", dir);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    tp_model_destroy(&m);
    PU_PYTHON_EXPECT(REF_PY, dir, "pytorch agrees");
}

/* ---- label smoothing against PyTorch's --------------------------------- */

#define LS_PY TP_SOURCE_DIR "/tests/models/torch_label_smoothing.py"
#define LS_N 16
#define LS_F 12

static tp_status_t s_ls_build(tp_tower_t *t, tp_node_t *const *in, void *user) {
    float smoothing = *(const float *)user;
    tp_node_t *logits = tp_fc(t, "fc", in[0], 10, 1);
    tp_node_t *cost = tp_softmax_xent_smoothed(t, "cost", logits, in[1], smoothing);
    tp_tower_add_output(t, "cost", cost);
    TP_TRY(tp_tower_status(t));
    return tp_tower_set_cost(t, cost);
}

/* The loss and the fc layer's gradients of a cross-entropy with labels
 * smoothed by 0.2, from random logits' inputs and weights, against
 * torch.nn.functional.cross_entropy(label_smoothing=0.2) in float64
 * (tests/models/torch_label_smoothing.py); a smoothing outside [0, 1) is
 * refused when the model is built, naming it. */
Test(torch_step, label_smoothing_is_pytorchs) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-torchls-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    const tp_input_desc_t in[2] = {{"x", TP_FLOAT32, 2, {-1, LS_F}},
                                   {"y", TP_INT32, 1, {-1}}};
    float smoothing = 0.2f;
    tp_model_desc_t md = {in, 2, s_ls_build, s_sgd, &smoothing};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = LS_N;
    cfg.seed = 3;
    cfg.threads = 1;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    float x[LS_N * LS_F];
    int32_t y[LS_N];
    tp_rng_t r;
    tp_rng_init(&r, 13, 0);
    for (int i = 0; i < LS_N * LS_F; i++)
        x[i] = (float)((double)(tp_rng_u64(&r) >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    for (int i = 0; i < LS_N; i++)
        y[i] = (int32_t)(tp_rng_u64(&r) % 10);
    int64_t xs[2] = {LS_N, LS_F}, ys[1] = {LS_N};
    tp_tensor_t feeds[2];
    tp_tensor_init_wrap(&feeds[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&feeds[1], TP_INT32, 1, ys, y, NULL, NULL);
    tp_fetch_t f = {.name = "cost"};
    tp_run_opts_t ro = {.stages = TP_RUN_GRADIENTS};
    cr_assert_eq(tp_model_run(m, 0, feeds, 2, &f, 1, &ro), TP_OK, "%s", tp_last_error());
    s_write(dir, "x.bin", x, sizeof x);
    s_write(dir, "y.bin", y, sizeof y);
    s_write(dir, "cost.bin", f.value.data, 4);
    const char *vars[2] = {"fc/W", "fc/b"};
    for (int i = 0; i < 2; i++) {
        tp_tensor_t v, g;
        cr_assert_eq(tp_model_var(m, vars[i], &v), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_model_grad(m, 0, vars[i], &g), TP_OK, "%s", tp_last_error());
        char name[32];
        snprintf(name, sizeof name, "%s.bin", i ? "b" : "W");
        s_write(dir, name, v.data, v.nbytes);
        snprintf(name, sizeof name, "d%s.bin", i ? "b" : "W");
        s_write(dir, name, g.data, g.nbytes);
    }
    tp_tensor_fini(&f.value);
    tp_model_destroy(&m);
    smoothing = 1.0f;
    cr_expect_null(tp_model_new(&md, &cfg));
    cr_expect(strstr(tp_last_error(), "label smoothing 1: must be in [0, 1)"), "%s",
              tp_last_error());
    PU_PYTHON_EXPECT(LS_PY, dir, "pytorch agrees");
}

/* ---- optimizers and gradient processing against torch.optim ------------
 * A few steps of a small MLP (fc 12->16, relu, fc 16->10, cross-entropy)
 * with AdamW (or Adam), the global-norm clip, the weights' average and
 * learning-rate multipliers (one of them 0: frozen) and gradient
 * accumulation, on
 * one tower (the fused update) and on two from one thread (the update
 * after the all-reduce), against torch.optim.AdamW, clip_grad_norm_ and
 * timm's ModelEmaV2 arithmetic in float64
 * (tests/models/torch_optim.py, which states the tolerance). */

#define OP_PY TP_SOURCE_DIR "/tests/models/torch_optim.py"
#define OP_B 8
#define OP_F 12
#define OP_STEPS 6
#define OP_SGD_STEPS 20 /* the SGD cases' (momentum 0.9, coupled decay) */

typedef struct {
    const char *name, *kind;
    double lr, wd, clip, ema;
    int towers;
    const char *mults; /* "-" or "PATTERN=MULT,..." (at most two) */
    int accumulate;
} s_op_case_t;

static tp_status_t s_op_build(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *h = tp_relu(t, NULL, tp_fc(t, "fc0", in[0], 16, 1));
    tp_node_t *cost = tp_softmax_xent(t, "cost", tp_fc(t, "fc1", h, 10, 1), in[1]);
    TP_TRY(tp_tower_status(t));
    return tp_tower_set_cost(t, cost);
}

/* "sgd": momentum 0.9 and the coupled decay on the matrices only (the
 * biases' multiplier 0, as tp-train's --weight-decay with SGD); "sgd-all":
 * on every weight (torch.optim.SGD's one group). */
static int s_op_sgd(const s_op_case_t *c) { return !strncmp(c->kind, "sgd", 3); }

static tp_optimizer_t *s_op_opt(void *user) {
    const s_op_case_t *c = user;
    tp_optimizer_t *o = s_op_sgd(c) ? tp_optimizer_sgd(c->lr, 0.9, 0)
                        : !strcmp(c->kind, "adamw")
                            ? tp_optimizer_adamw(c->lr, 0.9, 0.999, 1e-8, c->wd)
                            : tp_optimizer_adam(c->lr, 0.9, 0.999, 1e-8);
    if (o && s_op_sgd(c) && (tp_optimizer_set(o, "weight_decay", c->wd) < 0 ||
                             (!strcmp(c->kind, "sgd") &&
                              tp_optimizer_add_decay_mult(o, "*/b", 0.0) < 0)))
        tp_optimizer_destroy(&o);
    if (o && (tp_optimizer_set(o, "clip_norm", c->clip) < 0 ||
              tp_optimizer_set(o, "ema_decay", c->ema) < 0 ||
              tp_optimizer_set(o, "accumulate", c->accumulate ? c->accumulate : 1) < 0))
        tp_optimizer_destroy(&o);
    char rules[128];
    snprintf(rules, sizeof rules, "%s", c->mults);
    for (char *save = NULL, *r = strtok_r(rules, ",", &save); o && strcmp(c->mults, "-") && r;
         r = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(r, '=');
        *eq = 0;
        if (tp_optimizer_add_lr_mult(o, r, atof(eq + 1)) < 0)
            tp_optimizer_destroy(&o);
    }
    return o;
}

static void s_op_case(const char *dir, const s_op_case_t *c, FILE *cases) {
    const tp_input_desc_t in[2] = {{"x", TP_FLOAT32, 2, {-1, OP_F}},
                                   {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {in, 2, s_op_build, s_op_opt, (void *)c};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.towers = c->towers;
    cfg.batch = OP_B;
    cfg.seed = 9;
    cfg.threads = 1;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    char path[512];
    snprintf(path, sizeof path, "%s/%s_w0.safetensors", dir, c->name);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    const int rows = OP_B * c->towers, steps = s_op_sgd(c) ? OP_SGD_STEPS : OP_STEPS;
    static float x[OP_SGD_STEPS][4 * OP_B * OP_F];
    static int32_t y[OP_SGD_STEPS][4 * OP_B];
    tp_rng_t r;
    tp_rng_init(&r, 17, 0);
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < rows * OP_F; i++)
            x[s][i] = (float)(tp_rng_double(&r) * 4.0 - 2.0);
        for (int i = 0; i < rows; i++)
            y[s][i] = (int32_t)(tp_rng_u64(&r) % 10);
        int64_t xs[2] = {OP_B, OP_F}, ys[1] = {OP_B};
        tp_tensor_t feeds[8];
        for (int k = 0; k < c->towers; k++) {
            tp_tensor_init_wrap(&feeds[2 * k], TP_FLOAT32, 2, xs, x[s] + k * OP_B * OP_F,
                                NULL, NULL);
            tp_tensor_init_wrap(&feeds[2 * k + 1], TP_INT32, 1, ys, y[s] + k * OP_B, NULL,
                                NULL);
        }
        cr_assert_eq(tp_model_run(m, c->towers > 1 ? TP_ALL_TOWERS : 0, feeds,
                                  2 * c->towers, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
    }
    FILE *fx, *fy;
    snprintf(path, sizeof path, "%s/%s_x.bin", dir, c->name);
    cr_assert_not_null(fx = fopen(path, "wb"));
    snprintf(path, sizeof path, "%s/%s_y.bin", dir, c->name);
    cr_assert_not_null(fy = fopen(path, "wb"));
    for (int s = 0; s < steps; s++) {
        cr_assert_eq(fwrite(x[s], sizeof(float), (size_t)rows * OP_F, fx), (size_t)rows * OP_F);
        cr_assert_eq(fwrite(y[s], sizeof(int32_t), (size_t)rows, fy), (size_t)rows);
    }
    fclose(fx);
    fclose(fy);
    snprintf(path, sizeof path, "%s/%s_w1.safetensors", dir, c->name);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    fprintf(cases, "%s %s %.17g %.17g %.17g %.17g %d %d %s %d\n", c->name, c->kind,
            c->lr, c->wd, c->clip, c->ema, steps, c->towers, c->mults,
            c->accumulate ? c->accumulate : 1);
    tp_model_destroy(&m);
}

Test(torch_step, optimizers_and_gradient_processing_are_torch_optims) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tp-torchopt-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    FILE *cases = fopen(path, "w");
    cr_assert_not_null(cases);
    static const s_op_case_t all[] = {
        {"adamw", "adamw", 0.01, 0.1, 0, 0, 1, "-", 1},
        {"adamw_clip", "adamw", 0.01, 0.1, 0.5, 0, 1, "-", 1},
        {"adamw_clip_2towers", "adamw", 0.01, 0.1, 0.5, 0, 2, "-", 1},
        {"adam_clip", "adam", 0.02, 0, 0.3, 0, 1, "-", 1},
        {"adamw_ema", "adamw", 0.01, 0.1, 0, 0.8, 1, "-", 1},
        {"adamw_clip_ema_2towers", "adamw", 0.01, 0.1, 0.5, 0.8, 2, "-", 1},
        {"adamw_mults", "adamw", 0.01, 0.1, 0, 0, 1, "fc0/*=0.1,fc1/b=0", 1},
        {"adamw_clip_ema_mults_2towers", "adamw", 0.01, 0.1, 0.5, 0.8, 2,
         "fc1/W=3,fc0/b=0", 1},
        {"adamw_accumulate3", "adamw", 0.01, 0.1, 0, 0, 1, "-", 3},
        {"adamw_clip_ema_accumulate2_2towers", "adamw", 0.01, 0.1, 0.5, 0.8, 2, "-", 2},
        /* SGD's coupled decay (tp-train --weight-decay with SGD), 20 steps:
         * the matrices only (per-variable updates), every weight on two
         * towers (the one call after the all-reduce), with the lr
         * multipliers, with the clip */
        {"sgd_wd", "sgd", 0.05, 0.05, 0, 0, 1, "-", 1},
        {"sgd_all_wd_2towers", "sgd-all", 0.05, 0.05, 0, 0, 2, "-", 1},
        {"sgd_wd_mults_clip", "sgd", 0.05, 0.05, 0.5, 0, 1, "fc0/*=0.5", 1},
    };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        s_op_case(dir, &all[i], cases);
    fclose(cases);
    PU_PYTHON_EXPECT(OP_PY, dir, "pytorch agrees");
}
