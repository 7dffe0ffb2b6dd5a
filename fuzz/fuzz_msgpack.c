/* towerpack fuzzing: the msgpack-numpy decoder (dataflow/df_tp_msgpack.c:
 * its fast path, else the header precheck and msgpack-c), then
 * tp_tpk_decode on the same bytes (fuzz_tpk.h says what is checked). One
 * more property: whatever the fast path takes, msgpack-c's path takes
 * alike (the same components, the same bytes). */
#include "fuzz_tpk.h"

static void s_fast_agrees(const uint8_t *data, size_t size) {
    df_tpk_comps_t a = {0}, b = {0};
    if (df_tpk_msgpack(data, size, &a) == TP_OK) {
        tp_status_t rb = df_tpk_msgpack_generic(data, size, &b);
        FUZZ_CHECK(rb == TP_OK, "msgpack-c refuses what the fast path took: %s",
                   tp_last_error());
        FUZZ_CHECK(a.n == b.n, "%d components, msgpack-c %d", a.n, b.n);
        for (int i = 0; i < a.n; i++) {
            const df_tpk_comp_t *x = &a.c[i], *y = &b.c[i];
            const uint8_t *dx = x->data ? x->data : x->owned ? x->owned : x->inl;
            const uint8_t *dy = y->data ? y->data : y->owned ? y->owned : y->inl;
            FUZZ_CHECK(x->dtype == y->dtype && x->ndim == y->ndim &&
                       x->nbytes == y->nbytes &&
                       !memcmp(x->shape, y->shape, sizeof x->shape[0] * (size_t)x->ndim) &&
                       !memcmp(dx, dy, x->nbytes),
                       "component %d: the fast path and msgpack-c differ", i);
        }
    }
    df_tpk_comps_fini(&a);
    df_tpk_comps_fini(&b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tpk_run(data, size, TP_TPK_MSGPACK, df_tpk_msgpack);
    s_fast_agrees(data, size);
    return 0;
}
