/* towerpack tests: training curves drawn from stats.json and steps.tsv into
 * a PNG. The PNG is decoded by libpng (through cairo's reader) and by
 * Python's PIL, an outside decoder; the per-step series must show. */
#include <cairo.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/plot.h>
#include <towerpack/towerpack.h>

static char s_dir[64], s_js[128], s_steps[128], s_png[128];

static void s_setup(void) {
    snprintf(s_dir, sizeof s_dir, "/tmp/tp-plot-XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
    snprintf(s_js, sizeof s_js, "%s/stats.json", s_dir);
    snprintf(s_steps, sizeof s_steps, "%s/%s", s_dir, TP_PLOT_STEPS_FILE);
    snprintf(s_png, sizeof s_png, "%s/curves.png", s_dir);
}

static void s_teardown(void) {
    unlink(s_js);
    unlink(s_steps);
    unlink(s_png);
    rmdir(s_dir);
}

static void s_write(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* Six epochs of 10 steps: every per-epoch key the panels look for. */
static void s_write_stats(void) {
    FILE *f = fopen(s_js, "w");
    cr_assert_not_null(f);
    fputs("[", f);
    for (int e = 1; e <= 6; e++)
        fprintf(f, "%s{\"epoch_num\":%d,\"global_step\":%d,\"cost\":%g,"
                   "\"validation_cost\":%g,\"accuracy\":%g,\"validation_accuracy\":%g,"
                   "\"learning_rate\":%g,\"throughput\":%d,\"QueueInput/queue_fill\":0.5,"
                   "\"memory/rss_mb\":100,\"memory/peak_rss_mb\":110}",
                e > 1 ? "," : "", e, e * 10, 2.0 / e, 2.2 / e, 0.5 + 0.05 * e,
                0.45 + 0.05 * e, 0.1 / e, 1000 + e);
    fputs("]", f);
    fclose(f);
}

/* Pixels away from grey (a series' colour, not text, grid or background). */
static long s_coloured(const char *png, int *w, int *h) {
    cairo_surface_t *s = cairo_image_surface_create_from_png(png);
    cr_assert_eq(cairo_surface_status(s), CAIRO_STATUS_SUCCESS, "%s: %s", png,
                 cairo_status_to_string(cairo_surface_status(s)));
    *w = cairo_image_surface_get_width(s);
    *h = cairo_image_surface_get_height(s);
    int stride = cairo_image_surface_get_stride(s);
    const unsigned char *d = cairo_image_surface_get_data(s);
    long n = 0;
    for (int y = 0; y < *h; y++)
        for (int x = 0; x < *w; x++) {
            const unsigned char *p = d + (size_t)y * stride + 4 * x;  /* B G R x */
            int mx = p[0] > p[1] ? p[0] : p[1], mn = p[0] < p[1] ? p[0] : p[1];
            mx = mx > p[2] ? mx : p[2];
            mn = mn < p[2] ? mn : p[2];
            n += mx - mn > 30;
        }
    cairo_surface_destroy(s);
    return n;
}

Test(plot, per_step_points_show, .init = s_setup, .fini = s_teardown) {
    s_write_stats();
    /* epochs only: the panels' lines and markers */
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_OK, "%s", tp_last_error());
    int w, h;
    long epochs_only = s_coloured(s_png, &w, &h);
    cr_assert_eq(w, TP_PLOT_WIDTH);
    cr_assert_eq(h, TP_PLOT_HEIGHT);
    cr_assert(epochs_only > 2000, "per-epoch series drawn: %ld px", epochs_only);
    /* 60 steps whose cost jumps between 1 and 3: 60 steep segments across
     * the loss panel's height that no per-epoch line draws */
    FILE *f = fopen(s_steps, "w");
    fputs("global_step\tcost\taccuracy\n", f);
    for (int s = 1; s <= 60; s++)
        fprintf(f, "%d\t%g\t%s\n", s, s % 2 ? 3.0 : 1.0, s == 7 ? "nan" : "0.5");
    fclose(f);
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_OK, "%s", tp_last_error());
    long with_steps = s_coloured(s_png, &w, &h);
    cr_assert_eq(w, TP_PLOT_WIDTH);
    cr_assert(with_steps > epochs_only + 8000, "per-step zigzag drawn: %ld px, %ld without",
              with_steps, epochs_only);
}

Test(plot, png_decodes_with_pil, .init = s_setup, .fini = s_teardown) {
    /* a python3 earlier on PATH may lack Debian's packages */
    static const char *const cands[] = {"python3", "/usr/bin/python3"};
    const char *py = NULL;
    char cmd[512];
    for (size_t i = 0; i < sizeof cands / sizeof *cands && !py; i++) {
        snprintf(cmd, sizeof cmd, "%s -c 'import PIL' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0)
            py = cands[i];
    }
    if (!py)
        cr_skip_test("no python3 with PIL (apt-get install python3-pil)");
    s_write_stats();
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_OK, "%s", tp_last_error());
    snprintf(cmd, sizeof cmd,
             "%s -c \"from PIL import Image; im = Image.open('%s'); im.load(); "
             "print(im.format, im.size[0], im.size[1])\"", py, s_png);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char out[128] = "";
    cr_assert_not_null(fgets(out, sizeof out, p));
    cr_assert_eq(pclose(p), 0);
    char want[64];
    snprintf(want, sizeof want, "PNG %d %d\n", TP_PLOT_WIDTH, TP_PLOT_HEIGHT);
    cr_assert_str_eq(out, want);
}

Test(plot, a_long_steps_file_is_drawn_from_bounded_points, .init = s_setup,
     .fini = s_teardown) {
    s_write_stats();
    /* 100k lines: merged in pairs past the cap, still drawn */
    FILE *f = fopen(s_steps, "w");
    fputs("global_step\tcost\n", f);
    for (int s = 1; s <= 100000; s++)
        fprintf(f, "%d\t%g\n", s, 1.0 + 1.0 / s);
    fclose(f);
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_OK, "%s", tp_last_error());
    int w, h;
    cr_assert_gt(s_coloured(s_png, &w, &h), 2000);
}

Test(plot, bad_input_is_a_clear_error, .init = s_setup, .fini = s_teardown) {
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_ERR_FORMAT, "missing file");
    cr_assert(strstr(tp_last_error(), "stats.json"));
    s_write(s_js, "{\"epoch_num\": 1}");
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "not a list"));
    s_write(s_js, "[]");
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_OK, "an empty run still plots");
    cr_assert_eq(access(s_png, R_OK), 0);
    /* a malformed steps file names itself and the line */
    s_write(s_steps, "global_step\tcost\n1\t2.0\n2\tabc\n");
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "steps.tsv:3: 'abc' is not a number"), "%s",
              tp_last_error());
    s_write(s_steps, "1\t2.0\n");
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "steps.tsv:1: data before the header"), "%s",
              tp_last_error());
    s_write(s_steps, "global_step\tcost\taccuracy\n5\t1.0\n");
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_ERR_FORMAT);
    cr_assert(strstr(tp_last_error(), "1 values, the header names 2"), "%s", tp_last_error());
}

/* A series whose values differ only by rounding (the learning rate 1 and
 * 0.99999999999999989 here; a validation accuracy of 1 in another run) is
 * drawn as a flat line: its tick step was below the doubles' resolution
 * and the tick loop never ended (tp-train hung at an epoch end). */
Test(plot, values_equal_up_to_rounding_do_not_hang, .init = s_setup, .fini = s_teardown,
     .timeout = 60) {
    s_write(s_js, "[{\"epoch_num\":1,\"global_step\":10,\"cost\":0.5,\"learning_rate\":1.0},"
                  "{\"epoch_num\":2,\"global_step\":20,\"cost\":0.0,"
                  "\"learning_rate\":0.99999999999999989}]");
    cr_assert_eq(tp_plot_stats(s_js, s_png), TP_OK, "%s", tp_last_error());
    cr_expect_eq(access(s_png, R_OK), 0);
}
