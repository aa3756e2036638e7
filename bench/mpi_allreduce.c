/* The reference side of bench/allreduce_vs_mpi.py: Open MPI's MPI_Allreduce of
 * floats (sum) over the same sizes and iteration counts as `dtrain bench
 * allreduce`, printing the same nccl-tests table (out of place, then in place;
 * the slowest rank's time per call; last, the CPU seconds per GB out of place,
 * the mean over ranks).
 *
 *   mpirun -n 2 mpi_allreduce -b 8 -e 64M -f 4 [-n ITERS] [-w WARMUP] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (size_t)v;
}

/* Iterations for a size: as many as give about 64 MiB of traffic, within [iters/8, iters]. */
static int iters_for(size_t bytes, int iters) {
  size_t budget = (size_t)64 << 20, n = bytes ? budget / bytes : (size_t)iters;
  int lo = iters / 8 > 2 ? iters / 8 : 2;
  return n > (size_t)iters ? iters : n < (size_t)lo ? lo : (int)n;
}

static double process_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The slowest rank's seconds per call; *cpu_per_gb: CPU seconds per GB all-reduced, the mean over ranks. */
static double time_loop(const void *send, void *recv, int count, int iters, int warmup, double *cpu_per_gb) {
  for (int i = 0; i < warmup; i++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime(), c0 = process_cpu_s();
  for (int i = 0; i < iters; i++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double t = (MPI_Wtime() - t0) / iters, tmax, cpu = process_cpu_s() - c0, cpu_sum;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&cpu, &cpu_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int world;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  *cpu_per_gb = cpu_sum / world / ((double)count * 4 * iters / 1e9);
  return tmax;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  size_t minb = 8, maxb = (size_t)64 << 20;
  double factor = 2;
  int iters = 100, warmup = 5, rank, world;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) minb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  float *send = calloc(maxb / 4 + 16, 4), *recv = calloc(maxb / 4 + 16, 4);
  if (rank == 0) {
    printf("# MPI_Allreduce: %d ranks, float sum\n", world);
    printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s %8s\n", "size", "count", "type", "redop", "root",
           "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "cpu");
  }
  double bus_sum = 0;
  int rows = 0;
  for (size_t bytes = minb; bytes <= maxb;) {
    int count = (int)(bytes / 4), n = iters_for(bytes, iters);
    double cpu_o, cpu_i;
    double t_o = time_loop(send, recv, count, n, warmup, &cpu_o);
    double t_i = time_loop(MPI_IN_PLACE, recv, count, n, warmup, &cpu_i);
    double f = world > 1 ? 2.0 * (world - 1) / world : 0, b = (double)count * 4;
    if (rank == 0)
      printf(" %11zu %12d %8s %6s %6d %8.2f %7.2f %7.2f %6s %8.2f %7.2f %7.2f %6s %8.3f\n", (size_t)count * 4, count,
             "float", "sum", -1, t_o * 1e6, b / t_o / 1e9, b / t_o / 1e9 * f, "N/A", t_i * 1e6, b / t_i / 1e9,
             b / t_i / 1e9 * f, "N/A", cpu_o);
    bus_sum += (b / t_o / 1e9 * f + b / t_i / 1e9 * f) / 2;
    rows++;
    size_t next = (size_t)((double)bytes * factor);
    bytes = next > bytes ? next : bytes + 1;
  }
  if (rank == 0) printf("# Avg bus bandwidth    : %g \n", bus_sum / rows);
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
