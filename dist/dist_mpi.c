/* towerpack dist: the MPI module (libtowerpack_mpi.so), loaded by
 * tp_dist_open (dist/dist.c) when a launcher started the process. It
 * holds every MPI call of the project, so that nothing else links libmpi.
 *
 * Collectives never wait forever: each is issued non-blocking
 * (MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier) and polled against a deadline
 * (TP_DIST_STEP_TIMEOUT, default 300 s: long enough for rank 0's epoch-end
 * validation and checkpoint while the others wait in the next step). Beside
 * MPI a heartbeat thread runs on every rank: the others tell rank 0 every
 * TP_DIST_HEARTBEAT_INTERVAL seconds (default 0.25) which step they are at,
 * over a ZeroMQ DEALER -> ROUTER pair, and rank 0 answers. A rank silent for
 * TP_DIST_HEARTBEAT_TIMEOUT seconds (default 10) is dead or stopped: rank 0
 * aborts the job naming it; when rank 0 is the silent one the others abort
 * naming it. Why not MPI for the heartbeat: MPI calls to a dead peer may
 * block, and a watchdog that can block is no watchdog.
 *
 * A failure ends the whole job (MPI_Abort): a collective that one rank left
 * cannot be resumed, and mpirun then stops every rank. */
#define _GNU_SOURCE
#include <czmq.h>
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/dist.h>

#define EXIT_DIST 75   /* the exit status of a job this module aborts */

typedef struct {
    int rank, size, thread_level;
    char host[256];
    MPI_Comm comm;               /* a duplicate of MPI_COMM_WORLD */
    double step_timeout, hb_timeout, hb_interval;
    size_t bucket_floats;

    /* heartbeat */
    zsock_t *hb_sock;            /* ROUTER on rank 0, DEALER elsewhere */
    pthread_t hb_thread;
    int hb_running;
    atomic_int hb_stop;
    atomic_llong my_step;        /* the step this rank is at */
    atomic_llong *peer_step;     /* rank 0: each rank's last reported step */
    _Atomic double *peer_seen;   /* rank 0: when each rank was last heard */
    atomic_int *peer_done;       /* rank 0: said goodbye */
    atomic_int aborting;

    /* what the all-reduces cost (TP_DIST_REPORT=1 prints it at the end) */
    uint64_t nreduce;
    double reduce_s;
    size_t reduce_floats;

    /* fault injection for the tests (TP_DIST_FAULT=delay:RANK:STEP:SECONDS):
     * this rank sleeps before that step's all-reduce, alive but late */
    int fault_rank;
    long long fault_step;
    double fault_s;
} s_ctx_t;

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double s_env_double(const char *name, double def) {
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end = NULL;
    double x = strtod(v, &end);
    if (*end || !(x > 0)) {
        fprintf(stderr, "towerpack: %s='%s' is not a positive number; using %g\n",
                name, v, def);
        return def;
    }
    return x;
}

static void s_mpi_msg(int err, char *msg, size_t size, const char *what) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(err, text, &len);
    snprintf(msg, size, "%s: %s", what, text);
}

/* The end of the job: one clear line on stderr, then every rank goes. */
static void s_abort(s_ctx_t *c, int code, const char *msg) {
    if (atomic_exchange(&c->aborting, 1)) {
        for (;;)   /* another thread is already aborting */
            pause();
    }
    fprintf(stderr, "towerpack: rank %d of %d (%s, pid %d): %s; aborting the "
            "job\n", c->rank, c->size, c->host, (int)getpid(), msg);
    fflush(stderr);
    if (c->thread_level >= MPI_THREAD_MULTIPLE || pthread_equal(pthread_self(), c->hb_thread) == 0)
        MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

static void s_abortf(s_ctx_t *c, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s_abort(c, EXIT_DIST, msg);
}

/* ---- heartbeat ------------------------------------------------------------- */

static void *s_hb_root(void *arg) {
    s_ctx_t *c = arg;
    zpoller_t *p = zpoller_new(c->hb_sock, NULL);
    int ms = (int)(c->hb_interval * 1000);
    while (!atomic_load(&c->hb_stop)) {
        zsock_t *which = zpoller_wait(p, ms > 0 ? ms : 1);
        if (which) {
            zmsg_t *m = zmsg_recv(c->hb_sock);
            if (m && zmsg_size(m) == 3) {
                zframe_t *id = zmsg_pop(m);
                char *kind = zmsg_popstr(m);
                char *body = zmsg_popstr(m);
                int r = -1;
                long long step = 0;
                if (body && sscanf(body, "%d %lld", &r, &step) == 2 && r > 0 &&
                    r < c->size) {
                    atomic_store(&c->peer_seen[r], s_now());
                    atomic_store(&c->peer_step[r], step);
                    if (kind && !strcmp(kind, "BYE"))
                        atomic_store(&c->peer_done[r], 1);
                    zmsg_t *reply = zmsg_new();
                    zmsg_append(reply, &id);
                    zmsg_addstr(reply, "OK");
                    zmsg_send(&reply, c->hb_sock);
                }
                zframe_destroy(&id);
                zstr_free(&kind);
                zstr_free(&body);
            }
            zmsg_destroy(&m);
        }
        double now = s_now();
        for (int r = 1; r < c->size; r++) {
            if (atomic_load(&c->peer_done[r]))
                continue;
            double silent = now - atomic_load(&c->peer_seen[r]);
            if (silent > c->hb_timeout && !atomic_load(&c->hb_stop))
                s_abortf(c, "rank %d has sent no heartbeat for %.1f s (last at "
                         "step %lld; TP_DIST_HEARTBEAT_TIMEOUT=%g): it died, was "
                         "stopped or its host is unreachable", r, silent,
                         (long long)atomic_load(&c->peer_step[r]), c->hb_timeout);
        }
    }
    zpoller_destroy(&p);
    return NULL;
}

static void *s_hb_peer(void *arg) {
    s_ctx_t *c = arg;
    zpoller_t *p = zpoller_new(c->hb_sock, NULL);
    double last_answer = s_now(), last_sent = 0;
    int ms = (int)(c->hb_interval * 1000);
    while (!atomic_load(&c->hb_stop)) {
        double now = s_now();
        if (now - last_sent >= c->hb_interval) {
            zstr_sendfm(c->hb_sock, "HB");
            zstr_sendf(c->hb_sock, "%d %lld", c->rank,
                       (long long)atomic_load(&c->my_step));
            last_sent = now;
        }
        zsock_t *which = zpoller_wait(p, ms > 0 ? ms : 1);
        if (which) {
            char *s = zstr_recv(c->hb_sock);
            if (s)
                last_answer = s_now();
            zstr_free(&s);
        }
        double silent = s_now() - last_answer;
        if (silent > c->hb_timeout && !atomic_load(&c->hb_stop))
            s_abortf(c, "rank 0 has not answered heartbeats for %.1f s "
                     "(TP_DIST_HEARTBEAT_TIMEOUT=%g): it died, was stopped or "
                     "its host is unreachable", silent, c->hb_timeout);
    }
    /* goodbye: rank 0 stops watching this rank */
    zstr_sendfm(c->hb_sock, "BYE");
    zstr_sendf(c->hb_sock, "%d %lld", c->rank, (long long)atomic_load(&c->my_step));
    zpoller_destroy(&p);
    return NULL;
}

/* Rank 0 binds, tells every rank where (host, port), the others connect. */
static int s_hb_start(s_ctx_t *c, char *msg, size_t size) {
    char where[512] = "";
    if (c->rank == 0) {
        c->hb_sock = zsock_new(ZMQ_ROUTER);
        const char *port = getenv("TP_DIST_HEARTBEAT_PORT");
        int got = c->hb_sock ? zsock_bind(c->hb_sock, "tcp://*:%s",
                                          port && *port ? port : "*") : -1;
        if (got < 0)
            snprintf(msg, size, "heartbeat: cannot bind tcp://*:%s: %s",
                     port && *port ? port : "*", zmq_strerror(zmq_errno()));
        const char *addr = getenv("TP_DIST_HEARTBEAT_ADDR");
        snprintf(where, sizeof where, "%s %d",
                 addr && *addr ? addr : c->host, got);
    }
    int err = MPI_Bcast(where, sizeof where, MPI_CHAR, 0, c->comm);
    if (err != MPI_SUCCESS) {
        s_mpi_msg(err, msg, size, "heartbeat endpoint");
        return -1;
    }
    char host[300] = "";
    int port = -1;
    if (sscanf(where, "%299s %d", host, &port) != 2 || port <= 0) {
        if (c->rank != 0)
            snprintf(msg, size, "heartbeat: rank 0 could not open its socket");
        return -1;
    }
    if (c->rank != 0) {
        /* same host as rank 0 (all of a one-machine job): the loopback */
        const char *h = strcmp(host, c->host) == 0 ? "127.0.0.1" : host;
        c->hb_sock = zsock_new(ZMQ_DEALER);
        if (!c->hb_sock || zsock_connect(c->hb_sock, "tcp://%s:%d", h, port) < 0) {
            snprintf(msg, size, "heartbeat: cannot connect to rank 0 at "
                     "tcp://%s:%d: %s", h, port, zmq_strerror(zmq_errno()));
            return -1;
        }
    }
    zsock_set_linger(c->hb_sock, 0);
    if (c->rank == 0) {
        c->peer_step = calloc((size_t)c->size, sizeof *c->peer_step);
        c->peer_seen = calloc((size_t)c->size, sizeof *c->peer_seen);
        c->peer_done = calloc((size_t)c->size, sizeof *c->peer_done);
        if (!c->peer_step || !c->peer_seen || !c->peer_done) {
            snprintf(msg, size, "heartbeat: out of memory");
            return -1;
        }
        double now = s_now();
        for (int r = 0; r < c->size; r++)
            atomic_store(&c->peer_seen[r], now);
    }
    if (pthread_create(&c->hb_thread, NULL, c->rank == 0 ? s_hb_root : s_hb_peer, c)) {
        snprintf(msg, size, "heartbeat: cannot start its thread");
        return -1;
    }
    c->hb_running = 1;
    return 0;
}

static void s_hb_stop(s_ctx_t *c) {
    if (c->hb_running) {
        atomic_store(&c->hb_stop, 1);
        pthread_join(c->hb_thread, NULL);
        c->hb_running = 0;
    }
    zsock_destroy(&c->hb_sock);
    free(c->peer_step);
    free((void *)c->peer_seen);
    free(c->peer_done);
    c->peer_step = NULL;
    c->peer_seen = NULL;
    c->peer_done = NULL;
}

/* ---- bounded completion ------------------------------------------------------ */

/* Poll `reqs` to completion; past the step timeout the job is aborted with
 * what rank 0 knows of the others (their last heartbeat steps). */
static int s_wait(s_ctx_t *c, int n, MPI_Request *reqs, const char *what,
                  char *msg, size_t size) {
    double t0 = s_now();
    long spins = 0;
    for (;;) {
        int done = 0;
        int err = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) {
            s_mpi_msg(err, msg, size, what);
            return -1;
        }
        if (done)
            return 0;
        double waited = s_now() - t0;
        if (waited > c->step_timeout) {
            char behind[1024] = "";
            if (c->rank == 0 && c->peer_step) {
                size_t off = 0;
                long long mine = atomic_load(&c->my_step);
                for (int r = 1; r < c->size && off < sizeof behind - 64; r++) {
                    long long s = atomic_load(&c->peer_step[r]);
                    if (s < mine)
                        off += (size_t)snprintf(behind + off, sizeof behind - off,
                                                "%s rank %d (alive, last at step %lld)",
                                                off ? "," : "; behind:", r, s);
                }
                if (!off)
                    snprintf(behind, sizeof behind, "; every rank is alive and "
                             "has reached this step (stuck inside MPI?)");
            }
            s_abortf(c, "%s has not completed after %.0f s "
                     "(TP_DIST_STEP_TIMEOUT=%g)%s", what, waited,
                     c->step_timeout, behind);
        }
        /* Progress happens inside MPI calls: spin briefly, then poll every
         * 50 us (an idle wait must not eat a core another rank needs). */
        if (++spins > 2000) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- the module's functions ---------------------------------------------------- */

static int m_init(void **ctx, int *rank, int *size, char *msg, size_t msgsize) {
    s_ctx_t *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(msg, msgsize, "out of memory");
        return -1;
    }
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &c->thread_level);
        if (err != MPI_SUCCESS) {
            s_mpi_msg(err, msg, msgsize, "MPI_Init_thread");
            free(c);
            return -1;
        }
    } else
        MPI_Query_thread(&c->thread_level);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    if (gethostname(c->host, sizeof c->host - 1) != 0)
        snprintf(c->host, sizeof c->host, "?");
    c->step_timeout = s_env_double("TP_DIST_STEP_TIMEOUT", 300);
    c->hb_timeout = s_env_double("TP_DIST_HEARTBEAT_TIMEOUT", 10);
    c->hb_interval = s_env_double("TP_DIST_HEARTBEAT_INTERVAL", 0.25);
    if (c->hb_interval > c->hb_timeout / 4)
        c->hb_interval = c->hb_timeout / 4;
    double mib = s_env_double("TP_DIST_BUCKET_MB", 8);
    c->bucket_floats = (size_t)(mib * 1024 * 1024 / sizeof(float));
    if (c->bucket_floats < 1024)
        c->bucket_floats = 1024;
    if (c->bucket_floats > (size_t)1 << 28)
        c->bucket_floats = (size_t)1 << 28;
    c->fault_rank = -1;
    const char *fault = getenv("TP_DIST_FAULT");
    if (fault && *fault &&
        sscanf(fault, "delay:%d:%lld:%lf", &c->fault_rank, &c->fault_step,
               &c->fault_s) != 3) {
        fprintf(stderr, "towerpack: TP_DIST_FAULT='%s' is not "
                "delay:RANK:STEP:SECONDS; ignored\n", fault);
        c->fault_rank = -1;
    }
    atomic_init(&c->hb_stop, 0);
    atomic_init(&c->my_step, -1);
    atomic_init(&c->aborting, 0);
    /* czmq must not catch SIGINT/SIGTERM for us: tp-train installs its own */
    zsys_handler_set(NULL);
    if (s_hb_start(c, msg, msgsize) < 0) {
        /* every rank must stop: one that goes on would wait forever */
        s_abort(c, EXIT_DIST, msg);
    }
    *ctx = c;
    *rank = c->rank;
    *size = c->size;
    return 0;
}

static int m_allreduce_mean(void *ctx, float *buf, size_t n, int64_t step,
                            char *msg, size_t msgsize) {
    s_ctx_t *c = ctx;
    if (c->fault_rank == c->rank && c->fault_step == (long long)step) {
        fprintf(stderr, "towerpack: rank %d: TP_DIST_FAULT: sleeping %g s before "
                "the all-reduce of step %lld\n", c->rank, c->fault_s, (long long)step);
        struct timespec ts = {(time_t)c->fault_s,
                              (long)((c->fault_s - (double)(time_t)c->fault_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    atomic_store(&c->my_step, (long long)step);
    size_t nb = (n + c->bucket_floats - 1) / c->bucket_floats;
    MPI_Request stack[64];
    MPI_Request *reqs = nb <= 64 ? stack : malloc(nb * sizeof *reqs);
    if (!reqs) {
        snprintf(msg, msgsize, "out of memory (%zu buckets)", nb);
        return -1;
    }
    /* Every bucket in flight at once: MPI pipelines them. */
    size_t issued = 0;
    int rc = 0;
    for (size_t off = 0; off < n; off += c->bucket_floats, issued++) {
        size_t cnt = n - off < c->bucket_floats ? n - off : c->bucket_floats;
        int err = MPI_Iallreduce(MPI_IN_PLACE, buf + off, (int)cnt, MPI_FLOAT,
                                 MPI_SUM, c->comm, &reqs[issued]);
        if (err != MPI_SUCCESS) {
            s_mpi_msg(err, msg, msgsize, "MPI_Iallreduce");
            rc = -1;
            break;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "the gradient all-reduce of step %lld", (long long)step);
    double t0 = s_now();
    if (issued && s_wait(c, (int)issued, reqs, what, msg, msgsize) < 0)
        rc = -1;
    c->reduce_s += s_now() - t0;
    c->nreduce++;
    c->reduce_floats = n;
    if (reqs != stack)
        free(reqs);
    if (rc < 0)
        return rc;
    /* the same rounding as the CPU backend's tower average: sum, then times
     * 1/n in float */
    const float scale = 1.0f / (float)c->size;
    for (size_t i = 0; i < n; i++)
        buf[i] *= scale;
    return 0;
}

static int m_broadcast(void *ctx, void *buf, size_t bytes, char *msg, size_t msgsize) {
    s_ctx_t *c = ctx;
    const size_t chunk = (size_t)1 << 30;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t cnt = bytes - off < chunk ? bytes - off : chunk;
        MPI_Request req;
        int err = MPI_Ibcast((char *)buf + off, (int)cnt, MPI_BYTE, 0, c->comm, &req);
        if (err != MPI_SUCCESS) {
            s_mpi_msg(err, msg, msgsize, "MPI_Ibcast");
            return -1;
        }
        if (s_wait(c, 1, &req, "a broadcast from rank 0", msg, msgsize) < 0)
            return -1;
    }
    return 0;
}

static void m_abort(void *ctx, int code, const char *msg) {
    s_abort(ctx, code ? code : 1, msg);
}

static void m_finalize(void *ctx) {
    s_ctx_t *c = ctx;
    /* Wait for every rank (bounded: a rank that died is named by the
     * heartbeat, which keeps running until all have arrived). Rank 0 often
     * arrives last: it validates and saves after the last step. */
    MPI_Request req;
    char msg[512];
    const char *report = getenv("TP_DIST_REPORT");
    if (report && *report && strcmp(report, "0") != 0 && c->nreduce)
        fprintf(stderr, "towerpack: rank %d: %llu gradient all-reduces of %.2f MiB "
                "(%d buckets), %.3f s waiting in them, %.2f ms per step\n",
                c->rank, (unsigned long long)c->nreduce,
                (double)c->reduce_floats * sizeof(float) / (1 << 20),
                (int)((c->reduce_floats + c->bucket_floats - 1) / c->bucket_floats),
                c->reduce_s, c->reduce_s * 1e3 / (double)c->nreduce);
    atomic_store(&c->my_step, LLONG_MAX);
    if (MPI_Ibarrier(c->comm, &req) == MPI_SUCCESS)
        s_wait(c, 1, &req, "the final barrier", msg, sizeof msg);
    s_hb_stop(c);
    MPI_Comm_free(&c->comm);
    MPI_Finalize();
    free(c);
}

static const char *m_host(void *ctx) { return ((s_ctx_t *)ctx)->host; }

static const tp_dist_module_t s_module = {
    .abi = TP_DIST_MODULE_ABI,
    .init = m_init,
    .allreduce_mean = m_allreduce_mean,
    .broadcast = m_broadcast,
    .abort = m_abort,
    .finalize = m_finalize,
    .host = m_host,
};

__attribute__((visibility("default"))) const tp_dist_module_t *tp_dist_module(void);
const tp_dist_module_t *tp_dist_module(void) { return &s_module; }
