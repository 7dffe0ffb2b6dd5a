/* towerpack core: the job handshake of remote senders and receivers, and
 * the components a receiver takes (X-Tp-Comps, read in the same probe).
 *
 * The job id rides in the ZMTP handshake as a socket property
 * (ZMQ_METADATA "X-Tp-Job:ID"): libzmq sends it on every connection, and
 * the receiving side reads it on each message (zmq_msg_gets). The other
 * direction has no API: a PUSH socket never receives, so it never sees the
 * receiver's properties. tp_wire_probe_job reads them itself, with the
 * smallest ZMTP 3.0 client that libzmq accepts (RFC 23: greeting, NULL
 * mechanism, READY; or RFC 26's CurveZMQ handshake, HELLO, WELCOME,
 * INITIATE, READY, with the run's client keys), on a connection of its own
 * that it closes at once. */
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <sodium.h>
#include <zmq.h>
#include <towerpack/clock.h>
#include <towerpack/wire.h>

/* A draft option in libzmq 4.3's header, built into Debian's library. */
#ifndef ZMQ_METADATA
#define ZMQ_METADATA 95
#endif

int tp_wire_job_ok(const char *job) {
    if (!job || !*job)
        return 0;
    size_t n = strlen(job);
    if (n >= TP_WIRE_JOB_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)job[i] < 0x21 || (unsigned char)job[i] > 0x7e || job[i] == ':')
            return 0;
    return 1;
}

tp_status_t tp_wire_set_job(void *socket, const char *job) {
    if (!tp_wire_job_ok(job))
        return tp_error(TP_ERR_INVALID, "job id '%s': 1 to %d printable characters, no "
                        "space or ':'", job ? job : "(null)", TP_WIRE_JOB_MAX - 1);
    char prop[TP_WIRE_JOB_MAX + 16];
    snprintf(prop, sizeof prop, "%s:%s", TP_WIRE_JOB_PROPERTY, job);
    if (zmq_setsockopt(socket, ZMQ_METADATA, prop, strlen(prop)) != 0)
        return tp_error(TP_ERR_UNSUPPORTED, "job id: this libzmq cannot send socket "
                        "properties (ZMQ_METADATA): %s", zmq_strerror(zmq_errno()));
    return TP_OK;
}

/* ---- the probe ------------------------------------------------------------- */

/* Milliseconds left until deadline_ns (at least 0). */
static int s_left_ms(uint64_t deadline_ns) {
    uint64_t now = tp_now_ns();
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now) / 1000000ull);
}

/* Wait for `events` on fd; 0 when ready, TP_ERR_TIMEOUT otherwise. */
static tp_status_t s_wait(int fd, short events, uint64_t deadline_ns, const char *ep) {
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, s_left_ms(deadline_ns));
        if (r > 0)
            return TP_OK;
        if (r < 0 && errno == EINTR && s_left_ms(deadline_ns) > 0)
            continue;
        return tp_error(TP_ERR_TIMEOUT, "job probe of %s: no answer in time", ep);
    }
}

static tp_status_t s_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns,
                               const char *ep) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return tp_error(TP_ERR_IO, "job probe of %s: send: %s", ep, strerror(errno));
        TP_TRY(s_wait(fd, POLLOUT, deadline_ns, ep));
    }
    return TP_OK;
}

static tp_status_t s_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns,
                              const char *ep) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return tp_error(TP_ERR_PROTOCOL, "job probe of %s: the receiver closed the "
                            "connection in the handshake", ep);
        if (errno != EAGAIN && errno != EINTR)
            return tp_error(TP_ERR_IO, "job probe of %s: recv: %s", ep, strerror(errno));
        TP_TRY(s_wait(fd, POLLIN, deadline_ns, ep));
    }
    return TP_OK;
}

int tp_wire_tcp_host(const char *ep, char *host, size_t size, const char **port) {
    if (strncmp(ep, "tcp://", 6))
        return -1;
    const char *hp = ep + 6, *colon = strrchr(hp, ':');
    if (!colon || strchr(hp, ';') || (size_t)(colon - hp) >= size)
        return -1;
    size_t hl = (size_t)(colon - hp);
    if (hl >= 2 && hp[0] == '[' && hp[hl - 1] == ']') {
        hp++;
        hl -= 2;
    }
    memcpy(host, hp, hl);
    host[hl] = '\0';
    *port = colon + 1;
    return 0;
}

/* A non-blocking socket connected to ep's address (tcp: `addr` when
 * given, the name not looked up), or a negative status. */
static int s_connect(const char *ep, const struct sockaddr *addr, size_t addrlen,
                     uint64_t deadline_ns, tp_status_t *st) {
    int fd = -1;
    if (!strncmp(ep, "ipc://", 6)) {
        struct sockaddr_un a;
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        const char *path = ep + 6;
        size_t n = strlen(path);
        if (n == 0 || n >= sizeof a.sun_path) {
            *st = tp_error(TP_ERR_INVALID, "job probe: ipc path of %s too long", ep);
            return -1;
        }
        memcpy(a.sun_path, path, n);
        if (path[0] == '@')  /* libzmq's abstract namespace */
            a.sun_path[0] = '\0';
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a,
                               (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0 &&
            errno != EINPROGRESS && errno != EAGAIN) {
            *st = tp_error(TP_ERR_IO, "job probe: connect %s: %s", ep, strerror(errno));
            close(fd);
            return -1;
        }
    } else if (addr) {
        fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, addr, (socklen_t)addrlen) < 0 && errno != EINPROGRESS) {
            *st = tp_error(TP_ERR_IO, "job probe: connect %s: %s", ep, strerror(errno));
            close(fd);
            return -1;
        }
    } else {
        /* tcp://HOST:PORT, HOST possibly [v6]; no interface or source part */
        char host[256];
        const char *port;
        if (tp_wire_tcp_host(ep, host, sizeof host, &port) < 0) {
            *st = tp_error(TP_ERR_UNSUPPORTED, "job probe: endpoint %s", ep);
            return -1;
        }
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        int g = getaddrinfo(host, port, &hints, &res);
        if (g != 0 || !res) {
            *st = tp_error(TP_ERR_IO, "job probe: %s: %s", ep, gai_strerror(g));
            return -1;
        }
        fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) < 0 &&
            errno != EINPROGRESS) {
            *st = tp_error(TP_ERR_IO, "job probe: connect %s: %s", ep, strerror(errno));
            close(fd);
            freeaddrinfo(res);
            return -1;
        }
        freeaddrinfo(res);
    }
    if (fd < 0) {
        *st = tp_error(TP_ERR_IO, "job probe: socket: %s", strerror(errno));
        return -1;
    }
    if ((*st = s_wait(fd, POLLOUT, deadline_ns, ep)) < 0) {
        close(fd);
        return -1;
    }
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err) {
        *st = tp_error(TP_ERR_IO, "job probe: connect %s: %s", ep, strerror(err));
        close(fd);
        return -1;
    }
    return fd;
}

/* The value of property `name` in a READY command's property list, or
 * -1 when absent, -2 when the list is malformed. */
static int s_find_property(const uint8_t *p, size_t n, const char *name, char *out,
                           size_t size) {
    size_t want = strlen(name);
    while (n > 0) {
        size_t nl = p[0];
        if (n < 1 + nl + 4)
            return -2;
        const uint8_t *v = p + 1 + nl;
        size_t vl = (size_t)v[0] << 24 | (size_t)v[1] << 16 | (size_t)v[2] << 8 | v[3];
        if (n - 1 - nl - 4 < vl)
            return -2;
        if (nl == want && !strncasecmp((const char *)p + 1, name, nl)) {
            if (vl >= size)
                return -2;
            memcpy(out, v + 4, vl);
            out[vl] = '\0';
            return 0;
        }
        p += 1 + nl + 4 + vl;
        n -= 1 + nl + 4 + vl;
    }
    return -1;
}

/* Send one command frame (short or long). */
static tp_status_t s_send_command(int fd, const uint8_t *body, size_t len, uint64_t deadline,
                                  const char *ep) {
    uint8_t hdr[9];
    size_t hl;
    if (len < 256) {
        hdr[0] = 0x04;
        hdr[1] = (uint8_t)len;
        hl = 2;
    } else {
        hdr[0] = 0x06;
        for (int k = 0; k < 8; k++)
            hdr[1 + k] = (uint8_t)((uint64_t)len >> (56 - 8 * k));
        hl = 9;
    }
    TP_TRY(s_write_all(fd, hdr, hl, deadline, ep));
    return s_write_all(fd, body, len, deadline, ep);
}

/* Read one command frame into body (at most size bytes); its length in *len.
 * Frames that are not commands are skipped. */
static tp_status_t s_read_command(int fd, uint8_t *body, size_t size, size_t *len,
                                  uint64_t deadline, const char *ep) {
    for (int frames = 0; frames < 4; frames++) {
        uint8_t hdr[9];
        TP_TRY(s_read_all(fd, hdr, 2, deadline, ep));
        uint64_t n = hdr[1];
        if (hdr[0] & 0x02) {  /* a long frame: 8 bytes of size */
            TP_TRY(s_read_all(fd, hdr + 2, 7, deadline, ep));
            n = 0;
            for (int k = 1; k < 9; k++)
                n = n << 8 | hdr[k];
        }
        if (n > size)
            return tp_error(TP_ERR_PROTOCOL, "job probe: %s sent a %llu-byte frame in the "
                            "handshake", ep, (unsigned long long)n);
        TP_TRY(s_read_all(fd, body, (size_t)n, deadline, ep));
        if (!(hdr[0] & 0x04) || n < 1 || body[0] + 1u > n)
            continue;  /* not a command */
        if (body[0] == 5 && !memcmp(body + 1, "ERROR", 5))
            return tp_error(TP_ERR_PEER, "job probe: the receiver at %s refused the "
                            "handshake", ep);
        *len = (size_t)n;
        return TP_OK;
    }
    return tp_error(TP_ERR_PROTOCOL, "job probe: no command from %s", ep);
}

/* The job id and the components in a READY command's properties (p, n
 * bytes) into peer. */
static tp_status_t s_ready_props(const uint8_t *p, size_t n, tp_wire_peer_t *peer,
                                 const char *ep) {
    int f = s_find_property(p, n, TP_WIRE_JOB_PROPERTY, peer->job, sizeof peer->job);
    if (f == -2)
        return tp_error(TP_ERR_PROTOCOL, "job probe: %s sent a malformed READY", ep);
    if (f == 0 && !tp_wire_job_ok(peer->job))
        return tp_error(TP_ERR_PROTOCOL, "job probe: %s gave a malformed job id", ep);
    if (f == -1)
        peer->job[0] = '\0';
    tp_wire_comp_t c[TP_WIRE_COMPS_N];
    f = s_find_property(p, n, TP_WIRE_COMPS_PROPERTY, peer->comps, sizeof peer->comps);
    if (f == -2 || (f == 0 && tp_wire_comps_parse(peer->comps, c, TP_WIRE_COMPS_N) < 0))
        return tp_error(TP_ERR_PROTOCOL, "job probe: %s gave malformed components", ep);
    if (f == -1)
        peer->comps[0] = '\0';
    return TP_OK;
}

static void s_put_u64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (56 - 8 * k));
}

/* RFC 26 as libzmq's curve_client speaks it, after the greetings: HELLO,
 * WELCOME, INITIATE (with the client's long-term key, vouched, and the
 * socket type), READY (the receiver's properties). */
static tp_status_t s_curve(int fd, const uint8_t pub[32], const uint8_t sec[32],
                           const uint8_t server[32], uint64_t deadline, const char *ep,
                           tp_wire_peer_t *peer) {
    uint8_t cn_pub[32], cn_sec[32];
    crypto_box_keypair(cn_pub, cn_sec);
    tp_status_t st = TP_OK;
    /* HELLO: version 1.0, 72 bytes of padding, C', nonce 1, Box[64 zeros](C'->S) */
    /* READY's properties may hold the components' text (about 1 KiB) */
    uint8_t nonce[24], plain[32 + 2048], box[32 + 2048], msg[2048 + 64];
    memcpy(nonce, "CurveZMQHELLO---", 16);
    s_put_u64(nonce + 16, 1);
    memset(plain, 0, 32 + 64);
    if (crypto_box(box, plain, 32 + 64, nonce, server, cn_sec) != 0)
        return tp_error(TP_ERR_STATE, "job probe: crypto_box");
    memcpy(msg, "\x05HELLO\x01\x00", 8);
    memset(msg + 8, 0, 72);
    memcpy(msg + 80, cn_pub, 32);
    memcpy(msg + 112, nonce + 16, 8);
    memcpy(msg + 120, box + 16, 80);
    TP_TRY(s_send_command(fd, msg, 200, deadline, ep));
    /* WELCOME: 16-byte nonce, Box[S' + cookie](S->C') */
    size_t len = 0;
    TP_TRY(s_read_command(fd, msg, sizeof msg, &len, deadline, ep));
    if (len != 168 || memcmp(msg, "\x07WELCOME", 8))
        return tp_error(TP_ERR_PROTOCOL, "job probe: no WELCOME from %s", ep);
    memcpy(nonce, "WELCOME-", 8);
    memcpy(nonce + 8, msg + 8, 16);
    memset(box, 0, 16);
    memcpy(box + 16, msg + 24, 144);
    if (crypto_box_open(plain, box, 160, nonce, server, cn_sec) != 0)
        return tp_error(TP_ERR_PEER, "job probe: the CURVE WELCOME of %s does not open "
                        "with this run's server key", ep);
    uint8_t cn_server[32], cookie[96];
    memcpy(cn_server, plain + 32, 32);
    memcpy(cookie, plain + 64, 96);
    /* the vouch: Box[C' + S](C->S'), a random nonce */
    uint8_t vnonce[24], vplain[32 + 64], vbox[32 + 64];
    memcpy(vnonce, "VOUCH---", 8);
    randombytes_buf(vnonce + 8, 16);
    memset(vplain, 0, 32);
    memcpy(vplain + 32, cn_pub, 32);
    memcpy(vplain + 64, server, 32);
    if (crypto_box(vbox, vplain, sizeof vplain, vnonce, cn_server, sec) != 0)
        return tp_error(TP_ERR_STATE, "job probe: crypto_box");
    /* INITIATE: cookie, nonce 2, Box[C + vouch + properties](C'->S') */
    static const char props[] = "\x0bSocket-Type\x00\x00\x00\x04PUSH";
    size_t plen = sizeof props - 1, ilen = 32 + 32 + 16 + 80 + plen;
    memset(plain, 0, 32);
    memcpy(plain + 32, pub, 32);
    memcpy(plain + 64, vnonce + 8, 16);
    memcpy(plain + 80, vbox + 16, 80);
    memcpy(plain + 160, props, plen);
    memcpy(nonce, "CurveZMQINITIATE", 16);
    s_put_u64(nonce + 16, 2);
    if (crypto_box(box, plain, ilen, nonce, cn_server, cn_sec) != 0)
        return tp_error(TP_ERR_STATE, "job probe: crypto_box");
    memcpy(msg, "\x08INITIATE", 9);
    memcpy(msg + 9, cookie, 96);
    memcpy(msg + 105, nonce + 16, 8);
    memcpy(msg + 113, box + 16, ilen - 16);
    TP_TRY(s_send_command(fd, msg, 113 + ilen - 16, deadline, ep));
    /* READY: nonce, Box[properties](S'->C') */
    TP_TRY(s_read_command(fd, msg, sizeof msg, &len, deadline, ep));
    if (len < 14 + 16 || len - 14 > sizeof box - 16 || memcmp(msg, "\x05READY", 6))
        return tp_error(TP_ERR_PROTOCOL, "job probe: no CURVE READY from %s", ep);
    memcpy(nonce, "CurveZMQREADY---", 16);
    memcpy(nonce + 16, msg + 6, 8);
    memset(box, 0, 16);
    memcpy(box + 16, msg + 14, len - 14);
    if (crypto_box_open(plain, box, 16 + len - 14, nonce, cn_server, cn_sec) != 0)
        return tp_error(TP_ERR_PROTOCOL, "job probe: the CURVE READY of %s does not open", ep);
    st = s_ready_props(plain + 32, 16 + len - 14 - 32, peer, ep);
    sodium_memzero(cn_sec, sizeof cn_sec);
    return st;
}

static tp_status_t s_probe(const char *endpoint, const struct sockaddr *addr, size_t addrlen,
                           int timeout_ms, const uint8_t *keys, tp_wire_peer_t *peer) {
    peer->job[0] = peer->comps[0] = '\0';
    if (!endpoint || (strncmp(endpoint, "tcp://", 6) && strncmp(endpoint, "ipc://", 6)))
        return tp_error(TP_ERR_UNSUPPORTED, "job probe: endpoint %s is not tcp:// or "
                        "ipc://", endpoint ? endpoint : "(null)");
    if (addr && (strncmp(endpoint, "tcp://", 6) ||
                 (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)))
        return tp_error(TP_ERR_INVALID, "job probe: an address for %s must be an IPv4 or "
                        "IPv6 one of a tcp:// endpoint", endpoint);
    if (keys && sodium_init() < 0)
        return tp_error(TP_ERR_UNSUPPORTED, "job probe: libsodium does not start");
    uint64_t deadline = tp_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    tp_status_t st = TP_OK;
    int fd = s_connect(endpoint, addr, addrlen, deadline, &st);
    if (fd < 0)
        return st;
    /* greeting: signature, version 3.0, the mechanism, as-server 0, filler */
    const char *mech = keys ? "CURVE" : "NULL";
    uint8_t g[64];
    memset(g, 0, sizeof g);
    g[0] = 0xff;
    g[8] = 1;
    g[9] = 0x7f;
    g[10] = 3;
    memcpy(g + 12, mech, strlen(mech));
    uint8_t greet[64];
    if ((st = s_write_all(fd, g, sizeof g, deadline, endpoint)) < 0 ||
        (st = s_read_all(fd, greet, sizeof greet, deadline, endpoint)) < 0)
        goto out;
    if (greet[0] != 0xff || greet[9] != 0x7f || greet[10] < 3) {
        st = tp_error(TP_ERR_PROTOCOL, "job probe: %s does not speak ZMTP 3", endpoint);
        goto out;
    }
    if (memcmp(greet + 12, mech, strlen(mech) + 1) != 0) {
        char theirs[21];
        memcpy(theirs, greet + 12, 20);
        theirs[20] = '\0';
        st = tp_error(TP_ERR_UNSUPPORTED, "job probe: the receiver at %s uses %s", endpoint,
                      theirs);
        goto out;
    }
    if (keys) {
        st = s_curve(fd, keys, keys + 32, keys + 64, deadline, endpoint, peer);
        goto out;
    }
    /* NULL: READY with the one property libzmq checks, the socket type */
    static const char ready[] = "\x05READY\x0bSocket-Type\x00\x00\x00\x04PUSH";
    uint8_t body[8192];
    size_t len = 0;
    if ((st = s_send_command(fd, (const uint8_t *)ready, sizeof ready - 1, deadline,
                             endpoint)) < 0)
        goto out;
    for (int i = 0; i < 4; i++) {
        if ((st = s_read_command(fd, body, sizeof body, &len, deadline, endpoint)) < 0)
            goto out;
        if (body[0] == 5 && !memcmp(body + 1, "READY", 5)) {
            st = s_ready_props(body + 6, len - 6, peer, endpoint);
            goto out;
        }
    }
    st = tp_error(TP_ERR_PROTOCOL, "job probe: no READY from %s", endpoint);
out:
    close(fd);
    if (st < 0)
        peer->job[0] = peer->comps[0] = '\0';
    return st;
}

tp_status_t tp_wire_probe_peer(const char *endpoint, int timeout_ms, const uint8_t *keys,
                               tp_wire_peer_t *peer) {
    return s_probe(endpoint, NULL, 0, timeout_ms, keys, peer);
}

tp_status_t tp_wire_probe_peer_at(const char *endpoint, const struct sockaddr *addr,
                                  size_t addrlen, int timeout_ms, const uint8_t *keys,
                                  tp_wire_peer_t *peer) {
    return s_probe(endpoint, addr, addrlen, timeout_ms, keys, peer);
}

static tp_status_t s_probe_job(const char *endpoint, int timeout_ms, const uint8_t *keys,
                               char *job, size_t size) {
    tp_wire_peer_t peer;
    tp_status_t st = s_probe(endpoint, NULL, 0, timeout_ms, keys, &peer);
    if (size)
        snprintf(job, size, "%s", peer.job);
    return st;
}

tp_status_t tp_wire_probe_job(const char *endpoint, int timeout_ms, char *job,
                              size_t size) {
    return s_probe_job(endpoint, timeout_ms, NULL, job, size);
}

tp_status_t tp_wire_probe_job_curve(const char *endpoint, int timeout_ms,
                                    const uint8_t keys[96], char *job, size_t size) {
    return s_probe_job(endpoint, timeout_ms, keys, job, size);
}

/* ---- the components ---------------------------------------------------------- */

static int s_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
}

/* "dtype[d0,d1,...]" of a component ('*' for any size) into out. */
static void s_comp_shape(const tp_wire_comp_t *c, char *out, size_t size) {
    size_t o = 0;
    int n = snprintf(out, size, "%s[", tp_dtype_name(c->dtype));
    o = n > 0 && (size_t)n < size ? (size_t)n : size - 1;
    for (int k = 0; k < c->ndim && o < size - 1; k++) {
        n = c->shape[k] < 0 ? snprintf(out + o, size - o, "%s*", k ? "," : "")
                            : snprintf(out + o, size - o, "%s%lld", k ? "," : "",
                                       (long long)c->shape[k]);
        o = n > 0 && o + (size_t)n < size ? o + (size_t)n : size - 1;
    }
    if (o < size - 1) {
        n = snprintf(out + o, size - o, "]");
        o = n > 0 && o + (size_t)n < size ? o + (size_t)n : size - 1;
    }
    if (c->ranged && o < size - 1)
        snprintf(out + o, size - o, "{%lld..%lld}", (long long)c->lo, (long long)c->hi);
}

/* A decimal integer at *p ('-' allowed), advancing *p: 0, or -1 when
 * there is none or it overflows. */
static int s_parse_i64(const char **p, int64_t *out) {
    const char *q = *p;
    int neg = *q == '-';
    q += neg;
    if (*q < '0' || *q > '9')
        return -1;
    int64_t v = 0;
    for (; *q >= '0' && *q <= '9'; q++) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*q - '0');
    }
    *out = neg ? -v : v;
    *p = q;
    return 0;
}

static int s_int_dtype(tp_dtype_t d) {
    return d == TP_UINT8 || d == TP_INT32 || d == TP_INT64;
}

int tp_wire_comps_format(const tp_wire_comp_t *comps, int n, char *out, size_t size) {
    if (!size || n < 0 || n > TP_WIRE_COMPS_N)
        return -1;
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        char name[sizeof comps[i].name], shape[160];
        size_t k = 0;
        for (; k < sizeof name - 1 && comps[i].name[k]; k++)
            name[k] = s_name_char((unsigned char)comps[i].name[k]) ? comps[i].name[k] : '_';
        name[k] = '\0';
        s_comp_shape(&comps[i], shape, sizeof shape);
        int w = snprintf(out + o, size - o, "%s%s:%s", i ? ";" : "", name, shape);
        if (w < 0 || o + (size_t)w >= size) {
            out[0] = '\0';
            return -1;
        }
        o += (size_t)w;
    }
    return (int)o;
}

int tp_wire_comps_parse(const char *text, tp_wire_comp_t *comps, int max) {
    if (!text)
        return -1;
    int n = 0;
    const char *p = text;
    while (*p) {
        if (n == max || n == TP_WIRE_COMPS_N)
            return -1;
        tp_wire_comp_t *c = &comps[n];
        memset(c, 0, sizeof *c);
        size_t k = 0;
        for (; s_name_char((unsigned char)*p); p++) {
            if (k == sizeof c->name - 1)
                return -1;
            c->name[k++] = *p;
        }
        if (*p++ != ':')
            return -1;
        char dt[16];
        k = 0;
        while (*p && *p != '[') {
            if (k == sizeof dt - 1)
                return -1;
            dt[k++] = *p++;
        }
        dt[k] = '\0';
        if (*p++ != '[' || tp_dtype_parse(dt, &c->dtype) != TP_OK)
            return -1;
        while (*p != ']') {
            if (c->ndim == TP_MAX_DIMS)
                return -1;
            if (c->ndim && *p++ != ',')
                return -1;
            if (*p == '*') {
                c->shape[c->ndim++] = -1;
                p++;
                continue;
            }
            if (*p < '0' || *p > '9')
                return -1;
            int64_t v = 0;
            for (; *p >= '0' && *p <= '9'; p++) {
                if (v > (INT64_MAX - 9) / 10)
                    return -1;
                v = v * 10 + (*p - '0');
            }
            c->shape[c->ndim++] = v;
        }
        p++;
        if (*p == '{') {  /* the values an integer component takes */
            p++;
            if (!s_int_dtype(c->dtype) || s_parse_i64(&p, &c->lo) < 0 || *p++ != '.' ||
                *p++ != '.' || s_parse_i64(&p, &c->hi) < 0 || *p++ != '}' || c->hi < c->lo)
                return -1;
            c->ranged = 1;
        }
        n++;
        if (*p == ';' && p[1])
            p++;
        else if (*p)
            return -1;
    }
    return n;
}

int tp_wire_comps_check(const tp_wire_comp_t *want, int n, const tp_datapoint_t *dp,
                        char *why, size_t size) {
    int have = tp_datapoint_size(dp);
    if (have != n) {
        /* name both lists: which one is missing (or extra) shows at once */
        size_t o = 0;
#define S_ADD(...)                                                                  \
    do {                                                                            \
        int w_ = snprintf(why + o, size - o, __VA_ARGS__);                          \
        o = w_ < 0 ? o : o + (size_t)w_ >= size ? size - 1 : o + (size_t)w_;       \
    } while (0)
        S_ADD("%d component%s (", have, have == 1 ? "" : "s");
        for (int i = 0; i < have; i++) {
            char d[128];
            S_ADD("%s%s", i ? ", " : "", tp_tensor_describe(tp_datapoint_cget(dp, i), d,
                                                            sizeof d));
        }
        S_ADD("), expected %d:", n);
        for (int i = 0; i < n; i++) {
            char d[160];
            s_comp_shape(&want[i], d, sizeof d);
            S_ADD("%s %s %s", i ? "," : "", want[i].name[0] ? want[i].name : "?", d);
        }
#undef S_ADD
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *x = tp_datapoint_cget(dp, i);
        const tp_wire_comp_t *e = &want[i];
        int ok = x->dtype == e->dtype && x->ndim == e->ndim;
        for (int k = 0; ok && k < e->ndim; k++)
            ok = e->shape[k] < 0 || x->shape[k] == e->shape[k];
        if (ok)
            continue;
        char got[128], exp[160];
        tp_tensor_describe(x, got, sizeof got);
        s_comp_shape(e, exp, sizeof exp);
        snprintf(why, size, "component %d '%s' is %s, expected %s", i,
                 e->name[0] ? e->name : "?", got, exp);
        return -1;
    }
    /* then the values, once every shape fits: a label out of the model's
     * classes (a few ints a batch to read) */
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *x = tp_datapoint_cget(dp, i);
        const tp_wire_comp_t *e = &want[i];
        if (!e->ranged || !s_int_dtype(x->dtype))
            continue;
        size_t count = tp_tensor_numel(x), k = 0;
        int64_t v = 0;
        for (; k < count; k++) {
            v = x->dtype == TP_INT32   ? ((const int32_t *)x->data)[k]
                : x->dtype == TP_INT64 ? ((const int64_t *)x->data)[k]
                                       : ((const uint8_t *)x->data)[k];
            if (v < e->lo || v > e->hi)
                break;
        }
        if (k == count)
            continue;
        /* where: the element's index in every dimension */
        char at[160] = "";
        size_t o = 0;
        int64_t idx[TP_MAX_DIMS], rest = (int64_t)k;
        for (int d = x->ndim - 1; d >= 0; d--) {
            idx[d] = x->shape[d] > 0 ? rest % x->shape[d] : 0;
            rest = x->shape[d] > 0 ? rest / x->shape[d] : 0;
        }
        for (int d = 0; d < x->ndim && o < sizeof at - 1; d++) {
            int w = snprintf(at + o, sizeof at - o, "%s%lld", d ? "," : " at [",
                             (long long)idx[d]);
            o = w > 0 && o + (size_t)w < sizeof at ? o + (size_t)w : sizeof at - 1;
        }
        if (x->ndim && o < sizeof at - 1)
            snprintf(at + o, sizeof at - o, "]");
        snprintf(why, size, "component %d '%s' has value %lld%s, expected %lld..%lld", i,
                 e->name[0] ? e->name : "?", (long long)v, at, (long long)e->lo,
                 (long long)e->hi);
        return -1;
    }
    return 0;
}

tp_status_t tp_wire_set_comps(void *socket, const char *text) {
    tp_wire_comp_t c[TP_WIRE_COMPS_N];
    /* libzmq takes no empty property value: a receiver without components
     * sets none */
    if (!text || tp_wire_comps_parse(text, c, TP_WIRE_COMPS_N) < 1 ||
        strlen(text) >= TP_WIRE_COMPS_MAX)
        return tp_error(TP_ERR_INVALID, "components '%.80s' do not parse (NAME:DTYPE[D,...];...)",
                        text ? text : "(null)");
    char prop[TP_WIRE_COMPS_MAX + 16];
    snprintf(prop, sizeof prop, "%s:%s", TP_WIRE_COMPS_PROPERTY, text);
    if (zmq_setsockopt(socket, ZMQ_METADATA, prop, strlen(prop)) != 0)
        return tp_error(TP_ERR_UNSUPPORTED, "components: this libzmq cannot send socket "
                        "properties (ZMQ_METADATA): %s", zmq_strerror(zmq_errno()));
    return TP_OK;
}
