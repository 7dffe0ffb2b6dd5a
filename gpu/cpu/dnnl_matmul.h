/* towerpack gpu: the dense layer's matmul (TP_OP_MATMUL: x[N,K...] @ W[K,M],
 * a folded bias [M] and relu) on oneDNN's matmul primitive for the CPU
 * backend: the forward with the bias and the relu as the primitive's own
 * bias and eltwise post-op, and the backward's two products (dW = x^T dy,
 * dX = dy W^T, a sum post-op where the gradient accumulates) on the op's
 * plain row-major buffers, transposes as strides. oneDNN's AVX-512 brgemm
 * measured 10% faster than OpenBLAS's sgemm on the MLP's shapes
 * (docs/performance.md, "The MLP step on oneDNN's matmul");
 * TP_CPU_MATMUL=dnnl|own chooses either in one binary; TP_CPU_GEMM=own
 * runs the oneDNN products on our GEMM (cpu_gemm.h) instead, B packed in
 * the workspace (A/B only: slower than oneDNN on the GPT's products,
 * docs/performance.md, branch gpt20). Runs only where the backend has its
 * oneDNN cache (as the pooling's, dnnl_ops.h). */
#ifndef TOWERPACK_GPU_DNNL_MATMUL_H
#define TOWERPACK_GPU_DNNL_MATMUL_H

#include <stddef.h>
#include <towerpack/backend.h>
#include "gpu/backend_impl.h"

/* Workspace bytes (oneDNN's scratchpads) of a matmul call on oneDNN, its
 * primitives made here; 0 where ops_cpu.c's OpenBLAS path runs it. */
size_t tp_dnnl_matmul_workspace(const tp_op_call_t *c);

/* The call on oneDNN, *done 1; *done 0: ops_cpu.c runs it (TP_CPU_MATMUL=own,
 * a workspace smaller than the primitive's scratchpad). The forward applies
 * c->bias and a folded relu (c->attr->act); the backward writes dx[1] and
 * dx[0] (those not NULL, adding where dx_acc says) and leaves dbias to the
 * caller. */
tp_status_t tp_dnnl_matmul_forward(const tp_op_call_t *c, int *done);
tp_status_t tp_dnnl_matmul_backward(const tp_op_call_t *c, int *done);

/* batch_matmul's batched product (ops_linalg.c): y[nb,m,n] = (acc: +=)
 * op(a) op(b), a stored [nb,m,k] or (ta) [nb,k,m], b [nb,k,n] or (tb)
 * [nb,n,k], every batch contiguous. */
typedef struct {
    int64_t nb, m, n, k;
    int ta, tb, acc;
} tp_dnnl_bmm_t;

/* Its scratchpad's bytes (the primitive made here); 0 on OpenBLAS's path. */
size_t tp_dnnl_bmm_workspace(const tp_op_call_t *c, const tp_dnnl_bmm_t *p);

/* The product on oneDNN, *done 1; *done 0: the caller runs it
 * (TP_CPU_MATMUL=own, no primitive, a workspace short of its scratchpad).
 * c gives the name, the workspace and its bytes. */
tp_status_t tp_dnnl_bmm(const tp_op_call_t *c, const tp_dnnl_bmm_t *p, const float *a,
                        const float *b, float *y, int *done);

#endif
