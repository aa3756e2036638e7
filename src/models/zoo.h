/* Internal: the model zoo's builders (one file per model) and their registry row. */
#ifndef DT_MODELS_ZOO_H
#define DT_MODELS_ZOO_H

#include "dtrain/model.h"

typedef dt_status (*dt_zoo_build_fn)(const dt_zoo_config *cfg, dt_model **out);

/* A model's Hugging Face config.json (the `dtrain export --format hf` hook of its zoo row): adds transformers'
 * members ("architectures", "model_type", sizes) to config, from the weights' tensors (shapes) and metadata.
 * Models without one get the generic config of dt_hf_export. */
struct dt_safetensors;
struct dt_json_obj;
typedef dt_status (*dt_zoo_hf_config_fn)(const struct dt_safetensors *weights, struct dt_json_obj *config);
/* The hook of the zoo model `name`; NULL for a model without one, or an unknown name. */
dt_zoo_hf_config_fn dt_zoo_hf_config(const char *name);

/* Adds the model's layers to a new model (not yet built). */
dt_status dt_zoo_build_linear(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_mlp(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_fashioncnn(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_mf(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_ncf(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet18(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet34(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet50(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet9(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet20(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet32(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_resnet56(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert_tiny(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert_mini(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert_small(const dt_zoo_config *cfg, dt_model **out);
dt_status dt_zoo_build_bert_medium(const dt_zoo_config *cfg, dt_model **out);
/* The bert models' config.json (BertConfig's fields) from the weights' shapes and metadata. */
dt_status dt_bert_hf_config(const struct dt_safetensors *weights, struct dt_json_obj *config);

#endif
