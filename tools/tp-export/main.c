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
 * images) with a symbolic batch dimension. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>

static const char *s_usage =
"usage: tp-export --load CHECKPOINT|LOGDIR --onnx FILE [options]\n"
"  --load PATH      a checkpoint, or a log directory (its latest checkpoint)\n"
"  --model NAME     mlp, cnn, cnn-bn, resnet (default: the one the\n"
"                   checkpoint records)\n"
"  --onnx FILE      where the ONNX model goes\n"
"  --output NAME    an output of the graph to export (repeatable;\n"
"                   default: logits)\n";

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
    tp_input_desc_t inputs[2];
    const tp_zoo_model_t *zoo = tp_zoo_from_checkpoint(load, model, ckpt, sizeof ckpt, inputs);
    if (!zoo)
        return s_fail("--load");
    const char *name = zoo->name;
    tp_model_desc_t desc = {inputs, 2, zoo->build, NULL, NULL};
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    pc.model = &desc;
    pc.checkpoint = ckpt;
    pc.output_names = outs;
    pc.noutput_names = nout;
    pc.max_batch = 1;  /* only the graph is wanted: the smallest buffers */
    tp_predictor_t *p = tp_predictor_new(&pc);
    if (!p)
        return s_fail("loading the model");
    if (!tp_model_name(tp_predictor_model(p)))
        tp_model_set_name(tp_predictor_model(p), name);
    tp_status_t rc = tp_predictor_export_onnx(p, onnx);
    tp_predictor_destroy(&p);
    if (rc < 0)
        return s_fail("--onnx");
    printf("tp-export: %s (%s) -> %s (ONNX, opset 13, input image %s[batch,%lld,%lld])\n",
           ckpt, name, onnx, tp_dtype_name(inputs[0].dtype), (long long)inputs[0].shape[1],
           (long long)inputs[0].shape[2]);
    return 0;
}
