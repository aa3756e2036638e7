/* What the GEMM benchmarks share (sgemm_shapes, gemm_bf16_shapes): a product's shape and its GFLOP/s, timed as the
 * median of repetitions of about 20 ms of back-to-back calls. */
#ifndef DT_BENCH_GEMM_TIMING_H
#define DT_BENCH_GEMM_TIMING_H

#include <stdlib.h>

#include "dtrain/dtrain.h"

typedef struct shape {
  const char *what;
  int ta, tb, M, N, K; /* C (M, N) = op(A) (M, K) @ op(B) (K, N), row-major, packed */
} shape;

/* One product of shape s; 0 when the GEMM declines (it is then not timed). */
typedef int (*gemm_fn)(const shape *s, const float *a, const float *b, float *c);

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* GFLOP/s: median over reps (at most 64) of `calls` back-to-back products, after a warm-up; 0 if f declines. */
static inline double gflops(gemm_fn f, const shape *s, const float *a, const float *b, float *c, int reps) {
  const double flop = 2.0 * s->M * s->N * s->K;
  int calls = (int)(2e9 * 0.02 / flop);
  if (calls < 1) calls = 1;
  double t[64];
  if (!f(s, a, b, c)) return 0;
  for (int r = 0; r < reps; r++) {
    const double t0 = dt_time_now();
    for (int i = 0; i < calls; i++) f(s, a, b, c);
    t[r] = dt_time_now() - t0;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  return flop * calls / t[reps / 2] / 1e9;
}

#endif
