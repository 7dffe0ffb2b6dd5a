/* towerpack fuzzing: the component handshake's text (core/wire_job.c,
 * tp_wire_comps_parse), which a trainer reads from every sender's peer
 * ("image:uint8[64,28,28];label:int32[64]{0..9}").
 *
 * Input: the text itself (NUL-terminated here, cut at
 * TP_WIRE_COMPS_MAX as the property is). Property: what parses formats
 * and parses again to the same components, and every parsed field is in
 * its documented range. */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_quiet();
    return 0;
}

static int s_same(const tp_wire_comp_t *a, const tp_wire_comp_t *b) {
    if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->ranged != b->ranged || (a->ranged && (a->lo != b->lo || a->hi != b->hi)))
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if ((a->shape[d] < 0) != (b->shape[d] < 0) ||
            (a->shape[d] >= 0 && a->shape[d] != b->shape[d]))
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char text[TP_WIRE_COMPS_MAX];
    size_t n = size < sizeof text - 1 ? size : sizeof text - 1;
    memcpy(text, data, n);
    text[n] = '\0';
    tp_wire_comp_t comps[TP_WIRE_COMPS_N], back[TP_WIRE_COMPS_N];
    int k = tp_wire_comps_parse(text, comps, TP_WIRE_COMPS_N);
    FUZZ_CHECK(k >= -1 && k <= TP_WIRE_COMPS_N, "parse returned %d", k);
    if (k < 0)
        return 0;
    for (int i = 0; i < k; i++) {
        FUZZ_CHECK(comps[i].ndim >= 0 && comps[i].ndim <= TP_MAX_DIMS,
                   "component %d has rank %d", i, comps[i].ndim);
        FUZZ_CHECK(memchr(comps[i].name, '\0', sizeof comps[i].name) != NULL,
                   "component %d's name is not terminated", i);
        FUZZ_CHECK(!comps[i].ranged || comps[i].lo <= comps[i].hi,
                   "component %d's range %lld..%lld", i, (long long)comps[i].lo,
                   (long long)comps[i].hi);
    }
    char out[TP_WIRE_COMPS_MAX];
    int len = tp_wire_comps_format(comps, k, out, sizeof out);
    FUZZ_CHECK(len >= 0, "%d parsed components do not format", k);
    int k2 = tp_wire_comps_parse(out, back, TP_WIRE_COMPS_N);
    FUZZ_CHECK(k2 == k, "'%s' parses to %d components, its source to %d", out, k2, k);
    for (int i = 0; i < k; i++)
        FUZZ_CHECK(s_same(&comps[i], &back[i]), "component %d changed through '%s'", i, out);
    return 0;
}
