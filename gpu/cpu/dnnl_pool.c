/* towerpack gpu: max and average pooling on oneDNN for the CPU backend
 * (dnnl_ops.h): forward (training propagation: max pooling writes its
 * argmax into the op's workspace) and backward, on the op's plain NCHW
 * buffers (a blocked layout would cost two reorders around an op that
 * reads each value once). Average pooling excludes the padding, as
 * ops_cpu.c's (and PyTorch's count_include_pad=False) does. The window's
 * right padding is what makes oneDNN's output size ours; a negative one (a
 * stride that skips the last rows) is left to ops_cpu.c. Inside a blocked
 * chain (tp_op_call_t.blk16, gpu/graph/fold.c) x, y and their gradients
 * are nChw16c, and oneDNN runs the call whatever TP_CPU_POOL says. */
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/dnnl_ops.h"

enum { S_ALIGN = 64 };

static size_t s_round(size_t b) { return (b + S_ALIGN - 1) & ~(size_t)(S_ALIGN - 1); }

/* The call's key: its geometry (dnnl_ops.h, the convolutions' too),
 * zero-padded to the list's 160 bytes. */
static void s_key(const tp_op_call_t *c, unsigned char out[160]) {
    tp_dnnl_geom_t k;
    _Static_assert(sizeof k <= 160, "tp_dnnl_geom_t fits a tp_dnnl_prim_t key");
    tp_dnnl_geom(c, tp_dnnl_threads(), &k);
    memset(out, 0, 160);
    memcpy(out, &k, sizeof k);
}

/* extra[0]: the scratchpad's offset past the workspace; extra[1]: the
 * bytes the op's workspace needs */
static tp_status_t s_build(tp_dnnl_prim_t *e, const tp_op_call_t *c) {
    const char *name = c->name;
    tp_dnnl_geom_t k;
    memcpy(&k, e->key, sizeof k);
    dnnl_dims_t xd = {k.n, k.c, k.h, k.w}, yd = {k.n, k.c, k.oh, k.ow};
    dnnl_dims_t strides = {k.sh, k.sw}, kernel = {k.kh, k.kw}, pl = {k.ph, k.pw};
    dnnl_dims_t pr = {(k.oh - 1) * k.sh + k.kh - k.h - k.ph, (k.ow - 1) * k.sw + k.kw - k.w - k.pw};
    if (pr[0] < 0 || pr[1] < 0)
        return TP_OK; /* e->ok 0: ops_cpu.c's */
    dnnl_memory_desc_t xm, ym;
    dnnl_status_t st = dnnl_memory_desc_init_by_tag(&xm, 4, xd, dnnl_f32,
                                                    (k.blk16 & 1) ? dnnl_nChw16c : dnnl_nchw);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_tag(&ym, 4, yd, dnnl_f32,
                                          (k.blk16 & 2) ? dnnl_nChw16c : dnnl_nchw);
    const dnnl_alg_kind_t alg = k.kind == TP_OP_MAX_POOL ? dnnl_pooling_max : dnnl_pooling_avg_exclude_padding;
    dnnl_pooling_desc_t fd, bd;
    if (st == dnnl_success)
        st = dnnl_pooling_forward_desc_init(&fd, dnnl_forward_training, alg, &xm, &ym, strides,
                                            kernel, pl, pr);
    if (st == dnnl_success)
        st = dnnl_pooling_backward_desc_init(&bd, alg, &xm, &ym, strides, kernel, pl, pr);
    if (st == dnnl_unimplemented || st == dnnl_invalid_arguments)
        return TP_OK;
    if (st != dnnl_success)
        return tp_dnnl_fail(st, "pooling descriptors", name, __FILE__, __LINE__);
    return tp_dnnl_build_pair(e, &fd, &bd, 0, "pooling", name);
}

/* The call's entry when oneDNN runs it (NULL: ops_cpu.c's), whatever the
 * workspace: a call whose workspace was sized for ops_cpu.c (a backend
 * that borrows this one's op table plans without oneDNN) runs on a
 * workspace of its own (s_ws), so that a model gives the same numbers
 * whoever planned it. */
static tp_status_t s_entry(const tp_op_call_t *c, tp_dnnl_prim_t **out, int *owned) {
    *out = NULL;
    *owned = 0;
    const tp_op_attr_t *a = c->attr;
    const int path = tp_dnnl_ops_path("TP_CPU_POOL");
    /* unset: all but ops_cpu.c's 2x2 stride 2 max pooling (docs/performance.md) */
    const int own_fast = c->kind == TP_OP_MAX_POOL && a->kh == 2 && a->kw == 2 &&
                         a->sh == 2 && a->sw == 2 && a->ph == 0 && a->pw == 0;
    if (!c->blk16 && (path == 0 || (path < 0 && own_fast) || c->xshape[0].ndim != 4))
        return TP_OK;
    unsigned char key[160];
    s_key(c, key);
    TP_TRY(tp_dnnl_entry(key, s_build, c, 0, out, owned));
    if (!*out && c->blk16) /* ops_cpu.c reads NCHW only; fold.c plans none such */
        return tp_error(TP_ERR_UNSUPPORTED, "%s: pooling on nChw16c that oneDNN does not "
                        "run (dnnl_pool.c); TP_BLK16_CHAIN=0 keeps it NCHW", c->name);
    return TP_OK;
}

size_t tp_dnnl_pool_workspace(const tp_op_call_t *c, size_t own) {
    tp_dnnl_prim_t *e;
    int owned;
    if (s_entry(c, &e, &owned) != TP_OK) {
        tp_clear_error(); /* the run's own call reports it */
        return own;
    }
    if (!e)
        return own;
    const size_t bytes = e->extra[1];
    if (owned)
        tp_dnnl_prim_free(e);
    return bytes;
}

/* A workspace of the call's own (*own, the caller frees it) when the
 * planned one is smaller than e needs, with `extra` bytes more; NULL when
 * the planned one will do. */
static tp_status_t s_ws(const tp_op_call_t *c, const tp_dnnl_prim_t *e, size_t extra,
                        char **own) {
    *own = NULL;
    if (c->workspace && c->workspace_bytes >= e->extra[1] && !extra)
        return TP_OK;
    if (!(*own = malloc(e->extra[1] + extra + 1)))
        return tp_error(TP_ERR_NOMEM, "%s: %zu bytes of oneDNN pooling workspace", c->name,
                        e->extra[1] + extra);
    return TP_OK;
}

/* The forward of e into `out` with the workspace at ws. */
static tp_status_t s_fwd(const tp_op_call_t *c, const tp_dnnl_prim_t *e, char *ws, void *out) {
    int args[4] = {DNNL_ARG_SRC, DNNL_ARG_DST}, n = 2;
    const dnnl_memory_desc_t *mds[4];
    void *ptrs[4] = {(void *)c->x[0], out};
    dnnl_memory_desc_t xm, ym;
    const tp_shape_t *x = &c->xshape[0], *y = &c->yshape;
    dnnl_dims_t xd = {x->d[0], x->d[1], x->d[2], x->d[3]};
    dnnl_dims_t yd = {y->d[0], y->d[1], y->d[2], y->d[3]};
    dnnl_memory_desc_init_by_tag(&xm, 4, xd, dnnl_f32, (c->blk16 & 1u) ? dnnl_nChw16c : dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&ym, 4, yd, dnnl_f32,
                                 (c->blk16 & TP_BLK16_Y) ? dnnl_nChw16c : dnnl_nchw);
    mds[0] = &xm;
    mds[1] = &ym;
    if (e->ws_bytes) {
        args[n] = DNNL_ARG_WORKSPACE;
        mds[n] = &e->ws;
        ptrs[n++] = ws;
    }
    if (e->fwd_scratch_bytes) {
        args[n] = DNNL_ARG_SCRATCHPAD;
        mds[n] = &e->fwd_scratch;
        ptrs[n++] = ws + e->extra[0];
    }
    return tp_dnnl_exec(e->fwd, n, args, mds, ptrs, c->name);
}

tp_status_t tp_dnnl_pool_forward(const tp_op_call_t *c, int *done) {
    tp_dnnl_prim_t *e;
    int owned;
    *done = 0;
    TP_TRY(s_entry(c, &e, &owned));
    if (!e)
        return TP_OK;
    char *own = NULL;
    tp_status_t rc = s_ws(c, e, 0, &own);
    if (rc == TP_OK)
        rc = s_fwd(c, e, own ? own : c->workspace, c->y);
    free(own);
    if (owned)
        tp_dnnl_prim_free(e);
    *done = 1;
    return rc;
}

tp_status_t tp_dnnl_pool_backward(const tp_op_call_t *c, int *done) {
    tp_dnnl_prim_t *e;
    int owned;
    *done = 0;
    TP_TRY(s_entry(c, &e, &owned));
    if (!e)
        return TP_OK;
    *done = 1;
    tp_status_t rc = TP_OK;
    float *dx = c->dx[0], *tmp = NULL;
    const size_t nx = tp_shape_count(&c->xshape[0]);
    /* a gradient added to (the input has other readers): oneDNN stores,
     * so into a buffer of this call's, then added */
    if (dx && c->dx_acc[0] && !(tmp = malloc(nx * sizeof(float))))
        rc = tp_error(TP_ERR_NOMEM, "%s: %zu floats for the pooling's gradient", c->name, nx);
    /* a workspace the plan did not size: the max's argmax is gone with the
     * forward's, so the forward runs again here, into this call's room */
    char *own = NULL, *ws = c->workspace;
    if (dx && rc == TP_OK && (!ws || c->workspace_bytes < e->extra[1])) {
        const size_t ny = e->ws_bytes ? s_round(tp_shape_count(&c->yshape) * sizeof(float)) : 0;
        rc = s_ws(c, e, ny + 1, &own);
        if (rc == TP_OK) {
            ws = own + ny;
            if (e->ws_bytes)
                rc = s_fwd(c, e, ws, own);
        }
    }
    if (dx && rc == TP_OK) {
        const tp_shape_t *x = &c->xshape[0], *y = &c->yshape;
        dnnl_dims_t xd = {x->d[0], x->d[1], x->d[2], x->d[3]};
        dnnl_dims_t yd = {y->d[0], y->d[1], y->d[2], y->d[3]};
        dnnl_memory_desc_t xm, ym;
        dnnl_memory_desc_init_by_tag(&xm, 4, xd, dnnl_f32,
                                     (c->blk16 & 1u) ? dnnl_nChw16c : dnnl_nchw);
        dnnl_memory_desc_init_by_tag(&ym, 4, yd, dnnl_f32,
                                     (c->blk16 & TP_BLK16_Y) ? dnnl_nChw16c : dnnl_nchw);
        int args[4] = {DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC}, n = 2;
        const dnnl_memory_desc_t *mds[4] = {&ym, &xm};
        void *ptrs[4] = {(void *)c->dy, tmp ? tmp : dx};
        if (e->ws_bytes) {
            args[n] = DNNL_ARG_WORKSPACE;
            mds[n] = &e->ws;
            ptrs[n++] = ws;
        }
        if (e->bwd_scratch_bytes) {
            args[n] = DNNL_ARG_SCRATCHPAD;
            mds[n] = &e->bwd_scratch;
            ptrs[n++] = ws + e->extra[0];
        }
        rc = tp_dnnl_exec(e->bwd, n, args, mds, ptrs, c->name);
        if (rc == TP_OK && tmp)
            for (size_t i = 0; i < nx; i++)
                dx[i] += tmp[i];
    }
    free(tmp);
    free(own);
    if (owned)
        tp_dnnl_prim_free(e);
    return rc;
}
