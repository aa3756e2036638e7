/* CPU kernel tests: finite-difference gradients of every kernel, accumulation, exact small cases, errors. */
#include <stdint.h>
#include <string.h>

#include "dtrain/loss.h"
#include "harness.h"
#include "tensor/conv3x3.h"
#include "tensor/conv_wino.h"
#include "tensor/kernels.h"

/* ---- finite differences ---------------------------------------------------
 * Objective L = sum(dout * out), summed in double. The numeric gradient of a
 * buffer element is (L(x+h) - L(x-h)) / 2h; it must match the analytic one
 * within tol * max(1, max |analytic|). Returns the number of mismatches. */
typedef void (*fwd_fn)(void *ctx, float *out);

typedef struct fd_spec {
  fwd_fn fwd;
  void *ctx;
  float *out;        /* (n_out) scratch for the forward */
  const float *dout; /* (n_out) */
  size_t n_out;
  double h, tol;
} fd_spec;

static double objective(const fd_spec *s) {
  s->fwd(s->ctx, s->out);
  double L = 0.0;
  for (size_t i = 0; i < s->n_out; i++) L += (double)s->dout[i] * s->out[i];
  return L;
}

static int fd_check(const char *what, const fd_spec *s, float *x, const float *analytic, size_t n) {
  double scale = 1.0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(analytic[i]));
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    const float save = x[i];
    x[i] = (float)(save + s->h);
    const double lp = objective(s);
    x[i] = (float)(save - s->h);
    const double lm = objective(s);
    x[i] = save;
    /* divide by the step actually taken after float rounding */
    const double num = (lp - lm) / ((double)(float)(save + s->h) - (double)(float)(save - s->h));
    if (!(fabs(num - analytic[i]) <= s->tol * scale)) {
      if (bad < 3) fprintf(stderr, "  %s[%zu]: analytic %.7g numeric %.7g\n", what, i, analytic[i], num);
      bad++;
    }
  }
  objective(s); /* leave out as the unperturbed forward */
  return bad;
}

static dt_rng rng;
static float *randf(size_t n, float lo, float hi) {
  float *p = calloc(n ? n : 1, sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = dt_rng_uniform_range(&rng, lo, hi);
  return p;
}
static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }
/* values spaced >= step apart in random order: no ties or kinks within a finite-difference step */
static float *spaced(size_t n, float step) {
  float *p = zeros(n);
  for (size_t i = 0; i < n; i++) p[i] = ((float)i - (float)n / 2) * step;
  for (size_t i = n; i > 1; i--) {
    size_t j = dt_rng_below(&rng, (uint32_t)i);
    float t = p[i - 1];
    p[i - 1] = p[j];
    p[j] = t;
  }
  return p;
}

/* ---- linear ---- */
typedef struct lin_ctx {
  float *x, *w, *b;
  int B, I, O;
} lin_ctx;
static void lin_fwd(void *c, float *out) {
  lin_ctx *k = c;
  dt_linear_forward(DT_AMP_OFF, out, k->x, k->w, k->b, k->B, k->I, k->O);
}

TEST(linear_grad) {
  dt_rng_init(&rng, 1, 0);
  lin_ctx k = {randf(12, -1, 1), randf(20, -1, 1), randf(5, -1, 1), 3, 4, 5};
  float *dy = randf(15, -1, 1), *y = zeros(15), *dx = zeros(12), *dw = zeros(20), *db = zeros(5);
  lin_fwd(&k, y);
  /* exact value of out[0][0] */
  double ref = k.b[0];
  for (int i = 0; i < 4; i++) ref += (double)k.x[i] * k.w[i];
  ASSERT_NEAR(y[0], ref, 1e-6);
  dt_linear_backward(DT_AMP_OFF, dx, dw, db, dy, k.x, k.w, 3, 4, 5, 0);
  fd_spec s = {lin_fwd, &k, y, dy, 15, 1e-2, 1e-4};
  ASSERT_EQ(fd_check("dx", &s, k.x, dx, 12), 0);
  ASSERT_EQ(fd_check("dw", &s, k.w, dw, 20), 0);
  ASSERT_EQ(fd_check("db", &s, k.b, db, 5), 0);
  /* accumulation: a second backward doubles dw and db, rewrites dx */
  float *dx2 = zeros(12), *dw2 = zeros(20), *db2 = zeros(5);
  memcpy(dw2, dw, 20 * sizeof(float));
  memcpy(db2, db, 5 * sizeof(float));
  dt_linear_backward(DT_AMP_OFF, dx2, dw2, db2, dy, k.x, k.w, 3, 4, 5, 0);
  for (int i = 0; i < 20; i++) ASSERT_NEAR(dw2[i], 2 * dw[i], 1e-6);
  for (int i = 0; i < 5; i++) ASSERT_NEAR(db2[i], 2 * db[i], 1e-6);
  for (int i = 0; i < 12; i++) ASSERT_EQ(dx2[i] == dx[i], 1);
  /* assign: dw and db written over whatever they held (NaN here), to the bits of a sum into zeros */
  for (int i = 0; i < 20; i++) dw2[i] = NAN;
  for (int i = 0; i < 5; i++) db2[i] = NAN;
  dt_linear_backward(DT_AMP_OFF, dx2, dw2, db2, dy, k.x, k.w, 3, 4, 5, 1);
  ASSERT_EQ(memcmp(dw2, dw, 20 * sizeof(float)), 0);
  ASSERT_EQ(memcmp(db2, db, 5 * sizeof(float)), 0);
  /* NULL gradients are skipped; no bias */
  dt_linear_backward(DT_AMP_OFF, NULL, NULL, NULL, dy, k.x, k.w, 3, 4, 5, 0);
  float *bias = k.b;
  k.b = NULL;
  lin_fwd(&k, y);
  ref = 0;
  for (int i = 0; i < 4; i++) ref += (double)k.x[i] * k.w[i];
  ASSERT_NEAR(y[0], ref, 1e-6);
  free(k.x), free(k.w), free(bias), free(dy), free(y), free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
}

/* ---- conv2d ---- */
typedef struct conv_ctx {
  dt_conv2d_geom g;
  float *x, *w, *b, *scratch;
} conv_ctx;
static void conv_fwd(void *c, float *out) {
  conv_ctx *k = c;
  dt_conv2d_forward(&k->g, out, k->scratch, k->x, k->w, k->b);
}

static int conv_grad_case(int N, int C, int H, int W, int OC, int K, int s, int p, int bias) {
  conv_ctx k;
  if (dt_conv2d_geom_init(&k.g, N, C, H, W, OC, K, K, s, p) != DT_OK) return 100;
  const size_t nx = (size_t)N * C * H * W, nw = (size_t)OC * C * K * K, ny = (size_t)N * OC * k.g.OH * k.g.OW;
  k.x = randf(nx, -1, 1);
  k.w = randf(nw, -1, 1);
  k.b = bias ? randf(OC, -1, 1) : NULL;
  k.scratch = zeros(dt_conv2d_scratch_floats(&k.g));
  float *dy = randf(ny, -1, 1), *y = zeros(ny), *dx = randf(nx, 5, 6), *dw = zeros(nw), *db = zeros(OC);
  conv_fwd(&k, y);
  dt_conv2d_backward(&k.g, dx, dw, bias ? db : NULL, k.scratch, dy, k.x, k.w);
  fd_spec sp = {conv_fwd, &k, y, dy, ny, 1e-2, 1e-4};
  int bad = fd_check("conv dx", &sp, k.x, dx, nx) + fd_check("conv dw", &sp, k.w, dw, nw);
  if (bias) bad += fd_check("conv db", &sp, k.b, db, OC);
  /* accumulation: dw, db double; dx (garbage-filled first) is overwritten, not added to */
  float *dw2 = zeros(nw), *db2 = zeros(OC), *dx2 = randf(nx, 5, 6);
  memcpy(dw2, dw, nw * sizeof(float));
  memcpy(db2, db, OC * sizeof(float));
  conv_fwd(&k, y);
  dt_conv2d_backward(&k.g, dx2, dw2, bias ? db2 : NULL, k.scratch, dy, k.x, k.w);
  for (size_t i = 0; i < nw; i++) bad += fabsf(dw2[i] - 2 * dw[i]) > 1e-5f * fmaxf(1, fabsf(dw[i]));
  for (int i = 0; i < OC; i++) bad += fabsf(db2[i] - 2 * db[i]) > 1e-5f * fmaxf(1, fabsf(db[i]));
  for (size_t i = 0; i < nx; i++) bad += dx2[i] != dx[i];
  free(k.x), free(k.w), free(k.b), free(k.scratch), free(dy), free(y), free(dx), free(dw), free(db);
  free(dw2), free(db2), free(dx2);
  return bad;
}

TEST(conv2d_grad) {
  dt_rng_init(&rng, 2, 0);
  ASSERT_EQ(conv_grad_case(2, 3, 5, 6, 4, 3, 1, 1, 1), 0); /* stride 1, pad 1, bias */
  ASSERT_EQ(conv_grad_case(2, 2, 7, 6, 3, 3, 2, 1, 1), 0); /* stride 2, pad 1 */
  ASSERT_EQ(conv_grad_case(1, 2, 6, 6, 2, 2, 2, 0, 0), 0); /* stride 2, no pad, no bias */
  ASSERT_EQ(conv_grad_case(2, 1, 5, 5, 2, 5, 3, 2, 1), 0); /* stride 3, pad 2 */
}

/* Backward spreads groups of samples over threads, each with its own dw partial (threads capped at the groups).
 * 8x8 outputs make groups of 8 samples (512 GEMM columns), so 11 samples are a full and a short group. */
TEST(conv2d_grad_threads) {
  dt_rng_init(&rng, 12, 0);
  ASSERT_OK(dt_set_threads(3));
  ASSERT_EQ(conv_grad_case(5, 2, 6, 5, 3, 3, 1, 1, 1), 0); /* 5 samples, one group */
  ASSERT_EQ(conv_grad_case(1, 2, 5, 5, 2, 3, 1, 0, 1), 0); /* 1 sample: one thread */
  ASSERT_EQ(conv_grad_case(11, 2, 8, 8, 3, 3, 1, 1, 1), 0); /* groups of 8 and 3 over 2 threads */
  ASSERT_EQ(conv_grad_case(11, 2, 16, 16, 3, 3, 2, 1, 1), 0); /* stride 2: col2im input gradient, grouped */
  ASSERT_EQ(conv_grad_case(3, 9, 12, 12, 3, 3, 1, 1, 0), 0); /* one sample a group, 3 threads; 9 channels: the
                                                               input gradient as a transposed convolution */
  ASSERT_OK(dt_set_threads(1));
  ASSERT_EQ(conv_grad_case(5, 2, 6, 5, 3, 3, 1, 1, 1), 0);
  ASSERT_EQ(conv_grad_case(11, 2, 8, 8, 3, 3, 1, 1, 1), 0);
  ASSERT_EQ(conv_grad_case(2, 9, 6, 6, 4, 3, 1, 0, 1), 0); /* pad 0: GEMM + col2im (a transposed one would be larger) */
}

/* A kernel's 16-wide vectors (AVX-512) against its 8-wide ones, switched by set_wide: the same bytes of output and
 * gradients (where the build has no 16-wide path both runs take the 8-wide one). applies: the kernel takes g. */
static int widths_case(void (*set_wide)(int), int (*applies)(const dt_conv2d_geom *), int N, int C, int H, int W,
                       int OC) {
  dt_conv2d_geom g;
  if (dt_conv2d_geom_init(&g, N, C, H, W, OC, 3, 3, 1, 1) != DT_OK || !applies(&g)) return 100;
  const size_t nx = (size_t)N * C * H * W, nw = (size_t)OC * C * 9, ny = (size_t)N * OC * H * W;
  float *x = randf(nx, -1, 1), *w = randf(nw, -1, 1), *b = randf(OC, -1, 1), *dy = randf(ny, -1, 1);
  float *out[2][3], *scratch = zeros(dt_conv2d_scratch_floats(&g));
  for (int k = 0; k < 2; k++) {
    out[k][0] = zeros(ny), out[k][1] = zeros(nx), out[k][2] = zeros(nw);
    set_wide(k == 0);
    dt_conv2d_forward(&g, out[k][0], scratch, x, w, b);
    dt_conv2d_backward(&g, out[k][1], out[k][2], NULL, scratch, dy, x, w);
  }
  set_wide(1);
  const int bad = memcmp(out[0][0], out[1][0], ny * sizeof(float)) ||
                  memcmp(out[0][1], out[1][1], nx * sizeof(float)) || memcmp(out[0][2], out[1][2], nw * sizeof(float));
  if (bad) fprintf(stderr, "N=%d C=%d %dx%d OC=%d: 16-wide and 8-wide vectors differ\n", N, C, H, W, OC);
  for (int k = 0; k < 2; k++) free(out[k][0]), free(out[k][1]), free(out[k][2]);
  free(x), free(w), free(b), free(dy), free(scratch);
  return bad;
}

/* The direct 3x3 stride-1 pad-1 kernels (conv3x3.c) take widths >= 8: forward by vectors of 8 along a row (16
 * with AVX-512 on rows of 16 and more; the last two overlapping when the width is not a multiple of the vector),
 * weight gradient likewise, the overlapped lanes of the last vector masked off (samples grouped to 64 vectors),
 * input gradient as the direct forward of the transposed convolution (9+ channels). */
TEST(conv2d_direct_grad) {
  dt_rng_init(&rng, 13, 0);
  for (int t = 1; t <= 3; t += 2) {
    ASSERT_OK(dt_set_threads(t));
    ASSERT_EQ(conv_grad_case(3, 3, 4, 8, 5, 3, 1, 1, 1), 0);   /* 3 input channels: GEMM input gradient */
    ASSERT_EQ(conv_grad_case(11, 9, 3, 16, 6, 3, 1, 1, 0), 0); /* dw groups of 11 samples (6 vectors each) */
    ASSERT_EQ(conv_grad_case(2, 10, 5, 13, 4, 3, 1, 1, 1), 0); /* width 13: overlap, 3 lanes masked in dw */
    ASSERT_EQ(conv_grad_case(3, 1, 6, 28, 4, 3, 1, 1, 1), 0);  /* one channel, width 28 (fashioncnn's first) */
    ASSERT_EQ(conv_grad_case(2, 3, 4, 9, 5, 3, 1, 1, 0), 0);   /* width 9: 7 lanes masked */
    ASSERT_EQ(conv_grad_case(5, 8, 8, 8, 9, 3, 1, 1, 0), 0);   /* 9 output channels: a block of 1 */
    /* The forward in vectors of 16 (AVX-512, rows of 16 and more) against vectors of 8, byte for byte: widths 16
     * (a vector a row), 20 and 28 (the last overlapping), 33; 1, 3 and 9 channels; 5 outputs (a short block) */
    static const int widths[][5] = {{2, 1, 5, 16, 5}, {3, 3, 4, 20, 5}, {2, 1, 6, 28, 32}, {1, 9, 3, 33, 5}};
    for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++)
      ASSERT_EQ(widths_case(dt_conv3x3_set_wide, dt_conv3x3_forward_applies, widths[k][0], widths[k][1], widths[k][2],
                            widths[k][3], widths[k][4]),
                0);
  }
  ASSERT_OK(dt_set_threads(1));
}

/* Winograd (conv_wino.c) takes 3x3 stride-1 convolutions padded by 0 to 2 whose channels come in 8s, with tiles of
 * 2x2 outputs (outputs under 16x16 or wide kernels) or 4x4: forward, input and weight gradients against sums in double
 * over every tap, relative to the sum of the terms' magnitudes; sizes that are not multiples of the tile (the
 * last tiles half outside), 8 and 24 output channels (register blocks of 8 and of 16), bias or none, 1 and 3
 * threads; the AVX-512 blocks (16 and 32 outputs) byte for byte against the 8-wide ones; and one case by finite
 * differences, with gradient accumulation. */
typedef struct conv_ref {
  double *y, *dx, *dw, *my, *mdx, *mdw; /* values and sums of magnitudes */
} conv_ref;

static void naive_conv(const dt_conv2d_geom *g, const float *x, const float *w, const float *b, const float *dy,
                       conv_ref *r) {
  const int H = g->H, W = g->W, C = g->C, OC = g->OC, OH = g->OH, OW = g->OW;
  for (int n = 0; n < g->N; n++)
    for (int o = 0; o < OC; o++)
      for (int h = 0; h < OH; h++)
        for (int v = 0; v < OW; v++) {
          const size_t yi = (((size_t)n * OC + o) * OH + h) * OW + v;
          r->y[yi] = b ? b[o] : 0.0, r->my[yi] = fabs(r->y[yi]);
          for (int c = 0; c < C; c++)
            for (int k = 0; k < 9; k++) {
              const int ih = h + k / 3 - g->pad, iw = v + k % 3 - g->pad;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              const size_t xi = (((size_t)n * C + c) * H + ih) * W + iw, wi = ((size_t)o * C + c) * 9 + k;
              r->y[yi] += (double)x[xi] * w[wi], r->my[yi] += fabs((double)x[xi] * w[wi]);
              r->dx[xi] += (double)dy[yi] * w[wi], r->mdx[xi] += fabs((double)dy[yi] * w[wi]);
              r->dw[wi] += (double)dy[yi] * x[xi], r->mdw[wi] += fabs((double)dy[yi] * x[xi]);
            }
        }
}

static double worst_rel(const float *got, const double *ref, const double *mag, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double e = fabs(got[i] - ref[i]) / (mag[i] > 1e-3 ? mag[i] : 1e-3);
    if (e > worst) worst = e;
  }
  return worst;
}

static double *dzeros(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

/* cap: the scratch sized for at most that many threads (g.threads), fewer than may run */
static int wino_case_full(int N, int C, int H, int W, int OC, int bias, int cap, int pad) {
  dt_conv2d_geom g;
  if (dt_conv2d_geom_init(&g, N, C, H, W, OC, 3, 3, 1, pad) != DT_OK || !dt_wino_applies(&g)) return 100;
  if (cap) g.threads = cap;
  const size_t nx = (size_t)N * C * H * W, nw = (size_t)OC * C * 9, ny = (size_t)N * OC * g.OH * g.OW;
  float *x = randf(nx, -1, 1), *w = randf(nw, -1, 1), *b = bias ? randf(OC, -1, 1) : NULL, *dy = randf(ny, -1, 1);
  float *y = zeros(ny), *dx = zeros(nx), *dw = zeros(nw), *scratch = zeros(dt_conv2d_scratch_floats(&g));
  conv_ref r = {dzeros(ny), dzeros(nx), dzeros(nw), dzeros(ny), dzeros(nx), dzeros(nw)};
  dt_conv2d_forward(&g, y, scratch, x, w, b);
  dt_conv2d_backward(&g, dx, dw, NULL, scratch, dy, x, w);
  naive_conv(&g, x, w, b, dy, &r);
  const double ey = worst_rel(y, r.y, r.my, ny), edx = worst_rel(dx, r.dx, r.mdx, nx), edw = worst_rel(dw, r.dw, r.mdw, nw);
  /* Padding 2 with 4x4 tiles: the corner output has one tap inside, and F(4x4)'s transforms mix in the tile's
   * other inputs and cancel them, with an error (up to 1.0e-5 seen) relative to that one term's size. */
  const double tol = pad == 2 ? 3e-5 : 1e-5;
  const int bad = ey > tol || edx > tol || edw > tol;
  if (bad)
    fprintf(stderr, "winograd N=%d C=%d %dx%d OC=%d pad %d: relative error y %.3g dx %.3g dw %.3g\n", N, C, H, W, OC,
            pad, ey, edx, edw);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(scratch);
  free(r.y), free(r.dx), free(r.dw), free(r.my), free(r.mdx), free(r.mdw);
  return bad;
}
static int wino_case(int N, int C, int H, int W, int OC, int bias) {
  return wino_case_full(N, C, H, W, OC, bias, 0, 1);
}
static int wino_pad_case(int N, int C, int H, int W, int OC, int pad) {
  return wino_case_full(N, C, H, W, OC, 1, 0, pad);
}

static int wino_widths_case(int N, int C, int H, int W, int OC) {
  return widths_case(dt_wino_set_wide, dt_wino_applies, N, C, H, W, OC);
}

/* Under native bf16 (AVX512_BF16) the direct 3x3 kernels stay for a single input channel only (its GEMMs would
 * pad 9 values of k or columns to 32), and compute autocast's result there: on operands on the bf16 grid, exact
 * products summed in f32 (against sums in double). Skipped on a CPU without native bf16. */
TEST(conv2d_one_channel_direct_under_native_bf16) {
  if (!dt_amp_native_gemm(DT_AMP_BF16)) {
    fprintf(stderr, "  skipped: no native bf16 GEMM on this CPU\n");
    return;
  }
  enum { N = 3, H = 16, W = 16, OC = 8 };
  dt_conv2d_geom g, two;
  ASSERT_OK(dt_conv2d_geom_init(&g, N, 1, H, W, OC, 3, 3, 1, 1));
  ASSERT_OK(dt_conv2d_geom_init(&two, N, 2, H, W, OC, 3, 3, 1, 1));
  g.amp = two.amp = DT_AMP_BF16;
  ASSERT(dt_conv3x3_forward_applies(&g) && dt_conv3x3_weights_applies(&g));
  ASSERT(!dt_conv3x3_forward_applies(&two) && !dt_conv3x3_weights_applies(&two));
  dt_rng_init(&rng, 17, 0);
  const size_t nx = (size_t)N * H * W, nw = (size_t)OC * 9, ny = (size_t)N * OC * H * W;
  float *x = randf(nx, -1, 1), *w = randf(nw, -1, 1), *b = randf(OC, -1, 1), *dy = randf(ny, -1, 1);
  dt_lowp_round(DT_AMP_BF16, x, nx), dt_lowp_round(DT_AMP_BF16, w, nw), dt_lowp_round(DT_AMP_BF16, dy, ny);
  float *y = zeros(ny), *dx = zeros(nx), *dw = zeros(nw), *scratch = zeros(dt_conv2d_scratch_floats(&g));
  conv_ref r = {dzeros(ny), dzeros(nx), dzeros(nw), dzeros(ny), dzeros(nx), dzeros(nw)};
  dt_conv2d_forward(&g, y, scratch, x, w, b);
  dt_conv2d_backward(&g, dx, dw, NULL, scratch, dy, x, w);
  naive_conv(&g, x, w, b, dy, &r);
  ASSERT(worst_rel(y, r.y, r.my, ny) < 1e-5);
  ASSERT(worst_rel(dx, r.dx, r.mdx, nx) < 1e-5);
  ASSERT(worst_rel(dw, r.dw, r.mdw, nw) < 1e-5);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(scratch);
  free(r.y), free(r.dx), free(r.dw), free(r.my), free(r.mdx), free(r.mdw);
}

TEST(conv2d_winograd) {
  dt_rng_init(&rng, 14, 0);
  for (int t = 1; t <= 3; t += 2) {
    ASSERT_OK(dt_set_threads(t));
    ASSERT_EQ(wino_case(3, 8, 5, 7, 8, 1), 0);    /* 2x2 tiles; odd sizes: the last row and column half outside */
    ASSERT_EQ(wino_case(2, 16, 6, 6, 24, 0), 0);  /* 24 outputs: a block of 16 and one of 8 */
    ASSERT_EQ(wino_case(1, 8, 1, 1, 16, 1), 0);   /* one pixel: only the centre tap */
    ASSERT_EQ(wino_case(4, 16, 9, 4, 8, 0), 0);   /* 16 channels: the gradient's channel blocks of 6, 5, 5 */
    ASSERT_EQ(wino_case(2, 8, 17, 18, 24, 1), 0); /* 4x4 tiles, 1 and 2 of the last ones' rows and columns inside */
    ASSERT_EQ(wino_case(3, 16, 16, 16, 8, 0), 0); /* 4x4 tiles, whole */
    ASSERT_EQ(wino_case(1, 200, 16, 16, 64, 0), 0); /* 200 and 64 channels: 2x2 tiles even at 16x16 */
    ASSERT_EQ(wino_case(1, 16, 32, 32, 16, 1), 0);  /* 4x4 tiles, 64 of them: a full block and a short one */
    ASSERT_EQ(wino_case(2, 24, 10, 10, 48, 1), 0);  /* AVX-512: 48 outputs, a block of 32 and one of 16; 24 channels */
    ASSERT_EQ(wino_case(1, 8, 3, 3, 32, 0), 0);     /* AVX-512: 4 tiles, fewer than a block's rows; 8 channels */
    ASSERT_EQ(wino_case(2, 8, 2, 26, 16, 1), 0);    /* 13 tiles: AVX-512's 16-output blocks of 7 + 6 rows */
    ASSERT_EQ(wino_case(2, 8, 2, 4, 8, 0), 0);      /* 2 tiles: a block of 2 rows */
    ASSERT_EQ(wino_case_full(4, 8, 8, 8, 8, 0, 2, 1), 0); /* scratch for 2 threads: no more run */
    /* Padding 0 (fashioncnn's second conv: 14x14 -> 12x12; its input gradient is the padding-2 forward of the
     * transposed convolution, by Winograd too) and 2, with 2x2 and 4x4 tiles, whole and cut */
    ASSERT_EQ(wino_pad_case(2, 32, 14, 14, 64, 0), 0);
    ASSERT_EQ(wino_pad_case(2, 8, 9, 7, 16, 0), 0);   /* 7x5 outputs: the last tiles half outside */
    ASSERT_EQ(wino_pad_case(2, 16, 19, 18, 8, 0), 0); /* 17x16: 4x4 tiles, the last row of tiles one row inside */
    ASSERT_EQ(wino_pad_case(1, 8, 5, 5, 8, 0), 0);    /* 3x3 outputs: the last tiles mostly outside */
    ASSERT_EQ(wino_pad_case(2, 16, 12, 12, 8, 2), 0); /* 14x14 outputs */
    ASSERT_EQ(wino_pad_case(1, 8, 15, 14, 24, 2), 0); /* 17x16: 4x4 tiles */
    ASSERT_EQ(wino_pad_case(1, 8, 30, 30, 8, 2), 0);  /* 32x32: 4x4 tiles, whole */
    /* 16 outputs (12-tile blocks, 8-channel gradient rows), 32 and 64 (6 x 32), 48 (both), a few tiles */
    static const int widths[][5] = {{2, 16, 32, 32, 16}, {2, 24, 10, 10, 48}, {1, 8, 3, 3, 32}, {2, 64, 8, 8, 64},
                                    {2, 8, 2, 26, 16}};
    for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++)
      ASSERT_EQ(wino_widths_case(widths[k][0], widths[k][1], widths[k][2], widths[k][3], widths[k][4]), 0);
  }
  ASSERT_OK(dt_set_threads(1));
  ASSERT_EQ(conv_grad_case(3, 8, 5, 7, 8, 3, 1, 1, 1), 0); /* finite differences; dw accumulates, dx is rewritten */
  dt_conv2d_geom g;
  ASSERT_OK(dt_conv2d_geom_init(&g, 1, 12, 8, 8, 16, 3, 3, 1, 1));
  ASSERT_EQ(dt_wino_applies(&g), 0); /* 12 input channels */
  ASSERT_OK(dt_conv2d_geom_init(&g, 1, 16, 8, 8, 16, 3, 3, 2, 1));
  ASSERT_EQ(dt_wino_applies(&g), 0); /* stride 2 */
  ASSERT_OK(dt_conv2d_geom_init(&g, 1, 16, 8, 8, 16, 3, 3, 1, 3));
  ASSERT_EQ(dt_wino_applies(&g), 0); /* padding 3: an output row of zeros-only taps */
  ASSERT_OK(dt_conv2d_geom_init(&g, 1, 512, 7, 7, 256, 3, 3, 1, 1));
  ASSERT_EQ(dt_wino_applies(&g), 0); /* a transformed kernel past 256 KiB */
}

TEST(conv2d_exact) {
  /* input 1..9 as 3x3, kernel 2x2 of ones */
  float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 1, 1, 1}, b[1] = {0.5f}, y[4];
  dt_conv2d_geom g;
  ASSERT_OK(dt_conv2d_geom_init(&g, 1, 1, 3, 3, 1, 2, 2, 1, 0));
  ASSERT_EQ(g.OH, 2);
  ASSERT_EQ(g.OW, 2);
  float scratch[128]; /* the stride-1 backward runs a transposed convolution: more than forward needs */
  ASSERT(dt_conv2d_scratch_floats(&g) <= 128);
  dt_conv2d_forward(&g, y, scratch, x, w, b);
  ASSERT_EQ(y[0], 12.5);
  ASSERT_EQ(y[1], 16.5);
  ASSERT_EQ(y[2], 24.5);
  ASSERT_EQ(y[3], 28.5);
  /* stride 2, pad 1: windows start at -1 and 1 */
  ASSERT_OK(dt_conv2d_geom_init(&g, 1, 1, 3, 3, 1, 2, 2, 2, 1));
  ASSERT_EQ(g.OH, 2);
  dt_conv2d_forward(&g, y, scratch, x, w, NULL);
  ASSERT_EQ(y[0], 1);
  ASSERT_EQ(y[1], 5);
  ASSERT_EQ(y[2], 11);
  ASSERT_EQ(y[3], 28);
  /* backward of all-ones dout: each input counted once per window covering it */
  float dy[4] = {1, 1, 1, 1}, dx[9], dw[4] = {0};
  dt_conv2d_backward(&g, dx, dw, NULL, scratch, dy, x, w);
  for (int i = 0; i < 9; i++) ASSERT_EQ(dx[i], 1);
  /* dw[0] sums the windows' top-left taps: x[-1,-1], x[-1,1], x[1,-1] are padding, x[1,1] = 5 */
  ASSERT_EQ(dw[0], 5);
  ASSERT_EQ(dw[3], 1 + 3 + 7 + 9); /* bottom-right taps x[0,0], x[0,2], x[2,0], x[2,2] */
}

TEST(conv2d_geom_rejects) {
  dt_conv2d_geom g;
  ASSERT_STATUS(dt_conv2d_geom_init(&g, 0, 1, 5, 5, 1, 3, 3, 1, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_conv2d_geom_init(&g, 1, 0, 5, 5, 1, 3, 3, 1, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_conv2d_geom_init(&g, 1, 1, 5, 5, 0, 3, 3, 1, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_conv2d_geom_init(&g, 1, 1, 5, 5, 1, 3, 3, 0, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_conv2d_geom_init(&g, 1, 1, 5, 5, 1, 3, 3, 1, -1), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_conv2d_geom_init(&g, 1, 1, 2, 2, 1, 5, 5, 1, 1), DT_INVALID_ARGUMENT); /* kernel > padded input */
  ASSERT_STATUS(dt_conv2d_geom_init(&g, 1, 1, 5, 5, 1, 0, 3, 1, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_conv2d_geom_init(&g, 1 << 20, 64, 64, 64, 1, 3, 3, 1, 1), DT_INVALID_ARGUMENT); /* GEMM > int */
  ASSERT_OK(dt_conv2d_geom_init(&g, 1, 1, 2, 2, 1, 4, 4, 1, 1)); /* exactly fits: 1x1 output */
  ASSERT_EQ(g.OH, 1);
  ASSERT_EQ(g.OW, 1);
}

/* ---- pooling ---- */
typedef struct pool_ctx {
  dt_pool2d_geom g;
  float *x;
  int32_t *am;
  int avg;
} pool_ctx;
static void pool_fwd(void *c, float *out) {
  pool_ctx *k = c;
  if (k->avg)
    dt_avgpool2d_forward(&k->g, out, k->x);
  else
    dt_maxpool2d_forward(&k->g, out, k->am, k->x);
}

static int pool_grad_case(int avg, int N, int C, int H, int W, int K, int s, int p) {
  pool_ctx k = {.avg = avg};
  if (dt_pool2d_geom_init(&k.g, N, C, H, W, K, s, p) != DT_OK) return 100;
  const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * k.g.OH * k.g.OW;
  k.x = avg ? randf(nx, -1, 1) : spaced(nx, 0.05f);
  k.am = calloc(ny, sizeof(int32_t));
  float *dy = randf(ny, -1, 1), *y = zeros(ny), *dx = randf(nx, 5, 6);
  pool_fwd(&k, y);
  if (avg)
    dt_avgpool2d_backward(&k.g, dx, dy);
  else
    dt_maxpool2d_backward(&k.g, dx, dy, k.am);
  fd_spec sp = {pool_fwd, &k, y, dy, ny, 1e-2, 1e-4};
  int bad = fd_check(avg ? "avgpool dx" : "maxpool dx", &sp, k.x, dx, nx);
  free(k.x), free(k.am), free(dy), free(y), free(dx);
  return bad;
}

TEST(pool_grad) {
  dt_rng_init(&rng, 3, 0);
  for (int avg = 0; avg < 2; avg++) {
    ASSERT_EQ(pool_grad_case(avg, 2, 2, 6, 6, 2, 2, 0), 0);
    ASSERT_EQ(pool_grad_case(avg, 2, 2, 7, 6, 3, 2, 1), 0); /* padding */
    ASSERT_EQ(pool_grad_case(avg, 1, 3, 5, 5, 3, 1, 1), 0); /* overlapping windows */
  }
}

TEST(pool_exact) {
  float x[9] = {1, 2, 3, 4, 9, 6, 7, 8, 5}, y[4];
  int32_t am[4];
  dt_pool2d_geom g;
  ASSERT_OK(dt_pool2d_geom_init(&g, 1, 1, 3, 3, 3, 2, 1));
  ASSERT_EQ(g.OH, 2);
  ASSERT_EQ(g.OW, 2);
  dt_maxpool2d_forward(&g, y, am, x);
  ASSERT_EQ(y[0], 9);
  ASSERT_EQ(am[0], 4);
  ASSERT_EQ(y[3], 9);
  /* avg counts the padding: the top-left window holds 1, 2, 4, 9 of its 9 cells */
  dt_avgpool2d_forward(&g, y, x);
  ASSERT_NEAR(y[0], 16.0 / 9.0, 1e-7);
  ASSERT_NEAR(y[3], 28.0 / 9.0, 1e-7);
  /* ties: the first maximum in the window wins, as PyTorch */
  float t[4] = {2, 2, 2, 2}, dy[1] = {3}, dx[4];
  ASSERT_OK(dt_pool2d_geom_init(&g, 1, 1, 2, 2, 2, 2, 0));
  dt_maxpool2d_forward(&g, y, am, t);
  ASSERT_EQ(am[0], 0);
  dt_maxpool2d_backward(&g, dx, dy, am);
  ASSERT_EQ(dx[0], 3);
  ASSERT_EQ(dx[1], 0);
  ASSERT_EQ(dx[3], 0);
}

/* The 2x2/stride-2 fast path and the general path agree with PyTorch on NaN
 * (the first NaN wins and propagates) and on ties (the first maximum wins). */
TEST(maxpool_nan_and_ties_both_paths) {
  /* 2 x 4 plane: windows {1, 5, 3, 5} -> 5 at 1 (tie: first), {NaN, 2, NaN, 9} -> NaN at 2 */
  const float x[8] = {1, 5, NAN, 2, 3, 5, NAN, 9};
  float y[2];
  int32_t am[2];
  dt_pool2d_geom g;
  ASSERT_OK(dt_pool2d_geom_init(&g, 1, 1, 2, 4, 2, 2, 0)); /* fast path */
  dt_maxpool2d_forward(&g, y, am, x);
  ASSERT_EQ(y[0], 5);
  ASSERT_EQ(am[0], 1);
  ASSERT(isnan(y[1]));
  ASSERT_EQ(am[1], 2);
  /* general path: 3x3 windows with padding over a plane holding a NaN late in the window */
  const float z[9] = {1, 2, 3, 4, 7, 6, 7, NAN, 5};
  float y2[4];
  int32_t am2[4];
  ASSERT_OK(dt_pool2d_geom_init(&g, 1, 1, 3, 3, 3, 2, 1));
  dt_maxpool2d_forward(&g, y2, am2, z);
  ASSERT_EQ(y2[0], 7);
  ASSERT_EQ(am2[0], 4);
  ASSERT(isnan(y2[2]));
  ASSERT_EQ(am2[2], 7);
}

/* Planes without NaN take vector loops (2x2/2 and, for any other window, the interior columns of each row);
 * every geometry against a window-by-window reference, values on a coarse grid so ties are common (the first
 * maximum in row-major order wins): outputs and argmax identical. */
TEST(maxpool_vector_paths_match_reference) {
  dt_rng_init(&rng, 31, 0);
  const int geoms[][6] = {{2, 2, 0, 7, 9, 2}, {3, 2, 1, 9, 11, 2}, {3, 2, 1, 12, 40, 1}, {3, 1, 1, 5, 6, 3},
                          {2, 1, 0, 4, 5, 2}, {4, 3, 2, 10, 13, 2}, {3, 3, 0, 8, 8, 2}, {3, 2, 0, 3, 3, 1}};
  for (size_t gi = 0; gi < sizeof geoms / sizeof geoms[0]; gi++) {
    const int K = geoms[gi][0], S = geoms[gi][1], pad = geoms[gi][2], H = geoms[gi][3], W = geoms[gi][4];
    const int C = geoms[gi][5];
    dt_pool2d_geom g;
    ASSERT_OK(dt_pool2d_geom_init(&g, 2, C, H, W, K, S, pad));
    const size_t nx = (size_t)2 * C * H * W, ny = (size_t)2 * C * g.OH * g.OW;
    float *x = randf(nx, -2, 2), *y = zeros(ny);
    for (size_t i = 0; i < nx; i++) x[i] = floorf(x[i] * 2.0f); /* -4..3: ties */
    int32_t *am = calloc(ny, sizeof(int32_t));
    dt_maxpool2d_forward(&g, y, am, x);
    for (int pl = 0; pl < 2 * C; pl++)
      for (int oh = 0; oh < g.OH; oh++)
        for (int ow = 0; ow < g.OW; ow++) {
          float best = -INFINITY;
          int at = -1;
          for (int ih = oh * S - pad; ih < oh * S - pad + K; ih++)
            for (int iw = ow * S - pad; iw < ow * S - pad + K; iw++)
              if (ih >= 0 && ih < H && iw >= 0 && iw < W && (at < 0 || x[(size_t)pl * H * W + ih * W + iw] > best)) {
                best = x[(size_t)pl * H * W + ih * W + iw];
                at = ih * W + iw;
              }
          const size_t o = ((size_t)pl * g.OH + oh) * g.OW + ow;
          if (y[o] != best || am[o] != at) {
            fprintf(stderr, "  K %d stride %d pad %d %dx%d: out (%d, %d) %g at %d, want %g at %d\n", K, S, pad, H, W,
                    oh, ow, y[o], am[o], best, at);
            ASSERT(0);
          }
        }
    free(x), free(y), free(am);
  }
}

TEST(pool_geom_rejects) {
  dt_pool2d_geom g;
  ASSERT_STATUS(dt_pool2d_geom_init(&g, 1, 1, 4, 4, 2, 2, 2), DT_INVALID_ARGUMENT); /* pad > K/2 */
  ASSERT_STATUS(dt_pool2d_geom_init(&g, 1, 1, 2, 2, 5, 1, 1), DT_INVALID_ARGUMENT); /* empty output */
  ASSERT_STATUS(dt_pool2d_geom_init(&g, 1, 1, 4, 4, 0, 1, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_pool2d_geom_init(&g, 1, 1, 4, 4, 2, 0, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_pool2d_geom_init(&g, 0, 1, 4, 4, 2, 2, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_pool2d_geom_init(&g, 1, 1, 4, 4, 2, 2, -1), DT_INVALID_ARGUMENT);
  ASSERT_OK(dt_pool2d_geom_init(&g, 1, 1, 5, 5, 2, 2, 1));
  ASSERT_EQ(g.OH, 3);
}

/* ---- batchnorm ---- */
typedef struct bn_ctx {
  float *x, *gamma, *beta, *mean, *invstd;
  int N, C, HW;
} bn_ctx;
static void bn_fwd(void *c, float *out) {
  bn_ctx *k = c;
  dt_batchnorm_forward_train(out, k->mean, k->invstd, NULL, NULL, k->x, k->gamma, k->beta, k->N, k->C, k->HW, 0.1f,
                             1e-5f);
}

TEST(batchnorm_grad) {
  dt_rng_init(&rng, 4, 0);
  bn_ctx k = {randf(2 * 3 * 4, -2, 2), randf(3, 0.5f, 1.5f), randf(3, -1, 1), zeros(3), zeros(3), 2, 3, 4};
  const size_t n = 24;
  float *dy = randf(n, -1, 1), *y = zeros(n), *dx = zeros(n), *dg = zeros(3), *db = zeros(3);
  bn_fwd(&k, y);
  dt_batchnorm_backward(dx, dg, db, dy, k.x, k.mean, k.invstd, k.gamma, 2, 3, 4);
  fd_spec sp = {bn_fwd, &k, y, dy, n, 1e-3, 2e-3};
  ASSERT_EQ(fd_check("bn dx", &sp, k.x, dx, n), 0);
  ASSERT_EQ(fd_check("bn dgamma", &sp, k.gamma, dg, 3), 0);
  ASSERT_EQ(fd_check("bn dbeta", &sp, k.beta, db, 3), 0);
  /* normalised output: per channel mean 0 and biased variance 1 (before gamma/beta) */
  for (int c = 0; c < 3; c++) {
    double s = 0, s2 = 0;
    for (int b = 0; b < 2; b++)
      for (int i = 0; i < 4; i++) {
        double v = (y[(b * 3 + c) * 4 + i] - k.beta[c]) / k.gamma[c];
        s += v, s2 += v * v;
      }
    ASSERT_NEAR(s / 8, 0, 1e-5);
    ASSERT_NEAR(s2 / 8, 1, 1e-3); /* eps 1e-5 shrinks it slightly */
  }
  /* accumulation of dgamma/dbeta */
  float g0 = dg[0], b0 = db[0];
  dt_batchnorm_backward(NULL, dg, db, dy, k.x, k.mean, k.invstd, k.gamma, 2, 3, 4);
  ASSERT_NEAR(dg[0], 2 * g0, 1e-6);
  ASSERT_NEAR(db[0], 2 * b0, 1e-6);
  free(k.x), free(k.gamma), free(k.beta), free(k.mean), free(k.invstd), free(dy), free(y), free(dx), free(dg), free(db);
}

/* BatchNorm -> ReLU -> MaxPool(2) fused vs the three kernels in turn: forward bit-identical (outputs,
 * argmax, saved and running statistics; with NaN inputs, ReLU ties at 0 and odd H, W), eval too;
 * backward equal up to the order of the channel sums. Pooled rows of 8 windows and more: the 8-window path
 * against the gathers and the scatter byte for byte, forward and backward (without NaN: a NaN's sign may
 * differ between the two). */
static void bn_relu_pool_check(int N, int C, int H, int W, int with_nan, int *dt_test_failed_) {
  const int HW = H * W, OH = H / 2, OW = W / 2, P = OH * OW;
  const size_t nx = (size_t)N * C * HW, ny = (size_t)N * C * P;
  float *x = randf(nx, -2, 2), *gamma = randf(C, 0.5f, 1.5f), *beta = randf(C, -0.5f, 0.5f);
  if (with_nan) x[3] = NAN; /* channel 0 becomes NaN throughout: ReLU turns it to 0, ties everywhere */
  for (size_t i = 5; i < nx; i += 7) x[i] = x[i - 1]; /* ties between neighbours */
  float *bn = zeros(nx), *r = zeros(nx), *y = zeros(ny), *y2 = zeros(ny), *xs = zeros(ny);
  float *mean = zeros(C), *is = zeros(C), *mean2 = zeros(C), *is2 = zeros(C);
  float *rm = zeros(C), *rv = randf(C, 0.5f, 1.0f), *rm2 = zeros(C), *rv2 = zeros(C);
  memcpy(rv2, rv, C * sizeof(float));
  int32_t *am = calloc(ny, sizeof(int32_t)), *am2 = calloc(ny, sizeof(int32_t));
  dt_pool2d_geom g;
  ASSERT_OK(dt_pool2d_geom_init(&g, N, C, H, W, 2, 2, 0));
  dt_batchnorm_forward_train(bn, mean, is, rm, rv, x, gamma, beta, N, C, HW, 0.1f, 1e-5f);
  dt_act_forward(DT_ACT_RELU, r, bn, nx);
  dt_maxpool2d_forward(&g, y, am, r);
  dt_bn_relu_maxpool2x2_forward_train(y2, am2, xs, mean2, is2, rm2, rv2, x, gamma, beta, N, C, H, W, 0.1f, 1e-5f);
  ASSERT(memcmp(y, y2, ny * sizeof(float)) == 0);
  ASSERT(memcmp(am, am2, ny * sizeof(int32_t)) == 0);
  ASSERT(memcmp(mean, mean2, C * sizeof(float)) == 0 && memcmp(is, is2, C * sizeof(float)) == 0);
  ASSERT(memcmp(rm, rm2, C * sizeof(float)) == 0 && memcmp(rv, rv2, C * sizeof(float)) == 0);
  if (with_nan) ASSERT(isnan(mean2[0]) && y2[0] == 0.0f && am2[0] == 0);
  float *dy = randf(ny, -1, 1), *dx2 = zeros(nx), *dg2 = zeros(C), *db2 = zeros(C);
  dt_bn_relu_maxpool2x2_backward(dx2, dg2, db2, dy, y2, am2, xs, x, mean2, is2, gamma, N, C, H, W);
  if (OW >= 8 && !with_nan) {
    float *y3 = zeros(ny), *xs3 = zeros(ny), *dx3 = zeros(nx), *dg3 = zeros(C), *db3 = zeros(C);
    int32_t *am3 = calloc(ny, sizeof(int32_t));
    dt_bn_pool_set_rows(0);
    dt_bn_relu_maxpool2x2_forward_train(y3, am3, xs3, mean2, is2, NULL, NULL, x, gamma, beta, N, C, H, W, 0.1f,
                                        1e-5f);
    dt_bn_relu_maxpool2x2_backward(dx3, dg3, db3, dy, y3, am3, xs3, x, mean2, is2, gamma, N, C, H, W);
    dt_bn_pool_set_rows(1);
    ASSERT(memcmp(y2, y3, ny * sizeof(float)) == 0 && memcmp(am2, am3, ny * sizeof(int32_t)) == 0);
    ASSERT(memcmp(xs, xs3, ny * sizeof(float)) == 0 && memcmp(dx2, dx3, nx * sizeof(float)) == 0);
    free(y3), free(xs3), free(dx3), free(dg3), free(db3), free(am3);
  }
  /* backward: pool -> relu -> bn vs fused */
  float *d1 = zeros(nx), *d2 = zeros(nx), *dx = zeros(nx), *dg = zeros(C), *db = zeros(C);
  dt_maxpool2d_backward(&g, d1, dy, am);
  dt_act_backward(DT_ACT_RELU, d2, d1, bn, r, nx);
  dt_batchnorm_backward(dx, dg, db, d2, x, mean, is, gamma, N, C, HW);
  for (int c = with_nan; c < C; c++) {
    ASSERT_NEAR(dg2[c], dg[c], 1e-5 * (1 + fabs(dg[c])));
    ASSERT_NEAR(db2[c], db[c], 1e-5 * (1 + fabs(db[c])));
  }
  for (size_t i = (size_t)with_nan * HW; i < nx; i++)
    if ((i / HW) % C >= (size_t)with_nan && !(fabs(dx2[i] - dx[i]) <= 1e-5 * (1 + fabs(dx[i])))) {
      fprintf(stderr, "  dx[%zu]: fused %.8g, unfused %.8g\n", i, dx2[i], dx[i]);
      ASSERT(0);
      break;
    }
  /* dinp NULL: parameter gradients only */
  dt_bn_relu_maxpool2x2_backward(NULL, dg2, db2, dy, y2, am2, xs, x, mean2, is2, gamma, N, C, H, W);
  ASSERT_NEAR(db2[C - 1], 2 * db[C - 1], 1e-5 * (1 + fabs(db[C - 1])));
  /* eval: running statistics */
  dt_batchnorm_forward_eval(bn, x, gamma, beta, rm, rv, N, C, HW, 1e-5f);
  dt_act_forward(DT_ACT_RELU, r, bn, nx);
  dt_maxpool2d_forward(&g, y, am, r);
  dt_bn_relu_maxpool2x2_forward_eval(y2, am2, x, gamma, beta, rm, rv, N, C, H, W, 1e-5f);
  ASSERT(memcmp(y, y2, ny * sizeof(float)) == 0);
  ASSERT(memcmp(am, am2, ny * sizeof(int32_t)) == 0);
  float *all[] = {x, gamma, beta, bn, r, y, y2, xs, mean, is, mean2, is2, rm, rv, rm2, rv2,
                  dy, d1, d2, dx, dx2, dg, db, dg2, db2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
  free(am);
  free(am2);
}

TEST(bn_relu_maxpool_fused_matches_composition) {
  dt_rng_init(&rng, 21, 0);
  bn_relu_pool_check(3, 4, 6, 8, 0, dt_test_failed_);
  bn_relu_pool_check(2, 3, 7, 5, 0, dt_test_failed_); /* odd: last row and column dropped */
  bn_relu_pool_check(2, 3, 4, 4, 1, dt_test_failed_); /* NaN in channel 0 */
  bn_relu_pool_check(1, 2, 300, 14, 0, dt_test_failed_); /* pooled rows of 7, 1050 outputs: two runs of offsets */
  /* pooled rows of 8 and more, 8 windows at a time: 36, 14 (the last block overlapping), 14 with odd W, 8 with odd
   * H and W, 16 with NaN */
  bn_relu_pool_check(1, 2, 72, 72, 0, dt_test_failed_);
  bn_relu_pool_check(2, 3, 28, 28, 0, dt_test_failed_);
  bn_relu_pool_check(2, 3, 9, 29, 0, dt_test_failed_);
  bn_relu_pool_check(2, 3, 9, 17, 0, dt_test_failed_);
  bn_relu_pool_check(2, 2, 16, 32, 1, dt_test_failed_);
}

/* Conv2d(3x3) -> BatchNorm -> ReLU -> MaxPool(2) backward without the convolution's input gradient
 * (conv_bn_pool.c) against the BN-pool backward into a buffer and then the convolution's: the weight, bias, gamma and
 * beta gradients byte for byte, added onto the same values, at 1 and 3 threads, through the 8-window rows and
 * without them, and with no bias. */
static void conv_bn_pool_check(int N, int C, int H, int W, int OC, int *dt_test_failed_) {
  dt_conv2d_geom g;
  ASSERT_OK(dt_conv2d_geom_init(&g, N, C, H, W, OC, 3, 3, 1, 1));
  ASSERT(dt_conv2d_weights_direct(&g));
  const size_t nx = (size_t)N * C * H * W, nw = (size_t)OC * C * 9, nc = (size_t)N * OC * H * W;
  const size_t ny = (size_t)N * OC * (H / 2) * (W / 2), ng = nw + 3 * (size_t)OC;
  float *x = randf(nx, -1, 1), *w = randf(nw, -1, 1), *b = randf(OC, -1, 1), *gamma = randf(OC, 0.5f, 1.5f);
  float *beta = randf(OC, -0.5f, 0.5f), *conv = zeros(nc), *y = zeros(ny), *xs = zeros(ny), *mean = zeros(OC);
  float *is = zeros(OC), *dy = randf(ny, -1, 1), *dx = zeros(nc), *start = randf(ng, -1, 1), *ga = zeros(ng);
  float *gb = zeros(ng), *scratch = zeros(dt_conv2d_scratch_floats(&g));
  const size_t wbytes = (dt_conv_bn_pool_work_floats(&g) * sizeof(float) + 63) / 64 * 64;
  float *work = aligned_alloc(64, wbytes);
  int32_t *am = calloc(ny, sizeof(int32_t));
  dt_conv2d_forward(&g, conv, scratch, x, w, b);
  dt_bn_relu_maxpool2x2_forward_train(y, am, xs, mean, is, NULL, NULL, conv, gamma, beta, N, OC, H, W, 0.1f, 1e-5f);
  const dt_bn_pool_saved s = {y, am, xs, conv, mean, is, gamma, N, OC, H, W};
  for (int t = 1; t <= 3; t += 2)
    for (int rows = 1; rows >= 0; rows--)
      for (int bias = 1; bias >= 0; bias--) {
        ASSERT_OK(dt_set_threads(t));
        dt_bn_pool_set_rows(rows);
        memcpy(ga, start, ng * sizeof(float));
        memcpy(gb, start, ng * sizeof(float));
        float *dba = bias ? ga + nw : NULL, *dbb = bias ? gb + nw : NULL; /* dw, db, dgamma, dbeta */
        dt_bn_relu_maxpool2x2_backward(dx, ga + nw + OC, ga + nw + 2 * OC, dy, y, am, xs, conv, mean, is, gamma, N,
                                       OC, H, W);
        dt_conv2d_backward(&g, NULL, ga, dba, scratch, dx, x, w);
        memset(work, 0xff, wbytes); /* NaN: nothing is read before it is written */
        dt_conv_bn_pool_backward(&g, &s, dy, gb, dbb, gb + nw + OC, gb + nw + 2 * OC, scratch, work, x);
        ASSERT(memcmp(ga, gb, ng * sizeof(float)) == 0);
        ASSERT(memcmp(ga, start, nw * sizeof(float)) != 0);
      }
  dt_bn_pool_set_rows(1);
  ASSERT_OK(dt_set_threads(1));
  float *all[] = {x, w, b, gamma, beta, conv, y, xs, mean, is, dy, dx, start, ga, gb, scratch, work};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
  free(am);
}

TEST(conv_bn_pool_backward_matches_the_layers) {
  dt_rng_init(&rng, 22, 0);
  conv_bn_pool_check(3, 1, 28, 28, 32, dt_test_failed_); /* fashioncnn's first layer: 8-window rows, a sample a group */
  conv_bn_pool_check(9, 3, 10, 10, 7, dt_test_failed_);  /* groups of 4, 4 and 1 samples; a last block of 1 channel */
  conv_bn_pool_check(2, 1, 11, 13, 5, dt_test_failed_);  /* odd sizes: a row and a column no window covers */
  conv_bn_pool_check(5, 2, 9, 17, 4, dt_test_failed_);   /* pooled rows of 8 from an odd width */
}

/* BatchNorm -> ReLU fused equals the two kernels in turn bit for bit: training (output, batch and running
 * statistics), evaluation, backward (input and parameter gradients; the same sums in the same order, ReLU's
 * zeros added as zeros), dinp NULL, no affine parameters, and a NaN (its channel's statistics NaN, ReLU's 0). */
static void bn_relu_check(int N, int C, int HW, int affine, int with_nan, int *dt_test_failed_) {
  const size_t nx = (size_t)N * C * HW;
  float *x = randf(nx, -2, 2), *gamma = affine ? randf(C, 0.5f, 1.5f) : NULL, *beta = affine ? randf(C, -0.5f, 0.5f) : NULL;
  if (with_nan) x[1] = NAN;
  float *bn = zeros(nx), *r = zeros(nx), *r2 = zeros(nx), *mean = zeros(C), *is = zeros(C), *mean2 = zeros(C);
  float *is2 = zeros(C), *rm = zeros(C), *rv = randf(C, 0.5f, 1.0f), *rm2 = zeros(C), *rv2 = zeros(C);
  memcpy(rv2, rv, C * sizeof(float));
  dt_batchnorm_forward_train(bn, mean, is, rm, rv, x, gamma, beta, N, C, HW, 0.1f, 1e-5f);
  dt_act_forward(DT_ACT_RELU, r, bn, nx);
  dt_bn_relu_forward_train(r2, mean2, is2, rm2, rv2, x, gamma, beta, N, C, HW, 0.1f, 1e-5f);
  ASSERT(memcmp(r, r2, nx * sizeof(float)) == 0);
  ASSERT(memcmp(mean, mean2, C * sizeof(float)) == 0 && memcmp(is, is2, C * sizeof(float)) == 0);
  ASSERT(memcmp(rm, rm2, C * sizeof(float)) == 0 && memcmp(rv, rv2, C * sizeof(float)) == 0);
  if (with_nan) ASSERT(isnan(mean2[0]) && r2[0] == 0.0f);
  float *dy = randf(nx, -1, 1), *d = zeros(nx), *dx = zeros(nx), *dx2 = zeros(nx);
  float *dg = zeros(C), *db = zeros(C), *dg2 = zeros(C), *db2 = zeros(C);
  dt_act_backward(DT_ACT_RELU, d, dy, bn, r, nx);
  dt_batchnorm_backward(dx, dg, db, d, x, mean, is, gamma, N, C, HW);
  dt_bn_relu_backward(dx2, dg2, db2, dy, r2, x, mean2, is2, gamma, N, C, HW);
  for (int c = with_nan; c < C; c++) ASSERT(dg[c] == dg2[c] && db[c] == db2[c]); /* channel 0: NaN on both */
  for (size_t i = 0; i < nx; i++)
    if ((int)((i / HW) % C) >= with_nan) ASSERT(dx[i] == dx2[i]);
  dt_bn_relu_backward(NULL, dg2, db2, dy, r2, x, mean2, is2, gamma, N, C, HW); /* parameter gradients only */
  for (int c = with_nan; c < C; c++) ASSERT(dg2[c] == 2 * dg[c] && db2[c] == 2 * db[c]);
  dt_batchnorm_forward_eval(bn, x, gamma, beta, rm, rv, N, C, HW, 1e-5f);
  dt_act_forward(DT_ACT_RELU, r, bn, nx);
  dt_bn_relu_forward_eval(r2, x, gamma, beta, rm, rv, N, C, HW, 1e-5f);
  ASSERT(memcmp(r, r2, nx * sizeof(float)) == 0);
  free(x), free(gamma), free(beta), free(bn), free(r), free(r2), free(mean), free(is), free(mean2), free(is2);
  free(rm), free(rv), free(rm2), free(rv2), free(dy), free(d), free(dx), free(dx2), free(dg), free(db), free(dg2);
  free(db2);
}

TEST(bn_relu_fused_matches_composition) {
  dt_rng_init(&rng, 22, 0);
  bn_relu_check(3, 4, 30, 1, 0, dt_test_failed_);
  bn_relu_check(2, 3, 7, 0, 0, dt_test_failed_); /* affine=False */
  bn_relu_check(2, 3, 16, 1, 1, dt_test_failed_); /* NaN in channel 0 */
  bn_relu_check(64, 2, 1024, 1, 0, dt_test_failed_); /* past the kernels' threading thresholds */
}

/* Batch norm on planes longer than one run of the kernels' float sums (1024 values: 2500 = two whole runs and a
 * partial one), with a mean far from 0, against the statistics and gradients summed in double: a run dropped,
 * counted twice or summed with too little precision shows. */
TEST(batchnorm_long_planes_match_double) {
  dt_rng_init(&rng, 23, 0);
  const int N = 3, C = 2, HW = 2500;
  const size_t nx = (size_t)N * C * HW, M = (size_t)N * HW;
  float *x = randf(nx, 2.0f, 6.0f), *dy = randf(nx, -1, 1), *gamma = randf(C, 0.5f, 1.5f), *beta = randf(C, -1, 1);
  float *y = zeros(nx), *dx = zeros(nx), *mean = zeros(C), *is = zeros(C), *dg = zeros(C), *db = zeros(C);
  dt_batchnorm_forward_train(y, mean, is, NULL, NULL, x, gamma, beta, N, C, HW, 0.1f, 1e-5f);
  dt_batchnorm_backward(dx, dg, db, dy, x, mean, is, gamma, N, C, HW);
  for (int c = 0; c < C; c++) {
    double s = 0, sq = 0, sdy = 0, sdyx = 0;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < HW; i++) s += x[((size_t)n * C + c) * HW + i];
    const double mu = s / (double)M;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < HW; i++) sq += pow(x[((size_t)n * C + c) * HW + i] - mu, 2);
    const double inv = 1.0 / sqrt(sq / (double)M + 1e-5);
    for (int n = 0; n < N; n++)
      for (int i = 0; i < HW; i++) {
        const size_t k = ((size_t)n * C + c) * HW + i;
        sdy += dy[k];
        sdyx += dy[k] * (x[k] - mu) * inv;
      }
    ASSERT_NEAR(mean[c], mu, 1e-6 * fabs(mu));
    ASSERT_NEAR(is[c], inv, 1e-5 * inv);
    ASSERT_NEAR(db[c], sdy, 1e-4);
    ASSERT_NEAR(dg[c], sdyx, 1e-4);
    for (int n = 0; n < N; n++)
      for (int i = 0; i < HW; i++) {
        const size_t k = ((size_t)n * C + c) * HW + i;
        const double xh = (x[k] - mu) * inv;
        const double want_y = gamma[c] * xh + beta[c];
        const double want_dx = gamma[c] * inv * (dy[k] - sdy / (double)M - xh * sdyx / (double)M);
        if (!(fabs(y[k] - want_y) <= 1e-5 * (1 + fabs(want_y)) && fabs(dx[k] - want_dx) <= 1e-5 * (1 + fabs(want_dx)))) {
          fprintf(stderr, "  [%zu]: y %.8g (want %.8g), dx %.8g (want %.8g)\n", k, y[k], want_y, dx[k], want_dx);
          ASSERT(0);
        }
      }
  }
  free(x), free(dy), free(gamma), free(beta), free(y), free(dx), free(mean), free(is), free(dg), free(db);
}

/* The order the BatchNorm kernels sum a run of n <= 1024 terms in: four 8-lane accumulators take every 32 terms
 * in turn, then the rest 8 at a time to accumulators 0, 1, 2, the accumulators added (0 + 1) + (2 + 3), their lanes
 * ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), then the last n % 8 terms one by one; the runs' sums in double. */
static double fixed_order_sum(const float *t, int n) {
  double total = 0.0;
  for (int i0 = 0; i0 < n; i0 += 1024) {
    const int len = n - i0 < 1024 ? n - i0 : 1024;
    float a[4][8] = {{0}}, v[8];
    int i = 0;
    for (; i + 32 <= len; i += 32)
      for (int k = 0; k < 4; k++)
        for (int l = 0; l < 8; l++) a[k][l] += t[i0 + i + 8 * k + l];
    for (int k = 0; i + 8 <= len; i += 8, k++)
      for (int l = 0; l < 8; l++) a[k][l] += t[i0 + i + l];
    for (int l = 0; l < 8; l++) v[l] = (a[0][l] + a[1][l]) + (a[2][l] + a[3][l]);
    float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    for (; i < len; i++) s += t[i0 + i];
    total += s;
  }
  return total;
}

/* Channel c's terms f(plane value k) over the N planes of n values each, plane by plane, in the kernels' order. */
typedef float (*term_fn)(const float *const *in, size_t k, float m, float is);
static double channel_sum(const float *const *in, int N, int C, int c, int n, term_fn f, float m, float is,
                          float *t) {
  double s = 0.0;
  for (int b = 0; b < N; b++) {
    const size_t off = ((size_t)b * C + c) * (size_t)n;
    for (int i = 0; i < n; i++) t[i] = f(in, off + (size_t)i, m, is);
    s += fixed_order_sum(t, n);
  }
  return s;
}
/* in: {x} for the statistics; {dy, relu output, x} for the BN-ReLU backward; {dy, pooled output, xsel} for the
 * BN-ReLU-pool's, whose xhat is xsel itself (m 0, is 1: exact). */
static float term_x(const float *const *in, size_t k, float m, float is) { return (void)m, (void)is, in[0][k]; }
static float term_sq(const float *const *in, size_t k, float m, float is) {
  return (void)is, (in[0][k] - m) * (in[0][k] - m);
}
static float term_g(const float *const *in, size_t k, float m, float is) {
  return (void)m, (void)is, in[1][k] > 0.0f ? in[0][k] : 0.0f;
}
static float term_gx(const float *const *in, size_t k, float m, float is) {
  return term_g(in, k, m, is) * ((in[2][k] - m) * is);
}

/* The statistics of channel c as the kernels compute them: mean and invstd, from the order above. */
static void fixed_order_stats(const float *x, int N, int C, int c, int HW, float *t, float *m, float *is) {
  const double M = (double)N * HW;
  *m = (float)(channel_sum((const float *[]){x}, N, C, c, HW, term_x, 0.0f, 0.0f, t) / M);
  const double var = channel_sum((const float *[]){x}, N, C, c, HW, term_sq, *m, 0.0f, t) / M;
  *is = (float)(1.0 / sqrt(var + 1e-5));
}

/* BatchNorm's statistics and its backward's sums (BN-ReLU, BN-ReLU-pool) equal a scalar sum in the kernels' fixed
 * order bit for bit: v8 vectors have 8 lanes on every build, so an AVX2 build and an AVX-512 one agree; a
 * reduction whose order the compiler chooses (omp simd) would not, and fails here on one of the two. Planes of 1,
 * 7, 25, 33, 1075 and 2500 values: tails alone, the 8-wide rest, whole blocks of 32, and several runs. */
TEST(batchnorm_sums_in_their_fixed_order) {
  dt_rng_init(&rng, 29, 0);
  static const int sides[][2] = {{1, 1}, {1, 7}, {5, 5}, {3, 11}, {43, 25}, {50, 50}, {10, 10}, {66, 66}};
  for (size_t v = 0; v < sizeof sides / sizeof sides[0]; v++) {
    const int N = 3, C = 2, H = sides[v][0], W = sides[v][1], HW = H * W, pool = v >= 6, P = (H / 2) * (W / 2);
    const size_t nx = (size_t)N * C * HW, np = (size_t)N * C * P;
    float *x = randf(nx, -1.0f, 3.0f), *dy = randf(nx, -1, 1), *gamma = randf(C, 0.5f, 1.5f), *beta = randf(C, -1, 1);
    float *r = zeros(nx), *dx = zeros(nx), *mean = zeros(C), *is = zeros(C), *dg = zeros(C), *db = zeros(C);
    float *t = zeros((size_t)HW), *xs = zeros(np);
    int32_t *am = calloc(np ? np : 1, sizeof(int32_t));
    if (pool) {
      dt_bn_relu_maxpool2x2_forward_train(r, am, xs, mean, is, NULL, NULL, x, gamma, beta, N, C, H, W, 0.1f, 1e-5f);
      dt_bn_relu_maxpool2x2_backward(NULL, dg, db, dy, r, am, xs, x, mean, is, gamma, N, C, H, W);
    } else {
      dt_bn_relu_forward_train(r, mean, is, NULL, NULL, x, gamma, beta, N, C, HW, 0.1f, 1e-5f);
      dt_bn_relu_backward(dx, dg, db, dy, r, x, mean, is, gamma, N, C, HW);
    }
    for (int c = 0; c < C; c++) {
      float m, inv;
      fixed_order_stats(x, N, C, c, HW, t, &m, &inv);
      ASSERT(mean[c] == m && is[c] == inv);
      /* the sums' inputs: the gradient, what the ReLU gave (or the pool), and x (or xsel) */
      const float *in[3] = {dy, r, pool ? xs : x};
      const int n = pool ? P : HW;
      const float mm = pool ? 0.0f : m, ii = pool ? 1.0f : inv;
      const float want_db = (float)channel_sum(in, N, C, c, n, term_g, mm, ii, t);
      const float want_dg = (float)channel_sum(in, N, C, c, n, term_gx, mm, ii, t);
      if (!(db[c] == want_db && dg[c] == want_dg)) {
        fprintf(stderr, "  %dx%d channel %d: dbeta %.9g (want %.9g), dgamma %.9g (want %.9g)\n", H, W, c, db[c],
                want_db, dg[c], want_dg);
        ASSERT(0);
      }
    }
    free(x), free(dy), free(gamma), free(beta), free(r), free(dx), free(mean), free(is), free(dg), free(db);
    free(t), free(xs), free(am);
  }
}

TEST(batchnorm_running_stats) {
  /* one channel, values 1, 2 | 3, 4: mean 2.5, biased var 1.25, unbiased var 5/3 */
  float x[4] = {1, 2, 3, 4}, y[4], mean[1], invstd[1], rm[1] = {0}, rv[1] = {1}, g[1] = {2}, b[1] = {1};
  dt_batchnorm_forward_train(y, mean, invstd, rm, rv, x, g, b, 2, 1, 2, 0.1f, 0.0f);
  ASSERT_NEAR(mean[0], 2.5, 1e-7);
  ASSERT_NEAR(invstd[0], 1.0 / sqrt(1.25), 1e-6);
  ASSERT_NEAR(rm[0], 0.25, 1e-7);
  ASSERT_NEAR(rv[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-6);
  ASSERT_NEAR(y[0], 2 * (1 - 2.5) / sqrt(1.25) + 1, 1e-6);
  /* eval: running statistics, not the batch's */
  float rm2[1] = {1}, rv2[1] = {4};
  dt_batchnorm_forward_eval(y, x, g, b, rm2, rv2, 2, 1, 2, 0.0f);
  ASSERT_NEAR(y[0], 1, 1e-7);
  ASSERT_NEAR(y[3], 2 * 3 / 2.0 + 1, 1e-6);
}

/* ---- activations ---- */
typedef struct act_ctx {
  dt_act_kind kind;
  float *x;
  size_t n;
} act_ctx;
static void act_fwd(void *c, float *out) {
  act_ctx *k = c;
  dt_act_forward(k->kind, out, k->x, k->n);
}

TEST(activation_grad) {
  dt_rng_init(&rng, 5, 0);
  const dt_act_kind kinds[] = {DT_ACT_RELU, DT_ACT_GELU, DT_ACT_GELU_TANH, DT_ACT_TANH, DT_ACT_SIGMOID};
  const char *names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};
  const size_t n = 64;
  for (int i = 0; i < 5; i++) {
    act_ctx k = {kinds[i], randf(n, -4, 4), n};
    for (size_t j = 0; j < n; j++)
      if (fabsf(k.x[j]) < 0.05f) k.x[j] += k.x[j] < 0 ? -0.05f : 0.05f; /* keep relu's kink out of the step */
    float *dy = randf(n, -1, 1), *y = zeros(n), *dx = zeros(n);
    act_fwd(&k, y);
    dt_act_backward(kinds[i], dx, dy, k.x, y, n);
    fd_spec sp = {act_fwd, &k, y, dy, n, 1e-3, 1e-3};
    int bad = fd_check(names[i], &sp, k.x, dx, n);
    free(k.x), free(dy), free(y), free(dx);
    ASSERT_EQ(bad, 0);
  }
  /* exact points */
  float x[3] = {-1, 0, 2}, y[3];
  dt_act_forward(DT_ACT_RELU, y, x, 3);
  ASSERT(y[0] == 0 && y[1] == 0 && y[2] == 2);
  dt_act_forward(DT_ACT_GELU, y, x, 3);
  ASSERT_NEAR(y[2], 2 * 0.5 * (1 + erf(2 / sqrt(2.0))), 1e-6);
  dt_act_forward(DT_ACT_GELU_TANH, y, x, 3);
  ASSERT_NEAR(y[2], 0.5 * 2 * (1 + tanh(sqrt(2 / M_PI) * (2 + 0.044715 * 8))), 1e-6);
  dt_act_forward(DT_ACT_SIGMOID, y, x, 3);
  ASSERT_NEAR(y[1], 0.5, 1e-7);
  dt_act_forward(DT_ACT_TANH, y, x, 3);
  ASSERT_NEAR(y[0], tanh(-1.0), 1e-7);
}

/* ---- softmax family ---- */
typedef struct sm_ctx {
  float *x;
  int B, C, log;
} sm_ctx;
static void sm_fwd(void *c, float *out) {
  sm_ctx *k = c;
  if (k->log)
    dt_log_softmax_forward(out, k->x, k->B, k->C);
  else
    dt_softmax_forward(out, k->x, k->B, k->C);
}

TEST(softmax_grad) {
  dt_rng_init(&rng, 6, 0);
  for (int lg = 0; lg < 2; lg++) {
    sm_ctx k = {randf(3 * 7, -3, 3), 3, 7, lg};
    float *dy = randf(21, -1, 1), *y = zeros(21), *dx = zeros(21);
    sm_fwd(&k, y);
    if (lg)
      dt_log_softmax_backward(dx, dy, y, 3, 7);
    else
      dt_softmax_backward(dx, dy, y, 3, 7);
    fd_spec sp = {sm_fwd, &k, y, dy, 21, 1e-3, 1e-3};
    int bad = fd_check(lg ? "log_softmax" : "softmax", &sp, k.x, dx, 21);
    free(k.x), free(dy), free(y), free(dx);
    ASSERT_EQ(bad, 0);
  }
  /* stability: huge logits give finite probabilities summing to 1 */
  float x[3] = {1000, 1000, -1000}, y[3];
  dt_softmax_forward(y, x, 1, 3);
  ASSERT_NEAR(y[0], 0.5, 1e-7);
  ASSERT_NEAR(y[2], 0, 1e-7);
  dt_log_softmax_forward(y, x, 1, 3);
  ASSERT_NEAR(y[0], -log(2.0), 1e-6);
  ASSERT(isfinite(y[2]));
}

/* ---- cross entropy ---- */
typedef struct ce_ctx {
  float *x;
  int32_t *y;
  int B, C;
  float eps;
} ce_ctx;
static void ce_fwd(void *c, float *out) {
  ce_ctx *k = c;
  dt_cross_entropy(out, NULL, k->x, k->y, k->B, k->C, k->eps);
}

TEST(cross_entropy_grad) {
  dt_rng_init(&rng, 7, 0);
  int32_t labels[4] = {0, 3, 5, 2};
  for (int e = 0; e < 2; e++) {
    ce_ctx k = {randf(4 * 6, -3, 3), labels, 4, 6, e ? 0.1f : 0.0f};
    float loss = 0, one = 1, *dx = zeros(24);
    ASSERT_OK(dt_cross_entropy(&loss, dx, k.x, labels, 4, 6, k.eps));
    fd_spec sp = {ce_fwd, &k, &loss, &one, 1, 1e-3, 1e-3};
    int bad = fd_check("cross entropy", &sp, k.x, dx, 24);
    /* each row of the gradient sums to 0 */
    for (int b = 0; b < 4; b++) {
      double s = 0;
      for (int c = 0; c < 6; c++) s += dx[b * 6 + c];
      bad += fabs(s) > 1e-6;
    }
    free(k.x), free(dx);
    ASSERT_EQ(bad, 0);
  }
  /* exact: uniform logits give log C for any smoothing; a hand-computed row */
  float z[8] = {0}, loss;
  int32_t y2[2] = {1, 3};
  ASSERT_OK(dt_cross_entropy(&loss, NULL, z, y2, 2, 4, 0.3f));
  ASSERT_NEAR(loss, log(4.0), 1e-6);
  float x[3] = {1, 2, 3};
  int32_t y1[1] = {0};
  const double lse = log(exp(1.0) + exp(2.0) + exp(3.0));
  ASSERT_OK(dt_loss_cross_entropy(x, y1, 1, 3, 0.1f, &loss, NULL));
  ASSERT_NEAR(loss, 0.9 * (lse - 1) + 0.1 * (lse - 2), 1e-6);
  /* stability: huge logits */
  float big[4] = {1000, 0, 0, 1000}, dbig[4];
  int32_t yb[2] = {0, 0};
  ASSERT_OK(dt_cross_entropy(&loss, dbig, big, yb, 2, 2, 0));
  ASSERT_NEAR(loss, 500, 1e-6);
  ASSERT_NEAR(dbig[2], -0.5, 1e-7);
  ASSERT_NEAR(dbig[3], 0.5, 1e-7);
}

TEST(cross_entropy_rejects) {
  float x[6] = {0}, loss = 42, dx[6];
  int32_t bad_hi[2] = {0, 3}, bad_lo[2] = {-1, 0}, ok[2] = {0, 2};
  ASSERT_STATUS(dt_cross_entropy(&loss, dx, x, bad_hi, 2, 3, 0), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "sample 1") != NULL);
  ASSERT_STATUS(dt_loss_cross_entropy(x, bad_lo, 2, 3, 0, &loss, dx), DT_INVALID_ARGUMENT);
  ASSERT_EQ(loss, 42); /* untouched on failure */
  ASSERT_STATUS(dt_loss_cross_entropy(x, ok, 0, 3, 0, &loss, dx), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_loss_cross_entropy(x, ok, 2, 0, 0, &loss, dx), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_loss_cross_entropy(x, ok, 2, 3, -0.5f, &loss, dx), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_loss_cross_entropy(NULL, ok, 2, 3, 0, &loss, dx), DT_INVALID_ARGUMENT);
  ASSERT_OK(dt_loss_cross_entropy(x, ok, 2, 3, 0, &loss, dx));
}

TEST(topk_correct) {
  /* label ranks: 0; 1; 1 (tied with a lower index, which wins); 0 (tied with a higher index); 2 (three-way tie) */
  float x[5 * 3] = {5, 1, 0, 3, 1, 2, 2, 2, 0, 1, 1, 0, 1, 1, 1};
  int32_t y[5] = {0, 2, 1, 0, 2};
  int64_t t1 = -1, tk = -1;
  dt_topk_correct(x, y, 5, 3, 1, &t1, &tk);
  ASSERT_EQ(t1, 2);
  ASSERT_EQ(tk, 2);
  dt_topk_correct(x, y, 5, 3, 2, &t1, &tk);
  ASSERT_EQ(t1, 2);
  ASSERT_EQ(tk, 4);
  dt_topk_correct(x, y, 5, 3, 3, &t1, &tk);
  ASSERT_EQ(tk, 5);
  /* an out-of-range label counts as wrong */
  int32_t yb[1] = {7};
  dt_topk_correct(x, yb, 1, 3, 3, &t1, &tk);
  ASSERT_EQ(t1 + tk, 0);
}

/* ---- dropout ---- */
typedef struct drop_ctx {
  float *x;
  uint8_t *mask;
  size_t n;
  float p;
} drop_ctx;
static void drop_fwd(void *c, float *out) {
  drop_ctx *k = c;
  dt_dropout_forward(out, k->mask, k->x, k->n, k->p, 11, 3);
}

TEST(dropout) {
  dt_rng_init(&rng, 8, 0);
  const size_t n = 100003; /* not a multiple of 4, large enough for the parallel path */
  const float p = 0.3f;
  float *x = randf(n, 0.5f, 1.5f), *y1 = zeros(n), *y2 = zeros(n);
  uint8_t *m1 = calloc(n, 1), *m2 = calloc(n, 1);
  const int threads = dt_get_threads();
  ASSERT_OK(dt_set_threads(1));
  dt_dropout_forward(y1, m1, x, n, p, 11, 3);
  ASSERT_OK(dt_set_threads(2));
  dt_dropout_forward(y2, m2, x, n, p, 11, 3);
  ASSERT_OK(dt_set_threads(threads));
  ASSERT(memcmp(m1, m2, n) == 0);
  ASSERT(memcmp(y1, y2, n * sizeof(float)) == 0);
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    kept += m1[i];
    ASSERT_EQ(y1[i] == (m1[i] ? x[i] * (1.0f / (1.0f - p)) : 0.0f), 1); /* as torch: x * (1/(1-p)) */
  }
  /* keep rate 1 - p within 5 standard deviations (sd = sqrt(n p (1-p)) ~ 145) */
  ASSERT(fabs((double)kept - 0.7 * n) < 5 * sqrt(n * 0.21));
  /* element i follows word i%4 of Philox block i/4 */
  dt_rng r;
  dt_rng_init(&r, 11, 3);
  uint32_t w[4];
  dt_philox4x32(r.key, 5, w);
  ASSERT_EQ(m1[22], (w[2] >> 8) >= (uint32_t)(0.3 * 16777216.0 + 0.5));
  /* every element does (the kernel draws 16 blocks at a time, in vectors) */
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) {
    if (i % 4 == 0) dt_philox4x32(r.key, i / 4, w);
    wrong += m1[i] != ((w[i % 4] >> 8) >= (uint32_t)(0.3 * 16777216.0 + 0.5));
  }
  ASSERT_EQ(wrong, 0);
  /* dt_dropout_range: any window of the same draw, from any element (inside a block, a run of 16, across them) */
  const size_t windows[][2] = {{0, 1}, {3, 70}, {61, 5}, {64, 64}, {100, 1000}, {n - 4, 4}}; /* n: not static */
  float *z = zeros(1000);
  for (size_t k = 0; k < sizeof windows / sizeof windows[0]; k++) {
    const size_t first = windows[k][0], len = windows[k][1];
    dt_dropout_range(z, x + first, first, len, p, 11, 3);
    ASSERT(memcmp(z, y1 + first, len * sizeof(float)) == 0);
  }
  free(z);
  /* another stream gives another mask */
  dt_dropout_forward(y2, m2, x, n, p, 11, 4);
  ASSERT(memcmp(m1, m2, n) != 0);
  /* p = 0 keeps everything unchanged */
  dt_dropout_forward(y2, m2, x, 1000, 0.0f, 11, 3);
  for (size_t i = 0; i < 1000; i++) ASSERT_EQ(y2[i] == x[i] && m2[i] == 1, 1);
  /* gradient by finite differences: the same (seed, stream) reuses the mask */
  drop_ctx k = {x, m1, 40, 0.5f};
  float *dy = randf(40, -1, 1), *y = zeros(40), *dx = zeros(40);
  drop_fwd(&k, y);
  dt_dropout_backward(dx, dy, m1, 40, 0.5f);
  fd_spec sp = {drop_fwd, &k, y, dy, 40, 1e-2, 1e-4};
  ASSERT_EQ(fd_check("dropout", &sp, x, dx, 40), 0);
  int zeros_seen = 0;
  for (int i = 0; i < 40; i++) zeros_seen += dx[i] == 0 && m1[i] == 0;
  ASSERT(zeros_seen > 0);
  free(x), free(y1), free(y2), free(m1), free(m2), free(dy), free(y), free(dx);
}

/* LayerNorm's parameter gradients add each column's rows in row order, whatever the blocking of columns and the
 * thread count: the same bits as one column at a time, and they accumulate into dw and db. */
TEST(layernorm_weight_gradient) {
  dt_rng_init(&rng, 21, 0);
  static const int widths[] = {5, 64, 100, 200};
  const int N = 37, threads = dt_get_threads();
  for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
    const int C = widths[k];
    float *x = randf((size_t)N * C, -2, 2), *dy = randf((size_t)N * C, -1, 1), *w = randf((size_t)C, 0.5f, 1.5f);
    float *b = zeros((size_t)C), *y = zeros((size_t)N * C), *mean = zeros((size_t)N), *rstd = zeros((size_t)N);
    float *dw = randf((size_t)C, -1, 1), *db = randf((size_t)C, -1, 1), *want_w = zeros((size_t)C),
          *want_b = zeros((size_t)C);
    dt_layernorm_forward(y, mean, rstd, x, w, b, N, C, 1e-5f);
    for (int c = 0; c < C; c++) {
      float sw = 0.0f, sb = 0.0f;
      for (int r = 0; r < N; r++) {
        const float g = dy[(size_t)r * C + c];
        sw += g * (x[(size_t)r * C + c] - mean[r]) * rstd[r];
        sb += g;
      }
      want_w[c] = dw[c] + sw;
      want_b[c] = db[c] + sb;
    }
    for (int t = 1; t <= 2; t++) {
      float *gw = zeros((size_t)C), *gb = zeros((size_t)C);
      memcpy(gw, dw, (size_t)C * sizeof(float));
      memcpy(gb, db, (size_t)C * sizeof(float));
      ASSERT_OK(dt_set_threads(t));
      dt_layernorm_backward(NULL, gw, gb, dy, x, mean, rstd, w, N, C);
      if (memcmp(gw, want_w, (size_t)C * sizeof(float)) || memcmp(gb, want_b, (size_t)C * sizeof(float)))
        FAIL_("C=%d, %d thread(s): the parameter gradients differ from a column at a time", C, t);
      free(gw), free(gb);
    }
    free(x), free(dy), free(w), free(b), free(y), free(mean), free(rstd), free(dw), free(db), free(want_w),
        free(want_b);
  }
  ASSERT_OK(dt_set_threads(threads));
}

TEST(elementwise) {
  float a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50}, out[5];
  dt_add_forward(out, a, b, 5);
  ASSERT(out[0] == 11 && out[4] == 55);
  dt_axpy(out, -2, a, 5);
  ASSERT(out[0] == 9 && out[4] == 45);
  dt_fill(out, 7, 5);
  ASSERT(out[0] == 7 && out[4] == 7);
  float *big = zeros(200000), *big2 = zeros(200000);
  dt_fill(big, 1.5f, 200000);
  dt_axpy(big2, 2, big, 200000);
  dt_add_forward(big2, big2, big, 200000); /* in place */
  ASSERT(big2[0] == 4.5f && big2[199999] == 4.5f);
  free(big), free(big2);
}

TEST_MAIN(TEST_ENTRY(linear_grad), TEST_ENTRY(conv2d_grad), TEST_ENTRY(conv2d_grad_threads), TEST_ENTRY(conv2d_direct_grad), TEST_ENTRY(conv2d_one_channel_direct_under_native_bf16), TEST_ENTRY(conv2d_winograd), TEST_ENTRY(conv2d_exact), TEST_ENTRY(conv2d_geom_rejects),
          TEST_ENTRY(pool_grad), TEST_ENTRY(pool_exact), TEST_ENTRY(maxpool_nan_and_ties_both_paths), TEST_ENTRY(maxpool_vector_paths_match_reference), TEST_ENTRY(pool_geom_rejects), TEST_ENTRY(batchnorm_grad),
          TEST_ENTRY(batchnorm_running_stats), TEST_ENTRY(batchnorm_long_planes_match_double),
          TEST_ENTRY(batchnorm_sums_in_their_fixed_order), TEST_ENTRY(bn_relu_maxpool_fused_matches_composition),
          TEST_ENTRY(conv_bn_pool_backward_matches_the_layers), TEST_ENTRY(bn_relu_fused_matches_composition),
          TEST_ENTRY(activation_grad), TEST_ENTRY(softmax_grad),
          TEST_ENTRY(cross_entropy_grad), TEST_ENTRY(cross_entropy_rejects), TEST_ENTRY(topk_correct),
          TEST_ENTRY(dropout), TEST_ENTRY(layernorm_weight_gradient), TEST_ENTRY(elementwise))
