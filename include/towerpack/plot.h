/* towerpack: training curves from stats.json, drawn to a PNG image.
 *
 * Four panels against the epoch: loss, accuracy (training and validation
 * series found in the records), learning rate and throughput. Used by
 * tp-train at the end of a run and by the tp-plot tool for any log
 * directory. */
#ifndef TOWERPACK_PLOT_H
#define TOWERPACK_PLOT_H

#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Read `stats_json` (JSONWriter's list of epoch records) and write the
 * curves to `png_path` (atomically). TP_ERR_FORMAT for a file that is not
 * such a list; an empty list still gives an image with empty panels. */
tp_status_t tp_plot_stats(const char *stats_json, const char *png_path);

#ifdef __cplusplus
}
#endif
#endif
