/* towerpack tests: a model whose towers span several devices
 * (tp_model_config_t.devices). Each device holds a replica of the
 * variables and slots; the towers all-reduce their gradients and each
 * replica applies the same update.
 *
 * The devices are stand-ins: CPU backends behind one table that records,
 * per device, every buffer and stream it made, and checks that each call
 * (an op's inputs, output, gradients, workspace and batch-norm state; an
 * update's buffers; a copy's device side; the stream) uses only its own
 * device's memory. A tower reading another device's variables, or an update
 * written to the wrong replica, is counted and fails the test; so does a
 * replica that drifts from the one-device run. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/clock.h>
#include <towerpack/towerpack.h>
#include "gpu/backend_impl.h"
#include "gpu/graph/graph_internal.h"
#include "gpu/step_testutil.h"

#define MAX_BUFS 1024

typedef struct {
    tp_backend_t base; /* first: the model's handle on this device */
    tp_backend_t *cpu;
    pthread_mutex_t mu;
    const void *buf[MAX_BUFS];
    size_t bytes[MAX_BUFS];
    int nbufs;
    const void *streams[64];
    int nstreams;
    int calls, foreign; /* calls made; calls that touched other memory */
    /* the all-reduce in buckets: begun, their floats, ended; backward ops
     * run while a bucket had begun and the pass had not ended */
    int begins, ends, overlapped, in_pass;
    size_t floats_begun;
    char first_foreign[128];
    int *destroyed;     /* set to 1 by destroy, when not NULL */
    int sync_us;        /* a sync takes this long: the device still busy */
} s_dev_t;

static s_dev_t *s_of(tp_backend_t *b) { return (s_dev_t *)b->impl; }

static int s_owns_locked(s_dev_t *d, const void *p) {
    for (int i = 0; i < d->nbufs; i++)
        if ((const char *)p >= (const char *)d->buf[i] &&
            (const char *)p < (const char *)d->buf[i] + d->bytes[i])
            return 1;
    return 0;
}

static int s_stream_ok_locked(s_dev_t *d, const void *s) {
    for (int i = 0; s && i < d->nstreams; i++)
        if (d->streams[i] == s)
            return 1;
    return s == NULL;
}

/* Count one call on device d; `ptrs` (NULLs skipped) must all be d's. */
static void s_check(tp_backend_t *b, const char *what, tp_stream_t *s,
                    const void *const *ptrs, int n) {
    s_dev_t *d = s_of(b);
    pthread_mutex_lock(&d->mu);
    d->calls++;
    int ok = s_stream_ok_locked(d, s);
    for (int i = 0; ok && i < n; i++)
        ok = !ptrs[i] || s_owns_locked(d, ptrs[i]);
    if (!ok && d->foreign++ == 0)
        snprintf(d->first_foreign, sizeof d->first_foreign, "%s", what);
    pthread_mutex_unlock(&d->mu);
}

static void *s_alloc(tp_backend_t *b, size_t bytes) {
    s_dev_t *d = s_of(b);
    void *p = d->cpu->ops->alloc(d->cpu, bytes);
    pthread_mutex_lock(&d->mu);
    cr_assert_lt(d->nbufs, MAX_BUFS);
    d->buf[d->nbufs] = p;
    d->bytes[d->nbufs++] = bytes;
    pthread_mutex_unlock(&d->mu);
    return p;
}

static void s_free(tp_backend_t *b, void *p) {
    s_dev_t *d = s_of(b);
    pthread_mutex_lock(&d->mu);
    int found = 0;
    for (int i = 0; i < d->nbufs && !found; i++)
        if (d->buf[i] == p) {
            d->buf[i] = d->buf[--d->nbufs];
            d->bytes[i] = d->bytes[d->nbufs];
            found = 1;
        }
    if (!found && d->foreign++ == 0)
        snprintf(d->first_foreign, sizeof d->first_foreign, "free");
    pthread_mutex_unlock(&d->mu);
    d->cpu->ops->free(d->cpu, p);
}

static tp_status_t s_copy(tp_backend_t *b, tp_stream_t *s, void *dst,
                          const void *src, size_t bytes, tp_copy_kind_t kind) {
    const void *p[2] = {kind != TP_COPY_D2H ? dst : NULL,
                        kind != TP_COPY_H2D ? src : NULL};
    s_check(b, "copy", s, p, 2);
    return s_of(b)->cpu->ops->copy(s_of(b)->cpu, s, dst, src, bytes, kind);
}

static tp_status_t s_fill(tp_backend_t *b, tp_stream_t *s, float *dst,
                          float value, size_t count) {
    const void *p[1] = {dst};
    s_check(b, "fill", s, p, 1);
    return s_of(b)->cpu->ops->fill(s_of(b)->cpu, s, dst, value, count);
}

static tp_stream_t *s_stream_new(tp_backend_t *b) {
    s_dev_t *d = s_of(b);
    tp_stream_t *s = d->cpu->ops->stream_new(d->cpu);
    pthread_mutex_lock(&d->mu);
    cr_assert_lt(d->nstreams, 64);
    d->streams[d->nstreams++] = s;
    pthread_mutex_unlock(&d->mu);
    return s;
}

static void s_stream_destroy(tp_backend_t *b, tp_stream_t *s) {
    s_check(b, "stream_destroy", s, NULL, 0);
    s_of(b)->cpu->ops->stream_destroy(s_of(b)->cpu, s);
}

static tp_status_t s_stream_sync(tp_backend_t *b, tp_stream_t *s) {
    s_check(b, "stream_sync", s, NULL, 0);
    if (s_of(b)->sync_us)
        usleep((useconds_t)s_of(b)->sync_us);
    return s_of(b)->cpu->ops->stream_sync(s_of(b)->cpu, s);
}

static void s_check_call(tp_backend_t *b, const char *what, tp_stream_t *s,
                         const tp_op_call_t *c) {
    const void *p[2 * TP_OP_MAX_INPUTS + 5];
    int n = 0;
    for (int i = 0; i < c->ninputs; i++) {
        p[n++] = c->x[i];
        p[n++] = c->dx ? c->dx[i] : NULL;
    }
    p[n++] = c->y;
    p[n++] = c->dy;
    p[n++] = c->workspace_bytes ? c->workspace : NULL;
    p[n++] = c->state[0];
    p[n++] = c->state[1];
    char msg[128];
    snprintf(msg, sizeof msg, "%s of %s", what, c->name);
    s_check(b, msg, s, p, n);
}

/* the CPU's own plan of an op's workspace (its oneDNN primitives'
 * scratchpads): asked of the stand-in, the CPU's table would plan for a
 * backend without oneDNN, and its matmul would fall back to OpenBLAS */
static size_t s_workspace(tp_backend_t *b, const tp_op_call_t *c) {
    return s_of(b)->cpu->ops->op_workspace(s_of(b)->cpu, c);
}

static tp_status_t s_forward(tp_backend_t *b, tp_stream_t *s, const tp_op_call_t *c) {
    s_check_call(b, "forward", s, c);
    return s_of(b)->cpu->ops->op_forward(s_of(b)->cpu, s, c);
}

static tp_status_t s_backward(tp_backend_t *b, tp_stream_t *s, const tp_op_call_t *c) {
    s_check_call(b, "backward", s, c);
    s_dev_t *d = s_of(b);
    pthread_mutex_lock(&d->mu);
    d->overlapped += d->in_pass;
    pthread_mutex_unlock(&d->mu);
    return s_of(b)->cpu->ops->op_backward(s_of(b)->cpu, s, c);
}

static tp_status_t s_sgd(tp_backend_t *b, tp_stream_t *s, float *w, const float *g,
                         float *mom, size_t n, float lr, float momentum, int nesterov) {
    const void *p[3] = {w, g, mom};
    s_check(b, "sgd_update", s, p, 3);
    return s_of(b)->cpu->ops->sgd_update(s_of(b)->cpu, s, w, g, mom, n, lr,
                                         momentum, nesterov);
}

static tp_status_t s_adam(tp_backend_t *b, tp_stream_t *s, float *w, const float *g,
                          float *m1, float *m2, size_t n, float lr, float b1,
                          float b2, float eps, float wd, int64_t step) {
    const void *p[4] = {w, g, m1, m2};
    s_check(b, "adam_update", s, p, 4);
    return s_of(b)->cpu->ops->adam_update(s_of(b)->cpu, s, w, g, m1, m2, n, lr,
                                          b1, b2, eps, wd, step);
}

/* A communicator across "processes" (comm_id, comm_join): models in
 * threads that join with the same id share one CPU communicator, each as
 * its own rank; the handle a model gets is its rank's. */
typedef struct {
    char id[32];
    int nranks;
    tp_comm_t *cpu;
} s_shared_t;

typedef struct {
    s_shared_t *shared;
    int rank;
} s_joined_t;

static pthread_mutex_t s_join_mu = PTHREAD_MUTEX_INITIALIZER;
static s_shared_t s_shared[4];
static s_joined_t s_joined[8];
static int s_nshared, s_njoined, s_ids;

static s_joined_t *s_joined_of(tp_comm_t *c) {
    for (int i = 0; i < s_njoined; i++)
        if ((void *)&s_joined[i] == (void *)c)
            return &s_joined[i];
    return NULL;
}

static tp_status_t s_comm_id(tp_backend_t *b, void *id, size_t cap, size_t *len) {
    (void)b;
    char buf[32];
    pthread_mutex_lock(&s_join_mu);
    int k = s_ids++;
    pthread_mutex_unlock(&s_join_mu);
    *len = (size_t)snprintf(buf, sizeof buf, "stand-in %d", k) + 1;
    cr_assert_leq(*len, cap);
    memcpy(id, buf, *len);
    return TP_OK;
}

static tp_comm_t *s_comm_join(tp_backend_t *b, int nranks, int rank,
                              const void *id, size_t len) {
    pthread_mutex_lock(&s_join_mu);
    s_shared_t *sh = NULL;
    for (int i = 0; i < s_nshared && !sh; i++)
        if (!strncmp(s_shared[i].id, id, len))
            sh = &s_shared[i];
    if (!sh) {
        cr_assert_lt(s_nshared, 4);
        sh = &s_shared[s_nshared++];
        snprintf(sh->id, sizeof sh->id, "%s", (const char *)id);
        sh->nranks = nranks;
        sh->cpu = s_of(b)->cpu->ops->comm_new(s_of(b)->cpu, nranks);
    }
    cr_assert_lt(s_njoined, 8);
    s_joined_t *j = &s_joined[s_njoined++];
    *j = (s_joined_t){sh, rank};
    pthread_mutex_unlock(&s_join_mu);
    return (tp_comm_t *)(void *)j;
}

/* The collective spans the devices: the buffer and stream are the rank's. */
static tp_status_t s_allreduce(tp_backend_t *b, tp_comm_t *c, int rank,
                               tp_stream_t *s, float *buf, size_t count, int avg) {
    const void *p[1] = {buf};
    s_check(b, "allreduce", s, p, 1);
    pthread_mutex_lock(&s_join_mu);
    s_joined_t *j = s_joined_of(c);
    pthread_mutex_unlock(&s_join_mu);
    if (j) {  /* across "processes": the one local rank is the joined one */
        cr_assert_eq(rank, 0);
        return s_of(b)->cpu->ops->allreduce(s_of(b)->cpu, j->shared->cpu, j->rank,
                                            s, buf, count, avg);
    }
    return s_of(b)->cpu->ops->allreduce(s_of(b)->cpu, c, rank, s, buf, count, avg);
}

static tp_status_t s_begin(tp_backend_t *b, tp_comm_t *c, int rank,
                           tp_stream_t *s, float *buf, size_t count, int avg) {
    const void *p[1] = {buf};
    s_check(b, "allreduce_begin", s, p, 1);
    s_dev_t *d = s_of(b);
    pthread_mutex_lock(&d->mu);
    d->begins++;
    d->floats_begun += count;
    d->in_pass = 1;
    pthread_mutex_unlock(&d->mu);
    return s_of(b)->cpu->ops->allreduce_begin(s_of(b)->cpu, c, rank, s, buf, count, avg);
}

static tp_status_t s_end(tp_backend_t *b, tp_comm_t *c, int rank, tp_stream_t *s) {
    s_check(b, "allreduce_end", s, NULL, 0);
    s_dev_t *d = s_of(b);
    pthread_mutex_lock(&d->mu);
    d->ends++;
    d->in_pass = 0;
    pthread_mutex_unlock(&d->mu);
    return s_of(b)->cpu->ops->allreduce_end(s_of(b)->cpu, c, rank, s);
}

static tp_comm_t *s_comm_new(tp_backend_t *b, int nranks) {
    return s_of(b)->cpu->ops->comm_new(s_of(b)->cpu, nranks);
}
static void s_comm_destroy(tp_backend_t *b, tp_comm_t *c) {
    pthread_mutex_lock(&s_join_mu);
    s_joined_t *j = s_joined_of(c);
    pthread_mutex_unlock(&s_join_mu);
    if (!j)
        s_of(b)->cpu->ops->comm_destroy(s_of(b)->cpu, c);
    /* the shared CPU communicator lives to the test's end */
}
static void s_comm_abort(tp_backend_t *b, tp_comm_t *c) {
    s_of(b)->cpu->ops->comm_abort(s_of(b)->cpu, c);
}

static void s_destroy(tp_backend_t *b) {
    s_dev_t *d = s_of(b);
    cr_expect_eq(d->nbufs, 0, "device %d: %d buffers not freed", b->device, d->nbufs);
    if (d->destroyed)
        *d->destroyed = 1;
    tp_backend_destroy(&d->cpu);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static tp_backend_ops_t s_ops;

/* Stand-in device `dev`, freed by tp_backend_destroy. */
static tp_backend_t *s_dev_new(int dev) {
    s_dev_t *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    d->cpu = tp_backend_cpu_new(1);
    cr_assert_not_null(d->cpu);
    pthread_mutex_init(&d->mu, NULL);
    if (!s_ops.name) {  /* one table for every stand-in (one kind) */
        s_ops = *d->cpu->ops;
        s_ops.name = "stand-in";
        s_ops.alloc = s_alloc;
        s_ops.free = s_free;
        s_ops.copy = s_copy;
        s_ops.fill = s_fill;
        s_ops.stream_new = s_stream_new;
        s_ops.stream_destroy = s_stream_destroy;
        s_ops.stream_sync = s_stream_sync;
        s_ops.op_workspace = s_workspace;
        s_ops.op_forward = s_forward;
        s_ops.op_backward = s_backward;
        s_ops.sgd_update = s_sgd;
        s_ops.adam_update = s_adam;
        s_ops.comm_new = s_comm_new;
        s_ops.comm_destroy = s_comm_destroy;
        s_ops.allreduce = s_allreduce;
        s_ops.comm_abort = s_comm_abort;
        s_ops.allreduce_begin = s_begin;
        s_ops.allreduce_end = s_end;
        s_ops.allreduce_sgd = NULL;  /* the CPU's fused pass knows only its own comm */
        s_ops.comm_id = s_comm_id;
        s_ops.comm_join = s_comm_join;
        s_ops.allreduce_local = NULL; /* one thread for all: refused */
        s_ops.destroy = s_destroy;
        /* the rest (gemm, staging, graphs, host memory) stay the CPU's,
         * which reach only what the checked calls gave them */
        s_ops.host_alloc = NULL;
        s_ops.copy_async = NULL;
        s_ops.graph_begin = NULL;
    }
    d->base.ops = &s_ops;
    d->base.impl = d;
    d->base.device = dev;
    return &d->base;
}

static tp_model_desc_t s_desc(tp_optimizer_t *(*opt)(void *)) {
    return (tp_model_desc_t){.inputs = stu_inputs, .ninputs = 2, .build = stu_cnn,
                             .optimizer = opt};
}

/* `towers` towers on `ndev` stand-in devices (0: on one CPU backend),
 * all-reduced in buckets of `bucket` bytes (0: after the backward pass;
 * -1: the default). */
static tp_model_t *s_model_b(int towers, int ndev, tp_optimizer_t *(*opt)(void *),
                             int64_t bucket) {
    tp_model_config_t c = stu_config(towers);
    c.bucket_bytes = bucket;
    c.infer_batch = 16;
    c.ndevices = ndev;
    for (int r = 0; r < ndev; r++)
        c.devices[r] = s_dev_new(r);
    c.own_backend = 1;
    tp_model_desc_t d = s_desc(opt);
    tp_model_t *m = tp_model_new(&d, &c);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

static tp_model_t *s_model(int towers, int ndev, tp_optimizer_t *(*opt)(void *)) {
    return s_model_b(towers, ndev, opt, -1);
}

/* Replica r's trainable arena and slots equal replica 0's of `ref`,
 * bit for bit. */
static void s_expect_replica(const tp_model_t *m, int r, const tp_model_t *ref,
                             const char *what) {
    size_t n = m->ntrain * sizeof(float);
    cr_expect_eq(memcmp(m->rep[r].train_arena, ref->rep[0].train_arena, n), 0,
                 "%s: replica %d's variables differ", what, r);
    for (int s = 0; s < m->nslots; s++)
        cr_expect_eq(memcmp(m->rep[r].slots[s], ref->rep[0].slots[s], n), 0,
                     "%s: replica %d's slot %d differs", what, r, s);
}

static void s_expect_own_memory(tp_model_t *m) {
    for (int r = 0; r < tp_model_device_count(m); r++) {
        s_dev_t *d = s_of(m->rep[r].backend);
        cr_expect_gt(d->calls, 50, "device %d ran %d calls", r, d->calls);
        cr_expect_eq(d->foreign, 0, "device %d: %d calls touched another "
                     "device's memory, first %s", r, d->foreign, d->first_foreign);
    }
}

Test(model_devices, towers_are_placed_round_robin_each_on_its_device) {
    tp_model_t *m = s_model(4, 2, stu_nesterov);
    cr_assert_eq(tp_model_device_count(m), 2);
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(tp_model_tower_backend(m, i), m->rep[i % 2].backend);
        cr_expect_eq(tp_tower_device(m->towers[i]), i % 2);
    }
    cr_expect_eq(tp_model_tower_backend(m, -1), tp_model_backend(m),
                 "the inference graph is on replica 0's device");
    cr_expect_null(tp_model_tower_backend(m, 4));
    tp_model_destroy(&m);
    /* one device in the list is the model's backend, taken and freed */
    int gone = 0;
    tp_model_config_t c = stu_config(1);
    c.ndevices = 1;
    c.devices[0] = s_dev_new(0);
    s_of(c.devices[0])->destroyed = &gone;
    c.own_backend = 1;
    tp_model_desc_t d = s_desc(stu_nesterov);
    m = tp_model_new(&d, &c);
    cr_assert_not_null(m, "%s", tp_last_error());
    cr_expect_eq(tp_model_backend(m), c.devices[0]);
    cr_expect_eq(tp_model_device_count(m), 1);
    tp_model_destroy(&m);
    cr_expect(gone, "devices[0] was not freed with the model");
}

/* Two towers on two devices train exactly as two towers on one: the same
 * sums in the same order, the same elementwise update in each replica. */
static void s_two_devices_as_one(tp_optimizer_t *(*opt)(void *), int ntowers) {
    tp_model_t *one = s_model(ntowers, 0, opt), *two = s_model(ntowers, 2, opt);
    for (int s = 0; s < 5; s++) {
        stu_step_threads(one, s);
        stu_step_threads(two, s);
        for (int r = 0; r < 2; r++)
            s_expect_replica(two, r, one, "after a step");
    }
    s_expect_own_memory(two);
    /* the inference graph reads replica 0, as tp_model_var does */
    tp_tensor_t a, b;
    cr_assert_eq(tp_model_var(one, "fc2/W", &a), TP_OK);
    cr_assert_eq(tp_model_var(two, "fc2/W", &b), TP_OK);
    cr_expect_eq(memcmp(a.data, b.data, a.nbytes), 0);
    tp_tensor_fini(&a);
    tp_tensor_fini(&b);
    static uint8_t x[16 * 144];
    static int32_t y[16];
    tp_tensor_t in[2];
    stu_batch(9, 0, x, y, in);
    tp_fetch_t f1 = {.name = "accuracy"}, f2 = {.name = "accuracy"};
    tp_run_opts_t o = {.stages = TP_RUN_FORWARD};
    cr_assert_eq(tp_model_run(one, -1, in, 2, &f1, 1, &o), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(two, -1, in, 2, &f2, 1, &o), TP_OK, "%s", tp_last_error());
    float v1, v2;
    cr_expect_eq(*(const float *)tp_model_view_host(one, &f1.value, &v1, 4),
                 *(const float *)tp_model_view_host(two, &f2.value, &v2, 4));
    tp_tensor_fini(&f1.value);
    tp_tensor_fini(&f2.value);
    tp_model_destroy(&one);
    tp_model_destroy(&two);
}

/* tp_model_device_wait_ns: the time the host sat in the device's sync at
 * the end of a step. A device whose sync takes 3 ms (its work not yet
 * done) gives at least 3 ms a step, and no more than the steps took; the
 * CPU, whose steps end done, next to nothing. tp-bench cuda steps prints
 * it as the share of the time the host waited for the GPU. */
static void s_train_steps(tp_model_t *m, int n) {
    static uint8_t x[16 * 144];
    static int32_t y[16];
    tp_tensor_t in[2];
    for (int s = 0; s < n; s++) {
        stu_batch(s, 0, x, y, in);
        cr_assert_eq(tp_model_run(m, TP_ALL_TOWERS, in, 2, NULL, 0, NULL), TP_OK,
                     "step %d: %s", s, tp_last_error());
    }
}

Test(model_devices, the_host_s_wait_for_the_device_is_counted) {
    tp_model_t *slow = s_model(1, 1, stu_nesterov), *cpu = s_model(1, 0, stu_nesterov);
    s_of(tp_model_backend(slow))->sync_us = 3000;
    cr_expect_eq(tp_model_device_wait_ns(slow), 0);
    uint64_t t0 = tp_now_ns();
    s_train_steps(slow, 5);
    uint64_t took = tp_now_ns() - t0, waited = tp_model_device_wait_ns(slow);
    cr_expect_geq(waited, 5 * 3000000ull, "5 steps with 3 ms syncs: %llu ns",
                  (unsigned long long)waited);
    cr_expect_leq(waited, took, "waited %llu ns of %llu", (unsigned long long)waited,
                  (unsigned long long)took);
    s_train_steps(cpu, 5);
    cr_expect_lt(tp_model_device_wait_ns(cpu), waited / 10, "the CPU: %llu ns",
                 (unsigned long long)tp_model_device_wait_ns(cpu));
    tp_model_destroy(&slow);
    tp_model_destroy(&cpu);
}

Test(model_devices, two_devices_train_as_one_with_nesterov) {
    s_two_devices_as_one(stu_nesterov, 2);
}

Test(model_devices, four_towers_on_two_devices_train_as_on_one_with_adam) {
    s_two_devices_as_one(stu_adam, 4);
}

/* Buckets of 1 KiB (stu_cnn has 1,424 trainable floats): each tower
 * begins the all-reduce of a bucket once its gradients are final, while
 * its backward pass goes on; the buckets cover the arena once a step, and
 * the result is the one all-reduce after the pass gives, bit for bit. */
Test(model_devices, buckets_are_reduced_during_the_backward_pass) {
    tp_model_t *one = s_model_b(2, 0, stu_nesterov, 0);
    tp_model_t *two = s_model_b(2, 2, stu_nesterov, 1024);
    int nb = two->towers[0]->nbuckets;
    cr_assert_geq(nb, 3, "%d buckets", nb);
    cr_assert_eq(two->towers[1]->nbuckets, nb);
    for (int k = 0; k < nb; k++) {
        const struct tp_bucket *a = &two->towers[0]->buckets[k],
                               *b = &two->towers[1]->buckets[k];
        cr_assert(a->lo == b->lo && a->hi == b->hi && a->after == b->after,
                  "bucket %d differs between the towers", k);
        cr_assert_lt(a->lo, a->hi);
        if (k > 0)
            cr_assert_geq(two->towers[0]->buckets[k - 1].after, a->after,
                          "bucket %d is begun out of the backward order", k);
    }
    for (int s = 0; s < 4; s++) {
        stu_step_threads(one, s);
        stu_step_threads(two, s);
        for (int r = 0; r < 2; r++)
            s_expect_replica(two, r, one, "buckets");
    }
    for (int r = 0; r < 2; r++) {
        s_dev_t *d = s_of(two->rep[r].backend);
        cr_expect_eq(d->begins, 4 * nb, "device %d: %d buckets begun", r, d->begins);
        cr_expect_eq(d->floats_begun, 4 * two->ntrain,
                     "device %d: the buckets cover %zu floats in 4 steps, not %zu",
                     r, d->floats_begun, 4 * two->ntrain);
        cr_expect_eq(d->ends, 4);
        cr_expect_gt(d->overlapped, 4, "device %d: %d backward ops beside a "
                     "bucket's all-reduce", r, d->overlapped);
    }
    s_expect_own_memory(two);
    tp_model_destroy(&one);
    tp_model_destroy(&two);
    /* the defaults: 25 MiB on a device, none on the CPU */
    tp_model_t *dev = s_model(2, 2, stu_nesterov), *cpu = s_model_b(2, 0, stu_nesterov, -1);
    cr_expect_eq(dev->config.bucket_bytes, 25 << 20);
    cr_expect_eq(dev->towers[0]->nbuckets, 1);
    cr_expect_eq(cpu->config.bucket_bytes, 0);
    cr_expect_eq(cpu->towers[0]->nbuckets, 0);
    tp_model_destroy(&dev);
    tp_model_destroy(&cpu);
}

/* Across processes (what dist/ does for a GPU model under MPI): rank 0
 * makes the id, each "process" (a model on its own thread) joins, and
 * tp_model_allreduce_ranks leaves the mean of the ranks' gradients in
 * each, bit for bit the CPU's (a + b) x 0.5. */
typedef struct {
    tp_model_t *m;
    int rank;
    const unsigned char *id;
    size_t len;
    float *before;
    tp_status_t rc;
    char err[256];
} s_proc_t;

static void *s_proc_main(void *arg) {
    s_proc_t *p = arg;
    static uint8_t x[2][16 * 144];
    static int32_t y[2][16];
    tp_tensor_t in[2];
    stu_batch(0, p->rank, x[p->rank], y[p->rank], in);
    tp_run_opts_t g = {.stages = TP_RUN_GRADIENTS};
    p->rc = tp_model_comm_join(p->m, 2, p->rank, p->id, p->len);
    if (p->rc == TP_OK)
        p->rc = tp_model_run(p->m, 0, in, 2, NULL, 0, &g);
    if (p->rc == TP_OK) {
        memcpy(p->before, p->m->towers[0]->grads, p->m->ntrain * sizeof(float));
        p->rc = tp_model_allreduce_ranks(p->m);
    }
    snprintf(p->err, sizeof p->err, "%s", p->rc < 0 ? tp_last_error() : "");
    return NULL;
}

Test(model_devices, processes_join_with_rank_0s_id_and_average_their_gradients) {
    tp_model_t *cpu = s_model(1, 0, stu_nesterov);
    unsigned char id[TP_COMM_ID_MAX];
    size_t len = 0;
    cr_expect_eq(tp_model_comm_id(cpu, id, &len), TP_ERR_UNSUPPORTED);
    cr_expect(strstr(tp_last_error(), "the cpu backend has no communicator across "
                     "processes"), "%s", tp_last_error());
    cr_expect_eq(tp_model_allreduce_ranks(cpu), TP_ERR_STATE);
    tp_model_destroy(&cpu);
    tp_model_t *m[2];
    for (int r = 0; r < 2; r++) {
        tp_model_config_t c = stu_config(1);
        c.backend = s_dev_new(r);
        c.own_backend = 1;
        tp_model_desc_t d = s_desc(stu_nesterov);
        m[r] = tp_model_new(&d, &c);
        cr_assert_not_null(m[r], "%s", tp_last_error());
    }
    cr_assert_eq(tp_model_comm_id(m[0], id, &len), TP_OK, "%s", tp_last_error());
    cr_assert_gt(len, 0);
    s_proc_t p[2];
    pthread_t th[2];
    size_t n = m[0]->ntrain;
    for (int r = 0; r < 2; r++) {
        p[r] = (s_proc_t){.m = m[r], .rank = r, .id = id, .len = len,
                          .before = malloc(n * sizeof(float))};
        cr_assert_eq(pthread_create(&th[r], NULL, s_proc_main, &p[r]), 0);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        cr_assert_eq(p[r].rc, TP_OK, "rank %d: %s", r, p[r].err);
    }
    int differ = 0;
    for (size_t i = 0; i < n; i++) {
        float want = (p[0].before[i] + p[1].before[i]) * 0.5f;
        differ += p[0].before[i] != p[1].before[i];
        cr_assert_eq(m[0]->towers[0]->grads[i], want, "gradient %zu", i);
        cr_assert_eq(m[1]->towers[0]->grads[i], want, "gradient %zu", i);
    }
    cr_expect_gt(differ, (int)n / 2, "the ranks' batches gave alike gradients");
    cr_expect_eq(tp_model_comm_join(m[0], 2, 0, id, len), TP_ERR_STATE);
    for (int r = 0; r < 2; r++) {
        free(p[r].before);
        tp_model_destroy(&m[r]);
    }
}

Test(model_devices, a_checkpoint_load_writes_every_replica) {
    char dir[] = "/tmp/tp-devices-XXXXXX", path[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    tp_model_t *src = s_model(2, 0, stu_adam);
    for (int s = 0; s < 3; s++)
        stu_step_threads(src, s);
    cr_assert_eq(tp_checkpoint_save(src, path, NULL), TP_OK, "%s", tp_last_error());
    tp_model_t *two = s_model(2, 2, stu_adam);
    cr_assert_eq(tp_checkpoint_load(two, path, TP_LOAD_STRICT, NULL), TP_OK, "%s",
                 tp_last_error());
    for (int r = 0; r < 2; r++)
        s_expect_replica(two, r, src, "after the load");
    /* and they train on alike */
    stu_step_threads(src, 3);
    stu_step_threads(two, 3);
    for (int r = 0; r < 2; r++)
        s_expect_replica(two, r, src, "a step after the load");
    s_expect_own_memory(two);
    tp_model_destroy(&src);
    tp_model_destroy(&two);
    remove(path);
    rmdir(dir);
}

Test(model_devices, one_thread_for_every_tower_is_refused_with_the_reason) {
    tp_model_t *m = s_model(2, 2, stu_nesterov);
    static uint8_t x[2][16 * 144];
    static int32_t y[2][16];
    tp_tensor_t in[4];
    stu_batch(0, 0, x[0], y[0], in);
    stu_batch(0, 1, x[1], y[1], in + 2);
    cr_expect_eq(tp_model_run(m, TP_ALL_TOWERS, in, 4, NULL, 0, NULL),
                 TP_ERR_UNSUPPORTED);
    cr_expect(strstr(tp_last_error(), "span 2 devices") &&
              strstr(tp_last_error(), "own thread"), "%s", tp_last_error());
    /* gradients that were not all-reduced cannot update the replicas */
    tp_run_opts_t g = {.stages = TP_RUN_GRADIENTS};
    cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, &g), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_model_run(m, 1, in + 2, 2, NULL, 0, &g), TP_OK, "%s", tp_last_error());
    tp_run_opts_t u = {.stages = TP_RUN_UPDATE};
    cr_expect_eq(tp_model_run(m, TP_ALL_TOWERS, NULL, 0, NULL, 0, &u), TP_ERR_STATE);
    cr_expect(strstr(tp_last_error(), "tower0's gradients were not all-reduced"),
              "%s", tp_last_error());
    tp_model_destroy(&m);
}

Test(model_devices, bad_device_lists_are_named_and_the_backends_freed) {
    tp_model_desc_t d = s_desc(stu_nesterov);
    struct {
        int towers, ndev, same, cpu_second, null_second;
        const char *says;
    } cases[] = {
        {1, 2, 0, 0, 0, "1 training towers on 2 devices"},
        {2, 2, 1, 0, 0, "devices[0] and devices[1] are the same backend"},
        {2, 2, 0, 1, 0, "devices[1] is a cpu backend, devices[0] a stand-in one"},
        {2, 2, 0, 0, 1, "devices[1] is NULL"},
        {2, 9, 0, 0, 0, "9 devices (0..8)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tp_model_config_t c = tp_model_config_default();
        c.towers = cases[k].towers;
        c.ndevices = cases[k].ndev;
        int gone[2] = {0, 0};
        if (cases[k].ndev <= TP_MODEL_DEVICES_MAX) {
            c.devices[0] = s_dev_new(0);
            s_of(c.devices[0])->destroyed = &gone[0];
            if (cases[k].cpu_second) {
                c.devices[1] = tp_backend_cpu_new(1);
            } else if (!cases[k].same && !cases[k].null_second) {
                c.devices[1] = s_dev_new(1);
                s_of(c.devices[1])->destroyed = &gone[1];
            } else if (cases[k].same) {
                c.devices[1] = c.devices[0];
            }
        }
        c.own_backend = 1;
        cr_expect_null(tp_model_new(&d, &c), "case %zu", k);
        cr_expect(strstr(tp_last_error(), cases[k].says), "case %zu: %s", k,
                  tp_last_error());
        if (cases[k].ndev <= TP_MODEL_DEVICES_MAX)
            cr_expect(gone[0], "case %zu: devices[0] not destroyed", k);
        if (cases[k].ndev <= TP_MODEL_DEVICES_MAX && !cases[k].same &&
            !cases[k].null_second && !cases[k].cpu_second)
            cr_expect(gone[1], "case %zu: devices[1] not destroyed", k);
    }
}
