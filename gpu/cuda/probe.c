/* towerpack gpu/cuda: the module's entry point for device discovery.
 * No driver or no device is an answer (count 0 and why), never a crash. */
#include <stdio.h>
#include "gpu/cuda/check.h"

/* Exported for gpu/device.c (dlsym). Returns 0 and fills *count and msg. */
__attribute__((visibility("default")))
int tp_cuda_module_probe(int *count, char *msg, size_t size) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(msg, size, "%s", cudaGetErrorString(e));
        *count = 0;
        return 0;
    }
    size_t off = 0;
    msg[0] = '\0';
    for (int i = 0; i < n && off < size; i++) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess)
            continue;
        int w = snprintf(msg + off, size - off, "%s%d: %s (sm_%d%d, %zu MiB)",
                         i ? ", " : "", i, prop.name, prop.major, prop.minor,
                         prop.totalGlobalMem >> 20);
        off += w > 0 ? (size_t)w : 0;
    }
    *count = n;
    return 0;
}
