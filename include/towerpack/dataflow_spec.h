/* towerpack: pipeline spec strings, used by the tools and config files.
 *
 *   fashion-mnist:train | shuffle 10000 | augment crop=28,pad=2,flip | batch 128
 *
 * A spec is a source followed by stages, separated by '|'. A source is
 * NAME or NAME:ARGS; a stage is NAME followed by its arguments. The built-in
 * sources and stages are listed in docs/dataflow.md; other modules add their
 * own with the register functions (the actor module adds `remote:` and
 * `processes N`). A bad spec is TP_ERR_INVALID with a message that quotes
 * the spec and marks the bad token with carets. */
#ifndef TOWERPACK_DATAFLOW_SPEC_H
#define TOWERPACK_DATAFLOW_SPEC_H

#include <towerpack/dataflow_lib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Build the pipeline `spec` into *out (caller owns; not yet reset). */
tp_status_t tp_spec_parse(const char *spec, tp_dataflow_t **out);

/* A source factory: build from ARGS (the text after "NAME:", "" when none;
 * trimmed). On failure return < 0 with tp_error; *out stays NULL. */
typedef tp_status_t (*tp_spec_source_fn)(const char *args, void *user,
                                         tp_dataflow_t **out);

/* A stage factory: wrap `inner` (taken: on failure it is destroyed). */
typedef tp_status_t (*tp_spec_stage_fn)(tp_dataflow_t *inner,
                                        const char *args, void *user,
                                        tp_dataflow_t **out);

/* A map-stage factory: a map function and its user data for ARGS. Such a
 * stage works on its own (`augment ...`, a single-threaded map) and inside
 * `map-threads N [strict] [buffer=B] NAME ARGS`. */
typedef tp_status_t (*tp_spec_map_fn)(const char *args, void *user,
                                      tp_df_map_fn *fn, void **fn_user,
                                      tp_df_free_fn *fn_free);

/* Register (or replace) a source, stage or map stage under `name` (letters,
 * digits, '-' and '_'). Thread-safe; `user` is passed to every call. */
tp_status_t tp_spec_register_source(const char *name, tp_spec_source_fn fn,
                                    void *user);
tp_status_t tp_spec_register_stage(const char *name, tp_spec_stage_fn fn,
                                   void *user);
tp_status_t tp_spec_register_map(const char *name, tp_spec_map_fn fn,
                                 void *user);

/* Helpers for factories. Split `args` at commas into key[=value] items and
 * call fn for each (trimmed; value NULL without '='); the first non-OK
 * return stops and is returned. */
tp_status_t tp_spec_foreach_kv(const char *args,
                               tp_status_t (*fn)(const char *key,
                                                 const char *value,
                                                 void *ctx),
                               void *ctx);
/* Parse a whole decimal integer in [lo, hi]; TP_ERR_INVALID naming `what`. */
tp_status_t tp_spec_int(const char *text, int64_t lo, int64_t hi,
                        const char *what, int64_t *out);
/* Parse a whole floating-point number; TP_ERR_INVALID naming `what`. */
tp_status_t tp_spec_double(const char *text, const char *what, double *out);

#ifdef __cplusplus
}
#endif
#endif
