/* Zoo model "mlp": flatten, Linear+ReLU per hidden width ("fc1", "act1", ...), then Linear to the outputs. */
#include <stdio.h>

#include "core/impl.h"
#include "models/zoo.h"

dt_status dt_zoo_build_mlp(const dt_zoo_config *cfg, dt_model **out) {
  static const int default_hidden[] = {256, 128};
  const int *hidden = cfg->hidden ? cfg->hidden : default_hidden;
  int n_hidden = cfg->hidden ? cfg->n_hidden : 2;
  float drop = cfg->dropout < 0 ? 0.0f : cfg->dropout; /* default: no dropout */
  if (n_hidden < 0) return dt_error(DT_INVALID_ARGUMENT, "mlp: n_hidden %d, expected >= 0", n_hidden);
  dt_model *m = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_model_new(cfg->ndim, cfg->input_shape, &m));
  DT_CHECK_GOTO(dt_model_add_flatten(m, "flatten"), st, fail);
  char name[32];
  for (int i = 0; i < n_hidden; i++) {
    snprintf(name, sizeof name, "fc%d", i + 1);
    DT_CHECK_GOTO(dt_model_add_linear(m, name, hidden[i], 1), st, fail);
    snprintf(name, sizeof name, "act%d", i + 1);
    DT_CHECK_GOTO(dt_model_add_activation(m, name, DT_RELU), st, fail);
    if (drop > 0) {
      snprintf(name, sizeof name, "drop%d", i + 1);
      DT_CHECK_GOTO(dt_model_add_dropout(m, name, drop), st, fail);
    }
  }
  snprintf(name, sizeof name, "fc%d", n_hidden + 1);
  DT_CHECK_GOTO(dt_model_add_linear(m, name, cfg->outputs, 1), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}
