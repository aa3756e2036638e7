/* Elementwise activation layers: ReLU, GELU (exact and tanh), Tanh, Sigmoid. */
#include "core/impl.h"
#include "nn/fusion.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct act_priv {
  dt_act_kind kind;
  const char *label;
} act_priv;

/* dt_activation (public) -> kernel kind and torchsummary name; indexed by dt_activation. */
static const struct {
  dt_act_kind kernel;
  const char *name;
} acts[] = {
    [DT_RELU] = {DT_ACT_RELU, "ReLU"},       [DT_GELU] = {DT_ACT_GELU, "GELU"},
    [DT_GELU_TANH] = {DT_ACT_GELU_TANH, "GELU(tanh)"}, [DT_TANH] = {DT_ACT_TANH, "Tanh"},
    [DT_SIGMOID] = {DT_ACT_SIGMOID, "Sigmoid"},
};

static dt_status act_infer(dt_layer *l) {
  l->out_ndim = l->in_ndim;
  for (int i = 0; i < l->in_ndim; i++) l->out_shape[i] = l->in_shape[i];
  return DT_OK;
}

static dt_status act_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const act_priv *p = l->priv;
  dt_act_forward(p->kind, out, in, dt_layer_in_elems(l, io));
  return DT_OK;
}

static void act_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                         const float *dout, float *dinp) {
  const act_priv *p = l->priv;
  if (dinp) dt_act_backward(p->kind, dinp, dout, in, out, dt_layer_in_elems(l, io));
}

int dt_activation_is_relu(const dt_layer *l) {
  return l->ops == &dt_activation_ops && ((const act_priv *)l->priv)->kind == DT_ACT_RELU;
}

static const char *act_label(const dt_layer *l) { return ((const act_priv *)l->priv)->label; }

const dt_layer_ops dt_activation_ops = {
    .kind = "Activation", .infer = act_infer, .forward = act_forward, .backward = act_backward, .label = act_label};

dt_status dt_model_add_activation(dt_model *m, const char *name, dt_activation act) {
  if ((int)act < 0 || (size_t)act >= sizeof acts / sizeof acts[0])
    return dt_error(DT_INVALID_ARGUMENT, "%s: unknown activation %d", name ? name : "?", (int)act);
  act_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "activation", (void **)&p));
  p->kind = acts[act].kernel;
  p->label = acts[act].name;
  return dt_model_add_layer(m, &dt_activation_ops, name, p);
}
