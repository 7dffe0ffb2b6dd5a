/* towerpack tests: MultiProcessRunnerZMQ (tp_df_multiprocess): counts and
 * streams, worker errors, a worker SIGKILLed under each policy, cleanup,
 * and the fork rule. */
#include <criterion/criterion.h>
#include <pthread.h>
#include "actor_testutil.h"
#include "proc_testutil.h"

static tp_dataflow_t *make_runner(int64_t n, int nworkers, int64_t fail_at,
                                  tp_worker_policy_t policy, const char *dir) {
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.policy = policy;
    o.run_dir = dir;
    o.timeout_s = 10;
    /* Criterion runs a thread of its own in every test process. */
    o.allow_threads = 1;
    tp_dataflow_t *df = tp_df_multiprocess(tu_count_df(n, 0, fail_at), nworkers, &o);
    cr_assert(df, "%s", tp_last_error());
    pu_assert_fork_safe("make_runner");  /* the check allow_threads turned off */
    return df;
}

Test(proc_runner, passes_of_size_n_from_every_worker) {
    char dir[64];
    tu_tmpdir(dir, sizeof dir);
    tp_dataflow_t *df = make_runner(100, 2, -1, TP_WORKER_FAIL, dir);
    cr_assert_eq(tp_dataflow_size(df), 100);
    cr_assert_eq(tp_dataflow_reset_state(df, 42, 0), TP_OK, "%s", tp_last_error());
    int pids[4];
    cr_assert_eq(tp_df_multiprocess_pids(df, pids, 4), 2);
    uint64_t streams[2] = {0, 0};
    int nstreams = 0;
    for (int pass = 0; pass < 2; pass++) {
        int count = 0;
        tp_datapoint_t *dp;
        tp_status_t rc;
        while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
            int64_t v = tu_value(dp);
            cr_assert_lt(v % 1000000, 100);
            uint64_t s = (uint64_t)(v / 1000000);
            int known = 0;
            for (int k = 0; k < nstreams; k++)
                known |= streams[k] == s;
            if (!known && nstreams < 2)
                streams[nstreams++] = s;
            else
                cr_assert(known, "at most one stream per worker");
            tp_datapoint_destroy(&dp);
            count++;
        }
        cr_assert_eq(rc, TP_DONE, "%s", tp_last_error());
        cr_assert_eq(count, 100);
    }
    /* One fast worker may fill the first passes alone: read on until the
     * other shows up (bounded). */
    tp_datapoint_t *dp;
    double t0 = tp_now_s();
    while (nstreams < 2 && tp_now_s() - t0 < 3.0) {
        tp_status_t rc = tp_dataflow_next(df, &dp);
        if (rc == TP_DONE)
            continue;
        cr_assert_eq(rc, TP_OK, "%s", tp_last_error());
        uint64_t st = (uint64_t)(tu_value(dp) / 1000000);
        if (st != streams[0])
            streams[nstreams++] = st;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(nstreams, 2, "each worker has its own RNG stream");
    cr_assert_neq(streams[0], streams[1]);
    tp_dataflow_destroy(&df);
    for (int i = 0; i < 2; i++)
        cr_assert(pu_wait_gone(pids[i], 1000), "worker %d gone", pids[i]);
    cr_assert_eq(pu_dir_entries(dir), 0, "no socket file left");
    rmdir(dir);
}

Test(proc_runner, worker_error_reaches_parent_with_message) {
    tp_dataflow_t *df = make_runner(100, 2, 5, TP_WORKER_FAIL, NULL);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    tp_status_t rc;
    int got = 0;
    double t0 = tp_now_s();
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
        tp_datapoint_destroy(&dp);
        got++;
    }
    cr_assert_eq(rc, TP_ERR_PEER, "%d %s", rc, tp_last_error());
    cr_assert(strstr(tp_last_error(), "planted failure at 5"), "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "worker"), "%s", tp_last_error());
    cr_assert_lt(tp_now_s() - t0, 2.0);
    tp_dataflow_destroy(&df);
}

Test(proc_runner, killed_worker_fails_with_its_signal) {
    tp_dataflow_t *df = make_runner(1000000, 2, -1, TP_WORKER_FAIL, NULL);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    int pids[2];
    cr_assert_eq(tp_df_multiprocess_pids(df, pids, 2), 2);
    kill(pids[1], SIGKILL);
    double t0 = tp_now_s();
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK)
        tp_datapoint_destroy(&dp);
    cr_assert_lt(tp_now_s() - t0, 1.0, "seen within 1 s");
    cr_assert_eq(rc, TP_ERR_PEER);
    char want[64];
    snprintf(want, sizeof want, "worker 1 (pid %d) killed by signal 9", pids[1]);
    cr_assert(strstr(tp_last_error(), want), "%s", tp_last_error());
    tp_dataflow_destroy(&df);
    cr_assert(pu_wait_gone(pids[0], 1000));
}

Test(proc_runner, killed_worker_is_restarted) {
    tp_dataflow_t *df = make_runner(1000000, 2, -1, TP_WORKER_RESTART, NULL);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        tp_datapoint_destroy(&dp);
    }
    int pids[2];
    tp_df_multiprocess_pids(df, pids, 2);
    kill(pids[0], SIGKILL);
    /* Keep reading across the restart; both slots deliver afterwards. */
    double t0 = tp_now_s();
    while (tp_df_multiprocess_restarts(df) == 0 && tp_now_s() - t0 < 2) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(tp_df_multiprocess_restarts(df), 1);
    for (int i = 0; i < 500; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    int now[2];
    cr_assert_eq(tp_df_multiprocess_pids(df, now, 2), 2);
    cr_assert(now[0] != pids[0] && now[1] == pids[1]);
    tp_dataflow_destroy(&df);
    cr_assert(pu_wait_gone(now[0], 1000) && pu_wait_gone(now[1], 1000));
}

static void *idle_thread(void *arg) {
    (void)arg;
    usleep(300000);
    return NULL;
}

Test(proc_runner, refuses_to_fork_with_threads_running) {
    pthread_t t;
    pthread_create(&t, NULL, idle_thread, NULL);
    tp_dataflow_t *df = tp_df_multiprocess(tu_count_df(10, 0, -1), 1, NULL);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "threads"), "%s", tp_last_error());
    tp_dataflow_destroy(&df);
    pthread_join(t, NULL);
}

Test(proc_runner, bad_arguments) {
    cr_assert_null(tp_df_multiprocess(tu_count_df(1, 0, -1), 0, NULL));
    cr_assert(strstr(tp_last_error(), "0 workers"), "%s", tp_last_error());
    cr_assert_null(tp_df_multiprocess(NULL, 2, NULL));
}

/* A dataflow that spins 2 ms of CPU per datapoint: its workers are busy.
 * 64 KB a datapoint, so that the socket buffers between a worker and its
 * parent fill within a few of them once the parent stops taking (a tiny
 * datapoint would fill them only after hundreds). */
static tp_status_t spin_next(void *impl, tp_datapoint_t **out) {
    (void)impl;
    uint64_t t0 = tp_now_ns();
    while (tp_now_ns() - t0 < 2000000)
        ;
    int64_t one[] = {16384};
    *out = tp_datapoint_new(1);
    tp_tensor_init_zero(tp_datapoint_get(*out, 0), TP_INT32, 1, one);
    return TP_OK;
}
static int64_t spin_size(void *impl) { (void)impl; return -1; }
static const tp_dataflow_ops_t s_spin_ops = {.name = "spin", .next = spin_next,
                                             .size = spin_size};

/* The per-worker rows (tp_df_multiprocess_rows) summed: what the two
 * workers reported. */
static void s_rows_sum(tp_dataflow_t *df, tp_stats_row_t *sum) {
    tp_stats_row_t rows[4];
    int n = tp_df_multiprocess_rows(df, rows, 4);
    cr_assert_eq(n, 2);
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < n; i++) {
        cr_assert_gt(rows[i].pid, 0, "worker %d's process", i);
        sum->msgs_out += rows[i].msgs_out;
        sum->busy_s += rows[i].busy_s / n;
        sum->blocked_s += rows[i].blocked_s / n;
    }
}

/* The workers report their own time on the data socket: their rows show
 * them busy while the consumer keeps up, and blocked once it stops taking
 * (their queues full); the reports are not datapoints. */
Test(proc_runner, workers_report_their_busy_and_blocked_time) {
    char dir[64];
    tu_tmpdir(dir, sizeof dir);
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.run_dir = dir;
    o.timeout_s = 10;
    o.hwm = 4;
    o.allow_threads = 1;
    tp_dataflow_t *df = tp_df_multiprocess(tp_dataflow_new(&s_spin_ops, NULL), 2, &o);
    cr_assert(df, "%s", tp_last_error());
    pu_assert_fork_safe("workers_report");
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK, "%s", tp_last_error());
    tp_datapoint_t *dp;
    tp_stats_row_t row;
    double t0 = tp_now_s();
    int taken = 0;
    do {  /* about 1 s of data: each worker reports twice a second */
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_datapoint_size(dp), 1, "a report delivered as a datapoint");
        tp_datapoint_destroy(&dp);
        taken++;
        s_rows_sum(df, &row);
    } while (row.busy_s < 0.3 && tp_now_s() - t0 < 10);
    cr_assert_geq(row.busy_s, 0.3, "busy %.3f s per worker after %d datapoints", row.busy_s,
                  taken);
    cr_assert_gt(row.msgs_out, 0);
    double blocked0 = row.blocked_s;
    usleep(1500000);  /* the consumer stops: the workers' sends wait */
    t0 = tp_now_s();
    do {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
        taken++;
        s_rows_sum(df, &row);
    } while (row.blocked_s - blocked0 < 0.5 && tp_now_s() - t0 < 10);
    cr_assert_geq(row.blocked_s - blocked0, 0.5, "blocked %.3f s more per worker",
                  row.blocked_s - blocked0);
    /* what they reported sending: at least what was taken before the last
     * report, at most what was taken plus what the queues hold */
    cr_assert_leq(row.msgs_out, (uint64_t)taken + 2 * (4 + 4) + 2,
                  "%llu reported for %d taken", (unsigned long long)row.msgs_out, taken);
    tp_dataflow_destroy(&df);
    rmdir(dir);
}
