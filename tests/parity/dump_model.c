/* Parity helper: runs fashioncnn (dropout off) and writes weights, inputs, logits, loss and gradients for PyTorch.
 *
 *   dump_model grad <out_dir> [batch] [bf16|fp16]
 *       random input (batch, 1, 28, 28) and labels; one training forward and
 *       backward, then one evaluation forward (under --amp's autocast when a mode is given).
 *   dump_model avgpool <out_dir> [batch]
 *       the same with a small model of pooling layers instead of fashioncnn:
 *       conv (4, 3x3, pad 1), AvgPool2d(3, 2, 1), ReLU, AvgPool2d(2), flatten,
 *       fc (10).
 *   dump_model sgd <out_dir> <inputs.f32> <labels.i32> <steps> <batch>
 *       `steps` SGD steps (lr 0.01, momentum 0.9) over consecutive batches of
 *       the given data; writes the initial weights and the loss of every step.
 *
 * Output: <out_dir>/tensors.bin (raw little-endian) and <out_dir>/index.txt,
 * one line per tensor: "<key> <f32|i32|i64> <ndim> <dims...> <byte offset>".
 * Keys: init/<state_dict name>, input, labels, train/logits, train/loss,
 * grad/<param name>, after/<buffer name>, eval/logits, losses; and for
 * fashioncnn in f32, relu/NNN: the mask of each ReLU's output in the order the
 * training forward ran them (relu_masks.h), for PyTorch to rectify with. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"

#define TOOL_NAME "dump_model"
#include "tool_try.h"
#include "relu_masks.h"

typedef struct dump {
  FILE *bin, *idx;
  long off;
} dump;

static int put(dump *d, const char *key, const char *dtype, int ndim, const int64_t *shape, const void *data,
               size_t elem) {
  size_t n = 1;
  fprintf(d->idx, "%s %s %d", key, dtype, ndim);
  for (int i = 0; i < ndim; i++) {
    fprintf(d->idx, " %" PRId64, shape[i]);
    n *= (size_t)shape[i];
  }
  fprintf(d->idx, " %ld\n", d->off);
  if (n && fwrite(data, elem, n, d->bin) != n) return 1;
  d->off += (long)(n * elem);
  return 0;
}

static int put_f32(dump *d, const char *key, int ndim, const int64_t *shape, const float *x) {
  return put(d, key, "f32", ndim, shape, x, 4);
}

/* Every tensor of the model under prefix/<name>: params, buffers, counters. */
static int put_state(dump *d, dt_model *m, const char *prefix, int only_buffers) {
  for (int i = 0; i < dt_model_num_tensors(m); i++) {
    dt_tensor_info ti;
    if (dt_model_tensor_info(m, i, &ti) != DT_OK) return 1;
    if (only_buffers && ti.trainable) continue;
    char key[256];
    snprintf(key, sizeof key, "%s/%s", prefix, ti.name);
    int i64 = ti.dtype == DT_I64;
    if (put(d, key, i64 ? "i64" : "f32", ti.ndim, ti.shape, dt_model_tensor_data(m, i), i64 ? 8 : 4)) return 1;
  }
  return 0;
}

static int put_grads(dump *d, dt_model *m) {
  const float *g = dt_model_grads(m, NULL);
  for (int i = 0; i < dt_model_num_tensors(m); i++) {
    dt_tensor_info ti;
    if (dt_model_tensor_info(m, i, &ti) != DT_OK) return 1;
    if (!ti.trainable) continue;
    char key[256];
    snprintf(key, sizeof key, "grad/%s", ti.name);
    if (put_f32(d, key, ti.ndim, ti.shape, g + ti.offset)) return 1;
  }
  return 0;
}

/* The ReLU masks (relu_masks.h) as relu/NNN into mask_dump. */
static dump *mask_dump;

static int put_mask(int index, const float *mask, size_t n) {
  char key[32];
  snprintf(key, sizeof key, "relu/%03d", index);
  const int64_t shape[1] = {(int64_t)n};
  return put_f32(mask_dump, key, 1, shape, mask);
}

/* With masks: also the training forward's ReLU masks (f32 only: under autocast the PyTorch side keeps its own). */
static int run_grad(dump *d, dt_model *m, int batch, int masks) {
  const int classes = 10;
  float *x = malloc(sizeof(float) * (size_t)batch * 784), *dlogits = malloc(sizeof(float) * (size_t)batch * classes);
  int32_t *labels = malloc(sizeof(int32_t) * (size_t)batch);
  if (!x || !dlogits || !labels) return 1;
  dt_rng r;
  dt_rng_init(&r, 2024, 1);
  for (int i = 0; i < batch * 784; i++) x[i] = dt_rng_uniform(&r);
  for (int i = 0; i < batch; i++) labels[i] = (int32_t)dt_rng_below(&r, (uint32_t)classes);
  int64_t xs[4] = {batch, 1, 28, 28}, ls[1] = {batch}, os[2] = {batch, classes};
  if (put_state(d, m, "init", 0) || put_f32(d, "input", 4, xs, x) || put(d, "labels", "i32", 1, ls, labels, 4))
    return 1;
  const float *y;
  float loss;
  dt_model_set_training(m, 1);
  TRY("forward", dt_model_forward(m, x, batch, &y));
  TRY("loss", dt_loss_cross_entropy(y, labels, batch, classes, 0.0f, &loss, dlogits));
  if (put_f32(d, "train/logits", 2, os, y) || put_f32(d, "train/loss", 0, NULL, &loss)) return 1;
  float *train_logits = malloc(sizeof(float) * (size_t)batch * classes);
  if (!train_logits) return 1;
  memcpy(train_logits, y, sizeof(float) * (size_t)batch * classes);
  dt_model_zero_grad(m);
  TRY("backward", dt_model_backward(m, dlogits));
  if (put_grads(d, m) || put_state(d, m, "after", 1)) return 1;
  dt_model_set_training(m, 0);
  TRY("eval forward", dt_model_forward(m, x, batch, &y));
  if (put_f32(d, "eval/logits", 2, os, y)) return 1;
  mask_dump = d;
  if (masks && relu_masks_put(m, "fashioncnn", batch, classes, x, train_logits, put_mask)) return 1;
  free(train_logits);
  free(x);
  free(dlogits);
  free(labels);
  return 0;
}

static int run_sgd(dump *d, dt_model *m, const char *xpath, const char *ypath, int steps, int batch) {
  const int classes = 10;
  size_t nx = (size_t)steps * batch * 784, ny = (size_t)steps * batch;
  float *x = malloc(sizeof(float) * nx), *dlogits = malloc(sizeof(float) * (size_t)batch * classes),
        *losses = malloc(sizeof(float) * (size_t)steps);
  int32_t *labels = malloc(sizeof(int32_t) * ny);
  FILE *fx = fopen(xpath, "rb"), *fy = fopen(ypath, "rb");
  if (!x || !dlogits || !losses || !labels || !fx || !fy) return 1;
  if (fread(x, sizeof(float), nx, fx) != nx || fread(labels, sizeof(int32_t), ny, fy) != ny) {
    fprintf(stderr, "dump_model: short data files\n");
    return 1;
  }
  fclose(fx);
  fclose(fy);
  if (put_state(d, m, "init", 0)) return 1;
  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_SGD, &oc);
  oc.momentum = 0.9f;
  size_t n;
  float *params = dt_model_params(m, &n);
  dt_optim *opt = NULL;
  TRY("optimizer", dt_optim_new(&oc, n, &opt));
  dt_model_set_training(m, 1);
  for (int s = 0; s < steps; s++) {
    const float *y;
    const float *xb = x + (size_t)s * batch * 784;
    const int32_t *lb = labels + (size_t)s * batch;
    TRY("forward", dt_model_forward(m, xb, batch, &y));
    TRY("loss", dt_loss_cross_entropy(y, lb, batch, classes, 0.0f, &losses[s], dlogits));
    dt_model_zero_grad(m);
    TRY("backward", dt_model_backward(m, dlogits));
    TRY("step", dt_optim_step(opt, params, dt_model_grads(m, NULL), 0.01f));
  }
  int64_t ls[1] = {steps};
  if (put_f32(d, "losses", 1, ls, losses) || put_state(d, m, "final", 0)) return 1;
  dt_optim_free(opt);
  free(x);
  free(dlogits);
  free(losses);
  free(labels);
  return 0;
}

/* (1, 28, 28) -> 10 through average pooling: conv, AvgPool2d(3, 2, 1) to 14x14, ReLU, AvgPool2d(2) to 7x7, fc. */
static dt_status avgpool_model(dt_model **out) {
  const int64_t shape[3] = {1, 28, 28};
  dt_model *m = NULL;
  dt_status st = dt_model_new(3, shape, &m);
  if (st == DT_OK) st = dt_model_add_conv2d(m, "conv", 4, 3, 1, 1, 1);
  if (st == DT_OK) st = dt_model_add_avgpool2d(m, "pool1", 3, 2, 1);
  if (st == DT_OK) st = dt_model_add_activation(m, "relu", DT_RELU);
  if (st == DT_OK) st = dt_model_add_avgpool2d(m, "pool2", 2, 0, 0);
  if (st == DT_OK) st = dt_model_add_flatten(m, "flat");
  if (st == DT_OK) st = dt_model_add_linear(m, "fc", 10, 1);
  if (st != DT_OK) {
    dt_model_free(m);
    return st;
  }
  *out = m;
  return DT_OK;
}

int main(int argc, char **argv) {
  int avgpool = argc >= 3 && strcmp(argv[1], "avgpool") == 0;
  if (argc < 3 || (strcmp(argv[1], "grad") != 0 && strcmp(argv[1], "sgd") != 0 && !avgpool) ||
      (strcmp(argv[1], "sgd") == 0 && argc != 7)) {
    fprintf(stderr, "usage: dump_model grad <out_dir> [batch]\n"
                    "       dump_model avgpool <out_dir> [batch]\n"
                    "       dump_model sgd <out_dir> <inputs.f32> <labels.i32> <steps> <batch>\n");
    return 2;
  }
  int sgd = strcmp(argv[1], "sgd") == 0;
  int batch = sgd ? atoi(argv[6]) : argc > 3 ? atoi(argv[3]) : 8;
  if (batch < 2) batch = 2;
  char path[1024];
  dump d = {0};
  snprintf(path, sizeof path, "%s/tensors.bin", argv[2]);
  d.bin = fopen(path, "wb");
  snprintf(path, sizeof path, "%s/index.txt", argv[2]);
  d.idx = fopen(path, "w");
  if (!d.bin || !d.idx) {
    fprintf(stderr, "dump_model: cannot write into %s\n", argv[2]);
    return 1;
  }
  dt_zoo_config cfg = {.ndim = 3, .input_shape = {1, 28, 28}, .outputs = 10, .dropout = 0.0f};
  dt_model *m = NULL;
  if (avgpool)
    TRY("model", avgpool_model(&m));
  else
    TRY("zoo", dt_model_zoo_new("fashioncnn", &cfg, &m));
  TRY("build", dt_model_build(m, batch, 1234));
  const int amp_on = !sgd && argc > 4;
  if (amp_on) {
    dt_amp amp;
    TRY("amp", dt_amp_parse(argv[4], &amp));
    TRY("amp", dt_model_ctx_set_amp(m, dt_model_default_ctx(m), amp));
  }
  int rc = sgd ? run_sgd(&d, m, argv[3], argv[4], atoi(argv[5]), batch) : run_grad(&d, m, batch, !avgpool && !amp_on);
  dt_model_free(m);
  if (fclose(d.bin) != 0 || fclose(d.idx) != 0) rc = 1;
  return rc;
}
