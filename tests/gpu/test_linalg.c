/* towerpack tests: batched matmul's CPU kernels (gpu/cpu/ops_linalg.c) on
 * the product a Transformer's linear layers make, x[B,T,K] @ W[K,N] (b
 * shared by every batch: one stacked [B*T,K] @ [K,N] product), which runs
 * on oneDNN's matmul where the backend has oneDNN: the output and both
 * gradients, stored and added (dx_acc), agree with OpenBLAS's
 * (TP_CPU_MATMUL=own), and the default path is oneDNN's (its sums differ
 * from OpenBLAS's in the last bits). The same for a product of whole
 * batches (attention's q k^T, p v written out) in every transpose, and
 * for the tied output product x wte^T (b shared and read transposed).
 * Through the backend's op entries, the workspace as the backend plans
 * it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"

TestSuite(linalg, .timeout = 60);

typedef struct {
    tp_op_attr_t attr;
    tp_shape_t xs[2], ys;
    float *x[2], *y, *dy, *dx[2], *ws;
    const void *in[2];
    int acc[2];
    tp_op_call_t c;
} call_t;

static void s_fill(float *v, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = -1.0f + 2.0f * (float)(seed >> 8) / 16777216.0f;
    }
}

/* a [xa] @ b [xb] (attr's transposes) -> [ys]; the gradients preset to 1
 * (an added one shows). */
static void s_run(call_t *c, tp_backend_t *be, tp_shape_t xa, tp_shape_t xb, tp_shape_t ys,
                  int acc) {
    c->xs[0] = xa;
    c->xs[1] = xb;
    c->ys = ys;
    for (int i = 0; i < 2; i++) {
        const size_t cnt = tp_shape_count(&c->xs[i]);
        c->x[i] = malloc(cnt * sizeof(float));
        c->dx[i] = malloc(cnt * sizeof(float));
        s_fill(c->x[i], cnt, 3u + (unsigned)i);
        for (size_t j = 0; j < cnt; j++)
            c->dx[i][j] = 1.0f;
        c->in[i] = c->x[i];
        c->acc[i] = acc;
    }
    const size_t ny = tp_shape_count(&c->ys);
    c->y = malloc(ny * sizeof(float));
    c->dy = malloc(ny * sizeof(float));
    s_fill(c->dy, ny, 41u);
    c->c.kind = TP_OP_BATCH_MATMUL;
    c->c.attr = &c->attr;
    c->c.name = "h0/attn/qkv/matmul";
    c->c.ninputs = 2;
    c->c.x = c->in;
    c->c.xshape = c->xs;
    c->c.y = c->y;
    c->c.yshape = c->ys;
    c->c.dx = c->dx;
    c->c.dx_acc = c->acc;
    c->c.dy = c->dy;
    c->c.workspace_bytes = be->ops->op_workspace(be, &c->c);
    c->ws = calloc(1, c->c.workspace_bytes + 64);
    c->c.workspace = c->ws;
    cr_assert_eq(be->ops->op_forward(be, NULL, &c->c), TP_OK, "%s", tp_last_error());
    cr_assert_eq(be->ops->op_backward(be, NULL, &c->c), TP_OK, "%s", tp_last_error());
}

/* x [b,t,k] @ W [k,n]: a linear layer */
static void s_call(call_t *c, tp_backend_t *be, int b, int t, int k, int n, int acc) {
    memset(c, 0, sizeof *c);
    s_run(c, be, (tp_shape_t){3, {b, t, k}}, (tp_shape_t){2, {k, n}},
          (tp_shape_t){3, {b, t, n}}, acc);
}

/* [b,h,m,k] @ [b,h,k,n] in the storage the transposes say */
static void s_call4(call_t *c, tp_backend_t *be, int b, int h, int m, int k, int n, int ta,
                    int tb, int acc) {
    memset(c, 0, sizeof *c);
    c->attr.trans_a = ta;
    c->attr.trans_b = tb;
    s_run(c, be, (tp_shape_t){4, {b, h, ta ? k : m, ta ? m : k}},
          (tp_shape_t){4, {b, h, tb ? n : k, tb ? k : n}}, (tp_shape_t){4, {b, h, m, n}}, acc);
}

static void s_free(call_t *c) {
    for (int i = 0; i < 2; i++) {
        free(c->x[i]);
        free(c->dx[i]);
    }
    free(c->y);
    free(c->dy);
    free(c->ws);
}

/* within tol of 1 + |b|: sums of up to 512 products of [-1, 1] values in
 * other orders */
static void s_close(const float *a, const float *b, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(a[i] - b[i]) <= 1e-4f * (1.0f + fabsf(b[i])), "%s[%zu]: %g, want %g",
                  what, i, (double)a[i], (double)b[i]);
}

Test(linalg, a_linear_layer_on_onednn_matches_openblas) {
    const struct { int b, t, k, n; } g[] = {
        {2, 64, 64, 192},  /* a small GPT's qkv, proj, fc, mlp/proj */
        {2, 64, 64, 64},
        {2, 64, 64, 256},
        {2, 64, 256, 64},
        {3, 5, 7, 11},     /* odd sizes */
        {1, 1, 512, 3},
    };
    tp_backend_t *be = tp_backend_cpu_new(1);
    cr_assert_not_null(be, "%s", tp_last_error());
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        for (int acc = 0; acc < 2; acc++) {
            call_t c[2];
            for (int p = 0; p < 2; p++) {
                setenv("TP_CPU_MATMUL", p ? "own" : "dnnl", 1);
                s_call(&c[p], be, g[i].b, g[i].t, g[i].k, g[i].n, acc);
            }
            s_close(c[0].y, c[1].y, tp_shape_count(&c[0].ys), "y");
            s_close(c[0].dx[0], c[1].dx[0], tp_shape_count(&c[0].xs[0]), "dx");
            s_close(c[0].dx[1], c[1].dx[1], tp_shape_count(&c[0].xs[1]), "dW");
            s_free(&c[0]);
            s_free(&c[1]);
        }
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&be);
}

/* The default is oneDNN's: a 512-long dot product's bits differ between
 * the two paths (before, batch_matmul ran OpenBLAS whatever the setting,
 * and the two agreed bit for bit), for a linear layer and for whole
 * batches. */
Test(linalg, the_default_path_is_onednns) {
    tp_backend_t *be = tp_backend_cpu_new(1);
    cr_assert_not_null(be, "%s", tp_last_error());
    call_t c[2];
    unsetenv("TP_CPU_MATMUL");
    s_call(&c[0], be, 2, 32, 512, 128, 0);
    setenv("TP_CPU_MATMUL", "own", 1);
    s_call(&c[1], be, 2, 32, 512, 128, 0);
    unsetenv("TP_CPU_MATMUL");
    const size_t n = tp_shape_count(&c[0].ys) * sizeof(float);
    cr_expect_neq(memcmp(c[0].y, c[1].y, n), 0, "oneDNN's and OpenBLAS's sums agree bit "
                  "for bit: one path ran twice");
    s_close(c[0].y, c[1].y, tp_shape_count(&c[0].ys), "y");
    s_free(&c[0]);
    s_free(&c[1]);
    /* and whole batches, q k^T's form */
    s_call4(&c[0], be, 2, 2, 32, 512, 32, 0, 1, 0);
    setenv("TP_CPU_MATMUL", "own", 1);
    s_call4(&c[1], be, 2, 2, 32, 512, 32, 0, 1, 0);
    unsetenv("TP_CPU_MATMUL");
    cr_expect_neq(memcmp(c[0].y, c[1].y, tp_shape_count(&c[0].ys) * sizeof(float)), 0,
                  "the batched product's sums agree bit for bit: one path ran twice");
    s_free(&c[0]);
    s_free(&c[1]);
    tp_backend_destroy(&be);
}

/* Whole batches, as attention written out makes them (q k^T: trans_b;
 * p v: none; and the other two transposes): one batched primitive per
 * product, every gradient as OpenBLAS's per-batch sgemms give it. */
Test(linalg, a_product_of_whole_batches_on_onednn_matches_openblas) {
    tp_backend_t *be = tp_backend_cpu_new(1);
    cr_assert_not_null(be, "%s", tp_last_error());
    const struct { int b, h, m, k, n; } g[] = {{2, 4, 64, 32, 64}, {2, 4, 64, 64, 32},
                                               {1, 3, 5, 7, 9}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        for (int v = 0; v < 8; v++) {
            const int ta = v & 1, tb = (v >> 1) & 1, acc = (v >> 2) & 1;
            call_t c[2];
            for (int p = 0; p < 2; p++) {
                setenv("TP_CPU_MATMUL", p ? "own" : "dnnl", 1);
                s_call4(&c[p], be, g[i].b, g[i].h, g[i].m, g[i].k, g[i].n, ta, tb, acc);
            }
            s_close(c[0].y, c[1].y, tp_shape_count(&c[0].ys), "y");
            s_close(c[0].dx[0], c[1].dx[0], tp_shape_count(&c[0].xs[0]), "da");
            s_close(c[0].dx[1], c[1].dx[1], tp_shape_count(&c[0].xs[1]), "db");
            s_free(&c[0]);
            s_free(&c[1]);
        }
    unsetenv("TP_CPU_MATMUL");
    tp_backend_destroy(&be);
}

/* The GPT's logits, x [B,T,C] @ wte^T (wte [V,C] shared by every batch,
 * read transposed): stacked into one product with b transposed. */
Test(linalg, the_tied_output_product_on_onednn_matches_openblas) {
    tp_backend_t *be = tp_backend_cpu_new(1);
    cr_assert_not_null(be, "%s", tp_last_error());
    for (int acc = 0; acc < 2; acc++) {
        call_t c[2];
        for (int p = 0; p < 3; p++) {
            if (p < 2)
                setenv("TP_CPU_MATMUL", p ? "own" : "dnnl", 1);
            else
                unsetenv("TP_CPU_MATMUL");
            call_t *t = &c[p < 2 ? p : 0];
            if (p == 2)
                s_free(t);
            memset(t, 0, sizeof *t);
            t->attr.trans_b = 1;
            s_run(t, be, (tp_shape_t){3, {2, 64, 512}}, (tp_shape_t){2, {256, 512}},
                  (tp_shape_t){3, {2, 64, 256}}, acc);
        }
        s_close(c[0].y, c[1].y, tp_shape_count(&c[0].ys), "y");
        s_close(c[0].dx[0], c[1].dx[0], tp_shape_count(&c[0].xs[0]), "dx");
        s_close(c[0].dx[1], c[1].dx[1], tp_shape_count(&c[0].xs[1]), "dwte");
        /* the default (c[0], run last) is oneDNN's: other bits than OpenBLAS's */
        cr_expect_neq(memcmp(c[0].y, c[1].y, tp_shape_count(&c[0].ys) * sizeof(float)), 0,
                      "the tied product's sums agree bit for bit with OpenBLAS's");
        s_free(&c[0]);
        s_free(&c[1]);
    }
    tp_backend_destroy(&be);
}
