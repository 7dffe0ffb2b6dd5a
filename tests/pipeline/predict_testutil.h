/* towerpack tests: the deterministic Fashion-MNIST-shaped batches the
 * predictor suites feed (tests/pipeline/test_predict.c on the CPU,
 * tests/gpu/test_cuda_predict.c on a device). Include after Criterion. */
#ifndef TP_TESTS_PREDICT_TESTUTIL_H
#define TP_TESTS_PREDICT_TESTUTIL_H

#include <stdint.h>
#include <towerpack/tensor.h>

/* Images [n,28,28] uint8 (a xorshift stream a row, seeded by the row's
 * index from `first` and `salt`, so that two suites can draw different
 * pictures) and labels [n] int32, row % 10. */
static inline void pt_batch(int64_t first, int64_t n, uint64_t salt,
                            tp_tensor_t *img, tp_tensor_t *lab) {
    int64_t is[3] = {n, 28, 28}, ls[1] = {n};
    cr_assert_eq(tp_tensor_init(img, TP_UINT8, 3, is), TP_OK);
    cr_assert_eq(tp_tensor_init(lab, TP_INT32, 1, ls), TP_OK);
    uint8_t *p = img->data;
    for (int64_t r = 0; r < n; r++) {
        uint64_t x = (uint64_t)(first + r) * 0x9e3779b97f4a7c15ull + salt;
        for (int k = 0; k < 784; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p[r * 784 + k] = (uint8_t)(x >> 56);
        }
        ((int32_t *)lab->data)[r] = (int32_t)((first + r) % 10);
    }
}

#endif
