/* towerpack tests: the CPU backend's OpenMP team across fork()
 * (gpu/cpu/cpu_pool.c): libgomp has no fork handler, so a child whose
 * forking thread ran a team of two threads would wait for ever on the
 * parent's threads at its next team of two. A child forked after a team
 * ran runs every team with one thread: its ranges, a CPU backend asked
 * for 2 threads and its products all finish, with the same bits as the
 * parent's; the parent's team still works after the fork. A separate
 * executable: it forks. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
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

/* Runs ranges until a worker has taken a part (at most `max` ranges); 1
 * when every item ran once in each range and (if `want_worker`) a worker
 * took a part. */
static int s_ranges(int max, int want_worker) {
    const size_t before = atomic_load(&tp_cpu_pool_worker_parts);
    for (int r = 0; r < max; r++) {
        for (size_t i = 0; i < RANGE; i++)
            atomic_store(&s_hits[i], 0);
        tp_cpu_parallel(RANGE, 16, 1024, s_cover, NULL);
        for (size_t i = 0; i < RANGE; i++)
            if (atomic_load(&s_hits[i]) != 1)
                return 0;
        if (want_worker && atomic_load(&tp_cpu_pool_worker_parts) > before)
            return 1;
    }
    return !want_worker;
}

/* A product on a backend of `threads` threads (OpenBLAS's OpenMP build
 * runs it on the calling thread's team): its checksum bits. */
static int s_product(int threads, float *sum) {
    tp_backend_t *b = tp_backend_cpu_new(threads);
    if (!b)
        return 0;
    enum { M = 256, N = 256, K = 256 };
    float *a = malloc(sizeof(float) * (M * K + K * N + M * N));
    if (!a) {
        tp_backend_destroy(&b);
        return 0;
    }
    for (int i = 0; i < M * K + K * N; i++)
        a[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    tp_status_t rc = b->ops->gemm(b, NULL, 0, 0, M, N, K, 1.0f, a, K, a + M * K, N, 0.0f,
                                  a + M * K + K * N, N);
    double s = 0;
    for (int i = 0; i < M * N; i++)
        s += a[M * K + K * N + i] * (float)(i % 13);
    *sum = (float)s;
    free(a);
    tp_backend_destroy(&b);
    return rc == TP_OK;
}

Test(proc_cpu_pool, a_child_forked_after_a_team_ran_runs_one_thread_teams) {
    tp_cpu_pool_threads_override(2);
    cr_assert(s_ranges(200, 1), "the parent's team never ran a part on a worker");
    cr_expect_geq(tp_forksafe_threads(), 1, "the team's worker is not declared fork-safe");
    /* the child's product runs on one thread: its bits are compared with
     * the parent's on one thread (OpenBLAS's Haswell kernels, which it
     * picks on a CPU it does not know such as Zen 5, give other bits on
     * two threads); the parent's two-thread product runs its team */
    float parent_sum = 0, parent_two = 0;
    cr_assert(s_product(2, &parent_two), "parent product: %s", tp_last_error());
    cr_assert(s_product(1, &parent_sum), "parent product: %s", tp_last_error());
    cr_assert_eq(tp_cpu_team_forked(), 0);
    const pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(20); /* a deadlocked child dies instead of hanging the test */
        if (!tp_cpu_team_forked())
            _exit(2);
        const size_t before = atomic_load(&tp_cpu_pool_worker_parts);
        if (!s_ranges(5, 0))
            _exit(3);
        if (atomic_load(&tp_cpu_pool_worker_parts) != before)
            _exit(4); /* a part ran on a thread the child does not have */
        float child_sum = 0;
        if (!s_product(2, &child_sum))
            _exit(5);
        if (tp_backend_cpu_threads() != 1)
            _exit(6);
        _exit(memcmp(&child_sum, &parent_sum, sizeof child_sum) ? 7 : 0);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child died (signal %d: 14 is a deadlock's alarm)",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cr_assert_eq(WEXITSTATUS(status), 0,
                 "the child failed at step %d (2 not marked forked, 3 ranges, 4 a part "
                 "on a worker, 5 product, 6 thread count, 7 product bits)",
                 WEXITSTATUS(status));
    cr_assert(s_ranges(200, 1), "the parent's team stopped working after fork");
    float again = 0;
    cr_assert(s_product(2, &again), "parent product after fork: %s", tp_last_error());
    cr_expect_eq(tp_cpu_team_forked(), 0);
    tp_cpu_pool_threads_override(0);
}
