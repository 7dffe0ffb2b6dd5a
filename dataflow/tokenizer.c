/* towerpack dataflow: GPT-2's byte-level BPE (include/towerpack/
 * tokenizer.h): its files (encoder.json + vocab.bpe, or tiktoken's
 * .tiktoken), its pre-tokenising pattern written by hand over UTF-8 with
 * ICU's character classes, ranked merges with a cache of merged
 * pre-tokens, encode and decode.
 *
 * Tokens are kept as byte strings (GPT-2's byte-to-unicode map is undone
 * at load), merges as a hash from the pair of ids (a, b) to its rank and
 * the merged id, so a pre-token is merged over int32 ids with no strings. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <unicode/uchar.h>
#include <towerpack/tokenizer.h>
#include "df_internal.h"

/* The longest pre-token the cache keeps; longer ones (rare: long runs of
 * spaces or symbols) are merged every time. */
#define S_CACHE_MAX_KEY 128
/* The cache starts over past this many bytes of keys and ids. */
#define S_CACHE_MAX_BYTES ((size_t)64 << 20)

typedef struct {
    uint64_t key;   /* ((a << 32) | b) + 1; 0: empty slot */
    int32_t rank;   /* lower merges first */
    int32_t id;     /* the merged token */
} s_merge_t;

typedef struct {
    uint64_t h;     /* the key's hash | 1; 0: empty slot */
    uint32_t koff;  /* the key's bytes in cache_keys */
    uint32_t voff;  /* its ids in cache_ids */
    uint16_t klen, nv;
} s_cached_t;

struct tp_tokenizer {
    int32_t vocab;       /* largest id + 1 */
    int64_t *off;        /* [vocab + 1]: token i is bytes[off[i] .. off[i+1]) */
    uint8_t *present;    /* [vocab]: 1 where an id is a token */
    uint8_t *bytes;      /* every token's bytes, back to back */
    int32_t byte_id[256];
    int32_t *tmap;       /* [tcap]: ids by their bytes' hash, -1 empty */
    size_t tcap;
    s_merge_t *merges;   /* [mcap] */
    size_t mcap, nmerges;
    /* the cache of merged pre-tokens: keys and ids in two growing arenas */
    s_cached_t *cache;   /* [ccap] */
    size_t ccap, ncache;
    uint8_t *ckeys;      /* [ckeys_len] */
    size_t ckeys_len, ckeys_cap;
    int32_t *cids;       /* [cids_len] */
    size_t cids_len, cids_cap;
    int32_t *sym;        /* scratch: a pre-token's symbols, [sym_cap] */
    size_t sym_cap;
};

static uint64_t s_hash(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t s_mix(uint64_t x) {  /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t s_pow2(size_t n) {
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* ---- GPT-2's byte <-> unicode map --------------------------------------- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes ('!'..'~', 0xA1..0xAC,
 * 0xAE..0xFF) are their own code point, the other 68 bytes are 256 + n in
 * increasing order. */
static int s_printable(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The byte a code point of a GPT-2 token string stands for, -1 if none. */
static int s_unicode_byte(uint32_t cp) {
    if (cp < 256)
        return s_printable((int)cp) ? (int)cp : -1;
    int n = 0;
    for (int b = 0; b < 256; b++)
        if (!s_printable(b) && (uint32_t)(256 + n++) == cp)
            return b;
    return -1;
}

/* ---- UTF-8 and the character classes ------------------------------------- */

enum { C_OTHER, C_LETTER, C_NUMBER, C_SPACE };

/* The code point at s[0..n) (n >= 1) into *cp, its length returned; a byte
 * that starts no valid sequence (overlong forms and surrogates included) is
 * one character, *cp = -1. */
static size_t s_utf8(const uint8_t *s, size_t n, int32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        v = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        v = c & 0x07;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        *cp = -1;
        return 1;
    }
    if (n < len || s[1] < lo || s[1] > hi) {
        *cp = -1;
        return 1;
    }
    v = (v << 6) | (s[1] & 0x3F);
    for (size_t i = 2; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = -1;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = (int32_t)v;
    return len;
}

/* ASCII by table; the rest by ICU: \p{L} is the general categories
 * Lu Ll Lt Lm Lo, \p{N} Nd Nl No, \s the White_Space property (what
 * Python's `regex` module matches: tests/dataflow/test_proc_tokenizer.c). */
static int s_class(int32_t cp) {
    if (cp < 0)
        return C_OTHER;
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
            return C_LETTER;
        if (cp >= '0' && cp <= '9')
            return C_NUMBER;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
            return C_SPACE;
        return C_OTHER;
    }
    int8_t t = u_charType(cp);
    if (t >= U_UPPERCASE_LETTER && t <= U_OTHER_LETTER)
        return C_LETTER;
    if (t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER)
        return C_NUMBER;
    if (u_hasBinaryProperty(cp, UCHAR_WHITE_SPACE))
        return C_SPACE;
    return C_OTHER;
}

static int s_class_at(const uint8_t *s, size_t n, size_t *len) {
    int32_t cp;
    *len = s_utf8(s, n, &cp);
    return s_class(cp);
}

/* The pattern's alternatives in order; a backtracking matcher tries them
 * left to right at each start, which this follows case by case. */
size_t tp_tokenizer_pretoken(const uint8_t *s, size_t n) {
    if (n == 0)
        return 0;
    /* 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as GPT-2's) */
    if (s[0] == '\'' && n >= 2) {
        if (s[1] == 's' || s[1] == 't' || s[1] == 'm' || s[1] == 'd')
            return 2;
        if (n >= 3 && ((s[1] == 'r' && s[2] == 'e') || (s[1] == 'v' && s[2] == 'e') ||
                       (s[1] == 'l' && s[2] == 'l')))
            return 3;
    }
    size_t l, i = 0;
    int cls = s_class_at(s, n, &l);
    /* ' ?' before a run of letters, numbers or others: the space joins it */
    if (s[0] == ' ' && n > 1) {
        size_t l1;
        int c1 = s_class_at(s + 1, n - 1, &l1);
        if (c1 != C_SPACE) {
            cls = c1;
            l = 1 + l1;
        }
    }
    if (cls != C_SPACE) {
        /*  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : the longest run */
        i = l;
        while (i < n) {
            size_t li;
            if (s_class_at(s + i, n - i, &li) != cls)
                break;
            i += li;
        }
        return i;
    }
    /* \s+(?!\S): a run of k spaces, all of it at the end of the text,
     * else all but its last (which then starts the next pre-token, e.g.
     * " word"); with k = 1 before a non-space, \s+ takes that one */
    size_t last = 0, k = 0;
    while (i < n) {
        size_t li;
        if (s_class_at(s + i, n - i, &li) != C_SPACE)
            break;
        last = i;
        i += li;
        k++;
    }
    if (i == n || k < 2)
        return i;
    return last;
}

/* ---- the vocabulary ------------------------------------------------------ */

static int32_t s_find(const tp_tokenizer_t *self, const uint8_t *p, size_t n) {
    size_t mask = self->tcap - 1;
    for (size_t j = s_hash(p, n) & mask;; j = (j + 1) & mask) {
        int32_t id = self->tmap[j];
        if (id < 0)
            return -1;
        size_t len = (size_t)(self->off[id + 1] - self->off[id]);
        if (len == n && !memcmp(self->bytes + self->off[id], p, n))
            return id;
    }
}

static const s_merge_t *s_merge(const tp_tokenizer_t *self, int32_t a, int32_t b) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = self->mcap - 1;
    for (size_t j = s_mix(key) & mask;; j = (j + 1) & mask) {
        const s_merge_t *m = &self->merges[j];
        if (m->key == key)
            return m;
        if (!m->key)
            return NULL;
    }
}

/* Add (a, b) -> (rank, id) unless the pair is there (the first rank
 * stays). */
static void s_add_merge(tp_tokenizer_t *self, int32_t a, int32_t b, int32_t rank,
                        int32_t id) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = self->mcap - 1;
    for (size_t j = s_mix(key) & mask;; j = (j + 1) & mask) {
        s_merge_t *m = &self->merges[j];
        if (m->key == key)
            return;
        if (!m->key) {
            *m = (s_merge_t){key, rank, id};
            self->nmerges++;
            return;
        }
    }
}

/* A token table for ids [0, vocab) with room for nbytes of token bytes:
 * tokens are then set in id order by s_set_token. */
static tp_tokenizer_t *s_new(int32_t vocab, size_t nbytes) {
    tp_tokenizer_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->vocab = vocab;
    self->off = calloc((size_t)vocab + 1, sizeof *self->off);
    self->present = calloc((size_t)vocab, 1);
    self->bytes = malloc(nbytes ? nbytes : 1);
    self->tcap = s_pow2((size_t)vocab * 2);
    self->tmap = malloc(self->tcap * sizeof *self->tmap);
    if (!self->off || !self->present || !self->bytes || !self->tmap) {
        tp_tokenizer_destroy(&self);
        return NULL;
    }
    memset(self->tmap, 0xff, self->tcap * sizeof *self->tmap);
    return self;
}

/* After the tokens: the id of every byte. `what` is the file of the
 * tokens (encoder.json, not vocab.bpe: a byte without a token is the
 * vocabulary's fault). */
static tp_status_t s_index_bytes(tp_tokenizer_t *self, const char *what) {
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if ((self->byte_id[b] = s_find(self, &c, 1)) < 0)
            return tp_error(TP_ERR_FORMAT, "tokenizer %s: byte 0x%02x has no token (a "
                            "byte-level vocabulary has all 256)", what, b);
    }
    return TP_OK;
}

/* The table of merges sized for nmerges. */
static tp_status_t s_index(tp_tokenizer_t *self, size_t nmerges, const char *what) {
    self->mcap = s_pow2(nmerges * 2 + 2);
    self->merges = calloc(self->mcap, sizeof *self->merges);
    if (!self->merges)
        return tp_error(TP_ERR_NOMEM, "tokenizer %s: %zu merges", what, nmerges);
    return TP_OK;
}

/* The hash of token id's bytes into tmap; TP_ERR_FORMAT when the same
 * bytes are already another id. */
static tp_status_t s_insert_token(tp_tokenizer_t *self, int32_t id, const char *what) {
    const uint8_t *p = self->bytes + self->off[id];
    size_t n = (size_t)(self->off[id + 1] - self->off[id]);
    size_t mask = self->tcap - 1;
    for (size_t j = s_hash(p, n) & mask;; j = (j + 1) & mask) {
        int32_t o = self->tmap[j];
        if (o < 0) {
            self->tmap[j] = id;
            return TP_OK;
        }
        if ((size_t)(self->off[o + 1] - self->off[o]) == n &&
            !memcmp(self->bytes + self->off[o], p, n))
            return tp_error(TP_ERR_FORMAT, "tokenizer %s: ids %d and %d are the same "
                            "bytes", what, (int)o, (int)id);
    }
}

/* ---- GPT-2's files ------------------------------------------------------- */

/* A GPT-2 token string (UTF-8 of mapped code points) into out (room for
 * strlen(s) bytes); its byte count, or -1 when a code point maps to no
 * byte. */
static long s_unmap(const char *s, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s), i = 0;
    long k = 0;
    while (i < n) {
        int32_t cp;
        i += s_utf8(p + i, n - i, &cp);
        int b = cp < 0 ? -1 : s_unicode_byte((uint32_t)cp);
        if (b < 0)
            return -1;
        out[k++] = (uint8_t)b;
    }
    return k;
}

static tp_status_t s_load_encoder(const char *path, tp_tokenizer_t **out) {
    /* opened as a regular file first: json_load_file reads a directory as
     * an empty document and waits on a FIFO for a writer */
    FILE *f;
    int64_t size;
    tp_status_t orc = df_open_regular("tokenizer", path, &f, &size);
    if (orc != TP_OK)
        return orc;
    json_error_t jerr;
    json_t *root = json_loadf(f, 0, &jerr);
    fclose(f);
    if (!root)
        return tp_error(TP_ERR_FORMAT, "tokenizer %s line %d: %s", path, jerr.line,
                        jerr.text);
    tp_status_t rc = TP_OK;
    const char *key;
    json_t *v;
    json_int_t max = -1;
    size_t nbytes = 0;
    if (!json_is_object(root) || !json_object_size(root)) {
        json_decref(root);
        return tp_error(TP_ERR_FORMAT, "tokenizer %s: not a JSON object of token: id "
                        "(GPT-2's encoder.json)", path);
    }
    json_object_foreach(root, key, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= (1 << 30)) {
            json_decref(root);
            return tp_error(TP_ERR_FORMAT, "tokenizer %s: token \"%s\" has id %s (an "
                            "integer in 0..2^30 expected)", path, key,
                            json_is_integer(v) ? "out of range" : "that is no integer");
        }
        max = id > max ? id : max;
        nbytes += strlen(key);
    }
    tp_tokenizer_t *self = s_new((int32_t)max + 1, nbytes);
    uint8_t *buf = malloc(nbytes + 1);
    int64_t *len = calloc((size_t)max + 1, sizeof *len);
    long *from = calloc((size_t)max + 1, sizeof *from);
    if (!self || !buf || !len || !from) {
        rc = tp_error(TP_ERR_NOMEM, "tokenizer %s", path);
        goto done;
    }
    /* bytes of each key at any place in buf, then laid out in id order */
    size_t at = 0;
    json_object_foreach(root, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        long k = s_unmap(key, buf + at);
        if (k <= 0) {
            rc = tp_error(TP_ERR_FORMAT, "tokenizer %s: token \"%s\" is not written in "
                          "GPT-2's byte-to-unicode map%s", path, key, k ? "" : " (empty)");
            goto done;
        }
        if (self->present[id]) {
            rc = tp_error(TP_ERR_FORMAT, "tokenizer %s: id %d is given twice (token "
                          "\"%s\")", path, (int)id, key);
            goto done;
        }
        self->present[id] = 1;
        len[id] = k;
        from[id] = (long)at;
        at += (size_t)k;
    }
    for (int32_t id = 0; id < self->vocab; id++) {
        self->off[id + 1] = self->off[id] + len[id];
        memcpy(self->bytes + self->off[id], buf + from[id], (size_t)len[id]);
    }
    for (int32_t id = 0; id < self->vocab && rc == TP_OK; id++)
        if (self->present[id])
            rc = s_insert_token(self, id, path);
    if (rc == TP_OK)
        rc = s_index_bytes(self, path);
done:
    free(buf);
    free(len);
    free(from);
    json_decref(root);
    if (rc != TP_OK)
        tp_tokenizer_destroy(&self);
    *out = self;
    return rc;
}

static tp_status_t s_load_merges(tp_tokenizer_t *self, const char *path) {
    FILE *f;
    int64_t size;
    tp_status_t orc = df_open_regular("tokenizer", path, &f, &size);
    if (orc != TP_OK)
        return orc;
    /* count the lines first: the table is sized once */
    size_t lines = 0;
    for (int c; (c = fgetc(f)) != EOF;)
        lines += c == '\n';
    rewind(f);
    tp_status_t rc = s_index(self, lines + 1, path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    int32_t rank = 0;
    uint8_t *pair = NULL;
    size_t paircap = 0;
    while (rc == TP_OK && (got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        if (!got || (lineno == 1 && line[0] == '#'))  /* "#version: 0.2" */
            continue;
        char *sp = strchr(line, ' ');
        if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' ')) {
            rc = tp_error(TP_ERR_FORMAT, "tokenizer %s line %ld: '%s' is not a merge "
                          "\"A B\"", path, lineno, line);
            break;
        }
        *sp = '\0';
        if ((size_t)got + 1 > paircap) {
            paircap = (size_t)got + 1;
            uint8_t *np = realloc(pair, paircap);
            if (!np) {
                rc = tp_error(TP_ERR_NOMEM, "tokenizer %s", path);
                break;
            }
            pair = np;
        }
        long ka = s_unmap(line, pair), kb = ka > 0 ? s_unmap(sp + 1, pair + ka) : -1;
        int32_t a = ka > 0 ? s_find(self, pair, (size_t)ka) : -1;
        int32_t b = kb > 0 ? s_find(self, pair + ka, (size_t)kb) : -1;
        int32_t m = a >= 0 && b >= 0 ? s_find(self, pair, (size_t)(ka + kb)) : -1;
        if (m < 0) {
            rc = tp_error(TP_ERR_FORMAT, "tokenizer %s line %ld: merge '%s %s': %s is not a "
                          "token of the vocabulary", path, lineno, line, sp + 1,
                          a < 0 ? "the first" : b < 0 ? "the second" : "the merged");
            break;
        }
        s_add_merge(self, a, b, rank++, m);
    }
    free(line);
    free(pair);
    if (rc == TP_OK && ferror(f))
        rc = tp_error(TP_ERR_IO, "tokenizer %s: read error", path);
    fclose(f);
    return rc;
}

tp_tokenizer_t *tp_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe) {
    tp_tokenizer_t *self = NULL;
    if (!encoder_json || !vocab_bpe) {
        tp_error(TP_ERR_INVALID, "tokenizer: GPT-2's BPE needs encoder.json and vocab.bpe");
        return NULL;
    }
    if (s_load_encoder(encoder_json, &self) != TP_OK)
        return NULL;
    if (s_load_merges(self, vocab_bpe) != TP_OK)
        tp_tokenizer_destroy(&self);
    return self;
}

/* ---- tiktoken's file ----------------------------------------------------- */

static int s_b64(int c) {
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 (padding optional) into out; the byte count, -1 if bad. */
static long s_unbase64(const char *s, size_t n, uint8_t *out) {
    while (n && s[n - 1] == '=')
        n--;
    uint32_t acc = 0;
    int bits = 0;
    long k = 0;
    for (size_t i = 0; i < n; i++) {
        int v = s_b64((unsigned char)s[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[k++] = (uint8_t)(acc >> bits);
        }
    }
    return n % 4 == 1 ? -1 : k;
}

tp_tokenizer_t *tp_tokenizer_load_tiktoken(const char *path) {
    FILE *f = NULL;
    int64_t size;
    if (!path) {
        tp_error(TP_ERR_INVALID, "tokenizer (none): no file given");
        return NULL;
    }
    if (df_open_regular("tokenizer", path, &f, &size) != TP_OK)
        return NULL;
    /* two passes: the largest rank and the bytes, then the tokens */
    char *line = NULL;
    size_t cap = 0, nbytes = 0;
    ssize_t got;
    long lineno = 0, max = -1;
    tp_status_t rc = TP_OK;
    tp_tokenizer_t *self = NULL;
    int64_t *len = NULL;
    long *from = NULL;
    uint8_t *buf = NULL;
    for (int pass = 0; pass < 2 && rc == TP_OK; pass++) {
        rewind(f);
        lineno = 0;
        size_t at = 0;
        while (rc == TP_OK && (got = getline(&line, &cap, f)) >= 0) {
            lineno++;
            while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
                line[--got] = '\0';
            if (!got)
                continue;
            char *sp = strchr(line, ' '), *end = NULL;
            long rank = sp ? strtol(sp + 1, &end, 10) : -1;
            if (!sp || sp == line || !end || *end || end == sp + 1 || rank < 0 ||
                rank >= (1 << 30)) {
                rc = tp_error(TP_ERR_FORMAT, "tokenizer %s line %ld: not \"BASE64 RANK\" "
                              "(tiktoken's format)", path, lineno);
                break;
            }
            size_t n64 = (size_t)(sp - line);
            if (pass == 0) {
                max = rank > max ? rank : max;
                nbytes += n64;  /* an upper bound of the decoded bytes */
                continue;
            }
            long k = s_unbase64(line, n64, buf + at);
            if (k <= 0) {
                rc = tp_error(TP_ERR_FORMAT, "tokenizer %s line %ld: bad base64", path,
                              lineno);
                break;
            }
            if (self->present[rank]) {
                rc = tp_error(TP_ERR_FORMAT, "tokenizer %s line %ld: rank %ld is given "
                              "twice", path, lineno, rank);
                break;
            }
            self->present[rank] = 1;
            len[rank] = k;
            from[rank] = (long)at;
            at += (size_t)k;
        }
        if (pass == 0 && rc == TP_OK) {
            if (max < 0) {
                rc = tp_error(TP_ERR_FORMAT, "tokenizer %s: no tokens", path);
                break;
            }
            self = s_new((int32_t)max + 1, nbytes);
            buf = malloc(nbytes + 1);
            len = calloc((size_t)max + 1, sizeof *len);
            from = calloc((size_t)max + 1, sizeof *from);
            if (!self || !buf || !len || !from)
                rc = tp_error(TP_ERR_NOMEM, "tokenizer %s", path);
        }
    }
    free(line);
    fclose(f);
    if (rc == TP_OK) {
        for (int32_t id = 0; id < self->vocab; id++) {
            self->off[id + 1] = self->off[id] + len[id];
            memcpy(self->bytes + self->off[id], buf + from[id], (size_t)len[id]);
        }
        for (int32_t id = 0; id < self->vocab && rc == TP_OK; id++)
            if (self->present[id])
                rc = s_insert_token(self, id, path);
    }
    /* tiktoken merges a pair when its bytes together are a token, ranked
     * by that token: every split of every token into two tokens */
    size_t npairs = 0;
    for (int32_t id = 0; rc == TP_OK && id < self->vocab; id++)
        npairs += len[id] > 1 ? (size_t)len[id] - 1 : 0;
    if (rc == TP_OK)
        rc = s_index_bytes(self, path);
    if (rc == TP_OK)
        rc = s_index(self, npairs, path);
    for (int32_t id = 0; rc == TP_OK && id < self->vocab; id++) {
        const uint8_t *p = self->bytes + self->off[id];
        for (int64_t k = 1; k < len[id]; k++) {
            int32_t a = s_find(self, p, (size_t)k);
            int32_t b = a >= 0 ? s_find(self, p + k, (size_t)(len[id] - k)) : -1;
            if (b >= 0)
                s_add_merge(self, a, b, id, id);
        }
    }
    free(buf);
    free(len);
    free(from);
    if (rc != TP_OK)
        tp_tokenizer_destroy(&self);
    return self;
}

tp_tokenizer_t *tp_tokenizer_load(const char *vocab, const char *merges) {
    return merges ? tp_tokenizer_load_gpt2(vocab, merges) : tp_tokenizer_load_tiktoken(vocab);
}

void tp_tokenizer_destroy(tp_tokenizer_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_tokenizer_t *self = *self_p;
    free(self->off);
    free(self->present);
    free(self->bytes);
    free(self->tmap);
    free(self->merges);
    free(self->cache);
    free(self->ckeys);
    free(self->cids);
    free(self->sym);
    free(self);
    *self_p = NULL;
}

int32_t tp_tokenizer_vocab_size(const tp_tokenizer_t *self) { return self->vocab; }

const uint8_t *tp_tokenizer_token(const tp_tokenizer_t *self, int32_t id, size_t *len) {
    if (id < 0 || id >= self->vocab || !self->present[id])
        return NULL;
    *len = (size_t)(self->off[id + 1] - self->off[id]);
    return self->bytes + self->off[id];
}

int64_t tp_tokenizer_decode(const tp_tokenizer_t *self, const int32_t *ids, int64_t n,
                            void *out, size_t cap) {
    uint8_t *o = out;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *p = tp_tokenizer_token(self, ids[i], &len);
        if (!p) {
            tp_error(TP_ERR_INVALID, "tokenizer: id %d (token %lld of %lld) is not in "
                     "the vocabulary of %d", (int)ids[i], (long long)i, (long long)n,
                     (int)self->vocab);
            return -1;
        }
        if ((size_t)total < cap)
            memcpy(o + total, p, len < cap - (size_t)total ? len : cap - (size_t)total);
        total += (int64_t)len;
    }
    if (o && cap)
        o[(size_t)total < cap ? (size_t)total : cap - 1] = '\0';
    return total;
}

/* ---- encode -------------------------------------------------------------- */

/* p[n]'s merged ids into self->sym (returned count): GPT-2's bpe(): the
 * adjacent pair of the lowest rank, every occurrence of it left to right,
 * until no pair is a merge. */
static size_t s_bpe(tp_tokenizer_t *self, const uint8_t *p, size_t n) {
    int32_t *s = self->sym;
    for (size_t i = 0; i < n; i++)
        s[i] = self->byte_id[p[i]];
    while (n > 1) {
        const s_merge_t *best = NULL;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            const s_merge_t *m = s_merge(self, s[i], s[i + 1]);
            if (m && (!best || m->rank < best->rank)) {
                best = m;
                at = i;
            }
        }
        if (!best)
            break;
        int32_t a = s[at], b = s[at + 1];
        size_t j = at;
        for (size_t i = at; i < n;) {
            if (i + 1 < n && s[i] == a && s[i + 1] == b) {
                s[j++] = best->id;
                i += 2;
            } else {
                s[j++] = s[i++];
            }
        }
        n = j;
    }
    return n;
}

static void s_cache_clear(tp_tokenizer_t *self) {
    if (self->cache)
        memset(self->cache, 0, self->ccap * sizeof *self->cache);
    self->ncache = self->ckeys_len = self->cids_len = 0;
}

static int s_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = c;
    return 0;
}

/* The cache's slot for key p[n] (its entry, or the empty slot to fill). */
static s_cached_t *s_cache_slot(tp_tokenizer_t *self, const uint8_t *p, size_t n,
                                uint64_t h) {
    size_t mask = self->ccap - 1;
    for (size_t j = h & mask;; j = (j + 1) & mask) {
        s_cached_t *c = &self->cache[j];
        if (!c->h || (c->h == h && c->klen == n && !memcmp(self->ckeys + c->koff, p, n)))
            return c;
    }
}

/* Double the cache's table (rehashing what it holds). */
static int s_cache_rehash(tp_tokenizer_t *self) {
    size_t ncap = self->ccap ? self->ccap * 2 : 1 << 14;
    s_cached_t *old = self->cache, *nc = calloc(ncap, sizeof *nc);
    if (!nc)
        return -1;
    size_t ocap = self->ccap;
    self->cache = nc;
    self->ccap = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].h)
            *s_cache_slot(self, self->ckeys + old[i].koff, old[i].klen, old[i].h) = old[i];
    free(old);
    return 0;
}

tp_status_t tp_tokenizer_encode(tp_tokenizer_t *self, const void *text, size_t len,
                                int32_t **ids, int64_t *n) {
    const uint8_t *s = text;
    size_t cap = len / 3 + 16, k = 0;  /* English runs near 4 bytes a token */
    int32_t *out = malloc(cap * sizeof *out);
    if (!out)
        return tp_error(TP_ERR_NOMEM, "tokenizer: %zu bytes of text", len);
    size_t i = 0;
    while (i < len) {
        size_t m = tp_tokenizer_pretoken(s + i, len - i);
        const uint8_t *p = s + i;
        i += m;
        if (k + m > cap) {  /* a pre-token is at most m tokens */
            size_t c = cap;
            if (s_grow((void **)&out, &c, k + m, sizeof *out))
                goto nomem;
            cap = c;
        }
        s_cached_t *c = NULL;
        uint64_t h = 0;
        if (m <= S_CACHE_MAX_KEY) {
            if (self->ncache * 2 >= self->ccap && s_cache_rehash(self))
                goto nomem;
            h = s_hash(p, m) | 1;
            c = s_cache_slot(self, p, m, h);
            if (c->h) {
                memcpy(out + k, self->cids + c->voff, c->nv * sizeof *out);
                k += c->nv;
                continue;
            }
        }
        if (s_grow((void **)&self->sym, &self->sym_cap, m, sizeof *self->sym))
            goto nomem;
        size_t nv = s_bpe(self, p, m);
        memcpy(out + k, self->sym, nv * sizeof *out);
        k += nv;
        if (!c)
            continue;
        if (self->ckeys_len + m + (self->cids_len + nv) * sizeof(int32_t) >
            S_CACHE_MAX_BYTES) {
            /* a corpus of very many distinct words: start over rather
             * than grow without bound */
            s_cache_clear(self);
            c = s_cache_slot(self, p, m, h);
        }
        if (s_grow((void **)&self->ckeys, &self->ckeys_cap, self->ckeys_len + m, 1) ||
            s_grow((void **)&self->cids, &self->cids_cap, self->cids_len + nv,
                   sizeof(int32_t)))
            goto nomem;
        memcpy(self->ckeys + self->ckeys_len, p, m);
        memcpy(self->cids + self->cids_len, self->sym, nv * sizeof(int32_t));
        *c = (s_cached_t){h, (uint32_t)self->ckeys_len, (uint32_t)self->cids_len,
                          (uint16_t)m, (uint16_t)nv};
        self->ckeys_len += m;
        self->cids_len += nv;
        self->ncache++;
    }
    *ids = out;
    *n = (int64_t)k;
    return TP_OK;
nomem:
    free(out);
    return tp_error(TP_ERR_NOMEM, "tokenizer: encoding %zu bytes of text", len);
}
