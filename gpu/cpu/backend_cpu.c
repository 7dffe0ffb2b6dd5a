/* towerpack gpu: the CPU backend: host memory, synchronous streams, OpenBLAS
 * products, optimizer updates and an in-process all-reduce across threads.
 *
 * The thread count (--threads, per tower) is the size of the calling
 * thread's OpenMP team, set at every op entry (cpu_pool.c's tp_cpu_team):
 * oneDNN, OpenBLAS's OpenMP build and the elementwise ranges all run on
 * that one team (docs/tuning.md). OpenBLAS splits a product the same way
 * for the same sizes and thread count, so a run is reproducible at a fixed
 * setting; results may differ in the last bits between different thread
 * counts. */
#include <cblas.h>
#include <math.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/backend.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include "gpu/backend_impl.h"
#include <towerpack/process.h>

#include "gpu/cpu/cpu_adam.h"
#include "gpu/cpu/cpu_hugepage.h"
#include "gpu/cpu/cpu_pool.h"
#include "gpu/cpu/ops_cpu.h"

/* OpenBLAS's pthread build starts its thread pool (threads - 1 idle
 * workers) when it is loaded and shuts it down around fork() itself:
 * declare those threads fork-safe, so that dataflow workers can still be
 * forked before towerpack starts threads of its own. (Its OpenMP build
 * starts no thread until a product runs; libgomp's threads are declared
 * by cpu_pool.c.) */
/* The backends' thread count until one is made: OPENBLAS_NUM_THREADS,
 * else OMP_NUM_THREADS, else OpenBLAS's default (the cores). Read here, not
 * from OpenBLAS: its OpenMP build answers libgomp's team size and ignores
 * OPENBLAS_NUM_THREADS, which every command of the docs sets to say "one
 * thread" (tp-bench ops counted 2 with it set to 1). */
static int s_env_threads(void) {
    const char *names[] = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        char *end = NULL;
        long n = v ? strtol(v, &end, 10) : 0;  /* OMP's "4,2": the first level */
        if (v && end != v && n > 0 && n <= 4096 && (*end == '\0' || *end == ','))
            return (int)n;
    }
    return openblas_get_num_threads();
}

__attribute__((constructor)) static void s_declare_blas_pool(void) {
    int n = s_env_threads();
    tp_cpu_threads_set(n);
    if (n > 1 && openblas_get_parallel() == 1)
        tp_forksafe_threads_add(n - 1);
}

#define TP_COMM_MAX 64

/* ---- OpenBLAS's work buffers ---------------------------------------------
 * OpenBLAS (Debian's libopenblas0-pthread 0.3.21, driver/others/memory.c)
 * gives every thread inside a product a work buffer of 128 MiB of address
 * space: one per thread that calls it and one per pool worker, mapped on
 * first use and kept for the life of the process. When that mmap fails
 * (ulimit -v, strict overcommit) it retries for ever in a loop, with no
 * error and no way out:
 * issue 48's run under ulimit -v 512000 spun at 190% CPU, deaf to SIGTERM.
 * So the buffers are mapped here, under our control, while we can still
 * say no: before the first product (the pool's and one caller's), when
 * the towers of a model will call at once (comm_new), and before any op
 * that would have more threads inside BLAS at once than are mapped; each
 * time after checking that the address space has room. Where it has not,
 * the model or the op fails with out of memory, naming the node and shape.
 * Another compute library that maps work memory of its own (oneDNN's
 * scratchpads) goes through the same accounting: s_blas_enter around the
 * ops that call it, its need added to the reservation. */
#define BLAS_BUFFER ((uint64_t)128 << 20) /* OpenBLAS x86_64 BUFFER_SIZE (32 << 22) */
#define BLAS_SLACK ((uint64_t)1 << 20)    /* its page and OpenBLAS's own */
#define BLAS_STACK ((uint64_t)8 << 20)    /* a pool worker's stack */

/* OpenBLAS's own (exported, not in cblas.h); weak, so that another BLAS
 * links too (nothing is reserved then). */
extern void *blas_memory_alloc(int procpos) __attribute__((weak));
extern void blas_memory_free(void *buffer) __attribute__((weak));
extern int blas_num_threads __attribute__((weak));   /* the pool's size */
extern int blas_thread_shutdown_(void) __attribute__((weak)); /* stop the pool */

static pthread_mutex_t s_blas_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int s_blas_callers; /* callers at once whose buffers are mapped */
static atomic_int s_blas_pool;    /* pool workers whose buffers are mapped */
static atomic_int s_blas_active;  /* threads inside a BLAS op now */
static atomic_int s_blas_gate;    /* 1 while the pool is stopped and restarted */

/* One product that every pool thread takes part in (m split by thread):
 * it starts the pool if a fork stopped it, and a worker takes its buffer
 * before its first job, so when this returns every worker holds one. */
static void s_blas_pool_warm(int threads) {
    tp_cpu_team(threads);
    const int m = 64 * threads, n = 256, k = 256;
    float *a = calloc((size_t)m * k + (size_t)k * n + (size_t)m * n, sizeof(float));
    if (!a)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k,
                a + (size_t)m * k, n, 0.0f, a + (size_t)m * k + (size_t)k * n, n);
    free(a);
}

/* Map buffers for `callers` threads inside BLAS at once, `others` of them
 * inside already, and (not from an op: `c` NULL) for the pool, resized to
 * `threads` when > 0; or TP_ERR_NOMEM, naming `c`'s node when an op asked.
 *
 * OpenBLAS hands out the lowest free buffer and maps one only when all
 * mapped ones are in use, so holding N at once leaves N mapped for good.
 * They are taken one at a time, each only while the address space has
 * room for a new one: one that is mapped already comes back at once, a new
 * one cannot fail, and nothing reaches OpenBLAS's endless retry. Which are
 * mapped already (OpenBLAS maps some as it loads) we cannot see, so the
 * check is per buffer, not for the sum. The pool's workers hold a buffer
 * each while they live, and one that has just started takes its own a
 * moment later: the pool is stopped first (as OpenBLAS does around fork())
 * and started again on buffers that are there. */
static tp_status_t s_blas_reserve(int callers, int others, const tp_op_call_t *c,
                                  int threads) {
    pthread_mutex_lock(&s_blas_mu);
    /* the pool's size: workers started once stay, also when fewer are used */
    int *pool_size = &blas_num_threads;
    int pool = pool_size ? *pool_size : openblas_get_num_threads();
    int workers = (threads > pool ? threads : pool) - 1;
    int have_c = atomic_load(&s_blas_callers), have_p = atomic_load(&s_blas_pool);
    int want_c = callers > have_c ? callers : have_c;
    int want_p = !c && workers > have_p ? workers : have_p;
    tp_status_t rc = TP_OK;
    int stopped = 0;
    if (want_c > have_c || want_p > have_p) {
        char what[512], shape[160] = "";
        if (c) {
            int o = snprintf(shape, sizeof shape, "; node %s (%s), shape [",
                             c->name ? c->name : "?", tp_op_name(c->kind));
            for (int i = 0; i < c->yshape.ndim && o > 0 && o < (int)sizeof shape; i++)
                o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%lld", i ? "," : "",
                              (long long)c->yshape.d[i]);
            if (o > 0 && o < (int)sizeof shape)
                snprintf(shape + o, sizeof shape - (size_t)o, "]");
        }
        snprintf(what, sizeof what, "of address space for a work buffer of OpenBLAS (one "
                 "for each thread in a product: %d calling at once and %d pool worker%s%s)",
                 want_c, want_p, want_p == 1 ? "" : "s", shape);
        const char *hint = "raise the limit, or use fewer BLAS threads (--threads 1) or towers";
        if (!c && others == 0 && blas_thread_shutdown_ && blas_memory_alloc) {
            /* no thread of another model may be inside a product while the
             * pool stops: new ones wait at the gate, those inside finish */
            atomic_store(&s_blas_gate, 1);
            while (atomic_load(&s_blas_active) > 0)
                usleep(1000);
            blas_thread_shutdown_();
            stopped = 1;
        }
        int hold = want_c - others + (stopped ? want_p : 0);
        void **held = hold > 0 ? calloc((size_t)hold, sizeof *held) : NULL;
        int n = 0;
        if (hold > 0 && !held)
            rc = tp_error(TP_ERR_NOMEM, "OpenBLAS's buffers: %d pointers", hold);
        for (; rc == TP_OK && blas_memory_alloc && n < hold; n++) {
            rc = tp_mem_check(BLAS_BUFFER + BLAS_SLACK, hint, "%s", what);
            if (rc == TP_OK)
                held[n] = blas_memory_alloc(0);
        }
        /* given back: OpenBLAS keeps them mapped for the next product */
        for (int i = 0; i < n; i++)
            if (held[i])
                blas_memory_free(held[i]);
        free(held);
        if (rc == TP_OK && stopped)  /* the workers' stacks */
            rc = tp_mem_check((uint64_t)want_p * BLAS_STACK, hint, "%s", what);
        if (rc == TP_OK) {
            atomic_store(&s_blas_pool, want_p);
            atomic_store(&s_blas_callers, want_c);
        }
    }
    /* Only when it changes: OpenBLAS wakes its idle workers on every call,
     * and a woken worker spins (sched_yield) for ~0.1 s, taking a core from
     * the input actors of a run that asked for one thread. */
    if (rc == TP_OK && threads > 0 && openblas_get_num_threads() != threads)
        openblas_set_num_threads(threads);
    /* The pool runs again, its workers on their buffers, before any step. */
    if (rc == TP_OK && stopped && workers > 0)
        s_blas_pool_warm(workers + 1);
    atomic_store(&s_blas_gate, 0);
    pthread_mutex_unlock(&s_blas_mu);
    return rc;
}

/* Around an op that calls BLAS: counts the threads inside, and maps (or
 * refuses) a buffer before a thread more than those mapped goes in. */
static tp_status_t s_blas_enter(const tp_op_call_t *c) {
    for (;;) {
        int n = atomic_fetch_add_explicit(&s_blas_active, 1, memory_order_seq_cst) + 1;
        int gate = atomic_load_explicit(&s_blas_gate, memory_order_seq_cst);
        /* (the pool's size is a backend's setting: reserved when one is
         * made, not here) */
        if (!gate && n <= atomic_load_explicit(&s_blas_callers, memory_order_acquire))
            return TP_OK;
        /* not counted while it waits: a reservation that stops the pool
         * waits for the threads inside to leave */
        atomic_fetch_sub_explicit(&s_blas_active, 1, memory_order_seq_cst);
        if (gate) {  /* the pool is being stopped and started: wait */
            pthread_mutex_lock(&s_blas_mu);
            pthread_mutex_unlock(&s_blas_mu);
            continue;
        }
        TP_TRY(s_blas_reserve(n, n - 1, c, 0));
    }
}

static void s_blas_leave(void) {
    atomic_fetch_sub_explicit(&s_blas_active, 1, memory_order_acq_rel);
}

static int s_uses_blas(const tp_op_call_t *c) {
    return c->kind == TP_OP_MATMUL || c->kind == TP_OP_CONV2D ||
           c->kind == TP_OP_CONV_TRANSPOSE; /* the convolution family */
}

struct tp_stream {
    int unused;
};

/* Flush denormals to zero on the calling thread (x86 MXCSR FTZ and DAZ).
 * Momentum of a weight whose gradient stays zero decays geometrically
 * through the denormal range, where every operation costs ~100x; results
 * stay deterministic. MXCSR is per thread, so each kernel entry checks. */
static inline void s_ftz(void) {
#if defined(__SSE__)
    unsigned int csr = _mm_getcsr();
    if ((csr & 0x8040u) != 0x8040u)
        _mm_setcsr(csr | 0x8040u);
#endif
}

/* The ranks meet at an abortable barrier (gpu/barrier.c) and exchange
 * their buffers through these arrays. */
struct tp_comm {
    int nranks;
    tp_barrier_t barrier;
    float *bufs[TP_COMM_MAX];
    size_t counts[TP_COMM_MAX];
    int average[TP_COMM_MAX];
    double *sq[TP_COMM_MAX];   /* allreduce_adam: each rank's blocks' squares */
    size_t nsq[TP_COMM_MAX];   /* their room, grown by the rank itself */
};

/* A large buffer on transparent huge pages where the kernel has them
 * (cpu_hugepage.c: a model's arena, before its first touch) */
static void *s_alloc(tp_backend_t *b, size_t bytes) {
    (void)b;
    void *p = tp_alloc(bytes);
    tp_cpu_hugepage_advise(p, bytes);
    return p;
}

static void s_free(tp_backend_t *b, void *p) {
    (void)b;
    tp_free(p);
}

static tp_status_t s_copy(tp_backend_t *b, tp_stream_t *s, void *dst,
                          const void *src, size_t bytes, tp_copy_kind_t kind) {
    (void)b, (void)s, (void)kind;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
    return TP_OK;
}

static tp_status_t s_fill(tp_backend_t *b, tp_stream_t *s, float *dst,
                          float value, size_t count) {
    (void)b, (void)s;
    if (value == 0.0f) {
        memset(dst, 0, count * sizeof(float));
    } else {
        for (size_t i = 0; i < count; i++)
            dst[i] = value;
    }
    return TP_OK;
}

static tp_stream_t *s_stream_new(tp_backend_t *b) {
    (void)b;
    return calloc(1, sizeof(tp_stream_t));
}

static void s_stream_destroy(tp_backend_t *b, tp_stream_t *s) {
    (void)b;
    free(s);
}

static tp_status_t s_stream_sync(tp_backend_t *b, tp_stream_t *s) {
    (void)b, (void)s;
    return TP_OK;
}

/* The backend's oneDNN cache; NULL (im2col) for a backend that only
 * borrows this table (the tests' stand-in devices copy it and keep their
 * own state in impl). */
static const tp_backend_ops_t s_cpu_ops;
static tp_dnnl_conv_t *s_dnnl(tp_backend_t *b) {
    return b->ops == &s_cpu_ops ? b->impl : NULL;
}

/* activations kept nChw16c between ops (fold.c): where the convolutions
 * run on oneDNN's blocked layouts (dnnl_conv.c) */
static int s_nchw16c(tp_backend_t *b) {
    tp_dnnl_conv_t *d = s_dnnl(b);
    return d && tp_dnnl_conv_nchw16c(d);
}

/* batch_matmul's bias and GELU folds (fold.c): ops_linalg.c runs them on
 * either path (oneDNN or OpenBLAS) */
static int s_bmm_fold(tp_backend_t *b) {
    (void)b;
    return 1;
}

/* the block end (bn + add + relu) in one call: cpu_block_end.c, on either
 * layout */
static int s_bnorm_add(tp_backend_t *b) {
    (void)b;
    return 1;
}

/* a transpose NHWC -> NCHW folded into conv2d (fold.c): oneDNN's paths */
static int s_conv_nhwc(tp_backend_t *b, const tp_op_call_t *c) {
    tp_dnnl_conv_t *d = s_dnnl(b);
    return d && tp_dnnl_conv_nhwc(d, c);
}

static size_t s_op_workspace(tp_backend_t *b, const tp_op_call_t *c) {
    return tp_cpu_op_workspace(s_dnnl(b), c);
}

static tp_status_t s_op_forward(tp_backend_t *b, tp_stream_t *s,
                                const tp_op_call_t *c) {
    (void)s;
    s_ftz();
    tp_cpu_team(tp_cpu_threads());
    if (!s_uses_blas(c))
        return tp_cpu_op_forward(s_dnnl(b), c);
    TP_TRY(s_blas_enter(c));
    tp_status_t rc = tp_cpu_op_forward(s_dnnl(b), c);
    s_blas_leave();
    return rc;
}

static tp_status_t s_op_backward(tp_backend_t *b, tp_stream_t *s,
                                 const tp_op_call_t *c) {
    (void)s;
    s_ftz();
    tp_cpu_team(tp_cpu_threads());
    if (!s_uses_blas(c))
        return tp_cpu_op_backward(s_dnnl(b), c);
    TP_TRY(s_blas_enter(c));
    tp_status_t rc = tp_cpu_op_backward(s_dnnl(b), c);
    s_blas_leave();
    return rc;
}

static tp_status_t s_gemm(tp_backend_t *b, tp_stream_t *s, int ta, int tb,
                          int m, int n, int k, float alpha, const float *a,
                          int lda, const float *bm, int ldb, float beta,
                          float *c, int ldc) {
    (void)b, (void)s;
    const tp_op_call_t call = {.kind = TP_OP_MATMUL, .name = "gemm",
                               .yshape = {.ndim = 2, .d = {m, n}}};
    tp_cpu_team(tp_cpu_threads());
    TP_TRY(s_blas_enter(&call));
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, bm,
                ldb, beta, c, ldc);
    s_blas_leave();
    return TP_OK;
}

typedef struct {
    float *w, *v;
    const float *g;
    float lr, mu;
    int nesterov;
    float wd; /* torch.optim.SGD's coupled weight decay; 0: none */
} s_sgd_args_t;

/* SGD with the coupled decay over floats [lo, hi): d = g + wd w in the
 * update's own pass (torch.optim.SGD's order: the decayed gradient goes
 * through the momentum), where two sgd_update calls read and wrote the
 * momentum and the weights twice. */
static void s_sgd_wd_part(const s_sgd_args_t *a, size_t lo, size_t hi) {
    float *restrict w = a->w, *restrict v = a->v;
    const float *restrict g = a->g;
    const float lr = a->lr, mu = a->mu, wd = a->wd;
    if (!v || mu == 0.0f) {
        for (size_t i = lo; i < hi; i++)
            w[i] -= lr * (g[i] + wd * w[i]);
    } else if (a->nesterov) {
        for (size_t i = lo; i < hi; i++) {
            const float d = g[i] + wd * w[i];
            v[i] = mu * v[i] + d;
            w[i] -= lr * (d + mu * v[i]);
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            v[i] = mu * v[i] + (g[i] + wd * w[i]);
            w[i] -= lr * v[i];
        }
    }
}

/* SGD over floats [lo, hi): elementwise, so any cut gives the same bits. */
static void s_sgd_part(void *arg, size_t lo, size_t hi) {
    const s_sgd_args_t *a = arg;
    float *restrict w = a->w, *restrict v = a->v;
    const float *restrict g = a->g;
    const float lr = a->lr, mu = a->mu;
    s_ftz();  /* on every thread of the team */
    if (a->wd != 0.0f) {
        s_sgd_wd_part(a, lo, hi);
    } else if (!v || mu == 0.0f) {
        for (size_t i = lo; i < hi; i++)
            w[i] -= lr * g[i];
    } else if (a->nesterov) {
        for (size_t i = lo; i < hi; i++) {
            v[i] = mu * v[i] + g[i];
            w[i] -= lr * (g[i] + mu * v[i]);
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            v[i] = mu * v[i] + g[i];
            w[i] -= lr * v[i];
        }
    }
}

/* Over the tower's team when the buffer is large (a one-tower step at
 * --threads 2 updated on one core while the other waited), as Adam does. */
static tp_status_t s_sgd(tp_backend_t *b, tp_stream_t *s, float *restrict w,
                         const float *restrict g, float *restrict v, size_t n,
                         float lr, float mu, int nesterov) {
    (void)b, (void)s;
    s_sgd_args_t a = {w, v, g, lr, mu, nesterov, 0.0f};
    tp_cpu_parallel(n, 16, 1 << 15, s_sgd_part, &a);
    return TP_OK;
}

/* backend_impl.h's sgd_wd_update: the decay in the same pass as s_sgd. */
static tp_status_t s_sgd_wd(tp_backend_t *b, tp_stream_t *s, float *restrict w,
                            const float *restrict g, float *restrict v, size_t n,
                            float lr, float mu, int nesterov, float wd) {
    (void)b, (void)s;
    s_sgd_args_t a = {w, v, g, lr, mu, nesterov, wd};
    tp_cpu_parallel(n, 16, 1 << 15, s_sgd_part, &a);
    return TP_OK;
}

static tp_status_t s_adam(tp_backend_t *b, tp_stream_t *s,
                          float *restrict w, const float *restrict g,
                          float *restrict m, float *restrict v, size_t n,
                          float lr, float b1, float b2, float eps,
                          float wd, int64_t step) {
    (void)b, (void)s;
    s_ftz();
    /* one vectorised pass over the pool, AdamW's decay in it (cpu_adam.c) */
    tp_cpu_adam(w, g, m, v, n, lr, b1, b2, eps, wd, step);
    return TP_OK;
}

/* ---- gradient processing ------------------------------------------------ */

/* Sum of squares in double, in a fixed order every run (cpu_adam.c's
 * lanes), and no rounding worth the name for any arena that fits in memory. */
static tp_status_t s_grad_sumsq(tp_backend_t *b, tp_stream_t *s,
                                const float *restrict g, size_t n, float *acc,
                                int add) {
    (void)b, (void)s;
    const double sum = tp_cpu_sumsq(g, n);  /* fixed lanes (cpu_adam.c) */
    acc[0] = (float)(add ? acc[0] + sum : sum);
    return TP_OK;
}

typedef struct {
    float *g;
    float scale;
} s_scale_args_t;

static void s_scale_part(void *arg, size_t lo, size_t hi) {
    const s_scale_args_t *a = arg;
    float *restrict g = a->g;
    for (size_t i = lo; i < hi; i++)
        g[i] *= a->scale;
}

/* The scale over the tower's team, as the sum of squares before it
 * (tp_cpu_sumsq): with one tower the clip scales every gradient each step
 * (3.2 M floats in the GPT, 0.45-1 ms of one core), and a 1 x 2 run's
 * second core waited through it. Each float's product alone: the bits of
 * any cut. */
static tp_status_t s_grad_clip(tp_backend_t *b, tp_stream_t *s,
                               float *restrict g, size_t n, float clip,
                               const float *acc) {
    (void)b, (void)s;
    const float norm = sqrtf(acc[0]);
    if (!(norm > clip))
        return TP_OK; /* within the clip (or no gradient at all) */
    s_scale_args_t a = {g, clip / norm};
    tp_cpu_parallel(n, 16, 1 << 15, s_scale_part, &a);
    return TP_OK;
}

static tp_status_t s_ema_update(tp_backend_t *b, tp_stream_t *s,
                                float *restrict ema, const float *restrict w,
                                size_t n, float decay) {
    (void)b, (void)s;
    s_ftz();
    const float keep = 1.0f - decay;
    for (size_t i = 0; i < n; i++)
        ema[i] = decay * ema[i] + keep * w[i];
    return TP_OK;
}

static tp_status_t s_grad_accumulate(tp_backend_t *b, tp_stream_t *s,
                                     float *restrict sum, float *restrict g,
                                     size_t n, int last, float scale) {
    (void)b, (void)s;
    s_ftz();
    if (!last) {
        for (size_t i = 0; i < n; i++)
            sum[i] += g[i];
    } else {
        for (size_t i = 0; i < n; i++)
            g[i] = (sum[i] + g[i]) * scale;
    }
    return TP_OK;
}

/* ---- collectives -------------------------------------------------------- */

static tp_comm_t *s_comm_new(tp_backend_t *b, int nranks) {
    (void)b;
    if (nranks < 1 || nranks > TP_COMM_MAX) {
        tp_error(TP_ERR_INVALID, "communicator of %d ranks (1..%d)", nranks,
                 TP_COMM_MAX);
        return NULL;
    }
    tp_comm_t *c = calloc(1, sizeof *c);
    if (!c) {
        tp_error(TP_ERR_NOMEM, "CPU communicator of %d ranks", nranks);
        return NULL;
    }
    c->nranks = nranks;
    /* the ranks are threads that call BLAS at once */
    if (s_blas_reserve(nranks, 0, NULL, 0) < 0) {
        free(c);
        return NULL;
    }
    tp_barrier_init(&c->barrier, nranks);
    return c;
}

static void s_comm_destroy(tp_backend_t *b, tp_comm_t *c) {
    (void)b;
    if (!c)
        return;
    tp_barrier_fini(&c->barrier);
    for (int r = 0; r < c->nranks; r++)
        free(c->sq[r]);
    free(c);
}

static void s_comm_abort(tp_backend_t *b, tp_comm_t *c) {
    (void)b;
    tp_barrier_abort(&c->barrier);
}

/* Sum bufs[*][lo,hi) in rank order; write it (or the mean) to every buffer
 * or only to bufs[0]. */
static void s_reduce_range(float *const *bufs, int n, size_t lo, size_t hi,
                           int average, int root_only) {
    const float scale = average ? 1.0f / (float)n : 1.0f;
    float *dst = bufs[0];
    for (int r = 1; r < n; r++) {
        const float *src = bufs[r];
        for (size_t i = lo; i < hi; i++)
            dst[i] += src[i];
    }
    if (average)
        for (size_t i = lo; i < hi; i++)
            dst[i] *= scale;
    if (!root_only)
        for (int r = 1; r < n; r++)
            memcpy(bufs[r] + lo, dst + lo, (hi - lo) * sizeof(float));
}

/* Every buffer's [lo, hi) becomes the sum (or mean) of all of them, added
 * in rank order: b0 + b1 + ... then the scale, whichever thread does the
 * slice, so results repeat bit for bit. Blocks of 1024 through a local
 * sum, so that the loops are plain streams the compiler vectorises (the
 * element-by-element loop over ranks was 20% of a two-tower MLP step). */
enum { S_SUM_BLOCK = 1024 };

/* sum[0..m) = bufs[0][i..] + bufs[1][i..] + ... (then the mean), written
 * back to every buffer: one block of s_sum_slice and s_allreduce_sgd. */
static inline void s_sum_to(float *const *bufs, int n, size_t i, size_t m,
                            int average, float *restrict sum) {
    const float scale = 1.0f / (float)n;
    memcpy(sum, bufs[0] + i, m * sizeof(float));
    for (int r = 1; r < n; r++) {
        const float *restrict src = bufs[r] + i;
        for (size_t j = 0; j < m; j++)
            sum[j] += src[j];
    }
    if (average)
        for (size_t j = 0; j < m; j++)
            sum[j] *= scale;
}

static inline void s_sum_block(float *const *bufs, int n, size_t i, size_t m,
                               int average, float *restrict sum) {
    s_sum_to(bufs, n, i, m, average, sum);
    for (int r = 0; r < n; r++)
        memcpy(bufs[r] + i, sum, m * sizeof(float));
}

static void s_sum_slice(float *const *bufs, int n, size_t lo, size_t hi,
                        int average) {
    float sum[S_SUM_BLOCK];
    for (size_t i = lo; i < hi; i += S_SUM_BLOCK)
        s_sum_block(bufs, n, i, hi - i < S_SUM_BLOCK ? hi - i : S_SUM_BLOCK, average,
                    sum);
}

static tp_status_t s_allreduce(tp_backend_t *b, tp_comm_t *c, int rank,
                               tp_stream_t *s, float *buf, size_t count,
                               int average) {
    (void)b, (void)s;
    if (rank < 0 || rank >= c->nranks)
        return tp_error(TP_ERR_INVALID, "allreduce: rank %d of %d", rank,
                        c->nranks);
    c->bufs[rank] = buf;
    TP_TRY(tp_barrier_agree(&c->barrier, rank, c->counts, c->average, count,
                            average));
    /* Each rank reduces its own slice of every buffer: disjoint writes. */
    size_t chunk = (count + (size_t)c->nranks - 1) / (size_t)c->nranks;
    size_t lo = chunk * (size_t)rank, hi = lo + chunk;
    if (lo > count)
        lo = count;
    if (hi > count)
        hi = count;
    if (hi > lo)
        s_sum_slice(c->bufs, c->nranks, lo, hi, average);
    TP_TRY(tp_barrier_sync(&c->barrier, rank));
    return TP_OK;
}

/* The fused all-reduce entries' arguments: a rank of the communicator,
 * and decay segments (if any) that cover [0, count) from 0. */
static tp_status_t s_fused_args(const char *entry, const tp_comm_t *c, int rank,
                                size_t count, const size_t *seg, const float *decay,
                                int nseg) {
    if (nseg < 0 || (nseg > 0 && (!seg || !decay || seg[0] != 0 || seg[nseg] != count)))
        return tp_error(TP_ERR_INVALID, "%s: %d decay segments that do not cover the "
                        "%zu floats", entry, nseg, count);
    if (rank < 0 || rank >= c->nranks)
        return tp_error(TP_ERR_INVALID, "%s: rank %d of %d", entry, rank, c->nranks);
    return TP_OK;
}

/* allreduce fused with the SGD update (backend_impl.h's allreduce_sgd):
 * each rank sums its slice block by block as s_sum_slice does (the same
 * adds in the same order, so the same bits) and applies s_sgd_part to the
 * block's weights from the sum while it is in L1, instead of a second pass
 * that reads the gradients back from memory (two towers: the MLP step's
 * sum and update went from two passes over the slice to one). The last
 * meeting comes after the update: the other ranks' next forward reads the
 * weights this rank just wrote. */
static tp_status_t s_allreduce_sgd_wd(tp_backend_t *b, tp_comm_t *c, int rank,
                                      tp_stream_t *s, float *buf, size_t count,
                                      int average, float *w, float *v, float lr,
                                      float mu, int nesterov, const size_t *seg,
                                      const float *decay, int nseg);

static tp_status_t s_allreduce_sgd(tp_backend_t *b, tp_comm_t *c, int rank,
                                   tp_stream_t *s, float *buf, size_t count,
                                   int average, float *w, float *v, float lr,
                                   float mu, int nesterov) {
    return s_allreduce_sgd_wd(b, c, rank, s, buf, count, average, w, v, lr, mu,
                              nesterov, NULL, NULL, 0);
}

/* The same with torch's coupled decay (backend_impl.h's allreduce_sgd_wd):
 * decay[k] over the floats [seg[k], seg[k + 1]); nseg 0: none. A block
 * that spans segments is updated a segment at a time (the same bits as
 * sgd_wd_update on each: the update is elementwise). */
static tp_status_t s_allreduce_sgd_wd(tp_backend_t *b, tp_comm_t *c, int rank,
                                      tp_stream_t *s, float *buf, size_t count,
                                      int average, float *w, float *v, float lr,
                                      float mu, int nesterov, const size_t *seg,
                                      const float *decay, int nseg) {
    (void)b, (void)s;
    TP_TRY(s_fused_args("allreduce_sgd", c, rank, count, seg, decay, nseg));
    c->bufs[rank] = buf;
    TP_TRY(tp_barrier_agree(&c->barrier, rank, c->counts, c->average, count,
                            average));
    const int n = c->nranks;
    size_t chunk = (count + (size_t)n - 1) / (size_t)n;
    size_t lo = chunk * (size_t)rank, hi = lo + chunk;
    if (lo > count)
        lo = count;
    if (hi > count)
        hi = count;
    float sum[S_SUM_BLOCK];
    int k = 0;
    for (size_t i = lo; i < hi; i += S_SUM_BLOCK) {
        size_t m = hi - i < S_SUM_BLOCK ? hi - i : S_SUM_BLOCK;
        s_sum_block(c->bufs, n, i, m, average, sum);
        if (nseg == 0) {
            const s_sgd_args_t a = {w + i, v ? v + i : NULL, sum, lr, mu, nesterov, 0.0f};
            s_sgd_part((void *)&a, 0, m);
            continue;
        }
        /* the segments this block meets, in order (k only moves forward) */
        while (k + 1 < nseg && seg[k + 1] <= i)
            k++;
        for (size_t j = i; j < i + m;) {
            while (seg[k + 1] <= j)
                k++;
            const size_t e = seg[k + 1] < i + m ? seg[k + 1] : i + m;
            const s_sgd_args_t a = {w + j, v ? v + j : NULL, sum + (j - i), lr, mu,
                                    nesterov, decay[k]};
            s_sgd_part((void *)&a, 0, e - j);
            j = e;
        }
    }
    TP_TRY(tp_barrier_sync(&c->barrier, rank));
    return TP_OK;
}

/* allreduce fused with the clip and Adam (backend_impl.h's
 * allreduce_adam). The sum of squares is tp_cpu_sumsq's blocks added in
 * order, so each slice starts on a block: rank r sums its blocks into its
 * own buffer (1024 floats at a time, as s_sum_slice) and keeps each
 * block's squares, read back while the block is in L1 (two ranks: taken
 * in the same loop as the sums, tp_cpu_sum2_sumsq_block, twice as fast
 * in the GPT's 2 x 1 run), in its row of the communicator; after the
 * meeting every rank adds all the rows in rank order, which is the
 * blocks' order: grad_sumsq's bits over the whole
 * buffer without a pass over it. Then the update, with the clip's scale
 * applied in its own pass (tp_cpu_adam_scaled). Against allreduce and
 * the three calls a rank makes two passes over its slice of the
 * gradients where there were five (one of them over the whole buffer),
 * and writes into no other rank's buffer. */
static void s_adam_slice(size_t count, int nranks, int rank, size_t *lo, size_t *hi) {
    const size_t bl = TP_CPU_SUMSQ_BLOCK;
    size_t chunk = (count + (size_t)nranks - 1) / (size_t)nranks;
    chunk = (chunk + bl - 1) / bl * bl;
    *lo = chunk * (size_t)rank < count ? chunk * (size_t)rank : count;
    *hi = *lo + chunk < count ? *lo + chunk : count;
}

static tp_status_t s_allreduce_adam(tp_backend_t *b, tp_comm_t *c, int rank,
                                    tp_stream_t *s, float *buf, size_t count,
                                    int average, float *w, float *m, float *v,
                                    float lr, float b1, float b2, float eps,
                                    int64_t step, float clip, const size_t *seg,
                                    const float *decay, int nseg) {
    (void)b, (void)s;
    enum { BL = TP_CPU_SUMSQ_BLOCK };
    TP_TRY(s_fused_args("allreduce_adam", c, rank, count, seg, decay, nseg));
    const int n = c->nranks;
    size_t lo, hi;
    s_adam_slice(count, n, rank, &lo, &hi);
    const size_t nb = (hi - lo + BL - 1) / BL;
    if (nb > c->nsq[rank]) {  /* before the meeting: the others read it after */
        double *p = realloc(c->sq[rank], nb * sizeof *p);
        if (!p)
            return tp_error(TP_ERR_NOMEM, "allreduce_adam: %zu blocks' squares", nb);
        c->sq[rank] = p;
        c->nsq[rank] = nb;
    }
    c->bufs[rank] = buf;
    TP_TRY(tp_barrier_agree(&c->barrier, rank, c->counts, c->average, count,
                            average));
    float sum[S_SUM_BLOCK];
    const float mean = average ? 1.0f / (float)n : 1.0f; /* s_sum_to's scale */
    for (size_t i = lo, k = 0; i < hi; i += BL, k++) {
        const size_t e = hi - i < BL ? hi : i + BL;
        if (n == 2) { /* the towers' case: the squares beside the sums */
            c->sq[rank][k] = tp_cpu_sum2_sumsq_block(buf + i, c->bufs[0] + i,
                                                     c->bufs[1] + i, e - i, mean);
            continue;
        }
        for (size_t j = i; j < e; j += S_SUM_BLOCK) {
            const size_t bm = e - j < S_SUM_BLOCK ? e - j : S_SUM_BLOCK;
            s_sum_to(c->bufs, n, j, bm, average, sum);
            memcpy(buf + j, sum, bm * sizeof(float));
        }
        c->sq[rank][k] = tp_cpu_sumsq_block(buf + i, e - i);  /* from L1 */
    }
    TP_TRY(tp_barrier_sync(&c->barrier, rank));
    double total = 0.0;  /* tp_cpu_sumsq's order: block by block */
    for (int r = 0; r < n; r++) {
        size_t rlo, rhi;
        s_adam_slice(count, n, r, &rlo, &rhi);
        for (size_t k = 0; k < (rhi - rlo + BL - 1) / BL; k++)
            total += c->sq[r][k];
    }
    /* grad_sumsq's float, grad_clip's test and scale, the scale applied
     * in the update's own pass (tp_cpu_adam_scaled: the bits of the
     * scaled gradient stored, then read) */
    const float norm = sqrtf((float)total);
    const float scale = clip > 0 && norm > clip ? clip / norm : 1.0f;
    if (nseg == 0) {
        tp_cpu_adam_scaled(w + lo, buf + lo, m + lo, v + lo, hi - lo, lr, b1, b2, eps,
                           0.0f, step, scale);
    } else {
        int k = 0;
        for (size_t j = lo; j < hi;) {
            while (seg[k + 1] <= j)
                k++;
            const size_t e = seg[k + 1] < hi ? seg[k + 1] : hi;
            tp_cpu_adam_scaled(w + j, buf + j, m + j, v + j, e - j, lr, b1, b2, eps,
                               decay[k], step, scale);
            j = e;
        }
    }
    TP_TRY(tp_barrier_sync(&c->barrier, rank));
    return TP_OK;
}

/* A bucket's all-reduce beside the backward pass: on the CPU the ranks'
 * threads do the sums themselves, so a bucket is reduced at once (between
 * two ops of the backward pass) and there is nothing left to wait for. */
static tp_status_t s_allreduce_end(tp_backend_t *b, tp_comm_t *c, int rank,
                                   tp_stream_t *s) {
    (void)b, (void)s;
    if (rank < 0 || rank >= c->nranks)
        return tp_error(TP_ERR_INVALID, "allreduce: rank %d of %d", rank,
                        c->nranks);
    return TP_OK;
}

static tp_status_t s_allreduce_local(tp_backend_t *b, float *const *bufs,
                                     int n, size_t count, int average,
                                     int root_only) {
    (void)b;
    if (n < 1)
        return tp_error(TP_ERR_INVALID, "allreduce of %d buffers", n);
    if (n > 1)
        s_reduce_range(bufs, n, 0, count, average, root_only);
    return TP_OK;
}

static void s_destroy(tp_backend_t *b) {
    tp_dnnl_conv_t *dnnl = s_dnnl(b);
    tp_dnnl_conv_destroy(&dnnl);
    free(b);
}

/* Timing marks: the CPU's calls end done, so a mark is the host's clock
 * when it is recorded. */
struct tp_timer {
    int n;
    uint64_t ns[];
};

static tp_timer_t *s_timer_new(tp_backend_t *b, int n) {
    (void)b;
    if (n < 1)
        return NULL;
    tp_timer_t *t = calloc(1, sizeof *t + (size_t)n * sizeof t->ns[0]);
    if (t)
        t->n = n;
    return t;
}

static tp_status_t s_timer_mark(tp_backend_t *b, tp_stream_t *s, tp_timer_t *t, int i) {
    (void)b, (void)s;
    if (!t || i < 0 || i >= t->n)
        return tp_error(TP_ERR_INVALID, "timer: mark %d of %d", i, t ? t->n : 0);
    t->ns[i] = tp_now_ns();
    return TP_OK;
}

static tp_status_t s_timer_ms(tp_backend_t *b, tp_timer_t *t, int i, int j, float *ms) {
    (void)b;
    if (!t || i < 0 || j < 0 || i >= t->n || j >= t->n)
        return tp_error(TP_ERR_INVALID, "timer: marks %d and %d of %d", i, j, t ? t->n : 0);
    *ms = (float)((double)((int64_t)(t->ns[j] - t->ns[i])) * 1e-6);
    return TP_OK;
}

static void s_timer_destroy(tp_backend_t *b, tp_timer_t *t) {
    (void)b;
    free(t);
}

static const tp_backend_ops_t s_cpu_ops = {
    .name = "cpu",
    .alloc = s_alloc,
    .free = s_free,
    .copy = s_copy,
    .fill = s_fill,
    .stream_new = s_stream_new,
    .stream_destroy = s_stream_destroy,
    .stream_sync = s_stream_sync,
    .op_workspace = s_op_workspace,
    .op_forward = s_op_forward,
    .op_backward = s_op_backward,
    .gemm = s_gemm,
    .sgd_update = s_sgd,
    .adam_update = s_adam,
    .comm_new = s_comm_new,
    .comm_destroy = s_comm_destroy,
    .allreduce = s_allreduce,
    .comm_abort = s_comm_abort,
    .allreduce_local = s_allreduce_local,
    .destroy = s_destroy,
    .allreduce_begin = s_allreduce,
    .allreduce_end = s_allreduce_end,
    .timer_new = s_timer_new,
    .timer_mark = s_timer_mark,
    .timer_ms = s_timer_ms,
    .timer_destroy = s_timer_destroy,
    .grad_sumsq = s_grad_sumsq,
    .grad_clip = s_grad_clip,
    .ema_update = s_ema_update,
    .grad_accumulate = s_grad_accumulate,
    .allreduce_sgd = s_allreduce_sgd,
    .nchw16c = s_nchw16c,
    .bmm_fold = s_bmm_fold,
    .bnorm_add = s_bnorm_add,
    .conv_nhwc = s_conv_nhwc,
    .sgd_wd_update = s_sgd_wd,
    .allreduce_sgd_wd = s_allreduce_sgd_wd,
    .allreduce_adam = s_allreduce_adam,
};

/* OpenBLAS's pthread build runs its own pool beside the OpenMP team of
 * oneDNN and the elementwise ops: said once, when more than one thread
 * asks (the build links the OpenMP build when libopenblas-openmp-dev is
 * there; a pthread one is Debian's default alternative, e.g. for an
 * installed binary without the build's RPATH). */
static void s_check_blas_build(int threads) {
    static atomic_int said;
    if (threads > 1 && openblas_get_parallel() != 2 && !atomic_exchange(&said, 1))
        TP_WARN("CPU backend: %d threads, but the OpenBLAS loaded (%s) is not its "
                "OpenMP build: its threads compete with oneDNN's for the cores "
                "(install libopenblas0-openmp; docs/tuning.md)", threads,
                openblas_get_config());
}

tp_backend_t *tp_backend_cpu_new(int threads) {
    if (threads < 0 || threads > 256) {
        tp_error(TP_ERR_INVALID, "CPU backend: %d threads (0..256)", threads);
        return NULL;
    }
    tp_backend_t *b = calloc(1, sizeof *b);
    if (!b) {
        tp_error(TP_ERR_NOMEM, "CPU backend");
        return NULL;
    }
    b->ops = &s_cpu_ops;
    b->device = -1;
    s_ftz();
    /* a child forked after a team ran has one thread (cpu_pool.h) */
    if (threads > 1 && tp_cpu_team_forked()) {
        TP_WARN("CPU backend: %d threads asked in a process forked after OpenMP "
                "threads ran (libgomp cannot start them again there): 1 thread",
                threads);
        threads = 1;
    }
    /* sets the thread count too, after checking there is room for it */
    if (s_blas_reserve(1, 0, NULL, threads) < 0) {
        free(b);
        return NULL;
    }
    if (threads > 0)
        tp_cpu_threads_set(threads);
    s_check_blas_build(tp_backend_cpu_threads());
    /* the convolutions' path (TP_CPU_CONV, else by the thread count just
     * set; docs/compute.md): oneDNN's cache, or none for im2col + OpenBLAS */
    tp_cpu_conv_path_t path;
    if (tp_cpu_conv_path_from_env(tp_backend_cpu_threads(), &path) != TP_OK) {
        free(b);
        return NULL;
    }
    if (path != TP_CPU_CONV_IM2COL && !(b->impl = tp_dnnl_conv_new(path))) {
        free(b);
        return NULL;
    }
    return b;
}

int tp_backend_cpu_threads(void) { return tp_cpu_threads(); }
