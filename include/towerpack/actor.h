/* towerpack: the actor runtime.
 *
 * An actor is a handler function, private state and named input and output
 * ports, run on its own thread (a czmq zactor). Ports are ZeroMQ sockets:
 * inputs PULL, outputs PUSH, each bound or connected to an endpoint.
 *
 *  - inproc:// ports pass a datapoint by pointer (one 8-byte frame); the
 *    datapoint's ownership moves with it and nothing is serialised.
 *  - ipc:// and tcp:// ports carry the wire format (towerpack/wire.h),
 *    optionally lz4-compressed; a malformed message is counted, logged
 *    (at most once a second) and dropped.
 *
 * Every port has a high-water mark (default TP_ACTOR_DEFAULT_HWM messages),
 * so a slow consumer blocks its producer instead of growing memory; an
 * inproc link holds at most about 2 x hwm datapoints (libzmq counts both
 * ends).
 *
 * The runtime, not the handler, keeps the statistics (towerpack/stats.h):
 * messages and bytes in and out, busy time, time starved (waiting for
 * input), time blocked (waiting on a full output) and the input queue fill.
 *
 * Life of an actor: init (on the actor's thread) -> running -> ends when
 *  - a source (no inputs) returns TP_DONE from produce, or is asked to stop
 *    (tp_actor_stop): the runtime then sends end-of-stream on every output;
 *  - every input has delivered end-of-stream: the runtime forwards it;
 *  - a handler returns an error: the actor fails with that message;
 *  - it is terminated (tp_actor_destroy): what is queued at its inputs is
 *    dropped (freed), nothing more is sent.
 * Then fini runs on the actor's thread and the owner learns how it ended.
 *
 * The owner side (tp_actor_new ... tp_actor_destroy) belongs to the thread
 * that created the actor. Destroy actors upstream first: a datapoint passed
 * by pointer into a socket whose reader is already gone cannot be freed. */
#ifndef TOWERPACK_ACTOR_H
#define TOWERPACK_ACTOR_H

#include <towerpack/datapoint.h>
#include <towerpack/stats.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_ACTOR_MAX_PORTS 16
#define TP_ACTOR_DEFAULT_HWM 50

typedef struct tp_actor tp_actor_t;
typedef struct tp_actor_ctx tp_actor_ctx_t;

/* One port. Strings are borrowed for the actor's life. */
typedef struct tp_actor_port {
    const char *name;      /* "in", "out", ... (NULL: "in0", "out1", ...) */
    const char *endpoint;  /* inproc://NAME, ipc://PATH or tcp://HOST:PORT */
    int bind;              /* 1: bind, 0: connect */
    int hwm;               /* messages; 0: TP_ACTOR_DEFAULT_HWM */
    int lz4;               /* ipc/tcp outputs: lz4-compress components */
} tp_actor_port_t;

/* What an actor is. The definition and its port arrays are borrowed: keep
 * them alive while the actor (or a supervisor that restarts it) lives. */
typedef struct tp_actor_def {
    const char *name;                /* unique within a supervisor */
    const tp_actor_port_t *inputs;   /* ninputs ports */
    int ninputs;
    const tp_actor_port_t *outputs;  /* noutputs ports */
    int noutputs;
    /* On the actor's thread before it reports ready: build the private
     * state from `arg` into *state. NULL: state = arg. An error fails
     * tp_actor_new with this function's message. */
    tp_status_t (*init)(tp_actor_ctx_t *ctx, void *arg, void **state);
    /* A datapoint arrived at input `port`: take *dp (leave it non-NULL and
     * the runtime frees it). *dp == NULL means end-of-stream on that port.
     * TP_OK goes on, TP_DONE ends the actor cleanly, < 0 fails it.
     * NULL: pass every datapoint to output 0. */
    tp_status_t (*on_data)(tp_actor_ctx_t *ctx, void *state, int port,
                           tp_datapoint_t **dp);
    /* Sources (no inputs): called in a loop; usually sends one datapoint.
     * TP_OK goes on, TP_DONE ends cleanly, < 0 fails. */
    tp_status_t (*produce)(tp_actor_ctx_t *ctx, void *state);
    /* On the actor's thread at the end (may be NULL). */
    void (*fini)(void *state);
} tp_actor_def_t;

/* ---- owner side ---------------------------------------------------------- */

/* Once per process, before czmq makes its first socket: keep czmq's own
 * SIGINT/SIGTERM handler out (towerpack turns signals into orderly stops
 * itself, see supervisor.h). */
void tp_actors_init(void);

/* ThreadSanitizer cannot see the ordering that libzmq (not instrumented)
 * gives a message: what the sender wrote before sending is visible to the
 * receiver. Code that hands memory to another thread through a socket (the
 * actors' pointer frames, the towers' STEP messages) says so with these. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TP_HANDOFF_RELEASE(p) __tsan_release((void *)(p))
#define TP_HANDOFF_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define TP_HANDOFF_RELEASE(p) ((void)(p))
#define TP_HANDOFF_ACQUIRE(p) ((void)(p))
#endif

/* Start an actor and wait until it is ready (its sockets bound or
 * connected, init done). Caller owns. NULL when init or a socket failed,
 * with tp_last_error() saying which actor and why. */
tp_actor_t *tp_actor_new(const tp_actor_def_t *def, void *arg);

/* Terminate (if still running: queued input is dropped), wait for the
 * thread and free; accepts NULL, nulls *self_p. Waits at most 5 s for a
 * handler that does not return; such a thread is abandoned and logged. */
void tp_actor_destroy(tp_actor_t **self_p);

/* Ask for an orderly end: a source stops producing and sends end-of-stream;
 * other actors end when their inputs do. */
tp_status_t tp_actor_stop(tp_actor_t *self);

/* Wait up to timeout_ms (< 0: forever) for the actor to end. Returns its
 * exit status (TP_OK for a clean end, the handler's error otherwise, with
 * tp_last_error() set to its message), or TP_ERR_TIMEOUT when still running. */
tp_status_t tp_actor_wait(tp_actor_t *self, int timeout_ms);

/* 1 once the owner has seen the actor end. */
int tp_actor_exited(const tp_actor_t *self);

/* Why the actor ended ("end of stream", "terminated", its error), or "". */
const char *tp_actor_reason(const tp_actor_t *self);

/* The actor's counters now (asks its thread, waits up to 1 s; the last
 * known counters after it ended). Rates are not filled. */
tp_status_t tp_actor_stats(tp_actor_t *self, tp_stats_row_t *row);

/* The actor's counters as its thread last published them, without asking
 * it: at most about 10 ms old while it runs (its loop looks at its pipe at
 * least that often, and publishes then; blocked on a full queue, its counts
 * are current and its times as old as its wait, up to 100 ms without
 * reports), the final ones after it ended.
 * Never waits: for statistics read while the actor works, e.g. once a
 * second by a trainer, where tp_actor_stats would wait for an actor that
 * is blocked on a full queue. Rates are not filled. */
tp_status_t tp_actor_stats_recent(tp_actor_t *self, tp_stats_row_t *row);

/* Names the calling thread "tp:" + the first 12 bytes of `name`, as `top
 * -H`, gdb and /proc/PID/task/TID/comm show it (the kernel keeps 15): an
 * actor's thread takes its actor's name, and the engine's own threads (a
 * tower, the callback actor) theirs, so that what runs beside the towers
 * can be told apart. Best effort: a failure changes nothing else. */
void tp_actor_name_thread(const char *name);

const char *tp_actor_name(const tp_actor_t *self);

/* ---- inside a handler (actor thread only) ---------------------------------- */

/* Send *dp_p on output `port`; takes it and nulls *dp_p. Blocks while the
 * output is full (counted as blocked time). TP_ERR_INTERRUPTED when the
 * actor is terminated meanwhile (the datapoint is freed); the handler
 * should then return that status. */
tp_status_t tp_actor_send(tp_actor_ctx_t *ctx, int port, tp_datapoint_t **dp_p);

/* Index of the input or output named `name`, or -1. */
int tp_actor_input(const tp_actor_ctx_t *ctx, const char *name);
int tp_actor_output(const tp_actor_ctx_t *ctx, const char *name);

/* 1 when the owner asked the actor to stop (sources should return TP_DONE). */
int tp_actor_stopping(const tp_actor_ctx_t *ctx);

/* 1 when the actor running on this thread has been asked to stop or end
 * (its owner's STOP or $TERM, seen the moment it is sent); 0 on a thread
 * that is not an actor's. Only answers: it reads no command and runs
 * nothing. */
int tp_actor_current_stopping(void);

const char *tp_actor_ctx_name(const tp_actor_ctx_t *ctx);

/* Messages dropped as malformed at this actor's inputs. */
uint64_t tp_actor_ctx_malformed(const tp_actor_ctx_t *ctx);

/* ---- waiting, on any thread ---------------------------------------------------
 * Code that blocks for data without a ctx (a dataflow's next run by a
 * prefetch actor or by the trainer's thread, an input's next, the trainer's
 * wait for its towers) wakes every 100 ms or so and calls
 * tp_actor_wait_tick() by name: that is the wait's phase. On an actor's
 * thread the actor reads its owner's commands there (a STATS? request is
 * answered, a STOP seen); on any thread the wait phase set with
 * tp_actor_wait_begin runs there. */

/* What a wait runs at each tick on the thread that set it: run(arg), whose
 * nonzero result asks the wait to end as a stop. */
typedef struct tp_wait_phase {
    int (*run)(void *arg);
    void *arg;
} tp_wait_phase_t;

/* The wait's phase; call it each time a wait wakes without its data. Reads
 * the actor's commands (on an actor's thread), then runs this thread's
 * wait phase (if one is set). 1 when the wait should end: the actor was
 * asked to stop or end, or the phase said so; the wait then returns
 * TP_ERR_INTERRUPTED. */
int tp_actor_wait_tick(void);

/* Make `phase` (borrowed; NULL: none) what this thread's waits run at each
 * tick until tp_actor_wait_end; returns the phase it replaces, which
 * tp_actor_wait_end puts back. The trainer sets its supervision phase
 * around each step, so a child that dies while the step waits for its
 * batches is restarted (or ends training) during the wait. */
const tp_wait_phase_t *tp_actor_wait_begin(const tp_wait_phase_t *phase);
void tp_actor_wait_end(const tp_wait_phase_t *previous);

/* ---- reading an actor's output on a thread that is not an actor -------------
 * The trainer's thread (or any owner) takes what an actor sends with a
 * reader: one input port on the calling thread, counted like an actor's.
 * For inproc it registers as the link's reader, so the writer hands it
 * pointers and whatever is still queued when it closes is freed. */
typedef struct tp_port_reader tp_port_reader_t;

/* Open `port` (bind or connect) as an input; `name` names it in messages.
 * Caller owns (and only its thread may use it); NULL on failure. */
tp_port_reader_t *tp_port_reader_new(const tp_actor_port_t *port,
                                     const char *name);
/* The next datapoint into *out (caller owns): TP_OK; TP_DONE when the
 * writer sent end-of-stream; TP_ERR_TIMEOUT after timeout_ms (< 0: wait
 * forever). Malformed messages on ipc/tcp are dropped and counted. */
tp_status_t tp_port_reader_recv(tp_port_reader_t *r, tp_datapoint_t **out,
                                int timeout_ms);
/* Datapoints received, and seconds spent waiting in recv: as of the last
 * recv; these two may be read from any thread. */
uint64_t tp_port_reader_count(const tp_port_reader_t *r);
double tp_port_reader_waited_s(const tp_port_reader_t *r);
/* Close (freeing anything still queued for this reader); accepts NULL. */
void tp_port_reader_destroy(tp_port_reader_t **r_p);

#ifdef __cplusplus
}
#endif
#endif
