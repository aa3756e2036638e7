/* `dtrain bench allreduce`: the nccl-tests style collective benchmark. */
#ifndef DT_TOOLS_CMD_BENCH_H
#define DT_TOOLS_CMD_BENCH_H

#include <stddef.h>

#include "dtrain/dist.h"

typedef struct bench_allreduce_args {
  size_t min_bytes, max_bytes;
  double factor;        /* size multiplier between rows (> 1) */
  int iters, warmup;
  int check;            /* verify every result (#wrong column) */
  dt_dtype dtype;
  dt_redop op;
  const char *backend;  /* auto|shm|tcp|mpi */
  const char *master;   /* "host:port" or NULL (from the environment) */
  double timeout_s;     /* 0: DT_TIMEOUT */
  int shared;           /* the in-place half on memory the ranks share (dt_group_share) */
} bench_allreduce_args;

/* Runs under dtrun / torchrun / mpirun / srun; rank 0 prints the table.
 * Returns a dt_status (the caller prints the error). */
dt_status bench_allreduce_run(const bench_allreduce_args *a);

#endif
