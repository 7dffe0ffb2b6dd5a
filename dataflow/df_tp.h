/* towerpack dataflow: what the tensorpack decoders and encoders share (not
 * installed). Each decoder turns a message into a list of components that
 * still point into the message; tp_tpk_decode (df_tp_decode.c) makes the
 * datapoint. The files depend one way: the components and numpy dtypes
 * (df_tp_comps.c) <- the decoders (df_tp_pickle.c, df_tp_msgpack.c) <- the
 * dispatcher (df_tp_decode.c, which also holds zmq_ops' decoder). */
#ifndef TOWERPACK_DF_TP_H
#define TOWERPACK_DF_TP_H

#include <stdint.h>
#include <towerpack/tensorpack.h>

typedef struct df_tpk_comp {
    tp_dtype_t dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    const uint8_t *data;  /* nbytes, into the message; NULL: inl or owned */
    size_t nbytes;
    uint8_t *owned;       /* malloc'd bytes the component owns, or NULL */
    uint8_t inl[8];       /* a scalar's bytes (data NULL, owned NULL) */
} df_tpk_comp_t;

typedef struct df_tpk_comps {
    df_tpk_comp_t *c;
    int n, cap;
    int inl;  /* 1: c is the caller's storage (copied out when it grows) */
} df_tpk_comps_t;

/* ---- components and numpy dtypes (df_tp_comps.c) ---- */

/* A new component at the end (zeroed); NULL with an error recorded. */
df_tpk_comp_t *df_tpk_comps_push(df_tpk_comps_t *cs);
/* Free what the components own and the list. */
void df_tpk_comps_fini(df_tpk_comps_t *cs);

/* A numpy dtype (kind letter 'u', 'i', 'f', 'b', ...; itemsize; byte order
 * '<', '>', '|' or '=') as a towerpack dtype: bool becomes uint8. On
 * refusal *why says what numpy dtype it was and why it is not taken. */
int df_tpk_np_dtype(char kind, int itemsize, char order, tp_dtype_t *out,
                    char *why, size_t whylen);
/* Parse a numpy type string ("<f4", "|u1", "b1", "i8") into the above. */
int df_tpk_np_typestr(const char *s, size_t len, tp_dtype_t *out, char *why,
                      size_t whylen);

/* Python scalars as components. */
df_tpk_comp_t *df_tpk_comp_int(df_tpk_comps_t *cs, int64_t v);
df_tpk_comp_t *df_tpk_comp_float(df_tpk_comps_t *cs, double v);
df_tpk_comp_t *df_tpk_comp_bool(df_tpk_comps_t *cs, int v);
df_tpk_comp_t *df_tpk_comp_bytes(df_tpk_comps_t *cs, const uint8_t *p, size_t n);
/* An array component over data (nbytes must be the shape's size: checked,
 * TP_ERR_PROTOCOL naming "`who` `idx`" otherwise). */
tp_status_t df_tpk_comp_array(df_tpk_comps_t *cs, tp_dtype_t dt, int ndim,
                              const int64_t *shape, const uint8_t *data,
                              size_t nbytes, const char *who, int idx);

/* The decoders: components of the message, or TP_ERR_PROTOCOL
 * (df_tp_pickle.c, df_tp_msgpack.c; zmq_ops in df_tp_decode.c). */
tp_status_t df_tpk_pickle(const uint8_t *p, size_t n, df_tpk_comps_t *cs);
tp_status_t df_tpk_msgpack(const uint8_t *p, size_t n, df_tpk_comps_t *cs);
/* msgpack through msgpack-c alone (df_tpk_msgpack takes the common shapes
 * on a fast path first, and falls back to this one). */
tp_status_t df_tpk_msgpack_generic(const uint8_t *p, size_t n, df_tpk_comps_t *cs);
tp_status_t df_tpk_zmq_ops(const uint8_t *p, size_t n, df_tpk_comps_t *cs);

/* A serialised list of keys (LMDBSerializer's "__keys__": a list of bytes
 * or str) in pickle or msgpack: *keys is one malloc'd block, n key
 * lengths and offsets in *lens / *offs (malloc'd). df_tpk_keys
 * (df_tp_decode.c) tells the format and calls one of the other two. */
tp_status_t df_tpk_keys(const uint8_t *p, size_t n, char **keys, size_t **offs,
                        size_t **lens, size_t *count);
tp_status_t df_tpk_pickle_keys(const uint8_t *p, size_t n, char **keys,
                               size_t **offs, size_t **lens, size_t *count);
tp_status_t df_tpk_msgpack_keys(const uint8_t *p, size_t n, char **keys,
                                size_t **offs, size_t **lens, size_t *count);

/* The msgpack encoders (df_tp_msgpack.c), through msgpack-c; the pickle
 * encoder and tp_tpk_encode are in df_tp_encode.c. */
tp_status_t df_tpk_encode_msgpack(const tp_datapoint_t *dp, void **data,
                                  size_t *size);
tp_status_t df_tpk_encode_keys_msgpack(const char *const *keys, int64_t n,
                                       void **data, size_t *size);
/* A list of byte strings (the "__keys__" value) as a pickle or msgpack
 * (df_tp_encode.c). */
tp_status_t df_tpk_encode_keys(tp_tpk_format_t fmt, const char *const *keys,
                               int64_t n, void **data, size_t *size);

#endif
