/* towerpack gpu: Winograd F(2x2, 3x3) of our own (cpu_winograd.h): the
 * transforms, 16 channels a vector (nChw16c's block, or 16 consecutive
 * input channels of U), and the 16 GEMMs of each pass.
 *
 * The matrices (one 2x2 output tile from one 4x4 input tile):
 *   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
 *   G   = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
 *   A^T = [1 1 1 0; 0 1 -1 -1]
 * The backward passes apply their transposes (B, G^T, A) in the reverse
 * order; each transform is its 1-D form on the rows, then on the columns.
 * Why ours and not oneDNN's Winograd (F(4x4, 3x3)): on a 4x4 output (one
 * tile an image) oneDNN transforms the weights in each of the three passes
 * and runs 16-row GEMMs; here U is made once by the forward and kept for
 * both backwards, and the GEMMs have N * 4 rows (docs/history.md,
 * "Winograd F(2x2, 3x3) of our own"). */
#include "gpu/cpu/cpu_winograd.h"

#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <string.h>

#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/cpu_winograd4.h"
#include "gpu/cpu/cpu_winograd_tile.h"

#if defined(__clang__)
#define S_AVX512 __attribute__((target("avx512f")))
#else
#define S_AVX512 __attribute__((target("avx512f"), optimize("O3")))
#endif

tp_wino_t tp_wino_geom(int64_t n, int64_t c, int64_t o, int64_t h, int64_t w, int r) {
    tp_wino_t g = {(size_t)n, (size_t)c, (size_t)o, (size_t)h, (size_t)w, (size_t)r,
                   0, 0, 0, 0, 0, 1};
    g.p = (g.r + 2) * (g.r + 2);
    g.th = (g.h + g.r - 1) / g.r;
    g.tw = (g.w + g.r - 1) / g.r;
    g.t = g.n * g.th * g.tw;
    g.tp = g.r == 4 ? (g.t + 15) / 16 * 16 : g.t;
    return g;
}

size_t tp_wino_u_floats(const tp_wino_t *g) {
    return g->r == 4 ? tp_wino4_u_floats(g) : g->p * g->o * g->c;
}
size_t tp_wino_v_floats(const tp_wino_t *g) {
    return g->r == 4 ? tp_wino4_v_floats(g) : g->p * g->t * g->c;
}
size_t tp_wino_m_floats(const tp_wino_t *g) { return g->p * g->tp * g->o; }

/* ---- the 1-D transforms, four or three vectors at a time ------------------ */

/* B^T d */
S_AVX512 static inline void s_bt(const __m512 *d, __m512 *o) {
    o[0] = _mm512_sub_ps(d[0], d[2]);
    o[1] = _mm512_add_ps(d[1], d[2]);
    o[2] = _mm512_sub_ps(d[2], d[1]);
    o[3] = _mm512_sub_ps(d[1], d[3]);
}

/* B v (B^T's transpose) */
S_AVX512 static inline void s_b(const __m512 *v, __m512 *o) {
    o[0] = v[0];
    o[1] = _mm512_add_ps(_mm512_sub_ps(v[1], v[2]), v[3]);
    o[2] = _mm512_sub_ps(_mm512_add_ps(v[1], v[2]), v[0]);
    o[3] = _mm512_sub_ps(_mm512_setzero_ps(), v[3]);
}

/* G g (three in, four out) */
S_AVX512 static inline void s_g(const __m512 *g, __m512 *o) {
    const __m512 h = _mm512_set1_ps(0.5f), ae = _mm512_add_ps(g[0], g[2]);
    o[0] = g[0];
    o[1] = _mm512_mul_ps(h, _mm512_add_ps(ae, g[1]));
    o[2] = _mm512_mul_ps(h, _mm512_sub_ps(ae, g[1]));
    o[3] = g[2];
}

/* G^T u (four in, three out) */
S_AVX512 static inline void s_gt(const __m512 *u, __m512 *o) {
    const __m512 h = _mm512_set1_ps(0.5f);
    const __m512 s = _mm512_mul_ps(h, _mm512_add_ps(u[1], u[2]));
    o[0] = _mm512_add_ps(u[0], s);
    o[1] = _mm512_mul_ps(h, _mm512_sub_ps(u[1], u[2]));
    o[2] = _mm512_add_ps(s, u[3]);
}

/* A^T m (four in, two out) */
S_AVX512 static inline void s_at(const __m512 *m, __m512 *o) {
    o[0] = _mm512_add_ps(_mm512_add_ps(m[0], m[1]), m[2]);
    o[1] = _mm512_sub_ps(_mm512_sub_ps(m[1], m[2]), m[3]);
}

/* A y (two in, four out) */
S_AVX512 static inline void s_a(const __m512 *y, __m512 *o) {
    o[0] = y[0];
    o[1] = _mm512_add_ps(y[0], y[1]);
    o[2] = _mm512_sub_ps(y[0], y[1]);
    o[3] = _mm512_sub_ps(_mm512_setzero_ps(), y[1]);
}

/* ---- the weights ----------------------------------------------------------- */

/* Output channels [lo, hi): U[p][k][c..c+15] from w[k][c..c+15][3][3]:
 * the 16 kernels' 144 floats turned tap-major through a small buffer (a
 * plain copy loop: 10% faster than 9 gathers of 16 taps 9 floats apart). */
S_AVX512 static void s_weights_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_job_t *j = arg;
    const size_t c = j->g->c, plane = j->g->o * c;
    float tap[9][16] __attribute__((aligned(64)));
    for (size_t k = lo; k < hi; k++)
        for (size_t c0 = 0; c0 < c; c0 += 16) {
            const float *w = j->src + (k * c + c0) * 9;
            for (int l = 0; l < 16; l++)
                for (int i = 0; i < 9; i++)
                    tap[i][l] = w[l * 9 + i];
            __m512 t[4][3], col[3], row[4];
            for (int q = 0; q < 3; q++) { /* column q: G on taps q, 3 + q, 6 + q */
                for (int r = 0; r < 3; r++)
                    col[r] = _mm512_load_ps(tap[3 * r + q]);
                s_g(col, row);
                for (int r = 0; r < 4; r++)
                    t[r][q] = row[r];
            }
            tp_wino_rows_store(s_g, 4, 3, 4, t[0], j->dst + k * c + c0, plane);
        }
}

void tp_wino_weights(const tp_wino_t *g, const float *w, float *u) {
    if (g->r == 4) /* made in blocks inside F(4x4)'s passes */
        return;
    tp_wino_job_t j = {g, w, NULL, u, 0, 0};
    tp_cpu_parallel(g->o, 1, 16, s_weights_range, &j);
}

/* Output channels [lo, hi): dw[k][c..c+15] = G^T dU G, stored or added
 * through a small tap-major buffer (tp_wino_taps_out). */
S_AVX512 static void s_dweights_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_job_t *j = arg;
    const size_t c = j->g->c, plane = j->g->o * c;
    float tap[9][16] __attribute__((aligned(64)));
    for (size_t k = lo; k < hi; k++)
        for (size_t c0 = 0; c0 < c; c0 += 16) {
            const float *du = j->src + k * c + c0;
            float *w = j->dst + (k * c + c0) * 9;
            __m512 t[3][4];
            tp_wino_cols_load(s_gt, 4, 3, du, plane, t[0]);
            tp_wino_rows_taps(s_gt, 4, t[0], tap);
            tp_wino_taps_out(w, (const float(*)[16])tap, j->add);
        }
}

/* ---- the activations ------------------------------------------------------- */

/* Blocks [lo, hi) of x (image n, 16 channels b: item n * C/16 + b): V's
 * rows of the image's tiles, columns b * 16.. */
S_AVX512 static void s_input_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t cb = g->c / 16, plane = g->t * g->c;
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / cb, b = it % cb;
        const float *x = j->src + it * g->h * g->w * 16;
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                __m512 t[4][4];
                tp_wino_cols_pixels(s_bt, 4, 4, g, x, 2 * ti, 2 * tj, 1, t[0]);
                float *v = j->dst + ((n * g->th + ti) * g->tw + tj) * g->c + b * 16;
                tp_wino_rows_store(s_bt, 4, 4, 4, t[0], v, plane);
            }
    }
}

void tp_wino_input(const tp_wino_t *g, const float *x, float *v) {
    if (g->r == 4) {
        tp_wino4_input(g, x, v);
        return;
    }
    tp_wino_job_t j = {g, x, NULL, v, 0, 0};
    tp_cpu_parallel(g->n * (g->c / 16), 1, 4, s_input_range, &j);
}

/* Blocks [lo, hi) of y: A^T M A of its 2x2 tiles, plus the bias, through
 * the relu (tp_wino_output_range). */
S_AVX512 static void s_output_range(void *arg, size_t lo, size_t hi) {
    tp_wino_output_range(arg, lo, hi, s_at, 2, 4);
}

/* Blocks [lo, hi) of dy: dM = A dy A^T of its 2x2 tiles. */
S_AVX512 static void s_grad_output_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t ob = g->o / 16, plane = g->t * g->o;
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / ob, b = it % ob;
        const float *dy = j->src + it * g->h * g->w * 16;
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                __m512 t[4][2];
                tp_wino_cols_pixels(s_a, 2, 4, g, dy, 2 * ti, 2 * tj, 0, t[0]);
                float *m = j->dst + ((n * g->th + ti) * g->tw + tj) * g->o + b * 16;
                tp_wino_rows_store(s_a, 4, 2, 4, t[0], m, plane);
            }
    }
}

void tp_wino_grad_output(const tp_wino_t *g, const float *dy, float *dm) {
    if (g->r == 4) {
        tp_wino4_grad_output(g, dy, dm);
        return;
    }
    tp_wino_job_t j = {g, dy, NULL, dm, 0, 0};
    tp_cpu_parallel(g->n * (g->o / 16), 1, 4, s_grad_output_range, &j);
}

/* Blocks [lo, hi) of dx (image n, 16 channels b): the sum of B dV B^T
 * over the image's tiles (neighbours overlap by two rows or columns: one
 * item owns all of a block's tiles, so no two threads add to one place). */
S_AVX512 static void s_grad_input_range(void *arg, size_t lo, size_t hi) {
    const tp_wino_job_t *j = arg;
    const tp_wino_t *g = j->g;
    const size_t cb = g->c / 16, plane = g->t * g->c;
    for (size_t it = lo; it < hi; it++) {
        const size_t n = it / cb, b = it % cb;
        float *dx = j->dst + it * g->h * g->w * 16;
        if (!j->add)
            memset(dx, 0, g->h * g->w * 16 * sizeof(float));
        for (size_t ti = 0; ti < g->th; ti++)
            for (size_t tj = 0; tj < g->tw; tj++) {
                const float *v = j->src + ((n * g->th + ti) * g->tw + tj) * g->c + b * 16;
                __m512 t[4][4];
                tp_wino_cols_load(s_b, 4, 4, v, plane, t[0]);
                tp_wino_rows_add(s_b, 4, t[0], g, dx, (long)(2 * ti) - 1, (long)(2 * tj) - 1);
            }
    }
}

/* ---- the passes ------------------------------------------------------------ */

/* The 16 products c_p = op(a_p) op(b_p) (row-major, oneDNN's sgemm on the
 * calling thread's team); ta / tb: 'N' or 'T', m x n x k as sgemm's. */
static tp_status_t s_gemms(char ta, char tb, size_t m, size_t n, size_t k, const float *a,
                           size_t lda, const float *b, size_t ldb, float *c,
                           const char *name) {
    const size_t sa = m * k, sb = k * n, sc = m * n;
    for (size_t p = 0; p < 16; p++) {
        const dnnl_status_t st =
            dnnl_sgemm(ta, tb, (dnnl_dim_t)m, (dnnl_dim_t)n, (dnnl_dim_t)k, 1.0f, a + p * sa,
                       (dnnl_dim_t)lda, b + p * sb, (dnnl_dim_t)ldb, 0.0f, c + p * sc,
                       (dnnl_dim_t)n);
        if (st != dnnl_success)
            return tp_error(TP_ERR_DEVICE,
                            "%s: Winograd F(2x2, 3x3): oneDNN's sgemm (%zu x %zu x %zu, "
                            "position %zu) failed: %s",
                            name, m, n, k, p, dnnl_status2str(st));
    }
    return TP_OK;
}

tp_status_t tp_wino_forward(const tp_wino_t *g, const float *v, float *u, const float *w,
                            const float *b, int relu, float *m, float *y, const char *name) {
    if (g->r == 4) {
        tp_wino4_forward(g, v, w, u, b, relu, m, y);
        return TP_OK;
    }
    TP_TRY(s_gemms('N', 'T', g->t, g->o, g->c, v, g->c, u, g->c, m, name));
    tp_wino_job_t j = {g, m, b, y, relu, 0};
    tp_cpu_parallel(g->n * (g->o / 16), 1, 4, s_output_range, &j);
    return TP_OK;
}

tp_status_t tp_wino_backward_data(const tp_wino_t *g, const float *dm, float *u,
                                  const float *w, float *dv, float *dx, int add,
                                  const char *name) {
    if (g->r == 4) {
        tp_wino4_backward_data(g, dm, w, u, dv, dx, add);
        return TP_OK;
    }
    TP_TRY(s_gemms('N', 'N', g->t, g->c, g->o, dm, g->o, u, g->c, dv, name));
    tp_wino_job_t j = {g, dv, NULL, dx, 0, add};
    tp_cpu_parallel(g->n * (g->c / 16), 1, 4, s_grad_input_range, &j);
    return TP_OK;
}

tp_status_t tp_wino_backward_weights(const tp_wino_t *g, const float *dm, const float *v,
                                     float *du, float *dw, int add, const char *name) {
    if (g->r == 4) {
        tp_wino4_backward_weights(g, dm, v, du, dw, add);
        return TP_OK;
    }
    TP_TRY(s_gemms('T', 'N', g->o, g->c, g->t, dm, g->o, v, g->c, du, name));
    tp_wino_job_t j = {g, du, NULL, dw, 0, add};
    tp_cpu_parallel(g->o, 1, 16, s_dweights_range, &j);
    return TP_OK;
}
