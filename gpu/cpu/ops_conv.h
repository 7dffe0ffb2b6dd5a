/* towerpack gpu: the CPU kernels of the convolution family (docs/ops.md):
 * conv2d (dilation, groups), conv2d_transpose, nearest and bilinear
 * upsampling. ops_cpu.c's dispatch calls these for the kinds
 * tp_cpu_conv_kind accepts. */
#ifndef TOWERPACK_GPU_OPS_CONV_H
#define TOWERPACK_GPU_OPS_CONV_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* 1 when `kind` is one of this family's. */
int tp_cpu_conv_kind(tp_op_kind_t kind);
/* Scratch bytes of such a call at its shapes (a folded activation's room
 * not included: ops_cpu.c adds it). */
size_t tp_cpu_conv_workspace(const tp_op_call_t *c);
/* Forward, and backward (every input's gradient where asked, dx_acc
 * honoured); the backward reads what the forward left in the workspace
 * only through its arguments (nothing kept between them). */
tp_status_t tp_cpu_conv_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_conv_backward(const tp_op_call_t *c);

#endif
