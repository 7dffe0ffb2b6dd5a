/* towerpack tests: ResidentInput (the data set in the towers' memory,
 * batches made there) on the CPU backend: what one batch holds, worked out
 * by hand; a pass is a permutation with the remainder dropped; a resumed
 * stream replays the picks; towers take batches in turn; lent slots are
 * bounded; bad data and bad picks are named; a model trains from it. The
 * host reference against numpy is test_proc_resident, the device's
 * kernel against the host test_cuda_ops' augment_batch_matches_the_host. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <towerpack/towerpack.h>
#include <towerpack/launch.h>
#include "train_testutil.h"

/* ---- tp_backend_augment_batch, by hand ---------------------------------- */

/* A 3x3 image 1..9, padded by 1 (5x5 with a zero border), cropped 3x3 at
 * (0, 1) and mirrored:
 *   padded rows 0..2, columns 1..3:  0 0 0 / 1 2 3 / 4 5 6
 *   mirrored:                         0 0 0 / 3 2 1 / 6 5 4
 * normalised as (v - 1) / 2. */
Test(augment_batch, one_batch_worked_out_by_hand) {
    tp_backend_t *b = tp_backend_cpu_new(0);
    uint8_t img[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int32_t lab[1] = {7}, lo[2] = {-1, -1};
    tp_augment_pick_t picks[2] = {{0, 0, 1, 1}, {0, 1, 1, 0}};
    tp_augment_shape_t sh = {3, 3, 1, 3, 3, 1, {1}, {0.5f}};
    float out[18];
    cr_assert_eq(tp_backend_augment_batch(b, NULL, out, lo, img, lab, 1, picks, 2, &sh),
                 TP_OK, "%s", tp_last_error());
    const float want0[9] = {-0.5f, -0.5f, -0.5f, 1, 0.5f, 0, 2.5f, 2, 1.5f};
    /* the second: (1, 1) unmirrored is the image itself */
    for (int i = 0; i < 9; i++) {
        cr_assert_eq(out[i], want0[i], "pixel %d: %g, want %g", i, out[i], want0[i]);
        cr_assert_eq(out[9 + i], (img[i] - 1) * 0.5f, "pixel %d of the second", i);
    }
    cr_assert_eq(lo[0], 7);
    cr_assert_eq(lo[1], 7);
    tp_backend_destroy(&b);
}

Test(augment_batch, bad_picks_and_shapes_are_named) {
    tp_backend_t *b = tp_backend_cpu_new(0);
    uint8_t img[2 * 9] = {0};
    float out[9];
    tp_augment_shape_t sh = {3, 3, 1, 3, 3, 1, {0}, {1}};
    tp_augment_pick_t p = {2, 0, 0, 0};
    cr_assert_eq(tp_backend_augment_batch(b, NULL, out, NULL, img, NULL, 2, &p, 1, &sh),
                 TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "pick 0 {image 2, y 0, x 0, flip 0} outside "
                                      "images 0..1, y 0..2, x 0..2"), "%s", tp_last_error());
    p = (tp_augment_pick_t){0, 3, 0, 0};
    cr_assert_eq(tp_backend_augment_batch(b, NULL, out, NULL, img, NULL, 2, &p, 1, &sh),
                 TP_ERR_INVALID);
    sh.crop_h = 6;  /* larger than the padded image */
    p = (tp_augment_pick_t){0, 0, 0, 0};
    cr_assert_eq(tp_backend_augment_batch(b, NULL, out, NULL, img, NULL, 2, &p, 1, &sh),
                 TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "crop 6x3"), "%s", tp_last_error());
    tp_backend_destroy(&b);
}

/* ---- the input ------------------------------------------------------------ */

/* n datapoints [image uint8 [h,w] all = i % 251, label int32 i]: each
 * image says which it is, and so does its label. */
typedef struct {
    int n, h, w, i;
    int bad_at;   /* this one is float32 (-1: none) */
} s_src_t;

static tp_status_t src_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                             uint64_t stream) {
    (void)rng, (void)seed, (void)stream;
    ((s_src_t *)impl)->i = 0;
    return TP_OK;
}
static tp_status_t src_begin(void *impl) {
    ((s_src_t *)impl)->i = 0;
    return TP_OK;
}
static tp_status_t src_next(void *impl, tp_datapoint_t **out) {
    s_src_t *s = impl;
    if (s->i >= s->n)
        return TP_DONE;
    tp_datapoint_t *dp = tp_datapoint_new(2);
    int64_t shape[2] = {s->h, s->w};
    tp_tensor_t *im = tp_datapoint_get(dp, 0);
    tp_tensor_init(im, s->i == s->bad_at ? TP_FLOAT32 : TP_UINT8, 2, shape);
    memset(im->data, s->i % 251, im->nbytes);
    tp_tensor_init(tp_datapoint_get(dp, 1), TP_INT32, 0, NULL);
    *(int32_t *)tp_datapoint_get(dp, 1)->data = s->i++;
    *out = dp;
    return TP_OK;
}
static int64_t src_size(void *impl) { return ((s_src_t *)impl)->n; }
static void src_destroy(void *impl) { free(impl); }
static const tp_dataflow_ops_t s_src_ops = {
    .name = "numbered", .reset_state = src_reset, .begin = src_begin,
    .next = src_next, .size = src_size, .destroy = src_destroy,
};

static tp_input_t *s_input(int n, int batch, int pad, int flip, int bad_at) {
    s_src_t *s = calloc(1, sizeof *s);
    *s = (s_src_t){n, 4, 4, 0, bad_at};
    tp_resident_opts_t o;
    tp_resident_opts_init(&o);
    o.batch = batch;
    o.pad = pad;
    o.flip = flip;
    tp_input_t *in = tp_input_resident(tp_dataflow_new(&s_src_ops, s), &o);
    cr_assert_not_null(in, "%s", tp_last_error());
    return in;
}

/* The labels of a batch; checks each image is its label's (no crop). */
static void s_labels(tp_datapoint_t *dp, int batch, int32_t *out) {
    const tp_tensor_t *im = tp_datapoint_cget(dp, 0), *lb = tp_datapoint_cget(dp, 1);
    cr_assert_eq(im->dtype, TP_FLOAT32);
    cr_assert_eq(im->ndim, 3);
    cr_assert_eq(im->shape[0], batch);
    cr_assert_eq(lb->dtype, TP_INT32);
    for (int i = 0; i < batch; i++) {
        out[i] = ((const int32_t *)lb->data)[i];
        float v = ((const float *)im->data)[i * 16 + 5];  /* an inner pixel */
        /* normalised as (v - mean) * (1 / std), std 255 */
        cr_assert_eq(v, (float)(out[i] % 251) * (1.0f / 255.0f), "image %d is not label %d's",
                     i, out[i]);
    }
}

Test(resident_input, a_pass_is_a_permutation_and_the_remainder_is_dropped) {
    tp_input_t *in = s_input(10, 4, 0, 0, -1);
    /* known before the start, from the dataflow: a launch plans its epochs
     * (and tp-train its learning rate's decay) from it */
    cr_assert_eq(tp_input_size(in), 2, "before the start: %lld", (long long)tp_input_size(in));
    cr_assert_eq(tp_input_start(in, 1, 3, 0), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_input_size(in), 2, "10 images in batches of 4: 2 (2 dropped)");
    int seen[10] = {0}, order[2][8];
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < 2; k++) {
            tp_datapoint_t *dp = NULL;
            cr_assert_eq(tp_input_next(in, 0, &dp), TP_OK, "%s", tp_last_error());
            int32_t lab[4];
            s_labels(dp, 4, lab);
            for (int i = 0; i < 4; i++) {
                order[pass][k * 4 + i] = lab[i];
                if (pass == 0)
                    seen[lab[i]]++;
            }
            tp_input_release(in, 0, &dp);
        }
    }
    int distinct = 0;
    for (int i = 0; i < 10; i++) {
        cr_assert_leq(seen[i], 1, "image %d twice in a pass", i);
        distinct += seen[i];
    }
    cr_assert_eq(distinct, 8);
    cr_assert_neq(memcmp(order[0], order[1], sizeof order[0]), 0,
                  "each pass is shuffled anew");
    tp_input_destroy(&in);
}

Test(resident_input, resuming_replays_the_stream) {
    /* crops and flips drawn too: every pick of batch 5 must match */
    tp_input_t *a = s_input(50, 6, 2, 1, -1), *b = s_input(50, 6, 2, 1, -1);
    cr_assert_eq(tp_input_start(a, 2, 9, 0), TP_OK);
    cr_assert_eq(tp_input_start(b, 2, 9, 5), TP_OK);
    tp_datapoint_t *x = NULL, *y = NULL;
    for (int k = 0; k < 5; k++) {
        cr_assert_eq(tp_input_next(a, k % 2, &x), TP_OK);
        tp_input_release(a, k % 2, &x);
    }
    for (int k = 5; k < 12; k++) {  /* over a pass boundary (8 batches a pass) */
        cr_assert_eq(tp_input_next(a, k % 2, &x), TP_OK);
        cr_assert_eq(tp_input_next(b, k % 2, &y), TP_OK);
        const tp_tensor_t *ta = tp_datapoint_cget(x, 0), *tb = tp_datapoint_cget(y, 0);
        cr_assert_eq(memcmp(ta->data, tb->data, ta->nbytes), 0, "batch %d", k);
        cr_assert_eq(memcmp(tp_datapoint_cget(x, 1)->data, tp_datapoint_cget(y, 1)->data,
                            6 * sizeof(int32_t)), 0, "labels of batch %d", k);
        tp_input_release(a, k % 2, &x);
        tp_input_release(b, k % 2, &y);
    }
    tp_input_destroy(&a);
    tp_input_destroy(&b);
}

Test(resident_input, slots_are_bounded_and_come_back) {
    tp_input_t *in = s_input(40, 2, 0, 0, -1);
    cr_assert_eq(tp_input_start(in, 2, 1, 0), TP_OK);
    tp_datapoint_t *held[5] = {NULL};
    for (int i = 0; i < 5; i++)  /* 2 x towers + 1 slots */
        cr_assert_eq(tp_input_next(in, i % 2, &held[i]), TP_OK, "%s", tp_last_error());
    tp_datapoint_t *more = NULL;
    cr_assert_eq(tp_input_next(in, 1, &more), TP_ERR_STATE);
    cr_assert(strstr(tp_last_error(), "all 5 batch slots are lent"), "%s", tp_last_error());
    tp_input_release(in, 0, &held[2]);
    cr_assert_eq(tp_input_next(in, 1, &more), TP_OK, "a slot came back");
    tp_input_release(in, 1, &more);
    for (int i = 0; i < 5; i++)
        tp_input_release(in, 0, &held[i]);
    tp_input_destroy(&in);
}

Test(resident_input, a_bad_datapoint_is_named) {
    tp_input_t *in = s_input(10, 2, 0, 0, 6);
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_ERR_SHAPE);
    cr_assert(strstr(tp_last_error(), "datapoint 6 of numbered is image float32"),
              "%s", tp_last_error());
    tp_input_destroy(&in);
    in = s_input(3, 4, 0, 0, -1);
    cr_assert_eq(tp_input_start(in, 1, 1, 0), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "3 images, fewer than one batch of 4"), "%s",
              tp_last_error());
    tp_input_destroy(&in);
}

/* ---- training from it ---------------------------------------------------- */

/* Two classes told apart by brightness: dark images (label 0) and bright
 * ones (label 1), with noise; the crop and flip do not change the class. */
typedef struct {
    int i, n;
    tp_rng_t r;
} s_two_t;

static tp_status_t two_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                             uint64_t stream) {
    (void)rng, (void)stream;
    s_two_t *t = impl;
    tp_rng_init(&t->r, seed, 3);
    t->i = 0;
    return TP_OK;
}
static tp_status_t two_begin(void *impl) {
    ((s_two_t *)impl)->i = 0;
    return TP_OK;
}
static tp_status_t two_next(void *impl, tp_datapoint_t **out) {
    s_two_t *t = impl;
    if (t->i >= t->n)
        return TP_DONE;
    int label = t->i++ & 1;
    tp_datapoint_t *dp = tp_datapoint_new(2);
    int64_t shape[2] = {8, 8};
    tp_tensor_t *im = tp_datapoint_get(dp, 0);
    tp_tensor_init(im, TP_UINT8, 2, shape);
    for (int k = 0; k < 64; k++)
        ((uint8_t *)im->data)[k] = (uint8_t)((label ? 150 : 40) + tp_rng_below(&t->r, 60));
    tp_tensor_init(tp_datapoint_get(dp, 1), TP_INT32, 0, NULL);
    *(int32_t *)tp_datapoint_get(dp, 1)->data = label;
    *out = dp;
    return TP_OK;
}
static int64_t two_size(void *impl) { return ((s_two_t *)impl)->n; }
static const tp_dataflow_ops_t s_two_ops = {
    .name = "two-brightnesses", .reset_state = two_reset, .begin = two_begin,
    .next = two_next, .size = two_size, .destroy = src_destroy,
};

static tp_status_t s_tower(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *logits = tp_fc(t, "fc", in[0], 2, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, cost);
}
static tp_optimizer_t *s_opt(void *user) {
    (void)user;
    return tp_optimizer_sgd(0.1, 0.9, 0);
}

Test(resident_input, a_model_trains_from_it_with_two_towers) {
    static const tp_input_desc_t inputs[] = {
        {"image", TP_FLOAT32, 3, {-1, 6, 6}},
        {"label", TP_INT32, 1, {-1}},
    };
    tp_model_desc_t desc = {inputs, 2, s_tower, s_opt, NULL};
    s_two_t *t = calloc(1, sizeof *t);
    t->n = 400;
    tp_resident_opts_t o;
    tp_resident_opts_init(&o);
    o.batch = 16;
    o.crop_h = o.crop_w = 6;
    o.pad = 1;
    o.flip = 1;
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = &desc;
    c.input = tp_input_resident(tp_dataflow_new(&s_two_ops, t), &o);
    cr_assert_not_null(c.input);
    c.towers = 2;
    c.batch = 16;
    c.max_epoch = 3;
    c.threads = 1;
    c.stats = "off";
    c.default_callbacks = 0;
    tp_model_t *m = NULL;
    cr_assert_eq(tp_launch_train_with_config(&c, &m), TP_OK, "%s", tp_last_error());
    /* 400 images / (16 x 2) = 12 steps an epoch; the last step's accuracy */
    cr_assert_gt(tp_model_metric_value(m, 0, 0), 0.9f);
    tp_model_destroy(&m);
}
