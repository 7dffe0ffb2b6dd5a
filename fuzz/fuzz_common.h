/* towerpack fuzzing: helpers shared by the libFuzzer targets in fuzz/ (not
 * installed, not part of the library).
 *
 * Every target is one file, fuzz_<name>.c, that defines
 * LLVMFuzzerTestOneInput; fuzz/CMakeLists.txt links it with
 * -fsanitize=fuzzer,address,undefined. A target must return 0 on every
 * input: a decoder's error is an ordinary outcome, only a sanitizer report,
 * a crash, a leak or a timeout is a finding. */
#ifndef TOWERPACK_FUZZ_COMMON_H
#define TOWERPACK_FUZZ_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <towerpack/towerpack.h>

/* Decoders report errors through tp_error, which may log: keep the fuzzer's
 * output readable. */
static inline void fuzz_quiet(void) { tp_log_set_level(TP_LOG_OFF); }

/* With TP_FUZZ_VERBOSE set, print each input's outcome (to check that the
 * seeds are accepted: fuzz_x -runs=0 DIR). */
static inline void fuzz_note(const char *what, tp_status_t rc) {
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("TP_FUZZ_VERBOSE") != NULL;
    if (verbose)
        fprintf(stderr, "%s: %s\n", what, rc == TP_OK ? "ok" : tp_last_error());
}

/* A property every target checks on what it decoded: abort (a finding)
 * with a message, never continue past it. */
#define FUZZ_CHECK(cond, ...)                                                 \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "fuzz property failed at %s:%d: %s: ", __FILE__,  \
                    __LINE__, #cond);                                         \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            abort();                                                          \
        }                                                                     \
    } while (0)

/* Decoders that only take a path (gzip'd IDX, checkpoint loading) read the
 * input through an anonymous in-memory file: no disk writes, no cleanup.
 * The file stays open for the process; each call truncates and rewrites
 * it. Returns the /proc/self/fd path, or NULL (the target then skips). */
static inline const char *fuzz_memfile(const void *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("tp-fuzz", MFD_CLOEXEC);
        if (fd < 0)
            return NULL;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0)
        return NULL;
    const uint8_t *p = data;
    size_t left = size;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w <= 0)
            return NULL;
        p += w;
        left -= (size_t)w;
    }
    return path;
}

#endif
