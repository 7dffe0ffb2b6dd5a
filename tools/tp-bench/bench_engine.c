/* tp-bench engine: what the training engine costs per step.
 *
 * Three runs of the same tiny model (an MLP 784-64-10 on 28x28 uint8
 * images, batch 128, one BLAS thread) for the same number of steps:
 *   bare     a C loop calling tp_model_run (a training step) on batches already in
 *            memory: the reference;
 *   engine   launch_train_with_config on the same in-memory batches, with
 *            ProgressBar, JSONWriter and the other default callbacks;
 *   pipeline the engine fed by the real Fashion-MNIST pipeline
 *            (fashion-mnist:train | batch 128), against
 *   dummy    the engine fed by DummyConstantInput.
 * The goals: engine >= 0.97x bare; pipeline >= 0.98x dummy. One more ratio
 * splits the second: pipeline against the engine case (the same engine and
 * QueueInput over 64 batches already in memory, so a new batch every step
 * but no decoding, shuffling or batching) says how much of the pipeline's
 * own work the prefetching leaves visible; the rest of the gap to the dummy
 * is what any new batch costs against one that stays in cache.
 *
 * Also here, on the same batches: `tp-bench callbacks` (a slow callback
 * observing or synchronous) and `tp-bench saver` (what ModelSaver keeps the
 * towers waiting at an epoch end, writing synchronously or on its writer,
 * with a wider MLP whose checkpoint takes a disk real time). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <time.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/checkpoint.h>
#include <towerpack/clock.h>
#include <towerpack/device.h>
#include <towerpack/dataflow_spec.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/models.h>
#include <towerpack/optim.h>
#include <towerpack/launch.h>
#include "tools/tp-bench/bench_median.h"

static tp_status_t s_tiny(tp_tower_t *t, tp_node_t *const *in, void *user) {
    tp_node_t *x = tp_flatten(t, "flat", tp_cast(t, "input", in[0], 1.0f / 255));
    x = tp_relu(t, NULL, tp_fc(t, "fc0", x, 64, 1));
    tp_node_t *logits = tp_fc(t, "linear", x, 10, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    tp_tower_add_metric(t, "accuracy", tp_accuracy(t, "accuracy", logits, in[1]));
    return tp_tower_set_cost(t, cost);
}

static tp_optimizer_t *s_opt(void *user) { return tp_optimizer_sgd(0.01, 0.9, 0); }

#define NBATCH 64

/* NBATCH random batches kept in memory; the engine reads them through a
 * list dataflow (copies), the bare loop directly. */
static tp_datapoint_t *s_batches[NBATCH];

static void s_make_batches(int64_t batch) {
    tp_rng_t r;
    tp_rng_init(&r, 5, 0);
    for (int b = 0; b < NBATCH; b++) {
        int64_t img[] = {batch, 28, 28}, lab[] = {batch};
        tp_datapoint_t *dp = tp_datapoint_new(2);
        tp_tensor_init(tp_datapoint_get(dp, 0), TP_UINT8, 3, img);
        tp_tensor_init(tp_datapoint_get(dp, 1), TP_INT32, 1, lab);
        uint8_t *p = tp_datapoint_get(dp, 0)->data;
        for (size_t i = 0; i < (size_t)batch * 784; i++)
            p[i] = (uint8_t)tp_rng_u32(&r);
        int32_t *l = tp_datapoint_get(dp, 1)->data;
        for (int64_t i = 0; i < batch; i++)
            l[i] = (int32_t)tp_rng_below(&r, 10);
        s_batches[b] = dp;
    }
}

/* --device N: every case's towers on CUDA device N (the bare loop's model
 * on a CUDA backend, the engine's through tp_train_config_t.device). */
static int s_device = -1;

/* The tiny model every case of this file trains. */
static tp_model_desc_t s_tiny_desc(void) {
    static const tp_input_desc_t inputs[2] = {{"image", TP_UINT8, 3, {-1, 28, 28}},
                                              {"label", TP_INT32, 1, {-1}}};
    return (tp_model_desc_t){inputs, 2, s_tiny, s_opt, NULL};
}

/* After a benchmark: its scratch log directory and the batches go. */
static void s_teardown(const char *who, const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "tp-bench %s: could not remove %s\n", who, dir);
    for (int b = 0; b < NBATCH; b++)
        tp_datapoint_destroy(&s_batches[b]);
}

static tp_dataflow_t *s_memory_df(void) {
    tp_datapoint_t *copies[NBATCH];
    for (int b = 0; b < NBATCH; b++)
        copies[b] = tp_datapoint_copy(s_batches[b]);
    return tp_df_from_list(copies, NBATCH, 0);
}

/* CPU seconds of the calling thread: unlike wall time, not stretched when
 * other processes share the cores (the machine this runs on often does). */
static double s_thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Trainer-thread CPU seconds of the last engine run's epoch (its steps and
 * per-step callbacks). */
static double s_last_cpu_s;
static double s_cpu_mark;

static tp_status_t cpu_before_epoch(void *impl, tp_trainer_t *tr) {
    s_cpu_mark = s_thread_cpu_s();
    return TP_OK;
}
static tp_status_t cpu_after_epoch(void *impl, tp_trainer_t *tr) {
    s_last_cpu_s = s_thread_cpu_s() - s_cpu_mark;
    return TP_OK;
}
static const tp_callback_ops_t s_cpu_ops = {
    .name = "CpuClock", .before_epoch = cpu_before_epoch, .after_epoch = cpu_after_epoch,
};

static double s_bare(const tp_model_desc_t *desc, int64_t batch, int64_t steps) {
    tp_model_config_t mc = tp_model_config_default();
    mc.batch = batch;
    mc.threads = 1;
    if (s_device >= 0) {
        tp_cuda_options_t co = tp_cuda_options_default();
        co.device = s_device;
        if (!(mc.backend = tp_backend_cuda_new(&co))) {
            fprintf(stderr, "tp-bench engine: %s\n", tp_last_error());
            return -1;
        }
        mc.own_backend = 1;
    }
    tp_model_t *m = tp_model_new(desc, &mc);
    if (!m)
        return -1;
    double t0 = tp_now_s(), c0 = s_thread_cpu_s();
    for (int64_t s = 0; s < steps; s++) {
        tp_datapoint_t *dp = s_batches[s % NBATCH];
        tp_tensor_t in[2];
        tp_datapoint_views(dp, in, 2);
        if (tp_model_run(m, 0, in, 2, NULL, 0, NULL) != TP_OK) {
            tp_model_destroy(&m);
            return -1;
        }
    }
    double el = tp_now_s() - t0;
    s_last_cpu_s = s_thread_cpu_s() - c0;
    tp_model_destroy(&m);
    return (double)steps / el;
}

/* CPU seconds of every thread of this process so far. */
static double s_process_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --monitors: the engine without the monitors that watch a run (the event
 * file, the per-step series and the curves), and a step-based learning
 * rate put every step as tp-train does (so the event file gets a record
 * per step) in both arms. */
static int s_monitors_off, s_lr_every_step;

/* The config every bench of the engine starts from: desc on one thread,
 * `epochs` epochs of `steps` steps of df in batches of `batch`, logging
 * under logdir, no checkpoints; each bench adds what it measures. */
static void s_bench_config(tp_train_config_t *c, const tp_model_desc_t *desc, int64_t batch,
                           tp_dataflow_t *df, int64_t steps, int64_t epochs,
                           const char *logdir) {
    tp_train_config_init(c);
    c->model = desc;
    c->batch = batch;
    c->threads = 1;
    c->dataflow = df;
    c->steps_per_epoch = steps;
    c->max_epoch = epochs;
    c->logdir = logdir;
    c->save_checkpoints = 0;
}

/* Steps/s of the engine over `input` or `df`, as its own ThroughputTracker
 * measured it (from the start of the first step to the end of the last, so
 * building the model is excluded as it is from the bare loop). */
static double s_engine_with(const tp_model_desc_t *desc, int64_t batch, int64_t steps,
                            tp_dataflow_t *df, tp_input_t *input, const char *logdir,
                            tp_callback_t *extra) {
    tp_train_config_t c;
    s_bench_config(&c, desc, batch, df, steps, 1, logdir);
    c.device = s_device;
    c.input = input;
    c.logdir_action = TP_LOGDIR_DELETE;  /* a scratch directory, run after run */
    tp_callback_t *cbs[3] = {tp_callback_new(&s_cpu_ops, NULL, 0), extra, NULL};
    c.callbacks = cbs;
    c.ncallbacks = extra ? 2 : 1;
    if (s_monitors_off)
        c.tensorboard = c.curves = 0;
    if (s_lr_every_step) {
        tp_hp_point_t pts[2] = {{0, 0.01}, {(double)steps, 0.0005}};
        cbs[c.ncallbacks++] = tp_cb_hp_schedule("learning_rate", pts, 2, 1, 1);
    }
    FILE *devnull = fopen("/dev/null", "w");
    FILE *saved = stderr;
    stderr = devnull;  /* the progress bar's lines: drawn, not shown */
    tp_status_t rc = tp_launch_train_with_config(&c, NULL);
    stderr = saved;
    fclose(devnull);
    if (rc < 0) {
        fprintf(stderr, "tp-bench engine: %s\n", tp_last_error());
        return -1;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/stats.json", logdir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    double rate = -1;
    if (j && json_array_size(j) > 0)
        rate = json_number_value(json_object_get(json_array_get(j, json_array_size(j) - 1),
                                                 "steps_per_s"));
    json_decref(j);
    unlink(path);
    return rate;
}

static double s_engine(const tp_model_desc_t *desc, int64_t batch, int64_t steps,
                       tp_dataflow_t *df, tp_input_t *input, const char *logdir) {
    return s_engine_with(desc, batch, steps, df, input, logdir, NULL);
}

/* Ticks the hypervisor took from this machine's CPUs (the "steal" column of
 * /proc/stat, all CPUs together); 0 where there is no such count. On a
 * shared virtual machine the host sometimes runs other guests on the
 * cores this one believes it has: the prefetching then competes with the
 * trainer for one real core, and a pair of runs compares two different
 * machines. The pairs during which the hypervisor took under 2% of the
 * CPU time (it takes a few percent even from an idle guest here) are
 * reported on their own. */
#define QUIET 0.02   /* a pair counts as quiet below this fraction of steal */

static unsigned long long s_steal_ticks(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    return n == 8 ? v[7] : 0;
}

int tp_bench_engine(int argc, char **argv) {
    int64_t steps = 500, batch = 128, repeat = 15;
    int json = 0, verbose = 0, c;
    const char *only = NULL;
    static const struct option opts[] = {{"steps", required_argument, 0, 's'},
                                         {"only", required_argument, 0, 'o'},
                                         {"repeat", required_argument, 0, 'r'},
                                         {"json", no_argument, 0, 'j'},
                                         {"verbose", no_argument, 0, 'v'},
                                         {"monitors", no_argument, 0, 'm'},
                                         {"device", required_argument, 0, 'd'},
                                         {"model", required_argument, 0, 'M'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int monitors = 0;
    const tp_zoo_model_t *zoo = NULL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 's') {
            if (tp_spec_int(optarg, 10, 10000000, "--steps", &steps) != TP_OK) {
                fprintf(stderr, "tp-bench engine: %s\n", tp_last_error());
                return 2;
            }
        } else if (c == 'r') {
            if (tp_spec_int(optarg, 1, 1000, "--repeat", &repeat) != TP_OK) {
                fprintf(stderr, "tp-bench engine: %s\n", tp_last_error());
                return 2;
            }
        } else if (c == 'j') {
            json = 1;
        } else if (c == 'v') {
            verbose = 1;
        } else if (c == 'm') {
            monitors = 1;
        } else if (c == 'o') {
            only = optarg;
        } else if (c == 'd') {
            int64_t d;
            if (tp_spec_int(optarg, 0, 1023, "--device", &d) != TP_OK) {
                fprintf(stderr, "tp-bench engine: %s\n", tp_last_error());
                return 2;
            }
            s_device = (int)d;
        } else if (c == 'M') {
            if (!(zoo = tp_zoo_find(optarg))) {
                fprintf(stderr, "tp-bench engine: %s\n", tp_last_error());
                return 2;
            }
        } else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: tp-bench engine [--steps N] [--repeat R] [--json] [--verbose]\n"
                    "                       [--device N] [--model NAME]\n"
                    "  (--device: on CUDA device N; --model: a zoo model instead of\n"
                    "  the tiny MLP, e.g. cnn-bn for a GPU)\n"
                    "       tp-bench engine --only bare|engine|dummy|pipeline|engine-monitors|\n"
                    "                              engine-nomonitors [--steps N]\n"
                    "       tp-bench engine --monitors [--steps N] [--repeat R]\n"
                    "  (the engine with the event file, steps.tsv and curves against\n"
                    "  without them, the learning rate put every step in both)\n"
                    "  (one case, once, for profilers: valgrind --tool=callgrind ...)\n"
                    "  a tiny MLP trained through the engine against a bare loop,\n"
                    "  and fed by the real pipeline against DummyConstantInput; R rounds\n"
"  (default 15) of N steps (default 500), each running every case, each\n"
"  pair back to back (the order swapped every second round); the ratios\n"
"  are the medians of the rounds' ratios (neighbouring runs share the\n"
"  machine's mood: short runs, many rounds); and\n"
"  the best round of each case against the best round of its reference\n"
"  (this machine's step time swings by up to 50%% between runs); and the\n"
"  medians over the pairs during which the hypervisor took under 2%% of the\n"
"  CPU time (steal, /proc/stat). --verbose: each round's ratios and steal\n"
"  on stderr\n");
            return c == 'h' ? 0 : 2;
        }
    }
    tp_log_set_level(TP_LOG_WARN);
    s_make_batches(batch);
    tp_model_desc_t desc = s_tiny_desc();
    if (zoo)
        desc.build = zoo->build;  /* the same inputs: 28x28 uint8, labels */
    char dir[] = "/tmp/tp-bench-engine-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("tp-bench engine: mkdtemp");
        return 1;
    }
    if (only) {  /* one case for a profiler: no warm-up, no rounds */
        double rate = -1;
        char spec1[128];
        snprintf(spec1, sizeof spec1, "fashion-mnist:train | batch %lld", (long long)batch);
        tp_dataflow_t *real = NULL;
        if (!strcmp(only, "bare"))
            rate = s_bare(&desc, batch, steps);
        else if (!strcmp(only, "engine"))
            rate = s_engine(&desc, batch, steps, s_memory_df(), NULL, dir);
        else if (!strcmp(only, "engine-monitors") || !strcmp(only, "engine-nomonitors")) {
            /* the --monitors pair, one at a time (for callgrind) */
            s_lr_every_step = 1;
            s_monitors_off = !strcmp(only, "engine-nomonitors");
            rate = s_engine(&desc, batch, steps, s_memory_df(), NULL, dir);
        } else if (!strcmp(only, "dummy"))
            rate = s_engine(&desc, batch, steps, NULL, tp_input_dummy(&desc, batch, 10, 1), dir);
        else if (!strcmp(only, "pipeline") && tp_spec_parse(spec1, &real) == TP_OK)
            rate = s_engine(&desc, batch, steps, real, NULL, dir);
        else
            fprintf(stderr, "tp-bench engine: --only %s: use bare, engine, dummy, "
                    "pipeline, engine-monitors or engine-nomonitors\n", only);
        s_teardown("engine", dir);
        if (rate <= 0)
            return 1;
        printf("%s %.1f steps/s\n", only, rate);
        return 0;
    }
    if (monitors) {
        /* pairs back to back, the order swapped every second round */
        s_lr_every_step = 1;
        s_bare(&desc, batch, steps / 10);
        /* wall-clock rates, and CPU time (not stretched by other processes
         * on a shared host): the trainer thread's over the epoch, and the
         * whole process's (every thread: the observers' too) over the run */
        double r[1000], rc_tr[1000], rc_proc[1000], best_on = 0, best_off = 0;
        for (int64_t k = 0; k < repeat; k++) {
            double on = 0, off = 0, cpu_on = 0, cpu_off = 0, proc_on = 0, proc_off = 0;
            for (int arm = 0; arm < 2; arm++) {
                int off_now = (k % 2 == 0) == (arm == 1);
                s_monitors_off = off_now;
                double p0 = s_process_cpu_s();
                double v = s_engine(&desc, batch, steps, s_memory_df(), NULL, dir);
                double pc = s_process_cpu_s() - p0;
                s_monitors_off = 0;
                if (off_now)
                    off = v, cpu_off = s_last_cpu_s, proc_off = pc;
                else
                    on = v, cpu_on = s_last_cpu_s, proc_on = pc;
            }
            if (on <= 0 || off <= 0 || cpu_on <= 0 || proc_on <= 0)
                return 1;
            rc_tr[k] = cpu_off / cpu_on;    /* as rate ratios: CPU the other way */
            rc_proc[k] = proc_off / proc_on;
            if (verbose)
                fprintf(stderr, "round %lld: with %.1f, without %.1f steps/s: %.4f; CPU "
                        "trainer %.4f, process %.4f\n", (long long)k, on, off, on / off,
                        rc_tr[k], rc_proc[k]);
            r[k] = on / off;
            best_on = on > best_on ? on : best_on;
            best_off = off > best_off ? off : best_off;
        }
        qsort(r, (size_t)repeat, sizeof *r, tp_bench_cmp_double);
        qsort(rc_tr, (size_t)repeat, sizeof *rc_tr, tp_bench_cmp_double);
        qsort(rc_proc, (size_t)repeat, sizeof *rc_proc, tp_bench_cmp_double);
        s_teardown("engine", dir);
        if (json)
            printf("{\"bench\":\"engine-monitors\",\"steps\":%lld,\"rounds\":%lld,"
                   "\"monitors_ratio\":%.4f,\"monitors_best_ratio\":%.4f,"
                   "\"monitors_trainer_cpu_ratio\":%.4f,\"monitors_process_cpu_ratio\":%.4f,"
                   "\"with_best_steps_per_s\":%.2f,\"without_best_steps_per_s\":%.2f}\n",
                   (long long)steps, (long long)repeat, r[repeat / 2], best_on / best_off,
                   rc_tr[repeat / 2], rc_proc[repeat / 2], best_on, best_off);
        else
            printf("monitors (event file, steps.tsv, curves) on against off, %lld rounds of "
                   "%lld steps (goal >= 0.99):\n  steps/s: median %.4f, best %.4f (%.1f / "
                   "%.1f)\n  CPU time as a rate ratio: trainer thread %.4f, whole process "
                   "%.4f (medians)\n", (long long)repeat, (long long)steps, r[repeat / 2],
                   best_on / best_off, best_on, best_off, rc_tr[repeat / 2],
                   rc_proc[repeat / 2]);
        return 0;
    }
    /* Warm up caches and the allocator once, then measure in rounds. */
    s_bare(&desc, batch, steps / 10);
    double r_engine[1000], r_input[1000], c_engine[1000], c_input[1000], r_work[1000];
    double q_engine[1000], q_input[1000];   /* the pairs under QUIET steal */
    int nq_engine = 0, nq_input = 0;
    unsigned long long steal = 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN), hz = sysconf(_SC_CLK_TCK);
    const double cpu_ticks_s = (double)(ncpu > 0 ? ncpu : 1) * (double)(hz > 0 ? hz : 100);
    double wall0 = tp_now_s();
    double bare = 0, engine = 0, pipeline = 0, dummy = 0;
    double best_b = 0, best_e = 0, best_p = 0, best_d = 0;
    char spec[128];
    snprintf(spec, sizeof spec, "fashion-mnist:train | batch %lld", (long long)batch);
    for (int64_t k = 0; k < repeat; k++) {
        tp_dataflow_t *real = NULL;
        if (tp_spec_parse(spec, &real) != TP_OK) {
            fprintf(stderr, "tp-bench engine: %s\n", tp_last_error());
            return 1;
        }
        /* Each pair back to back, and in the other order every second
         * round: neither side always runs first. */
        double b, bc, e, ec, p, pc, d, dc;
        unsigned long long t0 = s_steal_ticks(), t1, t2;
        double w0 = tp_now_s(), w1, w2;
        if (k % 2 == 0) {
            b = s_bare(&desc, batch, steps), bc = s_last_cpu_s;
            e = s_engine(&desc, batch, steps, s_memory_df(), NULL, dir), ec = s_last_cpu_s;
            t1 = s_steal_ticks(), w1 = tp_now_s();
            p = s_engine(&desc, batch, steps, real, NULL, dir), pc = s_last_cpu_s;
            d = s_engine(&desc, batch, steps, NULL, tp_input_dummy(&desc, batch, 10, 1), dir);
            dc = s_last_cpu_s;
        } else {
            e = s_engine(&desc, batch, steps, s_memory_df(), NULL, dir), ec = s_last_cpu_s;
            b = s_bare(&desc, batch, steps), bc = s_last_cpu_s;
            t1 = s_steal_ticks(), w1 = tp_now_s();
            d = s_engine(&desc, batch, steps, NULL, tp_input_dummy(&desc, batch, 10, 1), dir);
            dc = s_last_cpu_s;
            p = s_engine(&desc, batch, steps, real, NULL, dir), pc = s_last_cpu_s;
        }
        t2 = s_steal_ticks(), w2 = tp_now_s();
        steal += t2 - t0;
        if (verbose)
            fprintf(stderr, "round %lld: engine/bare %.4f (steal %.1f%%), pipeline/dummy %.4f "
                    "(steal %.1f%%)\n", (long long)k, e / b,
                    100.0 * (double)(t1 - t0) / ((w1 - w0) * cpu_ticks_s), p / d,
                    100.0 * (double)(t2 - t1) / ((w2 - w1) * cpu_ticks_s));
        if (b <= 0 || e <= 0 || p <= 0 || d <= 0 || ec <= 0 || pc <= 0)
            return 1;
        if ((double)(t1 - t0) <= QUIET * (w1 - w0) * cpu_ticks_s)
            q_engine[nq_engine++] = e / b;
        if ((double)(t2 - t1) <= QUIET * (w2 - w1) * cpu_ticks_s)
            q_input[nq_input++] = p / d;
        r_engine[k] = e / b;
        r_input[k] = p / d;
        r_work[k] = p / e;
        c_engine[k] = bc / ec;   /* a rate ratio: CPU seconds the other way round */
        c_input[k] = dc / pc;
        best_b = b > best_b ? b : best_b;
        best_e = e > best_e ? e : best_e;
        best_p = p > best_p ? p : best_p;
        best_d = d > best_d ? d : best_d;
        bare += b / (double)repeat;
        engine += e / (double)repeat;
        pipeline += p / (double)repeat;
        dummy += d / (double)repeat;
    }
    qsort(r_engine, (size_t)repeat, sizeof *r_engine, tp_bench_cmp_double);
    qsort(r_input, (size_t)repeat, sizeof *r_input, tp_bench_cmp_double);
    qsort(c_engine, (size_t)repeat, sizeof *c_engine, tp_bench_cmp_double);
    qsort(c_input, (size_t)repeat, sizeof *c_input, tp_bench_cmp_double);
    qsort(r_work, (size_t)repeat, sizeof *r_work, tp_bench_cmp_double);
    qsort(q_engine, (size_t)nq_engine, sizeof *q_engine, tp_bench_cmp_double);
    qsort(q_input, (size_t)nq_input, sizeof *q_input, tp_bench_cmp_double);
    double q_engine_ratio = nq_engine ? q_engine[nq_engine / 2] : -1;
    double q_input_ratio = nq_input ? q_input[nq_input / 2] : -1;
    double steal_frac = (double)steal / ((tp_now_s() - wall0) * cpu_ticks_s);
    double work_ratio = r_work[repeat / 2];
    double engine_ratio = r_engine[repeat / 2], input_ratio = r_input[repeat / 2];
    double engine_cpu = c_engine[repeat / 2], input_cpu = c_input[repeat / 2];
    s_teardown("engine", dir);
    if (json) {
        printf("{\"bench\":\"engine\",\"steps\":%lld,\"batch\":%lld,"
               "\"bare_steps_per_s\":%.2f,\"engine_steps_per_s\":%.2f,"
               "\"engine_ratio\":%.4f,\"pipeline_steps_per_s\":%.2f,"
               "\"dummy_steps_per_s\":%.2f,\"input_hiding_ratio\":%.4f,"
               "\"engine_cpu_ratio\":%.4f,\"input_hiding_cpu_ratio\":%.4f,"
               "\"engine_best_ratio\":%.4f,\"input_hiding_best_ratio\":%.4f,"
               "\"pipeline_vs_memory_ratio\":%.4f,\"steal_fraction\":%.4f,"
               "\"engine_quiet_ratio\":%.4f,\"engine_quiet_rounds\":%d,"
               "\"input_hiding_quiet_ratio\":%.4f,\"input_hiding_quiet_rounds\":%d,"
               "\"rounds\":%lld}\n",
               (long long)steps, (long long)batch, bare, engine, engine_ratio,
               pipeline, dummy, input_ratio, engine_cpu, input_cpu, best_e / best_b,
               best_p / best_d, work_ratio, steal_frac, q_engine_ratio, nq_engine,
               q_input_ratio, nq_input, (long long)repeat);
    } else {
        printf("%-10s %12s %12s %12s %10s   (%lld rounds of %lld steps)\n", "case",
               "mean steps/s", "median ratio", "best steps/s", "best ratio",
               (long long)repeat, (long long)steps);
        printf("%-10s %12.1f %12s %12.1f %10s\n", "bare", bare, "1.000", best_b, "1.000");
        printf("%-10s %12.1f %12.3f %12.1f %10.3f  (goal >= 0.97 of bare)\n", "engine",
               engine, engine_ratio, best_e, best_e / best_b);
        printf("%-10s %12.1f %12s %12.1f %10s\n", "dummy", dummy, "1.000", best_d, "1.000");
        printf("%-10s %12.1f %12.3f %12.1f %10.3f  (goal >= 0.98 of dummy)\n", "pipeline",
               pipeline, input_ratio, best_p, best_p / best_d);
        printf("pipeline against the engine on 64 in-memory batches (new batch every step,\n"
               "no decoding or batching): %.3f, the part of the gap that is the pipeline's work\n",
               work_ratio);
        printf("CPU time taken by the hypervisor (steal): %.1f%% of this machine's CPU time;\n"
               "pairs with under 2%% steal: engine %.3f of bare (%d of %lld), pipeline %.3f of dummy "
               "(%d of %lld)\n", 100 * steal_frac, q_engine_ratio, nq_engine, (long long)repeat,
               q_input_ratio, nq_input, (long long)repeat);
        printf("trainer-thread CPU time per step, as a rate ratio (not stretched by other\n"
               "processes; blind to waiting): engine %.3f of bare, pipeline %.3f of dummy\n",
               engine_cpu, input_cpu);
    }
    return 0;
}

/* ---- tp-bench callbacks: a slow callback beside the steps or on them ------------ */

static useconds_t s_sleep_us;

static tp_status_t sleep_trigger_step(void *impl, tp_trainer_t *tr) {
    (void)impl, (void)tr;
    usleep(s_sleep_us);
    return TP_OK;
}
static const tp_callback_ops_t s_sleep_ops = {.name = "Sleeper", .trigger_step = sleep_trigger_step};

/* The epoch boundary: a synchronous trigger_epoch that takes `sleep` while
 * the input is the bottleneck (a producer slower than the steps); the
 * trainer's wait for input, per step, fetched by the same callback. */
typedef struct {
    useconds_t sleep_us;
    double waits[2][4096];
    int64_t n[2];
} s_boundary_t;

static tp_status_t bnd_before_run(void *impl, tp_trainer_t *tr, tp_fetches_t *f) {
    (void)impl, (void)tr;
    return tp_fetches_request(f, "trainer/input_wait_s");
}
static tp_status_t bnd_after_run(void *impl, tp_trainer_t *tr, const tp_fetches_t *f) {
    s_boundary_t *b = impl;
    int e = tp_trainer_epoch_num(tr) == 1 ? 0 : 1;
    double w;
    if (tp_fetches_get(f, "trainer/input_wait_s", &w) == TP_OK && b->n[e] < 4096)
        b->waits[e][b->n[e]++] = w;
    return TP_OK;
}
static tp_status_t bnd_trigger_epoch(void *impl, tp_trainer_t *tr) {
    (void)tr;
    usleep(((s_boundary_t *)impl)->sleep_us);
    return TP_OK;
}
static const tp_callback_ops_t s_bnd_ops = {
    .name = "SlowTriggerEpoch", .before_run = bnd_before_run, .after_run = bnd_after_run,
    .trigger_epoch = bnd_trigger_epoch,
};

static tp_status_t s_slow_producer(tp_datapoint_t **dp, tp_rng_t *rng, void *user) {
    (void)dp, (void)rng, (void)user;
    usleep(2000);  /* 500 batches/s: slower than the steps */
    return TP_OK;
}

/* Seconds the first step of epoch 2 waited for input, and the median of
 * epoch 1's steps; -1 on failure. */
static int s_epoch_boundary(const tp_model_desc_t *desc, int64_t batch, int64_t steps,
                            useconds_t sleep_us, const char *dir, double *first,
                            double *median1) {
    s_boundary_t *b = calloc(1, sizeof *b);
    if (!b)
        return -1;
    b->sleep_us = sleep_us;
    tp_train_config_t c;
    s_bench_config(&c, desc, batch,
                   tp_df_repeat(tp_df_map(s_memory_df(), s_slow_producer, NULL, NULL), -1),
                   steps, 2, dir);
    c.logdir_action = TP_LOGDIR_DELETE;  /* a scratch directory, run after run */
    c.default_callbacks = 0;
    tp_callback_t *cbs[1] = {tp_callback_new(&s_bnd_ops, b, 0)};
    c.callbacks = cbs;
    c.ncallbacks = 1;
    tp_status_t rc = tp_launch_train_with_config(&c, NULL);
    int ok = rc == TP_OK && b->n[0] > 0 && b->n[1] > 0;
    if (!ok)
        fprintf(stderr, "tp-bench callbacks: epoch boundary: %s\n", tp_last_error());
    if (ok) {
        *first = b->waits[1][0];
        qsort(b->waits[0], (size_t)b->n[0], sizeof(double), tp_bench_cmp_double);
        *median1 = b->waits[0][b->n[0] / 2];
    }
    free(b);
    return ok ? 0 : -1;
}

int tp_bench_callbacks(int argc, char **argv) {
    int64_t steps = 500, batch = 128, repeat = 5, sleep_ms = 200;
    int json = 0, c;
    static const struct option opts[] = {{"steps", required_argument, 0, 's'},
                                         {"repeat", required_argument, 0, 'r'},
                                         {"sleep-ms", required_argument, 0, 'm'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        tp_status_t rc = TP_OK;
        if (c == 's')
            rc = tp_spec_int(optarg, 10, 10000000, "--steps", &steps);
        else if (c == 'r')
            rc = tp_spec_int(optarg, 1, 1000, "--repeat", &repeat);
        else if (c == 'm')
            rc = tp_spec_int(optarg, 1, 10000, "--sleep-ms", &sleep_ms);
        else if (c == 'j')
            json = 1;
        else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: tp-bench callbacks [--steps N] [--repeat R] [--sleep-ms MS] [--json]\n"
                    "  the engine of tp-bench engine (in-memory batches, the default\n"
                    "  callbacks) with a callback that sleeps MS (default 200) in\n"
                    "  trigger_step every step: observing (tp_cb_observe_latest, on the\n"
                    "  callback actor) against none, R rounds (default 5) of N steps\n"
                    "  (default 500), each pair back to back; then the same callback\n"
                    "  synchronous for 5 steps, against what its sleep predicts; and the\n"
                    "  input wait of the first step after a 500 ms trigger_epoch, with a\n"
                    "  producer slower than the steps\n");
            return c == 'h' ? 0 : 2;
        }
        if (rc != TP_OK) {
            fprintf(stderr, "tp-bench callbacks: %s\n", tp_last_error());
            return 2;
        }
    }
    tp_log_set_level(TP_LOG_WARN);
    s_sleep_us = (useconds_t)(sleep_ms * 1000);
    s_make_batches(batch);
    tp_model_desc_t desc = s_tiny_desc();
    char dir[] = "/tmp/tp-bench-callbacks-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("tp-bench callbacks: mkdtemp");
        return 1;
    }
    s_engine(&desc, batch, steps / 10, s_memory_df(), NULL, dir);  /* warm up */
    double ratios[1000], none_best = 0, obs_best = 0;
    for (int64_t k = 0; k < repeat; k++) {
        double none, obs;
        tp_callback_t *slow = tp_cb_observe_latest(tp_callback_new(&s_sleep_ops, NULL, 0), 0);
        if (k % 2 == 0) {
            none = s_engine(&desc, batch, steps, s_memory_df(), NULL, dir);
            obs = s_engine_with(&desc, batch, steps, s_memory_df(), NULL, dir, slow);
        } else {
            obs = s_engine_with(&desc, batch, steps, s_memory_df(), NULL, dir, slow);
            none = s_engine(&desc, batch, steps, s_memory_df(), NULL, dir);
        }
        if (none <= 0 || obs <= 0)
            return 1;
        ratios[k] = obs / none;
        none_best = none > none_best ? none : none_best;
        obs_best = obs > obs_best ? obs : obs_best;
    }
    qsort(ratios, (size_t)repeat, sizeof *ratios, tp_bench_cmp_double);
    double median = ratios[repeat / 2];
    /* Synchronous: every step waits for the sleep. */
    const int64_t sync_steps = 5;
    double sync = s_engine_with(&desc, batch, sync_steps, s_memory_df(), NULL, dir,
                                tp_callback_new(&s_sleep_ops, NULL, 0));
    double predicted = 1.0 / (1.0 / none_best + (double)sleep_ms * 1e-3);
    double first = -1, median1 = -1;
    int bnd = s_epoch_boundary(&desc, batch, 200, 500000, dir, &first, &median1);
    s_teardown("callbacks", dir);
    if (sync <= 0 || bnd < 0)
        return 1;
    if (json) {
        printf("{\"bench\":\"callbacks\",\"steps\":%lld,\"sleep_ms\":%lld,\"rounds\":%lld,"
               "\"none_steps_per_s\":%.2f,\"observing_steps_per_s\":%.2f,"
               "\"observing_ratio\":%.4f,\"observing_ratio_min\":%.4f,"
               "\"sync_steps_per_s\":%.3f,\"sync_predicted_steps_per_s\":%.3f,"
               "\"epoch2_first_step_input_wait_s\":%.6f,"
               "\"epoch1_median_step_input_wait_s\":%.6f}\n",
               (long long)steps, (long long)sleep_ms, (long long)repeat, none_best, obs_best,
               median, ratios[0], sync, predicted, first, median1);
    } else {
        printf("callbacks: a %lld ms sleep in trigger_step, %lld rounds of %lld steps\n",
               (long long)sleep_ms, (long long)repeat, (long long)steps);
        printf("  none                 %9.1f steps/s (best round)\n", none_best);
        printf("  observing (latest)   %9.1f steps/s (best round); median ratio %.4f "
               "(worst %.4f), goal >= 0.95\n", obs_best, median, ratios[0]);
        printf("  synchronous          %9.3f steps/s over %lld steps; its sleep predicts "
               "%.3f\n", sync, (long long)sync_steps, predicted);
        printf("epoch boundary: a 500 ms synchronous trigger_epoch, the input slower than "
               "the steps\n");
        printf("  input wait of epoch 2's first step  %.3f ms\n", first * 1e3);
        printf("  median input wait of epoch 1's steps %.3f ms\n", median1 * 1e3);
    }
    return 0;
}

/* ---- tp-bench saver: what a checkpoint costs the towers at an epoch end ---------- */

/* The tiny model's layers, wider: 784 -> hidden -> 10 (hidden 4096: 3.3 M
 * parameters, a 26 MB checkpoint with SGD's momentum), big enough that
 * writing and fsync'ing a checkpoint takes a disk real time. */
static int64_t s_hidden = 4096;

static tp_status_t s_wide(tp_tower_t *t, tp_node_t *const *in, void *user) {
    (void)user;
    tp_node_t *x = tp_flatten(t, "flat", tp_cast(t, "input", in[0], 1.0f / 255));
    x = tp_relu(t, NULL, tp_fc(t, "fc0", x, s_hidden, 1));
    tp_node_t *logits = tp_fc(t, "linear", x, 10, 1);
    tp_node_t *cost = tp_softmax_xent(t, "cost", logits, in[1]);
    tp_tower_add_output(t, "cost", cost);
    return tp_tower_set_cost(t, cost);
}

static tp_model_desc_t s_wide_desc(void) {
    tp_model_desc_t d = s_tiny_desc();
    d.build = s_wide;
    return d;
}

/* The saver as it was before its writer thread: everything in trigger_epoch
 * on the trainer's thread (snapshot and write in tp_checkpoint_save, the
 * index, deleting the oldest beyond max_to_keep). */
typedef struct {
    int max_to_keep;
    long long kept[64];
    int n;
} s_sync_saver_t;

static tp_status_t sync_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_sync_saver_t *s = impl;
    long long step = tp_trainer_global_step(tr);
    char path[512], index[512], line[64];
    snprintf(path, sizeof path, "%s/model-%lld.safetensors", tp_trainer_logdir(tr), step);
    tp_train_state_t st;
    memset(&st, 0, sizeof st);
    st.epoch = tp_trainer_epoch_num(tr);
    st.global_step = step;
    tp_rng_init(&st.rng, 0, 0);
    TP_TRY(tp_checkpoint_save(tp_trainer_model(tr), path, &st));
    snprintf(index, sizeof index, "%s/checkpoint", tp_trainer_logdir(tr));
    int len = snprintf(line, sizeof line, "model-%lld.safetensors\n", step);
    TP_TRY(tp_file_write_atomic(index, line, (size_t)len));
    if (s->n < 64)
        s->kept[s->n++] = step;
    while (s->n > s->max_to_keep) {
        snprintf(path, sizeof path, "%s/model-%lld.safetensors", tp_trainer_logdir(tr),
                 s->kept[0]);
        unlink(path);
        memmove(s->kept, s->kept + 1, (size_t)(s->n - 1) * sizeof *s->kept);
        s->n--;
    }
    return TP_OK;
}
static const tp_callback_ops_t s_sync_saver_ops = {
    .name = "SyncModelSaver", .trigger_epoch = sync_trigger_epoch, .destroy = free,
};

/* Two marks around the saver (callbacks run in registration order): the
 * time between them at each epoch end is what the saver kept the towers
 * waiting; at after_train, the wait for the last writes. */
typedef struct {
    double t0;
    double waits[256];
    int n;
    double end_wait;
} s_marks_t;

static tp_status_t mark0_trigger_epoch(void *impl, tp_trainer_t *tr) {
    (void)tr;
    ((s_marks_t *)impl)->t0 = tp_now_s();
    return TP_OK;
}
static tp_status_t mark1_trigger_epoch(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_marks_t *m = impl;
    if (m->n < 256)
        m->waits[m->n++] = tp_now_s() - m->t0;
    return TP_OK;
}
static tp_status_t mark0_after_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    ((s_marks_t *)impl)->t0 = tp_now_s();
    return TP_OK;
}
static tp_status_t mark1_after_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_marks_t *m = impl;
    m->end_wait = tp_now_s() - m->t0;
    return TP_OK;
}
static const tp_callback_ops_t s_mark0_ops = {
    .name = "Mark0", .trigger_epoch = mark0_trigger_epoch, .after_train = mark0_after_train,
};
static const tp_callback_ops_t s_mark1_ops = {
    .name = "Mark1", .trigger_epoch = mark1_trigger_epoch, .after_train = mark1_after_train,
};

/* One run: `epochs` x `steps` with the saver (sync or the real one) between
 * the marks, checkpoints into `dir`; the epoch-end waits in *m, the whole
 * run's wall seconds returned (-1 on failure). */
static double s_saver_run(const tp_model_desc_t *desc, int64_t batch, int64_t steps,
                          int64_t epochs, int sync, const char *dir, s_marks_t *m) {
    memset(m, 0, sizeof *m);
    tp_callback_t *saver;
    if (sync) {
        s_sync_saver_t *s = calloc(1, sizeof *s);
        if (!s)
            return -1;
        s->max_to_keep = 3;
        saver = tp_callback_new(&s_sync_saver_ops, s, 1);
    } else {
        saver = tp_cb_model_saver(3, 0);
    }
    tp_train_config_t c;
    s_bench_config(&c, desc, batch, tp_df_repeat(s_memory_df(), -1), steps, epochs, dir);
    c.default_callbacks = 0;
    c.stats = "off";
    tp_callback_t *cbs[3] = {tp_callback_new(&s_mark0_ops, m, 0), saver,
                             tp_callback_new(&s_mark1_ops, m, 0)};
    c.callbacks = cbs;
    c.ncallbacks = 3;
    double t0 = tp_now_s();
    tp_status_t rc = tp_launch_train_with_config(&c, NULL);
    double wall = tp_now_s() - t0;
    if (rc < 0) {
        fprintf(stderr, "tp-bench saver: %s\n", tp_last_error());
        return -1;
    }
    return wall;
}

int tp_bench_saver(int argc, char **argv) {
    int64_t steps = 10, batch = 128, repeat = 3, epochs = 6, hidden = 4096;
    const char *where = "/tmp";
    int json = 0, c;
    static const struct option opts[] = {{"steps", required_argument, 0, 's'},
                                         {"epochs", required_argument, 0, 'e'},
                                         {"repeat", required_argument, 0, 'r'},
                                         {"hidden", required_argument, 0, 'H'},
                                         {"dir", required_argument, 0, 'd'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        tp_status_t rc = TP_OK;
        if (c == 's')
            rc = tp_spec_int(optarg, 1, 1000000, "--steps", &steps);
        else if (c == 'e')
            rc = tp_spec_int(optarg, 2, 200, "--epochs", &epochs);
        else if (c == 'r')
            rc = tp_spec_int(optarg, 1, 100, "--repeat", &repeat);
        else if (c == 'H')
            rc = tp_spec_int(optarg, 16, 1 << 16, "--hidden", &hidden);
        else if (c == 'd')
            where = optarg;
        else if (c == 'j')
            json = 1;
        else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: tp-bench saver [--steps N] [--epochs E] [--repeat R] [--hidden H]\n"
                    "                      [--dir DIR] [--json]\n"
                    "  what ModelSaver keeps the towers waiting at an epoch end: an MLP\n"
                    "  784-H-10 (H default 4096: a 26 MB checkpoint with momentum) trained\n"
                    "  E epochs (default 6) of N steps (default 10) on in-memory batches,\n"
                    "  saving every epoch into a scratch directory under DIR (default /tmp;\n"
                    "  give a directory on the disk that matters, not a tmpfs); once with\n"
                    "  the saver as it was (snapshot and write, fsync, rename, index and\n"
                    "  pruning on the trainer's thread) and once with ModelSaver (snapshot\n"
                    "  on the trainer's thread, the rest on its writer), back to back, R\n"
                    "  rounds (default 3), the order swapped every second round. Reports\n"
                    "  the median epoch-end wait of each, the median of the rounds' ratios,\n"
                    "  the wait at after_train and each run's wall time\n");
            return c == 'h' ? 0 : 2;
        }
        if (rc != TP_OK) {
            fprintf(stderr, "tp-bench saver: %s\n", tp_last_error());
            return 2;
        }
    }
    tp_log_set_level(TP_LOG_WARN);
    s_hidden = hidden;
    s_make_batches(batch);
    tp_model_desc_t desc = s_wide_desc();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tp-bench-saver-XXXXXX", where);
    if (!mkdtemp(dir)) {
        fprintf(stderr, "tp-bench saver: mkdtemp %s: %s\n", dir, strerror(errno));
        return 1;
    }
    double w_sync[256 * 100], w_async[256 * 100], ratios[100], end_async[100];
    double wall_sync[100], wall_async[100];
    int n_sync = 0, n_async = 0;
    size_t ckpt_bytes = 0;
    char run[4200], probe[4300];
    for (int64_t k = 0; k < repeat; k++) {
        s_marks_t ms, ma;
        double ws = -1, wa = -1;
        for (int which = 0; which < 2; which++) {
            int sync = (which == 0) == (k % 2 == 0);  /* sync first in even rounds */
            snprintf(run, sizeof run, "%s/%s-%lld", dir, sync ? "sync" : "async", (long long)k);
            double w = s_saver_run(&desc, batch, steps, epochs, sync, run, sync ? &ms : &ma);
            if (w < 0)
                return 1;
            *(sync ? &ws : &wa) = w;
            struct stat sb;
            snprintf(probe, sizeof probe, "%s/model-%lld.safetensors", run,
                     (long long)(epochs * steps));
            if (stat(probe, &sb) == 0)
                ckpt_bytes = (size_t)sb.st_size;
            snprintf(probe, sizeof probe, "rm -rf %s", run);
            if (system(probe) != 0)
                fprintf(stderr, "tp-bench saver: could not remove %s\n", run);
        }
        /* the first epoch end of a run pays for first touches: left out */
        double rs[256], ra[256];
        int nr = 0;
        for (int i = 1; i < ms.n && i < ma.n; i++, nr++) {
            rs[nr] = w_sync[n_sync++] = ms.waits[i];
            ra[nr] = w_async[n_async++] = ma.waits[i];
        }
        double msync = tp_bench_median(rs, nr), masync = tp_bench_median(ra, nr);
        ratios[k] = masync > 0 ? msync / masync : 0;
        end_async[k] = ma.end_wait;
        wall_sync[k] = ws;
        wall_async[k] = wa;
    }
    s_teardown("saver", dir);
    double med_sync = tp_bench_median(w_sync, n_sync);
    double med_async = tp_bench_median(w_async, n_async);
    double ratio = tp_bench_median(ratios, (int)repeat);
    double end = tp_bench_median(end_async, (int)repeat);
    double wsync = tp_bench_median(wall_sync, (int)repeat);
    double wasync = tp_bench_median(wall_async, (int)repeat);
    if (json) {
        printf("{\"bench\":\"saver\",\"hidden\":%lld,\"steps\":%lld,\"epochs\":%lld,"
               "\"rounds\":%lld,\"checkpoint_bytes\":%zu,\"sync_epoch_end_wait_s\":%.6f,"
               "\"async_epoch_end_wait_s\":%.6f,\"wait_ratio\":%.2f,"
               "\"async_after_train_wait_s\":%.6f,\"sync_run_s\":%.3f,\"async_run_s\":%.3f}\n",
               (long long)hidden, (long long)steps, (long long)epochs, (long long)repeat,
               ckpt_bytes, med_sync, med_async, ratio, end, wsync, wasync);
    } else {
        printf("saver: MLP 784-%lld-10, checkpoint %.1f MB, %lld rounds of %lld epochs x %lld "
               "steps, into %s\n", (long long)hidden, (double)ckpt_bytes / 1e6,
               (long long)repeat, (long long)epochs, (long long)steps, where);
        printf("  epoch-end wait, synchronous write  %9.2f ms (median of %d epoch ends)\n",
               med_sync * 1e3, n_sync);
        printf("  epoch-end wait, snapshot + writer  %9.2f ms (median of %d epoch ends)\n",
               med_async * 1e3, n_async);
        printf("  ratio (median of the rounds' ratios) %7.1fx\n", ratio);
        printf("  after_train wait for the last write %8.2f ms (median)\n", end * 1e3);
        printf("  run wall time: synchronous %.2f s, writer %.2f s (medians)\n", wsync, wasync);
    }
    return 0;
}
