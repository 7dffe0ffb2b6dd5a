/* towerpack bench: conv2d on an NHWC image, the transpose folded into the
 * conv (fold.c's tp_plan_nhwc_) against the transpose + conv
 * (TP_NHWC_FOLD=0) and against an NCHW image fed straight to the conv (no
 * transpose at all: the floor), in one process, alternated round by
 * round; per step the process's CPU time (1 thread), the median of the
 * rounds. A step is forward + backward (filter and bias gradients; the
 * image wants none) or, with --forward, forward alone.
 *
 *   cmake --build build --target nhwc_fold   (bench/CMakeLists.txt)
 *   build/bench/nhwc_fold [--forward] \
 *      [--rounds R] [N H W C O K S P]   (default: the two shapes below) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <towerpack/towerpack.h>

typedef struct {
    int n, h, w, c, o, k, s, p;
    int nhwc; /* the input NHWC, transposed in the graph */
} s_shape_t;

static s_shape_t s_cur;

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.01, 0.0, 0);
}

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    const int perm[4] = {0, 3, 1, 2};
    tp_node_t *x = s_cur.nhwc ? tp_transpose(t, "nchw", in[0], perm) : in[0];
    tp_node_t *y = tp_conv2d(t, "conv", x, s_cur.o, s_cur.k, s_cur.s, s_cur.p, 1);
    return tp_tower_set_cost(t, tp_reduce_mean(t, "cost", y, 0, NULL, 0));
}

static tp_model_t *s_model(int nhwc) {
    s_cur.nhwc = nhwc;
    tp_input_desc_t d = {"img", TP_FLOAT32, 4, {-1, 0, 0, 0}};
    const int64_t dims[3] = {nhwc ? s_cur.h : s_cur.c, nhwc ? s_cur.w : s_cur.h,
                             nhwc ? s_cur.c : s_cur.w};
    memcpy(&d.shape[1], dims, sizeof dims);
    tp_model_desc_t md = {&d, 1, s_tower, s_sgd, NULL};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = s_cur.n;
    mc.infer_batch = s_cur.n;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&md, &mc);
    if (!m) {
        fprintf(stderr, "nhwc_fold: %s\n", tp_last_error());
        exit(1);
    }
    return m;
}

static double s_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int s_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void s_bench(int forward, int rounds) {
    const char *names[3] = {"folded", "transpose+conv", "nchw (no transpose)"};
    tp_model_t *m[3];
    m[0] = s_model(1);
    setenv("TP_NHWC_FOLD", "0", 1);
    m[1] = s_model(1);
    unsetenv("TP_NHWC_FOLD");
    m[2] = s_model(0);
    const size_t count = (size_t)s_cur.n * s_cur.h * s_cur.w * s_cur.c;
    float *img = malloc(count * sizeof *img);
    for (size_t i = 0; i < count; i++)
        img[i] = sinf((float)i * 0.37f);
    int64_t sh[2][4] = {{s_cur.n, s_cur.h, s_cur.w, s_cur.c},
                        {s_cur.n, s_cur.c, s_cur.h, s_cur.w}};
    tp_run_opts_t ro = {.stages = forward ? TP_RUN_FORWARD : TP_RUN_GRADIENTS};
    double *t[3];
    for (int v = 0; v < 3; v++)
        t[v] = calloc((size_t)rounds, sizeof(double));
    /* steps per round: about 50 ms of work at 1 thread */
    const int steps = 5;
    for (int r = -1; r < rounds; r++)  /* round -1: warm-up */
        for (int v = 0; v < 3; v++) {
            tp_tensor_t in;
            tp_tensor_init_wrap(&in, TP_FLOAT32, 4, sh[v == 2], img, NULL, NULL);
            const double t0 = s_cpu();
            for (int s = 0; s < steps; s++)
                if (tp_model_run(m[v], forward ? -1 : 0, &in, 1, NULL, 0, &ro) != TP_OK) {
                    fprintf(stderr, "nhwc_fold: %s\n", tp_last_error());
                    exit(1);
                }
            if (r >= 0)
                t[v][r] = (s_cpu() - t0) / steps;
        }
    printf("%dx%dx%dx%d -> %d filters %dx%d s%d p%d, %s, 1 thread, %d rounds:\n",
           s_cur.n, s_cur.h, s_cur.w, s_cur.c, s_cur.o, s_cur.k, s_cur.k, s_cur.s, s_cur.p,
           forward ? "forward" : "forward+backward", rounds);
    double med[3];
    for (int v = 0; v < 3; v++) {
        qsort(t[v], (size_t)rounds, sizeof(double), s_cmp);
        med[v] = t[v][rounds / 2];
    }
    for (int v = 0; v < 3; v++)
        printf("  %-20s %8.3f ms CPU/step (min %.3f)  %.3fx transpose+conv\n", names[v],
               1e3 * med[v], 1e3 * t[v][0], med[v] / med[1]);
    for (int v = 0; v < 3; v++) {
        tp_model_destroy(&m[v]);
        free(t[v]);
    }
    free(img);
}

int main(int argc, char **argv) {
    int forward = 0, rounds = 15, a = 1;
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (!strcmp(argv[a], "--forward"))
            forward = 1;
        else if (!strcmp(argv[a], "--rounds") && a + 1 < argc)
            rounds = atoi(argv[++a]);
    }
    tp_log_set_level(TP_LOG_WARN);
    if (argc - a == 8) {
        int v[8];
        for (int i = 0; i < 8; i++)
            v[i] = atoi(argv[a + i]);
        s_cur = (s_shape_t){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], 1};
        s_bench(forward, rounds);
        return 0;
    }
    const s_shape_t shapes[2] = {{128, 28, 28, 3, 32, 3, 1, 1, 1},
                                 {16, 112, 112, 3, 64, 7, 2, 3, 1}};
    for (int i = 0; i < 2; i++) {
        s_cur = shapes[i];
        s_bench(forward, rounds);
    }
    return 0;
}
