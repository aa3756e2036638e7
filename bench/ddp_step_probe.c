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
 *   async beside work    the gradient all-reduce launched first, then the work, then
 *                        dt_work_wait: a bucket all-reduced while the rest of backward runs
 *
 * Rank 0 prints mean, median and p90 microseconds per step of each pattern
 * (the second of two passes; the first is warm-up). Run it under a launcher:
 *   dtrun --standalone --nproc-per-node 2 -- build/bench/ddp_step_probe [STEPS [WORK_US [NUMEL [shared]]]]
 * The work is a fixed amount of computation (WORK_US as timed at the start, the fastest of 20 runs), so a
 * communication thread that takes the CPU from it makes the step longer, as it does backward. With `shared` the
 * gradient lies in memory the ranks share (dt_group_share), as DDP's gradient arena does on one host: the shm
 * backend then reduces it in place (above 8,192 floats; smaller all-reduces go through its slots whatever the
 * memory).
 * A bench, not a test: it asserts nothing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double iters_per_us;
static volatile double sink;

/* A fixed amount of work: n dependent multiply-adds. */
static void work_iters(long n) {
  double x = sink;
  for (long i = 0; i < n; i++) x = x * 0.999999 + 1e-7;
  sink = x;
}

/* Iterations per microsecond: the fastest of 20 runs of about a millisecond, so that the ranks calibrating at once
 * on shared cores do not count a preemption as work. */
static void calibrate(void) {
  long n = 1 << 10;
  for (;;) { /* n iterations take a millisecond or more */
    const double t0 = dt_time_now();
    work_iters(n);
    if (dt_time_now() - t0 >= 1e-3) break;
    n *= 2;
  }
  double best = 1e30;
  for (int k = 0; k < 20; k++) {
    const double t0 = dt_time_now();
    work_iters(n);
    const double us = (dt_time_now() - t0) * 1e6;
    if (us < best) best = us;
  }
  iters_per_us = (double)n / best;
}

static void busy_us(double us) { work_iters((long)(us * iters_per_us)); }

enum { WORK_ONLY, BLOCKING, STOP_BLOCKING, ASYNC, STOP_ASYNC, OVERLAP, N_PATTERNS };
static const char *const names[N_PATTERNS] = {"work only", "blocking grad", "stop + blocking grad", "async grad",
                                              "stop + async grad (dtrain)", "async beside work"};

#define TRY(call)                 \
  do {                            \
    dt_status st_ = (call);       \
    if (st_ != DT_OK) return st_; \
  } while (0)

static dt_status step(dt_group *g, int pattern, double work_us, float *grad, size_t numel) {
  int32_t stop = 0;
  if (pattern == OVERLAP) {
    dt_work *w = NULL;
    TRY(dt_allreduce(g, grad, grad, numel, DT_F32, DT_AVG, &w));
    busy_us(work_us);
    dt_status st = dt_work_wait(w, 0);
    dt_work_free(w);
    return st;
  }
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
  const int shared = argc > 4 && strcmp(argv[4], "shared") == 0;
  if (steps < 1 || work_us < 0 || numel < 1 || (argc > 4 && !shared) || argc > 5) {
    fprintf(stderr, "usage: ddp_step_probe [STEPS [WORK_US [NUMEL [shared]]]] (under dtrun or torchrun)\n");
    return 2;
  }
  calibrate();
  dt_group_options o;
  dt_group_options_default(&o);
  dt_group *g = NULL;
  if (dt_group_init(&o, &g) != DT_OK) {
    fprintf(stderr, "ddp_step_probe: %s\n", dt_last_error());
    return 1;
  }
  float *grad = NULL;
  if (shared && dt_group_share(g, (size_t)numel * sizeof *grad, (void **)&grad) != DT_OK) {
    fprintf(stderr, "ddp_step_probe: shared: %s\n", dt_last_error());
    dt_group_destroy(g);
    return 1;
  }
  if (!shared) grad = calloc((size_t)numel, sizeof *grad);
  double *t = malloc(sizeof *t * (size_t)steps);
  int rc = grad && t ? 0 : 1;
  if (dt_group_rank(g) == 0)
    printf("# %d ranks (%s), %d steps of %.1f us busy work, gradient of %ld floats%s; us per step\n%-28s %8s %8s %8s\n",
           dt_group_size(g), dt_group_backend(g), steps, work_us, numel, shared ? " (shared memory)" : "", "pattern",
           "mean", "median", "p90");
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
  if (shared) {
    dt_group_unshare(g, grad);
    dt_group_destroy(g);
    dt_shared_free(grad, (size_t)numel * sizeof *grad);
  } else {
    free(grad);
    dt_group_destroy(g);
  }
  return rc;
}
