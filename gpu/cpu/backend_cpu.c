/* towerpack gpu: the CPU backend: host memory, synchronous streams, OpenBLAS
 * products, optimizer updates and an in-process all-reduce across threads.
 *
 * The thread count is OpenBLAS's (openblas_set_num_threads). OpenBLAS
 * splits a product the same way for the same sizes and thread count, so a
 * run is reproducible at a fixed setting; results may differ in the last
 * bits between different thread counts. */
#include <cblas.h>
#include <math.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/clock.h>
#include "gpu/backend_impl.h"
#include <towerpack/process.h>

#include "gpu/cpu/ops_cpu.h"

/* OpenBLAS starts its thread pool (threads - 1 idle workers) when it is
 * loaded and shuts it down around fork() itself: declare those threads
 * fork-safe, so that dataflow workers can still be forked before towerpack
 * starts threads of its own. */
__attribute__((constructor)) static void s_declare_blas_pool(void) {
    int n = openblas_get_num_threads();
    if (n > 1)
        tp_forksafe_threads_add(n - 1);
}

#define TP_COMM_MAX 64

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
};

static void *s_alloc(tp_backend_t *b, size_t bytes) {
    (void)b;
    return tp_alloc(bytes);
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

static size_t s_op_workspace(tp_backend_t *b, const tp_op_call_t *c) {
    (void)b;
    return tp_cpu_op_workspace(c);
}

static tp_status_t s_op_forward(tp_backend_t *b, tp_stream_t *s,
                                const tp_op_call_t *c) {
    (void)b, (void)s;
    s_ftz();
    return tp_cpu_op_forward(c);
}

static tp_status_t s_op_backward(tp_backend_t *b, tp_stream_t *s,
                                 const tp_op_call_t *c) {
    (void)b, (void)s;
    s_ftz();
    return tp_cpu_op_backward(c);
}

static tp_status_t s_gemm(tp_backend_t *b, tp_stream_t *s, int ta, int tb,
                          int m, int n, int k, float alpha, const float *a,
                          int lda, const float *bm, int ldb, float beta,
                          float *c, int ldc) {
    (void)b, (void)s;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, bm,
                ldb, beta, c, ldc);
    return TP_OK;
}

static tp_status_t s_sgd(tp_backend_t *b, tp_stream_t *s, float *restrict w,
                         const float *restrict g, float *restrict v, size_t n,
                         float lr, float mu, int nesterov) {
    (void)b, (void)s;
    s_ftz();
    if (!v || mu == 0.0f) {
        for (size_t i = 0; i < n; i++)
            w[i] -= lr * g[i];
    } else if (nesterov) {
        for (size_t i = 0; i < n; i++) {
            v[i] = mu * v[i] + g[i];
            w[i] -= lr * (g[i] + mu * v[i]);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            v[i] = mu * v[i] + g[i];
            w[i] -= lr * v[i];
        }
    }
    return TP_OK;
}

static tp_status_t s_adam(tp_backend_t *b, tp_stream_t *s,
                          float *restrict w, const float *restrict g,
                          float *restrict m, float *restrict v, size_t n,
                          float lr, float b1, float b2, float eps,
                          float wd, int64_t step) {
    (void)b, (void)s;
    s_ftz();
    /* AdamW's decoupled decay first, as torch.optim.AdamW does (Adam's
     * loop below is then untouched: wd 0 is Adam bit for bit) */
    if (wd != 0.0f) {
        const float keep = 1.0f - lr * wd;
        for (size_t i = 0; i < n; i++)
            w[i] *= keep;
    }
    const double c1 = 1.0 - pow(b1, (double)step);
    const double c2 = 1.0 - pow(b2, (double)step);
    /* Fold the bias corrections into the step size and epsilon. */
    const float lr_t = (float)(lr * sqrt(c2) / c1);
    const float eps_t = (float)(eps * sqrt(c2));
    const float ob1 = 1.0f - b1, ob2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + ob1 * g[i];
        v[i] = b2 * v[i] + ob2 * g[i] * g[i];
        w[i] -= lr_t * m[i] / (sqrtf(v[i]) + eps_t);
    }
    return TP_OK;
}

/* ---- gradient processing ------------------------------------------------ */

/* Sum of squares in double, element by element: the same order every run,
 * and no rounding worth the name for any arena that fits in memory. */
static tp_status_t s_grad_sumsq(tp_backend_t *b, tp_stream_t *s,
                                const float *restrict g, size_t n, float *acc,
                                int add) {
    (void)b, (void)s;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)g[i] * g[i];
    acc[0] = (float)(add ? acc[0] + sum : sum);
    return TP_OK;
}

static tp_status_t s_grad_clip(tp_backend_t *b, tp_stream_t *s,
                               float *restrict g, size_t n, float clip,
                               const float *acc) {
    (void)b, (void)s;
    const float norm = sqrtf(acc[0]);
    if (!(norm > clip))
        return TP_OK; /* within the clip (or no gradient at all) */
    const float scale = clip / norm;
    for (size_t i = 0; i < n; i++)
        g[i] *= scale;
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
    if (!c)
        return NULL;
    c->nranks = nranks;
    tp_barrier_init(&c->barrier, nranks);
    return c;
}

static void s_comm_destroy(tp_backend_t *b, tp_comm_t *c) {
    (void)b;
    if (!c)
        return;
    tp_barrier_fini(&c->barrier);
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
static void s_sum_slice(float *const *bufs, int n, size_t lo, size_t hi,
                        int average) {
    enum { BLOCK = 1024 };
    float sum[BLOCK];
    const float scale = 1.0f / (float)n;
    for (size_t i = lo; i < hi; i += BLOCK) {
        size_t m = hi - i < BLOCK ? hi - i : BLOCK;
        memcpy(sum, bufs[0] + i, m * sizeof(float));
        for (int r = 1; r < n; r++) {
            const float *restrict src = bufs[r] + i;
            for (size_t j = 0; j < m; j++)
                sum[j] += src[j];
        }
        if (average)
            for (size_t j = 0; j < m; j++)
                sum[j] *= scale;
        for (int r = 0; r < n; r++)
            memcpy(bufs[r] + i, sum, m * sizeof(float));
    }
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

static void s_destroy(tp_backend_t *b) { free(b); }

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
};

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
    /* Only when it changes: OpenBLAS wakes its idle workers on every call,
     * and a woken worker spins (sched_yield) for ~0.1 s, taking a core from
     * the input actors of a run that asked for one thread. */
    if (threads > 0 && openblas_get_num_threads() != threads)
        openblas_set_num_threads(threads);
    s_ftz();
    return b;
}

int tp_backend_cpu_threads(void) { return openblas_get_num_threads(); }
