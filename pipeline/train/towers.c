/* towerpack pipeline: tower executors, one actor per tower (device).
 *
 * The supervisor's thread (the one that runs the epoch schedule) drives
 * them over their pipes: a STEP frame with the batch's pointer (ownership
 * moves to the tower), answered by a status frame (with the message when
 * the step failed). Each tower counts its own work (tp_tower_meter_t); the
 * supervisor publishes those counters as the tower's row. A tower runs
 * forward and backward on its own batch and, in replicated mode, joins the
 * all-reduce of the gradients with the other towers (a collective: it
 * returns when all have contributed) and then applies the update to its
 * slice of the variables (stages TP_RUN_TRAIN; otherwise the supervisor
 * applies it once, after every tower is done). All of it is one
 * tp_model_run, which also releases the others' collective when the tower
 * fails, so that they do not wait for it. The batch goes back to the
 * input from the tower's thread once the tower is done with it. (One tower
 * alone runs on the supervisor's thread: docs/training.md says why.)
 *
 * Pinning (TP_PIN_TOWERS=1 in the environment; off by default): CPU
 * towers of one thread each, as many as the cores the process may run on
 * (2 towers x 1 thread on 2 cores, the GPT's best), each pin their thread
 * to a core of their own (s_pin_plan), so that the scheduler does not
 * move a tower off the core whose caches hold its half of the step. Off
 * by default: on a host loaded by other processes a pinned tower waits
 * for its one core while another falls idle (2x slower steps measured at
 * load 7-11, docs/performance.md). Never when more threads than cores
 * would run, nor with a team of more than one thread per tower (its
 * OpenMP threads are libgomp's, not pinned here). */
#define _GNU_SOURCE  /* pthread_setaffinity_np, sched_getaffinity, CPU_SET */
#include <czmq.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/actor.h>  /* tp_actor_wait_tick; TP_HANDOFF_*: ThreadSanitizer hints */
#include "pipeline/train/towers.h"

#define MAX_INPUTS 64

typedef struct {
    tp_model_t *model;
    int index;
    unsigned stages;
    tp_tower_meter_t *meter;
    tp_input_t *input;    /* where its batches go back */
    int cpu;              /* the core its thread pins itself to; -1: none */
} s_tower_args_t;

struct tp_towers {
    tp_model_t *model;
    int n;
    s_tower_args_t args[TP_TOWERS_MAX];
    zactor_t *actors[TP_TOWERS_MAX];
    tp_tower_meter_t meters[TP_TOWERS_MAX];  /* each written by its tower */
};

/* ---- a tower's counters ---------------------------------------------------- */

void tp_tower_meter_init(tp_tower_meter_t *m) {
    atomic_init(&m->steps, 0);
    atomic_init(&m->busy_ns, 0);
    atomic_init(&m->starved_ns, 0);
    atomic_init(&m->blocked_ns, 0);
    m->start_ns = tp_now_ns();
    m->idle_since = m->start_ns;
}

/* Only the runner's thread adds, so a relaxed load and store is enough (no
 * read-modify-write: a locked instruction would cost more than the clock). */
static void s_add(atomic_uint_fast64_t *c, uint64_t v) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
                          memory_order_relaxed);
}

/* A step that started at t0, ended its own compute at t1 and everything at
 * t2 (t1 == t2 without a collective). */
static void s_meter_step(tp_tower_meter_t *m, uint64_t t0, uint64_t t1, uint64_t t2) {
    s_add(&m->starved_ns, t0 - m->idle_since);
    s_add(&m->busy_ns, t1 - t0);
    s_add(&m->blocked_ns, t2 - t1);
    s_add(&m->steps, 1);
    m->idle_since = t2;
}

void tp_tower_meter_row(const tp_tower_meter_t *m, int index, tp_stats_row_t *row) {
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "tower%d", index);
    row->state = TP_ACTOR_RUNNING;
    uint64_t steps = atomic_load_explicit(&m->steps, memory_order_relaxed);
    row->msgs_in = row->msgs_out = steps;  /* a batch in, a step done */
    row->busy_s = (double)atomic_load_explicit(&m->busy_ns, memory_order_relaxed) * 1e-9;
    row->starved_s = (double)atomic_load_explicit(&m->starved_ns, memory_order_relaxed) * 1e-9;
    row->blocked_s = (double)atomic_load_explicit(&m->blocked_ns, memory_order_relaxed) * 1e-9;
    row->alive_s = (double)(tp_now_ns() - m->start_ns) * 1e-9;
    row->queue_fill = -1;
}

tp_status_t tp_tower_compute(tp_model_t *m, int index, unsigned stages,
                             tp_datapoint_t *dp, tp_tower_meter_t *meter) {
    tp_tensor_t views[MAX_INPUTS];
    int n = tp_datapoint_size(dp);
    tp_datapoint_views(dp, views, MAX_INPUTS);
    /* The model checks the count against its inputs and names the tower;
     * more components than views: no feeds, which it refuses too. The run
     * times its stages, which splits the step into busy and blocked. */
    uint64_t stage_ns[2] = {0, 0};
    tp_run_opts_t o = {.stages = stages, .stage_ns = meter ? stage_ns : NULL};
    uint64_t t0 = meter ? tp_now_ns() : 0;
    tp_status_t rc = tp_model_run(m, index, n <= MAX_INPUTS ? views : NULL, n, NULL, 0, &o);
    if (meter) {
        uint64_t t2 = tp_now_ns();
        uint64_t blocked = stage_ns[1] < t2 - t0 ? stage_ns[1] : t2 - t0;
        s_meter_step(meter, t0, t2 - blocked, t2);
    }
    return rc;
}

/* The pipe's frames. A command is one frame of s_cmd_t (czmq's "$TERM",
 * a short string, ends the actor); the answer is one frame of s_answer_t,
 * cut after the message's NUL. Fixed frames, no picture: nothing is
 * allocated on either side of a step. */
#define S_STEP 0x53544550u  /* "STEP" */

typedef struct {
    uint32_t what;        /* S_STEP */
    tp_datapoint_t *batch;
} s_cmd_t;

typedef struct {
    int32_t rc;
    char msg[1020];       /* tp_last_error() when rc < 0 */
} s_answer_t;

/* Where n towers pin their threads: cpu[i] for tower i, the process's
 * allowed cores in order, when TP_PIN_TOWERS is "1", every tower is a CPU
 * tower of one thread and there are exactly n allowed cores; returns 0
 * (no pinning) else. */
static int s_pin_plan(tp_model_t *m, int n, int *cpu) {
    const char *env = getenv("TP_PIN_TOWERS");
    if (!env || strcmp(env, "1") || n < 2 || tp_backend_cpu_threads() != 1)
        return 0;
    for (int i = 0; i < n; i++) {
        const tp_backend_t *b = tp_model_tower_backend(m, i);
        if (!b || tp_backend_device(b) >= 0)
            return 0;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != n)
        return 0;
    int k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < n; c++)
        if (CPU_ISSET(c, &set))
            cpu[k++] = c;
    return k == n;
}

static void s_tower_actor(zsock_t *pipe, void *arg) {
    s_tower_args_t *a = arg;
    void *sock = zsock_resolve(pipe);
    char name[16];
    snprintf(name, sizeof name, "tower%d", a->index);
    tp_actor_name_thread(name);
    if (a->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(a->cpu, &set);
        int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
        if (err) /* unpinned is only slower */
            TP_WARN("tower%d: pinning its thread to cpu %d: %s", a->index, a->cpu,
                    strerror(err));
    }
    zsock_signal(pipe, 0);
    for (;;) {
        s_cmd_t cmd;
        int n = zmq_recv(sock, &cmd, sizeof cmd, 0);
        if (n < 0 && zmq_errno() == EINTR)
            continue;  /* a signal is the supervisor's business, not ours */
        if (n != (int)sizeof cmd || cmd.what != S_STEP)
            break;     /* $TERM, or the pipe closed */
        tp_datapoint_t *dp = cmd.batch;
        /* The batch and the model's memory come over the pipe from the
         * supervisor's thread: tell TSan what libzmq's handoff orders. */
        TP_HANDOFF_ACQUIRE(dp);
        TP_HANDOFF_ACQUIRE(a->model);
        tp_status_t rc = tp_tower_compute(a->model, a->index, a->stages, dp, a->meter);
        /* back to the input (QueueInput frees it on its own thread) */
        tp_input_release(a->input, a->index, &dp);
        TP_HANDOFF_RELEASE(a->model);
        s_answer_t ans = {.rc = (int32_t)rc};
        size_t len = sizeof ans.rc;
        if (rc < 0) {
            snprintf(ans.msg, sizeof ans.msg, "%s", tp_last_error());
            len += strlen(ans.msg) + 1;
        }
        while (zmq_send(sock, &ans, len, 0) < 0 && zmq_errno() == EINTR)
            ;
    }
}

tp_towers_t *tp_towers_new(tp_model_t *m, int n, unsigned stages, tp_input_t *input) {
    if (n < 1 || n > TP_TOWERS_MAX) {
        tp_error(TP_ERR_INVALID, "%d towers (1..%d)", n, TP_TOWERS_MAX);
        return NULL;
    }
    tp_towers_t *self = calloc(1, sizeof *self);
    if (!self) {
        tp_error(TP_ERR_NOMEM, "towers");
        return NULL;
    }
    self->model = m;
    self->n = n;
    int cpu[TP_TOWERS_MAX];
    const int pin = s_pin_plan(m, n, cpu);
    if (pin)
        TP_INFO("%d towers of one thread on %d cores: each pinned to its own "
                "(TP_PIN_TOWERS=1)", n, n);
    for (int i = 0; i < n; i++) {
        tp_tower_meter_init(&self->meters[i]);  /* before its thread starts */
        self->args[i] =
            (s_tower_args_t){m, i, stages, &self->meters[i], input, pin ? cpu[i] : -1};
        self->actors[i] = zactor_new(s_tower_actor, &self->args[i]);
        if (!self->actors[i]) {
            tp_towers_destroy(&self);
            tp_error(TP_ERR_NOMEM, "starting tower%d", i);
            return NULL;
        }
    }
    return self;
}

void tp_towers_destroy(tp_towers_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_towers_t *self = *self_p;
    for (int i = 0; i < self->n; i++)
        zactor_destroy(&self->actors[i]);
    free(self);
    *self_p = NULL;
}

/* Take tower i's answer (it is there). A tower that fails aborts the
 * others' collective, and they answer "aborted" too: the cause is kept,
 * the first failure that is not such an abort, whatever the order the
 * answers are read in. */
static tp_status_t s_answer(tp_towers_t *self, int i, tp_status_t *first,
                            char *msg, size_t size) {
    s_answer_t ans;
    int n;
    while ((n = zmq_recv(zsock_resolve(zactor_sock(self->actors[i])), &ans,
                         sizeof ans, 0)) < 0 && zmq_errno() == EINTR)
        ;
    if (n < (int)sizeof ans.rc)
        return tp_error(TP_ERR_PEER, "tower%d: no answer", i);
    TP_HANDOFF_ACQUIRE(self->model);
    tp_status_t rc = (tp_status_t)ans.rc;
    if (rc < 0 && (*first >= 0 || (*first == TP_ERR_INTERRUPTED &&
                                   rc != TP_ERR_INTERRUPTED))) {
        *first = rc;
        ans.msg[sizeof ans.msg - 1] = '\0';
        snprintf(msg, size, "%s", n > (int)sizeof ans.rc ? ans.msg : "");
    }
    return TP_OK;
}

tp_status_t tp_towers_step(tp_towers_t *self, tp_datapoint_t **batches,
                           double watchdog_s) {
    TP_HANDOFF_RELEASE(self->model);  /* the update the supervisor applied */
    for (int i = 0; i < self->n; i++) {
        s_cmd_t cmd = {S_STEP, batches[i]};
        batches[i] = NULL;
        TP_HANDOFF_RELEASE(cmd.batch);
        int rc;
        while ((rc = zmq_send(zsock_resolve(zactor_sock(self->actors[i])), &cmd,
                              sizeof cmd, 0)) < 0 && zmq_errno() == EINTR)
            ;
        if (rc < 0) {
            tp_datapoint_destroy(&cmd.batch);
            for (int j = i + 1; j < self->n; j++)
                tp_datapoint_destroy(&batches[j]);
            return tp_error(TP_ERR_PEER, "tower%d does not take commands", i);
        }
    }
    /* Every answer, in whatever order they come. While the towers compute,
     * the wait ticks every 100 ms (the caller's wait phase: statistics for
     * tp-top during a long step), and a tower still busy after watchdog_s
     * seconds is named. */
    tp_status_t first = TP_OK;
    char msg[1024] = "";
    uint8_t answered[TP_TOWERS_MAX] = {0};
    int left = self->n;
    uint64_t t0 = tp_now_ns();
    double warned_at = 0;
    while (left > 0) {
        zmq_pollitem_t items[TP_TOWERS_MAX];
        int map[TP_TOWERS_MAX], k = 0;
        for (int i = 0; i < self->n; i++)
            if (!answered[i]) {
                items[k] = (zmq_pollitem_t){zsock_resolve(zactor_sock(self->actors[i])),
                                            0, ZMQ_POLLIN, 0};
                map[k++] = i;
            }
        int r = zmq_poll(items, k, 100);
        if (r < 0 && zmq_errno() != EINTR)
            return tp_error(TP_ERR_PEER, "waiting for the towers: %s",
                            zmq_strerror(zmq_errno()));
        for (int j = 0; r > 0 && j < k; j++)
            if (items[j].revents & ZMQ_POLLIN) {
                TP_TRY(s_answer(self, map[j], &first, msg, sizeof msg));
                answered[map[j]] = 1;
                left--;
            }
        if (r > 0 || left == 0)
            continue;
        (void)tp_actor_wait_tick();  /* the towers finish the step all the same */
        double waited = (double)(tp_now_ns() - t0) * 1e-9;
        if (watchdog_s > 0 && waited >= watchdog_s && waited - warned_at >= watchdog_s) {
            warned_at = waited;
            for (int j = 0; j < k; j++)
                TP_WARN("step watchdog: the step has run %.0f s; tower%d has not "
                        "finished (busy computing, or waiting in the all-reduce "
                        "for another tower)", waited, map[j]);
        }
    }
    if (first < 0)
        return tp_error(first, "%s", msg);
    return TP_OK;
}

int tp_towers_stats(const tp_towers_t *self, tp_stats_row_t *rows, int max) {
    int n = 0;
    for (int i = 0; i < self->n && n < max; i++)
        tp_tower_meter_row(&self->meters[i], i, &rows[n++]);
    return n;
}
