/* Losses (cross entropy with label smoothing, BCE with logits, MSE, L1; PyTorch semantics) and top-k accuracy counts. */
#include <math.h>

#include "core/impl.h"
#include "dtrain/loss.h"
#include "tensor/kernels.h"

/* Row maximum and sum_c exp(x_c - max) (>= 1), so logp_c = (x_c - max) - log(sum) stays exact for large logits. */
static float row_stats(const float *x, int C, double *sum) {
  float mx = -INFINITY;
  for (int c = 0; c < C; c++) mx = x[c] > mx ? x[c] : mx;
  double s = 0.0;
  for (int c = 0; c < C; c++) s += exp((double)(x[c] - mx));
  *sum = s;
  return mx;
}

dt_status dt_cross_entropy(float *loss, float *dlogits, const float *logits, const int32_t *labels, int B, int C,
                           float eps) {
  for (int b = 0; b < B; b++) {
    if (labels[b] < 0 || labels[b] >= C)
      return dt_error(DT_INVALID_ARGUMENT, "cross entropy: label %d of sample %d is outside [0, %d)", (int)labels[b],
                      b, C);
  }
  /* loss_b = (1 - eps) * -logp[y] + eps * mean_c(-logp[c]),  logp = x - lse.
   * Serial over rows so the sum does not depend on the thread count. */
  double total = 0.0;
  for (int b = 0; b < B; b++) {
    const float *x = logits + (size_t)b * C;
    double sum;
    const float mx = row_stats(x, C, &sum);
    const double ls = log(sum);
    double sum_shift = 0.0; /* sum_c (x_c - max) */
    for (int c = 0; c < C; c++) sum_shift += (double)(x[c] - mx);
    const double nll = ls - (double)(x[labels[b]] - mx), smooth = ls - sum_shift / C;
    total += (1.0 - eps) * nll + (double)eps * smooth;
  }
  if (dlogits) {
    /* d loss_b / d x_c = softmax_c - (1 - eps) * [c == y] - eps / C, divided by B for the mean. */
    const float invB = 1.0f / (float)B, off = eps / (float)C, on = 1.0f - eps;
#pragma omp parallel for if ((size_t)B * C >= 32768) schedule(static)
    for (int b = 0; b < B; b++) {
      const float *x = logits + (size_t)b * C;
      float *dx = dlogits + (size_t)b * C;
      double sum;
      const float mx = row_stats(x, C, &sum);
      const float inv = (float)(1.0 / sum);
      for (int c = 0; c < C; c++) dx[c] = (expf(x[c] - mx) * inv - off) * invB;
      dx[labels[b]] -= on * invB;
    }
  }
  *loss = (float)(total / B);
  return DT_OK;
}

dt_status dt_loss_cross_entropy(const float *logits, const int32_t *labels, int batch, int classes, float eps,
                                float *loss, float *dlogits) {
  if (!logits || !labels || !loss)
    return dt_error(DT_INVALID_ARGUMENT, "cross entropy: logits, labels and loss must not be NULL");
  if (batch < 1 || classes < 1)
    return dt_error(DT_INVALID_ARGUMENT, "cross entropy: batch %d and classes %d must be >= 1", batch, classes);
  if (!(eps >= 0.0f && eps <= 1.0f))
    return dt_error(DT_INVALID_ARGUMENT, "cross entropy: label smoothing %g must be in [0, 1]", (double)eps);
  return dt_cross_entropy(loss, dlogits, logits, labels, batch, classes, eps);
}

/* The rank of the label's logit: classes strictly above it, ties broken toward the lower index (as torch.topk).
 * Samples with a label outside [0, classes) count as wrong. */
void dt_topk_correct(const float *logits, const int32_t *labels, int batch, int classes, int k, int64_t *top1,
                     int64_t *topk) {
  int64_t n1 = 0, nk = 0;
  for (int b = 0; b < batch; b++) {
    const int y = labels[b];
    if (y < 0 || y >= classes) continue;
    const float *x = logits + (size_t)b * classes;
    const float v = x[y];
    int rank = 0;
    for (int c = 0; c < classes; c++) rank += x[c] > v || (x[c] == v && c < y);
    n1 += rank == 0;
    nk += rank < k;
  }
  if (top1) *top1 = n1;
  if (topk) *topk = nk;
}

/* ---- binary cross entropy with logits, MSE, L1 ---------------------------------- */

void dt_bce_with_logits(float *loss, float *dx, const float *x, const float *y, size_t n, const float *pw, int K) {
  /* (1 - y) x + lw * softplus(-x), lw = 1 + (pw - 1) y, softplus(-x) = log1p(exp(-|x|)) + max(-x, 0):
   * stable for large |x|, as PyTorch computes it. Serial sum: the same bits on any thread count. */
  double total = 0.0;
  const float inv = 1.0f / (float)n;
  for (size_t i = 0; i < n; i++) {
    const double xi = x[i], yi = y[i], w = pw ? pw[i % (size_t)K] : 1.0;
    const double lw = 1.0 + (w - 1.0) * yi;
    const double sp = log1p(exp(-fabs(xi))) + (xi < 0 ? -xi : 0.0);
    total += (1.0 - yi) * xi + lw * sp;
    if (dx) {
      const double sig_neg = 1.0 / (1.0 + exp(xi)); /* sigmoid(-x) */
      dx[i] = (float)((1.0 - yi) - lw * sig_neg) * inv;
    }
  }
  *loss = (float)(total / (double)n);
}

void dt_mse(float *loss, float *dx, const float *x, const float *y, size_t n) {
  double total = 0.0;
  const float scale = 2.0f / (float)n;
  for (size_t i = 0; i < n; i++) {
    const float d = x[i] - y[i];
    total += (double)d * d;
    if (dx) dx[i] = scale * d;
  }
  *loss = (float)(total / (double)n);
}

void dt_l1(float *loss, float *dx, const float *x, const float *y, size_t n) {
  double total = 0.0;
  const float inv = 1.0f / (float)n;
  for (size_t i = 0; i < n; i++) {
    const float d = x[i] - y[i];
    total += fabs((double)d);
    if (dx) dx[i] = d > 0 ? inv : d < 0 ? -inv : 0.0f;
  }
  *loss = (float)(total / (double)n);
}

/* NULL pointers, sizes and finite targets, for the public wrappers below. */
static dt_status check_dense(const char *what, const float *out, const float *targets, int batch, int k, float *loss) {
  if (!out || !targets || !loss) return dt_error(DT_INVALID_ARGUMENT, "%s: outputs, targets and loss must not be NULL", what);
  if (batch < 1 || k < 1) return dt_error(DT_INVALID_ARGUMENT, "%s: batch %d and width %d must be >= 1", what, batch, k);
  for (size_t i = 0; i < (size_t)batch * (size_t)k; i++)
    if (!isfinite(targets[i]))
      return dt_error(DT_INVALID_ARGUMENT, "%s: target %zu of sample %zu is not finite", what, i % (size_t)k,
                      i / (size_t)k);
  return DT_OK;
}

dt_status dt_loss_bce_with_logits(const float *logits, const float *targets, int batch, int k, const float *pos_weight,
                                  float *loss, float *dlogits) {
  DT_CHECK(check_dense("BCE with logits", logits, targets, batch, k, loss));
  for (size_t i = 0; i < (size_t)batch * (size_t)k; i++)
    if (targets[i] < 0.0f || targets[i] > 1.0f)
      return dt_error(DT_INVALID_ARGUMENT, "BCE with logits: target %zu of sample %zu is %g, not in [0, 1]",
                      i % (size_t)k, i / (size_t)k, (double)targets[i]);
  dt_bce_with_logits(loss, dlogits, logits, targets, (size_t)batch * (size_t)k, pos_weight, k);
  return DT_OK;
}

dt_status dt_loss_mse(const float *out, const float *targets, int batch, int k, float *loss, float *dout) {
  DT_CHECK(check_dense("MSE", out, targets, batch, k, loss));
  dt_mse(loss, dout, out, targets, (size_t)batch * (size_t)k);
  return DT_OK;
}

dt_status dt_loss_l1(const float *out, const float *targets, int batch, int k, float *loss, float *dout) {
  DT_CHECK(check_dense("L1", out, targets, batch, k, loss));
  dt_l1(loss, dout, out, targets, (size_t)batch * (size_t)k);
  return DT_OK;
}
