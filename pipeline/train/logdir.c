/* towerpack pipeline: preparing the log directory (tensorpack's
 * logger.set_logger_dir actions: keep, delete, backup, new) and the lock a
 * run holds on it.
 *
 * The lock. Two runs on one directory overwrite each other's checkpoints,
 * stats.json and log.log and both exit 0 (issue 48), so a run locks DIR/.lock
 * before it touches the directory and holds the lock until it ends. Which
 * kind of lock, deliberately:
 *  - POSIX record locks (F_SETLK) belong to the process and are dropped by
 *    ANY close() of ANY descriptor of the file in that process: asking who
 *    holds the lock (open, F_GETLK, close) would release one's own. And a
 *    process never conflicts with itself, so nothing in-process is seen.
 *  - Open-file-description locks (F_OFD_SETLK; flock() is the same kind,
 *    the fallback where the kernel lacks OFD locks) belong to the open file:
 *    closing another descriptor of the file releases nothing, and only the
 *    last close of the description (or the owner's death, kill -9
 *    included) does. Chosen.
 * Their catch: fork() shares the description, so a forked child (a dataflow
 * worker, the CUDA probe) would hold the lock too, and keep the directory
 * locked after its parent was killed until it noticed. A pthread_atfork
 * child handler closes the child's copy: the parent's lock is untouched
 * (the description stays open in the parent), and the child never holds
 * it. Nobody ever unlocks with F_UNLCK (that would release the parent's
 * lock from a child): a lock ends by close alone. exec'd children (tp-worker)
 * never get it (O_CLOEXEC). Under MPI only rank 0 has a log directory.
 *
 * The file stays after the run: unlinking it while another process has it
 * open (about to lock it) would let a third process create and lock a new
 * file, and two runs would both hold "the" lock. It holds the owner's pid
 * (for the message of a refused run: OFD locks have no owning pid to ask
 * the kernel for). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/log.h>
#include <towerpack/logdir.h>

static const char *s_names[] = {"ask", "keep", "delete", "backup", "new"};

/* The lock file, and what a run leaves when it stopped before it made
 * anything of value: the log of the failure (its retry appends to it), the
 * statistics socket of a killed run, and tp-train's record of its data
 * (models.h's TP_ZOO_DATA_FILE, written before the launch and rewritten by
 * every run, so a directory holding only it is a new run's). */
#define S_LOCK_FILE ".lock"
static const char *s_disposable[] = {S_LOCK_FILE, "log.log", "stats.sock", "data.json"};

tp_status_t tp_logdir_action_parse(const char *s, tp_logdir_action_t *action) {
    for (int i = 0; i < 5; i++)
        if (s && strcasecmp(s, s_names[i]) == 0) {
            *action = (tp_logdir_action_t)i;
            return TP_OK;
        }
    return tp_error(TP_ERR_INVALID, "log directory action '%s' is not one of "
                    "keep, delete, backup, new, ask", s ? s : "(null)");
}

tp_status_t tp_mkdirs(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return tp_error(TP_ERR_INVALID, "path too long: %s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return tp_error(TP_ERR_IO, "mkdir %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return tp_error(TP_ERR_IO, "mkdir %s: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return tp_error(TP_ERR_IO, "%s exists and is not a directory", path);
    return TP_OK;
}

/* ---- the lock ---------------------------------------------------------------------- */

struct tp_logdir_lock {
    tp_logdir_lock_t *next;
    dev_t dev;   /* the lock file's identity: one entry per file */
    ino_t ino;
    int fd;      /* holds the lock; -1 in a forked child (closed at fork) */
    int refs;
    pid_t owner;
};

/* This process's locks: a directory locked twice in one process (tp-train
 * prepares it, then its launch locks it again) is one lock, counted. */
static pthread_mutex_t s_mutex = PTHREAD_MUTEX_INITIALIZER;
static tp_logdir_lock_t *s_locks;
static pthread_once_t s_once = PTHREAD_ONCE_INIT;

static void s_prefork(void) { pthread_mutex_lock(&s_mutex); }
static void s_postfork_parent(void) { pthread_mutex_unlock(&s_mutex); }

/* In a forked child: close (never unlock) every lock's descriptor, so the
 * child does not hold its parent's directory. The forking thread held the
 * mutex through fork: it is the child's only thread. */
static void s_postfork_child(void) {
    for (tp_logdir_lock_t *l = s_locks; l; l = l->next)
        if (l->fd >= 0) {
            close(l->fd);
            l->fd = -1;
        }
    pthread_mutex_unlock(&s_mutex);
}

static void s_register_atfork(void) {
    pthread_atfork(s_prefork, s_postfork_parent, s_postfork_child);
}

/* 0: locked; 1: another open file holds it; -errno otherwise. */
static int s_try_lock(int fd) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
        return 0;
    if (errno == EAGAIN || errno == EACCES)
        return 1;
    if (errno == EINVAL) {  /* a kernel before 3.15: flock is the same kind */
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno == EWOULDBLOCK)
            return 1;
    }
    return -errno;
}

/* The pid written in the lock file; 0 when it holds none (yet: the holder
 * writes it right after it locked, so a fresh lock is read again). */
static int s_read_pid(int fd) {
    for (int tries = 0; tries < 50; tries++) {
        char buf[32] = "";
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        int pid = n > 0 ? atoi(buf) : 0;
        if (pid > 0)
            return pid;
        usleep(2000);
    }
    return 0;
}

static tp_status_t s_busy(const char *dir, int pid) {
    if (pid > 0)
        return tp_error(TP_ERR_STATE, "log directory %s is in use by another run "
                        "(pid %d holds %s/" S_LOCK_FILE "): two runs in one directory "
                        "overwrite each other's checkpoints and statistics; wait for "
                        "it to end or use another directory", dir, pid, dir);
    return tp_error(TP_ERR_STATE, "log directory %s is in use by another run (it "
                    "holds %s/" S_LOCK_FILE "; its pid is not written there): wait "
                    "for it to end or use another directory", dir, dir);
}

/* Lock dir into *out; *holder gets the other process's pid (-1: unknown)
 * when that is why not; *fresh_lock is 1 when this call took the lock (0:
 * another reference to this process's). */
static tp_status_t s_lock(const char *dir, tp_logdir_lock_t **out, int *holder,
                          int *fresh_lock) {
    *out = NULL;
    *holder = 0;
    *fresh_lock = 0;
    pthread_once(&s_once, s_register_atfork);
    char path[4200];
    if (snprintf(path, sizeof path, "%s/" S_LOCK_FILE, dir) >= (int)sizeof path)
        return tp_error(TP_ERR_INVALID, "path too long: %s", dir);
    for (int attempt = 0; attempt < 5; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
            return tp_error(TP_ERR_IO, "locking the log directory %s: %s: %s", dir, path,
                            strerror(errno));
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            return tp_error(TP_ERR_IO, "locking the log directory %s: %s is not a "
                            "regular file", dir, path);
        }
        pthread_mutex_lock(&s_mutex);
        pid_t me = getpid();
        for (tp_logdir_lock_t *l = s_locks; l; l = l->next)
            if (l->fd >= 0 && l->owner == me && l->dev == st.st_dev && l->ino == st.st_ino) {
                l->refs++;
                pthread_mutex_unlock(&s_mutex);
                close(fd);  /* another description: its close releases nothing */
                *out = l;
                return TP_OK;
            }
        int r = s_try_lock(fd);
        if (r == 1) {
            pthread_mutex_unlock(&s_mutex);
            *holder = s_read_pid(fd);
            close(fd);
            tp_status_t rc = s_busy(dir, *holder);
            if (*holder == 0)
                *holder = -1;
            return rc;
        }
        if (r < 0) {
            /* a file system without locks (ENOLCK: NFS without lockd): the
             * run goes on, unprotected, and says so */
            TP_WARN("cannot lock the log directory %s (%s): another run started on "
                    "it would not be refused", dir, strerror(-r));
        }
        /* Locked: but the name may have been moved or replaced between the
         * open and the lock (a backup renames the directory): then lock the
         * file that is there now. */
        struct stat now;
        if (stat(path, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
            pthread_mutex_unlock(&s_mutex);
            close(fd);
            continue;
        }
        char text[32];
        int len = snprintf(text, sizeof text, "%d\n", (int)me);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != len)
            TP_WARN("log directory %s: cannot write the pid to %s: %s", dir, path,
                    strerror(errno));
        tp_logdir_lock_t *l = calloc(1, sizeof *l);
        if (!l) {
            pthread_mutex_unlock(&s_mutex);
            close(fd);
            return tp_error(TP_ERR_NOMEM, "log directory lock");
        }
        *l = (tp_logdir_lock_t){s_locks, st.st_dev, st.st_ino, fd, 1, me};
        s_locks = l;
        pthread_mutex_unlock(&s_mutex);
        *fresh_lock = 1;
        *out = l;
        return TP_OK;
    }
    return tp_error(TP_ERR_IO, "locking the log directory %s: %s keeps changing", dir,
                    path);
}

tp_logdir_lock_t *tp_logdir_lock_new(const char *dir) {
    tp_logdir_lock_t *l;
    int holder, fresh;
    return s_lock(dir, &l, &holder, &fresh) < 0 ? NULL : l;
}

void tp_logdir_lock_destroy(tp_logdir_lock_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_logdir_lock_t *self = *self_p;
    *self_p = NULL;
    pthread_mutex_lock(&s_mutex);
    if (--self->refs == 0) {
        for (tp_logdir_lock_t **p = &s_locks; *p; p = &(*p)->next)
            if (*p == self) {
                *p = self->next;
                break;
            }
        if (self->fd >= 0)
            close(self->fd);  /* the release: never F_UNLCK (see the banner) */
        free(self);
    }
    pthread_mutex_unlock(&s_mutex);
}

int tp_logdir_lock_holder(const char *dir) {
    char path[4200];
    if (snprintf(path, sizeof path, "%s/" S_LOCK_FILE, dir) >= (int)sizeof path)
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    struct stat st;
    int pid = -1;
    if (fstat(fd, &st) == 0) {
        pthread_mutex_lock(&s_mutex);
        for (tp_logdir_lock_t *l = s_locks; l && pid < 0; l = l->next)
            if (l->fd >= 0 && l->owner == getpid() && l->dev == st.st_dev &&
                l->ino == st.st_ino)
                pid = (int)getpid();
        pthread_mutex_unlock(&s_mutex);
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (pid < 0 && fcntl(fd, F_OFD_GETLK, &fl) == 0)
            pid = fl.l_type == F_UNLCK ? 0 : s_read_pid(fd);
        else if (pid < 0 && errno == EINVAL) {  /* flock's kind: try it */
            if (flock(fd, LOCK_SH | LOCK_NB) == 0)
                pid = 0;  /* closing this description releases it */
            else if (errno == EWOULDBLOCK)
                pid = s_read_pid(fd);
        }
    }
    close(fd);  /* an OFD lock of this process is not released by this */
    return pid >= 0 ? pid : -1;
}

/* ---- the directory ----------------------------------------------------------------- */

/* Entries that are a run's (not in s_disposable); up to three of their
 * names, comma separated, into names[size]. */
static int s_run_files(const char *dir, char *names, size_t size) {
    if (names && size)
        names[0] = '\0';
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int n = 0;
    size_t used = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        int disposable = 0;
        for (size_t i = 0; i < sizeof s_disposable / sizeof *s_disposable; i++)
            disposable |= !strcmp(e->d_name, s_disposable[i]);
        if (disposable)
            continue;
        if (names && n < 3 && used < size)
            used += (size_t)snprintf(names + used, size - used, "%s%s", n ? ", " : "",
                                     e->d_name);
        else if (names && n == 3 && used < size)
            used += (size_t)snprintf(names + used, size - used, ", ...");
        n++;
    }
    closedir(d);
    return n;
}

int tp_logdir_is_fresh(const char *dir) {
    return s_run_files(dir, NULL, 0) == 0;
}

static int s_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

/* Everything in dir but the lock file, which this run holds. */
static tp_status_t s_delete_contents(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return tp_error(TP_ERR_IO, "deleting %s: %s", dir, strerror(errno));
    struct dirent *e;
    tp_status_t rc = TP_OK;
    while (rc >= 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            !strcmp(e->d_name, S_LOCK_FILE))
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (nftw(path, s_rm, 16, FTW_DEPTH | FTW_PHYS) != 0)
            rc = tp_error(TP_ERR_IO, "deleting %s: %s", path, strerror(errno));
    }
    closedir(d);
    return rc;
}

static tp_status_t s_copy_out(char *out, size_t size, const char *dir) {
    if (snprintf(out, size, "%s", dir) >= (int)size)
        return tp_error(TP_ERR_INVALID, "path too long: %s", dir);
    return TP_OK;
}

/* The lock goes to *lock_out, or is kept for the process's life. */
static tp_status_t s_done(char *out, size_t size, const char *dir, tp_logdir_lock_t *l,
                          tp_logdir_lock_t **lock_out) {
    tp_status_t rc = s_copy_out(out, size, dir);
    if (rc < 0)
        tp_logdir_lock_destroy(&l);
    else if (lock_out)
        *lock_out = l;
    return rc;
}

/* TP_LOGDIR_NEW: DIR-1, DIR-2, ...: the first name nobody has, claimed by
 * mkdir (atomic: two runs never pick the same). */
static tp_status_t s_new(const char *dir, char *out, size_t size,
                         tp_logdir_lock_t **lock_out) {
    char next[4200];
    for (int i = 1; i < 10000; i++) {
        snprintf(next, sizeof next, "%s-%d", dir, i);
        if (mkdir(next, 0755) != 0) {
            if (errno == EEXIST)
                continue;
            return tp_error(TP_ERR_IO, "mkdir %s: %s", next, strerror(errno));
        }
        tp_logdir_lock_t *l;
        int holder, fresh;
        TP_TRY(s_lock(next, &l, &holder, &fresh));
        TP_INFO("log directory %s exists: using %s", dir, next);
        return s_done(out, size, next, l, lock_out);
    }
    return tp_error(TP_ERR_IO, "no free name after %s-9999", dir);
}

tp_status_t tp_logdir_prepare(const char *dir, tp_logdir_action_t action,
                              char *out, size_t size, tp_logdir_lock_t **lock_out) {
    if (lock_out)
        *lock_out = NULL;
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return tp_error(TP_ERR_IO, "log directory %s exists and is not a directory", dir);
    TP_TRY(tp_mkdirs(dir));
    /* The lock before anything else: a directory another run holds is
     * neither asked about, nor deleted, nor moved. */
    int holder, fresh_lock;
    tp_logdir_lock_t *l;
    tp_status_t rc = s_lock(dir, &l, &holder, &fresh_lock);
    if (rc < 0 && holder != 0 && action == TP_LOGDIR_NEW)
        return s_new(dir, out, size, lock_out);  /* it is theirs: the next name */
    if (rc < 0)
        return rc;
    char names[512];
    if (s_run_files(dir, names, sizeof names) == 0) {
        char log[4200];
        snprintf(log, sizeof log, "%s/log.log", dir);
        if (fresh_lock && access(log, F_OK) == 0)
            TP_INFO("log directory %s holds only an earlier run's log.log: this run's "
                    "log follows it", dir);
        return s_done(out, size, dir, l, lock_out);
    }
    if (action == TP_LOGDIR_ASK) {
        if (!isatty(STDIN_FILENO)) {
            tp_logdir_lock_destroy(&l);
            return tp_error(TP_ERR_STATE,
                            "log directory %s exists and is not empty (%s); say what "
                            "to do with it: keep (resume), delete, backup or new "
                            "(stdin is not a terminal, so towerpack does not ask)",
                            dir, names);
        }
        fprintf(stderr, "log directory %s exists (%s). [k]eep, [d]elete, [b]ackup, "
                        "[n]ew, [q]uit? ", dir, names);
        char line[16] = "";
        if (!fgets(line, sizeof line, stdin))
            line[0] = 'q';
        switch (line[0]) {
        case 'k': action = TP_LOGDIR_KEEP; break;
        case 'd': action = TP_LOGDIR_DELETE; break;
        case 'b': action = TP_LOGDIR_BACKUP; break;
        case 'n': action = TP_LOGDIR_NEW; break;
        default:
            tp_logdir_lock_destroy(&l);
            return tp_error(TP_ERR_INTERRUPTED, "log directory %s: quit", dir);
        }
    }
    switch (action) {
    case TP_LOGDIR_KEEP:
        return s_done(out, size, dir, l, lock_out);
    case TP_LOGDIR_DELETE: {
        rc = s_delete_contents(dir);
        if (rc < 0) {
            tp_logdir_lock_destroy(&l);
            return rc;
        }
        TP_INFO("deleted the old log directory %s", dir);
        return s_done(out, size, dir, l, lock_out);
    }
    case TP_LOGDIR_BACKUP: {
        char bak[4200];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char stamp[32];
        strftime(stamp, sizeof stamp, "%m%d-%H%M%S", &tm);
        snprintf(bak, sizeof bak, "%s.%s", dir, stamp);
        for (int i = 1; access(bak, F_OK) == 0; i++)
            snprintf(bak, sizeof bak, "%s.%s-%d", dir, stamp, i);
        /* held while it moves (the lock moves with it), so no run starts
         * in it half way; then the new directory is locked */
        if (rename(dir, bak) != 0) {
            tp_logdir_lock_destroy(&l);
            return tp_error(TP_ERR_IO, "backing up %s to %s: %s", dir, bak, strerror(errno));
        }
        TP_INFO("moved the old log directory %s to %s", dir, bak);
        tp_logdir_lock_t *fresh = NULL;
        rc = tp_mkdirs(dir);
        if (rc >= 0)
            rc = s_lock(dir, &fresh, &holder, &fresh_lock);
        tp_logdir_lock_destroy(&l);
        if (rc < 0)
            return tp_error_wrap(rc, "after moving %s to %s", dir, bak);
        return s_done(out, size, dir, fresh, lock_out);
    }
    case TP_LOGDIR_NEW:
        tp_logdir_lock_destroy(&l);
        return s_new(dir, out, size, lock_out);
    default:
        tp_logdir_lock_destroy(&l);
        return tp_error(TP_ERR_INVALID, "log directory action %d", (int)action);
    }
}
