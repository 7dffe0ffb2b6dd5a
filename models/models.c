/* towerpack models: the model zoo of tp-train (MLP, CNN, CNN with batch
 * norm, a CIFAR-style ResNet, ResNet-18 and ResNet-50 in ImageNet's
 * layout; and a byte-level GPT for text, models/zoo_gpt.c) for grey or colour images and any number of classes: 28x28 grey
 * and 10 classes by default, any height and width from the model's
 * min_size on (each model reads C, H and W from its image input, the
 * classes from its options); and the zoo's GAN, DCGAN for 28x28 grey
 * images by default, colour and other sizes from its image input
 * (tp_zoo_find_gan, tp_zoo_gan_inputs_shaped). */
#include <stdio.h>
#include <string.h>
#include <towerpack/models.h>

static const tp_input_desc_t s_inputs[2] = {
    {"image", TP_UINT8, 3, {-1, 28, 28}},
    {"label", TP_INT32, 1, {-1}},
};

const tp_input_desc_t *tp_zoo_inputs(void) { return s_inputs; }

tp_status_t tp_zoo_inputs_sized(int height, int width, tp_input_desc_t out[2]) {
    if (height < 1 || height > TP_ZOO_MAX_SIZE || width < 1 || width > TP_ZOO_MAX_SIZE)
        return tp_error(TP_ERR_INVALID, "zoo image size %dx%d: height and width "
                        "must be 1..%d", height, width, TP_ZOO_MAX_SIZE);
    out[0] = s_inputs[0];
    out[0].shape[1] = height;
    out[0].shape[2] = width;
    out[1] = s_inputs[1];
    return TP_OK;
}

tp_status_t tp_zoo_inputs_shaped(int channels, int height, int width,
                                 tp_input_desc_t out[2]) {
    if (channels != 1 && channels != 3)
        return tp_error(TP_ERR_INVALID, "zoo image channels %d: 1 (grey) or 3 "
                        "(colour)", channels);
    tp_input_desc_t o[2];
    TP_TRY(tp_zoo_inputs_sized(height, width, o));
    if (channels == 3) {
        /* colour comes channels first (imgaug chw), uint8 as decoded: the
         * model normalises (tp_zoo_options_t.data) */
        o[0].ndim = 4;
        o[0].shape[1] = 3;
        o[0].shape[2] = height;
        o[0].shape[3] = width;
    }
    out[0] = o[0];
    out[1] = o[1];
    return TP_OK;
}

/* The number of classes a model is built for: its options' (10 when none). */
static int s_classes(const void *user) {
    const tp_zoo_options_t *o = user;
    return o && o->classes > 0 ? o->classes : 10;
}

tp_status_t tp_zoo_check_size(const tp_zoo_model_t *model, int height, int width) {
    if (!model)
        return tp_error(TP_ERR_INVALID, "no model to check the image size of");
    if (height > TP_ZOO_MAX_SIZE || width > TP_ZOO_MAX_SIZE)
        return tp_error(TP_ERR_INVALID, "model %s: image size %dx%d is larger than "
                        "%dx%d", model->name, height, width, TP_ZOO_MAX_SIZE,
                        TP_ZOO_MAX_SIZE);
    if (height < model->min_size || width < model->min_size)
        return tp_error(TP_ERR_INVALID, "model %s: image size %dx%d is too small "
                        "(it needs at least %dx%d)", model->name, height, width,
                        model->min_size, model->min_size);
    return TP_OK;
}

/* The models' L2 coefficients, in their heads and in s_models (where
 * tp-train reads them to give them to SGD as its coupled decay) */
#define S_WD_CNN_BN 5e-4f
#define S_WD_RESNET 5e-4f
#define S_WD_IMAGENET 1e-4f  /* ImageNet's recipe: resnet18, resnet50 */

/* The classifier head shared by every model: logits -> cost and metrics;
 * the cost's label smoothing from the caller's options (user). */
static tp_status_t s_head_wd(tp_tower_t *t, tp_node_t *logits, tp_node_t *label,
                             float weight_decay, const void *user) {
    const tp_zoo_options_t *o = user;
    tp_node_t *cost = tp_softmax_xent_smoothed(t, "cost", logits, label,
                                               o ? o->label_smoothing : 0.0f);
    tp_tower_add_output(t, "cost", cost);
    /* The reported cost stays the cross-entropy; the one minimised adds the
     * L2 penalty on every weight matrix and kernel (not biases, not BN). */
    tp_node_t *minimised = cost;
    if (weight_decay > 0 && !(o && o->no_l2))
        minimised = tp_add(t, "total_cost", cost,
                           tp_l2_decay(t, "weight_decay", "*/W", weight_decay));
    tp_tower_add_output(t, "logits", logits);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, label));
    tp_tower_add_output(t, "wrong", tp_error_count(t, "wrong", logits, label));
    TP_TRY(tp_tower_status(t));
    return tp_tower_set_cost(t, minimised);
}

static tp_status_t s_head(tp_tower_t *t, tp_node_t *logits, tp_node_t *label,
                          const void *user) {
    return s_head_wd(t, logits, label, 0, user);
}

/* The data's normalisation as one affine map a channel (models.h); here,
 * not in zoo_data.c, because zoo_data.c already calls into this file. */
int tp_zoo_data_affine(const tp_zoo_data_t *d, float scale[4], float shift[4]) {
    int identity = 1;
    for (int c = 0; c < d->nnorm && c < 4; c++) {
        /* (255 x - mean) / std for x in [0, 1] */
        scale[c] = 255.0f / d->std[c];
        shift[c] = -d->mean[c] / d->std[c];
        identity &= scale[c] == 1.0f && shift[c] == 0.0f;
    }
    return identity;
}

/* The normalisation of options->data (when it says in_model) as the
 * graph's first ops after the cast: x * scale[c] + shift[c], each a
 * constant [1,C,1,1] ([1,1,1] for grey [B,H,W]) broadcast over the batch
 * and the pixels; nothing when it is the identity. ONNX export writes these
 * two ops as Mul and Add, so the file normalises as training did. */
static tp_status_t s_normalise(tp_tower_t *t, tp_node_t *x, const void *user,
                               const char *name, tp_node_t **out) {
    const tp_zoo_options_t *o = user;
    *out = x;
    if (!o || !o->data || !o->data->in_model)
        return TP_OK;
    float scale[4], shift[4];
    if (tp_zoo_data_affine(o->data, scale, shift))
        return TP_OK;
    const tp_shape_t *s = tp_node_shape(x);
    int64_t c = s->ndim == 4 ? s->d[1] : 1;
    int n = o->data->nnorm;
    if (n != 1 && n != c)
        return tp_error(TP_ERR_SHAPE, "model %s: a normalisation of %d channels for "
                        "an image of %lld", name, n, (long long)c);
    int64_t shape[4] = {1, n, 1, 1};
    if (s->ndim == 3)
        shape[1] = 1;
    tp_node_t *sc = tp_constant(t, "input/scale", s->ndim, shape, scale);
    tp_node_t *sh = tp_constant(t, "input/shift", s->ndim, shape, shift);
    *out = tp_add(t, "input/normalised", tp_mul(t, "input/scaled", x, sc), sh);
    return TP_OK;
}

/* uint8 [B,H,W] -> float32 [B,1,H,W] in [0,1], or [B,C,H,W] as it is
 * (colour, channels first from the pipeline; uint8 scaled to [0,1]), or
 * flattened [B,C*H*W]; then normalised per channel when the options'
 * data say so (s_normalise). Without, float32 batches pass as they come
 * (a pipeline that normalised). C, H and W are the image input's own; a
 * size the model `name` does not build at fails here, naming it, before
 * any layer. */
static tp_status_t s_image(tp_tower_t *t, tp_node_t *img, int nchw, const char *name,
                           const void *user, tp_node_t **out) {
    *out = NULL;
    const tp_shape_t *s = img ? tp_node_shape(img) : NULL;
    if (!s || (s->ndim != 3 && s->ndim != 4))
        return tp_error(TP_ERR_SHAPE, "model %s: the image input must be [batch,"
                        "height,width] or [batch,channels,height,width]%s", name,
                        s ? "" : " (no image input)");
    int64_t c = s->ndim == 4 ? s->d[1] : 1, h = s->d[s->ndim - 2], w = s->d[s->ndim - 1];
    if (c < 1 || c > 4)
        return tp_error(TP_ERR_SHAPE, "model %s: %lld image channels (1..4)", name,
                        (long long)c);
    if (h > TP_ZOO_MAX_SIZE || w > TP_ZOO_MAX_SIZE)
        return tp_error(TP_ERR_INVALID, "model %s: image size %lldx%lld is larger "
                        "than %dx%d", name, (long long)h, (long long)w,
                        TP_ZOO_MAX_SIZE, TP_ZOO_MAX_SIZE);
    TP_TRY(tp_zoo_check_size(tp_zoo_find(name), (int)h, (int)w));
    tp_node_t *x = tp_cast(t, "input", img, tp_node_dtype(img) == TP_UINT8 ? 1.0f / 255 : 1.0f);
    TP_TRY(s_normalise(t, x, user, name, &x));
    if (!nchw) {
        *out = tp_flatten(t, "flat_input", x);
        return TP_OK;
    }
    if (s->ndim == 4) {
        *out = x;
        return TP_OK;
    }
    int64_t shape[] = {-1, 1, h, w};
    *out = tp_reshape(t, "nchw", x, 4, shape);
    return TP_OK;
}

static tp_status_t s_mlp(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *x;
    TP_TRY(s_image(t, in[0], 0, "mlp", user, &x));
    x = tp_relu(t, NULL, tp_fc(t, "fc0", x, 512, 1));
    x = tp_relu(t, NULL, tp_fc(t, "fc1", x, 256, 1));
    return s_head(t, tp_fc(t, "linear", x, s_classes(user), 1), in[1], user);
}

static tp_node_t *s_conv_block(tp_tower_t *t, const char *scope, tp_node_t *x,
                               int filters, int bn) {
    x = tp_conv2d(t, scope, x, filters, 3, 1, -1, !bn);
    if (bn) {
        char s[64];
        snprintf(s, sizeof s, "%s/bn", scope);
        x = tp_batch_norm(t, s, x);
    }
    return tp_relu(t, NULL, x);
}

static tp_status_t s_cnn(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *x;
    TP_TRY(s_image(t, in[0], 1, "cnn", user, &x));
    x = tp_max_pool(t, "pool0", s_conv_block(t, "conv0", x, 32, 0), 2, 2, 0);
    x = tp_max_pool(t, "pool1", s_conv_block(t, "conv1", x, 64, 0), 2, 2, 0);
    x = tp_flatten(t, "flat", x);
    x = tp_relu(t, NULL, tp_fc(t, "fc0", x, 128, 1));
    return s_head(t, tp_fc(t, "linear", x, s_classes(user), 1), in[1], user);
}

/* The longer-run model: three conv blocks with batch norm (32, 64, 128
 * channels, each halving the image: 28 -> 14 -> 7 -> 3; at least 8x8),
 * fc 256 with
 * dropout, weight decay 5e-4. Twice the CNN's arithmetic per image. The
 * two-block version plateaued at 0.918; this one reached 0.9328 in 24
 * epochs with a 1-pixel crop and flip (docs/training.md has the runs). */
static tp_status_t s_cnn_bn(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *x;
    TP_TRY(s_image(t, in[0], 1, "cnn-bn", user, &x));
    x = tp_max_pool(t, "pool0", s_conv_block(t, "conv0", x, 32, 1), 2, 2, 0);
    x = tp_max_pool(t, "pool1", s_conv_block(t, "conv1", x, 64, 1), 2, 2, 0);
    x = tp_max_pool(t, "pool2", s_conv_block(t, "conv2", x, 128, 1), 2, 2, 0);
    x = tp_flatten(t, "flat", x);
    x = tp_dropout(t, "dropout", tp_relu(t, NULL, tp_fc(t, "fc0", x, 256, 1)), 0.3f);
    return s_head_wd(t, tp_fc(t, "linear", x, s_classes(user), 1), in[1], S_WD_CNN_BN, user);
}

/* A basic residual block: conv-bn-relu-conv-bn (+ projection when the shape
 * changes), then relu. */
static tp_node_t *s_res_block(tp_tower_t *t, const char *scope, tp_node_t *x,
                              int filters, int stride) {
    char a[96], b[96], p[96], bna[96], bnb[96], bnp[96];
    snprintf(a, sizeof a, "%s/conv1", scope);
    snprintf(b, sizeof b, "%s/conv2", scope);
    snprintf(p, sizeof p, "%s/shortcut", scope);
    snprintf(bna, sizeof bna, "%s/bn1", scope);
    snprintf(bnb, sizeof bnb, "%s/bn2", scope);
    snprintf(bnp, sizeof bnp, "%s/bn_shortcut", scope);
    tp_node_t *y = tp_relu(t, NULL, tp_batch_norm(t, bna, tp_conv2d(t, a, x, filters, 3, stride, 1, 0)));
    y = tp_batch_norm(t, bnb, tp_conv2d(t, b, y, filters, 3, 1, 1, 0));
    tp_node_t *shortcut = x;
    if (stride != 1 || (x && tp_node_shape(x)->d[1] != filters))
        shortcut = tp_batch_norm(t, bnp, tp_conv2d(t, p, x, filters, 1, stride, 0, 0));
    return tp_relu(t, NULL, tp_add(t, NULL, y, shortcut));
}

/* The accuracy model: 0.950 and 0.949 (two seeds) in 40 epochs at lr 0.05
 * with weight decay 5e-4, on an H100 in 67 s; without the decay it stayed
 * at 0.942-0.943 whatever the length (docs/history.md, the third GPU run). */
static tp_status_t s_resnet(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *x;
    TP_TRY(s_image(t, in[0], 1, "resnet", user, &x));
    x = tp_relu(t, NULL, tp_batch_norm(t, "stem/bn", tp_conv2d(t, "stem", x, 32, 3, 1, 1, 0)));
    x = s_res_block(t, "stage1/block0", x, 32, 1);
    x = s_res_block(t, "stage1/block1", x, 32, 1);
    x = s_res_block(t, "stage2/block0", x, 64, 2);
    x = s_res_block(t, "stage2/block1", x, 64, 1);
    x = s_res_block(t, "stage3/block0", x, 128, 2);
    x = s_res_block(t, "stage3/block1", x, 128, 1);
    x = tp_global_avg_pool(t, "gap", x);
    return s_head_wd(t, tp_fc(t, "linear", x, s_classes(user), 1), in[1], S_WD_RESNET, user);
}

/* A bottleneck block (ResNet-50): 1x1 down to `filters`, 3x3 (the stride
 * here, as torchvision's v1.5), 1x1 up to 4 x filters, each with batch
 * norm; a projection when the shape changes; relu after the sum. */
static tp_node_t *s_bottleneck(tp_tower_t *t, const char *scope, tp_node_t *x,
                               int filters, int stride) {
    char n[6][96];
    static const char *const sfx[6] = {"conv1", "bn1", "conv2", "bn2", "conv3", "bn3"};
    for (int i = 0; i < 6; i++)
        snprintf(n[i], sizeof n[i], "%s/%s", scope, sfx[i]);
    tp_node_t *y = tp_relu(t, NULL, tp_batch_norm(t, n[1], tp_conv2d(t, n[0], x, filters, 1, 1, 0, 0)));
    y = tp_relu(t, NULL, tp_batch_norm(t, n[3], tp_conv2d(t, n[2], y, filters, 3, stride, 1, 0)));
    y = tp_batch_norm(t, n[5], tp_conv2d(t, n[4], y, 4 * filters, 1, 1, 0, 0));
    tp_node_t *shortcut = x;
    if (stride != 1 || (x && tp_node_shape(x)->d[1] != 4 * filters)) {
        char p[96], bnp[96];
        snprintf(p, sizeof p, "%s/shortcut", scope);
        snprintf(bnp, sizeof bnp, "%s/bn_shortcut", scope);
        shortcut = tp_batch_norm(t, bnp, tp_conv2d(t, p, x, 4 * filters, 1, stride, 0, 0));
    }
    return tp_relu(t, NULL, tp_add(t, NULL, y, shortcut));
}

/* ResNet in ImageNet's layout (He et al. 2015, torchvision's resnet18 and
 * resnet50): a 7x7 stride-2 stem with batch norm and relu, a 3x3 stride-2
 * max pool, four stages (64, 128, 256, 512 filters; the last three start
 * with stride 2), global average pool, fc. 32x smaller at the end: 224 ->
 * 7, 112 -> 4 (rounded up), 64 -> 2; it builds at any size. */
static tp_status_t s_resnet_imagenet(tp_tower_t *t, tp_node_t *const *in, void *user,
                                     const char *name, const int *blocks, int bottleneck) {
    tp_node_t *x;
    TP_TRY(s_image(t, in[0], 1, name, user, &x));
    x = tp_relu(t, NULL, tp_batch_norm(t, "stem/bn", tp_conv2d(t, "stem", x, 64, 7, 2, 3, 0)));
    x = tp_max_pool(t, "stem/pool", x, 3, 2, 1);
    for (int st = 0; st < 4; st++)
        for (int b = 0; b < blocks[st]; b++) {
            char scope[64];
            snprintf(scope, sizeof scope, "stage%d/block%d", st + 1, b);
            int stride = st > 0 && b == 0 ? 2 : 1;
            x = bottleneck ? s_bottleneck(t, scope, x, 64 << st, stride)
                           : s_res_block(t, scope, x, 64 << st, stride);
        }
    x = tp_global_avg_pool(t, "gap", x);
    return s_head_wd(t, tp_fc(t, "linear", x, s_classes(user), 1), in[1], S_WD_IMAGENET, user);
}

static tp_status_t s_resnet18(tp_tower_t *t, tp_node_t *const *in, void *user) {
    static const int blocks[4] = {2, 2, 2, 2};
    return s_resnet_imagenet(t, in, user, "resnet18", blocks, 0);
}

static tp_status_t s_resnet50(tp_tower_t *t, tp_node_t *const *in, void *user) {
    static const int blocks[4] = {3, 4, 6, 3};
    return s_resnet_imagenet(t, in, user, "resnet50", blocks, 1);
}

/* min_size: the MLP and the ResNets (padded stride-2 convolutions and
 * pooling, then a global average pool) build at any size (ResNet-18 and
 * -50 are meant for 64 px and up: below, the last stages see one pixel); the CNN's two 2x2 poolings need
 * 4 pixels, cnn-bn's three need 8. The fc layer after a flatten takes the
 * size it is built at. */
static const tp_zoo_model_t s_models[] = {
    {"mlp", "784-512-256-10 perceptron (at 28x28)", s_mlp, 0.05, 10, 0, "sgd", 1, 0},
    /* The main job: Adam reaches 0.91 in 3-4 epochs where SGD with
     * momentum stays at 0.907 after 3 (docs/training.md). */
    {"cnn", "two 3x3 convolutions (32, 64) with pooling, fc 128", s_cnn, 0.1, 4, 0, "adam", 4, 0},
    {"cnn-bn", "three conv blocks (32, 64, 128) with batch norm, fc 256, dropout, weight decay; augmented", s_cnn_bn, 0.02, 30, 1, "sgd", 8, S_WD_CNN_BN},
    {"resnet", "CIFAR-style ResNet: 3x3 stem, 6 basic blocks (32, 64, 128 channels), weight decay; augmented", s_resnet, 0.05, 40, 1, "sgd", 1, S_WD_RESNET},
    /* ImageNet's recipe: SGD 0.1 for batch 256, weight decay 1e-4 */
    {"resnet18", "ResNet-18, ImageNet layout (7x7 stem, max pool, 4 stages of 2 basic blocks), weight decay 1e-4; augmented", s_resnet18, 0.05, 90, 1, "sgd", 1, S_WD_IMAGENET},
    {"resnet50", "ResNet-50, ImageNet layout (7x7 stem, max pool, bottleneck blocks 3-4-6-3), weight decay 1e-4; augmented", s_resnet50, 0.05, 90, 1, "sgd", 1, S_WD_IMAGENET},
};
/* Text, not images (models/zoo_gpt.c): tp_zoo_find knows it, tp_zoo_all
 * (the image models every image tool and test walks) does not. AdamW at
 * 0.05 x 0.02 = 1e-3. */
static const tp_zoo_model_t s_gpt = {
    "gpt", "GPT on bytes: token and position embeddings, pre-norm causal self-attention "
    "and GELU MLP blocks, tied output (text: data)", tp_zoo_gpt_build, 0.05, 4, 0,
    "adamw", 1, 0};
static const tp_zoo_model_t *const s_all[] = {&s_models[0], &s_models[1], &s_models[2],
                                              &s_models[3], &s_models[4], &s_models[5], NULL};

const tp_zoo_model_t *const *tp_zoo_all(void) { return s_all; }

const tp_zoo_model_t *tp_zoo_find(const char *name) {
    for (int i = 0; s_all[i]; i++)
        if (name && strcmp(s_all[i]->name, name) == 0)
            return s_all[i];
    if (name && !strcmp(name, s_gpt.name))
        return &s_gpt;
    /* the GANs are tp_zoo_find_gan's, but a user who mistyped one reads
     * this list: name them too */
    tp_error(TP_ERR_INVALID, "unknown model '%s' (mlp, cnn, cnn-bn, resnet, resnet18, "
             "resnet50, gpt; GANs: dcgan)",
             name ? name : "(null)");
    return NULL;
}

/* ---- DCGAN (models.h: tp_zoo_find_gan) ---------------------------------- */

static const tp_input_desc_t s_dcgan_inputs[3] = {
    {"image", TP_UINT8, 3, {-1, 28, 28}},
    {"label", TP_INT32, 1, {-1}},
    {"z", TP_FLOAT32, 2, {-1, TP_ZOO_DCGAN_Z}},
};

/* Every weight's initial std (Radford et al.; tensorpack's DCGAN.py
 * draws its kernels from a normal of 0.02 too): with the layers' He
 * initialisation the discriminator won at once (d_loss 0.002 after 200
 * steps, the samples noise). */
#define S_DCGAN_STD 0.02f

/* The shape of a DCGAN at an image size: the generator's fc makes
 * [64 2^(n-1), base, base] and n conv-transposes double it to size x size
 * (halving the width, the last to the image's channels); the
 * discriminator mirrors it (n convolutions, 64 doubling, batch norm after
 * all but the first, then fc 1). 28 px is base 7, n 2 (the Fashion-MNIST
 * model, its variables and shapes pinned by the PyTorch parity test); a
 * power of two 16..128 is base 4, n = log2(size / 4) (Radford et al.'s
 * 64 px model at 64; 32 px, CIFAR's: fc 256x4x4 -> 128x8x8 -> 64x16x16 ->
 * 3x32x32). */
typedef struct {
    int channels, size, base, n;
} s_gan_shape_t;

static tp_status_t s_gan_shape(int channels, int size, s_gan_shape_t *g) {
    if (channels != 1 && channels != 3)
        return tp_error(TP_ERR_INVALID, "dcgan: %d image channels (1 grey or 3 colour)",
                        channels);
    g->channels = channels;
    g->size = size;
    if (size == 28) {
        g->base = 7;
        g->n = 2;
        return TP_OK;
    }
    for (g->n = 2; g->n <= 5; g->n++)
        if (size == 4 << g->n) {
            g->base = 4;
            return TP_OK;
        }
    return tp_error(TP_ERR_INVALID, "dcgan: image size %d (28, or a power of two from 16 "
                    "to 128)", size);
}

#define S_DCGAN_MAX_N 5

/* The discriminator's variables, made once and applied to the real and
 * the fake images (tensorpack's variable_scope reuse). */
typedef struct {
    int n;
    tp_node_t *w[S_DCGAN_MAX_N], *b0, *gamma[S_DCGAN_MAX_N], *beta[S_DCGAN_MAX_N],
        *mean[S_DCGAN_MAX_N], *var[S_DCGAN_MAX_N], *wf, *bf;
} s_discrim_t;

static tp_node_t *s_var(tp_tower_t *t, const char *name, int ndim, const int64_t *shape,
                        tp_init_kind_t kind, float value, tp_var_collection_t c) {
    return tp_variable(t, name, ndim, shape, (tp_init_t){kind, value}, c);
}

static s_discrim_t s_discrim_vars(tp_tower_t *t, const s_gan_shape_t *g) {
    s_discrim_t d;
    memset(&d, 0, sizeof d);
    d.n = g->n;
    char name[64];
    int64_t cin = g->channels, one[1] = {1};
    for (int i = 0; i < g->n; i++) {
        int64_t cout = (int64_t)64 << i, w[4] = {cout, cin, 4, 4}, c[1] = {cout};
        snprintf(name, sizeof name, "discrim/conv%d/W", i);
        d.w[i] = s_var(t, name, 4, w, TP_INIT_NORMAL, S_DCGAN_STD, TP_VAR_TRAINABLE);
        if (i == 0) {
            d.b0 = s_var(t, "discrim/conv0/b", 1, c, TP_INIT_ZEROS, 0, TP_VAR_TRAINABLE);
        } else {  /* no bias before the batch norm: its beta is the bias */
            snprintf(name, sizeof name, "discrim/bn%d/gamma", i);
            d.gamma[i] = s_var(t, name, 1, c, TP_INIT_CONST, 1, TP_VAR_TRAINABLE);
            snprintf(name, sizeof name, "discrim/bn%d/beta", i);
            d.beta[i] = s_var(t, name, 1, c, TP_INIT_ZEROS, 0, TP_VAR_TRAINABLE);
            snprintf(name, sizeof name, "discrim/bn%d/mean/EMA", i);
            d.mean[i] = s_var(t, name, 1, c, TP_INIT_ZEROS, 0, TP_VAR_MODEL);
            snprintf(name, sizeof name, "discrim/bn%d/variance/EMA", i);
            d.var[i] = s_var(t, name, 1, c, TP_INIT_CONST, 1, TP_VAR_MODEL);
        }
        cin = cout;
    }
    int64_t wf[2] = {cin * g->base * g->base, 1};
    d.wf = s_var(t, "discrim/fc/W", 2, wf, TP_INIT_NORMAL, S_DCGAN_STD, TP_VAR_TRAINABLE);
    d.bf = s_var(t, "discrim/fc/b", 1, one, TP_INIT_ZEROS, 0, TP_VAR_TRAINABLE);
    return d;
}

/* x [B,C,S,S] in [-1,1] -> logits [B,1]; each application has its own
 * batch statistics (as two calls of tensorpack's discriminator). */
static tp_node_t *s_discrim(tp_tower_t *t, const s_discrim_t *d, tp_node_t *x) {
    x = tp_leaky_relu(t, NULL, tp_conv2d_ex(t, NULL, x, d->w[0], d->b0, 2, 1, 1, 1), 0.2f);
    for (int i = 1; i < d->n; i++) {
        x = tp_conv2d_ex(t, NULL, x, d->w[i], NULL, 2, 1, 1, 1);
        x = tp_batch_norm_op(t, NULL, x, d->gamma[i], d->beta[i], d->mean[i], d->var[i], 0.9f,
                             1e-5f);
        x = tp_leaky_relu(t, NULL, x, 0.2f);
    }
    x = tp_flatten(t, NULL, x);
    return tp_bias_add(t, NULL, tp_matmul(t, NULL, x, d->wf), d->bf);
}

/* A constant tensor of x's shape (ones or zeros: the labels of the sigmoid
 * cross-entropy), made from x so it is batched as x is. */
static tp_node_t *s_fill_like(tp_tower_t *t, tp_node_t *x, float v) {
    return tp_clip(t, NULL, tp_stop_gradient(t, NULL, x), v, v);
}

/* mean(sign * logit > 0): the share of rows the discriminator calls real
 * (sign 1) or fake (sign -1), sigmoid(logit) against 0.5 as tensorpack's
 * build_losses; the clip turns any positive product into 1. */
static tp_node_t *s_share(tp_tower_t *t, const char *name, tp_node_t *logits, float sign) {
    tp_node_t *s = tp_clip(t, NULL, tp_scale(t, NULL, tp_stop_gradient(t, NULL, logits),
                                             sign * 1e30f), 0, 1);
    return tp_reduce_mean(t, name, s, 0, NULL, 0);
}

static tp_status_t s_dcgan(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    /* the shape from the image input: [B,S,S] grey, [B,C,S,S] colour */
    const tp_shape_t *is = tp_node_shape(in[0]);
    if (!is || (is->ndim != 3 && is->ndim != 4))
        return tp_error(TP_ERR_INVALID, "dcgan: the image input is not [B,H,W] or [B,C,H,W]");
    int ch = is->ndim == 4 ? (int)is->d[1] : 1, size = (int)is->d[is->ndim - 1];
    if (is->d[is->ndim - 2] != size)
        return tp_error(TP_ERR_INVALID, "dcgan: %lldx%lld images (square ones only)",
                        (long long)is->d[is->ndim - 2], (long long)size);
    s_gan_shape_t gs = {0, 0, 0, 0};
    TP_TRY(s_gan_shape(ch, size, &gs));
    /* the generator (its variables made here, N(0, 0.02) as the others) */
    int64_t width = (int64_t)64 << (gs.n - 1);
    int64_t chw[4] = {-1, width, gs.base, gs.base}, img[4] = {-1, ch, size, size};
    int64_t wfc[2] = {TP_ZOO_DCGAN_Z, width * gs.base * gs.base}, cb[1] = {ch};
    tp_node_t *g = tp_matmul(t, "gen/fc0/output", in[2],
                             s_var(t, "gen/fc0/W", 2, wfc, TP_INIT_NORMAL, S_DCGAN_STD,
                                   TP_VAR_TRAINABLE));
    g = tp_relu(t, NULL, tp_batch_norm(t, "gen/bn0", tp_reshape(t, NULL, g, 4, chw)));
    char name[64], wname[64], bname[64];
    for (int i = 1; i <= gs.n; i++) {
        int last = i == gs.n;
        int64_t out = last ? ch : width / 2, wd[4] = {width, out, 4, 4};
        snprintf(name, sizeof name, "gen/deconv%d/output", i);
        snprintf(wname, sizeof wname, "gen/deconv%d/W", i);
        snprintf(bname, sizeof bname, "gen/deconv%d/b", i);
        g = tp_conv2d_transpose_op(t, name, g,
                                   s_var(t, wname, 4, wd, TP_INIT_NORMAL, S_DCGAN_STD,
                                         TP_VAR_TRAINABLE),
                                   last ? s_var(t, bname, 1, cb, TP_INIT_ZEROS, 0,
                                                TP_VAR_TRAINABLE) : NULL,
                                   2, 1, 0, 1, 1);
        if (!last) {
            snprintf(name, sizeof name, "gen/bn%d", i);
            g = tp_relu(t, NULL, tp_batch_norm(t, name, g));
        }
        width = out;
    }
    tp_node_t *fake = tp_tanh(t, "gen", g);
    tp_tower_add_output(t, "gen", fake);
    /* the real images, uint8 [B,S,S] or [B,C,S,S] -> [B,C,S,S], each
     * channel's 0..255 to [-1,1] */
    tp_node_t *real = tp_cast(t, NULL, in[0], 2.0f / 255);
    real = tp_add(t, NULL, real, tp_scalar(t, NULL, -1.0f));
    real = tp_reshape(t, "real", real, 4, img);
    /* the discriminator on both */
    const s_discrim_t d = s_discrim_vars(t, &gs);
    tp_node_t *lr = s_discrim(t, &d, real), *lf = s_discrim(t, &d, fake);
    /* GANModelDesc.build_losses */
    tp_node_t *loss_real = tp_sigmoid_xent(t, "d_loss_real", lr, s_fill_like(t, lr, 1));
    tp_node_t *loss_fake = tp_sigmoid_xent(t, "d_loss_fake", lf, s_fill_like(t, lf, 0));
    tp_node_t *d_loss = tp_add(t, "d_loss", tp_scale(t, NULL, loss_real, 0.5f),
                               tp_scale(t, NULL, loss_fake, 0.5f));
    tp_node_t *g_loss = tp_sigmoid_xent(t, "g_loss", lf, s_fill_like(t, lf, 1));
    tp_node_t *acc_r = s_share(t, "d_accuracy_real", lr, 1);
    tp_node_t *acc_f = s_share(t, "d_accuracy_fake", lf, -1);
    tp_tower_add_output(t, "g_loss", g_loss);
    tp_tower_add_output(t, "d_loss", d_loss);
    tp_tower_add_output(t, "d_accuracy_real", acc_r);
    tp_tower_add_output(t, "d_accuracy_fake", acc_f);
    tp_tower_add_output(t, "d_accuracy", tp_add(t, "d_accuracy", tp_scale(t, NULL, acc_r, 0.5f),
                                                tp_scale(t, NULL, acc_f, 0.5f)));
    tp_tower_add_output(t, "g_accuracy", s_share(t, "g_accuracy", lf, 1));
    TP_TRY(tp_tower_status(t));
    TP_TRY(tp_tower_add_cost(t, "g_loss", g_loss, "gen/*"));
    return tp_tower_add_cost(t, "d_loss", d_loss, "discrim/*");
}

/* Adam 2e-4, beta1 0.5 (Radford et al.; tensorpack's DCGAN.py). */
static const tp_zoo_gan_t s_gans[] = {
    {"dcgan", "DCGAN (Radford et al.), 28x28 grey or the data's size and colour: fc + "
     "conv-transposes against convolutions + fc, batch norm", s_dcgan, s_dcgan_inputs, 3, 2, TP_ZOO_DCGAN_Z, "gen",
     2e-4, 0.5, 20},
};

const tp_zoo_gan_t *tp_zoo_find_gan(const char *name) {
    for (size_t i = 0; i < sizeof s_gans / sizeof s_gans[0]; i++)
        if (name && !strcmp(s_gans[i].name, name))
            return &s_gans[i];
    return NULL;
}

tp_status_t tp_zoo_gan_inputs_shaped(const tp_zoo_gan_t *gz, int channels, int size,
                                     tp_input_desc_t *out) {
    if (!gz || !out)
        return tp_error(TP_ERR_INVALID, "tp_zoo_gan_inputs_shaped: no GAN or no output");
    s_gan_shape_t gs = {0, 0, 0, 0};
    TP_TRY(s_gan_shape(channels, size, &gs));
    memcpy(out, gz->inputs, (size_t)gz->ninputs * sizeof *out);
    /* grey stays [B,S,S] (the 28 px model's input, as Fashion-MNIST's
     * pipeline yields it); colour is channels first [B,3,S,S] */
    out[0].ndim = channels == 1 ? 3 : 4;
    out[0].shape[0] = -1;
    int k = 1;
    if (channels != 1)
        out[0].shape[k++] = channels;
    out[0].shape[k++] = size;
    out[0].shape[k] = size;
    return TP_OK;
}
