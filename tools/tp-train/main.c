/* tp-train: train a model on Fashion-MNIST (or IDX / LMDB data) through the
 * whole engine: dataflow, input source, towers, callbacks, monitors.
 *
 *   tp-train                                 the default CNN, 4 epochs (Adam), CPU
 *   tp-train --model mlp --epochs 10 --batch 128 --lr 0.05
 *   tp-train --logdir train_log/run1 --resume --epochs 6
 *
 * It validates on the test split after every epoch, saves checkpoints
 * (LOGDIR/model-<global_step>.safetensors), writes LOGDIR/stats.json and
 * LOGDIR/curves.png, and ends with a summary line.
 *
 * Under mpirun or srun (tp_dist_env) it trains data-parallel over the
 * ranks: each rank takes its shard of the batches, rank 0 alone owns the log
 * directory (checkpoints, stats.json, plots) and validates. See
 * docs/distributed.md. */
#define _GNU_SOURCE  /* sched_getaffinity */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <towerpack/checkpoint.h>
#include <towerpack/clock.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/device.h>
#include <towerpack/image.h>
#include <towerpack/dist.h>
#include <towerpack/gan.h>
#include <towerpack/log.h>
#include <towerpack/logdir.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/predict.h>
#include <towerpack/models.h>
#include <towerpack/optim.h>
#include <towerpack/plot.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/security.h>
#include <towerpack/supervisor.h>
#include <towerpack/launch.h>

typedef struct {
    const char *model, *data, *test_data, *devices, *logdir, *action, *optimizer;
    const char *spec, *test_spec, *stats, *remote, *curve;
    const char *job;  /* --job: the remote workers' job id (issue 47) */
    int public_bind, no_tensorboard;
    int no_checkpoints; /* --no-checkpoints: no ModelSaver (benchmarks) */
    int no_plots;       /* --no-plots: no curves.png (benchmarks) */
    int64_t log_every;  /* --log-every: TrainConfig.log_every_n_steps */
    int epochs, batch, towers, workers, worker_restarts, threads, resume, augment;
    int create_logdir; /* --create-logdir: --resume may start in a missing DIR */
    int workers_mode;  /* --workers: 0 not given (s_default_workers decides),
                          1 a number, 2 auto (one per core) */
    int resident; /* --resident: the training set in the towers' memory */
    int tta;      /* --tta: validation also on the mirrored images (1);
                     --tta-shift: and on the shifted ones (2) */
    double label_smoothing; /* --label-smoothing: the cost's targets */
    int pad;      /* --pad: the augmentation's zeros around an image (2) */
    int image_size;   /* the model's input: image_size x image_size (0 until
                         set: 28 grey, 32 colour or the model's minimum) */
    int channels;     /* --channels: 1 or 3; 0: from the data */
    int classes;      /* --classes: the classifier's outputs; 0: from the data */
    const char *mean, *std;   /* --mean, --std: M[/M/M] on the 0..255 scale */
    const char *preset;       /* --augment PRESET: crop, cifar, imagenet, none */
    tp_zoo_data_t info;       /* what the data are: channels, classes, the
                                 normalisation (LOGDIR/data.json) */
    int device;   /* the GPU the towers run on; -1: the CPU */
    int gpus[TP_MODEL_DEVICES_MAX], ngpus; /* --devices 0,1: one tower each */
    int tf32;     /* --tf32: 1; default -1 ($TP_CUDA_TF32) */
    int bf16;     /* --bf16: 1; default -1 ($TP_CUDA_BF16) */
    double lr;
    double lr_end;  /* --lr-end: the rate at the end, a fraction of lr; -1
                       unset (linear 0.05, cosine 0) */
    const char *warmup_flag; /* how the user spelled it, for the errors */
    double warmup;  /* --warmup, --warmup-epochs: epochs of the rate's climb
                       from lr / 10 */
    const char *lr_schedule; /* --lr-schedule linear|cosine|step:E1,E2.. */
    double lr_gamma;         /* --lr-gamma: step's factor (0.1) */
    double weight_decay; /* --weight-decay: AdamW's decoupled decay; -1 unset */
    double beta1, beta2; /* --beta1, --beta2: Adam's and AdamW's; -1 unset */
    double clip_norm;    /* --clip-norm: the global-norm clip; 0 off */
    double ema;          /* --ema: the weights' average's decay; 0 off */
    int accumulate;      /* --accumulate: steps per update (1) */
    const char *mult_pattern[16]; /* --lr-mult P=M, --freeze P (M 0), in order */
    double mult[16];
    int nmults;
    int64_t steps_per_epoch, seed;
    int text;     /* --model gpt: text: data, bytes as tokens */
    tp_text_info_t tokens;  /* --model gpt: its vocabulary (256, or BPE's) */
    int context, layers, heads, embed;  /* --context, --layers, --heads, --embed */
    double dropout;  /* --dropout: the gpt's, [0, 1); 0 none */
} s_args_t;

static void s_usage(FILE *out) {
    fprintf(out,
"usage: tp-train [options]\n"
"Train a model on grey or colour images with as many classes as the data\n"
"have (Fashion-MNIST by default: grey, 28x28, 10 classes).\n\n"
"  --model NAME         mlp, cnn (default), cnn-bn, resnet (CIFAR-style),\n"
"                       resnet18, resnet50 (ImageNet layout, from 32 px),\n"
"                       dcgan (a GAN: GANTrainer, samples\n"
"                       LOGDIR/samples-EPOCH.png each epoch; 28x28 grey,\n"
"                       or colour at 32 px: --data cifar:FILE or\n"
"                       imagefolder:DIR, --image-size 16..128, a power of 2)\n"
"                       or gpt (a byte-level Transformer language model on\n"
"                       --data text:FILE; docs/training.md, \"Text\")\n"
"  --context T          gpt: tokens (bytes) per window (default 64)\n"
"  --layers N           gpt: Transformer blocks (default 2)\n"
"  --heads H            gpt: attention heads (default 4)\n"
"  --embed C            gpt: the width, a multiple of --heads (default 128)\n"
"  --dropout P          gpt: nanoGPT's dropout on the embeddings, the\n"
"                       attention weights and the residual branches, in\n"
"                       training only; P in [0, 1) (default 0: none)\n"
"  --sample-prompt TEXT gpt: after every epoch the log shows TEXT and\n"
"                       --sample-tokens bytes the model draws after it\n"
"                       (default \"The \", 64 bytes; 0: no sample), at\n"
"                       --sample-temperature T (default 0.8; 0: greedy)\n"
"                       among the --sample-top-k K likeliest (default 40;\n"
"                       0: all), seeded by --seed\n"
"  --image-size N       the model's input is N x N (default 28 grey, 32\n"
"                       colour; at least 4 for cnn, 8 for cnn-bn; 64 and up\n"
"                       suit resnet18/50); the data are resized\n"
"                       to it in the pipeline (imgaug resize=NxN), the crop\n"
"                       follows it, the checkpoints record it\n"
"  --data SOURCE        fashion-mnist (default), idx:IMAGES,LABELS, lmdb:PATH,\n"
"                       tensorpack-lmdb:PATH[,shuffle] (an LMDB written by\n"
"                       tensorpack's LMDBSerializer.save; docs/tensorpack.md),\n"
"                       imagefolder:DIR (DIR/<class>/<image>: the classes are\n"
"                       the sub-folders, sorted by name, as torchvision's\n"
"                       ImageFolder), imagelist:FILE ('PATH LABEL' lines) or\n"
"                       cifar:FILE[,cifar100[,fine]] (CIFAR's .bin records);\n"
"                       images of any size, resized to the model's input\n"
"                       (--model gpt: text:FILE, bytes as tokens, or\n"
"                       text:FILE,vocab=encoder.json,merges=vocab.bpe for\n"
"                       GPT-2's BPE; docs/training.md)\n"
"  --test-data SOURCE   validation data (default: the test split of --data,\n"
"                       the last tenth of a text: file;\n"
"                       needed for idx:, lmdb:, tensorpack-lmdb: and the image\n"
"                       sources; an image folder must have the same classes)\n"
"  --channels 1|3       grey or colour (default: the data's first image; grey\n"
"                       stays grey, colour is RGB, channels first)\n"
"  --classes N          the classifier's outputs (default: the data's classes)\n"
"  --mean M[/M/M]       per-channel normalisation (x - mean) / std on the\n"
"  --std S[/S/S]        0..255 scale (default: ImageNet's 123.675/116.28/\n"
"                       103.53 and 58.395/57.12/57.375 for colour; 0 and 255,\n"
"                       i.e. [0, 1], for grey); recorded in LOGDIR/data.json\n"
"  --epochs N           train up to epoch N (max_epoch; default per model)\n"
"  --batch N            batch per tower (default 128 / towers); total = batch\n"
"                       x towers\n"
"  --lr X               learning rate (default per model); it follows\n"
"                       --lr-schedule, step by step\n"
"  --lr-schedule S      linear (default: down to --lr-end linearly), cosine\n"
"                       (down to --lr-end along a half cosine, PyTorch's\n"
"                       CosineAnnealingLR) or step:E1,E2,.. (times --lr-gamma\n"
"                       after epochs E1, E2, ..: MultiStepLR)\n"
"  --lr-gamma G         step's factor at each milestone, in (0, 1] (0.1)\n"
"  --lr-end F           the rate at the end as a fraction of --lr, in [0, 1]\n"
"                       (default 0.05 for linear, 0 for cosine)\n"
"  --warmup E           the rate climbs linearly from a tenth of --lr to it\n"
"  --warmup-epochs E    over the first E epochs (fractions allowed; default\n"
"                       0), then follows the schedule (PyTorch's LinearLR\n"
"                       with start_factor 0.1)\n"
"  --optimizer NAME     sgd (momentum 0.9), adam, or adamw (Adam with\n"
"                       decoupled weight decay; default per model: adam\n"
"                       for cnn, sgd for the others)\n"
"  --weight-decay W     adamw's decoupled weight decay, W >= 0 (default\n"
"                       0.01, as torch.optim.AdamW; gpt: 0.1 on its matrices\n"
"                       and embeddings only, as nanoGPT; the models' own L2\n"
"                       decay stays); with sgd, torch.optim.SGD's coupled\n"
"                       decay on the weight matrices and kernels only, in\n"
"                       place of the model's own (default: the model's,\n"
"                       5e-4 cnn-bn and resnet, 1e-4 resnet18/50, 0 others)\n"
"  --beta1 B, --beta2 B Adam's and AdamW's moment decays, in [0, 1)\n"
"                       (default 0.9 and 0.999, torch's; gpt: 0.9 and 0.95)\n"
"  --clip-norm C        scale each step's gradients by min(1, C / their\n"
"                       global norm), the norm over every trainable\n"
"                       variable after the all-reduce (tensorpack's\n"
"                       GlobalNormClip); C > 0 (default: no clip)\n"
"  --ema D              keep an exponential moving average of the weights,\n"
"                       avg = D x avg + (1 - D) x w after each update, D in\n"
"                       (0, 1) (e.g. 0.999); validation runs on it, and the\n"
"                       checkpoints keep it (optimizer/<var>/ema)\n"
"  --accumulate K       update every K steps with the mean of their\n"
"                       gradients (an effective batch K x the total batch);\n"
"                       a step is still one batch per tower: --epochs,\n"
"                       --steps-per-epoch and the rate's schedule count\n"
"                       steps (default 1)\n"
"  --lr-mult PAT=M      update the variables whose name matches PAT (a shell\n"
"                       pattern, e.g. 'conv0/*') at M x the learning rate;\n"
"                       repeatable, the first match wins (variable names:\n"
"                       the checkpoint's)\n"
"  --freeze PAT         never update the variables matching PAT (no gradient\n"
"                       is computed for them): --lr-mult PAT=0\n"
"  --devices LIST       auto (default: GPU 0 if CUDA answers, else the CPU),\n"
"                       cpu, a GPU id like 1, or several like 0,1 (one tower\n"
"                       on each, gradients all-reduced by NCCL); under MPI\n"
"                       one per rank: local (the rank's place on its host)\n"
"                       or an id, gradients all-reduced by NCCL\n"
"  --tf32               on a GPU: TF32 tensor cores for products and\n"
"                       convolutions (default: exact fp32, or $TP_CUDA_TF32)\n"
"  --bf16               bf16 products, fp32 sums: on a GPU the fully connected\n"
"                       layers' on bf16 tensor cores (default: off, or\n"
"                       $TP_CUDA_BF16); on the CPU the dense and batch_matmul\n"
"                       products, the direct convolutions and the fused\n"
"                       attention's tile products on bf16 kernels, about\n"
"                       2x faster where the CPU has AVX512_BF16 or AMX (or\n"
"                       $TP_CPU_BF16)\n"
"  --towers N|auto      towers, data parallel in one process (default auto:\n"
"                       one on a GPU; on the CPU one per core, at most 4)\n"
"  --workers N|auto     run the data pipeline (read, augment) in N forked\n"
"                       worker processes; a worker that dies is replaced\n"
"                       (stats.json: dataflow/worker_restarts); with --spec,\n"
"                       'processes N' goes before the spec's first batch;\n"
"                       auto: one per core this process may run on\n"
"                       (taskset, cpusets count), one core left to the\n"
"                       trainer above 2 cores, one per tower on GPUs,\n"
"                       at most 32. Default: auto for\n"
"                       imagefolder:/imagelist: data when the model runs on\n"
"                       a GPU, else 0 (the pipeline on one thread)\n"
"  --worker-restarts R  replace up to R dead workers in all (default 3;\n"
"                       0: the first dead worker ends training)\n"
"  --remote ENDPOINT    take batches from tp-worker processes instead: e.g.\n"
"                       @tcp://127.0.0.1:5555 (bind; workers connect) or\n"
"                       ipc:///path (connect); several separated by commas;\n"
"                       under mpirun '{rank}' becomes the rank's number and\n"
"                       '{N+rank}' N + rank (e.g. @tcp://127.0.0.1:{5550+rank});\n"
"                       without a launcher the rank is 0\n"
"  --job ID             with --remote: this run's job id (default $TP_JOB);\n"
"                       tp-workers of another --job are refused, both named\n"
"  --curve DIR          CURVE keys made by tp-keygen DIR: --remote and a tcp\n"
"                       --stats socket authenticate and encrypt\n"
"  --public             allow binding --remote or --stats to every interface\n"
"                       (tcp://*:P); by default only given addresses\n"
"  --threads N          CPU threads per tower: one OpenMP team for its\n"
"                       products, convolutions and elementwise ops\n"
"                       (default: all cores / towers)\n"
"  --augment [PRESET]   crop (the zoo's: random crop after --pad zeros, flip;\n"
"                       --augment alone), cifar (the same with a pad of N/8),\n"
"                       imagenet (random-resized crop 0.08-1 area, 3/4-4/3\n"
"                       aspect, flip, brightness, contrast and saturation\n"
"                       jitter in random order, lighting noise; validation\n"
"                       resizes the short side to N*256/224 and centre-crops;\n"
"                       image sources only) or none (default per model)\n"
"  --no-augment         --augment none\n"
"  --pad P              zeros around each image before the random crop\n"
"                       (default 2)\n"
"  --resident           keep the training set in the towers' memory (the\n"
"                       GPU's with --devices): crop, pad and flip run there,\n"
"                       the host only draws them each step (ResidentInput)\n"
"  --label-smoothing S  train against targets smoothed by S in [0, 1): 1 - S +\n"
"                       S/K at the label, S/K elsewhere, K classes (default 0)\n"
"  --tta                validate also with test-time augmentation: the logits\n"
"                       of each image and its mirror image summed\n"
"                       (validation_flip_accuracy; the images are run twice)\n"
"  --tta-shift          --tta, and also the logits of the image and its mirror\n"
"                       (twice) and both shifted by a pixel up-left and\n"
"                       down-right, summed (validation_flip_shift_accuracy;\n"
"                       the images are run six times more)\n"
"  --steps-per-epoch N  default: one pass of the training data\n"
"  --logdir DIR         default train_log/<model>\n"
"  --logdir-action A    when DIR holds a run: keep, delete, backup, new (ask\n"
"                       on a terminal; an error otherwise). DIR is locked\n"
"                       while the run lasts: a second run on it is refused\n"
"  --resume             continue the run in --logdir from its latest\n"
"                       checkpoint, up to --epochs (none there: from\n"
"                       scratch, saying so); DIR must exist\n"
"  --create-logdir      with --resume: a DIR that does not exist is made\n"
"                       (a new run) instead of refused as a mistyped path\n"
"  --seed N             default 1\n"
"  --no-tensorboard     write no TensorBoard event file (by default\n"
"                       LOGDIR/events.out.tfevents.*: tensorboard --logdir DIR)\n"
"  --no-checkpoints     write no checkpoint (no ModelSaver: nothing for\n"
"                       tp-predict, tp-export or --resume); for timing runs,\n"
"                       where a checkpoint written beside the next epoch's\n"
"                       steps takes CPU from them\n"
"  --no-plots           draw no LOGDIR/curves.png (steps.tsv and stats.json\n"
"                       stay); for timing runs, where the drawing after an\n"
"                       epoch runs beside the next epoch's first steps\n"
"  --log-every N        the cost and the metrics, their mean over the last N\n"
"                       steps, to TensorBoard and stats as <name>_step every\n"
"                       N steps (default 50; 0: only the epoch means)\n"
"  --stats ENDPOINT     statistics for tp-top: ipc (default: LOGDIR/stats.sock),\n"
"                       tcp (loopback, any port), tcp:PORT, off, or an endpoint\n"
"  --spec SPEC          the whole training pipeline as a spec (overrides\n"
"                       --data and --augment; its last 'batch N' is the batch\n"
"                       per tower; its images must be --image-size); under\n"
"                       mpirun '{rank}' in it gives each rank its own data\n"
"  --test-spec SPEC     the validation pipeline as a spec\n"
"  -h, --help\n");
}

/* The N of a spec's last `batch N` stage (each tower takes one such
 * batch a step), or 0 when it has none. */
static long s_spec_batch(const char *spec) {
    long n = 0;
    for (const char *p = spec; p && *p; p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!strncmp(p, "batch", 5) && (p[5] == ' ' || p[5] == '\t')) {
            char *end;
            long v = strtol(p + 5, &end, 10);
            if (end != p + 5 && v > 0)
                n = v;
        }
    }
    return n;
}

/* The model description's user data: the zoo's options first (what the
 * zoo's build functions read), then the optimizer's. */
typedef struct {
    tp_zoo_gpt_options_t zoo;  /* the image models read its first member */
    double lr;
    const char *kind;     /* "sgd", "adam", "adamw" (checked) */
    double weight_decay;  /* adamw: decoupled; sgd: coupled (0: the zoo's L2) */
    double beta1, beta2;  /* adam, adamw */
    double clip_norm;     /* 0: none */
    double ema;           /* 0: none */
    int accumulate;       /* steps per update */
    const s_args_t *args; /* the learning-rate multipliers */
} s_model_user_t;

/* The optimizer factory: SGD has momentum 0.9; Adam and AdamW the betas
 * of --beta1 and --beta2 (torch's 0.9, 0.999; the gpt's 0.9, 0.95) and
 * eps 1e-8; the global-norm clip when asked. */
static tp_optimizer_t *s_optimizer(void *user) {
    const s_model_user_t *u = user;
    tp_optimizer_t *o =
        !strcasecmp(u->kind, "adam")  ? tp_optimizer_adam(u->lr, u->beta1, u->beta2, 1e-8)
        : !strcasecmp(u->kind, "adamw") ? tp_optimizer_adamw(u->lr, u->beta1, u->beta2, 1e-8,
                                                             u->weight_decay)
                                        : tp_optimizer_sgd(u->lr, 0.9, 0);
    /* SGD's --weight-decay: torch.optim.SGD's coupled decay */
    int sgd = !strcasecmp(u->kind, "sgd");
    if (o && sgd && tp_optimizer_set(o, "weight_decay", u->weight_decay) < 0)
        tp_optimizer_destroy(&o);
    /* --model gpt: nanoGPT's groups, AdamW's decay on the matrices and the
     * embeddings (dim >= 2) only; the biases and the layer norms' gains
     * and shifts (the zoo's only vectors) keep their size. SGD's decay: on
     * the weight matrices and kernels only, as the zoo's L2 term it
     * replaces and the common ResNet recipes */
    static const char *const s_no_decay[] = {"*/b", "*/gamma", "*/beta"};
    for (size_t i = 0; o && ((u->args->text && !strcasecmp(u->kind, "adamw")) ||
                             (sgd && u->weight_decay > 0)) &&
                       i < sizeof s_no_decay / sizeof *s_no_decay; i++)
        if (tp_optimizer_add_decay_mult(o, s_no_decay[i], 0.0) < 0)
            tp_optimizer_destroy(&o);
    if (o && (tp_optimizer_set(o, "clip_norm", u->clip_norm) < 0 ||
              tp_optimizer_set(o, "ema_decay", u->ema) < 0 ||
              tp_optimizer_set(o, "accumulate", u->accumulate) < 0))
        tp_optimizer_destroy(&o);
    for (int i = 0; o && i < u->args->nmults; i++)
        if (tp_optimizer_add_lr_mult(o, u->args->mult_pattern[i], u->args->mult[i]) < 0)
            tp_optimizer_destroy(&o);
    return o;
}

/* --ema: validation on the weights' average. The first callback puts it
 * in the weights' place before the InferenceRunner's trigger_epoch, the
 * second puts the weights back after it (and after training, whatever
 * happened), before the ModelSaver, a default callback after these,
 * snapshots the model. */
static tp_status_t s_ema_in(void *impl, tp_trainer_t *tr) {
    (void)impl;
    return tp_model_use_ema(tp_trainer_model(tr), 1);
}
static tp_status_t s_ema_out(void *impl, tp_trainer_t *tr) {
    (void)impl;
    return tp_model_use_ema(tp_trainer_model(tr), 0);
}
static const tp_callback_ops_t s_ema_in_ops = {.name = "EMAIn", .trigger_epoch = s_ema_in};
static const tp_callback_ops_t s_ema_out_ops = {.name = "EMAOut",
                                                .trigger_epoch = s_ema_out,
                                                .after_train = s_ema_out};

/* The global step at the start and the end of training (a rank > 0's own
 * summary line: it has no stats.json). */
static int64_t s_rank_steps[2];
static tp_status_t s_rank_steps_begin(void *impl, tp_trainer_t *tr) {
    (void)impl;
    s_rank_steps[0] = s_rank_steps[1] = tp_trainer_global_step(tr);
    return TP_OK;
}
static tp_status_t s_rank_steps_end(void *impl, tp_trainer_t *tr) {
    (void)impl;
    s_rank_steps[1] = tp_trainer_global_step(tr);
    return TP_OK;
}
static const tp_callback_ops_t s_rank_steps_ops = {
    .name = "RankSteps", .before_train = s_rank_steps_begin, .after_train = s_rank_steps_end};
/* What the data were, in every checkpoint's metadata too (channels, size,
 * classes, class names, normalisation): a checkpoint copied without its
 * log directory's data.json still says them to tp-predict and tp-export.
 * Set before the first step, so the first checkpoint has them. */
static tp_status_t s_data_meta(void *impl, tp_trainer_t *tr) {
    const s_args_t *a = impl;
    return tp_zoo_data_to_checkpoints(&a->info, a->image_size, a->image_size,
                                      tp_trainer_model(tr));
}
static const tp_callback_ops_t s_data_meta_ops = {.name = "DataMetadata",
                                                  .before_train = s_data_meta};
/* --model gpt: the shape of the model and of its tokens, in every
 * checkpoint's metadata instead (no images, no classes). */
static tp_status_t s_text_meta(void *impl, tp_trainer_t *tr) {
    const s_args_t *a = impl;
    char v[4][16];
    snprintf(v[0], sizeof v[0], "%d", a->context);
    snprintf(v[1], sizeof v[1], "%d", a->layers);
    snprintf(v[2], sizeof v[2], "%d", a->heads);
    snprintf(v[3], sizeof v[3], "%d", a->embed);
    const char *kv[][2] = {{"context", v[0]}, {"layers", v[1]}, {"heads", v[2]},
                           {"embed", v[3]},
                           {"tokens", a->tokens.vocab_file[0] ? "gpt2-bpe" : "bytes"}};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        TP_TRY(tp_checkpoint_set_meta(tp_trainer_model(tr), kv[i][0], kv[i][1]));
    if (a->tokens.vocab_file[0]) {  /* BPE: what tp-generate needs to decode */
        char vs[16];
        snprintf(vs, sizeof vs, "%d", (int)a->tokens.vocab);
        TP_TRY(tp_checkpoint_set_meta(tp_trainer_model(tr), "vocab_size", vs));
        TP_TRY(tp_checkpoint_set_meta(tp_trainer_model(tr), "vocab", a->tokens.vocab_file));
        if (a->tokens.merges_file[0])
            TP_TRY(tp_checkpoint_set_meta(tp_trainer_model(tr), "merges",
                                          a->tokens.merges_file));
    }
    return TP_OK;
}
static const tp_callback_ops_t s_text_meta_ops = {.name = "TextMetadata",
                                                  .before_train = s_text_meta};

/* --model gpt: the sample printed to the log after every epoch
 * (TextSample, models/zoo_gpt_decode.c's generator): --sample-prompt,
 * --sample-tokens (0: none), --sample-temperature, --sample-top-k. */
static struct {
    const char *prompt;
    int64_t tokens, top_k;
    double temperature;
    int given;  /* a flag was given: refused for the image models */
} s_sample = {"The ", 64, 40, 0.8, 0};
/* Flag i of the four above (in that order) from `arg`: 0, or 1 with the
 * error set. */
static int s_sample_flag(int i, const char *arg) {
    s_sample.given = 1;
    if (i == 0)
        s_sample.prompt = arg;
    else if (i == 1)
        return tp_spec_int(arg, 0, 100000, "--sample-tokens", &s_sample.tokens) != TP_OK;
    else if (i == 3)
        return tp_spec_int(arg, 0, 1000000, "--sample-top-k", &s_sample.top_k) != TP_OK;
    else if (tp_spec_double(arg, "--sample-temperature", &s_sample.temperature) ||
             !(s_sample.temperature >= 0)) {
        tp_error(TP_ERR_INVALID, "--sample-temperature needs a number >= 0, got '%s'", arg);
        return 1;
    }
    return 0;
}

/* --lr-schedule: linear (the default), cosine, or step:E1,E2,.. (the epochs,
 * fractions allowed, after which the rate is multiplied by --lr-gamma;
 * increasing, inside the run's `epochs`) into *kind and miles[*n]. */
static tp_status_t s_parse_lr_schedule(const char *text, int epochs, tp_lr_kind_t *kind,
                                       double *miles, int *n) {
    *n = 0;
    if (!strcmp(text, "linear") || !strcmp(text, "cosine")) {
        *kind = text[0] == 'l' ? TP_LR_LINEAR : TP_LR_COSINE;
        return TP_OK;
    }
    if (strncmp(text, "step:", 5) || !text[5])
        return tp_error(TP_ERR_INVALID, "--lr-schedule '%s': linear, cosine or step:E1,E2,.. "
                        "(the epochs after which the rate is multiplied by --lr-gamma)", text);
    *kind = TP_LR_STEP;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text + 5);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        double e;
        if (*n == TP_LR_MAX_MILESTONES)
            return tp_error(TP_ERR_INVALID, "--lr-schedule '%s': at most %d milestones",
                            text, TP_LR_MAX_MILESTONES);
        if (tp_spec_double(tok, "--lr-schedule step", &e) || !(e > 0 && e < epochs) ||
            (*n && e <= miles[*n - 1]))
            return tp_error(TP_ERR_INVALID, "--lr-schedule '%s': milestone '%s' must be an "
                            "epoch after 0 and the one before it, and before the last of "
                            "the %d epochs", text, tok, epochs);
        miles[(*n)++] = e;
    }
    return TP_OK;
}

/* --devices 0,1: distinct GPU ids, into ids[] (*n_out of them). */
static tp_status_t s_parse_device_list(const char *list, int *ids, int *n_out) {
    int n = 0;
    const char *p = list;
    while (*p) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || id < 0 || id > 1023 || (*end && *end != ','))
            return tp_error(TP_ERR_INVALID, "--devices '%s': auto, cpu, or GPU "
                            "ids separated by commas (like 0,1)", list);
        if (n == TP_MODEL_DEVICES_MAX)
            return tp_error(TP_ERR_INVALID, "--devices '%s': at most %d GPUs",
                            list, TP_MODEL_DEVICES_MAX);
        for (int i = 0; i < n; i++)
            if (ids[i] == id)
                return tp_error(TP_ERR_INVALID, "--devices '%s': GPU %ld is "
                                "listed twice", list, id);
        ids[n++] = (int)id;
        p = *end ? end + 1 : end;
        if (*end && !*p)
            return tp_error(TP_ERR_INVALID, "--devices '%s': ends with a comma", list);
    }
    if (n == 0)
        return tp_error(TP_ERR_INVALID, "--devices: empty list");
    *n_out = n;
    return TP_OK;
}

/* The GPUs ids[0..n-1] exist (CUDA asked in a forked probe). */
static tp_status_t s_check_gpus(const char *list, const int *ids, int n) {
    char why[512];
    int count = tp_cuda_probe_isolated(why, sizeof why);
    if (count <= 0)
        return tp_error(TP_ERR_UNSUPPORTED, "--devices %s: %s (use --devices cpu "
                        "or auto)", list, why);
    for (int i = 0; i < n; i++)
        if (ids[i] >= count)
            return tp_error(TP_ERR_INVALID, "--devices %s: there is no GPU %d "
                            "(%d CUDA device%s)", list, ids[i], count,
                            count == 1 ? "" : "s");
    return TP_OK;
}

/* Under mpirun: the distributed runtime (NULL for a plain run). A rank
 * that fails ends the whole job, naming itself: the others would wait for
 * it in the next all-reduce. */
static tp_dist_t *s_dist;

static int s_fail(const char *what) {
    if (s_dist) {
        char msg[2048];
        snprintf(msg, sizeof msg, "tp-train: %s: %s", what, tp_last_error());
        tp_dist_abort(s_dist, 1, msg);
    }
    /* stderr, and log.log once it is open: the log says why the run stopped */
    tp_log_fatal("tp-train", "%s: %s", what, tp_last_error());
    return 1;
}

/* `text` with every "{rank}" replaced by the rank's number and every
 * "{N+rank}" by N + rank (a port per rank: @tcp://0.0.0.0:{5550+rank}). */
static void s_subst_rank(const char *text, int rank, char *out, size_t size) {
    size_t o = 0;
    for (const char *p = text; *p && o + 1 < size;) {
        char *end = NULL;
        long base = *p == '{' ? strtol(p + 1, &end, 10) : 0;
        if (!strncmp(p, "{rank}", 6)) {
            o += (size_t)snprintf(out + o, size - o, "%d", rank);
            p += 6;
        } else if (end && end > p + 1 && !strncmp(end, "+rank}", 6)) {
            o += (size_t)snprintf(out + o, size - o, "%ld", base + rank);
            p = end + 6;
        } else
            out[o++] = *p++;
        if (o >= size)
            o = size - 1;
    }
    out[o] = '\0';
}

/* " | processes N[ restart=R]" for --workers (empty without it). */
static void s_processes_stage(const s_args_t *a, char *buf, size_t size) {
    buf[0] = '\0';
    /* augmentation runs in the workers too; a dead one is replaced */
    if (a->workers > 0 && a->worker_restarts > 0)
        snprintf(buf, size, " | processes %d restart=%d", a->workers, a->worker_restarts);
    else if (a->workers > 0)  /* the first dead worker ends training */
        snprintf(buf, size, " | processes %d", a->workers);
}

/* --workers' count: the number given; auto: one worker process per core
 * the towers leave, i.e. the cores this process may run on (its affinity:
 * taskset, a container's cpuset, mpirun's binding) less one for the
 * trainer above 2 cores, less one per tower when the towers are GPUs
 * (each tower's thread drives its device; the batching thread's share is
 * about 0.1 ms of CPU an image, docs/performance.md), at least 1, at most
 * 32 (PyTorch's DataLoader(num_workers=cores) habit); not given: auto
 * where decoding files is the work and the towers do not use the cores,
 * i.e. image files (imagefolder:, imagelist:) with the model on a GPU,
 * else 0 (the pipeline runs on the prefetch thread; on the CPU the towers
 * take the cores). Never under an MPI launcher (no fork there). */
static int s_default_workers(const s_args_t *a, long cores) {
    if (a->workers_mode == 1)
        return a->workers;
    int images = a->data && !a->spec && !a->remote && !a->resident &&
                 (!strncmp(a->data, "imagefolder:", 12) || !strncmp(a->data, "imagelist:", 10));
    if (s_dist || (a->workers_mode == 0 && !(images && a->device >= 0)))
        return 0;
    int towers = a->device >= 0 && a->towers > 1 ? a->towers : 1;
    long n = cores <= 2 ? cores : cores - towers;
    return n < 1 ? 1 : n > 32 ? 32 : (int)n;
}

/* The cores this process may run on: its affinity mask's count (what
 * taskset, a container's cpuset or mpirun's binding leave it), else the
 * online count. */
static long s_usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    return sysconf(_SC_NPROCESSORS_ONLN);
}

/* --spec with --workers N: the spec with `processes N` inserted before its
 * first `batch` stage (at the end when it has none), so reading, decoding
 * and the maps run in N forked copies of the pipeline, as tp-train's own
 * pipeline does. A spec that cannot be copied is refused, saying how
 * instead: a remote: source (its batches come from other processes
 * already) or one with its own `processes` stage. */
static tp_status_t s_spec_with_workers(const s_args_t *a, char *buf, size_t size) {
    const char *spec = a->spec, *insert = NULL;
    int first = 1;
    for (const char *p = spec; p; p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL, first = 0) {
        const char *q = p;
        while (*q == ' ' || *q == '\t')
            q++;
        size_t len = strcspn(q, " \t|");
        if (first && !strncmp(q, "remote:", 7))
            return tp_error(TP_ERR_INVALID, "--workers %d with --spec '%s': its batches come "
                            "from other processes already; leave --workers out (start "
                            "more tp-worker processes instead)", a->workers, spec);
        if (!first && len == 9 && !strncmp(q, "processes", 9))
            return tp_error(TP_ERR_INVALID, "--workers %d with --spec '%s': the spec has its "
                            "own processes stage; give the number of workers once, in the "
                            "spec or with --workers", a->workers, spec);
        if (!first && !insert && len == 5 && !strncmp(q, "batch", 5))
            insert = p - 1;  /* at the '|' before it */
    }
    char stage[64];
    s_processes_stage(a, stage, sizeof stage);
    int n;
    if (insert) {
        /* keep the spec's spacing: cut at the '|', trailing blanks dropped */
        const char *end = insert;
        while (end > spec && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        n = snprintf(buf, size, "%.*s%s %s", (int)(end - spec), spec, stage, insert);
    } else {
        n = snprintf(buf, size, "%s%s", spec, stage);
    }
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "--spec '%s': too long with --workers", spec);
    return TP_OK;
}

/* The per-image augmentation of --augment PRESET (after the source, before
 * the workers and the batch): " | ..." into buf, or "" for grey images
 * without augmentation. The images stay uint8 (a quarter of float32's
 * bytes through the workers' sockets): the model casts and normalises
 * (a->info.in_model, tp_zoo_options_t.data). */
static tp_status_t s_augment_spec(const s_args_t *a, char *buf, size_t size) {
    int n = a->image_size, colour = a->info.channels == 3;
    const char *chw = colour ? ",chw" : "";
    int k;
    if (!strcmp(a->preset, "imagenet"))
        /* tensorpack's fbresnet augmentation (GoogleNetResize, drawn by
         * the source so that only the crop is decoded: s_train_spec; flip,
         * the colour jitter in random order, lighting) */
        k = snprintf(buf, size, " | imgaug flip,random-order="
                     "brightness-scale=0.6:1.4;contrast=0.6:1.4%s%s%s",
                     colour ? ";saturation=0.4" : "", colour ? ",lighting=0.1" : "", chw);
    else if (!strcmp(a->preset, "crop") || !strcmp(a->preset, "cifar"))
        /* the random crop after zero padding, then the flip: the same
         * draws as `augment crop=N,pad=P,flip` made when it normalised */
        k = snprintf(buf, size, " | imgaug random-crop=%dx%d:%d,flip%s", n, n,
                     !strcmp(a->preset, "cifar") ? (n / 8 > 0 ? n / 8 : 1) : a->pad, chw);
    else if (colour)  /* none: channels first */
        k = snprintf(buf, size, " | imgaug random-crop=%dx%d%s", n, n, chw);
    else
        k = snprintf(buf, size, "%s", "");
    if (k < 0 || (size_t)k >= size)
        return tp_error(TP_ERR_INVALID, "--augment: the spec is too long");
    return TP_OK;
}

/* "M[/M/M]" into out[] (1 or `channels` numbers, each > 0 when `positive`). */
static tp_status_t s_norm_flag(const char *flag, const char *v, int channels, int positive,
                               float *out, int *n) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    *n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        double d;
        if (*n == 4 || tp_spec_double(t, flag, &d) != TP_OK || (positive && !(d > 0))) {
            if (channels == 1)  /* not "1 or 1 numbers" */
                return tp_error(TP_ERR_INVALID, "%s '%s': one number%s (the data are "
                                "grey: one channel)", flag, v, positive ? " > 0" : "");
            return tp_error(TP_ERR_INVALID, "%s '%s': 1 or %d numbers separated by "
                            "'/'%s", flag, v, channels, positive ? ", each > 0" : "");
        }
        out[(*n)++] = (float)d;
    }
    if (*n != 1 && *n != channels) {
        if (channels == 1)
            return tp_error(TP_ERR_INVALID, "%s '%s': one number, not %d (the data are "
                            "grey: one channel)", flag, v, *n);
        return tp_error(TP_ERR_INVALID, "%s '%s': 1 or %d numbers (one per channel)",
                        flag, v, channels);
    }
    return TP_OK;
}

/* What the data are (a->info): channels and classes from the source
 * (image folders: the sub-folders' names in sorted order; lists: the
 * largest label + 1; CIFAR: 10, 100 or 20; Fashion-MNIST: its ten), unless
 * --channels / --classes say; the normalisation from --mean / --std or
 * the defaults; an image folder for validation must have the same
 * classes. */
/* TP_ERR_INVALID when an image folder's classes are all a data set's split
 * names (DIR/train/<class>/... given as DIR: train and test would be
 * trained as two classes), before the test set is compared with them. */
static tp_status_t s_not_split_folders(const char *data, const tp_zoo_data_t *d) {
    static const char *const splits[] = {"train", "test", "val", "valid", "validation"};
    int nsplit = 0;
    for (int i = 0; i < d->nclasses; i++)
        for (size_t j = 0; j < sizeof splits / sizeof splits[0]; j++)
            nsplit += !strcmp(d->classes[i], splits[j]);
    if (d->nclasses < 2 || nsplit < d->nclasses)
        return TP_OK;
    return tp_error(TP_ERR_INVALID, "--data %s: its class folders are '%s', '%s'%s: a data "
                    "set's splits, not classes; give each split's folder (--data "
                    "imagefolder:DIR/train --test-data imagefolder:DIR/test)", data,
                    d->classes[0], d->classes[1], d->nclasses > 2 ? ", ..." : "");
}

/* `src` (the value of `flag`) names a source the zoo's pipelines read, of
 * `channels`: the words tp_zoo_source_shaped has for one that does not. */
static tp_status_t s_source_known(const char *flag, const char *src, int channels) {
    if (!strcmp(src, "fashion-mnist"))  /* the default: its split chosen later */
        return TP_OK;
    char buf[4096];
    tp_status_t rc = tp_zoo_source_shaped(src, 0, channels, 28, 28, buf, sizeof buf);
    return rc == TP_OK ? TP_OK : tp_error_wrap(rc, "%s", flag);
}

/* The files a record source names (idx:IMAGES[,LABELS], lmdb:PATH,
 * tensorpack-lmdb:PATH, cifar:FILE: its items without '=', up to `npaths`
 * of them) can be read: a path that cannot is said here, with the other
 * flags, naming the flag and the path (it was said only when the pipeline
 * opened it, after the device probe and the log directory). Image
 * folders and lists were read already (tp_image_source_info). */
static tp_status_t s_source_files(const char *flag, const char *src) {
    static const struct { const char *prefix; int npaths; } kinds[] = {
        {"idx:", 2}, {"lmdb:", 1}, {"tensorpack-lmdb:", 1}, {"cifar:", 1}};
    int npaths = 0;
    size_t plen = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (!strncmp(src, kinds[k].prefix, strlen(kinds[k].prefix))) {
            npaths = kinds[k].npaths;
            plen = strlen(kinds[k].prefix);
        }
    char path[4096];
    for (const char *p = src + plen; npaths > 0 && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        /* options (shuffle=0, int32) are the source's to check */
        if (len > 0 && len < sizeof path && !memchr(p, '=', len) &&
            !(len == 5 && !strncmp(p, "int32", 5)) && !(len == 7 && !strncmp(p, "shuffle", 7))) {
            memcpy(path, p, len);
            path[len] = '\0';
            if (access(path, R_OK) != 0)
                return tp_error(TP_ERR_NOT_FOUND, "%s %s: %s cannot be read: %s", flag, src,
                                path, strerror(errno));
            npaths--;
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    return TP_OK;
}

static tp_status_t s_data_info(s_args_t *a, const tp_zoo_model_t *zoo) {
    static const char *const fmnist[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress",
                                           "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                                           "Ankle boot"};
    tp_zoo_data_t *d = &a->info;
    tp_zoo_data_init(d);
    tp_image_source_info_t si;
    tp_image_source_info_init(&si);
    int channels = 1;
    int known = 0;  /* the data's classes are known, not a stand-in of 10 */
    if (a->spec || a->remote) {
        TP_TRY(tp_zoo_data_set_classes(d, 10, NULL));  /* the flags say */
    } else if (!strncmp(a->data, "fashion-mnist", 13)) {
        TP_TRY(tp_zoo_data_set_classes(d, 10, fmnist));
        known = 1;
    } else {
        tp_status_t rc = tp_image_source_info(a->data, &si);
        if (rc == TP_ERR_UNSUPPORTED) {  /* IDX and LMDB records: grey, 10 */
            TP_TRY(tp_zoo_data_set_classes(d, 10, NULL));
        } else if (rc != TP_OK) {
            return tp_error_wrap(rc, "--data");
        } else {
            channels = si.channels;
            known = 1;
            rc = tp_zoo_data_set_classes(d, si.nclasses, (const char *const *)si.classes);
            if (rc == TP_OK && !strncmp(a->data, "imagefolder:", 12))
                rc = s_not_split_folders(a->data, d);
            if (rc == TP_OK && a->test_data && !strncmp(a->data, "imagefolder:", 12) &&
                !strncmp(a->test_data, "imagefolder:", 12)) {
                /* the same classes in the same order, or the labels lie */
                tp_image_source_info_t ti;
                tp_image_source_info_init(&ti);
                rc = tp_image_source_info(a->test_data, &ti);
                for (int i = 0; rc == TP_OK && i < si.nclasses; i++) {
                    int found = 0;
                    for (int j = 0; j < ti.nclasses && !found; j++)
                        found = !strcmp(si.classes[i], ti.classes[j]);
                    if (!found)
                        rc = tp_error(TP_ERR_NOT_FOUND, "--test-data %s has no class "
                                      "folder '%s' (a class of --data %s)", a->test_data,
                                      si.classes[i], a->data);
                }
                for (int j = 0; rc == TP_OK && j < ti.nclasses; j++) {
                    int found = 0;
                    for (int i = 0; i < si.nclasses && !found; i++)
                        found = !strcmp(si.classes[i], ti.classes[j]);
                    if (!found)
                        rc = tp_error(TP_ERR_INVALID, "--test-data %s has a class folder "
                                      "'%s' that --data %s does not have", a->test_data,
                                      ti.classes[j], a->data);
                }
                tp_image_source_info_fini(&ti);
            }
            tp_image_source_info_fini(&si);
            TP_TRY(rc);
        }
    }
    d->channels = a->channels ? a->channels : channels;
    if (!a->spec && !a->remote && !a->classes && d->nclasses < 2)
        return tp_error(TP_ERR_INVALID, "--data %s holds 1 class ('%s'): a classifier needs "
                        "2 or more (an image folder: one sub-folder per class, "
                        "DIR/<class>/<image>; --classes N for more outputs than the data "
                        "have)", a->data, d->nclasses ? d->classes[0] : "");
    /* fewer outputs than the data's labels: refused here, by the flag,
     * rather than by the cost at the first step ("label 7 at row 1
     * outside [0,2)") */
    if (a->classes && known && a->classes < d->nclasses)
        return tp_error(TP_ERR_INVALID, "--classes %d is fewer than the %d classes of --data "
                        "%s (labels 0..%d): give %d or more, or leave --classes out",
                        a->classes, d->nclasses, a->data, d->nclasses - 1, d->nclasses);
    if (a->classes && a->classes != d->nclasses) {
        /* the names the data have, numbers for the rest */
        const char **names = calloc((size_t)a->classes, sizeof *names);
        if (!names)
            return tp_error(TP_ERR_NOMEM, "--classes");
        for (int i = 0; i < a->classes && i < d->nclasses; i++)
            names[i] = d->classes[i];
        tp_zoo_data_t tmp;
        tp_zoo_data_init(&tmp);
        tp_status_t rc = tp_zoo_data_set_classes(&tmp, a->classes, names);
        free(names);
        TP_TRY(rc);
        tp_zoo_data_fini(d);
        *d = tmp;
        d->channels = a->channels ? a->channels : channels;
    }
    if (d->channels == 3) {  /* ImageNet's statistics, RGB */
        static const float m[3] = {123.675f, 116.28f, 103.53f}, sd[3] = {58.395f, 57.12f, 57.375f};
        d->nnorm = 3;
        memcpy(d->mean, m, sizeof m);
        memcpy(d->std, sd, sizeof sd);
    }
    if (a->mean || a->std) {
        float mv[4] = {0}, sv[4] = {255};
        int nm = 1, ns = 1;
        if (a->mean)
            TP_TRY(s_norm_flag("--mean", a->mean, d->channels, 0, mv, &nm));
        else
            memcpy(mv, d->mean, sizeof mv), nm = d->nnorm;
        if (a->std)
            TP_TRY(s_norm_flag("--std", a->std, d->channels, 1, sv, &ns));
        else
            memcpy(sv, d->std, sizeof sv), ns = d->nnorm;
        d->nnorm = nm > ns ? nm : ns;
        for (int c = 0; c < d->nnorm; c++) {
            d->mean[c] = mv[nm == 1 ? 0 : c];
            d->std[c] = sv[ns == 1 ? 0 : c];
        }
    }
    if (!a->image_size) {
        a->image_size = d->channels == 3 ? 32 : 28;
        if (a->image_size < zoo->min_size)
            a->image_size = zoo->min_size;
    }
    if (!strcmp(a->preset, "imagenet"))  /* validation: short side x 256/224 */
        d->resize_short = (a->image_size * 256 + 112) / 224;
    /* the zoo's pipelines send uint8 and the model normalises, where the
     * augmentor made float32 before (colour, or --augment: tp-export keeps
     * their float32 [0, 1] input); a --spec, --remote or --resident input
     * brings its own images. Grey without augmentation was uint8 always:
     * at grey's default (mean 0, std 255) the model's cast to [0, 1] is
     * the whole normalisation ("pipeline": no ops, and its ONNX file keeps
     * the uint8 input); a --mean/--std of its own is the model's to apply
     * (it was recorded in data.json and applied by nothing). */
    float scale[4], shift[4];
    int identity = tp_zoo_data_affine(d, scale, shift);
    d->in_model = !a->spec && !a->remote && !a->resident &&
                  (d->channels == 3 || a->augment || !identity);
    /* a source the zoo's pipelines do not read (--data foo:bar, a mistyped
     * scheme) is refused here, with the other flags: it was refused only
     * when the pipeline was built, after the device probe and the log
     * directory */
    if (!a->spec && !a->remote) {
        TP_TRY(s_source_known("--data", a->data, d->channels));
        TP_TRY(s_source_files("--data", a->data));
        if (a->test_data) {
            TP_TRY(s_source_known("--test-data", a->test_data, d->channels));
            TP_TRY(s_source_files("--test-data", a->test_data));
        }
    }
    return TP_OK;
}

/* a.info's class names, freed at exit (main returns from many places) */
static tp_zoo_data_t *s_info;
static void s_info_free(void) {
    if (s_info)
        tp_zoo_data_fini(s_info);
}

static tp_status_t s_train_spec(const s_args_t *a, char *buf, size_t size) {
    if (a->spec && a->workers > 0)
        return s_spec_with_workers(a, buf, size);
    if (a->spec) {
        snprintf(buf, size, "%s", a->spec);
        return TP_OK;
    }
    if (a->remote) {
        /* tp-worker processes send whole batches */
        snprintf(buf, size, "remote:%s", a->remote);
        return TP_OK;
    }
    const char *src = a->data;
    char source[2048];
    int n = a->image_size;
    if (a->text) {
        /* windows of context + 1 bytes; the source's own held-out tail is
         * the validation split (s_test_spec) */
        char workers[64];
        s_processes_stage(a, workers, sizeof workers);
        snprintf(buf, size, "%s,context=%d%s | batch %d", src, a->context, workers, a->batch);
        return TP_OK;
    }
    if ((!strcmp(a->preset, "imagenet")
             ? tp_zoo_source_decoded(src, a->info.channels, n, n, source, sizeof source)
             : tp_zoo_source_shaped(strcmp(src, "fashion-mnist") ? src : "fashion-mnist:train",
                                    0, a->info.channels, n, n, source, sizeof source)) != TP_OK)
        return tp_error(TP_ERR_INVALID, "--data: %s", tp_last_error());
    if (!strcmp(a->preset, "imagenet")) {
        /* the random resized crop drawn before the decode: only the
         * crop's rows and columns of a JPEG are decoded */
        size_t len = strlen(source);
        if (snprintf(source + len, sizeof source - len, ",random-resized-crop=%d", n) >=
            (int)(sizeof source - len))
            return tp_error(TP_ERR_INVALID, "--data: too long");
    }
    char workers[64];
    s_processes_stage(a, workers, sizeof workers);
    char augment[512] = "";
    TP_TRY(s_augment_spec(a, augment, sizeof augment));
    snprintf(buf, size, "%s%s%s | batch %d", source, augment, workers, a->batch);
    return TP_OK;
}

static tp_status_t s_test_spec(const s_args_t *a, char *buf, size_t size) {
    if (a->test_spec) {
        snprintf(buf, size, "%s", a->test_spec);
        return TP_OK;
    }
    const char *src = a->test_data ? a->test_data : a->data;
    int n = a->image_size;
    if (a->text) {
        /* --test-data: a whole other file, in consecutive windows as the
         * val split is read (split=all alone draws random ones); else
         * --data's last tenth */
        const char *order = a->test_data && !strstr(src, "random=") ? ",random=0" : "";
        snprintf(buf, size, "%s,context=%d,split=%s%s | batch %d remainder", src, a->context,
                 a->test_data ? "all" : "val", order, a->batch);
        return TP_OK;
    }
    if (a->info.channels == 3 || !strcmp(a->preset, "imagenet")) {
        /* normalised as the training images, resized (or centre-cropped)
         * as tp-predict will: tp_zoo_eval_spec, from data.json's fields */
        if (!a->test_data)
            return tp_error(TP_ERR_INVALID, "--data %s has no test split: give "
                            "--test-data", src);
        char chain[3584];
        if (tp_zoo_eval_spec(src, &a->info, n, n, chain, sizeof chain) != TP_OK)
            return tp_error(TP_ERR_INVALID, "--test-data: %s", tp_last_error());
        snprintf(buf, size, "%s | batch 500 remainder", chain);
        return TP_OK;
    }
    char norm[64] = "";
    /* float32 in [0, 1], as the resident input's, and as a --spec or
     * --remote input that augments brings them (the model takes float32
     * then: the validation's uint8 would not fit it) */
    if (a->resident || (!a->info.in_model && a->augment))
        snprintf(norm, sizeof norm, " | augment crop=%d", n);
    if (strcmp(src, "fashion-mnist") && !a->test_data)
        return tp_error(TP_ERR_INVALID, "--data %s has no test split: give "
                        "--test-data", src);
    char source[2048];
    if (tp_zoo_source_sized(strcmp(src, "fashion-mnist") ? src : "fashion-mnist:test", 1,
                            n, n, source, sizeof source) != TP_OK)
        return tp_error(TP_ERR_INVALID, "--test-data: %s", tp_last_error());
    snprintf(buf, size, "%s%s | batch 500 remainder", source, norm);
    return TP_OK;
}

/* --resident: the source alone (no augment, no batch stage), read whole
 * into the towers' memory; the zoo's augmentation (crop at the image size,
 * pad 2, flip) runs there. `what` gets a line for the log. */
static tp_input_t *s_resident_input(const s_args_t *a, char *what, size_t size) {
    const char *src = a->data;
    char source[2048];
    int n = a->image_size;
    if (tp_zoo_source_sized(strcmp(src, "fashion-mnist") ? src : "fashion-mnist:train", 0,
                            n, n, source, sizeof source) != TP_OK) {
        tp_error(TP_ERR_INVALID, "--data: %s", tp_last_error());
        return NULL;
    }
    tp_dataflow_t *df = NULL;
    if (tp_spec_parse(source, &df) != TP_OK)
        return NULL;
    tp_resident_opts_t o;
    tp_resident_opts_init(&o);
    o.batch = a->batch;
    o.crop_h = o.crop_w = n;
    o.pad = a->augment ? a->pad : 0;
    o.flip = a->augment ? 1 : 0;
    snprintf(what, size, "ResidentInput over %s (crop %d, pad %d%s, batch %d)", source, n,
             o.pad, o.flip ? ", flip" : "", a->batch);
    return tp_input_resident(df, &o);
}

/* The last validation accuracy and the run's samples/s from stats.json. */
static void s_summary(const char *logdir, double wall, int64_t samples, int text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    double acc = NAN, flip = NAN, shift = NAN;
    if (j && json_array_size(j) > 0) {
        json_t *last = json_array_get(j, json_array_size(j) - 1);
        json_t *v = json_object_get(last, "validation_accuracy");
        if (json_is_number(v))
            acc = json_number_value(v);
        v = json_object_get(last, "validation_flip_accuracy");
        if (json_is_number(v))
            flip = json_number_value(v);
        v = json_object_get(last, "validation_flip_shift_accuracy");
        if (json_is_number(v))
            shift = json_number_value(v);
    }
    if (text) {  /* a language model: bits per byte and tokens/s */
        json_t *last = json_array_size(j) ? json_array_get(j, json_array_size(j) - 1) : NULL;
        json_t *bpb = json_object_get(last, "validation_bpb");
        json_t *tok = json_object_get(last, "tokens_per_s");
        if (json_is_number(bpb))
            printf("tp-train: validation %.4f bits per byte", json_number_value(bpb));
        else
            printf("tp-train: validation - (no validation ran)");
        printf(" | wall time %.1f s | %.0f tokens/s (last epoch)\n", wall,
               json_is_number(tok) ? json_number_value(tok) : 0.0);
        json_decref(j);
        return;
    }
    json_decref(j);
    if (!isnan(flip))
        printf("tp-train: test accuracy with the mirrored images (--tta) %.4f\n", flip);
    if (!isnan(shift))
        printf("tp-train: test accuracy with the mirrored and shifted images "
               "(--tta-shift) %.4f\n", shift);
    if (isnan(acc))  /* no validation ran: say so, not "nan" */
        printf("tp-train: test accuracy - (no validation ran) | wall time %.1f s"
               " | %.0f samples/s\n", wall, wall > 0 ? (double)samples / wall : 0.0);
    else
        printf("tp-train: test accuracy %.4f | wall time %.1f s | %.0f samples/s\n",
               acc, wall, wall > 0 ? (double)samples / wall : 0.0);
}

/* ---- --model dcgan: the GAN trainer (gan.h) ----------------------------- */

/* Adam per group at the zoo GAN's rate (or --lr) and beta1. */
static tp_optimizer_t *s_gan_optimizer(void *user) {
    const double *hp = user;  /* {lr, beta1} */
    return tp_optimizer_adam(hp[0], hp[1], 0.999, 1e-8);
}

/* tp-train --model dcgan: the zoo's GAN on the training images (their
 * labels unused), trained by GANTrainer with the noise drawn each step
 * (uniform in [-1, 1], seeded by --seed), the monitors of TP_GAN_MONITORS,
 * and SampleGrid: 64 samples from a fixed noise batch each epoch to
 * LOGDIR/samples-EPOCH.png and TensorBoard's Images tab. Takes --data,
 * --channels, --image-size (tp_zoo_gan_inputs_shaped: the generator's
 * channels and size are the data's),
 * --epochs, --batch, --lr, --steps-per-epoch, --towers, --threads, --seed,
 * --logdir, --logdir-action, --resume, --no-tensorboard, --log-every,
 * --devices (cpu, auto: the CPU; a GPU id), --tf32 and --bf16 (on a GPU),
 * --curve (a tcp --stats socket's keys). */
/* The flags --model dcgan does not read (the classifiers' and the gpt's):
 * refused by name rather than ignored, so that `--classes 3` or a
 * `--test-data` does not look as if it were used. TP_OK, or the first one
 * given. */
static tp_status_t s_gan_unread_flags(const s_args_t *a, const char *model) {
    const struct {
        int given;
        const char *flag, *why;
    } f[] = {
        {a->classes != 0, "--classes", "a GAN has no classes"},
        {!strncmp(a->data, "text:", 5), "--data text:FILE",
         "it draws images: give image data; text is --model gpt's"},
        {a->test_data || a->test_spec, "--test-data/--test-spec", "a GAN has no validation"},
        {a->spec != NULL, "--spec", "give the images with --data"},
        {a->augment >= 0 || a->pad != 2, "--augment/--no-augment/--pad",
         "the real images are not augmented"},
        {a->mean || a->std, "--mean/--std", "the images are mapped to [-1, 1]"},
        {a->resident || a->tta || a->label_smoothing > 0, "--resident/--tta/--label-smoothing",
         "the classifiers' flags"},
        {a->optimizer || a->weight_decay >= 0 || a->beta1 >= 0 || a->beta2 >= 0 ||
             a->clip_norm > 0 || a->ema > 0 || a->accumulate != 1 || a->nmults > 0,
         "--optimizer/--weight-decay/--beta1/--beta2/--clip-norm/--ema/--accumulate/"
         "--lr-mult/--freeze", "each player has Adam at --lr, beta1 0.5"},
        {strcmp(a->lr_schedule, "linear") || a->warmup > 0 || a->lr_end >= 0 ||
             a->lr_gamma != 0.1, "--lr-schedule/--warmup/--lr-end/--lr-gamma",
         "the rate is constant"},
        {a->remote || a->workers_mode, "--remote/--workers",
         "the pipeline runs in the trainer's process"},
        {a->job != NULL, "--job", "it names --remote's workers, and the pipeline runs "
         "in the trainer's process"},
        {a->context || a->layers || a->heads || a->embed || a->dropout > 0 || s_sample.given,
         "--context/--layers/--heads/--embed/--dropout/--sample-*", "--model gpt's flags"},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given)
            return tp_error(TP_ERR_INVALID, "--model %s does not take %s (%s); it takes "
                            "--data, --image-size, --channels, --epochs, --batch, --lr, "
                            "--steps-per-epoch, --towers, --threads, --seed, --devices, "
                            "--tf32, --bf16, --curve and the log flags (docs/training.md, "
                            "\"DCGAN in the zoo\")", model,
                            f[i].flag, f[i].why);
    return TP_OK;
}

static int s_train_gan(s_args_t *a, const tp_zoo_gan_t *gz, double lr) {
    enum { SAMPLES = 64 };
    if (s_gan_unread_flags(a, gz->name) != TP_OK)
        return s_fail("bad flags");
    if (a->epochs == 0)
        a->epochs = gz->default_epochs;
    if (a->batch == 0)
        a->batch = 64;
    if (a->towers == 0)
        a->towers = 1;
    if (strcmp(a->devices, "auto") && strcmp(a->devices, "cpu")) {
        char *end;
        long id = strtol(a->devices, &end, 10);
        if (*end || id < 0 || id > 1023) {
            tp_error(TP_ERR_INVALID, "--devices %s: --model %s trains on the CPU or one "
                     "GPU (an id)", a->devices, gz->name);
            return s_fail("bad flag");
        }
        a->device = (int)id;
    }
    /* the math flags reach the towers' device (cfg.tf32, cfg.bf16); on
     * the CPU tf32 changes nothing, said as the classifiers say it (bf16
     * there is oneDNN's bf16 products: train.c says if the CPU lacks them) */
    if (a->tf32 == 1 && a->device < 0)
        TP_WARN("--tf32: the towers run on the CPU, where it changes nothing");
    /* --curve: the keys of a tcp --stats socket (--remote is refused above) */
    if (a->curve && tp_stats_set_curve(a->curve) != TP_OK)
        return s_fail("--curve");
    if (tp_signals_install() < 0)
        return s_fail("signals");
    char logdir[4096], defdir[512];
    snprintf(defdir, sizeof defdir, "train_log/%s", gz->name);
    tp_logdir_action_t action = a->resume ? TP_LOGDIR_KEEP : TP_LOGDIR_ASK;
    if (a->action && tp_logdir_action_parse(a->action, &action) != TP_OK)
        return s_fail("--logdir-action");
    struct stat dst;
    if (a->resume && !a->create_logdir && stat(a->logdir ? a->logdir : defdir, &dst) != 0) {
        /* as for the classifiers: a mistyped path would otherwise start a
         * new run silently */
        tp_error(TP_ERR_NOT_FOUND, "--resume: the log directory %s does not exist (%s); "
                 "--create-logdir starts a new run there", a->logdir ? a->logdir : defdir,
                 strerror(errno));
        return s_fail("log directory");
    }
    if (tp_logdir_prepare(a->logdir ? a->logdir : defdir, action, logdir, sizeof logdir,
                          NULL) != TP_OK)
        return s_fail("log directory");
    char logfile[4200];
    snprintf(logfile, sizeof logfile, "%s/log.log", logdir);
    tp_log_set_file(logfile);

    /* the images' channels from the data (Fashion-MNIST, IDX, LMDB: grey;
     * CIFAR: colour; image folders and lists: their first image) unless
     * --channels says; the size --image-size, else 28 grey (the
     * Fashion-MNIST model) or 32 colour (CIFAR's); colour crosses the
     * pipeline uint8 channels first, [3,S,S] */
    const char *data = strcmp(a->data, "fashion-mnist") ? a->data : "fashion-mnist:train";
    int channels = 1;
    if (strncmp(data, "fashion-mnist", 13)) {
        tp_image_source_info_t si;
        tp_image_source_info_init(&si);
        tp_status_t irc = tp_image_source_info(data, &si);
        if (irc == TP_OK)
            channels = si.channels;
        tp_image_source_info_fini(&si);
        if (irc != TP_OK && irc != TP_ERR_UNSUPPORTED)
            return s_fail("--data");
    }
    if (a->channels)
        channels = a->channels;
    int size = a->image_size ? a->image_size : channels == 3 ? 32 : 28;
    tp_input_desc_t inputs[4];
    if (tp_zoo_gan_inputs_shaped(gz, channels, size, inputs) != TP_OK)
        return s_fail(a->image_size ? "--image-size" : "--data");
    char source[2048], spec[2200];
    tp_dataflow_t *train = NULL;
    if (tp_zoo_source_shaped(data, 0, channels, size, size, source, sizeof source) != TP_OK)
        return s_fail("--data");
    snprintf(spec, sizeof spec, "%s%s | batch %d", source,
             channels == 3 ? " | imgaug chw" : "", a->batch);
    if (tp_spec_parse(spec, &train) != TP_OK)
        return s_fail("training data");
    TP_INFO("training data: %s", spec);

    double hp[2] = {lr > 0 ? lr : gz->lr, gz->beta1};
    tp_model_desc_t desc = {inputs, gz->ninputs, gz->build, s_gan_optimizer, hp};
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.noise_input = gz->noise_input;
    gc.seed = (uint64_t)a->seed;
    gc.g_optimizer = s_gan_optimizer;
    gc.d_optimizer = s_gan_optimizer;
    gc.optimizer_user = hp;

    /* The fixed noise of the sample grids: a step no run trains (-1). */
    tp_tensor_t z;
    int64_t zs[2] = {SAMPLES, gz->zdim};
    if (tp_tensor_init(&z, TP_FLOAT32, 2, zs) != TP_OK) {
        tp_dataflow_destroy(&train);
        return s_fail("sample noise");
    }
    tp_gan_noise_fill(&gc, -1, 0, SAMPLES, gz->zdim, z.data);
    const char *znames[1] = {gz->inputs[gz->noise_input].name};
    tp_sample_grid_opts_t go;
    tp_sample_grid_opts_init(&go);
    go.output = gz->sample_output;
    go.input_names = znames;
    go.inputs = &z;
    go.ninputs = 1;
    go.lo = -1;
    go.hi = 1;
    go.tag = "samples";
    tp_callback_t *cbs[1] = {tp_cb_sample_grid(&go)};
    tp_tensor_fini(&z);  /* copied */
    if (!cbs[0]) {
        tp_dataflow_destroy(&train);
        return s_fail("SampleGrid");
    }

    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &desc;
    cfg.model_name = gz->name;
    cfg.dataflow = train;
    cfg.gan = &gc;
    cfg.infer_batch = SAMPLES;  /* the graph SampleGrid runs */
    cfg.towers = a->towers;
    cfg.batch = a->batch;
    cfg.seed = (uint64_t)a->seed;
    cfg.threads = a->threads;
    cfg.device = a->device;
    cfg.tf32 = a->tf32;
    cfg.bf16 = a->bf16;
    cfg.logdir = logdir;
    cfg.logdir_action = TP_LOGDIR_KEEP;  /* prepared above */
    cfg.auto_resume = a->resume;
    cfg.max_epoch = a->epochs;
    int64_t batches = tp_dataflow_size(train);
    int64_t group = a->towers;
    cfg.steps_per_epoch = a->steps_per_epoch ? a->steps_per_epoch
                        : batches > 0 ? (batches + group - 1) / group : 0;
    if (cfg.steps_per_epoch <= 0) {
        tp_error(TP_ERR_INVALID, "the training data's size is not known before it is read "
                 "(%s): give --steps-per-epoch", spec);
        tp_callback_destroy(&cbs[0]);
        tp_train_config_fini(&cfg);
        return s_fail("steps per epoch");
    }
    cfg.progress_names = TP_GAN_MONITORS;
    cfg.stats = a->stats;
    cfg.tensorboard = !a->no_tensorboard;
    cfg.save_checkpoints = !a->no_checkpoints;
    cfg.plots = !a->no_plots;
    cfg.log_every_n_steps = a->log_every;
    cfg.callbacks = cbs;
    cfg.ncallbacks = 1;
    printf("tp-train: model %s (%s) on %s %dx%d images, %d tower%s x batch %d, %d epoch%s "
           "x %lld steps, Adam lr %g beta1 %g per player, logdir %s\n", gz->name, gz->summary,
           channels == 3 ? "colour" : "grey", size, size, a->towers, a->towers > 1 ? "s" : "",
           a->batch, a->epochs, a->epochs > 1 ? "s" : "", (long long)cfg.steps_per_epoch,
           hp[0], hp[1], logdir);
    fflush(stdout);
    double t0 = tp_now_s();
    tp_status_t rc = tp_launch_train_with_config(&cfg, NULL);
    double wall = tp_now_s() - t0;
    if (rc < 0 && rc != TP_ERR_INTERRUPTED)
        return s_fail("training");
    char stats[4200], png[4200];
    snprintf(stats, sizeof stats, "%s/stats.json", logdir);
    snprintf(png, sizeof png, "%s/curves.png", logdir);
    if (!a->no_plots && access(stats, F_OK) == 0 && tp_plot_stats(stats, png) != TP_OK)
        fprintf(stderr, "tp-train: plotting: %s\n", tp_last_error());
    printf("tp-train: wall time %.1f s | samples %s/samples-*.png, checkpoints "
           "%s%s, stats %s, plots %s\n", wall, logdir, logdir,
           a->no_checkpoints ? ": none (--no-checkpoints)" : "/model-*.safetensors", stats,
           a->no_plots ? "none (--no-plots)" : png);
    fflush(stdout);
    return rc == TP_ERR_INTERRUPTED ? 128 + (tp_signal_pending() ? tp_signal_pending() : 2)
                                    : 0;
}

/* --resume into a log directory whose latest checkpoint records another
 * model (a gpt run resumed as --model cnn, a forgotten --model): refused
 * naming both, rather than failing on the variables that do not match. */
static tp_status_t s_resume_same_model(const s_args_t *a) {
    char dir[4096], ckpt[4096];
    snprintf(dir, sizeof dir, "%s", a->logdir ? a->logdir : "");
    if (!a->logdir)
        snprintf(dir, sizeof dir, "train_log/%s", a->model);
    tp_checkpoint_info_t ti;
    if (tp_checkpoint_find_latest(dir, ckpt, sizeof ckpt) != TP_OK ||
        tp_checkpoint_info(ckpt, &ti) != TP_OK || !ti.model[0] || !strcmp(ti.model, a->model))
        return TP_OK;  /* nothing to resume, or the resume reports it */
    return tp_error(TP_ERR_INVALID, "%s holds a run of --model %s, not of --model %s: give "
                    "--model %s to go on with it, or another --logdir", ckpt, ti.model,
                    a->model, ti.model);
}

/* --resume of a --model gpt run at another shape (--layers 2 where the
 * run had 1, or the shape flags left out, so the defaults): refused
 * naming the flags that differ and the checkpoint's whole shape, to be
 * given again; else the resume fails on the missing variables. After the
 * defaults are applied (a->layers ... set). */
static tp_status_t s_resume_same_gpt_shape(const s_args_t *a) {
    char dir[4096], ckpt[4096];
    snprintf(dir, sizeof dir, "%s", a->logdir ? a->logdir : "train_log/gpt");
    tp_safetensors_t *st = NULL;
    if (tp_checkpoint_find_latest(dir, ckpt, sizeof ckpt) != TP_OK ||
        tp_safetensors_open(ckpt, &st) != TP_OK)
        return TP_OK;  /* nothing to resume, or the resume reports it */
    static const char *const keys[] = {"layers", "heads", "embed", "context"};
    const int want[] = {a->layers, a->heads, a->embed, a->context};
    long had[4];
    char differ[256] = "", shape[256] = "";
    size_t nd = 0, ns = 0;
    int recorded = 1;
    for (int i = 0; i < 4; i++) {
        const char *v = tp_safetensors_meta(st, keys[i]);
        char *end = NULL;
        had[i] = v ? strtol(v, &end, 10) : 0;
        if (!v || *end || had[i] < 1) {
            recorded = 0;  /* an older checkpoint: the resume says what fails */
            break;
        }
        ns += (size_t)snprintf(shape + ns, sizeof shape - ns, "%s--%s %ld", i ? " " : "",
                               keys[i], had[i]);
        if (had[i] != want[i] && nd < sizeof differ)
            nd += (size_t)snprintf(differ + nd, sizeof differ - nd, "%s--%s %d (it has %ld)",
                                   nd ? ", " : "", keys[i], want[i], had[i]);
    }
    tp_safetensors_destroy(&st);
    if (!recorded || !differ[0])
        return TP_OK;
    return tp_error(TP_ERR_INVALID, "%s holds a gpt of another shape than this run's %s: "
                    "give its shape, %s, to go on with it, or another --logdir", ckpt,
                    differ, shape);
}

int main(int argc, char **argv) {
    /* static: a.info is freed by an exit handler (s_info_free), which runs
     * after main's frame is gone */
    static s_args_t a = {.model = "cnn", .data = "fashion-mnist", .devices = "auto",
                  .action = NULL, .optimizer = NULL, .batch = 0, .towers = 0,
                  .seed = 1, .augment = -1, .worker_restarts = 3, .device = -1,
                  .image_size = 0, .tf32 = -1, .bf16 = -1, .pad = 2, .lr_end = -1,
                  .lr_schedule = "linear", .lr_gamma = 0.1,
                  .log_every = 50, .weight_decay = -1, .beta1 = -1, .beta2 = -1,
                  .accumulate = 1};
    enum { O_TEST = 256, O_ACTION, O_STEPS, O_SPEC, O_TEST_SPEC, O_AUG, O_NOAUG, O_OPT, O_NOTB,
           O_RESTARTS, O_SIZE, O_TF32, O_BF16, O_RESIDENT, O_PAD, O_TTA, O_TTA_SHIFT, O_SMOOTH,
           O_LR_END, O_WARMUP, O_CREATE_LOGDIR, O_LOG_EVERY, O_WD, O_BETA1, O_BETA2, O_CLIP, O_EMA, O_LR_MULT,
           O_FREEZE, O_ACCUMULATE, O_CHANNELS, O_CLASSES, O_MEAN, O_STD, O_LR_SCHEDULE,
           O_LR_GAMMA, O_JOB, O_CONTEXT, O_LAYERS, O_HEADS, O_EMBED,
           O_DROPOUT, O_SAMPLE_PROMPT, O_SAMPLE_TOKENS, O_SAMPLE_TEMPERATURE,
           O_SAMPLE_TOP_K, O_NOCKPT, O_NOPLOTS };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"data", required_argument, 0, 'd'},
        {"image-size", required_argument, 0, O_SIZE},
        {"test-data", required_argument, 0, O_TEST}, {"epochs", required_argument, 0, 'e'},
        {"batch", required_argument, 0, 'b'}, {"lr", required_argument, 0, 'l'},
        {"optimizer", required_argument, 0, O_OPT},
        {"devices", required_argument, 0, 'D'}, {"towers", required_argument, 0, 't'},
        {"workers", required_argument, 0, 'w'}, {"threads", required_argument, 0, 'j'},
        {"worker-restarts", required_argument, 0, O_RESTARTS},
        {"logdir", required_argument, 0, 'o'}, {"logdir-action", required_argument, 0, O_ACTION},
        {"resume", no_argument, 0, 'r'}, {"seed", required_argument, 0, 's'},
        {"create-logdir", no_argument, 0, O_CREATE_LOGDIR},
        {"steps-per-epoch", required_argument, 0, O_STEPS},
        {"spec", required_argument, 0, O_SPEC}, {"test-spec", required_argument, 0, O_TEST_SPEC},
        {"stats", required_argument, 0, 'S'},
        {"remote", required_argument, 0, 'R'},
        {"curve", required_argument, 0, 'K'}, {"public", no_argument, 0, 'P'},
        {"no-tensorboard", no_argument, 0, O_NOTB},
        {"no-checkpoints", no_argument, 0, O_NOCKPT},
        {"no-plots", no_argument, 0, O_NOPLOTS}, {"tf32", no_argument, 0, O_TF32},
        {"bf16", no_argument, 0, O_BF16},
        {"augment", optional_argument, 0, O_AUG},
        {"channels", required_argument, 0, O_CHANNELS},
        {"classes", required_argument, 0, O_CLASSES},
        {"mean", required_argument, 0, O_MEAN}, {"std", required_argument, 0, O_STD}, {"no-augment", no_argument, 0, O_NOAUG},
        {"resident", no_argument, 0, O_RESIDENT}, {"pad", required_argument, 0, O_PAD},
        {"tta", no_argument, 0, O_TTA},
        {"tta-shift", no_argument, 0, O_TTA_SHIFT},
        {"label-smoothing", required_argument, 0, O_SMOOTH},
        {"lr-end", required_argument, 0, O_LR_END},
        {"warmup", required_argument, 0, O_WARMUP},
        {"warmup-epochs", required_argument, 0, O_WARMUP},
        {"lr-schedule", required_argument, 0, O_LR_SCHEDULE},
        {"lr-gamma", required_argument, 0, O_LR_GAMMA},
        {"log-every", required_argument, 0, O_LOG_EVERY},
        {"weight-decay", required_argument, 0, O_WD},
        {"beta1", required_argument, 0, O_BETA1},
        {"beta2", required_argument, 0, O_BETA2},
        {"clip-norm", required_argument, 0, O_CLIP},
        {"ema", required_argument, 0, O_EMA},
        {"lr-mult", required_argument, 0, O_LR_MULT},
        {"freeze", required_argument, 0, O_FREEZE},
        {"accumulate", required_argument, 0, O_ACCUMULATE},
        {"job", required_argument, 0, O_JOB},
        {"context", required_argument, 0, O_CONTEXT},
        {"layers", required_argument, 0, O_LAYERS},
        {"heads", required_argument, 0, O_HEADS},
        {"embed", required_argument, 0, O_EMBED},
        {"dropout", required_argument, 0, O_DROPOUT},
        {"sample-prompt", required_argument, 0, O_SAMPLE_PROMPT},
        {"sample-tokens", required_argument, 0, O_SAMPLE_TOKENS},
        {"sample-temperature", required_argument, 0, O_SAMPLE_TEMPERATURE},
        {"sample-top-k", required_argument, 0, O_SAMPLE_TOP_K},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    int64_t v;
    double lr = -1;
    int data_given = 0;  /* --data on the command line (a.data has a default) */
    int restarts_given = 0; /* --worker-restarts on the command line */
    int li = -1; /* the long option's index: aliases are named as typed */
    while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        switch (c) {
        case 'm': a.model = optarg; break;
        case O_SIZE: if (tp_spec_int(optarg, 1, TP_ZOO_MAX_SIZE, "--image-size", &v)) return s_fail("bad flag"); a.image_size = (int)v; break;
        case 'd': a.data = optarg; data_given = 1; break;
        case O_TEST: a.test_data = optarg; break;
        case 'e': if (tp_spec_int(optarg, 1, 100000, "--epochs", &v)) return s_fail("bad flag"); a.epochs = (int)v; break;
        case 'b': if (tp_spec_int(optarg, 1, 1 << 20, "--batch", &v)) return s_fail("bad flag"); a.batch = (int)v; break;
        case 'l': if (tp_spec_double(optarg, "--lr", &lr) || !(lr > 0)) { tp_error(TP_ERR_INVALID, "--lr needs a positive number, got '%s'", optarg); return s_fail("bad flag"); } break;
        case O_OPT: a.optimizer = optarg; break;
        case 'D': a.devices = optarg; break;
        case 't':
            if (!strcmp(optarg, "auto")) { a.towers = 0; break; }
            if (tp_spec_int(optarg, 1, 64, "--towers", &v)) return s_fail("bad flag");
            a.towers = (int)v;
            break;
        case 'w':
            if (!strcmp(optarg, "auto")) { a.workers = 0; a.workers_mode = 2; break; }
            if (tp_spec_int(optarg, 0, 256, "--workers", &v)) return s_fail("bad flag");
            a.workers = (int)v;
            a.workers_mode = 1;
            break;
        case O_RESTARTS: if (tp_spec_int(optarg, 0, 1000000, "--worker-restarts", &v)) return s_fail("bad flag"); a.worker_restarts = (int)v; restarts_given = 1; break;
        case 'j': if (tp_spec_int(optarg, 0, 1024, "--threads", &v)) return s_fail("bad flag"); a.threads = (int)v; break;
        case 'o': a.logdir = optarg; break;
        case O_ACTION: a.action = optarg; break;
        case 'r': a.resume = 1; break;
        case O_CREATE_LOGDIR: a.create_logdir = 1; break;
        case 's': if (tp_spec_int(optarg, 0, INT64_MAX, "--seed", &v)) return s_fail("bad flag"); a.seed = v; break;
        case O_STEPS: if (tp_spec_int(optarg, 1, INT64_MAX, "--steps-per-epoch", &v)) return s_fail("bad flag"); a.steps_per_epoch = v; break;
        case O_SPEC: a.spec = optarg; break;
        case O_TEST_SPEC: a.test_spec = optarg; break;
        case 'S': a.stats = optarg; break;
        case 'R': a.remote = optarg; break;
        case 'K': a.curve = optarg; break;
        case O_JOB: a.job = optarg; break;
        case 'P': a.public_bind = 1; tp_bind_set_public(1); break;
        case O_AUG: {
            /* --augment alone is the zoo's crop and flip; --augment PRESET
             * (or =PRESET) names one */
            static const char *const presets[] = {"crop", "cifar", "imagenet", "none"};
            const char *p = optarg;
            if (!p && optind < argc)
                for (int i = 0; i < 4; i++)
                    if (!strcmp(argv[optind], presets[i]))
                        p = argv[optind++];
            int ok = !p;
            for (int i = 0; p && i < 4; i++)
                ok |= !strcmp(p, presets[i]);
            if (!ok) {
                tp_error(TP_ERR_INVALID, "--augment '%s': crop, cifar, imagenet or none", p);
                return s_fail("bad flag");
            }
            a.preset = p ? p : "crop";
            a.augment = strcmp(a.preset, "none") != 0;
            break;
        }
        case O_CHANNELS:
            if (tp_spec_int(optarg, 1, 3, "--channels", &v) || v == 2) {
                tp_error(TP_ERR_INVALID, "--channels '%s': 1 (grey) or 3 (colour)", optarg);
                return s_fail("bad flag");
            }
            a.channels = (int)v;
            break;
        case O_CLASSES: if (tp_spec_int(optarg, 1, 1000000, "--classes", &v)) return s_fail("bad flag"); a.classes = (int)v; break;
        case O_MEAN: a.mean = optarg; break;
        case O_STD: a.std = optarg; break;
        case O_RESIDENT: a.resident = 1; break;
        case O_TTA: a.tta = a.tta > 1 ? a.tta : 1; break;
        case O_TTA_SHIFT: a.tta = 2; break;
        case O_SMOOTH:
            if (tp_spec_double(optarg, "--label-smoothing", &a.label_smoothing) ||
                !(a.label_smoothing >= 0 && a.label_smoothing < 1)) {
                tp_error(TP_ERR_INVALID, "--label-smoothing needs a number in [0, 1), "
                         "got '%s'", optarg);
                return s_fail("bad flag");
            }
            break;
        case O_LR_END:
            if (tp_spec_double(optarg, "--lr-end", &a.lr_end) || !(a.lr_end >= 0 && a.lr_end <= 1)) {
                tp_error(TP_ERR_INVALID, "--lr-end needs a fraction in [0, 1], got '%s'", optarg);
                return s_fail("bad flag");
            }
            break;
        case O_LR_SCHEDULE: a.lr_schedule = optarg; break;
        case O_LR_GAMMA:
            if (tp_spec_double(optarg, "--lr-gamma", &a.lr_gamma) ||
                !(a.lr_gamma > 0 && a.lr_gamma <= 1)) {
                tp_error(TP_ERR_INVALID, "--lr-gamma needs a factor in (0, 1], got '%s'",
                         optarg);
                return s_fail("bad flag");
            }
            break;
        case O_WARMUP:
            a.warmup_flag = li >= 0 && !strcmp(opts[li].name, "warmup-epochs")
                                ? "--warmup-epochs" : "--warmup";
            if (tp_spec_double(optarg, a.warmup_flag, &a.warmup) || !(a.warmup >= 0)) {
                tp_error(TP_ERR_INVALID, "%s needs a number of epochs >= 0, got '%s'",
                         a.warmup_flag, optarg);
                return s_fail("bad flag");
            }
            break;
        case O_WD:
            if (tp_spec_double(optarg, "--weight-decay", &a.weight_decay) ||
                !(a.weight_decay >= 0 && a.weight_decay < 1e30)) {
                tp_error(TP_ERR_INVALID, "--weight-decay needs a number >= 0, got '%s'",
                         optarg);
                return s_fail("bad flag");
            }
            break;
        case O_BETA1:
        case O_BETA2: {
            double *beta = c == O_BETA1 ? &a.beta1 : &a.beta2;
            if (tp_spec_double(optarg, c == O_BETA1 ? "--beta1" : "--beta2", beta) ||
                !(*beta >= 0 && *beta < 1)) {
                tp_error(TP_ERR_INVALID, "%s needs a number in [0, 1), got '%s'",
                         c == O_BETA1 ? "--beta1" : "--beta2", optarg);
                return s_fail("bad flag");
            }
            break;
        }
        case O_CLIP:
            if (tp_spec_double(optarg, "--clip-norm", &a.clip_norm) ||
                !(a.clip_norm > 0 && a.clip_norm < 1e30)) {
                tp_error(TP_ERR_INVALID, "--clip-norm needs a norm > 0, got '%s'", optarg);
                return s_fail("bad flag");
            }
            break;
        case O_EMA:
            if (tp_spec_double(optarg, "--ema", &a.ema) || !(a.ema > 0 && a.ema < 1)) {
                tp_error(TP_ERR_INVALID, "--ema needs a decay in (0, 1), e.g. 0.999, got "
                         "'%s'", optarg);
                return s_fail("bad flag");
            }
            break;
        case O_ACCUMULATE:
            if (tp_spec_int(optarg, 1, 1 << 20, "--accumulate", &v))
                return s_fail("bad flag");
            a.accumulate = (int)v;
            break;
        case O_LR_MULT:
        case O_FREEZE: {
            const char *flag = c == O_FREEZE ? "--freeze" : "--lr-mult";
            char *eq = c == O_FREEZE ? NULL : strrchr(optarg, '=');
            double mult = 0;
            if (c == O_LR_MULT &&
                (!eq || eq == optarg || tp_spec_double(eq + 1, "--lr-mult", &mult) ||
                 !(mult >= 0))) {
                tp_error(TP_ERR_INVALID, "--lr-mult needs PATTERN=MULTIPLIER with a "
                         "multiplier >= 0 (e.g. 'conv0/*=0.1'), got '%s'", optarg);
                return s_fail("bad flag");
            }
            if (!*optarg || a.nmults == 16) {
                tp_error(TP_ERR_INVALID, "%s: %s", flag, *optarg ? "at most 16 patterns "
                         "in all" : "an empty pattern");
                return s_fail("bad flag");
            }
            /* the pattern: optarg up to the '=' (kept until exit) */
            const char *pat = eq ? strndup(optarg, (size_t)(eq - optarg)) : optarg;
            if (!pat)
                return s_fail("out of memory");
            a.mult_pattern[a.nmults] = pat;
            a.mult[a.nmults++] = mult;
            break;
        }
        case O_PAD: if (tp_spec_int(optarg, 0, 64, "--pad", &v)) return s_fail("bad flag"); a.pad = (int)v; break;
        case O_NOAUG: a.augment = 0; a.preset = "none"; break;
        case O_NOTB: a.no_tensorboard = 1; break;
        case O_NOCKPT: a.no_checkpoints = 1; break;
        case O_NOPLOTS: a.no_plots = 1; break;
        case O_LOG_EVERY:
            if (tp_spec_int(optarg, 0, INT64_MAX, "--log-every", &v))
                return s_fail("bad flag");
            a.log_every = v;
            break;
        case O_CONTEXT: if (tp_spec_int(optarg, 1, TP_ZOO_GPT_MAX_CONTEXT, "--context", &v)) return s_fail("bad flag"); a.context = (int)v; break;
        case O_LAYERS: if (tp_spec_int(optarg, 1, 256, "--layers", &v)) return s_fail("bad flag"); a.layers = (int)v; break;
        case O_HEADS: if (tp_spec_int(optarg, 1, 256, "--heads", &v)) return s_fail("bad flag"); a.heads = (int)v; break;
        case O_DROPOUT:
            if (tp_spec_double(optarg, "--dropout", &a.dropout) ||
                !(a.dropout >= 0 && a.dropout < 1)) {
                tp_error(TP_ERR_INVALID, "--dropout needs a rate in [0, 1), got '%s'", optarg);
                return s_fail("bad flag");
            }
            break;
        case O_EMBED: if (tp_spec_int(optarg, 1, 65536, "--embed", &v)) return s_fail("bad flag"); a.embed = (int)v; break;
        case O_SAMPLE_PROMPT: case O_SAMPLE_TOKENS: case O_SAMPLE_TEMPERATURE:
        case O_SAMPLE_TOP_K:
            if (s_sample_flag(c - O_SAMPLE_PROMPT, optarg))
                return s_fail("bad flag");
            break;
        case O_TF32: a.tf32 = 1; break;
        case O_BF16: a.bf16 = 1; break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tp-train: unexpected argument '%s'\n", argv[optind]);
        s_usage(stderr);
        return 2;
    }
    if (a.resume && s_resume_same_model(&a) != TP_OK)
        return s_fail("--resume");
    const tp_zoo_gan_t *gz = tp_zoo_find_gan(a.model);
    if (gz)
        return s_train_gan(&a, gz, lr);
    const tp_zoo_model_t *zoo = tp_zoo_find(a.model);
    if (!zoo)
        return s_fail("--model");
    if (a.epochs == 0)
        a.epochs = zoo->default_epochs;
    if (a.augment < 0)
        a.augment = zoo->augment;
    if (!a.preset)
        a.preset = a.augment ? "crop" : "none";
    s_info = &a.info;
    atexit(s_info_free);
    a.text = !strcmp(zoo->name, "gpt");
    if (!a.text && (a.context || a.layers || a.heads || a.embed)) {
        tp_error(TP_ERR_INVALID, "--context, --layers, --heads and --embed shape "
                 "--model gpt (the model is %s)", zoo->name);
        return s_fail("bad flags");
    }
    if (!a.text && s_sample.given) {
        tp_error(TP_ERR_INVALID, "--sample-prompt, --sample-tokens, --sample-temperature "
                 "and --sample-top-k are --model gpt's (the model is %s)", zoo->name);
        return s_fail("bad flags");
    }
    if (!a.text && a.data && !strncmp(a.data, "text:", 5)) {
        tp_error(TP_ERR_INVALID, "--data %s: a text source trains --model gpt (the model "
                 "is %s, which reads images)", a.data, zoo->name);
        return s_fail("bad flags");
    }
    if (!a.text && a.dropout > 0) {
        tp_error(TP_ERR_INVALID, "--dropout is --model gpt's (the image models have their "
                 "own; the model is %s)", zoo->name);
        return s_fail("bad flags");
    }
    if (a.text) {
        /* text: bytes as tokens, no images, no classes */
        if (!a.context)
            a.context = TP_ZOO_GPT_CONTEXT;
        a.layers = a.layers ? a.layers : TP_ZOO_GPT_LAYERS;
        a.heads = a.heads ? a.heads : TP_ZOO_GPT_HEADS;
        a.embed = a.embed ? a.embed : TP_ZOO_GPT_EMBED;
        if (a.embed % a.heads) {
            tp_error(TP_ERR_INVALID, "--embed %d is not a multiple of --heads %d", a.embed,
                     a.heads);
            return s_fail("bad flags");
        }
        if (a.resume && s_resume_same_gpt_shape(&a) != TP_OK)
            return s_fail("--resume");
        if (!a.spec && strncmp(a.data, "text:", 5)) {
            tp_error(TP_ERR_INVALID, "--model gpt trains on text: give --data text:FILE "
                     "(bytes as tokens; docs/dataflow.md, \"Text\"), not '%s'%s", a.data,
                     data_given ? "" : " (the default --data, for the image models)");
            return s_fail("bad flags");
        }
        if ((a.data && strstr(a.data, "context=")) ||
            (a.test_data && strstr(a.test_data, "context="))) {
            tp_error(TP_ERR_INVALID, "--model gpt: give the context as --context T, not "
                     "in the text: source (it is the model's too)");
            return s_fail("bad flags");
        }
        if (a.test_data && strncmp(a.test_data, "text:", 5)) {
            tp_error(TP_ERR_INVALID, "--test-data '%s': --model gpt validates on text: "
                     "(default: the last tenth of --data)", a.test_data);
            return s_fail("bad flags");
        }
        if (a.augment > 0 || a.resident || a.tta || a.remote || a.label_smoothing > 0 ||
            a.channels || a.classes || a.image_size || a.mean || a.std) {
            tp_error(TP_ERR_INVALID, "--model gpt: --augment, --resident, --tta, --remote, "
                     "--label-smoothing, --channels, --classes, --image-size, --mean and "
                     "--std are for the image models");
            return s_fail("bad flags");
        }
        /* the embedding's rows: 256 bytes, or the BPE vocabulary's */
        const char *tsrc = a.data && !strncmp(a.data, "text:", 5) ? a.data : a.spec;
        a.tokens.vocab = 256;
        /* probed at --context (--data holds none: refused above), so a
         * file too short is measured against the windows it will give */
        char probe[8192];
        if (tsrc == a.data && tsrc) {
            size_t stage = strcspn(tsrc, "|");
            while (stage > 5 && tsrc[stage - 1] == ' ')
                stage--;
            snprintf(probe, sizeof probe, "%.*s,context=%d%s", (int)stage, tsrc, a.context,
                     tsrc + stage);
            tsrc = probe;
        }
        if (tsrc && !strncmp(tsrc, "text:", 5) &&
            tp_df_text_spec_info(tsrc, 0, &a.tokens) != TP_OK)
            return s_fail("--data");
        a.augment = 0;
        a.preset = "none";
        tp_zoo_data_init(&a.info);
        a.image_size = 1;  /* unused: no images */
    } else {
        if (s_data_info(&a, zoo) != TP_OK)
            return s_fail("data");
        if (tp_zoo_check_size(zoo, a.image_size, a.image_size) != TP_OK)
            return s_fail("--image-size");
    }
    if (a.info.channels == 3 && (a.resident || a.tta)) {
        tp_error(TP_ERR_INVALID, "%s: grey images only (the data are colour)",
                 a.resident ? "--resident" : "--tta");
        return s_fail("bad flags");
    }
    if (!a.optimizer)
        a.optimizer = zoo->optimizer;
    /* Adam's and AdamW's default rate: the model's SGD rate / 50 */
    const int adam_like = !strcasecmp(a.optimizer, "adam") || !strcasecmp(a.optimizer, "adamw");
    a.lr = lr > 0 ? lr : zoo->default_lr * (adam_like ? 0.02 : 1.0);
    if (a.warmup >= a.epochs) {
        tp_error(TP_ERR_INVALID, "%s %g: the warm-up must end before the last of "
                 "the %d epochs", a.warmup_flag ? a.warmup_flag : "--warmup", a.warmup, a.epochs);
        return s_fail("bad flag");
    }
    tp_lr_kind_t lr_kind;
    double miles[TP_LR_MAX_MILESTONES];
    int nmiles = 0;
    if (s_parse_lr_schedule(a.lr_schedule, a.epochs, &lr_kind, miles, &nmiles) != TP_OK)
        return s_fail("bad flag");
    if (lr_kind == TP_LR_STEP && a.lr_end >= 0) {
        tp_error(TP_ERR_INVALID, "--lr-end is where the linear and cosine schedules end; "
                 "the step schedule ends where its milestones leave it (--lr-gamma)");
        return s_fail("bad flags");
    }
    if (a.lr_end < 0)  /* cosine to 0 as torch's CosineAnnealingLR; linear to a twentieth */
        a.lr_end = lr_kind == TP_LR_COSINE ? 0.0 : 0.05;
    if (strcasecmp(a.optimizer, "sgd") && !adam_like) {
        tp_error(TP_ERR_INVALID, "--optimizer '%s': sgd, adam or adamw", a.optimizer);
        return s_fail("bad flag");
    }
    if (a.weight_decay >= 0 && !strcasecmp(a.optimizer, "adam")) {
        tp_error(TP_ERR_INVALID, "--weight-decay is AdamW's decoupled decay or SGD's "
                 "coupled one: it needs --optimizer adamw or sgd (the optimizer is adam)");
        return s_fail("bad flag");
    }
    /* SGD's --weight-decay C replaces the zoo models' own L2 term (its C
     * in the cost's gradient): the same arithmetic, torch.optim.SGD's */
    /* Without the flag, the model's own C goes to SGD the same way: the same
     * arithmetic, in the update's own pass instead of the L2 op's passes
     * over every weight in the graph (docs/history.md, "Weight decay
     * in SGD's pass") */
    if (a.weight_decay < 0 && !strcasecmp(a.optimizer, "sgd") && zoo->weight_decay > 0)
        a.weight_decay = zoo->weight_decay;
    int sgd_decay = a.weight_decay >= 0 && !strcasecmp(a.optimizer, "sgd");
    if ((a.beta1 >= 0 || a.beta2 >= 0) && !adam_like) {
        tp_error(TP_ERR_INVALID, "--beta1 and --beta2 are Adam's: they need --optimizer "
                 "adam or adamw (the optimizer is %s)", a.optimizer);
        return s_fail("bad flag");
    }
    /* torch.optim.AdamW's defaults; the gpt's are nanoGPT's (and GPT-2's) */
    if (a.weight_decay < 0)
        a.weight_decay = strcasecmp(a.optimizer, "adamw") ? 0.0 : a.text ? 0.1 : 0.01;
    if (a.beta1 < 0)
        a.beta1 = 0.9;
    if (a.beta2 < 0)
        a.beta2 = a.text ? 0.95 : 0.999;
    /* Under a launcher: MPI first, before anything starts a thread or forks
     * (and fork after MPI_Init is what Open MPI warns against: no forked
     * dataflow workers, no forked CUDA probe). */
    int rank = 0, nranks = 1;
    const char *launcher = NULL;
    char remote_buf[2048], spec_buf[2048], stats_buf[2048];
    int own_data = 0;   /* each rank reads its own data: no sharding */
    if (tp_dist_env(&rank, &nranks, &launcher)) {
        if (a.workers > 0) {
            tp_error(TP_ERR_UNSUPPORTED, "--workers %d under %s: MPI and fork() "
                     "do not mix; start tp-worker processes beside the ranks and "
                     "use --remote (docs/distributed.md)", a.workers, launcher);
            fprintf(stderr, "tp-train: rank %d: %s\n", rank, tp_last_error());
            return 2;
        }
        if (tp_dist_open(&s_dist) != TP_OK) {
            fprintf(stderr, "tp-train: rank %d of %d (%s): %s\n", rank, nranks,
                    launcher, tp_last_error());
            return 1;
        }
        rank = tp_dist_rank(s_dist);
        nranks = tp_dist_size(s_dist);
        if (rank != 0 && !getenv("TP_LOG_LEVEL"))
            tp_log_set_level(TP_LOG_WARN);  /* rank 0 tells the story */
        if (a.remote) {
            s_subst_rank(a.remote, rank, remote_buf, sizeof remote_buf);
            a.remote = remote_buf;
            own_data = 1;
        }
        if (a.stats && strstr(a.stats, "rank}")) {  /* a socket per rank (issue 47) */
            s_subst_rank(a.stats, rank, stats_buf, sizeof stats_buf);
            a.stats = stats_buf;
        }
        if (a.spec && strstr(a.spec, "rank}")) {  /* e.g. lmdb:part{rank}.lmdb */
            s_subst_rank(a.spec, rank, spec_buf, sizeof spec_buf);
            a.spec = spec_buf;
            own_data = 1;
        }
        TP_INFO("distributed: rank %d of %d on %s (%s)", rank, nranks,
                tp_dist_host(s_dist), launcher);
    } else {
        /* One process is rank 0 of 1: the command line of an mpirun
         * (--remote '@tcp://0.0.0.0:{5550+rank}') also runs without one,
         * instead of binding the literal text and failing with EINVAL. */
        if (a.remote && strstr(a.remote, "rank}")) {
            s_subst_rank(a.remote, 0, remote_buf, sizeof remote_buf);
            a.remote = remote_buf;
        }
        if (a.stats && strstr(a.stats, "rank}")) {
            s_subst_rank(a.stats, 0, stats_buf, sizeof stats_buf);
            a.stats = stats_buf;
        }
        if (a.spec && strstr(a.spec, "rank}")) {
            s_subst_rank(a.spec, 0, spec_buf, sizeof spec_buf);
            a.spec = spec_buf;
        }
    }
    if (a.remote && (a.workers || a.workers_mode == 2 || a.spec)) {
        tp_error(TP_ERR_INVALID, "--remote takes its batches from tp-worker "
                 "processes: it does not go with --workers or --spec");
        return s_fail("bad flags");
    }

    /* SIGINT and SIGTERM are recorded from here on, so a signal at any
     * later point (also while the data and the model are set up) ends the
     * run in order: the trainer sees it before its next step. */
    if (tp_signals_install() < 0)
        return s_fail("signals");
    /* ... and the run ends within a second of one (TP_STOP_GRACE seconds),
     * in order when it can, at once when a thread is stuck in a compute
     * library (issue 48). */
    const char *grace = getenv("TP_STOP_GRACE");
    if (tp_signals_set_deadline(grace ? atof(grace) : 1.0) < 0)
        return s_fail("signals");

    /* Devices: the CPU unless CUDA answers (and a CUDA tower backend).
     * CUDA is asked in a child: this process must not load CUDA before it
     * forks its dataflow workers. */
    if (!strcmp(a.devices, "auto")) {
        if (!s_dist) {  /* the probe forks: not under MPI */
            char why[512];
            int n = tp_cuda_probe_isolated(why, sizeof why);
            if (n > 0) {
                a.device = 0;
                TP_INFO("devices: GPU 0 (%s)", why);
            } else {
                TP_INFO("devices: CPU (%s)", why);
            }
        }
    } else if (!strcmp(a.devices, "local")) {
        /* under MPI: the GPU of this rank's place on its host (no probe:
         * it forks; a missing GPU fails the backend, saying so) */
        a.device = s_dist ? tp_dist_local_rank() : -1;
        if (a.device < 0) {
            tp_error(TP_ERR_INVALID, "--devices local: %s", s_dist
                     ? "the launcher did not say this rank's place on its host "
                       "(OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, "
                       "SLURM_LOCALID); name the GPU (--devices N)"
                     : "one GPU per rank under an MPI launcher (mpirun); name "
                       "the GPUs here (--devices 0,1)");
            return s_fail("bad flag");
        }
    } else if (strcmp(a.devices, "cpu")) {
        if (s_parse_device_list(a.devices, a.gpus, &a.ngpus) != TP_OK)
            return s_fail("bad flag");
        if (a.ngpus > 1 && a.towers && a.towers != a.ngpus) {
            tp_error(TP_ERR_INVALID, "--towers %d on --devices %s: one tower "
                     "per GPU (leave --towers out)", a.towers, a.devices);
            return s_fail("bad flags");
        }
        if (s_dist && a.ngpus > 1) {
            tp_error(TP_ERR_INVALID, "--devices %s under MPI: one GPU per rank "
                     "(--devices local takes the rank's place on its host)",
                     a.devices);
            return s_fail("bad flag");
        }
        if (!s_dist && s_check_gpus(a.devices, a.gpus, a.ngpus) != TP_OK)
            return s_fail("bad flag");  /* the probe forks: not under MPI */
        a.device = a.gpus[0];
        if (a.ngpus > 1)
            a.towers = a.ngpus;
    }
    /* On the CPU, towers in parallel use the cores better than one tower
     * with several BLAS threads (measured: docs/performance.md): by default
     * one tower per core (at most 4), one BLAS thread each, and the total
     * batch 128 split between them. */
    /* the cores this process may run on (several ranks share a host:
     * mpirun binds ranks to cores or sockets by default; a taskset or a
     * container's cpuset leaves fewer than the machine has) */
    long cores = s_usable_cores();
    if (a.tf32 == 1 && a.device < 0)
        TP_WARN("--tf32: the towers run on the CPU, where it changes nothing");
    if (a.towers == 0 && a.device >= 0)
        a.towers = 1;  /* one GPU: one tower keeps it busy */
    if (a.towers == 0)
        a.towers = cores < 1 ? 1 : cores > 4 ? 4 : (int)cores;
    /* --spec makes the batches: the model is planned for its batch */
    long spec_batch = a.spec ? s_spec_batch(a.spec) : 0;
    if (a.batch && spec_batch && a.batch != spec_batch) {
        tp_error(TP_ERR_INVALID, "--batch %d, but --spec makes batches of %ld: "
                 "leave --batch out (it follows the spec) or make them agree",
                 a.batch, spec_batch);
        return s_fail("bad flags");
    }
    if (a.batch == 0 && spec_batch > 0 && spec_batch <= INT_MAX)
        a.batch = (int)spec_batch;
    if (a.batch == 0)
        a.batch = 128 / a.towers > 0 ? 128 / a.towers : 1;
    a.workers = s_default_workers(&a, cores);
    if (a.workers_mode != 1 && a.workers > 0)
        TP_INFO("--workers %s: %d worker processes decode and augment (%ld cores)",
                a.workers_mode == 2 ? "auto" : "default", a.workers, cores);
    if (restarts_given && a.workers == 0 && !a.spec) {
        /* (with --spec, 'processes N' may stand in the spec itself) */
        tp_error(TP_ERR_INVALID, "--worker-restarts %d replaces dead worker processes, "
                 "but the pipeline runs in this process%s: give --workers N, or leave "
                 "--worker-restarts out", a.worker_restarts,
                 a.remote ? " (--remote: restart the tp-worker programs yourself)"
                 : a.workers_mode == 2 ? " (--workers auto chose none on this machine)" : "");
        return s_fail("bad flags");
    }
    if (a.resident && (a.spec || a.remote || a.workers > 0 || nranks > 1)) {
        tp_error(TP_ERR_INVALID, "--resident reads --data into the towers' memory "
                 "itself: not with --spec, --remote, --workers or under a launcher");
        return s_fail("bad flags");
    }
    if (a.threads == 0)
        a.threads = (int)(cores > a.towers ? cores / a.towers : 1);
    if (a.remote && a.steps_per_epoch == 0) {
        a.steps_per_epoch = 60000 / (a.batch * a.towers * nranks);
        TP_INFO("--remote: %lld steps per epoch (60000 / total batch; set "
                "--steps-per-epoch to change)", (long long)a.steps_per_epoch);
    }

    /* The log directory. */
    char logdir[4096], defdir[512];
    snprintf(defdir, sizeof defdir, "train_log/%s", a.model);
    tp_logdir_action_t action = a.resume ? TP_LOGDIR_KEEP : TP_LOGDIR_ASK;
    if (a.action && tp_logdir_action_parse(a.action, &action) != TP_OK)
        return s_fail("--logdir-action");
    if (rank == 0) {  /* under MPI the chief alone owns the log directory */
        const char *dir = a.logdir ? a.logdir : defdir;
        struct stat st;
        if (a.resume && !a.create_logdir && stat(dir, &st) != 0) {
            /* a mistyped path would otherwise start a new run silently */
            tp_error(TP_ERR_NOT_FOUND, "--resume: the log directory %s does not "
                     "exist (%s); --create-logdir starts a new run there", dir,
                     strerror(errno));
            return s_fail("log directory");
        }
        /* locked from here until this process ends (lock NULL); the
         * launch below takes the same lock again, as its own */
        tp_status_t prc = tp_logdir_prepare(dir, action, logdir, sizeof logdir, NULL);
        if (prc == TP_ERR_STATE && action == TP_LOGDIR_ASK &&
            tp_logdir_lock_holder(dir) <= 0) {
            char msg[2048];  /* the refusal of a directory that holds a run */
            snprintf(msg, sizeof msg, "%s", tp_last_error());
            tp_error(prc, "%s; tp-train: --logdir-action keep, delete, backup or new "
                     "says which (--resume continues its run)", msg);
        }
        if (prc != TP_OK)
            return s_fail("log directory");
        char logfile[4200];
        snprintf(logfile, sizeof logfile, "%s/log.log", logdir);
        tp_log_set_file(logfile);
    }

    /* Data. */
    char spec[4096], test_spec[4096];
    tp_dataflow_t *train = NULL, *test = NULL;
    tp_input_t *remote = NULL;
    if (a.curve && tp_stats_set_curve(a.curve) != TP_OK)
        return s_fail("--curve");
    if (a.remote) {
        /* ZMQInput: the workers' batches are received on this thread, no
         * prefetch actor in between (the workers are the prefetchers). The
         * keys and the bind permission are options of its socket. */
        tp_remote_opts_t ro;
        tp_remote_opts_init(&ro);
        ro.curve_dir = a.curve;
        ro.allow_public = a.public_bind;
        ro.job = a.job ? a.job : getenv("TP_JOB") && *getenv("TP_JOB") ? getenv("TP_JOB") : NULL;
        ro.int32_labels = 1;  /* tensorpack senders' int64 labels: the zoo takes int32 */
        snprintf(spec, sizeof spec, "ZMQInput %s", a.remote);
        if (!(remote = tp_input_zmq(a.remote, &ro)))
            return s_fail("--remote");
    } else if (a.resident) {
        if (!(remote = s_resident_input(&a, spec, sizeof spec)))
            return s_fail("training data");
    } else if (s_train_spec(&a, spec, sizeof spec) != TP_OK ||
               tp_spec_parse(spec, &train) != TP_OK) {
        return s_fail("training data");
    }
    if (rank == 0 && (s_test_spec(&a, test_spec, sizeof test_spec) != TP_OK ||
                      tp_spec_parse(test_spec, &test) != TP_OK)) {
        tp_dataflow_destroy(&train);
        tp_input_destroy(&remote);
        return s_fail("validation data");
    }
    TP_INFO("training data: %s", spec);
    if (rank == 0)
        TP_INFO("validation data: %s", test_spec);

    /* The model: zoo inputs at --image-size (recorded in every
     * checkpoint's metadata), float32 images when the augmentor
     * normalised. */
    tp_input_desc_t inputs[2];
    if ((a.text ? tp_zoo_gpt_inputs(a.context, inputs)
                : tp_zoo_inputs_shaped(a.info.channels, a.image_size, a.image_size, inputs))
        != TP_OK) {
        tp_dataflow_destroy(&train);
        tp_dataflow_destroy(&test);
        tp_input_destroy(&remote);
        return s_fail("--image-size");
    }
    /* uint8 images from the zoo's pipeline (the model normalises:
     * a.info.in_model); float32 from the resident input, and from a
     * --spec or --remote one that augments or is colour (their own
     * normalisation, as before the model did it) */
    if (a.resident || (!a.info.in_model && (a.augment || a.info.channels == 3)))
        inputs[0].dtype = TP_FLOAT32;
    /* a sender whose batches do not fit (another size, batch or dtype) is
     * dropped and counted, not the end of the run */
    /* ... and a label out of the classes (text: tokens, unchecked here) */
    int64_t classes = a.text ? 0 : a.info.nclasses;
    if (a.remote && tp_input_zmq_expect(remote, inputs, 2, a.batch, classes) != TP_OK) {
        tp_input_destroy(&remote);
        return s_fail("--remote");
    }
    /* issue 47: a spec's remote: source checks the same; the workers of a
     * processes stage (--workers) check their first datapoint */
    if (train && tp_input_expect_dataflow(train, inputs, 2, a.batch, classes) != TP_OK) {
        tp_dataflow_destroy(&train);
        tp_dataflow_destroy(&test);
        return s_fail("training data");
    }
    s_model_user_t mu = {{{(float)a.label_smoothing, a.info.nclasses, &a.info, sgd_decay}, a.layers, a.heads,
                          a.embed, (float)a.dropout, a.text ? (int)a.tokens.vocab : 0},
                         a.lr, a.optimizer,
                         a.weight_decay, a.beta1, a.beta2, a.clip_norm, a.ema,
                         a.accumulate, &a};
    tp_model_desc_t desc = {inputs, 2, zoo->build, s_optimizer, &mu};

    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &desc;
    cfg.model_name = zoo->name;  /* recorded in every checkpoint */
    cfg.dataflow = train;
    cfg.input = remote;
    /* rank 0 validates, at the batch its validation spec makes (500 for
     * the built-in one) */
    long test_batch = a.test_spec ? s_spec_batch(a.test_spec) : 0;
    cfg.infer_batch = rank != 0 ? 0 : test_batch > 0 ? test_batch : 500;
    cfg.towers = a.towers;
    cfg.batch = a.batch;
    cfg.seed = (uint64_t)a.seed;
    cfg.threads = a.threads;
    cfg.device = a.device;
    if (a.ngpus > 1) {
        memcpy(cfg.devices, a.gpus, sizeof a.gpus);
        cfg.ndevices = a.ngpus;
    }
    cfg.tf32 = a.tf32;
    cfg.bf16 = a.bf16;
    cfg.logdir = rank == 0 ? logdir : NULL;
    cfg.logdir_action = TP_LOGDIR_KEEP;  /* prepared above */
    cfg.auto_resume = a.resume;
    cfg.max_epoch = a.epochs;
    /* One pass of the data per epoch: every step takes a batch per tower. */
    int64_t batches = train ? tp_dataflow_size(train)
                    : a.resident ? tp_input_size(remote) : -1;
    int64_t group = (int64_t)a.towers * nranks;  /* batches per step, all ranks */
    cfg.steps_per_epoch = a.steps_per_epoch ? a.steps_per_epoch
                        : batches > 0 ? (batches + group - 1) / group : 0;
    if (cfg.steps_per_epoch <= 0) {
        /* the learning rate's schedule runs over epochs x steps_per_epoch
         * steps: with the length unknown it would decay in the first steps */
        tp_error(TP_ERR_INVALID, "the training data's size is not known before it "
                 "is read (%s): give --steps-per-epoch", spec);
        tp_train_config_fini(&cfg);  /* the training data and input with it */
        tp_dataflow_destroy(&test);
        return s_fail("steps per epoch");
    }
    cfg.progress_names = a.text ? "cost" : "cost,accuracy";
    if (a.text) {
        /* tokens_per_s and validation_bpb in stats.json, tokens/s in the
         * progress bar (bytes as tokens: one byte a token) */
        cfg.tokens_per_sample = a.context;
        cfg.bytes_per_token = 1;
        /* BPE: validation_bpb stays bits per byte, through the validation
         * split's bytes per token (its tokens encoded once more here) */
        tp_text_info_t vi;
        if (rank == 0 && a.tokens.vocab_file[0] && !strncmp(test_spec, "text:", 5)) {
            if (tp_df_text_spec_info(test_spec, 1, &vi) != TP_OK) {
                tp_train_config_fini(&cfg);
                tp_dataflow_destroy(&test);
                return s_fail("validation data");
            }
            if (vi.vocab != a.tokens.vocab) {
                tp_error(TP_ERR_INVALID, "--test-data: its tokens (vocabulary %d) are not "
                         "--data's (%d): give it the same vocab= and merges=",
                         (int)vi.vocab, (int)a.tokens.vocab);
                tp_train_config_fini(&cfg);
                tp_dataflow_destroy(&test);
                return s_fail("validation data");
            }
            cfg.bytes_per_token = vi.bytes_per_token;
        }
        cfg.infer_batch = rank != 0 ? 0 : test_batch > 0 ? test_batch : a.batch;
    }
    cfg.stats = a.stats;
    /* issue 47: the other ranks publish beside rank 0's socket (tp-top
     * merges every stats-rank*.sock of the directory), where it is on
     * their host */
    char rank_stats[4200];
    if (rank > 0 && !a.stats) {
        snprintf(rank_stats, sizeof rank_stats, "ipc://%s/stats-rank%d.sock",
                 a.logdir ? a.logdir : defdir, rank);  /* rank 0's, as asked */
        cfg.stats = rank_stats;
    }
    cfg.tensorboard = !a.no_tensorboard;
    cfg.save_checkpoints = !a.no_checkpoints;
    cfg.plots = !a.no_plots;
    cfg.log_every_n_steps = a.log_every;
    /* The hyper-parameters as TensorBoard's text dashboard shows them: it
     * renders markdown, and lines indented by four spaces stay lines. */
    char hparams[4096];
    size_t hl = 0;
    hl += (size_t)snprintf(hparams + hl, sizeof hparams - hl, "    command:");
    for (int i = 0; i < argc && hl < sizeof hparams; i++)
        hl += (size_t)snprintf(hparams + hl, sizeof hparams - hl, " %s", argv[i]);
    if (hl < sizeof hparams)
        snprintf(hparams + hl, sizeof hparams - hl,
                 "\n    model = %s\n    image_size = %d\n    epochs = %d\n    batch = %d\n"
                 "    towers = %d\n    ranks = %d\n    lr = %g\n    optimizer = %s\n"
                 "    augment = %d\n    workers = %d\n    steps_per_epoch = %lld\n"
                 "    seed = %lld\n    label_smoothing = %g\n    lr_schedule = %s\n"
                 "    lr_gamma = %g\n    lr_end = %g\n    warmup = %g\n    weight_decay = %g\n    beta1 = %g\n    beta2 = %g\n    clip_norm = %g\n"
                 "    ema = %g\n    accumulate = %d\n    context = %d\n    layers = %d\n"
                 "    heads = %d\n    embed = %d\n    dropout = %g\n",
                 zoo->name, a.image_size,
                 a.epochs, a.batch, a.towers, nranks, a.lr, a.optimizer, a.augment, a.workers,
                 (long long)cfg.steps_per_epoch, (long long)a.seed, a.label_smoothing,
                 a.lr_schedule, a.lr_gamma, a.lr_end, a.warmup,
                 a.weight_decay,
                 adam_like ? a.beta1 : 0.0, adam_like ? a.beta2 : 0.0, a.clip_norm,
                 a.ema, a.accumulate, a.context, a.layers, a.heads, a.embed, a.dropout);
    cfg.hparams = hparams;
    /* The rate, step by step: from lr / 10 up to lr over the warm-up, then
     * down to lr x lr_end at the end (a twentieth by default), linearly. */
    double total_steps = (double)cfg.steps_per_epoch * a.epochs;
    double warm_steps = (double)cfg.steps_per_epoch * a.warmup;
    tp_hp_point_t pts[3] = {{0, a.lr}, {total_steps, a.lr * a.lr_end}, {0, 0}};
    size_t npts = 2;
    if (warm_steps > 0) {
        pts[0] = (tp_hp_point_t){0, a.lr / 10};
        pts[1] = (tp_hp_point_t){warm_steps, a.lr};
        pts[2] = (tp_hp_point_t){total_steps, a.lr * a.lr_end};
        npts = 3;
    }
    tp_inferencer_t infs[] = {
        {TP_INFER_SCALAR_STATS, "accuracy", NULL},
        {TP_INFER_SCALAR_STATS, "cost", NULL},
        {TP_INFER_CLASSIFICATION_ERROR, "wrong", NULL},
        {TP_INFER_FLIP_ACCURACY, "logits", NULL},  /* --tta */
        {TP_INFER_FLIP_SHIFT_ACCURACY, "logits", NULL},  /* --tta-shift */
    };
    /* validation (rank 0), between --ema's two: on the weights' average */
    /* --lr-schedule cosine or step: the same warm-up (from lr / 10), then
     * PyTorch's CosineAnnealingLR or MultiStepLR, step by step */
    tp_lr_schedule_t ls = {.kind = lr_kind, .base = a.lr, .warmup_from = 0.1,
                           .end = a.lr_end, .gamma = a.lr_gamma,
                           .warmup = llround(warm_steps), .total = (int64_t)total_steps,
                           .nmilestones = nmiles};
    for (int i = 0; i < nmiles; i++)
        ls.milestones[i] = llround(miles[i] * (double)cfg.steps_per_epoch);
    tp_callback_t *cbs[7] = {lr_kind == TP_LR_LINEAR
                             ? tp_cb_hp_schedule("learning_rate", pts, npts, 1, 1)
                             : tp_cb_lr_schedule("learning_rate", &ls),
                             tp_callback_new(a.text ? &s_text_meta_ops : &s_data_meta_ops,
                                             &a, 1)};
    int ncbs = 2;
    if (!cbs[0] || !cbs[1]) {
        tp_callback_destroy(&cbs[0]);
        tp_callback_destroy(&cbs[1]);
        tp_train_config_fini(&cfg);
        tp_dataflow_destroy(&test);
        return s_fail("the learning-rate schedule");
    }
    if (rank == 0 && a.ema > 0)
        cbs[ncbs++] = tp_callback_new(&s_ema_in_ops, NULL, 1);
    if (rank == 0)
        cbs[ncbs++] = a.text ? tp_cb_inference_runner(test, &infs[1], 1)  /* cost */
                             : tp_cb_inference_runner(test, infs, 3 + (size_t)a.tta);
    if (rank == 0 && a.ema > 0)
        cbs[ncbs++] = tp_callback_new(&s_ema_out_ops, NULL, 1);
    if (rank == 0 && a.text && s_sample.tokens > 0) {  /* after validation */
        /* the run's vocabulary: 256 bytes, or its BPE files (TextSample
         * loads the tokenizer from them) */
        tp_zoo_gpt_options_t so = {.layers = a.layers, .heads = a.heads, .embed = a.embed,
                                   .vocab = (int)a.tokens.vocab};
        tp_text_sample_opts_t to = {.prompt = s_sample.prompt, .tokens = s_sample.tokens,
                                    .temperature = s_sample.temperature,
                                    .top_k = (int)s_sample.top_k, .seed = (uint64_t)a.seed,
                                    .vocab = a.tokens.vocab_file,
                                    .merges = a.tokens.merges_file};
        if (!(cbs[ncbs] = tp_zoo_gpt_cb_sample(a.context, &so, &to))) {
            cfg.callbacks = cbs;  /* freed with the config (the validation data
                                     with its runner) */
            cfg.ncallbacks = ncbs;
            tp_train_config_fini(&cfg);
            return s_fail("the per-epoch sample");
        }
        ncbs++;
    }
    if (rank > 0)
        cbs[ncbs++] = tp_callback_new(&s_rank_steps_ops, NULL, 0);
    cfg.callbacks = cbs;
    cfg.ncallbacks = ncbs;
    /* every rank's own batches: a shard of the common stream, or its own
     * tp-worker processes */
    if (s_dist && tp_dist_configure(s_dist, &cfg, !own_data) != TP_OK) {
        tp_train_config_fini(&cfg);
        return s_fail("distributed training");
    }

    char ranks_text[64] = "";
    if (s_dist)
        snprintf(ranks_text, sizeof ranks_text, "%d ranks x ", nranks);
    char tokens_text[64] = "bytes as tokens";
    if (a.tokens.vocab_file[0])
        snprintf(tokens_text, sizeof tokens_text, "GPT-2 BPE tokens, vocabulary %d",
                 (int)a.tokens.vocab);
    if (rank == 0 && a.text)
        printf("tp-train: model %s, %d layer%s, %d head%s, width %d, context %d (%s), "
               "dropout %g, %s%d tower%s x batch %d, %d epoch%s, lr %g (%s), "
               "logdir %s\n", zoo->name, a.layers, a.layers > 1 ? "s" : "", a.heads,
               a.heads > 1 ? "s" : "", a.embed, a.context, tokens_text, a.dropout,
               ranks_text, a.towers, a.towers > 1 ? "s" : "", a.batch, a.epochs,
               a.epochs > 1 ? "s" : "", a.lr, a.optimizer, logdir);
    else if (rank == 0)
        printf("tp-train: model %s (%s), %dx%d images (%s), %d classes, %s%d tower%s x batch "
               "%d, %d epoch%s, lr %g (%s), logdir %s\n", zoo->name, zoo->summary, a.image_size,
               a.image_size, a.info.channels == 3 ? "colour" : "grey", a.info.nclasses,
               ranks_text, a.towers, a.towers > 1 ? "s" : "", a.batch, a.epochs,
               a.epochs > 1 ? "s" : "", a.lr, a.optimizer, logdir);
    if (rank == 0 && s_dist) {  /* issue 47: what one step of the job is */
        int group = nranks * a.towers;
        printf("tp-train: total batch %d = %d ranks x %d tower%s x batch %d; data: %s", group *
               a.batch, nranks, a.towers, a.towers > 1 ? "s" : "", a.batch,
               own_data ? "each rank reads its own (--remote or a {rank} spec), no sharding\n"
                        : "one stream, sharded: of every ");
        if (!own_data && a.towers == 1)
            printf("%d consecutive batches rank r trains the r-th (from 0)\n", group);
        else if (!own_data)
            printf("%d consecutive batches rank r trains those from r x %d to r x %d + %d\n",
                   group, a.towers, a.towers, a.towers - 1);
    }
    fflush(stdout);
    /* what the data were, for tp-predict and tp-export: channels, class
     * names in label order, normalisation (docs/images.md); written once the
     * data and the model are set up, so a run refused before leaves only
     * its log (a retry needs no --logdir-action) */
    if (rank == 0 && !a.text && tp_zoo_data_save(&a.info, logdir) != TP_OK) {
        tp_train_config_fini(&cfg);  /* the callbacks (and the test data) with it */
        return s_fail("log directory");
    }
    double t0 = tp_now_s();
    tp_status_t rc = tp_launch_train_with_config(&cfg, NULL);
    double wall = tp_now_s() - t0;
    if (rc < 0 && rc != TP_ERR_INTERRUPTED)
        return s_fail("training");
    if (rc == TP_ERR_INTERRUPTED)  /* also when no step ran: say why (log.log too) */
        tp_log_fatal("tp-train", "stopped by %s (%s)",
                     tp_signal_pending() == SIGTERM ? "SIGTERM" : "SIGINT", tp_last_error());
    if (s_dist && rc == TP_ERR_INTERRUPTED) {
        /* the other ranks may be waiting in this step's all-reduce */
        tp_error(rc, "interrupted");
        return s_fail("training");
    }
    if (rank != 0) {  /* issue 47: every rank says how it ended */
        int64_t steps = s_rank_steps[1] - s_rank_steps[0];
        printf("tp-train rank %d: %lld steps | wall time %.1f s | %.0f samples/s of its own "
               "(%d tower%s x batch %d; the job's result is rank 0's)\n", rank,
               (long long)steps, wall, wall > 0 ? (double)steps * a.batch * a.towers / wall : 0.0,
               a.towers, a.towers > 1 ? "s" : "", a.batch);
        fflush(stdout);
        tp_dist_close(&s_dist);
        return 0;
    }

    char stats[4200], png[4200];
    snprintf(stats, sizeof stats, "%s/stats.json", logdir);
    snprintf(png, sizeof png, "%s/curves.png", logdir);
    if (access(stats, F_OK) != 0)  /* stopped before the first epoch ended */
        printf("tp-train: no epoch finished: no statistics to plot\n");
    else if (!a.no_plots && tp_plot_stats(stats, png) != TP_OK)
        fprintf(stderr, "tp-train: plotting: %s\n", tp_last_error());
    /* Samples trained in this invocation: steps x total batch, from stats. */
    json_error_t err;
    json_t *j = json_load_file(stats, 0, &err);
    int64_t samples = 0;
    if (j && json_array_size(j) > 0) {
        json_t *gs = json_object_get(json_array_get(j, json_array_size(j) - 1), "global_step");
        samples = json_integer_value(gs) * a.batch * a.towers * nranks;
    }
    json_decref(j);
    s_summary(logdir, wall, samples, a.text);
    const char *plots = a.no_plots ? "none (--no-plots)" : png;
    if (a.no_checkpoints)
        printf("tp-train: log %s/log.log, no checkpoints (--no-checkpoints), stats %s, "
               "plots %s\n", logdir, stats, plots);
    else
        printf("tp-train: log %s/log.log, checkpoints %s/model-*.safetensors, "
               "stats %s, plots %s\n", logdir, logdir, stats, plots);
    fflush(stdout);
    tp_dist_close(&s_dist);
    /* The shell's convention: 128 + the signal (130 SIGINT, 143 SIGTERM). */
    return rc == TP_ERR_INTERRUPTED ? 128 + (tp_signal_pending() ? tp_signal_pending() : 2)
                                    : 0;
}

