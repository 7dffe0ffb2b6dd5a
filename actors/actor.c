/* towerpack actors: the actor runtime on czmq's zactor.
 *
 * The actor thread owns every data socket; the owner talks to it over the
 * zactor pipe with short control messages:
 *   owner -> actor   "$TERM" (end now, drop queued input), "STOP" (orderly
 *                    end), "STATS?" (send counters now)
 *   actor -> owner   "INIT" rc text (once, right after the ready signal),
 *                    "STATS" row (on request, and every report_ms when asked:
 *                    the supervisor's heartbeat), "EXIT" rc text row (last)
 * The data path never allocates per message beyond the datapoint: inproc
 * sends the pointer, ipc/tcp reuse one wire message per port.
 *
 * Time accounting costs two clock reads per wait, none per message: starved
 * and blocked are measured around the waits, busy is what remains. */
#include <czmq.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/membarrier.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/security.h>
#include <towerpack/wire.h>
#include "actors/actor_internal.h"

/* ---- process-wide bits ------------------------------------------------------ */

/* 1 when the process is registered for expedited private membarrier: the
 * inproc writers' fast path then needs no fence of its own (see s_link_t).
 * Not under ThreadSanitizer, which cannot see what membarrier orders. */
static int s_asym;

static void s_asym_register(void) {
#if defined(__SANITIZE_THREAD__) || !defined(SYS_membarrier)
    s_asym = 0;
#else
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    s_asym = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
             syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif
}

/* czmq caps a process at 1024 ZeroMQ sockets, and libzmq frees a closed
 * socket only later, on its reaper thread: actors made and destroyed quickly
 * on a loaded host left closed sockets waiting by the hundreds (392 seen),
 * and past the cap czmq's socket constructor aborts the process. Raise the
 * cap to libzmq's own limit (the open-file limit stays the real bound),
 * unless the application set ZSYS_MAX_SOCKETS: through that variable, which
 * czmq reads when its context starts (at the first socket), so that no
 * context is made here. One made this early would be inherited by every
 * forked child (the CUDA probe, dataflow workers), where czmq forgets it:
 * memory the child can no longer reach. libzmq's limit is read from a
 * context of its own, made and ended at once (no thread, no socket). */
static void s_raise_socket_cap(void) {
    if (getenv("ZSYS_MAX_SOCKETS"))
        return;
    void *ctx = zmq_ctx_new();
    if (!ctx)
        return;
    int limit = zmq_ctx_get(ctx, ZMQ_SOCKET_LIMIT);
    zmq_ctx_term(ctx);
    if (limit > 1024) {
        char v[32];
        snprintf(v, sizeof v, "%d", limit);
        setenv("ZSYS_MAX_SOCKETS", v, 0);
    }
}

static pthread_once_t s_init_once = PTHREAD_ONCE_INIT;
static void s_init(void) {
    /* Unless the application set ZSYS_SIGHANDLER itself, keep czmq's signal
     * handler out: it would swallow SIGINT without ending anything. */
    zsys_handler_set(NULL);
    s_raise_socket_cap();
    s_asym_register();
    pthread_atfork(NULL, NULL, s_asym_register);  /* a child registers anew */
}
void tp_actors_init(void) { pthread_once(&s_init_once, s_init); }

/* Fill of inproc links: each end publishes its message count every few
 * messages (not every one: the shared line would bounce per message), and
 * the reader reports (sent - received) / capacity.
 *
 * A pointer sent to a reader that closes its socket before reading it
 * would leak. A writer raises its flag, then sends only while `readers` >
 * 0; a closing reader lowers `readers`, waits until no writer's flag is up,
 * and frees what is queued: every pointer is either read or freed. Each
 * side writes, then reads the other's variable (Dekker): at least one
 * sees the other. The store-load order that needs costs the writer a full
 * fence per message, unless the process has expedited membarrier: then the
 * closing reader, which is rare, pays for both sides (membarrier makes
 * every running thread of the process pass a full fence) and the writer's
 * fast path is plain stores and loads. A writer's flag sits in a slot of
 * its own cache line; past S_SLOTS writers on one link, they share the
 * `sending` counter (atomic increments, always fenced). */
#define S_SLOTS 16
typedef struct {
    atomic_int busy;
    char pad[64 - sizeof(atomic_int)];
} s_slot_t;

typedef struct s_link {
    s_slot_t slot[S_SLOTS];  /* first: 64-byte aligned with the allocation */
    struct s_link *next;
    char name[256];
    int refs;
    unsigned slots_used;     /* bit per slot, under s_links_lock */
    atomic_int capacity;     /* set by the writer, read by the reader */
    atomic_uint_fast64_t sent;
    atomic_int sending;      /* writers without a slot, inside a send */
    atomic_int readers;
} s_link_t;

static pthread_mutex_t s_links_lock = PTHREAD_MUTEX_INITIALIZER;
static s_link_t *s_links;

static s_link_t *s_link_get(const char *name) {
    pthread_mutex_lock(&s_links_lock);
    s_link_t *l = s_links;
    while (l && strcmp(l->name, name))
        l = l->next;
    if (!l && (l = aligned_alloc(64, (sizeof *l + 63) / 64 * 64))) {
        memset(l, 0, sizeof *l);
        for (int i = 0; i < S_SLOTS; i++)
            atomic_init(&l->slot[i].busy, 0);
        snprintf(l->name, sizeof l->name, "%s", name);
        atomic_init(&l->sent, 0);
        atomic_init(&l->capacity, 0);
        atomic_init(&l->sending, 0);
        atomic_init(&l->readers, 0);
        l->next = s_links;
        s_links = l;
    }
    if (l)
        l->refs++;
    pthread_mutex_unlock(&s_links_lock);
    return l;
}

static void s_link_put(s_link_t **lp) {
    s_link_t *l = *lp;
    if (!l)
        return;
    *lp = NULL;
    pthread_mutex_lock(&s_links_lock);
    if (--l->refs == 0) {
        s_link_t **pp = &s_links;
        while (*pp != l)
            pp = &(*pp)->next;
        *pp = l->next;
        free(l);
    }
    pthread_mutex_unlock(&s_links_lock);
}

/* A writer's flag: a free slot of the link, or NULL (use `sending`). */
static atomic_int *s_slot_claim(s_link_t *l) {
    atomic_int *busy = NULL;
    pthread_mutex_lock(&s_links_lock);
    for (int i = 0; i < S_SLOTS && !busy; i++)
        if (!(l->slots_used & (1u << i))) {
            l->slots_used |= 1u << i;
            busy = &l->slot[i].busy;
        }
    pthread_mutex_unlock(&s_links_lock);
    return busy;
}

static void s_slot_release(s_link_t *l, atomic_int *busy) {
    if (!busy)
        return;
    pthread_mutex_lock(&s_links_lock);
    l->slots_used &= ~(1u << ((s_slot_t *)(void *)busy - l->slot));
    pthread_mutex_unlock(&s_links_lock);
}

/* The writer's side of the hand-shake (s_link_t): announce a send, then
 * read `readers`; after the send, withdraw. */
static inline int s_writer_enter(s_link_t *l, atomic_int *busy) {
    if (!busy) {
        atomic_fetch_add(&l->sending, 1);
        return atomic_load(&l->readers);
    }
    if (s_asym) {
        atomic_store_explicit(busy, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);  /* the compiler's order */
        return atomic_load_explicit(&l->readers, memory_order_relaxed);
    }
    atomic_store(busy, 1);
    return atomic_load(&l->readers);
}

static inline void s_writer_leave(s_link_t *l, atomic_int *busy) {
    if (busy)
        atomic_store_explicit(busy, 0, memory_order_release);
    else
        atomic_fetch_sub_explicit(&l->sending, 1, memory_order_release);
}

/* The reader's side, on closing: after this no writer is inside a send
 * that could still reach it. */
static void s_reader_leave(s_link_t *l) {
    atomic_fetch_sub(&l->readers, 1);
#if defined(SYS_membarrier)
    if (s_asym && syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
        TP_ERROR("actors: membarrier failed (%s): a pointer in flight may leak",
                 strerror(errno));
#endif
    /* A writer inside a send finishes within its 10 ms send timeout. */
    for (;;) {
        int busy = atomic_load(&l->sending) > 0;
        for (int i = 0; i < S_SLOTS && !busy; i++)
            busy = atomic_load(&l->slot[i].busy) != 0;
        if (!busy)
            break;
        sched_yield();
    }
}

/* ---- the actor thread's state ------------------------------------------------ */

typedef struct {
    const tp_actor_port_t *def;
    char name[32];
    zsock_t *zsock;
    void *sock;           /* raw libzmq socket */
    int inproc;           /* pointer passing */
    int output;
    int eos;              /* input: end-of-stream seen */
    s_link_t *link;       /* inproc: fill accounting, hand-shake */
    atomic_int *busy;     /* inproc output: its flag in the link, or NULL */
    uint64_t count;       /* messages through this port */
    tp_wire_msg_t *msg;   /* ipc/tcp: reused wire message */
    tp_wire_opts_t opts;
} s_port_t;

/* The actor's counters as of its last look at the pipe, for the owner to
 * read without a round trip (tp_actor_stats_recent): a sequence lock over
 * words stored with relaxed atomics (odd seq: being written). */
#define S_ROW_WORDS ((sizeof(tp_stats_row_t) + 7) / 8)
typedef struct {
    atomic_uint seq;
    _Atomic uint64_t words[S_ROW_WORDS];
} s_rowpub_t;

/* What the owner hands the thread; the thread frees it. */
typedef struct {
    const tp_actor_def_t *def;
    void *arg;
    int report_ms;
    atomic_uint *mail;
    atomic_int *asked;
    s_rowpub_t *pub;
} s_boot_t;

struct tp_actor_ctx {
    const tp_actor_def_t *def;
    void *pipe;                     /* raw socket of the zactor pipe */
    atomic_uint *mail;              /* the owner's count of commands sent */
    atomic_int *asked;              /* the owner sent STOP or $TERM */
    s_rowpub_t *pub;                /* where the counters are published */
    unsigned mail_seen;             /* ... as of the last look at the pipe */
    void *state;
    s_port_t in[TP_ACTOR_MAX_PORTS];
    s_port_t out[TP_ACTOR_MAX_PORTS];
    int nin, nout;
    int terminated;                 /* $TERM: drop and leave */
    int stopping;                   /* STOP: orderly end */
    int report_ms;
    uint64_t start_ns, last_report_ns;
    tp_stats_row_t row;             /* counters (rates unused) */
    uint64_t starved_ns, blocked_ns;
    uint64_t malformed;
    tp_ratelog_t ratelog;
};

static void s_fill_row(tp_actor_ctx_t *ctx, int state) {
    uint64_t now = tp_now_ns();
    tp_stats_row_t *r = &ctx->row;
    r->state = (uint8_t)state;
    r->alive_s = (double)(now - ctx->start_ns) * 1e-9;
    r->starved_s = (double)ctx->starved_ns * 1e-9;
    r->blocked_s = (double)ctx->blocked_ns * 1e-9;
    double busy = r->alive_s - r->starved_s - r->blocked_s;
    r->busy_s = busy > 0 ? busy : 0;
    /* The fullest inproc input speaks for the actor. */
    double fill = -1;
    for (int i = 0; i < ctx->nin; i++) {
        s_port_t *p = &ctx->in[i];
        int cap = p->link ? atomic_load_explicit(&p->link->capacity,
                                                 memory_order_relaxed) : 0;
        if (cap <= 0)
            continue;
        uint64_t sent = atomic_load_explicit(&p->link->sent, memory_order_relaxed);
        double f = sent > p->count ? (double)(sent - p->count) / cap : 0;
        if (f > 1)
            f = 1;
        if (f > fill)
            fill = f;
    }
    r->queue_fill = fill;
}

/* Only the actor's thread writes; readers retry while seq is odd or moved. */
static void s_publish_row(tp_actor_ctx_t *ctx) {
    s_rowpub_t *pub = ctx->pub;
    if (!pub)
        return;
    uint64_t w[S_ROW_WORDS] = {0};
    memcpy(w, &ctx->row, sizeof ctx->row);
    unsigned seq = atomic_load_explicit(&pub->seq, memory_order_relaxed);
    atomic_store_explicit(&pub->seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    for (size_t i = 0; i < S_ROW_WORDS; i++)
        atomic_store_explicit(&pub->words[i], w[i], memory_order_relaxed);
    atomic_store_explicit(&pub->seq, seq + 2, memory_order_release);
}

static void s_send_row(tp_actor_ctx_t *ctx, const char *kind, int state) {
    s_fill_row(ctx, state);
    s_publish_row(ctx);
    zmq_send(ctx->pipe, kind, strlen(kind), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ctx->pipe, &ctx->row, sizeof ctx->row, ZMQ_DONTWAIT);
}

/* Reports are the supervisor's heartbeat: due every report_ms. */
static inline void s_maybe_report(tp_actor_ctx_t *ctx, uint64_t now) {
    /* now may come from the coarse clock, a little behind the precise one */
    if (ctx->report_ms > 0 && now > ctx->last_report_ns &&
        now - ctx->last_report_ns >= (uint64_t)ctx->report_ms * 1000000ull) {
        ctx->last_report_ns = now;
        s_send_row(ctx, "STATS", ctx->stopping ? TP_ACTOR_STOPPING
                                               : TP_ACTOR_RUNNING);
    }
}

/* A cheap clock for "is a pipe check due" (coarse: a few ns, ~4 ms steps). */
static inline uint64_t s_coarse_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Is the 10 ms look at the pipe due? A loop going round fast reads the
 * clock only every `every` rounds (doubled while reads come less than 1 ms
 * apart, up to 16; halved when more than 4 ms apart), so a hop costs no
 * clock read; a slow loop reads it every round. Commands are seen at once
 * in any case (s_mail_waiting). *now: the coarse time when read, else 0. */
typedef struct {
    uint64_t last_check, last_read;
    int left, every;
} s_tick_t;

static inline void s_tick_init(s_tick_t *t) {
    t->last_check = t->last_read = s_coarse_ns();
    t->left = t->every = 1;
}

static inline int s_tick_due(s_tick_t *t, uint64_t *now) {
    *now = 0;
    if (--t->left > 0)
        return 0;
    uint64_t n = s_coarse_ns(), dt = n - t->last_read;
    t->last_read = n;
    if (dt < 1000000ull && t->every < 16)
        t->every *= 2;
    else if (dt > 4000000ull && t->every > 1)
        t->every /= 2;
    t->left = t->every;
    *now = n;
    if (n - t->last_check <= 10000000ull)
        return 0;
    t->last_check = n;
    return 1;
}

static void s_handle_pipe(tp_actor_ctx_t *ctx) {
    char cmd[16];
    int n = zmq_recv(ctx->pipe, cmd, sizeof cmd - 1, ZMQ_DONTWAIT);
    if (n < 0)
        return;
    if (n > (int)sizeof cmd - 1)
        n = sizeof cmd - 1;
    cmd[n] = '\0';
    /* Drop any further frames of an unexpected multipart command. */
    int more;
    size_t ms = sizeof more;
    while (zmq_getsockopt(ctx->pipe, ZMQ_RCVMORE, &more, &ms) == 0 && more) {
        char sink[64];
        zmq_recv(ctx->pipe, sink, sizeof sink, 0);
    }
    if (!strcmp(cmd, "$TERM"))
        ctx->terminated = 1;
    else if (!strcmp(cmd, "STOP"))
        ctx->stopping = 1;
    else if (!strcmp(cmd, "STATS?"))
        s_send_row(ctx, "STATS", ctx->stopping ? TP_ACTOR_STOPPING
                                               : TP_ACTOR_RUNNING);
}

/* Check the pipe without waiting. */
static void s_poll_pipe(tp_actor_ctx_t *ctx) {
    uint32_t events = 0;
    size_t es = sizeof events;
    if (ctx->mail)
        ctx->mail_seen = atomic_load_explicit(ctx->mail, memory_order_acquire);
    /* ZMQ_EVENTS is cheap next to zmq_poll and processes pending commands. */
    while (!ctx->terminated &&
           zmq_getsockopt(ctx->pipe, ZMQ_EVENTS, &events, &es) == 0 &&
           (events & ZMQ_POLLIN))
        s_handle_pipe(ctx);
    /* Every look at the pipe (at least every 10 ms) refreshes the counters
     * the owner reads without asking. */
    s_fill_row(ctx, ctx->stopping ? TP_ACTOR_STOPPING : TP_ACTOR_RUNNING);
    s_publish_row(ctx);
}

/* Has the owner sent a command since the last look at the pipe? One load,
 * where looking at the pipe costs system calls (libzmq polls its mailbox
 * and checks getpid): the loops look at the pipe when this says so, and
 * every 10 ms in any case (reports, and commands from elsewhere). */
static inline int s_mail_waiting(const tp_actor_ctx_t *ctx) {
    return ctx->mail &&
           atomic_load_explicit(ctx->mail, memory_order_acquire) != ctx->mail_seen;
}

/* The actor whose handlers run on this thread (NULL on other threads). */
static __thread tp_actor_ctx_t *s_current;

/* Has the owner asked the actor to stop or end? Set by the owner the moment
 * it sends STOP or $TERM, so a getter answers without reading the pipe. */
static inline int s_asked_to_stop(const tp_actor_ctx_t *ctx) {
    return ctx->stopping || ctx->terminated ||
           atomic_load_explicit(ctx->asked, memory_order_acquire);
}

int tp_actor_current_stopping(void) {
    const tp_actor_ctx_t *ctx = s_current;
    return ctx ? s_asked_to_stop(ctx) : 0;
}

/* The wait phase this thread's waits run (tp_actor_wait_begin). */
static __thread const tp_wait_phase_t *s_wait_phase;

const tp_wait_phase_t *tp_actor_wait_begin(const tp_wait_phase_t *phase) {
    const tp_wait_phase_t *previous = s_wait_phase;
    s_wait_phase = phase;
    return previous;
}

void tp_actor_wait_end(const tp_wait_phase_t *previous) { s_wait_phase = previous; }

int tp_actor_wait_tick(void) {
    tp_actor_ctx_t *ctx = s_current;
    int stop = 0;
    if (ctx) {
        /* a command (STATS? above all) is answered while the handler waits */
        if (s_mail_waiting(ctx))
            s_poll_pipe(ctx);
        stop = s_asked_to_stop(ctx);
    }
    const tp_wait_phase_t *phase = s_wait_phase;
    if (phase && phase->run(phase->arg))
        stop = 1;
    return stop;
}

/* ---- sockets ------------------------------------------------------------------ */

static tp_status_t s_open_port(s_port_t *p, const tp_actor_port_t *def,
                               int output, int index, const char *actor) {
    p->def = def;
    p->output = output;
    if (def->name)
        snprintf(p->name, sizeof p->name, "%s", def->name);
    else
        snprintf(p->name, sizeof p->name, "%s%d", output ? "out" : "in", index);
    if (!def->endpoint)
        return tp_error(TP_ERR_INVALID, "actor '%s': port %s has no endpoint",
                        actor, p->name);
    p->inproc = !strncmp(def->endpoint, "inproc://", 9);
    if (!p->inproc && strncmp(def->endpoint, "ipc://", 6) &&
        strncmp(def->endpoint, "tcp://", 6))
        return tp_error(TP_ERR_INVALID,
                        "actor '%s': port %s: endpoint '%s' is not inproc://, "
                        "ipc:// or tcp://", actor, p->name, def->endpoint);
    int hwm = def->hwm > 0 ? def->hwm : TP_ACTOR_DEFAULT_HWM;
    p->zsock = zsock_new(output ? ZMQ_PUSH : ZMQ_PULL);
    if (!p->zsock)
        return tp_error(TP_ERR_IO, "actor '%s': port %s: no socket", actor,
                        p->name);
    p->sock = zsock_resolve(p->zsock);
    zsock_set_sndhwm(p->zsock, hwm);
    zsock_set_rcvhwm(p->zsock, hwm);
    /* Outputs linger so end-of-stream reaches a live peer; inputs do not. */
    zsock_set_linger(p->zsock, output && !p->inproc ? 1000 : 0);
    int rc = def->bind ? zsock_bind(p->zsock, "%s", def->endpoint)
                       : zsock_connect(p->zsock, "%s", def->endpoint);
    /* libzmq releases an inproc name after its socket closes, on its own
     * thread: a pipeline rebuilt at once under the same names can find the
     * name still taken for a moment. Wait for it, briefly. */
    for (int tries = 0; rc < 0 && def->bind && p->inproc &&
                        zmq_errno() == EADDRINUSE && tries < 100; tries++) {
        zclock_sleep(2);
        rc = zsock_bind(p->zsock, "%s", def->endpoint);
    }
    if (rc < 0)
        return tp_error(TP_ERR_IO, "actor '%s': port %s: %s %s: %s", actor,
                        p->name, def->bind ? "bind" : "connect", def->endpoint,
                        zmq_strerror(zmq_errno()));
    if (def->bind)
        tp_ipc_restrict(def->endpoint);
    if (p->inproc) {
        /* Waits on a single inproc socket use a plain blocking call (as
         * cheap as raw libzmq), bounded so commands are still seen. */
        zsock_set_rcvtimeo(p->zsock, 10);
        zsock_set_sndtimeo(p->zsock, 10);
        p->link = s_link_get(def->endpoint);
        if (!p->link)
            return tp_error(TP_ERR_NOMEM, "actor '%s': port %s", actor, p->name);
        if (output) {
            atomic_store_explicit(&p->link->capacity, 2 * hwm, memory_order_relaxed);
            p->busy = s_slot_claim(p->link);
        } else {
            atomic_fetch_add(&p->link->readers, 1);
        }
    } else {
        p->msg = tp_wire_msg_new();
        if (!p->msg)
            return tp_error(TP_ERR_NOMEM, "actor '%s': port %s", actor, p->name);
        tp_wire_opts_init(&p->opts);
        p->opts.lz4 = def->lz4;
    }
    return TP_OK;
}

static void s_close_port(s_port_t *p) {
    if (p->inproc && !p->output && p->link && p->sock) {
        s_reader_leave(p->link);
        tp_datapoint_t *ptr;
        while (zmq_recv(p->sock, &ptr, sizeof ptr, ZMQ_DONTWAIT) == (int)sizeof ptr) {
            if (ptr)
                TP_HANDOFF_ACQUIRE(ptr);
            tp_datapoint_destroy(&ptr);
        }
    }
    int bound_ipc = p->zsock && p->def && p->def->bind && p->def->endpoint &&
                    !strncmp(p->def->endpoint, "ipc://", 6);
    /* Unbind before closing: libzmq frees a closed socket's endpoint later,
     * on its reaper thread, and a reader that connects to the same inproc
     * name in the meantime (the next actor of a pipeline made again in this
     * process) attaches to the dying socket and waits forever. zmq_unbind
     * takes the name back now. */
    if (p->zsock && p->sock && p->def && p->def->bind && p->def->endpoint)
        zmq_unbind(p->sock, p->def->endpoint);
    zsock_destroy(&p->zsock);
    /* libzmq 4.3 leaves the file of a named ipc socket behind (it only
     * cleans up wildcard ones): remove it, so that an ended actor leaves
     * nothing in the run directory. */
    if (bound_ipc)
        unlink(p->def->endpoint + 6);
    p->sock = NULL;
    if (p->link)
        s_slot_release(p->link, p->busy);
    p->busy = NULL;
    s_link_put(&p->link);
    tp_wire_msg_destroy(&p->msg);
}

/* Receive one message from input i without waiting. 1: *dp set (NULL for
 * end-of-stream), 0: nothing there, < 0: dropped (malformed), go on. */
static int s_recv(tp_actor_ctx_t *ctx, int i, tp_datapoint_t **dp, int flags) {
    s_port_t *p = &ctx->in[i];
    *dp = NULL;
    if (p->inproc) {
        tp_datapoint_t *ptr = NULL;
        int n = zmq_recv(p->sock, &ptr, sizeof ptr, flags);
        if (n < 0)
            return 0;
        if ((size_t)n != sizeof ptr) {
            ctx->malformed++;
            if (tp_ratelog_ok(&ctx->ratelog))
                TP_WARN("actor '%s': input %s: dropped a %d-byte message "
                        "(inproc ports carry 8-byte pointers)",
                        ctx->def->name, p->name, n);
            return -1;
        }
        p->count++;
        *dp = ptr;  /* NULL pointer: end-of-stream */
        if (ptr) {
            TP_HANDOFF_ACQUIRE(ptr);
            ctx->row.msgs_in++;
            ctx->row.bytes_in += tp_datapoint_nbytes(ptr);
        }
        return 1;
    }
    tp_status_t rc = tp_wire_msg_recv(p->msg, p->sock, ZMQ_DONTWAIT);
    if (rc == TP_ERR_TIMEOUT)
        return 0;
    if (rc == TP_OK && tp_wire_msg_frames(p->msg) == 1) {
        int kind;
        uint32_t sender;
        const char *text;
        size_t tl;
        if (tp_ctl_parse(tp_wire_msg_frame_data(p->msg, 0),
                         tp_wire_msg_frame_size(p->msg, 0), &kind, &sender,
                         &text, &tl)) {
            tp_wire_msg_clear(p->msg);
            if (kind != TP_CTL_EOS)
                return 0;  /* padding: nothing to deliver */
            p->count++;
            return 1;
        }
    }
    size_t bytes = rc == TP_OK ? tp_wire_msg_bytes(p->msg) : 0;
    if (rc == TP_OK)
        rc = tp_wire_decode(p->msg, &p->opts, dp);
    if (rc < 0) {
        ctx->malformed++;
        if (tp_ratelog_ok(&ctx->ratelog))
            TP_WARN("actor '%s': input %s: dropped a message: %s "
                    "(%llu dropped so far)", ctx->def->name, p->name,
                    tp_last_error(), (unsigned long long)ctx->malformed);
        return -1;
    }
    p->count++;
    ctx->row.msgs_in++;
    ctx->row.bytes_in += bytes;
    return 1;
}

void tp_actor_name_thread(const char *name) {
    char buf[16];
    snprintf(buf, sizeof buf, "tp:%s", name ? name : "");
    (void)prctl(PR_SET_NAME, buf, 0, 0, 0);  /* this thread's */
}

/* Wait until output p can take a message or the actor is terminated. */
static void s_wait_writable(tp_actor_ctx_t *ctx, s_port_t *p) {
    uint64_t t0 = tp_now_ns();
    zmq_pollitem_t items[2] = {{p->sock, 0, ZMQ_POLLOUT, 0},
                               {ctx->pipe, 0, ZMQ_POLLIN, 0}};
    long timeout = ctx->report_ms > 0 ? ctx->report_ms : 100;
    zmq_poll(items, 2, timeout);
    uint64_t t1 = tp_now_ns();
    ctx->blocked_ns += t1 - t0;
    if (items[1].revents & ZMQ_POLLIN)
        s_poll_pipe(ctx);
    s_maybe_report(ctx, t1);  /* blocked is not hung: keep the heartbeat */
}

/* Send a datapoint (or end-of-stream when dp is NULL) on output `port`. */
static tp_status_t s_send(tp_actor_ctx_t *ctx, int port, tp_datapoint_t **dp_p) {
    s_port_t *p = &ctx->out[port];
    tp_datapoint_t *dp = *dp_p;
    *dp_p = NULL;
    size_t bytes = dp ? tp_datapoint_nbytes(dp) : 0;
    if (p->inproc) {
        if (dp)
            TP_HANDOFF_RELEASE(dp);
        s_link_t *l = p->link;
        for (;;) {
            /* A plain send that waits at most 10 ms (SNDTIMEO) when full:
             * one call per message, as raw libzmq. */
            int readers = s_writer_enter(l, p->busy);
            int sent = readers > 0 &&
                       zmq_send(p->sock, &dp, sizeof dp, ZMQ_DONTWAIT) == (int)sizeof dp;
            int err = sent || readers == 0 ? EAGAIN : zmq_errno();
            if (!sent && readers > 0 && err == EAGAIN) {
                /* Full: only now is the time blocked time. */
                uint64_t t0 = s_coarse_ns();
                sent = zmq_send(p->sock, &dp, sizeof dp, 0) == (int)sizeof dp;
                err = sent ? EAGAIN : zmq_errno();
                ctx->blocked_ns += s_coarse_ns() - t0;
            }
            s_writer_leave(l, p->busy);
            if (sent)
                break;
            if (err != EAGAIN || ctx->terminated) {
                tp_datapoint_destroy(&dp);
                return ctx->terminated
                           ? tp_error(TP_ERR_INTERRUPTED,
                                      "actor '%s': terminated while sending",
                                      ctx->def->name)
                           : tp_error(TP_ERR_IO, "actor '%s': send on %s: %s",
                                      ctx->def->name, p->name, zmq_strerror(err));
            }
            atomic_store_explicit(&l->sent, p->count, memory_order_relaxed);
            if (readers > 0) {
                /* Still full after 10 ms: a slow reader (a trainer takes a
                 * batch a step). Wait outside the send, where a closing
                 * reader does not wait for us, until the queue has room,
                 * the pipe speaks or a report is due: waking every 10 ms
                 * took ~0.4 ms of a core in every 110 ms step of the towers
                 * it feeds. The counters are published first: the owner
                 * reads them without asking (tp_actor_stats_recent). */
                s_poll_pipe(ctx);
                s_wait_writable(ctx, p);
            } else {
                /* No reader (yet, or any more): wait for one, or for $TERM.
                 * In the actor's first second, look again every 1 ms: its
                 * reader is usually being created by the owner right now,
                 * and will want the first datapoint at once (a trainer's
                 * first step waited up to 10 ms here). */
                uint64_t t0 = tp_now_ns();
                zmq_pollitem_t item = {ctx->pipe, 0, ZMQ_POLLIN, 0};
                zmq_poll(&item, 1, t0 - ctx->start_ns < 1000000000ull ? 1 : 10);
                uint64_t t1 = tp_now_ns();
                ctx->blocked_ns += t1 - t0;
                s_poll_pipe(ctx);
                s_maybe_report(ctx, t1);
            }
        }
        p->count++;
        if ((p->count & 7) == 0)
            atomic_store_explicit(&p->link->sent, p->count, memory_order_relaxed);
    } else {
        tp_status_t rc;
        if (dp) {
            rc = tp_wire_encode(&dp, &p->opts, p->msg);
            if (rc < 0)
                return tp_error_wrap(rc, "actor '%s': output %s", ctx->def->name,
                                     p->name);
            bytes = tp_wire_msg_bytes(p->msg);
        } else {
            tp_wire_msg_clear(p->msg);
            uint8_t buf[TP_CTL_HEADER];
            uint32_t magic = TP_CTL_MAGIC, zero = 0;
            memcpy(buf, &magic, 4);
            buf[4] = TP_CTL_EOS;
            buf[5] = buf[6] = buf[7] = 0;
            memcpy(buf + 8, &zero, 4);
            TP_TRY(tp_wire_msg_add_frame(p->msg, buf, sizeof buf));
        }
        for (;;) {
            rc = tp_wire_msg_send(p->msg, p->sock, ZMQ_DONTWAIT);
            if (rc == TP_OK)
                break;
            if (rc != TP_ERR_TIMEOUT || ctx->terminated) {
                tp_wire_msg_clear(p->msg);
                return ctx->terminated
                           ? tp_error(TP_ERR_INTERRUPTED,
                                      "actor '%s': terminated while sending",
                                      ctx->def->name)
                           : tp_error_wrap(rc, "actor '%s': output %s",
                                           ctx->def->name, p->name);
            }
            s_wait_writable(ctx, p);
        }
        p->count++;
    }
    if (dp || bytes) {
        ctx->row.msgs_out++;
        ctx->row.bytes_out += bytes;
    }
    return TP_OK;
}

tp_status_t tp_actor_send(tp_actor_ctx_t *ctx, int port, tp_datapoint_t **dp_p) {
    TP_ASSERT(dp_p);
    if (port < 0 || port >= ctx->nout) {
        tp_datapoint_destroy(dp_p);
        return tp_error(TP_ERR_INVALID, "actor '%s': no output %d (it has %d)",
                        ctx->def->name, port, ctx->nout);
    }
    if (!*dp_p)
        return tp_error(TP_ERR_INVALID, "actor '%s': send of a NULL datapoint",
                        ctx->def->name);
    return s_send(ctx, port, dp_p);
}

int tp_actor_input(const tp_actor_ctx_t *ctx, const char *name) {
    for (int i = 0; i < ctx->nin; i++)
        if (!strcmp(ctx->in[i].name, name))
            return i;
    return -1;
}

int tp_actor_output(const tp_actor_ctx_t *ctx, const char *name) {
    for (int i = 0; i < ctx->nout; i++)
        if (!strcmp(ctx->out[i].name, name))
            return i;
    return -1;
}

int tp_actor_stopping(const tp_actor_ctx_t *ctx) {
    return ctx->stopping || ctx->terminated;
}

const char *tp_actor_ctx_name(const tp_actor_ctx_t *ctx) {
    return ctx->def->name;
}

uint64_t tp_actor_ctx_malformed(const tp_actor_ctx_t *ctx) {
    return ctx->malformed;
}

/* ---- the loop -------------------------------------------------------------------- */

static tp_status_t s_deliver(tp_actor_ctx_t *ctx, int i, tp_datapoint_t *dp) {
    tp_status_t rc;
    if (!dp)
        ctx->in[i].eos = 1;
    if (ctx->def->on_data) {
        rc = ctx->def->on_data(ctx, ctx->state, i, &dp);
        tp_datapoint_destroy(&dp);
    } else if (dp) {
        rc = ctx->nout > 0 ? s_send(ctx, 0, &dp) : TP_OK;
        tp_datapoint_destroy(&dp);
    } else {
        rc = TP_OK;
    }
    return rc;
}

static int s_all_eos(tp_actor_ctx_t *ctx) {
    for (int i = 0; i < ctx->nin; i++)
        if (!ctx->in[i].eos)
            return 0;
    return 1;
}

/* Run until the end; returns the exit status and fills reason. */
static tp_status_t s_run(tp_actor_ctx_t *ctx, char *reason, size_t rsize) {
    const tp_actor_def_t *def = ctx->def;
    tp_status_t rc = TP_OK;
    if (ctx->nin == 0) {
        if (!def->produce)
            return tp_error(TP_ERR_INVALID,
                            "actor '%s' has no inputs and no produce function",
                            def->name);
        s_tick_t tick;
        s_tick_init(&tick);
        while (!ctx->terminated) {
            /* When the owner sent a command, and every 10 ms. */
            uint64_t now;
            if (s_tick_due(&tick, &now) | s_mail_waiting(ctx)) {
                s_poll_pipe(ctx);
                s_maybe_report(ctx, tp_now_ns());
            }
            if (ctx->terminated)
                break;  /* $TERM just seen: no further call */
            if (ctx->stopping) {
                snprintf(reason, rsize, "stopped");
                break;
            }
            rc = def->produce(ctx, ctx->state);
            if (rc == TP_DONE) {
                snprintf(reason, rsize, "end of data");
                rc = TP_OK;
                break;
            }
            if (rc < 0)
                return rc;
        }
    } else {
        int start = 0;
        s_tick_t tick;
        s_tick_init(&tick);
        while (!ctx->terminated) {
            int got = 0;
            /* One inproc input: wait in a plain blocking receive right away
             * (one call per message, as raw libzmq). */
            if (ctx->nin == 1 && ctx->in[0].inproc)
                goto wait;
            for (int k = 0; k < ctx->nin && !ctx->terminated; k++) {
                int i = (start + k) % ctx->nin;
                if (ctx->in[i].eos)
                    continue;
                tp_datapoint_t *dp;
                int r = s_recv(ctx, i, &dp, ZMQ_DONTWAIT);
                if (r == 0)
                    continue;
                got++;
                if (r < 0)
                    continue;
                rc = s_deliver(ctx, i, dp);
                if (rc < 0)
                    return rc;
                if (rc == TP_DONE) {
                    snprintf(reason, rsize, "handler finished");
                    return TP_OK;
                }
            }
            start = start + 1 < ctx->nin ? start + 1 : 0;
            if (s_all_eos(ctx)) {
                snprintf(reason, rsize, "end of stream");
                break;
            }
            if (got) {
                uint64_t now;
                if (s_tick_due(&tick, &now) | s_mail_waiting(ctx)) {
                    s_poll_pipe(ctx);
                    s_maybe_report(ctx, tp_now_ns());
                }
                continue;
            }
        wait:
            /* Nothing waiting: starve until input, a command or a report. */
            if (ctx->nin == 1 && ctx->in[0].inproc) {
                tp_datapoint_t *dp;
                /* The coarse clock (a few ns, ~4 ms steps): over many waits
                 * its differences average to the true starved time. */
                int r = s_recv(ctx, 0, &dp, ZMQ_DONTWAIT);
                uint64_t t1 = 0;
                if (r == 0) {  /* empty: only now is the time starved time */
                    uint64_t t0 = s_coarse_ns();
                    r = s_recv(ctx, 0, &dp, 0);  /* waits up to 10 ms */
                    t1 = s_coarse_ns();
                    ctx->starved_ns += t1 - t0;
                }
                if (r == 1) {
                    rc = s_deliver(ctx, 0, dp);
                    if (rc < 0)
                        return rc;
                    if (rc == TP_DONE) {
                        snprintf(reason, rsize, "handler finished");
                        return TP_OK;
                    }
                    if (s_all_eos(ctx)) {
                        snprintf(reason, rsize, "end of stream");
                        break;
                    }
                    uint64_t now;
                    if (s_tick_due(&tick, &now) | s_mail_waiting(ctx))
                        s_poll_pipe(ctx);
                    if (now)
                        t1 = now;
                } else {
                    s_poll_pipe(ctx);
                    tick.last_check = s_coarse_ns();
                }
                if (t1)
                    s_maybe_report(ctx, t1);
                continue;
            }
            zmq_pollitem_t items[TP_ACTOR_MAX_PORTS + 1];
            items[0] = (zmq_pollitem_t){ctx->pipe, 0, ZMQ_POLLIN, 0};
            for (int i = 0; i < ctx->nin; i++)
                items[i + 1] = (zmq_pollitem_t){ctx->in[i].sock, 0,
                                                 ctx->in[i].eos ? 0 : ZMQ_POLLIN, 0};
            long timeout = ctx->report_ms > 0 ? ctx->report_ms : 200;
            uint64_t t0 = tp_now_ns();
            zmq_poll(items, ctx->nin + 1, timeout);
            uint64_t t1 = tp_now_ns();
            ctx->starved_ns += t1 - t0;
            if (items[0].revents & ZMQ_POLLIN)
                s_poll_pipe(ctx);
            s_maybe_report(ctx, t1);
        }
    }
    if (ctx->terminated) {
        snprintf(reason, rsize, "terminated");
        return TP_OK;
    }
    /* A clean end: pass end-of-stream on, then (ipc/tcp) the padding that
     * keeps it out of libzmq's unflushed tail (tp_ctl_send_pad). */
    for (int o = 0; o < ctx->nout && !ctx->terminated; o++) {
        tp_datapoint_t *none = NULL;
        if (s_send(ctx, o, &none) < 0)
            break;
        s_port_t *p = &ctx->out[o];
        while (!p->inproc && !ctx->terminated &&
               tp_ctl_send_pad(p->sock, ZMQ_DONTWAIT) < 0 && zmq_errno() == EAGAIN)
            s_wait_writable(ctx, p);
    }
    return TP_OK;
}

/* Free whatever waits at the inputs (pointers we now own). */
static void s_drain_inputs(tp_actor_ctx_t *ctx) {
    for (int i = 0; i < ctx->nin; i++) {
        s_port_t *p = &ctx->in[i];
        if (!p->sock)
            continue;
        if (p->inproc) {
            tp_datapoint_t *ptr;
            while (zmq_recv(p->sock, &ptr, sizeof ptr, ZMQ_DONTWAIT) == (int)sizeof ptr) {
                if (ptr)
                    TP_HANDOFF_ACQUIRE(ptr);
                tp_datapoint_destroy(&ptr);
            }
        } else {
            while (tp_wire_msg_recv(p->msg, p->sock, ZMQ_DONTWAIT) != TP_ERR_TIMEOUT)
                tp_wire_msg_clear(p->msg);
        }
    }
}

static void s_actor_main(zsock_t *pipe, void *args) {
    s_boot_t boot = *(s_boot_t *)args;
    free(args);
    const tp_actor_def_t *def = boot.def;
    tp_actor_name_thread(def->name);
    tp_actor_ctx_t *ctx = calloc(1, sizeof *ctx);
    char reason[512] = "";
    tp_status_t rc = TP_OK;
    if (!ctx) {
        zsock_signal(pipe, 0);
        zsock_send(pipe, "is", TP_ERR_NOMEM, "out of memory");
        return;
    }
    ctx->def = def;
    ctx->pipe = zsock_resolve(pipe);
    ctx->mail = boot.mail;
    ctx->asked = boot.asked;
    ctx->pub = boot.pub;
    s_current = ctx;
    ctx->report_ms = boot.report_ms;
    ctx->start_ns = ctx->last_report_ns = tp_now_ns();
    snprintf(ctx->row.name, sizeof ctx->row.name, "%s", def->name);

    if (def->ninputs < 0 || def->ninputs > TP_ACTOR_MAX_PORTS ||
        def->noutputs < 0 || def->noutputs > TP_ACTOR_MAX_PORTS)
        rc = tp_error(TP_ERR_INVALID, "actor '%s': %d inputs and %d outputs "
                      "(at most %d each)", def->name, def->ninputs,
                      def->noutputs, TP_ACTOR_MAX_PORTS);
    for (int i = 0; rc == TP_OK && i < def->ninputs; i++, ctx->nin++)
        rc = s_open_port(&ctx->in[i], &def->inputs[i], 0, i, def->name);
    for (int i = 0; rc == TP_OK && i < def->noutputs; i++, ctx->nout++)
        rc = s_open_port(&ctx->out[i], &def->outputs[i], 1, i, def->name);
    int have_state = 0;
    if (rc == TP_OK) {
        if (def->init) {
            rc = def->init(ctx, boot.arg, &ctx->state);
            if (rc < 0)
                rc = tp_error_wrap(rc, "actor '%s': init", def->name);
        } else {
            ctx->state = boot.arg;
        }
        have_state = rc == TP_OK;
    }
    zsock_signal(pipe, 0);
    zsock_send(pipe, "is", rc, rc == TP_OK ? "" : tp_last_error());
    int state = TP_ACTOR_DONE;
    if (rc == TP_OK) {
        ctx->start_ns = ctx->last_report_ns = tp_now_ns();
        rc = s_run(ctx, reason, sizeof reason);
        if (rc < 0) {
            snprintf(reason, sizeof reason, "%s", tp_last_error());
            state = TP_ACTOR_FAILED;
        }
        s_drain_inputs(ctx);
        if (have_state && def->fini)
            def->fini(ctx->state);
    }
    for (int i = 0; i < ctx->nin; i++)
        s_close_port(&ctx->in[i]);
    for (int i = 0; i < ctx->nout; i++)
        s_close_port(&ctx->out[i]);
    if (ctx->nin + ctx->nout < def->ninputs + def->noutputs) {
        /* A port failed half-way: close the one that failed too. */
        if (ctx->nin < def->ninputs)
            s_close_port(&ctx->in[ctx->nin]);
        else
            s_close_port(&ctx->out[ctx->nout]);
    }
    s_fill_row(ctx, state);
    s_publish_row(ctx);  /* before EXIT: the owner may free pub after it */
    /* Everything this thread wrote (the caller's arg included) happens
     * before the owner reads EXIT. */
    TP_HANDOFF_RELEASE(def);
    /* The owner may be gone already: never block on the pipe here. */
    zmq_send(ctx->pipe, "EXIT", 4, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ctx->pipe, &rc, sizeof rc, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ctx->pipe, reason, strlen(reason), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ctx->pipe, &ctx->row, sizeof ctx->row, ZMQ_DONTWAIT);
    free(ctx);
}

/* ---- owner side -------------------------------------------------------------------- */

struct tp_actor {
    char name[TP_STATS_NAME_MAX];
    const tp_actor_def_t *def;
    zactor_t *zactor;
    int exited;
    tp_status_t exit_rc;
    char reason[512];
    tp_stats_row_t row;
    uint64_t last_seen_ns;
    atomic_uint mail;  /* commands sent; counted after each send */
    atomic_int asked;  /* STOP or $TERM sent: tp_actor_current_stopping */
    s_rowpub_t pub;    /* the thread's counters, published */
};

tp_actor_t *tp_actor_new_ex(const tp_actor_def_t *def, void *arg,
                            int report_ms) {
    TP_ASSERT(def && def->name);
    tp_actors_init();
    tp_actor_t *self = calloc(1, sizeof *self);
    s_boot_t *boot = malloc(sizeof *boot);
    if (!self || !boot) {
        free(self);
        free(boot);
        tp_error(TP_ERR_NOMEM, "actor '%s'", def->name);
        return NULL;
    }
    snprintf(self->name, sizeof self->name, "%s", def->name);
    self->def = def;
    snprintf(self->row.name, sizeof self->row.name, "%s", def->name);
    boot->def = def;
    boot->arg = arg;
    boot->report_ms = report_ms;
    boot->mail = &self->mail;
    boot->asked = &self->asked;
    boot->pub = &self->pub;
    self->zactor = zactor_new(s_actor_main, boot);
    if (!self->zactor) {
        free(boot);
        free(self);
        tp_error(TP_ERR_IO, "actor '%s': cannot start its thread", def->name);
        return NULL;
    }
    int rc = TP_ERR_IO;
    char *text = NULL;
    zsock_t *pipe = zactor_sock(self->zactor);
    if (zsock_recv(pipe, "is", &rc, &text) < 0)
        rc = TP_ERR_IO;
    if (rc != TP_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", text && *text ? text : "did not start");
        zstr_free(&text);
        zsock_set_rcvtimeo(pipe, 5000);
        zactor_destroy(&self->zactor);
        free(self);
        tp_error(rc, "%s", msg);
        return NULL;
    }
    zstr_free(&text);
    self->last_seen_ns = tp_now_ns();
    self->row.state = TP_ACTOR_RUNNING;
    return self;
}

tp_actor_t *tp_actor_new(const tp_actor_def_t *def, void *arg) {
    return tp_actor_new_ex(def, arg, 0);
}

void *tp_actor_pipe_raw(tp_actor_t *self) {
    return self->exited ? NULL : zsock_resolve(zactor_sock(self->zactor));
}

/* Read one message from the pipe; 1 if one was read. */
static int s_owner_read(tp_actor_t *self, int flags) {
    if (self->exited)
        return 0;
    void *pipe = zsock_resolve(zactor_sock(self->zactor));
    zmq_msg_t parts[4];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, pipe, n ? 0 : flags) < 0) {
            zmq_msg_close(&part);
            break;
        }
        more = zmq_msg_more(&part);
        if (n < 4) {
            zmq_msg_init(&parts[n]);
            zmq_msg_move(&parts[n], &part);
            n++;
        }
        zmq_msg_close(&part);
    }
    if (n == 0)
        return 0;
    size_t k = zmq_msg_size(&parts[0]);
    const char *kind = zmq_msg_data(&parts[0]);
    if (k == 5 && !memcmp(kind, "STATS", 5) && n == 2 &&
        zmq_msg_size(&parts[1]) == sizeof self->row) {
        memcpy(&self->row, zmq_msg_data(&parts[1]), sizeof self->row);
        self->last_seen_ns = tp_now_ns();
    } else if (k == 4 && !memcmp(kind, "EXIT", 4) && n == 4) {
        TP_HANDOFF_ACQUIRE(self->def);
        self->exited = 1;
        memcpy(&self->exit_rc, zmq_msg_data(&parts[1]), sizeof self->exit_rc);
        size_t rl = zmq_msg_size(&parts[2]);
        if (rl >= sizeof self->reason)
            rl = sizeof self->reason - 1;
        memcpy(self->reason, zmq_msg_data(&parts[2]), rl);
        self->reason[rl] = '\0';
        if (zmq_msg_size(&parts[3]) == sizeof self->row)
            memcpy(&self->row, zmq_msg_data(&parts[3]), sizeof self->row);
        self->last_seen_ns = tp_now_ns();
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
    return 1;
}

void tp_actor_handle_pipe(tp_actor_t *self) {
    while (s_owner_read(self, ZMQ_DONTWAIT))
        ;
}

uint64_t tp_actor_last_seen_ns(const tp_actor_t *self) {
    return self->last_seen_ns;
}

const tp_stats_row_t *tp_actor_last_row(const tp_actor_t *self) {
    return &self->row;
}

tp_status_t tp_actor_exit_status(const tp_actor_t *self) {
    return self->exit_rc;
}

static int s_owner_wait(tp_actor_t *self, int timeout_ms) {
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX
                                       : tp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (!self->exited) {
        /* Look at the pipe before the deadline: a wait of 0 ms must still
         * see an EXIT that has arrived (q_next polls with 0 and waited
         * forever for an actor that had failed). */
        tp_actor_handle_pipe(self);
        if (self->exited)
            break;
        uint64_t now = tp_now_ns();
        if (now >= deadline)
            return 0;
        long wait = (long)((deadline - now) / 1000000ull);
        if (wait > 100 || timeout_ms < 0)
            wait = 100;
        zmq_pollitem_t item = {zsock_resolve(zactor_sock(self->zactor)), 0,
                               ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, wait) > 0)
            tp_actor_handle_pipe(self);
    }
    return 1;
}

tp_status_t tp_actor_wait(tp_actor_t *self, int timeout_ms) {
    if (!s_owner_wait(self, timeout_ms))
        return tp_error(TP_ERR_TIMEOUT, "actor '%s': still running after %d ms",
                        self->name, timeout_ms);
    if (self->exit_rc < 0)
        return tp_error(self->exit_rc, "%s", self->reason);
    return TP_OK;
}

/* Send a one-frame control message to the actor without ever blocking for
 * long: once the actor's thread has ended, its end of the pipe is closed and
 * a blocking send on the PAIR socket would wait forever (seen: a SIGINT
 * during the trainer's start stopped the input actor, then q_stop hung in
 * tp_actor_stop). 1 sent, 0 the actor has exited, -1 not within 1 s. */
static int s_owner_send(tp_actor_t *self, const char *text) {
    void *pipe = zsock_resolve(zactor_sock(self->zactor));
    uint64_t deadline = tp_now_ns() + 1000000000ull;
    for (;;) {
        tp_actor_handle_pipe(self);
        if (self->exited)
            return 0;
        if (zmq_send(pipe, text, strlen(text), ZMQ_DONTWAIT) >= 0) {
            atomic_fetch_add_explicit(&self->mail, 1, memory_order_release);
            return 1;
        }
        if (zmq_errno() != EAGAIN || tp_now_ns() >= deadline)
            return -1;
        zmq_pollitem_t item = {pipe, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 10);
    }
}

tp_status_t tp_actor_stop(tp_actor_t *self) {
    if (self->exited)
        return TP_OK;
    int sent = s_owner_send(self, "STOP");
    if (sent < 0)
        return tp_error(TP_ERR_IO, "actor '%s': cannot send STOP", self->name);
    if (sent)  /* a wait inside the handler may ask before the pipe is read */
        atomic_store_explicit(&self->asked, 1, memory_order_release);
    return TP_OK;
}

int tp_actor_exited(const tp_actor_t *self) { return self->exited; }
const char *tp_actor_reason(const tp_actor_t *self) { return self->reason; }
const char *tp_actor_name(const tp_actor_t *self) { return self->name; }

tp_status_t tp_actor_stats(tp_actor_t *self, tp_stats_row_t *row) {
    if (!self->exited) {
        uint64_t before = self->last_seen_ns;
        s_owner_send(self, "STATS?");
        uint64_t deadline = tp_now_ns() + 1000000000ull;
        while (!self->exited && self->last_seen_ns == before &&
               tp_now_ns() < deadline) {
            zmq_pollitem_t item = {zsock_resolve(zactor_sock(self->zactor)), 0,
                                   ZMQ_POLLIN, 0};
            if (zmq_poll(&item, 1, 50) > 0)
                tp_actor_handle_pipe(self);
        }
    }
    *row = self->row;
    return TP_OK;
}

tp_status_t tp_actor_stats_recent(tp_actor_t *self, tp_stats_row_t *row) {
    if (self->exited) {
        *row = self->row;
        return TP_OK;
    }
    uint64_t w[S_ROW_WORDS];
    for (int tries = 0;; tries++) {
        unsigned a = atomic_load_explicit(&self->pub.seq, memory_order_acquire);
        if (a == 0) {  /* nothing published yet */
            *row = self->row;
            return TP_OK;
        }
        if (!(a & 1)) {
            for (size_t i = 0; i < S_ROW_WORDS; i++)
                w[i] = atomic_load_explicit(&self->pub.words[i], memory_order_relaxed);
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&self->pub.seq, memory_order_relaxed) == a)
                break;
        }
        if (tries > 1000)
            sched_yield();  /* the writer was preempted mid-copy */
    }
    memcpy(row, w, sizeof *row);
    return TP_OK;
}

void tp_actor_destroy(tp_actor_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_actor_t *self = *self_p;
    *self_p = NULL;
    zsock_t *pipe = zactor_sock(self->zactor);
    if (!self->exited) {
        zsock_set_sndtimeo(pipe, 0);
        zstr_send(pipe, "$TERM");
        atomic_store_explicit(&self->asked, 1, memory_order_release);
        atomic_fetch_add_explicit(&self->mail, 1, memory_order_release);
        if (!s_owner_wait(self, 5000)) {
            /* A handler that never returns: its thread cannot be killed.
             * Leave it (and what it uses) rather than free under it. */
            TP_ERROR("actor '%s' did not end within 5 s of $TERM; its thread "
                     "is abandoned", self->name);
            return;
        }
    }
    /* The thread has sent EXIT; the shim's final signal follows at once.
     * The timeout only guards against a czmq that behaves otherwise. */
    zsock_set_rcvtimeo(pipe, 5000);
    zactor_destroy(&self->zactor);
    free(self);
}

/* ---- reading an actor's output on a thread that is not an actor ------------------ */

struct tp_port_reader {
    tp_actor_def_t def;   /* only its name: messages and the ctx need one */
    char name[64];
    tp_actor_ctx_t *ctx;  /* one input port; counters as an actor's */
    /* The counters again, for readers on other threads (a statistics
     * callback on the trainer's thread while a staging thread receives):
     * published after every receive. */
    atomic_uint_fast64_t count, waited_ns;
};

static tp_status_t s_reader_publish(tp_port_reader_t *r, tp_status_t rc) {
    atomic_store_explicit(&r->count, r->ctx->row.msgs_in, memory_order_relaxed);
    atomic_store_explicit(&r->waited_ns, r->ctx->starved_ns, memory_order_relaxed);
    return rc;
}

tp_port_reader_t *tp_port_reader_new(const tp_actor_port_t *port, const char *name) {
    tp_actors_init();
    tp_port_reader_t *r = calloc(1, sizeof *r);
    if (r)
        r->ctx = calloc(1, sizeof *r->ctx);
    if (!r || !r->ctx) {
        free(r);
        tp_error(TP_ERR_NOMEM, "port reader");
        return NULL;
    }
    snprintf(r->name, sizeof r->name, "%s", name ? name : "reader");
    r->def.name = r->name;
    r->ctx->def = &r->def;
    r->ctx->nin = 1;
    r->ctx->start_ns = tp_now_ns();
    tp_status_t rc = s_open_port(&r->ctx->in[0], port, 0, 0, r->name);
    if (rc < 0) {
        s_close_port(&r->ctx->in[0]);
        free(r->ctx);
        free(r);
        return NULL;
    }
    return r;
}

tp_status_t tp_port_reader_recv(tp_port_reader_t *r, tp_datapoint_t **out,
                                int timeout_ms) {
    *out = NULL;
    tp_actor_ctx_t *ctx = r->ctx;
    s_port_t *p = &ctx->in[0];
    uint64_t t0 = tp_now_ns();
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : t0 + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        /* inproc: a blocking receive bounded by the port's 10 ms timeout;
         * wire ports: a look, then a 10 ms poll. */
        int n = s_recv(ctx, 0, out, 0);
        if (n == 1) {
            ctx->starved_ns += tp_now_ns() - t0;
            return s_reader_publish(r, *out ? TP_OK : TP_DONE);
        }
        uint64_t now = tp_now_ns();
        if (now >= deadline) {
            ctx->starved_ns += now - t0;
            s_reader_publish(r, TP_OK);
            return tp_error(TP_ERR_TIMEOUT, "%s: nothing arrived on %s within %d ms",
                            r->name, p->def->endpoint, timeout_ms);
        }
        if (n == 0 && !p->inproc) {
            zmq_pollitem_t item = {p->sock, 0, ZMQ_POLLIN, 0};
            zmq_poll(&item, 1, 10);
        }
    }
}

uint64_t tp_port_reader_count(const tp_port_reader_t *r) {
    return atomic_load_explicit(&r->count, memory_order_relaxed);
}

double tp_port_reader_waited_s(const tp_port_reader_t *r) {
    return (double)atomic_load_explicit(&r->waited_ns, memory_order_relaxed) * 1e-9;
}

void tp_port_reader_destroy(tp_port_reader_t **r_p) {
    if (!r_p || !*r_p)
        return;
    tp_port_reader_t *r = *r_p;
    s_close_port(&r->ctx->in[0]);  /* frees what was queued for it */
    free(r->ctx);
    free(r);
    *r_p = NULL;
}
