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
