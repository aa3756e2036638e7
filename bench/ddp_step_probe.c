/* Probe: what the collectives of one DDP training step cost by themselves, on
 * the public group API. Every rank runs the same loop of `--steps` steps, each a
 * busy wait of WORK microseconds (standing in for forward, backward and the
 * optimizer of a tiny model) plus one pattern of collectives:
 *
 *   work only            no collective (the floor)
 *   blocking grad        dt_allreduce of NUMEL floats (avg), blocking
 *   stop + blocking      dt_allreduce of one int32 (max) first, as dtrain's per-step
 *                        stop agreement, then the blocking gradient all-reduce
 *   async grad           the gradient all-reduce with a work handle, then
 *                        dt_work_wait: what a DDP bucket launched from backward does
 *   stop + async         both, in dtrain train --strategy ddp's order
 *
 * Rank 0 prints mean, median and p90 microseconds per step of each pattern
 * (the second of two passes; the first is warm-up). Run it under a launcher:
 *   dtrun --standalone --nproc-per-node 2 -- build/bench/ddp_step_probe [STEPS [WORK_US [NUMEL]]]
 * A bench, not a test: it asserts nothing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtrain/dtrain.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void busy_us(double us) {
  const double until = dt_time_now() + us * 1e-6;
  while (dt_time_now() < until) {
  }
}

enum { WORK_ONLY, BLOCKING, STOP_BLOCKING, ASYNC, STOP_ASYNC, N_PATTERNS };
static const char *const names[N_PATTERNS] = {"work only", "blocking grad", "stop + blocking grad", "async grad",
                                              "stop + async grad (dtrain)"};

#define TRY(call)                 \
  do {                            \
    dt_status st_ = (call);       \
    if (st_ != DT_OK) return st_; \
  } while (0)

static dt_status step(dt_group *g, int pattern, double work_us, float *grad, size_t numel) {
  int32_t stop = 0;
  if (pattern == STOP_BLOCKING || pattern == STOP_ASYNC) TRY(dt_allreduce(g, &stop, &stop, 1, DT_I32, DT_MAX, NULL));
  busy_us(work_us);
  if (pattern == BLOCKING || pattern == STOP_BLOCKING) TRY(dt_allreduce(g, grad, grad, numel, DT_F32, DT_AVG, NULL));
  if (pattern == ASYNC || pattern == STOP_ASYNC) {
    dt_work *w = NULL;
    TRY(dt_allreduce(g, grad, grad, numel, DT_F32, DT_AVG, &w));
    dt_status st = dt_work_wait(w, 0);
    dt_work_free(w);
    return st;
  }
  return DT_OK;
}

int main(int argc, char **argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 5000;
  const double work_us = argc > 2 ? atof(argv[2]) : 7.0;
  const long numel = argc > 3 ? atol(argv[3]) : 21;
  if (steps < 1 || work_us < 0 || numel < 1) {
    fprintf(stderr, "usage: ddp_step_probe [STEPS [WORK_US [NUMEL]]] (under dtrun or torchrun)\n");
    return 2;
  }
  dt_group_options o;
  dt_group_options_default(&o);
  dt_group *g = NULL;
  if (dt_group_init(&o, &g) != DT_OK) {
    fprintf(stderr, "ddp_step_probe: %s\n", dt_last_error());
    return 1;
  }
  float *grad = calloc((size_t)numel, sizeof *grad);
  double *t = malloc(sizeof *t * (size_t)steps);
  int rc = grad && t ? 0 : 1;
  if (dt_group_rank(g) == 0)
    printf("# %d ranks (%s), %d steps of %.1f us busy work, gradient of %ld floats; us per step\n%-28s %8s %8s %8s\n",
           dt_group_size(g), dt_group_backend(g), steps, work_us, numel, "pattern", "mean", "median", "p90");
  for (int p = 0; rc == 0 && p < N_PATTERNS; p++) {
    for (int pass = 0; rc == 0 && pass < 2; pass++) {
      if (dt_barrier(g, NULL) != DT_OK) rc = 1;
      for (int i = 0; rc == 0 && i < steps; i++) {
        const double t0 = dt_time_now();
        if (step(g, p, work_us, grad, (size_t)numel) != DT_OK) rc = 1;
        t[i] = dt_time_now() - t0;
      }
    }
    if (rc) break;
    double sum = 0;
    for (int i = 0; i < steps; i++) sum += t[i];
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    if (dt_group_rank(g) == 0)
      printf("%-28s %8.1f %8.1f %8.1f\n", names[p], 1e6 * sum / steps, 1e6 * t[steps / 2], 1e6 * t[steps * 9 / 10]);
  }
  if (rc) fprintf(stderr, "ddp_step_probe: %s\n", dt_last_error());
  free(t);
  free(grad);
  dt_group_destroy(g);
  return rc;
}
