/* towerpack tests: the GPT's decoding graph with a cache of keys and
 * values and the text generator (models/zoo_gpt_decode.c). A GPT of
 * random weights (its initial values, then noise on every variable so the
 * attention is far from uniform) is saved as tp-train saves one; the
 * generator with the cache must draw the very bytes the cacheless path
 * (the whole model over the last T bytes for every byte) draws, within
 * the context and, with keep = T, past it; loading a live model's weights
 * gives what loading its checkpoint gives. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>

enum { T = 16, L = 2, H = 2, C = 16 };
static const tp_zoo_gpt_options_t s_shape = {.layers = L, .heads = H, .embed = C};

static tp_optimizer_t *s_sgd(void *u) {
    (void)u;
    return tp_optimizer_sgd(0.01, 0.9, 0);
}

/* A GPT at context T from `seed`, every variable then moved by N(0, 0.3^2)
 * noise (wte's rows apart, the attention peaked). Caller owns. */
static tp_model_t *s_model(uint64_t seed) {
    static tp_input_desc_t in[2];
    cr_assert_eq(tp_zoo_gpt_inputs(T, in), TP_OK);
    tp_model_desc_t md = {in, 2, tp_zoo_gpt_build, s_sgd, (void *)&s_shape};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 1;
    mc.seed = seed;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    tp_rng_t r;
    tp_rng_init(&r, seed, 7);
    for (int i = 0; i < tp_model_var_count(m); i++) {
        tp_tensor_t v;
        cr_assert_eq(tp_model_var(m, tp_model_var_name(m, i), &v), TP_OK);
        float *x = v.data;  /* the CPU backend: host memory */
        for (size_t j = 0; j < tp_tensor_numel(&v); j++)
            x[j] += 0.3f * (float)tp_rng_normal(&r);
    }
    return m;
}

/* m saved at path with the metadata tp-train writes for a gpt. */
static void s_save(tp_model_t *m, const char *path) {
    static const char *const kv[][2] = {{"context", "16"}, {"layers", "2"}, {"heads", "2"},
                                        {"embed", "16"}, {"tokens", "bytes"}};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        cr_assert_eq(tp_checkpoint_set_meta(m, kv[i][0], kv[i][1]), TP_OK);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
}

static char s_path[64];

static void s_setup(void) {
    snprintf(s_path, sizeof s_path, "/tmp/tp_gpt_decode_%d.safetensors", (int)getpid());
    tp_model_t *m = s_model(3);
    s_save(m, s_path);
    tp_model_destroy(&m);
}

static void s_teardown(void) { unlink(s_path); }

TestSuite(zoo_gpt_decode, .init = s_setup, .fini = s_teardown, .timeout = 120);

/* n greedy bytes after `prompt` (plen + n into text). */
static void s_greedy(tp_zoo_gpt_gen_t *g, const char *prompt, uint8_t *text, long n) {
    tp_zoo_gpt_sampling_t s = {.temperature = 0};
    cr_assert_eq(tp_zoo_gpt_gen_run(g, (const uint8_t *)prompt, strlen(prompt), text, n, &s,
                                    NULL, NULL), TP_OK, "%s", tp_last_error());
}

/* Distinct bytes in text[0..n): a generator stuck on one byte would make
 * the comparisons below say little. */
static int s_distinct(const uint8_t *text, size_t n) {
    int seen[256] = {0}, k = 0;
    for (size_t i = 0; i < n; i++)
        k += !seen[text[i]]++;
    return k;
}

Test(zoo_gpt_decode, the_cache_draws_the_cacheless_bytes) {
    tp_zoo_gpt_gen_t *full = tp_zoo_gpt_gen_open(s_path, 0);
    tp_zoo_gpt_gen_t *kv = tp_zoo_gpt_gen_open(s_path, 1);
    cr_assert(full && kv, "%s", tp_last_error());
    cr_expect_eq(tp_zoo_gpt_gen_context(kv), T);
    cr_expect_eq(tp_zoo_gpt_gen_shape(kv)->layers, L);
    enum { N = 5 * T };  /* far past the context: the window slides */
    const char *prompt = "hello";
    const size_t P = strlen(prompt);
    uint8_t want[64 + N], got[64 + N];
    s_greedy(full, prompt, want, N);
    cr_expect(s_distinct(want + P, N) >= 4, "the reference repeats one byte");
    /* refilled from the last T bytes: the cacheless window, byte for byte */
    cr_assert_eq(tp_zoo_gpt_gen_set_keep(kv, T), TP_OK);
    s_greedy(kv, prompt, got, N);
    cr_expect_arr_eq(got, want, P + N, "keep = T: the cache drew other bytes");
    /* the default (T/2) too, until the text first passes the context: the
     * first T + 1 bytes of text saw the same window */
    cr_assert_eq(tp_zoo_gpt_gen_set_keep(kv, T / 2), TP_OK);
    s_greedy(kv, prompt, got, N);
    cr_expect_arr_eq(got, want, T + 1, "within the context the cache drew other bytes");
    /* a prompt longer than the context: its last T bytes */
    const char *longp = "a prompt that is longer than sixteen bytes";
    s_greedy(full, longp, want, 8);
    cr_assert_eq(tp_zoo_gpt_gen_set_keep(kv, T), TP_OK);
    s_greedy(kv, longp, got, 8);
    cr_expect_arr_eq(got, want, strlen(longp) + 8);
    cr_expect_eq(tp_zoo_gpt_gen_set_keep(kv, T + 1), TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "keep 17 outside 1..16"), "%s", tp_last_error());
    cr_expect_eq(tp_zoo_gpt_gen_set_keep(kv, 0), TP_ERR_INVALID);
    tp_zoo_gpt_gen_destroy(&full);
    tp_zoo_gpt_gen_destroy(&kv);
    tp_zoo_gpt_gen_destroy(&kv);  /* NULL: nothing */
}

/* A seeded draw at temperature 1 among the top 20: the same bytes with
 * and without the cache, and again for the same seed; another seed
 * differs. */
Test(zoo_gpt_decode, a_seeded_draw_is_the_same_with_the_cache) {
    tp_zoo_gpt_gen_t *full = tp_zoo_gpt_gen_open(s_path, 0);
    tp_zoo_gpt_gen_t *kv = tp_zoo_gpt_gen_open(s_path, 1);
    cr_assert(full && kv, "%s", tp_last_error());
    cr_assert_eq(tp_zoo_gpt_gen_set_keep(kv, T), TP_OK);
    enum { N = 40 };
    uint8_t a[N + 8], b[N + 8], c[N + 8];
    tp_zoo_gpt_sampling_t s = {.temperature = 1.0, .top_k = 20, .seed = 11};
    cr_assert_eq(tp_zoo_gpt_gen_run(full, (const uint8_t *)"x", 1, a, N, &s, NULL, NULL),
                 TP_OK);
    cr_assert_eq(tp_zoo_gpt_gen_run(kv, (const uint8_t *)"x", 1, b, N, &s, NULL, NULL), TP_OK);
    cr_expect_arr_eq(a, b, N + 1);
    s.seed = 12;
    cr_assert_eq(tp_zoo_gpt_gen_run(kv, (const uint8_t *)"x", 1, c, N, &s, NULL, NULL), TP_OK);
    cr_expect(memcmp(b, c, N + 1), "seeds 11 and 12 drew the same %d bytes", N);
    tp_zoo_gpt_gen_destroy(&full);
    tp_zoo_gpt_gen_destroy(&kv);
}

static void s_count(const uint8_t *bytes, size_t n, void *user) {
    (void)bytes;
    *(size_t *)user += n;
}

/* tp-train's per-epoch sample: a generator of the initial values, then a
 * live model's weights copied in, draws what its checkpoint draws; a
 * model of another shape is refused naming the variable. */
Test(zoo_gpt_decode, a_live_models_weights_draw_what_its_checkpoint_draws) {
    tp_zoo_gpt_gen_t *live = tp_zoo_gpt_gen_new(NULL, T, &s_shape, 1);
    tp_zoo_gpt_gen_t *file = tp_zoo_gpt_gen_open(s_path, 1);
    cr_assert(live && file, "%s", tp_last_error());
    enum { N = 30 };
    uint8_t a[N + 8], b[N + 8];
    s_greedy(file, "ab", a, N);
    s_greedy(live, "ab", b, N);
    cr_expect(memcmp(a + 2, b + 2, N), "the initial values drew the checkpoint's bytes");
    tp_model_t *m = s_model(3);  /* the checkpoint's weights */
    cr_assert_eq(tp_zoo_gpt_gen_load(live, m), TP_OK, "%s", tp_last_error());
    size_t emitted = 0;
    tp_zoo_gpt_sampling_t s = {.temperature = 0};
    cr_assert_eq(tp_zoo_gpt_gen_run(live, (const uint8_t *)"ab", 2, b, N, &s, s_count,
                                    &emitted), TP_OK);
    cr_expect_arr_eq(a, b, N + 2);
    cr_expect_eq(emitted, N, "emit saw %zu bytes of %d", emitted, N);
    tp_model_destroy(&m);
    /* width 32: wte is [256,32] there, [256,16] here */
    tp_zoo_gpt_options_t wide = s_shape;
    wide.embed = 32;
    tp_zoo_gpt_gen_t *g = tp_zoo_gpt_gen_new(NULL, T, &wide, 1);
    cr_assert_not_null(g, "%s", tp_last_error());
    m = s_model(3);
    cr_expect_eq(tp_zoo_gpt_gen_load(g, m), TP_ERR_SHAPE);
    cr_expect(strstr(tp_last_error(), "'wte'"), "%s", tp_last_error());
    tp_model_destroy(&m);
    tp_zoo_gpt_gen_destroy(&g);
    tp_zoo_gpt_gen_destroy(&live);
    tp_zoo_gpt_gen_destroy(&file);
}

/* An empty prompt is a newline; a checkpoint without the gpt's metadata
 * is refused naming the key. */
Test(zoo_gpt_decode, an_empty_prompt_and_a_checkpoint_without_a_shape) {
    tp_zoo_gpt_gen_t *g = tp_zoo_gpt_gen_open(s_path, 1);
    cr_assert_not_null(g, "%s", tp_last_error());
    uint8_t text[8];
    s_greedy(g, "", text, 3);
    cr_expect_eq(text[0], '\n');
    tp_zoo_gpt_gen_destroy(&g);
    char bare[80];
    snprintf(bare, sizeof bare, "%s.bare", s_path);
    tp_model_t *m = s_model(4);
    cr_assert_eq(tp_checkpoint_save(m, bare, NULL), TP_OK);
    tp_model_destroy(&m);
    cr_expect_null(tp_zoo_gpt_gen_open(bare, 1));
    cr_expect(strstr(tp_last_error(), "metadata 'context' is missing"), "%s", tp_last_error());
    unlink(bare);
}

/* A GPT of V = 300 tokens (a BPE vocabulary's embedding, past the bytes)
 * saved as tp-train saves a BPE run's: the decoding graph's logits are V
 * wide and the sampler reads all of them, so the cache draws the very
 * tokens the cacheless path draws, greedy and sampled with a top-k, and
 * ids past 255 come out. */
Test(zoo_gpt_decode, a_bpe_vocabulary_draws_the_same_tokens_with_and_without_the_cache) {
    enum { V = 300, N = 40 };
    tp_zoo_gpt_options_t bpe = s_shape;
    bpe.vocab = V;
    static tp_input_desc_t in[2];
    cr_assert_eq(tp_zoo_gpt_inputs(T, in), TP_OK);
    tp_model_desc_t md = {in, 2, tp_zoo_gpt_build, s_sgd, &bpe};
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = 1;
    mc.seed = 5;
    mc.threads = 1;
    tp_model_t *m = tp_model_new(&md, &mc);
    cr_assert_not_null(m, "%s", tp_last_error());
    tp_rng_t r;
    tp_rng_init(&r, 5, 7);
    for (int i = 0; i < tp_model_var_count(m); i++) {
        tp_tensor_t v;
        cr_assert_eq(tp_model_var(m, tp_model_var_name(m, i), &v), TP_OK);
        float *x = v.data;
        for (size_t j = 0; j < tp_tensor_numel(&v); j++)
            x[j] += 0.3f * (float)tp_rng_normal(&r);
    }
    /* the rows past the bytes longer, so that greedy picks them too (the
     * logits are tied to wte): a sampler reading 256 wide would not */
    tp_tensor_t wte;
    cr_assert_eq(tp_model_var(m, "wte", &wte), TP_OK);
    for (size_t j = 256 * C; j < (size_t)V * C; j++)
        ((float *)wte.data)[j] *= 4.0f;
    char path[80];
    snprintf(path, sizeof path, "%s.bpe", s_path);
    static const char *const kv[][2] = {{"context", "16"}, {"layers", "2"}, {"heads", "2"},
                                        {"embed", "16"}, {"tokens", "gpt2-bpe"},
                                        {"vocab_size", "300"}};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        cr_assert_eq(tp_checkpoint_set_meta(m, kv[i][0], kv[i][1]), TP_OK);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK, "%s", tp_last_error());
    tp_zoo_gpt_gen_t *full = tp_zoo_gpt_gen_open(path, 0);
    tp_zoo_gpt_gen_t *kvg = tp_zoo_gpt_gen_open(path, 1);
    cr_assert(full && kvg, "%s", tp_last_error());
    cr_expect_eq(tp_zoo_gpt_gen_vocab(kvg), V);
    const int32_t prompt[3] = {290, 7, 261};
    int32_t a[3 + N], b[3 + N];
    /* greedy, then a top-k draw; past the context T with keep = T too */
    tp_zoo_gpt_sampling_t ss[2] = {{.temperature = 0}, {.temperature = 1, .top_k = 50,
                                                        .seed = 9}};
    cr_assert_eq(tp_zoo_gpt_gen_set_keep(kvg, T), TP_OK);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(tp_zoo_gpt_gen_run_ids(full, prompt, 3, a, N, &ss[k], NULL, NULL), TP_OK,
                     "%s", tp_last_error());
        cr_assert_eq(tp_zoo_gpt_gen_run_ids(kvg, prompt, 3, b, N, &ss[k], NULL, NULL), TP_OK,
                     "%s", tp_last_error());
        cr_expect_arr_eq(a, b, sizeof a, "sampling %d: the cache drew other tokens", k);
        int past = 0;
        for (int i = 3; i < 3 + N; i++) {
            cr_assert(a[i] >= 0 && a[i] < V, "token %d", a[i]);
            past += a[i] >= 256;
        }
        cr_expect_gt(past, 0, "sampling %d drew no token past the bytes", k);
    }
    /* the byte wrapper refuses a vocabulary that is not bytes; a prompt
     * token outside it is refused */
    uint8_t text[8];
    cr_expect_eq(tp_zoo_gpt_gen_run(kvg, (const uint8_t *)"a", 1, text, 2, &ss[0], NULL,
                                    NULL), TP_ERR_INVALID);
    const int32_t bad = V;
    cr_expect_eq(tp_zoo_gpt_gen_run_ids(kvg, &bad, 1, a, 2, &ss[0], NULL, NULL),
                 TP_ERR_INVALID);
    cr_expect(strstr(tp_last_error(), "outside the vocabulary 0..299"), "%s", tp_last_error());
    tp_zoo_gpt_gen_destroy(&full);
    tp_zoo_gpt_gen_destroy(&kvg);
    /* a vocab_size that is not wte's rows is refused */
    cr_assert_eq(tp_checkpoint_set_meta(m, "vocab_size", "50257"), TP_OK);
    cr_assert_eq(tp_checkpoint_save(m, path, NULL), TP_OK);
    cr_expect_null(tp_zoo_gpt_gen_open(path, 1));
    cr_expect(strstr(tp_last_error(), "vocab_size 50257, but 'wte' has 300 rows"), "%s",
              tp_last_error());
    tp_model_destroy(&m);
    unlink(path);
}
