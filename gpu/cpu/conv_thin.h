/* towerpack gpu: the CPU backend's thin convolutions: conv2d with one
 * input channel (the autoencoder's enc1, the CNN's conv1) and
 * conv2d_transpose with one output channel (the autoencoder's dec2), where
 * oneDNN does worst (issues 42 and 49). Both are the convolution A from a
 * one-channel plane to O channels; each image runs alone on one thread of
 * the team (its [kh*kw, oh*ow] column matrix stays in L1), and the filter's
 * and bias's gradients are summed per fixed group of 8 images, then over
 * the groups in order, so the bits do not depend on the thread count. */
#ifndef TOWERPACK_GPU_CONV_THIN_H
#define TOWERPACK_GPU_CONV_THIN_H

#include "gpu/backend_impl.h"

/* 1 when this file runs call c: conv2d with one input channel or
 * conv2d_transpose with one output channel, one group, NCHW operands
 * (conv2d's y and dy may be nChw16c, TP_BLK16_Y, with 16k channels: the
 * CNN's first layer in the oneDNN chain), float32. TP_CONV_THIN=0 turns it off (oneDNN runs them, for
 * comparison). */
int tp_conv_thin_ok(const tp_op_call_t *c);

/* Forward (bias and a folded relu applied) and backward (dx_acc honoured,
 * dy masked already by the caller when a relu is folded) of such a call.
 * They need no workspace. TP_ERR_NOMEM when a scratch buffer cannot be
 * had. */
tp_status_t tp_conv_thin_forward(const tp_op_call_t *c);
tp_status_t tp_conv_thin_backward(const tp_op_call_t *c);

/* A conv2d's backward with a folded relu (attr.act), dy unmasked: dy is
 * masked by y > 0 as the passes read it (the act's room of the workspace
 * is not used). */
tp_status_t tp_conv_thin_backward_relu(const tp_op_call_t *c);

#endif
