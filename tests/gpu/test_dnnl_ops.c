/* towerpack tests: the CPU backend's pooling and batch norm on oneDNN
 * (gpu/cpu/dnnl_pool.c, dnnl_bnorm.c) against ops_cpu.c's kernels, the
 * reference the finite-difference and PyTorch parity suites check, through
 * the backend's op entries (a one-thread backend: the one that runs
 * oneDNN): outputs and every gradient, stored and added (dx_acc), many
 * channels; batch norm's moving averages and its inference forward;
 * a geometry oneDNN does not take (ops_cpu.c's, forward and backward);
 * TP_CPU_POOL / TP_CPU_BNORM choosing the path. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/cpu/dnnl_ops.h"
#include "gpu/op_call_testutil.h"

typedef oct_call_t call_t;

/* A call of `kind` on x [xs] (batch norm's gamma, beta [C] after it),
 * inputs and dy from fixed seeds, gradients preset to 1 (so that an added
 * gradient shows); the moving averages at 0.25 and 1.5. */
static void s_call(call_t *t, tp_backend_t *b, tp_op_kind_t kind, tp_shape_t xs,
                   tp_shape_t ys, int acc) {
    const tp_shape_t c = {1, {xs.d[1]}}, in[3] = {xs, c, c};
    oct_call_init(t, kind, "op", kind == TP_OP_BATCH_NORM ? 3 : 1, in, ys, acc, -1.0f, 2.0f);
    if (t->c.ninputs == 3) /* gamma away from 0 */
        oct_fill(t->x[1], (size_t)xs.d[1], 8u, 0.5f, 1.5f);
    for (int i = 0; i < 2; i++) {
        t->state[i] = malloc((size_t)xs.d[1] * sizeof(float));
        oct_set(t->state[i], (size_t)xs.d[1], i ? 1.5f : 0.25f);
        t->c.state[i] = t->state[i];
    }
    (void)b;
}

/* The workspace as planned, then the forward and backward. */
static void s_run(call_t *t, tp_backend_t *b) {
    oct_plan(b, &t->c, &t->ws);
    oct_run(b, &t->c);
}

static void s_free(call_t *t) {
    oct_call_free(t);
}

static void s_close(const float *a, const float *b, size_t n, float tol, const char *what) {
    oct_close(a, b, n, tol, what);
}

/* The same call on each path (env = "dnnl" and "own"), compared. */
static void s_compare(const char *env, tp_op_kind_t kind, const tp_op_attr_t *attr,
                      tp_shape_t xs, tp_shape_t ys, int acc, float tol) {
    tp_backend_t *b = oct_backend();
    call_t t[2];
    for (int p = 0; p < 2; p++) {
        setenv(env, p ? "own" : "dnnl", 1);
        s_call(&t[p], b, kind, xs, ys, acc);
        t[p].attr = *attr;
        s_run(&t[p], b);
    }
    s_close(t[0].y, t[1].y, tp_shape_count(&ys), tol, "y");
    for (int i = 0; i < t[0].c.ninputs; i++)
        s_close(t[0].dx[i], t[1].dx[i], tp_shape_count(&t[0].xs[i]), tol, "dx");
    for (int i = 0; i < 2 && kind == TP_OP_BATCH_NORM; i++)
        s_close(t[0].state[i], t[1].state[i], (size_t)xs.d[1], tol, "moving average");
    s_free(&t[0]);
    s_free(&t[1]);
    unsetenv(env);
    tp_backend_destroy(&b);
}

static tp_shape_t s_pool_out(tp_shape_t x, int k, int s, int p) {
    return (tp_shape_t){4, {x.d[0], x.d[1], (x.d[2] + 2 * p - k) / s + 1,
                            (x.d[3] + 2 * p - k) / s + 1}};
}

Test(dnnl_ops, pooling_matches_the_own_kernels_stored_and_added) {
    const struct { tp_op_kind_t kind; int k, s, p, h, w; } g[] = {
        {TP_OP_MAX_POOL, 2, 2, 0, 12, 10}, {TP_OP_MAX_POOL, 3, 2, 1, 11, 9},
        {TP_OP_MAX_POOL, 3, 1, 1, 7, 8},   {TP_OP_AVG_POOL, 2, 2, 0, 12, 10},
        {TP_OP_AVG_POOL, 3, 2, 1, 11, 9},  {TP_OP_AVG_POOL, 3, 1, 1, 7, 8},
        {TP_OP_MAX_POOL, 2, 2, 0, 5, 7},   /* a stride skips the last row: own */
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        for (int acc = 0; acc < 2; acc++) {
            tp_op_attr_t a = {0};
            a.kh = a.kw = g[i].k;
            a.sh = a.sw = g[i].s;
            a.ph = a.pw = g[i].p;
            tp_shape_t xs = {4, {3, 20, g[i].h, g[i].w}};
            s_compare("TP_CPU_POOL", g[i].kind, &a, xs, s_pool_out(xs, g[i].k, g[i].s, g[i].p),
                      acc, 1e-6f);
        }
}

/* A batch norm's attributes in the tests' three modes: 0 training,
 * updating the moving averages; 1 training, not updating them; 2
 * inference. */
static tp_op_attr_t s_bnorm_attr(int mode) {
    tp_op_attr_t a = {0};
    a.eps = 1e-5f;
    a.alpha = 0.9f;
    a.training = mode < 2;
    a.update_state = mode == 0;
    return a;
}

/* Two batch norm calls, got against want: y, with `grads` dx, dgamma and
 * dbeta, and the moving averages, within 2e-5. */
static void s_close_bnorm(const call_t *got, const call_t *want, int grads) {
    const size_t nx = tp_shape_count(&got->xs[0]), c = (size_t)got->xs[0].d[1];
    s_close(got->y, want->y, nx, 2e-5f, "y");
    if (grads) {
        s_close(got->dx[0], want->dx[0], nx, 2e-5f, "dx");
        s_close(got->dx[1], want->dx[1], c, 2e-5f, "dgamma");
        s_close(got->dx[2], want->dx[2], c, 2e-5f, "dbeta");
    }
    for (int i = 0; i < 2; i++)
        s_close(got->state[i], want->state[i], c, 2e-5f, "moving average");
}

Test(dnnl_ops, batch_norm_matches_the_own_kernels) {
    const tp_shape_t shapes[] = {{4, {4, 24, 7, 9}}, {2, {16, 40}}, {3, {3, 8, 11}}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int mode = 0; mode < 3; mode++) {
            const tp_op_attr_t a = s_bnorm_attr(mode); /* 2: the moving averages */
            s_compare("TP_CPU_BNORM", TP_OP_BATCH_NORM, &a, shapes[i], shapes[i], mode == 1,
                      2e-5f);
        }
}

/* A workspace the plan did not size (a backend that borrows the CPU's op
 * table plans without oneDNN): oneDNN's pooling still runs, on room of
 * its own, the max's backward running the forward again for its argmax;
 * the same numbers as a planned call. */
Test(dnnl_ops, pooling_without_its_planned_workspace_gives_the_same_numbers) {
    setenv("TP_CPU_POOL", "dnnl", 1);
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    for (int k = 0; k < 2; k++) {
        const tp_op_kind_t kind = k ? TP_OP_AVG_POOL : TP_OP_MAX_POOL;
        tp_shape_t xs = {4, {2, 16, 9, 11}}, ys = s_pool_out(xs, 3, 2, 1);
        call_t t[2];
        for (int p = 0; p < 2; p++) {
            s_call(&t[p], b, kind, xs, ys, 0);
            t[p].attr.kh = t[p].attr.kw = 3;
            t[p].attr.sh = t[p].attr.sw = 2;
            t[p].attr.ph = t[p].attr.pw = 1;
        }
        s_run(&t[0], b);
        /* no workspace at all: as if planned for a kernel that needs none */
        cr_assert_eq(b->ops->op_forward(b, NULL, &t[1].c), TP_OK, "%s", tp_last_error());
        cr_assert_eq(b->ops->op_backward(b, NULL, &t[1].c), TP_OK, "%s", tp_last_error());
        cr_expect_eq(memcmp(t[0].y, t[1].y, tp_shape_count(&ys) * sizeof(float)), 0);
        cr_expect_eq(memcmp(t[0].dx[0], t[1].dx[0], tp_shape_count(&xs) * sizeof(float)), 0);
        s_free(&t[0]);
        s_free(&t[1]);
    }
    tp_backend_destroy(&b);
    unsetenv("TP_CPU_POOL");
}

/* Which path runs: oneDNN's max pooling keeps its argmax in a workspace of
 * its own layout, so the planned bytes differ from ops_cpu.c's int32 per
 * output; the default runs ops_cpu.c's 2x2 stride 2 max pooling and
 * oneDNN's 3x3, and ops_cpu.c's batch norm. */
Test(dnnl_ops, the_environment_and_the_default_choose_the_path) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    call_t t;
    tp_shape_t xs = {4, {8, 32, 16, 16}};
    tp_op_attr_t a = {0};
    a.kh = a.kw = a.sh = a.sw = 2;
    s_call(&t, b, TP_OP_MAX_POOL, xs, s_pool_out(xs, 2, 2, 0), 0);
    t.attr = a;
    const size_t own = tp_shape_count(&t.ys) * sizeof(int32_t);
    unsetenv("TP_CPU_POOL");
    cr_expect_eq(b->ops->op_workspace(b, &t.c), own);
    setenv("TP_CPU_POOL", "dnnl", 1);
    cr_expect_neq(b->ops->op_workspace(b, &t.c), own);
    setenv("TP_CPU_POOL", "own", 1);
    cr_expect_eq(b->ops->op_workspace(b, &t.c), own);
    unsetenv("TP_CPU_POOL");
    t.attr.kh = t.attr.kw = 3;
    t.attr.ph = t.attr.pw = 1;
    t.ys = t.c.yshape = s_pool_out(xs, 3, 2, 1);
    cr_expect_neq(b->ops->op_workspace(b, &t.c), tp_shape_count(&t.ys) * sizeof(int32_t));
    s_free(&t);
    s_call(&t, b, TP_OP_BATCH_NORM, xs, xs, 0);
    t.attr.training = 1;
    t.attr.eps = 1e-5f;
    cr_expect_eq(b->ops->op_workspace(b, &t.c), 2 * 32 * sizeof(float));
    setenv("TP_CPU_BNORM", "dnnl", 1);
    cr_expect_gt(b->ops->op_workspace(b, &t.c), 2 * 32 * sizeof(float));
    unsetenv("TP_CPU_BNORM");
    s_free(&t);
    tp_backend_destroy(&b);
}

/* ---- batch norm on nChw16c (tp_op_call_t.blk16: gpu/graph/fold.c keeps
 * a conv -> batch norm -> conv chain blocked) -------------------------------- */

/* The blocked call (x, y, dy, dx nChw16c) against oneDNN's plain one
 * (TP_CPU_BNORM=dnnl): y, the three gradients stored and added, the
 * moving averages, and the inference forward; oneDNN's blocked kernel sums
 * in another order, so within 2e-5, as the own kernels' test. Even with
 * TP_CPU_BNORM=own a blocked call is oneDNN's (ops_cpu.c reads NCHW). */
Test(dnnl_ops, batch_norm_on_nchw16c_matches_the_plain_call) {
    const tp_shape_t xs = {4, {4, 32, 7, 9}};
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b, "%s", tp_last_error());
    for (int mode = 0; mode < 3; mode++) {
        const tp_op_attr_t a = s_bnorm_attr(mode); /* 2: forward only */
        call_t t[2];
        for (int p = 0; p < 2; p++) {
            setenv("TP_CPU_BNORM", p ? "own" : "dnnl", 1);
            s_call(&t[p], b, TP_OP_BATCH_NORM, xs, xs, mode == 1);
            t[p].attr = a;
            if (p) {
                oct_16(t[p].x[0], &xs, 0);
                oct_16(t[p].dy, &xs, 0);
                t[p].c.blk16 = 1u | TP_BLK16_Y;
            }
            t[p].c.workspace_bytes = b->ops->op_workspace(b, &t[p].c);
            t[p].ws = calloc(1, t[p].c.workspace_bytes + 64);
            t[p].c.workspace = t[p].ws;
            cr_assert_eq(b->ops->op_forward(b, NULL, &t[p].c), TP_OK, "%s", tp_last_error());
            if (mode < 2)
                cr_assert_eq(b->ops->op_backward(b, NULL, &t[p].c), TP_OK, "%s",
                             tp_last_error());
            else /* an inference-mode backward is ops_cpu.c's: refused by name */
                cr_assert_eq(b->ops->op_backward(b, NULL, &t[p].c),
                             p ? TP_ERR_UNSUPPORTED : TP_OK);
        }
        oct_16(t[1].y, &xs, 1);
        if (mode < 2)
            oct_16(t[1].dx[0], &xs, 1);
        s_close_bnorm(&t[1], &t[0], mode < 2);
        s_free(&t[0]);
        s_free(&t[1]);
    }
    unsetenv("TP_CPU_BNORM");
    tp_backend_destroy(&b);
}

/* Pooling on nChw16c (the max pool after ResNet-18's stem, inside its
 * chain): the blocked call against oneDNN's plain one (TP_CPU_POOL=dnnl),
 * max (the same maxima) and average, stored and added; oneDNN runs a
 * blocked call even with TP_CPU_POOL=own (ops_cpu.c reads NCHW). */
Test(dnnl_ops, pooling_on_nchw16c_matches_the_plain_call) {
    const struct { tp_op_kind_t kind; int k, s, p; } g[] = {
        {TP_OP_MAX_POOL, 3, 2, 1}, {TP_OP_MAX_POOL, 2, 2, 0}, {TP_OP_AVG_POOL, 3, 1, 1}};
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b, "%s", tp_last_error());
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        for (int acc = 0; acc < 2; acc++) {
            tp_op_attr_t a = {0};
            a.kh = a.kw = g[i].k;
            a.sh = a.sw = g[i].s;
            a.ph = a.pw = g[i].p;
            const tp_shape_t xs = {4, {3, 32, 12, 10}}, ys = s_pool_out(xs, g[i].k, g[i].s, g[i].p);
            call_t t[2];
            for (int p = 0; p < 2; p++) {
                setenv("TP_CPU_POOL", p ? "own" : "dnnl", 1);
                s_call(&t[p], b, g[i].kind, xs, ys, acc);
                t[p].attr = a;
                if (p) {
                    oct_16(t[p].x[0], &xs, 0);
                    oct_16(t[p].dy, &ys, 0);
                    t[p].c.blk16 = 1u | TP_BLK16_Y;
                }
                s_run(&t[p], b);
            }
            oct_16(t[1].y, &ys, 1);
            oct_16(t[1].dx[0], &xs, 1);
            s_close(t[1].y, t[0].y, tp_shape_count(&ys), 1e-6f, "y");
            s_close(t[1].dx[0], t[0].dx[0], tp_shape_count(&xs), 1e-6f, "dx");
            s_free(&t[0]);
            s_free(&t[1]);
        }
    /* a stride that skips the last row: ops_cpu.c's, so refused by name
     * (gpu/graph/fold.c keeps such a pool NCHW) */
    tp_op_attr_t a = {0};
    a.kh = a.kw = a.sh = a.sw = 2;
    const tp_shape_t xs = {4, {3, 32, 11, 9}}, ys = s_pool_out(xs, 2, 2, 0);
    call_t t;
    s_call(&t, b, TP_OP_MAX_POOL, xs, ys, 0);
    t.attr = a;
    t.c.blk16 = 1u | TP_BLK16_Y;
    cr_assert_eq(b->ops->op_forward(b, NULL, &t.c), TP_ERR_UNSUPPORTED);
    cr_assert(strstr(tp_last_error(), "nChw16c"), "%s", tp_last_error());
    s_free(&t);
    unsetenv("TP_CPU_POOL");
    tp_backend_destroy(&b);
}

/* ---- batch norm with a folded relu (attr.act: fold.c folds a relu after a
 * batch norm into it): oneDNN runs the relu in its own passes
 * (dnnl_fuse_norm_relu, its mask in the workspace) -------------------------- */

/* The fused call (TP_CPU_BNORM=dnnl; plain and nChw16c) against ops_cpu.c's
 * batch norm followed by its relu passes (TP_CPU_BNORM=own): y, the three
 * gradients stored and added, the moving averages, the inference forward;
 * half of the normalised values fall below 0, so the mask shows. */
Test(dnnl_ops, batch_norm_with_a_folded_relu_matches_the_own_kernels) {
    const tp_shape_t xs = {4, {4, 32, 7, 9}};
    const size_t nx = tp_shape_count(&xs);
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b, "%s", tp_last_error());
    for (int blk = 0; blk < 2; blk++)
        for (int mode = 0; mode < 3; mode++) {
            tp_op_attr_t a = s_bnorm_attr(mode); /* 2: the backward is ops_cpu.c's */
            a.act = TP_ACT_RELU;
            if (blk && mode == 2)
                continue; /* an inference-mode backward on nChw16c is refused */
            call_t t[2];
            for (int p = 0; p < 2; p++) {
                setenv("TP_CPU_BNORM", p ? "own" : "dnnl", 1);
                s_call(&t[p], b, TP_OP_BATCH_NORM, xs, xs, mode == 1);
                t[p].attr = a;
                if (blk && !p) {
                    oct_16(t[p].x[0], &xs, 0);
                    oct_16(t[p].dy, &xs, 0);
                    t[p].c.blk16 = 1u | TP_BLK16_Y;
                }
                s_run(&t[p], b);
                if (blk && !p) {
                    oct_16(t[p].y, &xs, 1);
                    oct_16(t[p].dx[0], &xs, 1);
                }
            }
            size_t zeros = 0;
            for (size_t i = 0; i < nx; i++)
                zeros += t[1].y[i] == 0.0f;
            cr_assert(zeros > nx / 4 && zeros < 3 * nx / 4, "%zu of %zu clamped", zeros, nx);
            s_close_bnorm(&t[0], &t[1], 1);
            s_free(&t[0]);
            s_free(&t[1]);
        }
    unsetenv("TP_CPU_BNORM");
    tp_backend_destroy(&b);
}

/* The relu is oneDNN's: a training call's backward on the relu's own dy
 * runs the fused primitive (*done 1) and gives what the caller's mask then
 * the plain backward gives; with TP_CPU_BNORM_RELU=0 it declines (*done 0)
 * and the forward clamps y in a pass of its own, the same y. */
Test(dnnl_ops, batch_norm_fuses_a_folded_relu_unless_told_not_to) {
    const tp_shape_t xs = {4, {4, 32, 7, 9}};
    const size_t nx = tp_shape_count(&xs);
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b, "%s", tp_last_error());
    setenv("TP_CPU_BNORM", "dnnl", 1);
    call_t t[2];
    for (int off = 0; off < 2; off++) {
        if (off)
            setenv("TP_CPU_BNORM_RELU", "0", 1);
        s_call(&t[off], b, TP_OP_BATCH_NORM, xs, xs, 0);
        t[off].attr.eps = 1e-5f;
        t[off].attr.alpha = 0.9f;
        t[off].attr.training = 1;
        t[off].attr.act = TP_ACT_RELU;
        oct_plan(b, &t[off].c, &t[off].ws);
        oct_forward(b, &t[off].c);
        const tp_op_call_t raw = tp_act_inner(&t[off].c, NULL);
        int done = -1;
        cr_assert_eq(tp_dnnl_bnorm_backward_relu(&raw, &done), TP_OK, "%s", tp_last_error());
        cr_assert_eq(done, !off, "fused %d with TP_CPU_BNORM_RELU %s", done, off ? "0" : "unset");
    }
    s_close(t[0].y, t[1].y, nx, 0.0f, "y");
    /* the fused backward's dx against the mask then the plain backward's */
    oct_backward(b, &t[1].c);
    s_close(t[0].dx[0], t[1].dx[0], nx, 1e-6f, "dx");
    s_close(t[0].dx[1], t[1].dx[1], 32, 1e-6f, "dgamma");
    unsetenv("TP_CPU_BNORM_RELU");
    unsetenv("TP_CPU_BNORM");
    s_free(&t[0]);
    s_free(&t[1]);
    tp_backend_destroy(&b);
}
