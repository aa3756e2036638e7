/* The conv2d kernels alone on the shapes of resnet20 (CIFAR, batch 128), resnet18 (224, batch 32) and fashioncnn
 * (28x28, batch 64): the best
 * of REPS timings of forward, backward (weight and input gradients) and GFLOP/s of each (2 per multiply-add;
 * backward does twice the forward's). Threads: DT_NUM_THREADS or all cores. With --cpu the times are the
 * process's CPU time, not wall time: on a machine shared with other work (run with OMP_WAIT_POLICY=passive so
 * idle threads do not spin) it compares kernels more steadily than wall time, and GFLOP/s are per busy core.
 *
 * With --algos it times the 3x3 stride-1 layers' kernels one against the other instead: the direct kernels
 * (conv3x3.c) and Winograd's (conv_wino.c), forward and weight gradient, in effective GFLOP/s (the direct
 * algorithm's FLOPs over the time, so the figures compare as speeds).
 *
 *   conv_kernels [--cpu] [--algos] [REPS] [resnet20|resnet18|fashioncnn|all] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/impl.h"
#include "dtrain/dtrain.h"
#include "tensor/conv3x3.h"
#include "tensor/conv_wino.h"
#include "tensor/kernels.h"

typedef struct shape {
  const char *model, *name;
  int N, C, H, OC, K, stride, pad;
} shape;

static const shape shapes[] = {
    {"resnet20", "stem 3->16 32x32", 128, 3, 32, 16, 3, 1, 1},
    {"resnet20", "layer1 16->16 32x32", 128, 16, 32, 16, 3, 1, 1},
    {"resnet20", "layer2 16->32 s2", 128, 16, 32, 32, 3, 2, 1},
    {"resnet20", "layer2 32->32 16x16", 128, 32, 16, 32, 3, 1, 1},
    {"resnet20", "layer3 32->64 s2", 128, 32, 16, 64, 3, 2, 1},
    {"resnet20", "layer3 64->64 8x8", 128, 64, 8, 64, 3, 1, 1},
    {"resnet20", "shortcut 1x1 32->64 s2", 128, 32, 16, 64, 1, 2, 0},
    {"resnet18", "conv1 7x7 3->64 s2", 32, 3, 224, 64, 7, 2, 3},
    {"resnet18", "layer1 64->64 56x56", 32, 64, 56, 64, 3, 1, 1},
    {"resnet18", "layer2 128->128 28x28", 32, 128, 28, 128, 3, 1, 1},
    {"resnet18", "layer3 256->256 14x14", 32, 256, 14, 256, 3, 1, 1},
    {"resnet18", "layer4 512->512 7x7", 32, 512, 7, 512, 3, 1, 1},
    {"fashioncnn", "layer1 1->32 28x28", 64, 1, 28, 32, 3, 1, 1},
    {"fashioncnn", "layer2 32->64 14x14 p0", 64, 32, 14, 64, 3, 1, 0},
};

static float *filled(size_t n) {
  float *p = malloc(n * sizeof(float));
  if (!p) {
    fprintf(stderr, "conv_kernels: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  return p;
}

static int use_cpu;
static double now(void) {
  if (!use_cpu) return dt_time_now();
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef void (*kernel_fn)(const dt_conv2d_geom *g, float *scratch, float *x, float *w, float *y);
static void direct_fwd(const dt_conv2d_geom *g, float *s, float *x, float *w, float *y) { dt_conv3x3_forward(g, y, s, x, w, NULL); }
static void wino_fwd(const dt_conv2d_geom *g, float *s, float *x, float *w, float *y) { dt_wino_forward(g, y, s, x, w, NULL); }
static void direct_dw(const dt_conv2d_geom *g, float *s, float *x, float *w, float *y) { dt_conv3x3_weights(g, w, s, y, x); }
static void wino_dw(const dt_conv2d_geom *g, float *s, float *x, float *w, float *y) { dt_wino_weights(g, w, s, y, x); }

/* Best of reps of one kernel, in seconds; 0 when it does not apply. */
static double best_of(int reps, int applies, kernel_fn f, const dt_conv2d_geom *g, float *s, float *x, float *w,
                      float *y) {
  if (!applies) return 0.0;
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    f(g, s, x, w, y);
    double t = now() - t0;
    if (t < best) best = t;
  }
  return best;
}

static void algos(int reps, const char *which) {
  printf("%-10s %-24s %13s %13s %13s %13s\n", "model", "layer", "direct fwd", "wino fwd", "direct dw", "wino dw");
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    if ((strcmp(which, "all") != 0 && strcmp(which, s->model) != 0) || s->K != 3 || s->stride != 1) continue;
    dt_conv2d_geom g;
    if (dt_conv2d_geom_init(&g, s->N, s->C, s->H, s->H, s->OC, 3, 3, 1, s->pad) != DT_OK) exit(1);
    g.threads = dt_get_threads();
    const size_t nx = (size_t)s->N * s->C * s->H * s->H, nw = (size_t)s->OC * s->C * 9, ny = (size_t)s->N * s->OC * g.OH * g.OW;
    float *x = filled(nx), *w = filled(nw), *y = filled(ny), *scratch = filled(dt_conv2d_scratch_floats(&g));
    const double flop = 2.0 * s->N * s->OC * g.OH * g.OW * (double)s->C * 9;
    const double t[4] = {best_of(reps, dt_conv3x3_forward_applies(&g), direct_fwd, &g, scratch, x, w, y),
                         best_of(reps, dt_wino_applies(&g), wino_fwd, &g, scratch, x, w, y),
                         best_of(reps, dt_conv3x3_weights_applies(&g), direct_dw, &g, scratch, x, w, y),
                         best_of(reps, dt_wino_applies(&g), wino_dw, &g, scratch, x, w, y)};
    printf("%-10s %-24s", s->model, s->name);
    for (int k = 0; k < 4; k++)
      if (t[k] > 0) printf(" %6.1f %6.1f", t[k] * 1e3, flop / t[k] / 1e9); else printf(" %13s", "-");
    printf("   (ms GF/s)\n");
    free(x), free(w), free(y), free(scratch);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--cpu") == 0) use_cpu = 1, argc--, argv++;
  int compare = 0;
  if (argc > 1 && strcmp(argv[1], "--algos") == 0) compare = 1, argc--, argv++;
  char *end = NULL;
  const long reps_arg = argc > 1 ? strtol(argv[1], &end, 10) : 5;
  const char *which = argc > 2 ? argv[2] : "all";
  if ((argc > 1 && (*end || reps_arg < 1 || reps_arg > 1000)) ||
      (strcmp(which, "all") != 0 && strcmp(which, "resnet20") != 0 && strcmp(which, "resnet18") != 0 &&
       strcmp(which, "fashioncnn") != 0)) {
    fprintf(stderr, "usage: conv_kernels [--cpu] [--algos] [REPS (1-1000)] [resnet20|resnet18|fashioncnn|all]\n");
    return 2;
  }
  const int reps = (int)reps_arg;
  if (dt_set_threads(0) != DT_OK) return 1;
  if (compare) {
    algos(reps, which);
    return 0;
  }
  printf("%-10s %-24s %10s %10s %9s %9s\n", "model", "layer", "fwd ms", "bwd ms", "fwd GF/s", "bwd GF/s");
  double tf_all = 0, tb_all = 0, fl_all = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    if (strcmp(which, "all") != 0 && strcmp(which, s->model) != 0) continue;
    dt_conv2d_geom g;
    if (dt_conv2d_geom_init(&g, s->N, s->C, s->H, s->H, s->OC, s->K, s->K, s->stride, s->pad) != DT_OK) return 1;
    g.threads = dt_get_threads();
    const size_t nx = (size_t)s->N * s->C * s->H * s->H, nw = (size_t)s->OC * s->C * s->K * s->K;
    const size_t ny = (size_t)s->N * s->OC * g.OH * g.OW;
    float *x = filled(nx), *w = filled(nw), *y = filled(ny), *dy = filled(ny), *dx = filled(nx), *dw = filled(nw);
    float *scratch = filled(dt_conv2d_scratch_floats(&g));
    double tf = 1e30, tb = 1e30;
    for (int r = 0; r < reps; r++) {
      double t0 = now();
      dt_conv2d_forward(&g, y, scratch, x, w, NULL);
      double t1 = now();
      dt_conv2d_backward(&g, dx, dw, NULL, scratch, dy, x, w);
      double t2 = now();
      if (t1 - t0 < tf) tf = t1 - t0;
      if (t2 - t1 < tb) tb = t2 - t1;
    }
    const double flop = 2.0 * s->N * s->OC * g.OH * g.OW * (double)s->C * s->K * s->K;
    printf("%-10s %-24s %10.2f %10.2f %9.1f %9.1f\n", s->model, s->name, tf * 1e3, tb * 1e3, flop / tf / 1e9,
           2 * flop / tb / 1e9);
    tf_all += tf, tb_all += tb, fl_all += flop;
    free(x), free(w), free(y), free(dy), free(dx), free(dw), free(scratch);
  }
  printf("%-10s %-24s %10.2f %10.2f %9.1f %9.1f\n", "total", "", tf_all * 1e3, tb_all * 1e3, fl_all / tf_all / 1e9,
         2 * fl_all / tb_all / 1e9);
  return 0;
}
