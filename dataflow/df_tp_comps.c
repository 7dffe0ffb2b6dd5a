/* towerpack dataflow: the components the tensorpack decoders produce, and
 * numpy's dtypes as towerpack's. The bottom layer of the decoders: the
 * pickle and msgpack decoders (df_tp_pickle.c, df_tp_msgpack.c) and zmq_ops
 * (df_tp_decode.c) call these; this file calls none of them, so the
 * decoders depend one way (components <- pickle, msgpack <- dispatcher). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "df_tp.h"

/* ---- components ------------------------------------------------------------ */

df_tpk_comp_t *df_tpk_comps_push(df_tpk_comps_t *cs) {
    if (cs->n == TP_DP_MAX_COMPONENTS) {
        tp_error(TP_ERR_PROTOCOL, "more than %d components", TP_DP_MAX_COMPONENTS);
        return NULL;
    }
    if (cs->n == cs->cap) {
        int cap = cs->cap ? cs->cap * 2 : 8;
        df_tpk_comp_t *c = cs->inl ? malloc((size_t)cap * sizeof *c)
                                   : realloc(cs->c, (size_t)cap * sizeof *c);
        if (!c) {
            tp_error(TP_ERR_NOMEM, "tensorpack: components");
            return NULL;
        }
        if (cs->inl && cs->n)
            memcpy(c, cs->c, (size_t)cs->n * sizeof *c);
        cs->inl = 0;
        cs->c = c;
        cs->cap = cap;
    }
    df_tpk_comp_t *c = &cs->c[cs->n++];
    memset(c, 0, sizeof *c);
    return c;
}

void df_tpk_comps_fini(df_tpk_comps_t *cs) {
    for (int i = 0; i < cs->n; i++)
        free(cs->c[i].owned);
    if (!cs->inl)
        free(cs->c);
    memset(cs, 0, sizeof *cs);
}

static df_tpk_comp_t *s_scalar(df_tpk_comps_t *cs, tp_dtype_t dt, const void *v,
                               size_t size) {
    df_tpk_comp_t *c = df_tpk_comps_push(cs);
    if (!c)
        return NULL;
    c->dtype = dt;
    c->ndim = 0;
    c->nbytes = size;
    memcpy(c->inl, v, size);
    return c;
}

df_tpk_comp_t *df_tpk_comp_int(df_tpk_comps_t *cs, int64_t v) {
    return s_scalar(cs, TP_INT64, &v, 8);
}

df_tpk_comp_t *df_tpk_comp_float(df_tpk_comps_t *cs, double v) {
    return s_scalar(cs, TP_FLOAT64, &v, 8);
}

df_tpk_comp_t *df_tpk_comp_bool(df_tpk_comps_t *cs, int v) {
    uint8_t b = v != 0;
    return s_scalar(cs, TP_UINT8, &b, 1);
}

df_tpk_comp_t *df_tpk_comp_bytes(df_tpk_comps_t *cs, const uint8_t *p, size_t n) {
    df_tpk_comp_t *c = df_tpk_comps_push(cs);
    if (!c)
        return NULL;
    c->dtype = TP_UINT8;
    c->ndim = 1;
    c->shape[0] = (int64_t)n;
    c->data = p;
    c->nbytes = n;
    return c;
}

tp_status_t df_tpk_comp_array(df_tpk_comps_t *cs, tp_dtype_t dt, int ndim,
                              const int64_t *shape, const uint8_t *data,
                              size_t nbytes, const char *who, int idx) {
    if (ndim < 0 || ndim > TP_MAX_DIMS)
        return tp_error(TP_ERR_PROTOCOL, "%s %d: %d dimensions (at most %d)", who, idx,
                        ndim, TP_MAX_DIMS);
    size_t numel;
    if (tp_shape_numel(ndim, shape, tp_dtype_size(dt), &numel) != TP_OK)
        return tp_error(TP_ERR_PROTOCOL, "%s %d: shape is negative or too large", who,
                        idx);
    if (numel * tp_dtype_size(dt) != nbytes)
        return tp_error(TP_ERR_PROTOCOL, "%s %d: %s of %zu elements needs %zu bytes, "
                        "the data has %zu", who, idx, tp_dtype_name(dt), numel,
                        numel * tp_dtype_size(dt), nbytes);
    df_tpk_comp_t *c = df_tpk_comps_push(cs);
    if (!c)
        return TP_ERR_PROTOCOL;
    c->dtype = dt;
    c->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        c->shape[i] = shape[i];
    c->data = data;
    c->nbytes = nbytes;
    return TP_OK;
}

/* ---- numpy dtypes ------------------------------------------------------------ */

int df_tpk_np_dtype(char kind, int itemsize, char order, tp_dtype_t *out,
                    char *why, size_t whylen) {
    int ok = 1;
    switch (kind) {
    case 'u': ok = itemsize == 1; *out = TP_UINT8; break;
    case 'b': ok = itemsize == 1; *out = TP_UINT8; break;  /* bool: 0/1 bytes */
    case 'i':
        ok = itemsize == 4 || itemsize == 8;
        *out = itemsize == 4 ? TP_INT32 : TP_INT64;
        break;
    case 'f':
        ok = itemsize == 2 || itemsize == 4 || itemsize == 8;
        *out = itemsize == 2 ? TP_FLOAT16 : itemsize == 4 ? TP_FLOAT32 : TP_FLOAT64;
        break;
    default: ok = 0;
    }
    if (!ok) {
        const char *what = kind == 'O' ? " (object arrays hold Python objects, not numbers)"
                         : kind == 'U' || kind == 'S' ? " (string arrays)"
                         : kind == 'V' ? " (structured arrays)"
                         : kind == 'c' ? " (complex numbers)" : "";
        snprintf(why, whylen, "numpy dtype '%c%d' has no towerpack dtype%s "
                 "(taken: uint8, bool, int32, int64, float16, float32, float64)",
                 kind, itemsize, what);
        return 0;
    }
    if (order == '>' && itemsize > 1) {
        snprintf(why, whylen, "numpy dtype '>%c%d' is big-endian (only "
                 "little-endian arrays are taken)", kind, itemsize);
        return 0;
    }
    if (order != '<' && order != '|' && order != '=' && order != '>') {
        snprintf(why, whylen, "numpy dtype byte order '%c'", order);
        return 0;
    }
    return 1;
}

int df_tpk_np_typestr(const char *s, size_t len, tp_dtype_t *out, char *why,
                      size_t whylen) {
    char order = '=';
    if (len > 0 && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
        order = s[0];
        s++;
        len--;
    }
    if (len < 2 || len > 4) {
        snprintf(why, whylen, "numpy type '%.*s' is not a kind and a size",
                 (int)(len < 16 ? len : 16), s);
        return 0;
    }
    int size = 0;
    for (size_t i = 1; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            snprintf(why, whylen, "numpy type '%.*s' is not a kind and a size",
                     (int)len, s);
            return 0;
        }
        size = size * 10 + (s[i] - '0');
    }
    return df_tpk_np_dtype(s[0], size, order, out, why, whylen);
}
