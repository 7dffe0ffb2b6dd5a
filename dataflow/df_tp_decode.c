/* towerpack dataflow: tensorpack's messages, told apart by their first
 * bytes and turned into datapoints; zmq_ops' dump_arrays layout.
 *
 * The dispatcher of the decoders: the decoders (df_tp_pickle.c,
 * df_tp_msgpack.c, zmq_ops here) produce components (df_tp_comps.c) that
 * point into the message; s_build makes the tensors, keeping the message
 * as their memory where the bytes are large enough and aligned for the
 * dtype (one reference per component on a shared keeper) and copying
 * otherwise. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/wire.h>
#include "df_tp.h"

/* Arrays below this are copied: cheaper than sharing the message. */
#define ZEROCOPY_MIN 512

const char *tp_tpk_format_name(tp_tpk_format_t fmt) {
    switch (fmt) {
    case TP_TPK_TOWERPACK: return "towerpack";
    case TP_TPK_PICKLE: return "pickle";
    case TP_TPK_MSGPACK: return "msgpack";
    case TP_TPK_ZMQ_OPS: return "zmq_ops";
    default: return "unknown";
    }
}

void tp_tpk_opts_init(tp_tpk_opts_t *opts) {
    opts->max_bytes = (size_t)1 << 30;
    opts->int32_labels = 0;
}

/* ---- zmq_ops' dump_arrays -------------------------------------------------- */

static int32_t s_i32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return (int32_t)v;  /* the layout is the host's: x86 and ARM are little-endian */
}

static int64_t s_i64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)v;
}

/* TensorFlow's DataType numbers (types.proto) that dump_arrays writes. */
static int s_tf_dtype(int32_t code, tp_dtype_t *out, const char **name) {
    static const struct { int32_t code; int ok; tp_dtype_t dt; const char *name; } m[] = {
        {1, 1, TP_FLOAT32, "float"},   {2, 1, TP_FLOAT64, "double"},
        {3, 1, TP_INT32, "int32"},     {4, 1, TP_UINT8, "uint8"},
        {5, 0, 0, "int16"},            {6, 0, 0, "int8"},
        {7, 0, 0, "string"},           {8, 0, 0, "complex64"},
        {9, 1, TP_INT64, "int64"},     {10, 1, TP_UINT8, "bool"},
        {14, 1, TP_BFLOAT16, "bfloat16"}, {17, 0, 0, "uint16"},
        {18, 0, 0, "complex128"},      {19, 1, TP_FLOAT16, "half"},
        {22, 0, 0, "uint32"},          {23, 0, 0, "uint64"},
    };
    for (size_t i = 0; i < sizeof m / sizeof *m; i++)
        if (m[i].code == code) {
            *name = m[i].name;
            *out = m[i].dt;
            return m[i].ok;
        }
    *name = NULL;
    return 0;
}

/* Walk the headers only: 1 when they describe exactly n bytes. */
static int s_zmq_ops_shape_ok(const uint8_t *p, size_t n) {
    if (n < 4)
        return 0;
    int32_t count = s_i32(p);
    if (count < 0 || count > TP_DP_MAX_COMPONENTS)
        return 0;
    size_t off = 4;
    for (int32_t i = 0; i < count; i++) {
        if (n - off < 8)
            return 0;
        int32_t ndim = s_i32(p + off + 4);
        if (ndim < 0 || ndim > TP_MAX_DIMS)
            return 0;
        off += 8;
        if (n - off < (size_t)ndim * 4 + 8)
            return 0;
        off += (size_t)ndim * 4;
        int64_t len = s_i64(p + off);
        off += 8;
        if (len < 0 || (uint64_t)len > n - off)
            return 0;
        off += (size_t)len;
    }
    return off == n;
}

tp_status_t df_tpk_zmq_ops(const uint8_t *p, size_t n, df_tpk_comps_t *cs) {
    if (n < 4)
        return tp_error(TP_ERR_PROTOCOL, "zmq_ops: %zu bytes, shorter than the count", n);
    int32_t count = s_i32(p);
    if (count < 0 || count > TP_DP_MAX_COMPONENTS)
        return tp_error(TP_ERR_PROTOCOL, "zmq_ops: %d arrays (0..%d taken)", count,
                        TP_DP_MAX_COMPONENTS);
    size_t off = 4;
    for (int32_t i = 0; i < count; i++) {
        if (n - off < 8)
            return tp_error(TP_ERR_PROTOCOL, "zmq_ops: array %d: header truncated at "
                            "byte %zu of %zu", i, off, n);
        int32_t code = s_i32(p + off), ndim = s_i32(p + off + 4);
        off += 8;
        tp_dtype_t dt;
        const char *name;
        if (!s_tf_dtype(code, &dt, &name))
            return tp_error(TP_ERR_PROTOCOL, "zmq_ops: array %d: TensorFlow dtype %d%s%s%s "
                            "has no towerpack dtype", i, code, name ? " (" : "",
                            name ? name : "", name ? ")" : "");
        if (ndim < 0 || ndim > TP_MAX_DIMS)
            return tp_error(TP_ERR_PROTOCOL, "zmq_ops: array %d: %d dimensions (0..%d)",
                            i, ndim, TP_MAX_DIMS);
        if (n - off < (size_t)ndim * 4 + 8)
            return tp_error(TP_ERR_PROTOCOL, "zmq_ops: array %d: shape truncated at "
                            "byte %zu of %zu", i, off, n);
        int64_t shape[TP_MAX_DIMS];
        for (int k = 0; k < ndim; k++) {
            shape[k] = s_i32(p + off);
            off += 4;
            if (shape[k] < 0)
                return tp_error(TP_ERR_PROTOCOL, "zmq_ops: array %d: dimension %d is %lld",
                                i, k, (long long)shape[k]);
        }
        int64_t len = s_i64(p + off);
        off += 8;
        if (len < 0 || (uint64_t)len > n - off)
            return tp_error(TP_ERR_PROTOCOL, "zmq_ops: array %d: says %lld bytes, "
                            "%zu are left", i, (long long)len, n - off);
        TP_TRY(df_tpk_comp_array(cs, dt, ndim, shape, p + off, (size_t)len,
                                 "zmq_ops: array", i));
        off += (size_t)len;
    }
    if (off != n)
        return tp_error(TP_ERR_PROTOCOL, "zmq_ops: %zu bytes after the last array",
                        n - off);
    return TP_OK;
}

/* ---- telling the formats apart ---------------------------------------------- */

tp_tpk_format_t tp_tpk_sniff(const void *data, size_t size) {
    const uint8_t *p = data;
    if (size == 0 || !p)
        return TP_TPK_UNKNOWN;
    /* First: a zmq_ops message whose headers add up exactly (its count is
     * little and so may begin like one of the others, e.g. 0x90 arrays). */
    if (s_zmq_ops_shape_ok(p, size))
        return TP_TPK_ZMQ_OPS;
    if (size >= 4) {
        uint32_t magic;
        memcpy(&magic, p, 4);
        if (magic == TP_WIRE_MAGIC)
            return TP_TPK_TOWERPACK;
    }
    if (size >= 2 && p[0] == 0x80 && p[1] >= 2 && p[1] <= 5)
        return TP_TPK_PICKLE;
    if ((p[0] >= 0x90 && p[0] <= 0x9f) || p[0] == 0xdc || p[0] == 0xdd)
        return TP_TPK_MSGPACK;
    /* a small count: a zmq_ops message that is wrong somewhere (the
     * decoder says where) */
    if (size >= 4 && s_i32(p) >= 0 && s_i32(p) <= TP_DP_MAX_COMPONENTS)
        return TP_TPK_ZMQ_OPS;
    return TP_TPK_UNKNOWN;
}

/* ---- components to a datapoint ----------------------------------------------- */

typedef struct {
    atomic_int refs;
    tp_free_fn release;
    void *data, *hint;
} s_keeper_t;

static void s_keeper_drop(void *data, void *hint) {
    (void)data;
    s_keeper_t *k = hint;
    if (atomic_fetch_sub_explicit(&k->refs, 1, memory_order_acq_rel) == 1) {
        k->release(k->data, k->hint);
        free(k);
    }
}

static void s_free_copy(void *data, void *hint) {
    (void)hint;
    free(data);
}

static tp_status_t s_narrow(tp_tensor_t *t, const int64_t *src, size_t numel,
                            int comp) {
    int32_t *d = t->data;
    for (size_t i = 0; i < numel; i++) {
        int64_t v;
        memcpy(&v, src + i, 8);
        if (v < INT32_MIN || v > INT32_MAX)
            return tp_error(TP_ERR_PROTOCOL, "component %d: int64 value %lld at "
                            "element %zu does not fit int32", comp, (long long)v, i);
        d[i] = (int32_t)v;
    }
    return TP_OK;
}

static tp_status_t s_build(df_tpk_comps_t *cs, const tp_tpk_opts_t *o,
                           s_keeper_t *keep, tp_datapoint_t **out) {
    tp_datapoint_t *dp = tp_datapoint_new(cs->n);
    if (!dp)
        return tp_error(TP_ERR_NOMEM, "tensorpack: datapoint");
    tp_status_t rc = TP_OK;
    for (int i = 0; i < cs->n && rc == TP_OK; i++) {
        df_tpk_comp_t *c = &cs->c[i];
        tp_tensor_t *t = tp_datapoint_get(dp, i);
        const uint8_t *src = c->owned ? c->owned : c->data ? c->data : c->inl;
        if (c->dtype == TP_INT64 && o->int32_labels) {
            if ((rc = tp_tensor_init(t, TP_INT32, c->ndim, c->shape)) == TP_OK)
                rc = s_narrow(t, (const int64_t *)(const void *)src, c->nbytes / 8, i);
            continue;
        }
        if (keep && c->data && c->nbytes >= ZEROCOPY_MIN &&
            (uintptr_t)c->data % tp_dtype_size(c->dtype) == 0) {
            rc = tp_tensor_init_wrap(t, c->dtype, c->ndim, c->shape, (void *)c->data,
                                     s_keeper_drop, keep);
            if (rc == TP_OK)
                atomic_fetch_add_explicit(&keep->refs, 1, memory_order_relaxed);
            continue;
        }
        /* a copy in malloc's memory (aligned for every dtype), not
         * tp_alloc's: its aligned_alloc costs a few hundred instructions
         * more per message, and tensors wrapping the message are only
         * dtype-aligned anyway */
        void *copy = malloc(c->nbytes ? c->nbytes : 1);
        if (!copy) {
            rc = tp_error(TP_ERR_NOMEM, "tensorpack: component %d", i);
            continue;
        }
        if (c->nbytes)
            memcpy(copy, src, c->nbytes);
        if ((rc = tp_tensor_init_wrap(t, c->dtype, c->ndim, c->shape, copy, s_free_copy,
                                      NULL)) != TP_OK)
            free(copy);
    }
    if (rc != TP_OK)
        tp_datapoint_destroy(&dp);
    *out = dp;
    return rc;
}

tp_status_t tp_tpk_decode(const void *data, size_t size, const tp_tpk_opts_t *opts,
                          tp_free_fn release, void *hint, tp_datapoint_t **out) {
    tp_tpk_opts_t o;
    if (opts)
        o = *opts;
    else
        tp_tpk_opts_init(&o);
    *out = NULL;
    s_keeper_t *keep = NULL;
    if (release) {
        if (!(keep = malloc(sizeof *keep))) {
            release((void *)data, hint);
            return tp_error(TP_ERR_NOMEM, "tensorpack: decode");
        }
        atomic_init(&keep->refs, 1);  /* this call's own reference */
        keep->release = release;
        keep->data = (void *)data;
        keep->hint = hint;
    }
    df_tpk_comp_t inl[8];  /* a datapoint's usual few components: no malloc */
    df_tpk_comps_t cs = {.c = inl, .cap = 8, .inl = 1};
    tp_status_t rc;
    tp_tpk_format_t fmt = tp_tpk_sniff(data, size);
    if (o.max_bytes && size > o.max_bytes) {
        rc = tp_error(TP_ERR_PROTOCOL, "tensorpack: message of %zu bytes, the limit "
                      "is %zu", size, o.max_bytes);
    } else {
        switch (fmt) {
        case TP_TPK_PICKLE: rc = df_tpk_pickle(data, size, &cs); break;
        case TP_TPK_MSGPACK: rc = df_tpk_msgpack(data, size, &cs); break;
        case TP_TPK_ZMQ_OPS: rc = df_tpk_zmq_ops(data, size, &cs); break;
        case TP_TPK_TOWERPACK:
            rc = tp_error(TP_ERR_PROTOCOL, "a towerpack wire header alone: its "
                          "component frames are missing");
            break;
        default: {
            const uint8_t *b = data;
            rc = tp_error(TP_ERR_PROTOCOL, "%zu bytes in no format known (first bytes "
                          "%02x %02x: not a pickle, msgpack, zmq_ops or towerpack "
                          "message)", size, size > 0 ? b[0] : 0, size > 1 ? b[1] : 0);
        }
        }
    }
    if (rc == TP_OK && cs.n == 0)  /* 4 zero bytes are zmq_ops' empty list */
        rc = tp_error(TP_ERR_PROTOCOL, "the datapoint has no components");
    if (rc == TP_OK)
        rc = s_build(&cs, &o, keep, out);
    else if (fmt != TP_TPK_UNKNOWN)
        rc = tp_error_wrap(rc, "%s message of %zu bytes", tp_tpk_format_name(fmt), size);
    df_tpk_comps_fini(&cs);
    if (keep)
        s_keeper_drop(NULL, keep);
    return rc;
}

tp_status_t df_tpk_keys(const uint8_t *p, size_t n, char **keys, size_t **offs,
                        size_t **lens, size_t *count) {
    switch (tp_tpk_sniff(p, n)) {
    case TP_TPK_PICKLE: return df_tpk_pickle_keys(p, n, keys, offs, lens, count);
    case TP_TPK_MSGPACK: return df_tpk_msgpack_keys(p, n, keys, offs, lens, count);
    default:
        return tp_error(TP_ERR_FORMAT, "the list of keys is neither a pickle nor "
                        "msgpack");
    }
}
