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

/* Every node's readers (an output, metric or cost counts as two, so a
 * value something outside the graph reads never folds away), and, when
 * reader is given, its last reader; calloc'd, NULL when out of memory. */
static int *s_uses(const tp_tower_t *t, tp_node_t **reader) {
    int *uses = calloc((size_t)t->nnodes + 1, sizeof *uses);
    if (!uses)
        return NULL;
    for (int i = 0; i < t->nnodes; i++)
        for (int j = 0; j < t->nodes[i]->ninputs; j++) {
            uses[t->nodes[i]->inputs[j]->id]++;
            if (reader)
                reader[t->nodes[i]->inputs[j]->id] = t->nodes[i];
        }
    for (int i = 0; i < t->noutputs; i++)
        uses[t->outputs[i].node->id] += 2;
    for (int k = 0; k < t->ncosts; k++) /* costs[0] is the main cost */
        if (t->costs[k])
            uses[t->costs[k]->id] += 2;
    return uses;
}

/* a plan's own switch: NAME=0 in the environment turns it off */
static int s_switched_off(const char *name) {
    const char *env = getenv(name);
    return env && !strcmp(env, "0");
}

/* bias add c folds into product p: p's call adds the bias, c makes none;
 * p's own value is gone, its gradient is c's */
static void s_fold_bias(tp_node_t *p, tp_node_t *c) {
    p->fold_bias = c;
    p->hidden = 1;
    p->grad_alias = c;
    c->folded = p;
}

/* activation c (of p, which is q or folded into q) folds into q's call as
 * act: q's and p's values are gone, p's gradient is c's */
static void s_fold_act(tp_node_t *q, tp_node_t *p, tp_node_t *c, int act) {
    q->attr.act = act;
    q->hidden = 1;
    p->hidden = 1;
    p->grad_alias = c;
    c->folded = q;
}

void tp_plan_folds_(tp_tower_t *t) {
    int *uses = s_uses(t, NULL);
    if (!uses)
        return; /* no folds: correct, only slower */

    /* bias adds into the matmuls before them */
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *c = t->nodes[i], *p = c->ninputs == 2 ? c->inputs[0] : NULL;
        if (c->kind != TP_OP_BIAS_ADD || !p || p->kind != TP_OP_MATMUL ||
            p->fold_bias || uses[p->id] != 1 || p->cost_mask != c->cost_mask ||
            c->inputs[1]->kind != TP_OP_VARIABLE || p->dtype != TP_FLOAT32)
            continue;
        s_fold_bias(p, c);
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
        s_fold_act(q, p, c, TP_ACT_RELU);
    }

    /* batch_matmul's bias and GELU (issue 45; only where the backend runs
     * them, ops->bmm_fold: the CUDA backend only with TP_CUDA_BMM_FOLD=1,
     * not yet run on a GPU). A GPT's linear is add(batch_matmul(x, W), b[N]) and, in the MLP, a
     * gelu after it: three calls and three passes over a [B,T,N] output
     * forward, two more backward. Folded, the product adds b as oneDNN's
     * bias (dnnl_matmul.c), the GELU runs on it in one pass that keeps the
     * pre-activation in the call's workspace, and the backward turns dy
     * into the pre-activation's gradient and sums b's gradient in one
     * pass before its products (ops_linalg.c): the gelu op's own
     * arithmetic (cpu_math.h) and the bias gradient summed rows in order
     * as the add's backward sums it, so no number changes (test_fold).
     * Not where the product runs backward for more than one cost: its
     * backward turns the kept pre-activation into its gradient. */
    tp_backend_t *b = t->model ? tp_tower_backend_(t) : NULL;
    if (b && b->ops->bmm_fold && b->ops->bmm_fold(b)) {
        for (int i = 0; i < t->nnodes; i++) {
            tp_node_t *c = t->nodes[i], *p = c->ninputs == 2 ? c->inputs[0] : NULL;
            if (c->kind != TP_OP_ADD || c->folded || c->attr.act != TP_ACT_NONE || !p ||
                p->kind != TP_OP_BATCH_MATMUL ||
                p->fold_bias || p->attr.act != TP_ACT_NONE || uses[p->id] != 1 ||
                p->cost_mask != c->cost_mask || p->dtype != TP_FLOAT32 ||
                c->dtype != TP_FLOAT32 || !tp_shape_same(&p->shape, &c->shape) ||
                p->shape.ndim < 2 || p->inputs[1]->shape.ndim != 2)
                continue; /* (a linear's product: W unbatched [K,N]) */
            const tp_node_t *bv = c->inputs[1];
            if (bv->kind != TP_OP_VARIABLE || bv->dtype != TP_FLOAT32 || bv->shape.ndim != 1 ||
                bv->shape.d[0] != p->shape.d[p->shape.ndim - 1] || bv == p->inputs[0] ||
                bv == p->inputs[1])
                continue;
            s_fold_bias(p, c);
        }
        for (int i = 0; i < t->nnodes; i++) {
            tp_node_t *c = t->nodes[i], *p = c->ninputs == 1 ? c->inputs[0] : NULL;
            if ((c->kind != TP_OP_GELU && c->kind != TP_OP_GELU_TANH) || !p ||
                uses[p->id] != 1 || p->cost_mask != c->cost_mask || p->dtype != TP_FLOAT32 ||
                c->dtype != TP_FLOAT32 || (c->cost_mask & (c->cost_mask - 1u)))
                continue;
            tp_node_t *q = p->folded ? p->folded : p;
            if (q->kind != TP_OP_BATCH_MATMUL || q->attr.act != TP_ACT_NONE ||
                q->inputs[1]->shape.ndim != 2)
                continue;
            s_fold_act(q, p, c, c->kind == TP_OP_GELU ? TP_ACT_GELU : TP_ACT_GELU_TANH);
        }
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
    if (s_switched_off("TP_BLK16_CHAIN"))
        return;
    tp_backend_t *b = t->model ? tp_tower_backend_(t) : NULL;
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

/* ---- the ResNet block end in one call (issue 49) ---------------------------
 *
 * A residual block ends relu(bn(conv(h)) + skip): a batch norm call (two
 * passes over its input and one write), then the add with its folded relu
 * (two reads and a write), and backward the relu's mask, the add's copy of
 * dy to both operands and batch norm's own two passes. Folded, the batch
 * norm's call adds the skip and applies the relu as it normalises (one
 * stats pass, one pass that reads x and the skip and writes y), and its
 * backward masks dy by y > 0, stores the skip's gradient and sums dgamma
 * and dbeta in one pass, then writes dx in a second (gpu/cpu/
 * cpu_block_end.c). The add (and the relu) make no call: their value is
 * the batch norm's output, their gradient its dy; the batch norm's own
 * value is gone (hidden).
 *
 * The call runs where the batch norm runs, so the skip must be computed by
 * then (a lower id: of an add of two batch norms, the projection block's,
 * the later one makes the call and the earlier one's output is its skip),
 * and the skip's gradient, written there instead of at the add, must keep
 * its place among its writers: no other reader of the skip between the
 * two. Sums in another order than oneDNN's or ops_cpu.c's batch norm:
 * numbers move by float reassociation only (test_fold, test_dnnl_ops). */
void tp_plan_block_end_(tp_tower_t *t) {
    if (s_switched_off("TP_CPU_BLOCK_END"))
        return;
    tp_backend_t *b = t->model ? tp_tower_backend_(t) : NULL;
    if (!b || !b->ops->bnorm_add || !b->ops->bnorm_add(b))
        return;
    int *uses = s_uses(t, NULL);
    if (!uses)
        return; /* no folds: correct, only slower */
    for (int i = 0; i < t->nnodes; i++) {
        tp_node_t *a = t->nodes[i];
        if (a->kind != TP_OP_ADD || a->ninputs != 2 || a->folded || a->dtype != TP_FLOAT32 ||
            !tp_shape_same(&a->inputs[0]->shape, &a->shape) ||
            !tp_shape_same(&a->inputs[1]->shape, &a->shape))
            continue;
        /* the operand with the higher id makes the call */
        const int j = a->inputs[1]->id > a->inputs[0]->id ? 1 : 0;
        tp_node_t *bn = a->inputs[j], *sk = a->inputs[1 - j];
        if (bn->kind != TP_OP_BATCH_NORM || bn->ninputs != 3 || bn->folded || bn->hidden ||
            bn->attr.act != TP_ACT_NONE || bn->dtype != TP_FLOAT32 || uses[bn->id] != 1 ||
            bn->cost_mask != a->cost_mask || !(bn->attr.training || !bn->backward) ||
            sk == bn->inputs[0] || sk->id >= bn->id || bn->blk16 != a->blk16 ||
            bn->inputs[0]->shape.ndim < 2)
            continue;
        /* the skip's gradient is written at bn's backward instead of the
         * add's: no other reader of it in between */
        int between = 0;
        for (int q = bn->id + 1; q < a->id && !between; q++)
            for (int r = 0; r < t->nodes[q]->ninputs; r++)
                between |= t->nodes[q]->inputs[r] == sk;
        if (between)
            continue;
        /* the relu folded into the add (tp_plan_folds_), if any */
        tp_node_t *relu = NULL;
        for (int q = a->id + 1; q < t->nnodes && !relu; q++)
            if (t->nodes[q]->folded == a)
                relu = t->nodes[q];
        if (relu && a->attr.act != TP_ACT_RELU)
            continue;
        bn->fold_skip = a;
        bn->attr.act = a->attr.act;
        a->attr.act = TP_ACT_NONE;
        bn->hidden = 1;
        bn->grad_alias = relu ? relu : a; /* the block output's gradient */
        a->folded = bn;
        if (relu)
            relu->folded = bn;
    }
    free(uses);
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
    if (s_switched_off("TP_NHWC_FOLD"))
        return;
    tp_backend_t *b = t->model ? tp_tower_backend_(t) : NULL;
    if (!b || !b->ops->conv_nhwc)
        return;
    tp_node_t **reader = calloc((size_t)t->nnodes + 1, sizeof *reader);
    int *uses = reader ? s_uses(t, reader) : NULL;
    if (!uses) {
        free(reader);
        return; /* no folds: correct, only slower */
    }
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
