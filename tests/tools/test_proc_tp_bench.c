/* towerpack tests: tp-bench cuda steps runs where a GPU check will run it
 * (scripts/gpu-check.sh bench), here on the CPU backend (--cpu): the
 * replicated towers on their threads with the all-reduce in buckets, and
 * its refusals, and --profile. A functional check of the benchmark, not a
 * timing. */
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
