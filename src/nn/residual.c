/* Residual wrapper: a begin layer marks the skip, an optional shortcut layer starts a skip path of layers
 * (a projection), the end layer adds: out = branch(in) + in, or branch(in) + skip(in). */
#include <string.h>

#include "core/impl.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

/* ---- begin: its output is its input (a forward view); backward adds the skip gradient the end stashed ---- */

static dt_status begin_infer(dt_layer *l) {
  l->out_ndim = l->in_ndim;
  for (int i = 0; i < l->in_ndim; i++) l->out_shape[i] = l->in_shape[i];
  return DT_OK;
}

/* Workspace: the skip gradient (batch, numel), written by the end's backward (or the shortcut's). */
static size_t begin_ws_bytes(const dt_layer *l, int max_batch) {
  return l->in_numel * (size_t)max_batch * sizeof(float);
}

static void begin_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                           const float *dout, float *dinp) {
  /* d in = d branch_in + d skip */
  if (dinp) dt_add_forward(dinp, dout, io->ws, dt_layer_in_elems(l, io));
}

const dt_layer_ops dt_residual_begin_ops = {.kind = "Residual",
                                            .infer = begin_infer,
                                            .ws_bytes = begin_ws_bytes,
                                            .backward = begin_backward,
                                            .forward_view = 1};

/* ---- shortcut: between the branch and the skip path, which reads the begin's input ----
 * Its input is the branch output (left in place for the end to add); its output is the begin's input
 * again, the skip path's input. Backward: the skip path's input gradient goes to the begin's stash,
 * and the branch output's gradient, stashed here by the end, flows on into the branch. */

static dt_status shortcut_infer(dt_layer *l) {
  const residual_end_priv *p = l->priv;
  l->out_ndim = p->ndim;
  for (int i = 0; i < p->ndim; i++) l->out_shape[i] = p->shape[i];
  return DT_OK;
}

/* Workspace: the branch output's gradient (batch, in_numel), written by the end's backward. */
static size_t shortcut_ws_bytes(const dt_layer *l, int max_batch) {
  return l->in_numel * (size_t)max_batch * sizeof(float);
}

static dt_status shortcut_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  memcpy(out, io->partner_in, dt_layer_out_elems(l, io) * sizeof(float));
  return DT_OK;
}

static void shortcut_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                              const float *dout, float *dinp) {
  memcpy(io->partner_ws, dout, dt_layer_out_elems(l, io) * sizeof(float));
  if (dinp) memcpy(dinp, io->ws, dt_layer_in_elems(l, io) * sizeof(float));
}

static const char *shortcut_label(const dt_layer *l) { return "Residual(skip)"; }

const dt_layer_ops dt_residual_shortcut_ops = {.kind = "Residual",
                                               .infer = shortcut_infer,
                                               .ws_bytes = shortcut_ws_bytes,
                                               .forward = shortcut_forward,
                                               .backward = shortcut_backward,
                                               .label = shortcut_label};

/* ---- end: adds the begin's input (or the branch output, after a skip path); backward sends dout both ways ---- */


static dt_status end_infer(dt_layer *l) {
  const residual_end_priv *p = l->priv;
  int same = p->ndim == l->in_ndim;
  for (int i = 0; same && i < p->ndim; i++) same = p->shape[i] == l->in_shape[i];
  if (!same) {
    char a[96], b[96];
    return dt_error(DT_SHAPE_MISMATCH, "%s: residual %s output %s differs from %s %s", l->name,
                    p->after_shortcut ? "skip path" : "branch",
                    dt_shape_str(l->in_ndim, l->in_shape, a, sizeof a),
                    p->after_shortcut ? "the branch output" : "its input", dt_shape_str(p->ndim, p->shape, b, sizeof b));
  }
  l->out_ndim = l->in_ndim;
  for (int i = 0; i < l->in_ndim; i++) l->out_shape[i] = l->in_shape[i];
  return DT_OK;
}

static dt_status end_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  dt_add_forward(out, in, io->partner_in, dt_layer_in_elems(l, io));
  return DT_OK;
}

static void end_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                         const float *dout, float *dinp) {
  size_t n = dt_layer_in_elems(l, io);
  memcpy(io->partner_ws, dout, n * sizeof(float));
  if (dinp) memcpy(dinp, dout, n * sizeof(float));
}

static const char *end_label(const dt_layer *l) { return "Residual(+)"; }

/* ---- end -> ReLU fused (a row of the fusion table, fusion.c): the sum is not materialised ---- */

#define PAR_MIN 65536 /* elements below which one thread does it all */

dt_status dt_residual_relu_forward(const dt_layer *end, const dt_layer_io *io, const float *in, float *out) {
  const size_t n = dt_layer_in_elems(end, io);
  const float *skip = io->partner_in;
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float v = in[i] + skip[i];
    out[i] = v > 0.0f ? v : 0.0f; /* as dt_act_forward: NaN -> 0 */
  }
  return DT_OK;
}

/* ReLU's gradient (where its output is positive) goes both ways, as end_backward sends dout. */
void dt_residual_relu_backward(const dt_layer *end, const dt_layer_io *io, const float *out, const float *dout,
                               float *dinp) {
  const size_t n = dt_layer_in_elems(end, io);
  float *skip = io->partner_ws;
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float g = out[i] > 0.0f ? dout[i] : 0.0f;
    skip[i] = g;
    if (dinp) dinp[i] = g;
  }
}

const dt_layer_ops dt_residual_end_ops = {.kind = "Residual",
                                          .infer = end_infer,
                                          .forward = end_forward,
                                          .backward = end_backward,
                                          .label = end_label};
