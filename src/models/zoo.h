/* Internal: the model zoo's builders (one file per model) and their registry row. */
#ifndef DT_MODELS_ZOO_H
#define DT_MODELS_ZOO_H

#include "dtrain/model.h"

typedef dt_status (*dt_zoo_build_fn)(const dt_zoo_config *cfg, dt_model **out);

/* Adds the model's layers to a new model (not yet built). */
dt_status dt_zoo_build_linear(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_mlp(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_fashioncnn(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_mf(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_ncf(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet18(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet34(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet50(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet20(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet32(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet56(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert_tiny(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert_mini(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert_small(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert_medium(const dt_zoo_config *cfg, dt_model **out);

#endif
