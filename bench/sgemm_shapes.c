/* Benchmark: dtrain's f32 GEMM (dt_sgemm: oneDNN's sgemm or OpenBLAS, as DT_SGEMM and the CPU choose) against
 * OpenBLAS's cblas_sgemm as it loaded (OPENBLAS_CORETYPE picks its kernels), side by side on the shapes dtrain
 * multiplies: the convolutions' per-sample GEMMs of resnet20 and resnet18, a 2048-wide mlp, fashioncnn's fc1, the
 * default mlp's first layer and a 2048^3 square,
 * one thread (the convolutions' GEMMs run single-threaded inside their OpenMP regions) and the process's budget.
 *
 * Usage: sgemm_shapes [REPS]   (median of REPS timings of a batch of calls, after a warm-up; default 7) */
#include <stdio.h>
#include <stdlib.h>

#include "dtrain/dtrain.h"
#include "gemm_timing.h"
#include "tensor/kernels.h"

#include <cblas.h> /* after kernels.h: its <complex.h> defines I */

static const shape shapes[] = {
    {"resnet20 stride-2 conv forward (w @ col)", 0, 0, 32, 256, 144},
    {"resnet20 stride-2 conv dw (dy @ col^T)", 0, 1, 32, 144, 256},
    {"resnet20 stride-2 conv dcol (w^T @ dy)", 1, 0, 144, 256, 32},
    {"resnet20 1x1 projection forward", 0, 0, 32, 256, 16},
    {"resnet20 stem forward (3 -> 16, 32x32)", 0, 0, 16, 1024, 27},
    {"resnet18 layer4 forward (group of 11 samples)", 0, 0, 512, 539, 4608},
    {"resnet18 stem forward (7x7/2, 112x112)", 0, 0, 64, 12544, 147},
    {"mlp 2048 forward (batch 256)", 0, 1, 256, 2048, 2048},
    {"mlp 2048 dw (dy^T @ x)", 1, 0, 2048, 2048, 256},
    {"square 2048^3", 0, 0, 2048, 2048, 2048},
    {"fashioncnn fc1 forward (x @ w^T)", 0, 1, 64, 600, 2304},
    {"fashioncnn fc1 dx (dy @ w)", 0, 0, 64, 2304, 600},
    {"fashioncnn fc1 dw (dy^T @ x)", 1, 0, 600, 2304, 64},
    {"mlp 784->256 forward (x @ w^T)", 0, 1, 64, 256, 784},
};


static int by_openblas(const shape *s, const float *a, const float *b, float *c) {
  cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K,
              1.0f, a, s->ta ? s->M : s->K, b, s->tb ? s->K : s->N, 0.0f, c, s->N);
  return 1;
}
static int by_dtrain(const shape *s, const float *a, const float *b, float *c) {
  dt_sgemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, a, s->ta ? s->M : s->K, b, s->tb ? s->K : s->N, 0.0f, c, s->N);
  return 1;
}


static float *filled(size_t n, int mod) {
  float *p = malloc(n * sizeof *p);
  if (p)
    for (size_t i = 0; i < n; i++) p[i] = (float)(i % (size_t)mod) * 0.1f - 0.2f;
  return p;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  if (reps < 1 || reps > 64) {
    fprintf(stderr, "sgemm_shapes: REPS %s: expected 1 to 64\n", argv[1]);
    return 2;
  }
  if (dt_sgemm_check() != DT_OK) {
    fprintf(stderr, "sgemm_shapes: %s\n", dt_last_error());
    return 2;
  }
  const int budget = dt_get_threads();
  printf("# dtrain: %s; reference: OpenBLAS %s (cblas_sgemm); GFLOP/s, median of %d\n", dt_sgemm_name(),
         dt_blas_corename(), reps);
  printf("%-46s %5s %5s %5s %8s | %9s %9s %6s\n", "shape", "M", "N", "K", "threads", "dtrain", "OpenBLAS", "ratio");
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    float *a = filled((size_t)s->M * s->K, 7), *b = filled((size_t)s->K * s->N, 5), *c = filled((size_t)s->M * s->N, 3);
    if (!a || !b || !c) {
      fprintf(stderr, "sgemm_shapes: out of memory\n");
      return 1;
    }
    const int threads[2] = {1, budget};
    for (int k = 0; k < (budget > 1 ? 2 : 1); k++) {
      dt_set_threads(threads[k]);
      const double d = gflops(by_dtrain, s, a, b, c, reps), o = gflops(by_openblas, s, a, b, c, reps);
      printf("%-46s %5d %5d %5d %8d | %9.1f %9.1f %5.2fx\n", s->what, s->M, s->N, s->K, threads[k], d, o, d / o);
    }
    dt_set_threads(budget);
    free(a);
    free(b);
    free(c);
  }
  return 0;
}
