/* towerpack pipeline/input: the InputSource base (split out of
 * pipeline/train/train.c so that the inputs do not live in the trainer) and
 * the two simplest inputs, FeedInput (a DataFlow on the trainer's thread)
 * and DummyConstantInput (one fixed batch, for measuring the engine). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <towerpack/log.h>
#include <towerpack/launch.h>


/* ---- inputs ------------------------------------------------------------------ */

struct tp_input {
    const tp_input_ops_t *ops;
    void *impl;
};

tp_input_t *tp_input_new(const tp_input_ops_t *ops, void *impl) {
    tp_input_t *self = malloc(sizeof *self);
    if (!self) {
        if (ops->destroy)
            ops->destroy(impl);
        tp_error(TP_ERR_NOMEM, "input %s", ops->name);
        return NULL;
    }
    self->ops = ops;
    self->impl = impl;
    return self;
}

void tp_input_destroy(tp_input_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_input_t *self = *self_p;
    if (self->ops->stop)
        self->ops->stop(self->impl);
    if (self->ops->destroy)
        self->ops->destroy(self->impl);
    free(self);
    *self_p = NULL;
}

const char *tp_input_name(const tp_input_t *self) { return self->ops->name; }

tp_status_t tp_input_start(tp_input_t *self, int towers, uint64_t seed,
                           int64_t skip) {
    if (towers < 1 || skip < 0)
        return tp_error(TP_ERR_INVALID, "%s: start with %d towers, skip %lld",
                        self->ops->name, towers, (long long)skip);
    return self->ops->start(self->impl, towers, seed, skip);
}

tp_status_t tp_input_next(tp_input_t *self, int tower, tp_datapoint_t **out) {
    if (!out || tower < 0)
        return tp_error(TP_ERR_INVALID, "%s: the next batch needs a tower >= 0 "
                        "(got %d) and a place to put it%s", self->ops->name,
                        tower, out ? "" : " (out is NULL)");
    return self->ops->next(self->impl, tower, out);
}

void tp_input_release(tp_input_t *self, int tower, tp_datapoint_t **dp_p) {
    if (!dp_p || !*dp_p)
        return;
    if (self && self->ops->release) {
        self->ops->release(self->impl, tower, *dp_p);
        *dp_p = NULL;
    } else {
        tp_datapoint_destroy(dp_p);
    }
}

int64_t tp_input_size(tp_input_t *self) { return self->ops->size(self->impl); }

tp_status_t tp_input_bind(tp_input_t *self, tp_backend_t *backend) {
    return tp_input_bind_towers(self, &backend, 1);
}

tp_status_t tp_input_bind_towers(tp_input_t *self, tp_backend_t *const *backends,
                                 int n) {
    if (!self || !self->ops->bind)
        return TP_OK;
    if (!backends || n < 1)
        return tp_error(TP_ERR_INVALID, "%s: bound to %d backends",
                        tp_input_name(self), n);
    return self->ops->bind(self->impl, backends, n);
}

void tp_input_set_watchdog(tp_input_t *self, double seconds) {
    if (self && self->ops->set_watchdog)
        self->ops->set_watchdog(self->impl, seconds);
}
/* Through the ops table only: the trainer publishes whatever an input
 * says about itself, so it never needs to know what kind of input it has
 * (a custom input's rows show up like QueueInput's). */
int tp_input_stats(tp_input_t *self, tp_stats_row_t *rows, int max) {
    if (!self || !rows || max <= 0 || !self->ops->stats)
        return 0;
    int n = self->ops->stats(self->impl, rows, max);
    return n < 0 ? 0 : n > max ? max : n;  /* a user's table may miscount */
}

int tp_input_scalars(tp_input_t *self, tp_input_scalar_t *out, int max) {
    if (!self || !out || max <= 0 || !self->ops->scalars)
        return 0;
    int n = self->ops->scalars(self->impl, out, max);
    return n < 0 ? 0 : n > max ? max : n;
}

void *tp_input_impl(tp_input_t *self) { return self->impl; }
const tp_input_ops_t *tp_input_ops(const tp_input_t *self) { return self->ops; }

/* FeedInput */

static tp_status_t feed_next(void *impl, int tower, tp_datapoint_t **out);

static tp_status_t feed_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    TP_TRY(tp_dataflow_reset_state(impl, seed, 0));
    for (int64_t i = 0; i < skip; i++) {
        tp_datapoint_t *dp = NULL;
        TP_TRY(feed_next(impl, 0, &dp));
        tp_datapoint_destroy(&dp);
    }
    return TP_OK;
}

static tp_status_t feed_next(void *impl, int tower, tp_datapoint_t **out) {
    tp_status_t rc = tp_dataflow_next(impl, out);
    if (rc == TP_DONE) {  /* end of a pass: the epoch is the trainer's */
        rc = tp_dataflow_next(impl, out);
        if (rc == TP_DONE)
            return tp_error(TP_ERR_STATE, "FeedInput: the dataflow %s is empty",
                            tp_dataflow_name(impl));
    }
    return rc;
}

static int64_t feed_size(void *impl) { return tp_dataflow_size(impl); }

static void feed_destroy(void *impl) {
    tp_dataflow_t *df = impl;
    tp_dataflow_destroy(&df);
}

static const tp_input_ops_t s_feed_ops = {
    .name = "FeedInput", .start = feed_start, .next = feed_next,
    .size = feed_size, .destroy = feed_destroy,
};

tp_input_t *tp_input_feed(tp_dataflow_t *df) {
    if (!df)
        return NULL;
    return tp_input_new(&s_feed_ops, df);
}

/* DummyConstantInput */

typedef struct {
    tp_model_desc_t desc;
    int64_t batch;
    int classes;
    tp_datapoint_t *proto;
} s_dummy_t;

static tp_status_t dummy_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    s_dummy_t *d = impl;
    tp_rng_t r;
    tp_rng_init(&r, seed, 12345);
    tp_datapoint_destroy(&d->proto);
    d->proto = tp_datapoint_new(d->desc.ninputs);
    if (!d->proto)
        return tp_error(TP_ERR_NOMEM, "DummyConstantInput");
    for (int i = 0; i < d->desc.ninputs; i++) {
        const tp_input_desc_t *in = &d->desc.inputs[i];
        int64_t shape[TP_MAX_DIMS];
        memcpy(shape, in->shape, sizeof shape);
        shape[0] = d->batch;
        tp_tensor_t *t = tp_datapoint_get(d->proto, i);
        TP_TRY(tp_tensor_init(t, in->dtype, in->ndim, shape));
        size_t n = tp_tensor_numel(t);
        for (size_t k = 0; k < n; k++) {
            switch (in->dtype) {
            case TP_UINT8: ((uint8_t *)t->data)[k] = (uint8_t)tp_rng_u32(&r); break;
            case TP_INT32: ((int32_t *)t->data)[k] = (int32_t)tp_rng_below(&r, (uint64_t)d->classes); break;
            case TP_INT64: ((int64_t *)t->data)[k] = (int64_t)tp_rng_below(&r, (uint64_t)d->classes); break;
            case TP_FLOAT32: ((float *)t->data)[k] = (float)tp_rng_normal(&r); break;
            case TP_FLOAT64: ((double *)t->data)[k] = tp_rng_normal(&r); break;
            default: memset(t->data, 0, t->nbytes); k = n; break;
            }
        }
    }
    return TP_OK;
}

/* The same batch every time, lent rather than copied: a datapoint whose
 * components borrow the prototype's memory (the input outlives it). */
static tp_status_t dummy_next(void *impl, int tower, tp_datapoint_t **out) {
    s_dummy_t *d = impl;
    int n = tp_datapoint_size(d->proto);
    tp_datapoint_t *dp = tp_datapoint_new(n);
    if (!dp)
        return tp_error(TP_ERR_NOMEM, "DummyConstantInput");
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *p = tp_datapoint_cget(d->proto, i);
        TP_ASSERT(tp_tensor_init_wrap(tp_datapoint_get(dp, i), p->dtype, p->ndim,
                                      p->shape, p->data, NULL, NULL) == TP_OK);
    }
    *out = dp;
    return TP_OK;
}

static int64_t dummy_size(void *impl) { return -1; }

static void dummy_destroy(void *impl) {
    s_dummy_t *d = impl;
    tp_datapoint_destroy(&d->proto);
    free(d);
}

static const tp_input_ops_t s_dummy_ops = {
    .name = "DummyConstantInput", .start = dummy_start, .next = dummy_next,
    .size = dummy_size, .destroy = dummy_destroy,
};

tp_input_t *tp_input_dummy(const tp_model_desc_t *model, int64_t batch,
                           int label_classes, uint64_t seed) {
    s_dummy_t *d = calloc(1, sizeof *d);
    if (!d) {
        tp_error(TP_ERR_NOMEM, "DummyConstantInput");
        return NULL;
    }
    d->desc = *model;
    d->batch = batch;
    d->classes = label_classes > 0 ? label_classes : 10;
    (void)seed;
    return tp_input_new(&s_dummy_ops, d);
}

