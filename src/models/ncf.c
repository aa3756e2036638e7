/* Zoo model "ncf": neural collaborative filtering, user and item embeddings side by side through an MLP to one output. */
#include <stdio.h>

#include "core/impl.h"
#include "models/zoo.h"

#define NCF_DEFAULT_FACTORS 32
#define NCF_INIT_STD 0.01f /* as the NCF paper's N(0, 0.01) */

/* Tensors as a torch module with user_embedding, item_embedding, mlp = Sequential(Linear, ReLU, ...) and out. */
dt_status dt_zoo_build_ncf(const dt_zoo_config *cfg, dt_model **out) {
  static const int default_hidden[] = {64, 32};
  static const char *const names[] = {"user_embedding", "item_embedding"};
  const int *hidden = cfg->hidden ? cfg->hidden : default_hidden;
  const int n_hidden = cfg->hidden ? cfg->n_hidden : 2;
  const int factors = cfg->factors > 0 ? cfg->factors : NCF_DEFAULT_FACTORS;
  const float drop = cfg->dropout < 0 ? 0.0f : cfg->dropout;
  dt_model *m = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_model_new(cfg->ndim, cfg->input_shape, &m));
  DT_CHECK_GOTO(dt_model_set_input_dtype(m, DT_I32), st, fail);
  DT_CHECK_GOTO(dt_model_add_embeddings(m, "", 2, names, cfg->index_size, factors, NCF_INIT_STD, cfg->l2), st, fail);
  char name[32];
  int at = 0; /* index in the Sequential "mlp" */
  for (int i = 0; i < n_hidden; i++) {
    snprintf(name, sizeof name, "mlp.%d", at++);
    DT_CHECK_GOTO(dt_model_add_linear(m, name, hidden[i], 1), st, fail);
    snprintf(name, sizeof name, "mlp.%d", at++);
    DT_CHECK_GOTO(dt_model_add_activation(m, name, DT_RELU), st, fail);
    if (drop > 0) {
      snprintf(name, sizeof name, "mlp.%d", at++);
      DT_CHECK_GOTO(dt_model_add_dropout(m, name, drop), st, fail);
    }
  }
  DT_CHECK_GOTO(dt_model_add_linear(m, "out", cfg->outputs, 1), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}
