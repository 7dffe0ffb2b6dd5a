/* towerpack gpu: what the CPU backend's pooling and batch norm on oneDNN
 * share (dnnl_ops.h): the process's CPU engine, the calling thread's
 * OpenMP team, a cache of primitives per geometry (and the look-up of a
 * call's entry), the making of an op's forward and backward primitives
 * with its workspace's layout, and a call that runs one primitive on the
 * op's own buffers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/log.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/dnnl_ops.h"

/* OpenMP's own (libgomp), as dnnl_conv.c declares them */
extern int omp_get_max_threads(void);

enum { S_MAX_ENTRIES = 512, S_MAX_EXEC = 12, S_ALIGN = 64 };

static size_t s_round(size_t b) { return (b + S_ALIGN - 1) & ~(size_t)(S_ALIGN - 1); }

static pthread_once_t s_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t s_engine;
static dnnl_status_t s_engine_st;
static pthread_mutex_t s_mu = PTHREAD_MUTEX_INITIALIZER;
static tp_dnnl_prim_t *s_entries; /* guarded by s_mu; entries never change
                                     once listed */
static int s_count;

static void s_engine_make(void) { s_engine_st = dnnl_engine_create(&s_engine, dnnl_cpu, 0); }

tp_status_t tp_dnnl_fail(dnnl_status_t st, const char *expr, const char *node,
                         const char *file, int line) {
    tp_status_t rc = st == dnnl_out_of_memory      ? TP_ERR_NOMEM
                     : st == dnnl_invalid_arguments ? TP_ERR_INVALID
                     : st == dnnl_unimplemented     ? TP_ERR_UNSUPPORTED
                                                    : TP_ERR_DEVICE;
    return tp_error(rc, "%s: oneDNN %s failed: %s (%s:%d)", node ? node : "op", expr,
                    dnnl_status2str(st), file, line);
}

dnnl_engine_t tp_dnnl_engine(void) {
    pthread_once(&s_once, s_engine_make);
    if (s_engine_st != dnnl_success) {
        tp_dnnl_fail(s_engine_st, "dnnl_engine_create(cpu)", "CPU backend", __FILE__,
                     __LINE__);
        return NULL;
    }
    return s_engine;
}

int tp_dnnl_threads(void) {
    tp_cpu_team(tp_cpu_threads());
    return omp_get_max_threads();
}

void tp_dnnl_geom(const tp_op_call_t *c, int threads, tp_dnnl_geom_t *k) {
    memset(k, 0, sizeof *k);
    const tp_shape_t *x = &c->xshape[0], *y = &c->yshape;
    const tp_op_attr_t *a = c->attr;
    const int pool = c->kind == TP_OP_MAX_POOL || c->kind == TP_OP_AVG_POOL;
    /* every dimension of an image the backend can hold fits 31 bits */
    for (int i = 0; i < 4; i++)
        TP_ASSERT(x->d[i] <= INT32_MAX && y->d[i] <= INT32_MAX);
    k->family = pool ? 1 : 3;
    k->kind = (int32_t)c->kind;
    k->n = (int32_t)x->d[0];
    k->c = (int32_t)x->d[1];
    k->h = (int32_t)x->d[2];
    k->w = (int32_t)x->d[3];
    k->o = (int32_t)y->d[1];
    k->oh = (int32_t)y->d[2];
    k->ow = (int32_t)y->d[3];
    k->kh = a->kh;
    k->kw = a->kw;
    k->sh = a->sh;
    k->sw = a->sw;
    k->ph = a->ph;
    k->pw = a->pw;
    k->dh = a->dh > 0 ? a->dh : 1;
    k->dw = a->dw > 0 ? a->dw : 1;
    k->g = a->groups > 0 ? a->groups : 1;
    k->bias = !pool && c->ninputs > 2;
    k->relu = a->act == TP_ACT_RELU;
    k->threads = threads;
    k->blk16 = ((c->blk16 & 1u) ? 1 : 0) | ((c->blk16 & TP_BLK16_Y) ? 2 : 0);
}

int tp_dnnl_ops_path(const char *env) {
    const char *e = getenv(env);
    if (!e || !*e)
        return -1;
    if (!strcmp(e, "dnnl"))
        return 1;
    if (strcmp(e, "own")) {
        static atomic_int said;
        if (!atomic_exchange(&said, 1))
            TP_WARN("%s=%s: expected dnnl or own; the measured default runs", env, e);
        return -1;
    }
    return 0;
}

void tp_dnnl_prim_free(tp_dnnl_prim_t *e) {
    if (!e)
        return;
    if (e->fwd)
        dnnl_primitive_destroy(e->fwd);
    if (e->bwd)
        dnnl_primitive_destroy(e->bwd);
    free(e);
}

tp_status_t tp_dnnl_lookup(const unsigned char key[160], tp_dnnl_build_fn build,
                           const tp_op_call_t *c, tp_dnnl_prim_t **out, int *owned) {
    *owned = 0;
    pthread_mutex_lock(&s_mu);
    for (tp_dnnl_prim_t *e = s_entries; e; e = e->next)
        if (!memcmp(e->key, key, sizeof e->key)) {
            pthread_mutex_unlock(&s_mu);
            *out = e;
            return TP_OK;
        }
    tp_dnnl_prim_t *e = calloc(1, sizeof *e);
    tp_status_t rc;
    if (!e) {
        rc = tp_error(TP_ERR_NOMEM, "%s: oneDNN primitive cache entry", c->name);
    } else {
        memcpy(e->key, key, sizeof e->key);
        rc = build(e, c);
    }
    if (rc == TP_OK && s_count < S_MAX_ENTRIES) {
        e->next = s_entries;
        s_entries = e;
        s_count++;
    } else if (rc == TP_OK) {
        *owned = 1;
    }
    pthread_mutex_unlock(&s_mu);
    if (rc != TP_OK) {
        tp_dnnl_prim_free(e);
        return rc;
    }
    *out = e;
    return TP_OK;
}

tp_status_t tp_dnnl_entry(const unsigned char key[160], tp_dnnl_build_fn build,
                          const tp_op_call_t *c, int need_ws, tp_dnnl_prim_t **out,
                          int *owned) {
    *out = NULL;
    *owned = 0;
    tp_dnnl_prim_t *e;
    TP_TRY(tp_dnnl_lookup(key, build, c, &e, owned));
    if (!e->ok || (need_ws && c->workspace_bytes < e->extra[1])) {
        if (*owned)
            tp_dnnl_prim_free(e);
        *owned = 0;
        return TP_OK;
    }
    *out = e;
    return TP_OK;
}

tp_status_t tp_dnnl_build_pair(tp_dnnl_prim_t *e, const_dnnl_op_desc_t fd,
                               const_dnnl_op_desc_t bd, size_t head, const char *what,
                               const char *name) {
    dnnl_engine_t eng = tp_dnnl_engine();
    if (!eng)
        return TP_ERR_DEVICE; /* tp_dnnl_engine said why */
    dnnl_primitive_attr_t attr;
    TP_TRY(tp_dnnl_attr(&attr, name));
    dnnl_primitive_desc_t fpd = NULL, bpd = NULL;
    dnnl_status_t st = dnnl_primitive_desc_create(&fpd, fd, attr, eng, NULL);
    if (st == dnnl_success && bd)
        st = dnnl_primitive_desc_create(&bpd, bd, attr, eng, fpd);
    dnnl_primitive_attr_destroy(attr);
    tp_status_t rc = TP_OK;
    if (st == dnnl_success) {
        rc = tp_dnnl_finish(fpd, &e->fwd, &e->fwd_scratch, &e->fwd_scratch_bytes, e, 1, name);
        if (rc == TP_OK && bpd)
            rc = tp_dnnl_finish(bpd, &e->bwd, &e->bwd_scratch, &e->bwd_scratch_bytes, e, 0,
                                name);
        if (rc == TP_OK) {
            size_t most = e->fwd_scratch_bytes > e->bwd_scratch_bytes ? e->fwd_scratch_bytes
                                                                      : e->bwd_scratch_bytes;
            e->extra[0] = s_round(head + e->ws_bytes);
            e->extra[1] = e->extra[0] + s_round(most);
            e->ok = 1;
        }
    } else if (st != dnnl_unimplemented) {
        char expr[64];
        snprintf(expr, sizeof expr, "%s primitive", what);
        rc = tp_dnnl_fail(st, expr, name, __FILE__, __LINE__);
    }
    if (fpd)
        dnnl_primitive_desc_destroy(fpd);
    if (bpd)
        dnnl_primitive_desc_destroy(bpd);
    return rc;
}

tp_status_t tp_dnnl_attr(dnnl_primitive_attr_t *attr, const char *name) {
    dnnl_status_t st = dnnl_primitive_attr_create(attr);
    if (st == dnnl_success) {
        st = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
        if (st != dnnl_success)
            dnnl_primitive_attr_destroy(*attr);
    }
    if (st != dnnl_success)
        return tp_dnnl_fail(st, "primitive attributes", name, __FILE__, __LINE__);
    return TP_OK;
}

tp_status_t tp_dnnl_finish(const_dnnl_primitive_desc_t pd, dnnl_primitive_t *prim,
                           dnnl_memory_desc_t *scratch, size_t *scratch_bytes,
                           tp_dnnl_prim_t *e, int ws, const char *name) {
    dnnl_status_t st = dnnl_primitive_create(prim, pd);
    if (st != dnnl_success)
        return tp_dnnl_fail(st, "dnnl_primitive_create", name, __FILE__, __LINE__);
    const dnnl_memory_desc_t *sm = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    *scratch_bytes = 0;
    if (sm) {
        *scratch = *sm;
        *scratch_bytes = dnnl_memory_desc_get_size(sm);
    }
    if (ws) {
        const dnnl_memory_desc_t *wm = dnnl_primitive_desc_query_md(pd, dnnl_query_workspace_md, 0);
        e->ws_bytes = 0;
        if (wm) {
            e->ws = *wm;
            e->ws_bytes = dnnl_memory_desc_get_size(wm);
        }
    }
    return TP_OK;
}

tp_status_t tp_dnnl_exec(dnnl_primitive_t prim, int nargs, const int *args,
                         const dnnl_memory_desc_t *const *mds, void *const *ptrs,
                         const char *name) {
    TP_ASSERT(nargs <= S_MAX_EXEC);
    dnnl_engine_t eng = tp_dnnl_engine();
    if (!eng)
        return TP_ERR_DEVICE; /* tp_dnnl_engine said why */
    dnnl_stream_t stream = NULL;
    dnnl_memory_t mem[S_MAX_EXEC] = {0};
    dnnl_exec_arg_t ex[S_MAX_EXEC];
    int n = 0;
    tp_status_t rc = TP_OK;
    dnnl_status_t st = dnnl_stream_create(&stream, eng, dnnl_stream_default_flags);
    if (st != dnnl_success)
        rc = tp_dnnl_fail(st, "dnnl_stream_create", name, __FILE__, __LINE__);
    for (int i = 0; i < nargs && rc == TP_OK; i++, n++) {
        st = dnnl_memory_create(&mem[i], mds[i], eng, ptrs[i]);
        if (st != dnnl_success)
            rc = tp_dnnl_fail(st, "dnnl_memory_create", name, __FILE__, __LINE__);
        ex[i] = (dnnl_exec_arg_t){args[i], mem[i]};
    }
    if (rc == TP_OK) {
        st = dnnl_primitive_execute(prim, stream, nargs, ex);
        if (st == dnnl_success)
            st = dnnl_stream_wait(stream);
        if (st != dnnl_success)
            rc = tp_dnnl_fail(st, "dnnl_primitive_execute", name, __FILE__, __LINE__);
    }
    for (int i = 0; i < n; i++)
        if (mem[i])
            dnnl_memory_destroy(mem[i]);
    if (stream)
        dnnl_stream_destroy(stream);
    return rc;
}
