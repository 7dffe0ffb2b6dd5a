/* towerpack dataflow: transforms (Batch, BatchByShape, Map, MapComponent,
 * Filter, FixedSize, Repeat, RepeatDatapoint, RandomChoose, RandomMix,
 * Concat, Join, SelectComponent, LocallyShuffle, Cache, Print).
 *
 * Every wrapper owns what it wraps. The rule that keeps passes aligned: when
 * an inner dataflow answers TP_DONE its pass is over, and the wrapper must
 * not call it again until the wrapper's own pass ends (or it would start a
 * new inner pass early); when a wrapper ends its pass before the inner one
 * did, it calls tp_dataflow_end_pass on the inner. */
#include <inttypes.h>
#include "df_internal.h"

/* Constructor prologue: validate, allocate impl, or destroy inner and fail. */
#define WRAP_ALLOC(self, inner, name)                                         \
    do {                                                                      \
        if (!(inner))                                                         \
            return NULL; /* an inner constructor failed: keep its error */    \
        (self) = calloc(1, sizeof *(self));                                   \
        if (!(self)) {                                                        \
            tp_dataflow_destroy(&(inner));                                    \
            tp_error(TP_ERR_NOMEM, "%s: out of memory", name);                \
            return NULL;                                                      \
        }                                                                     \
    } while (0)

#define WRAP_INVALID(inner, ...)                                              \
    do {                                                                      \
        tp_dataflow_destroy(&(inner));                                        \
        tp_error(TP_ERR_INVALID, __VA_ARGS__);                                \
        return NULL;                                                          \
    } while (0)

/* Wrappers of one inner dataflow start with this. */
typedef struct {
    tp_dataflow_t *inner;
} one_t;

static tp_status_t s_one_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                               uint64_t stream) {
    return df_reset_inner(((one_t *)impl)->inner, seed, stream);
}

static void s_one_end_pass(void *impl) {
    tp_dataflow_end_pass(((one_t *)impl)->inner);
}

static int64_t s_one_size(void *impl) {
    return tp_dataflow_size(((one_t *)impl)->inner);
}

static void s_one_destroy(void *impl) {
    tp_dataflow_destroy(&((one_t *)impl)->inner);
    free(impl);
}

/* ---- Batch ----------------------------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    int batch_size, remainder;
    int inner_done;   /* the inner pass ended inside the last batch */
} batch_t;

static tp_status_t s_shape_mismatch(const char *who, int64_t index, int comp,
                                    const tp_tensor_t *want,
                                    const tp_tensor_t *got) {
    char a[128], b[128];
    return tp_error(TP_ERR_SHAPE, "%s: datapoint %" PRId64 " of the batch, "
                    "component %d is %s but the first was %s", who, index,
                    comp, tp_tensor_describe(got, a, sizeof a),
                    tp_tensor_describe(want, b, sizeof b));
}

/* Allocate out (one component per component of `first`, each [n, ...]) and
 * copy `first` into slot 0. */
static tp_status_t s_stack_begin(const char *who, tp_datapoint_t *first,
                                 int64_t n, tp_datapoint_t **out) {
    int ncomp = tp_datapoint_size(first);
    tp_datapoint_t *o = tp_datapoint_new(ncomp);
    if (!o)
        return tp_error(TP_ERR_NOMEM, "%s: batch", who);
    for (int i = 0; i < ncomp; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(first, i);
        if (t->ndim + 1 > TP_MAX_DIMS) {
            tp_datapoint_destroy(&o);
            return tp_error(TP_ERR_SHAPE, "%s: component %d has %d dims, a "
                            "batch of it would exceed %d", who, i, t->ndim,
                            TP_MAX_DIMS);
        }
        int64_t shape[TP_MAX_DIMS];
        shape[0] = n;
        memcpy(shape + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        tp_tensor_t *dst = tp_datapoint_get(o, i);
        tp_status_t rc = tp_tensor_init(dst, t->dtype, t->ndim + 1, shape);
        if (rc != TP_OK) {
            tp_datapoint_destroy(&o);
            return tp_error_wrap(rc, "%s: component %d", who, i);
        }
        if (t->nbytes)
            memcpy(dst->data, t->data, t->nbytes);
    }
    *out = o;
    return TP_OK;
}

/* Copy dp into slot j of out after checking that it matches slot 0. */
static tp_status_t s_stack_put(const char *who, tp_datapoint_t *out,
                               const tp_datapoint_t *dp, int64_t j) {
    int ncomp = tp_datapoint_size(out);
    if (tp_datapoint_size(dp) != ncomp)
        return tp_error(TP_ERR_SHAPE, "%s: datapoint %" PRId64 " of the batch "
                        "has %d components but the first had %d", who, j,
                        tp_datapoint_size(dp), ncomp);
    for (int i = 0; i < ncomp; i++) {
        tp_tensor_t *dst = tp_datapoint_get(out, i);
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        if (t->dtype != dst->dtype || t->ndim + 1 != dst->ndim ||
            memcmp(t->shape, dst->shape + 1,
                   sizeof(int64_t) * (size_t)t->ndim) != 0) {
            tp_tensor_t want = *dst;  /* describe one slot */
            want.ndim = dst->ndim - 1;
            memmove(want.shape, dst->shape + 1,
                    sizeof(int64_t) * (size_t)want.ndim);
            return s_shape_mismatch(who, j, i, &want, t);
        }
        if (t->nbytes)
            memcpy((uint8_t *)dst->data + (size_t)j * t->nbytes, t->data,
                   t->nbytes);
    }
    return TP_OK;
}

/* Shrink a stacked datapoint to its first n slots (a remainder batch). */
static void s_stack_truncate(tp_datapoint_t *out, int64_t n) {
    for (int i = 0; i < tp_datapoint_size(out); i++) {
        tp_tensor_t *t = tp_datapoint_get(out, i);
        size_t slot = t->shape[0] ? t->nbytes / (size_t)t->shape[0] : 0;
        t->shape[0] = n;
        t->nbytes = slot * (size_t)n;
    }
}

static tp_status_t s_batch_begin(void *impl) {
    ((batch_t *)impl)->inner_done = 0;
    return TP_OK;
}

static tp_status_t s_batch_next(void *impl, tp_datapoint_t **out) {
    batch_t *self = impl;
    if (self->inner_done) {
        self->inner_done = 0;
        return TP_DONE;
    }
    tp_datapoint_t *dp = NULL, *o = NULL;
    tp_status_t rc = tp_dataflow_next(self->inner, &dp);
    if (rc != TP_OK)
        return rc;
    rc = s_stack_begin("batch", dp, self->batch_size, &o);
    tp_datapoint_destroy(&dp);
    if (rc != TP_OK)
        return rc;
    int64_t j = 1;
    int ended = 0;
    if (self->batch_size > 1 && tp_dataflow_has_next_into(self->inner)) {
        /* The source writes the other slots straight into the batch. */
        int64_t filled = 0;
        rc = tp_dataflow_next_into(self->inner, o, 1, self->batch_size - 1,
                                   &filled);
        if (rc < 0)
            goto fail;
        ended = rc == TP_DONE;
        j = 1 + filled;
    }
    for (; !ended && j < self->batch_size; j++) {
        rc = tp_dataflow_next(self->inner, &dp);
        if (rc == TP_DONE)
            break;
        if (rc < 0)
            goto fail;
        rc = s_stack_put("batch", o, dp, j);
        tp_datapoint_destroy(&dp);
        if (rc != TP_OK)
            goto fail;
    }
    if (j < self->batch_size) {
        if (!self->remainder) {
            tp_datapoint_destroy(&o);
            return TP_DONE;
        }
        s_stack_truncate(o, j);
        self->inner_done = 1;
    }
    *out = o;
    return TP_OK;
fail:
    tp_datapoint_destroy(&o);
    /* The inner pass may be mid-way: the next call resumes it, as a
     * consumer that skips a bad batch expects. */
    return rc;
}

static int64_t s_batch_size(void *impl) {
    batch_t *self = impl;
    int64_t n = tp_dataflow_size(self->inner);
    if (n < 0)
        return -1;
    /* n / b rounded up without n + b - 1, which could overflow */
    return n / self->batch_size +
           (self->remainder && n % self->batch_size != 0);
}

static void s_batch_end_pass(void *impl) {
    batch_t *self = impl;
    if (!self->inner_done)
        tp_dataflow_end_pass(self->inner);
    self->inner_done = 0;
}

static const tp_dataflow_ops_t s_batch_ops = {
    .name = "batch", .reset_state = s_one_reset, .begin = s_batch_begin,
    .next = s_batch_next, .size = s_batch_size, .destroy = s_one_destroy,
    .end_pass = s_batch_end_pass};

tp_dataflow_t *tp_df_batch(tp_dataflow_t *inner, int batch_size,
                           int remainder) {
    if (inner && batch_size < 1)
        WRAP_INVALID(inner, "batch: batch size %d (must be >= 1)",
                     batch_size);
    /* Without a remainder such a batch is never filled: say so now, not as
     * an empty dataflow at the first step (issue 48). */
    int64_t have = inner ? tp_dataflow_size(inner) : -1;
    if (inner && !remainder && have >= 0 && have < batch_size) {
        char name[128];
        snprintf(name, sizeof name, "%s", tp_dataflow_name(inner));
        WRAP_INVALID(inner, "the batch (%d) is larger than the data set (%s: "
                     "%lld samples), so no batch is ever made: use a batch of at most "
                     "%lld, or keep the partial batch (batch %d remainder)", batch_size,
                     name, (long long)have, (long long)have, batch_size);
    }
    batch_t *self;
    WRAP_ALLOC(self, inner, "batch");
    self->inner = inner;
    self->batch_size = batch_size;
    self->remainder = remainder;
    return df_make(&s_batch_ops, self);
}

/* ---- BatchByShape ------------------------------------------------------------ */

typedef struct {
    tp_datapoint_t **dps;  /* [batch_size] */
    int count;
    tp_tensor_t key;       /* dtype and shape only, no data */
} bucket_t;

typedef struct {
    tp_dataflow_t *inner;
    int batch_size, component;
    bucket_t *buckets;
    int nbuckets, cap;
} bbs_t;

static tp_status_t s_bbs_stack(bucket_t *b, int n, tp_datapoint_t **out) {
    tp_status_t rc = s_stack_begin("batch-by-shape", b->dps[0], n, out);
    for (int j = 1; rc == TP_OK && j < n; j++)
        rc = s_stack_put("batch-by-shape", *out, b->dps[j], j);
    if (rc != TP_OK)
        tp_datapoint_destroy(out);
    for (int j = 0; j < n; j++)
        tp_datapoint_destroy(&b->dps[j]);
    b->count = 0;
    return rc;
}

static tp_status_t s_bbs_next(void *impl, tp_datapoint_t **out) {
    bbs_t *self = impl;
    for (;;) {
        tp_datapoint_t *dp;
        tp_status_t rc = tp_dataflow_next(self->inner, &dp);
        if (rc != TP_OK)
            return rc;
        if (self->component >= tp_datapoint_size(dp)) {
            int n = tp_datapoint_size(dp);
            tp_datapoint_destroy(&dp);
            return tp_error(TP_ERR_SHAPE, "batch-by-shape: component %d of a "
                            "datapoint of %d", self->component, n);
        }
        const tp_tensor_t *t = tp_datapoint_cget(dp, self->component);
        bucket_t *b = NULL;
        for (int i = 0; i < self->nbuckets && !b; i++)
            if (tp_tensor_same_shape(&self->buckets[i].key, t))
                b = &self->buckets[i];
        if (!b) {
            if (self->nbuckets == self->cap) {
                int cap = self->cap ? self->cap * 2 : 8;
                bucket_t *nb = realloc(self->buckets, (size_t)cap * sizeof *nb);
                if (!nb) {
                    tp_datapoint_destroy(&dp);
                    return tp_error(TP_ERR_NOMEM, "batch-by-shape");
                }
                self->buckets = nb;
                self->cap = cap;
            }
            b = &self->buckets[self->nbuckets];
            b->dps = calloc((size_t)self->batch_size, sizeof *b->dps);
            if (!b->dps) {
                tp_datapoint_destroy(&dp);
                return tp_error(TP_ERR_NOMEM, "batch-by-shape");
            }
            self->nbuckets++;
            b->count = 0;
            b->key = *t;
            b->key.data = NULL;
            b->key.free_fn = NULL;
        }
        b->dps[b->count++] = dp;
        if (b->count == self->batch_size)
            return s_bbs_stack(b, b->count, out);
    }
}

static void s_bbs_destroy(void *impl) {
    bbs_t *self = impl;
    for (int i = 0; i < self->nbuckets; i++) {
        for (int j = 0; j < self->buckets[i].count; j++)
            tp_datapoint_destroy(&self->buckets[i].dps[j]);
        free(self->buckets[i].dps);
    }
    free(self->buckets);
    tp_dataflow_destroy(&self->inner);
    free(self);
}

static const tp_dataflow_ops_t s_bbs_ops = {
    .name = "batch-by-shape", .reset_state = s_one_reset, .next = s_bbs_next,
    .destroy = s_bbs_destroy, .end_pass = s_one_end_pass};

tp_dataflow_t *tp_df_batch_by_shape(tp_dataflow_t *inner, int batch_size,
                                    int component) {
    if (inner && (batch_size < 1 || component < 0))
        WRAP_INVALID(inner, "batch-by-shape: batch size %d (>= 1), component "
                     "%d (>= 0)", batch_size, component);
    bbs_t *self;
    WRAP_ALLOC(self, inner, "batch-by-shape");
    self->inner = inner;
    self->batch_size = batch_size;
    self->component = component;
    return df_make(&s_bbs_ops, self);
}

/* ---- Map, MapComponent, Filter ---------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    tp_df_map_fn fn;
    tp_df_map_component_fn cfn;
    tp_df_filter_fn ffn;
    void *user;
    tp_df_free_fn user_free;
    int component;
    tp_rng_t rng;
} map_t;

static tp_status_t s_map_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                               uint64_t stream) {
    map_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream,
                     self->ffn ? "filter" : self->cfn ? "map-component"
                                                      : "map");
    return df_reset_inner(self->inner, seed, stream);
}

static tp_status_t s_map_next(void *impl, tp_datapoint_t **out) {
    map_t *self = impl;
    for (;;) {
        tp_datapoint_t *dp;
        tp_status_t rc = tp_dataflow_next(self->inner, &dp);
        if (rc != TP_OK)
            return rc;
        if (self->ffn) {
            if (self->ffn(dp, self->user)) {
                *out = dp;
                return TP_OK;
            }
            tp_datapoint_destroy(&dp);
            continue;
        }
        if (self->cfn) {
            if (self->component >= tp_datapoint_size(dp)) {
                int n = tp_datapoint_size(dp);
                tp_datapoint_destroy(&dp);
                return tp_error(TP_ERR_SHAPE, "map-component: component %d "
                                "of a datapoint of %d", self->component, n);
            }
            rc = self->cfn(tp_datapoint_get(dp, self->component), &self->rng,
                           self->user);
        } else {
            rc = self->fn(&dp, &self->rng, self->user);
        }
        if (rc == TP_OK && dp) {
            *out = dp;
            return TP_OK;
        }
        tp_datapoint_destroy(&dp);
        if (rc < 0)
            return rc;
        /* TP_DF_DROP, or TP_OK with *dp cleared: drop and go on. */
    }
}

static void s_map_destroy(void *impl) {
    map_t *self = impl;
    if (self->user_free)
        self->user_free(self->user);
    tp_dataflow_destroy(&self->inner);
    free(self);
}

static int64_t s_unknown_size(void *impl) { return -1; }

static const tp_dataflow_ops_t s_map_ops = {
    .name = "map", .reset_state = s_map_reset, .next = s_map_next,
    .size = s_one_size, .destroy = s_map_destroy, .end_pass = s_one_end_pass};
static const tp_dataflow_ops_t s_mapc_ops = {
    .name = "map-component", .reset_state = s_map_reset, .next = s_map_next,
    .size = s_one_size, .destroy = s_map_destroy, .end_pass = s_one_end_pass};
static const tp_dataflow_ops_t s_filter_ops = {
    .name = "filter", .reset_state = s_map_reset, .next = s_map_next,
    .size = s_unknown_size, .destroy = s_map_destroy,
    .end_pass = s_one_end_pass};

static tp_dataflow_t *s_map_new(const tp_dataflow_ops_t *ops,
                                tp_dataflow_t *inner, int has_fn, void *user,
                                tp_df_free_fn user_free, map_t **self_out) {
    map_t *self = NULL;
    if (!inner || !has_fn) {
        if (user_free)
            user_free(user);
        if (inner) {
            tp_dataflow_destroy(&inner);
            tp_error(TP_ERR_INVALID, "%s: NULL function", ops->name);
        }
        return NULL;
    }
    self = calloc(1, sizeof *self);
    if (!self) {
        if (user_free)
            user_free(user);
        tp_dataflow_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "%s", ops->name);
        return NULL;
    }
    self->inner = inner;
    self->user = user;
    self->user_free = user_free;
    *self_out = self;
    return inner;
}

tp_dataflow_t *tp_df_map(tp_dataflow_t *inner, tp_df_map_fn fn, void *user,
                         tp_df_free_fn user_free) {
    map_t *self;
    if (!s_map_new(&s_map_ops, inner, fn != NULL, user, user_free, &self))
        return NULL;
    self->fn = fn;
    return df_make(&s_map_ops, self);
}

tp_dataflow_t *tp_df_map_component(tp_dataflow_t *inner,
                                   tp_df_map_component_fn fn, void *user,
                                   tp_df_free_fn user_free, int component) {
    if (component < 0) {
        if (user_free)
            user_free(user);
        if (inner)
            WRAP_INVALID(inner, "map-component: component %d", component);
        return NULL;
    }
    map_t *self;
    if (!s_map_new(&s_mapc_ops, inner, fn != NULL, user, user_free, &self))
        return NULL;
    self->cfn = fn;
    self->component = component;
    return df_make(&s_mapc_ops, self);
}

tp_dataflow_t *tp_df_filter(tp_dataflow_t *inner, tp_df_filter_fn fn,
                            void *user, tp_df_free_fn user_free) {
    map_t *self;
    if (!s_map_new(&s_filter_ops, inner, fn != NULL, user, user_free, &self))
        return NULL;
    self->ffn = fn;
    return df_make(&s_filter_ops, self);
}

/* ---- FixedSize ---------------------------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    int64_t size, pos;
    int keep_state;
} fixed_t;

static tp_status_t s_fixed_begin(void *impl) {
    ((fixed_t *)impl)->pos = 0;
    return TP_OK;
}

static tp_status_t s_fixed_next(void *impl, tp_datapoint_t **out) {
    fixed_t *self = impl;
    if (self->pos >= self->size) {
        if (!self->keep_state)
            tp_dataflow_end_pass(self->inner);
        return TP_DONE;
    }
    tp_status_t rc = tp_dataflow_next(self->inner, out);
    if (rc == TP_DONE) {
        rc = tp_dataflow_next(self->inner, out);  /* start it over */
        if (rc == TP_DONE)
            return tp_error(TP_ERR_STATE, "fixed-size: the inner dataflow "
                            "'%s' yields nothing",
                            tp_dataflow_name(self->inner));
    }
    if (rc == TP_OK)
        self->pos++;
    return rc;
}

static int64_t s_fixed_size(void *impl) { return ((fixed_t *)impl)->size; }

static void s_fixed_end_pass(void *impl) {
    fixed_t *self = impl;
    if (!self->keep_state)
        tp_dataflow_end_pass(self->inner);
}

static const tp_dataflow_ops_t s_fixed_ops = {
    .name = "fixed-size", .reset_state = s_one_reset, .begin = s_fixed_begin,
    .next = s_fixed_next, .size = s_fixed_size, .destroy = s_one_destroy,
    .end_pass = s_fixed_end_pass};

tp_dataflow_t *tp_df_fixed_size(tp_dataflow_t *inner, int64_t size,
                                int keep_state) {
    if (inner && size < 0)
        WRAP_INVALID(inner, "fixed-size: size %" PRId64 " (>= 0)", size);
    fixed_t *self;
    WRAP_ALLOC(self, inner, "fixed-size");
    self->inner = inner;
    self->size = size;
    self->keep_state = keep_state;
    return df_make(&s_fixed_ops, self);
}

/* ---- Repeat ------------------------------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    int64_t times, done_passes, in_this_pass;
} repeat_t;

static tp_status_t s_repeat_begin(void *impl) {
    repeat_t *self = impl;
    self->done_passes = 0;
    self->in_this_pass = 0;
    return TP_OK;
}

static tp_status_t s_repeat_next(void *impl, tp_datapoint_t **out) {
    repeat_t *self = impl;
    for (;;) {
        if (self->times >= 0 && self->done_passes >= self->times)
            return TP_DONE;
        tp_status_t rc = tp_dataflow_next(self->inner, out);
        if (rc != TP_DONE) {
            if (rc == TP_OK)
                self->in_this_pass++;
            return rc;
        }
        self->done_passes++;
        if (self->in_this_pass == 0)
            return TP_DONE;  /* an empty inner pass: never spin forever */
        self->in_this_pass = 0;
    }
}

static int64_t s_repeat_size(void *impl) {
    repeat_t *self = impl;
    int64_t n = tp_dataflow_size(self->inner);
    return df_size_mul(n, self->times);  /* times < 0: forever */
}

static const tp_dataflow_ops_t s_repeat_ops = {
    .name = "repeat", .reset_state = s_one_reset, .begin = s_repeat_begin,
    .next = s_repeat_next, .size = s_repeat_size, .destroy = s_one_destroy,
    .end_pass = s_one_end_pass};

tp_dataflow_t *tp_df_repeat(tp_dataflow_t *inner, int64_t times) {
    if (inner && times < -1)
        WRAP_INVALID(inner, "repeat: %" PRId64 " times (>= 0, or -1 for "
                     "forever)", times);
    repeat_t *self;
    WRAP_ALLOC(self, inner, "repeat");
    self->inner = inner;
    self->times = times;
    return df_make(&s_repeat_ops, self);
}

/* ---- RepeatDatapoint ---------------------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    int times, left;
    tp_datapoint_t *cur;
} repdp_t;

static tp_status_t s_repdp_next(void *impl, tp_datapoint_t **out) {
    repdp_t *self = impl;
    if (!self->cur) {
        tp_status_t rc = tp_dataflow_next(self->inner, &self->cur);
        if (rc != TP_OK)
            return rc;
        self->left = self->times;
    }
    if (--self->left == 0) {
        *out = self->cur;
        self->cur = NULL;
        return TP_OK;
    }
    *out = tp_datapoint_copy(self->cur);
    return *out ? TP_OK : tp_error(TP_ERR_NOMEM, "repeat-datapoint: copy");
}

static int64_t s_repdp_size(void *impl) {
    repdp_t *self = impl;
    return df_size_mul(tp_dataflow_size(self->inner), self->times);
}

static void s_repdp_end_pass(void *impl) {
    repdp_t *self = impl;
    tp_datapoint_destroy(&self->cur);
    tp_dataflow_end_pass(self->inner);
}

static void s_repdp_destroy(void *impl) {
    repdp_t *self = impl;
    tp_datapoint_destroy(&self->cur);
    s_one_destroy(impl);
}

static const tp_dataflow_ops_t s_repdp_ops = {
    .name = "repeat-datapoint", .reset_state = s_one_reset,
    .next = s_repdp_next, .size = s_repdp_size, .destroy = s_repdp_destroy,
    .end_pass = s_repdp_end_pass};

tp_dataflow_t *tp_df_repeat_datapoint(tp_dataflow_t *inner, int times) {
    if (inner && times < 1)
        WRAP_INVALID(inner, "repeat-datapoint: %d times (>= 1)", times);
    repdp_t *self;
    WRAP_ALLOC(self, inner, "repeat-datapoint");
    self->inner = inner;
    self->times = times;
    return df_make(&s_repdp_ops, self);
}

/* ---- several inner dataflows: RandomChoose, RandomMix, Concat, Join ----------- */

typedef struct {
    tp_dataflow_t **dfs;  /* [n] */
    int n;
    double *cum;          /* random-choose: cumulative probabilities [n] */
    int32_t *plan;        /* random-mix: source of each datapoint [total] */
    int64_t total, pos;
    int cur;              /* concat: the dataflow being read */
    tp_rng_t rng;
} multi_t;

static tp_status_t s_multi_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                 uint64_t stream) {
    multi_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "multi");
    for (int i = 0; i < self->n; i++)
        TP_TRY(df_reset_inner(self->dfs[i], seed, stream));
    return TP_OK;
}

static void s_multi_end_all(multi_t *self) {
    for (int i = 0; i < self->n; i++)
        tp_dataflow_end_pass(self->dfs[i]);
}

static void s_multi_end_pass(void *impl) { s_multi_end_all(impl); }

static void s_multi_destroy(void *impl) {
    multi_t *self = impl;
    df_destroy_all(self->dfs, self->n);
    free(self->dfs);
    free(self->cum);
    free(self->plan);
    free(self);
}

static multi_t *s_multi_new(tp_dataflow_t **dfs, int n, const char *name) {
    int missing = 0;
    for (int i = 0; dfs && i < n; i++)
        missing |= dfs[i] == NULL;
    if (!dfs || n < 1 || missing) {
        df_destroy_all(dfs, n);
        if (!missing || !*tp_last_error())
            tp_error(TP_ERR_INVALID, "%s: %d dataflows (>= 1, none NULL)",
                     name, n);
        return NULL;
    }
    multi_t *self = calloc(1, sizeof *self);
    if (self)
        self->dfs = calloc((size_t)n, sizeof *self->dfs);
    if (!self || !self->dfs) {
        free(self);
        df_destroy_all(dfs, n);
        tp_error(TP_ERR_NOMEM, "%s", name);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        self->dfs[i] = dfs[i];
        dfs[i] = NULL;
    }
    self->n = n;
    return self;
}

static tp_status_t s_choose_next(void *impl, tp_datapoint_t **out) {
    multi_t *self = impl;
    double u = tp_rng_double(&self->rng);
    int k = 0;
    while (k < self->n - 1 && u >= self->cum[k])
        k++;
    tp_status_t rc = tp_dataflow_next(self->dfs[k], out);
    if (rc == TP_DONE)
        s_multi_end_all(self);  /* one ran out: the pass is over */
    return rc;
}

static const tp_dataflow_ops_t s_choose_ops = {
    .name = "random-choose", .reset_state = s_multi_reset,
    .next = s_choose_next, .destroy = s_multi_destroy,
    .end_pass = s_multi_end_pass};

tp_dataflow_t *tp_df_random_choose(tp_dataflow_t **dfs, const double *probs,
                                   int n) {
    double sum = 0;
    for (int i = 0; probs && i < n; i++) {
        if (!(probs[i] >= 0)) {
            df_destroy_all(dfs, n);
            tp_error(TP_ERR_INVALID, "random-choose: probability %d is %g",
                     i, probs[i]);
            return NULL;
        }
        sum += probs[i];
    }
    if (probs && n > 0 && !(sum > 0)) {
        df_destroy_all(dfs, n);
        tp_error(TP_ERR_INVALID, "random-choose: probabilities sum to 0");
        return NULL;
    }
    multi_t *self = s_multi_new(dfs, n, "random-choose");
    if (!self)
        return NULL;
    self->cum = malloc((size_t)n * sizeof *self->cum);
    if (!self->cum) {
        s_multi_destroy(self);
        tp_error(TP_ERR_NOMEM, "random-choose");
        return NULL;
    }
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += probs ? probs[i] / sum : 1.0 / n;
        self->cum[i] = acc;
    }
    return df_make(&s_choose_ops, self);
}

static tp_status_t s_mix_begin(void *impl) {
    multi_t *self = impl;
    int64_t k = 0;
    for (int i = 0; i < self->n; i++) {
        int64_t s = tp_dataflow_size(self->dfs[i]);
        for (int64_t j = 0; j < s; j++)
            self->plan[k++] = i;
    }
    TP_ASSERT(k == self->total);
    for (int64_t i = self->total - 1; i > 0; i--) {
        int64_t j = (int64_t)tp_rng_below(&self->rng, (uint64_t)i + 1);
        int32_t t = self->plan[i];
        self->plan[i] = self->plan[j];
        self->plan[j] = t;
    }
    self->pos = 0;
    return TP_OK;
}

static tp_status_t s_mix_next(void *impl, tp_datapoint_t **out) {
    multi_t *self = impl;
    while (self->pos < self->total) {
        int k = self->plan[self->pos++];
        tp_status_t rc = tp_dataflow_next(self->dfs[k], out);
        if (rc != TP_DONE)
            return rc;
        /* It ended early (its size was an overestimate): skip its turns,
         * and do not start it over. */
        for (int64_t j = self->pos; j < self->total; j++)
            if (self->plan[j] == k)
                self->plan[j] = -1 - k;
        while (self->pos < self->total && self->plan[self->pos] < 0)
            self->pos++;
    }
    s_multi_end_all(self);
    return TP_DONE;
}

static int64_t s_mix_size(void *impl) { return ((multi_t *)impl)->total; }

static const tp_dataflow_ops_t s_mix_ops = {
    .name = "random-mix", .reset_state = s_multi_reset, .begin = s_mix_begin,
    .next = s_mix_next, .size = s_mix_size, .destroy = s_multi_destroy,
    .end_pass = s_multi_end_pass};

tp_dataflow_t *tp_df_random_mix(tp_dataflow_t **dfs, int n) {
    multi_t *self = s_multi_new(dfs, n, "random-mix");
    if (!self)
        return NULL;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        int64_t s = tp_dataflow_size(self->dfs[i]);
        if (s < 0 || s > (int64_t)1 << 40) {
            tp_error(TP_ERR_INVALID, "random-mix: dataflow %d ('%s') has no "
                     "known size", i, tp_dataflow_name(self->dfs[i]));
            s_multi_destroy(self);
            return NULL;
        }
        total += s;
    }
    self->total = total;
    self->plan = malloc((size_t)(total ? total : 1) * sizeof *self->plan);
    if (!self->plan) {
        s_multi_destroy(self);
        tp_error(TP_ERR_NOMEM, "random-mix: plan of %" PRId64, total);
        return NULL;
    }
    return df_make(&s_mix_ops, self);
}

static tp_status_t s_concat_begin(void *impl) {
    ((multi_t *)impl)->cur = 0;
    return TP_OK;
}

static tp_status_t s_concat_next(void *impl, tp_datapoint_t **out) {
    multi_t *self = impl;
    while (self->cur < self->n) {
        tp_status_t rc = tp_dataflow_next(self->dfs[self->cur], out);
        if (rc != TP_DONE)
            return rc;
        self->cur++;
    }
    return TP_DONE;
}

static int64_t s_concat_size(void *impl) {
    multi_t *self = impl;
    int64_t total = 0;
    for (int i = 0; i < self->n; i++) {
        total = df_size_add(total, tp_dataflow_size(self->dfs[i]));
        if (total < 0)
            return -1;
    }
    return total;
}

static void s_concat_end_pass(void *impl) {
    multi_t *self = impl;
    if (self->cur < self->n)
        tp_dataflow_end_pass(self->dfs[self->cur]);
}

static const tp_dataflow_ops_t s_concat_ops = {
    .name = "concat", .reset_state = s_multi_reset, .begin = s_concat_begin,
    .next = s_concat_next, .size = s_concat_size, .destroy = s_multi_destroy,
    .end_pass = s_concat_end_pass};

tp_dataflow_t *tp_df_concat(tp_dataflow_t **dfs, int n) {
    multi_t *self = s_multi_new(dfs, n, "concat");
    return self ? df_make(&s_concat_ops, self) : NULL;
}

static tp_status_t s_join_next(void *impl, tp_datapoint_t **out) {
    multi_t *self = impl;
    tp_datapoint_t *o = tp_datapoint_new(0);
    if (!o)
        return tp_error(TP_ERR_NOMEM, "join");
    for (int i = 0; i < self->n; i++) {
        tp_datapoint_t *dp;
        tp_status_t rc = tp_dataflow_next(self->dfs[i], &dp);
        if (rc != TP_OK) {
            tp_datapoint_destroy(&o);
            if (rc == TP_DONE)
                s_multi_end_all(self);
            return rc;
        }
        for (int c = 0; c < tp_datapoint_size(dp) && rc == TP_OK; c++)
            rc = tp_datapoint_append(o, tp_datapoint_get(dp, c));
        tp_datapoint_destroy(&dp);
        if (rc != TP_OK) {
            tp_datapoint_destroy(&o);
            return rc;
        }
    }
    *out = o;
    return TP_OK;
}

static int64_t s_join_size(void *impl) {
    multi_t *self = impl;
    int64_t m = -1;
    for (int i = 0; i < self->n; i++) {
        int64_t s = tp_dataflow_size(self->dfs[i]);
        if (s >= 0 && (m < 0 || s < m))
            m = s;
    }
    return m;
}

static const tp_dataflow_ops_t s_join_ops = {
    .name = "join", .reset_state = s_multi_reset, .next = s_join_next,
    .size = s_join_size, .destroy = s_multi_destroy,
    .end_pass = s_multi_end_pass};

tp_dataflow_t *tp_df_join(tp_dataflow_t **dfs, int n) {
    multi_t *self = s_multi_new(dfs, n, "join");
    return self ? df_make(&s_join_ops, self) : NULL;
}

/* ---- SelectComponent ---------------------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    int n;
    int idx[];   /* [n] */
} select_t;

static tp_status_t s_select_next(void *impl, tp_datapoint_t **out) {
    select_t *self = impl;
    tp_datapoint_t *dp;
    tp_status_t rc = tp_dataflow_next(self->inner, &dp);
    if (rc != TP_OK)
        return rc;
    int ncomp = tp_datapoint_size(dp);
    tp_datapoint_t *o = tp_datapoint_new(self->n);
    if (!o) {
        tp_datapoint_destroy(&dp);
        return tp_error(TP_ERR_NOMEM, "select-component");
    }
    for (int j = 0; j < self->n && rc == TP_OK; j++) {
        int k = self->idx[j];
        if (k >= ncomp) {
            rc = tp_error(TP_ERR_SHAPE, "select-component: component %d of a "
                          "datapoint of %d", k, ncomp);
            break;
        }
        int first = -1;
        for (int p = 0; p < j && first < 0; p++)
            if (self->idx[p] == k)
                first = p;
        if (first >= 0)
            rc = tp_tensor_copy(tp_datapoint_get(o, j),
                                tp_datapoint_cget(o, first));
        else
            tp_tensor_move(tp_datapoint_get(o, j), tp_datapoint_get(dp, k));
    }
    tp_datapoint_destroy(&dp);
    if (rc != TP_OK) {
        tp_datapoint_destroy(&o);
        return rc;
    }
    *out = o;
    return TP_OK;
}

static const tp_dataflow_ops_t s_select_ops = {
    .name = "select-component", .reset_state = s_one_reset,
    .next = s_select_next, .size = s_one_size, .destroy = s_one_destroy,
    .end_pass = s_one_end_pass};

tp_dataflow_t *tp_df_select_component(tp_dataflow_t *inner, const int *idx,
                                      int n) {
    if (!inner)
        return NULL;
    if (!idx || n < 1 || n > TP_DP_MAX_COMPONENTS)
        WRAP_INVALID(inner, "select-component: %d indices (1..%d)", n,
                     TP_DP_MAX_COMPONENTS);
    for (int i = 0; i < n; i++)
        if (idx[i] < 0)
            WRAP_INVALID(inner, "select-component: index %d is %d", i, idx[i]);
    select_t *self = calloc(1, sizeof *self + (size_t)n * sizeof(int));
    if (!self) {
        tp_dataflow_destroy(&inner);
        tp_error(TP_ERR_NOMEM, "select-component");
        return NULL;
    }
    self->inner = inner;
    self->n = n;
    memcpy(self->idx, idx, (size_t)n * sizeof(int));
    return df_make(&s_select_ops, self);
}

/* ---- LocallyShuffle ----------------------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    int buffer_size, num_reuse, shuffle_interval;
    tp_datapoint_t **q;   /* ring [buffer_size] */
    int head, count;
    tp_datapoint_t *cur;  /* the inner datapoint being added */
    int cur_left;         /* copies of cur still to add */
    int iter_cnt;
    int64_t yielded, pass_len;
    int empty_passes;
    tp_rng_t rng;
} lshuf_t;

static tp_status_t s_lshuf_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                 uint64_t stream) {
    lshuf_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "locally-shuffle");
    return df_reset_inner(self->inner, seed, stream);
}

static tp_status_t s_lshuf_begin(void *impl) {
    lshuf_t *self = impl;
    self->pass_len = df_size_mul(tp_dataflow_size(self->inner),
                                 self->num_reuse);
    self->yielded = 0;
    return TP_OK;
}

static void s_lshuf_shuffle(lshuf_t *self) {
    int cap = self->buffer_size;
    for (int i = self->count - 1; i > 0; i--) {
        int j = (int)tp_rng_below(&self->rng, (uint64_t)i + 1);
        tp_datapoint_t **a = &self->q[(self->head + i) % cap];
        tp_datapoint_t **b = &self->q[(self->head + j) % cap];
        tp_datapoint_t *t = *a;
        *a = *b;
        *b = t;
    }
}

/* The buffer is larger than the caches and its order is random: fetch the
 * bytes of the datapoint that leaves next, and the container of the one
 * after it, while the consumer works on this one. */
static void s_lshuf_prefetch(lshuf_t *self) {
    int cap = self->buffer_size;
    if (self->count > 1)
        __builtin_prefetch(self->q[(self->head + 1) % cap]);
    if (self->count > 0) {
        tp_datapoint_t *next = self->q[self->head];
        int n = tp_datapoint_size(next);
        for (int i = 0; i < n && i < 4; i++) {
            const tp_tensor_t *t = tp_datapoint_cget(next, i);
            size_t len = t->nbytes < 4096 ? t->nbytes : 4096;
            for (size_t off = 0; off < len; off += 64)
                __builtin_prefetch((const char *)t->data + off);
        }
    }
}

static tp_status_t s_lshuf_next(void *impl, tp_datapoint_t **out) {
    lshuf_t *self = impl;
    if (self->pass_len >= 0 && self->yielded >= self->pass_len)
        return TP_DONE;
    int cap = self->buffer_size;
    for (;;) {
        if (!self->cur) {
            tp_status_t rc = tp_dataflow_next(self->inner, &self->cur);
            if (rc == TP_DONE) {
                /* The inner dataflow runs forever; two empty passes in a
                 * row mean it has nothing at all. */
                if (++self->empty_passes >= 2)
                    return tp_error(TP_ERR_STATE, "locally-shuffle: the inner "
                                    "dataflow '%s' yields nothing",
                                    tp_dataflow_name(self->inner));
                continue;
            }
            if (rc < 0)
                return rc;
            self->empty_passes = 0;
            self->cur_left = self->num_reuse;
            self->iter_cnt = (self->iter_cnt + 1) % self->shuffle_interval;
            if (self->iter_cnt == 0)
                s_lshuf_shuffle(self);
        }
        tp_datapoint_t *popped = NULL;
        if (self->count == cap) {
            popped = self->q[self->head];
            self->head = (self->head + 1) % cap;
            self->count--;
            s_lshuf_prefetch(self);
        }
        tp_datapoint_t *add;
        if (self->cur_left == 1) {
            add = self->cur;
            self->cur = NULL;
        } else {
            add = tp_datapoint_copy(self->cur);
            if (!add) {
                tp_datapoint_destroy(&popped);
                return tp_error(TP_ERR_NOMEM, "locally-shuffle: copy");
            }
        }
        self->cur_left--;
        self->q[(self->head + self->count) % cap] = add;
        self->count++;
        if (popped) {
            self->yielded++;
            *out = popped;
            return TP_OK;
        }
    }
}

static int64_t s_lshuf_size(void *impl) {
    lshuf_t *self = impl;
    return df_size_mul(tp_dataflow_size(self->inner), self->num_reuse);
}

static void s_lshuf_destroy(void *impl) {
    lshuf_t *self = impl;
    for (int i = 0; i < self->count; i++)
        tp_datapoint_destroy(&self->q[(self->head + i) % self->buffer_size]);
    tp_datapoint_destroy(&self->cur);
    free(self->q);
    s_one_destroy(impl);
}

static const tp_dataflow_ops_t s_lshuf_ops = {
    .name = "locally-shuffle", .reset_state = s_lshuf_reset,
    .begin = s_lshuf_begin, .next = s_lshuf_next, .size = s_lshuf_size,
    .destroy = s_lshuf_destroy};

tp_dataflow_t *tp_df_locally_shuffle(tp_dataflow_t *inner, int buffer_size,
                                     int num_reuse, int shuffle_interval) {
    if (inner && (buffer_size < 1 || num_reuse < 1 || shuffle_interval < 0))
        WRAP_INVALID(inner, "locally-shuffle: buffer size %d (>= 1), reuse %d "
                     "(>= 1), shuffle interval %d (>= 0)", buffer_size,
                     num_reuse, shuffle_interval);
    lshuf_t *self;
    WRAP_ALLOC(self, inner, "locally-shuffle");
    self->inner = inner;
    self->q = calloc((size_t)buffer_size, sizeof *self->q);
    if (!self->q) {
        s_lshuf_destroy(self);
        tp_error(TP_ERR_NOMEM, "locally-shuffle: buffer of %d", buffer_size);
        return NULL;
    }
    self->buffer_size = buffer_size;
    self->num_reuse = num_reuse;
    self->shuffle_interval = shuffle_interval ? shuffle_interval
                                              : buffer_size / 3;
    if (self->shuffle_interval < 1)
        self->shuffle_interval = 1;
    return df_make(&s_lshuf_ops, self);
}

/* ---- Cache -------------------------------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    int shuffle;
    tp_datapoint_t **items;  /* [count] */
    size_t count, cap, pos;
    uint32_t *order;         /* [count] once complete */
    int complete;
    tp_rng_t rng;
} cache_t;

static tp_status_t s_cache_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                 uint64_t stream) {
    cache_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "cache");
    return df_reset_inner(self->inner, seed, stream);
}

static void s_cache_clear(cache_t *self) {
    for (size_t i = 0; i < self->count; i++)
        tp_datapoint_destroy(&self->items[i]);
    self->count = 0;
}

static tp_status_t s_cache_begin(void *impl) {
    cache_t *self = impl;
    self->pos = 0;
    if (!self->complete) {
        s_cache_clear(self);  /* an abandoned first pass starts over */
        return TP_OK;
    }
    df_iota_shuffle(self->order, self->count,
                    self->shuffle ? &self->rng : NULL);
    return TP_OK;
}

static tp_status_t s_cache_next(void *impl, tp_datapoint_t **out) {
    cache_t *self = impl;
    if (self->complete) {
        if (self->pos >= self->count)
            return TP_DONE;
        *out = tp_datapoint_copy(self->items[self->order[self->pos++]]);
        return *out ? TP_OK : tp_error(TP_ERR_NOMEM, "cache: copy");
    }
    tp_datapoint_t *dp;
    tp_status_t rc = tp_dataflow_next(self->inner, &dp);
    if (rc == TP_DONE) {
        self->order = calloc(self->count ? self->count : 1,
                             sizeof *self->order);
        if (!self->order)
            return tp_error(TP_ERR_NOMEM, "cache: %zu items", self->count);
        self->complete = 1;
        return TP_DONE;
    }
    if (rc != TP_OK)
        return rc;
    if (self->count == self->cap || self->count >= UINT32_MAX) {
        size_t cap = self->cap ? self->cap * 2 : 256;
        tp_datapoint_t **n = self->count < UINT32_MAX
                                 ? realloc(self->items, cap * sizeof *n)
                                 : NULL;
        if (!n) {
            tp_datapoint_destroy(&dp);
            return tp_error(TP_ERR_NOMEM, "cache: %zu items", cap);
        }
        self->items = n;
        self->cap = cap;
    }
    *out = tp_datapoint_copy(dp);
    if (!*out) {
        tp_datapoint_destroy(&dp);
        return tp_error(TP_ERR_NOMEM, "cache: copy");
    }
    self->items[self->count++] = dp;
    return TP_OK;
}

static int64_t s_cache_size(void *impl) {
    cache_t *self = impl;
    return self->complete ? (int64_t)self->count
                          : tp_dataflow_size(self->inner);
}

static void s_cache_end_pass(void *impl) {
    cache_t *self = impl;
    if (!self->complete)
        tp_dataflow_end_pass(self->inner);
}

static void s_cache_destroy(void *impl) {
    cache_t *self = impl;
    s_cache_clear(self);
    free(self->items);
    free(self->order);
    s_one_destroy(impl);
}

static const tp_dataflow_ops_t s_cache_ops = {
    .name = "cache", .reset_state = s_cache_reset, .begin = s_cache_begin,
    .next = s_cache_next, .size = s_cache_size, .destroy = s_cache_destroy,
    .end_pass = s_cache_end_pass};

tp_dataflow_t *tp_df_cache(tp_dataflow_t *inner, int shuffle) {
    cache_t *self;
    WRAP_ALLOC(self, inner, "cache");
    self->inner = inner;
    self->shuffle = shuffle;
    return df_make(&s_cache_ops, self);
}

/* ---- Print -------------------------------------------------------------------- */

typedef struct {
    tp_dataflow_t *inner;
    int num, printed;
    char name[64];
    FILE *out;
} print_t;

static double s_elem(const tp_tensor_t *t, size_t i) {
    switch (t->dtype) {
    case TP_UINT8: return ((const uint8_t *)t->data)[i];
    case TP_INT32: return ((const int32_t *)t->data)[i];
    case TP_INT64: return (double)((const int64_t *)t->data)[i];
    case TP_FLOAT32: return ((const float *)t->data)[i];
    case TP_FLOAT64: return ((const double *)t->data)[i];
    case TP_FLOAT16: return tp_f16_to_f32(((const uint16_t *)t->data)[i]);
    case TP_BFLOAT16: return tp_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default: return 0;
    }
}

static tp_status_t s_print_next(void *impl, tp_datapoint_t **out) {
    print_t *self = impl;
    tp_status_t rc = tp_dataflow_next(self->inner, out);
    if (rc != TP_OK || self->printed >= self->num)
        return rc;
    FILE *f = self->out ? self->out : stderr;
    const tp_datapoint_t *dp = *out;
    fprintf(f, "[%s] datapoint %d: %d components\n", self->name,
            self->printed, tp_datapoint_size(dp));
    for (int i = 0; i < tp_datapoint_size(dp); i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        char d[128];
        size_t n = tp_tensor_numel(t);
        fprintf(f, "  %d: %s", i, tp_tensor_describe(t, d, sizeof d));
        if (n == 1) {
            fprintf(f, " = %g", s_elem(t, 0));
        } else if (n > 1) {
            double lo = s_elem(t, 0), hi = lo;
            for (size_t k = 1; k < n; k++) {
                double v = s_elem(t, k);
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            fprintf(f, " range [%g, %g]", lo, hi);
        }
        fputc('\n', f);
    }
    fflush(f);
    self->printed++;
    return rc;
}

static const tp_dataflow_ops_t s_print_ops = {
    .name = "print", .reset_state = s_one_reset, .next = s_print_next,
    .size = s_one_size, .destroy = s_one_destroy, .end_pass = s_one_end_pass};

tp_dataflow_t *tp_df_print(tp_dataflow_t *inner, int num, const char *name,
                           FILE *out) {
    print_t *self;
    WRAP_ALLOC(self, inner, "print");
    self->inner = inner;
    self->num = num < 0 ? 0 : num;
    snprintf(self->name, sizeof self->name, "%s",
             name ? name : tp_dataflow_name(inner));
    self->out = out;
    return df_make(&s_print_ops, self);
}
