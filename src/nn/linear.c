/* Linear layer (torch.nn.Linear): on the last dimension, out (B, ..., O) = inp (B, ..., I) @ W^T + b. */
#include "core/impl.h"
#include "nn/amp.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct linear_priv {
  int out_features, bias;
} linear_priv;

static dt_status linear_infer(dt_layer *l) {
  const linear_priv *p = l->priv;
  char s[96];
  /* Images must be flattened first: a Linear over their last axis (width) is legal in torch but never meant. */
  if (l->in_ndim < 1 || l->in_ndim > 2)
    return dt_error(DT_SHAPE_MISMATCH,
                    "%s: Linear expects (features,) or a sequence (tokens, features), got %s; add a flatten layer first",
                    l->name, dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  const int last = l->in_ndim - 1;
  int64_t in = l->in_shape[last], out = p->out_features;
  l->out_ndim = l->in_ndim;
  for (int d = 0; d < last; d++) l->out_shape[d] = l->in_shape[d];
  l->out_shape[last] = out;
  int64_t wshape[2] = {out, in};
  DT_CHECK(dt_layer_declare(l, "weight", DT_PLACE_PARAM, DT_INIT_FAN_IN, (int)in, 2, wshape));
  if (p->bias) DT_CHECK(dt_layer_declare(l, "bias", DT_PLACE_PARAM, DT_INIT_FAN_IN, (int)in, 1, &out));
  return DT_OK;
}

static dt_status linear_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const linear_priv *p = l->priv;
  int I = (int)l->in_shape[l->in_ndim - 1], O = p->out_features;
  const float *w = dt_amp_weights(io), *b = p->bias ? w + (size_t)O * I : NULL; /* b: added before the rounding */
  dt_linear_forward(io->amp, out, dt_amp_operand(io, 0, in, dt_layer_in_elems(l, io)), w, b,
                    dt_layer_rows(l, io), I, O); /* out rounded there: autocast's result */
  return DT_OK;
}

/* dW in pieces of whole output rows where io->final asks (each announced as soon as it is final), then db. */
static void linear_param_grads(const dt_layer_io *io, const float *g, const float *x, int B, int I, int O,
                               float *dw, float *db) {
  const size_t piece = io->final ? io->final->piece : 0;
  const int rows = piece >= (size_t)I && piece / (size_t)I < (size_t)O ? (int)(piece / (size_t)I) : O;
  for (int o0 = 0; o0 < O; o0 += rows) {
    const int o1 = O - o0 > rows ? o0 + rows : O;
    dt_linear_backward_dw_rows(io->amp, dw, g, x, B, I, O, o0, o1, io->grads_unset);
    if (o1 < O) dt_layer_grads_piece(io, (size_t)(o1 - o0) * (size_t)I);
  }
  if (db) dt_linear_backward(io->amp, NULL, NULL, db, g, NULL, NULL, B, I, O, io->grads_unset);
}

static void linear_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                            const float *dout, float *dinp) {
  const linear_priv *p = l->priv;
  int I = (int)l->in_shape[l->in_ndim - 1], O = p->out_features;
  float *dw = io->grads, *db = p->bias ? io->grads + (size_t)O * I : NULL;
  const float *g = dt_amp_operand(io, 1, dout, dt_layer_out_elems(l, io)), *w = dt_amp_weights(io);
  const int B = dt_layer_rows(l, io);
  /* dW and db first: announced final, they can be all-reduced while dinp is computed (it reads W, not them);
   * where the hook may step W (late), dinp first */
  const int late = io->final && io->final->late;
  if (dinp && late) dt_linear_backward(io->amp, dinp, NULL, NULL, g, NULL, w, B, I, O, 0); /* dinp rounded there */
  linear_param_grads(io, g, dt_amp_operand(io, 0, in, dt_layer_in_elems(l, io)), B, I, O, dw, db);
  dt_layer_grads_final(io);
  if (dinp && !late) dt_linear_backward(io->amp, dinp, NULL, NULL, g, NULL, w, B, I, O, 0);
}

const dt_layer_ops dt_linear_ops = {
    .kind = "Linear", .infer = linear_infer, .forward = linear_forward, .backward = linear_backward,
    .gemm_operands = 1, .assigns_grads = 1, .grads_in_rows = 1};

dt_status dt_model_add_linear(dt_model *m, const char *name, int out_features, int bias) {
  if (out_features < 1)
    return dt_error(DT_INVALID_ARGUMENT, "%s: Linear out_features %d, expected >= 1", name ? name : "?", out_features);
  linear_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "Linear", (void **)&p));
  p->out_features = out_features;
  p->bias = bias != 0;
  return dt_model_add_layer(m, &dt_linear_ops, name, p);
}
