/* towerpack dataflow: datapoints written as tensorpack's dumps writes them,
 * for Python consumers (tp-worker --format tensorpack, RemoteDataZMQ,
 * LMDBSerializer.load).
 *
 * The pickle is what Python itself writes for a list of C-contiguous numpy
 * arrays at protocol 5 (numpy >= 1.16): per array
 * numpy.core.numeric._frombuffer(bytearray, dtype, shape, 'C'), the dtype
 * as numpy.dtype(code, False, True) with its BUILD state. numpy 2.x still
 * answers to the numpy.core names. */
#include <stdlib.h>
#include <string.h>
#include "df_tp.h"

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int bad;
} s_buf_t;

static void s_put(s_buf_t *b, const void *d, size_t k) {
    if (b->bad || k == 0)  /* (an empty tensor's data is NULL) */
        return;
    if (b->cap - b->n < k) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < k)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->bad = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, k);
    b->n += k;
}

static void s_op(s_buf_t *b, uint8_t op) { s_put(b, &op, 1); }

static void s_le(s_buf_t *b, uint64_t v, int k) {
    uint8_t t[8];
    for (int i = 0; i < k; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    s_put(b, t, (size_t)k);
}

static void s_str(s_buf_t *b, const char *s) {  /* SHORT_BINUNICODE */
    s_op(b, 0x8c);
    s_op(b, (uint8_t)strlen(s));
    s_put(b, s, strlen(s));
}

static void s_int(s_buf_t *b, int64_t v) {
    if (v >= 0 && v < 256) {
        s_op(b, 'K');
        s_op(b, (uint8_t)v);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        s_op(b, 'J');
        s_le(b, (uint64_t)(uint32_t)(int32_t)v, 4);
    } else {  /* LONG1 of 8 bytes, two's complement */
        s_op(b, 0x8a);
        s_op(b, 8);
        s_le(b, (uint64_t)v, 8);
    }
}

static const char *s_code(tp_dtype_t dt, char *order) {
    *order = '<';
    switch (dt) {
    case TP_UINT8: *order = '|'; return "u1";
    case TP_INT32: return "i4";
    case TP_INT64: return "i8";
    case TP_FLOAT16: return "f2";
    case TP_FLOAT32: return "f4";
    case TP_FLOAT64: return "f8";
    default: return NULL;
    }
}

static tp_status_t s_pickle(const tp_datapoint_t *dp, s_buf_t *b) {
    int n = tp_datapoint_size(dp);
    s_op(b, 0x80);
    s_op(b, 5);
    s_op(b, ']');
    if (n)
        s_op(b, '(');
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        char order;
        const char *code = s_code(t->dtype, &order);
        if (!code)
            return tp_error(TP_ERR_INVALID, "pickle: component %d is %s, which numpy "
                            "has no dtype for", i, tp_dtype_name(t->dtype));
        s_str(b, "numpy.core.numeric");
        s_str(b, "_frombuffer");
        s_op(b, 0x93);                /* STACK_GLOBAL */
        s_op(b, '(');
        s_op(b, 0x96);                /* BYTEARRAY8: a writable array */
        s_le(b, t->nbytes, 8);
        s_put(b, t->data, t->nbytes);
        s_str(b, "numpy");
        s_str(b, "dtype");
        s_op(b, 0x93);
        s_str(b, code);
        s_op(b, 0x89);                /* False */
        s_op(b, 0x88);                /* True */
        s_op(b, 0x87);                /* TUPLE3 */
        s_op(b, 'R');
        s_op(b, '(');                 /* the dtype's state */
        s_int(b, 3);
        char o[2] = {order, 0};
        s_str(b, o);
        s_op(b, 'N');
        s_op(b, 'N');
        s_op(b, 'N');
        s_int(b, -1);
        s_int(b, -1);
        s_int(b, 0);
        s_op(b, 't');
        s_op(b, 'b');                 /* BUILD */
        s_op(b, '(');
        for (int k = 0; k < t->ndim; k++)
            s_int(b, t->shape[k]);
        if (t->ndim == 0 && t->nbytes == 0)
            s_int(b, 0);              /* an empty tensor travels as shape (0,) */
        s_op(b, 't');                 /* the shape */
        s_str(b, "C");
        s_op(b, 't');                 /* the arguments */
        s_op(b, 'R');
    }
    if (n)
        s_op(b, 'e');                 /* APPENDS */
    s_op(b, '.');
    return TP_OK;
}

static void s_zmq_ops(const tp_datapoint_t *dp, s_buf_t *b) {
    int n = tp_datapoint_size(dp);
    s_le(b, (uint64_t)n, 4);
    for (int i = 0; i < n; i++) {
        const tp_tensor_t *t = tp_datapoint_cget(dp, i);
        static const int32_t tf[] = {[TP_UINT8] = 4, [TP_INT32] = 3, [TP_INT64] = 9,
                                     [TP_FLOAT16] = 19, [TP_BFLOAT16] = 14,
                                     [TP_FLOAT32] = 1, [TP_FLOAT64] = 2};
        s_le(b, (uint64_t)(uint32_t)tf[t->dtype], 4);
        int empty = t->ndim == 0 && t->nbytes == 0;  /* as shape [0] */
        s_le(b, (uint64_t)(t->ndim + empty), 4);
        for (int k = 0; k < t->ndim; k++)
            s_le(b, (uint64_t)(uint32_t)(int32_t)t->shape[k], 4);
        if (empty)
            s_le(b, 0, 4);
        s_le(b, t->nbytes, 8);
        s_put(b, t->data, t->nbytes);
    }
}

tp_status_t tp_tpk_encode(const tp_datapoint_t *dp, tp_tpk_format_t fmt, void **data,
                          size_t *size) {
    *data = NULL;
    *size = 0;
    if (!dp)
        return tp_error(TP_ERR_INVALID, "tensorpack encode: no datapoint");
    if (fmt == TP_TPK_MSGPACK)
        return df_tpk_encode_msgpack(dp, data, size);
    s_buf_t b = {0};
    if (fmt == TP_TPK_PICKLE) {
        tp_status_t rc = s_pickle(dp, &b);
        if (rc != TP_OK) {
            free(b.p);
            return rc;
        }
    } else if (fmt == TP_TPK_ZMQ_OPS) {
        for (int i = 0; i < tp_datapoint_size(dp); i++)
            for (int k = 0; k < tp_datapoint_cget(dp, i)->ndim; k++)
                if (tp_datapoint_cget(dp, i)->shape[k] > INT32_MAX)
                    return tp_error(TP_ERR_INVALID, "zmq_ops: component %d: a "
                                    "dimension past int32", i);
        s_zmq_ops(dp, &b);
    } else {
        return tp_error(TP_ERR_INVALID, "tensorpack encode: format %s is not one to "
                        "write", tp_tpk_format_name(fmt));
    }
    if (b.bad) {
        free(b.p);
        return tp_error(TP_ERR_NOMEM, "tensorpack encode");
    }
    *data = b.p;
    *size = b.n;
    return TP_OK;
}


tp_status_t df_tpk_encode_keys(tp_tpk_format_t fmt, const char *const *keys, int64_t n,
                               void **data, size_t *size) {
    if (fmt == TP_TPK_MSGPACK)
        return df_tpk_encode_keys_msgpack(keys, n, data, size);
    s_buf_t b = {0};
    s_op(&b, 0x80);
    s_op(&b, 5);
    s_op(&b, ']');
    if (n)
        s_op(&b, '(');
    for (int64_t i = 0; i < n; i++) {
        size_t l = strlen(keys[i]);
        if (l < 256) {
            s_op(&b, 'C');           /* SHORT_BINBYTES */
            s_op(&b, (uint8_t)l);
        } else {
            s_op(&b, 'B');
            s_le(&b, l, 4);
        }
        s_put(&b, keys[i], l);
    }
    if (n)
        s_op(&b, 'e');
    s_op(&b, '.');
    if (b.bad) {
        free(b.p);
        return tp_error(TP_ERR_NOMEM, "pickle: keys");
    }
    *data = b.p;
    *size = b.n;
    return TP_OK;
}
