/* towerpack gpu: the CPU kernels of batched matmul (docs/ops.md, the linalg
 * family): a[...,M,K] @ b[...,K,N] with NumPy-broadcast batch dims and
 * either operand stored transposed. ops_cpu.c's dispatch calls these for
 * TP_OP_BATCH_MATMUL. */
#ifndef TOWERPACK_GPU_OPS_LINALG_H
#define TOWERPACK_GPU_OPS_LINALG_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* Forward (y = op(a) @ op(b) per batch) and backward (each operand's
 * gradient where asked, summed over the batches it was broadcast to,
 * dx_acc honoured). dnnl 1: the backend has oneDNN, and one stacked
 * [R,K] @ [K,N] product runs on its matmul (dnnl_matmul.c) where the
 * workspace holds its scratchpad; OpenBLAS's sgemm otherwise. Folds
 * (gpu/graph/fold.c): c->bias [N] added to every row of y (its gradient
 * into c->dbias), and attr.act TP_ACT_GELU / TP_ACT_GELU_TANH applied
 * after it, the pre-activation kept in the act's room at the start of
 * the workspace (tp_act_room) from the forward to the backward. */
tp_status_t tp_cpu_batch_matmul_forward(const tp_op_call_t *c, int dnnl);
tp_status_t tp_cpu_batch_matmul_backward(const tp_op_call_t *c, int dnnl);

/* Workspace bytes of the call: oneDNN's scratchpad where it runs it. */
size_t tp_cpu_batch_matmul_workspace(const tp_op_call_t *c, int dnnl);

#endif
