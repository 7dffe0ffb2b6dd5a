/* towerpack dataflow: helpers shared by the dataflow library's files (not
 * installed). */
#ifndef TOWERPACK_DF_INTERNAL_H
#define TOWERPACK_DF_INTERNAL_H

#include <stdatomic.h>
#include <stdio.h>
#include <sys/types.h>
#include <string.h>
#include <towerpack/dataflow_lib.h>
#include <towerpack/image.h>
#include <towerpack/log.h>

/* The shared allocation behind tp_df_datapoint_alloc: a reference count in
 * front of the components' bytes; each component's free_fn drops one
 * reference. */
typedef struct df_block {
    atomic_int refs;
    int pad_[3];       /* keeps the payload 16-byte aligned */
} df_block_t;

void df_block_release(void *data, void *hint);

/* Allocate one block for components of the given byte sizes (each placed at
 * a 16-byte aligned offset) with `ncomp` references. *offsets gets each
 * component's offset from the returned payload. NULL on out of memory. */
df_block_t *df_block_new(int ncomp, const size_t *nbytes, size_t *offsets,
                         uint8_t **payload);

/* Trim white space from both ends of s, in place (df_spec_args.c, beside
 * the spec helpers that need it). Returns the trimmed start. */
char *df_spec_trim(char *s);

/* Make a dataflow from ops and impl, recording an error on failure (the
 * base destroys impl through ops->destroy). */
tp_dataflow_t *df_make(const tp_dataflow_ops_t *ops, void *impl);

/* Call fn on df and on every dataflow nested in it, depth first. Nested
 * means reset from df's reset_state on the same thread (what a wrapper
 * does with what it wraps), so the tree is known once df was reset. */
void df_visit(tp_dataflow_t *df, void (*fn)(tp_dataflow_t *df, void *arg), void *arg);

/* The dataflow that reset df (its wrapper), NULL when none or before its
 * reset_state: while df's reset_state runs, every one above it is known. */
tp_dataflow_t *df_outer(const tp_dataflow_t *df);

/* What df's output must be (tp_df_expect): a copy is kept (set), borrowed
 * with its count (get; NULL and 0 when nothing was said). */
struct tp_wire_comp;
tp_status_t df_expect_set(tp_dataflow_t *df, const struct tp_wire_comp *comps, int n);
const struct tp_wire_comp *df_expect_get(const tp_dataflow_t *df, int *n);

/* From inside df's reset_state: what df's own output must be, derived from
 * the nearest expectations above it (tp_df_expect) through the stages in
 * between: a `batch` drops the batch dimension, a stage that keeps its
 * datapoints as they are (shuffle, repeat, cache, ...) changes nothing,
 * any other leaves nothing known. Their number into out (at most max), 0
 * when nothing is known; `via` gets the stages' names for messages
 * ("batch"). */
int df_expect_for(tp_dataflow_t *df, struct tp_wire_comp *out, int max, char *via,
                  size_t via_size);

/* A remote sender's report (the text of a TP_CTL_REPORT control frame,
 * `len` bytes, not terminated; docs/wire-format.md) into *row: 0, or -1
 * for anything malformed (every field checked; an accepted row encodes
 * into a valid stats message). */
struct tp_stats_row;
int df_remote_report_parse(const char *text, size_t len, struct tp_stats_row *row);

/* Destroy n dataflows of an array and null the entries. */
void df_destroy_all(tp_dataflow_t **dfs, int n);

/* Reset inner with the wrapper's (seed, stream). */
tp_status_t df_reset_inner(tp_dataflow_t *inner, uint64_t seed,
                           uint64_t stream);

/* For next_into: the bytes of slot `slot` of component i of a stacked
 * batch, after checking that the batch has `ncomp` components and that
 * component i is [B, ...shape] of `dtype` with slots [slot, slot + count)
 * inside B. *stride gets the bytes per slot. NULL with TP_ERR_SHAPE
 * recorded (naming `who`) otherwise. */
void *df_slot(tp_datapoint_t *batch, int ncomp, int i, int64_t slot,
              int64_t count, tp_dtype_t dtype, int ndim, const int64_t *shape,
              const char *who, size_t *stride);

/* Sizes of wrapping dataflows: n * k and a + b, or -1 ("unknown") when an
 * operand is unknown or the result does not fit in int64_t. Sizes come
 * from user input ("fake:size=N | repeat K", nested shuffles with reuse),
 * so plain arithmetic could overflow (found by fuzz/fuzz_spec.c). */
static inline int64_t df_size_mul(int64_t n, int64_t k) {
    int64_t r;
    if (n < 0 || k < 0 || __builtin_mul_overflow(n, k, &r))
        return -1;
    return r;
}

static inline int64_t df_size_add(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r))
        return -1;
    return r;
}

/* Fill idx[0..n-1] with 0..n-1, shuffled when rng is not NULL. */
void df_iota_shuffle(uint32_t *idx, size_t n, tp_rng_t *rng);

/* df_util.c: path opened for reading, regular files only (a FIFO, socket,
 * device or directory is refused by name, without blocking on a FIFO);
 * *size its size. Messages start "WHAT PATH: ". */
tp_status_t df_open_regular(const char *what, const char *path, FILE **f, int64_t *size);
/* "a directory", "a FIFO (named pipe)", "a socket", "a device" or "a
 * special file": what a path that is not a regular file is, for messages */
const char *df_special_kind(mode_t mode);

/* Check the header of a records chunk value (u32 n, then n u32 end
 * offsets, then the records back to back): n must be `want`, the offsets
 * non-decreasing and the last one the end of the value. *data_off gets the
 * offset of the first record. TP_ERR_FORMAT naming `path` and `key`
 * otherwise. (df_lmdb.c; an entry point of its own so it can be fuzzed.) */
tp_status_t df_records_chunk_check(const void *value, size_t size,
                                   int64_t want, const char *path,
                                   const char *key, size_t *data_off);

/* An augmentor kept in a chain by df_augment.c but written elsewhere (the
 * image augmentors of dataflow/image/): fn(params, image, xy, n, rng)
 * replaces or edits the image and moves the n points xy[2n] (x, y; NULL
 * when none) with it. Takes params (params_free runs at the chain's
 * destroy, or at once on failure). */
typedef tp_status_t (*df_aug_fn)(const void *params, tp_tensor_t *t,
                                 float *xy, size_t n, tp_rng_t *rng);
/* Run a chain step by step moving the n points xy (may be NULL). */
tp_status_t df_augment_apply_pts(const tp_augment_t *self, tp_tensor_t *t,
                                 float *xy, size_t n, tp_rng_t *rng);
tp_status_t df_augment_add_ext(tp_augment_t *self, df_aug_fn fn, void *params,
                               void (*params_free)(void *params));

/* GoogleNetRandomCropAndResize (imgaug random-resized-crop) in two halves,
 * so a source can decode only the crop (tp_image_read_region): the draw
 * (10 tries of an area in [area_lo, area_hi] of H x W and an aspect in
 * [ratio_lo, ratio_hi], sides swapped half the time) sets rect = {y, x, h,
 * w} and returns 1, or returns 0 with rect the whole image; the finish
 * resizes the crop (drawn) to size x size, or the whole image as the
 * fallback does (short side to size, centre crop). */
int df_rrc_draw(tp_rng_t *rng, int H, int W, double area_lo, double area_hi,
                double ratio_lo, double ratio_hi, int rect[4]);
tp_status_t df_rrc_finish(tp_tensor_t *t, int drawn, int size, tp_interp_t interp);

/* Spec factories of dataflow/image/ (registered by df_spec.c's built-ins):
 * the sources imagefolder:, imagelist:, cifar: and the map stages decode
 * and imgaug. */
tp_status_t df_image_folder_src(const char *args, void *user,
                                tp_dataflow_t **out);
tp_status_t df_image_list_src(const char *args, void *user,
                              tp_dataflow_t **out);
tp_status_t df_image_cifar_src(const char *args, void *user,
                               tp_dataflow_t **out);
tp_status_t df_image_decode_map(const char *args, void *user,
                                tp_df_map_fn *fn, void **fn_user,
                                tp_df_free_fn *fn_free);
tp_status_t df_image_imgaug_map(const char *args, void *user,
                                tp_df_map_fn *fn, void **fn_user,
                                tp_df_free_fn *fn_free);

/* An image list's line, "PATH LABEL" (the label the last field, so a path
 * may hold spaces), split in place: 0 for a blank or '#' line, 1 with
 * *path and *label in [0, max_label], -1 for a line that is neither (*path
 * then the whole trimmed line, for the caller's message). The imagelist
 * source and the spec's scan of a list (img_spec.c) read lines alike. */
int df_image_list_line(char *line, long max_label, char **path, long *label);

/* The file a list's PATH names, into out[size]: PATH when absolute, else
 * PATH under root, or without a root beside the list file. Returns
 * snprintf's count (size or more: cut short). */
int df_image_list_path(char *out, size_t size, const char *list, const char *root,
                       const char *path);

/* The spec source text:FILE[,options] (df_text.c; registered by df_spec.c's
 * built-ins). */
tp_status_t df_text_src(const char *args, void *user, tp_dataflow_t **out);

#endif
