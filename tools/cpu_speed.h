/* Each CPU's speed at dtrain's f32 GEMM, measured on one thread pinned to each CPU in turn, as a comment line over
 * and under a benchmark table. The CPUs of one machine can differ, and for a while: on a 2-vCPU AMD EPYC VM one
 * vCPU ran single-worker fashioncnn 14-24% slower than the other for some minutes (at 56% of its AVX-512 FMA rate,
 * the other vCPU idle or not: the host's load on that core), and as fast as the other later. Then one worker's
 * figure depends on the CPU it ran on, and workers that step together run at the slowest one's pace, whatever the
 * strategy. */
#ifndef DT_TOOLS_CPU_SPEED_H
#define DT_TOOLS_CPU_SPEED_H

#include <stdio.h>

/* "# CPU speed <when> (f32 GEMM ..., GFLOP/s): cpu0 217, cpu1 121; the slowest (cpu1) is 56% of the fastest
 * (cpu0): ..." for the CPUs this process may run on; when: "at the start", say. */
void print_cpu_speeds(FILE *f, const char *when);
/* The line's text after "GFLOP/s): " for speeds gflops[i] of CPUs cpus[i], i < n, into out: every CPU's up to 16
 * of them, else the slowest, median and fastest; and, where the slowest is under 90% of the fastest, what that
 * means for the table. */
void describe_cpu_speeds(const int *cpus, const double *gflops, int n, char *out, size_t cap);

#endif
