/* towerpack examples: the small things every example shares (reading the
 * two command-line settings they take). Not part of the library. */
#ifndef TP_EXAMPLES_COMMON_H
#define TP_EXAMPLES_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Examples take `--tiny` (a few steps: what the tests run) and `--logdir
 * DIR`. */
typedef struct {
    int tiny;
    const char *logdir;
} example_args_t;

static inline example_args_t example_args(int argc, char **argv, const char *logdir) {
    example_args_t a = {0, logdir};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tiny"))
            a.tiny = 1;
        else if (!strcmp(argv[i], "--logdir") && i + 1 < argc)
            a.logdir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--tiny] [--logdir DIR]\n", argv[0]);
            exit(2);
        }
    }
    return a;
}

#endif
