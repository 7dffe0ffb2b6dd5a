/* towerpack tests: MultiThreadMapData (strict order, non-strict passes,
 * drops, errors, determinism across thread counts, abandoning a pass,
 * destroying with work in flight). Also run under ThreadSanitizer. */
#include <criterion/criterion.h>
#include <string.h>
#include <time.h>
#include <towerpack/towerpack.h>

static tp_datapoint_t *mk(int v) {
    tp_datapoint_t *dp = tp_datapoint_new(1);
    tp_tensor_init(tp_datapoint_get(dp, 0), TP_INT32, 0, NULL);
    *(int32_t *)tp_datapoint_get(dp, 0)->data = v;
    return dp;
}

static int val(const tp_datapoint_t *dp) {
    return *(const int32_t *)tp_datapoint_cget(dp, 0)->data;
}

static tp_dataflow_t *range(int n) {
    tp_datapoint_t **dps = calloc((size_t)n, sizeof *dps);
    for (int i = 0; i < n; i++)
        dps[i] = mk(i);
    tp_dataflow_t *df = tp_df_from_list(dps, (size_t)n, 0);
    free(dps);
    return df;
}

/* value * 2 after a short random pause, so threads finish out of order */
static tp_status_t s_slow_double(tp_datapoint_t **dp, tp_rng_t *rng,
                                 void *user) {
    struct timespec ts = {0, (long)tp_rng_below(rng, 200000)};
    nanosleep(&ts, NULL);
    *(int32_t *)tp_datapoint_get(*dp, 0)->data *= 2;
    return TP_OK;
}

/* value * 1000 + a random draw: depends only on the datapoint's RNG */
static tp_status_t s_noisy(tp_datapoint_t **dp, tp_rng_t *rng, void *user) {
    *(int32_t *)tp_datapoint_get(*dp, 0)->data =
        val(*dp) * 1000 + (int)tp_rng_below(rng, 1000);
    return TP_OK;
}

static tp_status_t s_drop_odd(tp_datapoint_t **dp, tp_rng_t *rng,
                              void *user) {
    return val(*dp) % 2 ? TP_DF_DROP : TP_OK;
}

static tp_status_t s_fail_at_50(tp_datapoint_t **dp, tp_rng_t *rng,
                                void *user) {
    if (val(*dp) == 50)
        return tp_error(TP_ERR_INVALID, "failed on purpose at 50");
    return TP_OK;
}

static int collect(tp_dataflow_t *df, int *v, int max) {
    int n = 0;
    for (;;) {
        tp_datapoint_t *dp;
        tp_status_t rc = tp_dataflow_next(df, &dp);
        if (rc == TP_DONE)
            return n;
        cr_assert_eq(rc, TP_OK, "%s", tp_last_error());
        cr_assert_lt(n, max);
        v[n++] = val(dp);
        tp_datapoint_destroy(&dp);
    }
}

Test(dataflow_threads, strict_keeps_order_every_pass) {
    tp_dataflow_t *df = tp_df_multithread_map(range(200), 4, 16, 1,
                                              s_slow_double, NULL, NULL);
    cr_assert_not_null(df);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    cr_assert_eq(tp_dataflow_size(df), 200);
    int v[200];
    for (int p = 0; p < 2; p++) {
        cr_assert_eq(collect(df, v, 200), 200);
        for (int i = 0; i < 200; i++)
            cr_assert_eq(v[i], 2 * i);
    }
    tp_dataflow_destroy(&df);
}

Test(dataflow_threads, strict_is_deterministic_for_any_thread_count) {
    int a[100], b[100], c[100];
    int *out[3] = {a, b, c};
    int threads[3] = {1, 4, 7};
    for (int k = 0; k < 3; k++) {
        tp_dataflow_t *df = tp_df_multithread_map(range(100), threads[k], 8,
                                                  1, s_noisy, NULL, NULL);
        cr_assert_eq(tp_dataflow_reset_state(df, 9, 2), TP_OK);
        cr_assert_eq(collect(df, out[k], 100), 100);
        tp_dataflow_destroy(&df);
    }
    cr_assert_arr_eq(a, b, sizeof a);
    cr_assert_arr_eq(a, c, sizeof a);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(a[i] / 1000, i);
}

Test(dataflow_threads, nonstrict_passes_have_the_inner_size) {
    tp_dataflow_t *df = tp_df_multithread_map(range(200), 4, 16, 0,
                                              s_slow_double, NULL, NULL);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    int v[200], count[200] = {0};
    for (int p = 0; p < 3; p++) {
        cr_assert_eq(collect(df, v, 200), 200);
        for (int i = 0; i < 200; i++) {
            cr_assert(v[i] % 2 == 0 && v[i] >= 0 && v[i] < 400);
            count[v[i] / 2]++;
        }
    }
    for (int i = 0; i < 200; i++)
        cr_assert(count[i] >= 2 && count[i] <= 4, "%d seen %d times", i,
                  count[i]);
    tp_dataflow_destroy(&df); /* work still in flight: freed cleanly */
}

Test(dataflow_threads, drops_and_errors) {
    tp_dataflow_t *df = tp_df_multithread_map(range(100), 3, 10, 1,
                                              s_drop_odd, NULL, NULL);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    int v[100];
    cr_assert_eq(collect(df, v, 100), 50);
    cr_assert_eq(v[49], 98);
    tp_dataflow_destroy(&df);

    df = tp_df_multithread_map(range(100), 3, 10, 1, s_fail_at_50, NULL,
                               NULL);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_status_t rc = TP_OK;
    int n = 0;
    while (rc == TP_OK) {
        tp_datapoint_t *dp;
        rc = tp_dataflow_next(df, &dp);
        if (rc == TP_OK) {
            n++;
            tp_datapoint_destroy(&dp);
        }
    }
    cr_assert_eq(rc, TP_ERR_INVALID);
    cr_assert_eq(n, 50, "everything before the failure arrives in order");
    cr_assert(strstr(tp_last_error(), "on purpose at 50"), "%s",
              tp_last_error());
    tp_dataflow_destroy(&df);

    cr_assert_null(tp_df_multithread_map(range(3), 0, 10, 1, s_drop_odd,
                                         NULL, NULL));
    cr_assert_null(tp_df_multithread_map(range(3), 2, 10, 1, NULL, NULL,
                                         NULL));
}

Test(dataflow_threads, end_pass_and_early_destroy) {
    tp_dataflow_t *df = tp_df_multithread_map(range(100), 4, 20, 1,
                                              s_slow_double, NULL, NULL);
    cr_assert_eq(tp_dataflow_reset_state(df, 1, 0), TP_OK);
    tp_datapoint_t *dp;
    for (int i = 0; i < 10; i++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_end_pass(df);
    int v[100];
    cr_assert_eq(collect(df, v, 100), 100);
    cr_assert_eq(v[0], 0, "a new pass starts at the beginning");
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
}

Test(dataflow_threads, batch_after_threaded_augment) {
    tp_df_fake_comp_t c[2] = {{TP_UINT8, 2, {28, 28}}, {TP_INT32, 0, {0}}};
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse("fake:size=256 | map-threads 3 strict "
                               "augment crop=28,pad=2,flip | batch 64", &df),
                 TP_OK, "%s", tp_last_error());
    (void)c;
    cr_assert_eq(tp_dataflow_reset_state(df, 4, 0), TP_OK);
    int n = 0;
    tp_datapoint_t *dp;
    while (tp_dataflow_next(df, &dp) == TP_OK) {
        cr_assert_eq(tp_datapoint_get(dp, 0)->dtype, TP_FLOAT32);
        cr_assert_eq(tp_datapoint_get(dp, 0)->shape[0], 64);
        tp_datapoint_destroy(&dp);
        n++;
    }
    cr_assert_eq(n, 4);
    tp_dataflow_destroy(&df);
}
