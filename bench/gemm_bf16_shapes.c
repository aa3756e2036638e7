/* Benchmark: the bf16 GEMMs autocast can run, side by side on the shapes dtrain multiplies: our own (vdpbf16ps,
 * src/tensor/gemm_bf16.c), oneDNN's bf16 matmul where the build has it, and the f32 GEMM they replace (dt_sgemm:
 * oneDNN's sgemm or OpenBLAS). Every bf16 figure includes packing the f32 operands to bf16, as autocast calls it.
 * One thread (the convolutions' GEMMs run single-threaded inside their OpenMP regions) and the process's budget.
 *
 * Usage: gemm_bf16_shapes [REPS]   (median of REPS timings of a batch of calls, after a warm-up; default 7) */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_line.h"
#include "dtrain/dtrain.h"
#include "gemm_timing.h"
#include "tensor/kernels.h"

static const shape shapes[] = {
    {"mlp 1024 forward (batch 128)", 0, 1, 128, 1024, 1024},
    {"mlp 1024 dx (dy @ w)", 0, 0, 128, 1024, 1024},
    {"mlp 1024 dw (dy^T @ x)", 1, 0, 1024, 1024, 128},
    {"mlp 2048 forward (batch 256)", 0, 1, 256, 2048, 2048},
    {"mlp 2048 dx (dy @ w)", 0, 0, 256, 2048, 2048},
    {"mlp 2048 dw (dy^T @ x)", 1, 0, 2048, 2048, 256},
    {"bert-mini qkv/out projection (4096 tokens)", 0, 1, 4096, 256, 256},
    {"bert-mini ffn up (4096 tokens)", 0, 1, 4096, 1024, 256},
    {"bert-mini ffn down dw", 1, 0, 256, 1024, 4096},
    {"fashioncnn conv2 forward (w @ col)", 0, 0, 64, 196, 288},
    {"resnet18 layer4 forward (group of 11 samples)", 0, 0, 512, 539, 4608},
    {"square 2048^3", 0, 0, 2048, 2048, 2048},
};

static int by_f32(const shape *s, const float *a, const float *b, float *c) {
  dt_sgemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, a, s->ta ? s->M : s->K, b, s->tb ? s->K : s->N, 0.0f, c, s->N);
  return 1;
}
static int by_own(const shape *s, const float *a, const float *b, float *c) {
  return dt_gemm_bf16_own(s->ta, s->tb, s->M, s->N, s->K, 1.0f, a, s->ta ? s->M : s->K, b, s->tb ? s->K : s->N,
                          0.0f, c, s->N);
}
static int by_onednn(const shape *s, const float *a, const float *b, float *c) {
  return dt_gemm_bf16_onednn(s->ta, s->tb, s->M, s->N, s->K, 1.0f, a, s->ta ? s->M : s->K, b, s->tb ? s->K : s->N,
                             0.0f, c, s->N);
}



/* Values on the bf16 grid (as Conv2d hands them over; Linear's may be off it, which costs the packing nothing). */
static float *filled(size_t n, int mod) {
  float *p = malloc(n * sizeof *p);
  if (p)
    for (size_t i = 0; i < n; i++) p[i] = dt_round_bf16((float)(i % (size_t)mod) * 0.1f - 0.2f);
  return p;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  if (reps < 1 || reps > 64) {
    fprintf(stderr, "gemm_bf16_shapes: REPS %s: expected 1 to 64\n", argv[1]);
    return 2;
  }
  if (dt_sgemm_check() != DT_OK) {
    fprintf(stderr, "gemm_bf16_shapes: %s\n", dt_last_error());
    return 2;
  }
  if (!dt_gemm_bf16_own_available()) {
    fprintf(stderr, "gemm_bf16_shapes: this CPU has no AVX512_BF16: there is no bf16 GEMM to measure\n");
    return 2;
  }
  const int budget = dt_get_threads();
  print_cpu_line(stdout);
  printf("# GFLOP/s, median of %d; f32: %s; bf16 figures include packing the f32 operands to bf16; "
         "oneDNN: '-' where the build has none\n", reps, dt_sgemm_name());
  printf("%-46s %5s %5s %5s %7s | %7s %7s %7s | %8s %8s\n", "shape", "M", "N", "K", "threads", "f32", "oneDNN",
         "own", "own/f32", "own/dnnl");
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    float *a = filled((size_t)s->M * s->K, 7), *b = filled((size_t)s->K * s->N, 5), *c = filled((size_t)s->M * s->N, 3);
    if (!a || !b || !c) {
      fprintf(stderr, "gemm_bf16_shapes: out of memory\n");
      return 1;
    }
    /* the budget first: oneDNN fixes its threads when it makes a shape's primitive */
    const int threads[2] = {budget, 1};
    for (int k = 0; k < (budget > 1 ? 2 : 1); k++) {
      dt_set_threads(threads[k]);
      const double f = gflops(by_f32, s, a, b, c, reps), d = gflops(by_onednn, s, a, b, c, reps),
                   o = gflops(by_own, s, a, b, c, reps);
      printf("%-46s %5d %5d %5d %7d | %7.1f ", s->what, s->M, s->N, s->K, threads[k], f);
      if (d > 0)
        printf("%7.1f %7.1f | %7.2fx %7.2fx\n", d, o, o / f, o / d);
      else
        printf("%7s %7.1f | %7.2fx %8s\n", "-", o, o / f, "-");
    }
    dt_set_threads(budget);
    free(a);
    free(b);
    free(c);
  }
  return 0;
}
