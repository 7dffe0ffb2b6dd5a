/* towerpack gpu: the CPU kernels of the loss family (docs/ops.md): mean
 * squared error, L1, Huber and sigmoid cross-entropy with logits, each the
 * mean over every element of two same-shape inputs. ops_cpu.c's dispatch
 * calls these for the kinds tp_cpu_loss_kind accepts. */
#ifndef TOWERPACK_GPU_OPS_LOSS_H
#define TOWERPACK_GPU_OPS_LOSS_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* 1 when `kind` is one of this family's. */
int tp_cpu_loss_kind(tp_op_kind_t kind);
/* Forward (the scalar mean) and backward (both inputs' gradients where
 * asked, dx_acc honoured) of such a call. */
tp_status_t tp_cpu_loss_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_loss_backward(const tp_op_call_t *c);

#endif
