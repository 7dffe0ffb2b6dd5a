/* towerpack: actor statistics, their message on the wire, and the publisher.
 *
 * Every actor (and every bare loop that wants to be seen by tp-top) keeps
 * cumulative counters: messages and bytes in and out, and the time spent
 * busy, starved (waiting for input) and blocked (waiting on a full output).
 * Once a second a publisher turns the latest counters of all its actors into
 * one snapshot, with rates over the last interval, and sends it on a ZeroMQ
 * PUB socket as one binary frame (layout in docs/actors.md):
 *
 *   header (56 bytes):  magic "TPS1", version, row count, pid, sequence,
 *                       wall time, interval, source name (16 bytes)
 *   row (192 bytes each): name (48 bytes, NUL-terminated), state, restarts,
 *                       cumulative counters, rates and percentages, the
 *                       process the actor runs in and its host (32 bytes)
 *
 * The decoder checks every field before it trusts the message, so a
 * subscriber can read from any peer. */
#ifndef TOWERPACK_STATS_H
#define TOWERPACK_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_STATS_MAGIC 0x31535054u /* "TPS1", little-endian */
#define TP_STATS_VERSION 4         /* 2: each row says its process; 3: and its host;
                                      4: and a remote sender's addresses */
#define TP_STATS_NAME_MAX 48       /* bytes of a row name, with its NUL */
#define TP_STATS_SOURCE_MAX 16     /* bytes of the source name, with its NUL */
#define TP_STATS_MAX_ROWS 4096
#define TP_STATS_HEADER_BYTES 56
#define TP_STATS_ROW_BYTES 320
#define TP_STATS_HOST_MAX 32       /* bytes of a row's host name, with its NUL */
#define TP_STATS_WHERE_MAX 128     /* bytes of a row's addresses, with its NUL */

/* An actor's life, as tp-top shows it. */
typedef enum {
    TP_ACTOR_STARTING = 0,
    TP_ACTOR_RUNNING = 1,
    TP_ACTOR_STOPPING = 2,  /* asked to drain */
    TP_ACTOR_DONE = 3,      /* ended cleanly */
    TP_ACTOR_FAILED = 4,
    TP_ACTOR_RESTARTING = 5,
    TP_ACTOR_STATE_COUNT = 6,
} tp_actor_state_t;

/* "starting", "running", ...; "invalid" for an unknown value. */
const char *tp_actor_state_name(int state);

/* One actor's statistics. Counters are cumulative since the actor started;
 * rates and percentages cover the last publishing interval (the publisher
 * fills them). queue_fill is the input queue's fill in [0, 1], or -1 when
 * the runtime cannot see it (ipc/tcp inputs, sources). */
typedef struct tp_stats_row {
    char name[TP_STATS_NAME_MAX];
    uint8_t state;        /* tp_actor_state_t */
    uint32_t restarts;
    uint64_t msgs_in, msgs_out, bytes_in, bytes_out;
    double busy_s, starved_s, blocked_s, alive_s;
    double queue_fill;
    double msgs_per_s;    /* max(in, out) messages per second */
    double mb_per_s;      /* max(in, out) MB (1e6 bytes) per second */
    double busy_pct, starved_pct, blocked_pct;
    uint32_t pid;         /* the process it runs in; 0: the publisher's */
    char host[TP_STATS_HOST_MAX]; /* the host of that process, NUL-terminated
                                     (truncated); "": the publisher's, which
                                     the publisher fills in */
    char where[TP_STATS_WHERE_MAX]; /* a remote sender's addresses, each '>'
                                     (it connected to) or '@' (it bound) and
                                     the endpoint, ", "-separated
                                     (">tcp://10.0.0.1:5550"); "" for others */
} tp_stats_row_t;

/* One published snapshot. Held by value: init/fini. */
typedef struct tp_stats_snapshot {
    char source[TP_STATS_SOURCE_MAX]; /* "supervisor", "tp-worker", ... */
    uint32_t pid;
    uint64_t seq;         /* publisher's counter, from 0 */
    double wall_s;        /* seconds since the epoch */
    double interval_s;    /* what the rates cover */
    int nrows;
    tp_stats_row_t *rows; /* nrows; owned */
} tp_stats_snapshot_t;

void tp_stats_snapshot_init(tp_stats_snapshot_t *snap);
void tp_stats_snapshot_fini(tp_stats_snapshot_t *snap);

/* Encode into a new buffer of *size bytes (caller frees with free()). */
tp_status_t tp_stats_encode(const tp_stats_snapshot_t *snap, void **buf,
                            size_t *size);

/* Decode and validate `size` bytes into *snap (finished first). Any
 * malformed input is TP_ERR_PROTOCOL saying what was wrong; *snap is then
 * empty. */
tp_status_t tp_stats_decode(const void *buf, size_t size,
                            tp_stats_snapshot_t *snap);

/* The row that limits throughput, or -1: the busiest running actor that
 * is neither mostly starved nor mostly blocked (and busy at least 1% of
 * the interval). Rows of every process in the snapshot compete (forked
 * and remote workers' too). When no row qualifies because every running
 * row waits, the first running row that is mostly starved (the most
 * upstream: a stalled input); -1 when none is. */
int tp_stats_bottleneck(const tp_stats_snapshot_t *snap);

/* The snapshot as a JSON document (caller frees with free()); NULL on out
 * of memory. Per row: name, state, pid, host, "reached" and "bound" (the
 * endpoints of `where`, arrays), msgs_per_s, mb_per_s,
 * queue_fill, busy_pct, starved_pct, blocked_pct, the counters and
 * "bottleneck". */
char *tp_stats_to_json(const tp_stats_snapshot_t *snap);

/* This host's name as rows carry it: printable, truncated to `size` - 1
 * bytes ("localhost" when the system gives none). */
void tp_stats_hostname(char *out, size_t size);
/* Fill rates and percentages of `row` from its counters and the previous
 * counters of the same actor `prev` (NULL: since start) over `dt` s. */
void tp_stats_row_rates(tp_stats_row_t *row, const tp_stats_row_t *prev,
                        double dt);

/* Resolve a stats endpoint request into `out`:
 *   NULL, "" or "ipc"   ipc://RUN_DIR/stats.sock (run_dir required)
 *   "tcp"               tcp://127.0.0.1:* (an ephemeral loopback port)
 *   "tcp:PORT"          tcp://127.0.0.1:PORT
 *   "ipc://...", "tcp://...", "inproc://..."  as given (tcp as asked)
 * TP_ERR_INVALID for anything else or when it does not fit. */
tp_status_t tp_stats_endpoint_resolve(const char *request, const char *run_dir,
                                      char *out, size_t size);

/* A stats publisher: a bound PUB socket. Lives in the thread that made it. */
typedef struct tp_stats_pub tp_stats_pub_t;

/* Bind a publisher at `endpoint` (already resolved); `source` names it in
 * every snapshot. Caller owns; NULL with tp_last_error() on failure. */
tp_stats_pub_t *tp_stats_pub_new(const char *endpoint, const char *source);

/* Unbind (removing an ipc socket file) and free; accepts NULL, nulls. */
void tp_stats_pub_destroy(tp_stats_pub_t **self_p);

/* The endpoint as bound (an ephemeral tcp port resolved). */
const char *tp_stats_pub_endpoint(const tp_stats_pub_t *self);

/* Publish `rows` (cumulative counters filled; rates are computed here
 * against the previous publish of the same names). Never blocks: a slow
 * subscriber loses snapshots, not the publisher's time. */
tp_status_t tp_stats_pub_publish(tp_stats_pub_t *self, tp_stats_row_t *rows,
                                 int nrows);

/* Seconds since this publisher last published (or was made). */
double tp_stats_pub_since(const tp_stats_pub_t *self);

#ifdef __cplusplus
}
#endif
#endif
