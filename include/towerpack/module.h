/* towerpack: finding and loading an optional module (the CUDA backend,
 * libtowerpack_cuda.so; the MPI glue, libtowerpack_mpi.so).
 *
 * Optional modules are shared objects that libtowerpack dlopens at run time,
 * so that the library itself never links CUDA or libmpi. Every module is
 * looked for the same way, written once here (core/module.c). */
#ifndef TOWERPACK_MODULE_H
#define TOWERPACK_MODULE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* tp_module_open flags. */
enum {
    /* RTLD_GLOBAL instead of RTLD_LOCAL: the module's own plugins resolve
     * its libraries' symbols through the global scope (Open MPI's do). */
    TP_MODULE_GLOBAL = 1,
};

/* dlopen the module file `name` (e.g. "libtowerpack_mpi.so"), looking, in
 * order: at the path in $`env_var` when it is set (only there); next to the
 * library or program that holds towerpack, then in ../lib and
 * ../lib/x86_64-linux-gnu from there (build and install trees alike); then
 * by name through the loader's path. `what` names the module in debug logs
 * ("CUDA", "MPI"). Returns the handle, or NULL with why[size] (may be NULL)
 * holding the most telling dlopen error. Never dlclose'd by towerpack. */
void *tp_module_open(const char *what, const char *name, const char *env_var,
                     int flags, char *why, size_t size);

#ifdef __cplusplus
}
#endif
#endif
