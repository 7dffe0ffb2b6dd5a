/* towerpack pipeline: what the built-in callbacks of pipeline/callbacks/
 * share among themselves, not part of the public API. */
#ifndef TP_PIPELINE_CB_INTERNAL_H
#define TP_PIPELINE_CB_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>
#include <towerpack/clock.h>
#include <towerpack/status.h>
#include <towerpack/trainer_loop.h>

/* A zeroed state of `size` bytes for the callback `name` (its ops' name, so
 * that the error says which callback ran out of memory); NULL, the error
 * set, when memory is out. Caller owns. */
static inline void *tp_cb_impl_alloc(size_t size, const char *name) {
    void *impl = calloc(1, size);
    if (!impl)
        tp_error(TP_ERR_NOMEM, "%s", name);
    return impl;
}

/* An epoch's wall time and global steps, for the throughput monitors:
 * started in before_epoch, read in after_epoch, which runs right after the
 * epoch's last step, so that epoch-end work (validation, checkpoints) is
 * not counted. */
typedef struct {
    uint64_t t0;   /* tp_now_ns at the start */
    int64_t step0; /* the global step at the start */
} tp_cb_epoch_clock_t;

static inline void tp_cb_epoch_clock_start(tp_cb_epoch_clock_t *c, const tp_trainer_t *tr) {
    c->t0 = tp_now_ns();
    c->step0 = tp_trainer_global_step(tr);
}

/* Seconds since the start; *steps: the global steps run since. */
static inline double tp_cb_epoch_clock_read(const tp_cb_epoch_clock_t *c,
                                            const tp_trainer_t *tr, double *steps) {
    *steps = (double)(tp_trainer_global_step(tr) - c->step0);
    return (double)(tp_now_ns() - c->t0) * 1e-9;
}

#endif
