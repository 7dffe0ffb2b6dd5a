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
 * dx_acc honoured). */
tp_status_t tp_cpu_batch_matmul_forward(const tp_op_call_t *c);
tp_status_t tp_cpu_batch_matmul_backward(const tp_op_call_t *c);

#endif
