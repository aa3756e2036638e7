/* LayerNorm (torch.nn.LayerNorm(last dim)): normalises each position's features, then weight and bias. */
#include "core/impl.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct layernorm_priv {
  float eps;
} layernorm_priv;

static int features(const dt_layer *l) { return (int)l->in_shape[l->in_ndim - 1]; }
static int rows_at(const dt_layer *l, int batch) { return batch * (int)(l->in_numel / (size_t)features(l)); }

static dt_status layernorm_infer(dt_layer *l) {
  l->out_ndim = l->in_ndim;
  for (int i = 0; i < l->in_ndim; i++) l->out_shape[i] = l->in_shape[i];
  const int64_t c = l->in_shape[l->in_ndim - 1];
  DT_CHECK(dt_layer_declare(l, "weight", DT_PLACE_PARAM, DT_INIT_ONES, 0, 1, &c));
  return dt_layer_declare(l, "bias", DT_PLACE_PARAM, DT_INIT_ZEROS, 0, 1, &c);
}

/* Workspace: each row's mean and 1/std, for backward. */
static size_t layernorm_ws_bytes(const dt_layer *l, int max_batch) {
  return 2 * (size_t)rows_at(l, max_batch) * sizeof(float);
}

static dt_status layernorm_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const int C = features(l), N = dt_layer_rows(l, io);
  float *mean = io->ws, *rstd = mean + N;
  dt_layernorm_forward(out, mean, rstd, in, io->params, io->params + C, N, C, ((const layernorm_priv *)l->priv)->eps);
  return DT_OK;
}

static void layernorm_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                               const float *dout, float *dinp) {
  const int C = features(l), N = dt_layer_rows(l, io);
  const float *mean = io->ws, *rstd = mean + N;
  dt_layernorm_backward(dinp, io->grads, io->grads + C, dout, in, mean, rstd, io->params, N, C);
}

const dt_layer_ops dt_layernorm_ops = {.kind = "LayerNorm",
                                       .infer = layernorm_infer,
                                       .ws_bytes = layernorm_ws_bytes,
                                       .forward = layernorm_forward,
                                       .backward = layernorm_backward};

dt_status dt_model_add_layernorm(dt_model *m, const char *name, float eps) {
  if (!(eps > 0.0f))
    return dt_error(DT_INVALID_ARGUMENT, "%s: LayerNorm eps %g, expected > 0", name ? name : "?", (double)eps);
  layernorm_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "LayerNorm", (void **)&p));
  p->eps = eps;
  return dt_model_add_layer(m, &dt_layernorm_ops, name, p);
}
