/* towerpack gpu: the CPU kernels of the elementwise family (docs/ops.md):
 * the binary ops with NumPy broadcasting (add, sub, mul, div, maximum,
 * minimum), the unary ops and activations, constants and stop_gradient.
 * ops_cpu.c's dispatch calls these for the kinds tp_cpu_elementwise_kind
 * accepts. */
#ifndef TOWERPACK_GPU_OPS_ELEMENTWISE_H
#define TOWERPACK_GPU_OPS_ELEMENTWISE_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* 1 when `kind` is one of this family's. */
int tp_cpu_elementwise_kind(tp_op_kind_t kind);
/* Forward and backward of such a call (dx_acc honoured, a broadcast
 * operand's gradient summed over its stretched dims). */
tp_status_t tp_cpu_elementwise_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_elementwise_backward(const tp_op_call_t *c);

/* Test-only: a factor the backward multiplies every gradient it writes
 * by (1 normally). The gradient checks set it to show that they catch a
 * wrong gradient; nothing else may. */
extern float tp_cpu_elementwise_grad_fault;

#endif
