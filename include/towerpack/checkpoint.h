/* towerpack: checkpoints as safetensors files.
 *
 * A safetensors file is an 8-byte little-endian header length, a JSON header
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 * "__metadata__": {"key": "string value"}}) and the tensor bytes. A model
 * checkpoint holds every variable by its name, the optimizer's slots as
 * "optimizer/<var>/<slot>" plus "optimizer/step", and the trainer state
 * (epoch, global step, RNG states) in the metadata. Files are written
 * atomically: a temporary file, fsync, rename, fsync of the directory. The
 * reader validates the whole header before trusting any of it.
 *
 * Every file written here carries the XXH3-64 of each tensor's bytes in its
 * metadata (TP_SAFETENSORS_CHECKSUM_KEY: 16 hex digits per tensor,
 * comma-separated, in the order the tensors lie in the data section: by
 * data_offsets, begin then end).
 * Loading a checkpoint verifies them, refuses non-finite values and
 * range-checks the trainer state, naming the file and the tensor or key. */
#ifndef TOWERPACK_CHECKPOINT_H
#define TOWERPACK_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/graph.h>
#include <towerpack/rng.h>
#include <towerpack/status.h>
#include <towerpack/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors files -------------------------------------------------- */

typedef struct tp_named_tensor {
    const char *name;
    const tp_tensor_t *tensor;
} tp_named_tensor_t;

typedef struct tp_meta_kv {
    const char *key;
    const char *value;
} tp_meta_kv_t;

/* The metadata key of the tensors' checksums. */
#define TP_SAFETENSORS_CHECKSUM_KEY "xxh3_64"

/* Write n tensors (names unique, not "__metadata__") and nmeta metadata
 * strings to `path` atomically, with the checksum of each tensor (a
 * TP_SAFETENSORS_CHECKSUM_KEY among `meta` is replaced by the true one). */
tp_status_t tp_safetensors_write(const char *path,
                                 const tp_named_tensor_t *tensors, size_t n,
                                 const tp_meta_kv_t *meta, size_t nmeta);

typedef struct tp_safetensors tp_safetensors_t;

/* Read and validate a whole file (length prefix, JSON, dtypes, shapes,
 * offsets in bounds, contiguous and non-overlapping). TP_ERR_FORMAT says
 * what is wrong and where; anything but a regular file (a FIFO, a device)
 * is TP_ERR_IO before a byte is read, without waiting. Checksums are not
 * checked here (tp_safetensors_verify). Caller owns *out. */
tp_status_t tp_safetensors_open(const char *path, tp_safetensors_t **out);
/* The same on a memory buffer (copied). `what` names it in errors. */
tp_status_t tp_safetensors_parse(const void *data, size_t size,
                                 const char *what, tp_safetensors_t **out);
void tp_safetensors_destroy(tp_safetensors_t **self_p);

size_t tp_safetensors_count(const tp_safetensors_t *st);
const char *tp_safetensors_name(const tp_safetensors_t *st, size_t i);
/* A borrowed view of tensor `name` (valid while st lives). */
tp_status_t tp_safetensors_get(const tp_safetensors_t *st, const char *name,
                               tp_tensor_t *view);
/* A metadata value, or NULL when the key is absent. */
const char *tp_safetensors_meta(const tp_safetensors_t *st, const char *key);
/* Check every tensor's bytes against the checksums in the metadata:
 * TP_ERR_FORMAT naming `what` (the file) and the first tensor that differs,
 * or a malformed checksum entry. A file without checksums (an older
 * towerpack's, another tool's) passes unchecked: *checked (may be NULL) is
 * 1 only when the sums were there and matched. */
tp_status_t tp_safetensors_verify(const tp_safetensors_t *st, const char *what,
                                  int *checked);

/* ---- model checkpoints -------------------------------------------------- */

/* What the trainer keeps between runs. */
typedef struct tp_train_state {
    int64_t epoch;       /* epochs finished */
    int64_t global_step; /* steps finished */
    tp_rng_t rng;        /* the trainer's own generator */
} tp_train_state_t;

typedef enum {
    TP_LOAD_STRICT = 0,
    TP_LOAD_RELAXED = 1,      /* ignore tensors the model does not have */
    TP_LOAD_WEIGHTS_ONLY = 2, /* skip optimizer slots and trainer state */
} tp_load_flags_t;

/* What every later checkpoint of m adds to its metadata (tp-train: what
 * the data were, "channels", "size", "classes", "class_names", so a
 * checkpoint copied alone still says them). `value` replaces an earlier
 * value of `key`; NULL removes it. Both copied. TP_ERR_INVALID for a key the
 * checkpoint writes itself ("format", "model", "inputs", "epoch",
 * "global_step", "rng", "tower..", "optimizer..", the checksums') or an
 * empty one, and past TP_CHECKPOINT_MAX_META keys. */
#define TP_CHECKPOINT_MAX_META 16
tp_status_t tp_checkpoint_set_meta(tp_model_t *m, const char *key, const char *value);
/* The value tp_checkpoint_set_meta gave `key`, or NULL. */
const char *tp_checkpoint_get_meta(const tp_model_t *m, const char *key);

/* Save every variable, the optimizer slots and `state` (may be NULL), plus
 * every tower's dropout generator and the metadata tp_checkpoint_set_meta
 * gave. */
tp_status_t tp_checkpoint_save(tp_model_t *m, const char *path,
                               const tp_train_state_t *state);
/* ---- snapshots: a checkpoint taken now, written later --------------------
 * tp_checkpoint_save is take + write. Split, the take (a copy of the
 * variables, slots and state into memory the snapshot owns) happens between
 * two steps, and the write (serialise, fsync, rename) anywhere else, e.g. on
 * a writer actor while the model trains on: the file is byte for byte the
 * one tp_checkpoint_save would have written at the moment of the take. */
typedef struct tp_checkpoint_snapshot tp_checkpoint_snapshot_t;

/* An empty snapshot; its buffers grow at the first take and are reused by
 * later ones. Caller owns. NULL when out of memory. */
tp_checkpoint_snapshot_t *tp_checkpoint_snapshot_new(void);
void tp_checkpoint_snapshot_destroy(tp_checkpoint_snapshot_t **self_p);
/* Copy m's variables, optimizer slots and step, every tower's generator,
 * the optimizer settings and `state` (may be NULL) into snap, replacing
 * what it held. Reads the model: call it where a save would be called. */
tp_status_t tp_checkpoint_snapshot_take(tp_checkpoint_snapshot_t *snap,
                                        tp_model_t *m,
                                        const tp_train_state_t *state);
/* Write what snap holds to `path` atomically. Reads only snap (never the
 * model), so it may run on any thread while the model changes. */
tp_status_t tp_checkpoint_snapshot_write(const tp_checkpoint_snapshot_t *snap,
                                         const char *path);
/* Tensor bytes the last take copied (0 for an empty snapshot). */
size_t tp_checkpoint_snapshot_bytes(const tp_checkpoint_snapshot_t *snap);

/* Load by name. Strict mode fails on missing, unexpected or mis-shaped
 * tensors, naming them; also (TP_ERR_FORMAT, naming file and tensor or key)
 * on a checksum mismatch, a non-finite value in a tensor it loads, an
 * optimizer/step outside 0..2^53 or a negative epoch or global_step. A file
 * without checksums loads with a warning (once per process). The model is
 * unchanged on any failure. `state` (may be NULL) receives the trainer
 * state. */
tp_status_t tp_checkpoint_load(tp_model_t *m, const char *path, int flags,
                               tp_train_state_t *state);

/* Check a checkpoint without a model: checksums, every float tensor finite,
 * optimizer/step in range, the trainer state's metadata in range and, when
 * steps_per_epoch > 0 (a resume), present and consistent with it: epoch E
 * ends at global step E x steps_per_epoch (a checkpoint taken within epoch
 * E lies after the end of E - 1). `state` (may be NULL) receives the state
 * (epoch and global_step -1 when absent). */
tp_status_t tp_checkpoint_verify(const char *path, int64_t steps_per_epoch,
                                 tp_train_state_t *state);

#ifdef __cplusplus
}
#endif
#endif
