/* Tests of the tasks: loss gradients by finite differences, hand-computed losses and metrics, exact ROC-AUC, the metric accumulator, metric sets and bad input. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---- helpers --------------------------------------------------------------- */

static dt_task *make_task(dt_task_kind kind, int outputs, float smoothing, const float *pos_weight,
                          dt_regression_loss rl) {
  const dt_task_config c = {.kind = kind, .outputs = outputs, .label_smoothing = smoothing, .pos_weight = pos_weight,
                            .regression_loss = rl};
  dt_task *t = NULL;
  if (dt_task_new(&c, &t) != DT_OK) {
    fprintf(stderr, "  dt_task_new: %s\n", dt_last_error());
    return NULL;
  }
  return t;
}

/* Largest |finite difference - dout| over the outputs, relative to max |dout|:
 * central differences of dt_task_loss in double over the float step actually
 * taken. -1 if a call fails. out (n, outputs) is restored. */
static double grad_error(const dt_task *t, float *out, const void *target, int n, int train, double h) {
  const size_t m = (size_t)n * (size_t)dt_task_config_of(t)->outputs;
  float *dout = calloc(m, sizeof(float));
  if (!dout) return -1;
  float loss;
  double err = 0, scale = 0;
  if (dt_task_loss(t, out, target, n, train, &loss, dout) != DT_OK) goto fail;
  for (size_t i = 0; i < m; i++) scale = fmax(scale, fabs(dout[i]));
  for (size_t i = 0; i < m; i++) {
    const float x = out[i], hi = (float)(x + h), lo = (float)(x - h);
    float lhi, llo;
    out[i] = hi;
    dt_status s1 = dt_task_loss(t, out, target, n, train, &lhi, NULL);
    out[i] = lo;
    dt_status s2 = dt_task_loss(t, out, target, n, train, &llo, NULL);
    out[i] = x;
    if (s1 != DT_OK || s2 != DT_OK) goto fail;
    const double fd = ((double)lhi - (double)llo) / ((double)hi - (double)lo);
    err = fmax(err, fabs(fd - (double)dout[i]));
  }
  free(dout);
  return err / fmax(scale, 1e-30);
fail:
  free(dout);
  return -1;
}

static void fill_uniform(dt_rng *r, float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = dt_rng_uniform_range(r, lo, hi);
}

/* The detail must contain `want`. */
#define ASSERT_HAS(detail, want)                                                          \
  do {                                                                                    \
    const char *d_ = (detail);                                                            \
    if (!strstr(d_, want)) FAIL_("\"%s\" lacks \"%s\"", d_, want);                        \
  } while (0)

/* ---- gradients by finite differences ----------------------------------------- */

TEST(grad_classification) {
  enum { B = 4, C = 5 };
  dt_rng r;
  dt_rng_init(&r, 11, 0);
  float out[B * C];
  int32_t y[B];
  fill_uniform(&r, out, B * C, -3, 3);
  for (int b = 0; b < B; b++) y[b] = (int32_t)dt_rng_below(&r, C);
  dt_task *plain = make_task(DT_TASK_CLASSIFICATION, C, 0.0f, NULL, DT_LOSS_MSE);
  dt_task *smooth = make_task(DT_TASK_CLASSIFICATION, C, 0.2f, NULL, DT_LOSS_MSE);
  ASSERT(plain && smooth);
  double e;
  ASSERT_MSG((e = grad_error(plain, out, y, B, 1, 1e-2)) >= 0 && e < 1e-3, dt_last_error());
  ASSERT_MSG((e = grad_error(smooth, out, y, B, 1, 1e-2)) >= 0 && e < 1e-3, dt_last_error());
  ASSERT_MSG((e = grad_error(smooth, out, y, B, 0, 1e-2)) >= 0 && e < 1e-3, dt_last_error());

  /* train = 0 drops the smoothing: the loss and gradient of the plain task, and not those of train = 1 */
  float l_plain, l_eval, l_train, g_plain[B * C], g_eval[B * C], g_train[B * C];
  ASSERT_OK(dt_task_loss(plain, out, y, B, 1, &l_plain, g_plain));
  ASSERT_OK(dt_task_loss(smooth, out, y, B, 0, &l_eval, g_eval));
  ASSERT_OK(dt_task_loss(smooth, out, y, B, 1, &l_train, g_train));
  ASSERT(l_eval == l_plain);
  ASSERT(memcmp(g_eval, g_plain, sizeof g_plain) == 0);
  ASSERT(fabsf(l_train - l_plain) > 1e-3f);
  /* each row of the gradient sums to 0 (softmax minus a distribution) */
  for (int b = 0; b < B; b++) {
    double s = 0;
    for (int c = 0; c < C; c++) s += g_train[b * C + c];
    ASSERT_NEAR(s, 0.0, 1e-6);
  }
  dt_task_free(plain);
  dt_task_free(smooth);
}

TEST(grad_multilabel) {
  enum { B = 3, K = 4 };
  dt_rng r;
  dt_rng_init(&r, 12, 0);
  float out[B * K], y[B * K];
  fill_uniform(&r, out, B * K, -3, 3);
  for (int i = 0; i < B * K; i++) y[i] = (float)(dt_rng_below(&r, 2));
  /* soft targets are allowed in [0, 1]; and large |logits| with both targets */
  y[1] = 0.25f;
  out[2] = 30.0f, y[2] = 0.0f;
  out[5] = -30.0f, y[5] = 1.0f;
  out[6] = 30.0f, y[6] = 1.0f;
  out[9] = -30.0f, y[9] = 0.0f;
  const float pw[K] = {1.0f, 3.0f, 0.5f, 2.0f};
  dt_task *plain = make_task(DT_TASK_MULTILABEL, K, 0.0f, NULL, DT_LOSS_MSE);
  dt_task *weighted = make_task(DT_TASK_MULTILABEL, K, 0.0f, pw, DT_LOSS_MSE);
  ASSERT(plain && weighted);
  double e;
  ASSERT_MSG((e = grad_error(plain, out, y, B, 1, 1e-2)) >= 0 && e < 1e-3, dt_last_error());
  ASSERT_MSG((e = grad_error(weighted, out, y, B, 1, 1e-2)) >= 0 && e < 1e-3, dt_last_error());

  /* pos_weight changes the positive terms only */
  float lp, lw, gp[B * K], gw[B * K];
  ASSERT_OK(dt_task_loss(plain, out, y, B, 1, &lp, gp));
  ASSERT_OK(dt_task_loss(weighted, out, y, B, 1, &lw, gw));
  ASSERT(isfinite(lp) && isfinite(lw) && lw != lp);
  for (int i = 0; i < B * K; i++) {
    ASSERT(isfinite(gp[i]) && isfinite(gw[i]));
    if (y[i] == 0.0f) ASSERT(gp[i] == gw[i]);
  }
  /* saturated logits: the gradient is exact, (sigmoid(x) - y) / n */
  ASSERT_NEAR(gp[2], 1.0 / (B * K), 1e-6);  /* x = 30, y = 0 */
  ASSERT_NEAR(gp[5], -1.0 / (B * K), 1e-6); /* x = -30, y = 1 */
  ASSERT(fabsf(gp[6]) < 1e-9f && fabsf(gp[9]) < 1e-9f);
  ASSERT_NEAR(gw[5], -pw[1] / (B * K), 1e-6);

  /* logits beyond the range of exp even in double stay finite: log1p(exp(-|x|)) form */
  float big[2] = {1000.0f, -1000.0f}, t01[2] = {0.0f, 1.0f}, l, g[2];
  ASSERT_OK(dt_loss_bce_with_logits(big, t01, 1, 2, NULL, &l, g));
  ASSERT_NEAR(l, 1000.0, 1e-6);
  ASSERT_NEAR(g[0], 0.5, 1e-7);
  ASSERT_NEAR(g[1], -0.5, 1e-7);
  dt_task_free(plain);
  dt_task_free(weighted);
}

TEST(grad_regression) {
  enum { B = 3, K = 2 };
  dt_rng r;
  dt_rng_init(&r, 13, 0);
  float out[B * K], y[B * K];
  fill_uniform(&r, y, B * K, -1, 1);
  /* differences at least 0.1 away from 0 so L1 has no kink within the step */
  for (int i = 0; i < B * K; i++) out[i] = y[i] + (i % 2 ? 1.0f : -1.0f) * dt_rng_uniform_range(&r, 0.1f, 1.0f);
  dt_task *mse = make_task(DT_TASK_REGRESSION, K, 0.0f, NULL, DT_LOSS_MSE);
  dt_task *l1 = make_task(DT_TASK_REGRESSION, K, 0.0f, NULL, DT_LOSS_L1);
  ASSERT(mse && l1);
  double e;
  ASSERT_MSG((e = grad_error(mse, out, y, B, 1, 1e-2)) >= 0 && e < 1e-3, dt_last_error());
  ASSERT_MSG((e = grad_error(l1, out, y, B, 1, 1e-3)) >= 0 && e < 1e-3, dt_last_error());
  ASSERT_STR_EQ(dt_task_metrics(mse)->loss_label, "MSE loss");
  ASSERT_STR_EQ(dt_task_metrics(l1)->loss_label, "L1 loss");
  dt_task_free(mse);
  dt_task_free(l1);
}

/* ---- exact values -------------------------------------------------------------- */

TEST(bce_hand_computed) {
  /* logit 0 against 1: log 2; logit 2 against 0: log(1 + e^2) */
  const float x[2] = {0.0f, 2.0f}, y[2] = {1.0f, 0.0f};
  float l, g[2];
  ASSERT_OK(dt_loss_bce_with_logits(x, y, 1, 2, NULL, &l, g));
  ASSERT_NEAR(l, (log(2.0) + log1p(exp(2.0))) / 2, 1e-7);
  ASSERT_NEAR(g[0], -0.25, 1e-7);                        /* (sigmoid(0) - 1) / 2 */
  ASSERT_NEAR(g[1], 0.5 / (1 + exp(-2.0)), 1e-7);        /* sigmoid(2) / 2 */
  /* pos_weight 3 on label 0 triples its positive term */
  const float pw[2] = {3.0f, 1.0f};
  ASSERT_OK(dt_loss_bce_with_logits(x, y, 1, 2, pw, &l, g));
  ASSERT_NEAR(l, (3 * log(2.0) + log1p(exp(2.0))) / 2, 1e-7);
  ASSERT_NEAR(g[0], -0.75, 1e-7);
  /* the same through a multilabel task, two samples of one label: pos_weight is per label (column) */
  dt_task *t = make_task(DT_TASK_MULTILABEL, 1, 0.0f, pw, DT_LOSS_MSE);
  ASSERT(t != NULL);
  ASSERT_OK(dt_task_loss(t, x, y, 2, 1, &l, g));
  ASSERT_NEAR(l, (3 * log(2.0) + log1p(exp(2.0))) / 2, 1e-7);
  dt_task_free(t);
}

TEST(mse_l1_hand_computed) {
  /* differences 1, 0, -2, -0.5 */
  const float out[4] = {1, 2, 3, 4}, y[4] = {0, 2, 5, 4.5f};
  float l, g[4];
  ASSERT_OK(dt_loss_mse(out, y, 2, 2, &l, g));
  ASSERT(l == 1.3125f); /* (1 + 0 + 4 + 0.25) / 4 */
  ASSERT(g[0] == 0.5f && g[1] == 0.0f && g[2] == -1.0f && g[3] == -0.25f);
  ASSERT_OK(dt_loss_l1(out, y, 2, 2, &l, g));
  ASSERT(l == 0.875f); /* 3.5 / 4 */
  ASSERT(g[0] == 0.25f && g[1] == 0.0f && g[2] == -0.25f && g[3] == -0.25f);

  /* RMSE and MAE from the accumulator, over two batches of one sample */
  dt_task *t = make_task(DT_TASK_REGRESSION, 2, 0.0f, NULL, DT_LOSS_MSE);
  ASSERT(t != NULL);
  dt_metric_acc *a = NULL;
  ASSERT_OK(dt_metric_acc_new(t, 1, &a));
  ASSERT_OK(dt_metric_acc_add(a, out, y, 1, 0.5));
  ASSERT_OK(dt_metric_acc_add(a, out + 2, y + 2, 1, 2.125));
  double v[DT_MAX_METRICS];
  dt_metric_acc_values(a, 0, v);
  ASSERT_NEAR(v[0], sqrt(1.3125), 1e-12);
  ASSERT_NEAR(v[1], 0.875, 1e-12);
  dt_metric_acc_values(a, 1, v);
  ASSERT_NEAR(v[0], sqrt(1.3125), 1e-12);
  ASSERT_NEAR(v[1], 0.875, 1e-12);
  ASSERT_EQ(dt_metric_acc_samples(a), 2);
  ASSERT_NEAR(dt_metric_acc_loss(a), 1.3125, 1e-12);
  char json[64] = "x";
  ASSERT_OK(dt_metric_acc_detail_json(a, json, sizeof json));
  ASSERT_STR_EQ(json, ""); /* regression has no detail */
  dt_metric_acc_free(a);
  dt_task_free(t);
}

TEST(multilabel_accuracy_and_auc) {
  /* B = 2, K = 3. Predictions (logit > 0): 1 0 0 / 1 0 1 against 1 0 0 / 0 1 1: 4 of 6 right.
   * AUC per label: {3 vs 0.5} ranks the positive first: 1; {-1, -2} ranks it last: 0; {0, 1}: 1. */
  const float x[6] = {3, -1, 0, 0.5f, -2, 1}, y[6] = {1, 0, 0, 0, 1, 1};
  dt_task *t = make_task(DT_TASK_MULTILABEL, 3, 0.0f, NULL, DT_LOSS_MSE);
  ASSERT(t != NULL);
  double sums[1] = {5};
  dt_task_count(t, x, y, 2, sums);
  ASSERT(sums[0] == 9); /* added, not overwritten */
  dt_metric_acc *a = NULL;
  ASSERT_OK(dt_metric_acc_new(t, 1, &a));
  ASSERT_OK(dt_metric_acc_add(a, x, y, 2, 0.7));
  double v[DT_MAX_METRICS];
  dt_metric_acc_values(a, 1, v);
  ASSERT_NEAR(v[0], 4.0 / 6, 1e-12);
  dt_metric_acc_values(a, 0, v);
  ASSERT_NEAR(v[0], 2.0 / 3, 1e-12);
  ASSERT_NEAR(v[1], 4.0 / 6, 1e-12);
  char json[256];
  ASSERT_OK(dt_metric_acc_detail_json(a, json, sizeof json));
  ASSERT_STR_EQ(json, "\"auc_per_label\":[1,0,1]");
  dt_metric_acc_free(a);

  /* a label with one class only is left out of the mean and shown as null */
  const float y1[6] = {1, 0, 0, 0, 0, 1};
  ASSERT_OK(dt_metric_acc_new(t, 1, &a));
  ASSERT_OK(dt_metric_acc_add(a, x, y1, 2, 0.7));
  dt_metric_acc_values(a, 0, v);
  ASSERT_NEAR(v[0], 1.0, 1e-12);
  ASSERT_OK(dt_metric_acc_detail_json(a, json, sizeof json));
  ASSERT_STR_EQ(json, "\"auc_per_label\":[1,null,1]");
  dt_metric_acc_free(a);
  dt_task_free(t);
}

/* ---- ROC-AUC ------------------------------------------------------------------------ */

TEST(roc_auc_exact) {
  const float s[4] = {0.1f, 0.2f, 0.7f, 0.8f};
  const float up[4] = {0, 0, 1, 1}, down[4] = {1, 1, 0, 0};
  ASSERT(dt_roc_auc(s, up, 4, 1) == 1.0);
  ASSERT(dt_roc_auc(s, down, 4, 1) == 0.0);
  const float tied[4] = {0.3f, 0.3f, 0.3f, 0.3f};
  ASSERT(dt_roc_auc(tied, up, 4, 1) == 0.5);
  /* sklearn's documented example: 0.75 */
  const float s2[4] = {0.1f, 0.4f, 0.35f, 0.8f};
  ASSERT(dt_roc_auc(s2, up, 4, 1) == 0.75);
  /* ties across classes count half: positives {0.5, 0.9}, negatives {0.5, 0.2, 0.5}:
   * (0.5 + 1 + 0.5) + 3 = 5 of 6 pairs */
  const float s3[5] = {0.5f, 0.5f, 0.2f, 0.9f, 0.5f}, y3[5] = {1, 0, 0, 1, 0};
  ASSERT_NEAR(dt_roc_auc(s3, y3, 5, 1), 5.0 / 6, 1e-15);
  /* one class absent, or nothing at all: NaN */
  const float ones[4] = {1, 1, 1, 1}, zeros[4] = {0};
  ASSERT(isnan(dt_roc_auc(s, ones, 4, 1)));
  ASSERT(isnan(dt_roc_auc(s, zeros, 4, 1)));
  ASSERT(isnan(dt_roc_auc(s, up, 0, 1)));
  /* stride: the same case interleaved with junk that must be ignored */
  float rows[5 * 3];
  for (int i = 0; i < 5; i++) {
    rows[3 * i] = s3[i];
    rows[3 * i + 1] = -7.0f;
    rows[3 * i + 2] = y3[i];
  }
  ASSERT_NEAR(dt_roc_auc(rows, rows + 2, 5, 3), 5.0 / 6, 1e-15);
}

/* ---- the accumulator -------------------------------------------------------------------- */

TEST(acc_two_batches_equal_one) {
  enum { B = 7, C = 4 };
  dt_rng r;
  dt_rng_init(&r, 14, 0);
  float x[B * C];
  int32_t y[B];
  fill_uniform(&r, x, B * C, -2, 2);
  for (int b = 0; b < B; b++) y[b] = (int32_t)dt_rng_below(&r, C);
  dt_task *t = make_task(DT_TASK_CLASSIFICATION, C, 0.0f, NULL, DT_LOSS_MSE);
  ASSERT(t != NULL);
  dt_metric_acc *one = NULL, *two = NULL;
  ASSERT_OK(dt_metric_acc_new(t, 1, &one));
  ASSERT_OK(dt_metric_acc_new(t, 1, &two));
  ASSERT_OK(dt_metric_acc_add(one, x, y, B, 1.5));
  ASSERT_OK(dt_metric_acc_add(two, x, y, 3, 1.0));
  ASSERT_OK(dt_metric_acc_add(two, x + 3 * C, y + 3, B - 3, 1.875));
  size_t n1, n2;
  const double *s1 = dt_metric_acc_sums(one, &n1), *s2 = dt_metric_acc_sums(two, &n2);
  /* samples, loss sum, top-1, top-k, per-class samples and correct (C each), confusion (C x C) */
  ASSERT_EQ(n1, 2 + dt_task_num_sums(t) + 2 * C + C * C);
  ASSERT_EQ(dt_task_num_sums(t), 2);
  ASSERT_EQ(n2, n1);
  for (size_t i = 0; i < n1; i++) ASSERT_MSG(s1[i] == s2[i], "state entry differs");
  ASSERT(s1[0] == B);
  ASSERT(s1[1] == 1.5 * B);
  /* the counters are those of dt_task_count and dt_topk_correct */
  double c[2] = {0, 0};
  dt_task_count(t, x, y, B, c);
  int64_t top1, top4;
  dt_topk_correct(x, y, B, C, C, &top1, &top4);
  ASSERT(s1[2] == c[0] && s1[3] == c[1] && c[0] == (double)top1 && c[1] == B);
  double per_class = 0, confusion = 0;
  for (int k = 0; k < C; k++) {
    per_class += s1[4 + k];
    ASSERT(s1[4 + C + k] <= s1[4 + k]);
  }
  for (int k = 0; k < C * C; k++) confusion += s1[4 + 2 * C + k];
  ASSERT(per_class == B && confusion == B);
  double v1[DT_MAX_METRICS], v2[DT_MAX_METRICS];
  dt_metric_acc_values(one, 0, v1);
  dt_metric_acc_values(two, 0, v2);
  ASSERT(v1[0] == v2[0] && v1[0] == (double)top1 / B);
  ASSERT(dt_metric_acc_loss(one) == dt_metric_acc_loss(two));

  /* add_sums: counters from elsewhere land in the same slots */
  dt_metric_acc *from_sums = NULL;
  ASSERT_OK(dt_metric_acc_new(t, 0, &from_sums));
  dt_metric_acc_add_sums(from_sums, B, 1.5 * B, c);
  size_t n3;
  const double *s3 = dt_metric_acc_sums(from_sums, &n3);
  ASSERT_EQ(n3, 4);
  for (size_t i = 0; i < n3; i++) ASSERT(s3[i] == s1[i]);

  /* reset: an empty pass */
  dt_metric_acc_reset(one);
  s1 = dt_metric_acc_sums(one, &n1);
  for (size_t i = 0; i < n1; i++) ASSERT(s1[i] == 0.0);
  ASSERT_EQ(dt_metric_acc_samples(one), 0);
  ASSERT(isnan(dt_metric_acc_loss(one)));
  dt_metric_acc_values(one, 0, v1);
  ASSERT(isnan(v1[0]));
  dt_metric_acc_free(one);
  dt_metric_acc_free(two);
  dt_metric_acc_free(from_sums);
  dt_metric_acc_free(NULL);
  dt_task_free(t);
}

TEST(acc_set_scores_multilabel) {
  enum { B = 40, K = 2 };
  dt_rng r;
  dt_rng_init(&r, 15, 0);
  float x[B * K], y[B * K];
  for (int i = 0; i < B * K; i++) {
    y[i] = (float)dt_rng_below(&r, 2);
    x[i] = (float)((int)dt_rng_below(&r, 5)) - 2.0f + y[i]; /* informative, with ties */
  }
  dt_task *t = make_task(DT_TASK_MULTILABEL, K, 0.0f, NULL, DT_LOSS_MSE);
  ASSERT(t != NULL);
  /* two "ranks" see half each; rank 0 then takes the gathered rows of both */
  dt_metric_acc *whole = NULL, *r0 = NULL, *r1 = NULL, *no_detail = NULL;
  ASSERT_OK(dt_metric_acc_new(t, 1, &whole));
  ASSERT_OK(dt_metric_acc_new(t, 1, &r0));
  ASSERT_OK(dt_metric_acc_new(t, 1, &r1));
  ASSERT_OK(dt_metric_acc_new(t, 0, &no_detail));
  ASSERT_OK(dt_metric_acc_add(whole, x, y, B, 0.5));
  ASSERT_OK(dt_metric_acc_add(r0, x, y, B / 2, 0.5));
  ASSERT_OK(dt_metric_acc_add(r1, x + B / 2 * K, y + B / 2 * K, B / 2, 0.5));
  ASSERT_OK(dt_metric_acc_add(no_detail, x, y, B, 0.5));
  int64_t n;
  ASSERT(dt_metric_acc_scores(no_detail, &n) == NULL);
  const float *rows0 = dt_metric_acc_scores(r0, &n);
  ASSERT(rows0 != NULL);
  ASSERT_EQ(n, B / 2);
  /* rows are (outputs, targets) */
  for (int i = 0; i < B / 2; i++)
    for (int k = 0; k < K; k++) ASSERT(rows0[i * 2 * K + k] == x[i * K + k] && rows0[i * 2 * K + K + k] == y[i * K + k]);
  float gathered[B * 2 * K];
  int64_t n1;
  memcpy(gathered, rows0, sizeof(float) * 2 * K * (size_t)n);
  const float *rows1 = dt_metric_acc_scores(r1, &n1);
  memcpy(gathered + n * 2 * K, rows1, sizeof(float) * 2 * K * (size_t)n1);
  /* the summable state is all-reduced in place; the rows replaced */
  size_t ns;
  double *st0 = dt_metric_acc_sums(r0, &ns);
  const double *st1 = dt_metric_acc_sums(r1, &ns);
  for (size_t i = 0; i < ns; i++) st0[i] += st1[i];
  double before[DT_MAX_METRICS], v[DT_MAX_METRICS], want[DT_MAX_METRICS];
  dt_metric_acc_values(r0, 0, before);
  ASSERT_OK(dt_metric_acc_set_scores(r0, gathered, n + n1));
  dt_metric_acc_values(r0, 0, v);
  dt_metric_acc_values(whole, 0, want);
  ASSERT(v[0] == want[0] && v[1] == want[1]);
  ASSERT(isfinite(want[0]) && want[0] > 0.5 && want[0] < 1.0);
  ASSERT(before[0] != want[0]); /* rank 0's own half alone gives another AUC */
  /* a mean over labels of the exact per-label AUCs */
  const float *rw = dt_metric_acc_scores(whole, &n);
  ASSERT_NEAR(want[0], (dt_roc_auc(rw, rw + K, B, 2 * K) + dt_roc_auc(rw + 1, rw + K + 1, B, 2 * K)) / 2, 1e-15);
  /* replacing with nothing leaves no AUC */
  ASSERT_OK(dt_metric_acc_set_scores(r0, NULL, 0));
  dt_metric_acc_values(r0, 0, v);
  ASSERT(isnan(v[0]));
  /* reset drops the kept rows */
  dt_metric_acc_reset(whole);
  ASSERT(dt_metric_acc_scores(whole, &n) != NULL);
  ASSERT_EQ(n, 0);
  dt_metric_acc_free(whole);
  dt_metric_acc_free(r0);
  dt_metric_acc_free(r1);
  dt_metric_acc_free(no_detail);
  dt_task_free(t);
}

TEST(acc_classification_detail_json) {
  /* 3 classes, true 0 0 1 2 2 2 predicted 0 1 1 2 0 2 (argmax of one-hot-ish logits) */
  const int32_t y[6] = {0, 0, 1, 2, 2, 2};
  const int pred[6] = {0, 1, 1, 2, 0, 2};
  float x[6 * 3];
  for (int i = 0; i < 6; i++)
    for (int c = 0; c < 3; c++) x[i * 3 + c] = c == pred[i] ? 2.0f : -(float)c;
  dt_task *t = make_task(DT_TASK_CLASSIFICATION, 3, 0.0f, NULL, DT_LOSS_MSE);
  ASSERT(t != NULL);
  dt_metric_acc *a = NULL;
  ASSERT_OK(dt_metric_acc_new(t, 1, &a));
  ASSERT_OK(dt_metric_acc_add(a, x, y, 4, 1.0));
  ASSERT_OK(dt_metric_acc_add(a, x + 12, y + 4, 2, 1.0));
  char json[512];
  ASSERT_OK(dt_metric_acc_detail_json(a, json, sizeof json));
  ASSERT_HAS(json, "\"per_class_acc\":[0.5,1,0.666667]");
  ASSERT_HAS(json, "\"per_class_samples\":[2,1,3]");
  ASSERT_HAS(json, "\"confusion\":[[1,1,0],[0,1,0],[1,0,2]]");
  ASSERT(json[0] == '"' && json[strlen(json) - 1] == ']'); /* members, no braces */
  double v[DT_MAX_METRICS];
  dt_metric_acc_values(a, 0, v);
  ASSERT_NEAR(v[0], 4.0 / 6, 1e-12);
  /* too small a buffer is an error, not a truncated document */
  ASSERT_STATUS(dt_metric_acc_detail_json(a, json, 40), DT_INVALID_ARGUMENT);
  /* a class with no sample has no accuracy: null */
  dt_metric_acc_reset(a);
  ASSERT_OK(dt_metric_acc_add(a, x, y, 3, 1.0));
  ASSERT_OK(dt_metric_acc_detail_json(a, json, sizeof json));
  ASSERT_HAS(json, "\"per_class_acc\":[0.5,1,null]");
  ASSERT_HAS(json, "\"confusion\":[[1,1,0],[0,1,0],[0,0,0]]");
  dt_metric_acc_free(a);
  /* without detail there is nothing to show */
  ASSERT_OK(dt_metric_acc_new(t, 0, &a));
  ASSERT_OK(dt_metric_acc_add(a, x, y, 6, 1.0));
  ASSERT_OK(dt_metric_acc_detail_json(a, json, sizeof json));
  ASSERT_STR_EQ(json, "");
  dt_metric_acc_free(a);
  dt_task_free(t);
}

/* ---- metric sets ------------------------------------------------------------------------ */

TEST(metric_sets) {
  dt_task *c10 = make_task(DT_TASK_CLASSIFICATION, 10, 0.0f, NULL, DT_LOSS_MSE);
  dt_task *c3 = make_task(DT_TASK_CLASSIFICATION, 3, 0.0f, NULL, DT_LOSS_MSE);
  dt_task *reg = make_task(DT_TASK_REGRESSION, 2, 0.0f, NULL, DT_LOSS_MSE);
  dt_task *ml = make_task(DT_TASK_MULTILABEL, 4, 0.0f, NULL, DT_LOSS_MSE);
  ASSERT(c10 && c3 && reg && ml);
  const dt_metric_set *m = dt_task_metrics(c10);
  ASSERT_EQ(m->n_eval, 2);
  ASSERT_STR_EQ(m->eval[0].name, "acc1");
  ASSERT_STR_EQ(m->eval[1].name, "acc5");
  ASSERT_EQ(m->n_train_row, 1);
  ASSERT_STR_EQ(m->train[0].name, "acc1");
  ASSERT(m->eval[0].percent && m->eval[1].percent);
  ASSERT_STR_EQ(m->loss_label, "cross-entropy loss");
  const dt_metric_set *dflt = dt_metric_set_classification();
  ASSERT_EQ(dflt->n_eval, 2);
  ASSERT_STR_EQ(dflt->eval[1].name, "acc5");
  m = dt_task_metrics(c3);
  ASSERT_EQ(m->n_eval, 1);
  ASSERT_STR_EQ(m->eval[0].name, "acc1");
  ASSERT_EQ(m->n_train_row, 1);
  ASSERT_STR_EQ(m->train[0].name, "acc1");
  m = dt_task_metrics(reg);
  ASSERT_EQ(m->n_eval, 2);
  ASSERT_STR_EQ(m->eval[0].name, "rmse");
  ASSERT_STR_EQ(m->eval[1].name, "mae");
  ASSERT_EQ(m->n_train_row, 2);
  ASSERT_STR_EQ(m->train[0].name, "rmse");
  ASSERT_STR_EQ(m->train[1].name, "mae");
  ASSERT(!m->eval[0].percent);
  m = dt_task_metrics(ml);
  ASSERT_EQ(m->n_eval, 2);
  ASSERT_STR_EQ(m->eval[0].name, "auc");
  ASSERT_STR_EQ(m->eval[1].name, "acc");
  ASSERT_EQ(m->n_train_row, 1);
  ASSERT_STR_EQ(m->train[0].name, "acc");
  ASSERT_STR_EQ(m->loss_label, "BCE loss");

  /* targets: one class index, or `outputs` floats */
  ASSERT_EQ(dt_task_target_dtype(c10), DT_I32);
  ASSERT_EQ(dt_task_target_width(c10), 1);
  ASSERT_EQ(dt_task_target_dtype(ml), DT_F32);
  ASSERT_EQ(dt_task_target_width(ml), 4);
  ASSERT_EQ(dt_task_target_dtype(reg), DT_F32);
  ASSERT_EQ(dt_task_target_width(reg), 2);
  ASSERT_STR_EQ(dt_task_kind_name(DT_TASK_MULTILABEL), "multilabel");
  ASSERT_STR_EQ(dt_task_kind_name((dt_task_kind)42), "unknown");

  /* top-5 of 10 classes in the evaluation values */
  float x[10];
  for (int c = 0; c < 10; c++) x[c] = (float)c; /* class 9 first, class 5 fifth, class 4 sixth */
  const int32_t y[3] = {9, 5, 4};
  float xs[30];
  for (int i = 0; i < 3; i++) memcpy(xs + 10 * i, x, sizeof x);
  dt_metric_acc *a = NULL;
  ASSERT_OK(dt_metric_acc_new(c10, 0, &a));
  ASSERT_OK(dt_metric_acc_add(a, xs, y, 3, 0.0));
  double v[DT_MAX_METRICS];
  dt_metric_acc_values(a, 0, v);
  ASSERT_NEAR(v[0], 1.0 / 3, 1e-12);
  ASSERT_NEAR(v[1], 2.0 / 3, 1e-12);
  dt_metric_acc_free(a);
  dt_task_free(c10);
  dt_task_free(c3);
  dt_task_free(reg);
  dt_task_free(ml);
  dt_task_free(NULL);
}

/* ---- bad input ------------------------------------------------------------------------------ */

/* dt_task_new must refuse cfg with DT_INVALID_ARGUMENT saying `what`, leaving *out alone. */
#define ASSERT_BAD_TASK(cfg, what)                                                       \
  do {                                                                                   \
    dt_task *t_ = (dt_task *)0x1;                                                        \
    const dt_task_config c_ = cfg;                                                       \
    ASSERT_STATUS(dt_task_new(&c_, &t_), DT_INVALID_ARGUMENT);                           \
    ASSERT_HAS(dt_last_error(), what);                                                   \
    ASSERT(t_ == (dt_task *)0x1);                                                        \
  } while (0)

TEST(bad_config) {
  const float neg[2] = {1.0f, -0.5f}, nan_w[2] = {NAN, 1.0f}, ok_w[2] = {1.0f, 2.0f};
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_CLASSIFICATION, .outputs = 1}), "needs >= 2 classes, got 1");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_CLASSIFICATION, .outputs = 0}), "0 outputs");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_REGRESSION, .outputs = -3}), "-3 outputs");
  ASSERT_BAD_TASK(((dt_task_config){.kind = (dt_task_kind)7, .outputs = 2}), "task kind 7");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_CLASSIFICATION, .outputs = 3, .label_smoothing = 1.0f}),
                  "label smoothing 1");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_CLASSIFICATION, .outputs = 3, .label_smoothing = -0.1f}),
                  "label smoothing");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_MULTILABEL, .outputs = 2, .label_smoothing = 0.1f}),
                  "label smoothing applies to classification");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_REGRESSION, .outputs = 2, .label_smoothing = 0.1f}),
                  "label smoothing applies to classification");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_MULTILABEL, .outputs = 2, .pos_weight = neg}), "pos_weight[1] = -0.5");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_MULTILABEL, .outputs = 2, .pos_weight = nan_w}), "pos_weight[0]");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_CLASSIFICATION, .outputs = 2, .pos_weight = ok_w}),
                  "pos_weight applies to multilabel");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_REGRESSION, .outputs = 2, .pos_weight = ok_w}),
                  "pos_weight applies to multilabel");
  ASSERT_BAD_TASK(((dt_task_config){.kind = DT_TASK_REGRESSION, .outputs = 2, .regression_loss = (dt_regression_loss)5}),
                  "regression loss 5");
  ASSERT_STATUS(dt_task_new(NULL, &(dt_task *){NULL}), DT_INVALID_ARGUMENT);

  /* the task keeps its own copy of pos_weight */
  float w[2] = {2.0f, 2.0f};
  dt_task *t = make_task(DT_TASK_MULTILABEL, 2, 0.0f, w, DT_LOSS_MSE);
  ASSERT(t != NULL);
  const float x[2] = {0, 0}, y[2] = {1, 1};
  float l1, l2;
  ASSERT_OK(dt_task_loss(t, x, y, 1, 1, &l1, NULL));
  w[0] = w[1] = 100.0f;
  ASSERT_OK(dt_task_loss(t, x, y, 1, 1, &l2, NULL));
  ASSERT(l1 == l2);
  ASSERT_NEAR(l1, 2 * log(2.0), 1e-7);
  dt_task_free(t);
}

/* HR@10 and NDCG@10 of hand-made queries: ties count against the positive, ranks split the queries. */
TEST(ranking_hand_computed) {
  enum { PER = 101 };
  const dt_task_config c = {.kind = DT_TASK_REGRESSION, .outputs = 1, .ranking_k = 10};
  dt_task *t = NULL;
  ASSERT_OK(dt_task_new(&c, &t));
  const dt_metric_set *ms = dt_task_metrics(t);
  ASSERT_EQ(ms->n_eval, 4);
  ASSERT_STR_EQ(ms->eval[2].name, "hr10");
  ASSERT_STR_EQ(ms->eval[3].name, "ndcg10");
  static float q[4][PER];
  for (int k = 0; k < 4; k++)
    for (int j = 1; j < PER; j++) q[k][j] = (float)(j % 7) * 0.1f; /* negatives in [0, 0.6] */
  q[0][0] = 1.0f;                                      /* above every negative: rank 0 */
  q[1][0] = q[1][6];                                   /* ties the 14 negatives at 0.6: rank 14, a miss */
  q[2][0] = 0.6f;
  for (int j = 1; j < PER; j++) q[2][j] = j <= 3 ? 0.6f : 0.0f; /* ties 3: rank 3 */
  q[3][0] = NAN;                                       /* a NaN positive counts as the worst */
  dt_metric_acc *whole = NULL, *a = NULL, *b = NULL;
  ASSERT_OK(dt_metric_acc_new(t, 1, &whole));
  ASSERT_OK(dt_metric_acc_new(t, 1, &a));
  ASSERT_OK(dt_metric_acc_new(t, 1, &b));
  const float out = 3.0f, y = 3.5f;
  ASSERT_OK(dt_metric_acc_add(whole, &out, &y, 1, 0.25));
  ASSERT_OK(dt_metric_acc_add_ranking(whole, &q[0][0], 4, PER));
  double v[DT_MAX_METRICS];
  dt_metric_acc_values(whole, 0, v);
  ASSERT_NEAR(v[2], 2.0 / 4.0, 1e-12);                      /* hits: queries 0 and 2 */
  ASSERT_NEAR(v[3], (1.0 + 1.0 / log2(5.0)) / 4.0, 1e-12); /* 1/log2(rank + 2) */
  /* two "ranks" with two queries each, their states summed, give the same figures */
  ASSERT_OK(dt_metric_acc_add(a, &out, &y, 1, 0.25));
  ASSERT_OK(dt_metric_acc_add_ranking(a, &q[0][0], 2, PER));
  ASSERT_OK(dt_metric_acc_add_ranking(b, &q[2][0], 2, PER));
  size_t na, nb;
  double *sa = dt_metric_acc_sums(a, &na);
  const double *sb = dt_metric_acc_sums(b, &nb);
  ASSERT_EQ(na, nb);
  for (size_t i = 0; i < na; i++) sa[i] += sb[i];
  double w[DT_MAX_METRICS];
  dt_metric_acc_values(a, 0, w);
  ASSERT(w[2] == v[2] && w[3] == v[3]);
  /* refused: fewer than 2 candidates, a training accumulator, a task without ranking */
  ASSERT(dt_metric_acc_add_ranking(whole, &q[0][0], 1, 1) == DT_INVALID_ARGUMENT);
  dt_metric_acc *train = NULL;
  ASSERT_OK(dt_metric_acc_new(t, 0, &train));
  ASSERT(dt_metric_acc_add_ranking(train, &q[0][0], 1, PER) == DT_INVALID_ARGUMENT);
  dt_metric_acc_free(train);
  dt_metric_acc_free(b);
  dt_metric_acc_free(a);
  dt_metric_acc_free(whole);
  dt_task_free(t);
}

TEST(bad_targets) {
  dt_task *cls = make_task(DT_TASK_CLASSIFICATION, 3, 0.1f, NULL, DT_LOSS_MSE);
  dt_task *ml = make_task(DT_TASK_MULTILABEL, 2, 0.0f, NULL, DT_LOSS_MSE);
  dt_task *reg = make_task(DT_TASK_REGRESSION, 2, 0.0f, NULL, DT_LOSS_L1);
  ASSERT(cls && ml && reg);
  float x[12] = {0}, l = 0, g[12];
  const int32_t labels_hi[3] = {0, 2, 3}, labels_neg[3] = {-1, 0, 0};
  ASSERT_STATUS(dt_task_loss(cls, x, labels_hi, 3, 1, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "label 3 of sample 2");
  ASSERT_STATUS(dt_task_loss(cls, x, labels_neg, 3, 0, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "label -1 of sample 0");

  float y[8] = {0, 1, 1, 0, 0, 1, 0, 0};
  y[5] = NAN;
  ASSERT_STATUS(dt_task_loss(ml, x, y, 4, 1, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "target 1 of sample 2 is not finite");
  ASSERT_STATUS(dt_task_loss(reg, x, y, 4, 1, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "target 1 of sample 2 is not finite");
  y[5] = INFINITY;
  ASSERT_STATUS(dt_task_loss(reg, x, y, 4, 1, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "sample 2");
  y[5] = 1.0f;
  y[6] = 1.5f;
  ASSERT_STATUS(dt_task_loss(ml, x, y, 4, 1, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "target 0 of sample 3 is 1.5, not in [0, 1]");
  y[6] = -0.25f;
  ASSERT_STATUS(dt_task_loss(ml, x, y, 4, 1, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "sample 3");
  y[6] = 3.0f; /* a regression target may be anything finite */
  ASSERT_OK(dt_task_loss(reg, x, y, 4, 1, &l, g));
  ASSERT_NEAR(l, 6.0 / 8, 1e-7);
  /* no samples, NULL buffers */
  ASSERT_STATUS(dt_task_loss(reg, x, y, 0, 1, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_task_loss(reg, NULL, y, 1, 1, &l, g), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_task_loss(reg, x, y, 1, 1, NULL, g), DT_INVALID_ARGUMENT);
  dt_task_free(cls);
  dt_task_free(ml);
  dt_task_free(reg);
}

TEST_MAIN(TEST_ENTRY(grad_classification), TEST_ENTRY(grad_multilabel), TEST_ENTRY(grad_regression),
          TEST_ENTRY(bce_hand_computed), TEST_ENTRY(mse_l1_hand_computed), TEST_ENTRY(multilabel_accuracy_and_auc),
          TEST_ENTRY(roc_auc_exact), TEST_ENTRY(acc_two_batches_equal_one), TEST_ENTRY(acc_set_scores_multilabel),
          TEST_ENTRY(acc_classification_detail_json), TEST_ENTRY(metric_sets), TEST_ENTRY(bad_config),
          TEST_ENTRY(ranking_hand_computed), TEST_ENTRY(bad_targets))
