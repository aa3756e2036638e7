/* Tests of the resnets and their layers: torchvision's parameter counts and names, zero_init_residual, the width
 * of resnet9 and the CIFAR resnets, the scale layer, the projection residual, padded max pool and adaptive average pool by finite differences, too-small inputs. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/loss.h"
#include "harness.h"
#include "model_grad_check.h"
#include "nn/layer.h"

static void fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
  dt_rng r;
  dt_rng_init(&r, seed, 99);
  for (size_t i = 0; i < n; i++) x[i] = dt_rng_uniform_range(&r, lo, hi);
}

static dt_status zoo(const char *name, int c, int h, int w, int classes, int zero_init, dt_model **out) {
  dt_zoo_config cfg = {.ndim = 3, .input_shape = {c, h, w}, .outputs = classes, .dropout = -1.0f,
                       .zero_init_residual = zero_init};
  return dt_model_zoo_new(name, &cfg, out);
}

/* torchvision 0.14: sum(p.numel() for p in resnetXX(num_classes=...).parameters()). */
TEST(parameter_counts_equal_torchvision) {
  static const struct {
    const char *name;
    int side, classes;
    size_t params;
  } want[] = {{"resnet18", 224, 1000, 11689512}, {"resnet34", 224, 1000, 21797672}, {"resnet50", 224, 1000, 25557032},
              {"resnet18", 64, 10, 11181642},    {"resnet20", 32, 10, 272474},      {"resnet32", 32, 10, 466906},
              {"resnet56", 32, 10, 855770}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    dt_model *m = NULL;
    ASSERT_OK(zoo(want[i].name, 3, want[i].side, want[i].side, want[i].classes, 0, &m));
    if (dt_model_num_params(m) != want[i].params)
      FAIL_("%s (%d classes): %zu parameters, torchvision has %zu", want[i].name, want[i].classes,
            dt_model_num_params(m), want[i].params);
    ASSERT_EQ(dt_model_output_size(m), want[i].classes);
    dt_model_free(m);
  }
}

/* --width: resnet9's stages w..8w, the CIFAR resnets' w..4w; counted in PyTorch (test_resnet_torch.py's ResNet9,
 * torchvision's BasicBlock at 32/64/128 planes). The ImageNet resnets have fixed widths and refuse one. */
TEST(width_sets_the_stages_channels) {
  static const struct {
    const char *name;
    int width;
    size_t params;
  } want[] = {{"resnet9", 0, 6573120}, {"resnet9", 64, 6573120}, {"resnet9", 32, 1646112}, {"resnet20", 32, 1084586}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    dt_zoo_config cfg = {.ndim = 3, .input_shape = {3, 32, 32}, .outputs = 10, .dropout = -1.0f, .width = want[i].width};
    dt_model *m = NULL;
    ASSERT_OK(dt_model_zoo_new(want[i].name, &cfg, &m));
    if (dt_model_num_params(m) != want[i].params)
      FAIL_("%s width %d: %zu parameters, PyTorch has %zu", want[i].name, want[i].width, dt_model_num_params(m),
            want[i].params);
    dt_model_free(m);
  }
  ASSERT(dt_model_zoo_takes_width("resnet9") && dt_model_zoo_takes_width("resnet56"));
  ASSERT(!dt_model_zoo_takes_width("resnet18") && !dt_model_zoo_takes_width("mlp") && !dt_model_zoo_takes_width("x"));
  dt_zoo_config cfg = {.ndim = 3, .input_shape = {3, 32, 32}, .outputs = 10, .dropout = -1.0f, .width = 32};
  dt_model *m = NULL;
  ASSERT_STATUS(dt_model_zoo_new("resnet18", &cfg, &m), DT_USAGE);
  ASSERT(strstr(dt_last_error(), "--width") != NULL);
  cfg.input_shape[1] = 7; /* resnet9 pools three times */
  ASSERT_STATUS(dt_model_zoo_new("resnet9", &cfg, &m), DT_USAGE);
  ASSERT(strstr(dt_last_error(), "8x8") != NULL);
  cfg.input_shape[1] = 64; /* and ends in a global max pool: 8x4 would not be global */
  ASSERT_STATUS(dt_model_zoo_new("resnet9", &cfg, &m), DT_USAGE);
  ASSERT(strstr(dt_last_error(), "square") != NULL && strstr(dt_last_error(), "64x32") != NULL);
  dt_clear_error();
}

/* Scale multiplies the output and the input gradient by its factor; zero or a non-finite factor is refused. */
TEST(scale_layer_multiplies_both_ways) {
  const int64_t shape[1] = {3};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(1, shape, &m));
  ASSERT_STATUS(dt_model_add_scale(m, "s", 0.0f), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_model_add_scale(m, "s", NAN), DT_INVALID_ARGUMENT);
  dt_clear_error();
  ASSERT_OK(dt_model_add_linear(m, "fc", 2, 0));
  ASSERT_OK(dt_model_add_scale(m, "scale", 0.125f));
  ASSERT_OK(dt_model_build(m, 1, 3));
  const float x[3] = {1, -2, 0.5f}, dy[2] = {1, -1};
  const float *y;
  ASSERT_OK(dt_model_forward(m, x, 1, &y));
  const float *w = dt_model_params(m, NULL);
  for (int o = 0; o < 2; o++) {
    const float ref = 0.125f * (w[3 * o] * x[0] + w[3 * o + 1] * x[1] + w[3 * o + 2] * x[2]);
    ASSERT(fabsf(y[o] - ref) <= 1e-6f);
  }
  dt_model_zero_grad(m);
  ASSERT_OK(dt_model_backward(m, dy));
  const float *g = dt_model_grads(m, NULL);
  for (int o = 0; o < 2; o++)
    for (int i = 0; i < 3; i++) ASSERT(fabsf(g[3 * o + i] - 0.125f * dy[o] * x[i]) <= 1e-6f);
  dt_model_free(m);
}

/* state_dict order, names and shapes of the parts a resnet adds: stem, a projection, a bottleneck, fc. */
TEST(names_and_shapes_follow_torchvision) {
  static const struct {
    const char *model, *name;
    int ndim;
    int64_t shape[4];
    int index; /* position in state_dict order, -1: any */
  } want[] = {
      {"resnet18", "conv1.weight", 4, {64, 3, 7, 7}, 0},
      {"resnet18", "bn1.num_batches_tracked", 0, {0}, 5},
      {"resnet18", "layer1.0.conv1.weight", 4, {64, 64, 3, 3}, 6},
      {"resnet18", "layer2.0.downsample.0.weight", 4, {128, 64, 1, 1}, -1},
      {"resnet18", "layer2.0.downsample.1.running_var", 1, {128}, -1},
      {"resnet18", "fc.weight", 2, {10, 512}, -1},
      {"resnet50", "layer1.0.conv3.weight", 4, {256, 64, 1, 1}, -1},
      {"resnet50", "layer3.0.conv2.weight", 4, {256, 256, 3, 3}, -1}, /* the stride sits on the 3x3 (v1.5) */
      {"resnet50", "layer1.0.downsample.0.weight", 4, {256, 64, 1, 1}, -1},
      {"resnet50", "fc.weight", 2, {10, 2048}, -1},
      {"resnet20", "conv1.weight", 4, {16, 3, 3, 3}, 0},
      {"resnet20", "layer1.2.bn2.bias", 1, {16}, -1},
      {"resnet20", "layer3.0.downsample.0.weight", 4, {64, 32, 1, 1}, -1},
      {"resnet20", "fc.bias", 1, {10}, -1},
      {"resnet9", "bn1.num_batches_tracked", 0, {0}, 5},
      {"resnet9", "layer1.conv.weight", 4, {128, 64, 3, 3}, 6},
      {"resnet9", "layer1.res.conv2.weight", 4, {128, 128, 3, 3}, -1},
      {"resnet9", "layer3.res.bn2.running_var", 1, {512}, -1},
      {"resnet9", "fc.weight", 2, {10, 512}, -1}, /* no bias */
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    dt_model *m = NULL;
    ASSERT_OK(zoo(want[i].model, 3, 64, 64, 10, 0, &m));
    int idx;
    dt_tensor_info ti;
    if (dt_model_find_tensor(m, want[i].name, &idx) != DT_OK) FAIL_("%s: no tensor %s", want[i].model, want[i].name);
    ASSERT_OK(dt_model_tensor_info(m, idx, &ti));
    ASSERT_EQ(ti.ndim, want[i].ndim);
    for (int d = 0; d < ti.ndim; d++) ASSERT_EQ(ti.shape[d], want[i].shape[d]);
    if (want[i].index >= 0) ASSERT_EQ(idx, want[i].index);
    dt_model_free(m);
  }
  /* resnet20 has projections only where a stage starts (layer2.0, layer3.0) */
  dt_model *m = NULL;
  int idx;
  ASSERT_OK(zoo("resnet20", 3, 32, 32, 10, 0, &m));
  ASSERT_STATUS(dt_model_find_tensor(m, "layer1.0.downsample.0.weight", &idx), DT_NOT_FOUND);
  ASSERT_STATUS(dt_model_find_tensor(m, "layer2.1.downsample.0.weight", &idx), DT_NOT_FOUND);
  dt_clear_error();
  dt_model_free(m);
}

/* Each block's last BN weight is 0 with zero_init_residual (bn2 of a BasicBlock, bn3 of a Bottleneck), 1 otherwise;
 * convs ~ N(0, 2/fan_out). */
TEST(zero_init_residual_and_conv_init) {
  const char *models[] = {"resnet20", "resnet50", "resnet9"};
  const char *last[] = {"layer2.1.bn2.weight", "layer2.1.bn3.weight", "layer3.res.bn2.weight"};
  const char *other[] = {"layer2.1.bn1.weight", "layer2.1.bn2.weight", "layer3.res.bn1.weight"};
  const char *keep[] = {"layer2.0.downsample.1.weight", "layer2.0.downsample.1.weight", "layer3.bn.weight"};
  for (int k = 0; k < 3; k++)
    for (int zero = 0; zero <= 1; zero++) {
      dt_model *m = NULL;
      ASSERT_OK(zoo(models[k], 3, 32, 32, 10, zero, &m));
      ASSERT_OK(dt_model_build(m, 1, 7));
      int a, b;
      ASSERT_OK(dt_model_find_tensor(m, last[k], &a));
      ASSERT_OK(dt_model_find_tensor(m, other[k], &b));
      const float *wa = dt_model_tensor_data(m, a), *wb = dt_model_tensor_data(m, b);
      ASSERT(wa[0] == (zero ? 0.0f : 1.0f) && wa[5] == wa[0]);
      ASSERT(wb[0] == 1.0f);
      /* not a block's last BN (a projection's, resnet9's stage head): it stays 1 */
      ASSERT_OK(dt_model_find_tensor(m, keep[k], &a));
      ASSERT(((const float *)dt_model_tensor_data(m, a))[0] == 1.0f);
      if (k == 0 && !zero) { /* layer3.1.conv1 (64, 64, 3, 3): std sqrt(2 / 576) */
        ASSERT_OK(dt_model_find_tensor(m, "layer3.1.conv1.weight", &a));
        const float *w = dt_model_tensor_data(m, a);
        double s = 0, s2 = 0;
        const int n = 64 * 64 * 9;
        for (int i = 0; i < n; i++) s += w[i], s2 += (double)w[i] * w[i];
        const double std = sqrt(s2 / n - (s / n) * (s / n)), want = sqrt(2.0 / 576);
        ASSERT_NEAR(std / want, 1.0, 0.03);
        ASSERT_NEAR(s / n, 0.0, 4 * want / sqrt(n));
      }
      dt_model_free(m);
    }
}

TEST(too_small_input_is_a_clear_error) {
  dt_model *m = NULL;
  ASSERT_STATUS(zoo("resnet18", 3, 28, 28, 10, 0, &m), DT_USAGE);
  ASSERT(strstr(dt_last_error(), "at least 32x32") && strstr(dt_last_error(), "28x28"));
  ASSERT_STATUS(zoo("resnet50", 3, 64, 31, 10, 0, &m), DT_USAGE);
  ASSERT_STATUS(zoo("resnet20", 3, 3, 3, 10, 0, &m), DT_USAGE);
  ASSERT(strstr(dt_last_error(), "at least 4x4"));
  ASSERT(m == NULL);
  dt_clear_error();
  /* the smallest sizes build and run, also non-square and on 1-channel images */
  const int sizes[][4] = {{3, 32, 32, 18}, {1, 32, 45, 18}, {3, 4, 4, 20}, {1, 28, 28, 20}};
  for (int i = 0; i < 4; i++) {
    ASSERT_OK(zoo(sizes[i][3] == 18 ? "resnet18" : "resnet20", sizes[i][0], sizes[i][1], sizes[i][2], 5, 0, &m));
    ASSERT_OK(dt_model_build(m, 2, 1));
    float x[2 * 3 * 32 * 45];
    fill_uniform(x, (size_t)2 * sizes[i][0] * sizes[i][1] * sizes[i][2], 3, -1, 1);
    const float *y;
    ASSERT_OK(dt_model_forward(m, x, 2, &y));
    for (int k = 0; k < 10; k++) ASSERT(isfinite(y[k]));
    dt_model_free(m);
    m = NULL;
  }
}

TEST(residual_shortcut_errors) {
  int64_t shape[3] = {2, 6, 6};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_STATUS(dt_model_residual_shortcut(m), DT_INVALID_ARGUMENT);
  ASSERT_OK(dt_model_begin_residual(m, "block"));
  ASSERT_OK(dt_model_add_conv2d(m, "block.conv", 4, 3, 2, 1, 0)); /* (4, 3, 3) */
  ASSERT_OK(dt_model_residual_shortcut(m));
  ASSERT_STATUS(dt_model_residual_shortcut(m), DT_INVALID_ARGUMENT);
  ASSERT_OK(dt_model_add_conv2d(m, "block.down", 4, 1, 1, 0, 0)); /* (4, 6, 6): the stride is missing */
  ASSERT_STATUS(dt_model_end_residual(m), DT_SHAPE_MISMATCH);
  ASSERT(strstr(dt_last_error(), "skip path output (4, 6, 6) differs from the branch output (4, 3, 3)"));
  dt_clear_error();
  dt_model_free(m);
}

/* Max pool 3x3/2 pad 1 pads with -inf (PyTorch): on all-negative input a border window's maximum is its own. */
TEST(padded_maxpool_pads_with_minus_infinity) {
  int64_t shape[3] = {1, 4, 4};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_maxpool2d(m, "pool", 3, 2, 1));
  ASSERT_OK(dt_model_build(m, 1, 0));
  float x[16];
  for (int i = 0; i < 16; i++) x[i] = -1.0f - (float)i; /* row-major, decreasing */
  const float *y;
  ASSERT_OK(dt_model_forward(m, x, 1, &y));
  /* (2, 2) output: windows rows/cols [-1, 1], [1, 3]: maxima at (0,0), (0,1), (1,0), (1,1) */
  const float want[4] = {-1, -2, -5, -6};
  for (int i = 0; i < 4; i++) ASSERT_NEAR(y[i], want[i], 0);
  dt_model_free(m);
}

/* AdaptiveAvgPool2d(2) on 3x5: row bins [0,2), [1,3); column bins [0,3), [2,5) (overlapping, as PyTorch). */
TEST(adaptive_avgpool_bins_match_pytorch) {
  int64_t shape[3] = {1, 3, 5};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_adaptive_avgpool2d(m, "pool", 2));
  ASSERT_OK(dt_model_build(m, 1, 0));
  float x[15];
  for (int i = 0; i < 15; i++) x[i] = (float)i;
  const float *y;
  ASSERT_OK(dt_model_forward(m, x, 1, &y));
  /* torch.nn.AdaptiveAvgPool2d(2)(torch.arange(15.).view(1, 1, 3, 5)) */
  const float want[4] = {3.5f, 5.5f, 8.5f, 10.5f};
  for (int i = 0; i < 4; i++) ASSERT_NEAR(y[i], want[i], 1e-6);
  dt_model_free(m);
}

/* ---- finite differences through a projection residual, a padded max pool and an adaptive average pool ---- */

enum { FD_B = 3, FD_CLASSES = 4, FD_IN = 2 * 9 * 9 };
static const int32_t fd_labels[FD_B] = {2, 0, 3};

/* (2, 9, 9) -> conv 3x3 (4) -> MaxPool2d(3, 2, 1) (4, 5, 5) -> block: [conv 3x3/2 (6) + BN + ReLU + conv 3x3 (6) + BN]
 * + [downsample conv 1x1/2 (6) + BN] (6, 3, 3) -> ReLU -> AdaptiveAvgPool2d(2) (6, 2, 2) -> flatten -> fc (4). */
static dt_status fd_model(dt_model **out) {
  const int64_t shape[3] = {2, 9, 9};
  dt_model *m = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_model_new(3, shape, &m));
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "conv1", 4, 3, 1, 1, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_maxpool2d(m, "maxpool", 3, 2, 1), st, fail);
  DT_CHECK_GOTO(dt_model_begin_residual(m, "block"), st, fail);
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "block.conv1", 6, 3, 2, 1, 0), st, fail);
  DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, "block.bn1", 1e-5f, 0.1f), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "block.relu1", DT_RELU), st, fail);
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "block.conv2", 6, 3, 1, 1, 0), st, fail);
  DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, "block.bn2", 1e-5f, 0.1f), st, fail);
  DT_CHECK_GOTO(dt_model_residual_shortcut(m), st, fail);
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "block.downsample.0", 6, 1, 2, 0, 0), st, fail);
  DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, "block.downsample.1", 1e-5f, 0.1f), st, fail);
  DT_CHECK_GOTO(dt_model_end_residual(m), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "block.relu", DT_RELU), st, fail);
  DT_CHECK_GOTO(dt_model_add_adaptive_avgpool2d(m, "avgpool", 2), st, fail);
  DT_CHECK_GOTO(dt_model_add_flatten(m, "flatten"), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "fc", FD_CLASSES, 1), st, fail);
  DT_CHECK_GOTO(dt_model_build(m, FD_B, 3), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}

static dt_status fd_loss(dt_model *m, const float *x, float *loss, float *dlogits) {
  const float *y;
  DT_CHECK(dt_model_forward(m, x, FD_B, &y));
  return dt_loss_cross_entropy(y, fd_labels, FD_B, FD_CLASSES, 0.0f, loss, dlogits);
}

/* Central differences in f32 at 8 entries of every parameter tensor and the input; tolerances as test_model's
 * check (|fd - a| <= 5e-4 + 1e-2 |a| each, relative L2 <= 5e-3 overall). eps 5e-4: two BNs in a row make the
 * loss curved enough that eps 1e-3 misses conv1's gradient by 1.3% (the O(eps^2) term; 1e-2 misses by 40%),
 * while one ulp of the loss is still only 1.2e-7 / 1e-3 = 1.2e-4. A skip path whose gradient is dropped, or a
 * branch that gets the skip's, is off by far more. */
TEST(projection_residual_and_pools_match_finite_differences) {
  dt_model *m = NULL;
  ASSERT_OK(fd_model(&m));
  float x[FD_B * FD_IN], dlogits[FD_B * FD_CLASSES];
  fill_uniform(x, FD_B * FD_IN, 17, -1, 1);
  grad_check gc = {.eps = 5e-4f, .per = 8, .watch = "downsample.0"};
  ASSERT_OK(grad_check_run(m, x, FD_B * FD_IN, dlogits, fd_loss, &gc));
  if (gc.msg[0]) FAIL_("%s", gc.msg);
  ASSERT_EQ(gc.checked, 8 * (13 + 1)); /* conv1 w+b, 3 convs, 3 BN w+b, fc w+b; and the input */
  ASSERT(gc.den > 1e-4 && gc.watch_den > 1e-8); /* the skip path's conv does get a gradient */
  if (gc.rel_l2 > 5e-3) FAIL_("relative L2 error %.3g over %d entries", gc.rel_l2, gc.checked);
  dt_model_free(m);
}

TEST_MAIN(TEST_ENTRY(parameter_counts_equal_torchvision), TEST_ENTRY(width_sets_the_stages_channels),
          TEST_ENTRY(scale_layer_multiplies_both_ways), TEST_ENTRY(names_and_shapes_follow_torchvision),
          TEST_ENTRY(zero_init_residual_and_conv_init), TEST_ENTRY(too_small_input_is_a_clear_error),
          TEST_ENTRY(residual_shortcut_errors), TEST_ENTRY(padded_maxpool_pads_with_minus_infinity),
          TEST_ENTRY(adaptive_avgpool_bins_match_pytorch),
          TEST_ENTRY(projection_residual_and_pools_match_finite_differences))
