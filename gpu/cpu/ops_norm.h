/* towerpack gpu: the CPU kernels of layer, group and instance norm
 * (docs/ops.md, the linalg family), and of batch norm on plain NCHW.
 * ops_cpu.c's dispatch calls these for the kinds tp_cpu_norm_kind
 * accepts, and for a batch norm oneDNN's blocked kernel does not take. */
#ifndef TOWERPACK_GPU_OPS_NORM_H
#define TOWERPACK_GPU_OPS_NORM_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* 1 when `kind` is layer, group or instance norm. */
int tp_cpu_norm_kind(tp_op_kind_t kind);
/* Workspace bytes: each row's mean and 1/std, written by the forward for
 * the backward, then the backward's partial sums of the parameters'
 * gradients per block of rows (optional: with less the backward
 * allocates its own and recomputes the statistics from x). */
size_t tp_cpu_norm_workspace(const tp_op_call_t *c);
/* Forward, and backward of x, gamma and beta where asked (dx_acc
 * honoured). */
tp_status_t tp_cpu_norm_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_norm_backward(const tp_op_call_t *c);

/* Batch norm on plain NCHW (ops_cpu.c's path when oneDNN's does not take
 * the call): the workspace is [mean C][1/std C], written by the forward
 * (the batch's statistics in training, the moving averages otherwise,
 * which training with update_state also updates) and read by the
 * backward. A folded relu (attr.act) is applied by the forward. Channels
 * run over the pool; the bits do not depend on the thread count. */
tp_status_t tp_cpu_bnorm_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_bnorm_backward(const tp_op_call_t *c);

#endif
