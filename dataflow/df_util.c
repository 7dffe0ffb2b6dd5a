/* towerpack dataflow: helpers shared by the dataflow library (datapoints in
 * one allocation, per-stage RNG seeding, constructor plumbing). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/process.h>
#include "df_internal.h"

void df_block_release(void *data, void *hint) {
    (void)data;
    df_block_t *b = hint;
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        free(b);
}

df_block_t *df_block_new(int ncomp, const size_t *nbytes, size_t *offsets,
                         uint8_t **payload) {
    size_t total = 0;
    for (int i = 0; i < ncomp; i++) {
        offsets[i] = total;
        size_t n = (nbytes[i] + 15) & ~(size_t)15;
        if (n < nbytes[i] || total + n < total)
            return NULL;
        total += n;
    }
    if (total > SIZE_MAX - sizeof(df_block_t))
        return NULL;
    df_block_t *b = malloc(sizeof *b + total);
    if (!b)
        return NULL;
    atomic_init(&b->refs, ncomp);
    *payload = (uint8_t *)(b + 1);
    return b;
}

tp_datapoint_t *tp_df_datapoint_alloc(int ncomp, const tp_dtype_t *dtypes,
                                      const int *ndims,
                                      const int64_t (*shapes)[TP_MAX_DIMS]) {
    if (ncomp < 0 || ncomp > TP_DP_MAX_COMPONENTS) {
        tp_error(TP_ERR_INVALID, "datapoint of %d components", ncomp);
        return NULL;
    }
    size_t stack_nb[16], stack_off[16];
    size_t *nb = stack_nb, *off = stack_off;
    if (ncomp > 16) {
        nb = malloc(2 * (size_t)ncomp * sizeof *nb);
        if (!nb) {
            tp_error(TP_ERR_NOMEM, "datapoint of %d components", ncomp);
            return NULL;
        }
        off = nb + ncomp;
    }
    tp_datapoint_t *dp = NULL;
    for (int i = 0; i < ncomp; i++) {
        size_t numel;
        if (!tp_dtype_valid((int)dtypes[i])) {
            tp_error(TP_ERR_INVALID, "component %d: invalid dtype %d", i,
                     (int)dtypes[i]);
            goto done;
        }
        if (tp_shape_numel(ndims[i], shapes[i], tp_dtype_size(dtypes[i]),
                           &numel) != TP_OK)
            goto done;
        nb[i] = numel * tp_dtype_size(dtypes[i]);
    }
    dp = tp_datapoint_new(ncomp);
    uint8_t *payload = NULL;
    df_block_t *b = dp && ncomp ? df_block_new(ncomp, nb, off, &payload)
                                : NULL;
    if (!dp || (ncomp && !b)) {
        tp_datapoint_destroy(&dp);
        char what[512];
        uint64_t bytes = 0;
        int o = snprintf(what, sizeof what, "for a datapoint of %d component%s:", ncomp,
                         ncomp == 1 ? "" : "s");
        for (int i = 0; i < ncomp; i++) {
            bytes += nb[i];
            if (o > 0 && (size_t)o < sizeof what)
                o += snprintf(what + o, sizeof what - (size_t)o, "%s %s", i ? "," : "",
                              tp_dtype_name(dtypes[i]));
            for (int d = 0; d < ndims[i] && o > 0 && (size_t)o < sizeof what; d++)
                o += snprintf(what + o, sizeof what - (size_t)o, "%s%lld%s", d ? "," : " [",
                              (long long)shapes[i][d], d + 1 == ndims[i] ? "]" : "");
        }
        tp_error_nomem(bytes, "%s", what);
        goto done;
    }
    for (int i = 0; i < ncomp; i++) {
        tp_status_t rc = tp_tensor_init_wrap(tp_datapoint_get(dp, i),
                                             dtypes[i], ndims[i], shapes[i],
                                             payload + off[i],
                                             df_block_release, b);
        TP_ASSERT(rc == TP_OK); /* shapes were checked above */
    }
done:
    if (nb != stack_nb)
        free(nb);
    return dp;
}

void tp_df_rng_derive(tp_rng_t *out, uint64_t seed, uint64_t stream,
                      const char *tag) {
    /* FNV-1a of the tag: stages with different names draw different
     * sequences from one (seed, stream). */
    uint64_t h = 1469598103934665603ull;
    for (const char *p = tag; p && *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    tp_rng_init(out, seed ^ h, stream);
}

tp_dataflow_t *df_make(const tp_dataflow_ops_t *ops, void *impl) {
    tp_dataflow_t *df = tp_dataflow_new(ops, impl);
    if (!df)
        tp_error(TP_ERR_NOMEM, "%s: out of memory", ops->name);
    return df;
}

void df_destroy_all(tp_dataflow_t **dfs, int n) {
    for (int i = 0; dfs && i < n; i++)
        tp_dataflow_destroy(&dfs[i]);
}

tp_status_t df_reset_inner(tp_dataflow_t *inner, uint64_t seed,
                           uint64_t stream) {
    return tp_dataflow_reset_state(inner, seed, stream);
}

void df_iota_shuffle(uint32_t *idx, size_t n, tp_rng_t *rng) {
    for (size_t i = 0; i < n; i++)
        idx[i] = (uint32_t)i;
    if (rng)
        tp_rng_shuffle_u32(rng, idx, n);
}

static int s_same_dims(const int64_t *a, const int64_t *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

void *df_slot(tp_datapoint_t *batch, int ncomp, int i, int64_t slot,
              int64_t count, tp_dtype_t dtype, int ndim, const int64_t *shape,
              const char *who, size_t *stride_out) {
    if (tp_datapoint_size(batch) != ncomp) {
        tp_error(TP_ERR_SHAPE, "%s: a datapoint of %d components for a batch "
                 "of %d", who, ncomp, tp_datapoint_size(batch));
        return NULL;
    }
    tp_tensor_t *b = tp_datapoint_get(batch, i);
    if (b->dtype != dtype || b->ndim != ndim + 1 || slot < 0 || count < 0 ||
        slot + count > b->shape[0] || !s_same_dims(b->shape + 1, shape, ndim)) {
        tp_tensor_t want;
        tp_tensor_init_empty(&want);
        want.dtype = dtype;
        want.ndim = ndim;
        memcpy(want.shape, shape, sizeof(int64_t) * (size_t)ndim);
        char a[128], c[128];
        tp_error(TP_ERR_SHAPE, "%s: component %d is %s, which does not fit "
                 "slot %lld of the batch's %s", who, i,
                 tp_tensor_describe(&want, a, sizeof a), (long long)slot,
                 tp_tensor_describe(b, c, sizeof c));
        return NULL;
    }
    size_t stride = b->shape[0] ? b->nbytes / (size_t)b->shape[0] : 0;
    *stride_out = stride;
    return (uint8_t *)b->data + (size_t)slot * stride;
}

const char *df_special_kind(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO (named pipe)"
         : S_ISSOCK(mode) ? "a socket" : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
         : "a special file";
}

tp_status_t df_open_regular(const char *what, const char *path, FILE **f, int64_t *size) {
    /* O_NONBLOCK: a FIFO (an image list may name one, or one may replace
     * a scanned file) would block the open until a writer came; it opens
     * at once and is refused below (no effect on a regular file) */
    *f = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    FILE *fp = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!fp) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return tp_error(TP_ERR_IO, "%s %s: %s", what, path, strerror(e));
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || st.st_size < 0) {
        int e = errno;
        fclose(fp);
        return tp_error(TP_ERR_IO, "%s %s: %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        fclose(fp);
        return tp_error(TP_ERR_INVALID, "%s %s: %s, not a regular file", what, path,
                        df_special_kind(st.st_mode));
    }
    *f = fp;
    *size = (int64_t)st.st_size;
    return TP_OK;
}
