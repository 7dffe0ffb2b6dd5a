/* bench/images/resnet18_step.c: the process's CPU time (one thread by default) for a zoo model's
 * training step (forward, backward, SGD update; no input pipeline), the
 * figure that a shared machine's load does not move much: a process's CPU
 * clock runs only while it runs. The cmake target resnet18_step
 * (bench/CMakeLists.txt) builds it as build/bench/resnet18_step;
 * bench/images/resnet18_step.sh brings that up to date and alternates it
 * with its PyTorch twin (resnet18_step_torch.py).
 *
 *   resnet18_step [--model resnet18] [--size 112] [--batch 16] [--classes 3]
 *                 [--channels 3] [--warmup 2] [--steps 6] [--threads 1] [--profile]
 *                 [--profile-nodes] [--l2-op] [--costs] [--decay C] [--bf16]
 *
 * uint8 images of random pixels (--channels 1: grey, as Fashion-MNIST's
 * `--model resnet --size 28 --channels 1 --classes 10 --batch 128`),
 * labels i % classes; SGD with momentum 0.9 and the model's weight decay
 * (resnet18: 1e-4; resnet: 5e-4) as tp-train gives it, in SGD's update
 * pass on the weight matrices and kernels (torch.optim.SGD's coupled
 * decay); --l2-op: as the L2 term in the cost instead (the graph's
 * l2_decay op, tp-train's path before session 29). Prints one JSON line: CPU and wall milliseconds per step (the
 * fastest and the median of --steps), and with --profile each op kind's
 * share of the profiled steps (the host's clock per call) and the
 * convolutions' GFLOP a step; --profile-nodes also each node's forward and
 * backward ms a step on stderr, by the host's clock and by the calling
 * thread's CPU clock, which a loaded host moves far less (the per-layer
 * table of docs/performance.md, "nChw16c chains"). --bf16: the CPU's bf16
 * products and convolutions (tp_backend_cpu_bf16, as tp-train --bf16;
 * exits 2 where the CPU lacks them), the twin's --bf16 its autocast. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <towerpack/backend.h>
#include <towerpack/clock.h>
#include <towerpack/graph.h>
#include <towerpack/models.h>
#include <towerpack/optim.h>
#include <towerpack/status.h>

static double s_decay; /* SGD's coupled decay; 0: none (the L2 op's) */

/* tp-train's SGD (tools/tp-train/main.c s_optimizer): the decay spares the
 * biases and batch norm's parameters, as the L2 op's "*\/W" does */
static tp_optimizer_t *s_sgd(void *user) {
    (void)user;
    tp_optimizer_t *o = tp_optimizer_sgd(0.01, 0.9, 0);
    static const char *const spared[] = {"*/b", "*/gamma", "*/beta"};
    if (o && s_decay > 0 && tp_optimizer_set(o, "weight_decay", s_decay) < 0)
        tp_optimizer_destroy(&o);
    for (int i = 0; o && s_decay > 0 && i < 3; i++)
        if (tp_optimizer_add_decay_mult(o, spared[i], 0.0) < 0)
            tp_optimizer_destroy(&o);
    return o;
}

static double s_cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int s_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *name = "resnet18";
    int size = 112, batch = 16, classes = 3, channels = 3, warmup = 2, steps = 6, profile = 0;
    int threads = 1; /* the backend's (its OpenMP team's); PyTorch's twin takes it too */
    int l2_op = 0;   /* the decay as the cost's L2 term (the graph op) */
    int costs = 0;   /* print each timed step's cost (the cross-entropy) */
    double decay = -1; /* --decay C: SGD's coupled decay C instead of the model's (0: none) */
    int bf16 = 0;      /* --bf16: tp_backend_cpu_bf16(1) */
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--profile"))
            profile = 1;
        else if (!strcmp(argv[i], "--profile-nodes"))
            profile = 2;
        else if (!strcmp(argv[i], "--l2-op"))
            l2_op = 1;
        else if (!strcmp(argv[i], "--costs"))
            costs = 1;
        else if (!strcmp(argv[i], "--bf16"))
            bf16 = 1;
        else if (v && !strcmp(argv[i], "--decay"))
            decay = atof(argv[++i]);
        else if (v && !strcmp(argv[i], "--model"))
            name = argv[++i];
        else if (v && !strcmp(argv[i], "--size"))
            size = atoi(argv[++i]);
        else if (v && !strcmp(argv[i], "--batch"))
            batch = atoi(argv[++i]);
        else if (v && !strcmp(argv[i], "--classes"))
            classes = atoi(argv[++i]);
        else if (v && !strcmp(argv[i], "--channels"))
            channels = atoi(argv[++i]);
        else if (v && !strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[++i]);
        else if (v && !strcmp(argv[i], "--steps"))
            steps = atoi(argv[++i]);
        else if (v && !strcmp(argv[i], "--threads"))
            threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "resnet18_step: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
    }
    enum { MAX_STEPS = 1000 };
    if (size < 1 || batch < 1 || classes < 2 || (channels != 1 && channels != 3) || warmup < 0 ||
        steps < 1 || steps > MAX_STEPS || threads < 1 || threads > 64) {
        fprintf(stderr, "resnet18_step: bad --size/--batch/--classes/--channels/--warmup/--steps/--threads\n");
        return 2;
    }
    if (bf16 && !tp_backend_cpu_bf16(1)) {
        fprintf(stderr, "resnet18_step: --bf16: this CPU has no bf16 dot products\n");
        return 2;
    }
    const tp_zoo_model_t *zm = tp_zoo_find(name);
    tp_input_desc_t desc[2];
    if (!zm || tp_zoo_inputs_shaped(channels, size, size, desc) != TP_OK) {
        fprintf(stderr, "resnet18_step: %s\n", tp_last_error());
        return 1;
    }
    tp_zoo_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.classes = classes;
    opt.no_l2 = !l2_op;
    s_decay = l2_op ? 0.0 : decay >= 0 ? decay : zm->weight_decay;
    tp_model_desc_t md = {desc, 2, zm->build, s_sgd, &opt};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = batch;
    cfg.threads = threads;
    tp_model_t *m = tp_model_new(&md, &cfg);
    if (!m) {
        fprintf(stderr, "resnet18_step: %s\n", tp_last_error());
        return 1;
    }
    const size_t npx = (size_t)batch * (size_t)channels * (size_t)size * (size_t)size;
    uint8_t *img = malloc(npx);
    int32_t *lab = malloc((size_t)batch * sizeof *lab);
    if (!img || !lab)
        return 1;
    srand(1);
    for (size_t i = 0; i < npx; i++)
        img[i] = (uint8_t)(rand() & 255);
    for (int i = 0; i < batch; i++)
        lab[i] = i % classes;
    /* grey: [B, H, W]; colour: [B, 3, H, W] (tp_zoo_inputs_shaped) */
    int64_t is[4] = {batch, channels, size, size}, gs[3] = {batch, size, size}, ls[1] = {batch};
    tp_tensor_t in[2];
    tp_tensor_init_wrap(&in[0], TP_UINT8, channels == 3 ? 4 : 3, channels == 3 ? is : gs, img,
                        NULL, NULL);
    tp_tensor_init_wrap(&in[1], TP_INT32, 1, ls, lab, NULL, NULL);
    for (int i = 0; i < warmup; i++) /* oneDNN builds its kernels in the first */
        if (tp_model_run(m, 0, in, 2, NULL, 0, NULL) < 0) {
            fprintf(stderr, "resnet18_step: %s\n", tp_last_error());
            return 1;
        }
    static double cpu[MAX_STEPS], wall[MAX_STEPS], cost[MAX_STEPS];
    for (int i = 0; i < steps; i++) {
        const double c0 = s_cpu_ms();
        const uint64_t t0 = tp_now_ns();
        tp_fetch_t f = {"cost", {0}};
        if (tp_model_run(m, 0, in, 2, costs ? &f : NULL, costs, NULL) < 0) {
            fprintf(stderr, "resnet18_step: %s\n", tp_last_error());
            return 1;
        }
        wall[i] = (double)(tp_now_ns() - t0) / 1e6;
        cpu[i] = s_cpu_ms() - c0;
        cost[i] = costs ? (double)*(const float *)f.value.data : 0.0;
    }
    /* --costs: the loss curve from the same start (srand(1) pixels, the
     * model's seeded initialisation), to set one decay path against the
     * other (docs/history.md, "Weight decay in SGD's pass") */
    for (int i = 0; costs && i < steps; i++)
        fprintf(stderr, "%s%.9g%s", i ? ", " : "{\"costs\": [", cost[i],
                i + 1 < steps ? "" : "]}\n");
    qsort(cpu, (size_t)steps, sizeof *cpu, s_cmp);
    qsort(wall, (size_t)steps, sizeof *wall, s_cmp);
    printf("{\"side\": \"towerpack\", \"model\": \"%s\", \"size\": %d, \"batch\": %d, "
           "\"bf16\": %s, \"steps\": %d, \"cpu_ms_min\": %.1f, \"cpu_ms_median\": %.1f, "
           "\"wall_ms_min\": %.1f, \"wall_ms_median\": %.1f",
           name, size, batch, bf16 ? "true" : "false", steps, cpu[0], cpu[steps / 2], wall[0],
           wall[steps / 2]);
    if (profile) {
        enum { MAX_OPS = 1024 };
        static tp_op_profile_t pr[MAX_OPS];
        tp_model_set_profiling(m, 1);
        for (int i = 0; i < steps; i++)
            tp_model_run(m, 0, in, 2, NULL, 0, NULL);
        int np = tp_model_profile(m, 0, pr, MAX_OPS);
        np = np < MAX_OPS ? np : MAX_OPS;
        double ms[TP_OP_COUNT] = {0}, total = 0, cf = 0, cb = 0;
        for (int i = 0; i < np; i++) {
            const double t = (double)(pr[i].forward_ns + pr[i].backward_ns) / 1e6 / steps;
            ms[pr[i].kind] += t;
            total += t;
            if (pr[i].kind == TP_OP_CONV2D) {
                cf += pr[i].flops_forward;
                cb += pr[i].flops_backward;
            }
        }
        /* --profile-nodes: each node's row on stderr (the per-layer table
         * of docs/performance.md), ms a step forward and backward */
        for (int i = 0; profile > 1 && i < np; i++)
            fprintf(stderr, "%-40s %-14s fwd %7.2f  bwd %7.2f  thread cpu %7.2f %7.2f  folds %d  "
                    "gflop %.3f/%.3f\n",
                    pr[i].name, tp_op_name(pr[i].kind), (double)pr[i].forward_ns / 1e6 / steps,
                    (double)pr[i].backward_ns / 1e6 / steps,
                    (double)pr[i].thread_forward_ns / 1e6 / steps,
                    (double)pr[i].thread_backward_ns / 1e6 / steps, pr[i].folds,
                    pr[i].flops_forward / 1e9, pr[i].flops_backward / 1e9);
        printf(", \"conv_gflop_per_step\": %.2f, \"profile_ms\": {", (cf + cb) / 1e9);
        const char *sep = "";
        for (int k = 0; k < TP_OP_COUNT; k++)
            if (ms[k] > 0.005 * total) {
                printf("%s\"%s\": %.1f", sep, tp_op_name((tp_op_kind_t)k), ms[k]);
                sep = ", ";
            }
        printf("}");
    }
    printf("}\n");
    tp_model_destroy(&m);
    free(img);
    free(lab);
    return 0;
}
