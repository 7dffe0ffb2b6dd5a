/* towerpack tests: the CPU kernels' pool of threads across fork()
 * (gpu/cpu/cpu_pool.c): a child forked after the pool has started gets an
 * empty pool (its workers are not copied) and a free lock, and its
 * parallel ranges still run, on a worker of its own; the parent's pool
 * still works after the fork. A separate executable: it forks. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/process.h>
#include "gpu/cpu/cpu_pool.h"

extern atomic_size_t tp_cpu_pool_worker_parts;

#define RANGE 65536

static atomic_int s_hits[RANGE];

static void s_cover(void *arg, size_t lo, size_t hi) {
    (void)arg;
    for (size_t i = lo; i < hi; i++)
        atomic_fetch_add(&s_hits[i], 1);
    /* slow enough that a woken worker finds parts left */
    nanosleep(&(struct timespec){0, 200000}, NULL);
}

/* Runs ranges until a worker has taken a part (at most 200 ranges); 1 when
 * every item ran once in each range. */
static int s_ranges_until_a_worker(void) {
    const size_t before = atomic_load(&tp_cpu_pool_worker_parts);
    for (int r = 0; r < 200; r++) {
        for (size_t i = 0; i < RANGE; i++)
            atomic_store(&s_hits[i], 0);
        tp_cpu_parallel(RANGE, 16, 1024, s_cover, NULL);
        for (size_t i = 0; i < RANGE; i++)
            if (atomic_load(&s_hits[i]) != 1)
                return 0;
        if (atomic_load(&tp_cpu_pool_worker_parts) > before)
            return 1;
    }
    return 0;
}

Test(proc_cpu_pool, a_child_forked_after_the_pool_started_runs_its_ranges) {
    tp_cpu_pool_threads_override(2);
    cr_assert(s_ranges_until_a_worker(), "the parent's pool never ran a part on a worker");
    cr_expect_geq(tp_forksafe_threads(), 1, "the pool's worker is not declared fork-safe");
    const pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(20); /* a deadlocked child dies instead of hanging the test */
        _exit(s_ranges_until_a_worker() ? 0 : 3);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child died (signal %d: 14 is a deadlock's alarm)",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cr_assert_eq(WEXITSTATUS(status), 0, "the child's ranges did not run on its own worker");
    cr_assert(s_ranges_until_a_worker(), "the parent's pool stopped working after fork");
    tp_cpu_pool_threads_override(0);
}
