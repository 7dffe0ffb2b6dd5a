/* towerpack fuzzing: writers for the small valid files the seed corpora
 * and the spec target's fixtures are made of (IDX, gzip, whole files).
 * Used by fuzz/gen_corpus.c and fuzz_spec.c only. */
#ifndef TOWERPACK_FUZZ_FILES_H
#define TOWERPACK_FUZZ_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* An IDX file: magic 00 00 <type> <ndim>, big-endian u32 dims, then the
 * elements big-endian. elem is 1, 4 or 8 bytes (type 0x08, 0x0C/0x0D,
 * 0x0E); `payload` is in host order. Caller frees *out. 0 on failure. */
static inline int fuzz_idx_make(uint8_t type, int ndim, const uint32_t *dims,
                                const void *payload, size_t elem,
                                uint8_t **out, size_t *size) {
    size_t numel = 1;
    for (int i = 0; i < ndim; i++)
        numel *= dims[i];
    size_t hdr = 4 + 4 * (size_t)ndim, n = hdr + numel * elem;
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return 0;
    b[0] = b[1] = 0;
    b[2] = type;
    b[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        b[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        b[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        b[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        b[7 + 4 * i] = (uint8_t)dims[i];
    }
    const uint8_t *p = payload;
    for (size_t k = 0; k < numel; k++)
        for (size_t j = 0; j < elem; j++)  /* reverse each element's bytes */
            b[hdr + k * elem + j] = p[k * elem + (elem - 1 - j)];
    *out = b;
    *size = n;
    return 1;
}

/* gzip `data` (a .gz stream, as gzip(1) writes). Caller frees *out. */
static inline int fuzz_gzip(const void *data, size_t size, uint8_t **out,
                            size_t *out_size) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return 0;
    uLong cap = deflateBound(&z, (uLong)size) + 64;
    uint8_t *b = malloc(cap);
    if (!b) {
        deflateEnd(&z);
        return 0;
    }
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)size;
    z.next_out = b;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    *out_size = z.total_out;
    deflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(b);
        return 0;
    }
    *out = b;
    return 1;
}

static inline int fuzz_write_file(const char *path, const void *data,
                                  size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    int ok = fwrite(data, 1, size, f) == size;
    return (fclose(f) == 0) && ok;
}

/* Read a whole file; caller frees *out. */
static inline int fuzz_read_file(const char *path, uint8_t **out,
                                 size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t cap = 4096, n = 0;
    uint8_t *b = malloc(cap);
    size_t got;
    while (b && (got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *nb = realloc(b, cap *= 2);
            if (!nb)
                free(b);
            b = nb;
        }
    }
    fclose(f);
    if (!b)
        return 0;
    *out = b;
    *size = n;
    return 1;
}

#endif
