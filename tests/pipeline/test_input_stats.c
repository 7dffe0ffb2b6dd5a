/* towerpack tests: statistics that inputs and towers publish about
 * themselves. Each input kind gives its own rows through its ops table
 * (tp_input_stats) and its counters grow as batches are taken; a kind is
 * recognised by its ops table, not its name (a custom input called
 * "QueueInput" is not taken for one); a custom input's own rows reach the
 * trainer's published statistics (so the trainer matches no names), also
 * while a step waits in it; the towers count their own steps, one row
 * each. */
#define _GNU_SOURCE  /* sched_setaffinity, CPU_SET */
#include <criterion/criterion.h>
#include <czmq.h>
#include <dirent.h>
#include <sched.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/stats.h>
#include <towerpack/towerpack.h>
#include <towerpack/launch.h>
#include "pipeline/train/towers.h"
#include "dir_testutil.h"
#include "train_testutil.h"
#include "zmq_input_testutil.h"

static const tp_stats_row_t *s_find(const tp_stats_row_t *rows, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].name, name))
            return &rows[i];
    return NULL;
}

static int s_has_scalar(const tp_input_scalar_t *v, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, name))
            return 1;
    return 0;
}

static void s_take(tp_input_t *in, int towers, int steps) {
    for (int s = 0; s < steps; s++)
        for (int t = 0; t < towers; t++) {
            tp_datapoint_t *dp = NULL;
            cr_assert_eq(tp_input_next(in, t, &dp), TP_OK, "%s", tp_last_error());
            tp_input_release(in, t, &dp);
        }
}

/* The prefetch actor publishes its counters every few ms: wait until its
 * row says at least `n` batches went out. */
static tp_stats_row_t s_queue_row_after(tp_input_t *in, int nrows, const char *name,
                                        uint64_t n) {
    tp_stats_row_t rows[8];
    for (int i = 0; i < 400; i++) {
        int got = tp_input_stats(in, rows, 8);
        cr_assert_eq(got, nrows, "rows: %d", got);
        const tp_stats_row_t *r = s_find(rows, got, name);
        cr_assert_not_null(r, "a row named %s", name);
        if (r->msgs_out >= n)
            return *r;
        usleep(5000);
    }
    cr_assert_fail("%s never reported %llu batches out", name, (unsigned long long)n);
    return rows[0];
}

Test(input_stats, queue_input_gives_its_prefetch_actors_row) {
    tp_input_t *in = tp_input_queue(tu_counting(100), 8);
    tp_stats_row_t rows[4];
    cr_assert_eq(tp_input_stats(in, rows, 4), 0, "no actor before start");
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    s_take(in, 1, 10);
    tp_stats_row_t a = s_queue_row_after(in, 1, "QueueInput", 10);
    s_take(in, 1, 30);
    tp_stats_row_t b = s_queue_row_after(in, 1, "QueueInput", 40);
    cr_assert_gt(b.msgs_out, a.msgs_out, "the count grows");
    cr_assert_eq(b.state, TP_ACTOR_RUNNING);
    cr_assert(b.queue_fill >= 0 && b.queue_fill <= 1, "queue fill %g", b.queue_fill);
    tp_input_scalar_t v[8];
    int n = tp_input_scalars(in, v, 8);
    cr_assert_eq(n, 2, "scalars: %d", n);
    cr_assert(s_has_scalar(v, n, "QueueInput/queue_fill"), "queue_fill");
    cr_assert(s_has_scalar(v, n, "QueueInput/blocked_s"), "blocked_s");
    cr_assert_eq(tp_input_stats(in, rows, 0), 0, "max 0: nothing written");
    tp_input_destroy(&in);
}

Test(input_stats, staging_input_adds_a_row_per_stage_after_its_inner_inputs) {
    tp_input_t *in = tp_input_staging(tp_input_queue(tu_counting(100), 8), 1, NULL);
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK, "%s", tp_last_error());
    s_take(in, 2, 10);
    tp_stats_row_t rows[8];
    int n = tp_input_stats(in, rows, 8);
    cr_assert_eq(n, 3, "QueueInput and two stages: %d", n);
    cr_assert_str_eq(rows[0].name, "QueueInput");
    cr_assert_str_eq(rows[1].name, "StagingInput/tower0");
    cr_assert_str_eq(rows[2].name, "StagingInput/tower1");
    uint64_t staged0 = rows[1].msgs_out;
    cr_assert_geq(staged0, 10);
    s_take(in, 2, 20);
    n = tp_input_stats(in, rows, 8);
    cr_assert_eq(n, 3);
    cr_assert_geq(rows[1].msgs_out, 30, "tower0's stage: %llu", (unsigned long long)rows[1].msgs_out);
    cr_assert_geq(rows[2].msgs_out, 30);
    cr_assert_gt(rows[1].msgs_out, staged0, "the count grows");
    /* Nobody takes for a while: once tower0's stage is full it waits for a
     * free slot, which is being blocked by the tower, not starved. */
    double blocked0 = rows[1].blocked_s;
    for (int i = 0; i < 3000 && rows[1].queue_fill < 1.0; i++) {
        usleep(10000);
        cr_assert_eq(tp_input_stats(in, rows, 8), 3);
    }
    cr_assert_geq(rows[1].queue_fill, 1.0, "tower0's stage never filled");
    usleep(50000);
    s_take(in, 2, 2);  /* ends the wait, which is then counted */
    cr_assert_eq(tp_input_stats(in, rows, 8), 3);
    cr_assert_gt(rows[1].blocked_s, blocked0 + 0.04, "a full stage is blocked: %.3f s",
                 rows[1].blocked_s - blocked0);
    /* too little room: the inner input's row first, then as many stages as fit */
    cr_assert_eq(tp_input_stats(in, rows, 2), 2);
    cr_assert_str_eq(rows[1].name, "StagingInput/tower0");
    tp_input_scalar_t v[8];
    n = tp_input_scalars(in, v, 8);
    cr_assert_eq(n, 3, "scalars: %d", n);
    cr_assert(s_has_scalar(v, n, "QueueInput/queue_fill"), "the inner input's");
    cr_assert(s_has_scalar(v, n, "StagingInput/towers_wait_s"), "its own");
    tp_input_destroy(&in);
}

/* ---- ZMQInput --------------------------------------------------------------- */

static char s_dir[64], s_ep[128];

static void s_setup(void) {
    dt_make(s_dir, sizeof s_dir, "tp-instats");
    snprintf(s_ep, sizeof s_ep, "ipc://%s/in.sock", s_dir);
}

static void s_teardown(void) { dt_remove(s_dir); }

/* A gate in the sender's dataflow: the first `pass` datapoints go through,
 * the next waits (at most 20 s) until the test opens it, so that the
 * sender is still connected (its stats row still there) while the test
 * looks; without it a fast sender sent all and left first. */
typedef struct {
    atomic_int seen, open;
    int pass;
} s_gate_t;

static tp_status_t s_gate_map(tp_datapoint_t **dp, tp_rng_t *rng, void *user) {
    (void)dp, (void)rng;
    s_gate_t *g = user;
    if (atomic_fetch_add(&g->seen, 1) == g->pass)
        for (int ms = 0; !atomic_load(&g->open) && ms < 20000; ms++)
            zclock_sleep(1);
    return TP_OK;
}

Test(input_stats, zmq_input_gives_its_receivers_row, .init = s_setup, .fini = s_teardown) {
    tp_remote_opts_t o;
    tp_remote_opts_init(&o);
    o.timeout_s = 20;
    tp_input_t *in = tp_input_zmq(s_ep, &o);
    cr_assert_not_null(in, "%s", tp_last_error());
    tp_stats_row_t rows[4];
    cr_assert_eq(tp_input_stats(in, rows, 4), 0, "no row before start");
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    static s_gate_t gate = {.pass = 12};
    static const char *const junk[] = {"junk", NULL};  /* not the wire format: counted */
    zi_sender_t s = {.ep = s_ep, .junk = junk,
                     .df = tp_df_map(tu_counting(30), s_gate_map, &gate, NULL), .count = 25};
    pthread_t th;
    pthread_create(&th, NULL, zi_send, &s);
    s_take(in, 1, 10);
    /* the sender's report comes before its first datapoint: its row
     * (its process and host), then the receiver's */
    int rows_seen = tp_input_stats(in, rows, 4);
    atomic_store(&gate.open, 1);
    cr_assert_eq(rows_seen, 2, "%d rows: %s, %s", rows_seen, rows_seen > 0 ? rows[0].name : "-",
                 rows_seen > 1 ? rows[1].name : "-");
    cr_assert(!strncmp(rows[0].name, "send ", 5), "%s", rows[0].name);
    cr_assert_eq(rows[0].pid, (uint32_t)getpid());
    cr_assert(rows[0].host[0]);
    cr_assert_str_eq(rows[1].name, "ZMQInput");
    cr_assert_eq(rows[1].msgs_in, 10);
    s_take(in, 1, 15);
    /* the sender has sent its 25 and may have closed its connection by
     * now, which takes its row away: the receiver's row is the last */
    int n = tp_input_stats(in, rows, 4);
    cr_assert(n == 1 || n == 2, "%d rows", n);
    cr_assert_str_eq(rows[n - 1].name, "ZMQInput");
    cr_assert_eq(rows[n - 1].msgs_in, 25, "the count grows");
    cr_assert_gt(rows[n - 1].starved_s, 0, "time waiting for the senders");
    /* the wire bytes received: 25 datapoints and the junk at least */
    cr_assert_gt(rows[n - 1].bytes_in, 25 * 8, "%llu bytes",
                 (unsigned long long)rows[n - 1].bytes_in);
    pthread_join(th, NULL);
    cr_assert_eq(s.rc, TP_OK, "%s", tp_last_error());
    tp_input_scalar_t v[4];
    cr_assert_eq(tp_input_scalars(in, v, 4), 3);
    cr_assert_str_eq(v[0].name, "ZMQInput/malformed");
    cr_assert_float_eq(v[0].value, 1, 1e-9);
    cr_assert_str_eq(v[1].name, "ZMQInput/unfit");  /* nothing expected: none */
    cr_assert_float_eq(v[1].value, 0, 1e-9);
    cr_assert_str_eq(v[2].name, "ZMQInput/refused");  /* no job id: none refused */
    cr_assert_float_eq(v[2].value, 0, 1e-9);
    tp_dataflow_destroy(&s.df);
    tp_input_destroy(&in);
}

/* ---- kinds are ops tables, not names --------------------------------------- */

static tp_status_t f_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    (void)impl; (void)towers; (void)seed; (void)skip;
    return TP_OK;
}
static tp_status_t f_next(void *impl, int tower, tp_datapoint_t **out) {
    (void)impl; (void)tower;
    *out = NULL;
    return tp_error(TP_ERR_STATE, "impostor");
}
static int64_t f_size(void *impl) { (void)impl; return -1; }

Test(input_stats, an_input_named_like_a_builtin_is_not_taken_for_one) {
    /* impl is not what the built-in kinds hold: reading it as theirs
     * would read garbage (or crash) */
    static char junk[8];
    static const char *names[] = {"QueueInput", "StagingInput", "ZMQInput"};
    for (int i = 0; i < 3; i++) {
        tp_input_ops_t ops = {.name = names[i], .start = f_start, .next = f_next,
                              .size = f_size};
        tp_input_t *in = tp_input_new(&ops, junk);
        cr_assert_str_eq(tp_input_name(in), names[i]);
        tp_stats_row_t row;
        cr_assert_eq(tp_input_queue_stats(in, &row), TP_ERR_INVALID);
        cr_assert_eq(tp_input_queue_taken(in), 0);
        cr_assert_float_eq(tp_input_queue_fill(in), -1, 1e-9);
        cr_assert_null(tp_input_staging_inner(in));
        cr_assert_eq(tp_input_staging_stats(in, 0, &row), TP_ERR_INVALID);
        cr_assert_eq(tp_input_zmq_received(in), 0);
        cr_assert_eq(tp_input_zmq_malformed(in), 0);
        cr_assert_eq(tp_input_stats(in, &row, 1), 0, "no stats entry: no rows");
        tp_input_destroy(&in);
    }
    tp_input_t *feed = tp_input_feed(tu_counting(4));
    tp_stats_row_t row;
    cr_assert_eq(tp_input_stats(feed, &row, 1), 0, "FeedInput has no thread of its own");
    cr_assert_eq(tp_input_queue_stats(feed, &row), TP_ERR_INVALID);
    tp_input_destroy(&feed);
}

/* ---- a custom input's rows in the trainer's published statistics ------------ */

/* What the custom inputs below share, first in each (their impl): a dataflow
 * read round and round, and the datapoints given. */
typedef struct {
    tp_dataflow_t *df;
    uint64_t given;          /* trainer's thread only */
} s_reader_t;

static tp_status_t r_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    (void)towers; (void)skip;
    return tp_dataflow_reset_state(((s_reader_t *)impl)->df, seed, 0);
}

/* The next datapoint, from a new epoch where one ends; counted. */
static tp_status_t r_next(s_reader_t *r, tp_datapoint_t **out) {
    tp_status_t rc = tp_dataflow_next(r->df, out);
    if (rc == TP_DONE)
        rc = tp_dataflow_next(r->df, out);
    if (rc == TP_OK)
        r->given++;
    return rc;
}

static int64_t r_size(void *impl) { (void)impl; return -1; }

static void r_destroy(void *impl) {
    tp_dataflow_destroy(&((s_reader_t *)impl)->df);
}

/* The input's one row: `name`, running, its datapoints given as msgs_out. */
static int r_stats(const s_reader_t *r, const char *name, tp_stats_row_t *rows) {
    memset(&rows[0], 0, sizeof rows[0]);
    snprintf(rows[0].name, sizeof rows[0].name, "%s", name);
    rows[0].state = TP_ACTOR_RUNNING;
    rows[0].msgs_out = r->given;
    rows[0].queue_fill = -1;
    return 1;
}

typedef struct {
    s_reader_t rd;
    atomic_int seen;         /* the test has its snapshot: stop dawdling */
} s_custom_t;

/* A slow input until the test has seen a snapshot (one is published once
 * a second), then as fast as the dataflow. */
static tp_status_t c_next(void *impl, int tower, tp_datapoint_t **out) {
    s_custom_t *c = impl;
    (void)tower;
    if (!atomic_load(&c->seen))
        usleep(1000);
    return r_next(&c->rd, out);
}

/* A name no built-in input has: only the ops table can bring it in. */
static int c_stats(void *impl, tp_stats_row_t *rows, int max) {
    (void)max;
    return r_stats(impl, "my-reader", rows);
}

typedef struct {
    tp_train_config_t cfg;
    tp_status_t rc;
    char err[512];
} s_run_t;

static void *s_train(void *arg) {
    s_run_t *r = arg;
    r->rc = tp_launch_train_with_config(&r->cfg, NULL);
    snprintf(r->err, sizeof r->err, "%s", tp_last_error());
    return NULL;
}

/* One epoch of `steps` steps of tu_linear_model() on `in` (taken) over
 * `towers`, publishing statistics to stats_ep, started on *th; a
 * subscriber to them (100 ms receive timeout), the caller's to destroy. */
static zsock_t *s_run_start(s_run_t *r, tp_input_t *in, int towers,
                            int64_t steps, const char *stats_ep, pthread_t *th) {
    tp_train_config_init(&r->cfg);
    r->cfg.model = tu_linear_model();
    r->cfg.input = in;
    r->cfg.towers = towers;
    r->cfg.batch = 8;
    r->cfg.threads = 1;
    r->cfg.max_epoch = 1;
    r->cfg.steps_per_epoch = steps;
    r->cfg.stats = stats_ep;
    r->cfg.default_callbacks = 0;
    zsock_t *sub = zsock_new_sub(stats_ep, "");
    cr_assert_not_null(sub, "subscriber");
    zsock_set_rcvtimeo(sub, 100);
    pthread_create(th, NULL, s_train, r);
    return sub;
}

static void s_published_case(int towers) {
    char stats_ep[160];
    snprintf(stats_ep, sizeof stats_ep, "ipc://%s/stats.sock", s_dir);
    static const tp_input_ops_t ops = {
        .name = "MyInput", .start = r_start, .next = c_next, .size = r_size,
        .destroy = r_destroy, .stats = c_stats,
    };
    s_custom_t c = {.rd.df = tu_blobs(256, 4, 0.7f, 99, 8, 1, 0)};
    atomic_init(&c.seen, 0);
    s_run_t r;
    pthread_t th;
    zsock_t *sub = s_run_start(&r, tp_input_new(&ops, &c), towers, 4000, stats_ep, &th);
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    int got = 0;
    for (int i = 0; i < 300 && !got; i++) {
        zframe_t *f = zframe_recv(sub);
        if (!f)
            continue;
        tp_status_t rc = tp_stats_decode(zframe_data(f), zframe_size(f), &snap);
        zframe_destroy(&f);
        cr_assert_eq(rc, TP_OK, "%s", tp_last_error());
        const tp_stats_row_t *mine = s_find(snap.rows, snap.nrows, "my-reader");
        got = mine && mine->msgs_out > 0;
    }
    atomic_store(&c.seen, 1);
    pthread_join(th, NULL);
    zsock_destroy(&sub);
    cr_assert_eq(r.rc, TP_OK, "%s", r.err);
    cr_assert(got, "a snapshot with the custom input's row arrived");
    cr_assert_str_eq(snap.source, "tp-train");
    cr_assert_eq(snap.nrows, 1 + 1 + towers, "my-reader, supervisor, %d towers", towers);
    cr_assert_str_eq(snap.rows[0].name, "my-reader", "the input's rows come first");
    const tp_stats_row_t *mine = &snap.rows[0];
    const tp_stats_row_t *tr = s_find(snap.rows, snap.nrows, "supervisor");
    cr_assert_not_null(tr, "the supervisor's row");
    /* published between steps: every batch the input gave, the supervisor
     * took */
    cr_assert_eq(tr->msgs_in, mine->msgs_out);
    cr_assert_eq(tr->msgs_in % (uint64_t)towers, 0);
    for (int i = 0; i < towers; i++) {
        char name[16];
        snprintf(name, sizeof name, "tower%d", i);
        const tp_stats_row_t *t = s_find(snap.rows, snap.nrows, name);
        cr_assert_not_null(t, "%s's row", name);
        cr_assert_eq(t->msgs_in, tr->msgs_in / (uint64_t)towers,
                     "%s counted %llu steps, the supervisor ran %llu", name,
                     (unsigned long long)t->msgs_in,
                     (unsigned long long)(tr->msgs_in / (uint64_t)towers));
        cr_assert_gt(t->busy_s, 0, "%s busy", name);
        cr_assert_gt(t->starved_s, 0, "%s waited for its batches (the slow input)", name);
    }
    /* with tower actors the supervisor waits for them: blocked, not busy */
    if (towers > 1)
        cr_assert_gt(tr->blocked_s, 0, "the supervisor's wait for its towers");
    else
        cr_assert_eq(tr->blocked_s, 0, "one tower runs on the supervisor's thread");
    cr_assert_null(s_find(snap.rows, snap.nrows, "QueueInput"), "no invented rows");
    tp_stats_snapshot_fini(&snap);
}

Test(input_stats, a_custom_inputs_rows_reach_the_published_statistics,
     .init = s_setup, .fini = s_teardown) {
    s_published_case(1);
}

Test(input_stats, a_custom_inputs_rows_and_two_towers_rows_are_published,
     .init = s_setup, .fini = s_teardown) {
    s_published_case(2);
}

/* ---- a step that waits in a custom input still supervises ------------------- */

typedef struct {
    s_reader_t rd;
    atomic_int holding;      /* 1 while next holds the step for the test */
    atomic_int release;      /* set by the test */
} s_holding_t;

/* After 20 batches, a wait the way the built-in inputs wait: wake every
 * 100 ms and call the wait's phase by name, until the test lets go (10 s
 * at most, so that a phase that never runs fails the test, not hangs it). */
static tp_status_t h_next(void *impl, int tower, tp_datapoint_t **out) {
    s_holding_t *h = impl;
    (void)tower;
    if (h->rd.given == 20) {
        atomic_store(&h->holding, 1);
        for (int i = 0; i < 100 && !atomic_load(&h->release); i++) {
            usleep(100000);
            if (tp_actor_wait_tick())
                return tp_error(TP_ERR_INTERRUPTED, "HoldingInput: told to stop");
        }
        atomic_store(&h->holding, 0);
    }
    return r_next(&h->rd, out);
}

static int h_stats(void *impl, tp_stats_row_t *rows, int max) {
    (void)max;
    return r_stats(impl, "holding-reader", rows);
}

/* Supervision is a phase of the step that its waits run: while the step
 * waits in an input that ticks (tp_actor_wait_tick), the statistics still
 * go out once a second. Two snapshots during the hold: at most one can be
 * the step boundary's just before it. */
Test(input_stats, a_step_waiting_in_a_custom_input_still_publishes_statistics,
     .init = s_setup, .fini = s_teardown) {
    char stats_ep[160];
    snprintf(stats_ep, sizeof stats_ep, "ipc://%s/stats.sock", s_dir);
    static const tp_input_ops_t ops = {
        .name = "HoldingInput", .start = r_start, .next = h_next, .size = r_size,
        .destroy = r_destroy, .stats = h_stats,
    };
    s_holding_t h = {.rd.df = tu_blobs(256, 4, 0.7f, 99, 8, 1, 0)};
    atomic_init(&h.holding, 0);
    atomic_init(&h.release, 0);
    s_run_t r;
    pthread_t th;
    zsock_t *sub = s_run_start(&r, tp_input_new(&ops, &h), 1, 40, stats_ep, &th);
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    int during = 0;
    for (int i = 0; i < 150 && during < 2; i++) {  /* 15 s at most */
        zframe_t *f = zframe_recv(sub);
        if (!f)
            continue;
        tp_status_t rc = tp_stats_decode(zframe_data(f), zframe_size(f), &snap);
        zframe_destroy(&f);
        cr_assert_eq(rc, TP_OK, "%s", tp_last_error());
        const tp_stats_row_t *row = s_find(snap.rows, snap.nrows, "holding-reader");
        if (row && row->msgs_out == 20 && atomic_load(&h.holding))
            during++;
    }
    atomic_store(&h.release, 1);
    pthread_join(th, NULL);
    zsock_destroy(&sub);
    tp_stats_snapshot_fini(&snap);
    cr_assert_eq(r.rc, TP_OK, "%s", r.err);
    cr_assert_eq(during, 2, "snapshots published while the step waited: %d", during);
    cr_assert_eq(h.rd.given, 40);
}

/* ---- towers count their own steps ------------------------------------------- */

/* tu_linear_model on 2 towers of one thread, batch 8. */
static tp_model_t *s_two_towers_model(void) {
    tp_model_config_t mc = tp_model_config_default();
    mc.towers = 2;
    mc.batch = 8;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(tu_linear_model(), &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

Test(input_stats, towers_count_their_own_steps) {
    tp_model_t *m = s_two_towers_model();
    tp_towers_t *tw = tp_towers_new(m, 2, TP_RUN_TRAIN, NULL);
    cr_assert_not_null(tw, "%s", tp_last_error());
    tp_input_t *in = tp_input_feed(tu_blobs(256, 4, 0.7f, 99, 8, 0, 0));
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK);
    tp_stats_row_t rows[4];
    cr_assert_eq(tp_towers_stats(tw, rows, 4), 2);
    cr_assert_eq(rows[0].msgs_in, 0, "no step yet");
    const int steps = 25;
    for (int s = 0; s < steps; s++) {
        tp_datapoint_t *b[2] = {NULL, NULL};
        for (int t = 0; t < 2; t++)
            cr_assert_eq(tp_input_next(in, t, &b[t]), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_towers_step(tw, b, 0), TP_OK, "%s", tp_last_error());
        tp_run_opts_t close = {.stages = TP_RUN_UPDATE};  /* the slices applied */
        cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &close), TP_OK,
                     "%s", tp_last_error());
    }
    cr_assert_eq(tp_towers_stats(tw, rows, 4), 2, "one row per tower");
    cr_assert_eq(tp_towers_stats(tw, rows, 1), 1, "at most max");
    cr_assert_eq(tp_towers_stats(tw, rows, 4), 2);
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof name, "tower%d", i);
        cr_assert_str_eq(rows[i].name, name);
        cr_assert_eq(rows[i].state, TP_ACTOR_RUNNING);
        cr_assert_eq(rows[i].msgs_in, (uint64_t)steps, "%s: %llu steps", name,
                     (unsigned long long)rows[i].msgs_in);
        cr_assert_gt(rows[i].busy_s, 0);
        cr_assert_gt(rows[i].blocked_s, 0, "time in the all-reduce");
        cr_assert_leq(rows[i].busy_s + rows[i].starved_s + rows[i].blocked_s,
                      rows[i].alive_s + 1e-6);
    }
    tp_towers_destroy(&tw);
    tp_input_destroy(&in);
    tp_model_destroy(&m);
}

/* ---- towers pinned to their cores (TP_PIN_TOWERS=1) ------------------------- */

/* How many of this process's threads may run on cpu alone. */
static int s_threads_on(int cpu) {
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    struct dirent *e;
    int n = 0;
    char want[32];
    snprintf(want, sizeof want, "Cpus_allowed_list:\t%d\n", cpu);
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* a thread that just ended */
        while (fgets(line, sizeof line, f))
            if (!strcmp(line, want))
                n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

/* 2 CPU towers of one thread in a process that may run on 2 cores: with
 * TP_PIN_TOWERS=1 each tower's thread runs on a core of its own (the
 * first and the second allowed), unset none is pinned; on 3 allowed
 * cores (more cores than towers) none either. */
Test(input_stats, towers_pin_their_threads_to_their_cores_only_when_asked) {
    cpu_set_t all, two;
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    if (CPU_COUNT(&all) < 2)
        cr_skip_test("one core allowed");
    CPU_ZERO(&two);
    int cpu[3], k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < 3; c++)
        if (CPU_ISSET(c, &all))
            cpu[k++] = c;
    CPU_SET(cpu[0], &two);
    CPU_SET(cpu[1], &two);
    cr_assert_eq(sched_setaffinity(0, sizeof two, &two), 0);
    tp_model_t *m = s_two_towers_model();
    for (int pin = 1; pin >= 0; pin--) {
        if (pin)
            setenv("TP_PIN_TOWERS", "1", 1);
        else
            unsetenv("TP_PIN_TOWERS");
        tp_towers_t *tw = tp_towers_new(m, 2, TP_RUN_TRAIN, NULL);
        cr_assert_not_null(tw, "%s", tp_last_error());
        /* the threads pin themselves as they start, and the last round's
         * end a moment after their actors are destroyed: give both time */
        int on0 = 0, on1 = 0;
        for (int tries = 0; tries < 200; tries++) {
            on0 = s_threads_on(cpu[0]);
            on1 = s_threads_on(cpu[1]);
            if (on0 == pin && on1 == pin)
                break;
            usleep(5000);
        }
        cr_expect_eq(on0, pin, "TP_PIN_TOWERS %s: %d threads on cpu %d alone",
                     pin ? "1" : "unset", on0, cpu[0]);
        cr_expect_eq(on1, pin, "TP_PIN_TOWERS %s: %d threads on cpu %d alone",
                     pin ? "1" : "unset", on1, cpu[1]);
        tp_towers_destroy(&tw);
    }
    if (k == 3) { /* 3 cores for 2 towers: no pinning */
        CPU_SET(cpu[2], &two);
        cr_assert_eq(sched_setaffinity(0, sizeof two, &two), 0);
        setenv("TP_PIN_TOWERS", "1", 1);
        tp_towers_t *tw = tp_towers_new(m, 2, TP_RUN_TRAIN, NULL);
        cr_assert_not_null(tw, "%s", tp_last_error());
        usleep(100000);
        cr_expect_eq(s_threads_on(cpu[0]) + s_threads_on(cpu[1]) + s_threads_on(cpu[2]), 0,
                     "3 cores, 2 towers: none pinned");
        tp_towers_destroy(&tw);
    }
    unsetenv("TP_PIN_TOWERS");
    cr_assert_eq(sched_setaffinity(0, sizeof all, &all), 0);
    tp_model_destroy(&m);
}
