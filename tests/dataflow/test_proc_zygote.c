/* towerpack tests: the zygote of the process-parallel dataflows. Workers
 * are forked by the zygote, not by the (multi-threaded) test process; a
 * worker killed with SIGKILL is replaced by the zygote with the stream a
 * direct fork would have had, counted (also through wrappers), and data
 * goes on; a dead zygote fails next() and leaves no process; destroy
 * reaps everything. */
#include <criterion/criterion.h>
#include "actor_testutil.h"
#include "proc_testutil.h"

TestSuite(proc_zygote, .timeout = 60);

/* The parent pid of pid (from /proc), -1 when gone. */
static int s_ppid(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    int ppid = -1;
    if (!p || sscanf(p + 2, "%*c %d", &ppid) != 1)
        return -1;
    return ppid;
}

static tp_mp_opts_t s_opts(tp_worker_policy_t policy) {
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.policy = policy;
    o.timeout_s = 10;
    o.allow_threads = 1;  /* Criterion's own thread */
    return o;
}

/* The stream a datapoint of tu_count_df came from. */
static uint64_t s_stream(tp_datapoint_t *dp) { return (uint64_t)(tu_value(dp) / 1000000); }

Test(proc_zygote, killed_worker_is_replaced_by_the_zygote) {
    tp_mp_opts_t o = s_opts(TP_WORKER_RESTART);
    tp_dataflow_t *mp = tp_df_multiprocess(tu_count_df(1000000, 0, -1), 2, &o);
    cr_assert(mp, "%s", tp_last_error());
    /* nested, as in `... | processes 2 | batch 32`: counted through it */
    tp_dataflow_t *df = tp_df_repeat(mp, -1);
    cr_assert_eq(tp_df_multiprocess_restarts(df), -1, "not known before reset_state");
    pu_assert_fork_safe("killed_worker_is_replaced_by_the_zygote");
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_df_multiprocess_restarts(df), 0);
    int zygote = tp_df_multiprocess_zygote(mp);
    cr_assert(zygote > 0 && zygote != getpid());
    cr_assert_eq(s_ppid(zygote), getpid(), "the zygote is our child");
    int pids[2];
    cr_assert_eq(tp_df_multiprocess_pids(mp, pids, 2), 2);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(s_ppid(pids[i]), zygote, "worker %d forked by the zygote", i);
    tp_datapoint_t *dp;
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    /* By now this process runs ZeroMQ's I/O thread: a fork from here is the
     * hazard the zygote avoids. */
    char zmq[64];
    cr_assert(pu_zmq_thread(zmq, sizeof zmq)[0], "the parent is multi-threaded now");
    cr_assert_eq(kill(pids[0], SIGKILL), 0);
    double t0 = tp_now_s();
    while (tp_df_multiprocess_restarts(df) == 0 && tp_now_s() - t0 < 5) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(tp_df_multiprocess_restarts(df), 1, "the restart is counted");
    cr_assert_lt(tp_now_s() - t0, 1.5, "seen within a second or so");
    int now[2];
    cr_assert_eq(tp_df_multiprocess_pids(mp, now, 2), 2);
    cr_assert(now[0] != pids[0] && now[1] == pids[1]);
    cr_assert_eq(s_ppid(now[0]), zygote, "the replacement comes from the zygote");
    /* Data goes on, and the replacement draws the stream a direct fork of
     * slot 0's second start would have: gen 1 x 2 workers + slot 0 + 1. */
    int seen_new = 0;
    t0 = tp_now_s();
    while (!seen_new && tp_now_s() - t0 < 10) {  /* it starts while the other runs */
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        uint64_t s = s_stream(dp);
        cr_assert(s >= 1 && s <= 3, "stream %llu", (unsigned long long)s);
        seen_new = s == 3;
        tp_datapoint_destroy(&dp);
    }
    cr_assert(seen_new, "no datapoint from the replacement (stream 3)");
    /* The workers' rows for tp-top (through the wrapper): one per slot,
     * each with its current process; the restart counted on slot 0; what
     * they sent, as they reported it (at most what was sent: the reports
     * lag by up to half a second, and the queue holds some). */
    tp_stats_row_t rows[4];
    cr_assert_eq(tp_df_multiprocess_rows(df, rows, 4), 2);
    cr_assert_str_eq(rows[0].name, "dataflow worker 0");
    cr_assert_str_eq(rows[1].name, "dataflow worker 1");
    cr_assert_eq(rows[0].pid, (uint32_t)now[0], "slot 0 shows its replacement");
    cr_assert_eq(rows[1].pid, (uint32_t)now[1]);
    cr_assert_eq(rows[0].restarts, 1);
    cr_assert_eq(rows[1].restarts, 0);
    cr_assert_gt(rows[0].msgs_out + rows[1].msgs_out, 0, "no report arrived");
    cr_assert_gt(rows[1].bytes_out, rows[1].msgs_out * 8, "wire bytes: %llu",
                 (unsigned long long)rows[1].bytes_out);
    tp_dataflow_destroy(&df);
    cr_assert(pu_wait_gone(now[0], 1000) && pu_wait_gone(now[1], 1000));
    /* The zygote was reaped by us: not even a zombie is left. */
    cr_assert_eq(waitpid(zygote, NULL, WNOHANG), -1);
    cr_assert_eq(errno, ECHILD);
}

static tp_status_t s_triple(void *arg, tp_datapoint_t **dp) {
    (void)arg;
    int64_t *v = tp_datapoint_get(*dp, 0)->data;
    *v *= 3;
    return TP_OK;
}

Test(proc_zygote, map_worker_replaced_by_the_zygote_keeps_strict_exact) {
    tp_mp_opts_t o = s_opts(TP_WORKER_RESTART);
    tp_dataflow_t *df = tp_df_multiprocess_map(tu_count_df(3000, 0, -1), 2, s_triple,
                                               NULL, 1, &o);
    cr_assert(df, "%s", tp_last_error());
    pu_assert_fork_safe("map_worker_replaced_by_the_zygote_keeps_strict_exact");
    cr_assert_eq(tp_dataflow_reset_state(df, 7, 0), TP_OK, "%s", tp_last_error());
    int zygote = tp_df_multiprocess_zygote(df);
    int pids[2];
    cr_assert_eq(tp_df_multiprocess_pids(df, pids, 2), 2);
    tp_datapoint_t *dp;
    tp_status_t rc;
    int64_t i = 0;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
        cr_assert_eq(tu_value(dp), 3 * i);
        tp_datapoint_destroy(&dp);
        if (++i == 500)
            kill(pids[1], SIGKILL);
        /* the restart is seen while the pass goes on */
    }
    cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
    cr_assert_eq(i, 3000, "exactly one pass despite the kill");
    /* The pass can end before the death is seen (next() looks at most
     * every 100 ms, and the other worker may have done everything left):
     * the next passes' calls see it, within a bound. Passes, not a pass:
     * one of 3000 small datapoints can end inside next()'s 100 ms, and a
     * loop that stopped at its TP_DONE missed the death (a CI run, 2
     * loaded cores); the call after TP_DONE starts the next pass. */
    double t0 = tp_now_s();
    while (tp_df_multiprocess_restarts(df) == 0 && tp_now_s() - t0 < 5 &&
           (rc = tp_dataflow_next(df, &dp)) >= 0)
        if (rc == TP_OK)
            tp_datapoint_destroy(&dp);
    cr_assert_eq(tp_df_multiprocess_restarts(df), 1);
    int now[2];
    cr_assert_eq(tp_df_multiprocess_pids(df, now, 2), 2);
    cr_assert(now[1] != pids[1]);
    cr_assert_eq(s_ppid(now[1]), zygote, "the replacement comes from the zygote");
    tp_dataflow_destroy(&df);
    cr_assert(pu_wait_gone(now[0], 1000) && pu_wait_gone(now[1], 1000));
}

Test(proc_zygote, restarts_of_a_chain_without_workers) {
    tp_dataflow_t *df = tp_df_repeat(tu_count_df(10, 0, -1), 2);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_df_multiprocess_restarts(df), -1);
    cr_assert_eq(tp_df_multiprocess_zygote(df), 0);
    tp_stats_row_t rows[2];
    cr_assert_eq(tp_df_multiprocess_rows(df, rows, 2), 0, "no workers, no rows");
    tp_dataflow_destroy(&df);
}

/* A counting source over n workers forked by a zygote (policy), past its
 * first datapoint; the zygote's pid and the workers' in pids[n]. `who`:
 * the test, named if a ZeroMQ thread makes forking unsafe. */
static tp_dataflow_t *s_started(tp_worker_policy_t policy, int n, const char *who,
                                int *zygote, int *pids) {
    tp_mp_opts_t o = s_opts(policy);
    tp_dataflow_t *df = tp_df_multiprocess(tu_count_df(1000000, 0, -1), n, &o);
    pu_assert_fork_safe(who);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK, "%s", tp_last_error());
    *zygote = tp_df_multiprocess_zygote(df);
    cr_assert_eq(tp_df_multiprocess_pids(df, pids, n), n);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    tp_datapoint_destroy(&dp);
    return df;
}

Test(proc_zygote, dead_zygote_fails_next_and_leaves_nothing) {
    int zygote, pids[2];
    tp_dataflow_t *df = s_started(TP_WORKER_RESTART, 2, "dead_zygote_fails_next_and_leaves_nothing",
                                  &zygote, pids);
    tp_datapoint_t *dp;
    cr_assert_eq(kill(zygote, SIGKILL), 0);
    /* The workers die with it (PR_SET_PDEATHSIG) ... */
    for (int i = 0; i < 2; i++)
        cr_assert(pu_wait_gone(pids[i], 2000), "worker %d outlived the zygote", pids[i]);
    /* ... and next() says so (a restart policy cannot help: no zygote). */
    double t0 = tp_now_s();
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK)
        tp_datapoint_destroy(&dp);
    cr_assert_lt(tp_now_s() - t0, 2.0);
    cr_assert_eq(rc, TP_ERR_PEER, "%d: %s", rc, tp_last_error());
    char want[96];
    snprintf(want, sizeof want, "zygote (pid %d)", zygote);
    cr_assert(strstr(tp_last_error(), want) && strstr(tp_last_error(), "signal 9"), "%s",
              tp_last_error());
    t0 = tp_now_s();
    tp_dataflow_destroy(&df);
    cr_assert_lt(tp_now_s() - t0, 1.0, "destroy does not wait for what is gone");
    cr_assert_eq(waitpid(zygote, NULL, WNOHANG), -1, "the zygote was reaped");
}

Test(proc_zygote, destroy_stops_workers_and_zygote) {
    int zygote, pids[3];
    tp_dataflow_t *df = s_started(TP_WORKER_FAIL, 3, "destroy_stops_workers_and_zygote",
                                  &zygote, pids);
    double t0 = tp_now_s();
    tp_dataflow_destroy(&df);
    cr_assert_lt(tp_now_s() - t0, 1.5, "bounded stop");
    for (int i = 0; i < 3; i++)
        cr_assert(pu_gone(pids[i]), "worker %d left", pids[i]);
    cr_assert_eq(waitpid(zygote, NULL, WNOHANG), -1, "the zygote was reaped");
    cr_assert_eq(errno, ECHILD);
}
