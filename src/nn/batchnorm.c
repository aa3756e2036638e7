/* BatchNorm2d layer (torch.nn.BatchNorm2d): batch statistics in training, running statistics in evaluation. */
#include "core/impl.h"
#include "nn/fusion.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct bn_priv {
  float eps, momentum;
} bn_priv;

static dt_status bn_infer(dt_layer *l) {
  char s[96];
  if (l->in_ndim != 3)
    return dt_error(DT_SHAPE_MISMATCH, "%s: BatchNorm2d expects an input of shape (C, H, W), got %s", l->name,
                    dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  l->out_ndim = 3;
  for (int i = 0; i < 3; i++) l->out_shape[i] = l->in_shape[i];
  int64_t C = l->in_shape[0];
  DT_CHECK(dt_layer_declare(l, "weight", DT_PLACE_PARAM, DT_INIT_ONES, 0, 1, &C));
  DT_CHECK(dt_layer_declare(l, "bias", DT_PLACE_PARAM, DT_INIT_ZEROS, 0, 1, &C));
  DT_CHECK(dt_layer_declare(l, "running_mean", DT_PLACE_BUFFER, DT_INIT_ZEROS, 0, 1, &C));
  DT_CHECK(dt_layer_declare(l, "running_var", DT_PLACE_BUFFER, DT_INIT_ONES, 0, 1, &C));
  DT_CHECK(dt_layer_declare(l, "num_batches_tracked", DT_PLACE_COUNTER, DT_INIT_ZEROS, 0, 0, NULL));
  return DT_OK;
}

/* Workspace: the batch mean and invstd (C each) saved by the training forward. */
static size_t bn_ws_bytes(const dt_layer *l, int max_batch) {
  (void)max_batch;
  return 2 * (size_t)l->in_shape[0] * sizeof(float);
}

/* The unbiased variance needs two values per channel, as torch insists. */
static dt_status check_train_batch(const dt_layer *l, int batch, int HW) {
  if ((int64_t)batch * HW < 2)
    return dt_error(DT_INVALID_ARGUMENT,
                    "%s: BatchNorm2d in training needs more than 1 value per channel, got batch %d x %d positions",
                    l->name, batch, HW);
  return DT_OK;
}

/* The layer's forward, or with relu the fused BatchNorm2d -> ReLU's (out then the ReLU output). */
static dt_status forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out, int relu) {
  const bn_priv *p = l->priv;
  int C = (int)l->in_shape[0], HW = (int)(l->in_shape[1] * l->in_shape[2]);
  const float *gamma = io->params, *beta = io->params + C;
  float *rmean = io->buffers, *rvar = io->buffers + C;
  if (!io->training) {
    (relu ? dt_bn_relu_forward_eval : dt_batchnorm_forward_eval)(out, in, gamma, beta, rmean, rvar, io->batch, C, HW,
                                                                 p->eps);
    return DT_OK;
  }
  DT_CHECK(check_train_batch(l, io->batch, HW));
  float *mean = io->ws, *invstd = (float *)io->ws + C;
  (relu ? dt_bn_relu_forward_train : dt_batchnorm_forward_train)(
      out, mean, invstd, io->update_buffers ? rmean : NULL, io->update_buffers ? rvar : NULL, in, gamma, beta,
      io->batch, C, HW, p->momentum, p->eps);
  if (io->update_buffers) io->counters[0]++;
  return DT_OK;
}

static dt_status bn_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  return forward(l, io, in, out, 0);
}

static void bn_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                        const float *dout, float *dinp) {
  int C = (int)l->in_shape[0], HW = (int)(l->in_shape[1] * l->in_shape[2]);
  const float *mean = io->ws, *invstd = (const float *)io->ws + C;
  dt_batchnorm_backward(dinp, io->grads, io->grads + C, dout, in, mean, invstd, io->params, io->batch, C, HW);
}

/* ---- fused BatchNorm2d -> ReLU (a row of the fusion table, fusion.c) ---- */

dt_status dt_bn_relu_fused_forward(const dt_layer *bn, const dt_layer_io *io, const float *in, float *out) {
  return forward(bn, io, in, out, 1);
}

void dt_bn_relu_fused_backward(const dt_layer *bn, const dt_layer_io *io, const float *in, const float *out,
                               const float *dout, float *dinp) {
  int C = (int)bn->in_shape[0], HW = (int)(bn->in_shape[1] * bn->in_shape[2]);
  const float *mean = io->ws, *invstd = (const float *)io->ws + C;
  dt_bn_relu_backward(dinp, io->grads, io->grads + C, dout, out, in, mean, invstd, io->params, io->batch, C, HW);
}

/* ---- fused BatchNorm2d -> ReLU -> MaxPool2d(2) (a row of the fusion table, fusion.c) ---- */

dt_status dt_bn_relu_pool_forward(const dt_layer *bn, const dt_layer_io *io, int32_t *argmax, float *xsel,
                                  const float *in, float *out) {
  const bn_priv *p = bn->priv;
  int C = (int)bn->in_shape[0], H = (int)bn->in_shape[1], W = (int)bn->in_shape[2];
  const float *gamma = io->params, *beta = io->params + C;
  float *rmean = io->buffers, *rvar = io->buffers + C;
  if (!io->training) {
    dt_bn_relu_maxpool2x2_forward_eval(out, argmax, in, gamma, beta, rmean, rvar, io->batch, C, H, W, p->eps);
    return DT_OK;
  }
  DT_CHECK(check_train_batch(bn, io->batch, H * W));
  float *mean = io->ws, *invstd = (float *)io->ws + C;
  dt_bn_relu_maxpool2x2_forward_train(out, argmax, xsel, mean, invstd, io->update_buffers ? rmean : NULL,
                                      io->update_buffers ? rvar : NULL, in, gamma, beta, io->batch, C, H, W,
                                      p->momentum, p->eps);
  if (io->update_buffers) io->counters[0]++;
  return DT_OK;
}

void dt_bn_relu_pool_saved_of(const dt_layer *bn, const dt_layer_io *io, const int32_t *argmax, const float *xsel,
                              const float *in, const float *out, dt_bn_pool_saved *s, float **dgamma, float **dbeta) {
  int C = (int)bn->in_shape[0], H = (int)bn->in_shape[1], W = (int)bn->in_shape[2];
  const float *mean = io->ws, *invstd = (const float *)io->ws + C;
  *s = (dt_bn_pool_saved){out, argmax, xsel, in, mean, invstd, io->params, io->batch, C, H, W};
  *dgamma = io->grads, *dbeta = io->grads + C;
}

void dt_bn_relu_pool_backward(const dt_layer *bn, const dt_layer_io *io, const int32_t *argmax, const float *xsel,
                              const float *in, const float *out, const float *dout, float *dinp) {
  dt_bn_pool_saved s;
  float *dgamma, *dbeta;
  dt_bn_relu_pool_saved_of(bn, io, argmax, xsel, in, out, &s, &dgamma, &dbeta);
  dt_bn_relu_maxpool2x2_backward(dinp, dgamma, dbeta, dout, s.out, s.argmax, s.xsel, s.inp, s.mean, s.invstd, s.gamma,
                                 s.N, s.C, s.H, s.W);
}

const dt_layer_ops dt_batchnorm2d_ops = {.kind = "BatchNorm2d",
                                         .infer = bn_infer,
                                         .ws_bytes = bn_ws_bytes,
                                         .forward = bn_forward,
                                         .backward = bn_backward,
                                         .backward_needs_train_forward = 1};

dt_status dt_model_add_batchnorm2d(dt_model *m, const char *name, float eps, float momentum) {
  if (!(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
    return dt_error(DT_INVALID_ARGUMENT, "%s: BatchNorm2d eps %g (expected > 0), momentum %g (expected in [0, 1])",
                    name ? name : "?", (double)eps, (double)momentum);
  bn_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "BatchNorm2d", (void **)&p));
  p->eps = eps;
  p->momentum = momentum;
  return dt_model_add_layer(m, &dt_batchnorm2d_ops, name, p);
}
