/* towerpack: the models tp-train knows, for grey or colour images and any
 * number of classes (10 grey 28x28 by default: Fashion-MNIST). Each is a
 * tower function with the two inputs image (uint8 or float32 [B,H,W] grey,
 * or [B,C,H,W] channels first, colour; 28x28 by default, any size from the
 * model's min_size up to TP_ZOO_MAX_SIZE through tp_zoo_inputs_sized and
 * tp_zoo_inputs_shaped) and label (int32 [B]); every model takes C, H and
 * W from its image input, the number of classes from its options, and
 * has the outputs "cost", "logits" and "wrong" (misclassified rows of the
 * batch) and the metric "accuracy". The
 * examples/ folder builds the same models step by step. */
#ifndef TOWERPACK_MODELS_H
#define TOWERPACK_MODELS_H

#include <towerpack/graph.h>
#include <towerpack/model_callbacks.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a caller may vary in a zoo model: a zoo model's build function
 * takes a const tp_zoo_options_t * as its user pointer (the model
 * description's `user`; NULL: every default). A caller whose optimizer
 * function needs its own data puts it after this struct, as its first
 * member. */
struct tp_zoo_data;
typedef struct tp_zoo_options {
    float label_smoothing;  /* the cost's targets smoothed, [0, 1): 1 - s +
                               s/K at the label, s/K elsewhere (0: none) */
    int classes;            /* K, the classifier's outputs (0: 10) */
    /* The input normalisation inside the model, when data->in_model: the
     * image (uint8 0..255, or float32 already in [0, 1]) goes to [0, 1],
     * then (255 x - mean[c]) / std[c] per channel, as the model's first
     * ops (tp_zoo_data_affine), on the tower's device. NULL, or in_model
     * 0: uint8 is scaled to [0, 1] and float32 taken as it comes (a
     * pipeline that normalised). Read at build time only. */
    const struct tp_zoo_data *data;
    /* 1: no L2 term in the cost (models with weight decay add
     * C sum(w^2) / 2 over their "*\/W"): the optimizer decays instead
     * (tp-train --weight-decay with SGD). */
    int no_l2;
} tp_zoo_options_t;

/* The zoo's GPT (`gpt`, models/zoo_gpt.c): a byte-level decoder-only
 * Transformer on the text: source's windows. Its defaults train on 2 CPU
 * cores; the context is its inputs' T (tp_zoo_gpt_inputs). */
#define TP_ZOO_GPT_LAYERS 2
#define TP_ZOO_GPT_HEADS 4
#define TP_ZOO_GPT_EMBED 128
#define TP_ZOO_GPT_CONTEXT 64
#define TP_ZOO_GPT_MAX_CONTEXT 4096
/* The gpt's user data: the zoo's options first (so a caller may give
 * one struct to every zoo model), then its shape; 0 (or a NULL user) means
 * the defaults above. */
typedef struct tp_zoo_gpt_options {
    tp_zoo_options_t zoo;
    int layers;             /* Transformer blocks */
    int heads;              /* attention heads; embed a multiple of it */
    int embed;              /* the width C of the residual stream */
    float dropout;          /* nanoGPT's dropout rate in [0, 1) on the
                               embeddings, the attention weights and each
                               block's two residual branches, in training
                               only; 0: none, no dropout nodes */
    int vocab;              /* the token embedding's rows V: 0 for 256
                               (bytes), else the BPE tokenizer's
                               (tp_df_text_info) */
} tp_zoo_gpt_options_t;
/* Its inputs at context T: "tokens" and "targets", int32 [B,T]. */
tp_status_t tp_zoo_gpt_inputs(int context, tp_input_desc_t out[2]);
/* Its tower function (user: a tp_zoo_gpt_options_t * or NULL). */
tp_status_t tp_zoo_gpt_build(tp_tower_t *t, tp_node_t *const *in, void *user);

/* ---- the GPT decoding with a cache of keys and values, and the text
 * generator tp-generate and tp-train's per-epoch sample call
 * (models/zoo_gpt_decode.c). */
/* The decoding graph's inputs at context T: "token" and "pos" int32
 * [B,1] (the new token and its position, 0..T-1), "mask" float32
 * [B,1,1,T+1] (0 on the cache slots filled and on the last entry, the new
 * position itself; -1e9 on empty slots), "cache" float32 [B,2L,H,T,D]
 * (layer l's keys at 2l, its values at 2l+1, slot p for position p). */
tp_status_t tp_zoo_gpt_decode_inputs(int context, const tp_zoo_gpt_options_t *o,
                                     tp_input_desc_t out[4]);
/* Its tower function (user: the tp_zoo_gpt_options_t * of the shape):
 * tp_zoo_gpt_build's variables under the same names, for one new
 * position; outputs "logits" [B,1,V] (V: o->vocab, 0 for 256 bytes) and
 * "kv" [B,2L,H,1,D], the new
 * position's keys and values in the cache's order. */
tp_status_t tp_zoo_gpt_decode_build(tp_tower_t *t, tp_node_t *const *in, void *user);

/* How the next token is drawn: logits / temperature, cut to the top_k
 * likeliest (0, or top_k >= V: all V), softmax, one draw of a generator seeded by
 * seed; temperature 0 (or top_k 1) is the argmax. */
typedef struct tp_zoo_gpt_sampling {
    double temperature;
    int top_k;
    uint64_t seed;
} tp_zoo_gpt_sampling_t;
/* Called with each generated byte as it is drawn. */
typedef void (*tp_zoo_gpt_emit_fn)(const uint8_t *bytes, size_t n, void *user);
/* Called with each generated token as it is drawn (a tokenizer, which this
 * room does not have, turns it into bytes: tp_tokenizer_token). */
typedef void (*tp_zoo_gpt_emit_ids_fn)(const int32_t *ids, size_t n, void *user);

typedef struct tp_zoo_gpt_gen tp_zoo_gpt_gen_t;
/* A generator of the GPT of shape *o (o->vocab: the vocabulary V, 0 for 256
 * bytes) at `context`, on the CPU, its weights
 * from checkpoint `ckpt` (NULL: the initial values, for tp_zoo_gpt_gen_load).
 * cache 1: the decoding graph, one position a token; 0: the whole graph
 * over the last T tokens for every token (the reference). Caller owns; NULL
 * with tp_last_error(). */
tp_zoo_gpt_gen_t *tp_zoo_gpt_gen_new(const char *ckpt, int context,
                                     const tp_zoo_gpt_options_t *o, int cache);
/* The same with the shape a checkpoint of tp-train --model gpt records in
 * its metadata (context, layers, heads, embed; tokens "bytes" or
 * "gpt2-bpe") and V from its wte's rows (a BPE checkpoint's vocab_size
 * must agree; a byte-level one's are 256). */
tp_zoo_gpt_gen_t *tp_zoo_gpt_gen_open(const char *ckpt, int cache);
void tp_zoo_gpt_gen_destroy(tp_zoo_gpt_gen_t **self_p);
int tp_zoo_gpt_gen_context(const tp_zoo_gpt_gen_t *g);
/* V, the ids' range 0..V-1 (256: bytes). */
int tp_zoo_gpt_gen_vocab(const tp_zoo_gpt_gen_t *g);
const tp_zoo_gpt_options_t *tp_zoo_gpt_gen_shape(const tp_zoo_gpt_gen_t *g);
/* Copy the weights of `live` (a model of tp_zoo_gpt_build at the same
 * shape, on any device: a trainer's) into the generator. */
tp_status_t tp_zoo_gpt_gen_load(tp_zoo_gpt_gen_t *g, tp_model_t *live);
/* Past the context, the cache empties and the last `keep` tokens are fed
 * again at positions 0..keep-1 (1..T; default T/2). keep = T gives what
 * the cacheless path gives, at T steps a byte. */
tp_status_t tp_zoo_gpt_gen_set_keep(tp_zoo_gpt_gen_t *g, int keep);
/* ids[0..plen) = prompt (plen >= 1 tokens in 0..V-1), then ntokens tokens
 * drawn after it: ids holds plen + ntokens (prompt may be ids). Only the
 * last T tokens of the prompt are read. emit (may be NULL) sees each
 * token as it comes. */
tp_status_t tp_zoo_gpt_gen_run_ids(tp_zoo_gpt_gen_t *g, const int32_t *prompt, size_t plen,
                                   int32_t *ids, long ntokens,
                                   const tp_zoo_gpt_sampling_t *s,
                                   tp_zoo_gpt_emit_ids_fn emit, void *user);
/* The same for a byte-level GPT (V 256; TP_ERR_INVALID otherwise):
 * text[0..plen) = prompt (plen 0: a newline, one byte), then ntokens bytes
 * drawn after it: text holds plen + ntokens (or 1 + ntokens). emit (may
 * be NULL) sees each byte as it comes. */
tp_status_t tp_zoo_gpt_gen_run(tp_zoo_gpt_gen_t *g, const uint8_t *prompt, size_t plen,
                               uint8_t *text, long ntokens, const tp_zoo_gpt_sampling_t *s,
                               tp_zoo_gpt_emit_fn emit, void *user);
/* tp-train's per-epoch sample: a TextSample callback (model_callbacks.h)
 * whose generator copies the trained model's weights (a gpt of shape *o at
 * `context`; o->vocab its V, opts->vocab its tokenizer when BPE) into a
 * CPU generator with the cache and draws opts->tokens tokens after
 * opts->prompt (opts' generate, gen, gen_destroy are set here). */
tp_callback_t *tp_zoo_gpt_cb_sample(int context, const tp_zoo_gpt_options_t *o,
                                    const tp_text_sample_opts_t *opts);

typedef struct tp_zoo_model {
    const char *name;          /* "mlp", "cnn", "cnn-bn", "resnet",
                                  "resnet18", "resnet50" */
    const char *summary;
    tp_tower_fn build;
    double default_lr;         /* for SGD with momentum 0.9 (Adam: x 0.02) */
    int default_epochs;
    int augment;               /* trains on crop+flip augmented images */
    const char *optimizer;     /* the default: "sgd" (momentum 0.9) or "adam" */
    int min_size;              /* the smallest image height and width it
                                * builds at (its poolings leave >= 1 pixel) */
    double weight_decay;       /* C of its L2 term, C sum(w^2) / 2 over its
                                * "*\/W" (0: none); tp-train with SGD gives
                                * it to the optimizer instead (no_l2) */
} tp_zoo_model_t;

/* The largest image height or width tp_zoo_inputs_sized takes. */
#define TP_ZOO_MAX_SIZE 1024

/* The model named `name`, or NULL (tp_last_error lists the names). */
const tp_zoo_model_t *tp_zoo_find(const char *name);
/* Every image model, NULL-terminated (not gpt: tp_zoo_find names it). */
const tp_zoo_model_t *const *tp_zoo_all(void);
/* The two input descriptions (image, label) all zoo models take at the
 * default size: image uint8 [B,28,28]. */
const tp_input_desc_t *tp_zoo_inputs(void);
/* The same for images of height x width: out[0] image uint8
 * [B,height,width], out[1] label int32 [B]. TP_ERR_INVALID naming the size
 * when either is outside 1..TP_ZOO_MAX_SIZE (out untouched). A model may
 * need more: tp_zoo_check_size. */
tp_status_t tp_zoo_inputs_sized(int height, int width, tp_input_desc_t out[2]);
/* The same with `channels`: 1 is tp_zoo_inputs_sized; 3 is colour, image
 * uint8 [B,3,height,width] (channels first, as the pipeline of
 * tp_zoo_source_shaped and tp_zoo_normalise_spec gives it; the model
 * normalises, tp_zoo_options_t.data). Another count is TP_ERR_INVALID. */
tp_status_t tp_zoo_inputs_shaped(int channels, int height, int width,
                                 tp_input_desc_t out[2]);
/* TP_OK when `model` builds at height x width; TP_ERR_INVALID naming the
 * model, the size and its min_size (or TP_ZOO_MAX_SIZE) otherwise. The
 * models check it too when they are built (tp_model_new fails with that
 * message, after the tower's name), before any layer sees the image. */
tp_status_t tp_zoo_check_size(const tp_zoo_model_t *model, int height, int width);

/* A data source as tp-train and tp-predict name it, as the source of a
 * pipeline spec that yields what the zoo's models take (uint8 [28,28]
 * images, int32 labels): fashion-mnist:SPLIT, idx:IMAGES[,LABELS],
 * lmdb:PATH, tensorpack-lmdb:PATH (int64 labels narrowed), imagefolder:DIR
 * and imagelist:FILE (decoded as grey, resized to 28x28). in_order: read in
 * file order (validation, prediction). Writes buf[size]; TP_ERR_INVALID
 * naming the accepted forms for anything else. The 28x28 case of
 * tp_zoo_source_sized. */
tp_status_t tp_zoo_source(const char *data, int in_order, char *buf, size_t size);
/* The same for images of height x width: image folders and lists are
 * decoded at the smallest scale that keeps min(height, width) pixels on the
 * short side and resized to height x width; the other sources (28x28
 * Fashion-MNIST, IDX and LMDB records) get an `imgaug resize=HxW` stage
 * unless the size is 28x28. TP_ERR_INVALID for a size outside
 * 1..TP_ZOO_MAX_SIZE. */
tp_status_t tp_zoo_source_sized(const char *data, int in_order, int height, int width,
                                char *buf, size_t size);

/* The same with `channels` 1 (grey: tp_zoo_source_sized) or 3 (colour:
 * image folders and lists decoded as RGB, CIFAR's records as they are;
 * uint8 [height,width,3], HWC: the normalisation and `imgaug chw` follow,
 * tp_zoo_normalise_spec). Colour from a grey-only source (Fashion-MNIST,
 * IDX, LMDB) is TP_ERR_INVALID. */
tp_status_t tp_zoo_source_shaped(const char *data, int in_order, int channels,
                                 int height, int width, char *buf, size_t size);

/* What a run's data were, as tp-train records it beside its checkpoints
 * (LOGDIR/data.json) and tp-predict and tp-export read it back: the image
 * channels, the class names in label order, the per-channel normalisation
 * the pipeline applied ((x - mean) / std on the 0..255 scale). Held by
 * value; init gives a run from before the file: grey, 10 classes named by
 * number, mean 0, std 255. */
#define TP_ZOO_DATA_FILE "data.json"
typedef struct tp_zoo_data {
    int channels;        /* 1 grey, 3 colour (RGB, channels first) */
    int nclasses;
    char **classes;      /* [nclasses] owned, or NULL: named "0".."K-1" */
    int nnorm;           /* 1 (every channel) or one per channel */
    int resize_short;    /* evaluation: 0 resizes to the model's size; S
                          * resizes the short side to S, then centre-crops */
    float mean[4], std[4];
    int in_model;        /* 1: the images cross the pipeline as uint8 and
                          * the model normalises (tp_zoo_options_t.data;
                          * data.json's "normalise": "model"); 0: the
                          * model takes the images as its pipeline gives
                          * them and adds no ops ("pipeline"): grey uint8
                          * at grey's default, whose cast to [0, 1] is the
                          * normalisation; a --spec, --remote or
                          * --resident input's own; float32 the pipeline
                          * normalised (runs from before) */
} tp_zoo_data_t;
void tp_zoo_data_init(tp_zoo_data_t *d);
void tp_zoo_data_fini(tp_zoo_data_t *d);
/* n classes named names[i] (NULL, or a NULL entry: its number); copied. */
tp_status_t tp_zoo_data_set_classes(tp_zoo_data_t *d, int n, const char *const *names);
/* The normalisation as an affine map of pixels in [0, 1], the one place
 * its formula lives: (255 x - mean[c]) / std[c] = x * scale[c] + shift[c]
 * for c < d->nnorm; 1 when it is the identity (grey's mean 0, std 255).
 * In models.c (the model applies it). */
int tp_zoo_data_affine(const tp_zoo_data_t *d, float scale[4], float shift[4]);
/* Write dir/data.json (atomically). */
tp_status_t tp_zoo_data_save(const tp_zoo_data_t *d, const char *dir);
/* Record *d and the input size (height x width) in every later
 * checkpoint of m (tp_checkpoint_set_meta: "channels", "size", "classes",
 * "class_names", "mean", "std", "resize_short", "colour"; lists as JSON),
 * so a checkpoint copied without its data.json still says them. */
tp_status_t tp_zoo_data_to_checkpoints(const tp_zoo_data_t *d, int height, int width,
                                       tp_model_t *m);
/* Read data.json from `ckpt`'s folder (or from `ckpt` when it is a log
 * directory) into *d; without one, the checkpoint's own metadata
 * (tp_zoo_data_to_checkpoints; a log directory's latest checkpoint); *found
 * 0 (and *d the defaults) when neither says; TP_ERR_FORMAT naming the file
 * when it is malformed. */
tp_status_t tp_zoo_data_load(const char *ckpt, tp_zoo_data_t *d, int *found);
/* An image source decoded for a random resized crop (tp-train --augment
 * imagenet): RGB or grey at the smallest JPEG scale keeping
 * min(height, width) on the short side, not resized. Only imagefolder: and
 * imagelist: (TP_ERR_INVALID for others). */
tp_status_t tp_zoo_source_decoded(const char *data, int channels, int height, int width,
                                  char *buf, size_t size);
/* The whole per-image evaluation chain of a run (tp-train's validation,
 * tp-predict): `data` in file order, resized as d->resize_short says,
 * normalised as *d (tp_zoo_normalise_spec); no batch stage. */
tp_status_t tp_zoo_eval_spec(const char *data, const tp_zoo_data_t *d, int height,
                             int width, char *buf, size_t size);
/* The stages that turn a source's uint8 image into the model's input
 * (validation, prediction): with d->in_model, uint8 through
 * " | imgaug random-crop=HxW" (and ",chw" for colour); else float32
 * through " | augment crop=HxW,mean=..,std=.." and, for colour,
 * " | imgaug chw". */
tp_status_t tp_zoo_normalise_spec(const tp_zoo_data_t *d, int height, int width,
                                  char *buf, size_t size);

/* The zoo model a checkpoint holds: `load` a checkpoint or a log directory
 * (its latest checkpoint's path into ckpt[size]); the model its metadata
 * names (tp-train records it), or `model` when not NULL; inputs[2] the
 * inputs it was trained on: the image's dtype (uint8; float32 for runs
 * whose augmentor normalised) and its shape as recorded ([B,H,W], or [B,3,H,W] for colour;
 * 28x28 grey for checkpoints that record no inputs); the classes are in
 * tp_zoo_data_load's description. NULL with tp_last_error() saying which part
 * failed (also a recorded size the model does not build at). */
const tp_zoo_model_t *tp_zoo_from_checkpoint(const char *load, const char *model,
                                             char *ckpt, size_t size,
                                             tp_input_desc_t inputs[2]);

/* The zoo's GAN, DCGAN for 28x28 grey images by default (tp-train --model dcgan,
 * trained by the GAN trainer of gan.h): generator z [B,100] -> fc 6272 ->
 * reshape [B,128,7,7] -> BN -> relu -> conv-transpose 64 (4x4 s2 p1) ->
 * BN -> relu -> conv-transpose 1 (4x4 s2 p1) -> tanh, the output "gen"
 * [B,1,28,28] in [-1,1]; discriminator conv 64 (4x4 s2 p1) -> leaky relu
 * 0.2 -> conv 128 (4x4 s2 p1) -> BN -> leaky relu 0.2 -> fc 1, applied to
 * the real images (uint8 scaled to [-1,1]) and the fakes with the same
 * variables. Variables under gen/ and discrim/; the costs "g_loss" and
 * "d_loss" (sigmoid cross-entropy, GANModelDesc.build_losses) and the
 * outputs of TP_GAN_MONITORS. Inputs: image uint8 [B,28,28], label int32
 * [B] (unused: the zoo's sources yield it), z float32 [B,100] (input 2,
 * the trainer's noise). */
#define TP_ZOO_DCGAN_Z 100
typedef struct tp_zoo_gan {
    const char *name;             /* "dcgan" */
    const char *summary;
    tp_tower_fn build;
    const tp_input_desc_t *inputs;
    int ninputs;
    int noise_input;              /* the input the trainer feeds the noise */
    int zdim;                     /* the noise's width */
    const char *sample_output;    /* the generator's output, in [-1, 1] */
    double lr, beta1;             /* Adam's, per group */
    int default_epochs;
} tp_zoo_gan_t;

/* The GAN named `name`, or NULL (no error set: tp_zoo_find names the
 * classifiers). */
const tp_zoo_gan_t *tp_zoo_find_gan(const char *name);
/* Its inputs (out[gz->ninputs]) for images of `channels` (1 grey, 3
 * colour) at size x size: the image input uint8 [B,size,size] grey or
 * [B,3,size,size] colour (channels first), the others as gz->inputs. The
 * DCGAN builds its shape from that input: 28 is the model above (any
 * channels); a power of two 16..128 starts its generator at 4x4 and
 * doubles n = log2(size/4) times, 64 2^(n-1) channels halving each time
 * (32 px: fc 256x4x4 -> 128x8x8 -> 64x16x16 -> 3x32x32), the
 * discriminator mirrored. TP_ERR_INVALID naming the size or channels
 * otherwise. */
tp_status_t tp_zoo_gan_inputs_shaped(const tp_zoo_gan_t *gz, int channels, int size,
                                     tp_input_desc_t *out);

#ifdef __cplusplus
}
#endif
#endif
