/* towerpack gpu: the CPU kernels, called by the CPU backend's vtable. */
#ifndef TOWERPACK_GPU_OPS_CPU_H
#define TOWERPACK_GPU_OPS_CPU_H

#include <towerpack/backend.h>
#include "gpu/backend_impl.h"
#include "gpu/cpu/dnnl_conv.h"

/* The kernels' gradient store: dst = expr (acc 0) or dst += expr (acc
 * 1), for i over [0, n). n is read once: an n that calls a function
 * (tp_shape_count, through the PLT) would otherwise run per element and
 * keep the loop from vectorising (the L2 decay's backward over ResNet-18's
 * 11M weights: 43 ms of an 800 ms step). */
#define GRAD_STORE(dst, acc, n, expr)                                        \
    do {                                                                     \
        const size_t n_ = (n);                                               \
        if (acc) {                                                           \
            for (size_t i_ = 0; i_ < n_; i_++) {                             \
                size_t i = i_;                                               \
                (dst)[i] += (expr);                                          \
            }                                                                \
        } else {                                                             \
            for (size_t i_ = 0; i_ < n_; i_++) {                             \
                size_t i = i_;                                               \
                (dst)[i] = (expr);                                           \
            }                                                                \
        }                                                                    \
    } while (0)

/* `dnnl`: the backend's oneDNN convolutions (dnnl_conv.h), NULL for the
 * im2col path (TP_CPU_CONV=im2col). */
size_t tp_cpu_op_workspace(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c);
tp_status_t tp_cpu_op_forward(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c);
tp_status_t tp_cpu_op_backward(tp_dnnl_conv_t *dnnl, const tp_op_call_t *c);

#endif
