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
