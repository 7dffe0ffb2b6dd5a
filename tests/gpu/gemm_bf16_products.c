/* towerpack bench (white-box, not a test): the GPT step's bf16 products
 * one by one (issue 45), the two ways dnnl_matmul.c runs them under
 * TP_CPU_BF16=1, one thread:
 *   dnnl  both operands rounded into buffers (tp_cpu_f32_to_bf16), then
 *         oneDNN's bf16 matmul on them through strides (TP_CPU_GEMM=dnnl)
 *   ours  tp_gemm_bf16 (gpu/cpu/cpu_gemm_bf16.c), whose rounding writes
 *         its packed layout (the default)
 * each call's conversion timed with it; GF/s against the bf16 peak (one
 * VDPBF16PS zmm a cycle, 235.6 GF/s on this project's Zen 4), and the
 * largest difference between the two outputs. The shapes and the timing
 * are bench/gpt_products.c's (one block of gpt_cpu.sh's model, R 1,024,
 * C 256, V 256; the thread's CPU time; ROUNDS rounds of REPS calls, the
 * two alternated within a round, medians). It lives here, not in bench/,
 * because it calls the CPU backend's private headers, which only gpu/ and
 * its white-box tests may include (scripts/check-layout.sh); the
 * bench/CMakeLists.txt target `gemm_bf16_products` builds it:
 *
 *   cmake --build build --target gemm_bf16_products
 *   OMP_WAIT_POLICY=passive build/bench/gemm_bf16_products [--rounds N]
 *      [--reps N] [R C V] */
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/cpu/cpu_bf16.h"
#include "gpu/cpu/cpu_gemm_bf16.h"
#include "gpu/cpu/cpu_pool.h"

enum { MAXR = 64 };
static const double S_PEAK = 235.6; /* GF/s, docs/performance.md (branch bf16gemm) */

static dnnl_engine_t s_eng;
static dnnl_stream_t s_str;

static void s_die(const char *what) {
    fprintf(stderr, "gemm-bf16-products: %s failed\n", what);
    exit(1);
}

static double s_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int s_cmp(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double s_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* values in [-0.5, 0.5) (no denormals) */
static float *s_fill(size_t n) {
    float *p = malloc(n * sizeof *p);
    if (!p)
        s_die("malloc");
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
    return p;
}

/* [rows, cols] of dt, row-major with leading dimension ld, or (tr) its
 * transpose's storage, as dnnl_matmul.c describes its operands */
static dnnl_memory_desc_t s_md(long rows, long cols, long ld, int tr, dnnl_data_type_t dt) {
    dnnl_memory_desc_t md;
    dnnl_dims_t d = {rows, cols}, s = {tr ? 1 : ld, tr ? ld : 1};
    if (dnnl_memory_desc_init_by_strides(&md, 2, d, dt, s) != dnnl_success)
        s_die("dnnl_memory_desc_init_by_strides");
    return md;
}

typedef struct {
    dnnl_primitive_t p;
    dnnl_memory_desc_t md[4]; /* a, b, c, scratchpad */
    void *pad;
} s_prim_t;

/* oneDNN's bf16 C[m,n] (fp32) = op(A) op(B) (both bf16), a user scratchpad */
static s_prim_t s_make(long m, long n, long k, int ta, int tb) {
    s_prim_t P;
    P.md[0] = s_md(m, k, ta ? m : k, ta, dnnl_bf16);
    P.md[1] = s_md(k, n, tb ? k : n, tb, dnnl_bf16);
    P.md[2] = s_md(m, n, n, 0, dnnl_f32);
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t at;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&d, &P.md[0], &P.md[1], NULL, &P.md[2]) != dnnl_success ||
        dnnl_primitive_attr_create(&at) != dnnl_success ||
        dnnl_primitive_attr_set_scratchpad_mode(at, dnnl_scratchpad_mode_user) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, at, s_eng, NULL) != dnnl_success)
        s_die("the bf16 matmul primitive");
    P.md[3] = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    P.pad = malloc(dnnl_memory_desc_get_size(&P.md[3]) + 64);
    if (!P.pad || dnnl_primitive_create(&P.p, pd) != dnnl_success)
        s_die("dnnl_primitive_create");
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(at);
    return P;
}

static void s_run(const s_prim_t *P, const void *a, const void *b, float *c) {
    static const int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST,
                               DNNL_ARG_SCRATCHPAD};
    void *ptr[4] = {(void *)a, (void *)b, c, P->pad};
    dnnl_memory_t mem[4];
    dnnl_exec_arg_t ex[4];
    for (int i = 0; i < 4; i++) {
        if (dnnl_memory_create(&mem[i], &P->md[i], s_eng, ptr[i]) != dnnl_success)
            s_die("dnnl_memory_create");
        ex[i] = (dnnl_exec_arg_t){arg[i], mem[i]};
    }
    if (dnnl_primitive_execute(P->p, s_str, 4, ex) != dnnl_success ||
        dnnl_stream_wait(s_str) != dnnl_success)
        s_die("dnnl_primitive_execute");
    for (int i = 0; i < 4; i++)
        dnnl_memory_destroy(mem[i]);
}

int main(int argc, char **argv) {
    int rounds = 7, reps = 10, ai = 1;
    for (; ai + 1 < argc && argv[ai][0] == '-'; ai += 2) {
        if (!strcmp(argv[ai], "--rounds"))
            rounds = atoi(argv[ai + 1]);
        else if (!strcmp(argv[ai], "--reps"))
            reps = atoi(argv[ai + 1]);
    }
    const long R = ai < argc ? atol(argv[ai]) : 1024, C = ai + 1 < argc ? atol(argv[ai + 1]) : 256,
               V = ai + 2 < argc ? atol(argv[ai + 2]) : 256;
    if (rounds < 1 || rounds > MAXR || reps < 1 || R < 1 || C < 1 || V < 1) {
        fprintf(stderr, "usage: gemm-bf16-products [--rounds 1-%d] [--reps N] [R C V]\n", MAXR);
        return 2;
    }
    if (!tp_gemm_bf16_ok()) {
        fprintf(stderr, "gemm-bf16-products: this CPU has no AVX512_BF16\n");
        return 1;
    }
    tp_cpu_threads_set(1);
    omp_set_num_threads(1); /* oneDNN's OpenMP team */
    if (dnnl_engine_create(&s_eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&s_str, s_eng, dnnl_stream_default_flags) != dnnl_success)
        s_die("the oneDNN engine");
    /* bench/gpt_products.c's products: name, m, n, k, ta, tb (C = op(A) op(B)) */
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
    printf("bf16 products, R %ld, C %ld, V %ld, 1 thread; %d rounds of %d calls, medians; "
           "us a call; ratio = dnnl / ours\n",
           R, C, V, rounds, reps);
    printf("%-11s | %8s %6s %5s | %8s %6s %5s | %6s | %s\n", "product", "dnnl", "GF/s", "peak",
           "ours", "GF/s", "peak", "ratio", "max |diff| / max |c|");
    double tot[2] = {0};
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        const long m = sh[i].m, n = sh[i].n, k = sh[i].k;
        const int ta = sh[i].ta, tb = sh[i].tb;
        float *A = s_fill((size_t)(m * k)), *B = s_fill((size_t)(k * n));
        float *c1 = s_fill((size_t)(m * n)), *c2 = s_fill((size_t)(m * n));
        uint16_t *a16 = malloc((size_t)(m * k) * 2), *b16 = malloc((size_t)(k * n) * 2);
        void *room = malloc(tp_gemm_bf16_room_bytes((size_t)m, (size_t)n, (size_t)k));
        if (!a16 || !b16 || !room)
            s_die("malloc");
        const s_prim_t P = s_make(m, n, k, ta, tb);
        const tp_gemm_bf16_t g = {(size_t)m, (size_t)n, (size_t)k, A, (size_t)(ta ? m : k),
                                  ta, B, (size_t)(tb ? k : n), tb, c2, (size_t)n, NULL, 0,
                                  room};
        double v[2][MAXR];
        for (int r = 0; r < rounds; r++) {
            double t0 = s_cpu();
            for (int j = 0; j < reps; j++) {
                tp_cpu_f32_to_bf16(a16, A, (size_t)(m * k));
                tp_cpu_f32_to_bf16(b16, B, (size_t)(k * n));
                s_run(&P, a16, b16, c1);
            }
            v[0][r] = (s_cpu() - t0) / reps;
            t0 = s_cpu();
            for (int j = 0; j < reps; j++)
                tp_gemm_bf16(&g);
            v[1][r] = (s_cpu() - t0) / reps;
        }
        double diff = 0, big = 0;
        for (long e = 0; e < m * n; e++) {
            const double d = c1[e] > c2[e] ? c1[e] - c2[e] : c2[e] - c1[e];
            const double a = c1[e] > 0 ? c1[e] : -c1[e];
            diff = d > diff ? d : diff;
            big = a > big ? a : big;
        }
        const double md = s_median(v[0], rounds), mo = s_median(v[1], rounds);
        const double f = 2.0 * (double)m * (double)n * (double)k * 1e-9;
        tot[0] += md;
        tot[1] += mo;
        printf("%-11s | %8.0f %6.1f %4.0f%% | %8.0f %6.1f %4.0f%% | %6.3f | %.2g\n", sh[i].name,
               md * 1e6, f / md, 100 * f / md / S_PEAK, mo * 1e6, f / mo,
               100 * f / mo / S_PEAK, md / mo, big > 0 ? diff / big : diff);
        free(A), free(B), free(c1), free(c2), free(a16), free(b16), free(room), free(P.pad);
        dnnl_primitive_destroy(P.p);
    }
    printf("%-11s | %8.0f %6s %5s | %8.0f %6s %5s | %6.3f\n", "sum", tot[0] * 1e6, "", "",
           tot[1] * 1e6, "", "", tot[0] / tot[1]);
    return 0;
}
