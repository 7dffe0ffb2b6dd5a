/* towerpack pipeline/input: ResidentInput, a data set kept whole in the
 * towers' memory (device memory on a GPU) and made into augmented batches
 * there, airbench's way for CIFAR-10: per step the host only draws the
 * picks (which image, where to crop, whether to mirror); the pixels never
 * cross the bus again.
 *
 * At start one pass of the dataflow is read into host arrays (datapoints
 * [image uint8 [h,w] or [h,w,c], label int32 or int64 scalar], every image
 * the same shape). When the launch binds the towers' backend
 * (tp_input_bind) the arrays are copied into its memory once; unbound, a
 * CPU backend of the input's own holds them (host memory). A pass is a
 * permutation of the images (or the order read, without shuffle) cut into
 * batches; the remainder is dropped, as BatchData(remainder=False) does.
 * Batch k of the stream goes to tower k % towers, so a resumed run that
 * skips n batches replays exactly the picks an unbroken one drew.
 *
 * A batch lends one of 2 x towers + 1 slots (an image buffer and a label
 * buffer in the backend's memory) until it is destroyed or given back; a
 * slot is rewritten only after that, and the trainer gives a batch back
 * once the step that read it has finished on the device. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/clock.h>
#include <towerpack/log.h>
#include <towerpack/rng.h>
#include <towerpack/stats.h>
#include <towerpack/launch.h>

#define S_MAX_SLOTS 129

typedef struct s_res s_res_t;

typedef struct {
    s_res_t *owner;
    float *images;        /* backend memory: batch x crop_h x crop_w x c */
    int32_t *labels;      /* backend memory: batch */
    atomic_int lent;
} s_slot_t;

struct s_res {
    tp_dataflow_t *df;
    tp_resident_opts_t opts;
    tp_augment_shape_t shape;
    /* the data set: host copies until bound, then backend memory */
    uint8_t *host_images;
    int32_t *host_labels;
    int64_t n;            /* images */
    uint8_t *images;      /* in the backend's memory */
    int32_t *labels;
    tp_backend_t *backend;     /* the towers' (borrowed) or own_backend */
    tp_backend_t *own_backend; /* unbound: a CPU backend of our own */
    /* the stream of batches */
    tp_rng_t rng;
    uint32_t *order;      /* [n]: this pass */
    int64_t pos;          /* next image of the pass */
    int64_t made;         /* batches made */
    tp_augment_pick_t *picks;  /* [batch] */
    s_slot_t slots[S_MAX_SLOTS];
    int nslots, next_slot;
    int towers;           /* as started */
    double t_start;
    uint64_t busy_ns;     /* drawing picks and launching */
};

/* The first image's shape decides; every image must match it. */
static tp_status_t s_read_pass(s_res_t *r) {
    size_t cap = 0, img_bytes = 0;
    tp_status_t rc;
    for (;;) {
        tp_datapoint_t *dp = NULL;
        rc = tp_dataflow_next(r->df, &dp);
        if (rc == TP_DONE)
            break;
        if (rc < 0)
            return tp_error_wrap(rc, "ResidentInput: reading %s", tp_dataflow_name(r->df));
        const tp_tensor_t *im = tp_datapoint_size(dp) >= 2 ? tp_datapoint_cget(dp, 0) : NULL;
        const tp_tensor_t *lb = im ? tp_datapoint_cget(dp, 1) : NULL;
        int ok = im && im->dtype == TP_UINT8 && (im->ndim == 2 || im->ndim == 3) &&
                 lb && tp_tensor_numel(lb) == 1 &&
                 (lb->dtype == TP_INT32 || lb->dtype == TP_INT64);
        if (ok && r->n == 0) {
            r->shape.h = (int)im->shape[0];
            r->shape.w = (int)im->shape[1];
            r->shape.c = im->ndim == 3 ? (int)im->shape[2] : 1;
            img_bytes = im->nbytes;
        }
        ok = ok && im->nbytes == img_bytes && (int)im->shape[0] == r->shape.h &&
             (int)im->shape[1] == r->shape.w;
        if (!ok) {
            char what[96] = "not [image, label]";
            if (im)
                snprintf(what, sizeof what, "image %s with %d dims (%lld x %lld)",
                         tp_dtype_name(im->dtype), im->ndim, (long long)im->shape[0],
                         im->ndim > 1 ? (long long)im->shape[1] : 1LL);
            tp_datapoint_destroy(&dp);
            return tp_error(TP_ERR_SHAPE,
                            "ResidentInput: datapoint %lld of %s is %s; every one "
                            "must be [image uint8 %dx%dx%d, label int32/int64]",
                            (long long)r->n, tp_dataflow_name(r->df), what,
                            r->shape.h, r->shape.w, r->shape.c);
        }
        if ((size_t)r->n == cap) {
            cap = cap ? cap * 2 : 1024;
            uint8_t *ni = realloc(r->host_images, cap * img_bytes);
            if (ni)
                r->host_images = ni;
            int32_t *nl = realloc(r->host_labels, cap * sizeof *nl);
            if (nl)
                r->host_labels = nl;
            if (!ni || !nl) {
                tp_datapoint_destroy(&dp);
                return tp_error(TP_ERR_NOMEM, "ResidentInput: %zu images", cap);
            }
        }
        memcpy(r->host_images + (size_t)r->n * img_bytes, im->data, img_bytes);
        r->host_labels[r->n] = lb->dtype == TP_INT32 ? *(const int32_t *)lb->data
                                                     : (int32_t)*(const int64_t *)lb->data;
        r->n++;
        tp_datapoint_destroy(&dp);
    }
    if (r->n < r->opts.batch)
        return tp_error(TP_ERR_INVALID, "ResidentInput: %s has %lld images, fewer "
                        "than one batch of %lld", tp_dataflow_name(r->df),
                        (long long)r->n, (long long)r->opts.batch);
    return TP_OK;
}

static tp_status_t s_shape(s_res_t *r) {
    tp_augment_shape_t *s = &r->shape;
    s->crop_h = r->opts.crop_h > 0 ? r->opts.crop_h : s->h;
    s->crop_w = r->opts.crop_w > 0 ? r->opts.crop_w : s->w;
    s->pad = r->opts.pad;
    if (s->c > 4 || s->crop_h > s->h + 2 * s->pad || s->crop_w > s->w + 2 * s->pad)
        return tp_error(TP_ERR_INVALID, "ResidentInput: crop %dx%d of %dx%dx%d "
                        "images padded by %d (at most 4 channels, the crop inside)",
                        s->crop_h, s->crop_w, s->h, s->w, s->c, s->pad);
    for (int k = 0; k < s->c; k++) {
        float mean = r->opts.mean[k < r->opts.nstats ? k : 0];
        float std = r->opts.nstats > 0 ? r->opts.std[k < r->opts.nstats ? k : 0] : 255.0f;
        if (!(std > 0))
            return tp_error(TP_ERR_INVALID, "ResidentInput: std %g of channel %d", std, k);
        s->mean[k] = r->opts.nstats > 0 ? mean : 0.0f;
        s->inv_std[k] = 1.0f / std;
    }
    return TP_OK;
}

static void s_slot_free(void *data, void *hint) {
    (void)data;
    s_slot_t *slot = hint;
    atomic_store_explicit(&slot->lent, 0, memory_order_release);
}

static void s_free_data(s_res_t *r) {
    tp_backend_t *b = r->backend;
    for (int i = 0; i < r->nslots; i++) {
        if (b) {
            tp_backend_free(b, r->slots[i].images);
            tp_backend_free(b, r->slots[i].labels);
        }
        r->slots[i].images = NULL;
        r->slots[i].labels = NULL;
    }
    r->nslots = 0;
    if (b) {
        tp_backend_free(b, r->images);
        tp_backend_free(b, r->labels);
    }
    r->images = NULL;
    r->labels = NULL;
}

/* Into the backend's memory: the data set once, and the slots. */
static tp_status_t s_upload(s_res_t *r, int towers) {
    tp_backend_t *b = r->backend;
    const tp_augment_shape_t *s = &r->shape;
    size_t img = (size_t)s->h * s->w * s->c;
    size_t out = (size_t)r->opts.batch * s->crop_h * s->crop_w * s->c * sizeof(float);
    r->images = tp_backend_alloc(b, (size_t)r->n * img);
    r->labels = tp_backend_alloc(b, (size_t)r->n * sizeof(int32_t));
    if (!r->images || !r->labels)
        return tp_error(TP_ERR_NOMEM, "ResidentInput: %lld images (%.1f MB) on the "
                        "%s backend", (long long)r->n, (double)r->n * img / 1e6,
                        tp_backend_name(b));
    TP_TRY(tp_backend_copy(b, r->images, r->host_images, (size_t)r->n * img));
    TP_TRY(tp_backend_copy(b, r->labels, r->host_labels, (size_t)r->n * sizeof(int32_t)));
    r->nslots = 2 * towers + 1 < S_MAX_SLOTS ? 2 * towers + 1 : S_MAX_SLOTS;
    for (int i = 0; i < r->nslots; i++) {
        s_slot_t *sl = &r->slots[i];
        sl->owner = r;
        atomic_init(&sl->lent, 0);
        sl->images = tp_backend_alloc(b, out);
        sl->labels = tp_backend_alloc(b, (size_t)r->opts.batch * sizeof(int32_t));
        if (!sl->images || !sl->labels)
            return tp_error(TP_ERR_NOMEM, "ResidentInput: batch slots on the %s "
                            "backend", tp_backend_name(b));
    }
    TP_INFO("ResidentInput: %lld images of %dx%dx%d (%.1f MB) in the %s backend's "
            "memory, batches of %lld at %dx%d", (long long)r->n, s->h, s->w, s->c,
            (double)r->n * img / 1e6, tp_backend_name(b), (long long)r->opts.batch,
            s->crop_h, s->crop_w);
    return TP_OK;
}

/* The next batch's picks, from the stream's generator. */
static void s_draw(s_res_t *r) {
    const tp_augment_shape_t *s = &r->shape;
    int64_t b = r->opts.batch;
    if (r->pos + b > r->n) {  /* a new pass; the remainder is dropped */
        for (uint32_t i = 0; i < (uint32_t)r->n; i++)
            r->order[i] = i;
        if (r->opts.shuffle)
            tp_rng_shuffle_u32(&r->rng, r->order, (size_t)r->n);
        r->pos = 0;
    }
    uint64_t ny = (uint64_t)(s->h + 2 * s->pad - s->crop_h) + 1;
    uint64_t nx = (uint64_t)(s->w + 2 * s->pad - s->crop_w) + 1;
    for (int64_t i = 0; i < b; i++) {
        tp_augment_pick_t *p = &r->picks[i];
        p->index = (int32_t)r->order[r->pos + i];
        p->y = ny > 1 ? (int32_t)tp_rng_below(&r->rng, ny) : 0;
        p->x = nx > 1 ? (int32_t)tp_rng_below(&r->rng, nx) : 0;
        p->flip = r->opts.flip ? (int32_t)(tp_rng_u32(&r->rng) >> 31) : 0;
    }
    r->pos += b;
    r->made++;
}

static tp_status_t res_start(void *impl, int towers, uint64_t seed, int64_t skip) {
    s_res_t *r = impl;
    if (r->n == 0) {
        TP_TRY(tp_dataflow_reset_state(r->df, seed, 0));
        TP_TRY(s_read_pass(r));
        TP_TRY(s_shape(r));
        r->order = malloc((size_t)r->n * sizeof *r->order);
        r->picks = malloc((size_t)r->opts.batch * sizeof *r->picks);
        if (!r->order || !r->picks)
            return tp_error(TP_ERR_NOMEM, "ResidentInput");
    }
    tp_rng_init(&r->rng, seed, 0x7265736964656e74ULL);  /* "resident" */
    r->pos = r->n;  /* the first draw starts a pass */
    r->made = 0;
    r->towers = towers;
    for (int64_t i = 0; i < skip; i++)  /* replay the picks, make nothing */
        s_draw(r);
    r->t_start = tp_now_s();
    return TP_OK;
}

static tp_status_t res_bind(void *impl, tp_backend_t *const *backends, int n) {
    s_res_t *r = impl;
    tp_backend_t *backend = backends[0];
    for (int i = 1; i < n; i++)
        if (backends[i] != backend)
            return tp_error(TP_ERR_UNSUPPORTED, "ResidentInput: the towers span "
                            "%d devices, and it keeps one copy of the data set "
                            "(on one device); use StagingInput (tp-train without "
                            "--resident)", n);
    if (r->images) {
        if (backend == r->backend)
            return TP_OK;
        s_free_data(r);
    }
    tp_backend_destroy(&r->own_backend);
    r->backend = backend;
    return TP_OK;
}

static tp_status_t res_next(void *impl, int tower, tp_datapoint_t **out) {
    s_res_t *r = impl;
    if (r->n == 0)
        return tp_error(TP_ERR_STATE, "ResidentInput: next before start");
    if (!r->backend) {  /* nobody bound it: host memory of our own */
        if (!(r->own_backend = tp_backend_cpu_new(0)))
            return tp_error_wrap(TP_ERR_NOMEM, "ResidentInput");
        r->backend = r->own_backend;
    }
    if (!r->images)
        TP_TRY(s_upload(r, r->towers > 0 ? r->towers : 1));
    uint64_t t0 = tp_now_ns();
    s_slot_t *slot = NULL;
    for (int k = 0; k < r->nslots && !slot; k++) {
        s_slot_t *c = &r->slots[(r->next_slot + k) % r->nslots];
        if (!atomic_load_explicit(&c->lent, memory_order_acquire)) {
            slot = c;
            r->next_slot = (int)((c - r->slots) + 1) % r->nslots;
        }
    }
    if (!slot)
        return tp_error(TP_ERR_STATE, "ResidentInput (tower%d): all %d batch slots "
                        "are lent: give batches back (tp_input_release) once their "
                        "step is done", tower, r->nslots);
    s_draw(r);
    const tp_augment_shape_t *s = &r->shape;
    TP_TRY(tp_backend_augment_batch(r->backend, NULL, slot->images, slot->labels,
                                    r->images, r->labels, r->n, r->picks,
                                    (int)r->opts.batch, s));
    tp_datapoint_t *dp = tp_datapoint_new(2);
    if (!dp)
        return tp_error(TP_ERR_NOMEM, "ResidentInput");
    int64_t ishape[4] = {r->opts.batch, s->crop_h, s->crop_w, s->c};
    int64_t lshape[1] = {r->opts.batch};
    atomic_store_explicit(&slot->lent, 1, memory_order_relaxed);
    /* the image tensor's release gives the slot back */
    if (tp_tensor_init_wrap(tp_datapoint_get(dp, 0), TP_FLOAT32, s->c > 1 ? 4 : 3,
                            ishape, slot->images, s_slot_free, slot) < 0 ||
        tp_tensor_init_wrap(tp_datapoint_get(dp, 1), TP_INT32, 1, lshape,
                            slot->labels, NULL, NULL) < 0) {
        atomic_store(&slot->lent, 0);
        tp_datapoint_destroy(&dp);
        return tp_error(TP_ERR_NOMEM, "ResidentInput");
    }
    r->busy_ns += tp_now_ns() - t0;
    *out = dp;
    return TP_OK;
}

/* Batches in a pass (the remainder dropped); before the pass is read, the
 * dataflow's own size says it, so a launch can plan its epochs (and the
 * schedules over them) before the start. */
static int64_t res_size(void *impl) {
    s_res_t *r = impl;
    int64_t n = r->n > 0 ? r->n : tp_dataflow_size(r->df);
    return n > 0 ? n / r->opts.batch : -1;
}

static void res_destroy(void *impl) {
    s_res_t *r = impl;
    for (int i = 0; i < r->nslots; i++)
        if (atomic_load(&r->slots[i].lent))
            TP_WARN("ResidentInput destroyed with a batch still lent: its memory "
                    "goes with it");
    s_free_data(r);
    tp_backend_destroy(&r->own_backend);
    tp_dataflow_destroy(&r->df);
    free(r->host_images);
    free(r->host_labels);
    free(r->order);
    free(r->picks);
    free(r);
}

/* One row: batches made, and the time drawing picks and launching (on the
 * trainer's thread, so it is the trainer's time). */
static int res_stats(void *impl, tp_stats_row_t *rows, int max) {
    s_res_t *r = impl;
    if (r->t_start <= 0 || max < 1)
        return 0;
    tp_stats_row_t *row = &rows[0];
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "ResidentInput");
    row->state = TP_ACTOR_RUNNING;
    row->msgs_out = (uint64_t)r->made;
    row->busy_s = (double)r->busy_ns * 1e-9;
    row->alive_s = tp_now_s() - r->t_start;
    row->queue_fill = -1;
    return 1;
}

static const tp_input_ops_t s_res_ops = {
    .name = "ResidentInput", .start = res_start, .next = res_next, .size = res_size,
    .destroy = res_destroy, .stats = res_stats, .bind = res_bind,
};

void tp_resident_opts_init(tp_resident_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->batch = 32;
    o->shuffle = 1;
}

tp_input_t *tp_input_resident(tp_dataflow_t *df, const tp_resident_opts_t *opts) {
    if (!df) {
        tp_error(TP_ERR_INVALID, "ResidentInput: no dataflow");
        return NULL;
    }
    tp_resident_opts_t o;
    if (opts)
        o = *opts;
    else
        tp_resident_opts_init(&o);
    if (o.batch < 1 || o.pad < 0 || o.crop_h < 0 || o.crop_w < 0 || o.nstats < 0 ||
        o.nstats > 4) {
        tp_dataflow_destroy(&df);
        tp_error(TP_ERR_INVALID, "ResidentInput: batch %lld, crop %dx%d, pad %d, "
                 "%d mean/std pairs (need batch >= 1, crop and pad >= 0, 0..4 pairs)",
                 (long long)o.batch, o.crop_h, o.crop_w, o.pad, o.nstats);
        return NULL;
    }
    s_res_t *r = calloc(1, sizeof *r);
    if (!r) {
        tp_dataflow_destroy(&df);
        tp_error(TP_ERR_NOMEM, "ResidentInput");
        return NULL;
    }
    r->df = df;
    r->opts = o;
    return tp_input_new(&s_res_ops, r);
}
