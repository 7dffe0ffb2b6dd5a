/* towerpack gpu: finding the CUDA backend module and asking it for devices.
 *
 * The module is looked up, in order: $TP_CUDA_MODULE (a path), next to the
 * library or program that contains this code, in ../lib from there (build
 * tree and install tree alike), then by name through the loader's path. */
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

#ifndef TP_CUDA_MODULE_NAME
#define TP_CUDA_MODULE_NAME "libtowerpack_cuda.so"
#endif

static pthread_once_t s_once = PTHREAD_ONCE_INIT;
static volatile int s_loaded;  /* set once the module is dlopen'ed here */
static void *s_module;
static int s_count;
static char s_status[512];

typedef int (*s_probe_fn)(int *count, char *msg, size_t size);

static void *s_try(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        TP_DEBUG("cuda module %s: %s", path, dlerror());
    return h;
}

static void *s_find_module(void) {
    const char *env = getenv("TP_CUDA_MODULE");
    if (env && *env)
        return s_try(env);
    /* The object holding this code: libtowerpack.so, or the program itself
     * when linked statically (dladdr then gives no usable path). */
    char dir[PATH_MAX] = "";
    Dl_info info;
    if (dladdr((void *)s_find_module, &info) && info.dli_fname &&
        strchr(info.dli_fname, '/'))
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
    else {
        ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
        dir[n > 0 ? n : 0] = '\0';
    }
    if (dir[0]) {
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            char path[PATH_MAX + 64];
            snprintf(path, sizeof path, "%s/%s", dir, TP_CUDA_MODULE_NAME);
            void *h = s_try(path);
            if (h)
                return h;
            snprintf(path, sizeof path, "%s/../lib/%s", dir,
                     TP_CUDA_MODULE_NAME);
            if ((h = s_try(path)))
                return h;
        }
    }
    return s_try(TP_CUDA_MODULE_NAME);
}

static void s_probe(void) {
    if (getenv("TP_NO_CUDA")) {
        snprintf(s_status, sizeof s_status, "no CUDA devices: TP_NO_CUDA is set");
        return;
    }
    s_module = s_find_module();
    s_loaded = s_module != NULL;
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
    tp_cuda_options_t o = {0, 0, 0};
    const char *tf32 = getenv("TP_CUDA_TF32");
    o.tf32 = tf32 && *tf32 && strcmp(tf32, "0") != 0;
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
