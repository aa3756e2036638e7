/* Zoo model resnet9: the DAWNBench ResNet-9 of Page (myrtle.ai, "How to train your ResNet", 2018), which
 * reaches 94% on CIFAR-10 in 24 epochs. Layers and state_dict names:
 *   conv1 = Conv2d(C, w, 3, padding=1, bias=False); bn1; relu
 *   layer1: conv (w -> 2w), bn, relu, pool = MaxPool2d(2); res = conv1, bn1, relu1, conv2, bn2, relu2 (2w),
 *           added to its input (no ReLU after the sum)
 *   layer2: conv (2w -> 4w), bn, relu, pool
 *   layer3: conv (4w -> 8w), bn, relu, pool; res as layer1's (8w)
 *   pool = MaxPool2d(k) with k = the smaller side left (4 on 32x32: a global max); flatten;
 *   fc = Linear(8w, classes, bias=False); scale: the logits times 0.125
 * w = --width (64 by default: 6.6 M parameters). Initialisation: PyTorch's defaults (Page's code keeps them);
 * with zero_init_residual each residual's bn2 weight starts at 0, so the branch gives relu(0) = 0 and the stage
 * starts as its head alone. Images must be square (the last pool is global) and at least 8x8. */
#include <stdio.h>

#include "core/impl.h"
#include "models/zoo.h"
#include "nn/layer.h"

#define PAGE_WIDTH 64
#define LOGIT_SCALE 0.125f

/* "<pre>.<suffix>" into buf; NULL when too long (the add then refuses it). */
static const char *sub(char *buf, size_t len, const char *pre, const char *suffix) {
  return snprintf(buf, len, "%s%s%s", pre, *pre ? "." : "", suffix) < (int)len ? buf : NULL;
}

/* Conv2d 3x3 (bias-free) + BatchNorm2d + ReLU, named "<pre>.conv<tag>", "<pre>.bn<tag>", "<pre>.relu<tag>". */
static dt_status conv_bn(dt_model *m, const char *pre, const char *tag, int out) {
  char n[DT_LAYER_NAME_MAX], s[16];
  snprintf(s, sizeof s, "conv%s", tag);
  DT_CHECK(dt_model_add_conv2d(m, sub(n, sizeof n, pre, s), out, 3, 1, 1, 0));
  snprintf(s, sizeof s, "bn%s", tag);
  DT_CHECK(dt_model_add_batchnorm2d(m, sub(n, sizeof n, pre, s), 1e-5f, 0.1f));
  snprintf(s, sizeof s, "relu%s", tag);
  return dt_model_add_activation(m, sub(n, sizeof n, pre, s), DT_RELU);
}

/* "layer<k>": conv_bn to out channels and a 2x2 max pool, then with res a residual of two conv_bn. */
static dt_status stage(dt_model *m, const char *name, int out, int res, int zero_init) {
  char n[DT_LAYER_NAME_MAX];
  DT_CHECK(conv_bn(m, name, "", out));
  DT_CHECK(dt_model_add_maxpool2d(m, sub(n, sizeof n, name, "pool"), 2, 2, 0));
  if (!res) return DT_OK;
  char r[DT_LAYER_NAME_MAX];
  DT_CHECK(dt_model_begin_residual(m, sub(r, sizeof r, name, "res")));
  DT_CHECK(conv_bn(m, r, "1", out));
  DT_CHECK(conv_bn(m, r, "2", out));
  if (zero_init) DT_CHECK(dt_model_set_init(m, sub(n, sizeof n, r, "bn2.weight"), DT_INIT_ZEROS, 0.0f));
  return dt_model_end_residual(m);
}

static dt_status add_layers(dt_model *m, const dt_zoo_config *cfg, int w) {
  const int z = cfg->zero_init_residual != 0;
  DT_CHECK(conv_bn(m, "", "1", w));
  DT_CHECK(stage(m, "layer1", 2 * w, 1, z));
  DT_CHECK(stage(m, "layer2", 4 * w, 0, z));
  DT_CHECK(stage(m, "layer3", 8 * w, 1, z));
  const int side = (int)(cfg->input_shape[1] / 8); /* what three 2x2 pools leave */
  DT_CHECK(dt_model_add_maxpool2d(m, "pool", side, side, 0));
  DT_CHECK(dt_model_add_flatten(m, "flatten"));
  DT_CHECK(dt_model_add_linear(m, "fc", cfg->outputs, 0));
  return dt_model_add_scale(m, "scale", LOGIT_SCALE);
}

dt_status dt_zoo_build_resnet9(const dt_zoo_config *cfg, dt_model **out) {
  if (cfg->input_shape[1] < 8 || cfg->input_shape[2] < 8 || cfg->input_shape[1] / 8 != cfg->input_shape[2] / 8)
    return dt_error(DT_USAGE, "resnet9 downsamples by 8 and ends in a global max pool: it needs square images of at "
                    "least 8x8; the data's are %lldx%lld", (long long)cfg->input_shape[1], (long long)cfg->input_shape[2]);
  const int w = cfg->width ? cfg->width : PAGE_WIDTH;
  dt_model *m = NULL;
  DT_CHECK(dt_model_new(cfg->ndim, cfg->input_shape, &m));
  dt_status st = add_layers(m, cfg, w);
  if (st != DT_OK) {
    dt_model_free(m);
    return st;
  }
  *out = m;
  return DT_OK;
}
