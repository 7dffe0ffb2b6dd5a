/* towerpack tests: safetensors checkpoints: bit-exact round trips, resume,
 * strict and relaxed loading, malformed files, and damaged ones (checksums,
 * non-finite values, bad metadata, FIFOs). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/predict.h>
#include <towerpack/towerpack.h>
#include "ckpt_testutil.h"

static char s_dir[256];

static void s_setup(void) {
    snprintf(s_dir, sizeof s_dir, "/tmp/tp_ckpt_XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
}

static void s_teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    cr_expect_eq(system(cmd), 0);
}

static const char *s_path(const char *name) {
    static char p[4][320];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", s_dir, name);
    return p[k];
}

static int s_units = 16;
static int s_extra;

static tp_status_t s_net(tp_tower_t *t, tp_node_t *const *in, void *u) {
    (void)u;
    tp_node_t *h = tp_fc(t, "fc1", in[0], s_units, 0);
    h = tp_dropout(t, "drop", tp_relu(t, NULL, tp_batch_norm(t, "bn1", h)), 0.25f);
    tp_node_t *logits = tp_fc(t, "fc2", h, 3, 1);
    if (s_extra) /* a side branch: same shapes elsewhere, two more tensors */
        logits = tp_add(t, NULL, logits, tp_fc(t, "extra", h, 3, 1));
    return tp_tower_set_cost(t, tp_softmax_xent(t, "xent", logits, in[1]));
}

static int s_use_sgd;

static tp_optimizer_t *s_opt(void *u) {
    (void)u;
    return s_use_sgd ? tp_optimizer_sgd(0.1, 0.9, 0)
                     : tp_optimizer_adam(0.01, 0.9, 0.999, 1e-8);
}

static tp_model_t *s_model(uint64_t seed) {
    tp_input_desc_t desc[2] = {{"x", TP_FLOAT32, 2, {-1, 5}},
                               {"y", TP_INT32, 1, {-1}}};
    tp_model_desc_t md = {desc, 2, s_net, s_opt, NULL};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = 8;
    cfg.seed = seed;
    tp_model_t *m = tp_model_new(&md, &cfg);
    cr_assert_not_null(m, "%s", tp_last_error());
    return m;
}

static void s_step(tp_model_t *m, int k) {
    float x[8 * 5];
    int32_t y[8];
    tp_rng_t r;
    tp_rng_init(&r, 99, (uint64_t)k);
    for (int i = 0; i < 40; i++)
        x[i] = (float)tp_rng_normal(&r);
    for (int i = 0; i < 8; i++)
        y[i] = (int32_t)tp_rng_below(&r, 3);
    int64_t xs[2] = {8, 5}, ys[1] = {8};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_FLOAT32, 2, xs, x, NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ys, y, NULL, NULL);
    cr_assert_eq(tp_model_run(m, 0, in, 2, NULL, 0, NULL), TP_OK, "%s",
                 tp_last_error());
}

static char *s_slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static void s_expect_same_vars(tp_model_t *a, tp_model_t *b) {
    cr_assert_eq(tp_model_var_count(a), tp_model_var_count(b));
    for (int i = 0; i < tp_model_var_count(a); i++) {
        tp_tensor_t va, vb;
        const char *name = tp_model_var_name(a, i);
        cr_assert_eq(tp_model_var(a, name, &va), TP_OK);
        cr_assert_eq(tp_model_var(b, name, &vb), TP_OK);
        cr_expect(tp_tensor_equal(&va, &vb), "%s differs", name);
    }
}

TestSuite(checkpoint, .init = s_setup, .fini = s_teardown);

Test(checkpoint, round_trip_is_bit_exact_and_resumes) {
    s_use_sgd = 0;
    tp_model_t *a = s_model(1), *b = s_model(2);
    for (int k = 0; k < 3; k++)
        s_step(a, k);
    tp_train_state_t st = {.epoch = 4, .global_step = 3};
    tp_rng_init(&st.rng, 5, 6);
    cr_assert_eq(tp_checkpoint_save(a, s_path("a.safetensors"), &st), TP_OK,
                 "%s", tp_last_error());
    tp_train_state_t got;
    memset(&got, 0, sizeof got);
    cr_assert_eq(tp_checkpoint_load(b, s_path("a.safetensors"), TP_LOAD_STRICT, &got),
                 TP_OK, "%s", tp_last_error());
    cr_expect_eq(got.epoch, 4);
    cr_expect_eq(got.global_step, 3);
    cr_expect_eq(memcmp(&got.rng, &st.rng, sizeof st.rng), 0);
    s_expect_same_vars(a, b);
    /* saving the loaded model gives the same bytes: slots, step, RNGs too */
    cr_assert_eq(tp_checkpoint_save(b, s_path("b.safetensors"), &got), TP_OK);
    size_t na, nb;
    char *fa = s_slurp(s_path("a.safetensors"), &na);
    char *fb = s_slurp(s_path("b.safetensors"), &nb);
    cr_expect_eq(na, nb);
    cr_expect(na == nb && memcmp(fa, fb, na) == 0, "files differ");
    free(fa);
    free(fb);
    /* resumed training follows the uninterrupted run exactly */
    for (int k = 3; k < 5; k++) {
        s_step(a, k);
        s_step(b, k);
    }
    s_expect_same_vars(a, b);
    /* no temporary file is left behind */
    cr_expect_neq(access(s_path("a.safetensors.tmp"), F_OK), 0);
    tp_model_destroy(&a);
    tp_model_destroy(&b);
}

Test(checkpoint, file_is_plain_safetensors) {
    s_use_sgd = 1;
    tp_model_t *a = s_model(1);
    s_step(a, 0);
    cr_assert_eq(tp_checkpoint_save(a, s_path("c.safetensors"), NULL), TP_OK);
    tp_safetensors_t *st = NULL;
    cr_assert_eq(tp_safetensors_open(s_path("c.safetensors"), &st), TP_OK, "%s",
                 tp_last_error());
    tp_tensor_t v, w;
    cr_assert_eq(tp_safetensors_get(st, "fc1/W", &v), TP_OK);
    cr_assert_eq(tp_model_var(a, "fc1/W", &w), TP_OK);
    cr_expect(tp_tensor_equal(&v, &w));
    cr_expect_eq(tp_safetensors_get(st, "optimizer/fc1/W/momentum", &v), TP_OK);
    cr_expect_eq(tp_safetensors_get(st, "bn1/mean/EMA", &v), TP_OK);
    cr_expect_eq(tp_safetensors_get(st, "optimizer/bn1/mean/EMA/momentum", &v),
                 TP_ERR_NOT_FOUND);
    cr_expect_eq(tp_safetensors_get(st, "optimizer/step", &v), TP_OK);
    cr_expect_eq(v.dtype, TP_INT64);
    cr_expect_str_eq(tp_safetensors_meta(st, "optimizer"), "sgd");
    cr_expect_not_null(tp_safetensors_meta(st, "tower0/rng"));
    cr_expect_null(tp_safetensors_meta(st, "epoch"));
    /* the header is an 8-byte little-endian length, then JSON */
    size_t n;
    char *raw = s_slurp(s_path("c.safetensors"), &n);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)(unsigned char)raw[i] << (8 * i);
    cr_expect_eq(hl % 8, 0);
    cr_expect_eq(raw[8], '{');
    free(raw);
    tp_safetensors_destroy(&st);
    cr_expect_null(st);
    tp_model_destroy(&a);
}

/* The model's own metadata (tp_checkpoint_set_meta: tp-train's record of
 * the data) is in every checkpoint, of any length, as it was at the take;
 * keys the checkpoint writes itself are refused; the file loads as ever. */
Test(checkpoint, the_models_own_metadata_is_in_every_checkpoint) {
    s_use_sgd = 0;  /* Adam (an in-process runner keeps the last test's) */
    tp_model_t *a = s_model(1);
    s_step(a, 0);
    /* 1000 class names: far past the fixed metadata slots */
    size_t cap = 1000 * 16 + 3, o = 0;
    char *names = malloc(cap);
    o += (size_t)snprintf(names + o, cap - o, "[");
    for (int i = 0; i < 1000; i++)
        o += (size_t)snprintf(names + o, cap - o, "%s\"class %d\"", i ? "," : "", i);
    snprintf(names + o, cap - o, "]");
    cr_assert_eq(tp_checkpoint_set_meta(a, "class_names", names), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_checkpoint_set_meta(a, "channels", "1"), TP_OK);
    cr_assert_eq(tp_checkpoint_set_meta(a, "channels", "3"), TP_OK);  /* replaced */
    cr_assert_eq(tp_checkpoint_set_meta(a, "gone", "x"), TP_OK);
    cr_assert_eq(tp_checkpoint_set_meta(a, "gone", NULL), TP_OK);     /* removed */
    cr_expect_str_eq(tp_checkpoint_get_meta(a, "channels"), "3");
    cr_expect_null(tp_checkpoint_get_meta(a, "gone"));
    static const char *const reserved[] = {"model", "epoch", "rng", "tower0/rng",
                                           "optimizer/learning_rate",
                                           TP_SAFETENSORS_CHECKSUM_KEY, ""};
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) {
        cr_expect_eq(tp_checkpoint_set_meta(a, reserved[i], "x"), TP_ERR_INVALID, "%s",
                     reserved[i]);
        cr_expect_null(tp_checkpoint_get_meta(a, reserved[i]));
    }
    /* taken now, changed after the take, written later: the take's value */
    tp_checkpoint_snapshot_t *snap = tp_checkpoint_snapshot_new();
    cr_assert_eq(tp_checkpoint_snapshot_take(snap, a, NULL), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_checkpoint_set_meta(a, "channels", "1"), TP_OK);
    cr_assert_eq(tp_checkpoint_snapshot_write(snap, s_path("m.safetensors")), TP_OK);
    tp_checkpoint_snapshot_destroy(&snap);
    tp_safetensors_t *st = NULL;
    cr_assert_eq(tp_safetensors_open(s_path("m.safetensors"), &st), TP_OK, "%s",
                 tp_last_error());
    cr_expect_str_eq(tp_safetensors_meta(st, "class_names"), names);
    cr_expect_str_eq(tp_safetensors_meta(st, "channels"), "3");
    cr_expect_null(tp_safetensors_meta(st, "gone"));
    cr_expect_str_eq(tp_safetensors_meta(st, "optimizer"), "adam");  /* its own still */
    int checked = 0;
    cr_expect_eq(tp_safetensors_verify(st, "m", &checked), TP_OK, "%s", tp_last_error());
    cr_expect(checked);
    tp_safetensors_destroy(&st);
    /* and a model without the keys loads it strictly, as any checkpoint */
    tp_model_t *b = s_model(2);
    cr_expect_eq(tp_checkpoint_load(b, s_path("m.safetensors"), TP_LOAD_STRICT, NULL), TP_OK,
                 "%s", tp_last_error());
    cr_expect_null(tp_checkpoint_get_meta(b, "channels"));
    /* at most TP_CHECKPOINT_MAX_META keys of the model's own */
    char key[32];
    int n = 2;  /* class_names and channels */
    for (; n < TP_CHECKPOINT_MAX_META; n++) {
        snprintf(key, sizeof key, "k%d", n);
        cr_assert_eq(tp_checkpoint_set_meta(a, key, "v"), TP_OK);
    }
    cr_expect_eq(tp_checkpoint_set_meta(a, "one-too-many", "v"), TP_ERR_INVALID);
    cr_expect_eq(tp_checkpoint_set_meta(a, "k2", "w"), TP_OK);  /* replacing still works */
    free(names);
    tp_model_destroy(&b);
    tp_model_destroy(&a);
}

Test(checkpoint, strict_errors_and_relaxed_mode) {
    s_use_sgd = 1;
    s_extra = 0;
    tp_model_t *small = s_model(1);
    cr_assert_eq(tp_checkpoint_save(small, s_path("s.safetensors"), NULL), TP_OK);
    s_extra = 1;
    tp_model_t *big = s_model(1);
    cr_assert_eq(tp_checkpoint_save(big, s_path("b.safetensors"), NULL), TP_OK);
    /* missing tensors: the small file into the big model */
    cr_expect_eq(tp_checkpoint_load(big, s_path("s.safetensors"), 0, NULL),
                 TP_ERR_NOT_FOUND);
    cr_expect(strstr(tp_last_error(), "missing") && strstr(tp_last_error(), "extra/W"),
              "%s", tp_last_error());
    /* unexpected tensors: the big file into the small model */
    s_extra = 0;
    cr_expect_eq(tp_checkpoint_load(small, s_path("b.safetensors"), 0, NULL),
                 TP_ERR_NOT_FOUND);
    cr_expect(strstr(tp_last_error(), "unexpected") && strstr(tp_last_error(), "extra/b"),
              "%s", tp_last_error());
    cr_expect_eq(tp_checkpoint_load(small, s_path("b.safetensors"), TP_LOAD_RELAXED,
                                    NULL), TP_OK, "%s", tp_last_error());
    /* mis-shaped: other units; the model stays unchanged on failure */
    s_units = 12;
    tp_model_t *other = s_model(3);
    tp_tensor_t before, after;
    cr_assert_eq(tp_model_var(other, "fc2/W", &before), TP_OK);
    float keep = ((float *)before.data)[0];
    cr_expect_eq(tp_checkpoint_load(other, s_path("s.safetensors"), TP_LOAD_RELAXED,
                                    NULL), TP_ERR_SHAPE);
    cr_expect(strstr(tp_last_error(), "fc1/W") && strstr(tp_last_error(), "mis-shaped"),
              "%s", tp_last_error());
    cr_assert_eq(tp_model_var(other, "fc2/W", &after), TP_OK);
    cr_expect_eq(((float *)after.data)[0], keep);
    s_units = 16;
    /* weights only: an Adam model takes an SGD checkpoint's weights */
    s_use_sgd = 0;
    tp_model_t *adam = s_model(4);
    cr_expect_eq(tp_checkpoint_load(adam, s_path("s.safetensors"), 0, NULL),
                 TP_ERR_NOT_FOUND);
    cr_expect_eq(tp_checkpoint_load(adam, s_path("s.safetensors"),
                                    TP_LOAD_WEIGHTS_ONLY, NULL), TP_OK, "%s",
                 tp_last_error());
    s_expect_same_vars(adam, small);
    cr_expect_eq(tp_checkpoint_load(adam, s_path("nonexistent"), 0, NULL),
                 TP_ERR_NOT_FOUND);
    cr_expect_eq(tp_checkpoint_save(adam, "/nonexistent-dir/x.safetensors", NULL),
                 TP_ERR_IO);
    tp_model_destroy(&small);
    tp_model_destroy(&big);
    tp_model_destroy(&other);
    tp_model_destroy(&adam);
}

/* ---- malformed files ---------------------------------------------------- */

static tp_status_t s_parse_hdr(const char *json, size_t data_bytes) {
    size_t hl = strlen(json);
    size_t n = 8 + hl + data_bytes;
    unsigned char *buf = calloc(1, n);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    tp_safetensors_t *st = NULL;
    tp_status_t rc = tp_safetensors_parse(buf, n, "test", &st);
    if (rc == TP_OK)
        cr_expect_not_null(st);
    tp_safetensors_destroy(&st);
    free(buf);
    return rc;
}

Test(checkpoint_format, hand_written_file_parses) {
    cr_expect_eq(s_parse_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                             "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"U8\","
                             "\"shape\":[],\"data_offsets\":[8,9]},"
                             "\"__metadata__\":{\"k\":\"v\"}}", 9),
                 TP_OK, "%s", tp_last_error());
    cr_expect_eq(s_parse_hdr("{}", 0), TP_OK, "%s", tp_last_error());
}

#define BAD_HDR(nm, json, bytes, needle)                                      \
    Test(checkpoint_format, nm) {                                             \
        cr_expect_eq(s_parse_hdr(json, bytes), TP_ERR_FORMAT);                \
        cr_expect(strstr(tp_last_error(), needle) != NULL, "%s",             \
                  tp_last_error());                                           \
    }

BAD_HDR(not_json, "{\"a\": nope}", 0, "JSON")
BAD_HDR(not_object, "[1,2]", 0, "object")
BAD_HDR(unknown_dtype, "{\"a\":{\"dtype\":\"F8_E4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "dtype")
BAD_HDR(offsets_out_of_bounds, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "outside")
BAD_HDR(shape_size_mismatch, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12")
BAD_HDR(overlap, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap")
BAD_HDR(gap, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap")
BAD_HDR(trailing_bytes, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "trailing")
BAD_HDR(negative_dim, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape")
BAD_HDR(metadata_not_string, "{\"__metadata__\":{\"k\":1}}", 0, "metadata")
BAD_HDR(missing_field, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets")
BAD_HDR(duplicate_key, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "JSON")
BAD_HDR(huge_shape, "{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8, "overflow")

Test(checkpoint_format, header_length_beyond_file) {
    unsigned char buf[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    tp_safetensors_t *st = NULL;
    cr_expect_eq(tp_safetensors_parse(buf, sizeof buf, "x", &st), TP_ERR_FORMAT);
    cr_expect(strstr(tp_last_error(), "exceeds") != NULL, "%s", tp_last_error());
    cr_expect_eq(tp_safetensors_parse(buf, 5, "x", &st), TP_ERR_FORMAT);
    cr_expect_null(st);
}

TestSuite(checkpoint_trunc, .init = s_setup, .fini = s_teardown);

Test(checkpoint_trunc, every_truncation_is_a_clear_error) {
    s_use_sgd = 0;
    s_extra = 0;
    tp_model_t *a = s_model(1);
    cr_assert_eq(tp_checkpoint_save(a, s_path("t.safetensors"), NULL), TP_OK);
    size_t n;
    char *raw = s_slurp(s_path("t.safetensors"), &n);
    size_t step = n / 200 + 1;
    for (size_t cut = 0; cut < n; cut += step) {
        FILE *f = fopen(s_path("cut.safetensors"), "wb");
        cr_assert_eq(fwrite(raw, 1, cut, f), cut);
        fclose(f);
        tp_status_t rc = tp_checkpoint_load(a, s_path("cut.safetensors"), 0, NULL);
        cr_assert_eq(rc, TP_ERR_FORMAT, "cut at %zu of %zu: %d %s", cut, n, rc,
                     tp_last_error());
    }
    /* flipped bytes in the header are caught or harmless, never a crash */
    for (size_t i = 8; i < 200 && i < n; i += 3) {
        char keep = raw[i];
        raw[i] ^= 0x5a;
        tp_safetensors_t *st = NULL;
        tp_status_t rc = tp_safetensors_parse(raw, n, "flip", &st);
        cr_expect(rc == TP_OK || rc == TP_ERR_FORMAT, "flip %zu: %d", i, rc);
        tp_safetensors_destroy(&st);
        raw[i] = keep;
    }
    free(raw);
    tp_model_destroy(&a);
}

/* ---- damaged files: checksums, values, metadata, non-regular files --------
 * (issue 48) Each test damages a real checkpoint the way a disk, an editor
 * or a hostile user would, and expects the load refused with the file and
 * the tensor or key named, the model unchanged. */

/* A trained Adam checkpoint with trainer state (epoch 2 of 3 steps) at
 * s_path("good.safetensors"); the model that wrote it. */
static tp_model_t *s_good(void) {
    s_use_sgd = 0;
    s_extra = 0;
    s_units = 16;
    tp_model_t *m = s_model(1);
    for (int k = 0; k < 6; k++)
        s_step(m, k);
    tp_train_state_t st = {.epoch = 2, .global_step = 6};
    tp_rng_init(&st.rng, 5, 6);
    cr_assert_eq(tp_checkpoint_save(m, s_path("good.safetensors"), &st), TP_OK, "%s",
                 tp_last_error());
    return m;
}

/* Every loader refuses path with TP_ERR_FORMAT and a message holding each
 * of the needles (NULL-terminated); the model is unchanged. */
static void s_refused(tp_model_t *m, const char *path, int flags, const char *const *needles) {
    tp_tensor_t before;
    cr_assert_eq(tp_model_var(m, "fc2/b", &before), TP_OK);
    float keep[3];
    memcpy(keep, before.data, sizeof keep);
    tp_status_t rc = tp_checkpoint_load(m, path, flags, NULL);
    cr_expect_eq(rc, TP_ERR_FORMAT, "load of %s: %d %s", path, rc, tp_last_error());
    for (int i = 0; needles[i]; i++)
        cr_expect(strstr(tp_last_error(), needles[i]), "load: no '%s' in: %s", needles[i],
                  tp_last_error());
    cr_expect(strstr(tp_last_error(), path), "load: no file in: %s", tp_last_error());
    tp_tensor_t after;
    cr_assert_eq(tp_model_var(m, "fc2/b", &after), TP_OK);
    cr_expect_eq(memcmp(keep, after.data, sizeof keep), 0, "the model changed");
    rc = tp_checkpoint_verify(path, 3, NULL);
    cr_expect_eq(rc, TP_ERR_FORMAT, "verify of %s: %d %s", path, rc, tp_last_error());
    for (int i = 0; needles[i]; i++)
        cr_expect(strstr(tp_last_error(), needles[i]), "verify: no '%s' in: %s", needles[i],
                  tp_last_error());
}

TestSuite(checkpoint_verify, .init = s_setup, .fini = s_teardown);

Test(checkpoint_verify, saved_checkpoints_carry_checksums_that_verify) {
    tp_model_t *m = s_good();
    tp_safetensors_t *st = NULL;
    cr_assert_eq(tp_safetensors_open(s_path("good.safetensors"), &st), TP_OK);
    const char *sums = tp_safetensors_meta(st, TP_SAFETENSORS_CHECKSUM_KEY);
    cr_assert_not_null(sums);
    cr_expect_eq(strlen(sums), 17 * tp_safetensors_count(st) - 1, "%s", sums);
    int checked = 0;
    cr_expect_eq(tp_safetensors_verify(st, "good", &checked), TP_OK, "%s", tp_last_error());
    cr_expect_eq(checked, 1);
    tp_safetensors_destroy(&st);
    tp_train_state_t got;
    cr_expect_eq(tp_checkpoint_verify(s_path("good.safetensors"), 3, &got), TP_OK, "%s",
                 tp_last_error());
    cr_expect_eq(got.epoch, 2);
    cr_expect_eq(got.global_step, 6);
    cr_expect_eq(tp_checkpoint_load(m, s_path("good.safetensors"), 0, NULL), TP_OK, "%s",
                 tp_last_error());
    tp_model_destroy(&m);
}

/* Empty tensors share their start with the next one: the sums still
 * follow the file's order, and a hand-made list in the wrong order fails. */
Test(checkpoint_verify, empty_tensors_keep_the_sums_in_file_order) {
    tp_tensor_t t[3];
    int64_t s0[1] = {0}, s1[1] = {3};
    tp_tensor_init(&t[0], TP_FLOAT32, 1, s0);
    tp_tensor_init(&t[1], TP_FLOAT32, 1, s1);
    tp_tensor_init(&t[2], TP_FLOAT32, 1, s0);
    float v[3] = {1, 2, 3};
    memcpy(t[1].data, v, sizeof v);
    /* "z" (empty) lies where "a" starts; "m" (empty) at the end */
    tp_named_tensor_t nt[3] = {{"z", &t[0]}, {"a", &t[1]}, {"m", &t[2]}};
    cr_assert_eq(tp_safetensors_write(s_path("e.safetensors"), nt, 3, NULL, 0), TP_OK);
    tp_safetensors_t *st = NULL;
    cr_assert_eq(tp_safetensors_open(s_path("e.safetensors"), &st), TP_OK);
    int checked = 0;
    cr_expect_eq(tp_safetensors_verify(st, "e", &checked), TP_OK, "%s", tp_last_error());
    cr_expect_eq(checked, 1);
    tp_safetensors_destroy(&st);
    for (int i = 0; i < 3; i++)
        tp_tensor_fini(&t[i]);
}

/* Bit flips in one tensor's bytes: every loader names the file and that
 * tensor (issue 48: 20 flips loaded silently and predicted at 0.42). */
static void s_flip(json_t *root, json_t *meta, unsigned char *data, void *u) {
    (void)meta;
    size_t b, e;
    ckpt_span(root, (const char *)u, &b, &e);
    tp_rng_t r;
    tp_rng_init(&r, 48, 0);
    for (int i = 0; i < 20; i++)
        data[b + tp_rng_below(&r, e - b)] ^= (unsigned char)(1u << tp_rng_below(&r, 8));
}

Test(checkpoint_verify, bit_flips_in_tensor_data_are_refused_naming_file_and_tensor) {
    tp_model_t *m = s_good();
    static const char *names[] = {"fc1/W", "fc2/b", "bn1/mean/EMA", "optimizer/fc1/W/m",
                                  "optimizer/step"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        ckpt_edit(s_path("good.safetensors"), s_path("flip.safetensors"), s_flip,
               (void *)names[i], 0);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "tensor '%s' fails its checksum", names[i]);
        const char *needles[] = {quoted, "damaged", NULL};
        s_refused(m, s_path("flip.safetensors"), TP_LOAD_STRICT, needles);
        if (strncmp(names[i], "optimizer/", 10))  /* weights only reads it too */
            s_refused(m, s_path("flip.safetensors"), TP_LOAD_WEIGHTS_ONLY, needles);
    }
    tp_model_destroy(&m);
}

static void s_nan_bias(json_t *root, json_t *meta, unsigned char *data, void *u) {
    (void)meta;
    size_t b, e;
    ckpt_span(root, (const char *)u, &b, &e);
    float v = *(const char *)u == 'o' ? INFINITY : NAN;
    memcpy(data + b + 4, &v, sizeof v); /* element 1 */
}

Test(checkpoint_verify, non_finite_values_are_refused_naming_file_and_tensor) {
    tp_model_t *m = s_good();
    /* the sums fixed up: the value check itself must catch it */
    ckpt_edit(s_path("good.safetensors"), s_path("nan.safetensors"), s_nan_bias, "fc2/b", 1);
    const char *nan[] = {"tensor 'fc2/b' holds NaN (element 1 of 3)", "non-finite", NULL};
    s_refused(m, s_path("nan.safetensors"), TP_LOAD_WEIGHTS_ONLY, nan);
    s_refused(m, s_path("nan.safetensors"), TP_LOAD_STRICT, nan);
    ckpt_edit(s_path("good.safetensors"), s_path("inf.safetensors"), s_nan_bias,
           "optimizer/fc2/b/v", 1);
    const char *inf[] = {"tensor 'optimizer/fc2/b/v' holds +inf", NULL};
    s_refused(m, s_path("inf.safetensors"), TP_LOAD_STRICT, inf);
    /* weights only never loads the slot: that load goes through */
    cr_expect_eq(tp_checkpoint_load(m, s_path("inf.safetensors"), TP_LOAD_WEIGHTS_ONLY, NULL),
                 TP_OK, "%s", tp_last_error());
    tp_model_destroy(&m);
}

static void s_drop_sums(json_t *root, json_t *meta, unsigned char *data, void *u) {
    (void)root, (void)data, (void)u;
    json_object_del(meta, TP_SAFETENSORS_CHECKSUM_KEY);
}

Test(checkpoint_verify, a_checkpoint_without_checksums_loads_with_one_warning) {
    tp_model_t *m = s_good();
    ckpt_edit(s_path("good.safetensors"), s_path("old1.safetensors"), s_drop_sums, NULL, 0);
    ckpt_edit(s_path("good.safetensors"), s_path("old2.safetensors"), s_drop_sums, NULL, 0);
    tp_log_set_level(TP_LOG_WARN);
    cr_assert_eq(tp_log_set_file(s_path("log")), TP_OK);
    tp_train_state_t st;
    cr_expect_eq(tp_checkpoint_load(m, s_path("old1.safetensors"), 0, &st), TP_OK, "%s",
                 tp_last_error());
    cr_expect_eq(st.global_step, 6);
    cr_expect_eq(tp_checkpoint_load(m, s_path("old1.safetensors"), 0, NULL), TP_OK);
    cr_expect_eq(tp_checkpoint_verify(s_path("old2.safetensors"), 3, NULL), TP_OK, "%s",
                 tp_last_error());
    tp_log_set_file(NULL);
    size_t n;
    char *log = s_slurp(s_path("log"), &n);
    log[n] = '\0';  /* s_slurp leaves room for it */
    char *first = strstr(log, "has no checksum");
    cr_expect(first && strstr(log, "old1.safetensors"), "%s", log);
    cr_expect(first && !strstr(first + 1, "has no checksum"), "warned twice:\n%s", log);
    free(log);
    tp_model_destroy(&m);
}

static void s_set_step(json_t *root, json_t *meta, unsigned char *data, void *u) {
    (void)meta;
    size_t b, e;
    ckpt_span(root, "optimizer/step", &b, &e);
    memcpy(data + b, u, sizeof(int64_t));
}

static void s_set_meta(json_t *root, json_t *meta, unsigned char *data, void *u) {
    (void)root, (void)data;
    const char *const *kv = u;
    json_object_set_new(meta, kv[0], json_string(kv[1]));
}

Test(checkpoint_verify, bad_metadata_is_refused_naming_file_and_key) {
    tp_model_t *m = s_good();
    int64_t steps[2] = {-1, INT64_MAX};
    for (int i = 0; i < 2; i++) {
        ckpt_edit(s_path("good.safetensors"), s_path("step.safetensors"), s_set_step, &steps[i], 1);
        const char *needles[] = {"'optimizer/step'", "outside 0..2^53", NULL};
        s_refused(m, s_path("step.safetensors"), TP_LOAD_STRICT, needles);
    }
    const char *neg[2] = {"epoch", "-3"};
    ckpt_edit(s_path("good.safetensors"), s_path("ep.safetensors"), s_set_meta, neg, 1);
    const char *nneg[] = {"metadata 'epoch' is '-3'", NULL};
    s_refused(m, s_path("ep.safetensors"), TP_LOAD_STRICT, nneg);
    /* global_step 7 in epoch 2 at 3 steps per epoch: only a schedule sees it */
    const char *gs[2] = {"global_step", "7"};
    ckpt_edit(s_path("good.safetensors"), s_path("gs.safetensors"), s_set_meta, gs, 1);
    cr_expect_eq(tp_checkpoint_verify(s_path("gs.safetensors"), 3, NULL), TP_ERR_FORMAT);
    cr_expect(strstr(tp_last_error(), "gs.safetensors") &&
              strstr(tp_last_error(), "'global_step' 7 disagrees with 'epoch' 2") &&
              strstr(tp_last_error(), "expected 4..6"), "%s", tp_last_error());
    cr_expect_eq(tp_checkpoint_verify(s_path("gs.safetensors"), 0, NULL), TP_OK);
    /* within epoch 2 (a checkpoint every k steps) is fine */
    const char *mid[2] = {"global_step", "5"};
    ckpt_edit(s_path("good.safetensors"), s_path("mid.safetensors"), s_set_meta, mid, 1);
    cr_expect_eq(tp_checkpoint_verify(s_path("mid.safetensors"), 3, NULL), TP_OK, "%s",
                 tp_last_error());
    /* a malformed checksum entry names the key */
    const char *sum[2] = {TP_SAFETENSORS_CHECKSUM_KEY, "00zz"};
    ckpt_edit(s_path("good.safetensors"), s_path("sum.safetensors"), s_set_meta, sum, 0);
    const char *nsum[] = {"metadata '" TP_SAFETENSORS_CHECKSUM_KEY "'", NULL};
    s_refused(m, s_path("sum.safetensors"), TP_LOAD_STRICT, nsum);
    tp_model_destroy(&m);
}

/* A FIFO named like a checkpoint: refused at once by every reader (it
 * blocked in open(2) before), and skipped by the log directory's listing.
 * alarm(): a hang ends the test as a crash instead of a stuck suite. */
Test(checkpoint_verify, a_fifo_is_refused_without_hanging) {
    alarm(20);
    tp_model_t *m = s_good();
    cr_assert_eq(mkfifo(s_path("model-9.safetensors"), 0600), 0);
    tp_safetensors_t *st = NULL;
    cr_expect_eq(tp_safetensors_open(s_path("model-9.safetensors"), &st), TP_ERR_IO);
    cr_expect(strstr(tp_last_error(), "model-9.safetensors: not a regular file (a FIFO)"),
              "%s", tp_last_error());
    cr_expect_eq(tp_checkpoint_load(m, s_path("model-9.safetensors"), 0, NULL), TP_ERR_IO);
    cr_expect_eq(tp_checkpoint_verify(s_path("model-9.safetensors"), 0, NULL), TP_ERR_IO);
    tp_checkpoint_info_t info;
    cr_expect_eq(tp_checkpoint_info(s_path("model-9.safetensors"), &info), TP_ERR_IO);
    /* the listing skips it for the newest regular checkpoint */
    cr_assert_eq(rename(s_path("good.safetensors"), s_path("model-6.safetensors")), 0);
    char latest[512];
    cr_expect_eq(tp_checkpoint_find_latest(s_dir, latest, sizeof latest), TP_OK, "%s",
                 tp_last_error());
    cr_expect_str_eq(latest, s_path("model-6.safetensors"));
    /* an index that is a FIFO is ignored, not read */
    cr_assert_eq(mkfifo(s_path("checkpoint"), 0600), 0);
    cr_expect_eq(tp_checkpoint_find_latest(s_dir, latest, sizeof latest), TP_OK, "%s",
                 tp_last_error());
    cr_expect_str_eq(latest, s_path("model-6.safetensors"));
    cr_expect_eq(tp_checkpoint_find_older(s_dir, latest, latest, sizeof latest),
                 TP_ERR_NOT_FOUND);
    alarm(0);
    tp_model_destroy(&m);
}
