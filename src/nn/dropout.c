/* Dropout layer (torch.nn.Dropout): Philox masks keyed by (build seed, stream, layer, step); identity in evaluation. */
#include <string.h>

#include "core/impl.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct dropout_priv {
  float p;
} dropout_priv;

static dt_status dropout_infer(dt_layer *l) {
  l->out_ndim = l->in_ndim;
  for (int i = 0; i < l->in_ndim; i++) l->out_shape[i] = l->in_shape[i];
  return DT_OK;
}

/* Workspace: the keep mask (batch, numel), one byte each. */
static size_t dropout_ws_bytes(const dt_layer *l, int max_batch) { return l->in_numel * (size_t)max_batch; }

static int active(const dt_layer *l, const dt_layer_io *io) {
  return io->training && ((const dropout_priv *)l->priv)->p > 0.0f;
}

static dt_status dropout_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  size_t n = dt_layer_in_elems(l, io);
  if (!active(l, io)) {
    memcpy(out, in, n * sizeof(float));
    return DT_OK;
  }
  dt_dropout_forward(out, io->ws, in, n, ((const dropout_priv *)l->priv)->p, io->seed, io->stream);
  return DT_OK;
}

static void dropout_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                             const float *dout, float *dinp) {
  size_t n = dt_layer_in_elems(l, io);
  if (!dinp) return;
  if (!active(l, io)) {
    memcpy(dinp, dout, n * sizeof(float));
    return;
  }
  dt_dropout_backward(dinp, dout, io->ws, n, ((const dropout_priv *)l->priv)->p);
}

const dt_layer_ops dt_dropout_ops = {.kind = "Dropout",
                                     .infer = dropout_infer,
                                     .ws_bytes = dropout_ws_bytes,
                                     .forward = dropout_forward,
                                     .backward = dropout_backward};

dt_status dt_model_add_dropout(dt_model *m, const char *name, float p) {
  if (!(p >= 0.0f && p < 1.0f))
    return dt_error(DT_INVALID_ARGUMENT, "%s: Dropout p %g, expected in [0, 1)", name ? name : "?", (double)p);
  dropout_priv *d = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *d, "Dropout", (void **)&d));
  d->p = p;
  return dt_model_add_layer(m, &dt_dropout_ops, name, d);
}
