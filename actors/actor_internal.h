/* towerpack actors: internals shared by the runtime, the supervisor, the
 * stats publisher and the process/remote dataflows. Not installed. */
#ifndef TOWERPACK_ACTORS_INTERNAL_H
#define TOWERPACK_ACTORS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/actor.h>

/* ---- owner side, for the supervisor -------------------------------------- */
/* As tp_actor_new, the actor also sends its counters (a heartbeat) to its
 * owner every report_ms (0: never). */
tp_actor_t *tp_actor_new_ex(const tp_actor_def_t *def, void *arg,
                            int report_ms);
/* The owner's end of the actor's pipe, a raw libzmq socket to poll. NULL
 * once the actor has ended. */
void *tp_actor_pipe_raw(tp_actor_t *self);
/* Read what the actor sent (reports, its end); never blocks. */
void tp_actor_handle_pipe(tp_actor_t *self);
/* Monotonic ns of the last report or start. */
uint64_t tp_actor_last_seen_ns(const tp_actor_t *self);
/* Latest counters known to the owner (no request). */
const tp_stats_row_t *tp_actor_last_row(const tp_actor_t *self);
tp_status_t tp_actor_exit_status(const tp_actor_t *self);

#endif
