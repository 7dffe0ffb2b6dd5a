/* tp-train: train a model on Fashion-MNIST (or IDX / LMDB data) through the
 * whole engine: dataflow, input source, towers, callbacks, monitors.
 *
 *   tp-train                                 the default CNN, 3 epochs, CPU
 *   tp-train --model mlp --epochs 10 --batch 128 --lr 0.05
 *   tp-train --logdir train_log/run1 --resume --epochs 6
 *
 * It validates on the test split after every epoch, saves checkpoints
 * (LOGDIR/model-<global_step>.safetensors), writes LOGDIR/stats.json and
 * LOGDIR/curves.png, and ends with a summary line. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <jansson.h>
#include <towerpack/clock.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/device.h>
#include <towerpack/log.h>
#include <towerpack/logdir.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/models.h>
#include <towerpack/optim.h>
#include <towerpack/plot.h>
#include <towerpack/train.h>

typedef struct {
    const char *model, *data, *test_data, *devices, *logdir, *action, *optimizer;
    const char *spec, *test_spec, *stats, *remote;
    int epochs, batch, towers, workers, threads, resume, augment;
    double lr;
    int64_t steps_per_epoch, seed;
} s_args_t;

static void s_usage(FILE *out) {
    fprintf(out,
"usage: tp-train [options]\n"
"Train a model on 28x28 grey images with 10 classes (Fashion-MNIST by default).\n\n"
"  --model NAME         mlp, cnn (default), cnn-bn, resnet\n"
"  --data SOURCE        fashion-mnist (default), idx:IMAGES,LABELS or lmdb:PATH\n"
"  --test-data SOURCE   validation data (default: the test split of --data;\n"
"                       needed for idx: and lmdb:)\n"
"  --epochs N           train up to epoch N (max_epoch; default per model)\n"
"  --batch N            batch per tower (default 128 / towers); total = batch\n"
"                       x towers\n"
"  --lr X               learning rate (default per model)\n"
"  --optimizer NAME     sgd (momentum 0.9, default) or adam\n"
"  --devices LIST       auto (default: every GPU if CUDA answers, else the\n"
"                       CPU), cpu, or GPU ids like 0,1\n"
"  --towers N|auto      CPU towers, data parallel in one process (default auto:\n"
"                       one per core, at most 4)\n"
"  --workers N          run the data pipeline (read, augment) in N forked\n"
"                       worker processes\n"
"  --remote ENDPOINT    take batches from tp-worker processes instead: e.g.\n"
"                       @tcp://127.0.0.1:5555 (bind; workers connect) or\n"
"                       ipc:///path (connect); several separated by commas\n"
"  --threads N          BLAS threads per tower (default: all cores / towers)\n"
"  --augment / --no-augment   random crop (pad 2) and flip (default per model)\n"
"  --steps-per-epoch N  default: one pass of the training data\n"
"  --logdir DIR         default train_log/<model>\n"
"  --logdir-action A    when DIR exists: keep, delete, backup, new (ask on a\n"
"                       terminal; an error otherwise)\n"
"  --resume             continue the run in --logdir from its latest\n"
"                       checkpoint, up to --epochs\n"
"  --seed N             default 1\n"
"  --stats ENDPOINT     statistics for tp-top: ipc (default: LOGDIR/stats.sock),\n"
"                       tcp (loopback, any port), tcp:PORT, off, or an endpoint\n"
"  --spec SPEC          the whole training pipeline as a spec (overrides\n"
"                       --data, --augment, --batch for the data)\n"
"  --test-spec SPEC     the validation pipeline as a spec\n"
"  -h, --help\n");
}

/* The optimizer factory: user = {learning rate, 1 for Adam}. SGD has
 * momentum 0.9. */
static tp_optimizer_t *s_optimizer(void *user) {
    const double *args = user;
    return args[1] != 0 ? tp_optimizer_adam(args[0], 0.9, 0.999, 1e-8)
                        : tp_optimizer_sgd(args[0], 0.9, 0);
}

static int s_fail(const char *what) {
    fprintf(stderr, "tp-train: %s: %s\n", what, tp_last_error());
    return 1;
}

static tp_status_t s_train_spec(const s_args_t *a, char *buf, size_t size) {
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
    if (!strcmp(src, "fashion-mnist"))
        snprintf(source, sizeof source, "fashion-mnist:train");
    else if (!strncmp(src, "idx:", 4) || !strncmp(src, "lmdb:", 5))
        snprintf(source, sizeof source, "%s", src);
    else
        return tp_error(TP_ERR_INVALID, "--data '%s': use fashion-mnist, "
                        "idx:IMAGES,LABELS or lmdb:PATH", src);
    char workers[64] = "";
    if (a->workers > 0)  /* augmentation runs in the workers too */
        snprintf(workers, sizeof workers, " | processes %d", a->workers);
    snprintf(buf, size, "%s%s%s | batch %d", source,
             a->augment ? " | augment crop=28,pad=2,flip" : "", workers, a->batch);
    return TP_OK;
}

static tp_status_t s_test_spec(const s_args_t *a, char *buf, size_t size) {
    if (a->test_spec) {
        snprintf(buf, size, "%s", a->test_spec);
        return TP_OK;
    }
    const char *src = a->test_data ? a->test_data : a->data;
    const char *norm = a->augment ? " | augment crop=28" : "";
    if (!strcmp(src, "fashion-mnist"))
        snprintf(buf, size, "fashion-mnist:test,shuffle=0%s | batch 500 remainder", norm);
    else if (a->test_data)
        snprintf(buf, size, "%s%s | batch 500 remainder", src, norm);
    else
        return tp_error(TP_ERR_INVALID, "--data %s has no test split: give "
                        "--test-data", src);
    return TP_OK;
}

/* The last validation accuracy and the run's samples/s from stats.json. */
static void s_summary(const char *logdir, double wall, int64_t samples) {
    char path[4200];
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    double acc = NAN;
    if (j && json_array_size(j) > 0) {
        json_t *v = json_object_get(json_array_get(j, json_array_size(j) - 1),
                                    "validation_accuracy");
        if (json_is_number(v))
            acc = json_number_value(v);
    }
    json_decref(j);
    printf("tp-train: test accuracy %.4f | wall time %.1f s | %.0f samples/s\n",
           acc, wall, wall > 0 ? (double)samples / wall : 0.0);
}

int main(int argc, char **argv) {
    s_args_t a = {.model = "cnn", .data = "fashion-mnist", .devices = "auto",
                  .action = NULL, .optimizer = "sgd", .batch = 0, .towers = 0,
                  .seed = 1, .augment = -1};
    enum { O_TEST = 256, O_ACTION, O_STEPS, O_SPEC, O_TEST_SPEC, O_AUG, O_NOAUG, O_OPT };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"data", required_argument, 0, 'd'},
        {"test-data", required_argument, 0, O_TEST}, {"epochs", required_argument, 0, 'e'},
        {"batch", required_argument, 0, 'b'}, {"lr", required_argument, 0, 'l'},
        {"optimizer", required_argument, 0, O_OPT},
        {"devices", required_argument, 0, 'D'}, {"towers", required_argument, 0, 't'},
        {"workers", required_argument, 0, 'w'}, {"threads", required_argument, 0, 'j'},
        {"logdir", required_argument, 0, 'o'}, {"logdir-action", required_argument, 0, O_ACTION},
        {"resume", no_argument, 0, 'r'}, {"seed", required_argument, 0, 's'},
        {"steps-per-epoch", required_argument, 0, O_STEPS},
        {"spec", required_argument, 0, O_SPEC}, {"test-spec", required_argument, 0, O_TEST_SPEC},
        {"stats", required_argument, 0, 'S'},
        {"remote", required_argument, 0, 'R'},
        {"augment", no_argument, 0, O_AUG}, {"no-augment", no_argument, 0, O_NOAUG},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    int64_t v;
    double lr = -1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a.model = optarg; break;
        case 'd': a.data = optarg; break;
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
        case 'w': if (tp_spec_int(optarg, 0, 256, "--workers", &v)) return s_fail("bad flag"); a.workers = (int)v; break;
        case 'j': if (tp_spec_int(optarg, 0, 1024, "--threads", &v)) return s_fail("bad flag"); a.threads = (int)v; break;
        case 'o': a.logdir = optarg; break;
        case O_ACTION: a.action = optarg; break;
        case 'r': a.resume = 1; break;
        case 's': if (tp_spec_int(optarg, 0, INT64_MAX, "--seed", &v)) return s_fail("bad flag"); a.seed = v; break;
        case O_STEPS: if (tp_spec_int(optarg, 1, INT64_MAX, "--steps-per-epoch", &v)) return s_fail("bad flag"); a.steps_per_epoch = v; break;
        case O_SPEC: a.spec = optarg; break;
        case O_TEST_SPEC: a.test_spec = optarg; break;
        case 'S': a.stats = optarg; break;
        case 'R': a.remote = optarg; break;
        case O_AUG: a.augment = 1; break;
        case O_NOAUG: a.augment = 0; break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tp-train: unexpected argument '%s'\n", argv[optind]);
        s_usage(stderr);
        return 2;
    }
    const tp_zoo_model_t *zoo = tp_zoo_find(a.model);
    if (!zoo)
        return s_fail("--model");
    if (a.epochs == 0)
        a.epochs = zoo->default_epochs;
    if (a.augment < 0)
        a.augment = zoo->augment;
    a.lr = lr > 0 ? lr : zoo->default_lr * (strcasecmp(a.optimizer, "adam") ? 1.0 : 0.02);
    if (strcasecmp(a.optimizer, "sgd") && strcasecmp(a.optimizer, "adam")) {
        tp_error(TP_ERR_INVALID, "--optimizer '%s': sgd or adam", a.optimizer);
        return s_fail("bad flag");
    }
    if (a.remote && (a.workers || a.spec)) {
        tp_error(TP_ERR_INVALID, "--remote takes its batches from tp-worker "
                 "processes: it does not go with --workers or --spec");
        return s_fail("bad flags");
    }

    /* Devices: the CPU unless CUDA answers (and a CUDA tower backend). */
    if (strcmp(a.devices, "auto") && strcmp(a.devices, "cpu")) {
        tp_error(TP_ERR_UNSUPPORTED, "--devices %s: this build trains on the CPU "
                 "only (CUDA towers are not part of it); use --devices cpu or auto",
                 a.devices);
        return s_fail("--devices");
    }
    if (!strcmp(a.devices, "auto")) {
        /* Asked in a child: this process must not load CUDA before it forks
         * its dataflow workers. */
        char why[512];
        int n = tp_cuda_probe_isolated(why, sizeof why);
        TP_INFO("devices: CPU (%s%s)", why,
                n > 0 ? "; this build's towers run on the CPU only" : "");
    }
    /* On the CPU, towers in parallel use the cores better than one tower
     * with several BLAS threads (measured: docs/performance.md): by default
     * one tower per core (at most 4), one BLAS thread each, and the total
     * batch 128 split between them. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (a.towers == 0)
        a.towers = cores < 1 ? 1 : cores > 4 ? 4 : (int)cores;
    if (a.batch == 0)
        a.batch = 128 / a.towers > 0 ? 128 / a.towers : 1;
    if (a.threads == 0)
        a.threads = (int)(cores > a.towers ? cores / a.towers : 1);
    if (a.remote && a.steps_per_epoch == 0) {
        a.steps_per_epoch = 60000 / (a.batch * a.towers);
        TP_INFO("--remote: %lld steps per epoch (60000 / total batch; set "
                "--steps-per-epoch to change)", (long long)a.steps_per_epoch);
    }

    /* The log directory. */
    char logdir[4096], defdir[512];
    snprintf(defdir, sizeof defdir, "train_log/%s", a.model);
    tp_logdir_action_t action = a.resume ? TP_LOGDIR_KEEP : TP_LOGDIR_ASK;
    if (a.action && tp_logdir_action_parse(a.action, &action) != TP_OK)
        return s_fail("--logdir-action");
    if (tp_logdir_prepare(a.logdir ? a.logdir : defdir, action, logdir, sizeof logdir) != TP_OK)
        return s_fail("log directory");
    char logfile[4200];
    snprintf(logfile, sizeof logfile, "%s/log.log", logdir);
    tp_log_set_file(logfile);

    /* Data. */
    char spec[4096], test_spec[4096];
    tp_dataflow_t *train = NULL, *test = NULL;
    tp_input_t *remote = NULL;
    if (a.remote) {
        /* ZMQInput: the workers' batches are received on this thread, no
         * prefetch actor in between (the workers are the prefetchers) */
        snprintf(spec, sizeof spec, "ZMQInput %s", a.remote);
        if (!(remote = tp_input_zmq(a.remote, NULL)))
            return s_fail("training data");
    } else if (s_train_spec(&a, spec, sizeof spec) != TP_OK ||
               tp_spec_parse(spec, &train) != TP_OK)
        return s_fail("training data");
    if (s_test_spec(&a, test_spec, sizeof test_spec) != TP_OK ||
        tp_spec_parse(test_spec, &test) != TP_OK) {
        tp_dataflow_destroy(&train);
        tp_input_destroy(&remote);
        return s_fail("validation data");
    }
    TP_INFO("training data: %s", spec);
    TP_INFO("validation data: %s", test_spec);

    /* The model: zoo inputs, float32 images when the augmentor normalised. */
    tp_input_desc_t inputs[2];
    memcpy(inputs, tp_zoo_inputs(), sizeof inputs);
    if (a.augment)
        inputs[0].dtype = TP_FLOAT32;
    double opt_args[2] = {a.lr, (double)!strcasecmp(a.optimizer, "adam")};
    tp_model_desc_t desc = {inputs, 2, zoo->build, s_optimizer, opt_args};

    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &desc;
    cfg.dataflow = train;
    cfg.input = remote;
    cfg.infer_batch = 500;
    cfg.towers = a.towers;
    cfg.batch = a.batch;
    cfg.seed = (uint64_t)a.seed;
    cfg.threads = a.threads;
    cfg.logdir = logdir;
    cfg.auto_resume = a.resume;
    cfg.max_epoch = a.epochs;
    /* One pass of the data per epoch: every step takes a batch per tower. */
    int64_t batches = train ? tp_dataflow_size(train) : -1;
    cfg.steps_per_epoch = a.steps_per_epoch ? a.steps_per_epoch
                        : batches > 0 ? (batches + a.towers - 1) / a.towers : 0;
    cfg.progress_names = "cost,accuracy";
    cfg.stats = a.stats;
    /* The rate decays linearly, step by step, to a twentieth at the end. */
    double total_steps = (double)(cfg.steps_per_epoch > 0 ? cfg.steps_per_epoch : 1) * a.epochs;
    tp_hp_point_t pts[2] = {{0, a.lr}, {total_steps, a.lr / 20}};
    tp_inferencer_t infs[] = {
        {TP_INFER_SCALAR_STATS, "accuracy", NULL},
        {TP_INFER_SCALAR_STATS, "cost", NULL},
        {TP_INFER_CLASSIFICATION_ERROR, "wrong", NULL},
    };
    tp_callback_t *cbs[2] = {
        tp_cb_hp_schedule("learning_rate", pts, 2, 1, 1),
        tp_cb_inference_runner(test, infs, 3),
    };
    cfg.callbacks = cbs;
    cfg.ncallbacks = 2;

    printf("tp-train: model %s (%s), %d tower%s x batch %d, %d epochs, lr %g (%s), "
           "logdir %s\n", zoo->name, zoo->summary, a.towers, a.towers > 1 ? "s" : "",
           a.batch, a.epochs, a.lr, a.optimizer, logdir);
    fflush(stdout);
    double t0 = tp_now_s();
    tp_status_t rc = tp_launch_train_with_config(&cfg, NULL);
    double wall = tp_now_s() - t0;
    if (rc < 0 && rc != TP_ERR_INTERRUPTED)
        return s_fail("training");

    char stats[4200], png[4200];
    snprintf(stats, sizeof stats, "%s/stats.json", logdir);
    snprintf(png, sizeof png, "%s/curves.png", logdir);
    if (tp_plot_stats(stats, png) != TP_OK)
        fprintf(stderr, "tp-train: plotting: %s\n", tp_last_error());
    /* Samples trained in this invocation: steps x total batch, from stats. */
    json_error_t err;
    json_t *j = json_load_file(stats, 0, &err);
    int64_t samples = 0;
    if (j && json_array_size(j) > 0) {
        json_t *gs = json_object_get(json_array_get(j, json_array_size(j) - 1), "global_step");
        samples = json_integer_value(gs) * a.batch * a.towers;
    }
    json_decref(j);
    s_summary(logdir, wall, samples);
    printf("tp-train: log %s/log.log, checkpoints %s/model-*.safetensors, "
           "stats %s, plots %s\n", logdir, logdir, stats, png);
    return rc == TP_ERR_INTERRUPTED ? 130 : 0;
}

