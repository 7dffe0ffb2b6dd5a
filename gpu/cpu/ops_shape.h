/* towerpack gpu: the CPU kernels of the shape family (docs/ops.md):
 * transpose, slice, concat along any axis, pad, broadcast_to, gather rows
 * and one-hot. ops_cpu.c's dispatch calls these for the kinds
 * tp_cpu_shape_kind accepts. Values move as 4-byte words (float32 or
 * int32 alike); gradients are float32. */
#ifndef TOWERPACK_GPU_OPS_SHAPE_H
#define TOWERPACK_GPU_OPS_SHAPE_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* 1 when `kind` is one of this family's. */
int tp_cpu_shape_kind(tp_op_kind_t kind);
/* Forward and backward of such a call at its run shapes (dx_acc
 * honoured). Gather and one-hot fail on an index out of range, naming the
 * node, the index and the bound. */
tp_status_t tp_cpu_shape_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_shape_backward(const tp_op_call_t *c);

#endif
