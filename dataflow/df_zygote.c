/* towerpack dataflow: the zygote, a single-threaded fork server for the
 * workers of the process-parallel dataflows (the why and the protocol are
 * in df_zygote.h). The zygote's side runs in its own process and exits
 * with _exit; it logs nothing and touches no ZeroMQ, so it never takes a
 * lock that a thread of the parent could have held. */
#define _GNU_SOURCE 1 /* pipe2 */
#include "df_zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>

#define STOP_SLOT (-1)      /* a request that stops the zygote */
#define REPLY_WAIT_MS 10000 /* a fork takes milliseconds; ASan, a loaded host: more */

typedef struct {
    int slot, gen;
} s_request_t;

typedef struct {
    int slot;
    pid_t pid;  /* > 0: forked */
    int err;    /* errno of a failed fork */
} s_reply_t;

struct df_zygote {
    const char *what;
    int nslots;
    df_zygote_fn fn;
    void *arg;
    pid_t pid;     /* the zygote */
    pid_t owner;   /* the process that made it */
    int ended;     /* the owner reaped the zygote: end_status is its status */
    int end_status;
    int req, evt;  /* this process's ends of the two socket pairs */
    /* the zygote's own state (unused in the owner) */
    int sigfd;     /* SIGCHLD and SIGTERM, blocked and read here */
    pid_t *wpid;   /* [nslots] the worker in each slot, 0 for none */
    int *err_r;    /* [nslots] read end of its error pipe, -1 for none */
};

/* ---- in the zygote ---------------------------------------------------------------- */

static int s_slot_of(df_zygote_t *z, pid_t pid) {
    for (int i = 0; i < z->nslots; i++)
        if (z->wpid[i] == pid)
            return i;
    return -1;
}

/* In a new worker: die with the zygote, undo the zygote's signal setup,
 * drop its descriptors, run the worker. */
static void s_worker_main(df_zygote_t *z, int slot, int gen, int err_w)
    __attribute__((noreturn));
static void s_worker_main(df_zygote_t *z, int slot, int gen, int err_w) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != z->pid)  /* the zygote died before prctl */
        _exit(1);
    signal(SIGTERM, SIG_DFL);  /* the parent's stop; SIGINT stays ignored */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    close(z->sigfd);
    close(z->req);
    close(z->evt);
    for (int i = 0; i < z->nslots; i++)
        if (z->err_r[i] >= 0)
            close(z->err_r[i]);
    z->fn(z->arg, slot, gen, err_w, z->pid);
    _exit(0);
}

static s_reply_t s_fork_worker(df_zygote_t *z, const s_request_t *rq) {
    s_reply_t rep = {rq->slot, 0, 0};
    if (rq->slot < 0 || rq->slot >= z->nslots || z->wpid[rq->slot] > 0) {
        rep.err = rq->slot < 0 || rq->slot >= z->nslots ? EINVAL : EBUSY;
        return rep;
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) {
        rep.err = errno;
        return rep;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        s_worker_main(z, rq->slot, rq->gen, fds[1]);
    }
    /* Only the worker holds the write end: nothing later inherits it. */
    close(fds[1]);
    if (pid < 0) {
        rep.err = errno;
        close(fds[0]);
        return rep;
    }
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    z->err_r[rq->slot] = fds[0];
    z->wpid[rq->slot] = pid;
    rep.pid = pid;
    return rep;
}

/* Reap every worker that ended; tell the owner when `tell`. -1 when the
 * owner cannot be told (it is gone). */
static int s_reap_workers(df_zygote_t *z, int tell) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            return 0;
        int i = s_slot_of(z, pid);
        if (i < 0)
            continue;
        df_zygote_exit_t e = {.slot = i, .pid = pid, .status = status};
        /* A worker writes its message before it exits: it is all there. */
        ssize_t n = read(z->err_r[i], e.msg, sizeof e.msg - 1);
        e.msg[n > 0 ? n : 0] = '\0';
        close(z->err_r[i]);
        z->err_r[i] = -1;
        z->wpid[i] = 0;
        if (tell && send(z->evt, &e, sizeof e, MSG_NOSIGNAL) != (ssize_t)sizeof e)
            return -1;
    }
}

/* SIGTERM to every worker, up to 1 s for them to go, then SIGKILL; every
 * one reaped; exit. */
static void s_zygote_stop(df_zygote_t *z) __attribute__((noreturn));
static void s_zygote_stop(df_zygote_t *z) {
    int alive = 0;
    for (int i = 0; i < z->nslots; i++)
        if (z->wpid[i] > 0 && kill(z->wpid[i], SIGTERM) == 0)
            alive = 1;
    uint64_t deadline = tp_now_ns() + 1000000000ull;
    while (alive && tp_now_ns() < deadline) {
        struct pollfd pf = {z->sigfd, POLLIN, 0};
        poll(&pf, 1, 20);  /* woken by SIGCHLD */
        struct signalfd_siginfo si;
        while (read(z->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        }
        s_reap_workers(z, 0);
        alive = 0;
        for (int i = 0; i < z->nslots; i++)
            alive |= z->wpid[i] > 0;
    }
    for (int i = 0; i < z->nslots; i++) {
        if (z->wpid[i] > 0) {
            kill(z->wpid[i], SIGKILL);
            waitpid(z->wpid[i], NULL, 0);
        }
    }
    _exit(0);
}

/* The zygote's loop: requests from the owner, deaths of workers. */
static void s_zygote_main(df_zygote_t *z) __attribute__((noreturn));
static void s_zygote_main(df_zygote_t *z) {
    for (;;) {
        struct pollfd pf[2] = {{z->req, POLLIN, 0}, {z->sigfd, POLLIN, 0}};
        int n = poll(pf, 2, 1000);
        if (getppid() != z->owner || (n < 0 && errno != EINTR))
            s_zygote_stop(z);
        if (n <= 0)
            continue;
        if (pf[1].revents) {
            struct signalfd_siginfo si;
            int term = 0;
            while (read(z->sigfd, &si, sizeof si) == (ssize_t)sizeof si)
                term |= si.ssi_signo == SIGTERM;
            if (s_reap_workers(z, 1) < 0 || term)
                s_zygote_stop(z);
        }
        if (pf[0].revents) {
            s_request_t rq;
            ssize_t r = recv(z->req, &rq, sizeof rq, 0);
            if (r < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            /* the owner closed its end, asked to stop, or spoke nonsense */
            if (r != (ssize_t)sizeof rq || rq.slot == STOP_SLOT)
                s_zygote_stop(z);
            s_reply_t rep = s_fork_worker(z, &rq);
            if (send(z->req, &rep, sizeof rep, MSG_NOSIGNAL) != (ssize_t)sizeof rep)
                s_zygote_stop(z);
        }
    }
}

/* ---- in the owner ------------------------------------------------------------------ */

/* Reap the zygote, waiting up to ms: 1 when it has ended (its wait status
 * in end_status), 0 when it still runs. */
static int s_wait_zygote(df_zygote_t *z, int ms) {
    uint64_t deadline = tp_now_ns() + (uint64_t)ms * 1000000ull;
    while (!z->ended) {
        pid_t r = waitpid(z->pid, &z->end_status, WNOHANG);
        if (r == z->pid || (r < 0 && errno != EINTR)) {
            z->ended = 1;
            break;
        }
        if (tp_now_ns() >= deadline)
            return 0;
        usleep(2000);
    }
    return 1;
}

/* The error for a zygote that is gone (waiting up to ms to say how). */
static tp_status_t s_zygote_gone(df_zygote_t *z, int ms) {
    char how[128] = "closed its socket";
    int ended = s_wait_zygote(z, ms), st = z->end_status;
    if (ended && WIFSIGNALED(st))
        snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
    else if (ended && WIFEXITED(st))
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(st));
    return tp_error(TP_ERR_PEER, "%s: the zygote (pid %d) that forks the workers "
                    "%s; its workers ended with it", z->what, (int)z->pid, how);
}

tp_status_t df_zygote_new(const char *what, int nslots, df_zygote_fn fn,
                          void *arg, df_zygote_t **out) {
    *out = NULL;
    df_zygote_t *z = calloc(1, sizeof *z);
    if (z) {
        z->wpid = calloc((size_t)nslots, sizeof *z->wpid);
        z->err_r = calloc((size_t)nslots, sizeof *z->err_r);
    }
    if (!z || !z->wpid || !z->err_r) {
        if (z) {
            free(z->wpid);
            free(z->err_r);
        }
        free(z);
        return tp_error(TP_ERR_NOMEM, "%s: zygote", what);
    }
    z->what = what;
    z->nslots = nslots;
    z->fn = fn;
    z->arg = arg;
    z->req = z->evt = z->sigfd = -1;
    for (int i = 0; i < nslots; i++)
        z->err_r[i] = -1;
    int req[2], evt[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, req) < 0) {
        df_zygote_destroy(&z);
        return tp_error(TP_ERR_IO, "%s: zygote: socketpair: %s", what, strerror(errno));
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, evt) < 0) {
        int e = errno;
        close(req[0]);
        close(req[1]);
        df_zygote_destroy(&z);
        return tp_error(TP_ERR_IO, "%s: zygote: socketpair: %s", what, strerror(e));
    }
    z->owner = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != z->owner)  /* the owner died before prctl */
            _exit(1);
        close(req[0]);
        close(evt[0]);
        z->req = req[1];
        z->evt = evt[1];
        z->pid = getpid();
        /* SIGINT is the owner's to decide; SIGTERM stops in order, read
         * with SIGCHLD from a signalfd rather than by a handler. */
        signal(SIGINT, SIG_IGN);
        signal(SIGPIPE, SIG_IGN);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGCHLD);
        sigaddset(&set, SIGTERM);
        sigprocmask(SIG_BLOCK, &set, NULL);
        z->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
        if (z->sigfd < 0)
            _exit(1);
        s_zygote_main(z);
    }
    close(req[1]);
    close(evt[1]);
    z->req = req[0];
    z->evt = evt[0];
    if (pid < 0) {
        int e = errno;
        df_zygote_destroy(&z);
        return tp_error(TP_ERR_IO, "%s: fork the zygote: %s", what, strerror(e));
    }
    z->pid = pid;
    fcntl(z->evt, F_SETFL, O_NONBLOCK);
    TP_DEBUG("%s: zygote started (pid %d)", what, (int)pid);
    *out = z;
    return TP_OK;
}

void df_zygote_destroy(df_zygote_t **self_p) {
    if (!self_p || !*self_p)
        return;
    df_zygote_t *z = *self_p;
    if (z->pid > 0 && !z->ended) {
        /* Ask, rather than only close: a process forked later (another
         * pool's zygote) may hold a copy of our end, so EOF may not come. */
        s_request_t stop = {STOP_SLOT, 0};
        if (send(z->req, &stop, sizeof stop, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
            /* gone already, or about to be killed below */
        }
        /* It gives its workers 1 s before it kills them. */
        if (!s_wait_zygote(z, 3000)) {
            TP_WARN("%s: the zygote (pid %d) did not stop within 3 s; killing it "
                    "(its workers die with it)", z->what, (int)z->pid);
            kill(z->pid, SIGKILL);
            waitpid(z->pid, NULL, 0);
        }
    }
    if (z->req >= 0)
        close(z->req);
    if (z->evt >= 0)
        close(z->evt);
    free(z->wpid);
    free(z->err_r);
    free(z);
    *self_p = NULL;
}

tp_status_t df_zygote_spawn(df_zygote_t *z, int slot, int gen, pid_t *pid) {
    *pid = 0;
    s_request_t rq = {slot, gen};
    if (send(z->req, &rq, sizeof rq, MSG_NOSIGNAL) != (ssize_t)sizeof rq)
        return s_zygote_gone(z, 1000);
    struct pollfd pf = {z->req, POLLIN, 0};
    int n;
    while ((n = poll(&pf, 1, REPLY_WAIT_MS)) < 0 && errno == EINTR) {
    }
    if (n == 0)
        return tp_error(TP_ERR_TIMEOUT, "%s: the zygote (pid %d) did not fork worker "
                        "%d within %d s", z->what, (int)z->pid, slot, REPLY_WAIT_MS / 1000);
    s_reply_t rep;
    ssize_t r = recv(z->req, &rep, sizeof rep, 0);
    if (r != (ssize_t)sizeof rep)
        return s_zygote_gone(z, 1000);
    TP_ASSERT(rep.slot == slot);
    if (rep.pid <= 0)
        return tp_error(TP_ERR_IO, "%s: fork worker %d (in the zygote): %s", z->what,
                        slot, strerror(rep.err));
    *pid = rep.pid;
    return TP_OK;
}

int df_zygote_reap(df_zygote_t *z, df_zygote_exit_t *e) {
    if (z->ended)
        return s_zygote_gone(z, 0);
    ssize_t r = recv(z->evt, e, sizeof *e, MSG_DONTWAIT);
    if (r == (ssize_t)sizeof *e) {
        e->msg[sizeof e->msg - 1] = '\0';
        return 1;
    }
    /* Nothing said: is it still there? (EOF may not come: see destroy.) */
    if (r < 0 && (errno == EAGAIN || errno == EINTR) && !s_wait_zygote(z, 0))
        return 0;
    return s_zygote_gone(z, 1000);
}

pid_t df_zygote_pid(const df_zygote_t *z) { return z ? z->pid : 0; }
