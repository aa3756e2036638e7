/* The thread budget: OpenBLAS and our OpenMP loops together never run more threads than dt_set_threads allows. */
#define _GNU_SOURCE /* sched_setaffinity / CPU_SET */
#include <dirent.h>
#include <sched.h>
#include <omp.h>

#include "core/impl.h"
#include "harness.h"
#include "tensor/kernels.h"

/* Threads of this process right now (entries of /proc/self/task). */
static int count_threads(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* A GEMM large enough that OpenBLAS would go parallel, then an OpenMP loop. */
static void work(float *a, float *b, float *c, int n) {
  dt_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  dt_act_forward(DT_ACT_TANH, c, c, (size_t)n * n);
}

TEST(budget_of_one_runs_one_thread) {
  if (count_threads() < 0) {
    printf("  /proc/self/task not readable: skipped\n");
    return;
  }
  const int n = 512;
  float *a, *b, *c;
  ASSERT_OK(dt_alloc_array((size_t)n * n, sizeof(float), "a", (void **)&a));
  ASSERT_OK(dt_alloc_array((size_t)n * n, sizeof(float), "b", (void **)&b));
  ASSERT_OK(dt_alloc_array((size_t)n * n, sizeof(float), "c", (void **)&c));
  ASSERT_OK(dt_set_threads(1));
  work(a, b, c, n);
  /* A pthread build of OpenBLAS would have started its own pool here. */
  ASSERT_EQ(count_threads(), 1);
  ASSERT_EQ(omp_get_max_threads(), 1);
  ASSERT_OK(dt_set_threads(2));
  work(a, b, c, n);
  ASSERT(count_threads() <= 2);
  ASSERT_EQ(omp_get_max_threads(), 2);
  dt_free(a);
  dt_free(b);
  dt_free(c);
}

TEST(environment_budget_and_bad_values) {
  setenv("DT_NUM_THREADS", "1", 1);
  ASSERT_OK(dt_set_threads(0));
  ASSERT_EQ(dt_get_threads(), 1);
  setenv("DT_NUM_THREADS", "-3", 1);
  ASSERT_STATUS(dt_set_threads(0), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "DT_NUM_THREADS") != NULL);
  setenv("DT_NUM_THREADS", "two", 1);
  ASSERT_STATUS(dt_set_threads(0), DT_INVALID_ARGUMENT);
  unsetenv("DT_NUM_THREADS");
  ASSERT_STATUS(dt_set_threads(100000), DT_INVALID_ARGUMENT);
}

/* The usable cores follow the process's affinity (a taskset, a launcher's binding); the online cores do not. */
TEST(usable_cores_follow_the_affinity) {
  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  ASSERT_EQ(dt_usable_cores(), CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) first++;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  const int online = dt_num_cores();
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int usable = dt_usable_cores();
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  ASSERT_EQ(usable, 1);
  ASSERT_EQ(dt_num_cores(), online);
}

TEST_MAIN(TEST_ENTRY(budget_of_one_runs_one_thread), TEST_ENTRY(environment_budget_and_bad_values),
          TEST_ENTRY(usable_cores_follow_the_affinity))
