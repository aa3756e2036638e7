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

/* C (M, ldc = N + 3) by dt_gemm_bf16 against dt_sgemm: 0 when equal (the 3 columns past N untouched), else 1. */
static int bf16_gemm_case(int ta, int tb, int M, int N, int K, float alpha, float beta, uint32_t seed) {
  const int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
  const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
  float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c),
        *want = malloc(nc * sizeof *c);
  int bad = !a || !b || !c || !want;
  if (!bad) {
    eighths(a, na, seed), eighths(b, nb, seed + 1), eighths(c, nc, seed + 2);
    memcpy(want, c, nc * sizeof *c);
    dt_sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, want, ldc);
    bad = !dt_gemm_bf16(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc) || memcmp(c, want, nc * sizeof *c);
  }
  free(a), free(b), free(c), free(want);
  return bad;
}

TEST(native_bf16_gemm_matches_f32_on_the_grid) {
  if (!dt_gemm_bf16_native()) {
    fprintf(stderr, "  skipped: no native bf16 GEMM here (no AVX512_BF16, or built without oneDNN)\n");
    return;
  }
  static const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 17, 70}, {64, 300, 129}, {16, 1024, 144}};
  for (int s = 0; s < 5; s++)
    for (int t = 0; t < 4; t++) {
      ASSERT_EQ(bf16_gemm_case(t >> 1, t & 1, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f, 7u * s + t), 0);
      ASSERT_EQ(bf16_gemm_case(t >> 1, t & 1, shapes[s][0], shapes[s][1], shapes[s][2], 0.5f, 1.0f, 9u * s + t), 0);
    }
  ASSERT_EQ(dt_gemm_bf16(0, 0, 0, 4, 4, 1.0f, NULL, 4, NULL, 4, 0.0f, NULL, 4), 0); /* empty: refused, not run */
}

/* The convolutions multiply from every thread at once: one shape and several, each result checked. This does not
 * reproduce the shared-scratchpad race gemm_lowp.c guards against (with oneDNN's own scratchpad it still passed,
 * measured); cli/test_amp.sh section 6, fashioncnn on 2 threads against the emulation, is what catches that. */
TEST(native_bf16_gemm_from_many_threads) {
  if (!dt_gemm_bf16_native()) {
    fprintf(stderr, "  skipped: no native bf16 GEMM here\n");
    return;
  }
  int bad = 0;
#pragma omp parallel for num_threads(2) schedule(dynamic, 1) reduction(+ : bad)
  for (int i = 0; i < 32; i++) { /* fashioncnn's second convolution's products, (OC, R) x (R, cols) and back */
    const int cols = 144 * (4 + i % 5);
    bad += bf16_gemm_case(0, 0, 64, cols, 288, 1.0f, 0.0f, i);
    bad += bf16_gemm_case(0, 1, 64, 288, cols, 1.0f, 1.0f, i + 1);
    bad += bf16_gemm_case(1, 0, 288, cols, 64, 1.0f, 0.0f, i + 2);
  }
  ASSERT_EQ(bad, 0);
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
          TEST_ENTRY(native_bf16_gemm_from_many_threads), TEST_ENTRY(lowp_gemm_dispatch), TEST_ENTRY(scaler_rules))
