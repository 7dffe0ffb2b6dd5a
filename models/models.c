/* towerpack models: the model zoo of tp-train (MLP, CNN, CNN with batch
 * norm, a CIFAR-style ResNet, ResNet-18 and ResNet-50 in ImageNet's
 * layout; and a byte-level GPT for text, models/zoo_gpt.c) for grey or colour images and any number of classes: 28x28 grey
 * and 10 classes by default, any height and width from the model's
 * min_size on (each model reads C, H and W from its image input, the
 * classes from its options). */
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
        /* colour comes channels first (imgaug chw), normalised: float32 */
        o[0].dtype = TP_FLOAT32;
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
    if (weight_decay > 0)
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

/* uint8 [B,H,W] -> float32 [B,1,H,W] in [0,1], or [B,C,H,W] as it is
 * (colour, channels first from the pipeline; uint8 scaled to [0,1]), or
 * flattened [B,C*H*W]; augmented batches come as float32 already
 * (normalised by the augmentor): cast passes them on. C, H and W are the
 * image input's own; a size the model `name` does not build at fails here,
 * naming it, before any layer. */
static tp_status_t s_image(tp_tower_t *t, tp_node_t *img, int nchw, const char *name,
                           tp_node_t **out) {
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
    TP_TRY(s_image(t, in[0], 0, "mlp", &x));
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
    TP_TRY(s_image(t, in[0], 1, "cnn", &x));
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
    TP_TRY(s_image(t, in[0], 1, "cnn-bn", &x));
    x = tp_max_pool(t, "pool0", s_conv_block(t, "conv0", x, 32, 1), 2, 2, 0);
    x = tp_max_pool(t, "pool1", s_conv_block(t, "conv1", x, 64, 1), 2, 2, 0);
    x = tp_max_pool(t, "pool2", s_conv_block(t, "conv2", x, 128, 1), 2, 2, 0);
    x = tp_flatten(t, "flat", x);
    x = tp_dropout(t, "dropout", tp_relu(t, NULL, tp_fc(t, "fc0", x, 256, 1)), 0.3f);
    return s_head_wd(t, tp_fc(t, "linear", x, s_classes(user), 1), in[1], 5e-4f, user);
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
    TP_TRY(s_image(t, in[0], 1, "resnet", &x));
    x = tp_relu(t, NULL, tp_batch_norm(t, "stem/bn", tp_conv2d(t, "stem", x, 32, 3, 1, 1, 0)));
    x = s_res_block(t, "stage1/block0", x, 32, 1);
    x = s_res_block(t, "stage1/block1", x, 32, 1);
    x = s_res_block(t, "stage2/block0", x, 64, 2);
    x = s_res_block(t, "stage2/block1", x, 64, 1);
    x = s_res_block(t, "stage3/block0", x, 128, 2);
    x = s_res_block(t, "stage3/block1", x, 128, 1);
    x = tp_global_avg_pool(t, "gap", x);
    return s_head_wd(t, tp_fc(t, "linear", x, s_classes(user), 1), in[1], 5e-4f, user);
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
    TP_TRY(s_image(t, in[0], 1, name, &x));
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
    return s_head_wd(t, tp_fc(t, "linear", x, s_classes(user), 1), in[1], 1e-4f, user);
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
    {"mlp", "784-512-256-10 perceptron (at 28x28)", s_mlp, 0.05, 10, 0, "sgd", 1},
    /* The main job: Adam reaches 0.91 in 3-4 epochs where SGD with
     * momentum stays at 0.907 after 3 (docs/training.md). */
    {"cnn", "two 3x3 convolutions (32, 64) with pooling, fc 128", s_cnn, 0.1, 4, 0, "adam", 4},
    {"cnn-bn", "three conv blocks (32, 64, 128) with batch norm, fc 256, dropout, weight decay; augmented", s_cnn_bn, 0.02, 30, 1, "sgd", 8},
    {"resnet", "CIFAR-style ResNet: 3x3 stem, 6 basic blocks (32, 64, 128 channels), weight decay; augmented", s_resnet, 0.05, 40, 1, "sgd", 1},
    /* ImageNet's recipe: SGD 0.1 for batch 256, weight decay 1e-4 */
    {"resnet18", "ResNet-18, ImageNet layout (7x7 stem, max pool, 4 stages of 2 basic blocks), weight decay 1e-4; augmented", s_resnet18, 0.05, 90, 1, "sgd", 1},
    {"resnet50", "ResNet-50, ImageNet layout (7x7 stem, max pool, bottleneck blocks 3-4-6-3), weight decay 1e-4; augmented", s_resnet50, 0.05, 90, 1, "sgd", 1},
};
/* Text, not images (models/zoo_gpt.c): tp_zoo_find knows it, tp_zoo_all
 * (the image models every image tool and test walks) does not. AdamW at
 * 0.05 x 0.02 = 1e-3. */
static const tp_zoo_model_t s_gpt = {
    "gpt", "GPT on bytes: token and position embeddings, pre-norm causal self-attention "
    "and GELU MLP blocks, tied output (text: data)", tp_zoo_gpt_build, 0.05, 4, 0,
    "adamw", 1};
static const tp_zoo_model_t *const s_all[] = {&s_models[0], &s_models[1], &s_models[2],
                                              &s_models[3], &s_models[4], &s_models[5], NULL};

const tp_zoo_model_t *const *tp_zoo_all(void) { return s_all; }

const tp_zoo_model_t *tp_zoo_find(const char *name) {
    for (int i = 0; s_all[i]; i++)
        if (name && strcmp(s_all[i]->name, name) == 0)
            return s_all[i];
    if (name && !strcmp(name, s_gpt.name))
        return &s_gpt;
    tp_error(TP_ERR_INVALID, "unknown model '%s' (mlp, cnn, cnn-bn, resnet, resnet18, "
             "resnet50, gpt)",
             name ? name : "(null)");
    return NULL;
}
