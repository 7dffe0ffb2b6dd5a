/* towerpack actors: the supervisor (start a tree of actors, watch exits,
 * errors and heartbeats, restart by policy, turn signals into an orderly
 * stop, publish statistics) and the process-wide signal record. */
#include <czmq.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/supervisor.h>
#include <towerpack/fileio.h>
#include "actors/actor_internal.h"

/* ---- signals ------------------------------------------------------------------- */

static volatile sig_atomic_t s_sig_last;
static volatile sig_atomic_t s_sig_count;
static pthread_mutex_t s_sig_lock = PTHREAD_MUTEX_INITIALIZER;
static int s_sig_users;
static struct sigaction s_old_int, s_old_term;

/* The deadline (tp_signals_set_deadline): a timer armed by the first
 * signal, whose SIGALRM ends the process; the last words are made when it
 * is set, since a handler may not format. */
static timer_t s_deadline_timer;
static volatile sig_atomic_t s_deadline_on;
static struct itimerspec s_deadline_its;
static char s_words[2][400];  /* [0] SIGINT, [1] SIGTERM */
static size_t s_words_len[2];

static void s_end_now(int sig) {
    int k = sig == SIGTERM;
    tp_atomic_file_unlink_pending();  /* a write cut short leaves no temporary */
    tp_run_dirs_remove_now();         /* nor the sockets of a run */
    tp_log_last_words(s_words[k], s_words_len[k]);
    _exit(128 + sig);
}

static void s_on_deadline(int alarm_sig) {
    (void)alarm_sig;
    if (s_deadline_on)
        s_end_now(s_sig_last ? s_sig_last : SIGTERM);
}

static void s_on_signal(int sig) {
    s_sig_last = sig;
    s_sig_count = s_sig_count + 1;
    if (s_deadline_on) {
        if (s_sig_count > 1)
            s_end_now(sig);
        timer_settime(s_deadline_timer, 0, &s_deadline_its, NULL);
    }
}

/* A forked child (a dataflow worker) has no timer: its stop is its own. */
static void s_deadline_off(void) { s_deadline_on = 0; }

tp_status_t tp_signals_set_deadline(double seconds) {
    static int made;
    s_deadline_on = 0;
    if (!(seconds > 0))
        return TP_OK;
    if (!made) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = s_on_deadline;
        sigemptyset(&sa.sa_mask);
        struct sigevent ev;
        memset(&ev, 0, sizeof ev);
        ev.sigev_notify = SIGEV_SIGNAL;
        ev.sigev_signo = SIGALRM;
        if (sigaction(SIGALRM, &sa, NULL) < 0 ||
            timer_create(CLOCK_MONOTONIC, &ev, &s_deadline_timer) < 0)
            return tp_error(TP_ERR_IO, "the stop deadline's timer: %s", strerror(errno));
        pthread_atfork(NULL, NULL, s_deadline_off);
        made = 1;
    }
    for (int k = 0; k < 2; k++) {
        int n = snprintf(s_words[k], sizeof s_words[k],
                         "error tp: %s: the orderly stop did not end within %.1f s "
                         "(a thread inside a compute library does not return to it): "
                         "ending now; checkpoints written before stay\n",
                         k ? "SIGTERM" : "SIGINT", seconds);
        s_words_len[k] = n < 0 ? 0 : (size_t)n < sizeof s_words[k] ? (size_t)n
                                                                    : sizeof s_words[k] - 1;
    }
    memset(&s_deadline_its, 0, sizeof s_deadline_its);
    s_deadline_its.it_value.tv_sec = (time_t)seconds;
    s_deadline_its.it_value.tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (!s_deadline_its.it_value.tv_sec && !s_deadline_its.it_value.tv_nsec)
        s_deadline_its.it_value.tv_nsec = 1;
    s_deadline_on = 1;
    return TP_OK;
}

tp_status_t tp_signals_install(void) {
    tp_actors_init();
    pthread_mutex_lock(&s_sig_lock);
    if (s_sig_users++ == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = s_on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;  /* no SA_RESTART: blocking calls wake with EINTR */
        if (sigaction(SIGINT, &sa, &s_old_int) < 0 ||
            sigaction(SIGTERM, &sa, &s_old_term) < 0) {
            s_sig_users--;
            pthread_mutex_unlock(&s_sig_lock);
            return tp_error(TP_ERR_IO, "sigaction: %s", strerror(errno));
        }
    }
    pthread_mutex_unlock(&s_sig_lock);
    return TP_OK;
}

void tp_signals_restore(void) {
    pthread_mutex_lock(&s_sig_lock);
    if (s_sig_users > 0 && --s_sig_users == 0) {
        sigaction(SIGINT, &s_old_int, NULL);
        sigaction(SIGTERM, &s_old_term, NULL);
    }
    pthread_mutex_unlock(&s_sig_lock);
}

int tp_signal_pending(void) { return s_sig_last; }
int tp_signal_count(void) { return s_sig_count; }
void tp_signal_clear(void) {
    s_sig_last = 0;
    s_sig_count = 0;
}

/* ---- the supervisor ---------------------------------------------------------------- */

typedef struct {
    const tp_actor_def_t *def;
    void *arg;
    tp_restart_policy_t policy;
    tp_actor_t *actor;       /* NULL when done or failed */
    int done;                /* ended cleanly (or dropped at a stop) */
    int restarts;
    double *restart_times;   /* ring of the last max_restarts restart times */
    tp_stats_row_t row;      /* last known counters, kept after the end */
} s_child_t;

/* A member: watched and published, run by its owner. */
typedef struct {
    const tp_supervised_ops_t *ops;
    void *impl;
} s_member_t;

/* Rows a member may publish (an input with 64 forked workers has ~70). */
#define S_MEMBER_ROWS 192

struct tp_supervisor {
    tp_supervisor_opts_t opts;
    char name[TP_STATS_SOURCE_MAX];
    char run_dir[256];
    int own_run_dir;
    char stats_ep[300];
    tp_stats_pub_t *pub;
    s_child_t *children;
    int nchildren, cap;
    s_member_t *members;
    int nmembers, capmembers;
    tp_stats_row_t *rows;    /* the snapshot being built */
    int caprows;
    int started, finished;
    int signals;
    atomic_int stop_requested;
    int stopping;
    double drain_deadline;
    int stop_sig;
    int sig_seen;   /* tp_signal_count() already acted on */
    tp_status_t result;
    char reason[1200];
    uint64_t last_pub_ns;
};

void tp_supervisor_opts_init(tp_supervisor_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    opts->name = "supervisor";
    opts->stats_interval_s = 1.0;
    opts->heartbeat_ms = 250;
    opts->heartbeat_timeout_s = 5.0;
    opts->drain_timeout_s = 1.0;
    opts->handle_signals = 1;
}

tp_supervisor_t *tp_supervisor_new(const tp_supervisor_opts_t *opts) {
    tp_actors_init();
    tp_supervisor_t *self = calloc(1, sizeof *self);
    if (!self) {
        tp_error(TP_ERR_NOMEM, "supervisor");
        return NULL;
    }
    if (opts)
        self->opts = *opts;
    else
        tp_supervisor_opts_init(&self->opts);
    tp_supervisor_opts_t *o = &self->opts;
    if (o->stats_interval_s <= 0)
        o->stats_interval_s = 1.0;
    if (o->heartbeat_ms <= 0)
        o->heartbeat_ms = 250;
    if (o->heartbeat_timeout_s <= 0)
        o->heartbeat_timeout_s = 5.0;
    if (o->drain_timeout_s < 0)
        o->drain_timeout_s = 0;
    snprintf(self->name, sizeof self->name, "%s", o->name ? o->name : "supervisor");
    o->name = NULL;
    if (o->run_dir) {
        snprintf(self->run_dir, sizeof self->run_dir, "%s", o->run_dir);
    } else {
        tp_status_t rc = tp_run_dir_make(self->run_dir, sizeof self->run_dir, "tp-run");
        if (rc < 0) {
            tp_error_wrap(rc, "supervisor '%s'", self->name);
            free(self);
            return NULL;
        }
        self->own_run_dir = 1;
    }
    o->run_dir = NULL;
    if (!o->stats || strcmp(o->stats, "off")) {
        tp_status_t rc = tp_stats_endpoint_resolve(o->stats, self->run_dir,
                                                   self->stats_ep,
                                                   sizeof self->stats_ep);
        if (rc == TP_OK && !(self->pub = tp_stats_pub_new(self->stats_ep,
                                                          self->name)))
            rc = TP_ERR_IO;
        if (rc < 0) {
            tp_error_wrap(rc, "supervisor '%s'", self->name);
            if (self->own_run_dir)
                tp_run_dir_remove(self->run_dir);
            free(self);
            return NULL;
        }
        snprintf(self->stats_ep, sizeof self->stats_ep, "%s",
                 tp_stats_pub_endpoint(self->pub));
    }
    o->stats = NULL;
    atomic_init(&self->stop_requested, 0);
    if (o->handle_signals) {
        if (tp_signals_install() == TP_OK)
            self->signals = 1;
        self->sig_seen = tp_signal_count();
    }
    self->last_pub_ns = tp_now_ns();
    return self;
}

static void s_stop_all(tp_supervisor_t *self);

static void s_child_stop_actor(s_child_t *c) {
    if (c->actor) {
        tp_actor_handle_pipe(c->actor);
        c->row = *tp_actor_last_row(c->actor);
        tp_actor_destroy(&c->actor);
    }
}

void tp_supervisor_destroy(tp_supervisor_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_supervisor_t *self = *self_p;
    s_stop_all(self);
    for (int i = 0; i < self->nchildren; i++)
        free(self->children[i].restart_times);
    free(self->children);
    free(self->members);
    free(self->rows);
    tp_stats_pub_destroy(&self->pub);
    if (self->own_run_dir)
        tp_run_dir_remove(self->run_dir);
    if (self->signals)
        tp_signals_restore();
    free(self);
    *self_p = NULL;
}

tp_status_t tp_supervisor_add(tp_supervisor_t *self, const tp_actor_def_t *def,
                              void *arg, const tp_restart_policy_t *policy) {
    if (self->started)
        return tp_error(TP_ERR_STATE, "supervisor '%s': add after start",
                        self->name);
    if (!def || !def->name || !*def->name)
        return tp_error(TP_ERR_INVALID, "supervisor '%s': a child needs a name",
                        self->name);
    for (int i = 0; i < self->nchildren; i++)
        if (!strcmp(self->children[i].def->name, def->name))
            return tp_error(TP_ERR_INVALID,
                            "supervisor '%s': two children named '%s'",
                            self->name, def->name);
    if (self->nchildren == self->cap) {
        int cap = self->cap ? 2 * self->cap : 8;
        s_child_t *c = realloc(self->children, (size_t)cap * sizeof *c);
        if (!c)
            return tp_error(TP_ERR_NOMEM, "supervisor");
        self->children = c;
        self->cap = cap;
    }
    s_child_t *c = &self->children[self->nchildren];
    memset(c, 0, sizeof *c);
    c->def = def;
    c->arg = arg;
    if (policy) {
        c->policy = *policy;
        if (c->policy.max_restarts < 0)
            c->policy.max_restarts = 0;
        if (c->policy.within_s <= 0)
            c->policy.within_s = 10.0;
    }
    if (c->policy.max_restarts > 0) {
        c->restart_times = calloc((size_t)c->policy.max_restarts, sizeof(double));
        if (!c->restart_times)
            return tp_error(TP_ERR_NOMEM, "supervisor");
    }
    snprintf(c->row.name, sizeof c->row.name, "%s", def->name);
    self->nchildren++;
    return TP_OK;
}

tp_status_t tp_supervisor_start(tp_supervisor_t *self) {
    if (self->started)
        return tp_error(TP_ERR_STATE, "supervisor '%s': started twice", self->name);
    self->started = 1;
    for (int i = 0; i < self->nchildren; i++) {
        s_child_t *c = &self->children[i];
        c->actor = tp_actor_new_ex(c->def, c->arg, self->opts.heartbeat_ms);
        if (!c->actor) {
            tp_status_t rc = tp_error_wrap(TP_ERR_PEER,
                                           "supervisor '%s': starting '%s'",
                                           self->name, c->def->name);
            char msg[1200];
            snprintf(msg, sizeof msg, "%s", tp_last_error());
            s_stop_all(self);
            self->finished = 1;
            self->result = rc;
            snprintf(self->reason, sizeof self->reason, "%s", msg);
            return tp_error(rc, "%s", msg);
        }
    }
    return TP_OK;
}

void tp_supervisor_stop(tp_supervisor_t *self) {
    atomic_store(&self->stop_requested, 1);
}

tp_status_t tp_supervisor_add_member(tp_supervisor_t *self,
                                     const tp_supervised_ops_t *ops, void *impl) {
    if (!ops || !ops->name || !*ops->name)
        return tp_error(TP_ERR_INVALID, "supervisor '%s': a member needs a name",
                        self->name);
    if (self->nmembers == self->capmembers) {
        int cap = self->capmembers ? 2 * self->capmembers : 8;
        s_member_t *m = realloc(self->members, (size_t)cap * sizeof *m);
        if (!m)
            return tp_error(TP_ERR_NOMEM, "supervisor");
        self->members = m;
        self->capmembers = cap;
    }
    self->members[self->nmembers++] = (s_member_t){ops, impl};
    return TP_OK;
}

/* Every child's row (upstream first, as added), then the members' rows. */
static void s_publish(tp_supervisor_t *self) {
    if (!self->pub || self->nchildren + self->nmembers == 0)
        return;
    int need = self->nchildren + S_MEMBER_ROWS * self->nmembers;
    if (need > self->caprows) {
        tp_stats_row_t *r = realloc(self->rows, (size_t)need * sizeof *r);
        if (!r) {
            TP_WARN("supervisor '%s': statistics not published: out of memory",
                    self->name);
            return;
        }
        self->rows = r;
        self->caprows = need;
    }
    tp_stats_row_t *rows = self->rows;
    for (int i = 0; i < self->nchildren; i++) {
        s_child_t *c = &self->children[i];
        if (c->actor)
            c->row = *tp_actor_last_row(c->actor);
        rows[i] = c->row;
        rows[i].restarts = (uint32_t)c->restarts;
        if (!c->actor && c->row.state != TP_ACTOR_FAILED)
            rows[i].state = TP_ACTOR_DONE;
    }
    int n = self->nchildren;
    for (int m = 0; m < self->nmembers; m++)
        if (self->members[m].ops->rows)
            n += self->members[m].ops->rows(self->members[m].impl, &rows[n],
                                            S_MEMBER_ROWS);
    if (tp_stats_pub_publish(self->pub, rows, n) < 0)
        TP_WARN("supervisor '%s': publishing statistics: %s", self->name,
                tp_last_error());
    self->last_pub_ns = tp_now_ns();
}

/* 1 when child j feeds child i (an output endpoint of j is an input of i). */
static int s_feeds(const s_child_t *j, const s_child_t *i) {
    for (int o = 0; o < j->def->noutputs; o++)
        for (int k = 0; k < i->def->ninputs; k++)
            if (j->def->outputs[o].endpoint && i->def->inputs[k].endpoint &&
                !strcmp(j->def->outputs[o].endpoint, i->def->inputs[k].endpoint))
                return 1;
    return 0;
}

/* Terminate every child still running, upstream first: a child goes once
 * nothing still running feeds it, so what is queued for it by pointer is
 * freed by its own drain and never stranded in a closed socket. */
static void s_stop_all(tp_supervisor_t *self) {
    int left = 1;
    while (left) {
        left = 0;
        int progressed = 0;
        for (int i = 0; i < self->nchildren; i++) {
            s_child_t *c = &self->children[i];
            if (!c->actor)
                continue;
            int fed = 0;
            for (int j = 0; j < self->nchildren && !fed; j++)
                fed = j != i && self->children[j].actor && s_feeds(&self->children[j], c);
            if (fed) {
                left = 1;
                continue;
            }
            s_child_stop_actor(c);
            progressed = 1;
        }
        if (left && !progressed) {  /* a cycle: add order decides */
            for (int i = 0; i < self->nchildren; i++)
                if (self->children[i].actor) {
                    s_child_stop_actor(&self->children[i]);
                    break;
                }
        }
    }
}

/* End the tree: every child still running is terminated, upstream first. */
static void s_finish(tp_supervisor_t *self, tp_status_t rc, const char *reason) {
    s_stop_all(self);
    self->finished = 1;
    self->result = rc;
    /* reason may be self->reason itself, or longer than it: copy bounded. */
    if (reason != self->reason) {
        size_t n = strlen(reason);
        if (n > sizeof self->reason - 1)
            n = sizeof self->reason - 1;
        memmove(self->reason, reason, n);
        self->reason[n] = '\0';
    }
    s_publish(self);
    if (rc < 0)
        TP_WARN("supervisor '%s' stopped: %s", self->name, reason);
    else
        TP_INFO("supervisor '%s' stopped: %s", self->name, reason);
}

/* A child failed: restart it under its policy, or fail the tree. */
static void s_child_failed(tp_supervisor_t *self, int i, const char *how) {
    s_child_t *c = &self->children[i];
    s_child_stop_actor(c);
    c->row.state = TP_ACTOR_FAILED;
    double now = tp_now_s();
    int n = c->policy.max_restarts;
    if (n > 0 && !self->stopping) {
        /* The ring holds the last n restart times: the oldest is n back. */
        int slot = c->restarts % n;
        int allowed = c->restarts < n || now - c->restart_times[slot] > c->policy.within_s;
        if (allowed) {
            c->restart_times[slot] = now;
            c->restarts++;
            TP_WARN("supervisor '%s': child '%s' %s; restart %d", self->name,
                    c->def->name, how, c->restarts);
            c->actor = tp_actor_new_ex(c->def, c->arg, self->opts.heartbeat_ms);
            if (c->actor)
                return;
            char msg[1200];
            snprintf(msg, sizeof msg,
                     "child '%s' %s, and its restart failed: %s", c->def->name,
                     how, tp_last_error());
            s_finish(self, TP_ERR_PEER, msg);
            return;
        }
    }
    char msg[1200];
    if (n > 0)
        snprintf(msg, sizeof msg,
                 "child '%s' %s (restarted %d times, at most %d within %.3g s)",
                 c->def->name, how, c->restarts, n, c->policy.within_s);
    else
        snprintf(msg, sizeof msg, "child '%s' %s (policy: fail at once)",
                 c->def->name, how);
    s_finish(self, TP_ERR_PEER, msg);
}

static void s_begin_stop(tp_supervisor_t *self, const char *why) {
    self->stopping = 1;
    self->drain_deadline = tp_now_s() + self->opts.drain_timeout_s;
    snprintf(self->reason, sizeof self->reason, "%s", why);
    TP_INFO("supervisor '%s': %s; draining (up to %.3g s)", self->name, why,
            self->opts.drain_timeout_s);
    for (int i = 0; i < self->nchildren; i++)
        if (self->children[i].actor)
            tp_actor_stop(self->children[i].actor);
}

/* One round of watching: stop requests; what the children sent (waiting
 * up to poll_ms for it); their ends, failures and heartbeats; the members'
 * checks; statistics when due. With owner_ends (a tick) children that end
 * cleanly do not end the tree. */
static void s_round(tp_supervisor_t *self, int poll_ms, int owner_ends) {
    /* Stop requests: a signal, or tp_supervisor_stop. */
    if (self->signals && tp_signal_count() != self->sig_seen) {
        int sig = tp_signal_pending();
        self->sig_seen = tp_signal_count();
        if (self->stopping) {
            char msg[1200];
            snprintf(msg, sizeof msg, "%.1000s; second %s: in-flight data dropped",
                     self->reason, sig == SIGTERM ? "SIGTERM" : "SIGINT");
            s_finish(self, TP_ERR_INTERRUPTED, msg);
            return;
        }
        self->stop_sig = sig;
        s_begin_stop(self, sig == SIGTERM ? "stopped by SIGTERM"
                                          : "stopped by SIGINT");
    }
    if (atomic_exchange(&self->stop_requested, 0) && !self->stopping)
        s_begin_stop(self, "stop requested");

    zmq_pollitem_t items[self->nchildren > 0 ? self->nchildren : 1];
    int map[self->nchildren > 0 ? self->nchildren : 1];
    int n = 0;
    for (int i = 0; i < self->nchildren; i++) {
        if (!self->children[i].actor)
            continue;
        items[n] = (zmq_pollitem_t){tp_actor_pipe_raw(self->children[i].actor),
                                    0, ZMQ_POLLIN, 0};
        map[n++] = i;
    }
    if (n > 0)
        zmq_poll(items, n, poll_ms);
    for (int k = 0; k < n; k++)
        if (items[k].revents & ZMQ_POLLIN)
            tp_actor_handle_pipe(self->children[map[k]].actor);

    uint64_t now = tp_now_ns();
    int running = 0;
    for (int i = 0; i < self->nchildren && !self->finished; i++) {
        s_child_t *c = &self->children[i];
        if (!c->actor)
            continue;
        if (tp_actor_exited(c->actor)) {
            tp_status_t rc = tp_actor_exit_status(c->actor);
            if (rc >= 0) {
                TP_DEBUG("supervisor '%s': child '%s' done: %s", self->name,
                         c->def->name, tp_actor_reason(c->actor));
                s_child_stop_actor(c);
                c->done = 1;
                c->row.state = TP_ACTOR_DONE;
            } else {
                char how[700];
                snprintf(how, sizeof how, "failed: %s",
                         tp_actor_reason(c->actor));
                s_child_failed(self, i, how);
            }
        } else if (!self->stopping &&
                   (double)(now - tp_actor_last_seen_ns(c->actor)) * 1e-9 >
                       self->opts.heartbeat_timeout_s) {
            char how[200];
            snprintf(how, sizeof how,
                     "missed its heartbeat (silent for more than %.3g s)",
                     self->opts.heartbeat_timeout_s);
            s_child_failed(self, i, how);
        }
        if (c->actor)
            running++;
    }
    if (self->finished)
        return;
    for (int m = 0; m < self->nmembers && !self->stopping; m++) {
        const s_member_t *mb = &self->members[m];
        if (mb->ops->check && mb->ops->check(mb->impl) < 0) {
            char msg[1200];
            snprintf(msg, sizeof msg, "%.60s: %.1100s", mb->ops->name,
                     tp_last_error());
            s_finish(self, TP_ERR_PEER, msg);
            return;
        }
    }
    if (running == 0 && (self->stopping || !owner_ends)) {
        if (self->stopping) {
            char msg[1200];
            snprintf(msg, sizeof msg, "%.1000s; in-flight data drained",
                     self->reason);
            s_finish(self, TP_ERR_INTERRUPTED, msg);
        } else {
            s_finish(self, TP_OK, "all actors finished");
        }
        return;
    }
    if (self->stopping && tp_now_s() > self->drain_deadline) {
        char msg[1200];
        snprintf(msg, sizeof msg,
                 "%.1000s; drain timed out after %.3g s: in-flight data dropped",
                 self->reason, self->opts.drain_timeout_s);
        s_finish(self, TP_ERR_INTERRUPTED, msg);
        return;
    }
    if ((double)(tp_now_ns() - self->last_pub_ns) * 1e-9 >=
        self->opts.stats_interval_s)
        s_publish(self);
}

tp_status_t tp_supervisor_run(tp_supervisor_t *self, double timeout_s) {
    if (!self->started)
        return tp_error(TP_ERR_STATE, "supervisor '%s': run before start",
                        self->name);
    double deadline = timeout_s > 0 ? tp_now_s() + timeout_s : 0;
    while (!self->finished) {
        s_round(self, 50, 0);
        if (!self->finished && deadline > 0 && tp_now_s() >= deadline)
            return tp_error(TP_ERR_TIMEOUT, "supervisor '%s': still running",
                            self->name);
    }
    if (self->result < 0)
        return tp_error(self->result, "supervisor '%s': %s", self->name,
                        self->reason);
    return TP_OK;
}

tp_status_t tp_supervisor_tick(tp_supervisor_t *self) {
    if (!self->started)
        return tp_error(TP_ERR_STATE, "supervisor '%s': tick before start",
                        self->name);
    if (!self->finished)
        s_round(self, 0, 1);
    if (self->finished && self->result < 0)
        return tp_error(self->result, "supervisor '%s': %s", self->name,
                        self->reason);
    if (self->stopping)
        return tp_error(TP_ERR_INTERRUPTED, "supervisor '%s': %s", self->name,
                        self->reason);
    return TP_OK;
}

int tp_supervisor_restarts_total(const tp_supervisor_t *self) {
    int n = 0;
    for (int i = 0; i < self->nchildren; i++)
        n += self->children[i].restarts;
    return n;
}

const char *tp_supervisor_reason(const tp_supervisor_t *self) {
    return self->reason;
}

const char *tp_supervisor_stats_endpoint(const tp_supervisor_t *self) {
    return self->stats_ep;
}

const char *tp_supervisor_run_dir(const tp_supervisor_t *self) {
    return self->run_dir;
}

int tp_supervisor_restarts(const tp_supervisor_t *self, const char *name) {
    for (int i = 0; i < self->nchildren; i++)
        if (!strcmp(self->children[i].def->name, name))
            return self->children[i].restarts;
    return -1;
}

tp_status_t tp_supervisor_child_stats(const tp_supervisor_t *self,
                                      const char *name, tp_stats_row_t *row) {
    for (int i = 0; i < self->nchildren; i++) {
        const s_child_t *c = &self->children[i];
        if (strcmp(c->def->name, name))
            continue;
        *row = c->actor ? *tp_actor_last_row(c->actor) : c->row;
        row->restarts = (uint32_t)c->restarts;
        return TP_OK;
    }
    return tp_error(TP_ERR_NOT_FOUND, "supervisor '%s': no child '%s'",
                    self->name, name);
}
