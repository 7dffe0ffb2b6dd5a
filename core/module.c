/* towerpack core: the one loader of optional modules (see module.h). It
 * used to be written twice, in gpu/device.c (CUDA) and pipeline/dist.c
 * (MPI); the search order is the union of both. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/log.h>
#include <towerpack/module.h>

static void *s_try(const char *what, const char *path, int flags, char *why,
                   size_t size) {
    void *h = dlopen(path, RTLD_NOW |
                               (flags & TP_MODULE_GLOBAL ? RTLD_GLOBAL : RTLD_LOCAL));
    if (!h) {
        const char *e = dlerror();
        TP_DEBUG("%s module %s: %s", what, path, e ? e : "?");
        /* keep the first error, unless a later one says more than "not
         * there" (a module found but unloadable is the news) */
        if (why && size && (why[0] == '\0' || !strstr(e ? e : "", "No such file")))
            snprintf(why, size, "%s", e ? e : path);
    }
    return h;
}

void *tp_module_open(const char *what, const char *name, const char *env_var,
                     int flags, char *why, size_t size) {
    if (why && size)
        why[0] = '\0';
    const char *env = env_var ? getenv(env_var) : NULL;
    if (env && *env)
        return s_try(what, env, flags, why, size);
    /* The object holding this code: libtowerpack.so, or the program itself
     * when linked statically (dladdr then gives no usable path). */
    char dir[PATH_MAX] = "";
    Dl_info info;
    if (dladdr((void *)tp_module_open, &info) && info.dli_fname &&
        strchr(info.dli_fname, '/'))
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
    else {
        ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
        dir[n > 0 ? n : 0] = '\0';
    }
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        static const char *const rel[] = {"", "/../lib", "/../lib/x86_64-linux-gnu"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char path[PATH_MAX + 96];
            snprintf(path, sizeof path, "%s%s/%s", dir, rel[i], name);
            void *h = s_try(what, path, flags, why, size);
            if (h)
                return h;
        }
    }
    return s_try(what, name, flags, why, size);
}
