/* The compute thread budget: one OpenMP pool shared by our loops and OpenBLAS; the cores there are. */
#define _GNU_SOURCE /* sched_getaffinity / CPU_COUNT */
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <stdlib.h>

#include "core/impl.h"

/* OpenBLAS's own setter; declared here so the public headers need no cblas.h. */
void openblas_set_num_threads(int n);

static int thread_budget;

int dt_num_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int dt_usable_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return dt_num_cores();
}

dt_status dt_set_threads(int n) {
  if (n <= 0) {
    long env = 0;
    DT_CHECK(dt_tunable_int("DT_NUM_THREADS", &env));
    if (env < 0) return dt_error(DT_INVALID_ARGUMENT, "DT_NUM_THREADS=%ld must be >= 0", env);
    if (env == 0) {
      /* Launchers and PyTorch users set OMP_NUM_THREADS; honour it next. */
      const char *omp = getenv("OMP_NUM_THREADS");
      char *end = NULL;
      long v = omp && *omp ? strtol(omp, &end, 10) : 0;
      if (omp && *omp && (*end != '\0' || v < 1))
        return dt_error(DT_INVALID_ARGUMENT, "OMP_NUM_THREADS=%s is not a positive integer", omp);
      env = v;
    }
    n = env > 0 ? (int)env : dt_num_cores();
  }
  if (n > 4096) return dt_error(DT_INVALID_ARGUMENT, "thread count %d is too large", n);
  thread_budget = n;
  /* OpenBLAS is the OpenMP build: inside our parallel regions it runs on one
   * thread, outside it uses the same pool, so the process never runs more than n. */
  omp_set_num_threads(n);
  omp_set_max_active_levels(1);
  openblas_set_num_threads(n);
  DT_LOG_INFO("threads", "compute budget %d thread(s)", n);
  return DT_OK;
}

int dt_get_threads(void) {
  if (thread_budget == 0 && dt_set_threads(0) != DT_OK) thread_budget = 1;
  return thread_budget;
}
