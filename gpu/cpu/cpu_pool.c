/* towerpack gpu: the CPU backend's pool of threads for its own kernels
 * (gpu/cpu/cpu_pool.h).
 *
 * One process-wide pool, started on the first parallel range, grown when
 * the backend's thread count grows (never shrunk: an idle worker sleeps on
 * a condition variable and costs nothing). A range is published under the
 * mutex with a generation number; the caller and every worker that wakes
 * take parts through an atomic counter until none is left (a part is a
 * fixed slice of the range, so which thread runs it changes nothing), and
 * the caller waits under the mutex until every worker that joined has left
 * before it returns and before the next range can be published. A worker
 * that wakes late joins only a range still open, so it never runs a part
 * of one range with another's function.
 *
 * Workers poll a short while (POOL_SPIN yields, tens of microseconds)
 * before sleeping, so that the next op of the same step finds them awake;
 * the poll only reads, and yields the core at every turn. Fork:
 * the handlers below hold the mutex across fork() and give the child an
 * empty pool (its workers are not copied), so the workers are declared
 * fork-safe as OpenBLAS's are. */
#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <towerpack/process.h>

#include "gpu/cpu/cpu_pool.h"

#define POOL_MAX 64        /* workers at most (the backend allows 256 threads) */
#define POOL_SPIN 64       /* polls of the generation before a worker sleeps */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a range was published */
    pthread_cond_t idle; /* the last worker inside a range left */
    pthread_once_t once;
    int nworkers;
    /* the open range (valid while open; written under mu) */
    uint64_t gen;
    int open;
    int inside; /* workers that joined the open range and have not left */
    tp_cpu_range_fn fn;
    void *arg;
    size_t n, part, nparts;
    atomic_size_t next;        /* the next part to take */
    atomic_uint_fast64_t seen; /* gen, for the spinning workers (reads only) */
    atomic_flag busy;          /* one range at a time in the process */
    atomic_int override;       /* test-only thread count (0: the backend's) */
} s_pool = {.mu = PTHREAD_MUTEX_INITIALIZER,
            .wake = PTHREAD_COND_INITIALIZER,
            .idle = PTHREAD_COND_INITIALIZER,
            .once = PTHREAD_ONCE_INIT,
            .busy = ATOMIC_FLAG_INIT};

/* Parts of the open range run by a worker, not the caller (the tests read
 * it to see that the pool really ran). */
atomic_size_t tp_cpu_pool_worker_parts;

/* A poll that gives the core away: OpenBLAS's idle workers poll the
 * same way (sched_yield), so on a core that both pools share, the one
 * that has work runs. */
static inline void s_relax(void) { sched_yield(); }

/* Take parts of the range until none is left. */
static size_t s_run_parts(tp_cpu_range_fn fn, void *arg, size_t n, size_t part,
                          size_t nparts) {
    size_t done = 0, k;
    while ((k = atomic_fetch_add_explicit(&s_pool.next, 1, memory_order_relaxed)) < nparts) {
        const size_t lo = k * part, hi = lo + part < n ? lo + part : n;
        fn(arg, lo, hi);
        done++;
    }
    return done;
}

static void *s_worker(void *unused) {
    (void)unused;
    /* the last generation this worker looked at: none yet (ranges start at
     * 1), so a worker started for an open range joins it */
    uint64_t mine = 0;
    pthread_mutex_lock(&s_pool.mu);
    for (;;) {
        if (!(s_pool.open && s_pool.gen != mine)) {
            /* spin outside the lock on the published generation first */
            pthread_mutex_unlock(&s_pool.mu);
            for (int i = 0; i < POOL_SPIN; i++) {
                if (atomic_load_explicit(&s_pool.seen, memory_order_relaxed) != mine)
                    break;
                s_relax();
            }
            pthread_mutex_lock(&s_pool.mu);
            while (!(s_pool.open && s_pool.gen != mine))
                pthread_cond_wait(&s_pool.wake, &s_pool.mu);
        }
        mine = s_pool.gen;
        s_pool.inside++;
        const tp_cpu_range_fn fn = s_pool.fn;
        void *arg = s_pool.arg;
        const size_t n = s_pool.n, part = s_pool.part, nparts = s_pool.nparts;
        pthread_mutex_unlock(&s_pool.mu);
        const size_t done = s_run_parts(fn, arg, n, part, nparts);
        atomic_fetch_add_explicit(&tp_cpu_pool_worker_parts, done, memory_order_relaxed);
        pthread_mutex_lock(&s_pool.mu);
        if (--s_pool.inside == 0)
            pthread_cond_signal(&s_pool.idle);
    }
    return NULL;
}

/* fork(): no range is half published in the child, and its pool is empty
 * (fork copies only the calling thread). */
static void s_prefork(void) { pthread_mutex_lock(&s_pool.mu); }
static void s_postfork_parent(void) { pthread_mutex_unlock(&s_pool.mu); }
static void s_postfork_child(void) {
    pthread_mutex_init(&s_pool.mu, NULL);
    pthread_cond_init(&s_pool.wake, NULL);
    pthread_cond_init(&s_pool.idle, NULL);
    s_pool.nworkers = 0;
    s_pool.open = 0;
    s_pool.inside = 0;
    atomic_flag_clear(&s_pool.busy);
}

static void s_atfork(void) { pthread_atfork(s_prefork, s_postfork_parent, s_postfork_child); }

/* Workers up to `want` (under mu); fewer when threads cannot start. */
static void s_grow(int want) {
    if (want > POOL_MAX)
        want = POOL_MAX;
    while (s_pool.nworkers < want) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 256 << 10);
        const int rc = pthread_create(&t, &at, s_worker, NULL);
        pthread_attr_destroy(&at);
        if (rc != 0)
            break; /* the caller does the parts alone: slower, same result */
        s_pool.nworkers++;
        tp_forksafe_threads_add(1);
    }
}

void tp_cpu_pool_threads_override(int threads) {
    atomic_store(&s_pool.override, threads > 0 ? threads : 0);
}

void tp_cpu_parallel(size_t n, size_t align, size_t min_items, tp_cpu_range_fn fn,
                     void *arg) {
    const int ov = atomic_load_explicit(&s_pool.override, memory_order_relaxed);
    /* the backend's thread count is OpenBLAS's (tp_backend_cpu_threads,
     * read here directly: backend_cpu.c calls the kernels that call us) */
    const int threads = ov > 0 ? ov : openblas_get_num_threads();
    if (align == 0)
        align = 1;
    if (min_items < align)
        min_items = align;
    if (threads <= 1 || n < 2 * min_items ||
        atomic_flag_test_and_set_explicit(&s_pool.busy, memory_order_acquire)) {
        fn(arg, 0, n);
        return;
    }
    pthread_once(&s_pool.once, s_atfork);
    /* two parts a thread, so a thread that the machine's other load
     * delays leaves its second part to the others */
    size_t nparts = (size_t)threads * 2;
    if (nparts > n / min_items)
        nparts = n / min_items;
    size_t part = (n + nparts - 1) / nparts;
    part = (part + align - 1) / align * align;
    nparts = (n + part - 1) / part;

    pthread_mutex_lock(&s_pool.mu);
    s_grow(threads - 1);
    s_pool.fn = fn;
    s_pool.arg = arg;
    s_pool.n = n;
    s_pool.part = part;
    s_pool.nparts = nparts;
    atomic_store_explicit(&s_pool.next, 0, memory_order_relaxed);
    s_pool.gen++;
    s_pool.open = 1;
    atomic_store_explicit(&s_pool.seen, s_pool.gen, memory_order_relaxed);
    pthread_cond_broadcast(&s_pool.wake);
    pthread_mutex_unlock(&s_pool.mu);

    s_run_parts(fn, arg, n, part, nparts);

    pthread_mutex_lock(&s_pool.mu);
    while (s_pool.inside > 0)
        pthread_cond_wait(&s_pool.idle, &s_pool.mu);
    s_pool.open = 0;
    pthread_mutex_unlock(&s_pool.mu);
    atomic_flag_clear_explicit(&s_pool.busy, memory_order_release);
}
