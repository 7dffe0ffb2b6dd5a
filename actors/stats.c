/* towerpack actors: the stats snapshot codec, rates, the JSON view and the
 * PUB-socket publisher.
 *
 * The binary layout is fixed-size and little-endian (every target is), so
 * the decoder can check the size before it reads anything: header of
 * TP_STATS_HEADER_BYTES, then nrows rows of TP_STATS_ROW_BYTES. */
#include <czmq.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/clock.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/security.h>
#include <towerpack/stats.h>
#include "actors/actor_internal.h"

static const char *s_state_names[] = {"starting", "running",  "stopping",
                                      "done",     "failed",   "restarting"};

const char *tp_actor_state_name(int state) {
    if (state < 0 || state >= TP_ACTOR_STATE_COUNT)
        return "invalid";
    return s_state_names[state];
}

void tp_stats_snapshot_init(tp_stats_snapshot_t *snap) {
    memset(snap, 0, sizeof *snap);
}

void tp_stats_snapshot_fini(tp_stats_snapshot_t *snap) {
    free(snap->rows);
    memset(snap, 0, sizeof *snap);
}

/* ---- codec ----------------------------------------------------------------- */

static uint8_t *s_put(uint8_t *p, const void *v, size_t n) {
    memcpy(p, v, n);
    return p + n;
}
static const uint8_t *s_get(const uint8_t *p, void *v, size_t n) {
    memcpy(v, p, n);
    return p + n;
}
/* A name in its fixed field of `field` bytes: at most field - 1 of its
 * bytes, the rest left zero (the buffer is zeroed), so that the decoder
 * finds it terminated and its padding canonical. */
static uint8_t *s_put_name(uint8_t *p, const char *name, size_t field) {
    memcpy(p, name, strnlen(name, field - 1));
    return p + field;
}

/* A row's 8-byte counters and rates, in wire order after the restarts
 * field: one table, so the encoder and the decoder cannot disagree. */
static const size_t s_row_words[] = {
    offsetof(tp_stats_row_t, msgs_in),    offsetof(tp_stats_row_t, msgs_out),
    offsetof(tp_stats_row_t, bytes_in),   offsetof(tp_stats_row_t, bytes_out),
    offsetof(tp_stats_row_t, busy_s),     offsetof(tp_stats_row_t, starved_s),
    offsetof(tp_stats_row_t, blocked_s),  offsetof(tp_stats_row_t, alive_s),
    offsetof(tp_stats_row_t, queue_fill), offsetof(tp_stats_row_t, msgs_per_s),
    offsetof(tp_stats_row_t, mb_per_s),
};

tp_status_t tp_stats_encode(const tp_stats_snapshot_t *snap, void **buf,
                            size_t *size) {
    *buf = NULL;
    *size = 0;
    if (snap->nrows < 0 || snap->nrows > TP_STATS_MAX_ROWS)
        return tp_error(TP_ERR_INVALID, "stats encode: %d rows (at most %d)",
                        snap->nrows, TP_STATS_MAX_ROWS);
    size_t n = TP_STATS_HEADER_BYTES + (size_t)snap->nrows * TP_STATS_ROW_BYTES;
    uint8_t *b = calloc(1, n);
    if (!b)
        return tp_error(TP_ERR_NOMEM, "stats encode: %zu bytes", n);
    uint8_t *p = b;
    uint32_t magic = TP_STATS_MAGIC, u32;
    uint16_t rows = (uint16_t)snap->nrows;
    p = s_put(p, &magic, 4);
    *p++ = TP_STATS_VERSION;
    *p++ = 0;
    p = s_put(p, &rows, 2);
    p = s_put(p, &snap->pid, 4);
    p += 4;
    p = s_put(p, &snap->seq, 8);
    p = s_put(p, &snap->wall_s, 8);
    p = s_put(p, &snap->interval_s, 8);
    p = s_put_name(p, snap->source, TP_STATS_SOURCE_MAX);
    TP_ASSERT(p == b + TP_STATS_HEADER_BYTES);
    for (int i = 0; i < snap->nrows; i++) {
        const tp_stats_row_t *r = &snap->rows[i];
        uint8_t *row = p;
        p = s_put_name(p, r->name, TP_STATS_NAME_MAX);
        *p++ = r->state;
        p += 3;
        p = s_put(p, &r->restarts, 4);
        for (size_t k = 0; k < sizeof s_row_words / sizeof *s_row_words; k++)
            p = s_put(p, (const char *)r + s_row_words[k], 8);
        float f = (float)r->busy_pct;
        p = s_put(p, &f, 4);
        f = (float)r->starved_pct;
        p = s_put(p, &f, 4);
        f = (float)r->blocked_pct;
        p = s_put(p, &f, 4);
        u32 = r->pid;
        p = s_put(p, &u32, 4);
        p = s_put_name(p, r->host, TP_STATS_HOST_MAX);
        p = s_put_name(p, r->where, TP_STATS_WHERE_MAX);
        TP_ASSERT(p == row + TP_STATS_ROW_BYTES);
    }
    *buf = b;
    *size = n;
    return TP_OK;
}

/* A NUL-terminated, printable name in a fixed field. */
static int s_name_ok(const char *name, size_t field) {
    size_t len = strnlen(name, field);
    if (len == field)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7e)
            return 0;
    for (size_t i = len; i < field; i++)  /* padding is zero: canonical */
        if (name[i])
            return 0;
    return 1;
}

/* Reads a name's fixed field into name[field]; 0 when it is not a valid
 * name (s_name_ok). */
static int s_get_name(const uint8_t **p, char *name, size_t field) {
    memcpy(name, *p, field);
    *p += field;
    return s_name_ok(name, field);
}

static int s_finite_nonneg(double v) { return isfinite(v) && v >= 0; }
static int s_pct_ok(float v) { return isfinite(v) && v >= 0 && v <= 100.5f; }

static tp_status_t s_bad(tp_stats_snapshot_t *snap, const char *what, int row) {
    tp_stats_snapshot_fini(snap);
    if (row >= 0)
        return tp_error(TP_ERR_PROTOCOL, "stats message: row %d: %s", row, what);
    return tp_error(TP_ERR_PROTOCOL, "stats message: %s", what);
}

tp_status_t tp_stats_decode(const void *buf, size_t size,
                            tp_stats_snapshot_t *snap) {
    tp_stats_snapshot_fini(snap);
    const uint8_t *p = buf;
    if (!buf || size < TP_STATS_HEADER_BYTES)
        return s_bad(snap, "shorter than the 56-byte header", -1);
    uint32_t magic;
    uint16_t rows;
    p = s_get(p, &magic, 4);
    if (magic != TP_STATS_MAGIC)
        return s_bad(snap, "bad magic (not a towerpack stats message)", -1);
    uint8_t version = *p++;
    if (version != TP_STATS_VERSION)
        return tp_error(TP_ERR_PROTOCOL,
                        "stats message: version %u (this build reads %d)",
                        version, TP_STATS_VERSION);
    if (*p++ != 0)
        return s_bad(snap, "reserved header byte is not zero", -1);
    p = s_get(p, &rows, 2);
    if (rows > TP_STATS_MAX_ROWS)
        return s_bad(snap, "too many rows", -1);
    if (size != TP_STATS_HEADER_BYTES + (size_t)rows * TP_STATS_ROW_BYTES)
        return tp_error(TP_ERR_PROTOCOL,
                        "stats message: %zu bytes, %u rows need %zu", size,
                        rows,
                        TP_STATS_HEADER_BYTES + (size_t)rows * TP_STATS_ROW_BYTES);
    p = s_get(p, &snap->pid, 4);
    uint32_t hreserved;
    p = s_get(p, &hreserved, 4);
    if (hreserved)   /* zero, as in the rows: one message, one encoding */
        return s_bad(snap, "reserved header bytes not zero", -1);
    p = s_get(p, &snap->seq, 8);
    p = s_get(p, &snap->wall_s, 8);
    p = s_get(p, &snap->interval_s, 8);
    if (!s_get_name(&p, snap->source, TP_STATS_SOURCE_MAX))
        return s_bad(snap, "source name not terminated or not printable", -1);
    if (!s_finite_nonneg(snap->wall_s) || !s_finite_nonneg(snap->interval_s))
        return s_bad(snap, "time fields not finite and >= 0", -1);
    if (rows) {
        snap->rows = calloc(rows, sizeof *snap->rows);
        if (!snap->rows) {
            tp_stats_snapshot_fini(snap);
            return tp_error(TP_ERR_NOMEM, "stats decode: %u rows", rows);
        }
    }
    snap->nrows = rows;
    for (int i = 0; i < rows; i++) {
        tp_stats_row_t *r = &snap->rows[i];
        if (!s_get_name(&p, r->name, TP_STATS_NAME_MAX) || !r->name[0])
            return s_bad(snap, "name empty, not terminated or not printable", i);
        r->state = *p++;
        if (r->state >= TP_ACTOR_STATE_COUNT)
            return s_bad(snap, "unknown state", i);
        if (p[0] || p[1] || p[2])
            return s_bad(snap, "reserved bytes not zero", i);
        p += 3;
        p = s_get(p, &r->restarts, 4);
        for (size_t k = 0; k < sizeof s_row_words / sizeof *s_row_words; k++)
            p = s_get(p, (char *)r + s_row_words[k], 8);
        float f[3];
        p = s_get(p, f, 12);
        p = s_get(p, &r->pid, 4);
        if (!s_get_name(&p, r->host, TP_STATS_HOST_MAX))
            return s_bad(snap, "host not terminated or not printable", i);
        if (!s_get_name(&p, r->where, TP_STATS_WHERE_MAX))
            return s_bad(snap, "addresses not terminated or not printable", i);
        if (!s_finite_nonneg(r->busy_s) || !s_finite_nonneg(r->starved_s) ||
            !s_finite_nonneg(r->blocked_s) || !s_finite_nonneg(r->alive_s))
            return s_bad(snap, "time counters not finite and >= 0", i);
        if (!s_finite_nonneg(r->msgs_per_s) || !s_finite_nonneg(r->mb_per_s))
            return s_bad(snap, "rates not finite and >= 0", i);
        if (!isfinite(r->queue_fill) ||
            !(r->queue_fill == -1.0 || (r->queue_fill >= 0 && r->queue_fill <= 1.0)))
            return s_bad(snap, "queue fill not in [0, 1] and not -1", i);
        if (!s_pct_ok(f[0]) || !s_pct_ok(f[1]) || !s_pct_ok(f[2]))
            return s_bad(snap, "percentages not in [0, 100]", i);
        r->busy_pct = f[0];
        r->starved_pct = f[1];
        r->blocked_pct = f[2];
    }
    return TP_OK;
}

/* ---- rates, bottleneck, JSON ---------------------------------------------- */

/* The endpoints of a row's `where` marked `mark` ('>' reached, '@' bound),
 * as a JSON array of strings (empty for rows that are no remote sender). */
static json_t *s_where_array(const char *where, char mark) {
    json_t *a = json_array();
    for (const char *p = where; a && *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t len = strcspn(p, ",");
        while (len && p[len - 1] == ' ')
            len--;
        if (len > 1 && *p == mark)
            json_array_append_new(a, json_stringn(p + 1, len - 1));
        p += len;
        while (*p && *p != ',')
            p++;
    }
    return a;
}

static double s_pct(double part, double whole) {
    if (whole <= 0)
        return 0;
    double v = 100.0 * part / whole;
    return v < 0 ? 0 : v > 100 ? 100 : v;
}

void tp_stats_row_rates(tp_stats_row_t *row, const tp_stats_row_t *prev,
                        double dt) {
    tp_stats_row_t zero;
    memset(&zero, 0, sizeof zero);
    /* A restarted actor's counters start again from zero. */
    if (!prev || prev->msgs_in > row->msgs_in || prev->msgs_out > row->msgs_out ||
        prev->alive_s > row->alive_s)
        prev = &zero;
    if (dt <= 0)
        dt = row->alive_s - prev->alive_s;
    if (dt <= 1e-9) {
        row->msgs_per_s = row->mb_per_s = 0;
        row->busy_pct = row->starved_pct = row->blocked_pct = 0;
        return;
    }
    double min = (double)(row->msgs_in - prev->msgs_in);
    double mout = (double)(row->msgs_out - prev->msgs_out);
    double bin = (double)(row->bytes_in - prev->bytes_in);
    double bout = (double)(row->bytes_out - prev->bytes_out);
    row->msgs_per_s = (min > mout ? min : mout) / dt;
    row->mb_per_s = (bin > bout ? bin : bout) / dt / 1e6;
    double span = row->alive_s - prev->alive_s;
    if (span <= 0)
        span = dt;
    row->busy_pct = s_pct(row->busy_s - prev->busy_s, span);
    row->starved_pct = s_pct(row->starved_s - prev->starved_s, span);
    row->blocked_pct = s_pct(row->blocked_s - prev->blocked_s, span);
}

int tp_stats_bottleneck(const tp_stats_snapshot_t *snap) {
    int best = -1;
    double best_busy = -1;
    for (int i = 0; i < snap->nrows; i++) {
        const tp_stats_row_t *r = &snap->rows[i];
        if (r->state != TP_ACTOR_RUNNING && r->state != TP_ACTOR_STOPPING)
            continue;
        if (r->starved_pct >= 50 || r->blocked_pct >= 50)
            continue;
        /* an actor that did nothing limits nothing (a row that counts no
         * time of its own, e.g. a receiver on the trainer's thread) */
        if (r->busy_pct < 1)
            continue;
        if (r->busy_pct > best_busy) {
            best_busy = r->busy_pct;
            best = i;
        }
    }
    if (best >= 0)
        return best;
    /* Nothing works: every running row waits. The data then stop where the
     * flow first starves: the first running row (a snapshot lists them
     * upstream first) that is mostly starved, e.g. a receiver whose
     * senders are all gone, rather than no mark at all. */
    for (int i = 0; i < snap->nrows; i++) {
        const tp_stats_row_t *r = &snap->rows[i];
        if ((r->state == TP_ACTOR_RUNNING || r->state == TP_ACTOR_STOPPING) &&
            r->starved_pct >= 50)
            return i;
    }
    return -1;
}

char *tp_stats_to_json(const tp_stats_snapshot_t *snap) {
    json_t *root = json_object();
    json_t *actors = json_array();
    if (!root || !actors) {
        json_decref(root);
        json_decref(actors);
        return NULL;
    }
    int bn = tp_stats_bottleneck(snap);
    json_object_set_new(root, "source", json_string(snap->source));
    json_object_set_new(root, "pid", json_integer(snap->pid));
    json_object_set_new(root, "seq", json_integer((json_int_t)snap->seq));
    json_object_set_new(root, "time", json_real(snap->wall_s));
    json_object_set_new(root, "interval_s", json_real(snap->interval_s));
    json_object_set_new(root, "bottleneck",
                        bn >= 0 ? json_string(snap->rows[bn].name) : json_null());
    for (int i = 0; i < snap->nrows; i++) {
        const tp_stats_row_t *r = &snap->rows[i];
        json_t *a = json_object();
        if (!a)
            break;
        json_object_set_new(a, "name", json_string(r->name));
        json_object_set_new(a, "state", json_string(tp_actor_state_name(r->state)));
        json_object_set_new(a, "restarts", json_integer(r->restarts));
        /* every row says its process: the publisher's unless it is another */
        json_object_set_new(a, "pid", json_integer(r->pid ? r->pid : snap->pid));
        json_object_set_new(a, "host", json_string(r->host));
        /* a remote sender's own addresses: which of the receiver's
         * endpoints it connected to, or where it bound */
        json_object_set_new(a, "reached", s_where_array(r->where, '>'));
        json_object_set_new(a, "bound", s_where_array(r->where, '@'));
        json_object_set_new(a, "msgs_per_s", json_real(r->msgs_per_s));
        json_object_set_new(a, "mb_per_s", json_real(r->mb_per_s));
        json_object_set_new(a, "queue_fill", json_real(r->queue_fill));
        json_object_set_new(a, "busy_pct", json_real(r->busy_pct));
        json_object_set_new(a, "starved_pct", json_real(r->starved_pct));
        json_object_set_new(a, "blocked_pct", json_real(r->blocked_pct));
        json_object_set_new(a, "msgs_in", json_integer((json_int_t)r->msgs_in));
        json_object_set_new(a, "msgs_out", json_integer((json_int_t)r->msgs_out));
        json_object_set_new(a, "bytes_in", json_integer((json_int_t)r->bytes_in));
        json_object_set_new(a, "bytes_out", json_integer((json_int_t)r->bytes_out));
        json_object_set_new(a, "bottleneck", json_boolean(i == bn));
        json_array_append_new(actors, a);
    }
    json_object_set_new(root, "actors", actors);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return text;
}

void tp_stats_hostname(char *out, size_t size) {
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) < 0 || !h[0])
        snprintf(h, sizeof h, "localhost");
    h[sizeof h - 1] = '\0';
    size_t k = 0;
    for (size_t i = 0; h[i] && k + 1 < size; i++)  /* printable, as decoders check */
        if ((unsigned char)h[i] >= 0x20 && (unsigned char)h[i] <= 0x7e)
            out[k++] = h[i];
    if (size)
        out[k] = '\0';
}

/* ---- endpoint ---------------------------------------------------------------- */

tp_status_t tp_stats_endpoint_resolve(const char *request, const char *run_dir,
                                      char *out, size_t size) {
    int n;
    if (!request || !*request || !strcmp(request, "ipc")) {
        if (!run_dir || !*run_dir)
            return tp_error(TP_ERR_INVALID,
                            "stats endpoint: an ipc endpoint needs a run directory");
        n = snprintf(out, size, "ipc://%s/stats.sock", run_dir);
    } else if (!strcmp(request, "tcp")) {
        n = snprintf(out, size, "tcp://127.0.0.1:*");
    } else if (!strncmp(request, "tcp:", 4) && request[4] != '/') {
        char *end;
        long port = strtol(request + 4, &end, 10);
        if (*end || port <= 0 || port > 65535)
            return tp_error(TP_ERR_INVALID,
                            "stats endpoint '%s': port is not 1..65535", request);
        n = snprintf(out, size, "tcp://127.0.0.1:%ld", port);
    } else if (!strncmp(request, "ipc://", 6) || !strncmp(request, "tcp://", 6) ||
               !strncmp(request, "inproc://", 9)) {
        n = snprintf(out, size, "%s", request);
    } else {
        return tp_error(TP_ERR_INVALID,
                        "stats endpoint '%s': expected ipc, tcp, tcp:PORT or a "
                        "full ipc://, tcp:// or inproc:// address", request);
    }
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "stats endpoint for '%s' is too long",
                        request ? request : "ipc");
    /* A Unix socket path holds at most 107 bytes. */
    if (!strncmp(out, "ipc://", 6) && strlen(out + 6) > 107)
        return tp_error(TP_ERR_INVALID,
                        "stats endpoint %s: ipc path longer than 107 bytes", out);
    return TP_OK;
}

tp_status_t tp_stats_curve_apply(void *zsock_raw);  /* curve.c */

/* ---- publisher --------------------------------------------------------------- */

struct tp_stats_pub {
    zsock_t *sock;
    char endpoint[256];
    char source[TP_STATS_SOURCE_MAX];
    uint64_t seq;
    uint64_t last_ns;
    tp_stats_row_t *prev;  /* previous publish, by position then name */
    int nprev;
    char host[TP_STATS_HOST_MAX];  /* gethostname, for rows that give none */
};

tp_stats_pub_t *tp_stats_pub_new(const char *endpoint, const char *source) {
    tp_actors_init();
    tp_stats_pub_t *self = calloc(1, sizeof *self);
    if (!self) {
        tp_error(TP_ERR_NOMEM, "stats publisher");
        return NULL;
    }
    self->sock = zsock_new(ZMQ_PUB);
    if (!self->sock) {
        free(self);
        tp_error(TP_ERR_IO, "stats publisher: cannot make a PUB socket");
        return NULL;
    }
    zsock_set_sndhwm(self->sock, 16);
    zsock_set_linger(self->sock, 0);
    /* The bind rules and, on tcp, CURVE when tp_stats_set_curve asked. */
    char ep[256];
    if (tp_bind_endpoint(endpoint, tp_bind_public(), ep, sizeof ep) < 0 ||
        (!strncmp(ep, "tcp://", 6) && tp_stats_curve_apply(zsock_resolve(self->sock)) < 0)) {
        tp_error_wrap(TP_ERR_INVALID, "stats publisher");
        zsock_destroy(&self->sock);
        free(self);
        return NULL;
    }
    if (zsock_bind(self->sock, "%s", ep) < 0) {
        int err = zmq_errno();
        tp_error(TP_ERR_IO, "stats publisher: bind %s: %s%s", endpoint, zmq_strerror(err),
                 tp_bind_why(ep, err));
        zsock_destroy(&self->sock);
        free(self);
        return NULL;
    }
    tp_ipc_restrict(ep);
    char *last = zsock_last_endpoint(self->sock);  /* ours to free */
    snprintf(self->endpoint, sizeof self->endpoint, "%s",
             last && *last ? last : endpoint);
    zstr_free(&last);
    /* a stop cut short by the deadline (_exit) unlinks it too */
    if (!strncmp(self->endpoint, "ipc://", 6))
        tp_unlink_at_exit_add(self->endpoint + 6);
    snprintf(self->source, sizeof self->source, "%s", source ? source : "");
    tp_stats_hostname(self->host, sizeof self->host);
    self->last_ns = tp_now_ns();
    return self;
}

void tp_stats_pub_destroy(tp_stats_pub_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_stats_pub_t *self = *self_p;
    zsock_destroy(&self->sock);
    /* libzmq 4.3 leaves a named ipc socket's file behind. */
    if (!strncmp(self->endpoint, "ipc://", 6)) {
        unlink(self->endpoint + 6);
        tp_unlink_at_exit_drop(self->endpoint + 6);
    }
    free(self->prev);
    free(self);
    *self_p = NULL;
}

const char *tp_stats_pub_endpoint(const tp_stats_pub_t *self) {
    return self->endpoint;
}

double tp_stats_pub_since(const tp_stats_pub_t *self) {
    return (double)(tp_now_ns() - self->last_ns) * 1e-9;
}

static const tp_stats_row_t *s_find_prev(tp_stats_pub_t *self, int i,
                                         const char *name) {
    if (i < self->nprev && !strcmp(self->prev[i].name, name))
        return &self->prev[i];
    for (int j = 0; j < self->nprev; j++)
        if (!strcmp(self->prev[j].name, name))
            return &self->prev[j];
    return NULL;
}

tp_status_t tp_stats_pub_publish(tp_stats_pub_t *self, tp_stats_row_t *rows,
                                 int nrows) {
    uint64_t now = tp_now_ns();
    double dt = (double)(now - self->last_ns) * 1e-9;
    for (int i = 0; i < nrows; i++) {
        rows[i].name[TP_STATS_NAME_MAX - 1] = '\0';
        rows[i].host[TP_STATS_HOST_MAX - 1] = '\0';
        rows[i].where[TP_STATS_WHERE_MAX - 1] = '\0';
        if (!rows[i].host[0])  /* an actor of this process's host */
            memcpy(rows[i].host, self->host, sizeof self->host);
        tp_stats_row_rates(&rows[i], s_find_prev(self, i, rows[i].name), 0);
        (void)dt;
    }
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    memcpy(snap.source, self->source, sizeof snap.source);
    snap.pid = (uint32_t)getpid();
    snap.seq = self->seq++;
    snap.wall_s = tp_wall_s();
    snap.interval_s = dt;
    snap.nrows = nrows;
    snap.rows = rows;
    void *buf;
    size_t size;
    tp_status_t rc = tp_stats_encode(&snap, &buf, &size);
    if (rc < 0)
        return rc;
    /* DONTWAIT: PUB never blocks anyway, but say so. */
    zmq_send(zsock_resolve(self->sock), buf, size, ZMQ_DONTWAIT);
    free(buf);
    if (nrows > self->nprev) {
        tp_stats_row_t *p = realloc(self->prev, (size_t)nrows * sizeof *p);
        if (!p)
            return tp_error(TP_ERR_NOMEM, "stats publisher");
        self->prev = p;
    }
    if (nrows)
        memcpy(self->prev, rows, (size_t)nrows * sizeof *rows);
    self->nprev = nrows;
    self->last_ns = now;
    return TP_OK;
}
