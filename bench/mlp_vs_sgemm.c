/* Benchmark: a GEMM-bound MLP training step (784-2048-2048-10, batch 256) against
 * OpenBLAS cblas_sgemm at 2048^3 on the same threads, as GFLOP/s and their ratio. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"

#define REPS 7

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static int check(dt_status s, const char *what) {
  if (s != DT_OK) fprintf(stderr, "mlp_vs_sgemm: %s: %s\n", what, dt_last_error());
  return s != DT_OK;
}

/* GFLOP/s of cblas_sgemm n x n x n (median of REPS after a warm-up). */
static double sgemm_gflops(int n) {
  float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
  for (long i = 0; i < (long)n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.1f;
  double t[REPS];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  for (int r = 0; r < REPS; r++) {
    double t0 = dt_time_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    t[r] = dt_time_now() - t0;
  }
  free(a);
  free(b);
  free(c);
  return 2.0 * n * n * (double)n / median(t, REPS) / 1e9;
}

/* GFLOP/s of full MLP training steps (forward, loss, backward, SGD update). */
static double mlp_gflops(int batch, int steps_per_rep) {
  int64_t shape[1] = {784};
  int widths[3] = {784, 2048, 2048};
  dt_model *m = NULL;
  dt_optim *o = NULL;
  double gf = -1;
  if (check(dt_model_new(1, shape, &m), "model") || check(dt_model_add_linear(m, "fc1", 2048, 1), "fc1") ||
      check(dt_model_add_activation(m, "act1", DT_RELU), "act1") ||
      check(dt_model_add_linear(m, "fc2", 2048, 1), "fc2") ||
      check(dt_model_add_activation(m, "act2", DT_RELU), "act2") ||
      check(dt_model_add_linear(m, "fc3", 10, 1), "fc3") || check(dt_model_build(m, batch, 1), "build"))
    goto done;
  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_SGD, &oc);
  oc.momentum = 0.9f;
  size_t n;
  float *p = dt_model_params(m, &n), *g = dt_model_grads(m, NULL);
  if (check(dt_optim_new(&oc, n, &o), "optim")) goto done;
  float *x = malloc(sizeof(float) * batch * 784), *dl = malloc(sizeof(float) * batch * 10);
  int32_t *y = malloc(sizeof(int32_t) * batch);
  dt_rng rng;
  dt_rng_init(&rng, 1, 0);
  for (int i = 0; i < batch * 784; i++) x[i] = dt_rng_uniform(&rng);
  for (int i = 0; i < batch; i++) y[i] = (int32_t)dt_rng_below(&rng, 10);
  double t[REPS];
  for (int r = -1; r < REPS; r++) { /* r = -1: warm-up */
    double t0 = dt_time_now();
    for (int s = 0; s < steps_per_rep; s++) {
      const float *out;
      float loss;
      dt_model_zero_grad_deferred(m); /* as the trainer */
      if (check(dt_model_forward(m, x, batch, &out), "forward") ||
          check(dt_loss_cross_entropy(out, y, batch, 10, 0, &loss, dl), "loss") ||
          check(dt_model_backward(m, dl), "backward") || check(dt_optim_step(o, p, g, 0.01f), "step"))
        goto done_buffers;
    }
    if (r >= 0) t[r] = (dt_time_now() - t0) / steps_per_rep;
  }
  /* Useful GEMM work: forward 2*B*P, weight gradients 2*B*P, input gradients of
   * every layer but the first 2*B*(P - P1), with P the weight counts. */
  double P = 0, P1 = (double)widths[0] * widths[1];
  P = P1 + (double)widths[1] * widths[2] + (double)widths[2] * 10;
  gf = (2.0 * batch * P * 2 + 2.0 * batch * (P - P1)) / median(t, REPS) / 1e9;
done_buffers:
  free(x);
  free(dl);
  free(y);
done:
  dt_optim_free(o);
  dt_model_free(m);
  return gf;
}

int main(int argc, char **argv) {
  int batch = argc > 1 ? atoi(argv[1]) : 256;
  printf("# MLP 784-2048-2048-10, batch %d, SGD momentum: GEMM GFLOP/s of a training step vs\n", batch);
  printf("# OpenBLAS cblas_sgemm 2048^3 on the same threads (median of %d)\n", REPS);
  printf("%-8s %14s %14s %8s\n", "threads", "sgemm GFLOP/s", "mlp GFLOP/s", "ratio");
  int cores = dt_num_cores();
  for (int threads = 1; threads <= cores; threads = threads == cores ? cores + 1 : (threads * 2 > cores ? cores : threads * 2)) {
    if (check(dt_set_threads(threads), "threads")) return 1;
    double s = sgemm_gflops(2048), m = mlp_gflops(batch, 5);
    if (m < 0) return 1;
    printf("%-8d %14.1f %14.1f %7.0f%%\n", threads, s, m, 100.0 * m / s);
    fflush(stdout);
  }
  return 0;
}
