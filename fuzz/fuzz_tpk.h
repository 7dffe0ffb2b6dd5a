/* towerpack fuzzing: what the three tensorpack decoders' targets share
 * (fuzz_pickle.c, fuzz_msgpack.c, fuzz_zmq_ops.c).
 *
 * Input: the message itself. Each target runs its own decoder directly
 * (df_tpk_pickle, ...), the keys reader where the format has one, and the
 * public tp_tpk_decode on the same bytes, once copying and once keeping
 * the message as the arrays' memory (released by the decode or by the last
 * array), with int64 narrowing on. Properties: nothing is refused without
 * an error message; what decodes has at most the message's bytes of array
 * data and, re-encoded in the same format, decodes to an equal datapoint;
 * the kept message is released exactly once. */
#ifndef TOWERPACK_FUZZ_TPK_H
#define TOWERPACK_FUZZ_TPK_H

#include "fuzz_common.h"
#include "dataflow/df_tp.h"

static int s_fuzz_released;
static void s_fuzz_release(void *data, void *hint) {
    (void)hint;
    free(data);
    s_fuzz_released++;
}

static inline void fuzz_tpk_run(const uint8_t *data, size_t size, tp_tpk_format_t fmt,
                                tp_status_t (*direct)(const uint8_t *, size_t,
                                                      df_tpk_comps_t *)) {
    df_tpk_comps_t cs = {0};
    tp_status_t rc = direct(data, size, &cs);
    fuzz_note(tp_tpk_format_name(fmt), rc);
    size_t total = 0;
    for (int i = 0; rc == TP_OK && i < cs.n; i++)
        total += cs.c[i].nbytes;
    FUZZ_CHECK(rc != TP_OK || cs.n == 0 || total <= size + 8 * (size_t)cs.n,
               "%zu bytes of components from a %zu-byte message", total, size);
    FUZZ_CHECK(rc == TP_OK || *tp_last_error(), "refused without a message");
    df_tpk_comps_fini(&cs);
    if (fmt != TP_TPK_ZMQ_OPS) {
        char *keys;
        size_t *offs, *lens, n;
        if ((fmt == TP_TPK_PICKLE ? df_tpk_pickle_keys : df_tpk_msgpack_keys)(
                data, size, &keys, &offs, &lens, &n) == TP_OK) {
            free(keys);
            free(offs);
            free(lens);
        }
    }
    tp_tpk_opts_t o;
    tp_tpk_opts_init(&o);
    tp_datapoint_t *dp = NULL;
    rc = tp_tpk_decode(data, size, &o, NULL, NULL, &dp);
    if (rc == TP_OK && tp_tpk_sniff(data, size) == fmt) {
        void *enc;
        size_t elen;
        if (tp_tpk_encode(dp, fmt, &enc, &elen) == TP_OK) {
            tp_datapoint_t *back = NULL;
            rc = tp_tpk_decode(enc, elen, &o, NULL, NULL, &back);
            FUZZ_CHECK(rc == TP_OK, "re-encoded %s does not decode: %s",
                       tp_tpk_format_name(fmt), tp_last_error());
            FUZZ_CHECK(tp_datapoint_equal(dp, back), "re-encoded %s decodes differently",
                       tp_tpk_format_name(fmt));
            tp_datapoint_destroy(&back);
            free(enc);
        }
    }
    tp_datapoint_destroy(&dp);
    /* kept: the copy the fuzzer does not own, released exactly once */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return;
    if (size)
        memcpy(copy, data, size);
    o.int32_labels = 1;
    s_fuzz_released = 0;
    rc = tp_tpk_decode(copy, size, &o, s_fuzz_release, NULL, &dp);
    FUZZ_CHECK(rc == TP_OK || s_fuzz_released == 1, "a refused message was not released");
    tp_datapoint_destroy(&dp);
    FUZZ_CHECK(s_fuzz_released == 1, "message released %d times", s_fuzz_released);
}

#endif
