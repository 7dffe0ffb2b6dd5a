/* bench/peers/gpt_step.c: the zoo GPT's training step (forward, backward,
 * SGD update; no input pipeline) at gpt_cpu.sh's shape (4 layers, width
 * 256, 4 heads, context 256, batch 4), with folds on or off, and where its
 * time goes: the tower thread's CPU time per op kind a step, which a
 * shared machine's load moves little (a thread's CPU clock runs only while
 * it runs). Built against a build's library (docs/performance.md, "GPT:
 * batch_matmul's bias and GELU folded"):
 *
 *   gcc -O2 -o /tmp/gpt_step bench/peers/gpt_step.c -Iinclude -Ibuild/include \
 *       -Lbuild/lib build/lib/libtowerpack_models.a -ltowerpack \
 *       -Wl,-rpath,$PWD/build/lib -lm
 *   /tmp/gpt_step FOLD [STEPS] [THREADS]     # FOLD 0 or 1; 5 steps, 1 thread
 *
 * Prints the wall milliseconds a step (unprofiled), the profile's rows
 * and folds, the ops' thread CPU milliseconds a step and each op kind's
 * share; tokens are a fixed pattern (the speed does not depend on them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>

static tp_optimizer_t *s_opt(void *u) {
    (void)u;
    return tp_optimizer_sgd(1e-4, 0.9, 0);
}

static double s_ms(const struct timespec *a, const struct timespec *b) {
    return (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_nsec - a->tv_nsec) / 1e6;
}

int main(int argc, char **argv) {
    const int fold = argc > 1 ? atoi(argv[1]) : 1, steps = argc > 2 ? atoi(argv[2]) : 5;
    const int threads = argc > 3 ? atoi(argv[3]) : 1;
    const int T = 256, B = 4;
    if (steps < 1 || threads < 1) {
        fprintf(stderr, "usage: gpt_step FOLD [STEPS] [THREADS]\n");
        return 2;
    }
    tp_input_desc_t in[2];
    tp_zoo_gpt_options_t o = {0};
    o.layers = 4;
    o.heads = 4;
    o.embed = 256;
    if (tp_zoo_gpt_inputs(T, in) != TP_OK) {
        fprintf(stderr, "gpt_step: %s\n", tp_last_error());
        return 1;
    }
    tp_model_desc_t md = {in, 2, tp_zoo_gpt_build, s_opt, &o};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = B;
    mc.infer_batch = B;
    mc.threads = threads;
    mc.fold = fold;
    mc.seed = 1;
    tp_model_t *m = tp_model_new(&md, &mc);
    if (!m) {
        fprintf(stderr, "gpt_step: %s\n", tp_last_error());
        return 1;
    }
    tp_tensor_t f[2];
    int64_t sh[2] = {B, T};
    if (tp_tensor_init(&f[0], TP_INT32, 2, sh) != TP_OK ||
        tp_tensor_init(&f[1], TP_INT32, 2, sh) != TP_OK) {
        fprintf(stderr, "gpt_step: %s\n", tp_last_error());
        return 1;
    }
    for (int i = 0; i < B * T; i++) {
        ((int32_t *)f[0].data)[i] = (i * 7919) % 256;
        ((int32_t *)f[1].data)[i] = (i * 7919 + 1) % 256;
    }
    struct timespec t0, t1;
    for (int pass = 0; pass < 3; pass++) { /* warm-up, timed, profiled */
        if (pass == 2)
            tp_model_set_profiling(m, 1);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int s = 0; s < (pass ? steps : 2); s++)
            if (tp_model_run(m, TP_ALL_TOWERS, f, 2, NULL, 0, NULL) != TP_OK) {
                fprintf(stderr, "gpt_step: %s\n", tp_last_error());
                return 1;
            }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (pass == 1)
            printf("fold %d, %d thread(s): wall %.1f ms/step unprofiled; ", fold, threads,
                   s_ms(&t0, &t1) / steps);
    }
    static tp_op_profile_t p[1024];
    const int n = tp_model_profile(m, 0, p, 1024);
    double total = 0.0, by_kind[512] = {0};
    int folds = 0;
    for (int i = 0; i < n && i < 1024; i++) {
        const double t = (double)(p[i].thread_forward_ns + p[i].thread_backward_ns) / steps / 1e6;
        total += t;
        if ((int)p[i].kind >= 0 && (int)p[i].kind < 512)
            by_kind[p[i].kind] += t;
        folds += p[i].folds;
    }
    printf("%d rows, %d folds; ops' thread CPU %.1f ms/step:", n, folds, total);
    for (int k = 0; k < 512; k++)
        if (by_kind[k] >= 0.5)
            printf(" %s %.1f", tp_op_name((tp_op_kind_t)k), by_kind[k]);
    printf("\n");
    tp_tensor_fini(&f[0]);
    tp_tensor_fini(&f[1]);
    tp_model_destroy(&m);
    return 0;
}
