/* towerpack gpu: batch norm on oneDNN for the CPU backend (dnnl_ops.h):
 * training's forward with the batch's statistics and its backward (the
 * gradients of x, gamma and beta), and the inference forward on the moving
 * averages; any rank, read as [N, C, everything after] on plain NCHW
 * memory. The moving averages are updated here as ops_cpu.c updates them
 * (momentum attr.alpha, the unbiased variance), from oneDNN's mean and
 * (biased) variance.
 *
 * The op's workspace is [mean C][1/std C][variance C][dgamma C][dbeta C]
 * [the fused relu's mask, training only][oneDNN's scratchpad]: its start is ops_cpu.c's, so that ops_cpu.c's
 * backward can follow this forward (an inference-mode backward, which
 * oneDNN's global-statistics backward would run too, is left to it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/dnnl_ops.h"

typedef struct {
    int64_t family; /* 2: batch norm */
    int64_t n, c, sp, training, threads;
    float eps;
    int32_t blk16;  /* x, y, dx, dy nChw16c (tp_op_call_t.blk16): [n, c, sp, 1]
                       read as [N, C/16, H*W, 16], the same bytes */
    int32_t relu;   /* a folded relu in oneDNN's passes (dnnl_fuse_norm_relu) */
} s_key_t;

/* TP_CPU_BNORM_RELU=0: the folded relu as its own passes after the
 * forward and before the backward (the numbers are the same either way) */
static int s_relu_off(void) {
    const char *v = getenv("TP_CPU_BNORM_RELU"); /* (read per call, as TP_CPU_BNORM) */
    return v && !strcmp(v, "0");
}

static void s_key(const tp_op_call_t *c, unsigned char out[160]) {
    s_key_t k;
    memset(&k, 0, sizeof k);
    const tp_shape_t *x = &c->xshape[0];
    k.family = 2;
    k.n = x->d[0];
    k.c = x->ndim > 1 ? x->d[1] : 1;
    k.sp = 1;
    for (int i = 2; i < x->ndim; i++)
        k.sp *= x->d[i];
    k.training = c->attr->training != 0;
    k.eps = c->attr->eps;
    k.threads = tp_dnnl_threads();
    k.blk16 = c->blk16 != 0;
    k.relu = c->attr->act == TP_ACT_RELU && !s_relu_off();
    memset(out, 0, 160);
    memcpy(out, &k, sizeof k);
}

static void s_mds(const s_key_t *k, dnnl_memory_desc_t *data, dnnl_memory_desc_t *vec) {
    dnnl_dims_t d = {k->n, k->c, k->sp, 1}, v = {k->c};
    dnnl_memory_desc_init_by_tag(data, 4, d, dnnl_f32, k->blk16 ? dnnl_nChw16c : dnnl_nchw);
    dnnl_memory_desc_init_by_tag(vec, 1, v, dnnl_f32, dnnl_a);
}

/* extra[0]: the scratchpad's offset; extra[1]: the workspace's bytes */
static tp_status_t s_build(tp_dnnl_prim_t *e, const tp_op_call_t *c) {
    const char *name = c->name;
    s_key_t k;
    memcpy(&k, e->key, sizeof k);
    dnnl_memory_desc_t dm, vm;
    s_mds(&k, &dm, &vm);
    /* the relu fused: the forward clamps y and keeps its mask (the
     * workspace, a bit or byte an element), the backward masks dy with it
     * in its own read of dy: two passes over the activation fewer each way */
    const unsigned flags = dnnl_use_scale | dnnl_use_shift | (k.relu ? dnnl_fuse_norm_relu : 0u);
    dnnl_batch_normalization_desc_t fd, bd;
    dnnl_status_t st;
    if (k.training) {
        st = dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &dm, k.eps,
                                                        flags);
        if (st == dnnl_success)
            st = dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &dm, &dm, k.eps,
                                                             flags);
    } else {
        st = dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_inference, &dm, k.eps,
                                                        flags | dnnl_use_global_stats);
    }
    if (st == dnnl_unimplemented || st == dnnl_invalid_arguments)
        return TP_OK; /* e->ok 0: ops_cpu.c's */
    if (st != dnnl_success)
        return tp_dnnl_fail(st, "batch norm descriptors", name, __FILE__, __LINE__);
    /* the workspace begins with [mean][1/std][variance][dgamma][dbeta] */
    tp_status_t rc = tp_dnnl_build_pair(e, &fd, k.training ? &bd : NULL,
                                        5 * (size_t)k.c * sizeof(float), "batch norm", name);
    if (rc == TP_OK && e->ws_bytes && !(k.relu && k.training))
        rc = tp_error(TP_ERR_DEVICE, "%s: oneDNN's batch norm wants a workspace with no "
                      "fused relu (dnnl_bnorm.c)", name);
    return rc;
}

/* A blocked call that only ops_cpu.c's NCHW kernels would run (a smaller
 * workspace than planned, an inference-mode backward): fold.c's plan keeps
 * such calls plain. */
static tp_status_t s_refuse(const tp_op_call_t *c) {
    return tp_error(TP_ERR_UNSUPPORTED, "%s: batch norm on nChw16c that oneDNN cannot "
                    "run here (dnnl_bnorm.c); TP_BLK16_CHAIN=0 keeps it NCHW", c->name);
}

/* As dnnl_pool.c's: the entry when oneDNN runs the call, else NULL. */
static tp_status_t s_entry(const tp_op_call_t *c, int planning, tp_dnnl_prim_t **out,
                           int *owned) {
    *out = NULL;
    *owned = 0;
    /* unset: ops_cpu.c's, 3-5x faster on NCHW (dnnl_ops.h); a call on
     * nChw16c (a blocked chain, gpu/graph/fold.c) is oneDNN's: ops_cpu.c
     * reads NCHW only */
    const int blk = c->blk16 != 0;
    if (blk && (c->blk16 != (1u | TP_BLK16_Y) || c->xshape[0].ndim != 4 ||
                c->xshape[0].d[1] % 16 || c->ninputs != 3))
        return tp_error(TP_ERR_UNSUPPORTED, "%s: batch norm with x and y in different "
                        "layouts or not [N, 16k, H, W] nChw16c (dnnl_bnorm.c)", c->name);
    if ((!blk && tp_dnnl_ops_path("TP_CPU_BNORM") != 1) || c->xshape[0].ndim < 2 ||
        c->ninputs != 3)
        return TP_OK;
    unsigned char key[160];
    s_key(c, key);
    return tp_dnnl_entry(key, s_build, c, !planning, out, owned);
}

size_t tp_dnnl_bnorm_workspace(const tp_op_call_t *c, size_t own) {
    tp_dnnl_prim_t *e;
    int owned;
    if (s_entry(c, 1, &e, &owned) != TP_OK) {
        tp_clear_error(); /* the run's own call reports it */
        return own;
    }
    if (!e)
        return own;
    const size_t bytes = e->extra[1] > own ? e->extra[1] : own;
    if (owned)
        tp_dnnl_prim_free(e);
    return bytes;
}

tp_status_t tp_dnnl_bnorm_forward(const tp_op_call_t *c, int *done) {
    tp_dnnl_prim_t *e;
    int owned;
    *done = 0;
    TP_TRY(s_entry(c, 0, &e, &owned));
    if (!e)
        return c->blk16 ? s_refuse(c) : TP_OK;
    *done = 1;
    s_key_t k;
    memcpy(&k, e->key, sizeof k);
    const size_t ch = (size_t)k.c;
    float *mean = c->workspace, *inv = mean + ch, *var = inv + ch;
    float *mm = c->state[0], *mv = c->state[1];
    const tp_op_attr_t *a = c->attr;
    dnnl_memory_desc_t dm, vm;
    s_mds(&k, &dm, &vm);
    int args[9] = {DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_MEAN,
                   DNNL_ARG_VARIANCE};
    const dnnl_memory_desc_t *mds[9] = {&dm, &dm, &vm, &vm, &vm, &vm};
    void *ptrs[9] = {(void *)c->x[0], c->y, (void *)c->x[1], (void *)c->x[2],
                     k.training ? mean : mm, k.training ? var : mv};
    int n = 6;
    if (e->ws_bytes) { /* the fused relu's mask, read by the backward */
        args[n] = DNNL_ARG_WORKSPACE;
        mds[n] = &e->ws;
        ptrs[n++] = var + 3 * ch;
    }
    if (e->fwd_scratch_bytes) {
        args[n] = DNNL_ARG_SCRATCHPAD;
        mds[n] = &e->fwd_scratch;
        ptrs[n++] = (char *)c->workspace + e->extra[0];
    }
    tp_status_t rc = tp_dnnl_exec(e->fwd, n, args, mds, ptrs, c->name);
    if (rc == TP_OK && k.training) {
        const double m = (double)(k.n * k.sp);
        for (size_t i = 0; i < ch; i++) {
            inv[i] = (float)(1.0 / sqrt((double)var[i] + a->eps));
            if (a->update_state) {
                const double unbiased = m > 1 ? var[i] * m / (m - 1) : var[i];
                mm[i] = a->alpha * mm[i] + (1.0f - a->alpha) * mean[i];
                mv[i] = a->alpha * mv[i] + (1.0f - a->alpha) * (float)unbiased;
            }
        }
    } else if (rc == TP_OK) { /* what ops_cpu.c's backward reads */
        for (size_t i = 0; i < ch; i++) {
            mean[i] = mm[i];
            inv[i] = 1.0f / sqrtf(mv[i] + a->eps);
        }
    }
    if (rc == TP_OK && a->act == TP_ACT_RELU && !k.relu) { /* a folded relu, as ops_cpu.c's */
        float *restrict y = c->y;
        for (size_t i = 0, ny = tp_shape_count(&c->yshape); i < ny; i++)
            y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    }
    if (owned)
        tp_dnnl_prim_free(e);
    return rc;
}

/* dy_raw: c->dy is the relu's output gradient, not yet masked (the
 * caller runs only a fused primitive then, and masks dy itself otherwise) */
static tp_status_t s_backward(const tp_op_call_t *c, int dy_raw, int *done) {
    tp_dnnl_prim_t *e;
    int owned;
    *done = 0;
    TP_TRY(s_entry(c, 0, &e, &owned));
    if (!e)
        return c->blk16 && !dy_raw ? s_refuse(c) : TP_OK;
    tp_status_t rc = TP_OK;
    s_key_t k;
    memcpy(&k, e->key, sizeof k);
    if (dy_raw && (!e->bwd || !k.relu))
        goto out; /* not fused here: the caller masks dy and comes back */
    if (!e->bwd && c->blk16) {
        rc = s_refuse(c);
        goto out;
    }
    if (!e->bwd) /* inference mode: ops_cpu.c's, on the mean and 1/std above */
        goto out;
    *done = 1;
    const size_t ch = (size_t)k.c, nx = tp_shape_count(&c->xshape[0]);
    float *mean = c->workspace, *var = mean + 2 * ch, *dg = var + ch, *db = dg + ch;
    float *dx = c->dx[0], *tmp = NULL;
    /* oneDNN stores dx: a gradient added to, or one not wanted, goes to a
     * buffer of this call's (seldom: an input with other readers, or data) */
    if ((!dx || c->dx_acc[0]) && !(tmp = malloc(nx * sizeof(float)))) {
        rc = tp_error(TP_ERR_NOMEM, "%s: %zu floats for the batch norm's gradient", c->name, nx);
        goto out;
    }
    dnnl_memory_desc_t dm, vm;
    s_mds(&k, &dm, &vm);
    int args[11] = {DNNL_ARG_SRC,   DNNL_ARG_MEAN,     DNNL_ARG_VARIANCE,   DNNL_ARG_DIFF_DST,
                    DNNL_ARG_SCALE, DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_SCALE, DNNL_ARG_DIFF_SHIFT,
                    DNNL_ARG_SHIFT};
    const dnnl_memory_desc_t *mds[11] = {&dm, &vm, &vm, &dm, &vm, &dm, &vm, &vm, &vm};
    void *ptrs[11] = {(void *)c->x[0], mean, var, (void *)c->dy, (void *)c->x[1],
                      tmp ? tmp : dx, dg, db, (void *)c->x[2]};
    int n = 9;
    if (e->ws_bytes) { /* the forward's relu mask: oneDNN masks dy with it
                          (a dy masked already by the caller is unchanged) */
        args[n] = DNNL_ARG_WORKSPACE;
        mds[n] = &e->ws;
        ptrs[n++] = db + ch;
    }
    if (e->bwd_scratch_bytes) {
        args[n] = DNNL_ARG_SCRATCHPAD;
        mds[n] = &e->bwd_scratch;
        ptrs[n++] = (char *)c->workspace + e->extra[0];
    }
    rc = tp_dnnl_exec(e->bwd, n, args, mds, ptrs, c->name);
    if (rc == TP_OK) {
        if (dx && tmp)
            for (size_t i = 0; i < nx; i++)
                dx[i] += tmp[i];
        for (size_t i = 0; i < ch; i++) {
            if (c->dx[1])
                c->dx[1][i] = (c->dx_acc[1] ? c->dx[1][i] : 0.0f) + dg[i];
            if (c->dx[2])
                c->dx[2][i] = (c->dx_acc[2] ? c->dx[2][i] : 0.0f) + db[i];
        }
    }
    free(tmp);
out:
    if (owned)
        tp_dnnl_prim_free(e);
    return rc;
}

tp_status_t tp_dnnl_bnorm_backward(const tp_op_call_t *c, int *done) {
    return s_backward(c, 0, done);
}

tp_status_t tp_dnnl_bnorm_backward_relu(const tp_op_call_t *c, int *done) {
    return s_backward(c, 1, done);
}
