/* towerpack tests: helpers for the tests that fork (process checks). */
#ifndef TP_PROC_TESTUTIL_H
#define TP_PROC_TESTUTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* The fork rule, for tests as for the library (docs/actors.md): a child
 * that runs code of this process after fork() must be forked while no other
 * thread of ours can hold a lock. A ZeroMQ context's I/O thread allocates
 * whenever a peer connects; fork while it holds the allocator's lock (under
 * AddressSanitizer, whose allocator has no fork handler) and the child hangs
 * in its first malloc. That was issue 21's failure: a second sender forked
 * while the receiver's I/O thread accepted the first one never started.
 *
 * Name of the first ZeroMQ background thread of this process ("" if none). */
static inline const char *pu_zmq_thread(char *name, size_t size) {
    name[0] = '\0';
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%.32s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(comm, sizeof comm, f))
                comm[0] = '\0';
            fclose(f);
        }
        if (!strncmp(comm, "ZMQbg/", 6)) {
            comm[strcspn(comm, "\n")] = '\0';
            snprintf(name, size, "%s", comm);
            break;
        }
    }
    if (d)
        closedir(d);
    return name;
}

/* In the child: die with the test process (SIGKILL), so a failed assertion
 * never leaves a helper behind (a sender blocked on a full socket would
 * otherwise hold ctest's output pipe until its timeout). Survives execve.
 * Async-signal-safe. */
static inline void pu_child_init(pid_t parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)  /* the test ended before prctl */
        _exit(1);
}

/* fork() for a helper child that runs this test's code. Refuses (exits the
 * test with a message naming the thread) when a ZeroMQ context is running
 * here: fork helpers before creating receivers, actors or dataflows that
 * use sockets (a connecting peer waits for a later bind), or start a
 * program with pu_spawn. */
/* Abort the test, saying who (`who`) and why, when a ZeroMQ thread runs in
 * this process: the check behind pu_fork, and the one a test makes before a
 * dataflow forks its workers with allow_threads set (which turns off the
 * library's own thread check, because Criterion's thread is harmless). */
static inline void pu_assert_fork_safe(const char *who) {
    char zmq[64];
    if (pu_zmq_thread(zmq, sizeof zmq)[0]) {
        fprintf(stderr, "%s: refusing to fork while ZeroMQ thread %s runs in this "
                "process (the child could hang on a lock it holds); fork first, "
                "in a test of its own, or use pu_spawn\n", who, zmq);
        fflush(stderr);
        abort();
    }
}

static inline pid_t pu_fork(void) {
    pu_assert_fork_safe("pu_fork");
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        pu_child_init(parent);
    return pid;
}

/* A gate for helpers forked before the test is ready for them (pu_fork's
 * rule): a child waits at it until the parent has bound its socket, killed
 * the previous sender, and so on. An event, not a sleep. */
typedef struct {
    int rd, wr;  /* a pipe: one byte lets one waiter through */
} pu_gate_t;

static inline void pu_gate_init(pu_gate_t *g) {
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pu_gate_init: pipe");
        abort();
    }
    g->rd = fds[0];
    g->wr = fds[1];
}

/* In a child: block until the parent lets one waiter through. */
static inline void pu_gate_wait(pu_gate_t *g) {
    char c;
    while (read(g->rd, &c, 1) < 0 && errno == EINTR) {
    }
}

/* In the parent: let n waiters through. */
static inline void pu_gate_open(pu_gate_t *g, int n) {
    for (int i = 0; i < n; i++)
        if (write(g->wr, "", 1) != 1)
            perror("pu_gate_open: write");
}

static inline void pu_gate_fini(pu_gate_t *g) {
    close(g->rd);
    close(g->wr);
}

/* How pu_spawn starts a program. Zero-initialise, then set what you need. */
typedef struct {
    const char *out;          /* stdout (and stderr, see err) appended to this file */
    int out_fd;               /* or to this descriptor when > 0 (a pipe's write end) */
    int keep_stderr;          /* 1: stderr stays the test's own */
    const char *const *env;   /* "NAME=value" set on top of ours; NULL-terminated */
    long fsize;               /* > 0: RLIMIT_FSIZE in bytes, SIGXFSZ ignored */
} pu_spawn_opts_t;

/* Start the program argv[0] with argv (fork + execve). Everything that may
 * allocate (the environment) is prepared before fork; the child makes only
 * async-signal-safe calls before exec, so this is safe at any time, also
 * with threads and sockets running. Returns the pid (or -1). */
static inline pid_t pu_spawn(char *const argv[], const pu_spawn_opts_t *o) {
    extern char **environ;
    pu_spawn_opts_t none = {0};
    if (!o)
        o = &none;
    size_t n = 0, extra = 0;
    while (environ[n])
        n++;
    while (o->env && o->env[extra])
        extra++;
    char **envp = (char **)calloc(n + extra + 1, sizeof *envp);
    if (!envp)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int replaced = 0;
        for (size_t j = 0; j < extra && !replaced; j++) {
            size_t len = strcspn(o->env[j], "=");
            replaced = !strncmp(environ[i], o->env[j], len) && environ[i][len] == '=';
        }
        if (!replaced)
            envp[k++] = environ[i];
    }
    for (size_t j = 0; j < extra; j++)
        envp[k++] = (char *)o->env[j];
    envp[k] = NULL;
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        pu_child_init(parent);
        int fd = o->out_fd > 0 ? o->out_fd
                 : o->out ? open(o->out, O_WRONLY | O_CREAT | O_APPEND, 0600) : -1;
        if (fd >= 0) {
            dup2(fd, 1);
            if (!o->keep_stderr)
                dup2(fd, 2);
            if (fd > 2)
                close(fd);
        }
        if (o->fsize > 0) {
            struct rlimit rl = {(rlim_t)o->fsize, (rlim_t)o->fsize};
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        execve(argv[0], argv, envp);
        _exit(127);
    }
    free(envp);
    return pid;
}

/* Run argv[0] with argv (NULL-terminated) and env (as pu_spawn), its
 * stdout and stderr into out[size] (NUL-terminated; what does not fit is
 * read and dropped, so the program never blocks on a full pipe), until it
 * ends. Returns its exit status, or -1 when it was killed or did not
 * start. */
static inline int pu_run(char *const argv[], const char *const *env, char *out,
                         size_t size) {
    int fds[2];
    if (size == 0 || pipe(fds) != 0)
        return -1;
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    pu_spawn_opts_t o = {.out_fd = fds[1], .env = env};
    pid_t pid = pu_spawn(argv, &o);
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    char sink[4096];
    while ((r = read(fds[0], got < size - 1 ? out + got : sink,
                     got < size - 1 ? size - 1 - got : sizeof sink)) > 0)
        if (got < size - 1)
            got += (size_t)r;
    out[got] = '\0';
    close(fds[0]);
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A reference check in Python over files a test wrote to `dir`: runs
 * Debian's python3 (a pyenv python3 first on the PATH often lacks numpy
 * and friends) on `script dir`, its output into out[size], then removes
 * dir. Returns the script's exit status (77: it lacks a module: skip). */
static inline int pu_python_check(const char *script, const char *dir, char *out,
                                  size_t size) {
    const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    char *argv[] = {(char *)py, (char *)script, (char *)dir, NULL};
    int rc = pu_run(argv, NULL, out, size);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "pu_python_check: could not remove %s\n", dir);
    return rc;
}

/* In a Criterion test: pu_python_check(script, dir), skipped when the
 * script lacks a module (77), else it must exit 0 saying `agrees` (a
 * string of its last words, e.g. "numpy agrees on 60 images"). */
#define PU_PYTHON_EXPECT(script, dir, agrees)                                  \
    do {                                                                       \
        char pu_msg_[4096];                                                    \
        int pu_rc_ = pu_python_check((script), (dir), pu_msg_, sizeof pu_msg_); \
        if (pu_rc_ == 77)                                                      \
            cr_skip_test("%s", pu_msg_);                                       \
        cr_assert_eq(pu_rc_, 0, "%s", pu_msg_);                                \
        cr_assert(strstr(pu_msg_, (agrees)), "%s", pu_msg_);                   \
    } while (0)

/* Write `bytes` of data to dir/name (a test's file for a reference check);
 * 0, or -1 when it cannot. */
static inline int pu_write_file(const char *dir, const char *name, const void *data,
                                size_t bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t put = fwrite(data, 1, bytes, f);
    return fclose(f) == 0 && put == bytes ? 0 : -1;
}

/* The whole file at path (malloc'ed, the caller frees it), its size into
 * *size; NULL (and 0) when it cannot be read. */
static inline char *pu_read_all(const char *path, size_t *size) {
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *data = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (data = (char *)malloc((size_t)n + 1)) &&
        fread(data, 1, (size_t)n, f) == (size_t)n) {
        *size = (size_t)n;
    } else {
        free(data);
        data = NULL;
    }
    fclose(f);
    return data;
}

/* 1 when the files at a and b hold the same bytes (a run's output against
 * another's, or a tool's against the run's); 0 when they differ or one
 * cannot be read. Their sizes into *na and *nb (0: unread) for the
 * caller's message. */
static inline int pu_same_file(const char *a, const char *b, size_t *na, size_t *nb) {
    char *x = pu_read_all(a, na), *y = pu_read_all(b, nb);
    int same = x && y && *na == *nb && !memcmp(x, y, *na);
    free(x);
    free(y);
    return same;
}

/* 1 when pid is gone (no such process, or a zombie nobody reaped yet). */
static inline int pu_gone(int pid) {
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p && (p[2] == 'Z' || p[2] == 'X');
}

/* Wait up to ms for pid to be gone; 1 if it is. */
static inline int pu_wait_gone(int pid, int ms) {
    for (int i = 0; i <= ms / 10; i++) {
        if (pu_gone(pid))
            return 1;
        usleep(10000);
    }
    return pu_gone(pid);
}

/* Entries in a directory other than . and .. (-1 if it cannot be read). */
static inline int pu_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* waitpid with a bound: the status, or -1 after ms. */
static inline int pu_waitpid(int pid, int ms) {
    int status;
    for (int i = 0; i <= ms / 5; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        usleep(5000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

#endif
