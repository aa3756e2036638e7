/* Bench: what the default mlp's step would cost with two ranks if its first layer were split between them by
 * output features, against the data-parallel step dtrain runs, on this machine. A mock, not dtrain: plain C and
 * dtrain's GEMM (dt_sgemm), so that the two ways of dividing the work differ in nothing else.
 *
 * The model is the default mlp (784 -> 256 -> ReLU -> 128 -> ReLU -> 10, softmax cross-entropy), 64 samples a rank
 * a step, plain SGD. Every step first copies a new batch in (as the loader does), so no rank finds the other's
 * inputs still in its cache. Four ways, each in turns of TURN steps, alternated:
 *
 *   single  one process alone on one CPU: the whole step.
 *   indep   two processes, one per CPU, each the whole step and no exchange: the machine's ceiling for two.
 *   ddp     two ranks, the whole step each, gradients in memory both map; then the exchange dtrain's shm backend
 *           runs on one host with the fused update: each rank averages its half of the gradients in place (its
 *           own and the other's), they sync, each steps its whole model, reading the other's half where it lies,
 *           and a last sync. Every step moves the whole gradient (0.9 MiB) between the cores.
 *   split   two ranks; rank r owns the first layer's output features [128 r, 128 r + 128) and the optimizer
 *           state of them only. Both ranks' inputs lie in the shared memory as one matrix of 128 rows. Rank r
 *           multiplies it by its rows (the multiply-adds of one rank's whole layer), syncs, takes its own samples'
 *           other half of the layer's output from the other rank, runs the rest of the model on its own samples,
 *           leaves the gradient of the layer's output in the shared memory, syncs, and computes its rows' weight
 *           gradient over both ranks' samples in one product; the small layers are exchanged as in ddp. Between
 *           the cores: the other's inputs (196 KiB), two halves of activations or their gradient (32 KiB each)
 *           and the small layers' gradients (0.13 MiB) instead of 0.9 MiB; five syncs a step instead of two.
 *
 * It prints, for each way, the median microseconds a step and samples/s over single, and split over ddp, in the
 * median turn and in every turn; the ways run in one order in even turns and in the reverse order in odd ones.
 *   build/bench/split_first_layer [TURNS [TURN]]      (defaults: 9 turns of 400 steps; at most 1000 turns)
 * Its CPUs are the first two this process may use (it needs two). A bench, not a test: it times; it exits 1 without
 * timing where split's first-layer gradient and ddp's average of the same step disagree by more than rounding. */
#define _GNU_SOURCE /* sched_setaffinity */
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpu_line.h"
#include "dtrain/dtrain.h"
#include "tensor/kernels.h"

enum { B = 64, D = 784, H1 = 256, H2 = 128, C = 10, HALF = H1 / 2, POOL = 16, LINE = 128 };
enum way { SINGLE, INDEP, DDP, SPLIT, WAYS };
static const char *const way_name[WAYS] = {"single", "indep", "ddp", "split"};

/* Sizes of the parameter groups, in floats. */
#define N_W1 ((size_t)H1 * D)
#define N_SMALL ((size_t)H2 * H1 + H2 + (size_t)C * H2 + C)
#define N_ALL (N_W1 + H1 + N_SMALL)

/* Memory both ranks map: sync counters, and each rank's shared buffers. */
typedef struct common {
  _Alignas(LINE) _Atomic uint64_t arrived[2][LINE / sizeof(uint64_t)];
  _Alignas(LINE) double median_us[2];
} common;

typedef struct shared_rank {
  float *grads;  /* ddp: all gradients; split: the small layers' */
  float *x;      /* split: this rank's inputs */
  float *z1;     /* split: the first layer's output of both ranks' samples, this rank's features (2B x HALF) */
  float *dz1;    /* split: this rank's samples' gradient of the first layer's output (B x H1) */
} shared_rank;

typedef struct model {
  float *w1, *b1, *w2, *b2, *w3, *b3; /* w1/b1: whole (ddp, single) or this rank's rows (split) */
  float *gw1, *gb1;                   /* the first layer's gradient (private in split) */
  float *small;                       /* gw2, gb2, gw3, gb3 in this order */
  float *z1, *a1, *z2, *a2, *z3, *dz3, *da2, *da1, *dz1;
  float *x, *pool;
  int *labels;
} model;

typedef struct rank_ctx {
  int rank;
  common *com;
  shared_rank sh[2];
  uint64_t posted;
  model m;
} rank_ctx;

static void *checked(void *p) {
  if (!p) {
    fprintf(stderr, "split_first_layer: out of memory\n");
    exit(2);
  }
  return p;
}

static float *floats(size_t n) { return checked(aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64)); }

static void fill(float *p, size_t n, float scale, unsigned *seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = scale * ((float)rand_r(seed) / (float)RAND_MAX - 0.5f);
}

static double now_us(void);

/* Waits for the other rank's same sync; a rank that died (or never started) ends this one after 30 s. */
static void sync_ranks(rank_ctx *c) {
  c->posted++;
  atomic_store_explicit(&c->com->arrived[c->rank][0], c->posted, memory_order_release);
  const double t0 = now_us();
  for (unsigned i = 1; atomic_load_explicit(&c->com->arrived[1 - c->rank][0], memory_order_acquire) < c->posted; i++) {
    __builtin_ia32_pause();
    if ((i & 0xfffff) == 0 && now_us() - t0 > 30e6) {
      fprintf(stderr, "split_first_layer: rank %d waited 30 s for the other rank at sync %llu\n", c->rank,
              (unsigned long long)c->posted);
      _exit(3);
    }
  }
}

static void model_init(model *m, unsigned seed, unsigned data_seed) {
  const int rows = H1;
  m->w1 = floats((size_t)rows * D), m->b1 = floats(rows);
  m->w2 = floats((size_t)H2 * H1), m->b2 = floats(H2), m->w3 = floats((size_t)C * H2), m->b3 = floats(C);
  fill(m->w1, (size_t)rows * D, 0.07f, &seed), fill(m->b1, rows, 0.07f, &seed);
  fill(m->w2, (size_t)H2 * H1, 0.12f, &seed), fill(m->b2, H2, 0.12f, &seed);
  fill(m->w3, (size_t)C * H2, 0.17f, &seed), fill(m->b3, C, 0.17f, &seed);
  m->z1 = floats((size_t)B * H1), m->a1 = floats((size_t)B * H1), m->z2 = floats((size_t)B * H2);
  m->a2 = floats((size_t)B * H2), m->z3 = floats((size_t)B * C), m->dz3 = floats((size_t)B * C);
  m->da2 = floats((size_t)B * H2), m->da1 = floats((size_t)B * H1), m->dz1 = floats((size_t)B * H1);
  m->pool = floats((size_t)POOL * B * D), m->labels = checked(malloc(POOL * B * sizeof(int)));
  fill(m->pool, (size_t)POOL * B * D, 2.0f, &data_seed);
  for (int i = 0; i < POOL * B; i++)
    m->labels[i] = rand_r(&data_seed) % C;
  m->x = floats((size_t)B * D), m->gw1 = floats(N_W1), m->gb1 = floats(H1), m->small = floats(N_SMALL);
}

static void bias_relu(float *z, float *a, const float *b, int rows, int cols, int ld) {
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) {
      z[(size_t)i * ld + j] += b[j];
      if (a)
        a[(size_t)i * ld + j] = z[(size_t)i * ld + j] > 0 ? z[(size_t)i * ld + j] : 0;
    }
}

static void softmax_grad(model *m, const int *labels) {
  for (int i = 0; i < B; i++) {
    float *z = m->z3 + i * C, *d = m->dz3 + i * C, mx = z[0], s = 0;
    for (int j = 1; j < C; j++)
      mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < C; j++)
      s += d[j] = expf(z[j] - mx);
    for (int j = 0; j < C; j++)
      d[j] = (d[j] / s - (j == labels[i])) / B;
  }
}

static void colsum(float *out, const float *g, int rows, int cols, int ld, float alpha, int add) {
  if (!add)
    memset(out, 0, (size_t)cols * sizeof(float));
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++)
      out[j] += alpha * g[(size_t)i * ld + j];
}

/* Everything after the first layer's output: forward, loss, backward down to dz1 (B x H1), the small layers'
 * gradients into m->small. */
static void rest_of_step(model *m, const int *labels) {
  float *gw2 = m->small, *gb2 = gw2 + (size_t)H2 * H1, *gw3 = gb2 + H2, *gb3 = gw3 + (size_t)C * H2;
  dt_sgemm(0, 1, B, H2, H1, 1, m->a1, H1, m->w2, H1, 0, m->z2, H2);
  bias_relu(m->z2, m->a2, m->b2, B, H2, H2);
  dt_sgemm(0, 1, B, C, H2, 1, m->a2, H2, m->w3, H2, 0, m->z3, C);
  bias_relu(m->z3, NULL, m->b3, B, C, C);
  softmax_grad(m, labels);
  dt_sgemm(1, 0, C, H2, B, 1, m->dz3, C, m->a2, H2, 0, gw3, H2);
  colsum(gb3, m->dz3, B, C, C, 1, 0);
  dt_sgemm(0, 0, B, H2, C, 1, m->dz3, C, m->w3, H2, 0, m->da2, H2);
  for (int i = 0; i < B * H2; i++)
    m->da2[i] = m->z2[i] > 0 ? m->da2[i] : 0;
  dt_sgemm(1, 0, H2, H1, B, 1, m->da2, H2, m->a1, H1, 0, gw2, H1);
  colsum(gb2, m->da2, B, H2, H2, 1, 0);
  dt_sgemm(0, 0, B, H1, H2, 1, m->da2, H2, m->w2, H1, 0, m->da1, H1);
  for (int i = 0; i < B * H1; i++)
    m->dz1[i] = m->z1[i] > 0 ? m->da1[i] : 0;
}

static const int *next_batch(model *m, float *x, long step) {
  const size_t at = (size_t)(step % POOL) * B;
  memcpy(x, m->pool + at * D, (size_t)B * D * sizeof(float));
  return m->labels + at;
}

/* The whole step of one rank on its own samples; the gradients go to m->gw1.. (contiguous in ddp). */
static void whole_step(model *m, long step) {
  const int *labels = next_batch(m, m->x, step);
  dt_sgemm(0, 1, B, H1, D, 1, m->x, D, m->w1, D, 0, m->z1, H1);
  bias_relu(m->z1, m->a1, m->b1, B, H1, H1);
  rest_of_step(m, labels);
  dt_sgemm(1, 0, H1, D, B, 1, m->dz1, H1, m->x, D, 0, m->gw1, D);
  colsum(m->gb1, m->dz1, B, H1, H1, 1, 0);
}

static void sgd(float *p, const float *g, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] -= 0.01f * g[i];
}

/* The parameters in the gradients' order: w1, b1 (whole or not at all), then the small layers. */
static void step_params(model *m, const float *g, size_t from, size_t to, int with_first) {
  float *const p[6] = {m->w1, m->b1, m->w2, m->b2, m->w3, m->b3};
  const size_t n[6] = {N_W1, H1, (size_t)H2 * H1, H2, (size_t)C * H2, C};
  size_t at = 0;
  for (int k = with_first ? 0 : 2; k < 6; at += n[k], k++) {
    if (to <= at || from >= at + n[k])
      continue;
    const size_t lo = from > at ? from - at : 0, hi = to < at + n[k] ? to - at : n[k];
    sgd(p[k] + lo, g + at + lo, hi - lo);
  }
}

/* The 2-rank in-place average of n floats in g[0], g[1], each rank stepping the whole of it as it goes. */
static void exchange(rank_ctx *c, float *const g[2], size_t n, int with_first) {
  const int r = c->rank;
  const size_t lo = r ? n / 2 : 0, hi = r ? n : n / 2, plo = r ? 0 : n / 2, phi = r ? n / 2 : n;
  for (size_t i = lo; i < hi; i++)
    g[r][i] = (g[0][i] + g[1][i]) * 0.5f;
  sync_ranks(c);
  step_params(&c->m, g[r], lo, hi, with_first);
  step_params(&c->m, g[1 - r], plo, phi, with_first);
  sync_ranks(c);
}

static void ddp_step(rank_ctx *c, long step) {
  whole_step(&c->m, step);
  float *const g[2] = {c->sh[0].grads, c->sh[1].grads};
  exchange(c, g, N_ALL, 1);
}

/* The first layer's output for both ranks' samples in this rank's features, then this rank's samples' whole. */
static void split_forward(rank_ctx *c) {
  model *m = &c->m;
  const int r = c->rank;
  dt_sgemm(0, 1, 2 * B, HALF, D, 1, c->sh[0].x, D, m->w1, D, 0, c->sh[r].z1, HALF);
  bias_relu(c->sh[r].z1, NULL, m->b1, 2 * B, HALF, HALF);
  sync_ranks(c);
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < B; i++)
      memcpy(m->z1 + (size_t)i * H1 + h * HALF, c->sh[h].z1 + ((size_t)r * B + i) * HALF, HALF * sizeof(float));
  for (int i = 0; i < B * H1; i++)
    m->a1[i] = m->z1[i] > 0 ? m->z1[i] : 0;
}

/* This rank's rows of the first layer's gradient over both ranks' samples (the mean over 2B). */
static void split_first_grad(rank_ctx *c) {
  model *m = &c->m;
  const float *dz = c->sh[0].dz1 + c->rank * HALF;
  dt_sgemm(1, 0, HALF, D, 2 * B, 0.5f, dz, H1, c->sh[0].x, D, 0, m->gw1, D);
  colsum(m->gb1, dz, 2 * B, HALF, H1, 0.5f, 0);
}

static void split_step(rank_ctx *c, long step) {
  model *m = &c->m;
  const int *labels = next_batch(m, c->sh[c->rank].x, step);
  sync_ranks(c);
  split_forward(c);
  rest_of_step(m, labels);
  sync_ranks(c);
  split_first_grad(c);
  sgd(m->w1, m->gw1, (size_t)HALF * D), sgd(m->b1, m->gb1, HALF);
  float *const g[2] = {c->sh[0].grads, c->sh[1].grads};
  exchange(c, g, N_SMALL, 0);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void pin(int k) {
  cpu_set_t can, one;
  CPU_ZERO(&one);
  sched_getaffinity(0, sizeof can, &can);
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &can) && seen++ == k) {
      CPU_SET(cpu, &one);
      sched_setaffinity(0, sizeof one, &one);
      return;
    }
}

/* One rank's turn: steps timed one by one after a warm-up, the median into the common memory. */
static void run_rank(rank_ctx *c, enum way w, int steps) {
  double *t = checked(malloc((size_t)steps * sizeof(double)));
  for (long s = -steps / 8; s < steps; s++) {
    const double t0 = now_us();
    if (w == DDP)
      ddp_step(c, s + 1000);
    else if (w == SPLIT)
      split_step(c, s + 1000);
    else
      whole_step(&c->m, s + 1000);
    if (s >= 0)
      t[s] = now_us() - t0;
  }
  qsort(t, (size_t)steps, sizeof(double), cmp_double);
  c->com->median_us[c->rank] = t[steps / 2];
  free(t);
}

/* Where a way's rank keeps what it shares: ddp's gradients in the shared memory, split's inputs, activations,
 * their gradient and the small layers' gradients there, and split's first layer this rank's rows of it. */
static void rank_setup(rank_ctx *c, enum way w) {
  model *m = &c->m;
  shared_rank *mine = &c->sh[c->rank];
  if (w == DDP)
    m->gw1 = mine->grads, m->gb1 = m->gw1 + N_W1, m->small = m->gb1 + H1;
  if (w != SPLIT)
    return;
  m->w1 += (size_t)c->rank * HALF * D, m->b1 += c->rank * HALF;
  m->x = mine->x, m->dz1 = mine->dz1, m->small = mine->grads;
}

/* Rank r's rows of the first layer's gradient, split, against the average of both ranks' whole ones (before any
 * update). Returns the largest difference relative to the largest magnitude. */
static double check_rank(rank_ctx *c) {
  model *m = &c->m;
  rank_setup(c, DDP);
  whole_step(m, 0);
  sync_ranks(c);
  const float *g0 = c->sh[0].grads + (size_t)c->rank * HALF * D, *g1 = c->sh[1].grads + (size_t)c->rank * HALF * D;
  float *avg = floats((size_t)HALF * D);
  for (size_t i = 0; i < (size_t)HALF * D; i++)
    avg[i] = (g0[i] + g1[i]) * 0.5f;
  sync_ranks(c);
  c->m.gw1 = floats((size_t)HALF * D), c->m.gb1 = floats(HALF);
  rank_setup(c, SPLIT);
  const int *labels = next_batch(m, m->x, 0);
  sync_ranks(c);
  split_forward(c);
  rest_of_step(m, labels);
  sync_ranks(c);
  split_first_grad(c);
  double worst = 0, big = 0;
  for (size_t i = 0; i < (size_t)HALF * D; i++) {
    worst = fmax(worst, fabs((double)avg[i] - m->gw1[i]));
    big = fmax(big, fabs((double)avg[i]));
  }
  return big > 0 ? worst / big : 1;
}

typedef struct arena {
  common *com;
  shared_rank sh[2];
} arena;

static arena map_arena(void) {
  const size_t per = N_ALL + (size_t)B * D + 2 * (size_t)B * HALF + (size_t)B * H1;
  const size_t bytes = sizeof(common) + 2 * (per * sizeof(float) + 8192);
  char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("split_first_layer: mmap");
    exit(2);
  }
  arena a = {.com = (common *)p};
  float *f = (float *)(p + (sizeof(common) + 4095) / 4096 * 4096);
  for (int r = 0; r < 2; r++) /* both ranks' inputs one matrix of 2B rows, and their gradients of z1 */
    a.sh[r].x = f + (size_t)r * B * D, a.sh[r].dz1 = f + 2 * (size_t)B * D + (size_t)r * B * H1;
  f += 2 * (size_t)B * (D + H1);
  for (int r = 0; r < 2; r++) {
    f = (float *)(((uintptr_t)f + 4095) / 4096 * 4096);
    a.sh[r].grads = f, f += N_ALL;
    a.sh[r].z1 = f, f += 2 * (size_t)B * HALF;
  }
  return a;
}

/* Forks the way's processes (one or two), each pinned, and waits; returns the slower rank's median. check != 0
 * runs the gradient check instead and returns its worst relative difference. */
static double run_way(arena *a, enum way w, int steps, int check) {
  const int procs = w == SINGLE ? 1 : 2;
  memset(a->com, 0, sizeof *a->com);
  int started = 0;
  for (int r = 0; r < procs; r++) {
    const pid_t pid = fork();
    if (pid < 0) {
      perror("split_first_layer: fork"); /* a rank already started stops at its first sync's deadline */
      break;
    }
    if (pid > 0) {
      started++;
      continue;
    }
    pin(r);
    omp_set_num_threads(1);
    rank_ctx c = {.rank = r, .com = a->com, .sh = {a->sh[0], a->sh[1]}};
    model_init(&c.m, 12345, 777u + 31u * (unsigned)r);
    if (check)
      a->com->median_us[r] = check_rank(&c);
    else {
      rank_setup(&c, w);
      run_rank(&c, w, steps);
    }
    _exit(0);
  }
  int st, bad = started < procs;
  for (int r = 0; r < started; r++)
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      bad = 1;
  if (bad) {
    fprintf(stderr, "split_first_layer: a rank failed\n");
    exit(2);
  }
  return procs == 1 ? a->com->median_us[0] : fmax(a->com->median_us[0], a->com->median_us[1]);
}

static double median(const double *v, int n) {
  double s[n];
  memcpy(s, v, sizeof s);
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  return s[(n - 1) / 2];
}

/* One line: the median step, and samples/s over the reference's (procs ranks' samples in the way's step against
 * one rank's in the reference's) in the median turn and in each. */
static void print_way(const char *name, const double *us, const double *ref_us, int procs, int turns) {
  double x[turns];
  for (int t = 0; t < turns; t++)
    x[t] = procs * ref_us[t] / us[t];
  printf("%-9s %6.1f %8.3fx  ", name, median(us, turns), median(x, turns));
  for (int t = 0; t < turns; t++)
    printf(" %.3f", x[t]);
  printf("\n");
}

static int parse_count(const char *s, const char *what, long lo, long hi) {
  char *end;
  const long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "split_first_layer: %s must be an integer from %ld to %ld, not '%s'\n", what, lo, hi, s);
    exit(2);
  }
  return (int)v;
}

static int usable_cpus(void) {
  cpu_set_t can;
  return sched_getaffinity(0, sizeof can, &can) == 0 ? CPU_COUNT(&can) : 0;
}

int main(int argc, char **argv) {
  if (argc > 3) {
    fprintf(stderr, "usage: split_first_layer [TURNS [TURN]]\n");
    return 2;
  }
  const int turns = argc > 1 ? parse_count(argv[1], "TURNS", 1, 1000) : 9;
  const int turn = argc > 2 ? parse_count(argv[2], "TURN", 16, 1000000) : 400;
  if (usable_cpus() < 2) {
    fprintf(stderr, "split_first_layer: needs two CPUs, this process may use %d\n", usable_cpus());
    return 2;
  }
  if (dt_sgemm_check() != DT_OK) {
    fprintf(stderr, "split_first_layer: %s\n", dt_last_error());
    return 2;
  }
  arena a = map_arena();
  const double diff = run_way(&a, SPLIT, 0, 1);
  if (!(diff < 1e-4)) {
    fprintf(stderr, "split_first_layer: split's first-layer gradient differs from ddp's by %.3g of its largest\n",
            diff);
    return 1;
  }
  print_cpu_line(stdout);
  printf("# the default mlp, 64 samples a rank, plain SGD, GEMMs by %s; %d turns of %d steps; first layer's gradient, "
         "split against ddp: %.2g of its largest\n", dt_sgemm_name(), turns, turn, diff);
  double us[WAYS][turns];
  for (int t = 0; t < turns; t++)
    for (int k = 0; k < WAYS; k++) {
      const int w = t % 2 ? WAYS - 1 - k : k;
      us[w][t] = run_way(&a, (enum way)w, turn, 0);
    }
  printf("%-7s %8s %9s   every turn\n", "way", "us/step", "x single");
  for (int w = 0; w < WAYS; w++)
    print_way(way_name[w], us[w], us[SINGLE], w == SINGLE ? 1 : 2, turns);
  print_way("split/ddp", us[SPLIT], us[DDP], 1, turns);
  return 0;
}
