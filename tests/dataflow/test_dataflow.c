/* towerpack tests: the DataFlow library's sources and transforms (counts,
 * sizes, order, remainders, seeding, pass boundaries, ownership, guards). */
#include <criterion/criterion.h>
#include <string.h>
#include <towerpack/towerpack.h>

/* ---- helpers ----------------------------------------------------------- */

/* A datapoint of one int32 scalar v (and, with two=1, a float32 [2] of v). */
static tp_datapoint_t *mk(int v, int two) {
    tp_datapoint_t *dp = tp_datapoint_new(0);
    tp_tensor_t t;
    cr_assert_eq(tp_tensor_init(&t, TP_INT32, 0, NULL), TP_OK);
    *(int32_t *)t.data = v;
    cr_assert_eq(tp_datapoint_append(dp, &t), TP_OK);
    if (two) {
        int64_t shape[1] = {2};
        cr_assert_eq(tp_tensor_init(&t, TP_FLOAT32, 1, shape), TP_OK);
        ((float *)t.data)[0] = (float)v;
        ((float *)t.data)[1] = (float)-v;
        cr_assert_eq(tp_datapoint_append(dp, &t), TP_OK);
    }
    return dp;
}

static int val(const tp_datapoint_t *dp, int comp) {
    const tp_tensor_t *t = tp_datapoint_cget(dp, comp);
    cr_assert_eq(t->dtype, TP_INT32);
    return *(const int32_t *)t->data;
}

/* A list dataflow of 0..n-1 (int32 scalars), unshuffled. */
static tp_dataflow_t *range(int n) {
    tp_datapoint_t **dps = calloc((size_t)(n ? n : 1), sizeof *dps);
    for (int i = 0; i < n; i++)
        dps[i] = mk(i, 0);
    tp_dataflow_t *df = tp_df_from_list(dps, (size_t)n, 0);
    free(dps);
    cr_assert_not_null(df);
    return df;
}

/* Run one pass, store the first component's values; returns the count. */
static int pass(tp_dataflow_t *df, int *vals, int max) {
    int n = 0;
    for (;;) {
        tp_datapoint_t *dp;
        tp_status_t rc = tp_dataflow_next(df, &dp);
        if (rc == TP_DONE)
            break;
        cr_assert_eq(rc, TP_OK, "next: %s", tp_last_error());
        if (n < max && vals)
            vals[n] = val(dp, 0);
        n++;
        tp_datapoint_destroy(&dp);
    }
    return n;
}

static void reset(tp_dataflow_t *df) {
    cr_assert_eq(tp_dataflow_reset_state(df, 42, 0), TP_OK, "%s",
                 tp_last_error());
}

/* ---- sources ------------------------------------------------------------- */

Test(dataflow, list_in_order_and_shuffled) {
    tp_dataflow_t *df = range(10);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 10);
    int v[10];
    for (int p = 0; p < 2; p++) {
        cr_assert_eq(pass(df, v, 10), 10);
        for (int i = 0; i < 10; i++)
            cr_assert_eq(v[i], i);
    }
    tp_dataflow_destroy(&df);
    cr_assert_null(df);

    tp_datapoint_t *dps[50];
    for (int i = 0; i < 50; i++)
        dps[i] = mk(i, 0);
    df = tp_df_from_list(dps, 50, 1);
    for (int i = 0; i < 50; i++)
        cr_assert_null(dps[i]); /* taken */
    reset(df);
    int a[50], b[50], seen[50] = {0};
    cr_assert_eq(pass(df, a, 50), 50);
    cr_assert_eq(pass(df, b, 50), 50);
    for (int i = 0; i < 50; i++)
        seen[a[i]]++;
    for (int i = 0; i < 50; i++)
        cr_assert_eq(seen[i], 1);
    cr_assert(memcmp(a, b, sizeof a) != 0, "every pass is reshuffled");
    tp_dataflow_destroy(&df);
}

Test(dataflow, guards_before_reset_and_reentrancy) {
    tp_dataflow_t *df = range(3);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "reset_state"));
    tp_dataflow_destroy(&df);
}

typedef struct {
    tp_dataflow_t *self;
    int calls;
    tp_status_t inner_rc;
} reent_t;

static tp_status_t s_reentrant_gen(tp_datapoint_t **out, tp_rng_t *rng,
                                   void *user) {
    reent_t *r = user;
    if (r->calls++ > 0)
        return TP_DONE;
    tp_datapoint_t *dp;
    r->inner_rc = tp_dataflow_next(r->self, &dp);  /* iterate it again */
    *out = mk(1, 0);
    return TP_OK;
}

Test(dataflow, reentrant_iteration_is_an_error) {
    reent_t r = {0};
    tp_dataflow_t *df = tp_df_generator(s_reentrant_gen, &r, NULL, -1);
    r.self = df;
    reset(df);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    tp_datapoint_destroy(&dp);
    cr_assert_eq(r.inner_rc, TP_ERR_STATE);
    tp_dataflow_destroy(&df);
}

static tp_status_t s_count_gen(tp_datapoint_t **out, tp_rng_t *rng,
                               void *user) {
    int *n = user;
    if (*n >= 5) {
        *n = 0;
        return TP_DONE;
    }
    *out = mk((*n)++, 0);
    return TP_OK;
}

static void s_free_flag(void *user) { (void)user; }

Test(dataflow, generator) {
    int state = 0;
    tp_dataflow_t *df = tp_df_generator(s_count_gen, &state, s_free_flag, 5);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 5);
    int v[5];
    cr_assert_eq(pass(df, v, 5), 5);
    cr_assert_eq(v[4], 4);
    cr_assert_eq(pass(df, v, 5), 5);
    tp_dataflow_destroy(&df);
}

Test(dataflow, fake_data_shapes_random_and_constant) {
    tp_df_fake_comp_t c[2] = {{TP_UINT8, 2, {28, 28}},
                              {TP_FLOAT32, 1, {3}}};
    tp_dataflow_t *df = tp_df_fake(c, 2, 7, 1);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 7);
    tp_datapoint_t *a, *b;
    cr_assert_eq(tp_dataflow_next(df, &a), TP_OK);
    cr_assert_eq(tp_dataflow_next(df, &b), TP_OK);
    cr_assert_eq(tp_datapoint_size(a), 2);
    cr_assert_eq(tp_datapoint_get(a, 0)->dtype, TP_UINT8);
    cr_assert_eq(tp_datapoint_get(a, 0)->shape[1], 28);
    cr_assert_eq(tp_datapoint_get(a, 1)->nbytes, 12);
    const float *f = tp_datapoint_get(a, 1)->data;
    for (int i = 0; i < 3; i++)
        cr_assert(f[i] >= 0 && f[i] < 1);
    cr_assert_not(tp_datapoint_equal(a, b), "random: datapoints differ");
    tp_datapoint_destroy(&a);
    tp_datapoint_destroy(&b);
    cr_assert_eq(pass(df, NULL, 0) + 2, 7);
    tp_dataflow_destroy(&df);

    df = tp_df_fake(c, 2, 3, 0);
    reset(df);
    cr_assert_eq(tp_dataflow_next(df, &a), TP_OK);
    cr_assert_eq(tp_dataflow_next(df, &b), TP_OK);
    cr_assert(tp_datapoint_equal(a, b), "constant: the same datapoint");
    tp_datapoint_destroy(&a);
    tp_datapoint_destroy(&b);
    tp_dataflow_destroy(&df);

    tp_df_fake_comp_t bad = {TP_UINT8, 2, {-1, 3}};
    cr_assert_null(tp_df_fake(&bad, 1, 3, 1));
    cr_assert_null(tp_df_fake(c, 0, 3, 1));
}

/* ---- batch --------------------------------------------------------------- */

Test(dataflow, batch_sizes_and_remainder) {
    tp_dataflow_t *df = tp_df_batch(range(10), 4, 0);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 2);
    tp_datapoint_t *dp;
    for (int b = 0; b < 2; b++) {
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        tp_tensor_t *t = tp_datapoint_get(dp, 0);
        cr_assert_eq(t->ndim, 1);
        cr_assert_eq(t->shape[0], 4);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(((int32_t *)t->data)[i], b * 4 + i);
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_DONE);
    /* the next pass starts from 0 again */
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(((int32_t *)tp_datapoint_get(dp, 0)->data)[0], 0);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    df = tp_df_batch(range(10), 4, 1);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 3);
    for (int p = 0; p < 2; p++) {
        int sizes[3];
        for (int b = 0; b < 3; b++) {
            cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
            sizes[b] = (int)tp_datapoint_get(dp, 0)->shape[0];
            if (b == 2) {
                tp_tensor_t *t = tp_datapoint_get(dp, 0);
                cr_assert_eq(t->nbytes, 8);
                cr_assert_eq(((int32_t *)t->data)[1], 9);
            }
            tp_datapoint_destroy(&dp);
        }
        cr_assert_eq(sizes[2], 2);
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_DONE);
    }
    tp_dataflow_destroy(&df);
}

Test(dataflow, batch_stacks_every_component) {
    tp_datapoint_t *dps[6];
    for (int i = 0; i < 6; i++)
        dps[i] = mk(i, 1);
    tp_dataflow_t *df = tp_df_batch(tp_df_from_list(dps, 6, 0), 3, 0);
    reset(df);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(tp_datapoint_size(dp), 2);
    tp_tensor_t *f = tp_datapoint_get(dp, 1);
    cr_assert_eq(f->ndim, 2);
    cr_assert_eq(f->shape[0], 3);
    cr_assert_eq(f->shape[1], 2);
    cr_assert_float_eq(((float *)f->data)[5], -2.0f, 0);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
}

Test(dataflow, batch_wrong_shapes_is_a_clear_error) {
    tp_datapoint_t *dps[4] = {mk(0, 0), mk(1, 0), mk(2, 1), mk(3, 0)};
    tp_dataflow_t *df = tp_df_batch(tp_df_from_list(dps, 4, 0), 4, 0);
    reset(df);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_ERR_SHAPE);
    cr_assert_null(dp);
    cr_assert(strstr(tp_last_error(), "datapoint 2"), "%s", tp_last_error());
    tp_dataflow_destroy(&df);

    /* a dtype mismatch in one component */
    tp_datapoint_t *a = mk(0, 0), *b = tp_datapoint_new(1);
    int64_t shape[1] = {1};
    tp_tensor_init(tp_datapoint_get(b, 0), TP_FLOAT32, 0, shape);
    tp_datapoint_t *l[2] = {a, b};
    df = tp_df_batch(tp_df_from_list(l, 2, 0), 2, 0);
    reset(df);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_ERR_SHAPE);
    cr_assert(strstr(tp_last_error(), "float32"), "%s", tp_last_error());
    tp_dataflow_destroy(&df);

    cr_assert_null(tp_df_batch(range(3), 0, 0));
    cr_assert(strstr(tp_last_error(), "batch size"));
    cr_assert_null(tp_df_batch(NULL, 4, 0)); /* propagates an inner failure */
}

Test(dataflow, batch_by_shape_groups) {
    /* alternate datapoints of one and two components' shapes */
    tp_datapoint_t *dps[8];
    for (int i = 0; i < 8; i++) {
        dps[i] = tp_datapoint_new(1);
        int64_t shape[1] = {i % 2 ? 3 : 5};
        tp_tensor_init_zero(tp_datapoint_get(dps[i], 0), TP_UINT8, 1, shape);
        ((uint8_t *)tp_datapoint_get(dps[i], 0)->data)[0] = (uint8_t)i;
    }
    tp_dataflow_t *df = tp_df_batch_by_shape(tp_df_from_list(dps, 8, 0), 3, 0);
    reset(df);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    tp_tensor_t *t = tp_datapoint_get(dp, 0);
    cr_assert_eq(t->shape[0], 3);
    cr_assert_eq(t->shape[1], 5);   /* the even ones filled first: 0,2,4 */
    cr_assert_eq(((uint8_t *)t->data)[5], 2);
    tp_datapoint_destroy(&dp);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(tp_datapoint_get(dp, 0)->shape[1], 3);
    tp_datapoint_destroy(&dp);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_DONE);
    tp_dataflow_destroy(&df); /* leftovers are freed (ASan checks) */
}

/* ---- map, filter ------------------------------------------------------------ */

static tp_status_t s_double_or_drop(tp_datapoint_t **dp, tp_rng_t *rng,
                                    void *user) {
    int32_t *v = tp_datapoint_get(*dp, 0)->data;
    if (*v % 3 == 0)
        return TP_DF_DROP;
    *v *= 2;
    return TP_OK;
}

static tp_status_t s_replace(tp_datapoint_t **dp, tp_rng_t *rng, void *user) {
    int v = val(*dp, 0);
    tp_datapoint_destroy(dp);
    *dp = mk(v + 100, 0);
    return TP_OK;
}

static tp_status_t s_fail(tp_datapoint_t **dp, tp_rng_t *rng, void *user) {
    return tp_error(TP_ERR_INVALID, "map failed on purpose");
}

static tp_status_t s_negate_comp(tp_tensor_t *t, tp_rng_t *rng, void *user) {
    *(int32_t *)t->data = -*(int32_t *)t->data;
    return TP_OK;
}

static int s_odd(const tp_datapoint_t *dp, void *user) {
    return val(dp, 0) % 2;
}

static int s_freed;
static void s_count_free(void *user) { s_freed++; }

Test(dataflow, map_drops_and_replaces) {
    tp_dataflow_t *df = tp_df_map(range(10), s_double_or_drop, NULL, NULL);
    reset(df);
    int v[10];
    cr_assert_eq(pass(df, v, 10), 6); /* 0,3,6,9 dropped */
    cr_assert_eq(v[0], 2);
    cr_assert_eq(v[5], 16);
    cr_assert_eq(tp_dataflow_size(df), 10);
    tp_dataflow_destroy(&df);

    s_freed = 0;
    df = tp_df_map(range(3), s_replace, NULL, s_count_free);
    reset(df);
    cr_assert_eq(pass(df, v, 10), 3);
    cr_assert_eq(v[2], 102);
    tp_dataflow_destroy(&df);
    cr_assert_eq(s_freed, 1, "user data released at destroy");

    df = tp_df_map(range(3), s_fail, NULL, NULL);
    reset(df);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "on purpose"));
    tp_dataflow_destroy(&df);

    s_freed = 0;
    cr_assert_null(tp_df_map(range(3), NULL, NULL, s_count_free));
    cr_assert_eq(s_freed, 1, "user data released on failure");
}

Test(dataflow, map_component_and_filter) {
    tp_datapoint_t *dps[4];
    for (int i = 0; i < 4; i++)
        dps[i] = mk(i, 1);
    tp_dataflow_t *df = tp_df_map_component(tp_df_from_list(dps, 4, 0),
                                            s_negate_comp, NULL, NULL, 0);
    reset(df);
    int v[4];
    cr_assert_eq(pass(df, v, 4), 4);
    cr_assert_eq(v[3], -3);
    tp_dataflow_destroy(&df);

    df = tp_df_map_component(range(2), s_negate_comp, NULL, NULL, 5);
    reset(df);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_ERR_SHAPE);
    tp_dataflow_destroy(&df);

    df = tp_df_filter(range(9), s_odd, NULL, NULL);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), -1);
    cr_assert_eq(pass(df, v, 4), 4);
    cr_assert_eq(v[3], 7);
    tp_dataflow_destroy(&df);
}

/* ---- sizes and repetition ----------------------------------------------------- */

Test(dataflow, fixed_size_keeps_or_restarts_state) {
    tp_dataflow_t *df = tp_df_fixed_size(range(5), 3, 1);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 3);
    int v[8];
    cr_assert_eq(pass(df, v, 8), 3);
    cr_assert_eq(pass(df, v, 8), 3);
    cr_assert_eq(v[0], 3); /* continues: 3, 4, then wraps to 0 */
    cr_assert_eq(v[2], 0);
    tp_dataflow_destroy(&df);

    df = tp_df_fixed_size(range(5), 3, 0);
    reset(df);
    pass(df, v, 8);
    cr_assert_eq(pass(df, v, 8), 3);
    cr_assert_eq(v[0], 0); /* starts over */
    tp_dataflow_destroy(&df);

    df = tp_df_fixed_size(range(2), 5, 1);
    reset(df);
    cr_assert_eq(pass(df, v, 8), 5);
    cr_assert_eq(v[4], 0);
    tp_dataflow_destroy(&df);

    df = tp_df_fixed_size(range(0), 5, 1);
    reset(df);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_ERR_STATE);
    tp_dataflow_destroy(&df);
}

Test(dataflow, repeat_and_repeat_datapoint) {
    tp_dataflow_t *df = tp_df_repeat(range(3), 2);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 6);
    int v[10];
    cr_assert_eq(pass(df, v, 10), 6);
    cr_assert_eq(v[3], 0);
    cr_assert_eq(pass(df, v, 10), 6);
    tp_dataflow_destroy(&df);

    df = tp_df_repeat(range(3), -1);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), -1);
    for (int i = 0; i < 10; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        cr_assert_eq(val(dp, 0), i % 3);
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&df);

    df = tp_df_repeat(range(0), -1); /* nothing at all: ends, no hang */
    reset(df);
    cr_assert_eq(pass(df, v, 10), 0);
    tp_dataflow_destroy(&df);

    df = tp_df_repeat_datapoint(range(3), 3);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 9);
    int w[9];
    cr_assert_eq(pass(df, w, 9), 9);
    int want[9] = {0, 0, 0, 1, 1, 1, 2, 2, 2};
    cr_assert_arr_eq(w, want, sizeof want);
    tp_dataflow_destroy(&df);
}

/* ---- several dataflows ------------------------------------------------------- */

Test(dataflow, concat_join_select) {
    tp_dataflow_t *dfs[2] = {range(2), range(3)};
    tp_dataflow_t *df = tp_df_concat(dfs, 2);
    cr_assert_null(dfs[0]);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 5);
    int v[5];
    cr_assert_eq(pass(df, v, 5), 5);
    int want[5] = {0, 1, 0, 1, 2};
    cr_assert_arr_eq(v, want, sizeof want);
    cr_assert_eq(pass(df, v, 5), 5);
    tp_dataflow_destroy(&df);

    tp_datapoint_t *l[4];
    for (int i = 0; i < 4; i++)
        l[i] = mk(10 + i, 1);
    tp_dataflow_t *j[2] = {range(3), tp_df_from_list(l, 4, 0)};
    df = tp_df_join(j, 2);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 3);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(tp_datapoint_size(dp), 3);
    cr_assert_eq(val(dp, 1), 10);
    tp_datapoint_destroy(&dp);
    cr_assert_eq(pass(df, NULL, 0), 2);
    /* the second pass starts both over */
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(val(dp, 0), 0);
    cr_assert_eq(val(dp, 1), 10);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    tp_datapoint_t *s[1] = {mk(7, 1)};
    int idx[3] = {1, 0, 1};
    df = tp_df_select_component(tp_df_from_list(s, 1, 0), idx, 3);
    reset(df);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(tp_datapoint_size(dp), 3);
    cr_assert_eq(val(dp, 1), 7);
    cr_assert(tp_tensor_equal(tp_datapoint_get(dp, 0),
                              tp_datapoint_get(dp, 2)));
    cr_assert_neq(tp_datapoint_get(dp, 0)->data,
                  tp_datapoint_get(dp, 2)->data, "a repeated index is copied");
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);

    int bad[1] = {4};
    df = tp_df_select_component(range(1), bad, 1);
    reset(df);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_ERR_SHAPE);
    tp_dataflow_destroy(&df);
}

Test(dataflow, random_mix_keeps_each_order) {
    tp_datapoint_t *l[20];
    for (int i = 0; i < 20; i++)
        l[i] = mk(100 + i, 0);
    tp_dataflow_t *dfs[2] = {range(30), tp_df_from_list(l, 20, 0)};
    tp_dataflow_t *df = tp_df_random_mix(dfs, 2);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 50);
    int v[50];
    cr_assert_eq(pass(df, v, 50), 50);
    int lo = -1, hi = 99, switches = 0;
    for (int i = 0; i < 50; i++) {
        if (v[i] >= 100) {
            cr_assert_eq(v[i], hi + 1);
            hi = v[i];
        } else {
            cr_assert_eq(v[i], lo + 1);
            lo = v[i];
        }
        if (i && (v[i] >= 100) != (v[i - 1] >= 100))
            switches++;
    }
    cr_assert_gt(switches, 5, "interleaved");
    tp_dataflow_destroy(&df);

    tp_dataflow_t *u[2] = {range(3), tp_df_filter(range(3), s_odd, NULL, NULL)};
    cr_assert_null(tp_df_random_mix(u, 2));
    cr_assert(strstr(tp_last_error(), "size"));
}

Test(dataflow, random_choose_by_probability) {
    tp_dataflow_t *dfs[2] = {tp_df_repeat(range(1), -1),
                             tp_df_repeat(tp_df_map(range(1), s_replace, NULL,
                                                    NULL), -1)};
    double p[2] = {0.8, 0.2};
    tp_dataflow_t *df = tp_df_random_choose(dfs, p, 2);
    reset(df);
    int hundreds = 0;
    for (int i = 0; i < 2000; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        hundreds += val(dp, 0) == 100;
        tp_datapoint_destroy(&dp);
    }
    cr_assert(hundreds > 300 && hundreds < 500, "%d of 2000", hundreds);
    tp_dataflow_destroy(&df);

    tp_dataflow_t *f[2] = {range(3), range(1000)};
    df = tp_df_random_choose(f, NULL, 2);
    reset(df);
    int n = pass(df, NULL, 0);
    cr_assert(n >= 3 && n < 100, "ends when one ends (%d)", n);
    tp_dataflow_destroy(&df);

    double neg[2] = {-1, 1};
    tp_dataflow_t *g[2] = {range(1), range(1)};
    cr_assert_null(tp_df_random_choose(g, neg, 2));
}

/* ---- shuffling and caching ------------------------------------------------------ */

Test(dataflow, locally_shuffle_buffer_and_reuse) {
    tp_dataflow_t *df = tp_df_locally_shuffle(range(100), 20, 1, 0);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 100);
    int v[100];
    cr_assert_eq(pass(df, v, 100), 100);
    int inorder = 0, maxv = 0;
    for (int i = 0; i < 100; i++) {
        inorder += i && v[i] == v[i - 1] + 1;
        /* a datapoint comes out at most 20 places before it would */
        maxv = v[i] > maxv ? v[i] : maxv;
        cr_assert_leq(maxv, i + 20);
    }
    cr_assert_lt(inorder, 60, "shuffled");
    tp_dataflow_destroy(&df);

    df = tp_df_locally_shuffle(range(10), 5, 3, 2);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 30);
    int w[30], count[10] = {0};
    cr_assert_eq(pass(df, w, 30), 30);
    for (int i = 0; i < 30; i++)
        count[w[i]]++;
    for (int i = 1; i < 9; i++)
        cr_assert_geq(count[i], 1);
    tp_dataflow_destroy(&df);
    cr_assert_null(tp_df_locally_shuffle(range(3), 0, 1, 0));
}

Test(dataflow, cache_replays) {
    s_freed = 0;
    tp_dataflow_t *df = tp_df_cache(tp_df_map(range(6), s_replace, NULL,
                                              s_count_free), 0);
    reset(df);
    int a[6], b[6];
    cr_assert_eq(pass(df, a, 6), 6);
    cr_assert_eq(tp_dataflow_size(df), 6);
    cr_assert_eq(pass(df, b, 6), 6);
    cr_assert_arr_eq(a, b, sizeof a);
    tp_dataflow_destroy(&df);
    cr_assert_eq(s_freed, 1);

    df = tp_df_cache(range(30), 1);
    reset(df);
    int c[30], d[30];
    pass(df, c, 30);
    pass(df, c, 30);
    pass(df, d, 30);
    cr_assert(memcmp(c, d, sizeof c) != 0, "reshuffled every pass");
    tp_dataflow_destroy(&df);
}

Test(dataflow, print_passes_through) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tp_dataflow_t *df = tp_df_print(range(5), 2, "ints", f);
    reset(df);
    cr_assert_eq(pass(df, NULL, 0), 5);
    cr_assert_eq(pass(df, NULL, 0), 5);
    fclose(f);
    cr_assert(strstr(buf, "[ints] datapoint 1"));
    cr_assert_null(strstr(buf, "datapoint 2"), "first %d only: %s", 2, buf);
    cr_assert(strstr(buf, "int32[] = 1"), "%s", buf);
    free(buf);
    tp_dataflow_destroy(&df);
}

/* ---- seeding and pass boundaries ---------------------------------------------- */

static void order_of(uint64_t seed, uint64_t stream, int *v) {
    tp_dataflow_t *df = tp_df_locally_shuffle(range(40), 10, 1, 0);
    df = tp_df_batch(df, 1, 0);
    cr_assert_eq(tp_dataflow_reset_state(df, seed, stream), TP_OK);
    for (int i = 0; i < 40; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
        v[i] = ((int32_t *)tp_datapoint_get(dp, 0)->data)[0];
        tp_datapoint_destroy(&dp);
    }
    tp_dataflow_destroy(&df);
}

Test(dataflow, seeding_same_seed_same_order_streams_differ) {
    int a[40], b[40], c[40], d[40];
    order_of(7, 0, a);
    order_of(7, 0, b);
    order_of(7, 1, c);
    order_of(8, 0, d);
    cr_assert_arr_eq(a, b, sizeof a);
    cr_assert(memcmp(a, c, sizeof a) != 0, "another worker, another stream");
    cr_assert(memcmp(a, d, sizeof a) != 0, "another seed, another order");
}

Test(dataflow, end_pass_restarts_wrappers) {
    tp_dataflow_t *df = tp_df_batch(range(10), 3, 1);
    reset(df);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    tp_datapoint_destroy(&dp);
    tp_dataflow_end_pass(df);
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    cr_assert_eq(((int32_t *)tp_datapoint_get(dp, 0)->data)[0], 0,
                 "the abandoned pass is not resumed");
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
}

Test(dataflow, composed_pipeline_in_one_expression) {
    tp_df_fake_comp_t c[2] = {{TP_UINT8, 2, {28, 28}}, {TP_INT32, 0, {0}}};
    tp_augment_t *aug = tp_augment_new();
    float m = 0, s = 255;
    cr_assert_eq(tp_augment_add_crop(aug, 28, 28, 2), TP_OK);
    cr_assert_eq(tp_augment_add_flip(aug, 0.5), TP_OK);
    cr_assert_eq(tp_augment_add_normalize(aug, 1, &m, &s), TP_OK);
    tp_dataflow_t *df = tp_df_batch(
        tp_df_augment(tp_df_locally_shuffle(tp_df_fake(c, 2, 300, 1), 50, 1,
                                            0),
                      aug, 0),
        128, 0);
    cr_assert_not_null(df);
    reset(df);
    cr_assert_eq(tp_dataflow_size(df), 2);
    tp_datapoint_t *dp;
    cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK);
    tp_tensor_t *img = tp_datapoint_get(dp, 0);
    cr_assert_eq(img->dtype, TP_FLOAT32);
    cr_assert_eq(img->ndim, 3);
    cr_assert_eq(img->shape[0], 128);
    cr_assert_eq(tp_datapoint_get(dp, 1)->dtype, TP_INT32);
    cr_assert_eq(tp_datapoint_get(dp, 1)->shape[0], 128);
    tp_datapoint_destroy(&dp);
    tp_dataflow_destroy(&df);
}

/* A fake datapoint larger than the machine is refused when the source is
 * made, saying it is memory and naming the shape (issue 48: the first
 * next() said "datapoint of 1 components"). */
Test(dataflow, fake_data_too_large_for_the_machine_names_memory_and_shape) {
    tp_df_fake_comp_t huge[2] = {{TP_FLOAT32, 2, {1000000, 1000000}}, {TP_INT32, 0, {0}}};
    cr_assert_null(tp_df_fake(huge, 2, 3, 1));
    cr_assert(strstr(tp_last_error(), "out of memory: 4000000000004 bytes (3.6 TiB)"), "%s",
              tp_last_error());
    cr_assert(strstr(tp_last_error(), "float32 [1000000,1000000], int32"), "%s",
              tp_last_error());
}

/* A batch larger than the data set, with no remainder, never makes a
 * batch: refused when built, saying so and what to do (issue 48: "the
 * dataflow batch is empty" at the first step). With a remainder it makes
 * one partial batch. */
Test(dataflow, batch_larger_than_the_data_set_is_refused) {
    cr_assert_null(tp_df_batch(range(5), 8, 0));
    cr_assert(strstr(tp_last_error(), "the batch (8) is larger than the data set"), "%s",
              tp_last_error());
    cr_assert(strstr(tp_last_error(), "5 samples") &&
              strstr(tp_last_error(), "at most 5") && strstr(tp_last_error(), "remainder"),
              "%s", tp_last_error());
    tp_dataflow_t *df = tp_df_batch(range(5), 8, 1);
    cr_assert_not_null(df, "%s", tp_last_error());
    reset(df);
    cr_assert_eq(pass(df, NULL, 0), 1);
    tp_dataflow_destroy(&df);
}
