/* Mixed precision: the bf16/fp16 grids (values worked out by hand from the formats), GradScaler's rules, and a
 * model under amp against the same model with its operands rounded by hand. */
#include <math.h>
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

TEST_MAIN(TEST_ENTRY(bf16_round_to_nearest_even), TEST_ENTRY(fp16_round_to_nearest_even), TEST_ENTRY(round_buffers),
          TEST_ENTRY(scaler_rules))
