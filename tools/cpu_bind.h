/* Where a launcher's local workers run: dtrun binds them (--bind-to core, or auto where they fill the CPUs), and
 * `dtrain bench scaling` binds its indep runs the same way, so each meets the CPUs a ddp rank does. */
#ifndef DT_TOOLS_CPU_BIND_H
#define DT_TOOLS_CPU_BIND_H

#include <sched.h> /* cpu_set_t: the includer defines _GNU_SOURCE first */

/* --bind-to auto's rule: bind where k >= 2 workers of t threads each fill the n usable CPUs (k t <= n < k t + t). */
int cpu_bind_auto(int k, int t, int n);
/* Local worker `local`'s CPUs under binding: t of this process's usable CPUs taken in order from index local * t,
 * wrapping round (t at most their count). 1, or 0 with errno set where this process's CPUs cannot be read. */
int cpu_bind_worker(int local, int t, cpu_set_t *out);

#endif
