/* Pointwise activations (relu, gelu exact and tanh, tanh, sigmoid): forward and backward, as torch. */
#include <math.h>

#include "tensor/kernels.h"

#define PAR_MIN 32768
#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f
#define GELU_C 0.044715f

/* e^x, written to vectorise: x = n ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative
 * error < 3e-7), 2^n from the exponent bits; x is clamped to [-87, 88] (e^x stays a normal float). */
static inline float vexp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = rintf(x * 1.44269504f);
  const float r = (x - n * 0.693145751953125f) - n * 1.42860677e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  union {
    int32_t i;
    float f;
  } s = {.i = ((int32_t)n + 127) << 23};
  return p * s.f;
}

/* Phi(x) = (1 + erf(x / sqrt(2))) / 2 = 1 - erfc(z) / 2 (x >= 0) or erfc(z) / 2 (x < 0), z = |x| / sqrt(2),
 * vectorisable: erfc by the Chebyshev fit of Numerical Recipes' erfcc (relative error < 1.2e-7 for every z >= 0,
 * so the tail keeps its digits too). */
static inline float normal_cdf(float x) {
  const float z = fabsf(x) * INV_SQRT_2, t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float half_erfc = 0.5f * t * vexp(p - z * z);
  return x >= 0.0f ? 1.0f - half_erfc : half_erfc;
}

void dt_act_forward(dt_act_kind k, float *out, const float *inp, size_t n) {
  switch (k) {
  case DT_ACT_RELU:
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    break;
  case DT_ACT_GELU:
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * normal_cdf(inp[i]);
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
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
    break;
  case DT_ACT_GELU:
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
      const float x = inp[i];
      const float cdf = normal_cdf(x), pdf = INV_SQRT_2PI * vexp(-0.5f * x * x);
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
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * (1.0f - out[i] * out[i]);
    break;
  case DT_ACT_SIGMOID:
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * out[i] * (1.0f - out[i]);
    break;
  }
}
