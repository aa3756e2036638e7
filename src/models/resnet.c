/* Zoo models resnet18/34/50 (torchvision's ResNet) and resnet20/32/56 (He et al.'s CIFAR ResNets), torchvision's names. */
#include <stdio.h>

#include "core/impl.h"
#include "models/zoo.h"
#include "nn/layer.h"

/* torchvision.models.resnet (v1.5): the state_dict keys are those of
 *   conv1 = Conv2d(C, 64, 7, 2, 3, bias=False); bn1; relu; maxpool = MaxPool2d(3, 2, 1)
 *   layer1..layer4 = Sequential(blocks), 64/128/256/512 planes, stride 1/2/2/2 on each stage's first block
 *   avgpool = AdaptiveAvgPool2d(1); flatten; fc = Linear(512 * expansion, classes)
 * BasicBlock (expansion 1): conv1 3x3 stride s, bn1, relu, conv2 3x3, bn2, (+ identity or downsample), relu.
 * Bottleneck (expansion 4): conv1 1x1, bn1, relu, conv2 3x3 stride s, bn2, relu, conv3 1x1 (4x), bn3, (+), relu.
 * downsample = Sequential(Conv2d 1x1 stride s bias=False, BatchNorm2d) when the stride or the width changes.
 * Init as torchvision: convs kaiming_normal_(fan_out, relu), BN weight 1 bias 0, fc PyTorch's default;
 * zero_init_residual: the weight of each block's last BN is 0.
 * The CIFAR ResNets (He et al. 2016, section 4.2) have the same block and names: conv1 3x3 16 stride 1, bn1,
 * relu, no maxpool, layer1..layer3 of n BasicBlocks at 16/32/64 planes (stride 1/2/2), the shortcut a 1x1
 * Conv2d + BN projection when the shape changes (the paper's option B), avgpool, fc. */

typedef struct resnet_arch {
  int bottleneck;    /* 0: BasicBlock, 1: Bottleneck */
  int imagenet_stem; /* 1: 7x7/2 conv + 3x3/2 max pool; 0: 3x3/1 conv */
  int stages;
  int blocks[4];
  int planes[4];
} resnet_arch;

/* "<layer>.weight" of a layer just added (so its name fits a layer name). */
static dt_status set_weight_init(dt_model *m, const char *layer, dt_init_kind init) {
  char w[DT_LAYER_NAME_MAX + 8];
  if (snprintf(w, sizeof w, "%s.weight", layer) >= (int)sizeof w)
    return dt_error(DT_INTERNAL, "%s: layer name too long", layer);
  return dt_model_set_init(m, w, init, 0.0f);
}

static dt_status conv(dt_model *m, const char *name, int out, int k, int stride, int pad) {
  DT_CHECK(dt_model_add_conv2d(m, name, out, k, stride, pad, 0));
  return set_weight_init(m, name, DT_INIT_KAIMING_NORMAL_FAN_OUT);
}

static dt_status bn(dt_model *m, const char *name, int zero_weight) {
  DT_CHECK(dt_model_add_batchnorm2d(m, name, 1e-5f, 0.1f));
  return zero_weight ? set_weight_init(m, name, DT_INIT_ZEROS) : DT_OK;
}

/* One block "layer<s>.<b>" from in_ch channels: planes wide, out planes*expansion, stride on its 3x3. */
static dt_status block(dt_model *m, const resnet_arch *a, const char *name, int in_ch, int planes, int stride,
                       int zero_init) {
  char n[DT_LAYER_NAME_MAX];
  const int out_ch = a->bottleneck ? planes * 4 : planes;
#define SUB(suffix) (snprintf(n, sizeof n, "%s." suffix, name) < (int)sizeof n ? n : NULL) /* NULL: too long, refused */
  DT_CHECK(dt_model_begin_residual(m, name));
  if (a->bottleneck) {
    DT_CHECK(conv(m, SUB("conv1"), planes, 1, 1, 0));
    DT_CHECK(bn(m, SUB("bn1"), 0));
    DT_CHECK(dt_model_add_activation(m, SUB("relu1"), DT_RELU));
    DT_CHECK(conv(m, SUB("conv2"), planes, 3, stride, 1));
    DT_CHECK(bn(m, SUB("bn2"), 0));
    DT_CHECK(dt_model_add_activation(m, SUB("relu2"), DT_RELU));
    DT_CHECK(conv(m, SUB("conv3"), out_ch, 1, 1, 0));
    DT_CHECK(bn(m, SUB("bn3"), zero_init));
  } else {
    DT_CHECK(conv(m, SUB("conv1"), planes, 3, stride, 1));
    DT_CHECK(bn(m, SUB("bn1"), 0));
    DT_CHECK(dt_model_add_activation(m, SUB("relu1"), DT_RELU));
    DT_CHECK(conv(m, SUB("conv2"), planes, 3, 1, 1));
    DT_CHECK(bn(m, SUB("bn2"), zero_init));
  }
  if (stride != 1 || in_ch != out_ch) {
    DT_CHECK(dt_model_residual_shortcut(m));
    DT_CHECK(conv(m, SUB("downsample.0"), out_ch, 1, stride, 0));
    DT_CHECK(bn(m, SUB("downsample.1"), 0));
  }
  DT_CHECK(dt_model_end_residual(m));
  return dt_model_add_activation(m, SUB("relu"), DT_RELU);
#undef SUB
}

/* The input must be at least as large as the network's total stride, so that the last stage sees pixels
 * rather than padding alone (torchvision would accept smaller inputs, computing on padding). */
static dt_status check_input(const char *model, const resnet_arch *a, const dt_zoo_config *cfg) {
  const int64_t need = (a->imagenet_stem ? 4 : 1) << (a->stages - 1);
  if (cfg->input_shape[1] < need || cfg->input_shape[2] < need)
    return dt_error(DT_USAGE, "%s downsamples by %lld: it needs images of at least %lldx%lld; the data's are %lldx%lld",
                    model, (long long)need, (long long)need, (long long)need, (long long)cfg->input_shape[1],
                    (long long)cfg->input_shape[2]);
  return DT_OK;
}

static dt_status build(const char *model, const resnet_arch *arch, const dt_zoo_config *cfg, dt_model **out) {
  resnet_arch w = *arch; /* the CIFAR resnets' --width: the first stage's planes, doubled by each later stage */
  for (int s = 0; cfg->width && s < w.stages; s++) w.planes[s] = cfg->width << s;
  const resnet_arch *a = &w;
  DT_CHECK(check_input(model, a, cfg));
  dt_model *m = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_model_new(cfg->ndim, cfg->input_shape, &m));
  const int zero_init = cfg->zero_init_residual != 0;
  int ch = a->planes[0];
  if (a->imagenet_stem) {
    DT_CHECK_GOTO(conv(m, "conv1", ch, 7, 2, 3), st, fail);
  } else {
    DT_CHECK_GOTO(conv(m, "conv1", ch, 3, 1, 1), st, fail);
  }
  DT_CHECK_GOTO(bn(m, "bn1", 0), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "relu", DT_RELU), st, fail);
  if (a->imagenet_stem) DT_CHECK_GOTO(dt_model_add_maxpool2d(m, "maxpool", 3, 2, 1), st, fail);
  for (int s = 0; s < a->stages; s++)
    for (int b = 0; b < a->blocks[s]; b++) {
      char name[DT_LAYER_NAME_MAX];
      snprintf(name, sizeof name, "layer%d.%d", s + 1, b);
      const int stride = (s > 0 && b == 0) ? 2 : 1;
      DT_CHECK_GOTO(block(m, a, name, ch, a->planes[s], stride, zero_init), st, fail);
      ch = a->bottleneck ? a->planes[s] * 4 : a->planes[s];
    }
  DT_CHECK_GOTO(dt_model_add_adaptive_avgpool2d(m, "avgpool", 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_flatten(m, "flatten"), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "fc", cfg->outputs, 1), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}

#define IMAGENET_PLANES {64, 128, 256, 512}
#define CIFAR_PLANES {16, 32, 64}

dt_status dt_zoo_build_resnet18(const dt_zoo_config *cfg, dt_model **out) {
  static const resnet_arch a = {0, 1, 4, {2, 2, 2, 2}, IMAGENET_PLANES};
  return build("resnet18", &a, cfg, out);
}
dt_status dt_zoo_build_resnet34(const dt_zoo_config *cfg, dt_model **out) {
  static const resnet_arch a = {0, 1, 4, {3, 4, 6, 3}, IMAGENET_PLANES};
  return build("resnet34", &a, cfg, out);
}
dt_status dt_zoo_build_resnet50(const dt_zoo_config *cfg, dt_model **out) {
  static const resnet_arch a = {1, 1, 4, {3, 4, 6, 3}, IMAGENET_PLANES};
  return build("resnet50", &a, cfg, out);
}
dt_status dt_zoo_build_resnet20(const dt_zoo_config *cfg, dt_model **out) {
  static const resnet_arch a = {0, 0, 3, {3, 3, 3}, CIFAR_PLANES};
  return build("resnet20", &a, cfg, out);
}
dt_status dt_zoo_build_resnet32(const dt_zoo_config *cfg, dt_model **out) {
  static const resnet_arch a = {0, 0, 3, {5, 5, 5}, CIFAR_PLANES};
  return build("resnet32", &a, cfg, out);
}
dt_status dt_zoo_build_resnet56(const dt_zoo_config *cfg, dt_model **out) {
  static const resnet_arch a = {0, 0, 3, {9, 9, 9}, CIFAR_PLANES};
  return build("resnet56", &a, cfg, out);
}
