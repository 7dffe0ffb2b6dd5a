/* towerpack gpu: the device and backend registry: loading the CUDA backend
 * module, asking it for devices, and choosing a backend.
 *
 * The module is looked up by core's loader (module.h): $TP_CUDA_MODULE (a
 * path), next to the library or program that contains towerpack, in ../lib
 * from there (build tree and install tree alike), then by name through the
 * loader's path. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <towerpack/device.h>
#include <towerpack/log.h>
#include <towerpack/module.h>
#include <towerpack/process.h>
#include "gpu/backend_impl.h"

#ifndef TP_CUDA_MODULE_NAME
#define TP_CUDA_MODULE_NAME "libtowerpack_cuda.so"
#endif

static pthread_once_t s_once = PTHREAD_ONCE_INIT;
static volatile int s_loaded;  /* set once the module is dlopen'ed here */
static void *s_module;
static int s_count;
static char s_status[512];

typedef int (*s_probe_fn)(int *count, char *msg, size_t size);

static void s_probe(void) {
    if (getenv("TP_NO_CUDA")) {
        snprintf(s_status, sizeof s_status, "no CUDA devices: TP_NO_CUDA is set");
        return;
    }
    s_module = tp_module_open("CUDA", TP_CUDA_MODULE_NAME, "TP_CUDA_MODULE", 0,
                              NULL, 0);
    s_loaded = s_module != NULL;
    if (s_loaded)  /* the dataflows that fork workers ask core, not gpu */
        tp_fork_hazard_set("the CUDA module is loaded (reset it before any "
                           "CUDA use)");
    if (!s_module) {
        snprintf(s_status, sizeof s_status,
                 "no CUDA devices: this build has no CUDA backend module (%s)",
                 TP_CUDA_MODULE_NAME);
        return;
    }
    s_probe_fn probe = (s_probe_fn)dlsym(s_module, "tp_cuda_module_probe");
    if (!probe) {
        snprintf(s_status, sizeof s_status,
                 "no CUDA devices: %s lacks tp_cuda_module_probe",
                 TP_CUDA_MODULE_NAME);
        return;
    }
    char msg[400] = "";
    int count = 0;
    if (probe(&count, msg, sizeof msg) != 0 || count <= 0) {
        snprintf(s_status, sizeof s_status, "no CUDA devices: %s",
                 msg[0] ? msg : "none found");
        s_count = 0;
        return;
    }
    s_count = count;
    snprintf(s_status, sizeof s_status, "%d CUDA device%s: %s", count,
             count == 1 ? "" : "s", msg);
}

int tp_cuda_device_count(void) {
    pthread_once(&s_once, s_probe);
    return s_count;
}

const char *tp_cuda_status(void) {
    pthread_once(&s_once, s_probe);
    return s_status;
}

int tp_cuda_module_loaded(void) { return __atomic_load_n(&s_loaded, __ATOMIC_ACQUIRE); }

void *tp_cuda_module(void) {
    pthread_once(&s_once, s_probe);
    return s_module;
}

int tp_cuda_probe_isolated(char *status, size_t size) {
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(status, size, "no CUDA devices: cannot probe (pipe failed)");
        return 0;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        snprintf(status, size, "no CUDA devices: cannot probe (fork failed)");
        return 0;
    }
    if (pid == 0) {
        close(fds[0]);
        char buf[600];
        int n = tp_cuda_device_count();
        int len = snprintf(buf, sizeof buf, "%d %s", n, tp_cuda_status());
        ssize_t w = write(fds[1], buf, (size_t)(len > 0 ? len : 0));
        (void)w;
        _exit(0);
    }
    close(fds[1]);
    char buf[600] = "";
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 &&
           (r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    int count = 0;
    int off = 0;
    if (sscanf(buf, "%d %n", &count, &off) < 1) {
        snprintf(status, size, "no CUDA devices: the probe process failed");
        return 0;
    }
    snprintf(status, size, "%s", buf + off);
    return count;
}

/* ---- backends ----------------------------------------------------------- */

/* The module's constructor: fills err[size] on failure. */
typedef tp_backend_t *(*s_backend_new_fn)(const tp_cuda_options_t *opt,
                                          char *err, size_t size);

tp_cuda_options_t tp_cuda_options_default(void) {
    tp_cuda_options_t o = {0, 0, 0, 0};
    const char *tf32 = getenv("TP_CUDA_TF32"), *bf16 = getenv("TP_CUDA_BF16");
    o.tf32 = tf32 && *tf32 && strcmp(tf32, "0") != 0;
    o.bf16 = bf16 && *bf16 && strcmp(bf16, "0") != 0;
    return o;
}

tp_backend_t *tp_backend_cuda_new(const tp_cuda_options_t *opt) {
    tp_cuda_options_t o = opt ? *opt : tp_cuda_options_default();
    int n = tp_cuda_device_count();
    if (n <= 0) {
        tp_error(TP_ERR_UNSUPPORTED, "CUDA backend: %s", tp_cuda_status());
        return NULL;
    }
    if (o.device < 0 || o.device >= n) {
        tp_error(TP_ERR_INVALID, "CUDA backend: device %d of %d (%s)",
                 o.device, n, tp_cuda_status());
        return NULL;
    }
    s_backend_new_fn fn =
        (s_backend_new_fn)dlsym(s_module, "tp_cuda_module_backend_new");
    if (!fn) {
        tp_error(TP_ERR_UNSUPPORTED, "CUDA backend: %s lacks "
                 "tp_cuda_module_backend_new (an older module?)",
                 TP_CUDA_MODULE_NAME);
        return NULL;
    }
    char err[512] = "";
    tp_backend_t *b = fn(&o, err, sizeof err);
    if (!b)
        tp_error(TP_ERR_DEVICE, "CUDA backend on device %d: %s", o.device,
                 err[0] ? err : "failed to start");
    return b;
}

tp_backend_t *tp_backend_default_new(int cpu_threads) {
    if (tp_cuda_device_count() > 0) {
        tp_backend_t *b = tp_backend_cuda_new(NULL);
        if (b)
            return b;
        TP_WARN("%s; running on the CPU", tp_last_error());
    } else {
        TP_INFO("%s; running on the CPU", tp_cuda_status());
    }
    return tp_backend_cpu_new(cpu_threads);
}

/* Any backend, through its table (moved here from gpu/cpu/backend_cpu.c:
 * it serves every backend, not only the CPU's). */
void tp_backend_destroy(tp_backend_t **b_p) {
    if (!b_p || !*b_p)
        return;
    tp_backend_t *b = *b_p;
    *b_p = NULL;
    b->ops->destroy(b);
}

const char *tp_backend_name(const tp_backend_t *b) { return b->ops->name; }

int tp_backend_device(const tp_backend_t *b) { return b->device; }

void *tp_backend_alloc(tp_backend_t *b, size_t bytes) { return b->ops->alloc(b, bytes); }

void tp_backend_free(tp_backend_t *b, void *ptr) { b->ops->free(b, ptr); }

tp_status_t tp_backend_copy(tp_backend_t *b, void *dst, const void *src,
                            size_t bytes) {
    if (!b)
        return tp_error(TP_ERR_INVALID, "copy: no backend");
    /* D2H: the kind that makes the copy complete on return whichever way
     * it goes (the CUDA backend reads the direction from the pointers) */
    return b->ops->copy(b, NULL, dst, src, bytes, TP_COPY_D2H);
}

tp_stream_t *tp_backend_stream_new(tp_backend_t *b) { return b->ops->stream_new(b); }

void tp_backend_stream_destroy(tp_backend_t *b, tp_stream_t *s) {
    b->ops->stream_destroy(b, s);
}

tp_status_t tp_backend_stream_sync(tp_backend_t *b, tp_stream_t *s) {
    return b->ops->stream_sync(b, s);
}

tp_status_t tp_backend_fill(tp_backend_t *b, tp_stream_t *s, float *dst,
                            float value, size_t count) {
    return b->ops->fill(b, s, dst, value, count);
}

tp_status_t tp_backend_gemm(tp_backend_t *b, tp_stream_t *s, int trans_a,
                            int trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *bm, int ldb,
                            float beta, float *c, int ldc) {
    return b->ops->gemm(b, s, trans_a, trans_b, m, n, k, alpha, a, lda, bm,
                        ldb, beta, c, ldc);
}
