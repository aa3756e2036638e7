/* 2-D convolution layer (torch.nn.Conv2d, square kernel, zero padding) over im2col + GEMM kernels. */
#include "core/impl.h"
#include "nn/amp.h"
#include "nn/fusion.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct conv2d_priv {
  int out_channels, kernel, stride, padding, bias;
  int scratch_threads; /* thread blocks of every context's workspace (the fewest sized); 0: none sized yet */
} conv2d_priv;

static dt_status conv_geom(const dt_layer *l, int N, dt_amp amp, dt_conv2d_geom *g) {
  const conv2d_priv *p = l->priv;
  DT_CHECK(dt_conv2d_geom_init(g, N, (int)l->in_shape[0], (int)l->in_shape[1], (int)l->in_shape[2], p->out_channels,
                               p->kernel, p->kernel, p->stride, p->padding));
  if (p->scratch_threads > 0) g->threads = p->scratch_threads;
  g->amp = amp;
  return DT_OK;
}

static dt_status conv2d_infer(dt_layer *l) {
  const conv2d_priv *p = l->priv;
  char s[96];
  if (l->in_ndim != 3)
    return dt_error(DT_SHAPE_MISMATCH, "%s: Conv2d expects an input of shape (C, H, W), got %s", l->name,
                    dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  int64_t C = l->in_shape[0], H = l->in_shape[1], W = l->in_shape[2];
  int64_t OH = (H + 2 * p->padding - p->kernel) / p->stride + 1;
  int64_t OW = (W + 2 * p->padding - p->kernel) / p->stride + 1;
  if (H + 2 * p->padding < p->kernel || W + 2 * p->padding < p->kernel || OH < 1 || OW < 1)
    return dt_error(DT_SHAPE_MISMATCH, "%s: Conv2d kernel %d (padding %d) does not fit the input %s", l->name,
                    p->kernel, p->padding, dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  l->out_ndim = 3;
  l->out_shape[0] = p->out_channels;
  l->out_shape[1] = OH;
  l->out_shape[2] = OW;
  int fan_in = (int)(C * p->kernel * p->kernel);
  int64_t wshape[4] = {p->out_channels, C, p->kernel, p->kernel}, oc = p->out_channels;
  DT_CHECK(dt_layer_declare(l, "weight", DT_PLACE_PARAM, DT_INIT_FAN_IN, fan_in, 4, wshape));
  if (p->bias) DT_CHECK(dt_layer_declare(l, "bias", DT_PLACE_PARAM, DT_INIT_FAN_IN, fan_in, 1, &oc));
  return DT_OK;
}

/* Workspace: the kernels' scratch (nothing is kept from forward to backward). */
static size_t conv2d_ws_bytes(const dt_layer *l, int max_batch) {
  /* A block per thread of the budget, not per sample (resnet18 at batch 32: 4.8 GiB -> 0.3 GiB on 2 cores).
   * The kernels never use more threads than the smallest workspace sized holds blocks for. */
  conv2d_priv *p = l->priv;
  int t = dt_get_threads();
  if (t < 1) t = 1;
  if (p->scratch_threads == 0 || t < p->scratch_threads) p->scratch_threads = t;
  dt_conv2d_geom g;
  if (conv_geom(l, max_batch, DT_AMP_OFF, &g) != DT_OK) return 0; /* sized for every amp mode */
  return dt_conv2d_scratch_floats(&g) * sizeof(float);
}

static dt_status conv2d_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const conv2d_priv *p = l->priv;
  dt_conv2d_geom g;
  DT_CHECK(conv_geom(l, io->batch, io->amp, &g));
  const float *w = dt_amp_weights(io), *b = p->bias ? w + l->t[0].numel : NULL;
  dt_conv2d_forward(&g, out, io->ws, dt_amp_operand(io, 0, in, dt_layer_in_elems(l, io)), w, b);
  dt_amp_result(io, out, dt_layer_out_elems(l, io));
  return DT_OK;
}

static void conv2d_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                            const float *dout, float *dinp) {
  const conv2d_priv *p = l->priv;
  dt_conv2d_geom g;
  if (conv_geom(l, io->batch, io->amp, &g) != DT_OK) return; /* validated by the forward */
  float *dw = io->grads, *db = p->bias ? io->grads + l->t[0].numel : NULL;
  const float *gr = dt_amp_operand(io, 1, dout, dt_layer_out_elems(l, io));
  dt_conv2d_backward(&g, dinp, dw, db, io->ws, gr, dt_amp_operand(io, 0, in, dt_layer_in_elems(l, io)),
                     dt_amp_weights(io));
  dt_amp_result(io, dinp, dt_layer_in_elems(l, io));
}

/* ---- Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d(2) (a row of the fusion table, fusion.c) ---- */

int dt_conv2d_is_3x3_same(const dt_layer *l) {
  const conv2d_priv *p = l->priv;
  return l->ops == &dt_conv2d_ops && p->kernel == 3 && p->stride == 1 && p->padding == 1;
}

dt_status dt_conv_bn_pool_forward(const dt_layer *l, const dt_layer_io *io, float *const *act) {
  DT_CHECK(conv2d_forward(&l[0], &io[0], act[0], act[1]));
  return dt_bn_relu_pool_forward(&l[1], &io[1], io[3].ws, act[2], act[1], act[4]);
}

void dt_conv_bn_pool_fused_backward(const dt_layer *l, const dt_layer_io *io, float *const *act, const float *dout,
                                    float *dinp) {
  const conv2d_priv *p = l[0].priv;
  dt_conv2d_geom g;
  if (conv_geom(&l[0], io[0].batch, io[0].amp, &g) != DT_OK) return; /* validated by the forward */
  const size_t slot = (size_t)io[0].batch * l[3].in_numel; /* act[3]'s floats */
  /* act[3] == act[2] cannot be (a ReLU is no view): a guard, as xsel lives in act[2] */
  if (dinp || io[0].amp != DT_AMP_OFF || !dt_conv2d_weights_direct(&g) || act[3] == act[2] ||
      dt_conv_bn_pool_work_floats(&g) > slot) {
    dt_bn_relu_pool_backward(&l[1], &io[1], io[3].ws, act[2], act[1], act[4], dout, act[3]);
    conv2d_backward(&l[0], &io[0], act[0], act[1], act[3], dinp);
    return;
  }
  dt_bn_pool_saved s;
  float *dgamma, *dbeta, *dw = io[0].grads, *db = p->bias ? io[0].grads + l[0].t[0].numel : NULL;
  dt_bn_relu_pool_saved_of(&l[1], &io[1], io[3].ws, act[2], act[1], act[4], &s, &dgamma, &dbeta);
  dt_conv_bn_pool_backward(&g, &s, dout, dw, db, dgamma, dbeta, io[0].ws, act[3], act[0]);
}

const dt_layer_ops dt_conv2d_ops = {.kind = "Conv2d",
                                    .infer = conv2d_infer,
                                    .ws_bytes = conv2d_ws_bytes,
                                    .forward = conv2d_forward,
                                    .backward = conv2d_backward};

dt_status dt_model_add_conv2d(dt_model *m, const char *name, int out_channels, int kernel, int stride, int padding,
                              int bias) {
  if (out_channels < 1 || kernel < 1 || stride < 1 || padding < 0)
    return dt_error(DT_INVALID_ARGUMENT,
                    "%s: Conv2d out_channels %d, kernel %d, stride %d, padding %d: expected >= 1, >= 1, >= 1, >= 0",
                    name ? name : "?", out_channels, kernel, stride, padding);
  conv2d_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "Conv2d", (void **)&p));
  *p = (conv2d_priv){out_channels, kernel, stride, padding, bias != 0, 0};
  return dt_model_add_layer(m, &dt_conv2d_ops, name, p);
}
