/* Batch normalisation kernels over (N, C, HW): training, evaluation, backward; one channel per task. */
#include <math.h>

#include "tensor/kernels.h"

/* gamma/beta may be NULL (affine=False): scale 1, shift 0. */
void dt_batchnorm_forward_train(float *out, float *mean, float *invstd, float *running_mean, float *running_var,
                                const float *inp, const float *gamma, const float *beta, int N, int C, int HW,
                                float momentum, float eps) {
  const size_t M = (size_t)N * HW; /* values per channel */
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; c++) {
    /* Two passes in double: mean, then the biased variance around it. */
    double sum = 0.0;
    for (int n = 0; n < N; n++) {
      const float *x = inp + ((size_t)n * C + c) * HW;
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < HW; i++) sum += x[i];
    }
    const double mu = sum / (double)M;
    double sq = 0.0;
    for (int n = 0; n < N; n++) {
      const float *x = inp + ((size_t)n * C + c) * HW;
#pragma omp simd reduction(+ : sq)
      for (int i = 0; i < HW; i++) {
        const double d = x[i] - mu;
        sq += d * d;
      }
    }
    const double var = sq / (double)M;
    const float is = (float)(1.0 / sqrt(var + (double)eps));
    const float m = (float)mu, scale = (gamma ? gamma[c] : 1.0f) * is, shift = beta ? beta[c] : 0.0f;
    for (int n = 0; n < N; n++) {
      const float *x = inp + ((size_t)n * C + c) * HW;
      float *y = out + ((size_t)n * C + c) * HW;
      for (int i = 0; i < HW; i++) y[i] = (x[i] - m) * scale + shift;
    }
    if (mean) mean[c] = m;
    if (invstd) invstd[c] = is;
    /* PyTorch updates the running variance with the unbiased estimate (M-1 divisor). */
    if (running_mean) running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
    if (running_var) {
      const double unbiased = M > 1 ? sq / (double)(M - 1) : var;
      running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
    }
  }
}

void dt_batchnorm_forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                               const float *running_mean, const float *running_var, int N, int C, int HW, float eps) {
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)N * C * HW >= 65536)
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) {
      const float is = (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
      const float scale = (gamma ? gamma[c] : 1.0f) * is, shift = beta ? beta[c] : 0.0f, m = running_mean[c];
      const float *x = inp + ((size_t)n * C + c) * HW;
      float *y = out + ((size_t)n * C + c) * HW;
      for (int i = 0; i < HW; i++) y[i] = (x[i] - m) * scale + shift;
    }
  }
}

/* With xhat = (x - mean) * invstd and M values per channel:
 * dbeta = sum dout, dgamma = sum dout * xhat,
 * dinp = gamma * invstd * (dout - dbeta / M - xhat * dgamma / M). */
void dt_batchnorm_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                           const float *mean, const float *invstd, const float *gamma, int N, int C, int HW) {
  const size_t M = (size_t)N * HW;
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; c++) {
    const float m = mean[c], is = invstd[c];
    double sdy = 0.0, sdyx = 0.0;
    for (int n = 0; n < N; n++) {
      const float *x = inp + ((size_t)n * C + c) * HW;
      const float *dy = dout + ((size_t)n * C + c) * HW;
#pragma omp simd reduction(+ : sdy, sdyx)
      for (int i = 0; i < HW; i++) {
        sdy += dy[i];
        sdyx += (double)dy[i] * ((x[i] - m) * is);
      }
    }
    if (dbeta) dbeta[c] += (float)sdy;
    if (dgamma) dgamma[c] += (float)sdyx;
    if (dinp) {
      const float k = (gamma ? gamma[c] : 1.0f) * is;
      const float a = (float)(sdy / (double)M), b = (float)(sdyx / (double)M);
      for (int n = 0; n < N; n++) {
        const float *x = inp + ((size_t)n * C + c) * HW;
        const float *dy = dout + ((size_t)n * C + c) * HW;
        float *dx = dinp + ((size_t)n * C + c) * HW;
        for (int i = 0; i < HW; i++) dx[i] = k * (dy[i] - a - (x[i] - m) * is * b);
      }
    }
  }
}
