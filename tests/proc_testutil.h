/* towerpack tests: helpers for the tests that fork (process checks). */
#ifndef TP_PROC_TESTUTIL_H
#define TP_PROC_TESTUTIL_H

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* fork() for a helper child: the child is SIGKILLed when the test process
 * ends, so a failed assertion never leaves it behind (a sender blocked on a
 * full socket would otherwise hold ctest's output pipe until its timeout).
 * Survives execve. */
static inline pid_t pu_fork(void) {
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)  /* the test ended before prctl */
            _exit(1);
    }
    return pid;
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
