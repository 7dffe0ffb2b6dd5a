/* towerpack fuzzing: the strict pickle decoder (dataflow/df_tp_pickle.c),
 * then tp_tpk_decode on the same bytes (fuzz_tpk.h says what is checked). */
#include "fuzz_tpk.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tpk_run(data, size, TP_TPK_PICKLE, df_tpk_pickle);
    return 0;
}
