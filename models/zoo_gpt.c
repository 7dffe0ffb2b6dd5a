/* towerpack models: the zoo's GPT, a decoder-only Transformer language
 * model on bytes (GPT-2's architecture at a small size): learned token and
 * position embeddings, pre-norm blocks of causal multi-head self-attention
 * and a GELU MLP of 4x width, a final layer norm, and the output tied to the
 * token embedding. It takes the `text:` source's windows (int32 [B,T]
 * tokens, int32 [B,T] next-byte targets) and reports the sequence
 * cross-entropy in nats per token as the metric `cost`.
 *
 * Built only from the graph's ops: gather_rows (embedding), layer_norm,
 * batch_matmul (projections against unbatched [C,N] weights),
 * the fused causal attention on the qkv projection as it lies
 * (tp_attention_qkv: tiles with an online softmax, the T x T scores never
 * stored whole, each head read and written in place, so no copies of the
 * heads), reshape/transpose (the heads of the decomposed attention),
 * gelu, add (residuals) and softmax_xent_seq. Dropout (off by default)
 * where nanoGPT has it: the embeddings' sum, the attention weights, and
 * the output of each residual branch before it is added; the fused op has
 * no dropout of its weights, so a model with dropout builds its training
 * towers' attention from the parts instead (q k^T, a constant causal
 * mask, softmax, dropout, x v), which materialises the scores per head.
 * The parameters' names are the same either way. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/models.h>
#include "zoo_gpt_internal.h"

/* The inputs at context T: tokens and targets, int32 [B,T]. */
tp_status_t tp_zoo_gpt_inputs(int context, tp_input_desc_t out[2]) {
    if (context < 1 || context > TP_ZOO_GPT_MAX_CONTEXT)
        return tp_error(TP_ERR_INVALID, "gpt context %d: 1..%d", context,
                        TP_ZOO_GPT_MAX_CONTEXT);
    out[0] = (tp_input_desc_t){"tokens", TP_INT32, 2, {-1, context}};
    out[1] = (tp_input_desc_t){"targets", TP_INT32, 2, {-1, context}};
    return TP_OK;
}

/* zoo_gpt_internal.h: the linear both graphs build */
tp_node_t *tp_zoo_gpt_linear_(tp_tower_t *t, const char *scope, tp_node_t *x, int64_t k,
                              int64_t n, float std) {
    if (tp_tower_push_scope(t, scope) != TP_OK)
        return NULL;
    int64_t ws[2] = {k, n}, bs[1] = {n};
    tp_node_t *w = tp_variable(t, "W", 2, ws, (tp_init_t){TP_INIT_NORMAL, std},
                               TP_VAR_TRAINABLE);
    tp_node_t *b = tp_variable(t, "b", 1, bs, (tp_init_t){TP_INIT_ZEROS, 0},
                               TP_VAR_TRAINABLE);
    tp_node_t *y = tp_add(t, "output", tp_batch_matmul(t, "matmul", x, w, 0, 0), b);
    tp_tower_pop_scope(t);
    return y;
}

/* x through dropout at `rate` (training only), or x itself at 0: a model
 * without dropout has no dropout nodes, the same graph as before. */
static tp_node_t *s_drop(tp_tower_t *t, const char *name, tp_node_t *x, float rate) {
    return rate > 0 ? tp_dropout(t, name, x, rate) : x;
}

/* A block's rest after its attention's y [B,T,C]: x + proj(y), then
 * + mlp(ln2(x)); closes the block's scope. */
static tp_node_t *s_block_end(tp_tower_t *t, tp_node_t *x, tp_node_t *y, int64_t C,
                              float proj_std, float drop) {
    x = tp_add(t, "res1", x,
               s_drop(t, "attn/resid_drop",
                      tp_zoo_gpt_linear_(t, "attn/proj", y, C, C, proj_std), drop));
    tp_node_t *h = tp_layer_norm(t, "ln2", x, 1);
    h = tp_gelu(t, "mlp/gelu", tp_zoo_gpt_linear_(t, "mlp/fc", h, C, 4 * C, 0.02f), 1);
    x = tp_add(t, "res2", x,
               s_drop(t, "mlp/drop",
                      tp_zoo_gpt_linear_(t, "mlp/proj", h, 4 * C, C, proj_std), drop));
    tp_tower_pop_scope(t);
    return x;
}

/* One pre-norm block: x + attn(ln1(x)), then + mlp(ln2(x)). mask NULL:
 * the fused attention (no dropout), else the decomposed one with it. */
static tp_node_t *s_block(tp_tower_t *t, int layer, tp_node_t *x, tp_node_t *mask,
                          int64_t T, int64_t C, int64_t H, int nlayers, float drop) {
    char scope[32];
    snprintf(scope, sizeof scope, "h%d", layer);
    if (tp_tower_push_scope(t, scope) != TP_OK)
        return NULL;
    const float proj_std = 0.02f / sqrtf(2.0f * (float)nlayers);
    const int64_t D = C / H;
    tp_node_t *h = tp_layer_norm(t, "ln1", x, 1);
    tp_node_t *qkv = tp_zoo_gpt_linear_(t, "attn/qkv", h, C, 3 * C, 0.02f);
    tp_node_t *y; /* [B,T,C], the heads side by side */
    if (!mask) {  /* no dropout: the fused op on the packed qkv, no copies */
        y = tp_attention_qkv(t, "attn/attention", qkv, (int)H, 1, 1.0f / sqrtf((float)D));
        return s_block_end(t, x, y, C, proj_std, drop);
    }
    /* q, k and v as heads, [B,H,T,D] each: qkv viewed as [B,T,3H,D],
     * one transpose to [B,3H,T,D], then cut along the heads (runs of
     * H T D floats): two copies, where cutting first and transposing each
     * part made four, of D-float runs */
    int64_t hs[4] = {-1, T, 3 * H, D};
    static const int perm[4] = {0, 2, 1, 3};
    tp_node_t *heads = tp_transpose(t, "attn/heads",
                                    tp_reshape(t, "attn/qkv_split", qkv, 4, hs), perm);
    tp_node_t *p[3] = {NULL, NULL, NULL};
    int64_t sizes[3] = {H, H, H};
    if (tp_split(t, "attn/qkv_parts", heads, 1, 3, sizes, p) != TP_OK) {
        tp_tower_pop_scope(t);
        return NULL;
    }
    tp_node_t *q = p[0], *k = p[1], *v = p[2];
    /* softmax(q k^T / sqrt(D) + mask) v: the mask is 0 on and below the
     * diagonal, -1e9 above (a position sees itself and the past) */
    tp_node_t *s = tp_scale(t, "attn/scores", tp_batch_matmul(t, "attn/qk", q, k, 0, 1),
                            1.0f / sqrtf((float)D));
    tp_node_t *att = tp_softmax(t, "attn/softmax", tp_add(t, "attn/masked", s, mask), -1);
    att = s_drop(t, "attn/drop", att, drop);
    y = tp_batch_matmul(t, "attn/av", att, v, 0, 0); /* [B,H,T,D] */
    static const int back[4] = {0, 2, 1, 3};
    int64_t merged[3] = {-1, T, C};
    y = tp_reshape(t, "attn/merge", tp_transpose(t, "attn/unheads", y, back), 3, merged);
    return s_block_end(t, x, y, C, proj_std, drop);
}

tp_status_t tp_zoo_gpt_build(tp_tower_t *t, tp_node_t *const *in, void *user) {
    const tp_zoo_gpt_options_t *o = user;
    const int nlayers = o && o->layers > 0 ? o->layers : TP_ZOO_GPT_LAYERS;
    const int64_t H = o && o->heads > 0 ? o->heads : TP_ZOO_GPT_HEADS;
    const int64_t C = o && o->embed > 0 ? o->embed : TP_ZOO_GPT_EMBED;
    const float drop = o ? o->dropout : 0.0f;
    const int64_t V = o && o->vocab > 0 ? o->vocab : 256;  /* bytes, or BPE's */
    const tp_shape_t *s = in[0] ? tp_node_shape(in[0]) : NULL;
    if (!s || s->ndim != 2 || tp_node_dtype(in[0]) != TP_INT32 || !in[1] ||
        tp_node_dtype(in[1]) != TP_INT32)
        return tp_error(TP_ERR_SHAPE, "model gpt: the inputs must be int32 [batch,context] "
                        "tokens and targets (the text: source's windows)");
    if (!(drop >= 0.0f && drop < 1.0f))
        return tp_error(TP_ERR_INVALID, "model gpt: dropout %g outside [0, 1)", (double)drop);
    if (C % H)
        return tp_error(TP_ERR_INVALID, "model gpt: the width %lld is not a multiple of "
                        "the %lld heads", (long long)C, (long long)H);
    const int64_t T = s->d[1];
    /* with dropout in training only (the decomposed attention; inference
     * runs the fused op, dropout being the identity there): the causal
     * mask, [T,T], broadcast over the batch and the heads */
    tp_node_t *mask = NULL;
    if (drop > 0.0f && tp_tower_is_training(t)) {
        float *m = malloc((size_t)(T * T) * sizeof *m);
        if (!m)
            return tp_error(TP_ERR_NOMEM, "model gpt: the %lldx%lld mask", (long long)T,
                            (long long)T);
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++)
                m[i * T + j] = j <= i ? 0.0f : -1e9f;
        int64_t ms[2] = {T, T};
        mask = tp_constant(t, "causal_mask", 2, ms, m);
        free(m);
    }
    int64_t es[2] = {V, C}, ps[2] = {T, C};
    tp_node_t *wte = tp_variable(t, "wte", 2, es, (tp_init_t){TP_INIT_NORMAL, 0.02f},
                                 TP_VAR_TRAINABLE);
    tp_node_t *wpe = tp_variable(t, "wpe", 2, ps, (tp_init_t){TP_INIT_NORMAL, 0.01f},
                                 TP_VAR_TRAINABLE);
    tp_node_t *x = tp_add(t, "embed", tp_gather_rows(t, "tok_embed", wte, in[0]), wpe);
    x = s_drop(t, "drop", x, drop);
    for (int l = 0; l < nlayers; l++)
        x = s_block(t, l, x, mask, T, C, H, nlayers, drop);
    x = tp_layer_norm(t, "ln_f", x, 1);
    /* the output tied to the token embedding: x wte^T, [B,T,V] */
    tp_node_t *logits = tp_batch_matmul(t, "logits", x, wte, 0, 1);
    tp_node_t *cost = tp_softmax_xent_seq(t, "cost", logits, in[1], -100);
    tp_tower_add_output(t, "logits", logits);
    tp_tower_add_metric(t, "cost", cost);  /* validation_cost, nats per token */
    TP_TRY(tp_tower_status(t));
    return tp_tower_set_cost(t, cost);
}
