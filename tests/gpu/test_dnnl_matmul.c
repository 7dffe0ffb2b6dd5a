/* towerpack tests: the dense layer's matmul on oneDNN (gpu/cpu/dnnl_matmul.c)
 * against ops_cpu.c's OpenBLAS path, the reference the finite-difference
 * and PyTorch step suites check, through the backend's op entries (a
 * one-thread backend: the one that runs oneDNN): the output with a folded
 * bias and relu, dW and dX stored and added (dx_acc), a flattened [N,A,B]
 * input, the first layer's call without dX; calls that allocate nothing
 * once a geometry ran; two threads (two towers) running the same cached
 * primitives at once; TP_CPU_MATMUL choosing the path. */
#include <criterion/criterion.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/op_call_testutil.h"

TestSuite(dnnl_matmul, .timeout = 60);

typedef oct_call_t call_t;

/* x [xs] @ W [K, m] (+ b) (relu); gradients preset to 1 (an added one
 * shows), dX absent when !want_dx; the workspace as the backend plans. */
static void s_call(call_t *t, tp_backend_t *b, tp_shape_t xs, int m, int bias, int relu,
                   int acc, int want_dx) {
    const int64_t k = (int64_t)(tp_shape_count(&xs) / (size_t)xs.d[0]);
    const tp_shape_t in[2] = {xs, {2, {k, m}}};
    oct_call_init(t, TP_OP_MATMUL, "fc/matmul", 2, in, (tp_shape_t){2, {xs.d[0], m}}, acc,
                  -1.0f, 1.0f);
    t->b = malloc((size_t)m * sizeof(float));
    t->db = malloc((size_t)m * sizeof(float));
    oct_fill(t->b, (size_t)m, 5u, -0.5f, 0.5f);
    t->attr.act = relu ? TP_ACT_RELU : TP_ACT_NONE;
    if (bias) {
        t->c.bias = t->b;
        t->c.dbias = t->db;
    }
    if (!want_dx) {
        free(t->dx[0]);
        t->dx[0] = NULL;
    }
    oct_plan(b, &t->c, &t->ws);
}

static void s_run(call_t *t, tp_backend_t *b) {
    oct_run(b, &t->c);
}

static void s_free(call_t *t) {
    oct_call_free(t);
}

/* sums of up to 784 products of [-1, 1] values, added in other orders,
 * differ by ~1e-5 where they cancel: 1e-4 of 1 + |b| */
static void s_close(const float *a, const float *b, size_t n, float tol, const char *what) {
    oct_close(a, b, n, tol, what);
}

Test(dnnl_matmul, matches_openblas_with_bias_relu_stored_and_added) {
    const struct { tp_shape_t xs; int m; } g[] = {
        {{2, {64, 784}}, 512}, /* the MLP's layers, a tower's batch */
        {{2, {64, 512}}, 256},
        {{2, {64, 256}}, 10},
        {{2, {7, 13}}, 5},     /* odd sizes */
        {{3, {5, 3, 4}}, 9},   /* [N,A,B] flattened to [N,12] */
    };
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b, "%s", tp_last_error());
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        for (int v = 0; v < 8; v++) {
            const int bias = v & 1, relu = (v >> 1) & 1, acc = (v >> 2) & 1;
            call_t t[2];
            for (int p = 0; p < 2; p++) {
                setenv("TP_CPU_MATMUL", p ? "own" : "dnnl", 1);
                s_call(&t[p], b, g[i].xs, g[i].m, bias, relu, acc, 1);
                s_run(&t[p], b);
            }
            s_close(t[0].y, t[1].y, tp_shape_count(&t[0].ys), 1e-4f, "y");
            for (int j = 0; j < 2; j++)
                s_close(t[0].dx[j], t[1].dx[j], tp_shape_count(&t[0].xs[j]), 1e-4f, "dx");
            if (bias)
                s_close(t[0].db, t[1].db, (size_t)g[i].m, 1e-4f, "dbias");
            s_free(&t[0]);
            s_free(&t[1]);
        }
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&b);
}

/* The first layer's matmul: no gradient for the data, dX NULL; dW as
 * OpenBLAS's. */
Test(dnnl_matmul, a_call_without_dx_writes_dw_only) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    call_t t[2];
    for (int p = 0; p < 2; p++) {
        setenv("TP_CPU_MATMUL", p ? "own" : "dnnl", 1);
        s_call(&t[p], b, (tp_shape_t){2, {32, 100}}, 48, 1, 1, 0, 0);
        s_run(&t[p], b);
    }
    s_close(t[0].dx[1], t[1].dx[1], 100 * 48, 1e-4f, "dW");
    s_free(&t[0]);
    s_free(&t[1]);
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&b);
}

/* What a step does on oneDNN allocates nothing once the geometry ran (the
 * primitives cached, the thread's memory objects pointed at each call's
 * buffers): the heap's bytes in use are the same after many calls. */
Test(dnnl_matmul, calls_after_the_first_allocate_nothing) {
    setenv("TP_CPU_MATMUL", "dnnl", 1);
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    call_t t;
    s_call(&t, b, (tp_shape_t){2, {16, 40}}, 24, 1, 1, 1, 1);
    s_run(&t, b);
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < 50; i++)
        s_run(&t, b);
    struct mallinfo2 after = mallinfo2();
    cr_expect_eq(before.uordblks, after.uordblks, "%zu bytes before, %zu after",
                 before.uordblks, after.uordblks);
    s_free(&t);
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&b);
}

/* Which path runs: the two paths sum in different orders, so a 784-long
 * dot product differs in its last bits between them; the same path twice
 * is bit for bit the same. */
Test(dnnl_matmul, the_environment_chooses_the_path) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    const char *paths[3] = {"dnnl", "own", NULL}; /* NULL: unset, the default */
    call_t t[3];
    for (int p = 0; p < 3; p++) {
        if (paths[p])
            setenv("TP_CPU_MATMUL", paths[p], 1);
        else
            unsetenv("TP_CPU_MATMUL");
        s_call(&t[p], b, (tp_shape_t){2, {64, 784}}, 512, 0, 0, 0, 1);
        s_run(&t[p], b);
    }
    const size_t n = 64 * 512 * sizeof(float);
    cr_expect_neq(memcmp(t[0].y, t[1].y, n), 0, "oneDNN's and OpenBLAS's sums agree bit "
                  "for bit: one path ran twice");
    cr_expect_eq(memcmp(t[0].y, t[2].y, n), 0, "the default is not oneDNN's");
    for (int p = 0; p < 3; p++)
        s_free(&t[p]);
    tp_backend_destroy(&b);
}

/* Two towers run the same cached primitives at once, each on its own
 * buffers and scratchpad (the op's workspace): each gets, 30 times over,
 * bit for bit what one thread alone got. */
typedef struct {
    call_t t;
    const call_t *ref;
    int bad;
} tower_t;

static void *s_tower(void *arg) {
    tower_t *w = arg;
    tp_backend_t *b = tp_backend_cpu_new(1);
    if (!b) {
        w->bad = -1;
        return NULL;
    }
    const size_t ny = tp_shape_count(&w->t.ys), nw = tp_shape_count(&w->t.xs[1]);
    const size_t nx = tp_shape_count(&w->t.xs[0]);
    for (int i = 0; i < 30; i++) {
        if (b->ops->op_forward(b, NULL, &w->t.c) != TP_OK ||
            b->ops->op_backward(b, NULL, &w->t.c) != TP_OK) {
            w->bad = -1;
            break;
        }
        w->bad += memcmp(w->t.y, w->ref->y, ny * sizeof(float)) != 0;
        w->bad += memcmp(w->t.dx[1], w->ref->dx[1], nw * sizeof(float)) != 0;
        w->bad += memcmp(w->t.dx[0], w->ref->dx[0], nx * sizeof(float)) != 0;
    }
    tp_backend_destroy(&b);
    return NULL;
}

Test(dnnl_matmul, two_towers_share_the_cached_primitives) {
    setenv("TP_CPU_MATMUL", "dnnl", 1);
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    const tp_shape_t xs = {2, {64, 256}};
    call_t ref;
    s_call(&ref, b, xs, 128, 1, 1, 0, 1);
    s_run(&ref, b);
    tower_t w[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        s_call(&w[i].t, b, xs, 128, 1, 1, 0, 1);
        w[i].ref = &ref;
        w[i].bad = 0;
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, s_tower, &w[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        cr_expect_eq(w[i].bad, 0, "tower %d: %d results differ (-1: a call failed)", i,
                     w[i].bad);
        s_free(&w[i].t);
    }
    s_free(&ref);
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&b);
}
