/* towerpack tests: process lifetimes. A parent SIGKILLed takes its workers
 * with it (no orphan after 1 s); SIGINT ends a consumer cleanly within 2 s
 * with no process and no socket file left. */
#include <criterion/criterion.h>
#include "actor_testutil.h"
#include "proc_testutil.h"

/* In a child: a runner with 2 workers; report the worker pids on fd, then
 * consume until interrupted. Exit 0 on a clean interrupted end. */
static void consumer(int fd, const char *dir, int spin_forever) {
    tp_signals_install();
    tp_mp_opts_t o;
    tp_mp_opts_init(&o);
    o.run_dir = dir;
    o.allow_threads = 1;
    tp_dataflow_t *df = tp_df_multiprocess(tu_count_df(1000000, 1024, -1), 2, &o);
    pu_assert_fork_safe("consumer");
    if (!df || tp_dataflow_reset_state(df, 1, 0) != TP_OK)
        _exit(10);
    int pids[2];
    tp_df_multiprocess_pids(df, pids, 2);
    if (write(fd, pids, sizeof pids) != sizeof pids)
        _exit(11);
    tp_status_t rc;
    tp_datapoint_t *dp;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK || spin_forever) {
        tp_datapoint_destroy(&dp);
        usleep(1000);
    }
    tp_dataflow_destroy(&df);
    _exit(rc == TP_ERR_INTERRUPTED ? 0 : 12);
}

/* consumer() forked in dir; its pid, and its two workers' in pids once
 * it has reported them (its runner is up). */
static pid_t s_start_consumer(const char *dir, int spin_forever, int pids[2]) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t parent = pu_fork();
    if (parent == 0) {
        close(fds[0]);
        consumer(fds[1], dir, spin_forever);
    }
    close(fds[1]);
    cr_assert_eq(read(fds[0], pids, 2 * sizeof *pids), (ssize_t)(2 * sizeof *pids));
    close(fds[0]);
    return parent;
}

Test(proc_signals, parent_sigkill_leaves_no_orphan) {
    char dir[64];
    tu_tmpdir(dir, sizeof dir);
    int pids[2];
    pid_t parent = s_start_consumer(dir, 1, pids);
    usleep(100000);
    cr_assert(!pu_gone(pids[0]) && !pu_gone(pids[1]));
    kill(parent, SIGKILL);
    pu_waitpid(parent, 1000);
    cr_assert(pu_wait_gone(pids[0], 1000), "worker %d outlived its parent", pids[0]);
    cr_assert(pu_wait_gone(pids[1], 1000), "worker %d outlived its parent", pids[1]);
    /* A SIGKILLed parent cannot clean up: its socket file stays behind. */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(proc_signals, sigint_exits_cleanly_within_2s) {
    char dir[64];
    tu_tmpdir(dir, sizeof dir);
    int pids[2];
    pid_t parent = s_start_consumer(dir, 0, pids);
    usleep(200000);
    double t0 = tp_now_s();
    kill(parent, SIGINT);
    int st = pu_waitpid(parent, 2000);
    cr_assert_lt(tp_now_s() - t0, 2.0);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
    cr_assert(pu_wait_gone(pids[0], 100) && pu_wait_gone(pids[1], 100));
    cr_assert_eq(pu_dir_entries(dir), 0, "no socket file left");
    rmdir(dir);
}
