/* towerpack dataflow: the pipeline spec parser and its registry of sources,
 * stages and map stages.
 *
 * Parsing is two steps: split the spec at '|' keeping every segment's
 * column, then build left to right through the registry. Any failure is
 * reported with the spec quoted and carets under the segment (or just the
 * name, for an unknown one), so a user sees where it went wrong. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <towerpack/dataflow_spec.h>
#include "df_internal.h"

enum { REG_SOURCE, REG_STAGE, REG_MAP };

typedef struct {
    char name[48];
    int kind;
    tp_spec_source_fn source;
    tp_spec_stage_fn stage;
    tp_spec_map_fn map;
    void *user;
} reg_t;

#define REG_MAX 128
static reg_t s_reg[REG_MAX];
static int s_nreg;
static pthread_mutex_t s_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t s_once = PTHREAD_ONCE_INIT;

static void s_builtins(void);

static int s_name_char(char c) {
    return isalnum((unsigned char)c) || c == '-' || c == '_';
}

static tp_status_t s_register(const char *name, reg_t *e) {
    pthread_once(&s_once, s_builtins);
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n >= sizeof e->name)
        return tp_error(TP_ERR_INVALID, "spec: register: bad name '%s'",
                        name ? name : "(null)");
    for (size_t i = 0; i < n; i++)
        if (!s_name_char(name[i]))
            return tp_error(TP_ERR_INVALID, "spec: register: bad character "
                            "in name '%s'", name);
    memcpy(e->name, name, n + 1);
    pthread_mutex_lock(&s_mu);
    tp_status_t rc = TP_OK;
    int i;
    /* Stages and map stages share one namespace; sources have their own. */
    for (i = 0; i < s_nreg; i++) {
        int same_space = (s_reg[i].kind == REG_SOURCE) ==
                         (e->kind == REG_SOURCE);
        if (same_space && !strcmp(s_reg[i].name, name))
            break;
    }
    if (i < s_nreg)
        s_reg[i] = *e;
    else if (s_nreg < REG_MAX)
        s_reg[s_nreg++] = *e;
    else
        rc = tp_error(TP_ERR_NOMEM, "spec: registry full (%d)", REG_MAX);
    pthread_mutex_unlock(&s_mu);
    return rc;
}

tp_status_t tp_spec_register_source(const char *name, tp_spec_source_fn fn,
                                    void *user) {
    reg_t e = {.kind = REG_SOURCE, .source = fn, .user = user};
    if (!fn)
        return tp_error(TP_ERR_INVALID, "spec: register: NULL factory");
    return s_register(name, &e);
}

tp_status_t tp_spec_register_stage(const char *name, tp_spec_stage_fn fn,
                                   void *user) {
    reg_t e = {.kind = REG_STAGE, .stage = fn, .user = user};
    if (!fn)
        return tp_error(TP_ERR_INVALID, "spec: register: NULL factory");
    return s_register(name, &e);
}

tp_status_t tp_spec_register_map(const char *name, tp_spec_map_fn fn,
                                 void *user) {
    reg_t e = {.kind = REG_MAP, .map = fn, .user = user};
    if (!fn)
        return tp_error(TP_ERR_INVALID, "spec: register: NULL factory");
    return s_register(name, &e);
}

/* Look a name up (a copy of the entry, so no lock is held while a factory
 * runs). 1 when found. */
static int s_lookup(const char *name, size_t len, int source, reg_t *out) {
    pthread_once(&s_once, s_builtins);
    int found = 0;
    pthread_mutex_lock(&s_mu);
    for (int i = 0; i < s_nreg && !found; i++) {
        if ((s_reg[i].kind == REG_SOURCE) != source)
            continue;
        if (strlen(s_reg[i].name) == len && !memcmp(s_reg[i].name, name, len)) {
            *out = s_reg[i];
            found = 1;
        }
    }
    pthread_mutex_unlock(&s_mu);
    return found;
}

static void s_known(int source, char *buf, size_t size) {
    size_t off = 0;
    buf[0] = '\0';
    pthread_mutex_lock(&s_mu);
    for (int i = 0; i < s_nreg; i++) {
        if ((s_reg[i].kind == REG_SOURCE) != source)
            continue;
        int n = snprintf(buf + off, size - off, "%s%s", off ? ", " : "",
                         s_reg[i].name);
        if (n < 0 || (size_t)n >= size - off)
            break;
        off += (size_t)n;
    }
    pthread_mutex_unlock(&s_mu);
}

/* Split args into whitespace/comma separated tokens (up to max). */
static int s_tokens(char *args, char **tok, int max) {
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(args, " \t\n,", &save); t;
         t = strtok_r(NULL, " \t\n,", &save)) {
        if (n == max)
            return -1;
        tok[n++] = t;
    }
    return n;
}

static int s_flag(const char *value, int dflt) {
    if (!value)
        return dflt;
    return !(!strcmp(value, "0") || !strcmp(value, "false") ||
             !strcmp(value, "no") || !strcmp(value, "off"));
}

/* ---- built-in sources ----------------------------------------------------- */

/* Split "A[,B][,shuffle=X]" into positional items (copied into buf). */
static tp_status_t s_src_split(const char *who, const char *args, char *buf,
                               size_t size, char **pos, int maxpos, int *npos,
                               int *shuffle) {
    if (strlen(args) >= size)
        return tp_error(TP_ERR_INVALID, "%s: arguments too long", who);
    strcpy(buf, args);
    *npos = 0;
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        item = df_spec_trim(item);
        if (!*item)
            continue;
        char *eq = strchr(item, '=');
        if (eq) {
            *eq = '\0';
            char *k = df_spec_trim(item), *v = df_spec_trim(eq + 1);
            if (strcmp(k, "shuffle") != 0)
                return tp_error(TP_ERR_INVALID, "%s: unknown option '%s' "
                                "(shuffle=0|1)", who, k);
            *shuffle = s_flag(v, 1);
            continue;
        }
        if (*npos == maxpos)
            return tp_error(TP_ERR_INVALID, "%s: unexpected argument '%s'",
                            who, item);
        pos[(*npos)++] = item;
    }
    return TP_OK;
}

static tp_status_t s_fmnist_src(const char *args, void *user,
                                tp_dataflow_t **out) {
    char buf[256], *pos[1];
    int npos, shuffle = 1;
    TP_TRY(s_src_split("fashion-mnist", args, buf, sizeof buf, pos, 1, &npos,
                       &shuffle));
    if (npos != 1)
        return tp_error(TP_ERR_INVALID, "fashion-mnist: give a split "
                        "(fashion-mnist:train or fashion-mnist:test)");
    *out = tp_df_fashion_mnist(pos[0], shuffle);
    return *out ? TP_OK : TP_ERR_INVALID;
}

static tp_status_t s_idx_src(const char *args, void *user,
                             tp_dataflow_t **out) {
    char buf[8192], *pos[2];
    int npos, shuffle = 1;
    TP_TRY(s_src_split("idx", args, buf, sizeof buf, pos, 2, &npos,
                       &shuffle));
    if (npos < 1)
        return tp_error(TP_ERR_INVALID, "idx: give IMAGES[,LABELS]");
    *out = tp_df_idx(pos[0], npos > 1 ? pos[1] : NULL, shuffle);
    return *out ? TP_OK : TP_ERR_INVALID;
}

static tp_status_t s_lmdb_src(const char *args, void *user,
                              tp_dataflow_t **out) {
    char buf[8192], *pos[1];
    int npos, shuffle = 0;
    TP_TRY(s_src_split("lmdb", args, buf, sizeof buf, pos, 1, &npos,
                       &shuffle));
    if (npos != 1)
        return tp_error(TP_ERR_INVALID, "lmdb: give a PATH");
    *out = tp_df_lmdb(pos[0], shuffle);
    return *out ? TP_OK : TP_ERR_INVALID;
}

typedef struct {
    tp_df_fake_comp_t comps[16];
    int has_dtype[16];
    int ncomp;
    int64_t size;
    int random;
    tp_dtype_t dtype;
} fake_args_t;

static tp_status_t s_fake_shape(fake_args_t *a, const char *value) {
    if (a->ncomp == 16)
        return tp_error(TP_ERR_INVALID, "fake: at most 16 shapes");
    tp_df_fake_comp_t *c = &a->comps[a->ncomp];
    char buf[128];
    snprintf(buf, sizeof buf, "%s", value ? value : "");
    char *colon = strchr(buf, ':');
    if (colon) {
        *colon = '\0';
        TP_TRY(tp_dtype_parse(colon + 1, &c->dtype));
        a->has_dtype[a->ncomp] = 1;
    }
    c->ndim = 0;
    if (strcmp(buf, "scalar") != 0 && buf[0]) {
        char *save = NULL;
        for (char *d = strtok_r(buf, "x", &save); d;
             d = strtok_r(NULL, "x", &save)) {
            if (c->ndim == TP_MAX_DIMS)
                return tp_error(TP_ERR_INVALID, "fake: more than %d dims",
                                TP_MAX_DIMS);
            int64_t v;
            TP_TRY(tp_spec_int(d, 0, (int64_t)1 << 31, "fake: dimension", &v));
            c->shape[c->ndim++] = v;
        }
    }
    a->ncomp++;
    return TP_OK;
}

static tp_status_t s_fake_kv(const char *key, const char *value, void *ctx) {
    fake_args_t *a = ctx;
    if (!strcmp(key, "shape"))
        return s_fake_shape(a, value);
    if (!strcmp(key, "size"))
        return tp_spec_int(value, 0, INT64_MAX / 2, "fake: size", &a->size);
    if (!strcmp(key, "random")) {
        a->random = s_flag(value, 1);
        return TP_OK;
    }
    if (!strcmp(key, "const")) {
        a->random = !s_flag(value, 1);
        return TP_OK;
    }
    if (!strcmp(key, "dtype"))
        return tp_dtype_parse(value, &a->dtype);
    return tp_error(TP_ERR_INVALID, "fake: unknown option '%s' (shape=AxB[:"
                    "dtype], size=N, random=0|1, dtype=D)", key);
}

static tp_status_t s_fake_src(const char *args, void *user,
                              tp_dataflow_t **out) {
    fake_args_t a;
    memset(&a, 0, sizeof a);
    a.size = 1000;
    a.random = 1;
    a.dtype = TP_FLOAT32;
    TP_TRY(tp_spec_foreach_kv(args, s_fake_kv, &a));
    if (a.ncomp == 0) {
        /* Fashion-MNIST-shaped by default: uint8 [28,28] and an int32. */
        a.ncomp = 2;
        a.comps[0].dtype = TP_UINT8;
        a.comps[0].ndim = 2;
        a.comps[0].shape[0] = a.comps[0].shape[1] = 28;
        a.comps[1].dtype = TP_INT32;
        a.has_dtype[0] = a.has_dtype[1] = 1;
    }
    for (int i = 0; i < a.ncomp; i++)
        if (!a.has_dtype[i])
            a.comps[i].dtype = a.dtype;
    *out = tp_df_fake(a.comps, a.ncomp, a.size, a.random);
    return *out ? TP_OK : TP_ERR_INVALID;
}

/* ---- built-in stages ------------------------------------------------------ */

#define STAGE_TOKENS(who, args, tok, n, lo, hi)                               \
    char tbuf_[1024];                                                         \
    if (strlen(args) >= sizeof tbuf_) {                                       \
        tp_dataflow_destroy(&inner);                                          \
        return tp_error(TP_ERR_INVALID, "%s: arguments too long", who);       \
    }                                                                         \
    strcpy(tbuf_, args);                                                      \
    char *tok[16];                                                            \
    int n = s_tokens(tbuf_, tok, 16);                                         \
    if (n < (lo) || n > (hi)) {                                               \
        tp_dataflow_destroy(&inner);                                          \
        return tp_error(TP_ERR_INVALID, "%s: %d arguments (%d..%d expected)", \
                        who, n < 0 ? 17 : n, lo, hi);                         \
    }

#define STAGE_TRY(expr)                                                       \
    do {                                                                      \
        tp_status_t rc_ = (expr);                                             \
        if (rc_ < 0) {                                                        \
            tp_dataflow_destroy(&inner);                                      \
            return rc_;                                                       \
        }                                                                     \
    } while (0)

static tp_status_t s_done(tp_dataflow_t *df, tp_dataflow_t **out) {
    *out = df;
    return df ? TP_OK : TP_ERR_INVALID;
}

static tp_status_t s_batch_stage(tp_dataflow_t *inner, const char *args,
                                 void *user, tp_dataflow_t **out) {
    STAGE_TOKENS("batch", args, tok, n, 1, 2);
    int64_t bs;
    STAGE_TRY(tp_spec_int(tok[0], 1, INT32_MAX, "batch: size", &bs));
    int rem = 0;
    if (n == 2) {
        if (!strcmp(tok[1], "remainder") || !strcmp(tok[1], "remainder=1"))
            rem = 1;
        else if (strcmp(tok[1], "remainder=0") != 0)
            STAGE_TRY(tp_error(TP_ERR_INVALID, "batch: unknown option '%s' "
                               "(remainder)", tok[1]));
    }
    return s_done(tp_df_batch(inner, (int)bs, rem), out);
}

static tp_status_t s_shuffle_stage(tp_dataflow_t *inner, const char *args,
                                   void *user, tp_dataflow_t **out) {
    STAGE_TOKENS("shuffle", args, tok, n, 1, 3);
    int64_t size, reuse = 1, interval = 0;
    STAGE_TRY(tp_spec_int(tok[0], 1, 1 << 26, "shuffle: buffer size", &size));
    for (int i = 1; i < n; i++) {
        if (!strncmp(tok[i], "reuse=", 6))
            STAGE_TRY(tp_spec_int(tok[i] + 6, 1, 1 << 20, "shuffle: reuse",
                                  &reuse));
        else if (!strncmp(tok[i], "interval=", 9))
            STAGE_TRY(tp_spec_int(tok[i] + 9, 1, 1 << 26, "shuffle: interval",
                                  &interval));
        else
            STAGE_TRY(tp_error(TP_ERR_INVALID, "shuffle: unknown option '%s' "
                               "(reuse=K, interval=I)", tok[i]));
    }
    return s_done(tp_df_locally_shuffle(inner, (int)size, (int)reuse,
                                        (int)interval),
                  out);
}

static tp_status_t s_repeat_stage(tp_dataflow_t *inner, const char *args,
                                  void *user, tp_dataflow_t **out) {
    STAGE_TOKENS("repeat", args, tok, n, 0, 1);
    int64_t times = -1;
    if (n == 1 && strcmp(tok[0], "forever") != 0)
        STAGE_TRY(tp_spec_int(tok[0], 0, INT64_MAX / 2, "repeat: times",
                              &times));
    return s_done(tp_df_repeat(inner, times), out);
}

static tp_status_t s_cache_stage(tp_dataflow_t *inner, const char *args,
                                 void *user, tp_dataflow_t **out) {
    STAGE_TOKENS("cache", args, tok, n, 0, 1);
    if (n == 1 && strcmp(tok[0], "shuffle") != 0)
        STAGE_TRY(tp_error(TP_ERR_INVALID, "cache: unknown option '%s' "
                           "(shuffle)", tok[0]));
    return s_done(tp_df_cache(inner, n == 1), out);
}

static tp_status_t s_print_stage(tp_dataflow_t *inner, const char *args,
                                 void *user, tp_dataflow_t **out) {
    STAGE_TOKENS("print", args, tok, n, 0, 1);
    int64_t num = 1;
    if (n == 1)
        STAGE_TRY(tp_spec_int(tok[0], 0, INT32_MAX, "print: count", &num));
    return s_done(tp_df_print(inner, (int)num, NULL, NULL), out);
}

static tp_status_t s_fixed_stage(tp_dataflow_t *inner, const char *args,
                                 void *user, tp_dataflow_t **out) {
    STAGE_TOKENS("fixed-size", args, tok, n, 1, 1);
    int64_t size;
    STAGE_TRY(tp_spec_int(tok[0], 0, INT64_MAX / 2, "fixed-size: size",
                          &size));
    return s_done(tp_df_fixed_size(inner, size, 1), out);
}

static tp_status_t s_select_stage(tp_dataflow_t *inner, const char *args,
                                  void *user, tp_dataflow_t **out) {
    STAGE_TOKENS("select", args, tok, n, 1, 16);
    int idx[16];
    for (int i = 0; i < n; i++) {
        int64_t v;
        STAGE_TRY(tp_spec_int(tok[i], 0, TP_DP_MAX_COMPONENTS - 1,
                              "select: component", &v));
        idx[i] = (int)v;
    }
    return s_done(tp_df_select_component(inner, idx, n), out);
}

/* augment as a map stage: the chain plus the component it applies to */
typedef struct {
    tp_augment_t *aug;
    int component;
} aug_map_t;

static tp_status_t s_aug_map(tp_datapoint_t **dp, tp_rng_t *rng, void *user) {
    aug_map_t *m = user;
    if (m->component >= tp_datapoint_size(*dp))
        return tp_error(TP_ERR_SHAPE, "augment: component %d of a datapoint "
                        "of %d", m->component, tp_datapoint_size(*dp));
    return tp_augment_apply(m->aug, tp_datapoint_get(*dp, m->component), rng);
}

static void s_aug_map_free(void *user) {
    aug_map_t *m = user;
    tp_augment_destroy(&m->aug);
    free(m);
}

typedef struct {
    int crop_h, crop_w, pad;
    double flip;
    int nmean, nstd;
    float mean[16], std[16];
    int64_t component;
} aug_args_t;

static tp_status_t s_floats(const char *value, const char *what, float *out,
                            int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", value ? value : "");
    *n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (*n == 16)
            return tp_error(TP_ERR_INVALID, "%s: at most 16 values", what);
        double v;
        TP_TRY(tp_spec_double(t, what, &v));
        out[(*n)++] = (float)v;
    }
    if (*n == 0)
        return tp_error(TP_ERR_INVALID, "%s: no value", what);
    return TP_OK;
}

static tp_status_t s_aug_kv(const char *key, const char *value, void *ctx) {
    aug_args_t *a = ctx;
    int64_t v;
    if (!strcmp(key, "crop")) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", value ? value : "");
        char *x = strchr(buf, 'x');
        if (x)
            *x = '\0';
        TP_TRY(tp_spec_int(buf, 1, 65536, "augment: crop", &v));
        a->crop_h = a->crop_w = (int)v;
        if (x) {
            TP_TRY(tp_spec_int(x + 1, 1, 65536, "augment: crop width", &v));
            a->crop_w = (int)v;
        }
        return TP_OK;
    }
    if (!strcmp(key, "pad")) {
        TP_TRY(tp_spec_int(value, 0, 65536, "augment: pad", &v));
        a->pad = (int)v;
        return TP_OK;
    }
    if (!strcmp(key, "flip")) {
        a->flip = 0.5;
        return value ? tp_spec_double(value, "augment: flip", &a->flip)
                     : TP_OK;
    }
    if (!strcmp(key, "mean"))
        return s_floats(value, "augment: mean", a->mean, &a->nmean);
    if (!strcmp(key, "std"))
        return s_floats(value, "augment: std", a->std, &a->nstd);
    if (!strcmp(key, "component"))
        return tp_spec_int(value, 0, TP_DP_MAX_COMPONENTS - 1,
                           "augment: component", &a->component);
    return tp_error(TP_ERR_INVALID, "augment: unknown option '%s' (crop=H[xW], "
                    "pad=P, flip[=PROB], mean=M[/M..], std=S[/S..], "
                    "component=I)", key);
}

static tp_status_t s_augment_map(const char *args, void *user,
                                 tp_df_map_fn *fn, void **fn_user,
                                 tp_df_free_fn *fn_free) {
    aug_args_t a;
    memset(&a, 0, sizeof a);
    TP_TRY(tp_spec_foreach_kv(args, s_aug_kv, &a));
    if (!a.nmean) {
        a.nmean = 1;
        a.mean[0] = 0;
    }
    if (!a.nstd) {
        a.nstd = 1;
        a.std[0] = 255;  /* default: scale 0..255 to 0..1 */
    }
    if (a.nmean != a.nstd && a.nmean != 1 && a.nstd != 1)
        return tp_error(TP_ERR_INVALID, "augment: %d means but %d stds",
                        a.nmean, a.nstd);
    int nch = a.nmean > a.nstd ? a.nmean : a.nstd;
    float mean[16], std[16];
    for (int c = 0; c < nch; c++) {
        mean[c] = a.mean[a.nmean == 1 ? 0 : c];
        std[c] = a.std[a.nstd == 1 ? 0 : c];
    }
    aug_map_t *m = calloc(1, sizeof *m);
    if (!m || !(m->aug = tp_augment_new())) {
        free(m);
        return tp_error(TP_ERR_NOMEM, "augment");
    }
    m->component = (int)a.component;
    tp_status_t rc = TP_OK;
    if (a.crop_h)
        rc = tp_augment_add_crop(m->aug, a.crop_h, a.crop_w, a.pad);
    else if (a.pad)
        rc = tp_error(TP_ERR_INVALID, "augment: pad=%d needs crop=H", a.pad);
    if (rc == TP_OK && a.flip > 0)
        rc = tp_augment_add_flip(m->aug, a.flip);
    if (rc == TP_OK)
        rc = tp_augment_add_normalize(m->aug, nch, mean, std);
    if (rc != TP_OK) {
        s_aug_map_free(m);
        return rc;
    }
    *fn = s_aug_map;
    *fn_user = m;
    *fn_free = s_aug_map_free;
    return TP_OK;
}

static tp_status_t s_map_threads_stage(tp_dataflow_t *inner, const char *args,
                                       void *user, tp_dataflow_t **out) {
    /* map-threads N [strict] [buffer=B] MAP-NAME MAP-ARGS */
    char buf[1024];
    if (strlen(args) >= sizeof buf) {
        tp_dataflow_destroy(&inner);
        return tp_error(TP_ERR_INVALID, "map-threads: arguments too long");
    }
    strcpy(buf, args);
    char *p = buf;
    int64_t nthreads = 0, buffer = 0;
    int strict = 0, have_n = 0;
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        char *t = p;
        while (*p && !isspace((unsigned char)*p))
            p++;
        if (t == p) {
            tp_dataflow_destroy(&inner);
            return tp_error(TP_ERR_INVALID, "map-threads: expected N [strict] "
                            "[buffer=B] MAP ARGS (a map stage such as "
                            "augment)");
        }
        char save = *p;
        *p = '\0';
        if (!have_n) {
            STAGE_TRY(tp_spec_int(t, 1, 1024, "map-threads: threads",
                                  &nthreads));
            have_n = 1;
        } else if (!strcmp(t, "strict")) {
            strict = 1;
        } else if (!strcmp(t, "nonstrict")) {
            strict = 0;
        } else if (!strncmp(t, "buffer=", 7)) {
            STAGE_TRY(tp_spec_int(t + 7, 1, 1 << 20, "map-threads: buffer",
                                  &buffer));
        } else {
            reg_t e;
            if (!s_lookup(t, strlen(t), 0, &e) || e.kind != REG_MAP) {
                tp_dataflow_destroy(&inner);
                return tp_error(TP_ERR_INVALID, "map-threads: '%s' is not a "
                                "map stage", t);
            }
            *p = save;
            tp_df_map_fn fn;
            void *fu;
            tp_df_free_fn ff;
            STAGE_TRY(e.map(df_spec_trim(p), e.user, &fn, &fu, &ff));
            return s_done(tp_df_multithread_map(inner, (int)nthreads,
                                                (int)buffer, strict, fn, fu,
                                                ff),
                          out);
        }
        *p = save;
    }
}

/* tensorpack's LMDB files (df_tp_lmdb.c) */
tp_status_t df_tpk_lmdb_spec(const char *args, void *user, tp_dataflow_t **out);

static void s_builtins(void) {
    static const struct {
        const char *name;
        tp_spec_source_fn fn;
    } sources[] = {{"fashion-mnist", s_fmnist_src},
                   {"idx", s_idx_src},
                   {"lmdb", s_lmdb_src},
                   {"fake", s_fake_src},
                   {"tensorpack-lmdb", df_tpk_lmdb_spec},
                   {"imagefolder", df_image_folder_src},
                   {"imagelist", df_image_list_src},
                   {"cifar", df_image_cifar_src},
                   {"text", df_text_src}};
    static const struct {
        const char *name;
        tp_spec_stage_fn fn;
    } stages[] = {{"batch", s_batch_stage},     {"shuffle", s_shuffle_stage},
                  {"repeat", s_repeat_stage},   {"map-threads", s_map_threads_stage},
                  {"cache", s_cache_stage},     {"print", s_print_stage},
                  {"fixed-size", s_fixed_stage}, {"select", s_select_stage}};
    /* Called under pthread_once: fill the table directly. */
    for (size_t i = 0; i < sizeof sources / sizeof *sources; i++) {
        reg_t *e = &s_reg[s_nreg++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", sources[i].name);
        e->kind = REG_SOURCE;
        e->source = sources[i].fn;
    }
    for (size_t i = 0; i < sizeof stages / sizeof *stages; i++) {
        reg_t *e = &s_reg[s_nreg++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", stages[i].name);
        e->kind = REG_STAGE;
        e->stage = stages[i].fn;
    }
    reg_t *e = &s_reg[s_nreg++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "augment");
    e->kind = REG_MAP;
    e->map = s_augment_map;
    /* the image map stages of dataflow/image/ */
    static const struct {
        const char *name;
        tp_spec_map_fn fn;
    } maps[] = {{"decode", df_image_decode_map}, {"imgaug", df_image_imgaug_map}};
    for (size_t i = 0; i < sizeof maps / sizeof *maps; i++) {
        e = &s_reg[s_nreg++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", maps[i].name);
        e->kind = REG_MAP;
        e->map = maps[i].fn;
    }
}

/* ---- the parser ----------------------------------------------------------- */

/* Record an error that quotes the spec and marks [col, col+len). */
static tp_status_t s_spec_error(const char *spec, size_t col, size_t len,
                                const char *msg) {
    size_t n = strlen(spec);
    if (n > 400)
        n = 400;
    if (col > n)
        col = n;
    if (len < 1)
        len = 1;
    if (col + len > n + 1)
        len = n + 1 - col;
    char marks[512];
    size_t k = 0;
    for (size_t i = 0; i < col && k < sizeof marks - 2; i++)
        marks[k++] = spec[i] == '\t' ? '\t' : ' ';
    for (size_t i = 0; i < len && k < sizeof marks - 2; i++)
        marks[k++] = '^';
    marks[k] = '\0';
    return tp_error(TP_ERR_INVALID, "spec: %s (at column %zu)\n  %.*s\n  %s",
                    msg, col + 1, (int)n, spec, marks);
}

tp_status_t tp_spec_parse(const char *spec, tp_dataflow_t **out) {
    *out = NULL;
    if (!spec)
        return tp_error(TP_ERR_INVALID, "spec: NULL");
    size_t n = strlen(spec);
    if (n > 65536)
        return tp_error(TP_ERR_INVALID, "spec: %zu characters (at most 65536)",
                        n);
    tp_dataflow_t *df = NULL;
    size_t start = 0;
    int index = 0;
    char msg[1024];
    for (;;) {
        size_t end = start;
        while (end < n && spec[end] != '|')
            end++;
        /* the segment [start, end), trimmed to [s, e) */
        size_t s = start, e = end;
        while (s < e && isspace((unsigned char)spec[s]))
            s++;
        while (e > s && isspace((unsigned char)spec[e - 1]))
            e--;
        if (s == e) {
            tp_dataflow_destroy(&df);
            return s_spec_error(spec, s, 1,
                                index == 0 ? "expected a source (fashion-mnist"
                                             ":train, idx:, lmdb:, fake:...)"
                                           : "empty stage");
        }
        size_t name_end = s;
        while (name_end < e && s_name_char(spec[name_end]))
            name_end++;
        size_t name_len = name_end - s;
        reg_t reg;
        char *args = NULL;
        if (name_len == 0) {
            tp_dataflow_destroy(&df);
            snprintf(msg, sizeof msg, "unexpected '%c'", spec[s]);
            return s_spec_error(spec, s, 1, msg);
        }
        if (index == 0) {
            if (name_end < e && spec[name_end] != ':') {
                snprintf(msg, sizeof msg, "expected ':' after the source "
                         "name, found '%c'", spec[name_end]);
                return s_spec_error(spec, name_end, 1, msg);
            }
            if (!s_lookup(spec + s, name_len, 1, &reg)) {
                char known[512];
                s_known(1, known, sizeof known);
                snprintf(msg, sizeof msg, "unknown source '%.*s' (known: %s)",
                         (int)name_len, spec + s, known);
                return s_spec_error(spec, s, name_len, msg);
            }
            size_t a = name_end < e ? name_end + 1 : e;
            args = strndup(spec + a, e - a);
        } else {
            if (name_end < e && !isspace((unsigned char)spec[name_end])) {
                tp_dataflow_destroy(&df);
                snprintf(msg, sizeof msg, "unexpected '%c' after the stage "
                         "name", spec[name_end]);
                return s_spec_error(spec, name_end, 1, msg);
            }
            if (!s_lookup(spec + s, name_len, 0, &reg)) {
                tp_dataflow_destroy(&df);
                char known[512];
                s_known(0, known, sizeof known);
                snprintf(msg, sizeof msg, "unknown stage '%.*s' (known: %s)",
                         (int)name_len, spec + s, known);
                return s_spec_error(spec, s, name_len, msg);
            }
            args = strndup(spec + name_end, e - name_end);
        }
        if (!args) {
            tp_dataflow_destroy(&df);
            return tp_error(TP_ERR_NOMEM, "spec");
        }
        char *targs = df_spec_trim(args);
        tp_status_t rc;
        tp_dataflow_t *next = NULL;
        tp_clear_error();
        if (index == 0) {
            rc = reg.source(targs, reg.user, &next);
        } else if (reg.kind == REG_STAGE) {
            rc = reg.stage(df, targs, reg.user, &next);
        } else {
            tp_df_map_fn fn;
            void *fu;
            tp_df_free_fn ff;
            rc = reg.map(targs, reg.user, &fn, &fu, &ff);
            if (rc == TP_OK) {
                next = tp_df_map(df, fn, fu, ff);
                rc = next ? TP_OK : TP_ERR_INVALID;
            } else {
                tp_dataflow_destroy(&df);
            }
        }
        free(args);
        df = NULL;  /* taken by the stage, also on failure */
        if (rc != TP_OK || !next) {
            tp_dataflow_destroy(&next);
            snprintf(msg, sizeof msg, "%.*s: %s", (int)name_len, spec + s,
                     *tp_last_error() ? tp_last_error() : "failed");
            return s_spec_error(spec, s, e - s, msg);
        }
        df = next;
        index++;
        if (end >= n)
            break;
        start = end + 1;
    }
    *out = df;
    return TP_OK;
}
