/* towerpack models: what the zoo's models read, in one place for every
 * tool: the data sources (named the way tp-train and tp-predict take them,
 * turned into pipeline specs that yield the zoo's inputs) and the
 * checkpoints (the model a checkpoint records, for tp-predict, tp-export
 * and tp-bench predict). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>
#include <towerpack/checkpoint.h>
#include <towerpack/fileio.h>
#include <towerpack/models.h>
#include <towerpack/predict.h>

static int s_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

tp_status_t tp_zoo_source_sized(const char *data, int in_order, int height, int width,
                                char *buf, size_t size) {
    return tp_zoo_source_shaped(data, in_order, 1, height, width, buf, size);
}

/* A source as a spec: resize 0 resizes to height x width; S > 0 (image
 * sources) resizes the short side to S and centre-crops height x width;
 * S < 0 (image sources) decodes at the smallest JPEG scale that keeps
 * min(height, width) on the short side and leaves the size (a random
 * resized crop follows). */
static tp_status_t s_source(const char *data, int in_order, int channels, int height,
                            int width, int rs, char *buf, size_t size) {
    if (!data)
        return tp_error(TP_ERR_INVALID, "no data source");
    if (height < 1 || height > TP_ZOO_MAX_SIZE || width < 1 || width > TP_ZOO_MAX_SIZE)
        return tp_error(TP_ERR_INVALID, "data source '%s': image size %dx%d (height "
                        "and width 1..%d)", data, height, width, TP_ZOO_MAX_SIZE);
    if (channels != 1 && channels != 3)
        return tp_error(TP_ERR_INVALID, "data source '%s': %d channels (1 grey or 3 "
                        "colour)", data, channels);
    /* sources whose order is random unless told: keep the file's order */
    const char *order = in_order && !strstr(data, "shuffle") ? ",shuffle=0" : "";
    int image_src = s_prefix(data, "imagefolder:") || s_prefix(data, "imagelist:");
    int cifar = s_prefix(data, "cifar:");
    if (channels == 3 && !image_src && !cifar)
        return tp_error(TP_ERR_INVALID, "data source '%s' holds grey images: colour "
                        "(3 channels) comes from imagefolder:, imagelist: or cifar:",
                        data);
    /* CIFAR's records are RGB: no stage turns them grey */
    if (cifar && channels != 3)
        return tp_error(TP_ERR_INVALID, "data source '%s': CIFAR is colour "
                        "(--channels 3)", data);
    /* the records resized in the pipeline (tensorpack's imgaug.Resize in an
     * AugmentImageComponent): nothing to add at their own size (28x28 for
     * Fashion-MNIST, IDX and LMDB records, 32x32 for CIFAR) */
    int own = cifar ? 32 : 28;
    char resize[96] = "";
    if ((image_src || cifar) && rs > 0)
        snprintf(resize, sizeof resize, " | imgaug resize-short=%d,center-crop=%dx%d",
                 rs, height, width);
    else if (image_src && rs < 0)
        resize[0] = '\0';
    else if (image_src || height != own || width != own)
        snprintf(resize, sizeof resize, " | imgaug resize=%dx%d", height, width);
    int n;
    if (cifar)
        n = snprintf(buf, size, "%s%s%s", data, order, resize);
    else if (s_prefix(data, "fashion-mnist:") || s_prefix(data, "idx:"))
        n = snprintf(buf, size, "%s%s%s", data, order, resize);
    else if (s_prefix(data, "lmdb:"))  /* record files are read in order */
        n = snprintf(buf, size, "%s%s", data, resize);
    else if (s_prefix(data, "tensorpack-lmdb:"))  /* numpy's int64 labels */
        n = snprintf(buf, size, "%s,int32%s", data, resize);
    else if (image_src) {
        /* grey or RGB, decoded at the smallest JPEG scale that keeps the
         * short side the resize needs, then resized */
        int ms = rs > 0 ? rs : height < width ? height : width;
        n = snprintf(buf, size, "%s%s,mode=%s,min-short=%d%s", data, order,
                     channels == 3 ? "rgb" : "grey", ms, resize);
    } else
        return tp_error(TP_ERR_INVALID, "data source '%s': use fashion-mnist:SPLIT, "
                        "idx:IMAGES[,LABELS], lmdb:PATH, tensorpack-lmdb:PATH, "
                        "imagefolder:DIR, imagelist:FILE or cifar:FILE", data);
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "data source '%.64s...': too long", data);
    return TP_OK;
}

tp_status_t tp_zoo_source_shaped(const char *data, int in_order, int channels,
                                 int height, int width, char *buf, size_t size) {
    return s_source(data, in_order, channels, height, width, 0, buf, size);
}

tp_status_t tp_zoo_source_decoded(const char *data, int channels, int height, int width,
                                  char *buf, size_t size) {
    if (!data || !(s_prefix(data, "imagefolder:") || s_prefix(data, "imagelist:")))
        return tp_error(TP_ERR_INVALID, "data source '%s': the random resized crop "
                        "needs images of their own size (imagefolder: or imagelist:)",
                        data ? data : "(null)");
    return s_source(data, 0, channels, height, width, -1, buf, size);
}

tp_status_t tp_zoo_eval_spec(const char *data, const tp_zoo_data_t *d, int height,
                             int width, char *buf, size_t size) {
    char src[3072], norm[256];
    TP_TRY(s_source(data, 1, d->channels, height, width, d->resize_short, src, sizeof src));
    TP_TRY(tp_zoo_normalise_spec(d, height, width, norm, sizeof norm));
    int n = snprintf(buf, size, "%s%s", src, norm);
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "data source '%.64s...': too long", data);
    return TP_OK;
}

tp_status_t tp_zoo_source(const char *data, int in_order, char *buf, size_t size) {
    return tp_zoo_source_sized(data, in_order, 28, 28, buf, size);
}

const tp_zoo_model_t *tp_zoo_from_checkpoint(const char *load, const char *model,
                                             char *ckpt, size_t size,
                                             tp_input_desc_t inputs[2]) {
    tp_checkpoint_info_t info;
    if (tp_checkpoint_resolve(load, ckpt, size) < 0 || tp_checkpoint_info(ckpt, &info) < 0)
        return NULL;
    const char *name = model ? model : info.model;
    if (!*name) {
        tp_error(TP_ERR_INVALID, "%s does not record its model (written before "
                 "tp-train recorded it): give --model (mlp, cnn, cnn-bn, resnet)", ckpt);
        return NULL;
    }
    const tp_zoo_model_t *zoo = tp_zoo_find(name);
    if (!zoo)
        return NULL;
    memcpy(inputs, tp_zoo_inputs(), 2 * sizeof *inputs);
    const tp_input_desc_t *rec = info.ninputs > 0 && !strcmp(info.inputs[0].name, "image")
                               ? &info.inputs[0] : NULL;
    if (rec) {
        /* the shape it was trained at: [batch,height,width] (grey) or
         * [batch,3,height,width] (colour, channels first) */
        int nd = rec->ndim;
        if ((nd != 3 && !(nd == 4 && rec->shape[1] == 3)) ||
            rec->shape[nd - 2] > TP_ZOO_MAX_SIZE || rec->shape[nd - 1] > TP_ZOO_MAX_SIZE) {
            tp_error(TP_ERR_FORMAT, "%s: the recorded image input is not [batch,"
                     "height,width] or [batch,3,height,width] with sides up to %d",
                     ckpt, TP_ZOO_MAX_SIZE);
            return NULL;
        }
        inputs[0].ndim = nd;
        memcpy(inputs[0].shape, rec->shape, sizeof rec->shape);
    }
    int nd = inputs[0].ndim;
    if (tp_zoo_check_size(zoo, (int)inputs[0].shape[nd - 2], (int)inputs[0].shape[nd - 1]) != TP_OK) {
        tp_error_wrap(TP_ERR_INVALID, "%s", ckpt);
        return NULL;
    }
    /* the image dtype it was trained on: uint8, or float32 where an older
     * run's augmentor normalised */
    if (rec)
        inputs[0].dtype = rec->dtype;
    else
        inputs[0].dtype = zoo->augment ? TP_FLOAT32 : TP_UINT8;
    return zoo;
}

/* ---- what the data were: data.json beside the checkpoints ------------------ */

void tp_zoo_data_init(tp_zoo_data_t *d) {
    memset(d, 0, sizeof *d);
    d->channels = 1;
    d->nclasses = 10;
    d->nnorm = 1;
    d->std[0] = 255;  /* grey: [0, 1], as the augmentor has always scaled */
}

void tp_zoo_data_fini(tp_zoo_data_t *d) {
    for (int i = 0; d->classes && i < d->nclasses; i++)
        free(d->classes[i]);
    free(d->classes);
    tp_zoo_data_init(d);
}

tp_status_t tp_zoo_data_set_classes(tp_zoo_data_t *d, int n, const char *const *names) {
    if (n < 1)
        return tp_error(TP_ERR_INVALID, "classes: %d (at least 1)", n);
    char **v = calloc((size_t)n, sizeof *v);
    if (!v)
        return tp_error(TP_ERR_NOMEM, "classes");
    for (int i = 0; i < n; i++) {
        char num[16];
        snprintf(num, sizeof num, "%d", i);
        if (!(v[i] = strdup(names && names[i] ? names[i] : num))) {
            while (i-- > 0)
                free(v[i]);
            free(v);
            return tp_error(TP_ERR_NOMEM, "classes");
        }
    }
    for (int i = 0; d->classes && i < d->nclasses; i++)
        free(d->classes[i]);
    free(d->classes);
    d->classes = v;
    d->nclasses = n;
    return TP_OK;
}

/* The lists data.json and a checkpoint's metadata both record, which
 * s_data_from_json reads back: the class names (a class without a name is
 * its number), the normalisation's means and standard deviations. Caller
 * owns the three arrays. */
static void s_data_lists(const tp_zoo_data_t *d, json_t **cl, json_t **mean, json_t **std) {
    *cl = json_array();
    *mean = json_array();
    *std = json_array();
    for (int i = 0; i < d->nclasses; i++) {
        char num[16];
        snprintf(num, sizeof num, "%d", i);
        json_array_append_new(*cl, json_string(d->classes ? d->classes[i] : num));
    }
    for (int c = 0; c < d->nnorm; c++) {
        json_array_append_new(*mean, json_real(d->mean[c]));
        json_array_append_new(*std, json_real(d->std[c]));
    }
}

tp_status_t tp_zoo_data_save(const tp_zoo_data_t *d, const char *dir) {
    json_t *j = json_object(), *cl, *mean, *std;
    s_data_lists(d, &cl, &mean, &std);
    json_object_set_new(j, "channels", json_integer(d->channels));
    json_object_set_new(j, "layout", json_string(d->channels == 1 ? "HW" : "CHW"));
    json_object_set_new(j, "colour", json_string(d->channels == 1 ? "grey" : "RGB"));
    json_object_set_new(j, "resize_short", json_integer(d->resize_short));
    /* where the normalisation runs: "model" (uint8 images, the model's
     * first ops) or "pipeline" (the model adds none: models.h, in_model) */
    json_object_set_new(j, "normalise", json_string(d->in_model ? "model" : "pipeline"));
    json_object_set_new(j, "classes", cl);
    json_object_set_new(j, "mean", mean);
    json_object_set_new(j, "std", std);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!text)
        return tp_error(TP_ERR_NOMEM, "%s/data.json", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/" TP_ZOO_DATA_FILE, dir);
    size_t len = strlen(text);
    text[len] = '\n';  /* the NUL becomes the newline: written by length */
    tp_status_t rc = tp_file_write_atomic(path, text, len + 1);
    free(text);
    if (rc != TP_OK)
        return tp_error_wrap(rc, "writing the data description");
    return TP_OK;
}

/* *d from a data description (data.json's object, or the one a
 * checkpoint's metadata makes); `what` names it in errors. */
static tp_status_t s_data_from_json(json_t *j, const char *what, tp_zoo_data_t *d) {
    tp_status_t rc = TP_OK;
    json_t *ch = json_object_get(j, "channels"), *cl = json_object_get(j, "classes");
    json_t *mean = json_object_get(j, "mean"), *std = json_object_get(j, "std");
    size_t nc = json_array_size(cl), nm = json_array_size(mean);
    if (!json_is_integer(ch) || (json_integer_value(ch) != 1 && json_integer_value(ch) != 3) ||
        !json_is_array(cl) || nc < 1 || nc > 1000000 || nm < 1 || nm > 4 ||
        json_array_size(std) != nm)
        return tp_error(TP_ERR_FORMAT, "%s: expected channels 1 or 3, classes (a list "
                        "of names), mean and std (1 to 4 numbers each)", what);
    const char **names = calloc(nc, sizeof *names);
    if (!names)
        return tp_error(TP_ERR_NOMEM, "%s", what);
    for (size_t i = 0; i < nc; i++)
        names[i] = json_string_value(json_array_get(cl, i));
    rc = tp_zoo_data_set_classes(d, (int)nc, names);
    free(names);
    d->channels = (int)json_integer_value(ch);
    json_t *rs = json_object_get(j, "resize_short");
    d->resize_short = json_is_integer(rs) && json_integer_value(rs) > 0 &&
                      json_integer_value(rs) <= TP_ZOO_MAX_SIZE * 2
                    ? (int)json_integer_value(rs) : 0;
    json_t *where = json_object_get(j, "normalise");
    d->in_model = json_is_string(where) && !strcmp(json_string_value(where), "model");
    d->nnorm = (int)nm;
    for (size_t c = 0; c < nm; c++) {
        d->mean[c] = (float)json_number_value(json_array_get(mean, c));
        d->std[c] = (float)json_number_value(json_array_get(std, c));
        if (!(d->std[c] > 0) && rc == TP_OK)
            rc = tp_error(TP_ERR_FORMAT, "%s: std[%zu] is not positive", what, c);
    }
    if (rc != TP_OK)
        tp_zoo_data_fini(d);  /* the defaults, nothing held */
    return rc;
}

/* The metadata keys a checkpoint records the data in (each value JSON). */
static const char *const s_meta_keys[] = {"channels", "class_names", "mean", "std",
                                          "resize_short", "normalise"};

tp_status_t tp_zoo_data_to_checkpoints(const tp_zoo_data_t *d, int height, int width,
                                       tp_model_t *m) {
    json_t *cl, *mean, *std;
    s_data_lists(d, &cl, &mean, &std);
    char *names = json_dumps(cl, JSON_COMPACT | JSON_ENSURE_ASCII);
    char *means = json_dumps(mean, JSON_COMPACT | JSON_REAL_PRECISION(9));
    char *stds = json_dumps(std, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(cl);
    json_decref(mean);
    json_decref(std);
    char ch[16], size[48], ncl[16], rs[16];
    const char *where = d->in_model ? "\"model\"" : "\"pipeline\"";  /* JSON, as the others */
    snprintf(ch, sizeof ch, "%d", d->channels);
    snprintf(size, sizeof size, "%dx%d", height, width);
    snprintf(ncl, sizeof ncl, "%d", d->nclasses);
    snprintf(rs, sizeof rs, "%d", d->resize_short);
    tp_status_t rc = names && means && stds ? TP_OK
                   : tp_error(TP_ERR_NOMEM, "the data description's metadata");
    const char *kv[][2] = {{"channels", ch}, {"size", size}, {"classes", ncl},
                           {"class_names", names}, {"mean", means}, {"std", stds},
                           {"resize_short", rs}, {"normalise", where},
                           {"colour", d->channels == 1 ? "grey" : "RGB"}};
    for (size_t i = 0; rc == TP_OK && i < sizeof kv / sizeof *kv; i++)
        rc = tp_checkpoint_set_meta(m, kv[i][0], kv[i][1]);
    free(names);
    free(means);
    free(stds);
    return rc;
}

/* *d from the metadata of checkpoint `path` (tp_zoo_data_to_checkpoints);
 * *found 0 for one that records no data (an older tp-train's). */
static tp_status_t s_data_from_checkpoint(const char *path, tp_zoo_data_t *d, int *found) {
    tp_safetensors_t *st = NULL;
    TP_TRY(tp_safetensors_open(path, &st));
    tp_status_t rc = TP_OK;
    json_t *j = json_object();
    for (size_t i = 0; i < sizeof s_meta_keys / sizeof *s_meta_keys && j; i++) {
        const char *v = tp_safetensors_meta(st, s_meta_keys[i]);
        if (!v)
            continue;
        json_error_t err;
        json_t *x = json_loads(v, JSON_DECODE_ANY, &err);
        if (!x) {
            rc = tp_error(TP_ERR_FORMAT, "checkpoint %s: metadata '%s' is not JSON (%s)",
                          path, s_meta_keys[i], err.text);
            break;
        }
        /* data.json's names for them */
        json_object_set_new(j, !strcmp(s_meta_keys[i], "class_names") ? "classes"
                               : s_meta_keys[i], x);
    }
    const char *ncl = tp_safetensors_meta(st, "classes");
    if (rc == TP_OK && j && json_object_get(j, "channels") && json_object_get(j, "classes")) {
        char what[4200];
        snprintf(what, sizeof what, "checkpoint %s: metadata", path);
        if (ncl && strtol(ncl, NULL, 10) != (long)json_array_size(json_object_get(j, "classes")))
            rc = tp_error(TP_ERR_FORMAT, "%s 'classes' is %s but 'class_names' has %zu names",
                          what, ncl, json_array_size(json_object_get(j, "classes")));
        else if ((rc = s_data_from_json(j, what, d)) == TP_OK)
            *found = 1;
    }
    json_decref(j);
    tp_safetensors_destroy(&st);
    return rc;
}

tp_status_t tp_zoo_data_load(const char *ckpt, tp_zoo_data_t *d, int *found) {
    tp_zoo_data_fini(d);
    *found = 0;
    char path[4200];
    struct stat st;
    const char *slash = strrchr(ckpt, '/');
    int is_dir = stat(ckpt, &st) == 0 && S_ISDIR(st.st_mode);
    if (is_dir)
        snprintf(path, sizeof path, "%s/" TP_ZOO_DATA_FILE, ckpt);
    else
        snprintf(path, sizeof path, "%.*s/" TP_ZOO_DATA_FILE, slash ? (int)(slash - ckpt) : 1,
                 slash ? ckpt : ".");
    if (stat(path, &st) != 0) {
        /* no data.json (a checkpoint copied alone): its own metadata, or
         * a run from before either (grey, 10 classes) */
        char file[4096];
        if (is_dir ? tp_checkpoint_resolve(ckpt, file, sizeof file) != TP_OK
                   : stat(ckpt, &st) != 0)
            return TP_OK;  /* no checkpoint either: the caller says so */
        return s_data_from_checkpoint(is_dir ? file : ckpt, d, found);
    }
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j)
        return tp_error(TP_ERR_FORMAT, "%s:%d: %s", path, err.line, err.text);
    tp_status_t rc = s_data_from_json(j, path, d);
    json_decref(j);
    if (rc == TP_OK)
        *found = 1;
    return rc;
}

tp_status_t tp_zoo_normalise_spec(const tp_zoo_data_t *d, int height, int width,
                                  char *buf, size_t size) {
    int n;
    if (d->in_model) {
        /* uint8 to the model, which normalises: the crop (the identity at
         * the model's size) and, for colour, the channels first */
        n = snprintf(buf, size, " | imgaug random-crop=%dx%d%s", height, width,
                     d->channels == 3 ? ",chw" : "");
        if (n < 0 || (size_t)n >= size)
            return tp_error(TP_ERR_INVALID, "normalisation spec: too long");
        return TP_OK;
    }
    char mean[96] = "", std[96] = "";
    size_t om = 0, os = 0;
    for (int c = 0; c < d->nnorm; c++) {
        om += (size_t)snprintf(mean + om, sizeof mean - om, "%s%g", c ? "/" : "", d->mean[c]);
        os += (size_t)snprintf(std + os, sizeof std - os, "%s%g", c ? "/" : "", d->std[c]);
        if (om >= sizeof mean || os >= sizeof std)
            return tp_error(TP_ERR_INVALID, "normalisation: too many numbers");
    }
    n = snprintf(buf, size, " | augment crop=%dx%d,mean=%s,std=%s%s", height, width,
                 mean, std, d->channels == 3 ? " | imgaug chw" : "");
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "normalisation spec: too long");
    return TP_OK;
}
