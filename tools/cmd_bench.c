/* `dtrain bench allreduce`: times all-reduce over a range of sizes, out of
 * place and in place, and prints the nccl-tests table (time per call, algbw =
 * bytes / time, busbw = algbw * 2(n-1)/n, #wrong). Every rank times the same
 * loop; the reported time is the slowest rank's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd_bench.h"
#include "cpu_line.h"
#include "core/impl.h"
#include "dtrain/dtrain.h"

#define TRY(expr)                    \
  do {                               \
    dt_status try_s_ = (expr);       \
    if (try_s_ != DT_OK) return try_s_; \
  } while (0)

/* nccl-tests' type names. */
static const char *type_name(dt_dtype t) {
  switch (t) {
  case DT_F32: return "float";
  case DT_F64: return "double";
  case DT_BF16: return "bfloat16";
  case DT_F16: return "half";
  case DT_I32: return "int32";
  default: return "int64";
  }
}

/* Element i on rank r: small integers, so every dtype and op is exact. */
static double input_value(int r, size_t i) { return (double)((int)((i * 5 + (size_t)r * 3) % 11) - 5); }

static double expected(int world, size_t i, dt_redop op, dt_dtype t) {
  double acc = input_value(0, i);
  for (int r = 1; r < world; r++) {
    double v = input_value(r, i);
    acc = op == DT_MIN ? fmin(acc, v) : op == DT_MAX ? fmax(acc, v) : acc + v;
  }
  if (op == DT_AVG) acc = (t == DT_I32 || t == DT_I64) ? (double)((long long)acc / world) : acc / world;
  return acc;
}

static void put(void *buf, size_t i, dt_dtype t, double v) {
  switch (t) {
  case DT_F32: ((float *)buf)[i] = (float)v; break;
  case DT_F64: ((double *)buf)[i] = v; break;
  case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
  default: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
  }
}

static double get(const void *buf, size_t i, dt_dtype t) {
  switch (t) {
  case DT_F32: return ((const float *)buf)[i];
  case DT_F64: return ((const double *)buf)[i];
  case DT_I32: return ((const int32_t *)buf)[i];
  case DT_I64: return (double)((const int64_t *)buf)[i];
  case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
  default: return dt_f16_to_f32(((const uint16_t *)buf)[i]);
  }
}

static void fill(void *buf, size_t n, dt_dtype t, int rank) {
  for (size_t i = 0; i < n; i++) put(buf, i, t, input_value(rank, i));
}

/* Elements that differ from the expected result, summed over ranks. Averages
 * of 16-bit floats are compared after the same rounding. */
static dt_status count_wrong(dt_group *g, const void *out, size_t n, const bench_allreduce_args *a, long long *wrong) {
  long long bad = 0;
  int world = dt_group_size(g);
  for (size_t i = 0; i < n; i++) {
    double want = expected(world, i, a->op, a->dtype);
    if (a->dtype == DT_F32 || a->dtype == DT_BF16 || a->dtype == DT_F16) {
      char tmp[8];
      put(tmp, 0, a->dtype, want);
      want = get(tmp, 0, a->dtype);
    }
    if (get(out, i, a->dtype) != want) bad++;
  }
  int64_t b = bad;
  TRY(dt_allreduce(g, &b, &b, 1, DT_I64, DT_SUM, NULL));
  *wrong = b;
  return DT_OK;
}

/* Iterations for a size: as many as move about 64 MiB, within [iters/8, iters]
 * (bench/mpi_allreduce.c uses the same rule, so both sides do equal work). */
static int iters_for(size_t bytes, int iters) {
  size_t budget = (size_t)64 << 20, n = bytes ? budget / bytes : (size_t)iters;
  int lo = iters / 8 > 2 ? iters / 8 : 2;
  return n > (size_t)iters ? iters : n < (size_t)lo ? lo : (int)n;
}

/* CPU seconds this process has used (all its threads: the backend's, a communication thread's). */
static double process_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of iters all-reduces (slowest rank), after warmup calls, and the CPU seconds a rank spent per
 * GB all-reduced (mean over ranks; waiting that spins counts: on shared cores it is compute taken away). */
static dt_status time_loop(dt_group *g, const void *send, void *recv, size_t count, const bench_allreduce_args *a,
                           double *per_call, double *cpu_per_gb) {
  for (int i = 0; i < a->warmup; i++) TRY(dt_allreduce(g, send, recv, count, a->dtype, a->op, NULL));
  TRY(dt_barrier(g, NULL));
  const size_t bytes = count * dt_dtype_size(a->dtype);
  int iters = iters_for(bytes, a->iters);
  double t0 = dt_time_now(), c0 = process_cpu_s();
  for (int i = 0; i < iters; i++) TRY(dt_allreduce(g, send, recv, count, a->dtype, a->op, NULL));
  double t = (dt_time_now() - t0) / iters, cpu = process_cpu_s() - c0;
  TRY(dt_allreduce(g, &t, &t, 1, DT_F64, DT_MAX, NULL));
  TRY(dt_allreduce(g, &cpu, &cpu, 1, DT_F64, DT_AVG, NULL));
  *per_call = t;
  *cpu_per_gb = bytes ? cpu / ((double)bytes * iters / 1e9) : 0;
  return DT_OK;
}

/* One half of a row: time (us), algbw, busbw, #wrong; and the CPU seconds per GB. */
static dt_status run_half(dt_group *g, void *send, void *recv, size_t count, int inplace,
                          const bench_allreduce_args *a, double *busbw_out, long long *wrong_out, double *cpu_per_gb,
                          char *cols, size_t len) {
  int world = dt_group_size(g), rank = dt_group_rank(g);
  size_t bytes = count * dt_dtype_size(a->dtype);
  void *src = inplace ? recv : send;
  long long wrong = 0;
  fill(src, count, a->dtype, rank);
  double t;
  TRY(time_loop(g, src, recv, count, a, &t, cpu_per_gb));
  if (a->check) {
    fill(src, count, a->dtype, rank);
    TRY(dt_allreduce(g, src, recv, count, a->dtype, a->op, NULL));
    TRY(count_wrong(g, recv, count, a, &wrong));
  }
  double algbw = t > 0 ? (double)bytes / t / 1e9 : 0;
  double busbw = algbw * (world > 1 ? 2.0 * (world - 1) / world : 0);
  *busbw_out = busbw;
  *wrong_out = wrong;
  if (a->check)
    snprintf(cols, len, " %8.2f %7.2f %7.2f %6lld", t * 1e6, algbw, busbw, wrong);
  else
    snprintf(cols, len, " %8.2f %7.2f %7.2f %6s", t * 1e6, algbw, busbw, "N/A");
  return DT_OK;
}

dt_status bench_allreduce_run(const bench_allreduce_args *a) {
  dt_group_options o;
  dt_group_options_default(&o);
  o.backend = a->backend;
  o.timeout_s = a->timeout_s;
  char url[300];
  if (a->master) {
    snprintf(url, sizeof url, "tcp://%s", a->master);
    o.init_method = url;
  }
  dt_group *g;
  TRY(dt_group_init(&o, &g));
  int rank = dt_group_rank(g), world = dt_group_size(g);
  size_t es = dt_dtype_size(a->dtype);
  size_t max_count = a->max_bytes / es;
  void *send = NULL, *recv = NULL, *shared = NULL;
  dt_status st = dt_alloc(max_count * es + 64, &send);
  if (st == DT_OK) st = dt_alloc(max_count * es + 64, &recv);
  if (st == DT_OK && a->shared) st = dt_group_share(g, max_count * es + 64, &shared);
  if (st != DT_OK) goto out;
  if (rank == 0) {
    printf("# dtrain bench allreduce: %d ranks (%d on this host), backend %s, %s %s, %d iterations after %d warmup%s\n",
           world, dt_group_local_size(g), dt_group_backend(g), type_name(a->dtype), dt_redop_name(a->op), a->iters,
           a->warmup, a->shared ? ", in place on shared memory" : "");
    print_cpu_line(stdout); /* rank 0's host */
    printf("#%82s%34s\n", "out-of-place", "in-place");
    printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s %8s %8s\n", "size", "count", "type", "redop",
           "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "cpu", "cpu-in");
    printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s %8s %8s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "(s/GB)", "(s/GB)");
    fflush(stdout);
  }
  double bus_sum = 0;
  int rows = 0;
  long long wrong_total = 0;
  for (size_t bytes = a->min_bytes; bytes <= a->max_bytes;) {
    size_t count = bytes / es;
    char oop[64], inp[64];
    double bus_o, bus_i, cpu_o, cpu_i;
    long long w_o = 0, w_i = 0;
    st = run_half(g, send, recv, count, 0, a, &bus_o, &w_o, &cpu_o, oop, sizeof oop);
    if (st == DT_OK)
      st = run_half(g, send, shared ? shared : recv, count, 1, a, &bus_i, &w_i, &cpu_i, inp, sizeof inp);
    if (st != DT_OK) goto out;
    if (rank == 0) {
      printf(" %11zu %12zu %8s %6s %6d%s%s %8.3f %8.3f\n", count * es, count, type_name(a->dtype),
             dt_redop_name(a->op), -1, oop, inp, cpu_o, cpu_i);
      fflush(stdout);
    }
    wrong_total += w_o + w_i;
    bus_sum += (bus_o + bus_i) / 2;
    rows++;
    size_t next = (size_t)((double)bytes * a->factor);
    bytes = next > bytes ? next : bytes + 1;
  }
  if (a->shared && rank == 0)
    printf("# In place on shared memory: %llu all-reduces\n", (unsigned long long)dt_group_shared_allreduces(g));
  if (rank == 0) {
    printf("# Out of bounds values : %lld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n", rows ? bus_sum / rows : 0.0);
    printf("#\n");
    fflush(stdout);
  }
  if (wrong_total) st = dt_error(DT_INTERNAL, "%lld wrong values in the all-reduce results", wrong_total);
out:
  dt_free(send);
  dt_free(recv);
  dt_group_unshare(g, shared);
  dt_group_destroy(g);
  dt_shared_free(shared, max_count * es + 64);
  return st;
}
