/* towerpack actors: ZeroMQ CURVE keys, the ZAP handler that admits only
 * the run's client key, and the bind rules (towerpack/security.h).
 *
 * One ZAP handler per libzmq context: a thread with a REP socket bound to
 * inproc://zeromq.zap.01 that libzmq asks about every CURVE handshake of a
 * server socket in that context. It answers 200 only for a client public
 * key in its allowed set, and ends when the context is terminated (ETERM). */
#include <czmq.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/log.h>
#include <towerpack/security.h>

#define MAX_ALLOWED 16
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

typedef struct s_zap {
    void *zctx;
    void *sock;
    pthread_t thread;
    const tp_curve_t *owner;  /* joins the thread at its destroy */
    pthread_mutex_t lock;
    uint8_t allowed[MAX_ALLOWED][32];
    int nallowed;
    uint64_t denied;
    struct s_zap *next;
} s_zap_t;

struct tp_curve {
    int server;
    char public_txt[41], secret_txt[41];  /* own keypair (z85) */
    char server_public[41];               /* client: the server's key */
    uint8_t allowed[32];                  /* server: client.key, binary */
};

static pthread_mutex_t s_zaps_lock = PTHREAD_MUTEX_INITIALIZER;
static s_zap_t *s_zaps;

int tp_curve_available(void) { return zmq_has("curve"); }

/* DIR's length without its trailing slashes (DIR/ given: the files are
 * named DIR/server.key, not DIR//server.key); "/" stays itself. */
static int s_dir_len(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    return (int)n;
}

/* ---- keys ------------------------------------------------------------------ */

tp_status_t tp_curve_client_keys(const tp_curve_t *c, uint8_t keys[96]) {
    if (!c || c->server)
        return tp_error(TP_ERR_INVALID, "CURVE keys: not a client's");
    if (!zmq_z85_decode(keys, c->public_txt) || !zmq_z85_decode(keys + 32, c->secret_txt) ||
        !zmq_z85_decode(keys + 64, c->server_public))
        return tp_error(TP_ERR_FORMAT, "CURVE keys: not z85");
    return TP_OK;
}

static tp_status_t s_write_cert(const char *dir, const char *name) {
    char pub[41], sec[41], path[4096];
    if (zmq_curve_keypair(pub, sec) != 0)
        return tp_error(TP_ERR_UNSUPPORTED, "CURVE keypair: %s", zmq_strerror(zmq_errno()));
    for (int secret = 0; secret < 2; secret++) {
        snprintf(path, sizeof path, "%.*s/%s.key%s", s_dir_len(dir), dir, name,
                 secret ? "_secret" : "");
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, secret ? 0600 : 0644);
        if (fd < 0)
            return tp_error(TP_ERR_IO, "CURVE keys: creating %s: %s", path, strerror(errno));
        FILE *f = fdopen(fd, "w");
        if (!f) {
            close(fd);
            return tp_error(TP_ERR_IO, "CURVE keys: %s: %s", path, strerror(errno));
        }
        fprintf(f, "#   towerpack CURVE %s certificate (%s)%s\ncurve\n"
                   "    public-key = \"%s\"\n",
                secret ? "**secret**" : "public", name,
                secret ? ": keep it private (mode 0600)" : "", pub);
        if (secret)
            fprintf(f, "    secret-key = \"%s\"\n", sec);
        if (fclose(f) != 0)
            return tp_error(TP_ERR_IO, "CURVE keys: writing %s: %s", path, strerror(errno));
    }
    return TP_OK;
}

tp_status_t tp_curve_keygen(const char *dir) {
    if (!tp_curve_available())
        return tp_error(TP_ERR_UNSUPPORTED, "this libzmq has no CURVE (built without libsodium)");
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (mkdir(dir, 0700) != 0)
            return tp_error(TP_ERR_IO, "CURVE keys: mkdir %s: %s", dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return tp_error(TP_ERR_INVALID, "CURVE keys: %s is not a directory", dir);
    } else if (st.st_mode & 077) {
        return tp_error(TP_ERR_INVALID, "CURVE keys: directory %s is accessible by group or "
                        "others (mode %03o): use a new directory or chmod 700 it", dir,
                        (unsigned)(st.st_mode & 0777));
    }
    TP_TRY(s_write_cert(dir, "server"));
    return s_write_cert(dir, "client");
}

/* The z85 value of `key = "..."` in a certificate file. */
static tp_status_t s_read_key(const char *path, const char *key, char out[41]) {
    FILE *f = fopen(path, "r");
    if (!f)
        return tp_error(TP_ERR_IO, "CURVE keys: cannot read %s: %s (make keys with "
                        "tp-keygen DIR)", path, strerror(errno));
    char line[512];
    int found = 0;
    size_t kl = strlen(key);
    while (!found && fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, key, kl) || (p[kl] != ' ' && p[kl] != '='))
            continue;
        char *q = strchr(p + kl, '"');
        char *e = q ? strchr(q + 1, '"') : NULL;
        if (q && e && e - q - 1 == 40) {
            memcpy(out, q + 1, 40);
            out[40] = '\0';
            uint8_t bin[32];
            found = zmq_z85_decode(bin, out) != NULL;
        }
    }
    fclose(f);
    if (!found)
        return tp_error(TP_ERR_FORMAT, "CURVE keys: %s has no valid %s (40 z85 characters)",
                        path, key);
    return TP_OK;
}

/* A secret file must be a regular file nobody else can read. */
static tp_status_t s_check_private(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        return tp_error(TP_ERR_IO, "CURVE keys: %s: %s (make keys with tp-keygen DIR)",
                        path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return tp_error(TP_ERR_INVALID, "CURVE keys: %s is not a regular file", path);
    if (st.st_mode & 077)
        return tp_error(TP_ERR_INVALID, "CURVE keys: %s is readable by group or others "
                        "(mode %03o): refusing it; chmod 600 it", path,
                        (unsigned)(st.st_mode & 0777));
    return TP_OK;
}

tp_curve_t *tp_curve_load(const char *dir, int server) {
    if (!tp_curve_available()) {
        tp_error(TP_ERR_UNSUPPORTED, "CURVE keys %s: this libzmq has no CURVE "
                 "(built without libsodium)", dir);
        return NULL;
    }
    tp_curve_t *c = calloc(1, sizeof *c);
    if (!c) {
        tp_error(TP_ERR_NOMEM, "CURVE keys");
        return NULL;
    }
    c->server = server;
    const char *self = server ? "server" : "client", *peer = server ? "client" : "server";
    char path[4096], peer_pub[41];
    snprintf(path, sizeof path, "%.*s/%s.key_secret", s_dir_len(dir), dir, self);
    if (s_check_private(path) < 0 || s_read_key(path, "public-key", c->public_txt) < 0 ||
        s_read_key(path, "secret-key", c->secret_txt) < 0)
        goto fail;
    snprintf(path, sizeof path, "%.*s/%s.key", s_dir_len(dir), dir, peer);
    if (s_read_key(path, "public-key", peer_pub) < 0)
        goto fail;
    if (server)
        zmq_z85_decode(c->allowed, peer_pub);
    else
        memcpy(c->server_public, peer_pub, sizeof peer_pub);
    return c;
fail:
    free(c);
    return NULL;
}

/* ---- the ZAP handler ----------------------------------------------------------- */

static int s_recv_frame(void *sock, zmq_msg_t *m) {
    for (;;) {
        if (zmq_msg_recv(m, sock, 0) >= 0)
            return 0;
        if (zmq_errno() != EINTR)
            return -1;
    }
}

static void s_send_str(void *sock, const void *data, size_t size, int more) {
    while (zmq_send(sock, data, size, more ? ZMQ_SNDMORE : 0) < 0 && zmq_errno() == EINTR)
        ;
}

static void *s_zap_main(void *arg) {
    s_zap_t *z = arg;
    for (;;) {
        /* version, request id, domain, address, routing id, mechanism,
         * credentials... */
        zmq_msg_t f[8];
        int n = 0, more = 1, failed = 0;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (s_recv_frame(z->sock, &m) < 0) {
                zmq_msg_close(&m);
                failed = 1;
                break;
            }
            more = zmq_msg_more(&m);
            if (n < 8) {
                zmq_msg_init(&f[n]);
                zmq_msg_move(&f[n], &m);
                n++;
            }
            zmq_msg_close(&m);
        }
        if (failed) {  /* ETERM: the context ends */
            for (int i = 0; i < n; i++)
                zmq_msg_close(&f[i]);
            break;
        }
        int ok = 0;
        if (n >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
            zmq_msg_size(&f[6]) == 32) {
            pthread_mutex_lock(&z->lock);
            for (int i = 0; i < z->nallowed && !ok; i++)
                ok = !memcmp(z->allowed[i], zmq_msg_data(&f[6]), 32);
            if (!ok)
                z->denied++;
            pthread_mutex_unlock(&z->lock);
        }
        if (!ok) {
            char addr[64] = "?";
            if (n >= 4) {
                size_t al = zmq_msg_size(&f[3]);
                if (al >= sizeof addr)
                    al = sizeof addr - 1;
                memcpy(addr, zmq_msg_data(&f[3]), al);
                addr[al] = '\0';
            }
            TP_WARN("CURVE: refused a peer from %s: its key is not the run's client key", addr);
        }
        s_send_str(z->sock, "1.0", 3, 1);
        s_send_str(z->sock, n >= 2 ? zmq_msg_data(&f[1]) : "", n >= 2 ? zmq_msg_size(&f[1]) : 0, 1);
        s_send_str(z->sock, ok ? "200" : "400", 3, 1);
        s_send_str(z->sock, ok ? "OK" : "unknown client key", ok ? 2 : 18, 1);
        s_send_str(z->sock, ok ? "client" : "", ok ? 6 : 0, 1);
        s_send_str(z->sock, "", 0, 0);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
    int zero = 0;
    zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(z->sock);
    return NULL;
}

/* The handler of zctx, started when there is none; `key` joins its set. */
static tp_status_t s_zap_ensure(const tp_curve_t *c, void *zctx) {
    pthread_mutex_lock(&s_zaps_lock);
    s_zap_t *z = s_zaps;
    while (z && z->zctx != zctx)
        z = z->next;
    tp_status_t rc = TP_OK;
    if (!z) {
        z = calloc(1, sizeof *z);
        void *sock = z ? zmq_socket(zctx, ZMQ_REP) : NULL;
        if (!sock || zmq_bind(sock, ZAP_ENDPOINT) != 0) {
            rc = tp_error(TP_ERR_IO, "CURVE: ZAP handler: %s", zmq_strerror(zmq_errno()));
            if (sock)
                zmq_close(sock);
            free(z);
            pthread_mutex_unlock(&s_zaps_lock);
            return rc;
        }
        z->zctx = zctx;
        z->sock = sock;
        z->owner = c;
        pthread_mutex_init(&z->lock, NULL);
        if (pthread_create(&z->thread, NULL, s_zap_main, z) != 0) {
            zmq_close(sock);
            free(z);
            pthread_mutex_unlock(&s_zaps_lock);
            return tp_error(TP_ERR_IO, "CURVE: ZAP handler thread");
        }
        z->next = s_zaps;
        s_zaps = z;
    }
    pthread_mutex_lock(&z->lock);
    int have = 0;
    for (int i = 0; i < z->nallowed && !have; i++)
        have = !memcmp(z->allowed[i], c->allowed, 32);
    if (!have && z->nallowed < MAX_ALLOWED)
        memcpy(z->allowed[z->nallowed++], c->allowed, 32);
    pthread_mutex_unlock(&z->lock);
    pthread_mutex_unlock(&s_zaps_lock);
    return rc;
}

tp_status_t tp_curve_apply(tp_curve_t *c, void *zctx, void *sock) {
    int one = 1;
    if (c->server) {
        TP_TRY(s_zap_ensure(c, zctx));
        if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
            zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_txt, 40) != 0 ||
            zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "towerpack", 9) != 0)
            return tp_error(TP_ERR_IO, "CURVE server options: %s", zmq_strerror(zmq_errno()));
        return TP_OK;
    }
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->server_public, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->public_txt, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_txt, 40) != 0)
        return tp_error(TP_ERR_IO, "CURVE client options: %s", zmq_strerror(zmq_errno()));
    return TP_OK;
}

void tp_curve_destroy(tp_curve_t **cp) {
    if (!cp || !*cp)
        return;
    tp_curve_t *c = *cp;
    *cp = NULL;
    pthread_mutex_lock(&s_zaps_lock);
    for (s_zap_t **pz = &s_zaps; *pz;) {
        s_zap_t *z = *pz;
        if (z->owner == c) {
            *pz = z->next;
            pthread_join(z->thread, NULL);  /* its context has ended */
            pthread_mutex_destroy(&z->lock);
            free(z);
        } else {
            pz = &z->next;
        }
    }
    pthread_mutex_unlock(&s_zaps_lock);
    memset(c, 0, sizeof *c);  /* no secret left in freed memory */
    free(c);
}

/* ---- binds ------------------------------------------------------------------- */

tp_status_t tp_bind_endpoint(const char *endpoint, int allow_public, char *out,
                             size_t size) {
    int n;
    if (!strncmp(endpoint, "tcp://:", 7))
        n = snprintf(out, size, "tcp://127.0.0.1:%s", endpoint + 7);
    else
        n = snprintf(out, size, "%s", endpoint);
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "endpoint '%s' is too long", endpoint);
    if (!allow_public && !strncmp(out, "tcp://", 6)) {
        const char *h = out + 6;
        if (!strncmp(h, "*:", 2) || !strncmp(h, "0.0.0.0:", 8) || !strncmp(h, "[::]:", 5) ||
            !strncmp(h, "::", 2) || !strncmp(h, "[*]:", 4))
            return tp_error(TP_ERR_INVALID,
                            "bind %s: listening on every interface needs an explicit "
                            "permission (--public); bind a loopback or a given address, and "
                            "consider CURVE (--curve DIR) for other hosts", endpoint);
    }
    return TP_OK;
}

const char *tp_bind_why(const char *endpoint, int err) {
    int tcp = endpoint && !strncmp(endpoint, "tcp://", 6);
    int ipc = endpoint && !strncmp(endpoint, "ipc://", 6);
    if (tcp && (err == ENODEV || err == EADDRNOTAVAIL))
        return " (not an address of this machine: bind one of its own, "
               "tcp://127.0.0.1:PORT or its network address, and connect the other "
               "side to that)";
    if (tcp && err == EADDRINUSE)
        return " (another process listens on that port: an earlier run still there, "
               "or another program; choose another port)";
    if (tcp && err == EACCES)
        return " (a port under 1024 needs privileges: choose a higher one)";
    if (ipc && err == ENOENT)
        return " (the socket's folder does not exist)";
    if (ipc && err == EACCES)
        return " (the socket's folder may not be written by this user)";
    return "";
}

static int s_public;
void tp_bind_set_public(int on) { s_public = on; }
int tp_bind_public(void) { return s_public; }

void tp_ipc_restrict(const char *endpoint) {
    if (endpoint && !strncmp(endpoint, "ipc://", 6) && endpoint[6] != '@')
        chmod(endpoint + 6, 0600);
}

/* ---- the stats sockets' CURVE ---------------------------------------------------- */

static pthread_mutex_t s_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static tp_curve_t *s_stats_curve;   /* lives as long as the process */
static int s_stats_curve_on;

tp_status_t tp_stats_set_curve(const char *dir) {
    pthread_mutex_lock(&s_stats_lock);
    tp_status_t rc = TP_OK;
    if (!dir) {
        s_stats_curve_on = 0;
    } else {
        tp_curve_t *c = tp_curve_load(dir, 1);
        if (!c) {
            rc = tp_error_wrap(TP_ERR_INVALID, "stats CURVE");
        } else {
            /* An older one may serve a live socket's handler: kept. */
            s_stats_curve = c;
            s_stats_curve_on = 1;
        }
    }
    pthread_mutex_unlock(&s_stats_lock);
    return rc;
}

/* For stats.c: apply the stats CURVE (if on) to a zsock of czmq's context. */
tp_status_t tp_stats_curve_apply(void *zsock_raw);
tp_status_t tp_stats_curve_apply(void *zsock_raw) {
    pthread_mutex_lock(&s_stats_lock);
    tp_status_t rc = s_stats_curve_on ? tp_curve_apply(s_stats_curve, zsys_init(), zsock_raw)
                                      : TP_OK;
    pthread_mutex_unlock(&s_stats_lock);
    return rc;
}
