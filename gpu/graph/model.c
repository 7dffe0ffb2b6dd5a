/* towerpack gpu: the model: towers built from a description, memory planned
 * once, and the step: forward, backward, reduce and update as named calls
 * through the backend, across towers, devices and processes, with the
 * step's state kept here (the all-reduce of gradient buffers itself:
 * collective.c, which knows nothing of the model).
 *
 * Memory layout. Trainable variables live in one flat arena (each variable
 * 64-byte aligned), model-only variables in another, one pair per device
 * the towers span (a replica each; one device: one); every training tower
 * has a gradient arena of the trainable layout, so an all-reduce and an
 * optimizer update are single calls over one buffer. Each tower has one
 * activation arena holding its input copies, node values, node gradients
 * and op workspaces. Nothing is allocated after tp_model_new. */
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <towerpack/clock.h>
#include <towerpack/graph.h>
#include <towerpack/graph_dist.h>
#include <towerpack/log.h>
#include <towerpack/optim.h>

#include "gpu/graph/collective.h"
#include "gpu/graph/graph_internal.h"
#include "gpu/op_geometry.h"

#define FLOAT_ALIGN (TP_ALIGNMENT / sizeof(float))

tp_node_t *tp_input_node_(tp_tower_t *t, int index, const tp_input_desc_t *d,
                          int64_t batch);

/* ---- config: the one place defaults come from the environment ----------- */

/* A switch from the environment: unset or empty `unset`, "0" off, else on. */
static int s_env_switch(const char *name, int unset) {
    const char *v = getenv(name);
    if (!v || !*v)
        return unset;
    return strcmp(v, "0") != 0;
}

tp_model_config_t tp_model_config_default(void) {
    tp_model_config_t c;
    memset(&c, 0, sizeof c);
    c.towers = 1;
    c.batch = 32;
    c.average = 1;
    c.bucket_bytes = -1;  /* by the backend: s_config_resolve */
    c.graphs = s_env_switch("TP_CUDA_GRAPHS", 0);
    c.ahead = s_env_switch("TP_CUDA_AHEAD", 0);
    c.fold = s_env_switch("TP_FOLD", 1);
    return c;
}

/* The defaults that depend on the backend the model runs on: the buckets
 * of the all-reduce (-1) are 25 MiB on a device, which overlaps them with
 * the backward pass, and none on the CPU, which cannot. */
static void s_config_resolve(tp_model_config_t *c, const tp_backend_t *b) {
    if (c->bucket_bytes < 0)
        c->bucket_bytes = b->device >= 0 ? (int64_t)25 << 20 : 0;
}

int tp_model_tower_count(const tp_model_t *m) { return m->ntowers; }

uint64_t tp_model_device_wait_ns(const tp_model_t *m) {
    uint64_t ns = 0;
    for (int i = 0; m && i < m->ntowers; i++)
        ns += m->towers[i]->device_wait_ns;
    return ns;
}

int tp_model_graphed(const tp_model_t *m, int tower) {
    return m && tower >= 0 && tower < m->ntowers && m->towers[tower]->graph;
}
const char *tp_model_name(const tp_model_t *m) { return m ? m->name : NULL; }
tp_status_t tp_model_set_name(tp_model_t *m, const char *name) {
    char *copy = name ? strdup(name) : NULL;
    if (name && !copy)
        return tp_error(TP_ERR_NOMEM, "model name");
    free(m->name);
    m->name = copy;
    return TP_OK;
}
tp_backend_t *tp_model_backend(tp_model_t *m) { return m->backend; }
tp_backend_t *tp_model_tower_backend(tp_model_t *m, int tower) {
    tp_tower_t *t = m ? tp_model_tower_(m, tower) : NULL;
    return t ? tp_tower_backend_(t) : NULL;
}
int tp_model_device_count(const tp_model_t *m) { return m ? m->nrep : 0; }
size_t tp_model_memory(const tp_model_t *m) { return m->memory; }
tp_optimizer_t *tp_model_optimizer(tp_model_t *m) { return m->opt; }

tp_tower_t *tp_model_tower_(tp_model_t *m, int tower) {
    if (tower == -1)
        return m->infer;
    if (tower < 0 || tower >= m->ntowers)
        return NULL;
    return m->towers[tower];
}

static tp_status_t s_bad_tower(const tp_model_t *m, int tower) {
    if (tower == -1)
        return tp_error(TP_ERR_INVALID,
                        "model has no inference graph (set infer_batch)");
    return tp_error(TP_ERR_INVALID, "tower %d out of range (model has %d; "
                    "-1 is the inference graph, TP_ALL_TOWERS every "
                    "training tower)", tower, m->ntowers);
}

float *tp_var_data_(tp_model_t *m, int r, int i) {
    tp_var_t *v = &m->vars[i];
    return (v->trainable ? m->rep[r].train_arena : m->rep[r].model_arena) + v->offset;
}

/* ---- initializers ------------------------------------------------------- */

static void s_fans(const tp_shape_t *s, double *fan_in, double *fan_out) {
    if (s->ndim == 2) {
        *fan_in = (double)s->d[0];
        *fan_out = (double)s->d[1];
    } else if (s->ndim >= 3) {
        double rf = 1;
        for (int i = 2; i < s->ndim; i++)
            rf *= (double)s->d[i];
        *fan_in = (double)s->d[1] * rf;
        *fan_out = (double)s->d[0] * rf;
    } else {
        *fan_in = *fan_out = s->ndim ? (double)s->d[0] : 1.0;
    }
}

static void s_init_values(const tp_var_t *v, uint64_t seed, float *out) {
    tp_rng_t r;
    tp_rng_init(&r, seed, tp_hash_name_(v->name));
    double fi, fo;
    s_fans(&v->shape, &fi, &fo);
    double a;
    switch (v->init.kind) {
    case TP_INIT_ZEROS:
        memset(out, 0, v->count * sizeof(float));
        break;
    case TP_INIT_CONST:
        for (size_t i = 0; i < v->count; i++)
            out[i] = v->init.value;
        break;
    case TP_INIT_UNIFORM:
    case TP_INIT_GLOROT_UNIFORM:
        a = v->init.kind == TP_INIT_UNIFORM ? v->init.value
                                            : sqrt(6.0 / (fi + fo));
        for (size_t i = 0; i < v->count; i++)
            out[i] = (float)((2.0 * tp_rng_double(&r) - 1.0) * a);
        break;
    case TP_INIT_NORMAL:
    case TP_INIT_HE_NORMAL:
        a = v->init.kind == TP_INIT_NORMAL ? v->init.value : sqrt(2.0 / fi);
        for (size_t i = 0; i < v->count; i++)
            out[i] = (float)(tp_rng_normal(&r) * a);
        break;
    }
}

/* ---- planning ----------------------------------------------------------- */

static int s_differentiable(tp_op_kind_t k) {
    return k != TP_OP_ACCURACY && k != TP_OP_ERROR_COUNT && k != TP_OP_CAST &&
           k != TP_OP_INPUT && k != TP_OP_STOP_GRADIENT &&
           k != TP_OP_ARGMAX && k != TP_OP_TOP_K_ACCURACY; /* the reduce family's */
}

static size_t s_round(size_t bytes) {
    return (bytes + TP_ALIGNMENT - 1) & ~(size_t)(TP_ALIGNMENT - 1);
}

/* Fill a call record for node n at its run shapes (planned shapes during
 * planning), its gradients those of cost `cost`. xs/xshape/dx arrays are
 * the caller's, TP_OP_MAX_INPUTS long. */
static void s_make_call(tp_model_t *m, tp_tower_t *t, tp_node_t *n, int cost,
                        tp_op_call_t *c, const void **xs, tp_shape_t *xshape,
                        float **dx) {
    memset(c, 0, sizeof *c);
    c->kind = n->kind;
    c->attr = &n->attr;
    c->node = n;
    c->name = n->name;
    c->ninputs = n->ninputs;
    for (int i = 0; i < n->ninputs; i++) {
        xs[i] = n->inputs[i]->value;
        xshape[i] = n->inputs[i]->run_shape;
        dx[i] = (((n->inputs[i]->cost_mask >> cost) & 1u) &&
                 !((n->alias_mask >> i) & 1u))
                    ? n->inputs[i]->grad
                    : NULL;
    }
    /* a transpose NHWC -> NCHW folded into this conv2d (fold.c's
     * tp_plan_nhwc_): the call reads the transpose's input itself, NHWC,
     * and writes its gradient; xshape[0] stays the NCHW shape */
    if (n->ninputs > 0 && n->inputs[0]->nhwc_into == n) {
        const tp_node_t *src = n->inputs[0]->inputs[0];
        xs[0] = src->value;
        dx[0] = ((src->cost_mask >> cost) & 1u) ? src->grad : NULL;
        c->nhwc = 1;
    }
    c->x = xs;
    c->xshape = xshape;
    c->dx = dx;
    c->dx_acc = n->dx_acc + cost * n->ninputs;
    c->y = n->value;
    c->yshape = n->run_shape;
    c->dy = n->grad;
    c->workspace = n->workspace;
    c->workspace_bytes = n->workspace_bytes;
    if (n->kind == TP_OP_BATCH_NORM) {
        c->state[0] = n->state[0]->value;
        c->state[1] = n->state[1]->value;
    }
    if (n->fold_bias) {
        const tp_node_t *ba = n->fold_bias, *bv = ba->inputs[1];
        c->bias = bv->value;
        c->dbias = ((bv->cost_mask >> cost) & 1u) ? bv->grad : NULL;
        c->dbias_acc = ba->dx_acc[cost * ba->ninputs + 1];
    }
    if (n->fold_skip) { /* the add's other operand (fold.c's block end) */
        const tp_node_t *a = n->fold_skip;
        const int j = a->inputs[0] == n ? 1 : 0;
        const tp_node_t *sk = a->inputs[j];
        c->skip = sk->value;
        c->dskip = ((sk->cost_mask >> cost) & 1u) ? sk->grad : NULL;
        c->dskip_acc = a->dx_acc[cost * a->ninputs + j];
    }
    c->rng = &t->rng;
    /* operands kept nChw16c (fold.c's tp_plan_blk16_) */
    for (int i = 0; i < n->ninputs && i < 31; i++)
        if (n->inputs[i]->blk16)
            c->blk16 |= 1u << i;
    if (n->blk16)
        c->blk16 |= TP_BLK16_Y;
    (void)m;
}

static void s_set_run_shapes(tp_tower_t *t, int64_t batch) {
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *n = t->nodes[i];
        n->run_shape = n->shape;
        if (n->batched)
            n->run_shape.d[0] = batch;
    }
    t->run_batch = batch;
}

static int s_cmp_fuse(const void *a, const void *b) {
    const tp_node_t *x = *(tp_node_t *const *)a, *y = *(tp_node_t *const *)b;
    return y->fuse_after - x->fuse_after;
}

/* The one walk for the last writer of each variable's gradient: last[v]
 * is the id of the node whose backward writes variable v's gradient of
 * cost k last (backward runs from the highest id down: the lowest id among
 * its consumers that run backward for cost k; a folded node's inputs are
 * its caller's, whose backward comes later: the caller writes them), or
 * `never` when no node does. The fused updates and the all-reduce's
 * buckets both start from it. */
static void s_last_writers(const tp_model_t *m, const tp_tower_t *t, int k,
                           int never, int *last) {
    const unsigned bit = 1u << k;
    for (int v = 0; v < m->nvars; v++)
        last[v] = never;
    for (int i = 0; i < t->nnodes; i++) {
        const tp_node_t *c = t->nodes[i];
        if (!(c->cost_mask & bit) || c->kind == TP_OP_VARIABLE)
            continue;
        const int by = tp_node_caller_(c)->id;
        for (int j = 0; j < c->ninputs; j++) {
            const tp_node_t *in = c->inputs[j];
            if (in->kind == TP_OP_VARIABLE && (in->cost_mask & bit) &&
                by < last[in->var])
                last[in->var] = by;
        }
    }
}

/* For updates fused into the backward pass (a one-cost tower, so its
 * nodes' backward is cost 0's): after which node's backward is each
 * variable's gradient final, and which trainable variables the tower
 * never reaches. */
static tp_status_t s_plan_fusion(tp_model_t *m, tp_tower_t *t) {
    t->fuse = calloc((size_t)t->nnodes + 1, sizeof *t->fuse);
    t->fuse_rest = calloc((size_t)m->nvars + 1, sizeof *t->fuse_rest);
    unsigned char *covered = calloc((size_t)m->nvars + 1, 1);
    int *last = malloc(((size_t)m->nvars + 1) * sizeof *last);
    if (!t->fuse || !t->fuse_rest || !covered || !last) {
        free(covered);
        free(last);
        return tp_error(TP_ERR_NOMEM, "planning %s", t->name);
    }
    s_last_writers(m, t, 0, t->nnodes, last);
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *v = t->nodes[i];
        v->fuse_after = -1;
        if (v->kind == TP_OP_VARIABLE && v->backward && last[v->var] < t->nnodes)
            v->fuse_after = last[v->var];
        if (v->fuse_after >= 0) {
            t->fuse[t->nfuse++] = v;
            covered[v->var] = 1;
        }
    }
    free(last);
    qsort(t->fuse, (size_t)t->nfuse, sizeof *t->fuse, s_cmp_fuse);
    for (int i = 0; i < m->nvars; i++)
        if (m->vars[i].trainable && !covered[i])
            t->fuse_rest[t->nfuse_rest++] = i;
    free(covered);
    return TP_OK;
}

/* The all-reduce in buckets beside the backward pass (collective.c cuts
 * them): the trainable variables in arena order, each with the node after
 * whose backward its main-cost gradient is final. Every tower plans the
 * same buckets in the same order, as the collective needs. */
static tp_status_t s_plan_buckets(tp_model_t *m, tp_tower_t *t, size_t floats) {
    size_t nv = (size_t)m->nvars + 1;
    int *last = malloc(nv * sizeof *last), *after = malloc(nv * sizeof *after);
    size_t *offset = malloc(nv * sizeof *offset);
    tp_status_t rc = TP_OK;
    if (!last || !after || !offset) {
        rc = tp_error(TP_ERR_NOMEM, "planning %s's buckets", t->name);
    } else {
        s_last_writers(m, t, 0, t->nnodes, last);
        int n = 0;  /* trainable offsets grow with the variable's index */
        for (int i = 0; i < m->nvars; i++)
            if (m->vars[i].trainable) {
                offset[n] = m->vars[i].offset;
                after[n++] = last[i];
            }
        rc = tp_buckets_plan_(offset, after, n, m->ntrain, t->nnodes, floats,
                              &t->buckets, &t->nbuckets);
        if (rc < 0)
            rc = tp_error_wrap(rc, "planning %s's buckets", t->name);
    }
    free(last);
    free(after);
    free(offset);
    return rc;
}

/* Identity gradients (bias add's x, add's operands, reshape) need no copy:
 * when such a node is its input's only backward consumer, the input's
 * gradient buffer is the node's own. Saves a full pass over large
 * activations (a conv output feeding a bias add) in every step. */
static void s_plan_aliases(tp_tower_t *t) {
    int *cnt = calloc((size_t)t->nnodes + 1, sizeof *cnt);
    if (!cnt)
        return; /* no aliasing: correct, only slower */
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *c = t->nodes[i];
        if (!c->backward || c->kind == TP_OP_VARIABLE)
            continue;
        for (int j = 0; j < c->ninputs; j++)
            if (c->inputs[j]->backward)
                cnt[c->inputs[j]->id]++;
    }
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *c = t->nodes[i];
        /* folds set their own; an activation folded in is no identity */
        if (!c->backward || c->folded || c->attr.act != TP_ACT_NONE)
            continue;
        int nalias = c->kind == TP_OP_ADD ? 2
                     : (c->kind == TP_OP_BIAS_ADD || c->kind == TP_OP_RESHAPE) ? 1
                                                                               : 0;
        for (int j = 0; j < nalias; j++) {
            tp_node_t *in = c->inputs[j];
            /* a broadcast operand's gradient is a sum, not dy itself; a
             * reshape's input has dy's floats in dy's order whatever
             * its shape (the GPT's 8 reshapes copied 0.5 ms a step) */
            const int same = c->kind == TP_OP_RESHAPE ||
                             (in->shape.ndim == c->shape.ndim &&
                              !memcmp(in->shape.d, c->shape.d,
                                      sizeof(int64_t) * (size_t)c->shape.ndim));
            if (same && in->backward && in->kind != TP_OP_VARIABLE && !in->grad_alias &&
                cnt[in->id] == 1) {
                in->grad_alias = c;
                c->alias_mask |= 1u << j;
            }
        }
    }
    free(cnt);
}

/* The lifetimes of a tower's buffers on its timeline (tp_slot_t: the
 * forward of node i at step i, its backward at 2N - i, the cost's seed at
 * N), for tp_plan_slots_ to lay the short-lived ones over each other.
 * What stays live always (lo -1, its own bytes):
 * - every value: the backward reads most of them; a run of TP_RUN_BACKWARD
 *   alone reads the whole forward held from an earlier run; callbacks,
 *   monitors and summaries fetch outputs, the cost and any node after the
 *   step; a pruned run computes only part of the forward;
 * - the workspace of a node that runs backward: an op may keep state in it
 *   from its forward for its backward (batch norm's statistics, dropout's
 *   mask, max pooling's indices, oneDNN's copy of x, the fused attention's
 *   logsumexp), and a tower may run several backward passes (one per named
 *   cost) over one forward;
 * - an input's gradient (tp_tower_input_gradient reads it after the step).
 * What shares bytes:
 * - a node's output gradient: live from its first write (the backward of
 *   its last consumer, or the seed of a cost) to its own backward, which
 *   reads it. The nodes whose gradient is this buffer (aliases, folds) all
 *   count. A pass overwrites each gradient before it reads it (the first
 *   writer does not add), so nothing of a gradient outlives its pass;
 * - the workspace of a node that runs no backward: live only in its call. */
static void s_plan_lifetimes(tp_tower_t *t, tp_slot_t *slot) {
    const int N = t->nnodes;
    tp_slot_t *gslot = slot + N, *wslot = gslot + N;
    /* per node: the first and last step that touch its output gradient
     * (its own backward or its caller's reads it; its consumers' write
     * it), and how many writes it has */
    int *lo = malloc(((size_t)N * 3 + 1) * sizeof *lo);
    if (!lo)
        return; /* no reuse: correct, only larger */
    int *hi = lo + N, *writes = hi + N;
    for (int i = 0; i < N; i++) {
        const tp_node_t *n = t->nodes[i];
        if (wslot[i].bytes && !n->backward)
            wslot[i].lo = wslot[i].hi = i;
        int r = 2 * N - i, rc = 2 * N - tp_node_caller_(n)->id;
        lo[i] = r < rc ? r : rc;
        hi[i] = r > rc ? r : rc;
        writes[i] = 0;
    }
    for (int k = 0; k < t->ncosts; k++)
        if (t->costs[k]) { /* seeded before the pass */
            int c = t->costs[k]->id;
            lo[c] = N < lo[c] ? N : lo[c];
            writes[c]++;
        }
    for (int c = 0; c < N; c++) {
        const tp_node_t *cn = t->nodes[c];
        if (!cn->backward)
            continue;
        int s1 = 2 * N - c, s2 = 2 * N - tp_node_caller_(cn)->id;
        int a = s1 < s2 ? s1 : s2, z = s1 > s2 ? s1 : s2;
        for (int j = 0; j < cn->ninputs; j++) {
            int x = cn->inputs[j]->id;
            lo[x] = a < lo[x] ? a : lo[x];
            hi[x] = z > hi[x] ? z : hi[x];
            writes[x]++;
        }
    }
    for (int i = 0; i < N; i++)
        if (gslot[i].bytes && t->nodes[i]->kind != TP_OP_INPUT) {
            gslot[i].lo = INT_MAX;
            gslot[i].hi = INT_MIN;
        }
    /* a buffer's lifetime: the union of its nodes' (aliases, folds) */
    for (int i = 0; i < N; i++) {
        const tp_node_t *x = t->nodes[i];
        if (!x->backward || x->kind == TP_OP_VARIABLE)
            continue;
        const tp_node_t *o = x;
        while (o->grad_alias)
            o = o->grad_alias;
        tp_slot_t *g = &gslot[o->id];
        if (g->lo < 0)
            continue; /* kept live */
        /* read with no write in the step, or an input's (read after the
         * step, through the buffer of the consumer it aliases): keep it */
        if (!writes[i] || x->kind == TP_OP_INPUT) {
            g->lo = -1;
            continue;
        }
        g->lo = lo[i] < g->lo ? lo[i] : g->lo;
        g->hi = hi[i] > g->hi ? hi[i] : g->hi;
    }
    for (int i = 0; i < N; i++) /* a buffer no node reached: keep it */
        if (gslot[i].lo == INT_MAX)
            gslot[i].lo = -1;
    free(lo);
}

static tp_status_t s_plan_tower(tp_model_t *m, tp_tower_t *t) {
    tp_backend_t *b = tp_tower_backend_(t);
    t->costs[0] = t->cost;
    int train = t->training && m->opt && (t->cost || t->ncosts > 1);
    s_set_run_shapes(t, t->batch);
    int nc = t->ncosts;
    size_t nnodes = (size_t)t->nnodes;
    unsigned char *need = calloc(nnodes + 1, 2);
    if (!need)
        return tp_error(TP_ERR_NOMEM, "planning %s", t->name);
    unsigned char *path = need + nnodes + 1;
    /* Per cost: the nodes on its path that depend on one of its variables
     * run backward for it (bit k of cost_mask). The main cost's variables
     * are all trainable ones, so a one-cost tower plans as it always did. */
    for (int k = 0; k < nc; k++) {
        tp_node_t *cost = t->costs[k];
        if (!cost)
            continue;
        memset(need, 0, 2 * (nnodes + 1));
        for (int i = 0; i < t->nnodes; i++) {
            tp_node_t *n = t->nodes[i];
            if (n->kind == TP_OP_VARIABLE) {
                const tp_var_t *v = &m->vars[n->var];
                need[i] = v->trainable &&
                          (!t->cost_vars[k] || fnmatch(t->cost_vars[k], v->name, 0) == 0);
                if (k == 0)
                    n->needs_grad = v->trainable;
            } else if (n->kind == TP_OP_INPUT) {
                need[i] = n->want_grad; /* tp_tower_input_gradient */
            } else if (s_differentiable(n->kind)) {
                for (int j = 0; j < n->ninputs; j++) {
                    need[i] |= need[n->inputs[j]->id];
                    if (k == 0)
                        n->needs_grad |= n->inputs[j]->needs_grad;
                }
            }
        }
        path[cost->id] = 1;
        cost->on_cost_path = 1;
        for (int i = t->nnodes - 1; i >= 0; i--) {
            tp_node_t *n = t->nodes[i];
            if (!path[i] || !s_differentiable(n->kind))
                continue;
            for (int j = 0; j < n->ninputs; j++) {
                path[n->inputs[j]->id] = 1;
                n->inputs[j]->on_cost_path = 1;
            }
        }
        for (int i = 0; i < t->nnodes; i++)
            if (train && path[i] && need[i])
                t->nodes[i]->cost_mask |= 1u << k;
    }
    free(need);
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *n = t->nodes[i];
        n->backward = n->cost_mask != 0;
        if (nc > 1) {
            int *acc = calloc((size_t)(nc * (n->ninputs ? n->ninputs : 1)), sizeof *acc);
            if (!acc)
                return tp_error(TP_ERR_NOMEM, "planning %s", t->name);
            free(n->dx_acc);
            n->dx_acc = acc;
        }
    }
    /* Accumulation flags in backward order, per cost: the first writer of a
     * gradient overwrites it, later ones add, so no gradient is zeroed per
     * step. */
    size_t nn = (size_t)t->nnodes;
    unsigned char *written = calloc(nn + 1, 1);
    if (!written)
        return tp_error(TP_ERR_NOMEM, "planning %s", t->name);
    for (int k = 0; k < nc; k++) {
        memset(written, 0, nn + 1);
        for (int i = t->nnodes - 1; i >= 0; i--) {
            tp_node_t *n = t->nodes[i];
            if (!((n->cost_mask >> k) & 1u))
                continue;
            for (int j = 0; j < n->ninputs; j++) {
                tp_node_t *in = n->inputs[j];
                if (!((in->cost_mask >> k) & 1u))
                    continue;
                n->dx_acc[k * n->ninputs + j] = written[in->id];
                written[in->id] = 1;
            }
        }
    }
    free(written);
    if (m->config.fold) {
        tp_plan_folds_(t);
        tp_plan_nhwc_(t);  /* NHWC transposes into convs (fold.c, issue 42) */
        tp_plan_blk16_(t); /* nChw16c chains (fold.c, issue 49) */
        tp_plan_block_end_(t); /* bn + add + relu in one call (fold.c) */
    }
    s_plan_aliases(t);

    /* Sizes: values, gradients, workspaces, laid out in one arena; with
     * reuse (TP_PLAN_REUSE unset or not 0) those whose lifetimes do not
     * overlap share bytes (s_plan_lifetimes). */
    const int N = t->nnodes;
    tp_slot_t *slot = calloc((size_t)N * 3 + 1, sizeof *slot);
    if (!slot)
        return tp_error(TP_ERR_NOMEM, "planning %s", t->name);
    tp_slot_t *vslot = slot, *gslot = slot + N, *wslot = gslot + N;
    const void *xs[TP_OP_MAX_INPUTS];
    tp_shape_t xsh[TP_OP_MAX_INPUTS];
    float *dx[TP_OP_MAX_INPUTS];
    for (int i = 0; i < N; i++) {
        tp_node_t *n = t->nodes[i];
        size_t count = tp_shape_count(&n->shape);
        vslot[i].lo = gslot[i].lo = wslot[i].lo = -1;
        if (n->kind != TP_OP_VARIABLE && n->kind != TP_OP_RESHAPE && !n->folded &&
            !n->nhwc_into)
            vslot[i].bytes = s_round(count * tp_dtype_size(n->dtype));
        if (n->backward && n->kind != TP_OP_VARIABLE && !n->grad_alias && !n->nhwc_into)
            gslot[i].bytes = s_round(count * sizeof(float));
        if (n->kind != TP_OP_VARIABLE && n->kind != TP_OP_INPUT && !n->folded &&
            !n->nhwc_into) {
            /* the largest any cost's backward needs (the inputs it
             * differentiates can differ from cost to cost) */
            tp_op_call_t c;
            n->workspace_bytes = 0;
            for (int k = 0; k < t->ncosts; k++) {
                s_make_call(m, t, n, k, &c, xs, xsh, dx);
                size_t ws = b->ops->op_workspace(b, &c);
                if (ws > n->workspace_bytes)
                    n->workspace_bytes = ws;
            }
            wslot[i].bytes = s_round(n->workspace_bytes);
        }
    }
    /* read when the model is built, never in a run; 0 is the plan
     * without reuse (one slot each) that tests compare against */
    if (s_env_switch("TP_PLAN_REUSE", 1))
        s_plan_lifetimes(t, slot);
    size_t total = tp_plan_slots_(slot, 3 * N);
    if (total == (size_t)-1) {
        free(slot);
        return tp_error(TP_ERR_NOMEM, "planning %s", t->name);
    }
    t->act_bytes = total;
    tp_status_t mrc = tp_plan_memory_(t, total, 0);  /* refused before it is tried */
    t->act_arena = mrc < 0 ? NULL : b->ops->alloc(b, total ? total : TP_ALIGNMENT);
    if (!t->act_arena) {
        free(slot);
        return mrc < 0 ? mrc : tp_plan_memory_(t, total, 1);
    }
    m->memory += total;
    if (train) {
        /* past the arena, aligned (ntrain is padded): the global-norm
         * clip's sum of squares (s_clip_acc) */
        t->grads = b->ops->alloc(b, m->ntrain * sizeof(float) + 2 * TP_ALIGNMENT);
        if (!t->grads) {
            free(slot);
            return tp_error(TP_ERR_NOMEM, "%s: gradients", t->name);
        }
        m->memory += m->ntrain * sizeof(float);
        /* Gradients of variables this tower never reaches stay zero. */
        TP_TRY(b->ops->fill(b, t->stream, t->grads, 0.0f, m->ntrain));
    }
    char *base = t->act_arena;
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *n = t->nodes[i];
        if (n->kind == TP_OP_VARIABLE) {
            n->value = tp_var_data_(m, t->replica, n->var);
            if (n->backward)
                n->grad = t->grads + m->vars[n->var].offset;
        } else if (n->kind == TP_OP_RESHAPE) {
            n->value = n->inputs[0]->value;
        } else if (n->folded) {
            n->value = n->folded->value; /* planned already: a lower id */
        } else if (n->nhwc_into) {
            n->value = NULL; /* the conv reads its input (fold.c) */
        } else {
            n->value = base + vslot[i].off;
        }
        if (n->backward && n->kind != TP_OP_VARIABLE && !n->grad_alias && !n->nhwc_into)
            n->grad = (float *)(base + gslot[i].off);
        if (n->kind != TP_OP_VARIABLE && n->kind != TP_OP_INPUT && !n->folded &&
            !n->nhwc_into)
            n->workspace = base + wslot[i].off;
        if (n->kind == TP_OP_INPUT)
            n->workspace = n->value; /* kept: inputs may be borrowed */
    }
    /* consumers come later in the node list: resolve chains from the end */
    for (int i = t->nnodes - 1; i >= 0; i--)
        if (t->nodes[i]->grad_alias)
            t->nodes[i]->grad = t->nodes[i]->grad_alias->grad;
    free(slot);
    if (train && m->ntowers > 1 && m->config.bucket_bytes > 0 &&
        b->ops->allreduce_begin && b->ops->allreduce_end)
        TP_TRY(s_plan_buckets(m, t, (size_t)m->config.bucket_bytes / sizeof(float)));
    if (train && t->index == 0 && t->ncosts == 1)
        return s_plan_fusion(m, t);
    return TP_OK;
}

static tp_status_t s_build_tower(tp_model_t *m, const tp_model_desc_t *d,
                                 tp_tower_t *t) {
    t->input_nodes = calloc((size_t)d->ninputs + 1, sizeof(tp_node_t *));
    if (!t->input_nodes)
        return tp_error(TP_ERR_NOMEM, "tower inputs");
    for (int i = 0; i < d->ninputs; i++) {
        t->input_nodes[i] = tp_input_node_(t, i, &d->inputs[i], t->batch);
        if (!t->input_nodes[i])
            return t->status;
    }
    tp_status_t rc = d->build(t, t->input_nodes, d->user);
    if (t->status < 0)
        return t->status; /* the message names the node */
    if (rc < 0)
        return tp_error_wrap(rc, "%s: tower function", t->name);
    if (t->training && d->optimizer && !t->cost && t->ncosts == 1)
        return tp_error(TP_ERR_INVALID,
                        "%s: the tower function set no cost "
                        "(tp_tower_set_cost)",
                        t->name);
    return TP_OK;
}

static tp_status_t s_check_desc(const tp_model_desc_t *d,
                                const tp_model_config_t *c) {
    if (!d || !d->build)
        return tp_error(TP_ERR_INVALID, "model description without a tower "
                                        "function");
    if (d->ninputs < 0 || (d->ninputs > 0 && !d->inputs))
        return tp_error(TP_ERR_INVALID, "model description: %d inputs",
                        d->ninputs);
    if (c->towers < 0 || c->towers > 64)
        return tp_error(TP_ERR_INVALID, "%d towers (0..64)", c->towers);
    if (c->towers == 0 && c->infer_batch <= 0)
        return tp_error(TP_ERR_INVALID,
                        "no training towers and no inference graph");
    if (c->towers > 0 && c->batch <= 0)
        return tp_error(TP_ERR_INVALID, "batch %lld", (long long)c->batch);
    if (c->ndevices < 0 || c->ndevices > TP_MODEL_DEVICES_MAX)
        return tp_error(TP_ERR_INVALID, "%d devices (0..%d)", c->ndevices,
                        TP_MODEL_DEVICES_MAX);
    for (int r = 0; r < c->ndevices; r++) {
        const tp_backend_t *b = c->devices[r];
        if (!b)
            return tp_error(TP_ERR_INVALID, "devices[%d] is NULL", r);
        for (int q = 0; q < r; q++)
            if (c->devices[q] == b)
                return tp_error(TP_ERR_INVALID, "devices[%d] and devices[%d] "
                                "are the same backend", q, r);
        if (b->ops != c->devices[0]->ops)
            return tp_error(TP_ERR_INVALID, "devices[%d] is a %s backend, "
                            "devices[0] a %s one: one kind for every device",
                            r, b->ops->name, c->devices[0]->ops->name);
        if (r == 0 && c->backend && c->backend != b)
            return tp_error(TP_ERR_INVALID, "config.backend and devices[0] "
                            "differ (set one, or both the same)");
    }
    if (c->ndevices > 1 && c->towers < c->ndevices)  /* 1 device: inference too */
        return tp_error(TP_ERR_INVALID, "%d training towers on %d devices: "
                        "every device needs a tower", c->towers, c->ndevices);
    for (int i = 0; i < d->ninputs; i++) {
        const tp_input_desc_t *in = &d->inputs[i];
        if (!in->name || !*in->name)
            return tp_error(TP_ERR_INVALID, "input %d has no name", i);
        if (!tp_dtype_valid((int)in->dtype))
            return tp_error(TP_ERR_INVALID, "input '%s': bad dtype", in->name);
        if (in->ndim < 1 || in->ndim > TP_MAX_DIMS)
            return tp_error(TP_ERR_SHAPE,
                            "input '%s': %d dims (the batch dim counts)",
                            in->name, in->ndim);
        for (int k = 1; k < in->ndim; k++)
            if (in->shape[k] <= 0)
                return tp_error(TP_ERR_SHAPE, "input '%s': dim %d is %lld",
                                in->name, k, (long long)in->shape[k]);
    }
    return TP_OK;
}

/* Replica r's arenas and slots, with the initial values (the same in
 * every replica: they are drawn from the seed alone). */
static tp_status_t s_replica_init(tp_model_t *m, int r) {
    tp_replica_t *rp = &m->rep[r];
    tp_backend_t *b = rp->backend;
    rp->stream = b->ops->stream_new(b);
    if (!rp->stream)
        return tp_error(TP_ERR_NOMEM, "model stream (device %d)", b->device);
    rp->train_arena = b->ops->alloc(b, m->ntrain * sizeof(float) + TP_ALIGNMENT);
    rp->model_arena = b->ops->alloc(b, m->nmodel * sizeof(float) + TP_ALIGNMENT);
    if (!rp->train_arena || !rp->model_arena)
        return tp_error(TP_ERR_NOMEM, "variables: %zu floats (device %d)",
                        m->ntrain + m->nmodel, b->device);
    m->memory += (m->ntrain + m->nmodel) * sizeof(float);
    TP_TRY(b->ops->fill(b, rp->stream, rp->train_arena, 0.0f, m->ntrain));
    TP_TRY(b->ops->fill(b, rp->stream, rp->model_arena, 0.0f, m->nmodel));
    size_t maxc = 1;
    for (int i = 0; i < m->nvars; i++)
        if (m->vars[i].count > maxc)
            maxc = m->vars[i].count;
    float *host = malloc(maxc * sizeof(float));
    if (!host)
        return tp_error(TP_ERR_NOMEM, "initial values");
    for (int i = 0; i < m->nvars; i++) {
        if (i >= m->nreal)
            break;  /* shadows: zeros, the averages the weights (below) */
        s_init_values(&m->vars[i], m->config.seed, host);
        tp_status_t rc = b->ops->copy(b, rp->stream, tp_var_data_(m, r, i), host,
                                      m->vars[i].count * sizeof(float),
                                      TP_COPY_H2D);
        if (rc < 0) {
            free(host);
            return rc;
        }
    }
    free(host);
    if (m->nema)
        TP_TRY(b->ops->copy(b, rp->stream, rp->model_arena + m->ema_offset,
                            rp->train_arena, m->ntrain * sizeof(float), TP_COPY_D2D));
    for (int s = 0; s < m->nslots; s++) {
        rp->slots[s] = b->ops->alloc(b, m->ntrain * sizeof(float) + TP_ALIGNMENT);
        if (!rp->slots[s])
            return tp_error(TP_ERR_NOMEM, "optimizer slots (device %d)", b->device);
        TP_TRY(b->ops->fill(b, rp->stream, rp->slots[s], 0.0f, m->ntrain));
        m->memory += m->ntrain * sizeof(float);
    }
    return b->ops->stream_sync(b, rp->stream);
}

/* Variables whose learning-rate multiplier is 0 are frozen: made
 * model-only before anything is planned, so that no node computes a
 * gradient for them (autodiff plans from the trainable flag), and they get
 * no slots, no update, no average. A pattern that decides no trainable
 * variable (a typo in tp-train --freeze) would change nothing unseen:
 * refused, naming it and some of the variables. */
static tp_status_t s_freeze(tp_model_t *m) {
    int n = 0, left = 0;
    const tp_var_t *last = NULL;
    unsigned used = 0;  /* bit k: pattern k decides a trainable variable */
    char names[512];
    size_t off = 0;
    names[0] = '\0';
    for (int i = 0; i < m->nvars; i++) {
        tp_var_t *v = &m->vars[i];
        if (!v->trainable)
            continue;
        int k = tp_optimizer_lr_mult_index(m->opt, v->name);
        if (k >= 0 && k < 32)
            used |= 1u << k;
        if (off < sizeof names - 1) {
            int w = snprintf(names + off, sizeof names - off, "%s%s", off ? ", " : "",
                             v->name);
            off = w < 0 ? sizeof names : off + (size_t)w;
        }
        if (tp_optimizer_lr_mult(m->opt, v->name) == 0) {
            v->trainable = 0;
            last = v;
            n++;
        } else {
            left++;
        }
    }
    for (int k = 0; k < tp_optimizer_lr_mult_count(m->opt) && k < 32; k++)
        if (!(used & (1u << k)))
            return tp_error(TP_ERR_INVALID, "model: the learning-rate pattern '%s' decides "
                            "no trainable variable (none matches it, or an earlier "
                            "pattern matches first); the trainable variables: %s%s",
                            tp_optimizer_lr_mult_pattern(m->opt, k), names,
                            off >= sizeof names - 1 ? " ..." : "");
    /* Nothing left to train: said here, before the first step, naming
     * the pattern (else the first step fails with "no fresh gradients") */
    if (n && !left)
        return tp_error(TP_ERR_INVALID, "model: the learning-rate multiplier 0 of "
                        "pattern '%s' froze every trainable variable (all %d, e.g. %s): "
                        "nothing is left to train",
                        tp_optimizer_lr_mult_pattern(
                            m->opt, tp_optimizer_lr_mult_index(m->opt, last->name)),
                        n, last->name);
    if (n)
        TP_INFO("model: %d variable%s frozen (learning-rate multiplier 0)", n,
                n > 1 ? "s" : "");
    return TP_OK;
}

/* The update of the trainable floats [lo, hi) of replica rp from grads
 * [ntrain] on stream s: one call, or with learning-rate or weight-decay
 * multipliers one per variable in the range, each at its own rate and
 * decay (the padding between variables, zero in both, needs none). */
static tp_status_t s_apply(tp_model_t *m, tp_replica_t *rp, tp_stream_t *s,
                           const float *grads, size_t lo, size_t hi) {
    if (hi <= lo)
        return TP_OK;
    if (tp_optimizer_lr_mult_count(m->opt) == 0 && tp_optimizer_decay_mult_count(m->opt) == 0)
        return tp_optimizer_update(m->opt, rp->backend, s, rp->train_arena, grads,
                                   rp->slots, lo, hi - lo);
    for (int i = 0; i < m->nvars; i++) {
        const tp_var_t *v = &m->vars[i];
        if (!v->trainable)
            continue;
        size_t a = v->offset > lo ? v->offset : lo;
        size_t z = v->offset + v->count < hi ? v->offset + v->count : hi;
        if (z > a)
            TP_TRY(tp_optimizer_update_group(m->opt, rp->backend, s, rp->train_arena,
                                             grads, rp->slots, a, z - a,
                                             tp_optimizer_lr_mult(m->opt, v->name),
                                             tp_optimizer_decay_mult(m->opt, v->name)));
    }
    return TP_OK;
}

/* Shadow model-only variables "optimizer/<var>/<suffix>", one per
 * trainable variable, appended after every other variable in the
 * trainable ones' order, so that their values lie in the model arena
 * exactly as the weights lie in the trainable arena (one call covers them
 * all; s_shadow_offset checks it): the weights' average (ema_decay) and
 * the sum of accumulated gradients (accumulate). Checkpoints save and load
 * them as variables; their names make a weights-only load skip them.
 * *first: the first one's index; *n: how many. */
static tp_status_t s_plan_shadows(tp_model_t *m, const char *suffix, int *first,
                                  int *n) {
    int ntr = 0;
    for (int i = 0; i < m->nreal; i++)
        ntr += m->vars[i].trainable;
    if (m->nvars + ntr + 1 > m->cap_vars) {  /* + 1: accumulate's count */
        tp_var_t *nv = realloc(m->vars, (size_t)(m->nvars + ntr + 1) * sizeof *nv);
        if (!nv)
            return tp_error(TP_ERR_NOMEM, "the optimizer's %s variables", suffix);
        m->vars = nv;
        m->cap_vars = m->nvars + ntr + 1;
    }
    *first = m->nvars;
    *n = 0;
    for (int i = 0; i < m->nreal; i++) {
        const tp_var_t *v = &m->vars[i];
        if (!v->trainable)
            continue;
        size_t len = strlen(v->name) + strlen(suffix) + 13;
        tp_var_t *e = &m->vars[m->nvars];
        memset(e, 0, sizeof *e);
        if (!(e->name = malloc(len)))
            return tp_error(TP_ERR_NOMEM, "the optimizer's %s variables", suffix);
        snprintf(e->name, len, "optimizer/%s/%s", v->name, suffix);
        e->shape = v->shape;
        e->count = v->count;
        e->init = (tp_init_t){TP_INIT_ZEROS, 0};
        m->nvars++;
        (*n)++;
    }
    return TP_OK;
}

/* Shadows from vars[first] on, once placed: their block's offset in the
 * model arena, where each lies as its variable does in the trainable one. */
static size_t s_shadow_offset(const tp_model_t *m, int first) {
    size_t base = m->vars[first].offset;
    for (int j = 0, i = 0; i < m->nreal; i++) {
        if (!m->vars[i].trainable)
            continue;
        TP_ASSERT(m->vars[first + j].offset == base + m->vars[i].offset);
        j++;
    }
    return base;
}

/* The segments of the trainable arena for allreduce_sgd_wd: a cut at each
 * trainable variable's first float and after its last (the padding
 * between two is a segment of its own, zero in weights and gradients
 * alike), when their offsets increase with their index; nwd 0: none
 * (s_reduce_update then leaves a decayed SGD to s_apply). */
static tp_status_t s_plan_decay_segments(tp_model_t *m) {
    if (!m->opt || !m->backend->ops->allreduce_sgd_wd)
        return TP_OK;
    const size_t cap = 2 * (size_t)m->nvars + 2;
    size_t *seg = malloc(cap * sizeof *seg);
    int *var = malloc(cap * sizeof *var);
    if (!seg || !var) {
        free(seg), free(var);
        return tp_error(TP_ERR_NOMEM, "the decay's segments: %d variables", m->nvars);
    }
    int n = 0;
    seg[0] = 0;
    for (int i = 0; i < m->nvars; i++) {
        const tp_var_t *v = &m->vars[i];
        if (!v->trainable || v->count == 0)
            continue;
        if (v->offset < seg[n] || v->offset + v->count > m->ntrain) {
            free(seg), free(var);  /* not in order: no fused decay */
            return TP_OK;
        }
        if (v->offset > seg[n])
            var[n] = -1, seg[++n] = v->offset;
        var[n] = i, seg[++n] = v->offset + v->count;
    }
    if (seg[n] < m->ntrain)
        var[n] = -1, seg[++n] = m->ntrain;
    m->wd_decay = n ? malloc((size_t)m->ntowers * (size_t)n * sizeof *m->wd_decay) : NULL;
    if (!m->wd_decay) {
        free(seg), free(var);
        return n ? tp_error(TP_ERR_NOMEM, "the decay's segments: %d", n) : TP_OK;
    }
    m->wd_seg = seg;
    m->wd_var = var;
    m->nwd = n;
    return TP_OK;
}

/* Gradient accumulation's sum and its count of steps (a [1] variable, so
 * that a checkpoint taken mid-sum resumes exactly). */
static tp_status_t s_plan_accumulation(tp_model_t *m) {
    TP_TRY(s_plan_shadows(m, "accum", &m->acc_first, &m->nacc));
    tp_var_t *c = &m->vars[m->nvars];
    memset(c, 0, sizeof *c);
    if (!(c->name = strdup("optimizer/accumulated")))
        return tp_error(TP_ERR_NOMEM, "the optimizer's accumulation count");
    c->shape.ndim = 1;
    c->shape.d[0] = 1;
    c->count = 1;
    c->init = (tp_init_t){TP_INIT_ZEROS, 0};
    m->acc_count_var = m->nvars++;
    return TP_OK;
}

static tp_status_t s_model_init(tp_model_t *m, const tp_model_desc_t *d) {
    const tp_model_config_t *c = &m->config;
    m->ninputs = d->ninputs;
    m->inputs = calloc((size_t)d->ninputs + 1, sizeof *m->inputs);
    if (!m->inputs)
        return tp_error(TP_ERR_NOMEM, "model inputs");
    memcpy(m->inputs, d->inputs, (size_t)d->ninputs * sizeof *m->inputs);
    if (d->optimizer && c->towers > 0) {
        m->opt = d->optimizer(d->user);
        if (!m->opt)
            return tp_error(TP_ERR_INVALID, "the optimizer factory gave NULL");
    }
    m->ntowers = c->towers;
    m->towers = calloc((size_t)c->towers + 1, sizeof *m->towers);
    m->step = calloc((size_t)c->towers + 1, sizeof *m->step);
    if (!m->towers || !m->step)
        return tp_error(TP_ERR_NOMEM, "towers");
    int ntotal = c->towers + (c->infer_batch > 0);
    for (int i = 0; i < ntotal; i++) {
        int infer = i == c->towers;
        tp_tower_t *t = tp_tower_new_(m, infer ? -1 : i, !infer,
                                      infer ? c->infer_batch : c->batch);
        if (!t)
            return tp_error(TP_ERR_NOMEM, "tower");
        if (infer)
            m->infer = t;
        else
            m->towers[i] = t;
        tp_backend_t *b = tp_tower_backend_(t);
        t->stream = b->ops->stream_new(b);
        if (!t->stream)
            return tp_error(TP_ERR_NOMEM, "tower stream");
        tp_rng_init(&t->rng, c->seed ^ 0x5eed0f70e75ull, (uint64_t)(int64_t)t->index);
        TP_TRY(s_build_tower(m, d, t));
        if (!infer && b->device >= 0 && b->ops->host_alloc && b->ops->copy_async &&
            t->noutputs > 0 &&
            !(t->mirror = b->ops->host_alloc(b, 3 * (size_t)t->noutputs * sizeof(float))))
            return tp_error_wrap(TP_ERR_NOMEM, "%s: its outputs' host mirror", t->name);
        t->mirror_ready = t->mirror_inflight = -1;
    }
    if (m->opt && tp_optimizer_lr_mult_count(m->opt) > 0)
        TP_TRY(s_freeze(m));
    m->nreal = m->nvars;
    if (m->opt && tp_optimizer_ema_decay(m->opt) > 0)
        TP_TRY(s_plan_shadows(m, "ema", &m->ema_first, &m->nema));
    if (m->opt && tp_optimizer_accumulate(m->opt) > 1 && m->ntowers > 0)
        TP_TRY(s_plan_accumulation(m));
    /* Variables: offsets, arenas, initial values. */
    for (int i = 0; i < m->nvars; i++) {
        tp_var_t *v = &m->vars[i];
        size_t *used = v->trainable ? &m->ntrain : &m->nmodel;
        v->offset = *used;
        *used += (v->count + FLOAT_ALIGN - 1) / FLOAT_ALIGN * FLOAT_ALIGN;
    }
    if (m->nema)
        m->ema_offset = s_shadow_offset(m, m->ema_first);
    if (m->nacc)
        m->acc_offset = s_shadow_offset(m, m->acc_first);
    if (m->opt)
        m->nslots = tp_optimizer_slot_count(m->opt);
    for (int r = 0; r < m->nrep; r++)
        TP_TRY(s_replica_init(m, r));
    if (m->nema && !(m->ema_saved = m->backend->ops->alloc(
                         m->backend, m->ntrain * sizeof(float) + TP_ALIGNMENT)))
        return tp_error(TP_ERR_NOMEM, "the weights' average: %zu floats", m->ntrain);
    m->memory += m->nema ? m->ntrain * sizeof(float) : 0;
    for (int i = 0; i < m->ntowers; i++)
        TP_TRY(s_plan_tower(m, m->towers[i]));
    if (m->infer)
        TP_TRY(s_plan_tower(m, m->infer));
    if (m->ntowers > 1) {
        m->comm = m->backend->ops->comm_new(m->backend, m->ntowers);
        if (!m->comm)
            return tp_error_wrap(TP_ERR_NOMEM, "communicator");
        TP_TRY(s_plan_decay_segments(m));
    }
    return TP_OK;
}

/* Destroy the backends a failed tp_model_new was given, each once. */
static void s_release_backends(tp_model_config_t *c) {
    tp_backend_t *all[TP_MODEL_DEVICES_MAX + 1];
    int n = 0, nd = c->ndevices < TP_MODEL_DEVICES_MAX ? c->ndevices
                                                       : TP_MODEL_DEVICES_MAX;
    for (int r = -1; r < nd; r++) {
        tp_backend_t *b = r < 0 ? c->backend : c->devices[r];
        int seen = !b;
        for (int q = 0; q < n; q++)
            seen |= all[q] == b;
        if (!seen)
            all[n++] = b;
    }
    for (int q = 0; q < n; q++)
        tp_backend_destroy(&all[q]);
}

tp_model_t *tp_model_new(const tp_model_desc_t *desc,
                         const tp_model_config_t *config) {
    tp_model_config_t c = config ? *config : tp_model_config_default();
    tp_model_t *m = NULL;
    if (s_check_desc(desc, &c) == TP_OK && !(m = calloc(1, sizeof *m)))
        tp_error(TP_ERR_NOMEM, "model");
    if (!m) {
        if (c.own_backend)  /* taken, also on failure */
            s_release_backends(&c);
        return NULL;
    }
    m->config = c;
    m->nrep = c.ndevices > 1 ? c.ndevices : 1;
    for (int r = 1; r < m->nrep; r++)
        m->rep[r].backend = c.devices[r];
    if (c.ndevices >= 1) {
        m->backend = c.devices[0];
        m->own_backend = c.own_backend;
    } else if (c.backend) {
        m->backend = c.backend;
        m->own_backend = c.own_backend;
    } else {
        m->backend = tp_backend_cpu_new(c.threads);
        m->own_backend = 1;
        if (!m->backend) {
            free(m);
            return NULL;
        }
    }
    m->rep[0].backend = m->backend;
    s_config_resolve(&m->config, m->backend);
    tp_status_t rc = s_model_init(m, desc);
    if (rc < 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tp_last_error());
        tp_model_destroy(&m);
        tp_error(rc, "%s", msg);
        return NULL;
    }
    /* no training tower: a predictor's or a sampler's model */
    char towers[48];
    if (m->ntowers)
        snprintf(towers, sizeof towers, "%d tower%s", m->ntowers, m->ntowers > 1 ? "s" : "");
    else
        snprintf(towers, sizeof towers, "inference only");
    TP_INFO("model: %s on %d device%s, %d variables (%zu trainable "
            "floats), %zu bytes planned", towers, m->nrep,
            m->nrep > 1 ? "s" : "", m->nvars, m->ntrain, m->memory);
    return m;
}

static void s_tower_free(tp_tower_t **t_p) {
    tp_tower_t *t = *t_p;
    if (!t)
        return;
    tp_backend_t *b = tp_tower_backend_(t);
    if (t->graph && b->ops->graph_destroy)
        b->ops->graph_destroy(b, t->graph);
    if (t->prof_timer)
        b->ops->timer_destroy(b, t->prof_timer);
    free(t->prof_node);
    free(t->prof_bwd);
    if (t->mirror)
        b->ops->host_free(b, t->mirror);
    if (t->act_arena)
        b->ops->free(b, t->act_arena);
    if (t->grads)
        b->ops->free(b, t->grads);
    if (t->stream)
        b->ops->stream_destroy(b, t->stream);
    tp_tower_destroy_(t_p);
}

void tp_model_destroy(tp_model_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_model_t *m = *self_p;
    tp_backend_t *b = m->backend;
    if (tp_model_drain_(m) < 0)  /* a step queued ahead: done before freeing */
        TP_WARN("model destroyed after a failed step: %s", tp_last_error());
    for (int i = 0; m->towers && i < m->ntowers; i++)
        s_tower_free(&m->towers[i]);
    free(m->towers);
    free(m->step);
    s_tower_free(&m->infer);
    if (m->comm)
        b->ops->comm_destroy(b, m->comm);
    if (m->ranks)
        b->ops->comm_destroy(b, m->ranks);
    free(m->wd_seg);
    free(m->wd_var);
    free(m->wd_decay);
    for (int r = 0; r < m->nrep; r++) {
        tp_replica_t *rp = &m->rep[r];
        tp_backend_t *rb = rp->backend;
        if (!rb)
            continue;
        if (rp->train_arena)
            rb->ops->free(rb, rp->train_arena);
        if (rp->model_arena)
            rb->ops->free(rb, rp->model_arena);
        for (int s = 0; s < 2; s++)
            if (rp->slots[s])
                rb->ops->free(rb, rp->slots[s]);
        if (rp->stream)
            rb->ops->stream_destroy(rb, rp->stream);
    }
    if (m->ema_saved)
        b->ops->free(b, m->ema_saved);
    for (int i = 0; i < m->nvars; i++)
        free(m->vars[i].name);
    free(m->vars);
    free(m->inputs);
    free(m->name);
    for (int i = 0; i < 2 * m->nmeta; i++)
        free(m->meta[i]);
    free(m->meta);
    tp_optimizer_destroy(&m->opt);
    if (m->own_backend)
        for (int r = m->nrep - 1; r >= 0; r--)
            tp_backend_destroy(&m->rep[r].backend);
    free(m);
    *self_p = NULL;
}

/* ---- running ------------------------------------------------------------ */

static tp_status_t s_load_inputs(tp_model_t *m, tp_tower_t *t,
                                 const tp_tensor_t *inputs) {
    if (m->ninputs > 0 && !inputs)
        return tp_error(TP_ERR_INVALID, "%s: no input tensors", t->name);
    int64_t batch = -1;
    char got[128];
    for (int i = 0; i < m->ninputs; i++) {
        const tp_input_desc_t *d = &m->inputs[i];
        const tp_tensor_t *x = &inputs[i];
        if (t->input_nodes[i]->pruned)
            continue; /* no wanted output reads it: any tensor will do */
        int ok = x->dtype == d->dtype && x->ndim == d->ndim && x->ndim >= 1;
        for (int k = 1; ok && k < d->ndim; k++)
            ok = x->shape[k] == d->shape[k];
        if (!ok) {
            /* what the model takes, as [batch,28,28] */
            char want[128];
            int w = snprintf(want, sizeof want, "%s[batch", tp_dtype_name(d->dtype));
            for (int k = 1; k < d->ndim && w > 0 && (size_t)w < sizeof want; k++)
                w += snprintf(want + w, sizeof want - (size_t)w, ",%lld",
                              (long long)d->shape[k]);
            if (w > 0 && (size_t)w < sizeof want)
                snprintf(want + w, sizeof want - (size_t)w, "]");
            tp_tensor_describe(x, got, sizeof got);
            return tp_error(TP_ERR_SHAPE, "%s: input %d '%s' is %s, the model takes %s",
                            t->name, i, d->name, got, want);
        }
        if (x->shape[0] < 1 || x->shape[0] > t->batch)
            return tp_error(TP_ERR_SHAPE,
                            "%s: input '%s' has batch %lld; the graph is "
                            "planned for 1..%lld",
                            t->name, d->name, (long long)x->shape[0],
                            (long long)t->batch);
        if (batch >= 0 && x->shape[0] != batch)
            return tp_error(TP_ERR_SHAPE,
                            "%s: input '%s' has batch %lld, input 0 has %lld",
                            t->name, d->name, (long long)x->shape[0],
                            (long long)batch);
        batch = x->shape[0];
        if (x->nbytes && !x->data)
            return tp_error(TP_ERR_INVALID, "%s: input '%s' has no data",
                            t->name, d->name);
    }
    if (batch < 0)
        batch = t->batch;
    if (batch != t->run_batch)
        s_set_run_shapes(t, batch);
    tp_backend_t *b = tp_tower_backend_(t);
    for (int i = 0; i < m->ninputs; i++) {
        tp_node_t *n = t->input_nodes[i];
        if (n->pruned)
            continue;
        if (b->device < 0) {
            /* host memory is the CPU backend's memory: borrow, no copy */
            n->value = inputs[i].data;
            continue;
        }
        n->value = n->workspace; /* the planned device buffer */
        if (inputs[i].data == n->workspace)
            continue; /* filled there already (tp_model_fill_noise) */
        TP_TRY(b->ops->copy(b, t->stream, n->value, inputs[i].data,
                            inputs[i].nbytes, TP_COPY_H2D));
    }
    return TP_OK;
}

/* ---- gradient processing: the global-norm clip -------------------------
 *
 * The optimizer's clip_norm (tensorpack's GlobalNormClip) scales the
 * step's gradients by min(1, clip / global norm) before the update, the
 * norm over every gradient the update applies, once they are final (after
 * the all-reduce). The sum of squares lives on the device, one float past
 * the tower's gradient arena, and the scale is read there: no host sync,
 * and a recorded step records both calls. */

static float *s_clip_acc(const tp_model_t *m, const tp_tower_t *t) {
    return t->grads + m->ntrain;
}

static double s_clip(const tp_model_t *m) {
    return m->opt ? tp_optimizer_clip_norm(m->opt) : 0.0;
}

static tp_status_t s_clip_check(const tp_model_t *m, const tp_backend_t *b) {
    if (s_clip(m) > 0 && (!b->ops->grad_sumsq || !b->ops->grad_clip))
        return tp_error(TP_ERR_UNSUPPORTED, "clip_norm %g: the %s backend "
                        "cannot clip gradients", s_clip(m), b->ops->name);
    return TP_OK;
}

/* Tower t's gradients [lo, hi) scaled by the clip of the norm of all of
 * [0, ntrain): every tower holds the same all-reduced sum, so towers that
 * each clip their own slice agree with one that clips the whole. */
static tp_status_t s_clip_range(tp_model_t *m, tp_tower_t *t, tp_stream_t *s,
                                size_t lo, size_t hi) {
    const double clip = s_clip(m);
    if (!(clip > 0) || hi <= lo)
        return TP_OK;
    tp_backend_t *b = tp_tower_backend_(t);
    TP_TRY(s_clip_check(m, b));
    TP_TRY(b->ops->grad_sumsq(b, s, t->grads, m->ntrain, s_clip_acc(m, t), 0));
    return b->ops->grad_clip(b, s, t->grads + lo, hi - lo, (float)clip,
                             s_clip_acc(m, t));
}

/* ---- the weights' average (ema_decay) ---------------------------------- */

/* After replica r's weights [lo, hi) were updated: their average's same
 * floats, on stream s behind the update. */
static tp_status_t s_ema_range(tp_model_t *m, int r, tp_stream_t *s, size_t lo,
                               size_t hi) {
    if (!m->nema || hi <= lo)
        return TP_OK;
    tp_replica_t *rp = &m->rep[r];
    tp_backend_t *b = rp->backend;
    if (!b->ops->ema_update)
        return tp_error(TP_ERR_UNSUPPORTED, "ema_decay: the %s backend keeps no "
                        "average of the weights", b->ops->name);
    return b->ops->ema_update(b, s, rp->model_arena + m->ema_offset + lo,
                              rp->train_arena + lo, hi - lo,
                              (float)tp_optimizer_ema_decay(m->opt));
}

/* ---- gradient accumulation (accumulate) --------------------------------- */

/* Steps per update: the optimizer's accumulate once the model planned its
 * sum, else 1. */
static int s_accum(const tp_model_t *m) {
    return m->nacc ? tp_optimizer_accumulate(m->opt) : 1;
}

/* How many steps' gradients are in the sum: replica r's count variable,
 * read on stream s. */
static tp_status_t s_acc_count(tp_model_t *m, int r, tp_stream_t *s, int *count) {
    tp_backend_t *b = m->rep[r].backend;
    float f = 0;
    TP_TRY(b->ops->copy(b, s, &f, tp_var_data_(m, r, m->acc_count_var), sizeof f,
                        TP_COPY_D2H));
    TP_TRY(b->ops->stream_sync(b, s));
    *count = (int)f;
    return TP_OK;
}

/* Every replica's count variable set to `count` (from the thread that
 * closes the step). */
static tp_status_t s_acc_set(tp_model_t *m, int count) {
    const float f = (float)count;
    for (int r = 0; r < m->nrep; r++) {
        tp_replica_t *rp = &m->rep[r];
        TP_TRY(rp->backend->ops->copy(rp->backend, rp->stream,
                                      tp_var_data_(m, r, m->acc_count_var), &f,
                                      sizeof f, TP_COPY_H2D));
        TP_TRY(rp->backend->ops->stream_sync(rp->backend, rp->stream));
    }
    return TP_OK;
}

/* The step's gradients at replica rp's update, `count` steps' already in
 * the sum: before the K-th step, grads[lo, hi) go into the sum (the first
 * step's copied) and *apply is 0; at the K-th, all of grads become the
 * mean of the K steps' (a clip needs every one; the sum is only read) and
 * *apply is 1. Without accumulation *apply is 1 and nothing is done. */
static tp_status_t s_accumulate(tp_model_t *m, tp_replica_t *rp, tp_stream_t *s,
                                float *grads, size_t lo, size_t hi, int count,
                                int *apply) {
    const int k = s_accum(m);
    *apply = 1;
    if (k <= 1)
        return TP_OK;
    tp_backend_t *b = rp->backend;
    if (!b->ops->grad_accumulate)
        return tp_error(TP_ERR_UNSUPPORTED, "accumulate %d: the %s backend cannot "
                        "accumulate gradients", k, b->ops->name);
    float *sum = rp->model_arena + m->acc_offset;
    if (count + 1 < k) {
        *apply = 0;
        if (hi <= lo)
            return TP_OK;
        if (count == 0)
            return b->ops->copy(b, s, sum + lo, grads + lo, (hi - lo) * sizeof(float),
                                TP_COPY_D2D);
        return b->ops->grad_accumulate(b, s, sum + lo, grads + lo, hi - lo, 0, 0.0f);
    }
    return b->ops->grad_accumulate(b, s, sum, grads, m->ntrain, 1, (float)(1.0 / k));
}

tp_status_t tp_model_use_ema(tp_model_t *m, int on) {
    if (!m)
        return tp_error(TP_ERR_INVALID, "use_ema: no model");
    if (!m->nema)
        return tp_error(TP_ERR_STATE, "use_ema: the model keeps no average of its "
                        "weights (set the optimizer's ema_decay in its factory, "
                        "before the model is built)");
    on = on != 0;
    if (on == m->ema_in_use)
        return TP_OK;
    TP_TRY(tp_model_drain_(m));  /* a step queued ahead reads the weights */
    tp_replica_t *rp = &m->rep[0];
    tp_backend_t *b = rp->backend;
    const size_t bytes = m->ntrain * sizeof(float);
    if (on) {
        TP_TRY(b->ops->copy(b, rp->stream, m->ema_saved, rp->train_arena, bytes,
                            TP_COPY_D2D));
        TP_TRY(b->ops->copy(b, rp->stream, rp->train_arena,
                            rp->model_arena + m->ema_offset, bytes, TP_COPY_D2D));
    } else {
        TP_TRY(b->ops->copy(b, rp->stream, rp->train_arena, m->ema_saved, bytes,
                            TP_COPY_D2D));
    }
    TP_TRY(b->ops->stream_sync(b, rp->stream));
    m->ema_in_use = on;
    for (int i = 0; i < m->ntowers; i++)
        m->step[i].forward = 0;  /* other weights than the held forward's */
    return TP_OK;
}

int tp_model_ema_in_use(const tp_model_t *m) { return m && m->ema_in_use; }

static tp_status_t s_update_var(tp_model_t *m, tp_tower_t *t, int vi) {
    const tp_var_t *v = &m->vars[vi];
    tp_replica_t *rp = &m->rep[t->replica];
    return s_apply(m, rp, t->stream, t->grads, v->offset, v->offset + v->count);
}

/* Profiling with the device's timer: a mark before and after op call k
 * of the run (2 + 2k, 3 + 2k); calls past the marks' room go untimed. */
/* CPU time of the calling (tower) thread and of the whole process, for
 * the profile: the thread's is the op's critical path on this thread
 * whatever the machine's other load (a wall clock under-reads a loaded
 * host by half), and the process's less the thread's is what the op's
 * OpenMP team (oneDNN, OpenBLAS, cpu_pool.c's ranges) did besides, spin
 * waits included. */
static void s_prof_cpu(uint64_t *thr, uint64_t *proc) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    *thr = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    *proc = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void s_prof_mark(tp_tower_t *t, tp_node_t *n, int bwd, int after) {
    if (!t->prof_timer || t->prof_ncalls < 0)
        return;
    int k = t->prof_ncalls;
    if (2 + 2 * k + 1 >= t->prof_cap)
        return;
    tp_backend_t *b = tp_tower_backend_(t);
    if (!after && b->ops->timer_hold) {
        /* the device waits out the host's launching of the call (twice
         * its mean so far, 1 ms the first time): between the marks it
         * then runs the call's kernels back to back */
        uint64_t host = n->prof_calls ? (bwd ? n->prof_bwd_ns : n->prof_fwd_ns) / n->prof_calls : 0;
        uint64_t hold = host ? 2 * host + 20000 : 1000000;
        hold = hold < 5000000 ? hold : 5000000;
        if (b->ops->timer_hold(b, t->stream, hold) == TP_OK)
            t->prof_hold_ns += hold;
    }
    if (b->ops->timer_mark(b, t->stream, t->prof_timer, 2 + 2 * k + after) < 0)
        return;  /* a failed mark costs the profile a row, not the step */
    if (after) {
        t->prof_node[k] = n;
        t->prof_bwd[k] = (unsigned char)bwd;
        t->prof_ncalls++;
    }
}

/* Runs node n's forward (bwd 0) or backward (bwd 1) call on the tower's
 * stream; when the model profiles, brackets it with device marks and adds
 * its host wall and CPU times to the node's profile (a forward counts a
 * call: the backward of the same step is no second one). */
static tp_status_t s_run_call(tp_model_t *m, tp_tower_t *t, tp_node_t *n,
                              const tp_op_call_t *c, int bwd) {
    tp_backend_t *b = tp_tower_backend_(t);
    if (!m->profiling)
        return bwd ? b->ops->op_backward(b, t->stream, c)
                   : b->ops->op_forward(b, t->stream, c);
    uint64_t thr0, proc0, thr1, proc1;
    s_prof_mark(t, n, bwd, 0);
    s_prof_cpu(&thr0, &proc0);
    uint64_t t0 = tp_now_ns();
    tp_status_t rc = bwd ? b->ops->op_backward(b, t->stream, c)
                         : b->ops->op_forward(b, t->stream, c);
    uint64_t wall = tp_now_ns() - t0;
    s_prof_cpu(&thr1, &proc1);
    if (bwd) {
        n->prof_bwd_ns += wall;
        n->prof_bwd_thr_ns += thr1 - thr0;
        n->prof_bwd_proc_ns += proc1 - proc0;
    } else {
        n->prof_fwd_ns += wall;
        n->prof_fwd_thr_ns += thr1 - thr0;
        n->prof_fwd_proc_ns += proc1 - proc0;
        n->prof_calls++;
    }
    s_prof_mark(t, n, bwd, 1);
    return rc;
}

/* After the run's sync: each timed call's device time to its node, the
 * whole run's (marks 0 to 1: the ops and what ran between them, the
 * fused updates and fills) to the tower. */
static void s_prof_collect(tp_tower_t *t) {
    if (!t->prof_timer || t->prof_ncalls < 0)
        return;
    tp_backend_t *b = tp_tower_backend_(t);
    float ms;
    for (int k = 0; k < t->prof_ncalls; k++)
        if (b->ops->timer_ms(b, t->prof_timer, 2 + 2 * k, 3 + 2 * k, &ms) == TP_OK &&
            ms > 0) {
            uint64_t ns = (uint64_t)((double)ms * 1e6);
            if (t->prof_bwd[k])
                t->prof_node[k]->prof_bwd_dev_ns += ns;
            else
                t->prof_node[k]->prof_fwd_dev_ns += ns;
        }
    /* the run's time less the holds the profile itself put in it */
    if (b->ops->timer_ms(b, t->prof_timer, 0, 1, &ms) == TP_OK && ms > 0) {
        uint64_t ns = (uint64_t)((double)ms * 1e6);
        t->prof_run_dev_ns += ns > t->prof_hold_ns ? ns - t->prof_hold_ns : 0;
    }
    t->prof_hold_ns = 0;
    t->prof_ncalls = -1;  /* collected */
}

/* ---- the step's calls on one tower: forward, backward ------------------ */

/* Forward: every op call of the tower (pruned nodes skipped) on its
 * stream, made for cost `cost`'s gradients (forward reads none); no sync. */
static tp_status_t s_forward(tp_model_t *m, tp_tower_t *t, int cost) {
    const void *xs[TP_OP_MAX_INPUTS];
    tp_shape_t xsh[TP_OP_MAX_INPUTS];
    float *dx[TP_OP_MAX_INPUTS];
    tp_op_call_t c;
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *n = t->nodes[i];
        if (n->kind == TP_OP_INPUT || n->kind == TP_OP_VARIABLE || n->pruned)
            continue;
        if (n->folded) {
            n->value = n->folded->value; /* its work is in that call */
            continue;
        }
        if (n->nhwc_into)
            continue; /* the conv reads its input NHWC (fold.c) */
        if (n->kind == TP_OP_RESHAPE) {
            n->value = n->inputs[0]->value; /* inputs may be borrowed */
            continue;
        }
        s_make_call(m, t, n, cost, &c, xs, xsh, dx);
        tp_status_t rc = s_run_call(m, t, n, &c, 0);
        if (rc < 0)
            return tp_error_wrap(rc, "%s: forward of '%s'", t->name, n->name);
    }
    return TP_OK;
}

/* 1 when no trainable variable is in both named costs a and b. */
static int s_costs_disjoint(const tp_model_t *m, const tp_tower_t *t, int a, int b) {
    if (!t->cost_vars[a] || !t->cost_vars[b])
        return 0;  /* NULL: every trainable variable */
    for (int i = 0; i < m->nvars; i++)
        if (m->vars[i].trainable && fnmatch(t->cost_vars[a], m->vars[i].name, 0) == 0 &&
            fnmatch(t->cost_vars[b], m->vars[i].name, 0) == 0)
            return 0;
    return 1;
}

/* The costs whose gradients stay held through a backward of `cost`: the
 * fresh (or held) gradients of named costs over variables disjoint from
 * its, on one device, not yet reduced (a reduce after them would sum them
 * twice). Nothing for the main cost, or once they were applied. */
static unsigned s_held_after(const tp_model_t *m, const tp_tower_t *t,
                             const tp_grads_state_t *st, int cost) {
    unsigned held = st->held | (st->fresh ? 1u << st->cost : 0u), keep = 0;
    if (cost == 0 || st->reduced || m->nrep > 1)
        return 0;
    for (int k = 1; k < t->ncosts; k++)
        if (((held >> k) & 1u) && k != cost && s_costs_disjoint(m, t, k, cost))
            keep |= 1u << k;
    return keep;
}

/* Backward: cost `cost`'s gradients of a training tower, in reverse node
 * order on its stream (the first writer of a gradient overwrites it: no
 * zero_grad); no sync. fused: the update inside the pass (one-tower
 * models only: nothing to all-reduce): each variable's right after its
 * gradient is final, or on a device the whole arena's at the end.
 * reduce: all-reduce the gradients in buckets, each begun once its
 * gradients are final, beside the rest of the pass. It writes the tower's
 * step state: fresh (unless fused, which applied them), of cost `cost`,
 * reduced when it reduced them. */
static tp_status_t s_backward(tp_model_t *m, tp_tower_t *t, int cost,
                              int fused, int reduce) {
    tp_node_t *cn = t->costs[cost];
    if (!t->training || !cn || !((cn->cost_mask >> cost) & 1u))
        return TP_OK; /* gradients untouched */
    tp_backend_t *b = tp_tower_backend_(t);
    const void *xs[TP_OP_MAX_INPUTS];
    tp_shape_t xsh[TP_OP_MAX_INPUTS];
    float *dx[TP_OP_MAX_INPUTS];
    tp_op_call_t c;
    tp_grads_state_t *st = &m->step[t->index];
    /* partial until the pass completes; named costs' fresh gradients
     * whose variables this cost's backward never writes stay applicable */
    unsigned held = s_held_after(m, t, st, cost);
    const int forward = st->forward;  /* backward reads the activations only */
    *st = (tp_grads_state_t){.fresh = 0, .cost = cost, .reduced = 0, .sliced = 0,
                             .held = held, .forward = forward};
    TP_TRY(b->ops->fill(b, t->stream, cn->grad, 1.0f, 1));
    int k = 0, kb = 0;
    /* fused updates: on the CPU each variable's as soon as its gradient is
     * final (still in cache); on a device one update over the whole arena
     * after the pass (the same arithmetic, element by element: one kernel
     * instead of one per variable, each a launch and a drain for what are
     * mostly a few hundred floats), and so with a global-norm clip, whose
     * scale needs every gradient first */
    const int whole = fused && (b->device >= 0 || s_clip(m) > 0 || s_accum(m) > 1);
    reduce = reduce && cost == 0 && t->nbuckets > 0;
    const tp_reduce_rank_t rr = {b, m->comm, t->index, t->stream, t->grads,
                                 m->ntrain, m->config.average, t->name};
    unsigned bit = 1u << cost;
    for (int i = t->nnodes - 1; i >= 0; i--) {
        tp_node_t *n = t->nodes[i];
        if (!(n->cost_mask & bit) || n->kind == TP_OP_VARIABLE ||
            n->kind == TP_OP_INPUT || n->folded || n->nhwc_into)
            continue;
        s_make_call(m, t, n, cost, &c, xs, xsh, dx);
        tp_status_t rc = s_run_call(m, t, n, &c, 1);
        if (rc < 0)
            return tp_error_wrap(rc, "%s: backward of '%s'", t->name, n->name);
        for (; fused && !whole && k < t->nfuse && t->fuse[k]->fuse_after == i; k++)
            TP_TRY(s_update_var(m, t, t->fuse[k]->var));
        if (reduce)
            TP_TRY(tp_buckets_begin_(&rr, t->buckets, t->nbuckets, &kb, i));
    }
    if (reduce) {
        TP_TRY(tp_buckets_begin_(&rr, t->buckets, t->nbuckets, &kb, INT_MIN));
        TP_TRY(tp_buckets_end_(&rr));
        st->reduced = 1;
    }
    if (whole) {
        tp_replica_t *rp = &m->rep[t->replica];
        int count = 0, apply = 1;
        if (s_accum(m) > 1)
            TP_TRY(s_acc_count(m, t->replica, t->stream, &count));
        TP_TRY(s_accumulate(m, rp, t->stream, t->grads, 0, m->ntrain, count, &apply));
        if (apply) {
            TP_TRY(s_clip_range(m, t, t->stream, 0, m->ntrain));
            TP_TRY(s_apply(m, rp, t->stream, t->grads, 0, m->ntrain));
            TP_TRY(s_ema_range(m, t->replica, t->stream, 0, m->ntrain));
            tp_optimizer_end_step(m->opt);
        }
        if (s_accum(m) > 1)
            TP_TRY(s_acc_set(m, (count + 1) % s_accum(m)));
    } else if (fused) {
        for (int r = 0; r < t->nfuse_rest; r++)
            TP_TRY(s_update_var(m, t, t->fuse_rest[r]));
        TP_TRY(s_ema_range(m, t->replica, t->stream, 0, m->ntrain));
        tp_optimizer_end_step(m->opt);
    }
    st->fresh = !fused;
    if (fused)
        st->forward = 0;  /* the variables moved under the activations */
    return TP_OK;
}

/* The op calls of one pass over the tower: forward (unless the pass is
 * backward-only, over the activations the last forward left), then
 * backward when asked. When profiling, the pass goes between the timer's
 * marks 0 and 1. */
static tp_status_t s_run_ops(tp_model_t *m, tp_tower_t *t, int forward, int backward,
                             int fused, int reduce, int cost) {
    tp_backend_t *b = tp_tower_backend_(t);
    int timed = m->profiling && t->prof_timer &&
                b->ops->timer_mark(b, t->stream, t->prof_timer, 0) == TP_OK;
    if (timed) {
        t->prof_ncalls = 0;
        t->prof_hold_ns = 0;
    }
    tp_status_t rc = forward ? s_forward(m, t, cost) : TP_OK;
    if (rc == TP_OK && backward)
        rc = s_backward(m, t, cost, fused, reduce);
    if (timed && rc == TP_OK && b->ops->timer_mark(b, t->stream, t->prof_timer, 1) < 0)
        t->prof_ncalls = -1;
    return rc;
}

/* A device's scalar float outputs copied behind the run into a third of
 * the tower's mirror (after a graph's launch, outside it: the third
 * changes from step to step), so that reading them (tp_model_view_host,
 * tp_model_metric_value) costs no sync of its own. */
static tp_status_t s_mirror_outputs(tp_tower_t *t, int third) {
    tp_backend_t *b = tp_tower_backend_(t);
    float *dst = t->mirror ? t->mirror + (size_t)third * (size_t)t->noutputs : NULL;
    for (int i = 0; dst && i < t->noutputs; i++) {
        const tp_node_t *n = t->outputs[i].node;
        if (n->value && n->dtype == TP_FLOAT32 && tp_shape_count(&n->run_shape) == 1)
            TP_TRY(b->ops->copy_async(b, t->stream, &dst[i], n->value, sizeof(float)));
    }
    return TP_OK;
}

/* Wait for a step tower t queued ahead; its mirror becomes the one read. */
static tp_status_t s_drain_tower(tp_tower_t *t) {
    if (t->mirror_inflight < 0)
        return TP_OK;
    tp_backend_t *b = tp_tower_backend_(t);
    tp_status_t rc = b->ops->stream_sync(b, t->stream);
    t->mirror_ready = rc == TP_OK ? t->mirror_inflight : -1;
    t->mirror_inflight = -1;
    return rc;
}

tp_status_t tp_model_wait(tp_model_t *m) { return tp_model_drain_(m); }

tp_status_t tp_model_drain_(tp_model_t *m) {
    tp_status_t rc = TP_OK;
    for (int i = 0; m && i < m->ntowers; i++) {
        tp_status_t r = s_drain_tower(m->towers[i]);
        if (rc == TP_OK)
            rc = r;
    }
    return rc;
}

/* The mirrored copy of the scalar output at device address `data`, if a
 * training tower's last run left one. */
static const float *s_mirrored(const tp_model_t *m, const void *data) {
    for (int k = 0; data && k < m->ntowers; k++) {
        const tp_tower_t *t = m->towers[k];
        for (int i = 0; t->mirror && t->mirror_ready >= 0 && i < t->noutputs; i++) {
            const tp_node_t *n = t->outputs[i].node;
            if (n->value == data && n->dtype == TP_FLOAT32 &&
                tp_shape_count(&n->run_shape) == 1)
                return &t->mirror[(size_t)t->mirror_ready * (size_t)t->noutputs + i];
        }
    }
    return NULL;
}

/* One pass over tower t: its inputs loaded, forward (and backward, with
 * the fused update or the buckets' all-reduce when asked: s_backward),
 * the scalar outputs mirrored, the stream synchronised (or, a step ahead,
 * the step before's). */
static tp_status_t s_pass(tp_model_t *m, tp_tower_t *t,
                          const tp_tensor_t *inputs, int backward,
                          int fused, int reduce, int cost) {
    tp_backend_t *b = tp_tower_backend_(t);
    /* One step ahead: the fused training step of a one-tower model on a
     * backend that can (see tp_model_config_t.ahead). Any other run waits
     * for the steps queued ahead first. */
    int ahead = !m->profiling && m->config.ahead && fused && backward && cost == 0 &&
                s_accum(m) == 1 &&
                t->training &&
                m->ntowers == 1 && b->device >= 0 && b->ops->stream_mark &&
                b->ops->stream_wait_mark;
    if (!ahead)
        TP_TRY(tp_model_drain_(m));
    int third = 0;  /* the mirror third neither read nor still written */
    while (third == t->mirror_ready || third == t->mirror_inflight)
        third++;
    /* the activations are this pass's from here on; held for a
     * backward-only run once it succeeds, unless its update moved the
     * variables (fused) */
    tp_grads_state_t *held = t->training && t->index >= 0 ? &m->step[t->index] : NULL;
    if (held)
        held->forward = 0;
    TP_TRY(s_load_inputs(m, t, inputs));
    /* The fused training step (one tower, the main cost) as a graph:
     * recorded once a step at this batch ran call by call (the backend's
     * caches and the label checks are set up then), replayed after; any
     * other batch runs call by call. */
    /* (profiling times each call: the step runs call by call) */
    int graph = !m->profiling && m->config.graphs && fused && backward && cost == 0 &&
                s_accum(m) == 1 &&
                b->ops->graph_begin && t->training &&
                (t->graph ? t->graph_batch == t->run_batch
                          : t->eager_batch == t->run_batch);
    tp_status_t rc;
    if (!graph) {
        /* ahead: the mark after the inputs (graph_end marks a graph's) */
        rc = ahead ? b->ops->stream_mark(b, t->stream) : TP_OK;
        if (rc == TP_OK)
            rc = s_run_ops(m, t, 1, backward, fused, reduce, cost);
        if (rc == TP_OK && fused && backward)
            t->eager_batch = t->run_batch;  /* a whole step ran at it */
    } else {
        TP_TRY(b->ops->graph_begin(b, t->stream, t->graph));
        rc = s_run_ops(m, t, 1, backward, fused, 0, cost);
        if (rc < 0) {
            b->ops->graph_abort(b, t->stream);
            return rc;
        }
        if (!t->graph)
            t->graph_batch = t->run_batch;
        rc = b->ops->graph_end(b, t->stream, &t->graph);
        if (rc < 0)
            rc = tp_error_wrap(rc, "%s: the step as a graph (TP_CUDA_GRAPHS=0 "
                               "runs it call by call)", t->name);
    }
    /* the scalar outputs behind the step (outside any graph: the third
     * they go to changes from step to step) */
    if (rc == TP_OK)
        rc = s_mirror_outputs(t, third);
    if (held)
        held->forward = rc == TP_OK && !fused;
    if (!ahead) {
        uint64_t w0 = tp_now_ns();
        tp_status_t sc = b->ops->stream_sync(b, t->stream);
        t->device_wait_ns += tp_now_ns() - w0;
        if (rc == TP_OK && sc == TP_OK)
            t->mirror_ready = third;
        if (held && sc != TP_OK)
            held->forward = 0;
        if (sc == TP_OK && m->profiling)
            s_prof_collect(t);
        return rc < 0 ? rc : sc;
    }
    if (rc < 0) {  /* a call failed on the host: settle the stream */
        b->ops->stream_sync(b, t->stream);
        t->mirror_inflight = -1;
        return rc;
    }
    /* back once the step before is done (and this one's inputs are in):
     * its outputs are the ones read now, a bad label in it fails here */
    uint64_t w0 = tp_now_ns();
    rc = b->ops->stream_wait_mark(b, t->stream);
    t->device_wait_ns += tp_now_ns() - w0;
    if (t->mirror_inflight >= 0)
        t->mirror_ready = t->mirror_inflight;
    t->mirror_inflight = third;
    return rc;
}

/* A backward-only pass over tower t: cost `cost`'s gradients from the
 * activations its last forward left (tp_grads_state_t.forward; checked by
 * the run), no input loaded and no op run forward, so nothing a forward
 * moves (batch norm's moving averages, the tower's generator) moves; the
 * stream synchronised. The outputs stay the forward's. reduce: as
 * s_pass's. */
static tp_status_t s_pass_backward(tp_model_t *m, tp_tower_t *t, int reduce, int cost) {
    tp_backend_t *b = tp_tower_backend_(t);
    TP_TRY(tp_model_drain_(m));
    tp_status_t rc = s_run_ops(m, t, 0, 1, 0, reduce, cost);
    uint64_t w0 = tp_now_ns();
    tp_status_t sc = b->ops->stream_sync(b, t->stream);
    t->device_wait_ns += tp_now_ns() - w0;
    if (sc == TP_OK && m->profiling)
        s_prof_collect(t);
    return rc < 0 ? rc : sc;
}

static int s_cost_index(const tp_tower_t *t, const char *name) {
    if (!name)
        return 0;
    for (int k = 0; k < t->ncosts; k++)
        if (strcmp(t->cost_names[k], name) == 0 && t->costs[k])
            return k;
    return -1;
}

static tp_status_t s_no_cost(const tp_tower_t *t, const char *name) {
    char known[512] = "";
    size_t len = 0;
    for (int k = 0; k < t->ncosts && len < sizeof known; k++)
        if (t->costs[k] || k > 0)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s'%s'",
                                    len ? ", " : "", t->cost_names[k]);
    return tp_error(TP_ERR_NOT_FOUND, "%s: no cost named '%s' (costs: %s)",
                    t->name, name ? name : "cost", known);
}

int tp_model_cost_count(const tp_model_t *m) {
    return m->ntowers > 0 ? m->towers[0]->ncosts : 0;
}

const char *tp_model_cost_name(const tp_model_t *m, int i) {
    if (m->ntowers < 1 || i < 0 || i >= m->towers[0]->ncosts)
        return NULL;
    return m->towers[0]->cost_names[i];
}

static tp_node_t *s_lookup(tp_tower_t *t, const char *name);
static tp_status_t s_value_node(tp_tower_t *t, const char *name,
                                const char *what, tp_node_t **out);

/* ---- the step -------------------------------------------------------------
 *
 * tp_model_run decodes its arguments once into what the run does
 * (s_step_t: which towers, which calls, which cost), checks all of it, and
 * makes the step's named calls in order:
 *   forward   each tower's ops, its inputs loaded (s_pass: s_forward)
 *   backward  in the same pass, each training tower's gradients (s_backward;
 *             a tower joining the collective begins its buckets beside it);
 *             or, in a run without forward, a pass of its own over the
 *             activations the tower's last forward left (s_pass_backward:
 *             a second cost's gradients from one forward, a GAN step's)
 *   reduce    the towers' gradients summed (s_reduce: collective.c's
 *             all-reduce on plain buffers)
 *   update    the optimizer applies them (s_update)
 * A one-tower training step of the main cost is one pass: its update is
 * fused into backward and there is nothing to reduce. What each tower's
 * gradients are between the calls is the step's state, m->step[tower]
 * (tp_grads_state_t), which only these calls write. */

/* Which towers a run is for: an explicit scope, where tp_model_run's
 * `tower` has special values. */
typedef enum {
    S_ONE_TOWER,  /* tower `tower`, from its own thread beside the others' */
    S_ALL_TOWERS, /* every training tower from this thread (TP_ALL_TOWERS;
                     tower 0 of a one-tower model is every tower) */
    S_INFER,      /* the inference graph (tower -1) */
} s_scope_t;

typedef struct {
    s_scope_t scope;
    int tower;        /* the tower fetches read: S_ONE_TOWER's (in range once
                         checked), 0 for every tower, -1 the inference graph */
    unsigned stages;  /* TP_RUN_* as asked (0: TP_RUN_TRAIN), for errors */
    int forward, backward, reduce, update;
    const char *cost_name; /* NULL: the main cost */
    int cost;         /* its index, once checked */
    uint64_t *stage_ns;
} s_step_t;

static s_step_t s_decode(const tp_model_t *m, int tower,
                         const tp_run_opts_t *opts) {
    s_step_t s = {.scope = S_ONE_TOWER, .tower = tower};
    if (tower == TP_ALL_TOWERS || (tower == 0 && m->ntowers == 1)) {
        s.scope = S_ALL_TOWERS;
        s.tower = 0;
    } else if (tower == -1) {
        s.scope = S_INFER;
    }
    s.stages = opts && opts->stages ? opts->stages : (unsigned)TP_RUN_TRAIN;
    s.forward = (s.stages & TP_RUN_FORWARD) != 0;
    s.backward = (s.stages & TP_RUN_BACKWARD) != 0;
    s.reduce = (s.stages & TP_RUN_REDUCE) != 0;
    s.update = (s.stages & TP_RUN_UPDATE) != 0;
    s.cost_name = opts ? opts->cost : NULL;
    s.stage_ns = opts ? opts->stage_ns : NULL;
    return s;
}

/* The stages one run may do: a contiguous range of forward, backward,
 * reduce, update (in that order); one that begins with backward
 * differentiates the held forward (checked in s_check_run). */
static int s_stages_valid(unsigned st) {
    switch (st) {
    case TP_RUN_FORWARD:
    case TP_RUN_FORWARD | TP_RUN_BACKWARD:
    case TP_RUN_FORWARD | TP_RUN_BACKWARD | TP_RUN_REDUCE:
    case TP_RUN_FORWARD | TP_RUN_BACKWARD | TP_RUN_REDUCE | TP_RUN_UPDATE:
    case TP_RUN_BACKWARD:
    case TP_RUN_BACKWARD | TP_RUN_REDUCE:
    case TP_RUN_BACKWARD | TP_RUN_REDUCE | TP_RUN_UPDATE:
    case TP_RUN_REDUCE:
    case TP_RUN_REDUCE | TP_RUN_UPDATE:
    case TP_RUN_UPDATE:
        return 1;
    default:
        return 0;
    }
}

/* The model can reduce and update (an optimizer, training towers). */
static tp_status_t s_check_grads(const tp_model_t *m) {
    if (!m->opt || m->ntowers == 0)
        return tp_error(TP_ERR_STATE, "model has no optimizer or no training "
                                      "towers");
    return TP_OK;
}

/* Everything a run is told is checked before anything runs, so that a bad
 * option leaves the model as it was. Cheap: a step with no cost name and no
 * fetches costs a few compares here. Sets s->cost. */
static tp_status_t s_check_run(tp_model_t *m, s_step_t *s,
                               const tp_tensor_t *feeds, int nfeeds,
                               const tp_fetch_t *fetches, int nfetches) {
    const unsigned st = s->stages;
    if (!s_stages_valid(st))
        return tp_error(TP_ERR_INVALID, "run: stages 0x%x: a run does a "
                        "contiguous range of TP_RUN_FORWARD, TP_RUN_BACKWARD, "
                        "TP_RUN_REDUCE, TP_RUN_UPDATE (in that order)", st);
    int all = s->scope == S_ALL_TOWERS;
    if (all ? m->ntowers == 0 : !tp_model_tower_(m, s->tower))
        return all ? tp_error(TP_ERR_INVALID, "run: TP_ALL_TOWERS but the "
                              "model has no training towers")
                   : s_bad_tower(m, s->tower);
    if (s->scope == S_INFER && st != TP_RUN_FORWARD)
        return tp_error(TP_ERR_INVALID, "infer: stages 0x%x: the inference "
                        "graph only runs forward (TP_RUN_FORWARD)", st);
    if (s->reduce || s->update)
        TP_TRY(s_check_grads(m));
    if (s->update && s_accum(m) == 1 && tp_optimizer_accumulate(m->opt) > 1)
        return tp_error(TP_ERR_STATE, "run: the optimizer's accumulate is %d but the "
                        "model was built without it (set it in the optimizer "
                        "factory: the model plans the gradients' sum)",
                        tp_optimizer_accumulate(m->opt));
    if ((s->backward || s->update) && m->ema_in_use)
        return tp_error(TP_ERR_STATE, "run: the weights' average is in their place "
                        "(tp_model_use_ema): put the weights back (use_ema 0) "
                        "before training");
    tp_tower_t *t = tp_model_tower_(m, s->tower);
    s->cost = 0;
    if (s->cost_name) {
        if (m->ntowers == 0)
            return tp_error(TP_ERR_NOT_FOUND, "run: no cost named '%s' (the "
                            "model has no training towers)", s->cost_name);
        s->cost = s_cost_index(m->towers[0], s->cost_name);
        if (s->cost < 0)
            return s_no_cost(m->towers[0], s->cost_name);
    }
    if (s->backward && s->cost == 0 && !t->cost && t->ncosts > 1)
        return tp_error(TP_ERR_STATE, "%s has only named costs (%s, ...): name "
                        "one in tp_run_opts_t.cost", t->name, t->cost_names[1]);
    const int first = all ? 0 : s->tower, last = all ? m->ntowers - 1 : s->tower;
    for (int i = first; s->backward && !s->forward && i <= last; i++)
        if (!m->step[i].forward)
            return tp_error(TP_ERR_STATE, "%s holds no forward pass to differentiate "
                            "(a run of TP_RUN_BACKWARD without TP_RUN_FORWARD reads "
                            "the activations of the tower's last forward: run one "
                            "first, with no update since)", m->towers[i]->name);
    const char *who = all && m->ntowers > 1 ? "all towers" : t->name;
    int want = s->forward ? (all ? m->ntowers : 1) * m->ninputs : 0;
    if (nfeeds != want) {
        if (!s->forward)
            return tp_error(TP_ERR_INVALID, "%s: %d feeds given to a run "
                            "without TP_RUN_FORWARD (it reads none)", who,
                            nfeeds);
        return tp_error(TP_ERR_SHAPE, "%s: %d feeds, the model has %d inputs%s",
                        who, nfeeds, m->ninputs,
                        all && m->ntowers > 1 ? " per tower (TP_ALL_TOWERS "
                        "takes every tower's, one after another)" : "");
    }
    if (nfeeds > 0 && !feeds)
        return tp_error(TP_ERR_INVALID, "%s: %d feeds but no tensors", who,
                        nfeeds);
    if (nfetches < 0 || (nfetches > 0 && !fetches))
        return tp_error(TP_ERR_INVALID, "%s: %d fetches at %p", t->name,
                        nfetches, (const void *)fetches);
    for (int i = 0; i < nfetches; i++) {
        tp_node_t *n;
        char what[32];
        snprintf(what, sizeof what, "fetch %d", i);
        TP_TRY(s_value_node(t, fetches[i].name, what, &n));
    }
    return TP_OK;
}

/* Reducing or applying gradients that no backward produced (or that were
 * already applied) is a trainer bug worth a clear error. */
static tp_status_t s_check_fresh(const tp_model_t *m, int first, int last) {
    for (int i = first; i <= last; i++)
        if (!m->step[i].fresh)
            return tp_error(TP_ERR_STATE,
                            "%s has no fresh gradients (run TP_RUN_BACKWARD "
                            "first; gradients are used once)",
                            m->towers[i]->name);
    return TP_OK;
}

/* Tower t's part of an all-reduce on `comm`, as rank `rank`: its whole
 * gradient arena, on its stream. */
static tp_reduce_rank_t s_rank_of(tp_model_t *m, tp_tower_t *t, tp_comm_t *comm,
                                  int rank, int average) {
    return (tp_reduce_rank_t){tp_tower_backend_(t), comm, rank, t->stream,
                              t->grads, m->ntrain, average, t->name};
}

/* Reduce. One thread driving every tower (parameter-server style): the sum
 * (or mean) lands in tower 0 only, which is all the update reads. One
 * tower's thread: it contributes its own gradients and gets the sum back
 * in them. */
static tp_status_t s_reduce(tp_model_t *m, const s_step_t *s) {
    if (s->scope == S_ALL_TOWERS) {
        TP_TRY(s_check_fresh(m, 0, m->ntowers - 1));
        if (m->ntowers == 1)
            return TP_OK;
        if (m->nrep > 1)
            return tp_error(TP_ERR_UNSUPPORTED, "reduce: the towers span %d "
                            "devices; each joins the all-reduce from its own "
                            "thread (TP_RUN_REDUCE on its index, as the "
                            "replicated trainer does), not one thread for "
                            "all", m->nrep);
        float *bufs[64];
        for (int i = 0; i < m->ntowers; i++)
            bufs[i] = m->towers[i]->grads;
        TP_TRY(tp_allreduce_root_(m->backend, bufs, m->ntowers, m->ntrain,
                                  m->config.average));
        for (int i = 0; i < m->ntowers; i++)
            m->step[i].reduced = 1;  /* held gradients then stay out of a later sum */
        return TP_OK;
    }
    const int tower = s->tower;
    TP_TRY(s_check_fresh(m, tower, tower));
    if (m->step[tower].reduced)
        return TP_OK;  /* in buckets, during its backward pass */
    const tp_reduce_rank_t rr = s_rank_of(m, m->towers[tower], m->comm, tower,
                                          m->config.average);
    TP_TRY(tp_allreduce_(&rr));
    m->step[tower].reduced = 1;
    return TP_OK;
}

/* Update, one tower's slice. Replicated towers update in parallel: after
 * the all-reduce (whose slice `tower` this tower's thread just summed, so
 * it is in this core's cache) the tower applies the optimizer to the same
 * slice of its device's variables: of the towers on one device, the j-th
 * of k updates the j-th k-th of them (on one device, tower i the i-th of
 * ntowers). The update is elementwise and every tower holds the same sum,
 * so the slices give exactly what one update from tower 0 gives, in every
 * replica. Every tower's backward is over once the all-reduce has begun,
 * so no run still reads the variables. */
static tp_status_t s_update_slice(tp_model_t *m, int tower, int k) {
    tp_tower_t *t = m->towers[tower];
    tp_grads_state_t *st = &m->step[tower];
    TP_TRY(s_check_fresh(m, tower, tower));
    if (k != 0 || st->cost != 0)
        return tp_error(TP_ERR_STATE, "%s: cost '%s' updates only its own "
                        "variables: update it from one thread (TP_ALL_TOWERS), "
                        "not in slices", t->name, t->cost_names[k ? k : st->cost]);
    size_t j = 0, nt = 0;  /* this tower's place among its device's towers */
    for (int i = 0; i < m->ntowers; i++)
        if (m->towers[i]->replica == t->replica) {
            j += i < tower;
            nt++;
        }
    size_t n = m->ntrain;
    size_t chunk = (n + nt - 1) / nt, lo = chunk * j, hi = lo + chunk;
    if (lo > n)
        lo = n;
    if (hi > n)
        hi = n;
    tp_replica_t *rp = &m->rep[t->replica];
    tp_backend_t *b = rp->backend;
    int count = 0, apply = 1;  /* the count changes only when the step closes */
    if (s_accum(m) > 1)
        TP_TRY(s_acc_count(m, t->replica, t->stream, &count));
    TP_TRY(s_accumulate(m, rp, t->stream, t->grads, lo, hi, count, &apply));
    if (apply) {
        TP_TRY(s_clip_range(m, t, t->stream, lo, hi));
        TP_TRY(s_apply(m, rp, t->stream, t->grads, lo, hi));
        TP_TRY(s_ema_range(m, t->replica, t->stream, lo, hi));
    }
    TP_TRY(b->ops->stream_sync(b, t->stream));
    st->sliced = 1;
    st->forward = 0;  /* the variables moved under its activations (its own
                         flag only: the other towers' threads own theirs) */
    return TP_OK;
}

/* Each decay segment's rate for tower's row of m->wd_decay (the others'
 * threads fill theirs), as tp_optimizer_update_group computes a
 * variable's: (float)(wd x its multiplier); the padding's 0. */
static const float *s_wd_row(tp_model_t *m, int tower, double wd) {
    float *decay = m->wd_decay + (size_t)tower * (size_t)m->nwd;
    for (int k = 0; k < m->nwd; k++)
        decay[k] = m->wd_var[k] < 0 ? 0.0f
                                    : (float)(wd * tp_optimizer_decay_mult(
                                                       m->opt, m->vars[m->wd_var[k]].name));
    return decay;
}

/* Reduce, clip and Adam fused (backend_impl.h's allreduce_adam): the
 * tower's thread sums its slice of the towers' gradients with the squares
 * of the sums and, once the towers meet, updates the slice from the
 * clipped sums, where that gives s_reduce then s_update_slice's bits
 * (s_reduce_update's conditions; any clip; a decay through the decay
 * segments). Two passes over the tower's slice of the gradients where the
 * unfused calls make four, and a fifth over the whole arena (the GPT's
 * 2 towers x 1 thread: docs/performance.md, issue 45). *done 0: it does
 * not apply. */
static tp_status_t s_reduce_adam(tp_model_t *m, int tower, int *done) {
    float lr, b1, b2, eps;
    double wd;
    int64_t step;
    tp_backend_t *b = m->backend;
    if (!b->ops->allreduce_adam || !tp_optimizer_adam_(m->opt, &lr, &b1, &b2, &eps, &wd, &step))
        return TP_OK;
    if (wd != 0 ? !m->nwd : tp_optimizer_decay_mult_count(m->opt) != 0)
        return TP_OK;  /* a decay without its segments (variables out of order) */
    tp_tower_t *t = m->towers[tower];
    tp_replica_t *rp = &m->rep[0];
    const double clip = s_clip(m);
    tp_status_t rc = b->ops->allreduce_adam(
        b, m->comm, tower, t->stream, t->grads, m->ntrain, m->config.average,
        rp->train_arena, rp->slots[0], rp->slots[1], lr, b1, b2, eps, step,
        clip > 0 ? (float)clip : 0.0f, wd != 0 ? m->wd_seg : NULL,
        wd != 0 ? s_wd_row(m, tower, wd) : NULL, wd != 0 ? m->nwd : 0);
    if (rc < 0)
        return tp_error_wrap(rc, "%s: all-reduce, clip and Adam update of %zu floats",
                             t->name, m->ntrain);
    *done = 1;
    return TP_OK;
}

/* Reduce and update fused (backend_impl.h's allreduce_sgd): one tower's
 * thread sums its slice of the towers' gradients and applies SGD to the
 * same slice of the weights while the sums are in cache, where that gives
 * s_reduce then s_update_slice's bits: one device, the main cost, SGD with
 * no learning-rate multipliers, clip, accumulation or weights' average;
 * a coupled weight decay (with its multipliers) through allreduce_sgd_wd.
 * Adam and AdamW, with a clip: s_reduce_adam. *done 0: it does not apply,
 * nothing was done. */
static tp_status_t s_reduce_update(tp_model_t *m, const s_step_t *s, int *done) {
    *done = 0;
    if (s->scope != S_ONE_TOWER || !s->reduce || !s->update || !m->comm ||
        m->nrep != 1 || !m->opt)
        return TP_OK;
    const int tower = s->tower;
    tp_tower_t *t = m->towers[tower];
    tp_grads_state_t *st = &m->step[tower];
    if (st->reduced || s->cost != 0 || st->cost != 0 || s_accum(m) != 1 || m->nema ||
        tp_optimizer_lr_mult_count(m->opt))
        return TP_OK;
    TP_TRY(s_check_fresh(m, tower, tower));
    TP_TRY(s_reduce_adam(m, tower, done));
    float lr, mu;
    int nesterov;
    double wd = 0;
    const int plain = tp_optimizer_plain_sgd_(m->opt, &lr, &mu, &nesterov);
    if (!*done && m->backend->ops->allreduce_sgd && s_clip(m) <= 0 &&
        (plain ? !tp_optimizer_decay_mult_count(m->opt)
               : m->nwd && tp_optimizer_sgd_wd_(m->opt, &lr, &mu, &nesterov, &wd))) {
        tp_backend_t *b = m->backend;
        tp_replica_t *rp = &m->rep[0];
        tp_status_t rc;
        if (plain)
            rc = b->ops->allreduce_sgd(b, m->comm, tower, t->stream, t->grads, m->ntrain,
                                       m->config.average, rp->train_arena,
                                       mu > 0 ? rp->slots[0] : NULL, lr, mu, nesterov);
        else
            rc = b->ops->allreduce_sgd_wd(b, m->comm, tower, t->stream, t->grads,
                                          m->ntrain, m->config.average, rp->train_arena,
                                          mu > 0 ? rp->slots[0] : NULL, lr, mu, nesterov,
                                          m->wd_seg, s_wd_row(m, tower, wd), m->nwd);
        if (rc < 0)
            return tp_error_wrap(rc, "%s: all-reduce and SGD update of %zu floats",
                                 t->name, m->ntrain);
        *done = 1;
    }
    if (*done) {
        st->reduced = st->sliced = 1;
        st->forward = 0;  /* the variables moved under its activations */
    }
    return TP_OK;
}

/* Named cost k updates the trainable variables its pattern matches. */
static int s_cost_var(const tp_tower_t *t0, int k, const tp_var_t *v) {
    return v->trainable &&
           !(t0->cost_vars[k] && fnmatch(t0->cost_vars[k], v->name, 0) != 0);
}

/* A named cost's clip: the norm over the variables it updates only (the
 * others' gradients are stale), each of them scaled by it. */
static tp_status_t s_clip_cost(tp_model_t *m, tp_tower_t *t, tp_stream_t *s,
                               int k) {
    const double clip = s_clip(m);
    if (!(clip > 0))
        return TP_OK;
    tp_backend_t *b = tp_tower_backend_(t);
    const tp_tower_t *t0 = m->towers[0];
    TP_TRY(s_clip_check(m, b));
    TP_TRY(b->ops->fill(b, s, s_clip_acc(m, t), 0.0f, 1));
    for (int i = 0; i < m->nvars; i++)
        if (s_cost_var(t0, k, &m->vars[i]))
            TP_TRY(b->ops->grad_sumsq(b, s, t->grads + m->vars[i].offset,
                                      m->vars[i].count, s_clip_acc(m, t), 1));
    for (int i = 0; i < m->nvars; i++)
        if (s_cost_var(t0, k, &m->vars[i]))
            TP_TRY(b->ops->grad_clip(b, s, t->grads + m->vars[i].offset,
                                     m->vars[i].count, (float)clip,
                                     s_clip_acc(m, t)));
    return TP_OK;
}

/* Update from one thread: close a step whose slices every tower applied,
 * or apply tower 0's gradients of cost k (the main cost to every trainable
 * variable, a named one to its own only: the others' gradients are
 * stale). */
static tp_status_t s_update_all(tp_model_t *m, int k) {
    int sliced = 0;
    for (int i = 0; i < m->ntowers; i++)
        sliced += m->step[i].sliced;
    if (sliced == m->ntowers) {
        TP_TRY(s_check_fresh(m, 0, m->ntowers - 1));
        int count = 0;
        if (s_accum(m) > 1) {
            TP_TRY(s_acc_count(m, 0, m->rep[0].stream, &count));
            TP_TRY(s_acc_set(m, (count + 1) % s_accum(m)));
        }
        if (count + 1 >= s_accum(m))  /* the slices updated */
            tp_optimizer_end_step(m->opt);
        for (int i = 0; i < m->ntowers; i++)
            m->step[i].fresh = m->step[i].sliced = m->step[i].forward = 0;
        return TP_OK;
    }
    if (sliced) {
        for (int i = 0; i < m->ntowers; i++)
            if (!m->step[i].sliced)
                return tp_error(TP_ERR_STATE, "%s has not applied its slice "
                                "of the update (%d of %d towers have)",
                                m->towers[i]->name, sliced, m->ntowers);
    }
    /* A named cost whose gradients every tower holds (taken before
     * another cost's, over other variables): applied as if fresh. */
    int held = k != 0;
    for (int i = 0; held && i < m->ntowers; i++)
        held = (m->step[i].held >> k) & 1u;
    /* Replica r applies the gradients of tower r, its device's first: on
     * one device tower 0's; on several, each tower's all-reduced sum. */
    if (!held)
        TP_TRY(s_check_fresh(m, 0, m->nrep - 1));
    for (int r = 0; m->nrep > 1 && r < m->nrep; r++)
        if (!m->step[r].reduced)
            return tp_error(TP_ERR_STATE, "%s's gradients were not all-reduced "
                            "(TP_RUN_REDUCE): the towers span %d devices, and "
                            "each device's variables are updated from its own "
                            "towers' sum", m->towers[r]->name, m->nrep);
    tp_tower_t *t0 = m->towers[0];
    if (!held && m->step[0].cost != k)
        return tp_error(TP_ERR_STATE, "updating cost '%s' but the fresh "
                        "gradients are cost '%s''s", t0->cost_names[k],
                        t0->cost_names[m->step[0].cost]);
    if (k != 0 && s_accum(m) > 1)
        return tp_error(TP_ERR_UNSUPPORTED, "cost '%s': gradient accumulation "
                        "(accumulate %d) is for the main cost only",
                        t0->cost_names[k], s_accum(m));
    int count = 0, apply = 1;
    if (s_accum(m) > 1)
        TP_TRY(s_acc_count(m, 0, m->rep[0].stream, &count));
    for (int r = 0; r < m->nrep; r++) {
        tp_replica_t *rp = &m->rep[r];
        const float *g = m->towers[r]->grads;
        if (k == 0) {  /* the main cost: every trainable variable at once */
            TP_TRY(s_accumulate(m, rp, rp->stream, m->towers[r]->grads, 0, m->ntrain,
                                count, &apply));
            if (!apply)
                continue;
            TP_TRY(s_clip_range(m, m->towers[r], rp->stream, 0, m->ntrain));
            TP_TRY(s_apply(m, rp, rp->stream, g, 0, m->ntrain));
            TP_TRY(s_ema_range(m, r, rp->stream, 0, m->ntrain));
            continue;
        }
        TP_TRY(s_clip_cost(m, m->towers[r], rp->stream, k));
        for (int i = 0; i < m->nvars; i++) {
            const tp_var_t *v = &m->vars[i];
            if (!s_cost_var(t0, k, v))
                continue;
            TP_TRY(s_apply(m, rp, rp->stream, g, v->offset, v->offset + v->count));
        }
        TP_TRY(s_ema_range(m, r, rp->stream, 0, m->ntrain));
    }
    if (apply)
        tp_optimizer_end_step(m->opt);
    if (s_accum(m) > 1)
        TP_TRY(s_acc_set(m, (count + 1) % s_accum(m)));
    for (int i = 0; i < m->ntowers; i++) {
        if (held)
            m->step[i].held &= ~(1u << k);
        else
            m->step[i].fresh = 0;
        m->step[i].forward = 0;  /* no backward over the old variables' */
    }
    for (int r = 0; r < m->nrep; r++)
        TP_TRY(m->rep[r].backend->ops->stream_sync(m->rep[r].backend,
                                                   m->rep[r].stream));
    return TP_OK;
}

static tp_status_t s_update(tp_model_t *m, const s_step_t *s) {
    return s->scope == S_ALL_TOWERS ? s_update_all(m, s->cost)
                                    : s_update_slice(m, s->tower, s->cost);
}

/* Forward, and backward when asked, of the run's towers: a pass each;
 * or backward alone over each one's held forward. */
static tp_status_t s_passes(tp_model_t *m, const s_step_t *s,
                            const tp_tensor_t *feeds) {
    /* one tower joining the collective: in buckets, during its backward
     * pass (config.bucket_bytes) */
    const int reduce = s->backward && s->scope == S_ONE_TOWER && s->reduce && m->comm;
    if (!s->forward) {  /* backward only, over the held forward */
        if (s->scope != S_ALL_TOWERS)
            return s_pass_backward(m, tp_model_tower_(m, s->tower), reduce, s->cost);
        for (int i = 0; i < m->ntowers; i++)
            TP_TRY(s_pass_backward(m, m->towers[i], 0, s->cost));
        return TP_OK;
    }
    if (s->scope != S_ALL_TOWERS)
        return s_pass(m, tp_model_tower_(m, s->tower), feeds, s->backward, 0,
                      reduce, s->cost);
    for (int i = 0; i < m->ntowers; i++)
        TP_TRY(s_pass(m, m->towers[i], feeds ? feeds + i * m->ninputs : NULL,
                      s->backward, 0, 0, s->cost));
    return TP_OK;
}

/* A whole training step of the main cost on a one-tower model that planned
 * fused updates: forward, backward and update in one pass, each variable's
 * update once its gradient is final on the CPU, the whole arena's after
 * the pass on a device (s_backward). */
static int s_fused(const tp_model_t *m, const s_step_t *s) {
    return s->scope == S_ALL_TOWERS && s->stages == TP_RUN_TRAIN && s->cost == 0 &&
           m->ntowers == 1 && m->towers[0]->fuse;
}

static tp_status_t s_step(tp_model_t *m, const s_step_t *s,
                          const tp_tensor_t *feeds, tp_fetch_t *fetches,
                          int nfetches) {
    if (s_fused(m, s)) {
        TP_TRY(s_pass(m, m->towers[0], feeds, 1, 1, 0, 0));
    } else {
        TP_TRY(tp_model_drain_(m));  /* no step queued ahead under these */
        uint64_t t0 = s->stage_ns ? tp_now_ns() : 0;
        if (s->forward || s->backward)
            TP_TRY(s_passes(m, s, feeds));
        uint64_t t1 = s->stage_ns ? tp_now_ns() : 0;
        if (s->stage_ns)
            s->stage_ns[0] = t1 - t0;
        int fused = 0;
        TP_TRY(s_reduce_update(m, s, &fused));
        if (s->reduce && !fused)
            TP_TRY(s_reduce(m, s));
        if (s->update && !fused)
            TP_TRY(s_update(m, s));
        if (s->stage_ns && (s->reduce || s->update))
            s->stage_ns[1] = tp_now_ns() - t1;
    }
    for (int i = 0; i < nfetches; i++)
        TP_TRY(tp_model_fetch(m, s->tower, fetches[i].name, &fetches[i].value));
    return TP_OK;
}

tp_status_t tp_model_run(tp_model_t *m, int tower, const tp_tensor_t *feeds,
                         int nfeeds, tp_fetch_t *fetches, int nfetches,
                         const tp_run_opts_t *opts) {
    if (!m)
        return tp_error(TP_ERR_INVALID, "run: no model");
    s_step_t s = s_decode(m, tower, opts);
    if (s.stage_ns)
        s.stage_ns[0] = s.stage_ns[1] = 0;
    tp_status_t rc = s_check_run(m, &s, feeds, nfeeds, fetches, nfetches);
    if (rc == TP_OK)
        rc = s_step(m, &s, feeds, fetches, nfetches);
    /* A tower that joins the collective and fails must not leave the
     * others waiting for its contribution forever. */
    if (rc < 0 && s.scope == S_ONE_TOWER && s.tower >= 0 && s.reduce && m->comm)
        m->backend->ops->comm_abort(m->backend, m->comm);
    return rc;
}

/* ---- across processes (declared in graph_dist.h, for dist/ on a device) -- */

static tp_status_t s_ranks_supported(const tp_model_t *m) {
    tp_backend_t *b = m->backend;
    if (!b->ops->comm_id || !b->ops->comm_join)
        return tp_error(TP_ERR_UNSUPPORTED, "the %s backend has no communicator "
                        "across processes (dist/ all-reduces host memory over "
                        "MPI for it)", b->ops->name);
    if (m->nrep > 1)
        return tp_error(TP_ERR_UNSUPPORTED, "a model on %d devices across "
                        "processes: one device per process", m->nrep);
    return TP_OK;
}

tp_status_t tp_model_comm_id(tp_model_t *m, void *id, size_t *len) {
    TP_TRY(s_ranks_supported(m));
    return m->backend->ops->comm_id(m->backend, id, TP_COMM_ID_MAX, len);
}

tp_status_t tp_model_comm_join(tp_model_t *m, int nranks, int rank,
                               const void *id, size_t len) {
    TP_TRY(s_ranks_supported(m));
    if (m->ranks)
        return tp_error(TP_ERR_STATE, "the model already joined a communicator "
                        "across processes");
    if (!id || len == 0 || len > TP_COMM_ID_MAX)
        return tp_error(TP_ERR_INVALID, "communicator id of %zu bytes (1..%d)",
                        len, TP_COMM_ID_MAX);
    m->ranks = m->backend->ops->comm_join(m->backend, nranks, rank, id, len);
    return m->ranks ? TP_OK : tp_error_wrap(TP_ERR_PEER, "rank %d of %d: joining "
                                            "the processes' communicator", rank,
                                            nranks);
}

/* Tower 0's gradients, the mean over the processes (this one is rank 0 of
 * its communicator's all-reduce). */
tp_status_t tp_model_allreduce_ranks(tp_model_t *m) {
    if (!m->ranks)
        return tp_error(TP_ERR_STATE, "all-reduce over processes before "
                        "tp_model_comm_join");
    TP_TRY(s_check_fresh(m, 0, 0));
    TP_TRY(tp_model_drain_(m));
    const tp_reduce_rank_t rr = s_rank_of(m, m->towers[0], m->ranks, 0, 1);
    return tp_allreduce_(&rr);
}

/* ---- reading results ---------------------------------------------------- */

static tp_node_t *s_lookup(tp_tower_t *t, const char *name) {
    for (int i = 0; i < t->noutputs; i++)
        if (strcmp(t->outputs[i].name, name) == 0)
            return t->outputs[i].node;
    for (int i = 0; i < t->nnodes; i++)
        if (strcmp(t->nodes[i]->name, name) == 0)
            return t->nodes[i];
    return NULL;
}

/* The node whose value a fetch or a prune reads: TP_ERR_NOT_FOUND for no
 * such name, TP_ERR_INVALID for a value a fold overwrote (fold.c). */
static tp_status_t s_value_node(tp_tower_t *t, const char *name,
                                const char *what, tp_node_t **out) {
    tp_node_t *n = name ? s_lookup(t, name) : NULL;
    *out = n;
    if (!n)
        return tp_error(TP_ERR_NOT_FOUND, "%s: %s: no output or node named "
                        "'%s'", t->name, what, name ? name : "(null)");
    if (n->nhwc_into) {
        *out = NULL;
        return tp_error(TP_ERR_INVALID, "%s: %s: '%s' (a transpose NHWC -> NCHW) is "
                        "folded into '%s', which reads its input '%s' as NHWC "
                        "(config fold), so its own value is not made; fetch '%s', "
                        "or build with fold = 0 (TP_FOLD=0) or TP_NHWC_FOLD=0",
                        t->name, what, name, n->nhwc_into->name, n->inputs[0]->name,
                        n->inputs[0]->name);
    }
    if (n->hidden) {
        /* the node after the fold, whose value this one's became */
        const tp_node_t *by = n;
        for (int i = n->id + 1; i < t->nnodes; i++)
            if (t->nodes[i]->folded && t->nodes[i]->ninputs > 0 &&
                t->nodes[i]->inputs[0] == by)
                by = t->nodes[i];
        *out = NULL;
        return tp_error(TP_ERR_INVALID, "%s: %s: '%s' is folded into one call "
                        "with '%s' (config fold), so its own value is not kept; "
                        "fetch '%s', or build with fold = 0 (TP_FOLD=0)",
                        t->name, what, name, by->name, by->name);
    }
    if (n->blk16) {
        *out = NULL;
        return tp_error(TP_ERR_INVALID, "%s: %s: '%s' is kept in oneDNN's blocked "
                        "layout nChw16c between the ops that read it (config fold), "
                        "not NCHW; build with fold = 0 (TP_FOLD=0) or "
                        "TP_BLK16_CHAIN=0 to read it",
                        t->name, what, name);
    }
    return TP_OK;
}

int tp_model_node_count(const tp_model_t *m, int tower) {
    tp_tower_t *t = m ? tp_model_tower_((tp_model_t *)m, tower) : NULL;
    return t ? t->nnodes : 0;
}

tp_node_t *tp_model_node(const tp_model_t *m, int tower, int i) {
    tp_tower_t *t = m ? tp_model_tower_((tp_model_t *)m, tower) : NULL;
    return t && i >= 0 && i < t->nnodes ? t->nodes[i] : NULL;
}

int tp_model_output_count(const tp_model_t *m, int tower) {
    tp_tower_t *t = m ? tp_model_tower_((tp_model_t *)m, tower) : NULL;
    return t ? t->noutputs : 0;
}

const char *tp_model_output_name(const tp_model_t *m, int tower, int i) {
    tp_tower_t *t = m ? tp_model_tower_((tp_model_t *)m, tower) : NULL;
    return t && i >= 0 && i < t->noutputs ? t->outputs[i].name : NULL;
}

tp_node_t *tp_model_lookup(const tp_model_t *m, int tower, const char *name) {
    tp_tower_t *t = m ? tp_model_tower_((tp_model_t *)m, tower) : NULL;
    return t && name ? s_lookup(t, name) : NULL;
}

/* Mark what the wanted nodes reach backwards through their inputs (and a
 * batch norm's moving averages); forward skips everything else. Nodes come
 * in topological order, so one backward sweep does it. */
tp_status_t tp_model_prune(tp_model_t *m, const char *const *names, int n) {
    if (!m || !m->infer)
        return tp_error(TP_ERR_INVALID, "prune: the model has no inference "
                        "graph (tp_model_config_t.infer_batch)");
    TP_TRY(tp_model_drain_(m));
    tp_tower_t *t = m->infer;
    if (n < 0 || (n > 0 && !names))
        return tp_error(TP_ERR_INVALID, "prune: %d names at %p", n,
                        (const void *)names);
    unsigned char *keep = calloc((size_t)t->nnodes + 1, 1);
    if (!keep)
        return tp_error(TP_ERR_NOMEM, "prune");
    for (int i = 0; i < n; i++) {
        tp_node_t *x;
        tp_status_t rc = s_value_node(t, names[i], "prune", &x);
        if (rc < 0) {
            free(keep);
            return rc;
        }
        keep[x->id] = 1;
    }
    for (int i = t->nnodes - 1; i >= 0; i--) {
        tp_node_t *x = t->nodes[i];
        if (n > 0 && !keep[i])
            continue;
        for (int j = 0; j < x->ninputs; j++)
            keep[x->inputs[j]->id] = 1;
        for (int j = 0; j < 2; j++)
            if (x->state[j])
                keep[x->state[j]->id] = 1;
    }
    for (int i = 0; i < t->nnodes; i++)
        t->nodes[i]->pruned = n > 0 && !keep[i];
    free(keep);
    m->prune_serial++;
    return TP_OK;
}

uint64_t tp_model_prune_serial(const tp_model_t *m) {
    return m ? m->prune_serial : 0;
}

int tp_model_input_needed(const tp_model_t *m, int i) {
    if (!m || !m->infer || i < 0 || i >= m->ninputs)
        return 0;
    return !m->infer->input_nodes[i]->pruned;
}

int tp_model_input_count(const tp_model_t *m) { return m ? m->ninputs : 0; }
const tp_input_desc_t *tp_model_input_desc(const tp_model_t *m, int i) {
    return m && i >= 0 && i < m->ninputs ? &m->inputs[i] : NULL;
}
int64_t tp_model_infer_batch(const tp_model_t *m) {
    return m && m->infer ? m->infer->batch : 0;
}

/* ---- an input drawn on the tower's device (issue 44) ----------------------
 *
 * The GAN's noise z is a function of (seed, step, row, element) alone
 * (towerpack/philox.h), so the tower's backend draws it straight into the
 * input's planned buffer (tp_backend_noise_fill: a kernel on a GPU, the
 * host's Philox on the CPU, the same bits) and nothing crosses the
 * host->device copy; the view handed back is the feed that tells
 * s_load_inputs the input is in place. */
tp_status_t tp_model_fill_noise(tp_model_t *m, int tower, int input, uint64_t seed,
                                int64_t step, int64_t row0, int64_t rows, int normal,
                                float scale, tp_tensor_t *feed) {
    if (feed)
        tp_tensor_init_empty(feed);
    if (!m || !feed)
        return tp_error(TP_ERR_INVALID, "fill_noise: %s", !m ? "no model" : "no feed to fill");
    tp_tower_t *t = tp_model_tower_(m, tower);
    if (!t)
        return s_bad_tower(m, tower);
    if (input < 0 || input >= m->ninputs)
        return tp_error(TP_ERR_INVALID, "%s: fill_noise: input %d (the model has %d)",
                        t->name, input, m->ninputs);
    const tp_input_desc_t *d = &m->inputs[input];
    if (d->dtype != TP_FLOAT32 || d->ndim < 1)
        return tp_error(TP_ERR_INVALID, "%s: fill_noise: input '%s' is %s with %d dims, "
                        "noise needs float32 [batch, ...]", t->name, d->name,
                        tp_dtype_name(d->dtype), d->ndim);
    if (rows < 1 || rows > t->batch || row0 < 0)
        return tp_error(TP_ERR_SHAPE, "%s: fill_noise: rows %lld from row %lld into "
                        "input '%s', planned for 1..%lld rows", t->name, (long long)rows,
                        (long long)row0, d->name, (long long)t->batch);
    int64_t shape[TP_MAX_DIMS], dim = 1;
    shape[0] = rows;
    for (int k = 1; k < d->ndim; k++) {
        shape[k] = d->shape[k];
        dim *= d->shape[k];
    }
    tp_node_t *n = t->input_nodes[input];
    /* the planned buffer: a device's copy target, unused on the CPU
     * (which reads a fed tensor in place), [t->batch x dim] either way */
    float *dst = n->workspace;
    tp_backend_t *b = tp_tower_backend_(t);
    tp_status_t rc = tp_backend_noise_fill(b, t->stream, dst, seed, step, row0, rows, dim,
                                           normal, scale);
    if (rc < 0)
        return tp_error_wrap(rc, "%s: fill_noise: input '%s' on the %s backend", t->name,
                             d->name, b->ops->name);
    return tp_tensor_init_wrap(feed, TP_FLOAT32, d->ndim, shape, dst, NULL, NULL);
}

tp_status_t tp_model_fetch(tp_model_t *m, int tower, const char *name,
                           tp_tensor_t *view) {
    tp_tensor_init_empty(view);
    tp_tower_t *t = tp_model_tower_(m, tower);
    if (!t)
        return s_bad_tower(m, tower);
    tp_node_t *n;
    TP_TRY(s_value_node(t, name, "fetch", &n));
    return tp_tensor_init_wrap(view, n->dtype, n->run_shape.ndim,
                               n->run_shape.d, n->value, NULL, NULL);
}

/* The backend whose memory holds `p` (a view this model gave out): a
 * tower's activations or gradients, else a replica's arenas; replica 0's
 * when none claims it. */
static int s_within(const void *p, const void *base, size_t bytes) {
    return base && (const char *)p >= (const char *)base &&
           (const char *)p < (const char *)base + bytes;
}
static tp_backend_t *s_backend_of(tp_model_t *m, const void *p) {
    for (int k = -1; m->nrep > 1 && k < m->ntowers; k++) {
        const tp_tower_t *t = tp_model_tower_(m, k);
        if (t && (s_within(p, t->act_arena, t->act_bytes) ||
                  s_within(p, t->grads, m->ntrain * sizeof(float))))
            return tp_tower_backend_(t);
    }
    for (int r = 1; r < m->nrep; r++) {
        const tp_replica_t *rp = &m->rep[r];
        if (s_within(p, rp->train_arena, m->ntrain * sizeof(float)) ||
            s_within(p, rp->model_arena, m->nmodel * sizeof(float)))
            return rp->backend;
    }
    return m->backend;
}

const void *tp_model_view_host(tp_model_t *m, const tp_tensor_t *view,
                               void *host, size_t bytes) {
    if (!m || !view || !view->data) {
        tp_error(TP_ERR_INVALID, "view_host: no model or no view");
        return NULL;
    }
    tp_backend_t *b = s_backend_of(m, view->data);
    if (b->device < 0)
        return view->data; /* the CPU: already host memory, keep zero-copy */
    if (!host) {
        tp_error(TP_ERR_INVALID, "view_host: no host buffer for a %s view",
                 b->ops->name);
        return NULL;
    }
    if (bytes > view->nbytes)
        bytes = view->nbytes;
    const float *mv = bytes <= sizeof(float) ? s_mirrored(m, view->data) : NULL;
    if (mv) {  /* copied behind the run, already here */
        memcpy(host, mv, bytes);
        return host;
    }
    if (tp_model_drain_(m) < 0)
        return NULL;
    /* The towers' streams were synchronised at the end of their runs (the
     * model's contract), so the default stream's copy sees the values; a
     * device-to-host copy returns once they are on the host. */
    if (b->ops->copy(b, NULL, host, view->data, bytes, TP_COPY_D2H) < 0)
        return NULL;
    return host;
}

int tp_model_fetch_mean(tp_model_t *m, int towers, const char *name, double *mean) {
    double sum = 0;
    int got = 0;
    for (int i = 0; i < towers; i++) {
        tp_tensor_t v;
        if (tp_model_fetch(m, i, name, &v) != TP_OK)
            continue;
        float x;  /* on a GPU the view is device memory */
        const float *p = v.dtype == TP_FLOAT32 && v.nbytes >= sizeof x
                             ? tp_model_view_host(m, &v, &x, sizeof x)
                             : NULL;
        if (p) {
            sum += p[0];
            got++;
        }
        tp_tensor_fini(&v);
    }
    if (got)
        *mean = sum / got;
    return got;
}

int tp_model_metric_count(const tp_model_t *m, int tower) {
    tp_tower_t *t = tp_model_tower_((tp_model_t *)m, tower);
    int k = 0;
    for (int i = 0; t && i < t->noutputs; i++)
        k += t->outputs[i].metric;
    return k;
}

static tp_output_t *s_metric(const tp_model_t *m, int tower, int idx) {
    tp_tower_t *t = tp_model_tower_((tp_model_t *)m, tower);
    for (int i = 0, k = 0; t && i < t->noutputs; i++)
        if (t->outputs[i].metric && k++ == idx)
            return &t->outputs[i];
    return NULL;
}

const char *tp_model_metric_name(const tp_model_t *m, int tower, int i) {
    tp_output_t *o = s_metric(m, tower, i);
    return o ? o->name : NULL;
}

float tp_model_metric_value(const tp_model_t *m, int tower, int i) {
    tp_output_t *o = s_metric(m, tower, i);
    if (!o)
        return NAN;
    float v = NAN;
    tp_backend_t *b = tp_model_tower_backend((tp_model_t *)m, tower);
    const float *mv = s_mirrored(m, o->node->value);
    if (mv)
        return *mv;
    if (tp_model_drain_((tp_model_t *)m) < 0)
        return NAN;
    if (b->ops->copy(b, NULL, &v, o->node->value, sizeof v, TP_COPY_D2H) < 0)
        return NAN;
    return v;
}

int tp_model_var_count(const tp_model_t *m) { return m->nvars; }
const char *tp_model_var_name(const tp_model_t *m, int i) {
    return (i >= 0 && i < m->nvars) ? m->vars[i].name : NULL;
}
int tp_model_var_trainable(const tp_model_t *m, int i) {
    return (i >= 0 && i < m->nvars) ? m->vars[i].trainable : 0;
}

static int s_var_index(const tp_model_t *m, const char *name) {
    for (int i = 0; name && i < m->nvars; i++)
        if (strcmp(m->vars[i].name, name) == 0)
            return i;
    return -1;
}

tp_status_t tp_model_var(tp_model_t *m, const char *name, tp_tensor_t *view) {
    tp_tensor_init_empty(view);
    TP_TRY(tp_model_drain_(m));  /* no step still updating it */
    int i = s_var_index(m, name);
    if (i < 0)
        return tp_error(TP_ERR_NOT_FOUND, "no variable named '%s'",
                        name ? name : "(null)");
    return tp_tensor_init_wrap(view, TP_FLOAT32, m->vars[i].shape.ndim,
                               m->vars[i].shape.d, tp_var_data_(m, 0, i), NULL,
                               NULL);
}

tp_status_t tp_model_grad(tp_model_t *m, int tower, const char *name,
                          tp_tensor_t *view) {
    tp_tensor_init_empty(view);
    if (tower < 0 || tower >= m->ntowers)
        return s_bad_tower(m, tower);
    TP_TRY(tp_model_drain_(m));
    tp_tower_t *t = m->towers[tower];
    int i = s_var_index(m, name);
    if (i < 0 || !m->vars[i].trainable)
        return tp_error(TP_ERR_NOT_FOUND, "no trainable variable named '%s'",
                        name ? name : "(null)");
    if (!t->grads)
        return tp_error(TP_ERR_STATE, "%s keeps no gradients", t->name);
    return tp_tensor_init_wrap(view, TP_FLOAT32, m->vars[i].shape.ndim,
                               m->vars[i].shape.d, t->grads + m->vars[i].offset,
                               NULL, NULL);
}

tp_status_t tp_model_input_grad(tp_model_t *m, int tower, const char *name,
                                tp_tensor_t *view) {
    tp_tensor_init_empty(view);
    if (tower < 0 || tower >= m->ntowers)
        return s_bad_tower(m, tower);
    TP_TRY(tp_model_drain_(m));
    tp_tower_t *t = m->towers[tower];
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *n = t->nodes[i];
        if (n->kind != TP_OP_INPUT || !name || strcmp(n->name, name) != 0)
            continue;
        if (!n->want_grad || !n->grad)
            return tp_error(TP_ERR_NOT_FOUND, "%s: the gradient of input '%s' was "
                            "not asked for (tp_tower_input_gradient), or no cost "
                            "depends on it", t->name, name);
        return tp_tensor_init_wrap(view, TP_FLOAT32, n->run_shape.ndim,
                                   n->run_shape.d, n->grad, NULL, NULL);
    }
    return tp_error(TP_ERR_NOT_FOUND, "%s: no input named '%s'", t->name,
                    name ? name : "(null)");
}

tp_status_t tp_model_set_hparam(tp_model_t *m, const char *name, double value) {
    if (!m->opt)
        return tp_error(TP_ERR_STATE, "model has no optimizer");
    return tp_optimizer_set(m->opt, name, value);
}

tp_status_t tp_model_get_hparam(const tp_model_t *m, const char *name,
                                double *value) {
    if (!m->opt)
        return tp_error(TP_ERR_STATE, "model has no optimizer");
    return tp_optimizer_get(m->opt, name, value);
}

void tp_model_arenas(tp_model_t *m, tp_model_arenas_t *out) {
    if (tp_model_drain_(m) < 0)  /* reported again by the next run */
        TP_WARN("%s", tp_last_error());
    *out = (tp_model_arenas_t){
        .train = m->rep[0].train_arena, .ntrain = m->ntrain,
        .model = m->rep[0].model_arena, .nmodel = m->nmodel,
        .slots = {m->rep[0].slots[0], m->rep[0].slots[1]}, .nslots = m->nslots,
        .grads = m->ntowers > 0 ? m->towers[0]->grads : NULL,
        .ntowers = m->ntowers,
    };
}

tp_rng_t *tp_model_tower_rng(tp_model_t *m, int tower) {
    tp_tower_t *t = tp_model_tower_(m, tower);
    return t ? &t->rng : NULL;
}

/* The tower's timer marks for profiling: two around a run, two around
 * each op call (a forward and a backward per node at most). Without
 * them (a backend without timers, or out of memory) only the host's time
 * is profiled. */
static void s_prof_timer(tp_tower_t *t) {
    tp_backend_t *b = tp_tower_backend_(t);
    if (t->prof_timer || !b->ops->timer_new)
        return;
    int cap = 2 + 4 * t->nnodes;
    t->prof_node = calloc((size_t)t->nnodes * 2 + 1, sizeof *t->prof_node);
    t->prof_bwd = calloc((size_t)t->nnodes * 2 + 1, 1);
    if (t->prof_node && t->prof_bwd)
        t->prof_timer = b->ops->timer_new(b, cap);
    if (!t->prof_timer) {
        TP_WARN("%s: the device's time per op is not profiled: %s", t->name,
                tp_last_error());
        free(t->prof_node);
        free(t->prof_bwd);
        t->prof_node = NULL;
        t->prof_bwd = NULL;
        return;
    }
    t->prof_cap = cap;
    t->prof_ncalls = -1;
}

void tp_model_set_profiling(tp_model_t *m, int on) {
    if (on && !m->profiling)  /* what was queued ahead, before timing */
        tp_model_drain_(m);
    m->profiling = on != 0;
    if (!on)
        return;
    for (int k = -1; k < m->ntowers; k++) {
        tp_tower_t *t = tp_model_tower_(m, k);
        if (!t)
            continue;
        s_prof_timer(t);
        t->prof_run_dev_ns = 0;
        for (int i = 0; i < t->nnodes; i++)
            t->nodes[i]->prof_fwd_ns = t->nodes[i]->prof_bwd_ns =
                t->nodes[i]->prof_calls = t->nodes[i]->prof_fwd_dev_ns =
                    t->nodes[i]->prof_bwd_dev_ns = t->nodes[i]->prof_fwd_thr_ns =
                        t->nodes[i]->prof_bwd_thr_ns = t->nodes[i]->prof_fwd_proc_ns =
                            t->nodes[i]->prof_bwd_proc_ns = 0;
    }
}

uint64_t tp_model_profile_device_ns(const tp_model_t *m, int tower) {
    tp_tower_t *t = tp_model_tower_((tp_model_t *)m, tower);
    return t && t->prof_timer ? t->prof_run_dev_ns : 0;
}

/* The FLOPs of node n's forward and backward calls at its run shapes
 * (gpu/op_geometry.h); the backward counts the gradients cost 0 wants. */
static void s_node_flops(const tp_node_t *n, double *fwd, double *bwd) {
    tp_shape_t xshape[3];
    tp_op_call_t c;
    memset(&c, 0, sizeof c);
    c.kind = n->kind;
    c.attr = &n->attr;
    c.ninputs = n->ninputs < 3 ? n->ninputs : 3;
    for (int i = 0; i < c.ninputs; i++)
        xshape[i] = n->inputs[i]->run_shape;
    c.xshape = xshape;
    c.yshape = n->run_shape;
    const tp_op_flops_t f = c.ninputs ? tp_op_flops(&c) : (tp_op_flops_t){0, {0, 0}};
    *fwd = f.fwd;
    *bwd = 0;
    for (int i = 0; i < 2 && i < c.ninputs && n->backward; i++)
        if (n->inputs[i]->cost_mask & 1u)
            *bwd += f.bwd[i];
}

int tp_model_profile(const tp_model_t *m, int tower, tp_op_profile_t *out,
                     int max) {
    tp_tower_t *t = tp_model_tower_((tp_model_t *)m, tower);
    int k = 0;
    for (int i = 0; t && i < t->nnodes; i++) {
        const tp_node_t *n = t->nodes[i];
        if (n->kind == TP_OP_INPUT || n->kind == TP_OP_VARIABLE || n->folded ||
            n->nhwc_into)
            continue;
        int folds = 0;
        for (int j = i + 1; j < t->nnodes; j++)
            folds += t->nodes[j]->folded == n;
        for (int j = 0; j < n->ninputs; j++) /* a transpose it reads through */
            folds += n->inputs[j]->nhwc_into == n;
        if (out && k < max) {
            out[k] = (tp_op_profile_t){n->name, n->kind, n->prof_fwd_ns,
                                       n->prof_bwd_ns, n->prof_calls,
                                       n->prof_fwd_dev_ns, n->prof_bwd_dev_ns,
                                       folds, 0, 0, 0, 0, 0, 0};
            s_node_flops(n, &out[k].flops_forward, &out[k].flops_backward);
            out[k].thread_forward_ns = n->prof_fwd_thr_ns;
            out[k].thread_backward_ns = n->prof_bwd_thr_ns;
            out[k].process_forward_ns = n->prof_fwd_proc_ns;
            out[k].process_backward_ns = n->prof_bwd_proc_ns;
        }
        k++;
    }
    return k;
}
