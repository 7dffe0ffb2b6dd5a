/* towerpack tests: tp-bench cuda steps runs where a GPU check will run it
 * (scripts/gpu-check.sh bench), here on the CPU backend (--cpu): the
 * replicated towers on their threads with the all-reduce in buckets, and
 * its refusals, and --profile. A functional check of the benchmark, not a
 * timing. tp-bench ops --quick, the op table against PyTorch, and --device
 * without a GPU. tp-bench step
 * --profile, the CNN's and the GPT's. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include "proc_testutil.h"

static char s_out[1 << 14];

Test(tp_bench, cuda_steps_runs_replicated_towers_with_buckets_on_the_cpu) {
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "cuda", "steps", "--cpu", "--model",
                    "mlp", "--batch", "16", "--steps", "20", "--towers", "2",
                    "--replicated", "--bucket-mb", "0.25", "--json", NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
    const char *j = strstr(s_out, "{\"bench\":\"cuda-steps\"");
    cr_assert_not_null(j, "%s", s_out);
    cr_assert(strstr(j, "\"towers\":2,\"replicated\":1,\"bucket_mb\":0.25"), "%s", j);
    const char *r = strstr(j, "\"steps_per_s\":");
    cr_assert_not_null(r, "%s", j);
    cr_assert_gt(atof(r + strlen("\"steps_per_s\":")), 0.0, "%s", j);
    /* the CPU's steps end done: the host never waits on a device */
    const char *w = strstr(j, "\"device_wait\":");
    cr_assert_not_null(w, "%s", j);
    double waited = atof(w + strlen("\"device_wait\":"));
    cr_assert(waited >= 0 && waited < 0.2, "%s", j);
}

Test(tp_bench, cuda_steps_replicated_needs_two_towers) {
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "cuda", "steps", "--cpu", "--model",
                    "mlp", "--towers", "1", "--replicated", NULL};
    cr_assert_eq(pu_run(argv, NULL, s_out, sizeof s_out), 2, "%s", s_out);
    cr_assert(strstr(s_out, "--replicated: two towers or more"), "%s", s_out);
}

/* --profile, as gpu-check's bench runs it on the GPU: each op's host and
 * device time (the CPU's timer marks are its clock) and the step's whole
 * device time, for the GEMM step and a zoo model. */
Test(tp_bench, profile_prints_the_host_and_device_time_per_op) {
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    char *gemm[] = {TP_BINARY_DIR "/bin/tp-bench", "cuda", "gemm", "--cpu", "--batch", "32",
                    "--width", "64", "--iters", "2", "--rounds", "1", "--profile", NULL};
    cr_assert_eq(pu_run(gemm, env, s_out, sizeof s_out), 0, "%s", s_out);
    cr_assert(strstr(s_out, "fwd host   fwd dev  bwd host   bwd dev"), "%s", s_out);
    cr_assert(strstr(s_out, "fc1/matmul"), "%s", s_out);
    const char *d = strstr(s_out, "device time: ");
    cr_assert_not_null(d, "%s", s_out);
    cr_assert_gt(atof(d + strlen("device time: ")), 0.0, "%s", d);
    char *steps[] = {TP_BINARY_DIR "/bin/tp-bench", "cuda", "steps", "--cpu", "--model",
                     "mlp", "--batch", "16", "--steps", "10", "--profile", NULL};
    cr_assert_eq(pu_run(steps, env, s_out, sizeof s_out), 0, "%s", s_out);
    cr_assert(strstr(s_out, "device time: "), "%s", s_out);
    cr_assert(strstr(s_out, "the host waited for the device"), "%s", s_out);
}

/* tp-bench step --profile: the machine's FP32 peak measured in the run
 * (a plausible figure for one thread: more than 1 GFLOPS, less than any
 * core makes), and each convolution's and fc's FLOPs, GFLOPS and fraction
 * of that peak. */
Test(tp_bench, step_profile_prints_gflops_against_the_measured_peak) {
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "step", "--profile", "--rounds", "1",
                    "--iters", "1", "--batch", "8", NULL};
    const int rc = pu_run(argv, env, s_out, sizeof s_out);
    cr_assert(rc == 0 || rc == 3, "rc %d: %s", rc, s_out); /* 3: the MLP's ratio */
    const char *p = strstr(s_out, "FP32 peak ");
    cr_assert_not_null(p, "%s", s_out);
    const double peak = atof(p + strlen("FP32 peak "));
    cr_assert(peak > 1.0 && peak < 1000.0, "peak %f GFLOPS: %s", peak, s_out);
    cr_assert(strstr(p, "FMA, 1 thread(s)"), "%s", p);
    /* conv2: 8 x 64 x 14 x 14 x 32 x 9 multiply-adds + the bias, in MFLOPs */
    const char *c = strstr(s_out, "conv2/output");
    cr_assert_not_null(c, "%s", s_out);
    char name[32], kind[32];
    double fms, bms, mf, fgf, fpc, bgf, bpc;
    cr_assert_eq(sscanf(c, "%31s %31s %lf %lf %lf %lf %lf%% %lf %lf%%", name, kind, &fms, &bms,
                        &mf, &fgf, &fpc, &bgf, &bpc),
                 9, "%.200s", c);
    cr_expect_float_eq(mf, (2.0 * 8 * 64 * 14 * 14 * 32 * 9 + 8 * 64 * 14 * 14) / 1e6, 0.06);
    cr_expect_gt(fgf, 0.0);
    cr_expect_gt(bgf, 0.0);
    /* the GFLOPS and the peak are printed with one decimal: against a
     * small peak (an unoptimised sanitizer build's FMA loop, 4.1 GFLOPS)
     * their rounding moves the percentage by more than 1 point */
    cr_expect_float_eq(fpc, 100.0 * fgf / peak, 1.0 + (100.0 + fpc) * 0.05 / peak, "%.200s",
                       c);
    cr_assert(strstr(s_out, "fc1/matmul"), "%s", s_out);
    cr_assert(strstr(s_out, "convolutions"), "%s", s_out);
}

/* tp-bench step --model gpt (issue 45): the zoo GPT's step at a tiny shape,
 * profiled per op kind at 2 threads (the 1-thread model first, then the
 * 2-thread one made again): the products' row sums the layer's five
 * linears and the tied logits' FLOPs, with folds on; the team table and
 * the Amdahl bound; and with --no-fold a JSON line that says fold 0. */
Test(tp_bench, step_gpt_profiles_the_step_per_op_kind) {
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "step", "--model", "gpt", "--layers", "1",
                    "--width", "32", "--heads", "2", "--context", "16", "--batch", "2",
                    "--threads", "2", "--rounds", "1", "--iters", "1", "--profile", NULL};
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
    cr_assert(strstr(s_out, "GPT per op kind, per step"), "%s", s_out);
    const char *b = strstr(s_out, "\n  batch_matmul ");
    cr_assert_not_null(b, "%s", s_out);
    int nodes = 0, folds = 0;
    double fms, bms, mf;
    cr_assert_eq(sscanf(b, " batch_matmul %d+%d %lf %lf %lf", &nodes, &folds, &fms, &bms, &mf),
                 5, "%.200s", b);
    cr_expect_eq(nodes, 5, "qkv, proj, fc, fc2 and the logits: %.200s", b);
    cr_expect_gt(folds, 0, "the biases and the GELU fold by default: %.200s", b);
    /* 2 x 32 tokens x 32 x (96 + 32 + 128 + 128 + 256) multiply-adds */
    cr_expect_float_eq(mf, 2.0 * 32 * 32 * (96 + 32 + 128 + 128 + 256) / 1e6, 0.06, "%.200s", b);
    cr_assert(strstr(s_out, "GPT per op kind on the CPU's team"), "%s", s_out);
    cr_assert(strstr(s_out, "\n  attention "), "%s", s_out);
    cr_assert(strstr(s_out, "Amdahl bound at 2 threads"), "%s", s_out);
    const char *g = strstr(s_out, "GPT 1 layers, width 32, 2 heads, context 16, batch 2, "
                                  "AdamW, folds on, 2 thread(s): ");
    cr_assert_not_null(g, "%s", s_out);
    cr_expect_gt(atof(strchr(g, ':') + 1), 0.0, "%s", g);
    char *nofold[] = {TP_BINARY_DIR "/bin/tp-bench", "step", "--model", "gpt", "--layers", "1",
                      "--width", "32", "--heads", "2", "--context", "16", "--batch", "2",
                      "--rounds", "1", "--iters", "1", "--no-fold", "--json", NULL};
    cr_assert_eq(pu_run(nofold, env, s_out, sizeof s_out), 0, "%s", s_out);
    const char *j = strstr(s_out, "{\"bench\":\"step\",\"model\":\"gpt\",\"layers\":1,");
    cr_assert_not_null(j, "%s", s_out);
    cr_assert(strstr(j, "\"threads\":1,\"fold\":0,"), "%s", j);
    const char *t = strstr(j, "\"tokens_per_s\":");
    cr_assert_not_null(t, "%s", j);
    cr_expect_gt(atof(t + strlen("\"tokens_per_s\":")), 0.0, "%s", j);
    char *mlp[] = {TP_BINARY_DIR "/bin/tp-bench", "step", "--layers", "2", NULL};
    cr_assert_eq(pu_run(mlp, env, s_out, sizeof s_out), 2, "%s", s_out);
    cr_assert(strstr(s_out, "give --model gpt"), "%s", s_out);
}

/* tp-bench step --bf16 --profile: the products run in bf16, so the
 * percentages read against bf16's peak (a VDPBF16PS loop; it read "159%"
 * of FP32's), said in the header, where the CPU has bf16 dot products;
 * elsewhere the FP32 peak, as without the flag. */
Test(tp_bench, step_bf16_profile_reads_against_the_bf16_peak) {
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "step", "--model", "gpt", "--layers", "1",
                    "--width", "64", "--heads", "2", "--context", "32", "--batch", "2",
                    "--rounds", "1", "--iters", "1", "--profile", "--bf16", NULL};
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
    __builtin_cpu_init();
    const int bf16 = __builtin_cpu_supports("avx512bf16");
    const char *p = strstr(s_out, bf16 ? "BF16 peak " : "FP32 peak ");
    cr_assert_not_null(p, "%s", s_out);
    const double peak = atof(p + strlen("BF16 peak "));
    cr_assert(peak > 1.0 && peak < 4000.0, "peak %f GFLOPS: %s", peak, s_out);
    if (bf16)
        cr_assert(strstr(p, "(AVX512_BF16 dot products, 1 thread(s), measured now)"), "%s", p);
    const char *b = strstr(s_out, "\n  batch_matmul ");
    cr_assert_not_null(b, "%s", s_out);
    char kind[32];
    double fms, bms, mf, fgf, fpc;
    cr_assert_eq(sscanf(b, " batch_matmul %31s %lf %lf %lf %lf %lf%%", kind, &fms, &bms, &mf,
                        &fgf, &fpc),
                 6, "%.200s", b);
    cr_expect_float_eq(fpc, 100.0 * fgf / peak, 1.0 + (100.0 + fpc) * 0.05 / peak, "%.200s",
                       b);
}

/* tp-bench ops --quick (the smoke run): the rows asked for are timed from
 * the profiler (one per op family on main, and a whole step), each a
 * positive time; a pattern no row matches is refused, naming --list. */
static const char *s_ops_rows = "relu,add_bcast,mse,softmax_xent,matmul/mlp1,conv2d/enc1,"
                                "batch_norm,max_pool,mlp_step";
#define OPS_ROWS 9

/* Every row of the JSON line has a positive `key`; returns how many rows. */
static int s_rows_positive(const char *j, const char *key) {
    int n = 0;
    for (const char *p = strstr(j, "{\"name\":"); p; p = strstr(p + 1, "{\"name\":")) {
        const char *v = strstr(p, key);
        cr_assert_not_null(v, "%s", p);
        cr_assert_gt(atof(v + strlen(key)), 0.0, "%s in %.200s", key, p);
        n++;
    }
    return n;
}

Test(tp_bench, ops_quick_times_each_row_from_the_profiler) {
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "ops", "--quick", "--no-torch", "--op",
                    (char *)s_ops_rows, "--json", NULL};
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
    const char *j = strstr(s_out, "{\"bench\":\"ops\",\"threads\":1,\"fold\":0");
    cr_assert_not_null(j, "%s", s_out);
    cr_assert_eq(s_rows_positive(j, "\"towerpack_us\":"), OPS_ROWS, "%s", j);
    cr_assert(strstr(j, "\"compared\":0,\"slower\":0}"), "%s", j);
    char *none[] = {TP_BINARY_DIR "/bin/tp-bench", "ops", "--op", "no-such-op", NULL};
    cr_assert_eq(pu_run(none, env, s_out, sizeof s_out), 2, "%s", s_out);
    cr_assert(strstr(s_out, "no row matches 'no-such-op' (--list names them)"), "%s", s_out);
}

/* conv2d/enc2_nhwc (issue 42): its row plans the graph's folds, so the
 * convolution reads the NHWC input itself (fold.c's tp_plan_nhwc_), as a
 * model fed NHWC images runs and as PyTorch's channels_last view does: one
 * node folded into the row's calls, none into the MSE head's. With
 * TP_NHWC_FOLD=0 the transpose runs as its own call, timed in the row
 * too; conv2d/enc2 (NCHW) folds nothing either way. */
Test(tp_bench, ops_nhwc_conv_row_reads_its_input_nhwc) {
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "ops", "--quick", "--no-torch", "--op",
                    "conv2d/enc2,conv2d/enc2_nhwc", "--json", NULL};
    for (int fold = 1; fold >= 0; fold--) {
        const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1",
                             fold ? "TP_NHWC_FOLD=1" : "TP_NHWC_FOLD=0", NULL};
        cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
        const char *j = strstr(s_out, "{\"bench\":\"ops\"");
        cr_assert_not_null(j, "%s", s_out);
        cr_assert_eq(s_rows_positive(j, "\"towerpack_us\":"), 2, "%s", j);
        const char *nchw = strstr(j, "{\"name\":\"conv2d/enc2\"");
        const char *nhwc = strstr(j, "{\"name\":\"conv2d/enc2_nhwc\"");
        cr_assert(nchw && nhwc, "%s", j);
        cr_assert_not_null(strstr(nchw, "\"folds\":0,"), "%s", nchw);
        cr_assert_eq(atoi(strstr(nhwc, "\"folds\":") + 8), fold, "%s", nhwc);
        cr_assert_not_null(strstr(nhwc, "\"status\":\"ok\""), "%s", nhwc);
    }
}

/* The same rows against PyTorch (its peer, bench/peers/torch_ops.py): a
 * time at 1 and 2 threads and a ratio for every row. Skipped where
 * /usr/bin/python3 lacks torch. */
Test(tp_bench, ops_quick_compares_each_row_with_pytorch) {
    char *probe[] = {"/usr/bin/python3", "-c", "import torch", NULL};
    if (pu_run(probe, NULL, s_out, sizeof s_out) != 0)
        cr_skip_test("/usr/bin/python3 lacks torch (python3-torch): %s", s_out);
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "ops", "--quick", "--op",
                    (char *)s_ops_rows, "--peer", TP_SOURCE_DIR "/bench/peers/torch_ops.py",
                    "--json", NULL};
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
    const char *j = strstr(s_out, "{\"bench\":\"ops\"");
    cr_assert_not_null(j, "%s", s_out);
    cr_assert(!strstr(j, "\"torch\":\"\""), "the peer did not run: %s", s_out);
    cr_assert_eq(s_rows_positive(j, "\"torch1_us\":"), OPS_ROWS, "%s", j);
    cr_assert_eq(s_rows_positive(j, "\"torch2_us\":"), OPS_ROWS, "%s", j);
    cr_assert_eq(s_rows_positive(j, "\"ratio\":"), OPS_ROWS, "%s", j);
    cr_assert(strstr(j, "\"compared\":9,"), "%s", j);
}

/* tp-bench ops --device 0 (issue 42's table on a GPU). Without a device
 * (no driver here; a build without the CUDA module) it stops in one line
 * on stderr, "no CUDA devices: ...", exit 77, before starting the peer or
 * building a model: no crash, no hang. On a machine with a GPU the same
 * command runs: every row timed on cuda:0, or listed as not on CUDA. A
 * bad ordinal and --cpu-time (the CPU's clock) are refused. */
Test(tp_bench, ops_device_without_a_gpu_says_so_in_one_line) {
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "ops", "--device", "0", "--quick",
                    "--no-torch", "--op", (char *)s_ops_rows, "--json", NULL};
    int rc = pu_run(argv, env, s_out, sizeof s_out);
    if (rc == 0) { /* a GPU answered: the table ran there */
        const char *j = strstr(s_out, "{\"bench\":\"ops\"");
        cr_assert_not_null(j, "%s", s_out);
        cr_assert(strstr(j, "\"device\":\"cuda:0"), "%s", j);
        int ok = 0;
        for (const char *p = strstr(j, "\"status\":\""); p; p = strstr(p + 1, "\"status\":\""))
#define S_IS(lit) (!strncmp(p, lit, sizeof lit - 1))
            ok += S_IS("\"status\":\"ok\"") || S_IS("\"status\":\"not on CUDA\"");
#undef S_IS
        cr_assert_eq(ok, OPS_ROWS, "%s", j);
    } else {
        cr_assert_eq(rc, 77, "%s", s_out);
#define NO_DEV "tp-bench ops: --device 0: no CUDA devices: "
        cr_assert(!strncmp(s_out, NO_DEV, sizeof NO_DEV - 1), "%s", s_out);
#undef NO_DEV
        cr_assert_eq(strchr(s_out, '\n'), s_out + strlen(s_out) - 1, "not one line: %s",
                     s_out);
        /* a build without CUDA says so (the module is what CUDA would be) */
        if (access(TP_BINARY_DIR "/lib/libtowerpack_cuda.so", F_OK) != 0)
            cr_assert(strstr(s_out, "this build has no CUDA backend module"), "%s", s_out);
    }
    char *bad[] = {TP_BINARY_DIR "/bin/tp-bench", "ops", "--device", "gpu0", NULL};
    cr_assert_eq(pu_run(bad, env, s_out, sizeof s_out), 2, "%s", s_out);
    cr_assert(strstr(s_out, "--device 'gpu0': a CUDA device number"), "%s", s_out);
    char *cpu_time[] = {TP_BINARY_DIR "/bin/tp-bench", "ops", "--device", "0", "--cpu-time",
                        NULL};
    cr_assert_eq(pu_run(cpu_time, env, s_out, sizeof s_out), 2, "%s", s_out);
    cr_assert(strstr(s_out, "--cpu-time is for the CPU"), "%s", s_out);
}

/* The lead's note on issue 47: tp-bench transport --json without a
 * tp-worker beside it printed the tcp rows as measured zeros (towerpack
 * 0.0, ratio 0.000), and the cases --only left out as zeros too. A case
 * without figures now says why ("skipped") and has no ratio. */
Test(tp_bench, transport_json_says_why_a_case_has_no_figures) {
    char dir[] = "/tmp/tp-bench-lone-XXXXXX", bin[64], cmd[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(bin, sizeof bin, "%s/tp-bench", dir);  /* a tp-bench with no tp-worker */
    snprintf(cmd, sizeof cmd, "cp %s/bin/tp-bench %s", TP_BINARY_DIR, bin);
    cr_assert_eq(system(cmd), 0);
    char *argv[] = {bin, "transport", "--only", "tcp", "--repeat", "1", "--json", NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
    unlink(bin);
    rmdir(dir);
    const char *t = strstr(s_out, "\"tcp_tp_worker\": [");
    cr_assert_not_null(t, "%s", s_out);
    cr_assert(strstr(t, "\"skipped\": \"no tp-worker beside tp-bench"), "%s", s_out);
    cr_assert_null(strstr(t, "\"ratio\""), "a tcp row without a peer has a ratio: %s", t);
    cr_assert(strstr(s_out, "\"ipc_1mib\": {\"skipped\": \"not run (--only tcp)\"}"), "%s",
              s_out);
    cr_assert_null(strstr(s_out, "\"ratio\": 0.000"), "%s", s_out);
}

/* --cpu-time: a step row timed in process CPU time on both sides (the
 * JSON says which clock; without the flag, wall), a positive time on each;
 * the peer's side where /usr/bin/python3 has torch. */
Test(tp_bench, ops_cpu_time_times_step_rows_in_process_cpu_time) {
    const char *env[] = {"TP_LOG_LEVEL=warn", "OPENBLAS_NUM_THREADS=1", NULL};
    char *probe[] = {"/usr/bin/python3", "-c", "import torch", NULL};
    const int torch = pu_run(probe, NULL, s_out, sizeof s_out) == 0;
    char *argv[] = {TP_BINARY_DIR "/bin/tp-bench", "ops", "--quick", "--threads", "1",
                    "--op", "mlp_step", "--cpu-time", "--json", "--peer",
                    TP_SOURCE_DIR "/bench/peers/torch_ops.py", torch ? NULL : "--no-torch",
                    NULL};
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
    const char *j = strstr(s_out, "\"step_clock\":\"cpu\"");
    cr_assert_not_null(j, "%s", s_out);
    cr_assert_eq(s_rows_positive(j, "\"towerpack_us\":"), 1, "%s", j);
    if (torch)
        cr_assert_eq(s_rows_positive(j, "\"torch1_us\":"), 1, "%s", j);
    argv[7] = "--json"; /* the same without --cpu-time: wall time */
    argv[8] = NULL;
    cr_assert_eq(pu_run(argv, env, s_out, sizeof s_out), 0, "%s", s_out);
    cr_assert(strstr(s_out, "\"step_clock\":\"wall\""), "%s", s_out);
}
