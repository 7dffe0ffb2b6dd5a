/* towerpack actors: internals shared by the runtime, the supervisor, the
 * stats publisher and the process/remote dataflows. Not installed. */
#ifndef TOWERPACK_ACTORS_INTERNAL_H
#define TOWERPACK_ACTORS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/actor.h>

/* ThreadSanitizer cannot see the ordering that libzmq (not instrumented)
 * gives a message: what the sender wrote before sending is visible to the
 * receiver. Tell it, at each hand-off of memory through a socket. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TP_HANDOFF_RELEASE(p) __tsan_release((void *)(p))
#define TP_HANDOFF_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define TP_HANDOFF_RELEASE(p) ((void)(p))
#define TP_HANDOFF_ACQUIRE(p) ((void)(p))
#endif

/* Once per process, before czmq makes its first socket: keep czmq's own
 * SIGINT/SIGTERM handler out (towerpack turns signals into orderly stops
 * itself, see supervisor.h). */
void tp_actors_init(void);

/* ---- control frames -------------------------------------------------------
 * A one-frame message that is not a datapoint: "TCL1", kind, 3 zero bytes,
 * u32 sender index, then UTF-8 text (no NUL). Sent on the same sockets as
 * the data, so it keeps its place in the stream. */
#define TP_CTL_MAGIC 0x314C4354u /* "TCL1" */
#define TP_CTL_HEADER 12
enum { TP_CTL_EOS = 1, TP_CTL_ERROR = 2, TP_CTL_END_PASS = 3, TP_CTL_PAD = 4 };

/* Send TP_CTL_PAD_BYTES of padding (a TP_CTL_PAD frame receivers skip)
 * after the last message of a stream, before closing an ipc/tcp socket.
 * libzmq 4.3 can close a connection with the end of its send buffer still
 * unwritten when the peer is slow (libzmq issue #4763): what is lost then
 * is this padding, not the stream's last messages. */
#define TP_CTL_PAD_BYTES (256 * 1024)
int tp_ctl_send_pad(void *sock, int flags);

/* Send a control frame on a raw libzmq socket (flags as zmq_send). */
int tp_ctl_send(void *sock, int kind, uint32_t sender, const char *text,
                int flags);
/* 1 when data/size is a well-formed control frame (fills the outputs; text
 * is not terminated, *text_len bytes). */
int tp_ctl_parse(const void *data, size_t size, int *kind, uint32_t *sender,
                 const char **text, size_t *text_len);

/* ---- rate-limited logging ------------------------------------------------ */
typedef struct {
    uint64_t last_ns;
    uint64_t suppressed;
} tp_ratelog_t;
/* 1 when a record may be written now (at most one a second); counts the
 * rest in suppressed (reset when a record is allowed). */
int tp_ratelog_ok(tp_ratelog_t *rl);

/* ---- owner side, for the supervisor -------------------------------------- */
/* As tp_actor_new, the actor also sends its counters (a heartbeat) to its
 * owner every report_ms (0: never). */
tp_actor_t *tp_actor_new_ex(const tp_actor_def_t *def, void *arg,
                            int report_ms);
/* The owner's end of the actor's pipe, a raw libzmq socket to poll. NULL
 * once the actor has ended. */
void *tp_actor_pipe_raw(tp_actor_t *self);
/* Read what the actor sent (reports, its end); never blocks. */
void tp_actor_handle_pipe(tp_actor_t *self);
/* Monotonic ns of the last report or start. */
uint64_t tp_actor_last_seen_ns(const tp_actor_t *self);
/* Latest counters known to the owner (no request). */
const tp_stats_row_t *tp_actor_last_row(const tp_actor_t *self);
tp_status_t tp_actor_exit_status(const tp_actor_t *self);

#endif
