/* Exact ROC-AUC: the Mann-Whitney statistic over sorted scores, ties counted half (sklearn's roc_auc_score). */
#include <math.h>
#include <stdlib.h>

#include "core/impl.h"
#include "dtrain/task.h"

typedef struct scored {
  float score;
  int positive;
} scored;

/* Ascending; NaN (a diverged output) after every number, so the order stays a total one. */
static int by_score(const void *a, const void *b) {
  const float x = ((const scored *)a)->score, y = ((const scored *)b)->score;
  if (isnan(x) || isnan(y)) return isnan(x) - isnan(y);
  return (x > y) - (x < y);
}

double dt_roc_auc(const float *scores, const float *labels, int64_t n, size_t stride) {
  scored *s = NULL;
  if (n < 1 || dt_alloc_array((size_t)n, sizeof *s, "roc auc", (void **)&s) != DT_OK) return NAN;
  int64_t pos = 0;
  for (int64_t i = 0; i < n; i++) {
    s[i].score = scores[(size_t)i * stride];
    s[i].positive = labels[(size_t)i * stride] > 0.5f;
    pos += s[i].positive;
  }
  const int64_t neg = n - pos;
  if (pos == 0 || neg == 0) {
    dt_free(s);
    return NAN;
  }
  qsort(s, (size_t)n, sizeof *s, by_score);
  /* Sum of the positives' ranks (1-based), each tie group sharing its mean rank. */
  double rank_sum = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i, p = 0;
    while (j < n && s[j].score == s[i].score) p += s[j++].positive;
    rank_sum += (double)p * (double)(i + 1 + j) / 2.0;
    i = j;
  }
  dt_free(s);
  return (rank_sum - (double)pos * (double)(pos + 1) / 2.0) / ((double)pos * (double)neg);
}
