/* Parity helper: resnet18 (2 x 3x64x64) and resnet20 (2 x 3x32x32), 10 classes: weights, batch, logits, loss,
 * every gradient and the BN statistics after a training step, and the evaluation logits, for test_resnet_torch.py.
 *
 *   dump_resnet OUT_PREFIX
 *
 * Keys, per model M: M/init/<state_dict name> (the built weights, buffers and num_batches_tracked), M/input,
 * M/labels, M/train/logits, M/train/loss, M/grad/<parameter>, M/after/<buffer or counter>, M/eval/logits,
 * M/eval/loss. zero_init_residual stays off (a zero BN weight would hide half the gradients). */
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "parity/dump_io.h"

#define TOOL_NAME "dump_resnet"
#include "tool_try.h"

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

/* One model: a training step (forward, loss, backward) and an evaluation forward on one random batch. */
static int run(const char *model, int side, uint64_t seed) {
  const dt_zoo_config cfg = {.ndim = 3, .input_shape = {3, side, side}, .outputs = CLASSES, .dropout = -1.0f};
  dt_model *m = NULL;
  TRY("zoo", dt_model_zoo_new(model, &cfg, &m));
  TRY("build", dt_model_build(m, BATCH, seed));
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
  const int ld[2] = {BATCH, CLASSES};
  dt_model_set_training(m, 1);
  TRY("forward", dt_model_forward(m, x, BATCH, &y));
  TRY("loss", dt_loss_cross_entropy(y, labels, BATCH, CLASSES, 0.0f, &loss, dlogits));
  put_named(model, "train/logits", "f32", y, 2, ld);
  put_named(model, "train/loss", "f32", &loss, 1, (int[]){1});
  dt_model_zero_grad(m);
  TRY("backward", dt_model_backward(m, dlogits));
  put_grads(m, model);
  put_state(m, model, "after", 1);
  dt_model_set_training(m, 0);
  TRY("eval forward", dt_model_forward(m, x, BATCH, &y));
  TRY("eval loss", dt_loss_cross_entropy(y, labels, BATCH, CLASSES, 0.0f, &loss, dlogits));
  put_named(model, "eval/logits", "f32", y, 2, ld);
  put_named(model, "eval/loss", "f32", &loss, 1, (int[]){1});
  free(x);
  dt_model_free(m);
  return 0;
}

int main(int argc, char **argv) {
  int rc = dump_open(argc, argv);
  if (rc) return rc;
  rc = run("resnet18", 64, 18);
  if (!rc) rc = run("resnet20", 32, 20);
  return dump_close() || rc;
}
