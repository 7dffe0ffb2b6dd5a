/* towerpack tests: the zoo's GPT (models/zoo_gpt.c) against the same GPT
 * written in PyTorch (tests/models/torch_gpt.py, float64): from towerpack's
 * initial checkpoint and the same batch of byte tokens, the loss and the
 * gradient of every variable (embeddings, layer norms, the attention's and
 * the MLP's projections) agree within 1e-4. This pins the architecture the
 * model claims: GPT-2's pre-norm blocks, causal attention, tanh GELU, the
 * output tied to the token embedding. Then 20 training steps of nanoGPT's
 * AdamW (betas 0.9/0.95, weight decay 0.1 on the matrices and embeddings
 * only, global-norm clip 1) on 20 batches of text: the loss of every step
 * agrees with torch.optim.AdamW's run from the same weights on the same
 * batches; and the same 20 steps with the products in bf16
 * (tp_backend_cpu_bf16) within bf16's error of them, no further than
 * PyTorch's own bf16 (autocast) goes. Skips when python3 lacks torch. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "proc_testutil.h"

#define REF_PY TP_SOURCE_DIR "/tests/models/torch_gpt.py"
#define B 4
#define T 16
#define STEPS 20

static tp_optimizer_t *s_adamw(void *u) {
    (void)u;
    return tp_optimizer_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
}

static void s_write(const char *dir, const char *name, const void *data, size_t bytes) {
    cr_assert_eq(pu_write_file(dir, name, data, bytes), 0, "%s/%s", dir, name);
}

/* The GPT both tests check (2 layers, 2 heads of 16: every kind of
 * variable, twice) from `seed`, trained by `opt`; its initial weights
 * saved to dir/w0.safetensors, PyTorch's start, in a new temporary dir
 * (its name into dir[size]). The inputs and options are static: the
 * model's description points at them. */
static tp_model_t *s_gpt(char *dir, size_t size, tp_optimizer_fn opt, uint64_t seed) {
    snprintf(dir, size, "/tmp/tp-torchgpt-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    static tp_input_desc_t in[2];
    static tp_zoo_gpt_options_t o = {.layers = 2, .heads = 2, .embed = 32};
    cr_assert_eq(tp_zoo_gpt_inputs(T, in), TP_OK, "%s", tp_last_error());
    tp_model_desc_t md = {in, 2, tp_zoo_find("gpt")->build, opt, &o};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = B;
    cfg.seed = seed;
    cfg.threads = 1;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    char path[512];
    snprintf(path, sizeof path, "%s/w0.safetensors", dir);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    return m;
}

Test(torch_gpt, pytorch_gets_the_same_loss_and_gradients, .timeout = 120) {
    char dir[64];
    tp_model_t *m = s_gpt(dir, sizeof dir, s_adamw, 7);
    int32_t x[B * T], y[B * T];
    tp_rng_t r;
    tp_rng_init(&r, 17, 0);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)(tp_rng_u64(&r) % 256);
        y[i] = (int32_t)(tp_rng_u64(&r) % 256);
    }
    s_write(dir, "x.bin", x, sizeof x);
    s_write(dir, "y.bin", y, sizeof y);
    int64_t s[2] = {B, T};
    tp_tensor_t feeds[2];
    tp_tensor_init_wrap(&feeds[0], TP_INT32, 2, s, x, NULL, NULL);
    tp_tensor_init_wrap(&feeds[1], TP_INT32, 2, s, y, NULL, NULL);
    tp_fetch_t f = {.name = "cost"};
    tp_run_opts_t ro = {.stages = TP_RUN_GRADIENTS};
    cr_assert_eq(tp_model_run(m, 0, feeds, 2, &f, 1, &ro), TP_OK, "%s", tp_last_error());
    s_write(dir, "cost.bin", f.value.data, 4);
    tp_tensor_fini(&f.value);
    /* every gradient, as d<name with '/' -> '.'>.bin */
    int n = tp_model_var_count(m), written = 0;
    for (int i = 0; i < n; i++) {
        const char *name = tp_model_var_name(m, i);
        tp_tensor_t g;
        if (tp_model_grad(m, 0, name, &g) != TP_OK)
            continue;  /* not trainable */
        char file[160];
        snprintf(file, sizeof file, "d%s.bin", name);
        for (char *p = file; *p; p++)
            if (*p == '/')
                *p = '.';
        s_write(dir, file, g.data, g.nbytes);
        tp_tensor_fini(&g);
        written++;
    }
    /* wte, wpe, ln_f (2), and per layer 2 layer norms (4) + 4 linears (8) */
    cr_assert_eq(written, 2 + 2 + 2 * 12, "%d gradients", written);
    tp_model_destroy(&m);
    PU_PYTHON_EXPECT(REF_PY, dir, "pytorch agrees");  /* and removes dir */
}

/* nanoGPT's optimizer as tp-train --model gpt builds it: the biases and
 * the layer norms do not decay. A rate of 5e-3 moves the loss well away
 * from its start within the 20 steps, so a wrong update would show. */
static tp_optimizer_t *s_nanogpt_adamw(void *u) {
    (void)u;
    tp_optimizer_t *o = tp_optimizer_adamw(5e-3, 0.9, 0.95, 1e-8, 0.1);
    static const char *const no_decay[] = {"*/b", "*/gamma", "*/beta"};
    for (int i = 0; o && i < 3; i++)
        if (tp_optimizer_add_decay_mult(o, no_decay[i], 0.0) != TP_OK)
            tp_optimizer_destroy(&o);
    if (o && tp_optimizer_set(o, "clip_norm", 1.0) != TP_OK)
        tp_optimizer_destroy(&o);
    return o;
}

/* STEPS steps of m on STEPS batches of windows of a sentence at random
 * offsets (text, so the loss falls: random bytes would leave it near ln
 * 256), the batches into dir (x20.bin, y20.bin) and the losses before
 * each step's update into dir/name. */
static void s_twenty_steps(const char *dir, tp_model_t *m, const char *name) {
    static const char text[] = "the quick brown fox jumps over the lazy dog. "
                               "pack my box with five dozen liquor jugs. ";
    const int len = (int)sizeof text - 1;
    static int32_t x[STEPS][B * T], y[STEPS][B * T];
    float losses[STEPS];
    tp_rng_t r;
    tp_rng_init(&r, 23, 0);
    for (int s = 0; s < STEPS; s++)
        for (int b = 0; b < B; b++) {
            int off = (int)tp_rng_below(&r, (uint64_t)len);
            for (int t = 0; t < T; t++) {
                x[s][b * T + t] = (unsigned char)text[(off + t) % len];
                y[s][b * T + t] = (unsigned char)text[(off + t + 1) % len];
            }
        }
    s_write(dir, "x20.bin", x, sizeof x);
    s_write(dir, "y20.bin", y, sizeof y);
    int64_t sh[2] = {B, T};
    for (int s = 0; s < STEPS; s++) {
        tp_tensor_t feeds[2];
        tp_tensor_init_wrap(&feeds[0], TP_INT32, 2, sh, x[s], NULL, NULL);
        tp_tensor_init_wrap(&feeds[1], TP_INT32, 2, sh, y[s], NULL, NULL);
        tp_fetch_t f = {.name = "cost"};
        cr_assert_eq(tp_model_run(m, 0, feeds, 2, &f, 1, NULL), TP_OK, "step %d: %s", s,
                     tp_last_error());
        losses[s] = *(const float *)f.value.data;  /* before this step's update */
    }
    s_write(dir, name, losses, sizeof losses);
    cr_assert(losses[STEPS - 1] < losses[0] - 1.0f, "the loss did not fall: %g -> %g",
              losses[0], losses[STEPS - 1]);
}

/* The GPT's 20 steps (s_twenty_steps) into dir/name, then the script's
 * verdict on them (the file's name says which run it replays). */
static void s_twenty_steps_checked(const char *name) {
    char dir[64];
    tp_model_t *m = s_gpt(dir, sizeof dir, s_nanogpt_adamw, 11);
    s_twenty_steps(dir, m, name);
    tp_model_destroy(&m);
    char out[8192];
    int rc = pu_python_check(REF_PY, dir, out, sizeof out);
    if (rc == 77)
        cr_skip_test("%s", out);
    cr_assert(rc == 0 && strstr(out, "pytorch agrees"), "exit %d:\n%s", rc, out);
    cr_log_info("%s", out);
}

Test(torch_gpt, twenty_adamw_steps_follow_pytorchs_loss, .timeout = 120) {
    s_twenty_steps_checked("losses.bin");
}

Test(torch_gpt, twenty_bf16_steps_follow_pytorchs_loss, .timeout = 120) {
    if (!tp_backend_cpu_bf16(1))
        cr_skip_test("this CPU has no bf16 dot products (AVX512_BF16, AMX)");
    s_twenty_steps_checked("losses_bf16.bin");
}
