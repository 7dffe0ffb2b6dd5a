/* towerpack core: datapoints. Up to four components live inside the
 * datapoint's own allocation, so a typical (image, label) pair costs one
 * malloc for the container. */
#include <string.h>
#include "core/datapoint_internal.h"

tp_datapoint_t *tp_datapoint_new(int ncomp) {
    if (ncomp < 0 || ncomp > TP_DP_MAX_COMPONENTS)
        return NULL;
    tp_datapoint_t *self = malloc(sizeof *self);
    if (!self)
        return NULL;
    self->size = 0;
    self->capacity = TP_DP_INLINE;
    self->comp = self->inline_comp;
    self->link = NULL;
    if (tp_datapoint_resize(self, ncomp) != TP_OK) {
        free(self);
        return NULL;
    }
    return self;
}

void tp_datapoint_destroy(tp_datapoint_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_datapoint_t *self = *self_p;
    for (int i = 0; i < self->size; i++)
        tp_tensor_fini(&self->comp[i]);
    if (self->comp != self->inline_comp)
        free(self->comp);
    free(self);
    *self_p = NULL;
}

int tp_datapoint_size(const tp_datapoint_t *self) { return self->size; }

tp_tensor_t *tp_datapoint_get(tp_datapoint_t *self, int i) {
    TP_ASSERT(i >= 0 && i < self->size);
    return &self->comp[i];
}

const tp_tensor_t *tp_datapoint_cget(const tp_datapoint_t *self, int i) {
    TP_ASSERT(i >= 0 && i < self->size);
    return &self->comp[i];
}

static tp_status_t s_reserve(tp_datapoint_t *self, int n) {
    if (n <= self->capacity)
        return TP_OK;
    if (n > TP_DP_MAX_COMPONENTS)
        return tp_error(TP_ERR_INVALID, "%d components (at most %d)", n,
                        TP_DP_MAX_COMPONENTS);
    int cap = self->capacity * 2;
    while (cap < n)
        cap *= 2;
    tp_tensor_t *c = malloc((size_t)cap * sizeof *c);
    if (!c)
        return tp_error(TP_ERR_NOMEM, "datapoint of %d components", cap);
    memcpy(c, self->comp, (size_t)self->size * sizeof *c);
    if (self->comp != self->inline_comp)
        free(self->comp);
    self->comp = c;
    self->capacity = cap;
    return TP_OK;
}

tp_status_t tp_datapoint_resize(tp_datapoint_t *self, int n) {
    if (n < 0)
        return tp_error(TP_ERR_INVALID, "negative component count %d", n);
    TP_TRY(s_reserve(self, n));
    for (int i = n; i < self->size; i++)
        tp_tensor_fini(&self->comp[i]);
    for (int i = self->size; i < n; i++)
        tp_tensor_init_empty(&self->comp[i]);
    self->size = n;
    return TP_OK;
}

tp_status_t tp_datapoint_append(tp_datapoint_t *self, tp_tensor_t *t) {
    TP_TRY(s_reserve(self, self->size + 1));
    tp_tensor_move(&self->comp[self->size], t);
    self->size++;
    return TP_OK;
}

tp_datapoint_t *tp_datapoint_copy(const tp_datapoint_t *self) {
    tp_datapoint_t *copy = tp_datapoint_new(self->size);
    if (!copy)
        return NULL;
    for (int i = 0; i < self->size; i++) {
        if (tp_tensor_copy(&copy->comp[i], &self->comp[i]) != TP_OK) {
            tp_datapoint_destroy(&copy);
            return NULL;
        }
    }
    return copy;
}

size_t tp_datapoint_nbytes(const tp_datapoint_t *self) { return tp_dp_nbytes_inline(self); }

tp_datapoint_t **tp_datapoint_link(tp_datapoint_t *self) { return &self->link; }

int tp_datapoint_equal(const tp_datapoint_t *a, const tp_datapoint_t *b) {
    if (a->size != b->size)
        return 0;
    for (int i = 0; i < a->size; i++)
        if (!tp_tensor_equal(&a->comp[i], &b->comp[i]))
            return 0;
    return 1;
}

int tp_datapoint_views(const tp_datapoint_t *self, tp_tensor_t *views, int max) {
    int n = self->size < max ? self->size : max;
    for (int i = 0; i < n; i++) {
        views[i] = self->comp[i];
        views[i].free_fn = NULL;  /* a view: the datapoint keeps its memory */
        views[i].free_hint = NULL;
    }
    return n;
}
