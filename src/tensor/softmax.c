/* Row-wise softmax and log-softmax over (B, C): numerically stable forward (max subtracted) and backward. */
#include <math.h>

#include "tensor/kernels.h"

/* Parallel over rows only when there is enough work to pay for the region. */
#define PAR_ROWS(B, C) ((size_t)(B) * (size_t)(C) >= 32768)

void dt_softmax_forward(float *out, const float *inp, int B, int C) {
#pragma omp parallel for if (PAR_ROWS(B, C)) schedule(static)
  for (int b = 0; b < B; b++) {
    const float *x = inp + (size_t)b * C;
    float *y = out + (size_t)b * C;
    float mx = -INFINITY;
    for (int c = 0; c < C; c++) mx = x[c] > mx ? x[c] : mx;
    double sum = 0.0;
    for (int c = 0; c < C; c++) {
      y[c] = expf(x[c] - mx);
      sum += y[c];
    }
    const float inv = (float)(1.0 / sum);
    for (int c = 0; c < C; c++) y[c] *= inv;
  }
}

/* dinp = out * (dout - sum_c dout * out) */
void dt_softmax_backward(float *dinp, const float *dout, const float *out, int B, int C) {
#pragma omp parallel for if (PAR_ROWS(B, C)) schedule(static)
  for (int b = 0; b < B; b++) {
    const float *dy = dout + (size_t)b * C, *y = out + (size_t)b * C;
    float *dx = dinp + (size_t)b * C;
    double dot = 0.0;
    for (int c = 0; c < C; c++) dot += (double)dy[c] * y[c];
    const float d = (float)dot;
    for (int c = 0; c < C; c++) dx[c] = y[c] * (dy[c] - d);
  }
}

void dt_log_softmax_forward(float *out, const float *inp, int B, int C) {
#pragma omp parallel for if (PAR_ROWS(B, C)) schedule(static)
  for (int b = 0; b < B; b++) {
    const float *x = inp + (size_t)b * C;
    float *y = out + (size_t)b * C;
    float mx = -INFINITY;
    for (int c = 0; c < C; c++) mx = x[c] > mx ? x[c] : mx;
    double sum = 0.0;
    for (int c = 0; c < C; c++) sum += expf(x[c] - mx);
    /* (x - max) - log(sum): adding max back first would round it away for large logits */
    const float ls = (float)log(sum);
    for (int c = 0; c < C; c++) y[c] = (x[c] - mx) - ls;
  }
}

/* dinp = dout - exp(out) * sum_c dout */
void dt_log_softmax_backward(float *dinp, const float *dout, const float *out, int B, int C) {
#pragma omp parallel for if (PAR_ROWS(B, C)) schedule(static)
  for (int b = 0; b < B; b++) {
    const float *dy = dout + (size_t)b * C, *y = out + (size_t)b * C;
    float *dx = dinp + (size_t)b * C;
    double sum = 0.0;
    for (int c = 0; c < C; c++) sum += dy[c];
    const float s = (float)sum;
    for (int c = 0; c < C; c++) dx[c] = dy[c] - expf(y[c]) * s;
  }
}
