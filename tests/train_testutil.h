/* towerpack tests: small dataflows shared by the training and input tests. */
#ifndef TP_TRAIN_TESTUTIL_H
#define TP_TRAIN_TESTUTIL_H

#include <stdlib.h>
#include <towerpack/towerpack.h>

/* The training tests' easy problem: `npoints` Gaussian blobs in 2-D of
 * `spread` (standard deviation; 2 classes: centres (-2, 0) and (2, 0); 4
 * classes: (+-2, +-2)), point i of class i % classes, deterministic for a
 * seed, batched by `batch`. */
static inline tp_dataflow_t *tu_blobs(int npoints, int classes, float spread,
                                      uint64_t seed, int batch, int shuffle,
                                      int remainder) {
    static const float cx4[4] = {-2, 2, -2, 2}, cy4[4] = {-2, -2, 2, 2};
    static const float cx2[2] = {-2, 2}, cy2[2] = {0, 0};
    const float *cx = classes == 2 ? cx2 : cx4, *cy = classes == 2 ? cy2 : cy4;
    tp_datapoint_t **dps = calloc((size_t)npoints, sizeof *dps);
    tp_rng_t r;
    tp_rng_init(&r, seed, 0);
    for (int i = 0; i < npoints; i++) {
        int k = i % classes;
        int64_t two[] = {2};
        dps[i] = tp_datapoint_new(2);
        tp_tensor_init(tp_datapoint_get(dps[i], 0), TP_FLOAT32, 1, two);
        float *x = tp_datapoint_get(dps[i], 0)->data;
        x[0] = cx[k] + spread * (float)tp_rng_normal(&r);
        x[1] = cy[k] + spread * (float)tp_rng_normal(&r);
        tp_tensor_init(tp_datapoint_get(dps[i], 1), TP_INT32, 0, NULL);
        *(int32_t *)tp_datapoint_get(dps[i], 1)->data = k;
    }
    tp_dataflow_t *df = tp_df_from_list(dps, npoints, shuffle);
    free(dps);
    return tp_df_batch(df, batch, remainder);
}

/* n datapoints of one int32 component [4], every element = the index. */
static inline tp_dataflow_t *tu_counting(int n) {
    tp_datapoint_t **dps = calloc((size_t)n, sizeof *dps);
    for (int i = 0; i < n; i++) {
        int64_t four[] = {4};
        dps[i] = tp_datapoint_new(1);
        tp_tensor_init(tp_datapoint_get(dps[i], 0), TP_INT32, 1, four);
        for (int k = 0; k < 4; k++)
            ((int32_t *)tp_datapoint_get(dps[i], 0)->data)[k] = i;
    }
    tp_dataflow_t *df = tp_df_from_list(dps, (size_t)n, 0);
    free(dps);
    return df;
}

#endif
