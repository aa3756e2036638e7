/* dtrain's ReLU masks for the parity dumps: during one training forward with the executor's fusions off, every ReLU
 * layer hands the mask of its output (1 where positive, else 0) to a sink, in the order the forward runs them. That
 * forward's logits must be the fused one's, bit for bit, so the masks are the fused forward's too. The PyTorch side
 * (relu_masks.py) rectifies with them: a ReLU input within rounding of zero, whose sign either side's f32 error may
 * flip, then cannot move every gradient upstream of it. Include after TOOL_NAME and tool_try.h. */
#ifndef DT_TESTS_RELU_MASKS_H
#define DT_TESTS_RELU_MASKS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "nn/fusion.h"
#include "nn/layer.h"

/* Takes mask number `index` of n values; 0, or non-zero to fail the forward. */
typedef int (*relu_mask_sink)(int index, const float *mask, size_t n);

static relu_mask_sink relu_sink;
static int relu_count;
static dt_layer_ops relu_masked;

static dt_status relu_mask_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  dt_status st = dt_activation_ops.forward(l, io, in, out);
  if (st != DT_OK || !relu_sink) return st;
  const size_t n = dt_layer_out_elems(l, io);
  float *mask = malloc(sizeof(float) * n);
  if (!mask) return DT_OUT_OF_MEMORY;
  for (size_t i = 0; i < n; i++) mask[i] = out[i] > 0.0f ? 1.0f : 0.0f;
  const int bad = relu_sink(relu_count++, mask, n);
  free(mask);
  return bad ? DT_IO : DT_OK;
}

/* A training forward of m (`model` in messages) on x (batch samples of `outputs` logits) in a context of its own
 * with the fusions off, handing every ReLU's mask to sink; its logits must equal want (the fused forward's). 0, or 1
 * after saying why. The ReLU layers keep the wrapper, which passes through while no sink is set. */
static int relu_masks_put(dt_model *m, const char *model, int batch, int outputs, const float *x, const float *want,
                          relu_mask_sink sink) {
  relu_masked = dt_activation_ops;
  relu_masked.forward = relu_mask_forward;
  for (int i = 0; i < dt_model_num_layers(m); i++) {
    dt_layer *l = (dt_layer *)dt_model_layer(m, i); /* the model's own, non-const array */
    if (dt_activation_is_relu(l)) l->ops = &relu_masked;
  }
  dt_model_ctx *plain = NULL;
  const float *y;
  TRY("mask context", dt_model_ctx_new(m, batch, 0, &plain));
  dt_model_ctx_set_fusion(plain, 0);
  dt_model_set_training(m, 1);
  relu_sink = sink;
  relu_count = 0;
  dt_status st = dt_model_ctx_forward(m, plain, x, batch, &y);
  relu_sink = NULL;
  const int same = st == DT_OK && memcmp(y, want, sizeof(float) * (size_t)batch * (size_t)outputs) == 0;
  dt_model_ctx_free(plain);
  TRY("mask forward", st);
  if (!same) fprintf(stderr, "%s: %s: the unfused forward's logits differ from the fused one's\n", TOOL_NAME, model);
  return !same;
}

#endif
