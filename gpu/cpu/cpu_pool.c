/* towerpack gpu: the CPU backend's parallel ranges on the calling thread's
 * OpenMP team (gpu/cpu/cpu_pool.h).
 *
 * A range runs as one libgomp parallel region (GOMP_parallel, libgomp's
 * ABI since GCC 4.9, called directly so that no OpenMP compiler flag is
 * needed: clang's -fopenmp would emit LLVM libomp's calls instead). Its
 * threads are the ones oneDNN's primitives and OpenBLAS's OpenMP build use
 * for the same tower thread: one team, no second pool waiting for a core.
 * A range is cut into two parts a thread, each a fixed slice (so which
 * thread runs it changes nothing). Thread t first runs its own parts, the
 * t-th share of the range in order, so that a step's ops over the same
 * tensors give each thread the same slice every time and its data stays
 * in that core's cache (PyTorch's and oneDNN's static schedules do the
 * same); then it takes whatever parts the others have not started, so a
 * thread the machine's other load delays leaves its share to the rest.
 * The region's end is the join.
 *
 * Between regions libgomp's idle threads spin a while, then sleep
 * (OMP_WAIT_POLICY, GOMP_SPINCOUNT; docs/tuning.md): the next op of the
 * same step finds them awake.
 *
 * ThreadSanitizer: libgomp is not instrumented, so the hand-over of a
 * range to the team and back is also said with atomics TSan sees (a
 * release before the region and an acquire in it; a release at each
 * thread's end and an acquire after the region). They cost two atomic
 * operations a thread per range, and keep the TSan build free of
 * suppressions for our own code.
 *
 * fork(): a child gets none of libgomp's threads, but the forking thread's
 * pool still lists them, and its next region of more than one thread
 * waits on them for ever (GCC's libgomp has no fork handler; PyTorch
 * makes its child single-threaded for the same reason). So once a team of
 * more than one thread has run, a forked child runs every team with one
 * thread (tp_cpu_team_forked), and the team's threads are declared
 * fork-safe: the parent's are idle, and the child never waits on them. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <towerpack/process.h>

#include "gpu/cpu/cpu_pool.h"

/* libgomp's own (no OpenMP compiler flag needed for them) */
extern void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads,
                          unsigned flags);
extern int omp_get_thread_num(void);
extern int omp_get_num_threads(void);
extern int omp_get_max_threads(void);
extern void omp_set_num_threads(int n);

/* Parts a range has at most: two a thread, threads up to S_MAX_PARTS / 2
 * (a larger team cuts bigger parts, so no part is left out). */
#define S_MAX_PARTS 256

/* One range handed to a team. */
typedef struct {
    tp_cpu_range_fn fn;
    void *arg;
    size_t n, part, nparts;
    atomic_uchar taken[S_MAX_PARTS]; /* a part's claim: 1 once a thread took it */
    atomic_size_t by_workers;        /* parts a worker (not the caller) took */
    atomic_int start;    /* released by the caller before the region */
    atomic_int finished; /* released by each thread of the team at its end */
    int worker_first;    /* the caller waits for a worker's first part (tests) */
} s_range_t;

static atomic_int s_threads = 1;                /* tp_cpu_threads */
static atomic_flag s_busy = ATOMIC_FLAG_INIT; /* one range at a time in the process */
static atomic_int s_override;                 /* test-only thread count (0: the backend's) */
static atomic_int s_team_ran;                 /* a team of > 1 thread may have started */
static atomic_int s_forked;                   /* forked after that: 1 thread a team */
static pthread_once_t s_once = PTHREAD_ONCE_INIT;

/* Parts of a range run by a team thread, not the caller (the tests read
 * it to see that the team really ran). */
atomic_size_t tp_cpu_pool_worker_parts;

static void s_postfork_child(void) {
    if (atomic_load(&s_team_ran))
        atomic_store(&s_forked, 1);
    atomic_flag_clear(&s_busy);
}

static void s_atfork(void) { pthread_atfork(NULL, NULL, s_postfork_child); }

int tp_cpu_team_forked(void) { return atomic_load_explicit(&s_forked, memory_order_relaxed); }

void tp_cpu_threads_set(int threads) { atomic_store(&s_threads, threads > 0 ? threads : 1); }

int tp_cpu_threads(void) {
    return tp_cpu_team_forked() ? 1 : atomic_load_explicit(&s_threads, memory_order_relaxed);
}

void tp_cpu_team(int threads) {
    if (threads < 1 || tp_cpu_team_forked())
        threads = 1;
    if (threads > 1 && !atomic_load_explicit(&s_team_ran, memory_order_relaxed)) {
        pthread_once(&s_once, s_atfork);
        atomic_store(&s_team_ran, 1);
    }
    /* a per-thread setting (libgomp's nthreads-var of this thread): each
     * tower thread has its own, which OpenBLAS's OpenMP build follows too */
    if (omp_get_max_threads() != threads)
        omp_set_num_threads(threads);
}

void tp_cpu_pool_threads_override(int threads) {
    atomic_store(&s_override, threads > 0 ? threads : 0);
}

/* A team thread's body: take parts until none is left. */
static void s_team_body(void *p) {
    s_range_t *r = p;
    (void)atomic_load_explicit(&r->start, memory_order_acquire);
    const int worker = omp_get_thread_num() > 0;
    if (worker) {
        /* once per thread: libgomp keeps its threads for the process */
        static _Thread_local int declared;
        if (!declared) {
            declared = 1;
            tp_forksafe_threads_add(1);
        }
    }
    /* Under the tests' override a worker takes the first part, so a test
     * that compares one and two threads sees the team really share the
     * range: on a loaded machine the caller could otherwise finish every
     * part before a worker wakes (CI once saw 20 s of tries without one). */
    const size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
    if (!worker && r->worker_first && threads > 1)
        while (atomic_load_explicit(&r->by_workers, memory_order_relaxed) == 0)
            sched_yield();
    /* its own share first, [own, own_end), then the others' leftovers
     * from there on, round the range */
    const size_t own = t * r->nparts / threads, own_end = (t + 1) * r->nparts / threads;
    size_t done = 0;
    for (size_t i = 0; i < r->nparts; i++) {
        const size_t k = (own + i) % r->nparts;
        if (k >= own && k < own_end) {
            if (atomic_exchange_explicit(&r->taken[k], 1, memory_order_relaxed))
                continue;
        } else if (atomic_load_explicit(&r->taken[k], memory_order_relaxed) ||
                   atomic_exchange_explicit(&r->taken[k], 1, memory_order_relaxed)) {
            continue;
        }
        if (worker)
            atomic_fetch_add_explicit(&r->by_workers, 1, memory_order_relaxed);
        const size_t lo = k * r->part, hi = lo + r->part < r->n ? lo + r->part : r->n;
        r->fn(r->arg, lo, hi);
        done++;
    }
    if (worker)
        atomic_fetch_add_explicit(&tp_cpu_pool_worker_parts, done, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->finished, 1, memory_order_release);
}

void tp_cpu_parallel(size_t n, size_t align, size_t min_items, tp_cpu_range_fn fn,
                     void *arg) {
    const int ov = atomic_load_explicit(&s_override, memory_order_relaxed);
    int threads = ov > 0 && !tp_cpu_team_forked() ? ov : tp_cpu_threads();
    if (align == 0)
        align = 1;
    if (min_items < align)
        min_items = align;
    if (threads <= 1 || n < 2 * min_items ||
        atomic_flag_test_and_set_explicit(&s_busy, memory_order_acquire)) {
        fn(arg, 0, n);
        return;
    }
    if (!atomic_load_explicit(&s_team_ran, memory_order_relaxed)) {
        pthread_once(&s_once, s_atfork);
        atomic_store(&s_team_ran, 1);
    }
    /* two parts a thread, so a thread that the machine's other load
     * delays leaves its second part to the others */
    size_t nparts = (size_t)threads * 2;
    if (nparts > n / min_items)
        nparts = n / min_items;
    if (nparts > S_MAX_PARTS)
        nparts = S_MAX_PARTS;
    size_t part = (n + nparts - 1) / nparts;
    part = (part + align - 1) / align * align;
    nparts = (n + part - 1) / part;

    s_range_t r = {.fn = fn, .arg = arg, .n = n, .part = part, .nparts = nparts,
                   .worker_first = ov > 0};
    for (size_t k = 0; k < nparts; k++)
        atomic_init(&r.taken[k], 0);
    atomic_init(&r.by_workers, 0);
    atomic_init(&r.finished, 0);
    atomic_store_explicit(&r.start, 1, memory_order_release);
    GOMP_parallel(s_team_body, &r, (unsigned)threads, 0);
    (void)atomic_load_explicit(&r.finished, memory_order_acquire);
    atomic_flag_clear_explicit(&s_busy, memory_order_release);
}
