/* towerpack: which compute devices answer.
 *
 * The CUDA backend is a separate module (libtowerpack_cuda.so) loaded on
 * first use. No module, no driver or no device all mean "no CUDA devices":
 * the CPU backend runs, and nothing crashes. */
#ifndef TOWERPACK_DEVICE_H
#define TOWERPACK_DEVICE_H

#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices that answer; 0 when none do, for any reason. */
int tp_cuda_device_count(void);

/* One line saying why there are or are not CUDA devices, e.g. "no CUDA
 * devices: CUDA driver version is insufficient for CUDA runtime version". */
const char *tp_cuda_status(void);

/* The loaded CUDA module's handle (dlopen), or NULL when none loaded. */
void *tp_cuda_module(void);

#ifdef __cplusplus
}
#endif
#endif
