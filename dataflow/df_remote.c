/* towerpack dataflow: datapoints to and from other processes and hosts,
 * tensorpack's send_dataflow_zmq (tp_send_dataflow) and RemoteDataZMQ
 * (tp_df_remote), on the wire format.
 *
 * The receiving side trusts nothing: every message is validated by the
 * wire decoder, or, when it is one frame in one of tensorpack's formats
 * (pickle, msgpack, zmq_ops: a Python send_dataflow_zmq), by tensorpack's
 * decoders (df_tp_*.c); one that fails is counted, logged at most once a
 * second, and dropped; the stream goes on. */
#include <czmq.h>
#include <string.h>
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
#if __has_include(<towerpack/dataflow_spec.h>)
#include <towerpack/dataflow_spec.h>
#define TP_HAVE_SPEC 1
#endif

void tp_remote_opts_init(tp_remote_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    opts->bind = 1;
    opts->hwm = 50;
    opts->max_bytes = (size_t)1 << 30;
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
} s_remote_t;

static tp_status_t s_remote_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                  uint64_t stream) {
    (void)rng; (void)seed; (void)stream;
    s_remote_t *r = impl;
    if (r->pull)
        return TP_OK;
    r->zctx = zmq_ctx_new();
    r->pull = r->zctx ? zmq_socket(r->zctx, ZMQ_PULL) : NULL;
    r->msg = tp_wire_msg_new();
    if (!r->pull || !r->msg)
        return tp_error(TP_ERR_NOMEM, "remote: socket");
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
        if (rc < 0)
            return tp_error(TP_ERR_IO, "remote: %s %s: %s",
                            r->bind[i] ? "bind" : "connect", r->endpoints[i],
                            zmq_strerror(zmq_errno()));
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
        if (rc == TP_OK && tp_wire_msg_frames(r->msg) == 1) {
            int kind;
            uint32_t sender;
            const char *text;
            size_t tl;
            if (tp_ctl_parse(tp_wire_msg_frame_data(r->msg, 0),
                             tp_wire_msg_frame_size(r->msg, 0), &kind, &sender,
                             &text, &tl)) {
                tp_wire_msg_clear(r->msg);  /* padding or end of a sender */
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
                if (rc == TP_OK) {
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
            if (rc == TP_OK)
                return TP_OK;
        bad:
            r->malformed++;
            if (tp_ratelog_ok(&r->ratelog))
                TP_WARN("remote: dropped a malformed message (%llu so far): %s",
                        (unsigned long long)r->malformed, tp_last_error());
            continue;
        }
        if (rc != TP_ERR_TIMEOUT)
            return tp_error_wrap(rc, "remote: receive");
        if (tp_signal_pending())
            return tp_error(TP_ERR_INTERRUPTED, "remote: interrupted by signal %d",
                            tp_signal_pending());
        if (tp_actor_current_stopping())  /* a prefetch actor asked to end */
            return tp_error(TP_ERR_INTERRUPTED, "remote: the actor reading it is stopping");
        if (r->opts.timeout_s > 0 &&
            (double)(tp_now_ns() - since) * 1e-9 > r->opts.timeout_s)
            return tp_error(TP_ERR_TIMEOUT, "remote: nothing from %s%s for %.3g s",
                            r->endpoints[0], r->nendpoints > 1 ? ", ..." : "",
                            r->opts.timeout_s);
    }
}

static void s_remote_destroy(void *impl) {
    s_remote_t *r = impl;
    if (r->pull)
        zmq_close(r->pull);
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
    if (opts)
        r->opts = *opts;
    else
        tp_remote_opts_init(&r->opts);
    if (r->opts.hwm <= 0)
        r->opts.hwm = 50;
    if (r->opts.curve_dir && !(r->opts.curve_dir = r->curve_dir = strdup(r->opts.curve_dir))) {
        free(r);
        tp_error(TP_ERR_NOMEM, "remote");
        return NULL;
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
    return tp_dataflow_new(&s_remote_ops, r);
}

uint64_t tp_df_remote_malformed(tp_dataflow_t *df) {
    if (!df || tp_dataflow_ops(df) != &s_remote_ops)  /* another kind */
        return 0;
    return ((s_remote_t *)tp_dataflow_impl(df))->malformed;
}

/* ---- send_dataflow_zmq --------------------------------------------------------------- */

typedef struct {
    tp_stats_pub_t *pub;
    tp_stats_row_t row;
    uint64_t start, blocked, starved;
} s_sender_t;

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

/* Send msg, waiting (counted as blocked) while the peer is full; publishes
 * and looks for signals while it waits. */
static tp_status_t s_send_blocking(s_sender_t *s, tp_wire_msg_t *msg, void *sock) {
    /* Wait (counted as blocked) until the socket can take a message, then
     * send it whole with a plain blocking send. */
    for (;;) {
        uint32_t events = 0;
        size_t es = sizeof events;
        if (zmq_getsockopt(sock, ZMQ_EVENTS, &events, &es) == 0 &&
            (events & ZMQ_POLLOUT))
            return tp_wire_msg_send(msg, sock, 0);
        if (tp_signal_pending()) {
            tp_wire_msg_clear(msg);
            return tp_error(TP_ERR_INTERRUPTED, "send: interrupted by signal %d",
                            tp_signal_pending());
        }
        uint64_t b0 = tp_now_ns();
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLOUT, 0};
        zmq_poll(&it, 1, 100);
        s->blocked += tp_now_ns() - b0;
        s_sender_publish(s, 0);
    }
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
    TP_TRY(tp_dataflow_reset_state(df, o.seed, o.stream));
    tp_actors_init();
    s_sender_t s;
    memset(&s, 0, sizeof s);
    snprintf(s.row.name, sizeof s.row.name, "%s", o.stats_name ? o.stats_name : "send");
    s.row.state = TP_ACTOR_RUNNING;
    s.row.queue_fill = -1;
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
    int linger = (int)(o.linger_s * 1000);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &o.hwm, sizeof o.hwm);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if ((o.bind ? zmq_bind(sock, bound) : zmq_connect(sock, endpoint)) < 0) {
        rc = tp_error(TP_ERR_IO, "send: %s %s: %s", o.bind ? "bind" : "connect",
                      endpoint, zmq_strerror(zmq_errno()));
        goto out;
    }
    if (o.bind)
        tp_ipc_restrict(bound);
    tp_wire_opts_t wire;
    tp_wire_opts_init(&wire);
    wire.lz4 = o.lz4;
    s.start = tp_now_ns();
    int64_t in_pass = 0;
    while (o.max_count <= 0 || (int64_t)s.row.msgs_out < o.max_count) {
        if (tp_signal_pending()) {
            rc = tp_error(TP_ERR_INTERRUPTED, "send: interrupted by signal %d",
                          tp_signal_pending());
            break;
        }
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
        if ((rc = s_send_blocking(&s, msg, sock)) < 0)
            break;
        s.row.msgs_out++;
        s.row.bytes_out += bytes;
        s_sender_publish(&s, 0);
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
    /* An interrupted sender should not linger on a peer that may be gone. */
    if (sock && rc == TP_ERR_INTERRUPTED) {
        int zero = 0;
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    }
    if (sock)
        zmq_close(sock);
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
 * interface), "curve=DIR" (CURVE keys) and "int32" (tensorpack's int64
 * components as int32). */
static tp_status_t s_spec_remote(const char *args, void *user, tp_dataflow_t **out) {
    (void)user;
    tp_remote_opts_t o;
    tp_remote_opts_init(&o);
    char eps[4096] = "", curve[1024] = "";
    size_t used = 0;
    const char *p = args;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 6 && !strncmp(p, "public", 6)) {
            o.allow_public = 1;
        } else if (len == 5 && !strncmp(p, "int32", 5)) {
            o.int32_labels = 1;  /* tensorpack's int64 labels as int32 */
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
