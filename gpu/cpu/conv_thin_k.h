/* towerpack gpu: the thin convolutions' inner loops (conv_thin.c), included
 * twice there: once built for AVX2 + FMA, once for the baseline x86-64 the
 * library is built for; S_K(name) names each copy. Not a header of its
 * own: it needs conv_thin.c's s_thin_t and s_v8.
 *
 * The products work on 8 pixels at a time (one vector) over rows padded
 * to a multiple of 8 (pp floats; the padding is zero), with every tap's
 * vector or accumulator in registers: k FMAs per load or store, where a
 * row-at-a-time loop paid a load and a store per FMA. */

/* The column matrix of one plane into col [k][pp]: col[t][q] = the pixel
 * tap t meets at output q, 0 in the padding. Each tap's valid columns are
 * one range [lo, hi), so the copy has no test per pixel. */
static void S_K(s_im2col)(const s_thin_t *a, const float *plane, float *col) {
    for (int64_t i = 0; i < a->kh; i++)
        for (int64_t j = 0; j < a->kw; j++) {
            float *restrict c = col + (i * a->kw + j) * a->pp;
            const int64_t off = j * a->dw - a->pw;
            int64_t lo, hi;
            s_cols(off, a->sw, a->w, a->ow, &lo, &hi);
            for (int64_t y = 0; y < a->oh; y++) {
                const int64_t ih = y * a->sh - a->ph + i * a->dh;
                float *restrict r = c + y * a->ow;
                if (ih < 0 || ih >= a->h) {
                    for (int64_t x = 0; x < a->ow; x++)
                        r[x] = 0.0f;
                    continue;
                }
                const float *src = plane + ih * a->w + off;
                for (int64_t x = 0; x < lo; x++)
                    r[x] = 0.0f;
                for (int64_t x = lo; x < hi; x++)
                    r[x] = src[x * a->sw];
                for (int64_t x = hi; x < a->ow; x++)
                    r[x] = 0.0f;
            }
        }
}

/* plane (+)= col2im(col): each tap's values added where they land, taps
 * in order. */
static void S_K(s_col2im)(const s_thin_t *a, const float *col, float *plane, int acc) {
    if (!acc)
        memset(plane, 0, (size_t)(a->h * a->w) * sizeof *plane);
    for (int64_t i = 0; i < a->kh; i++)
        for (int64_t j = 0; j < a->kw; j++) {
            const float *c = col + (i * a->kw + j) * a->pp;
            const int64_t off = j * a->dw - a->pw;
            int64_t lo, hi;
            s_cols(off, a->sw, a->w, a->ow, &lo, &hi);
            for (int64_t y = 0; y < a->oh; y++) {
                const int64_t ih = y * a->sh - a->ph + i * a->dh;
                if (ih < 0 || ih >= a->h)
                    continue;
                float *dst = plane + ih * a->w + off;
                const float *r = c + y * a->ow;
                for (int64_t x = lo; x < hi; x++)
                    dst[x * a->sw] += r[x];
            }
        }
}

/* out [o][pp] = w col + bias, relu'd (A's product). */
static inline __attribute__((always_inline)) void
S_K(s_wcol_k)(const float *restrict w, const float *restrict col, float *restrict out,
              int64_t o, int64_t pp, const float *bias, int relu, const int64_t k) {
    for (int64_t q = 0; q < pp; q += 8) {
        s_v8 cv[k];
        for (int64_t t = 0; t < k; t++)
            memcpy(&cv[t], col + t * pp + q, sizeof(s_v8));
        for (int64_t c = 0; c < o; c++) {
            s_v8 acc = (s_v8){0} + (bias ? bias[c] : 0.0f);
            for (int64_t t = 0; t < k; t++)
                acc += w[c * k + t] * cv[t];
            if (relu)
                acc = (s_v8)((s_v8i)acc & (acc > (s_v8){0}));
            memcpy(out + c * pp + q, &acc, sizeof acc);
        }
    }
}

static void S_K(s_wcol)(const s_thin_t *a, const float *col, float *out, const float *bias,
                        int relu) {
    if (a->k == 9)
        S_K(s_wcol_k)(a->wt, col, out, a->o, a->pp, bias, relu, 9);
    else if (a->k == 16)
        S_K(s_wcol_k)(a->wt, col, out, a->o, a->pp, bias, relu, 16);
    else
        S_K(s_wcol_k)(a->wt, col, out, a->o, a->pp, bias, relu, a->k);
}

/* col [k][pp] = w^T small (small [o][pp]): the taps' shares before col2im. */
static inline __attribute__((always_inline)) void
S_K(s_wtsmall_k)(const float *restrict w, const float *restrict small, float *restrict col,
                 int64_t o, int64_t pp, const int64_t k) {
    for (int64_t q = 0; q < pp; q += 8) {
        s_v8 acc[k];
        for (int64_t t = 0; t < k; t++)
            acc[t] = (s_v8){0};
        for (int64_t c = 0; c < o; c++) {
            s_v8 s;
            memcpy(&s, small + c * pp + q, sizeof s);
            for (int64_t t = 0; t < k; t++)
                acc[t] += w[c * k + t] * s;
        }
        for (int64_t t = 0; t < k; t++)
            memcpy(col + t * pp + q, &acc[t], sizeof(s_v8));
    }
}

static void S_K(s_wtsmall)(const s_thin_t *a, const float *small, float *col) {
    if (a->k == 9)
        S_K(s_wtsmall_k)(a->wt, small, col, a->o, a->pp, 9);
    else if (a->k == 16)
        S_K(s_wtsmall_k)(a->wt, small, col, a->o, a->pp, 16);
    else
        S_K(s_wtsmall_k)(a->wt, small, col, a->o, a->pp, a->k);
}

/* part [o][k] = small col^T: each (channel, tap) a sum over the pixels in
 * 8 lanes, the lanes added in a fixed order. */
static inline __attribute__((always_inline)) void
S_K(s_dots_k)(const float *restrict small, const float *restrict col, float *restrict part,
              int64_t o, int64_t pp, const int64_t k) {
    for (int64_t c = 0; c < o; c++) {
        s_v8 acc[k];
        for (int64_t t = 0; t < k; t++)
            acc[t] = (s_v8){0};
        for (int64_t q = 0; q < pp; q += 8) {
            s_v8 s;
            memcpy(&s, small + c * pp + q, sizeof s);
            for (int64_t t = 0; t < k; t++) {
                s_v8 cv;
                memcpy(&cv, col + t * pp + q, sizeof cv);
                acc[t] += s * cv;
            }
        }
        for (int64_t t = 0; t < k; t++) {
            const s_v8 l = acc[t];
            part[c * k + t] = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        }
    }
}

static void S_K(s_dots)(const s_thin_t *a, const float *small, const float *col, float *part) {
    if (a->k == 9)
        S_K(s_dots_k)(small, col, part, a->o, a->pp, 9);
    else if (a->k == 16)
        S_K(s_dots_k)(small, col, part, a->o, a->pp, 16);
    else
        S_K(s_dots_k)(small, col, part, a->o, a->pp, a->k);
}
