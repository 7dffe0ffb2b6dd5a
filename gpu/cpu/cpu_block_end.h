/* towerpack gpu: the ResNet block end in one call on the CPU backend
 * (cpu_block_end.c): batch norm calls that carry a skip
 * (tp_op_call_t.skip, planned by gpu/graph/fold.c's tp_plan_block_end_). */
#ifndef TOWERPACK_GPU_CPU_BLOCK_END_H
#define TOWERPACK_GPU_CPU_BLOCK_END_H

#include "gpu/backend_impl.h"

/* The size from which the output goes out in streaming stores: the L2 of
 * one core on the hosts measured (a smaller tensor may still be in cache
 * for the op that reads it next). */
#define TP_CPU_BLOCK_END_STREAM_MIN ((size_t)2 << 20)

/* Workspace bytes of such a call: [mean C][1/std C]. */
size_t tp_cpu_block_end_workspace(const tp_op_call_t *c);
/* y = act(bn(x) + skip), the batch's statistics (training, the moving
 * averages updated) or the moving averages. */
tp_status_t tp_cpu_block_end_forward(const tp_op_call_t *c);
/* dskip, dx, dgamma, dbeta from dy (masked by y > 0 for a relu), after a
 * training forward of the same call. */
tp_status_t tp_cpu_block_end_backward(const tp_op_call_t *c);
/* 1 when call c writes its output `out` (y forward, dx[0] backward) in
 * non-temporal stores: nChw16c on AVX-512, out 64-byte aligned and
 * stored (not added), the tensor TP_CPU_BLOCK_END_STREAM_MIN bytes or
 * more, TP_CPU_BLOCK_END_STREAM not "0". */
int tp_cpu_block_end_streams(const tp_op_call_t *c, const float *out, int added);

#endif
