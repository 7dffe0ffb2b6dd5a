/* towerpack fuzzing: the stats message decoder (actors/stats.c), and what
 * tp-top does with a decoded snapshot: find the bottleneck, render JSON.
 *
 * Property: a snapshot that decodes encodes back to the same bytes (the
 * format has no slack: every field is checked), and its JSON parses. */
#include <jansson.h>
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    tp_status_t rc = tp_stats_decode(data, size, &snap);
    fuzz_note("stats", rc);
    if (rc != TP_OK) {
        FUZZ_CHECK(snap.nrows == 0 && snap.rows == NULL,
                   "error left %d rows", snap.nrows);
        tp_stats_snapshot_fini(&snap);
        return 0;
    }
    int bn = tp_stats_bottleneck(&snap);
    FUZZ_CHECK(bn >= -1 && bn < snap.nrows, "bottleneck %d of %d", bn,
               snap.nrows);
    for (int i = 0; i < snap.nrows; i++)
        FUZZ_CHECK(strlen(tp_actor_state_name(snap.rows[i].state)) > 0,
                   "state name");
    char *text = tp_stats_to_json(&snap);
    if (text) {
        json_error_t err;
        json_t *doc = json_loads(text, 0, &err);
        FUZZ_CHECK(doc != NULL, "stats JSON does not parse: %s", err.text);
        json_decref(doc);
        free(text);
    }
    void *buf = NULL;
    size_t n = 0;
    if (tp_stats_encode(&snap, &buf, &n) == TP_OK) {
        tp_stats_snapshot_t again;
        tp_stats_snapshot_init(&again);
        FUZZ_CHECK(tp_stats_decode(buf, n, &again) == TP_OK,
                   "re-encoded snapshot does not decode: %s", tp_last_error());
        FUZZ_CHECK(again.nrows == snap.nrows, "row count changed");
        FUZZ_CHECK(n == size && memcmp(buf, data, n) == 0,
                   "re-encoding changed the bytes (%zu -> %zu)", size, n);
        tp_stats_snapshot_fini(&again);
        free(buf);
    }
    tp_stats_snapshot_fini(&snap);
    return 0;
}
