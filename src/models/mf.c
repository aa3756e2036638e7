/* Zoo model "mf": biased matrix factorisation of (user, item) index pairs, the classic rating predictor. */
#include "core/impl.h"
#include "models/zoo.h"

#define MF_DEFAULT_FACTORS 64
#define MF_INIT_STD 0.01f /* factors start small: <p, q> ~ 0, the biases learn first */

dt_status dt_zoo_build_mf(const dt_zoo_config *cfg, dt_model **out) {
  dt_model *m = NULL;
  dt_status st = DT_OK;
  const int factors = cfg->factors > 0 ? cfg->factors : MF_DEFAULT_FACTORS;
  DT_CHECK(dt_model_new(cfg->ndim, cfg->input_shape, &m));
  DT_CHECK_GOTO(dt_model_set_input_dtype(m, DT_I32), st, fail);
  DT_CHECK_GOTO(dt_model_add_mf(m, "", cfg->index_size[0], cfg->index_size[1], factors, MF_INIT_STD, cfg->target_mean,
                                cfg->l2),
                st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}
