/* towerpack gpu: the CPU kernels of the reduce family (docs/ops.md): sum,
 * mean and max over a set of axes, argmax along one axis, softmax and
 * log-softmax along one axis, softmax cross-entropy over a sequence with an
 * ignore label, and top-k accuracy. ops_cpu.c's dispatch calls these for
 * the kinds tp_cpu_reduce_kind accepts. */
#ifndef TOWERPACK_GPU_OPS_REDUCE_H
#define TOWERPACK_GPU_OPS_REDUCE_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* 1 when `kind` is one of this family's. */
int tp_cpu_reduce_kind(tp_op_kind_t kind);
/* Bytes of workspace such a call needs (kept from forward to backward). */
size_t tp_cpu_reduce_workspace(const tp_op_call_t *c);
/* Forward and backward of such a call (dx_acc honoured). Argmax and top-k
 * accuracy have no backward (the graph never asks; it writes nothing). */
tp_status_t tp_cpu_reduce_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_reduce_backward(const tp_op_call_t *c);

#endif
