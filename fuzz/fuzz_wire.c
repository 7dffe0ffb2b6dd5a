/* towerpack fuzzing: the wire decoder (core/wire.c, tp_wire_decode).
 *
 * Input: one option byte, then frames, each a little-endian u32 length and
 * that many bytes (a length past the end takes the rest). Option bit 0
 * lowers max_bytes to 4 KiB (the limit check); bits 1 and 2 choose lz4 and
 * checksums for the re-encode. Property: a datapoint that decodes encodes
 * and decodes again to the same bytes, shapes and dtypes. */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    uint8_t opt = data[0];
    data++;
    size--;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    if (!msg)
        return 0;
    /* a few frames more than the decoder accepts, to reach that check */
    while (size > 0 && tp_wire_msg_frames(msg) < TP_DP_MAX_COMPONENTS + 3) {
        size_t n = size;
        if (size >= 4) {
            uint32_t len;
            memcpy(&len, data, 4);
            data += 4;
            size -= 4;
            n = len < size ? len : size;
        }
        if (tp_wire_msg_add_frame(msg, data, n) != TP_OK)
            break;
        data += n;
        size -= n;
    }
    tp_wire_opts_t opts;
    tp_wire_opts_init(&opts);
    if (opt & 1)
        opts.max_bytes = 4096;
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_wire_decode(msg, &opts, &dp);
    fuzz_note("wire", rc);
    FUZZ_CHECK(tp_wire_msg_frames(msg) == 0, "decode left %d frames",
               tp_wire_msg_frames(msg));
    if (rc == TP_OK) {
        FUZZ_CHECK(dp != NULL, "TP_OK without a datapoint");
        FUZZ_CHECK(tp_datapoint_nbytes(dp) <= opts.max_bytes,
                   "%zu bytes decoded over the %zu limit",
                   tp_datapoint_nbytes(dp), opts.max_bytes);
        tp_datapoint_t *copy = tp_datapoint_copy(dp);
        tp_wire_opts_t enc = opts;
        enc.lz4 = (opt >> 1) & 1;
        enc.lz4_min_bytes = 16;
        enc.checksum = (opt >> 2) & 1;
        if (copy && tp_wire_encode(&copy, &enc, msg) == TP_OK) {
            tp_datapoint_t *back = NULL;
            rc = tp_wire_decode(msg, &opts, &back);
            FUZZ_CHECK(rc == TP_OK, "re-encoded datapoint does not decode: %s",
                       tp_last_error());
            FUZZ_CHECK(tp_datapoint_equal(dp, back),
                       "round trip changed the datapoint");
            tp_datapoint_destroy(&back);
        }
        tp_datapoint_destroy(&copy);
    } else {
        FUZZ_CHECK(dp == NULL, "error %d with a datapoint", rc);
        FUZZ_CHECK(tp_last_error()[0] != '\0', "error %d without a message",
                   rc);
    }
    tp_datapoint_destroy(&dp);
    tp_wire_msg_destroy(&msg);
    return 0;
}
