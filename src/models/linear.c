/* Zoo model "linear": one Linear(in, out) over the flattened input, tensors "weight" and "bias" as torch.nn.Linear(in, out) used as the whole model. */
#include "core/impl.h"
#include "models/zoo.h"

dt_status dt_zoo_build_linear(const dt_zoo_config *cfg, dt_model **out) {
  dt_model *m = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_model_new(cfg->ndim, cfg->input_shape, &m));
  if (cfg->ndim > 1) DT_CHECK_GOTO(dt_model_add_flatten(m, "flatten"), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "", cfg->outputs, 1), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}
