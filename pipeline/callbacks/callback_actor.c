/* towerpack pipeline: the callback actor, where observing callbacks run.
 *
 * A callback wrapped by tp_cb_observe or tp_cb_observe_latest keeps its
 * place among the trainer's callbacks, but on the trainer's thread it only
 * turns each of its hooks into a message: the hook, the epoch, the local and
 * global step of the moment, and for after_run the values it asked for. One
 * actor per trainer (a zactor: its own thread, the pipe its socket) takes
 * those messages in order and runs the callback's real hooks there, against
 * a view of the trainer (tp_trainer_view_new) that the messages keep up to
 * date. So a progress bar on a slow terminal or a monitor writing to a slow
 * disk never holds up a step.
 *
 * What crosses, trainer -> actor (one s_event_t frame, maybe a second):
 *   HOOK       an observer's hook; after_run carries its fetched values
 *   SCALAR     a scalar the trainer's side put (name in the second frame)
 *   EPOCH_END  the epoch's scalars join their history
 *   FINISH     after every after_train: answer FINISHED when done
 * and actor -> trainer (one s_reply_t frame, maybe a second):
 *   SCALAR     a scalar an observer put: the trainer stores it too
 *   ERROR      the first hook that failed (its message)
 *   FINISHED   every event before FINISH has run
 * The pipe's high-water mark bounds the backlog: past it the trainer waits
 * (and keeps taking replies meanwhile, so neither side can block the other
 * for good). Latest-only observers skip a step's hooks while the actor is
 * behind, so they never make the trainer wait. */
#include <czmq.h>
#include <stdatomic.h>
#include <string.h>
#include <towerpack/actor.h>  /* TP_HANDOFF_*: ThreadSanitizer hints */
#include <towerpack/callback.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/supervisor.h>
#include "pipeline/trainer_internal.h"

/* Latest-only observers get a step only while at most this many events
 * wait at the actor. */
#define S_LATEST_BACKLOG 4
#define S_NAME_MAX 64
#define S_MAX_FETCHES 16

enum { EV_HOOK = 1, EV_SCALAR, EV_EPOCH_END, EV_FINISH };
enum {
    H_BEFORE_TRAIN = 1, H_BEFORE_EPOCH, H_AFTER_RUN, H_TRIGGER_STEP,
    H_AFTER_EPOCH, H_TRIGGER_EPOCH, H_TRIGGER, H_AFTER_TRAIN,
};

typedef struct {
    uint32_t kind, hook;
    int32_t obs, nvalues;
    int64_t epoch, local_step, global_step;
    uint64_t t_ns;   /* when the trainer reached it */
    double value;
} s_event_t;

enum { RE_SCALAR = 1, RE_ERROR, RE_FINISHED };
typedef struct {
    uint32_t kind;
    int32_t status;
    double value;
} s_reply_t;

typedef struct s_obs s_obs_t;

struct tp_cb_actor {
    tp_trainer_t *trainer;   /* the one it serves (its thread only) */
    tp_trainer_t *view;      /* the observers' trainer: the actor's once started */
    s_obs_t **obs;           /* by index in the view */
    int nobs, capobs;
    s_obs_t *forwarder;      /* the observer whose on_scalar sends scalars */
    zactor_t *actor;
    void *pipe;              /* the trainer's end */
    void *sock;              /* the actor's end (its thread only) */
    atomic_int quit;         /* set by destroy: skip what is queued, end */
    atomic_int exited;       /* set by the actor's thread as it leaves */
    /* trainer side */
    uint64_t sent;
    tp_status_t failed;      /* the first failure the actor reported */
    char failmsg[1024];
    int failure_returned, finished;
    /* actor side */
    tp_fetches_t *fetches;
    int hook_failed;         /* after a failure only after_train runs */
    /* counters: written by one thread each, read by any */
    atomic_uint_fast64_t done, busy_ns, starved_ns, replies, skipped;
    uint64_t start_ns;
    /* Its heartbeat: the hook it is in now (the callback's name, the
     * hook's, the global step it was due at) and since when (0: between
     * hooks). Written by the actor, read by the supervisor's watchdog,
     * which names an observer stuck in one hook for watchdog_s. */
    _Atomic(const char *) cur_cb;
    _Atomic(const char *) cur_hook;
    atomic_int_fast64_t cur_step;
    atomic_uint_fast64_t cur_since_ns;
    uint64_t warned_since, warned_at;  /* the supervisor's */
};

/* An observing callback: the wrapper on the trainer's side. */
struct s_obs {
    tp_callback_ops_t ops;   /* this instance's: the inner's name, its hooks */
    tp_callback_t *inner;    /* until setup_graph hands it to the view */
    tp_cb_actor_t *a;
    int index;
    int latest;              /* skip steps while the actor is behind */
    uint64_t interval_ns;    /* latest: at most one step per interval */
    uint64_t last_ns;
    char names[S_MAX_FETCHES][S_NAME_MAX];  /* what its before_run asks */
    int nnames;
    int64_t step_epoch, step_local;  /* the step `deliver` was decided for */
    int deliver;
};

/* ---- the actor's side ----------------------------------------------------------- */

static void s_reply(tp_cb_actor_t *a, uint32_t kind, int32_t status, double value,
                    const char *text) {
    s_reply_t r = {kind, status, value};
    if (zmq_send(a->sock, &r, sizeof r, text ? ZMQ_SNDMORE : 0) < 0)
        return;  /* the trainer is gone: nothing to tell */
    if (text)
        zmq_send(a->sock, text, strlen(text), 0);
    atomic_fetch_add_explicit(&a->replies, 1, memory_order_relaxed);
}

static void s_run_hook(tp_cb_actor_t *a, const s_event_t *ev, const void *extra,
                       size_t extra_size) {
    tp_trainer_t *v = a->view;
    if (ev->obs < 0 || ev->obs >= a->nobs)
        return;
    if (a->hook_failed && ev->hook != H_AFTER_TRAIN)
        return;
    static const char *const hook_names[] = {
        [H_BEFORE_TRAIN] = "before_train", [H_BEFORE_EPOCH] = "before_epoch",
        [H_AFTER_RUN] = "after_run", [H_TRIGGER_STEP] = "trigger_step",
        [H_AFTER_EPOCH] = "after_epoch", [H_TRIGGER_EPOCH] = "trigger_epoch",
        [H_TRIGGER] = "trigger", [H_AFTER_TRAIN] = "after_train",
    };
    if (ev->hook < H_BEFORE_TRAIN || ev->hook > H_AFTER_TRAIN)
        return;
    tp_trainer_view_set(v, ev->epoch, ev->local_step, ev->global_step, ev->t_ns);
    tp_callback_t *cb = tp_trainer_callback(v, (size_t)ev->obs);
    atomic_store_explicit(&a->cur_cb, tp_callback_name(cb), memory_order_relaxed);
    atomic_store_explicit(&a->cur_hook, hook_names[ev->hook], memory_order_relaxed);
    atomic_store_explicit(&a->cur_step, ev->global_step, memory_order_relaxed);
    atomic_store_explicit(&a->cur_since_ns, tp_now_ns(), memory_order_release);
    tp_status_t rc = TP_OK;
    switch (ev->hook) {
    case H_BEFORE_TRAIN: rc = tp_cb_before_train(cb, v); break;
    case H_BEFORE_EPOCH: rc = tp_cb_before_epoch(cb, v); break;
    case H_TRIGGER_STEP: rc = tp_cb_trigger_step(cb, v); break;
    case H_AFTER_EPOCH: rc = tp_cb_after_epoch(cb, v); break;
    case H_TRIGGER_EPOCH: rc = tp_cb_trigger_epoch(cb, v); break;
    case H_TRIGGER: rc = tp_cb_trigger(cb, v); break;
    case H_AFTER_TRAIN: rc = tp_cb_after_train(cb, v); break;
    case H_AFTER_RUN: {
        /* Its before_run asks again (here, on its own table); the values
         * the step gave for the names it asked at setup come with the
         * event: n doubles, then n flags. */
        const s_obs_t *w = a->obs[ev->obs];
        int n = ev->nvalues;
        if (n < 0 || n > w->nnames || extra_size != (size_t)n * 9)
            n = 0;
        tp_fetches_begin(a->fetches);
        /* before_run as it would have been: before the step counted */
        tp_trainer_view_set(v, ev->epoch, ev->local_step, ev->global_step - 1, ev->t_ns);
        rc = tp_cb_before_run(cb, v, a->fetches);
        tp_trainer_view_set(v, ev->epoch, ev->local_step, ev->global_step, ev->t_ns);
        for (int i = 0; rc >= 0 && i < n; i++) {
            double x;
            memcpy(&x, (const char *)extra + (size_t)i * 8, 8);
            if (((const uint8_t *)extra)[(size_t)n * 8 + (size_t)i])
                tp_fetches_set(a->fetches, w->names[i], x);
        }
        if (rc >= 0)
            rc = tp_cb_after_run(cb, v, a->fetches);
        break;
    }
    }
    atomic_store_explicit(&a->cur_since_ns, 0, memory_order_release);
    if (rc < 0 && !a->hook_failed) {
        a->hook_failed = 1;
        char msg[1200];
        snprintf(msg, sizeof msg, "%s (an observing callback, on the callback actor: "
                 "epoch %lld, global step %lld)", tp_last_error(), (long long)ev->epoch,
                 (long long)ev->global_step);
        s_reply(a, RE_ERROR, rc, 0, msg);
    }
}

static void s_actor(zsock_t *pipe, void *arg) {
    tp_cb_actor_t *a = arg;
    a->sock = zsock_resolve(pipe);
    zsock_signal(pipe, 0);
    uint64_t idle_since = tp_now_ns();
    char name[S_NAME_MAX + 1];
    for (;;) {
        zmq_msg_t head, extra;
        zmq_msg_init(&head);
        zmq_msg_init(&extra);
        if (zmq_msg_recv(&head, a->sock, 0) < 0) {
            zmq_msg_close(&head);
            zmq_msg_close(&extra);
            if (zmq_errno() == EINTR)
                continue;
            break;  /* the context is ending */
        }
        int have_extra = 0;
        while (zmq_msg_more(have_extra ? &extra : &head)) {  /* keep the 2nd frame */
            zmq_msg_close(&extra);
            zmq_msg_init(&extra);
            if (zmq_msg_recv(&extra, a->sock, 0) < 0)
                break;
            have_extra = 1;
        }
        uint64_t t0 = tp_now_ns();
        atomic_fetch_add_explicit(&a->starved_ns, t0 - idle_since, memory_order_relaxed);
        size_t size = zmq_msg_size(&head);
        int term = size == 5 && memcmp(zmq_msg_data(&head), "$TERM", 5) == 0;
        if (size == sizeof(s_event_t) && !atomic_load_explicit(&a->quit, memory_order_relaxed)) {
            s_event_t ev;
            memcpy(&ev, zmq_msg_data(&head), sizeof ev);
            const void *x = have_extra ? zmq_msg_data(&extra) : NULL;
            size_t xs = have_extra ? zmq_msg_size(&extra) : 0;
            switch (ev.kind) {
            case EV_HOOK:
                s_run_hook(a, &ev, x, xs);
                break;
            case EV_SCALAR:
                if (xs > 0 && xs <= S_NAME_MAX) {
                    memcpy(name, x, xs);
                    name[xs] = '\0';
                    /* at the steps it was put at (monitors stamp it so) */
                    tp_trainer_view_set(a->view, ev.epoch, ev.local_step, ev.global_step, ev.t_ns);
                    tp_trainer_put_scalar_local(a->view, name, ev.value);
                }
                break;
            case EV_EPOCH_END:
                tp_trainer_view_epoch_end(a->view);
                break;
            case EV_FINISH:
                /* What the observers wrote is the trainer's to read now. */
                TP_HANDOFF_RELEASE(a);
                s_reply(a, RE_FINISHED, 0, 0, NULL);
                break;
            }
        }
        zmq_msg_close(&head);
        zmq_msg_close(&extra);
        idle_since = tp_now_ns();
        atomic_fetch_add_explicit(&a->busy_ns, idle_since - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->done, 1, memory_order_release);
        if (term)
            break;
    }
    TP_HANDOFF_RELEASE(a);
    atomic_store(&a->exited, 1);  /* a is not touched after this */
}

/* ---- the trainer's side ----------------------------------------------------------- */

static tp_cb_actor_t *s_new(tp_trainer_t *tr) {
    tp_cb_actor_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->trainer = tr;
    a->view = tp_trainer_view_new(tr);
    a->fetches = tp_fetches_new();
    if (!a->view || !a->fetches) {
        tp_trainer_destroy(&a->view);
        tp_fetches_destroy(&a->fetches);
        free(a);
        return NULL;
    }
    atomic_init(&a->done, 0);
    atomic_init(&a->busy_ns, 0);
    atomic_init(&a->starved_ns, 0);
    atomic_init(&a->replies, 0);
    atomic_init(&a->skipped, 0);
    atomic_init(&a->quit, 0);
    atomic_init(&a->exited, 0);
    return a;
}

static tp_status_t s_start(tp_cb_actor_t *a) {
    tp_actors_init();
    tp_trainer_view_start(a->view);
    a->start_ns = tp_now_ns();
    a->actor = zactor_new(s_actor, a);
    if (!a->actor)
        return tp_error(TP_ERR_NOMEM, "the callback actor");
    a->pipe = zsock_resolve(a->actor);
    return TP_OK;
}

/* Take the replies waiting (never waits); `apply` 0: drop them. */
static void s_drain_replies(tp_cb_actor_t *a, int apply) {
    char text[1024];
    for (;;) {
        s_reply_t r;
        int n = zmq_recv(a->pipe, &r, sizeof r, ZMQ_DONTWAIT);
        if (n < 0)
            return;
        int more = 0;
        size_t ms = sizeof more;
        zmq_getsockopt(a->pipe, ZMQ_RCVMORE, &more, &ms);
        int tn = 0;
        text[0] = '\0';
        if (more) {
            tn = zmq_recv(a->pipe, text, sizeof text - 1, 0);
            text[tn > 0 ? (tn < (int)sizeof text - 1 ? tn : (int)sizeof text - 1) : 0] = '\0';
        }
        if (n != (int)sizeof r || !apply)
            continue;  /* the actor's exit signal, or dropped */
        switch (r.kind) {
        case RE_SCALAR:
            if (text[0])
                tp_trainer_put_scalar_local(a->trainer, text, r.value);
            break;
        case RE_ERROR:
            if (a->failed >= 0) {
                a->failed = r.status < 0 ? r.status : TP_ERR_STATE;
                snprintf(a->failmsg, sizeof a->failmsg, "%s", text);
            }
            break;
        case RE_FINISHED:
            TP_HANDOFF_ACQUIRE(a);
            a->finished = 1;
            break;
        }
    }
}

/* The watchdog, on the supervisor's side: an observer in one hook for
 * longer than the trainer's watchdog period is named (again every period
 * while it stays there). Training goes on: observers only watch, and
 * training waits for them only at its end. */
static void s_watch(tp_cb_actor_t *a) {
    double limit = tp_trainer_watchdog(a->trainer);
    uint64_t since = atomic_load_explicit(&a->cur_since_ns, memory_order_acquire);
    if (limit <= 0 || !since)
        return;
    uint64_t now = tp_now_ns();
    if ((double)(now - since) * 1e-9 < limit ||
        (since == a->warned_since && (double)(now - a->warned_at) * 1e-9 < limit))
        return;
    const char *cb = atomic_load_explicit(&a->cur_cb, memory_order_relaxed);
    const char *hook = atomic_load_explicit(&a->cur_hook, memory_order_relaxed);
    long long step = (long long)atomic_load_explicit(&a->cur_step, memory_order_relaxed);
    if (atomic_load_explicit(&a->cur_since_ns, memory_order_acquire) != since)
        return;  /* it moved on meanwhile */
    a->warned_since = since;
    a->warned_at = now;
    TP_WARN("callback watchdog: the callback actor has been in %s.%s (due at global "
            "step %lld) for %.1f s; the observers behind it wait (training does "
            "not, until its end)", cb ? cb : "?", hook ? hook : "?", step,
            (double)(now - since) * 1e-9);
}

static void s_drain(tp_cb_actor_t *a) {
    s_drain_replies(a, 1);
    s_watch(a);
}

/* Send one event (and `extra`, if any), waiting while the actor's queue is
 * full; the replies are taken meanwhile. */
static tp_status_t s_send(tp_cb_actor_t *a, const s_event_t *ev, const void *extra,
                          size_t extra_size) {
    if (!a->actor)
        TP_TRY(s_start(a));
    int part = 0;
    while (part < (extra ? 2 : 1)) {
        int rc = part == 0 ? zmq_send(a->pipe, ev, sizeof *ev,
                                      ZMQ_DONTWAIT | (extra ? ZMQ_SNDMORE : 0))
                           : zmq_send(a->pipe, extra, extra_size, ZMQ_DONTWAIT);
        if (rc >= 0) {
            part++;
            continue;
        }
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
            return tp_error(TP_ERR_IO, "the callback actor: send: %s", zmq_strerror(zmq_errno()));
        s_drain(a);
        zmq_pollitem_t it = {a->pipe, 0, ZMQ_POLLOUT, 0};
        zmq_poll(&it, 1, 100);
    }
    a->sent++;
    return TP_OK;
}

static tp_status_t s_pending_failure(tp_cb_actor_t *a) {
    if (a->failed < 0 && !a->failure_returned) {
        a->failure_returned = 1;
        return tp_error(a->failed, "%s", a->failmsg);
    }
    return TP_OK;
}

tp_status_t tp_cb_actor_poll(tp_cb_actor_t *a, tp_trainer_t *tr) {
    (void)tr;
    if (a->actor)
        s_drain(a);
    return s_pending_failure(a);
}

tp_status_t tp_cb_actor_epoch_end(tp_cb_actor_t *a, tp_trainer_t *tr) {
    s_event_t ev = {.kind = EV_EPOCH_END, .epoch = tp_trainer_epoch_num(tr)};
    if (a->actor)
        TP_TRY(s_send(a, &ev, NULL, 0));
    return tp_cb_actor_poll(a, tr);
}

tp_status_t tp_cb_actor_finish(tp_cb_actor_t *a, tp_trainer_t *tr) {
    if (!a->actor)
        return s_pending_failure(a);
    s_event_t ev = {.kind = EV_FINISH};
    TP_TRY(s_send(a, &ev, NULL, 0));
    uint64_t t0 = tp_now_ns(), said = t0, signalled = 0;
    while (s_drain(a), !a->finished) {
        uint64_t now = tp_now_ns();
        if (now - said > 5000000000ull) {
            said = now;
            TP_INFO("waiting for the observing callbacks: %llu events still to run "
                    "(%.0f s so far)",
                    (unsigned long long)(a->sent - atomic_load(&a->done)),
                    (double)(now - t0) * 1e-9);
        }
        /* After a signal: 5 s more, then training ends without them. */
        if (tp_signal_pending() && !signalled)
            signalled = now;
        if (signalled && now - signalled > 5000000000ull)
            return tp_error(TP_ERR_INTERRUPTED,
                            "the observing callbacks did not finish within 5 s of the "
                            "signal (%llu events left)",
                            (unsigned long long)(a->sent - atomic_load(&a->done)));
        zmq_pollitem_t it = {a->pipe, 0, ZMQ_POLLIN, 0};
        zmq_poll(&it, 1, 100);
    }
    (void)tr;
    return s_pending_failure(a);
}

void tp_cb_actor_put_back(tp_cb_actor_t *a, const char *name, double value) {
    if (a && a->sock)
        s_reply(a, RE_SCALAR, 0, value, name);
}

void tp_cb_actor_row(const tp_cb_actor_t *a, tp_stats_row_t *row) {
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "callbacks");
    row->state = TP_ACTOR_RUNNING;
    uint64_t done = atomic_load_explicit(&a->done, memory_order_relaxed);
    row->msgs_in = done;
    row->msgs_out = atomic_load_explicit(&a->replies, memory_order_relaxed);
    row->busy_s = (double)atomic_load_explicit(&a->busy_ns, memory_order_relaxed) * 1e-9;
    row->starved_s = (double)atomic_load_explicit(&a->starved_ns, memory_order_relaxed) * 1e-9;
    row->alive_s = a->start_ns ? (double)(tp_now_ns() - a->start_ns) * 1e-9 : 0;
    int hwm = (int)zsys_pipehwm();
    row->queue_fill = hwm > 0 && a->sent >= done ? (double)(a->sent - done) / hwm : 0;
}

uint64_t tp_cb_actor_skipped(const tp_cb_actor_t *a) {
    return atomic_load_explicit(&a->skipped, memory_order_relaxed);
}

void tp_cb_actor_destroy(tp_cb_actor_t **a_p) {
    if (!a_p || !*a_p)
        return;
    tp_cb_actor_t *a = *a_p;
    *a_p = NULL;
    if (a->actor) {
        /* What is still queued (after a failure, a signal) is skipped; a
         * hook that never returns does not hold the process: 5 s, then the
         * thread is left behind (and a with it). */
        atomic_store(&a->quit, 1);
        uint64_t t0 = tp_now_ns(), limit = 5000000000ull;
        while (zmq_send(a->pipe, "$TERM", 5, ZMQ_DONTWAIT) < 0 &&
               tp_now_ns() - t0 < limit) {
            s_drain_replies(a, 0);
            zmq_pollitem_t it = {a->pipe, 0, ZMQ_POLLOUT, 0};
            zmq_poll(&it, 1, 100);
        }
        uint64_t spent = tp_now_ns() - t0;
        zsock_set_rcvtimeo(a->actor, spent < limit ? (int)((limit - spent) / 1000000) + 100 : 100);
        zactor_destroy(&a->actor);
        if (!atomic_load(&a->exited)) {
            TP_WARN("the callback actor did not end within 5 s (a hook of an observing "
                    "callback still runs): left behind");
            return;
        }
        TP_HANDOFF_ACQUIRE(a);
    }
    tp_trainer_destroy(&a->view);  /* and the observers in it */
    tp_fetches_destroy(&a->fetches);
    free(a->obs);
    free(a);
}

/* ---- the wrapper ---------------------------------------------------------------- */

static s_event_t s_hook_event(const s_obs_t *w, tp_trainer_t *tr, uint32_t hook) {
    return (s_event_t){.kind = EV_HOOK, .hook = hook, .obs = w->index,
                       .epoch = tp_trainer_epoch_num(tr),
                       .local_step = tp_trainer_local_step(tr),
                       .global_step = tp_trainer_global_step(tr), .t_ns = tp_now_ns()};
}

static tp_status_t s_hook(s_obs_t *w, tp_trainer_t *tr, uint32_t hook) {
    s_event_t ev = s_hook_event(w, tr, hook);
    return s_send(w->a, &ev, NULL, 0);
}

/* Whether this step's hooks go to the actor: always for observers of every
 * step; for latest-only ones while the actor keeps up (and the interval has
 * passed), and an epoch's last step. Decided once per step. */
static int s_deliver(s_obs_t *w, tp_trainer_t *tr) {
    int64_t ep = tp_trainer_epoch_num(tr), ls = tp_trainer_local_step(tr);
    if (w->step_epoch == ep && w->step_local == ls)
        return w->deliver;
    w->step_epoch = ep;
    w->step_local = ls;
    w->deliver = 1;
    if (w->latest) {
        tp_cb_actor_t *a = w->a;
        uint64_t now = tp_now_ns();
        uint64_t behind = a->actor ? a->sent - atomic_load_explicit(&a->done, memory_order_acquire)
                                   : 0;
        /* an epoch's last step always: its values end the epoch's line */
        int last = ls == tp_trainer_schedule(tr)->steps_per_epoch - 1;
        w->deliver = last || (behind <= S_LATEST_BACKLOG && now - w->last_ns >= w->interval_ns);
        if (w->deliver)
            w->last_ns = now;
        else
            atomic_fetch_add_explicit(&a->skipped, 1, memory_order_relaxed);
    }
    return w->deliver;
}

static tp_status_t w_setup_graph(void *impl, tp_trainer_t *tr) {
    s_obs_t *w = impl;
    const tp_callback_ops_t *ops = tp_callback_ops(w->inner);
    void *inner = tp_callback_impl(w->inner);
    /* Its setup on the trainer's thread, as for any callback. */
    if (ops->setup_graph)
        TP_TRY(ops->setup_graph(inner, tr));
    /* What its before_run asks for: fetched for it every step it gets. */
    if (ops->before_run) {
        tp_fetches_t *f = tp_fetches_new();
        if (!f)
            return TP_ERR_NOMEM;
        tp_status_t rc = ops->before_run(inner, tr, f);
        w->nnames = 0;
        for (int i = 0; rc >= 0 && i < tp_fetches_count(f) && i < S_MAX_FETCHES; i++)
            snprintf(w->names[w->nnames++], S_NAME_MAX, "%s", tp_fetches_name(f, i));
        tp_fetches_destroy(&f);
        TP_TRY(rc);
    }
    tp_cb_actor_t **slot = tp_trainer_cb_actor_slot(tr);
    if (!*slot && !(*slot = s_new(tr)))
        return tp_error(TP_ERR_NOMEM, "the callback actor");
    tp_cb_actor_t *a = *slot;
    if (a->actor)
        return tp_error(TP_ERR_STATE, "observing callback %s set up after training began",
                        ops->name);
    if (a->nobs == a->capobs) {
        int cap = a->capobs ? a->capobs * 2 : 8;
        s_obs_t **o = realloc(a->obs, (size_t)cap * sizeof *o);
        if (!o)
            return tp_error(TP_ERR_NOMEM, "the callback actor");
        a->obs = o;
        a->capobs = cap;
    }
    w->a = a;
    w->index = a->nobs;
    TP_TRY(tp_trainer_view_add(a->view, &w->inner));  /* the view owns it now */
    a->obs[a->nobs++] = w;
    if (!a->forwarder)
        a->forwarder = w;
    w->step_epoch = -1;
    return TP_OK;
}

static tp_status_t w_before_train(void *i, tp_trainer_t *tr) { return s_hook(i, tr, H_BEFORE_TRAIN); }
static tp_status_t w_before_epoch(void *i, tp_trainer_t *tr) { return s_hook(i, tr, H_BEFORE_EPOCH); }
static tp_status_t w_after_epoch(void *i, tp_trainer_t *tr) { return s_hook(i, tr, H_AFTER_EPOCH); }
static tp_status_t w_trigger_epoch(void *i, tp_trainer_t *tr) { return s_hook(i, tr, H_TRIGGER_EPOCH); }
static tp_status_t w_trigger(void *i, tp_trainer_t *tr) { return s_hook(i, tr, H_TRIGGER); }
static tp_status_t w_after_train(void *i, tp_trainer_t *tr) { return s_hook(i, tr, H_AFTER_TRAIN); }

static tp_status_t w_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    s_obs_t *w = impl;
    if (s_deliver(w, tr))
        for (int i = 0; i < w->nnames; i++)
            TP_TRY(tp_fetches_request(f, w->names[i]));
    return TP_OK;
}

static tp_status_t w_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_obs_t *w = impl;
    if (!s_deliver(w, tr))
        return TP_OK;
    char values[S_MAX_FETCHES * 9];
    int n = w->nnames;
    for (int i = 0; i < n; i++) {
        double x = 0;
        int have = tp_fetches_get(f, w->names[i], &x) == TP_OK;
        memcpy(values + (size_t)i * 8, &x, 8);
        values[(size_t)n * 8 + (size_t)i] = (char)have;
    }
    tp_clear_error();
    s_event_t ev = s_hook_event(w, tr, H_AFTER_RUN);
    ev.nvalues = n;
    return s_send(w->a, &ev, n ? values : NULL, (size_t)n * 9);
}

static tp_status_t w_trigger_step(void *impl, tp_trainer_t *tr) {
    s_obs_t *w = impl;
    return s_deliver(w, tr) ? s_hook(w, tr, H_TRIGGER_STEP) : TP_OK;
}

/* Every scalar the trainer's side puts goes over once (by one observer;
 * the actor tells them all). Before the actor starts, the view takes the
 * trainer's scalars as they are then. */
static void w_on_scalar(void *impl, tp_trainer_t *tr, const char *name, double value) {
    s_obs_t *w = impl;
    if (!w->a || w->a->forwarder != w || !w->a->actor)
        return;
    size_t n = strlen(name);
    if (n > S_NAME_MAX) {
        TP_WARN("scalar %s: name longer than %d characters, not sent to the observing "
                "callbacks", name, S_NAME_MAX);
        return;
    }
    s_event_t ev = {.kind = EV_SCALAR, .value = value,
                    .epoch = tp_trainer_epoch_num(tr), .local_step = tp_trainer_local_step(tr),
                    .global_step = tp_trainer_global_step(tr), .t_ns = tp_now_ns()};
    if (s_send(w->a, &ev, name, n) < 0)
        TP_WARN("scalar %s not sent to the observing callbacks: %s", name, tp_last_error());
}

static void w_destroy(void *impl) {
    s_obs_t *w = impl;
    tp_callback_destroy(&w->inner);  /* when setup_graph never took it */
    free(w);
}

static tp_callback_t *s_observe(tp_callback_t *cb, int latest, double interval_s) {
    if (!cb)
        return NULL;
    if (tp_callback_observes(cb))
        return cb;  /* observing already */
    s_obs_t *w = calloc(1, sizeof *w);
    if (!w) {
        tp_callback_destroy(&cb);
        tp_error(TP_ERR_NOMEM, "observing callback");
        return NULL;
    }
    const tp_callback_ops_t *in = tp_callback_ops(cb);
    w->inner = cb;
    w->latest = latest;
    w->interval_ns = interval_s > 0 ? (uint64_t)(interval_s * 1e9) : 0;
    w->ops = (tp_callback_ops_t){
        .name = tp_callback_name(cb),
        .setup_graph = w_setup_graph,
        .before_train = in->before_train ? w_before_train : NULL,
        .before_epoch = in->before_epoch ? w_before_epoch : NULL,
        .before_run = in->before_run || in->after_run ? w_before_run : NULL,
        .after_run = in->before_run || in->after_run ? w_after_run : NULL,
        .trigger_step = in->trigger_step ? w_trigger_step : NULL,
        .after_epoch = in->after_epoch ? w_after_epoch : NULL,
        .trigger_epoch = in->trigger_epoch ? w_trigger_epoch : NULL,
        .trigger = in->trigger ? w_trigger : NULL,
        .after_train = in->after_train ? w_after_train : NULL,
        .on_scalar = w_on_scalar,
        .destroy = w_destroy,
    };
    return tp_callback_new(&w->ops, w, tp_callback_chief_only(cb));
}

tp_callback_t *tp_cb_observe(tp_callback_t *cb) { return s_observe(cb, 0, 0); }

tp_callback_t *tp_cb_observe_latest(tp_callback_t *cb, double interval_s) {
    return s_observe(cb, 1, interval_s);
}

int tp_callback_observes(const tp_callback_t *cb) {
    return tp_callback_ops(cb)->setup_graph == w_setup_graph;
}
