/* towerpack tests: QueueInput's return path. Batches given back with
 * tp_input_release are freed on the prefetch actor's thread, not the
 * trainer's; every batch made is freed exactly once (also those still
 * queued or given back when the input stops); after a stop, and for inputs
 * without a return path, release frees on the caller's thread. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <towerpack/towerpack.h>
#include <towerpack/launch.h>
#include "train_testutil.h"

/* A dataflow of endless one-component batches whose memory reports which
 * thread frees it. */
static atomic_long s_made, s_freed, s_freed_elsewhere;
static pthread_t s_maker;
static atomic_int s_maker_known;

static void s_free_tracked(void *data, void *hint) {
    (void)hint;
    if (!atomic_load(&s_maker_known) || !pthread_equal(pthread_self(), s_maker))
        atomic_fetch_add(&s_freed_elsewhere, 1);
    atomic_fetch_add(&s_freed, 1);
    free(data);
}

static tp_status_t s_reset(void *impl, tp_rng_t *rng, uint64_t seed, uint64_t stream) {
    return TP_OK;
}

static tp_status_t s_next(void *impl, tp_datapoint_t **out) {
    if (!atomic_load(&s_maker_known)) {
        s_maker = pthread_self();
        atomic_store(&s_maker_known, 1);
    }
    int64_t shape[] = {256};
    void *mem = malloc(1024);
    tp_datapoint_t *dp = tp_datapoint_new(1);
    cr_assert(mem && dp);
    cr_assert_eq(tp_tensor_init_wrap(tp_datapoint_get(dp, 0), TP_FLOAT32, 1, shape, mem,
                                     s_free_tracked, NULL), TP_OK);
    atomic_fetch_add(&s_made, 1);
    *out = dp;
    return TP_OK;
}

static const tp_dataflow_ops_t s_tracked_ops = {
    .name = "tracked", .reset_state = s_reset, .next = s_next,
};

static void s_reset_counts(void) {
    atomic_store(&s_made, 0);
    atomic_store(&s_freed, 0);
    atomic_store(&s_freed_elsewhere, 0);
    atomic_store(&s_maker_known, 0);
}

Test(queue, released_batches_are_freed_by_the_prefetch_actor_and_none_leak) {
    s_reset_counts();
    tp_input_t *in = tp_input_queue(tp_dataflow_new(&s_tracked_ops, NULL), 4);
    cr_assert_not_null(in);
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    for (int i = 0; i < 300; i++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_input_next(in, 0, &dp), TP_OK, "%s", tp_last_error());
        tp_input_release(in, 0, &dp);
        cr_assert_null(dp);
    }
    /* None was freed on this thread: the actor frees what comes back
     * before it makes the next batch, so all but the last few are done. */
    /* (one counter of frees off the actor's thread: comparing two counters
     * read one after the other raced with the actor's next free) */
    cr_assert_eq(atomic_load(&s_freed_elsewhere), 0, "%ld batches freed off the "
                 "prefetch actor's thread", atomic_load(&s_freed_elsewhere));
    cr_assert_geq(atomic_load(&s_freed), 300 - 2 * 4 - 8, "freed %ld of 300",
                  atomic_load(&s_freed));
    tp_input_destroy(&in);
    /* Queued and given-back batches are freed at the stop. */
    cr_assert_eq(atomic_load(&s_freed), atomic_load(&s_made), "made %ld, freed %ld",
                 atomic_load(&s_made), atomic_load(&s_freed));
}

Test(queue, release_after_stop_frees_on_the_callers_thread) {
    s_reset_counts();
    tp_input_t *in = tp_input_queue(tp_dataflow_new(&s_tracked_ops, NULL), 2);
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    tp_datapoint_t *held = NULL;
    cr_assert_eq(tp_input_next(in, 0, &held), TP_OK);
    tp_input_ops(in)->stop(tp_input_impl(in));
    long before = atomic_load(&s_freed);
    tp_input_release(in, 0, &held);
    cr_assert_null(held);
    cr_assert_eq(atomic_load(&s_freed), before + 1);
    tp_input_destroy(&in);
    cr_assert_eq(atomic_load(&s_freed), atomic_load(&s_made));
}

Test(queue, inputs_without_a_return_path_free_on_release) {
    s_reset_counts();
    tp_input_t *in = tp_input_feed(tp_dataflow_new(&s_tracked_ops, NULL));
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_input_next(in, 0, &dp), TP_OK);
    tp_input_release(in, 0, &dp);
    cr_assert_null(dp);
    cr_assert_eq(atomic_load(&s_freed), 1);
    tp_input_release(in, 0, &dp);  /* NULL: nothing to do */
    tp_input_destroy(&in);
}
