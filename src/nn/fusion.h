/* Executor fusions: runs of consecutive layers that the executor runs as one kernel, as rows of a table. */
#ifndef DT_NN_FUSION_H
#define DT_NN_FUSION_H

#include "dtrain/model_ctx.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

#define DT_FUSION_MAX_LAYERS 4

/* A fused group of n layers l[0..n-1] (consecutive in the model), io[k] the
 * io of layer l[k], act[k] the input of l[k] and act[n] the group's output
 * (batch, numel each). Only act[0] and act[n] are real activations: the
 * intermediate act[1..n-1] are not computed, and their slots are the group's
 * to carry values from forward to backward, as are the layers' workspaces.
 * forward writes act[n]; backward takes the gradient of act[n], writes dinp
 * (that of act[0]; NULL to skip) and accumulates every layer's parameter
 * gradients. Results must equal the layers run one by one. */
typedef struct dt_fusion {
  const char *name; /* "BatchNorm2d+ReLU+MaxPool2d(2)" */
  int n_layers;
  const dt_layer_ops *kinds[DT_FUSION_MAX_LAYERS]; /* the pattern: kinds of l[0..n-1] */
  int (*applies)(const dt_layer *l); /* beyond the kinds: hyper-parameters, shapes */
  dt_status (*forward)(const dt_layer *l, const dt_layer_io *io, float *const *act);
  void (*backward)(const dt_layer *l, const dt_layer_io *io, float *const *act, const float *dout, float *dinp);
  int at_start; /* 1: only where no earlier layer has parameters (backward wants its input gradient only if asked) */
} dt_fusion;

/* Matches the table against layers[0..n-1] first to last (a row with at_start
 * only before the first layer with parameters), a matched group
 * taking its layers out of later matches: group[i] is the fusion of the group
 * that starts at layer i (NULL if none) and first[i] the first layer of the
 * group that ends at layer i (i if none). */
void dt_fusion_plan(const dt_layer *layers, int n, const dt_fusion **group, int *first);

/* Executor fusions (on by default); off runs every layer on its own, for tests of the fused paths. */
void dt_model_ctx_set_fusion(dt_model_ctx *c, int on);

/* ---- what the rows are made of (implemented by the layer files) ---- */
int dt_activation_is_relu(const dt_layer *l);
int dt_maxpool2d_is_2x2(const dt_layer *l); /* MaxPool2d(2, stride 2, padding 0) */

/* BatchNorm2d -> ReLU -> MaxPool2d(2) in one kernel (the BN and ReLU outputs are not materialised). forward
 * reads the BN layer's io and writes the pool's output, argmax (batch, C, OH, OW) and xsel (the pool's output
 * size; the normalised input at the argmax, for backward); backward takes the pool's output gradient and
 * writes the BN input gradient (dinp NULL to skip) and the BN parameter gradients. */
dt_status dt_bn_relu_pool_forward(const dt_layer *bn, const dt_layer_io *io, int32_t *argmax, float *xsel,
                                  const float *in, float *out);
void dt_bn_relu_pool_backward(const dt_layer *bn, const dt_layer_io *io, const int32_t *argmax, const float *xsel,
                              const float *in, const float *out, const float *dout, float *dinp);

/* What the fused BatchNorm2d -> ReLU -> MaxPool2d(2)'s training forward saved (the arguments as its backward's),
 * for kernels that make its input gradient a plane at a time; and where its parameter gradients go. */
void dt_bn_relu_pool_saved_of(const dt_layer *bn, const dt_layer_io *io, const int32_t *argmax, const float *xsel,
                              const float *in, const float *out, dt_bn_pool_saved *s, float **dgamma, float **dbeta);

/* Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d(2) (the layers l[0..3], act and io as in dt_fusion): the forward
 * is the convolution's, then the fused BN-pool's into the group's slots. Where dinp is not wanted (the row matches
 * a network's first layer only), f32, the convolution's weight gradient is the direct 3x3 kernel's and the work fits
 * act[3]'s slot (the ReLU's output, not otherwise used; too small for fewer than about 4 channels), the backward
 * makes the convolution's output gradient a block at a time where its weight and bias gradients consume it
 * (dt_conv_bn_pool_backward); otherwise, the BN-pool's backward into that slot, then the convolution's. */
int dt_conv2d_is_3x3_same(const dt_layer *l); /* kernel 3, stride 1, padding 1 */
dt_status dt_conv_bn_pool_forward(const dt_layer *l, const dt_layer_io *io, float *const *act);
void dt_conv_bn_pool_fused_backward(const dt_layer *l, const dt_layer_io *io, float *const *act, const float *dout,
                                    float *dinp);

/* BatchNorm2d -> ReLU in one kernel (the BN output is not materialised): forward reads the BN layer's io and
 * writes the ReLU output; backward takes the ReLU output and its gradient and writes the BN input gradient
 * (dinp NULL to skip) and the BN parameter gradients. */
dt_status dt_bn_relu_fused_forward(const dt_layer *bn, const dt_layer_io *io, const float *in, float *out);
void dt_bn_relu_fused_backward(const dt_layer *bn, const dt_layer_io *io, const float *in, const float *out,
                               const float *dout, float *dinp);

/* A residual end -> ReLU in one pass (the sum is not materialised): forward writes relu(in + the skip); backward
 * takes the ReLU output and its gradient and sends the masked gradient to the branch (dinp, NULL to skip) and to
 * the skip (the partner's workspace), as the end does. */
dt_status dt_residual_relu_forward(const dt_layer *end, const dt_layer_io *io, const float *in, float *out);
void dt_residual_relu_backward(const dt_layer *end, const dt_layer_io *io, const float *out, const float *dout,
                               float *dinp);

#endif
