/* towerpack pipeline: GPUUtilizationTracker (tensorpack's name): each GPU's
 * utilisation and memory per epoch, read through NVML.
 *
 * NVML (libnvidia-ml.so.1, the driver's library) is loaded at run time with
 * dlopen, so towerpack neither links it nor needs its header: the few
 * functions used are declared here with NVML's published signatures. Where
 * it is missing (a CPU-only machine), does not start, or sees no GPU, the
 * tracker says so once and does nothing else. Otherwise a thread samples
 * every GPU it watches every SAMPLE_MS during each epoch (an epoch shorter
 * than that gets one sample at its end), and after the
 * epoch puts GPUUtil/<i> (mean utilisation, %), GPUMemUtil/<i> (mean
 * memory-controller utilisation, %) and GPUMem/<i>_peak_mb (the most memory
 * in use, MB). It watches the GPUs in CUDA_VISIBLE_DEVICES when that lists
 * indices (NVML itself ignores it), else every GPU. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <towerpack/callback.h>
#include <towerpack/log.h>
#include "pipeline/callbacks/cb_internal.h"

#define SAMPLE_MS 200
#define MAX_GPUS 64

/* NVML's types and entry points (nvml.h), as far as they are used. */
typedef int s_nvml_ret_t;  /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef struct s_nvml_device *s_nvml_device_t;
typedef struct {
    unsigned int gpu, memory;  /* percent of the last sample period */
} s_nvml_util_t;
typedef struct {
    unsigned long long total, free, used;  /* bytes */
} s_nvml_memory_t;

typedef struct {
    s_nvml_ret_t (*init)(void);
    s_nvml_ret_t (*shutdown)(void);
    s_nvml_ret_t (*count)(unsigned int *);
    s_nvml_ret_t (*handle)(unsigned int, s_nvml_device_t *);
    s_nvml_ret_t (*util)(s_nvml_device_t, s_nvml_util_t *);
    s_nvml_ret_t (*memory)(s_nvml_device_t, s_nvml_memory_t *);
    const char *(*error)(s_nvml_ret_t);
} s_nvml_t;

typedef struct {
    s_nvml_t nvml;
    int ngpus;
    int index[MAX_GPUS];          /* NVML's index of each watched GPU */
    s_nvml_device_t dev[MAX_GPUS];
    pthread_t thread;
    int thread_up, nvml_up;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, in_epoch;           /* under mu */
    /* this epoch's samples, under mu */
    double util_sum[MAX_GPUS], memutil_sum[MAX_GPUS];
    unsigned long long mem_peak[MAX_GPUS];
    long samples;
} s_gpu_t;

/* Load NVML and find the GPUs; 0, or -1 with why[size] saying what is
 * missing. */
static int s_open(s_gpu_t *g, char *why, size_t size) {
    const char *lib = getenv("TP_NVML_LIBRARY");
    if (!lib || !*lib)
        lib = "libnvidia-ml.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, size, "NVML is not there (%s), no NVIDIA driver: %s", lib, dlerror());
        return -1;
    }
    /* never dlclose'd: the driver's library keeps threads of its own */
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"nvmlInit_v2", (void **)&g->nvml.init},
        {"nvmlShutdown", (void **)&g->nvml.shutdown},
        {"nvmlDeviceGetCount_v2", (void **)&g->nvml.count},
        {"nvmlDeviceGetHandleByIndex_v2", (void **)&g->nvml.handle},
        {"nvmlDeviceGetUtilizationRates", (void **)&g->nvml.util},
        {"nvmlDeviceGetMemoryInfo", (void **)&g->nvml.memory},
        {"nvmlErrorString", (void **)&g->nvml.error},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
        if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
            snprintf(why, size, "%s has no %s", lib, syms[i].name);
            return -1;
        }
    s_nvml_ret_t rc = g->nvml.init();
    if (rc != 0) {
        snprintf(why, size, "nvmlInit: %s", g->nvml.error(rc));
        return -1;
    }
    g->nvml_up = 1;
    unsigned int n = 0;
    if ((rc = g->nvml.count(&n)) != 0 || n == 0) {
        snprintf(why, size, "%s", rc ? g->nvml.error(rc) : "NVML sees no GPU");
        return -1;
    }
    /* CUDA_VISIBLE_DEVICES of indices picks the GPUs; UUIDs or anything
     * else: every GPU */
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    int picked = 0;
    if (vis && *vis) {
        const char *p = vis;
        while (*p && g->ngpus < MAX_GPUS) {
            char *end;
            long i = strtol(p, &end, 10);
            if (end == p || (*end && *end != ',')) {
                g->ngpus = 0;
                break;
            }
            if (i >= 0 && i < (long)n)
                g->index[g->ngpus++] = (int)i;
            p = *end ? end + 1 : end;
        }
        picked = g->ngpus > 0;
    }
    if (!picked)
        for (unsigned int i = 0; i < n && g->ngpus < MAX_GPUS; i++)
            g->index[g->ngpus++] = (int)i;
    for (int k = 0; k < g->ngpus; k++)
        if ((rc = g->nvml.handle((unsigned)g->index[k], &g->dev[k])) != 0) {
            snprintf(why, size, "GPU %d: %s", g->index[k], g->nvml.error(rc));
            return -1;
        }
    return 0;
}

/* One sample of every GPU into the epoch's sums; called with mu held,
 * released while NVML answers (its calls take a while). */
static void s_sample_locked(s_gpu_t *g) {
    pthread_mutex_unlock(&g->mu);
    s_nvml_util_t u[MAX_GPUS];
    s_nvml_memory_t m[MAX_GPUS];
    int ok[MAX_GPUS];
    for (int k = 0; k < g->ngpus; k++)
        ok[k] = g->nvml.util(g->dev[k], &u[k]) == 0 && g->nvml.memory(g->dev[k], &m[k]) == 0;
    pthread_mutex_lock(&g->mu);
    for (int k = 0; k < g->ngpus; k++) {
        if (!ok[k])
            continue;
        g->util_sum[k] += u[k].gpu;
        g->memutil_sum[k] += u[k].memory;
        if (m[k].used > g->mem_peak[k])
            g->mem_peak[k] = m[k].used;
    }
    g->samples++;
}

static void *s_sampler(void *arg) {
    s_gpu_t *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SAMPLE_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (!g->stop && g->in_epoch)
            s_sample_locked(g);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static tp_status_t gpu_before_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_gpu_t *g = impl;
    char why[512];
    if (s_open(g, why, sizeof why) < 0) {
        /* once per run, and nothing more: CPU-only machines are normal */
        TP_INFO("GPUUtilizationTracker: off: %s", why);
        g->ngpus = 0;
        return TP_OK;
    }
    if (pthread_create(&g->thread, NULL, s_sampler, g) != 0) {
        TP_WARN("GPUUtilizationTracker: off: cannot start its thread: %s", strerror(errno));
        g->ngpus = 0;
        return TP_OK;
    }
    g->thread_up = 1;
    TP_INFO("GPUUtilizationTracker: watching %d GPU%s through NVML", g->ngpus,
            g->ngpus == 1 ? "" : "s");
    return TP_OK;
}

static tp_status_t gpu_before_epoch(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_gpu_t *g = impl;
    if (!g->thread_up)
        return TP_OK;
    pthread_mutex_lock(&g->mu);
    memset(g->util_sum, 0, sizeof g->util_sum);
    memset(g->memutil_sum, 0, sizeof g->memutil_sum);
    memset(g->mem_peak, 0, sizeof g->mem_peak);
    g->samples = 0;
    g->in_epoch = 1;
    pthread_mutex_unlock(&g->mu);
    return TP_OK;
}

static tp_status_t gpu_after_epoch(void *impl, tp_trainer_t *tr) {
    s_gpu_t *g = impl;
    if (!g->thread_up)
        return TP_OK;
    pthread_mutex_lock(&g->mu);
    g->in_epoch = 0;
    if (g->samples == 0)  /* an epoch shorter than a sampling period */
        s_sample_locked(g);
    long n = g->samples;
    double util[MAX_GPUS], memutil[MAX_GPUS], peak[MAX_GPUS];
    for (int k = 0; k < g->ngpus; k++) {
        util[k] = n ? g->util_sum[k] / (double)n : 0;
        memutil[k] = n ? g->memutil_sum[k] / (double)n : 0;
        peak[k] = (double)g->mem_peak[k] / (1024.0 * 1024.0);
    }
    pthread_mutex_unlock(&g->mu);
    for (int k = 0; k < g->ngpus; k++) {
        char name[64];
        snprintf(name, sizeof name, "GPUUtil/%d", g->index[k]);
        tp_trainer_put_scalar(tr, name, util[k]);
        snprintf(name, sizeof name, "GPUMemUtil/%d", g->index[k]);
        tp_trainer_put_scalar(tr, name, memutil[k]);
        snprintf(name, sizeof name, "GPUMem/%d_peak_mb", g->index[k]);
        tp_trainer_put_scalar(tr, name, peak[k]);
    }
    return TP_OK;
}

static void s_stop(s_gpu_t *g) {
    if (g->thread_up) {
        pthread_mutex_lock(&g->mu);
        g->stop = 1;
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
        g->thread_up = 0;
    }
    if (g->nvml_up) {
        g->nvml.shutdown();
        g->nvml_up = 0;
    }
}

static tp_status_t gpu_after_train(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_stop(impl);
    return TP_OK;
}

static void gpu_destroy(void *impl) {
    s_gpu_t *g = impl;
    s_stop(g);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static const tp_callback_ops_t s_gpu_ops = {
    .name = "GPUUtilizationTracker",
    .before_train = gpu_before_train,
    .before_epoch = gpu_before_epoch,
    .after_epoch = gpu_after_epoch,
    .after_train = gpu_after_train,
    .destroy = gpu_destroy,
};

tp_callback_t *tp_cb_gpu_utilization(void) {
    s_gpu_t *g = tp_cb_impl_alloc(sizeof *g, "GPUUtilizationTracker");
    if (!g)
        return NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return tp_callback_new(&s_gpu_ops, g, 0);
}
