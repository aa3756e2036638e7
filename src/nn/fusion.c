/* The table of executor fusions and the plan that matches it against a model's layers. */
#include "nn/fusion.h"

/* ---- BatchNorm2d -> ReLU -> MaxPool2d(2) ---------------------------------------- */

static int bn_relu_pool_applies(const dt_layer *l) {
  return dt_activation_is_relu(&l[1]) && dt_maxpool2d_is_2x2(&l[2]) && l[1].in_numel == l[0].out_numel &&
         l[2].in_numel == l[1].out_numel;
}

/* The pool's workspace holds the argmax, as the pool layer's own would; the BN output slot holds xsel. */
static dt_status bn_relu_pool_forward(const dt_layer *l, const dt_layer_io *io, float *const *act) {
  return dt_bn_relu_pool_forward(&l[0], &io[0], io[2].ws, act[1], act[0], act[3]);
}

static void bn_relu_pool_backward(const dt_layer *l, const dt_layer_io *io, float *const *act, const float *dout,
                                  float *dinp) {
  dt_bn_relu_pool_backward(&l[0], &io[0], io[2].ws, act[1], act[0], act[3], dout, dinp);
}

/* ---- Conv2d(3x3) -> BatchNorm2d -> ReLU -> MaxPool2d(2) (fashioncnn's first layer) --- */

static int conv_bn_relu_pool_applies(const dt_layer *l) {
  return dt_conv2d_is_3x3_same(&l[0]) && l[1].in_numel == l[0].out_numel && bn_relu_pool_applies(&l[1]);
}

/* ---- BatchNorm2d -> ReLU (every ResNet block's first half, and the stem) ----------- */

/* The second of two layers is a ReLU over the whole output of the first (also the residual end's row). */
static int relu_follows(const dt_layer *l) {
  return dt_activation_is_relu(&l[1]) && l[1].in_numel == l[0].out_numel;
}

static dt_status bn_relu_forward(const dt_layer *l, const dt_layer_io *io, float *const *act) {
  return dt_bn_relu_fused_forward(&l[0], &io[0], act[0], act[2]);
}

static void bn_relu_backward(const dt_layer *l, const dt_layer_io *io, float *const *act, const float *dout,
                             float *dinp) {
  dt_bn_relu_fused_backward(&l[0], &io[0], act[0], act[2], dout, dinp);
}

/* ---- residual end -> ReLU (every ResNet block's output) ---------------------------- */

static dt_status end_relu_forward(const dt_layer *l, const dt_layer_io *io, float *const *act) {
  return dt_residual_relu_forward(&l[0], &io[0], act[0], act[2]);
}

static void end_relu_backward(const dt_layer *l, const dt_layer_io *io, float *const *act, const float *dout,
                              float *dinp) {
  dt_residual_relu_backward(&l[0], &io[0], act[2], dout, dinp);
}

/* ---- the table ------------------------------------------------------------------ */

static const dt_fusion fusions[] = {
    {"Conv2d(3x3)+BatchNorm2d+ReLU+MaxPool2d(2)", 4,
     {&dt_conv2d_ops, &dt_batchnorm2d_ops, &dt_activation_ops, &dt_maxpool2d_ops}, conv_bn_relu_pool_applies,
     dt_conv_bn_pool_forward, dt_conv_bn_pool_fused_backward,
     1}, /* at the start only: deeper, its input gradient is always wanted, and the group would only delay
          * BatchNorm's gradients (announced once the whole group is done) and merge the layers' trace spans */
    /* after the longer row: where no 3x3 convolution comes first, or not at the start, the three fuse */
    {"BatchNorm2d+ReLU+MaxPool2d(2)", 3, {&dt_batchnorm2d_ops, &dt_activation_ops, &dt_maxpool2d_ops},
     bn_relu_pool_applies, bn_relu_pool_forward, bn_relu_pool_backward, 0},
    /* after the longer row: where a pool follows, the three fuse */
    {"BatchNorm2d+ReLU", 2, {&dt_batchnorm2d_ops, &dt_activation_ops}, relu_follows, bn_relu_forward,
     bn_relu_backward, 0},
    {"Residual(+)+ReLU", 2, {&dt_residual_end_ops, &dt_activation_ops}, relu_follows, end_relu_forward,
     end_relu_backward, 0},
};

static int matches(const dt_fusion *f, const dt_layer *l, int avail, int at_start) {
  if (f->n_layers > avail || (f->at_start && !at_start)) return 0;
  for (int k = 0; k < f->n_layers; k++)
    if (l[k].ops != f->kinds[k]) return 0;
  return f->applies(l);
}

static const dt_fusion *fusion_at(const dt_layer *l, int avail, int at_start) {
  for (size_t r = 0; r < sizeof fusions / sizeof fusions[0]; r++)
    if (matches(&fusions[r], l, avail, at_start)) return &fusions[r];
  return NULL;
}

void dt_fusion_plan(const dt_layer *layers, int n, const dt_fusion **group, int *first) {
  for (int i = 0; i < n; i++) group[i] = NULL, first[i] = i;
  int params_before = 0; /* some layer before i has parameters */
  for (int i = 0; i < n; i++) {
    const dt_fusion *f = fusion_at(&layers[i], n - i, !params_before);
    const int last = f ? i + f->n_layers - 1 : i;
    for (int k = i; k <= last; k++) params_before |= layers[k].n_params > 0;
    if (f) group[i] = f, first[last] = i;
    i = last;
  }
}
