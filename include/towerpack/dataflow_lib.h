/* towerpack: the DataFlow library (sources, transforms, data sets, record
 * files, augmentors, threaded map), after tensorpack's dataflow package.
 *
 * Every constructor is named tp_df_<what>, returns a new dataflow the caller
 * owns, and TAKES the dataflow(s) it wraps: on failure the wrapped dataflows
 * are destroyed, NULL is returned and tp_last_error() says why. So pipelines
 * compose in one expression and a NULL propagates outwards:
 *
 *   tp_dataflow_t *df = tp_df_batch(
 *       tp_df_locally_shuffle(tp_df_fashion_mnist("train", 1), 10000, 1, 0),
 *       128, 0);
 *   if (!df) die(tp_last_error());
 *   tp_dataflow_reset_state(df, seed, worker_index);
 *
 * Constructors that take an array of dataflows take every entry and set it
 * to NULL. A wrapper's reset_state resets what it wraps with the same seed
 * and stream; each implementation that draws random numbers mixes its own
 * name into its generator, so two different stages never share a sequence.
 *
 * Datapoint conventions: Fashion-MNIST and IDX sources yield component 0 the
 * image (uint8 [28,28], HW) and component 1 the label (int32, ndim 0).
 * Batch stacks each component: uint8 [B,28,28] and int32 [B]. */
#ifndef TOWERPACK_DATAFLOW_LIB_H
#define TOWERPACK_DATAFLOW_LIB_H

#include <stdio.h>
#include <towerpack/dataflow.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A map function's return value that drops the datapoint (not an error). */
#define TP_DF_DROP 2

/* Release a callback's user data (may be NULL where a constructor asks). */
typedef void (*tp_df_free_fn)(void *user);

/* Map a datapoint in place. *dp is owned by the callee for the call: it may
 * modify it, replace it (destroying the old one) or destroy it and set *dp to
 * NULL. Return TP_OK to keep *dp, TP_DF_DROP to drop it (a non-NULL *dp is
 * then destroyed by the caller), or < 0 with tp_error on failure. The rng is
 * private to the calling stage (or, in a threaded map, to this datapoint). */
typedef tp_status_t (*tp_df_map_fn)(tp_datapoint_t **dp, tp_rng_t *rng,
                                    void *user);

/* Map one component in place: the tensor may be replaced (fini the old one,
 * init a new one in *t). Return TP_OK, TP_DF_DROP or < 0 as above. */
typedef tp_status_t (*tp_df_map_component_fn)(tp_tensor_t *t, tp_rng_t *rng,
                                              void *user);

/* Keep the datapoint? 1 yes, 0 no. */
typedef int (*tp_df_filter_fn)(const tp_datapoint_t *dp, void *user);

/* A generator: TP_OK with a new datapoint in *out (caller owns), TP_DONE at
 * the end of a pass (it is then called again for the next pass), or < 0. */
typedef tp_status_t (*tp_df_generator_fn)(tp_datapoint_t **out, tp_rng_t *rng,
                                          void *user);

/* ---- sources ------------------------------------------------------------- */

/* Yield (copies of) the n datapoints in dps[], in order or reshuffled every
 * pass (tensorpack's DataFromList, whose default is shuffle=1). Takes every
 * dps[i] and sets it to NULL; the array itself stays the caller's. */
tp_dataflow_t *tp_df_from_list(tp_datapoint_t **dps, size_t n, int shuffle);

/* Yield what `fn` generates; `size` is the pass length to report (-1:
 * unknown). user_free(user) runs at destroy (may be NULL). */
tp_dataflow_t *tp_df_generator(tp_df_generator_fn fn, void *user,
                               tp_df_free_fn user_free, int64_t size);

/* One component of FakeData. */
typedef struct tp_df_fake_comp {
    tp_dtype_t dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
} tp_df_fake_comp_t;

/* FakeData: `size` datapoints per pass of ncomp components. random=1 draws
 * every datapoint afresh (floats uniform in [0,1), integers in [0,256));
 * random=0 repeats one datapoint drawn at reset_state. */
tp_dataflow_t *tp_df_fake(const tp_df_fake_comp_t *comps, int ncomp,
                          int64_t size, int random);

/* Read a whole IDX file (plain, or gzip by its magic) into a new owned
 * tensor: uint8, int32, float32 or float64 elements; shape from the file.
 * TP_ERR_IO when it cannot be read, TP_ERR_FORMAT when it is corrupt or
 * truncated (the message names the file and what is wrong). */
tp_status_t tp_idx_read(const char *path, tp_tensor_t *out);

/* Decode an IDX file's bytes held in memory (plain, not gzip): the same
 * checks as tp_idx_read, for untrusted buffers (and fuzzing). The payload
 * must be exactly what the header describes. */
tp_status_t tp_idx_decode(const void *data, size_t size, tp_tensor_t *out);

/* Images and labels from IDX files: component 0 one image (the file's
 * element type, shape [H,W] or [H,W,C]), component 1 the label as int32
 * scalar. labels_path may be NULL (one component). Both files are decoded
 * at construction; each datapoint owns a small copy (one allocation for
 * both components), and Batch copies straight from the decoded arrays
 * (next_into). shuffle: reshuffle the order every pass. */
tp_dataflow_t *tp_df_idx(const char *images_path, const char *labels_path,
                         int shuffle);

/* Where the Fashion-MNIST files are read: $TP_FASHION_MNIST_DIR, else
 * /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist). */
const char *tp_df_fashion_mnist_dir(void);

/* The Fashion-MNIST data set, split "train" (60000) or "test" (10000):
 * uint8 [28,28] image, int32 label. tensorpack's default is shuffle=1. */
tp_dataflow_t *tp_df_fashion_mnist(const char *split, int shuffle);

/* ---- text: a language model's data ---------------------------------------- */

/* Which part of a text file a text source reads. */
typedef enum {
    TP_TEXT_TRAIN = 0,  /* the file but its held-out tail (the default) */
    TP_TEXT_VAL = 1,    /* the held-out tail: the last val_fraction */
    TP_TEXT_ALL = 2,    /* the whole file (e.g. a separate validation file) */
} tp_text_split_t;

typedef struct tp_df_text_opts {
    int64_t context;      /* T, tokens a datapoint's input holds (64) */
    tp_text_split_t split;
    double val_fraction;  /* the held-out tail, in [0, 1) (0.1): the split
                             point is n - floor(n * val_fraction) */
    int random;           /* 1: windows at random offsets; 0: consecutive
                             windows at offsets 0, T, 2T, ...; -1 (default):
                             random for train and all, consecutive for val
                             (the same windows at every validation) */
    int64_t size;         /* windows per pass; 0 (default): (tokens - 1) / T,
                             about one pass over the split's tokens */
    const char *vocab;    /* NULL (default): bytes are the tokens. Else
                             GPT-2's BPE (include/towerpack/tokenizer.h):
                             encoder.json with merges = vocab.bpe, or a
                             .tiktoken file with merges NULL */
    const char *merges;
} tp_df_text_opts_t;

/* Defaults: context 64, TP_TEXT_TRAIN, val_fraction 0.1, random -1, size 0,
 * bytes as tokens. */
void tp_df_text_opts_init(tp_df_text_opts_t *opts);

/* A text file as a language model's data: every byte is a token (a
 * vocabulary of 256), or with opts->vocab GPT-2's BPE tokens. Each
 * datapoint is a window of context + 1 tokens at offset o of the split:
 * component 0 the input, int32 [T] (tokens o .. o+T-1), component 1 the
 * targets, int32 [T] (tokens o+1 .. o+T: the input shifted by one), so a
 * batch is the [B, T] tokens and [B, T] labels of a sequence
 * cross-entropy. Random offsets are drawn uniformly from [0, tokens - T - 1]
 * by the dataflow's generator (seeded at reset_state: the same seed gives
 * the same windows). The split is a byte range of the file either way. As
 * bytes the file is mapped (mmap), never read whole; with BPE the split's
 * bytes are encoded once here, into int32 ids held in memory (4 bytes a
 * token; forked workers share them). A missing file, a directory, a bad
 * vocabulary, or a split shorter than T + 1 tokens is an error naming the
 * file. opts NULL: the defaults. */
tp_dataflow_t *tp_df_text(const char *path, const tp_df_text_opts_t *opts);

/* What a text source's tokens are. */
typedef struct tp_text_info {
    int32_t vocab;           /* the ids are in [0, vocab): 256 for bytes */
    int64_t bytes;           /* the split's bytes */
    int64_t tokens;          /* and its tokens (0 when not measured) */
    double bytes_per_token;  /* bytes / tokens (1 for bytes; 0 when not
                                measured): bits per byte = nats per token
                                / ln 2 / bytes_per_token */
    char vocab_file[4096];   /* the tokenizer's files, absolute ("" for */
    char merges_file[4096];  /* bytes; merges "" for a .tiktoken file) */
} tp_text_info_t;

/* The vocabulary of the source tp_df_text(path, opts) would make, and with
 * measure its split's bytes per token (BPE: the split encoded, as the
 * source does). */
tp_status_t tp_df_text_info(const char *path, const tp_df_text_opts_t *opts, int measure,
                            tp_text_info_t *out);

/* The same from a spec whose first stage is a text: source
 * ("text:FILE,vocab=..,merges=.. | batch 32"); TP_ERR_INVALID for other
 * sources. */
tp_status_t tp_df_text_spec_info(const char *spec, int measure, tp_text_info_t *out);

/* ---- transforms ---------------------------------------------------------- */

/* Stack batch_size datapoints: component i of the batch is [B, ...shape]
 * of component i. All datapoints must agree in component count, dtype and
 * shape (TP_ERR_SHAPE names the first that does not). remainder=1 also
 * yields the last smaller batch (size ceil), 0 drops it (size floor). */
tp_dataflow_t *tp_df_batch(tp_dataflow_t *inner, int batch_size,
                           int remainder);

/* Group datapoints by the shape of `component` and yield a batch whenever a
 * group holds batch_size of them; partial groups carry over to the next
 * pass. Size unknown. */
tp_dataflow_t *tp_df_batch_by_shape(tp_dataflow_t *inner, int batch_size,
                                    int component);

/* MapData: apply fn to every datapoint; TP_DF_DROP drops it. The size is
 * the inner size (an upper bound when fn drops). */
tp_dataflow_t *tp_df_map(tp_dataflow_t *inner, tp_df_map_fn fn, void *user,
                         tp_df_free_fn user_free);

/* MapDataComponent: apply fn to component `component` of each datapoint. */
tp_dataflow_t *tp_df_map_component(tp_dataflow_t *inner,
                                   tp_df_map_component_fn fn, void *user,
                                   tp_df_free_fn user_free, int component);

/* Keep the datapoints for which fn returns 1. Size unknown. */
tp_dataflow_t *tp_df_filter(tp_dataflow_t *inner, tp_df_filter_fn fn,
                            void *user, tp_df_free_fn user_free);

/* FixedSizeData: every pass yields exactly `size` datapoints, starting the
 * inner dataflow over when it ends. keep_state=1 continues the inner pass
 * where the previous pass stopped; 0 starts it afresh every pass. */
tp_dataflow_t *tp_df_fixed_size(tp_dataflow_t *inner, int64_t size,
                                int keep_state);

/* RepeatedData: `times` inner passes per pass; times = -1 repeats forever
 * (size unknown). */
tp_dataflow_t *tp_df_repeat(tp_dataflow_t *inner, int64_t times);

/* RepeatedDataPoint: yield each datapoint `times` times in a row. */
tp_dataflow_t *tp_df_repeat_datapoint(tp_dataflow_t *inner, int times);

/* RandomChooseData: each datapoint comes from dfs[k] drawn with probability
 * probs[k] (NULL: uniform); the pass ends when the chosen one ends. */
tp_dataflow_t *tp_df_random_choose(tp_dataflow_t **dfs, const double *probs,
                                   int n);

/* RandomMixData: one pass of every dfs[k], interleaved in a random order
 * that keeps each one's own order. Every size must be known. */
tp_dataflow_t *tp_df_random_mix(tp_dataflow_t **dfs, int n);

/* ConcatData: one pass of dfs[0], then of dfs[1], ... */
tp_dataflow_t *tp_df_concat(tp_dataflow_t **dfs, int n);

/* JoinData: the components of dfs[0]'s datapoint, then dfs[1]'s, ...; the
 * pass ends when the first of them ends (size: the smallest). */
tp_dataflow_t *tp_df_join(tp_dataflow_t **dfs, int n);

/* SelectComponent: components idx[0..n-1] of each datapoint (an index may
 * repeat; it is then copied). */
tp_dataflow_t *tp_df_select_component(tp_dataflow_t *inner, const int *idx,
                                      int n);

/* LocallyShuffleData: a buffer of buffer_size datapoints, each inner
 * datapoint added num_reuse times, the buffer reshuffled after every
 * shuffle_interval inner datapoints (0: buffer_size / 3). The inner dataflow
 * runs forever, so passes mix; a pass ends after size(inner) * num_reuse
 * datapoints (never when the inner size is unknown). */
tp_dataflow_t *tp_df_locally_shuffle(tp_dataflow_t *inner, int buffer_size,
                                     int num_reuse, int shuffle_interval);

/* CacheData: the first pass reads inner and keeps every datapoint; later
 * passes replay the cache (reshuffled every pass when shuffle=1). */
tp_dataflow_t *tp_df_cache(tp_dataflow_t *inner, int shuffle);

/* PrintData: print the structure (dtype and shape of each component, and
 * the range of small ones) of the first `num` datapoints of the first pass
 * to `out` (NULL: stderr), labelled `name` (may be NULL). */
tp_dataflow_t *tp_df_print(tp_dataflow_t *inner, int num, const char *name,
                           FILE *out);

/* MultiThreadMapData: fn runs on `nthreads` threads with at most
 * buffer_size datapoints in flight (0: 200). fn must be thread-safe; its
 * rng is seeded per datapoint from (seed, stream, datapoint number), so a
 * strict pipeline gives the same result for any thread count.
 * strict=1: exactly one inner pass per pass, in the inner order.
 * strict=0: results in completion order; the inner dataflow runs forever
 * and a pass ends after size(inner) datapoints (or, when the size is
 * unknown, when an inner pass ends and the buffer drains). */
tp_dataflow_t *tp_df_multithread_map(tp_dataflow_t *inner, int nthreads,
                                     int buffer_size, int strict,
                                     tp_df_map_fn fn, void *user,
                                     tp_df_free_fn user_free);

/* ---- image augmentors ---------------------------------------------------- */

/* An ordered chain of augmentors for uint8 images, HW or HWC. Caller owns. */
typedef struct tp_augment tp_augment_t;

tp_augment_t *tp_augment_new(void);
void tp_augment_destroy(tp_augment_t **self_p);

/* Random crop of h x w after zero padding of `pad` pixels on every side
 * (torchvision's RandomCrop(size, padding)). The image must be at least
 * h x w once padded. */
tp_status_t tp_augment_add_crop(tp_augment_t *self, int h, int w, int pad);
/* Horizontal flip with probability `prob` (0.5 is the usual). */
tp_status_t tp_augment_add_flip(tp_augment_t *self, double prob);
/* (x - mean[c]) / std[c] into float32 on the 0..255 scale of the input;
 * nch 1 applies mean[0]/std[0] to every channel. std must be > 0. */
tp_status_t tp_augment_add_normalize(tp_augment_t *self, int nch,
                                     const float *mean, const float *std);
/* Convert to `dtype` (value-preserving where it can). */
tp_status_t tp_augment_add_cast(tp_augment_t *self, tp_dtype_t dtype);

/* Apply the chain to *t (replaced by the result). TP_ERR_SHAPE when the
 * image does not fit (not uint8 HW/HWC where an augmentor needs it). */
tp_status_t tp_augment_apply(const tp_augment_t *self, tp_tensor_t *t,
                             tp_rng_t *rng);

/* As tp_augment_apply, moving the points `coords` (float32 [N,2], (x, y) in
 * pixel-edge coordinates: the image spans [0,W] x [0,H]) with the image
 * through every geometric step, as tensorpack's augment_coords. The
 * steps run one by one (no fused path); the same draws as apply. */
tp_status_t tp_augment_apply_coords(const tp_augment_t *self, tp_tensor_t *t,
                                    tp_tensor_t *coords, tp_rng_t *rng);

/* The chain as a tp_df_map_component_fn (user = the tp_augment_t). */
tp_status_t tp_augment_map_component(tp_tensor_t *t, tp_rng_t *rng,
                                     void *user);

/* Map component `component` through `aug` (taken: destroyed with the
 * dataflow, or at once on failure). */
tp_dataflow_t *tp_df_augment(tp_dataflow_t *inner, tp_augment_t *aug,
                             int component);

/* ---- LMDB record files ----------------------------------------------------- */

/* Version of the record layout, stored in the file under "__format__". */
#define TP_RECORDS_VERSION 1

typedef struct tp_records_opts {
    int lz4;              /* lz4 components of at least lz4_min_bytes */
    size_t lz4_min_bytes; /* default 1024, as on the wire */
    int checksum;         /* CRC32 of every component (checked on load) */
    size_t commit_every;  /* datapoints per write transaction (1000) */
    size_t chunk;         /* datapoints per LMDB value (64); 1 stores one
                           * per key, like tensorpack's LMDBSerializer */
} tp_records_opts_t;

/* Defaults: lz4 on (>= 1024 bytes), no checksum, commit every 1000,
 * chunks of 64. */
void tp_records_opts_init(tp_records_opts_t *opts);

/* Write one pass of `df` (reset already; not taken) to the LMDB file
 * `path` (replaced if it exists). *count_out (may be NULL) gets the
 * number of datapoints written. */
tp_status_t tp_records_save(tp_dataflow_t *df, const char *path,
                            const tp_records_opts_t *opts,
                            int64_t *count_out);

/* Datapoints of a record file, in key order or reshuffled every pass. The
 * file and its format record are checked here: TP_ERR_IO / TP_ERR_FORMAT /
 * TP_ERR_NOT_FOUND name the file and the problem. */
tp_dataflow_t *tp_df_lmdb(const char *path, int shuffle);

/* Decode one record value (untrusted bytes) into a new datapoint (caller
 * owns). TP_ERR_FORMAT on anything malformed; never reads out of bounds. */
tp_status_t tp_records_decode(const void *data, size_t size,
                              tp_datapoint_t **out);

/* Encode a datapoint (not taken) as a record value: a malloc'ed buffer the
 * caller frees. */
tp_status_t tp_records_encode(const tp_datapoint_t *dp,
                              const tp_records_opts_t *opts, void **data,
                              size_t *size);

/* ---- helpers for implementations ------------------------------------------ */

/* 1 when t borrows its memory (free_fn NULL, e.g. a view a map made with
 * tp_tensor_init_wrap): writing into it in place is not allowed. */
int tp_df_tensor_is_shared(const tp_tensor_t *t);

/* Replace a shared tensor by an owned copy (a no-op for an owned one), so
 * it may be written in place. */
tp_status_t tp_df_tensor_make_writable(tp_tensor_t *t);

/* A datapoint of ncomp components whose memory is one allocation (freed
 * when the last component is). Caller owns; NULL with tp_error on failure. */
tp_datapoint_t *tp_df_datapoint_alloc(int ncomp, const tp_dtype_t *dtypes,
                                      const int *ndims,
                                      const int64_t (*shapes)[TP_MAX_DIMS]);

/* Seed `out` for one named stage from a reset_state's (seed, stream). */
void tp_df_rng_derive(tp_rng_t *out, uint64_t seed, uint64_t stream,
                      const char *tag);

#ifdef __cplusplus
}
#endif
#endif
