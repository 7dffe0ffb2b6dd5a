/* towerpack: the supervisor, which starts a tree of actors and watches it.
 *
 * Children are started in the order they were added (add them upstream
 * first) and each is ready before the next starts. The supervisor then
 * watches them from the thread that calls tp_supervisor_run:
 *  - a child that ends cleanly is done; the tree is done when all are;
 *  - a child that fails (its handler's error), or misses its heartbeat (no
 *    report for heartbeat_timeout_s: a handler stuck for that long), is
 *    restarted under its policy: up to max_restarts times within within_s
 *    seconds, after which the whole tree fails; max_restarts 0 fails the
 *    tree at once;
 *  - SIGINT or SIGTERM (when handle_signals) or tp_supervisor_stop start an
 *    orderly stop: sources stop producing and send end-of-stream, the rest
 *    drain what is in flight and end. What has not drained after
 *    drain_timeout_s is dropped (freed, never delivered), and so is
 *    everything at once on a second signal.
 * tp_supervisor_reason says why the tree stopped.
 *
 * Once a second the supervisor publishes every child's statistics on a PUB
 * socket (towerpack/stats.h), by default ipc://RUN_DIR/stats.sock.
 *
 * A restarted child gets fresh sockets. ipc and tcp peers reconnect by
 * themselves; over inproc, let the long-lived side bind and the child that
 * may restart connect. */
#ifndef TOWERPACK_SUPERVISOR_H
#define TOWERPACK_SUPERVISOR_H

#include <towerpack/actor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_supervisor tp_supervisor_t;

typedef struct tp_restart_policy {
    int max_restarts;  /* restarts allowed within within_s; 0: fail at once */
    double within_s;   /* the window; <= 0 means 10 s */
} tp_restart_policy_t;

typedef struct tp_supervisor_opts {
    const char *name;            /* in messages and as the stats source */
    const char *run_dir;         /* NULL: a private temp dir, removed at destroy */
    const char *stats;           /* tp_stats_endpoint_resolve request; NULL:
                                    ipc://RUN_DIR/stats.sock; "off": none */
    double stats_interval_s;     /* default 1 */
    int heartbeat_ms;            /* children report this often (default 250) */
    double heartbeat_timeout_s;  /* silent this long = failed (default 5) */
    double drain_timeout_s;      /* orderly stop's budget (default 1) */
    int handle_signals;          /* SIGINT/SIGTERM stop the tree (default 1) */
} tp_supervisor_opts_t;

/* Defaults as above. */
void tp_supervisor_opts_init(tp_supervisor_opts_t *opts);

/* A supervisor (children not started). opts NULL: defaults. Caller owns;
 * NULL with tp_last_error() when the run dir or stats socket fail. */
tp_supervisor_t *tp_supervisor_new(const tp_supervisor_opts_t *opts);

/* Terminate every child still running (upstream first, queued data
 * dropped), remove the stats socket and a private run dir, restore signal
 * handlers, free; accepts NULL, nulls *self_p. */
void tp_supervisor_destroy(tp_supervisor_t **self_p);

/* Add a child before start. def and arg are borrowed (a restart reuses
 * them). policy NULL: fail the tree at once. */
tp_status_t tp_supervisor_add(tp_supervisor_t *self, const tp_actor_def_t *def,
                              void *arg, const tp_restart_policy_t *policy);

/* Start the children in order. On a failure the ones started are
 * terminated and the error names the child. */
tp_status_t tp_supervisor_start(tp_supervisor_t *self);

/* Watch the tree for up to timeout_s (<= 0: until it ends). TP_OK when every
 * child finished cleanly, TP_ERR_INTERRUPTED after a signal or stop request,
 * TP_ERR_PEER when a child failed beyond its policy (the message names it
 * and how it failed), TP_ERR_TIMEOUT when still running (call again). */
tp_status_t tp_supervisor_run(tp_supervisor_t *self, double timeout_s);

/* Ask for an orderly stop. Safe from any thread and from a signal handler. */
void tp_supervisor_stop(tp_supervisor_t *self);

/* Why the tree stopped ("" while running). */
const char *tp_supervisor_reason(const tp_supervisor_t *self);

/* Where statistics are published ("" when off). */
const char *tp_supervisor_stats_endpoint(const tp_supervisor_t *self);

/* The run directory. */
const char *tp_supervisor_run_dir(const tp_supervisor_t *self);

/* Restarts of the child `name` so far, or -1 when there is none. */
int tp_supervisor_restarts(const tp_supervisor_t *self, const char *name);

/* Latest counters of the child `name` (TP_ERR_NOT_FOUND if none). */
tp_status_t tp_supervisor_child_stats(const tp_supervisor_t *self,
                                      const char *name, tp_stats_row_t *row);

/* ---- members: parts of a tree the supervisor watches but does not run ------
 * Parts of a tree that keep their own protocol and their own owner (a
 * training run's input actors, stages, towers and callback actor, and the
 * thread that runs the epoch schedule) join the supervisor as members: it
 * publishes their rows after its children's and asks each, at every watch
 * round, whether it is healthy. Their owner starts and stops them. */
typedef struct tp_supervised_ops {
    const char *name;  /* in messages */
    /* Up to max rows of statistics, as of now; returns how many. NULL: none. */
    int (*rows)(void *impl, tp_stats_row_t *rows, int max);
    /* TP_OK while healthy; an error, with tp_last_error() saying what failed
     * or hangs and where, fails the tree. NULL: always healthy. */
    tp_status_t (*check)(void *impl);
} tp_supervised_ops_t;

/* Add a member (before or after start). ops and impl are borrowed: keep
 * them alive while the supervisor lives. */
tp_status_t tp_supervisor_add_member(tp_supervisor_t *self,
                                     const tp_supervised_ops_t *ops, void *impl);

/* One watch round that never blocks, for a supervisor whose own thread does
 * work between rounds (training: its supervision phase, which the step runs
 * at its boundary and at each tick of its waits, tp_actor_wait_tick). It does what tp_supervisor_run
 * does in a round (signals and stop requests, children's ends, errors and
 * heartbeats under their policies, the members' checks, statistics when
 * due), except that children ending cleanly do not end the tree: its owner
 * does, by destroying it. Returns TP_OK while the tree runs;
 * TP_ERR_INTERRUPTED from the first signal or stop request on (the children
 * are asked to stop and drain); TP_ERR_PEER once a child failed beyond its
 * policy or a member's check failed (the children are stopped; the message
 * names which and how). */
tp_status_t tp_supervisor_tick(tp_supervisor_t *self);

/* Restarts of all children so far. */
int tp_supervisor_restarts_total(const tp_supervisor_t *self);

/* ---- signals --------------------------------------------------------------
 * Process-wide: SIGINT and SIGTERM only record that they arrived. Loops
 * that block (supervisor, dataflow runners, tp-worker) look at the record
 * at least every 100 ms and end in order. */

/* Install the handlers (idempotent; counted, so nested users are fine). */
tp_status_t tp_signals_install(void);
/* Undo one tp_signals_install; the last restores the previous handlers. */
void tp_signals_restore(void);
/* The last signal received (SIGINT or SIGTERM), or 0. */
int tp_signal_pending(void);
/* How many have arrived since the last clear. */
int tp_signal_count(void);
void tp_signal_clear(void);

/* A deadline on the orderly stop, for a program's main (a library must not
 * end its host): from the first SIGINT or SIGTERM on, the process has
 * `seconds` to end in order; past that, or at a second signal, it ends at
 * once (exit status 128 + the signal), saying so on stderr and in the log
 * file. The stop may be stuck where no flag is read: a thread inside a
 * compute library (BLAS, oneDNN, a device wait) never returns to check.
 * A timer the signal handler arms ends it, on whichever thread is free to
 * run the handler. 0 turns it off (the default). */
tp_status_t tp_signals_set_deadline(double seconds);

#ifdef __cplusplus
}
#endif
#endif
