/* Elementwise kernels: add, axpy, fill (alias-safe: out may be a or b). */
#include "tensor/kernels.h"

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 65536

void dt_add_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void dt_axpy(float *y, float a, const float *x, size_t n) {
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

void dt_fill(float *x, float v, size_t n) {
#pragma omp parallel for simd if (parallel: n >= PAR_MIN) schedule(static)
  for (size_t i = 0; i < n; i++) x[i] = v;
}
