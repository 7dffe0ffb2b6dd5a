/* tp-plot: draw a run's training curves (stats.json, steps.tsv) into a PNG.
 *
 *   tp-plot LOGDIR            writes LOGDIR/curves.png
 *   tp-plot LOGDIR -o FILE    writes FILE */
#include <stdio.h>
#include <string.h>
#include <towerpack/plot.h>

static void s_usage(FILE *out) {
    fprintf(out, "usage: tp-plot LOGDIR [-o OUTPUT.png]\n"
                 "  Draws the training loss and accuracy per step (LOGDIR/steps.tsv,\n"
                 "  when there) and per epoch, learning rate, throughput, input queue\n"
                 "  fill and memory from LOGDIR/stats.json into LOGDIR/curves.png (or\n"
                 "  OUTPUT.png).\n");
}

int main(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "tp-plot: unexpected argument '%s'\n", argv[i]);
            s_usage(stderr);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        s_usage(stderr);
        return 2;
    }
    char in[4096], png[4096];
    snprintf(in, sizeof in, "%s/stats.json", dir);
    snprintf(png, sizeof png, "%s", out ? out : "");
    if (!out)
        snprintf(png, sizeof png, "%s/curves.png", dir);
    if (tp_plot_stats(in, png) != TP_OK) {
        fprintf(stderr, "tp-plot: %s\n", tp_last_error());
        return 1;
    }
    printf("%s\n", png);
    return 0;
}
