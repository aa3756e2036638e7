/* Runs every CPU kernel on seeded random inputs and writes inputs and results for test_kernels_torch.py.
 * Usage: dump_kernels OUT_PREFIX -> OUT_PREFIX.bin and OUT_PREFIX.idx (the format of dump_io.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "dump_io.h"
#include "tensor/kernels.h"

static dt_rng rng;

static float *randf(size_t n, float lo, float hi) {
  float *p = calloc(n ? n : 1, sizeof(float));
  if (!p) exit(2);
  for (size_t i = 0; i < n; i++) p[i] = dt_rng_uniform_range(&rng, lo, hi);
  return p;
}
static float *zeros(size_t n) {
  float *p = calloc(n ? n : 1, sizeof(float));
  if (!p) exit(2);
  return p;
}

static void linear_case(void) {
  const int B = 5, I = 7, O = 3;
  float *x = randf((size_t)B * I, -1, 1), *w = randf((size_t)O * I, -1, 1), *b = randf(O, -1, 1);
  float *dy = randf((size_t)B * O, -1, 1), *y = zeros((size_t)B * O), *dx = zeros((size_t)B * I);
  float *dw = zeros((size_t)O * I), *db = zeros(O);
  dt_linear_forward(DT_AMP_OFF, y, x, w, b, B, I, O);
  dt_linear_backward(DT_AMP_OFF, dx, dw, db, dy, x, w, B, I, O, 0);
  PUTF("linear.x", x, B, I);
  PUTF("linear.w", w, O, I);
  PUTF("linear.b", b, O);
  PUTF("linear.dy", dy, B, O);
  PUTF("linear.y", y, B, O);
  PUTF("linear.dx", dx, B, I);
  PUTF("linear.dw", dw, O, I);
  PUTF("linear.db", db, O);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
}

static void conv_case(const char *tag, int N, int C, int H, int W, int OC, int KH, int KW, int s, int p, int bias) {
  dt_conv2d_geom g;
  if (dt_conv2d_geom_init(&g, N, C, H, W, OC, KH, KW, s, p) != DT_OK) {
    fprintf(stderr, "conv %s: %s\n", tag, dt_last_error());
    exit(1);
  }
  const size_t nx = (size_t)N * C * H * W, nw = (size_t)OC * C * KH * KW, ny = (size_t)N * OC * g.OH * g.OW;
  float *x = randf(nx, -1, 1), *w = randf(nw, -1, 1), *b = bias ? randf(OC, -1, 1) : NULL;
  float *dy = randf(ny, -1, 1), *y = zeros(ny), *dx = zeros(nx), *dw = zeros(nw), *db = zeros(OC);
  float *scratch = zeros(dt_conv2d_scratch_floats(&g));
  dt_conv2d_forward(&g, y, scratch, x, w, b);
  dt_conv2d_backward(&g, dx, dw, bias ? db : NULL, scratch, dy, x, w);
  char name[64];
#define NAME(t) (snprintf(name, sizeof name, "%s.%s", tag, t), name)
  int meta[4] = {s, p, bias, 0};
  PUTI(NAME("meta"), meta, 4);
  PUTF(NAME("x"), x, N, C, H, W);
  PUTF(NAME("w"), w, OC, C, KH, KW);
  if (bias) PUTF(NAME("b"), b, OC);
  PUTF(NAME("dy"), dy, N, OC, g.OH, g.OW);
  PUTF(NAME("y"), y, N, OC, g.OH, g.OW);
  PUTF(NAME("dx"), dx, N, C, H, W);
  PUTF(NAME("dw"), dw, OC, C, KH, KW);
  if (bias) PUTF(NAME("db"), db, OC);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(scratch);
}

static void pool_case(const char *tag, int N, int C, int H, int W, int K, int s, int p) {
  dt_pool2d_geom g;
  if (dt_pool2d_geom_init(&g, N, C, H, W, K, s, p) != DT_OK) {
    fprintf(stderr, "pool %s: %s\n", tag, dt_last_error());
    exit(1);
  }
  const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * g.OH * g.OW;
  float *x = randf(nx, -1, 1), *dy = randf(ny, -1, 1);
  float *my = zeros(ny), *mdx = zeros(nx), *ay = zeros(ny), *adx = zeros(nx);
  int32_t *am = calloc(ny, sizeof(int32_t));
  if (!am) exit(2);
  dt_maxpool2d_forward(&g, my, am, x);
  dt_maxpool2d_backward(&g, mdx, dy, am);
  dt_avgpool2d_forward(&g, ay, x);
  dt_avgpool2d_backward(&g, adx, dy);
  char name[64];
  int meta[3] = {K, s, p};
  PUTI(NAME("meta"), meta, 3);
  PUTF(NAME("x"), x, N, C, H, W);
  PUTF(NAME("dy"), dy, N, C, g.OH, g.OW);
  PUTF(NAME("max_y"), my, N, C, g.OH, g.OW);
  PUTI(NAME("max_idx"), am, N, C, g.OH, g.OW);
  PUTF(NAME("max_dx"), mdx, N, C, H, W);
  PUTF(NAME("avg_y"), ay, N, C, g.OH, g.OW);
  PUTF(NAME("avg_dx"), adx, N, C, H, W);
  free(x), free(dy), free(my), free(mdx), free(ay), free(adx), free(am);
}

/* Batch norm over (N, C, H, W) under keys "<tag>.*". */
static void batchnorm_case(const char *tag, int N, int C, int H, int W) {
  const int HW = H * W;
  char name[64]; /* NAME's */
  const size_t n = (size_t)N * C * HW;
  const float momentum = 0.1f, eps = 1e-5f;
  float *x = randf(n, -2, 3), *gamma = randf(C, 0.5f, 1.5f), *beta = randf(C, -1, 1), *dy = randf(n, -1, 1);
  float *rm0 = randf(C, -1, 1), *rv0 = randf(C, 0.5f, 2), *rm = zeros(C), *rv = zeros(C);
  memcpy(rm, rm0, C * sizeof(float));
  memcpy(rv, rv0, C * sizeof(float));
  float *y = zeros(n), *mean = zeros(C), *invstd = zeros(C), *dx = zeros(n), *dg = zeros(C), *dbeta = zeros(C);
  float *ey = zeros(n);
  dt_batchnorm_forward_train(y, mean, invstd, rm, rv, x, gamma, beta, N, C, HW, momentum, eps);
  dt_batchnorm_backward(dx, dg, dbeta, dy, x, mean, invstd, gamma, N, C, HW);
  dt_batchnorm_forward_eval(ey, x, gamma, beta, rm, rv, N, C, HW, eps);
  PUTF(NAME("x"), x, N, C, H, W);
  PUTF(NAME("gamma"), gamma, C);
  PUTF(NAME("beta"), beta, C);
  PUTF(NAME("dy"), dy, N, C, H, W);
  PUTF(NAME("rm0"), rm0, C);
  PUTF(NAME("rv0"), rv0, C);
  PUTF(NAME("y"), y, N, C, H, W);
  PUTF(NAME("mean"), mean, C);
  PUTF(NAME("invstd"), invstd, C);
  PUTF(NAME("rm"), rm, C);
  PUTF(NAME("rv"), rv, C);
  PUTF(NAME("dx"), dx, N, C, H, W);
  PUTF(NAME("dgamma"), dg, C);
  PUTF(NAME("dbeta"), dbeta, C);
  PUTF(NAME("eval_y"), ey, N, C, H, W);
  free(x), free(gamma), free(beta), free(dy), free(rm0), free(rv0), free(rm), free(rv);
  free(y), free(mean), free(invstd), free(dx), free(dg), free(dbeta), free(ey);
}

static void act_cases(void) {
  static const char *names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};
  static const dt_act_kind kinds[] = {DT_ACT_RELU, DT_ACT_GELU, DT_ACT_GELU_TANH, DT_ACT_TANH, DT_ACT_SIGMOID};
  const int n = 1000;
  for (int k = 0; k < 5; k++) {
    float *x = randf(n, -5, 5), *dy = randf(n, -1, 1), *y = zeros(n), *dx = zeros(n);
    dt_act_forward(kinds[k], y, x, n);
    dt_act_backward(kinds[k], dx, dy, x, y, n);
    char name[64];
    const char *tag = names[k];
    PUTF(NAME("x"), x, n);
    PUTF(NAME("dy"), dy, n);
    PUTF(NAME("y"), y, n);
    PUTF(NAME("dx"), dx, n);
    free(x), free(dy), free(y), free(dx);
  }
}

static void softmax_cases(void) {
  const int B = 6, C = 11;
  const size_t n = (size_t)B * C;
  float *x = randf(n, -8, 8), *dy = randf(n, -1, 1), *y = zeros(n), *dx = zeros(n), *ly = zeros(n), *ldx = zeros(n);
  x[3] = 80.0f; /* a large logit: stability */
  dt_softmax_forward(y, x, B, C);
  dt_softmax_backward(dx, dy, y, B, C);
  dt_log_softmax_forward(ly, x, B, C);
  dt_log_softmax_backward(ldx, dy, ly, B, C);
  PUTF("softmax.x", x, B, C);
  PUTF("softmax.dy", dy, B, C);
  PUTF("softmax.y", y, B, C);
  PUTF("softmax.dx", dx, B, C);
  PUTF("log_softmax.y", ly, B, C);
  PUTF("log_softmax.dx", ldx, B, C);
  free(x), free(dy), free(y), free(dx), free(ly), free(ldx);
}

static void ce_cases(void) {
  const int B = 8, C = 10;
  float *x = randf((size_t)B * C, -4, 4);
  int32_t labels[8];
  for (int b = 0; b < B; b++) labels[b] = (int32_t)dt_rng_below(&rng, C);
  PUTF("ce.x", x, B, C);
  PUTI("ce.labels", labels, B);
  const float eps_list[2] = {0.0f, 0.1f};
  for (int e = 0; e < 2; e++) {
    float loss = 0, *dx = zeros((size_t)B * C);
    if (dt_loss_cross_entropy(x, labels, B, C, eps_list[e], &loss, dx) != DT_OK) {
      fprintf(stderr, "cross entropy: %s\n", dt_last_error());
      exit(1);
    }
    char name[64];
    const char *tag = e == 0 ? "ce0" : "ce1";
    PUTF(NAME("eps"), &eps_list[e], 1);
    PUTF(NAME("loss"), &loss, 1);
    PUTF(NAME("dx"), dx, B, C);
    free(dx);
  }
  free(x);
}

int main(int argc, char **argv) {
  int rc = dump_open(argc, argv);
  if (rc) return rc;
  dt_rng_init(&rng, 1234, 0);
  linear_case();
  conv_case("conv_s1p1", 2, 3, 7, 6, 4, 3, 3, 1, 1, 1);
  /* the direct 3x3 kernels (conv3x3.c): width a multiple of 8 (forward and weight gradient direct), 9+ channels
   * (input gradient by the direct forward, transposed), output channels not a multiple of 4 */
  conv_case("conv_direct16", 3, 9, 5, 16, 6, 3, 3, 1, 1, 1);
  conv_case("conv_direct13", 2, 10, 4, 13, 5, 3, 3, 1, 1, 0); /* width 13: overlapping vectors, GEMM dw */
  conv_case("conv_s2p1", 2, 3, 7, 8, 5, 3, 3, 2, 1, 1);
  conv_case("conv_k2s2", 3, 2, 6, 6, 3, 2, 2, 2, 0, 0);
  conv_case("conv_rect", 2, 2, 5, 7, 3, 3, 2, 1, 0, 1);
  conv_case("conv_s3p2", 1, 2, 9, 8, 2, 5, 5, 3, 2, 1);
  conv_case("conv_fashion", 4, 1, 28, 28, 8, 3, 3, 1, 1, 1);
  pool_case("pool_k2s2", 2, 3, 7, 7, 2, 2, 0);
  pool_case("pool_k3s2p1", 2, 3, 7, 8, 3, 2, 1);
  pool_case("pool_k3s1p1", 1, 2, 5, 5, 3, 1, 1);
  batchnorm_case("bn", 4, 3, 5, 5);
  /* planes of 1075: a run of 1024 (32 blocks of 32), then 51 = 32 + 2 x 8 + 3, every path of the run sums */
  batchnorm_case("bn_long", 2, 2, 43, 25);
  act_cases();
  softmax_cases();
  ce_cases();
  return dump_close();
}
