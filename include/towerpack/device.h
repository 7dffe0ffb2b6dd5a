/* towerpack: which compute devices answer.
 *
 * The CUDA backend is a separate module (libtowerpack_cuda.so) loaded on
 * first use. No module, no driver or no device all mean "no CUDA devices":
 * the CPU backend runs, and nothing crashes. */
#ifndef TOWERPACK_DEVICE_H
#define TOWERPACK_DEVICE_H

#include <stddef.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices that answer; 0 when none do, for any reason. */
int tp_cuda_device_count(void);

/* One line saying why there are or are not CUDA devices, e.g. "no CUDA
 * devices: CUDA driver version is insufficient for CUDA runtime version". */
const char *tp_cuda_status(void);

/* The same question asked in a short-lived child process, so that this
 * process loads no CUDA (it may still fork dataflow workers afterwards).
 * Returns the device count and writes the status line to status[size]. */
int tp_cuda_probe_isolated(char *status, size_t size);

/* 1 when this process has loaded the CUDA module (asks nothing, loads
 * nothing: for the fork rule's check). */
int tp_cuda_module_loaded(void);

/* The loaded CUDA module's handle (dlopen), or NULL when none loaded. */
void *tp_cuda_module(void);

#ifdef __cplusplus
}
#endif
#endif
