/* Mixed precision: the bf16/fp16 grids (values worked out by hand from the formats), GradScaler's rules, and a
 * model under amp against the same model with its operands rounded by hand. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/model.h"
#include "dtrain/model_ctx.h"
#include "dtrain/scaler.h"
#include "harness.h"
#include "tensor/kernels.h"

static float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

TEST(bf16_round_to_nearest_even) {
  /* 1 + 2^-8 is the tie between 1 and 1 + 2^-7: even is 1; 1 + 3 * 2^-8 ties to 1 + 2^-6 (even). */
  ASSERT_EQ(dt_round_bf16(1.0f + 0x1p-8f), 1.0f);
  ASSERT_EQ(dt_round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
  ASSERT_EQ(dt_round_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f); /* above the tie: up */
  ASSERT_EQ(dt_round_bf16(-3.14159265f), -3.140625f);
  ASSERT_EQ(dt_round_bf16(0.1f), 0.10009765625f);
  ASSERT(isinf(dt_round_bf16(INFINITY)) && dt_round_bf16(-INFINITY) < 0);
  ASSERT(isnan(dt_round_bf16(NAN)));
  ASSERT(isnan(dt_round_bf16(from_bits(0x7f800001u)))); /* a NaN whose payload would round into inf */
  ASSERT(isinf(dt_round_bf16(from_bits(0x7f7fffffu)))); /* FLT_MAX rounds up past bf16's largest */
  ASSERT_EQ(dt_round_bf16(from_bits(0x00012345u)), from_bits(0x00010000u)); /* f32 subnormals keep 7 bits */
}

TEST(fp16_round_to_nearest_even) {
  ASSERT_EQ(dt_round_fp16(1.0f + 0x1p-11f), 1.0f);                  /* tie -> even */
  ASSERT_EQ(dt_round_fp16(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);    /* tie -> even (up) */
  ASSERT_EQ(dt_round_fp16(0.1f), 0.0999755859375f);                 /* torch.tensor(0.1).half() */
  ASSERT_EQ(dt_round_fp16(65504.0f), 65504.0f);
  ASSERT_EQ(dt_round_fp16(65519.0f), 65504.0f);
  ASSERT(isinf(dt_round_fp16(65520.0f)) && isinf(dt_round_fp16(1e6f)) && dt_round_fp16(-1e6f) < 0);
  ASSERT(isnan(dt_round_fp16(NAN)) && isinf(dt_round_fp16(INFINITY)));
  /* subnormals: multiples of 2^-24; 2^-25 is the tie between 0 and 2^-24 (even: 0); 3 * 2^-25 -> 2 * 2^-24 */
  ASSERT_EQ(dt_round_fp16(0x1p-24f), 0x1p-24f);
  ASSERT_EQ(dt_round_fp16(0x1p-25f), 0.0f);
  ASSERT_EQ(dt_round_fp16(0x1p-25f + 0x1p-30f), 0x1p-24f);
  ASSERT_EQ(dt_round_fp16(3 * 0x1p-25f), 0x1p-23f);
  ASSERT_EQ(dt_round_fp16(-5.4e-6f), -91 * 0x1p-24f); /* 5.4e-6 / 2^-24 = 90.59: torch .half() gives -91 * 2^-24 */
}

TEST(round_buffers) {
  float x[5] = {1.0f + 0x1p-8f, 0.1f, -65520.0f, 0x1p-26f, NAN}, y[5];
  dt_lowp_round_copy(DT_AMP_BF16, y, x, 5);
  ASSERT(y[0] == 1.0f && y[1] == 0.10009765625f && y[2] == -65536.0f && y[3] == 0x1p-26f && isnan(y[4]));
  dt_lowp_round(DT_AMP_FP16, x, 5);
  ASSERT(x[0] == 1.0f + 0x1p-8f && x[1] == 0.0999755859375f && isinf(x[2]) && x[2] < 0 && x[3] == 0.0f && isnan(x[4]));
  float z[2] = {0.1f, 0.2f};
  dt_lowp_round(DT_AMP_OFF, z, 2);
  ASSERT(z[0] == 0.1f && z[1] == 0.2f);
  dt_amp a;
  ASSERT_OK(dt_amp_parse("fp16", &a));
  ASSERT_EQ(a, DT_AMP_FP16);
  ASSERT_STATUS(dt_amp_parse("f16", &a), DT_INVALID_ARGUMENT);
}

TEST(scaler_rules) {
  dt_scaler s;
  dt_scaler_init(&s);
  ASSERT(s.scale == 65536.0f && s.growth_interval == 2000 && s.growth_tracker == 0);
  s.growth_interval = 3;
  float g[3] = {65536.0f, -131072.0f, 0.0f};
  ASSERT_EQ(dt_scaler_unscale(&s, g, 3), 0);
  ASSERT(g[0] == 1.0f && g[1] == -2.0f && g[2] == 0.0f);
  dt_scaler_update(&s, 0);
  dt_scaler_update(&s, 0);
  ASSERT(s.scale == 65536.0f && s.growth_tracker == 2);
  dt_scaler_update(&s, 0); /* the third finite step in a row grows */
  ASSERT(s.scale == 131072.0f && s.growth_tracker == 0);
  g[1] = INFINITY;
  ASSERT_EQ(dt_scaler_unscale(&s, g, 3), 1);
  dt_scaler_update(&s, 1);
  ASSERT(s.scale == 65536.0f && s.growth_tracker == 0 && s.skipped == 1);
  s.scale = 3e38f, s.growth_tracker = 2;
  dt_scaler_update(&s, 0); /* growth past float's range is dropped, the tracker still resets */
  ASSERT(s.scale == 3e38f && s.growth_tracker == 0);
  ASSERT_OK(dt_scaler_check(&s, "t"));
  s.growth_tracker = 3;
  ASSERT_STATUS(dt_scaler_check(&s, "t"), DT_CORRUPT);
}

/* A long buffer (the vectorised loop and its tail) rounds as the scalar does, value by value. */
TEST(round_long_buffers_as_each_value) {
  enum { n = 1003 };
  static float x[n], y[n];
  uint32_t u = 12345;
  for (int i = 0; i < n; i++) {
    u = u * 1664525u + 1013904223u; /* every bit pattern: NaNs, infs, subnormals, ties */
    x[i] = from_bits(i % 7 ? u : (u & 0xffff8000u) | 0x8000u);
  }
  dt_lowp_round_copy(DT_AMP_BF16, y, x, n);
  for (int i = 0; i < n; i++) {
    const float want = dt_round_bf16(x[i]);
    ASSERT_MSG(isnan(want) ? isnan(y[i]) : memcmp(&want, &y[i], sizeof want) == 0, "bf16");
  }
  dt_lowp_round_copy(DT_AMP_FP16, y, x, n);
  for (int i = 0; i < n; i++) {
    const float want = dt_round_fp16(x[i]);
    ASSERT_MSG(isnan(want) ? isnan(y[i]) : memcmp(&want, &y[i], sizeof want) == 0, "fp16");
  }
}

/* Multiples of 1/8 in [-1, 1]: on the bf16 grid, and every product and sum of these sizes is exact in f32, so the
 * native bf16 GEMM must equal the f32 one bit for bit whatever its order of summation. */
static void eighths(float *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((int)(seed >> 27) % 17 - 8) / 8.0f;
  }
}

/* The native bf16 GEMMs: ours (vdpbf16ps) and oneDNN's, each tested where the CPU and build have it. */
typedef int (*bf16_gemm_fn)(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc);
typedef struct bf16_kernel {
  const char *name;
  int (*available)(void);
  bf16_gemm_fn gemm;
} bf16_kernel;
static const bf16_kernel bf16_kernels[] = {
    {"own", dt_gemm_bf16_own_available, dt_gemm_bf16_own},
    {"oneDNN", dt_gemm_bf16_onednn_available, dt_gemm_bf16_onednn},
};

/* C (M, ldc = N + 3) by gemm against dt_sgemm: 0 when equal (the 3 columns past N untouched), else 1. */
static int bf16_gemm_case(bf16_gemm_fn gemm, int ta, int tb, int M, int N, int K, float alpha, float beta,
                          uint32_t seed) {
  const int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
  const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
  float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c),
        *want = malloc(nc * sizeof *c);
  int bad = !a || !b || !c || !want;
  if (!bad) {
    eighths(a, na, seed), eighths(b, nb, seed + 1), eighths(c, nc, seed + 2);
    memcpy(want, c, nc * sizeof *c);
    dt_sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, want, ldc);
    bad = !gemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc) || memcmp(c, want, nc * sizeof *c);
  }
  free(a), free(b), free(c), free(want);
  return bad;
}

/* Shapes that reach every edge of the kernels' blocking (ours: blocks of C of 14 x 32, k in blocks of 16 pairs, a
 * kernel per even row count for A's last panel): one element; fewer rows and columns than a block; an odd K; K
 * past several blocks of pairs; products large enough to run on several threads, split by B's panels (N 300, 520)
 * and by A's (M 448, N 64); and, below, every row count of a last panel (M 15 to 28). */
TEST(native_bf16_gemm_matches_f32_on_the_grid) {
  static const int shapes[][3] = {{1, 1, 1},     {5, 7, 3},       {33, 17, 70},   {64, 300, 129}, {16, 1024, 144},
                                  {70, 520, 600}, {29, 45, 1031}, {300, 33, 17}, {448, 64, 256}};
  const int n = (int)(sizeof shapes / sizeof shapes[0]);
  for (size_t k = 0; k < sizeof bf16_kernels / sizeof bf16_kernels[0]; k++) {
    const bf16_kernel *kn = &bf16_kernels[k];
    if (!kn->available()) {
      fprintf(stderr, "  skipped %s: not on this CPU or build (AVX512_BF16; oneDNN for its kernel)\n", kn->name);
      continue;
    }
    for (int s = 0; s < n; s++)
      for (int t = 0; t < 4; t++) {
        const int *d = shapes[s];
        ASSERT_MSG(!bf16_gemm_case(kn->gemm, t >> 1, t & 1, d[0], d[1], d[2], 1.0f, 0.0f, 7u * s + t), kn->name);
        ASSERT_MSG(!bf16_gemm_case(kn->gemm, t >> 1, t & 1, d[0], d[1], d[2], 0.5f, 1.0f, 9u * s + t), kn->name);
      }
    for (int M = 15; M <= 28; M++) ASSERT_MSG(!bf16_gemm_case(kn->gemm, M & 1, 0, M, 40, 35, 1.0f, 1.0f, M), kn->name);
    ASSERT_EQ(kn->gemm(0, 0, 0, 4, 4, 1.0f, NULL, 4, NULL, 4, 0.0f, NULL, 4), 0); /* empty: refused, not run */
  }
}

/* The convolutions multiply from every thread at once: one shape and several, each result checked. This does not
 * reproduce the shared-scratchpad race gemm_lowp.c guards against (with oneDNN's own scratchpad it still passed,
 * measured); cli/test_amp.sh section 6, fashioncnn on 2 threads against the emulation, is what catches that. */
TEST(native_bf16_gemm_from_many_threads) {
  for (size_t k = 0; k < sizeof bf16_kernels / sizeof bf16_kernels[0]; k++) {
    const bf16_kernel *kn = &bf16_kernels[k];
    if (!kn->available()) {
      fprintf(stderr, "  skipped %s: not on this CPU or build\n", kn->name);
      continue;
    }
    int bad = 0;
#pragma omp parallel for num_threads(2) schedule(dynamic, 1) reduction(+ : bad)
    for (int i = 0; i < 32; i++) { /* fashioncnn's second convolution's products, (OC, R) x (R, cols) and back */
      const int cols = 144 * (4 + i % 5);
      bad += bf16_gemm_case(kn->gemm, 0, 0, 64, cols, 288, 1.0f, 0.0f, i);
      bad += bf16_gemm_case(kn->gemm, 0, 1, 64, 288, cols, 1.0f, 1.0f, i + 1);
      bad += bf16_gemm_case(kn->gemm, 1, 0, 288, cols, 64, 1.0f, 0.0f, i + 2);
    }
    ASSERT_MSG(bad == 0, kn->name);
  }
}

/* Floats off the bf16 grid: x * (1 + 2^-12), so every rounding the autocast skips or forgets shows. */
static void off_grid(float *x, size_t n, uint32_t seed) {
  eighths(x, n, seed);
  for (size_t i = 0; i < n; i++) x[i] = x[i] * (1.0f + 1.0f / 4096.0f) + 1e-3f * (float)(i % 5);
}

/* A Linear layer under bf16 autocast, where the native GEMMs round the weights and input as they pack them (the
 * executor then rounds neither beforehand), computes what autocast does with every operand rounded first: the
 * same bits, whatever the kernel (on a CPU without native bf16 both sides are the emulation). */
TEST(linear_autocast_rounds_every_operand) {
  enum { B = 6, I = 40, O = 24 };
  dt_model *m = NULL;
  const int64_t shape[1] = {I};
  ASSERT_OK(dt_model_new(1, shape, &m));
  ASSERT_OK(dt_model_add_linear(m, "fc", O, 1));
  ASSERT_OK(dt_model_build(m, B, 1));
  ASSERT_OK(dt_model_ctx_set_amp(m, dt_model_default_ctx(m), DT_AMP_BF16));
  size_t np = 0;
  float *params = dt_model_params(m, &np);
  ASSERT_EQ(np, (size_t)O * I + O);
  float x[B * I], dy[B * O], xr[B * I], dyr[B * O], pr[O * I + O], want[B * O], dw[O * I + O];
  off_grid(params, np, 3), off_grid(x, B * I, 4), off_grid(dy, B * O, 5);
  for (size_t i = 0; i < np; i++) pr[i] = dt_round_bf16(params[i]);
  for (int i = 0; i < B * I; i++) xr[i] = dt_round_bf16(x[i]);
  for (int i = 0; i < B * O; i++) dyr[i] = dt_round_bf16(dy[i]);
  const float *y = NULL;
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  for (int r = 0; r < B; r++) memcpy(want + r * O, pr + O * I, O * sizeof(float));
  dt_lowp_gemm(DT_AMP_BF16, 0, 1, B, O, I, 1.0f, xr, I, pr, I, 1.0f, want, O);
  for (int i = 0; i < B * O; i++) want[i] = dt_round_bf16(want[i]);
  ASSERT_MSG(memcmp(y, want, sizeof want) == 0, "forward");
  dt_model_zero_grad(m);
  ASSERT_OK(dt_model_backward(m, dy));
  memset(dw, 0, sizeof dw);
  dt_lowp_gemm(DT_AMP_BF16, 1, 0, O, I, B, 1.0f, dyr, O, xr, I, 1.0f, dw, I);
  for (int r = 0; r < B; r++)
    for (int o = 0; o < O; o++) dw[O * I + o] += dyr[r * O + o];
  ASSERT_MSG(memcmp(dt_model_grads(m, NULL), dw, sizeof dw) == 0, "weight and bias gradients");
  dt_model_free(m);
}

/* dt_lowp_gemm_round (our kernel rounds C as it stores it) equals dt_lowp_gemm and then a rounding pass, bit for
 * bit, on operands off the grid, with beta 0 and 1, a NaN and an infinity among the products, and C's edges. */
TEST(gemm_round_equals_gemm_then_rounding) {
  static const int shapes[][3] = {{1, 1, 1}, {15, 33, 7}, {64, 300, 129}};
  for (int s = 0; s < 3; s++)
    for (int t = 0; t < 8; t++) {
      const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = t & 1, tb = (t >> 1) & 1, acc = t >> 2;
      const int lda = ta ? M : K, ldb = tb ? K : N, ldc = N + 1;
      const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * ldc;
      float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c),
            *want = malloc(nc * sizeof *c);
      ASSERT(a && b && c && want);
      off_grid(a, na, 11u * s + t), off_grid(b, nb, 13u * s + t), off_grid(c, nc, 17u * s + t);
      if (na > 2) a[na / 2] = NAN, a[na / 3] = INFINITY;
      memcpy(want, c, nc * sizeof *c);
      dt_lowp_gemm(DT_AMP_BF16, ta, tb, M, N, K, 0.5f, a, lda, b, ldb, acc ? 1.0f : 0.0f, want, ldc);
      for (int r = 0; r < M; r++) dt_lowp_round(DT_AMP_BF16, want + (size_t)r * ldc, (size_t)N);
      dt_lowp_gemm_round(DT_AMP_BF16, ta, tb, M, N, K, 0.5f, a, lda, b, ldb, acc ? 1.0f : 0.0f, c, ldc);
      ASSERT(memcmp(c, want, nc * sizeof *c) == 0);
      free(a), free(b), free(c), free(want);
    }
  /* The rounding alone: A = 0 and beta 1 leave C's own values to be rounded (but -0, which + 0 makes +0): ties to
   * even both ways, a NaN whose payload would carry into the exponent, infinities, subnormals, the largest float. */
  static const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f800001u, 0xff80ffffu, 0x7f800000u,
                                  0x00008000u, 0x00018000u, 0x7f7fffffu, 0x3f80ffffu, 0x3f807fffu, 0xff800000u};
  enum { NB = sizeof bits / sizeof bits[0] };
  float a[2] = {0}, b[2 * NB], c[NB], want[NB];
  off_grid(b, 2 * NB, 3);
  memcpy(c, bits, sizeof c);
  dt_lowp_gemm_round(DT_AMP_BF16, 0, 0, 1, NB, 2, 1.0f, a, 2, b, NB, 1.0f, c, NB);
  for (int i = 0; i < NB; i++) {
    float v;
    memcpy(&v, &bits[i], sizeof v);
    want[i] = dt_round_bf16(v);
  }
  ASSERT(memcmp(c, want, sizeof c) == 0);
}

/* The dispatch: fp16 and off always multiply in f32 (here exactly dt_sgemm's result). */
TEST(lowp_gemm_dispatch) {
  float a[6], b[6], c[4] = {0}, want[4] = {0};
  eighths(a, 6, 1), eighths(b, 6, 2);
  dt_sgemm(0, 0, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, want, 2);
  dt_lowp_gemm(DT_AMP_FP16, 0, 0, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
  ASSERT(memcmp(c, want, sizeof c) == 0);
  memset(c, 0, sizeof c);
  dt_lowp_gemm(DT_AMP_BF16, 0, 0, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
  ASSERT(memcmp(c, want, sizeof c) == 0);
  ASSERT_EQ(dt_amp_native_gemm(DT_AMP_FP16), 0);
  ASSERT_EQ(dt_amp_native_gemm(DT_AMP_OFF), 0);
}

TEST_MAIN(TEST_ENTRY(bf16_round_to_nearest_even), TEST_ENTRY(fp16_round_to_nearest_even), TEST_ENTRY(round_buffers),
          TEST_ENTRY(round_long_buffers_as_each_value), TEST_ENTRY(native_bf16_gemm_matches_f32_on_the_grid),
          TEST_ENTRY(native_bf16_gemm_from_many_threads), TEST_ENTRY(linear_autocast_rounds_every_operand),
          TEST_ENTRY(gemm_round_equals_gemm_then_rounding),
          TEST_ENTRY(lowp_gemm_dispatch), TEST_ENTRY(scaler_rules))
