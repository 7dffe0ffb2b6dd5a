/* towerpack gpu: the CPU kernels, called by the CPU backend's vtable. */
#ifndef TOWERPACK_GPU_OPS_CPU_H
#define TOWERPACK_GPU_OPS_CPU_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

size_t tp_cpu_op_workspace(const tp_op_call_t *c);
tp_status_t tp_cpu_op_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_op_backward(const tp_op_call_t *c);

#endif
