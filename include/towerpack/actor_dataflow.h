/* towerpack: dataflows that run in other processes or come from other hosts.
 *
 *   tp_df_multiprocess      tensorpack's MultiProcessRunnerZMQ: N forked
 *                           workers each run their own copy of a dataflow
 *                           and PUSH to the parent's PULL over ipc
 *   tp_df_multiprocess_map  tensorpack's MultiProcessMapDataZMQ: the parent
 *                           reads a dataflow, N forked workers map it
 *   tp_df_remote            tensorpack's RemoteDataZMQ: datapoints from one
 *                           or more endpoints (tcp or ipc) as a dataflow
 *   tp_send_dataflow        tensorpack's send_dataflow_zmq: a dataflow to
 *                           an endpoint
 * Datapoints cross in the wire format (towerpack/wire.h), lz4 optional.
 *
 * The fork rule: workers are forked in tp_dataflow_reset_state, which must
 * run before the process has started any thread or CUDA context (no
 * actors, no supervisor, no CUDA yet). It is checked: reset_state fails
 * with TP_ERR_STATE when /proc/self/task shows more than one thread or the
 * CUDA module is loaded, unless opts.allow_threads says the caller knows
 * better. reset_state forks one helper, the zygote: a single-threaded
 * copy of the process as it was then, which forks every worker, the first
 * ones and those that replace dead ones (TP_WORKER_RESTART). So a
 * replacement starts from the state of reset_state, never from the later,
 * multi-threaded parent, and cannot inherit a lock another thread held.
 * Workers open a fresh ZeroMQ context of their own.
 *
 * Lifetimes: the zygote dies with the parent and the workers with the
 * zygote (PR_SET_PDEATHSIG (SIGKILL) plus a check of the parent pid), also
 * when the parent is SIGKILLed. Both ignore SIGINT (the parent decides).
 * The zygote reaps its workers and tells the parent, which looks at least
 * every 100 ms while it waits, so a dead worker is seen within a second;
 * by policy it is restarted or next() fails naming the worker and how it
 * died (exit status or signal). An error inside a worker reaches the
 * parent with its message. What a restart drops or repeats: see
 * tp_df_multiprocess and tp_df_multiprocess_map.
 * next() never waits forever: signals recorded by tp_signals_install make
 * it return TP_ERR_INTERRUPTED, and opts.timeout_s bounds a silent wait. */
#ifndef TOWERPACK_ACTOR_DATAFLOW_H
#define TOWERPACK_ACTOR_DATAFLOW_H

#include <stdint.h>
#include <towerpack/dataflow.h>
#include <towerpack/stats.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TP_WORKER_FAIL = 0,     /* a dead worker fails next() with its story */
    TP_WORKER_RESTART = 1,  /* fork a replacement, up to max_restarts */
} tp_worker_policy_t;

typedef struct tp_mp_opts {
    int hwm;                    /* messages per socket (default 50) */
    tp_worker_policy_t policy;  /* default TP_WORKER_FAIL */
    int max_restarts;           /* in all, for TP_WORKER_RESTART (default 3) */
    const char *run_dir;        /* ipc sockets go here; NULL: private temp dir */
    int allow_threads;          /* skip the fork-rule check (default 0) */
    double timeout_s;           /* next() fails after this long without data
                                   (0: no limit; signals still end it) */
    int buffer_size;            /* map: datapoints in flight (default 200) */
    int lz4;                    /* compress between processes (default 0) */
} tp_mp_opts_t;

void tp_mp_opts_init(tp_mp_opts_t *opts);

/* MultiProcessRunnerZMQ over `inner` (taken). Each of the nworkers forked
 * workers runs its own copy of inner, seeded with the runner's seed and a
 * stream of its own, pass after pass. A pass of the runner is size(inner)
 * datapoints in arrival order (endless when the size is unknown), as in
 * tensorpack. A restart (TP_WORKER_RESTART) drops what the dead worker had
 * made and not yet delivered (its socket's queue, up to hwm datapoints)
 * and starts its replacement on a fresh pass of inner with a new stream
 * (the slot's start count is part of it), so datapoints the dead worker
 * had sent may come again and those it had not reached may not come from
 * it: the runner's pass stays size(inner) datapoints, but which ones
 * differs from a run without the death. Caller owns; NULL on bad arguments (tp_last_error()). */
tp_dataflow_t *tp_df_multiprocess(tp_dataflow_t *inner, int nworkers,
                                  const tp_mp_opts_t *opts);

/* A map function for tp_df_multiprocess_map, run in a worker process:
 * transform *dp in place or replace it; set it to NULL to drop the
 * datapoint; < 0 fails (the parent's next() reports the message). */
typedef tp_status_t (*tp_map_fn)(void *arg, tp_datapoint_t **dp);

/* MultiProcessMapDataZMQ: the parent iterates `inner` (taken) and nworkers
 * forked workers apply fn(arg, &dp). strict: results come in the order of
 * inner, exactly one pass of inner per pass. Not strict: in completion
 * order, the buffer kept full across passes; a pass is size(inner)
 * results. With TP_WORKER_RESTART the parent keeps a copy of each datapoint
 * in flight (buffer_size of them) so that a dead worker's share is redone
 * by a live worker or the replacement: nothing is dropped, and a result
 * that arrives twice is taken once, so strict mode stays exact. The map
 * function may run twice on a datapoint (side effects repeat). Caller
 * owns; NULL on bad arguments. */
tp_dataflow_t *tp_df_multiprocess_map(tp_dataflow_t *inner, int nworkers,
                                      tp_map_fn fn, void *arg, int strict,
                                      const tp_mp_opts_t *opts);

/* Worker restarts so far of the multiprocess dataflows in df: df itself or
 * any dataflow it wraps, at any depth (e.g. the `processes N` stage inside
 * `... | processes 2 | batch 32`), summed; -1 when there is none. Nested
 * dataflows are known once df was reset. Safe from another thread than the
 * one iterating df (the trainer reads it between epochs). */
int tp_df_multiprocess_restarts(tp_dataflow_t *df);

/* Bad image files skipped (skip-bad) by the image sources in df, at any
 * depth: those iterated in this process, plus, for each multiprocess
 * dataflow, the largest count its workers reported (each worker reads the
 * whole source, so they find the same files). -1 when df has neither. Any
 * thread. */
int64_t tp_df_skipped_files(tp_dataflow_t *df);

/* The forked workers of the multiprocess dataflows in df (df itself or
 * any it wraps) as statistics rows, one per worker slot, "dataflow worker
 * N", at most `max` into `rows`; returns how many (0: df forks none). Each
 * row has the worker's pid (its current process; 0 and failed while none
 * runs), the slot's restarts, and what its processes reported on their
 * data socket (TP_CTL_STATS, twice a second): datapoints and wire bytes
 * sent, busy, blocked and (a map's) starved time. Any thread. */
int tp_df_multiprocess_rows(tp_dataflow_t *df, tp_stats_row_t *rows, int max);

/* The pid of the zygote that forks df's workers (0 before reset_state or
 * for another kind of dataflow). For tests and tools. */
int tp_df_multiprocess_zygote(tp_dataflow_t *df);

/* Pids of the live workers of the multiprocess dataflows in df (df itself
 * or any it wraps) into pids[0..n); returns how many. Any thread. */
int tp_df_multiprocess_pids(tp_dataflow_t *df, int *pids, int n);

typedef struct tp_remote_opts {
    int bind;           /* 1: bind every endpoint (default), 0: connect */
    int hwm;            /* default 50 */
    double timeout_s;   /* next() fails after this long without data (0: no
                           limit; signals still end it) */
    size_t max_bytes;   /* largest datapoint accepted (default 1 GiB) */
    const char *curve_dir;  /* CURVE key directory (towerpack/security.h):
                               binding endpoints are CURVE servers,
                               connecting ones clients (not both); NULL: off */
    int allow_public;   /* allow a tcp bind to every interface (default 0) */
    int int32_labels;   /* tensorpack messages: int64 components become int32
                           (range-checked; tp_tpk_opts_t, towerpack/tensorpack.h) */
    const char *job;    /* this run's job id (towerpack/wire.h, copied): a
                           sender that gives another is refused, its
                           datapoints dropped and counted, with a warning
                           naming both ids; NULL (default): no check */
    double unfit_grace_s;  /* with tp_df_remote_expect: how long no sender
                              may send fitting datapoints, after one sent
                              one that does not fit, before next() fails
                              (default 10: a fitting sender may be starting) */
} tp_remote_opts_t;

void tp_remote_opts_init(tp_remote_opts_t *opts);

/* RemoteDataZMQ: datapoints arriving at `endpoints` ("tcp://...,ipc://..."
 * comma-separated; a leading '@' binds that one, '>' connects it, otherwise
 * opts.bind decides) as an endless dataflow (size -1). Each message may be
 * in towerpack's wire format or in any of tensorpack's (pickle, msgpack,
 * zmq_ops: towerpack/tensorpack.h), told apart by its first bytes. A
 * malformed message is counted, logged at most once a second and dropped. Sockets are made at
 * reset_state and belong to the thread that iterates. Caller owns; NULL
 * with tp_last_error() on a bad endpoint list. */
tp_dataflow_t *tp_df_remote(const char *endpoints, const tp_remote_opts_t *opts);

/* Messages a remote dataflow dropped as malformed, or 0 for others. */
uint64_t tp_df_remote_malformed(tp_dataflow_t *df);

/* A component every datapoint of a remote dataflow must have: its dtype
 * and shape (shape[k] < 0: any size there), and a name for messages. */
typedef struct tp_remote_expect {
    const char *name;
    tp_dtype_t dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    int64_t bound;  /* > 0 (integer dtypes): every value lies in 0..bound-1 (a
                       label's classes); 0: values unchecked */
} tp_remote_expect_t;

/* Check every datapoint `df` (a remote dataflow) receives against n
 * components (copied). One that does not fit, well-formed as it is, is
 * dropped and counted (tp_df_remote_unfit) with a warning naming its
 * sender and the mismatch. Called before reset_state, the components also
 * ride in the handshake (X-Tp-Comps, towerpack/wire.h): a connecting
 * tp-worker reads them and ends at its first datapoint that does not fit,
 * naming both sides here and there. Once a sender sent (or said it has)
 * datapoints that do not fit, and no fitting datapoint came since, next()
 * fails (TP_ERR_SHAPE) saying so when for opts.unfit_grace_s no sender
 * connected may still fit (every one sent only unfit ones, or none is
 * left). TP_ERR_INVALID for another kind of dataflow or n out of range. */
tp_status_t tp_df_remote_expect(tp_dataflow_t *df, const tp_remote_expect_t *comps, int n);

/* What the datapoints of `pipeline` (a spec's dataflow, say) must be: n
 * components (copied), as for tp_df_remote_expect (a trainer's model
 * inputs, batch first). Before reset_state. At reset_state a remote
 * dataflow and a multiprocess runner inside it derive their own from them
 * through the stages in between (a `batch` drops the batch dimension;
 * shuffle, repeat, cache and fixed-size keep them; after any other stage
 * nothing is known and nothing is checked): the remote one checks (and its
 * handshake carries) them as tp_df_remote_expect's; every worker of the
 * runner checks its first datapoint and ends, naming the mismatch, when
 * it does not fit. TP_ERR_INVALID for n out of range. */
tp_status_t tp_df_expect(tp_dataflow_t *pipeline, const tp_remote_expect_t *comps, int n);

/* Messages a remote dataflow dropped because their sender gave another
 * job id than opts.job (0 for others). */
uint64_t tp_df_remote_refused(tp_dataflow_t *df);

/* Datapoints a remote dataflow dropped as not fitting (0 for others). */
uint64_t tp_df_remote_unfit(tp_dataflow_t *df);

/* Bytes of every message a remote dataflow received (datapoints, malformed
 * messages and the senders' reports), or 0 for others. Any thread. */
uint64_t tp_df_remote_bytes(tp_dataflow_t *df);

/* Keep freed receive buffers in this process (glibc: large messages from
 * the heap, its top not trimmed below 64 MiB), once; what a remote
 * dataflow does at its first reset_state, so that libzmq receives each
 * large message into memory already mapped rather than fresh pages (page
 * faults on every message otherwise). Nothing when the user tuned malloc
 * (MALLOC_*_, GLIBC_TUNABLES) or set TP_REMOTE_KEEP_BUFFERS=0. For a
 * program receiving with libzmq itself (tp-bench's raw reference). */
void tp_remote_keep_receive_buffers(void);

/* What a watchdog says about a remote dataflow's senders, into buf: the
 * connections open ("2 senders connected", counted from their accept or
 * connect to their close), how long ago the last datapoint came, and the
 * senders that reported, latest first ("last seen: tp-worker 4121@vm
 * 10.2 s ago (gone)"). Returns the length, -1 for another kind of
 * dataflow. On the thread that iterates df. */
int tp_df_remote_describe(tp_dataflow_t *df, char *buf, size_t size);

/* The senders (tp_send_dataflow, tp-worker) feeding the remote dataflows in
 * df (df itself or any it wraps) as statistics rows, "tp-worker PID@HOST",
 * at most `max` into `rows`; returns how many. Each row has the sender's
 * pid and host and what it last reported on the data socket (TP_CTL_REPORT,
 * twice a second): datapoints and bytes sent, busy (making them), blocked
 * (waiting on a full socket). A sender is gone when the connection its
 * reports came on closes (a killed worker's: at once, seen while the
 * receiver receives), or when it has said nothing for
 * TP_REMOTE_SENDER_GONE_S of the receiver's own receiving (a peer that
 * vanished without closing; reports can wait behind a full pipe of
 * datapoints for seconds). Any thread. */
#define TP_REMOTE_SENDER_GONE_S 10.0
int tp_df_remote_rows(tp_dataflow_t *df, tp_stats_row_t *rows, int max);

typedef struct tp_send_opts {
    int bind;               /* 1: bind, 0: connect (default) */
    int hwm;                /* default 50 */
    int lz4;                /* compress components */
    int64_t max_count;      /* stop after this many (0: endless) */
    uint64_t seed;          /* reset_state(seed, stream) of the dataflow */
    uint64_t stream;
    const char *stats;      /* publish stats here (tp_stats_endpoint_resolve
                               request), NULL: none */
    const char *stats_name; /* row name (default "send") */
    const char *run_dir;    /* for an "ipc" stats request */
    double linger_s;        /* at the end, wait this long for the peer to
                               take what is queued (default 2) */
    const char *curve_dir;  /* CURVE key directory (towerpack/security.h):
                               a bound sender is the CURVE server, a
                               connecting one the client; NULL: off */
    int allow_public;       /* allow a tcp bind to every interface */
    int tpk_format;         /* 0: towerpack's wire format (default); or one
                               of tensorpack's (TP_TPK_PICKLE, TP_TPK_MSGPACK,
                               TP_TPK_ZMQ_OPS of towerpack/tensorpack.h): one
                               frame a datapoint, for a Python RemoteDataZMQ
                               (no padding frame at the end: Python would
                               try to load it) */
    int no_report;          /* 1: no TP_CTL_REPORT frames to the receiver
                               (default 0: twice a second, so the receiving
                               trainer's statistics show this sender;
                               always off with tpk_format) */
    double peer_gone_s;     /* > 0: end (TP_DONE) once no receiver has been
                               connected for this long, after one was (its
                               trainer ended); 0 (default): send forever */
    const char *job;        /* the job id this sender is for (towerpack/
                               wire.h): carried by its connections, and a
                               connecting sender without CURVE asks each
                               receiver it reaches for its id; one of
                               another job ends it (TP_ERR_PEER naming both
                               ids). NULL (default): none */
} tp_send_opts_t;

void tp_send_opts_init(tp_send_opts_t *opts);

/* send_dataflow_zmq: reset `df` and send it, pass after pass, to `endpoint`
 * until max_count datapoints, an error of df (returned), or a signal
 * recorded by tp_signals_install (TP_ERR_INTERRUPTED). A connecting sender
 * whose handshake with the receiver fails (CURVE keys missing or not the
 * receiver's), or whose receiver is of another job (opts.job), ends with
 * TP_ERR_PEER naming the receiver and the cause;
 * with opts.peer_gone_s it ends with TP_DONE (and a message, in
 * tp_last_error) once the receivers have been gone that long. df stays
 * the caller's. *sent (may be NULL) gets the count queued to the socket. */
tp_status_t tp_send_dataflow(tp_dataflow_t *df, const char *endpoint,
                             const tp_send_opts_t *opts, uint64_t *sent);

/* Add the spec source `remote:ENDPOINT[,ENDPOINT...]` and the stage
 * `processes N [restart[=R]] [hwm=H] [lz4]` to the pipeline spec parser
 * (done automatically when the library loads; call it from programs that
 * link libtowerpack.a). TP_ERR_UNSUPPORTED in a build without the parser. */
tp_status_t tp_actor_spec_register(void);

/* The factory a tp-worker plugin exports under this name: build a dataflow
 * from the plugin's own arguments (argv[0] is the plugin path). */
#define TP_WORKER_FACTORY "tp_worker_dataflow"
typedef tp_status_t (*tp_worker_factory_fn)(int argc, char **argv,
                                            tp_dataflow_t **out);

#ifdef __cplusplus
}
#endif
#endif
