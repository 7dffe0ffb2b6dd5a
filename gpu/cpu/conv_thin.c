/* towerpack gpu: the CPU backend's thin convolutions (conv_thin.h):
 * conv2d with one input channel and conv2d_transpose with one output
 * channel, direct per image.
 *
 * Both are the convolution A from a one-channel plane ("big", H x W) to
 * O channels ("small", O x P with P = OH * OW) by w [O, K] (K = kh * kw;
 * conv2d's [O, 1, kh, kw] and the transposed conv's [C_in = O, 1, kh, kw]
 * are that same layout). With col [K, P] the plane's column matrix:
 *   A(big)      = w col               (conv2d forward, the transposed
 *                                      conv's backward-data)
 *   A^T(small)  = col2im(w^T small)   (the transposed conv's forward,
 *                                      conv2d's backward-data)
 *   dw          = small col^T         (both filters' gradients)
 * col is at most a few tens of KB for these layers, so one image's three
 * products run from L1 on one thread; the team takes whole images
 * (tp_cpu_parallel). oneDNN, by contrast, spent 1650-1750 us on the
 * autoencoder's enc1 at 2 threads against 530 at one (docs/performance.md).
 * The gradients of w and the bias are each fixed group of 8 images' own
 * partial sums, added over the groups in order afterwards: the same bits
 * at any thread count (s_bwd_range). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cpu/conv_thin.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_elementwise.h"

typedef struct {
    int transposed;         /* conv2d_transpose: big is y, small is x */
    int64_t n, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t k, p, pp;       /* kh * kw, oh * ow, p rounded up to 16 */
    const float *big;       /* forward: conv2d's x; backward: x or dy */
    const float *small;     /* forward: the transposed conv's x; backward: dy or x */
    const float *wt;        /* [o, k] */
    float *wk;              /* blk16: w transposed, [k, o] */
    const float *bias;      /* forward: NULL or [o] (conv2d) / [1] */
    int relu;               /* forward: a folded relu */
    float *out;             /* forward: y */
    float *dx;              /* backward: NULL or the input's gradient */
    int dx_acc;
    float *part;            /* backward: [groups][o * k + nb] partial sums */
    int64_t nb;             /* bias channels summed per image (0: none) */
    int wt_grad;            /* backward: the filter's gradient wanted */
    int blk16;              /* conv2d's y and dy in nChw16c (TP_BLK16_Y) */
    const float *ymask;     /* backward: a folded relu's y, masking dy (NULL: none) */
    atomic_int nomem;       /* a range could not get its column matrix */
} s_thin_t;

static int64_t s_dim(int v) { return v > 0 ? v : 1; }

/* GCC's vectors of 16 and 8 floats (one AVX-512 or AVX2 register; SSE
 * pairs in the baseline copy) and their comparison masks. */
typedef float s_v16 __attribute__((vector_size(64)));
typedef int32_t s_v16i __attribute__((vector_size(64)));
typedef float s_v8 __attribute__((vector_size(32)));
typedef int32_t s_v8i __attribute__((vector_size(32)));

/* The outputs [lo, hi) of n_out whose input x * s + off lies in [0, n_in)
 * (the rest meet the zero padding). */
static void s_cols(int64_t off, int64_t s, int64_t n_in, int64_t n_out, int64_t *lo,
                   int64_t *hi) {
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = n_in - 1 - off < 0 ? 0 : (n_in - 1 - off) / s + 1;
    l = l > n_out ? n_out : l;
    h = h > n_out ? n_out : (h < l ? l : h);
    *lo = l;
    *hi = h;
}

/* The inner loops built for AVX-512 and for AVX2 + FMA beside the
 * baseline x86-64 the library is built for, the copy picked by the CPU
 * (never by the thread count, so the bits stay the same at any team
 * size). GCC only: clang's build has the baseline copy. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define S_SIMD 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#pragma GCC optimize("O3")
#define S_K(name) name##_avx512
#define S_V s_v16
#define S_VI s_v16i
#define S_W 16
#include "gpu/cpu/conv_thin_k.h"
#undef S_K
#undef S_V
#undef S_VI
#undef S_W
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC optimize("O3")
#define S_K(name) name##_avx2
#define S_V s_v8
#define S_VI s_v8i
#define S_W 8
#include "gpu/cpu/conv_thin_k.h"
#undef S_K
#undef S_V
#undef S_VI
#undef S_W
#pragma GCC pop_options
#endif
#define S_K(name) name##_base
#define S_V s_v8
#define S_VI s_v8i
#define S_W 8
#include "gpu/cpu/conv_thin_k.h"
#undef S_K
#undef S_V
#undef S_VI
#undef S_W

/* One copy's kernels. */
typedef struct {
    void (*im2col)(const s_thin_t *a, const float *plane, float *col);
    void (*col2im)(const s_thin_t *a, const float *col, float *plane, int acc);
    void (*wcol)(const s_thin_t *a, const float *col, float *out, const float *bias, int relu);
    void (*wtsmall)(const s_thin_t *a, const float *small, float *col);
    void (*dots)(const s_thin_t *a, const float *small, const float *col, float *vacc);
    void (*reduce)(const s_thin_t *a, float *vacc, float *part);
    void (*wcol16)(const s_thin_t *a, const float *col, float *y16, const float *bias, int relu);
    void (*dots16)(const s_thin_t *a, const float *dy16, const float *y16, const float *col,
                   float *vacc);
} s_kern_t;

static const s_kern_t s_base = {s_im2col_base, s_col2im_base, s_wcol_base, s_wtsmall_base,
                                s_dots_base, s_reduce_base, s_wcol16_base, s_dots16_base};
#ifdef S_SIMD
static const s_kern_t s_avx2 = {s_im2col_avx2, s_col2im_avx2, s_wcol_avx2, s_wtsmall_avx2,
                                s_dots_avx2, s_reduce_avx2, s_wcol16_avx2, s_dots16_avx2};
static const s_kern_t s_avx512 = {s_im2col_avx512, s_col2im_avx512, s_wcol_avx512,
                                  s_wtsmall_avx512, s_dots_avx512, s_reduce_avx512,
                                  s_wcol16_avx512, s_dots16_avx512};
#endif

/* The widest copy the CPU runs; TP_ISA=avx2 or TP_ISA=plain caps it (to
 * compare the narrower copies on a wider CPU), as ops_cpu.c's cast. Read
 * at every call: a test switches it. */
static const s_kern_t *s_kern(void) {
#ifdef S_SIMD
    const char *cap = getenv("TP_ISA");
    const int allow512 = !cap || !strcmp(cap, "avx512");
    const int allow2 = allow512 || (cap && !strcmp(cap, "avx2"));
    __builtin_cpu_init();
    if (allow512 && __builtin_cpu_supports("avx512f"))
        return &s_avx512;
    if (allow2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return &s_avx2;
#endif
    return &s_base;
}

/* A plain sum in 8 lanes (the bias's gradient: o * p adds an image). */
static float s_sum(const float *u, int64_t n) {
    float l[8] = {0};
    int64_t q = 0;
    for (; q + 8 <= n; q += 8)
        for (int j = 0; j < 8; j++)
            l[j] += u[q + j];
    for (int j = 0; q < n; q++, j++)
        l[j] += u[q];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* One range's scratch (each range one thread's images), 64-byte aligned,
 * zeroed (the rows' padding stays zero): col [k][pp], pad [o][pp] (the
 * small side's rows padded), the backward's vector sums [o * k][16] (or
 * [o/16][k + 1][16]) and a plain dy blocked [o/16][p][16]. NULL, and the call marked failed, when memory
 * is short. */
static float *s_scratch(s_thin_t *a) {
    const size_t bytes =
        (size_t)((a->k + a->o) * a->pp + a->o * (a->k + 1) * 16 + a->o * a->p) * sizeof(float);
    float *m = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!m)
        atomic_store(&a->nomem, 1);
    else
        memset(m, 0, bytes);
    return m;
}

/* rows [o][p] to [o][pp] and back */
static void s_pad(const s_thin_t *a, const float *src, float *dst) {
    for (int64_t c = 0; c < a->o; c++)
        memcpy(dst + c * a->pp, src + c * a->p, (size_t)a->p * sizeof *dst);
}

static void s_unpad(const s_thin_t *a, const float *src, float *dst, int acc) {
    for (int64_t c = 0; c < a->o; c++) {
        const float *s = src + c * a->pp;
        float *d = dst + c * a->p;
        if (acc)
            for (int64_t q = 0; q < a->p; q++)
                d[q] += s[q];
        else
            memcpy(d, s, (size_t)a->p * sizeof *d);
    }
}

/* One image's nChw16c [o/16][p][16] (the oneDNN chain's layout,
 * gpu/graph/fold.c) to pad [o][pp]: the blocked dy's backward-data. */
static void s_from16(const s_thin_t *a, const float *y, const float *mask, float *pad) {
    for (int64_t b = 0; b < a->o / 16; b++)
        for (int64_t q = 0; q < a->p; q++)
            for (int64_t l = 0; l < 16; l++) {
                const int64_t at = (b * a->p + q) * 16 + l;
                pad[(b * 16 + l) * a->pp + q] = !mask || mask[at] > 0.0f ? y[at] : 0.0f;
            }
}

/* A plain dy [o][p] to nChw16c [o/16][p][16], masked by a folded relu's
 * y (mask [o][p], or NULL) */
static void s_to16(const s_thin_t *a, const float *src, const float *mask, float *blk) {
    for (int64_t b = 0; b < a->o / 16; b++)
        for (int64_t q = 0; q < a->p; q++)
            for (int64_t l = 0; l < 16; l++) {
                const int64_t at = (b * 16 + l) * a->p + q;
                blk[(b * a->p + q) * 16 + l] = !mask || mask[at] > 0.0f ? src[at] : 0.0f;
            }
}

/* rows [o][p] to [o][pp], masked by a folded relu's y (mask [o][p]) */
static void s_pad_mask(const s_thin_t *a, const float *src, const float *mask, float *dst) {
    for (int64_t c = 0; c < a->o; c++)
        for (int64_t q = 0; q < a->p; q++)
            dst[c * a->pp + q] = mask[c * a->p + q] > 0.0f ? src[c * a->p + q] : 0.0f;
}

static void s_fwd_range(void *arg, size_t lo, size_t hi) {
    s_thin_t *a = arg;
    const s_kern_t *K = s_kern();
    float *col = s_scratch(a);
    if (!col)
        return;
    float *pad = col + a->k * a->pp;
    const int64_t plane = a->h * a->w, sm = a->o * a->p;
    for (size_t n = lo; n < hi; n++) {
        if (!a->transposed) {
            K->im2col(a, a->big + n * plane, col);
            if (a->blk16)
                K->wcol16(a, col, a->out + n * sm, a->bias, a->relu);
            else if (a->pp == a->p) { /* whole vectors: y's rows are the padded ones */
                K->wcol(a, col, a->out + n * sm, a->bias, a->relu);
            } else {
                K->wcol(a, col, pad, a->bias, a->relu);
                s_unpad(a, pad, a->out + n * sm, 0);
            }
        } else {
            float *y = a->out + n * plane;
            const float *sp = a->small + n * sm;
            if (a->pp != a->p)
                s_pad(a, sp, pad), sp = pad;
            K->wtsmall(a, sp, col);
            K->col2im(a, col, y, 0);
            if (a->bias || a->relu) {
                const float b = a->bias ? a->bias[0] : 0.0f;
                for (int64_t q = 0; q < plane; q++) {
                    const float v = y[q] + b;
                    y[q] = a->relu && !(v > 0.0f) ? 0.0f : v;
                }
            }
        }
    }
    free(col);
}

/* Images per group of the backward: each group's filter gradient is
 * summed in vector lanes over its images, in order, and its lanes added
 * once; the groups' sums are then added in order. Fixed, so the bits do
 * not depend on how the team splits the groups. */
#define S_GROUP 8

static void s_bwd_range(void *arg, size_t glo, size_t ghi) {
    s_thin_t *a = arg;
    const s_kern_t *K = s_kern();
    float *col = s_scratch(a);
    if (!col)
        return;
    float *pad = col + a->k * a->pp, *vacc = pad + a->o * a->pp;
    float *blk = vacc + a->o * (a->k + 1) * 16;
    const int64_t plane = a->h * a->w, sm = a->o * a->p;
    const int64_t stride = a->o * a->k + a->nb;
    /* Which order sums dW and db is the geometry's choice, never the
     * layout's: the graph's chains change layouts only, and the bits must
     * stay (test_fold). conv2d with 32k channels (the CNN's conv1, in an
     * nChw16c chain) sums them in channel lanes, a plain dy blocked first;
     * the rest (the autoencoder's 16-channel enc1, plain in most runs) in
     * pixel lanes, a blocked dy made plain first. */
    const int lanes = !a->transposed && a->o % 32 == 0 && a->k <= 16;
    for (size_t g = glo; g < ghi; g++) {
        float *part = a->part ? a->part + g * stride : NULL;
        for (int64_t i = 0; part && i < a->nb; i++)
            part[a->o * a->k + i] = 0.0f;
        const int64_t n0 = (int64_t)g * S_GROUP;
        const int64_t n1 = n0 + S_GROUP < a->n ? n0 + S_GROUP : a->n;
        for (int64_t n = n0; n < n1; n++) {
            const float *big = a->big + n * plane, *small = a->small + n * sm;
            const float *ym = a->ymask ? a->ymask + n * sm : NULL;
            if (lanes && !a->blk16) { /* dy blocked (and masked) here */
                s_to16(a, small, ym, blk);
                small = blk;
                ym = NULL;
            }
            if (lanes) { /* dW and db in channel lanes, dx from a plain dy */
                K->im2col(a, big, col);
                if (a->wt_grad || a->nb)
                    K->dots16(a, small, ym, col, vacc);
                if (a->dx) {
                    s_from16(a, small, ym, pad);
                    K->wtsmall(a, pad, col);
                    K->col2im(a, col, a->dx + n * plane, a->dx_acc);
                }
                continue;
            }
            /* small's rows: dy itself, or padded (and masked) in pad */
            const float *sp = small;
            int64_t row = a->p;
            if (a->blk16)
                s_from16(a, small, ym, pad), sp = pad, row = a->pp;
            else if (a->ymask && !a->transposed)
                s_pad_mask(a, small, a->ymask + n * sm, pad), sp = pad, row = a->pp;
            else if (a->pp != a->p && (a->wt_grad || a->dx))
                s_pad(a, small, pad), sp = pad, row = a->pp;
            /* the bias: conv2d's per channel of dy (small), the transposed
             * conv's one channel of dy (big) */
            if (part && a->nb == a->o)
                for (int64_t o = 0; o < a->o; o++)
                    part[a->o * a->k + o] += s_sum(sp + o * row, a->p);
            else if (part && a->nb == 1)
                part[a->o * a->k] += s_sum(big, plane);
            if (!a->wt_grad && !a->dx)
                continue;
            K->im2col(a, big, col);
            if (a->wt_grad)
                K->dots(a, sp, col, vacc);
            if (!a->dx)
                continue;
            if (a->transposed) { /* dx = A(dy): x's side is small */
                K->wcol(a, col, pad, NULL, 0);
                s_unpad(a, pad, a->dx + n * sm, a->dx_acc);
            } else {             /* dx = A^T(dy) */
                K->wtsmall(a, sp, col);
                K->col2im(a, col, a->dx + n * plane, a->dx_acc);
            }
        }
        if (lanes && part) { /* the lanes are the channels */
            for (int64_t c = 0; c < a->o; c++) {
                float *v = vacc + (c / 16) * (a->k + 1) * 16 + c % 16;
                for (int64_t t = 0; t < a->k; t++)
                    part[c * a->k + t] = v[t * 16];
                if (a->nb)
                    part[a->o * a->k + c] = v[a->k * 16];
            }
            memset(vacc, 0, (size_t)(a->o * (a->k + 1)) * sizeof *vacc);
        } else if (a->wt_grad) {
            K->reduce(a, vacc, part);
        }
    }
    free(col);
}

/* ---- entry points --------------------------------------------------------- */

int tp_conv_thin_ok(const tp_op_call_t *c) {
    if (c->kind != TP_OP_CONV2D && c->kind != TP_OP_CONV_TRANSPOSE)
        return 0;
    const char *env = getenv("TP_CONV_THIN");
    if (env && !strcmp(env, "0"))
        return 0;
    const tp_shape_t *big = c->kind == TP_OP_CONV2D ? &c->xshape[0] : &c->yshape;
    /* nChw16c: only conv2d's y and dy (its x has one channel), 16k channels */
    const int blk = c->blk16 == TP_BLK16_Y && c->kind == TP_OP_CONV2D &&
                    c->yshape.ndim == 4 && c->yshape.d[1] % 16 == 0 &&
                    c->attr->kh * c->attr->kw <= 16;
    return (!c->blk16 || blk) && s_dim(c->attr->groups) == 1 && big->ndim == 4 && big->d[1] == 1 &&
           c->xshape[0].ndim == 4 && c->yshape.ndim == 4;
}

/* The geometry of call c in A's terms (the file's banner). */
static void s_geom(const tp_op_call_t *c, s_thin_t *a) {
    memset(a, 0, sizeof *a);
    const tp_op_attr_t *at = c->attr;
    a->transposed = c->kind == TP_OP_CONV_TRANSPOSE;
    const tp_shape_t *big = a->transposed ? &c->yshape : &c->xshape[0];
    const tp_shape_t *small = a->transposed ? &c->xshape[0] : &c->yshape;
    a->n = c->xshape[0].d[0];
    a->h = big->d[2];
    a->w = big->d[3];
    a->o = small->d[1];
    a->oh = small->d[2];
    a->ow = small->d[3];
    a->kh = at->kh;
    a->kw = at->kw;
    a->sh = s_dim(at->sh);
    a->sw = s_dim(at->sw);
    a->ph = at->ph;
    a->pw = at->pw;
    a->dh = s_dim(at->dh);
    a->dw = s_dim(at->dw);
    a->k = a->kh * a->kw;
    a->p = a->oh * a->ow;
    a->pp = (a->p + 15) & ~(int64_t)15; /* whole vectors of any copy */
    a->wt = c->x[1];
    a->blk16 = c->blk16 == TP_BLK16_Y;
    atomic_init(&a->nomem, 0);
}

static tp_status_t s_nomem(const tp_op_call_t *c, const s_thin_t *a) {
    return tp_error(TP_ERR_NOMEM, "%s: no memory for a %lld x %lld column matrix (conv_thin.c)",
                    c->name, (long long)a->k, (long long)a->p);
}

tp_status_t tp_conv_thin_forward(const tp_op_call_t *c) {
    s_thin_t a;
    s_geom(c, &a);
    a.big = a.transposed ? NULL : c->x[0];
    a.small = a.transposed ? c->x[0] : NULL;
    a.bias = c->ninputs > 2 ? c->x[2] : NULL;
    a.relu = c->attr->act == TP_ACT_RELU;
    a.out = c->y;
    if (a.blk16) { /* the taps' weights over the channels, one vector each */
        a.wk = malloc((size_t)(a.k * a.o) * sizeof *a.wk);
        if (!a.wk)
            return s_nomem(c, &a);
        for (int64_t o = 0; o < a.o; o++)
            for (int64_t t = 0; t < a.k; t++)
                a.wk[t * a.o + o] = a.wt[o * a.k + t];
    }
    tp_cpu_team(tp_cpu_threads());
    tp_cpu_parallel((size_t)a.n, 1, 1, s_fwd_range, &a);
    free(a.wk);
    return atomic_load(&a.nomem) ? s_nomem(c, &a) : TP_OK;
}

static tp_status_t s_backward(const tp_op_call_t *c, const float *ymask) {
    s_thin_t a;
    s_geom(c, &a);
    a.ymask = ymask;
    /* the plane A reads: conv2d's x, the transposed conv's dy */
    a.big = a.transposed ? c->dy : c->x[0];
    a.small = a.transposed ? c->x[0] : c->dy;
    a.dx = c->dx[0];
    a.dx_acc = c->dx_acc[0];
    a.wt_grad = c->dx[1] != NULL;
    float *db = c->ninputs > 2 ? c->dx[2] : NULL;
    a.nb = db ? (a.transposed ? 1 : a.o) : 0;
    const int64_t stride = a.o * a.k + a.nb, groups = (a.n + S_GROUP - 1) / S_GROUP;
    if (a.wt_grad || db) {
        a.part = malloc((size_t)(groups * stride) * sizeof *a.part);
        if (!a.part)
            return s_nomem(c, &a);
    }
    tp_cpu_team(tp_cpu_threads());
    tp_cpu_parallel((size_t)groups, 1, 1, s_bwd_range, &a);
    if (atomic_load(&a.nomem)) {
        free(a.part);
        return s_nomem(c, &a);
    }
    /* the groups' partial sums added in order: bits independent of how
     * the groups were split over the team */
    const float fault = a.transposed ? tp_cpu_elementwise_grad_fault : 1.0f;
    for (int64_t i = 0; a.part && i < stride; i++) {
        if (i < a.o * a.k && !a.wt_grad)
            continue;
        float s = 0.0f;
        for (int64_t g = 0; g < groups; g++)
            s += a.part[g * stride + i];
        float *dst = i < a.o * a.k ? c->dx[1] + i : db + (i - a.o * a.k);
        const int acc = i < a.o * a.k ? c->dx_acc[1] : c->dx_acc[2];
        *dst = (acc ? *dst + s : s) * fault;
    }
    free(a.part);
    /* the transposed conv's gradients carry the tests' deliberate fault
     * (ops_elementwise.h) as ops_conv.c's do: 1 in every real run */
    if (a.dx && a.transposed && fault != 1.0f)
        for (int64_t i = 0, m = a.n * a.o * a.p; i < m; i++)
            a.dx[i] *= fault;
    return TP_OK;
}

tp_status_t tp_conv_thin_backward(const tp_op_call_t *c) { return s_backward(c, NULL); }

tp_status_t tp_conv_thin_backward_relu(const tp_op_call_t *c) {
    TP_ASSERT(c->kind == TP_OP_CONV2D && c->attr->act == TP_ACT_RELU);
    return s_backward(c, c->y);
}
