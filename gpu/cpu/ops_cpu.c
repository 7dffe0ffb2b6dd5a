/* towerpack gpu: the CPU kernels of every graph op (forward and backward).
 *
 * Matrix products go to OpenBLAS; convolutions to oneDNN (dnnl_conv.c) or,
 * with TP_CPU_CONV=im2col, im2col + OpenBLAS (ops_conv.c); everything else is plain C written so the compiler vectorises
 * the inner loops, except the uint8 cast (AVX-512 or AVX2 when the CPU has
 * them, chosen at run time: the build itself targets any x86-64). Gradients follow the call's dx_acc flags: overwrite for
 * the first consumer, add for later ones, so nothing is zeroed per step. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_block_end.h"
#include "gpu/cpu/cpu_math.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/dnnl_matmul.h"
#include "gpu/cpu/dnnl_ops.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/cpu/ops_loss.h"
#include "gpu/cpu/ops_reduce.h"
#include "gpu/cpu/ops_shape.h"
#include "gpu/cpu/ops_conv.h"
/* the linalg family */
#include "gpu/cpu/ops_linalg.h"
#include "gpu/cpu/ops_norm.h"
#include "gpu/cpu/ops_attention.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

static size_t s_count(const tp_shape_t *s) { return tp_shape_count(s); }

/* [N, C, S]: batch, channels, everything after. */
static void s_ncs(const tp_shape_t *s, size_t *n, size_t *c, size_t *sp) {
    *n = (size_t)s->d[0];
    *c = s->ndim > 1 ? (size_t)s->d[1] : 1;
    *sp = 1;
    for (int i = 2; i < s->ndim; i++)
        *sp *= (size_t)s->d[i];
}

/* ---- matmul ------------------------------------------------------------- */

/* A folded bias and relu in one pass over the product, row by row while
 * the row is in cache: the same sums as a bias add and a relu after it. */
static void s_bias_act_rows(float *restrict y, size_t n, size_t m,
                            const float *restrict b, int relu) {
    for (size_t i = 0; i < n; i++) {
        float *restrict r = y + i * m;
        if (b)
            for (size_t k = 0; k < m; k++)
                r[k] += b[k];
        if (relu)
            for (size_t k = 0; k < m; k++)
                r[k] = r[k] > 0.0f ? r[k] : 0.0f;
    }
}

/* oneDNN's matmul (dnnl_matmul.c) where the backend has its oneDNN cache,
 * else OpenBLAS */
static tp_status_t s_matmul_fwd(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c) {
    int done = 0;
    if (dnnl)
        TP_TRY(tp_dnnl_matmul_forward(c, &done));
    if (done)
        return TP_OK;
    const tp_shape_t *xs = &c->xshape[0];
    int n = (int)xs->d[0], k = (int)(s_count(xs) / (size_t)xs->d[0]);
    int m = (int)c->xshape[1].d[1];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, k, 1.0f,
                c->x[0], k, c->x[1], m, 0.0f, c->y, m);
    if (c->bias || c->attr->act == TP_ACT_RELU)
        s_bias_act_rows(c->y, (size_t)n, (size_t)m, c->bias,
                        c->attr->act == TP_ACT_RELU);
    return TP_OK;
}

/* db (+)= the column sums of dy[n, ch], rows in order: a bias add's
 * gradient, and a matmul's folded bias's (the same sums). */
static void s_column_sums(const float *restrict dy, size_t n, size_t ch,
                          float *restrict db, int acc) {
    if (!acc)
        memset(db, 0, ch * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const float *r = dy + i * ch;
        for (size_t k = 0; k < ch; k++)
            db[k] += r[k];
    }
}

static tp_status_t s_matmul_bwd(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c) {
    const tp_shape_t *xs = &c->xshape[0];
    int n = (int)xs->d[0], k = (int)(s_count(xs) / (size_t)xs->d[0]);
    int m = (int)c->xshape[1].d[1];
    if (c->dbias)
        s_column_sums(c->dy, (size_t)n, (size_t)m, c->dbias, c->dbias_acc);
    int done = 0;
    if (dnnl)
        TP_TRY(tp_dnnl_matmul_backward(c, &done));
    if (done)
        return TP_OK;
    if (c->dx[1])
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, m, n, 1.0f,
                    c->x[0], k, c->dy, m, c->dx_acc[1] ? 1.0f : 0.0f, c->dx[1],
                    m);
    if (c->dx[0])
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, k, m, 1.0f,
                    c->dy, m, c->x[1], m, c->dx_acc[0] ? 1.0f : 0.0f, c->dx[0],
                    k);
    return TP_OK;
}



/* conv2d itself: the convolution family's file, ops_conv.c */

/* ---- bias, activations, scale, add -------------------------------------- */

/* Bias add over images ([N, C, spatial...]) on the team (cpu_pool.h):
 * forward and dx over the N C rows of `sp` items, the bias gradient over
 * its channels (each channel's rows added in sample order, as one thread
 * adds them: the same bits whatever the cut). [N, C] stays one thread. */
#define S_BIAS_MIN 16384

typedef struct {
    const tp_op_call_t *c;
    size_t n, ch, sp;
} s_bias_t;

TP_CPU_CLONES static void s_bias_fwd_rows(void *arg, size_t lo, size_t hi) {
    const s_bias_t *a = arg;
    const float *restrict x = a->c->x[0], *restrict b = a->c->x[1];
    float *restrict y = a->c->y;
    for (size_t r = lo; r < hi; r++) {
        const float bk = b[r % a->ch];
        const float *restrict xr = x + r * a->sp;
        float *restrict yr = y + r * a->sp;
        for (size_t s = 0; s < a->sp; s++)
            yr[s] = xr[s] + bk;
    }
}

static void s_bias_dx_items(void *arg, size_t lo, size_t hi) {
    const s_bias_t *a = arg;
    const float *restrict dy = a->c->dy + lo;
    float *restrict dx = a->c->dx[0] + lo;
    GRAD_STORE(dx, a->c->dx_acc[0], hi - lo, dy[i]);
}

static void s_bias_db_channels(void *arg, size_t lo, size_t hi) {
    const s_bias_t *a = arg;
    const float *restrict dy = a->c->dy;
    float *restrict db = a->c->dx[1];
    if (!a->c->dx_acc[1])
        memset(db + lo, 0, (hi - lo) * sizeof(float));
    for (size_t i = 0; i < a->n; i++)
        for (size_t k = lo; k < hi; k++)
            db[k] += tp_cpu_sum8(dy + (i * a->ch + k) * a->sp, a->sp);
}

/* dx and the bias gradient in one pass over dy (both wanted, images):
 * rows [lo, hi) of the N C rows, each copied into dx and then summed from
 * L1 into rs[row]; s_bias_bwd adds rs into db afterwards, a channel's
 * rows in sample order as s_bias_db_channels adds them (the same bits).
 * The rows are cut as they lie in memory: a cut by channels put every
 * part's sums into one cache line of db, bounced between the cores per
 * row. Two passes over dy were a third of the op's backward. */
typedef float s_v8 __attribute__((vector_size(32)));

/* tp_cpu_sum8's sum, its lanes as one vector (the same bits): GCC's own
 * vectorising of the lane array, in the AVX-512 clone, shuffled 16-lane
 * registers into 8 (half the bias backward's time). */
static inline float s_sum8v(const float *restrict r, size_t n) {
    s_v8 lv = {0, 0, 0, 0, 0, 0, 0, 0}, v;
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        memcpy(&v, r + j, sizeof v);
        lv += v;
    }
    float lane[8], s = 0.0f;
    memcpy(lane, &lv, sizeof lane);
    for (; j < n; j++)
        s += r[j];
    for (int l = 0; l < 8; l++)
        s += lane[l];
    return s;
}

typedef struct {
    const s_bias_t *a;
    float *rs;
} s_bias_rows_t;

TP_CPU_CLONES static void s_bias_bwd_rows(void *arg, size_t lo, size_t hi) {
    const s_bias_rows_t *b = arg;
    const s_bias_t *a = b->a;
    const float *restrict dy = a->c->dy;
    float *restrict dx = a->c->dx[0], *restrict rs = b->rs;
    const int acc = a->c->dx_acc[0];
    for (size_t r = lo; r < hi; r++) {
        const float *restrict d = dy + r * a->sp;
        float *restrict g = dx + r * a->sp;
        GRAD_STORE(g, acc, a->sp, d[i]);
        rs[r] = s_sum8v(d, a->sp);
    }
}

static void s_bias_fwd(const tp_op_call_t *c) {
    size_t n, ch, sp;
    s_ncs(&c->xshape[0], &n, &ch, &sp);
    const float *restrict x = c->x[0], *restrict b = c->x[1];
    float *restrict y = c->y;
    if (sp == 1) { /* [N,C]: vectorise along C */
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; k < ch; k++)
                y[i * ch + k] = x[i * ch + k] + b[k];
        return;
    }
    s_bias_t a = {c, n, ch, sp};
    tp_cpu_parallel(n * ch, 1, (S_BIAS_MIN + sp - 1) / sp, s_bias_fwd_rows, &a);
}

static void s_bias_bwd(const tp_op_call_t *c) {
    size_t n, ch, sp;
    s_ncs(&c->xshape[0], &n, &ch, &sp);
    const float *restrict dy = c->dy;
    s_bias_t a = {c, n, ch, sp};
    s_bias_rows_t br = {&a, NULL};
    if (c->dx[0] && c->dx[1] && sp > 1 && (br.rs = malloc(n * ch * sizeof(float)))) {
        tp_cpu_parallel(n * ch, 1, (S_BIAS_MIN + sp - 1) / sp, s_bias_bwd_rows, &br);
        float *restrict db = c->dx[1];
        if (!c->dx_acc[1])
            memset(db, 0, ch * sizeof(float));
        for (size_t r = 0; r < n * ch; r++)
            db[r % ch] += br.rs[r];
        free(br.rs);
        return;
    }
    if (c->dx[0]) {
        if (sp == 1) {
            float *restrict dx = c->dx[0];
            GRAD_STORE(dx, c->dx_acc[0], n * ch * sp, dy[i]);
        } else {
            tp_cpu_parallel(n * ch * sp, 16, S_BIAS_MIN, s_bias_dx_items, &a);
        }
    }
    if (c->dx[1] && sp == 1)
        s_column_sums(dy, n, ch, c->dx[1], c->dx_acc[1]);
    else if (c->dx[1])
        tp_cpu_parallel(ch, 1, (S_BIAS_MIN + n * sp - 1) / (n * sp), s_bias_db_channels, &a);
}

static void s_passthrough_bwd(const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float *restrict dy = c->dy;
    for (int k = 0; k < c->ninputs; k++)
        if (c->dx[k]) {
            float *restrict dx = c->dx[k];
            GRAD_STORE(dx, c->dx_acc[k], n, dy[i]);
        }
}

/* ---- pooling ------------------------------------------------------------ */

/* 2x2 windows, stride 2, no padding: the common case, branch-free. */
static void s_maxpool2(const float *restrict x, float *restrict y,
                       int32_t *restrict arg, int nc, int h, int w, int oh,
                       int ow) {
    for (int p = 0; p < nc; p++) {
        const float *xp = x + (size_t)p * h * w;
        for (int oy = 0; oy < oh; oy++) {
            const float *r0 = xp + (size_t)(2 * oy) * w, *r1 = r0 + w;
            float *yr = y + ((size_t)p * oh + oy) * ow;
            int32_t *ar = arg + ((size_t)p * oh + oy) * ow;
            const int base = 2 * oy * w;
            for (int ox = 0; ox < ow; ox++) {
                const float a0 = r0[2 * ox], a1 = r0[2 * ox + 1];
                const float b0 = r1[2 * ox], b1 = r1[2 * ox + 1];
                const int i0 = base + 2 * ox;
                float m = a0;
                int mi = i0;
                mi = a1 > m ? i0 + 1 : mi;
                m = a1 > m ? a1 : m;
                mi = b0 > m ? i0 + w : mi;
                m = b0 > m ? b0 : m;
                mi = b1 > m ? i0 + w + 1 : mi;
                m = b1 > m ? b1 : m;
                yr[ox] = m;
                ar[ox] = mi;
            }
        }
    }
}

/* Pooling runs plane by plane (one batch item's channel): a plane's
 * outputs, and its gradient's scatter, read and write nothing of another
 * plane, so the planes are cut over the team (cpu_pool.c) and the results
 * are the same bits whatever the thread count. The CNN's two pools were
 * 11% of its 1-thread step and ran on one thread (issue 49). */
#define S_POOL_MIN_FLOATS 16384 /* input floats a part at least: ~10 us */

typedef struct {
    const tp_op_call_t *c;
    int max, h, w, oh, ow;
} s_pool_t;

static size_t s_pool_min_planes(int h, int w) {
    const size_t plane = (size_t)h * (size_t)w;
    return plane >= S_POOL_MIN_FLOATS ? 1 : S_POOL_MIN_FLOATS / (plane ? plane : 1);
}

static void s_pool_fwd_planes(void *arg, size_t lo, size_t hi) {
    const s_pool_t *P = arg;
    const tp_op_call_t *c = P->c;
    const int max = P->max, h = P->h, w = P->w, oh = P->oh, ow = P->ow;
    const tp_op_attr_t *a = c->attr;
    const float *x = c->x[0];
    float *y = c->y;
    int32_t *arg32 = c->workspace;
    if (max && a->kh == 2 && a->kw == 2 && a->sh == 2 && a->sw == 2 &&
        a->ph == 0 && a->pw == 0) {
        s_maxpool2(x + lo * h * w, y + lo * oh * ow, arg32 + lo * oh * ow, (int)(hi - lo),
                   h, w, oh, ow);
        return;
    }
    for (int p = (int)lo; p < (int)hi; p++) {
        const float *xp = x + (size_t)p * h * w;
        for (int oy = 0; oy < oh; oy++) {
            int y0 = oy * a->sh - a->ph, y1 = y0 + a->kh;
            if (y0 < 0)
                y0 = 0;
            if (y1 > h)
                y1 = h;
            for (int ox = 0; ox < ow; ox++) {
                int x0 = ox * a->sw - a->pw, x1 = x0 + a->kw;
                if (x0 < 0)
                    x0 = 0;
                if (x1 > w)
                    x1 = w;
                size_t o = ((size_t)p * oh + oy) * ow + ox;
                if (max) {
                    float best = -FLT_MAX;
                    int bi = y0 * w + x0;
                    for (int iy = y0; iy < y1; iy++)
                        for (int ix = x0; ix < x1; ix++)
                            if (xp[iy * w + ix] > best) {
                                best = xp[iy * w + ix];
                                bi = iy * w + ix;
                            }
                    y[o] = best;
                    arg32[o] = bi;
                } else {
                    float s = 0.0f;
                    for (int iy = y0; iy < y1; iy++)
                        for (int ix = x0; ix < x1; ix++)
                            s += xp[iy * w + ix];
                    y[o] = s / (float)((y1 - y0) * (x1 - x0));
                }
            }
        }
    }
}

static void s_pool_fwd(const tp_op_call_t *c, int max) {
    const tp_shape_t *xs = &c->xshape[0];
    s_pool_t P = {c, max, (int)xs->d[2], (int)xs->d[3], (int)c->yshape.d[2],
                  (int)c->yshape.d[3]};
    tp_cpu_parallel((size_t)(xs->d[0] * xs->d[1]), 1, s_pool_min_planes(P.h, P.w),
                    s_pool_fwd_planes, &P);
}

static void s_pool_bwd_planes(void *arg, size_t lo, size_t hi) {
    const s_pool_t *P = arg;
    const tp_op_call_t *c = P->c;
    const int max = P->max, h = P->h, w = P->w, oh = P->oh, ow = P->ow;
    const tp_op_attr_t *a = c->attr;
    const float *dy = c->dy;
    const int32_t *arg32 = c->workspace;
    float *dx = c->dx[0];
    if (!c->dx_acc[0])
        memset(dx + lo * h * w, 0, (hi - lo) * h * w * sizeof(float));
    for (int p = (int)lo; p < (int)hi; p++) {
        float *dxp = dx + (size_t)p * h * w;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                size_t o = ((size_t)p * oh + oy) * ow + ox;
                if (max) {
                    dxp[arg32[o]] += dy[o];
                    continue;
                }
                int y0 = oy * a->sh - a->ph, y1 = y0 + a->kh;
                int x0 = ox * a->sw - a->pw, x1 = x0 + a->kw;
                if (y0 < 0)
                    y0 = 0;
                if (y1 > h)
                    y1 = h;
                if (x0 < 0)
                    x0 = 0;
                if (x1 > w)
                    x1 = w;
                float g = dy[o] / (float)((y1 - y0) * (x1 - x0));
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++)
                        dxp[iy * w + ix] += g;
            }
    }
}

static void s_pool_bwd(const tp_op_call_t *c, int max) {
    if (!c->dx[0])
        return;
    const tp_shape_t *xs = &c->xshape[0];
    s_pool_t P = {c, max, (int)xs->d[2], (int)xs->d[3], (int)c->yshape.d[2],
                  (int)c->yshape.d[3]};
    tp_cpu_parallel((size_t)(xs->d[0] * xs->d[1]), 1, s_pool_min_planes(P.h, P.w),
                    s_pool_bwd_planes, &P);
}

/* The global average pool of an nChw16c x (tp_op_call_t.blk16 bit 0: the
 * end of a blocked chain, gpu/graph/fold.c): channel k of image b is lane
 * k % 16 of block k / 16, [N, C/16, H*W, 16]; y is plain [N, C]. */
static void s_gap16_fwd(const tp_op_call_t *c, size_t n, size_t ch, size_t sp) {
    const float *x = c->x[0];
    float *y = c->y;
    for (size_t r = 0; r < n * (ch / 16); r++) {
        float lane[16] = {0};
        const float *restrict v = x + r * sp * 16;
        for (size_t i = 0; i < sp; i++)
            for (int l = 0; l < 16; l++)
                lane[l] += v[i * 16 + (size_t)l];
        for (int l = 0; l < 16; l++)
            y[r * 16 + (size_t)l] = lane[l] / (float)sp;
    }
}

static void s_gap16_bwd(const tp_op_call_t *c, size_t n, size_t ch, size_t sp) {
    const float *dy = c->dy;
    float *dx = c->dx[0];
    const float inv = 1.0f / (float)sp;
    for (size_t r = 0; r < n * (ch / 16); r++) {
        float g[16];
        for (int l = 0; l < 16; l++)
            g[l] = dy[r * 16 + (size_t)l] * inv;
        float *restrict d = dx + r * sp * 16;
        for (size_t i = 0; i < sp; i++)
            for (int l = 0; l < 16; l++)
                d[i * 16 + (size_t)l] = (c->dx_acc[0] ? d[i * 16 + (size_t)l] : 0.0f) + g[l];
    }
}

static void s_gap_fwd(const tp_op_call_t *c) {
    size_t n, ch, sp;
    s_ncs(&c->xshape[0], &n, &ch, &sp);
    if (c->blk16 & 1u) {
        s_gap16_fwd(c, n, ch, sp);
        return;
    }
    const float *x = c->x[0];
    float *y = c->y;
    for (size_t p = 0; p < n * ch; p++)
        y[p] = tp_cpu_sum8(x + p * sp, sp) / (float)sp;
}

static void s_gap_bwd(const tp_op_call_t *c) {
    size_t n, ch, sp;
    s_ncs(&c->xshape[0], &n, &ch, &sp);
    const float *dy = c->dy;
    float *dx = c->dx[0];
    if (!dx)
        return;
    if (c->blk16 & 1u) {
        s_gap16_bwd(c, n, ch, sp);
        return;
    }
    const float inv = 1.0f / (float)sp;
    /* plane by plane: one gradient value a plane (an index division per
     * item kept the loop scalar, 10x PyTorch's time) */
    for (size_t p = 0; p < n * ch; p++) {
        const float g = dy[p] * inv;
        float *restrict d = dx + p * sp;
        GRAD_STORE(d, c->dx_acc[0], sp, g);
    }
}

/* ---- batch norm --------------------------------------------------------- */

/* sum((r - mu)^2) over n floats, 8 lanes. */
static float s_sqdev(const float *restrict r, size_t n, float mu) {
    float lane[8] = {0};
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) {
            const float dd = r[j + (size_t)l] - mu;
            lane[l] += dd * dd;
        }
    float s = 0.0f;
    for (; j < n; j++)
        s += (r[j] - mu) * (r[j] - mu);
    for (int l = 0; l < 8; l++)
        s += lane[l];
    return s;
}

/* the op itself: ops_norm.c (tp_cpu_bnorm_forward/backward) */

/* ---- dropout ------------------------------------------------------------ */

static void s_dropout_fwd(const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float *x = c->x[0];
    float *y = c->y, *mask = c->workspace;
    const float rate = c->attr->alpha;
    if (!c->attr->training || rate <= 0.0f) {
        if (y != x)
            memcpy(y, x, n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            mask[i] = 1.0f;
        return;
    }
    const float keep = 1.0f / (1.0f - rate);
    /* 24-bit draws against a threshold, each from (key, i) alone: exact,
     * and the GPU's threads make the same (backend_impl.h) */
    const uint32_t thr = tp_dropout_threshold(rate);
    const uint64_t key = tp_rng_u64(c->rng);
    for (size_t i = 0; i < n; i++) {
        mask[i] = tp_dropout_drops(key, thr, i) ? 0.0f : keep;
        y[i] = x[i] * mask[i];
    }
}

static void s_dropout_bwd(const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float *dy = c->dy, *mask = c->workspace;
    if (c->dx[0])
        GRAD_STORE(c->dx[0], c->dx_acc[0], n, dy[i] * mask[i]);
}

/* ---- losses and metrics ------------------------------------------------- */

static tp_status_t s_check_labels(const tp_op_call_t *c) {
    const int64_t n = c->xshape[0].d[0], k = c->xshape[0].d[1];
    const int32_t *lab = c->x[1];
    if (c->xshape[1].d[0] != n)
        return tp_error(TP_ERR_SHAPE, "%s: %lld rows of logits but %lld labels",
                        c->name, (long long)n, (long long)c->xshape[1].d[0]);
    for (int64_t i = 0; i < n; i++)
        if (lab[i] < 0 || lab[i] >= k)
            return tp_error(TP_ERR_INVALID,
                            "%s: label %d at row %lld outside [0,%lld)",
                            c->name, lab[i], (long long)i, (long long)k);
    return TP_OK;
}

static tp_status_t s_xent_fwd(const tp_op_call_t *c) {
    TP_TRY(s_check_labels(c));
    const size_t n = (size_t)c->xshape[0].d[0], k = (size_t)c->xshape[0].d[1];
    const float *x = c->x[0];
    const int32_t *lab = c->x[1];
    float *p = c->workspace;
    const float eps = c->attr->alpha;  /* label smoothing */
    double loss = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float *r = x + i * k;
        float *pr = p + i * k;
        float mx = r[0];
        for (size_t j = 1; j < k; j++)
            mx = r[j] > mx ? r[j] : mx;
        float s = 0.0f;
        for (size_t j = 0; j < k; j++) {
            pr[j] = expf(r[j] - mx);
            s += pr[j];
        }
        const float is = 1.0f / s;
        for (size_t j = 0; j < k; j++)
            pr[j] *= is;
        /* -sum_j q_j log p_j = log s + mx - sum_j q_j r_j, q the target
         * (the label's one-hot, or smoothed: attr alpha) */
        double target = r[lab[i]];
        if (eps > 0.0f) {
            double mean = 0.0;
            for (size_t j = 0; j < k; j++)
                mean += r[j];
            target = (1.0 - eps) * target + eps * mean / (double)k;
        }
        loss += (double)logf(s) + mx - target;
    }
    *(float *)c->y = (float)(loss / (double)n);
    return TP_OK;
}

static void s_xent_bwd(const tp_op_call_t *c) {
    const size_t n = (size_t)c->xshape[0].d[0], k = (size_t)c->xshape[0].d[1];
    const int32_t *lab = c->x[1];
    const float *p = c->workspace;
    const float g = c->dy[0] / (float)n;
    float *dx = c->dx[0];
    if (!dx)
        return;
    /* Row by row: g * (p - q), q the target: off everywhere, on at the
     * row's label (1 and 0 without smoothing). No division per element
     * and one label load per row (the per-element form cost about 5 us of
     * a 400 us MLP step at batch 128). */
    const float eps = c->attr->alpha, off = eps / (float)k, on = 1.0f - eps + off;
    const int acc = c->dx_acc[0];
    for (size_t r = 0; r < n; r++) {
        float *d = dx + r * k;
        const float *pr = p + r * k;
        const size_t l = (size_t)lab[r];   /* in [0, k): checked in forward */
        const float at = acc ? d[l] + g * (pr[l] - on) : g * (pr[l] - on);
        if (acc)
            for (size_t j = 0; j < k; j++)
                d[j] += g * (pr[j] - off);
        else
            for (size_t j = 0; j < k; j++)
                d[j] = g * (pr[j] - off);
        d[l] = at;   /* the same arithmetic as g * (p - onehot) */
    }
}

static tp_status_t s_correct_fwd(const tp_op_call_t *c) {
    TP_TRY(s_check_labels(c));
    const size_t n = (size_t)c->xshape[0].d[0], k = (size_t)c->xshape[0].d[1];
    const float *x = c->x[0];
    const int32_t *lab = c->x[1];
    size_t correct = 0;
    for (size_t i = 0; i < n; i++) {
        const float *r = x + i * k;
        size_t best = 0;
        for (size_t j = 1; j < k; j++)
            if (r[j] > r[best])
                best = j;
        correct += best == (size_t)lab[i];
    }
    *(float *)c->y = c->kind == TP_OP_ACCURACY
                         ? (float)correct / (float)n
                         : (float)(n - correct);
    return TP_OK;
}

static void s_l2_fwd(const tp_op_call_t *c) {
    double s = 0.0;
    for (int k = 0; k < c->ninputs; k++) {
        /* 8 float lanes (vectorised; one serial float sum is a 4-cycle
         * add chain per element: 15 ms over ResNet-18's 11M weights) */
        s += s_sqdev(c->x[k], s_count(&c->xshape[k]), 0.0f);
    }
    *(float *)c->y = (float)(0.5 * c->attr->alpha * s);
}

static void s_l2_bwd(const tp_op_call_t *c) {
    const float g = c->attr->alpha * c->dy[0];
    for (int k = 0; k < c->ninputs; k++) {
        if (!c->dx[k])
            continue;
        const float *w = c->x[k];
        GRAD_STORE(c->dx[k], c->dx_acc[k], s_count(&c->xshape[k]), g * w[i]);
    }
}

/* uint8 -> float32 times a: the first op of every image model, reading a
 * batch that the input pipeline has just written on another core, so from
 * the shared cache rather than this core's. The wide versions convert 64
 * bytes per iteration and ask for the line 4 KB ahead into L2 (more reads in
 * flight than the hardware prefetcher keeps); products are a * (float)x
 * exactly, as in the scalar loop. Chosen once, by what the CPU supports. */
#define CAST_AHEAD 4096
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static void s_cast_u8_avx512(const uint8_t *x, float *y,
                                                              size_t n, float a) {
    const __m512 va = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        _mm_prefetch((const char *)x + i + CAST_AHEAD, _MM_HINT_T1);
        __m512i v = _mm512_loadu_si512((const void *)(x + i));
        __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 0)));
        __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 1)));
        __m512 f2 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 2)));
        __m512 f3 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 3)));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(f0, va));
        _mm512_storeu_ps(y + i + 16, _mm512_mul_ps(f1, va));
        _mm512_storeu_ps(y + i + 32, _mm512_mul_ps(f2, va));
        _mm512_storeu_ps(y + i + 48, _mm512_mul_ps(f3, va));
    }
    for (; i < n; i++)
        y[i] = a * (float)x[i];
}

__attribute__((target("avx2"))) static void s_cast_u8_avx2(const uint8_t *x, float *y,
                                                         size_t n, float a) {
    const __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if (!(i & 63))
            _mm_prefetch((const char *)x + i + CAST_AHEAD, _MM_HINT_T1);
        for (int k = 0; k < 4; k++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(x + i + 8 * k));
            __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
            _mm256_storeu_ps(y + i + 8 * k, _mm256_mul_ps(f, va));
        }
    }
    for (; i < n; i++)
        y[i] = a * (float)x[i];
}
#endif

static void s_cast_u8_plain(const uint8_t *x, float *y, size_t n, float a) {
    for (size_t i = 0; i < n; i++)
        y[i] = a * (float)x[i];
}

typedef void (*s_cast_u8_fn)(const uint8_t *, float *, size_t, float);

/* TP_ISA=avx2 or TP_ISA=plain caps the choice (to test or compare the
 * narrower versions on a wider CPU). */
static s_cast_u8_fn s_cast_u8_pick(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    const char *cap = getenv("TP_ISA");
    int allow512 = !cap || !strcmp(cap, "avx512"), allow2 = allow512 || (cap && !strcmp(cap, "avx2"));
    __builtin_cpu_init();
    if (allow512 && __builtin_cpu_supports("avx512f"))
        return s_cast_u8_avx512;
    if (allow2 && __builtin_cpu_supports("avx2"))
        return s_cast_u8_avx2;
#endif
    return s_cast_u8_plain;
}

static void s_cast_u8(const uint8_t *x, float *y, size_t n, float a) {
    static _Atomic(s_cast_u8_fn) fn;
    s_cast_u8_fn f = atomic_load_explicit(&fn, memory_order_relaxed);
    if (!f) {
        f = s_cast_u8_pick();
        atomic_store_explicit(&fn, f, memory_order_relaxed);
    }
    f(x, y, n, a);
}

static void s_cast_fwd(const tp_op_call_t *c) {
    const size_t n = s_count(&c->yshape);
    const float a = c->attr->alpha;
    float *y = c->y;
    if (c->attr->in_dtype == TP_FLOAT32) {
        const float *x = c->x[0];
        for (size_t i = 0; i < n; i++)
            y[i] = a * x[i];
    } else {
        s_cast_u8(c->x[0], y, n, a);
    }
}

/* ---- dispatch ----------------------------------------------------------- */

static size_t s_workspace(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_MATMUL: /* oneDNN's scratchpads (dnnl_matmul.c); OpenBLAS: none */
        return dnnl ? tp_dnnl_matmul_workspace(c) : 0;
    case TP_OP_MAX_POOL: case TP_OP_AVG_POOL: { /* oneDNN's (dnnl_pool.c) or ours */
        const size_t own = c->kind == TP_OP_MAX_POOL ? s_count(&c->yshape) * sizeof(int32_t) : 0;
        return dnnl ? tp_dnnl_pool_workspace(c, own) : own;
    }
    case TP_OP_BATCH_NORM: {
        const size_t own = 2 * (size_t)c->xshape[0].d[1] * sizeof(float);
        return dnnl ? tp_dnnl_bnorm_workspace(c, own) : own;
    }
    case TP_OP_DROPOUT:
        return s_count(&c->yshape) * sizeof(float);
    case TP_OP_SOFTMAX_XENT:
        return s_count(&c->xshape[0]) * sizeof(float);
    case TP_OP_CONV2D: case TP_OP_CONV_TRANSPOSE: case TP_OP_UPSAMPLE_NEAREST:
    case TP_OP_UPSAMPLE_BILINEAR: /* the convolution family: oneDNN
                                   * (dnnl_conv.c) or im2col (ops_conv.c) */
        return dnnl ? tp_dnnl_conv_workspace(dnnl, c) : tp_cpu_conv_workspace(c);
    /* the linalg family: the norms' row statistics */
    case TP_OP_LAYER_NORM: case TP_OP_GROUP_NORM: case TP_OP_INSTANCE_NORM:
        return tp_cpu_norm_workspace(c);
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
    case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX: /* the reduce family */
    case TP_OP_SOFTMAX_XENT_SEQ:
        return tp_cpu_reduce_workspace(c);
    case TP_OP_ATTENTION: /* fused attention: ops_attention.c */
        return tp_cpu_attention_workspace(c);
    case TP_OP_BATCH_MATMUL: /* oneDNN's scratchpad where it runs (ops_linalg.c) */
        return tp_cpu_batch_matmul_workspace(c, dnnl != NULL);
    default:
        return 0;
    }
}

static tp_status_t s_forward(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_MATMUL: return s_matmul_fwd(dnnl, c);
    case TP_OP_BIAS_ADD: s_bias_fwd(c); break;
    case TP_OP_MAX_POOL: case TP_OP_AVG_POOL: { /* oneDNN where it takes the call */
        int done = 0;
        if (dnnl)
            TP_TRY(tp_dnnl_pool_forward(c, &done));
        if (!done)
            s_pool_fwd(c, c->kind == TP_OP_MAX_POOL);
        break;
    }
    case TP_OP_GLOBAL_AVG_POOL: s_gap_fwd(c); break;
    case TP_OP_BATCH_NORM: {
        int done = 0;
        if (dnnl)
            TP_TRY(tp_dnnl_bnorm_forward(c, &done));
        if (!done)
            TP_TRY(tp_cpu_bnorm_forward(c));
        break;
    }
    case TP_OP_DROPOUT: s_dropout_fwd(c); break;
    case TP_OP_RESHAPE:
        if (c->y != c->x[0])
            memcpy(c->y, c->x[0], s_count(&c->yshape) * sizeof(float));
        break;
    case TP_OP_SOFTMAX_XENT: return s_xent_fwd(c);
    case TP_OP_ACCURACY:
    case TP_OP_ERROR_COUNT: return s_correct_fwd(c);
    case TP_OP_L2_DECAY: s_l2_fwd(c); break;
    case TP_OP_CAST: s_cast_fwd(c); break;
    case TP_OP_MSE: case TP_OP_L1_LOSS: case TP_OP_HUBER_LOSS:
    case TP_OP_SIGMOID_XENT: /* the loss family: ops_loss.c */
        return tp_cpu_loss_forward(c);
    case TP_OP_TRANSPOSE: case TP_OP_SLICE: case TP_OP_CONCAT: case TP_OP_PAD:
    case TP_OP_BROADCAST_TO: case TP_OP_GATHER:
    case TP_OP_ONE_HOT: /* the shape family: ops_shape.c */
        return tp_cpu_shape_forward(c);
    case TP_OP_CONV2D: case TP_OP_CONV_TRANSPOSE: case TP_OP_UPSAMPLE_NEAREST:
    case TP_OP_UPSAMPLE_BILINEAR: /* the convolution family */
        return dnnl ? tp_dnnl_conv_forward(dnnl, c) : tp_cpu_conv_forward(c);
    /* the linalg family: ops_linalg.c, ops_norm.c */
    case TP_OP_BATCH_MATMUL: return tp_cpu_batch_matmul_forward(c, dnnl != NULL);
    case TP_OP_LAYER_NORM: case TP_OP_GROUP_NORM: case TP_OP_INSTANCE_NORM:
        return tp_cpu_norm_forward(c);
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
    case TP_OP_ARGMAX: case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
    case TP_OP_SOFTMAX_XENT_SEQ: case TP_OP_TOP_K_ACCURACY: /* the reduce family: ops_reduce.c */
        return tp_cpu_reduce_forward(c);
    case TP_OP_ATTENTION: return tp_cpu_attention_forward(c); /* ops_attention.c */
    default: /* the elementwise family: ops_elementwise.c */
        return tp_cpu_elementwise_forward(c);
    }
    return TP_OK;
}

static tp_status_t s_backward(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_MATMUL: return s_matmul_bwd(dnnl, c);
    case TP_OP_BIAS_ADD: s_bias_bwd(c); break;
    case TP_OP_MAX_POOL: case TP_OP_AVG_POOL: {
        int done = 0;
        if (dnnl)
            TP_TRY(tp_dnnl_pool_backward(c, &done));
        if (!done)
            s_pool_bwd(c, c->kind == TP_OP_MAX_POOL);
        break;
    }
    case TP_OP_GLOBAL_AVG_POOL: s_gap_bwd(c); break;
    case TP_OP_BATCH_NORM: {
        int done = 0;
        if (dnnl)
            TP_TRY(tp_dnnl_bnorm_backward(c, &done));
        if (!done)
            TP_TRY(tp_cpu_bnorm_backward(c));
        break;
    }
    case TP_OP_DROPOUT: s_dropout_bwd(c); break;
    case TP_OP_RESHAPE: s_passthrough_bwd(c); break;
    case TP_OP_SOFTMAX_XENT: s_xent_bwd(c); break;
    case TP_OP_L2_DECAY: s_l2_bwd(c); break;
    case TP_OP_MSE: case TP_OP_L1_LOSS: case TP_OP_HUBER_LOSS:
    case TP_OP_SIGMOID_XENT:
        return tp_cpu_loss_backward(c);
    case TP_OP_TRANSPOSE: case TP_OP_SLICE: case TP_OP_CONCAT: case TP_OP_PAD:
    case TP_OP_BROADCAST_TO: case TP_OP_GATHER: case TP_OP_ONE_HOT:
        return tp_cpu_shape_backward(c);
    case TP_OP_CONV2D: case TP_OP_CONV_TRANSPOSE: case TP_OP_UPSAMPLE_NEAREST:
    case TP_OP_UPSAMPLE_BILINEAR:
        return dnnl ? tp_dnnl_conv_backward(dnnl, c) : tp_cpu_conv_backward(c);
    /* the linalg family */
    case TP_OP_BATCH_MATMUL: return tp_cpu_batch_matmul_backward(c, dnnl != NULL);
    case TP_OP_LAYER_NORM: case TP_OP_GROUP_NORM: case TP_OP_INSTANCE_NORM:
        return tp_cpu_norm_backward(c);
    case TP_OP_REDUCE_SUM: case TP_OP_REDUCE_MEAN: case TP_OP_REDUCE_MAX:
    case TP_OP_ARGMAX: case TP_OP_SOFTMAX: case TP_OP_LOG_SOFTMAX:
    case TP_OP_SOFTMAX_XENT_SEQ: case TP_OP_TOP_K_ACCURACY:
        return tp_cpu_reduce_backward(c);
    case TP_OP_ATTENTION: return tp_cpu_attention_backward(c);
    default:
        return tp_cpu_elementwise_backward(c);
    }
    return TP_OK;
}

/* A folded activation (backend_impl.h, tp_act_room): the op's own work
 * with the workspace past the act's room; relu on the output after the
 * forward (the matmul's pass does it with the bias), and the backward
 * runs on dy masked by y > 0, the relu's own backward. The same numbers
 * as the op and a relu node after it. */
size_t tp_cpu_op_workspace(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c) {
    if (c->skip) /* a block end (cpu_block_end.c): the relu in its passes */
        return tp_cpu_block_end_workspace(c);
    const tp_op_call_t in = tp_act_inner(c, NULL);
    return tp_act_room(c) + s_workspace(dnnl, &in);
}

tp_status_t tp_cpu_op_forward(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c) {
    if (c->skip)
        return tp_cpu_block_end_forward(c);
    /* batch_matmul applies its folded GELU itself (ops_linalg.c) */
    if (c->attr->act == TP_ACT_NONE || c->kind == TP_OP_BATCH_MATMUL)
        return s_forward(dnnl, c);
    const tp_op_call_t in = tp_act_inner(c, NULL);
    TP_TRY(s_forward(dnnl, &in));
    /* the matmul's pass, the batch norm's (either path) and oneDNN's
     * convolutions (its eltwise post-op, dnnl_conv.c) apply the relu
     * themselves */
    const int conv = c->kind == TP_OP_CONV2D || c->kind == TP_OP_CONV_TRANSPOSE ||
                     c->kind == TP_OP_UPSAMPLE_NEAREST || c->kind == TP_OP_UPSAMPLE_BILINEAR;
    if (c->kind != TP_OP_MATMUL && c->kind != TP_OP_BATCH_NORM && !(conv && dnnl)) {
        const size_t n = s_count(&c->yshape);
        float *restrict y = c->y;
        for (size_t i = 0; i < n; i++)
            y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    }
    return TP_OK;
}

tp_status_t tp_cpu_op_backward(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c) {
    if (c->skip)
        return tp_cpu_block_end_backward(c);
    if (c->attr->act == TP_ACT_NONE || c->kind == TP_OP_BATCH_MATMUL)
        return s_backward(dnnl, c);
    /* oneDNN's convolutions mask dy as they reorder it (dnnl_conv.c) */
    if (dnnl && c->attr->act == TP_ACT_RELU &&
        (c->kind == TP_OP_CONV2D || c->kind == TP_OP_CONV_TRANSPOSE))
        return tp_dnnl_conv_backward_relu(dnnl, c);
    if (dnnl && c->attr->act == TP_ACT_RELU && c->kind == TP_OP_BATCH_NORM) {
        /* oneDNN's batch norm with the relu fused masks dy itself */
        const tp_op_call_t raw = tp_act_inner(c, NULL);
        int done = 0;
        TP_TRY(tp_dnnl_bnorm_backward_relu(&raw, &done));
        if (done)
            return TP_OK;
    }
    const size_t n = s_count(&c->yshape);
    const float *restrict y = c->y, *restrict dy = c->dy;
    float *restrict masked = c->workspace;
    for (size_t i = 0; i < n; i++) {
        const float g = dy[i];
        masked[i] = y[i] > 0.0f ? g : 0.0f;
    }
    const tp_op_call_t in = tp_act_inner(c, masked);
    return s_backward(dnnl, &in);
}
