/* towerpack dataflow: the zygote (fork server) of the process-parallel
 * dataflows (df_process.c); private to the dataflow room.
 *
 * A worker must be forked from a single-threaded process: a child of a
 * multi-threaded one may inherit a lock that another thread held at the
 * fork (the allocator's under ASan, the log's, stdio's) and hang on it.
 * The pool is made at reset_state, while the process is single-threaded;
 * by the time a worker dies the parent runs ZeroMQ I/O threads and actors.
 * So the pool forks one helper first, the zygote, which stays
 * single-threaded (no ZeroMQ, no actors: a poll loop on two socket pairs)
 * and forks every worker, the first ones and the replacements alike, as
 * Python's forkserver does. A worker is a fork of the zygote, so it starts
 * from the state the parent had at reset_state, however late it starts.
 *
 * Protocol, fixed-size records on two SOCK_SEQPACKET socket pairs:
 *   request  parent -> zygote  {slot, gen}: fork worker `slot`, which runs
 *            fn(arg, slot, gen, err_w, zygote pid)
 *            zygote -> parent  {slot, pid, errno}: its pid, or why not
 *   events   zygote -> parent  {slot, pid, wait status, message}: a worker
 *            ended; the message is what it wrote to its error pipe
 * Two pairs so that a spawn's reply never queues behind a death, and the
 * parent reads each with no bookkeeping. Closing the request socket (or
 * SIGTERM to the zygote) stops it: SIGTERM to every worker, 1 s, SIGKILL,
 * every worker reaped, exit. Lifetimes: the zygote dies with the parent and
 * each worker with the zygote (PR_SET_PDEATHSIG plus a parent check); the
 * parent reaps the zygote, the zygote its workers, so no zombie stays. */
#ifndef TOWERPACK_DF_ZYGOTE_H
#define TOWERPACK_DF_ZYGOTE_H

#include <sys/types.h>
#include <towerpack/status.h>

typedef struct df_zygote df_zygote_t;

/* What a worker runs, in the worker process (it must leave with _exit):
 * slot and gen as requested, err_w the write end of its error pipe (a
 * message written there reaches the parent with the exit), parent the
 * zygote's pid (the worker exits when getppid() no longer says so). */
typedef void (*df_zygote_fn)(void *arg, int slot, int gen, int err_w,
                             pid_t parent);

/* A worker that ended, as the zygote saw it. */
typedef struct {
    int slot;
    pid_t pid;
    int status;         /* waitpid's */
    char msg[2048];     /* what it wrote to its error pipe ("" for none) */
} df_zygote_exit_t;

/* Fork the zygote, for workers in slots [0, nslots). Call it while the
 * process is single-threaded (the caller checks the fork rule). `what`
 * names the pool in errors (static storage). Caller owns *out. */
tp_status_t df_zygote_new(const char *what, int nslots, df_zygote_fn fn,
                          void *arg, df_zygote_t **out);

/* Stop the workers and the zygote (bounded: about 1 s for the workers,
 * then SIGKILL) and reap it; accepts NULL, nulls *self_p. */
void df_zygote_destroy(df_zygote_t **self_p);

/* Have the zygote fork the worker of `slot` (generation gen); its pid in
 * *pid. Waits for the answer (bounded); TP_ERR_PEER when the zygote is
 * gone, TP_ERR_IO when its fork failed. */
tp_status_t df_zygote_spawn(df_zygote_t *self, int slot, int gen, pid_t *pid);

/* The next worker that ended into *e: 1, or 0 when none did. Never
 * waits. < 0 (TP_ERR_PEER, saying how the zygote ended) when the zygote
 * itself is gone: its workers went with it. */
int df_zygote_reap(df_zygote_t *self, df_zygote_exit_t *e);

/* The zygote's pid (the workers' parent). */
pid_t df_zygote_pid(const df_zygote_t *self);

#endif
