/* towerpack pipeline: what the built-in callbacks of pipeline/callbacks/
 * share among themselves, not part of the public API. */
#ifndef TP_PIPELINE_CB_INTERNAL_H
#define TP_PIPELINE_CB_INTERNAL_H

#include <stdlib.h>
#include <towerpack/status.h>

/* A zeroed state of `size` bytes for the callback `name` (its ops' name, so
 * that the error says which callback ran out of memory); NULL, the error
 * set, when memory is out. Caller owns. */
static inline void *tp_cb_impl_alloc(size_t size, const char *name) {
    void *impl = calloc(1, size);
    if (!impl)
        tp_error(TP_ERR_NOMEM, "%s", name);
    return impl;
}

#endif
