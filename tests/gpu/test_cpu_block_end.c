/* towerpack tests: the ResNet block end in one call on the CPU backend
 * (gpu/cpu/cpu_block_end.c): a batch norm call that carries a skip
 * (tp_op_call_t.skip, with or without its folded relu) against the
 * unfused calls it replaces: ops_cpu.c's batch norm, then the add and the
 * relu (computed here), and backward the relu's mask, the add's copy of
 * dy to the skip, and batch norm's backward on the masked dy. NCHW and
 * nChw16c, gradients stored and added, training (the moving averages
 * too) and the inference forward; within float reassociation (2e-5, the
 * bound the batch norm suites use between oneDNN's and ops_cpu.c's); the
 * same bits on one thread and two, and with streamed stores and plain. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/cpu/cpu_block_end.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/op_call_testutil.h"

typedef struct {
    oct_call_t t;
    float *skip, *dskip; /* [xs] */
} s_case_t;

/* A batch norm call on x [xs] (gamma in [0.5, 1.5), the moving averages
 * at 0.25 and 1.5), the skip from its own seed, its gradient preset to 1
 * (an added one shows). */
static void s_init(s_case_t *k, tp_shape_t xs, const tp_op_attr_t *a, int acc) {
    const tp_shape_t c = {1, {xs.d[1]}}, in[3] = {xs, c, c};
    const size_t nx = tp_shape_count(&xs), ch = (size_t)xs.d[1];
    oct_call_init(&k->t, TP_OP_BATCH_NORM, "blk/bn2", 3, in, xs, acc, -1.0f, 2.0f);
    oct_fill(k->t.x[1], ch, 8u, 0.5f, 1.5f);
    k->t.attr = *a;
    for (int i = 0; i < 2; i++) {
        k->t.state[i] = malloc(ch * sizeof(float));
        oct_set(k->t.state[i], ch, i ? 1.5f : 0.25f);
        k->t.c.state[i] = k->t.state[i];
    }
    k->skip = malloc(nx * sizeof(float));
    k->dskip = malloc(nx * sizeof(float));
    cr_assert(k->skip && k->dskip);
    oct_fill(k->skip, nx, 5u, -1.5f, 1.0f);
    oct_set(k->dskip, nx, 1.0f);
}

static void s_free(s_case_t *k) {
    free(k->skip);
    free(k->dskip);
    oct_call_free(&k->t);
}

/* The unfused reference: ops_cpu.c's batch norm, y = act(bn + skip); the
 * backward's dy masked, copied to the skip, batch norm's on it. */
static void s_reference(tp_backend_t *b, s_case_t *r, int relu, int backward) {
    const size_t n = tp_shape_count(&r->t.ys);
    oct_plan(b, &r->t.c, &r->t.ws);
    oct_forward(b, &r->t.c);
    for (size_t i = 0; i < n; i++) {
        const float v = r->t.y[i] + r->skip[i];
        r->t.y[i] = relu && v <= 0.0f ? 0.0f : v;
    }
    if (!backward)
        return;
    for (size_t i = 0; i < n; i++) {
        const float g = relu && !(r->t.y[i] > 0.0f) ? 0.0f : r->t.dy[i];
        r->t.dy[i] = g;
        r->dskip[i] = r->t.acc[0] ? r->dskip[i] + g : g;
    }
    oct_backward(b, &r->t.c);
}

/* The fused call on the same numbers, in nChw16c when blk. */
static void s_fused(tp_backend_t *b, s_case_t *f, int relu, int backward, int blk) {
    const tp_shape_t *xs = &f->t.xs[0];
    if (blk) {
        oct_16(f->t.x[0], xs, 0);
        oct_16(f->t.dy, xs, 0);
        oct_16(f->skip, xs, 0);
        f->t.c.blk16 = 1u | TP_BLK16_Y;
    }
    f->t.attr.act = relu ? TP_ACT_RELU : TP_ACT_NONE;
    f->t.c.skip = f->skip;
    f->t.c.dskip = f->dskip;
    f->t.c.dskip_acc = f->t.acc[0];
    oct_plan(b, &f->t.c, &f->t.ws);
    cr_expect_eq(f->t.c.workspace_bytes, 2 * (size_t)xs->d[1] * sizeof(float));
    oct_forward(b, &f->t.c);
    if (backward)
        oct_backward(b, &f->t.c);
    if (blk) {
        oct_16(f->t.y, xs, 1);
        oct_16(f->t.dx[0], xs, 1);
        oct_16(f->dskip, xs, 1);
    }
}

static void s_compare(tp_shape_t xs, int blk) {
    tp_backend_t *b = oct_backend();
    const size_t nx = tp_shape_count(&xs), ch = (size_t)xs.d[1];
    unsetenv("TP_CPU_BNORM"); /* the reference is ops_cpu.c's batch norm */
    for (int mode = 0; mode < 3; mode++)
        for (int relu = 0; relu < 2; relu++) {
            tp_op_attr_t a = {0};
            a.eps = 1e-5f;
            a.alpha = 0.9f;
            a.training = mode < 2; /* 2: inference, forward only */
            a.update_state = mode == 0;
            const int acc = mode == 1, bwd = mode < 2;
            s_case_t r, f;
            s_init(&r, xs, &a, acc);
            s_init(&f, xs, &a, acc);
            s_reference(b, &r, relu, bwd);
            s_fused(b, &f, relu, bwd, blk);
            cr_log_info("blk %d mode %d relu %d", blk, mode, relu);
            oct_close(f.t.y, r.t.y, nx, 2e-5f, "y");
            if (bwd) {
                oct_close(f.dskip, r.dskip, nx, 0.0f, "dskip"); /* the same mask, exactly */
                oct_close(f.t.dx[0], r.t.dx[0], nx, 2e-5f, "dx");
                oct_close(f.t.dx[1], r.t.dx[1], ch, 2e-5f, "dgamma");
                oct_close(f.t.dx[2], r.t.dx[2], ch, 2e-5f, "dbeta");
            }
            for (int i = 0; i < 2; i++)
                oct_close(f.t.state[i], r.t.state[i], ch, 2e-5f, "moving average");
            s_free(&r);
            s_free(&f);
        }
    tp_backend_destroy(&b);
}

Test(cpu_block_end, nchw_matches_batch_norm_add_relu) {
    s_compare((tp_shape_t){4, {4, 32, 7, 9}}, 0);
    s_compare((tp_shape_t){4, {3, 5, 4, 1}}, 0); /* channels no multiple of 16 */
    s_compare((tp_shape_t){4, {4, 32, 28, 28}}, 0);
}

Test(cpu_block_end, nchw16c_matches_batch_norm_add_relu) {
    s_compare((tp_shape_t){4, {4, 32, 7, 9}}, 1);
    s_compare((tp_shape_t){4, {2, 48, 3, 3}}, 1);
    s_compare((tp_shape_t){4, {4, 32, 28, 28}}, 1);
}

/* A training step's batch norm: eps 1e-5, momentum 0.9, its running
 * statistics updated */
static tp_op_attr_t s_training_attr(void) {
    tp_op_attr_t a = {0};
    a.eps = 1e-5f;
    a.alpha = 0.9f;
    a.training = 1;
    a.update_state = 1;
    return a;
}

/* Each channel group's sums are one thread's: two threads give the bits
 * of one. */
Test(cpu_block_end, two_threads_give_the_bits_of_one) {
    tp_backend_t *b = oct_backend();
    const tp_shape_t xs = {4, {4, 64, 5, 5}};
    const size_t nx = tp_shape_count(&xs);
    for (int blk = 0; blk < 2; blk++) {
        tp_op_attr_t a = s_training_attr();
        s_case_t k[2];
        for (int p = 0; p < 2; p++) {
            tp_cpu_pool_threads_override(p ? 2 : 1);
            s_init(&k[p], xs, &a, 0);
            s_fused(b, &k[p], 1, 1, blk);
        }
        tp_cpu_pool_threads_override(0);
        cr_expect_eq(memcmp(k[0].t.y, k[1].t.y, nx * sizeof(float)), 0, "y");
        cr_expect_eq(memcmp(k[0].t.dx[0], k[1].t.dx[0], nx * sizeof(float)), 0, "dx");
        cr_expect_eq(memcmp(k[0].t.dx[1], k[1].t.dx[1], 64 * sizeof(float)), 0, "dgamma");
        s_free(&k[0]);
        s_free(&k[1]);
    }
    tp_backend_destroy(&b);
}

/* k's y and dx on 64-byte lines, as a model's arena has them (malloc's
 * large blocks start 16 bytes into a page) */
static void s_align(s_case_t *k) {
    const size_t bytes = tp_shape_count(&k->t.xs[0]) * sizeof(float);
    float **v[2] = {&k->t.y, &k->t.dx[0]};
    for (int i = 0; i < 2; i++) {
        float *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        cr_assert_not_null(p);
        memcpy(p, *v[i], bytes);
        free(*v[i]);
        *v[i] = p;
    }
    k->t.c.y = k->t.y;
}

/* Streaming stores: a blocked call of 2 MiB or more streams its y and
 * its stored dx, and gives the bits of the plain stores
 * (TP_CPU_BLOCK_END_STREAM=0); a smaller, plain, unaligned or added
 * output is not streamed. */
Test(cpu_block_end, large_outputs_are_streamed_with_the_same_bits) {
    tp_backend_t *b = oct_backend();
    const tp_shape_t xs = {4, {24, 32, 28, 28}}; /* 2.4 MB */
    const size_t nx = tp_shape_count(&xs);
    tp_op_attr_t a = s_training_attr();
    s_case_t k[2];
    for (int p = 0; p < 2; p++) {
        if (p)
            setenv("TP_CPU_BLOCK_END_STREAM", "0", 1);
        s_init(&k[p], xs, &a, 0);
        s_align(&k[p]);
        s_fused(b, &k[p], 1, 1, 1);
        unsetenv("TP_CPU_BLOCK_END_STREAM");
    }
    const tp_op_call_t *c = &k[0].t.c;
    if (__builtin_cpu_supports("avx512f")) {
        cr_expect(tp_cpu_block_end_streams(c, k[0].t.y, 0), "y streamed");
        cr_expect(tp_cpu_block_end_streams(c, k[0].t.dx[0], 0), "dx streamed");
    }
    cr_expect(!tp_cpu_block_end_streams(c, k[0].t.dx[0], 1), "an added dx is not");
    cr_expect(!tp_cpu_block_end_streams(c, k[0].t.y + 1, 0), "nor an unaligned y");
    setenv("TP_CPU_BLOCK_END_STREAM", "0", 1);
    cr_expect(!tp_cpu_block_end_streams(c, k[0].t.y, 0), "nor with the switch off");
    unsetenv("TP_CPU_BLOCK_END_STREAM");
    tp_op_call_t small = *c;
    tp_shape_t eight = xs;
    eight.d[0] = 8; /* 0.8 MB */
    small.xshape = &eight;
    cr_expect(!tp_cpu_block_end_streams(&small, k[0].t.y, 0), "nor a small y");
    small = *c;
    small.blk16 = 0;
    cr_expect(!tp_cpu_block_end_streams(&small, k[0].t.y, 0), "nor a plain one");
    cr_expect_eq(memcmp(k[0].t.y, k[1].t.y, nx * sizeof(float)), 0, "y");
    cr_expect_eq(memcmp(k[0].t.dx[0], k[1].t.dx[0], nx * sizeof(float)), 0, "dx");
    cr_expect_eq(memcmp(k[0].dskip, k[1].dskip, nx * sizeof(float)), 0, "dskip");
    cr_expect_eq(memcmp(k[0].t.dx[1], k[1].t.dx[1], 32 * sizeof(float)), 0, "dgamma");
    s_free(&k[0]);
    s_free(&k[1]);
    tp_backend_destroy(&b);
}

/* A call the kernel does not take is refused by name, not run. */
Test(cpu_block_end, a_layout_mix_is_refused) {
    tp_backend_t *b = oct_backend();
    const tp_shape_t xs = {4, {2, 32, 3, 3}};
    tp_op_attr_t a = {0};
    a.eps = 1e-5f;
    a.training = 1;
    s_case_t k;
    s_init(&k, xs, &a, 0);
    k.t.c.skip = k.skip;
    k.t.c.blk16 = TP_BLK16_Y; /* y blocked, x plain */
    oct_plan(b, &k.t.c, &k.t.ws);
    cr_expect_eq(b->ops->op_forward(b, NULL, &k.t.c), TP_ERR_UNSUPPORTED);
    cr_expect(strstr(tp_last_error(), "blk/bn2") && strstr(tp_last_error(), "TP_CPU_BLOCK_END=0"),
              "%s", tp_last_error());
    s_free(&k);
    tp_backend_destroy(&b);
}
