/* towerpack: GPT-2's byte-level BPE tokenizer (dataflow/tokenizer.c), for
 * the text: source (`text:FILE,vocab=encoder.json,merges=vocab.bpe`) and
 * for tools that turn tokens back into text (tp-generate).
 *
 * Text is cut into pre-tokens by GPT-2's pattern
 * \verbatim
   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
   \endverbatim
 * (written by hand over UTF-8; its letters, numbers and spaces are ICU's
 * general categories L and N and the White_Space property), and each
 * pre-token's bytes are merged pair by pair in the merges' rank order (the
 * lowest rank first, every occurrence of that pair left to right), as
 * GPT-2's encoder.py does. Bytes that are not valid UTF-8 are one character each of the class
 * "neither letter, number nor space". A token is a byte string: decoding
 * concatenates them, so decode(encode(text)) == text for any bytes.
 *
 * A tokenizer caches the pre-tokens it has merged, so encode mutates it:
 * one tokenizer per thread. */
#ifndef TOWERPACK_TOKENIZER_H
#define TOWERPACK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_tokenizer tp_tokenizer_t;

/* GPT-2's (and Hugging Face's) files: encoder.json, a JSON object from
 * token (bytes written through GPT-2's byte-to-unicode map) to id, and
 * vocab.bpe, a "#version" line then one merge "A B" a line, by rank. Every
 * byte must have a token and every merge's result must be in the
 * vocabulary. Caller owns; NULL with tp_last_error() naming the file and
 * line on failure. */
tp_tokenizer_t *tp_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe);

/* tiktoken's file (e.g. gpt2.tiktoken / r50k_base.tiktoken): one
 * "BASE64 RANK" a line; the rank is the id, and a pair merges when the
 * concatenation of its bytes is a token, the lowest rank first. The
 * pre-tokeniser is GPT-2's whatever the file (cl100k's pattern differs).
 * Caller owns; NULL on failure. */
tp_tokenizer_t *tp_tokenizer_load_tiktoken(const char *path);

/* vocab and merges as the text: source takes them: merges given: GPT-2's
 * pair of files; merges NULL: vocab is a .tiktoken file. */
tp_tokenizer_t *tp_tokenizer_load(const char *vocab, const char *merges);

/* Free self (NULL is fine) and null the caller's pointer. */
void tp_tokenizer_destroy(tp_tokenizer_t **self_p);

/* The embedding's rows: the largest id + 1 (GPT-2's files: 50257). */
int32_t tp_tokenizer_vocab_size(const tp_tokenizer_t *self);

/* text[len] (any bytes) into *ids (caller owns, free(); int32 [*n]).
 * TP_ERR_NOMEM on failure. */
tp_status_t tp_tokenizer_encode(tp_tokenizer_t *self, const void *text, size_t len,
                                int32_t **ids, int64_t *n);

/* The bytes of token id (*len of them, not NUL-terminated), NULL when id
 * is no token. For streaming output: fwrite each token as it comes (a
 * UTF-8 character may span two tokens; the bytes are still right). */
const uint8_t *tp_tokenizer_token(const tp_tokenizer_t *self, int32_t id, size_t *len);

/* ids[n] back to bytes into out[cap] (a NUL is added when there is room;
 * out may be NULL with cap 0 to measure). Returns the bytes the text has
 * (as snprintf: more than cap means it was cut), or -1 with tp_last_error()
 * set when an id is no token. */
int64_t tp_tokenizer_decode(const tp_tokenizer_t *self, const int32_t *ids, int64_t n,
                            void *out, size_t cap);

/* The length in bytes of the first pre-token of s[n] (GPT-2's pattern
 * above; 0 only when n is 0). */
size_t tp_tokenizer_pretoken(const uint8_t *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
