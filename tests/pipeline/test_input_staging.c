/* towerpack tests: StagingInput, the per-tower staging actors. Batches
 * reach each tower in the order a one-thread trainer would give them, are
 * staged ahead into the tower's own (reused) memory, memory stays bounded by
 * nr_stage, device hooks are called, and a failing input is reported. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/stats.h>
#include <towerpack/towerpack.h>
#include <towerpack/launch.h>
#include "train_testutil.h"

static int32_t s_value(const tp_datapoint_t *dp) {
    const tp_tensor_t *t = tp_datapoint_cget(dp, 0);
    cr_assert_eq(t->dtype, TP_INT32);
    cr_assert_eq(t->shape[0], 4);
    return ((const int32_t *)t->data)[3];
}

Test(staging, towers_get_batches_in_one_thread_order) {
    tp_input_t *in = tp_input_staging(tp_input_feed(tu_counting(100)), 0, NULL);
    cr_assert_not_null(in);
    cr_assert_str_eq(tp_input_name(in), "StagingInput");
    cr_assert_eq(tp_input_start(in, 3, 1, 2), TP_OK, "%s", tp_last_error());  /* skip 2 */
    cr_assert_eq(tp_input_size(in), 100);
    for (int step = 0; step < 40; step++)   /* wraps around the pass */
        for (int tower = 0; tower < 3; tower++) {
            tp_datapoint_t *dp = NULL;
            cr_assert_eq(tp_input_next(in, tower, &dp), TP_OK, "%s", tp_last_error());
            cr_assert_eq(s_value(dp), (2 + step * 3 + tower) % 100, "step %d tower %d",
                         step, tower);
            tp_datapoint_destroy(&dp);
        }
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_input_next(in, 3, &dp), TP_ERR_STATE);
    tp_input_destroy(&in);
}

/* How many of this process's threads carry `name` (/proc/self/task/TID/comm). */
static int s_threads_named(const char *name) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        char path[300], comm[32] = "";
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = 0;
        if (f)
            fclose(f);
        n += strcmp(comm, name) == 0;
    }
    closedir(d);
    return n;
}

Test(staging, each_stage_thread_is_named_after_its_tower) {
    /* top -H and perf tell the stages from the towers (docs/actors.md) */
    tp_input_t *in = tp_input_staging(tp_input_feed(tu_counting(20)), 0, NULL);
    cr_assert_not_null(in);
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK, "%s", tp_last_error());
    tp_datapoint_t *dp = NULL;
    for (int tower = 0; tower < 2; tower++) { /* both stages have run */
        cr_assert_eq(tp_input_next(in, tower, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    cr_expect_eq(s_threads_named("tp:stage0"), 1);
    cr_expect_eq(s_threads_named("tp:stage1"), 1);
    tp_input_destroy(&in);
}

Test(staging, stages_ahead_into_reused_tower_memory) {
    tp_input_t *in = tp_input_staging(tp_input_queue(tu_counting(50), 0), 2, NULL);
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK, "%s", tp_last_error());
    const void *seen[2][8];
    for (int step = 0; step < 8; step++)
        for (int tower = 0; tower < 2; tower++) {
            tp_datapoint_t *dp = NULL;
            cr_assert_eq(tp_input_next(in, tower, &dp), TP_OK, "%s", tp_last_error());
            cr_assert_eq(s_value(dp), step * 2 + tower);
            seen[tower][step] = tp_datapoint_cget(dp, 0)->data;
            tp_datapoint_destroy(&dp);
        }
    /* nr_stage 2: three slots per tower, reused in a ring */
    for (int tower = 0; tower < 2; tower++)
        for (int step = 3; step < 8; step++)
            cr_assert_eq(seen[tower][step], seen[tower][step - 3]);
    cr_assert_neq(seen[0][0], seen[1][0]);
    /* After the towers took 8 batches each, each stage has exactly
     * nr_stage more staged, and no more: memory stays bounded. */
    tp_stats_row_t row;
    for (int tries = 0; tries < 200; tries++) {
        cr_assert_eq(tp_input_staging_stats(in, 1, &row), TP_OK);
        if (row.msgs_out == 10)
            break;
        usleep(5000);
    }
    usleep(20000);
    cr_assert_eq(tp_input_staging_stats(in, 1, &row), TP_OK);
    cr_assert_eq(row.msgs_out, 10);
    cr_assert_float_eq(row.queue_fill, 1.0, 1e-9);
    cr_assert_str_eq(row.name, "StagingInput/tower1");
    /* the QueueInput underneath still reports through the wrapper */
    cr_assert_geq(tp_input_queue_taken(in), 20);
    tp_input_destroy(&in);
}

Test(staging, a_held_batch_blocks_only_its_own_slot) {
    tp_input_t *in = tp_input_staging(tp_input_feed(tu_counting(20)), 1, NULL);
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK);
    tp_datapoint_t *a = NULL, *b = NULL;
    cr_assert_eq(tp_input_next(in, 0, &a), TP_OK);
    cr_assert_eq(tp_input_next(in, 0, &b), TP_OK);  /* the one staged ahead */
    cr_assert_eq(s_value(a), 0);
    cr_assert_eq(s_value(b), 1);
    /* both slots are lent: the staged data is intact while held */
    cr_assert_eq(s_value(a), 0);
    tp_datapoint_destroy(&a);
    tp_datapoint_t *c = NULL;
    cr_assert_eq(tp_input_next(in, 0, &c), TP_OK);
    cr_assert_eq(s_value(c), 2);
    cr_assert_eq(s_value(b), 1);
    tp_datapoint_destroy(&b);
    tp_datapoint_destroy(&c);
    tp_input_destroy(&in);
}

/* Device hooks: a "device" that counts what it allocates and copies. */
typedef struct {
    int allocs, frees, copies;
} s_dev_t;

static void *dev_alloc(void *user, int tower, size_t bytes) {
    __atomic_add_fetch(&((s_dev_t *)user)->allocs, 1, __ATOMIC_SEQ_CST);
    return tp_alloc(bytes);
}
static void dev_free(void *user, int tower, void *p) {
    __atomic_add_fetch(&((s_dev_t *)user)->frees, 1, __ATOMIC_SEQ_CST);
    tp_free(p);
}
static tp_status_t dev_copy(void *user, int tower, void *dst, const void *src, size_t n) {
    __atomic_add_fetch(&((s_dev_t *)user)->copies, 1, __ATOMIC_SEQ_CST);
    memcpy(dst, src, n);
    return TP_OK;
}

Test(staging, device_hooks_allocate_once_per_slot_and_copy_every_batch) {
    s_dev_t dev = {0};
    tp_stage_ops_t ops = {dev_alloc, dev_free, dev_copy, &dev};
    tp_input_t *in = tp_input_staging(tp_input_feed(tu_counting(30)), 1, &ops);
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK);
    for (int step = 0; step < 10; step++)
        for (int tower = 0; tower < 2; tower++) {
            tp_datapoint_t *dp = NULL;
            cr_assert_eq(tp_input_next(in, tower, &dp), TP_OK);
            cr_assert_eq(s_value(dp), step * 2 + tower);
            tp_datapoint_destroy(&dp);
        }
    tp_input_destroy(&in);
    cr_assert_eq(dev.allocs, 4, "2 towers x 2 slots, got %d", dev.allocs);
    cr_assert_eq(dev.frees, 4);
    cr_assert_geq(dev.copies, 20);
    cr_assert_leq(dev.copies, 24);   /* at most one batch more per slot */
}

/* A dataflow that fails after 5 datapoints. */
static int s_fail_n;
static tp_status_t fail_next(void *impl, tp_datapoint_t **out) {
    if (s_fail_n++ >= 5)
        return tp_error(TP_ERR_IO, "disk on fire");
    int64_t four[] = {4};
    *out = tp_datapoint_new(1);
    tp_tensor_init_zero(tp_datapoint_get(*out, 0), TP_INT32, 1, four);
    return TP_OK;
}
static int64_t fail_size(void *impl) { return -1; }
static const tp_dataflow_ops_t s_fail_ops = {.name = "failing", .next = fail_next,
                                             .size = fail_size};

Test(staging, a_failing_input_is_reported_with_the_tower) {
    s_fail_n = 0;
    tp_input_t *in = tp_input_staging(tp_input_feed(tp_dataflow_new(&s_fail_ops, NULL)),
                                      1, NULL);
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK, "%s", tp_last_error());
    tp_status_t rc = TP_OK;
    int got = 0;
    for (int step = 0; step < 10 && rc == TP_OK; step++)
        for (int tower = 0; tower < 2 && rc == TP_OK; tower++) {
            tp_datapoint_t *dp = NULL;
            rc = tp_input_next(in, tower, &dp);
            got += rc == TP_OK;
            tp_datapoint_destroy(&dp);
        }
    cr_assert_eq(rc, TP_ERR_IO);
    cr_assert_eq(got, 5);
    cr_assert(strstr(tp_last_error(), "StagingInput tower") &&
              strstr(tp_last_error(), "disk on fire"), "%s", tp_last_error());
    tp_input_destroy(&in);
}

Test(staging, bad_arguments_are_refused) {
    cr_assert_null(tp_input_staging(NULL, 1, NULL));
    cr_assert_null(tp_input_staging(tp_input_feed(tu_counting(3)), TP_STAGE_MAX + 1, NULL));
    cr_assert(strstr(tp_last_error(), "nr_stage"), "%s", tp_last_error());
}
