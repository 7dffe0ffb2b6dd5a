/* towerpack gpu: safetensors reading and writing, and model checkpoints.
 *
 * The reader trusts nothing: the length prefix must fit the file, the
 * header must be a JSON object whose entries name known dtypes, sane
 * shapes and offsets that tile the data section exactly (in bounds,
 * contiguous, non-overlapping, shape x dtype size == byte length). Only then
 * are views handed out. Tensor bytes are copied with memcpy, never read
 * through a typed pointer, since safetensors does not align them.
 *
 * safetensors has no checksum of its own, so the writer adds one: metadata
 * key "xxh3_64" holds the XXH3-64 (libxxhash) of every tensor's bytes, 16
 * hex digits each, comma-separated, in the order the tensors lie in the
 * data section. One sum per tensor names the damaged tensor; any reader
 * that ignores the key still reads the file. Loaders verify it, refuse
 * non-finite values and range-check the trainer state before they change
 * the model. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <towerpack/checkpoint.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/optim.h>

#include "gpu/graph/graph_internal.h"

#define HEADER_MAX (100u << 20) /* the reference reader's limit */
#define FORMAT_TAG "towerpack-checkpoint-1"

typedef struct {
    char *name;
    tp_dtype_t dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    size_t begin, end; /* into the data section */
} s_entry_t;

struct tp_safetensors {
    unsigned char *buf; /* the whole file */
    size_t size;
    const unsigned char *data; /* data section */
    s_entry_t *entries;
    size_t count;
    char **meta_keys, **meta_vals;
    size_t nmeta;
};

static const struct {
    const char *name;
    tp_dtype_t dtype;
} s_dtypes[] = {{"U8", TP_UINT8},    {"I32", TP_INT32},  {"I64", TP_INT64},
                {"F16", TP_FLOAT16}, {"BF16", TP_BFLOAT16},
                {"F32", TP_FLOAT32}, {"F64", TP_FLOAT64}};

static const char *s_dtype_st(tp_dtype_t d) {
    for (size_t i = 0; i < sizeof s_dtypes / sizeof *s_dtypes; i++)
        if (s_dtypes[i].dtype == d)
            return s_dtypes[i].name;
    return NULL;
}

/* ---- writing ------------------------------------------------------------ */

/* The header; `sums` (NULL for none) is the checksum key's value, written
 * in place of any the caller passed. */
static char *s_header(const tp_named_tensor_t *ts, size_t n,
                      const tp_meta_kv_t *meta, size_t nmeta, const char *sums) {
    json_t *root = json_object();
    size_t off = 0;
    int ok = root != NULL;
    if (ok && (nmeta > 0 || sums)) {
        json_t *m = json_object();
        ok = m && json_object_set_new(root, "__metadata__", m) == 0;
        for (size_t i = 0; ok && i < nmeta; i++)
            if (!sums || strcmp(meta[i].key, TP_SAFETENSORS_CHECKSUM_KEY))
                ok = json_object_set_new(m, meta[i].key,
                                         json_string(meta[i].value)) == 0;
        if (ok && sums)
            ok = json_object_set_new(m, TP_SAFETENSORS_CHECKSUM_KEY,
                                     json_string(sums)) == 0;
    }
    for (size_t i = 0; ok && i < n; i++) {
        const tp_tensor_t *t = ts[i].tensor;
        json_t *e = json_object(), *shape = json_array();
        ok = e && shape;
        for (int d = 0; ok && d < t->ndim; d++)
            ok = json_array_append_new(shape, json_integer(t->shape[d])) == 0;
        ok = ok && json_object_set_new(e, "dtype",
                                       json_string(s_dtype_st(t->dtype))) == 0;
        ok = ok && json_object_set_new(e, "shape", shape) == 0;
        shape = NULL;
        ok = ok && json_object_set_new(
                       e, "data_offsets",
                       json_pack("[II]", (json_int_t)off,
                                 (json_int_t)(off + t->nbytes))) == 0;
        ok = ok && json_object_set_new(root, ts[i].name, e) == 0;
        if (!ok) {
            json_decref(shape);
            json_decref(e);
        }
        off += t->nbytes;
    }
    char *s = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

tp_status_t tp_safetensors_write(const char *path,
                                 const tp_named_tensor_t *ts, size_t n,
                                 const tp_meta_kv_t *meta, size_t nmeta) {
    if (!path)
        return tp_error(TP_ERR_INVALID, "safetensors: NULL path");
    for (size_t i = 0; i < n; i++) {
        if (!ts[i].name || !*ts[i].name || !strcmp(ts[i].name, "__metadata__"))
            return tp_error(TP_ERR_INVALID, "safetensors %s: tensor %zu has a "
                                            "bad name", path, i);
        if (!s_dtype_st(ts[i].tensor->dtype))
            return tp_error(TP_ERR_INVALID, "safetensors %s: '%s' has dtype %s",
                            path, ts[i].name,
                            tp_dtype_name(ts[i].tensor->dtype));
        for (size_t j = 0; j < i; j++)
            if (!strcmp(ts[i].name, ts[j].name))
                return tp_error(TP_ERR_INVALID,
                                "safetensors %s: name '%s' used twice", path,
                                ts[i].name);
    }
    for (size_t i = 0; i < nmeta; i++)
        if (!meta[i].key || !meta[i].value)
            return tp_error(TP_ERR_INVALID, "safetensors %s: metadata %zu is "
                                            "NULL", path, i);
    /* the tensors' sums, in file order (the order they are written) */
    char *sums = malloc(n * 17 + 1);
    if (!sums)
        return tp_error(TP_ERR_NOMEM, "safetensors %s: checksums", path);
    size_t at = 0;
    sums[0] = '\0';
    for (size_t i = 0; i < n; i++)
        at += (size_t)snprintf(sums + at, 18, "%s%016llx", i ? "," : "",
                               (unsigned long long)XXH3_64bits(
                                   ts[i].tensor->data, ts[i].tensor->nbytes));
    char *hdr = s_header(ts, n, meta, nmeta, n ? sums : NULL);
    free(sums);
    if (!hdr)
        return tp_error(TP_ERR_NOMEM, "safetensors %s: header (names must be "
                                      "UTF-8)", path);
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) & ~(size_t)7;
    /* core's one atomic write: PATH.tmp.<pid>, fsync, rename, fsync of the
     * directory (tp_atomic_file_sweep knows its temporaries) */
    tp_atomic_file_t f;
    tp_status_t rc = tp_atomic_file_open(&f, path);
    if (rc != TP_OK) {
        free(hdr);
        return rc;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    rc = tp_atomic_file_write(&f, len8, 8);
    if (rc == TP_OK)
        rc = tp_atomic_file_write(&f, hdr, hlen);
    if (rc == TP_OK && padded > hlen)
        rc = tp_atomic_file_write(&f, "        ", padded - hlen);
    for (size_t i = 0; rc == TP_OK && i < n; i++)
        rc = tp_atomic_file_write(&f, ts[i].tensor->data, ts[i].tensor->nbytes);
    free(hdr);
    if (rc != TP_OK) {
        tp_atomic_file_abort(&f);
        return rc;
    }
    return tp_atomic_file_commit(&f);
}

/* ---- reading ------------------------------------------------------------ */

void tp_safetensors_destroy(tp_safetensors_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_safetensors_t *st = *self_p;
    for (size_t i = 0; i < st->count; i++)
        free(st->entries[i].name);
    free(st->entries);
    for (size_t i = 0; i < st->nmeta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_vals[i]);
    }
    free(st->meta_keys);
    free(st->meta_vals);
    free(st->buf);
    free(st);
    *self_p = NULL;
}

static int s_cmp_begin(const void *a, const void *b) {
    const s_entry_t *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

#define BAD(...) (rc = tp_error(TP_ERR_FORMAT, __VA_ARGS__))

static tp_status_t s_parse_entry(const char *what, const char *key,
                                 json_t *val, size_t data_size, s_entry_t *e) {
    tp_status_t rc = TP_OK;
    if (!json_is_object(val))
        return BAD("%s: tensor '%s': entry is not an object", what, key);
    json_t *dt = json_object_get(val, "dtype");
    json_t *shape = json_object_get(val, "shape");
    json_t *offs = json_object_get(val, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
        return BAD("%s: tensor '%s': needs string dtype, array shape and "
                   "data_offsets", what, key);
    if (json_object_size(val) != 3)
        return BAD("%s: tensor '%s': unexpected fields", what, key);
    int found = 0;
    for (size_t i = 0; i < sizeof s_dtypes / sizeof *s_dtypes; i++)
        if (!strcmp(json_string_value(dt), s_dtypes[i].name)) {
            e->dtype = s_dtypes[i].dtype;
            found = 1;
        }
    if (!found)
        return BAD("%s: tensor '%s': unsupported dtype '%s'", what, key,
                   json_string_value(dt));
    size_t nd = json_array_size(shape);
    if (nd > TP_MAX_DIMS)
        return BAD("%s: tensor '%s': %zu dims (at most %d)", what, key, nd,
                   TP_MAX_DIMS);
    e->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return BAD("%s: tensor '%s': shape dim %zu is not a non-negative "
                       "integer", what, key, i);
        e->shape[i] = (int64_t)json_integer_value(d);
    }
    if (json_array_size(offs) != 2 ||
        !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)))
        return BAD("%s: tensor '%s': data_offsets must be two integers", what,
                   key);
    json_int_t b = json_integer_value(json_array_get(offs, 0));
    json_int_t en = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || en < b || (uint64_t)en > data_size)
        return BAD("%s: tensor '%s': data_offsets [%lld,%lld] outside the "
                   "%zu-byte data section%s", what, key, (long long)b,
                   (long long)en, data_size,
                   b >= 0 && en >= b ? " (the file is cut short: truncated, or "
                                       "not written whole)" : "");
    e->begin = (size_t)b;
    e->end = (size_t)en;
    size_t numel;
    if (tp_shape_numel(e->ndim, e->shape, tp_dtype_size(e->dtype), &numel) < 0)
        return BAD("%s: tensor '%s': shape overflows", what, key);
    if (numel * tp_dtype_size(e->dtype) != e->end - e->begin)
        return BAD("%s: tensor '%s': shape needs %zu bytes, offsets give %zu",
                   what, key, numel * tp_dtype_size(e->dtype),
                   e->end - e->begin);
    return TP_OK;
}

/* Validate st->buf (st->size bytes) and fill the index. */
static tp_status_t s_index(tp_safetensors_t *st, const char *what) {
    tp_status_t rc = TP_OK;
    if (st->size < 8)
        return BAD("%s: %zu bytes: too short for a safetensors file", what,
                   st->size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)st->buf[i] << (8 * i);
    if (hlen > HEADER_MAX || hlen > st->size - 8)
        return BAD("%s: header length %" PRIu64 " exceeds the file (%zu "
                   "bytes) or the %u-byte limit (truncated or not safetensors)",
                   what, hlen, st->size, HEADER_MAX);
    if (hlen < 2 || st->buf[8] != '{')
        return BAD("%s: header does not start with a JSON object", what);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)st->buf + 8, (size_t)hlen,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return BAD("%s: header JSON: %s at byte %d", what, jerr.text,
                   jerr.position);
    st->data = st->buf + 8 + hlen;
    size_t data_size = st->size - 8 - (size_t)hlen;
    if (!json_is_object(root)) {
        json_decref(root);
        return BAD("%s: header is not a JSON object", what);
    }
    size_t n = json_object_size(root);
    st->entries = calloc(n + 1, sizeof *st->entries);
    st->meta_keys = calloc(n + 1, sizeof(char *));
    st->meta_vals = calloc(n + 1, sizeof(char *));
    if (!st->entries || !st->meta_keys || !st->meta_vals) {
        json_decref(root);
        return tp_error(TP_ERR_NOMEM, "%s: index", what);
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) {
                BAD("%s: __metadata__ is not an object", what);
                break;
            }
            const char *mk;
            json_t *mv;
            size_t nm = json_object_size(val);
            free(st->meta_keys);
            free(st->meta_vals);
            st->meta_keys = calloc(nm + 1, sizeof(char *));
            st->meta_vals = calloc(nm + 1, sizeof(char *));
            if (!st->meta_keys || !st->meta_vals) {
                rc = tp_error(TP_ERR_NOMEM, "%s: metadata", what);
                break;
            }
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    BAD("%s: metadata '%s' is not a string", what, mk);
                    break;
                }
                st->meta_keys[st->nmeta] = strdup(mk);
                st->meta_vals[st->nmeta] = strdup(json_string_value(mv));
                st->nmeta++;
                if (!st->meta_keys[st->nmeta - 1] ||
                    !st->meta_vals[st->nmeta - 1]) {
                    rc = tp_error(TP_ERR_NOMEM, "%s: metadata", what);
                    break;
                }
            }
            if (rc < 0)
                break;
            continue;
        }
        s_entry_t *e = &st->entries[st->count];
        rc = s_parse_entry(what, key, val, data_size, e);
        if (rc < 0)
            break;
        e->name = strdup(key);
        if (!e->name) {
            rc = tp_error(TP_ERR_NOMEM, "%s: names", what);
            break;
        }
        st->count++;
    }
    json_decref(root);
    if (rc < 0)
        return rc;
    /* The tensors must tile the data section: sorted by start, each begins
     * where the previous ended, the last ends at the end of the file. */
    s_entry_t *sorted = malloc((st->count + 1) * sizeof *sorted);
    if (!sorted)
        return tp_error(TP_ERR_NOMEM, "%s: index", what);
    memcpy(sorted, st->entries, st->count * sizeof *sorted);
    qsort(sorted, st->count, sizeof *sorted, s_cmp_begin);
    size_t pos = 0;
    for (size_t i = 0; i < st->count && rc == TP_OK; i++) {
        if (sorted[i].begin != pos)
            BAD("%s: tensor '%s' starts at byte %zu of the data section, "
                "expected %zu (%s)", what, sorted[i].name, sorted[i].begin,
                pos, sorted[i].begin < pos ? "overlap" : "gap");
        pos = sorted[i].end;
    }
    if (rc == TP_OK && pos != data_size)
        BAD("%s: the tensors cover %zu bytes but the data section has %zu "
            "(truncated or trailing bytes)", what, pos, data_size);
    free(sorted);
    return rc;
}

tp_status_t tp_safetensors_parse(const void *data, size_t size,
                                 const char *what, tp_safetensors_t **out) {
    *out = NULL;
    tp_safetensors_t *st = calloc(1, sizeof *st);
    if (!st)
        return tp_error(TP_ERR_NOMEM, "safetensors");
    st->buf = malloc(size ? size : 1);
    if (!st->buf) {
        free(st);
        return tp_error(TP_ERR_NOMEM, "%s: %zu bytes", what, size);
    }
    if (size)
        memcpy(st->buf, data, size);
    st->size = size;
    tp_status_t rc = s_index(st, what ? what : "safetensors");
    if (rc < 0) {
        tp_safetensors_destroy(&st);
        return rc;
    }
    *out = st;
    return TP_OK;
}

tp_status_t tp_safetensors_open(const char *path, tp_safetensors_t **out) {
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO (or a tty) for reading would otherwise
     * block until a writer comes, before the regular-file check below could
     * refuse it. On a regular file it changes nothing. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return tp_error(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO,
                        "open %s: %s", path, strerror(errno));
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int err = errno;
        close(fd);
        return tp_error(TP_ERR_IO, "%s: not a regular file (%s): refusing to "
                        "read it", path,
                        S_ISFIFO(sb.st_mode)  ? "a FIFO"
                        : S_ISDIR(sb.st_mode) ? "a directory"
                        : S_ISCHR(sb.st_mode) ? "a character device"
                        : S_ISBLK(sb.st_mode) ? "a block device"
                        : S_ISSOCK(sb.st_mode) ? "a socket"
                                               : strerror(err));
    }
    size_t size = (size_t)sb.st_size;
    tp_safetensors_t *st = calloc(1, sizeof *st);
    if (st)
        st->buf = malloc(size ? size : 1);
    if (!st || !st->buf) {
        free(st);
        close(fd);
        return tp_error(TP_ERR_NOMEM, "%s: %zu bytes", path, size);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, st->buf + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    st->size = got;
    tp_status_t rc = s_index(st, path);
    if (rc < 0) {
        tp_safetensors_destroy(&st);
        return rc;
    }
    *out = st;
    return TP_OK;
}

size_t tp_safetensors_count(const tp_safetensors_t *st) { return st->count; }

const char *tp_safetensors_name(const tp_safetensors_t *st, size_t i) {
    return i < st->count ? st->entries[i].name : NULL;
}

static const s_entry_t *s_find(const tp_safetensors_t *st, const char *name) {
    for (size_t i = 0; i < st->count; i++)
        if (!strcmp(st->entries[i].name, name))
            return &st->entries[i];
    return NULL;
}

tp_status_t tp_safetensors_get(const tp_safetensors_t *st, const char *name,
                               tp_tensor_t *view) {
    tp_tensor_init_empty(view);
    const s_entry_t *e = name ? s_find(st, name) : NULL;
    if (!e)
        return tp_error(TP_ERR_NOT_FOUND, "no tensor named '%s'",
                        name ? name : "(null)");
    return tp_tensor_init_wrap(view, e->dtype, e->ndim, e->shape,
                               (void *)(st->data + e->begin), NULL, NULL);
}

const char *tp_safetensors_meta(const tp_safetensors_t *st, const char *key) {
    for (size_t i = 0; key && i < st->nmeta; i++)
        if (!strcmp(st->meta_keys[i], key))
            return st->meta_vals[i];
    return NULL;
}

/* ---- checksums and values ------------------------------------------------ */

/* File order: by start, and an empty tensor before the one that starts
 * where it lies (the writer's order; two empty ones have the same sum). */
static int s_cmp_file_order(const void *a, const void *b) {
    const s_entry_t *x = *(const s_entry_t *const *)a, *y = *(const s_entry_t *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* 16 hex digits at p -> *v; 0 when they are not. */
static int s_hex16(const char *p, uint64_t *v) {
    uint64_t x = 0;
    for (int k = 0; k < 16; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return 0;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 1;
}

tp_status_t tp_safetensors_verify(const tp_safetensors_t *st, const char *what,
                                  int *checked) {
    tp_status_t rc = TP_OK;
    if (checked)
        *checked = 0;
    what = what ? what : "safetensors";
    const char *sums = tp_safetensors_meta(st, TP_SAFETENSORS_CHECKSUM_KEY);
    if (!sums)
        return TP_OK;
    /* the sums are in file order: the entries sorted by where they start */
    const s_entry_t **order = malloc((st->count + 1) * sizeof *order);
    if (!order)
        return tp_error(TP_ERR_NOMEM, "%s: checksums of %zu tensors", what,
                        st->count);
    for (size_t i = 0; i < st->count; i++)
        order[i] = &st->entries[i];
    qsort(order, st->count, sizeof *order, s_cmp_file_order);
    const s_entry_t *first = NULL;
    uint64_t want1 = 0, got1 = 0;
    size_t nbad = 0, len = strlen(sums);
    if (len != (st->count ? 17 * st->count - 1 : 0))
        BAD("%s: metadata '%s' holds %zu characters, not the %zu sums of "
            "16 hex digits (comma-separated) of its %zu tensors", what,
            TP_SAFETENSORS_CHECKSUM_KEY, len, st->count, st->count);
    for (size_t i = 0; rc == TP_OK && i < st->count; i++) {
        uint64_t want;
        const char *p = sums + 17 * i;
        if (!s_hex16(p, &want) || (i + 1 < st->count && p[16] != ',')) {
            BAD("%s: metadata '%s': sum %zu (for tensor '%s') is not 16 hex "
                "digits", what, TP_SAFETENSORS_CHECKSUM_KEY, i, order[i]->name);
            break;
        }
        uint64_t got = XXH3_64bits(st->data + order[i]->begin,
                                   order[i]->end - order[i]->begin);
        if (got != want && !nbad++) {
            first = order[i];
            want1 = want;
            got1 = got;
        }
    }
    if (rc == TP_OK && nbad) {
        char more[64] = "";
        if (nbad > 1)
            snprintf(more, sizeof more, " (and %zu more of its %zu tensors)",
                     nbad - 1, st->count);
        BAD("%s: tensor '%s' fails its checksum%s: XXH3-64 %016llx recorded, "
            "%016llx computed over its %zu bytes: the file is damaged", what,
            first->name, more, (unsigned long long)want1,
            (unsigned long long)got1, first->end - first->begin);
    }
    free(order);
    if (rc == TP_OK && checked)
        *checked = 1;
    return rc;
}

/* The checksums of a checkpoint; one without them (written before towerpack
 * had them) loads, with a warning the first time in a process. */
static tp_status_t s_verify_sums(const tp_safetensors_t *st, const char *path) {
    static atomic_int warned;
    int checked = 0;
    TP_TRY(tp_safetensors_verify(st, path, &checked));
    if (!checked && st->count && !atomic_exchange(&warned, 1))
        TP_WARN("checkpoint %s has no checksum (metadata '%s'; written by an "
                "older towerpack): its tensor data cannot be verified; saving it "
                "again adds one (said once per process)", path,
                TP_SAFETENSORS_CHECKSUM_KEY);
    return TP_OK;
}

/* Refuse a float tensor holding NaN or an infinity: loaded, it would
 * only show up steps later as a NaN loss (or a predictor's constant
 * answer). Other dtypes pass. */
static tp_status_t s_check_finite(const tp_safetensors_t *st, const s_entry_t *e,
                                  const char *path) {
    size_t width = tp_dtype_size(e->dtype), n = width ? (e->end - e->begin) / width : 0;
    const unsigned char *p = st->data + e->begin;
    for (size_t i = 0; i < n; i++) {
        int kind = 0; /* 1 NaN, 2 +inf, 3 -inf */
        if (e->dtype == TP_FLOAT32) {
            float f;
            memcpy(&f, p + 4 * i, 4);
            if (!isfinite(f))
                kind = isnan(f) ? 1 : f > 0 ? 2 : 3;
        } else if (e->dtype == TP_FLOAT64) {
            double f;
            memcpy(&f, p + 8 * i, 8);
            if (!isfinite(f))
                kind = isnan(f) ? 1 : f > 0 ? 2 : 3;
        } else if (e->dtype == TP_FLOAT16 || e->dtype == TP_BFLOAT16) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint16_t ex = e->dtype == TP_FLOAT16 ? 0x7c00 : 0x7f80;
            if ((h & ex) == ex)
                kind = (h & (uint16_t)(~ex & 0x7fff)) ? 1 : (h & 0x8000) ? 3 : 2;
        } else {
            return TP_OK;
        }
        if (kind)
            return tp_error(TP_ERR_FORMAT, "checkpoint %s: tensor '%s' holds %s "
                            "(element %zu of %zu): refusing non-finite weights",
                            path, e->name, kind == 1 ? "NaN" : kind == 2 ? "+inf" : "-inf",
                            i, n);
    }
    return TP_OK;
}

/* Largest optimizer step accepted: a float counts updates exactly up to
 * 2^53, and Adam's bias correction reads the count as a float. */
#define S_STEP_MAX ((int64_t)1 << 53)

/* The value of "optimizer/step" (int64 scalar), range-checked. */
static tp_status_t s_read_opt_step(const tp_safetensors_t *st, const s_entry_t *e,
                                   const char *path, int64_t *step) {
    if (e->dtype != TP_INT64 || e->ndim != 0)
        return tp_error(TP_ERR_FORMAT, "checkpoint %s: tensor 'optimizer/step' "
                        "is not an int64 scalar", path);
    memcpy(step, st->data + e->begin, sizeof *step);
    if (*step < 0 || *step > S_STEP_MAX)
        return tp_error(TP_ERR_FORMAT, "checkpoint %s: tensor 'optimizer/step' is "
                        "%lld, outside 0..2^53 (the optimizer's count of updates)",
                        path, (long long)*step);
    return TP_OK;
}

/* ---- model checkpoints -------------------------------------------------- */

static void s_rng_hex(const tp_rng_t *r, char *buf) {
    sprintf(buf, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64,
            r->s[0], r->s[1], r->s[2], r->s[3]);
}

static int s_rng_parse(const char *s, tp_rng_t *r) {
    if (!s || strlen(s) != 64)
        return 0;
    for (int i = 0; i < 4; i++) {
        char part[17];
        memcpy(part, s + 16 * i, 16);
        part[16] = 0;
        char *end;
        errno = 0;
        r->s[i] = strtoull(part, &end, 16);
        if (*end || errno)
            return 0;
    }
    return 1; /* even an all-zero (unseeded) state round-trips as saved */
}

static int s_parse_i64(const char *s, int64_t *v) {
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*end || errno)
        return 0;
    *v = x;
    return 1;
}

/* The trainer state of the metadata into *ts, range-checked: epoch and
 * global_step integers >= 0, rng 64 hex digits. *have: the file holds
 * epoch and global_step. steps_per_epoch > 0 (a resume) also needs them
 * and checks them against the schedule: epoch E ends at step E x
 * steps_per_epoch, and a checkpoint taken within epoch E (a
 * PeriodicTrigger of every k steps) lies after the end of E - 1. */
static tp_status_t s_read_state(const tp_safetensors_t *st, const char *path,
                                int64_t steps_per_epoch, tp_train_state_t *ts,
                                int *have) {
    static const char *keys[2] = {"epoch", "global_step"};
    int64_t v[2] = {0, 0};
    memset(ts, 0, sizeof *ts);
    *have = 1;
    for (int k = 0; k < 2; k++) {
        const char *s = tp_safetensors_meta(st, keys[k]);
        if (!s) {
            *have = 0;
            continue;
        }
        if (!s_parse_i64(s, &v[k]) || v[k] < 0)
            return tp_error(TP_ERR_FORMAT, "checkpoint %s: metadata '%s' is '%.40s', "
                            "not an integer >= 0", path, keys[k], s);
    }
    const char *rg = tp_safetensors_meta(st, "rng");
    if (rg && !s_rng_parse(rg, &ts->rng))
        return tp_error(TP_ERR_FORMAT, "checkpoint %s: metadata 'rng' is not 64 hex "
                        "digits", path);
    ts->epoch = v[0];
    ts->global_step = v[1];
    if (steps_per_epoch <= 0)
        return TP_OK;
    if (!*have)
        return tp_error(TP_ERR_FORMAT, "checkpoint %s: no trainer state (metadata "
                        "'epoch', 'global_step')", path);
    int64_t hi, lo;
    if (__builtin_mul_overflow(v[0], steps_per_epoch, &hi))
        return tp_error(TP_ERR_FORMAT, "checkpoint %s: metadata 'epoch' %lld at %lld "
                        "steps per epoch overflows the step count", path,
                        (long long)v[0], (long long)steps_per_epoch);
    lo = v[0] > 0 ? hi - steps_per_epoch + 1 : 0;
    if (v[1] < lo || v[1] > hi)
        return tp_error(TP_ERR_FORMAT, "checkpoint %s: metadata 'global_step' %lld "
                        "disagrees with 'epoch' %lld at %lld steps per epoch (expected "
                        "%lld..%lld): the file is damaged, or the run that wrote it "
                        "had another --steps-per-epoch", path, (long long)v[1],
                        (long long)v[0], (long long)steps_per_epoch, (long long)lo,
                        (long long)hi);
    return TP_OK;
}

tp_status_t tp_checkpoint_verify(const char *path, int64_t steps_per_epoch,
                                 tp_train_state_t *state) {
    tp_safetensors_t *st = NULL;
    TP_TRY(tp_safetensors_open(path, &st));
    tp_status_t rc = s_verify_sums(st, path);
    for (size_t i = 0; rc == TP_OK && i < st->count; i++)
        rc = s_check_finite(st, &st->entries[i], path);
    const s_entry_t *step_e = s_find(st, "optimizer/step");
    int64_t step;
    if (rc == TP_OK && step_e)
        rc = s_read_opt_step(st, step_e, path, &step);
    tp_train_state_t ts;
    int have = 0;
    if (rc == TP_OK)
        rc = s_read_state(st, path, steps_per_epoch, &ts, &have);
    if (rc == TP_OK && state) {
        *state = ts;
        if (!have)
            state->epoch = state->global_step = -1;
    }
    tp_safetensors_destroy(&st);
    return rc;
}

/* ---- snapshots: a checkpoint taken now, written later -------------------- */

enum { S_MAXMETA = 80 + TP_CHECKPOINT_MAX_META, S_KEY = 40, S_VAL = 256 };

/* ---- the model's own metadata (tp_checkpoint_set_meta) ------------------- */

/* Keys the snapshot writes itself: a user's would be a second, ambiguous
 * value (safetensors metadata is a JSON object: one value per key). */
static int s_reserved_key(const char *key) {
    static const char *const exact[] = {"format", "model", "inputs", "epoch",
                                        "global_step", "rng",
                                        TP_SAFETENSORS_CHECKSUM_KEY,
                                        "__metadata__"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (!strcmp(key, exact[i]))
            return 1;
    return !strncmp(key, "optimizer", 9) || !strncmp(key, "tower", 5);
}

const char *tp_checkpoint_get_meta(const tp_model_t *m, const char *key) {
    for (int i = 0; m && key && i < m->nmeta; i++)
        if (!strcmp(m->meta[2 * i], key))
            return m->meta[2 * i + 1];
    return NULL;
}

tp_status_t tp_checkpoint_set_meta(tp_model_t *m, const char *key, const char *value) {
    if (!key || !*key || s_reserved_key(key))
        return tp_error(TP_ERR_INVALID, "checkpoint metadata '%s': %s", key ? key : "(null)",
                        key && *key ? "the checkpoint writes that key itself" : "an empty key");
    int at = 0;
    while (at < m->nmeta && strcmp(m->meta[2 * at], key))
        at++;
    if (!value) {  /* removed: the last pair takes its place */
        if (at == m->nmeta)
            return TP_OK;
        free(m->meta[2 * at]);
        free(m->meta[2 * at + 1]);
        m->nmeta--;
        m->meta[2 * at] = m->meta[2 * m->nmeta];
        m->meta[2 * at + 1] = m->meta[2 * m->nmeta + 1];
        return TP_OK;
    }
    char *v = strdup(value);
    if (!v)
        return tp_error(TP_ERR_NOMEM, "checkpoint metadata '%s'", key);
    if (at < m->nmeta) {
        free(m->meta[2 * at + 1]);
        m->meta[2 * at + 1] = v;
        return TP_OK;
    }
    if (m->nmeta == TP_CHECKPOINT_MAX_META) {
        free(v);
        return tp_error(TP_ERR_INVALID, "checkpoint metadata '%s': at most %d keys of "
                        "the model's own", key, TP_CHECKPOINT_MAX_META);
    }
    char *k = strdup(key);
    char **grown = k ? realloc(m->meta, (size_t)(m->nmeta + 1) * 2 * sizeof *grown) : NULL;
    if (!grown) {
        free(k);
        free(v);
        return tp_error(TP_ERR_NOMEM, "checkpoint metadata '%s'", key);
    }
    m->meta = grown;
    m->meta[2 * m->nmeta] = k;
    m->meta[2 * m->nmeta + 1] = v;
    m->nmeta++;
    return TP_OK;
}

/* Everything tp_checkpoint_save writes, copied out of the model: the file
 * can then be written on another thread while the model trains on. Every
 * buffer is kept between takes and grows only when the model needs more,
 * so a saver that takes one snapshot per epoch allocates once. */
struct tp_checkpoint_snapshot {
    float *host;            /* [nhost] trainable arena, model-only arena,
                               then one [ntrain] block per optimizer slot */
    size_t nhost, caphost;  /* floats */
    int64_t step;           /* the optimizer's step ("optimizer/step") */
    tp_named_tensor_t *ts;  /* [nt] what the file holds, in file order */
    tp_tensor_t *views;     /* [nt] views into host (and step) */
    size_t nt, capt;
    char *text;             /* [captext] the tensors' names, NUL-separated */
    size_t captext;
    tp_meta_kv_t meta[S_MAXMETA];
    char keys[S_MAXMETA][S_KEY], vals[S_MAXMETA][S_VAL];
    size_t nmeta;
    char *extra;            /* [capextra] the model's own metadata (keys and
                               values of any length), NUL-separated */
    size_t capextra;
    size_t bytes;           /* tensor bytes of the last take */
};

tp_checkpoint_snapshot_t *tp_checkpoint_snapshot_new(void) {
    tp_checkpoint_snapshot_t *s = calloc(1, sizeof *s);
    if (!s)
        tp_error(TP_ERR_NOMEM, "checkpoint snapshot");
    return s;
}

void tp_checkpoint_snapshot_destroy(tp_checkpoint_snapshot_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_checkpoint_snapshot_t *s = *self_p;
    tp_free(s->host);
    free(s->ts);
    free(s->views);
    free(s->text);
    free(s->extra);
    free(s);
    *self_p = NULL;
}

size_t tp_checkpoint_snapshot_bytes(const tp_checkpoint_snapshot_t *s) {
    return s ? s->bytes : 0;
}

/* Grow the snapshot's buffers to what m needs (kept on failure). */
static tp_status_t s_snap_reserve(tp_checkpoint_snapshot_t *s, size_t nhost,
                                  size_t nt, size_t ntext) {
    if (nhost > s->caphost) {
        /* its contents are about to be overwritten: no copy, no realloc */
        float *h = tp_alloc(nhost * sizeof(float));
        if (!h)
            return tp_error(TP_ERR_NOMEM, "checkpoint snapshot: %zu bytes",
                            nhost * sizeof(float));
        tp_free(s->host);
        s->host = h;
        s->caphost = nhost;
    }
    if (nt > s->capt) {
        tp_named_tensor_t *ts = calloc(nt, sizeof *ts);
        tp_tensor_t *views = calloc(nt, sizeof *views);
        if (!ts || !views) {
            free(ts);
            free(views);
            return tp_error(TP_ERR_NOMEM, "checkpoint snapshot: %zu tensors", nt);
        }
        free(s->ts);
        free(s->views);
        s->ts = ts;
        s->views = views;
        s->capt = nt;
    }
    if (ntext > s->captext) {
        char *t = malloc(ntext);
        if (!t)
            return tp_error(TP_ERR_NOMEM, "checkpoint snapshot: names");
        free(s->text);
        s->text = t;
        s->captext = ntext;
    }
    return TP_OK;
}

tp_status_t tp_checkpoint_snapshot_take(tp_checkpoint_snapshot_t *s,
                                        tp_model_t *m,
                                        const tp_train_state_t *state) {
    int nslots = m->opt ? m->nslots : 0;
    size_t nt = (size_t)m->nvars * (size_t)(1 + nslots) + 1;
    size_t hostn = m->ntrain * (size_t)(1 + nslots) + m->nmodel + 1;
    /* The names: each variable's, and "optimizer/<var>/<slot>" per slot. */
    size_t ntext = 1;
    for (int i = 0; i < m->nvars; i++) {
        size_t len = strlen(m->vars[i].name) + 1;
        ntext += len;
        for (int k = 0; m->vars[i].trainable && k < nslots; k++)
            ntext += len + strlen(tp_optimizer_slot_name(m->opt, k)) + 12;
    }
    s->nt = 0;
    s->nmeta = 0;
    s->bytes = 0;
    TP_TRY(s_snap_reserve(s, hostn, nt, ntext));
    s->nhost = hostn;
    s->step = m->opt ? tp_optimizer_step(m->opt) : 0;
    /* Stage device memory on the host: trainable, model-only, slots (no
     * step queued ahead still updating them). */
    TP_TRY(tp_model_drain_(m));
    const tp_replica_t *r = &m->rep[0]; /* every replica holds the same */
    tp_backend_t *b = r->backend;
    float *h_train = s->host, *h_model = s->host + m->ntrain;
    float *h_slot[2] = {h_model + m->nmodel, h_model + m->nmodel + m->ntrain};
    tp_status_t rc = b->ops->copy(b, r->stream, h_train, r->train_arena,
                                  m->ntrain * sizeof(float), TP_COPY_D2H);
    if (rc == TP_OK)
        rc = b->ops->copy(b, r->stream, h_model, r->model_arena,
                          m->nmodel * sizeof(float), TP_COPY_D2H);
    for (int k = 0; rc == TP_OK && k < nslots; k++)
        rc = b->ops->copy(b, r->stream, h_slot[k], r->slots[k],
                          m->ntrain * sizeof(float), TP_COPY_D2H);
    if (rc == TP_OK)
        rc = b->ops->stream_sync(b, r->stream);
    size_t n = 0, at = 0;
    for (int i = 0; rc == TP_OK && i < m->nvars; i++) {
        tp_var_t *v = &m->vars[i];
        float *src = (v->trainable ? h_train : h_model) + v->offset;
        rc = tp_tensor_init_wrap(&s->views[n], TP_FLOAT32, v->shape.ndim,
                                 v->shape.d, src, NULL, NULL);
        s->ts[n].name = v->name;  /* for now: copied below, as the model may go */
        s->ts[n].tensor = &s->views[n];
        n++;
    }
    for (int k = 0; rc == TP_OK && k < nslots; k++)
        for (int i = 0; rc == TP_OK && i < m->nvars; i++) {
            tp_var_t *v = &m->vars[i];
            if (!v->trainable)
                continue;
            char *name = s->text + at;
            at += (size_t)sprintf(name, "optimizer/%s/%s", v->name,
                                  tp_optimizer_slot_name(m->opt, k)) + 1;
            rc = tp_tensor_init_wrap(&s->views[n], TP_FLOAT32, v->shape.ndim,
                                     v->shape.d, h_slot[k] + v->offset, NULL,
                                     NULL);
            s->ts[n].name = name;
            s->ts[n].tensor = &s->views[n];
            n++;
        }
    /* The variables' names into the snapshot's own text. */
    for (int i = 0; rc == TP_OK && i < m->nvars; i++) {
        char *name = s->text + at;
        at += (size_t)sprintf(name, "%s", m->vars[i].name) + 1;
        s->ts[i].name = name;
    }
    if (rc == TP_OK && m->opt) {
        rc = tp_tensor_init_wrap(&s->views[n], TP_INT64, 0, NULL, &s->step,
                                 NULL, NULL);
        s->ts[n].name = "optimizer/step";
        s->ts[n].tensor = &s->views[n];
        n++;
    }
    if (rc != TP_OK)
        return rc;
    TP_ASSERT(at <= ntext && n <= nt);
    /* Metadata: trainer state, generators, optimizer settings. */
    size_t nm = 0;
#define META(k_, ...)                                                        \
    do {                                                                     \
        if (nm < S_MAXMETA) {                                                \
            snprintf(s->keys[nm], S_KEY, "%s", k_);                          \
            snprintf(s->vals[nm], S_VAL, __VA_ARGS__);                       \
            s->meta[nm].key = s->keys[nm];                                   \
            s->meta[nm].value = s->vals[nm];                                 \
            nm++;                                                            \
        }                                                                    \
    } while (0)
    META("format", "%s", FORMAT_TAG);
    if (m->name) {
        /* what a predictor needs to rebuild the graph: the zoo's name and
         * the inputs as trained ("image:uint8:28x28;label:int32:") */
        META("model", "%s", m->name);
        char in[S_VAL];
        size_t o = 0;
        for (int i = 0; i < m->ninputs && o < sizeof in; i++) {
            const tp_input_desc_t *d = &m->inputs[i];
            o += (size_t)snprintf(in + o, sizeof in - o, "%s%s:%s:", i ? ";" : "",
                                  d->name, tp_dtype_name(d->dtype));
            for (int k = 1; k < d->ndim && o < sizeof in; k++)
                o += (size_t)snprintf(in + o, sizeof in - o, "%s%lld", k > 1 ? "x" : "",
                                      (long long)d->shape[k]);
        }
        if (o < sizeof in)
            META("inputs", "%s", in);
    }
    if (state) {
        META("epoch", "%" PRId64, state->epoch);
        META("global_step", "%" PRId64, state->global_step);
        META("rng", "%s", "");
        s_rng_hex(&state->rng, s->vals[nm - 1]);
    }
    for (int i = 0; i < m->ntowers; i++) {
        char key[40];
        snprintf(key, sizeof key, "tower%d/rng", i);
        META(key, "%s", "");
        s_rng_hex(&m->towers[i]->rng, s->vals[nm - 1]);
    }
    if (m->opt) {
        META("optimizer", "%s", tp_optimizer_kind(m->opt));
        static const char *hp[] = {"learning_rate", "momentum", "beta1",
                                   "beta2", "epsilon"};
        for (size_t i = 0; i < sizeof hp / sizeof *hp; i++) {
            double v;
            if (tp_optimizer_get(m->opt, hp[i], &v) == TP_OK) {
                char key[40];
                snprintf(key, sizeof key, "optimizer/%s", hp[i]);
                META(key, "%.17g", v);
            }
        }
    }
#undef META
    /* The model's own (tp_checkpoint_set_meta), copied: the model may
     * change them while another thread writes this snapshot. */
    size_t nextra = 0;
    for (int i = 0; i < 2 * m->nmeta; i++)
        nextra += strlen(m->meta[i]) + 1;
    if (nextra > s->capextra) {
        char *e = malloc(nextra);
        if (!e)
            return tp_error(TP_ERR_NOMEM, "checkpoint snapshot: metadata");
        free(s->extra);
        s->extra = e;
        s->capextra = nextra;
    }
    size_t eo = 0;
    for (int i = 0; i < m->nmeta && nm < S_MAXMETA; i++, nm++) {
        size_t kl = strlen(m->meta[2 * i]) + 1, vl = strlen(m->meta[2 * i + 1]) + 1;
        memcpy(s->extra + eo, m->meta[2 * i], kl);
        memcpy(s->extra + eo + kl, m->meta[2 * i + 1], vl);
        s->meta[nm].key = s->extra + eo;
        s->meta[nm].value = s->extra + eo + kl;
        eo += kl + vl;
    }
    s->nt = n;
    s->nmeta = nm;
    for (size_t i = 0; i < n; i++)
        s->bytes += s->views[i].nbytes;
    return TP_OK;
}

tp_status_t tp_checkpoint_snapshot_write(const tp_checkpoint_snapshot_t *s,
                                         const char *path) {
    if (!s->nt)
        return tp_error(TP_ERR_STATE, "checkpoint %s: the snapshot is empty",
                        path ? path : "(null)");
    return tp_safetensors_write(path, s->ts, s->nt, s->meta, s->nmeta);
}

/* One path for both: a synchronous save is a snapshot written at once, so
 * a file written later from a snapshot is byte for byte the same. */
tp_status_t tp_checkpoint_save(tp_model_t *m, const char *path,
                               const tp_train_state_t *state) {
    tp_checkpoint_snapshot_t *s = tp_checkpoint_snapshot_new();
    if (!s)
        return tp_error(TP_ERR_NOMEM, "checkpoint %s", path);
    tp_status_t rc = tp_checkpoint_snapshot_take(s, m, state);
    if (rc == TP_OK)
        rc = tp_checkpoint_snapshot_write(s, path);
    else
        rc = tp_error_wrap(rc, "checkpoint %s", path);
    tp_checkpoint_snapshot_destroy(&s);
    return rc;
}

/* Append "name" to a bounded, comma-separated list for an error message. */
static void s_list_add(char *buf, size_t size, int *count, const char *name) {
    (*count)++;
    size_t len = strlen(buf);
    if (*count > 6) {
        if (*count == 7 && len + 6 < size)
            strcat(buf, ", ...");
        return;
    }
    snprintf(buf + len, size - len, "%s'%s'", len ? ", " : "", name);
}

tp_status_t tp_checkpoint_load(tp_model_t *m, const char *path, int flags,
                               tp_train_state_t *state) {
    tp_safetensors_t *st = NULL;
    TP_TRY(tp_safetensors_open(path, &st));
    const int relaxed = flags & TP_LOAD_RELAXED;
    const int weights_only = flags & TP_LOAD_WEIGHTS_ONLY;
    const int nslots = (m->opt && !weights_only) ? m->nslots : 0;
    unsigned char *used = calloc(st->count + 1, 1);
    const s_entry_t **src = calloc((size_t)m->nvars * (size_t)(1 + nslots) + 1,
                                   sizeof *src);
    char missing[512] = "", bad[1600] = "", extra[512] = "";
    int nmissing = 0, nbad = 0, nextra = 0;
    tp_status_t rc = TP_OK;
    if (!used || !src) {
        rc = tp_error(TP_ERR_NOMEM, "checkpoint %s", path);
        goto done;
    }
    /* Damaged bytes first: a flipped bit is named as such, not as a
     * misfit or a NaN. */
    if ((rc = s_verify_sums(st, path)) < 0)
        goto done;
    /* Pass 1: resolve every expected tensor and check it; change nothing. */
    for (int s = -1; s < nslots; s++)
        for (int i = 0; i < m->nvars; i++) {
            tp_var_t *v = &m->vars[i];
            if (s >= 0 && !v->trainable)
                continue;
            char name[TP_NAME_MAX + 64];
            if (s < 0)
                snprintf(name, sizeof name, "%s", v->name);
            else
                snprintf(name, sizeof name, "optimizer/%s/%s", v->name,
                         tp_optimizer_slot_name(m->opt, s));
            const s_entry_t *e = s_find(st, name);
            if (!e) {
                s_list_add(missing, sizeof missing, &nmissing, name);
                continue;
            }
            used[e - st->entries] = 1;
            if (e->dtype != TP_FLOAT32 || e->ndim != v->shape.ndim ||
                memcmp(e->shape, v->shape.d, sizeof(int64_t) * (size_t)e->ndim)) {
                char item[TP_NAME_MAX + 480];
                tp_tensor_t tv;
                char got[96];
                tp_tensor_init_wrap(&tv, e->dtype, e->ndim, e->shape,
                                    (void *)st->data, NULL, NULL);
                tp_tensor_describe(&tv, got, sizeof got);
                tp_tensor_t mv;
                char want[96];
                tp_tensor_init_wrap(&mv, TP_FLOAT32, v->shape.ndim, v->shape.d,
                                    (void *)st->data, NULL, NULL);
                tp_tensor_describe(&mv, want, sizeof want);
                snprintf(item, sizeof item, "%s is %s in the file, %s in the "
                         "model", name, got, want);
                s_list_add(bad, sizeof bad, &nbad, item);
                continue;
            }
            src[(size_t)(s + 1) * (size_t)m->nvars + (size_t)i] = e;
        }
    const s_entry_t *step_e = NULL;
    if (m->opt && !weights_only) {
        step_e = s_find(st, "optimizer/step");
        if (!step_e)
            s_list_add(missing, sizeof missing, &nmissing, "optimizer/step");
        else if (step_e->dtype != TP_INT64 || step_e->ndim != 0)
            s_list_add(bad, sizeof bad, &nbad, "optimizer/step is not int64[]");
        else
            used[step_e - st->entries] = 1;
    }
    for (size_t i = 0; i < st->count; i++) {
        if (used[i])
            continue;
        if (weights_only && !strncmp(st->entries[i].name, "optimizer/", 10))
            continue;
        s_list_add(extra, sizeof extra, &nextra, st->entries[i].name);
    }
    if (nmissing || nbad || (nextra && !relaxed)) {
        char msg[3072];
        int len = snprintf(msg, sizeof msg, "checkpoint %s does not fit the "
                                            "model:", path);
        if (nmissing)
            len += snprintf(msg + len, sizeof msg - (size_t)len,
                            " %d missing (%s);", nmissing, missing);
        if (nbad && len < (int)sizeof msg)
            len += snprintf(msg + len, sizeof msg - (size_t)len,
                            " %d mis-shaped (%s);", nbad, bad);
        if (nextra && !relaxed && len < (int)sizeof msg)
            snprintf(msg + len, sizeof msg - (size_t)len,
                     " %d unexpected (%s; TP_LOAD_RELAXED ignores them)",
                     nextra, extra);
        rc = tp_error(nbad ? TP_ERR_SHAPE : TP_ERR_NOT_FOUND, "%s", msg);
        goto done;
    }
    /* Every value that will be loaded is finite, the step in range. */
    for (size_t k = 0; k < (size_t)m->nvars * (size_t)(1 + nslots); k++)
        if (src[k] && (rc = s_check_finite(st, src[k], path)) < 0)
            goto done;
    int64_t step = 0;
    if (step_e && (rc = s_read_opt_step(st, step_e, path, &step)) < 0)
        goto done;
    tp_train_state_t ts;
    memset(&ts, 0, sizeof ts);
    tp_rng_t tower_rng[64];
    int have_tower_rng[64] = {0};
    if (!weights_only) {
        int have;
        if ((rc = s_read_state(st, path, 0, &ts, &have)) < 0)
            goto done;
        for (int i = 0; i < m->ntowers && i < 64; i++) {
            char key[40];
            snprintf(key, sizeof key, "tower%d/rng", i);
            const char *v = tp_safetensors_meta(st, key);
            if (v && !s_rng_parse(v, &tower_rng[i])) {
                rc = tp_error(TP_ERR_FORMAT, "checkpoint %s: bad %s", path,
                              key);
                goto done;
            }
            have_tower_rng[i] = v != NULL;
        }
    }
    /* Pass 2: everything checked; copy (after any step queued ahead) into
     * every replica (towers on several devices). */
    if (rc == TP_OK)
        rc = tp_model_drain_(m);
    for (int r = 0; rc == TP_OK && r < m->nrep; r++) {
        const tp_replica_t *rp = &m->rep[r];
        tp_backend_t *b = rp->backend;
        for (int s = -1; rc == TP_OK && s < nslots; s++)
            for (int i = 0; rc == TP_OK && i < m->nvars; i++) {
                const s_entry_t *e = src[(size_t)(s + 1) * (size_t)m->nvars + (size_t)i];
                if (!e)
                    continue;
                tp_var_t *v = &m->vars[i];
                float *dst = s < 0 ? tp_var_data_(m, r, i) : rp->slots[s] + v->offset;
                rc = b->ops->copy(b, rp->stream, dst, st->data + e->begin,
                                  e->end - e->begin, TP_COPY_H2D);
            }
        if (rc == TP_OK)
            rc = b->ops->stream_sync(b, rp->stream);
    }
    if (rc == TP_OK && step_e)
        tp_optimizer_set_step(m->opt, step);
    if (rc == TP_OK && !weights_only) {
        for (int i = 0; i < m->ntowers && i < 64; i++)
            if (have_tower_rng[i])
                m->towers[i]->rng = tower_rng[i];
        if (state)
            *state = ts;
    }
done:
    free(used);
    free(src);
    tp_safetensors_destroy(&st);
    return rc;
}
