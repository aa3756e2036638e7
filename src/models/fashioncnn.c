/* Zoo model "fashioncnn": the classic Fashion-MNIST CNN, with PyTorch's module names (layer1.0 ... fc3). */
#include "core/impl.h"
#include "models/zoo.h"

/* The PyTorch module it mirrors (identical state_dict keys):
 *   layer1 = Sequential(Conv2d(1, 32, 3, padding=1), BatchNorm2d(32), ReLU(), MaxPool2d(2))
 *   layer2 = Sequential(Conv2d(32, 64, 3), BatchNorm2d(64), ReLU(), MaxPool2d(2))
 *   fc1 = Linear(64*6*6, 600); drop = Dropout(0.25); fc2 = Linear(600, 120); fc3 = Linear(120, 10)
 *   forward: layer1, layer2, view(N, -1), fc1, drop, fc2, fc3 */
dt_status dt_zoo_build_fashioncnn(const dt_zoo_config *cfg, dt_model **out) {
  float drop = cfg->dropout < 0 ? 0.25f : cfg->dropout;
  dt_model *m = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_model_new(cfg->ndim, cfg->input_shape, &m));
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "layer1.0", 32, 3, 1, 1, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, "layer1.1", 1e-5f, 0.1f), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "layer1.2", DT_RELU), st, fail);
  DT_CHECK_GOTO(dt_model_add_maxpool2d(m, "layer1.3", 2, 2, 0), st, fail);
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "layer2.0", 64, 3, 1, 0, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, "layer2.1", 1e-5f, 0.1f), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "layer2.2", DT_RELU), st, fail);
  DT_CHECK_GOTO(dt_model_add_maxpool2d(m, "layer2.3", 2, 2, 0), st, fail);
  DT_CHECK_GOTO(dt_model_add_flatten(m, "flatten"), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "fc1", 600, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_dropout(m, "drop", drop), st, fail); /* p = 0: an identity copy */
  DT_CHECK_GOTO(dt_model_add_linear(m, "fc2", 120, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "fc3", cfg->outputs, 1), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}
