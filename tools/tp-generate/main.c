/* tp-generate: samples from a trained generator (a GAN of the zoo,
 * tp-train --model dcgan), the way tp-predict runs a predictor:
 *
 *   tp-generate --load train_log/dcgan --count 1000 --output samples.npy
 *   tp-generate --load model-9380.safetensors --count 64 --output s.npy --png grid.png
 *
 * The noise is the GAN trainer's (tp_gan_noise_fill, uniform in [-1, 1],
 * of the step -1 no run trains, seeded by --seed): with --seed the run's
 * seed and --count 64 it is the batch tp-train's sample grids draw, so
 * --png reproduces the run's last LOGDIR/samples-EPOCH.png. The samples
 * (the generator's tanh output in [-1, 1]) are written as uint8 0..255,
 * NumPy's .npy of shape [N, H, W] (grey) or [N, H, W, 3] (colour: a run on
 * cifar: or a colour imagefolder:, RGB, channels last as image files
 * have them); the generator's channels and size are the image input the
 * checkpoint records.
 *
 * A GPT checkpoint (tp-train --model gpt) continues a prompt instead
 * (tools/tp-generate/text.c, each token one position of a cache of keys and
 * values: models/zoo_gpt_decode.c; --no-cache for the whole-window path;
 * bytes, or GPT-2 BPE through the tokenizer the checkpoint names):
 *
 *   tp-generate --load train_log/gpt --prompt "Once upon" --tokens 200 --top-k 40 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/backend.h>
#include <towerpack/fileio.h>
#include <towerpack/gan.h>
#include <towerpack/image.h>
#include <towerpack/log.h>
#include <towerpack/models.h>
#include <towerpack/predict.h>
#include "tools/tp-generate/text.h"

static void s_usage(FILE *out) {
    fprintf(out,
"usage: tp-generate --load LOGDIR|CKPT --count N --output FILE.npy [options]\n"
"Draw N samples from a generator trained by tp-train (--model dcgan).\n\n"
"  --load PATH      a checkpoint, or a log directory (its latest checkpoint)\n"
"  --count N        samples to draw (1..1000000)\n"
"  --output FILE    a NumPy .npy file (the name must end .npy): uint8\n"
"                   [N, H, W] (grey) or [N, H, W, 3] (colour, RGB), 0..255\n"
"  --png FILE       also the samples as one grid image (PNG, grey or RGB),\n"
"                   as tp-train's LOGDIR/samples-EPOCH.png\n"
"  --seed S         the noise's seed, 0 or more (default 1, tp-train's\n"
"                   default --seed)\n"
"  --model NAME     the generator (default: what the checkpoint records)\n"
"  --bf16           the CPU's matrix products, direct convolutions and\n"
"                   attention tile products on bf16 operands with fp32 sums\n"
"                   (as tp-train --bf16; a warning, and\n"
"                   fp32, where the CPU lacks bf16; default: $TP_CPU_BF16)\n"
"  -h, --help\n\n"
"usage: tp-generate --load LOGDIR|CKPT --prompt TEXT --tokens N [options]\n"
"Continue TEXT by N tokens with a GPT trained by tp-train --model gpt; print\n"
"the prompt and the continuation. Tokens are bytes, or GPT-2 BPE tokens for a\n"
"checkpoint trained on text:FILE,vocab=...,merges=... (the tokenizer is read\n"
"from the files its metadata names).\n\n"
"  --prompt TEXT    the text to continue (default: a newline)\n"
"  --tokens N       tokens to generate (1..1000000; default 200)\n"
"  --temperature T  divide the logits by T >= 0 before sampling (default 1;\n"
"                   0: always the likeliest token)\n"
"  --top-k K        sample among the K likeliest tokens only (0..1000000;\n"
"                   default 0: all)\n"
"  --vocab FILE     a BPE checkpoint's tokenizer: encoder.json (or a\n"
"                   .tiktoken file alone) instead of the file it names\n"
"  --merges FILE    and vocab.bpe instead of the one it names\n"
"  --seed S         the sampler's seed, 0 or more (default 1)\n"
"  --output FILE    also write the prompt and the continuation to FILE\n"
"  --no-cache       run the whole model over the last T tokens for every\n"
"                   token (the reference; by default a cache of keys and\n"
"                   values makes each token cost one position, and past the\n"
"                   context T the cache is refilled from the last T/2)\n"
"  --bf16           as for images: the GPT's products on bf16 operands\n");
}

static int s_fail(const char *what) {
    fprintf(stderr, "tp-generate: %s: %s\n", what, tp_last_error());
    return 1;
}

/* img uint8 [N*H, W, C] (the images stacked) as a .npy file of shape
 * [n, h, w] (c 1: grey) or [n, h, w, c] (format 1.0: the header padded to
 * 64 bytes with spaces). */
static tp_status_t s_write_npy(const char *path, const uint8_t *data, int64_t n, int64_t h,
                               int64_t w, int64_t c) {
    char head[256], dims[96];  /* the header is at most 192 bytes */
    if (c == 1)
        snprintf(dims, sizeof dims, "%lld, %lld, %lld", (long long)n, (long long)h,
                 (long long)w);
    else
        snprintf(dims, sizeof dims, "%lld, %lld, %lld, %lld", (long long)n, (long long)h,
                 (long long)w, (long long)c);
    int len = snprintf(head + 10, sizeof head - 10,
                       "{'descr': '|u1', 'fortran_order': False, 'shape': (%s), }", dims);
    size_t total = 10 + (size_t)len + 1, padded = (total + 63) / 64 * 64;
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    size_t hlen = padded - 10;
    head[8] = (char)(hlen & 0xff);
    head[9] = (char)(hlen >> 8);
    memset(head + 10 + len, ' ', padded - 10 - (size_t)len - 1);
    head[padded - 1] = '\n';
    size_t body = (size_t)(n * h * w * c);
    uint8_t *buf = malloc(padded + body);
    if (!buf)
        return tp_error(TP_ERR_NOMEM, "%s: %zu bytes", path, padded + body);
    memcpy(buf, head, padded);
    memcpy(buf + padded, data, body);
    tp_status_t rc = tp_file_write_atomic(path, buf, padded + body);
    free(buf);
    return rc;
}

int main(int argc, char **argv) {
    const char *load = NULL, *output = NULL, *png = NULL, *model = NULL;
    long long count = 0, seed = 1;
    enum { O_LOAD = 256, O_COUNT, O_OUTPUT, O_PNG, O_SEED, O_MODEL, O_PROMPT, O_TOKENS,
           O_TEMPERATURE, O_TOP_K, O_NO_CACHE, O_VOCAB, O_MERGES, O_BF16 };
    /* a GPT's text (text.c): any of these flags, or a gpt checkpoint */
    tp_gen_text_t text = {.tokens = 200, .temperature = 1.0};
    int text_flags = 0, bf16 = -1;
    char text_flag[32] = "";  /* the first of them given, for messages */
    static const struct option opts[] = {
        {"load", required_argument, 0, O_LOAD},     {"count", required_argument, 0, O_COUNT},
        {"output", required_argument, 0, O_OUTPUT}, {"png", required_argument, 0, O_PNG},
        {"seed", required_argument, 0, O_SEED},     {"model", required_argument, 0, O_MODEL},
        {"prompt", required_argument, 0, O_PROMPT}, {"tokens", required_argument, 0, O_TOKENS},
        {"temperature", required_argument, 0, O_TEMPERATURE},
        {"top-k", required_argument, 0, O_TOP_K},
        {"no-cache", no_argument, 0, O_NO_CACHE},
        {"vocab", required_argument, 0, O_VOCAB},   {"merges", required_argument, 0, O_MERGES},
        {"bf16", no_argument, 0, O_BF16},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
    int c, li = -1;
    while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        char *end = NULL;
        if (c >= O_PROMPT && c <= O_MERGES) {  /* a text flag: the gpt's path */
            text_flags = 1;
            if (!text_flag[0])
                snprintf(text_flag, sizeof text_flag, "--%s", opts[li].name);
        }
        switch (c) {
        case O_LOAD: load = optarg; break;
        case O_OUTPUT: output = optarg; break;
        case O_PNG: png = optarg; break;
        case O_MODEL: model = optarg; break;
        case O_COUNT:
            count = strtoll(optarg, &end, 10);
            if (*end || count < 1 || count > 1000000) {
                fprintf(stderr, "tp-generate: --count '%s': 1..1000000\n", optarg);
                return 2;
            }
            break;
        case O_SEED:
            seed = strtoll(optarg, &end, 10);
            if (*end || !*optarg || seed < 0) {  /* tp-train's --seed: 0 and up */
                fprintf(stderr, "tp-generate: --seed '%s': an integer >= 0\n", optarg);
                return 2;
            }
            break;
        case O_PROMPT:
            text.prompt = optarg;
            break;
        case O_TOKENS:
            text.tokens = strtol(optarg, &end, 10);
            if (*end || !*optarg || text.tokens < 1 || text.tokens > 1000000) {
                fprintf(stderr, "tp-generate: --tokens '%s': 1..1000000\n", optarg);
                return 2;
            }
            break;
        case O_TEMPERATURE:
            text.temperature = strtod(optarg, &end);
            if (*end || !*optarg || !(text.temperature >= 0 && text.temperature < 1e6)) {
                fprintf(stderr, "tp-generate: --temperature '%s': a number >= 0\n", optarg);
                return 2;
            }
            break;
        case O_TOP_K:
            text.top_k = (int)strtol(optarg, &end, 10);
            /* 0: all, as tp-train's --sample-top-k */
            if (*end || !*optarg || text.top_k < 0 || text.top_k > 1000000) {
                fprintf(stderr, "tp-generate: --top-k '%s': 0..1000000 (0: all)\n", optarg);
                return 2;
            }
            break;
        case O_NO_CACHE:
            text.no_cache = 1;
            break;
        case O_VOCAB:
            text.vocab = optarg;
            break;
        case O_MERGES:
            text.merges = optarg;
            break;
        case O_BF16:
            bf16 = 1;
            break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    /* --load resolved and read once; a failure's message stays the last
     * error until the path that reports it (nothing between sets one) */
    char path[4096];
    tp_checkpoint_info_t ti;
    const int resolved = load && tp_checkpoint_resolve(load, path, sizeof path) == TP_OK;
    const int have_info = resolved && tp_checkpoint_info(path, &ti) == TP_OK;
    const int known = have_info && ti.model[0];  /* the checkpoint names its model */
    int gpt = text_flags || (model && !strcmp(model, "gpt"));
    /* a gpt checkpoint takes the text path with no text flag too (its
     * failures to resolve or read are the image path's to report) */
    if (!gpt && !model && optind == argc && have_info && !strcmp(ti.model, "gpt"))
        gpt = 1;
    if (optind == argc && load && gpt) {
        /* a GPT's text; --count and --png are the images' */
        if (count || png) {
            /* both kinds of flag: name one of each, and which kind the
             * checkpoint is (when it says) */
            const char *img = count ? "--count" : "--png";
            if (text_flag[0])
                fprintf(stderr, "tp-generate: %s is a gpt's (text: --prompt, --tokens, "
                        "--temperature, --top-k) and %s a GAN's (images: --count, --png): "
                        "give one kind", text_flag, img);
            else
                fprintf(stderr, "tp-generate: %s draws a GAN's images (dcgan); a gpt takes "
                        "--prompt and --tokens", img);
            if (known)
                fprintf(stderr, " (%s holds model '%s')", path, ti.model);
            fputc('\n', stderr);
            return 2;
        }
        if (!resolved)
            return s_fail("--load");
        /* a checkpoint that names another model: say which, and what to use
         * instead (the gpt generator's own error would be a missing 'wte') */
        if (!model && known && strcmp(ti.model, "gpt")) {
            if (tp_zoo_find_gan(ti.model))
                tp_error(TP_ERR_INVALID, "%s holds model '%s', a GAN: it draws images "
                         "(--count N --output FILE.npy), not text (--prompt, --tokens, "
                         "--temperature, --top-k are a gpt's)", path, ti.model);
            else
                tp_error(TP_ERR_INVALID, "%s holds model '%s', an image classifier: "
                         "tp-generate continues a text with a gpt (tp-train --model gpt) "
                         "and draws images with a GAN (tp-train --model dcgan); "
                         "tp-predict runs a classifier", path, ti.model);
            return s_fail("--load");
        }
        text.seed = (uint64_t)seed;
        text.output = output;
        /* the process's bf16 products, before the generator builds its
         * predictor (whose config leaves them to this) */
        tp_backend_cpu_bf16_ask(bf16);
        return tp_generate_text(path, &text);
    }
    /* a --load that names no checkpoint says so before the flags it lacks */
    if (optind == argc && load && !resolved)
        return s_fail("--load");
    if (optind < argc || !load || !count || !output) {
        if (optind < argc)
            fprintf(stderr, "tp-generate: unexpected argument '%s'\n", argv[optind]);
        else  /* name the ones missing */
            fprintf(stderr, "tp-generate: drawing images needs --load LOGDIR|CKPT, --count N "
                    "and --output FILE.npy: %s%s%s%s%s missing\n", load ? "" : "--load",
                    !load && (!count || !output) ? ", " : "", count ? "" : "--count",
                    !count && !output ? ", " : "", output ? "" : "--output");
        s_usage(stderr);
        return 2;
    }
    /* the samples are a NumPy array: a file named otherwise (samples.txt,
     * samples.png) would hold .npy bytes under a name that says not */
    const size_t olen = strlen(output);
    if (olen < 4 || strcmp(output + olen - 4, ".npy")) {
        tp_error(TP_ERR_INVALID, "--output %s: the samples are written as a NumPy array; "
                 "name the file FILE.npy (a grid image of them: --png GRID.png)", output);
        return s_fail("--output");
    }
    if (!have_info)
        return s_fail("--load");  /* the message names the file */
    const char *ckpt = path;
    const char *name = model ? model : ti.model[0] ? ti.model : "dcgan";
    const tp_zoo_gan_t *gz = tp_zoo_find_gan(name);
    if (!gz) {
        tp_error(TP_ERR_INVALID, "%s holds model '%s', not a generator (dcgan)%s", ckpt, name,
                 strcmp(name, "gpt") ? ": tp-predict runs an image classifier" : "");
        return s_fail("--load");
    }

    /* the generator's channels and size: the image input the run recorded
     * ([B,S,S] grey, [B,3,S,S] colour; none recorded: 28 px grey) */
    int channels = 1, size = 28;
    for (int i = 0; i < ti.ninputs; i++)
        if (!strcmp(ti.inputs[i].name, gz->inputs[0].name) &&
            (ti.inputs[i].ndim == 3 || ti.inputs[i].ndim == 4)) {
            channels = ti.inputs[i].ndim == 4 ? (int)ti.inputs[i].shape[1] : 1;
            size = (int)ti.inputs[i].shape[ti.inputs[i].ndim - 1];
        }
    tp_input_desc_t inputs[4];
    if (tp_zoo_gan_inputs_shaped(gz, channels, size, inputs) != TP_OK)
        return s_fail(ckpt);
    /* the generator's inference graph, pruned to its output: reads z only */
    tp_model_desc_t desc = {inputs, gz->ninputs, gz->build, NULL, NULL};
    const char *in_names[1] = {gz->inputs[gz->noise_input].name};
    const char *out_names[1] = {gz->sample_output};
    tp_predict_config_t pc;
    tp_predict_config_init(&pc);
    pc.model = &desc;
    pc.checkpoint = ckpt;
    pc.input_names = in_names;
    pc.ninput_names = 1;
    pc.output_names = out_names;
    pc.noutput_names = 1;
    pc.max_batch = count < 256 ? count : 256;
    pc.bf16 = bf16;
    tp_predictor_t *p = tp_predictor_new(&pc);
    if (!p)
        return s_fail(ckpt);

    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.seed = (uint64_t)seed;
    int64_t zshape[2] = {count, gz->zdim}, oshape[4] = {count, channels, 0, 0};
    tp_tensor_t z, all;
    tp_tensor_init_empty(&all);
    if (tp_tensor_init(&z, TP_FLOAT32, 2, zshape) != TP_OK) {
        tp_predictor_destroy(&p);
        return s_fail("noise");
    }
    /* the noise of all N rows at once: row i's is the same however the
     * calls split them */
    tp_gan_noise_fill(&gc, -1, 0, count, gz->zdim, z.data);
    tp_status_t rc = TP_OK;
    for (int64_t r0 = 0; rc == TP_OK && r0 < count; r0 += pc.max_batch) {
        int64_t rows = count - r0 < pc.max_batch ? count - r0 : pc.max_batch;
        int64_t s[2] = {rows, gz->zdim};
        tp_tensor_t zi, out;
        rc = tp_tensor_init_wrap(&zi, TP_FLOAT32, 2, s, (float *)z.data + r0 * gz->zdim, NULL,
                                 NULL);
        if (rc == TP_OK)
            rc = tp_predictor_run(p, &zi, &out);
        if (rc != TP_OK)
            break;
        if (r0 == 0) {  /* [N, C, H, W] once the first call says H and W */
            oshape[2] = out.shape[out.ndim - 2];
            oshape[3] = out.shape[out.ndim - 1];
            rc = tp_tensor_init(&all, TP_FLOAT32, 4, oshape);
        }
        if (rc == TP_OK)
            memcpy((float *)all.data + r0 * channels * oshape[2] * oshape[3], out.data,
                   out.nbytes);
        tp_tensor_fini(&out);
    }
    tp_tensor_fini(&z);
    tp_predictor_destroy(&p);
    if (rc != TP_OK) {
        tp_tensor_fini(&all);
        return s_fail("generating");
    }
    /* uint8 as the sample grids map them: one column, no padding, is the
     * images stacked [N*H, W, C] */
    tp_tensor_t stack;
    if (tp_image_grid(&all, -1, 1, 1, 0, &stack) != TP_OK ||
        s_write_npy(output, stack.data, count, oshape[2], oshape[3], channels) != TP_OK) {
        tp_tensor_fini(&all);
        return s_fail(output);
    }
    tp_tensor_fini(&stack);
    if (png) {
        tp_tensor_t grid;
        void *data = NULL;
        size_t size = 0;
        rc = tp_image_grid(&all, -1, 1, 0, 2, &grid);
        if (rc == TP_OK) {
            tp_tensor_t view = grid;  /* grey: the encoder takes [H, W] */
            if (channels == 1)
                view.ndim = 2;
            rc = tp_image_encode_png(&view, &data, &size);
            tp_tensor_fini(&grid);
        }
        if (rc == TP_OK)
            rc = tp_file_write_atomic(png, data, size);
        free(data);
        if (rc != TP_OK) {
            tp_tensor_fini(&all);
            return s_fail(png);
        }
    }
    tp_tensor_fini(&all);
    char cdim[32] = "";
    if (channels != 1)
        snprintf(cdim, sizeof cdim, ", %d", channels);
    printf("tp-generate: %lld samples of %s (%s%s) as uint8 [%lld, %lld, %lld%s] in %s%s%s\n",
           count, gz->name, ckpt,
           tp_backend_cpu_bf16_ask(-1) ? "; the CPU's products on bf16 operands" : "", count,
           (long long)oshape[2], (long long)oshape[3], cdim, output, png ? ", grid " : "",
           png ? png : "");
    return 0;
}
