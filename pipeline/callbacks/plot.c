/* towerpack pipeline: training curves (stats.json and steps.tsv) drawn with
 * cairo into a PNG, and CurvePlotter, which redraws them at every epoch end.
 *
 * Six panels against the global step: the training loss and accuracy per
 * step (raw, faint, and smoothed as TensorBoard smooths: an exponential
 * moving average with debiasing) with the epoch's validation values as
 * markers; then per epoch the learning rate (log scale), throughput, the
 * input queue's fill and the processes' memory. cairo draws and antialiases,
 * its toy text API finds a real font through fontconfig (DejaVu Sans), and
 * libpng encodes; the file is replaced atomically. */
#include <cairo.h>
#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/callback.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/plot.h>

#define W TP_PLOT_WIDTH
#define H TP_PLOT_HEIGHT
#define NCOLS 3
#define NROWS 2
/* TensorBoard's default smoothing weight. */
#define SMOOTHING 0.6
/* A per-step series is merged pairwise past this many points, so a run of
 * any length draws from bounded memory. */
#define MAX_STEP_POINTS 8192
#define MAX_STEP_COLS 8

/* ---- a growable series ------------------------------------------------------ */

typedef struct {
    double *x, *y;
    size_t n, cap;
} s_xy_t;

static int s_xy_push(s_xy_t *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx)
            return -1;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

static void s_xy_free(s_xy_t *s) {
    free(s->x);
    free(s->y);
    memset(s, 0, sizeof *s);
}

/* ---- steps.tsv: per-step series ---------------------------------------------
 * A header "global_step<TAB>name..." and one line per point. Points beyond
 * MAX_STEP_POINTS are merged in pairs (means), and later lines are then
 * averaged in groups of the same size: memory stays bounded. */

typedef struct {
    char names[MAX_STEP_COLS][64];
    int ncols;
    s_xy_t col[MAX_STEP_COLS];
    size_t group;                 /* lines per point (a power of two) */
    double acc_x, acc_y[MAX_STEP_COLS];
    int acc_n[MAX_STEP_COLS];
    size_t acc_lines;
} s_steps_t;

static void s_steps_free(s_steps_t *st) {
    for (int c = 0; c < MAX_STEP_COLS; c++)
        s_xy_free(&st->col[c]);
}

static void s_steps_halve(s_steps_t *st) {
    for (int c = 0; c < st->ncols; c++) {
        s_xy_t *s = &st->col[c];
        size_t k = 0;
        for (size_t i = 0; i + 1 < s->n; i += 2, k++) {
            s->x[k] = s->x[i + 1];
            s->y[k] = 0.5 * (s->y[i] + s->y[i + 1]);
        }
        if (s->n % 2)
            s->x[k] = s->x[s->n - 1], s->y[k] = s->y[s->n - 1], k++;
        s->n = k;
    }
    st->group *= 2;
}

static int s_steps_emit(s_steps_t *st) {
    if (!st->acc_lines)
        return 0;
    for (int c = 0; c < st->ncols; c++)
        if (st->acc_n[c] &&
            s_xy_push(&st->col[c], st->acc_x, st->acc_y[c] / st->acc_n[c]) < 0)
            return -1;
    memset(st->acc_y, 0, sizeof st->acc_y);
    memset(st->acc_n, 0, sizeof st->acc_n);
    st->acc_lines = 0;
    for (int c = 0; c < st->ncols; c++)
        if (st->col[c].n >= MAX_STEP_POINTS) {
            s_steps_halve(st);
            break;
        }
    return 0;
}

/* Read `path` into st (zeroed by the caller). A missing file is no error
 * (st->ncols stays 0); a malformed one is TP_ERR_FORMAT with its line. */
static tp_status_t s_read_steps(const char *path, s_steps_t *st) {
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? TP_OK : tp_error(TP_ERR_IO, "%s: %s", path, strerror(errno));
    char line[4096];
    long lineno = 0;
    tp_status_t rc = TP_OK;
    st->group = 1;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n')
            line[--len] = '\0';
        else if (!feof(f)) {
            rc = tp_error(TP_ERR_FORMAT, "%s:%ld: line longer than %zu bytes", path,
                          lineno, sizeof line - 1);
            break;
        }
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *save = NULL, *tok = strtok_r(line, "\t", &save);
        if (st->ncols == 0 && !st->acc_lines && !st->col[0].n && tok &&
            !strcmp(tok, "global_step")) {
            while ((tok = strtok_r(NULL, "\t", &save)) && st->ncols < MAX_STEP_COLS)
                snprintf(st->names[st->ncols++], sizeof st->names[0], "%s", tok);
            if (st->ncols == 0) {
                rc = tp_error(TP_ERR_FORMAT, "%s:%ld: a header with no series", path, lineno);
                break;
            }
            continue;
        }
        if (st->ncols == 0) {
            rc = tp_error(TP_ERR_FORMAT, "%s:%ld: data before the header line "
                          "'global_step<TAB>name...'", path, lineno);
            break;
        }
        char *end;
        double x = tok ? strtod(tok, &end) : NAN;
        if (!tok || *end || !isfinite(x)) {
            rc = tp_error(TP_ERR_FORMAT, "%s:%ld: '%s' is not a step number", path,
                          lineno, tok ? tok : "");
            break;
        }
        st->acc_x = x;
        for (int c = 0; c < st->ncols; c++) {
            tok = strtok_r(NULL, "\t", &save);
            if (!tok) {
                rc = tp_error(TP_ERR_FORMAT, "%s:%ld: %d values, the header names %d",
                              path, lineno, c, st->ncols);
                break;
            }
            double v = strtod(tok, &end);
            if (*end) {
                rc = tp_error(TP_ERR_FORMAT, "%s:%ld: '%s' is not a number", path,
                              lineno, tok);
                break;
            }
            if (isfinite(v)) {  /* nan: no value this step */
                st->acc_y[c] += v;
                st->acc_n[c]++;
            }
        }
        if (rc < 0)
            break;
        if (++st->acc_lines >= st->group && s_steps_emit(st) < 0) {
            rc = tp_error(TP_ERR_NOMEM, "%s: per-step points", path);
            break;
        }
    }
    if (rc == TP_OK && ferror(f))
        rc = tp_error(TP_ERR_IO, "%s: read error", path);
    if (rc == TP_OK && s_steps_emit(st) < 0)
        rc = tp_error(TP_ERR_NOMEM, "%s: per-step points", path);
    fclose(f);
    return rc;
}

/* TensorBoard's smoothing: an EMA started at 0 and divided by the weight
 * the start still has (1 - w^n), so the first points are not pulled down. */
static void s_smooth(const s_xy_t *in, s_xy_t *out, double w) {
    double last = 0;
    int n = 0;
    for (size_t i = 0; i < in->n; i++) {
        double y = in->y[i];
        if (!isfinite(y)) {
            s_xy_push(out, in->x[i], y);
            continue;
        }
        last = last * w + (1 - w) * y;
        n++;
        s_xy_push(out, in->x[i], last / (1 - pow(w, n)));
    }
}

/* ---- drawing -------------------------------------------------------------------- */

typedef struct { double r, g, b; } s_rgb_t;

static const s_rgb_t s_palette[] = {
    {31 / 255., 119 / 255., 180 / 255.}, {255 / 255., 127 / 255., 14 / 255.},
    {44 / 255., 160 / 255., 44 / 255.},  {214 / 255., 39 / 255., 40 / 255.},
    {148 / 255., 103 / 255., 189 / 255.}, {140 / 255., 86 / 255., 75 / 255.}};
#define NPALETTE (int)(sizeof s_palette / sizeof s_palette[0])

typedef enum { S_LINE, S_RAW, S_MARKERS } s_style_t;

typedef struct {
    char label[96];
    s_xy_t xy;
    s_style_t style;
    int color;
} s_series_t;

#define MAX_SERIES 8

typedef struct {
    const char *title;
    int log_y, from_zero, unit_range;  /* unit_range: y in [0, 1] */
    s_series_t s[MAX_SERIES];
    int ns;
} s_panel_t;

static s_series_t *s_panel_add(s_panel_t *p, const char *label, s_style_t style,
                               int color) {
    if (p->ns == MAX_SERIES)
        return NULL;
    s_series_t *s = &p->s[p->ns++];
    memset(s, 0, sizeof *s);
    snprintf(s->label, sizeof s->label, "%s", label);
    s->style = style;
    s->color = color % NPALETTE;
    return s;
}

static void s_panel_free(s_panel_t *p) {
    for (int i = 0; i < p->ns; i++)
        s_xy_free(&p->s[i].xy);
    p->ns = 0;
}

static void s_fmt(double v, char *buf, size_t size) {
    double a = fabs(v);
    if (v == 0)
        snprintf(buf, size, "0");
    else if (a >= 1e6 || a < 1e-3)
        snprintf(buf, size, "%.0e", v);
    else if (a >= 1e4 && fmod(a, 1000) == 0)
        snprintf(buf, size, "%gk", v / 1000);
    else
        snprintf(buf, size, "%.4g", v);
}

/* Ticks at 1, 2 or 5 times a power of ten, about `want` of them. */
static double s_tick_step(double lo, double hi, int want) {
    double raw = (hi - lo) / want;
    double p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
}

static void s_text(cairo_t *cr, double x, double y, const char *s, double size,
                   int bold, double align /* 0 left, 0.5 centre, 1 right */) {
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - align * e.x_advance, y);
    cairo_show_text(cr, s);
}

/* The x range every panel shares (so epochs line up): 0 to the last step. */
static void s_x_range(const s_panel_t *panels, int n, double *xmin, double *xmax) {
    *xmin = INFINITY, *xmax = -INFINITY;
    for (int j = 0; j < n; j++)
        for (int k = 0; k < panels[j].ns; k++)
            for (size_t i = 0; i < panels[j].s[k].xy.n; i++)
                if (isfinite(panels[j].s[k].xy.x[i]) && isfinite(panels[j].s[k].xy.y[i])) {
                    *xmin = fmin(*xmin, panels[j].s[k].xy.x[i]);
                    *xmax = fmax(*xmax, panels[j].s[k].xy.x[i]);
                }
    if (!isfinite(*xmin))
        return;
    if (*xmin > 0 && *xmin < 0.3 * *xmax)
        *xmin = 0;
    if (*xmax == *xmin)
        *xmin -= 1, *xmax += 1;
    double pad = (*xmax - *xmin) * 0.02;  /* the last epoch's marker whole */
    *xmax += pad;
    if (*xmin != 0)
        *xmin -= pad;
}

static void s_draw_panel(cairo_t *cr, s_panel_t *p, double px, double py, double pw,
                         double ph, double xmin, double xmax) {
    double left = px + 78, right = px + pw - 20, top = py + 62, bottom = py + ph - 46;
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    s_text(cr, px + 16, py + 24, p->title, 16, 1, 0);
    double ymin = INFINITY, ymax = -INFINITY;
    for (int k = 0; k < p->ns; k++)
        for (size_t i = 0; i < p->s[k].xy.n; i++) {
            double x = p->s[k].xy.x[i], y = p->s[k].xy.y[i];
            if (!isfinite(y) || !isfinite(x) || (p->log_y && y <= 0))
                continue;
            if (p->log_y)
                y = log10(y);
            ymin = fmin(ymin, y), ymax = fmax(ymax, y);
        }
    cairo_set_line_width(cr, 1);
    if (!isfinite(ymin) || !isfinite(xmin)) {
        cairo_set_source_rgb(cr, 0.55, 0.55, 0.55);
        s_text(cr, (left + right) / 2, (top + bottom) / 2, "no data", 14, 0, 0.5);
        cairo_rectangle(cr, left + 0.5, top + 0.5, right - left, bottom - top);
        cairo_stroke(cr);
        return;
    }
    if (p->from_zero && ymin > 0)
        ymin = 0;
    if (p->unit_range)
        ymin = fmin(ymin, 0), ymax = fmax(ymax, 1);
    /* equal up to rounding (an accuracy of 1 and 0.99999999999999989)
     * counts as equal: a range below the doubles' resolution gave a tick
     * step that t += step could not move past, and the loop below never
     * ended (a run whose validation cost reached 0 hung at its epoch end) */
    if (ymax - ymin <= fabs(ymax) * 1e-12) {
        double d = p->log_y ? 0.5 : fmax(1e-9, fabs(ymin) * 0.1);
        ymin -= d, ymax += d;
    }
    double pad = (ymax - ymin) * 0.05;
    if (!(p->from_zero && ymin == 0))
        ymin -= pad;
    ymax += pad;
#define X(v) (left + (right - left) * ((v) - xmin) / (xmax - xmin))
#define Y(v) (bottom - (bottom - top) * ((v) - ymin) / (ymax - ymin))
    /* grid and tick labels */
    char buf[32];
    double ys = p->log_y ? fmax(1, round(s_tick_step(ymin, ymax, 4))) : s_tick_step(ymin, ymax, 5);
    for (double t = ceil(ymin / ys) * ys; t <= ymax + 1e-9 * ys; t += ys) {
        double y = round(Y(t)) + 0.5;
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, left, y);
        cairo_line_to(cr, right, y);
        cairo_stroke(cr);
        s_fmt(p->log_y ? pow(10, t) : (fabs(t) < ys * 1e-9 ? 0 : t), buf, sizeof buf);
        cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
        s_text(cr, left - 6, y + 4, buf, 12, 0, 1);
    }
    double xs = s_tick_step(xmin, xmax, 6);
    if (xs < 1)
        xs = 1;
    for (double t = ceil(xmin / xs) * xs; t <= xmax + 1e-9 * xs; t += xs) {
        double x = round(X(t)) + 0.5;
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, x, top);
        cairo_line_to(cr, x, bottom);
        cairo_stroke(cr);
        s_fmt(t, buf, sizeof buf);
        cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
        s_text(cr, x, bottom + 17, buf, 12, 0, 0.5);
    }
    s_text(cr, (left + right) / 2, bottom + 36, "global step", 12, 0, 0.5);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_rectangle(cr, left + 0.5, top + 0.5, right - left, bottom - top);
    cairo_stroke(cr);
    /* the series, clipped to the frame; legend above it */
    double lx = px + 16, ly = py + 46;
    for (int k = 0; k < p->ns; k++) {
        const s_series_t *s = &p->s[k];
        if (!s->xy.n)
            continue;
        s_rgb_t c = s_palette[s->color];
        cairo_save(cr);
        cairo_rectangle(cr, left, top, right - left, bottom - top);
        cairo_clip(cr);
        if (s->style == S_RAW)  /* TensorBoard's faint raw line under the smoothed */
            cairo_set_source_rgba(cr, c.r, c.g, c.b, 0.3);
        else
            cairo_set_source_rgb(cr, c.r, c.g, c.b);
        cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
        int open = 0;
        for (size_t i = 0; i < s->xy.n; i++) {
            double y = s->xy.y[i];
            if (!isfinite(y) || (p->log_y && y <= 0)) {
                open = 0;
                continue;
            }
            double X = X(s->xy.x[i]), Y = Y(p->log_y ? log10(y) : y);
            if (open)
                cairo_line_to(cr, X, Y);
            else
                cairo_move_to(cr, X, Y);
            open = 1;
        }
        cairo_set_line_width(cr, s->style == S_RAW ? 1.2 : s->style == S_MARKERS ? 1.5 : 2.2);
        cairo_stroke(cr);
        /* the per-epoch values as dots on their line */
        for (size_t i = 0; s->style == S_MARKERS && i < s->xy.n; i++) {
            double y = s->xy.y[i];
            if (!isfinite(y) || (p->log_y && y <= 0))
                continue;
            cairo_new_sub_path(cr);
            cairo_arc(cr, X(s->xy.x[i]), Y(p->log_y ? log10(y) : y), 3.5, 0, 2 * M_PI);
            cairo_fill(cr);
        }
        cairo_stroke(cr);
        cairo_restore(cr);
        /* legend: a swatch and the label, while the row has room */
        cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                               CAIRO_FONT_WEIGHT_NORMAL);
        cairo_set_font_size(cr, 12);
        cairo_text_extents_t e;
        cairo_text_extents(cr, s->label, &e);
        if (lx + 22 + e.x_advance > px + pw - 10 && lx > px + 16)
            continue;
        cairo_set_source_rgba(cr, c.r, c.g, c.b, s->style == S_RAW ? 0.4 : 1);
        cairo_rectangle(cr, lx, ly - 8, 16, 4);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
        s_text(cr, lx + 22, ly - 2, s->label, 12, 0, 0);
        lx += 22 + e.x_advance + 18;
    }
#undef X
#undef Y
}

/* Every record's (global_step, key) with a number; skips the others. */
static int s_collect(json_t *records, const char *key, s_xy_t *out) {
    for (size_t i = 0; i < json_array_size(records); i++) {
        json_t *r = json_array_get(records, i);
        json_t *gs = json_object_get(r, "global_step");
        json_t *v = json_object_get(r, key);
        if (!json_is_integer(gs) || !json_is_number(v))
            continue;
        if (s_xy_push(out, (double)json_integer_value(gs), json_number_value(v)) < 0)
            return -1;
    }
    return 0;
}

static int s_has_key(json_t *records, const char *key) {
    for (size_t i = 0; i < json_array_size(records); i++)
        if (json_is_number(json_object_get(json_array_get(records, i), key)))
            return 1;
    return 0;
}

/* Per-epoch series of every key in `keys` (NULL-ended) that the records
 * have; `prefix` instead takes every key that starts with it. */
static int s_add_epoch_keys(s_panel_t *p, json_t *records, const char *const *keys,
                            int color) {
    for (int i = 0; keys[i]; i++) {
        if (!s_has_key(records, keys[i]))
            continue;
        s_series_t *s = s_panel_add(p, keys[i], S_MARKERS, color++);
        if (s && s_collect(records, keys[i], &s->xy) < 0)
            return -1;
    }
    return 0;
}

/* A metric's panel: the per-step series (raw and smoothed) when steps.tsv
 * has it, else the epoch means; then the validation values per epoch. */
static int s_metric_panel(s_panel_t *p, json_t *records, const s_steps_t *st,
                          const char *const *names) {
    int have_steps = 0;
    for (int i = 0; names[i] && !have_steps; i++)
        for (int c = 0; c < st->ncols; c++)
            if (!strcmp(st->names[c], names[i]) && st->col[c].n) {
                char label[96];
                snprintf(label, sizeof label, "per step");
                s_series_t *raw = s_panel_add(p, label, S_RAW, 0);
                snprintf(label, sizeof label, "smoothed (%.1f)", SMOOTHING);
                s_series_t *sm = s_panel_add(p, label, S_LINE, 0);
                for (size_t k = 0; raw && k < st->col[c].n; k++)
                    if (s_xy_push(&raw->xy, st->col[c].x[k], st->col[c].y[k]) < 0)
                        return -1;
                if (sm)
                    s_smooth(&st->col[c], &sm->xy, SMOOTHING);
                have_steps = 1;
                break;
            }
    int color = 1;
    for (int i = 0; names[i]; i++) {
        char key[96];
        if (!have_steps && s_has_key(records, names[i])) {
            snprintf(key, sizeof key, "epoch mean");
            s_series_t *s = s_panel_add(p, key, S_MARKERS, 0);
            if (s && s_collect(records, names[i], &s->xy) < 0)
                return -1;
            have_steps = 1;
        }
        snprintf(key, sizeof key, "validation_%s", names[i]);
        if (s_has_key(records, key)) {
            s_series_t *s = s_panel_add(p, "validation", S_MARKERS, color++);
            if (s && s_collect(records, key, &s->xy) < 0)
                return -1;
        }
    }
    return 0;
}

/* Every key of the records that starts with `prefix` and ends with `suffix`
 * (the forked workers' memory/workerN_rss_mb), at most `max`. */
static int s_add_matching(s_panel_t *p, json_t *records, const char *prefix,
                          const char *suffix, int color, int max) {
    json_t *last = json_array_get(records, json_array_size(records) - 1);
    const char *key;
    json_t *v;
    int n = 0;
    size_t lp = strlen(prefix), ls = strlen(suffix);
    json_object_foreach(last, key, v) {
        size_t lk = strlen(key);
        if (n == max || lk < lp + ls || strncmp(key, prefix, lp) ||
            strcmp(key + lk - ls, suffix) || !json_is_number(v))
            continue;
        s_series_t *s = s_panel_add(p, key, S_MARKERS, color + n);
        if (s && s_collect(records, key, &s->xy) < 0)
            return -1;
        n++;
    }
    return 0;
}

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int nomem;
} s_buf_t;

static void s_png_sink(png_structp png, png_bytep data, size_t len) {
    s_buf_t *b = png_get_io_ptr(png);
    if (b->nomem)
        return;
    if (b->n + len > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->n + len)
            cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->nomem = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
}

static void s_png_flush(png_structp png) { (void)png; }

/* The surface as an RGB PNG in memory, by libpng directly rather than
 * cairo_surface_write_to_png: cairo lets libpng try every row filter at
 * its default compression, which took 555 of the 596 million instructions
 * of a plot (callgrind, the default run's curves); no filter and zlib's
 * level 1 take 123 million for a file of 127 KB instead of 86 KB (the SUB
 * filter or zlib's RLE strategy cost more here, not less). */
static int s_encode_png(cairo_surface_t *surf, s_buf_t *out) {
    cairo_surface_flush(surf);
    int w = cairo_image_surface_get_width(surf), h = cairo_image_surface_get_height(surf);
    int stride = cairo_image_surface_get_stride(surf);
    unsigned char *data = cairo_image_surface_get_data(surf);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return -1;
    }
    png_set_write_fn(png, out, s_png_sink, s_png_flush);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_set_filter(png, PNG_FILTER_TYPE_BASE, PNG_FILTER_NONE);
    png_set_compression_level(png, 1);
    png_write_info(png, info);
    /* cairo's RGB24 pixel is a native-endian 32-bit xRGB word: on a
     * little-endian host the bytes B, G, R, x */
    png_set_bgr(png);
    png_set_filler(png, 0, PNG_FILLER_AFTER);
    for (int y = 0; y < h; y++)
        png_write_row(png, data + (size_t)y * stride);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return out->nomem ? -1 : 0;
}

tp_status_t tp_plot_stats(const char *stats_json, const char *png_path) {
    json_error_t err;
    json_t *records = json_load_file(stats_json, 0, &err);
    if (!records)
        return tp_error(TP_ERR_FORMAT, "%s: line %d, column %d: %s", stats_json,
                        err.line, err.column, err.text);
    if (!json_is_array(records)) {
        json_decref(records);
        return tp_error(TP_ERR_FORMAT, "%s: not a list of epoch records", stats_json);
    }
    /* steps.tsv beside stats.json */
    char steps_path[4200];
    const char *slash = strrchr(stats_json, '/');
    snprintf(steps_path, sizeof steps_path, "%.*s%s",
             slash ? (int)(slash - stats_json + 1) : 0, stats_json, TP_PLOT_STEPS_FILE);
    s_steps_t *st = calloc(1, sizeof *st);
    s_panel_t *panels = calloc(NCOLS * NROWS, sizeof *panels);
    tp_status_t rc = TP_OK;
    if (!st || !panels) {
        rc = tp_error(TP_ERR_NOMEM, "plot");
        goto out;
    }
    if ((rc = s_read_steps(steps_path, st)) < 0)
        goto out;
    static const char *const loss[] = {"cost", "loss", NULL};
    static const char *const acc[] = {"accuracy", NULL};
    static const char *const lr[] = {"learning_rate", NULL};
    static const char *const tput[] = {"throughput", NULL};
    static const char *const fill[] = {"QueueInput/queue_fill", NULL};
    static const char *const mem[] = {"memory/rss_mb", "memory/peak_rss_mb", NULL};
    panels[0] = (s_panel_t){.title = "training loss"};
    panels[1] = (s_panel_t){.title = "accuracy"};
    panels[2] = (s_panel_t){.title = "learning rate"};
    panels[3] = (s_panel_t){.title = "throughput (samples/s)", .from_zero = 1};
    panels[4] = (s_panel_t){.title = "input queue fill", .from_zero = 1, .unit_range = 1};
    panels[5] = (s_panel_t){.title = "memory, resident (MB)", .from_zero = 1};
    if (s_metric_panel(&panels[0], records, st, loss) < 0 ||
        s_metric_panel(&panels[1], records, st, acc) < 0 ||
        s_add_epoch_keys(&panels[2], records, lr, 0) < 0 ||
        s_add_epoch_keys(&panels[3], records, tput, 0) < 0 ||
        s_add_epoch_keys(&panels[4], records, fill, 0) < 0 ||
        s_add_epoch_keys(&panels[5], records, mem, 0) < 0 ||
        s_add_matching(&panels[5], records, "memory/worker", "_rss_mb", 2, 4) < 0) {
        rc = tp_error(TP_ERR_NOMEM, "plot: series of %s", stats_json);
        goto out;
    }
    cairo_surface_t *surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, W, H);
    cairo_t *cr = cairo_create(surf);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    double pw = (double)W / NCOLS, ph = (double)H / NROWS, xmin, xmax;
    s_x_range(panels, NCOLS * NROWS, &xmin, &xmax);
    for (int i = 0; i < NCOLS * NROWS; i++)
        s_draw_panel(cr, &panels[i], (i % NCOLS) * pw, (i / NCOLS) * ph, pw, ph, xmin, xmax);
    cairo_status_t cs = cairo_status(cr);
    cairo_destroy(cr);
    s_buf_t png = {0};
    if (cs != CAIRO_STATUS_SUCCESS)
        rc = tp_error(cs == CAIRO_STATUS_NO_MEMORY ? TP_ERR_NOMEM : TP_ERR_IO,
                      "plot %s: cairo: %s", png_path, cairo_status_to_string(cs));
    else if (s_encode_png(surf, &png) < 0)
        rc = tp_error(TP_ERR_NOMEM, "plot %s: encoding the PNG", png_path);
    else
        rc = tp_file_write_atomic(png_path, png.p, png.n);
    cairo_surface_destroy(surf);
    free(png.p);
out:
    if (panels)
        for (int i = 0; i < NCOLS * NROWS; i++)
            s_panel_free(&panels[i]);
    free(panels);
    if (st)
        s_steps_free(st);
    free(st);
    json_decref(records);
    return rc;
}

/* ---- CurvePlotter ---------------------------------------------------------------
 * LOGDIR/curves.png redrawn after every epoch from the stats.json that
 * JSONWriter (registered before it) has just written: a running job can be
 * watched. Runs as an observer, off the step path. */

static tp_status_t plotter_trigger_epoch(void *impl, tp_trainer_t *tr) {
    (void)impl;
    const char *dir = tp_trainer_logdir(tr);
    if (!dir)
        return TP_OK;
    char js[4200], png[4200];
    snprintf(js, sizeof js, "%s/stats.json", dir);
    snprintf(png, sizeof png, "%s/curves.png", dir);
    /* A picture that cannot be drawn is worth a warning, not the run. */
    if (tp_plot_stats(js, png) < 0)
        TP_WARN("CurvePlotter: %s", tp_last_error());
    return TP_OK;
}

static const tp_callback_ops_t s_plotter_ops = {
    .name = "CurvePlotter",
    .trigger_epoch = plotter_trigger_epoch,
};

tp_callback_t *tp_cb_curve_plotter(void) {
    return tp_callback_new(&s_plotter_ops, NULL, 1);
}
