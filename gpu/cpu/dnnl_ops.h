/* towerpack gpu: the CPU backend's pooling and batch norm on oneDNN
 * (Debian's libdnnl 2.6), beside the convolutions of dnnl_conv.c, and the
 * little they share (dnnl_util.c): one CPU engine for the process, a cache
 * of primitives per geometry, a call that runs one primitive on the op's
 * own buffers.
 *
 * Each op runs on oneDNN where the measurements of docs/performance.md
 * ("Pooling and batch norm on oneDNN") found it faster than the kernels of
 * ops_cpu.c: average pooling and max pooling other than 2x2 stride 2 (whose
 * branch-free kernel in ops_cpu.c is faster), and batch norm only on
 * nChw16c tensors of a blocked chain (gpu/graph/fold.c): on plain NCHW
 * oneDNN's kernel, ncsp_bnorm, took 3-5x our own (now ops_norm.c's). TP_CPU_POOL / TP_CPU_BNORM (dnnl or own) choose either in one
 * binary, so that both can be measured in one sitting. A geometry oneDNN
 * does not take runs the own kernels, forward and backward alike. Only a
 * backend with a oneDNN convolution cache (TP_CPU_CONV, a one-thread
 * backend by default) runs them: with more threads OpenMP's team and
 * OpenBLAS's pool would share the cores. */
#ifndef TOWERPACK_GPU_DNNL_OPS_H
#define TOWERPACK_GPU_DNNL_OPS_H

#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* ---- shared (dnnl_util.c) ---------------------------------------------------- */

/* The process's oneDNN CPU engine, made on first use; NULL with tp_error
 * when oneDNN cannot make it. */
dnnl_engine_t tp_dnnl_engine(void);

/* The calling thread's OpenMP team set to the backend's thread count
 * (tp_cpu_team(tp_cpu_threads()), cpu_pool.h), as dnnl_conv.c does before
 * it makes or runs a primitive;
 * returns that count (part of a cache key: oneDNN splits the work for the
 * team it sees when it makes the primitive). */
int tp_dnnl_threads(void);

/* The geometry of a pooling or convolution call: everything its
 * primitives depend on, the one cache key of both families (dnnl_pool.c
 * keys tp_dnnl_lookup's list with it, dnnl_conv.c its own cache). int32
 * fields so that it fits the 160-byte key; `family` first, as every key
 * of the shared list has it (batch norm's is 2), so that keys of
 * different families differ in their first bytes. Filled whole (zeroed
 * first), so memcmp compares it. */
typedef struct {
    int32_t family;          /* 1: pooling, 3: convolution */
    int32_t kind;            /* tp_op_kind_t: max/avg pool, conv2d/transpose */
    int32_t n, c, h, w;      /* x [N, C, H, W] */
    int32_t o, oh, ow;       /* y [N, O, OH, OW] */
    int32_t kh, kw, sh, sw, ph, pw, dh, dw, g; /* window, stride, padding,
                                                  dilation (>= 1), groups (>= 1) */
    int32_t bias;            /* a third input (conv's bias) */
    int32_t relu;            /* a folded relu (attr.act) */
    int32_t threads;         /* the OpenMP team the primitives are made for */
    int32_t blk16;           /* bit 0: x (and dx) nChw16c; bit 1: y (and dy)
                                (tp_op_call_t.blk16) */
} tp_dnnl_geom_t;

/* c's geometry for a team of `threads` (tp_dnnl_threads()). */
void tp_dnnl_geom(const tp_op_call_t *c, int threads, tp_dnnl_geom_t *k);

/* oneDNN's status as towerpack's, naming the call, the node and the place. */
tp_status_t tp_dnnl_fail(dnnl_status_t st, const char *expr, const char *node,
                         const char *file, int line);

/* A cached geometry: a forward and a backward primitive (either may be
 * NULL), their user scratchpads and the forward's workspace (max pooling's
 * argmax), and what the op's file keeps beside them. */
typedef struct tp_dnnl_prim {
    unsigned char key[160]; /* the op's key, zero-padded: memcmp compares */
    int ok;                 /* 0: oneDNN has no implementation (own code) */
    dnnl_primitive_t fwd, bwd;
    dnnl_memory_desc_t fwd_scratch, bwd_scratch, ws;
    size_t fwd_scratch_bytes, bwd_scratch_bytes, ws_bytes;
    size_t extra[4];        /* the op's own numbers (workspace offsets) */
    struct tp_dnnl_prim *next;
} tp_dnnl_prim_t;

/* Builds entry e (its key set) for call c; returns TP_OK with e->ok 0 when
 * oneDNN does not take the geometry. */
typedef tp_status_t (*tp_dnnl_build_fn)(tp_dnnl_prim_t *e, const tp_op_call_t *c);

/* The entry of `key` (zero-padded to sizeof key by the caller), built by
 * `build` and listed when new (the list never shrinks while the process
 * lives, like oneDNN's own primitive cache; a list past 512 entries builds
 * a new one per call and *owned says the caller frees it with
 * tp_dnnl_prim_free). */
tp_status_t tp_dnnl_lookup(const unsigned char key[160], tp_dnnl_build_fn build,
                           const tp_op_call_t *c, tp_dnnl_prim_t **out, int *owned);
void tp_dnnl_prim_free(tp_dnnl_prim_t *e);

/* Primitive desc -> primitive, its user scratchpad into *scratch; the
 * workspace into e->ws when `ws` (the forward). */
tp_status_t tp_dnnl_finish(const_dnnl_primitive_desc_t pd, dnnl_primitive_t *prim,
                           dnnl_memory_desc_t *scratch, size_t *scratch_bytes,
                           tp_dnnl_prim_t *e, int ws, const char *name);
/* e's primitives from the op descriptors fd (the forward) and bd (the
 * backward; NULL: a forward only), with user scratchpads, and the op's
 * workspace laid out as [head bytes + oneDNN's workspace][the larger
 * scratchpad]: e->extra[0] is the scratchpad's offset, e->extra[1] the
 * workspace's bytes, e->ok 1. TP_OK with e->ok 0 when oneDNN has no
 * implementation (ops_cpu.c runs the op); `what` ("pooling") and `name`
 * (the node) name a failure. */
tp_status_t tp_dnnl_build_pair(tp_dnnl_prim_t *e, const_dnnl_op_desc_t fd,
                               const_dnnl_op_desc_t bd, size_t head, const char *what,
                               const char *name);

/* The entry of `key` for call c (tp_dnnl_lookup's) when oneDNN runs it:
 * *out NULL (ops_cpu.c runs it) when oneDNN does not take the geometry or,
 * with `need_ws`, when c's workspace is smaller than the entry's
 * e->extra[1]. An entry *owned is the caller's to free. */
tp_status_t tp_dnnl_entry(const unsigned char key[160], tp_dnnl_build_fn build,
                          const tp_op_call_t *c, int need_ws, tp_dnnl_prim_t **out,
                          int *owned);

/* A primitive attribute with the user scratchpad (caller destroys). */
tp_status_t tp_dnnl_attr(dnnl_primitive_attr_t *attr, const char *name);

/* Runs `prim` once on the caller's buffers: args[i] of layout mds[i] at
 * ptrs[i] (a scratchpad and a workspace are arguments like the others). */
tp_status_t tp_dnnl_exec(dnnl_primitive_t prim, int nargs, const int *args,
                         const dnnl_memory_desc_t *const *mds, void *const *ptrs,
                         const char *name);

/* The path TP_CPU_POOL / TP_CPU_BNORM names: 1 "dnnl", 0 "own" (ops_cpu.c),
 * -1 unset (or anything else, said once): the measured default. */
int tp_dnnl_ops_path(const char *env);

/* ---- pooling (dnnl_pool.c): max (argmax in the workspace) and average
 * (padding excluded, as ops_cpu.c's), forward and backward ---------------- */

/* Workspace bytes of a pooling call on oneDNN (its primitives made here),
 * or `own` (ops_cpu.c's bytes) where it runs there. */
size_t tp_dnnl_pool_workspace(const tp_op_call_t *c, size_t own);
/* The call on oneDNN, *done 1; *done 0: ops_cpu.c runs it (TP_CPU_POOL=own,
 * the default's 2x2 stride 2 max pooling, a geometry oneDNN lacks). The
 * forward and the backward of one call decide alike; a workspace smaller
 * than planned here (planned for ops_cpu.c) gets room of the call's own. */
tp_status_t tp_dnnl_pool_forward(const tp_op_call_t *c, int *done);
tp_status_t tp_dnnl_pool_backward(const tp_op_call_t *c, int *done);

/* ---- batch norm (dnnl_bnorm.c): training forward with the batch's
 * statistics (the moving averages updated as ops_cpu.c does), its
 * backward, the inference forward on the moving averages; the workspace
 * begins with ops_cpu.c's [mean C][1/std C], so that either backward can
 * follow either forward ---------------------------------------------------- */

size_t tp_dnnl_bnorm_workspace(const tp_op_call_t *c, size_t own);
/* As the pooling's, except that a workspace smaller than planned here runs
 * ops_cpu.c's (the forward's statistics must reach the backward); an
 * inference-mode backward is ops_cpu.c's (*done 0). A folded relu
 * (attr.act) is applied by the forward: in oneDNN's own passes
 * (dnnl_fuse_norm_relu, its mask in the workspace) unless
 * TP_CPU_BNORM_RELU=0. */
tp_status_t tp_dnnl_bnorm_forward(const tp_op_call_t *c, int *done);
tp_status_t tp_dnnl_bnorm_backward(const tp_op_call_t *c, int *done);
/* The backward of a batch norm with a folded relu on the relu's own dy
 * (not masked): *done 1 when the forward's primitive fused the relu and
 * masked dy in its pass; *done 0 (nothing run) otherwise, and the caller
 * masks dy and calls tp_dnnl_bnorm_backward. c is the op's inner call
 * (tp_act_inner with no mask). */
tp_status_t tp_dnnl_bnorm_backward_relu(const tp_op_call_t *c, int *done);

#endif
