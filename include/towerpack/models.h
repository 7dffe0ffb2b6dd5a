/* towerpack: the models tp-train knows, for 28x28 single-channel images
 * with 10 classes (Fashion-MNIST, MNIST). Each is a tower function with the
 * two inputs image (uint8 [B,28,28]) and label (int32 [B]); every model
 * has the outputs "cost", "logits" and "wrong" (misclassified rows of the
 * batch) and the metric "accuracy". The
 * examples/ folder builds the same models step by step. */
#ifndef TOWERPACK_MODELS_H
#define TOWERPACK_MODELS_H

#include <towerpack/graph.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_zoo_model {
    const char *name;          /* "mlp", "cnn", "cnn-bn", "resnet" */
    const char *summary;
    tp_tower_fn build;
    double default_lr;         /* for SGD with momentum 0.9 (Adam: x 0.02) */
    int default_epochs;
    int augment;               /* trains on crop+flip augmented images */
    const char *optimizer;     /* the default: "sgd" (momentum 0.9) or "adam" */
} tp_zoo_model_t;

/* The model named `name`, or NULL (tp_last_error lists the names). */
const tp_zoo_model_t *tp_zoo_find(const char *name);
/* Every model, NULL-terminated. */
const tp_zoo_model_t *const *tp_zoo_all(void);
/* The two input descriptions (image, label) all zoo models take. */
const tp_input_desc_t *tp_zoo_inputs(void);

/* A data source as tp-train and tp-predict name it, as the source of a
 * pipeline spec that yields what the zoo's models take (uint8 [28,28]
 * images, int32 labels): fashion-mnist:SPLIT, idx:IMAGES[,LABELS],
 * lmdb:PATH, tensorpack-lmdb:PATH (int64 labels narrowed), imagefolder:DIR
 * and imagelist:FILE (decoded as grey, resized to 28x28). in_order: read in
 * file order (validation, prediction). Writes buf[size]; TP_ERR_INVALID
 * naming the accepted forms for anything else. */
tp_status_t tp_zoo_source(const char *data, int in_order, char *buf, size_t size);

/* The zoo model a checkpoint holds: `load` a checkpoint or a log directory
 * (its latest checkpoint's path into ckpt[size]); the model its metadata
 * names (tp-train records it), or `model` when not NULL; inputs[2] the
 * inputs it was trained on (the image's dtype: float32 after the
 * augmentor). NULL with tp_last_error() saying which part failed. */
const tp_zoo_model_t *tp_zoo_from_checkpoint(const char *load, const char *model,
                                             char *ckpt, size_t size,
                                             tp_input_desc_t inputs[2]);

#ifdef __cplusplus
}
#endif
#endif
