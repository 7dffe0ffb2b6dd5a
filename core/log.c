/* towerpack core: levelled, timestamped logging to stderr and a file.
 *
 * A record is formatted into one buffer and written with one write(2), so
 * records from several threads or processes never interleave mid-line. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <towerpack/clock.h>
#include <unistd.h>
#include <towerpack/log.h>

static int s_level = -1;  /* -1: not yet read from TP_LOG_LEVEL */
static int s_stderr_on = 1;
static int s_file_fd = -1;
static pthread_mutex_t s_file_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *s_names[] = {"debug", "info", "warn", "error", "off"};

tp_status_t tp_log_level_parse(const char *name, tp_log_level_t *level) {
    for (int i = 0; i <= TP_LOG_OFF; i++) {
        if (name && strcasecmp(name, s_names[i]) == 0) {
            *level = (tp_log_level_t)i;
            return TP_OK;
        }
    }
    return tp_error(TP_ERR_INVALID,
                    "log level '%s' is not one of debug, info, warn, error, off",
                    name ? name : "(null)");
}

tp_log_level_t tp_log_get_level(void) {
    int level = __atomic_load_n(&s_level, __ATOMIC_RELAXED);
    if (level < 0) {
        tp_log_level_t parsed = TP_LOG_INFO;
        const char *env = getenv("TP_LOG_LEVEL");
        if (env && tp_log_level_parse(env, &parsed) != TP_OK)
            parsed = TP_LOG_INFO;
        level = (int)parsed;
        __atomic_store_n(&s_level, level, __ATOMIC_RELAXED);
    }
    return (tp_log_level_t)level;
}

void tp_log_set_level(tp_log_level_t level) {
    __atomic_store_n(&s_level, (int)level, __ATOMIC_RELAXED);
}

void tp_log_set_stderr(int enabled) {
    __atomic_store_n(&s_stderr_on, enabled ? 1 : 0, __ATOMIC_RELAXED);
}

tp_status_t tp_log_set_file(const char *path) {
    int fd = -1;
    if (path) {
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0)
            return tp_error(TP_ERR_IO, "log file %s: %s", path,
                            strerror(errno));
    }
    pthread_mutex_lock(&s_file_lock);
    if (s_file_fd >= 0)
        close(s_file_fd);
    s_file_fd = fd;
    pthread_mutex_unlock(&s_file_lock);
    return TP_OK;
}

static void s_write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        buf += n;
        len -= (size_t)n;
    }
}

/* A record's head ("2026-01-02 03:04:05.678 info  [pid] file:line ")
 * into buf[size]; its length, or -1. */
static int s_head(char *buf, size_t size, tp_log_level_t level, const char *file,
                  int line) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char where[32] = "";
    if (line > 0)  /* no line: a tool's fatal record names the tool alone */
        snprintf(where, sizeof where, ":%d", line);
    int n = snprintf(buf, size,
                     "%04d-%02d-%02d %02d:%02d:%02d.%03d %-5s [%d] %s%s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
                     s_names[level], (int)getpid(), base, where);
    return n < 0 || (size_t)n >= size ? -1 : n;
}

void tp_log_write(tp_log_level_t level, const char *file, int line,
                  const char *fmt, ...) {
    if (level < tp_log_get_level() || level >= TP_LOG_OFF)
        return;
    char buf[2048];
    int n = s_head(buf, sizeof buf, level, file, line);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    if (__atomic_load_n(&s_stderr_on, __ATOMIC_RELAXED))
        s_write_all(STDERR_FILENO, buf, len);
    pthread_mutex_lock(&s_file_lock);
    if (s_file_fd >= 0)
        s_write_all(s_file_fd, buf, len);
    pthread_mutex_unlock(&s_file_lock);
}

void tp_log_fatal(const char *prog, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0)
        msg[0] = '\0';
    /* the line the user reads, as tools always printed it */
    char line[2200];
    int len = snprintf(line, sizeof line, "%s: %s\n", prog, msg);
    if (len > (int)sizeof line - 1)
        len = (int)sizeof line - 1;
    if (len > 0)
        s_write_all(STDERR_FILENO, line, (size_t)len);
    /* and the log's record, whatever the level: why the run stopped */
    char buf[2300];
    int n = s_head(buf, sizeof buf, TP_LOG_ERROR, prog, 0);
    if (n < 0)
        return;
    int k = snprintf(buf + n, sizeof buf - (size_t)n, "fatal: %s\n", msg);
    size_t total = (size_t)n + (k > 0 ? (size_t)k : 0);
    if (total > sizeof buf - 1) {
        total = sizeof buf - 1;
        buf[total - 1] = '\n';
    }
    pthread_mutex_lock(&s_file_lock);
    if (s_file_fd >= 0)
        s_write_all(s_file_fd, buf, total);
    pthread_mutex_unlock(&s_file_lock);
}

/* Rate-limited logging: moved here from actors/actor.c so that the
 * dataflows, which log per-message trouble too, need no actor internals. */
int tp_ratelog_ok(tp_ratelog_t *rl) {
    uint64_t now = tp_now_ns();
    if (rl->last_ns == 0 || now - rl->last_ns >= 1000000000ull) {
        rl->last_ns = now;
        return 1;
    }
    rl->suppressed++;
    return 0;
}

void tp_log_last_words(const char *line, size_t len) {
    s_write_all(STDERR_FILENO, line, len);
    /* no lock: the thread that holds it may be the one stopped here */
    int fd = __atomic_load_n(&s_file_fd, __ATOMIC_RELAXED);
    if (fd >= 0)
        s_write_all(fd, line, len);
}
