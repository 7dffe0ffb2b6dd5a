/* towerpack tests: longer actor and supervisor scenarios (many datapoints
 * through a chain, backpressure then termination, restarts and a drained
 * stop) that exercise every cross-thread hand-off; meant above all for the
 * ThreadSanitizer pass (tests/shim runs them in one process there). */
#include <criterion/criterion.h>
#include <czmq.h>
#include <stdio.h>
#include <unistd.h>
#include "actor_testutil.h"

#define CHECK(cond) cr_assert((cond), "%s", tp_last_error())

typedef struct {
    int64_t n, made;
    size_t pad;
} src_t;

static tp_status_t src_produce(tp_actor_ctx_t *ctx, void *state) {
    src_t *s = state;
    if (s->n >= 0 && s->made >= s->n)
        return TP_DONE;
    tp_datapoint_t *dp = tu_dp(s->made++, s->pad);
    return tp_actor_send(ctx, 0, &dp);
}

typedef struct {
    int64_t count, next;
    int in_order, sleep_us;
} sink_t;

static tp_status_t sink_on_data(tp_actor_ctx_t *ctx, void *state, int port,
                                tp_datapoint_t **dp) {
    (void)ctx; (void)port;
    sink_t *s = state;
    if (!*dp)
        return TP_OK;
    if (tu_value(*dp) != s->next++)
        s->in_order = 0;
    s->count++;
    if (s->sleep_us)
        usleep((useconds_t)s->sleep_us);
    return TP_OK;
}

/* A middle stage that touches the payload (ownership really moved). */
static tp_status_t inc_on_data(tp_actor_ctx_t *ctx, void *state, int port,
                               tp_datapoint_t **dp) {
    (void)state; (void)port;
    if (!*dp)
        return TP_OK;
    int64_t *v = tp_datapoint_get(*dp, 0)->data;
    *v += 0;  /* read and write on this thread */
    return tp_actor_send(ctx, 0, dp);
}

static const tp_actor_port_t a_out[] = {{"out", "inproc://ts-a", 1, 0, 0}};
static const tp_actor_port_t b_in[] = {{"in", "inproc://ts-a", 0, 0, 0}};
static const tp_actor_port_t b_out[] = {{"out", "inproc://ts-b", 1, 0, 0}};
static const tp_actor_port_t c_in[] = {{"in", "inproc://ts-b", 0, 0, 0}};

static void chain(void) {
    src_t src = {50000, 0, 0};
    sink_t sink = {0, 0, 1, 0};
    tp_actor_def_t da = {"src", NULL, 0, a_out, 1, NULL, NULL, src_produce, NULL};
    tp_actor_def_t db = {"inc", b_in, 1, b_out, 1, NULL, inc_on_data, NULL, NULL};
    tp_actor_def_t dc = {"sink", c_in, 1, NULL, 0, NULL, sink_on_data, NULL, NULL};
    tp_actor_t *c = tp_actor_new(&dc, &sink);
    tp_actor_t *b = tp_actor_new(&db, NULL);
    tp_actor_t *a = tp_actor_new(&da, &src);
    CHECK(a && b && c);
    tp_stats_row_t row;
    for (int i = 0; i < 5; i++) {  /* stats requests while it runs */
        CHECK(tp_actor_stats(b, &row) == TP_OK);
        usleep(2000);
    }
    CHECK(tp_actor_wait(a, 20000) == TP_OK);
    CHECK(tp_actor_wait(b, 20000) == TP_OK);
    CHECK(tp_actor_wait(c, 20000) == TP_OK);
    tp_actor_destroy(&a);
    tp_actor_destroy(&b);
    tp_actor_destroy(&c);
    CHECK(sink.count == 50000 && sink.in_order);
    CHECK(atomic_load(&tu_live) == 0);
}

static void backpressure_and_terminate(void) {
    src_t src = {-1, 0, 4096};
    sink_t sink = {0, 0, 1, 2000};
    static const tp_actor_port_t out[] = {{"out", "inproc://ts-bp", 1, 4, 0}};
    static const tp_actor_port_t in[] = {{"in", "inproc://ts-bp", 0, 4, 0}};
    tp_actor_def_t da = {"fast", NULL, 0, out, 1, NULL, NULL, src_produce, NULL};
    tp_actor_def_t dc = {"slow", in, 1, NULL, 0, NULL, sink_on_data, NULL, NULL};
    tp_actor_t *c = tp_actor_new(&dc, &sink);
    tp_actor_t *a = tp_actor_new(&da, &src);
    CHECK(a && c);
    usleep(200000);
    /* 2 x hwm in the link, one in the sink, one being sent, one of slack */
    CHECK(atomic_load(&tu_live) <= 2 * 4 + 3);
    tp_actor_destroy(&a);
    tp_actor_destroy(&c);
    CHECK(atomic_load(&tu_live) == 0);
}

typedef struct {
    atomic_int lives;
} flaky_t;

static tp_status_t flaky_init(tp_actor_ctx_t *ctx, void *arg, void **state) {
    (void)ctx;
    src_t *s = calloc(1, sizeof *s);
    s->n = atomic_fetch_add(&((flaky_t *)arg)->lives, 1) < 2 ? 5 : 1000;
    *state = s;
    return TP_OK;
}
static tp_status_t flaky_produce(tp_actor_ctx_t *ctx, void *state) {
    src_t *s = state;
    if (s->made == s->n && s->n == 5)
        return tp_error(TP_ERR_FORMAT, "flaky");
    return src_produce(ctx, state);
}
static void flaky_fini(void *state) { free(state); }

static void supervised(void) {
    flaky_t fl;
    atomic_init(&fl.lives, 0);
    sink_t sink = {0, 0, 1, 0};
    static const tp_actor_port_t out[] = {{"out", "inproc://ts-sv", 0, 0, 0}};
    static const tp_actor_port_t in[] = {{"in", "inproc://ts-sv", 1, 0, 0}};
    tp_actor_def_t da = {"flaky", NULL, 0, out, 1, flaky_init, NULL, flaky_produce,
                         flaky_fini};
    tp_actor_def_t dc = {"sink", in, 1, NULL, 0, NULL, sink_on_data, NULL, NULL};
    tp_supervisor_opts_t o;
    tp_supervisor_opts_init(&o);
    o.heartbeat_ms = 20;
    o.stats_interval_s = 0.05;
    o.handle_signals = 0;
    tp_supervisor_t *s = tp_supervisor_new(&o);
    CHECK(s);
    zsock_t *sub = zsock_new_sub(tp_supervisor_stats_endpoint(s), "");
    tp_restart_policy_t p = {3, 10};
    CHECK(tp_supervisor_add(s, &dc, &sink, NULL) == TP_OK);
    CHECK(tp_supervisor_add(s, &da, &fl, &p) == TP_OK);
    CHECK(tp_supervisor_start(s) == TP_OK);
    CHECK(tp_supervisor_run(s, 20) == TP_OK);
    CHECK(tp_supervisor_restarts(s, "flaky") == 2);
    CHECK(sink.count == 5 + 5 + 1000);
    zsock_destroy(&sub);
    tp_supervisor_destroy(&s);

    /* An endless tree stopped by request: drained. Its own endpoint: libzmq
     * releases an inproc name asynchronously after its socket closes, so
     * binding the same name again at once can fail with "in use". */
    static const tp_actor_port_t out2[] = {{"out", "inproc://ts-sv-drain", 0, 0, 0}};
    static const tp_actor_port_t in2[] = {{"in", "inproc://ts-sv-drain", 1, 0, 0}};
    src_t src = {-1, 0, 0};
    sink_t sink2 = {0, 0, 1, 0};
    tp_actor_def_t dsrc = {"src", NULL, 0, out2, 1, NULL, NULL, src_produce, NULL};
    tp_actor_def_t dc2 = {"sink", in2, 1, NULL, 0, NULL, sink_on_data, NULL, NULL};
    s = tp_supervisor_new(&o);
    CHECK(s);
    tp_supervisor_add(s, &dc2, &sink2, NULL);
    tp_supervisor_add(s, &dsrc, &src, NULL);
    CHECK(tp_supervisor_start(s) == TP_OK);
    CHECK(tp_supervisor_run(s, 0.2) == TP_ERR_TIMEOUT);
    tp_supervisor_stop(s);
    CHECK(tp_supervisor_run(s, 5) == TP_ERR_INTERRUPTED);
    CHECK(sink2.count == src.made && sink2.in_order);
    tp_supervisor_destroy(&s);
    CHECK(atomic_load(&tu_live) == 0);
}

Test(actor_scenarios, chain_of_three) { chain(); }
Test(actor_scenarios, backpressure_then_terminate) { backpressure_and_terminate(); }
Test(actor_scenarios, supervised_restarts_and_drained_stop) { supervised(); }
