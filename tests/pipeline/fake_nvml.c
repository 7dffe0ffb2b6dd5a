/* towerpack tests: a stand-in for NVIDIA's libnvidia-ml.so.1 with one GPU
 * that is always 42% busy (memory controller 7%) and holds 123 MiB, so the
 * GPUUtilizationTracker's working path runs on a machine without a GPU
 * (TP_NVML_LIBRARY points at it). Only the functions the tracker calls,
 * with NVML's signatures. */
#include <stddef.h>

typedef struct {
    unsigned int gpu, memory;
} util_t;
typedef struct {
    unsigned long long total, free, used;
} memory_t;

static int s_device;

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) {
    *n = 1;
    return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev) {
    if (i != 0)
        return 2;  /* NVML_ERROR_INVALID_ARGUMENT */
    *dev = &s_device;
    return 0;
}
int nvmlDeviceGetUtilizationRates(void *dev, util_t *u) {
    (void)dev;
    u->gpu = 42;
    u->memory = 7;
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *dev, memory_t *m) {
    (void)dev;
    m->total = 80ull << 30;
    m->used = 123ull << 20;
    m->free = m->total - m->used;
    return 0;
}
const char *nvmlErrorString(int rc) { return rc ? "fake error" : "success"; }
