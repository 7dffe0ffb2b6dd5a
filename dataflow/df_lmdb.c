/* towerpack dataflow: LMDB record files (save a dataflow, read it back in
 * order or shuffled).
 *
 * File layout (one LMDB file, MDB_NOSUBDIR; see docs/dataflow.md):
 *   "__format__"  -> "towerpack-records <version>"   (TP_RECORDS_VERSION)
 *   "__count__"   -> decimal number of datapoints
 *   "0000000000", "0000000001", ...  (10-digit zero-padded index)
 *                 -> one datapoint in the wire format, flattened: the wire
 *                    header frame, then every component's frame back to back
 *                    (each lz4-compressed when that makes it smaller).
 *
 * Record values are untrusted: the decoder checks every length against the
 * value's size before it reads, allocates nothing sized by an unchecked
 * claim, and reports TP_ERR_FORMAT naming the record. A file shorter than
 * its own meta page says is rejected at open (mapping it would fault). */
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <lmdb.h>
#include <lz4.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <towerpack/wire.h>
#include "df_internal.h"

#define HDR_FIXED 8
#define COMP_FIXED 24
#define LZ4_MAX_RATIO 255
#define KEY_DIGITS 10
#define FORMAT_KEY "__format__"
#define COUNT_KEY "__count__"
#define CHUNK_KEY "__chunk__"
#define FORMAT_PREFIX "towerpack-records "
/* Address space reserved for a file being written; LMDB grows the file only
 * as pages are used, so this is a ceiling, not a size. */
#define WRITE_MAPSIZE ((size_t)64 << 30)

void tp_records_opts_init(tp_records_opts_t *opts) {
    opts->lz4 = 1;
    opts->lz4_min_bytes = 1024;
    opts->checksum = 0;
    opts->commit_every = 1000;
    opts->chunk = 64;
}

/* ---- value encoding ------------------------------------------------------ */

tp_status_t tp_records_encode(const tp_datapoint_t *dp,
                              const tp_records_opts_t *opts, void **data,
                              size_t *size) {
    tp_records_opts_t defaults;
    if (!opts) {
        tp_records_opts_init(&defaults);
        opts = &defaults;
    }
    int ncomp = tp_datapoint_size(dp);
    if (ncomp > 0xffff)
        return tp_error(TP_ERR_INVALID, "records: %d components", ncomp);
    size_t hdr = HDR_FIXED, bound = 0;
    for (int i = 0; i < ncomp; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        hdr += COMP_FIXED + 8 * (size_t)t->ndim;
        size_t b = t->nbytes;
        if (opts->lz4 && t->nbytes <= (size_t)LZ4_MAX_INPUT_SIZE)
            b = (size_t)LZ4_compressBound((int)t->nbytes);
        bound += b > t->nbytes ? b : t->nbytes;
    }
    uint8_t *buf = malloc(hdr + bound);
    if (!buf)
        return tp_error(TP_ERR_NOMEM, "records: value of %zu bytes",
                        hdr + bound);
    uint8_t *h = buf, *p = buf + hdr;
    uint32_t magic = TP_WIRE_MAGIC;
    uint16_t n16 = (uint16_t)ncomp;
    memcpy(h, &magic, 4);
    h[4] = TP_WIRE_VERSION;
    h[5] = opts->checksum ? TP_WIRE_FLAG_CHECKSUM : 0;
    memcpy(h + 6, &n16, 2);
    h += HDR_FIXED;
    for (int i = 0; i < ncomp; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        uint8_t codec = TP_WIRE_CODEC_NONE;
        uint64_t wire = t->nbytes;
        if (opts->lz4 && t->nbytes >= opts->lz4_min_bytes && t->nbytes > 0 &&
            t->nbytes <= (size_t)LZ4_MAX_INPUT_SIZE) {
            int cap = LZ4_compressBound((int)t->nbytes);
            int c = LZ4_compress_default(t->data, (char *)p, (int)t->nbytes,
                                         cap);
            if (c > 0 && (size_t)c < t->nbytes) {
                codec = TP_WIRE_CODEC_LZ4;
                wire = (uint64_t)c;
            }
        }
        if (codec == TP_WIRE_CODEC_NONE && t->nbytes)
            memcpy(p, t->data, t->nbytes);
        p += wire;
        uint32_t crc = opts->checksum ? (uint32_t)crc32_z(crc32_z(0, NULL, 0),
                                                          t->data, t->nbytes)
                                      : 0;
        uint64_t raw = t->nbytes;
        h[0] = (uint8_t)t->dtype;
        h[1] = (uint8_t)t->ndim;
        h[2] = codec;
        h[3] = 0;
        memcpy(h + 4, &crc, 4);
        memcpy(h + 8, &raw, 8);
        memcpy(h + 16, &wire, 8);
        memcpy(h + 24, t->shape, 8 * (size_t)t->ndim);
        h += COMP_FIXED + 8 * (size_t)t->ndim;
    }
    *data = buf;
    *size = (size_t)(p - buf);
    return TP_OK;
}

/* ---- value decoding ------------------------------------------------------ */

typedef struct {
    uint8_t dtype, ndim, codec;
    uint32_t crc;
    uint64_t raw, wire;
    size_t at;                 /* offset of its stored bytes in the value */
    int64_t shape[TP_MAX_DIMS];
} rcomp_t;

typedef struct {
    int ncomp, checksum;
    rcomp_t *c;                /* [ncomp]: stack or malloc'ed */
    rcomp_t stack[8];
} rparse_t;

static tp_status_t s_bad(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static tp_status_t s_bad(const char *fmt, ...) {
    char buf[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return tp_error(TP_ERR_FORMAT, "record value: %s", buf);
}

static void s_parse_fini(rparse_t *p) {
    if (p->c && p->c != p->stack)
        free(p->c);
    p->c = NULL;
}

/* Check the whole header and every length against `size`. Reads no
 * payload. On success p describes every component (s_parse_fini after). */
static tp_status_t s_parse(const uint8_t *v, size_t size, rparse_t *p) {
    p->c = NULL;
    if (!v || size < HDR_FIXED)
        return s_bad("%zu bytes, at least %d needed", size, HDR_FIXED);
    uint32_t magic;
    memcpy(&magic, v, 4);
    if (magic != TP_WIRE_MAGIC)
        return s_bad("bad magic 0x%08x", magic);
    if (v[4] != TP_WIRE_VERSION)
        return s_bad("wire version %u, this build reads %d", v[4],
                     TP_WIRE_VERSION);
    if (v[5] & ~TP_WIRE_FLAG_CHECKSUM)
        return s_bad("unknown flags 0x%02x", v[5]);
    p->checksum = v[5] & TP_WIRE_FLAG_CHECKSUM;
    uint16_t ncomp;
    memcpy(&ncomp, v + 6, 2);
    if (ncomp > TP_DP_MAX_COMPONENTS)
        return s_bad("%u components, at most %d", ncomp, TP_DP_MAX_COMPONENTS);
    p->ncomp = ncomp;
    p->c = ncomp <= 8 ? p->stack : malloc(ncomp * sizeof *p->c);
    if (!p->c)
        return tp_error(TP_ERR_NOMEM, "record value");
    rcomp_t *c = p->c;
    size_t off = HDR_FIXED;
    uint64_t payload = 0;
    tp_status_t rc = TP_OK;
    for (int i = 0; i < ncomp; i++) {
        if (size - off < COMP_FIXED) {
            rc = s_bad("header truncated in component %d", i);
            goto fail;
        }
        const uint8_t *h = v + off;
        c[i].dtype = h[0];
        c[i].ndim = h[1];
        c[i].codec = h[2];
        memcpy(&c[i].crc, h + 4, 4);
        memcpy(&c[i].raw, h + 8, 8);
        memcpy(&c[i].wire, h + 16, 8);
        off += COMP_FIXED;
        if (!tp_dtype_valid(c[i].dtype) || c[i].ndim > TP_MAX_DIMS || h[3]) {
            rc = s_bad("component %d: dtype %u, %u dims, reserved %u", i,
                       c[i].dtype, c[i].ndim, h[3]);
            goto fail;
        }
        if (size - off < 8 * (size_t)c[i].ndim) {
            rc = s_bad("header truncated in the shape of component %d", i);
            goto fail;
        }
        memcpy(c[i].shape, v + off, 8 * (size_t)c[i].ndim);
        off += 8 * (size_t)c[i].ndim;
        size_t numel, es = tp_dtype_size(c[i].dtype);
        if (tp_shape_numel(c[i].ndim, c[i].shape, es, &numel) != TP_OK ||
            (uint64_t)numel * es != c[i].raw) {
            rc = s_bad("component %d: shape does not match %" PRIu64 " bytes",
                       i, c[i].raw);
            goto fail;
        }
        if (c[i].codec == TP_WIRE_CODEC_NONE) {
            if (c[i].raw != c[i].wire) {
                rc = s_bad("component %d: raw %" PRIu64 " != stored %" PRIu64,
                           i, c[i].raw, c[i].wire);
                goto fail;
            }
        } else if (c[i].codec == TP_WIRE_CODEC_LZ4) {
            if (c[i].wire == 0 || c[i].raw > LZ4_MAX_INPUT_SIZE ||
                c[i].wire > LZ4_MAX_INPUT_SIZE ||
                c[i].raw > c[i].wire * LZ4_MAX_RATIO + 16) {
                rc = s_bad("component %d: impossible lz4 sizes", i);
                goto fail;
            }
        } else {
            rc = s_bad("component %d: unknown codec %u", i, c[i].codec);
            goto fail;
        }
        if (!p->checksum && c[i].crc) {
            rc = s_bad("component %d: checksum without the flag", i);
            goto fail;
        }
        if (c[i].wire > size || payload > size - c[i].wire) {
            rc = s_bad("component %d: longer than the value", i);
            goto fail;
        }
        payload += c[i].wire;
    }
    if (size - off != payload) {
        rc = s_bad("%zu payload bytes, the header describes %" PRIu64,
                   size - off, payload);
        goto fail;
    }
    for (int i = 0; i < ncomp; i++) {
        c[i].at = off;
        off += c[i].wire;
    }
    return TP_OK;
fail:
    s_parse_fini(p);
    return rc;
}

/* Decode component i (parsed) into dst (raw bytes long). */
static tp_status_t s_fill(const rparse_t *p, const uint8_t *v, int i,
                          void *dst) {
    const rcomp_t *c = &p->c[i];
    if (c->codec == TP_WIRE_CODEC_NONE) {
        if (c->raw)
            memcpy(dst, v + c->at, c->raw);
    } else {
        int n = LZ4_decompress_safe((const char *)v + c->at, dst,
                                    (int)c->wire, (int)c->raw);
        if (n < 0 || (uint64_t)n != c->raw)
            return s_bad("component %d: corrupt lz4 data", i);
    }
    if (p->checksum) {
        uint32_t crc = (uint32_t)crc32_z(crc32_z(0, NULL, 0), dst, c->raw);
        if (crc != c->crc)
            return s_bad("component %d: checksum 0x%08x, stored 0x%08x", i,
                         crc, c->crc);
    }
    return TP_OK;
}

tp_status_t tp_records_decode(const void *data, size_t size,
                              tp_datapoint_t **out) {
    *out = NULL;
    rparse_t p;
    TP_TRY(s_parse(data, size, &p));
    int n = p.ncomp;
    /* One allocation for every component (tp_df_datapoint_alloc). */
    /* shapes first: the int64 array must stay 8-byte aligned */
    int64_t(*shapes)[TP_MAX_DIMS] = malloc(
        (n ? n : 1) *
        (sizeof(int64_t[TP_MAX_DIMS]) + sizeof(tp_dtype_t) + sizeof(int)));
    if (!shapes) {
        s_parse_fini(&p);
        return tp_error(TP_ERR_NOMEM, "record value");
    }
    tp_dtype_t *dt = (tp_dtype_t *)(shapes + (n ? n : 1));
    int *nd = (int *)(dt + (n ? n : 1));
    for (int i = 0; i < n; i++) {
        dt[i] = (tp_dtype_t)p.c[i].dtype;
        nd[i] = p.c[i].ndim;
        memcpy(shapes[i], p.c[i].shape, sizeof p.c[i].shape);
    }
    tp_datapoint_t *dp = tp_df_datapoint_alloc(
        n, dt, nd, (const int64_t(*)[TP_MAX_DIMS])shapes);
    free(shapes);
    tp_status_t rc = dp ? TP_OK : TP_ERR_NOMEM;
    for (int i = 0; rc == TP_OK && i < n; i++)
        rc = s_fill(&p, data, i, tp_datapoint_get(dp, i)->data);
    s_parse_fini(&p);
    if (rc != TP_OK) {
        tp_datapoint_destroy(&dp);
        return rc;
    }
    *out = dp;
    return TP_OK;
}

/* Decode a value straight into slot `slot` of a stacked batch. */
static tp_status_t s_decode_into(const void *data, size_t size,
                                 tp_datapoint_t *batch, int64_t slot) {
    rparse_t p;
    TP_TRY(s_parse(data, size, &p));
    tp_status_t rc = TP_OK;
    for (int i = 0; rc == TP_OK && i < p.ncomp; i++) {
        size_t stride;
        void *dst = df_slot(batch, p.ncomp, i, slot, 1,
                            (tp_dtype_t)p.c[i].dtype, p.c[i].ndim,
                            p.c[i].shape, "record", &stride);
        rc = dst ? s_fill(&p, data, i, dst) : TP_ERR_SHAPE;
    }
    s_parse_fini(&p);
    return rc;
}

/* ---- saving -------------------------------------------------------------- */

static tp_status_t s_mdb(int err, const char *path, const char *what) {
    tp_status_t st = err == ENOENT      ? TP_ERR_NOT_FOUND
                     : err == MDB_INVALID || err == MDB_CORRUPTED ||
                               err == MDB_VERSION_MISMATCH ||
                               err == MDB_PAGE_NOTFOUND
                         ? TP_ERR_FORMAT
                     : err == ENOMEM ? TP_ERR_NOMEM
                                     : TP_ERR_IO;
    return tp_error(st, "lmdb %s: %s: %s", path, what, mdb_strerror(err));
}

static tp_status_t s_put(MDB_txn *txn, MDB_dbi dbi, const char *path,
                         const char *key, const void *val, size_t n,
                         unsigned flags) {
    MDB_val k = {strlen(key), (void *)key}, v = {n, (void *)val};
    int err = mdb_put(txn, dbi, &k, &v, flags);
    return err ? s_mdb(err, path, "writing a record") : TP_OK;
}

/* The 10-digit key of record idx (no snprintf: this is per record). */
static void s_key(int64_t idx, char *key) {
    for (int i = KEY_DIGITS - 1; i >= 0; i--) {
        key[i] = (char)('0' + idx % 10);
        idx /= 10;
    }
    key[KEY_DIGITS] = '\0';
}

/* A chunk being assembled: n records' bytes back to back and where each
 * ends. */
typedef struct {
    uint8_t *data;
    size_t len, cap;
    uint32_t *ends;   /* [per_value] */
    uint32_t n;
} chunk_buf_t;

static tp_status_t s_chunk_add(chunk_buf_t *c, const void *rec, size_t n) {
    if (c->len + n > UINT32_MAX)
        return tp_error(TP_ERR_INVALID, "records: chunk over 4 GiB (use a "
                        "smaller chunk)");
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? c->cap : 65536;
        while (cap < c->len + n)
            cap *= 2;
        uint8_t *d = realloc(c->data, cap);
        if (!d)
            return tp_error(TP_ERR_NOMEM, "records: chunk of %zu bytes", cap);
        c->data = d;
        c->cap = cap;
    }
    memcpy(c->data + c->len, rec, n);
    c->len += n;
    c->ends[c->n++] = (uint32_t)c->len;
    return TP_OK;
}

/* Write the chunk as value number vidx: u32 n | u32 ends[n] | records. */
static tp_status_t s_chunk_put(chunk_buf_t *c, MDB_txn *txn, MDB_dbi dbi,
                               const char *path, int64_t vidx) {
    size_t hdr = 4 + 4 * (size_t)c->n;
    uint8_t *v = malloc(hdr + c->len);
    if (!v)
        return tp_error(TP_ERR_NOMEM, "records: chunk");
    memcpy(v, &c->n, 4);
    memcpy(v + 4, c->ends, 4 * (size_t)c->n);
    if (c->len)
        memcpy(v + hdr, c->data, c->len);
    char key[32];
    s_key(vidx, key);
    tp_status_t rc = s_put(txn, dbi, path, key, v, hdr + c->len, MDB_APPEND);
    free(v);
    c->n = 0;
    c->len = 0;
    return rc;
}

tp_status_t tp_records_save(tp_dataflow_t *df, const char *path,
                            const tp_records_opts_t *opts,
                            int64_t *count_out) {
    tp_records_opts_t defaults;
    if (!opts) {
        tp_records_opts_init(&defaults);
        opts = &defaults;
    }
    if (count_out)
        *count_out = 0;
    size_t every = opts->commit_every ? opts->commit_every : 1000;
    size_t per = opts->chunk ? opts->chunk : 1;
    if (per > (1u << 20))
        return tp_error(TP_ERR_INVALID, "records: chunk of %zu (at most "
                        "%u)", per, 1u << 20);
    char lock[4200];
    snprintf(lock, sizeof lock, "%s-lock", path);
    if (unlink(path) != 0 && errno != ENOENT)
        return tp_error(TP_ERR_IO, "lmdb %s: cannot replace: %s", path,
                        strerror(errno));
    unlink(lock);
    MDB_env *env = NULL;
    MDB_txn *txn = NULL;
    MDB_dbi dbi;
    chunk_buf_t cb = {0};
    tp_status_t rc = TP_OK;
    cb.ends = malloc(per * sizeof *cb.ends);
    if (!cb.ends)
        return tp_error(TP_ERR_NOMEM, "records: chunk of %zu", per);
    int err = mdb_env_create(&env);
    if (!err)
        err = mdb_env_set_mapsize(env, WRITE_MAPSIZE);
    if (!err)
        err = mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOSYNC | MDB_NOLOCK,
                           0644);
    if (err) {
        rc = s_mdb(err, path, "create");
        goto done;
    }
    int64_t count = 0, values = 0;
    char key[32];
    for (;;) {
        if (!txn) {
            if ((err = mdb_txn_begin(env, NULL, 0, &txn)) ||
                (err = mdb_dbi_open(txn, NULL, 0, &dbi))) {
                rc = s_mdb(err, path, "begin a write");
                goto done;
            }
        }
        tp_datapoint_t *dp;
        rc = tp_dataflow_next(df, &dp);
        if (rc == TP_DONE) {
            rc = TP_OK;
            break;
        }
        if (rc < 0) {
            tp_error_wrap(rc, "lmdb %s: reading the dataflow", path);
            goto done;
        }
        void *val;
        size_t n;
        rc = tp_records_encode(dp, opts, &val, &n);
        tp_datapoint_destroy(&dp);
        if (rc != TP_OK)
            goto done;
        if (per == 1) {
            s_key(count, key);
            rc = s_put(txn, dbi, path, key, val, n, MDB_APPEND);
            values++;
        } else {
            rc = s_chunk_add(&cb, val, n);
            if (rc == TP_OK && cb.n == per)
                rc = s_chunk_put(&cb, txn, dbi, path, values++);
        }
        free(val);
        if (rc != TP_OK)
            goto done;
        count++;
        if ((size_t)count % every == 0 && cb.n == 0) {
            err = mdb_txn_commit(txn);
            txn = NULL;
            if (err) {
                rc = s_mdb(err, path, "commit");
                goto done;
            }
        }
    }
    if (cb.n > 0 && (rc = s_chunk_put(&cb, txn, dbi, path, values++)) != TP_OK)
        goto done;
    char val[64];
    snprintf(val, sizeof val, "%s%d", FORMAT_PREFIX, TP_RECORDS_VERSION);
    rc = s_put(txn, dbi, path, FORMAT_KEY, val, strlen(val), 0);
    if (rc == TP_OK) {
        snprintf(val, sizeof val, "%" PRId64, count);
        rc = s_put(txn, dbi, path, COUNT_KEY, val, strlen(val), 0);
    }
    if (rc == TP_OK) {
        snprintf(val, sizeof val, "%zu", per);
        rc = s_put(txn, dbi, path, CHUNK_KEY, val, strlen(val), 0);
    }
    if (rc != TP_OK)
        goto done;
    err = mdb_txn_commit(txn);
    txn = NULL;
    if (!err)
        err = mdb_env_sync(env, 1);
    if (err) {
        rc = s_mdb(err, path, "commit");
        goto done;
    }
    if (count_out)
        *count_out = count;
done:
    if (txn)
        mdb_txn_abort(txn);
    if (env)
        mdb_env_close(env);
    free(cb.data);
    free(cb.ends);
    if (rc != TP_OK)
        unlink(path);
    return rc;
}

/* ---- reading ------------------------------------------------------------- */

/* The layout of the last fully validated record, when it was stored raw
 * (no lz4, no checksum): a record whose value has the same size and the
 * same header bytes has the same, already checked, layout, so its
 * components are copied at known offsets with no parsing. */
#define FAST_MAX_COMP 16
#define FAST_MAX_HDR 512
typedef struct {
    int valid;
    size_t size, hdr_len;
    int ncomp;
    uint8_t hdr[FAST_MAX_HDR];
    size_t at[FAST_MAX_COMP], raw[FAST_MAX_COMP];
    rcomp_t comp[FAST_MAX_COMP];
} fast_t;

typedef struct {
    char *path;
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *txn;       /* read transaction of the current pass */
    MDB_cursor *cur;
    int64_t count, pos;
    int64_t ahead_pos;   /* record looked up in advance, or -1 */
    MDB_val ahead;
    char ahead_key[KEY_DIGITS + 1];
    uintptr_t last_page;  /* page of the last value looked up */
    int64_t cur_vidx;     /* value the cursor sits on, or -1 */
    int64_t per_value;    /* records per LMDB value ("__chunk__") */
    MDB_val chunk;        /* the current chunk (per_value > 1) */
    int64_t chunk_idx;    /* its number, or -1 */
    size_t chunk_data;    /* offset of its first record */
    uint8_t *chunk_ok;    /* [number of chunks]: header already checked */
    int64_t pf_pos;       /* shuffled chunks: record looked up ahead, or -1 */
    MDB_val pf_val;       /* its chunk */
    int64_t pf_j;         /* its place in the chunk */
    size_t pf_n;          /* records in that chunk */
    fast_t fast;          /* layout of the last raw record (next_into) */
    int shuffle;
    uint32_t *order;    /* [count] when shuffled */
    tp_rng_t rng;
} lmdb_t;

static tp_status_t s_lmdb_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                uint64_t stream) {
    lmdb_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "lmdb");
    return TP_OK;
}

static void s_end_txn(lmdb_t *self) {
    self->ahead_pos = -1;
    self->pf_pos = -1;
    self->cur_vidx = -1;
    self->chunk_idx = -1;
    if (self->cur)
        mdb_cursor_close(self->cur);
    self->cur = NULL;
    if (self->txn)
        mdb_txn_abort(self->txn);
    self->txn = NULL;
}

static tp_status_t s_lmdb_begin(void *impl) {
    lmdb_t *self = impl;
    s_end_txn(self);
    int err = mdb_txn_begin(self->env, NULL, MDB_RDONLY, &self->txn);
    if (!err)
        err = mdb_cursor_open(self->txn, self->dbi, &self->cur);
    if (err) {
        s_end_txn(self);
        return s_mdb(err, self->path, "begin a read");
    }
    if (self->shuffle)
        df_iota_shuffle(self->order, (size_t)self->count, &self->rng);
    self->pos = 0;
    self->ahead_pos = -1;
    return TP_OK;
}

static tp_status_t s_lmdb_get(lmdb_t *self, MDB_val *v, char *key);
static const char *s_rec_name(const lmdb_t *self, char *key);

static tp_status_t s_lmdb_next(void *impl, tp_datapoint_t **out) {
    lmdb_t *self = impl;
    if (self->pos >= self->count) {
        s_end_txn(self);
        return TP_DONE;
    }
    MDB_val v;
    char key[32];
    TP_TRY(s_lmdb_get(self, &v, key));
    tp_status_t rc = tp_records_decode(v.mv_data, v.mv_size, out);
    if (rc != TP_OK)
        return tp_error_wrap(rc, "lmdb %s: record %s", self->path,
                             s_rec_name(self, key));
    self->pos++;
    return TP_OK;
}

/* Fetch LMDB value number vidx (a record, or a chunk of records): a cursor
 * step when reading in order and the cursor sits on the value before,
 * else a lookup. */
static tp_status_t s_value_fetch(lmdb_t *self, int64_t vidx, MDB_val *v,
                                 char *key) {
    s_key(vidx, key);
    MDB_val k = {KEY_DIGITS, key};
    int err;
    if (self->shuffle) {
        err = mdb_get(self->txn, self->dbi, &k, v);
    } else {
        err = mdb_cursor_get(self->cur, &k, v,
                             self->cur_vidx >= 0 && vidx == self->cur_vidx + 1
                                 ? MDB_NEXT
                                 : MDB_SET_KEY);
        self->cur_vidx = err ? -1 : vidx;
    }
    if (err == MDB_NOTFOUND ||
        (!err && (k.mv_size != KEY_DIGITS ||
                  memcmp(k.mv_data, key, KEY_DIGITS) != 0))) {
        self->cur_vidx = -1;
        return tp_error(TP_ERR_FORMAT, "lmdb %s: value %s is missing (the "
                        "file says it holds %" PRId64 " records)", self->path,
                        key, self->count);
    }
    if (err)
        return s_mdb(err, self->path, "reading a record");
    return TP_OK;
}

tp_status_t df_records_chunk_check(const void *value, size_t size,
                                   int64_t want, const char *path,
                                   const char *key, size_t *data_off) {
    const uint8_t *c = value;
    uint32_t n;
    if (size < 4 || (memcpy(&n, c, 4), (int64_t)n != want) ||
        size - 4 < 4 * (size_t)n)
        return tp_error(TP_ERR_FORMAT, "lmdb %s: chunk %s: bad header (%zu "
                        "bytes, %" PRId64 " records expected)", path, key,
                        size, want);
    size_t data = 4 + 4 * (size_t)n;
    uint32_t prev = 0, end = 0;
    for (uint32_t j = 0; j < n; j++) {
        memcpy(&end, c + 4 + 4 * (size_t)j, 4);
        if (end < prev || end > size - data)
            return tp_error(TP_ERR_FORMAT, "lmdb %s: chunk %s: record %u "
                            "ends at %u, outside the chunk", path, key, j,
                            end);
        prev = end;
    }
    if (end != size - data)
        return tp_error(TP_ERR_FORMAT, "lmdb %s: chunk %s: %zu trailing "
                        "bytes", path, key, size - data - end);
    *data_off = data;
    return TP_OK;
}

/* Record j of the current chunk. The chunk header was checked at fetch. */
static void s_chunk_slice(const lmdb_t *self, int64_t j, MDB_val *v) {
    const uint8_t *c = self->chunk.mv_data;
    uint32_t start = 0, end;
    if (j > 0)
        memcpy(&start, c + 4 + 4 * (size_t)(j - 1), 4);
    memcpy(&end, c + 4 + 4 * (size_t)j, 4);
    v->mv_data = (void *)(c + self->chunk_data + start);
    v->mv_size = end - start;
}

/* Fetch chunk number cidx and check its header: u32 n, then n u32 end
 * offsets (non-decreasing, the last one the end of the value). */
static tp_status_t s_chunk_fetch(lmdb_t *self, int64_t cidx, char *key) {
    self->chunk_idx = -1;
    TP_TRY(s_value_fetch(self, cidx, &self->chunk, key));
    const uint8_t *c = self->chunk.mv_data;
    size_t size = self->chunk.mv_size;
    int64_t want = self->count - cidx * self->per_value;
    if (want > self->per_value)
        want = self->per_value;
    if (self->chunk_ok && self->chunk_ok[cidx]) {
        /* checked before; the file is mapped read-only and cannot change
         * under a read transaction, so the header still holds */
        self->chunk_data = 4 + 4 * (size_t)want;
        self->chunk_idx = cidx;
        return TP_OK;
    }
    size_t data;
    TP_TRY(df_records_chunk_check(c, size, want, self->path, key, &data));
    self->chunk_data = data;
    self->chunk_idx = cidx;
    if (self->chunk_ok)
        self->chunk_ok[cidx] = 1;
    return TP_OK;
}

/* Name the current record for a message when s_lmdb_get left key empty. */
static const char *s_rec_name(const lmdb_t *self, char *key) {
    if (!key[0])
        snprintf(key, 32, "#%" PRId64,
                 self->shuffle ? (int64_t)self->order[self->pos] : self->pos);
    return key;
}

/* Shuffled reads of a chunked file jump to a random record each time, and
 * the record's first touch is a cache miss. Two steps ahead, look the
 * chunk of record pos+2 up (its leaf page is hot) and prefetch its offset
 * table entry; one step ahead, read the offsets of record pos+1 (fetched
 * last time) and prefetch its bytes. Prefetches never fault, and offsets
 * are only read inside the value, so an unchecked chunk is harmless. */
static void s_shuffled_prefetch(lmdb_t *self) {
    char key[32];
    if (self->pf_pos == self->pos + 1) {
        const uint8_t *c = self->pf_val.mv_data;
        int64_t j = self->pf_j;
        size_t n = self->pf_n;
        if (4 + 4 * (size_t)(j + 1) <= self->pf_val.mv_size &&
            4 + 4 * n <= self->pf_val.mv_size) {
            uint32_t start = 0, end;
            if (j > 0)
                memcpy(&start, c + 4 + 4 * (size_t)(j - 1), 4);
            memcpy(&end, c + 4 + 4 * (size_t)j, 4);
            const uint8_t *rec = c + 4 + 4 * n + start;
            for (uint32_t off = 0; off < end - start && off < 4096;
                 off += 64)
                __builtin_prefetch(rec + off);
        }
    }
    self->pf_pos = -1;
    if (self->pos + 2 < self->count) {
        int64_t idx = self->order[self->pos + 2];
        int64_t cidx = idx / self->per_value;
        if (s_value_fetch(self, cidx, &self->pf_val, key) == TP_OK) {
            self->pf_pos = self->pos + 2;
            self->pf_j = idx % self->per_value;
            int64_t n = self->count - cidx * self->per_value;
            self->pf_n = (size_t)(n < self->per_value ? n : self->per_value);
            __builtin_prefetch((const uint8_t *)self->pf_val.mv_data + 4 +
                               4 * (size_t)self->pf_j);
        } else {
            tp_clear_error();
        }
    }
}

/* The bytes of the current record (self->pos) into *v; key names it for
 * messages. With one record per value, the following record is looked up
 * one step ahead and its bytes prefetched: LMDB's pages are in the page
 * cache but not in the CPU's, and the hardware prefetcher cannot guess
 * where the next value lives. Pointers stay valid for the pass's read
 * transaction. */
static tp_status_t s_lmdb_get(lmdb_t *self, MDB_val *v, char *key) {
    int64_t idx = self->shuffle ? self->order[self->pos] : self->pos;
    if (self->per_value > 1) {
        int64_t cidx = idx / self->per_value;
        if (cidx != self->chunk_idx)
            TP_TRY(s_chunk_fetch(self, cidx, key));
        s_chunk_slice(self, idx % self->per_value, v);
        key[0] = '\0';  /* named only if it fails (s_rec_name) */
        if (self->shuffle)
            s_shuffled_prefetch(self);
        return TP_OK;
    }
    if (self->ahead_pos == self->pos) {
        *v = self->ahead;
        memcpy(key, self->ahead_key, KEY_DIGITS + 1);
    } else {
        TP_TRY(s_value_fetch(self, idx, v, key));
    }
    self->ahead_pos = -1;
    if (self->pos + 1 < self->count) {
        int64_t next = self->shuffle ? self->order[self->pos + 1]
                                     : self->pos + 1;
        if (s_value_fetch(self, next, &self->ahead, self->ahead_key) != TP_OK) {
            tp_clear_error();  /* reported when that record's turn comes */
            return TP_OK;
        }
        self->ahead_pos = self->pos + 1;
        const char *p = self->ahead.mv_data;
        for (size_t off = 0; off < self->ahead.mv_size; off += 64)
            __builtin_prefetch(p + off);
        /* Reading in key order walks the leaf pages, which a file written
         * in order (MDB_APPEND) lays out one after the other; the hardware
         * prefetcher stops at each 4 KiB page, so when the walk enters a
         * new page, start it on the page after next. A few lines are
         * enough: a prefetch of every line would stall on the CPU's few
         * outstanding-miss buffers. */
        uintptr_t page = (uintptr_t)p & ~(uintptr_t)4095;
        if (!self->shuffle && page != self->last_page) {
            self->last_page = page;
            for (size_t off = 0; off < 4096; off += 1024)
                __builtin_prefetch((const char *)page + 2 * 4096 + off);
        }
    }
    return TP_OK;
}

static void s_fast_learn(fast_t *f, const uint8_t *v, size_t size) {
    rparse_t p;
    f->valid = 0;
    if (s_parse(v, size, &p) != TP_OK)
        return;
    size_t hdr = p.ncomp ? p.c[0].at : HDR_FIXED;
    int ok = !p.checksum && p.ncomp <= FAST_MAX_COMP && hdr <= FAST_MAX_HDR;
    for (int i = 0; ok && i < p.ncomp; i++)
        ok = p.c[i].codec == TP_WIRE_CODEC_NONE;
    if (ok) {
        f->size = size;
        f->hdr_len = hdr;
        f->ncomp = p.ncomp;
        memcpy(f->hdr, v, hdr);
        for (int i = 0; i < p.ncomp; i++) {
            f->at[i] = p.c[i].at;
            f->raw[i] = p.c[i].raw;
            f->comp[i] = p.c[i];
        }
        f->valid = 1;
    }
    s_parse_fini(&p);
}

static tp_status_t s_lmdb_next_into(void *impl, tp_datapoint_t *batch,
                                    int64_t slot, int64_t count,
                                    int64_t *filled) {
    lmdb_t *self = impl;
    fast_t *f = &self->fast;
    *filled = 0;
    /* Slot pointers for the fast layout, checked against this batch once
     * per call. */
    uint8_t *base[FAST_MAX_COMP];
    size_t stride[FAST_MAX_COMP];
    int bound = 0;
    for (int64_t j = 0; j < count; j++) {
        if (self->pos >= self->count) {
            s_end_txn(self);
            return TP_DONE;
        }
        MDB_val v;
        char key[32];
        TP_TRY(s_lmdb_get(self, &v, key));
        const uint8_t *val = v.mv_data;
        if (f->valid && v.mv_size == f->size &&
            memcmp(val, f->hdr, f->hdr_len) == 0) {
            if (!bound) {
                for (int i = 0; i < f->ncomp; i++) {
                    base[i] = df_slot(batch, f->ncomp, i, slot, count,
                                      (tp_dtype_t)f->comp[i].dtype,
                                      f->comp[i].ndim, f->comp[i].shape,
                                      "record", &stride[i]);
                    if (!base[i])
                        return tp_error_wrap(TP_ERR_SHAPE, "lmdb %s: record "
                                             "%s", self->path,
                                             s_rec_name(self, key));
                }
                bound = 1;
            }
            for (int i = 0; i < f->ncomp; i++)
                memcpy(base[i] + (size_t)j * stride[i], val + f->at[i],
                       f->raw[i]);
        } else {
            tp_status_t rc = s_decode_into(val, v.mv_size, batch, slot + j);
            if (rc != TP_OK)
                return tp_error_wrap(rc, "lmdb %s: record %s", self->path,
                                     s_rec_name(self, key));
            s_fast_learn(f, val, v.mv_size);
            bound = 0;
        }
        self->pos++;
        (*filled)++;
    }
    return TP_OK;
}

static int64_t s_lmdb_size(void *impl) { return ((lmdb_t *)impl)->count; }

static void s_lmdb_end_pass(void *impl) { s_end_txn(impl); }

static void s_lmdb_destroy(void *impl) {
    lmdb_t *self = impl;
    s_end_txn(self);
    if (self->env)
        mdb_env_close(self->env);
    free(self->order);
    free(self->chunk_ok);
    free(self->path);
    free(self);
}

static const tp_dataflow_ops_t s_lmdb_ops = {
    .name = "lmdb", .reset_state = s_lmdb_reset, .begin = s_lmdb_begin,
    .next = s_lmdb_next, .size = s_lmdb_size, .destroy = s_lmdb_destroy,
    .end_pass = s_lmdb_end_pass, .next_into = s_lmdb_next_into};

/* Read a small metadata value as a string. */
static tp_status_t s_meta(lmdb_t *self, MDB_txn *txn, const char *key,
                          char *buf, size_t size) {
    MDB_val k = {strlen(key), (void *)key}, v;
    int err = mdb_get(txn, self->dbi, &k, &v);
    if (err == MDB_NOTFOUND)
        return tp_error(TP_ERR_FORMAT, "lmdb %s: no '%s' entry (not a "
                        "towerpack record file)", self->path, key);
    if (err)
        return s_mdb(err, self->path, "reading metadata");
    if (v.mv_size >= size)
        return tp_error(TP_ERR_FORMAT, "lmdb %s: '%s' entry of %zu bytes",
                        self->path, key, v.mv_size);
    memcpy(buf, v.mv_data, v.mv_size);
    buf[v.mv_size] = '\0';
    return TP_OK;
}

tp_dataflow_t *tp_df_lmdb(const char *path, int shuffle) {
    if (!path) {
        tp_error(TP_ERR_INVALID, "lmdb: no path");
        return NULL;
    }
    lmdb_t *self = calloc(1, sizeof *self);
    if (!self || !(self->path = strdup(path))) {
        free(self);
        tp_error(TP_ERR_NOMEM, "lmdb");
        return NULL;
    }
    self->shuffle = shuffle;
    tp_status_t rc = TP_OK;
    MDB_txn *txn = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        rc = tp_error(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO,
                      "lmdb %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = tp_error(TP_ERR_IO, "lmdb %s: not a regular file", path);
        goto fail;
    }
    int err = mdb_env_create(&self->env);
    if (!err)
        err = mdb_env_open(self->env, path,
                           MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK, 0644);
    if (err) {
        rc = s_mdb(err == EINVAL ? MDB_INVALID : err, path, "open");
        goto fail;
    }
    /* A truncated file would fault when LMDB touches a page past its end:
     * check the size the meta page claims before reading anything. */
    MDB_envinfo info;
    MDB_stat mst;
    mdb_env_info(self->env, &info);
    mdb_env_stat(self->env, &mst);
    uint64_t need = ((uint64_t)info.me_last_pgno + 1) * mst.ms_psize;
    if ((uint64_t)st.st_size < need) {
        rc = tp_error(TP_ERR_FORMAT, "lmdb %s: truncated (%lld bytes, its "
                      "pages need %" PRIu64 ")", path, (long long)st.st_size,
                      need);
        goto fail;
    }
    if ((err = mdb_txn_begin(self->env, NULL, MDB_RDONLY, &txn)) ||
        (err = mdb_dbi_open(txn, NULL, 0, &self->dbi))) {
        rc = s_mdb(err, path, "begin a read");
        goto fail;
    }
    char buf[64];
    if ((rc = s_meta(self, txn, FORMAT_KEY, buf, sizeof buf)) != TP_OK)
        goto fail;
    size_t plen = strlen(FORMAT_PREFIX);
    if (strncmp(buf, FORMAT_PREFIX, plen) != 0) {
        rc = tp_error(TP_ERR_FORMAT, "lmdb %s: format '%s' (not a towerpack "
                      "record file)", path, buf);
        goto fail;
    }
    if (atoi(buf + plen) != TP_RECORDS_VERSION) {
        rc = tp_error(TP_ERR_FORMAT, "lmdb %s: record format version %s, "
                      "this build reads %d", path, buf + plen,
                      TP_RECORDS_VERSION);
        goto fail;
    }
    if ((rc = s_meta(self, txn, COUNT_KEY, buf, sizeof buf)) != TP_OK)
        goto fail;
    char *end;
    errno = 0;
    long long cnt = strtoll(buf, &end, 10);
    if (errno || *end || end == buf || cnt < 0 || cnt > UINT32_MAX) {
        rc = tp_error(TP_ERR_FORMAT, "lmdb %s: bad record count '%s'", path,
                      buf);
        goto fail;
    }
    self->per_value = 1;  /* files without "__chunk__": one per value */
    {
        MDB_val k = {strlen(CHUNK_KEY), CHUNK_KEY}, v;
        if (mdb_get(txn, self->dbi, &k, &v) == 0) {
            long long per = 0;
            if (v.mv_size < sizeof buf) {
                memcpy(buf, v.mv_data, v.mv_size);
                buf[v.mv_size] = '\0';
                errno = 0;
                per = strtoll(buf, &end, 10);
                if (errno || *end || end == buf)
                    per = 0;
            }
            if (per < 1 || per > (1 << 20)) {
                rc = tp_error(TP_ERR_FORMAT, "lmdb %s: bad '%s' entry", path,
                              CHUNK_KEY);
                goto fail;
            }
            self->per_value = per;
        }
    }
    if ((uint64_t)(cnt + self->per_value - 1) / (uint64_t)self->per_value >
        mst.ms_entries) {
        rc = tp_error(TP_ERR_FORMAT, "lmdb %s: says %lld records but holds "
                      "only %zu values", path, cnt, (size_t)mst.ms_entries);
        goto fail;
    }
    mdb_txn_abort(txn);
    txn = NULL;
    self->count = cnt;
    if (self->per_value > 1) {
        size_t nchunks = (size_t)((cnt + self->per_value - 1) / self->per_value);
        self->chunk_ok = calloc(nchunks ? nchunks : 1, 1);
        if (!self->chunk_ok) {
            rc = tp_error(TP_ERR_NOMEM, "lmdb %s", path);
            goto fail;
        }
    }
    if (shuffle) {
        self->order = calloc(cnt ? (size_t)cnt : 1, sizeof *self->order);
        if (!self->order) {
            rc = tp_error(TP_ERR_NOMEM, "lmdb %s: order of %lld", path, cnt);
            goto fail;
        }
    }
    return df_make(&s_lmdb_ops, self);
fail:
    if (txn)
        mdb_txn_abort(txn);
    s_lmdb_destroy(self);
    (void)rc;
    return NULL;
}
