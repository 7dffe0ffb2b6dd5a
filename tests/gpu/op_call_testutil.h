/* towerpack tests: one op call on a backend's op entries, as the oneDNN
 * suites make it (test_dnnl_conv.c, test_dnnl_matmul.c, test_dnnl_ops.c):
 * the one-thread CPU backend (the one that runs oneDNN), inputs from a
 * fixed generator, the call record pointing at its buffers, the workspace
 * as a model plans it, the forward and backward asserted, and the
 * comparison of one path's numbers with another's. Each suite keeps its
 * own seeds and ranges, so its numbers (and the error bounds measured on
 * them) stay what they were. */
#ifndef TP_TESTS_GPU_OP_CALL_TESTUTIL_H
#define TP_TESTS_GPU_OP_CALL_TESTUTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"

/* One op call's buffers, c pointing at them: inputs x[i] [xs[i]] for
 * i < c.ninputs and their gradients dx[i] (NULL: not wanted; acc[i] 1:
 * added, 0: stored), y [ys] and dy [ys], a matmul's folded bias b [M] and
 * its gradient db (NULL unless the suite sets them), batch norm's moving
 * mean and variance state[0..1] [C] (likewise), the planned workspace. */
typedef struct {
    tp_op_attr_t attr;
    tp_shape_t xs[3], ys;
    float *x[3], *dx[3], *y, *dy, *b, *db, *state[2], *ws;
    const void *in[3];
    int acc[3];
    tp_op_call_t c;
} oct_call_t;

/* v[0..n) uniform in [lo, hi) from a linear congruential generator at
 * `seed`: the same numbers on every machine and run. */
static inline void oct_fill(float *v, size_t n, unsigned seed, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
    }
}

static inline void oct_set(float *v, size_t n, float value) {
    for (size_t i = 0; i < n; i++)
        v[i] = value;
}

/* t as a call of `kind` named `name` on n inputs [xs[0..n)] to y [ys]:
 * input i drawn in [lo, hi) from seed 7 + i, dy in [-1, 1) from seed 99,
 * the gradients preset to 1 (so that an added one shows) and stored or
 * added by `acc`; attr zeroed for the caller to set, no bias, state or
 * workspace (oct_plan). Release with oct_call_free. */
static inline void oct_call_init(oct_call_t *t, tp_op_kind_t kind, const char *name, int n,
                                 const tp_shape_t *xs, tp_shape_t ys, int acc, float lo,
                                 float hi) {
    cr_assert(n >= 1 && n <= 3, "oct_call_init: %d inputs (1 to 3)", n);
    memset(t, 0, sizeof *t);
    for (int i = 0; i < n; i++) {
        t->xs[i] = xs[i];
        const size_t cnt = tp_shape_count(&xs[i]);
        t->x[i] = malloc(cnt * sizeof(float));
        t->dx[i] = malloc(cnt * sizeof(float));
        cr_assert(t->x[i] && t->dx[i], "oct_call_init: input %d, %zu floats", i, cnt);
        oct_fill(t->x[i], cnt, 7u + (unsigned)i, lo, hi);
        oct_set(t->dx[i], cnt, 1.0f);
        t->in[i] = t->x[i];
        t->acc[i] = acc;
    }
    t->ys = ys;
    const size_t ny = tp_shape_count(&ys);
    t->y = malloc(ny * sizeof(float));
    t->dy = malloc(ny * sizeof(float));
    cr_assert(t->y && t->dy, "oct_call_init: y, %zu floats", ny);
    oct_fill(t->dy, ny, 99u, -1.0f, 1.0f);
    t->c = (tp_op_call_t){.kind = kind, .attr = &t->attr, .name = name, .ninputs = n,
                          .x = t->in, .xshape = t->xs, .y = t->y, .yshape = ys,
                          .dx = t->dx, .dx_acc = t->acc, .dy = t->dy};
}

static inline void oct_call_free(oct_call_t *t) {
    for (int i = 0; i < 3; i++) {
        free(t->x[i]);
        free(t->dx[i]);
    }
    free(t->y), free(t->dy), free(t->b), free(t->db);
    free(t->state[0]), free(t->state[1]), free(t->ws);
    memset(t, 0, sizeof *t);
}

/* The one-thread CPU backend: the one whose ops run on oneDNN. Caller
 * owns it. */
static inline tp_backend_t *oct_backend(void) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b, "%s", tp_last_error());
    return b;
}

/* c's workspace planned on b as a model plans it: op_workspace's bytes
 * (asked with no workspace yet), zeroed, in *ws (a plan again frees the
 * last), with 64 bytes spare past the plan as the other op suites give it
 * (test_proc_op_parity.c, test_cuda_ops.c). */
static inline void oct_plan(tp_backend_t *b, tp_op_call_t *c, float **ws) {
    free(*ws);
    c->workspace = NULL;
    c->workspace_bytes = b->ops->op_workspace(b, c);
    *ws = calloc(1, c->workspace_bytes + 64);
    cr_assert_not_null(*ws, "oct_plan: %zu bytes", c->workspace_bytes);
    c->workspace = *ws;
}

static inline void oct_forward(tp_backend_t *b, const tp_op_call_t *c) {
    cr_assert_eq(b->ops->op_forward(b, NULL, c), TP_OK, "%s forward: %s", c->name,
                 tp_last_error());
}

static inline void oct_backward(tp_backend_t *b, const tp_op_call_t *c) {
    cr_assert_eq(b->ops->op_backward(b, NULL, c), TP_OK, "%s backward: %s", c->name,
                 tp_last_error());
}

static inline void oct_run(tp_backend_t *b, const tp_op_call_t *c) {
    oct_forward(b, c);
    oct_backward(b, c);
}

/* a[i] within tol of b[i] scaled by 1 + |b[i]|, element by element: the
 * same sums added in another order differ by a few ulps of their size. */
static inline void oct_close(const float *a, const float *b, size_t n, float tol,
                             const char *what) {
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(a[i] - b[i]) <= tol * (1.0f + fabsf(b[i])), "%s[%zu]: %g, want %g",
                  what, i, (double)a[i], (double)b[i]);
}

/* [N, C, H, W] between NCHW and nChw16c (C a multiple of 16), in place:
 * to_plain 0 blocks v, 1 unblocks it (the layout tp_op_call_t.blk16 says
 * a blocked chain's operands are in). */
static inline void oct_16(float *v, const tp_shape_t *s, int to_plain) {
    const size_t n = (size_t)s->d[0], c = (size_t)s->d[1], p = (size_t)(s->d[2] * s->d[3]);
    float *tmp = malloc(n * c * p * sizeof(float));
    cr_assert_not_null(tmp);
    for (size_t b = 0; b < n; b++)
        for (size_t ch = 0; ch < c; ch++)
            for (size_t i = 0; i < p; i++) {
                const size_t plain = (b * c + ch) * p + i;
                const size_t blk = ((b * (c / 16) + ch / 16) * p + i) * 16 + ch % 16;
                tmp[to_plain ? plain : blk] = v[to_plain ? blk : plain];
            }
    memcpy(v, tmp, n * c * p * sizeof(float));
    free(tmp);
}

#endif
