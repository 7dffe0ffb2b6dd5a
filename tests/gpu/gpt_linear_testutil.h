/* towerpack tests: a GPT's linear as the zoo builds it, for the tests of
 * batch_matmul's folds (test_fold.c on the CPU, test_cuda_ops.c on a
 * GPU). */
#ifndef TP_TESTS_GPU_GPT_LINEAR_TESTUTIL_H
#define TP_TESTS_GPU_GPT_LINEAR_TESTUTIL_H

#include <stdio.h>
#include <towerpack/towerpack.h>

/* As models/zoo_gpt.c: batch_matmul of x [B,T,K] against an unbatched
 * W [K,N], then (bias) add of a [N] bias named NAME/output. */
static inline tp_node_t *tt_gpt_linear(tp_tower_t *t, const char *name, tp_node_t *x,
                                       int64_t k, int64_t n, int bias) {
    char v[32];
    int64_t ws[2] = {k, n}, bs[1] = {n};
    snprintf(v, sizeof v, "%s/W", name);
    tp_node_t *w = tp_variable(t, v, 2, ws, (tp_init_t){TP_INIT_NORMAL, 0.3f}, TP_VAR_TRAINABLE);
    tp_node_t *y = tp_batch_matmul(t, name, x, w, 0, 0);
    if (!bias)
        return y;
    snprintf(v, sizeof v, "%s/b", name);
    tp_node_t *b = tp_variable(t, v, 1, bs, (tp_init_t){TP_INIT_NORMAL, 0.1f}, TP_VAR_TRAINABLE);
    snprintf(v, sizeof v, "%s/output", name);
    return tp_add(t, v, y, b);
}

#endif
