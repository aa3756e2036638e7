/* Two builds of libdtrain in one process, their training steps alternated: what a change did to a whole step,
 * measured where the machine's speed drifts between runs (a shared vCPU's neighbours come and go, and whole runs
 * of the two builds minutes apart differ by more than most changes do).
 *
 *   ab_steps [--width W] [--hidden A,B,...] [--ddp PORT [--sharded-b | --fused-b]] LIB_A LIB_B MODEL BATCH CHANNELS
 *            SIDE STEPS
 *
 * Each library is loaded with dlmopen into a namespace of its own (its own OpenMP runtime, oneDNN, OpenBLAS),
 * through the public API only, so both must share it (builds of nearby commits). Each builds the zoo model with
 * the same seed on the same random batch (CHANNELS x SIDE x SIDE images, 10 classes; the model's own dropout)
 * and steps as the trainer does: forward, cross-entropy, deferred zero_grad, backward, SGD (lr 0.01). After one
 * warm-up step each (5 with --ddp), A and B step in turn, STEPS times, the order swapped every pair. Prints each
 * library's median step with its 10th and 90th percentiles, the median of the pairs' B/A ratios with their
 * quartiles, and whether the two sets of parameters ended bit for bit equal. Threads: DT_NUM_THREADS, else 1; with
 * more, OMP_WAIT_POLICY is passive unless set (each OpenMP pool would otherwise spin on the cores the other
 * library's step is using).
 *
 * Each step starts where the other library's step left the caches, not where its own previous step did: a change
 * that only keeps more of a small model in cache from one step to the next reads smaller here than in training.
 *
 * With --ddp PORT it runs under a launcher, once per rank (dtrun --standalone --nproc-per-node 2 --threads-per-proc 1
 * -- ab_steps --ddp 29600 ...): each library forms a group of its own over the launcher's ranks (a store that rank 0
 * serves at MASTER_ADDR:PORT for A, PORT + 1 for B, and a run id of its own, so their shared memory never meets) and
 * wraps its model in DDP as the trainer does (measured bucket layout, shared gradients; the update neither sharded
 * nor fused: the optimizer steps after the all-reduces).
 * A step is then the trainer's DDP step: buffers broadcast, forward, backward with its all-reduces, the wait for
 * them, SGD (with --sharded-b, B's update is DDP's sharded one, each rank stepping its share inside the
 * all-reduces; with --fused-b, B's update is DDP's fused one, every rank stepping every piece of its own parameters
 * inside them: give one library twice to compare the update's placement alone), after 5 warm-up steps each (the
 * layout is planned at the end of the third). Every rank steps on a batch of its own; rank 0 prints its own
 * figures.
 *
 * Run it both ways round (LIB_A LIB_B, then LIB_B LIB_A): where each library's arenas land moves its step by
 * up to about 1% (one library against itself read 0.999-1.008 on a 2-vCPU Zen 5 VM, 300 fashioncnn steps). A
 * change larger than that reads on the same side of 1 both ways; a smaller one may not. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/dtrain.h"

#define CLASSES 10
#define MAX_HIDDEN 16

/* The public API, resolved in one library's namespace (each pointer of the declared function's type). */
#define API_FN(name) __typeof__(&name) name
typedef struct api {
  API_FN(dt_model_zoo_new);
  API_FN(dt_model_build);
  API_FN(dt_model_forward);
  API_FN(dt_loss_cross_entropy);
  API_FN(dt_model_zero_grad_deferred);
  API_FN(dt_model_backward);
  API_FN(dt_optim_config_default);
  API_FN(dt_optim_new);
  API_FN(dt_optim_step);
  API_FN(dt_model_params);
  API_FN(dt_model_grads);
  API_FN(dt_set_threads);
  API_FN(dt_last_error);
  API_FN(dt_dist_env_detect);
  API_FN(dt_group_init_env);
  API_FN(dt_group_destroy);
  API_FN(dt_group_rank);
  API_FN(dt_ddp_config_default);
  API_FN(dt_ddp_new);
  API_FN(dt_ddp_before_forward);
  API_FN(dt_ddp_finish);
  API_FN(dt_ddp_free);
  API_FN(dt_ddp_set_optim);
  API_FN(dt_ddp_fuse_optim);
  API_FN(dt_ddp_set_lr);
} api;

/* One library's model, optimizer and step times. */
typedef struct side {
  const char *path;
  api f;
  dt_model *m;
  dt_optim *opt;
  dt_group *group; /* --ddp: this library's group and DDP */
  dt_ddp *ddp;
  int sharded; /* the DDP steps the parameters */
  float *params;
  size_t n_params;
  double *times;
} side;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int fail(const side *s, const char *what, dt_status st) {
  fprintf(stderr, "ab_steps: %s: %s: %s\n", s->path, what, s->f.dt_last_error());
  (void)st;
  return 1;
}

#define RESOLVE(name)                                                                                  \
  do {                                                                                                 \
    *(void **)&s->f.name = dlsym(h, #name);                                                            \
    if (!s->f.name) return fprintf(stderr, "ab_steps: %s: no symbol %s\n", s->path, #name), 1;         \
  } while (0)

static int load(side *s) {
  void *h = dlmopen(LM_ID_NEWLM, s->path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return fprintf(stderr, "ab_steps: %s\n", dlerror()), 1;
  RESOLVE(dt_model_zoo_new);
  RESOLVE(dt_model_build);
  RESOLVE(dt_model_forward);
  RESOLVE(dt_loss_cross_entropy);
  RESOLVE(dt_model_zero_grad_deferred);
  RESOLVE(dt_model_backward);
  RESOLVE(dt_optim_config_default);
  RESOLVE(dt_optim_new);
  RESOLVE(dt_optim_step);
  RESOLVE(dt_model_params);
  RESOLVE(dt_model_grads);
  RESOLVE(dt_set_threads);
  RESOLVE(dt_last_error);
  RESOLVE(dt_dist_env_detect);
  RESOLVE(dt_group_init_env);
  RESOLVE(dt_group_destroy);
  RESOLVE(dt_group_rank);
  RESOLVE(dt_ddp_config_default);
  RESOLVE(dt_ddp_new);
  RESOLVE(dt_ddp_before_forward);
  RESOLVE(dt_ddp_finish);
  RESOLVE(dt_ddp_free);
  RESOLVE(dt_ddp_set_optim);
  *(void **)&s->f.dt_ddp_fuse_optim = dlsym(h, "dt_ddp_fuse_optim"); /* --fused-b only: older builds lack it */
  RESOLVE(dt_ddp_set_lr);
  return 0;
}

/* --ddp: library k's group over the launcher's ranks (its own store at port + k, its own run id) and its model
 * wrapped as the trainer wraps it. */
static int join(side *s, int k, int port) {
  dt_dist_env env;
  dt_status st;
  if ((st = s->f.dt_dist_env_detect(NULL, 0, 0, &env)) != DT_OK) return fail(s, "the launcher's environment", st);
  env.master_port = port + k;
  env.store_served = 0;
  char id[sizeof env.run_id];
  snprintf(id, sizeof id, "%.100s-ab%d", env.run_id, k);
  memcpy(env.run_id, id, sizeof id);
  if ((st = s->f.dt_group_init_env(&env, NULL, &s->group)) != DT_OK) return fail(s, "group", st);
  dt_ddp_config c;
  s->f.dt_ddp_config_default(&c);
  c.auto_buckets = 1;
  c.shared_grads = 1;
  if ((st = s->f.dt_ddp_new(s->m, s->group, &c, &s->ddp)) != DT_OK) return fail(s, "ddp", st);
  return 0;
}

/* --sharded-b, --fused-b: the optimizer's step moves into the DDP (sharded, the parameters move with it: take them
 * afresh). */
static int shard_update(side *s, int fused) {
  const char *what = fused ? "fused update" : "sharded update";
  if (fused && !s->f.dt_ddp_fuse_optim) return fprintf(stderr, "ab_steps: %s: no dt_ddp_fuse_optim\n", s->path), 1;
  dt_status st = (fused ? s->f.dt_ddp_fuse_optim : s->f.dt_ddp_set_optim)(s->ddp, s->opt, &s->sharded);
  if (st != DT_OK) return fail(s, what, st);
  if (!s->sharded) return fprintf(stderr, "ab_steps: %s: the %s cannot run here\n", s->path, what), 1;
  s->params = s->f.dt_model_params(s->m, &s->n_params);
  s->f.dt_ddp_set_lr(s->ddp, 0.01f);
  return 0;
}

static int setup(side *s, int k, const char *model, const dt_zoo_config *cfg, int batch, int threads, int steps,
                 int port) {
  dt_status st;
  if (load(s)) return 1;
  if ((st = s->f.dt_set_threads(threads)) != DT_OK) return fail(s, "threads", st);
  if ((st = s->f.dt_model_zoo_new(model, cfg, &s->m)) != DT_OK) return fail(s, "zoo", st);
  if ((st = s->f.dt_model_build(s->m, batch, 1)) != DT_OK) return fail(s, "build", st);
  if (port && join(s, k, port)) return 1;
  dt_optim_config oc;
  s->f.dt_optim_config_default(DT_OPTIM_SGD, &oc);
  s->params = s->f.dt_model_params(s->m, &s->n_params);
  if ((st = s->f.dt_optim_new(&oc, s->n_params, &s->opt)) != DT_OK) return fail(s, "optimizer", st);
  s->times = malloc(sizeof(double) * (size_t)steps);
  return s->times ? 0 : (fprintf(stderr, "ab_steps: out of memory\n"), 1);
}

/* One step as the trainer's; its seconds in *dt. */
static int step(side *s, const float *x, const int32_t *labels, int batch, float *dlogits, double *dt) {
  const double t0 = now();
  const float *y;
  float loss;
  dt_status st;
  if (s->ddp && (st = s->f.dt_ddp_before_forward(s->ddp)) != DT_OK) return fail(s, "buffers", st);
  if ((st = s->f.dt_model_forward(s->m, x, batch, &y)) != DT_OK) return fail(s, "forward", st);
  if ((st = s->f.dt_loss_cross_entropy(y, labels, batch, CLASSES, 0.0f, &loss, dlogits)) != DT_OK)
    return fail(s, "loss", st);
  s->f.dt_model_zero_grad_deferred(s->m);
  if ((st = s->f.dt_model_backward(s->m, dlogits)) != DT_OK) return fail(s, "backward", st);
  if (s->ddp && (st = s->f.dt_ddp_finish(s->ddp)) != DT_OK) return fail(s, "all-reduces", st);
  if (!s->sharded && (st = s->f.dt_optim_step(s->opt, s->params, s->f.dt_model_grads(s->m, NULL), 0.01f)) != DT_OK)
    return fail(s, "step", st);
  *dt = now() - t0;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
/* The q-quantile of v[0..n) (sorted in place). */
static double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[(int)(q * (n - 1) + 0.5)];
}

static int parse_hidden(const char *s, int *h) {
  int n = 0;
  for (char *end; *s && n < MAX_HIDDEN; s = *end ? end + 1 : end) {
    const long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > 1 << 20 || (*end && *end != ',')) return -1;
    h[n++] = (int)v;
  }
  return *s ? -1 : n;
}

/* A whole number in [1, max], else -1. */
static int parse_count(const char *s, long max) {
  char *end;
  const long v = strtol(s, &end, 10);
  return end != s && !*end && v >= 1 && v <= max ? (int)v : -1;
}

static int usage(void) {
  fprintf(stderr, "usage: ab_steps [--width W] [--hidden A,B,...] [--ddp PORT [--sharded-b | --fused-b]] LIB_A LIB_B "
                  "MODEL BATCH CHANNELS SIDE STEPS\n");
  return 2;
}

int main(int argc, char **argv) {
  dt_zoo_config cfg = {.ndim = 3, .outputs = CLASSES, .dropout = -1.0f};
  int hidden[MAX_HIDDEN], port = 0, sharded_b = 0, fused_b = 0;
  for (; argc > 2 && argv[1][0] == '-'; argv += 2, argc -= 2) {
    if (strcmp(argv[1], "--width") == 0 && (cfg.width = parse_count(argv[2], 4096)) > 0) continue;
    if (strcmp(argv[1], "--hidden") == 0 && (cfg.n_hidden = parse_hidden(argv[2], hidden)) > 0) {
      cfg.hidden = hidden;
      continue;
    }
    if (strcmp(argv[1], "--ddp") == 0 && (port = parse_count(argv[2], 65534)) >= 1024) continue;
    if (strcmp(argv[1], "--sharded-b") == 0 || strcmp(argv[1], "--fused-b") == 0) { /* flags without a value */
      *(argv[1][2] == 's' ? &sharded_b : &fused_b) = 1;
      argv--, argc++;
      continue;
    }
    fprintf(stderr, "ab_steps: %s %s: not a flag it takes, or a bad value\n", argv[1], argv[2]);
    return usage();
  }
  if ((sharded_b || fused_b) && !port)
    return fprintf(stderr, "ab_steps: --sharded-b and --fused-b need --ddp\n"), usage();
  if (sharded_b && fused_b) return fprintf(stderr, "ab_steps: --sharded-b or --fused-b, not both\n"), usage();
  if (argc != 8) return usage();
  const int batch = parse_count(argv[4], 1 << 16), channels = parse_count(argv[5], 4096);
  const int side_px = parse_count(argv[6], 1 << 14), steps = parse_count(argv[7], 1 << 20);
  if (batch < 1 || channels < 1 || side_px < 1 || steps < 2)
    return fprintf(stderr, "ab_steps: BATCH, CHANNELS and SIDE are whole numbers >= 1, STEPS >= 2\n"), 2;
  const char *env = getenv("DT_NUM_THREADS");
  const int threads = env && parse_count(env, 4096) > 0 ? parse_count(env, 4096) : 1;
  if (threads > 1) setenv("OMP_WAIT_POLICY", "passive", 0); /* before either OpenMP runtime starts */
  cfg.input_shape[0] = channels, cfg.input_shape[1] = side_px, cfg.input_shape[2] = side_px;
  side s[2] = {{.path = argv[1]}, {.path = argv[2]}};
  for (int k = 0; k < 2; k++)
    if (setup(&s[k], k, argv[3], &cfg, batch, threads, steps, port)) return 1;
  if ((sharded_b || fused_b) && shard_update(&s[1], fused_b)) return 1;
  const int rank = port ? s[0].f.dt_group_rank(s[0].group) : 0;
  const size_t n = (size_t)batch * (size_t)channels * (size_t)side_px * (size_t)side_px;
  float *x = malloc(n * sizeof(float)), *dlogits = malloc(sizeof(float) * (size_t)batch * CLASSES);
  int32_t *labels = malloc(sizeof(int32_t) * (size_t)batch);
  double *ratio = malloc(sizeof(double) * (size_t)steps);
  if (!x || !dlogits || !labels || !ratio) return fprintf(stderr, "ab_steps: out of memory\n"), 1;
  uint64_t r = 0x9e3779b97f4a7c15u + (uint64_t)rank; /* --ddp: a batch of each rank's own */
  for (size_t i = 0; i < n; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  for (int i = 0; i < batch; i++) labels[i] = i % CLASSES;
  double warm;
  for (int w = 0; w < (port ? 5 : 1); w++) /* --ddp: past the steps that measure the bucket layout */
    for (int k = 0; k < 2; k++)
      if (step(&s[k], x, labels, batch, dlogits, &warm)) return 1;
  for (int i = 0; i < steps; i++) {
    for (int j = 0; j < 2; j++) { /* A then B, then B then A */
      const int k = j ^ (i & 1);
      if (step(&s[k], x, labels, batch, dlogits, &s[k].times[i])) return 1;
    }
    ratio[i] = s[1].times[i] / s[0].times[i];
  }
  for (int k = 0; port && k < 2; k++) { /* the DDP before its group */
    s[k].f.dt_ddp_free(s[k].ddp);
    s[k].f.dt_group_destroy(s[k].group);
  }
  /* Exits without the libraries' exit handlers: two copies of libcrypto in two namespaces, both used by --ddp's
   * groups, crash in OpenSSL's cleanup at exit. */
  if (rank != 0) _exit(0);
  printf("# %s, batch %d, %dx%dx%d, %d steps each, alternated, %d thread(s)%s\n", argv[3], batch, channels, side_px,
         side_px, steps, threads,
         !port      ? ""
         : sharded_b ? "; DDP steps, B's update sharded, rank 0's times"
         : fused_b   ? "; DDP steps, B's update fused, rank 0's times"
                     : "; DDP steps, rank 0's times");
  for (int k = 0; k < 2; k++) {
    const double p10 = quantile(s[k].times, steps, 0.1), p50 = quantile(s[k].times, steps, 0.5);
    printf("%s  %s: step %.3f ms (p10 %.3f, p90 %.3f)\n", k ? "B" : "A", s[k].path, 1e3 * p50, 1e3 * p10,
           1e3 * quantile(s[k].times, steps, 0.9));
  }
  printf("B/A per pair: median %.4f (quartiles %.4f-%.4f)\n", quantile(ratio, steps, 0.5),
         quantile(ratio, steps, 0.25), quantile(ratio, steps, 0.75));
  const int same = s[0].n_params == s[1].n_params &&
                   memcmp(s[0].params, s[1].params, sizeof(float) * s[0].n_params) == 0;
  printf("parameters after the steps: %s\n", same ? "the same bits" : "differ");
  fflush(stdout);
  _exit(0);
}
