/* Cross-entropy loss with label smoothing (torch.nn.CrossEntropyLoss semantics) and top-k accuracy counts. */
#include <math.h>

#include "core/impl.h"
#include "dtrain/model.h"
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
