/* Each CPU's f32 GEMM speed, one pinned thread at a time (cpu_speed.h). */
#define _GNU_SOURCE
#include "cpu_speed.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/dtrain.h"
#include "tensor/kernels.h"

#define PROBE_N 256   /* a square GEMM of this size: 34 MFLOP, 768 KiB of operands, 0.16 ms on one Zen 5 core */
#define PROBE_CALLS 8 /* a timing, */
#define PROBE_TIMINGS 5 /* the best of these */
#define MAX_CPUS 1024
#define SAME_SPEED 0.9 /* the slowest at this share of the fastest or more: no remark */

typedef struct probe {
  int cpu;
  double gflops; /* 0: could not run there */
} probe;

static void *probe_main(void *arg) {
  probe *p = arg;
  const size_t n = PROBE_N;
  /* this thread's GEMMs on itself alone; it also sets the process's budget (and OpenBLAS's count), which the caller
   * restores after the last probe: nothing else runs meanwhile */
  dt_set_threads(1);
  float *m = NULL;
  if (dt_alloc_array(3 * n * n, sizeof(float), "CPU speed probe", (void **)&m) != DT_OK) return NULL;
  for (size_t i = 0; i < 2 * n * n; i++) m[i] = (float)(i % 7) * 0.125f;
  double best = 0;
  dt_sgemm(0, 0, PROBE_N, PROBE_N, PROBE_N, 1.0f, m, PROBE_N, m + n * n, PROBE_N, 0.0f, m + 2 * n * n, PROBE_N);
  for (int t = 0; t < PROBE_TIMINGS; t++) {
    const double t0 = dt_time_now();
    for (int c = 0; c < PROBE_CALLS; c++)
      dt_sgemm(0, 0, PROBE_N, PROBE_N, PROBE_N, 1.0f, m, PROBE_N, m + n * n, PROBE_N, 0.0f, m + 2 * n * n, PROBE_N);
    const double dt = dt_time_now() - t0, rate = dt > 0 ? 2.0 * n * n * n * PROBE_CALLS / dt / 1e9 : 0;
    if (rate > best) best = rate;
  }
  dt_free(m);
  p->gflops = best;
  return NULL;
}

/* p->cpu's speed on a thread pinned there; 0 where it cannot be pinned or started. */
static void measure(probe *p) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(p->cpu, &one);
  pthread_attr_t attr;
  pthread_t t;
  p->gflops = 0;
  if (pthread_attr_init(&attr) != 0) return;
  if (pthread_attr_setaffinity_np(&attr, sizeof one, &one) == 0 && pthread_create(&t, &attr, probe_main, p) == 0)
    pthread_join(t, NULL);
  pthread_attr_destroy(&attr);
}

static int by_speed(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void describe_cpu_speeds(const int *cpus, const double *gflops, int n, char *out, size_t cap) {
  size_t at = 0;
  if (cap == 0) return;
  out[0] = '\0';
  if (n <= 0) return;
  int lo = 0, hi = 0;
  for (int i = 1; i < n; i++) {
    if (gflops[i] < gflops[lo]) lo = i;
    if (gflops[i] > gflops[hi]) hi = i;
  }
#define PUT(...) (at += (size_t)snprintf(out + at, at < cap ? cap - at : 0, __VA_ARGS__), at = at < cap ? at : cap)
  if (n <= 16) {
    for (int i = 0; i < n; i++) PUT("%scpu%d %.0f", i ? ", " : "", cpus[i], gflops[i]);
  } else {
    double *sorted = malloc((size_t)n * sizeof *sorted);
    PUT("%d CPUs: slowest cpu%d %.0f", n, cpus[lo], gflops[lo]);
    if (sorted) {
      memcpy(sorted, gflops, (size_t)n * sizeof *sorted);
      qsort(sorted, (size_t)n, sizeof *sorted, by_speed);
      PUT(", median %.0f", sorted[n / 2]);
    }
    PUT(", fastest cpu%d %.0f", cpus[hi], gflops[hi]);
    free(sorted);
  }
  if (gflops[hi] > 0 && gflops[lo] < SAME_SPEED * gflops[hi])
    PUT("; the slowest (cpu%d) is %.0f%% of the fastest (cpu%d): one worker's figure depends on the CPU it ran on, "
        "and workers that step together run at the slowest one's pace",
        cpus[lo], 100.0 * gflops[lo] / gflops[hi], cpus[hi]);
#undef PUT
}

void print_cpu_speeds(FILE *f, const char *when) {
  cpu_set_t mine;
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
    fprintf(f, "# CPU speed %s: not measured (this process's CPUs cannot be read)\n", when);
    return;
  }
  int cpus[MAX_CPUS], n = 0;
  double gflops[MAX_CPUS];
  for (int c = 0; c < CPU_SETSIZE && n < MAX_CPUS; c++)
    if (CPU_ISSET(c, &mine)) cpus[n++] = c;
  const int threads = dt_get_threads();
  int measured = 0;
  for (int i = 0; i < n; i++) {
    probe p = {.cpu = cpus[i]};
    measure(&p);
    if (p.gflops > 0) cpus[measured] = cpus[i], gflops[measured++] = p.gflops;
  }
  dt_set_threads(threads); /* the budget and BLAS's count as they were */
  static char text[4096];
  describe_cpu_speeds(cpus, gflops, measured, text, sizeof text);
  if (measured == n)
    fprintf(f, "# CPU speed %s (f32 GEMM %dx%dx%d by %s, one thread pinned to each CPU in turn, GFLOP/s): %s\n", when,
            PROBE_N, PROBE_N, PROBE_N, dt_sgemm_name(), text);
  else if (measured)
    fprintf(f, "# CPU speed %s (f32 GEMM %dx%dx%d by %s, one thread pinned to each CPU in turn, GFLOP/s; %d of %d CPUs "
            "measured): %s\n", when, PROBE_N, PROBE_N, PROBE_N, dt_sgemm_name(), measured, n, text);
  else
    fprintf(f, "# CPU speed %s: not measured (no thread could be pinned to a CPU)\n", when);
}
