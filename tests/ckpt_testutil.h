/* towerpack tests: editing a checkpoint as a hostile user or a failing
 * disk would (issue 48): its header and data section changed in place,
 * the checksums left stale or recomputed (with libxxhash, independently of
 * the writer), for tests/gpu/test_checkpoint.c and the tools' tests. */
#ifndef TP_CKPT_TESTUTIL_H
#define TP_CKPT_TESTUTIL_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <towerpack/checkpoint.h>

typedef void (*ckpt_edit_fn)(json_t *root, json_t *meta, unsigned char *data, void *u);

/* Where tensor `name` lies in the data section of header `root`. */
static inline void ckpt_span(json_t *root, const char *name, size_t *begin, size_t *end) {
    json_t *offs = json_object_get(json_object_get(root, name), "data_offsets");
    cr_assert_not_null(offs, "no tensor %s", name);
    *begin = (size_t)json_integer_value(json_array_get(offs, 0));
    *end = (size_t)json_integer_value(json_array_get(offs, 1));
}

static inline int ckpt_by_begin(const void *a, const void *b) {
    const size_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];  /* an empty tensor first */
}

/* Copy checkpoint src to dst with its header and data edited by `edit`;
 * fix_sums: recompute the checksums after the edit (with libxxhash here),
 * so the damage reaches the checks behind them. */
static inline void ckpt_edit(const char *src, const char *dst, ckpt_edit_fn edit, void *u, int fix_sums) {
    FILE *in = fopen(src, "rb");
    cr_assert_not_null(in, "%s", src);
    fseek(in, 0, SEEK_END);
    size_t n = (size_t)ftell(in);
    fseek(in, 0, SEEK_SET);
    char *raw = malloc(n + 1);
    cr_assert_eq(fread(raw, 1, n, in), n);
    fclose(in);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)(unsigned char)raw[i] << (8 * i);
    json_error_t err;
    json_t *root = json_loadb(raw + 8, hl, 0, &err);
    cr_assert_not_null(root, "%s", err.text);
    json_t *meta = json_object_get(root, "__metadata__");
    unsigned char *data = (unsigned char *)raw + 8 + hl;
    edit(root, meta, data, u);
    if (fix_sums) {
        size_t spans[256][2], k = 0;
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
            if (!strcmp(key, "__metadata__"))
                continue;
            cr_assert(k < 256);
            ckpt_span(root, key, &spans[k][0], &spans[k][1]);
            k++;
        }
        qsort(spans, k, sizeof spans[0], ckpt_by_begin);
        char sums[256 * 17 + 1] = "";
        size_t at = 0;
        for (size_t i = 0; i < k; i++)
            at += (size_t)snprintf(sums + at, sizeof sums - at, "%s%016llx", i ? "," : "",
                                   (unsigned long long)XXH3_64bits(
                                       data + spans[i][0], spans[i][1] - spans[i][0]));
        json_object_set_new(meta, TP_SAFETENSORS_CHECKSUM_KEY, json_string(sums));
    }
    char *hdr = json_dumps(root, JSON_COMPACT);
    size_t len = strlen(hdr), padded = (len + 7) & ~(size_t)7;
    FILE *f = fopen(dst, "wb");
    cr_assert_not_null(f, "%s", dst);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, len, f);
    fwrite("        ", 1, padded - len, f);
    fwrite(data, 1, n - 8 - hl, f);
    cr_assert_eq(fclose(f), 0);
    free(hdr);
    json_decref(root);
    free(raw);
}

#endif
