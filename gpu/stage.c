/* towerpack gpu: staging buffers through any backend.
 *
 * A backend with stage_* entries (CUDA: pinned host memory, a copy stream,
 * events) does the work; for one without them (the CPU backend) a stage is
 * a plain aligned host buffer that is its own "device" copy, and every
 * ordering call is a no-op: there is nothing to overlap. */
#include <stdlib.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

struct tp_stage {
    void *buf; /* host fallback only: host == device */
    size_t bytes;
};

static int s_native(const tp_backend_t *b) {
    return b && b->ops->stage_new && b->ops->stage_destroy &&
           b->ops->stage_host && b->ops->stage_device && b->ops->stage_begin &&
           b->ops->stage_wait && b->ops->stage_release &&
           b->ops->stage_host_wait;
}

tp_stage_t *tp_backend_stage_new(tp_backend_t *b, size_t bytes) {
    if (!b) {
        tp_error(TP_ERR_INVALID, "stage: no backend");
        return NULL;
    }
    if (s_native(b))
        return b->ops->stage_new(b, bytes);
    tp_stage_t *st = calloc(1, sizeof *st);
    if (!st || !(st->buf = tp_alloc(bytes ? bytes : 1))) {
        free(st);
        tp_error(TP_ERR_NOMEM, "stage of %zu bytes on the %s backend", bytes,
                 b->ops->name);
        return NULL;
    }
    st->bytes = bytes;
    return st;
}

void tp_backend_stage_destroy(tp_backend_t *b, tp_stage_t **st_p) {
    if (!st_p || !*st_p)
        return;
    tp_stage_t *st = *st_p;
    *st_p = NULL;
    if (s_native(b)) {
        b->ops->stage_destroy(b, st);
        return;
    }
    tp_free(st->buf);
    free(st);
}

void *tp_backend_stage_host(tp_backend_t *b, tp_stage_t *st) {
    return s_native(b) ? b->ops->stage_host(b, st) : st->buf;
}

void *tp_backend_stage_device(tp_backend_t *b, tp_stage_t *st) {
    return s_native(b) ? b->ops->stage_device(b, st) : st->buf;
}

tp_status_t tp_backend_stage_begin(tp_backend_t *b, tp_stage_t *st,
                                   size_t bytes) {
    if (s_native(b))
        return b->ops->stage_begin(b, st, bytes);
    if (bytes > st->bytes)
        return tp_error(TP_ERR_INVALID, "stage: %zu bytes into a %zu-byte stage",
                        bytes, st->bytes);
    return TP_OK;
}

tp_status_t tp_backend_stage_wait(tp_backend_t *b, tp_stage_t *st,
                                  tp_stream_t *s) {
    return s_native(b) ? b->ops->stage_wait(b, st, s) : TP_OK;
}

tp_status_t tp_backend_stage_release(tp_backend_t *b, tp_stage_t *st,
                                     tp_stream_t *s) {
    return s_native(b) ? b->ops->stage_release(b, st, s) : TP_OK;
}

tp_status_t tp_backend_stage_host_wait(tp_backend_t *b, tp_stage_t *st) {
    return s_native(b) ? b->ops->stage_host_wait(b, st) : TP_OK;
}
