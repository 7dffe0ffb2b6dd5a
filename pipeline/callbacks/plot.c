/* towerpack pipeline: drawing stats.json as training curves into a PNG.
 *
 * Self-contained on purpose (zlib for the PNG stream, jansson for the
 * records): a small RGB canvas, lines, a 5x7 bitmap font for labels and
 * tick values, and a PNG writer. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <stdlib.h>
#include <zlib.h>
#include <towerpack/fileio.h>
#include <towerpack/plot.h>

#define W 1200
#define H 860

typedef struct {
    uint8_t px[H][W][3];
} s_canvas_t;

static void s_pixel(s_canvas_t *c, int x, int y, const uint8_t rgb[3]) {
    if (x >= 0 && x < W && y >= 0 && y < H)
        memcpy(c->px[y][x], rgb, 3);
}

static void s_rect(s_canvas_t *c, int x0, int y0, int x1, int y1, const uint8_t rgb[3]) {
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++)
            s_pixel(c, x, y, rgb);
}

/* A line `thick` pixels wide (Bresenham, stamped with a square). */
static void s_line(s_canvas_t *c, int x0, int y0, int x1, int y1, int thick,
                   const uint8_t rgb[3]) {
    int dx = abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    int dy = -abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
        s_rect(c, x0 - thick / 2, y0 - thick / 2, x0 + (thick - 1) / 2,
               y0 + (thick - 1) / 2, rgb);
        if (x0 == x1 && y0 == y1)
            break;
        int e2 = 2 * err;
        if (e2 >= dy) { err += dy; x0 += sx; }
        if (e2 <= dx) { err += dx; y0 += sy; }
    }
}

/* 5x7 glyphs, one byte per row, bit 4 the leftmost pixel. Lower-case
 * letters are drawn with the upper-case glyphs. */
static const char s_font_chars[] =
    " 0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.,:-_+/%()=e<>";
static const uint8_t s_font[][7] = {
    {0, 0, 0, 0, 0, 0, 0},                                  /* space */
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E},             /* 0 */
    {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},             /* 1 */
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F},             /* 2 */
    {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},             /* 3 */
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02},             /* 4 */
    {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},             /* 5 */
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E},             /* 6 */
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},             /* 7 */
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E},             /* 8 */
    {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C},             /* 9 */
    {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11},             /* A */
    {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E},             /* B */
    {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E},             /* C */
    {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C},             /* D */
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F},             /* E */
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10},             /* F */
    {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F},             /* G */
    {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11},             /* H */
    {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E},             /* I */
    {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C},             /* J */
    {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11},             /* K */
    {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F},             /* L */
    {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11},             /* M */
    {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11},             /* N */
    {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E},             /* O */
    {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10},             /* P */
    {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D},             /* Q */
    {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11},             /* R */
    {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E},             /* S */
    {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04},             /* T */
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E},             /* U */
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04},             /* V */
    {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A},             /* W */
    {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11},             /* X */
    {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04},             /* Y */
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F},             /* Z */
    {0, 0, 0, 0, 0, 0x0C, 0x0C},                            /* . */
    {0, 0, 0, 0, 0x0C, 0x04, 0x08},                         /* , */
    {0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0},                      /* : */
    {0, 0, 0, 0x1F, 0, 0, 0},                               /* - */
    {0, 0, 0, 0, 0, 0, 0x1F},                               /* _ */
    {0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0},                   /* + */
    {0x01, 0x01, 0x02, 0x04, 0x08, 0x10, 0x10},             /* / */
    {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03},             /* % */
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02},             /* ( */
    {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08},             /* ) */
    {0, 0, 0x1F, 0, 0x1F, 0, 0},                            /* = */
    {0, 0, 0x0E, 0x11, 0x1F, 0x10, 0x0E},                   /* e (exponent) */
    {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02},             /* < */
    {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08},             /* > */
};

/* Draw text with its top-left at (x, y), each font pixel `scale` wide. */
static int s_text(s_canvas_t *c, int x, int y, const char *s, int scale,
                  const uint8_t rgb[3]) {
    for (; *s; s++) {
        char ch = *s;
        if (ch >= 'a' && ch <= 'z' && !(ch == 'e' && s[1] && (s[1] == '-' || s[1] == '+')))
            ch = (char)(ch - 'a' + 'A');
        const char *p = strchr(s_font_chars, ch);
        int g = p ? (int)(p - s_font_chars) : 0;
        for (int r = 0; r < 7; r++)
            for (int b = 0; b < 5; b++)
                if (s_font[g][r] & (0x10 >> b))
                    s_rect(c, x + b * scale, y + r * scale, x + b * scale + scale - 1,
                           y + r * scale + scale - 1, rgb);
        x += 6 * scale;
    }
    return x;
}

static void s_fmt(double v, char *buf, size_t size) {
    double a = fabs(v);
    if (v == 0)
        snprintf(buf, size, "0");
    else if (a >= 1e5 || a < 1e-3)
        snprintf(buf, size, "%.1e", v);
    else if (a >= 100)
        snprintf(buf, size, "%.0f", v);
    else
        snprintf(buf, size, "%.3g", v);
}

/* ---- the data ---------------------------------------------------------------- */

#define MAX_SERIES 4
#define MAX_POINTS 4096

typedef struct {
    const char *key;
    double x[MAX_POINTS], y[MAX_POINTS];
    int n;
} s_series_t;

typedef struct {
    const char *title;
    const char *keys[MAX_SERIES];  /* candidate stats.json keys, NULL-ended */
    int log_y;
    int from_zero;                 /* the y axis starts at 0 (rates) */
} s_panel_t;

static const s_panel_t s_panels[4] = {
    {"loss", {"cost", "loss", "validation_cost", "validation_loss"}, 0, 0},
    {"accuracy", {"accuracy", "train_accuracy", "validation_accuracy", NULL}, 0, 0},
    {"learning rate", {"learning_rate", NULL, NULL, NULL}, 1, 0},
    {"throughput (samples/s)", {"throughput", NULL, NULL, NULL}, 0, 1},
};

static const uint8_t s_colors[MAX_SERIES][3] = {
    {31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}};
static const uint8_t s_black[3] = {20, 20, 20}, s_grid[3] = {225, 225, 225},
                     s_white[3] = {255, 255, 255}, s_grey[3] = {110, 110, 110};

static void s_collect(json_t *records, const char *key, s_series_t *s) {
    s->key = key;
    s->n = 0;
    for (size_t i = 0; i < json_array_size(records) && s->n < MAX_POINTS; i++) {
        json_t *r = json_array_get(records, i);
        json_t *ep = json_object_get(r, "epoch_num");
        json_t *v = json_object_get(r, key);
        if (!json_is_integer(ep) || !json_is_number(v))
            continue;
        s->x[s->n] = (double)json_integer_value(ep);
        s->y[s->n] = json_number_value(v);
        s->n++;
    }
}

static void s_draw_panel(s_canvas_t *c, const s_panel_t *p, json_t *records,
                         int px, int py, int pw, int ph) {
    static s_series_t series[MAX_SERIES];
    int ns = 0;
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int k = 0; k < MAX_SERIES && p->keys[k]; k++) {
        s_collect(records, p->keys[k], &series[ns]);
        if (series[ns].n == 0)
            continue;
        for (int i = 0; i < series[ns].n; i++) {
            double y = series[ns].y[i];
            if (!isfinite(y) || (p->log_y && y <= 0))
                continue;
            if (p->log_y)
                y = log10(y);
            xmin = fmin(xmin, series[ns].x[i]);
            xmax = fmax(xmax, series[ns].x[i]);
            ymin = fmin(ymin, y);
            ymax = fmax(ymax, y);
        }
        ns++;
    }
    /* frame and title */
    int left = px + 110, right = px + pw - 24, top = py + 62, bottom = py + ph - 50;
    s_text(c, left, py + 10, p->title, 2, s_black);
    if (ns == 0 || !isfinite(xmin)) {
        s_text(c, left + 20, (top + bottom) / 2, "no data", 2, s_grey);
        s_line(c, left, bottom, right, bottom, 1, s_black);
        s_line(c, left, top, left, bottom, 1, s_black);
        return;
    }
    if (xmax == xmin) { xmin -= 1; xmax += 1; }
    if (p->from_zero && ymin > 0)
        ymin = 0;
    if (ymax == ymin) { ymin -= p->log_y ? 0.5 : fmax(1e-9, fabs(ymin) * 0.1); ymax += p->log_y ? 0.5 : fmax(1e-9, fabs(ymax) * 0.1); }
    double pad = (ymax - ymin) * 0.05;
    ymin -= pad;
    ymax += pad;
    if (p->from_zero && ymin < 0)
        ymin = 0;
    /* grid and ticks: 5 horizontal, up to 10 vertical */
    char buf[32];
    for (int t = 0; t <= 4; t++) {
        double yv = ymin + (ymax - ymin) * t / 4;
        int y = bottom - (int)((bottom - top) * t / 4.0);
        s_line(c, left, y, right, y, 1, s_grid);
        s_fmt(p->log_y ? pow(10, yv) : yv, buf, sizeof buf);
        s_text(c, left - 8 - 12 * (int)strlen(buf), y - 7, buf, 2, s_grey);
    }
    int nx = (int)(xmax - xmin);
    int step = nx <= 10 ? 1 : (nx + 9) / 10;
    for (int e = (int)ceil(xmin); e <= (int)xmax; e += step) {
        int x = left + (int)((right - left) * (e - xmin) / (xmax - xmin));
        s_line(c, x, top, x, bottom, 1, s_grid);
        snprintf(buf, sizeof buf, "%d", e);
        s_text(c, x - 6 * (int)strlen(buf), bottom + 8, buf, 2, s_grey);
    }
    s_text(c, (left + right) / 2 - 30, bottom + 30, "epoch", 2, s_grey);
    s_line(c, left, bottom, right, bottom, 1, s_black);
    s_line(c, left, top, left, bottom, 1, s_black);
    /* series and legend */
    int lx = left, ly = py + 34;  /* legend: a row above the plot area */
    for (int k = 0; k < ns; k++) {
        const s_series_t *s = &series[k];
        int prev_x = 0, prev_y = 0, have_prev = 0;
        for (int i = 0; i < s->n; i++) {
            double y = s->y[i];
            if (!isfinite(y) || (p->log_y && y <= 0)) {
                have_prev = 0;
                continue;
            }
            if (p->log_y)
                y = log10(y);
            int X = left + (int)((right - left) * (s->x[i] - xmin) / (xmax - xmin));
            int Y = bottom - (int)((bottom - top) * (y - ymin) / (ymax - ymin));
            if (have_prev)
                s_line(c, prev_x, prev_y, X, Y, 3, s_colors[k]);
            s_rect(c, X - 3, Y - 3, X + 3, Y + 3, s_colors[k]);
            prev_x = X;
            prev_y = Y;
            have_prev = 1;
        }
        s_rect(c, lx, ly + 4, lx + 18, ly + 8, s_colors[k]);
        lx = s_text(c, lx + 24, ly, s->key, 2, s_black) + 24;
    }
}

/* ---- PNG ------------------------------------------------------------------------ */

static void s_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* Append a chunk (length, type, data, CRC over type and data). */
static size_t s_chunk(uint8_t *out, const char *type, const uint8_t *data, uint32_t len) {
    s_be32(out, len);
    memcpy(out + 4, type, 4);
    if (len)
        memcpy(out + 8, data, len);
    uLong crc = crc32(0, out + 4, 4 + len);
    s_be32(out + 8 + len, (uint32_t)crc);
    return 12 + (size_t)len;
}

static tp_status_t s_write_png(const s_canvas_t *c, const char *path) {
    size_t raw_size = (size_t)H * (1 + (size_t)W * 3);
    uint8_t *raw = malloc(raw_size);
    uLongf zsize = compressBound((uLong)raw_size);
    uint8_t *out = malloc(zsize + 128);
    if (!raw || !out) {
        free(raw);
        free(out);
        return tp_error(TP_ERR_NOMEM, "plot");
    }
    for (int y = 0; y < H; y++) {
        uint8_t *row = raw + (size_t)y * (1 + (size_t)W * 3);
        row[0] = 0; /* filter: none */
        memcpy(row + 1, c->px[y], (size_t)W * 3);
    }
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memcpy(out, sig, 8);
    size_t off = 8;
    uint8_t ihdr[13];
    s_be32(ihdr, W);
    s_be32(ihdr + 4, H);
    ihdr[8] = 8;  /* bit depth */
    ihdr[9] = 2;  /* RGB */
    ihdr[10] = ihdr[11] = ihdr[12] = 0;
    off += s_chunk(out + off, "IHDR", ihdr, 13);
    uint8_t *z = malloc(zsize);
    if (!z || compress2(z, &zsize, raw, (uLong)raw_size, 6) != Z_OK) {
        free(z);
        free(raw);
        free(out);
        return tp_error(TP_ERR_NOMEM, "plot: compressing the image");
    }
    off += s_chunk(out + off, "IDAT", z, (uint32_t)zsize);
    off += s_chunk(out + off, "IEND", NULL, 0);
    tp_status_t rc = tp_file_write_atomic(path, out, off);
    free(z);
    free(raw);
    free(out);
    return rc;
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
    s_canvas_t *c = malloc(sizeof *c);
    if (!c) {
        json_decref(records);
        return tp_error(TP_ERR_NOMEM, "plot canvas");
    }
    memset(c, 255, sizeof *c);
    (void)s_white;
    int pw = W / 2, ph = H / 2;
    for (int i = 0; i < 4; i++)
        s_draw_panel(c, &s_panels[i], records, (i % 2) * pw, (i / 2) * ph, pw, ph);
    tp_status_t rc = s_write_png(c, png_path);
    free(c);
    json_decref(records);
    return rc;
}
