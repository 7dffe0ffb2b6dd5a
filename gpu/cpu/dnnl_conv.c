/* towerpack gpu: conv2d and conv2d_transpose on oneDNN (Debian's libdnnl
 * 2.6) for the CPU backend: forward (with its bias), backward-data,
 * backward-weights (with the bias gradient), any stride, padding, dilation,
 * group count (and output padding: the transposed conv is oneDNN's
 * deconvolution, W in PyTorch's [C_in, C_out/g, KH, KW], oneDNN's iohw;
 * its bias, folded relu and bias gradient are ours, outside oneDNN's
 * reference loops: s_entry_build).
 *
 * Each geometry (batch, channels, image, kernel, stride, padding, dilation,
 * groups, bias or not) gets its three primitives once, when the model plans
 * its workspaces, and keeps them in the backend's cache until the backend
 * is destroyed (the thread count too: oneDNN splits the work for it); a
 * 3x3 stride-1 conv's are oneDNN's Winograd where that measured faster
 * (TP_CPU_CONV_ALG, s_winograd; on a 4x4 output the backward-weights
 * alone, s_winograd_weights), the rest its direct algorithm; on the
 * blocked chain a 4x4 output of 512+ channels (ResNet-18's stage 4) runs
 * our own Winograd F(4x4, 3x3) instead (s_f2, cpu_winograd.c: no
 * primitives, U and V kept in the workspace from the forward to the
 * backward). The
 * primitives run on the op's plain NCHW / OIHW buffers: with
 * TP_CPU_CONV=dnnl (the default of a one-thread backend) oneDNN chooses the
 * layouts it runs fastest on (blocked, nChw16c on AVX-512) and every
 * argument is reordered at the op's edges, in and out, into room of the
 * op's workspace (an activation between NCHW and nChw16c by s_blk16, one
 * AVX-512 transpose pass of ours; OIHW weights and their gradient between
 * plain and 16 x 16 blocks by s_wblk, the same kind of pass; the rest by
 * oneDNN's reorders); with TP_CPU_CONV=dnnl-plain the primitives
 * themselves take plain layouts. A gradient that is added to (dx_acc) is
 * added by those passes, by s_add where its layout is the primitive's
 * already, or by a reorder with oneDNN's sum post-op. A folded relu's
 * backward masks dy in the pass that reorders it
 * (tp_dnnl_conv_backward_relu). The scratchpad is the user's (the op's workspace too), so a
 * step allocates no compute memory and two towers can run one primitive at
 * once (a primitive is safe to execute from several threads; what each run
 * writes is in its own node's workspace).
 *
 * Debian builds libdnnl on OpenMP (DNNL_CPU_RUNTIME_OMP, libgomp): a
 * primitive runs on the OpenMP team of the calling thread, whose size is
 * that thread's omp_set_num_threads. Each call sets it to the backend's
 * thread count (cpu_pool.h's tp_cpu_threads and tp_cpu_team), the
 * team OpenBLAS's OpenMP build and the elementwise ranges use too. A few-channel image's passes run
 * ops_conv.c's im2col (see s_entry_build: oneDNN pads the channels).
 *
 * bf16 (cpu_bf16.h, tp_cpu_bf16_on when the call is looked up; the key's
 * S_BF16): the direct passes read their inputs (x, W, dy) in bf16 and
 * write fp32 (y, dx, dW, db); the inputs are rounded where they are
 * reordered into the workspace (s_run: element by element where the op's
 * layout is the primitive's, s_blk16 from NCHW, oneDNN's reorder for W),
 * and the rooms are the bf16 layouts' sizes. oneDNN's Winograd and ours
 * stay fp32 where auto still picks them for such a geometry (s_winograd,
 * s_f2: measured per layer, docs/compute.md "bf16 convolutions"). */
#include <cblas.h>
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/log.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_bf16.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/cpu_winograd.h"
#include "gpu/cpu/dnnl_conv.h"
#include "gpu/cpu/conv_thin.h"
#include "gpu/cpu/dnnl_ops.h"
#include "gpu/cpu/ops_conv.h"
#include "gpu/cpu/ops_elementwise.h"

/* OpenMP's own (libgomp; declared here so that no OpenMP compiler flag is
 * needed for one call) */
extern void omp_set_num_threads(int n);
extern int omp_get_max_threads(void);

enum { S_FWD, S_BWD_DATA, S_BWD_WEIGHTS, S_PASSES };
enum { S_MAX_ARGS = 4, S_MAX_ENTRIES = 256, S_ALIGN = 64 };
/* TP_CPU_CONV_ALG=auto's Winograd: channels in and out at least
 * S_WINO_MIN_C, an output larger than S_WINO_MIN_HW a side (s_winograd) */
enum { S_WINO_MIN_C = 32, S_WINO_MIN_HW = 4 };
/* a bf16 geometry's (S_BF16): auto's Winograd (fp32) only on an output
 * larger than S_WINO_BF16_MIN_HW a side; bf16 direct at and below */
enum { S_WINO_BF16_MIN_HW = 14 };
/* auto's Winograd of our own (F(4x4, 3x3)): channels in and out at least
 * S_F2_MIN_C on a 4x4 output; at least S_F4_7_MIN_C on a 7x7 output of
 * at most S_F4_7_MAX_N images (s_f2) */
enum { S_F2_MIN_C = 512, S_F4_7_MIN_C = 256, S_F4_7_MAX_N = 16 };

/* The cache key: the call's geometry (tp_dnnl_geom_t, dnnl_ops.h: the
 * pooling's key too), with the OpenMP team it was made for (below) and a
 * folded relu (the forward's eltwise post-op). */
typedef tp_dnnl_geom_t s_geom_t;

/* One argument of a primitive: the op's plain layout and the primitive's;
 * a reorder between them where they differ, and room in the workspace
 * for the primitive's copy (inputs reordered in; outputs written there and
 * reordered out, or kept there when the op wants no such gradient). */
typedef struct {
    int arg;                       /* DNNL_ARG_* */
    int out;                       /* written by the primitive */
    int same;                      /* the primitive runs on the plain layout */
    int room;                      /* has a buffer in the workspace */
    int blk16;                     /* plain NCHW <-> nChw16c: s_blk16 */
    int nhwc;                      /* an input NHWC -> the primitive's plain
                                      NCHW: s_nhwc (a folded transpose) */
    int wblk;                      /* plain OIHW weights <-> blocked: s_wblk
                                      (1: ABcd16b16a, 2: ABcd16a16b) */
    int bf16;                      /* an input whose md is user's layout in
                                      bf16 (NCHW, nChw16c): rounded element
                                      by element (tp_cpu_f32_to_bf16) */
    dnnl_memory_desc_t user, md;   /* plain layout; the primitive's */
    dnnl_primitive_t in;           /* user -> md (inputs, layouts differ) */
    dnnl_primitive_t put[2];       /* md -> user: [0] store, [1] add (sum) */
    size_t off;                    /* its room, bytes into the workspace */
} s_arg_t;

typedef struct {
    dnnl_primitive_t prim;
    int nargs;
    s_arg_t args[S_MAX_ARGS];
    dnnl_memory_desc_t scratch;    /* user scratchpad (size 0: none) */
    size_t scratch_bytes;
    size_t bytes;                  /* the pass's rooms */
} s_pass_t;

/* A geometry's passes and its workspace: [keep][dd][the running pass's
 * rooms]. keep: x in the layout of the forward's and the backward-weights'
 * source, written by the forward and read by the backward of the same step
 * (an op's workspace lasts from one to the other), so x is reordered once
 * a step, not twice; dd: dy in the backward passes' layout, reordered once
 * for both. */
typedef struct s_entry {
    s_geom_t key;
    int ok;                        /* oneDNN implements all three passes */
    s_pass_t pass[S_PASSES];
    int data_im2col;               /* backward-data by ops_conv.c (below) */
    int winograd;                  /* the passes are oneDNN's Winograd */
    int f2;                        /* 2 or 4: the passes are our Winograd
                                      F(f2 x f2, 3x3) (cpu_winograd.c,
                                      s_f2_*): no primitives, the
                                      workspace is U, V, M and dV
                                      (s_f2_bytes) */
    int f2_team;                   /* the team size when planned: F(4x4)'s
                                      rooms in U's (cpu_winograd4.c) */
    int own_bias;                  /* the forward's bias and relu are ours */
    int mask16;                    /* a folded relu's backward writes dy
                                      masked straight into dd, nChw16c
                                      (s_blk16): the backward-weights'
                                      diff_dst layout, and backward-data's
                                      when it runs on oneDNN */
    size_t keep_bytes, dd_bytes;   /* 0: not shared */
    size_t rooms;                  /* where the passes' rooms start */
    size_t bytes;                  /* the whole workspace, with alignment */
    struct s_entry *next;
} s_entry_t;

/* TP_CPU_CONV_ALG: the algorithm of a 3x3 stride-1 convolution. auto:
 * oneDNN's direct or Winograd by s_winograd's rule, ours (F(4x4, 3x3)) by
 * s_f2's; onednn: auto without ours; f2x2, f4x4: ours, F(2x2, 3x3) or
 * F(4x4, 3x3), wherever it applies, auto's rule elsewhere; direct,
 * winograd: oneDNN's alone. */
typedef enum {
    S_ALG_AUTO = 0,
    S_ALG_DIRECT,
    S_ALG_WINOGRAD,
    S_ALG_ONEDNN,
    S_ALG_F2,
    S_ALG_F4
} s_alg_t;

struct tp_dnnl_conv {
    dnnl_engine_t engine;
    tp_cpu_conv_path_t path;
    s_alg_t alg;                   /* read once, when the cache is made */
    pthread_mutex_t mu;            /* guards the list; entries never change
                                      once listed */
    s_entry_t *entries;
    int count;
};

/* ---- errors -------------------------------------------------------------- */

/* oneDNN's status as towerpack's, naming the call, the node and the place. */
static tp_status_t s_fail(dnnl_status_t st, const char *expr, const char *node,
                          const char *file, int line) {
    tp_status_t rc = st == dnnl_out_of_memory      ? TP_ERR_NOMEM
                     : st == dnnl_invalid_arguments ? TP_ERR_INVALID
                     : st == dnnl_unimplemented     ? TP_ERR_UNSUPPORTED
                                                    : TP_ERR_DEVICE;
    return tp_error(rc, "%s: oneDNN %s failed: %s (%s:%d)", node ? node : "conv2d",
                    expr, dnnl_status2str(st), file, line);
}
#define S_DNNL(expr)                                                           \
    do {                                                                       \
        dnnl_status_t st_ = (expr);                                            \
        if (st_ != dnnl_success)                                               \
            return s_fail(st_, #expr, name, __FILE__, __LINE__);               \
    } while (0)

static size_t s_round(size_t b) { return (b + S_ALIGN - 1) & ~(size_t)(S_ALIGN - 1); }

/* ---- the path ------------------------------------------------------------ */

tp_status_t tp_cpu_conv_path_from_env(int threads, tp_cpu_conv_path_t *path) {
    const char *e = getenv("TP_CPU_CONV");
    if (!e || !*e)
        /* one team for the step (OpenBLAS's OpenMP build): oneDNN at any
         * thread count; beside OpenBLAS's pthread pool, im2col above one */
        *path = threads <= 1 || openblas_get_parallel() == 2 ? TP_CPU_CONV_DNNL
                                                             : TP_CPU_CONV_IM2COL;
    else if (!strcmp(e, "dnnl"))
        *path = TP_CPU_CONV_DNNL;
    else if (!strcmp(e, "dnnl-plain"))
        *path = TP_CPU_CONV_DNNL_PLAIN;
    else if (!strcmp(e, "im2col"))
        *path = TP_CPU_CONV_IM2COL;
    else
        return tp_error(TP_ERR_INVALID,
                        "TP_CPU_CONV=%s: expected dnnl, dnnl-plain or im2col", e);
    return TP_OK;
}

/* ---- threads ------------------------------------------------------------- */

/* The calling thread's OpenMP team: the backend's thread count. Set before
 * a primitive is made too, not only before it runs: oneDNN splits the work
 * when it makes the primitive, for the team it sees then, and runs with
 * that many threads (num_threads) whatever the team is later; a primitive
 * made for 2 threads run by a tower that should use 1 oversubscribes the
 * cores, and its threads spin at barriers waiting for each other. So the
 * team is part of the cache key. */
static void s_threads(void) { tp_cpu_team(tp_cpu_threads()); }

/* ---- geometry ------------------------------------------------------------ */

/* the key's blk16 bit for x (and dx) NHWC (tp_op_call_t.nhwc): the
 * primitives read and write the op's NHWC buffer, reordered where they
 * run on another layout (never with nChw16c x: a transpose is no such
 * chain's member) */
enum { S_X_NHWC = 4 };

/* the key's bit for bf16 operands (cpu_bf16.h, tp_cpu_bf16_on when the
 * call is looked up): the primitives of such a geometry take x, dy and W
 * in bf16 and write y, dx and dW in fp32; switching bf16 on or off finds
 * the other entry, never one made for the other precision */
enum { S_BF16 = 8 };

static s_geom_t s_geom(const tp_op_call_t *c) {
    s_geom_t k;
    tp_dnnl_geom(c, omp_get_max_threads(), &k);
    if (c->nhwc)
        k.blk16 |= S_X_NHWC;
    if (tp_cpu_bf16_on())
        k.blk16 |= S_BF16;
    return k;
}

/* A transposed convolution: x is the small image, y the large. */
static int s_deconv(const s_geom_t *k) { return k->kind == TP_OP_CONV_TRANSPOSE; }

/* The plain descriptions of x, w, b and y, and the primitive's (any, or
 * the same plain ones); oneDNN's dilation counts the gaps (ours - 1), and
 * its right padding is what makes the output size exact (it may be
 * negative: a stride that skips the last columns). xi, wi, yi: the
 * primitive's x, w and y where a pass reads them (the forward's src and
 * weights, the backwards' diff_dst, weights and src), bf16 for a bf16
 * geometry, else xa, wa and ya; what a pass writes (y, dx, dW) is fp32. */
typedef struct {
    dnnl_memory_desc_t x, w, b, y, xa, wa, ya, xi, wi, yi;
    dnnl_dims_t strides, dil, pl, pr;
} s_mds_t;

/* md in bf16: the same layout (a plain one's strides, or any) */
static dnnl_memory_desc_t s_as_bf16(const dnnl_memory_desc_t *md) {
    dnnl_memory_desc_t t = *md;
    t.data_type = dnnl_bf16;
    return t;
}

/* bf16: the passes' inputs in bf16 (the key's S_BF16 where the geometry
 * runs oneDNN's direct passes; s_entry_build) */
static tp_status_t s_mds(const tp_dnnl_conv_t *self, const s_geom_t *k, int bf16,
                         const char *name, s_mds_t *m) {
    dnnl_dims_t xd = {k->n, k->c, k->h, k->w}, yd = {k->n, k->o, k->oh, k->ow};
    dnnl_dims_t bd = {k->o};
    /* the call's layouts: NCHW, or nChw16c where the graph keeps the
     * tensor blocked (tp_op_call_t.blk16); a primitive that runs on the
     * same then reads or writes the op's buffer itself, no reorder */
    /* (NHWC of 16 channels is nChw16c's memory, the layout the blocked
     * primitives take: said so, the primitive reads and writes the op's
     * buffer itself, no reorder) */
    const int nhwc16 = (k->blk16 & S_X_NHWC) && k->c == 16 &&
                       self->path != TP_CPU_CONV_DNNL_PLAIN;
    S_DNNL(dnnl_memory_desc_init_by_tag(&m->x, 4, xd, dnnl_f32,
                                        nhwc16                ? dnnl_nChw16c
                                        : (k->blk16 & S_X_NHWC) ? dnnl_nhwc
                                        : (k->blk16 & 1)      ? dnnl_nChw16c
                                                              : dnnl_nchw));
    S_DNNL(dnnl_memory_desc_init_by_tag(&m->y, 4, yd, dnnl_f32,
                                        (k->blk16 & 2) ? dnnl_nChw16c : dnnl_nchw));
    S_DNNL(dnnl_memory_desc_init_by_tag(&m->b, 1, bd, dnnl_f32, dnnl_a));
    /* conv2d's W is [O, C/g, KH, KW]; conv2d_transpose's (PyTorch's) is
     * [C, O/g, KH, KW], oneDNN's iohw of the same logical weights */
    if (k->g > 1) {
        dnnl_dims_t wd = {k->g, k->o / k->g, k->c / k->g, k->kh, k->kw};
        S_DNNL(dnnl_memory_desc_init_by_tag(&m->w, 5, wd, dnnl_f32,
                                            s_deconv(k) ? dnnl_giohw : dnnl_goihw));
    } else {
        dnnl_dims_t wd = {k->o, k->c, k->kh, k->kw};
        S_DNNL(dnnl_memory_desc_init_by_tag(&m->w, 4, wd, dnnl_f32,
                                            s_deconv(k) ? dnnl_iohw : dnnl_oihw));
    }
    if (self->path == TP_CPU_CONV_DNNL_PLAIN) {
        m->xa = m->x;
        /* an NHWC source: the primitives' plain NCHW, by s_nhwc (oneDNN's
         * NHWC kernel for a few channels is its reference loop) */
        if (k->blk16 & S_X_NHWC)
            S_DNNL(dnnl_memory_desc_init_by_tag(&m->xa, 4, xd, dnnl_f32, dnnl_nchw));
        m->wa = m->w;
        m->ya = m->y;
    } else {
        S_DNNL(dnnl_memory_desc_init_by_tag(&m->xa, 4, xd, dnnl_f32, dnnl_format_tag_any));
        S_DNNL(dnnl_memory_desc_init_by_tag(&m->ya, 4, yd, dnnl_f32, dnnl_format_tag_any));
        S_DNNL(dnnl_memory_desc_init_by_tag(&m->wa, m->w.ndims, m->w.dims, dnnl_f32,
                                            dnnl_format_tag_any));
    }
    m->xi = bf16 ? s_as_bf16(&m->xa) : m->xa;
    m->wi = bf16 ? s_as_bf16(&m->wa) : m->wa;
    m->yi = bf16 ? s_as_bf16(&m->ya) : m->ya;
    m->strides[0] = k->sh;
    m->strides[1] = k->sw;
    m->dil[0] = k->dh - 1;
    m->dil[1] = k->dw - 1;
    m->pl[0] = k->ph;
    m->pl[1] = k->pw;
    /* a transposed conv's padding is that of the conv from y to x (its
     * output padding is the right padding's shortfall) */
    const int64_t bh = s_deconv(k) ? k->oh : k->h, bw = s_deconv(k) ? k->ow : k->w;
    const int64_t sh_ = s_deconv(k) ? k->h : k->oh, sw_ = s_deconv(k) ? k->w : k->ow;
    m->pr[0] = (sh_ - 1) * k->sh + (k->kh - 1) * k->dh + 1 - bh - k->ph;
    m->pr[1] = (sw_ - 1) * k->sw + (k->kw - 1) * k->dw + 1 - bw - k->pw;
    return TP_OK;
}

/* ---- building a pass ------------------------------------------------------ */

static void s_pass_free(s_pass_t *p) {
    for (int i = 0; i < p->nargs; i++) {
        s_arg_t *a = &p->args[i];
        if (a->in)
            dnnl_primitive_destroy(a->in);
        for (int j = 0; j < 2; j++)
            if (a->put[j])
                dnnl_primitive_destroy(a->put[j]);
    }
    if (p->prim)
        dnnl_primitive_destroy(p->prim);
    memset(p, 0, sizeof *p);
}

static void s_entry_free(s_entry_t *e) {
    if (!e)
        return;
    for (int i = 0; i < S_PASSES; i++)
        s_pass_free(&e->pass[i]);
    free(e);
}

/* A reorder from `src` to `dst`, adding to dst when `sum`. */
static tp_status_t s_reorder(const tp_dnnl_conv_t *self, const dnnl_memory_desc_t *src,
                             const dnnl_memory_desc_t *dst, int sum, const char *name,
                             dnnl_primitive_t *out) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success && sum) {
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success)
            st = dnnl_post_ops_append_sum(po, 1.0f);
        if (st == dnnl_success)
            st = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (st == dnnl_success)
        st = dnnl_reorder_primitive_desc_create(&pd, src, self->engine, dst,
                                                self->engine, attr);
    if (st == dnnl_success)
        st = dnnl_primitive_create(out, pd);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success)
        return s_fail(st, "reorder", name, __FILE__, __LINE__);
    return TP_OK;
}

static int s_is_blk16(const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *md);
static int s_is_nhwc(const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *md);
static int s_is_wblk(const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *md, int out);

/* Argument `arg` of the pass: its plain layout `user` and the primitive's
 * (queried from pd); `addable` outputs always get room (they may be added
 * to, or not wanted at all). */
static tp_status_t s_arg(const tp_dnnl_conv_t *self, s_pass_t *p,
                         const_dnnl_primitive_desc_t pd, int arg, int out,
                         int addable, const dnnl_memory_desc_t *user, const char *name) {
    TP_ASSERT(p->nargs < S_MAX_ARGS);
    s_arg_t *a = &p->args[p->nargs++];
    a->arg = arg;
    a->out = out;
    a->user = *user;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
    if (!md)
        return tp_error(TP_ERR_DEVICE, "%s: oneDNN gave no layout for argument %d", name, arg);
    a->md = *md;
    const int same = dnnl_memory_desc_equal(&a->md, &a->user);
    a->same = same;
    a->room = !same || addable;
    a->blk16 = !same && s_is_blk16(&a->user, &a->md);
    a->nhwc = !same && !out && s_is_nhwc(&a->user, &a->md);
    a->wblk = same ? 0 : s_is_wblk(&a->user, &a->md, out);
    if (!out && a->md.data_type == dnnl_bf16 && a->user.data_type == dnnl_f32) {
        const dnnl_memory_desc_t u16 = s_as_bf16(&a->user);
        a->bf16 = dnnl_memory_desc_equal(&u16, &a->md);
    }
    if (!same && !out)
        TP_TRY(s_reorder(self, &a->user, &a->md, 0, name, &a->in));
    if (out && (!same || addable)) {
        TP_TRY(s_reorder(self, &a->md, &a->user, 0, name, &a->put[0]));
        TP_TRY(s_reorder(self, &a->md, &a->user, 1, name, &a->put[1]));
    }
    return TP_OK;
}

/* The primitive of a pass from its descriptor; *ok 0 when oneDNN has no
 * implementation (not an error: the im2col code runs that geometry).
 * `relu`: a relu on the output as the primitive's eltwise post-op (the
 * forward of a conv a relu is folded into: one pass over y, not two). */
static tp_status_t s_pd(const tp_dnnl_conv_t *self, const void *op_desc,
                        const_dnnl_primitive_desc_t hint, dnnl_primitive_desc_t *pd,
                        int *ok, int relu, const char *name) {
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po = NULL;
    S_DNNL(dnnl_primitive_attr_create(&attr));
    dnnl_status_t st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success && relu) {
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success)
            st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
        if (st == dnnl_success)
            st = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (st == dnnl_success)
        st = dnnl_primitive_desc_create(pd, op_desc, attr, self->engine, hint);
    if (po)
        dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    *ok = st == dnnl_success;
    if (st == dnnl_unimplemented) {
        *pd = NULL;
        return TP_OK;
    }
    if (st != dnnl_success)
        return s_fail(st, "dnnl_primitive_desc_create", name, __FILE__, __LINE__);
    return TP_OK;
}

/* The primitive, its scratchpad and the workspace layout of the pass. */
static tp_status_t s_finish(s_pass_t *p, const_dnnl_primitive_desc_t pd, const char *name) {
    S_DNNL(dnnl_primitive_create(&p->prim, pd));
    const dnnl_memory_desc_t *sm = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t off = 0;
    if (sm) {
        p->scratch = *sm;
        p->scratch_bytes = dnnl_memory_desc_get_size(sm);
        off = s_round(p->scratch_bytes);
    }
    for (int i = 0; i < p->nargs; i++)
        if (p->args[i].room) {
            p->args[i].off = off;
            off += s_round(dnnl_memory_desc_get_size(&p->args[i].md));
        }
    p->bytes = off;
    return TP_OK;
}

/* The three descriptors of a convolution (not transposed) by `alg`. */
static dnnl_status_t s_conv_descs(const s_mds_t *m, const dnnl_memory_desc_t *bias,
                                  dnnl_alg_kind_t alg, dnnl_convolution_desc_t *fd,
                                  dnnl_convolution_desc_t *dd, dnnl_convolution_desc_t *wd) {
    dnnl_status_t st = dnnl_dilated_convolution_forward_desc_init(
        fd, dnnl_forward_training, alg, &m->xi, &m->wi, bias, &m->ya, m->strides, m->dil,
        m->pl, m->pr);
    if (st == dnnl_success)
        st = dnnl_dilated_convolution_backward_data_desc_init(
            dd, alg, &m->xa, &m->wi, &m->yi, m->strides, m->dil, m->pl, m->pr);
    if (st == dnnl_success)
        st = dnnl_dilated_convolution_backward_weights_desc_init(
            wd, alg, &m->xi, &m->wa, bias, &m->yi, m->strides, m->dil, m->pl, m->pr);
    return st;
}

static void s_pds_free(dnnl_primitive_desc_t *f, dnnl_primitive_desc_t *d,
                       dnnl_primitive_desc_t *w) {
    dnnl_primitive_desc_t *all[3] = {f, d, w};
    for (int i = 0; i < 3; i++)
        if (*all[i]) {
            dnnl_primitive_desc_destroy(*all[i]);
            *all[i] = NULL;
        }
}

/* The three primitive descriptors of a convolution by `alg`; *ok 0 when
 * oneDNN lacks one of them (its descriptor or its implementation). */
static tp_status_t s_conv_pds(const tp_dnnl_conv_t *self, const s_geom_t *k,
                              const s_mds_t *m, const dnnl_memory_desc_t *bias,
                              dnnl_alg_kind_t alg, const char *name,
                              dnnl_primitive_desc_t *fpd, dnnl_primitive_desc_t *dpd,
                              dnnl_primitive_desc_t *wpd, int *ok) {
    dnnl_convolution_desc_t fd, dd, wd;
    *ok = 0;
    if (s_conv_descs(m, bias, alg, &fd, &dd, &wd) != dnnl_success)
        return TP_OK;
    TP_TRY(s_pd(self, &fd, NULL, fpd, ok, (int)k->relu, name));
    if (*ok)
        TP_TRY(s_pd(self, &dd, *fpd, dpd, ok, 0, name));
    if (*ok)
        TP_TRY(s_pd(self, &wd, *fpd, wpd, ok, 0, name));
    return TP_OK;
}

/* Whether geometry k asks for Winograd (oneDNN's F(4x4, 3x3): fewer
 * multiplies, more additions and transforms; it rounds differently, within
 * the bound tests/gpu/test_dnnl_conv.c checks). Only a 3x3 stride-1
 * undilated ungrouped convolution on oneDNN's own layouts has it. auto:
 * where a pass (forward + both backwards) measured faster
 * (docs/performance.md, "Winograd"): at least 32 channels in and out
 * (0.44-0.80x direct's CPU time) on an output larger than 4x4; direct for
 * the few-channel first layers (1 or 3 -> 32: 1.6-3.4x slower, the image
 * padded to 16 channels), 16 channels (1.1x) and ResNet-18's 4x4 stage 4
 * (one output tile: 1.0-1.1x; but see s_winograd_weights). A rule of the
 * geometry alone, not a timing, so the towers of a run, and a run and its
 * resume, choose alike. */
static int s_winograd(const tp_dnnl_conv_t *self, const s_geom_t *k) {
    if (self->alg == S_ALG_DIRECT || self->path == TP_CPU_CONV_DNNL_PLAIN)
        return 0;
    if (k->kh != 3 || k->kw != 3 || k->sh != 1 || k->sw != 1 || k->dh != 1 || k->dw != 1 ||
        k->g != 1)
        return 0;
    if (self->alg == S_ALG_WINOGRAD)
        return 1;
    /* bf16 (cpu_bf16.h): oneDNN's Winograd is fp32 alone, and its direct
     * passes on bf16 run 1.7x its fp32 direct's speed; measured per layer
     * (docs/performance.md, "bf16 convolutions"), fp32 Winograd still won
     * on ResNet-18's 28x28 stage 1 (64 channels: 11.1 against 12.6 ms a
     * pass, forward and backward), bf16 direct on its 14x14 stage 2 (128:
     * 11.9 against 12.8) and on cnn-bn's 14x14 and 7x7 convs */
    const int min_hw = (k->blk16 & S_BF16) ? S_WINO_BF16_MIN_HW : S_WINO_MIN_HW;
    return k->c >= S_WINO_MIN_C && k->o >= S_WINO_MIN_C && k->oh > min_hw && k->ow > min_hw;
}

/* Whether geometry k, direct by s_winograd, still takes Winograd for its
 * backward-weights pass alone (auto only): an output of exactly 4x4 (one
 * F(4x4, 3x3) tile an image: ResNet-18's stage 4 at 112 px), at least 32
 * channels in and out. There oneDNN's Winograd forward and backward-data
 * tie with direct (7.6-8.7 against 7.7-8.2 ms on 16 x 512 -> 512, one
 * thread) but its backward-weights took 8.3-8.5 ms against direct's
 * 10.9-11.0 (docs/history.md, "The ResNet-18 step per layer"). */
static int s_winograd_weights(const tp_dnnl_conv_t *self, const s_geom_t *k) {
    /* (not a bf16 geometry's: its direct passes take bf16, 2x direct
     * fp32's speed, and oneDNN's Winograd is fp32 alone) */
    if (self->alg == S_ALG_DIRECT || self->alg == S_ALG_WINOGRAD ||
        self->path == TP_CPU_CONV_DNNL_PLAIN || s_deconv(k) || (k->blk16 & S_BF16))
        return 0;
    return k->kh == 3 && k->kw == 3 && k->sh == 1 && k->sw == 1 && k->dh == 1 &&
           k->dw == 1 && k->g == 1 && k->c >= S_WINO_MIN_C && k->o >= S_WINO_MIN_C &&
           k->oh == S_WINO_MIN_HW && k->ow == S_WINO_MIN_HW;
}

/* The output tile of our Winograd (cpu_winograd.c) geometry k takes: 2
 * (F(2x2, 3x3)), 4 (F(4x4, 3x3)) or 0 (oneDNN's passes). Ours where it
 * applies (3x3, stride 1, padding 1, no dilation or groups, x and y both
 * nChw16c: the blocked chain, so AVX-512; channels in multiples of 16)
 * when forced (f2x2, f4x4), and for auto where it measured faster than
 * oneDNN's passes: F(4x4) on a 4x4 output (ResNet-18's stage 4 at 112 px:
 * one tile an image) with at least S_F2_MIN_C channels in and out
 * (docs/history.md, "Winograd F(2x2, 3x3) of our own" and branch
 * wino6's F(4x4): fewer products; U made in blocks a thread, wino8 and wino9), and on
 * a 7x7 output (stage 3: 2x2 tiles an image, the last row and column
 * cut) with at least S_F4_7_MIN_C channels and at most S_F4_7_MAX_N
 * images (branch wino7: the backward 9.5-10.4 against oneDNN's 11.4-12.9
 * ms on 16 x 256 -> 256, the forward a tie; the zoo ResNet's 128 x 128 ->
 * 128 lost, 12-14 + 29-33 against 9-10 + 18-21: 512 tiles a position
 * are past what our GEMM's short products are for). */
static int s_f2(const tp_dnnl_conv_t *self, const s_geom_t *k) {
    if (self->alg != S_ALG_AUTO && self->alg != S_ALG_F2 && self->alg != S_ALG_F4)
        return 0;
    if (self->path != TP_CPU_CONV_DNNL || s_deconv(k) || (k->blk16 & 7) != 3 ||
        k->kh != 3 || k->kw != 3 || k->sh != 1 || k->sw != 1 || k->dh != 1 ||
        k->dw != 1 || k->g != 1 || k->ph != 1 || k->pw != 1 || k->oh != k->h ||
        k->ow != k->w || k->c % 16 || k->o % 16)
        return 0;
    if (self->alg != S_ALG_AUTO)
        return self->alg == S_ALG_F2 ? 2 : 4;
    if (k->oh == S_WINO_MIN_HW && k->ow == S_WINO_MIN_HW)
        return k->c >= S_F2_MIN_C && k->o >= S_F2_MIN_C ? 4 : 0;
    return k->oh == 7 && k->ow == 7 && k->c >= S_F4_7_MIN_C && k->o >= S_F4_7_MIN_C &&
                   k->n <= S_F4_7_MAX_N
               ? 4
               : 0;
}

/* The geometry of entry e's call in its tiles as cpu_winograd.h's, with
 * a room in U's for each thread of the team it was planned for (F(4x4)'s
 * passes make U or dU in blocks, one a thread at a time: branch wino9) */
static tp_wino_t s_f2_geom(const s_entry_t *e) {
    const s_geom_t *k = &e->key;
    tp_wino_t g = tp_wino_geom(k->n, k->c, k->o, k->h, k->w, e->f2);
    g.rooms = (size_t)e->f2_team;
    return g;
}

/* The workspace of an entry of ours (F(2x2) or F(4x4)): [state][U][V][M][dV], each aligned.
 * state says whether U's room holds the weights' transform (the forward's,
 * kept for the backward-data) or the backward-weights' dU (written over
 * it: the weights' transform is made again by a second backward over the
 * same forward). V is the forward's, kept for the backward-weights. */
enum { S_F2_U = 1 };
typedef struct {
    int *state;
    float *u, *v, *m, *dv;
} s_f2_rooms_t;

static size_t s_f2_bytes(const s_entry_t *e, s_f2_rooms_t *r, char *base) {
    const tp_wino_t g = s_f2_geom(e);
    const size_t sz[4] = {tp_wino_u_floats(&g), tp_wino_v_floats(&g), tp_wino_m_floats(&g),
                          tp_wino_v_floats(&g)};
    float **at[4] = {r ? &r->u : NULL, r ? &r->v : NULL, r ? &r->m : NULL,
                     r ? &r->dv : NULL};
    size_t off = S_ALIGN;
    if (r)
        r->state = (int *)base;
    for (int i = 0; i < 4; i++) {
        if (r)
            *at[i] = (float *)(base + off);
        off += s_round(sz[i] * sizeof(float));
    }
    return off;
}

/* The three passes of geometry k into e (e->ok 0: some pass unimplemented). */
static tp_status_t s_entry_build(const tp_dnnl_conv_t *self, s_entry_t *e,
                                 const tp_op_call_t *c) {
    const char *name = c->name;
    const s_geom_t *k = &e->key;
    if ((e->f2 = s_f2(self, k))) {
        e->ok = 1;
        e->f2_team = tp_cpu_threads();
        e->bytes = s_f2_bytes(e, NULL, NULL) + S_ALIGN;
        return TP_OK;
    }
    s_mds_t m;
    TP_TRY(s_mds(self, k, 0, name, &m));
    /* (a deconvolution's descriptor is a convolution's, dnnl_types.h) */
    dnnl_convolution_desc_t fd, dd, wd;
    const dnnl_memory_desc_t *bias = k->bias ? &m.b : NULL;
    /* oneDNN 2.6's deconvolution forward is its convolution's
     * backward-data with the bias and the post-ops applied after it by
     * reference (scalar) loops over the blocked output: with them the
     * autoencoder's 32->16 decoder forward took 4.2 ms of which the JIT
     * kernel took under 1 (docs/performance.md); without them it is the
     * kernel alone, and s_bias_act adds both in one vector pass. Its
     * backward-weights sums the bias gradient the same way: s_bias_grad
     * does it on the plain dy instead. */
    e->own_bias = s_deconv(k);
    const dnnl_memory_desc_t *fbias = e->own_bias ? NULL : bias;
    dnnl_status_t st;
    dnnl_primitive_desc_t fpd = NULL, dpd = NULL, wpd = NULL;
    int ok = 0;
    tp_status_t rc = TP_OK;
    if (!s_deconv(k) && s_winograd(self, k)) {
        /* Winograd where all three passes have it (oneDNN 2.6: AVX-512
         * only); any pass without it: all three direct, below */
        rc = s_conv_pds(self, k, &m, bias, dnnl_convolution_winograd, name, &fpd, &dpd,
                        &wpd, &ok);
        if (rc == TP_OK && !ok)
            s_pds_free(&fpd, &dpd, &wpd);
        e->winograd = rc == TP_OK && ok;
    }
    /* a bf16 geometry's direct passes: on bf16 inputs (oneDNN's Winograd,
     * where it runs, is fp32 alone) */
    if (rc == TP_OK && !e->winograd && (k->blk16 & S_BF16))
        rc = s_mds(self, k, 1, name, &m);
    if (rc != TP_OK || e->winograd) {
        st = dnnl_success;
    } else if (!s_deconv(k)) {
        st = s_conv_descs(&m, bias, dnnl_convolution_direct, &fd, &dd, &wd);
    } else if (k->c / k->g < 8 || k->o / k->g < 8) {
        /* a transposed conv to or from a few-channel image: oneDNN pads the
         * channels to 16 (the slow case of conv2d's backward-data below) */
        st = dnnl_unimplemented;
    } else {
        st = dnnl_dilated_deconvolution_forward_desc_init(
            &fd, dnnl_forward_training, dnnl_deconvolution_direct, &m.xi, &m.wi, fbias,
            &m.ya, m.strides, m.dil, m.pl, m.pr);
        if (st == dnnl_success)
            st = dnnl_dilated_deconvolution_backward_data_desc_init(
                &dd, dnnl_deconvolution_direct, &m.xa, &m.wi, &m.yi, m.strides, m.dil,
                m.pl, m.pr);
        if (st == dnnl_success)
            st = dnnl_dilated_deconvolution_backward_weights_desc_init(
                &wd, dnnl_deconvolution_direct, &m.xi, &m.wa, fbias, &m.yi, m.strides,
                m.dil, m.pl, m.pr);
    }
    if (st != dnnl_success) { /* a geometry oneDNN does not take: im2col's */
        e->ok = 0;
        e->bytes = tp_cpu_conv_workspace(c);
        return TP_OK;
    }
    if (rc == TP_OK && !e->winograd) {
        rc = s_pd(self, &fd, NULL, &fpd, &ok, (int)k->relu && !e->own_bias, name);
        if (rc == TP_OK && ok)
            rc = s_pd(self, &dd, fpd, &dpd, &ok, 0, name);
        if (rc == TP_OK && ok)
            rc = s_pd(self, &wd, fpd, &wpd, &ok, 0, name);
        dnnl_convolution_desc_t ww;
        dnnl_primitive_desc_t wino = NULL;
        int wok = 0;
        if (rc == TP_OK && ok && s_winograd_weights(self, k) &&
            dnnl_dilated_convolution_backward_weights_desc_init(
                &ww, dnnl_convolution_winograd, &m.xa, &m.wa, bias, &m.ya, m.strides, m.dil,
                m.pl, m.pr) == dnnl_success)
            rc = s_pd(self, &ww, fpd, &wino, &wok, 0, name);
        if (wok) { /* else the direct pass stays */
            dnnl_primitive_desc_destroy(wpd);
            wpd = wino;
        }
    }
    e->ok = rc == TP_OK && ok;
    if (e->ok) {
        s_pass_t *p = &e->pass[S_FWD];
        rc = s_arg(self, p, fpd, DNNL_ARG_SRC, 0, 0, &m.x, name);
        if (rc == TP_OK)
            rc = s_arg(self, p, fpd, DNNL_ARG_WEIGHTS, 0, 0, &m.w, name);
        if (rc == TP_OK && fbias)
            rc = s_arg(self, p, fpd, DNNL_ARG_BIAS, 0, 0, &m.b, name);
        if (rc == TP_OK)
            rc = s_arg(self, p, fpd, DNNL_ARG_DST, 1, 0, &m.y, name);
        if (rc == TP_OK)
            rc = s_finish(p, fpd, name);
        p = &e->pass[S_BWD_DATA];
        if (rc == TP_OK)
            rc = s_arg(self, p, dpd, DNNL_ARG_DIFF_DST, 0, 0, &m.y, name);
        if (rc == TP_OK)
            rc = s_arg(self, p, dpd, DNNL_ARG_WEIGHTS, 0, 0, &m.w, name);
        if (rc == TP_OK)
            rc = s_arg(self, p, dpd, DNNL_ARG_DIFF_SRC, 1, 1, &m.x, name);
        if (rc == TP_OK)
            rc = s_finish(p, dpd, name);
        p = &e->pass[S_BWD_WEIGHTS];
        if (rc == TP_OK)
            rc = s_arg(self, p, wpd, DNNL_ARG_SRC, 0, 0, &m.x, name);
        if (rc == TP_OK)
            rc = s_arg(self, p, wpd, DNNL_ARG_DIFF_DST, 0, 0, &m.y, name);
        if (rc == TP_OK)
            rc = s_arg(self, p, wpd, DNNL_ARG_DIFF_WEIGHTS, 1, 1, &m.w, name);
        if (rc == TP_OK && fbias)
            rc = s_arg(self, p, wpd, DNNL_ARG_DIFF_BIAS, 1, 1, &m.b, name);
        if (rc == TP_OK)
            rc = s_finish(p, wpd, name);
    }
    if (rc == TP_OK && e->ok) {
        const s_arg_t *fx = &e->pass[S_FWD].args[0], *wx = &e->pass[S_BWD_WEIGHTS].args[0];
        const s_arg_t *wdd = &e->pass[S_BWD_WEIGHTS].args[1], *ddd = &e->pass[S_BWD_DATA].args[0];
        if (!fx->same && dnnl_memory_desc_equal(&fx->md, &wx->md))
            e->keep_bytes = s_round(dnnl_memory_desc_get_size(&fx->md));
        if (!wdd->same && dnnl_memory_desc_equal(&wdd->md, &ddd->md))
            e->dd_bytes = s_round(dnnl_memory_desc_get_size(&wdd->md));
        /* oneDNN's backward-data for a handful of input channels (the
         * first layer's image: 1 or 3) pads them to a block of 16 and ran
         * 20x slower than im2col in the measurements of docs/performance.md;
         * the first layer seldom needs it (its input is the data) */
        e->data_im2col = !s_deconv(k) && k->c / k->g < 8 && self->path != TP_CPU_CONV_DNNL_PLAIN;
        if (e->data_im2col)
            e->dd_bytes = 0;
        /* a folded relu's mask and dy's reorder in one pass (s_blk16)
         * where the backward passes take dy as nChw16c (AVX-512) */
        dnnl_memory_desc_t blk16;
        const dnnl_dims_t yd = {k->n, k->o, k->oh, k->ow};
        if (k->relu && !e->own_bias && !wdd->same && k->o % 16 == 0 &&
            (e->dd_bytes || e->data_im2col) &&
            dnnl_memory_desc_init_by_tag(&blk16, 4, yd, wdd->md.data_type, dnnl_nChw16c) ==
                dnnl_success &&
            dnnl_memory_desc_equal(&blk16, &wdd->md)) {
            e->mask16 = 1;
            e->dd_bytes = s_round(dnnl_memory_desc_get_size(&wdd->md));
        }
        e->rooms = e->keep_bytes + e->dd_bytes;
        size_t most = 0;
        for (int i = 0; i < S_PASSES; i++)
            most = e->pass[i].bytes > most ? e->pass[i].bytes : most;
        e->bytes = e->rooms + most;
        /* im2col's backward-data runs past keep (tp_dnnl_conv_backward) */
        if (e->data_im2col && e->keep_bytes + tp_cpu_conv_workspace(c) > e->bytes)
            e->bytes = e->keep_bytes + tp_cpu_conv_workspace(c);
        /* an NHWC source's dx: im2col's, NCHW, past its workspace, then
         * turned NHWC (s_backward) */
        const size_t dx_nchw = s_round(tp_shape_count(&c->xshape[0]) * sizeof(float));
        if (e->data_im2col && (k->blk16 & S_X_NHWC) &&
            e->keep_bytes + s_round(tp_cpu_conv_workspace(c)) + dx_nchw > e->bytes)
            e->bytes = e->keep_bytes + s_round(tp_cpu_conv_workspace(c)) + dx_nchw;
        e->bytes += S_ALIGN; /* room to align the workspace's start */
    } else if (rc == TP_OK) {
        e->bytes = tp_cpu_conv_workspace(c); /* ops_conv.c runs it */
    }
    s_pds_free(&fpd, &dpd, &wpd);
    return rc;
}

/* The entry of c's geometry, made and listed when new. *owned 1: the cache
 * is full and the caller frees the entry after its call (a model with more
 * geometries than S_MAX_ENTRIES runs, only slower). */
static tp_status_t s_lookup(tp_dnnl_conv_t *self, const tp_op_call_t *c,
                            s_entry_t **out, int *owned) {
    s_threads();
    const s_geom_t k = s_geom(c);
    *owned = 0;
    pthread_mutex_lock(&self->mu);
    for (s_entry_t *e = self->entries; e; e = e->next)
        if (!memcmp(&e->key, &k, sizeof k)) {
            pthread_mutex_unlock(&self->mu);
            *out = e;
            return TP_OK;
        }
    s_entry_t *e = calloc(1, sizeof *e);
    tp_status_t rc = TP_OK;
    if (!e) {
        rc = tp_error(TP_ERR_NOMEM, "%s: oneDNN convolution cache entry", c->name);
    } else {
        e->key = k;
        rc = s_entry_build(self, e, c);
    }
    if (rc == TP_OK && self->count < S_MAX_ENTRIES) {
        e->next = self->entries;
        self->entries = e;
        self->count++;
    } else if (rc == TP_OK) {
        *owned = 1;
    }
    pthread_mutex_unlock(&self->mu);
    if (rc != TP_OK) {
        s_entry_free(e);
        return rc;
    }
    *out = e;
    return TP_OK;
}

/* ---- nChw16c in one pass of our own ------------------------------------------ */

/* An activation [N, C, H, W] (C a multiple of 16) between the op's plain
 * NCHW and oneDNN's nChw16c (AVX-512's blocked layout): in (plain ->
 * blocked, masked by y > 0 when y is set: a folded relu's backward, dy
 * masked as it is reordered, one pass where ops_cpu.c's mask and oneDNN's
 * reorder took two) or out (blocked -> plain, stored or added). oneDNN's
 * own reorder (jit:blk) ran a 14x14 image (196 pixels, not a multiple of
 * 16) at a quarter of a 28x28's speed per byte (docs/performance.md); this
 * one loads 16 channels x 16 pixels (the tail masked), transposes them in
 * registers and stores them. Exact copies (an add is one rounding, as
 * oneDNN's sum post-op): bit for bit oneDNN's reorder. Rows [lo, hi) of
 * the N * C/16 blocks. A bf16 pass's input (cpu_bf16.h) goes in as bf16
 * nChw16c, each value rounded as it is stored (s_bf16x16: bit for bit
 * oneDNN's reorder from f32 NCHW to bf16 nChw16c). */
typedef struct {
    const float *src, *y; /* y: the mask (in only), or NULL */
    float *dst;           /* (in, bf16: uint16_t values) */
    int bf16;             /* in only: dst is bf16 */
    size_t c, plane;      /* C, H * W */
    int out, add;         /* blocked -> plain; added to dst (out only) */
} s_blk16_t;

static void s_blk16_plain(const s_blk16_t *a, size_t lo, size_t hi) {
    const size_t cb = a->c / 16;
    for (size_t r = lo; r < hi; r++) {
        const size_t n = r / cb, b = r % cb, pl = (n * a->c + b * 16) * a->plane;
        for (size_t p = 0; p < a->plane; p++)
            for (size_t i = 0; i < 16; i++) {
                const size_t at = pl + i * a->plane + p, bl = (r * a->plane + p) * 16 + i;
                if (a->out)
                    a->dst[at] = a->add ? a->dst[at] + a->src[bl] : a->src[bl];
                else if (a->bf16)
                    ((uint16_t *)a->dst)[bl] =
                        tp_f32_to_bf16(!a->y || a->y[at] > 0.0f ? a->src[at] : 0.0f);
                else
                    a->dst[bl] = !a->y || a->y[at] > 0.0f ? a->src[at] : 0.0f;
            }
    }
}

/* GCC's optimize attribute (clang has none, and unrolls these loops at
 * -O2 by the pragmas alone) */
#if defined(__clang__)
#define S_O3
#else
#define S_O3 __attribute__((optimize("O3")))
#endif

/* t[j] = column j of the 16 x 16 floats v[0..15] (rows). The loops here
 * are unrolled whole (the pragmas): at -O2 GCC kept v and t on the stack
 * and the pass ran at half oneDNN's reorder's speed; unrolled, v and t
 * live in the 32 zmm registers and it matches or beats it. */
__attribute__((target("avx512f"))) S_O3 static inline void s_tr16(__m512 *v, __m512 *t) {
    /* lane L of t[2i], t[2i+1]: rows 2i, 2i+1 interleaved, columns
     * 4L..4L+1 and 4L+2..4L+3 */
    #pragma GCC unroll 16
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    /* lane L of v[4i + k]: rows 4i..4i+3 of column 4L + k */
    #pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        const __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d b0 = _mm512_castps_pd(t[4 * i + 2]), b1 = _mm512_castps_pd(t[4 * i + 3]);
        v[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, b0));
        v[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, b0));
        v[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, b1));
        v[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, b1));
    }
    /* column 4L + k: lane L of v[k], v[4 + k], v[8 + k], v[12 + k] */
    #pragma GCC unroll 16
    for (int k = 0; k < 4; k++) {
        const __m512 lo01 = _mm512_shuffle_f32x4(v[k], v[4 + k], 0x44);
        const __m512 hi01 = _mm512_shuffle_f32x4(v[8 + k], v[12 + k], 0x44);
        const __m512 lo23 = _mm512_shuffle_f32x4(v[k], v[4 + k], 0xee);
        const __m512 hi23 = _mm512_shuffle_f32x4(v[8 + k], v[12 + k], 0xee);
        t[k] = _mm512_shuffle_f32x4(lo01, hi01, 0x88);
        t[4 + k] = _mm512_shuffle_f32x4(lo01, hi01, 0xdd);
        t[8 + k] = _mm512_shuffle_f32x4(lo23, hi23, 0x88);
        t[12 + k] = _mm512_shuffle_f32x4(lo23, hi23, 0xdd);
    }
}

/* v's 16 floats rounded to bf16 as tp_f32_to_bf16 (to nearest even,
 * NaNs kept NaNs), in AVX-512F alone (the passes' target; the CPU's own
 * conversion, AVX512_BF16, is not everywhere they run) */
__attribute__((target("avx512f"))) S_O3 static inline __m256i s_bf16x16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v), top = _mm512_srli_epi32(u, 16);
    const __m512i odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_or_epi32(r, nan, top, _mm512_set1_epi32(0x40)));
}

__attribute__((target("avx512f"))) S_O3 static void s_blk16_avx512(const s_blk16_t *a, size_t lo,
                                                              size_t hi) {
    const size_t cb = a->c / 16, plane = a->plane;
    const __m512 zero = _mm512_setzero_ps();
    for (size_t r = lo; r < hi; r++) {
        const size_t n = r / cb, b = r % cb, pl = (n * a->c + b * 16) * plane;
        const size_t bl = r * plane * 16;
        for (size_t p = 0; p < plane; p += 16) {
            const size_t left = plane - p < 16 ? plane - p : 16;
            const __mmask16 lm = (__mmask16)((1u << left) - 1u);
            __m512 v[16], t[16];
            if (!a->out) {
                #pragma GCC unroll 16
                for (int i = 0; i < 16; i++) {
                    const float *at = a->src + pl + (size_t)i * plane + p;
                    v[i] = _mm512_maskz_loadu_ps(lm, at);
                    if (a->y) {
                        const __m512 yv = _mm512_maskz_loadu_ps(lm, a->y + pl + (size_t)i * plane + p);
                        v[i] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(yv, zero, _CMP_GT_OQ), v[i]);
                    }
                }
                s_tr16(v, t);
                #pragma GCC unroll 16
                for (size_t j = 0; j < 16; j++)
                    if (j < left && a->bf16)
                        _mm256_storeu_si256((__m256i *)((uint16_t *)a->dst + bl + (p + j) * 16),
                                            s_bf16x16(t[j]));
                    else if (j < left) /* j a constant: t stays in registers */
                        _mm512_storeu_ps(a->dst + bl + (p + j) * 16, t[j]);
            } else {
                #pragma GCC unroll 16
                for (size_t j = 0; j < 16; j++)
                    v[j] = j < left ? _mm512_loadu_ps(a->src + bl + (p + j) * 16) : zero;
                s_tr16(v, t);
                #pragma GCC unroll 16
                for (int i = 0; i < 16; i++) {
                    float *at = a->dst + pl + (size_t)i * plane + p;
                    if (a->add)
                        t[i] = _mm512_add_ps(_mm512_maskz_loadu_ps(lm, at), t[i]);
                    _mm512_mask_storeu_ps(at, lm, t[i]);
                }
            }
        }
    }
}

/* TP_CPU_BLK16=plain: the plain loops (the tests compare the two; read
 * on each call, a few hundred ns beside a pass over megabytes, so that a
 * test can switch) */
static int s_blk16_use512(void) {
    const char *e = getenv("TP_CPU_BLK16");
    return !(e && !strcmp(e, "plain")) && __builtin_cpu_supports("avx512f");
}

static void s_blk16_range(void *arg, size_t lo, size_t hi) {
    if (s_blk16_use512())
        s_blk16_avx512(arg, lo, hi);
    else
        s_blk16_plain(arg, lo, hi);
}

/* TP_CPU_BLK16=dnnl: oneDNN's reorders at the op's edges, not s_blk16
 * (to measure the two in one binary; read on each call as above) */
static int s_blk16_own(void) {
    const char *e = getenv("TP_CPU_BLK16");
    return !(e && !strcmp(e, "dnnl"));
}

/* dims [n, c, h, w] (c % 16 == 0) from src to dst, as s_blk16_t says */
static void s_blk16(const int64_t *dims, const float *src, const float *y, void *dst,
                    int bf16, int out, int add) {
    s_blk16_t a = {src, y, dst, bf16, (size_t)dims[1], (size_t)dims[2] * (size_t)dims[3],
                   out, add};
    const size_t rows = (size_t)dims[0] * (a.c / 16);
    /* parts of 16K floats or more, as s_bias_act's */
    const size_t per = a.plane * 16, min = per >= 16384 ? 1 : 16384 / (per ? per : 1);
    tp_cpu_parallel(rows, 1, min, s_blk16_range, &a);
}

/* md is user's (plain NCHW) in nChw16c (f32, or bf16: a bf16 pass's
 * input), no channel padding: s_blk16's */
static int s_is_blk16(const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *md) {
    dnnl_memory_desc_t b16;
    return user->ndims == 4 && user->dims[1] % 16 == 0 &&
           (md->data_type == dnnl_f32 || md->data_type == dnnl_bf16) &&
           dnnl_memory_desc_init_by_tag(&b16, 4, user->dims, md->data_type, dnnl_nChw16c) ==
               dnnl_success &&
           dnnl_memory_desc_equal(&b16, md) &&
           dnnl_memory_desc_init_by_tag(&b16, 4, user->dims, dnnl_f32, dnnl_nchw) ==
               dnnl_success &&
           dnnl_memory_desc_equal(&b16, user);
}

/* ---- NHWC in: a folded transpose's pass ------------------------------------ */

/* An image [N, H, W, C] into [N, C, H, W], the layout oneDNN 2.6's
 * convolutions take a few-channel source in (its kernels for an NHWC
 * source of 3 channels are the reference loops, 100x slower). oneDNN's
 * own reorder (jit:uni, acdb -> abcd) took 1.1 ms for 16x112x112x3, about
 * twice the graph's transpose; this one deinterleaves 16 pixels of 3
 * channels in registers (AVX-512), other channel counts plainly. Exact
 * copies. Images [lo, hi). */
typedef struct {
    const float *src;
    float *dst;
    size_t c, plane; /* C, H * W */
} s_nhwc_t;

static void s_nhwc_plain(const s_nhwc_t *a, size_t i, size_t p0) {
    const float *src = a->src + i * a->plane * a->c;
    float *dst = a->dst + i * a->plane * a->c;
    for (size_t p = p0; p < a->plane; p++)
        for (size_t c = 0; c < a->c; c++)
            dst[c * a->plane + p] = src[p * a->c + c];
}

/* pixels [0, plane & ~15) of image i, 3 channels: pixel p's channel k is
 * element 3p + k of the 48 floats v0 v1 v2 of 16 pixels */
__attribute__((target("avx512f"))) static void s_nhwc3_avx512(const s_nhwc_t *a, size_t i) {
    const float *src = a->src + i * a->plane * 3;
    float *dst = a->dst + i * a->plane * 3;
    __m512i lo[3], hi[3];
    for (int k = 0; k < 3; k++) {
        int32_t l[16], h[16];
        for (int p = 0; p < 16; p++) {
            const int at = 3 * p + k;
            l[p] = at < 32 ? at : 0;               /* from v0 (0-15), v1 (16-31) */
            h[p] = at < 32 ? p : 16 + (at - 32);   /* kept, or from v2 */
        }
        lo[k] = _mm512_loadu_si512(l);
        hi[k] = _mm512_loadu_si512(h);
    }
    for (size_t p = 0; p + 16 <= a->plane; p += 16) {
        const float *s = src + 3 * p;
        const __m512 v0 = _mm512_loadu_ps(s), v1 = _mm512_loadu_ps(s + 16);
        const __m512 v2 = _mm512_loadu_ps(s + 32);
        for (int k = 0; k < 3; k++) {
            const __m512 t = _mm512_permutex2var_ps(v0, lo[k], v1);
            _mm512_storeu_ps(dst + (size_t)k * a->plane + p,
                             _mm512_permutex2var_ps(t, hi[k], v2));
        }
    }
}

static void s_nhwc_range(void *arg, size_t lo, size_t hi) {
    const s_nhwc_t *a = arg;
    const int v3 = a->c == 3 && __builtin_cpu_supports("avx512f");
    for (size_t i = lo; i < hi; i++) {
        if (v3)
            s_nhwc3_avx512(a, i);
        s_nhwc_plain(a, i, v3 ? a->plane & ~(size_t)15 : 0);
    }
}

/* dims [n, c, h, w]: src NHWC -> dst NCHW */
static void s_nhwc(const int64_t *dims, const float *src, float *dst) {
    s_nhwc_t a = {src, dst, (size_t)dims[1], (size_t)dims[2] * (size_t)dims[3]};
    const size_t per = a.plane * a.c, min = per >= 16384 ? 1 : 16384 / (per ? per : 1);
    tp_cpu_parallel((size_t)dims[0], 1, min, s_nhwc_range, &a);
}

/* dx [N, C, H, W] (NCHW, at src) into dst NHWC, stored or added: a
 * few-channel image's gradient from im2col's backward-data (rare: a
 * saliency map), plain loops */
static void s_nchw_out(const tp_shape_t *x, const float *src, float *dst, int add) {
    const size_t n = (size_t)x->d[0], c = (size_t)x->d[1];
    const size_t plane = (size_t)x->d[2] * (size_t)x->d[3];
    for (size_t i = 0; i < n; i++) {
        const float *s = src + i * c * plane;
        float *d = dst + i * c * plane;
        for (size_t p = 0; p < plane; p++)
            for (size_t k = 0; k < c; k++)
                d[p * c + k] = add ? d[p * c + k] + s[k * plane + p] : s[k * plane + p];
    }
}

/* user is NHWC and md the same tensor plain NCHW (no padding): s_nhwc's */
static int s_is_nhwc(const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *md) {
    dnnl_memory_desc_t t;
    return user->ndims == 4 &&
           dnnl_memory_desc_init_by_tag(&t, 4, user->dims, dnnl_f32, dnnl_nhwc) ==
               dnnl_success &&
           dnnl_memory_desc_equal(&t, user) &&
           dnnl_memory_desc_init_by_tag(&t, 4, user->dims, dnnl_f32, dnnl_nchw) ==
               dnnl_success &&
           dnnl_memory_desc_equal(&t, md);
}

/* ---- blocked weights in one pass of our own --------------------------------- */

/* Weights [O, I, KH, KW] (O and I multiples of 16) between the op's plain
 * OIHW and oneDNN's blocked layouts on AVX-512, in 16 x 16 blocks of
 * (output, input) per kernel tap: ABcd16b16a (the direct forward's and
 * every backward-weights' gradient: the outputs innermost) and ABcd16a16b
 * (the direct backward-data's: the inputs innermost). A convolution
 * reorders its weights at every call, in for the forward and the
 * backward-data and its gradient out, because the optimizer updates them
 * plain; oneDNN's reorder (jit:uni) took 2.0 ms into ABcd16b16a and 2.1 ms
 * out of it (added) on each of ResNet-18's 512 x 512 x 3 x 3 (9.4 MB):
 * 23 ms of the 112 px step, 7%, most of it on stage 4, whose weights are
 * 18x its activations at batch 16 (docs/history.md, "The ResNet-18
 * step per layer"). This pass takes a tile of 16 outputs x 16 inputs (16
 * rows of 16 * KH * KW contiguous floats: 9 KB for 3x3) and transposes
 * it 16 x 16 in registers (s_tr16). Exact copies, an add one rounding as
 * oneDNN's sum post-op: bit for bit oneDNN's reorder. Tiles [lo, hi) of
 * the O/16 x I/16. */
typedef struct {
    const float *src;
    float *dst;
    size_t ib, hw;  /* I / 16, KH * KW */
    int io;         /* ABcd16a16b (in only); else ABcd16b16a */
    int out, add;   /* blocked -> plain; added to dst (out only) */
} s_wblk_t;

static void s_wblk_plain(const s_wblk_t *a, size_t lo, size_t hi) {
    const size_t hw = a->hw, row = a->ib * 16 * hw;
    for (size_t r = lo; r < hi; r++) {
        const size_t pl = (r / a->ib) * 16 * row + (r % a->ib) * 16 * hw, bl = r * hw * 256;
        for (size_t o = 0; o < 16; o++)
            for (size_t i = 0; i < 16; i++)
                for (size_t s = 0; s < hw; s++) {
                    const size_t at = pl + o * row + i * hw + s;
                    const size_t b = bl + (s * 16 + (a->io ? o : i)) * 16 + (a->io ? i : o);
                    if (a->out)
                        a->dst[at] = a->add ? a->dst[at] + a->src[b] : a->src[b];
                    else
                        a->dst[b] = a->src[at];
                }
    }
}

__attribute__((target("avx512f"))) S_O3 static void s_wblk_avx512(const s_wblk_t *a, size_t lo,
                                                             size_t hi) {
    const size_t hw = a->hw, row = a->ib * 16 * hw;
    for (size_t r = lo; r < hi; r++) {
        const size_t pl = (r / a->ib) * 16 * row + (r % a->ib) * 16 * hw, bl = r * hw * 256;
        __m512 v[16], t[16];
        if (a->io) {
            /* output o's [16 inputs][hw] -> [hw][16 inputs], 16 taps a time */
            for (size_t o = 0; o < 16; o++)
                for (size_t p = 0; p < hw; p += 16) {
                    const size_t left = hw - p < 16 ? hw - p : 16;
                    const __mmask16 lm = (__mmask16)((1u << left) - 1u);
                    #pragma GCC unroll 16
                    for (int i = 0; i < 16; i++)
                        v[i] = _mm512_maskz_loadu_ps(lm, a->src + pl + o * row + (size_t)i * hw + p);
                    s_tr16(v, t);
                    #pragma GCC unroll 16
                    for (size_t j = 0; j < 16; j++)
                        if (j < left)
                            _mm512_storeu_ps(a->dst + bl + ((p + j) * 16 + o) * 16, t[j]);
                }
            continue;
        }
        /* the tile as 16 rows (outputs) of 16 * hw columns k = input * hw +
         * tap; column k is 16 outputs at block row tap * 16 + input */
        for (size_t k0 = 0; k0 < 16 * hw; k0 += 16) {
            if (!a->out) {
                #pragma GCC unroll 16
                for (int o = 0; o < 16; o++)
                    v[o] = _mm512_loadu_ps(a->src + pl + (size_t)o * row + k0);
                s_tr16(v, t);
                #pragma GCC unroll 16
                for (size_t j = 0; j < 16; j++) {
                    const size_t k = k0 + j;
                    _mm512_storeu_ps(a->dst + bl + ((k % hw) * 16 + k / hw) * 16, t[j]);
                }
            } else {
                #pragma GCC unroll 16
                for (size_t j = 0; j < 16; j++) {
                    const size_t k = k0 + j;
                    v[j] = _mm512_loadu_ps(a->src + bl + ((k % hw) * 16 + k / hw) * 16);
                }
                s_tr16(v, t);
                #pragma GCC unroll 16
                for (int o = 0; o < 16; o++) {
                    float *at = a->dst + pl + (size_t)o * row + k0;
                    if (a->add)
                        t[o] = _mm512_add_ps(_mm512_loadu_ps(at), t[o]);
                    _mm512_storeu_ps(at, t[o]);
                }
            }
        }
    }
}

static void s_wblk_range(void *arg, size_t lo, size_t hi) {
    if (s_blk16_use512())
        s_wblk_avx512(arg, lo, hi);
    else
        s_wblk_plain(arg, lo, hi);
}

/* dims [o, i, kh, kw] from src to dst, as s_wblk_t says */
static void s_wblk(const int64_t *dims, const float *src, float *dst, int io, int out,
                   int add) {
    s_wblk_t a = {src, dst, (size_t)dims[1] / 16, (size_t)dims[2] * (size_t)dims[3], io,
                  out, add};
    const size_t per = a.hw * 256, min = per >= 16384 ? 1 : 16384 / per;
    tp_cpu_parallel((size_t)dims[0] / 16 * a.ib, 1, min, s_wblk_range, &a);
}

/* user is plain OIHW weights (O and I multiples of 16) and md the same in
 * ABcd16b16a (1) or ABcd16a16b (2, an input's layout only): s_wblk's;
 * else 0 */
static int s_is_wblk(const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *md, int out) {
    dnnl_memory_desc_t t;
    if (user->ndims != 4 || user->dims[0] % 16 || user->dims[1] % 16 ||
        dnnl_memory_desc_init_by_tag(&t, 4, user->dims, dnnl_f32, dnnl_abcd) != dnnl_success ||
        !dnnl_memory_desc_equal(&t, user))
        return 0;
    if (dnnl_memory_desc_init_by_tag(&t, 4, user->dims, dnnl_f32, dnnl_ABcd16b16a) ==
            dnnl_success && dnnl_memory_desc_equal(&t, md))
        return 1;
    if (!out && dnnl_memory_desc_init_by_tag(&t, 4, user->dims, dnnl_f32, dnnl_ABcd16a16b) ==
            dnnl_success && dnnl_memory_desc_equal(&t, md))
        return 2;
    return 0;
}

/* ---- an output added in its own layout ------------------------------------- */

/* dst += src over n floats: a gradient added to (dx_acc) whose layout is
 * already the primitive's (a blocked chain's dx at a block's input, which
 * the shortcut's or the skip's gradient reached first). oneDNN's reorder
 * with a sum post-op between two equal layouts is its generic one
 * (simple:any, one element at a time): 0.2 ms for ResNet-18's 16 x 64 x
 * 28 x 28, where this vector loop streams. One rounding, as the sum
 * post-op's: bit for bit. Floats [lo, hi). */
typedef struct {
    const float *src;
    float *dst;
} s_add_t;

S_O3 static void s_add_range(void *arg, size_t lo, size_t hi) {
    const s_add_t *a = arg;
    const float *restrict src = a->src;
    float *restrict dst = a->dst;
    for (size_t i = lo; i < hi; i++)
        dst[i] += src[i];
}

static void s_add(const float *src, float *dst, size_t n) {
    s_add_t a = {src, dst};
    tp_cpu_parallel(n, 16, 16384, s_add_range, &a);
}

/* ---- bf16 in the op's own layout ------------------------------------------- */

/* dst[i] = src[i] rounded to bf16 (tp_cpu_f32_to_bf16) over the backend's
 * threads: a bf16 pass's input whose layout is already the primitive's
 * (a blocked chain's nChw16c x or dy). Floats [lo, hi). */
typedef struct {
    const float *src;
    uint16_t *dst;
} s_to_bf16_t;

static void s_to_bf16_range(void *arg, size_t lo, size_t hi) {
    const s_to_bf16_t *a = arg;
    tp_cpu_f32_to_bf16(a->dst + lo, a->src + lo, hi - lo);
}

static void s_to_bf16(const float *src, uint16_t *dst, size_t n) {
    s_to_bf16_t a = {src, dst};
    tp_cpu_parallel(n, 32, 16384, s_to_bf16_range, &a);
}

/* ---- running a pass -------------------------------------------------------- */

/* Runs pass p with its rooms at `rooms`: user[i] is argument i's buffer in
 * the op's plain layout (an output's NULL: not wanted), acc[i] 1 adds an
 * output into it. An input whose blk[i] is set runs from that buffer in the
 * primitive's layout: filled by the reorder first, unless ready[i] says it
 * holds the data already. */
static tp_status_t s_run(const tp_dnnl_conv_t *self, const s_pass_t *p, char *rooms,
                         void *const user[], void *const blk[], const int ready[],
                         const int acc[], const char *name) {
    dnnl_stream_t stream = NULL;
    dnnl_memory_t mem[2 * S_MAX_ARGS + 1] = {0};
    int nmem = 0;
    dnnl_exec_arg_t args[S_MAX_ARGS + 1];
    void *room[S_MAX_ARGS] = {0}; /* argument i's buffer in md's layout */
    int nargs = 0;
    tp_status_t rc = TP_OK;
    dnnl_status_t st = dnnl_stream_create(&stream, self->engine, dnnl_stream_default_flags);
#define S_CALL(expr)                                                           \
    do {                                                                       \
        if (st == dnnl_success) {                                              \
            st = (expr);                                                       \
            if (st != dnnl_success && rc == TP_OK)                             \
                rc = s_fail(st, #expr, name, __FILE__, __LINE__);              \
        }                                                                      \
    } while (0)
    if (st != dnnl_success)
        rc = s_fail(st, "dnnl_stream_create", name, __FILE__, __LINE__);
    /* the primitive's memory: the user's buffer, or a room (reordered in) */
    for (int i = 0; i < p->nargs && st == dnnl_success; i++) {
        const s_arg_t *a = &p->args[i];
        /* an output goes straight to the user's buffer when it is wanted,
         * stored (not added) and in the primitive's layout */
        const int direct = a->out ? user[i] && a->same && !acc[i] : a->same;
        void *at = direct ? user[i] : (!a->out && blk[i]) ? blk[i] : rooms + a->off;
        room[i] = at;
        dnnl_memory_t m = NULL;
        S_CALL(dnnl_memory_create(&m, &a->md, self->engine, at));
        if (st != dnnl_success)
            break;
        mem[nmem++] = m;
        args[nargs++] = (dnnl_exec_arg_t){a->arg, m};
        if (!a->out && a->in && !(blk[i] && ready[i]) && a->bf16) {
            s_to_bf16(user[i], at, dnnl_memory_desc_get_size(&a->md) / 2);
        } else if (!a->out && a->in && !(blk[i] && ready[i]) && a->blk16 && s_blk16_own()) {
            s_blk16(a->user.dims, user[i], NULL, at, a->md.data_type == dnnl_bf16, 0, 0);
        } else if (!a->out && a->in && !(blk[i] && ready[i]) && a->nhwc) {
            s_nhwc(a->user.dims, user[i], at);
        } else if (!a->out && a->in && !(blk[i] && ready[i]) && a->wblk && s_blk16_own()) {
            s_wblk(a->user.dims, user[i], at, a->wblk == 2, 0, 0);
        } else if (!a->out && a->in && !(blk[i] && ready[i])) {
            dnnl_memory_t u = NULL;
            S_CALL(dnnl_memory_create(&u, &a->user, self->engine, user[i]));
            if (st != dnnl_success)
                break;
            mem[nmem++] = u;
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, u}, {DNNL_ARG_TO, m}};
            S_CALL(dnnl_primitive_execute(a->in, stream, 2, ra));
        }
    }
    if (p->scratch_bytes && st == dnnl_success) {
        dnnl_memory_t m = NULL;
        S_CALL(dnnl_memory_create(&m, &p->scratch, self->engine, rooms));
        if (m) {
            mem[nmem++] = m;
            args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m};
        }
    }
    S_CALL(dnnl_primitive_execute(p->prim, stream, nargs, args));
    /* outputs kept in their room go out to the user's buffer (args[i] is
     * argument i's memory: the scratchpad comes last) */
    for (int i = 0; i < p->nargs && st == dnnl_success; i++) {
        const s_arg_t *a = &p->args[i];
        if (!a->out || !user[i] || (a->same && !acc[i]))
            continue;
        if (a->blk16 && s_blk16_own()) {
            s_blk16(a->user.dims, room[i], NULL, user[i], 0, 1, acc[i]);
            continue;
        }
        if (a->wblk && s_blk16_own()) {
            s_wblk(a->user.dims, room[i], user[i], 0, 1, acc[i]);
            continue;
        }
        if (a->same && s_blk16_own()) { /* added (a stored one went straight) */
            s_add(room[i], user[i], dnnl_memory_desc_get_size(&a->md) / sizeof(float));
            continue;
        }
        dnnl_memory_t u = NULL;
        S_CALL(dnnl_memory_create(&u, &a->user, self->engine, user[i]));
        if (st != dnnl_success)
            break;
        mem[nmem++] = u;
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, args[i].memory}, {DNNL_ARG_TO, u}};
        S_CALL(dnnl_primitive_execute(a->put[acc[i] ? 1 : 0], stream, 2, ra));
    }
    if (stream) {
        S_CALL(dnnl_stream_wait(stream));
        dnnl_stream_destroy(stream);
    }
#undef S_CALL
    for (int i = 0; i < nmem; i++)
        dnnl_memory_destroy(mem[i]);
    return rc;
}

/* The call's workspace, aligned, when it has the entry's bytes; else one
 * made for this call (*own: the caller frees it), for a shape the plan did
 * not see; a forward's kept x does not outlive it then. */
static tp_status_t s_ws(const s_entry_t *e, const tp_op_call_t *c, char **base, char **own) {
    char *ws = c->workspace;
    *own = NULL;
    if (!ws || c->workspace_bytes < e->bytes) {
        *own = malloc(e->bytes);
        if (!*own)
            return tp_error(TP_ERR_NOMEM, "%s: %zu bytes of oneDNN workspace", c->name,
                            e->bytes);
        ws = *own;
    }
    *base = (char *)(((uintptr_t)ws + S_ALIGN - 1) & ~(uintptr_t)(S_ALIGN - 1));
    return TP_OK;
}

/* db[o] (+)= the sum of dy over batch and pixels: the bias gradient when
 * the filter's is not wanted (the backward-weights primitive makes both). */
static void s_bias_grad(const s_geom_t *k, const float *dy, float *db, int acc) {
    const size_t p = (size_t)(k->oh * k->ow);
    enum { L = 16 }; /* lanes: independent float sums the compiler vectorises */
    if (k->blk16 & 2) { /* dy nChw16c: channel o is lane o % 16 of block o / 16 */
        const size_t cb = (size_t)k->o / 16;
        for (size_t b16 = 0; b16 < cb; b16++) {
            double s[L] = {0};
            for (int64_t b = 0; b < k->n; b++) {
                const float *r = dy + ((size_t)b * cb + b16) * p * L;
                float lane[L] = {0};
                for (size_t i = 0; i < p; i++)
                    for (int j = 0; j < L; j++)
                        lane[j] += r[i * L + j];
                for (int j = 0; j < L; j++)
                    s[j] += lane[j];
            }
            for (int j = 0; j < L; j++) {
                float *d = db + b16 * L + (size_t)j;
                *d = acc ? *d + (float)s[j] : (float)s[j];
            }
        }
        return;
    }
    for (int64_t o = 0; o < k->o; o++) {
        double s = 0.0;
        for (int64_t b = 0; b < k->n; b++) {
            const float *r = dy + ((size_t)b * (size_t)k->o + (size_t)o) * p;
            float lane[L] = {0};
            size_t i = 0;
            for (; i + L <= p; i += L)
                for (int j = 0; j < L; j++)
                    lane[j] += r[i + j];
            for (; i < p; i++)
                lane[i % L] += r[i];
            /* a plane's partial sums (a few hundred floats) in double */
            for (int j = 0; j < L; j++)
                s += lane[j];
        }
        db[o] = acc ? db[o] + (float)s : (float)s;
    }
}

/* ---- the cache's interface ---------------------------------------------------- */

tp_dnnl_conv_t *tp_dnnl_conv_new(tp_cpu_conv_path_t path) {
    tp_dnnl_conv_t *self = calloc(1, sizeof *self);
    if (!self) {
        tp_error(TP_ERR_NOMEM, "oneDNN convolution cache");
        return NULL;
    }
    self->path = path;
    const char *alg = getenv("TP_CPU_CONV_ALG");
    if (!alg || !*alg || !strcmp(alg, "auto")) {
        self->alg = S_ALG_AUTO;
    } else if (!strcmp(alg, "direct")) {
        self->alg = S_ALG_DIRECT;
    } else if (!strcmp(alg, "winograd")) {
        self->alg = S_ALG_WINOGRAD;
    } else if (!strcmp(alg, "onednn")) {
        self->alg = S_ALG_ONEDNN;
    } else if (!strcmp(alg, "f2x2")) {
        self->alg = S_ALG_F2;
    } else if (!strcmp(alg, "f4x4")) {
        self->alg = S_ALG_F4;
    } else {
        tp_error(TP_ERR_INVALID,
                 "TP_CPU_CONV_ALG=%s: expected auto, direct, winograd, onednn, f2x2 or f4x4",
                 alg);
        free(self);
        return NULL;
    }
    dnnl_status_t st = dnnl_engine_create(&self->engine, dnnl_cpu, 0);
    if (st != dnnl_success) {
        s_fail(st, "dnnl_engine_create(cpu)", "CPU backend", __FILE__, __LINE__);
        free(self);
        return NULL;
    }
    pthread_mutex_init(&self->mu, NULL);
    /* libgomp's idle threads spin (OMP_WAIT_POLICY unset: up to 300,000
     * rounds) after each parallel region, taking a core from the tower's
     * own thread and OpenBLAS's; libgomp reads the policy when it loads,
     * before any code of ours runs, so it can only be said here */
    if (tp_cpu_threads() > 1 && !getenv("OMP_WAIT_POLICY") &&
        !getenv("GOMP_SPINCOUNT")) {
        static atomic_int said;
        if (!atomic_exchange(&said, 1))
            TP_INFO("CPU backend: %d threads; the OpenMP team's idle threads spin "
                    "between ops: on a loaded machine OMP_WAIT_POLICY=passive in the "
                    "environment gives the cores back at once (docs/tuning.md)",
                    tp_cpu_threads());
    }
    return self;
}

void tp_dnnl_conv_destroy(tp_dnnl_conv_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_dnnl_conv_t *self = *self_p;
    for (s_entry_t *e = self->entries, *next; e; e = next) {
        next = e->next;
        s_entry_free(e);
    }
    dnnl_engine_destroy(self->engine);
    pthread_mutex_destroy(&self->mu);
    free(self);
    *self_p = NULL;
}

int tp_dnnl_conv_nchw16c(const tp_dnnl_conv_t *self) {
    return self->path == TP_CPU_CONV_DNNL && __builtin_cpu_supports("avx512f");
}

int tp_dnnl_conv_cached(tp_dnnl_conv_t *self) {
    pthread_mutex_lock(&self->mu);
    int n = self->count;
    pthread_mutex_unlock(&self->mu);
    return n;
}

size_t tp_dnnl_conv_workspace(tp_dnnl_conv_t *self, const tp_op_call_t *c) {
    if (c->kind != TP_OP_CONV2D && c->kind != TP_OP_CONV_TRANSPOSE)
        return tp_cpu_conv_workspace(c);
    if (tp_conv_thin_ok(c)) /* one input or output channel: conv_thin.c */
        return 0;
    s_entry_t *e;
    int owned;
    if (s_lookup(self, c, &e, &owned) != TP_OK) {
        /* planning cannot fail here: the run's own call reports it */
        tp_clear_error();
        return tp_cpu_conv_workspace(c);
    }
    const size_t bytes = e->bytes;
    if (owned)
        s_entry_free(e);
    return bytes;
}

/* A call with nChw16c operands where ops_conv.c or our own bias pass would
 * run (a transposed conv, a geometry oneDNN lacks, im2col's backward-data):
 * they read NCHW; the graph's plan (fold.c) keeps such calls plain. */
static tp_status_t s_blk16_refuse(const tp_op_call_t *c) {
    return tp_error(TP_ERR_UNSUPPORTED,
                    "%s: a convolution with nChw16c operands that oneDNN does not "
                    "run on them (dnnl_conv.c); TP_BLK16_CHAIN=0 keeps them NCHW",
                    c->name);
}

/* A call with NHWC x (a folded transpose) where ops_conv.c or our own
 * bias pass would run: they read NCHW; tp_dnnl_conv_nhwc said no to such
 * calls when the graph was planned, so only a run at another shape than
 * the plan's meets this. */
static tp_status_t s_nhwc_refuse(const tp_op_call_t *c) {
    return tp_error(TP_ERR_UNSUPPORTED,
                    "%s: a convolution with NHWC input (a folded transpose) that "
                    "oneDNN does not run at this shape (dnnl_conv.c); TP_NHWC_FOLD=0 "
                    "keeps the transpose",
                    c->name);
}

int tp_dnnl_conv_nhwc(tp_dnnl_conv_t *self, const tp_op_call_t *c) {
    if (c->kind != TP_OP_CONV2D || !c->nhwc || c->xshape[0].ndim != 4)
        return 0;
    if (tp_conv_thin_ok(c))
        return 1; /* one input channel: its NHWC is NCHW's memory */
    s_entry_t *e;
    int owned;
    if (s_lookup(self, c, &e, &owned) != TP_OK) {
        tp_clear_error(); /* no fold: the transpose runs */
        return 0;
    }
    /* oneDNN's three passes (x reordered from NHWC where they run on
     * another layout; a few-channel image's dx by im2col, NCHW, then
     * turned NHWC) */
    const int ok = e->ok && !e->own_bias;
    if (owned)
        s_entry_free(e);
    return ok;
}

/* y = max(y, 0): a folded relu that the primitive did not apply. */
static void s_relu(const tp_op_call_t *c) {
    float *restrict y = c->y;
    for (size_t i = 0, n = tp_shape_count(&c->yshape); i < n; i++)
        y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

/* y[n, o, :] = act(y[n, o, :] + b[o]) on the plain NCHW output (b NULL:
 * no bias; relu 0: identity): the bias and folded relu of a primitive
 * built without them (e->own_bias). One pass, the planes split over the
 * backend's threads (tp_cpu_parallel's ranges), each a vector loop. */
typedef struct {
    const float *b;
    float *y;
    int64_t o;
    size_t plane;
    int relu;
} s_bias_act_t;

static void s_bias_act_range(void *arg, size_t lo, size_t hi) {
    const s_bias_act_t *a = arg;
    for (size_t r = lo; r < hi; r++) {
        const float bv = a->b ? a->b[r % (size_t)a->o] : 0.0f;
        float *restrict y = a->y + r * a->plane;
        if (a->relu)
            for (size_t i = 0; i < a->plane; i++) {
                const float v = y[i] + bv;
                y[i] = v > 0.0f ? v : 0.0f;
            }
        else
            for (size_t i = 0; i < a->plane; i++)
                y[i] += bv;
    }
}

static void s_bias_act(const s_geom_t *k, const float *b, float *y, int relu) {
    if (!b && !relu)
        return;
    s_bias_act_t a = {b, y, k->o, (size_t)(k->oh * k->ow), relu};
    /* parts of 16K floats or more: smaller ones cost more to hand out */
    const size_t min = a.plane >= 16384 ? 1 : 16384 / (a.plane ? a.plane : 1);
    tp_cpu_parallel((size_t)(k->n * k->o), 1, min, s_bias_act_range, &a);
}

/* ---- Winograd F(2x2, 3x3) and F(4x4, 3x3) of our own: the passes
 * (cpu_winograd.c) ----------------------------------------------------- */

/* The forward: U of the weights and V of x into the workspace (kept there
 * for the backward of the same step; F(4x4) keeps V alone and makes U in
 * blocks inside each pass, U's room theirs), then the products and y. */
static tp_status_t s_f2_forward(const s_entry_t *e, const tp_op_call_t *c) {
    char *base = NULL, *own = NULL;
    TP_TRY(s_ws(e, c, &base, &own));
    const tp_wino_t g = s_f2_geom(e);
    s_f2_rooms_t r;
    s_f2_bytes(e, &r, base);
    tp_wino_weights(&g, c->x[1], r.u);
    tp_wino_input(&g, c->x[0], r.v);
    *r.state = S_F2_U;
    const tp_status_t rc = tp_wino_forward(&g, r.v, r.u, c->x[1],
                                           e->key.bias ? c->x[2] : NULL, (int)e->key.relu,
                                           r.m, c->y, c->name);
    free(own);
    return rc;
}

/* The backward: dM of dy once for both passes; the backward-data on the
 * forward's U, then the backward-weights on its V, writing dU over U.
 * Outside the planned workspace (a call the plan did not see) nothing is
 * kept: U and V are made again from the call's inputs. */
static tp_status_t s_f2_backward(const s_entry_t *e, const tp_op_call_t *c) {
    char *base = NULL, *own = NULL;
    TP_TRY(s_ws(e, c, &base, &own));
    const tp_wino_t g = s_f2_geom(e);
    s_f2_rooms_t r;
    s_f2_bytes(e, &r, base);
    float *db = c->ninputs > 2 ? c->dx[2] : NULL;
    tp_status_t rc = TP_OK;
    if (db)
        s_bias_grad(&e->key, c->dy, db, c->dx_acc[2]);
    if (c->dx[0] || c->dx[1])
        tp_wino_grad_output(&g, c->dy, r.m);
    if (c->dx[0]) {
        if (own || *r.state != S_F2_U) {
            tp_wino_weights(&g, c->x[1], r.u);
            *r.state = S_F2_U;
        }
        rc = tp_wino_backward_data(&g, r.m, r.u, c->x[1], r.dv, c->dx[0], c->dx_acc[0],
                                   c->name);
    }
    if (rc == TP_OK && c->dx[1]) {
        if (own)
            tp_wino_input(&g, c->x[0], r.v);
        *r.state = 0;
        rc = tp_wino_backward_weights(&g, r.m, r.v, r.u, c->dx[1], c->dx_acc[1], c->name);
    }
    free(own);
    return rc;
}

tp_status_t tp_dnnl_conv_forward(tp_dnnl_conv_t *self, const tp_op_call_t *c) {
    const int relu = c->attr->act == TP_ACT_RELU;
    if (c->kind != TP_OP_CONV2D && c->kind != TP_OP_CONV_TRANSPOSE) {
        TP_TRY(tp_cpu_conv_forward(c));
        if (relu)
            s_relu(c);
        return TP_OK;
    }
    if (tp_conv_thin_ok(c))
        return tp_conv_thin_forward(c);
    s_entry_t *e;
    int owned;
    TP_TRY(s_lookup(self, c, &e, &owned));
    tp_status_t rc;
    char *base = NULL, *own = NULL;
    if (c->blk16 && (!e->ok || e->own_bias)) {
        rc = s_blk16_refuse(c);
    } else if (c->nhwc && (!e->ok || e->own_bias)) {
        rc = s_nhwc_refuse(c);
    } else if (!e->ok) {
        rc = tp_cpu_conv_forward(c);
        if (rc == TP_OK && relu)
            s_relu(c);
    } else if (e->f2) {
        rc = s_f2_forward(e, c);
    } else if ((rc = s_ws(e, c, &base, &own)) == TP_OK) {
        void *user[S_MAX_ARGS] = {(void *)c->x[0], (void *)c->x[1]};
        void *blk[S_MAX_ARGS] = {e->keep_bytes ? base : NULL};
        int ready[S_MAX_ARGS] = {0}, acc[S_MAX_ARGS] = {0};
        const int pbias = e->key.bias && !e->own_bias; /* the primitive's */
        user[pbias ? 3 : 2] = c->y;
        if (pbias)
            user[2] = (void *)c->x[2];
        rc = s_run(self, &e->pass[S_FWD], base + e->rooms, user, blk, ready, acc, c->name);
        if (rc == TP_OK && e->own_bias)
            s_bias_act(&e->key, e->key.bias ? c->x[2] : NULL, c->y, relu);
    }
    free(own);
    if (owned)
        s_entry_free(e);
    return rc;
}

/* The backward of entry e's call c. premasked: dd (past keep) holds dy
 * already, masked and in the passes' layout (tp_dnnl_conv_backward_relu
 * wrote it; it checked that e->mask16, that the filter's gradient is
 * wanted, that backward-data, if wanted, runs on oneDNN, and that the
 * workspace is the planned one). */
static tp_status_t s_backward(tp_dnnl_conv_t *self, const tp_op_call_t *c, s_entry_t *e,
                              int premasked) {
    tp_status_t rc = TP_OK;
    char *base = NULL, *own = NULL;
    if (c->blk16 && (!e->ok || e->own_bias || (c->dx[0] && e->data_im2col)))
        return s_blk16_refuse(c);
    if (c->nhwc && (!e->ok || e->own_bias))
        return s_nhwc_refuse(c);
    if (!e->ok)
        return tp_cpu_conv_backward(c);
    if (e->f2)
        return s_f2_backward(e, c);
    TP_TRY(s_ws(e, c, &base, &own));
    TP_ASSERT(!premasked || (!own && c->dx[1] && e->mask16));
    float *db = c->ninputs > 2 ? c->dx[2] : NULL;
    const int data = c->dx[0] && !e->data_im2col;
    /* dy reordered once for both passes when both run on oneDNN */
    const int share = premasked || (e->dd_bytes && c->dx[1] && data);
    char *dd = share ? base + e->keep_bytes : NULL;
    if (c->dx[1]) {
        /* the forward's x (kept) is valid only in the planned workspace */
        const int kept = e->keep_bytes && !own;
        void *user[S_MAX_ARGS] = {(void *)c->x[0], (void *)c->dy, c->dx[1], db};
        void *blk[S_MAX_ARGS] = {kept ? base : NULL, dd};
        int ready[S_MAX_ARGS] = {kept, premasked};
        int acc[S_MAX_ARGS] = {0, 0, c->dx_acc[1], db ? c->dx_acc[2] : 0};
        rc = s_run(self, &e->pass[S_BWD_WEIGHTS], base + e->rooms, user, blk, ready, acc,
                   c->name);
        if (rc == TP_OK && db && e->own_bias)
            s_bias_grad(&e->key, c->dy, db, c->dx_acc[2]);
    } else if (db) {
        s_bias_grad(&e->key, c->dy, db, c->dx_acc[2]);
    }
    if (rc == TP_OK && data) {
        void *user[S_MAX_ARGS] = {(void *)c->dy, (void *)c->x[1], c->dx[0]};
        void *blk[S_MAX_ARGS] = {dd};
        int ready[S_MAX_ARGS] = {share && c->dx[1]};
        int acc[S_MAX_ARGS] = {0, 0, c->dx_acc[0]};
        rc = s_run(self, &e->pass[S_BWD_DATA], base + e->rooms, user, blk, ready, acc,
                   c->name);
    } else if (rc == TP_OK && c->dx[0]) {
        /* ops_conv.c's backward-data alone, in the same workspace past
         * the forward's kept x: a second backward over the same forward
         * (a GAN step's other player, tp_model_run's backward-only run)
         * reads it again. An NHWC source's dx (a saliency map of a
         * few-channel image) goes NCHW past that workspace first. */
        float *nchw = c->nhwc ? (float *)(base + e->keep_bytes +
                                          s_round(tp_cpu_conv_workspace(c)))
                              : NULL;
        float *dxs[3] = {nchw ? nchw : c->dx[0], NULL, NULL};
        const int acc[3] = {nchw ? 0 : c->dx_acc[0], 0, 0};
        tp_op_call_t in = *c;
        in.dx = dxs;
        in.dx_acc = acc;
        in.workspace = base + e->keep_bytes;
        rc = tp_cpu_conv_backward(&in);
        if (rc == TP_OK && nchw)
            s_nchw_out(&c->xshape[0], nchw, c->dx[0], c->dx_acc[0]);
    }
    /* the transposed conv's gradients carry the tests' deliberate fault
     * (ops_elementwise.h) as ops_conv.c's do: 1 in every real run */
    if (rc == TP_OK && s_deconv(&e->key) && tp_cpu_elementwise_grad_fault != 1.0f)
        for (int i = 0; i < c->ninputs && i < 3; i++)
            if (c->dx[i])
                for (size_t j = 0, n = tp_shape_count(&c->xshape[i]); j < n; j++)
                    c->dx[i][j] *= tp_cpu_elementwise_grad_fault;
    free(own);
    return rc;
}

/* ---- a folded relu's backward: mask and reorder in one pass ------------- */

tp_status_t tp_dnnl_conv_backward_relu(tp_dnnl_conv_t *self, const tp_op_call_t *c) {
    TP_ASSERT(c->attr->act == TP_ACT_RELU);
    const size_t n = tp_shape_count(&c->yshape);
    float *masked = c->workspace; /* the act's room (tp_act_room) */
    if (c->kind == TP_OP_CONV2D && tp_conv_thin_ok(c))
        return tp_conv_thin_backward_relu(c);
    if ((c->kind == TP_OP_CONV2D || c->kind == TP_OP_CONV_TRANSPOSE) && !tp_conv_thin_ok(c)) {
        const tp_op_call_t in = tp_act_inner(c, NULL);
        s_entry_t *e;
        int owned;
        TP_TRY(s_lookup(self, &in, &e, &owned));
        /* the one pass where the passes read dd as nChw16c: the filter's
         * gradient wanted (it reads dd), the input's (if wanted) on
         * oneDNN too, the planned workspace (dd in it) */
        const int fused = e->ok && e->mask16 && !owned && c->dx[1] &&
                          (!c->dx[0] || !e->data_im2col) && in.workspace &&
                          in.workspace_bytes >= e->bytes;
        if (fused) {
            char *base = (char *)(((uintptr_t)in.workspace + S_ALIGN - 1) &
                                  ~(uintptr_t)(S_ALIGN - 1));
            {
                const int64_t yd[4] = {e->key.n, e->key.o, e->key.oh, e->key.ow};
                s_blk16(yd, c->dy, c->y, base + e->keep_bytes,
                        e->pass[S_BWD_WEIGHTS].args[1].md.data_type == dnnl_bf16, 0, 0);
            }
            return s_backward(self, &in, e, 1);
        }
        if (owned)
            s_entry_free(e);
    }
    /* the relu's own backward on the plain dy, then the op's */
    const float *restrict y = c->y, *restrict dy = c->dy;
    for (size_t i = 0; i < n; i++)
        masked[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    const tp_op_call_t in = tp_act_inner(c, masked);
    return tp_dnnl_conv_backward(self, &in);
}

tp_status_t tp_dnnl_conv_backward(tp_dnnl_conv_t *self, const tp_op_call_t *c) {
    if (c->kind != TP_OP_CONV2D && c->kind != TP_OP_CONV_TRANSPOSE)
        return tp_cpu_conv_backward(c);
    if (tp_conv_thin_ok(c))
        return tp_conv_thin_backward(c);
    s_entry_t *e;
    int owned;
    TP_TRY(s_lookup(self, c, &e, &owned));
    tp_status_t rc = s_backward(self, c, e, 0);
    if (owned)
        s_entry_free(e);
    return rc;
}
