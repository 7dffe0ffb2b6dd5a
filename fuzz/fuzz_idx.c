/* towerpack fuzzing: the IDX reader (dataflow/df_sources.c): tp_idx_decode
 * on the raw bytes, and tp_idx_read on the same bytes as a file (plain or
 * gzip'd: the reader goes through zlib either way).
 *
 * Property: both accept the same plain files and agree on the tensor, and
 * an accepted tensor's size is what its header says. */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tp_tensor_t a, b;
    tp_status_t ra = tp_idx_decode(data, size, &a);
    fuzz_note("idx", ra);
    if (ra == TP_OK) {
        size_t hdr = 4 + 4 * (size_t)a.ndim;
        FUZZ_CHECK(hdr + a.nbytes == size, "%zu header + %zu payload != %zu",
                   hdr, a.nbytes, size);
    } else {
        FUZZ_CHECK(a.data == NULL && a.nbytes == 0, "error left a tensor");
    }
    const char *path = fuzz_memfile(data, size);
    if (path) {
        tp_status_t rb = tp_idx_read(path, &b);
        /* A plain (not gzip'd) file: both readers must agree. */
        int gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
        if (!gz) {
            FUZZ_CHECK((ra == TP_OK) == (rb == TP_OK),
                       "decode %d but read %d (%s)", ra, rb, tp_last_error());
            if (ra == TP_OK)
                FUZZ_CHECK(tp_tensor_equal(&a, &b), "decode and read differ");
        }
        if (rb == TP_OK)
            tp_tensor_fini(&b);
    }
    if (ra == TP_OK)
        tp_tensor_fini(&a);
    return 0;
}
