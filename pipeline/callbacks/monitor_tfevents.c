/* towerpack pipeline: TFEventWriter, TensorBoard's event file.
 *
 * LOGDIR/events.out.tfevents.<secs>.<hostname> is a TFRecord file of
 * tensorflow.Event messages (pipeline/callbacks/proto/, TensorFlow's field
 * numbers, encoded by protobuf-c): first an Event with file_version
 * "brain.Event:2", then one Event per scalar put (tp_trainer_put_scalar) with
 * the global step it was put at, one per image put (tp_trainer_put_image,
 * PNG-encoded image summaries), and the run's hyper-parameters once as a
 * text summary. Each record is
 *
 *   uint64 length (little endian) | uint32 masked crc32c(length bytes)
 *   | data | uint32 masked crc32c(data)
 *
 * Records are gathered in a buffer and handed to the kernel with one write()
 * per flush (each epoch end, and every FLUSH_S while scalars arrive), so a
 * reader sees a running job and a killed one leaves whole records plus at
 * most one partial tail. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/callback.h>
#include <towerpack/clock.h>
#include <towerpack/image.h>
#include <towerpack/log.h>

#include "event.pb-c.h"

/* Scalars put during an epoch reach the file at most this late. */
#define FLUSH_S 2.0

/* ---- CRC32C (Castagnoli), as TFRecord frames it ---------------------------
 * Debian has no C library for it (zlib's crc32 is the other polynomial), and
 * the records are small: a byte-wise table is fast enough. */

static uint32_t s_crc_table[256];
static pthread_once_t s_crc_once = PTHREAD_ONCE_INIT;

static void s_crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  /* reflected 0x1EDC6F41 */
        s_crc_table[i] = c;
    }
}

static uint32_t s_crc32c(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    while (n--)
        c = s_crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

/* TFRecord stores CRCs masked: a CRC of data that holds CRCs is weak. */
static uint32_t s_masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = s_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void s_put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- the writer ------------------------------------------------------------- */

typedef struct {
    char *hparams;         /* copied; NULL: none */
    char path[4096];
    int fd;                /* -1 until the file is opened, -2 once closed */
    uint8_t *buf;          /* whole records not yet written */
    size_t len, cap;
    uint8_t *msg;          /* one packed Event; grows only for a longer one */
    size_t msg_cap;
    double last_flush;     /* tp_now_s() */
    tp_status_t err;       /* sticky: the first failure, with its message */
    char errmsg[4096 + 256];  /* the path, what failed, strerror */
} s_tfe_t;

/* Remember the first failure, log it now (on_scalar cannot return it), and
 * hand it to the next hook that can stop training. */
static void s_fail(s_tfe_t *t, tp_status_t rc, const char *what, int e) {
    if (t->err < 0)
        return;
    t->err = rc;
    snprintf(t->errmsg, sizeof t->errmsg, "%s: %s: %s", t->path[0] ? t->path
             : "event file", what, strerror(e));
    TP_ERROR("TFEventWriter: %s", t->errmsg);
}

static tp_status_t s_status(const s_tfe_t *t) {
    return t->err < 0 ? tp_error(t->err, "TFEventWriter: %s", t->errmsg) : TP_OK;
}

static int s_reserve(uint8_t **p, size_t *cap, size_t need) {
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < need)
        n *= 2;
    uint8_t *q = realloc(*p, n);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* Frame the packed Event in t->msg[0..n) as one record at the buffer's end. */
static void s_append_record(s_tfe_t *t, size_t n) {
    if (s_reserve(&t->buf, &t->cap, t->len + n + 16) < 0) {
        s_fail(t, TP_ERR_NOMEM, "buffering a record", ENOMEM);
        return;
    }
    uint8_t *r = t->buf + t->len;
    s_put_le(r, n, 8);
    s_put_le(r + 8, s_masked_crc(r, 8), 4);
    memcpy(r + 12, t->msg, n);
    s_put_le(r + 12 + n, s_masked_crc(t->msg, n), 4);
    t->len += n + 16;
}

static void s_append_event(s_tfe_t *t, const Tensorflow__Event *ev) {
    size_t n = tensorflow__event__get_packed_size(ev);
    if (s_reserve(&t->msg, &t->msg_cap, n) < 0) {
        s_fail(t, TP_ERR_NOMEM, "packing an event", ENOMEM);
        return;
    }
    tensorflow__event__pack(ev, t->msg);
    s_append_record(t, n);
}

/* Everything buffered to the file in one write() (more only when the kernel
 * takes part of it, e.g. a full disk, which the next write() reports). */
/* One summary value as an Event at the trainer's global step. */
static void s_append_value(s_tfe_t *t, tp_trainer_t *tr, Tensorflow__Summary__Value *v) {
    Tensorflow__Summary__Value *vs[1] = {v};
    Tensorflow__Summary sum = TENSORFLOW__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = vs;
    Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
    ev.wall_time = tp_wall_s();
    ev.step = tp_trainer_global_step(tr);
    ev.what_case = TENSORFLOW__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    s_append_event(t, &ev);
}

static void s_flush(s_tfe_t *t) {
    t->last_flush = tp_now_s();
    if (t->fd < 0 || t->err < 0)
        return;
    size_t off = 0;
    while (off < t->len) {
        ssize_t w = write(t->fd, t->buf + off, t->len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            s_fail(t, TP_ERR_IO, "write", errno);
            break;
        }
        off += (size_t)w;
    }
    t->len = 0;
}

static void s_open(s_tfe_t *t, tp_trainer_t *tr) {
    if (t->fd != -1 || t->err < 0)
        return;
    const char *dir = tp_trainer_logdir(tr);
    if (!dir) {
        t->err = TP_ERR_STATE;
        snprintf(t->errmsg, sizeof t->errmsg,
                 "needs a log directory (tp_trainer_set_logdir)");
        return;
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    long secs = (long)tp_wall_s();
    /* Two runs started in the same second in one directory get two files
     * (TensorBoard reads every file with "tfevents" in its name). */
    for (int i = 0; i < 100 && t->fd < 0; i++) {
        if (i == 0)
            snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%ld.%s",
                     dir, secs, host);
        else
            snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%ld.%s.%d",
                     dir, secs, host, i);
        t->fd = open(t->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC,
                     0644);
        if (t->fd < 0 && errno != EEXIST)
            break;
    }
    if (t->fd < 0) {
        s_fail(t, TP_ERR_IO, "open", errno);
        return;
    }
    Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
    ev.wall_time = tp_wall_s();
    ev.step = tp_trainer_global_step(tr);
    ev.what_case = TENSORFLOW__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    s_append_event(t, &ev);
    TP_INFO("TFEventWriter: %s (tensorboard --logdir %s)", t->path, dir);
}

static tp_status_t tfe_before_train(void *impl, tp_trainer_t *tr) {
    s_tfe_t *t = impl;
    s_open(t, tr);
    if (t->hparams && t->err == 0) {
        /* A scalar string tensor under TensorBoard's text plugin: the text
         * dashboard renders it as markdown. */
        Tensorflow__SummaryMetadata__PluginData pd =
            TENSORFLOW__SUMMARY_METADATA__PLUGIN_DATA__INIT;
        pd.plugin_name = "text";
        Tensorflow__SummaryMetadata md = TENSORFLOW__SUMMARY_METADATA__INIT;
        md.plugin_data = &pd;
        Tensorflow__TensorShapeProto shape = TENSORFLOW__TENSOR_SHAPE_PROTO__INIT;
        ProtobufCBinaryData text = {strlen(t->hparams), (uint8_t *)t->hparams};
        Tensorflow__TensorProto tensor = TENSORFLOW__TENSOR_PROTO__INIT;
        tensor.dtype = TENSORFLOW__DATA_TYPE__DT_STRING;
        tensor.tensor_shape = &shape;
        tensor.n_string_val = 1;
        tensor.string_val = &text;
        Tensorflow__Summary__Value v = TENSORFLOW__SUMMARY__VALUE__INIT;
        v.tag = "hparams";
        v.metadata = &md;
        v.value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_TENSOR;
        v.tensor = &tensor;
        s_append_value(t, tr, &v);
    }
    s_flush(t);
    return s_status(t);
}

/* Every scalar as it is put: no allocation once the buffers have grown to
 * an epoch's worth of records (the first epoch). */
static void tfe_on_scalar(void *impl, tp_trainer_t *tr, const char *name,
                          double value) {
    s_tfe_t *t = impl;
    s_open(t, tr);
    if (t->err < 0)
        return;
    Tensorflow__Summary__Value v = TENSORFLOW__SUMMARY__VALUE__INIT;
    v.tag = (char *)name;
    v.value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = (float)value;
    s_append_value(t, tr, &v);
    if (tp_now_s() - t->last_flush >= FLUSH_S)
        s_flush(t);
}

/* Every image as it is put, encoded as PNG (TensorBoard decodes PNG or
 * JPEG; PNG keeps a sample grid exact). Written with the next flush. */
static void tfe_on_image(void *impl, tp_trainer_t *tr, const char *tag,
                         const tp_tensor_t *image) {
    s_tfe_t *t = impl;
    s_open(t, tr);
    if (t->err < 0)
        return;
    tp_tensor_t view = *image;  /* grey: the encoder takes [H, W] */
    view.free_fn = NULL;
    if (view.shape[2] == 1)
        view.ndim = 2;
    void *png = NULL;
    size_t size = 0;
    if (tp_image_encode_png(&view, &png, &size) != TP_OK) {
        TP_WARN("TFEventWriter: image %s not written: %s", tag, tp_last_error());
        return;
    }
    Tensorflow__Summary__Image im = TENSORFLOW__SUMMARY__IMAGE__INIT;
    im.height = (int32_t)image->shape[0];
    im.width = (int32_t)image->shape[1];
    im.colorspace = (int32_t)image->shape[2];
    im.encoded_image_string = (ProtobufCBinaryData){size, png};
    Tensorflow__Summary__Value v = TENSORFLOW__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_IMAGE;
    v.image = &im;
    s_append_value(t, tr, &v);
    free(png);
}

static tp_status_t tfe_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_tfe_t *t = impl;
    s_flush(t);
    return s_status(t);
}

static tp_status_t tfe_after_train(void *impl, tp_trainer_t *tr) {
    s_tfe_t *t = impl;
    s_flush(t);
    if (t->fd >= 0 && close(t->fd) < 0)
        s_fail(t, TP_ERR_IO, "close", errno);
    t->fd = -2;  /* a scalar put after training opens no second file */
    return s_status(t);
}

static void tfe_destroy(void *impl) {
    s_tfe_t *t = impl;
    if (t->fd >= 0)
        close(t->fd);
    free(t->hparams);
    free(t->buf);
    free(t->msg);
    free(t);
}

static const tp_callback_ops_t s_tfe_ops = {
    .name = "TFEventWriter",
    .before_train = tfe_before_train,
    .trigger_epoch = tfe_trigger_epoch,
    .after_train = tfe_after_train,
    .on_scalar = tfe_on_scalar,
    .on_image = tfe_on_image,
    .destroy = tfe_destroy,
};

tp_callback_t *tp_cb_tfevent_writer(const char *hparams) {
    pthread_once(&s_crc_once, s_crc_init);
    s_tfe_t *t = calloc(1, sizeof *t);
    if (!t || (hparams && !(t->hparams = strdup(hparams))) ||
        s_reserve(&t->buf, &t->cap, 64 * 1024) < 0 ||
        s_reserve(&t->msg, &t->msg_cap, 4096) < 0) {
        if (t) {
            free(t->hparams);
            free(t->buf);
            free(t);
        }
        tp_error(TP_ERR_NOMEM, "TFEventWriter");
        return NULL;
    }
    t->fd = -1;
    return tp_callback_new(&s_tfe_ops, t, 1);
}
