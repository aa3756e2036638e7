/* Runs the task losses and ROC-AUC on seeded random inputs and writes inputs and results for test_task_torch.py.
 * Usage: dump_task OUT_PREFIX -> OUT_PREFIX.bin and OUT_PREFIX.idx (the format of dump_io.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "dump_io.h"

static dt_rng rng;

static void *alloc(size_t n, size_t elem) {
  void *p = calloc(n ? n : 1, elem);
  if (!p) exit(2);
  return p;
}
static float *randf(size_t n, float lo, float hi) {
  float *p = alloc(n, sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = dt_rng_uniform_range(&rng, lo, hi);
  return p;
}

static dt_task *task(dt_task_kind kind, int outputs, float smoothing, const float *pos_weight, dt_regression_loss rl) {
  const dt_task_config c = {.kind = kind, .outputs = outputs, .label_smoothing = smoothing, .pos_weight = pos_weight,
                            .regression_loss = rl};
  dt_task *t = NULL;
  if (dt_task_new(&c, &t) != DT_OK) {
    fprintf(stderr, "task: %s\n", dt_last_error());
    exit(1);
  }
  return t;
}

/* loss and d(loss)/d(out) of t on (out, target) as TAG.loss and TAG.dout (B, K). */
static void loss_case(const char *tag, const dt_task *t, const float *out, const void *target, int B, int K, int train) {
  float loss, *dout = alloc((size_t)B * K, sizeof(float));
  if (dt_task_loss(t, out, target, B, train, &loss, dout) != DT_OK) {
    fprintf(stderr, "%s: %s\n", tag, dt_last_error());
    exit(1);
  }
  char name[64];
  snprintf(name, sizeof name, "%s.loss", tag);
  PUTF(name, &loss, 1);
  snprintf(name, sizeof name, "%s.dout", tag);
  PUTF(name, dout, B, K);
  free(dout);
}

/* BCEWithLogits over (B, K), with and without pos_weight: 0/1 and soft targets, some saturated logits. */
static void bce_cases(void) {
  const int B = 6, K = 4;
  float *x = randf((size_t)B * K, -4, 4), *y = alloc((size_t)B * K, sizeof(float));
  for (int i = 0; i < B * K; i++) y[i] = (float)dt_rng_below(&rng, 2);
  y[3] = 0.3f;
  x[5] = 30.0f, x[6] = -30.0f, x[7] = 25.0f, x[8] = -40.0f;
  const float pw[4] = {1.0f, 2.5f, 0.25f, 7.0f};
  dt_task *plain = task(DT_TASK_MULTILABEL, K, 0, NULL, DT_LOSS_MSE), *weighted = task(DT_TASK_MULTILABEL, K, 0, pw, DT_LOSS_MSE);
  PUTF("bce.x", x, B, K);
  PUTF("bce.y", y, B, K);
  PUTF("bce.pos_weight", pw, K);
  loss_case("bce", plain, x, y, B, K, 1);
  loss_case("bce_pw", weighted, x, y, B, K, 1);
  dt_task_free(plain);
  dt_task_free(weighted);
  free(x), free(y);
}

/* MSE and L1 over (B, K); one exact tie, where both take the subgradient 0. */
static void regression_cases(void) {
  const int B = 5, K = 3;
  float *x = randf((size_t)B * K, -2, 2), *y = randf((size_t)B * K, -2, 2);
  y[4] = x[4];
  dt_task *mse = task(DT_TASK_REGRESSION, K, 0, NULL, DT_LOSS_MSE), *l1 = task(DT_TASK_REGRESSION, K, 0, NULL, DT_LOSS_L1);
  PUTF("reg.x", x, B, K);
  PUTF("reg.y", y, B, K);
  loss_case("mse", mse, x, y, B, K, 1);
  loss_case("l1", l1, x, y, B, K, 1);
  dt_task_free(mse);
  dt_task_free(l1);
  free(x), free(y);
}

/* Cross entropy with label smoothing 0.1 (training) and without (evaluation, train = 0). */
static void ce_cases(void) {
  const int B = 7, C = 6;
  float *x = randf((size_t)B * C, -5, 5);
  int32_t y[7];
  for (int b = 0; b < B; b++) y[b] = (int32_t)dt_rng_below(&rng, C);
  x[0] = 60.0f; /* a large logit: stability */
  dt_task *t = task(DT_TASK_CLASSIFICATION, C, 0.1f, NULL, DT_LOSS_MSE);
  PUTF("ce.x", x, B, C);
  PUTI("ce.y", y, B);
  loss_case("ce_train", t, x, y, B, C, 1);
  loss_case("ce_eval", t, x, y, B, C, 0);
  dt_task_free(t);
  free(x);
}

/* ROC-AUC of scores rounded to one decimal (many ties), several sizes and positive rates; one also with stride 3. */
static void auc_cases(void) {
  const int sizes[6] = {2, 7, 50, 333, 1000, 4096};
  const float rates[6] = {0.5f, 0.3f, 0.5f, 0.1f, 0.7f, 0.02f};
  for (int c = 0; c < 6; c++) {
    const int n = sizes[c];
    float *s = alloc((size_t)n, sizeof(float)), *y = alloc((size_t)n, sizeof(float));
    for (int i = 0; i < n; i++) {
      y[i] = dt_rng_uniform(&rng) < rates[c] ? 1.0f : 0.0f;
      /* informative but overlapping, on a 0.1 grid */
      s[i] = roundf((dt_rng_uniform(&rng) + 0.3f * y[i]) * 10.0f) / 10.0f;
    }
    if (n == 2) y[0] = 0.0f, y[1] = 1.0f, s[0] = s[1] = 0.5f;
    y[n - 1] = 1.0f - y[0]; /* both classes */
    double auc = dt_roc_auc(s, y, n, 1);
    char name[64];
    snprintf(name, sizeof name, "auc%d.s", n);
    PUTF(name, s, n);
    snprintf(name, sizeof name, "auc%d.y", n);
    PUTF(name, y, n);
    snprintf(name, sizeof name, "auc%d.auc", n);
    PUTD(name, &auc, 1);
    if (n == 333) {
      float *rows = alloc((size_t)n * 3, sizeof(float));
      for (int i = 0; i < n; i++) rows[3 * i] = y[i], rows[3 * i + 1] = -1.0f, rows[3 * i + 2] = s[i];
      const double strided = dt_roc_auc(rows + 2, rows, n, 3);
      PUTD("auc333.strided", &strided, 1);
      free(rows);
    }
    free(s), free(y);
  }
}

/* A multilabel evaluation pass in two batches: mean ROC-AUC over labels and accuracy at logit 0. */
static void multilabel_eval_case(void) {
  const int B = 300, K = 3;
  float *x = alloc((size_t)B * K, sizeof(float)), *y = alloc((size_t)B * K, sizeof(float));
  for (int i = 0; i < B * K; i++) {
    y[i] = dt_rng_uniform(&rng) < 0.4f ? 1.0f : 0.0f;
    x[i] = roundf((dt_rng_normal(&rng) + (float)(i % K + 1) * 0.4f * y[i]) * 4.0f) / 4.0f;
  }
  dt_task *t = task(DT_TASK_MULTILABEL, K, 0, NULL, DT_LOSS_MSE);
  dt_metric_acc *a = NULL;
  if (dt_metric_acc_new(t, 1, &a) != DT_OK || dt_metric_acc_add(a, x, y, 120, 0.0) != DT_OK ||
      dt_metric_acc_add(a, x + 120 * K, y + 120 * K, B - 120, 0.0) != DT_OK) {
    fprintf(stderr, "metric acc: %s\n", dt_last_error());
    exit(1);
  }
  double v[DT_MAX_METRICS];
  dt_metric_acc_values(a, 0, v);
  PUTF("mlacc.x", x, B, K);
  PUTF("mlacc.y", y, B, K);
  PUTD("mlacc.values", v, 2);
  dt_metric_acc_free(a);
  dt_task_free(t);
  free(x), free(y);
}

int main(int argc, char **argv) {
  int rc = dump_open(argc, argv);
  if (rc) return rc;
  dt_rng_init(&rng, 4321, 0);
  bce_cases();
  regression_cases();
  ce_cases();
  auc_cases();
  multilabel_eval_case();
  return dump_close();
}
