/* towerpack dataflow: the generic dataflow object (state checks, reentrancy
 * guard, pass bookkeeping, the tree of nested dataflows) around an
 * implementation's ops. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/dataflow.h>
#include <towerpack/wire.h>
#include "df_internal.h"

struct tp_dataflow {
    const tp_dataflow_ops_t *ops;
    void *impl;
    tp_rng_t rng;
    int reset;           /* reset_state has run */
    int in_pass;         /* a pass has begun and not reached TP_DONE */
    atomic_int busy;     /* a call to next is running (reentrancy guard) */
    /* The tree of nested dataflows (df_visit), learnt at reset_state: a
     * wrapper resets what it wraps from its own reset_state (the ops
     * contract), so every wrapper takes part with no code of its own. */
    tp_dataflow_t *outer, *first_inner, *next_sibling;
    /* what its output must be (tp_df_expect; NULL: nothing said) */
    tp_wire_comp_t *expect;
    int nexpect;
};

/* The dataflow whose reset_state runs on this thread (NULL: none). */
static _Thread_local tp_dataflow_t *s_resetting;

static void s_unlink(tp_dataflow_t *self) {
    if (!self->outer)
        return;
    tp_dataflow_t **pp = &self->outer->first_inner;
    while (*pp && *pp != self)
        pp = &(*pp)->next_sibling;
    if (*pp)
        *pp = self->next_sibling;
    self->outer = self->next_sibling = NULL;
}

tp_dataflow_t *tp_dataflow_new(const tp_dataflow_ops_t *ops, void *impl) {
    TP_ASSERT(ops && ops->next);
    tp_dataflow_t *self = calloc(1, sizeof *self);
    if (!self) {
        if (ops->destroy)
            ops->destroy(impl);
        return NULL;
    }
    self->ops = ops;
    self->impl = impl;
    atomic_init(&self->busy, 0);
    return self;
}

void tp_dataflow_destroy(tp_dataflow_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_dataflow_t *self = *self_p;
    if (self->ops->destroy)
        self->ops->destroy(self->impl);  /* what it owned unlinked itself */
    while (self->first_inner)  /* inner ones it did not own live on */
        s_unlink(self->first_inner);
    s_unlink(self);
    free(self->expect);
    free(self);
    *self_p = NULL;
}

tp_status_t tp_dataflow_reset_state(tp_dataflow_t *self, uint64_t seed,
                                    uint64_t stream) {
    tp_rng_init(&self->rng, seed, stream);
    tp_dataflow_t *outer = s_resetting;
    if (outer && !self->outer && outer != self) {
        self->outer = outer;
        self->next_sibling = outer->first_inner;
        outer->first_inner = self;
    }
    if (self->ops->reset_state) {
        s_resetting = self;
        tp_status_t rc = self->ops->reset_state(self->impl, &self->rng, seed,
                                                stream);
        s_resetting = outer;
        if (rc < 0)
            return tp_error_wrap(rc, "%s: reset_state", self->ops->name);
    }
    self->reset = 1;
    self->in_pass = 0;
    return TP_OK;
}

/* The state checks and pass bookkeeping around one call of next or
 * next_into (exactly one of out / batch is used). */
static tp_status_t s_step(tp_dataflow_t *self, tp_datapoint_t **out,
                          tp_datapoint_t *batch, int64_t slot, int64_t count,
                          int64_t *filled) {
    if (!self->reset)
        return tp_error(TP_ERR_STATE,
                        "%s: used before reset_state (call "
                        "tp_dataflow_reset_state once before iterating)",
                        self->ops->name);
    int expected = 0;
    if (!atomic_compare_exchange_strong(&self->busy, &expected, 1))
        return tp_error(TP_ERR_STATE,
                        "%s: iterated twice at once (a dataflow is not "
                        "reentrant; give each consumer its own)",
                        self->ops->name);
    tp_status_t rc = TP_OK;
    if (!self->in_pass) {
        if (self->ops->begin && (rc = self->ops->begin(self->impl)) < 0) {
            rc = tp_error_wrap(rc, "%s", self->ops->name);
            goto out;
        }
        self->in_pass = 1;
    }
    rc = out ? self->ops->next(self->impl, out)
             : self->ops->next_into(self->impl, batch, slot, count, filled);
    if (rc == TP_DONE) {
        self->in_pass = 0;
        if (out)
            *out = NULL;
    } else if (rc < 0 && out) {
        *out = NULL;
    }
out:
    /* release, not seq_cst: a plain store on x86, the CAS above already
     * orders the call */
    atomic_store_explicit(&self->busy, 0, memory_order_release);
    return rc;
}

tp_status_t tp_dataflow_next(tp_dataflow_t *self, tp_datapoint_t **out) {
    *out = NULL;
    return s_step(self, out, NULL, 0, 0, NULL);
}

int tp_dataflow_has_next_into(const tp_dataflow_t *self) {
    return self->ops->next_into != NULL;
}

tp_status_t tp_dataflow_next_into(tp_dataflow_t *self, tp_datapoint_t *batch,
                                  int64_t slot, int64_t count,
                                  int64_t *filled) {
    *filled = 0;
    if (!self->ops->next_into)
        return tp_error(TP_ERR_UNSUPPORTED, "%s: no next_into",
                        self->ops->name);
    return s_step(self, NULL, batch, slot, count, filled);
}

void tp_dataflow_end_pass(tp_dataflow_t *self) {
    if (self->in_pass && self->ops->end_pass)
        self->ops->end_pass(self->impl);
    self->in_pass = 0;
}

int64_t tp_dataflow_size(tp_dataflow_t *self) {
    return self->ops->size ? self->ops->size(self->impl) : -1;
}

const char *tp_dataflow_name(const tp_dataflow_t *self) {
    return self->ops->name;
}

tp_rng_t *tp_dataflow_rng(tp_dataflow_t *self) { return &self->rng; }

void *tp_dataflow_impl(tp_dataflow_t *self) { return self->impl; }

const tp_dataflow_ops_t *tp_dataflow_ops(const tp_dataflow_t *self) {
    return self->ops;
}

void df_visit(tp_dataflow_t *df, void (*fn)(tp_dataflow_t *df, void *arg), void *arg) {
    if (!df)
        return;
    fn(df, arg);
    for (tp_dataflow_t *in = df->first_inner; in; in = in->next_sibling)
        df_visit(in, fn, arg);
}

tp_dataflow_t *df_outer(const tp_dataflow_t *df) { return df ? df->outer : NULL; }

const tp_wire_comp_t *df_expect_get(const tp_dataflow_t *df, int *n) {
    *n = df ? df->nexpect : 0;
    return df ? df->expect : NULL;
}

tp_status_t df_expect_set(tp_dataflow_t *df, const tp_wire_comp_t *comps, int n) {
    tp_wire_comp_t *copy = NULL;
    if (n > 0 && !(copy = malloc((size_t)n * sizeof *copy)))
        return tp_error(TP_ERR_NOMEM, "%s: expectations", df->ops->name);
    if (n > 0)
        memcpy(copy, comps, (size_t)n * sizeof *copy);
    free(df->expect);
    df->expect = copy;
    df->nexpect = n > 0 ? n : 0;
    return TP_OK;
}

/* Stages whose datapoints are their inner dataflow's, as they are. */
static int s_keeps_datapoints(const char *name) {
    static const char *const keep[] = {"locally-shuffle", "repeat", "repeat-datapoint",
                                       "fixed-size", "cache", "print", "multiprocess"};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        if (!strcmp(name, keep[i]))
            return 1;
    return 0;
}

int df_expect_for(tp_dataflow_t *df, tp_wire_comp_t *out, int max, char *via,
                  size_t via_size) {
    if (via_size)
        via[0] = '\0';
    /* the nearest dataflow above (or df itself) that was told */
    tp_dataflow_t *holder = df;
    int n = 0;
    const tp_wire_comp_t *e = NULL;
    while (holder && !(e = df_expect_get(holder, &n)))
        holder = df_outer(holder);
    if (!e || n < 1 || n > max)
        return 0;
    memcpy(out, e, (size_t)n * sizeof *out);
    /* from it down to df, every stage's input from its output */
    int batched = 1;
    for (tp_dataflow_t *s = holder; s && s != df; ) {
        const char *name = tp_dataflow_name(s);
        if (!strcmp(name, "batch") && batched) {
            for (int i = 0; i < n; i++) {  /* [B, ...] -> [...] */
                if (out[i].ndim < 1)
                    return 0;
                memmove(out[i].shape, out[i].shape + 1,
                        (size_t)(out[i].ndim - 1) * sizeof out[i].shape[0]);
                out[i].shape[--out[i].ndim] = 0;
            }
            batched = 0;
        } else if (!s_keeps_datapoints(name)) {
            return 0;  /* a map, a select, another batch: what comes in is unknown */
        }
        if (via_size) {
            size_t o = strlen(via);
            snprintf(via + o, via_size - o, "%s%s", o ? ", " : "", name);
        }
        /* the next one down: the one whose outer is s on the path to df */
        tp_dataflow_t *t = df;
        while (t && df_outer(t) != s)
            t = df_outer(t);
        s = t;
    }
    return n;
}
