/* towerpack dataflow: tensorpack's msgpack datapoints (TENSORPACK_SERIALIZE=
 * msgpack: msgpack.dumps(dp, use_bin_type=True) with msgpack-numpy's
 * encoder), decoded by msgpack-c, and the encoders of the way back.
 *
 * msgpack-numpy writes an array as a map {b'nd': True, b'type': '<f4',
 * b'kind': b'', b'shape': [..], b'data': bin} and a numpy scalar as
 * {b'nd': False, b'type': ..., b'data': bin}; everything else is plain
 * msgpack. msgpack-c allocates an array's or map's objects from the count
 * in its header before it reads them, so a lying header (4 billion items
 * in 10 bytes) would cost gigabytes: s_precheck walks the headers first,
 * refusing any count larger than the bytes left, more than MAX_OBJECTS
 * objects and nesting deeper than TP_TPK_MAX_DEPTH; msgpack-c then does
 * the decoding. The common case, tensorpack's list of arrays and
 * scalars, takes a measured fast path first (s_fast, below). */
#include <msgpack.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "df_tp.h"

static uint64_t s_be(const uint8_t *p, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++)
        v = v << 8 | p[i];
    return v;
}

/* Objects a message may hold: msgpack-c spends 24 bytes on each, so a
 * gigabyte of nils would cost 24 GB (a few datapoints need tens; the
 * __keys__ of ImageNet 1.3M). */
#define MAX_OBJECTS (1u << 22)

/* Header walk: one top-level object filling exactly n bytes; *nobj: the
 * objects it holds. */
static tp_status_t s_precheck(const uint8_t *p, size_t n, uint32_t *nobj) {
    uint64_t left[TP_TPK_MAX_DEPTH + 1];  /* items still to read per level */
    int depth = 0;
    size_t off = 0;
    uint32_t objects = 0;
    left[0] = 1;
    while (depth >= 0) {
        if (left[depth] == 0) {
            depth--;
            continue;
        }
        left[depth]--;
        if (++objects > MAX_OBJECTS)
            return tp_error(TP_ERR_PROTOCOL, "msgpack: more than %u objects", MAX_OBJECTS);
        if (off >= n)
            return tp_error(TP_ERR_PROTOCOL, "msgpack: truncated at byte %zu", off);
        uint8_t b = p[off++];
        uint64_t items = 0, skip = 0;
        int hdr = 0;  /* bytes of a length field */
        int container = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        } else if (b <= 0x8f) {
            items = 2u * (b & 0x0f);
            container = 1;
        } else if (b <= 0x9f) {
            items = b & 0x0f;
            container = 1;
        } else if (b <= 0xbf) {
            skip = b & 0x1f;
        } else {
            switch (b) {
            case 0xc4: case 0xd9: hdr = 1; break;             /* bin8, str8 */
            case 0xc5: case 0xda: hdr = 2; break;
            case 0xc6: case 0xdb: hdr = 4; break;
            case 0xc7: hdr = 1; skip = 1; break;              /* ext: + type */
            case 0xc8: hdr = 2; skip = 1; break;
            case 0xc9: hdr = 4; skip = 1; break;
            case 0xca: skip = 4; break;
            case 0xcb: skip = 8; break;
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xce: case 0xd2: skip = 4; break;
            case 0xcf: case 0xd3: skip = 8; break;
            case 0xd4: skip = 2; break;                       /* fixext */
            case 0xd5: skip = 3; break;
            case 0xd6: skip = 5; break;
            case 0xd7: skip = 9; break;
            case 0xd8: skip = 17; break;
            case 0xdc: case 0xde: hdr = 2; container = b == 0xdc ? 1 : 2; break;
            case 0xdd: case 0xdf: hdr = 4; container = b == 0xdd ? 1 : 2; break;
            default:
                return tp_error(TP_ERR_PROTOCOL, "msgpack: byte 0x%02x at %zu is no "
                                "type", b, off - 1);
            }
        }
        if (hdr) {
            if (n - off < (size_t)hdr)
                return tp_error(TP_ERR_PROTOCOL, "msgpack: truncated length at byte %zu",
                                off);
            uint64_t len = s_be(p + off, hdr);
            off += (size_t)hdr;
            if (container)
                items = container == 2 ? 2 * len : len;
            else
                skip += len;
        }
        if (skip > n - off)
            return tp_error(TP_ERR_PROTOCOL, "msgpack: an object of %llu bytes at byte "
                            "%zu, %zu are left", (unsigned long long)skip, off, n - off);
        off += (size_t)skip;
        if (container) {
            if (items > n - off)
                return tp_error(TP_ERR_PROTOCOL, "msgpack: a header at byte %zu claims "
                                "%llu items, only %zu bytes are left", off,
                                (unsigned long long)items, n - off);
            if (depth == TP_TPK_MAX_DEPTH)
                return tp_error(TP_ERR_PROTOCOL, "msgpack: nested deeper than %d",
                                TP_TPK_MAX_DEPTH);
            left[++depth] = items;
        }
    }
    if (off != n)
        return tp_error(TP_ERR_PROTOCOL, "msgpack: %zu bytes after the datapoint", n - off);
    *nobj = objects;
    return TP_OK;
}

static inline int s_is(const msgpack_object *o, const char *s) {
    size_t l = __builtin_strlen(s);
    if (o->type == MSGPACK_OBJECT_BIN)
        return o->via.bin.size == l && !memcmp(o->via.bin.ptr, s, l);
    if (o->type == MSGPACK_OBJECT_STR)
        return o->via.str.size == l && !memcmp(o->via.str.ptr, s, l);
    return 0;
}

static int s_raw(const msgpack_object *o, const uint8_t **p, size_t *len) {
    if (o->type == MSGPACK_OBJECT_BIN) {
        *p = (const uint8_t *)o->via.bin.ptr;
        *len = o->via.bin.size;
        return 1;
    }
    if (o->type == MSGPACK_OBJECT_STR) {
        *p = (const uint8_t *)o->via.str.ptr;
        *len = o->via.str.size;
        return 1;
    }
    return 0;
}

/* msgpack-numpy's map of an array or scalar. */
static tp_status_t s_ndarray(const msgpack_object *m, int i, df_tpk_comps_t *cs) {
    const msgpack_object *nd = NULL, *type = NULL, *kind = NULL, *shape = NULL,
                         *data = NULL;
    for (uint32_t k = 0; k < m->via.map.size; k++) {  /* one pass over the keys */
        const msgpack_object *key = &m->via.map.ptr[k].key, *val = &m->via.map.ptr[k].val;
        if (s_is(key, "nd"))
            nd = val;
        else if (s_is(key, "type"))
            type = val;
        else if (s_is(key, "kind"))
            kind = val;
        else if (s_is(key, "shape"))
            shape = val;
        else if (s_is(key, "data"))
            data = val;
    }
    if (!nd)
        return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d is a map that is not "
                        "a msgpack-numpy array (no 'nd')", i);
    if (nd->type != MSGPACK_OBJECT_BOOLEAN)
        return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: 'nd' is not a bool", i);
    const uint8_t *kp, *tp, *dp;
    size_t kl, tl, dl;
    if (kind && (!s_raw(kind, &kp, &kl) || kl != 0))
        return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: an array of kind "
                        "'%.*s' (object or structured arrays are not taken)", i,
                        kind && s_raw(kind, &kp, &kl) ? (int)(kl < 8 ? kl : 8) : 1,
                        kind && s_raw(kind, &kp, &kl) ? (const char *)kp : "?");
    if (!type || !s_raw(type, &tp, &tl))
        return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: no type string (a "
                        "structured dtype?)", i);
    if (!data || !s_raw(data, &dp, &dl))
        return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: no data bytes", i);
    tp_dtype_t dt;
    char why[200];
    if (!df_tpk_np_typestr((const char *)tp, tl, &dt, why, sizeof why))
        return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: %s", i, why);
    int64_t sh[TP_MAX_DIMS];
    int ndim = 0;
    if (nd->via.boolean) {
        if (!shape || shape->type != MSGPACK_OBJECT_ARRAY)
            return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: no shape", i);
        if (shape->via.array.size > TP_MAX_DIMS)
            return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: %u dimensions "
                            "(at most %d)", i, shape->via.array.size, TP_MAX_DIMS);
        ndim = (int)shape->via.array.size;
        for (int k = 0; k < ndim; k++) {
            const msgpack_object *d = &shape->via.array.ptr[k];
            if (d->type != MSGPACK_OBJECT_POSITIVE_INTEGER || d->via.u64 > INT64_MAX)
                return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: dimension %d "
                                "is not a non-negative int", i, k);
            sh[k] = (int64_t)d->via.u64;
        }
    }
    return df_tpk_comp_array(cs, dt, ndim, sh, dp, dl, "msgpack: component", i);
}

static tp_status_t s_item(const msgpack_object *o, int i, df_tpk_comps_t *cs) {
    const uint8_t *p;
    size_t l;
    switch (o->type) {
    case MSGPACK_OBJECT_MAP: return s_ndarray(o, i, cs);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > INT64_MAX)
            return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d: %llu does not fit "
                            "int64", i, (unsigned long long)o->via.u64);
        return df_tpk_comp_int(cs, (int64_t)o->via.u64) ? TP_OK : TP_ERR_PROTOCOL;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return df_tpk_comp_int(cs, o->via.i64) ? TP_OK : TP_ERR_PROTOCOL;
    case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64:
        return df_tpk_comp_float(cs, o->via.f64) ? TP_OK : TP_ERR_PROTOCOL;
    case MSGPACK_OBJECT_BOOLEAN:
        return df_tpk_comp_bool(cs, o->via.boolean) ? TP_OK : TP_ERR_PROTOCOL;
    case MSGPACK_OBJECT_BIN: case MSGPACK_OBJECT_STR:
        s_raw(o, &p, &l);
        return df_tpk_comp_bytes(cs, p, l) ? TP_OK : TP_ERR_PROTOCOL;
    default:
        return tp_error(TP_ERR_PROTOCOL, "msgpack: component %d is %s: only arrays, "
                        "numbers, bytes and str are components", i,
                        o->type == MSGPACK_OBJECT_NIL ? "nil"
                        : o->type == MSGPACK_OBJECT_ARRAY ? "a list" : "an ext");
    }
}

/* Unpack into *u (caller destroys) after the precheck. */
static tp_status_t s_unpack(const uint8_t *p, size_t n, msgpack_unpacked *u) {
    msgpack_unpacked_init(u);
    uint32_t nobj = 0;
    TP_TRY(s_precheck(p, n, &nobj));
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(u, (const char *)p, n, &off);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return tp_error(TP_ERR_NOMEM, "msgpack: out of memory");
    if (r != MSGPACK_UNPACK_SUCCESS || off != n)
        return tp_error(TP_ERR_PROTOCOL, "msgpack: msgpack-c could not unpack it "
                        "(status %d)", (int)r);
    return TP_OK;
}

/* A zone per thread for the datapoints' objects: msgpack_unpack_next makes
 * and frees a zone (two mallocs and two frees) per message; a datapoint's
 * few dozen objects fit the zone's first chunk again and again. Its
 * objects only live during df_tpk_msgpack (the components point into the
 * message, never into the zone), so the datapoints made from it may be
 * freed on any thread. */
#define ZONE_CHUNK 8192
#define ZONE_KEEP_OBJECTS 256  /* bigger messages: the zone is freed after */

static pthread_key_t s_zone_key;
static pthread_once_t s_zone_once = PTHREAD_ONCE_INIT;
static __thread msgpack_zone *s_zone;

static void s_zone_drop(void *z) { msgpack_zone_free(z); }

static void s_zone_key_init(void) {
    if (pthread_key_create(&s_zone_key, s_zone_drop) != 0)
        s_zone_key = (pthread_key_t)-1;  /* no key: no per-thread zone */
}

/* This thread's zone (made on first use), or NULL when out of memory. */
static msgpack_zone *s_zone_get(int *cached) {
    pthread_once(&s_zone_once, s_zone_key_init);
    *cached = s_zone_key != (pthread_key_t)-1;
    if (s_zone || !*cached)
        return s_zone ? s_zone : msgpack_zone_new(ZONE_CHUNK);
    if (!(s_zone = msgpack_zone_new(ZONE_CHUNK)))
        return NULL;
    if (pthread_setspecific(s_zone_key, s_zone) != 0) {
        msgpack_zone_free(s_zone);
        s_zone = NULL;
        *cached = 0;
        return msgpack_zone_new(ZONE_CHUNK);
    }
    return s_zone;
}

/* Done with the zone: cleared for the next message, or freed when it is
 * not this thread's or grew past a datapoint's size (memory stays one
 * chunk per thread). */
static void s_zone_put(msgpack_zone *z, int cached, uint32_t nobj) {
    if (!z)
        return;
    if (cached && z == s_zone && nobj <= ZONE_KEEP_OBJECTS) {
        msgpack_zone_clear(z);
        return;
    }
    if (z == s_zone) {
        pthread_setspecific(s_zone_key, NULL);
        s_zone = NULL;
    }
    msgpack_zone_free(z);
}

/* ---- the fast path -------------------------------------------------------- */

/* What send_dataflow_zmq and LMDBSerializer write, read straight from the
 * bytes: a list of msgpack-numpy arrays, numbers, bytes and str. Measured
 * (docs/performance.md, issue 26): the header walk above plus msgpack-c's
 * unpack cost ~3,500 instructions per Fashion-MNIST batch, more than all
 * the rest of a decode; this path reads the same message in one bounded
 * walk. It takes only well-formed messages of exactly those shapes and
 * anything else (another type, an unknown map key, a bad dtype, a size
 * that does not match) goes to the msgpack-c path, whose answer (the
 * components, or the error) is then the only one: so both paths agree by
 * construction, and fuzz_msgpack checks that whatever the fast path takes,
 * msgpack-c takes alike. */

typedef struct {
    const uint8_t *p;
    size_t n, off;
} s_rd_t;

static inline int s_rd_bytes(s_rd_t *r, size_t k, const uint8_t **out) {
    if (r->n - r->off < k)
        return 0;
    *out = r->p + r->off;
    r->off += k;
    return 1;
}

static inline int s_rd_be(s_rd_t *r, int k, uint64_t *v) {
    const uint8_t *q;
    if (!s_rd_bytes(r, (size_t)k, &q))
        return 0;
    *v = s_be(q, k);
    return 1;
}

/* str or bin at the reader: its bytes. */
static int s_rd_raw(s_rd_t *r, uint8_t b, const uint8_t **q, size_t *len) {
    uint64_t l;
    if (b >= 0xa0 && b <= 0xbf)
        l = b & 0x1f;
    else if (b == 0xc4 || b == 0xd9)
        return s_rd_be(r, 1, &l) && (*len = (size_t)l, s_rd_bytes(r, *len, q));
    else if (b == 0xc5 || b == 0xda)
        return s_rd_be(r, 2, &l) && (*len = (size_t)l, s_rd_bytes(r, *len, q));
    else if (b == 0xc6 || b == 0xdb)
        return s_rd_be(r, 4, &l) && (*len = (size_t)l, s_rd_bytes(r, *len, q));
    else
        return 0;
    *len = (size_t)l;
    return s_rd_bytes(r, *len, q);
}

/* An integer that fits int64 (msgpack-c: positive or negative integer). */
static int s_rd_int(s_rd_t *r, uint8_t b, int64_t *v) {
    uint64_t u;
    if (b <= 0x7f) {
        *v = b;
        return 1;
    }
    if (b >= 0xe0) {
        *v = (int8_t)b;
        return 1;
    }
    switch (b) {
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        if (!s_rd_be(r, 1 << (b - 0xcc), &u) || u > INT64_MAX)
            return 0;
        *v = (int64_t)u;
        return 1;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int k = 1 << (b - 0xd0);
        if (!s_rd_be(r, k, &u))
            return 0;
        if (k < 8 && (u >> (8 * k - 1)) & 1)  /* sign-extend */
            u |= ~0ull << (8 * k);
        *v = (int64_t)u;
        return 1;
    }
    default:
        return 0;
    }
}

/* A count of a fixarray/array16/array32 (or fixmap/map16/map32 when map). */
static int s_rd_count(s_rd_t *r, uint8_t b, int map, uint64_t *count) {
    if (b >= (map ? 0x80 : 0x90) && b <= (map ? 0x8f : 0x9f)) {
        *count = b & 0x0f;
        return 1;
    }
    if (b == (map ? 0xde : 0xdc))
        return s_rd_be(r, 2, count);
    if (b == (map ? 0xdf : 0xdd))
        return s_rd_be(r, 4, count);
    return 0;
}

static inline int s_key_is(const uint8_t *k, size_t kl, const char *s, size_t sl) {
    return kl == sl && !memcmp(k, s, sl);
}

/* msgpack-numpy's map of an array or scalar, the map's header read. */
static int s_fast_ndarray(s_rd_t *r, uint64_t pairs, df_tpk_comps_t *cs, int i) {
    int nd = -1, ndim = 0, have_shape = 0;
    const uint8_t *tp = NULL, *dp = NULL, *kp;
    size_t tl = 0, dl = 0, kl;
    int64_t sh[TP_MAX_DIMS];
    for (uint64_t k = 0; k < pairs; k++) {
        const uint8_t *key, *b;
        size_t keyl;
        if (!s_rd_bytes(r, 1, &b) || !s_rd_raw(r, *b, &key, &keyl) ||
            !s_rd_bytes(r, 1, &b))
            return 0;
        if (s_key_is(key, keyl, "nd", 2)) {
            if (*b != 0xc2 && *b != 0xc3)
                return 0;
            nd = *b == 0xc3;
        } else if (s_key_is(key, keyl, "type", 4)) {
            if (!s_rd_raw(r, *b, &tp, &tl))
                return 0;
        } else if (s_key_is(key, keyl, "kind", 4)) {
            if (!s_rd_raw(r, *b, &kp, &kl) || kl != 0)
                return 0;
        } else if (s_key_is(key, keyl, "data", 4)) {
            if (!s_rd_raw(r, *b, &dp, &dl))
                return 0;
        } else if (s_key_is(key, keyl, "shape", 5)) {
            uint64_t dims;
            if (!s_rd_count(r, *b, 0, &dims) || dims > TP_MAX_DIMS)
                return 0;
            for (uint64_t d = 0; d < dims; d++) {
                const uint8_t *db;
                /* unsigned ones only (a signed type goes the long way) */
                if (!s_rd_bytes(r, 1, &db) || *db >= 0xd0 || !s_rd_int(r, *db, &sh[d]))
                    return 0;
            }
            ndim = (int)dims;
            have_shape = 1;
        } else {
            return 0;
        }
    }
    tp_dtype_t dt;
    char why[200];
    if (nd < 0 || !tp || !dp || (nd && !have_shape) ||
        !df_tpk_np_typestr((const char *)tp, tl, &dt, why, sizeof why))
        return 0;
    if (!nd)
        ndim = 0;
    return df_tpk_comp_array(cs, dt, ndim, sh, dp, dl, "msgpack: component", i) == TP_OK;
}

/* 1: the message decoded into cs; 0: not taken, cs as it was. */
static int s_fast(const uint8_t *p, size_t n, df_tpk_comps_t *cs) {
    s_rd_t r = {p, n, 0};
    const int n0 = cs->n;
    const uint8_t *b;
    uint64_t items;
    if (!s_rd_bytes(&r, 1, &b) || !s_rd_count(&r, *b, 0, &items) || items > n)
        return 0;
    int ok = 1;
    for (uint64_t i = 0; ok && i < items; i++) {
        const uint8_t *q;
        size_t l;
        int64_t v;
        uint64_t u;
        if (!s_rd_bytes(&r, 1, &b)) {
            ok = 0;
        } else if (*b <= 0x7f || *b >= 0xe0 || (*b >= 0xcc && *b <= 0xd3)) {
            ok = s_rd_int(&r, *b, &v) && df_tpk_comp_int(cs, v);
        } else if (*b == 0xc2 || *b == 0xc3) {
            ok = df_tpk_comp_bool(cs, *b == 0xc3) != NULL;
        } else if (*b == 0xca) {
            float f;
            uint32_t w;
            ok = s_rd_be(&r, 4, &u);
            w = (uint32_t)u;
            memcpy(&f, &w, 4);
            ok = ok && df_tpk_comp_float(cs, (double)f);
        } else if (*b == 0xcb) {
            double d;
            ok = s_rd_be(&r, 8, &u);
            memcpy(&d, &u, 8);
            ok = ok && df_tpk_comp_float(cs, d);
        } else if ((*b >= 0x80 && *b <= 0x8f) || *b == 0xde) {
            ok = s_rd_count(&r, *b, 1, &u) && s_fast_ndarray(&r, u, cs, (int)i);
        } else {
            ok = s_rd_raw(&r, *b, &q, &l) && df_tpk_comp_bytes(cs, q, l);
        }
    }
    if (ok && r.off == n)
        return 1;
    for (int i = n0; i < cs->n; i++)  /* not taken: as it was */
        free(cs->c[i].owned);
    cs->n = n0;
    tp_clear_error();
    return 0;
}

tp_status_t df_tpk_msgpack(const uint8_t *p, size_t n, df_tpk_comps_t *cs) {
    return s_fast(p, n, cs) ? TP_OK : df_tpk_msgpack_generic(p, n, cs);
}

tp_status_t df_tpk_msgpack_generic(const uint8_t *p, size_t n, df_tpk_comps_t *cs) {
    uint32_t nobj = 0;
    TP_TRY(s_precheck(p, n, &nobj));
    int cached = 0;
    msgpack_zone *z = s_zone_get(&cached);
    if (!z)
        return tp_error(TP_ERR_NOMEM, "msgpack: out of memory");
    msgpack_object o = {.type = MSGPACK_OBJECT_NIL};
    size_t off = 0;
    /* msgpack_unpack: msgpack-c's call that unpacks into a given zone */
    msgpack_unpack_return r = msgpack_unpack((const char *)p, n, &off, z, &o);
    tp_status_t rc = TP_OK;
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        rc = tp_error(TP_ERR_NOMEM, "msgpack: out of memory");
    else if (r != MSGPACK_UNPACK_SUCCESS || off != n)
        rc = tp_error(TP_ERR_PROTOCOL, "msgpack: msgpack-c could not unpack it "
                      "(status %d)", (int)r);
    else if (o.type != MSGPACK_OBJECT_ARRAY)
        rc = tp_error(TP_ERR_PROTOCOL, "msgpack: the datapoint is not a list");
    for (uint32_t i = 0; rc == TP_OK && i < o.via.array.size; i++)
        rc = s_item(&o.via.array.ptr[i], (int)i, cs);
    s_zone_put(z, cached, nobj);
    return rc;
}

tp_status_t df_tpk_msgpack_keys(const uint8_t *p, size_t n, char **keys, size_t **offs,
                                size_t **lens, size_t *count) {
    *keys = NULL;
    *offs = *lens = NULL;
    *count = 0;
    msgpack_unpacked u;
    tp_status_t rc = s_unpack(p, n, &u);
    if (rc != TP_OK) {
        msgpack_unpacked_destroy(&u);
        return tp_error_wrap(TP_ERR_FORMAT, "keys");
    }
    size_t total = 0, k = 0;
    if (u.data.type != MSGPACK_OBJECT_ARRAY)
        rc = tp_error(TP_ERR_FORMAT, "msgpack: the keys are not a list");
    else
        k = u.data.via.array.size;
    const uint8_t *kp = NULL;
    size_t kl = 0;
    for (size_t i = 0; rc == TP_OK && i < k; i++) {
        if (!s_raw(&u.data.via.array.ptr[i], &kp, &kl))
            rc = tp_error(TP_ERR_FORMAT, "msgpack: key %zu is not bytes or str", i);
        else
            total += kl;
    }
    if (rc == TP_OK) {
        *keys = malloc(total ? total : 1);
        *offs = malloc((k ? k : 1) * sizeof **offs);
        *lens = malloc((k ? k : 1) * sizeof **lens);
        if (!*keys || !*offs || !*lens) {
            rc = tp_error(TP_ERR_NOMEM, "msgpack: keys");
        } else {
            size_t o = 0;
            for (size_t i = 0; i < k; i++) {
                s_raw(&u.data.via.array.ptr[i], &kp, &kl);
                if (kl)
                    memcpy(*keys + o, kp, kl);
                (*offs)[i] = o;
                (*lens)[i] = kl;
                o += kl;
            }
            *count = k;
        }
    }
    if (rc != TP_OK) {
        free(*keys);
        free(*offs);
        free(*lens);
        *keys = NULL;
        *offs = *lens = NULL;
    }
    msgpack_unpacked_destroy(&u);
    return rc;
}

/* ---- the way back: msgpack-numpy maps through msgpack-c's packer ------------ */

static const char *s_np_type(tp_dtype_t dt) {
    switch (dt) {
    case TP_UINT8: return "|u1";
    case TP_INT32: return "<i4";
    case TP_INT64: return "<i8";
    case TP_FLOAT16: return "<f2";
    case TP_FLOAT32: return "<f4";
    case TP_FLOAT64: return "<f8";
    default: return NULL;
    }
}

static void s_pack_key(msgpack_packer *pk, const char *k) {
    msgpack_pack_bin(pk, strlen(k));
    msgpack_pack_bin_body(pk, k, strlen(k));
}

tp_status_t df_tpk_encode_msgpack(const tp_datapoint_t *dp, void **data, size_t *size) {
    int n = tp_datapoint_size(dp);
    for (int i = 0; i < n; i++)
        if (!s_np_type(tp_datapoint_cget(dp, i)->dtype))
            return tp_error(TP_ERR_INVALID, "msgpack: component %d is %s, which numpy "
                            "has no dtype for", i,
                            tp_dtype_name(tp_datapoint_cget(dp, i)->dtype));
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int bad = msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n && !bad; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        const char *ty = s_np_type(t->dtype);
        bad |= msgpack_pack_map(&pk, 5);
        s_pack_key(&pk, "nd");
        bad |= msgpack_pack_true(&pk);
        s_pack_key(&pk, "type");
        bad |= msgpack_pack_str(&pk, strlen(ty));
        bad |= msgpack_pack_str_body(&pk, ty, strlen(ty));
        s_pack_key(&pk, "kind");
        bad |= msgpack_pack_bin(&pk, 0);
        s_pack_key(&pk, "shape");
        int empty = t->ndim == 0 && t->nbytes == 0;  /* as shape [0] */
        bad |= msgpack_pack_array(&pk, (size_t)(t->ndim + empty));
        for (int k = 0; k < t->ndim; k++)
            bad |= msgpack_pack_int64(&pk, t->shape[k]);
        if (empty)
            bad |= msgpack_pack_int64(&pk, 0);
        s_pack_key(&pk, "data");
        bad |= msgpack_pack_bin(&pk, t->nbytes);
        bad |= msgpack_pack_bin_body(&pk, t->data, t->nbytes);
    }
    if (bad || !sb.data) {
        msgpack_sbuffer_destroy(&sb);
        return tp_error(TP_ERR_NOMEM, "msgpack: encode");
    }
    *data = sb.data;  /* the sbuffer's malloc'd block: the caller frees it */
    *size = sb.size;
    return TP_OK;
}

tp_status_t df_tpk_encode_keys_msgpack(const char *const *keys, int64_t n, void **data,
                                       size_t *size) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int bad = msgpack_pack_array(&pk, (size_t)n);
    for (int64_t i = 0; i < n && !bad; i++) {
        size_t l = strlen(keys[i]);
        bad |= msgpack_pack_bin(&pk, l);
        bad |= msgpack_pack_bin_body(&pk, keys[i], l);
    }
    if (bad || !sb.data) {
        msgpack_sbuffer_destroy(&sb);
        return tp_error(TP_ERR_NOMEM, "msgpack: encode keys");
    }
    *data = sb.data;
    *size = sb.size;
    return TP_OK;
}
