/* Flatten layer (torch.nn.Flatten / x.view(N, -1)): (C, H, W) -> (C*H*W,); a view (the executor aliases it). */
#include <string.h>

#include "core/impl.h"
#include "nn/layer.h"

static dt_status flatten_infer(dt_layer *l) {
  l->out_ndim = 1;
  l->out_shape[0] = (int64_t)l->in_numel;
  return DT_OK;
}

static dt_status flatten_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  if (out != in) memcpy(out, in, l->in_numel * (size_t)io->batch * sizeof(float));
  return DT_OK;
}

static void flatten_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                             const float *dout, float *dinp) {
  if (dinp) memcpy(dinp, dout, l->in_numel * (size_t)io->batch * sizeof(float));
}

const dt_layer_ops dt_flatten_ops = {
    .kind = "Flatten", .infer = flatten_infer, .forward = flatten_forward, .backward = flatten_backward, .is_view = 1};

dt_status dt_model_add_flatten(dt_model *m, const char *name) {
  return dt_model_add_layer(m, &dt_flatten_ops, name, NULL);
}
