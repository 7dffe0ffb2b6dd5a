/* towerpack gpu: the dense layer's matmul on oneDNN (dnnl_matmul.h).
 *
 * Three products per geometry, each a cached primitive (dnnl_util.c's
 * cache, one entry per product and accumulate flag):
 *   forward  y[N,M]  = x[N,K] W[K,M] (+ b[M]) (relu)
 *   weights  dW[K,M] = x^T dy        (x read through strides {1,K})
 *   data     dX[N,K] = dy W^T        (W read through strides {1,M})
 * A gradient that accumulates (dx_acc) gets a sum post-op: the product is
 * added to what the buffer holds, as OpenBLAS's beta 1. And batch_matmul's
 * batched product (tp_dnnl_bmm, ops_linalg.c):
 *   batched  y[B,M,N] (+)= op(a)[B,M,K] op(b)[B,K,N], each operand
 *            transposed or not through its strides, one primitive for
 *            every batch (OpenBLAS: one sgemm call per batch). Scratchpads are
 * the user's (the op's workspace), so that two towers may run one cached
 * primitive at once. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/log.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_bf16.h"
#include "gpu/cpu/cpu_gemm.h"
#include "gpu/cpu/cpu_gemm_bf16.h"
#include "gpu/cpu/dnnl_matmul.h"
#include "gpu/cpu/dnnl_ops.h"

enum { S_FWD = 0, S_DW = 1, S_DX = 2, S_BMM = 3 };

typedef struct {
    int64_t family; /* 3: matmul (1 pooling, 2 batch norm) */
    int64_t which;  /* S_FWD, S_DW, S_DX, S_BMM */
    int64_t n, k, m, bias, relu, acc, threads;
    int64_t nb, ta, tb; /* S_BMM: batches, a's and b's transposes (n = its M,
                           m = its N, k = its K); 0 for the others */
    int64_t bf16;       /* 1: src and weights in bf16 (cpu_bf16.h), converted
                           into the workspace past the scratchpad */
} s_key_t;

/* TP_CPU_MATMUL: oneDNN unless "own" (measured faster on every MLP shape
 * but the 10-column head's dW, a few microseconds either way). */
static int s_use_dnnl(void) { return tp_dnnl_ops_path("TP_CPU_MATMUL") != 0; }

/* Which of our GEMMs runs a product instead of oneDNN: S_OURS_NONE,
 * S_OURS_F32 (cpu_gemm.h) or S_OURS_BF16 (cpu_gemm_bf16.h, with bf16 on);
 * relu: a post-op ours lack.
 * fp32: TP_CPU_GEMM=own wherever it can (A/B, and the tests' way to it);
 * else never. Measured against oneDNN on each of the GPT's fifteen
 * products at 512 rows (docs/performance.md, branch gpt20), ours with b
 * packed inside the call was slower on every one (0.91-0.99 of oneDNN's
 * speed, 0.944 over the step's products), and with b packed ahead even
 * overall (1.005-1.023): no shape class where it measures faster, so
 * oneDNN keeps them all. At k <= 512 with b plain, ours gives oneDNN's
 * bits (tests/gpu/test_cpu_gemm.c).
 * bf16: ours unless TP_CPU_GEMM=dnnl. Its conversion to bf16 writes the
 * packed layout its kernel reads, where oneDNN's route converts both
 * operands into buffers and its brgemm then lays B out in pairs again: on
 * each of the GPT's fifteen products at 1,024 rows, one thread, ours ran
 * 1.00-1.11x oneDNN's bf16 speed (1.03x over the fifteen, both with the
 * conversions), the one-thread bf16 step 1.03-1.04x (two sets of 7
 * alternated rounds) and gpt_cpu.sh's bf16 loop 1.04x
 * (docs/performance.md, branch bf16gemm). */
enum { S_OURS_NONE = 0, S_OURS_F32 = 1, S_OURS_BF16 = 2 };

/* bf16's default (TP_CPU_GEMM unset): 1 for ours, 0 for oneDNN's */
enum { S_BF16_OURS = 1 };

static int s_ours(int relu) {
    static int avx512 = -1;
    if (avx512 < 0)
        avx512 = __builtin_cpu_supports("avx512f") != 0;
    const int path = tp_dnnl_ops_path("TP_CPU_GEMM");
    if (relu || !avx512)
        return S_OURS_NONE;
    if (tp_cpu_bf16_on())
        return tp_gemm_bf16_ok() && (path == 0 || (path < 0 && S_BF16_OURS)) ? S_OURS_BF16
                                                                             : S_OURS_NONE;
    return path == 0 ? S_OURS_F32 : S_OURS_NONE;
}

/* Bytes of our GEMM's room for y[m, n] = op(a)[m, k] op(b)[k, n]: b's
 * panels (fp32), both operands packed (bf16); 0 with none of ours. */
static size_t s_ours_room(int ours, int64_t m, int64_t n, int64_t k) {
    if (ours == S_OURS_BF16)
        return tp_gemm_bf16_room_bytes((size_t)m, (size_t)n, (size_t)k);
    return ours == S_OURS_F32 ? tp_gemm_pack_bytes((size_t)k, (size_t)n) : 0;
}

/* y[m, n] (+)= op(a) op(b) (+ bias) on our GEMM `ours`, the operands
 * packed into the workspace; *done 0 (oneDNN's turn) when the workspace
 * is short. */
static void s_run_ours(const tp_op_call_t *c, int ours, int64_t m, int64_t n, int64_t k,
                       const float *a, int ta, const float *b, int tb, const float *bias,
                       int acc, float *y, int *done) {
    *done = c->workspace && c->workspace_bytes >= s_ours_room(ours, m, n, k);
    if (!*done)
        return;
    if (ours == S_OURS_BF16) {
        const tp_gemm_bf16_t g = {(size_t)m, (size_t)n, (size_t)k, a, (size_t)(ta ? m : k),
                                  ta, b, (size_t)(tb ? k : n), tb, y, (size_t)n, bias, acc,
                                  c->workspace};
        tp_gemm_bf16(&g);
        return;
    }
    const tp_gemm_t g = {(size_t)m, (size_t)n, (size_t)k, a, (size_t)(ta ? m : k), ta, b,
                         (size_t)(tb ? k : n), tb, 0, y, (size_t)n, bias, acc,
                         c->workspace};
    tp_gemm(&g);
}

static void s_dims(const tp_op_call_t *c, int64_t *n, int64_t *k, int64_t *m) {
    const tp_shape_t *xs = &c->xshape[0];
    *n = xs->d[0];
    *k = 1; /* the product of x's trailing dims (an empty batch has them too) */
    for (int i = 1; i < xs->ndim; i++)
        *k *= xs->d[i];
    *m = c->xshape[1].d[1];
}

static void s_key(const tp_op_call_t *c, int which, int acc, unsigned char out[160]) {
    s_key_t k;
    memset(&k, 0, sizeof k);
    k.family = 3;
    k.which = which;
    s_dims(c, &k.n, &k.k, &k.m);
    if (which == S_FWD) {
        k.bias = c->bias != NULL;
        k.relu = c->attr && c->attr->act == TP_ACT_RELU;
    }
    k.acc = acc;
    k.threads = tp_dnnl_threads();
    k.bf16 = tp_cpu_bf16_on();
    memset(out, 0, 160);
    memcpy(out, &k, sizeof k);
}

/* A [rows, cols] matrix stored row-major, or (trans) its transpose's
 * storage read through strides. */
static dnnl_status_t s_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int trans,
                          dnnl_data_type_t dt) {
    dnnl_dims_t d = {rows, cols}, s = {cols, 1};
    if (trans) {
        s[0] = 1;
        s[1] = rows;
    }
    return dnnl_memory_desc_init_by_strides(md, 2, d, dt, s);
}

/* [nb, rows, cols] row-major batches, or (trans) each one's transpose's
 * storage read through strides. */
static dnnl_status_t s_md3(dnnl_memory_desc_t *md, int64_t nb, int64_t rows, int64_t cols,
                           int trans, dnnl_data_type_t dt) {
    dnnl_dims_t d = {nb, rows, cols}, s = {rows * cols, cols, 1};
    if (trans) {
        s[1] = 1;
        s[2] = rows;
    }
    return dnnl_memory_desc_init_by_strides(md, 3, d, dt, s);
}

/* The product's operands: src [r, in] op weights [in, cols] -> dst [r, cols]. */
static dnnl_status_t s_mds(const s_key_t *k, dnnl_memory_desc_t *src, dnnl_memory_desc_t *wei,
                           dnnl_memory_desc_t *bias, dnnl_memory_desc_t *dst) {
    const dnnl_data_type_t in = k->bf16 ? dnnl_bf16 : dnnl_f32, f32 = dnnl_f32;
    dnnl_status_t st;
    switch (k->which) {
    case S_BMM:
        st = s_md3(src, k->nb, k->n, k->k, (int)k->ta, in);
        if (st == dnnl_success)
            st = s_md3(wei, k->nb, k->k, k->m, (int)k->tb, in);
        if (st == dnnl_success)
            st = s_md3(dst, k->nb, k->n, k->m, 0, f32);
        return st;
    case S_FWD:
        st = s_md(src, k->n, k->k, 0, in);
        if (st == dnnl_success)
            st = s_md(wei, k->k, k->m, 0, in);
        if (st == dnnl_success)
            st = s_md(dst, k->n, k->m, 0, f32);
        if (st == dnnl_success)
            st = s_md(bias, 1, k->m, 0, f32);
        return st;
    case S_DW:
        st = s_md(src, k->k, k->n, 1, in); /* x^T */
        if (st == dnnl_success)
            st = s_md(wei, k->n, k->m, 0, in); /* dy */
        if (st == dnnl_success)
            st = s_md(dst, k->k, k->m, 0, f32);
        return st;
    default:
        st = s_md(src, k->n, k->m, 0, in); /* dy */
        if (st == dnnl_success)
            st = s_md(wei, k->m, k->k, 1, in); /* W^T */
        if (st == dnnl_success)
            st = s_md(dst, k->n, k->k, 0, f32);
        return st;
    }
}

/* The elements of the product's src and weights (each stored whole,
 * transposed or not). */
static void s_operand_counts(const s_key_t *k, size_t *src, size_t *wei) {
    const size_t nb = k->which == S_BMM ? (size_t)k->nb : 1;
    const size_t n = (size_t)k->n, kk = (size_t)k->k, m = (size_t)k->m;
    switch (k->which) {
    case S_DW: /* x^T [k, n], dy [n, m] */
        *src = kk * n;
        *wei = n * m;
        return;
    case S_DX: /* dy [n, m], W^T [m, k] */
        *src = n * m;
        *wei = m * kk;
        return;
    default: /* [nb,] [n, k] x [k, m] */
        *src = nb * n * kk;
        *wei = nb * kk * m;
        return;
    }
}

static size_t s_round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* extra[0]: the scratchpad's bytes (rounded) */
static tp_status_t s_build(tp_dnnl_prim_t *e, const tp_op_call_t *c) {
    const char *name = c->name;
    s_key_t k;
    memcpy(&k, e->key, sizeof k);
    dnnl_engine_t eng = tp_dnnl_engine();
    if (!eng)
        return TP_ERR_DEVICE; /* tp_dnnl_engine said why */
    dnnl_memory_desc_t src, wei, bias, dst;
    dnnl_status_t st = s_mds(&k, &src, &wei, &bias, &dst);
    dnnl_matmul_desc_t d;
    if (st == dnnl_success)
        st = dnnl_matmul_desc_init(&d, &src, &wei, k.bias ? &bias : NULL, &dst);
    if (st != dnnl_success)
        return tp_dnnl_fail(st, "matmul descriptor", name, __FILE__, __LINE__);
    dnnl_primitive_attr_t attr;
    TP_TRY(tp_dnnl_attr(&attr, name));
    dnnl_post_ops_t po = NULL;
    if (k.relu || k.acc) {
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success && k.acc)
            st = dnnl_post_ops_append_sum(po, 1.0f);
        if (st == dnnl_success && k.relu)
            st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
        if (st == dnnl_success)
            st = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    dnnl_primitive_desc_t pd = NULL;
    if (st == dnnl_success)
        st = dnnl_primitive_desc_create(&pd, &d, attr, eng, NULL);
    if (po)
        dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    tp_status_t rc = TP_OK;
    if (st == dnnl_success) {
        rc = tp_dnnl_finish(pd, &e->fwd, &e->fwd_scratch, &e->fwd_scratch_bytes, e, 0, name);
        if (rc == TP_OK) {
            /* the scratchpad, then (bf16) the operands' converted copies */
            size_t ns, nw;
            s_operand_counts(&k, &ns, &nw);
            e->extra[0] = s_round64(e->fwd_scratch_bytes);
            if (k.bf16)
                e->extra[0] += s_round64(ns * 2) + s_round64(nw * 2);
            e->ok = 1;
        }
    } else if (st != dnnl_unimplemented) {
        rc = tp_dnnl_fail(st, "matmul primitive", name, __FILE__, __LINE__);
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* The entry of one product; NULL (*e) where oneDNN has none. */
static tp_status_t s_entry(const tp_op_call_t *c, int which, int acc, tp_dnnl_prim_t **e,
                           int *owned) {
    unsigned char key[160];
    s_key(c, which, acc, key);
    return tp_dnnl_entry(key, s_build, c, 0, e, owned);
}

/* The batched product's key and entry. */
static void s_bmm_key(const tp_dnnl_bmm_t *p, unsigned char out[160]) {
    s_key_t k;
    memset(&k, 0, sizeof k);
    k.family = 3;
    k.which = S_BMM;
    k.nb = p->nb;
    k.n = p->m;
    k.m = p->n;
    k.k = p->k;
    k.ta = p->ta != 0;
    k.tb = p->tb != 0;
    k.acc = p->acc != 0;
    k.threads = tp_dnnl_threads();
    k.bf16 = tp_cpu_bf16_on();
    memset(out, 0, 160);
    memcpy(out, &k, sizeof k);
}

static tp_status_t s_bmm_entry(const tp_op_call_t *c, const tp_dnnl_bmm_t *p,
                               tp_dnnl_prim_t **e, int *owned) {
    unsigned char key[160];
    s_bmm_key(p, key);
    return tp_dnnl_entry(key, s_build, c, 0, e, owned);
}

size_t tp_dnnl_matmul_workspace(const tp_op_call_t *c) {
    int64_t n, k, m;
    s_dims(c, &n, &k, &m);
    if (!s_use_dnnl() || !n || !k || !m) /* an empty product: OpenBLAS's path */
        return 0;
    size_t most = 0;
    const int relu = c->attr && c->attr->act == TP_ACT_RELU;
    /* our GEMM's room: the forward's y [n, m] = x W (k), dW [k, m] = x^T
     * dy (n), dX [n, k] = dy W^T (m) */
    const size_t room[3] = {s_ours_room(s_ours(relu), n, m, k), s_ours_room(s_ours(0), k, m, n),
                            s_ours_room(s_ours(0), n, k, m)};
    /* the forward, and both gradients in either mode (a plan does not yet
     * know which consumer writes first) */
    for (int which = S_FWD; which <= S_DX; which++)
        for (int acc = 0; acc <= (which != S_FWD); acc++) {
            if (room[which]) {
                most = room[which] > most ? room[which] : most;
                continue;
            }
            tp_dnnl_prim_t *e;
            int owned;
            if (s_entry(c, which, acc, &e, &owned) != TP_OK)
                return 0; /* logged; the run then says it again or runs OpenBLAS */
            if (e && e->extra[0] > most)
                most = e->extra[0];
            if (owned)
                tp_dnnl_prim_free(e);
        }
    return most;
}

size_t tp_dnnl_bmm_workspace(const tp_op_call_t *c, const tp_dnnl_bmm_t *p) {
    if (!s_use_dnnl() || !p->nb || !p->m || !p->n || !p->k)
        return 0;
    if (s_ours(0))
        return s_ours_room(s_ours(0), p->m, p->n, p->k);
    tp_dnnl_prim_t *e;
    int owned;
    if (s_bmm_entry(c, p, &e, &owned) != TP_OK)
        return 0; /* logged; the run then says it again or runs OpenBLAS */
    const size_t most = e ? e->extra[0] : 0;
    if (e && owned)
        tp_dnnl_prim_free(e);
    return most;
}

/* The calling thread's stream and, per cached primitive it ran, its
 * memory objects, made on the first call and pointed at each call's
 * buffers after: a step allocates nothing (tests/gpu/test_graph.c counts
 * the heap). A thread past S_SLOTS primitives, or an entry not in the
 * cache, makes and frees its objects per call. Tower threads live as long
 * as the model; what a thread made is freed at its exit. */
enum { S_SLOTS = 48, S_ARGS = 5 };
typedef struct {
    const tp_dnnl_prim_t *e;
    dnnl_memory_t mem[S_ARGS];
} s_slot_t;
typedef struct {
    dnnl_stream_t stream;
    int nslots;
    s_slot_t slot[S_SLOTS];
} s_local_t;

static pthread_once_t s_tls_once = PTHREAD_ONCE_INIT;
static pthread_key_t s_tls;

static void s_local_free(void *p) {
    s_local_t *l = p;
    for (int i = 0; i < l->nslots; i++)
        for (int a = 0; a < S_ARGS; a++)
            if (l->slot[i].mem[a])
                dnnl_memory_destroy(l->slot[i].mem[a]);
    if (l->stream)
        dnnl_stream_destroy(l->stream);
    free(l);
}

static void s_tls_make(void) { (void)pthread_key_create(&s_tls, s_local_free); }

/* The calling thread's state; NULL (tp_error said why) without memory. */
static s_local_t *s_local(const char *name) {
    pthread_once(&s_tls_once, s_tls_make);
    s_local_t *l = pthread_getspecific(s_tls);
    if (l)
        return l;
    dnnl_engine_t eng = tp_dnnl_engine();
    if (!eng)
        return NULL;
    if (!(l = calloc(1, sizeof *l))) {
        tp_error(TP_ERR_NOMEM, "%s: oneDNN matmul thread state", name);
        return NULL;
    }
    dnnl_status_t st = dnnl_stream_create(&l->stream, eng, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        tp_dnnl_fail(st, "dnnl_stream_create", name, __FILE__, __LINE__);
        free(l);
        return NULL;
    }
    if (pthread_setspecific(s_tls, l) != 0) {
        tp_error(TP_ERR_NOMEM, "%s: oneDNN matmul thread state", name);
        s_local_free(l);
        return NULL;
    }
    return l;
}

/* Runs e's primitive on ptrs[i] as args[i] (layouts mds[i]). */
static tp_status_t s_exec(const tp_dnnl_prim_t *e, int owned, int n, const int *args,
                          const dnnl_memory_desc_t *const *mds, void *const *ptrs,
                          const char *name) {
    s_local_t *l = s_local(name);
    if (!l)
        return TP_ERR_NOMEM;
    s_slot_t *slot = NULL;
    for (int i = 0; i < l->nslots && !slot; i++)
        if (l->slot[i].e == e)
            slot = &l->slot[i];
    tp_status_t rc = TP_OK;
    dnnl_status_t st;
    if (!slot && !owned && l->nslots < S_SLOTS) { /* a new listed entry: its objects */
        slot = &l->slot[l->nslots];
        memset(slot, 0, sizeof *slot);
        for (int a = 0; a < n && rc == TP_OK; a++)
            if ((st = dnnl_memory_create(&slot->mem[a], mds[a], tp_dnnl_engine(),
                                         DNNL_MEMORY_NONE)) != dnnl_success)
                rc = tp_dnnl_fail(st, "dnnl_memory_create", name, __FILE__, __LINE__);
        if (rc != TP_OK) {
            for (int a = 0; a < S_ARGS; a++)
                if (slot->mem[a])
                    dnnl_memory_destroy(slot->mem[a]);
            return rc;
        }
        slot->e = e;
        l->nslots++;
    }
    if (!slot) /* past the slots, or a primitive of this call only */
        return tp_dnnl_exec(e->fwd, n, args, mds, ptrs, name);
    dnnl_exec_arg_t ex[S_ARGS];
    for (int a = 0; a < n; a++) {
        if ((st = dnnl_memory_set_data_handle_v2(slot->mem[a], ptrs[a], l->stream)) !=
            dnnl_success)
            return tp_dnnl_fail(st, "dnnl_memory_set_data_handle", name, __FILE__, __LINE__);
        ex[a] = (dnnl_exec_arg_t){args[a], slot->mem[a]};
    }
    st = dnnl_primitive_execute(e->fwd, l->stream, n, ex);
    if (st == dnnl_success)
        st = dnnl_stream_wait(l->stream);
    if (st != dnnl_success)
        return tp_dnnl_fail(st, "dnnl_primitive_execute", name, __FILE__, __LINE__);
    return TP_OK;
}

/* A workspace short of a primitive's scratchpad sends the op to
 * OpenBLAS, correct but slower (and, for the dense layers, 10% slower):
 * say so at debug level, once per op (node), so that a plan that forgot
 * oneDNN's bytes shows in the log. A run past S_NOTED ops says nothing
 * more. */
enum { S_NOTED = 256 };
static pthread_mutex_t s_noted_lock = PTHREAD_MUTEX_INITIALIZER;
static const void *s_noted[S_NOTED];
static int s_nnoted;

static void s_note_short(const tp_op_call_t *c, int which, size_t need) {
    const void *key = c->node ? c->node : (const void *)c->attr;
    int fresh = 1;
    pthread_mutex_lock(&s_noted_lock);
    for (int i = 0; i < s_nnoted && fresh; i++)
        fresh = s_noted[i] != key;
    if (fresh && s_nnoted < S_NOTED)
        s_noted[s_nnoted++] = key;
    else
        fresh = 0;
    pthread_mutex_unlock(&s_noted_lock);
    if (fresh) {
        static const char *const what[] = {"forward", "weights' gradient", "data's gradient",
                                           "batched product"};
        TP_DEBUG("%s: matmul %s on OpenBLAS, not oneDNN: the workspace has %zu bytes, "
                 "the primitive's scratchpad needs %zu", c->name ? c->name : "?",
                 what[which], c->workspace_bytes, need);
    }
}

/* Runs one product on (src, wei, bias, dst); *done 0 when oneDNN has no
 * primitive for it or the workspace is short. */
static tp_status_t s_run_entry(const tp_op_call_t *c, tp_dnnl_prim_t *e, int owned, int which,
                               const void *src, const void *wei, const void *bias, void *dst,
                               int *done);

static tp_status_t s_run(const tp_op_call_t *c, int which, int acc, const void *src,
                         const void *wei, const void *bias, void *dst, int *done) {
    tp_dnnl_prim_t *e;
    int owned;
    *done = 0;
    TP_TRY(s_entry(c, which, acc, &e, &owned));
    return s_run_entry(c, e, owned, which, src, wei, bias, dst, done);
}

tp_status_t tp_dnnl_bmm(const tp_op_call_t *c, const tp_dnnl_bmm_t *p, const float *a,
                        const float *b, float *y, int *done) {
    tp_dnnl_prim_t *e;
    int owned;
    *done = 0;
    if (!s_use_dnnl() || !p->nb || !p->m || !p->n || !p->k)
        return TP_OK;
    const int ours = s_ours(0);
    if (ours) { /* batch by batch, the operands packed per batch */
        const size_t sa = (size_t)(p->m * p->k), sb = (size_t)(p->k * p->n),
                     sy = (size_t)(p->m * p->n);
        for (int64_t q = 0; q < p->nb; q++) {
            s_run_ours(c, ours, p->m, p->n, p->k, a + q * sa, p->ta, b + q * sb, p->tb, NULL,
                       p->acc, y + q * sy, done);
            if (!*done) {
                TP_ASSERT(q == 0); /* the same room for every batch */
                break;
            }
        }
        if (*done)
            return TP_OK;
    }
    TP_TRY(s_bmm_entry(c, p, &e, &owned));
    return s_run_entry(c, e, owned, S_BMM, a, b, NULL, y, done);
}

/* Runs entry e (of `which`) on (src, wei, bias, dst) and frees it when
 * owned; *done 0 when e is NULL or the workspace is short. */
static tp_status_t s_run_entry(const tp_op_call_t *c, tp_dnnl_prim_t *e, int owned, int which,
                               const void *src, const void *wei, const void *bias, void *dst,
                               int *done) {
    *done = 0;
    if (!e)
        return TP_OK;
    if (c->workspace_bytes < e->extra[0]) {
        s_note_short(c, which, e->extra[0]);
        if (owned)
            tp_dnnl_prim_free(e);
        return TP_OK;
    }
    s_key_t k;
    memcpy(&k, e->key, sizeof k);
    dnnl_memory_desc_t ms, mw, mb, md;
    dnnl_status_t st = s_mds(&k, &ms, &mw, &mb, &md);
    tp_status_t rc = TP_OK;
    if (st != dnnl_success) {
        rc = tp_dnnl_fail(st, "matmul memory descriptors", c->name, __FILE__, __LINE__);
    } else {
        if (k.bf16) { /* the operands rounded into the workspace, past the scratchpad */
            size_t ns, nw;
            s_operand_counts(&k, &ns, &nw);
            uint16_t *s16 = (uint16_t *)((char *)c->workspace + s_round64(e->fwd_scratch_bytes));
            uint16_t *w16 = (uint16_t *)((char *)s16 + s_round64(ns * 2));
            tp_cpu_f32_to_bf16(s16, src, ns);
            tp_cpu_f32_to_bf16(w16, wei, nw);
            src = s16;
            wei = w16;
        }
        int args[S_ARGS] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
        const dnnl_memory_desc_t *mds[S_ARGS] = {&ms, &mw, &md};
        void *ptrs[S_ARGS] = {(void *)src, (void *)wei, dst};
        int n = 3;
        if (k.bias) {
            args[n] = DNNL_ARG_BIAS;
            mds[n] = &mb;
            ptrs[n++] = (void *)bias;
        }
        if (e->fwd_scratch_bytes) {
            args[n] = DNNL_ARG_SCRATCHPAD;
            mds[n] = &e->fwd_scratch;
            ptrs[n++] = c->workspace;
        }
        rc = s_exec(e, owned, n, args, mds, ptrs, c->name);
        *done = rc == TP_OK;
    }
    if (owned)
        tp_dnnl_prim_free(e);
    return rc;
}

/* Whether oneDNN runs the product: a primitive, and room for its scratchpad. */
static tp_status_t s_fits(const tp_op_call_t *c, int which, int acc, int *ok) {
    tp_dnnl_prim_t *e;
    int owned;
    *ok = 0;
    TP_TRY(s_entry(c, which, acc, &e, &owned));
    *ok = e && c->workspace_bytes >= e->extra[0];
    if (e && !*ok)
        s_note_short(c, which, e->extra[0]);
    if (owned)
        tp_dnnl_prim_free(e);
    return TP_OK;
}

tp_status_t tp_dnnl_matmul_forward(const tp_op_call_t *c, int *done) {
    *done = 0;
    int64_t n, k, m;
    s_dims(c, &n, &k, &m);
    if (!s_use_dnnl() || !n || !k || !m) /* an empty product: OpenBLAS's path */
        return TP_OK;
    const int ours = s_ours(c->attr && c->attr->act == TP_ACT_RELU);
    if (ours) {
        s_run_ours(c, ours, n, m, k, c->x[0], 0, c->x[1], 0, c->bias, 0, c->y, done);
        if (*done)
            return TP_OK;
    }
    return s_run(c, S_FWD, 0, c->x[0], c->x[1], c->bias, c->y, done);
}

tp_status_t tp_dnnl_matmul_backward(const tp_op_call_t *c, int *done) {
    *done = 0;
    int64_t n, k, m;
    s_dims(c, &n, &k, &m);
    if (!s_use_dnnl() || !n || !k || !m)
        return TP_OK; /* an empty product: OpenBLAS's path clears what it must */
    const int acc_w = c->dx_acc && c->dx_acc[1], acc_x = c->dx_acc && c->dx_acc[0];
    /* both products decide before either runs: a short workspace leaves
     * the whole backward to OpenBLAS */
    /* ours where the rule says and its room fits (dW = x^T dy: a
     * transposed, k = n; dX = dy W^T: b transposed, k = m) */
    const int ours = s_ours(0);
    const size_t room_w = s_ours_room(ours, k, m, n), room_x = s_ours_room(ours, n, k, m);
    const int own_w = c->dx[1] && ours && c->workspace && c->workspace_bytes >= room_w,
              own_x = c->dx[0] && ours && c->workspace && c->workspace_bytes >= room_x;
    int ok = 1;
    if (c->dx[1] && !own_w)
        TP_TRY(s_fits(c, S_DW, acc_w, &ok));
    if (ok && c->dx[0] && !own_x)
        TP_TRY(s_fits(c, S_DX, acc_x, &ok));
    if (!ok)
        return TP_OK;
    if (own_w)
        s_run_ours(c, ours, k, m, n, c->x[0], 1, c->dy, 0, NULL, acc_w, c->dx[1], &ok);
    else if (c->dx[1])
        TP_TRY(s_run(c, S_DW, acc_w, c->x[0], c->dy, NULL, c->dx[1], &ok));
    if (ok && own_x)
        s_run_ours(c, ours, n, k, m, c->dy, 0, c->x[1], 1, NULL, acc_x, c->dx[0], &ok);
    else if (ok && c->dx[0])
        TP_TRY(s_run(c, S_DX, acc_x, c->dy, c->x[1], NULL, c->dx[0], &ok));
    TP_ASSERT(ok); /* s_fits said both run */
    *done = 1;
    return TP_OK;
}
