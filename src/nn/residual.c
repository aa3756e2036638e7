/* Residual wrapper: a begin layer marks the skip, the end layer adds it: out = in + branch(in). */
#include <string.h>

#include "core/impl.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

/* ---- begin: identity forward; backward adds the skip gradient the end stashed ---- */

static dt_status begin_infer(dt_layer *l) {
  l->out_ndim = l->in_ndim;
  for (int i = 0; i < l->in_ndim; i++) l->out_shape[i] = l->in_shape[i];
  return DT_OK;
}

/* Workspace: the skip gradient (batch, numel), written by the end's backward. */
static size_t begin_ws_bytes(const dt_layer *l, int max_batch) {
  return l->in_numel * (size_t)max_batch * sizeof(float);
}

static dt_status begin_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  memcpy(out, in, l->in_numel * (size_t)io->batch * sizeof(float));
  return DT_OK;
}

static void begin_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                           const float *dout, float *dinp) {
  /* d in = d branch_in + d skip */
  if (dinp) dt_add_forward(dinp, dout, io->ws, l->in_numel * (size_t)io->batch);
}

const dt_layer_ops dt_residual_begin_ops = {.kind = "Residual",
                                            .infer = begin_infer,
                                            .ws_bytes = begin_ws_bytes,
                                            .forward = begin_forward,
                                            .backward = begin_backward};

/* ---- end: adds the begin's input; backward sends dout both ways ---- */


static dt_status end_infer(dt_layer *l) {
  const residual_end_priv *p = l->priv;
  int same = p->ndim == l->in_ndim;
  for (int i = 0; same && i < p->ndim; i++) same = p->shape[i] == l->in_shape[i];
  if (!same) {
    char a[96], b[96];
    return dt_error(DT_SHAPE_MISMATCH, "%s: residual branch output %s differs from its input %s", l->name,
                    dt_shape_str(l->in_ndim, l->in_shape, a, sizeof a), dt_shape_str(p->ndim, p->shape, b, sizeof b));
  }
  l->out_ndim = l->in_ndim;
  for (int i = 0; i < l->in_ndim; i++) l->out_shape[i] = l->in_shape[i];
  return DT_OK;
}

static dt_status end_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  dt_add_forward(out, in, io->partner_in, l->in_numel * (size_t)io->batch);
  return DT_OK;
}

static void end_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                         const float *dout, float *dinp) {
  size_t n = l->in_numel * (size_t)io->batch;
  memcpy(io->partner_ws, dout, n * sizeof(float));
  if (dinp) memcpy(dinp, dout, n * sizeof(float));
}

static const char *end_label(const dt_layer *l) { return "Residual(+)"; }

const dt_layer_ops dt_residual_end_ops = {.kind = "Residual",
                                          .infer = end_infer,
                                          .forward = end_forward,
                                          .backward = end_backward,
                                          .label = end_label};
