/* tp-bench step: one training step (forward, backward, update) of an MLP
 * 784-256-10 at batch 128 against the same matrix products called directly
 * on OpenBLAS in the same run; also the step time of a small CNN.
 *
 *   tp-bench step [--model mlp|gpt] [--iters N] [--rounds R] [--threads T]
 *                 [--batch B] [--no-cnn] [--no-fold] [--profile] [--json]
 *                 [--layers L] [--width C] [--heads H] [--context T]
 *
 * The reference is the five sgemm calls the step itself makes (two forward;
 * dW2, dh, dW1 backward; the input needs no gradient). Each round runs
 * `iters` steps, then `iters` reference iterations; the ratio is the median
 * of the rounds' ratios (robust on a shared machine), the times are each
 * side's fastest round. The CNN figure is the fastest of 5 rounds of 3
 * steps. Goal: ratio <= 1.3.
 *
 * --profile adds the CNN's per-op table: each op's time (the fastest of 5
 * profiled rounds of 2 steps), its FLOPs per call (tp_op_profile_t, from
 * the op's geometry), its GFLOPS and its fraction of the machine's FP32
 * peak, measured in the same run by an FMA loop (s_peak; with --bf16 bf16's,
 * a VDPBF16PS loop) on as many
 * threads as the backend uses; then a table of CPU times per op (the tower
 * thread's and the process's, at 1 thread and at T, from a 1-thread model
 * profiled first in the same run): which ops ran on the team, their
 * parallel fraction, the time between ops, and the Amdahl bound for T
 * threads (s_team_table). CPU times, unlike wall clocks, stay readable on
 * a loaded host; with OMP_WAIT_POLICY=passive they count work only.
 *
 * --model gpt times the zoo's GPT step instead (models/zoo_gpt.c, AdamW;
 * by default bench/peers/gpt_cpu.sh's shape: 4 layers, width 256, 4
 * heads, context 256, batch 4), the fastest of 3 rounds of 2 steps, and
 * with --profile prints the same two tables summed per op kind (the
 * GPT's 4 layers make some 130 nodes), and between them its products
 * one node a row (s_products_table: shape, each pass's GFLOPS). --no-fold (or TP_FOLD=0) builds
 * any of the models with folds off (tp_model_config_t.fold). */
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "tools/tp-bench/bench_median.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

static tp_status_t s_mlp(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *h = tp_relu(t, "relu1", tp_fc(t, "fc1", in[0], 256, 1));
    tp_node_t *logits = tp_fc(t, "fc2", h, 10, 1);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

/* conv32-pool-conv64-pool-fc128-fc10 on uint8 images, as a trainer feeds. */
static tp_status_t s_cnn(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    int64_t shape[4] = {-1, 1, 28, 28};
    tp_node_t *x = tp_reshape(t, "img", tp_cast(t, "cast", in[0], 1.0f / 255), 4, shape);
    tp_node_t *h = tp_relu(t, NULL, tp_conv2d(t, "conv1", x, 32, 3, 1, -1, 1));
    h = tp_max_pool(t, "pool1", h, 2, 2, 0);
    h = tp_relu(t, NULL, tp_conv2d(t, "conv2", h, 64, 3, 1, -1, 1));
    h = tp_max_pool(t, "pool2", h, 2, 2, 0);
    h = tp_relu(t, NULL, tp_fc(t, "fc1", h, 128, 1));
    tp_node_t *logits = tp_fc(t, "fc2", h, 10, 1);
    return tp_tower_set_cost(t, tp_softmax_xent(t, "cost", logits, in[1]));
}

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.01, 0.9, 0);
}

static double s_min(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

/* ---- the FP32 peak ------------------------------------------------------------ */

/* Chains of acc = acc * a + b, independent enough to hide the FMA's
 * latency (4 cycles, 2 units: 8 in flight fill a core; 12 ymm and 24 zmm
 * accumulators leave room), in registers: the core's FMA throughput and
 * nothing else. a just below 1 keeps every value normal and finite. Each
 * returns a lane so that the compiler keeps the work. */
#if defined(__x86_64__) && defined(__GNUC__)
enum { S_ACC_YMM = 12, S_ACC_ZMM = 24 };

__attribute__((target("avx2,fma"))) static float s_fma_ymm(uint64_t iters) {
    __m256 acc[S_ACC_YMM];
    for (int j = 0; j < S_ACC_YMM; j++)
        acc[j] = _mm256_set1_ps(0.001f * (float)j);
    const __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
    for (uint64_t i = 0; i < iters; i++) {
#pragma GCC unroll 32
        for (int j = 0; j < S_ACC_YMM; j++)
            acc[j] = _mm256_fmadd_ps(acc[j], a, b);
    }
    for (int j = 1; j < S_ACC_YMM; j++)
        acc[0] = _mm256_add_ps(acc[0], acc[j]);
    return _mm256_cvtss_f32(acc[0]);
}

__attribute__((target("avx512f"))) static float s_fma_zmm(uint64_t iters) {
    __m512 acc[S_ACC_ZMM];
    for (int j = 0; j < S_ACC_ZMM; j++)
        acc[j] = _mm512_set1_ps(0.001f * (float)j);
    const __m512 a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
    for (uint64_t i = 0; i < iters; i++) {
#pragma GCC unroll 32 /* every accumulator in a register */
        for (int j = 0; j < S_ACC_ZMM; j++)
            acc[j] = _mm512_fmadd_ps(acc[j], a, b);
    }
    for (int j = 1; j < S_ACC_ZMM; j++)
        acc[0] = _mm512_add_ps(acc[0], acc[j]);
    return _mm512_reduce_add_ps(acc[0]);
}

/* The bf16 products' instruction (VDPBF16PS: 32 products a zmm, summed in
 * pairs into 16 fp32 lanes) in the same chains: acc += a . b, a's pairs
 * (1, 2^-24) and b's (2^-24, 0) adding about 2^-24 a step. */
__attribute__((target("avx512f,avx512bf16"))) static float s_dot_bf16(uint64_t iters) {
    __m512 acc[S_ACC_ZMM];
    for (int j = 0; j < S_ACC_ZMM; j++)
        acc[j] = _mm512_set1_ps(0.001f * (float)j);
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x33803f80),
                   b = (__m512bh)_mm512_set1_epi32(0x00003380);
    for (uint64_t i = 0; i < iters; i++) {
#pragma GCC unroll 32
        for (int j = 0; j < S_ACC_ZMM; j++)
            acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    }
    for (int j = 1; j < S_ACC_ZMM; j++)
        acc[0] = _mm512_add_ps(acc[0], acc[j]);
    return _mm512_reduce_add_ps(acc[0]);
}
#endif

/* The chains a peak is measured with. */
enum { S_YMM_FMA, S_ZMM_FMA, S_ZMM_BF16 };

typedef struct {
    int zmm;                   /* S_YMM_FMA, S_ZMM_FMA or S_ZMM_BF16 */
    uint64_t iters;
    atomic_int *go;            /* set when every thread is made */
    uint64_t t0, t1;           /* this thread's start and end, ns */
    volatile float sink;
} s_peak_job_t;

static void *s_peak_thread(void *arg) {
    s_peak_job_t *j = arg;
    while (!atomic_load(j->go))
        ;
    j->t0 = tp_now_ns();
#if defined(__x86_64__) && defined(__GNUC__)
    j->sink = j->zmm == S_ZMM_BF16  ? s_dot_bf16(j->iters)
              : j->zmm == S_ZMM_FMA ? s_fma_zmm(j->iters)
                                    : s_fma_ymm(j->iters);
#endif
    j->t1 = tp_now_ns();
    return NULL;
}

/* FLOPs of one iteration of a chain's loop (an FMA is 2 per lane, a bf16
 * dot product 4). */
static double s_peak_flops_per_iter(int zmm) {
    return zmm == S_ZMM_BF16 ? 4.0 * 16 * 24 : zmm == S_ZMM_FMA ? 2.0 * 16 * 24 : 2.0 * 8 * 12;
}

/* GFLOPS of `threads` threads running the chains together for `iters`:
 * all the work over the span from the first start to the last end. */
static double s_peak_once(int zmm, int threads, uint64_t iters) {
    pthread_t th[64];
    s_peak_job_t job[64];
    atomic_int go = 0;
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    int made = 1; /* the calling thread is job 0 */
    for (int i = 0; i < threads; i++) {
        job[i] = (s_peak_job_t){zmm, iters, &go, 0, 0, 0};
        if (i > 0 && pthread_create(&th[i], NULL, s_peak_thread, &job[i]) != 0)
            break; /* fewer threads: the figure counts those that ran */
        made = i + 1;
    }
    atomic_store(&go, 1);
    s_peak_thread(&job[0]);
    for (int i = 1; i < made; i++)
        pthread_join(th[i], NULL);
    uint64_t t0 = job[0].t0, t1 = job[0].t1;
    for (int i = 1; i < made; i++) {
        t0 = job[i].t0 < t0 ? job[i].t0 : t0;
        t1 = job[i].t1 > t1 ? job[i].t1 : t1;
    }
    const double flops = s_peak_flops_per_iter(zmm) * (double)iters * made;
    return t1 > t0 ? flops / (double)(t1 - t0) : 0.0;
}

/* The machine's peak in GFLOPS on `threads` threads: the loop's length
 * calibrated on one thread to about 4 ms (shorter than a busy machine's
 * time slice, so that some runs keep their cores throughout), then the
 * best of 40 runs of every thread at once (other work only ever slows a
 * run). FP32 (bf16 0): AVX-512's chains and AVX2's where the CPU has them,
 * the faster counting (Zen 4 runs AVX-512 at AVX2's rate; Intel's server
 * cores at twice). bf16 (the products' when tp-bench --bf16 is on): the
 * VDPBF16PS chains, twice FP32's on Zen 4. *isa names the one that won;
 * 0 without the instructions. */
static double s_peak(int threads, int bf16, const char **isa) {
    *isa = "none";
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    double best = 0.0;
    for (int zmm = bf16 ? S_ZMM_BF16 : S_YMM_FMA; zmm <= (bf16 ? S_ZMM_BF16 : S_ZMM_FMA); zmm++) {
        if (zmm == S_ZMM_BF16 ? !__builtin_cpu_supports("avx512bf16")
            : zmm == S_ZMM_FMA
                ? !__builtin_cpu_supports("avx512f")
                : !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
            continue;
        uint64_t iters = 1 << 14;
        for (;;) { /* until one thread's run takes 10 ms, then scaled */
            const uint64_t t0 = tp_now_ns();
            s_peak_once(zmm, 1, iters);
            const uint64_t dt = tp_now_ns() - t0;
            if (dt >= 10000000 || iters >= ((uint64_t)1 << 40)) {
                iters = (uint64_t)((double)iters * 4e6 / (double)(dt ? dt : 1));
                break;
            }
            iters *= 4;
        }
        for (int r = 0; r < 40; r++) {
            const double g = s_peak_once(zmm, threads, iters);
            if (g > best) {
                best = g;
                *isa = zmm == S_ZMM_BF16 ? "AVX512_BF16 dot products"
                       : zmm == S_ZMM_FMA ? "AVX-512 FMA" : "AVX2 FMA";
            }
        }
    }
    return best;
#else
    (void)threads;
    (void)bf16;
    return 0.0;
#endif
}

/* The peak a profile's percentages read against, said: bf16's when the
 * products run in bf16 (tp-bench --bf16, TP_CPU_BF16), else FP32's. */
static double s_profile_peak(int threads) {
    const int bf16 = tp_backend_cpu_bf16_ask(-1);
    const char *isa;
    const double peak = s_peak(threads, bf16, &isa);
    printf("%s peak %.1f GFLOPS (%s, %d thread(s), measured now)%s\n", bf16 ? "BF16" : "FP32",
           peak, isa, threads,
           bf16 ? ": the percentages read against it, fp32 ops' too" : "");
    return peak;
}

/* GFLOPS and percent of the peak of `flops` in `ns` ("-" without FLOPs). */
static void s_rate(char *buf, size_t len, double flops, double ns, double peak) {
    if (flops <= 0 || ns <= 0)
        snprintf(buf, len, "%8s %6s", "-", "-");
    else
        snprintf(buf, len, "%8.1f %5.0f%%", flops / ns,
                 peak > 0 ? 100.0 * flops / ns / peak : 0.0);
}

/* ---- the per-op profile ------------------------------------------------------- */

/* PROF_MAX: rows of a profile (the GPT's 4 layers make about 130 nodes,
 * each row a node; more are counted and said, not kept). */
enum { PROF_MAX = 1024, PROF_ROUNDS = 5, PROF_STEPS = 2 };

/* A model's profile: each op's fastest of PROF_ROUNDS rounds of PROF_STEPS
 * steps (another engineer's build on a shared core only ever slows a
 * round), field by field; and the same for the steps themselves, timed
 * around tp_model_run on this thread (the tower's: its ops run here).
 * s_by_kind collapses it into one row per op kind (nodes: how many). */
typedef struct {
    tp_op_profile_t op[PROF_MAX];
    int nodes[PROF_MAX]; /* by kind: the nodes in the row; else 0 */
    int n;
    int whole_round; /* 1: one round's figures (s_profile) */
    double step_ns, step_thr_ns, step_proc_ns; /* PROF_STEPS steps */
    double between_thr_ns; /* the step's thread time less its ops', per round */
} s_prof_t;

static uint64_t s_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define S_MIN_FIELD(f) \
    if (rd == 0 || pr[i].f < out->op[i].f) \
        out->op[i].f = pr[i].f

/* Profiles tower 0 of `m` on its inputs `in` (nin of them) into *out:
 * field by field the fastest of the rounds or, with whole_round, the one
 * round whose step took the least tower-thread CPU time, every figure
 * its own. The GPT's per-kind sums take the latter: a kind of many small
 * nodes summed from each node's best round under-reads its thread time
 * at T (the team's dynamic share lets the tower thread do little of one
 * node in some round), and its "team" then reads above T. */
static void s_profile(tp_model_t *m, tp_tensor_t *in, int nin, int whole_round,
                      s_prof_t *out) {
    static tp_op_profile_t pr[PROF_MAX]; /* one caller at a time: a tool's thread */
    out->whole_round = whole_round;
    for (int rd = 0; rd < PROF_ROUNDS; rd++) {
        tp_model_set_profiling(m, 1);
        const uint64_t w0 = tp_now_ns(), t0 = s_clock(CLOCK_THREAD_CPUTIME_ID),
                       p0 = s_clock(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; i < PROF_STEPS; i++)
            tp_model_run(m, 0, in, nin, NULL, 0, NULL);
        const double w = (double)(tp_now_ns() - w0),
                     t = (double)(s_clock(CLOCK_THREAD_CPUTIME_ID) - t0),
                     p = (double)(s_clock(CLOCK_PROCESS_CPUTIME_ID) - p0);
        if (whole_round && rd > 0 && t >= out->step_thr_ns)
            continue; /* a slower round than the one kept */
        if (whole_round || rd == 0 || w < out->step_ns)
            out->step_ns = w;
        if (whole_round || rd == 0 || t < out->step_thr_ns)
            out->step_thr_ns = t;
        if (whole_round || rd == 0 || p < out->step_proc_ns)
            out->step_proc_ns = p;
        int np = tp_model_profile(m, 0, pr, PROF_MAX);
        if (rd == 0 && np > PROF_MAX)
            fprintf(stderr, "tp-bench step: the profile has %d rows, %d kept (their time "
                    "counts as between ops)\n", np, PROF_MAX);
        np = np < PROF_MAX ? np : PROF_MAX;
        out->n = np;
        /* between ops from one round's own sums (the fields' minima come
         * from different rounds: their sum under-reads a round's) */
        double ops = 0;
        for (int i = 0; i < np; i++)
            ops += (double)(pr[i].thread_forward_ns + pr[i].thread_backward_ns);
        if (whole_round || rd == 0 || t - ops < out->between_thr_ns)
            out->between_thr_ns = t - ops;
        for (int i = 0; i < np; i++) {
            if (whole_round || rd == 0) {
                out->op[i] = pr[i];
                continue;
            }
            S_MIN_FIELD(forward_ns);
            S_MIN_FIELD(backward_ns);
            S_MIN_FIELD(thread_forward_ns);
            S_MIN_FIELD(thread_backward_ns);
            S_MIN_FIELD(process_forward_ns);
            S_MIN_FIELD(process_backward_ns);
        }
    }
    tp_model_set_profiling(m, 0);
}

/* A node's or a row's thread CPU time, forward and backward. */
static double s_thr(const tp_op_profile_t *o) {
    return (double)(o->thread_forward_ns + o->thread_backward_ns);
}

/* `src`'s rows summed per op kind into *dst (times, folds, FLOPs of a
 * step: every node runs once a step), the step's figures as they are;
 * the rows in the order of `order`'s kinds (the 1-thread profile's, so
 * that s_team_table pairs the same kinds) or, with order NULL, by thread
 * time, largest first. */
static void s_by_kind(const s_prof_t *src, const s_prof_t *order, s_prof_t *dst) {
    memset(dst, 0, sizeof *dst);
    dst->step_ns = src->step_ns, dst->step_thr_ns = src->step_thr_ns;
    dst->step_proc_ns = src->step_proc_ns, dst->between_thr_ns = src->between_thr_ns;
    dst->whole_round = src->whole_round;
    if (order) /* the same kinds in the same rows, filled below */
        for (int j = 0; j < order->n; j++) {
            dst->op[j].kind = order->op[j].kind;
            dst->op[j].name = order->op[j].name;
        }
    dst->n = order ? order->n : 0;
    for (int i = 0; i < src->n; i++) {
        const tp_op_profile_t *o = &src->op[i];
        int j = 0;
        while (j < dst->n && dst->op[j].kind != o->kind)
            j++;
        if (j == dst->n) {
            dst->n++;
            dst->op[j].kind = o->kind;
            dst->op[j].name = tp_op_name(o->kind);
        }
        tp_op_profile_t *d = &dst->op[j];
        dst->nodes[j]++;
        d->forward_ns += o->forward_ns, d->backward_ns += o->backward_ns;
        d->thread_forward_ns += o->thread_forward_ns;
        d->thread_backward_ns += o->thread_backward_ns;
        d->process_forward_ns += o->process_forward_ns;
        d->process_backward_ns += o->process_backward_ns;
        d->calls += o->calls, d->folds += o->folds;
        d->flops_forward += o->flops_forward, d->flops_backward += o->flops_backward;
    }
    if (order)
        return;
    for (int i = 0; i < dst->n; i++) { /* few kinds: a selection sort */
        int k = i;
        for (int j = i + 1; j < dst->n; j++)
            if (s_thr(&dst->op[j]) > s_thr(&dst->op[k]))
                k = j;
        const tp_op_profile_t t = dst->op[i];
        const int tn = dst->nodes[i];
        dst->op[i] = dst->op[k], dst->nodes[i] = dst->nodes[k];
        dst->op[k] = t, dst->nodes[k] = tn;
    }
}

/* Which ops run on the team, from CPU times (readable on a loaded host,
 * where wall clocks under-read): per op (forward + backward, per step) the
 * tower thread's CPU time at 1 thread (c1, from `one`; NULL when the run
 * has one thread) and at T (cT), the process's at T over the thread's
 * ("team": near T when the team worked through the op; spin waits after
 * a parallel op count too), and the op's parallel fraction par = (1 -
 * cT/c1) * T/(T-1) (0: serial, 1: scales with the threads; "serial"
 * marks par < 0.5). Below, the Amdahl bound for T threads from the
 * 1-thread times: each op's c1 (1 - par) and the time between ops (the
 * step's thread time less its ops', the least of the rounds: the fused
 * updates, the plan walk) as the serial part, c1 par as the parallel
 * one; and the ratio the thread times say the step gets (the step's
 * thread time at 1 over that at T). `what` names the model and its rows
 * ("CNN per op"); a profile by kind (s_by_kind) says each row's nodes
 * where a profile by node says its kind. */
static void s_team_table(const char *what, const s_prof_t *pt, const s_prof_t *one, int T) {
    const double S = PROF_STEPS * 1e6; /* ns over the rounds' steps to ms a step */
    const int by_kind = pt->n > 0 && pt->nodes[0] > 0;
    printf("%s on the CPU's team, CPU time per step (ms; %s of %d rounds):\n", what,
           pt->whole_round ? "the least-CPU round" : "fastest", PROF_ROUNDS);
    const char *h1 = by_kind ? "kind" : "op", *h2 = by_kind ? "nodes" : "kind";
    if (one)
        printf("  %-16s %-14s %9s %9s %9s %6s %5s\n", h1, h2, "thr@1", "thr@T", "proc@T",
               "team", "par");
    else
        printf("  %-16s %-14s %9s %9s %6s\n", h1, h2, "thr", "proc", "team");
    double serial1 = 0, par1 = 0;
    for (int i = 0; i < pt->n; i++) {
        const tp_op_profile_t *o = &pt->op[i];
        const double cT = (double)(o->thread_forward_ns + o->thread_backward_ns) / S;
        const double pT = (double)(o->process_forward_ns + o->process_backward_ns) / S;
        if (cT <= 0 && pT <= 0)
            continue; /* a view (reshape): no call */
        const double team = cT > 0 ? pT / cT : 0;
        char col2[24];
        if (by_kind)
            snprintf(col2, sizeof col2, "%d", pt->nodes[i]);
        else
            snprintf(col2, sizeof col2, "%s", tp_op_name(o->kind));
        if (!one) {
            printf("  %-16s %-14s %9.3f %9.3f %6.2f\n", o->name, col2, cT, pT, team);
            continue;
        }
        const tp_op_profile_t *q = i < one->n ? &one->op[i] : o;
        const double c1 = (double)(q->thread_forward_ns + q->thread_backward_ns) / S;
        double par = c1 > 0 ? (1.0 - cT / c1) * T / (T - 1) : 0;
        par = par < 0 ? 0 : par > 1 ? 1 : par;
        serial1 += c1 * (1.0 - par);
        par1 += c1 * par;
        printf("  %-16s %-14s %9.3f %9.3f %9.3f %6.2f %5.2f%s\n", o->name, col2, c1, cT, pT,
               team, par, par < 0.5 ? "  serial" : "");
    }
    const double stepT = pt->step_thr_ns / S, betweenT = pt->between_thr_ns / S;
    if (!one) {
        printf("  %-31s %9.3f\n  %-31s %9.3f %9.3f %6.2f  (wall %.3f)\n", "between ops",
               betweenT, "step", stepT, pt->step_proc_ns / S,
               stepT > 0 ? pt->step_proc_ns / S / stepT : 0, pt->step_ns / S);
        return;
    }
    const double step1 = one->step_thr_ns / S, between1 = one->between_thr_ns / S;
    printf("  %-31s %9.3f %9.3f\n", "between ops", between1, betweenT);
    printf("  %-31s %9.3f %9.3f %9.3f %6.2f        (wall %.3f, %.3f)\n", "step", step1, stepT,
           pt->step_proc_ns / S, stepT > 0 ? pt->step_proc_ns / S / stepT : 0,
           one->step_ns / S, pt->step_ns / S);
    const double serial = serial1 + (between1 > 0 ? between1 : 0);
    const char *wp = getenv("OMP_WAIT_POLICY");
    if (!wp || strcasecmp(wp, "passive"))
        printf("  (the team's spin waits count as CPU time here: OMP_WAIT_POLICY=passive in "
               "the environment gives a table of work only, readable under load)\n");
    printf("Amdahl bound at %d threads: serial %.3f ms (ops' serial fractions %.3f + between "
           "%.3f) of %.3f at 1 thread -> %.2fx; the thread times say %.2fx (wall %.2fx, load-dependent)\n",
           T, serial, serial1, between1 > 0 ? between1 : 0, step1,
           step1 / (serial + par1 / T), stepT > 0 ? step1 / stepT : 0,
           pt->step_ns > 0 ? one->step_ns / pt->step_ns : 0);
}

/* Each row's time a step, forward and backward, its FLOPs (a forward's
 * MFLOPs), GFLOPS and fraction of the FP32 `peak` (s_rate); by node (its
 * kind, "+N" nodes folded into its calls) or by kind (its nodes, "+N"
 * folded). conv_total: a last row of the convolutions together. */
static void s_rate_table(const s_prof_t *pt, double peak, int conv_total) {
    const int by_kind = pt->n > 0 && pt->nodes[0] > 0;
    printf("  %-16s %-16s %8s %8s %8s %8s %6s %8s %6s\n", by_kind ? "kind" : "op",
           by_kind ? "nodes" : "kind", "fwd ms", "bwd ms", "fwd MF", "fwd GF/s", "peak",
           "bwd GF/s", "peak");
    const tp_op_profile_t *best = pt->op;
    double conv_f = 0, conv_fns = 0, conv_b = 0, conv_bns = 0;
    for (int i = 0; i < pt->n; i++) {
        char kind[32]; /* "+N": nodes folded into its calls */
        if (by_kind)
            snprintf(kind, sizeof kind, best[i].folds ? "%d+%d" : "%d", pt->nodes[i],
                     best[i].folds);
        else
            snprintf(kind, sizeof kind, best[i].folds ? "%s+%d" : "%s",
                     tp_op_name(best[i].kind), best[i].folds);
        const double fns = (double)best[i].forward_ns / PROF_STEPS;
        const double bns = (double)best[i].backward_ns / PROF_STEPS;
        char fr[32], br[32];
        s_rate(fr, sizeof fr, best[i].flops_forward, fns, peak);
        s_rate(br, sizeof br, best[i].flops_backward, bns, peak);
        char mf[16] = "-";
        if (best[i].flops_forward > 0)
            snprintf(mf, sizeof mf, "%.1f", best[i].flops_forward / 1e6);
        printf("  %-16s %-16s %8.3f %8.3f %8s %s %s\n", best[i].name, kind, fns / 1e6,
               bns / 1e6, mf, fr, br);
        if (best[i].kind == TP_OP_CONV2D) {
            conv_f += best[i].flops_forward;
            conv_fns += fns;
            conv_b += best[i].flops_backward;
            conv_bns += bns;
        }
    }
    if (!conv_total)
        return;
    char fr[32], br[32];
    s_rate(fr, sizeof fr, conv_f, conv_fns, peak);
    s_rate(br, sizeof br, conv_b, conv_bns, peak);
    printf("  %-16s %-16s %8.3f %8.3f %8.1f %s %s\n", "convolutions", "(all)", conv_fns / 1e6,
           conv_bns / 1e6, conv_f / 1e6, fr, br);
}

/* The GPT's matrix products one node a row (the profile by node, `pt`;
 * the kind table sums them): the product's M x N x K (M x N from the
 * node's output, K from its forward FLOPs: 2MNK), and each pass's tower
 * thread CPU ms a step, GFLOPS and fraction of the FP32 `peak`, thread
 * time being what a loaded host moves least. A row far under the others'
 * rate is a shape the kernel runs badly, or a fold's pass (bias, GELU)
 * that costs more than its product's share. */
static void s_products_table(const tp_model_t *m, const s_prof_t *pt, double peak) {
    printf("GPT's products per node, per step (tower-thread CPU; the same round; "
           "+N folded):\n");
    printf("  %-20s %-17s %-19s %8s %8s %6s %8s %8s %6s\n", "node", "kind", "M x N x K",
           "fwd ms", "fwd GF/s", "peak", "bwd ms", "bwd GF/s", "peak");
    const int nn = tp_model_node_count(m, 0);
    double f_ns = 0, b_ns = 0, f_fl = 0, b_fl = 0;
    for (int i = 0; i < pt->n; i++) {
        const tp_op_profile_t *o = &pt->op[i];
        if (o->kind != TP_OP_BATCH_MATMUL)
            continue;
        const tp_shape_t *ys = NULL;
        for (int j = 0; j < nn && !ys; j++) {
            const tp_node_t *nd = tp_model_node(m, 0, j);
            if (nd && !strcmp(tp_node_name(nd), o->name))
                ys = tp_node_shape(nd);
        }
        char dims[40] = "?";
        if (ys && ys->ndim > 0) {
            const double n = (double)ys->d[ys->ndim - 1];
            const double mm = n > 0 ? (double)tp_shape_count(ys) / n : 0;
            const double k = mm * n > 0 ? o->flops_forward / (2.0 * mm * n) : 0;
            snprintf(dims, sizeof dims, "%.0f x %.0f x %.0f", mm, n, k);
        }
        char kind[32], fr[32], br[32];
        snprintf(kind, sizeof kind, o->folds ? "%s+%d" : "%s", tp_op_name(o->kind), o->folds);
        const double fns = (double)o->thread_forward_ns / PROF_STEPS,
                     bns = (double)o->thread_backward_ns / PROF_STEPS;
        s_rate(fr, sizeof fr, o->flops_forward, fns, peak);
        s_rate(br, sizeof br, o->flops_backward, bns, peak);
        printf("  %-20s %-17s %-19s %8.3f %s %8.3f %s\n", o->name, kind, dims, fns / 1e6, fr,
               bns / 1e6, br);
        f_ns += fns, b_ns += bns, f_fl += o->flops_forward, b_fl += o->flops_backward;
    }
    char fr[32], br[32];
    s_rate(fr, sizeof fr, f_fl, f_ns, peak);
    s_rate(br, sizeof br, b_fl, b_ns, peak);
    printf("  %-20s %-17s %-19s %8.3f %s %8.3f %s\n", "(all)", "", "", f_ns / 1e6, fr,
           b_ns / 1e6, br);
}

static void s_usage(void) {
    printf("usage: tp-bench step [--model mlp|gpt] [--iters N] [--rounds R] [--threads T]\n"
           "                     [--batch B] [--no-cnn] [--no-fold] [--profile] [--json]\n"
           "                     [--bf16]\n"
           "                     [--layers L] [--width C] [--heads H] [--context T]  (gpt)\n"
           "  mlp (default): MLP 784-256-10 step against its raw sgemm calls; small CNN step "
           "time\n"
           "  gpt: the zoo's GPT step (AdamW), default 4 layers, width 256, 4 heads, context "
           "256,\n"
           "       batch 4 (bench/peers/gpt_cpu.sh's); --profile: per op kind, then the\n"
           "       products (batch_matmul) per node\n"
           "  --bf16: the CPU's matrix products, direct convolutions and attention tile\n"
           "       products on bf16 operands, fp32 sums (as tp-train --bf16 and\n"
           "       TP_CPU_BF16=1)\n");
}

/* ---- the GPT's step ------------------------------------------------------------ */

typedef struct {
    int layers, width, heads, context, batch; /* the zoo GPT's shape */
    int iters, rounds, threads, fold, profile, json; /* fold: -1 the config's (TP_FOLD) */
} s_gpt_args_t;

/* gpt_cpu.sh's recipe (tp-train's GPT default): AdamW 1e-3, betas 0.9/0.95,
 * decay 0.1 (the clip is the trainer's, not the step's). */
static tp_optimizer_t *s_adamw(void *u) {
    (void)u;
    return tp_optimizer_adamw(1e-3, 0.9, 0.95, 1e-8, 0.1);
}

/* A new GPT model at `threads` threads (caller owns), or NULL, said. */
static tp_model_t *s_gpt_new(const tp_model_desc_t *md, const tp_model_config_t *cfg,
                             int threads) {
    tp_model_config_t c = *cfg;
    c.threads = threads;
    tp_model_t *m = tp_model_new(md, &c);
    if (!m)
        fprintf(stderr, "tp-bench step: the GPT: %s\n", tp_last_error());
    return m;
}

/* The zoo's GPT (models/zoo_gpt.c) at a->'s shape: the fastest of
 * `rounds` rounds of `iters` steps (wall, and the tower thread's CPU
 * time, which a loaded host moves little); with --profile, each op kind's
 * time, FLOPs and fraction of the FP32 peak, and the team table of
 * s_team_table (1-thread profile first, in this run, when T > 1). The
 * tokens are a fixed pattern: a step's cost does not depend on them. */
static int s_gpt_step(const s_gpt_args_t *a) {
    const int B = a->batch, T = a->context;
    tp_zoo_gpt_options_t o;
    memset(&o, 0, sizeof o);
    o.layers = a->layers, o.heads = a->heads, o.embed = a->width;
    tp_input_desc_t desc[2];
    if (tp_zoo_gpt_inputs(T, desc) != TP_OK) {
        fprintf(stderr, "tp-bench step: the GPT's inputs: %s\n", tp_last_error());
        return 2;
    }
    tp_model_desc_t md = {desc, 2, tp_zoo_gpt_build, s_adamw, &o};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = B, cfg.seed = 1;
    if (a->fold >= 0)
        cfg.fold = a->fold;
    int32_t *tok = tp_alloc((size_t)B * T * sizeof(int32_t)); /* [B,T] */
    int32_t *tgt = tp_alloc((size_t)B * T * sizeof(int32_t)); /* [B,T] */
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 37) % 256, tgt[i] = (i * 37 + 11) % 256;
    int64_t sh[2] = {B, T};
    tp_tensor_t x[2];
    tp_tensor_init_wrap(&x[0], TP_INT32, 2, sh, tok, NULL, NULL);
    tp_tensor_init_wrap(&x[1], TP_INT32, 2, sh, tgt, NULL, NULL);
    int rc = 1;
    s_prof_t *p1 = NULL, *pt = NULL, *k1 = NULL, *kt = NULL;
    tp_model_t *m = s_gpt_new(&md, &cfg, a->threads);
    if (!m)
        goto done;
    const int nthreads = tp_backend_cpu_threads(); /* --threads 0: the default's */
    for (int i = 0; i < 2; i++) /* warm-up: the plan, the workspaces, the moments */
        if (tp_model_run(m, 0, x, 2, NULL, 0, NULL) != TP_OK) {
            fprintf(stderr, "tp-bench step: the GPT's step: %s\n", tp_last_error());
            goto done;
        }
    double wall = 0, thr = 0, proc = 0; /* ms a step, each the fastest round's */
    for (int rd = 0; rd < a->rounds; rd++) {
        const uint64_t w0 = tp_now_ns(), t0 = s_clock(CLOCK_THREAD_CPUTIME_ID),
                       p0 = s_clock(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; i < a->iters; i++)
            tp_model_run(m, 0, x, 2, NULL, 0, NULL);
        const double w = (double)(tp_now_ns() - w0) / a->iters / 1e6,
                     t = (double)(s_clock(CLOCK_THREAD_CPUTIME_ID) - t0) / a->iters / 1e6,
                     p = (double)(s_clock(CLOCK_PROCESS_CPUTIME_ID) - p0) / a->iters / 1e6;
        wall = rd == 0 || w < wall ? w : wall;
        thr = rd == 0 || t < thr ? t : thr;
        proc = rd == 0 || p < proc ? p : proc;
    }
    if (a->profile && !a->json) {
        pt = calloc(1, sizeof *pt), kt = calloc(1, sizeof *kt);
        p1 = calloc(1, sizeof *p1), k1 = calloc(1, sizeof *k1);
        if (!pt || !kt || !p1 || !k1) {
            fprintf(stderr, "tp-bench step: out of memory for the profile\n");
            goto done;
        }
        if (nthreads > 1) {
            /* the same step on one thread first; the backend's thread count
             * is the process's, so the T-thread model is made again after */
            tp_model_destroy(&m);
            tp_model_t *m1 = s_gpt_new(&md, &cfg, 1);
            if (!m1)
                goto done;
            tp_model_run(m1, 0, x, 2, NULL, 0, NULL);
            s_profile(m1, x, 2, 1, p1);
            tp_model_destroy(&m1);
            if (!(m = s_gpt_new(&md, &cfg, nthreads)))
                goto done;
            tp_model_run(m, 0, x, 2, NULL, 0, NULL);
        }
        s_profile(m, x, 2, 1, pt);
        if (nthreads > 1) {
            s_by_kind(p1, NULL, k1);
            s_by_kind(pt, k1, kt);
        } else
            s_by_kind(pt, NULL, kt);
        const double peak = s_profile_peak(nthreads);
        printf("GPT per op kind, per step (the one of %d rounds of %d steps with the least "
               "tower-thread CPU; nodes+folded):\n", PROF_ROUNDS, PROF_STEPS);
        s_rate_table(kt, peak, 0);
        s_products_table(m, pt, peak);
        s_team_table("GPT per op kind", kt, nthreads > 1 ? k1 : NULL, nthreads);
    }
    if (a->json)
        printf("{\"bench\":\"step\",\"model\":\"gpt\",\"layers\":%d,\"width\":%d,"
               "\"heads\":%d,\"context\":%d,\"batch\":%d,\"threads\":%d,\"fold\":%d,"
               "\"step_ms\":%.3f,\"thread_cpu_ms\":%.3f,\"process_cpu_ms\":%.3f,"
               "\"tokens_per_s\":%.0f}\n",
               a->layers, a->width, a->heads, T, B, nthreads, cfg.fold, wall, thr, proc,
               wall > 0 ? B * T / wall * 1e3 : 0);
    else
        printf("GPT %d layers, width %d, %d heads, context %d, batch %d, AdamW, folds %s, "
               "%d thread(s): %.2f ms/step (%.0f tokens/s); CPU %.2f ms tower thread, "
               "%.2f ms process (fastest of %d rounds of %d steps)\n",
               a->layers, a->width, a->heads, T, B, cfg.fold ? "on" : "off", nthreads, wall,
               wall > 0 ? B * T / wall * 1e3 : 0, thr, proc, a->rounds, a->iters);
    rc = 0;
done:
    free(p1), free(pt), free(k1), free(kt);
    tp_model_destroy(&m);
    tp_free(tok);
    tp_free(tgt);
    return rc;
}

int tp_bench_step(int argc, char **argv) {
    /* -1: the model's default (the MLP's 5 x 200 at batch 128; the GPT's
     * 2 x 3 at batch 4, gpt_cpu.sh's) */
    int iters = -1, rounds = -1, threads = 1, json = 0, cnn = 1;
    int batch = -1, profile = 0, fold = -1, gpt = 0, gpt_shape = 0, bf16 = -1;
    s_gpt_args_t g = {4, 256, 4, 256, 4, 2, 3, 1, -1, 0, 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            const char *mdl = argv[++i];
            if (strcmp(mdl, "mlp") && strcmp(mdl, "gpt")) {
                fprintf(stderr, "tp-bench step: --model '%s': mlp or gpt\n", mdl);
                return 2;
            }
            gpt = !strcmp(mdl, "gpt");
        } else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            g.layers = atoi(argv[++i]), gpt_shape = 1;
        else if (!strcmp(argv[i], "--width") && i + 1 < argc)
            g.width = atoi(argv[++i]), gpt_shape = 1;
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc)
            g.heads = atoi(argv[++i]), gpt_shape = 1;
        else if (!strcmp(argv[i], "--context") && i + 1 < argc)
            g.context = atoi(argv[++i]), gpt_shape = 1;
        else if (!strcmp(argv[i], "--no-cnn"))
            cnn = 0;
        else if (!strcmp(argv[i], "--no-fold"))
            fold = 0;
        else if (!strcmp(argv[i], "--bf16"))  /* as $TP_CPU_BF16=1 */
            bf16 = 1;
        else if (!strcmp(argv[i], "--profile"))
            profile = 1;
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            s_usage();
            return 0;
        } else {
            fprintf(stderr, "tp-bench step: unknown option '%s'\n", argv[i]);
            s_usage();
            return 2;
        }
    }
    if (gpt_shape && !gpt) {
        fprintf(stderr, "tp-bench step: --layers/--width/--heads/--context shape the GPT: "
                "give --model gpt\n");
        return 2;
    }
    /* the CPU's bf16 products, before any model plans its workspaces */
    tp_backend_cpu_bf16_ask(bf16);
    if (gpt) {
        g.iters = iters < 0 ? g.iters : iters;
        g.rounds = rounds < 0 ? g.rounds : rounds;
        g.batch = batch < 0 ? g.batch : batch;
        g.threads = threads, g.fold = fold, g.profile = profile, g.json = json;
        if (g.iters < 1 || g.rounds < 1 || g.rounds > 1000 || threads < 0 || g.batch < 1 ||
            g.layers < 1 || g.width < 1 || g.heads < 1 || g.width % g.heads ||
            g.context < 1 || g.context > TP_ZOO_GPT_MAX_CONTEXT) {
            fprintf(stderr, "tp-bench step: bad --iters/--rounds/--threads/--batch/--layers/"
                    "--width/--heads/--context for the GPT (the width a multiple of the "
                    "heads, the context 1..%d)\n", TP_ZOO_GPT_MAX_CONTEXT);
            return 2;
        }
        return s_gpt_step(&g);
    }
    iters = iters < 0 ? 5 : iters;
    rounds = rounds < 0 ? 200 : rounds;
    batch = batch < 0 ? 128 : batch;
    if (iters < 1 || rounds < 1 || rounds > 1000 || threads < 0 || batch < 1) {
        fprintf(stderr, "tp-bench step: bad --iters/--rounds/--threads/--batch\n");
        return 2;
    }
    const int B = batch, D = 784, H = 256, C = 10;
    tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, D}},
                               {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_mlp, s_sgd, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = B;
    cfg.threads = threads;
    if (fold >= 0)
        cfg.fold = fold;
    tp_model_t *m = tp_model_new(&md, &cfg);
    if (!m) {
        fprintf(stderr, "tp-bench step: %s\n", tp_last_error());
        return 1;
    }
    float *x = tp_alloc((size_t)B * D * sizeof(float));
    int32_t *y = tp_alloc((size_t)B * sizeof(int32_t));
    /* reference buffers: the same shapes the step uses */
    float *w1 = tp_alloc((size_t)D * H * 4), *w2 = tp_alloc((size_t)H * C * 4);
    float *h = tp_alloc((size_t)B * H * 4), *o = tp_alloc((size_t)B * C * 4);
    float *dw1 = tp_alloc((size_t)D * H * 4), *dw2 = tp_alloc((size_t)H * C * 4);
    float *dh = tp_alloc((size_t)B * H * 4), *dout = tp_alloc((size_t)B * C * 4);
    tp_rng_t r;
    tp_rng_init(&r, 1, 0);
    for (int i = 0; i < B * D; i++)
        x[i] = tp_rng_float(&r);
    for (int i = 0; i < B; i++)
        y[i] = (int32_t)tp_rng_below(&r, (uint64_t)C);
    for (int i = 0; i < D * H; i++)
        w1[i] = tp_rng_float(&r) * 0.01f;
    for (int i = 0; i < H * C; i++)
        w2[i] = tp_rng_float(&r) * 0.01f;
    for (int i = 0; i < B * C; i++)
        dout[i] = tp_rng_float(&r) * 0.01f;
    int64_t xs[2] = {B, D}, ys[1] = {B};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);

    static double t_step[1000], t_ref[1000], t_ratio[1000];
    for (int warm = 0; warm < 20; warm++)
        if (tp_model_run(m, 0, in, 2, NULL, 0, NULL) < 0) {
            fprintf(stderr, "tp-bench step: %s\n", tp_last_error());
            return 1;
        }
    for (int rd = 0; rd < rounds; rd++) {
        uint64_t t0 = tp_now_ns();
        for (int i = 0; i < iters; i++)
            tp_model_run(m, 0, in, 2, NULL, 0, NULL);
        uint64_t t1 = tp_now_ns();
        for (int i = 0; i < iters; i++) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, D, 1.0f,
                        x, D, w1, H, 0.0f, h, H);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, C, H, 1.0f,
                        h, H, w2, C, 0.0f, o, C);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, C, B, 1.0f, h,
                        H, dout, C, 0.0f, dw2, C);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, C, 1.0f,
                        dout, C, w2, C, 0.0f, dh, H);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, H, B, 1.0f, x,
                        D, dh, H, 0.0f, dw1, H);
        }
        uint64_t t2 = tp_now_ns();
        t_step[rd] = (double)(t1 - t0) / iters / 1e3;
        t_ref[rd] = (double)(t2 - t1) / iters / 1e3;
        t_ratio[rd] = t_step[rd] / t_ref[rd];
    }
    /* Adjacent step and reference runs see the same load from other work
     * on the machine: the median of their per-round ratios is the robust
     * figure; the times are each side's fastest round. */
    double step_us = s_min(t_step, rounds), ref_us = s_min(t_ref, rounds);
    double ratio = tp_bench_median(t_ratio, rounds);

    double cnn_ms = 0;
    if (cnn) {
        tp_input_desc_t cdesc[2] = {{"image", TP_UINT8, 3, {-1, 28, 28}},
                                    {"label", TP_INT32, 1, {-1}}};
        tp_model_desc_t cmd = {cdesc, 2, s_cnn, s_sgd, NULL};
        uint8_t *img = tp_alloc((size_t)B * 784);
        for (int i = 0; i < B * 784; i++)
            img[i] = (uint8_t)tp_rng_below(&r, 256);
        int64_t is[3] = {B, 28, 28};
        tp_tensor_t cin[2];
        tp_tensor_init_wrap(&cin[0], TP_UINT8, 3, is, img, NULL, NULL);
        cin[1] = in[1];
        /* --profile at T > 1 threads: the same ops on one thread first, in
         * this run, for the team table (the thread count is the process's:
         * the T-thread model made after it sets T again) */
        s_prof_t *p1 = NULL;
        if (profile && !json && tp_backend_cpu_threads() > 1 && (p1 = calloc(1, sizeof *p1))) {
            tp_model_config_t c1 = cfg;
            c1.threads = 1;
            tp_model_t *m1 = tp_model_new(&cmd, &c1);
            if (m1) {
                tp_model_run(m1, 0, cin, 2, NULL, 0, NULL);
                s_profile(m1, cin, 2, 0, p1);
                tp_model_destroy(&m1);
            } else {
                free(p1);
                p1 = NULL;
            }
        }
        tp_model_t *cm = tp_model_new(&cmd, &cfg);
        if (!cm) {
            fprintf(stderr, "tp-bench step: %s\n", tp_last_error());
            return 1;
        }
        tp_model_run(cm, 0, cin, 2, NULL, 0, NULL);
        int citers = 3;
        double tc[5];
        int crounds = 5;
        for (int rd = 0; rd < crounds; rd++) {
            uint64_t t0 = tp_now_ns();
            for (int i = 0; i < citers; i++)
                tp_model_run(cm, 0, cin, 2, NULL, 0, NULL);
            tc[rd] = (double)(tp_now_ns() - t0) / citers / 1e6;
        }
        cnn_ms = s_min(tc, crounds);
        if (profile && !json) {
            s_prof_t *pt = calloc(1, sizeof *pt);
            if (!pt) {
                fprintf(stderr, "tp-bench step: out of memory for the profile\n");
                return 1;
            }
            s_profile(cm, cin, 2, 0, pt);
            const int pthreads = tp_backend_cpu_threads();
            const double peak = s_profile_peak(pthreads);
            printf("CNN per op, per step (fastest of %d rounds of %d steps):\n", PROF_ROUNDS,
                   PROF_STEPS);
            s_rate_table(pt, peak, 1);
            s_team_table("CNN per op", pt, p1, pthreads);
            free(pt);
        }
        free(p1);
        tp_free(img);
        tp_model_destroy(&cm);
    }
    int nthreads = tp_backend_cpu_threads();
    if (json) {
        printf("{\"bench\":\"step\",\"batch\":%d,\"threads\":%d,"
               "\"mlp_step_us\":%.1f,\"sgemm_us\":%.1f,\"ratio\":%.3f,"
               "\"goal\":1.3,\"cnn_step_ms\":%.2f}\n",
               B, nthreads, step_us, ref_us, ratio, cnn_ms);
    } else {
        printf("MLP 784-256-10, batch %d, %d OpenBLAS thread(s)\n", B, nthreads);
        printf("  step (fwd+bwd+update)  %9.1f us\n", step_us);
        printf("  raw sgemm x5           %9.1f us\n", ref_us);
        printf("  ratio                  %9.3f  (goal <= 1.3)%s\n", ratio,
               tp_backend_cpu_bf16_ask(-1) ? ": the step's products bf16, the sgemm's fp32"
                                           : "");
        if (cnn)
            printf("CNN conv32-pool-conv64-pool-fc128-fc10, batch %d: %.2f ms/step "
                   "(%.0f images/s)\n",
                   B, cnn_ms, B / cnn_ms * 1e3);
    }
    tp_free(x);
    tp_free(y);
    tp_free(w1);
    tp_free(w2);
    tp_free(h);
    tp_free(o);
    tp_free(dw1);
    tp_free(dw2);
    tp_free(dh);
    tp_free(dout);
    tp_model_destroy(&m);
    return ratio <= 1.3 ? 0 : 3;
}
