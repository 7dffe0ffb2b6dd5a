/* towerpack core: writing a file atomically (temporary file in the same
 * directory, fsync, rename, fsync of the directory), and what a process must
 * not leave behind when it has to _exit at once: the temporaries of the
 * writes in progress and its private run directories. A crash or a full
 * disk leaves either the old file or the new one, never a torn one. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <towerpack/fileio.h>
#include <towerpack/status.h>

/* Paths a signal handler may have to remove: pointers into the callers'
 * objects (a tp_atomic_file_t's temporary name, a supervisor's or a worker
 * pool's run directory), claimed and released with compare-and-swap. More
 * at once than slots go unlisted (a later tp_atomic_file_sweep still
 * removes stale temporaries; an unlisted run directory is only removed by
 * the orderly stop). */
#define S_LIST_MAX 16
typedef _Atomic(const char *) s_list_t[S_LIST_MAX];
static s_list_t s_pending;   /* temporaries, open to commit or abort */
static s_list_t s_run_dirs;  /* run directories, made to removed */

static void s_list_add(s_list_t list, const char *path) {
    for (int i = 0; i < S_LIST_MAX; i++) {
        const char *none = NULL;
        if (atomic_compare_exchange_strong(&list[i], &none, path))
            return;
    }
}

static void s_list_drop(s_list_t list, const char *path) {
    for (int i = 0; i < S_LIST_MAX; i++) {
        const char *mine = path;
        if (atomic_compare_exchange_strong(&list[i], &mine, NULL))
            return;
    }
}

static void s_pending_add(const char *tmp) { s_list_add(s_pending, tmp); }
static void s_pending_drop(const char *tmp) { s_list_drop(s_pending, tmp); }

void tp_unlink_at_exit_add(const char *path) { s_pending_add(path); }
void tp_unlink_at_exit_drop(const char *path) { s_pending_drop(path); }

void tp_atomic_file_unlink_pending(void) {
    for (int i = 0; i < S_LIST_MAX; i++) {
        const char *tmp = atomic_load(&s_pending[i]);
        if (tmp)
            unlink(tmp);
    }
}

tp_status_t tp_run_dir_make(char *dir, size_t size, const char *prefix) {
    const char *tmp = getenv("TMPDIR");
    int n = snprintf(dir, size, "%s/%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix);
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "run directory %s/%s-XXXXXX: longer than %zu bytes",
                        tmp && *tmp ? tmp : "/tmp", prefix, size - 1);
    if (!mkdtemp(dir))
        return tp_error(TP_ERR_IO, "mkdtemp %s: %s", dir, strerror(errno));
    s_list_add(s_run_dirs, dir);
    return TP_OK;
}

void tp_run_dir_remove(const char *dir) {
    s_list_drop(s_run_dirs, dir);
    rmdir(dir);
}

/* Only system calls (no opendir: it allocates). Entries are unlinked while
 * the directory is read, so it is read again from the start until a pass
 * finds nothing; a run directory holds a few sockets. */
static void s_remove_dir_now(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        for (int pass = 0; pass < 8; pass++) {
            char buf[4096] __attribute__((aligned(8)));
            int removed = 0;
            long n;
            if (lseek(fd, 0, SEEK_SET) < 0)
                break;
            while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
                for (long off = 0; off < n;) {
                    struct {
                        unsigned long long ino;
                        long long off;
                        unsigned short reclen;
                        unsigned char type;
                        char name[];
                    } *e = (void *)(buf + off);
                    const char *nm = e->name;
                    int dot = nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2]));
                    if (!dot && unlinkat(fd, nm, 0) == 0)
                        removed++;
                    off += e->reclen;
                }
            }
            if (!removed)
                break;
        }
        close(fd);
    }
    rmdir(dir);
}

void tp_run_dirs_remove_now(void) {
    for (int i = 0; i < S_LIST_MAX; i++) {
        const char *dir = atomic_load(&s_run_dirs[i]);
        if (dir)
            s_remove_dir_now(dir);
    }
}

static tp_status_t s_write_all(int fd, const void *data, size_t size,
                               const char *path) {
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return tp_error(TP_ERR_IO, "writing %s: %s", path, strerror(errno));
        }
        p += n;
        size -= (size_t)n;
    }
    return TP_OK;
}

tp_status_t tp_file_write_atomic(const char *path, const void *data,
                                 size_t size) {
    tp_atomic_file_t f;
    TP_TRY(tp_atomic_file_open(&f, path));
    tp_status_t rc = tp_atomic_file_write(&f, data, size);
    if (rc == TP_OK)
        return tp_atomic_file_commit(&f);
    tp_atomic_file_abort(&f);
    return rc;
}

tp_status_t tp_atomic_file_open(tp_atomic_file_t *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    int n = snprintf(f->path, sizeof f->path, "%s", path);
    int m = snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%d", path, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof f->path || m < 0 || (size_t)m >= sizeof f->tmp)
        return tp_error(TP_ERR_INVALID, "path too long: %s", path);
    s_pending_add(f->tmp);  /* before the file exists: no moment unlisted */
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        s_pending_drop(f->tmp);
        /* the target first: the temporary is the how, not the what */
        return tp_error(TP_ERR_IO, "creating %s: %s (written as %s, then renamed)", f->path,
                        strerror(errno), f->tmp);
    }
    return TP_OK;
}

tp_status_t tp_atomic_file_write(tp_atomic_file_t *f, const void *data,
                                 size_t size) {
    return s_write_all(f->fd, data, size, f->tmp);
}

void tp_atomic_file_abort(tp_atomic_file_t *f) {
    if (f->fd >= 0) {
        close(f->fd);
        unlink(f->tmp);
        s_pending_drop(f->tmp);
        f->fd = -1;
    }
}

tp_status_t tp_atomic_file_commit(tp_atomic_file_t *f) {
    if (fsync(f->fd) != 0) {
        tp_status_t rc = tp_error(TP_ERR_IO, "fsync %s: %s", f->tmp, strerror(errno));
        tp_atomic_file_abort(f);
        return rc;
    }
    if (close(f->fd) != 0) {
        f->fd = -1;
        unlink(f->tmp);
        s_pending_drop(f->tmp);
        return tp_error(TP_ERR_IO, "closing %s: %s", f->tmp, strerror(errno));
    }
    f->fd = -1;
    if (rename(f->tmp, f->path) != 0) {
        tp_status_t rc = tp_error(TP_ERR_IO, "renaming %s to %s: %s", f->tmp,
                                  f->path, strerror(errno));
        unlink(f->tmp);
        s_pending_drop(f->tmp);
        return rc;
    }
    s_pending_drop(f->tmp);
    /* Make the rename itself durable. */
    char dir[sizeof f->path];
    snprintf(dir, sizeof dir, "%s", f->path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return TP_OK;
}

/* "NAME.tmp.PID" of a pid that no longer runs (and is not ours). */
static int s_stale_tmp(const char *name) {
    const char *t = strstr(name, ".tmp.");
    if (!t || t == name)
        return 0;
    char *end = NULL;
    long pid = strtol(t + 5, &end, 10);
    if (end == t + 5 || *end || pid <= 0 || pid == (long)getpid())
        return 0;
    return kill((pid_t)pid, 0) < 0 && errno == ESRCH;
}

int tp_atomic_file_sweep(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)))
        if (s_stale_tmp(e->d_name)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            n += unlink(path) == 0;
        }
    closedir(d);
    return n;
}
