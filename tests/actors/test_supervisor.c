/* towerpack tests: the supervisor (clean end, fail-at-once, restart
 * policies, missed heartbeats, orderly stop by request and by SIGINT, stats
 * published on the PUB socket, no files left behind). */
#include <criterion/criterion.h>
#include <czmq.h>
#include <signal.h>
#include <unistd.h>
#include "actor_testutil.h"

typedef struct {
    int64_t n;        /* datapoints per life (-1: endless) */
    int fail_after;   /* fail after this many (-1: never) */
    atomic_int lives; /* how many times init ran */
    int fail_lives;   /* the first fail_lives lives fail */
    int sleep_ms;     /* per datapoint */
} spec_t;

typedef struct {
    spec_t *spec;
    int64_t made;
    int life;
} st_t;

static tp_status_t st_init(tp_actor_ctx_t *ctx, void *arg, void **state) {
    (void)ctx;
    st_t *s = calloc(1, sizeof *s);
    s->spec = arg;
    s->life = atomic_fetch_add(&s->spec->lives, 1);
    *state = s;
    return TP_OK;
}
static void st_fini(void *state) { free(state); }

static tp_status_t st_produce(tp_actor_ctx_t *ctx, void *state) {
    st_t *s = state;
    if (s->spec->n >= 0 && s->made >= s->spec->n)
        return TP_DONE;
    if (s->life < s->spec->fail_lives && s->made == s->spec->fail_after)
        return tp_error(TP_ERR_FORMAT, "planted failure in life %d", s->life);
    if (s->spec->sleep_ms)
        usleep((useconds_t)s->spec->sleep_ms * 1000);
    tp_datapoint_t *dp = tu_dp(s->made++, 0);
    return tp_actor_send(ctx, 0, &dp);
}

typedef struct {
    atomic_long count;
} sink_t;

static tp_status_t sink_on_data(tp_actor_ctx_t *ctx, void *state, int port,
                                tp_datapoint_t **dp) {
    (void)ctx; (void)port;
    if (*dp)
        atomic_fetch_add(&((sink_t *)state)->count, 1);
    return TP_OK;
}

/* The source connects, the sink binds: the source may be restarted. */
static const tp_actor_port_t src_out[] = {{"out", "inproc://sv-a", 0, 0, 0}};
static const tp_actor_port_t sink_in[] = {{"in", "inproc://sv-a", 1, 0, 0}};
static const tp_actor_def_t d_src = {"source", NULL, 0, src_out, 1, st_init,
                                     NULL, st_produce, st_fini};
static const tp_actor_def_t d_sink = {"sink", sink_in, 1, NULL, 0, NULL,
                                      sink_on_data, NULL, NULL};

static tp_supervisor_t *make_sup(double hb_timeout) {
    tp_supervisor_opts_t o;
    tp_supervisor_opts_init(&o);
    o.heartbeat_ms = 50;
    o.heartbeat_timeout_s = hb_timeout;
    o.stats_interval_s = 0.1;
    tp_supervisor_t *s = tp_supervisor_new(&o);
    cr_assert(s, "%s", tp_last_error());
    return s;
}

Test(supervisor, tree_finishes_cleanly) {
    spec_t spec = {.n = 1000, .fail_after = -1};
    sink_t sink = {0};
    tp_supervisor_t *s = make_sup(5);
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tp_supervisor_run_dir(s));
    cr_assert_eq(tp_supervisor_add(s, &d_sink, &sink, NULL), TP_OK);
    cr_assert_eq(tp_supervisor_add(s, &d_src, &spec, NULL), TP_OK);
    cr_assert_eq(tp_supervisor_add(s, &d_src, &spec, NULL), TP_ERR_INVALID,
                 "duplicate names refused");
    cr_assert_eq(tp_supervisor_start(s), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_supervisor_run(s, 10), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(tp_supervisor_reason(s), "all actors finished");
    cr_assert_eq(atomic_load(&sink.count), 1000);
    tp_stats_row_t row;
    cr_assert_eq(tp_supervisor_child_stats(s, "sink", &row), TP_OK);
    cr_assert_eq(row.msgs_in, 1000);
    tp_supervisor_destroy(&s);
    cr_assert_neq(access(dir, F_OK), 0, "private run dir removed");
    cr_assert_eq(atomic_load(&tu_live), 0);
}

Test(supervisor, fail_at_once_names_the_child) {
    spec_t spec = {.n = 1000, .fail_after = 10, .fail_lives = 100};
    sink_t sink = {0};
    tp_supervisor_t *s = make_sup(5);
    tp_supervisor_add(s, &d_sink, &sink, NULL);
    tp_supervisor_add(s, &d_src, &spec, NULL);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    cr_assert_eq(tp_supervisor_run(s, 10), TP_ERR_PEER);
    const char *why = tp_supervisor_reason(s);
    cr_assert(strstr(why, "'source'") && strstr(why, "planted failure in life 0") &&
              strstr(why, "fail at once"), "%s", why);
    cr_assert(strstr(tp_last_error(), "planted failure"), "%s", tp_last_error());
    cr_assert_eq(tp_supervisor_restarts(s, "source"), 0);
    tp_supervisor_destroy(&s);
    cr_assert_eq(atomic_load(&tu_live), 0);
}

Test(supervisor, restart_then_succeed) {
    spec_t spec = {.n = 100, .fail_after = 10, .fail_lives = 2};
    sink_t sink = {0};
    tp_restart_policy_t p = {3, 10};
    tp_supervisor_t *s = make_sup(5);
    tp_supervisor_add(s, &d_sink, &sink, NULL);
    tp_supervisor_add(s, &d_src, &spec, &p);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    cr_assert_eq(tp_supervisor_run(s, 10), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_supervisor_restarts(s, "source"), 2);
    cr_assert_eq(atomic_load(&spec.lives), 3);
    /* Two failed lives sent 10 each, the third all 100. */
    cr_assert_eq(atomic_load(&sink.count), 120);
    tp_supervisor_destroy(&s);
}

Test(supervisor, restart_limit_fails_the_tree) {
    spec_t spec = {.n = 100, .fail_after = 0, .fail_lives = 1000};
    sink_t sink = {0};
    tp_restart_policy_t p = {2, 10};
    tp_supervisor_t *s = make_sup(5);
    tp_supervisor_add(s, &d_sink, &sink, NULL);
    tp_supervisor_add(s, &d_src, &spec, &p);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    cr_assert_eq(tp_supervisor_run(s, 10), TP_ERR_PEER);
    cr_assert_eq(tp_supervisor_restarts(s, "source"), 2);
    cr_assert_eq(atomic_load(&spec.lives), 3);
    cr_assert(strstr(tp_supervisor_reason(s), "restarted 2 times"), "%s",
              tp_supervisor_reason(s));
    tp_supervisor_destroy(&s);
}

Test(supervisor, restart_window_forgets_old_failures) {
    /* Failures 0.3 s apart with a 0.2 s window never exceed 1 per window. */
    spec_t spec = {.n = 5, .fail_after = 3, .fail_lives = 3, .sleep_ms = 100};
    sink_t sink = {0};
    tp_restart_policy_t p = {1, 0.2};
    tp_supervisor_t *s = make_sup(5);
    tp_supervisor_add(s, &d_sink, &sink, NULL);
    tp_supervisor_add(s, &d_src, &spec, &p);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    cr_assert_eq(tp_supervisor_run(s, 10), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_supervisor_restarts(s, "source"), 3);
    tp_supervisor_destroy(&s);
}

Test(supervisor, missed_heartbeat_is_a_failure) {
    spec_t spec = {.n = 3, .fail_after = -1, .sleep_ms = 1000};
    sink_t sink = {0};
    tp_supervisor_t *s = make_sup(0.3);
    tp_supervisor_add(s, &d_sink, &sink, NULL);
    tp_supervisor_add(s, &d_src, &spec, NULL);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    double t0 = tp_now_s();
    cr_assert_eq(tp_supervisor_run(s, 10), TP_ERR_PEER);
    /* About 1 s: the source's handler is in its 1 s sleep when the miss is
     * seen, and is not called again once $TERM has arrived (it was: 2 s). */
    double dt = tp_now_s() - t0;
    cr_assert_lt(dt, 1.8, "took %.2f s", dt);
    cr_assert(strstr(tp_supervisor_reason(s), "missed its heartbeat"), "%s",
              tp_supervisor_reason(s));
    tp_supervisor_destroy(&s);
}

Test(supervisor, stop_request_drains) {
    spec_t spec = {.n = -1, .fail_after = -1};
    sink_t sink = {0};
    tp_supervisor_t *s = make_sup(5);
    tp_supervisor_add(s, &d_sink, &sink, NULL);
    tp_supervisor_add(s, &d_src, &spec, NULL);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    cr_assert_eq(tp_supervisor_run(s, 0.2), TP_ERR_TIMEOUT);
    tp_supervisor_stop(s);
    cr_assert_eq(tp_supervisor_run(s, 5), TP_ERR_INTERRUPTED);
    cr_assert(strstr(tp_supervisor_reason(s), "stop requested; in-flight data drained"),
              "%s", tp_supervisor_reason(s));
    tp_stats_row_t src, snk;
    tp_supervisor_child_stats(s, "source", &src);
    tp_supervisor_child_stats(s, "sink", &snk);
    cr_assert_gt(src.msgs_out, 0);
    cr_assert_eq(src.msgs_out, snk.msgs_in, "drained: sent %llu, received %llu",
                 (unsigned long long)src.msgs_out, (unsigned long long)snk.msgs_in);
    tp_supervisor_destroy(&s);
    cr_assert_eq(atomic_load(&tu_live), 0);
}

/* A sink that never finishes draining (sleeps): the drain times out. */
static tp_status_t slow_on_data(tp_actor_ctx_t *ctx, void *state, int port,
                                tp_datapoint_t **dp) {
    usleep(50000);
    return sink_on_data(ctx, state, port, dp);
}

Test(supervisor, sigint_stops_in_order_within_budget) {
    spec_t spec = {.n = -1, .fail_after = -1};
    sink_t sink = {0};
    tp_actor_def_t slow = d_sink;
    slow.on_data = slow_on_data;
    tp_supervisor_t *s = make_sup(5);
    tp_supervisor_add(s, &slow, &sink, NULL);
    tp_supervisor_add(s, &d_src, &spec, NULL);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    cr_assert_eq(tp_supervisor_run(s, 0.2), TP_ERR_TIMEOUT);
    double t0 = tp_now_s();
    raise(SIGINT);
    cr_assert_eq(tp_supervisor_run(s, 5), TP_ERR_INTERRUPTED);
    cr_assert_lt(tp_now_s() - t0, 2.0);
    cr_assert(strstr(tp_supervisor_reason(s), "stopped by SIGINT"), "%s",
              tp_supervisor_reason(s));
    cr_assert(strstr(tp_supervisor_reason(s), "dropped"), "%s",
              tp_supervisor_reason(s));
    tp_supervisor_destroy(&s);
    tp_signal_clear();
    cr_assert_eq(atomic_load(&tu_live), 0, "dropped data is freed");
}

Test(supervisor, publishes_stats_on_ipc) {
    spec_t spec = {.n = -1, .fail_after = -1, .sleep_ms = 1};
    sink_t sink = {0};
    tp_supervisor_t *s = make_sup(5);
    tp_supervisor_add(s, &d_sink, &sink, NULL);
    tp_supervisor_add(s, &d_src, &spec, NULL);
    const char *ep = tp_supervisor_stats_endpoint(s);
    cr_assert(!strncmp(ep, "ipc://", 6), "%s", ep);
    cr_assert(strstr(ep, tp_supervisor_run_dir(s)), "%s", ep);
    zsock_t *sub = zsock_new_sub(ep, "");
    cr_assert(sub);
    zsock_set_rcvtimeo(sub, 100);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    int got = 0;
    for (int i = 0; i < 30 && !got; i++) {
        tp_supervisor_run(s, 0.1);
        zframe_t *f = zframe_recv(sub);
        if (!f)
            continue;
        tp_status_t rc = tp_stats_decode(zframe_data(f), zframe_size(f), &snap);
        zframe_destroy(&f);
        cr_assert_eq(rc, TP_OK, "%s", tp_last_error());
        if (snap.nrows == 2 && snap.rows[1].msgs_out > 0)
            got = 1;
    }
    cr_assert(got, "a snapshot with both actors arrived");
    cr_assert_str_eq(snap.source, "supervisor");
    cr_assert_str_eq(snap.rows[0].name, "sink");
    cr_assert_str_eq(snap.rows[1].name, "source");
    cr_assert_eq(snap.rows[1].state, TP_ACTOR_RUNNING);
    cr_assert_gt(snap.rows[1].msgs_per_s, 10);
    tp_stats_snapshot_fini(&snap);
    zsock_destroy(&sub);
    char path[300];
    snprintf(path, sizeof path, "%s", ep + 6);
    tp_supervisor_destroy(&s);
    cr_assert_neq(access(path, F_OK), 0, "stats socket removed");
}

/* ---- members and tick: a tree whose thread does work of its own ------------ */

typedef struct {
    int calls;          /* rows asked */
    int fail_check;     /* the check fails from now on */
} member_t;

static int member_rows(void *impl, tp_stats_row_t *rows, int max) {
    member_t *m = impl;
    m->calls++;
    if (max < 2)
        return 0;
    for (int i = 0; i < 2; i++) {
        memset(&rows[i], 0, sizeof rows[i]);
        snprintf(rows[i].name, sizeof rows[i].name, "member%d", i);
        rows[i].state = TP_ACTOR_RUNNING;
        rows[i].msgs_in = (uint64_t)(10 * (i + 1));
    }
    return 2;
}

static tp_status_t member_check(void *impl) {
    member_t *m = impl;
    if (m->fail_check)
        return tp_error(TP_ERR_TIMEOUT, "tower3 has not finished step 7 in 2.0 s");
    return TP_OK;
}

static const tp_supervised_ops_t member_ops = {"towers", member_rows, member_check};

/* The tree of these tests: the sink, then the source under `policy`. */
static tp_supervisor_t *s_tree(spec_t *spec, sink_t *sink, const tp_restart_policy_t *policy) {
    tp_supervisor_t *s = make_sup(5);
    cr_assert_eq(tp_supervisor_add(s, &d_sink, sink, NULL), TP_OK);
    cr_assert_eq(tp_supervisor_add(s, &d_src, spec, policy), TP_OK);
    return s;
}

/* Ticks (each never blocks) until `done` says so or 5 s pass. */
#define TICK_UNTIL(s, rc, cond)                                             \
    do {                                                                    \
        double t_end_ = tp_now_s() + 5;                                     \
        while (((rc) = tp_supervisor_tick(s)) == TP_OK && !(cond) &&        \
               tp_now_s() < t_end_)                                         \
            usleep(2000);                                                   \
    } while (0)

Test(supervisor, members_are_published_after_the_children) {
    spec_t spec = {.n = -1, .fail_after = -1, .sleep_ms = 1};
    sink_t sink = {0};
    member_t m = {0};
    tp_supervisor_t *s = s_tree(&spec, &sink, NULL);
    cr_assert_eq(tp_supervisor_add_member(s, &member_ops, &m), TP_OK);
    zsock_t *sub = zsock_new_sub(tp_supervisor_stats_endpoint(s), "");
    cr_assert(sub);
    zsock_set_rcvtimeo(sub, 0);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    int got = 0;
    double t_end = tp_now_s() + 5;
    while (!got && tp_now_s() < t_end) {
        cr_assert_eq(tp_supervisor_tick(s), TP_OK, "%s", tp_last_error());
        zframe_t *f = zframe_recv(sub);
        if (!f) {
            usleep(5000);
            continue;
        }
        cr_assert_eq(tp_stats_decode(zframe_data(f), zframe_size(f), &snap), TP_OK);
        zframe_destroy(&f);
        got = snap.nrows == 4 && snap.rows[1].msgs_out > 0;
    }
    cr_assert(got, "a snapshot with the children and the member's rows");
    cr_assert_str_eq(snap.rows[0].name, "sink");
    cr_assert_str_eq(snap.rows[1].name, "source");
    cr_assert_str_eq(snap.rows[2].name, "member0");
    cr_assert_str_eq(snap.rows[3].name, "member1");
    cr_assert_eq(snap.rows[3].msgs_in, 20);
    tp_stats_snapshot_fini(&snap);
    zsock_destroy(&sub);
    tp_supervisor_destroy(&s);
    cr_assert_eq(atomic_load(&tu_live), 0);
}

Test(supervisor, tick_restarts_under_the_policy_and_a_clean_end_is_not_the_end) {
    spec_t spec = {.n = 50, .fail_after = 10, .fail_lives = 2};
    sink_t sink = {0};
    tp_restart_policy_t p = {3, 10};
    tp_supervisor_t *s = s_tree(&spec, &sink, &p);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    tp_status_t rc;
    /* Two failed lives (10 each) and one that ends cleanly (50). */
    TICK_UNTIL(s, rc, atomic_load(&sink.count) == 70);
    cr_assert_eq(rc, TP_OK, "%s", tp_last_error());
    cr_assert_eq(atomic_load(&sink.count), 70);
    cr_assert_eq(tp_supervisor_restarts(s, "source"), 2);
    cr_assert_eq(tp_supervisor_restarts_total(s), 2);
    /* The source is done, the sink waits: the owner decides the end. */
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(tp_supervisor_tick(s), TP_OK, "%s", tp_last_error());
        usleep(5000);
    }
    cr_assert_str_eq(tp_supervisor_reason(s), "");
    tp_supervisor_destroy(&s);
    cr_assert_eq(atomic_load(&tu_live), 0);
}

Test(supervisor, tick_reports_a_failure_beyond_the_policy) {
    spec_t spec = {.n = 100, .fail_after = 0, .fail_lives = 1000};
    sink_t sink = {0};
    tp_restart_policy_t p = {1, 10};
    tp_supervisor_t *s = s_tree(&spec, &sink, &p);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    tp_status_t rc;
    TICK_UNTIL(s, rc, 0);
    cr_assert_eq(rc, TP_ERR_PEER, "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "child 'source' failed: planted failure") &&
              strstr(tp_last_error(), "restarted 1 times"), "%s", tp_last_error());
    /* and again on every later tick */
    cr_assert_eq(tp_supervisor_tick(s), TP_ERR_PEER);
    tp_supervisor_destroy(&s);
    cr_assert_eq(atomic_load(&tu_live), 0);
}

Test(supervisor, a_member_that_fails_its_check_ends_the_tree) {
    spec_t spec = {.n = -1, .fail_after = -1, .sleep_ms = 1};
    sink_t sink = {0};
    member_t m = {0};
    tp_supervisor_t *s = s_tree(&spec, &sink, NULL);
    tp_supervisor_add_member(s, &member_ops, &m);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(tp_supervisor_tick(s), TP_OK, "%s", tp_last_error());
    m.fail_check = 1;
    cr_assert_eq(tp_supervisor_tick(s), TP_ERR_PEER);
    cr_assert(strstr(tp_last_error(), "towers: tower3 has not finished step 7"),
              "%s", tp_last_error());
    cr_assert(strstr(tp_supervisor_reason(s), "towers: tower3"), "%s",
              tp_supervisor_reason(s));
    /* the children were stopped: nothing moves any more */
    tp_stats_row_t a, b;
    tp_supervisor_child_stats(s, "source", &a);
    usleep(50000);
    cr_assert_eq(tp_supervisor_tick(s), TP_ERR_PEER);
    tp_supervisor_child_stats(s, "source", &b);
    cr_assert_eq(a.msgs_out, b.msgs_out);
    tp_supervisor_destroy(&s);
    cr_assert_eq(atomic_load(&tu_live), 0);
}

Test(supervisor, tick_turns_sigint_into_a_drain) {
    spec_t spec = {.n = -1, .fail_after = -1, .sleep_ms = 1};
    sink_t sink = {0};
    tp_supervisor_t *s = s_tree(&spec, &sink, NULL);
    cr_assert_eq(tp_supervisor_start(s), TP_OK);
    cr_assert_eq(tp_supervisor_tick(s), TP_OK);
    raise(SIGINT);
    cr_assert_eq(tp_supervisor_tick(s), TP_ERR_INTERRUPTED);
    tp_status_t rc;
    double t_end = tp_now_s() + 5;
    while ((rc = tp_supervisor_tick(s)) == TP_ERR_INTERRUPTED &&
           !strstr(tp_supervisor_reason(s), "drained") && tp_now_s() < t_end)
        usleep(2000);
    cr_assert_eq(rc, TP_ERR_INTERRUPTED);
    cr_assert(strstr(tp_supervisor_reason(s), "stopped by SIGINT; in-flight data drained"),
              "%s", tp_supervisor_reason(s));
    tp_supervisor_destroy(&s);
    tp_signal_clear();
    cr_assert_eq(atomic_load(&tu_live), 0);
}
