/* towerpack gpu: the CPU kernel of fused attention (docs/ops.md,
 * TP_OP_ATTENTION). ops_cpu.c's dispatch calls these. */
#ifndef TOWERPACK_GPU_OPS_ATTENTION_H
#define TOWERPACK_GPU_OPS_ATTENTION_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* Workspace bytes: each query row's log-sum-exp (written by the forward,
 * read by the backward), each row's dO.O and running max (backward),
 * every (batch, head)'s tile scratch and, while it fits in
 * tp_cpu_attention_stash_limit_ bytes, the forward's e^(score - m) of
 * every visited tile with each tile row's m, at the call's shapes. */
size_t tp_cpu_attention_workspace(const tp_op_call_t *c);
/* The most bytes of tiles a call stashes for its backward (16 MiB; past
 * it the backward recomputes them). Read by the workspace and both passes,
 * so set only between models (the tests compare the two paths). */
extern size_t tp_cpu_attention_stash_limit_;
/* Forward: y and the log-sum-exps into the workspace (which must hold
 * tp_cpu_attention_workspace bytes). */
tp_status_t tp_cpu_attention_forward(const tp_op_call_t *c);
/* Backward of q, k and v where asked (dx_acc honoured), from the
 * forward's y, log-sum-exps and stashed tiles (recomputed tile by tile
 * when not stashed, the same bits). */
tp_status_t tp_cpu_attention_backward(const tp_op_call_t *c);

#endif
