/* towerpack pipeline: StagingInput, one staging actor per tower over another
 * input (tensorpack's StagingInput).
 *
 * Each tower's stage is an actor (a zactor: its own thread) with a small
 * ring of slots in the tower's memory (nr_stage + 1 of them: one the tower
 * computes on, nr_stage staged ahead). While the tower computes step s, its
 * stage already takes the batch of step s + 1 from the inner input and
 * copies it into a free slot, so the next step finds its batch where the
 * tower reads it. Where the slots live:
 *  - bound to a device backend (tp_input_bind, which the launch calls once
 *    the model is built), each slot component is a backend stage
 *    (tp_backend_stage_*): the stage thread copies the batch into its
 *    pinned host buffer, the backend copies that to the device on its copy
 *    stream, overlapping the tower's compute, and the stage thread waits
 *    for that copy before it hands the slot over. The tower then reads
 *    device memory (the model's input copy becomes device to device on the
 *    tower's stream). Batches staged before the bind stay host memory;
 *  - user ops (tp_stage_ops_t): their allocator and copy;
 *  - otherwise host memory filled with memcpy.
 * A slot is refilled only after its datapoint was destroyed, which the
 * trainer does after tp_model_run returned, and the model has copied its
 * inputs by then: no device read of a slot can race its next fill.
 *
 * Everything between the actors travels over inproc sockets:
 *  - the turn at the inner input is a token passed around the stages in a
 *    ring (PAIR sockets, tower 0 -> 1 -> ... -> 0): a stage takes one
 *    batch, then passes the token on. So tower i at step s gets the batch a
 *    trainer taking them in tower order on one thread would: runs stay
 *    reproducible and a resumed run replays the same stream. A stage takes
 *    the token only when it has a free slot, so a stage that is full holds
 *    up the inner input, which then fills its own queue (backpressure). A
 *    failure of the inner input travels on the token: every stage ends
 *    after the batches it already staged;
 *  - a staged slot goes to the supervisor's thread as one frame (its
 *    pointer) on the stage's PAIR socket; a failure as a frame with the
 *    status and message, after the slots staged before it;
 *  - the supervisor's thread tells a stage to look again (one WAKE frame on
 *    the stage's pipe) each time it takes a batch, and when it has to wait.
 * A slot is free again when the datapoint handed out is destroyed (its
 * components' free function, on whatever thread): an atomic flag the stage
 * reads when it wakes; the supervisor's next WAKE comes after the tower
 * gave the batch back. Memory is bounded by (nr_stage + 1) x batch bytes
 * per tower, and at most nr_stage batches are staged ahead of the one the
 * tower holds. */
#include <czmq.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/actor.h>  /* TP_HANDOFF_*; a wait's owner saying stop; thread names */
#include <towerpack/backend.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/stats.h>
#include <towerpack/supervisor.h>
#include <towerpack/launch.h>

#define MAX_TOWERS 64
#define MAX_COMP 16
#define MAX_SLOTS (TP_STAGE_MAX + 1)
#define S_MSG_MAX 1000

typedef struct s_stage s_stage_t;
typedef struct s_staging s_staging_t;

typedef struct {
    s_stage_t *stage;
    atomic_int busy;          /* staged or lent out: not to be filled */
    int ncomp;
    void *buf[MAX_COMP];      /* the tower's memory, kept between uses */
    size_t cap[MAX_COMP];
    tp_stage_t *bstage[MAX_COMP]; /* when buf is a backend stage's device side */
    tp_backend_t *bstage_of[MAX_COMP]; /* the backend that made it */
    tp_tensor_t meta[MAX_COMP]; /* dtype and shape of what was staged */
    atomic_int refs;          /* components handed out and not yet freed */
} s_slot_t;

/* A stage -> the supervisor: a staged slot (rc 0), or why the stage ended
 * (rc < 0, then the message; the frame is cut after its NUL). */
typedef struct {
    s_slot_t *slot;
    int32_t rc;
    char msg[S_MSG_MAX];
} s_staged_t;

/* The turn at the inner input, from stage to stage; rc < 0: the input
 * failed at tower `origin` (the message), every stage ends. */
typedef struct {
    int32_t rc;
    int32_t origin;
    char msg[S_MSG_MAX];
} s_token_t;

struct s_stage {
    s_staging_t *owner;
    int tower;
    char out_ep[96], tok_ep[96];
    zactor_t *actor;          /* its thread; the pipe carries WAKE frames */
    zsock_t *in;              /* the supervisor's end of its slots (PAIR) */
    s_slot_t slots[MAX_SLOTS];
    /* written by the stage, read by any thread */
    atomic_uint_fast64_t staged, busy_ns, starved_ns, blocked_ns;
    atomic_int failed;
    atomic_int started;       /* its sockets are up (set before it signals) */
    /* written by the supervisor, read by the stage: batches taken */
    atomic_uint_fast64_t taken;
    /* the supervisor's own */
    atomic_uint_fast64_t waited_ns;
    tp_status_t err;          /* what ended the stage, once its frame came */
    char errmsg[S_MSG_MAX + 64];
};

struct s_staging {
    tp_input_t *inner;
    int nr_stage;
    tp_stage_ops_t ops;
    int has_ops;
    /* bound: tower i's device backend (its stages), or NULL */
    tp_backend_t *_Atomic device[MAX_TOWERS];
    int towers;               /* the stages running: 0 when stopped */
    double t_start;
    double watchdog_s;
    s_stage_t stages[MAX_TOWERS];
};

/* ---- memory: host by default, the device's through tp_stage_ops_t ---- */

static void *s_alloc(s_staging_t *s, int tower, size_t bytes) {
    if (s->has_ops && s->ops.alloc)
        return s->ops.alloc(s->ops.user, tower, bytes);
    return tp_alloc(bytes ? bytes : 1);
}

static void s_free(s_staging_t *s, int tower, void *p) {
    if (!p)
        return;
    if (s->has_ops && s->ops.free)
        s->ops.free(s->ops.user, tower, p);
    else
        tp_free(p);
}

static tp_status_t s_copy(s_staging_t *s, int tower, void *dst, const void *src,
                          size_t bytes) {
    if (s->has_ops && s->ops.copy)
        return s->ops.copy(s->ops.user, tower, dst, src, bytes);
    memcpy(dst, src, bytes);
    return TP_OK;
}

/* Only the stage's thread adds to its counters: a relaxed load and store. */
static void s_add(atomic_uint_fast64_t *c, uint64_t v) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
                          memory_order_relaxed);
}

/* Free a slot component's memory, whichever kind it is. */
static void s_free_comp(s_staging_t *s, int tower, s_slot_t *slot, int c) {
    if (slot->bstage[c])
        tp_backend_stage_destroy(slot->bstage_of[c], &slot->bstage[c]);
    else
        s_free(s, tower, slot->buf[c]);
    slot->buf[c] = NULL;
    slot->cap[c] = 0;
}

/* Copy `dp` into device stages of `dev`: every component into its pinned
 * host buffer and on its way (the copies run on the backend's copy stream
 * while the tower computes), then wait for all of them: the slot is on
 * the device when it is handed over. */
static tp_status_t s_stage_device(s_staging_t *s, s_stage_t *st, s_slot_t *slot,
                                  const tp_datapoint_t *dp, int n,
                                  tp_backend_t *dev) {
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        if (!slot->bstage[i] || slot->bstage_of[i] != dev || slot->cap[i] < t->nbytes) {
            s_free_comp(s, st->tower, slot, i);  /* host memory from before the bind */
            slot->bstage[i] = tp_backend_stage_new(dev, t->nbytes);
            if (!slot->bstage[i])
                return tp_error_wrap(TP_ERR_NOMEM, "StagingInput tower%d: a stage "
                                     "of %zu bytes for component %d on %s device %d",
                                     st->tower, t->nbytes, i, tp_backend_name(dev),
                                     tp_backend_device(dev));
            slot->bstage_of[i] = dev;
            slot->buf[i] = tp_backend_stage_device(dev, slot->bstage[i]);
            slot->cap[i] = t->nbytes;
        }
        /* waits for the last copy out of the pinned buffer, if any */
        void *host = tp_backend_stage_host(dev, slot->bstage[i]);
        if (!host)
            return tp_error_wrap(TP_ERR_DEVICE, "StagingInput tower%d: component %d",
                                 st->tower, i);
        memcpy(host, t->data, t->nbytes);
        tp_status_t rc = tp_backend_stage_begin(dev, slot->bstage[i], t->nbytes);
        if (rc < 0)
            return tp_error_wrap(rc, "StagingInput tower%d: copying component %d "
                                 "(%zu bytes) to %s device %d", st->tower, i,
                                 t->nbytes, tp_backend_name(dev), tp_backend_device(dev));
    }
    for (int i = 0; i < n; i++) {
        tp_status_t rc = tp_backend_stage_host_wait(dev, slot->bstage[i]);
        if (rc < 0)
            return tp_error_wrap(rc, "StagingInput tower%d: waiting for component "
                                 "%d's copy to %s device %d", st->tower, i,
                                 tp_backend_name(dev), tp_backend_device(dev));
    }
    return TP_OK;
}

static void s_keep_meta(s_slot_t *slot, const tp_datapoint_t *dp, int n) {
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        slot->meta[i].dtype = t->dtype;
        slot->meta[i].ndim = t->ndim;
        memcpy(slot->meta[i].shape, t->shape, sizeof t->shape);
        slot->meta[i].nbytes = t->nbytes;
    }
    slot->ncomp = n;
}

/* Copy `dp` into the slot's buffers (grown when a batch is larger). */
static tp_status_t s_stage_into(s_staging_t *s, s_stage_t *st, s_slot_t *slot,
                                const tp_datapoint_t *dp) {
    int n = tp_datapoint_size(dp);
    if (n > MAX_COMP)
        return tp_error(TP_ERR_INVALID, "StagingInput tower%d: a batch with %d "
                        "components (at most %d)", st->tower, n, MAX_COMP);
    tp_backend_t *dev = atomic_load_explicit(&s->device[st->tower], memory_order_acquire);
    if (dev) {
        TP_TRY(s_stage_device(s, st, slot, dp, n, dev));
        s_keep_meta(slot, dp, n);
        return TP_OK;
    }
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        if (slot->cap[i] < t->nbytes) {
            s_free_comp(s, st->tower, slot, i);
            slot->buf[i] = s_alloc(s, st->tower, t->nbytes);
            if (!slot->buf[i]) {
                slot->cap[i] = 0;
                return tp_error(TP_ERR_NOMEM, "StagingInput tower%d: %zu bytes "
                                "for component %d", st->tower, t->nbytes, i);
            }
            slot->cap[i] = t->nbytes;
        }
        if (t->nbytes)
            TP_TRY(s_copy(s, st->tower, slot->buf[i], t->data, t->nbytes));
    }
    s_keep_meta(slot, dp, n);
    return TP_OK;
}

/* ---- a stage (its own thread) ----------------------------------------------- */

/* Send one frame; while it cannot go (its peer is gone at a stop), watch
 * the pipe: 0 sent, -1 when $TERM came meanwhile (the stage ends). */
static int s_send(void *sock, const void *buf, size_t len, zsock_t *pipe) {
    while (zmq_send(sock, buf, len, ZMQ_DONTWAIT) < 0) {
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
            return -1;
        zmq_pollitem_t it = {zsock_resolve(pipe), 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 10) > 0) {
            char cmd[16];
            int got = zmq_recv(zsock_resolve(pipe), cmd, sizeof cmd, 0);
            if (got == 5 && !memcmp(cmd, "$TERM", 5))
                return -1;
        }
    }
    return 0;
}

/* Tell the supervisor why this stage ends (after what it staged). */
static int s_send_end(void *out, tp_status_t rc, const char *msg, zsock_t *pipe) {
    s_staged_t f = {.slot = NULL, .rc = (int32_t)rc};
    snprintf(f.msg, sizeof f.msg, "%s", msg);
    return s_send(out, &f, offsetof(s_staged_t, msg) + strlen(f.msg) + 1, pipe);
}

static int s_pass_token(void *tok_out, const s_token_t *t, zsock_t *pipe) {
    return s_send(tok_out, t, offsetof(s_token_t, msg) + strlen(t->msg) + 1, pipe);
}

/* The stage's turn: one batch from the inner input into `slot`. TP_OK, or
 * the inner input's failure (*token_rc set: it travels on) or the copy's. */
static tp_status_t s_take_one(s_staging_t *s, s_stage_t *st, s_slot_t *slot,
                              tp_status_t *token_rc, char *msg, size_t size) {
    uint64_t t0 = tp_now_ns();
    tp_datapoint_t *dp = NULL;
    TP_HANDOFF_ACQUIRE(s->inner);  /* the previous stage's turn happened before */
    tp_status_t rc = tp_input_next(s->inner, st->tower, &dp);
    TP_HANDOFF_RELEASE(s->inner);
    uint64_t t1 = tp_now_ns();
    s_add(&st->starved_ns, t1 - t0);  /* waiting for the inner input */
    if (rc < 0) {
        *token_rc = rc;
        snprintf(msg, size, "StagingInput tower%d: %s", st->tower, tp_last_error());
        return rc;
    }
    rc = s_stage_into(s, st, slot, dp);
    tp_input_release(s->inner, st->tower, &dp);
    s_add(&st->busy_ns, tp_now_ns() - t1);  /* copying into the tower's memory */
    if (rc < 0)
        snprintf(msg, size, "%s", tp_last_error());
    return rc;
}

static void s_stage_actor(zsock_t *pipe, void *arg) {
    s_stage_t *st = arg;
    s_staging_t *s = st->owner;
    const int n = s->towers, nslots = s->nr_stage + 1;
    char name[16];
    snprintf(name, sizeof name, "stage%d", st->tower);
    tp_actor_name_thread(name); /* tp:stage0, beside tp:tower0 */
    zsock_t *out = zsock_new(ZMQ_PAIR), *tok_in = NULL, *tok_out = NULL;
    int ok = out && zsock_bind(out, "%s", st->out_ep) == 0;
    if (ok && n > 1) {
        tok_in = zsock_new(ZMQ_PAIR);
        tok_out = zsock_new(ZMQ_PAIR);
        ok = tok_in && tok_out && zsock_bind(tok_in, "%s", st->tok_ep) == 0 &&
             zsock_connect(tok_out, "%s", s->stages[(st->tower + 1) % n].tok_ep) == 0;
    }
    if (out)
        zsock_set_linger(out, 0);
    if (tok_out)
        zsock_set_linger(tok_out, 0);
    atomic_store(&st->started, ok);
    zsock_signal(pipe, ok ? 0 : 1);
    int have_token = st->tower == 0;  /* tower 0 takes the first batch */
    int ended = !ok, fill_at = 0;
    uint64_t sent = 0;
    char msg[S_MSG_MAX];
    while (ok) {
        s_slot_t *slot = &st->slots[fill_at];
        uint64_t taken = atomic_load_explicit(&st->taken, memory_order_relaxed);
        int can_fill = !ended && !atomic_load_explicit(&slot->busy, memory_order_acquire) &&
                       sent - taken < (uint64_t)s->nr_stage;
        if (can_fill && (have_token || n == 1)) {
            tp_status_t token_rc = TP_OK;
            tp_status_t rc = s_take_one(s, st, slot, &token_rc, msg, sizeof msg);
            if (n > 1) {  /* the turn goes on, with the inner input's failure */
                s_token_t t = {.rc = (int32_t)token_rc, .origin = st->tower};
                snprintf(t.msg, sizeof t.msg, "%s", token_rc < 0 ? msg : "");
                if (s_pass_token(zsock_resolve(tok_out), &t, pipe) < 0)
                    break;
                have_token = 0;
            }
            if (rc < 0) {
                ended = 1;
                atomic_store(&st->failed, 1);
                if (s_send_end(zsock_resolve(out), rc, msg, pipe) < 0)
                    break;
                continue;
            }
            atomic_store_explicit(&slot->busy, 1, memory_order_relaxed);
            s_add(&st->staged, 1);  /* counted before the supervisor can take it */
            sent++;
            fill_at = (fill_at + 1) % nslots;
            s_staged_t f = {.slot = slot};
            TP_HANDOFF_RELEASE(slot);
            if (s_send(zsock_resolve(out), &f, offsetof(s_staged_t, msg), pipe) < 0)
                break;
            continue;
        }
        /* Wait: for the token when the stage could fill (starved), else for
         * the supervisor to take a batch or give a slot back (blocked). A
         * slot given back without a word is seen within 100 ms. */
        zmq_pollitem_t items[2] = {{zsock_resolve(pipe), 0, ZMQ_POLLIN, 0},
                                   {tok_in ? zsock_resolve(tok_in) : NULL, 0, ZMQ_POLLIN, 0}};
        int watch_token = tok_in && !have_token && (can_fill || ended);
        uint64_t w0 = tp_now_ns();
        int r = zmq_poll(items, watch_token ? 2 : 1, 100);
        s_add(can_fill ? &st->starved_ns : &st->blocked_ns, tp_now_ns() - w0);
        if (r < 0 && zmq_errno() != EINTR)
            break;
        if (r <= 0)
            continue;
        if (items[0].revents & ZMQ_POLLIN) {
            char cmd[16];
            int got = zmq_recv(zsock_resolve(pipe), cmd, sizeof cmd, 0);
            if (got == 5 && !memcmp(cmd, "$TERM", 5))
                break;
        }
        if (watch_token && (items[1].revents & ZMQ_POLLIN)) {
            s_token_t t;
            int got = zmq_recv(zsock_resolve(tok_in), &t, sizeof t, 0);
            if (got < (int)offsetof(s_token_t, msg))
                continue;
            t.msg[sizeof t.msg - 1] = '\0';
            have_token = 1;
            if (t.rc < 0 && !ended) {
                /* The inner input failed at another stage: end after what
                 * is staged, and pass the news on (not back to its origin). */
                ended = 1;
                if (s_send_end(zsock_resolve(out), (tp_status_t)t.rc, t.msg, pipe) < 0)
                    break;
                if ((st->tower + 1) % n != t.origin) {
                    if (s_pass_token(zsock_resolve(tok_out), &t, pipe) < 0)
                        break;
                    have_token = 0;
                }
            }
        }
    }
    zsock_destroy(&tok_out);
    zsock_destroy(&tok_in);
    if (out)
        zmq_unbind(zsock_resolve(out), st->out_ep);
    zsock_destroy(&out);
}

/* ---- the supervisor's side ---------------------------------------------------- */

/* The free function of a handed-out component: the last one frees the slot
 * for the stage to fill again (it looks when it next wakes). */
static void s_release(void *data, void *hint) {
    (void)data;
    s_slot_t *slot = hint;
    if (atomic_fetch_sub(&slot->refs, 1) != 1)
        return;
    atomic_store_explicit(&slot->busy, 0, memory_order_release);
}

static void s_wake(s_stage_t *st) {
    zmq_send(zsock_resolve(st->actor), "WAKE", 4, ZMQ_DONTWAIT);
}

static void st_stop(void *impl);

static tp_status_t st_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    s_staging_t *s = impl;
    if (towers < 1 || towers > MAX_TOWERS)
        return tp_error(TP_ERR_INVALID, "StagingInput: %d towers (1..%d)", towers,
                        MAX_TOWERS);
    st_stop(s);
    TP_TRY(tp_input_start(s->inner, towers, seed, skip));
    static atomic_int s_counter;
    int id = atomic_fetch_add(&s_counter, 1);
    s->towers = towers;
    s->t_start = tp_now_s();
    for (int i = 0; i < towers; i++) {
        s_stage_t *st = &s->stages[i];
        st->owner = s;
        st->tower = i;
        snprintf(st->out_ep, sizeof st->out_ep, "inproc://tp-staging-%d-%d-out-%d",
                 (int)getpid(), id, i);
        snprintf(st->tok_ep, sizeof st->tok_ep, "inproc://tp-staging-%d-%d-token-%d",
                 (int)getpid(), id, i);
        for (int k = 0; k < MAX_SLOTS; k++) {
            st->slots[k].stage = st;
            atomic_store(&st->slots[k].busy, 0);
        }
        atomic_store(&st->staged, 0);
        atomic_store(&st->busy_ns, 0);
        atomic_store(&st->starved_ns, 0);
        atomic_store(&st->blocked_ns, 0);
        atomic_store(&st->failed, 0);
        atomic_store(&st->taken, 0);
        atomic_store(&st->waited_ns, 0);
        st->err = TP_OK;
        st->errmsg[0] = '\0';
    }
    tp_actors_init();
    TP_HANDOFF_RELEASE(s->inner);  /* started here, taken in turns by the stages */
    for (int i = 0; i < towers; i++) {
        s_stage_t *st = &s->stages[i];
        atomic_store(&st->started, 0);
        st->actor = zactor_new(s_stage_actor, st);
        st->in = st->actor && atomic_load(&st->started) ? zsock_new(ZMQ_PAIR) : NULL;
        if (st->in)
            zsock_set_linger(st->in, 0);
        if (!st->in || zsock_connect(st->in, "%s", st->out_ep) != 0) {
            s->towers = i + 1;  /* st_stop ends the ones started */
            st_stop(s);
            return tp_error(TP_ERR_NOMEM, "StagingInput: starting the stage of "
                            "tower%d", i);
        }
    }
    return TP_OK;
}

/* Wrap a staged slot as the tower's datapoint (its free function gives the
 * slot back). */
static tp_status_t s_lend(s_slot_t *slot, tp_datapoint_t **out) {
    tp_datapoint_t *dp = tp_datapoint_new(slot->ncomp);
    if (!dp) {
        atomic_store(&slot->refs, 1);
        s_release(NULL, slot);
        return tp_error(TP_ERR_NOMEM, "StagingInput");
    }
    atomic_store(&slot->refs, slot->ncomp > 0 ? slot->ncomp : 1);
    for (int i = 0; i < slot->ncomp; i++) {
        const tp_tensor_t *m = &slot->meta[i];
        TP_ASSERT(tp_tensor_init_wrap(tp_datapoint_get(dp, i), m->dtype, m->ndim,
                                      m->shape, slot->buf[i], s_release, slot) == TP_OK);
    }
    if (slot->ncomp == 0)
        s_release(NULL, slot);
    *out = dp;
    return TP_OK;
}

static tp_status_t st_next(void *impl, int tower, tp_datapoint_t **out) {
    s_staging_t *s = impl;
    *out = NULL;
    if (tower < 0 || tower >= s->towers)
        return tp_error(TP_ERR_STATE, "StagingInput: tower%d has no stage (started "
                        "for %d towers)", tower, s->towers);
    s_stage_t *st = &s->stages[tower];
    if (st->err < 0)  /* it ended: say why again */
        return tp_error(st->err, "%s", st->errmsg);
    void *in = zsock_resolve(st->in);
    uint64_t w0 = tp_now_ns();
    double warned = 0;
    s_staged_t f;
    int got;
    while ((got = zmq_recv(in, &f, sizeof f, ZMQ_DONTWAIT)) < 0) {
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
            return tp_error(TP_ERR_PEER, "StagingInput tower%d: %s", tower,
                            zmq_strerror(zmq_errno()));
        s_wake(st);  /* a slot may have come back without a word */
        zmq_pollitem_t it = {in, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) > 0)
            continue;
        if (tp_signal_pending())
            return tp_error(TP_ERR_INTERRUPTED, "StagingInput: interrupted while "
                            "tower%d waited for its batch", tower);
        if (tp_actor_wait_tick())  /* the wait's phase says stop */
            return tp_error(TP_ERR_INTERRUPTED, "StagingInput: tower%d's wait for "
                            "its batch was ended: the training tree stopped", tower);
        double waited = (double)(tp_now_ns() - w0) * 1e-9;
        if (s->watchdog_s > 0 && waited - warned >= s->watchdog_s) {
            warned = waited;
            TP_WARN("step watchdog: tower%d has waited %.1f s for a batch: its "
                    "StagingInput stage is starved by the input %s", tower,
                    waited, tp_input_name(s->inner));
        }
    }
    atomic_fetch_add_explicit(&st->waited_ns, tp_now_ns() - w0, memory_order_relaxed);
    if (got < (int)offsetof(s_staged_t, msg))
        return tp_error(TP_ERR_PEER, "StagingInput tower%d: a frame of %d bytes", tower, got);
    if (f.rc < 0 || !f.slot) {
        f.msg[sizeof f.msg - 1] = '\0';
        st->err = f.rc < 0 ? (tp_status_t)f.rc : TP_ERR_STATE;
        snprintf(st->errmsg, sizeof st->errmsg, "%s",
                 got > (int)offsetof(s_staged_t, msg) ? f.msg : "StagingInput: ended");
        return tp_error(st->err, "%s", st->errmsg);
    }
    TP_HANDOFF_ACQUIRE(f.slot);
    /* One more may be staged now: the stage looks (off this thread's path). */
    atomic_store_explicit(&st->taken, atomic_load_explicit(&st->taken, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    s_wake(st);
    return s_lend(f.slot, out);
}

static int64_t st_size(void *impl) {
    return tp_input_size(((s_staging_t *)impl)->inner);
}

/* Stop the stages (a stage inside the inner input's next returns when that
 * does), then drop what they staged and nobody took. Slots still lent keep
 * their memory until the input is destroyed. */
static void st_stop(void *impl) {
    s_staging_t *s = impl;
    for (int i = 0; i < s->towers; i++)
        zactor_destroy(&s->stages[i].actor);
    for (int i = 0; i < s->towers; i++)
        zsock_destroy(&s->stages[i].in);
    s->towers = 0;
}

static void st_destroy(void *impl) {
    s_staging_t *s = impl;
    st_stop(s);
    tp_input_destroy(&s->inner);
    for (int i = 0; i < MAX_TOWERS; i++)
        for (int k = 0; k < MAX_SLOTS; k++) {
            s_slot_t *slot = &s->stages[i].slots[k];
            /* a batch still lent out would read freed memory: a caller bug */
            if (atomic_load(&slot->refs) > 0)
                TP_WARN("StagingInput: tower%d's batch is still in use at destroy", i);
            for (int c = 0; c < MAX_COMP; c++)
                s_free_comp(s, i, slot, c);
        }
    free(s);
}

static void st_set_watchdog(void *impl, double seconds) {
    s_staging_t *s = impl;
    s->watchdog_s = seconds;
    tp_input_set_watchdog(s->inner, seconds);
}

/* A stage's row: batches staged, time copying (busy), time waiting for
 * the inner input or its turn at it (starved), time waiting for the tower
 * to take a batch or free a slot (blocked), staged slots over nr_stage.
 * The stage's own counters: nothing waits. */
static void st_row(s_staging_t *s, int tower, tp_stats_row_t *row) {
    s_stage_t *st = &s->stages[tower];
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "StagingInput/tower%d", tower);
    uint64_t staged = atomic_load_explicit(&st->staged, memory_order_relaxed);
    uint64_t taken = atomic_load_explicit(&st->taken, memory_order_relaxed);
    row->state = atomic_load(&st->failed) ? TP_ACTOR_FAILED : TP_ACTOR_RUNNING;
    row->msgs_in = taken;
    row->msgs_out = staged;
    row->busy_s = (double)atomic_load_explicit(&st->busy_ns, memory_order_relaxed) * 1e-9;
    row->starved_s = (double)atomic_load_explicit(&st->starved_ns, memory_order_relaxed) * 1e-9;
    row->blocked_s = (double)atomic_load_explicit(&st->blocked_ns, memory_order_relaxed) * 1e-9;
    row->alive_s = tp_now_s() - s->t_start;
    double ahead = staged > taken ? (double)(staged - taken) : 0;
    row->queue_fill = ahead / (double)s->nr_stage;
}

/* The inner input's rows first (upstream), then one per stage. */
static int st_stats(void *impl, tp_stats_row_t *rows, int max) {
    s_staging_t *s = impl;
    int n = tp_input_stats(s->inner, rows, max);
    for (int i = 0; i < s->towers && n < max; i++)
        st_row(s, i, &rows[n++]);
    return n;
}

static int st_scalars(void *impl, tp_input_scalar_t *out, int max) {
    s_staging_t *s = impl;
    int n = tp_input_scalars(s->inner, out, max);
    if (n >= max || s->towers < 1)
        return n;
    double waited = 0;
    for (int i = 0; i < s->towers; i++)
        waited += (double)atomic_load(&s->stages[i].waited_ns) * 1e-9;
    out[n++] = (tp_input_scalar_t){"StagingInput/towers_wait_s", waited};
    return n;
}

/* The towers' backend: a device's stages from now on (unless the user
 * gave ops of their own); the inner input is told too. */
static tp_status_t st_bind(void *impl, tp_backend_t *const *backends, int n) {
    s_staging_t *s = impl;
    TP_TRY(tp_input_bind_towers(s->inner, backends, n));
    for (int i = 0; i < MAX_TOWERS && !s->has_ops; i++) {
        tp_backend_t *b = backends[i % n];
        if (b && tp_backend_device(b) >= 0)
            atomic_store_explicit(&s->device[i], b, memory_order_release);
    }
    return TP_OK;
}

static const tp_input_ops_t s_staging_ops = {
    .name = "StagingInput", .start = st_start, .next = st_next, .size = st_size,
    .stop = st_stop, .destroy = st_destroy, .set_watchdog = st_set_watchdog,
    .stats = st_stats, .scalars = st_scalars, .bind = st_bind,
};

tp_input_t *tp_input_staging(tp_input_t *inner, int nr_stage,
                             const tp_stage_ops_t *ops) {
    if (!inner) {
        tp_error(TP_ERR_INVALID, "StagingInput: no inner input");
        return NULL;
    }
    if (nr_stage < 0 || nr_stage > TP_STAGE_MAX) {
        tp_input_destroy(&inner);
        tp_error(TP_ERR_INVALID, "StagingInput: nr_stage %d (1..%d)", nr_stage,
                 TP_STAGE_MAX);
        return NULL;
    }
    if (tp_input_ops(inner)->bind) {
        /* ResidentInput, or a StagingInput: batches in the towers' memory */
        tp_error(TP_ERR_INVALID, "StagingInput over %s: its batches are made in "
                 "the towers' memory already; use it without staging",
                 tp_input_name(inner));
        tp_input_destroy(&inner);
        return NULL;
    }
    s_staging_t *s = calloc(1, sizeof *s);
    if (!s) {
        tp_input_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "StagingInput");
        return NULL;
    }
    s->inner = inner;
    s->nr_stage = nr_stage ? nr_stage : 1;
    if (ops) {
        s->ops = *ops;
        s->has_ops = 1;
    }
    s->watchdog_s = 10;
    return tp_input_new(&s_staging_ops, s);
}

/* A StagingInput is recognised by its ops table, never by its name. */
static s_staging_t *s_staging(tp_input_t *input) {
    return input && tp_input_ops(input) == &s_staging_ops ? tp_input_impl(input)
                                                           : NULL;
}

tp_input_t *tp_input_staging_inner(tp_input_t *input) {
    s_staging_t *s = s_staging(input);
    return s ? s->inner : NULL;
}

tp_status_t tp_input_staging_stats(tp_input_t *input, int tower,
                                   tp_stats_row_t *row) {
    s_staging_t *s = s_staging(input);
    if (!s)
        return tp_error(TP_ERR_INVALID, "not a StagingInput");
    if (tower < 0 || tower >= s->towers)
        return tp_error(TP_ERR_STATE, "StagingInput: no stage for tower%d", tower);
    st_row(s, tower, row);
    return TP_OK;
}

double tp_input_staging_waited_s(tp_input_t *input, int tower) {
    s_staging_t *s = s_staging(input);
    if (!s || tower < 0 || tower >= s->towers)
        return 0;
    return (double)atomic_load(&s->stages[tower].waited_ns) * 1e-9;
}
