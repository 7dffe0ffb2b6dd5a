/* towerpack fuzzing: the safetensors reader (gpu/graph/checkpoint.c):
 * tp_safetensors_parse and every accessor on what it accepts, the checksum
 * check (tp_safetensors_verify), then tp_checkpoint_load of the same bytes
 * into a small model (the path that reads the trainer state from the
 * metadata and matches names and shapes), tp_checkpoint_verify, and
 * tp_checkpoint_info (the model's name and inputs a predictor reads).
 *
 * The checksums (metadata "xxh3_64", one XXH3-64 per tensor) would stop
 * most mutations of the data section at the checksum, before the value
 * checks behind it (finite weights, optimizer/step's range, the trainer
 * state) ever ran. So every input that parses is loaded twice: as it is
 * (the checksum path: header mutations leave the data, and so the sums,
 * intact and go on; data mutations and mangled sum lists must be refused
 * with a message), and with its sums fixed up here (recomputed over the
 * mutated data with libxxhash and put back in the header), which takes the
 * mutated values past the checksum to the checks behind it. The fix-up is
 * the fuzzer's: the library has no switch to skip verification.
 *
 * Property: every tensor of an accepted file lies inside the buffer (ASan
 * checks the reads) and a load either succeeds or leaves a message. */
#include <jansson.h>
#include <xxhash.h>
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

static int s_by_begin(const void *a, const void *b) {
    const json_int_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];  /* an empty tensor first */
}

/* The input (which tp_safetensors_parse accepted) with the checksum key
 * set to the true sums of its data, as a new buffer in *out (caller frees);
 * 0 when it cannot be built. */
static int s_fix_sums(const uint8_t *data, size_t size, uint8_t **out, size_t *out_size) {
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)data[i] << (8 * i);
    json_t *root = json_loadb((const char *)data + 8, (size_t)hl, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return 0;
    }
    size_t nt = json_object_size(root), k = 0;
    json_int_t(*spans)[2] = calloc(nt + 1, sizeof *spans);
    char *sums = malloc(17 * nt + 1);
    json_t *meta = json_object_get(root, "__metadata__");
    if (!meta) {
        meta = json_object();
        json_object_set_new(root, "__metadata__", meta);
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        json_t *offs = json_object_get(v, "data_offsets");
        if (!spans || strcmp(key, "__metadata__") == 0 || !offs)
            continue;
        spans[k][0] = json_integer_value(json_array_get(offs, 0));
        spans[k][1] = json_integer_value(json_array_get(offs, 1));
        k++;
    }
    int ok = spans && sums;
    if (ok) {
        qsort(spans, k, sizeof *spans, s_by_begin);
        const uint8_t *sec = data + 8 + hl;
        size_t at = 0;
        sums[0] = '\0';
        for (size_t i = 0; i < k; i++)
            at += (size_t)snprintf(sums + at, 18, "%s%016llx", i ? "," : "",
                                   (unsigned long long)XXH3_64bits(
                                       sec + spans[i][0], (size_t)(spans[i][1] - spans[i][0])));
        json_object_set_new(meta, TP_SAFETENSORS_CHECKSUM_KEY, json_string(sums));
    }
    char *hdr = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    size_t data_size = size - 8 - (size_t)hl;
    if (hdr) {
        size_t len = strlen(hdr);
        *out_size = 8 + len + data_size;
        *out = malloc(*out_size);
        if (*out) {
            for (int i = 0; i < 8; i++)
                (*out)[i] = (uint8_t)((uint64_t)len >> (8 * i));
            memcpy(*out + 8, hdr, len);
            memcpy(*out + 8 + len, data + 8 + hl, data_size);
        }
        ok = *out != NULL;
    } else {
        ok = 0;
    }
    free(hdr);
    free(spans);
    free(sums);
    json_decref(root);
    return ok;
}

/* Every loader on the bytes at `path`: each succeeds or leaves a message. */
static void s_load_all(const char *path) {
    tp_train_state_t ts;
    for (int flags = 0; path && flags <= 2; flags++) {
        tp_status_t lr = tp_checkpoint_load(s_model, path, flags, &ts);
        fuzz_note("checkpoint load", lr);
        FUZZ_CHECK(lr == TP_OK || tp_last_error()[0] != '\0',
                   "load failed (%d) without a message", lr);
    }
    for (int spe = 0; path && spe <= 40; spe += 40) {
        tp_status_t vr = tp_checkpoint_verify(path, spe, &ts);
        fuzz_note("checkpoint verify", vr);
        FUZZ_CHECK(vr == TP_OK || tp_last_error()[0] != '\0',
                   "verify failed (%d) without a message", vr);
    }
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
        int checked = 0;
        tp_status_t vr = tp_safetensors_verify(st, "fuzz", &checked);
        fuzz_note("safetensors verify", vr);
        FUZZ_CHECK(vr == TP_OK || tp_last_error()[0] != '\0',
                   "verify failed (%d) without a message", vr);
        FUZZ_CHECK(vr != TP_OK || checked == (tp_safetensors_meta(st, TP_SAFETENSORS_CHECKSUM_KEY) != NULL),
                   "verify passed with checked %d", checked);
        tp_safetensors_destroy(&st);
    } else {
        FUZZ_CHECK(st == NULL, "error with a file");
    }
    /* Only files that get past the parser are worth a model load. */
    if (rc == TP_OK) {
        /* with its sums made true: the checks behind the checksum */
        uint8_t *fixed = NULL;
        size_t fixed_size = 0;
        if (s_fix_sums(data, size, &fixed, &fixed_size)) {
            tp_safetensors_t *fst = NULL;
            tp_status_t fr = tp_safetensors_parse(fixed, fixed_size, "fixed", &fst);
            if (fr == TP_OK) {
                FUZZ_CHECK(tp_safetensors_verify(fst, "fixed", NULL) == TP_OK,
                           "fixed-up sums do not verify: %s", tp_last_error());
                tp_safetensors_destroy(&fst);
                s_load_all(fuzz_memfile(fixed, fixed_size));
            }
            free(fixed);
        }
        /* as it is: the checksum path */
        const char *path = fuzz_memfile(data, size);
        s_load_all(path);
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
