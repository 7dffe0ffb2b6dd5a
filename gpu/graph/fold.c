/* towerpack gpu: folds, the plan that lets one op call do the work of the
 * bias add and the relu after it.
 *
 * A layer built as matmul -> bias add -> relu makes three calls and three
 * passes over its output (on a GPU: three kernels after the product; the
 * relu's backward one more). Folded, the matmul's call adds the bias and
 * applies the relu in one pass over its product, and its backward masks
 * dy and sums the bias gradient before its own products. A relu after a
 * convolution (plain or transposed), a batch norm, a bias add or an add
 * folds the same way.
 *
 * The graph keeps every node (names, inputs, kinds and what a user walks
 * stay as built); a folded node only stops making calls: its value is
 * the folding node's output and that node's output gradient is its own.
 * A fold happens only where it changes no number: the node folded over
 * has that one consumer, is no output, metric or cost, and runs backward
 * for the same costs. Its own value is then gone (overwritten by the
 * relu's or the bias's): fetching or pruning to it is an error that says
 * so (model.c), and tp_model_config_t.fold = 0 keeps every value. */
#include <stdlib.h>
#include <string.h>
#include "gpu/graph/graph_internal.h"

/* The transposed convolution's relu goes into its bias pass (oneDNN's
 * path, dnnl_conv.c) or one pass after its own kernels (ops_cpu.c): either
 * way one pass over the output fewer, and the relu's backward is the
 * mask before the op's backward. */
static int s_relu_folds_into(tp_op_kind_t k) {
    return k == TP_OP_MATMUL || k == TP_OP_CONV2D || k == TP_OP_CONV_TRANSPOSE ||
           k == TP_OP_BATCH_NORM || k == TP_OP_BIAS_ADD || k == TP_OP_ADD;
}

void tp_plan_folds_(tp_tower_t *t) {
    /* every node's readers; an output, metric or cost counts as two */
    int *uses = calloc((size_t)t->nnodes + 1, sizeof *uses);
    if (!uses)
        return; /* no folds: correct, only slower */
    for (int i = 0; i < t->nnodes; i++)
        for (int j = 0; j < t->nodes[i]->ninputs; j++)
            uses[t->nodes[i]->inputs[j]->id]++;
    for (int i = 0; i < t->noutputs; i++)
        uses[t->outputs[i].node->id] += 2;
    for (int k = 0; k < t->ncosts; k++) /* costs[0] is the main cost */
        if (t->costs[k])
            uses[t->costs[k]->id] += 2;

    /* bias adds into the matmuls before them */
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *c = t->nodes[i], *p = c->ninputs == 2 ? c->inputs[0] : NULL;
        if (c->kind != TP_OP_BIAS_ADD || !p || p->kind != TP_OP_MATMUL ||
            p->fold_bias || uses[p->id] != 1 || p->cost_mask != c->cost_mask ||
            c->inputs[1]->kind != TP_OP_VARIABLE || p->dtype != TP_FLOAT32)
            continue;
        p->fold_bias = c;
        p->hidden = 1;
        p->grad_alias = c;
        c->folded = p;
    }

    /* relus into the op before them (through a folded bias add) */
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *c = t->nodes[i], *p = c->ninputs == 1 ? c->inputs[0] : NULL;
        if (c->kind != TP_OP_RELU || !p || uses[p->id] != 1 ||
            p->cost_mask != c->cost_mask || p->dtype != TP_FLOAT32)
            continue;
        tp_node_t *q = p->folded ? p->folded : p;
        if (!s_relu_folds_into(q->kind) || q->attr.act != TP_ACT_NONE)
            continue;
        q->attr.act = TP_ACT_RELU;
        q->hidden = 1;
        p->hidden = 1;
        p->grad_alias = c;
        c->folded = q;
    }
    free(uses);
}

/* ---- activations kept nChw16c between ops (issue 49) ----------------------
 *
 * On the CPU every oneDNN convolution ran on nChw16c ([N, C/16, H, W, 16],
 * AVX-512's blocked layout) and reordered x, y, dy and dx between it and
 * the graph's NCHW at its edges: four passes over each activation, ~10% of
 * a ResNet step. A tensor whose every reader takes the blocked layout can
 * stay in it: the convolution's input and output, batch norm's (oneDNN's
 * kernel on nChw16c), and the elementwise add and relu (the same numbers
 * in any layout, so long as all their operands share it), max and average
 * pooling's (oneDNN's, dnnl_pool.c), and the global average pool's input
 * (ops_cpu.c reads either). The value and the gradient of a node share
 * its layout. What leaves the chain (a reshape, an output, a metric, a
 * cost) reads NCHW, so its producer stays NCHW, and with it every tensor
 * tied to it by an add, a relu, a pooling or a batch norm; the
 * convolutions at the chain's edges reorder as before. Only a backend that says it runs such calls (ops->nchw16c)
 * gets them; tp_model_config_t.fold = 0 (TP_FOLD=0) keeps every tensor
 * NCHW, and TP_BLK16_CHAIN=0 this plan alone. */

/* n's 4-D float shape with C a multiple of 16 */
static int s_blk16_shape(const tp_node_t *n) {
    return n->dtype == TP_FLOAT32 && n->shape.ndim == 4 && n->shape.d[1] > 0 &&
           n->shape.d[1] % 16 == 0;
}

/* conv2d's input x may be blocked: ungrouped, C a multiple of 16 */
static int s_blk16_conv_in(const tp_node_t *conv) {
    return conv->ninputs >= 2 && (conv->attr.groups <= 1) &&
           s_blk16_shape(conv->inputs[0]);
}

/* n's own call may produce a blocked value: a conv2d whose output has C a
 * multiple of 16 and at least 8 input channels (fewer run oneDNN's
 * backward-data through im2col on NCHW, dnnl_conv.c) or an input that
 * wants no gradient, batch norm (not an inference-mode one that runs
 * backward: that is ops_cpu.c's kernel), add of same-shaped inputs,
 * pooling that oneDNN runs, relu */
static int s_blk16_kind(const tp_node_t *n) {
    if (!s_blk16_shape(n) || n->folded)
        return 0;
    switch (n->kind) {
    case TP_OP_CONV2D: /* (an input that wants no gradient needs no
                          backward-data: the first layer's image) */
        return n->attr.groups <= 1 && n->ninputs >= 2 && n->inputs[0]->shape.ndim == 4 &&
               (n->inputs[0]->shape.d[1] >= 8 || !n->inputs[0]->backward);
    case TP_OP_BATCH_NORM:
        return n->ninputs == 3 && (n->attr.training || !n->backward);
    case TP_OP_ADD:
        return n->ninputs == 2 && tp_shape_same(&n->inputs[0]->shape, &n->shape) &&
               tp_shape_same(&n->inputs[1]->shape, &n->shape);
    case TP_OP_MAX_POOL:
    case TP_OP_AVG_POOL: { /* oneDNN's (dnnl_pool.c): not a window past the
                              input's end, a stride that skips rows */
        const tp_shape_t *x = &n->inputs[0]->shape;
        return n->ninputs == 1 && x->ndim == 4 &&
               (n->shape.d[2] - 1) * n->attr.sh + n->attr.kh - x->d[2] - n->attr.ph >= 0 &&
               (n->shape.d[3] - 1) * n->attr.sw + n->attr.kw - x->d[3] - n->attr.pw >= 0;
    }
    case TP_OP_RELU:
        return n->ninputs == 1;
    default:
        return 0;
    }
}

void tp_plan_blk16_(tp_tower_t *t) {
    const char *env = getenv("TP_BLK16_CHAIN");
    if (env && !strcmp(env, "0"))
        return;
    tp_model_t *m = t->model;
    tp_backend_t *b = m ? m->backend : NULL;
    if (!b || !b->ops->nchw16c || !b->ops->nchw16c(b))
        return;
    /* candidates: the calls that may write a blocked value (a folded
     * node's value is its caller's, decided with it) */
    for (int i = 0; i < t->nnodes; i++)
        t->nodes[i]->blk16 = s_blk16_kind(t->nodes[i]);
    for (int i = 0; i < t->noutputs; i++)
        ((tp_node_t *)tp_node_caller_(t->outputs[i].node))->blk16 = 0;
    for (int k = 0; k < t->ncosts; k++)
        if (t->costs[k])
            ((tp_node_t *)tp_node_caller_(t->costs[k]))->blk16 = 0;
    /* every reader must take the layout, and the elementwise ops and batch
     * norm have one layout for all their activations: clear until nothing
     * changes (each pass only clears, so it ends) */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < t->nnodes; i++) {
            tp_node_t *n = t->nodes[i];
            if (n->folded)
                continue; /* reads its caller's value inside one call */
            for (int j = 0; j < n->ninputs; j++) {
                tp_node_t *p = (tp_node_t *)tp_node_caller_(n->inputs[j]);
                const int tied = (n->kind == TP_OP_BATCH_NORM && j == 0) ||
                                 n->kind == TP_OP_ADD || n->kind == TP_OP_RELU ||
                                 n->kind == TP_OP_MAX_POOL || n->kind == TP_OP_AVG_POOL;
                if (tied && p->blk16 != n->blk16) { /* one layout for both */
                    p->blk16 = n->blk16 = 0;
                    changed = 1;
                } else if (!tied && p->blk16 &&
                           !(n->kind == TP_OP_CONV2D && j == 0 && s_blk16_conv_in(n)) &&
                           !(n->kind == TP_OP_GLOBAL_AVG_POOL && j == 0)) {
                    /* a reader of NCHW only (the conv's weights, a reshape,
                     * ...); a conv's x and the global average pool's (ops_cpu.c)
                     * take either, whatever their own output's layout */
                    p->blk16 = 0;
                    changed = 1;
                }
            }
        }
    }
    /* a folded node's value (and gradient) is its caller's */
    for (int i = 0; i < t->nnodes; i++)
        if (t->nodes[i]->folded)
            t->nodes[i]->blk16 = t->nodes[i]->folded->blk16;
}

/* ---- NHWC input read by the convolution (issue 42) ------------------------
 *
 * A model fed NHWC images ([N, H, W, C], as decoders and most datasets
 * give them) writes tp_transpose(perm 0, 3, 1, 2) before its first
 * conv2d: a full copy of the batch each step, forward, and another for
 * the input's gradient when one is asked (a saliency map). Where that
 * transpose's one reader is a conv2d (it is no output, metric or cost),
 * the conv reads the NHWC buffer itself: oneDNN's nhwc memory descriptor
 * for its source (dnnl_conv.c), its gradient written NHWC. The transpose
 * stays in the graph (names, walks) and makes no call; its value is never
 * made, so fetching it is an error that says so (model.c). Only where the
 * backend says it runs that call (ops->conv_nhwc: on the CPU oneDNN's
 * paths, not im2col nor a few-channel image's backward-data); an input
 * whose gradient is wanted only when it is a tower input the transpose
 * alone reads (its gradient then has one writer and stays live, as every
 * input's). tp_model_config_t.fold = 0 (TP_FOLD=0) keeps every transpose,
 * TP_NHWC_FOLD=0 this fold alone. */

/* t is a transpose NHWC -> NCHW of a 4-D float */
static int s_nhwc_transpose(const tp_node_t *t) {
    const int64_t *p = t->attr.dims_a;
    return t->kind == TP_OP_TRANSPOSE && t->ninputs == 1 && t->shape.ndim == 4 &&
           t->inputs[0]->shape.ndim == 4 && t->dtype == TP_FLOAT32 &&
           t->inputs[0]->dtype == TP_FLOAT32 && p[0] == 0 && p[1] == 3 && p[2] == 1 &&
           p[3] == 2;
}

/* whether backend b runs conv c with t's input read NHWC: the call as the
 * plan will make it (shapes, attributes, the gradients wanted) */
static int s_nhwc_backend(tp_backend_t *b, const tp_node_t *c, const tp_node_t *t) {
    static float wanted; /* a gradient's stand-in: the backend only tests it */
    tp_shape_t xs[TP_OP_MAX_INPUTS];
    float *dx[TP_OP_MAX_INPUTS];
    const void *x[TP_OP_MAX_INPUTS];
    if (c->ninputs > TP_OP_MAX_INPUTS)
        return 0;
    for (int j = 0; j < c->ninputs; j++) {
        const tp_node_t *in = j == 0 ? t->inputs[0] : c->inputs[j];
        xs[j] = c->inputs[j]->run_shape; /* x: the NCHW shape */
        dx[j] = in->cost_mask ? &wanted : NULL;
        x[j] = NULL;
    }
    tp_op_call_t call = {.kind = c->kind, .attr = &c->attr, .name = c->name,
                         .ninputs = c->ninputs, .x = x, .xshape = xs,
                         .yshape = c->run_shape, .dx = dx, .node = c, .nhwc = 1};
    return b->ops->conv_nhwc(b, &call);
}

void tp_plan_nhwc_(tp_tower_t *t) {
    const char *env = getenv("TP_NHWC_FOLD");
    if (env && !strcmp(env, "0"))
        return;
    tp_backend_t *b = t->model ? tp_tower_backend_(t) : NULL;
    if (!b || !b->ops->conv_nhwc)
        return;
    /* every node's readers; an output, metric or cost counts as two */
    int *uses = calloc((size_t)t->nnodes + 1, sizeof *uses);
    tp_node_t **reader = calloc((size_t)t->nnodes + 1, sizeof *reader);
    if (!uses || !reader) {
        free(uses);
        free(reader);
        return; /* no folds: correct, only slower */
    }
    for (int i = 0; i < t->nnodes; i++)
        for (int j = 0; j < t->nodes[i]->ninputs; j++) {
            uses[t->nodes[i]->inputs[j]->id]++;
            reader[t->nodes[i]->inputs[j]->id] = t->nodes[i];
        }
    for (int i = 0; i < t->noutputs; i++)
        uses[t->outputs[i].node->id] += 2;
    for (int k = 0; k < t->ncosts; k++)
        if (t->costs[k])
            uses[t->costs[k]->id] += 2;
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *tr = t->nodes[i];
        if (!s_nhwc_transpose(tr) || uses[tr->id] != 1 || tr->folded)
            continue;
        tp_node_t *c = reader[tr->id], *src = tr->inputs[0];
        if (c->kind != TP_OP_CONV2D || c->ninputs < 2 || c->inputs[0] != tr ||
            c->folded || src->cost_mask != tr->cost_mask)
            continue;
        /* its gradient: written by the conv's backward in place of the
         * transpose's (earlier in the pass), so only the transpose may
         * read it, and it is a tower input (live always, memplan.c) */
        if (src->backward && (src->kind != TP_OP_INPUT || uses[src->id] != 1))
            continue;
        if (!s_nhwc_backend(b, c, tr))
            continue;
        tr->nhwc_into = c;
    }
    free(uses);
    free(reader);
}
