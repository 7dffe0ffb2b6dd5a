/* towerpack pipeline: the callback actor, where observing callbacks run.
 *
 * A callback wrapped by tp_cb_observe or tp_cb_observe_latest keeps its
 * place among the trainer's callbacks, but on the trainer's thread it only
 * turns each of its hooks into a message: the hook, the epoch, the local and
 * global step of the moment, and for after_run the values it asked for. One
 * actor per trainer (a zactor: its own thread, the pipe its socket) takes
 * those messages in order and runs the callback's real hooks there. So a
 * progress bar on a slow terminal or a monitor writing to a slow disk never
 * holds up a step.
 *
 * Which way the files depend: this file builds on the trainer
 * (pipeline/train/trainer.c), through its public header and the narrow one
 * (pipeline/trainer_internal.h); the trainer calls nothing here. The first
 * observer's setup_graph attaches the actor to the trainer as a sidecar (an
 * ops table: start, poll, epoch_end, finish, destroy) and the loop calls
 * those by name. As with czmq's zactor, the trainer and the actor's thread
 * share only the pipe and the arguments the thread was started with: the
 * observers see a trainer of the actor's own (the mirror: a plain trainer
 * that follows the loop, tp_trainer_follow, with its own counters and
 * scalars, fed by the messages), and nothing on the actor's thread points
 * at the trainer whose loop runs. What an observer does to its trainer
 * goes back as a message: scalars it puts, a stop request.
 *
 * Lifetime: made (not started) by the first observer's setup_graph;
 * started by the loop after every setup_graph (its start returns once the
 * thread runs, with the mirror holding the trainer's scalars so far); at
 * finish, after every after_train was sent, the trainer waits until the
 * observers ran all of their hooks and stops the thread; destroy stops it
 * if it still runs (after a failure or a signal: what is queued is
 * skipped) and returns only once the thread has ended.
 *
 * What crosses, trainer -> actor (one s_event_t frame, maybe a second):
 *   HOOK       an observer's hook; after_run carries its fetched values
 *   SCALAR     a scalar the trainer's side put (name in the second frame)
 *   EPOCH_END  the epoch's scalars join their history
 *   FINISH     after every after_train: answer FINISHED when done
 *   $TERM      end (czmq's convention), answered by EXITED
 * and actor -> trainer (one s_reply_t frame, maybe a second):
 *   SCALAR     a scalar an observer put: the trainer stores it too
 *   STOP       an observer asked training to stop (the reason)
 *   ERROR      the first hook that failed (its message)
 *   FINISHED   every event before FINISH has run
 *   EXITED     the thread's last message: it touches nothing after it
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
#include "pipeline/callback_actor.h"
#include "pipeline/trainer_internal.h"

/* Latest-only observers get a step only while at most this many events
 * wait at the actor. */
#define S_LATEST_BACKLOG 4
#define S_NAME_MAX 64
#define S_MAX_FETCHES 16
/* How often a trainer waiting for the actor to end says what it waits on. */
#define S_SAY_NS 5000000000ull

enum { EV_HOOK = 1, EV_SCALAR, EV_EPOCH_END, EV_FINISH, EV_IMAGE };
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

enum { RE_SCALAR = 1, RE_STOP, RE_ERROR, RE_FINISHED, RE_EXITED };
typedef struct {
    uint32_t kind;
    int32_t status;  /* ERROR: the hook's; STOP: 1 when interrupted */
    double value;
} s_reply_t;

typedef struct s_obs s_obs_t;

/* One observer as the actor's thread knows it: its callback (owned by the
 * mirror) and the names its before_run asked at setup. */
typedef struct {
    tp_callback_t *cb;
    char names[S_MAX_FETCHES][S_NAME_MAX];
    int nnames;
} s_seat_t;

struct tp_cb_actor {
    /* ---- the trainer's side (its thread only) ---- */
    s_obs_t **obs;           /* the wrappers, by index */
    int nobs, capobs;
    s_obs_t *forwarder;      /* the observer whose on_scalar sends scalars (and images) */
    zactor_t *actor;         /* NULL until started, and once stopped */
    void *pipe;              /* the trainer's end */
    int started;             /* once: a trainer with observers trains once */
    uint64_t sent;
    tp_status_t failed;      /* the first failure the actor reported */
    char failmsg[1024];
    int failure_returned, finished, exited;
    const char *applying;    /* a scalar an observer put, being stored: not sent back */
    char stop_reason[1024];  /* an observer's stop request, kept for the trainer */
    double watchdog_s;       /* the trainer's watchdog period (0: off) */
    uint64_t warned_since, warned_at;
    /* ---- the arguments: made at start on the trainer's thread, the
     * actor's thread's alone while it runs, the trainer's again after
     * EXITED (the pipe's messages order it; TP_HANDOFF_* tell TSan) ---- */
    tp_trainer_t *mirror;    /* what the observers see: a trainer of its own */
    s_seat_t *seats;         /* [nobs] */
    tp_fetches_t *fetches;
    int64_t samples_per_step;
    void *sock;              /* the actor's end */
    int hook_failed;         /* after a failure only after_train runs */
    const char *muted;       /* a scalar the trainer sent, being stored: not sent back */
    int stop_sent;
    /* ---- shared counters: written by one thread each, read by any ---- */
    atomic_int quit;         /* set by destroy: skip what is queued, end */
    atomic_uint_fast64_t done, busy_ns, starved_ns, replies, skipped;
    uint64_t taken;          /* replies the trainer has taken (its own) */
    uint64_t start_ns;
    /* Its heartbeat: the hook it is in now (the callback's name, the
     * hook's, the global step it was due at) and since when (0: between
     * hooks). Written by the actor, read by the trainer's watchdog, which
     * names an observer stuck in one hook for watchdog_s. */
    _Atomic(const char *) cur_cb;
    _Atomic(const char *) cur_hook;
    atomic_int_fast64_t cur_step;
    atomic_uint_fast64_t cur_since_ns;
};

/* An observing callback: the wrapper on the trainer's side. */
struct s_obs {
    tp_callback_ops_t ops;   /* this instance's: the inner's name, its hooks */
    tp_callback_t *inner;    /* until the actor starts and its mirror takes it */
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

/* ---- the mirror: the trainer the observers see -------------------------------------- */

static tp_status_t m_run_step(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    (void)impl, (void)tr, (void)f;
    return tp_error(TP_ERR_STATE, "the trainer seen from the callback actor runs no steps");
}

static tp_status_t m_set_hyperparam(void *impl, const char *name, double value) {
    (void)impl, (void)value;
    return tp_error(TP_ERR_STATE,
                    "an observing callback cannot set hyper-parameter '%s': it runs "
                    "beside the steps (docs/callbacks.md); set it from a synchronous "
                    "callback", name);
}

static int64_t m_samples_per_step(void *impl) {
    return ((const tp_cb_actor_t *)impl)->samples_per_step;
}

static const tp_trainer_ops_t s_mirror_ops = {
    .name = "the trainer seen from the callback actor",
    .run_step = m_run_step,
    .set_hyperparam = m_set_hyperparam,
    .samples_per_step = m_samples_per_step,
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

/* The last callback of the mirror: a scalar an observer puts goes back to
 * the trainer (not one the trainer sent: the actor mutes it then). */
static void back_on_scalar(void *impl, tp_trainer_t *tr, const char *name, double value) {
    tp_cb_actor_t *a = impl;
    (void)tr;
    if (!a->muted || strcmp(a->muted, name) != 0)  /* one its on_scalar put: back */
        s_reply(a, RE_SCALAR, 0, value, name);
}

static const tp_callback_ops_t s_back_ops = {
    .name = "ObserverScalarsBack", .on_scalar = back_on_scalar,
};

/* An observer asked its trainer (the mirror) to stop: tell the trainer,
 * once. The reason goes as text; the trainer keeps a copy. */
static void s_pass_stop(tp_cb_actor_t *a) {
    int stop = tp_trainer_stop_requested(a->mirror);
    if (!stop || a->stop_sent)
        return;
    a->stop_sent = 1;
    s_reply(a, RE_STOP, stop == 2, 0, tp_trainer_stop_reason(a->mirror));
}

static void s_run_hook(tp_cb_actor_t *a, const s_event_t *ev, const void *extra,
                       size_t extra_size) {
    tp_trainer_t *m = a->mirror;
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
    const s_seat_t *seat = &a->seats[ev->obs];
    tp_callback_t *cb = seat->cb;
    if (!cb)
        return;  /* its start failed before this one was seated */
    tp_trainer_follow_at(m, ev->epoch, ev->local_step, ev->global_step, ev->t_ns);
    atomic_store_explicit(&a->cur_cb, tp_callback_name(cb), memory_order_relaxed);
    atomic_store_explicit(&a->cur_hook, hook_names[ev->hook], memory_order_relaxed);
    atomic_store_explicit(&a->cur_step, ev->global_step, memory_order_relaxed);
    atomic_store_explicit(&a->cur_since_ns, tp_now_ns(), memory_order_release);
    tp_status_t rc = TP_OK;
    switch (ev->hook) {
    case H_BEFORE_TRAIN: rc = tp_cb_before_train(cb, m); break;
    case H_BEFORE_EPOCH: rc = tp_cb_before_epoch(cb, m); break;
    case H_TRIGGER_STEP: rc = tp_cb_trigger_step(cb, m); break;
    case H_AFTER_EPOCH: rc = tp_cb_after_epoch(cb, m); break;
    case H_TRIGGER_EPOCH: rc = tp_cb_trigger_epoch(cb, m); break;
    case H_TRIGGER: rc = tp_cb_trigger(cb, m); break;
    case H_AFTER_TRAIN: rc = tp_cb_after_train(cb, m); break;
    case H_AFTER_RUN: {
        /* Its before_run asks again (here, on its own table); the values
         * the step gave for the names it asked at setup come with the
         * event: n doubles, then n flags. */
        int n = ev->nvalues;
        if (n < 0 || n > seat->nnames || extra_size != (size_t)n * 9)
            n = 0;
        tp_fetches_begin(a->fetches);
        /* before_run as it would have been: before the step counted */
        tp_trainer_follow_at(m, ev->epoch, ev->local_step, ev->global_step - 1, ev->t_ns);
        rc = tp_cb_before_run(cb, m, a->fetches);
        tp_trainer_follow_at(m, ev->epoch, ev->local_step, ev->global_step, ev->t_ns);
        for (int i = 0; rc >= 0 && i < n; i++) {
            double x;
            memcpy(&x, (const char *)extra + (size_t)i * 8, 8);
            if (((const uint8_t *)extra)[(size_t)n * 8 + (size_t)i])
                tp_fetches_set(a->fetches, seat->names[i], x);
        }
        if (rc >= 0)
            rc = tp_cb_after_run(cb, m, a->fetches);
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
    s_pass_stop(a);
}

/* A scalar the trainer's side put: stored in the mirror at the steps it
 * was put at (monitors stamp it so), and the observers told; not sent
 * back. */
static void s_take_scalar(tp_cb_actor_t *a, const s_event_t *ev, const char *name) {
    tp_trainer_follow_at(a->mirror, ev->epoch, ev->local_step, ev->global_step, ev->t_ns);
    a->muted = name;
    tp_trainer_put_scalar(a->mirror, name, ev->value);
    a->muted = NULL;
    s_pass_stop(a);  /* an on_scalar may ask */
}

/* An image the trainer's side put: the frame is s_image_head_t, the tag,
 * then H x W x C bytes (sizes checked against the frame's). */
typedef struct {
    uint32_t tag_len;
    int32_t h, w, c;
} s_image_head_t;

static void s_take_image(tp_cb_actor_t *a, const s_event_t *ev, const void *x, size_t xs) {
    s_image_head_t hd;
    if (xs < sizeof hd)
        return;
    memcpy(&hd, x, sizeof hd);
    size_t pixels = (size_t)hd.h * (size_t)hd.w * (size_t)hd.c;
    if (hd.tag_len == 0 || hd.tag_len > S_NAME_MAX || hd.h < 1 || hd.w < 1 ||
        (hd.c != 1 && hd.c != 3) || xs != sizeof hd + hd.tag_len + pixels)
        return;
    char tag[S_NAME_MAX + 1];
    memcpy(tag, (const char *)x + sizeof hd, hd.tag_len);
    tag[hd.tag_len] = '\0';
    int64_t shape[3] = {hd.h, hd.w, hd.c};
    tp_tensor_t img;
    if (tp_tensor_init_wrap(&img, TP_UINT8, 3, shape,
                            (char *)x + sizeof hd + hd.tag_len, NULL, NULL) != TP_OK)
        return;
    tp_trainer_follow_at(a->mirror, ev->epoch, ev->local_step, ev->global_step, ev->t_ns);
    tp_trainer_put_image(a->mirror, tag, &img);
    s_pass_stop(a);
}

static void s_actor(zsock_t *pipe, void *arg) {
    tp_cb_actor_t *a = arg;
    a->sock = zsock_resolve(pipe);
    tp_actor_name_thread("callbacks");
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
                    s_take_scalar(a, &ev, name);
                }
                break;
            case EV_IMAGE:
                s_take_image(a, &ev, x, xs);
                break;
            case EV_EPOCH_END:
                tp_trainer_follow_epoch_end(a->mirror);
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
    /* The arguments are the trainer's again: this is the last message, and
     * nothing of `a` is touched after it. */
    TP_HANDOFF_RELEASE(a);
    s_reply_t r = {RE_EXITED, 0, 0};
    zmq_send(a->sock, &r, sizeof r, 0);
}

/* ---- the trainer's side ----------------------------------------------------------- */

static tp_cb_actor_t *s_new(void) {
    tp_cb_actor_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->mirror = tp_trainer_new(&s_mirror_ops, a);
    a->fetches = tp_fetches_new();
    if (!a->mirror || !a->fetches) {
        tp_trainer_destroy(&a->mirror);
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
    return a;
}

/* Take the replies waiting (never waits); `tr` NULL: drop them (but for
 * EXITED). */
static void s_drain_replies(tp_cb_actor_t *a, tp_trainer_t *tr) {
    char text[1024];
    while (!a->exited) {
        s_reply_t r;
        int n = zmq_recv(a->pipe, &r, sizeof r, ZMQ_DONTWAIT);
        if (n < 0) {
            if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
                a->exited = 1;  /* the context is ending: so is the thread */
            return;
        }
        int more = 0;
        size_t ms = sizeof more;
        zmq_getsockopt(a->pipe, ZMQ_RCVMORE, &more, &ms);
        int tn = 0;
        text[0] = '\0';
        if (more) {
            tn = zmq_recv(a->pipe, text, sizeof text - 1, 0);
            text[tn > 0 ? (tn < (int)sizeof text - 1 ? tn : (int)sizeof text - 1) : 0] = '\0';
        }
        if (n != (int)sizeof r)
            continue;
        if (r.kind != RE_EXITED)
            a->taken++;  /* s_reply counts the others */
        if (r.kind == RE_EXITED) {
            TP_HANDOFF_ACQUIRE(a);
            a->exited = 1;
            return;
        }
        if (!tr)
            continue;
        switch (r.kind) {
        case RE_SCALAR:
            if (text[0]) {  /* the trainer's store and callbacks; not back to the actor */
                a->applying = text;
                tp_trainer_put_scalar(tr, text, r.value);
                a->applying = NULL;
            }
            break;
        case RE_STOP:
            snprintf(a->stop_reason, sizeof a->stop_reason, "%s", text);
            tp_trainer_request_stop(tr, a->stop_reason, r.status);
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

/* What the heartbeat says: in which hook the actor is, since when (0:
 * between hooks). */
static uint64_t s_heartbeat(tp_cb_actor_t *a, const char **cb, const char **hook,
                            long long *step) {
    uint64_t since = atomic_load_explicit(&a->cur_since_ns, memory_order_acquire);
    *cb = atomic_load_explicit(&a->cur_cb, memory_order_relaxed);
    *hook = atomic_load_explicit(&a->cur_hook, memory_order_relaxed);
    *step = (long long)atomic_load_explicit(&a->cur_step, memory_order_relaxed);
    if (!*cb)
        *cb = "?";
    if (!*hook)
        *hook = "?";
    /* it moved on meanwhile: what was read may be of two hooks */
    return atomic_load_explicit(&a->cur_since_ns, memory_order_acquire) == since ? since : 0;
}

/* The watchdog, on the trainer's side: an observer in one hook for longer
 * than the trainer's watchdog period is named (again every period while it
 * stays there). Training goes on: observers only watch, and training waits
 * for them only at its end. */
static void s_watch(tp_cb_actor_t *a) {
    double limit = a->watchdog_s;
    if (limit <= 0 || !atomic_load_explicit(&a->cur_since_ns, memory_order_acquire))
        return;
    const char *cb, *hook;
    long long step;
    uint64_t since = s_heartbeat(a, &cb, &hook, &step), now = tp_now_ns();
    if (!since || (double)(now - since) * 1e-9 < limit ||
        (since == a->warned_since && (double)(now - a->warned_at) * 1e-9 < limit))
        return;
    a->warned_since = since;
    a->warned_at = now;
    TP_WARN("callback watchdog: the callback actor has been in %s.%s (due at global "
            "step %lld) for %.1f s; the observers behind it wait (training does "
            "not, until its end)", cb, hook, step, (double)(now - since) * 1e-9);
}

static void s_drain(tp_cb_actor_t *a, tp_trainer_t *tr) {
    s_drain_replies(a, tr);
    s_watch(a);
}

/* Stop the thread and return once it has ended (czmq's zactor_destroy,
 * but saying every 5 s which hook it still waits for). `skip`: what is
 * still queued is not run (after a failure, a signal). */
static void s_stop(tp_cb_actor_t *a, int skip) {
    if (!a->actor)
        return;
    if (skip)
        atomic_store(&a->quit, 1);
    int term_sent = 0;
    uint64_t t0 = tp_now_ns(), said = t0;
    for (;;) {
        if (!term_sent)
            term_sent = zmq_send(a->pipe, "$TERM", 5, ZMQ_DONTWAIT) == 5;
        s_drain_replies(a, NULL);  /* the replies still coming are dropped */
        if (a->exited)
            break;
        uint64_t now = tp_now_ns();
        if (now - said >= S_SAY_NS) {
            said = now;
            const char *cb, *hook;
            long long step;
            if (s_heartbeat(a, &cb, &hook, &step))
                TP_WARN("waiting for the callback actor to end: it is in %s.%s (due at "
                        "global step %lld) after %.0f s", cb, hook, step,
                        (double)(now - t0) * 1e-9);
            else
                TP_WARN("waiting for the callback actor to end (%.0f s)",
                        (double)(now - t0) * 1e-9);
        }
        zmq_pollitem_t it = {a->pipe, 0, (short)(ZMQ_POLLIN | (term_sent ? 0 : ZMQ_POLLOUT)), 0};
        zmq_poll(&it, 1, 1000);
    }
    zactor_destroy(&a->actor);  /* its own $TERM goes nowhere; waits for the shim */
    a->pipe = NULL;
}

/* Send one event (and `extra`, if any), waiting while the actor's queue is
 * full; the replies are taken meanwhile. */
static tp_status_t s_send(tp_cb_actor_t *a, tp_trainer_t *tr, const s_event_t *ev,
                          const void *extra, size_t extra_size) {
    if (!a->actor)
        return tp_error(TP_ERR_STATE, "the callback actor is not running (an observing "
                        "callback's hook before training began, or after it ended)");
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
        s_drain(a, tr);
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

/* ---- the sidecar: what the trainer's loop calls --------------------------------------- */

/* Give the mirror what the trainer has now, hand each observer's callback
 * to it, start the thread; returns once it runs. */
static tp_status_t sc_start(void *impl, tp_trainer_t *tr) {
    tp_cb_actor_t *a = impl;
    if (a->started)
        return tp_error(TP_ERR_STATE, "the callback actor: started twice (a trainer with "
                        "observing callbacks trains once)");
    a->started = 1;
    tp_trainer_t *m = a->mirror;
    /* The scalars so far, before it has callbacks: no one is told. */
    for (size_t i = 0; i < tp_trainer_scalar_count(tr); i++) {
        const char *name = tp_trainer_scalar_name(tr, i);
        double v;
        if (tp_trainer_get_scalar(tr, name, &v) == TP_OK)
            tp_trainer_put_scalar(m, name, v);
    }
    TP_TRY(tp_trainer_set_logdir(m, tp_trainer_logdir(tr)));
    a->samples_per_step = tp_trainer_samples_per_step(tr);
    a->watchdog_s = tp_trainer_watchdog(tr);
    a->seats = calloc((size_t)(a->nobs ? a->nobs : 1), sizeof *a->seats);
    if (!a->seats)
        return tp_error(TP_ERR_NOMEM, "the callback actor");
    /* The trainer decided chief_only already (a wrapper keeps its inner's). */
    tp_trainer_set_chief(m, 1);
    for (int i = 0; i < a->nobs; i++) {
        s_obs_t *w = a->obs[i];
        s_seat_t *seat = &a->seats[i];
        seat->cb = w->inner;
        memcpy(seat->names, w->names, sizeof seat->names);
        seat->nnames = w->nnames;
        TP_TRY(tp_trainer_add_callback(m, &w->inner));  /* the mirror owns it now */
    }
    tp_callback_t *back = tp_callback_new(&s_back_ops, a, 0);
    TP_TRY(tp_trainer_add_callback(m, &back));  /* last: observers see their own puts first */
    tp_trainer_set_chief(m, tp_trainer_is_chief(tr));
    tp_trainer_follow(m, tp_trainer_schedule(tr));
    tp_trainer_follow_at(m, tp_trainer_epoch_num(tr), tp_trainer_local_step(tr),
                         tp_trainer_global_step(tr), tp_now_ns());
    tp_actors_init();
    a->start_ns = tp_now_ns();
    a->actor = zactor_new(s_actor, a);  /* returns once the thread runs */
    if (!a->actor)
        return tp_error(TP_ERR_NOMEM, "the callback actor");
    a->pipe = zsock_resolve(a->actor);
    return TP_OK;
}

/* Every step: the replies, only when the actor has sent one not taken
 * yet. An empty non-blocking zmq_recv is not free: libzmq checks its
 * mailbox with a getpid (its fork check) and a poll, two system calls a
 * step, a few microseconds each in a VM (the engine's step against the
 * bare loop, docs/performance.md). The actor counts a reply after it is
 * in the pipe, so a count ahead of `taken` means one can be read; the
 * others who drain (s_send's wait, finish, stop) still drain always, and
 * the watchdog looks every step. */
static tp_status_t sc_poll(void *impl, tp_trainer_t *tr) {
    tp_cb_actor_t *a = impl;
    if (a->actor) {
        if (atomic_load_explicit(&a->replies, memory_order_relaxed) != a->taken)
            s_drain_replies(a, tr);
        s_watch(a);
    }
    return s_pending_failure(a);
}

static tp_status_t sc_epoch_end(void *impl, tp_trainer_t *tr) {
    tp_cb_actor_t *a = impl;
    s_event_t ev = {.kind = EV_EPOCH_END, .epoch = tp_trainer_epoch_num(tr)};
    if (a->actor)
        TP_TRY(s_send(a, tr, &ev, NULL, 0));
    return sc_poll(a, tr);
}

/* Wait until the observers ran every hook sent (their files written), take
 * what they sent back, stop the thread. After a signal: 5 s more, then
 * training ends without them (destroy stops the thread). */
static tp_status_t sc_finish(void *impl, tp_trainer_t *tr) {
    tp_cb_actor_t *a = impl;
    if (!a->actor)
        return s_pending_failure(a);
    s_event_t ev = {.kind = EV_FINISH};
    TP_TRY(s_send(a, tr, &ev, NULL, 0));
    uint64_t t0 = tp_now_ns(), said = t0, signalled = 0;
    while (s_drain(a, tr), !a->finished && !a->exited) {
        uint64_t now = tp_now_ns();
        if (now - said > S_SAY_NS) {
            said = now;
            TP_INFO("waiting for the observing callbacks: %llu events still to run "
                    "(%.0f s so far)",
                    (unsigned long long)(a->sent - atomic_load(&a->done)),
                    (double)(now - t0) * 1e-9);
        }
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
    s_stop(a, 0);
    return s_pending_failure(a);
}

static void sc_destroy(void *impl) {
    tp_cb_actor_t *a = impl;
    if (!a)
        return;
    s_stop(a, 1);
    tp_trainer_destroy(&a->mirror);  /* and the observers' callbacks in it */
    tp_fetches_destroy(&a->fetches);
    free(a->seats);
    free(a->obs);
    free(a);
}

static const tp_sidecar_ops_t s_sidecar_ops = {
    .name = "the callback actor",
    .start = sc_start,
    .poll = sc_poll,
    .epoch_end = sc_epoch_end,
    .finish = sc_finish,
    .destroy = sc_destroy,
};

tp_cb_actor_t *tp_cb_actor_of(const tp_trainer_t *tr) {
    return tp_trainer_sidecar(tr, &s_sidecar_ops);
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

/* ---- the wrapper ---------------------------------------------------------------- */

static s_event_t s_hook_event(const s_obs_t *w, tp_trainer_t *tr, uint32_t hook) {
    return (s_event_t){.kind = EV_HOOK, .hook = hook, .obs = w->index,
                       .epoch = tp_trainer_epoch_num(tr),
                       .local_step = tp_trainer_local_step(tr),
                       .global_step = tp_trainer_global_step(tr), .t_ns = tp_now_ns()};
}

static tp_status_t s_hook(s_obs_t *w, tp_trainer_t *tr, uint32_t hook) {
    s_event_t ev = s_hook_event(w, tr, hook);
    return s_send(w->a, tr, &ev, NULL, 0);
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
    if (!w->inner)
        return tp_error(TP_ERR_STATE, "observing callback %s: set up again (a trainer "
                        "with observing callbacks trains once)", w->ops.name);
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
    /* The trainer's callback actor: the first observer attaches it; the
     * loop starts it once every setup_graph has run. */
    tp_cb_actor_t *a = tp_cb_actor_of(tr);
    if (!a) {
        if (!(a = s_new()))
            return tp_error(TP_ERR_NOMEM, "the callback actor");
        TP_TRY(tp_trainer_attach(tr, &s_sidecar_ops, a));
    }
    if (a->started)
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
    return s_send(w->a, tr, &ev, n ? values : NULL, (size_t)n * 9);
}

static tp_status_t w_trigger_step(void *impl, tp_trainer_t *tr) {
    s_obs_t *w = impl;
    return s_deliver(w, tr) ? s_hook(w, tr, H_TRIGGER_STEP) : TP_OK;
}

/* Every scalar the trainer's side puts goes over once (by one observer;
 * the actor tells them all), but for one an observer put (it came from
 * there). Before the actor starts, the mirror takes the trainer's scalars
 * as they are then. */
static void w_on_scalar(void *impl, tp_trainer_t *tr, const char *name, double value) {
    s_obs_t *w = impl;
    if (!w->a || w->a->forwarder != w || !w->a->actor ||
        (w->a->applying && !strcmp(w->a->applying, name)))
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
    if (s_send(w->a, tr, &ev, name, n) < 0)
        TP_WARN("scalar %s not sent to the observing callbacks: %s", name, tp_last_error());
}

/* Every image the trainer's side puts goes over once, like a scalar. */
static void w_on_image(void *impl, tp_trainer_t *tr, const char *tag, const tp_tensor_t *image) {
    s_obs_t *w = impl;
    if (!w->a || w->a->forwarder != w || !w->a->actor)
        return;
    size_t n = strlen(tag), pixels = image->nbytes;
    if (n > S_NAME_MAX) {
        TP_WARN("image %s: tag longer than %d characters, not sent to the observing "
                "callbacks", tag, S_NAME_MAX);
        return;
    }
    s_image_head_t hd = {(uint32_t)n, (int32_t)image->shape[0], (int32_t)image->shape[1],
                         (int32_t)image->shape[2]};
    char *frame = malloc(sizeof hd + n + pixels);
    if (!frame) {
        TP_WARN("image %s not sent to the observing callbacks: out of memory", tag);
        return;
    }
    memcpy(frame, &hd, sizeof hd);
    memcpy(frame + sizeof hd, tag, n);
    memcpy(frame + sizeof hd + n, image->data, pixels);
    s_event_t ev = {.kind = EV_IMAGE, .epoch = tp_trainer_epoch_num(tr),
                    .local_step = tp_trainer_local_step(tr),
                    .global_step = tp_trainer_global_step(tr), .t_ns = tp_now_ns()};
    if (s_send(w->a, tr, &ev, frame, sizeof hd + n + pixels) < 0)
        TP_WARN("image %s not sent to the observing callbacks: %s", tag, tp_last_error());
    free(frame);
}

static void w_destroy(void *impl) {
    s_obs_t *w = impl;
    tp_callback_destroy(&w->inner);  /* when the actor never took it */
    free(w);
}

/* 1 for an observing callback (one that runs on the callback actor). */
static int s_observes(const tp_callback_t *cb) {
    return tp_callback_ops(cb)->setup_graph == w_setup_graph;
}

static tp_callback_t *s_observe(tp_callback_t *cb, int latest, double interval_s) {
    if (!cb)
        return NULL;
    if (s_observes(cb))
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
        .on_image = w_on_image,
        .destroy = w_destroy,
    };
    return tp_callback_new(&w->ops, w, tp_callback_chief_only(cb));
}

tp_callback_t *tp_cb_observe(tp_callback_t *cb) { return s_observe(cb, 0, 0); }

tp_callback_t *tp_cb_observe_latest(tp_callback_t *cb, double interval_s) {
    return s_observe(cb, 1, interval_s);
}
