/* towerpack tests: the model's side of whole-step graphs (config.graphs,
 * gpu/graph/model.c) on a machine without a GPU.
 *
 * The CUDA backend records a step with stream capture and replays it
 * (docs/cuda.md); the model decides when: the first step at a batch call by
 * call, the second recorded, the later ones replayed, another batch call by
 * call again. Here a stand-in backend wraps the CPU backend and records the
 * same way: while recording it keeps every call (op, fill, gemm, update)
 * instead of running it, and runs the list at graph_end; in a replay it
 * checks that each call is the recorded one (the same kind, the same
 * memory) and takes the values a step may change (the learning rate, the
 * step count), then runs the list. Against the same model on the plain CPU
 * backend, every variable must come out bit-identical, and the counts of
 * recordings and replays must be the model's rule. (The CUDA module's own
 * recording is tested on a GPU: tests/gpu/test_cuda_ops.c, cuda_step.) */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "gpu/step_testutil.h"

typedef enum { R_FWD, R_BWD, R_FILL, R_GEMM, R_SGD, R_ADAM, R_COPY } s_rk_t;

typedef struct {
    s_rk_t kind;
    tp_stream_t *s;
    tp_op_call_t c; /* x, xshape, dx, dx_acc: copies owned below */
    const void **x;
    tp_shape_t *xs;
    float **dx;
    int *acc;
    /* fill, gemm, updates */
    float *dst;
    float value;
    size_t count;
    int ta, tb, m, n, k, lda, ldb, ldc, nesterov;
    float alpha, beta, lr, mu, b1, b2, eps, wd;
    const float *a, *bm, *g;
    float *cm, *v, *mm;
    int64_t step;
    void *to; /* copy_async */
    const void *from;
} s_rec_t;

struct tp_graph {
    s_rec_t *r;
    size_t n, cap;
};

enum { S_EAGER, S_RECORDING, S_REPLAYING };

typedef struct {
    tp_backend_t base; /* first */
    tp_backend_t *cpu;
    tp_backend_ops_t ops;
    int mode;
    tp_graph_t *cur;
    size_t cursor;
    int recorded, replayed;
    int syncing_reads;   /* copies to the host through copy (one sync each) */
    int marks, waits;    /* stream_mark, stream_wait_mark */
    char diverged[200];
} s_fake_t;

static s_fake_t *s_of(tp_backend_t *b) { return (s_fake_t *)b; }

static void s_rec_free(s_rec_t *r) {
    free(r->x);
    free(r->xs);
    free(r->dx);
    free(r->acc);
}

static void s_graph_free(tp_graph_t *g) {
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++)
        s_rec_free(&g->r[i]);
    free(g->r);
    free(g);
}

/* Recording: a new entry. Replaying: the recorded entry this call must
 * match (NULL after a divergence, which graph_end reports). */
static s_rec_t *s_next(s_fake_t *f, s_rk_t kind, const void *key) {
    if (f->mode == S_RECORDING) {
        tp_graph_t *g = f->cur;
        if (g->n == g->cap) {
            g->cap = g->cap ? 2 * g->cap : 64;
            g->r = realloc(g->r, g->cap * sizeof *g->r);
            cr_assert_not_null(g->r);
        }
        s_rec_t *r = &g->r[g->n++];
        memset(r, 0, sizeof *r);
        r->kind = kind;
        return r;
    }
    s_rec_t *r = f->cursor < f->cur->n ? &f->cur->r[f->cursor] : NULL;
    f->cursor++;
    const void *rkey = !r ? NULL
                       : r->kind == R_FWD || r->kind == R_BWD ? (const void *)r->c.node
                       : r->kind == R_FILL                  ? (const void *)r->dst
                       : r->kind == R_COPY                  ? (const void *)r->to
                       : r->kind == R_GEMM                  ? (const void *)r->cm
                                                            : (const void *)r->cm;
    if (!r || r->kind != kind || rkey != key) {
        if (!f->diverged[0])
            snprintf(f->diverged, sizeof f->diverged, "replay call %zu is not the "
                     "recorded one", f->cursor - 1);
        return NULL;
    }
    return r;
}

static tp_status_t s_op(tp_backend_t *b, tp_stream_t *s, const tp_op_call_t *c,
                        s_rk_t kind) {
    s_fake_t *f = s_of(b);
    if (f->mode == S_EAGER)
        return kind == R_FWD ? f->cpu->ops->op_forward(f->cpu, s, c)
                             : f->cpu->ops->op_backward(f->cpu, s, c);
    s_rec_t *r = s_next(f, kind, c->node);
    if (!r || f->mode == S_REPLAYING)
        return TP_OK;
    int n = c->ninputs;
    r->s = s;
    r->c = *c;
    r->x = malloc((size_t)n * sizeof *r->x + 1);
    r->xs = malloc((size_t)n * sizeof *r->xs + 1);
    memcpy(r->x, c->x, (size_t)n * sizeof *r->x);
    memcpy(r->xs, c->xshape, (size_t)n * sizeof *r->xs);
    r->c.x = r->x;
    r->c.xshape = r->xs;
    if (c->dx) {
        r->dx = malloc((size_t)n * sizeof *r->dx + 1);
        memcpy(r->dx, c->dx, (size_t)n * sizeof *r->dx);
        r->c.dx = r->dx;
    }
    if (c->dx_acc) {
        r->acc = malloc((size_t)n * sizeof *r->acc + 1);
        memcpy(r->acc, c->dx_acc, (size_t)n * sizeof *r->acc);
        r->c.dx_acc = r->acc;
    }
    return TP_OK;
}

/* the CPU's own plan of an op's workspace: the ops run on the CPU backend
 * (with its oneDNN cache), whose matmul falls back to OpenBLAS when the
 * workspace lacks its scratchpad */
static size_t s_workspace(tp_backend_t *b, const tp_op_call_t *c) {
    s_fake_t *f = s_of(b);
    return f->cpu->ops->op_workspace(f->cpu, c);
}

static tp_status_t s_fwd(tp_backend_t *b, tp_stream_t *s, const tp_op_call_t *c) {
    return s_op(b, s, c, R_FWD);
}
static tp_status_t s_bwd(tp_backend_t *b, tp_stream_t *s, const tp_op_call_t *c) {
    return s_op(b, s, c, R_BWD);
}

static tp_status_t s_fill(tp_backend_t *b, tp_stream_t *s, float *dst, float value,
                          size_t count) {
    s_fake_t *f = s_of(b);
    if (f->mode == S_EAGER)
        return f->cpu->ops->fill(f->cpu, s, dst, value, count);
    s_rec_t *r = s_next(f, R_FILL, dst);
    if (r && f->mode == S_RECORDING)
        *r = (s_rec_t){.kind = R_FILL, .s = s, .dst = dst, .value = value, .count = count};
    return TP_OK;
}

static tp_status_t s_gemm(tp_backend_t *b, tp_stream_t *s, int ta, int tb, int m,
                          int n, int k, float alpha, const float *a, int lda,
                          const float *bm, int ldb, float beta, float *c, int ldc) {
    s_fake_t *f = s_of(b);
    if (f->mode == S_EAGER)
        return f->cpu->ops->gemm(f->cpu, s, ta, tb, m, n, k, alpha, a, lda, bm, ldb,
                                 beta, c, ldc);
    s_rec_t *r = s_next(f, R_GEMM, c);
    if (r && f->mode == S_RECORDING)
        *r = (s_rec_t){.kind = R_GEMM, .s = s, .ta = ta, .tb = tb, .m = m, .n = n,
                       .k = k, .alpha = alpha, .a = a, .lda = lda, .bm = bm,
                       .ldb = ldb, .beta = beta, .cm = c, .ldc = ldc};
    return TP_OK;
}

/* copy_async: deferred like the ops, so a mirror copied in a recorded or
 * replayed step holds what the step computed, not the step before's. */
static tp_status_t s_copy_async(tp_backend_t *b, tp_stream_t *s, void *dst,
                                const void *src, size_t bytes) {
    s_fake_t *f = s_of(b);
    if (f->mode == S_EAGER) {
        memcpy(dst, src, bytes);
        return TP_OK;
    }
    s_rec_t *r = s_next(f, R_COPY, dst);
    if (r && f->mode == S_RECORDING)
        *r = (s_rec_t){.kind = R_COPY, .s = s, .to = dst, .from = src, .count = bytes};
    return TP_OK;
}

static tp_status_t s_copy(tp_backend_t *b, tp_stream_t *s, void *dst, const void *src,
                          size_t bytes, tp_copy_kind_t kind) {
    s_fake_t *f = s_of(b);
    if (kind == TP_COPY_D2H)
        f->syncing_reads++;
    return f->cpu->ops->copy(f->cpu, s, dst, src, bytes, kind);
}

/* One step ahead: the stand-in runs everything at once, so a mark is
 * always reached; counted, and the model's bookkeeping (which step's
 * outputs a read gets, waiting before reading variables) is what runs. */
static tp_status_t s_mark(tp_backend_t *b, tp_stream_t *s) {
    (void)s;
    s_of(b)->marks++;
    return TP_OK;
}
static tp_status_t s_wait_mark(tp_backend_t *b, tp_stream_t *s) {
    (void)s;
    s_of(b)->waits++;
    return TP_OK;
}

static void *s_host_alloc(tp_backend_t *b, size_t bytes) {
    (void)b;
    return malloc(bytes ? bytes : 1);
}
static void s_host_free(tp_backend_t *b, void *p) {
    (void)b;
    free(p);
}

/* The updates: recorded once; a replay takes the step's own scalars, as
 * the CUDA module's replay writes them to the params its kernels read. */
static tp_status_t s_sgd(tp_backend_t *b, tp_stream_t *s, float *w, const float *g,
                         float *v, size_t n, float lr, float mu, int nesterov) {
    s_fake_t *f = s_of(b);
    if (f->mode == S_EAGER)
        return f->cpu->ops->sgd_update(f->cpu, s, w, g, v, n, lr, mu, nesterov);
    s_rec_t *r = s_next(f, R_SGD, w);
    if (r && f->mode == S_RECORDING)
        *r = (s_rec_t){.kind = R_SGD, .s = s, .cm = w, .g = g, .v = v, .count = n,
                       .nesterov = nesterov};
    if (r) {
        r->lr = lr;
        r->mu = mu;
    }
    return TP_OK;
}

static tp_status_t s_adam(tp_backend_t *b, tp_stream_t *s, float *w, const float *g,
                          float *m, float *v, size_t n, float lr, float b1, float b2,
                          float eps, float wd, int64_t step) {
    s_fake_t *f = s_of(b);
    if (f->mode == S_EAGER)
        return f->cpu->ops->adam_update(f->cpu, s, w, g, m, v, n, lr, b1, b2, eps, wd,
                                        step);
    s_rec_t *r = s_next(f, R_ADAM, w);
    if (r && f->mode == S_RECORDING)
        *r = (s_rec_t){.kind = R_ADAM, .s = s, .cm = w, .g = g, .mm = m, .v = v,
                       .count = n, .b1 = b1, .b2 = b2, .eps = eps, .wd = wd};
    if (r) {
        r->lr = lr;
        r->step = step;
    }
    return TP_OK;
}

static tp_status_t s_run_graph(s_fake_t *f, tp_graph_t *g) {
    tp_backend_t *c = f->cpu;
    for (size_t i = 0; i < g->n; i++) {
        s_rec_t *r = &g->r[i];
        tp_status_t rc = TP_OK;
        switch (r->kind) {
        case R_FWD: rc = c->ops->op_forward(c, r->s, &r->c); break;
        case R_BWD: rc = c->ops->op_backward(c, r->s, &r->c); break;
        case R_FILL: rc = c->ops->fill(c, r->s, r->dst, r->value, r->count); break;
        case R_GEMM:
            rc = c->ops->gemm(c, r->s, r->ta, r->tb, r->m, r->n, r->k, r->alpha, r->a,
                              r->lda, r->bm, r->ldb, r->beta, r->cm, r->ldc);
            break;
        case R_SGD:
            rc = c->ops->sgd_update(c, r->s, r->cm, r->g, r->v, r->count, r->lr, r->mu,
                                    r->nesterov);
            break;
        case R_ADAM:
            rc = c->ops->adam_update(c, r->s, r->cm, r->g, r->mm, r->v, r->count, r->lr,
                                     r->b1, r->b2, r->eps, r->wd, r->step);
            break;
        case R_COPY:
            memcpy(r->to, r->from, r->count);
            break;
        }
        if (rc < 0)
            return rc;
    }
    return TP_OK;
}

static tp_status_t s_graph_begin(tp_backend_t *b, tp_stream_t *s, tp_graph_t *g) {
    (void)s;
    s_fake_t *f = s_of(b);
    cr_assert_eq(f->mode, S_EAGER, "graph_begin inside a graph");
    f->diverged[0] = '\0';
    f->cursor = 0;
    if (g) {
        f->mode = S_REPLAYING;
        f->cur = g;
    } else {
        f->mode = S_RECORDING;
        f->cur = calloc(1, sizeof *f->cur);
    }
    return TP_OK;
}

static tp_status_t s_graph_end(tp_backend_t *b, tp_stream_t *s, tp_graph_t **g) {
    (void)s;
    s_fake_t *f = s_of(b);
    int replay = f->mode == S_REPLAYING;
    f->mode = S_EAGER;
    if (replay && !f->diverged[0] && f->cursor != f->cur->n)
        snprintf(f->diverged, sizeof f->diverged, "the replay made %zu calls, the "
                 "record has %zu", f->cursor, f->cur->n);
    if (f->diverged[0])
        return tp_error(TP_ERR_STATE, "%s", f->diverged);
    if (!replay) {
        *g = f->cur;
        f->recorded++;
    } else {
        f->replayed++;
    }
    return s_run_graph(f, *g);
}

static void s_graph_abort(tp_backend_t *b, tp_stream_t *s) {
    (void)s;
    s_fake_t *f = s_of(b);
    if (f->mode == S_RECORDING)
        s_graph_free(f->cur);
    f->mode = S_EAGER;
}

static void s_graph_destroy(tp_backend_t *b, tp_graph_t *g) {
    (void)b;
    s_graph_free(g);
}

static void s_fake_destroy(tp_backend_t *b) {
    s_fake_t *f = s_of(b);
    tp_backend_destroy(&f->cpu);
    free(f);
}

/* The CPU backend under a recording stand-in. Its device is 0, so the
 * model copies each step's inputs into its planned buffers, as on a GPU
 * (a recorded call must find them at the same place). */
static s_fake_t *s_fake_new(void) {
    s_fake_t *f = calloc(1, sizeof *f);
    cr_assert_not_null(f);
    f->cpu = tp_backend_cpu_new(1);
    cr_assert_not_null(f->cpu);
    f->ops = *f->cpu->ops;
    f->ops.name = "graph-stand-in";
    f->ops.op_workspace = s_workspace;
    f->ops.op_forward = s_fwd;
    f->ops.op_backward = s_bwd;
    f->ops.fill = s_fill;
    f->ops.gemm = s_gemm;
    f->ops.sgd_update = s_sgd;
    f->ops.adam_update = s_adam;
    f->ops.copy = s_copy;
    f->ops.copy_async = s_copy_async;
    f->ops.host_alloc = s_host_alloc;
    f->ops.host_free = s_host_free;
    f->ops.stream_mark = s_mark;
    f->ops.stream_wait_mark = s_wait_mark;
    f->ops.graph_begin = s_graph_begin;
    f->ops.graph_end = s_graph_end;
    f->ops.graph_abort = s_graph_abort;
    f->ops.graph_destroy = s_graph_destroy;
    f->ops.destroy = s_fake_destroy;
    f->base.ops = &f->ops;
    f->base.impl = f;
    f->base.device = 0;
    return f;
}

static void s_after_step(int s, void *arg) {
    tp_model_t *m = arg;
    /* the model's rule: recorded at the second step at a batch */
    cr_assert_eq(tp_model_graphed(m, 0), s >= 1, "step %d", s);
    /* The step's scalar outputs were copied behind it (after the replay
     * when graphed): read with no copy through the backend, and what the step
     * computed (the stand-in's device memory is host memory: compare with
     * the output itself). */
    s_fake_t *f = s_of(tp_model_backend(m));
    int reads = f->syncing_reads;
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, 0, "cost", &v), TP_OK);
    float cost = NAN;
    cr_assert_eq(tp_model_view_host(m, &v, &cost, sizeof cost), &cost);
    cr_assert_eq(cost, *(const float *)v.data, "step %d: the mirror has %g, the "
                 "step computed %g", s, (double)cost, (double)*(const float *)v.data);
    cr_assert_eq(tp_model_fetch(m, 0, "acc", &v), TP_OK);
    cr_assert_eq(tp_model_metric_value(m, 0, 0), *(const float *)v.data, "step %d", s);
    cr_assert_eq(f->syncing_reads, reads, "step %d: a read synchronised", s);
}

static void s_compare(tp_optimizer_fn opt, double lr0) {
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, opt, NULL};
    tp_model_config_t cfg = stu_config(1);
    cfg.graphs = 0;
    tp_model_t *plain = tp_model_new(&md, &cfg);
    cr_assert_not_null(plain, "%s", tp_last_error());
    s_fake_t *f = s_fake_new();
    cfg.graphs = 1;
    cfg.backend = &f->base;
    cfg.own_backend = 1;
    tp_model_t *graphed = tp_model_new(&md, &cfg);
    cr_assert_not_null(graphed, "%s", tp_last_error());
    const int steps = 8;
    stu_train_pair(plain, graphed, steps, lr0, s_after_step, graphed);
    /* step 0 and the batch of 7 call by call, step 1 recorded, 2, 3 and
     * 5 to 7 replayed */
    cr_expect_eq(f->recorded, 1);
    cr_expect_eq(f->replayed, 5);
    /* on a device (the stand-in's device 0) the step updates the whole
     * arena at once: one update call, not one per variable as on the CPU */
    int updates = 0;
    for (size_t i = 0; f->cur && i < f->cur->n; i++)
        updates += f->cur->r[i].kind == R_SGD || f->cur->r[i].kind == R_ADAM;
    cr_expect_eq(updates, 1, "%d update calls in the recorded step", updates);
    for (int i = 0; i < tp_model_var_count(plain); i++) {
        const char *name = tp_model_var_name(plain, i);
        tp_tensor_t a, b;
        cr_assert_eq(tp_model_var(plain, name, &a), TP_OK);
        cr_assert_eq(tp_model_var(graphed, name, &b), TP_OK);
        cr_assert_eq(a.nbytes, b.nbytes);
        cr_assert_eq(memcmp(a.data, b.data, a.nbytes), 0,
                     "%s differs after %d steps, replayed vs call by call", name, steps);
    }
    stu_bad_label_fails(graphed);  /* in a replayed step */
    tp_model_destroy(&graphed);  /* and the stand-in backend it took */
    tp_model_destroy(&plain);
}

Test(graph_replay, sgd_steps_replayed_equal_call_by_call) { s_compare(stu_nesterov, 0.05); }
Test(graph_replay, adam_steps_replayed_equal_call_by_call) { s_compare(stu_adam, 0.01); }

/* Graphs off, or on a backend that cannot record (the CPU): nothing is
 * recorded, every step runs call by call. */
Test(graph_replay, the_cpu_backend_runs_call_by_call) {
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, stu_nesterov, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 16;
    cfg.graphs = 1;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    static uint8_t x[16 * 144];
    int32_t y[16] = {0};
    int64_t xs[3] = {16, 12, 12}, ys[1] = {16};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_UINT8, 3, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    for (int s = 0; s < 3; s++)
        cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, NULL), TP_OK, "%s",
                     tp_last_error());
    cr_assert_eq(tp_model_graphed(m, 0), 0);
    tp_model_destroy(&m);
}

/* One step ahead (config.ahead), graphed: the same training bit for bit;
 * a read of the cost after step s gets step s - 1's (the step known done),
 * the first step's once its read waited for it; reading the variables
 * waits for the last step, after which the cost read is its own. */
typedef struct {
    tp_model_t *plain, *ahead;
    float prev;
} s_pair_t;

static float s_cost_of(tp_model_t *m) {
    tp_tensor_t v;
    cr_assert_eq(tp_model_fetch(m, 0, "cost", &v), TP_OK);
    float c = NAN;
    const float *h = tp_model_view_host(m, &v, &c, sizeof c);  /* the CPU: v's own */
    cr_assert_not_null(h, "%s", tp_last_error());
    return *h;
}

static void s_after_ahead(int s, void *arg) {
    s_pair_t *p = arg;
    float now = s_cost_of(p->plain), got = s_cost_of(p->ahead);
    if (s == 0)
        cr_assert_eq(got, now, "step 0: its read waits for it");
    else
        cr_assert_eq(got, p->prev, "step %d: read %g, the step before had %g, this "
                     "one %g", s, (double)got, (double)p->prev, (double)now);
    p->prev = now;
}

Test(graph_replay, ahead_steps_read_the_step_before_and_train_the_same) {
    tp_model_desc_t md = {stu_inputs, 2, stu_cnn, stu_nesterov, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 16;
    cfg.seed = 42;
    cfg.threads = 1;
    cfg.graphs = 0;
    cfg.ahead = 0;
    s_pair_t p = {0};
    p.plain = tp_model_new(&md, &cfg);
    cr_assert_not_null(p.plain, "%s", tp_last_error());
    s_fake_t *f = s_fake_new();
    cfg.graphs = 1;
    cfg.ahead = 1;
    cfg.backend = &f->base;
    cfg.own_backend = 1;
    p.ahead = tp_model_new(&md, &cfg);
    cr_assert_not_null(p.ahead, "%s", tp_last_error());
    stu_train_pair(p.plain, p.ahead, 8, 0.05, s_after_ahead, &p);
    cr_expect_eq(f->recorded, 1);
    cr_expect_eq(f->replayed, 5);
    /* every step waited once; the two run call by call marked themselves
     * (a graph's mark is graph_end's) */
    cr_expect_eq(f->waits, 8);
    cr_expect_eq(f->marks, 2);
    for (int i = 0; i < tp_model_var_count(p.plain); i++) {
        const char *name = tp_model_var_name(p.plain, i);
        tp_tensor_t a, b;
        cr_assert_eq(tp_model_var(p.plain, name, &a), TP_OK);
        cr_assert_eq(tp_model_var(p.ahead, name, &b), TP_OK, "%s", tp_last_error());
        cr_assert_eq(memcmp(a.data, b.data, a.nbytes), 0, "%s differs", name);
    }
    cr_assert_eq(s_cost_of(p.ahead), s_cost_of(p.plain), "after the wait: the last step's");
    tp_model_destroy(&p.ahead);
    tp_model_destroy(&p.plain);
}
