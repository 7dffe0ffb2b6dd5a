/* tp-predict: run a trained model on data.
 *
 *   tp-predict --load CHECKPOINT|LOGDIR [--model NAME] --data SOURCE
 *              [--output FILE] [--json] [--top-k K] [--batch N]
 *              [--confusion PNG] [--threads N] [--bf16]
 *
 * The checkpoint names its model (tp-train records it), so --model is only
 * needed for older checkpoints or to override. The data are tp-train's
 * sources (fashion-mnist, fashion-mnist:SPLIT, idx:, lmdb:,
 * tensorpack-lmdb:, imagefolder:, imagelist:; tp_zoo_source_sized) or a
 * whole spec (--spec), read in file order, resized to the image size the
 * checkpoint records (tp-train --image-size). Predictions go
 * to --output (CSV, or JSON lines when the name ends in .jsonl/.json):
 * index, top-k classes and their probabilities, the label when there is
 * one. With labels: accuracy (and top-5 accuracy with more than 5
 * classes), per-class accuracy and the confusion matrix, printed and drawn
 * (--confusion, default confusion.png next to the checkpoint). --json
 * prints one JSON object instead of the text report. The class names,
 * the image channels and the normalisation come from data.json beside the
 * checkpoint, or without one from the checkpoint's own metadata (tp-train
 * writes both; without either: grey, 10 classes named by their numbers). */
#include <cairo.h>
#include <fontconfig/fontconfig.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>
#include "tools/tp-predict/zoo_predictor.h"

#define MAXK 64      /* --top-k */
#define MAXCLS 1000  /* classes a model may give */

static const char *s_usage =
"usage: tp-predict --load CHECKPOINT|LOGDIR --data SOURCE [options]\n"
"  --load PATH        a checkpoint, or a log directory (its latest checkpoint)\n"
"  --model NAME       mlp, cnn, cnn-bn, resnet, resnet18, resnet50 (default:\n"
"                     the one the\n"
"                     checkpoint records)\n"
"  --data SOURCE      fashion-mnist (its test split), fashion-mnist:train|test,\n"
"                     idx:IMAGES[,LABELS], lmdb:PATH, tensorpack-lmdb:PATH,\n"
"                     imagefolder:DIR, imagelist:FILE, cifar:FILE (as tp-train\n"
"                     takes them; resized and normalised as the run's\n"
"                     validation was: the checkpoint's size, data.json or\n"
"                     the checkpoint's metadata)\n"
"  --spec SPEC        the whole input pipeline as a spec string instead\n"
"                     (batched; components image[, label] at the model's size)\n"
"  --output FILE      predictions: CSV, or JSON lines for *.jsonl / *.json\n"
"                     (these also give the class names)\n"
"  --top-k K          classes per prediction in --output (default 1)\n"
"  --logits           also every logit in --output (exact: %.9g)\n"
"  --json             print one JSON object (accuracy, top5_accuracy, samples,\n"
"                     samples_per_s, classes, per_class_accuracy, confusion,\n"
"                     ...)\n"
"  --confusion PNG    the confusion matrix image (default: next to the\n"
"                     checkpoint, <name>.confusion.png, a warning and none\n"
"                     where that folder cannot be written); 'none' for none\n"
"  --batch N          rows per call (default 256)\n"
"  --threads N        BLAS threads (default: OpenBLAS's)\n"
"  --bf16             the CPU's matrix products, direct convolutions and\n"
"                     attention tile products on bf16 operands with fp32\n"
"                     sums (as tp-train --bf16; a\n"
"                     warning, and fp32, where the CPU lacks bf16; default:\n"
"                     $TP_CPU_BF16)\n";

typedef struct {
    const char *load, *model, *data, *spec, *output, *confusion;
    int json, top_k, batch, threads, logits, bf16;
} s_args_t;

static int s_fail(const char *what) {
    fprintf(stderr, "tp-predict: %s: %s\n", what, tp_last_error());
    return 1;
}

/* A file can be made at `path`: its folder is one this process may write
 * in, and it is not a folder itself. Checked before the prediction pass,
 * so that a mistyped --confusion is said at once with the system's reason
 * (it was cairo's "error while writing to output stream", after the pass). */
static tp_status_t s_can_write(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        slash[slash == dir] = '\0';  /* "/x.png": the root */
    struct stat st;
    if (access(dir, W_OK | X_OK) != 0)
        return tp_error(TP_ERR_IO, "cannot write %s: %s: %s", path, dir, strerror(errno));
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return tp_error(TP_ERR_IO, "cannot write %s: %s", path, strerror(EISDIR));
    return TP_OK;
}

/* cairo's PNG writer into a stdio stream (fopen says why a file cannot be
 * made; cairo's own file writer does not) */
static cairo_status_t s_png_write(void *f, const unsigned char *data, unsigned int len) {
    return fwrite(data, 1, len, f) == len ? CAIRO_STATUS_SUCCESS : CAIRO_STATUS_WRITE_ERROR;
}

/* A whole number flag in [lo, hi] into *out; 0, or -1 having said which
 * flag and what it got (atoi took "12abc" for 12 and "abc" for 0, and
 * one message listed every range). */
static int s_int_flag(const char *flag, const char *v, int64_t lo, int64_t hi, int *out) {
    int64_t x;
    if (tp_spec_int(v, lo, hi, flag, &x) != TP_OK) {
        fprintf(stderr, "tp-predict: bad flag: %s\n", tp_last_error());
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* TP_OK unless the checkpoint `load` names records a gpt or a GAN, which
 * tp-predict cannot run (it feeds images and reads logits): refused
 * naming the tool that can, before the model is built (whose own error,
 * about the inputs' shapes, would not say it). */
static tp_status_t s_classifier_only(const char *load) {
    char path[4096];
    tp_checkpoint_info_t ti;
    if (tp_checkpoint_resolve(load, path, sizeof path) != TP_OK ||
        tp_checkpoint_info(path, &ti) != TP_OK)
        return TP_OK;  /* tp_zoo_from_checkpoint reports it */
    if (!strcmp(ti.model, "gpt"))
        return tp_error(TP_ERR_INVALID, "%s holds model 'gpt', a language model: "
                        "tp-predict classifies images (tp-generate --load %s --prompt TEXT "
                        "continues a text)", path, load);
    if (tp_zoo_find_gan(ti.model))
        return tp_error(TP_ERR_INVALID, "%s holds model '%s', a GAN: tp-predict classifies "
                        "images (tp-generate --load %s --count N --output FILE.npy draws "
                        "samples)", path, ti.model, load);
    return TP_OK;
}

/* The name of the model's class j ("j" when the run recorded none). */
static const char *s_class_name(const tp_zoo_data_t *info, int j, char buf[16]) {
    if (info->classes && info->classes[j])
        return info->classes[j];
    snprintf(buf, 16, "%d", j);
    return buf;
}

/* An image folder's labels are its class folders' ranks in its own sorted
 * list, the model's those of the folder it trained on: map[i] is the
 * model's label of the folder's class i, by name, so a test folder with
 * some of the classes (only 'red') is scored against the right ones; *map
 * stays NULL when the lists are the same. A class folder the model does
 * not have is refused naming it, unless no folder name is a class name at
 * all and the counts agree (Fashion-MNIST exported as PNG folders for a
 * model trained on its IDX files): by position then, with a warning. */
static tp_status_t s_label_map(const char *data, const tp_zoo_data_t *info, int32_t **map) {
    *map = NULL;
    if (strncmp(data, "imagefolder:", 12))
        return TP_OK;
    tp_image_source_info_t si;
    tp_image_source_info_init(&si);
    tp_status_t rc = tp_image_source_info(data, &si);
    if (rc != TP_OK) {
        tp_image_source_info_fini(&si);
        return rc;
    }
    int32_t *m = calloc((size_t)si.nclasses + 1, sizeof *m);
    int same = si.nclasses == info->nclasses, known = 0, unknown = -1;
    char buf[16];
    for (int i = 0; m && i < si.nclasses; i++) {
        m[i] = -1;
        for (int j = 0; j < info->nclasses && m[i] < 0; j++)
            if (!strcmp(si.classes[i], s_class_name(info, j, buf)))
                m[i] = j;
        same &= m[i] == i;
        known += m[i] >= 0;
        if (m[i] < 0 && unknown < 0)
            unknown = i;
    }
    if (!m) {
        rc = tp_error(TP_ERR_NOMEM, "%s: the classes' map", data);
    } else if (same || (!known && si.nclasses == info->nclasses)) {
        if (!same)
            fprintf(stderr, "tp-predict: warning: no class folder of %s is named as a class "
                    "of the model (%s, %s, ...): labels taken by position\n", data,
                    s_class_name(info, 0, buf), info->nclasses > 1 ? info->classes ?
                    info->classes[1] : "1" : "");
        free(m);
        m = NULL;
    } else if (unknown >= 0) {
        char list[512] = "";
        for (int j = 0; j < info->nclasses && strlen(list) < sizeof list - 80; j++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", j ? ", " : "",
                     s_class_name(info, j, buf));
        rc = tp_error(TP_ERR_INVALID, "%s has a class folder '%s' that is not a class of the "
                      "model (%s%s): its labels would be wrong", data, si.classes[unknown],
                      list, strlen(list) >= sizeof list - 80 ? ", ..." : "");
        free(m);
        m = NULL;
    }
    tp_image_source_info_fini(&si);
    *map = m;
    return rc;
}

/* tp-train's sources, in file order, as a spec with the size (height x
 * width: resized to it) and the normalisation the model was trained with
 * (augmented models take float images). */
static tp_status_t s_spec(const s_args_t *a, const tp_zoo_data_t *info, int float_images,
                          int height, int width, char *buf, size_t size) {
    char norm[64] = "";
    if (float_images)
        snprintf(norm, sizeof norm, " | augment crop=%dx%d", height, width);
    if (a->spec) {
        snprintf(buf, size, "%s", a->spec);
        return TP_OK;
    }
    const char *d = a->data;
    char src[3584];
    if (!strncmp(d, "text:", 5))
        return tp_error(TP_ERR_INVALID, "'%s' is text (a gpt's data): tp-predict classifies "
                        "images (tp-generate --prompt continues a text)", d);
    if (info->channels == 3 || info->resize_short) {
        /* colour, or a centre crop: the run's validation chain */
        if (tp_zoo_eval_spec(d, info, height, width, src, sizeof src) != TP_OK)
            return tp_error(TP_ERR_INVALID, "%s (or --spec)", tp_last_error());
        snprintf(buf, size, "%s | batch %d remainder", src, a->batch);
        return TP_OK;
    }
    /* tp-train's names, read in file order (models.h) */
    if (tp_zoo_source_sized(strcmp(d, "fashion-mnist") ? d : "fashion-mnist:test", 1,
                            height, width, src, sizeof src) != TP_OK)
        return tp_error(TP_ERR_INVALID, "%s (or --spec)", tp_last_error());
    snprintf(buf, size, "%s%s | batch %d remainder", src, norm, a->batch);
    return TP_OK;
}

/* Softmax of one row of logits, then the k best (ties: lower class). */
static void s_top_k(const float *l, int nk, int k, int *cls, double *prob) {
    double mx = l[0], sum = 0, p[MAXCLS];
    for (int j = 1; j < nk; j++)
        mx = l[j] > mx ? l[j] : mx;
    for (int j = 0; j < nk; j++)
        sum += p[j] = exp((double)l[j] - mx);
    unsigned char used[MAXCLS] = {0};
    for (int t = 0; t < k; t++) {
        int best = -1;
        for (int j = 0; j < nk; j++)
            if (!used[j] && (best < 0 || l[j] > l[best]))
                best = j;
        used[best] = 1;
        cls[t] = best;
        prob[t] = p[best] / sum;
    }
}

/* The rows of one call: top-k, the tallies, the prediction lines. */
static tp_status_t s_rows(const s_args_t *a, const tp_zoo_data_t *info,
                          const tp_tensor_t *logits,
                          const int32_t *labels, int64_t first, FILE *out,
                          int jsonl, int *nk_p, int64_t **cm_p, int64_t *correct,
                          int64_t *correct5) {
    int64_t n = logits->shape[0];
    if (!*nk_p) {
        int nk = logits->ndim == 2 ? (int)logits->shape[1] : 0;
        if (nk < 1 || nk > MAXCLS)
            return tp_error(TP_ERR_SHAPE, "the model gives %d classes (1..%d)", nk, MAXCLS);
        if (!(*cm_p = calloc((size_t)nk * (size_t)nk, sizeof **cm_p)))
            return tp_error(TP_ERR_NOMEM, "confusion matrix");
        *nk_p = nk;
    }
    int nk = *nk_p;
    int64_t *cm = *cm_p;
    int k = a->top_k < nk ? a->top_k : nk;
    int k5 = nk < 5 ? nk : 5;
    for (int64_t r = 0; r < n; r++) {
        int cls[MAXK];
        double prob[MAXK];
        s_top_k((const float *)logits->data + r * nk, nk, k > k5 ? k : k5, cls, prob);
        int32_t y = labels ? labels[r] : -1;
        if (labels && y >= 0 && y < nk) {
            *correct += cls[0] == y;
            for (int t = 0; t < k5; t++)
                *correct5 += cls[t] == y;
            cm[(size_t)y * (size_t)nk + (size_t)cls[0]]++;
        }
        if (out && jsonl) {
            fprintf(out, "{\"index\": %lld, \"classes\": [", (long long)(first + r));
            for (int t = 0; t < k; t++)
                fprintf(out, "%s%d", t ? ", " : "", cls[t]);
            if (info->classes && info->nclasses == nk) {
                fprintf(out, "], \"names\": [");
                for (int t = 0; t < k; t++) {
                    json_t *js = json_string(info->classes[cls[t]]);
                    char *q = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
                    fprintf(out, "%s%s", t ? ", " : "", q ? q : "null");
                    free(q);
                    json_decref(js);
                }
            }
            fprintf(out, "], \"probs\": [");
            for (int t = 0; t < k; t++)
                fprintf(out, "%s%.6g", t ? ", " : "", prob[t]);
            fprintf(out, "]");
            if (a->logits) {
                fprintf(out, ", \"logits\": [");
                for (int j = 0; j < nk; j++)
                    fprintf(out, "%s%.9g", j ? ", " : "",
                            (double)((const float *)logits->data)[r * nk + j]);
                fprintf(out, "]");
            }
            if (labels)
                fprintf(out, ", \"label\": %d", y);
            fprintf(out, "}\n");
        } else if (out) {
            if (first + r == 0) {
                fprintf(out, "index");
                for (int t = 1; t <= k; t++)
                    fprintf(out, ",class%d,prob%d", t, t);
                fprintf(out, "%s", labels ? ",label" : "");
                for (int j = 0; a->logits && j < nk; j++)
                    fprintf(out, ",logit%d", j);
                fputc('\n', out);
            }
            fprintf(out, "%lld", (long long)(first + r));
            for (int t = 0; t < k; t++)
                fprintf(out, ",%d,%.6g", cls[t], prob[t]);
            if (labels)
                fprintf(out, ",%d", y);
            for (int j = 0; a->logits && j < nk; j++)
                fprintf(out, ",%.9g", (double)((const float *)logits->data)[r * nk + j]);
            fputc('\n', out);
        }
    }
    return TP_OK;
}

/* The confusion matrix as a picture: rows are the true class, columns the
 * prediction; a cell's shade is its share of the row. */
static tp_status_t s_draw(const char *path, const int64_t *cm, int nk,
                          double accuracy, const char *title) {
    const int cell = nk <= 10 ? 56 : 24, left = 90, top = 70;
    const int w = left + cell * nk + 30, h = top + cell * nk + 60;
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h);
    cairo_t *cr = cairo_create(sf);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                           CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_font_size(cr, 14);
    char text[256];
    snprintf(text, sizeof text, "%s: accuracy %.4f", title, accuracy);
    cairo_move_to(cr, 10, 22);
    cairo_show_text(cr, text);
    cairo_set_font_size(cr, 12);
    cairo_move_to(cr, left, top - 30);
    cairo_show_text(cr, "predicted class");
    cairo_move_to(cr, 10, top + cell * nk / 2.0);
    cairo_show_text(cr, "true class");
    for (int r = 0; r < nk; r++) {
        int64_t row = 0;
        for (int c = 0; c < nk; c++)
            row += cm[r * nk + c];
        for (int c = 0; c < nk; c++) {
            double share = row ? (double)cm[r * nk + c] / (double)row : 0;
            double x = left + c * cell, y = top + r * cell;
            if (r == c)
                cairo_set_source_rgb(cr, 1 - 0.8 * share, 1 - 0.45 * share, 1 - 0.8 * share);
            else
                cairo_set_source_rgb(cr, 1 - 0.2 * share * 4 > 0.2 ? 1 - 0.2 * share * 4 : 0.2,
                                     1 - share * 4 > 0.2 ? 1 - share * 4 : 0.2,
                                     1 - share * 4 > 0.2 ? 1 - share * 4 : 0.2);
            cairo_rectangle(cr, x, y, cell, cell);
            cairo_fill(cr);
            cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
            cairo_rectangle(cr, x, y, cell, cell);
            cairo_set_line_width(cr, 0.5);
            cairo_stroke(cr);
            if (nk <= 16) {
                cairo_set_source_rgb(cr, 0, 0, 0);
                snprintf(text, sizeof text, "%lld", (long long)cm[r * nk + c]);
                cairo_text_extents_t ext;
                cairo_text_extents(cr, text, &ext);
                cairo_move_to(cr, x + (cell - ext.width) / 2, y + cell / 2.0 + 4);
                cairo_show_text(cr, text);
            }
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(text, sizeof text, "%d", r);
        cairo_move_to(cr, left - 18, top + r * cell + cell / 2.0 + 4);
        cairo_show_text(cr, text);
        cairo_move_to(cr, left + r * cell + cell / 2.0 - 4, top - 8);
        cairo_show_text(cr, text);
    }
    cairo_destroy(cr);
    cairo_surface_flush(sf);
    FILE *f = fopen(path, "wb");
    int err = errno;
    cairo_status_t st = CAIRO_STATUS_WRITE_ERROR;
    if (f) {
        errno = 0;
        st = cairo_surface_write_to_png_stream(sf, s_png_write, f);
        err = errno;
        if (fclose(f) != 0 && st == CAIRO_STATUS_SUCCESS) {
            st = CAIRO_STATUS_WRITE_ERROR;
            err = errno;
        }
    }
    cairo_surface_destroy(sf);
    /* cairo and fontconfig keep caches for the process: give them back, so
     * a leak checker sees only real leaks */
    cairo_debug_reset_static_data();
    FcFini();
    if (st != CAIRO_STATUS_SUCCESS)
        return tp_error(TP_ERR_IO, "cannot write %s: %s", path,
                        st == CAIRO_STATUS_WRITE_ERROR && err ? strerror(err)
                                                              : cairo_status_to_string(st));
    return TP_OK;
}

int main(int argc, char **argv) {
    s_args_t a = {.top_k = 1, .batch = 256, .bf16 = -1};
    static const struct option opts[] = {
        {"load", required_argument, NULL, 'l'}, {"model", required_argument, NULL, 'm'},
        {"data", required_argument, NULL, 'd'}, {"spec", required_argument, NULL, 's'},
        {"output", required_argument, NULL, 'o'}, {"json", no_argument, NULL, 'j'},
        {"top-k", required_argument, NULL, 'k'}, {"batch", required_argument, NULL, 'b'},
        {"confusion", required_argument, NULL, 'c'},
        {"threads", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
        {"logits", no_argument, NULL, 'g'}, {"bf16", no_argument, NULL, 'f'},
        {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'l': a.load = optarg; break;
        case 'm': a.model = optarg; break;
        case 'd': a.data = optarg; break;
        case 's': a.spec = optarg; break;
        case 'o': a.output = optarg; break;
        case 'j': a.json = 1; break;
        case 'k': if (s_int_flag("--top-k", optarg, 1, MAXK, &a.top_k)) return 2; break;
        case 'b': if (s_int_flag("--batch", optarg, 1, 65536, &a.batch)) return 2; break;
        case 'c': a.confusion = optarg; break;
        case 't': if (s_int_flag("--threads", optarg, 0, 4096, &a.threads)) return 2; break;
        case 'g': a.logits = 1; break;
        case 'f': a.bf16 = 1; break;
        case 'h': fputs(s_usage, stdout); return 0;
        default: fputs(s_usage, stderr); return 2;
        }
    }
    if (optind < argc || !a.load || (!a.data && !a.spec)) {
        fprintf(stderr, "tp-predict: %s\n%s", optind < argc ? "unexpected argument"
                : !a.load ? "--load is required" : "--data (or --spec) is required",
                s_usage);
        return 2;
    }
    tp_log_set_level(TP_LOG_WARN);
    if (a.confusion && strcmp(a.confusion, "none") && s_can_write(a.confusion) != TP_OK)
        return s_fail("--confusion");

    /* the checkpoint and the model it records: an image classifier's */
    char ckpt[4096];
    if (s_classifier_only(a.load) != TP_OK)
        return s_fail("--load");
    tp_input_desc_t inputs[2];
    const tp_zoo_model_t *zoo = tp_zoo_from_checkpoint(a.load, a.model, ckpt, sizeof ckpt,
                                                       inputs);
    if (!zoo)
        return s_fail("--load");
    const char *name = zoo->name;
    /* the confusion picture's path: --confusion's (checked above), else
     * beside the checkpoint, where a folder this process cannot write in
     * (someone else's run, a read-only mount) draws none, said now: the
     * pass's results were lost to a failure after it */
    char png[4200] = "";
    if (a.confusion && strcmp(a.confusion, "none")) {
        snprintf(png, sizeof png, "%s", a.confusion);
    } else if (!a.confusion) {
        snprintf(png, sizeof png, "%s", ckpt);
        char *ext = strstr(png, ".safetensors");
        if (!ext)
            ext = png + strlen(png);
        snprintf(ext, sizeof png - (size_t)(ext - png), ".confusion.png");
        if (s_can_write(png) != TP_OK) {
            fprintf(stderr, "tp-predict: warning: no confusion picture: %s (--confusion PNG "
                    "puts it elsewhere)\n", tp_last_error());
            png[0] = '\0';
        }
    }
    /* the classes and the normalisation the run recorded (data.json, or the
     * checkpoint's metadata) */
    tp_zoo_data_t info;
    tp_zoo_data_init(&info);
    int have_info = 0;
    if (tp_zoo_data_load(ckpt, &info, &have_info) != TP_OK)
        return s_fail("--load");
    if (inputs[0].ndim == 4 && info.channels != 3) {
        tp_zoo_data_fini(&info);
        tp_error(TP_ERR_FORMAT, "%s is a colour model but neither a data.json beside it "
                 "nor its metadata records the normalisation (tp-train writes "
                 "both)", ckpt);
        return s_fail("--load");
    }
    tpp_zoo_model_t keep;  /* normalises if the run did in-model */
    tp_predictor_t *pred = tpp_zoo_predictor_new(&keep, zoo, inputs, &info, ckpt, a.batch,
                                                 a.threads, a.bf16);
    if (!pred) {
        tp_zoo_data_fini(&info);
        return s_fail("loading the model");
    }

    /* what the predictor's products ran on (--bf16 on a CPU without it
     * warned, and runs fp32) */
    const int bf16_on = tp_backend_cpu_bf16_ask(-1);
    char spec[4096];
    tp_dataflow_t *df = NULL;
    /* the size the checkpoint records (tp-train --image-size) */
    int nd = inputs[0].ndim;
    if (s_spec(&a, &info, inputs[0].dtype == TP_FLOAT32, (int)inputs[0].shape[nd - 2],
               (int)inputs[0].shape[nd - 1], spec, sizeof spec) < 0 ||
        tp_spec_parse(spec, &df) < 0 || tp_dataflow_reset_state(df, 0, 0) < 0) {
        tp_zoo_data_fini(&info);
        tp_predictor_destroy(&pred);
        tp_dataflow_destroy(&df);
        return s_fail("--data");
    }

    FILE *out = NULL;
    int jsonl = 0;
    if (a.output) {
        const char *dot = strrchr(a.output, '.');
        jsonl = dot && (!strcasecmp(dot, ".jsonl") || !strcasecmp(dot, ".json"));
        out = fopen(a.output, "w");
        if (!out) {
            tp_error(TP_ERR_IO, "cannot write %s: %s", a.output, strerror(errno));
            tp_zoo_data_fini(&info);
            tp_predictor_destroy(&pred);
            tp_dataflow_destroy(&df);
            return s_fail("--output");
        }
    }

    /* the folder's labels as the model's, by class name */
    int32_t *label_map = NULL, *mapped = NULL;
    if (!a.spec && s_label_map(a.data, &info, &label_map) != TP_OK) {
        tp_zoo_data_fini(&info);
        tp_predictor_destroy(&pred);
        tp_dataflow_destroy(&df);
        if (out)
            fclose(out);
        return s_fail("--data");
    }
    int nk = 0, have_labels = -1;
    int64_t samples = 0, correct = 0, correct5 = 0, *cm = NULL, batches = 0;
    double busy = 0, t0 = tp_now_s();
    tp_datapoint_t *dp = NULL;
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, &dp)) == TP_OK) {
        int ncomp = tp_datapoint_size(dp);
        if (have_labels < 0)
            have_labels = ncomp >= 2;
        const tp_tensor_t *img = ncomp >= 1 ? tp_datapoint_cget(dp, 0) : NULL;
        if (!img || img->ndim < 1) {
            rc = tp_error(TP_ERR_SHAPE, "batch %lld: no image component", (long long)batches);
            tp_datapoint_destroy(&dp);
            break;
        }
        int64_t n = img->shape[0];
        const tp_tensor_t *lab = have_labels ? tp_datapoint_cget(dp, 1) : NULL;
        if (lab && (lab->dtype != TP_INT32 || lab->ndim != 1 || lab->shape[0] != n)) {
            rc = tp_error(TP_ERR_SHAPE, "batch %lld: component 1 is not int32 "
                          "labels of %lld rows", (long long)batches, (long long)n);
            tp_datapoint_destroy(&dp);
            break;
        }
        const int32_t *labels = lab ? (const int32_t *)lab->data : NULL;
        if (labels && label_map) {
            int32_t *grown = realloc(mapped, (size_t)(n > 0 ? n : 1) * sizeof *mapped);
            if (!grown) {
                rc = tp_error(TP_ERR_NOMEM, "batch %lld: %lld labels", (long long)batches,
                              (long long)n);
                tp_datapoint_destroy(&dp);
                break;
            }
            mapped = grown;
            for (int64_t r = 0; r < n; r++)  /* the folder's own labels: 0..nclasses-1 */
                mapped[r] = label_map[labels[r]];
            labels = mapped;
        }
        /* a spec's batches may be larger than the predictor's: in slices */
        size_t row_bytes = n > 0 ? img->nbytes / (size_t)n : 0;
        for (int64_t off = 0; off < n && rc == TP_OK; off += a.batch) {
            int64_t m = n - off < a.batch ? n - off : a.batch;
            int64_t shape[TP_MAX_DIMS];
            memcpy(shape, img->shape, sizeof shape);
            shape[0] = m;
            tp_tensor_t view, logits;
            tp_tensor_init_wrap(&view, img->dtype, img->ndim, shape,
                                (char *)img->data + (size_t)off * row_bytes, NULL, NULL);
            double s0 = tp_now_s();
            rc = tp_predictor_run(pred, &view, &logits);
            busy += tp_now_s() - s0;
            if (rc < 0) {
                tp_error_wrap(rc, "batch %lld (rows from %lld)", (long long)batches,
                              (long long)(samples + off));
                break;
            }
            rc = s_rows(&a, &info, &logits, labels ? labels + off : NULL,
                        samples + off, out, jsonl, &nk, &cm, &correct, &correct5);
            tp_tensor_fini(&logits);
        }
        if (rc < 0) {
            tp_datapoint_destroy(&dp);
            break;
        }
        samples += n;
        batches++;
        tp_datapoint_destroy(&dp);
    }
    double wall = tp_now_s() - t0;
    free(label_map);
    free(mapped);
    tp_dataflow_destroy(&df);
    tp_predictor_destroy(&pred);
    if (out && fclose(out) != 0 && rc == TP_DONE)
        rc = tp_error(TP_ERR_IO, "writing %s", a.output);
    if (rc != TP_DONE) {
        free(cm);
        tp_zoo_data_fini(&info);
        return s_fail("predicting");
    }
    if (samples == 0) {
        free(cm);
        tp_zoo_data_fini(&info);
        tp_error(TP_ERR_INVALID, "the data (%s) gave no rows", spec);
        return s_fail("--data");
    }
    double accuracy = have_labels ? (double)correct / (double)samples : NAN;
    double top5 = have_labels && nk > 5 ? (double)correct5 / (double)samples : NAN;
    /* the names of the model's classes (numbers when the run recorded none,
     * or recorded another count) */
    char num[16];
    #define S_NAME(c) (info.classes && info.nclasses == nk ? info.classes[c] \
                       : (snprintf(num, sizeof num, "%d", (c)), num))
    double rate = busy > 0 ? (double)samples / busy : 0;

    /* the picture; one of more than 64 classes is unreadable: the JSON
     * has it */
    if (!have_labels || nk > 64)
        png[0] = '\0';
    if (png[0]) {
        char title[128];
        snprintf(title, sizeof title, "%s, %lld images", name, (long long)samples);
        if (s_draw(png, cm, nk, accuracy, title) < 0) {
            free(cm);
            tp_zoo_data_fini(&info);
            return s_fail("--confusion");
        }
    }

    if (a.json) {
        json_t *j = json_object();
        json_object_set_new(j, "checkpoint", json_string(ckpt));
        json_object_set_new(j, "model", json_string(name));
        json_object_set_new(j, "data", json_string(spec));
        json_object_set_new(j, "samples", json_integer(samples));
        json_object_set_new(j, "samples_per_s", json_real(rate));
        json_object_set_new(j, "wall_s", json_real(wall));
        json_object_set_new(j, "bf16", json_boolean(bf16_on));
        json_t *names = json_array();
        for (int c2 = 0; c2 < nk; c2++)
            json_array_append_new(names, json_string(S_NAME(c2)));
        json_object_set_new(j, "classes", names);
        if (have_labels) {
            json_object_set_new(j, "accuracy", json_real(accuracy));
            json_object_set_new(j, "correct", json_integer(correct));
            if (nk > 5)
                json_object_set_new(j, "top5_accuracy", json_real(top5));
            json_t *pca = json_array(), *conf = json_array();
            for (int r = 0; r < nk; r++) {
                int64_t row = 0;
                json_t *jr = json_array();
                for (int c2 = 0; c2 < nk; c2++) {
                    row += cm[r * nk + c2];
                    json_array_append_new(jr, json_integer(cm[r * nk + c2]));
                }
                json_array_append_new(conf, jr);
                json_array_append_new(pca, row ? json_real((double)cm[r * nk + r] / (double)row)
                                               : json_null());
            }
            json_object_set_new(j, "per_class_accuracy", pca);
            json_object_set_new(j, "confusion", conf);
            if (png[0])
                json_object_set_new(j, "confusion_png", json_string(png));
        } else {
            json_object_set_new(j, "accuracy", json_null());
        }
        if (a.output)
            json_object_set_new(j, "output", json_string(a.output));
        char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
        printf("%s\n", text ? text : "{}");
        free(text);
        json_decref(j);
    } else {
        printf("tp-predict: model %s, checkpoint %s\n", name, ckpt);
        printf("  data: %s\n", spec);
        if (bf16_on)  /* --bf16 or $TP_CPU_BF16, on a CPU that has it */
            printf("  bf16: the CPU's matrix products on bf16 operands, fp32 sums; its "
                   "direct convolutions on bf16 inputs\n");
        printf("  samples: %lld, %.0f samples/s in the model (%.2f s), %.2f s in all\n",
               (long long)samples, rate, busy, wall);
        if (have_labels) {
            printf("  accuracy: %.4f (%lld of %lld)\n", accuracy, (long long)correct,
                   (long long)samples);
            if (nk > 5)
                printf("  top-5 accuracy: %.4f (%lld of %lld)\n", top5,
                       (long long)correct5, (long long)samples);
            printf("  per class:");
            for (int r = 0; r < nk; r++) {
                int64_t row = 0;
                for (int c2 = 0; c2 < nk; c2++)
                    row += cm[r * nk + c2];
                if (row)
                    printf(" %d:%.3f", r, (double)cm[r * nk + r] / (double)row);
                else  /* no image of the class (a folder of some classes): --json's null */
                    printf(" %d:-", r);
            }
            printf("\n  classes:");
            for (int r = 0; r < nk; r++)
                printf(" %d=%s", r, S_NAME(r));
            printf("\n  confusion (rows: true class, columns: predicted):\n        ");
            for (int c2 = 0; c2 < nk; c2++)
                printf("%6d", c2);
            printf("\n");
            for (int r = 0; r < nk; r++) {
                printf("  %4d  ", r);
                for (int c2 = 0; c2 < nk; c2++)
                    printf("%6lld", (long long)cm[r * nk + c2]);
                printf("\n");
            }
            if (png[0])
                printf("  confusion matrix image: %s\n", png);
        } else {
            printf("  no labels in the data: no accuracy\n");
        }
        if (a.output)
            printf("  predictions: %s\n", a.output);
    }
    free(cm);
    tp_zoo_data_fini(&info);
    return 0;
}
