/* towerpack fuzzing: the safetensors reader (gpu/graph/checkpoint.c):
 * tp_safetensors_parse and every accessor on what it accepts, then
 * tp_checkpoint_load of the same bytes into a small model (the path that
 * reads the trainer state from the metadata and matches names and shapes),
 * and tp_checkpoint_info (the model's name and inputs a predictor reads).
 *
 * Property: every tensor of an accepted file lies inside the buffer (ASan
 * checks the reads) and a load either succeeds or leaves a message. */
#include "fuzz_common.h"
#include "fuzz_model.h"

static tp_model_t *s_model;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_quiet();
    s_model = fuzz_model_new();
    if (!s_model) {
        fprintf(stderr, "fuzz_safetensors: model: %s\n", tp_last_error());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tp_safetensors_t *st = NULL;
    tp_status_t rc = tp_safetensors_parse(data, size, "fuzz", &st);
    fuzz_note("safetensors", rc);
    if (rc == TP_OK) {
        size_t n = tp_safetensors_count(st);
        for (size_t i = 0; i < n; i++) {
            const char *name = tp_safetensors_name(st, i);
            FUZZ_CHECK(name != NULL, "tensor %zu has no name", i);
            tp_tensor_t v;
            FUZZ_CHECK(tp_safetensors_get(st, name, &v) == TP_OK,
                       "listed tensor '%s' not found: %s", name,
                       tp_last_error());
            /* touch every byte: out-of-bounds views show up under ASan */
            volatile uint8_t sum = 0;
            for (size_t k = 0; k < v.nbytes; k++)
                sum ^= ((const uint8_t *)v.data)[k];
            (void)sum;
        }
        (void)tp_safetensors_meta(st, "epoch");
        (void)tp_safetensors_meta(st, "rng");
        tp_safetensors_destroy(&st);
    } else {
        FUZZ_CHECK(st == NULL, "error with a file");
    }
    /* Only files that get past the parser are worth a model load. */
    if (rc == TP_OK) {
        const char *path = fuzz_memfile(data, size);
        tp_train_state_t ts;
        for (int flags = 0; path && flags <= 2; flags++) {
            tp_status_t lr = tp_checkpoint_load(s_model, path, flags, &ts);
            fuzz_note("checkpoint load", lr);
            FUZZ_CHECK(lr == TP_OK || tp_last_error()[0] != '\0',
                       "load failed (%d) without a message", lr);
        }
        /* the metadata a predictor reads: model name, input descriptions */
        tp_checkpoint_info_t info;
        tp_status_t ir = path ? tp_checkpoint_info(path, &info) : TP_OK;
        fuzz_note("checkpoint info", ir);
        FUZZ_CHECK(ir == TP_OK || tp_last_error()[0] != '\0',
                   "info failed (%d) without a message", ir);
        if (path && ir == TP_OK)
            for (int i = 0; i < info.ninputs; i++)
                FUZZ_CHECK(info.inputs[i].ndim >= 1 && info.inputs[i].ndim <= TP_MAX_DIMS,
                           "input %d has %d dims", i, info.inputs[i].ndim);
    }
    return 0;
}
