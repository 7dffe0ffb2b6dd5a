/* towerpack dataflow/image: the spec strings of the image sources and
 * stages (registered among df_spec.c's built-ins):
 *
 *   imagefolder:DIR[,mode=grey|rgb|rgba|any][,shuffle=0][,raw][,skip-bad]
 *               [,min-short=N][,exif=1][,random-resized-crop=SIZE[:A:A:R:R]]
 *   imagelist:LIST[,root=DIR][, the same options]
 *   cifar:FILE[,cifar100][,fine][,shuffle=0]
 *   decode [mode=..][,min-short=N][,exif=1][,component=I]   (a map stage)
 *   imgaug AUG[,AUG...]                                       (a map stage)
 *   (an AUG random-order=A;B;.., random-choice=A;B;.., random-apply=P;A;..
 *    groups others: ';' between them, as ',' ends the item)
 *
 * imgaug's items run in the order given (docs/images.md lists them). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/image.h>
#include "dataflow/df_internal.h"
#include "dataflow/image/img_formats.h"

static int s_flag(const char *v) {
    return !v || !(!strcmp(v, "0") || !strcmp(v, "false") ||
                   !strcmp(v, "no") || !strcmp(v, "off"));
}

static tp_status_t s_mode(const char *who, const char *v, tp_image_mode_t *m) {
    if (v && !strcmp(v, "grey"))
        *m = TP_IMAGE_GREY;
    else if (v && !strcmp(v, "gray"))
        *m = TP_IMAGE_GREY;
    else if (v && !strcmp(v, "rgb"))
        *m = TP_IMAGE_RGB;
    else if (v && !strcmp(v, "rgba"))
        *m = TP_IMAGE_RGBA;
    else if (v && !strcmp(v, "any"))
        *m = TP_IMAGE_ANY;
    else
        return tp_error(TP_ERR_INVALID, "%s: mode=%s (grey, rgb, rgba or any)",
                        who, v ? v : "");
    return TP_OK;
}

/* decode options shared by the sources and `decode` */
static tp_status_t s_decode_kv(const char *who, const char *key,
                               const char *value, tp_image_opts_t *o,
                               int *handled) {
    int64_t v;
    *handled = 1;
    if (!strcmp(key, "mode"))
        return s_mode(who, value, &o->mode);
    if (!strcmp(key, "min-short")) {
        TP_TRY(tp_spec_int(value, 0, 65536, "min-short", &v));
        o->min_short = (int)v;
        return TP_OK;
    }
    if (!strcmp(key, "exif")) {
        o->exif = s_flag(value);
        return TP_OK;
    }
    if (!strcmp(key, "max-pixels")) {
        TP_TRY(tp_spec_int(value, 1, (int64_t)1 << 40, "max-pixels", &v));
        o->max_pixels = v;
        return TP_OK;
    }
    *handled = 0;
    return TP_OK;
}

static tp_status_t s_nums(const char *who, const char *v, double *out, int max,
                          int *n);

typedef struct {
    const char *who;
    char path[4096], root[4096];
    int npos, cifar100, fine;
    tp_image_source_opts_t o;
} src_args_t;

static tp_status_t s_src_kv(const char *key, const char *value, void *ctx) {
    src_args_t *a = ctx;
    if (!value && a->npos == 0) {
        if (strlen(key) >= sizeof a->path)
            return tp_error(TP_ERR_INVALID, "%s: path too long", a->who);
        strcpy(a->path, key);
        a->npos = 1;
        return TP_OK;
    }
    int handled;
    TP_TRY(s_decode_kv(a->who, key, value, &a->o.decode, &handled));
    if (handled)
        return TP_OK;
    if (!strcmp(key, "shuffle")) {
        a->o.shuffle = s_flag(value);
        return TP_OK;
    }
    if (!strcmp(key, "raw")) {
        a->o.raw = s_flag(value);
        return TP_OK;
    }
    if (!strcmp(key, "skip-bad")) {
        a->o.skip_bad = s_flag(value);
        return TP_OK;
    }
    if (!strcmp(key, "random-resized-crop") && strcmp(a->who, "cifar")) {
        /* imgaug random-resized-crop's, drawn before the decode */
        double n[5];
        int k;
        TP_TRY(s_nums("random-resized-crop", value, n, 5, &k));
        if ((k != 1 && k != 5) || !(n[0] >= 1 && n[0] <= 65535) ||
            (k == 5 && !(n[1] > 0 && n[1] <= n[2] && n[2] <= 1 && n[3] > 0 &&
                         n[3] <= n[4] && n[4] < 100)))
            return tp_error(TP_ERR_INVALID, "%s: random-resized-crop=SIZE[:AREA_LO:"
                            "AREA_HI:RATIO_LO:RATIO_HI] (SIZE 1..65535, areas in (0,1], "
                            "ratios > 0)", a->who);
        a->o.crop_size = (int)n[0];
        if (k == 5) {
            a->o.crop_area[0] = n[1];
            a->o.crop_area[1] = n[2];
            a->o.crop_ratio[0] = n[3];
            a->o.crop_ratio[1] = n[4];
        }
        return TP_OK;
    }
    if (!strcmp(key, "root") && value && strlen(value) < sizeof a->root) {
        strcpy(a->root, value);
        return TP_OK;
    }
    if (!strcmp(key, "cifar100")) {
        a->cifar100 = s_flag(value);
        return TP_OK;
    }
    if (!strcmp(key, "fine")) {
        a->fine = s_flag(value);
        return TP_OK;
    }
    return tp_error(TP_ERR_INVALID, "%s: unknown option '%s' (mode=, "
                    "min-short=, exif=, max-pixels=, shuffle=, raw, skip-bad, "
                    "random-resized-crop=%s)",
                    a->who, key, !strcmp(a->who, "imagelist") ? ", root=" : "");
}

static tp_status_t s_src_args(const char *who, const char *args,
                              src_args_t *a) {
    memset(a, 0, sizeof *a);
    a->who = who;
    tp_image_source_opts_init(&a->o);
    TP_TRY(tp_spec_foreach_kv(args, s_src_kv, a));
    if (!a->npos)
        return tp_error(TP_ERR_INVALID, "%s: give a path (%s:PATH[,options])",
                        who, who);
    if (a->o.raw && a->o.crop_size)
        return tp_error(TP_ERR_INVALID, "%s: raw yields the files undecoded: no "
                        "random-resized-crop with it", who);
    return TP_OK;
}

tp_status_t df_image_folder_src(const char *args, void *user,
                                tp_dataflow_t **out) {
    (void)user;
    src_args_t a;
    TP_TRY(s_src_args("imagefolder", args, &a));
    *out = tp_df_image_folder(a.path, &a.o);
    return *out ? TP_OK : TP_ERR_INVALID;
}

tp_status_t df_image_list_src(const char *args, void *user,
                              tp_dataflow_t **out) {
    (void)user;
    src_args_t a;
    TP_TRY(s_src_args("imagelist", args, &a));
    *out = tp_df_image_list(a.path, a.root[0] ? a.root : NULL, &a.o);
    return *out ? TP_OK : TP_ERR_INVALID;
}

tp_status_t df_image_cifar_src(const char *args, void *user,
                               tp_dataflow_t **out) {
    (void)user;
    src_args_t a;
    TP_TRY(s_src_args("cifar", args, &a));
    *out = tp_df_cifar(a.path, a.cifar100, a.fine, a.o.shuffle);
    return *out ? TP_OK : TP_ERR_INVALID;
}

/* ---- what a source holds ----------------------------------------------------- */

void tp_image_source_info_init(tp_image_source_info_t *info) {
    memset(info, 0, sizeof *info);
}

void tp_image_source_info_fini(tp_image_source_info_t *info) {
    for (int i = 0; info->classes && i < info->nclasses; i++)
        free(info->classes[i]);
    free(info->classes);
    memset(info, 0, sizeof *info);
}

/* names "0".."n-1" */
static tp_status_t s_numbered(tp_image_source_info_t *info, int n) {
    if (!(info->classes = calloc((size_t)n, sizeof *info->classes)))
        return tp_error(TP_ERR_NOMEM, "image source classes");
    info->nclasses = n;
    for (int i = 0; i < n; i++) {
        char b[16];
        snprintf(b, sizeof b, "%d", i);
        if (!(info->classes[i] = strdup(b)))
            return tp_error(TP_ERR_NOMEM, "image source classes");
    }
    return TP_OK;
}

/* The channels of the image at `path` as the sources decode it (mode any:
 * grey stays 1, colour and RGBA are 3). */
static tp_status_t s_peek_channels(const char *path, int *channels) {
    tp_image_opts_t o;
    tp_image_opts_init(&o);
    o.min_short = 1;  /* the smallest JPEG scale: only its channels matter */
    tp_tensor_t t;
    TP_TRY(tp_image_read(path, &o, &t));
    *channels = t.ndim == 2 ? 1 : 3;
    tp_tensor_fini(&t);
    return TP_OK;
}

/* A list file: the largest label and the first image's path. */
static tp_status_t s_list_scan(const char *list, const char *root, int *maxlab,
                               char *first, size_t size) {
    /* a regular file: a FIFO is refused by name, not waited on */
    FILE *f;
    int64_t size_bytes;
    TP_TRY(df_open_regular("imagelist", list, &f, &size_bytes));
    char line[8192];
    long lineno = 0, max = -1;
    first[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s;
        long v;
        int got = df_image_list_line(line, 999999, &s, &v);
        if (got == 0)
            continue;
        if (got < 0) {
            fclose(f);
            return tp_error(TP_ERR_FORMAT, "imagelist %s:%ld: expected 'PATH LABEL' "
                            "(a label 0..999999), got '%s'", list, lineno, s);
        }
        if (v > max)
            max = v;
        if (!first[0]) {
            int k = df_image_list_path(first, size, list, root, s);
            if (k < 0 || (size_t)k >= size)
                first[0] = '\0';  /* too long: the list source says so */
        }
    }
    fclose(f);
    if (max < 0)
        return tp_error(TP_ERR_FORMAT, "imagelist %s: no 'PATH LABEL' lines", list);
    *maxlab = (int)max;
    return TP_OK;
}

/* CIFAR's names files (batches.meta.txt, fine_label_names.txt,
 * coarse_label_names.txt: one name a line) beside `path`, when there; one
 * there that is not a regular file is refused by name (a FIFO would block
 * the read). */
static tp_status_t s_cifar_names(const char *path, const char *file,
                                 tp_image_source_info_t *info) {
    char p[8192];
    const char *slash = strrchr(path, '/');
    snprintf(p, sizeof p, "%.*s/%s", slash ? (int)(slash - path) : 1, slash ? path : ".", file);
    struct stat st;
    if (stat(p, &st) != 0)
        return TP_OK;  /* not there: the numbered or CIFAR-10's own names stay */
    FILE *f;
    int64_t size;
    TP_TRY(df_open_regular("cifar class names", p, &f, &size));
    char line[256];
    int i = 0;
    while (i < info->nclasses && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0])
            continue;
        char *d = strdup(line);
        if (d) {
            free(info->classes[i]);
            info->classes[i] = d;
        }
        i++;
    }
    fclose(f);
    return TP_OK;
}

/* The first (in directory order) image file (img_is_image_name) right in `dir`,
 * not hidden, into out: 1 if one was found. */
static int s_first_file_image(const char *dir, char *out, size_t size) {
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !img_is_image_name(e->d_name))
            continue;
        struct stat st;
        if ((size_t)snprintf(out, size, "%s/%s", dir, e->d_name) < size &&
            stat(out, &st) == 0 && S_ISREG(st.st_mode))
            found = 1;
    }
    closedir(d);
    return found;
}

tp_status_t tp_image_source_info(const char *source, tp_image_source_info_t *info) {
    tp_image_source_info_fini(info);
    if (!source)
        return tp_error(TP_ERR_INVALID, "image source info: no source");
    const char *colon = strchr(source, ':');
    size_t kl = colon ? (size_t)(colon - source) : 0;
    src_args_t a;
    char first[4096];
    tp_status_t rc;
    if (kl == 11 && !strncmp(source, "imagefolder", kl)) {
        TP_TRY(s_src_args("imagefolder", colon + 1, &a));
        int n;
        TP_TRY(tp_image_folder_classes(a.path, &info->classes, &n, first, sizeof first));
        info->nclasses = n;
        if (!first[0])
            return tp_error(TP_ERR_NOT_FOUND, "imagefolder %s: no images ("
                            IMG_EXTENSIONS_TEXT ") in its class folders", a.path);
        TP_TRY(s_peek_channels(first, &info->channels));
        /* A grey first image may be a grey JPEG in a colour folder: colour
         * if any class's first image is colour (torchvision makes them all
         * RGB; a grey model would lose the colour of the rest) */
        for (int i = 1; info->channels == 1 && i < n && i < 256; i++) {
            char cls[4096];
            if ((size_t)snprintf(cls, sizeof cls, "%s/%s", a.path, info->classes[i]) <
                    sizeof cls && s_first_file_image(cls, first, sizeof first))
                TP_TRY(s_peek_channels(first, &info->channels));
        }
        return TP_OK;
    }
    if (kl == 9 && !strncmp(source, "imagelist", kl)) {
        TP_TRY(s_src_args("imagelist", colon + 1, &a));
        int max = 0;
        TP_TRY(s_list_scan(a.path, a.root[0] ? a.root : NULL, &max, first, sizeof first));
        if ((rc = s_numbered(info, max + 1)) != TP_OK)
            return rc;
        return s_peek_channels(first, &info->channels);
    }
    if (kl == 5 && !strncmp(source, "cifar", kl)) {
        TP_TRY(s_src_args("cifar", colon + 1, &a));
        static const char *const c10[10] = {"airplane", "automobile", "bird", "cat",
                                            "deer", "dog", "frog", "horse", "ship",
                                            "truck"};
        info->channels = 3;
        if ((rc = s_numbered(info, a.cifar100 ? (a.fine ? 100 : 20) : 10)) != TP_OK)
            return rc;
        if (!a.cifar100) {
            for (int i = 0; i < 10; i++) {
                char *d = strdup(c10[i]);
                if (d) {
                    free(info->classes[i]);
                    info->classes[i] = d;
                }
            }
            return s_cifar_names(a.path, "batches.meta.txt", info);
        }
        return s_cifar_names(a.path, a.fine ? "fine_label_names.txt" : "coarse_label_names.txt",
                             info);
    }
    return tp_error(TP_ERR_UNSUPPORTED, "'%s' is not an image source (imagefolder:, "
                    "imagelist:, cifar:)", source);
}

/* ---- decode ------------------------------------------------------------------ */

static tp_status_t s_dec_kv(const char *key, const char *value, void *ctx) {
    tp_image_decoder_t *d = ctx;
    int handled;
    TP_TRY(s_decode_kv("decode", key, value, &d->opts, &handled));
    if (handled)
        return TP_OK;
    if (!strcmp(key, "component")) {
        int64_t v;
        TP_TRY(tp_spec_int(value, 0, TP_DP_MAX_COMPONENTS - 1,
                           "decode: component", &v));
        d->component = (int)v;
        return TP_OK;
    }
    return tp_error(TP_ERR_INVALID, "decode: unknown option '%s' (mode=, "
                    "min-short=, exif=, max-pixels=, component=)", key);
}

tp_status_t df_image_decode_map(const char *args, void *user,
                                tp_df_map_fn *fn, void **fn_user,
                                tp_df_free_fn *fn_free) {
    (void)user;
    tp_image_decoder_t *d = calloc(1, sizeof *d);
    if (!d)
        return tp_error(TP_ERR_NOMEM, "decode");
    tp_image_opts_init(&d->opts);
    tp_status_t rc = tp_spec_foreach_kv(args, s_dec_kv, d);
    if (rc != TP_OK) {
        free(d);
        return rc;
    }
    *fn = tp_image_decode_map;
    *fn_user = d;
    *fn_free = free;
    return TP_OK;
}

/* ---- imgaug ------------------------------------------------------------------ */

typedef struct {
    tp_augment_t *aug;
    int component;
    tp_interp_t interp;
    float mean[16];
    int nmean;
} imgaug_t;

static void s_imgaug_free(void *user) {
    imgaug_t *m = user;
    if (m)
        tp_augment_destroy(&m->aug);
    free(m);
}

static tp_status_t s_imgaug_map(tp_datapoint_t **dp, tp_rng_t *rng,
                                void *user) {
    imgaug_t *m = user;
    if (m->component >= tp_datapoint_size(*dp))
        return tp_error(TP_ERR_SHAPE, "imgaug: component %d of a datapoint "
                        "of %d", m->component, tp_datapoint_size(*dp));
    return tp_augment_apply(m->aug, tp_datapoint_get(*dp, m->component), rng);
}

/* "A" or "AxB" (sizes), "A:B[:C:D]" (numbers) */
static tp_status_t s_size2(const char *who, const char *v, int *h, int *w) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v ? v : "");
    char *x = strchr(buf, 'x');
    if (x)
        *x = '\0';
    int64_t a, b;
    TP_TRY(tp_spec_int(buf, 1, 65536, who, &a));
    b = a;
    if (x)
        TP_TRY(tp_spec_int(x + 1, 1, 65536, who, &b));
    *h = (int)a;
    *w = (int)b;
    return TP_OK;
}

static tp_status_t s_nums(const char *who, const char *v, double *out, int max,
                          int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v ? v : "");
    *n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ":/", &save); t; t = strtok_r(NULL, ":/", &save)) {
        if (*n == max)
            return tp_error(TP_ERR_INVALID, "%s: at most %d numbers", who, max);
        TP_TRY(tp_spec_double(t, who, &out[(*n)++]));
    }
    if (*n == 0)
        return tp_error(TP_ERR_INVALID, "%s: give a value (%s=...)", who, who);
    return TP_OK;
}

/* ImageNet's RGB PCA (as tensorpack's and fb.resnet.torch's examples), on
 * the 0..255 scale */
static const float s_eigval[3] = {0.2175f * 255, 0.0188f * 255, 0.0045f * 255};
static const float s_eigvec[9] = {-0.5675f, 0.7192f, 0.4009f,
                                  -0.5808f, -0.0045f, -0.8140f,
                                  -0.5836f, -0.6948f, 0.4203f};

static tp_status_t s_imgaug_kv(const char *key, const char *value, void *ctx);

/* random-order=A;B;..., random-choice=A;B;..., random-apply=P;A;B;...:
 * the items (imgaug's own, ';' between them since ',' ends the whole item)
 * become sub-chains: one each for order and choice, one for apply. */
static tp_status_t s_meta_kv(imgaug_t *m, const char *key, const char *value) {
    char buf[1024];
    if (!value || strlen(value) >= sizeof buf)
        return tp_error(TP_ERR_INVALID, "imgaug: %s=ITEM;ITEM;... (at most "
                        "%zu characters)", key, sizeof buf - 1);
    strcpy(buf, value);
    int apply = !strcmp(key, "random-apply");
    double prob = 0.5;
    tp_augment_t *subs[64] = {NULL};
    int n = 0;
    tp_status_t rc = TP_OK;
    char *save = NULL;
    int first = 1;
    for (char *it = strtok_r(buf, ";", &save); it && rc == TP_OK;
         it = strtok_r(NULL, ";", &save), first = 0) {
        while (*it == ' ')
            it++;
        if (apply && first) {
            rc = tp_spec_double(it, "imgaug: random-apply probability", &prob);
            continue;
        }
        if (n == 64) {
            rc = tp_error(TP_ERR_INVALID, "imgaug: %s: too many items", key);
            break;
        }
        imgaug_t sub = {.interp = m->interp};
        if (apply && n == 1) {
            sub.aug = subs[0];  /* apply: every item into one chain */
        } else if (!(sub.aug = tp_augment_new())) {
            rc = tp_error(TP_ERR_NOMEM, "imgaug");
            break;
        }
        char *eq = strchr(it, '=');
        if (eq)
            *eq = '\0';
        rc = s_imgaug_kv(it, eq ? eq + 1 : NULL, &sub);
        if (!(apply && n == 1))
            subs[n++] = sub.aug;
    }
    if (rc == TP_OK && n == 0)
        rc = tp_error(TP_ERR_INVALID, "imgaug: %s has no items", key);
    if (rc != TP_OK) {
        for (int i = 0; i < n; i++)
            tp_augment_destroy(&subs[i]);
        return rc;
    }
    if (apply)
        return tp_augment_add_random_apply(m->aug, &subs[0], prob);
    if (!strcmp(key, "random-order"))
        return tp_augment_add_random_order(m->aug, subs, n);
    return tp_augment_add_random_choice(m->aug, subs, n);
}

static tp_status_t s_imgaug_kv(const char *key, const char *value, void *ctx) {
    imgaug_t *m = ctx;
    if (!strcmp(key, "random-order") || !strcmp(key, "random-choice") ||
        !strcmp(key, "random-apply"))
        return s_meta_kv(m, key, value);
    double n[16];
    int k = 0, h, w;
    if (!strcmp(key, "component")) {
        int64_t v;
        TP_TRY(tp_spec_int(value, 0, TP_DP_MAX_COMPONENTS - 1,
                           "imgaug: component", &v));
        m->component = (int)v;
        return TP_OK;
    }
    if (!strcmp(key, "interp")) {
        if (value && !strcmp(value, "nearest"))
            m->interp = TP_INTERP_NEAREST;
        else if (value && !strcmp(value, "linear"))
            m->interp = TP_INTERP_LINEAR;
        else
            return tp_error(TP_ERR_INVALID, "imgaug: interp=%s (nearest or "
                            "linear)", value ? value : "");
        return TP_OK;
    }
    if (!strcmp(key, "resize")) {
        TP_TRY(s_size2("imgaug: resize", value, &h, &w));
        return tp_augment_add_resize(m->aug, h, w, m->interp);
    }
    if (!strcmp(key, "resize-short")) {
        TP_TRY(s_size2("imgaug: resize-short", value, &h, &w));
        return tp_augment_add_resize_short(m->aug, h, m->interp);
    }
    if (!strcmp(key, "random-resize-short")) {
        TP_TRY(s_nums("random-resize-short", value, n, 2, &k));
        if (k != 2)
            return tp_error(TP_ERR_INVALID, "imgaug: random-resize-short=LO:HI");
        return tp_augment_add_random_resize_short(m->aug, (int)n[0], (int)n[1],
                                                  m->interp);
    }
    if (!strcmp(key, "center-crop")) {
        TP_TRY(s_size2("imgaug: center-crop", value, &h, &w));
        return tp_augment_add_center_crop(m->aug, h, w);
    }
    if (!strcmp(key, "random-crop")) {
        /* HxW[:PAD]: PAD zeros around the image first (tp-train's crop and
         * cifar presets, on uint8; `augment crop=,pad=` normalises too) */
        char sz[64];
        snprintf(sz, sizeof sz, "%s", value ? value : "");
        char *colon = strchr(sz, ':');
        int64_t pad = 0;
        if (colon) {
            *colon = '\0';
            TP_TRY(tp_spec_int(colon + 1, 0, 65536, "imgaug: random-crop padding", &pad));
        }
        TP_TRY(s_size2("imgaug: random-crop", sz, &h, &w));
        return tp_augment_add_crop(m->aug, h, w, (int)pad);
    }
    if (!strcmp(key, "random-resized-crop")) {
        TP_TRY(s_nums("random-resized-crop", value, n, 5, &k));
        if (k != 1 && k != 5)
            return tp_error(TP_ERR_INVALID, "imgaug: random-resized-crop=SIZE"
                            "[:AREA_LO:AREA_HI:RATIO_LO:RATIO_HI]");
        return tp_augment_add_random_resized_crop(
            m->aug, (int)n[0], k == 5 ? n[1] : 0.08, k == 5 ? n[2] : 1.0,
            k == 5 ? n[3] : 0.75, k == 5 ? n[4] : 1.333, m->interp);
    }
    if (!strcmp(key, "flip") || !strcmp(key, "vflip")) {
        double p = 0.5;
        if (value)
            TP_TRY(tp_spec_double(value, key, &p));
        return key[0] == 'f' ? tp_augment_add_flip(m->aug, p)
                             : tp_augment_add_vflip(m->aug, p);
    }
    if (!strcmp(key, "brightness")) {
        TP_TRY(s_nums("brightness", value, n, 1, &k));
        return tp_augment_add_brightness(m->aug, n[0]);
    }
    if (!strcmp(key, "brightness-scale")) {
        TP_TRY(s_nums("brightness-scale", value, n, 2, &k));
        if (k != 2)
            return tp_error(TP_ERR_INVALID, "imgaug: brightness-scale=LO:HI");
        return tp_augment_add_brightness_scale(m->aug, n[0], n[1]);
    }
    if (!strcmp(key, "contrast")) {
        TP_TRY(s_nums("contrast", value, n, 2, &k));
        if (k != 2)
            return tp_error(TP_ERR_INVALID, "imgaug: contrast=LO:HI");
        return tp_augment_add_contrast(m->aug, n[0], n[1]);
    }
    if (!strcmp(key, "hue")) {
        TP_TRY(s_nums("hue", value, n, 2, &k));
        if (k != 2)
            return tp_error(TP_ERR_INVALID, "imgaug: hue=LO:HI");
        return tp_augment_add_hue(m->aug, n[0], n[1]);
    }
    if (!strcmp(key, "saturation")) {
        TP_TRY(s_nums("saturation", value, n, 1, &k));
        return tp_augment_add_saturation(m->aug, n[0]);
    }
    if (!strcmp(key, "lighting")) {
        TP_TRY(s_nums("lighting", value, n, 1, &k));
        return tp_augment_add_lighting(m->aug, n[0], s_eigval, s_eigvec);
    }
    if (!strcmp(key, "grey")) {
        double p = 1;
        if (value)
            TP_TRY(tp_spec_double(value, "grey", &p));
        return tp_augment_add_grey(m->aug, p);
    }
    if (!strcmp(key, "noise")) {
        TP_TRY(s_nums("noise", value, n, 1, &k));
        return tp_augment_add_gaussian_noise(m->aug, n[0]);
    }
    if (!strcmp(key, "clip") || !strcmp(key, "min-max") ||
        !strcmp(key, "min-max-channels")) {
        TP_TRY(s_nums(key, value, n, 2, &k));
        if (k != 2)
            return tp_error(TP_ERR_INVALID, "imgaug: %s=LO:HI", key);
        if (!(n[0] >= -1 && n[0] <= 256 && n[1] >= -1 && n[1] <= 256))
            return tp_error(TP_ERR_INVALID, "imgaug %s: %g:%g (0..255)", key,
                            n[0], n[1]);
        if (key[0] == 'c')
            return tp_augment_add_clip(m->aug, (int)n[0], (int)n[1]);
        return key[7] ? tp_augment_add_min_max_channels(m->aug, (int)n[0], (int)n[1])
                      : tp_augment_add_min_max(m->aug, (int)n[0], (int)n[1]);
    }
    if (!strcmp(key, "salt-pepper")) {
        TP_TRY(s_nums("salt-pepper", value, n, 2, &k));
        return tp_augment_add_salt_pepper(m->aug, n[0], k == 2 ? n[1] : n[0]);
    }
    if (!strcmp(key, "jpeg-noise")) {
        TP_TRY(s_nums("jpeg-noise", value, n, 2, &k));
        if (k != 2)
            return tp_error(TP_ERR_INVALID, "imgaug: jpeg-noise=QLO:QHI");
        return tp_augment_add_jpeg_noise(m->aug, (int)n[0], (int)n[1]);
    }
    if (!strcmp(key, "rotation")) {
        TP_TRY(s_nums("rotation", value, n, 3, &k));
        return tp_augment_add_rotation(m->aug, n[0], k == 3 ? n[1] : 0,
                                       k == 3 ? n[2] : 1);
    }
    if (!strcmp(key, "gaussian-blur")) {
        TP_TRY(s_nums("gaussian-blur", value, n, 4, &k));
        if (k != 2 && k != 4)
            return tp_error(TP_ERR_INVALID, "imgaug: gaussian-blur=KLO:KHI"
                            "[:SIGMA_LO:SIGMA_HI]");
        return tp_augment_add_gaussian_blur(m->aug, (int)n[0], (int)n[1],
                                            k == 4 ? n[2] : 0, k == 4 ? n[3] : 0);
    }
    if (!strcmp(key, "motion-blur")) {
        TP_TRY(s_nums("motion-blur", value, n, 4, &k));
        if (k != 2 && k != 4)
            return tp_error(TP_ERR_INVALID, "imgaug: motion-blur=KLO:KHI"
                            "[:DEG_LO:DEG_HI]");
        if (!(n[0] >= 1 && n[0] <= 31 && n[1] >= 1 && n[1] <= 31))
            return tp_error(TP_ERR_INVALID, "imgaug motion-blur: sizes %g:%g "
                            "(odd, 1..31)", n[0], n[1]);
        return tp_augment_add_motion_blur(m->aug, (int)n[0], (int)n[1],
                                          k == 4 ? n[2] : 0, k == 4 ? n[3] : 360);
    }
    if (!strcmp(key, "shift")) {  /* Affine(translate_frac=(FX, FY)) */
        TP_TRY(s_nums("shift", value, n, 2, &k));
        double f[2] = {n[0], k == 2 ? n[1] : n[0]};
        return tp_augment_add_affine(m->aug, NULL, f, 0, 0);
    }
    if (!strcmp(key, "affine")) {  /* SLO:SHI:FX:FY:DEG:SHEAR */
        TP_TRY(s_nums("affine", value, n, 6, &k));
        if (k != 6)
            return tp_error(TP_ERR_INVALID, "imgaug: affine=SCALE_LO:SCALE_HI:"
                            "FRAC_X:FRAC_Y:MAX_DEG:SHEAR");
        double sc[2] = {n[0], n[1]}, f[2] = {n[2], n[3]};
        return tp_augment_add_affine(m->aug, sc, f, n[4], n[5]);
    }
    if (!strcmp(key, "chw"))
        return tp_augment_add_to_chw(m->aug);
    if (!strcmp(key, "mean-var"))
        return tp_augment_add_mean_var(m->aug);
    if (!strcmp(key, "mean-var-channels"))
        return tp_augment_add_mean_var_channels(m->aug);
    if (!strcmp(key, "mean")) {
        TP_TRY(s_nums("mean", value, n, 16, &k));
        for (int i = 0; i < k; i++)
            m->mean[i] = (float)n[i];
        m->nmean = k;
        return TP_OK;
    }
    if (!strcmp(key, "std")) {
        TP_TRY(s_nums("std", value, n, 16, &k));
        int nm = m->nmean ? m->nmean : 1;
        if (nm != k && nm != 1 && k != 1)
            return tp_error(TP_ERR_INVALID, "imgaug: %d means but %d stds", nm,
                            k);
        int nch = nm > k ? nm : k;
        float mean[16], std[16];
        for (int c = 0; c < nch; c++) {
            mean[c] = m->nmean ? m->mean[nm == 1 ? 0 : c] : 0;
            std[c] = (float)n[k == 1 ? 0 : c];
        }
        return tp_augment_add_normalize(m->aug, nch, mean, std);
    }
    return tp_error(TP_ERR_INVALID, "imgaug: unknown augmentor '%s' (resize, "
                    "resize-short, random-resize-short, center-crop, "
                    "random-crop, random-resized-crop, flip, vflip, "
                    "brightness, brightness-scale, contrast, saturation, hue, lighting, grey, "
                    "noise, "
                    "clip, min-max, salt-pepper, jpeg-noise, rotation, shift, affine, "
                    "random-order=A;B, random-choice=A;B, random-apply=P;A;B, "
                    "gaussian-blur, motion-blur, "
                    "mean-var, mean-var-channels, min-max-channels, "
                    "mean= then std=, chw, interp=, component=)", key);
}

tp_status_t df_image_imgaug_map(const char *args, void *user,
                                tp_df_map_fn *fn, void **fn_user,
                                tp_df_free_fn *fn_free) {
    (void)user;
    imgaug_t *m = calloc(1, sizeof *m);
    if (!m || !(m->aug = tp_augment_new())) {
        free(m);
        return tp_error(TP_ERR_NOMEM, "imgaug");
    }
    m->interp = TP_INTERP_LINEAR;
    tp_status_t rc = tp_spec_foreach_kv(args, s_imgaug_kv, m);
    if (rc != TP_OK) {
        s_imgaug_free(m);
        return rc;
    }
    *fn = s_imgaug_map;
    *fn_user = m;
    *fn_free = s_imgaug_free;
    return TP_OK;
}
