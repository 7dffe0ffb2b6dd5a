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
 *   OMP_WAIT_POLICY=passive build/bench/gpt_products [--variants] [--rounds N]
 *      [--reps N] [R C V]
 *
 * --variants: instead of the routes, the other forms of each product that
 * oneDNN 2.6's API allows, 1 thread, against today's form (s_variants). */
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

/* The primitive of C = A B on the layouts in P (a layout of format
 * `any` comes back as the one the primitive chose), with a sum post-op
 * when sum (C += A B), made under the current thread count; *impl (when
 * given) its implementation's name. */
static void s_make_mds(s_prim_t *P, int sum, const char **impl) {
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t at;
    dnnl_primitive_desc_t pd;
    dnnl_post_ops_t po = NULL;
    if (dnnl_matmul_desc_init(&d, &P->a, &P->b, NULL, &P->c) != dnnl_success ||
        dnnl_primitive_attr_create(&at) != dnnl_success ||
        dnnl_primitive_attr_set_scratchpad_mode(at, dnnl_scratchpad_mode_user) != dnnl_success)
        s_die("the matmul descriptor");
    if (sum && (dnnl_post_ops_create(&po) != dnnl_success ||
                dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success ||
                dnnl_primitive_attr_set_post_ops(at, po) != dnnl_success))
        s_die("the sum post-op");
    if (dnnl_primitive_desc_create(&pd, &d, at, s_eng, NULL) != dnnl_success)
        s_die("the matmul primitive");
    if (po)
        dnnl_post_ops_destroy(po);
    P->a = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    P->b = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    P->c = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    P->s = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (impl) {
        const char *name = "?";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
        *impl = name; /* a static string of the library's */
    }
    for (int i = 0; i < 2; i++)
        P->pad[i] = malloc(dnnl_memory_desc_get_size(&P->s) + 64);
    if (dnnl_primitive_create(&P->p, pd) != dnnl_success)
        s_die("dnnl_primitive_create");
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(at);
}

/* C[m,n] = op(A)[m,k] op(B)[k,n], made under the current thread count */
static s_prim_t s_make(long m, long n, long k, long lda, long ldb, int ta, int tb) {
    s_prim_t P;
    s_md(&P.a, m, k, lda, ta);
    s_md(&P.b, k, n, ldb, tb);
    s_md(&P.c, m, n, n, 0);
    s_make_mds(&P, 0, NULL);
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

enum { MAXR = 64, NROUTES = 8, NVAR = 5 };

/* [1, rows, cols] with leading dimension ld, or (tr) its transpose's
 * storage: a batch of one, as batch_matmul's batched route hands it */
static void s_md1(dnnl_memory_desc_t *md, long rows, long cols, long ld, int tr) {
    dnnl_dims_t d = {1, rows, cols}, s = {rows * cols, ld, 1};
    if (tr) {
        s[1] = 1;
        s[2] = ld;
    }
    if (dnnl_memory_desc_init_by_strides(md, 3, d, dnnl_f32, s) != dnnl_success)
        s_die("dnnl_memory_desc_init_by_strides");
}

/* [rows, cols] of format `any`: the primitive's choice */
static void s_md_any(dnnl_memory_desc_t *md, long rows, long cols) {
    dnnl_dims_t d = {rows, cols};
    if (dnnl_memory_desc_init_by_tag(md, 2, d, dnnl_f32, dnnl_format_tag_any) != dnnl_success)
        s_die("dnnl_memory_desc_init_by_tag");
}

/* dst = src in dst's layout (a oneDNN reorder), timed by the caller */
static void s_reorder(const dnnl_memory_desc_t *from, const void *src,
                      const dnnl_memory_desc_t *to, void *dst) {
    static dnnl_primitive_t p;
    static dnnl_memory_desc_t last_from, last_to;
    if (!p || !dnnl_memory_desc_equal(from, &last_from) || !dnnl_memory_desc_equal(to, &last_to)) {
        dnnl_primitive_desc_t pd;
        if (p)
            dnnl_primitive_destroy(p);
        if (dnnl_reorder_primitive_desc_create(&pd, from, s_eng, to, s_eng, NULL) != dnnl_success ||
            dnnl_primitive_create(&p, pd) != dnnl_success)
            s_die("the reorder");
        dnnl_primitive_desc_destroy(pd);
        last_from = *from, last_to = *to;
    }
    dnnl_memory_t m[2];
    if (dnnl_memory_create(&m[0], from, s_eng, (void *)src) != dnnl_success ||
        dnnl_memory_create(&m[1], to, s_eng, dst) != dnnl_success)
        s_die("dnnl_memory_create");
    dnnl_exec_arg_t ex[2] = {{DNNL_ARG_FROM, m[0]}, {DNNL_ARG_TO, m[1]}};
    if (dnnl_primitive_execute(p, s_str[0], 2, ex) != dnnl_success ||
        dnnl_stream_wait(s_str[0]) != dnnl_success)
        s_die("the reorder's execute");
    dnnl_memory_destroy(m[0]);
    dnnl_memory_destroy(m[1]);
}

/* --variants: the other forms oneDNN 2.6's API allows for each product,
 * 1 thread, against today's form in the same rounds (issue 45, branch
 * gpt13). The weights' gradient dW[m,n] = x^T dy (x stored [R,m], dy
 * [R,n]):
 *   today    x^T through strides, dy plain
 *   xT kept  x^T stored plain (as if the forward had kept it transposed)
 *   K split  two products over R/2 rows each, the second adding (sum post-op)
 *   dW^T+T   dW^T = dy^T x (dy^T through strides: the transposed copy
 *            oneDNN makes is of dy, not x), then dW^T transposed into dW
 *            by a reorder (written through a transposed destination
 *            instead, oneDNN 2.6 runs its reference kernel, ~1,000x slower)
 *   batch of 1  today's product as batch_matmul's batched route makes
 *            it: 3-D layouts with one batch
 * the forward y = x W and the data's gradient dX = dy W^T:
 *   today    W plain (forward) or through strides (dX)
 *   W any    W in the primitive's own layout (reordered once per update:
 *            the reorder's time is its own column)
 * Each variant's time is the median of the rounds' means; "bits" says
 * whether its result is today's bit for bit. */
static int s_variants(long R, long C, long V, int rounds, int reps) {
    const struct {
        const char *name;
        long m, n; /* dW [m, n] (x [R, m], dy [R, n]); fwd/dX: W [m, n] */
        int dw;    /* 1: the weights' gradient; 0: the forward and dX of W */
    } sh[] = {
        {"qkv", C, 3 * C, 1}, {"proj", C, C, 1},     {"fc", C, 4 * C, 1},
        {"fcproj", 4 * C, C, 1}, {"logits", V, C, 1}, {"qkv", C, 3 * C, 0},
        {"proj", C, C, 0},    {"fc", C, 4 * C, 0}, {"fcproj", 4 * C, C, 0},
    };
    omp_set_num_threads(1);
    printf("R %ld, C %ld, V %ld; %d rounds of %d calls, 1 thread, medians; us a call "
           "(GF/s), bits = today's\n", R, C, V, rounds, reps);
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        const long m = sh[i].m, n = sh[i].n, h = R / 2;
        const char *names[NVAR] = {0}, *impl[NVAR] = {0};
        s_prim_t P[NVAR + 1];
        int nv = 0;
        float *x = s_fill((size_t)(R * m)), *dy = s_fill((size_t)(R * n)),
              *xt = s_fill((size_t)(R * m)), *w = s_fill((size_t)(m * n)),
              *tmp = s_fill((size_t)(m * n)); /* dW^T before its transpose */
        float *out[NVAR], *blk = NULL;
        size_t osz = (size_t)(sh[i].dw ? m * n : R * (m > n ? m : n));
        for (int v = 0; v < NVAR; v++)
            out[v] = s_fill(osz);
        for (long r = 0; r < R; r++) /* xt: x's transpose, stored */
            for (long j = 0; j < m; j++)
                xt[j * R + r] = x[r * m + j];
        double t[NVAR][MAXR], treo[MAXR];
        dnnl_memory_desc_t plain_b, tr_from, tr_to, x_plain, x_tr;
        s_md(&x_plain, R, m, m, 0), s_md(&x_tr, R, m, R, 1);
        if (sh[i].dw) {
            names[0] = "today", names[1] = "xT kept", names[2] = "K split", names[3] = "dW^T+T",
            names[4] = "batch of 1";
            nv = 5;
            s_md(&P[0].a, m, R, m, 1), s_md(&P[0].b, R, n, n, 0), s_md(&P[0].c, m, n, n, 0);
            s_make_mds(&P[0], 0, &impl[0]);
            s_md(&P[1].a, m, R, R, 0), s_md(&P[1].b, R, n, n, 0), s_md(&P[1].c, m, n, n, 0);
            s_make_mds(&P[1], 0, &impl[1]);
            s_md(&P[2].a, m, h, m, 1), s_md(&P[2].b, h, n, n, 0), s_md(&P[2].c, m, n, n, 0);
            s_make_mds(&P[2], 0, &impl[2]);
            s_md(&P[NVAR].a, m, R - h, m, 1), s_md(&P[NVAR].b, R - h, n, n, 0);
            s_md(&P[NVAR].c, m, n, n, 0);
            s_make_mds(&P[NVAR], 1, NULL);
            s_md(&P[3].a, n, R, n, 1), s_md(&P[3].b, R, m, m, 0), s_md(&P[3].c, n, m, m, 0);
            s_make_mds(&P[3], 0, &impl[3]);
            s_md(&tr_from, n, m, m, 0), s_md(&tr_to, n, m, n, 1);
            s_md1(&P[4].a, m, R, m, 1), s_md1(&P[4].b, R, n, n, 0), s_md1(&P[4].c, m, n, n, 0);
            s_make_mds(&P[4], 0, &impl[4]);
        } else {
            /* forward y[R,n] = x[R,m] W[m,n]; dX[R,m] = dy[R,n] W^T */
            names[0] = "fwd", names[1] = "fwd W any", names[2] = "dX", names[3] = "dX W any";
            nv = 4;
            s_md(&P[0].a, R, m, m, 0), s_md(&P[0].b, m, n, n, 0), s_md(&P[0].c, R, n, n, 0);
            s_make_mds(&P[0], 0, &impl[0]);
            s_md(&P[1].a, R, m, m, 0), s_md_any(&P[1].b, m, n), s_md(&P[1].c, R, n, n, 0);
            s_make_mds(&P[1], 0, &impl[1]);
            s_md(&P[2].a, R, n, n, 0), s_md(&P[2].b, n, m, n, 1), s_md(&P[2].c, R, m, m, 0);
            s_make_mds(&P[2], 0, &impl[2]);
            s_md(&P[3].a, R, n, n, 0), s_md_any(&P[3].b, n, m), s_md(&P[3].c, R, m, m, 0);
            s_make_mds(&P[3], 0, &impl[3]);
            s_md(&plain_b, m, n, n, 0);
            dnnl_memory_desc_t wt;
            s_md(&wt, n, m, n, 1);
            blk = malloc(dnnl_memory_desc_get_size(&P[1].b) + dnnl_memory_desc_get_size(&P[3].b) +
                         128);
            s_reorder(&plain_b, w, &P[1].b, blk);
            s_reorder(&wt, w, &P[3].b,
                      (char *)blk + ((dnnl_memory_desc_get_size(&P[1].b) + 63) & ~(size_t)63));
        }
        const size_t off3 = sh[i].dw ? 0 : (dnnl_memory_desc_get_size(&P[1].b) + 63) & ~(size_t)63;
        for (int r = 0; r < rounds; r++) {
            for (int v = 0; v < nv; v++) {
                const double t0 = s_clock(CLOCK_THREAD_CPUTIME_ID);
                for (int j = 0; j < reps; j++) {
                    if (!sh[i].dw) {
                        if (v == 0)
                            s_run(&P[0], 0, x, w, out[0]);
                        else if (v == 1)
                            s_run(&P[1], 0, x, blk, out[1]);
                        else if (v == 2)
                            s_run(&P[2], 0, dy, w, out[2]);
                        else
                            s_run(&P[3], 0, dy, (float *)((char *)blk + off3), out[3]);
                    } else if (v == 0) {
                        s_run(&P[0], 0, x, dy, out[0]);
                    } else if (v == 1) {
                        s_run(&P[1], 0, xt, dy, out[1]);
                    } else if (v == 2) {
                        s_run(&P[2], 0, x, dy, out[2]);
                        s_run(&P[NVAR], 0, x + h * m, dy + h * n, out[2]);
                    } else if (v == 3) {
                        s_run(&P[3], 0, dy, x, tmp);
                        s_reorder(&tr_from, tmp, &tr_to, out[3]);
                    } else {
                        s_run(&P[4], 0, x, dy, out[4]);
                    }
                }
                t[v][r] = (s_clock(CLOCK_THREAD_CPUTIME_ID) - t0) / reps;
            }
            const double t0 = s_clock(CLOCK_THREAD_CPUTIME_ID);
            for (int j = 0; j < reps; j++) /* W into the forward's blocks; x into xt */
                if (!sh[i].dw)
                    s_reorder(&plain_b, w, &P[1].b, blk);
                else
                    s_reorder(&x_plain, x, &x_tr, xt);
            treo[r] = (s_clock(CLOCK_THREAD_CPUTIME_ID) - t0) / reps;
        }
        if (!sh[i].dw) /* the reorder above wrote blk's first layout: fwd's again */
            s_reorder(&plain_b, w, &P[1].b, blk);
        const double k = sh[i].dw ? (double)R : 0;
        for (int v = 0; v < nv; v++) {
            const double med = s_median(t[v], rounds);
            const double kk = sh[i].dw ? k : (v < 2 ? (double)m : (double)n);
            const double f = sh[i].dw ? 2.0 * (double)m * (double)n * kk * 1e-9
                                      : 2.0 * (double)R * (double)m * (double)n * 1e-9;
            (void)kk;
            const int base = sh[i].dw ? 0 : (v < 2 ? 0 : 2);
            const size_t cmpn = sh[i].dw ? (size_t)(m * n) : (size_t)(R * (v < 2 ? n : m));
            printf("%-7s %-5s %-10s %8.0f us %6.1f GF/s  bits %d  %s\n", sh[i].name,
                   sh[i].dw ? "dW" : "", names[v], med * 1e6, f / med,
                   !memcmp(out[v], out[base], cmpn * sizeof(float)), impl[v]);
        }
        printf("%-7s %-5s %-10s %8.0f us (%s, warm)\n", sh[i].name, sh[i].dw ? "dW" : "",
               "reorder", s_median(treo, rounds) * 1e6,
               sh[i].dw ? "x transposed into xt: what keeping x^T costs" : "W into the forward's blocks");
        free(x), free(dy), free(xt), free(w), free(tmp), free(blk);
        for (int v = 0; v < NVAR; v++)
            free(out[v]);
    }
    return 0;
}


int main(int argc, char **argv) {
    int rounds = 7, reps = 10, ai = 1, variants = 0;
    for (; ai < argc && argv[ai][0] == '-'; ai += 2) {
        if (!strcmp(argv[ai], "--variants")) {
            variants = 1;
            ai--;
            continue;
        }
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
    if (variants)
        return s_variants(R, C, V, rounds, reps);
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
