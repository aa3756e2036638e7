/* Parity helper: resnet18 (2 x 3x64x64), resnet20 and resnet9 at --width 16 (2 x 3x32x32), 10 classes: weights, batch, logits, loss,
 * every gradient and the BN statistics after a training step, and the evaluation logits, for test_resnet_torch.py.
 *
 *   dump_resnet OUT_PREFIX [--amp bf16|fp16|off]
 *
 * Keys, per model M: M/init/<state_dict name> (the built weights, buffers and num_batches_tracked), M/input,
 * M/labels, M/train/logits, M/train/loss, M/grad/<parameter>, M/after/<buffer or counter>, M/eval/logits,
 * M/eval/loss, and M/relu/NNN, the mask (1 where the output is positive, else 0) of the NNN-th ReLU the training
 * forward ran, in the order it ran them (taken from a second training forward with the executor's fusions off,
 * which are checked to give the same logits' bits): the PyTorch side differentiates under these masks, so that a
 * ReLU input within rounding of zero, which either side may round to the other sign, does not move the gradients
 * upstream of it. zero_init_residual stays off (a zero BN weight would hide half the gradients).
 * With --amp, both steps and evaluations run under that autocast (test_amp_resnet_torch.py), and the training
 * step also dumps what each Conv2d and Linear L saw and gave: M/amp/L/in and M/amp/L/out (its f32 input, its
 * output), M/amp/L/dout and M/amp/L/dinp (its incoming gradient, its input gradient; none for the first conv). */
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "nn/fusion.h"
#include "nn/layer.h"
#include "parity/dump_io.h"

#define TOOL_NAME "dump_resnet"
#include "tool_try.h"
#include "relu_masks.h"

enum { BATCH = 2, CLASSES = 10 };

/* Every tensor of m under "<model>/<prefix>/<name>"; buffers and counters only with only_buffers. */
static void put_state(dt_model *m, const char *model, const char *prefix, int only_buffers) {
  for (int i = 0; i < dt_model_num_tensors(m); i++) {
    dt_tensor_info ti;
    if (dt_model_tensor_info(m, i, &ti) != DT_OK || (only_buffers && ti.trainable)) continue;
    char key[256];
    int dims[DT_MAX_DIMS];
    for (int d = 0; d < ti.ndim; d++) dims[d] = (int)ti.shape[d];
    snprintf(key, sizeof key, "%s/%s/%s", model, prefix, ti.name);
    if (ti.dtype == DT_I64)
      dump_put(key, "i64", dt_model_tensor_data(m, i), 8, ti.ndim, dims);
    else
      dump_put(key, "f32", dt_model_tensor_data(m, i), 4, ti.ndim, dims);
  }
}

static void put_grads(dt_model *m, const char *model) {
  const float *g = dt_model_grads(m, NULL);
  for (int i = 0; i < dt_model_num_tensors(m); i++) {
    dt_tensor_info ti;
    if (dt_model_tensor_info(m, i, &ti) != DT_OK || !ti.trainable) continue;
    char key[256];
    int dims[DT_MAX_DIMS];
    for (int d = 0; d < ti.ndim; d++) dims[d] = (int)ti.shape[d];
    snprintf(key, sizeof key, "%s/grad/%s", model, ti.name);
    dump_put(key, "f32", g + ti.offset, 4, ti.ndim, dims);
  }
}

static void put_named(const char *model, const char *what, const char *type, const void *data, int ndim,
                      const int *dims) {
  char key[256];
  snprintf(key, sizeof key, "%s/%s", model, what);
  dump_put(key, type, data, 4, ndim, dims);
}

/* --amp: the autocast layers' ops, wrapped to dump their activations and gradients while `recording` names the
 * model (the original ops run unchanged in between). */
static const char *recording;
static dt_layer_ops wrapped[2];
static const dt_layer_ops *const originals[2] = {&dt_conv2d_ops, &dt_linear_ops};

static const dt_layer_ops *original(const dt_layer *l) { return originals[l->ops == &wrapped[1]]; }

static void put_act(const dt_layer *l, const char *what, const float *x, int ndim, const int64_t *shape) {
  if (!recording || !x) return;
  char key[256];
  int dims[DT_MAX_DIMS] = {BATCH};
  for (int d = 0; d < ndim; d++) dims[d + 1] = (int)shape[d];
  snprintf(key, sizeof key, "%s/amp/%s/%s", recording, l->name, what);
  dump_put(key, "f32", x, 4, ndim + 1, dims);
}

static dt_status rec_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  put_act(l, "in", in, l->in_ndim, l->in_shape);
  dt_status st = original(l)->forward(l, io, in, out);
  put_act(l, "out", out, l->out_ndim, l->out_shape);
  return st;
}

static void rec_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                         const float *dout, float *dinp) {
  put_act(l, "dout", dout, l->out_ndim, l->out_shape);
  original(l)->backward(l, io, in, out, dout, dinp);
  put_act(l, "dinp", dinp, l->in_ndim, l->in_shape);
}

static void wrap_autocast_layers(dt_model *m) {
  for (int k = 0; k < 2; k++) {
    wrapped[k] = *originals[k];
    wrapped[k].forward = rec_forward;
    wrapped[k].backward = rec_backward;
  }
  for (int i = 0; i < dt_model_num_layers(m); i++) {
    dt_layer *l = (dt_layer *)dt_model_layer(m, i); /* the model's own, non-const array */
    for (int k = 0; k < 2; k++)
      if (l->ops == originals[k]) l->ops = &wrapped[k];
  }
}

/* The ReLU masks (relu_masks.h) of the model `masking` names, as M/relu/NNN. */
static const char *masking;

static int put_mask(int index, const float *mask, size_t n) {
  char what[32];
  snprintf(what, sizeof what, "relu/%03d", index);
  put_named(masking, what, "f32", mask, 1, (int[]){(int)n});
  return 0;
}

/* One model: a training step (forward, loss, backward) and an evaluation forward on one random batch. */
static int run(const char *model, int width, int side, uint64_t seed, dt_amp amp) {
  const dt_zoo_config cfg = {
      .ndim = 3, .input_shape = {3, side, side}, .outputs = CLASSES, .dropout = -1.0f, .width = width};
  dt_model *m = NULL;
  TRY("zoo", dt_model_zoo_new(model, &cfg, &m));
  TRY("build", dt_model_build(m, BATCH, seed));
  if (amp != DT_AMP_OFF) {
    TRY("amp", dt_model_ctx_set_amp(m, dt_model_default_ctx(m), amp));
    wrap_autocast_layers(m);
  }
  const int n = BATCH * 3 * side * side;
  float *x = malloc(sizeof(float) * (size_t)n), dlogits[BATCH * CLASSES], loss;
  int32_t labels[BATCH];
  if (!x) return 1;
  dt_rng r;
  dt_rng_init(&r, seed, 1);
  for (int i = 0; i < n; i++) x[i] = 2.0f * dt_rng_uniform(&r) - 1.0f;
  for (int i = 0; i < BATCH; i++) labels[i] = (int32_t)dt_rng_below(&r, CLASSES);
  put_state(m, model, "init", 0);
  put_named(model, "input", "f32", x, 4, (int[]){BATCH, 3, side, side});
  put_named(model, "labels", "i32", labels, 1, (int[]){BATCH});
  const float *y;
  float train_logits[BATCH * CLASSES];
  const int ld[2] = {BATCH, CLASSES};
  dt_model_set_training(m, 1);
  recording = amp != DT_AMP_OFF ? model : NULL;
  TRY("forward", dt_model_forward(m, x, BATCH, &y));
  TRY("loss", dt_loss_cross_entropy(y, labels, BATCH, CLASSES, 0.0f, &loss, dlogits));
  put_named(model, "train/logits", "f32", y, 2, ld);
  memcpy(train_logits, y, sizeof train_logits);
  put_named(model, "train/loss", "f32", &loss, 1, (int[]){1});
  dt_model_zero_grad(m);
  TRY("backward", dt_model_backward(m, dlogits));
  recording = NULL;
  put_grads(m, model);
  put_state(m, model, "after", 1);
  dt_model_set_training(m, 0);
  TRY("eval forward", dt_model_forward(m, x, BATCH, &y));
  TRY("eval loss", dt_loss_cross_entropy(y, labels, BATCH, CLASSES, 0.0f, &loss, dlogits));
  put_named(model, "eval/logits", "f32", y, 2, ld);
  put_named(model, "eval/loss", "f32", &loss, 1, (int[]){1});
  masking = model;
  const int rc = amp == DT_AMP_OFF ? relu_masks_put(m, model, BATCH, CLASSES, x, train_logits, put_mask) : 0;
  free(x);
  dt_model_free(m);
  return rc;
}

int main(int argc, char **argv) {
  dt_amp amp = DT_AMP_OFF;
  const int amp_arg = argc == 4 && strcmp(argv[2], "--amp") == 0;
  if (amp_arg) TRY("amp", dt_amp_parse(argv[3], &amp));
  int rc = dump_open(amp_arg ? 2 : argc, argv);
  if (rc) return rc;
  rc = run("resnet18", 0, 64, 18, amp);
  if (!rc) rc = run("resnet20", 0, 32, 20, amp);
  if (!rc) rc = run("resnet9", 16, 32, 9, amp);
  return dump_close() || rc;
}
