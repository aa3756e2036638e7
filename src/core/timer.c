/* Monotonic wall clock, process CPU time and peak RSS. */
#include <sys/resource.h>
#include <time.h>

#include "core/impl.h"

double dt_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void dt_cpu_time(double *user_s, double *sys_s) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  if (user_s) *user_s = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec;
  if (sys_s) *sys_s = (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

size_t dt_peak_rss(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (size_t)ru.ru_maxrss * 1024u; /* Linux reports KiB */
}
