/* towerpack core: the job handshake of remote senders and receivers.
 *
 * The job id rides in the ZMTP handshake as a socket property
 * (ZMQ_METADATA "X-Tp-Job:ID"): libzmq sends it on every connection, and
 * the receiving side reads it on each message (zmq_msg_gets). The other
 * direction has no API: a PUSH socket never receives, so it never sees the
 * receiver's properties. tp_wire_probe_job reads them itself, with the
 * smallest ZMTP 3.0 client that libzmq accepts (RFC 23: greeting, NULL
 * mechanism, READY), on a connection of its own that it closes at once. */
#include <errno.h>
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

/* A non-blocking socket connected to ep's address, or a negative status. */
static int s_connect(const char *ep, uint64_t deadline_ns, tp_status_t *st) {
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
    } else {
        /* tcp://HOST:PORT, HOST possibly [v6]; no interface or source part */
        char host[256];
        const char *hp = ep + 6, *colon = strrchr(hp, ':');
        if (!colon || strchr(hp, ';') || (size_t)(colon - hp) >= sizeof host) {
            *st = tp_error(TP_ERR_UNSUPPORTED, "job probe: endpoint %s", ep);
            return -1;
        }
        size_t hl = (size_t)(colon - hp);
        if (hl >= 2 && hp[0] == '[' && hp[hl - 1] == ']') {
            hp++;
            hl -= 2;
        }
        memcpy(host, hp, hl);
        host[hl] = '\0';
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        int g = getaddrinfo(host, colon + 1, &hints, &res);
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

tp_status_t tp_wire_probe_job(const char *endpoint, int timeout_ms, char *job,
                              size_t size) {
    if (size)
        job[0] = '\0';
    if (!endpoint || (strncmp(endpoint, "tcp://", 6) && strncmp(endpoint, "ipc://", 6)))
        return tp_error(TP_ERR_UNSUPPORTED, "job probe: endpoint %s is not tcp:// or "
                        "ipc://", endpoint ? endpoint : "(null)");
    uint64_t deadline = tp_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    tp_status_t st = TP_OK;
    int fd = s_connect(endpoint, deadline, &st);
    if (fd < 0)
        return st;
    /* greeting: signature, version 3.0, mechanism NULL, as-server 0, filler */
    uint8_t g[64];
    memset(g, 0, sizeof g);
    g[0] = 0xff;
    g[8] = 1;
    g[9] = 0x7f;
    g[10] = 3;
    memcpy(g + 12, "NULL", 4);
    /* READY with the one property libzmq checks: the socket type */
    static const char ready[] = "\x05READY\x0bSocket-Type\x00\x00\x00\x04PUSH";
    uint8_t cmd[2 + sizeof ready];
    cmd[0] = 0x04;  /* a short command frame */
    cmd[1] = (uint8_t)(sizeof ready - 1);
    memcpy(cmd + 2, ready, sizeof ready - 1);
    uint8_t peer[64];
    if ((st = s_write_all(fd, g, sizeof g, deadline, endpoint)) < 0 ||
        (st = s_read_all(fd, peer, sizeof peer, deadline, endpoint)) < 0)
        goto out;
    if (peer[0] != 0xff || peer[9] != 0x7f || peer[10] < 3) {
        st = tp_error(TP_ERR_PROTOCOL, "job probe: %s does not speak ZMTP 3", endpoint);
        goto out;
    }
    if (memcmp(peer + 12, "NULL", 5) != 0) {
        char mech[21];
        memcpy(mech, peer + 12, 20);
        mech[20] = '\0';
        st = tp_error(TP_ERR_UNSUPPORTED, "job probe: the receiver at %s uses %s", endpoint,
                      mech);
        goto out;
    }
    if ((st = s_write_all(fd, cmd, 2 + sizeof ready - 1, deadline, endpoint)) < 0)
        goto out;
    /* the receiver's READY (or ERROR): flags, size, body */
    for (int frames = 0; frames < 4; frames++) {
        uint8_t hdr[9];
        if ((st = s_read_all(fd, hdr, 2, deadline, endpoint)) < 0)
            goto out;
        uint64_t len = hdr[1];
        if (hdr[0] & 0x02) {  /* a long frame: 8 bytes of size */
            if ((st = s_read_all(fd, hdr + 2, 7, deadline, endpoint)) < 0)
                goto out;
            len = 0;
            for (int k = 1; k < 9; k++)
                len = len << 8 | hdr[k];
        }
        if (len > 8192) {
            st = tp_error(TP_ERR_PROTOCOL, "job probe: %s sent a %llu-byte frame in the "
                          "handshake", endpoint, (unsigned long long)len);
            goto out;
        }
        uint8_t body[8192];
        if ((st = s_read_all(fd, body, (size_t)len, deadline, endpoint)) < 0)
            goto out;
        if (!(hdr[0] & 0x04) || len < 1 || body[0] + 1u > len)
            continue;  /* not a command */
        size_t nl = body[0];
        if (nl == 5 && !memcmp(body + 1, "ERROR", 5)) {
            st = tp_error(TP_ERR_PEER, "job probe: the receiver at %s refused the "
                          "handshake", endpoint);
            goto out;
        }
        if (nl != 5 || memcmp(body + 1, "READY", 5))
            continue;
        int f = s_find_property(body + 6, (size_t)len - 6, TP_WIRE_JOB_PROPERTY, job, size);
        if (f == -2)
            st = tp_error(TP_ERR_PROTOCOL, "job probe: %s sent a malformed READY", endpoint);
        else if (f == 0 && !tp_wire_job_ok(job))
            st = tp_error(TP_ERR_PROTOCOL, "job probe: %s gave a malformed job id", endpoint);
        goto out;
    }
    st = tp_error(TP_ERR_PROTOCOL, "job probe: no READY from %s", endpoint);
out:
    close(fd);
    if (st < 0 && size)
        job[0] = '\0';
    return st;
}
