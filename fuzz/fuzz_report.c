/* towerpack fuzzing: a remote sender's report, the text of a TP_CTL_REPORT
 * control frame that the receiving `remote:` dataflow reads from its data
 * socket (dataflow/df_remote.c, df_remote_report_parse): bytes from any
 * peer.
 *
 * Property: an accepted report gives a row that the stats message carries:
 * it encodes and decodes back with its name, host and pid. */
#include "fuzz_common.h"
#include "dataflow/df_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tp_stats_row_t row;
    if (df_remote_report_parse((const char *)data, size, &row) < 0)
        return 0;
    tp_stats_row_rates(&row, NULL, 1.0);
    tp_stats_snapshot_t snap, back;
    tp_stats_snapshot_init(&snap);
    tp_stats_snapshot_init(&back);
    snprintf(snap.source, sizeof snap.source, "fuzz");
    snap.nrows = 1;
    snap.rows = &row;
    void *buf = NULL;
    size_t n = 0;
    FUZZ_CHECK(tp_stats_encode(&snap, &buf, &n) == TP_OK, "encode: %s", tp_last_error());
    FUZZ_CHECK(tp_stats_decode(buf, n, &back) == TP_OK,
               "an accepted report's row does not decode: %s", tp_last_error());
    FUZZ_CHECK(back.nrows == 1 && !strcmp(back.rows[0].name, row.name) &&
               !strcmp(back.rows[0].host, row.host) && back.rows[0].pid == row.pid,
               "row changed on the way");
    tp_stats_snapshot_fini(&back);
    free(buf);
    return 0;
}
