/* towerpack gpu: the CPU kernels of the convolution family (docs/ops.md):
 * conv2d (with dilation and groups), the transposed convolution, and
 * nearest and bilinear upsampling by an integer factor.
 *
 * A convolution is im2col + one OpenBLAS sgemm per group over several
 * samples side by side (wide enough products to run near peak). Its three
 * passes (forward, backward-data, backward-filter) are written once, on a
 * geometry whose "input" side is the large image and whose "output" side
 * the small one; the transposed convolution runs the same passes with the
 * roles of its input and output swapped: its forward is the conv's
 * backward-data pass, its input gradient the conv's forward, its filter
 * gradient the conv's filter pass with the two images exchanged. A plain
 * conv (dilation 1, groups 1) runs exactly the loops and products it ran
 * before the family existed, so its numbers are unchanged. */
#include <cblas.h>
#include <math.h>
#include <string.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

#include "gpu/cpu/cpu_math.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_conv.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_elementwise.h"
#include "gpu/op_geometry.h"


/* The geometry of one convolution: an image [c, h, w] ("input" side) and
 * its convolution [o, oh, ow] ("output" side) by a kernel [o, c/g, kh, kw]
 * with strides, zero padding and dilation. */
typedef struct {
    int c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, g, oh, ow;
} s_conv_t;

static s_conv_t s_conv_dims(const tp_op_call_t *c) {
    s_conv_t d;
    const tp_shape_t *big = &c->xshape[0], *small = &c->yshape;
    if (c->kind == TP_OP_CONV_TRANSPOSE) { /* the conv from y to x */
        big = &c->yshape;
        small = &c->xshape[0];
    }
    d.c = (int)big->d[1];
    d.h = (int)big->d[2];
    d.w = (int)big->d[3];
    d.o = (int)small->d[1];
    d.oh = (int)small->d[2];
    d.ow = (int)small->d[3];
    d.kh = c->attr->kh;
    d.kw = c->attr->kw;
    d.sh = c->attr->sh;
    d.sw = c->attr->sw;
    d.ph = c->attr->ph;
    d.pw = c->attr->pw;
    d.dh = c->attr->dh > 0 ? c->attr->dh : 1;
    d.dw = c->attr->dw > 0 ? c->attr->dw : 1;
    d.g = c->attr->groups > 0 ? c->attr->groups : 1;
    return d;
}

/* 1x1, stride 1, no padding, one group: x itself is the column matrix. */
static int s_conv_direct(const s_conv_t *d) {
    return d->kh == 1 && d->kw == 1 && d->sh == 1 && d->sw == 1 &&
           d->ph == 0 && d->pw == 0 && d->g == 1;
}

/* The outputs [lo, hi) of n_out whose input o*s + off lies in [0, n_in):
 * the rest read the zero padding. */
static void s_range(int off, int s, int n_in, int n_out, int *lo, int *hi) {
    const int a = -off, b = n_in - 1 - off;
    int l = a > 0 ? (a + s - 1) / s : 0;
    int h = b >= 0 ? b / s + 1 : 0;
    l = l > n_out ? n_out : l;
    h = h > n_out ? n_out : (h < l ? l : h);
    *lo = l;
    *hi = h;
}

/* col[(c*KH+i)*KW+j][oy*OW+ox] = x[c][oy*SH-PH+i*DH][ox*SW-PW+j*DW] or 0;
 * rows of col are `ld` floats apart (several samples side by side). A
 * group's rows are one block (its channels are consecutive). The rows and
 * columns that read padding are found once per tap (i, j), so the copy
 * loops carry no bounds tests: the rows are short (7 or 14 floats in the
 * autoencoder), and per-element tests cost more than the copy. */
static void s_im2col(const s_conv_t *d, const float *x, float *col,
                     size_t ld) {
    const int ow = d->ow, sw = d->sw;
    for (int ch = 0; ch < d->c; ch++) {
        const float *xc = x + (size_t)ch * d->h * d->w;
        for (int i = 0; i < d->kh; i++) {
            const int offy = i * d->dh - d->ph;
            int ylo, yhi;
            s_range(offy, d->sh, d->h, d->oh, &ylo, &yhi);
            for (int j = 0; j < d->kw; j++) {
                float *row = col + ((size_t)(ch * d->kh + i) * d->kw + j) * ld;
                const int offx = j * d->dw - d->pw;
                int lo, hi;
                s_range(offx, sw, d->w, ow, &lo, &hi);
                if (ylo > 0) /* (most taps have no padded rows: no call) */
                    memset(row, 0, sizeof(float) * (size_t)ylo * ow);
                if (yhi < d->oh)
                    memset(row + (size_t)yhi * ow, 0,
                           sizeof(float) * (size_t)(d->oh - yhi) * ow);
                for (int oy = ylo; oy < yhi; oy++) {
                    float *restrict r = row + (size_t)oy * ow;
                    const float *restrict src =
                        xc + (size_t)(oy * d->sh + offy) * d->w + offx;
                    for (int ox = 0; ox < lo; ox++)
                        r[ox] = 0.0f;
                    if (sw == 1)
                        memcpy(r + lo, src + lo, sizeof(float) * (size_t)(hi - lo));
                    else if (sw == 2)
                        for (int ox = lo; ox < hi; ox++)
                            r[ox] = src[2 * ox];
                    else
                        for (int ox = lo; ox < hi; ox++)
                            r[ox] = src[ox * sw];
                    for (int ox = hi; ox < ow; ox++)
                        r[ox] = 0.0f;
                }
            }
        }
    }
}

/* The adjoint of s_im2col: dx += scatter(col), with the same per-tap
 * ranges (padding positions have nowhere to go). */
static void s_col2im(const s_conv_t *d, const float *col, float *dx,
                     size_t ld) {
    const int ow = d->ow, sw = d->sw;
    for (int ch = 0; ch < d->c; ch++) {
        float *xc = dx + (size_t)ch * d->h * d->w;
        for (int i = 0; i < d->kh; i++) {
            const int offy = i * d->dh - d->ph;
            int ylo, yhi;
            s_range(offy, d->sh, d->h, d->oh, &ylo, &yhi);
            for (int j = 0; j < d->kw; j++) {
                const float *row =
                    col + ((size_t)(ch * d->kh + i) * d->kw + j) * ld;
                const int offx = j * d->dw - d->pw;
                int lo, hi;
                s_range(offx, sw, d->w, ow, &lo, &hi);
                for (int oy = ylo; oy < yhi; oy++) {
                    const float *restrict r = row + (size_t)oy * ow;
                    float *restrict dst =
                        xc + (size_t)(oy * d->sh + offy) * d->w + offx;
                    if (sw == 1)
                        for (int ox = lo; ox < hi; ox++)
                            dst[ox] += r[ox];
                    else if (sw == 2)
                        for (int ox = lo; ox < hi; ox++)
                            dst[2 * ox] += r[ox];
                    else
                        for (int ox = lo; ox < hi; ox++)
                            dst[ox * sw] += r[ox];
                }
            }
        }
    }
}

/* Samples per GEMM: several samples' columns side by side make the product
 * wide enough to run near peak; bounded so the buffers stay cache-sized. */
static int s_conv_batch(const s_conv_t *d) {
    const size_t ckk = (size_t)d->c * d->kh * d->kw, p = (size_t)d->oh * d->ow;
    const size_t rows = ckk > (size_t)d->o ? ckk : (size_t)d->o;
    size_t g = ((size_t)1 << 19) / (rows * p);
    return (int)(g < 1 ? 1 : g > 64 ? 64 : g);
}

/* col (or dcol) [CKK, b*P] and the O-major output [O, b*P], b samples. */
static size_t s_conv_ws_dims(const s_conv_t *d, int64_t n) {
    size_t ckk = (size_t)d->c * d->kh * d->kw, p = (size_t)d->oh * d->ow;
    size_t g = (size_t)s_conv_batch(d);
    if (g > (size_t)n)
        g = (size_t)n;
    return (ckk + (size_t)d->o) * g * p * sizeof(float);
}

/* out[O, ld] = W @ col, group by group: group k's W rows [k O/g, (k+1)
 * O/g) of C/g KK columns take col's rows [k CKK/g, (k+1) CKK/g). */
static void s_gemm_fwd(const s_conv_t *d, const float *w, const float *col,
                       float *out, size_t ld) {
    const int og = d->o / d->g, kg = d->c / d->g * d->kh * d->kw;
    for (int k = 0; k < d->g; k++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, og, (int)ld, kg,
                    1.0f, w + (size_t)k * og * kg, kg, col + (size_t)k * kg * ld,
                    (int)ld, 0.0f, out + (size_t)k * og * ld, (int)ld);
}

/* dW (beta 0: =, 1: +=) gdy @ col^T, group by group. */
static void s_gemm_filter(const s_conv_t *d, const float *gdy, const float *col,
                          float *dw, size_t ld, float beta) {
    const int og = d->o / d->g, kg = d->c / d->g * d->kh * d->kw;
    for (int k = 0; k < d->g; k++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, og, kg, (int)ld,
                    1.0f, gdy + (size_t)k * og * ld, (int)ld,
                    col + (size_t)k * kg * ld, (int)ld, beta,
                    dw + (size_t)k * og * kg, kg);
}

/* col = W^T @ gdy, group by group. */
static void s_gemm_data(const s_conv_t *d, const float *w, const float *gdy,
                        float *col, size_t ld) {
    const int og = d->o / d->g, kg = d->c / d->g * d->kh * d->kw;
    for (int k = 0; k < d->g; k++)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kg, (int)ld, og,
                    1.0f, w + (size_t)k * og * kg, kg, gdy + (size_t)k * og * ld,
                    (int)ld, 0.0f, col + (size_t)k * kg * ld, (int)ld);
}

/* The forward pass: y[n, O, P] (acc 0: =, 1: +=) conv(x) (+ bias[O]). */
static void s_pass_fwd(const s_conv_t *d, int n, const float *x,
                       const float *w, const float *bias, float *y, int acc,
                       float *ws) {
    const int ckk = d->c * d->kh * d->kw, p = d->oh * d->ow;
    const size_t xsz = (size_t)d->c * d->h * d->w;
    if (s_conv_direct(d)) {
        for (int b = 0; b < n; b++) {
            float *yb = y + (size_t)b * d->o * p;
            if (bias && !acc)
                for (int o = 0; o < d->o; o++)
                    for (int k = 0; k < p; k++)
                        yb[(size_t)o * p + k] = bias[o];
            else if (bias)
                for (int o = 0; o < d->o; o++)
                    for (int k = 0; k < p; k++)
                        yb[(size_t)o * p + k] += bias[o];
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d->o, p, ckk,
                        1.0f, w, ckk, x + (size_t)b * xsz, p,
                        (bias || acc) ? 1.0f : 0.0f, yb, p);
        }
        return;
    }
    const int group = s_conv_batch(d);
    for (int b0 = 0; b0 < n; b0 += group) {
        const int g = n - b0 < group ? n - b0 : group;
        const size_t ld = (size_t)g * p;
        float *col = ws, *out = col + (size_t)ckk * ld;
        for (int s = 0; s < g; s++)
            s_im2col(d, x + (size_t)(b0 + s) * xsz, col + (size_t)s * p, ld);
        s_gemm_fwd(d, w, col, out, ld);
        /* back to NCHW, adding the bias on the way (no extra pass) */
        for (int s = 0; s < g; s++)
            for (int o = 0; o < d->o; o++) {
                float *restrict dst = y + ((size_t)(b0 + s) * d->o + o) * p;
                const float *restrict src = out + (size_t)o * ld + (size_t)s * p;
                const float bo = bias ? bias[o] : 0.0f;
                if (acc)
                    for (int k = 0; k < p; k++)
                        dst[k] += src[k] + bo;
                else
                    for (int k = 0; k < p; k++)
                        dst[k] = src[k] + bo;
            }
    }
}

/* db[ch] (+)= sum of dy[n, ch, p] over batch and pixels. */
static void s_bias_grad(int ch, size_t p, const float *dy, int n, float *db,
                        int acc) {
    if (!acc)
        memset(db, 0, sizeof(float) * (size_t)ch);
    for (int b = 0; b < n; b++)
        for (int o = 0; o < ch; o++)
            db[o] += tp_cpu_sum8(dy + ((size_t)b * ch + o) * p, p);
}

/* The backward passes from dy [n, O, P]: the filter gradient dw (NULL:
 * none; needs x) and the data gradient dx [n, C, H, W] (NULL: none), each
 * stored or added as its acc flag says. */
static void s_pass_bwd(const s_conv_t *d, int n, const float *x,
                       const float *w, const float *dy, float *dx, int dx_acc,
                       float *dw, int dw_acc, float *ws) {
    const int ckk = d->c * d->kh * d->kw, p = d->oh * d->ow;
    const size_t xsz = (size_t)d->c * d->h * d->w;
    if (s_conv_direct(d)) {
        for (int b = 0; b < n; b++) {
            const float *dyb = dy + (size_t)b * d->o * p;
            if (dw)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d->o, ckk, p,
                            1.0f, dyb, p, x + (size_t)b * xsz, p,
                            (b == 0 && !dw_acc) ? 0.0f : 1.0f, dw, ckk);
            if (dx)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, p,
                            d->o, 1.0f, w, ckk, dyb, p,
                            dx_acc ? 1.0f : 0.0f, dx + (size_t)b * xsz, p);
        }
        return;
    }
    const int group = s_conv_batch(d);
    for (int b0 = 0; b0 < n; b0 += group) {
        const int g = n - b0 < group ? n - b0 : group;
        const size_t ld = (size_t)g * p;
        float *col = ws, *gdy = col + (size_t)ckk * ld;
        for (int s = 0; s < g; s++)
            for (int o = 0; o < d->o; o++)
                memcpy(gdy + (size_t)o * ld + (size_t)s * p,
                       dy + ((size_t)(b0 + s) * d->o + o) * p, sizeof(float) * p);
        if (dw) {
            for (int s = 0; s < g; s++)
                s_im2col(d, x + (size_t)(b0 + s) * xsz, col + (size_t)s * p, ld);
            s_gemm_filter(d, gdy, col, dw, ld,
                          (b0 == 0 && !dw_acc) ? 0.0f : 1.0f);
        }
        if (dx) {
            s_gemm_data(d, w, gdy, col, ld);
            for (int s = 0; s < g; s++) {
                float *dxb = dx + (size_t)(b0 + s) * xsz;
                if (!dx_acc)
                    memset(dxb, 0, xsz * sizeof(float));
                s_col2im(d, col + (size_t)s * p, dxb, ld);
            }
        }
    }
}

/* The transposed convolution's two weight-side gradients in one pass over
 * the batch: both read the columns of dy (the conv's large image), so dy is
 * unfolded once per group of samples, not once per gradient. dw (+)= x @
 * col^T, then dx (+)= W @ col, written into the buffer that held x's
 * O-major copy (no longer needed once dw has its product). x and dx are
 * [n, O, P], dy [n, C, H, W]; dw or dx NULL: that gradient is not wanted. */
static void s_pass_tbwd(const s_conv_t *d, int n, const float *dy,
                        const float *x, const float *w, float *dx, int dx_acc,
                        float *dw, int dw_acc, float *ws) {
    const int ckk = d->c * d->kh * d->kw, p = d->oh * d->ow;
    const size_t ysz = (size_t)d->c * d->h * d->w;
    const int group = s_conv_batch(d);
    for (int b0 = 0; b0 < n; b0 += group) {
        const int g = n - b0 < group ? n - b0 : group;
        const size_t ld = (size_t)g * p;
        float *col = ws, *gx = col + (size_t)ckk * ld;
        for (int s = 0; s < g; s++)
            s_im2col(d, dy + (size_t)(b0 + s) * ysz, col + (size_t)s * p, ld);
        if (dw) {
            for (int s = 0; s < g; s++)
                for (int o = 0; o < d->o; o++)
                    memcpy(gx + (size_t)o * ld + (size_t)s * p,
                           x + ((size_t)(b0 + s) * d->o + o) * p,
                           sizeof(float) * p);
            s_gemm_filter(d, gx, col, dw, ld, (b0 == 0 && !dw_acc) ? 0.0f : 1.0f);
        }
        if (dx) {
            s_gemm_fwd(d, w, col, gx, ld);
            for (int s = 0; s < g; s++)
                for (int o = 0; o < d->o; o++) {
                    float *restrict dst = dx + ((size_t)(b0 + s) * d->o + o) * p;
                    const float *restrict src = gx + (size_t)o * ld + (size_t)s * p;
                    if (dx_acc)
                        for (int k = 0; k < p; k++)
                            dst[k] += src[k];
                    else
                        memcpy(dst, src, sizeof(float) * p);
                }
        }
    }
}

/* The deliberate fault of the parity and finite-difference tests
 * (ops_elementwise.h): 1 in every real run, so this is a compare. */
static void s_fault(float *g, size_t n) {
    if (g && tp_cpu_elementwise_grad_fault != 1.0f)
        for (size_t i = 0; i < n; i++)
            g[i] *= tp_cpu_elementwise_grad_fault;
}

/* ---- upsampling ----------------------------------------------------------- */

/* Planes (the [n, c] images) are independent: a range of them per thread
 * (gpu/cpu/cpu_pool.h), each plane written by one call, so the values do
 * not depend on the cut. A part is at least S_UP_MIN output items. */
#define S_UP_MIN 16384

/* The horizontal taps of every output column (ow <= S_TAPS) or of the
 * chunk [c0, c1) (s_htaps): found once per call or chunk, not once per
 * row of every plane (tp_bilinear_taps divides and branches). */
enum { S_TAPS = 256 };
typedef struct {
    int i0[S_TAPS], i1[S_TAPS];
    float l0[S_TAPS], l1[S_TAPS];
} s_htaps_t;

static int s_htaps(s_htaps_t *t, int c0, int ow, int w, int f, int align) {
    const int c1 = c0 + S_TAPS < ow ? c0 + S_TAPS : ow;
    for (int o = c0; o < c1; o++)
        tp_bilinear_taps(o, w, f, align, &t->i0[o - c0], &t->i1[o - c0], &t->l0[o - c0],
               &t->l1[o - c0]);
    return c1;
}

/* The horizontal taps turned round: for each input column, the output
 * columns that read it and their weights, in the order the scatter
 * t[i0[k]] += l0[k] g[k], t[i1[k]] += l1[k] g[k] (k rising) adds them,
 * so a gather over them gives the scatter's sums, without its chain of
 * stores and reloads into one item. For w, ow <= S_TAPS. */
typedef struct {
    int start[S_TAPS + 1];
    int k[2 * S_TAPS];
    float l[2 * S_TAPS];
} s_vtaps_t;

static void s_vtaps(s_vtaps_t *v, const s_htaps_t *t, int ow, int w) {
    int cnt[S_TAPS] = {0};
    for (int k = 0; k < ow; k++) {
        cnt[t->i0[k]]++;
        cnt[t->i1[k]]++;
    }
    v->start[0] = 0;
    for (int ix = 0; ix < w; ix++) {
        v->start[ix + 1] = v->start[ix] + cnt[ix];
        cnt[ix] = v->start[ix];
    }
    for (int k = 0; k < ow; k++) {
        v->k[cnt[t->i0[k]]] = k;
        v->l[cnt[t->i0[k]]++] = t->l0[k];
        v->k[cnt[t->i1[k]]] = k;
        v->l[cnt[t->i1[k]]++] = t->l1[k];
    }
}

/* One call's geometry, read by the parts. */
typedef struct {
    const tp_op_call_t *c;
    int h, w, f, oh, ow, align;
    float fault; /* the gradient checks' factor (1 in real runs) */
} s_up_t;

static s_up_t s_up_geom(const tp_op_call_t *c) {
    const tp_shape_t *xs = &c->xshape[0];
    s_up_t u = {.c = c, .h = (int)xs->d[2], .w = (int)xs->d[3], .f = c->attr->sh,
                .align = c->attr->align_corners, .fault = tp_cpu_elementwise_grad_fault};
    u.oh = u.h * u.f;
    u.ow = u.w * u.f;
    return u;
}

static void s_up_par(const s_up_t *u, tp_cpu_range_fn fn) {
    const size_t planes = (size_t)u->c->xshape[0].d[0] * (size_t)u->c->xshape[0].d[1];
    const size_t per = (size_t)u->oh * (size_t)u->ow;
    tp_cpu_parallel(planes, 1, (S_UP_MIN + per - 1) / per, fn, (void *)u);
}

/* Blocks of input items for factor 2's adjoint below. */
#define S_UP_BLOCK 1024

/* Factor 2's adjoint, the common factor, over a part's input rows as one
 * run: rows of the autoencoder's 14 items left GCC's vector loops (16
 * lanes) to their scalar tails (the row loop below was two thirds of the
 * op at one thread). In blocks of S_UP_BLOCK input items: the pair sums
 * of dy (hz[j] = dy[2j] + dy[2j + 1], one flat loop over the block's
 * output rows, two an input row), then each input item (0 + its upper
 * pair) + its lower pair: the additions, and their order, of the row
 * loop, so the same bits; in AVX-512/AVX2/SSE2 clones (additions only:
 * nothing to contract). 0 when w is too wide for the block. (The forward
 * stays as it is: it writes four times what it reads and runs at the
 * memory's speed; a flat copy loop was slower than its memcpy.) */
TP_CPU_CLONES static int s_up_nearest2_bwd(const s_up_t *u, size_t p0, size_t p1) {
    const size_t w = (size_t)u->w, ow = 2 * w, rows = (p1 - p0) * (size_t)u->h;
    if (w > S_UP_BLOCK)
        return 0;
    const size_t rb = S_UP_BLOCK / w;
    const int acc = u->c->dx_acc[0];
    const float fault = u->fault;
    const float *dy = u->c->dy + p0 * (size_t)u->oh * ow;
    float *dx = u->c->dx[0] + p0 * (size_t)u->h * w;
    float hz[2 * S_UP_BLOCK];
    for (size_t r0 = 0; r0 < rows; r0 += rb) {
        const size_t nr = rows - r0 < rb ? rows - r0 : rb;
        const float *restrict ys = dy + r0 * 2 * ow;
        for (size_t j = 0; j < 2 * nr * w; j++)
            hz[j] = ys[2 * j] + ys[2 * j + 1];
        for (size_t r = 0; r < nr; r++) {
            const float *restrict a = hz + r * ow, *restrict b = a + w;
            float *restrict d = dx + (r0 + r) * w;
            if (acc)
                for (size_t i = 0; i < w; i++)
                    d[i] += fault * ((0.0f + a[i]) + b[i]);
            else
                for (size_t i = 0; i < w; i++)
                    d[i] = fault * ((0.0f + a[i]) + b[i]);
        }
    }
    return 1;
}

/* Nearest, planes [p0, p1): each input row's f output rows are equal, so
 * the first is written and the others copied. */
static void s_up_nearest_fwd(void *arg, size_t p0, size_t p1) {
    const s_up_t *u = arg;
    const int h = u->h, w = u->w, f = u->f, ow = u->ow;
    for (size_t pl = p0; pl < p1; pl++) {
        const float *xp = (const float *)u->c->x[0] + pl * (size_t)h * w;
        float *yp = (float *)u->c->y + pl * (size_t)u->oh * ow;
        for (int iy = 0; iy < h; iy++) {
            const float *restrict xr = xp + (size_t)iy * w;
            float *restrict yr = yp + (size_t)iy * f * ow;
            if (f == 2) /* the common factor: a loop the compiler unrolls */
                for (int ix = 0; ix < w; ix++)
                    yr[2 * ix] = yr[2 * ix + 1] = xr[ix];
            else
                for (int ix = 0; ix < w; ix++)
                    for (int k = 0; k < f; k++)
                        yr[ix * f + k] = xr[ix];
            for (int k = 1; k < f; k++)
                memcpy(yr + (size_t)k * ow, yr, sizeof(float) * (size_t)ow);
        }
    }
}

/* Nearest's adjoint, planes [p0, p1): an input item's gradient is the sum
 * of its f x f block of dy, row by row (the block's rows in order, each
 * row's f items in order), stored (or added) once: no zeroed buffer. */
static void s_up_nearest_bwd(void *arg, size_t p0, size_t p1) {
    const s_up_t *u = arg;
    const int h = u->h, w = u->w, f = u->f, ow = u->ow;
    const int acc = u->c->dx_acc[0];
    const float fault = u->fault;
    if (f == 2 && s_up_nearest2_bwd(u, p0, p1))
        return;
    float row[S_TAPS];
    for (size_t pl = p0; pl < p1; pl++) {
        float *dp = u->c->dx[0] + pl * (size_t)h * w;
        const float *yp = u->c->dy + pl * (size_t)u->oh * ow;
        for (int iy = 0; iy < h; iy++) {
            float *restrict dr = dp + (size_t)iy * w;
            for (int x0 = 0; x0 < w; x0 += S_TAPS) {
                const int nx = w - x0 < S_TAPS ? w - x0 : S_TAPS;
                for (int ix = 0; ix < nx; ix++)
                    row[ix] = 0.0f;
                for (int k = 0; k < f; k++) {
                    const float *restrict yr = yp + ((size_t)iy * f + k) * ow + (size_t)x0 * f;
                    if (f == 2)
                        for (int ix = 0; ix < nx; ix++)
                            row[ix] += yr[2 * ix] + yr[2 * ix + 1];
                    else
                        for (int ix = 0; ix < nx; ix++) {
                            float s = 0.0f;
                            for (int j = 0; j < f; j++)
                                s += yr[ix * f + j];
                            row[ix] += s;
                        }
                }
                if (acc)
                    for (int ix = 0; ix < nx; ix++)
                        dr[x0 + ix] += fault * row[ix];
                else
                    for (int ix = 0; ix < nx; ix++)
                        dr[x0 + ix] = fault * row[ix];
            }
        }
    }
}

/* Bilinear, planes [p0, p1), separably: each input row interpolated
 * across once (hr, its ow items), then every output row is a blend of two
 * such rows: lh0 (lw0 r0[w0] + lw1 r0[w1]) + lh1 (lw0 r1[w0] + lw1
 * r1[w1]), the expression the taps give, in columns of S_TAPS. */
static void s_up_bilinear_fwd(void *arg, size_t p0, size_t p1) {
    const s_up_t *u = arg;
    const int h = u->h, w = u->w, f = u->f, oh = u->oh, ow = u->ow;
    s_htaps_t ht;
    float hr[2][S_TAPS];
    for (int c0 = 0; c0 < ow; c0 += S_TAPS) {
        const int c1 = s_htaps(&ht, c0, ow, w, f, u->align), nc = c1 - c0;
        for (size_t pl = p0; pl < p1; pl++) {
            const float *xp = (const float *)u->c->x[0] + pl * (size_t)h * w;
            float *yp = (float *)u->c->y + pl * (size_t)oh * ow;
            int have[2] = {-1, -1}; /* the input rows in hr[0], hr[1] */
            for (int oy = 0; oy < oh; oy++) {
                int h0, h1;
                float lh0, lh1;
                tp_bilinear_taps(oy, h, f, u->align, &h0, &h1, &lh0, &lh1);
                const int want[2] = {h0, h1};
                for (int s = 0; s < 2; s++) {
                    if (have[s] == want[s])
                        continue;
                    if (have[1 - s] == want[s]) { /* slid down a row */
                        memcpy(hr[s], hr[1 - s], sizeof(float) * (size_t)nc);
                    } else {
                        const float *restrict r = xp + (size_t)want[s] * w;
                        for (int k = 0; k < nc; k++)
                            hr[s][k] = ht.l0[k] * r[ht.i0[k]] + ht.l1[k] * r[ht.i1[k]];
                    }
                    have[s] = want[s];
                }
                float *restrict yr = yp + (size_t)oy * ow + c0;
                for (int k = 0; k < nc; k++)
                    yr[k] = lh0 * hr[0][k] + lh1 * hr[1][k];
            }
        }
    }
}

/* Bilinear's adjoint, planes [p0, p1): each output row's dy added into its
 * two input rows' column sums (g, ow items per input row, in output row
 * order), then each input row's sums spread back to its columns by the
 * horizontal taps (in column order); per plane, so one plane's gradient
 * is whole before the next. g (h x ow) and t (one input row's w sums)
 * live in the call's workspace at the part's first plane (so two parts
 * never share them). */
static void s_up_bilinear_bwd(void *arg, size_t p0, size_t p1) {
    const s_up_t *u = arg;
    const int h = u->h, w = u->w, f = u->f, oh = u->oh, ow = u->ow;
    const int acc = u->c->dx_acc[0];
    const float fault = u->fault;
    s_htaps_t ht;
    const size_t planes = (size_t)u->c->xshape[0].d[0] * (size_t)u->c->xshape[0].d[1];
    float *g = (float *)u->c->workspace + p0 * (size_t)h * ow;
    float *t = (float *)u->c->workspace + planes * (size_t)h * ow + p0 * (size_t)w;
    const int one = ow <= S_TAPS; /* the taps found once for the part */
    s_vtaps_t vt;
    if (one) {
        s_htaps(&ht, 0, ow, w, f, u->align);
        s_vtaps(&vt, &ht, ow, w);
    }
    for (size_t pl = p0; pl < p1; pl++) {
        const float *yp = u->c->dy + pl * (size_t)oh * ow;
        float *dp = u->c->dx[0] + pl * (size_t)h * w;
        memset(g, 0, sizeof(float) * (size_t)h * ow);
        for (int oy = 0; oy < oh; oy++) {
            int h0, h1;
            float lh0, lh1;
            tp_bilinear_taps(oy, h, f, u->align, &h0, &h1, &lh0, &lh1);
            const float *restrict yr = yp + (size_t)oy * ow;
            float *restrict g0 = g + (size_t)h0 * ow;
            for (int k = 0; k < ow; k++)
                g0[k] += lh0 * yr[k];
            float *restrict g1 = g + (size_t)h1 * ow;
            for (int k = 0; k < ow; k++)
                g1[k] += lh1 * yr[k];
        }
        for (int iy = 0; iy < h; iy++) {
            const float *gr = g + (size_t)iy * ow;
            if (one) {
                for (int ix = 0; ix < w; ix++) {
                    float sum = 0.0f;
                    for (int j = vt.start[ix]; j < vt.start[ix + 1]; j++)
                        sum += vt.l[j] * gr[vt.k[j]];
                    t[ix] = sum;
                }
            } else {
                for (int ix = 0; ix < w; ix++)
                    t[ix] = 0.0f;
                for (int c0 = 0; c0 < ow; c0 += S_TAPS) {
                    const int c1 = s_htaps(&ht, c0, ow, w, f, u->align);
                    for (int k = 0; k < c1 - c0; k++) {
                        t[ht.i0[k]] += ht.l0[k] * gr[c0 + k];
                        t[ht.i1[k]] += ht.l1[k] * gr[c0 + k];
                    }
                }
            }
            float *restrict dr = dp + (size_t)iy * w;
            if (acc)
                for (int ix = 0; ix < w; ix++)
                    dr[ix] += fault * t[ix];
            else
                for (int ix = 0; ix < w; ix++)
                    dr[ix] = fault * t[ix];
        }
    }
}

static void s_up_fwd(const tp_op_call_t *c) {
    const s_up_t u = s_up_geom(c);
    s_up_par(&u, c->kind == TP_OP_UPSAMPLE_NEAREST ? s_up_nearest_fwd : s_up_bilinear_fwd);
}

static void s_up_bwd(const tp_op_call_t *c) {
    if (!c->dx[0])
        return;
    const s_up_t u = s_up_geom(c);
    s_up_par(&u, c->kind == TP_OP_UPSAMPLE_NEAREST ? s_up_nearest_bwd : s_up_bilinear_bwd);
}

/* ---- dispatch --------------------------------------------------------------- */

int tp_cpu_conv_kind(tp_op_kind_t k) {
    return k == TP_OP_CONV2D || k == TP_OP_CONV_TRANSPOSE ||
           k == TP_OP_UPSAMPLE_NEAREST || k == TP_OP_UPSAMPLE_BILINEAR;
}

size_t tp_cpu_conv_workspace(const tp_op_call_t *c) {
    switch (c->kind) {
    case TP_OP_CONV2D:
    case TP_OP_CONV_TRANSPOSE: {
        const s_conv_t d = s_conv_dims(c);
        return s_conv_ws_dims(&d, c->xshape[0].d[0]);
    }
    case TP_OP_UPSAMPLE_NEAREST: /* writes dx directly */
        return 0;
    case TP_OP_UPSAMPLE_BILINEAR: { /* per plane: h rows of ow sums, w sums */
        const tp_shape_t *xs = &c->xshape[0];
        const size_t planes = (size_t)xs->d[0] * (size_t)xs->d[1];
        return planes * ((size_t)xs->d[2] * (size_t)(xs->d[3] * c->attr->sh) +
                         (size_t)xs->d[3]) * sizeof(float);
    }
    default:
        return 0;
    }
}

tp_status_t tp_cpu_conv_forward(const tp_op_call_t *c) {
    const int n = (int)c->xshape[0].d[0];
    const float *bias = c->ninputs > 2 ? c->x[2] : NULL;
    switch (c->kind) {
    case TP_OP_CONV2D: {
        const s_conv_t d = s_conv_dims(c);
        s_pass_fwd(&d, n, c->x[0], c->x[1], bias, c->y, 0, c->workspace);
        break;
    }
    case TP_OP_CONV_TRANSPOSE: {
        /* the conv's backward-data pass from x, then the bias per channel */
        const s_conv_t d = s_conv_dims(c);
        s_pass_bwd(&d, n, NULL, c->x[1], c->x[0], c->y, 0, NULL, 0, c->workspace);
        if (bias) {
            const size_t p = (size_t)d.h * d.w;
            float *y = c->y;
            for (int b = 0; b < n; b++)
                for (int ch = 0; ch < d.c; ch++) {
                    float *restrict r = y + ((size_t)b * d.c + ch) * p;
                    const float bc = bias[ch];
                    for (size_t k = 0; k < p; k++)
                        r[k] += bc;
                }
        }
        break;
    }
    case TP_OP_UPSAMPLE_NEAREST:
    case TP_OP_UPSAMPLE_BILINEAR:
        s_up_fwd(c);
        break;
    default:
        return tp_error(TP_ERR_INVALID, "%s: %s is not a convolution-family op",
                        c->name, tp_op_name(c->kind));
    }
    return TP_OK;
}

tp_status_t tp_cpu_conv_backward(const tp_op_call_t *c) {
    const int n = (int)c->xshape[0].d[0];
    switch (c->kind) {
    case TP_OP_CONV2D: {
        const s_conv_t d = s_conv_dims(c);
        if (c->ninputs > 2 && c->dx[2])
            s_bias_grad(d.o, (size_t)d.oh * d.ow, c->dy, n, c->dx[2], c->dx_acc[2]);
        s_pass_bwd(&d, n, c->x[0], c->x[1], c->dy, c->dx[0], c->dx_acc[0],
                   c->dx[1], c->dx_acc[1], c->workspace);
        break;
    }
    case TP_OP_CONV_TRANSPOSE: {
        /* y = A^T x for the conv A from y's side to x's: dx = A dy (the
         * conv's forward of dy), dW = the conv's filter gradient with dy
         * as its image and x as its output gradient */
        const s_conv_t d = s_conv_dims(c);
        if (c->ninputs > 2 && c->dx[2]) {
            s_bias_grad(d.c, (size_t)d.h * d.w, c->dy, n, c->dx[2], c->dx_acc[2]);
            s_fault(c->dx[2], (size_t)d.c);
        }
        if (s_conv_direct(&d)) {
            if (c->dx[1])
                s_pass_bwd(&d, n, c->dy, c->x[1], c->x[0], NULL, 0, c->dx[1],
                           c->dx_acc[1], c->workspace);
            if (c->dx[0])
                s_pass_fwd(&d, n, c->dy, c->x[1], NULL, c->dx[0], c->dx_acc[0],
                           c->workspace);
        } else if (c->dx[0] || c->dx[1]) {
            s_pass_tbwd(&d, n, c->dy, c->x[0], c->x[1], c->dx[0], c->dx_acc[0],
                        c->dx[1], c->dx_acc[1], c->workspace);
        }
        if (c->dx[1])
            s_fault(c->dx[1], tp_shape_count(&c->xshape[1]));
        if (c->dx[0])
            s_fault(c->dx[0], tp_shape_count(&c->xshape[0]));
        break;
    }
    case TP_OP_UPSAMPLE_NEAREST:
    case TP_OP_UPSAMPLE_BILINEAR:
        s_up_bwd(c);
        break;
    default:
        return tp_error(TP_ERR_INVALID, "%s: %s is not a convolution-family op",
                        c->name, tp_op_name(c->kind));
    }
    return TP_OK;
}
