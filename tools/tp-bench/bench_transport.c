/* tp-bench transport: the actor runtime and the process/remote dataflows
 * against raw libzmq, in the same run (docs/performance.md, "Actors").
 *
 *   ipc     a 1 MiB datapoint between two processes over ipc: send_dataflow
 *           -> remote dataflow, against raw PUSH/PULL of the same bytes
 *           (zero-copy 1 MiB messages)
 *   inproc  a small datapoint hop between two actors (pointer passing),
 *           against raw inproc PUSH/PULL of 8-byte messages between two
 *           threads
 *   mp      MultiProcessRunnerZMQ on a CPU-bound dataflow, 2 workers
 *           against 1
 *   stats   the inproc hop under a supervisor publishing statistics every
 *           second, against the same hop without reports
 *   tcp     the remote path: a tp-worker program (fake batches of 64
 *           Fashion-MNIST images, 50 KiB, and 1 MiB datapoints) over tcp
 *           on 127.0.0.1 into a remote dataflow, against raw libzmq
 *           PUSH/PULL over tcp of the same frames (the wire header and
 *           each component), datapoints/s and MB/s
 *   sizes   (only with --only sizes; bench/run.sh) datapoints of 64 B,
 *           64 KiB and 1 MiB over inproc (two actors) and ipc (two
 *           processes), each against raw libzmq moving the same payload
 * Each comparison runs both sides back to back in every one of --repeat
 * rounds; a ratio is the median of the per-round ratios, a rate the best
 * of its side. */
#include <czmq.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include "tools/tp-bench/bench_median.h"

typedef struct {
    int64_t ipc_count, inproc_count, mp_count;
    int repeat;
    int json;
    const char *only;
    const char *stats;
    char dir[64];
    double scale;  /* sizes: message counts times this */
} s_cfg_t;

/* ---- ipc: 1 MiB between processes ------------------------------------------------ */

#define MIB (1024 * 1024)
static uint8_t *s_big;  /* 1 MiB, shared read-only by every message */

static void s_noop_free(void *data, void *hint) {
    (void)data;
    (void)hint;
}

static double s_raw_ipc(const s_cfg_t *c, const char *ep) {
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    int hwm = 50;
    zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_bind(pull, ep);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        void *cx = zmq_ctx_new();
        void *push = zmq_socket(cx, ZMQ_PUSH);
        zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_connect(push, ep);
        for (int64_t i = 0; i < c->ipc_count; i++) {
            zmq_msg_t m;
            zmq_msg_init_data(&m, s_big, MIB, s_noop_free, NULL);
            zmq_msg_send(&m, push, 0);
        }
        zmq_close(push);
        zmq_ctx_term(cx);
        _exit(0);
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, pull, 0);  /* start the clock at the first message */
    double t0 = tp_now_s();
    for (int64_t i = 1; i < c->ipc_count; i++)
        zmq_msg_recv(&m, pull, 0);
    double dt = tp_now_s() - t0;
    zmq_msg_close(&m);
    waitpid(pid, NULL, 0);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    unlink(ep + 6);
    return (double)(c->ipc_count - 1) * MIB / dt / 1e6;
}

/* A dataflow of 1 MiB datapoints over the shared buffer (borrowed: the
 * same bytes as the raw run, no per-message allocation of the payload). */
static tp_status_t s_big_next(void *impl, tp_datapoint_t **out) {
    (void)impl;
    tp_datapoint_t *dp = tp_datapoint_new(0);
    tp_tensor_t t;
    int64_t shape[1] = {MIB};
    tp_tensor_init_wrap(&t, TP_UINT8, 1, shape, s_big, NULL, NULL);
    tp_datapoint_append(dp, &t);
    *out = dp;
    return TP_OK;
}
static const tp_dataflow_ops_t s_big_ops = {.name = "big", .next = s_big_next};

/* Datapoints per second of a towerpack run that received `got` of n in
 * dt seconds from the first arrival to the last; 0 (and a message naming
 * `what`) when some did not arrive. */
static double s_dp_rate(const char *what, int64_t got, int64_t n, double dt) {
    if (got < n || got < 2) {
        fprintf(stderr, "tp-bench transport: %s: %lld of %lld datapoints\n", what,
                (long long)got, (long long)n);
        return 0;
    }
    return (double)(got - 1) / dt;
}

/* A forked child sends n datapoints of `ops` with tp_send_dataflow; this
 * process receives them with tp_df_remote. Datapoints per second from the
 * first arrival to the last; 0 (and a message) when some did not arrive. */
static double s_tp_ipc_rate(const tp_dataflow_ops_t *ops, int64_t n, const char *ep) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        tp_dataflow_t *df = tp_dataflow_new(ops, NULL);
        tp_send_opts_t o;
        tp_send_opts_init(&o);
        o.max_count = n;
        tp_send_dataflow(df, ep, &o, NULL);
        tp_dataflow_destroy(&df);
        _exit(0);
    }
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 10;
    tp_dataflow_t *df = tp_df_remote(ep, &ro);
    tp_dataflow_reset_state(df, 0, 0);
    tp_datapoint_t *dp;
    double t0 = 0;
    int64_t got = 0;
    for (int64_t i = 0; i < n; i++) {
        if (tp_dataflow_next(df, &dp) != TP_OK)
            break;
        if (i == 0)
            t0 = tp_now_s();
        got++;
        tp_datapoint_destroy(&dp);
    }
    double dt = tp_now_s() - t0;
    waitpid(pid, NULL, 0);
    tp_dataflow_destroy(&df);
    return s_dp_rate("towerpack ipc", got, n, dt);
}

static double s_tp_ipc(const s_cfg_t *c, const char *ep) {
    return s_tp_ipc_rate(&s_big_ops, c->ipc_count, ep) * MIB / 1e6;
}

/* ---- inproc: a small datapoint hop between two actors ----------------------------- */

typedef struct {
    int64_t n;
    void *ctx;
    const char *ep;
    int with_dp;   /* also make (sender) and free (receiver) a datapoint */
} s_raw_thread_t;

static void *s_raw_sender(void *arg) {
    s_raw_thread_t *t = arg;
    void *push = zmq_socket(t->ctx, ZMQ_PUSH);
    int hwm = TP_ACTOR_DEFAULT_HWM;
    zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_connect(push, t->ep);
    for (int64_t i = 0; i < t->n; i++) {
        tp_datapoint_t *dp = t->with_dp ? tp_datapoint_new(1) : NULL;
        zmq_send(push, &dp, sizeof dp, 0);
    }
    zmq_close(push);
    return NULL;
}

/* Raw libzmq: 8-byte messages between two threads; with_dp: each carries
 * a datapoint made by the sender and freed by the receiver, the same work
 * the actors do around the hop. */
static double s_raw_inproc(int64_t n, int with_dp) {
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    int hwm = TP_ACTOR_DEFAULT_HWM;
    zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_bind(pull, "inproc://raw-bench");
    s_raw_thread_t t = {n, ctx, "inproc://raw-bench", with_dp};
    pthread_t th;
    double t0 = tp_now_s();
    pthread_create(&th, NULL, s_raw_sender, &t);
    tp_datapoint_t *dp;
    for (int64_t i = 0; i < n; i++) {
        zmq_recv(pull, &dp, sizeof dp, 0);
        tp_datapoint_destroy(&dp);
    }
    double dt = tp_now_s() - t0;
    pthread_join(th, NULL);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    return (double)n / dt;
}

typedef struct {
    int64_t n, made;
} s_src_t;

static tp_status_t s_src_produce(tp_actor_ctx_t *ctx, void *state) {
    s_src_t *s = state;
    if (s->made >= s->n)
        return TP_DONE;
    s->made++;
    tp_datapoint_t *dp = tp_datapoint_new(1);  /* one empty component */
    return tp_actor_send(ctx, 0, &dp);
}

static tp_status_t s_sink_on_data(tp_actor_ctx_t *ctx, void *state, int port,
                                  tp_datapoint_t **dp) {
    (void)ctx; (void)port;
    if (*dp)
        (*(int64_t *)state)++;
    return TP_OK;
}

static const tp_actor_port_t s_hop_out[] = {{"out", "inproc://hop-bench", 1, 0, 0}};
static const tp_actor_port_t s_hop_in[] = {{"in", "inproc://hop-bench", 0, 0, 0}};
static const tp_actor_def_t s_src_def = {"source", NULL, 0, s_hop_out, 1, NULL,
                                         NULL, s_src_produce, NULL};
static const tp_actor_def_t s_sink_def = {"sink", s_hop_in, 1, NULL, 0, NULL,
                                          s_sink_on_data, NULL, NULL};

/* The hop; with a supervisor publishing stats when `stats` is set. */
static double s_tp_inproc(int64_t n, const char *stats, const char *dir) {
    s_src_t src = {n, 0};
    int64_t got = 0;
    double t0, dt;
    if (stats) {
        tp_supervisor_opts_t o;
        tp_supervisor_opts_init(&o);
        o.stats = stats;
        o.run_dir = dir;
        o.handle_signals = 0;
        o.heartbeat_ms = 1000;
        tp_supervisor_t *sup = tp_supervisor_new(&o);
        if (!sup) {
            fprintf(stderr, "tp-bench: %s\n", tp_last_error());
            return 0;
        }
        tp_supervisor_add(sup, &s_sink_def, &got, NULL);
        tp_supervisor_add(sup, &s_src_def, &src, NULL);
        t0 = tp_now_s();
        tp_supervisor_start(sup);
        tp_supervisor_run(sup, 0);
        dt = tp_now_s() - t0;
        tp_supervisor_destroy(&sup);
    } else {
        tp_actor_t *sink = tp_actor_new(&s_sink_def, &got);
        t0 = tp_now_s();
        tp_actor_t *source = tp_actor_new(&s_src_def, &src);
        tp_actor_wait(source, -1);
        tp_actor_wait(sink, -1);
        dt = tp_now_s() - t0;
        tp_actor_destroy(&source);
        tp_actor_destroy(&sink);
    }
    return got == n ? (double)n / dt : 0;
}

/* ---- mp: the process-parallel runner on CPU-bound work ----------------------------- */

static tp_status_t s_cpu_next(void *impl, tp_datapoint_t **out) {
    (void)impl;
    volatile double x = 0;
    for (int k = 0; k < 200000; k++)  /* ~0.2 ms of arithmetic */
        x += k * 0.5;
    tp_datapoint_t *dp = tp_datapoint_new(0);
    tp_tensor_t t;
    tp_tensor_init(&t, TP_FLOAT64, 0, NULL);
    *(double *)t.data = x;
    tp_datapoint_append(dp, &t);
    *out = dp;
    return TP_OK;
}
static const tp_dataflow_ops_t s_cpu_ops = {.name = "cpu", .next = s_cpu_next};

static double s_mp(const s_cfg_t *c, int workers) {
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.run_dir = c->dir;
    o.allow_threads = 1;  /* the benchmark started actors before; it knows */
    tp_dataflow_t *df = tp_df_multiprocess(tp_dataflow_new(&s_cpu_ops, NULL), workers, &o);
    if (!df || tp_dataflow_reset_state(df, 1, 0) < 0) {
        fprintf(stderr, "tp-bench: %s\n", tp_last_error());
        tp_dataflow_destroy(&df);
        return 0;
    }
    tp_datapoint_t *dp;
    for (int i = 0; i < 20; i++) {  /* warm up: every worker running */
        if (tp_dataflow_next(df, &dp) != TP_OK) {
            fprintf(stderr, "tp-bench: multiprocess: %s\n", tp_last_error());
            tp_dataflow_destroy(&df);
            return 0;
        }
        tp_datapoint_destroy(&dp);
    }
    double t0 = tp_now_s();
    for (int64_t i = 0; i < c->mp_count; i++) {
        if (tp_dataflow_next(df, &dp) != TP_OK) {
            fprintf(stderr, "tp-bench: multiprocess: %s\n", tp_last_error());
            tp_dataflow_destroy(&df);
            return 0;
        }
        tp_datapoint_destroy(&dp);
    }
    double dt = tp_now_s() - t0;
    tp_dataflow_destroy(&df);
    return (double)c->mp_count / dt;
}

/* ---- sizes: 64 B .. 1 MiB over inproc and ipc, against raw libzmq ---------------- */

static double s_best(double a, double b) { return a > b ? a : b; }


/* Two sides measured back to back, round after round. */
enum { S_MAXR = 64 };
typedef struct {
    double a, b;             /* best rate of each side */
    double ratio[S_MAXR];    /* b / a per round that measured both */
    int n;
    int failed;              /* rounds where a side measured nothing (its
                                message on stderr): no ratio, never a zero */
} s_pair_t;

static void s_pair_add(s_pair_t *p, double a, double b) {
    if (a <= 0 || b <= 0) {
        p->failed++;
        return;
    }
    p->a = s_best(p->a, a);
    p->b = s_best(p->b, b);
    if (p->n < S_MAXR)
        p->ratio[p->n++] = b / a;
}

/* The smallest (which 0) or largest (1) per-round ratio. */
static double s_pair_extreme(const s_pair_t *p, int which) {
    double e = p->n ? p->ratio[0] : 0;
    for (int i = 1; i < p->n; i++)
        if (which ? p->ratio[i] > e : p->ratio[i] < e)
            e = p->ratio[i];
    return e;
}

/* A JSON string literal of text (quotes and backslashes escaped, control
 * bytes dropped) into out. */
static void s_json_str(const char *text, char *out, size_t size) {
    size_t o = 0;
    if (size < 3)
        return;
    out[o++] = '"';
    for (const char *p = text; *p && o + 3 < size; p++) {
        if ((unsigned char)*p < 0x20)
            continue;
        if (*p == '"' || *p == '\\')
            out[o++] = '\\';
        out[o++] = *p;
    }
    out[o++] = '"';
    out[o] = '\0';
}

/* The median of the per-round ratios. */
static double s_pair_ratio(const s_pair_t *p) {
    if (p->n == 0)
        return 0;
    double r[S_MAXR];
    memcpy(r, p->ratio, sizeof(double) * (size_t)p->n);
    qsort(r, (size_t)p->n, sizeof *r, tp_bench_cmp_double);
    return p->n % 2 ? r[p->n / 2] : 0.5 * (r[p->n / 2 - 1] + r[p->n / 2]);
}

/* The raw reference sends the payload as a user of libzmq would: small
 * messages copied by zmq_send, large ones (>= 512 B, where towerpack also
 * goes zero-copy) handed over without a copy. The towerpack side sends a
 * datapoint whose one component borrows the same bytes. */
static size_t s_sz;          /* payload of the current case */
static uint8_t *s_payload;   /* s_sz bytes, read-only while running */

static int s_raw_send(void *sock, size_t size) {
    if (size < 512)
        return zmq_send(sock, s_payload, size, 0);
    zmq_msg_t m;
    zmq_msg_init_data(&m, s_payload, size, s_noop_free, NULL);
    return zmq_msg_send(&m, sock, 0);
}

typedef struct {
    void *ctx;
    int64_t n;
} s_sz_thread_t;

static void *s_sz_sender(void *arg) {
    s_sz_thread_t *t = arg;
    void *push = zmq_socket(t->ctx, ZMQ_PUSH);
    int hwm = TP_ACTOR_DEFAULT_HWM;
    zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_connect(push, "inproc://sz-raw");
    for (int64_t i = 0; i < t->n; i++)
        s_raw_send(push, s_sz);
    zmq_close(push);
    return NULL;
}

/* Raw inproc PUSH/PULL between two threads: messages/s. */
static double s_sz_raw_inproc(int64_t n) {
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    int hwm = TP_ACTOR_DEFAULT_HWM;
    zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_bind(pull, "inproc://sz-raw");
    s_sz_thread_t t = {ctx, n};
    pthread_t th;
    double t0 = tp_now_s();
    pthread_create(&th, NULL, s_sz_sender, &t);
    zmq_msg_t m;
    zmq_msg_init(&m);
    for (int64_t i = 0; i < n; i++)
        zmq_msg_recv(&m, pull, 0);
    double dt = tp_now_s() - t0;
    zmq_msg_close(&m);
    pthread_join(th, NULL);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    return (double)n / dt;
}

/* A dataflow of datapoints borrowing s_payload (one uint8 component). */
static tp_status_t s_sz_next(void *impl, tp_datapoint_t **out) {
    (void)impl;
    tp_datapoint_t *dp = tp_datapoint_new(0);
    tp_tensor_t t;
    int64_t shape[1] = {(int64_t)s_sz};
    tp_tensor_init_wrap(&t, TP_UINT8, 1, shape, s_payload, NULL, NULL);
    tp_datapoint_append(dp, &t);
    *out = dp;
    return TP_OK;
}
static const tp_dataflow_ops_t s_sz_ops = {.name = "payload", .next = s_sz_next};

static tp_status_t s_sz_produce(tp_actor_ctx_t *ctx, void *state) {
    s_src_t *s = state;
    if (s->made >= s->n)
        return TP_DONE;
    s->made++;
    tp_datapoint_t *dp;
    s_sz_next(NULL, &dp);
    return tp_actor_send(ctx, 0, &dp);
}

static const tp_actor_port_t s_sz_out[] = {{"out", "inproc://sz-hop", 1, 0, 0}};
static const tp_actor_port_t s_sz_in[] = {{"in", "inproc://sz-hop", 0, 0, 0}};
static const tp_actor_def_t s_sz_src_def = {"source", NULL, 0, s_sz_out, 1, NULL,
                                            NULL, s_sz_produce, NULL};
static const tp_actor_def_t s_sz_sink_def = {"sink", s_sz_in, 1, NULL, 0, NULL,
                                             s_sink_on_data, NULL, NULL};

/* Two actors, source -> sink: datapoints/s. */
static double s_sz_tp_inproc(int64_t n) {
    s_src_t src = {n, 0};
    int64_t got = 0;
    tp_actor_t *sink = tp_actor_new(&s_sz_sink_def, &got);
    double t0 = tp_now_s();
    tp_actor_t *source = tp_actor_new(&s_sz_src_def, &src);
    tp_actor_wait(source, -1);
    tp_actor_wait(sink, -1);
    double dt = tp_now_s() - t0;
    tp_actor_destroy(&source);
    tp_actor_destroy(&sink);
    return got == n ? (double)n / dt : 0;
}

/* ---- the two ends of a raw libzmq run (a forked child PUSHes, this
 * process PULLs), shared by the ipc and the tcp cases ---- */

/* The child's end: a PUSH of high-water mark hwm, in a context of its own,
 * connected to ep (retried until the parent has bound). */
static void *s_raw_push(const char *ep, int hwm, void **cx) {
    *cx = zmq_ctx_new();
    void *push = zmq_socket(*cx, ZMQ_PUSH);
    zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_connect(push, ep);
    return push;
}

/* The child's exit: it stays until the parent, having every message,
 * closes its end of the pipe (see s_sz_raw_ipc), then goes without
 * lingering. */
static void s_raw_push_exit(int done, void *push, void *cx) {
    char b;
    while (read(done, &b, 1) < 0 && errno == EINTR)
        ;
    int linger = 0;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(push);
    zmq_ctx_term(cx);
    _exit(0);
}

/* This process's end: a PULL bound to ep whose receive times out, so a
 * lost peer ends the run instead of hanging it. */
static void *s_raw_pull(const char *ep, int hwm, void **ctx) {
    *ctx = zmq_ctx_new();
    void *pull = zmq_socket(*ctx, ZMQ_PULL);
    zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    int tmo = 20000;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_bind(pull, ep);
    return pull;
}

/* The end of a run: lets the child go (closing `done`) and reaps it. */
static void s_raw_pull_close(int done, pid_t pid, zmq_msg_t *m, void *pull, void *ctx) {
    close(done);
    zmq_msg_close(m);
    waitpid(pid, NULL, 0);
    zmq_close(pull);
    zmq_ctx_term(ctx);
}

/* Raw PUSH in a forked child -> PULL here over ipc: messages/s. */
static double s_sz_raw_ipc(int64_t n, const char *ep) {
    int hwm = 50, done[2];
    /* The child keeps its socket open until the parent has every message:
     * libzmq's linger does not cover the last small messages already taken
     * into the ipc engine's batch when the context terminates (measured:
     * ~1000 of 200,000 64-byte messages lost at the end without this). */
    if (pipe(done) != 0)
        return 0;
    fflush(NULL);
    /* fork before this process has a context: the child shares none of
     * its sockets or descriptors */
    pid_t pid = fork();
    if (pid == 0) {
        close(done[1]);
        void *cx, *push = s_raw_push(ep, hwm, &cx);
        for (int64_t i = 0; i < n; i++)
            s_raw_send(push, s_sz);
        s_raw_push_exit(done[0], push, cx);
    }
    close(done[0]);
    void *ctx, *pull = s_raw_pull(ep, hwm, &ctx);
    zmq_msg_t m;
    zmq_msg_init(&m);
    int64_t got = zmq_msg_recv(&m, pull, 0) >= 0;  /* the clock starts here */
    double t0 = tp_now_s();
    for (int64_t i = 1; i < n && got == i; i++)
        got += zmq_msg_recv(&m, pull, 0) >= 0;
    double dt = tp_now_s() - t0;
    if (got < n)
        fprintf(stderr, "tp-bench transport: raw ipc: %lld of %lld messages (%s)\n",
                (long long)got, (long long)n, zmq_strerror(zmq_errno()));
    s_raw_pull_close(done[1], pid, &m, pull, ctx);
    unlink(ep + 6);
    return got == n ? (double)(n - 1) / dt : 0;
}

/* send_dataflow in a forked child -> remote dataflow here: datapoints/s. */
static double s_sz_tp_ipc(int64_t n, const char *ep) {
    return s_tp_ipc_rate(&s_sz_ops, n, ep);
}

/* Every size x {ipc, inproc}: --repeat rounds, each running raw then
 * towerpack back to back; reports the best rate of each side and the
 * median of the per-round ratios. The ipc runs fork, so they go first. */
static int s_sizes(const s_cfg_t *c, const char *ep, double scale) {
    static const size_t sizes[] = {64, 64 * 1024, MIB};
    static const char *names[] = {"64 B", "64 KiB", "1 MiB"};
    /* messages per run: about 0.2-0.5 s each on this machine at scale 1 */
    static const int64_t n_inproc[] = {400000, 40000, 4000};
    static const int64_t n_ipc[] = {200000, 20000, 2000};
    enum { MAXR = 64 };
    int rounds = c->repeat < MAXR ? c->repeat : MAXR;
    if (c->json)
        printf("{\"sizes\": [\n");
    else
        printf("%-8s %-7s %15s %15s %12s %8s\n", "size", "path", "raw libzmq",
               "towerpack", "towerpack", "ratio");
    for (int pass = 0; pass < 2; pass++) {  /* 0: ipc (fork first), 1: inproc */
        for (int k = 0; k < 3; k++) {
            s_sz = sizes[k];
            int64_t n = (int64_t)((double)(pass ? n_inproc[k] : n_ipc[k]) * scale);
            if (n < 100)
                n = 100;
            double raw = 0, tpr = 0, ratios[MAXR];
            for (int r = 0; r < rounds; r++) {
                /* who goes first alternates: neither side always meets
                 * the machine as the other left it */
                double a = 0, b = 0;
                for (int side = 0; side < 2; side++) {
                    if ((side ^ r) & 1)
                        b = pass ? s_sz_tp_inproc(n) : s_sz_tp_ipc(n, ep);
                    else
                        a = pass ? s_sz_raw_inproc(n) : s_sz_raw_ipc(n, ep);
                }
                raw = s_best(raw, a);
                tpr = s_best(tpr, b);
                ratios[r] = a > 0 ? b / a : 0;
            }
            qsort(ratios, (size_t)rounds, sizeof *ratios, tp_bench_cmp_double);
            double med = rounds % 2 ? ratios[rounds / 2]
                                    : 0.5 * (ratios[rounds / 2 - 1] + ratios[rounds / 2]);
            const char *path = pass ? "inproc" : "ipc";
            if (c->json)
                printf("  {\"size\": %zu, \"path\": \"%s\", \"count\": %lld, "
                       "\"raw_msgs_s\": %.1f, \"towerpack_msgs_s\": %.1f, "
                       "\"towerpack_mb_s\": %.1f, \"ratio_median\": %.4f, "
                       "\"ratio_min\": %.4f, \"ratio_max\": %.4f}%s\n",
                       sizes[k], path, (long long)n, raw, tpr,
                       tpr * (double)sizes[k] / 1e6, med, ratios[0],
                       ratios[rounds - 1], pass == 1 && k == 2 ? "" : ",");
            else
                printf("%-8s %-7s %11.0f /s %11.0f /s %7.0f MB/s %8.3f\n", names[k],
                       path, raw, tpr, tpr * (double)sizes[k] / 1e6, med);
        }
    }
    if (c->json)
        printf("]}\n");
    return 0;
}

/* ---- tcp: a tp-worker on localhost ----------------------------------------------- */

/* The two payloads of the tcp rows: a training batch as tp-train --remote
 * takes it, and a large datapoint. Each spec repeats one datapoint drawn
 * at reset (the worker's dataflow costs one copy a datapoint). */
static const struct {
    const char *name, *spec;
    int ncomp;
    tp_dtype_t dtype[2];
    int ndim[2];
    int64_t shape[2][3];
    int64_t count;  /* datapoints a run at --tcp-count 1 (scaled) */
} s_tcp_cases[] = {
    {"batch 64 x 28x28 uint8 + int32 labels",
     "fake:shape=64x28x28:uint8,shape=64:int32,random=0,size=1000000000", 2,
     {TP_UINT8, TP_INT32}, {3, 1}, {{64, 28, 28}, {64}}, 20000},
    {"1 MiB datapoint", "fake:shape=1048576:uint8,random=0,size=1000000000", 1,
     {TP_UINT8}, {1}, {{MIB}}, 2000}};

/* A free tcp port on 127.0.0.1 (the kernel's pick; released at once, so
 * another program could take it first: a bench, not a service). */
static int s_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* The frame sizes of case k's datapoint in the wire format (header first). */
static int s_tcp_frames(int k, size_t *sizes, int max) {
    tp_datapoint_t *dp = tp_datapoint_new(0);
    for (int i = 0; i < s_tcp_cases[k].ncomp; i++) {
        tp_tensor_t t;
        tp_tensor_init_zero(&t, s_tcp_cases[k].dtype[i], s_tcp_cases[k].ndim[i],
                            s_tcp_cases[k].shape[i]);
        tp_datapoint_append(dp, &t);
    }
    tp_wire_msg_t *m = tp_wire_msg_new();
    tp_wire_opts_t o;
    tp_wire_opts_init(&o);
    int n = 0;
    if (tp_wire_encode(&dp, &o, m) == TP_OK)
        for (; n < tp_wire_msg_frames(m) && n < max; n++)
            sizes[n] = tp_wire_msg_frame_size(m, n);
    tp_wire_msg_destroy(&m);
    return n;
}

/* Raw libzmq: a forked child PUSHes n messages of the case's frames (zero
 * copy from one buffer) over tcp; this process PULLs them. Datapoints/s
 * from the first arrival to the last; bytes of one message in *bytes. */
static double s_tcp_raw(int k, int64_t n, double *bytes) {
    size_t sizes[8];
    int nf = s_tcp_frames(k, sizes, 8);
    *bytes = 0;
    for (int i = 0; i < nf; i++)
        *bytes += (double)sizes[i];
    int port = s_free_port(), hwm = 50;
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    int done[2];
    if (nf < 1 || port <= 0 || pipe(done) != 0)
        return 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(done[1]);
        void *cx, *push = s_raw_push(ep, hwm, &cx);
        for (int64_t i = 0; i < n; i++)
            for (int f = 0; f < nf; f++) {
                zmq_msg_t m;
                zmq_msg_init_data(&m, s_big, sizes[f], s_noop_free, NULL);
                zmq_msg_send(&m, push, f + 1 < nf ? ZMQ_SNDMORE : 0);
            }
        s_raw_push_exit(done[0], push, cx);
    }
    close(done[0]);
    void *ctx, *pull = s_raw_pull(ep, hwm, &ctx);
    zmq_msg_t m;
    zmq_msg_init(&m);
    double t0 = 0;
    int64_t got = 0;
    for (int64_t i = 0; i < n; i++) {
        int ok = 1;
        for (int f = 0; f < nf && ok; f++)
            ok = zmq_msg_recv(&m, pull, 0) >= 0;
        if (!ok)
            break;
        if (i == 0)
            t0 = tp_now_s();
        got++;
    }
    double dt = tp_now_s() - t0;
    if (got < n)
        fprintf(stderr, "tp-bench transport: raw tcp: %lld of %lld messages (%s)\n",
                (long long)got, (long long)n, zmq_strerror(zmq_errno()));
    s_raw_pull_close(done[1], pid, &m, pull, ctx);
    return got == n && got > 1 ? (double)(got - 1) / dt : 0;
}

/* The tp-worker program beside this one (the same build's bin/). */
static int s_tp_worker_path(char *out, size_t size) {
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    snprintf(out, size, "%s/tp-worker", self);
    return access(out, X_OK);
}

/* towerpack: a tp-worker process (--spec, --count n, --connect) sends to a
 * remote dataflow bound here on tcp. Datapoints/s from the first arrival
 * to the last; wire bytes a datapoint in *bytes. */
static double s_tcp_tp(int k, int64_t n, double *bytes) {
    char worker[1100];
    *bytes = 0;
    if (s_tp_worker_path(worker, sizeof worker) != 0) {
        fprintf(stderr, "tp-bench transport: no tp-worker beside tp-bench (%s)\n", worker);
        return 0;
    }
    int port = s_free_port();
    char ep[64], count[32];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    snprintf(count, sizeof count, "%lld", (long long)n);
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 20;
    tp_dataflow_t *df = tp_df_remote(ep, &ro);
    if (!df || tp_dataflow_reset_state(df, 0, 0) != TP_OK) {
        fprintf(stderr, "tp-bench transport: tcp: %s\n", tp_last_error());
        tp_dataflow_destroy(&df);
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {worker, "--spec", (char *)s_tcp_cases[k].spec, "--connect", ep,
                        "--count", count, "--log-level", "warn", NULL};
        execv(worker, argv);
        _exit(127);
    }
    tp_datapoint_t *dp;
    double t0 = 0;
    int64_t got = 0;
    uint64_t b0 = 0;
    for (int64_t i = 0; i < n; i++) {
        if (tp_dataflow_next(df, &dp) != TP_OK)
            break;
        if (i == 0) {
            t0 = tp_now_s();
            b0 = tp_df_remote_bytes(df);
        }
        got++;
        tp_datapoint_destroy(&dp);
    }
    double dt = tp_now_s() - t0;
    uint64_t b1 = tp_df_remote_bytes(df);
    waitpid(pid, NULL, 0);
    tp_dataflow_destroy(&df);
    double rate = s_dp_rate("tp-worker over tcp", got, n, dt);
    if (rate > 0)
        *bytes = (double)(b1 - b0) / (double)(got - 1);
    return rate;
}

/* ---- driver ------------------------------------------------------------------------ */

static int s_want(const s_cfg_t *c, const char *name) {
    return !c->only || !strcmp(c->only, name);
}

/* A case without figures: 1 with its one JSON member in out ("skipped":
 * not asked for, or `skip`'s reason; "failed": no round measured both
 * sides), 0 when it has figures. */
static int s_json_missing(const s_cfg_t *c, const char *name, const char *skip,
                          const s_pair_t *p, char *out, size_t size) {
    char text[1300], lit[1350];
    const char *key = "skipped";
    if (!s_want(c, name))
        snprintf(text, sizeof text, "not run (--only %s)", c->only);
    else if (skip)
        snprintf(text, sizeof text, "%s", skip);
    else if (p->n == 0) {
        key = "failed";
        snprintf(text, sizeof text, "no round measured both sides (%d failed; stderr "
                 "says why)", p->failed);
    } else
        return 0;
    s_json_str(text, lit, sizeof lit);
    snprintf(out, size, "\"%s\": %s", key, lit);
    return 1;
}

/* Opens the JSON member `key` of case `name`: one without figures is
 * written whole (s_json_missing's reason; why: scratch for it), 0; 1 when
 * the caller writes the figures. */
static int s_json_case(const s_cfg_t *c, const char *key, const char *name,
                       const s_pair_t *p, char *why, size_t size) {
    printf("  \"%s\": ", key);
    if (!s_json_missing(c, name, NULL, p, why, size))
        return 1;
    printf("{%s},\n", why);
    return 0;
}

/* ", \"failed_rounds\": N" for a case where some rounds failed, else "". */
static const char *s_failed_rounds(const s_pair_t *p, char *buf) {
    buf[0] = '\0';
    if (p->failed)
        sprintf(buf, ", \"failed_rounds\": %d", p->failed);
    return buf;
}

static void s_usage(FILE *out) {
    fprintf(out,
        "usage: tp-bench transport [--only ipc|inproc|mp|stats|tcp|sizes] [--repeat N]\n"
        "                          [--ipc-count N] [--inproc-count N] [--mp-count N]\n"
        "                          [--tcp-scale X]\n"
        "                          [--scale X] [--stats ENDPOINT] [--json]\n"
        "Actors and process/remote dataflows against raw libzmq in the same run.\n"
        "--only sizes: 64 B, 64 KiB and 1 MiB datapoints over inproc and ipc\n"
        "against raw libzmq (median of --repeat per-round ratios; --scale\n"
        "multiplies its message counts, default 1).\n"
        "tcp: a tp-worker over tcp on 127.0.0.1 (batches of 64 28x28 images and\n"
        "1 MiB datapoints) against raw PUSH/PULL of the same frames; --tcp-scale\n"
        "multiplies its counts (20000 and 2000; default 1).\n"
        "--stats publishes the stats benchmark's statistics at ENDPOINT (for\n"
        "tp-top; ipc, tcp, tcp:PORT or a full address).\n");
}

int tp_bench_transport(int argc, char **argv) {
    s_cfg_t c = {2000, 2000000, 1000, 3, 0, NULL, NULL, "", 1.0};
    double tcp_scale = 1.0;
    static const struct option longopts[] = {
        {"only", required_argument, 0, 'o'},   {"repeat", required_argument, 0, 'r'},
        {"ipc-count", required_argument, 0, 'i'}, {"inproc-count", required_argument, 0, 'n'},
        {"mp-count", required_argument, 0, 'm'}, {"stats", required_argument, 0, 's'},
        {"json", no_argument, 0, 'j'},         {"help", no_argument, 0, 'h'},
        {"scale", required_argument, 0, 'x'},
        {"tcp-scale", required_argument, 0, 't'},
        {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'o': c.only = optarg; break;
        case 'r': c.repeat = atoi(optarg); break;
        case 'i': c.ipc_count = atoll(optarg); break;
        case 'n': c.inproc_count = atoll(optarg); break;
        case 'm': c.mp_count = atoll(optarg); break;
        case 's': c.stats = optarg; break;
        case 'j': c.json = 1; break;
        case 'x': c.scale = atof(optarg); break;
        case 't': tcp_scale = atof(optarg); break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (c.repeat < 1 || c.ipc_count < 2 || c.inproc_count < 1 || c.mp_count < 1 ||
        !(c.scale > 0 && c.scale <= 1000) || !(tcp_scale > 0 && tcp_scale <= 1000)) {
        fprintf(stderr, "tp-bench transport: counts and --repeat must be positive\n");
        return 2;
    }
    if (c.only && strcmp(c.only, "ipc") && strcmp(c.only, "inproc") &&
        strcmp(c.only, "mp") && strcmp(c.only, "stats") && strcmp(c.only, "sizes") &&
        strcmp(c.only, "tcp")) {
        fprintf(stderr, "tp-bench transport: --only '%s' is not ipc, inproc, mp, stats, "
                "tcp or sizes\n",
                c.only);
        return 2;
    }
    snprintf(c.dir, sizeof c.dir, "/tmp/tp-bench-XXXXXX");
    if (!mkdtemp(c.dir)) {
        perror("tp-bench transport: mkdtemp");
        return 1;
    }
    tp_actors_init();
    /* libzmq's receive buffers stay mapped on both sides from the start,
     * as a remote dataflow keeps them at its first reset: the rounds
     * compare towerpack with libzmq, not malloc's moods (glibc's default
     * trimming faults in fresh pages for every 1 MiB message whenever a
     * queue drains: either side, 2-4x slower, at random on this host) */
    tp_remote_keep_receive_buffers();
    s_big = tp_alloc(MIB);
    memset(s_big, 0x5a, MIB);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/bench.sock", c.dir);
    if (c.only && !strcmp(c.only, "sizes")) {
        s_payload = tp_alloc(MIB);
        memset(s_payload, 0x3c, MIB);
        int rc = s_sizes(&c, ep, c.scale);
        tp_free(s_payload);
        tp_free(s_big);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", c.dir);
        if (system(cmd) != 0)
            fprintf(stderr, "tp-bench transport: cannot remove %s\n", c.dir);
        return rc;
    }
    /* Each comparison runs its two sides back to back in every round; the
     * ratio reported is the median of the per-round ratios (robust to a
     * shared machine's drift), the rates the best of each side. */
    s_pair_t ipc = {0}, in = {0}, mp = {0}, st = {0}, tcp[2] = {{0}};
    double tcp_bytes[2] = {0, 0};
    double raw_bare = 0;
    /* the tcp rows need the tp-worker of this build: without it they are
     * skipped, saying so, never measured as zero */
    char worker[1100], tcp_why[1300];
    const char *tcp_skip = NULL;
    if (s_want(&c, "tcp") && s_tp_worker_path(worker, sizeof worker) != 0) {
        snprintf(tcp_why, sizeof tcp_why, "no tp-worker beside tp-bench (%s): build it "
                 "(cmake --build BUILD --target tp-worker)", worker);
        tcp_skip = tcp_why;
        fprintf(stderr, "tp-bench transport: tcp skipped: %s\n", tcp_skip);
    }
    /* The fork-based runs go first, while the process has no actor threads. */
    for (int r = 0; r < c.repeat && r < S_MAXR; r++) {
        if (s_want(&c, "mp"))
            s_pair_add(&mp, s_mp(&c, 1), s_mp(&c, 2));
        /* Odd rounds run towerpack's side first (as in sizes). */
        int tp_first = r & 1;
        if (s_want(&c, "tcp") && !tcp_skip)
            for (int k = 0; k < 2; k++) {
                int64_t n = (int64_t)((double)s_tcp_cases[k].count * tcp_scale);
                if (n < 10)
                    n = 10;
                double rb = 0, tb = 0;
                double b = tp_first ? s_tcp_tp(k, n, &tb) : 0, a = s_tcp_raw(k, n, &rb);
                if (!tp_first)
                    b = s_tcp_tp(k, n, &tb);
                s_pair_add(&tcp[k], a, b);
                tcp_bytes[k] = rb;
                (void)tb;
            }
        if (s_want(&c, "ipc")) {
            double b = tp_first ? s_tp_ipc(&c, ep) : 0, a = s_raw_ipc(&c, ep);
            if (!tp_first)
                b = s_tp_ipc(&c, ep);
            s_pair_add(&ipc, a, b);
        }
        if (s_want(&c, "inproc")) {
            double b = tp_first ? s_tp_inproc(c.inproc_count, NULL, c.dir) : 0;
            raw_bare = s_best(raw_bare, s_raw_inproc(c.inproc_count, 0));
            double a = s_raw_inproc(c.inproc_count, 1);
            if (!tp_first)
                b = s_tp_inproc(c.inproc_count, NULL, c.dir);
            s_pair_add(&in, a, b);
        }
        if (s_want(&c, "stats")) {
            double a = s_tp_inproc(c.inproc_count, NULL, c.dir);
            s_pair_add(&st, a, s_tp_inproc(c.inproc_count, c.stats ? c.stats : "ipc",
                                           c.dir));
        }
    }
    double raw_ipc = ipc.a, tp_ipc = ipc.b, raw_in = in.a, tp_in = in.b, mp1 = mp.a,
           mp2 = mp.b, st_off = st.a, st_on = st.b;
    /* A case that did not run, or whose every round failed, is no measured
     * zero: JSON says why instead of its figures ("skipped": not asked for,
     * no tp-worker; "failed": a side received nothing, its message on
     * stderr); some rounds failed: "failed_rounds". Any failure is the
     * exit status. */
    const s_pair_t *pairs[] = {&ipc, &in, &mp, &st, &tcp[0], &tcp[1]};
    int failed = 0;
    for (int i = 0; i < 6; i++)
        failed |= pairs[i]->failed > 0;
    if (c.json) {
        char why[1400];
        printf("{\n");
        if (s_json_case(&c, "ipc_1mib", "ipc", &ipc, why, sizeof why))
            printf("{\"raw_mb_s\": %.1f, \"towerpack_mb_s\": %.1f, \"ratio\": %.3f%s},\n",
                   raw_ipc, tp_ipc, s_pair_ratio(&ipc), s_failed_rounds(&ipc, why));
        if (s_json_case(&c, "inproc_hop", "inproc", &in, why, sizeof why))
            printf("{\"raw_msgs_s\": %.0f, \"raw_bare_msgs_s\": %.0f, "
                   "\"towerpack_msgs_s\": %.0f, \"ratio\": %.3f, \"ratio_bare\": %.3f, "
                   "\"rounds\": %d, \"ratio_min\": %.3f, \"ratio_max\": %.3f%s},\n",
                   raw_in, raw_bare, tp_in, s_pair_ratio(&in),
                   raw_bare > 0 ? tp_in / raw_bare : 0, in.n, s_pair_extreme(&in, 0),
                   s_pair_extreme(&in, 1), s_failed_rounds(&in, why));
        if (s_json_case(&c, "mp_cpu", "mp", &mp, why, sizeof why))
            printf("{\"workers1_dp_s\": %.1f, \"workers2_dp_s\": %.1f, \"ratio\": %.3f%s},\n",
                   mp1, mp2, s_pair_ratio(&mp), s_failed_rounds(&mp, why));
        if (s_json_case(&c, "stats", "stats", &st, why, sizeof why))
            printf("{\"off_msgs_s\": %.0f, \"on_msgs_s\": %.0f, \"ratio\": %.3f%s},\n",
                   st_off, st_on, s_pair_ratio(&st), s_failed_rounds(&st, why));
        printf("  \"tcp_tp_worker\": [");
        for (int k = 0; k < 2; k++) {
            printf("%s{\"case\": \"%s\"", k ? ", " : "", s_tcp_cases[k].name);
            if (s_json_missing(&c, "tcp", tcp_skip, &tcp[k], why, sizeof why)) {
                printf(", %s}", why);
                continue;
            }
            printf(", \"bytes\": %.0f, \"raw_dp_s\": %.1f, "
                   "\"raw_mb_s\": %.1f, \"towerpack_dp_s\": %.1f, \"towerpack_mb_s\": %.1f, "
                   "\"ratio\": %.3f, \"ratio_min\": %.3f, \"ratio_max\": %.3f%s}",
                   tcp_bytes[k], tcp[k].a, tcp[k].a * tcp_bytes[k] / 1e6, tcp[k].b,
                   tcp[k].b * tcp_bytes[k] / 1e6, s_pair_ratio(&tcp[k]),
                   s_pair_extreme(&tcp[k], 0), s_pair_extreme(&tcp[k], 1),
                   s_failed_rounds(&tcp[k], why));
        }
        printf("]\n}\n");
    } else {
        printf("%-34s %14s %14s %8s\n", "benchmark", "reference", "towerpack", "ratio");
        if (s_want(&c, "ipc"))
            printf("%-34s %11.1f MB/s %9.1f MB/s %8.3f   (goal >= 0.9)\n",
                   "ipc 1 MiB datapoint, 2 processes", raw_ipc, tp_ipc,
                   s_pair_ratio(&ipc));
        if (s_want(&c, "inproc")) {
            printf("%-34s %9.0f msg/s %9.0f msg/s %8.3f   (goal >= 0.8)\n",
                   "inproc hop, 2 actors", raw_in, tp_in, s_pair_ratio(&in));
            printf("%-34s %9.0f msg/s %9.0f msg/s %8.3f   (no datapoint in raw)\n",
                   "  against bare 8-byte messages", raw_bare, tp_in,
                   raw_bare > 0 ? tp_in / raw_bare : 0);
        }
        if (s_want(&c, "mp"))
            printf("%-34s %10.1f dp/s %10.1f dp/s %8.3f   (goal >= 1.8; 2 vs 1 worker)\n",
                   "multiprocess runner, CPU-bound", mp1, mp2, s_pair_ratio(&mp));
        if (s_want(&c, "stats"))
            printf("%-34s %9.0f msg/s %9.0f msg/s %8.3f   (goal >= 0.99)\n",
                   "stats publishing on vs off", st_off, st_on,
                   st_off > 0 ? st_on / st_off : 0);
        if (s_want(&c, "tcp") && tcp_skip)
            printf("%-34s skipped: %s\n", "tcp tp-worker", tcp_skip);
        else if (s_want(&c, "tcp"))
            for (int k = 0; k < 2; k++) {
                char name[64];
                snprintf(name, sizeof name, "tcp tp-worker, %s", k ? "1 MiB datapoint"
                                                                   : "batch 64x28x28");
                printf("%-34s %10.0f dp/s %10.0f dp/s %8.3f   (raw PUSH/PULL, same frames)\n",
                       name, tcp[k].a, tcp[k].b, s_pair_ratio(&tcp[k]));
                printf("%-34s %11.1f MB/s %9.1f MB/s           (%.0f bytes a datapoint)\n",
                       "", tcp[k].a * tcp_bytes[k] / 1e6, tcp[k].b * tcp_bytes[k] / 1e6,
                       tcp_bytes[k]);
            }
    }
    tp_free(s_big);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", c.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "tp-bench transport: cannot remove %s\n", c.dir);
    if (failed)
        fprintf(stderr, "tp-bench transport: a side measured nothing in some rounds (above); "
                "those rounds have no ratio\n");
    return failed ? 1 : 0;
}
