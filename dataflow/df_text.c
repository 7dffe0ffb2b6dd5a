/* towerpack dataflow: text files as a language model's data (the `text:`
 * source), bytes as tokens or GPT-2's BPE tokens (dataflow/tokenizer.c).
 *
 * Bytes: the file is mapped read-only and shared by every datapoint and
 * every forked worker (the mapping is inherited); a window is converted to
 * int32 as it is copied out, so no copy of the whole file is ever made and
 * a file larger than memory works. BPE: the split's bytes are encoded once
 * at construction into int32 ids held in memory (also inherited by forked
 * workers), and the mapping is dropped. The split is a byte range of the
 * file either way: the training split is [0, cut), the validation split
 * [cut, n), with cut = n - floor(n * val_fraction); each split is encoded
 * on its own, so windows never cross the split point and no validation
 * byte is ever trained on. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/clock.h>
#include <towerpack/tokenizer.h>
#include "df_internal.h"

typedef struct {
    char *path;
    void *map;             /* the whole file, PROT_READ */
    size_t map_len;        /* file bytes */
    const uint8_t *bytes;  /* [len]: the split, bytes as tokens */
    int32_t *ids;          /* [len]: the split's BPE tokens (owned), or NULL */
    int64_t len;           /* the split's tokens */
    int64_t nbytes;        /* the split's bytes */
    int32_t vocab;         /* 256, or the tokenizer's */
    int64_t context;       /* T */
    int random;
    int64_t size, pos;     /* windows per pass; windows yielded this pass */
    int64_t seq;           /* consecutive mode: the next window's number */
    int64_t nseq;          /* consecutive mode: windows that fit, (len-1)/T */
    tp_rng_t rng;
} text_t;

void tp_df_text_opts_init(tp_df_text_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    opts->context = 64;
    opts->split = TP_TEXT_TRAIN;
    opts->val_fraction = 0.1;
    opts->random = -1;
}

static tp_status_t s_text_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                uint64_t stream) {
    text_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "text");
    self->seq = 0;
    return TP_OK;
}

static tp_status_t s_text_begin(void *impl) {
    text_t *self = impl;
    self->pos = 0;
    /* consecutive windows start over every pass: a validation pass sees
     * the same windows each time */
    self->seq = 0;
    return TP_OK;
}

/* The offset of the next window (the generator's draw, or the next
 * consecutive one). */
static int64_t s_text_offset(text_t *self) {
    if (self->random)
        return (int64_t)tp_rng_below(&self->rng,
                                     (uint64_t)(self->len - self->context));
    int64_t k = self->seq++ % self->nseq;
    return k * self->context;
}

static void s_text_window(const text_t *self, int64_t off, int32_t *x,
                          int32_t *y) {
    if (self->ids) {
        memcpy(x, self->ids + off, (size_t)self->context * sizeof *x);
        memcpy(y, self->ids + off + 1, (size_t)self->context * sizeof *y);
        return;
    }
    const uint8_t *p = self->bytes + off;
    for (int64_t t = 0; t < self->context; t++) {
        x[t] = p[t];
        y[t] = p[t + 1];
    }
}

static tp_status_t s_text_next(void *impl, tp_datapoint_t **out) {
    text_t *self = impl;
    if (self->pos >= self->size)
        return TP_DONE;
    const tp_dtype_t dt[2] = {TP_INT32, TP_INT32};
    const int nd[2] = {1, 1};
    const int64_t shapes[2][TP_MAX_DIMS] = {{self->context}, {self->context}};
    tp_datapoint_t *dp = tp_df_datapoint_alloc(2, dt, nd, shapes);
    if (!dp)
        return tp_error_wrap(TP_ERR_NOMEM, "text %s", self->path);
    self->pos++;
    s_text_window(self, s_text_offset(self), tp_datapoint_get(dp, 0)->data,
                  tp_datapoint_get(dp, 1)->data);
    *out = dp;
    return TP_OK;
}

/* The batching fast path: windows straight into the batch's [B, T] slots. */
static tp_status_t s_text_next_into(void *impl, tp_datapoint_t *batch,
                                    int64_t slot, int64_t count,
                                    int64_t *filled) {
    text_t *self = impl;
    *filled = 0;
    if (self->pos >= self->size)
        return TP_DONE;
    size_t xs = 0, ys = 0;
    const int64_t shape[1] = {self->context};
    uint8_t *x = df_slot(batch, 2, 0, slot, count, TP_INT32, 1, shape,
                         "text", &xs);
    uint8_t *y = x ? df_slot(batch, 2, 1, slot, count, TP_INT32, 1, shape,
                             "text", &ys)
                   : NULL;
    if (!x || !y)
        return TP_ERR_SHAPE;
    int64_t j = 0;
    for (; j < count && self->pos < self->size; j++, self->pos++)
        s_text_window(self, s_text_offset(self), (int32_t *)(x + (size_t)j * xs),
                      (int32_t *)(y + (size_t)j * ys));
    *filled = j;
    return j == count ? TP_OK : TP_DONE;
}

static int64_t s_text_size(void *impl) { return ((text_t *)impl)->size; }

static void s_text_destroy(void *impl) {
    text_t *self = impl;
    if (self->map)
        munmap(self->map, self->map_len);
    free(self->ids);
    free(self->path);
    free(self);
}

static const tp_dataflow_ops_t s_text_ops = {
    .name = "text", .reset_state = s_text_reset, .begin = s_text_begin,
    .next = s_text_next, .size = s_text_size, .destroy = s_text_destroy,
    .next_into = s_text_next_into};

static const char *s_split_name(tp_text_split_t s) {
    return s == TP_TEXT_VAL ? "validation" : s == TP_TEXT_ALL ? "whole-file"
                                                                : "training";
}

/* The split's bytes into BPE ids (self->ids, self->len), the tokenizer
 * loaded from o's files; the encode's speed is logged. */
static tp_status_t s_text_encode(text_t *self, const tp_df_text_opts_t *o,
                                 const uint8_t *bytes) {
    tp_tokenizer_t *tk = tp_tokenizer_load(o->vocab, o->merges);
    if (!tk)
        return tp_error_wrap(TP_ERR_INVALID, "text %s: vocab=%s%s%s", self->path,
                             o->vocab, o->merges ? " merges=" : "",
                             o->merges ? o->merges : "");
    self->vocab = tp_tokenizer_vocab_size(tk);
    double t0 = tp_now_s();
    tp_status_t rc = tp_tokenizer_encode(tk, bytes, (size_t)self->nbytes, &self->ids,
                                         &self->len);
    double dt = tp_now_s() - t0;
    tp_tokenizer_destroy(&tk);
    if (rc != TP_OK)
        return tp_error_wrap(rc, "text %s", self->path);
    TP_INFO("text %s: %" PRId64 " bytes into %" PRId64 " BPE tokens (%.2f bytes a token, "
            "vocabulary %d) in %.2f s, %.1f MB/s", self->path, self->nbytes, self->len,
            self->len ? (double)self->nbytes / (double)self->len : 0.0, (int)self->vocab, dt,
            dt > 0 ? (double)self->nbytes / dt / 1e6 : 0.0);
    return TP_OK;
}

/* The source's state for path and o; with o->vocab and !encode only the
 * vocabulary is read (no file mapped, nothing encoded). */
static tp_status_t s_text_open(const char *path, const tp_df_text_opts_t *opts,
                               int encode, text_t **out) {
    tp_df_text_opts_t o;
    if (opts)
        o = *opts;
    else
        tp_df_text_opts_init(&o);
    *out = NULL;
    if (!path || !*path)
        return tp_error(TP_ERR_INVALID, "text: no file given");
    if (o.context < 1 || o.context > (1 << 24) || o.size < 0 ||
        !(o.val_fraction >= 0 && o.val_fraction < 1) ||
        (o.split != TP_TEXT_TRAIN && o.split != TP_TEXT_VAL &&
         o.split != TP_TEXT_ALL) || o.random < -1 || o.random > 1)
        return tp_error(TP_ERR_INVALID, "text %s: bad options (context %" PRId64
                        " in 1..16777216, val_fraction %g in [0, 1), size %" PRId64
                        " >= 0, split %d, random %d)", path, o.context,
                        o.val_fraction, o.size, (int)o.split, o.random);
    if (o.merges && !o.vocab)
        return tp_error(TP_ERR_INVALID, "text %s: merges=%s without vocab= (GPT-2's "
                        "encoder.json)", path, o.merges);
    if (o.split == TP_TEXT_VAL && o.val_fraction == 0)
        return tp_error(TP_ERR_INVALID, "text %s: the validation split is empty "
                        "(val=0: give the validation text as a file of its own)", path);
    const char *unit = "bytes";
    /* O_NONBLOCK: a FIFO named as the text would block the open until a
     * writer came; it opens at once and is refused below (no effect on a
     * regular file, which is mapped) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return tp_error(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO,
                        "text %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tp_error(TP_ERR_IO, "text %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tp_error(TP_ERR_INVALID, "text %s: %s, not a regular file", path,
                        S_ISDIR(st.st_mode) ? "a directory" : "a special file");
    }
    int64_t n = st.st_size;
    int64_t nval = (int64_t)floor((double)n * o.val_fraction);
    int64_t cut = n - nval;
    int64_t start = o.split == TP_TEXT_VAL ? cut : 0;
    int64_t end = o.split == TP_TEXT_TRAIN ? cut : n;
    text_t *self = calloc(1, sizeof *self);
    if (!self || !(self->path = strdup(path))) {
        free(self);
        close(fd);
        return tp_error(TP_ERR_NOMEM, "text %s", path);
    }
    self->nbytes = self->len = end - start;
    self->vocab = 256;
    self->context = o.context;
    self->random = o.random >= 0 ? o.random : o.split != TP_TEXT_VAL;
    tp_status_t rc = TP_OK;
    /* too short is known before anything is read for bytes, and for BPE
     * when the bytes are too few already (a token is at least a byte) */
    if (end - start < o.context + 1)
        goto too_short;
    if (o.vocab && !encode) {
        close(fd);
        tp_tokenizer_t *tk = tp_tokenizer_load(o.vocab, o.merges);
        if (!tk) {
            s_text_destroy(self);
            return tp_error_wrap(TP_ERR_INVALID, "text %s", path);
        }
        self->vocab = tp_tokenizer_vocab_size(tk);
        self->len = 0;
        tp_tokenizer_destroy(&tk);
        *out = self;
        return TP_OK;
    }
    self->map = n ? mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    int merr = errno;
    close(fd);  /* the mapping keeps the file */
    fd = -1;
    if (self->map == MAP_FAILED) {
        self->map = NULL;
        s_text_destroy(self);
        return tp_error(TP_ERR_IO, "text %s: mmap of %" PRId64 " bytes: %s", path, n,
                        strerror(merr));
    }
    self->map_len = (size_t)n;
    if (o.vocab) {
        (void)madvise(self->map, self->map_len, MADV_SEQUENTIAL);
        rc = s_text_encode(self, &o, (const uint8_t *)self->map + start);
        munmap(self->map, self->map_len);  /* the ids are all it needs */
        self->map = NULL;
        if (rc != TP_OK) {
            s_text_destroy(self);
            return rc;
        }
        unit = "tokens";
        if (self->len < o.context + 1)
            goto too_short;
    } else {
        self->bytes = (const uint8_t *)self->map + start;
        /* Random windows touch the whole file in no order: read-ahead
         * would read pages never used. */
        if (self->random)
            (void)madvise(self->map, self->map_len, MADV_RANDOM);
    }
    self->nseq = (self->len - 1) / o.context;
    self->size = o.size ? o.size : self->nseq;
    *out = self;
    return TP_OK;
too_short:
    if (o.split == TP_TEXT_ALL)
        rc = tp_error(TP_ERR_INVALID, "text %s: %" PRId64 " %s, shorter than context + "
                      "1 = %" PRId64 " (give a longer file or a smaller context)", path,
                      self->len, unit, o.context + 1);
    else
        rc = tp_error(TP_ERR_INVALID, "text %s: the %s split is %" PRId64 " %s (bytes %"
                      PRId64 "..%" PRId64 " of %" PRId64 ", val_fraction %g), shorter "
                      "than context + 1 = %" PRId64 " (give a longer file, a smaller "
                      "context, or a separate validation file)", path,
                      s_split_name(o.split), self->len, unit, start, end, n,
                      o.val_fraction, o.context + 1);
    if (fd >= 0)
        close(fd);
    s_text_destroy(self);
    return rc;
}

tp_dataflow_t *tp_df_text(const char *path, const tp_df_text_opts_t *opts) {
    text_t *self = NULL;
    if (s_text_open(path, opts, 1, &self) != TP_OK)
        return NULL;
    return df_make(&s_text_ops, self);
}

tp_status_t tp_df_text_info(const char *path, const tp_df_text_opts_t *opts, int measure,
                            tp_text_info_t *out) {
    text_t *self = NULL;
    memset(out, 0, sizeof *out);
    TP_TRY(s_text_open(path, opts, measure, &self));
    out->vocab = self->vocab;
    out->bytes = self->nbytes;
    out->tokens = self->len;
    out->bytes_per_token = self->len ? (double)self->nbytes / (double)self->len : 0;
    /* absolute, so a checkpoint's metadata finds them from anywhere */
    char abs[PATH_MAX];  /* PATH_MAX is the 4096 of the fields */
    if (opts && opts->vocab)
        snprintf(out->vocab_file, sizeof out->vocab_file, "%s",
                 realpath(opts->vocab, abs) ? abs : opts->vocab);
    if (opts && opts->merges)
        snprintf(out->merges_file, sizeof out->merges_file, "%s",
                 realpath(opts->merges, abs) ? abs : opts->merges);
    s_text_destroy(self);
    return TP_OK;
}

/* ---- the spec source: text:FILE[,context=T][,split=S][,val=F][,random=B]
 * [,size=N][,vocab=FILE[,merges=FILE]] ----------------------------------- */

typedef struct {
    tp_df_text_opts_t o;
    char *vocab, *merges;  /* owned copies of the options' files */
} text_args_t;

static tp_status_t s_text_kv(const char *key, const char *value, void *ctx) {
    text_args_t *a = ctx;
    if (!value)
        return tp_error(TP_ERR_INVALID, "text: unexpected argument '%s' (one "
                        "FILE, then key=value options)", key);
    if (!strcmp(key, "context"))
        return tp_spec_int(value, 1, 1 << 24, "text: context", &a->o.context);
    if (!strcmp(key, "size"))
        return tp_spec_int(value, 1, INT64_MAX / 2, "text: size", &a->o.size);
    if (!strcmp(key, "val"))
        return tp_spec_double(value, "text: val", &a->o.val_fraction);
    if (!strcmp(key, "vocab") || !strcmp(key, "merges")) {
        char **dst = key[0] == 'v' ? &a->vocab : &a->merges;
        free(*dst);
        if (!*value || !(*dst = strdup(value)))
            return tp_error(*value ? TP_ERR_NOMEM : TP_ERR_INVALID, "text: %s= needs a "
                            "file", key);
        *(key[0] == 'v' ? &a->o.vocab : &a->o.merges) = *dst;
        return TP_OK;
    }
    if (!strcmp(key, "random")) {
        int64_t v;
        TP_TRY(tp_spec_int(value, 0, 1, "text: random", &v));
        a->o.random = (int)v;
        return TP_OK;
    }
    if (!strcmp(key, "split")) {
        if (!strcmp(value, "train"))
            a->o.split = TP_TEXT_TRAIN;
        else if (!strcmp(value, "val"))
            a->o.split = TP_TEXT_VAL;
        else if (!strcmp(value, "all"))
            a->o.split = TP_TEXT_ALL;
        else
            return tp_error(TP_ERR_INVALID, "text: split '%s' (train, val or "
                            "all)", value);
        return TP_OK;
    }
    return tp_error(TP_ERR_INVALID, "text: unknown option '%s' (context=T, "
                    "split=train|val|all, val=F, random=0|1, size=N, vocab=FILE, "
                    "merges=FILE)", key);
}

/* args (FILE[,key=value..]) into a->o and the file's name into *path (in
 * *copy, which the caller frees with a's files). */
static tp_status_t s_text_args(const char *args, text_args_t *a, char **copy,
                               const char **path) {
    memset(a, 0, sizeof *a);
    tp_df_text_opts_init(&a->o);
    /* FILE is the text up to the first comma (split off here: to
     * foreach_kv it would be a key without a value), then the options */
    *copy = strdup(args ? args : "");
    if (!*copy)
        return tp_error(TP_ERR_NOMEM, "text");
    char *comma = strchr(*copy, ',');
    if (comma)
        *comma = '\0';
    *path = df_spec_trim(*copy);
    if (!**path)
        return tp_error(TP_ERR_INVALID, "text: give a FILE (text:FILE[,context="
                        "T][,split=train|val|all][,vocab=FILE,merges=FILE])");
    return comma ? tp_spec_foreach_kv(comma + 1, s_text_kv, a) : TP_OK;
}

static void s_text_args_fini(text_args_t *a, char *copy) {
    free(a->vocab);
    free(a->merges);
    free(copy);
}

tp_status_t tp_df_text_spec_info(const char *spec, int measure, tp_text_info_t *out) {
    memset(out, 0, sizeof *out);
    const char *p = spec ? spec : "";
    while (*p == ' ' || *p == '\t')
        p++;
    if (strncmp(p, "text:", 5))
        return tp_error(TP_ERR_INVALID, "'%s' does not start with a text: source", p);
    /* the source's stage only: up to the first '|' */
    const char *bar = strchr(p, '|');
    char *stage = strndup(p + 5, bar ? (size_t)(bar - p - 5) : strlen(p + 5));
    if (!stage)
        return tp_error(TP_ERR_NOMEM, "text");
    text_args_t a;
    char *copy = NULL;
    const char *path = NULL;
    tp_status_t rc = s_text_args(stage, &a, &copy, &path);
    if (rc == TP_OK)
        rc = tp_df_text_info(path, &a.o, measure, out);
    s_text_args_fini(&a, copy);
    free(stage);
    return rc;
}

tp_status_t df_text_src(const char *args, void *user, tp_dataflow_t **out) {
    (void)user;
    text_args_t a;
    char *copy = NULL;
    const char *path = NULL;
    tp_status_t rc = s_text_args(args, &a, &copy, &path);
    if (rc == TP_OK) {
        *out = tp_df_text(path, &a.o);
        rc = *out ? TP_OK : TP_ERR_INVALID;
    }
    s_text_args_fini(&a, copy);
    return rc;
}
