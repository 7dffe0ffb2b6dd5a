/* towerpack tests: StagingInput bound to a device backend stages through
 * the backend's stages (pinned host buffer, copy on the copy stream, wait
 * before the batch is handed over), so a tower's batch is device memory.
 *
 * The device is a stand-in (the CPU backend's table with device 0 and
 * stages of its own): a stage's "device" buffer is separate memory that
 * receives the host buffer only when the copy is waited for, as a real
 * copy is complete only then. A StagingInput that handed a batch over
 * without waiting, or read the host buffer instead, gives wrong values. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/launch.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "train_testutil.h"

#define MAX_DEV 64

struct tp_stage {
    void *host, *dev;
    size_t bytes, pending;
};

typedef struct {
    tp_backend_t base; /* first */
    tp_backend_t *cpu;
    tp_backend_ops_t ops;
    pthread_mutex_t mu;
    int live, made, fail_after; /* fail_after < 0: never */
    void *dev[MAX_DEV];         /* device buffers of every stage made */
} s_dev_t;

static s_dev_t *s_of(tp_backend_t *b) { return (s_dev_t *)b; }

static tp_stage_t *s_stage_new(tp_backend_t *b, size_t bytes) {
    s_dev_t *d = s_of(b);
    pthread_mutex_lock(&d->mu);
    int fail = d->fail_after >= 0 && d->made >= d->fail_after;
    int k = d->made;
    if (!fail && k < MAX_DEV) {
        d->made++;
        d->live++;
    }
    pthread_mutex_unlock(&d->mu);
    if (fail || k >= MAX_DEV) {
        tp_error(TP_ERR_NOMEM, "stand-in: out of device memory");
        return NULL;
    }
    tp_stage_t *st = calloc(1, sizeof *st);
    cr_assert_not_null(st);
    st->host = calloc(1, bytes ? bytes : 1);
    st->dev = calloc(1, bytes ? bytes : 1);
    st->bytes = bytes;
    pthread_mutex_lock(&d->mu);
    d->dev[k] = st->dev;
    pthread_mutex_unlock(&d->mu);
    return st;
}

static void s_stage_destroy(tp_backend_t *b, tp_stage_t *st) {
    s_dev_t *d = s_of(b);
    pthread_mutex_lock(&d->mu);
    d->live--;
    pthread_mutex_unlock(&d->mu);
    free(st->host);
    free(st->dev);
    free(st);
}

/* The copy lands on the "device" when it is waited for. */
static tp_status_t s_stage_host_wait(tp_backend_t *b, tp_stage_t *st) {
    (void)b;
    if (st->pending) {
        memcpy(st->dev, st->host, st->pending);
        st->pending = 0;
    }
    return TP_OK;
}

static void *s_stage_host(tp_backend_t *b, tp_stage_t *st) {
    s_stage_host_wait(b, st);  /* as CUDA waits for the copy out of it */
    return st->host;
}

static void *s_stage_device(tp_backend_t *b, tp_stage_t *st) {
    (void)b;
    return st->dev;
}

static tp_status_t s_stage_begin(tp_backend_t *b, tp_stage_t *st, size_t bytes) {
    (void)b;
    cr_assert_leq(bytes, st->bytes);
    st->pending = bytes;
    /* the host buffer is rewritten at once: only a waited copy has it */
    memset(st->dev, 0xA5, st->bytes);
    return TP_OK;
}

static tp_status_t s_stage_order(tp_backend_t *b, tp_stage_t *st, tp_stream_t *s) {
    (void)b, (void)st, (void)s;
    return TP_OK;
}

static void s_dev_destroy(tp_backend_t *b) {
    s_dev_t *d = s_of(b);
    tp_backend_destroy(&d->cpu);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static s_dev_t *s_dev_new(int fail_after) {
    s_dev_t *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    d->cpu = tp_backend_cpu_new(1);
    cr_assert_not_null(d->cpu);
    d->ops = *d->cpu->ops;
    d->ops.name = "stand-in";
    d->ops.stage_new = s_stage_new;
    d->ops.stage_destroy = s_stage_destroy;
    d->ops.stage_host = s_stage_host;
    d->ops.stage_device = s_stage_device;
    d->ops.stage_begin = s_stage_begin;
    d->ops.stage_wait = s_stage_order;
    d->ops.stage_release = s_stage_order;
    d->ops.stage_host_wait = s_stage_host_wait;
    d->ops.destroy = s_dev_destroy;
    d->base.ops = &d->ops;
    d->base.impl = d;
    d->base.device = 0;
    d->fail_after = fail_after;
    pthread_mutex_init(&d->mu, NULL);
    return d;
}

static int s_is_dev(s_dev_t *d, const void *p) {
    pthread_mutex_lock(&d->mu);
    int yes = 0;
    for (int k = 0; k < d->made && !yes; k++)
        yes = d->dev[k] == p;
    pthread_mutex_unlock(&d->mu);
    return yes;
}

static int s_live(s_dev_t *d) {
    pthread_mutex_lock(&d->mu);
    int n = d->live;
    pthread_mutex_unlock(&d->mu);
    return n;
}

static int32_t s_value(const tp_datapoint_t *dp, int step, int tower) {
    const tp_tensor_t *t = tp_datapoint_cget(dp, 0);
    cr_assert_eq(t->dtype, TP_INT32);
    cr_assert_eq(t->shape[0], 4);
    const int32_t *v = t->data;
    for (int k = 1; k < 4; k++)
        cr_assert_eq(v[k], v[0], "step %d tower %d: element %d is %d, element 0 "
                     "%d: a batch handed over before its copy was done", step,
                     tower, k, v[k], v[0]);
    return v[0];
}

/* As the launch does it: start (the stages begin staging in host memory),
 * then bind once the model is built; from then on batches are device
 * memory, in the same order, and the stages are bounded and freed. */
Test(staging_device, batches_reach_the_device_through_its_stages) {
    s_dev_t *d = s_dev_new(-1);
    tp_input_t *in = tp_input_staging(tp_input_queue(tu_counting(60), 0), 1, NULL);
    cr_assert_not_null(in, "%s", tp_last_error());
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_input_bind(in, &d->base), TP_OK, "%s", tp_last_error());
    for (int step = 0; step < 40; step++)  /* wraps around the pass */
        for (int tower = 0; tower < 2; tower++) {
            tp_datapoint_t *dp = NULL;
            cr_assert_eq(tp_input_next(in, tower, &dp), TP_OK, "%s", tp_last_error());
            cr_assert_eq(s_value(dp, step, tower), (step * 2 + tower) % 60,
                         "step %d tower %d", step, tower);
            /* nr_stage 1: at most two slots per tower were staged in host
             * memory before the bind */
            if (step >= 2)
                cr_assert(s_is_dev(d, tp_datapoint_cget(dp, 0)->data),
                          "step %d tower %d: the batch is not device memory", step,
                          tower);
            tp_datapoint_destroy(&dp);
        }
    /* two slots per tower (nr_stage + 1), one component each */
    cr_assert_leq(s_live(d), 4, "%d stages live", s_live(d));
    cr_assert_geq(s_live(d), 2);
    tp_input_destroy(&in);
    cr_assert_eq(s_live(d), 0, "%d stages left after destroy", s_live(d));
    tp_backend_t *b = &d->base;
    tp_backend_destroy(&b);
}

/* Bound before the first batch: every batch is device memory. */
Test(staging_device, bound_before_start_every_batch_is_on_the_device) {
    s_dev_t *d = s_dev_new(-1);
    tp_input_t *in = tp_input_staging(tp_input_feed(tu_counting(30)), 2, NULL);
    cr_assert_eq(tp_input_bind(in, &d->base), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_input_start(in, 1, 1, 5), TP_OK, "%s", tp_last_error());  /* skip 5 */
    for (int step = 0; step < 50; step++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_input_next(in, 0, &dp), TP_OK, "%s", tp_last_error());
        cr_assert_eq(s_value(dp, step, 0), (5 + step) % 30);
        cr_assert(s_is_dev(d, tp_datapoint_cget(dp, 0)->data), "step %d", step);
        tp_datapoint_destroy(&dp);
    }
    cr_assert_leq(s_live(d), 3);  /* nr_stage 2: three slots */
    tp_input_destroy(&in);
    cr_assert_eq(s_live(d), 0);
    tp_backend_t *b = &d->base;
    tp_backend_destroy(&b);
}

/* A device that cannot give a stage: the tower's next says which stage,
 * how big, on which device, and why; nothing hangs. */
Test(staging_device, a_stage_the_device_cannot_give_is_named) {
    s_dev_t *d = s_dev_new(1);  /* the second stage fails */
    tp_input_t *in = tp_input_staging(tp_input_feed(tu_counting(30)), 1, NULL);
    cr_assert_eq(tp_input_bind(in, &d->base), TP_OK);
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    tp_datapoint_t *dp = NULL;
    cr_assert_eq(tp_input_next(in, 0, &dp), TP_OK, "%s", tp_last_error());
    cr_assert_eq(s_value(dp, 0, 0), 0);
    tp_datapoint_t *dp2 = NULL;
    tp_status_t rc = tp_input_next(in, 0, &dp2);  /* the first still lent */
    cr_assert_eq(rc, TP_ERR_NOMEM, "%d: %s", rc, tp_last_error());
    const char *msg = tp_last_error();
    cr_assert(strstr(msg, "StagingInput tower0: a stage of 16 bytes for "
                          "component 0 on stand-in device 0") &&
              strstr(msg, "out of device memory"), "%s", msg);
    tp_datapoint_destroy(&dp);
    tp_input_destroy(&in);
    cr_assert_eq(s_live(d), 0);
    tp_backend_t *b = &d->base;
    tp_backend_destroy(&b);
}

/* Towers on two devices (tp_input_bind_towers): each tower's batches are
 * staged on its own device, never the other's. */
Test(staging_device, towers_on_two_devices_stage_on_their_own) {
    s_dev_t *d0 = s_dev_new(-1), *d1 = s_dev_new(-1);
    d1->base.device = 1;
    tp_backend_t *per_tower[2] = {&d0->base, &d1->base};
    tp_input_t *in = tp_input_staging(tp_input_feed(tu_counting(40)), 1, NULL);
    cr_assert_eq(tp_input_bind_towers(in, per_tower, 2), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK, "%s", tp_last_error());
    for (int step = 0; step < 30; step++)
        for (int tower = 0; tower < 2; tower++) {
            tp_datapoint_t *dp = NULL;
            cr_assert_eq(tp_input_next(in, tower, &dp), TP_OK, "%s", tp_last_error());
            cr_assert_eq(s_value(dp, step, tower), (step * 2 + tower) % 40);
            const void *p = tp_datapoint_cget(dp, 0)->data;
            cr_assert(s_is_dev(tower ? d1 : d0, p) && !s_is_dev(tower ? d0 : d1, p),
                      "step %d: tower%d's batch is not on device %d", step, tower,
                      tower);
            tp_datapoint_destroy(&dp);
        }
    cr_assert_leq(s_live(d0), 2);
    cr_assert_leq(s_live(d1), 2);
    tp_input_destroy(&in);
    cr_assert_eq(s_live(d0) + s_live(d1), 0);
    cr_assert_eq(tp_input_bind_towers(NULL, per_tower, 2), TP_OK);
    tp_backend_t *b = &d0->base;
    tp_backend_destroy(&b);
    b = &d1->base;
    tp_backend_destroy(&b);
}

/* ResidentInput keeps one copy of the data set: towers on two devices are
 * refused, with the reason and what to use instead. */
Test(staging_device, resident_data_on_two_devices_is_refused) {
    s_dev_t *d0 = s_dev_new(-1), *d1 = s_dev_new(-1);
    d1->base.device = 1;
    tp_backend_t *per_tower[2] = {&d0->base, &d1->base};
    tp_resident_opts_t o;
    tp_resident_opts_init(&o);
    tp_input_t *in = tp_input_resident(tu_counting(8), &o);
    cr_assert_not_null(in, "%s", tp_last_error());
    cr_assert_eq(tp_input_bind_towers(in, per_tower, 2), TP_ERR_UNSUPPORTED);
    cr_assert(strstr(tp_last_error(), "span 2 devices") &&
              strstr(tp_last_error(), "StagingInput"), "%s", tp_last_error());
    tp_input_destroy(&in);
    tp_backend_t *b = &d0->base;
    tp_backend_destroy(&b);
    b = &d1->base;
    tp_backend_destroy(&b);
}

/* The CPU backend (device -1) keeps host memory: nothing to stage. */
Test(staging_device, the_cpu_backend_keeps_host_memory) {
    tp_backend_t *cpu = tp_backend_cpu_new(1);
    tp_input_t *in = tp_input_staging(tp_input_feed(tu_counting(10)), 1, NULL);
    cr_assert_eq(tp_input_bind(in, cpu), TP_OK);
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_OK, "%s", tp_last_error());
    for (int step = 0; step < 12; step++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_input_next(in, 0, &dp), TP_OK, "%s", tp_last_error());
        cr_assert_eq(s_value(dp, step, 0), step % 10);
        tp_datapoint_destroy(&dp);
    }
    tp_input_destroy(&in);
    tp_backend_destroy(&cpu);
}

/* Batches already in the towers' memory are not staged again. */
Test(staging_device, an_input_in_the_towers_memory_is_refused) {
    tp_input_t *inner = tp_input_staging(tp_input_feed(tu_counting(10)), 1, NULL);
    cr_assert_not_null(inner);
    tp_input_t *in = tp_input_staging(inner, 1, NULL);
    cr_assert_null(in);
    cr_assert(strstr(tp_last_error(), "StagingInput over StagingInput: its batches "
                                      "are made in the towers' memory already"),
              "%s", tp_last_error());
}
