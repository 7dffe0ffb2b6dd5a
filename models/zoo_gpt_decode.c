/* towerpack models: the zoo's GPT decoding one token at a time with a
 * cache of keys and values, and the generator tp-generate and tp-train's
 * per-epoch sample both call.
 *
 * The decoding graph (tp_zoo_gpt_decode_build) is zoo_gpt.c's model for
 * one new position: the same variables under the same names (so it loads
 * the same checkpoint), fed the new token, its position, and every
 * layer's keys and values of the positions before it from a cache the
 * host keeps (float32 [2L,H,T,D]: layer l's keys at 2l, its values at
 * 2l+1, slot p for position p). The new position's query attends to the
 * T cached slots and to its own key: a mask input (0 on the slots filled
 * and on its own, -1e9 on the empty ones) keeps the empty slots out, so
 * one step costs the same at every position. The graph gives the logits
 * of the next token and the new position's keys and values, which the
 * host writes into slot p. The prompt is fed the same way, a token at a
 * time (a prefill through the same graph: no second graph to keep in
 * step).
 *
 * Past the training context T (the position embedding has T rows) the
 * generator slides: it empties the cache and feeds the last `keep`
 * tokens again at positions 0..keep-1 (T/2 by default, so a slide costs
 * T/2 steps every T/2 tokens: two steps a token on average). The cacheless
 * path (zoo_gpt.c's whole graph over the last T tokens for every token)
 * is kept beside it: the reference the cache is tested against, and what
 * keep = T reproduces exactly.
 *
 * The generator works on token ids in 0..V-1, V the token embedding's
 * rows (256 for bytes; a BPE run's tokenizer's, which a checkpoint's wte
 * gives): the logits are V wide and the sampler reads all of them. This
 * room has no tokenizer: its callers (tp-generate, TextSample) encode the
 * prompt and turn the ids back into bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/checkpoint.h>
#include <towerpack/log.h>
#include <towerpack/models.h>
#include <towerpack/predict.h>
#include <towerpack/rng.h>
#include "zoo_gpt_internal.h" /* the linears: the training graph's own, so the
                                 * variables' names are the same (their
                                 * initialisers do not matter: a checkpoint or
                                 * a live model's weights replace them) */

#define S_BYTES 256  /* a byte-level GPT's vocabulary */

/* ---- the decoding graph -------------------------------------------------- */

tp_status_t tp_zoo_gpt_decode_inputs(int context, const tp_zoo_gpt_options_t *o,
                                     tp_input_desc_t out[4]) {
    const int L = o && o->layers > 0 ? o->layers : TP_ZOO_GPT_LAYERS;
    const int H = o && o->heads > 0 ? o->heads : TP_ZOO_GPT_HEADS;
    const int C = o && o->embed > 0 ? o->embed : TP_ZOO_GPT_EMBED;
    if (context < 1 || context > TP_ZOO_GPT_MAX_CONTEXT)
        return tp_error(TP_ERR_INVALID, "gpt decoding: context %d outside 1..%d", context,
                        TP_ZOO_GPT_MAX_CONTEXT);
    if (C % H)
        return tp_error(TP_ERR_INVALID, "gpt decoding: the width %d is not a multiple of "
                        "the %d heads", C, H);
    out[0] = (tp_input_desc_t){"token", TP_INT32, 2, {-1, 1}};
    out[1] = (tp_input_desc_t){"pos", TP_INT32, 2, {-1, 1}};
    out[2] = (tp_input_desc_t){"mask", TP_FLOAT32, 4, {-1, 1, 1, context + 1}};
    out[3] = (tp_input_desc_t){"cache", TP_FLOAT32, 5, {-1, 2 * L, H, context, C / H}};
    return TP_OK;
}

/* [B,1,C] -> [B,H,1,D] (one position: the transpose is a reshape) */
static tp_node_t *s_heads(tp_tower_t *t, const char *name, tp_node_t *x, int64_t H,
                          int64_t D) {
    int64_t shape[4] = {-1, H, 1, D};
    return tp_reshape(t, name, x, 4, shape);
}

/* One block for the new position: x [B,1,C]; kc, vc the layer's cache
 * [B,H,T,D]; its new key and value [B,H,1,D] into kv[0], kv[1]. */
static tp_node_t *s_block(tp_tower_t *t, int layer, tp_node_t *x, tp_node_t *mask,
                          tp_node_t *kc, tp_node_t *vc, int64_t C, int64_t H,
                          tp_node_t **kv) {
    char scope[32];
    snprintf(scope, sizeof scope, "h%d", layer);
    if (tp_tower_push_scope(t, scope) != TP_OK)
        return NULL;
    const int64_t D = C / H;
    tp_node_t *h = tp_layer_norm(t, "ln1", x, 1);
    tp_node_t *qkv = tp_zoo_gpt_linear_(t, "attn/qkv", h, C, 3 * C, 0.02f);
    tp_node_t *p[3] = {NULL, NULL, NULL};
    int64_t sizes[3] = {C, C, C};
    if (tp_split(t, "attn/qkv_parts", qkv, 2, 3, sizes, p) != TP_OK) {
        tp_tower_pop_scope(t);
        return NULL;
    }
    tp_node_t *q = s_heads(t, "attn/q", p[0], H, D);
    kv[0] = s_heads(t, "attn/k", p[1], H, D);
    kv[1] = s_heads(t, "attn/v", p[2], H, D);
    /* the T cached slots, then the new position's own key and value */
    tp_node_t *ks[2] = {kc, kv[0]}, *vs[2] = {vc, kv[1]};
    tp_node_t *keys = tp_concat_axis(t, "attn/keys", 2, 2, ks);   /* [B,H,T+1,D] */
    tp_node_t *vals = tp_concat_axis(t, "attn/values", 2, 2, vs); /* [B,H,T+1,D] */
    tp_node_t *s = tp_scale(t, "attn/scores", tp_batch_matmul(t, "attn/qk", q, keys, 0, 1),
                            1.0f / sqrtf((float)D));              /* [B,H,1,T+1] */
    tp_node_t *att = tp_softmax(t, "attn/softmax", tp_add(t, "attn/masked", s, mask), -1);
    tp_node_t *y = tp_batch_matmul(t, "attn/av", att, vals, 0, 0); /* [B,H,1,D] */
    int64_t merged[3] = {-1, 1, C};
    y = tp_reshape(t, "attn/merge", y, 3, merged);
    x = tp_add(t, "res1", x, tp_zoo_gpt_linear_(t, "attn/proj", y, C, C, 0.02f));
    h = tp_layer_norm(t, "ln2", x, 1);
    h = tp_gelu(t, "mlp/gelu", tp_zoo_gpt_linear_(t, "mlp/fc", h, C, 4 * C, 0.02f), 1);
    x = tp_add(t, "res2", x, tp_zoo_gpt_linear_(t, "mlp/proj", h, 4 * C, C, 0.02f));
    tp_tower_pop_scope(t);
    return x;
}

tp_status_t tp_zoo_gpt_decode_build(tp_tower_t *t, tp_node_t *const *in, void *user) {
    const tp_zoo_gpt_options_t *o = user;
    const int L = o && o->layers > 0 ? o->layers : TP_ZOO_GPT_LAYERS;
    const tp_shape_t *cs = in[3] ? tp_node_shape(in[3]) : NULL;
    if (!in[0] || !in[1] || !in[2] || !cs || cs->ndim != 5 || cs->d[1] != 2 * L)
        return tp_error(TP_ERR_SHAPE, "gpt decoding: the inputs must be token, pos, mask "
                        "and cache [B,2L,H,T,D] (tp_zoo_gpt_decode_inputs)");
    const int64_t H = cs->d[2], T = cs->d[3], D = cs->d[4], C = H * D;
    /* the token embedding's rows V, tied to the logits: zoo_gpt.c's rule */
    const int64_t V = o && o->vocab > 0 ? o->vocab : S_BYTES;
    int64_t ps[2] = {T, C}, es[2] = {V, C};
    tp_node_t *wte = tp_variable(t, "wte", 2, es, (tp_init_t){TP_INIT_NORMAL, 0.02f},
                                 TP_VAR_TRAINABLE);
    tp_node_t *wpe = tp_variable(t, "wpe", 2, ps, (tp_init_t){TP_INIT_NORMAL, 0.01f},
                                 TP_VAR_TRAINABLE);
    tp_node_t *x = tp_add(t, "embed", tp_gather_rows(t, "tok_embed", wte, in[0]),
                          tp_gather_rows(t, "pos_embed", wpe, in[1])); /* [B,1,C] */
    tp_node_t **parts = calloc((size_t)(4 * L), sizeof *parts);
    int64_t *ones = malloc((size_t)(2 * L) * sizeof *ones);
    if (!parts || !ones) {
        free(parts);
        free(ones);
        return tp_error(TP_ERR_NOMEM, "gpt decoding: %d layers", L);
    }
    for (int i = 0; i < 2 * L; i++)
        ones[i] = 1;
    tp_node_t **news = parts + 2 * L;  /* [B,1,H,1,D] each, cache order */
    tp_status_t rc = tp_split(t, "cache_parts", in[3], 1, 2 * L, ones, parts);
    int64_t layer_shape[4] = {-1, H, T, D}, row_shape[5] = {-1, 1, H, 1, D};
    for (int l = 0; rc == TP_OK && l < L; l++) {
        char n[3][32];
        snprintf(n[0], sizeof n[0], "cache_k%d", l);
        snprintf(n[1], sizeof n[1], "cache_v%d", l);
        tp_node_t *kc = tp_reshape(t, n[0], parts[2 * l], 4, layer_shape);
        tp_node_t *vc = tp_reshape(t, n[1], parts[2 * l + 1], 4, layer_shape);
        tp_node_t *kv[2] = {NULL, NULL};
        x = s_block(t, l, x, in[2], kc, vc, C, H, kv);
        for (int j = 0; j < 2; j++) {
            snprintf(n[2], sizeof n[2], "new_%c%d", j ? 'v' : 'k', l);
            news[2 * l + j] = tp_reshape(t, n[2], kv[j], 5, row_shape);
        }
        rc = tp_tower_status(t);
    }
    if (rc == TP_OK) {
        x = tp_layer_norm(t, "ln_f", x, 1);
        tp_tower_add_output(t, "logits", tp_batch_matmul(t, "logits", x, wte, 0, 1));
        tp_tower_add_output(t, "kv", tp_concat_axis(t, "kv", 1, 2 * L, news));
        rc = tp_tower_status(t);  /* [B,1,V] and [B,2L,H,1,D] */
    }
    free(parts);
    free(ones);
    return rc;
}

/* ---- the generator ------------------------------------------------------- */

struct tp_zoo_gpt_gen {
    tp_predictor_t *p;
    tp_zoo_gpt_options_t o;
    int context, cache, keep;
    int V;           /* the vocabulary: o.vocab, or 256 */
    int64_t H, D;
    float *kv;       /* [2L,H,T,D] the cache (cache mode) */
    float *mask;     /* [T+1] */
    float *row;      /* [2L,H,1,D] a step's new keys and values, read back */
    int32_t *window; /* [T] the cacheless path's input */
    int pos;         /* filled cache slots */
    float *logits;   /* [V] the next token's */
    float *sorted;   /* [V] the sampler's top-k selection */
    double *weights; /* [V] the sampler's weights */
    int32_t *ids;    /* the byte wrapper's and the sample's tokens */
    size_t nids;     /* their room */
};

void tp_zoo_gpt_gen_destroy(tp_zoo_gpt_gen_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_zoo_gpt_gen_t *g = *self_p;
    tp_predictor_destroy(&g->p);
    free(g->kv);
    free(g->mask);
    free(g->row);
    free(g->window);
    free(g->logits);
    free(g->sorted);
    free(g->weights);
    free(g->ids);
    free(g);
    *self_p = NULL;
}

tp_zoo_gpt_gen_t *tp_zoo_gpt_gen_new(const char *ckpt, int context,
                                     const tp_zoo_gpt_options_t *o, int cache) {
    tp_zoo_gpt_gen_t *g = calloc(1, sizeof *g);
    if (!g) {
        tp_error(TP_ERR_NOMEM, "gpt generator");
        return NULL;
    }
    if (o)
        g->o = *o;
    g->o.layers = g->o.layers > 0 ? g->o.layers : TP_ZOO_GPT_LAYERS;
    g->o.heads = g->o.heads > 0 ? g->o.heads : TP_ZOO_GPT_HEADS;
    g->o.embed = g->o.embed > 0 ? g->o.embed : TP_ZOO_GPT_EMBED;
    g->o.dropout = 0;
    g->V = g->o.vocab > 0 ? g->o.vocab : S_BYTES;
    g->o.vocab = g->V;
    g->context = context;
    g->cache = cache;
    g->keep = context / 2 > 0 ? context / 2 : 1;
    tp_input_desc_t in[4];
    tp_status_t rc = cache ? tp_zoo_gpt_decode_inputs(context, &g->o, in)
                           : tp_zoo_gpt_inputs(context, in);
    const char *in_dec[4] = {"token", "pos", "mask", "cache"}, *out_dec[2] = {"logits", "kv"};
    const char *in_full[1] = {"tokens"};
    tp_model_desc_t desc = {in, cache ? 4 : 2,
                            cache ? tp_zoo_gpt_decode_build : tp_zoo_gpt_build, NULL, &g->o};
    if (rc == TP_OK) {
        tp_predict_config_t pc;
        tp_predict_config_init(&pc);
        pc.model = &desc;
        pc.checkpoint = ckpt;
        pc.input_names = cache ? in_dec : in_full;
        pc.ninput_names = cache ? 4 : 1;
        pc.output_names = out_dec;
        pc.noutput_names = cache ? 2 : 1;
        pc.max_batch = 1;
        g->p = tp_predictor_new(&pc);
        if (!g->p)
            rc = tp_error_wrap(TP_ERR_INVALID, "gpt generator%s%s", ckpt ? " from " : "",
                               ckpt ? ckpt : "");
    }
    if (rc == TP_OK) {
        g->H = g->o.heads;
        g->D = g->o.embed / g->o.heads;
        size_t n = (size_t)(2 * g->o.layers) * (size_t)(g->H * context * g->D);
        if (cache && (!(g->kv = calloc(n, sizeof *g->kv)) ||
                      !(g->mask = calloc((size_t)context + 1, sizeof *g->mask)) ||
                      !(g->row = calloc(n / (size_t)context, sizeof *g->row))))
            rc = tp_error(TP_ERR_NOMEM, "gpt generator: a cache of %zu floats", n);
        if (!cache && !(g->window = calloc((size_t)context, sizeof *g->window)))
            rc = tp_error(TP_ERR_NOMEM, "gpt generator: a window of %d", context);
        if (rc == TP_OK && (!(g->logits = calloc((size_t)g->V, sizeof *g->logits)) ||
                            !(g->sorted = calloc((size_t)g->V, sizeof *g->sorted)) ||
                            !(g->weights = calloc((size_t)g->V, sizeof *g->weights))))
            rc = tp_error(TP_ERR_NOMEM, "gpt generator: logits of %d tokens", g->V);
    }
    if (rc != TP_OK)
        tp_zoo_gpt_gen_destroy(&g);
    return g;
}

/* The integer metadata value `key` of st, in 1..max, into *out. */
static tp_status_t s_meta_int(const tp_safetensors_t *st, const char *ckpt, const char *key,
                              int max, int *out) {
    const char *v = tp_safetensors_meta(st, key);
    char *end = NULL;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || n < 1 || n > max)
        return tp_error(TP_ERR_FORMAT, "%s: metadata '%s' is %s%s%s, not 1..%d (a "
                        "checkpoint of tp-train --model gpt records the model's shape)",
                        ckpt, key, v ? "'" : "missing", v ? v : "", v ? "'" : "", max);
    *out = (int)n;
    return TP_OK;
}

tp_zoo_gpt_gen_t *tp_zoo_gpt_gen_open(const char *ckpt, int cache) {
    tp_safetensors_t *st = NULL;
    if (tp_safetensors_open(ckpt, &st) != TP_OK)
        return NULL;
    int context = 0;
    tp_zoo_gpt_options_t o = {0};
    const char *tokens = tp_safetensors_meta(st, "tokens");
    tp_status_t rc = TP_OK;
    if (tokens && strcmp(tokens, "bytes") && strcmp(tokens, "gpt2-bpe"))
        rc = tp_error(TP_ERR_FORMAT, "%s: tokens '%s': the generator knows 'bytes' and "
                      "'gpt2-bpe'", ckpt, tokens);
    /* the vocabulary: wte's rows (the logits are tied to it), which a BPE
     * checkpoint's vocab_size must agree with */
    tp_tensor_t wte;
    if (rc == TP_OK && tp_safetensors_get(st, "wte", &wte) != TP_OK)
        rc = tp_error(TP_ERR_FORMAT, "%s: no 'wte' (a checkpoint of tp-train --model gpt "
                      "has the token embedding)", ckpt);
    if (rc == TP_OK && (wte.ndim != 2 || wte.shape[0] < 1 ||
                        wte.shape[0] > INT32_MAX))
        rc = tp_error(TP_ERR_FORMAT, "%s: 'wte' is not a [V, C] embedding", ckpt);
    if (rc == TP_OK) {
        o.vocab = (int)wte.shape[0];
        int vs = 0;
        if (tokens && !strcmp(tokens, "gpt2-bpe"))
            rc = s_meta_int(st, ckpt, "vocab_size", INT32_MAX, &vs);
        else if (o.vocab != S_BYTES)
            rc = tp_error(TP_ERR_FORMAT, "%s: 'wte' has %d rows, a byte-level GPT's 256",
                          ckpt, o.vocab);
        if (rc == TP_OK && vs && vs != o.vocab)
            rc = tp_error(TP_ERR_FORMAT, "%s: metadata vocab_size %d, but 'wte' has %d "
                          "rows", ckpt, vs, o.vocab);
    }
    if (rc == TP_OK)
        rc = s_meta_int(st, ckpt, "context", TP_ZOO_GPT_MAX_CONTEXT, &context);
    if (rc == TP_OK)
        rc = s_meta_int(st, ckpt, "layers", 1 << 16, &o.layers);
    if (rc == TP_OK)
        rc = s_meta_int(st, ckpt, "heads", 1 << 16, &o.heads);
    if (rc == TP_OK)
        rc = s_meta_int(st, ckpt, "embed", 1 << 20, &o.embed);
    tp_safetensors_destroy(&st);
    return rc == TP_OK ? tp_zoo_gpt_gen_new(ckpt, context, &o, cache) : NULL;
}

int tp_zoo_gpt_gen_context(const tp_zoo_gpt_gen_t *g) { return g->context; }
int tp_zoo_gpt_gen_vocab(const tp_zoo_gpt_gen_t *g) { return g->V; }
const tp_zoo_gpt_options_t *tp_zoo_gpt_gen_shape(const tp_zoo_gpt_gen_t *g) { return &g->o; }

tp_status_t tp_zoo_gpt_gen_set_keep(tp_zoo_gpt_gen_t *g, int keep) {
    if (keep < 1 || keep > g->context)
        return tp_error(TP_ERR_INVALID, "gpt generator: keep %d outside 1..%d (the context)",
                        keep, g->context);
    g->keep = keep;
    return TP_OK;
}

tp_status_t tp_zoo_gpt_gen_load(tp_zoo_gpt_gen_t *g, tp_model_t *live) {
    tp_model_t *m = tp_predictor_model(g->p);
    tp_backend_t *b = tp_model_backend(m);
    void *host = NULL;
    size_t cap = 0;
    tp_status_t rc = TP_OK;
    for (int i = 0; rc == TP_OK && i < tp_model_var_count(m); i++) {
        const char *name = tp_model_var_name(m, i);
        tp_tensor_t src, dst;
        rc = tp_model_var(m, name, &dst);
        if (rc == TP_OK && (rc = tp_model_var(live, name, &src)) != TP_OK)
            rc = tp_error_wrap(rc, "gpt generator: the trained model has no '%s'", name);
        if (rc == TP_OK && !tp_tensor_same_shape(&src, &dst)) {
            char a[64], c[64];
            rc = tp_error(TP_ERR_SHAPE, "gpt generator: '%s' is %s in the trained model, %s "
                          "in the generator", name, tp_tensor_describe(&src, a, sizeof a),
                          tp_tensor_describe(&dst, c, sizeof c));
        }
        size_t bytes = rc == TP_OK ? tp_tensor_numel(&dst) * tp_dtype_size(dst.dtype) : 0;
        if (rc == TP_OK && bytes > cap) {
            free(host);
            cap = bytes;
            if (!(host = malloc(cap)))
                rc = tp_error(TP_ERR_NOMEM, "gpt generator: %zu bytes of '%s'", bytes, name);
        }
        const void *h = rc == TP_OK ? tp_model_view_host(live, &src, host, bytes) : NULL;
        if (rc == TP_OK && !h)
            rc = tp_error_wrap(TP_ERR_DEVICE, "gpt generator: reading '%s'", name);
        if (rc == TP_OK)
            rc = tp_backend_copy(b, dst.data, h, bytes);
    }
    free(host);
    return rc;
}

/* The next token from g->logits [V]: argmax when greedy, else a draw
 * from softmax(logits / temperature) over the top_k likeliest (0, or K >=
 * V: all). */
static int s_sample(tp_zoo_gpt_gen_t *g, double temperature, int top_k, tp_rng_t *r) {
    const int V = g->V;
    const float *logits = g->logits;
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temperature <= 0 || top_k == 1)
        return best;
    /* the K-th largest logit: those below it are out */
    float cut = -INFINITY;
    if (top_k > 0 && top_k < V) {
        float *sorted = g->sorted;
        memcpy(sorted, logits, (size_t)V * sizeof *sorted);
        for (int k = 0; k < top_k; k++) {  /* partial selection: K V, K small */
            int m = k;
            for (int i = k + 1; i < V; i++)
                if (sorted[i] > sorted[m])
                    m = i;
            float t = sorted[k];
            sorted[k] = sorted[m];
            sorted[m] = t;
        }
        cut = sorted[top_k - 1];
    }
    double *p = g->weights, sum = 0;
    for (int i = 0; i < V; i++) {
        p[i] = logits[i] >= cut ? exp((logits[i] - logits[best]) / temperature) : 0.0;
        sum += p[i];
    }
    double u = tp_rng_double(r) * sum;
    for (int i = 0; i < V; i++) {
        if (u < p[i])
            return i;
        u -= p[i];
    }
    return best;  /* rounding left u at the end */
}

/* Cache mode: feed `token` at position g->pos, write its keys and values
 * into slot pos, and keep the logits of what follows it. */
static tp_status_t s_feed(tp_zoo_gpt_gen_t *g, int32_t token) {
    const int T = g->context, L2 = 2 * g->o.layers;
    const int64_t HD = g->H * g->D;
    const size_t lbytes = (size_t)g->V * sizeof *g->logits;
    for (int j = 0; j < T; j++)
        g->mask[j] = j < g->pos ? 0.0f : -1e9f;
    g->mask[T] = 0.0f;  /* its own key */
    int32_t tok = token, pos = g->pos;
    int64_t s2[2] = {1, 1}, s4[4] = {1, 1, 1, T + 1}, s5[5] = {1, L2, g->H, T, g->D};
    tp_tensor_t in[4], out[2];
    TP_TRY(tp_tensor_init_wrap(&in[0], TP_INT32, 2, s2, &tok, NULL, NULL));
    TP_TRY(tp_tensor_init_wrap(&in[1], TP_INT32, 2, s2, &pos, NULL, NULL));
    TP_TRY(tp_tensor_init_wrap(&in[2], TP_FLOAT32, 4, s4, g->mask, NULL, NULL));
    TP_TRY(tp_tensor_init_wrap(&in[3], TP_FLOAT32, 5, s5, g->kv, NULL, NULL));
    TP_TRY(tp_predictor_run_views(g->p, in, out));
    tp_model_t *m = tp_predictor_model(g->p);
    const float *lg = tp_model_view_host(m, &out[0], g->logits, lbytes);
    const float *kv = tp_model_view_host(m, &out[1], g->row,
                                         (size_t)(L2 * HD) * sizeof *g->row);
    if (!lg || !kv)
        return tp_error_wrap(TP_ERR_DEVICE, "gpt generator: reading the outputs");
    if (lg != g->logits)
        memcpy(g->logits, lg, lbytes);
    /* kv [2L,H,1,D] -> slot pos of the cache [2L,H,T,D] */
    for (int64_t r = 0; r < L2 * g->H; r++)
        memcpy(g->kv + (r * T + g->pos) * g->D, kv + r * g->D, (size_t)g->D * sizeof *kv);
    g->pos++;
    return TP_OK;
}

/* Cache mode: an empty cache, then ids[0..n) at positions 0..n-1. */
static tp_status_t s_prefill(tp_zoo_gpt_gen_t *g, const int32_t *ids, size_t n) {
    g->pos = 0;
    for (size_t i = 0; i < n; i++)
        TP_TRY(s_feed(g, ids[i]));
    return TP_OK;
}

/* Cacheless: the whole graph over the last T tokens of ids[0..len),
 * left-aligned (fewer are padded with zeros after them, which the causal
 * mask keeps from the positions read); the logits at the last real one. */
static tp_status_t s_forward(tp_zoo_gpt_gen_t *g, const int32_t *ids, size_t len) {
    const size_t T = (size_t)g->context, n = len < T ? len : T, V = (size_t)g->V;
    for (size_t i = 0; i < T; i++)
        g->window[i] = i < n ? ids[len - n + i] : 0;
    int64_t shape[2] = {1, (int64_t)T};
    tp_tensor_t x, logits;
    TP_TRY(tp_tensor_init_wrap(&x, TP_INT32, 2, shape, g->window, NULL, NULL));
    TP_TRY(tp_predictor_run_views(g->p, &x, &logits));
    size_t bytes = n * V * sizeof(float);
    float *host = malloc(bytes);
    const float *all = host ? tp_model_view_host(tp_predictor_model(g->p), &logits, host,
                                                 bytes) : NULL;
    if (all)  /* rows of V: the logits' stride is the vocabulary */
        memcpy(g->logits, all + (n - 1) * V, V * sizeof *g->logits);
    free(host);
    return all ? TP_OK : tp_error(TP_ERR_NOMEM, "gpt generator: the logits");
}

tp_status_t tp_zoo_gpt_gen_run_ids(tp_zoo_gpt_gen_t *g, const int32_t *prompt, size_t plen,
                                   int32_t *ids, long ntokens,
                                   const tp_zoo_gpt_sampling_t *s,
                                   tp_zoo_gpt_emit_ids_fn emit, void *user) {
    if (!g || !ids || ntokens < 0 || !plen || !prompt)
        return tp_error(TP_ERR_INVALID, "gpt generator: bad arguments (a prompt of at "
                        "least one token, room for it and the tokens)");
    for (size_t i = 0; i < plen; i++)
        if (prompt[i] < 0 || prompt[i] >= g->V)
            return tp_error(TP_ERR_INVALID, "gpt generator: prompt token %zu is %d, outside "
                            "the vocabulary 0..%d", i, (int)prompt[i], g->V - 1);
    memmove(ids, prompt, plen * sizeof *ids);
    tp_rng_t r;
    tp_rng_init(&r, s ? s->seed : 0, 0);
    const size_t T = (size_t)g->context, total = plen + (size_t)ntokens;
    size_t len = plen;
    tp_status_t rc = TP_OK;
    if (g->cache && ntokens > 0) {
        size_t n = len < T ? len : T;  /* the last T tokens of the prompt */
        rc = s_prefill(g, ids + len - n, n);
    }
    for (; rc == TP_OK && len < total; len++) {
        if (!g->cache)
            rc = s_forward(g, ids, len);
        if (rc != TP_OK)
            break;
        ids[len] = s_sample(g, s ? s->temperature : 0, s ? s->top_k : 0, &r);
        if (emit)
            emit(ids + len, 1, user);
        if (!g->cache || len + 1 == total)
            continue;
        if ((size_t)g->pos < T)
            rc = s_feed(g, ids[len]);
        else  /* the cache is full: slide, the last `keep` tokens again */
            rc = s_prefill(g, ids + len + 1 - (size_t)g->keep, (size_t)g->keep);
    }
    return rc;
}

/* Room for n tokens in g->ids. */
static tp_status_t s_ids(tp_zoo_gpt_gen_t *g, size_t n) {
    if (n <= g->nids)
        return TP_OK;
    int32_t *ids = realloc(g->ids, n * sizeof *ids);
    if (!ids)
        return tp_error(TP_ERR_NOMEM, "gpt generator: %zu tokens", n);
    g->ids = ids;
    g->nids = n;
    return TP_OK;
}

typedef struct {
    tp_zoo_gpt_emit_fn emit;
    void *user;
} s_bytes_emit_t;

static void s_emit_bytes(const int32_t *ids, size_t n, void *user) {
    s_bytes_emit_t *e = user;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)ids[i];
        e->emit(&b, 1, e->user);
    }
}

tp_status_t tp_zoo_gpt_gen_run(tp_zoo_gpt_gen_t *g, const uint8_t *prompt, size_t plen,
                               uint8_t *text, long ntokens, const tp_zoo_gpt_sampling_t *s,
                               tp_zoo_gpt_emit_fn emit, void *user) {
    if (!g || !text || ntokens < 0 || (plen && !prompt))
        return tp_error(TP_ERR_INVALID, "gpt generator: bad arguments");
    if (g->V != S_BYTES)
        return tp_error(TP_ERR_INVALID, "gpt generator: a vocabulary of %d tokens: its "
                        "tokens are not bytes (tp_zoo_gpt_gen_run_ids)", g->V);
    static const uint8_t s_newline = '\n';
    if (!plen) {  /* nothing to continue: a line's start */
        prompt = &s_newline;
        plen = 1;
    }
    const size_t total = plen + (size_t)ntokens;
    TP_TRY(s_ids(g, total));
    for (size_t i = 0; i < plen; i++)
        g->ids[i] = prompt[i];
    s_bytes_emit_t e = {emit, user};
    tp_status_t rc = tp_zoo_gpt_gen_run_ids(g, g->ids, plen, g->ids, ntokens, s,
                                            emit ? s_emit_bytes : NULL, &e);
    for (size_t i = 0; rc == TP_OK && i < total; i++)
        text[i] = (uint8_t)g->ids[i];
    return rc;
}

/* ---- tp-train's per-epoch sample (pipeline's TextSample) ----------------- */

static tp_status_t s_cb_generate(void *gen, tp_model_t *model, const tp_text_sample_opts_t *o,
                                 const int32_t *prompt, size_t plen, int32_t *ids) {
    tp_zoo_gpt_gen_t *g = gen;
    TP_TRY(tp_zoo_gpt_gen_load(g, model));
    tp_zoo_gpt_sampling_t s = {o->temperature, o->top_k, o->seed};
    return tp_zoo_gpt_gen_run_ids(g, prompt, plen, ids, o->tokens, &s, NULL, NULL);
}

static void s_sample_free(void *gen) {
    tp_zoo_gpt_gen_t *g = gen;
    tp_zoo_gpt_gen_destroy(&g);
}

tp_callback_t *tp_zoo_gpt_cb_sample(int context, const tp_zoo_gpt_options_t *o,
                                    const tp_text_sample_opts_t *opts) {
    tp_zoo_gpt_gen_t *g = tp_zoo_gpt_gen_new(NULL, context, o, 1);
    if (!g)
        return NULL;
    tp_text_sample_opts_t so = *opts;
    so.generate = s_cb_generate;
    so.gen = g;
    so.gen_destroy = s_sample_free;
    return tp_cb_text_sample(&so);
}
