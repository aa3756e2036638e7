/* Scale layer: y = factor * x with a fixed factor (no parameter), as the Mul(0.125) after the classifier of the
 * DAWNBench ResNet-9 (which keeps its logits small at the start without a per-layer learning rate). */
#include <math.h>

#include "core/impl.h"
#include "nn/layer.h"

typedef struct scale_priv {
  float factor;
  char label[32];
} scale_priv;

static dt_status scale_infer(dt_layer *l) {
  l->out_ndim = l->in_ndim;
  for (int i = 0; i < l->in_ndim; i++) l->out_shape[i] = l->in_shape[i];
  return DT_OK;
}

static void scale(float *restrict y, const float *restrict x, float a, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = a * x[i];
}

static dt_status scale_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  scale(out, in, ((const scale_priv *)l->priv)->factor, dt_layer_in_elems(l, io));
  return DT_OK;
}

static void scale_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                           const float *dout, float *dinp) {
  (void)in, (void)out;
  if (dinp) scale(dinp, dout, ((const scale_priv *)l->priv)->factor, dt_layer_in_elems(l, io));
}

static const char *scale_label(const dt_layer *l) { return ((const scale_priv *)l->priv)->label; }

const dt_layer_ops dt_scale_ops = {
    .kind = "Scale", .infer = scale_infer, .forward = scale_forward, .backward = scale_backward, .label = scale_label};

dt_status dt_model_add_scale(dt_model *m, const char *name, float factor) {
  if (!isfinite(factor) || factor == 0.0f)
    return dt_error(DT_INVALID_ARGUMENT, "%s: scale factor %g, expected finite and non-zero", name ? name : "?",
                    (double)factor);
  scale_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "Scale", (void **)&p));
  p->factor = factor;
  snprintf(p->label, sizeof p->label, "Scale(%g)", (double)factor);
  return dt_model_add_layer(m, &dt_scale_ops, name, p);
}
