/* towerpack gpu/graph: the towers' gradients brought together and
 * applied. Across the towers of one process (the all-reduce, in buckets
 * beside the backward pass when the backend can), across devices (each
 * device's replica of the variables updated from its towers' sum) and
 * across processes (a communicator the launcher's rank 0 names: dist/ on a
 * GPU); then the optimizer's update, from one thread or in slices from the
 * towers' own. model.c runs the steps and calls these. */
#include <fnmatch.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/graph.h>
#include <towerpack/log.h>
#include <towerpack/optim.h>
#include "gpu/graph/graph_internal.h"

/* ---- buckets: the all-reduce beside the backward pass ------------------- */

static int s_cmp_bucket(const void *a, const void *b) {
    const struct tp_bucket *x = a, *y = b;
    if (x->after != y->after)
        return y->after - x->after;
    return x->lo < y->lo ? 1 : -1;  /* ties: the arena's end first */
}

/* The all-reduce in buckets beside the backward pass: the trainable
 * variables from the arena's end (the last layers, whose gradients are
 * final first) cut into ranges of about `floats`, which cover the arena;
 * each is begun after the backward of the node that writes the last of its
 * main-cost gradients (the lowest id among their consumers). Every tower
 * plans the same buckets in the same order, as the collective needs. */
tp_status_t tp_plan_buckets_(tp_model_t *m, tp_tower_t *t, size_t floats) {
    int nv = m->nvars;
    int *final = malloc(((size_t)nv + 1) * sizeof *final);
    t->buckets = calloc((size_t)nv + 1, sizeof *t->buckets);
    if (!final || !t->buckets) {
        free(final);
        return tp_error(TP_ERR_NOMEM, "planning %s's buckets", t->name);
    }
    for (int v = 0; v < nv; v++)
        final[v] = t->nnodes;  /* never written: final from the start */
    for (int i = 0; i < t->nnodes; i++) {
        const tp_node_t *c = t->nodes[i];
        if (!(c->cost_mask & 1u) || c->kind == TP_OP_VARIABLE)
            continue;
        const int by = tp_node_caller_(c)->id; /* folds: the caller writes */
        for (int j = 0; j < c->ninputs; j++) {
            const tp_node_t *in = c->inputs[j];
            if (in->kind == TP_OP_VARIABLE && (in->cost_mask & 1u) &&
                by < final[in->var])
                final[in->var] = by;
        }
    }
    /* trainable offsets grow with the variable's index: from the last */
    size_t hi = m->ntrain;
    int after = t->nnodes;
    for (int i = nv - 1; i >= 0; i--) {
        const tp_var_t *v = &m->vars[i];
        if (!v->trainable)
            continue;
        if (final[i] < after)
            after = final[i];
        if (hi - v->offset >= floats || v->offset == 0) {
            t->buckets[t->nbuckets++] = (struct tp_bucket){v->offset, hi, after};
            hi = v->offset;
            after = t->nnodes;
        }
    }
    free(final);
    qsort(t->buckets, (size_t)t->nbuckets, sizeof *t->buckets, s_cmp_bucket);
    return TP_OK;
}

/* Begin the all-reduce of the tower's buckets from *k on whose gradients
 * are final once node `done`'s backward ran (all of them: INT_MIN). */
tp_status_t tp_begin_buckets_(tp_model_t *m, tp_tower_t *t, int *k, int done) {
    tp_backend_t *b = tp_tower_backend_(t);
    for (; *k < t->nbuckets && t->buckets[*k].after >= done; ++*k) {
        const struct tp_bucket *bk = &t->buckets[*k];
        tp_status_t rc = b->ops->allreduce_begin(b, m->comm, t->index, t->stream,
                                                 t->grads + bk->lo, bk->hi - bk->lo,
                                                 m->config.average);
        if (rc < 0)
            return tp_error_wrap(rc, "%s: all-reduce of bucket %d (floats %zu..%zu)",
                                 t->name, *k, bk->lo, bk->hi);
    }
    return TP_OK;
}

/* ---- the step's reduction and update ------------------------------------ */

tp_status_t tp_check_grads_(tp_model_t *m) {
    if (!m->opt || m->ntowers == 0)
        return tp_error(TP_ERR_STATE, "model has no optimizer or no training "
                                      "towers");
    return TP_OK;
}

/* Reducing or applying gradients that no backward produced (or that were
 * already applied) is a trainer bug worth a clear error. */
static tp_status_t s_check_fresh(tp_model_t *m, int first, int last) {
    for (int i = first; i <= last; i++)
        if (!m->towers[i]->ran_backward)
            return tp_error(TP_ERR_STATE,
                            "%s has no fresh gradients (run TP_RUN_BACKWARD "
                            "first; gradients are used once)",
                            m->towers[i]->name);
    return TP_OK;
}

/* One thread drives every tower (parameter-server style): the sum (or
 * mean) lands in tower 0 only, which is all the update reads. */
tp_status_t tp_reduce_all_(tp_model_t *m) {
    TP_TRY(s_check_fresh(m, 0, m->ntowers - 1));
    if (m->ntowers == 1)
        return TP_OK;
    if (m->nrep > 1)
        return tp_error(TP_ERR_UNSUPPORTED, "reduce: the towers span %d "
                        "devices; each joins the all-reduce from its own "
                        "thread (TP_RUN_REDUCE on its index, as the replicated "
                        "trainer does), not one thread for all", m->nrep);
    float *bufs[64];
    for (int i = 0; i < m->ntowers; i++)
        bufs[i] = m->towers[i]->grads;
    return m->backend->ops->allreduce_local(m->backend, bufs, m->ntowers,
                                            m->ntrain, m->config.average, 1);
}

/* The collective: each tower's thread contributes its own gradients and
 * gets the sum back in them. */
tp_status_t tp_allreduce_tower_(tp_model_t *m, int tower) {
    TP_TRY(s_check_fresh(m, tower, tower));
    tp_tower_t *t = m->towers[tower];
    if (t->reduced)
        return TP_OK;  /* in buckets, during its backward pass */
    tp_backend_t *b = tp_tower_backend_(t);
    TP_TRY(b->ops->allreduce(b, m->comm, tower, t->stream, t->grads, m->ntrain,
                             m->config.average));
    t->reduced = 1;
    return TP_OK;
}

/* ---- across processes (dist/ on a device) ---- */

static tp_status_t s_ranks_supported(const tp_model_t *m) {
    tp_backend_t *b = m->backend;
    if (!b->ops->comm_id || !b->ops->comm_join)
        return tp_error(TP_ERR_UNSUPPORTED, "the %s backend has no communicator "
                        "across processes (dist/ all-reduces host memory over "
                        "MPI for it)", b->ops->name);
    if (m->nrep > 1)
        return tp_error(TP_ERR_UNSUPPORTED, "a model on %d devices across "
                        "processes: one device per process", m->nrep);
    return TP_OK;
}

tp_status_t tp_model_comm_id(tp_model_t *m, void *id, size_t *len) {
    TP_TRY(s_ranks_supported(m));
    return m->backend->ops->comm_id(m->backend, id, TP_COMM_ID_MAX, len);
}

tp_status_t tp_model_comm_join(tp_model_t *m, int nranks, int rank,
                               const void *id, size_t len) {
    TP_TRY(s_ranks_supported(m));
    if (m->ranks)
        return tp_error(TP_ERR_STATE, "the model already joined a communicator "
                        "across processes");
    if (!id || len == 0 || len > TP_COMM_ID_MAX)
        return tp_error(TP_ERR_INVALID, "communicator id of %zu bytes (1..%d)",
                        len, TP_COMM_ID_MAX);
    m->ranks = m->backend->ops->comm_join(m->backend, nranks, rank, id, len);
    return m->ranks ? TP_OK : tp_error_wrap(TP_ERR_PEER, "rank %d of %d: joining "
                                            "the processes' communicator", rank,
                                            nranks);
}

tp_status_t tp_model_allreduce_ranks(tp_model_t *m) {
    if (!m->ranks)
        return tp_error(TP_ERR_STATE, "all-reduce over processes before "
                        "tp_model_comm_join");
    TP_TRY(s_check_fresh(m, 0, 0));
    TP_TRY(tp_model_drain_(m));
    tp_tower_t *t = m->towers[0];
    tp_backend_t *b = tp_tower_backend_(t);
    return b->ops->allreduce(b, m->ranks, 0, t->stream, t->grads, m->ntrain, 1);
}

/* Replicated towers, the update in parallel: after the all-reduce (whose
 * slice `tower` this tower's thread just summed, so it is in this core's
 * cache) the tower applies the optimizer to the same slice of its device's
 * variables: of the towers on one device, the j-th of k updates the j-th
 * k-th of them (on one device, tower i the i-th of ntowers). The update is
 * elementwise and every tower holds the same sum, so the slices give
 * exactly what one update from tower 0 gives, in every replica. Every
 * tower's backward is over once the all-reduce has begun, so no run still
 * reads the variables. */
tp_status_t tp_apply_slice_(tp_model_t *m, int tower, int k) {
    tp_tower_t *t = m->towers[tower];
    TP_TRY(s_check_fresh(m, tower, tower));
    if (k != 0 || t->ran_cost != 0)
        return tp_error(TP_ERR_STATE, "%s: cost '%s' updates only its own "
                        "variables: update it from one thread (TP_ALL_TOWERS), "
                        "not in slices", t->name, t->cost_names[k ? k : t->ran_cost]);
    size_t j = 0, nt = 0;  /* this tower's place among its device's towers */
    for (int i = 0; i < m->ntowers; i++)
        if (m->towers[i]->replica == t->replica) {
            j += i < tower;
            nt++;
        }
    size_t n = m->ntrain;
    size_t chunk = (n + nt - 1) / nt, lo = chunk * j, hi = lo + chunk;
    if (lo > n)
        lo = n;
    if (hi > n)
        hi = n;
    tp_replica_t *rp = &m->rep[t->replica];
    tp_backend_t *b = rp->backend;
    if (hi > lo)
        TP_TRY(tp_optimizer_update(m->opt, b, t->stream, rp->train_arena,
                                   t->grads, rp->slots, lo, hi - lo));
    TP_TRY(b->ops->stream_sync(b, t->stream));
    t->sliced = 1;
    return TP_OK;
}

/* The update from one thread: close a step whose slices every tower
 * applied, or apply tower 0's gradients of cost k (the main cost to every
 * trainable variable, a named one to its own only: the others' gradients
 * are stale). */
tp_status_t tp_update_all_(tp_model_t *m, int k) {
    int sliced = 0;
    for (int i = 0; i < m->ntowers; i++)
        sliced += m->towers[i]->sliced;
    if (sliced == m->ntowers) {
        TP_TRY(s_check_fresh(m, 0, m->ntowers - 1));
        tp_optimizer_end_step(m->opt);
        for (int i = 0; i < m->ntowers; i++)
            m->towers[i]->ran_backward = m->towers[i]->sliced = 0;
        return TP_OK;
    }
    if (sliced) {
        for (int i = 0; i < m->ntowers; i++)
            if (!m->towers[i]->sliced)
                return tp_error(TP_ERR_STATE, "%s has not applied its slice "
                                "of the update (%d of %d towers have)",
                                m->towers[i]->name, sliced, m->ntowers);
    }
    /* Replica r applies the gradients of tower r, its device's first: on
     * one device tower 0's; on several, each tower's all-reduced sum. */
    TP_TRY(s_check_fresh(m, 0, m->nrep - 1));
    for (int r = 0; m->nrep > 1 && r < m->nrep; r++)
        if (!m->towers[r]->reduced)
            return tp_error(TP_ERR_STATE, "%s's gradients were not all-reduced "
                            "(TP_RUN_REDUCE): the towers span %d devices, and "
                            "each device's variables are updated from its own "
                            "towers' sum", m->towers[r]->name, m->nrep);
    tp_tower_t *t0 = m->towers[0];
    if (t0->ran_cost != k)
        return tp_error(TP_ERR_STATE, "updating cost '%s' but the fresh "
                        "gradients are cost '%s''s", t0->cost_names[k],
                        t0->cost_names[t0->ran_cost]);
    for (int r = 0; r < m->nrep; r++) {
        tp_replica_t *rp = &m->rep[r];
        const float *g = m->towers[r]->grads;
        if (k == 0) {  /* the main cost: every trainable variable at once */
            TP_TRY(tp_optimizer_update(m->opt, rp->backend, rp->stream,
                                       rp->train_arena, g, rp->slots, 0,
                                       m->ntrain));
            continue;
        }
        for (int i = 0; i < m->nvars; i++) {
            const tp_var_t *v = &m->vars[i];
            if (!v->trainable ||
                (t0->cost_vars[k] && fnmatch(t0->cost_vars[k], v->name, 0) != 0))
                continue;
            TP_TRY(tp_optimizer_update(m->opt, rp->backend, rp->stream,
                                       rp->train_arena, g, rp->slots,
                                       v->offset, v->count));
        }
    }
    tp_optimizer_end_step(m->opt);
    for (int i = 0; i < m->ntowers; i++)
        m->towers[i]->ran_backward = 0;
    for (int r = 0; r < m->nrep; r++)
        TP_TRY(m->rep[r].backend->ops->stream_sync(m->rep[r].backend,
                                                   m->rep[r].stream));
    return TP_OK;
}
