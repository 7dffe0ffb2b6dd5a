/* towerpack gpu: the CPU kernel of fused attention (docs/ops.md,
 * TP_OP_ATTENTION). ops_cpu.c's dispatch calls these. */
#ifndef TOWERPACK_GPU_OPS_ATTENTION_H
#define TOWERPACK_GPU_OPS_ATTENTION_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* Workspace bytes: each query row's log-sum-exp (written by the forward,
 * read by the backward), each row's dO.O (backward) and every (batch,
 * head)'s tile scratch, at the call's shapes. */
size_t tp_cpu_attention_workspace(const tp_op_call_t *c);
/* Forward: y and the log-sum-exps into the workspace (which must hold
 * tp_cpu_attention_workspace bytes). */
tp_status_t tp_cpu_attention_forward(const tp_op_call_t *c);
/* Backward of q, k and v where asked (dx_acc honoured), from the
 * forward's y and log-sum-exps; the scores are recomputed tile by tile. */
tp_status_t tp_cpu_attention_backward(const tp_op_call_t *c);

#endif
