/* towerpack dataflow: process-parallel dataflows on the wire format,
 * tensorpack's MultiProcessRunnerZMQ (tp_df_multiprocess) and
 * MultiProcessMapDataZMQ (tp_df_multiprocess_map).
 *
 * Workers are forked by the pool's zygote (df_zygote.h), a single-threaded
 * helper forked at reset_state: the first workers and every replacement,
 * so no worker is ever a fork of the multi-threaded parent. Each worker
 * gets a pipe whose write end it keeps: a worker that fails writes its
 * error message there and exits with status 2; the zygote reaps it and
 * sends its wait status and message to the parent. Workers use a fresh
 * ZeroMQ context of their own (never the parent's) and leave with _exit,
 * so no inherited atexit handler or socket is touched. Inside a pipeline
 * told what it must give (tp_df_expect: a trainer's model inputs), each
 * worker of a runner checks its first datapoint with the check a remote
 * receiver makes (tp_wire_comps_check) and ends the run naming a mismatch. */
#include <czmq.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "df_internal.h"
#include "df_zygote.h"
#include <towerpack/fileio.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/process.h>
#include <towerpack/clock.h>
#include <towerpack/actor.h>
#include <towerpack/log.h>
#include <towerpack/security.h>
#include <towerpack/supervisor.h>
#include <towerpack/image.h>
#include <towerpack/wire.h>
#if __has_include(<towerpack/dataflow_spec.h>)
#include <towerpack/dataflow_spec.h>
#define TP_HAVE_SPEC 1
#endif

#define WORKER_ERR_EXIT 2
/* A worker whose first datapoint does not fit what the pipeline must give
 * (tp_df_expect): every worker runs the same pipeline, so none is
 * restarted; the run ends naming the mismatch. */
#define WORKER_UNFIT_EXIT 3

void tp_mp_opts_init(tp_mp_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    opts->hwm = 50;
    opts->policy = TP_WORKER_FAIL;
    opts->max_restarts = 3;
    opts->buffer_size = 200;
}

/* ---- shared by both ------------------------------------------------------------- */

typedef struct {
    /* The worker's own counters, as its process last reported them
     * (TP_CTL_STATS on its data socket), and what the slot's dead
     * processes had reported (base). Written by the consumer's thread,
     * read by any. */
    atomic_uint_fast64_t busy_ns, blocked_ns, starved_ns, made, bytes;
    atomic_uint_fast64_t base_busy_ns, base_blocked_ns, base_starved_ns, base_made,
        base_bytes;
    /* Bad image files its image sources found (skip-bad), plus 1: the
     * largest any of the slot's processes reported, since each reads the
     * whole source; 0 while none reported having an image source. */
    atomic_uint_fast64_t skipped;
    atomic_int restarts;  /* of this slot */
    pid_t pid;       /* 0: not running */
    int gen;         /* how many times this slot was started */
    int inflight;    /* map: tasks out at this worker */
} s_worker_t;

typedef struct {
    const char *what;     /* "multiprocess" or "multiprocess-map" */
    tp_mp_opts_t opts;
    int nworkers;
    s_worker_t *workers;
    char run_dir[200];
    int own_run_dir;
    pid_t parent;         /* the process that consumes (names the sockets) */
    df_zygote_t *zygote;  /* forks the workers */
    void *impl;           /* the runner or map the pool belongs to */
    atomic_int restarts;  /* read by other threads (tp_df_multiprocess_restarts) */
    uint64_t start_ns;    /* set at reset_state */
    uint64_t seed, stream;
    uint64_t last_check_ns;
    tp_wire_opts_t wire;
} s_pool_t;

/* A dead worker's last report joins its slot's base; the slot's next
 * process reports from 0 (the consumer's thread only). */
static void s_fold_counters(s_worker_t *w) {
    atomic_fetch_add(&w->base_busy_ns, atomic_exchange(&w->busy_ns, 0));
    atomic_fetch_add(&w->base_blocked_ns, atomic_exchange(&w->blocked_ns, 0));
    atomic_fetch_add(&w->base_starved_ns, atomic_exchange(&w->starved_ns, 0));
    atomic_fetch_add(&w->base_made, atomic_exchange(&w->made, 0));
    atomic_fetch_add(&w->base_bytes, atomic_exchange(&w->bytes, 0));
}

/* A TP_CTL_STATS frame (data, size) from worker `slot`, on the consumer's
 * thread: 1 when it was one (its counters kept), 0 for anything else. */
static int s_take_report(s_pool_t *p, const void *data, size_t size) {
    int kind;
    uint32_t slot;
    const char *text;
    size_t len;
    if (!tp_ctl_parse(data, size, &kind, &slot, &text, &len) || kind != TP_CTL_STATS)
        return 0;
    char buf[128];
    unsigned long long busy = 0, blocked = 0, starved = 0, made = 0, bytes = 0,
                       skipped = 0;
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), text);
    int nf = slot < (uint32_t)p->nworkers
                 ? sscanf(buf, "%llu %llu %llu %llu %llu %llu", &busy, &blocked,
                          &starved, &made, &bytes, &skipped)
                 : 0;
    if (nf >= 5) {
        s_worker_t *w = &p->workers[slot];
        atomic_store_explicit(&w->busy_ns, busy, memory_order_relaxed);
        atomic_store_explicit(&w->blocked_ns, blocked, memory_order_relaxed);
        atomic_store_explicit(&w->starved_ns, starved, memory_order_relaxed);
        atomic_store_explicit(&w->made, made, memory_order_relaxed);
        atomic_store_explicit(&w->bytes, bytes, memory_order_relaxed);
        if (nf == 6 && skipped + 1 > atomic_load_explicit(&w->skipped, memory_order_relaxed))
            atomic_store_explicit(&w->skipped, skipped + 1, memory_order_relaxed);
    }
    return 1;
}

/* The same for a whole message (the runner's stream). */
static int s_take_report_msg(s_pool_t *p, tp_wire_msg_t *msg) {
    if (tp_wire_msg_frames(msg) != 1 ||
        !s_take_report(p, tp_wire_msg_frame_data(msg, 0), tp_wire_msg_frame_size(msg, 0)))
        return 0;
    tp_wire_msg_clear(msg);
    return 1;
}

/* A worker's own time: its sends waiting on the parent's full queue
 * (blocked), waiting for work (starved: the map's), and the rest of its
 * life making datapoints (busy). Measured where it waits, so the loop that
 * makes datapoints reads no clock: the report's own check reads one every
 * 64 datapoints (two reads a datapoint cost 12% of a worker's rate on
 * 784-byte images). */
typedef struct {
    uint64_t start_ns, blocked_ns, starved_ns, reported_ns;
    uint64_t made, bytes;   /* datapoints (results) sent, their wire bytes */
    unsigned since_check;
    int64_t skip0, skip_sent; /* bad image files: at the start, last sent */
} s_child_time_t;

/* In a worker: its counters to the parent, on the data socket (so they
 * keep their place in the stream), at most twice a second; dropped, not
 * waited for, when the queue is full (the next report has the sums). */
static void s_child_report_at(void *sock, int index, s_child_time_t *t, uint64_t now);

static void s_child_report(void *sock, int index, s_child_time_t *t) {
    /* a newly found bad file is reported at once (it happens at most once
     * per file), the rest at most twice a second */
    int64_t all = tp_image_skipped_in_process();
    int64_t skipped = all < 0 ? -1 : all - (t->skip0 > 0 ? t->skip0 : 0);
    if (++t->since_check < 64 && skipped == t->skip_sent)
        return;
    t->since_check = 0;
    uint64_t now = tp_now_ns();
    if (now - t->reported_ns < 500000000ull && skipped == t->skip_sent)
        return;
    s_child_report_at(sock, index, t, now);
}

/* The report itself; its time (and the bad-file count it carries) is
 * taken only when the socket took it. */
static void s_child_report_at(void *sock, int index, s_child_time_t *t, uint64_t now) {
    int64_t all = tp_image_skipped_in_process();
    int64_t skipped = all < 0 ? -1 : all - (t->skip0 > 0 ? t->skip0 : 0);
    uint64_t waited = t->blocked_ns + t->starved_ns, alive = now - t->start_ns;
    char text[128];
    int len = snprintf(text, sizeof text, "%llu %llu %llu %llu %llu",
                       (unsigned long long)(alive > waited ? alive - waited : 0),
                       (unsigned long long)t->blocked_ns,
                       (unsigned long long)t->starved_ns,
                       (unsigned long long)t->made, (unsigned long long)t->bytes);
    if (skipped >= 0 && len > 0 && (size_t)len < sizeof text)  /* has image sources */
        snprintf(text + len, sizeof text - (size_t)len, " %llu",
                 (unsigned long long)skipped);
    if (tp_ctl_send(sock, TP_CTL_STATS, (uint32_t)index, text, ZMQ_DONTWAIT) >= 0) {
        t->reported_ns = now;
        t->skip_sent = skipped;
    }
}


static int s_count_threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static tp_status_t s_pool_init(s_pool_t *p, const char *what, int nworkers,
                               const tp_mp_opts_t *opts) {
    memset(p, 0, sizeof *p);
    p->what = what;
    if (opts)
        p->opts = *opts;
    else
        tp_mp_opts_init(&p->opts);
    if (p->opts.hwm <= 0)
        p->opts.hwm = 50;
    if (p->opts.buffer_size <= 0)
        p->opts.buffer_size = 200;
    if (p->opts.max_restarts < 0)
        p->opts.max_restarts = 0;
    if (nworkers < 1 || nworkers > 1024)
        return tp_error(TP_ERR_INVALID, "%s: %d workers (1 to 1024)", what,
                        nworkers);
    p->nworkers = nworkers;
    p->workers = calloc((size_t)nworkers, sizeof *p->workers);
    if (!p->workers)
        return tp_error(TP_ERR_NOMEM, "%s", what);
    tp_wire_opts_init(&p->wire);
    p->wire.lz4 = p->opts.lz4;
    return TP_OK;
}

/* Check the fork rule and make the run dir. */
static tp_status_t s_pool_prepare(s_pool_t *p) {
    if (!p->opts.allow_threads) {
        /* Idle pools that libraries made fork-safe (OpenBLAS) do not count. */
        int n = s_count_threads() - tp_forksafe_threads();
        if (n > 1)
            return tp_error(TP_ERR_STATE,
                            "%s: cannot fork workers: the process already runs "
                            "%d threads (reset a process-parallel dataflow "
                            "before starting actors, a supervisor or CUDA; or "
                            "set allow_threads)", p->what, n);
        /* State a backend registered as unsafe to fork past (the CUDA
         * module, once loaded): see tp_fork_hazard_set in process.h. */
        const char *hazard = tp_fork_hazard();
        if (hazard)
            return tp_error(TP_ERR_STATE, "%s: cannot fork workers after %s",
                            p->what, hazard);
    }
    if (p->opts.run_dir) {
        snprintf(p->run_dir, sizeof p->run_dir, "%s", p->opts.run_dir);
    } else {
        tp_status_t rc = tp_run_dir_make(p->run_dir, sizeof p->run_dir, "tp-mp");
        if (rc < 0)
            return tp_error_wrap(rc, "%s", p->what);
        p->own_run_dir = 1;
    }
    p->opts.run_dir = NULL;
    p->parent = getpid();
    p->start_ns = tp_now_ns();
    return TP_OK;
}

static tp_status_t s_endpoint(s_pool_t *p, char *out, size_t size,
                              const char *name) {
    int n = snprintf(out, size, "ipc://%s/%s-%d.sock", p->run_dir, name,
                     (int)p->parent);
    if (n < 0 || (size_t)n >= size || strlen(out + 6) > 107)
        return tp_error(TP_ERR_INVALID,
                        "%s: ipc path in '%s' is too long for a Unix socket",
                        p->what, p->run_dir);
    return TP_OK;
}

static void s_child_fail(int err_w, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));
static void s_child_fail(int err_w, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 1)
        n = sizeof buf - 1;
    if (n > 0 && write(err_w, buf, (size_t)n) < 0) {
        /* nothing more to do: the exit status still tells */
    }
    _exit(WORKER_ERR_EXIT);
}

/* Send a whole message from a worker: 0 sent, -1 a socket error. It waits
 * while the parent's queue is full (that time added to t->blocked_ns; no
 * clock is read when it need not wait) and exits the worker when the
 * parent is gone. */
static int s_child_send(tp_wire_msg_t *msg, void *sock, pid_t parent, int index,
                        s_child_time_t *t) {
    uint64_t t0 = 0, *blocked_ns = &t->blocked_ns;
    for (;;) {
        if (t0) {
            /* waiting on a full queue: a due report takes the first free
             * place, so a worker the trainer keeps waiting still reports */
            uint64_t now = tp_now_ns();
            if (now - t->reported_ns >= 500000000ull) {
                *blocked_ns += now - t0;
                t0 = now;
                s_child_report_at(sock, index, t, now);
            }
        }
        tp_status_t rc = tp_wire_msg_send(msg, sock, ZMQ_DONTWAIT);
        if (rc == TP_OK) {
            if (t0)
                *blocked_ns += tp_now_ns() - t0;
            return 0;
        }
        if (rc != TP_ERR_TIMEOUT)
            return -1;
        if (getppid() != parent)
            _exit(1);
        if (!t0)
            t0 = tp_now_ns();
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLOUT, 0};
        zmq_poll(&it, 1, 200);
    }
}

/* Have the zygote fork worker `i`. Its generation (how many times the slot
 * started before) travels in the request: the zygote's copy of the pool is
 * the one of reset_state, and the worker's stream and endpoints depend on
 * it, exactly as if the parent had forked it. */
static tp_status_t s_spawn(s_pool_t *p, int i) {
    s_worker_t *w = &p->workers[i];
    pid_t pid;
    TP_TRY(df_zygote_spawn(p->zygote, i, w->gen, &pid));
    __atomic_store_n(&w->pid, pid, __ATOMIC_RELAXED);  /* read by any thread */
    w->gen++;
    w->inflight = 0;
    TP_DEBUG("%s: worker %d started (pid %d)", p->what, i, (int)pid);
    return TP_OK;
}

/* Fork the zygote (the process is still single-threaded: s_pool_prepare
 * checked) and have it fork every worker, each running fn(impl, ...): slot
 * index, gen its start count before (0 first), err_w and parent as in
 * df_zygote_fn. */
static tp_status_t s_pool_start(s_pool_t *p, df_zygote_fn fn, void *impl) {
    p->impl = impl;
    TP_TRY(df_zygote_new(p->what, p->nworkers, fn, impl, &p->zygote));
    for (int i = 0; i < p->nworkers; i++)
        TP_TRY(s_spawn(p, i));
    return TP_OK;
}

/* "exited with status 3", "killed by signal 9 (Killed)", plus the worker's
 * own error message when it wrote one. */
static void s_describe(int status, const char *msg, char *buf, size_t size) {
    if (WIFSIGNALED(status))
        snprintf(buf, size, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else if (WIFEXITED(status) && WEXITSTATUS(status) == WORKER_ERR_EXIT && msg[0])
        snprintf(buf, size, "failed: %s", msg);
    else if (WIFEXITED(status) && WEXITSTATUS(status) == WORKER_UNFIT_EXIT && msg[0])
        snprintf(buf, size, "made a first datapoint that does not fit: %s", msg);
    else if (WIFEXITED(status))
        snprintf(buf, size, "exited with status %d%s%s", WEXITSTATUS(status),
                 msg[0] ? ": " : "", msg);
    else
        snprintf(buf, size, "ended (wait status %d)", status);
}

typedef tp_status_t (*s_on_dead_fn)(void *impl, int i);

/* Take the zygote's news of dead workers (at most every 100 ms unless
 * forced). A dead one is restarted (pre_spawn runs before the new fork,
 * on_dead after) or reported. */
static tp_status_t s_check_workers(s_pool_t *p, int force, s_on_dead_fn pre_spawn,
                                   s_on_dead_fn on_dead) {
    uint64_t now = tp_now_ns();
    if (!force && now - p->last_check_ns < 100000000ull)
        return TP_OK;
    p->last_check_ns = now;
    df_zygote_exit_t e;
    int got;
    while ((got = df_zygote_reap(p->zygote, &e)) > 0) {
        int i = e.slot;
        if (i < 0 || i >= p->nworkers || p->workers[i].pid != e.pid)
            continue;  /* not a worker we count as running */
        char how[2300];
        s_describe(e.status, e.msg, how, sizeof how);
        __atomic_store_n(&p->workers[i].pid, 0, __ATOMIC_RELAXED);
        s_fold_counters(&p->workers[i]);
        int used = atomic_load(&p->restarts);
        if (WIFEXITED(e.status) && WEXITSTATUS(e.status) == WORKER_UNFIT_EXIT)
            return tp_error(TP_ERR_SHAPE, "%s: worker %d (pid %d) %s (every worker runs "
                            "this pipeline: it makes datapoints the model does not take; "
                            "not restarted)", p->what, i, (int)e.pid, how);
        if (p->opts.policy == TP_WORKER_RESTART && used < p->opts.max_restarts) {
            atomic_store(&p->restarts, ++used);
            atomic_fetch_add(&p->workers[i].restarts, 1);
            TP_WARN("%s: worker %d (pid %d) %s; restarting it (%d of %d)",
                    p->what, i, (int)e.pid, how, used, p->opts.max_restarts);
            if (pre_spawn)
                TP_TRY(pre_spawn(p->impl, i));
            TP_TRY(s_spawn(p, i));
            if (on_dead)
                TP_TRY(on_dead(p->impl, i));
            continue;
        }
        if (p->opts.policy == TP_WORKER_RESTART)
            return tp_error(TP_ERR_PEER,
                            "%s: worker %d (pid %d) %s (no restarts left: %d used)",
                            p->what, i, (int)e.pid, how, used);
        return tp_error(TP_ERR_PEER, "%s: worker %d (pid %d) %s", p->what, i,
                        (int)e.pid, how);
    }
    return got < 0 ? got : TP_OK;
}

/* Stop every worker and the zygote (it bounds the stop: SIGTERM, 1 s,
 * SIGKILL). */
static void s_pool_fini(s_pool_t *p) {
    df_zygote_destroy(&p->zygote);
    free(p->workers);
    p->workers = NULL;
    if (p->own_run_dir)
        tp_run_dir_remove(p->run_dir);
}

/* One poll slice of the parent: wait up to 100 ms; TP_ERR_INTERRUPTED on a
 * recorded signal or when the wait's phase (tp_actor_wait_tick: the actor
 * reading this dataflow, or the thread's own) says stop, TP_ERR_TIMEOUT
 * when opts.timeout_s ran out. */
static tp_status_t s_wait_slice(s_pool_t *p, void *sock, uint64_t since,
                                long slice_ms) {
    if (tp_signal_pending())
        return tp_error(TP_ERR_INTERRUPTED, "%s: interrupted by signal %d",
                        p->what, tp_signal_pending());
    if (tp_actor_wait_tick())
        return tp_error(TP_ERR_INTERRUPTED, "%s: the wait for the workers was ended: "
                        "the actor or trainer reading it is stopping", p->what);
    if (p->opts.timeout_s > 0 &&
        (double)(tp_now_ns() - since) * 1e-9 > p->opts.timeout_s)
        return tp_error(TP_ERR_TIMEOUT, "%s: no data from the workers for %.3g s",
                        p->what, p->opts.timeout_s);
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    zmq_poll(&it, 1, slice_ms);
    return TP_OK;
}

/* The RNG stream of the gen-th start of worker i: a replacement draws
 * fresh numbers rather than repeating its predecessor's. */
static uint64_t s_worker_stream(s_pool_t *p, int i, int gen) {
    uint64_t k = (uint64_t)gen * (uint64_t)p->nworkers + (uint64_t)i + 1;
    return p->stream * 0x9E3779B97F4A7C15ull + k;
}

/* ---- MultiProcessRunnerZMQ --------------------------------------------------------- */

typedef struct {
    s_pool_t pool;
    tp_dataflow_t *inner;
    char endpoint[300];
    zsock_t *pull;
    tp_wire_msg_t *msg;
    int64_t size, in_pass;
    tp_dataflow_t *self;  /* its own dataflow: the stages above it */
    /* what its datapoints must be (df_expect_for at reset_state; nexpect
     * 0: nothing known): each worker checks its first one */
    tp_wire_comp_t expect[TP_WIRE_COMPS_N];
    int nexpect;
    char expect_via[128];
} s_runner_t;

static void s_runner_child(void *impl, int index, int gen, int err_w, pid_t parent) {
    s_runner_t *r = impl;
    s_pool_t *p = &r->pool;
    void *zctx = zmq_ctx_new();
    void *push = zctx ? zmq_socket(zctx, ZMQ_PUSH) : NULL;
    if (!push)
        s_child_fail(err_w, "cannot make a ZeroMQ socket");
    int hwm = p->opts.hwm, linger = 2000, ivl = 10;
    zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    /* The parent binds just after the fork: retry the connect quickly. */
    zmq_setsockopt(push, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    if (zmq_connect(push, r->endpoint) < 0)
        s_child_fail(err_w, "connect %s: %s", r->endpoint, zmq_strerror(zmq_errno()));
    tp_status_t rc = tp_dataflow_reset_state(r->inner, p->seed,
                                             s_worker_stream(p, index, gen));
    if (rc < 0)
        s_child_fail(err_w, "%s", tp_last_error());
    tp_wire_msg_t *msg = tp_wire_msg_new();
    int64_t in_pass = 0;
    s_child_time_t time = {.start_ns = tp_now_ns(),
                           .skip0 = tp_image_skipped_in_process()};
    for (;;) {
        tp_datapoint_t *dp = NULL;
        rc = tp_dataflow_next(r->inner, &dp);
        if (rc == TP_DONE) {
            if (in_pass == 0)
                s_child_fail(err_w, "dataflow '%s' yielded an empty pass",
                             tp_dataflow_name(r->inner));
            in_pass = 0;
            continue;
        }
        if (rc < 0)
            s_child_fail(err_w, "%s", tp_last_error());
        char why[400];
        if (time.made == 0 && in_pass == 0 && r->nexpect &&
            tp_wire_comps_check(r->expect, r->nexpect, dp, why, sizeof why) < 0) {
            /* the same check a remote receiver makes, once: the pipeline
             * is the trainer's own, so a mismatch is a bug, named here */
            char want[TP_WIRE_COMPS_MAX];
            tp_wire_comps_format(r->expect, r->nexpect, want, sizeof want);
            char buf[1800];
            snprintf(buf, sizeof buf, "%s (the model takes %.900s%s%.120s)", why, want,
                     r->expect_via[0] ? " through " : "", r->expect_via);
            int n = (int)strlen(buf);
            if (write(err_w, buf, (size_t)n) < 0) {
                /* the exit status still tells */
            }
            _exit(WORKER_UNFIT_EXIT);
        }
        in_pass++;
        rc = tp_wire_encode(&dp, &p->wire, msg);
        if (rc < 0)
            s_child_fail(err_w, "%s", tp_last_error());
        time.bytes += tp_wire_msg_bytes(msg);
        if (s_child_send(msg, push, parent, index, &time) < 0)
            s_child_fail(err_w, "send to the parent: %s", tp_last_error());
        time.made++;
        s_child_report(push, index, &time);
    }
}

static tp_status_t s_runner_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                  uint64_t stream) {
    (void)rng;
    s_runner_t *r = impl;
    s_pool_t *p = &r->pool;
    if (r->pull)
        return tp_error(TP_ERR_STATE, "multiprocess: reset_state twice");
    TP_TRY(s_pool_prepare(p));
    TP_TRY(s_endpoint(p, r->endpoint, sizeof r->endpoint, "mp"));
    p->seed = seed;
    p->stream = stream;
    /* before the fork: the workers check their first datapoint */
    if (r->self)
        r->nexpect = df_expect_for(r->self, r->expect, TP_WIRE_COMPS_N, r->expect_via,
                                   sizeof r->expect_via);
    /* Fork first, while the process is still single-threaded; the workers
     * connect and wait for the bind below (ipc connects retry). */
    TP_TRY(s_pool_start(p, s_runner_child, r));
    tp_actors_init();
    r->pull = zsock_new(ZMQ_PULL);
    if (!r->pull)
        return tp_error(TP_ERR_IO, "multiprocess: no socket");
    zsock_set_rcvhwm(r->pull, p->opts.hwm);
    zsock_set_linger(r->pull, 0);
    if (zsock_bind(r->pull, "%s", r->endpoint) < 0)
        return tp_error(TP_ERR_IO, "multiprocess: bind %s: %s", r->endpoint,
                        zmq_strerror(zmq_errno()));
    tp_ipc_restrict(r->endpoint);  /* also in a caller's run_dir */
    r->msg = tp_wire_msg_new();
    if (!r->msg)
        return tp_error(TP_ERR_NOMEM, "multiprocess");
    r->size = tp_dataflow_size(r->inner);
    return TP_OK;
}

static tp_status_t s_runner_begin(void *impl) {
    ((s_runner_t *)impl)->in_pass = 0;
    return TP_OK;
}

static tp_status_t s_runner_next(void *impl, tp_datapoint_t **out) {
    s_runner_t *r = impl;
    s_pool_t *p = &r->pool;
    if (r->size >= 0 && r->in_pass >= r->size)
        return TP_DONE;
    void *sock = zsock_resolve(r->pull);
    uint64_t since = tp_now_ns();
    if (tp_signal_pending())  /* also while data flows */
        return tp_error(TP_ERR_INTERRUPTED, "multiprocess: interrupted by signal %d",
                        tp_signal_pending());
    for (;;) {
        TP_TRY(s_check_workers(p, 0, NULL, NULL));
        tp_status_t rc = tp_wire_msg_recv(r->msg, sock, ZMQ_DONTWAIT);
        if (rc == TP_OK && s_take_report_msg(p, r->msg))
            continue;
        if (rc == TP_OK) {
            rc = tp_wire_decode(r->msg, &p->wire, out);
            if (rc < 0)  /* our own workers: a bad message is a bug, say so */
                return tp_error_wrap(rc, "multiprocess: from a worker");
            r->in_pass++;
            return TP_OK;
        }
        if (rc != TP_ERR_TIMEOUT)
            return tp_error_wrap(rc, "multiprocess: receive");
        rc = s_wait_slice(p, sock, since, 100);
        if (rc < 0) {
            /* A worker that died is the better explanation of silence. */
            tp_status_t dead = s_check_workers(p, 1, NULL, NULL);
            return dead < 0 ? dead : rc;
        }
    }
}

static int64_t s_runner_size(void *impl) {
    return tp_dataflow_size(((s_runner_t *)impl)->inner);
}

static void s_runner_destroy(void *impl) {
    s_runner_t *r = impl;
    s_pool_fini(&r->pool);
    zsock_destroy(&r->pull);
    if (r->endpoint[0])
        unlink(r->endpoint + 6);
    if (r->pool.own_run_dir)
        rmdir(r->pool.run_dir);
    tp_wire_msg_destroy(&r->msg);
    tp_dataflow_destroy(&r->inner);
    free(r);
}

static const tp_dataflow_ops_t s_runner_ops = {
    .name = "multiprocess", .reset_state = s_runner_reset, .begin = s_runner_begin,
    .next = s_runner_next, .size = s_runner_size, .destroy = s_runner_destroy};

tp_dataflow_t *tp_df_multiprocess(tp_dataflow_t *inner, int nworkers,
                                  const tp_mp_opts_t *opts) {
    if (!inner) {
        tp_error(TP_ERR_INVALID, "multiprocess: no dataflow to run");
        return NULL;
    }
    s_runner_t *r = calloc(1, sizeof *r);
    if (!r) {
        tp_dataflow_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "multiprocess");
        return NULL;
    }
    r->inner = inner;
    if (s_pool_init(&r->pool, "multiprocess", nworkers, opts) < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", tp_last_error());
        s_runner_destroy(r);
        tp_error(TP_ERR_INVALID, "%s", msg);
        return NULL;
    }
    tp_dataflow_t *df = tp_dataflow_new(&s_runner_ops, r);
    if (df)  /* (on failure the base destroyed r) */
        r->self = df;
    return df;
}

/* ---- MultiProcessMapDataZMQ ---------------------------------------------------------- */

/* First frame of every task and result: which datapoint it is. */
typedef struct {
    uint64_t seq;
    uint32_t flags;  /* result: 1 = dropped by the map function */
    uint32_t magic;
} s_seq_t;
#define SEQ_MAGIC 0x31514553u /* "SEQ1" */

typedef struct {
    int state;            /* 0 free, 1 at a worker, 2 result here, 3 pending */
    tp_datapoint_t *pending; /* state 3: waiting for a worker to take it */
    int worker;
    uint64_t seq;
    tp_datapoint_t *copy;   /* restart policy: the input, to redo */
    tp_datapoint_t *result; /* NULL with state 2: dropped */
} s_task_t;

typedef struct {
    s_pool_t pool;
    tp_dataflow_t *inner;
    tp_map_fn fn;
    void *arg;
    int strict;
    char task_ep_fmt[300];
    char result_ep[300];
    zsock_t **task;       /* one PUSH per worker */
    int *slot_gen;        /* task socket generation per worker slot */
    zsock_t *results;
    tp_wire_msg_t *msg;
    s_task_t *tasks;      /* buffer_size slots, by seq % buffer_size */
    int cap;
    uint64_t next_seq;    /* next task number */
    uint64_t deliver;     /* strict: next seq to hand out */
    uint64_t discard_below; /* results of seqs below this belong to an
                               abandoned pass: dropped as they come back */
    int inflight;         /* tasks at workers or results waiting */
    int inner_done;       /* strict: inner's pass is over */
    int64_t size, in_pass, inner_in_pass;
    int started;
} s_map_t;

/* Worker i's task socket of generation gen (slot_gen[i] in the parent,
 * the gen it was started with in the worker). */
static void s_task_ep(s_map_t *m, int i, int gen, char *out, size_t size) {
    snprintf(out, size, m->task_ep_fmt, i, gen);
}

static tp_status_t s_bind_task(s_map_t *m, int i) {
    char ep[320];
    s_task_ep(m, i, m->slot_gen[i], ep, sizeof ep);
    m->task[i] = zsock_new(ZMQ_PUSH);
    if (!m->task[i])
        return tp_error(TP_ERR_IO, "multiprocess-map: no socket");
    /* Tasks never wait on a socket: the buffer bounds what is out. */
    zsock_set_sndhwm(m->task[i], m->cap + 1);
    zsock_set_linger(m->task[i], 0);
    if (zsock_bind(m->task[i], "%s", ep) < 0)
        return tp_error(TP_ERR_IO, "multiprocess-map: bind %s: %s", ep,
                        zmq_strerror(zmq_errno()));
    tp_ipc_restrict(ep);
    return TP_OK;
}

/* Before a worker slot is refilled: a fresh task socket at a new address.
 * What was queued for the dead worker dies with the old socket, so a task
 * redone below can only reach the new worker (or another live one). */
static tp_status_t s_map_rebind(void *impl, int i) {
    s_map_t *m = impl;
    char ep[320];
    s_task_ep(m, i, m->slot_gen[i], ep, sizeof ep);
    zsock_destroy(&m->task[i]);
    unlink(ep + 6);
    m->slot_gen[i]++;
    /* the new worker computes this address from the gen it is started with */
    TP_ASSERT(m->slot_gen[i] == m->pool.workers[i].gen);
    return s_bind_task(m, i);
}

static void s_map_child(void *impl, int index, int gen, int err_w, pid_t parent) {
    s_map_t *m = impl;
    s_pool_t *p = &m->pool;
    char ep[320];
    s_task_ep(m, index, gen, ep, sizeof ep);
    void *zctx = zmq_ctx_new();
    void *pull = zctx ? zmq_socket(zctx, ZMQ_PULL) : NULL;
    void *push = zctx ? zmq_socket(zctx, ZMQ_PUSH) : NULL;
    if (!pull || !push)
        s_child_fail(err_w, "cannot make ZeroMQ sockets");
    int hwm = p->opts.hwm, linger = 2000, zero = 0, ivl = 10;
    zmq_setsockopt(pull, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(push, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(pull, ep) < 0 || zmq_connect(push, m->result_ep) < 0)
        s_child_fail(err_w, "connect: %s", zmq_strerror(zmq_errno()));
    tp_wire_msg_t *msg = tp_wire_msg_new();
    s_child_time_t time = {.start_ns = tp_now_ns(),
                           .skip0 = tp_image_skipped_in_process()};
    for (;;) {
        zmq_pollitem_t it = {pull, 0, ZMQ_POLLIN, 0};
        uint64_t w0 = tp_now_ns();
        int ready = zmq_poll(&it, 1, 200);
        time.starved_ns += tp_now_ns() - w0;  /* waiting for a task */
        if (ready <= 0) {
            if (getppid() != parent)
                _exit(1);
            continue;
        }
        s_seq_t seq;
        int n = zmq_recv(pull, &seq, sizeof seq, 0);
        int more = 0;
        size_t ms = sizeof more;
        zmq_getsockopt(pull, ZMQ_RCVMORE, &more, &ms);
        if (n != (int)sizeof seq || seq.magic != SEQ_MAGIC || !more)
            s_child_fail(err_w, "malformed task from the parent");
        tp_datapoint_t *dp = NULL;
        tp_status_t rc = tp_wire_msg_recv(msg, pull, 0);
        if (rc == TP_OK)
            rc = tp_wire_decode(msg, &p->wire, &dp);
        if (rc < 0)
            s_child_fail(err_w, "task %llu: %s", (unsigned long long)seq.seq,
                         tp_last_error());
        rc = m->fn(m->arg, &dp);
        if (rc < 0) {
            tp_datapoint_destroy(&dp);
            s_child_fail(err_w, "map function on datapoint %llu: %s",
                         (unsigned long long)seq.seq, tp_last_error());
        }
        seq.flags = dp ? 0 : 1;
        if (dp && (rc = tp_wire_encode(&dp, &p->wire, msg)) < 0)
            s_child_fail(err_w, "%s", tp_last_error());
        time.bytes += seq.flags == 0 ? tp_wire_msg_bytes(msg) : 0;
        time.made++;
        while (zmq_send(push, &seq, sizeof seq, seq.flags == 0 ? ZMQ_SNDMORE : 0) < 0) {
            if (getppid() != parent)
                _exit(1);
        }
        if (seq.flags == 0 && s_child_send(msg, push, parent, index, &time) < 0)
            s_child_fail(err_w, "send to the parent: %s", tp_last_error());
        s_child_report(push, index, &time);
    }
}

/* Send task t to the least-loaded live worker that can take it now. When
 * none can (workers still connecting, or all full), the datapoint waits in
 * the task as pending and s_map_fill retries it. Never blocks: a PUSH with
 * no live peer would block a plain send forever. */
static tp_status_t s_dispatch(s_map_t *m, s_task_t *t, tp_datapoint_t **dp_p) {
    s_pool_t *p = &m->pool;
    int tried[p->nworkers];
    memset(tried, 0, sizeof tried);
    for (;;) {
        int best = -1;
        for (int i = 0; i < p->nworkers; i++)
            if (!tried[i] && p->workers[i].pid > 0 &&
                (best < 0 || p->workers[i].inflight < p->workers[best].inflight))
                best = i;
        if (best < 0)
            break;
        tried[best] = 1;
        void *sock = zsock_resolve(m->task[best]);
        uint32_t events = 0;
        size_t es = sizeof events;
        if (zmq_getsockopt(sock, ZMQ_EVENTS, &events, &es) < 0 ||
            !(events & ZMQ_POLLOUT))
            continue;
        s_seq_t seq = {t->seq, 0, SEQ_MAGIC};
        /* ZMQ_EVENTS can be stale: a worker that has just died drops its
         * pipe in between, and the send finds no peer (EAGAIN). Nothing
         * went: try another. So the header goes before the datapoint is
         * encoded (which takes it). */
        if (zmq_send(sock, &seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
            if (zmq_errno() == EAGAIN)
                continue;
            return tp_error(TP_ERR_IO, "multiprocess-map: send to worker %d: %s",
                            best, zmq_strerror(zmq_errno()));
        }
        /* The first frame went: the rest of the message always does (an
         * encoding failure leaves it half sent, but fails the dataflow). */
        TP_TRY(tp_wire_encode(dp_p, &p->wire, m->msg));
        TP_TRY(tp_wire_msg_send(m->msg, sock, 0));
        t->worker = best;
        t->state = 1;
        p->workers[best].inflight++;
        return TP_OK;
    }
    t->state = 3;
    t->pending = *dp_p;
    *dp_p = NULL;
    return TP_OK;
}

/* Retry every pending task. */
static tp_status_t s_map_retry(s_map_t *m) {
    for (int k = 0; k < m->cap; k++) {
        s_task_t *t = &m->tasks[k];
        if (t->state != 3)
            continue;
        tp_datapoint_t *dp = t->pending;
        t->pending = NULL;
        TP_TRY(s_dispatch(m, t, &dp));
        if (t->state == 3)
            break;  /* nobody can take work now */
    }
    return TP_OK;
}

/* A worker died and was restarted: redo its share. */
static tp_status_t s_map_on_dead(void *impl, int i) {
    s_map_t *m = impl;
    for (int k = 0; k < m->cap; k++) {
        s_task_t *t = &m->tasks[k];
        if (t->state != 1 || t->worker != i)
            continue;
        if (!t->copy)
            return tp_error(TP_ERR_PEER, "multiprocess-map: lost datapoint %llu",
                            (unsigned long long)t->seq);
        tp_datapoint_t *dp = tp_datapoint_copy(t->copy);
        if (!dp)
            return tp_error(TP_ERR_NOMEM, "multiprocess-map: redo");
        TP_TRY(s_dispatch(m, t, &dp));
    }
    return TP_OK;
}

static tp_status_t s_map_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                               uint64_t stream) {
    (void)rng;
    s_map_t *m = impl;
    s_pool_t *p = &m->pool;
    if (m->started)
        return tp_error(TP_ERR_STATE, "multiprocess-map: reset_state twice");
    m->started = 1;
    TP_TRY(s_pool_prepare(p));
    TP_TRY(s_endpoint(p, m->result_ep, sizeof m->result_ep, "map-out"));
    int n = snprintf(m->task_ep_fmt, sizeof m->task_ep_fmt,
                     "ipc://%s/map-in-%d-%%d-%%d.sock", p->run_dir, (int)p->parent);
    if (n < 0 || (size_t)n >= sizeof m->task_ep_fmt || strlen(m->task_ep_fmt) > 100)
        return tp_error(TP_ERR_INVALID, "multiprocess-map: run dir path too long");
    p->seed = seed;
    p->stream = stream;
    m->slot_gen = calloc((size_t)p->nworkers, sizeof *m->slot_gen);
    if (!m->slot_gen)
        return tp_error(TP_ERR_NOMEM, "multiprocess-map");
    TP_TRY(s_pool_start(p, s_map_child, m));
    /* The parent iterates inner: reset it after the fork, so that a thread
     * it may start never exists in a worker. */
    TP_TRY(tp_dataflow_reset_state(m->inner, seed, stream));
    tp_actors_init();
    m->task = calloc((size_t)p->nworkers, sizeof *m->task);
    m->cap = p->opts.buffer_size;
    m->tasks = calloc((size_t)m->cap, sizeof *m->tasks);
    m->msg = tp_wire_msg_new();
    m->results = zsock_new(ZMQ_PULL);
    if (!m->task || !m->tasks || !m->msg || !m->results)
        return tp_error(TP_ERR_NOMEM, "multiprocess-map");
    zsock_set_rcvhwm(m->results, p->opts.hwm);
    zsock_set_linger(m->results, 0);
    if (zsock_bind(m->results, "%s", m->result_ep) < 0)
        return tp_error(TP_ERR_IO, "multiprocess-map: bind %s: %s", m->result_ep,
                        zmq_strerror(zmq_errno()));
    tp_ipc_restrict(m->result_ep);
    for (int i = 0; i < p->nworkers; i++)
        TP_TRY(s_bind_task(m, i));
    m->size = tp_dataflow_size(m->inner);
    return TP_OK;
}

static tp_status_t s_map_begin(void *impl) {
    s_map_t *m = impl;
    m->in_pass = 0;
    m->inner_done = 0;
    return TP_OK;
}

/* Keep the buffer full from inner. */
static tp_status_t s_map_fill(s_map_t *m) {
    TP_TRY(s_map_retry(m));
    while (!m->inner_done) {
        /* strict: slots are by sequence, the window starts at deliver */
        if (m->strict ? m->next_seq >= m->deliver + (uint64_t)m->cap
                      : m->inflight >= m->cap)
            break;
        /* strict: a slot may still wait for a result of an abandoned pass */
        if (m->strict && m->tasks[m->next_seq % (uint64_t)m->cap].state != 0)
            break;
        tp_datapoint_t *dp = NULL;
        tp_status_t rc = tp_dataflow_next(m->inner, &dp);
        if (rc == TP_DONE) {
            if (m->strict) {
                m->inner_done = 1;
                break;
            }
            if (m->inner_in_pass == 0)
                return tp_error(TP_ERR_STATE,
                                "multiprocess-map: dataflow '%s' yielded an empty pass",
                                tp_dataflow_name(m->inner));
            m->inner_in_pass = 0;
            continue;
        }
        if (rc < 0)
            return tp_error_wrap(rc, "multiprocess-map: reading the input");
        m->inner_in_pass++;
        s_task_t *t = NULL;
        if (m->strict) {
            t = &m->tasks[m->next_seq % (uint64_t)m->cap];
        } else {
            for (int k = 0; k < m->cap && !t; k++) {
                s_task_t *c = &m->tasks[(m->next_seq + (uint64_t)k) % (uint64_t)m->cap];
                if (c->state == 0)
                    t = c;
            }
        }
        TP_ASSERT(t && t->state == 0);
        t->seq = m->next_seq++;
        if (m->pool.opts.policy == TP_WORKER_RESTART) {
            t->copy = tp_datapoint_copy(dp);
            if (!t->copy) {
                tp_datapoint_destroy(&dp);
                return tp_error(TP_ERR_NOMEM, "multiprocess-map: copy");
            }
        }
        m->inflight++;
        TP_TRY(s_dispatch(m, t, &dp));
    }
    return TP_OK;
}

static s_task_t *s_find(s_map_t *m, uint64_t seq) {
    if (m->strict) {
        s_task_t *t = &m->tasks[seq % (uint64_t)m->cap];
        return t->state && t->seq == seq ? t : NULL;
    }
    for (int k = 0; k < m->cap; k++)
        if (m->tasks[k].state && m->tasks[k].seq == seq)
            return &m->tasks[k];
    return NULL;
}

/* Take one result off the socket into its slot (1), nothing there (0). */
static tp_status_t s_map_take(s_map_t *m, s_task_t **done) {
    void *sock = zsock_resolve(m->results);
    *done = NULL;
    /* The first frame: a result's header, or a worker's report (skipped
     * here, kept for the workers' row). */
    union {
        s_seq_t seq;
        uint8_t ctl[TP_CTL_HEADER + 96];
    } head;
    int n, more;
    for (;;) {
        n = zmq_recv(sock, &head, sizeof head, ZMQ_DONTWAIT);
        if (n < 0)
            return TP_OK;
        more = 0;
        size_t ms = sizeof more;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ms);
        if (more || n > (int)sizeof head ||
            !s_take_report(&m->pool, head.ctl, (size_t)n))
            break;
    }
    s_seq_t seq = head.seq;
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = TP_OK;
    if (more) {
        rc = tp_wire_msg_recv(m->msg, sock, 0);
        if (rc == TP_OK)
            rc = tp_wire_decode(m->msg, &m->pool.wire, &dp);
    }
    if (rc < 0 || n != (int)sizeof seq || seq.magic != SEQ_MAGIC ||
        (!more && seq.flags != 1))
        return tp_error(TP_ERR_PROTOCOL, "multiprocess-map: malformed result "
                        "from a worker: %s", rc < 0 ? tp_last_error() : "bad header");
    s_task_t *t = s_find(m, seq.seq);
    if (!t || t->state != 1) {  /* a duplicate of redone work */
        tp_datapoint_destroy(&dp);
        return TP_OK;
    }
    if (seq.seq < m->discard_below) {  /* from an abandoned pass */
        if (m->pool.workers[t->worker].inflight > 0)
            m->pool.workers[t->worker].inflight--;
        tp_datapoint_destroy(&t->copy);
        tp_datapoint_destroy(&dp);
        t->state = 0;
        m->inflight--;
        return TP_OK;
    }
    if (m->pool.workers[t->worker].inflight > 0)
        m->pool.workers[t->worker].inflight--;
    tp_datapoint_destroy(&t->copy);
    t->state = 2;
    t->result = dp;
    *done = t;
    return TP_OK;
}

static tp_status_t s_map_next(void *impl, tp_datapoint_t **out) {
    s_map_t *m = impl;
    s_pool_t *p = &m->pool;
    if (!m->strict && m->size >= 0 && m->in_pass >= m->size)
        return TP_DONE;
    uint64_t since = tp_now_ns();
    if (tp_signal_pending())  /* also while data flows */
        return tp_error(TP_ERR_INTERRUPTED, "multiprocess-map: interrupted by signal %d",
                        tp_signal_pending());
    for (;;) {
        /* Every call looks (at most every 100 ms): a dead worker is seen
         * while the others keep the results flowing. */
        TP_TRY(s_check_workers(p, 0, s_map_rebind, s_map_on_dead));
        TP_TRY(s_map_fill(m));
        /* strict: hand out in order, skipping dropped ones */
        if (m->strict) {
            for (;;) {
                s_task_t *t = &m->tasks[m->deliver % (uint64_t)m->cap];
                if (m->deliver >= m->next_seq || t->state != 2 || t->seq != m->deliver)
                    break;
                tp_datapoint_t *dp = t->result;
                t->result = NULL;
                t->state = 0;
                m->deliver++;
                m->inflight--;
                if (dp) {
                    *out = dp;
                    m->in_pass++;
                    return TP_OK;
                }
            }
            if (m->inner_done && m->deliver == m->next_seq)
                return TP_DONE;
        }
        s_task_t *t;
        TP_TRY(s_map_take(m, &t));
        if (t) {
            if (!m->strict) {
                tp_datapoint_t *dp = t->result;
                t->result = NULL;
                t->state = 0;
                m->inflight--;
                if (dp) {
                    *out = dp;
                    m->in_pass++;
                    return TP_OK;
                }
            }
            since = tp_now_ns();
            continue;
        }
        int pending = 0;
        for (int k = 0; k < m->cap && !pending; k++)
            pending = m->tasks[k].state == 3;
        /* Pending work waits for a worker to connect: look again soon. */
        tp_status_t rc = s_wait_slice(p, zsock_resolve(m->results), since,
                                      pending ? 2 : 100);
        if (rc < 0) {
            tp_status_t dead = s_check_workers(p, 1, s_map_rebind, s_map_on_dead);
            return dead < 0 ? dead : rc;
        }
    }
}

/* The consumer abandoned the pass. Strict: what is in flight belongs to
 * it; results still here are dropped now, the rest as they come back, and
 * the next pass starts a fresh pass of inner. Not strict: the stream goes
 * on (a pass is only a count). */
static void s_map_end_pass(void *impl) {
    s_map_t *m = impl;
    m->in_pass = 0;
    if (!m->strict || !m->tasks)
        return;
    for (int k = 0; k < m->cap; k++) {
        s_task_t *t = &m->tasks[k];
        if (t->state == 2 || t->state == 3) {
            tp_datapoint_destroy(&t->result);
            tp_datapoint_destroy(&t->pending);
            tp_datapoint_destroy(&t->copy);
            t->state = 0;
            m->inflight--;
        }
    }
    m->discard_below = m->next_seq;
    m->deliver = m->next_seq;
    m->inner_done = 0;
    tp_dataflow_end_pass(m->inner);
}

static int64_t s_map_size(void *impl) {
    return tp_dataflow_size(((s_map_t *)impl)->inner);
}

static void s_map_destroy(void *impl) {
    s_map_t *m = impl;
    s_pool_fini(&m->pool);
    if (m->task) {
        for (int i = 0; i < m->pool.nworkers; i++) {
            if (m->task[i]) {
                char ep[320];
                s_task_ep(m, i, m->slot_gen[i], ep, sizeof ep);
                zsock_destroy(&m->task[i]);
                unlink(ep + 6);
            }
        }
        free(m->task);
    }
    free(m->slot_gen);
    if (m->results) {
        zsock_destroy(&m->results);
        unlink(m->result_ep + 6);
    }
    if (m->pool.own_run_dir)
        rmdir(m->pool.run_dir);
    for (int k = 0; m->tasks && k < m->cap; k++) {
        tp_datapoint_destroy(&m->tasks[k].copy);
        tp_datapoint_destroy(&m->tasks[k].result);
        tp_datapoint_destroy(&m->tasks[k].pending);
    }
    free(m->tasks);
    tp_wire_msg_destroy(&m->msg);
    tp_dataflow_destroy(&m->inner);
    free(m);
}

static const tp_dataflow_ops_t s_map_ops = {
    .name = "multiprocess-map", .reset_state = s_map_reset, .begin = s_map_begin,
    .next = s_map_next, .size = s_map_size, .destroy = s_map_destroy,
    .end_pass = s_map_end_pass};

tp_dataflow_t *tp_df_multiprocess_map(tp_dataflow_t *inner, int nworkers,
                                      tp_map_fn fn, void *arg, int strict,
                                      const tp_mp_opts_t *opts) {
    if (!inner || !fn) {
        tp_dataflow_destroy(&inner);
        tp_error(TP_ERR_INVALID, "multiprocess-map: needs a dataflow and a map function");
        return NULL;
    }
    s_map_t *m = calloc(1, sizeof *m);
    if (!m) {
        tp_dataflow_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "multiprocess-map");
        return NULL;
    }
    m->inner = inner;
    m->fn = fn;
    m->arg = arg;
    m->strict = strict;
    if (s_pool_init(&m->pool, "multiprocess-map", nworkers, opts) < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", tp_last_error());
        s_map_destroy(m);
        tp_error(TP_ERR_INVALID, "%s", msg);
        return NULL;
    }
    return tp_dataflow_new(&s_map_ops, m);
}

/* The worker pool behind `df`, recognised by its ops table (never by its
 * name); NULL for another kind. */
static s_pool_t *s_pool_of(tp_dataflow_t *df) {
    if (!df)
        return NULL;
    if (tp_dataflow_ops(df) == &s_runner_ops)
        return &((s_runner_t *)tp_dataflow_impl(df))->pool;
    if (tp_dataflow_ops(df) == &s_map_ops)
        return &((s_map_t *)tp_dataflow_impl(df))->pool;
    return NULL;
}

/* df_visit: add up the restarts of the pools found; -1 until one is. */
static void s_add_restarts(tp_dataflow_t *df, void *arg) {
    s_pool_t *p = s_pool_of(df);
    int *sum = arg;
    if (p)
        *sum = (*sum < 0 ? 0 : *sum) + atomic_load(&p->restarts);
}

int tp_df_multiprocess_restarts(tp_dataflow_t *df) {
    int sum = -1;
    df_visit(df, s_add_restarts, &sum);
    return sum;
}

/* df_visit: an image source's own count (iterated in this process), or a
 * pool's largest worker count (each worker reads the whole source); -1
 * until one of them is found. */
static void s_add_skipped(tp_dataflow_t *df, void *arg) {
    int64_t *sum = arg, n = tp_df_image_skipped(df);
    s_pool_t *p = n < 0 ? s_pool_of(df) : NULL;
    for (int i = 0; p && i < p->nworkers; i++) {  /* stored plus 1 */
        int64_t w = (int64_t)atomic_load_explicit(&p->workers[i].skipped,
                                                  memory_order_relaxed) - 1;
        n = w > n ? w : n;
    }
    if (n < 0)
        return;
    *sum = (*sum < 0 ? 0 : *sum) + n;
}

int64_t tp_df_skipped_files(tp_dataflow_t *df) {
    int64_t sum = -1;
    df_visit(df, s_add_skipped, &sum);
    return sum;
}

typedef struct {
    tp_stats_row_t *rows;
    int max, n;
} s_rows_t;

static double s_sum_s(atomic_uint_fast64_t *now, atomic_uint_fast64_t *base) {
    return (double)(atomic_load_explicit(now, memory_order_relaxed) +
                    atomic_load_explicit(base, memory_order_relaxed)) * 1e-9;
}

/* df_visit: one row per worker slot of every pool found: its process, its
 * restarts, and what its processes reported. */
static void s_add_rows(tp_dataflow_t *df, void *arg) {
    s_pool_t *p = s_pool_of(df);
    s_rows_t *a = arg;
    for (int i = 0; p && i < p->nworkers && a->n < a->max; i++) {
        s_worker_t *w = &p->workers[i];
        tp_stats_row_t *row = &a->rows[a->n];
        memset(row, 0, sizeof *row);
        unsigned long long sk = atomic_load_explicit(&w->skipped, memory_order_relaxed);
        sk = sk ? sk - 1 : 0;
        /* tp-top shows the bad files in the row's name (the wire has no
         * column for them); a name longer than a row's is cut short */
        char name[96];
        if (sk)
            snprintf(name, sizeof name, "dataflow worker %d, %llu bad files", a->n, sk);
        else
            snprintf(name, sizeof name, "dataflow worker %d", a->n);
        size_t nl = strnlen(name, sizeof row->name - 1);
        memcpy(row->name, name, nl);
        row->name[nl] = '\0';
        pid_t pid = __atomic_load_n(&w->pid, __ATOMIC_RELAXED);
        row->pid = pid > 0 ? (uint32_t)pid : 0;
        row->state = pid > 0 ? TP_ACTOR_RUNNING : TP_ACTOR_FAILED;
        row->restarts = (uint32_t)atomic_load(&w->restarts);
        row->msgs_out = atomic_load_explicit(&w->made, memory_order_relaxed) +
                        atomic_load_explicit(&w->base_made, memory_order_relaxed);
        row->bytes_out = atomic_load_explicit(&w->bytes, memory_order_relaxed) +
                         atomic_load_explicit(&w->base_bytes, memory_order_relaxed);
        row->busy_s = s_sum_s(&w->busy_ns, &w->base_busy_ns);
        row->blocked_s = s_sum_s(&w->blocked_ns, &w->base_blocked_ns);
        row->starved_s = s_sum_s(&w->starved_ns, &w->base_starved_ns);
        row->alive_s = p->start_ns ? (double)(tp_now_ns() - p->start_ns) * 1e-9 : 0;
        row->queue_fill = -1;
        a->n++;
    }
}

int tp_df_multiprocess_rows(tp_dataflow_t *df, tp_stats_row_t *rows, int max) {
    s_rows_t a = {rows, max, 0};
    df_visit(df, s_add_rows, &a);
    return a.n;
}

int tp_df_multiprocess_zygote(tp_dataflow_t *df) {
    s_pool_t *p = s_pool_of(df);
    return p ? (int)df_zygote_pid(p->zygote) : 0;
}

typedef struct {
    int *pids;
    int n, k;
} s_pids_t;

/* df_visit: the live workers' pids of every pool found. */
static void s_add_pids(tp_dataflow_t *df, void *arg) {
    s_pool_t *p = s_pool_of(df);
    s_pids_t *a = arg;
    for (int i = 0; p && i < p->nworkers && a->k < a->n; i++) {
        pid_t pid = __atomic_load_n(&p->workers[i].pid, __ATOMIC_RELAXED);
        if (pid > 0)
            a->pids[a->k++] = (int)pid;
    }
}

int tp_df_multiprocess_pids(tp_dataflow_t *df, int *pids, int n) {
    s_pids_t a = {pids, n, 0};
    df_visit(df, s_add_pids, &a);
    return a.k;
}

/* ---- pipeline spec: the stage `processes N [restart[=R]] [hwm=H] [lz4]` ------- */

#ifdef TP_HAVE_SPEC
static tp_status_t s_spec_processes(tp_dataflow_t *inner, const char *args,
                                    void *user, tp_dataflow_t **out) {
    (void)user;
    *out = NULL;
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", args ? args : "");
    char *save = NULL;
    int64_t n = -1;
    tp_status_t rc = TP_OK;
    for (char *t = strtok_r(buf, " \t,", &save); t && rc == TP_OK;
         t = strtok_r(NULL, " \t,", &save)) {
        int64_t v;
        if (n < 0) {
            rc = tp_spec_int(t, 1, 1024, "worker count", &n);
        } else if (!strcmp(t, "restart")) {
            o.policy = TP_WORKER_RESTART;
        } else if (!strncmp(t, "restart=", 8)) {
            o.policy = TP_WORKER_RESTART;
            if ((rc = tp_spec_int(t + 8, 0, 1000000, "restart", &v)) == TP_OK)
                o.max_restarts = (int)v;
        } else if (!strncmp(t, "hwm=", 4)) {
            if ((rc = tp_spec_int(t + 4, 1, 1000000, "hwm", &v)) == TP_OK)
                o.hwm = (int)v;
        } else if (!strcmp(t, "lz4")) {
            o.lz4 = 1;
        } else {
            rc = tp_error(TP_ERR_INVALID, "unknown option '%s' (expected "
                          "N [restart[=R]] [hwm=H] [lz4])", t);
        }
    }
    if (rc == TP_OK && n < 0)
        rc = tp_error(TP_ERR_INVALID, "needs a worker count (processes N)");
    if (rc < 0) {
        tp_dataflow_destroy(&inner);
        return rc;
    }
    *out = tp_df_multiprocess(inner, (int)n, &o);
    return *out ? TP_OK : TP_ERR_INVALID;
}

tp_status_t tp_df_process_spec_register(void);
tp_status_t tp_df_process_spec_register(void) {
    return tp_spec_register_stage("processes", s_spec_processes, NULL);
}
#endif
