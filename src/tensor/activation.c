/* Pointwise activations (relu, gelu exact and tanh, tanh, sigmoid): forward and backward, as torch. */
#include <math.h>

#include "tensor/kernels.h"

#define PAR_MIN 32768
#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f
#define GELU_C 0.044715f

void dt_act_forward(dt_act_kind k, float *out, const float *inp, size_t n) {
  switch (k) {
  case DT_ACT_RELU:
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    break;
  case DT_ACT_GELU:
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * INV_SQRT_2));
    break;
  case DT_ACT_GELU_TANH:
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x)));
    }
    break;
  case DT_ACT_TANH:
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = tanhf(inp[i]);
    break;
  case DT_ACT_SIGMOID:
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = 1.0f / (1.0f + expf(-inp[i]));
    break;
  }
}

void dt_act_backward(dt_act_kind k, float *dinp, const float *dout, const float *inp, const float *out, size_t n) {
  switch (k) {
  case DT_ACT_RELU:
    /* torch's threshold_backward: pass the gradient where the output is positive. */
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
    break;
  case DT_ACT_GELU:
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
      const float x = inp[i];
      const float cdf = 0.5f * (1.0f + erff(x * INV_SQRT_2)), pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
      dinp[i] = dout[i] * (cdf + x * pdf);
    }
    break;
  case DT_ACT_GELU_TANH:
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
      const float x = inp[i];
      const float t = tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x));
      const float dt = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * x * x);
      dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt);
    }
    break;
  case DT_ACT_TANH:
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * (1.0f - out[i] * out[i]);
    break;
  case DT_ACT_SIGMOID:
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * out[i] * (1.0f - out[i]);
    break;
  }
}
