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
 * The gradients of w and the bias are each image's own partial sums,
 * added over the images in image order afterwards: the same bits at any
 * thread count. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cpu/conv_thin.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_elementwise.h"

/* The inner loops built for AVX2 + FMA beside the baseline x86-64 (GCC's
 * function clones, picked once at load): the library is built for the
 * baseline. The clone depends on the CPU, never on the thread count. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define S_FAST __attribute__((target_clones("arch=haswell", "default"), optimize("O3")))
#else
#define S_FAST
#endif

typedef struct {
    int transposed;         /* conv2d_transpose: big is y, small is x */
    int64_t n, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t k, p;           /* kh * kw, oh * ow */
    const float *big;       /* forward: conv2d's x; backward: x or dy */
    const float *small;     /* forward: the transposed conv's x; backward: dy or x */
    const float *wt;        /* [o, k] */
    const float *bias;      /* forward: NULL or [o] (conv2d) / [1] */
    int relu;               /* forward: a folded relu */
    float *out;             /* forward: y */
    float *dx;              /* backward: NULL or the input's gradient */
    int dx_acc;
    float *part;            /* backward: [n][o * k + nb] partial sums */
    int64_t nb;             /* bias channels summed per image (0: none) */
    int wt_grad;            /* backward: the filter's gradient wanted */
    atomic_int nomem;       /* a range could not get its column matrix */
} s_thin_t;

static int64_t s_dim(int v) { return v > 0 ? v : 1; }

/* The column matrix of one plane: col[k][p] = the plane's pixel that
 * kernel tap k meets at output p (0 in the padding). */
S_FAST static void s_im2col(const s_thin_t *a, const float *plane, float *col) {
    for (int64_t i = 0; i < a->kh; i++)
        for (int64_t j = 0; j < a->kw; j++) {
            float *restrict c = col + (i * a->kw + j) * a->p;
            for (int64_t y = 0; y < a->oh; y++) {
                const int64_t ih = y * a->sh - a->ph + i * a->dh;
                float *restrict r = c + y * a->ow;
                if (ih < 0 || ih >= a->h) {
                    memset(r, 0, (size_t)a->ow * sizeof *r);
                    continue;
                }
                const float *src = plane + ih * a->w;
                for (int64_t x = 0; x < a->ow; x++) {
                    const int64_t iw = x * a->sw - a->pw + j * a->dw;
                    r[x] = iw >= 0 && iw < a->w ? src[iw] : 0.0f;
                }
            }
        }
}

/* plane (+)= col2im(col): each tap's values added where they land. */
static void s_col2im(const s_thin_t *a, const float *col, float *plane, int acc) {
    if (!acc)
        memset(plane, 0, (size_t)(a->h * a->w) * sizeof *plane);
    for (int64_t i = 0; i < a->kh; i++)
        for (int64_t j = 0; j < a->kw; j++) {
            const float *c = col + (i * a->kw + j) * a->p;
            for (int64_t y = 0; y < a->oh; y++) {
                const int64_t ih = y * a->sh - a->ph + i * a->dh;
                if (ih < 0 || ih >= a->h)
                    continue;
                float *dst = plane + ih * a->w;
                const float *r = c + y * a->ow;
                for (int64_t x = 0; x < a->ow; x++) {
                    const int64_t iw = x * a->sw - a->pw + j * a->dw;
                    if (iw >= 0 && iw < a->w)
                        dst[iw] += r[x];
                }
            }
        }
}

/* small (+)= w col, then per channel + bias and relu (conv2d's forward). */
S_FAST static void s_wcol(const s_thin_t *a, const float *col, float *small, int acc,
                          const float *bias, int relu) {
    const int64_t p = a->p, k = a->k;
    for (int64_t o = 0; o < a->o; o++) {
        float *restrict r = small + o * p;
        const float *wo = a->wt + o * k;
        const float b = bias ? bias[o] : 0.0f;
        if (!acc)
            for (int64_t q = 0; q < p; q++)
                r[q] = b;
        else if (bias)
            for (int64_t q = 0; q < p; q++)
                r[q] += b;
        for (int64_t t = 0; t < k; t++) {
            const float wv = wo[t];
            const float *restrict c = col + t * p;
            for (int64_t q = 0; q < p; q++)
                r[q] += wv * c[q];
        }
        if (relu)
            for (int64_t q = 0; q < p; q++)
                r[q] = r[q] > 0.0f ? r[q] : 0.0f;
    }
}

/* col = w^T small (the taps' contributions before col2im). */
S_FAST static void s_wtsmall(const s_thin_t *a, const float *small, float *col) {
    const int64_t p = a->p, k = a->k;
    for (int64_t t = 0; t < k; t++) {
        float *restrict c = col + t * p;
        for (int64_t q = 0; q < p; q++)
            c[q] = 0.0f;
        for (int64_t o = 0; o < a->o; o++) {
            const float wv = a->wt[o * k + t];
            const float *restrict r = small + o * p;
            for (int64_t q = 0; q < p; q++)
                c[q] += wv * r[q];
        }
    }
}

/* A dot product over 8 fixed lanes, added in a fixed order: vectorised
 * without reassociating a scalar sum, and the same bits wherever it runs. */
S_FAST static float s_dot(const float *restrict u, const float *restrict v, int64_t n) {
    float l[8] = {0};
    int64_t q = 0;
    for (; q + 8 <= n; q += 8)
        for (int j = 0; j < 8; j++)
            l[j] += u[q + j] * v[q + j];
    for (int j = 0; q < n; q++, j++)
        l[j] += u[q] * v[q];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

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

/* The column matrix of one range (each range one thread's images): NULL,
 * and the call marked failed, when memory is short. */
static float *s_col(s_thin_t *a) {
    float *col = malloc((size_t)(a->k * a->p) * sizeof *col);
    if (!col)
        atomic_store(&a->nomem, 1);
    return col;
}

static void s_fwd_range(void *arg, size_t lo, size_t hi) {
    s_thin_t *a = arg;
    float *col = s_col(a);
    if (!col)
        return;
    const int64_t plane = a->h * a->w, sm = a->o * a->p;
    for (size_t n = lo; n < hi; n++) {
        if (!a->transposed) {
            s_im2col(a, a->big + n * plane, col);
            s_wcol(a, col, a->out + n * sm, 0, a->bias, a->relu);
        } else {
            float *y = a->out + n * plane;
            s_wtsmall(a, a->small + n * sm, col);
            s_col2im(a, col, y, 0);
            if (a->bias || a->relu) {
                const float b = a->bias ? a->bias[0] : 0.0f;
                for (int64_t q = 0; q < plane; q++) {
                    const float v = y[q] + b;
                    y[q] = a->relu && v < 0.0f ? 0.0f : v;
                }
            }
        }
    }
    free(col);
}

static void s_bwd_range(void *arg, size_t lo, size_t hi) {
    s_thin_t *a = arg;
    float *col = s_col(a);
    if (!col)
        return;
    const int64_t plane = a->h * a->w, sm = a->o * a->p;
    const int64_t stride = a->o * a->k + a->nb;
    for (size_t n = lo; n < hi; n++) {
        const float *big = a->big + n * plane, *small = a->small + n * sm;
        float *part = a->part ? a->part + n * stride : NULL;
        /* the bias: conv2d's per channel of dy (small), the transposed
         * conv's one channel of dy (big) */
        if (part && a->nb == a->o)
            for (int64_t o = 0; o < a->o; o++)
                part[a->o * a->k + o] = s_sum(small + o * a->p, a->p);
        else if (part && a->nb == 1)
            part[a->o * a->k] = s_sum(big, plane);
        s_im2col(a, big, col);
        if (part && a->wt_grad)
            for (int64_t o = 0; o < a->o; o++)
                for (int64_t t = 0; t < a->k; t++)
                    part[o * a->k + t] = s_dot(small + o * a->p, col + t * a->p, a->p);
        if (!a->dx)
            continue;
        if (a->transposed) { /* dx = A(dy): x's side is small */
            s_wcol(a, col, a->dx + n * sm, a->dx_acc, NULL, 0);
        } else {             /* dx = A^T(dy) */
            s_wtsmall(a, small, col);
            s_col2im(a, col, a->dx + n * plane, a->dx_acc);
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
    return !c->blk16 && s_dim(c->attr->groups) == 1 && big->ndim == 4 && big->d[1] == 1 &&
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
    a->wt = c->x[1];
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
    tp_cpu_team(tp_cpu_threads());
    tp_cpu_parallel((size_t)a.n, 1, 1, s_fwd_range, &a);
    return atomic_load(&a.nomem) ? s_nomem(c, &a) : TP_OK;
}

tp_status_t tp_conv_thin_backward(const tp_op_call_t *c) {
    s_thin_t a;
    s_geom(c, &a);
    /* the plane A reads: conv2d's x, the transposed conv's dy */
    a.big = a.transposed ? c->dy : c->x[0];
    a.small = a.transposed ? c->x[0] : c->dy;
    a.dx = c->dx[0];
    a.dx_acc = c->dx_acc[0];
    a.wt_grad = c->dx[1] != NULL;
    float *db = c->ninputs > 2 ? c->dx[2] : NULL;
    a.nb = db ? (a.transposed ? 1 : a.o) : 0;
    const int64_t stride = a.o * a.k + a.nb;
    if (a.wt_grad || db) {
        a.part = malloc((size_t)(a.n * stride) * sizeof *a.part);
        if (!a.part)
            return s_nomem(c, &a);
    }
    tp_cpu_team(tp_cpu_threads());
    tp_cpu_parallel((size_t)a.n, 1, 1, s_bwd_range, &a);
    if (atomic_load(&a.nomem)) {
        free(a.part);
        return s_nomem(c, &a);
    }
    /* the images' partial sums added in image order: bits independent of
     * how the images were split over the team */
    const float fault = a.transposed ? tp_cpu_elementwise_grad_fault : 1.0f;
    for (int64_t i = 0; a.part && i < stride; i++) {
        if (i < a.o * a.k && !a.wt_grad)
            continue;
        float s = 0.0f;
        for (int64_t n = 0; n < a.n; n++)
            s += a.part[n * stride + i];
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
