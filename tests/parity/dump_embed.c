/* Runs the mf and ncf zoo models (row tables) on seeded weights and batches and writes weights, outputs, gradients
 * and the parameters after several optimizer steps (dense Adam, row-wise SparseAdam, dense and row-wise SGD) for
 * test_embed_torch.py. Usage: dump_embed OUT_PREFIX -> OUT_PREFIX.bin and OUT_PREFIX.idx (the format of dump_io.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "dtrain/model_ctx.h"
#include "dump_io.h"

#define USERS 7
#define ITEMS 11
#define FACTORS 5
#define MAX_BATCH 16
#define STEPS 5
#define L2 0.05f
#define ADAM_LR 0.01f
#define SGD_LR 0.1f

static const int64_t vocab[2] = {USERS, ITEMS};
static const int ncf_hidden[2] = {8, 4};

/* The batches of the optimizer runs; batch 0 is also the forward/backward batch. Batch 0 repeats users
 * (3 three times, 0 and 5 twice) and items (7 three times, 2 twice) and leaves users 2 and 4 untouched. */
static const int batch_size[STEPS] = {9, 6, 8, 5, 9};
static int32_t batch_x[STEPS][MAX_BATCH * 2];
static float batch_y[STEPS][MAX_BATCH];

static void die(const char *what) {
  fprintf(stderr, "dump_embed: %s: %s\n", what, dt_last_error());
  exit(1);
}

static void make_batches(void) {
  static const int32_t first[9][2] = {{0, 2}, {3, 7}, {3, 2}, {5, 10}, {1, 4}, {3, 7}, {0, 7}, {6, 0}, {5, 9}};
  dt_rng r;
  dt_rng_init(&r, 2024, 1);
  for (int s = 0; s < STEPS; s++) {
    for (int b = 0; b < batch_size[s]; b++) {
      if (s == 0) {
        batch_x[s][2 * b] = first[b][0];
        batch_x[s][2 * b + 1] = first[b][1];
      } else { /* odd steps: the lower users and items, even steps the upper ones, so rows skip steps */
        const int hi = s % 2 == 0;
        batch_x[s][2 * b] = (int32_t)(hi * 3 + (int)dt_rng_below(&r, 4));
        batch_x[s][2 * b + 1] = (int32_t)(hi * 5 + (int)dt_rng_below(&r, 6));
      }
      batch_y[s][b] = 1.0f + 0.5f * (float)dt_rng_below(&r, 9); /* ratings 1, 1.5, ..., 5 */
    }
  }
}

/* The zoo model `name` ("mf" or "ncf") with embedding L2 l2, every parameter drawn from U(-0.6, 0.6) by a
 * fixed stream (the same values for both l2), the global bias from U(2.9, 4.1). */
static dt_model *build(const char *name, float l2) {
  const dt_zoo_config cfg = {.ndim = 1, .input_shape = {2}, .outputs = 1, .task = DT_TASK_REGRESSION,
                             .hidden = ncf_hidden, .n_hidden = 2, .dropout = 0, .n_index = 2, .index_size = vocab,
                             .factors = FACTORS, .target_mean = 3.5f, .l2 = l2};
  dt_model *m = NULL;
  if (dt_model_zoo_new(name, &cfg, &m) != DT_OK || dt_model_build(m, MAX_BATCH, 1) != DT_OK) die(name);
  dt_rng r;
  dt_rng_init(&r, 77, 0);
  for (int i = 0; i < dt_model_num_tensors(m); i++) {
    dt_tensor_info ti;
    if (dt_model_tensor_info(m, i, &ti) != DT_OK) die("tensor info");
    float *p = dt_model_tensor_data(m, i);
    size_t n = 1;
    for (int d = 0; d < ti.ndim; d++) n *= (size_t)ti.shape[d];
    const int mean = strcmp(ti.name, "global_bias") == 0;
    for (size_t j = 0; j < n; j++) p[j] = dt_rng_uniform_range(&r, mean ? 2.9f : -0.6f, mean ? 4.1f : 0.6f);
  }
  return m;
}

static dt_task *mse_task(void) {
  const dt_task_config c = {.kind = DT_TASK_REGRESSION, .outputs = 1, .regression_loss = DT_LOSS_MSE};
  dt_task *t = NULL;
  if (dt_task_new(&c, &t) != DT_OK) die("task");
  return t;
}

/* Every f32 tensor of m, from the parameter arena (what = "init", a run's name) or the gradient arena
 * (what = "grad"), as TAG.WHAT.<state_dict name>. */
static void put_tensors(dt_model *m, const char *tag, const char *what) {
  const float *grads = dt_model_grads(m, NULL);
  for (int i = 0; i < dt_model_num_tensors(m); i++) {
    dt_tensor_info ti;
    if (dt_model_tensor_info(m, i, &ti) != DT_OK) die("tensor info");
    const float *p = strcmp(what, "grad") == 0 ? grads + ti.offset : dt_model_tensor_data(m, i);
    int dims[DT_MAX_DIMS];
    for (int d = 0; d < ti.ndim; d++) dims[d] = (int)ti.shape[d];
    char name[160];
    snprintf(name, sizeof name, "%s.%s.%s", tag, what, ti.name);
    dump_put(name, "f32", p, 4, ti.ndim, dims);
  }
}

/* Forward, MSE loss and backward of batch s from zeroed gradients; the loss into *loss. */
static const float *train_batch(dt_model *m, const dt_task *t, int s, float *loss) {
  const int B = batch_size[s];
  float dout[MAX_BATCH];
  const float *out = NULL;
  dt_model_zero_grad(m);
  if (dt_model_forward(m, batch_x[s], B, &out) != DT_OK) die("forward");
  if (dt_task_loss(t, out, batch_y[s], B, 1, loss, dout) != DT_OK) die("loss");
  if (dt_model_backward(m, dout) != DT_OK) die("backward");
  return out;
}

/* Output, loss and every gradient of batch 0 (TAG.out, TAG.loss, TAG.grad.*), and the weights (TAG.init.*). */
static void grad_case(const char *name, float l2, const char *tag) {
  dt_model *m = build(name, l2);
  dt_task *t = mse_task();
  char key[64];
  snprintf(key, sizeof key, "%s.l2", tag);
  PUTF(key, &l2, 1);
  put_tensors(m, tag, "init");
  float loss;
  const float *out = train_batch(m, t, 0, &loss);
  snprintf(key, sizeof key, "%s.out", tag);
  PUTF(key, out, batch_size[0], 1);
  snprintf(key, sizeof key, "%s.loss", tag);
  PUTF(key, &loss, 1);
  put_tensors(m, tag, "grad");
  dt_task_free(t);
  dt_model_free(m);
}

/* STEPS optimizer steps of model `name` (L2 on) over the batches: row-wise (dt_optim_step_rows over every row
 * table) or dense (dt_optim_step); the parameters after them as TAG.RUN.*. */
static void optim_case(const char *name, dt_optim_kind kind, int rows, const char *tag, const char *run) {
  dt_model *m = build(name, L2);
  dt_task *t = mse_task();
  dt_optim_config oc;
  dt_optim_config_default(kind, &oc);
  size_t count = 0;
  float *params = dt_model_params(m, &count), *grads = dt_model_grads(m, NULL);
  dt_optim *o = NULL;
  if (dt_optim_new(&oc, count, &o) != DT_OK) die("optimizer");
  const int n_tables = dt_model_num_row_tables(m);
  dt_rows tables[8];
  if (n_tables < 1 || n_tables > 8) die("row tables");
  const float lr = kind == DT_OPTIM_SGD ? SGD_LR : ADAM_LR;
  for (int s = 0; s < STEPS; s++) {
    float loss;
    train_batch(m, t, s, &loss);
    for (int k = 0; k < n_tables; k++) dt_model_ctx_rows(m, dt_model_default_ctx(m), k, &tables[k]);
    const dt_status st = rows ? dt_optim_step_rows(o, params, grads, lr, tables, n_tables)
                              : dt_optim_step(o, params, grads, lr);
    if (st != DT_OK) die(run);
  }
  put_tensors(m, tag, run);
  dt_optim_free(o);
  dt_task_free(t);
  dt_model_free(m);
}

int main(int argc, char **argv) {
  int rc = dump_open(argc, argv);
  if (rc) return rc;
  make_batches();
  for (int s = 0; s < STEPS; s++) {
    char key[32];
    snprintf(key, sizeof key, "batch%d.x", s);
    PUTI(key, batch_x[s], batch_size[s], 2);
    snprintf(key, sizeof key, "batch%d.y", s);
    PUTF(key, batch_y[s], batch_size[s], 1);
  }
  const float l2_on = L2;
  PUTF("l2", &l2_on, 1);
  static const char *const models[2] = {"mf", "ncf"};
  for (int i = 0; i < 2; i++) {
    char tag[32];
    snprintf(tag, sizeof tag, "%s_l2", models[i]);
    grad_case(models[i], L2, tag);
    snprintf(tag, sizeof tag, "%s_plain", models[i]);
    grad_case(models[i], 0.0f, tag);
    optim_case(models[i], DT_OPTIM_ADAM, 0, models[i], "adam_dense");
    optim_case(models[i], DT_OPTIM_ADAM, 1, models[i], "adam_rows");
    optim_case(models[i], DT_OPTIM_SGD, 0, models[i], "sgd_dense");
    optim_case(models[i], DT_OPTIM_SGD, 1, models[i], "sgd_rows");
  }
  return dump_close();
}
