/* towerpack core: the datapoint wire format (encode, validate, decode).
 *
 * Header frame, little-endian:
 *   u32 magic "TPW1" | u8 version | u8 flags | u16 ncomp
 *   per component: u8 dtype | u8 ndim | u8 codec | u8 reserved (0)
 *                  | u32 crc32 of the raw bytes (0 without the flag)
 *                  | u64 raw_bytes | u64 wire_bytes | i64 shape[ndim]
 * then one frame per component holding wire_bytes bytes. */
#include <errno.h>
#include <lz4.h>
#include <stdatomic.h>
#include <string.h>
#include <zlib.h>
#include <zmq.h>
#include <towerpack/wire.h>

#define HDR_FIXED 8
#define COMP_FIXED 24
/* Components below this are copied into the frame: cheaper than the
 * bookkeeping of a zero-copy frame, and ZeroMQ copies tiny frames anyway. */
#define ZEROCOPY_MIN 512
/* LZ4's largest possible expansion is about 255:1; a claimed raw size above
 * this bound for the bytes actually received is a lie. */
#define LZ4_MAX_RATIO 255

struct tp_wire_msg {
    int count;
    int capacity;
    zmq_msg_t *frames;     /* [capacity] */
    zmq_msg_t inline_frames[4];
};

void tp_wire_opts_init(tp_wire_opts_t *opts) {
    opts->lz4 = 0;
    opts->lz4_min_bytes = 1024;
    opts->checksum = 0;
    opts->max_bytes = (size_t)1 << 30;
}

static const tp_wire_opts_t *s_opts(const tp_wire_opts_t *opts,
                                    tp_wire_opts_t *tmp) {
    if (opts)
        return opts;
    tp_wire_opts_init(tmp);
    return tmp;
}

/* ---- messages ------------------------------------------------------------ */

tp_wire_msg_t *tp_wire_msg_new(void) {
    tp_wire_msg_t *self = malloc(sizeof *self);
    if (!self)
        return NULL;
    self->count = 0;
    self->capacity = 4;
    self->frames = self->inline_frames;
    return self;
}

void tp_wire_msg_clear(tp_wire_msg_t *self) {
    for (int i = 0; i < self->count; i++)
        zmq_msg_close(&self->frames[i]);
    self->count = 0;
}

void tp_wire_msg_destroy(tp_wire_msg_t **self_p) {
    if (!self_p || !*self_p)
        return;
    tp_wire_msg_t *self = *self_p;
    tp_wire_msg_clear(self);
    if (self->frames != self->inline_frames)
        free(self->frames);
    free(self);
    *self_p = NULL;
}

int tp_wire_msg_frames(const tp_wire_msg_t *self) { return self->count; }

const void *tp_wire_msg_frame_data(tp_wire_msg_t *self, int i) {
    TP_ASSERT(i >= 0 && i < self->count);
    return zmq_msg_data(&self->frames[i]);
}

size_t tp_wire_msg_frame_size(tp_wire_msg_t *self, int i) {
    TP_ASSERT(i >= 0 && i < self->count);
    return zmq_msg_size(&self->frames[i]);
}

int tp_wire_msg_frame_srcfd(tp_wire_msg_t *self, int i) {
    TP_ASSERT(i >= 0 && i < self->count);
    return zmq_msg_get(&self->frames[i], ZMQ_SRCFD);
}

const char *tp_wire_msg_frame_job(tp_wire_msg_t *self, int i) {
    TP_ASSERT(i >= 0 && i < self->count);
    return zmq_msg_gets(&self->frames[i], TP_WIRE_JOB_PROPERTY);
}

const char *tp_wire_msg_frame_property(tp_wire_msg_t *self, int i, const char *name) {
    TP_ASSERT(i >= 0 && i < self->count);
    return zmq_msg_gets(&self->frames[i], name);
}

const char *tp_wire_msg_frame_peer(tp_wire_msg_t *self, int i) {
    TP_ASSERT(i >= 0 && i < self->count);
    return zmq_msg_gets(&self->frames[i], "Peer-Address");
}

size_t tp_wire_msg_bytes(tp_wire_msg_t *self) {
    size_t n = 0;
    for (int i = 0; i < self->count; i++)
        n += zmq_msg_size(&self->frames[i]);
    return n;
}

static tp_status_t s_reserve(tp_wire_msg_t *self, int n) {
    if (n <= self->capacity)
        return TP_OK;
    int cap = self->capacity * 2;
    while (cap < n)
        cap *= 2;
    zmq_msg_t *f = malloc((size_t)cap * sizeof *f);
    if (!f)
        return tp_error(TP_ERR_NOMEM, "wire message of %d frames", cap);
    /* zmq_msg_t may be moved bitwise only through zmq_msg_move. */
    for (int i = 0; i < self->count; i++) {
        zmq_msg_init(&f[i]);
        zmq_msg_move(&f[i], &self->frames[i]);
        zmq_msg_close(&self->frames[i]);
    }
    if (self->frames != self->inline_frames)
        free(self->frames);
    self->frames = f;
    self->capacity = cap;
    return TP_OK;
}

/* A new empty frame at the end; NULL when out of memory. */
static zmq_msg_t *s_push(tp_wire_msg_t *self) {
    if (s_reserve(self, self->count + 1) != TP_OK)
        return NULL;
    return &self->frames[self->count++];
}

tp_status_t tp_wire_msg_add_frame(tp_wire_msg_t *self, const void *data,
                                  size_t size) {
    TP_TRY(s_reserve(self, self->count + 1));
    zmq_msg_t *f = &self->frames[self->count];
    if (zmq_msg_init_size(f, size) != 0)
        return tp_error(TP_ERR_NOMEM, "wire frame of %zu bytes", size);
    if (size)
        memcpy(zmq_msg_data(f), data, size);
    self->count++;
    return TP_OK;
}

/* ---- encode ---------------------------------------------------------------- */

/* Frames that point into a datapoint's buffers share one of these; the last
 * release (possibly on ZeroMQ's I/O thread) frees the datapoint. */
typedef struct {
    atomic_int refs;
    tp_datapoint_t *dp;
} s_share_t;

static void s_share_release(void *data, void *hint) {
    (void)data;
    s_share_t *share = hint;
    if (atomic_fetch_sub_explicit(&share->refs, 1, memory_order_acq_rel) == 1) {
        tp_datapoint_destroy(&share->dp);
        free(share);
    }
}

static void s_free_buffer(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* An empty component (tp_tensor_init_empty: no data, ndim 0, 0 bytes) is
 * not a scalar, which has 1 element: it travels as shape [0]. */
static int s_is_empty(const tp_tensor_t *t) {
    return t->ndim == 0 && t->nbytes == 0;
}
static int s_wire_ndim(const tp_tensor_t *t) { return s_is_empty(t) ? 1 : t->ndim; }

static inline uint8_t *s_put_u32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);  /* the formats are little-endian; so is every target */
    return p + 4;
}
static inline uint8_t *s_put_u64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
    return p + 8;
}

tp_status_t tp_wire_encode(tp_datapoint_t **dp_p, const tp_wire_opts_t *opts,
                           tp_wire_msg_t *msg) {
    tp_wire_opts_t tmp;
    opts = s_opts(opts, &tmp);
    TP_ASSERT(dp_p && *dp_p);
    tp_datapoint_t *dp = *dp_p;
    *dp_p = NULL;
    tp_wire_msg_clear(msg);
    tp_status_t rc = TP_OK;

    s_share_t *share = malloc(sizeof *share);
    if (!share) {
        tp_datapoint_destroy(&dp);
        return tp_error(TP_ERR_NOMEM, "wire encode");
    }
    atomic_init(&share->refs, 1);  /* the encoder's own reference */
    share->dp = dp;

    int ncomp = tp_datapoint_size(dp);
    size_t hdr_size = HDR_FIXED;
    for (int i = 0; i < ncomp; i++)
        hdr_size += COMP_FIXED + 8 * (size_t)s_wire_ndim(tp_datapoint_get(dp, i));
    zmq_msg_t *hdr = s_push(msg);
    if (!hdr || zmq_msg_init_size(hdr, hdr_size) != 0) {
        if (hdr)
            msg->count--;
        rc = tp_error(TP_ERR_NOMEM, "wire header of %zu bytes", hdr_size);
        goto done;
    }
    uint8_t *p = zmq_msg_data(hdr);
    p = s_put_u32(p, TP_WIRE_MAGIC);
    *p++ = TP_WIRE_VERSION;
    *p++ = opts->checksum ? TP_WIRE_FLAG_CHECKSUM : 0;
    uint16_t n16 = (uint16_t)ncomp;
    memcpy(p, &n16, 2);
    p += 2;

    for (int i = 0; i < ncomp; i++) {
        tp_tensor_t *t = tp_datapoint_get(dp, i);
        zmq_msg_t *f = s_push(msg);
        if (!f) {
            rc = tp_error(TP_ERR_NOMEM, "wire frame %d", i);
            goto done;
        }
        uint8_t codec = TP_WIRE_CODEC_NONE;
        size_t wire_bytes = t->nbytes;
        int framed = 0;
        if (opts->lz4 && t->nbytes >= opts->lz4_min_bytes &&
            t->nbytes <= (size_t)LZ4_MAX_INPUT_SIZE) {
            int bound = LZ4_compressBound((int)t->nbytes);
            char *buf = malloc((size_t)bound);
            int csize = buf ? LZ4_compress_default(t->data, buf,
                                                   (int)t->nbytes, bound)
                            : 0;
            if (csize > 0 && (size_t)csize < t->nbytes &&
                zmq_msg_init_data(f, buf, (size_t)csize, s_free_buffer,
                                  NULL) == 0) {
                codec = TP_WIRE_CODEC_LZ4;
                wire_bytes = (size_t)csize;
                framed = 1;
            } else {
                free(buf);  /* did not shrink: send it raw */
            }
        }
        if (!framed) {
            if (t->nbytes >= ZEROCOPY_MIN) {
                atomic_fetch_add_explicit(&share->refs, 1,
                                          memory_order_relaxed);
                if (zmq_msg_init_data(f, t->data, t->nbytes, s_share_release,
                                      share) != 0) {
                    atomic_fetch_sub_explicit(&share->refs, 1,
                                              memory_order_relaxed);
                    msg->count--;
                    rc = tp_error(TP_ERR_NOMEM, "wire frame %d", i);
                    goto done;
                }
            } else {
                if (zmq_msg_init_size(f, t->nbytes) != 0) {
                    msg->count--;
                    rc = tp_error(TP_ERR_NOMEM, "wire frame %d", i);
                    goto done;
                }
                if (t->nbytes)
                    memcpy(zmq_msg_data(f), t->data, t->nbytes);
            }
        }
        uint32_t crc = 0;
        if (opts->checksum)
            crc = (uint32_t)crc32_z(crc32_z(0, NULL, 0), t->data, t->nbytes);
        *p++ = (uint8_t)t->dtype;
        *p++ = (uint8_t)s_wire_ndim(t);
        *p++ = codec;
        *p++ = 0;
        p = s_put_u32(p, crc);
        p = s_put_u64(p, t->nbytes);
        p = s_put_u64(p, wire_bytes);
        if (s_is_empty(t))
            p = s_put_u64(p, 0);
        for (int d = 0; d < t->ndim; d++)
            p = s_put_u64(p, (uint64_t)t->shape[d]);
    }
done:
    if (rc != TP_OK)
        tp_wire_msg_clear(msg);
    s_share_release(NULL, share);
    return rc;
}

/* ---- decode ---------------------------------------------------------------- */

typedef struct {
    uint8_t dtype, ndim, codec;
    uint32_t crc;
    uint64_t raw_bytes, wire_bytes;
    int64_t shape[TP_MAX_DIMS];
} s_comp_t;

static void s_free_frame(void *data, void *hint) {
    (void)data;
    zmq_msg_t *f = hint;
    zmq_msg_close(f);
    free(f);
}

tp_status_t tp_wire_msg_take_frame(tp_wire_msg_t *self, int i, void **data,
                                   size_t *size, tp_free_fn *release, void **hint) {
    TP_ASSERT(i >= 0 && i < self->count);
    zmq_msg_t *keep = malloc(sizeof *keep);
    if (!keep) {
        *release = NULL;
        return tp_error(TP_ERR_NOMEM, "wire: take a frame");
    }
    zmq_msg_init(keep);
    zmq_msg_move(keep, &self->frames[i]);
    *data = zmq_msg_data(keep);
    *size = zmq_msg_size(keep);
    *release = s_free_frame;
    *hint = keep;
    return TP_OK;
}

static tp_status_t s_bad(tp_wire_msg_t *msg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static tp_status_t s_bad(tp_wire_msg_t *msg, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    tp_wire_msg_clear(msg);
    return tp_error(TP_ERR_PROTOCOL, "wire: %s", buf);
}

/* Parse and check the header and every frame size. Touches no payload. */
static tp_status_t s_validate(tp_wire_msg_t *msg, const tp_wire_opts_t *opts,
                              s_comp_t *comps, int *ncomp_out, int *flags_out) {
    if (msg->count < 1)
        return s_bad(msg, "empty message");
    size_t hsize = zmq_msg_size(&msg->frames[0]);
    const uint8_t *h = zmq_msg_data(&msg->frames[0]);
    if (hsize < HDR_FIXED)
        return s_bad(msg, "header frame of %zu bytes, at least %d needed",
                     hsize, HDR_FIXED);
    uint32_t magic;
    memcpy(&magic, h, 4);
    if (magic != TP_WIRE_MAGIC)
        return s_bad(msg, "bad magic 0x%08x (not a towerpack datapoint)",
                     magic);
    if (h[4] != TP_WIRE_VERSION)
        return s_bad(msg, "version %u, this build reads version %d", h[4],
                     TP_WIRE_VERSION);
    if (h[5] & ~TP_WIRE_FLAG_CHECKSUM)
        return s_bad(msg, "unknown flags 0x%02x", h[5]);
    uint16_t ncomp;
    memcpy(&ncomp, h + 6, 2);
    if (ncomp > TP_DP_MAX_COMPONENTS)
        return s_bad(msg, "%u components, at most %d", ncomp,
                     TP_DP_MAX_COMPONENTS);
    if (msg->count != 1 + (int)ncomp)
        return s_bad(msg, "header announces %u components but %d frames "
                     "follow it", ncomp, msg->count - 1);
    size_t off = HDR_FIXED;
    uint64_t total = 0;
    for (int i = 0; i < ncomp; i++) {
        s_comp_t *c = &comps[i];
        if (hsize - off < COMP_FIXED)
            return s_bad(msg, "header truncated in component %d", i);
        c->dtype = h[off];
        c->ndim = h[off + 1];
        c->codec = h[off + 2];
        memcpy(&c->crc, h + off + 4, 4);
        memcpy(&c->raw_bytes, h + off + 8, 8);
        memcpy(&c->wire_bytes, h + off + 16, 8);
        off += COMP_FIXED;
        if (!tp_dtype_valid(c->dtype))
            return s_bad(msg, "component %d: unknown dtype %u", i, c->dtype);
        if (c->ndim > TP_MAX_DIMS)
            return s_bad(msg, "component %d: %u dimensions, at most %d", i,
                         c->ndim, TP_MAX_DIMS);
        if (h[off - COMP_FIXED + 3] != 0)
            return s_bad(msg, "component %d: reserved byte is not zero", i);
        if (hsize - off < 8 * (size_t)c->ndim)
            return s_bad(msg, "header truncated in the shape of component %d",
                         i);
        memcpy(c->shape, h + off, 8 * (size_t)c->ndim);
        off += 8 * (size_t)c->ndim;
        size_t numel;
        if (tp_shape_numel(c->ndim, c->shape, tp_dtype_size(c->dtype),
                           &numel) != TP_OK)
            return s_bad(msg, "component %d: bad shape (%s)", i,
                         tp_last_error());
        if ((uint64_t)numel * tp_dtype_size(c->dtype) != c->raw_bytes)
            return s_bad(msg, "component %d: shape says %llu bytes, header "
                         "says %llu", i,
                         (unsigned long long)numel * tp_dtype_size(c->dtype),
                         (unsigned long long)c->raw_bytes);
        if (c->raw_bytes > opts->max_bytes - total)
            return s_bad(msg, "datapoint larger than the %zu-byte limit "
                         "(component %d)", opts->max_bytes, i);
        total += c->raw_bytes;
        size_t fsize = zmq_msg_size(&msg->frames[1 + i]);
        if (c->wire_bytes != fsize)
            return s_bad(msg, "component %d: header says %llu bytes, frame "
                         "has %zu", i, (unsigned long long)c->wire_bytes,
                         fsize);
        if (c->codec == TP_WIRE_CODEC_NONE) {
            if (c->raw_bytes != c->wire_bytes)
                return s_bad(msg, "component %d: uncompressed but raw %llu "
                             "!= wire %llu bytes", i,
                             (unsigned long long)c->raw_bytes,
                             (unsigned long long)c->wire_bytes);
        } else if (c->codec == TP_WIRE_CODEC_LZ4) {
            if (c->wire_bytes == 0 || c->raw_bytes > LZ4_MAX_INPUT_SIZE ||
                c->raw_bytes > c->wire_bytes * LZ4_MAX_RATIO + 16)
                return s_bad(msg, "component %d: lz4 sizes impossible (raw "
                             "%llu from %llu bytes)", i,
                             (unsigned long long)c->raw_bytes,
                             (unsigned long long)c->wire_bytes);
        } else {
            return s_bad(msg, "component %d: unknown codec %u", i, c->codec);
        }
        if (!(h[5] & TP_WIRE_FLAG_CHECKSUM) && c->crc != 0)
            return s_bad(msg, "component %d: checksum without the flag", i);
    }
    if (off != hsize)
        return s_bad(msg, "header has %zu trailing bytes", hsize - off);
    *ncomp_out = ncomp;
    *flags_out = h[5];
    return TP_OK;
}

tp_status_t tp_wire_decode(tp_wire_msg_t *msg, const tp_wire_opts_t *opts,
                           tp_datapoint_t **out) {
    tp_wire_opts_t tmp;
    opts = s_opts(opts, &tmp);
    *out = NULL;
    s_comp_t stack_comps[8];
    s_comp_t *comps = stack_comps;
    if (msg->count - 1 > 8) {
        if (msg->count - 1 > TP_DP_MAX_COMPONENTS)
            return s_bad(msg, "%d frames, at most %d", msg->count,
                         TP_DP_MAX_COMPONENTS + 1);
        comps = malloc((size_t)(msg->count - 1) * sizeof *comps);
        if (!comps) {
            tp_wire_msg_clear(msg);
            return tp_error(TP_ERR_NOMEM, "wire decode");
        }
    }
    int ncomp = 0, flags = 0;
    tp_status_t rc = s_validate(msg, opts, comps, &ncomp, &flags);
    tp_datapoint_t *dp = NULL;
    if (rc != TP_OK)
        goto done;
    dp = tp_datapoint_new(ncomp);
    if (!dp) {
        rc = tp_error(TP_ERR_NOMEM, "wire decode: datapoint");
        goto done;
    }
    for (int i = 0; i < ncomp; i++) {
        s_comp_t *c = &comps[i];
        zmq_msg_t *f = &msg->frames[1 + i];
        tp_tensor_t *t = tp_datapoint_get(dp, i);
        void *fdata = zmq_msg_data(f);
        size_t esize = tp_dtype_size(c->dtype);
        if (c->codec == TP_WIRE_CODEC_NONE && c->raw_bytes >= ZEROCOPY_MIN &&
            (uintptr_t)fdata % esize == 0) {
            /* Keep the received frame as the tensor's memory. */
            zmq_msg_t *keep = malloc(sizeof *keep);
            if (!keep) {
                rc = tp_error(TP_ERR_NOMEM, "wire decode");
                goto done;
            }
            zmq_msg_init(keep);
            zmq_msg_move(keep, f);
            rc = tp_tensor_init_wrap(t, c->dtype, c->ndim, c->shape,
                                     zmq_msg_data(keep), s_free_frame, keep);
            if (rc != TP_OK) {
                s_free_frame(NULL, keep);
                goto done;
            }
        } else {
            rc = tp_tensor_init(t, c->dtype, c->ndim, c->shape);
            if (rc != TP_OK)
                goto done;
            if (c->codec == TP_WIRE_CODEC_NONE) {
                if (c->raw_bytes)
                    memcpy(t->data, fdata, c->raw_bytes);
            } else {
                int n = LZ4_decompress_safe(fdata, t->data,
                                            (int)c->wire_bytes,
                                            (int)c->raw_bytes);
                if (n < 0 || (uint64_t)n != c->raw_bytes) {
                    rc = s_bad(msg, "component %d: lz4 data is corrupt "
                               "(decoded %d of %llu bytes)", i, n,
                               (unsigned long long)c->raw_bytes);
                    goto done;
                }
            }
        }
        if (flags & TP_WIRE_FLAG_CHECKSUM) {
            uint32_t crc = (uint32_t)crc32_z(crc32_z(0, NULL, 0), t->data,
                                             t->nbytes);
            if (crc != c->crc) {
                rc = s_bad(msg, "component %d: checksum 0x%08x, header says "
                           "0x%08x", i, crc, c->crc);
                goto done;
            }
        }
    }
done:
    tp_wire_msg_clear(msg);
    if (comps != stack_comps)
        free(comps);
    if (rc != TP_OK)
        tp_datapoint_destroy(&dp);
    *out = dp;
    return rc;
}

/* ---- sockets --------------------------------------------------------------- */

static tp_status_t s_zmq_fail(const char *what) {
    int e = zmq_errno();
    if (e == EAGAIN)
        return tp_error(TP_ERR_TIMEOUT, "%s: would block", what);
    if (e == ETERM || e == EINTR)
        return tp_error(TP_ERR_INTERRUPTED, "%s: %s", what, zmq_strerror(e));
    return tp_error(TP_ERR_IO, "%s: %s", what, zmq_strerror(e));
}

tp_status_t tp_wire_msg_send(tp_wire_msg_t *msg, void *socket, int flags) {
    if (msg->count == 0)
        return tp_error(TP_ERR_INVALID, "wire send: empty message");
    for (int i = 0; i < msg->count; i++) {
        int more = i + 1 < msg->count ? ZMQ_SNDMORE : 0;
        /* After the first frame is accepted, the rest of a multipart message
         * is always accepted: only frame 0 can block or fail with EAGAIN. */
        if (zmq_msg_send(&msg->frames[i], socket, flags | more) < 0) {
            if (i == 0)
                return s_zmq_fail("wire send");
            tp_status_t rc = s_zmq_fail("wire send");
            tp_wire_msg_clear(msg);
            return rc;
        }
    }
    /* zmq_msg_send left each frame empty; closing them is free. */
    tp_wire_msg_clear(msg);
    return TP_OK;
}

tp_status_t tp_wire_msg_recv(tp_wire_msg_t *msg, void *socket, int flags) {
    tp_wire_msg_clear(msg);
    int dropped = 0;
    for (;;) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, socket, msg->count || dropped ? 0 : flags) < 0) {
            zmq_msg_close(&part);
            tp_status_t rc = s_zmq_fail("wire recv");
            tp_wire_msg_clear(msg);
            return rc;
        }
        int more = zmq_msg_more(&part);
        if (msg->count < TP_DP_MAX_COMPONENTS + 1 && !dropped) {
            zmq_msg_t *f = s_push(msg);
            if (!f) {
                zmq_msg_close(&part);
                dropped = 1;
            } else {
                zmq_msg_init(f);
                zmq_msg_move(f, &part);
                zmq_msg_close(&part);
            }
        } else {
            dropped = 1;
            zmq_msg_close(&part);
        }
        if (!more)
            break;
    }
    if (dropped) {
        tp_wire_msg_clear(msg);
        return tp_error(TP_ERR_PROTOCOL,
                        "wire: message of more than %d frames dropped",
                        TP_DP_MAX_COMPONENTS + 1);
    }
    return TP_OK;
}

tp_status_t tp_wire_send(void *socket, tp_datapoint_t **dp_p,
                         const tp_wire_opts_t *opts) {
    tp_wire_msg_t *msg = tp_wire_msg_new();
    if (!msg) {
        tp_datapoint_destroy(dp_p);
        return tp_error(TP_ERR_NOMEM, "wire send");
    }
    tp_status_t rc = tp_wire_encode(dp_p, opts, msg);
    if (rc == TP_OK)
        rc = tp_wire_msg_send(msg, socket, 0);
    tp_wire_msg_destroy(&msg);
    return rc;
}

tp_status_t tp_wire_recv(void *socket, const tp_wire_opts_t *opts,
                         tp_datapoint_t **out) {
    *out = NULL;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    if (!msg)
        return tp_error(TP_ERR_NOMEM, "wire recv");
    tp_status_t rc = tp_wire_msg_recv(msg, socket, 0);
    if (rc == TP_OK)
        rc = tp_wire_decode(msg, opts, out);
    tp_wire_msg_destroy(&msg);
    return rc;
}

/* ---- control frames (moved from actors/actor.c: they travel on the same
 * sockets as the encoded datapoints, so the wire format owns them) ------- */

int tp_ctl_send(void *sock, int kind, uint32_t sender, const char *text,
                int flags) {
    size_t len = text ? strlen(text) : 0;
    if (len > 4000)
        len = 4000;
    uint8_t buf[TP_CTL_HEADER + 4000];
    uint32_t magic = TP_CTL_MAGIC;
    memcpy(buf, &magic, 4);
    buf[4] = (uint8_t)kind;
    buf[5] = buf[6] = buf[7] = 0;
    memcpy(buf + 8, &sender, 4);
    if (len)
        memcpy(buf + TP_CTL_HEADER, text, len);
    return zmq_send(sock, buf, TP_CTL_HEADER + len, flags);
}

int tp_ctl_parse(const void *data, size_t size, int *kind, uint32_t *sender,
                 const char **text, size_t *text_len) {
    const uint8_t *p = data;
    uint32_t magic;
    if (size < TP_CTL_HEADER)
        return 0;
    if (size > TP_CTL_HEADER + 4000 &&
        !(size == TP_CTL_HEADER + TP_CTL_PAD_BYTES && ((const uint8_t *)data)[4] == TP_CTL_PAD))
        return 0;
    memcpy(&magic, p, 4);
    if (magic != TP_CTL_MAGIC || p[5] || p[6] || p[7])
        return 0;
    if (p[4] < TP_CTL_EOS || p[4] > TP_CTL_REPORT)
        return 0;
    *kind = p[4];
    memcpy(sender, p + 8, 4);
    *text = (const char *)p + TP_CTL_HEADER;
    *text_len = size - TP_CTL_HEADER;
    return 1;
}

int tp_ctl_send_pad(void *sock, int flags) {
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, TP_CTL_HEADER + TP_CTL_PAD_BYTES) != 0)
        return -1;
    uint8_t *p = zmq_msg_data(&m);
    memset(p, 0, TP_CTL_HEADER + TP_CTL_PAD_BYTES);
    uint32_t magic = TP_CTL_MAGIC;
    memcpy(p, &magic, 4);
    p[4] = TP_CTL_PAD;
    int rc = zmq_msg_send(&m, sock, flags);
    if (rc < 0)
        zmq_msg_close(&m);
    return rc;
}
