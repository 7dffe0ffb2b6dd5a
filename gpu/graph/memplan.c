/* towerpack gpu/graph: the memory a tower's plan needs, said as memory.
 *
 * A tower's activations, gradients and workspaces are planned as one arena
 * (model.c, s_plan_tower). When that arena cannot be had, the user must
 * learn that memory is lacking, how much, what limits it and which node is
 * the largest (issue 48: "tower0: 869332574848 bytes of activations" said
 * none of that). On a host backend a plan larger than the process can ever
 * get (RAM + swap, ulimit -v) is refused before it is tried, so that a
 * hopeless run never starts paging or waits on the kernel's OOM killer. */
#include <stdio.h>
#include <stdlib.h>
#include <towerpack/process.h>
#include "gpu/backend_impl.h"
#include "gpu/graph/graph_internal.h"

/* The node with the largest value (and gradient), "node NAME (OP), shape
 * [A,B,...] (N bytes)" into buf. */
static void s_largest(const tp_tower_t *t, char *buf, size_t size) {
    const tp_node_t *big = NULL;
    size_t big_bytes = 0;
    for (int i = 0; i < t->nnodes; i++) {
        const tp_node_t *n = t->nodes[i];
        if (n->kind == TP_OP_VARIABLE || n->kind == TP_OP_RESHAPE || n->folded)
            continue;
        size_t bytes = tp_shape_count(&n->shape) * tp_dtype_size(n->dtype) *
                       (n->backward ? 2 : 1);
        if (bytes > big_bytes) {
            big = n;
            big_bytes = bytes;
        }
    }
    if (!big) {
        snprintf(buf, size, "no node");
        return;
    }
    int o = snprintf(buf, size, "node %s (%s), shape [", big->name ? big->name : "?",
                     tp_op_name(big->kind));
    for (int i = 0; i < big->shape.ndim && o > 0 && (size_t)o < size; i++)
        o += snprintf(buf + o, size - (size_t)o, "%s%lld", i ? "," : "",
                      (long long)big->shape.d[i]);
    if (o > 0 && (size_t)o < size)
        snprintf(buf + o, size - (size_t)o, "], %zu bytes%s", big_bytes,
                 big->backward ? " with its gradient" : "");
}

tp_status_t tp_plan_memory_(const tp_tower_t *t, size_t total, int failed) {
    const tp_backend_t *b = tp_tower_backend_(t);
    char big[256];
    s_largest(t, big, sizeof big);
    const char *hint = t->index < 0 ? "lower the batch of the validation data or the image size"
                                    : "lower --batch or --image-size, or use fewer towers";
    if (failed && b->device >= 0)
        return tp_error(TP_ERR_NOMEM, "out of memory: %zu bytes of activations for %s on "
                        "GPU %d (largest: %s); %s", total, t->name, b->device, big, hint);
    if (failed)
        return tp_error_nomem(total, "of activations for %s (largest: %s); %s", t->name, big,
                              hint);
    if (b->device >= 0)  /* device memory: the device's allocator says */
        return TP_OK;
    return tp_mem_check(total, hint, "of activations for %s (largest: %s)", t->name, big);
}

/* ---- reuse of slots whose lifetimes do not overlap --------------------- */

/* largest first; ties in array order (the same plan every time) */
static int s_cmp_size(const void *a, const void *b) {
    const tp_slot_t *x = *(const tp_slot_t *const *)a, *y = *(const tp_slot_t *const *)b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return x < y ? -1 : x > y;
}

static int s_cmp_off(const void *a, const void *b) {
    const tp_slot_t *x = *(const tp_slot_t *const *)a, *y = *(const tp_slot_t *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

size_t tp_plan_slots_(tp_slot_t *s, int n) {
    size_t pinned = 0;
    for (int i = 0; i < n; i++)
        if (s[i].lo < 0) {
            s[i].off = pinned;
            pinned += s[i].bytes;
        }
    tp_slot_t **order = malloc(((size_t)n + 1) * sizeof *order);
    const tp_slot_t **live = malloc(((size_t)n + 1) * sizeof *live);
    if (!order || !live) {
        free(order);
        free(live);
        return (size_t)-1;
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (s[i].lo >= 0 && s[i].bytes)
            order[m++] = &s[i];
        else if (s[i].lo >= 0)
            s[i].off = pinned; /* empty: anywhere */
    qsort(order, (size_t)m, sizeof *order, s_cmp_size);
    size_t top = pinned;
    for (int k = 0; k < m; k++) {
        tp_slot_t *x = order[k];
        int nl = 0; /* the placed slots live at a step x is live at */
        for (int j = 0; j < k; j++) {
            const tp_slot_t *y = order[j];
            if (y->lo <= x->hi && x->lo <= y->hi)
                live[nl++] = y;
        }
        qsort(live, (size_t)nl, sizeof *live, s_cmp_off);
        size_t off = pinned; /* first fit: the lowest gap that holds x */
        for (int j = 0; j < nl; j++) {
            if (live[j]->off >= off + x->bytes)
                break;
            if (live[j]->off + live[j]->bytes > off)
                off = live[j]->off + live[j]->bytes;
        }
        x->off = off;
        if (off + x->bytes > top)
            top = off + x->bytes;
    }
    free(order);
    free(live);
    return top;
}
