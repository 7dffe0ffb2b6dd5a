/* towerpack: which compute devices answer.
 *
 * The CUDA backend is a separate module (libtowerpack_cuda.so) loaded on
 * first use. No module, no driver or no device all mean "no CUDA devices":
 * the CPU backend runs, and nothing crashes. */
#ifndef TOWERPACK_DEVICE_H
#define TOWERPACK_DEVICE_H

#include <stddef.h>
#include <towerpack/backend.h>
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

/* Options of a CUDA backend. */
typedef struct tp_cuda_options {
    int device;        /* CUDA device ordinal */
    int tf32;          /* 1: TF32 tensor cores for fp32 products and
                          convolutions; 0: exact fp32 (FMA) */
    size_t chunk_mb;   /* device memory is taken in chunks of this many MiB
                          (0: 256); plan-time only, never inside a step */
    int bf16;          /* 1: fp32 products (cuBLAS: fully connected layers,
                          tp_backend_gemm) on bf16 tensor cores, the inputs
                          rounded to bf16 (8 significant bits), fp32
                          accumulation; convolutions keep what tf32 says
                          (cuDNN has no bf16 math on fp32 tensors). 0:
                          products as tf32 says */
} tp_cuda_options_t;

/* Defaults: device 0, tf32 from $TP_CUDA_TF32 (unset: 0), chunk 256 MiB,
 * bf16 from $TP_CUDA_BF16 (unset: 0). */
tp_cuda_options_t tp_cuda_options_default(void);

/* A CUDA backend on opt->device (NULL: the defaults). Loads the module.
 * NULL with tp_last_error() saying why (no module, no driver, no device,
 * a bad ordinal, a library failing to start). Destroy with
 * tp_backend_destroy. Link the shared libtowerpack into programs that use
 * it, so the module's error messages reach this thread's tp_last_error. */
tp_backend_t *tp_backend_cuda_new(const tp_cuda_options_t *opt);

/* CUDA device 0 when one answers, else the CPU backend with `cpu_threads`
 * (see tp_backend_cpu_new) after one info line saying why. */
tp_backend_t *tp_backend_default_new(int cpu_threads);

#ifdef __cplusplus
}
#endif
#endif
