/* towerpack core: status codes and the per-thread last-error message. */
#include <stdarg.h>
#include <string.h>
#include <towerpack/status.h>

#define TP_ERRMSG_SIZE 1024

static _Thread_local char s_errmsg[TP_ERRMSG_SIZE];

const char *tp_strerror(tp_status_t status) {
    switch (status) {
    case TP_OK: return "ok";
    case TP_ERR_INVALID: return "invalid argument";
    case TP_ERR_NOMEM: return "out of memory";
    case TP_ERR_IO: return "i/o error";
    case TP_ERR_PROTOCOL: return "protocol error";
    case TP_ERR_FORMAT: return "bad file format";
    case TP_ERR_SHAPE: return "shape mismatch";
    case TP_ERR_STATE: return "invalid state";
    case TP_ERR_TIMEOUT: return "timed out";
    case TP_ERR_INTERRUPTED: return "interrupted";
    case TP_ERR_PEER: return "peer failed";
    case TP_ERR_DEVICE: return "device error";
    case TP_ERR_UNSUPPORTED: return "not supported";
    case TP_ERR_NOT_FOUND: return "not found";
    }
    return "unknown status";
}

/* Memory that is lacking is always named as such (issue 48: "tower0:
 * 869332574848 bytes of activations" did not say it), whatever the failure
 * path wrote: "out of memory: " goes in front of a message without it. */
static void s_name_nomem(tp_status_t status) {
    static const char nomem[] = "out of memory";
    if (status != TP_ERR_NOMEM || strstr(s_errmsg, nomem))
        return;
    size_t len = strnlen(s_errmsg, sizeof s_errmsg - 1), pre = sizeof nomem + 1;
    if (len + pre >= sizeof s_errmsg)
        len = sizeof s_errmsg - pre - 1;
    memmove(s_errmsg + pre, s_errmsg, len);
    memcpy(s_errmsg, nomem, sizeof nomem - 1);
    memcpy(s_errmsg + sizeof nomem - 1, ": ", 2);
    s_errmsg[pre + len] = '\0';
}

/* The message is formatted into a local buffer first: callers pass the
 * last error itself as an argument (`tp_error(st, "--data: %s",
 * tp_last_error())`), and vsnprintf into the buffer it reads from garbled
 * it ("--data: --data: rce 'x'"). */
tp_status_t tp_error(tp_status_t status, const char *fmt, ...) {
    char msg[TP_ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(s_errmsg, msg, sizeof msg);
    s_name_nomem(status);
    return status;
}

tp_status_t tp_error_wrap(tp_status_t status, const char *fmt, ...) {
    char old[TP_ERRMSG_SIZE], msg[TP_ERRMSG_SIZE];
    memcpy(old, s_errmsg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(s_errmsg, msg, sizeof msg);
    /* Append ": <old>", truncating quietly: context matters more than the
     * tail of a very long message. */
    size_t len = n < 0 ? 0 : (size_t)n;
    if (len < sizeof s_errmsg - 3 && old[0]) {
        size_t room = sizeof s_errmsg - len - 3;
        size_t olen = strnlen(old, room);
        memcpy(s_errmsg + len, ": ", 2);
        memcpy(s_errmsg + len + 2, old, olen);
        s_errmsg[len + 2 + olen] = '\0';
    }
    s_name_nomem(status);
    return status;
}

const char *tp_last_error(void) { return s_errmsg; }

void tp_clear_error(void) { s_errmsg[0] = '\0'; }

void tp_assert_fail(const char *expr, const char *file, int line,
                    const char *func) {
    fprintf(stderr, "towerpack: assertion failed: %s (%s:%d, %s)\n", expr,
            file, line, func);
    fflush(stderr);
    abort();
}
