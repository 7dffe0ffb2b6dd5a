/* towerpack gpu: the thin convolutions' inner loops (conv_thin.c), included
 * three times there: built for AVX-512, for AVX2 + FMA, and for the baseline x86-64 the
 * library is built for; S_K(name) names each copy, S_V its vector of S_W
 * floats, S_VI the vector's comparison masks. Not a header of its own: it
 * needs conv_thin.c's s_thin_t.
 *
 * The products work on S_W pixels at a time (one vector) over rows padded
 * to a multiple of 16 (pp floats; the padding is zero), with every tap's
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
                if (a->sw == 1) /* the loops the compiler vectorises */
                    for (int64_t x = lo; x < hi; x++)
                        r[x] = src[x];
                else if (a->sw == 2)
                    for (int64_t x = lo; x < hi; x++)
                        r[x] = src[2 * x];
                else
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
    for (int64_t q = 0; q < pp; q += S_W) {
        S_V cv[k];
        for (int64_t t = 0; t < k; t++)
            memcpy(&cv[t], col + t * pp + q, sizeof(S_V));
        for (int64_t c = 0; c < o; c++) {
            S_V acc = (S_V){0} + (bias ? bias[c] : 0.0f);
            for (int64_t t = 0; t < k; t++)
                acc += w[c * k + t] * cv[t];
            if (relu)
                acc = (S_V)((S_VI)acc & (acc > (S_V){0}));
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
    for (int64_t q = 0; q < pp; q += S_W) {
        S_V acc[k];
        for (int64_t t = 0; t < k; t++)
            acc[t] = (S_V){0};
        for (int64_t c = 0; c < o; c++) {
            S_V s;
            memcpy(&s, small + c * pp + q, sizeof s);
            for (int64_t t = 0; t < k; t++)
                acc[t] += w[c * k + t] * s;
        }
        for (int64_t t = 0; t < k; t++)
            memcpy(col + t * pp + q, &acc[t], sizeof(S_V));
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
        S_V acc[k];
        for (int64_t t = 0; t < k; t++)
            acc[t] = (S_V){0};
        for (int64_t q = 0; q < pp; q += S_W) {
            S_V s;
            memcpy(&s, small + c * pp + q, sizeof s);
            for (int64_t t = 0; t < k; t++) {
                S_V cv;
                memcpy(&cv, col + t * pp + q, sizeof cv);
                acc[t] += s * cv;
            }
        }
        for (int64_t t = 0; t < k; t++) {
            /* the lanes halved in a fixed order */
            float l[S_W];
            memcpy(l, &acc[t], sizeof l);
            for (int h = S_W / 2; h >= 1; h /= 2)
                for (int i = 0; i < h; i++)
                    l[i] += l[i + h];
            part[c * k + t] = l[0];
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
