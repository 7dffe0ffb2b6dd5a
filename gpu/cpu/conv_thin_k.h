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
                if (a->sw == 1)
                    for (int64_t x = lo; x < hi; x++)
                        dst[x] += r[x];
                else if (a->sw == 2)
                    for (int64_t x = lo; x < hi; x++)
                        dst[2 * x] += r[x];
                else
                    for (int64_t x = lo; x < hi; x++)
                        dst[x * a->sw] += r[x];
            }
        }
}

/* The products below take the taps [t0, t0 + k) of kt, k <= 16 (a fixed
 * array the compiler keeps in registers once k is a constant: 9 and 16,
 * the 3x3 and 4x4 kernels, are inlined as such); more taps run in chunks. */

/* out [o][pp] (+)= w col over the chunk's taps; bias (first chunk) and
 * relu (last) as asked (A's product). */
static inline __attribute__((always_inline)) void
S_K(s_wcol_k)(const float *restrict w, const float *restrict col, float *restrict out,
              int64_t o, int64_t pp, const float *bias, int relu, int add, int64_t t0,
              int64_t kt, const int64_t k) {
    for (int64_t q = 0; q < pp; q += S_W) {
        S_V cv[16];
        for (int64_t t = 0; t < k; t++)
            memcpy(&cv[t], col + (t0 + t) * pp + q, sizeof(S_V));
        for (int64_t c = 0; c < o; c++) {
            S_V acc = (S_V){0} + (bias ? bias[c] : 0.0f);
            if (add)
                memcpy(&acc, out + c * pp + q, sizeof acc);
            for (int64_t t = 0; t < k; t++)
                acc += w[c * kt + t0 + t] * cv[t];
            if (relu)
                acc = (S_V)((S_VI)acc & (acc > (S_V){0}));
            memcpy(out + c * pp + q, &acc, sizeof acc);
        }
    }
}

static void S_K(s_wcol)(const s_thin_t *a, const float *col, float *out, const float *bias,
                        int relu) {
    if (a->k == 9)
        S_K(s_wcol_k)(a->wt, col, out, a->o, a->pp, bias, relu, 0, 0, 9, 9);
    else if (a->k == 16)
        S_K(s_wcol_k)(a->wt, col, out, a->o, a->pp, bias, relu, 0, 0, 16, 16);
    else
        for (int64_t t0 = 0; t0 < a->k; t0 += 16) {
            const int64_t k = a->k - t0 < 16 ? a->k - t0 : 16;
            S_K(s_wcol_k)(a->wt, col, out, a->o, a->pp, t0 ? NULL : bias,
                          relu && t0 + k == a->k, t0 > 0, t0, a->k, k);
        }
}

/* col [t0..t0+k)[pp] = w^T small (small [o][pp]): the taps' shares
 * before col2im. */
static inline __attribute__((always_inline)) void
S_K(s_wtsmall_k)(const float *restrict w, const float *restrict small, float *restrict col,
                 int64_t o, int64_t pp, int64_t t0, int64_t kt, const int64_t k) {
    for (int64_t q = 0; q < pp; q += S_W) {
        S_V acc[16];
        for (int64_t t = 0; t < k; t++)
            acc[t] = (S_V){0};
        for (int64_t c = 0; c < o; c++) {
            S_V s;
            memcpy(&s, small + c * pp + q, sizeof s);
            for (int64_t t = 0; t < k; t++)
                acc[t] += w[c * kt + t0 + t] * s;
        }
        for (int64_t t = 0; t < k; t++)
            memcpy(col + (t0 + t) * pp + q, &acc[t], sizeof(S_V));
    }
}

static void S_K(s_wtsmall)(const s_thin_t *a, const float *small, float *col) {
    if (a->k == 9)
        S_K(s_wtsmall_k)(a->wt, small, col, a->o, a->pp, 0, 9, 9);
    else if (a->k == 16)
        S_K(s_wtsmall_k)(a->wt, small, col, a->o, a->pp, 0, 16, 16);
    else
        for (int64_t t0 = 0; t0 < a->k; t0 += 16)
            S_K(s_wtsmall_k)(a->wt, small, col, a->o, a->pp, t0, a->k,
                             a->k - t0 < 16 ? a->k - t0 : 16);
}

/* vacc [o][kt] (vectors of S_W lanes) += small col^T over the chunk's
 * taps: the filter's gradient of one image added lane by lane to its
 * group's (conv_thin.c's s_bwd_range); s_reduce adds the lanes once a
 * group. */
static inline __attribute__((always_inline)) void
S_K(s_dots_k)(const float *restrict small, const float *restrict col, float *restrict vacc,
              int64_t o, int64_t pp, int64_t t0, int64_t kt, const int64_t k) {
    for (int64_t c = 0; c < o; c++) {
        S_V acc[16];
        float *va = vacc + (c * kt + t0) * S_W;
        for (int64_t t = 0; t < k; t++)
            memcpy(&acc[t], va + t * S_W, sizeof(S_V));
        for (int64_t q = 0; q < pp; q += S_W) {
            S_V s;
            memcpy(&s, small + c * pp + q, sizeof s);
            for (int64_t t = 0; t < k; t++) {
                S_V cv;
                memcpy(&cv, col + (t0 + t) * pp + q, sizeof cv);
                acc[t] += s * cv;
            }
        }
        for (int64_t t = 0; t < k; t++)
            memcpy(va + t * S_W, &acc[t], sizeof(S_V));
    }
}

static void S_K(s_dots)(const s_thin_t *a, const float *small, const float *col, float *vacc) {
    if (a->k == 9)
        S_K(s_dots_k)(small, col, vacc, a->o, a->pp, 0, 9, 9);
    else if (a->k == 16)
        S_K(s_dots_k)(small, col, vacc, a->o, a->pp, 0, 16, 16);
    else
        for (int64_t t0 = 0; t0 < a->k; t0 += 16)
            S_K(s_dots_k)(small, col, vacc, a->o, a->pp, t0, a->k,
                          a->k - t0 < 16 ? a->k - t0 : 16);
}

/* part[i] = the lanes of vacc's entry i halved in a fixed order, for the
 * o * k entries; vacc zeroed for the next group. */
static void S_K(s_reduce)(const s_thin_t *a, float *vacc, float *part) {
    for (int64_t i = 0; i < a->o * a->k; i++) {
        float *l = vacc + i * S_W;
        for (int h = S_W / 2; h >= 1; h /= 2)
            for (int j = 0; j < h; j++)
                l[j] += l[j + h];
        part[i] = l[0];
        memset(l, 0, S_W * sizeof *l);
    }
}

/* ---- conv2d's y and dy in nChw16c: vectors over 16 output channels ----- */

/* y16 [o/16][p][16] = w col + bias, relu'd: each pixel's 16 channels one
 * (AVX-512) or two vectors, k broadcast-and-FMA steps from the taps'
 * weights wk [k][o] (w transposed). */
static void S_K(s_wcol16)(const s_thin_t *a, const float *col, float *y16, const float *bias,
                          int relu) {
    const int64_t k = a->k, pp = a->pp;
    for (int64_t b = 0; b < a->o / 16; b++)
        for (int64_t h = 0; h < 16; h += S_W) {
            S_V wv[16], bv = (S_V){0};
            for (int64_t t = 0; t < k; t++)
                memcpy(&wv[t], a->wk + t * a->o + b * 16 + h, sizeof(S_V));
            if (bias)
                memcpy(&bv, bias + b * 16 + h, sizeof bv);
            for (int64_t q = 0; q < a->p; q++) {
                S_V acc = bv;
                for (int64_t t = 0; t < k; t++)
                    acc += col[t * pp + q] * wv[t];
                if (relu)
                    acc = (S_V)((S_VI)acc & (acc > (S_V){0}));
                memcpy(y16 + (b * a->p + q) * 16 + h, &acc, sizeof acc);
            }
        }
}

/* vacc [o/16][k + 1][16] += (dy col^T, dy's sums) for one image: the
 * filter's gradient with channels in lanes (no lanes to add up), the
 * bias's in row k. y16 (a folded relu's output, or NULL) masks dy as it is
 * read. */
static void S_K(s_dots16)(const s_thin_t *a, const float *dy16, const float *y16,
                          const float *col, float *vacc) {
    const int64_t k = a->k, pp = a->pp;
    for (int64_t b = 0; b < a->o / 16; b++)
        for (int64_t h = 0; h < 16; h += S_W) {
            float *va = vacc + b * (k + 1) * 16 + h;
            S_V acc[17];
            for (int64_t t = 0; t <= k; t++)
                memcpy(&acc[t], va + t * 16, sizeof(S_V));
            for (int64_t q = 0; q < a->p; q++) {
                S_V d;
                memcpy(&d, dy16 + (b * a->p + q) * 16 + h, sizeof d);
                if (y16) {
                    S_V yv;
                    memcpy(&yv, y16 + (b * a->p + q) * 16 + h, sizeof yv);
                    d = (S_V)((S_VI)d & (yv > (S_V){0}));
                }
                for (int64_t t = 0; t < k; t++)
                    acc[t] += col[t * pp + q] * d;
                acc[k] += d;
            }
            for (int64_t t = 0; t <= k; t++)
                memcpy(va + t * 16, &acc[t], sizeof(S_V));
        }
}
