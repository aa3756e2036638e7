/* Bench: dtrain's in-place all-reduce of a DDP gradient between the ranks of one host, against a plain
 * hand-written exchange of the same floats on this machine.
 *
 * Each rank pins itself to one CPU (the LOCAL_RANK-th of those it may use), joins the group and, step after step, writes a gradient
 * of NUMEL floats as backward would (a new value everywhere), exchanges it, and reads the average as an optimizer
 * would. The exchange is, in turns of 50 steps:
 *
 *   reference  two arenas and two counters in memory both ranks map (dt_group_share_common), nothing of dtrain's
 *              in the exchange itself: each rank sums its half from both arenas into its own (rank order, then
 *              halved), says so, waits for the other, and copies the other's half from the other's arena; a
 *              last counter sync, as at the end of dtrain's, so nobody rewrites what the other still reads. It is
 *              the 2-rank in-place all-reduce with nothing around it: two reads of a half from the other core.
 *              In whole halves, not chunks: where a half outgrows the core's cache (the 16 MiB layer) dtrain's
 *              chunked pipeline is the faster; at the default mlp's sizes this is what the cores allow.
 *   dtrain     the gradient in memory from dt_group_share, dt_allreduce(DT_AVG) in place and blocking: what DDP's
 *              last bucket does after backward on shared gradients (above 32 KiB; smaller ones go through the
 *              backend's slots, whatever the memory).
 *
 * Rank 0 prints, for each size, both exchanges' median and p90 microseconds, dtrain's over the reference's, and
 * #wrong: the elements where the two results differ (both sum in rank order and halve, so the bits must agree).
 *   dtrun --standalone --nproc-per-node 2 -- build/bench/allreduce_vs_plain [STEPS [NUMEL...]]
 * The defaults are 2000 steps and the default mlp's first layer (200,960 floats: 0.77 MiB), its whole model and
 * the 2048-wide mlp's largest layer. Two ranks only. A bench, not a test: it times, and exits 1 only where #wrong
 * is not 0. */
#define _GNU_SOURCE /* sched_setaffinity */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_line.h"
#include "dtrain/dtrain.h"

#define TURN 50
#define LINE 128

typedef struct counters {
  _Alignas(LINE) _Atomic uint64_t arrived[2][LINE / sizeof(uint64_t)];
} counters;

typedef struct rank_ctx {
  int rank;
  size_t n;
  counters *ctr;     /* in the common memory */
  float *arena[2];   /* the reference's, in the common memory */
  float *shared;     /* dtrain's, from dt_group_share */
  uint64_t posted;   /* the reference's syncs so far */
} rank_ctx;

static volatile double sink; /* the reads of the results, kept */
static size_t any_wrong;

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void post(rank_ctx *c) {
  atomic_store_explicit(&c->ctr->arrived[c->rank][0], ++c->posted, memory_order_release);
}

static void wait_other(const rank_ctx *c) {
  while (atomic_load_explicit(&c->ctr->arrived[1 - c->rank][0], memory_order_acquire) < c->posted) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

/* A new gradient: every element changes every step, as backward's output does. */
static void write_grad(float *g, size_t n, int step, int rank) {
  const float base = (float)(step % 1000) * 0.25f + (float)rank;
  for (size_t i = 0; i < n; i++) g[i] = base + (float)(i & 1023) * 0.5f;
}

/* The reference: this rank's half reduced into its arena, then the other's half copied from the other's arena. */
static void reference_exchange(rank_ctx *c) {
  const size_t h = (c->n / 2) & ~(size_t)15, lo = c->rank ? h : 0, hi = c->rank ? c->n : h;
  float *mine = c->arena[c->rank];
  const float *a0 = c->arena[0], *a1 = c->arena[1], *theirs = c->arena[1 - c->rank];
  post(c); /* the gradient is written */
  wait_other(c);
  for (size_t i = lo; i < hi; i++) mine[i] = (a0[i] + a1[i]) * 0.5f;
  post(c);
  wait_other(c);
  const size_t olo = c->rank ? 0 : h, ohi = c->rank ? h : c->n;
  memcpy(mine + olo, theirs + olo, (ohi - olo) * sizeof *mine);
  post(c); /* as dtrain's all-reduce returns: the other has read this rank's arena, which may now be rewritten */
  wait_other(c);
}

/* One step of a mode: write, exchange (timed), read; returns the exchange's seconds. */
static double step(dt_group *g, rank_ctx *c, int dtrain, int s, dt_status *st) {
  float *grad = dtrain ? c->shared : c->arena[c->rank];
  write_grad(grad, c->n, s, c->rank);
  const double t0 = dt_time_now();
  if (dtrain)
    *st = dt_allreduce(g, grad, grad, c->n, DT_F32, DT_AVG, NULL);
  else
    reference_exchange(c);
  const double t = dt_time_now() - t0;
  double acc = 0;
  for (size_t i = 0; i < c->n; i += 16) acc += grad[i];
  sink += acc;
  return t;
}

/* Elements where the two exchanges' results differ (the same last step's gradient through both). */
static size_t compare_results(dt_group *g, rank_ctx *c, dt_status *st) {
  write_grad(c->shared, c->n, 7, c->rank);
  write_grad(c->arena[c->rank], c->n, 7, c->rank);
  *st = dt_allreduce(g, c->shared, c->shared, c->n, DT_F32, DT_AVG, NULL);
  reference_exchange(c);
  size_t wrong = 0;
  for (size_t i = 0; i < c->n; i++) wrong += memcmp(&c->shared[i], &c->arena[c->rank][i], sizeof(float)) != 0;
  return wrong;
}

/* The LOCAL_RANK-th of the CPUs this process may use (wrapping around), so two ranks of a host get two CPUs. */
static void pin_to_one_cpu(void) {
  const char *lr = getenv("LOCAL_RANK");
  cpu_set_t set, one;
  if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) == 0) {
    perror("allreduce_vs_plain: affinity (running unpinned)");
    return;
  }
  int k = (lr ? atoi(lr) : 0) % CPU_COUNT(&set), cpu = 0;
  while (!CPU_ISSET(cpu, &set) || k-- > 0) cpu++;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0) perror("allreduce_vs_plain: pinning (running unpinned)");
}

static dt_status run_size(dt_group *g, int rank, size_t n, int steps) {
  const size_t arena_bytes = (n * sizeof(float) + 4095) & ~(size_t)4095;
  void *common = NULL, *shared = NULL;
  dt_status st = dt_group_share_common(g, sizeof(counters) + 4096 + 2 * arena_bytes, &common);
  if (st != DT_OK) return st;
  st = dt_group_share(g, n * sizeof(float), &shared);
  if (st != DT_OK) {
    dt_shared_free(common, sizeof(counters) + 4096 + 2 * arena_bytes);
    return st;
  }
  rank_ctx c = {.rank = rank, .n = n, .ctr = common, .shared = shared};
  c.arena[0] = (float *)((char *)common + 4096);
  c.arena[1] = (float *)((char *)common + 4096 + arena_bytes);
  double *t[2] = {calloc((size_t)steps, sizeof(double)), calloc((size_t)steps, sizeof(double))};
  int done[2] = {0, 0}, short_of_memory = !t[0] || !t[1];
  /* both ranks go on, or neither: one alone would wait in the other's exchange for ever */
  st = dt_allreduce(g, &short_of_memory, &short_of_memory, 1, DT_I32, DT_MAX, NULL);
  if (st == DT_OK && short_of_memory) {
    fprintf(stderr, "allreduce_vs_plain: rank %d: no memory for %d timings\n", rank, steps);
    st = DT_OUT_OF_MEMORY;
  }
  for (int s = 0; st == DT_OK && (done[0] < steps || done[1] < steps); s++) {
    const int mode = (s / TURN) % 2;
    const double sec = step(g, &c, mode, s, &st);
    if (s >= 2 * TURN && done[mode] < steps) t[mode][done[mode]++] = sec; /* the first turn of each: warm-up */
  }
  const size_t wrong = st == DT_OK ? compare_results(g, &c, &st) : 0;
  any_wrong += wrong;
  if (st == DT_OK && rank == 0) {
    qsort(t[0], (size_t)steps, sizeof(double), cmp_double);
    qsort(t[1], (size_t)steps, sizeof(double), cmp_double);
    const double r50 = t[0][steps / 2] * 1e6, d50 = t[1][steps / 2] * 1e6;
    printf("%10zu %10.2f %9.1f %9.1f %10.1f %10.1f %8.2f %7zu\n", n, (double)n * 4 / 1048576, r50,
           t[0][steps * 9 / 10] * 1e6, d50, t[1][steps * 9 / 10] * 1e6, d50 / r50, wrong);
  }
  free(t[0]);
  free(t[1]);
  if (st == DT_OK) st = dt_barrier(g, NULL); /* nobody reads the memory any more */
  dt_group_unshare(g, shared);
  dt_shared_free(shared, n * sizeof(float));
  dt_shared_free(common, sizeof(counters) + 4096 + 2 * arena_bytes);
  return st;
}

int main(int argc, char **argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 2000;
  static const size_t defaults[] = {200960, 235146, 4196352};
  if (steps < 10) {
    fprintf(stderr, "usage: allreduce_vs_plain [STEPS (>= 10) [NUMEL...]]\n");
    return 2;
  }
  pin_to_one_cpu();
  dt_set_threads(1);
  dt_group *g = NULL;
  if (dt_group_init(NULL, &g) != DT_OK) {
    fprintf(stderr, "allreduce_vs_plain: joining the group: %s\n", dt_last_error());
    return 1;
  }
  const int rank = dt_group_rank(g);
  if (dt_group_size(g) != 2) {
    if (rank == 0) fprintf(stderr, "allreduce_vs_plain: runs on 2 ranks, not %d\n", dt_group_size(g));
    dt_group_destroy(g);
    return 2;
  }
  if (rank == 0) {
    print_cpu_line(stdout);
    printf("# each rank pinned to one CPU; %d steps of each exchange, in turns of %d; microseconds\n", steps, TURN);
    printf("%10s %10s %9s %9s %10s %10s %8s %7s\n", "floats", "MiB", "ref p50", "ref p90", "dtrain p50",
           "dtrain p90", "ratio", "#wrong");
  }
  dt_status st = DT_OK;
  const int n_sizes = argc > 2 ? argc - 2 : (int)(sizeof defaults / sizeof defaults[0]);
  for (int i = 0; st == DT_OK && i < n_sizes; i++) {
    const long long n = argc > 2 ? atoll(argv[2 + i]) : (long long)defaults[i];
    if (n < 32) {
      if (rank == 0) fprintf(stderr, "allreduce_vs_plain: NUMEL %lld: at least 32\n", n);
      st = DT_INVALID_ARGUMENT;
      break;
    }
    st = run_size(g, rank, (size_t)n, steps);
    if (st != DT_OK) fprintf(stderr, "allreduce_vs_plain: rank %d, %lld floats: %s\n", rank, n, dt_last_error());
  }
  dt_group_destroy(g);
  return st == DT_OK && !any_wrong ? 0 : 1;
}
