/* towerpack: logging with levels and timestamps, to stderr and optionally a
 * file. Thread-safe: each record is written with one call. The level comes
 * from tp_log_set_level() or the TP_LOG_LEVEL environment variable
 * (debug, info, warn, error, off). */
#ifndef TOWERPACK_LOG_H
#define TOWERPACK_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TP_LOG_DEBUG = 0,
    TP_LOG_INFO = 1,
    TP_LOG_WARN = 2,
    TP_LOG_ERROR = 3,
    TP_LOG_OFF = 4,
} tp_log_level_t;

/* Set the threshold: records below it are dropped. */
void tp_log_set_level(tp_log_level_t level);
tp_log_level_t tp_log_get_level(void);

/* Parse "debug", "info", "warn", "error" or "off". TP_ERR_INVALID otherwise. */
tp_status_t tp_log_level_parse(const char *name, tp_log_level_t *level);

/* Also append records to `path` (NULL closes the file). stderr stays on. */
tp_status_t tp_log_set_file(const char *path);

/* Write `len` bytes of `line` (a whole line, newline included) to stderr
 * and the log file as they are: no lock, no formatting, async-signal-safe,
 * for the last words of a process that a signal handler ends. */
void tp_log_last_words(const char *line, size_t len);

/* Turn stderr output on or off (the file, if any, is unaffected). */
void tp_log_set_stderr(int enabled);

void tp_log_write(tp_log_level_t level, const char *file, int line,
                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* A tool's fatal error: "prog: message" on stderr (the line a user
 * reads, as tools print it) and, when a log file is open, the same message
 * as an error record there whatever the level, so the log says why the
 * run stopped. For a tool's main, just before it exits. */
void tp_log_fatal(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define tp_log(level, ...)                                                    \
    do {                                                                      \
        if ((level) >= tp_log_get_level())                                    \
            tp_log_write((level), __FILE__, __LINE__, __VA_ARGS__);           \
    } while (0)
#define TP_DEBUG(...) tp_log(TP_LOG_DEBUG, __VA_ARGS__)
#define TP_INFO(...) tp_log(TP_LOG_INFO, __VA_ARGS__)
#define TP_WARN(...) tp_log(TP_LOG_WARN, __VA_ARGS__)
#define TP_ERROR(...) tp_log(TP_LOG_ERROR, __VA_ARGS__)

/* ---- rate-limited logging ------------------------------------------------
 * For faults that can repeat per message (a bad frame from a peer): one
 * record a second at most. Zero-initialise; one per call site. */
typedef struct {
    uint64_t last_ns;
    uint64_t suppressed;
} tp_ratelog_t;
/* 1 when a record may be written now (at most one a second); counts the
 * rest in suppressed (reset by the caller when a record is allowed). */
int tp_ratelog_ok(tp_ratelog_t *rl);

#ifdef __cplusplus
}
#endif
#endif
