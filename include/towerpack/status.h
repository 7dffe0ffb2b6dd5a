/* towerpack: status codes, per-thread error messages, always-on asserts.
 *
 * Every fallible call returns tp_status_t: 0 is success, failures are
 * negative. The function that detects a fault records a message saying what
 * and where with tp_error(); callers read it with tp_last_error(). */
#ifndef TOWERPACK_STATUS_H
#define TOWERPACK_STATUS_H

#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returned at the end of a pass or stream (not an error): by
 * tp_dataflow_next and by an actor's produce. Kept here, beside the
 * status codes, so that every room can use it without the dataflow API. */
#define TP_DONE 1

typedef enum {
    TP_OK = 0,
    TP_ERR_INVALID = -1,     /* bad argument, flag or spec */
    TP_ERR_NOMEM = -2,       /* out of host or device memory */
    TP_ERR_IO = -3,          /* a file or socket operation failed */
    TP_ERR_PROTOCOL = -4,    /* a malformed message from a peer */
    TP_ERR_FORMAT = -5,      /* a corrupt or truncated file */
    TP_ERR_SHAPE = -6,       /* tensor shapes or dtypes do not fit */
    TP_ERR_STATE = -7,       /* call not allowed in this state */
    TP_ERR_TIMEOUT = -8,     /* a bounded wait ran out */
    TP_ERR_INTERRUPTED = -9, /* stopped by a signal or a stop request */
    TP_ERR_PEER = -10,       /* a worker, actor or remote peer died */
    TP_ERR_DEVICE = -11,     /* CUDA, cuBLAS, cuDNN or NCCL failure */
    TP_ERR_UNSUPPORTED = -12,/* feature not available in this build */
    TP_ERR_NOT_FOUND = -13,  /* a named thing does not exist */
} tp_status_t;

/* Static text for a status code ("protocol error", ...). Never NULL. */
const char *tp_strerror(tp_status_t status);

/* Record the calling thread's last error message and return `status`, so a
 * failure path reads `return tp_error(TP_ERR_IO, "open %s: %s", p, e);`. */
tp_status_t tp_error(tp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefix the current thread's message with context ("reading x: <old>"). */
tp_status_t tp_error_wrap(tp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last error message ("" when none). Valid until the
 * next tp_error on this thread. */
const char *tp_last_error(void);

/* Forget the calling thread's last error message. */
void tp_clear_error(void);

/* Internal invariant: always on (not disabled by NDEBUG); no side effects
 * inside. Failure prints the expression, file and line and aborts. */
#define TP_ASSERT(cond)                                                       \
    do {                                                                      \
        if (__builtin_expect(!(cond), 0))                                     \
            tp_assert_fail(#cond, __FILE__, __LINE__, __func__);              \
    } while (0)

void tp_assert_fail(const char *expr, const char *file, int line,
                    const char *func) __attribute__((noreturn));

/* Propagate a failure: evaluate `expr` once, return its status if < 0. */
#define TP_TRY(expr)                                                          \
    do {                                                                      \
        tp_status_t tp_try_rc_ = (expr);                                      \
        if (tp_try_rc_ < 0)                                                   \
            return tp_try_rc_;                                                \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
