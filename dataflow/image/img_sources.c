/* towerpack dataflow/image: sources of images on disk: an image folder
 * (torchvision's ImageFolder layout), a list file (tensorpack's
 * ILSVRC12Files), the CIFAR binary format, and the map that decodes
 * encoded bytes (records written from a `raw` source).
 *
 * Folder and list share one implementation: a table of (path, label) made
 * at construction, read and decoded one file per datapoint. Decoding is the
 * expensive part, so these sources are meant to run under `processes N` or
 * `map-threads`; with `raw` they yield the bytes and leave the decoding to
 * whoever comes next (`decode` in workers). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/image.h>
#include "dataflow/df_internal.h"
#include "dataflow/image/img_formats.h"

void tp_image_source_opts_init(tp_image_source_opts_t *opts) {
    memset(opts, 0, sizeof *opts);
    tp_image_opts_init(&opts->decode);
    opts->shuffle = 1;
    opts->crop_area[0] = 0.08;
    opts->crop_area[1] = 1.0;
    opts->crop_ratio[0] = 0.75;
    opts->crop_ratio[1] = 1.333;
}

typedef struct {
    const char *name;          /* "imagefolder" or "imagelist" */
    char **paths;              /* [n] */
    int32_t *labels;           /* [n] */
    size_t n, cap;
    uint32_t *order;           /* [n] */
    size_t pos;
    tp_image_source_opts_t o;
    tp_rng_t rng;
    tp_rng_t crop_rng;         /* the random resized crops (crop_size) */
    int64_t skipped;           /* distinct files found bad */
    uint8_t *bad;              /* [n] or NULL: 1 = found bad, not read again */
    tp_ratelog_t rl;
} files_t;

/* Bad files found by every image source of this process: what a forked
 * worker reports to its parent (TP_CTL_STATS). */
static _Atomic int64_t s_process_skipped;
static atomic_int s_process_sources;  /* 1 once an image source was reset */

int64_t tp_image_skipped_in_process(void) {
    if (!atomic_load_explicit(&s_process_sources, memory_order_relaxed))
        return -1;
    return atomic_load_explicit(&s_process_skipped, memory_order_relaxed);
}

static void s_files_free(files_t *self) {
    for (size_t i = 0; i < self->n; i++)
        free(self->paths[i]);
    free(self->paths);
    free(self->labels);
    free(self->order);
    free(self->bad);
    free(self);
}

static tp_status_t s_files_add(files_t *self, const char *path, int32_t label) {
    if (self->n == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 256;
        char **p = realloc(self->paths, cap * sizeof *p);
        if (!p)
            return tp_error(TP_ERR_NOMEM, "%s", self->name);
        self->paths = p;
        int32_t *l = realloc(self->labels, cap * sizeof *l);
        if (!l)
            return tp_error(TP_ERR_NOMEM, "%s", self->name);
        self->labels = l;
        self->cap = cap;
    }
    char *c = strdup(path);
    if (!c)
        return tp_error(TP_ERR_NOMEM, "%s", self->name);
    self->paths[self->n] = c;
    self->labels[self->n++] = label;
    return TP_OK;
}

static tp_status_t s_files_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                 uint64_t stream) {
    (void)rng;
    files_t *self = impl;
    atomic_store_explicit(&s_process_sources, 1, memory_order_relaxed);
    tp_df_rng_derive(&self->rng, seed, stream, self->name);
    tp_df_rng_derive(&self->crop_rng, seed, stream, "random-resized-crop");
    return TP_OK;
}

static tp_status_t s_read_raw(const char *what, const char *path, tp_tensor_t *out);

/* tp_image_pick_fn of the random resized crop: drawn on the decoded size */
typedef struct {
    files_t *self;
    int drawn;
} crop_pick_t;

static void s_crop_pick(void *user, int height, int width, int rect[4]) {
    crop_pick_t *c = user;
    const tp_image_source_opts_t *o = &c->self->o;
    c->drawn = df_rrc_draw(&c->self->crop_rng, height, width, o->crop_area[0],
                           o->crop_area[1], o->crop_ratio[0], o->crop_ratio[1], rect);
}

/* The image at path, decoded (only the crop's band with crop_size). */
static tp_status_t s_files_image(files_t *self, const char *path, tp_tensor_t *img) {
    if (self->o.raw)
        return s_read_raw("image", path, img);
    if (self->o.crop_size <= 0)
        return tp_image_read(path, &self->o.decode, img);
    crop_pick_t c = {self, 0};
    TP_TRY(tp_image_read_region(path, &self->o.decode, s_crop_pick, &c, img));
    tp_status_t rc = df_rrc_finish(img, c.drawn, self->o.crop_size, TP_INTERP_LINEAR);
    if (rc != TP_OK)
        tp_tensor_fini(img);
    return rc;
}

static tp_status_t s_files_begin(void *impl) {
    files_t *self = impl;
    df_iota_shuffle(self->order, self->n, self->o.shuffle ? &self->rng : NULL);
    self->pos = 0;
    return TP_OK;
}

/* The whole file as a uint8 [N] tensor (the `raw` datapoints); messages
 * start with `what` ("image", "cifar"). */
static tp_status_t s_read_raw(const char *what, const char *path,
                              tp_tensor_t *out) {
    tp_tensor_init_empty(out);
    FILE *f;
    int64_t size;
    TP_TRY(df_open_regular(what, path, &f, &size));
    int64_t shape[1] = {size};
    tp_status_t rc = tp_tensor_init(out, TP_UINT8, 1, shape);
    if (rc == TP_OK && size > 0 && fread(out->data, 1, (size_t)size, f) != (size_t)size) {
        tp_tensor_fini(out);
        rc = tp_error(TP_ERR_IO, "%s %s: short read", what, path);
    }
    fclose(f);
    if (rc == TP_OK && size == 0) {
        tp_tensor_fini(out);
        rc = tp_error(TP_ERR_FORMAT, "%s %s: empty file (0 bytes)", what,
                      path);
    }
    return rc;
}

static tp_status_t s_files_next(void *impl, tp_datapoint_t **out) {
    files_t *self = impl;
    for (;;) {
        if (self->pos >= self->n)
            return TP_DONE;
        size_t k = self->order[self->pos++];
        if (self->bad && self->bad[k])
            continue;  /* found bad in an earlier pass: not read again */
        tp_tensor_t img;
        tp_status_t rc = s_files_image(self, self->paths[k], &img);
        if (rc == TP_ERR_NOMEM)
            return rc;
        if (rc != TP_OK) {
            /* the way past a bad file, named where the user meets it */
            if (!self->o.skip_bad)
                return tp_error(rc, "%s (the source option skip-bad skips and counts "
                                "such files: %s:%s,skip-bad; docs/images.md)",
                                tp_last_error(), self->name,
                                strcmp(self->name, "imagelist") ? "DIR" : "LIST");
            if (!self->bad && !(self->bad = calloc(self->n, 1)))
                return tp_error(TP_ERR_NOMEM, "%s", self->name);
            self->bad[k] = 1;
            self->skipped++;
            atomic_fetch_add_explicit(&s_process_skipped, 1, memory_order_relaxed);
            if (tp_ratelog_ok(&self->rl)) {
                TP_WARN("%s: skipped (%lld so far): %s", self->name,
                        (long long)self->skipped, tp_last_error());
                self->rl.suppressed = 0;
            }
            continue;
        }
        tp_datapoint_t *dp = tp_datapoint_new(0);
        tp_tensor_t lab;
        if (!dp || tp_tensor_init(&lab, TP_INT32, 0, NULL) != TP_OK) {
            tp_datapoint_destroy(&dp);
            tp_tensor_fini(&img);
            return tp_error(TP_ERR_NOMEM, "%s: datapoint", self->name);
        }
        *(int32_t *)lab.data = self->labels[k];
        if (tp_datapoint_append(dp, &img) != TP_OK ||
            tp_datapoint_append(dp, &lab) != TP_OK) {
            tp_tensor_fini(&img);
            tp_tensor_fini(&lab);
            tp_datapoint_destroy(&dp);
            return tp_error(TP_ERR_NOMEM, "%s: datapoint", self->name);
        }
        *out = dp;
        return TP_OK;
    }
}

static int64_t s_files_size(void *impl) { return (int64_t)((files_t *)impl)->n; }

static void s_files_destroy(void *impl) { s_files_free(impl); }

static const tp_dataflow_ops_t s_folder_ops = {
    .name = "imagefolder", .reset_state = s_files_reset,
    .begin = s_files_begin, .next = s_files_next, .size = s_files_size,
    .destroy = s_files_destroy};
static const tp_dataflow_ops_t s_list_ops = {
    .name = "imagelist", .reset_state = s_files_reset,
    .begin = s_files_begin, .next = s_files_next, .size = s_files_size,
    .destroy = s_files_destroy};

int64_t tp_df_image_skipped(tp_dataflow_t *df) {
    if (!df || (tp_dataflow_ops(df) != &s_folder_ops &&
                tp_dataflow_ops(df) != &s_list_ops))
        return -1;
    return ((files_t *)tp_dataflow_impl(df))->skipped;
}

static files_t *s_files_new(const char *name,
                            const tp_image_source_opts_t *opts) {
    files_t *self = calloc(1, sizeof *self);
    if (!self) {
        tp_error(TP_ERR_NOMEM, "%s", name);
        return NULL;
    }
    self->name = name;
    if (opts)
        self->o = *opts;
    else
        tp_image_source_opts_init(&self->o);
    return self;
}

static tp_dataflow_t *s_files_make(files_t *self, const tp_dataflow_ops_t *ops,
                                   const char *where) {
    if (self->n == 0) {
        tp_error(TP_ERR_NOT_FOUND, "%s %s: no image files", self->name, where);
        s_files_free(self);
        return NULL;
    }
    if (self->n > UINT32_MAX || !(self->order = malloc(self->n * sizeof(uint32_t)))) {
        tp_error(TP_ERR_NOMEM, "%s %s: %zu files", self->name, where, self->n);
        s_files_free(self);
        return NULL;
    }
    return df_make(ops, self);
}

/* ---- image folder ------------------------------------------------------------ */

/* torchvision's IMG_EXTENSIONS, case aside: the files ImageFolder takes
 * (the decoder tells the format by its first bytes, not by the name). */
int img_is_image_name(const char *n) {
    static const char *const ext[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                      ".pgm", ".tif", ".tiff", ".webp"};
    const char *dot = strrchr(n, '.');
    for (size_t i = 0; dot && i < sizeof ext / sizeof ext[0]; i++)
        if (!strcasecmp(dot, ext[i]))
            return 1;
    return 0;
}

/* The folders walked from the top one down to the current one: a linked
 * folder that leads back to one of them is a loop. */
typedef struct s_anc {
    dev_t dev;
    ino_t ino;
    const struct s_anc *up;
} s_anc_t;

/* Enter folder p below `up` (*me is its link in the chain); an error for
 * a link back to a folder above it. */
static tp_status_t s_enter(const char *p, const s_anc_t *up, s_anc_t *me) {
    struct stat st;
    if (stat(p, &st) != 0)
        return tp_error(TP_ERR_IO, "imagefolder %s: %s", p, strerror(errno));
    for (const s_anc_t *a = up; a; a = a->up)
        if (a->dev == st.st_dev && a->ino == st.st_ino)
            return tp_error(TP_ERR_INVALID, "imagefolder %s: a link back to a folder "
                            "above it (a loop): remove or replace the link", p);
    me->dev = st.st_dev;
    me->ino = st.st_ino;
    me->up = up;
    return TP_OK;
}

static int s_cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in `dir` (not . or ..), sorted; *isdir[i] says which are
 * folders. Caller frees each name and both arrays. */
static tp_status_t s_list_dir(const char *dir, char ***names, int **isdir,
                              size_t *n) {
    *names = NULL;
    *isdir = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return tp_error(TP_ERR_IO, "imagefolder %s: %s", dir, strerror(errno));
    size_t cap = 0;
    char **v = NULL;
    struct dirent *e;
    tp_status_t rc = TP_OK;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')  /* . .. and hidden files, as torchvision */
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = tp_error(TP_ERR_NOMEM, "imagefolder %s", dir);
                break;
            }
            v = nv;
        }
        if (!(v[*n] = strdup(e->d_name))) {
            rc = tp_error(TP_ERR_NOMEM, "imagefolder %s", dir);
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (rc == TP_OK && *n) {
        qsort(v, *n, sizeof *v, s_cmp_str);
        *isdir = calloc(*n, sizeof **isdir);
        if (!*isdir)
            rc = tp_error(TP_ERR_NOMEM, "imagefolder %s", dir);
        for (size_t i = 0; rc == TP_OK && i < *n; i++) {
            char p[4096];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s", dir, v[i]);
            /* stat: a linked folder is entered, as torchvision (is_dir()
             * and os.walk(followlinks=True)) enters it; s_enter refuses a
             * link back up (a loop), which os.walk would follow forever */
            (*isdir)[i] = stat(p, &st) == 0 && S_ISDIR(st.st_mode);
            /* An image name on a FIFO, socket or device: reading a FIFO
             * waits for a writer that never comes (tp-train hung until
             * SIGTERM). torchvision's ImageFolder filters by extension
             * only and would hang the same way in PIL's open; refused
             * here by path, before anything is read. stat follows a
             * link, since a linked file is read; a dangling one is left
             * to the read, which names it. */
            if (!(*isdir)[i] && img_is_image_name(v[i]) && stat(p, &st) == 0 &&
                !S_ISREG(st.st_mode))
                rc = tp_error(TP_ERR_INVALID, "imagefolder %s: %s is %s, not a regular "
                              "file (remove it, or rename it without an image "
                              "extension)", dir, p, df_special_kind(st.st_mode));
        }
    }
    if (rc != TP_OK) {
        for (size_t i = 0; i < *n; i++)
            free(v[i]);
        free(v);
        free(*isdir);
        *isdir = NULL;
        *n = 0;
        return rc;
    }
    *names = v;
    return TP_OK;
}

static void s_free_names(char **names, int *isdir, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    free(isdir);
}

/* Every image file under `dir` (recursively, sorted) with `label`. */
static tp_status_t s_walk(files_t *self, const char *dir, int32_t label,
                          int depth, const s_anc_t *up) {
    if (depth > 32)
        return tp_error(TP_ERR_INVALID, "imagefolder %s: folders nested too "
                        "deep (a link loop?)", dir);
    s_anc_t me;
    TP_TRY(s_enter(dir, up, &me));
    char **names;
    int *isdir;
    size_t n;
    TP_TRY(s_list_dir(dir, &names, &isdir, &n));
    tp_status_t rc = TP_OK;
    for (size_t i = 0; i < n && rc == TP_OK; i++) {
        char p[4096];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, names[i]) >= sizeof p) {
            rc = tp_error(TP_ERR_INVALID, "imagefolder: path too long under %s",
                          dir);
            break;
        }
        if (isdir[i])
            rc = s_walk(self, p, label, depth + 1, &me);
        else if (img_is_image_name(names[i]))
            rc = s_files_add(self, p, label);
    }
    s_free_names(names, isdir, n);
    return rc;
}

tp_dataflow_t *tp_df_image_folder(const char *dir,
                                  const tp_image_source_opts_t *opts) {
    files_t *self = s_files_new("imagefolder", opts);
    if (!self)
        return NULL;
    char **names;
    int *isdir;
    size_t n;
    s_anc_t top;
    if (s_enter(dir, NULL, &top) != TP_OK ||
        s_list_dir(dir, &names, &isdir, &n) != TP_OK) {
        s_files_free(self);
        return NULL;
    }
    tp_status_t rc = TP_OK;
    int32_t ncls = 0;
    char table[1024];
    size_t off = 0;
    table[0] = '\0';
    for (size_t i = 0; i < n && rc == TP_OK; i++) {
        if (!isdir[i])
            continue;
        if (ncls == INT32_MAX) {
            rc = tp_error(TP_ERR_INVALID, "imagefolder %s: too many classes",
                          dir);
            break;
        }
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        size_t before = self->n;
        rc = s_walk(self, p, ncls, 0, &top);
        /* torchvision refuses it too ("Found no valid file for the
         * classes"): a class no image can teach is a mistake in the folder */
        if (rc == TP_OK && self->n == before)
            rc = tp_error(TP_ERR_NOT_FOUND, "imagefolder %s: the class folder %s "
                          "holds no images (" IMG_EXTENSIONS_TEXT ")", dir, p);
        if (off < sizeof table - 1) {
            int k = snprintf(table + off, sizeof table - off, "%s%d=%s",
                             off ? " " : "", ncls, names[i]);
            off = k < 0 ? sizeof table : off + (size_t)k;
        }
        ncls++;
    }
    s_free_names(names, isdir, n);
    if (rc == TP_OK && ncls == 0)
        rc = tp_error(TP_ERR_NOT_FOUND, "imagefolder %s: no class sub-folders "
                      "(the layout is DIR/<class>/<image>)", dir);
    if (rc != TP_OK) {
        s_files_free(self);
        return NULL;
    }
    TP_INFO("imagefolder %s: %zu images, %d classes: %s%s", dir, self->n,
            (int)ncls, table, off >= sizeof table - 1 ? " ..." : "");
    return s_files_make(self, &s_folder_ops, dir);
}

/* The first image file under `dir` (depth first, sorted), into out. */
static int s_first_image(const char *dir, char *out, size_t size, int depth,
                         const s_anc_t *up) {
    char **names;
    int *isdir;
    size_t n;
    s_anc_t me;
    if (depth > 32 || s_enter(dir, up, &me) != TP_OK ||
        s_list_dir(dir, &names, &isdir, &n) != TP_OK)
        return 0;
    int found = 0;
    for (size_t i = 0; i < n && !found; i++) {
        char p[4096];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, names[i]) >= sizeof p)
            continue;
        if (isdir[i])
            found = s_first_image(p, out, size, depth + 1, &me);
        else if (img_is_image_name(names[i]) && strlen(p) < size) {
            strcpy(out, p);
            found = 1;
        }
    }
    s_free_names(names, isdir, n);
    return found;
}

tp_status_t tp_image_folder_classes(const char *dir, char ***names_out, int *n_out,
                                    char *first_image, size_t size) {
    *names_out = NULL;
    *n_out = 0;
    if (first_image && size)
        first_image[0] = '\0';
    char **names;
    int *isdir;
    size_t n;
    TP_TRY(s_list_dir(dir, &names, &isdir, &n));
    /* the same listing and order tp_df_image_folder numbers its labels by */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdir[i]) {
            free(names[i]);
            continue;
        }
        names[k++] = names[i];
    }
    free(isdir);
    if (k == 0) {
        free(names);
        return tp_error(TP_ERR_NOT_FOUND, "imagefolder %s: no class sub-folders "
                        "(the layout is DIR/<class>/<image>)", dir);
    }
    if (k > INT32_MAX / 2) {
        for (size_t i = 0; i < k; i++)
            free(names[i]);
        free(names);
        return tp_error(TP_ERR_INVALID, "imagefolder %s: too many classes", dir);
    }
    for (size_t i = 0; first_image && size && i < k && !first_image[0]; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        s_first_image(p, first_image, size, 0, NULL);
    }
    *names_out = names;
    *n_out = (int)k;
    return TP_OK;
}

/* ---- list file ---------------------------------------------------------------- */

int df_image_list_line(char *line, long max_label, char **path, long *label) {
    char *s = line;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '#' || *s == '\n' || *s == '\r' || !*s)
        return 0;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
        *--e = '\0';
    *path = s;
    char *lab = e;
    while (lab > s && lab[-1] != ' ' && lab[-1] != '\t')
        lab--;
    char *end;
    errno = 0;
    long v = strtol(lab, &end, 10);
    if (lab == s || lab == end || *end || errno || v < 0 || v > max_label)
        return -1;
    while (lab > s && (lab[-1] == ' ' || lab[-1] == '\t'))
        *--lab = '\0';
    *label = v;
    return 1;
}

int df_image_list_path(char *out, size_t size, const char *list, const char *root,
                       const char *path) {
    if (*path == '/')
        return snprintf(out, size, "%s", path);
    if (root)
        return snprintf(out, size, "%s/%s", root, path);
    const char *slash = strrchr(list, '/');
    return snprintf(out, size, "%.*s/%s", slash ? (int)(slash - list) : 1,
                    slash ? list : ".", path);
}

tp_dataflow_t *tp_df_image_list(const char *list_path, const char *root,
                                const tp_image_source_opts_t *opts) {
    files_t *self = s_files_new("imagelist", opts);
    if (!self)
        return NULL;
    /* regular files only: a device or a pipe could be read forever, and a
     * FIFO's open alone waited for a writer */
    FILE *f;
    int64_t size;
    if (df_open_regular("imagelist", list_path, &f, &size) != TP_OK) {
        s_files_free(self);
        return NULL;
    }
    char line[8192];
    long lineno = 0;
    tp_status_t rc = TP_OK;
    while (rc == TP_OK && fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            rc = tp_error(TP_ERR_FORMAT, "imagelist %s:%ld: line too long",
                          list_path, lineno);
            break;
        }
        char *s;
        long v;
        int got = df_image_list_line(line, INT32_MAX, &s, &v);
        if (got == 0)
            continue;
        if (got < 0) {
            rc = tp_error(TP_ERR_FORMAT, "imagelist %s:%ld: expected 'PATH "
                          "LABEL' (a label >= 0), got '%s'", list_path, lineno,
                          s);
            break;
        }
        char p[8192 + 4096];
        df_image_list_path(p, sizeof p, list_path, root, s);
        rc = s_files_add(self, p, (int32_t)v);
    }
    fclose(f);
    if (rc != TP_OK) {
        s_files_free(self);
        return NULL;
    }
    return s_files_make(self, &s_list_ops, list_path);
}

/* ---- CIFAR binary ------------------------------------------------------------ */

typedef struct {
    uint8_t *buf;          /* the whole file */
    size_t n, rec;         /* records, bytes per record */
    int label_off;         /* which label byte */
    int shuffle;
    uint32_t *order;
    size_t pos;
    tp_rng_t rng;
} cifar_t;

static tp_status_t s_cifar_reset(void *impl, tp_rng_t *rng, uint64_t seed,
                                 uint64_t stream) {
    (void)rng;
    cifar_t *self = impl;
    tp_df_rng_derive(&self->rng, seed, stream, "cifar");
    return TP_OK;
}

static tp_status_t s_cifar_begin(void *impl) {
    cifar_t *self = impl;
    df_iota_shuffle(self->order, self->n, self->shuffle ? &self->rng : NULL);
    self->pos = 0;
    return TP_OK;
}

static tp_status_t s_cifar_next(void *impl, tp_datapoint_t **out) {
    cifar_t *self = impl;
    if (self->pos >= self->n)
        return TP_DONE;
    const uint8_t *r = self->buf + self->order[self->pos++] * self->rec;
    const uint8_t *px = r + self->rec - 3072;  /* planes R, G, B of 32x32 */
    tp_dtype_t dt[2] = {TP_UINT8, TP_INT32};
    int nd[2] = {3, 0};
    int64_t shapes[2][TP_MAX_DIMS] = {{32, 32, 3}, {0}};
    tp_datapoint_t *dp = tp_df_datapoint_alloc(2, dt, nd, shapes);
    if (!dp)
        return TP_ERR_NOMEM;
    uint8_t *d = tp_datapoint_get(dp, 0)->data;
    for (int i = 0; i < 1024; i++) {
        d[i * 3] = px[i];
        d[i * 3 + 1] = px[1024 + i];
        d[i * 3 + 2] = px[2048 + i];
    }
    *(int32_t *)tp_datapoint_get(dp, 1)->data = r[self->label_off];
    *out = dp;
    return TP_OK;
}

static int64_t s_cifar_size(void *impl) { return (int64_t)((cifar_t *)impl)->n; }

static void s_cifar_destroy(void *impl) {
    cifar_t *self = impl;
    free(self->buf);
    free(self->order);
    free(self);
}

static const tp_dataflow_ops_t s_cifar_ops = {
    .name = "cifar", .reset_state = s_cifar_reset, .begin = s_cifar_begin,
    .next = s_cifar_next, .size = s_cifar_size, .destroy = s_cifar_destroy};

tp_dataflow_t *tp_df_cifar(const char *path, int cifar100, int fine,
                           int shuffle) {
    tp_tensor_t raw;
    if (s_read_raw("cifar", path, &raw) != TP_OK)
        return NULL;
    size_t rec = cifar100 ? 3074 : 3073;
    if (raw.nbytes % rec != 0) {
        tp_error(TP_ERR_FORMAT, "cifar %s: %zu bytes is not a whole number of "
                 "%zu-byte CIFAR-%s records", path, raw.nbytes, rec,
                 cifar100 ? "100" : "10");
        tp_tensor_fini(&raw);
        return NULL;
    }
    cifar_t *self = calloc(1, sizeof *self);
    if (!self || !(self->buf = malloc(raw.nbytes)) ||
        !(self->order = malloc((raw.nbytes / rec) * sizeof(uint32_t)))) {
        if (self)
            free(self->buf);
        free(self);
        tp_tensor_fini(&raw);
        tp_error(TP_ERR_NOMEM, "cifar %s", path);
        return NULL;
    }
    memcpy(self->buf, raw.data, raw.nbytes);
    self->n = raw.nbytes / rec;
    tp_tensor_fini(&raw);
    self->rec = rec;
    self->label_off = cifar100 && fine ? 1 : 0;
    self->shuffle = shuffle;
    for (size_t i = 0; i < self->n; i++)  /* labels in range */
        if (self->buf[i * rec + self->label_off] >= (cifar100 ? (fine ? 100 : 20) : 10)) {
            tp_error(TP_ERR_FORMAT, "cifar %s: record %zu has label %d", path,
                     i, self->buf[i * rec + self->label_off]);
            s_cifar_destroy(self);
            return NULL;
        }
    return df_make(&s_cifar_ops, self);
}

/* ---- decode map ---------------------------------------------------------------- */

tp_status_t tp_image_decode_map(tp_datapoint_t **dp, tp_rng_t *rng,
                                void *user) {
    (void)rng;
    const tp_image_decoder_t *d = user;
    if (d->component >= tp_datapoint_size(*dp))
        return tp_error(TP_ERR_SHAPE, "decode: component %d of a datapoint of "
                        "%d", d->component, tp_datapoint_size(*dp));
    tp_tensor_t *t = tp_datapoint_get(*dp, d->component);
    if (t->dtype != TP_UINT8 || t->ndim != 1) {
        char desc[96];
        return tp_error(TP_ERR_SHAPE, "decode: component %d is %s, expected "
                        "encoded bytes (uint8 [N])", d->component,
                        tp_tensor_describe(t, desc, sizeof desc));
    }
    tp_tensor_t img;
    TP_TRY(tp_image_decode(t->data, t->nbytes, &d->opts, "(record)", &img));
    tp_tensor_fini(t);
    tp_tensor_move(t, &img);
    return TP_OK;
}
