/* towerpack dataflow: datapoints to and from other processes and hosts,
 * tensorpack's send_dataflow_zmq (tp_send_dataflow) and RemoteDataZMQ
 * (tp_df_remote), on the wire format.
 *
 * The receiving side trusts nothing: every message is validated by the
 * wire decoder, or, when it is one frame in one of tensorpack's formats
 * (pickle, msgpack, zmq_ops: a Python send_dataflow_zmq), by tensorpack's
 * decoders (df_tp_*.c); one that fails is counted, logged at most once a
 * second, and dropped; the stream goes on. So is a well-formed datapoint
 * that does not fit what the receiver expects (tp_df_remote_expect, or
 * derived at reset_state from a pipeline's tp_df_expect): its shapes, or a
 * label out of the model's classes, counted per sender. */
#include <czmq.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/security.h>
#include <towerpack/stats.h>
#include <towerpack/supervisor.h>
#include <towerpack/wire.h>
#include <towerpack/actor.h>
#include <towerpack/tensorpack.h>
#include "df_internal.h"
#if __has_include(<towerpack/dataflow_spec.h>)
#include <towerpack/dataflow_spec.h>
#define TP_HAVE_SPEC 1
#endif

/* A draft option in libzmq 4.3's header, built into Debian's library
 * (core/wire_job.c sends the job id with it too). */
#ifndef ZMQ_METADATA
#define ZMQ_METADATA 95
#endif

void tp_remote_opts_init(tp_remote_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    opts->bind = 1;
    opts->hwm = 50;
    opts->max_bytes = (size_t)1 << 30;
    opts->unfit_grace_s = 10;
}

void tp_send_opts_init(tp_send_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    opts->hwm = 50;
    opts->linger_s = 2.0;
}

static int s_endpoint_ok(const char *ep) {
    return !strncmp(ep, "tcp://", 6) || !strncmp(ep, "ipc://", 6) ||
           !strncmp(ep, "inproc://", 9);
}

/* ---- RemoteDataZMQ ---------------------------------------------------------------- */

#define MAX_ENDPOINTS 64
#define MAX_SENDERS 64

/* A sender as its last TP_CTL_REPORT said. */
typedef struct {
    tp_stats_row_t row;   /* name, host, pid, state, counters */
    uint64_t seen_ns;     /* when its last report came */
    int fd;               /* the connection its reports come on (-1: unknown) */
    int gone;             /* that connection closed: kept a while so that its
                             reports still queued do not bring it back */
    uint64_t gone_ns;
    uint64_t unfit;       /* its datapoints dropped as not fitting */
    char peer[96];        /* its address (tcp) or process (ipc) */
} s_sender_seen_t;

#define MAX_EXPECT TP_WIRE_COMPS_N

/* How long a gone sender's entry stays to absorb its late reports. */
#define S_TOMBSTONE_NS 30000000000ull

typedef struct {
    tp_remote_opts_t opts;
    char *endpoints[MAX_ENDPOINTS];
    int bind[MAX_ENDPOINTS];   /* per endpoint: '@' bind, '>' connect */
    int nendpoints;
    void *zctx;           /* a context of its own (fork-robust, no czmq) */
    void *pull;
    tp_wire_msg_t *msg;
    tp_wire_opts_t wire;
    uint64_t malformed;
    tp_ratelog_t ratelog;
    tp_tpk_opts_t tpk;    /* tensorpack's formats */
    unsigned seen;        /* bit per tp_tpk_format_t already logged */
    tp_curve_t *curve;
    char *curve_dir;      /* the caller's opts.curve_dir, copied */
    /* the senders' reports: written by the thread that iterates, read by
     * any (tp_df_remote_rows) */
    pthread_mutex_t mu;
    s_sender_seen_t senders[MAX_SENDERS];
    int nsenders;
    uint64_t active_ns;   /* the iterating thread last waited or received */
    void *mon;            /* PAIR: the pull socket's connection events */
    /* For the watchdog and the statistics, written by the iterating thread:
     * the connections open (their file descriptors), when the last datapoint came, and the
     * bytes of every message received (atomic: read from any thread). */
    int conn_fds[MAX_SENDERS];
    int conn_fit[MAX_SENDERS];  /* per connection: 0 nothing yet, 1 its last
                                   datapoint fitted, 2 it did not */
    int nconns;
    uint64_t data_ns;
    uint64_t bytes;
    tp_ratelog_t handshake_log;  /* failed handshakes, at most once a second */
    /* tp_df_remote_expect: what every datapoint must be */
    tp_wire_comp_t expect[MAX_EXPECT];
    int nexpect;
    uint64_t unfit;
    uint64_t unfit_since;   /* since when no datapoint fitted, after one did
                               not (0: the last one fitted, or none came) */
    char last_unfit[512];   /* the last sender that did not fit, and why */
    char peer[96];          /* the last message's sender's address (s_msg_peer),
                               read when there are components to check */
    tp_ratelog_t unfit_log;
    /* the job handshake: this run's id ("" for none), the connections of
     * refused senders (each named once in the log) and the messages of
     * theirs dropped */
    char job[TP_WIRE_JOB_MAX];
    tp_dataflow_t *self;    /* its own dataflow: the stages above it (tp_df_expect) */
    int refused_fds[MAX_SENDERS];
    int refused_named[MAX_SENDERS];  /* its log line had the sender's name */
    int nrefused;
    uint64_t refused;
    /* the refused senders already named in the log (pid, host; a ring):
     * one that reconnects is not named again */
    struct {
        uint32_t pid;
        char host[TP_STATS_HOST_MAX];
    } refused_who[MAX_SENDERS];
    int nrefused_who;
} s_remote_t;


int df_remote_report_parse(const char *text, size_t len, tp_stats_row_t *out) {
    char buf[512];
    if (len >= sizeof buf)
        return -1;
    memcpy(buf, text, len);
    buf[len] = '\0';
    if (memchr(buf, '\0', len))
        return -1;
    /* ten fields, or eleven (the sender's addresses: senders before them
     * send ten), none empty (strtok_r would merge empty ones) */
    char *f[11];
    int n = 0;
    for (char *p = buf; n < 11; n++) {
        f[n] = p;
        char *tab = strchr(p, '\t');
        if (!tab)
            break;
        *tab = '\0';
        p = tab + 1;
    }
    if (n != 9 && n != 10)
        return -1;
    for (int i = 0; i <= n; i++)
        if (!f[i][0])
            return -1;
    unsigned long long v[8];
    for (int i = 0; i < 8; i++) {
        const char *t = f[i < 1 ? 0 : i + 2];
        if (*t < '0' || *t > '9')
            return -1;
        char *end;
        errno = 0;
        v[i] = strtoull(t, &end, 10);
        if (*end || errno)
            return -1;
    }
    /* v: pid, state, alive, busy, blocked, starved, msgs, bytes */
    size_t hl = strlen(f[1]), nl = strlen(f[2]);
    if (v[0] == 0 || v[0] > 0xffffffffull || v[1] >= TP_ACTOR_STATE_COUNT ||
        hl >= TP_STATS_HOST_MAX || nl >= TP_STATS_NAME_MAX)
        return -1;
    for (size_t i = 0; i < hl; i++)
        if ((unsigned char)f[1][i] < 0x21 || (unsigned char)f[1][i] > 0x7e)
            return -1;
    for (size_t i = 0; i < nl; i++)
        if ((unsigned char)f[2][i] < 0x20 || (unsigned char)f[2][i] > 0x7e)
            return -1;
    size_t wl = n == 10 ? strlen(f[10]) : 0;
    if (wl >= TP_STATS_WHERE_MAX)
        return -1;
    for (size_t i = 0; i < wl; i++)
        if ((unsigned char)f[10][i] < 0x20 || (unsigned char)f[10][i] > 0x7e)
            return -1;
    memset(out, 0, sizeof *out);
    memcpy(out->name, f[2], nl);
    memcpy(out->host, f[1], hl);
    if (wl)
        memcpy(out->where, f[10], wl);
    out->pid = (uint32_t)v[0];
    out->state = (uint8_t)v[1];
    out->alive_s = (double)v[2] * 1e-9;
    out->busy_s = (double)v[3] * 1e-9;
    out->blocked_s = (double)v[4] * 1e-9;
    out->starved_s = (double)v[5] * 1e-9;
    out->msgs_out = v[6];
    out->bytes_out = v[7];
    out->queue_fill = -1;
    return 0;
}

/* Where the sender of the message in msg is, for messages: its IP
 * address (tcp) or "process PID" (ipc), from the connection's properties
 * as libzmq read them at connect (right after a close too, and never a
 * later connection's: file descriptors are reused); "" when unknown. */
static void s_msg_peer(tp_wire_msg_t *msg, char *out, size_t size) {
    const char *pa = tp_wire_msg_frames(msg) > 0 ? tp_wire_msg_frame_peer(msg, 0) : NULL;
    out[0] = '\0';
    if (!pa || !*pa)
        return;
    const char *colon = strchr(pa, ':'), *last = strrchr(pa, ':');
    if (colon && colon != last && strspn(last + 1, "0123456789") == strlen(last + 1))
        snprintf(out, size, "process %.20s", last + 1);  /* ipc: HOST:UID:GID:PID */
    else
        snprintf(out, size, "%.60s", pa);
}

static void s_sender_full(const s_remote_t *r, const tp_stats_row_t *row, const char *peer,
                          char *out, size_t size);

/* One report (text of a TP_CTL_REPORT frame): into the senders' table,
 * replacing the same sender's last, or dropped when malformed (the data
 * socket may carry anything: every field is checked). */
static void s_take_sender_report(s_remote_t *r, const char *text, size_t len, int fd) {
    tp_stats_row_t row;
    if (df_remote_report_parse(text, len, &row) < 0)
        return;
    uint64_t now = tp_now_ns();
    pthread_mutex_lock(&r->mu);
    int k = 0;
    while (k < r->nsenders && !(r->senders[k].row.pid == row.pid &&
                                !strcmp(r->senders[k].row.host, row.host)))
        k++;
    if (k < r->nsenders && r->senders[k].gone) {
        pthread_mutex_unlock(&r->mu);  /* a report of a closed connection */
        return;
    }
    if (k == r->nsenders && r->nsenders == MAX_SENDERS) {
        /* full: the oldest gone entry makes room, if there is one */
        int old = -1;
        for (int i = 0; i < r->nsenders; i++)
            if (r->senders[i].gone && (old < 0 || r->senders[i].gone_ns < r->senders[old].gone_ns))
                old = i;
        if (old >= 0)
            r->senders[old] = r->senders[--r->nsenders];
    }
    int joined = k == r->nsenders;
    if (k == r->nsenders && r->nsenders < MAX_SENDERS)
        k = r->nsenders++;
    if (joined && k < r->nsenders) {  /* a new sender: the log says who feeds the run */
        char full[512];
        s_sender_full(r, &row, r->peer, full, sizeof full);
        TP_INFO("remote: %s joined", full);
    }
    if (k < r->nsenders) {
        if (joined)
            r->senders[k].unfit = 0;
        r->senders[k].row = row;
        r->senders[k].seen_ns = now;
        r->senders[k].fd = fd;
        r->senders[k].gone = 0;
        if (r->peer[0])  /* the report's own connection (s_remote_next) */
            snprintf(r->senders[k].peer, sizeof r->senders[k].peer, "%s", r->peer);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Connections by descriptor: the receiver's open ones and those it
 * refused, a sender's open ones. Each is a list of at most MAX_SENDERS
 * descriptors, any state per connection in arrays beside it, kept in step
 * through the slots these give. */

/* fd's slot in fds[0..n), or n when it has none. */
static int s_fd_find(const int *fds, int n, int fd) {
    int k = 0;
    while (k < n && fds[k] != fd)
        k++;
    return k;
}

/* Appends fd to fds[0..*n): its slot, or -1 when the list is full. */
static int s_fd_add(int *fds, int *n, int fd) {
    if (*n >= MAX_SENDERS)
        return -1;
    fds[*n] = fd;
    return (*n)++;
}

/* Takes fd out of fds[0..*n), the last one moving into its slot: that
 * slot (the state beside the list follows: a[k] = a[*n]), or -1 when fd
 * has none. */
static int s_fd_remove(int *fds, int *n, int fd) {
    int k = s_fd_find(fds, *n, fd);
    if (k == *n)
        return -1;
    fds[k] = fds[--*n];
    return k;
}

/* A socket monitor's events read in one go at the most: a storm of
 * connections cannot hold up the thread that reads them. */
#define S_MONITOR_BURST 64

/* One event of a socket monitor (zmq_socket_monitor), never waited for:
 * its number and value (a descriptor, an error code); the endpoint's frame
 * is read and dropped. 0 when none is pending, or there is no monitor. */
static int s_monitor_event(void *mon, uint16_t *event, uint32_t *value) {
    if (!mon)
        return 0;
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&ev);
        return 0;
    }
    int more = zmq_msg_more(&ev);
    *event = 0;
    *value = 0;
    if (zmq_msg_size(&ev) >= 6) {
        memcpy(event, zmq_msg_data(&ev), 2);
        memcpy(value, (const char *)zmq_msg_data(&ev) + 2, 4);
    }
    zmq_msg_close(&ev);
    if (more) {  /* the endpoint's frame */
        zmq_msg_t addr;
        zmq_msg_init(&addr);
        zmq_msg_recv(&addr, mon, 0);
        zmq_msg_close(&addr);
    }
    return 1;
}

/* The pull socket's closed connections (libzmq's monitor events, never
 * waited for): the senders whose reports came on one are gone. A killed
 * worker's connection closes with its process, so its rows go at once;
 * the silence rule (TP_REMOTE_SENDER_GONE_S) is for peers that vanish
 * without closing (a host that died). */
static void s_drain_monitor(s_remote_t *r) {
    uint16_t event;
    uint32_t value;
    for (int i = 0; i < S_MONITOR_BURST && s_monitor_event(r->mon, &event, &value); i++) {
        /* a connection is counted from its accept (bind) or connect, when
         * the event carries its descriptor, to its close; one whose
         * handshake fails closes at once */
        if (event == ZMQ_EVENT_ACCEPTED || event == ZMQ_EVENT_CONNECTED) {
            int k = s_fd_add(r->conn_fds, &r->nconns, (int)value);
            if (k >= 0)
                r->conn_fit[k] = 0;
            continue;
        }
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
            event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
            /* a sender that cannot get in says so on its side; this one
             * says it here (a refused CURVE key: the ZAP handler's log) */
            if (tp_ratelog_ok(&r->handshake_log))
                TP_WARN("remote: a sender's handshake at %s failed: %s", r->endpoints[0],
                        value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                            ? (r->curve ? "it has no CURVE keys (tp-worker --curve DIR "
                                          "with this run's keys)"
                                        : "it uses CURVE and this receiver does not "
                                          "(--curve DIR here too)")
                        : value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
                            ? "its CURVE keys are not this run's (server.key)"
                        /* a sender that finds the mismatch first closes the
                         * connection before this side can name it */
                        : r->curve
                            ? "it closed the connection in the CURVE handshake: it has "
                              "no CURVE keys, or not this run's (tp-worker --curve DIR "
                              "with this run's keys)"
                            : "it closed the connection or spoke another protocol");
            continue;
        }
        if (event != ZMQ_EVENT_DISCONNECTED)
            continue;
        int k = s_fd_remove(r->conn_fds, &r->nconns, (int)value);
        if (k >= 0)
            r->conn_fit[k] = r->conn_fit[r->nconns];
        k = s_fd_remove(r->refused_fds, &r->nrefused, (int)value);
        if (k >= 0)
            r->refused_named[k] = r->refused_named[r->nrefused];
        /* the sender whose reports came on it (a number that a later
         * connection may reuse: that one's sender has another pid) */
        uint64_t now = tp_now_ns();
        pthread_mutex_lock(&r->mu);
        for (int k = 0; k < r->nsenders; k++)
            if (!r->senders[k].gone && r->senders[k].fd == (int)value) {
                r->senders[k].gone = 1;
                r->senders[k].gone_ns = now;
                char full[512];
                s_sender_full(r, &r->senders[k].row, r->senders[k].peer, full, sizeof full);
                TP_INFO("remote: %s gone (its connection closed)", full);
            }
        pthread_mutex_unlock(&r->mu);
    }
}

/* The iterating thread is receiving now: silence from a sender counts.
 * Returns the time. */
static uint64_t s_active(s_remote_t *r) {
    uint64_t now = tp_now_ns();
    __atomic_store_n(&r->active_ns, now, __ATOMIC_RELAXED);
    s_drain_monitor(r);
    return now;
}


/* 0 when dp has the expected components; else -1 with the first mismatch
 * in why ("component 0 'image' is uint8[128,32,32], expected
 * uint8[64,28,28]"): the same words a tp-worker reads at its end. */
static int s_fits(const s_remote_t *r, const tp_datapoint_t *dp, char *why, size_t size) {
    return tp_wire_comps_check(r->expect, r->nexpect, dp, why, size);
}

/* This receiver's endpoints, ", "-separated (cut with "..." past `size`):
 * where a sender that does not say which it reached may have come in. */
static void s_endpoints(const s_remote_t *r, char *out, size_t size) {
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < r->nendpoints; i++) {
        size_t need = strlen(r->endpoints[i]) + (i ? 2 : 0);
        if (o + need + 5 > size) {  /* room for ", ..." */
            snprintf(out + o, size - o, "%s...", i ? ", " : "");
            return;
        }
        o += (size_t)snprintf(out + o, size - o, "%s%s", i ? ", " : "", r->endpoints[i]);
    }
}

/* A reporting sender named in full: its report's name ("tp-worker
 * 4121@vm"), its host where the name cut it, every address it says it
 * connected to or bound (its report's `where`) and the address its
 * connection came from (peer: tcp only; "" or "process N" say nothing
 * more). A sender of an older build says no addresses: then the
 * receiver's endpoints stand in. */
static void s_sender_full(const s_remote_t *r, const tp_stats_row_t *row, const char *peer,
                          char *out, size_t size) {
    char parts[TP_STATS_WHERE_MAX + TP_STATS_HOST_MAX + 160];
    size_t o = 0;
    parts[0] = '\0';
#define S_PART(...)                                                                   \
    do {                                                                              \
        if (o < sizeof parts)                                                         \
            o += (size_t)snprintf(parts + o, sizeof parts - o, __VA_ARGS__);           \
    } while (0)
    char pidhost[TP_STATS_HOST_MAX + 16];
    snprintf(pidhost, sizeof pidhost, "%u@%s", (unsigned)row->pid, row->host);
    const char *at = strstr(row->name, pidhost);
    if (!at || at[strlen(pidhost)])  /* its name cut the host (or has none) */
        S_PART("pid %u on %s", (unsigned)row->pid, row->host);
    for (const char *w = row->where; *w;) {
        while (*w == ' ' || *w == ',')
            w++;
        size_t len = strcspn(w, ",");
        if (len > 1 && (*w == '>' || *w == '@'))
            S_PART("%s%s %.*s", o ? ", " : "", *w == '>' ? "connected to" : "bound at",
                   (int)len - 1, w + 1);
        w += len;
    }
    int tcp = peer[0] && strncmp(peer, "process ", 8) != 0;
    if (tcp)
        S_PART("%s%s", o ? " from " : "from ", peer);
    if (!row->where[0]) {  /* an older sender: where it may have come in */
        char eps[200];
        s_endpoints(r, eps, sizeof eps);
        S_PART("%son %s", o ? ", " : "", eps);
    }
#undef S_PART
    snprintf(out, size, "%s (%s)", row->name, parts);
}

/* The name of the sender on connection fd: its report's in full
 * (s_sender_full), or its address and the receiver's endpoints for a
 * sender that does not report (tensorpack's). Counts an unfit datapoint
 * of it when `unfit`. */
static void s_sender_name(s_remote_t *r, int fd, int unfit, char *out, size_t size) {
    /* the endpoints: under MPI they name the rank ({5550+rank}) */
    char at[256];
    s_endpoints(r, at, sizeof at);
    if (r->peer[0])
        snprintf(out, size, "the sender from %.90s at %s (no report: a tensorpack sender?)",
                 r->peer, at);
    else
        snprintf(out, size, "the sender on connection %d at %s (no report: a tensorpack "
                 "sender?)", fd, at);
    pthread_mutex_lock(&r->mu);
    /* the live sender on fd; else the last one gone from it (its messages
     * still queued when its close was read) */
    int k = -1;
    for (int i = 0; i < r->nsenders; i++)
        if (r->senders[i].fd == fd &&
            (k < 0 || (r->senders[k].gone && (!r->senders[i].gone ||
                                              r->senders[i].gone_ns > r->senders[k].gone_ns))))
            k = i;
    if (k >= 0) {
        s_sender_seen_t *e = &r->senders[k];
        e->unfit += (uint64_t)unfit;
        const char *peer = r->peer[0] ? r->peer : e->peer;
        char dropped[48] = "", full[512];
        if (e->unfit)
            snprintf(dropped, sizeof dropped, " (%llu dropped from it)",
                     (unsigned long long)e->unfit);
        s_sender_full(r, &e->row, peer, full, sizeof full);
        snprintf(out, size, "%s%s", full, dropped);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Record whether connection fd's last datapoint fitted. */
static void s_mark_fit(s_remote_t *r, int fd, int fit) {
    int k = s_fd_find(r->conn_fds, r->nconns, fd);
    if (k == r->nconns) {  /* its accept event not read yet */
        s_drain_monitor(r);
        k = s_fd_find(r->conn_fds, r->nconns, fd);
    }
    if (k < r->nconns)
        r->conn_fit[k] = fit ? 1 : 2;
    if (fit)
        r->unfit_since = 0;
    else if (!r->unfit_since)
        r->unfit_since = tp_now_ns();
}

/* The error that ends the stream when no fitting sender is left: since a
 * sender did not fit, nothing fitted for opts.unfit_grace_s, and every
 * connection open sent only unfit datapoints (none that fitted, none that
 * has yet to send: a fitting sender may still be starting), or none is
 * open (the unfit senders ended). TP_OK to go on. */
static tp_status_t s_unfit_end(s_remote_t *r, uint64_t now) {
    double grace = r->opts.unfit_grace_s > 0 ? r->opts.unfit_grace_s : 10;
    if (!r->unfit_since || (double)(now - r->unfit_since) * 1e-9 < grace)
        return TP_OK;
    for (int k = 0; k < r->nconns; k++)
        if (r->conn_fit[k] != 2)
            return TP_OK;
    return tp_error(TP_ERR_SHAPE, "remote: no sender left sends datapoints that fit "
                    "(for %.0f s; %llu dropped, %d sender%s connected): the last, %s",
                    (double)(now - r->unfit_since) * 1e-9, (unsigned long long)r->unfit,
                    r->nconns, r->nconns == 1 ? "" : "s", r->last_unfit);
}

/* 1 when the refused sender of `row` was named in the log already (on an
 * earlier connection); else it is remembered as named now. */
static int s_refused_known(s_remote_t *r, const tp_stats_row_t *row) {
    int n = r->nrefused_who < MAX_SENDERS ? r->nrefused_who : MAX_SENDERS;
    for (int i = 0; i < n; i++)
        if (r->refused_who[i].pid == row->pid && !strcmp(r->refused_who[i].host, row->host))
            return 1;
    int slot = r->nrefused_who++ % MAX_SENDERS;
    r->refused_who[slot].pid = row->pid;
    snprintf(r->refused_who[slot].host, sizeof r->refused_who[slot].host, "%s", row->host);
    return 0;
}

/* A message (in r->msg) from a sender of another job (its connection's
 * job id `theirs`): dropped and counted; the first names the sender and
 * both ids in the log, once. A towerpack sender says who it is in its
 * handshake (TP_WIRE_SENDER_PROPERTY), so its first message, whatever
 * comes first, names it; a sender without it (an older build) is named
 * by its report when that comes, in a second line. Its report, if this is
 * one, stays out of the senders' table: a refused worker feeds nothing. */
static void s_refuse(s_remote_t *r, const char *theirs) {
    int fd = tp_wire_msg_frame_srcfd(r->msg, 0);
    char name[512], eps[256];
    snprintf(name, sizeof name, "the sender on connection %d", fd);
    s_endpoints(r, eps, sizeof eps);
    int kind = 0;
    uint32_t sender;
    const char *text;
    size_t tl;
    tp_stats_row_t row;
    int named = 0;
    if (tp_wire_msg_frames(r->msg) == 1 &&
        tp_ctl_parse(tp_wire_msg_frame_data(r->msg, 0), tp_wire_msg_frame_size(r->msg, 0),
                     &kind, &sender, &text, &tl) &&
        kind == TP_CTL_REPORT && df_remote_report_parse(text, tl, &row) == 0)
        named = 1;
    const char *who = named ? NULL
                            : tp_wire_msg_frame_property(r->msg, 0, TP_WIRE_SENDER_PROPERTY);
    if (who && df_remote_report_parse(who, strlen(who), &row) == 0)
        named = 1;
    if (named) {
        char peer[96], full[512];
        s_msg_peer(r->msg, peer, sizeof peer);
        s_sender_full(r, &row, peer, full, sizeof full);
        snprintf(name, sizeof name, "%s", full);
    }
    if (!kind)  /* a datapoint or a malformed message, not a control frame */
        r->refused++;
    s_drain_monitor(r);  /* an earlier connection with this number closed? */
    int k = s_fd_find(r->refused_fds, r->nrefused, fd);
    /* once a connection, and again when its report names a sender that
     * its first messages (an older sender's) could not; never again for a
     * sender named before, on a connection it had before reconnecting */
    if (k == r->nrefused || (named && !r->refused_named[k])) {
        if (k == r->nrefused)
            k = s_fd_add(r->refused_fds, &r->nrefused, fd);
        if (k >= 0)
            r->refused_named[k] = named;
        if (named && s_refused_known(r, &row)) {
            tp_wire_msg_clear(r->msg);
            return;
        }
        TP_WARN("remote: refused %s at %s: it was started for job '%.63s', this run is "
                "job '%s' (a worker of another job, or one left from an earlier run); its "
                "datapoints are dropped", name, eps, theirs, r->job);
    }
    tp_wire_msg_clear(r->msg);
}

/* A decoded datapoint that does not fit tp_df_remote_expect: dropped and
 * counted; TP_OK to go on receiving, or the error that ends the stream
 * (s_unfit_end). */
static tp_status_t s_drop_unfit(s_remote_t *r, tp_datapoint_t **dp, int fd, const char *why) {
    tp_datapoint_destroy(dp);
    r->unfit++;
    char who[512];
    s_sender_name(r, fd, 1, who, sizeof who);
    snprintf(r->last_unfit, sizeof r->last_unfit, "from %.250s: %.240s", who, why);
    s_mark_fit(r, fd, 0);
    TP_TRY(s_unfit_end(r, tp_now_ns()));
    if (tp_ratelog_ok(&r->unfit_log))
        TP_WARN("remote: dropped a datapoint from %s that does not fit: %s (%llu dropped "
                "so far)", who, why, (unsigned long long)r->unfit);
    return TP_OK;
}

/* A sender's TP_CTL_ERROR (text: why it ends): a tp-worker that read this
 * receiver's components in the handshake and found that its datapoints do
 * not fit says so before it goes. Logged naming it (the text is the
 * peer's: only its printable bytes, cut); its connection counts as unfit. */
static void s_sender_ended(s_remote_t *r, int fd, const char *text, size_t len) {
    char why[300], who[512];
    size_t n = 0;
    for (size_t i = 0; i < len && n < sizeof why - 1; i++)
        why[n++] = (unsigned char)text[i] >= 0x20 && (unsigned char)text[i] < 0x7f ? text[i]
                                                                                   : '?';
    why[n] = '\0';
    s_sender_name(r, fd, 0, who, sizeof who);
    snprintf(r->last_unfit, sizeof r->last_unfit, "%.250s, ended: %.240s", who, why);
    if (r->nexpect)
        s_mark_fit(r, fd, 0);
    TP_WARN("remote: %s ends: its datapoints do not fit this run: %s", who, why);
}

/* Receive buffers stay in the process (once per process, at the first
 * receiver). libzmq mallocs each large message in its I/O thread and the
 * reader frees it; glibc's defaults (a trim threshold of twice the largest
 * freed mmapped chunk: 2 MiB for 1 MiB messages) hand the freed memory
 * back to the kernel as soon as the queue drains, so the next messages
 * are received into fresh pages: 1 MiB datapoints over ipc took ~130 page
 * faults each (the kernel's copy into them, perf: 98% in _copy_to_iter)
 * and ran at 0.2-0.5x of raw libzmq whenever the sender's pace let the
 * queue drain (tp-bench transport, docs/performance.md). Messages up to
 * 32 MiB (glibc's own dynamic limit) come from the heap, and up to 64 MiB
 * of free memory at its top stays. A user who tuned malloc (MALLOC_*_,
 * GLIBC_TUNABLES) or set TP_REMOTE_KEEP_BUFFERS=0 keeps their settings. */
static void s_keep_receive_buffers(void) {
#ifdef __GLIBC__
    const char *env = getenv("TP_REMOTE_KEEP_BUFFERS"), *tun = getenv("GLIBC_TUNABLES");
    if ((env && !strcmp(env, "0")) || (tun && strstr(tun, "glibc.malloc.")) ||
        getenv("MALLOC_TRIM_THRESHOLD_") || getenv("MALLOC_MMAP_THRESHOLD_") ||
        getenv("MALLOC_TOP_PAD_"))
        return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

void tp_remote_keep_receive_buffers(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, s_keep_receive_buffers);
}

static tp_status_t s_remote_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                  uint64_t stream) {
    (void)rng; (void)seed; (void)stream;
    s_remote_t *r = impl;
    if (r->pull)
        return TP_OK;
    tp_remote_keep_receive_buffers();
    r->zctx = zmq_ctx_new();
    r->pull = r->zctx ? zmq_socket(r->zctx, ZMQ_PULL) : NULL;
    r->msg = tp_wire_msg_new();
    if (!r->pull || !r->msg)
        return tp_error(TP_ERR_NOMEM, "remote: socket");
    /* connection events, to know when a sender's connection closes */
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://tp-remote-monitor-%p", (void *)r);
    if (zmq_socket_monitor(r->pull, mon_ep,
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_CONNECTED |
                               ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0 &&
        (r->mon = zmq_socket(r->zctx, ZMQ_PAIR)) != NULL) {
        int z = 0;
        zmq_setsockopt(r->mon, ZMQ_LINGER, &z, sizeof z);
        if (zmq_connect(r->mon, mon_ep) < 0) {
            zmq_close(r->mon);
            r->mon = NULL;
        }
    }
    if (r->job[0])  /* before any bind or connect: every connection carries it */
        TP_TRY(tp_wire_set_job(r->pull, r->job));
    if (r->nexpect == 0 && r->self) {
        /* inside a pipeline that was told its output (tp_df_expect: a
         * trainer's spec), what comes here follows from it */
        char via[128];
        int n = df_expect_for(r->self, r->expect, MAX_EXPECT, via, sizeof via);
        if (n > 0) {
            r->nexpect = n;
            char comps[TP_WIRE_COMPS_MAX];
            tp_wire_comps_format(r->expect, n, comps, sizeof comps);
            TP_INFO("remote: senders to %s must send %s (the model's inputs%s%s)",
                    r->endpoints[0], comps, via[0] ? " through " : "", via);
        }
    }
    if (r->nexpect > 0) {  /* the component handshake: what this receiver takes */
        char comps[TP_WIRE_COMPS_MAX];
        if (tp_wire_comps_format(r->expect, r->nexpect, comps, sizeof comps) > 0)
            TP_TRY(tp_wire_set_comps(r->pull, comps));
    }
    int hwm = r->opts.hwm, zero = 0, timeo = 100;
    zmq_setsockopt(r->pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(r->pull, ZMQ_LINGER, &zero, sizeof zero);
    /* Receives wait at most 100 ms, so signals and timeouts are seen. */
    zmq_setsockopt(r->pull, ZMQ_RCVTIMEO, &timeo, sizeof timeo);
    if (r->opts.curve_dir) {
        /* One socket is either a CURVE server or a client. */
        for (int i = 1; i < r->nendpoints; i++)
            if (r->bind[i] != r->bind[0])
                return tp_error(TP_ERR_INVALID, "remote: with CURVE every endpoint must "
                                "bind or every one connect (%s and %s differ)",
                                r->endpoints[0], r->endpoints[i]);
        if (!(r->curve = tp_curve_load(r->opts.curve_dir, r->bind[0])))
            return tp_error_wrap(TP_ERR_INVALID, "remote");
        TP_TRY(tp_curve_apply(r->curve, r->zctx, r->pull));
    }
    for (int i = 0; i < r->nendpoints; i++) {
        if (r->bind[i]) {
            char ep[1024];
            TP_TRY(tp_bind_endpoint(r->endpoints[i], r->opts.allow_public, ep, sizeof ep));
            free(r->endpoints[i]);  /* keep the bound name: its file is unlinked */
            if (!(r->endpoints[i] = strdup(ep)))
                return tp_error(TP_ERR_NOMEM, "remote");
        }
        int rc = r->bind[i] ? zmq_bind(r->pull, r->endpoints[i])
                            : zmq_connect(r->pull, r->endpoints[i]);
        if (rc < 0) {
            int err = zmq_errno();
            return tp_error(TP_ERR_IO, "remote: %s %s: %s%s",
                            r->bind[i] ? "bind" : "connect", r->endpoints[i],
                            zmq_strerror(err), r->bind[i] ? tp_bind_why(r->endpoints[i], err)
                                                          : "");
        }
        if (r->bind[i])
            tp_ipc_restrict(r->endpoints[i]);
    }
    return TP_OK;
}

static tp_status_t s_remote_next(void *impl, tp_datapoint_t **out) {
    s_remote_t *r = impl;
    void *sock = r->pull;
    uint64_t since = tp_now_ns();
    if (tp_signal_pending())  /* also while data flows */
        return tp_error(TP_ERR_INTERRUPTED, "remote: interrupted by signal %d",
                        tp_signal_pending());
    for (;;) {
        tp_status_t rc = tp_wire_msg_recv(r->msg, sock, 0);
        if (rc == TP_OK)  /* one relaxed add a message: what tp-top's MB/s shows */
            __atomic_store_n(&r->bytes, r->bytes + tp_wire_msg_bytes(r->msg), __ATOMIC_RELAXED);
        if (rc == TP_OK && r->job[0]) {
            /* the job handshake: the sender's id rode in on its connection */
            const char *theirs = tp_wire_msg_frame_job(r->msg, 0);
            if (theirs && strcmp(theirs, r->job)) {
                s_refuse(r, theirs);
                s_active(r);
                continue;
            }
        }
        /* the connection it came on and its sender's address, for the
         * checks of tp_df_remote_expect (a map look-up in libzmq: only then) */
        int fd = rc == TP_OK && r->nexpect ? tp_wire_msg_frame_srcfd(r->msg, 0) : -1;
        if (fd >= 0)
            s_msg_peer(r->msg, r->peer, sizeof r->peer);
        if (rc == TP_OK && tp_wire_msg_frames(r->msg) == 1) {
            int kind;
            uint32_t sender;
            const char *text;
            size_t tl;
            if (tp_ctl_parse(tp_wire_msg_frame_data(r->msg, 0),
                             tp_wire_msg_frame_size(r->msg, 0), &kind, &sender,
                             &text, &tl)) {
                if (fd < 0)  /* control frames are rare: always named */
                    s_msg_peer(r->msg, r->peer, sizeof r->peer);
                if (kind == TP_CTL_REPORT) {
                    /* the connection events first: the one that closed a
                     * connection whose number this report's may reuse came
                     * before this connection's data */
                    s_drain_monitor(r);
                    s_take_sender_report(r, text, tl, tp_wire_msg_frame_srcfd(r->msg, 0));
                } else if (kind == TP_CTL_ERROR) {
                    s_drain_monitor(r);
                    s_sender_ended(r, tp_wire_msg_frame_srcfd(r->msg, 0), text, tl);
                }
                tp_wire_msg_clear(r->msg);  /* padding or end of a sender */
                s_active(r);
                continue;
            }
        }
        if (rc == TP_OK && tp_wire_msg_frames(r->msg) == 1) {
            tp_tpk_format_t fmt = tp_tpk_sniff(tp_wire_msg_frame_data(r->msg, 0),
                                               tp_wire_msg_frame_size(r->msg, 0));
            if (fmt != TP_TPK_TOWERPACK) {
                /* tensorpack's: the frame stays the arrays' memory */
                void *data;
                size_t size;
                tp_free_fn release;
                void *hint;
                rc = tp_wire_msg_take_frame(r->msg, 0, &data, &size, &release, &hint);
                tp_wire_msg_clear(r->msg);
                if (rc == TP_OK)
                    rc = tp_tpk_decode(data, size, &r->tpk, release, hint, out);
                char why[300];
                if (rc == TP_OK && r->nexpect && s_fits(r, *out, why, sizeof why) < 0) {
                    TP_TRY(s_drop_unfit(r, out, fd, why));
                    continue;
                }
                if (rc == TP_OK) {
                    if (r->nexpect)
                        s_mark_fit(r, fd, 1);
                    r->data_ns = tp_now_ns();
                    if (!(r->seen & (1u << fmt))) {
                        r->seen |= 1u << fmt;
                        TP_INFO("remote: receiving tensorpack's %s messages",
                                tp_tpk_format_name(fmt));
                    }
                    return TP_OK;
                }
                goto bad;
            }
        }
        if (rc == TP_OK || rc == TP_ERR_PROTOCOL) {
            if (rc == TP_OK)
                rc = tp_wire_decode(r->msg, &r->wire, out);
            uint64_t now = s_active(r);
            char why[300];
            if (rc == TP_OK && r->nexpect && s_fits(r, *out, why, sizeof why) < 0) {
                TP_TRY(s_drop_unfit(r, out, fd, why));
                continue;
            }
            if (rc == TP_OK) {
                if (r->nexpect)
                    s_mark_fit(r, fd, 1);
                r->data_ns = now;
                return TP_OK;
            }
        bad:
            r->malformed++;
            if (tp_ratelog_ok(&r->ratelog))
                TP_WARN("remote: dropped a malformed message (%llu so far): %s",
                        (unsigned long long)r->malformed, tp_last_error());
            continue;
        }
        if (rc != TP_ERR_TIMEOUT)
            return tp_error_wrap(rc, "remote: receive");
        uint64_t now = s_active(r);  /* waited 100 ms for anything */
        if (r->nexpect)  /* the unfit senders may have ended: none left? */
            TP_TRY(s_unfit_end(r, now));
        if (tp_signal_pending())
            return tp_error(TP_ERR_INTERRUPTED, "remote: interrupted by signal %d",
                            tp_signal_pending());
        if (tp_actor_wait_tick())  /* a prefetch actor asked to end, a failed tree */
            return tp_error(TP_ERR_INTERRUPTED, "remote: the wait was ended: the "
                            "actor or trainer reading it is stopping");
        if (r->opts.timeout_s > 0 &&
            (double)(tp_now_ns() - since) * 1e-9 > r->opts.timeout_s)
            return tp_error(TP_ERR_TIMEOUT, "remote: nothing from %s%s for %.3g s",
                            r->endpoints[0], r->nendpoints > 1 ? ", ..." : "",
                            r->opts.timeout_s);
    }
}

static void s_remote_destroy(void *impl) {
    s_remote_t *r = impl;
    if (r->pull) {
        zmq_socket_monitor(r->pull, NULL, 0);
        zmq_close(r->pull);
    }
    if (r->mon)
        zmq_close(r->mon);
    if (r->zctx)
        zmq_ctx_term(r->zctx);
    tp_curve_destroy(&r->curve);  /* after the context: joins its ZAP thread */
    for (int i = 0; i < r->nendpoints; i++) {
        /* libzmq 4.3 leaves named ipc files behind */
        if (r->bind[i] && !strncmp(r->endpoints[i], "ipc://", 6))
            unlink(r->endpoints[i] + 6);
        free(r->endpoints[i]);
    }
    tp_wire_msg_destroy(&r->msg);
    free(r->curve_dir);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static const tp_dataflow_ops_t s_remote_ops = {
    .name = "remote", .reset_state = s_remote_reset, .next = s_remote_next,
    .destroy = s_remote_destroy};

tp_dataflow_t *tp_df_remote(const char *endpoints, const tp_remote_opts_t *opts) {
    s_remote_t *r = calloc(1, sizeof *r);
    if (!r) {
        tp_error(TP_ERR_NOMEM, "remote");
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    if (opts)
        r->opts = *opts;
    else
        tp_remote_opts_init(&r->opts);
    if (r->opts.hwm <= 0)
        r->opts.hwm = 50;
    if (r->opts.curve_dir && !(r->opts.curve_dir = r->curve_dir = strdup(r->opts.curve_dir))) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        tp_error(TP_ERR_NOMEM, "remote");
        return NULL;
    }
    if (r->opts.job) {
        if (!tp_wire_job_ok(r->opts.job)) {
            tp_error(TP_ERR_INVALID, "remote: job id '%s': 1 to %d printable characters, "
                     "no space or ':'", r->opts.job, TP_WIRE_JOB_MAX - 1);
            free(r->curve_dir);
            pthread_mutex_destroy(&r->mu);
            free(r);
            return NULL;
        }
        snprintf(r->job, sizeof r->job, "%s", r->opts.job);
        r->opts.job = r->job;
    }
    tp_wire_opts_init(&r->wire);
    if (r->opts.max_bytes)
        r->wire.max_bytes = r->opts.max_bytes;
    tp_tpk_opts_init(&r->tpk);
    r->tpk.max_bytes = r->wire.max_bytes;
    r->tpk.int32_labels = r->opts.int32_labels;
    const char *p = endpoints ? endpoints : "";
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || r->nendpoints == MAX_ENDPOINTS) {
            s_remote_destroy(r);
            tp_error(TP_ERR_INVALID, "remote: endpoint list '%s': %s", endpoints,
                     len == 0 ? "empty entry" : "more than 64 endpoints");
            return NULL;
        }
        int bind = r->opts.bind;
        const char *start = p;
        size_t elen = len;
        if (*start == '@' || *start == '>') {  /* czmq's prefixes */
            bind = *start == '@';
            start++;
            elen--;
        }
        char *ep = strndup(start, elen);
        if (!ep || !s_endpoint_ok(ep)) {
            tp_error(TP_ERR_INVALID,
                     "remote: endpoint '%.*s' is not tcp://, ipc:// or inproc://",
                     (int)len, p);
            free(ep);
            s_remote_destroy(r);
            return NULL;
        }
        r->bind[r->nendpoints] = bind;
        r->endpoints[r->nendpoints++] = ep;
        p = end ? end + 1 : p + len;
    }
    if (r->nendpoints == 0) {
        s_remote_destroy(r);
        tp_error(TP_ERR_INVALID, "remote: no endpoint given");
        return NULL;
    }
    tp_dataflow_t *df = tp_dataflow_new(&s_remote_ops, r);
    if (df)  /* (on failure the base destroyed r) */
        r->self = df;
    return df;
}

uint64_t tp_df_remote_malformed(tp_dataflow_t *df) {
    if (!df || tp_dataflow_ops(df) != &s_remote_ops)  /* another kind */
        return 0;
    return ((s_remote_t *)tp_dataflow_impl(df))->malformed;
}

/* comps[n] (the caller's) as the wire's components into out[n]. */
static tp_status_t s_expect_convert(const tp_remote_expect_t *comps, int n,
                                    tp_wire_comp_t *out) {
    if (n < 0 || n > MAX_EXPECT || (n > 0 && !comps))
        return tp_error(TP_ERR_INVALID, "remote expect: %d components (at most %d)", n,
                        MAX_EXPECT);
    for (int i = 0; i < n; i++) {
        if (comps[i].ndim < 0 || comps[i].ndim > TP_MAX_DIMS)
            return tp_error(TP_ERR_INVALID, "remote expect: component %d has %d dims", i,
                            comps[i].ndim);
        if (comps[i].bound < 0 || (comps[i].bound > 0 && comps[i].dtype != TP_UINT8 &&
                                   comps[i].dtype != TP_INT32 && comps[i].dtype != TP_INT64))
            return tp_error(TP_ERR_INVALID, "remote expect: component %d: a bound of %lld "
                            "(integer components only, >= 0)", i, (long long)comps[i].bound);
        tp_wire_comp_t *e = &out[i];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", comps[i].name ? comps[i].name : "");
        e->dtype = comps[i].dtype;
        e->ndim = comps[i].ndim;
        memcpy(e->shape, comps[i].shape, sizeof e->shape);
        e->ranged = comps[i].bound > 0;
        e->hi = comps[i].bound - 1;
    }
    return TP_OK;
}

tp_status_t tp_df_remote_expect(tp_dataflow_t *df, const tp_remote_expect_t *comps, int n) {
    if (!df || tp_dataflow_ops(df) != &s_remote_ops)
        return tp_error(TP_ERR_INVALID, "remote expect: not a remote dataflow");
    s_remote_t *r = tp_dataflow_impl(df);
    TP_TRY(s_expect_convert(comps, n, r->expect));
    r->nexpect = n;
    if (r->pull && n > 0)  /* its connections' properties were fixed at bind */
        TP_DEBUG("remote expect: after reset_state the handshake does not carry the "
                 "components; every datapoint is still checked");
    return TP_OK;
}

tp_status_t tp_df_expect(tp_dataflow_t *pipeline, const tp_remote_expect_t *comps, int n) {
    if (!pipeline)
        return tp_error(TP_ERR_INVALID, "expect: no dataflow");
    tp_wire_comp_t c[MAX_EXPECT];
    TP_TRY(s_expect_convert(comps, n, c));
    return df_expect_set(pipeline, c, n);
}

uint64_t tp_df_remote_refused(tp_dataflow_t *df) {
    if (!df || tp_dataflow_ops(df) != &s_remote_ops)
        return 0;
    return ((s_remote_t *)tp_dataflow_impl(df))->refused;
}

uint64_t tp_df_remote_unfit(tp_dataflow_t *df) {
    if (!df || tp_dataflow_ops(df) != &s_remote_ops)
        return 0;
    return ((s_remote_t *)tp_dataflow_impl(df))->unfit;
}

uint64_t tp_df_remote_bytes(tp_dataflow_t *df) {
    if (!df || tp_dataflow_ops(df) != &s_remote_ops)
        return 0;
    return __atomic_load_n(&((s_remote_t *)tp_dataflow_impl(df))->bytes, __ATOMIC_RELAXED);
}

int tp_df_remote_describe(tp_dataflow_t *df, char *buf, size_t size) {
    if (size)
        buf[0] = '\0';
    if (!df || tp_dataflow_ops(df) != &s_remote_ops || size == 0)
        return -1;
    s_remote_t *r = tp_dataflow_impl(df);
    uint64_t now = tp_now_ns();
    size_t o = 0;
#define S_ADD(...)                                                              \
    do {                                                                        \
        int n_ = snprintf(buf + o, size - o, __VA_ARGS__);                      \
        o = n_ < 0 ? o : o + (size_t)n_ >= size ? size - 1 : o + (size_t)n_;   \
    } while (0)
    S_ADD("%d sender%s connected", r->nconns, r->nconns == 1 ? "" : "s");
    if (r->nrefused)
        S_ADD(" (%d refused: another job than '%s')", r->nrefused, r->job);
    if (r->data_ns)
        S_ADD(", last batch %.1f s ago", (double)(now - r->data_ns) * 1e-9);
    else
        S_ADD(", no batch yet");
    /* the senders that reported (tp-worker, tp_send_dataflow), latest
     * first; tensorpack's own senders never report */
    pthread_mutex_lock(&r->mu);
    int shown[4], nshown = 0;
    while (nshown < 4) {
        int best = -1;
        for (int i = 0; i < r->nsenders; i++) {
            int taken = 0;
            for (int j = 0; j < nshown; j++)
                taken |= shown[j] == i;
            if (!taken && (best < 0 || r->senders[i].seen_ns > r->senders[best].seen_ns))
                best = i;
        }
        if (best < 0)
            break;
        const s_sender_seen_t *e = &r->senders[best];
        char full[512];
        s_sender_full(r, &e->row, e->peer, full, sizeof full);
        S_ADD("%s %s %.1f s ago%s", nshown ? "," : "; last seen:", full,
              (double)(now - e->seen_ns) * 1e-9, e->gone ? " (gone)" : "");
        shown[nshown++] = best;
    }
    if (nshown == 0)
        S_ADD("; no sender has reported (tensorpack's senders do not)");
    else if (r->nsenders > nshown)
        S_ADD(" and %d more", r->nsenders - nshown);
    pthread_mutex_unlock(&r->mu);
#undef S_ADD
    return (int)o;
}

typedef struct {
    tp_stats_row_t *rows;
    int max, n;
} s_rows_t;

/* df_visit: the live senders of every remote dataflow found; forgets the
 * ones silent for TP_REMOTE_SENDER_GONE_S of receiving. */
static void s_add_sender_rows(tp_dataflow_t *df, void *arg) {
    if (tp_dataflow_ops(df) != &s_remote_ops)
        return;
    s_remote_t *r = tp_dataflow_impl(df);
    s_rows_t *a = arg;
    uint64_t active = __atomic_load_n(&r->active_ns, __ATOMIC_RELAXED);
    uint64_t gone = (uint64_t)(TP_REMOTE_SENDER_GONE_S * 1e9);
    pthread_mutex_lock(&r->mu);
    int k = 0;
    uint64_t now = tp_now_ns();
    for (int i = 0; i < r->nsenders; i++) {
        s_sender_seen_t *s = &r->senders[i];
        if (!s->gone && active > s->seen_ns && active - s->seen_ns > gone) {
            char full[512];
            s_sender_full(r, &s->row, s->peer, full, sizeof full);
            TP_INFO("remote: %s gone (silent for %.0f s)", full, TP_REMOTE_SENDER_GONE_S);
            continue;  /* silent too long: dropped */
        }
        if (s->gone && now - s->gone_ns > S_TOMBSTONE_NS)
            continue;  /* its late reports have long come: dropped */
        r->senders[k++] = *s;
        if (!s->gone && a->n < a->max)
            a->rows[a->n++] = s->row;
    }
    r->nsenders = k;
    pthread_mutex_unlock(&r->mu);
}

int tp_df_remote_rows(tp_dataflow_t *df, tp_stats_row_t *rows, int max) {
    s_rows_t a = {rows, max, 0};
    if (df)
        df_visit(df, s_add_sender_rows, &a);
    return a.n;
}

/* ---- send_dataflow_zmq --------------------------------------------------------------- */

typedef struct {
    tp_stats_pub_t *pub;
    tp_stats_row_t row;   /* its own; row.where: its address ('>' connected to,
                             '@' bound), also in its reports */
    uint64_t start, blocked, starved;
    /* the socket's connection events (libzmq's monitor): receivers
     * connected now, whether one ever was, since when none is, and the
     * first failed handshake of a connecting sender (an error: it ends) */
    void *mon;
    const char *endpoint;
    int conn_fds[MAX_SENDERS];  /* the connections open (accepted, connected) */
    int connected, ever, connecting, curve, bind;
    const char *job;  /* the job handshake: this sender's id, or NULL */
    const tp_curve_t *curve_keys;  /* its CURVE keys (a client's), or NULL */
    int job_refused;  /* a receiver of another job ended it */
    /* a receiver was met but closed the handshake and went (a trainer
     * that stopped): --exit-with-trainer counts it as one that was there */
    int met;
    int closed_in_row;   /* handshakes closed in a row (a success resets) */
    int refused_in_row;  /* of those, by a receiver still there */
    /* handshakes in a row that ran out on a receiver still there (a
     * success resets), libzmq's handshake interval, and when the
     * connection now in its handshake was made (for the log) */
    int ran_out_in_row, handshake_ms;
    uint64_t connected_ns;
    /* a tcp receiver's addresses, for the checks of a failed handshake:
     * looked up once, when first needed (s_sender_addrs) */
    struct addrinfo *addrs;
    uint64_t resolved_ns;
    /* the component handshake: what the receiver last probed takes
     * (nwant 0: it said nothing; every datapoint goes) */
    tp_wire_comp_t want[TP_WIRE_COMPS_N];
    int nwant;
    char want_text[TP_WIRE_COMPS_MAX];
    double peer_gone_s;
    uint64_t none_since, mon_ns;
    tp_status_t failed;
    /* the report to the receiver (TP_CTL_REPORT) */
    int report;
    uint64_t reported_ns;
    char report_name[TP_STATS_NAME_MAX], host[TP_STATS_HOST_MAX];
} s_sender_t;

/* This sender's row to the receiver on the data socket, at most twice a
 * second (or now with `force`), never waiting: when the socket is full it
 * is tried again later. Its time is a worker's: everything but the waits
 * on the full socket is busy making datapoints (the sender's own stats row
 * calls the dataflow's share starved, from the loop's view). */
static void s_sender_report_text(const s_sender_t *s, uint64_t now, char *text,
                                 size_t size) {
    uint64_t alive = now > s->start ? now - s->start : 0;
    /* the eleventh field, its addresses, names it in the receiver's log
     * and tp-top (receivers before it read ten and drop this report) */
    snprintf(text, size, "%u\t%s\t%s\t%d\t%llu\t%llu\t%llu\t0\t%llu\t%llu%s%s",
             (unsigned)getpid(), s->host, s->report_name, s->row.state,
             (unsigned long long)alive,
             (unsigned long long)(alive > s->blocked ? alive - s->blocked : 0),
             (unsigned long long)s->blocked, (unsigned long long)s->row.msgs_out,
             (unsigned long long)s->row.bytes_out, s->row.where[0] ? "\t" : "",
             s->row.where);
}

/* Its address as its report's `where` says it: '>' and the endpoint it
 * connects to, or '@' and the one it bound; cut to the field, printable. */
static void s_sender_where(s_sender_t *s, const char *addr) {
    snprintf(s->row.where, sizeof s->row.where, "%c%.*s", s->bind ? '@' : '>',
             (int)sizeof s->row.where - 2, addr);
    for (char *c = s->row.where; *c; c++)  /* one printable field of the report */
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
            *c = '?';
}

static void s_sender_report(s_sender_t *s, void *sock, int force) {
    uint64_t now = tp_now_ns();
    if (!s->report || (!force && now - s->reported_ns < 500000000ull))
        return;
    char text[512];
    s_sender_report_text(s, now, text, sizeof text);
    if (tp_ctl_send(sock, TP_CTL_REPORT, 0, text, ZMQ_DONTWAIT) >= 0)
        s->reported_ns = now;
}

static void s_sender_publish(s_sender_t *s, int force) {
    if (!s->pub || (!force && tp_stats_pub_since(s->pub) < 1.0))
        return;
    tp_stats_row_t *r = &s->row;
    r->alive_s = (double)(tp_now_ns() - s->start) * 1e-9;
    r->starved_s = (double)s->starved * 1e-9;
    r->blocked_s = (double)s->blocked * 1e-9;
    r->busy_s = r->alive_s - r->starved_s - r->blocked_s;
    if (r->busy_s < 0)
        r->busy_s = 0;
    tp_stats_row_t copy = *r;
    tp_stats_pub_publish(s->pub, &copy, 1);
}

/* Whether a handshake that failed without a reason ran out (libzmq's
 * handshake interval) rather than being closed. libzmq 4.3 gives the
 * event the errno of that moment: a connection closed fails in its read,
 * with EPIPE (libzmq's word for a read of nothing: a close) or the read's
 * own error (ECONNRESET: closed with the greeting unread; a host's
 * errors); the interval's timer fails on whatever its I/O thread last left
 * in errno, the EAGAIN of a read with nothing yet or the EINPROGRESS of
 * its connect, never a read's error. The time the handshake took is no
 * test: the events are read when the send loop gets to them, which a slow
 * dataflow delays by any amount. */
static int s_handshake_ran_out(uint32_t value) {
    switch ((int)value) {
    case EPIPE:
    case ECONNRESET:
    case ECONNABORTED:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case ENOTCONN:
        return 0;
    default:
        return 1;
    }
}

/* What a failed handshake means, for the message that ends the sender. */
static const char *s_handshake_why(uint16_t event, uint32_t value, int curve) {
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        return "the receiver refused this sender's CURVE key: it is not the run's "
               "client key (tp-keygen DIR on one host, DIR copied to the others)";
    if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return curve ? "the receiver does not use CURVE: leave --curve out, or give the "
                       "receiver the keys too"
                     : "the receiver uses CURVE: it requires CURVE keys (give --curve DIR "
                       "with the run's keys)";
    if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
        return "the CURVE handshake failed: the keys in --curve DIR are not the "
               "receiver's (its server.key)";
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && s_handshake_ran_out(value))
        return "it did not answer the handshake in libzmq's handshake interval (a peer "
               "stopped or overloaded, or not a towerpack one)";
    /* the receiver closed the connection in the handshake */
    return curve ? "the receiver closed the connection in the CURVE handshake: the keys "
                   "in --curve DIR are not the receiver's (its server.key), or it does "
                   "not use CURVE"
                 : "the receiver closed the connection in the handshake: it requires "
                   "CURVE keys (give --curve DIR with the run's keys), or it is not a "
                   "towerpack receiver";
}

/* A datapoint about to go: TP_OK when the receiver takes it (or said
 * nothing of what it takes); else TP_ERR_SHAPE naming the receiver, the
 * component, what it takes and what this sender has, after telling the
 * receiver why this sender ends (a TP_CTL_ERROR frame after the datapoints
 * already queued, so that its log names this sender too). */
static tp_status_t s_sender_check_fit(s_sender_t *s, void *sock, const tp_datapoint_t *dp) {
    char why[400];
    if (!s->nwant || tp_wire_comps_check(s->want, s->nwant, dp, why, sizeof why) == 0)
        return TP_OK;
    /* the frame waits (counted blocked) behind the queue, at most a second */
    for (uint64_t t0 = tp_now_ns(); tp_ctl_send(sock, TP_CTL_ERROR, 0, why, ZMQ_DONTWAIT) < 0 &&
                                    zmq_errno() == EAGAIN && tp_now_ns() - t0 < 1000000000ull;) {
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLOUT, 0};
        zmq_poll(&it, 1, 50);
    }
    return tp_error(TP_ERR_SHAPE, "send: the receiver at %s does not take this sender's "
                    "datapoints: %s (it takes %s: its model's inputs; this sender's "
                    "dataflow must make those)", s->endpoint, why, s->want_text);
}

/* What a connect of a sender's own says of its receiver's endpoint after a
 * failed handshake. */
typedef enum {
    S_PEER_UNKNOWN = 0, /* cannot tell: another endpoint's form, no address */
    S_PEER_THERE,       /* a connect was accepted: a receiver listens there */
    S_PEER_NOBODY,      /* refused (ipc: the path gone): nobody listens */
    S_PEER_SILENT,      /* tcp: the host answers no connect (died, left the network) */
} s_peer_t;

/* How long the tcp probe waits for an answer to its connects: Linux sends a
 * lost SYN again after a second, so one lost packet is still an answer. A
 * live host answers a connect from its kernel, however slow or stopped the
 * receiver process is; a full backlog also drops SYNs (read as silent). */
#define S_PROBE_MS 1500
#define S_PROBE_ADDRS 8
/* a receiver's name that did not resolve is looked up again after this */
#define S_RESOLVE_RETRY_NS 60000000000ull

/* ipc: nobody listens when a connect of its own is refused or the path is
 * gone; non-blocking, so a full backlog is someone listening. */
static s_peer_t s_ipc_probe(const char *ep) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(ep + 6);
    if (n == 0 || n >= sizeof a.sun_path)
        return S_PEER_UNKNOWN;
    memcpy(a.sun_path, ep + 6, n);
    if (ep[6] == '@')  /* libzmq's abstract namespace */
        a.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return S_PEER_UNKNOWN;
    s_peer_t p = S_PEER_THERE;
    if (connect(fd, (struct sockaddr *)&a,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0)
        p = errno == ECONNREFUSED || errno == ENOENT ? S_PEER_NOBODY
            : errno == EAGAIN                        ? S_PEER_THERE
                                                     : S_PEER_UNKNOWN;
    close(fd);
    return p;
}

/* One address's answer to a connect, from its error (0: accepted). */
static s_peer_t s_tcp_answer(int err) {
    if (err == 0)
        return S_PEER_THERE;
    if (err == ECONNREFUSED || err == EADDRNOTAVAIL || err == ENETUNREACH)
        return S_PEER_NOBODY;
    if (err == EHOSTUNREACH || err == ETIMEDOUT)  /* no ARP answer; no SYN-ACK */
        return S_PEER_SILENT;
    return S_PEER_UNKNOWN;
}

/* tcp: connects of its own to every address of the receiver's host at
 * once ("localhost" may be ::1 and 127.0.0.1, the receiver on one of
 * them), S_PROBE_MS at most in all. A receiver there when one is accepted;
 * else cannot tell when one failed otherwise (or more than S_PROBE_ADDRS
 * were waited on); else silent when one got no answer; else nobody listens
 * (every address refused). */
static s_peer_t s_tcp_probe(const struct addrinfo *addrs) {
    struct pollfd pf[S_PROBE_ADDRS];
    int n = 0, there = 0, unknown = 0, silent = 0;
    for (const struct addrinfo *ai = addrs; ai && !there; ai = ai->ai_next) {
        if (n == S_PROBE_ADDRS) {  /* more addresses than it waits on */
            unknown = 1;
            break;
        }
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            unknown = 1;
            continue;
        }
        int err = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
            pf[n++] = (struct pollfd){fd, POLLOUT, 0};
            continue;
        }
        s_peer_t p = s_tcp_answer(err);
        there |= p == S_PEER_THERE;
        unknown |= p == S_PEER_UNKNOWN;
        silent |= p == S_PEER_SILENT;
        close(fd);
    }
    uint64_t deadline = tp_now_ns() + S_PROBE_MS * 1000000ull;
    for (int pending = n; pending > 0 && !there;) {
        uint64_t now = tp_now_ns();
        if (now >= deadline || tp_signal_pending())
            break;
        int r = poll(pf, (nfds_t)n, (int)((deadline - now + 999999) / 1000000));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        for (int i = 0; i < n; i++) {
            if (pf[i].fd < 0 || !pf[i].revents)
                continue;
            int err = 0;
            socklen_t el = sizeof err;
            if (getsockopt(pf[i].fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
                err = errno;
            s_peer_t p = s_tcp_answer(err);
            there |= p == S_PEER_THERE;
            unknown |= p == S_PEER_UNKNOWN;
            silent |= p == S_PEER_SILENT;
            close(pf[i].fd);
            pf[i].fd = -1;
            pending--;
        }
    }
    for (int i = 0; i < n; i++)
        if (pf[i].fd >= 0) {  /* no answer in time */
            close(pf[i].fd);
            silent = 1;
        }
    if (there)
        return S_PEER_THERE;
    if (tp_signal_pending())
        return S_PEER_UNKNOWN;  /* cut short: it ends anyway */
    return unknown ? S_PEER_UNKNOWN : silent ? S_PEER_SILENT : S_PEER_NOBODY;
}

/* The addresses of a connecting sender's tcp receiver, looked up the first
 * time they are needed and kept (a lookup blocks, for as long as the
 * resolver takes: once, not at every failed handshake); a name that did not
 * resolve is tried again at most once a minute. NULL: none known. The
 * addresses are the name's at that time: libzmq looks it up again at each
 * reconnect. */
static const struct addrinfo *s_sender_addrs(s_sender_t *s) {
    char host[256];
    const char *port;
    if (s->addrs || tp_wire_tcp_host(s->endpoint, host, sizeof host, &port) < 0)
        return s->addrs;
    uint64_t now = tp_now_ns();
    if (s->resolved_ns && now - s->resolved_ns < S_RESOLVE_RETRY_NS)
        return NULL;
    s->resolved_ns = now;
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, port, &hints, &s->addrs);
    if (g != 0) {
        s->addrs = NULL;
        TP_DEBUG("send: cannot look up %s (%s): a failed handshake's cause is not "
                 "checked for a minute", s->endpoint, gai_strerror(g));
    }
    return s->addrs;
}

/* What listens at a connecting sender's endpoint now (tcp: an interface or
 * source part (';') cannot be told). */
static s_peer_t s_sender_probe(s_sender_t *s) {
    if (!strncmp(s->endpoint, "ipc://", 6))
        return s_ipc_probe(s->endpoint);
    const struct addrinfo *addrs = s_sender_addrs(s);
    return addrs ? s_tcp_probe(addrs) : S_PEER_UNKNOWN;
}

/* The receiver's properties, read with a probe of its own: on tcp at its
 * host's addresses as s_sender_addrs keeps them (one lookup, not one per
 * handshake: a slow resolver held the send loop at each), the first that
 * answers; on ipc at its path. */
static tp_status_t s_sender_probe_peer(s_sender_t *s, const uint8_t *keys,
                                       tp_wire_peer_t *peer) {
    if (strncmp(s->endpoint, "tcp://", 6))
        return tp_wire_probe_peer(s->endpoint, 2000, keys, peer);
    const struct addrinfo *addrs = s_sender_addrs(s);
    if (!addrs)
        return tp_error(TP_ERR_IO, "send: no address of %s to probe", s->endpoint);
    tp_status_t st = TP_OK;
    int n = 0;
    for (const struct addrinfo *ai = addrs; ai && n < S_PROBE_ADDRS; ai = ai->ai_next, n++)
        if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
            (st = tp_wire_probe_peer_at(s->endpoint, ai->ai_addr, ai->ai_addrlen, 2000, keys,
                                        peer)) == TP_OK)
            return TP_OK;
    return st < 0 ? st : tp_error(TP_ERR_IO, "send: no address of %s to probe", s->endpoint);
}

/* The handshake on a connection just made: the receiver's properties,
 * read with a probe of its own (a PUSH socket never sees them; with CURVE,
 * the handshake made with this run's client keys). Its job id must be this
 * sender's: a receiver of another job, say one started on the port after
 * this worker's trainer ended, ends the sender (s->failed). Its components
 * (a trainer's model inputs) are kept: the send loop checks every
 * datapoint against them. Only a connecting sender can ask: a bound one is
 * refused or dropped by the receiver alone. */
static void s_sender_check_peer(s_sender_t *s) {
    if (!s->connecting || s->failed < 0)
        return;
    tp_wire_peer_t peer;
    uint8_t keys[96];
    tp_status_t st;
    if (!s->curve) {
        st = s_sender_probe_peer(s, NULL, &peer);
    } else {
        if ((st = tp_curve_client_keys(s->curve_keys, keys)) == TP_OK)
            st = s_sender_probe_peer(s, keys, &peer);
        memset(keys, 0, sizeof keys);
    }
    if (st < 0) {  /* the data connection is up: a probe that failed proves nothing */
        TP_DEBUG("send: %s", tp_last_error());
        return;
    }
    int n = peer.comps[0] ? tp_wire_comps_parse(peer.comps, s->want, TP_WIRE_COMPS_N) : 0;
    s->nwant = n > 0 ? n : 0;
    snprintf(s->want_text, sizeof s->want_text, "%s", n > 0 ? peer.comps : "");
    if (s->nwant)
        TP_DEBUG("send: the receiver at %s takes %s", s->endpoint, s->want_text);
    if (!s->job || !peer.job[0] || !strcmp(peer.job, s->job))
        return;  /* this job's receiver, or one that checks nothing */
    s->job_refused = 1;
    s->failed = tp_error(TP_ERR_PEER, "send: refused by the receiver at %s: it is job '%s', "
                         "this sender was started for job '%s' (a worker of another job, "
                         "or one left from an earlier run)", s->endpoint, peer.job, s->job);
}

/* A connecting sender's handshake that failed, no reason given: the
 * receiver closed it, or libzmq's handshake interval ran out (ran_out).
 * A close is a receiver that refuses it (one that wants CURVE keys, or
 * other keys; no towerpack receiver) or a trainer that stopped in the
 * middle of it (a worker slow to connect, a trainer's end, the next
 * trainer's bind on the port); an interval run out is a receiver's host
 * that died or left the network mid-handshake (nothing closes), or a
 * receiver alive that does not answer (a trainer stopped in a debugger,
 * swapping, overloaded; something that is no towerpack receiver). Either
 * way a receiver was there: from now its absence counts for
 * --exit-with-trainer, as after any receiver's end (libzmq reconnects
 * meanwhile). Nobody listening there any more, or a host that answers no
 * connect, is a receiver gone. A live host answers a connect (its kernel
 * does, however slow the receiver), so a receiver that does not answer
 * the handshake is still there: not a refusal, however long (a trainer
 * paused in a debugger finds its workers when it goes on), and not gone
 * either (its host holds each new connection, which --exit-with-trainer
 * counts as one); once per such run it is said. Three handshakes closed
 * in a row by a receiver still there refuse this sender; fewer may be a
 * trainer stopping or starting (the next handshake tells). Five closed in
 * a row, however explained, are a refusal too: a receiver gone makes no
 * more handshakes, so that nothing loops on a check that misreads its
 * endpoint. 1 when it is a refusal. */
static int s_sender_closed_is_refusal(s_sender_t *s, int ran_out) {
    /* a receiver was there: --exit-with-trainer counts its absence */
    s->met = 1;
    if (!ran_out)
        s->closed_in_row++;
    s_peer_t p = ran_out || s->closed_in_row < 5 ? s_sender_probe(s) : S_PEER_UNKNOWN;
    s->none_since = tp_now_ns();  /* from the verdict (its close, next, says the same) */
    if (p == S_PEER_NOBODY || p == S_PEER_SILENT) {
        s->refused_in_row = s->ran_out_in_row = 0;
        if (p == S_PEER_NOBODY)
            TP_INFO("send: the receiver at %s %s in the handshake and is gone (a trainer "
                    "that stopped): waiting for the next", s->endpoint,
                    ran_out ? "did not answer" : "closed the connection");
        else
            TP_INFO("send: the handshake with the receiver at %s failed and its host does "
                    "not answer a connect (%.1f s): the receiver is gone (a host that died "
                    "or left the network): waiting for the next", s->endpoint,
                    S_PROBE_MS * 1e-3);
        return 0;
    }
    if (ran_out) {
        s->ran_out_in_row++;
        double took = s->connected_ns ? (double)(tp_now_ns() - s->connected_ns) * 1e-9 : 0;
        if (s->ran_out_in_row == 1)
            TP_WARN("send: the receiver at %s is not answering the handshake (%.1f s: a "
                    "trainer stopped or overloaded, or not a towerpack receiver): waiting "
                    "for it", s->endpoint, s->handshake_ms * 1e-3);
        else if (s->ran_out_in_row % 10 == 0)
            TP_INFO("send: the receiver at %s is still not answering the handshake (%d in "
                    "a row): waiting for it", s->endpoint, s->ran_out_in_row);
        TP_DEBUG("send: the handshake with %s ran out (%.1f s after its connect was seen)",
                 s->endpoint, took);
        return 0;
    }
    if (s->closed_in_row < 5 && ++s->refused_in_row < 3) {
        TP_DEBUG("send: the receiver at %s closed the connection in the handshake (%d in a "
                 "row): trying again", s->endpoint, s->refused_in_row);
        return 0;
    }
    return 1;
}

/* The socket's connection events, never waited for: the count of connected
 * receivers, and a connecting sender's failed handshake (s->failed). A
 * bound sender only warns about a peer that failed: anyone may knock. */
static void s_sender_events(s_sender_t *s) {
    uint16_t event;
    uint32_t value;
    for (int i = 0; i < S_MONITOR_BURST && s_monitor_event(s->mon, &event, &value); i++) {
        /* connections are counted by descriptor, from their accept or
         * connect to their close (the handshake events carry none) */
        if (event == ZMQ_EVENT_ACCEPTED || event == ZMQ_EVENT_CONNECTED) {
            s->connected_ns = tp_now_ns();
            s_fd_add(s->conn_fds, &s->connected, (int)value);
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            s_fd_remove(s->conn_fds, &s->connected, (int)value);
            if (s->connected == 0)
                s->none_since = tp_now_ns();
        } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            if (!s->ever)
                TP_INFO("send: connected to a receiver at %s", s->endpoint);
            else if (s->ran_out_in_row)
                TP_INFO("send: the receiver at %s answered the handshake again (after %d "
                        "that ran out)", s->endpoint, s->ran_out_in_row);
            s->ever = 1;
            s->closed_in_row = s->refused_in_row = s->ran_out_in_row = 0;
            s->reported_ns = 0;  /* a new receiver hears who this is soon */
            s_sender_check_peer(s);
        } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
                   event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                   event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            TP_DEBUG("send: a handshake at %s failed (event %u, value %u)", s->endpoint,
                     (unsigned)event, (unsigned)value);
            if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && s->connecting &&
                s->failed == TP_OK &&
                !s_sender_closed_is_refusal(s, s_handshake_ran_out(value)))
                continue;
            if (s->connecting && s->failed == TP_OK)
                s->failed = tp_error(TP_ERR_PEER, "send: the handshake with the receiver "
                                     "at %s failed: %s", s->endpoint,
                                     s_handshake_why(event, value, s->curve));
            else if (!s->connecting)
                TP_WARN("send: a receiver's handshake at %s failed: %s", s->endpoint,
                        s_handshake_why(event, value, s->curve));
        }
    }
    s->mon_ns = tp_now_ns();
}

/* A tcp connection whose receiver's host died, or left the network, with
 * data on its way: nothing closes it, and the ZMTP heartbeat cannot tell
 * either when the socket buffers are full (libzmq 4.3 arms the heartbeat's
 * timeout only when its PING goes into the output, which a full TCP send
 * buffer holds back: whether a PING was still unanswered when the host
 * died decides; measured on two network namespaces, docs/distributed.md).
 * The kernel would end it after tcp_retries2's retransmissions, some
 * 15 minutes. What the kernel knows decides here instead: data in flight
 * (sent, not acknowledged), retransmitted, and no ACK at all for
 * S_DEAD_ACK_MS; or, the receiver's window closed (a trainer that reads
 * nothing: the host died while its buffers were full), two window probes
 * in a row unanswered and no ACK for as long. A live receiver's host
 * ACKs whatever arrives, and answers every window probe, however slow
 * its trainer is (a long validation that reads nothing for minutes):
 * this check never fires for it (a small TCP_USER_TIMEOUT, ZMQ_TCP_MAXRT,
 * would end those too: since Linux 5.11 it counts a window closed that
 * long, probes answered or not). The
 * connection is shut down under libzmq, which sees it closed (its
 * disconnect counts for --exit-with-trainer) and connects again. */
#define S_DEAD_ACK_MS 20000u

static void s_sender_dead_hosts(s_sender_t *s) {
    for (int k = 0; k < s->connected; k++) {
        struct tcp_info ti;
        socklen_t tl = sizeof ti;
        memset(&ti, 0, sizeof ti);
        if (getsockopt(s->conn_fds[k], IPPROTO_TCP, TCP_INFO, &ti, &tl) < 0 ||
            tl < offsetof(struct tcp_info, tcpi_last_ack_recv) + sizeof ti.tcpi_last_ack_recv)
            continue;  /* not tcp (ipc), or gone meanwhile */
        /* data sent again; or a closed window whose probes went
         * unanswered twice in a row (a live host answers each at once:
         * one unanswered is a probe still on its way) */
        int unanswered = (ti.tcpi_unacked && ti.tcpi_retransmits) || ti.tcpi_probes >= 2;
        if (ti.tcpi_state != TCP_ESTABLISHED || !unanswered ||
            ti.tcpi_last_ack_recv < S_DEAD_ACK_MS)
            continue;
        TP_INFO("send: the receiver at %s has acknowledged nothing for %.1f s (%u segments "
                "sent again, %u in flight, %u window probes unanswered): its host died or "
                "left the network: closing the connection", s->endpoint,
                ti.tcpi_last_ack_recv * 1e-3, (unsigned)ti.tcpi_retransmits,
                (unsigned)ti.tcpi_unacked, (unsigned)ti.tcpi_probes);
        shutdown(s->conn_fds[k], SHUT_RDWR);
    }
}

/* TP_OK while the sender should go on; the failed handshake, or TP_DONE
 * when its receivers have been gone for peer_gone_s (after one was). */
static tp_status_t s_sender_check(s_sender_t *s) {
    if (tp_now_ns() - s->mon_ns >= 100000000ull) {  /* at most every 100 ms */
        s_sender_events(s);
        s_sender_dead_hosts(s);
    }
    if (s->failed < 0)
        return s->failed;
    if (s->peer_gone_s > 0 && (s->ever || s->met) && s->connected == 0 &&
        (double)(tp_now_ns() - s->none_since) * 1e-9 >= s->peer_gone_s) {
        tp_error(TP_ERR_PEER, "send: the receiver at %s has been gone for %.0f s",
                 s->endpoint, s->peer_gone_s);
        return TP_DONE;
    }
    return TP_OK;
}

/* Nobody at a connecting sender's endpoint (no receiver was ever met, no
 * connection is up) this long: said, then every S_NO_RECEIVER_AGAIN_S.
 * Waiting is right (a worker may start before its trainer), waiting in
 * silence is not: a mistyped address looked like a worker at work. */
#define S_NO_RECEIVER_NOTE_S 10
#define S_NO_RECEIVER_AGAIN_S 60

/* A connecting sender's first datapoint waits (counted as blocked) for the
 * first handshake with its receiver: its probe says what the receiver
 * takes, so that no datapoint it does not take goes. TP_OK once connected;
 * the failed handshake, or TP_ERR_INTERRUPTED on a signal. */
static tp_status_t s_sender_await_receiver(s_sender_t *s) {
    uint64_t t0 = tp_now_ns();
    double next_note = S_NO_RECEIVER_NOTE_S;
    for (;;) {
        s_sender_events(s);
        if (s->failed < 0)
            return s->failed;
        if (s->ever || !s->mon)
            return TP_OK;
        double waited = (double)(tp_now_ns() - t0) * 1e-9;
        if (!s->met && s->connected == 0 && waited >= next_note) {
            if (next_note == S_NO_RECEIVER_NOTE_S)
                TP_WARN("send: no receiver at %s after %.0f s (nothing there takes the "
                        "connection: is the trainer started, binding it with --remote @%s, "
                        "and is the address right?): waiting for one", s->endpoint,
                        waited, s->endpoint);
            else
                TP_INFO("send: still no receiver at %s after %.0f s: waiting for one",
                        s->endpoint, waited);
            next_note = waited + S_NO_RECEIVER_AGAIN_S;
        }
        tp_status_t st = s_sender_check(s);  /* a receiver met and gone */
        if (st != TP_OK)
            return st;
        if (tp_signal_pending())
            return tp_error(TP_ERR_INTERRUPTED, "send: interrupted by signal %d",
                            tp_signal_pending());
        uint64_t b0 = tp_now_ns();
        zmq_pollitem_t it = {s->mon, 0, ZMQ_POLLIN, 0};
        zmq_poll(&it, 1, 100);
        s->blocked += tp_now_ns() - b0;
        s_sender_publish(s, 0);
    }
}

/* Send msg, waiting (counted as blocked) while the peer is full; publishes
 * and looks for signals while it waits. A bound sender that no receiver
 * has reached yet says so after S_NO_RECEIVER_NOTE_S, then every
 * S_NO_RECEIVER_AGAIN_S, as a connecting one does (its wait was silent:
 * a trainer pointed elsewhere looked like a worker at work). */
static tp_status_t s_send_blocking(s_sender_t *s, tp_wire_msg_t *msg, void *sock) {
    const uint64_t t0 = tp_now_ns();
    double next_note = S_NO_RECEIVER_NOTE_S;
    /* Wait (counted as blocked) until the socket can take a message, then
     * send it whole with a plain blocking send. */
    for (;;) {
        uint32_t events = 0;
        size_t es = sizeof events;
        if (zmq_getsockopt(sock, ZMQ_EVENTS, &events, &es) == 0 &&
            (events & ZMQ_POLLOUT)) {
            /* a due report takes the free place first: with a receiver
             * that keeps the socket full, it gets through all the same */
            uint64_t before = s->reported_ns;
            s_sender_report(s, sock, 0);
            if (s->reported_ns != before)
                continue;
            return tp_wire_msg_send(msg, sock, 0);
        }
        if (tp_signal_pending()) {
            tp_wire_msg_clear(msg);
            return tp_error(TP_ERR_INTERRUPTED, "send: interrupted by signal %d",
                            tp_signal_pending());
        }
        tp_status_t st = s_sender_check(s);
        if (st != TP_OK) {  /* a failed handshake; the receivers gone */
            tp_wire_msg_clear(msg);
            return st;
        }
        double waited = (double)(tp_now_ns() - t0) * 1e-9;
        if (!s->connecting && !s->ever && s->connected == 0 && s->mon &&
            waited >= next_note) {
            if (next_note == S_NO_RECEIVER_NOTE_S)
                TP_WARN("send: no receiver has connected to %s after %.0f s (is the trainer "
                        "started, connecting to it with --remote %s, and is the address "
                        "right?): waiting for one", s->endpoint, waited, s->endpoint);
            else
                TP_INFO("send: still no receiver connected to %s after %.0f s: waiting "
                        "for one", s->endpoint, waited);
            next_note = waited + S_NO_RECEIVER_AGAIN_S;
        }
        uint64_t b0 = tp_now_ns();
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLOUT, 0};
        zmq_poll(&it, 1, 100);
        s->blocked += tp_now_ns() - b0;
        s_sender_publish(s, 0);
    }
}

/* libzmq's handshake interval on the sender's socket: how long a handshake
 * that gets no answer (a receiver's host that died mid-way) waits before it
 * fails, 30 s unless $TP_SEND_HANDSHAKE_S (seconds) says otherwise (the
 * tests' short one). Not shorter by default: a receiver alive but slow to
 * answer (stopped, overloaded) also runs it out, and three of those in a
 * row are a refusal. */
static tp_status_t s_sender_handshake_ivl(void *sock) {
    const char *env = getenv("TP_SEND_HANDSHAKE_S");
    if (!env)
        return TP_OK;
    char *end;
    double v = strtod(env, &end);
    if (end == env || *end || !(v >= 0.001 && v <= 3600))
        return tp_error(TP_ERR_INVALID, "send: TP_SEND_HANDSHAKE_S='%s' is not a number of "
                        "seconds from 0.001 to 3600", env);
    int ms = (int)(v * 1000 + 0.5);
    zmq_setsockopt(sock, ZMQ_HANDSHAKE_IVL, &ms, sizeof ms);
    return TP_OK;
}

tp_status_t tp_send_dataflow(tp_dataflow_t *df, const char *endpoint,
                             const tp_send_opts_t *opts, uint64_t *sent) {
    tp_send_opts_t o;
    if (opts)
        o = *opts;
    else
        tp_send_opts_init(&o);
    if (sent)
        *sent = 0;
    if (o.hwm <= 0)
        o.hwm = 50;
    if (!endpoint || !s_endpoint_ok(endpoint))
        return tp_error(TP_ERR_INVALID,
                        "send: endpoint '%s' is not tcp://, ipc:// or inproc://",
                        endpoint ? endpoint : "(null)");
    /* before any socket: a multiprocess dataflow forks its workers here,
     * which it may only do while this process has no threads */
    TP_TRY(tp_dataflow_reset_state(df, o.seed, o.stream));
    tp_actors_init();
    s_sender_t s;
    memset(&s, 0, sizeof s);
    snprintf(s.row.name, sizeof s.row.name, "%s", o.stats_name ? o.stats_name : "send");
    s.row.state = TP_ACTOR_RUNNING;
    s.row.queue_fill = -1;
    /* a Python reader of tensorpack's formats would try to load a report */
    s.report = !o.no_report && !o.tpk_format;
    tp_stats_hostname(s.host, sizeof s.host);
    /* "NAME PID@HOST", cut at the row's 47 bytes (the host column has it whole) */
    char rn[128];
    snprintf(rn, sizeof rn, "%.24s %u@%s", o.stats_name ? o.stats_name : "send",
             (unsigned)getpid(), s.host);
    memcpy(s.report_name, rn, sizeof s.report_name - 1);
    if (o.stats) {
        char ep[300];
        TP_TRY(tp_stats_endpoint_resolve(o.stats, o.run_dir, ep, sizeof ep));
        s.pub = tp_stats_pub_new(ep, o.stats_name ? o.stats_name : "send");
        if (!s.pub)
            return tp_error_wrap(TP_ERR_IO, "send: stats");
        TP_INFO("send: statistics on %s", tp_stats_pub_endpoint(s.pub));
    }
    /* A context of its own, not czmq's shared one: the sender also works in
     * a process forked from one that already used ZeroMQ. */
    void *zctx = zmq_ctx_new();
    void *sock = zctx ? zmq_socket(zctx, ZMQ_PUSH) : NULL;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    tp_curve_t *curve = NULL;
    char bound[1024];
    snprintf(bound, sizeof bound, "%s", endpoint);
    tp_status_t rc = TP_OK;
    if (!sock || !msg) {
        rc = tp_error(TP_ERR_NOMEM, "send: socket");
        goto out;
    }
    if (o.bind && (rc = tp_bind_endpoint(endpoint, o.allow_public, bound, sizeof bound)) < 0)
        goto out;
    if (o.curve_dir) {
        if (!(curve = tp_curve_load(o.curve_dir, o.bind))) {
            rc = tp_error_wrap(TP_ERR_INVALID, "send");
            goto out;
        }
        if ((rc = tp_curve_apply(curve, zctx, sock)) < 0)
            goto out;
    }
    if (o.job && (rc = tp_wire_set_job(sock, o.job)) < 0) {
        tp_error_wrap(rc, "send");
        goto out;
    }
    s.bind = o.bind;
    s_sender_where(&s, o.bind ? bound : endpoint);  /* a wildcard's port: after the bind */
    if (s.report) {
        /* who this sender is, in the handshake of every connection it
         * makes: a receiver names it from its first message on, a refused
         * one too, not only once its report comes (which a refusal may
         * cut short). A libzmq without ZMQ_METADATA: the report alone. */
        char prop[600];
        int n = snprintf(prop, sizeof prop, "%s:", TP_WIRE_SENDER_PROPERTY);
        s_sender_report_text(&s, s.start, prop + n, sizeof prop - (size_t)n);
        zmq_setsockopt(sock, ZMQ_METADATA, prop, strlen(prop));
    }
    int linger = (int)(o.linger_s * 1000);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &o.hwm, sizeof o.hwm);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    /* its connection events: before the connect, so none is missed */
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://tp-send-monitor-%p", (void *)&s);
    if (zmq_socket_monitor(sock, mon_ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_CONNECTED |
                                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                             ZMQ_EVENT_DISCONNECTED |
                                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0 &&
        (s.mon = zmq_socket(zctx, ZMQ_PAIR)) != NULL) {
        int z = 0;
        zmq_setsockopt(s.mon, ZMQ_LINGER, &z, sizeof z);
        if (zmq_connect(s.mon, mon_ep) < 0) {
            zmq_close(s.mon);
            s.mon = NULL;
        }
    }
    s.endpoint = endpoint;
    s.connecting = !o.bind;
    s.curve = o.curve_dir != NULL;
    s.curve_keys = curve;
    s.job = o.job;
    s.peer_gone_s = o.peer_gone_s;
    if ((rc = s_sender_handshake_ivl(sock)) < 0)
        goto out;
    size_t hl = sizeof s.handshake_ms;
    if (zmq_getsockopt(sock, ZMQ_HANDSHAKE_IVL, &s.handshake_ms, &hl) < 0)
        s.handshake_ms = 30000;  /* libzmq's default */
    if (!strncmp(endpoint, "tcp://", 6)) {
        /* ZMTP heartbeats: a receiver whose host died (no close ever
         * comes) is a closed connection after 10 s */
        int ivl = 2000, ttl = 10000;
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &ttl, sizeof ttl);
    }
    if ((o.bind ? zmq_bind(sock, bound) : zmq_connect(sock, endpoint)) < 0) {
        int err = zmq_errno();
        rc = tp_error(TP_ERR_IO, "send: %s %s: %s%s", o.bind ? "bind" : "connect",
                      endpoint, zmq_strerror(err), o.bind ? tp_bind_why(bound, err) : "");
        goto out;
    }
    if (o.bind)
        tp_ipc_restrict(bound);
    /* where it is, for the receiver's log and tp-top: the endpoint it
     * connected to, or the one it bound (a wildcard's port resolved) */
    char last[TP_STATS_WHERE_MAX] = "";
    size_t ll = sizeof last;
    if (o.bind && zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &ll) == 0 && last[0])
        s_sender_where(&s, last);
    /* the receiver sees this sender as soon as it is connected, before
     * its first datapoint (which may take a while to make) */
    s.start = tp_now_ns();
    s_sender_report(&s, sock, 1);
    tp_wire_opts_t wire;
    tp_wire_opts_init(&wire);
    wire.lz4 = o.lz4;
    int64_t in_pass = 0;
    while (o.max_count <= 0 || (int64_t)s.row.msgs_out < o.max_count) {
        if (tp_signal_pending()) {
            rc = tp_error(TP_ERR_INTERRUPTED, "send: interrupted by signal %d",
                          tp_signal_pending());
            break;
        }
        if ((rc = s_sender_check(&s)) != TP_OK)
            break;  /* a failed handshake; the receivers gone (TP_DONE) */
        tp_datapoint_t *dp = NULL;
        uint64_t t0 = tp_now_ns();
        rc = tp_dataflow_next(df, &dp);
        /* Time inside the dataflow is this loop waiting for input. */
        s.starved += tp_now_ns() - t0;
        if (rc == TP_DONE) {
            rc = TP_OK;
            if (in_pass == 0) {
                rc = tp_error(TP_ERR_STATE, "send: dataflow '%s' yielded an empty pass",
                              tp_dataflow_name(df));
                break;
            }
            in_pass = 0;
            continue;
        }
        if (rc < 0)
            break;
        in_pass++;
        /* the component handshake: a datapoint the receiver does not take
         * ends this sender now, naming both sides (tensorpack's formats
         * are converted there: not checked here) */
        if (s.connecting && !s.ever && strncmp(endpoint, "inproc://", 9) &&
            (rc = s_sender_await_receiver(&s)) != TP_OK) {
            tp_datapoint_destroy(&dp);
            break;
        }
        if (!o.tpk_format && (rc = s_sender_check_fit(&s, sock, dp)) < 0) {
            tp_datapoint_destroy(&dp);
            break;
        }
        if (o.tpk_format) {
            void *buf = NULL;
            size_t len = 0;
            rc = tp_tpk_encode(dp, (tp_tpk_format_t)o.tpk_format, &buf, &len);
            tp_datapoint_destroy(&dp);
            tp_wire_msg_clear(msg);
            if (rc == TP_OK)
                rc = tp_wire_msg_add_frame(msg, buf, len);
            free(buf);
            if (rc < 0)
                break;
        } else if ((rc = tp_wire_encode(&dp, &wire, msg)) < 0) {
            break;
        }
        size_t bytes = tp_wire_msg_bytes(msg);
        if ((rc = s_send_blocking(&s, msg, sock)) != TP_OK)
            break;  /* also TP_DONE: the receivers gone */
        s.row.msgs_out++;
        s.row.bytes_out += bytes;
        s_sender_publish(&s, 0);
        if ((s.row.msgs_out & 15) == 0)  /* the clock every 16 datapoints */
            s_sender_report(&s, sock, 0);
    }
    /* the receiver hears how it ended (before the padding: that is last) */
    s.row.state = rc < 0 && rc != TP_ERR_INTERRUPTED ? TP_ACTOR_FAILED : TP_ACTOR_DONE;
    if (rc == TP_DONE) {  /* no receiver left: nothing to tell, nobody to wait for */
        int zero = 0;
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    }
    uint64_t before = s.reported_ns;
    s_sender_report(&s, sock, 1);
    /* refused for its job: the receiver drains what was queued before the
     * verdict; the report follows it there, so that the receiver's log
     * names this sender (half a second at most) */
    for (uint64_t t0 = tp_now_ns();
         s.job_refused && s.reported_ns == before && tp_now_ns() - t0 < 500000000ull;) {
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLOUT, 0};
        zmq_poll(&it, 1, 50);
        s_sender_report(&s, sock, 1);
    }
    if (rc == TP_OK && !o.tpk_format) {
        /* Padding after the last datapoint: libzmq may drop the unflushed
         * tail of a closing connection (tp_ctl_send_pad). */
        for (;;) {
            if (tp_ctl_send_pad(sock, ZMQ_DONTWAIT) >= 0 || zmq_errno() != EAGAIN ||
                tp_signal_pending())
                break;
            zmq_pollitem_t it = {sock, 0, ZMQ_POLLOUT, 0};
            zmq_poll(&it, 1, 100);
        }
    }
    s.row.state = rc < 0 && rc != TP_ERR_INTERRUPTED ? TP_ACTOR_FAILED : TP_ACTOR_DONE;
    s_sender_publish(&s, 1);
    if (sent)
        *sent = s.row.msgs_out;
out:
    tp_wire_msg_destroy(&msg);
    /* An interrupted sender should not linger on a peer that may be gone,
     * nor one whose handshake failed on a peer that will never take it. */
    if (sock && (rc == TP_ERR_INTERRUPTED || rc == TP_ERR_PEER)) {
        /* a receiver of another job: what is queued goes on (the
         * receiver's log names this sender from its first message: its
         * handshake says who it is), but nothing waits long: a linger
         * waits only while something is still queued */
        int ms = s.job_refused ? 2000 : 0;
        zmq_setsockopt(sock, ZMQ_LINGER, &ms, sizeof ms);
    }
    if (sock) {
        if (s.mon)
            zmq_socket_monitor(sock, NULL, 0);
        zmq_close(sock);
    }
    if (s.mon)
        zmq_close(s.mon);
    if (s.addrs)
        freeaddrinfo(s.addrs);
    if (zctx)
        zmq_ctx_term(zctx);
    tp_curve_destroy(&curve);
    if (o.bind && !strncmp(bound, "ipc://", 6))
        unlink(bound + 6);
    tp_stats_pub_destroy(&s.pub);
    return rc;
}

/* ---- pipeline spec: the source remote:ENDPOINT[,ENDPOINT...] ------------------- */

#ifdef TP_HAVE_SPEC
/* Besides endpoints, the list may hold "public" (allow a bind to every
 * interface), "curve=DIR" (CURVE keys), "job=ID" (this run's job id: other
 * jobs' senders are refused) and "int32" (tensorpack's int64 components
 * as int32). */
static tp_status_t s_spec_remote(const char *args, void *user, tp_dataflow_t **out) {
    (void)user;
    tp_remote_opts_t o;
    tp_remote_opts_init(&o);
    char eps[4096] = "", curve[1024] = "", job[TP_WIRE_JOB_MAX + 1] = "";
    size_t used = 0;
    const char *p = args;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 6 && !strncmp(p, "public", 6)) {
            o.allow_public = 1;
        } else if (len == 5 && !strncmp(p, "int32", 5)) {
            o.int32_labels = 1;  /* tensorpack's int64 labels as int32 */
        } else if (len > 4 && !strncmp(p, "job=", 4) && len - 4 < sizeof job) {
            memcpy(job, p + 4, len - 4);
            job[len - 4] = '\0';
            o.job = job;
        } else if (len > 6 && !strncmp(p, "curve=", 6) && len - 6 < sizeof curve) {
            memcpy(curve, p + 6, len - 6);
            curve[len - 6] = '\0';
            o.curve_dir = curve;
        } else {
            int n = snprintf(eps + used, sizeof eps - used, "%s%.*s", used ? "," : "",
                             (int)len, p);
            if (n < 0 || (size_t)n >= sizeof eps - used)
                return tp_error(TP_ERR_INVALID, "remote: endpoint list too long");
            used += (size_t)n;
        }
        p = end ? end + 1 : p + len;
    }
    *out = tp_df_remote(eps, &o);
    return *out ? TP_OK : TP_ERR_INVALID;
}

tp_status_t tp_df_process_spec_register(void);  /* df_process.c */

tp_status_t tp_actor_spec_register(void) {
    TP_TRY(tp_spec_register_source("remote", s_spec_remote, NULL));
    return tp_df_process_spec_register();
}

/* In the shared library (and whenever this object is linked) the spec
 * names are there before main; tp_actor_spec_register is for programs that
 * link the static library without referring to this file. */
__attribute__((constructor)) static void s_spec_autoregister(void) {
    tp_actor_spec_register();
}
#else
tp_status_t tp_actor_spec_register(void) {
    return tp_error(TP_ERR_UNSUPPORTED,
                    "this build has no pipeline spec parser to register remote: "
                    "and processes with");
}
#endif
