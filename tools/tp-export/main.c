/* tp-export: a trained model as an ONNX file.
 *
 *   tp-export --load CHECKPOINT|LOGDIR [--model NAME] --onnx FILE
 *             [--output NAME]...
 *
 * The graph is the model's inference graph from the image to the logits
 * (and their softmax, "probabilities"): convolutions, batch norm on its
 * moving averages, pooling, dense layers; dropout is gone. The input
 * "image" keeps the dtype and size the model was trained on, as the
 * checkpoint records them (uint8 [batch,28,28] by default, [batch,32,32]
 * after tp-train --image-size 32; float32 for models trained on augmented
 * images) with a symbolic batch dimension. A colour model's input is
 * float32 [batch,3,H,W], RGB, pixels in [0, 1]: the per-channel
 * normalisation the run used (data.json beside the checkpoint, or the
 * checkpoint's metadata) is inside
 * the file. The class names, in label order, go beside it (FILE.classes.txt,
 * one a line) and into the model's metadata_props ("classes": one name a
 * line; also "channels", "colour", "layout", "input_range", "mean", "std"). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>

static const char *s_usage =
"usage: tp-export --load CHECKPOINT|LOGDIR --onnx FILE [options]\n"
"  --load PATH      a checkpoint, or a log directory (its latest checkpoint)\n"
"  --model NAME     mlp, cnn, cnn-bn, resnet, resnet18, resnet50 (default:\n"
"                   the one the\n"
"                   checkpoint records)\n"
"  --onnx FILE      where the ONNX model goes\n"
"  --output NAME    an output of the graph to export (repeatable;\n"
"                   default: logits)\n";

/* TP_OK unless the checkpoint `load` names records a gpt or a GAN: the
 * export writes an image classifier's graph (image in, logits out), and
 * neither has one; refused by name before the model is built (whose own
 * error, about the inputs' shapes, would not say it). */
static tp_status_t s_classifier_only(const char *load) {
    char path[4096];
    tp_checkpoint_info_t ti;
    if (tp_checkpoint_resolve(load, path, sizeof path) != TP_OK ||
        tp_checkpoint_info(path, &ti) != TP_OK)
        return TP_OK;  /* tp_zoo_from_checkpoint reports it */
    if (!strcmp(ti.model, "gpt") || tp_zoo_find_gan(ti.model))
        return tp_error(TP_ERR_UNSUPPORTED, "%s holds model '%s' (%s): tp-export writes an "
                        "image classifier's ONNX file (image in, logits out) and has no "
                        "export for it%s", path, ti.model,
                        strcmp(ti.model, "gpt") ? "a GAN" : "a language model",
                        strcmp(ti.model, "gpt") ? "; tp-generate draws its samples"
                                                : "; tp-generate continues a text with it");
    return TP_OK;
}

static int s_fail(const char *what) {
    fprintf(stderr, "tp-export: %s: %s\n", what, tp_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *load = NULL, *model = NULL, *onnx = NULL;
    const char *outs[TP_PREDICT_MAX_IO];
    int nout = 0;
    static const struct option opts[] = {
        {"load", required_argument, NULL, 'l'}, {"model", required_argument, NULL, 'm'},
        {"onnx", required_argument, NULL, 'o'}, {"output", required_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'l': load = optarg; break;
        case 'm': model = optarg; break;
        case 'o': onnx = optarg; break;
        case 'u':
            if (nout == TP_PREDICT_MAX_IO) {
                fprintf(stderr, "tp-export: at most %d --output\n", TP_PREDICT_MAX_IO);
                return 2;
            }
            outs[nout++] = optarg;
            break;
        case 'h': fputs(s_usage, stdout); return 0;
        default: fputs(s_usage, stderr); return 2;
        }
    }
    if (optind < argc || !load || !onnx) {
        fprintf(stderr, "tp-export: %s\n%s", optind < argc ? "unexpected argument"
                : !load ? "--load is required" : "--onnx is required", s_usage);
        return 2;
    }
    if (!nout)
        outs[nout++] = "logits";
    tp_log_set_level(TP_LOG_WARN);
    char ckpt[4096];
    if (s_classifier_only(load) != TP_OK)
        return s_fail("--load");
    tp_input_desc_t inputs[2];
    const tp_zoo_model_t *zoo = tp_zoo_from_checkpoint(load, model, ckpt, sizeof ckpt, inputs);
    if (!zoo)
        return s_fail("--load");
    const char *name = zoo->name;
    tp_zoo_data_t info;
    tp_zoo_data_init(&info);
    int have_info = 0;
    if (tp_zoo_data_load(ckpt, &info, &have_info) != TP_OK)
        return s_fail("--load");
    int colour = inputs[0].ndim == 4;
    if (colour && info.channels != 3) {
        tp_zoo_data_fini(&info);
        tp_error(TP_ERR_FORMAT, "%s is a colour model but neither a data.json beside it "
                 "nor its metadata records the normalisation (tp-train writes "
                 "both)", ckpt);
        return s_fail("--load");
    }
    /* colour, and grey trained through the augmentor: the file takes
     * float32 in [0, 1] and the graph's own first ops normalise (the
     * model's, tp_zoo_options_t.data), whether the run normalised in the
     * model (uint8 images) or in its pipeline (float32 images) */
    if (colour || info.in_model) {
        info.in_model = 1;
        inputs[0].dtype = TP_FLOAT32;
    }
    tp_zoo_options_t zo = {.classes = info.nclasses, .data = &info};
    tp_model_desc_t desc = {inputs, 2, zoo->build, NULL, &zo};
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    pc.model = &desc;
    pc.checkpoint = ckpt;
    pc.output_names = outs;
    pc.noutput_names = nout;
    pc.max_batch = 1;  /* only the graph is wanted: the smallest buffers */
    tp_predictor_t *p = tp_predictor_new(&pc);
    if (!p) {
        tp_zoo_data_fini(&info);
        return s_fail("loading the model");
    }
    if (!tp_model_name(tp_predictor_model(p)))
        tp_model_set_name(tp_predictor_model(p), name);
    /* the metadata: the class names one a line, the input's meaning */
    size_t cap = 64;
    for (int i = 0; i < info.nclasses; i++)
        cap += (info.classes ? strlen(info.classes[i]) : 12) + 1;
    char *classes = malloc(cap), mean[96] = "", std[96] = "", chans[8];
    size_t off = 0;
    for (int i = 0; classes && i < info.nclasses; i++) {
        if (info.classes)
            off += (size_t)snprintf(classes + off, cap - off, "%s\n", info.classes[i]);
        else
            off += (size_t)snprintf(classes + off, cap - off, "%d\n", i);
    }
    if (classes)
        classes[off] = '\0';
    for (int c = 0, om = 0, os = 0; c < info.nnorm; c++) {
        om += snprintf(mean + om, sizeof mean - (size_t)om, "%s%g", c ? "," : "", info.mean[c]);
        os += snprintf(std + os, sizeof std - (size_t)os, "%s%g", c ? "," : "", info.std[c]);
    }
    snprintf(chans, sizeof chans, "%d", colour ? 3 : 1);
    const char *keys[] = {"classes", "channels", "colour", "layout", "input_range", "mean", "std"};
    const char *vals[] = {classes ? classes : "", chans, colour ? "RGB" : "grey",
                          colour ? "NCHW" : "NHW",
                          colour || inputs[0].dtype == TP_FLOAT32 ? "[0, 1]" : "[0, 255] uint8",
                          mean, std};
    tp_onnx_export_opts_t eo = {7, keys, vals};
    tp_status_t rc = tp_predictor_export_onnx_opts(p, onnx, &eo);
    tp_predictor_destroy(&p);
    if (rc == TP_OK) {
        /* the names beside the file: FILE.classes.txt */
        char path[4200];
        snprintf(path, sizeof path, "%s.classes.txt", onnx);
        rc = classes ? tp_file_write_atomic(path, classes, off)
                     : tp_error(TP_ERR_NOMEM, "class names");
    }
    free(classes);
    int nclasses = info.nclasses;
    tp_zoo_data_fini(&info);
    if (rc < 0)
        return s_fail("--onnx");
    int nd = inputs[0].ndim;
    printf("tp-export: %s (%s) -> %s (ONNX, opset 13, input image %s[batch,%s%lld,%lld]%s; "
           "%d classes, %s.classes.txt)\n", ckpt, name, onnx, tp_dtype_name(inputs[0].dtype),
           colour ? "3," : "", (long long)inputs[0].shape[nd - 2],
           (long long)inputs[0].shape[nd - 1], colour ? " RGB in [0, 1], normalised inside" : "",
           nclasses, onnx);
    return 0;
}
