/* towerpack fuzzing: the LMDB record value decoder (dataflow/df_lmdb.c):
 * tp_records_decode on one record value, and the chunk header check
 * (df_records_chunk_check) followed by the decode of every record the
 * chunk holds, as the LMDB source reads a chunked file.
 *
 * Input: one option byte, then the value. Bit 0 picks a chunk (the next
 * byte is the record count the file would expect) over a single record;
 * bits 1 and 2 choose lz4 and checksums for the re-encode. Property: a
 * record that decodes encodes and decodes again to the same datapoint. */
#include "fuzz_common.h"
#include "dataflow/df_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_quiet();
    return 0;
}

static void s_record(const uint8_t *v, size_t size, uint8_t opt) {
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_records_decode(v, size, &dp);
    fuzz_note("lmdb", rc);
    if (rc != TP_OK) {
        FUZZ_CHECK(dp == NULL, "error %d with a datapoint", rc);
        FUZZ_CHECK(tp_last_error()[0] != '\0', "error without a message");
        return;
    }
    FUZZ_CHECK(dp != NULL, "TP_OK without a datapoint");
    tp_records_opts_t o;
    tp_records_opts_init(&o);
    o.lz4 = (opt >> 1) & 1;
    o.lz4_min_bytes = 16;
    o.checksum = (opt >> 2) & 1;
    void *buf = NULL;
    size_t n = 0;
    if (tp_records_encode(dp, &o, &buf, &n) == TP_OK) {
        tp_datapoint_t *back = NULL;
        rc = tp_records_decode(buf, n, &back);
        FUZZ_CHECK(rc == TP_OK, "re-encoded record does not decode: %s",
                   tp_last_error());
        FUZZ_CHECK(tp_datapoint_equal(dp, back),
                   "round trip changed the datapoint");
        tp_datapoint_destroy(&back);
        free(buf);
    }
    tp_datapoint_destroy(&dp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    uint8_t opt = data[0];
    data++;
    size--;
    if (!(opt & 1)) {
        s_record(data, size, opt);
        return 0;
    }
    if (size < 1)
        return 0;
    int64_t want = data[0];
    data++;
    size--;
    size_t off = 0;
    tp_status_t rc = df_records_chunk_check(data, size, want, "fuzz", "chunk",
                                            &off);
    fuzz_note("chunk", rc);
    if (rc != TP_OK)
        return 0;
    FUZZ_CHECK(off == 4 + 4 * (size_t)want && off <= size, "data offset %zu",
               off);
    uint32_t start = 0;
    for (int64_t j = 0; j < want; j++) {
        uint32_t end;
        memcpy(&end, data + 4 + 4 * j, 4);
        FUZZ_CHECK(end >= start && off + end <= size, "record %lld: %u..%u",
                   (long long)j, start, end);
        s_record(data + off + start, end - start, opt);
        start = end;
    }
    return 0;
}
