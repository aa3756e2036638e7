/* Test-time augmentation (src/train/tta.c): under flip the evaluation forward gives the mean of the outputs of each
 * image and of its mirror (rows reversed), computed here with the model's own forward on a mirror built by hand;
 * none is the inner forward itself; a model of vectors refuses flip. */
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "harness.h"
#include "train/train_impl.h"

enum { B = 3, C = 2, H = 3, W = 5, OUT = 4 };

static dt_status model_forward(void *user, const void *x, int n, const float **out) {
  return dt_model_forward(user, x, n, out);
}

static dt_status image_model(dt_model **m) {
  const int64_t shape[3] = {C, H, W};
  DT_CHECK(dt_model_new(3, shape, m));
  DT_CHECK(dt_model_add_conv2d(*m, "conv", 3, 3, 1, 1, 1));
  DT_CHECK(dt_model_add_flatten(*m, "flatten"));
  DT_CHECK(dt_model_add_linear(*m, "fc", OUT, 1));
  return dt_model_build(*m, B, 5);
}

TEST(flip_is_the_mean_over_each_image_and_its_mirror) {
  dt_model *m = NULL;
  ASSERT_OK(image_model(&m));
  dt_model_set_training(m, 0);
  float x[B * C * H * W], mirrored[B * C * H * W], plain[B * OUT], flipped[B * OUT];
  dt_rng r;
  dt_rng_init(&r, 11, 0);
  for (int i = 0; i < B * C * H * W; i++) x[i] = dt_rng_uniform_range(&r, -1, 1);
  for (int row = 0; row < B * C * H; row++)
    for (int j = 0; j < W; j++) mirrored[row * W + j] = x[row * W + W - 1 - j];
  const float *y;
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  memcpy(plain, y, sizeof plain);
  ASSERT_OK(dt_model_forward(m, mirrored, B, &y));
  memcpy(flipped, y, sizeof flipped);
  float differ = 0; /* the mirror must matter for this check to mean anything */
  for (int i = 0; i < B * OUT; i++) differ = fmaxf(differ, fabsf(plain[i] - flipped[i]));
  ASSERT(differ > 1e-3f);

  dt_tta_forward t;
  ASSERT_OK(dt_tta_open(&t, DT_TTA_FLIP, m, model_forward, m));
  for (int n = 1; n <= B; n += B - 1) { /* a partial batch, then a whole one */
    ASSERT_OK(dt_tta_fn(&t, x, n, &y));
    for (int i = 0; i < n * OUT; i++)
      if (fabsf(y[i] - 0.5f * (plain[i] + flipped[i])) > 1e-6f)
        FAIL_("n %d output %d: %g, the mean of %g and %g", n, i, (double)y[i], (double)plain[i], (double)flipped[i]);
  }
  dt_tta_close(&t);
  ASSERT_OK(dt_tta_open(&t, DT_TTA_NONE, m, model_forward, m));
  ASSERT_OK(dt_tta_fn(&t, x, B, &y));
  for (int i = 0; i < B * OUT; i++) ASSERT(y[i] == plain[i]);
  dt_tta_close(&t);
  dt_model_free(m);
}

TEST(flip_needs_images) {
  const int64_t shape[1] = {6};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(1, shape, &m));
  ASSERT_OK(dt_model_add_linear(m, "fc", 2, 1));
  ASSERT_OK(dt_model_build(m, 1, 1));
  dt_tta_forward t;
  ASSERT_STATUS(dt_tta_open(&t, DT_TTA_FLIP, m, model_forward, m), DT_USAGE);
  ASSERT(strstr(dt_last_error(), "(C, H, W)") != NULL);
  dt_clear_error();
  ASSERT_OK(dt_tta_open(&t, DT_TTA_NONE, m, model_forward, m));
  dt_tta_close(&t);
  ASSERT(strcmp(dt_tta_name(DT_TTA_FLIP), "flip") == 0 && strcmp(dt_tta_name(DT_TTA_NONE), "none") == 0);
  dt_model_free(m);
}

TEST_MAIN(TEST_ENTRY(flip_is_the_mean_over_each_image_and_its_mirror), TEST_ENTRY(flip_needs_images))
