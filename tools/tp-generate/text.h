/* tp-generate: text from a GPT checkpoint (tp-train --model gpt), the
 * language model's path beside the GAN's images. */
#ifndef TP_GENERATE_TEXT_H
#define TP_GENERATE_TEXT_H

#include <stdint.h>

/* What a continuation is drawn with (tp-generate's flags). */
typedef struct tp_gen_text {
    const char *prompt;   /* the text to continue; NULL or "": "\n" */
    long tokens;          /* tokens to generate, >= 1 */
    double temperature;   /* logits / T before the softmax; 0: greedy */
    int top_k;            /* sample among the K likeliest only; 0 (or >= V): all */
    uint64_t seed;        /* the sampler's generator */
    const char *output;   /* also write prompt + continuation here; NULL: not */
    int no_cache;         /* 1: the whole model over the last T tokens for
                             every token (no cache of keys and values) */
    const char *vocab;    /* the BPE tokenizer's files instead of those the */
    const char *merges;   /* checkpoint names (NULL: those) */
} tp_gen_text_t;

/* Load the GPT in checkpoint `ckpt` (its shape from the metadata tp-train
 * wrote: context, layers, heads, embed; tokens: bytes, or GPT-2 BPE through
 * the tokenizer files it names), continue the prompt by g->tokens tokens
 * and print prompt + continuation to stdout (and g->output). 0 on
 * success; 1 with a message on stderr. */
int tp_generate_text(const char *ckpt, const tp_gen_text_t *g);

#endif
