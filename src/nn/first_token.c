/* FirstToken: a sequence (L, H) -> its first position (H), as BertPooler's hidden_states[:, 0] ([CLS]). */
#include <string.h>

#include "core/impl.h"
#include "nn/layer.h"

static dt_status first_infer(dt_layer *l) {
  char s[96];
  if (l->in_ndim != 2)
    return dt_error(DT_SHAPE_MISMATCH, "%s: FirstToken expects a sequence (tokens, features), got %s", l->name,
                    dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  l->out_ndim = 1;
  l->out_shape[0] = l->in_shape[1];
  return DT_OK;
}

/* Row of sample b's first position: packed sequences start at off[b]. */
static size_t first_row(const dt_layer *l, const dt_layer_io *io, int b) {
  return io->seq ? (size_t)io->seq->off[b] : (size_t)b * (size_t)l->in_shape[0];
}

static dt_status first_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const size_t H = l->out_numel;
  for (int b = 0; b < io->batch; b++) memcpy(out + b * H, in + first_row(l, io, b) * H, H * sizeof(float));
  return DT_OK;
}

static void first_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                           const float *dout, float *dinp) {
  if (!dinp) return;
  const size_t H = l->out_numel;
  memset(dinp, 0, dt_layer_in_elems(l, io) * sizeof(float));
  for (int b = 0; b < io->batch; b++) memcpy(dinp + first_row(l, io, b) * H, dout + b * H, H * sizeof(float));
}

const dt_layer_ops dt_first_token_ops = {
    .kind = "FirstToken", .infer = first_infer, .forward = first_forward, .backward = first_backward};

dt_status dt_model_add_first_token(dt_model *m, const char *name) {
  return dt_model_add_layer(m, &dt_first_token_ops, name, NULL);
}
