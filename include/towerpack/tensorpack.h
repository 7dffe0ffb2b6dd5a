/* towerpack: tensorpack's own message and file formats, read and written.
 *
 * tensorpack's send_dataflow_zmq sends one single-frame message per
 * datapoint in one of three formats, and LMDBSerializer.save stores the same
 * serialised datapoints in LMDB (docs/tensorpack.md):
 *   pickle    pickle.dumps(dp, protocol=-1), tensorpack's default
 *   msgpack   msgpack with msgpack-numpy arrays (TENSORPACK_SERIALIZE=msgpack)
 *   zmq_ops   zmq_ops' dump_arrays: i32 count, then per array i32 TF dtype,
 *             i32 ndim, i32 shape[ndim], i64 byte length, the bytes
 * The decoders here turn such a message into a towerpack datapoint; the
 * receivers (the remote: source, ZMQInput, tp-train --remote) tell the
 * formats apart per message by its first bytes. Nothing from the peer is
 * trusted: every claim is checked against the bytes received, the pickle
 * decoder executes nothing (only numpy's array, scalar and dtype
 * reconstructors are understood among globals, every other global or
 * opcode is refused by name), and nesting is bounded. */
#ifndef TOWERPACK_TENSORPACK_H
#define TOWERPACK_TENSORPACK_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/datapoint.h>
#include <towerpack/dataflow.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TP_TPK_UNKNOWN = 0,   /* none of the formats below */
    TP_TPK_TOWERPACK = 1, /* towerpack's own wire header ("TPW1") */
    TP_TPK_PICKLE = 2,
    TP_TPK_MSGPACK = 3,
    TP_TPK_ZMQ_OPS = 4,
} tp_tpk_format_t;

/* "pickle", "msgpack", "zmq_ops", "towerpack" or "unknown". */
const char *tp_tpk_format_name(tp_tpk_format_t fmt);

/* Which format a message is in, from its first bytes (a pickle starts with
 * PROTO 2..5, a msgpack datapoint with an array header, a zmq_ops message
 * with a small little-endian count whose array headers add up to its size). */
tp_tpk_format_t tp_tpk_sniff(const void *data, size_t size);

#define TP_TPK_MAX_DEPTH 32  /* nesting of lists/tuples a message may hold */

typedef struct tp_tpk_opts {
    size_t max_bytes;  /* largest message accepted (default 1 GiB) */
    int int32_labels;  /* 1: int64 components (numpy's default integers,
                          Python ints) become int32, each value checked to
                          fit; for models that take int32 labels */
} tp_tpk_opts_t;

/* Defaults: 1 GiB, int64 kept. */
void tp_tpk_opts_init(tp_tpk_opts_t *opts);

/* Decode one tensorpack message (any of the three formats, by tp_tpk_sniff)
 * into a new datapoint in *out (caller owns). Arrays keep their dtype and
 * shape (bool becomes uint8 with the same bytes); Python ints become int64
 * scalars, floats float64, bytes and str (UTF-8) uint8 vectors. When
 * `release` is not NULL the call takes the buffer: large, aligned arrays
 * keep pointing into it (no copy) and release(data, hint) runs once the
 * last of them is freed (or before return when none does, also on
 * failure). With release NULL everything is copied. TP_ERR_PROTOCOL with a
 * message saying what and where for anything refused (a datapoint of no
 * components included). */
tp_status_t tp_tpk_decode(const void *data, size_t size, const tp_tpk_opts_t *opts,
                          tp_free_fn release, void *hint, tp_datapoint_t **out);

/* Encode a datapoint as tensorpack's dumps would: TP_TPK_PICKLE gives a
 * protocol 5 pickle of a list of numpy arrays that Python's pickle.loads
 * reads back with the same dtypes, shapes and bytes; TP_TPK_MSGPACK a list
 * of msgpack-numpy maps (msgpack.loads with msgpack_numpy reads it);
 * TP_TPK_ZMQ_OPS dump_arrays' layout. *data (malloc'd, caller frees). */
tp_status_t tp_tpk_encode(const tp_datapoint_t *dp, tp_tpk_format_t fmt,
                          void **data, size_t *size);

/* ---- LMDB files of LMDBSerializer.save ------------------------------------ */

/* A source over an LMDB file or directory written by tensorpack's
 * LMDBSerializer.save: values are datapoints in any of the formats above.
 * In order: every key in key order but "__keys__" (LMDBData with
 * shuffle=False). Shuffled: the keys of "__keys__" (or, without it, every
 * key) in a new order each pass. Caller owns; NULL with tp_last_error(). */
tp_dataflow_t *tp_df_tensorpack_lmdb(const char *path, int shuffle,
                                     const tp_tpk_opts_t *opts);

/* Write `count` datapoints of df (one pass when count < 0) to a new LMDB
 * file (or the directory `path`, when it is one) the way LMDBSerializer.save
 * does: keys '%08d', values in `fmt` (TP_TPK_PICKLE or TP_TPK_MSGPACK),
 * and "__keys__" holding the list of keys. df must be reset. *written gets
 * the number of datapoints stored. */
tp_status_t tp_tpk_lmdb_save(tp_dataflow_t *df, const char *path,
                             tp_tpk_format_t fmt, int64_t count,
                             int64_t *written);

#ifdef __cplusplus
}
#endif
#endif
