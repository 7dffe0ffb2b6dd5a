/* towerpack tests: remote dataflows (tp_send_dataflow in another process,
 * tp_df_remote here): order and counts, several endpoints, lz4, a peer
 * sending garbage, bounded waits, connections closing in any order. */
#include <criterion/criterion.h>
#include <czmq.h>
#include "actor_testutil.h"
#include "dataflow/remote_testutil.h"
#include "proc_testutil.h"
#include "fault_util.h" /* fu_rss_kib, fu_slurp */

Test(proc_remote, one_sender_in_order) {
    char dir[64], ep[128];
    tu_tmpdir(dir, sizeof dir);
    snprintf(ep, sizeof ep, "ipc://%s/r.sock", dir);
    pu_gate_t bound;
    pu_gate_init(&bound);
    int pid = ru_fork_sender(ep, 1000, 0, 4096, 0, 0, &bound);
    tp_dataflow_t *df = ru_remote(ep, 5);
    pu_gate_open(&bound, 1);
    pu_gate_fini(&bound);
    cr_assert_eq(tp_dataflow_size(df), -1);
    for (int64_t i = 0; i < 1000; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tu_value(dp), i);
        cr_assert_eq(tp_datapoint_cget(dp, 1)->nbytes, 4096);
        tp_datapoint_destroy(&dp);
    }
    int st = pu_waitpid(pid, 3000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sender status %d", st);
    tp_dataflow_destroy(&df);
    cr_assert_eq(pu_dir_entries(dir), 0, "socket file removed");
    rmdir(dir);
}

Test(proc_remote, two_endpoints_with_lz4) {
    char dir[64], eps[300];
    tu_tmpdir(dir, sizeof dir);
    snprintf(eps, sizeof eps, "ipc://%s/a.sock,ipc://%s/b.sock", dir, dir);
    char a[140], b[140];
    snprintf(a, sizeof a, "ipc://%s/a.sock", dir);
    snprintf(b, sizeof b, "ipc://%s/b.sock", dir);
    pu_gate_t bound;
    pu_gate_init(&bound);
    int pa = ru_fork_sender(a, 300, 1, 8192, 1, 0, &bound);
    int pb = ru_fork_sender(b, 300, 2, 8192, 1, 0, &bound);
    tp_dataflow_t *df = ru_remote(eps, 5);
    pu_gate_open(&bound, 2);
    pu_gate_fini(&bound);
    int64_t next[3] = {0, 0, 0};
    for (int i = 0; i < 600; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        int64_t v = tu_value(dp);
        int s = (int)(v / 1000000);
        cr_assert(s == 1 || s == 2);
        cr_assert_eq(v % 1000000, next[s], "per-sender order");
        next[s]++;
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(next[1], 300);
    cr_assert_eq(next[2], 300);
    pu_waitpid(pa, 3000);
    pu_waitpid(pb, 3000);
    tp_dataflow_destroy(&df);
    cr_assert_eq(pu_dir_entries(dir), 0);
    rmdir(dir);
}

Test(proc_remote, garbage_is_counted_and_dropped) {
    char dir[64], ep[128];
    tu_tmpdir(dir, sizeof dir);
    snprintf(ep, sizeof ep, "ipc://%s/g.sock", dir);
    pu_gate_t bound;
    pu_gate_init(&bound);
    pid_t pid = pu_fork();
    if (pid == 0) {
        pu_gate_wait(&bound);
        void *ctx, *push = ru_push_connect(ep, &ctx);
        zmq_send(push, "x", 1, 0);
        uint8_t hdr[16] = {'T', 'P', 'W', '1', 1, 0, 200, 0};
        zmq_send(push, hdr, sizeof hdr, 0);         /* claims 200 components */
        zmq_send(push, hdr, 8, ZMQ_SNDMORE);
        zmq_send(push, "junk", 4, 0);
        for (int i = 0; i < 2000; i++)               /* too many frames */
            zmq_send(push, "", 0, i < 1999 ? ZMQ_SNDMORE : 0);
        ru_push_last_and_exit(ctx, push, 41, 0);
    }
    tp_dataflow_t *df = ru_remote(ep, 5);
    pu_gate_open(&bound, 1);
    pu_gate_fini(&bound);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tu_value(dp), 41);
    tp_datapoint_destroy(&dp);
    cr_assert_eq(tp_df_remote_malformed(df), 4);
    pu_waitpid(pid, 3000);
    tp_dataflow_destroy(&df);
    rmdir(dir);
}

/* A sender's pace: a datapoint every 2 ms, so that one of 10000 outlasts
 * the case below by seconds, and then ends. */
static tp_status_t s_pace(tp_datapoint_t **dp, tp_rng_t *rng, void *user) {
    (void)dp, (void)rng, (void)user;
    usleep(2000);
    return TP_OK;
}

/* Fork a paced sender of n datapoints with `pad` bytes that binds ep once
 * `gate` opens; it exits when all went. Bound, it sends whatever it has
 * (a sender that connects reads the receiver's expectations in the
 * handshake and ends at its first datapoint that does not fit). */
static pid_t s_fork_bound_paced_sender(const char *ep, int64_t n, size_t pad, pu_gate_t *gate) {
    pid_t pid = pu_fork();
    if (pid == 0) {
        pu_gate_wait(gate);
        tp_dataflow_t *df = tp_df_map(tu_count_df(n, pad, -1), s_pace, NULL, NULL);
        tp_send_opts_t o;
        tp_send_opts_init(&o);
        o.max_count = n;
        o.bind = 1;
        o.linger_s = 0;
        tp_status_t rc = tp_send_dataflow(df, ep, &o, NULL);
        tp_dataflow_destroy(&df);
        _exit(rc == TP_OK ? 0 : 3);
    }
    return pid;
}

/* Must hold: the receiver knows which connections are open, whatever order
 * they close in. A sender that fits connects first, two that do not fit
 * after it; it is killed while they go on. Its connection leaves the
 * receiver's list, no connection that may fit is left, and next() ends
 * (TP_ERR_SHAPE, "no sender left sends datapoints that fit") within the
 * grace, long before they stop. (A list that dropped the wrong entry at
 * that close kept the killed sender as one that fits: next() went on
 * until they ended and then timed out.) */
Test(proc_remote, a_closed_connection_leaves_the_list_whatever_its_place) {
    char dir[64], ep[3][128], eps[400], said[256];
    tu_tmpdir(dir, sizeof dir);
    for (int i = 0; i < 3; i++)
        snprintf(ep[i], sizeof ep[i], "ipc://%s/%d.sock", dir, i);
    /* the receiver binds the first, the senders that do not fit the others */
    snprintf(eps, sizeof eps, "@%s,>%s,>%s", ep[0], ep[1], ep[2]);
    pu_gate_t first, then;
    pu_gate_init(&first);
    pu_gate_init(&then);
    pid_t fits = ru_fork_sender(ep[0], 1000000000, 0, 0, 0, 0, &first);
    pid_t unfit[2] = {s_fork_bound_paced_sender(ep[1], 10000, 8, &then),
                      s_fork_bound_paced_sender(ep[2], 10000, 8, &then)};
    tp_remote_expect_t e = {.name = "value", .dtype = TP_INT64, .ndim = 0};
    tp_dataflow_t *df = ru_remote_expecting(eps, 3, &e, 1, 0.3);
    pu_gate_open(&first, 1);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    tp_datapoint_destroy(&dp);
    /* the fitting sender's connection is the first in the list; the
     * others join it while its datapoints still come */
    pu_gate_open(&then, 2);
    double t0 = tp_now_s();
    do {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
        tp_df_remote_describe(df, said, sizeof said);
    } while ((!strstr(said, "3 senders connected") || tp_df_remote_unfit(df) < 2) &&
             tp_now_s() - t0 < 10);
    cr_assert(strstr(said, "3 senders connected"), "%s", said);
    cr_assert_geq(tp_df_remote_unfit(df), 2);
    kill(fits, SIGKILL);
    pu_waitpid(fits, 5000);
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK)  /* what it had sent */
        tp_datapoint_destroy(&dp);
    cr_assert_eq(rc, TP_ERR_SHAPE, "%d: %s", rc, tp_last_error());
    cr_assert(strstr(tp_last_error(), "no sender left sends datapoints that fit") &&
                  strstr(tp_last_error(), "2 senders connected"),
              "%s", tp_last_error());
    for (int i = 0; i < 2; i++) {
        kill(unfit[i], SIGKILL);
        pu_waitpid(unfit[i], 5000);
        unlink(ep[i + 1] + 6);  /* the killed sender's socket file */
    }
    pu_gate_fini(&first);
    pu_gate_fini(&then);
    tp_dataflow_destroy(&df);
    cr_assert_eq(pu_dir_entries(dir), 0);
    rmdir(dir);
}

Test(proc_remote, stopped_reader_bounds_the_sender) {
    char dir[64], ep[128];
    tu_tmpdir(dir, sizeof dir);
    snprintf(ep, sizeof ep, "ipc://%s/slow.sock", dir);
    /* An endless sender of 256 KiB datapoints; we read 5 and stop. */
    pu_gate_t bound;
    pu_gate_init(&bound);
    int pid = ru_fork_sender(ep, 1000000000, 0, 256 * 1024, 0, 0, &bound);
    tp_dataflow_t *df = ru_remote(ep, 5);
    pu_gate_open(&bound, 1);
    pu_gate_fini(&bound);
    tp_datapoint_t *dp;
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    long first = fu_rss_kib(pid);
    usleep(800000);
    long later = fu_rss_kib(pid);
    /* hwm 50 x 256 KiB = 12.5 MiB at most queued, plus the kernel's buffers:
     * the sender must not keep growing while nobody reads. */
    cr_assert_gt(later, 0);
    cr_assert_lt(later, 80 * 1024, "sender RSS %ld KiB", later);
    cr_assert_lt(later - first, 32 * 1024, "sender grew from %ld to %ld KiB", first, later);
    kill(pid, SIGKILL);
    pu_waitpid(pid, 2000);
    tp_dataflow_destroy(&df);
    rmdir(dir);
}

Test(proc_remote, silent_peer_times_out) {
    char dir[64], ep[128];
    tu_tmpdir(dir, sizeof dir);
    snprintf(ep, sizeof ep, "ipc://%s/s.sock", dir);
    tp_dataflow_t *df = ru_remote(ep, 0.3);
    double t0 = tp_now_s();
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_ERR_TIMEOUT);
    cr_assert_lt(tp_now_s() - t0, 1.0);
    cr_assert(strstr(tp_last_error(), ep), "%s", tp_last_error());
    tp_dataflow_destroy(&df);
    rmdir(dir);
}

Test(proc_remote, connect_prefix_and_bound_sender) {
    char dir[64], ep[128], conn[140];
    tu_tmpdir(dir, sizeof dir);
    snprintf(ep, sizeof ep, "ipc://%s/c.sock", dir);
    snprintf(conn, sizeof conn, ">%s", ep);
    pid_t pid = pu_fork();
    if (pid == 0) {  /* the sender binds, the remote dataflow connects */
        tp_dataflow_t *df = tu_count_df(50, 0, -1);
        tp_send_opts_t o;
        tp_send_opts_init(&o);
        o.bind = 1;
        o.max_count = 50;
        tp_status_t rc = tp_send_dataflow(df, ep, &o, NULL);
        tp_dataflow_destroy(&df);
        _exit(rc == TP_OK ? 0 : 3);
    }
    tp_dataflow_t *df = ru_remote(conn, 5);
    for (int64_t i = 0; i < 50; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tu_value(dp), i);
        tp_datapoint_destroy(&dp);
    }
    int st = pu_waitpid(pid, 5000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sender status %d", st);
    tp_dataflow_destroy(&df);
    cr_assert_eq(pu_dir_entries(dir), 0);
    rmdir(dir);
}

Test(proc_remote, bad_endpoint_lists) {
    cr_assert_null(tp_df_remote("", NULL));
    cr_assert_null(tp_df_remote("tcp://127.0.0.1:1,,ipc://x", NULL));
    cr_assert(strstr(tp_last_error(), "empty entry"), "%s", tp_last_error());
    cr_assert_null(tp_df_remote("http://x", NULL));
    cr_assert(strstr(tp_last_error(), "http://x"), "%s", tp_last_error());
    tp_dataflow_t *df = tu_count_df(1, 0, -1);
    cr_assert_eq(tp_send_dataflow(df, "nope", NULL, NULL), TP_ERR_INVALID);
    tp_dataflow_destroy(&df);
}

/* Issue 47: a remote: source inside a spec takes what the pipeline was told
 * it must give (tp_df_expect: a trainer's model inputs), through the
 * stages between, and its handshake carries it: per datapoint under a
 * `batch` stage, whole batches without one, nothing after a stage that
 * changes the datapoints (select). */
static void s_spec_comps(const char *dir, const char *name, const char *stages,
                         const char *want) {
    char ep[128], spec[300];
    snprintf(ep, sizeof ep, "ipc://%s/%s.sock", dir, name);
    snprintf(spec, sizeof spec, "remote:@%s%s", ep, stages);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    tp_remote_expect_t e[2] = {{.name = "image", .dtype = TP_UINT8, .ndim = 3,
                                .shape = {4, 28, 28}},
                               {.name = "label", .dtype = TP_INT32, .ndim = 1,
                                .shape = {4}, .bound = 10}};
    cr_assert_eq(tp_df_expect(df, e, 2), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK, "%s", tp_last_error());
    tp_wire_peer_t peer;
    cr_assert_eq(tp_wire_probe_peer(ep, 3000, NULL, &peer), TP_OK, "%s", tp_last_error());
    cr_assert_str_eq(peer.comps, want, "%s: '%s'", spec, peer.comps);
    tp_dataflow_destroy(&df);
}

Test(proc_remote, a_spec_remote_takes_the_pipelines_expectations) {
    tp_actor_spec_register();
    char dir[64];
    tu_tmpdir(dir, sizeof dir);
    s_spec_comps(dir, "a", " | batch 4", "image:uint8[28,28];label:int32[]{0..9}");
    s_spec_comps(dir, "b", " | shuffle 10 | batch 4 | fixed-size 3",
                 "image:uint8[28,28];label:int32[]{0..9}");
    s_spec_comps(dir, "c", "", "image:uint8[4,28,28];label:int32[4]{0..9}");
    s_spec_comps(dir, "d", " | select 0,1 | batch 4", "");
    cr_assert_eq(pu_dir_entries(dir), 0, "socket files removed");
    rmdir(dir);
}

/* Issue 47: the receiver's log named a sender by its report's name and the
 * receiver's first endpoint only ("send 4121@vm joined (on ep0)"), tp-top
 * by its name, pid and host: never where the sender itself was. Its
 * report now says every address it connected to or bound, which the
 * joined line, a dropped datapoint's warning, the error that ends the
 * stream and its tp-top row (where) all carry. */
Test(proc_remote, a_sender_is_named_with_every_address_it_reached_or_bound) {
    char dir[64], ep[128], conn[140], logp[128], log[16384], want[300];
    tu_tmpdir(dir, sizeof dir);
    snprintf(logp, sizeof logp, "%s/log", dir);
    cr_assert_eq(tp_log_set_file(logp), TP_OK);
    tp_log_set_level(TP_LOG_INFO);  /* the joined line (ctest runs at warn) */
    /* a sender that connects: its row and the joined line say where to */
    snprintf(ep, sizeof ep, "ipc://%s/r.sock", dir);
    pu_gate_t bound;
    pu_gate_init(&bound);
    int pid = ru_fork_sender(ep, 2000, 0, 4096, 0, 0, &bound);
    tp_dataflow_t *df = ru_remote(ep, 5);
    pu_gate_open(&bound, 1);
    pu_gate_fini(&bound);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
    tp_datapoint_destroy(&dp);
    tp_stats_row_t rows[4];
    int n = tp_df_remote_rows(df, rows, 4);  /* its report came before its data */
    cr_assert_eq(n, 1);
    snprintf(want, sizeof want, ">%s", ep);
    cr_assert_str_eq(rows[0].where, want);
    cr_assert_eq(rows[0].pid, (uint32_t)pid);
    for (int64_t i = 1; i < 2000; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    int st = pu_waitpid(pid, 5000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sender status %d", st);
    tp_dataflow_destroy(&df);
    fu_slurp(logp, log, sizeof log);
    snprintf(want, sizeof want, "remote: send %d@", pid);
    const char *j = strstr(log, want);
    cr_assert(j, "no line names the sender (%s):\n%s", want, log);
    snprintf(want, sizeof want, "(connected to %s) joined", ep);
    cr_assert(strstr(j, want), "the joined line does not say where it connected (%s):\n%s",
              want, log);

    /* a sender that binds, whose datapoints do not fit: the warning and
     * the error name it with the address it bound */
    snprintf(ep, sizeof ep, "ipc://%s/b.sock", dir);
    snprintf(conn, sizeof conn, ">%s", ep);
    pid = pu_fork();
    if (pid == 0) {
        tp_dataflow_t *src = tu_count_df(100000, 0, -1);
        tp_send_opts_t o;
        tp_send_opts_init(&o);
        o.bind = 1;
        o.linger_s = 0;
        tp_send_dataflow(src, ep, &o, NULL);  /* until killed */
        tp_dataflow_destroy(&src);
        _exit(0);
    }
    tp_remote_expect_t e = {.name = "value", .dtype = TP_FLOAT32, .ndim = 0};
    df = ru_remote_expecting(conn, 10, &e, 1, 0.5);
    tp_status_t rc = tp_dataflow_next(df, &dp);
    cr_assert_eq(rc, TP_ERR_SHAPE, "%d: %s", rc, tp_last_error());
    snprintf(want, sizeof want, "send %d@", pid);
    cr_assert(strstr(tp_last_error(), want), "%s", tp_last_error());
    snprintf(want, sizeof want, "(bound at %s)", ep);
    cr_assert(strstr(tp_last_error(), want), "the error does not say where it bound (%s): %s",
              want, tp_last_error());
    kill(pid, SIGKILL);
    pu_waitpid(pid, 5000);
    unlink(ep + 6);  /* the killed sender's socket file */
    tp_dataflow_destroy(&df);
    fu_slurp(logp, log, sizeof log);
    snprintf(want, sizeof want, "dropped a datapoint from send %d@", pid);
    j = strstr(log, want);
    cr_assert(j, "no warning names the unfit sender (%s):\n%s", want, log);
    snprintf(want, sizeof want, "(bound at %s) (", ep);
    cr_assert(strstr(j, want), "the warning does not say where it bound (%s):\n%s", want,
              log);
    tp_log_set_file(NULL);
    unlink(logp);
    cr_assert_eq(pu_dir_entries(dir), 0, "socket files removed");
    rmdir(dir);
}
