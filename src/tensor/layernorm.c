/* Layer normalisation over the last dimension (torch.nn.LayerNorm(C)): biased variance, eps inside the root. */
#include <math.h>
#include <omp.h>

#include "tensor/kernels.h"

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                          int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < N; r++) {
    const float *x = inp + (size_t)r * C;
    float *y = out + (size_t)r * C;
    double s = 0.0, s2 = 0.0; /* double: C up to thousands of values of any offset */
    for (int c = 0; c < C; c++) s += x[c];
    const double mu = s / C;
    for (int c = 0; c < C; c++) s2 += ((double)x[c] - mu) * ((double)x[c] - mu);
    const float m = (float)mu, rs = (float)(1.0 / sqrt(s2 / C + (double)eps));
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * rs * w[c] + b[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

#define LN_COLS 64 /* the most columns of the weight gradient summed together */

/* Columns a task of the weight gradient sums: up to LN_COLS, fewer where that would leave threads idle (any width
 * adds each column's rows in the same order). */
static int ln_cols(int C) {
  const int t = omp_get_max_threads(), per = (C + t - 1) / t, w = (per + 15) / 16 * 16;
  return w < 16 ? 16 : w > LN_COLS ? LN_COLS : w;
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * w. The parameter gradients are summed
 * over rows per column, each column by one thread, so the bits do not depend on the thread count. */
void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *mean,
                           const float *rstd, const float *w, int N, int C) {
  if (dinp) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
      const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
      float *dx = dinp + (size_t)r * C;
      const float m = mean[r], rs = rstd[r];
      float sg = 0.0f, sgx = 0.0f;
      for (int c = 0; c < C; c++) {
        const float g = dy[c] * w[c];
        sg += g;
        sgx += g * (x[c] - m) * rs;
      }
      sg /= (float)C;
      sgx /= (float)C;
      for (int c = 0; c < C; c++) {
        const float xh = (x[c] - m) * rs;
        dx[c] = rs * (dy[c] * w[c] - sg - xh * sgx);
      }
    }
  }
  if (!dw && !db) return;
  /* Column blocks, each summed row by row: every column adds its rows in order, as one column at a time would, and
   * the rows are read along (a column at a time strode C floats a load). */
  const int cols = ln_cols(C), blocks = (C + cols - 1) / cols;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < blocks; b++) {
    const int c0 = b * cols, nc = C - c0 < cols ? C - c0 : cols;
    float sw[LN_COLS] = {0}, sb[LN_COLS] = {0};
    for (int r = 0; r < N; r++) {
      const float *dy = dout + (size_t)r * C + c0, *x = inp + (size_t)r * C + c0;
      const float m = mean[r], rs = rstd[r];
      for (int c = 0; c < nc; c++) {
        sw[c] += dy[c] * (x[c] - m) * rs;
        sb[c] += dy[c];
      }
    }
    for (int c = 0; c < nc; c++) {
      if (dw) dw[c0 + c] += sw[c];
      if (db) db[c0 + c] += sb[c];
    }
  }
}
