/* towerpack tests: CUDA device discovery. No driver or no device must read
 * as "no CUDA devices", never a crash. Own executable: it may initialise
 * the CUDA runtime. On the GPU machine the same test sees the devices. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/towerpack.h>

Test(device, probe_answers_without_crashing) {
    int n = tp_cuda_device_count();
    const char *status = tp_cuda_status();
    cr_assert(n >= 0);
    cr_assert(status && *status);
    if (n == 0)
        cr_assert(strncmp(status, "no CUDA devices: ", 17) == 0, "%s", status);
    else
        cr_assert(strstr(status, "CUDA device"), "%s", status);
    cr_log_info("%s", status);
    cr_assert_eq(tp_cuda_device_count(), n, "the answer is stable");
}

Test(device, module_from_the_build_tree_loads) {
    /* the build's module, or the one the caller names (a carried copy:
     * scripts/gpu-check.sh sets TP_CUDA_MODULE on the GPU machine) */
    const char *module = getenv("TP_CUDA_MODULE");
    if (!module || !*module)
        module = TP_BINARY_DIR "/lib/libtowerpack_cuda.so";
    if (access(module, R_OK) != 0) {
        cr_skip_test("this build has no CUDA backend module");
        return;
    }
    setenv("TP_CUDA_MODULE", module, 1);
    tp_cuda_device_count();
    cr_assert_not_null(tp_cuda_module(), "%s must load: %s", module,
                       tp_cuda_status());
}

Test(device, a_missing_module_means_no_devices) {
    setenv("TP_CUDA_MODULE", "/nonexistent/libtowerpack_cuda.so", 1);
    cr_assert_eq(tp_cuda_device_count(), 0);
    cr_assert(strstr(tp_cuda_status(), "no CUDA backend module"), "%s",
              tp_cuda_status());
}

Test(device, tp_no_cuda_turns_it_off) {
    setenv("TP_NO_CUDA", "1", 1);
    cr_assert_eq(tp_cuda_device_count(), 0);
    cr_assert(strstr(tp_cuda_status(), "TP_NO_CUDA"));
}
