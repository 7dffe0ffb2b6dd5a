/* towerpack tests: MultiProcessMapDataZMQ (tp_df_multiprocess_map): strict
 * order and exactly one pass, non-strict counts, filtering, map errors, a
 * worker SIGKILLed under each policy (strict stays exact on restart). */
#include <criterion/criterion.h>
#include "actor_testutil.h"
#include "proc_testutil.h"

/* value -> 3 * value; drops odd values when arg says so; fails on 77 when
 * arg says so. */
typedef struct {
    int drop_odd;
    int fail_on_77;
} mapcfg_t;

static tp_status_t triple(void *arg, tp_datapoint_t **dp) {
    const mapcfg_t *cfg = arg;
    int64_t *v = tp_datapoint_get(*dp, 0)->data;
    if (cfg && cfg->fail_on_77 && *v == 77)
        return tp_error(TP_ERR_SHAPE, "triple: refusing value 77");
    if (cfg && cfg->drop_odd && (*v & 1)) {
        tp_datapoint_destroy(dp);
        return TP_OK;
    }
    *v *= 3;
    return TP_OK;
}

static tp_dataflow_t *make_map(int64_t n, int strict, tp_worker_policy_t policy,
                               mapcfg_t *cfg, int buffer) {
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.policy = policy;
    o.timeout_s = 10;
    o.allow_threads = 1;  /* Criterion's own thread */
    if (buffer)
        o.buffer_size = buffer;
    tp_dataflow_t *df = tp_df_multiprocess_map(tu_count_df(n, 0, -1), 2, triple,
                                               cfg, strict, &o);
    cr_assert(df, "%s", tp_last_error());
    pu_assert_fork_safe("make_map");  /* the check allow_threads turned off */
    cr_assert_eq(tp_dataflow_reset_state(df, 7, 0), TP_OK, "%s", tp_last_error());
    return df;
}

Test(proc_map, strict_is_ordered_and_exactly_one_pass) {
    tp_dataflow_t *df = make_map(500, 1, TP_WORKER_FAIL, NULL, 16);
    for (int pass = 0; pass < 2; pass++) {
        tp_datapoint_t *dp;
        tp_status_t rc;
        int64_t i = 0;
        while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
            cr_assert_eq(tu_value(dp), 3 * i, "pass %d item %lld", pass, (long long)i);
            tp_datapoint_destroy(&dp);
            i++;
        }
        cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
        cr_assert_eq(i, 500);
    }
    tp_dataflow_destroy(&df);
}

Test(proc_map, non_strict_counts) {
    tp_dataflow_t *df = make_map(300, 0, TP_WORKER_FAIL, NULL, 0);
    for (int pass = 0; pass < 2; pass++) {
        tp_datapoint_t *dp;
        tp_status_t rc;
        int64_t n = 0;
        while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
            int64_t v = tu_value(dp);
            cr_assert(v % 3 == 0 && v / 3 < 300);
            tp_datapoint_destroy(&dp);
            n++;
        }
        cr_assert_eq(rc, TP_DONE);
        cr_assert_eq(n, 300);
    }
    tp_dataflow_destroy(&df);
}

Test(proc_map, strict_filter_keeps_order) {
    mapcfg_t cfg = {1, 0};
    tp_dataflow_t *df = make_map(101, 1, TP_WORKER_FAIL, &cfg, 8);
    tp_datapoint_t *dp;
    int64_t i = 0;
    while (tp_dataflow_next(df, &dp) == TP_OK) {
        cr_assert_eq(tu_value(dp), 3 * 2 * i);
        tp_datapoint_destroy(&dp);
        i++;
    }
    cr_assert_eq(i, 51);
    tp_dataflow_destroy(&df);
}

Test(proc_map, map_error_reaches_parent) {
    mapcfg_t cfg = {0, 1};
    tp_dataflow_t *df = make_map(200, 1, TP_WORKER_FAIL, &cfg, 0);
    tp_datapoint_t *dp;
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK)
        tp_datapoint_destroy(&dp);
    cr_assert_eq(rc, TP_ERR_PEER, "status %d: %s", rc, tp_last_error());
    cr_assert(strstr(tp_last_error(), "refusing value 77"), "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "datapoint 77"), "%s", tp_last_error());
    tp_dataflow_destroy(&df);
}

Test(proc_map, killed_worker_fail_policy) {
    tp_dataflow_t *df = make_map(100000, 1, TP_WORKER_FAIL, NULL, 0);
    tp_datapoint_t *dp;
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        tp_datapoint_destroy(&dp);
    }
    int pids[2];
    cr_assert_eq(tp_df_multiprocess_pids(df, pids, 2), 2);
    kill(pids[0], SIGKILL);
    double t0 = tp_now_s();
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK)
        tp_datapoint_destroy(&dp);
    cr_assert_lt(tp_now_s() - t0, 1.0);
    cr_assert_eq(rc, TP_ERR_PEER);
    cr_assert(strstr(tp_last_error(), "worker 0") &&
              strstr(tp_last_error(), "killed by signal 9"), "%s", tp_last_error());
    tp_dataflow_destroy(&df);
    cr_assert(pu_wait_gone(pids[1], 1000));
}

Test(proc_map, killed_worker_restart_keeps_strict_exact) {
    tp_dataflow_t *df = make_map(3000, 1, TP_WORKER_RESTART, NULL, 0);
    tp_datapoint_t *dp;
    tp_status_t rc;
    int64_t i = 0;
    int pids[2];
    cr_assert_eq(tp_df_multiprocess_pids(df, pids, 2), 2);
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
        cr_assert_eq(tu_value(dp), 3 * i);
        tp_datapoint_destroy(&dp);
        if (++i == 500) {
            kill(pids[1], SIGKILL);
            usleep(150000);  /* dies while its share is in flight */
        }
    }
    cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
    cr_assert_eq(i, 3000, "exactly one pass despite the kill");
    cr_assert_eq(tp_df_multiprocess_restarts(df), 1);
    tp_dataflow_destroy(&df);
    cr_assert(pu_wait_gone(pids[0], 1000));
}

Test(proc_map, strict_end_pass_starts_a_clean_pass) {
    tp_dataflow_t *df = make_map(100, 1, TP_WORKER_FAIL, NULL, 16);
    tp_datapoint_t *dp;
    for (int i = 0; i < 10; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_end_pass(df);  /* abandon: what is in flight is dropped */
    for (int pass = 0; pass < 2; pass++) {
        int64_t i = 0;
        tp_status_t rc;
        while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
            cr_assert_eq(tu_value(dp), 3 * i);
            tp_datapoint_destroy(&dp);
            i++;
        }
        cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
        cr_assert_eq(i, 100);
    }
    tp_dataflow_destroy(&df);
    cr_assert_eq(atomic_load(&tu_live), 0);
}

/* triple, after 2 ms of CPU: the workers are the slow part. */
static tp_status_t slow_triple(void *arg, tp_datapoint_t **dp) {
    uint64_t t0 = tp_now_ns();
    while (tp_now_ns() - t0 < 2000000)
        ;
    return triple(arg, dp);
}

/* The map's workers report their own time on the results socket: busy in
 * the map function, the rest waiting for tasks or on a full queue; the
 * reports do not disturb strict order, and are not counted as results. */
Test(proc_map, workers_report_their_time_and_strict_stays_exact) {
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.timeout_s = 10;
    o.allow_threads = 1;
    tp_dataflow_t *df = tp_df_multiprocess_map(tu_count_df(1200, 0, -1), 2, slow_triple,
                                               NULL, 1, &o);
    cr_assert(df, "%s", tp_last_error());
    pu_assert_fork_safe("workers_report");
    cr_assert_eq(tp_dataflow_reset_state(df, 7, 0), TP_OK, "%s", tp_last_error());
    tp_datapoint_t *dp;
    tp_status_t rc;
    int64_t i = 0;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {  /* about 1.2 s */
        cr_assert_eq(tu_value(dp), 3 * i, "in order, every one");
        tp_datapoint_destroy(&dp);
        i++;
    }
    cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
    cr_assert_eq(i, 1200);
    tp_stats_row_t rows[4];
    cr_assert_eq(tp_df_multiprocess_rows(df, rows, 4), 2);
    uint64_t made = rows[0].msgs_out + rows[1].msgs_out;
    cr_assert_leq(made, 1200, "%llu results reported sent", (unsigned long long)made);
    /* reports come twice a second: at least two from each worker by now */
    for (int w = 0; w < 2; w++) {
        cr_assert_gt(rows[w].busy_s, 0.1, "worker %d busy %.3f s", w, rows[w].busy_s);
        cr_assert_gt(rows[w].msgs_out, 0, "worker %d sent nothing", w);
    }
    tp_dataflow_destroy(&df);
}
