/* towerpack: the DataFlow interface (tensorpack's DataFlow in C).
 *
 * A dataflow yields datapoints until the end of data. Its life:
 *   tp_dataflow_reset_state(df, seed, stream)  once, in the consuming
 *                                               process; seeds its RNG
 *   tp_dataflow_next(df, &dp)                   repeatedly: TP_OK with a
 *                                               datapoint (caller owns),
 *                                               TP_DONE at the end of one
 *                                               pass, < 0 on error
 *   ... the next call after TP_DONE starts a new pass
 *   tp_dataflow_destroy(&df)
 * Using a dataflow before reset_state is TP_ERR_STATE, and so is a second
 * iteration of one dataflow while a pass is under way on another thread
 * (reentrancy guard). A wrapper takes ownership of the dataflow it wraps.
 *
 * Implementations fill a tp_dataflow_ops_t and call tp_dataflow_new. */
#ifndef TOWERPACK_DATAFLOW_H
#define TOWERPACK_DATAFLOW_H

#include <stdint.h>
#include <towerpack/datapoint.h>
#include <towerpack/rng.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* TP_DONE (status.h) ends a pass of tp_dataflow_next (not an error). */

typedef struct tp_dataflow tp_dataflow_t;

typedef struct tp_dataflow_ops {
    const char *name;  /* "batch", "fashion-mnist", ... for messages */
    /* Called once before the first pass; rng is seeded from (seed, stream).
     * Wrappers must reset the dataflows they wrap (tp_dataflow_reset_state
     * with the same seed and stream). */
    tp_status_t (*reset_state)(void *impl, tp_rng_t *rng, uint64_t seed,
                               uint64_t stream);
    /* Start a pass (may be NULL). */
    tp_status_t (*begin)(void *impl);
    /* Produce the next datapoint, or TP_DONE at the end of the pass. */
    tp_status_t (*next)(void *impl, tp_datapoint_t **out);
    /* Datapoints per pass, or -1 when unknown (may be NULL: unknown). */
    int64_t (*size)(void *impl);
    /* Free impl and every dataflow it owns (may be NULL). */
    void (*destroy)(void *impl);
    /* The consumer abandons the current pass (may be NULL). Wrappers end
     * the passes of the dataflows they wrap here, so that the next pass
     * starts from the beginning. Added after the first release: leave it
     * out of an initialiser and it is NULL. */
    void (*end_pass)(void *impl);
    /* Optional fast path for batching (may be NULL): write the next
     * datapoints straight into slots [slot, slot + count) of `batch`, whose
     * component i is [B, ...shape of component i], without making
     * datapoints. *filled gets the number written. TP_OK when all count
     * were written; TP_DONE when the pass ended first (after *filled of
     * them); TP_ERR_SHAPE when a datapoint does not fit the batch. */
    tp_status_t (*next_into)(void *impl, tp_datapoint_t *batch, int64_t slot,
                             int64_t count, int64_t *filled);
} tp_dataflow_ops_t;

/* A dataflow over `impl` with `ops` (static storage). Takes impl: on failure
 * ops->destroy(impl) has run. Caller owns; NULL on out of memory. */
tp_dataflow_t *tp_dataflow_new(const tp_dataflow_ops_t *ops, void *impl);

/* Free the dataflow (and what it wraps); accepts NULL, nulls *self_p. */
void tp_dataflow_destroy(tp_dataflow_t **self_p);

/* Seed and prepare; once, in the process that consumes the dataflow. */
tp_status_t tp_dataflow_reset_state(tp_dataflow_t *self, uint64_t seed,
                                    uint64_t stream);

/* The next datapoint of the current pass into *out (caller owns), TP_DONE at
 * the end of the pass (the next call starts a new one), or < 0. */
tp_status_t tp_dataflow_next(tp_dataflow_t *self, tp_datapoint_t **out);

/* 1 when the implementation offers next_into. */
int tp_dataflow_has_next_into(const tp_dataflow_t *self);

/* As tp_dataflow_next for up to `count` datapoints, written into slots
 * [slot, slot + count) of the stacked datapoint `batch` (see
 * tp_dataflow_ops_t.next_into); *filled gets how many. The same state
 * checks apply. TP_ERR_UNSUPPORTED when the dataflow lacks next_into. */
tp_status_t tp_dataflow_next_into(tp_dataflow_t *self, tp_datapoint_t *batch,
                                  int64_t slot, int64_t count,
                                  int64_t *filled);

/* Abandon the current pass early; the next call to next starts a new one.
 * Runs the implementation's end_pass op (if any) when a pass is under way. */
void tp_dataflow_end_pass(tp_dataflow_t *self);

/* Datapoints per pass, or -1 when unknown. */
int64_t tp_dataflow_size(tp_dataflow_t *self);

/* The implementation's name. */
const char *tp_dataflow_name(const tp_dataflow_t *self);

/* The dataflow's RNG, seeded at reset_state (for implementations). */
tp_rng_t *tp_dataflow_rng(tp_dataflow_t *self);

/* The implementation pointer given to tp_dataflow_new, and the table it
 * was made with: an implementation recognises its own dataflows by that
 * table's address, never by name (a name is only for people). */
void *tp_dataflow_impl(tp_dataflow_t *self);
const tp_dataflow_ops_t *tp_dataflow_ops(const tp_dataflow_t *self);

#ifdef __cplusplus
}
#endif
#endif
