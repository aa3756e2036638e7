/* Layer normalisation over the last dimension (torch.nn.LayerNorm(C)): biased variance, eps inside the root. */
#include <math.h>

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
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; c++) {
    float sw = 0.0f, sb = 0.0f;
    for (int r = 0; r < N; r++) {
      const float dy = dout[(size_t)r * C + c];
      sw += dy * (inp[(size_t)r * C + c] - mean[r]) * rstd[r];
      sb += dy;
    }
    if (dw) dw[c] += sw;
    if (db) db[c] += sb;
  }
}
