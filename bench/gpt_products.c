/* towerpack bench: the GPT step's matrix products one by one (issue 45),
 * each as the CPU backend runs it (oneDNN's matmul with dnnl_matmul.c's
 * strided layouts) against OpenBLAS's sgemm, and at 2 threads against a
 * split of M done by hand (two 1-thread primitives under one OpenMP
 * region): which product, if any, is far from the FMA peak, and whether
 * another route or thread split would be faster.
 *
 * The products of one block of bench/peers/gpt_cpu.sh's model (rows R =
 * batch x context = 1,024, width C = 256, vocabulary V = 256) and of the
 * tied logits, each pass the way ops_linalg.c / dnnl_matmul.c hand it to
 * oneDNN: forward y = x W, data gradient dX = dy W^T (W read through
 * strides), weight gradient dW = x^T dy (x read through strides); the
 * logits' x wte^T (wte read through strides) and its two gradients.
 * The operands hold values in [-0.5, 0.5) (uninitialised buffers can hold
 * denormals, which slow a product by 15%: a mistake made once here).
 *
 * Per product and route, ROUNDS rounds of REPS calls each, the routes
 * alternated within a round; a row prints the rounds' median:
 *   1 thread: the calling thread's CPU time (a loaded host moves it little)
 *   2 threads: the wall time (read it on a quiet host only) and the
 *   process's CPU time (the work the split costs, spin waits excluded
 *   under OMP_WAIT_POLICY=passive)
 * and GFLOPS at the 1-thread CPU time. The last column says whether
 * oneDNN's 2-thread result and the M split's are the 1-thread result bit
 * for bit.
 *
 * OpenBLAS is the OpenMP build, as towerpack links it (the default
 * pthread build's idle threads spin beside oneDNN's OpenMP team and
 * make the 2-thread rows two to ten times slower); bench/CMakeLists.txt
 * links it so:
 *
 *   cmake --build build --target gpt_products
 *   OMP_WAIT_POLICY=passive build/bench/gpt_products [--rounds N] [--reps N]
 *      [R C V] */
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double s_clock(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static dnnl_engine_t s_eng;
static dnnl_stream_t s_str[2];

static void s_die(const char *what) {
    fprintf(stderr, "bench-gpt-products: %s failed\n", what);
    exit(1);
}

/* [rows, cols] with leading dimension ld, or (tr) its transpose's storage */
static void s_md(dnnl_memory_desc_t *md, long rows, long cols, long ld, int tr) {
    dnnl_dims_t d = {rows, cols}, s = {ld, 1};
    if (tr) {
        s[0] = 1;
        s[1] = ld;
    }
    if (dnnl_memory_desc_init_by_strides(md, 2, d, dnnl_f32, s) != dnnl_success)
        s_die("dnnl_memory_desc_init_by_strides");
}

typedef struct {
    dnnl_primitive_t p;
    dnnl_memory_desc_t a, b, c, s;
    void *pad[2]; /* a scratchpad per OpenMP thread of the M split */
} s_prim_t;

/* C[m,n] = op(A)[m,k] op(B)[k,n], made under the current thread count */
static s_prim_t s_make(long m, long n, long k, long lda, long ldb, int ta, int tb) {
    s_prim_t P;
    s_md(&P.a, m, k, lda, ta);
    s_md(&P.b, k, n, ldb, tb);
    s_md(&P.c, m, n, n, 0);
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t at;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&d, &P.a, &P.b, NULL, &P.c) != dnnl_success ||
        dnnl_primitive_attr_create(&at) != dnnl_success ||
        dnnl_primitive_attr_set_scratchpad_mode(at, dnnl_scratchpad_mode_user) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, at, s_eng, NULL) != dnnl_success)
        s_die("the matmul primitive");
    P.s = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    for (int i = 0; i < 2; i++)
        P.pad[i] = malloc(dnnl_memory_desc_get_size(&P.s) + 64);
    if (dnnl_primitive_create(&P.p, pd) != dnnl_success)
        s_die("dnnl_primitive_create");
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(at);
    return P;
}

static void s_run(const s_prim_t *P, int t, const float *a, const float *b, float *c) {
    dnnl_memory_t m[4];
    const dnnl_memory_desc_t *md[4] = {&P->a, &P->b, &P->c, &P->s};
    void *ptr[4] = {(void *)a, (void *)b, c, P->pad[t]};
    const int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t ex[4];
    for (int i = 0; i < 4; i++) {
        if (dnnl_memory_create(&m[i], md[i], s_eng, ptr[i]) != dnnl_success)
            s_die("dnnl_memory_create");
        ex[i] = (dnnl_exec_arg_t){arg[i], m[i]};
    }
    if (dnnl_primitive_execute(P->p, s_str[t], 4, ex) != dnnl_success ||
        dnnl_stream_wait(s_str[t]) != dnnl_success)
        s_die("dnnl_primitive_execute");
    for (int i = 0; i < 4; i++)
        dnnl_memory_destroy(m[i]);
}

static float *s_fill(size_t n) {
    float *p = malloc(n * sizeof *p);
    if (!p)
        s_die("malloc");
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
    return p;
}

static int s_cmp(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double s_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

enum { MAXR = 64, NROUTES = 8 };

int main(int argc, char **argv) {
    int rounds = 7, reps = 10, ai = 1;
    for (; ai < argc && argv[ai][0] == '-'; ai += 2) {
        if (ai + 1 >= argc)
            break;
        if (!strcmp(argv[ai], "--rounds"))
            rounds = atoi(argv[ai + 1]);
        else if (!strcmp(argv[ai], "--reps"))
            reps = atoi(argv[ai + 1]);
    }
    const long R = ai < argc ? atol(argv[ai]) : 1024, C = ai + 1 < argc ? atol(argv[ai + 1]) : 256,
               V = ai + 2 < argc ? atol(argv[ai + 2]) : 256;
    if (rounds < 1 || rounds > MAXR || reps < 1 || R < 2 || C < 1 || V < 1) {
        fprintf(stderr, "usage: bench-gpt-products [--rounds 1-%d] [--reps N] [R C V]\n", MAXR);
        return 2;
    }
    if (dnnl_engine_create(&s_eng, dnnl_cpu, 0) != dnnl_success)
        s_die("dnnl_engine_create");
    for (int i = 0; i < 2; i++)
        if (dnnl_stream_create(&s_str[i], s_eng, dnnl_stream_default_flags) != dnnl_success)
            s_die("dnnl_stream_create");
    /* name, m, n, k, ta, tb (C[m,n] = op(A) op(B)) */
    const struct {
        const char *name;
        long m, n, k;
        int ta, tb;
    } sh[] = {
        {"qkv fwd", R, 3 * C, C, 0, 0},      {"qkv dX", R, C, 3 * C, 0, 1},
        {"qkv dW", C, 3 * C, R, 1, 0},       {"proj fwd", R, C, C, 0, 0},
        {"proj dX", R, C, C, 0, 1},          {"proj dW", C, C, R, 1, 0},
        {"fc fwd", R, 4 * C, C, 0, 0},       {"fc dX", R, C, 4 * C, 0, 1},
        {"fc dW", C, 4 * C, R, 1, 0},        {"fcproj fwd", R, C, 4 * C, 0, 0},
        {"fcproj dX", R, 4 * C, C, 0, 1},    {"fcproj dW", 4 * C, C, R, 1, 0},
        {"logits fwd", R, V, C, 0, 1},       {"logits dX", R, C, V, 0, 0},
        {"logits dW", V, C, R, 1, 0},
    };
    const int nsh = (int)(sizeof sh / sizeof sh[0]);
    printf("R %ld, C %ld, V %ld; %d rounds of %d calls, medians; us a call\n", R, C, V, rounds,
           reps);
    printf("%-11s | %8s %6s %8s %6s | %8s %8s %8s %8s %8s %8s | %s\n", "product", "dnnl@1",
           "GF/s", "blas@1", "GF/s", "dnnl@2", "cpu", "blas@2", "cpu", "split@2", "cpu",
           "bits@2 dnnl,split");
    double tot[NROUTES] = {0};
    for (int i = 0; i < nsh; i++) {
        const long m = sh[i].m, n = sh[i].n, k = sh[i].k;
        const int ta = sh[i].ta, tb = sh[i].tb;
        const long lda = ta ? m : k, ldb = tb ? k : n, half = m / 2;
        float *A = s_fill((size_t)(m * k)), *B = s_fill((size_t)(k * n));
        float *c1 = s_fill((size_t)(m * n)), *c2 = s_fill((size_t)(m * n)),
              *cs = s_fill((size_t)(m * n)), *cb = s_fill((size_t)(m * n));
        omp_set_num_threads(1);
        s_prim_t one = s_make(m, n, k, lda, ldb, ta, tb);
        s_prim_t lo = s_make(half, n, k, lda, ldb, ta, tb),
                 hi = s_make(m - half, n, k, lda, ldb, ta, tb);
        omp_set_num_threads(2);
        s_prim_t two = s_make(m, n, k, lda, ldb, ta, tb);
        double v[NROUTES][MAXR];
        for (int r = 0; r < rounds; r++) {
            double t0, w0, p0;
            omp_set_num_threads(1);
            openblas_set_num_threads(1);
            t0 = s_clock(CLOCK_THREAD_CPUTIME_ID);
            for (int j = 0; j < reps; j++)
                s_run(&one, 0, A, B, c1);
            v[0][r] = (s_clock(CLOCK_THREAD_CPUTIME_ID) - t0) / reps;
            t0 = s_clock(CLOCK_THREAD_CPUTIME_ID);
            for (int j = 0; j < reps; j++)
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, A,
                            (int)lda, B, (int)ldb, 0.0f, cb, (int)n);
            v[1][r] = (s_clock(CLOCK_THREAD_CPUTIME_ID) - t0) / reps;
            omp_set_num_threads(2);
            openblas_set_num_threads(2);
            w0 = s_clock(CLOCK_MONOTONIC), p0 = s_clock(CLOCK_PROCESS_CPUTIME_ID);
            for (int j = 0; j < reps; j++)
                s_run(&two, 0, A, B, c2);
            v[2][r] = (s_clock(CLOCK_MONOTONIC) - w0) / reps;
            v[3][r] = (s_clock(CLOCK_PROCESS_CPUTIME_ID) - p0) / reps;
            w0 = s_clock(CLOCK_MONOTONIC), p0 = s_clock(CLOCK_PROCESS_CPUTIME_ID);
            for (int j = 0; j < reps; j++)
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, A,
                            (int)lda, B, (int)ldb, 0.0f, cb, (int)n);
            v[4][r] = (s_clock(CLOCK_MONOTONIC) - w0) / reps;
            v[5][r] = (s_clock(CLOCK_PROCESS_CPUTIME_ID) - p0) / reps;
            w0 = s_clock(CLOCK_MONOTONIC), p0 = s_clock(CLOCK_PROCESS_CPUTIME_ID);
            for (int j = 0; j < reps; j++) {
#pragma omp parallel num_threads(2)
                {
                    /* each thread a 1-thread primitive on its half of the rows
                     * (oneDNN runs serially inside a parallel region) */
                    const int t = omp_get_thread_num();
                    const long off = t ? half : 0;
                    s_run(t ? &hi : &lo, t, ta ? A + off : A + off * k, B, cs + off * n);
                }
            }
            v[6][r] = (s_clock(CLOCK_MONOTONIC) - w0) / reps;
            v[7][r] = (s_clock(CLOCK_PROCESS_CPUTIME_ID) - p0) / reps;
        }
        double med[NROUTES];
        for (int q = 0; q < NROUTES; q++) {
            med[q] = s_median(v[q], rounds);
            tot[q] += med[q];
        }
        const double f = 2.0 * (double)m * (double)n * (double)k * 1e-9;
        printf("%-11s | %8.0f %6.1f %8.0f %6.1f | %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f | %d,%d\n",
               sh[i].name, med[0] * 1e6, f / med[0], med[1] * 1e6, f / med[1], med[2] * 1e6,
               med[3] * 1e6, med[4] * 1e6, med[5] * 1e6, med[6] * 1e6, med[7] * 1e6,
               !memcmp(c1, c2, (size_t)(m * n) * sizeof(float)),
               !memcmp(c1, cs, (size_t)(m * n) * sizeof(float)));
        free(A), free(B), free(c1), free(c2), free(cs), free(cb);
    }
    printf("%-11s | %8.0f %6s %8.0f %6s | %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f\n", "sum",
           tot[0] * 1e6, "", tot[1] * 1e6, "", tot[2] * 1e6, tot[3] * 1e6, tot[4] * 1e6,
           tot[5] * 1e6, tot[6] * 1e6, tot[7] * 1e6);
    return 0;
}
