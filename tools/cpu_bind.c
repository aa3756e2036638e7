/* Where a launcher's local workers run (cpu_bind.h). */
#define _GNU_SOURCE
#include "cpu_bind.h"

#include <errno.h>

int cpu_bind_auto(int k, int t, int n) {
  const long need = (long)k * t;
  return k > 1 && need <= n && need > n - t;
}

int cpu_bind_worker(int local, int t, cpu_set_t *out) {
  cpu_set_t all;
  if (sched_getaffinity(0, sizeof all, &all) != 0) return 0;
  int ids[CPU_SETSIZE], n = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &all)) ids[n++] = c;
  if (n == 0) {
    errno = ESRCH;
    return 0;
  }
  const int per = t < n ? t : n;
  CPU_ZERO(out);
  for (int j = 0; j < per; j++) CPU_SET(ids[((long)local * per + j) % n], out);
  return 1;
}
