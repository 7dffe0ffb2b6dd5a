/* towerpack dataflow: sources (an in-memory list, a generator callback,
 * FakeData, IDX files and the Fashion-MNIST data set).
 *
 * The IDX reader trusts nothing in the file: the header is checked against
 * the file's size before anything is allocated, the payload must be exactly
 * as long as the header says, and gzip errors (truncation, bad CRC) are
 * format errors naming the file. */
#include <errno.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <zlib.h>
#include <towerpack/process.h>
#include "df_internal.h"

/* ---- list ------------------------------------------------------------------ */

typedef struct {
    tp_datapoint_t **dps;  /* [n] */
    uint32_t *order;       /* [n] */
    size_t n, pos;
    int shuffle;
    tp_rng_t rng;
} list_t;

static tp_status_t s_list_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                uint64_t stream) {
    list_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "list");
    return TP_OK;
}

static tp_status_t s_list_begin(void *impl) {
    list_t *self = impl;
    df_iota_shuffle(self->order, self->n, self->shuffle ? &self->rng : NULL);
    self->pos = 0;
    return TP_OK;
}

static tp_status_t s_list_next(void *impl, tp_datapoint_t **out) {
    list_t *self = impl;
    if (self->pos >= self->n)
        return TP_DONE;
    *out = tp_datapoint_copy(self->dps[self->order[self->pos++]]);
    return *out ? TP_OK : tp_error(TP_ERR_NOMEM, "list: copying a datapoint");
}

static int64_t s_list_size(void *impl) { return (int64_t)((list_t *)impl)->n; }

static void s_list_destroy(void *impl) {
    list_t *self = impl;
    for (size_t i = 0; i < self->n; i++)
        tp_datapoint_destroy(&self->dps[i]);
    free(self->dps);
    free(self->order);
    free(self);
}

static const tp_dataflow_ops_t s_list_ops = {
    .name = "list", .reset_state = s_list_reset, .begin = s_list_begin,
    .next = s_list_next, .size = s_list_size, .destroy = s_list_destroy};

tp_dataflow_t *tp_df_from_list(tp_datapoint_t **dps, size_t n, int shuffle) {
    list_t *self = calloc(1, sizeof *self);
    if (self) {
        self->dps = calloc(n ? n : 1, sizeof *self->dps);
        self->order = calloc(n ? n : 1, sizeof *self->order);
    }
    if (!self || !self->dps || !self->order || n > UINT32_MAX) {
        for (size_t i = 0; dps && i < n; i++)
            tp_datapoint_destroy(&dps[i]);
        if (self) {
            free(self->dps);
            free(self->order);
            free(self);
        }
        tp_error(n > UINT32_MAX ? TP_ERR_INVALID : TP_ERR_NOMEM,
                 "list: %zu datapoints", n);
        return NULL;
    }
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!dps[i])
            bad = 1;
        self->dps[i] = dps[i];
        dps[i] = NULL;
    }
    self->n = n;
    self->shuffle = shuffle;
    if (bad) {
        s_list_destroy(self);
        tp_error(TP_ERR_INVALID, "list: a NULL datapoint in the list");
        return NULL;
    }
    return df_make(&s_list_ops, self);
}

/* ---- generator ------------------------------------------------------------- */

typedef struct {
    tp_df_generator_fn fn;
    void *user;
    tp_df_free_fn user_free;
    int64_t size;
    tp_rng_t rng;
} gen_t;

static tp_status_t s_gen_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                               uint64_t stream) {
    gen_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "generator");
    return TP_OK;
}

static tp_status_t s_gen_next(void *impl, tp_datapoint_t **out) {
    gen_t *self = impl;
    tp_status_t rc = self->fn(out, &self->rng, self->user);
    if (rc == TP_OK && !*out)
        return tp_error(TP_ERR_INVALID, "generator returned TP_OK without a "
                                        "datapoint");
    if (rc != TP_OK)
        tp_datapoint_destroy(out);
    if (rc > 0 && rc != TP_DONE)
        return tp_error(TP_ERR_INVALID, "generator returned %d", (int)rc);
    return rc;
}

static int64_t s_gen_size(void *impl) { return ((gen_t *)impl)->size; }

static void s_gen_destroy(void *impl) {
    gen_t *self = impl;
    if (self->user_free)
        self->user_free(self->user);
    free(self);
}

static const tp_dataflow_ops_t s_gen_ops = {
    .name = "generator", .reset_state = s_gen_reset, .next = s_gen_next,
    .size = s_gen_size, .destroy = s_gen_destroy};

tp_dataflow_t *tp_df_generator(tp_df_generator_fn fn, void *user,
                               tp_df_free_fn user_free, int64_t size) {
    gen_t *self = fn ? calloc(1, sizeof *self) : NULL;
    if (!self) {
        if (user_free)
            user_free(user);
        tp_error(fn ? TP_ERR_NOMEM : TP_ERR_INVALID,
                 "generator: %s", fn ? "out of memory" : "NULL function");
        return NULL;
    }
    self->fn = fn;
    self->user = user;
    self->user_free = user_free;
    self->size = size < 0 ? -1 : size;
    return df_make(&s_gen_ops, self);
}

/* ---- FakeData -------------------------------------------------------------- */

typedef struct {
    int ncomp;
    tp_dtype_t dtypes[16];
    int ndims[16];
    int64_t shapes[16][TP_MAX_DIMS];
    int64_t size, pos;
    int random;
    tp_datapoint_t *fixed;  /* random=0: the one datapoint */
    tp_rng_t rng;
} fake_t;

static void s_fill_random(tp_tensor_t *t, tp_rng_t *rng) {
    size_t n = tp_tensor_numel(t);
    switch (t->dtype) {
    case TP_UINT8: {
        uint8_t *p = t->data;
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t r = tp_rng_u64(rng);
            memcpy(p + i, &r, 8);
        }
        for (; i < n; i++)
            p[i] = (uint8_t)tp_rng_u32(rng);
        break;
    }
    case TP_INT32:
        for (size_t i = 0; i < n; i++)
            ((int32_t *)t->data)[i] = (int32_t)(tp_rng_u32(rng) & 255);
        break;
    case TP_INT64:
        for (size_t i = 0; i < n; i++)
            ((int64_t *)t->data)[i] = (int64_t)(tp_rng_u32(rng) & 255);
        break;
    case TP_FLOAT32:
        for (size_t i = 0; i < n; i++)
            ((float *)t->data)[i] = tp_rng_float(rng);
        break;
    case TP_FLOAT64:
        for (size_t i = 0; i < n; i++)
            ((double *)t->data)[i] = tp_rng_double(rng);
        break;
    case TP_FLOAT16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)t->data)[i] = tp_f32_to_f16(tp_rng_float(rng));
        break;
    case TP_BFLOAT16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)t->data)[i] = tp_f32_to_bf16(tp_rng_float(rng));
        break;
    default:
        TP_ASSERT(0);
    }
}

static tp_status_t s_fake_make(fake_t *self, tp_datapoint_t **out) {
    tp_datapoint_t *dp = tp_df_datapoint_alloc(self->ncomp, self->dtypes,
                                               self->ndims,
                                               (const int64_t(*)[TP_MAX_DIMS])
                                                   self->shapes);
    if (!dp)
        return tp_error_wrap(TP_ERR_NOMEM, "fake");
    for (int i = 0; i < self->ncomp; i++)
        s_fill_random(tp_datapoint_get(dp, i), &self->rng);
    *out = dp;
    return TP_OK;
}

static tp_status_t s_fake_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                uint64_t stream) {
    fake_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "fake");
    tp_datapoint_destroy(&self->fixed);
    if (!self->random)
        TP_TRY(s_fake_make(self, &self->fixed));
    return TP_OK;
}

static tp_status_t s_fake_begin(void *impl) {
    ((fake_t *)impl)->pos = 0;
    return TP_OK;
}

static tp_status_t s_fake_next(void *impl, tp_datapoint_t **out) {
    fake_t *self = impl;
    if (self->pos >= self->size)
        return TP_DONE;
    self->pos++;
    if (self->random)
        return s_fake_make(self, out);
    *out = tp_datapoint_copy(self->fixed);
    return *out ? TP_OK : tp_error(TP_ERR_NOMEM, "fake: copy");
}

static int64_t s_fake_size(void *impl) { return ((fake_t *)impl)->size; }

static void s_fake_destroy(void *impl) {
    fake_t *self = impl;
    tp_datapoint_destroy(&self->fixed);
    free(self);
}

static const tp_dataflow_ops_t s_fake_ops = {
    .name = "fake", .reset_state = s_fake_reset, .begin = s_fake_begin,
    .next = s_fake_next, .size = s_fake_size, .destroy = s_fake_destroy};

tp_dataflow_t *tp_df_fake(const tp_df_fake_comp_t *comps, int ncomp,
                          int64_t size, int random) {
    if (ncomp < 1 || ncomp > 16 || size < 0) {
        tp_error(TP_ERR_INVALID, "fake: %d components (1..16) and size %" PRId64
                 " (>= 0)", ncomp, size);
        return NULL;
    }
    fake_t *self = calloc(1, sizeof *self);
    if (!self) {
        tp_error(TP_ERR_NOMEM, "fake");
        return NULL;
    }
    char what[512];
    uint64_t bytes = 0;
    int o = snprintf(what, sizeof what, "for one datapoint of %d component%s:", ncomp,
                     ncomp == 1 ? "" : "s");
    for (int i = 0; i < ncomp; i++) {
        size_t numel;
        if (!tp_dtype_valid((int)comps[i].dtype) ||
            tp_shape_numel(comps[i].ndim, comps[i].shape,
                           tp_dtype_size(comps[i].dtype), &numel) != TP_OK) {
            free(self);
            tp_error(TP_ERR_SHAPE, "fake: component %d has a bad dtype or "
                     "shape", i);
            return NULL;
        }
        self->dtypes[i] = comps[i].dtype;
        self->ndims[i] = comps[i].ndim;
        memcpy(self->shapes[i], comps[i].shape, sizeof comps[i].shape);
        bytes += numel * tp_dtype_size(comps[i].dtype);
        if (o > 0 && (size_t)o < sizeof what)
            o += snprintf(what + o, sizeof what - (size_t)o, "%s %s", i ? "," : "",
                          tp_dtype_name(comps[i].dtype));
        for (int d = 0; d < comps[i].ndim && o > 0 && (size_t)o < sizeof what; d++)
            o += snprintf(what + o, sizeof what - (size_t)o, "%s%lld%s", d ? "," : " [",
                          (long long)comps[i].shape[d], d + 1 == comps[i].ndim ? "]" : "");
    }
    /* A datapoint the process can never hold is refused here, shapes named,
     * not at the first next() as "datapoint of 1 components" (issue 48). */
    if (tp_mem_check(bytes, "use smaller shapes", "%s", what) < 0) {
        free(self);
        return NULL;
    }
    self->ncomp = ncomp;
    self->size = size;
    self->random = random;
    return df_make(&s_fake_ops, self);
}

/* ---- IDX files ------------------------------------------------------------- */

/* Read exactly n bytes; 1 on success, 0 at a short read or error. */
static int s_gz_read_all(gzFile f, void *buf, size_t n) {
    uint8_t *p = buf;
    while (n > 0) {
        unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        int got = gzread(f, p, chunk);
        if (got <= 0)
            return 0;
        p += got;
        n -= (size_t)got;
    }
    return 1;
}

static tp_status_t s_gz_fail(gzFile f, const char *path, const char *what) {
    int zerr = 0;
    const char *msg = gzerror(f, &zerr);
    if (zerr == Z_OK || zerr == Z_STREAM_END || zerr == Z_BUF_ERROR)
        msg = "file truncated";
    return tp_error(TP_ERR_FORMAT, "idx %s: %s (%s)", path, what, msg);
}

/* IDX is big-endian: swap 4- and 8-byte elements in place. */
static void s_idx_swap(tp_tensor_t *t) {
    size_t es = tp_dtype_size(t->dtype), n = tp_tensor_numel(t);
    if (es == 4) {
        uint32_t *p = t->data;
        for (size_t i = 0; i < n; i++)
            p[i] = __builtin_bswap32(p[i]);
    } else if (es == 8) {
        uint64_t *p = t->data;
        for (size_t i = 0; i < n; i++)
            p[i] = __builtin_bswap64(p[i]);
    }
}

tp_status_t tp_idx_read(const char *path, tp_tensor_t *out) {
    tp_tensor_init_empty(out);
    struct stat st;
    if (stat(path, &st) != 0)
        return tp_error(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO,
                        "idx %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return tp_error(TP_ERR_IO, "idx %s: not a regular file", path);
    gzFile f = gzopen(path, "rb");
    if (!f)
        return tp_error(TP_ERR_IO, "idx %s: cannot open: %s", path,
                        strerror(errno));
    gzbuffer(f, 1 << 17);
    tp_status_t rc = TP_OK;
    uint8_t magic[4];
    if (!s_gz_read_all(f, magic, 4)) {
        rc = s_gz_fail(f, path, "no IDX header");
        goto done;
    }
    if (magic[0] != 0 || magic[1] != 0) {
        rc = tp_error(TP_ERR_FORMAT, "idx %s: bad magic %02x%02x%02x%02x (not "
                      "an IDX file)", path, magic[0], magic[1], magic[2],
                      magic[3]);
        goto done;
    }
    tp_dtype_t dtype;
    switch (magic[2]) {
    case 0x08: dtype = TP_UINT8; break;
    case 0x0C: dtype = TP_INT32; break;
    case 0x0D: dtype = TP_FLOAT32; break;
    case 0x0E: dtype = TP_FLOAT64; break;
    default:
        rc = tp_error(TP_ERR_FORMAT, "idx %s: element type 0x%02x is not "
                      "supported (0x08 uint8, 0x0C int32, 0x0D float32, "
                      "0x0E float64)", path, magic[2]);
        goto done;
    }
    int ndim = magic[3];
    if (ndim < 1 || ndim > TP_MAX_DIMS) {
        rc = tp_error(TP_ERR_FORMAT, "idx %s: %d dimensions (1..%d)", path,
                      ndim, TP_MAX_DIMS);
        goto done;
    }
    uint8_t dims[4 * TP_MAX_DIMS];
    if (!s_gz_read_all(f, dims, 4 * (size_t)ndim)) {
        rc = s_gz_fail(f, path, "header truncated");
        goto done;
    }
    int64_t shape[TP_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        shape[i] = ((int64_t)dims[4 * i] << 24) | (dims[4 * i + 1] << 16) |
                   (dims[4 * i + 2] << 8) | dims[4 * i + 3];
    size_t esize = tp_dtype_size(dtype), numel;
    if (tp_shape_numel(ndim, shape, esize, &numel) != TP_OK) {
        rc = tp_error(TP_ERR_FORMAT, "idx %s: impossible shape", path);
        goto done;
    }
    /* Deflate expands at most about 1032:1: a header claiming more than
     * the file can hold is corrupt, and must not size an allocation. */
    uint64_t bound = (uint64_t)st.st_size * 1032u + 64;
    if ((uint64_t)numel * esize > bound) {
        rc = tp_error(TP_ERR_FORMAT, "idx %s: header claims %zu bytes, more "
                      "than a %lld-byte file can hold", path, numel * esize,
                      (long long)st.st_size);
        goto done;
    }
    rc = tp_tensor_init(out, dtype, ndim, shape);
    if (rc != TP_OK)
        goto done;
    if (!s_gz_read_all(f, out->data, out->nbytes)) {
        rc = s_gz_fail(f, path, "payload shorter than its header says");
        goto done;
    }
    uint8_t extra;
    int more = gzread(f, &extra, 1);
    if (more > 0) {
        rc = tp_error(TP_ERR_FORMAT, "idx %s: trailing bytes after the %zu "
                      "the header describes", path, out->nbytes);
        goto done;
    }
    if (more < 0) {
        rc = s_gz_fail(f, path, "corrupt compressed data");
        goto done;
    }
    s_idx_swap(out);
done:
    gzclose(f);
    if (rc != TP_OK)
        tp_tensor_fini(out);
    return rc;
}

tp_status_t tp_idx_decode(const void *data, size_t size, tp_tensor_t *out) {
    tp_tensor_init_empty(out);
    const uint8_t *b = data;
    if (!b || size < 4)
        return tp_error(TP_ERR_FORMAT, "idx: %zu bytes, no header", size);
    if (b[0] != 0 || b[1] != 0)
        return tp_error(TP_ERR_FORMAT, "idx: bad magic %02x%02x%02x%02x",
                        b[0], b[1], b[2], b[3]);
    tp_dtype_t dtype;
    switch (b[2]) {
    case 0x08: dtype = TP_UINT8; break;
    case 0x0C: dtype = TP_INT32; break;
    case 0x0D: dtype = TP_FLOAT32; break;
    case 0x0E: dtype = TP_FLOAT64; break;
    default:
        return tp_error(TP_ERR_FORMAT, "idx: element type 0x%02x is not "
                        "supported", b[2]);
    }
    int ndim = b[3];
    if (ndim < 1 || ndim > TP_MAX_DIMS)
        return tp_error(TP_ERR_FORMAT, "idx: %d dimensions (1..%d)", ndim,
                        TP_MAX_DIMS);
    size_t hdr = 4 + 4 * (size_t)ndim;
    if (size < hdr)
        return tp_error(TP_ERR_FORMAT, "idx: header truncated");
    int64_t shape[TP_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        const uint8_t *d = b + 4 + 4 * i;
        shape[i] = ((int64_t)d[0] << 24) | (d[1] << 16) | (d[2] << 8) | d[3];
    }
    size_t esize = tp_dtype_size(dtype), numel;
    if (tp_shape_numel(ndim, shape, esize, &numel) != TP_OK)
        return tp_error(TP_ERR_FORMAT, "idx: impossible shape");
    if (numel * esize != size - hdr)
        return tp_error(TP_ERR_FORMAT, "idx: header describes %zu payload "
                        "bytes, %zu follow it", numel * esize, size - hdr);
    TP_TRY(tp_tensor_init(out, dtype, ndim, shape));
    if (out->nbytes)
        memcpy(out->data, b + hdr, out->nbytes);
    s_idx_swap(out);
    return TP_OK;
}

/* The decoded arrays, owned by the source. Datapoints never point into
 * them: each gets its own copy (next), or the bytes go straight into a
 * batch (next_into), so a consumer may write into what it receives and
 * keep it after the source is gone. (Reference-counted views into these
 * arrays measured no faster than the small copies, about 0.4x of the plain
 * loop either way before next_into existed, and would make every in-place
 * map a hazard.) */
typedef struct {
    tp_tensor_t images, labels;
} slab_t;

static void s_slab_free(slab_t *sl) {
    tp_tensor_fini(&sl->images);
    tp_tensor_fini(&sl->labels);
    free(sl);
}

typedef struct {
    const char *name;
    slab_t *slab;         /* images [N, ...sample shape], labels int32 [N] */
    int has_labels;
    size_t n, sample_bytes;
    uint32_t *order;      /* [n] */
    size_t pos;
    int shuffle;
    tp_tensor_t tmpl[2];  /* shapes of the two components, no data */
    tp_rng_t rng;
} idx_t;

static tp_status_t s_idx_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                               uint64_t stream) {
    idx_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, self->name);
    return TP_OK;
}

static tp_status_t s_idx_begin(void *impl) {
    idx_t *self = impl;
    df_iota_shuffle(self->order, self->n, self->shuffle ? &self->rng : NULL);
    self->pos = 0;
    return TP_OK;
}

int tp_df_tensor_is_shared(const tp_tensor_t *t) {
    return t->data && t->free_fn == NULL;
}

tp_status_t tp_df_tensor_make_writable(tp_tensor_t *t) {
    if (!tp_df_tensor_is_shared(t))
        return TP_OK;
    tp_tensor_t c;
    TP_TRY(tp_tensor_copy(&c, t));
    tp_tensor_fini(t);
    tp_tensor_move(t, &c);
    return TP_OK;
}

static tp_status_t s_idx_next(void *impl, tp_datapoint_t **out) {
    idx_t *self = impl;
    if (self->pos >= self->n)
        return TP_DONE;
    size_t k = self->order[self->pos++];
    int ncomp = self->has_labels ? 2 : 1;
    /* One allocation holds the image and the label: a small owned copy,
     * so a consumer may write into it and it outlives this source. */
    size_t lab_off = (self->sample_bytes + 15) & ~(size_t)15;
    df_block_t *b = malloc(sizeof *b + lab_off + 4);
    tp_datapoint_t *dp = b ? tp_datapoint_new(ncomp) : NULL;
    if (!dp) {
        free(b);
        return tp_error(TP_ERR_NOMEM, "%s: datapoint", self->name);
    }
    atomic_init(&b->refs, ncomp);
    uint8_t *payload = (uint8_t *)(b + 1);
    const slab_t *sl = self->slab;
    memcpy(payload, (const uint8_t *)sl->images.data + k * self->sample_bytes,
           self->sample_bytes);
    tp_tensor_t *t = tp_datapoint_get(dp, 0);
    *t = self->tmpl[0];
    t->data = payload;
    t->free_hint = b;
    if (self->has_labels) {
        memcpy(payload + lab_off, (const int32_t *)sl->labels.data + k, 4);
        t = tp_datapoint_get(dp, 1);
        *t = self->tmpl[1];
        t->data = payload + lab_off;
        t->free_hint = b;
    }
    *out = dp;
    return TP_OK;
}

/* The batching fast path: copy straight from the decoded arrays into the
 * batch, no datapoint in between. */
static tp_status_t s_idx_next_into(void *impl, tp_datapoint_t *batch,
                                   int64_t slot, int64_t count,
                                   int64_t *filled) {
    idx_t *self = impl;
    *filled = 0;
    if (self->pos >= self->n)
        return TP_DONE;
    int ncomp = self->has_labels ? 2 : 1;
    size_t istride = 0, lstride = 0;
    uint8_t *img = df_slot(batch, ncomp, 0, slot, count, self->tmpl[0].dtype,
                           self->tmpl[0].ndim, self->tmpl[0].shape,
                           self->name, &istride);
    int32_t *lab = img && ncomp == 2
                       ? df_slot(batch, ncomp, 1, slot, count, TP_INT32, 0,
                                 NULL, self->name, &lstride)
                       : NULL;
    if (!img || (ncomp == 2 && !lab))
        return TP_ERR_SHAPE;
    const slab_t *sl = self->slab;
    const uint8_t *images = sl->images.data;
    const int32_t *labels = sl->labels.data;
    size_t sb = self->sample_bytes;
    int64_t j = 0;
    for (; j < count && self->pos < self->n; j++) {
        size_t k = self->order[self->pos++];
        if (self->shuffle && self->pos + 3 < self->n) {
            /* Random rows defeat the hardware prefetcher: ask for a row a
             * few samples ahead, one cache line at a time. */
            const uint8_t *ahead =
                images + (size_t)self->order[self->pos + 3] * sb;
            for (size_t off = 0; off < sb; off += 64)
                __builtin_prefetch(ahead + off);
        }
        memcpy(img + (size_t)j * sb, images + k * sb, sb);
        if (lab)
            lab[j] = labels[k];
    }
    *filled = j;
    return j < count ? TP_DONE : TP_OK;
}

static int64_t s_idx_size(void *impl) { return (int64_t)((idx_t *)impl)->n; }

static void s_idx_destroy(void *impl) {
    idx_t *self = impl;
    if (self->slab)
        s_slab_free(self->slab);
    free(self->order);
    free(self);
}

static const tp_dataflow_ops_t s_idx_ops = {
    .name = "idx", .reset_state = s_idx_reset, .begin = s_idx_begin,
    .next = s_idx_next, .size = s_idx_size, .destroy = s_idx_destroy,
    .next_into = s_idx_next_into};
static const tp_dataflow_ops_t s_fmnist_ops = {
    .name = "fashion-mnist", .reset_state = s_idx_reset, .begin = s_idx_begin,
    .next = s_idx_next, .size = s_idx_size, .destroy = s_idx_destroy,
    .next_into = s_idx_next_into};

static tp_dataflow_t *s_idx_new(const tp_dataflow_ops_t *ops,
                                const char *images_path,
                                const char *labels_path, int shuffle) {
    if (!images_path) {
        tp_error(TP_ERR_INVALID, "%s: no images file given", ops->name);
        return NULL;
    }
    idx_t *self = calloc(1, sizeof *self);
    if (!self) {
        tp_error(TP_ERR_NOMEM, "%s", ops->name);
        return NULL;
    }
    self->name = ops->name;
    self->shuffle = shuffle;
    self->slab = calloc(1, sizeof *self->slab);
    if (!self->slab) {
        free(self);
        tp_error(TP_ERR_NOMEM, "%s", ops->name);
        return NULL;
    }
    tp_tensor_init_empty(&self->slab->labels);
    tp_status_t rc = tp_idx_read(images_path, &self->slab->images);
    if (rc != TP_OK)
        goto fail;
    self->n = (size_t)self->slab->images.shape[0];
    if (self->n > UINT32_MAX) {
        rc = tp_error(TP_ERR_FORMAT, "idx %s: %zu items, at most %u",
                      images_path, self->n, UINT32_MAX);
        goto fail;
    }
    self->sample_bytes = self->n ? self->slab->images.nbytes / self->n : 0;
    if (labels_path) {
        tp_tensor_t raw;
        rc = tp_idx_read(labels_path, &raw);
        if (rc != TP_OK)
            goto fail;
        if (raw.ndim != 1 || (size_t)raw.shape[0] != self->n ||
            (raw.dtype != TP_UINT8 && raw.dtype != TP_INT32)) {
            char d[64];
            rc = tp_error(TP_ERR_FORMAT, "idx %s: labels are %s, expected "
                          "uint8 or int32 [%zu] to match %s", labels_path,
                          tp_tensor_describe(&raw, d, sizeof d), self->n,
                          images_path);
            tp_tensor_fini(&raw);
            goto fail;
        }
        if (raw.dtype == TP_INT32) {
            tp_tensor_move(&self->slab->labels, &raw);
        } else {
            int64_t shape[1] = {(int64_t)self->n};
            rc = tp_tensor_init(&self->slab->labels, TP_INT32, 1, shape);
            if (rc == TP_OK)
                for (size_t i = 0; i < self->n; i++)
                    ((int32_t *)self->slab->labels.data)[i] =
                        ((const uint8_t *)raw.data)[i];
            tp_tensor_fini(&raw);
            if (rc != TP_OK)
                goto fail;
        }
        self->has_labels = 1;
    }
    self->order = calloc(self->n ? self->n : 1, sizeof *self->order);
    if (!self->order) {
        rc = tp_error(TP_ERR_NOMEM, "%s: order of %zu", ops->name, self->n);
        goto fail;
    }
    tp_tensor_init_empty(&self->tmpl[0]);
    self->tmpl[0].dtype = self->slab->images.dtype;
    self->tmpl[0].ndim = self->slab->images.ndim - 1;
    for (int i = 1; i < self->slab->images.ndim; i++)
        self->tmpl[0].shape[i - 1] = self->slab->images.shape[i];
    self->tmpl[0].nbytes = self->sample_bytes;
    self->tmpl[0].free_fn = df_block_release;
    tp_tensor_init_empty(&self->tmpl[1]);
    self->tmpl[1].dtype = TP_INT32;
    self->tmpl[1].nbytes = 4;
    self->tmpl[1].free_fn = df_block_release;
    return df_make(ops, self);
fail:
    s_idx_destroy(self);
    (void)rc;
    return NULL;
}

tp_dataflow_t *tp_df_idx(const char *images_path, const char *labels_path,
                         int shuffle) {
    return s_idx_new(&s_idx_ops, images_path, labels_path, shuffle);
}

const char *tp_df_fashion_mnist_dir(void) {
    const char *d = getenv("TP_FASHION_MNIST_DIR");
    return d && *d ? d : "/usr/share/datasets/fashion-mnist";
}

tp_dataflow_t *tp_df_fashion_mnist(const char *split, int shuffle) {
    const char *prefix;
    if (split && !strcmp(split, "train"))
        prefix = "train";
    else if (split && !strcmp(split, "test"))
        prefix = "t10k";
    else {
        tp_error(TP_ERR_INVALID, "fashion-mnist: unknown split '%s' (train "
                 "or test)", split ? split : "(null)");
        return NULL;
    }
    const char *dir = tp_df_fashion_mnist_dir();
    char img[4096], lab[4096];
    snprintf(img, sizeof img, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    snprintf(lab, sizeof lab, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    tp_dataflow_t *df = s_idx_new(&s_fmnist_ops, img, lab, shuffle);
    if (!df)
        tp_error_wrap(TP_ERR_NOT_FOUND, "fashion-mnist %s (install Debian's "
                      "dataset-fashion-mnist or set TP_FASHION_MNIST_DIR)",
                      split);
    return df;
}
