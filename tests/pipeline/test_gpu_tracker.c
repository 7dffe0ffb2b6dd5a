/* towerpack tests: GPUUtilizationTracker. Without NVML (a CPU-only
 * machine, or TP_NVML_LIBRARY pointing nowhere) it says it is off once and
 * puts nothing; where NVML answers (a GPU machine) every epoch gets each
 * GPU's utilisation and memory. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/launch.h>
#include <towerpack/towerpack.h>
#include "train_testutil.h"
#include "dir_testutil.h"

static char s_dir[64], s_log[128];

/* Two short epochs with the default callbacks (the tracker among them),
 * the log into s_log; stats.json's records. */
static json_t *s_train(int64_t steps_per_epoch) {
    dt_make(s_dir, sizeof s_dir, "tp-gpu");
    snprintf(s_log, sizeof s_log, "%s/test.log", s_dir);
    tp_log_set_level(TP_LOG_INFO);
    cr_assert_eq(tp_log_set_file(s_log), TP_OK);
    tp_train_config_t c;
    tp_train_config_init(&c);
    c.model = tu_linear_model();
    c.batch = 32;
    c.dataflow = tu_blobs(256, 4, 0.7f, 99, 32, 1, 0);
    c.max_epoch = 2;
    c.logdir = s_dir;
    c.logdir_action = TP_LOGDIR_KEEP;  /* it holds the test's log */
    c.threads = 1;
    c.save_checkpoints = 0;
    c.steps_per_epoch = steps_per_epoch;  /* 0: the blobs' 8 */
    cr_assert_eq(tp_launch_train_with_config(&c, NULL), TP_OK, "%s", tp_last_error());
    char path[128];
    snprintf(path, sizeof path, "%s/stats.json", s_dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s", err.text);
    return j;
}

static int s_count_in_log(const char *what) {
    FILE *f = fopen(s_log, "r");
    cr_assert_not_null(f);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, what) != NULL;
    fclose(f);
    return n;
}

static int s_has_gpu_scalars(json_t *records) {
    int n = 0;
    for (size_t i = 0; i < json_array_size(records); i++) {
        const char *key;
        json_t *v;
        json_object_foreach(json_array_get(records, i), key, v) n += !strncmp(key, "GPU", 3);
    }
    return n;
}

static void s_cleanup(void) {
    dt_remove(s_dir);
}

Test(gpu_tracker, without_nvml_it_says_off_once_and_puts_nothing, .fini = s_cleanup) {
    setenv("TP_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
    json_t *j = s_train(0);
    cr_assert_eq(s_count_in_log("GPUUtilizationTracker: off:"), 1, "said once, in %s", s_log);
    cr_assert_eq(s_count_in_log("/nonexistent/libnvidia-ml.so.1"), 1, "names what it tried");
    cr_assert_eq(json_array_size(j), 2);
    cr_assert_eq(s_has_gpu_scalars(j), 0, "no GPU scalars without NVML");
    json_decref(j);
}

/* The working path, on any machine: a stand-in NVML with one GPU 42% busy
 * holding 123 MiB (tests/pipeline/fake_nvml.c). Every epoch gets its
 * numbers, also an epoch shorter than the 200 ms sampling period. */
Test(gpu_tracker, with_nvml_every_epoch_gets_each_gpus_numbers, .fini = s_cleanup) {
    unsetenv("CUDA_VISIBLE_DEVICES");
    setenv("TP_NVML_LIBRARY", TP_FAKE_NVML, 1);
    json_t *j = s_train(0);
    cr_assert_eq(s_count_in_log("GPUUtilizationTracker: off"), 0);
    cr_assert_eq(s_count_in_log("GPUUtilizationTracker: watching 1 GPU"), 1);
    cr_assert_eq(json_array_size(j), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *r = json_array_get(j, i);
        cr_assert_float_eq(json_number_value(json_object_get(r, "GPUUtil/0")), 42, 1e-9);
        cr_assert_float_eq(json_number_value(json_object_get(r, "GPUMemUtil/0")), 7, 1e-9);
        cr_assert_float_eq(json_number_value(json_object_get(r, "GPUMem/0_peak_mb")), 123,
                           1e-9);
    }
    json_decref(j);
}

/* This machine as it is: a CPU-only one says off (once, nothing put); one
 * with NVIDIA's driver and a GPU gets GPUUtil/<i>, GPUMemUtil/<i> and
 * GPUMem/<i>_peak_mb in every epoch (the check a GPU session runs:
 * docs/cuda.md). */
Test(gpu_tracker, this_machine, .fini = s_cleanup) {
    unsetenv("TP_NVML_LIBRARY");
    /* with a driver, epochs of several samples (seconds); else short ones */
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    json_t *j = s_train(nvml ? 20000 : 0);
    if (s_count_in_log("GPUUtilizationTracker: off:") == 1) {
        cr_assert_eq(s_has_gpu_scalars(j), 0);
        json_decref(j);
        return;
    }
    cr_assert_eq(s_count_in_log("GPUUtilizationTracker: watching"), 1, "neither on nor off");
    for (size_t i = 0; i < json_array_size(j); i++) {
        json_t *r = json_array_get(j, i);
        json_t *u = json_object_get(r, "GPUUtil/0");
        json_t *m = json_object_get(r, "GPUMem/0_peak_mb");
        cr_assert_not_null(u, "epoch %zu has no GPUUtil/0", i + 1);
        cr_assert(json_number_value(u) >= 0 && json_number_value(u) <= 100);
        cr_assert(json_number_value(m) > 0, "a GPU in use holds some memory");
    }
    json_decref(j);
}
