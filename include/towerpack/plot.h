/* towerpack: training curves from stats.json (and steps.tsv beside it),
 * drawn to a PNG image with cairo.
 *
 * Six panels against the global step: the training loss and accuracy per
 * step (raw and smoothed as TensorBoard smooths, when steps.tsv has them;
 * else the epoch means) with the validation values per epoch, then the
 * learning rate, throughput, input queue fill and resident memory per
 * epoch. Drawn after every epoch by CurvePlotter (tp_cb_curve_plotter), at
 * the end of tp-train, and by the tp-plot tool for any log directory. */
#ifndef TOWERPACK_PLOT_H
#define TOWERPACK_PLOT_H

#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The per-step series file StepWriter (tp_cb_step_writer) keeps in the log
 * directory: a header "global_step<TAB>name..." and one line per point. */
#define TP_PLOT_STEPS_FILE "steps.tsv"
/* StepWriter writes at most this many lines per epoch: every step of an
 * epoch this short, else means over ceil(steps_per_epoch / this) steps. */
#define TP_STEP_POINTS_PER_EPOCH 200
/* The image's size in pixels. */
#define TP_PLOT_WIDTH 1500
#define TP_PLOT_HEIGHT 900

/* Read `stats_json` (JSONWriter's list of epoch records) and, when it is
 * there, TP_PLOT_STEPS_FILE in the same directory, and write the curves to
 * `png_path` (atomically). TP_ERR_FORMAT for a file that is not such a
 * list, or a malformed steps file (with its line); an empty list still
 * gives an image with empty panels. */
tp_status_t tp_plot_stats(const char *stats_json, const char *png_path);

#ifdef __cplusplus
}
#endif
#endif
