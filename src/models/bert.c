/* Zoo models "bert" and its presets: Hugging Face's BertForSequenceClassification, named as its state_dict
 * (bert.embeddings.*, bert.encoder.layer.N.*, bert.pooler.dense.*, classifier.*) and initialised as its
 * _init_weights (Linear and embeddings N(0, 0.02), biases 0, LayerNorm 1/0, the padding row 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "models/zoo.h"
#include "dtrain/checkpoint.h"
#include "io/json.h"
#include "nn/layer.h"

#define INIT_STD 0.02f
#define LN_EPS 1e-12f
#define MAX_POSITIONS 512
#define TYPE_VOCAB 2
#define PAD_ID 0          /* BertConfig's pad_token_id */
#define DEFAULT_DROPOUT 0.1f

typedef struct bert_dims {
  int layers, hidden, heads, intermediate;
} bert_dims;

/* Linear `name` initialised as Hugging Face's: weight N(0, 0.02^2), bias 0. */
static dt_status hf_linear(dt_model *m, const char *name, int out) {
  char t[96];
  DT_CHECK(dt_model_add_linear(m, name, out, 1));
  snprintf(t, sizeof t, "%s.weight", name);
  DT_CHECK(dt_model_set_init(m, t, DT_INIT_NORMAL, INIT_STD));
  snprintf(t, sizeof t, "%s.bias", name);
  return dt_model_set_init(m, t, DT_INIT_ZEROS, 0.0f);
}

static dt_status add_dropout(dt_model *m, const char *name, float p) {
  return p > 0.0f ? dt_model_add_dropout(m, name, p) : DT_OK;
}

/* BertAttention: self-attention, output dense + dropout, residual add, LayerNorm. */
static dt_status attention_block(dt_model *m, const char *pre, const bert_dims *d, float drop) {
  char n[96];
  static const char *const qkv[] = {"query", "key", "value"};
  snprintf(n, sizeof n, "%s.attention.residual", pre);
  DT_CHECK(dt_model_begin_residual(m, n));
  snprintf(n, sizeof n, "%s.attention.self", pre);
  DT_CHECK(dt_model_add_self_attention(m, n, d->heads, drop, 3, 2));
  for (int k = 0; k < 3; k++) {
    char t[128];
    snprintf(t, sizeof t, "%s.attention.self.%s.weight", pre, qkv[k]);
    DT_CHECK(dt_model_set_init(m, t, DT_INIT_NORMAL, INIT_STD));
    snprintf(t, sizeof t, "%s.attention.self.%s.bias", pre, qkv[k]);
    DT_CHECK(dt_model_set_init(m, t, DT_INIT_ZEROS, 0.0f));
  }
  snprintf(n, sizeof n, "%s.attention.output.dense", pre);
  DT_CHECK(hf_linear(m, n, d->hidden));
  snprintf(n, sizeof n, "%s.attention.output.dropout", pre);
  DT_CHECK(add_dropout(m, n, drop));
  DT_CHECK(dt_model_end_residual(m));
  snprintf(n, sizeof n, "%s.attention.output.LayerNorm", pre);
  return dt_model_add_layernorm(m, n, LN_EPS);
}

/* BertIntermediate + BertOutput: dense to the feed-forward size, GELU (erf), dense back, dropout, add, LayerNorm. */
static dt_status feed_forward_block(dt_model *m, const char *pre, const bert_dims *d, float drop) {
  char n[96];
  snprintf(n, sizeof n, "%s.output.residual", pre);
  DT_CHECK(dt_model_begin_residual(m, n));
  snprintf(n, sizeof n, "%s.intermediate.dense", pre);
  DT_CHECK(hf_linear(m, n, d->intermediate));
  snprintf(n, sizeof n, "%s.intermediate.intermediate_act_fn", pre);
  DT_CHECK(dt_model_add_activation(m, n, DT_GELU));
  snprintf(n, sizeof n, "%s.output.dense", pre);
  DT_CHECK(hf_linear(m, n, d->hidden));
  snprintf(n, sizeof n, "%s.output.dropout", pre);
  DT_CHECK(add_dropout(m, n, drop));
  DT_CHECK(dt_model_end_residual(m));
  snprintf(n, sizeof n, "%s.output.LayerNorm", pre);
  return dt_model_add_layernorm(m, n, LN_EPS);
}

static dt_status add_layers(dt_model *m, const dt_zoo_config *cfg, const bert_dims *d, float drop) {
  DT_CHECK(dt_model_set_input_dtype(m, DT_I32));
  DT_CHECK(dt_model_set_sequence_input(m, 3, 2)); /* no layer computes on padding */
  DT_CHECK(dt_model_add_bert_embeddings(m, "bert.embeddings", cfg->index_size[0], d->hidden, MAX_POSITIONS, TYPE_VOCAB,
                                        PAD_ID, INIT_STD));
  DT_CHECK(dt_model_add_layernorm(m, "bert.embeddings.LayerNorm", LN_EPS));
  DT_CHECK(add_dropout(m, "bert.embeddings.dropout", drop));
  for (int i = 0; i < d->layers; i++) {
    char pre[48];
    snprintf(pre, sizeof pre, "bert.encoder.layer.%d", i);
    DT_CHECK(attention_block(m, pre, d, drop));
    DT_CHECK(feed_forward_block(m, pre, d, drop));
  }
  DT_CHECK(dt_model_add_first_token(m, "bert.pooler.first"));
  DT_CHECK(hf_linear(m, "bert.pooler.dense", d->hidden));
  DT_CHECK(dt_model_add_activation(m, "bert.pooler.activation", DT_TANH));
  DT_CHECK(add_dropout(m, "dropout", drop));
  return hf_linear(m, "classifier", cfg->outputs);
}

/* The preset's dimensions with the config's overrides; DT_USAGE for a hidden size the heads do not divide. */
static dt_status dims_of(const dt_zoo_config *cfg, bert_dims preset, bert_dims *d) {
  *d = preset;
  if (cfg->layers > 0) d->layers = cfg->layers;
  if (cfg->hidden_size > 0) d->hidden = cfg->hidden_size;
  if (cfg->heads > 0) d->heads = cfg->heads;
  d->intermediate = cfg->intermediate_size > 0 ? cfg->intermediate_size : 4 * d->hidden;
  if (d->hidden % d->heads != 0)
    return dt_error(DT_USAGE, "--hidden-size %d is not a multiple of --heads %d", d->hidden, d->heads);
  if (cfg->ndim != 2 || cfg->input_shape[0] != 3 || cfg->input_shape[1] > MAX_POSITIONS || cfg->n_index != 1)
    return dt_error(DT_USAGE, "bert reads token ids (3, L) with L <= %d from text data (a .csv with --vocab)",
                    MAX_POSITIONS);
  return DT_OK;
}

static dt_status build(const dt_zoo_config *cfg, bert_dims preset, dt_model **out) {
  bert_dims d;
  DT_CHECK(dims_of(cfg, preset, &d));
  dt_model *m = NULL;
  DT_CHECK(dt_model_new(cfg->ndim, cfg->input_shape, &m));
  dt_status st = add_layers(m, cfg, &d, cfg->dropout < 0 ? DEFAULT_DROPOUT : cfg->dropout);
  if (st != DT_OK) {
    dt_model_free(m);
    return st;
  }
  *out = m;
  return DT_OK;
}

/* The presets of Turc et al. 2019 (google-research/bert's small models) and BERT-base. */
static const struct {
  const char *name;
  bert_dims dims;
} presets[] = {{"bert", {12, 768, 12, 0}},   {"bert-tiny", {2, 128, 2, 0}},   {"bert-mini", {4, 256, 4, 0}},
               {"bert-small", {4, 512, 8, 0}}, {"bert-medium", {8, 512, 8, 0}}};

dt_status dt_zoo_build_bert(const dt_zoo_config *cfg, dt_model **out) { return build(cfg, presets[0].dims, out); }
dt_status dt_zoo_build_bert_tiny(const dt_zoo_config *cfg, dt_model **out) { return build(cfg, presets[1].dims, out); }
dt_status dt_zoo_build_bert_mini(const dt_zoo_config *cfg, dt_model **out) { return build(cfg, presets[2].dims, out); }
dt_status dt_zoo_build_bert_small(const dt_zoo_config *cfg, dt_model **out) { return build(cfg, presets[3].dims, out); }
dt_status dt_zoo_build_bert_medium(const dt_zoo_config *cfg, dt_model **out) { return build(cfg, presets[4].dims, out); }

/* The dimensions weights were trained with: the preset of their "model", changed by their "bert_dims". */
static dt_status dims_of_weights(const dt_safetensors *f, bert_dims *d) {
  const char *model = dt_safetensors_meta(f, "model"), *bd = dt_safetensors_meta(f, "bert_dims");
  int found = 0;
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
    if (model && strcmp(model, presets[i].name) == 0) *d = presets[i].dims, found = 1;
  if (!found) return dt_error(DT_CORRUPT, "the weights' model \"%s\" is not a bert model", model ? model : "");
  int v[4] = {0, 0, 0, 0};
  if (bd && *bd && sscanf(bd, "%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3]) != 4)
    return dt_error(DT_CORRUPT, "metadata bert_dims=\"%.40s\" is not 4 sizes", bd);
  if (v[0] > 0) d->layers = v[0];
  if (v[1] > 0) d->hidden = v[1];
  if (v[2] > 0) d->heads = v[2];
  d->intermediate = v[3] > 0 ? v[3] : 4 * d->hidden;
  return DT_OK;
}

/* transformers' problem_type of the weights' task. */
static const char *problem_type(const char *task) {
  if (task && strcmp(task, "multilabel") == 0) return "multi_label_classification";
  if (task && strcmp(task, "regression") == 0) return "regression";
  return "single_label_classification";
}

dt_status dt_bert_hf_config(const dt_safetensors *f, dt_json_obj *cfg) {
  bert_dims d = presets[0].dims;
  DT_CHECK(dims_of_weights(f, &d));
  dt_named_tensor words, cls;
  DT_CHECK(dt_safetensors_find(f, "bert.embeddings.word_embeddings.weight", &words));
  DT_CHECK(dt_safetensors_find(f, "classifier.weight", &cls));
  const char *drop = dt_safetensors_meta(f, "dropout");
  const double p = drop && *drop ? atof(drop) : 0.1; /* as the config writes it, not DEFAULT_DROPOUT's float */
  static const char *const arch[] = {"BertForSequenceClassification"};
  dt_json_obj_strs(cfg, "architectures", arch, 1);
  dt_json_obj_str(cfg, "model_type", "bert");
  dt_json_obj_int(cfg, "vocab_size", words.tensor.shape[0]);
  dt_json_obj_int(cfg, "hidden_size", d.hidden);
  dt_json_obj_int(cfg, "num_hidden_layers", d.layers);
  dt_json_obj_int(cfg, "num_attention_heads", d.heads);
  dt_json_obj_int(cfg, "intermediate_size", d.intermediate);
  dt_json_obj_str(cfg, "hidden_act", "gelu");
  dt_json_obj_num(cfg, "hidden_dropout_prob", p);
  dt_json_obj_num(cfg, "attention_probs_dropout_prob", p);
  dt_json_obj_int(cfg, "max_position_embeddings", MAX_POSITIONS);
  dt_json_obj_int(cfg, "type_vocab_size", TYPE_VOCAB);
  dt_json_obj_num(cfg, "initializer_range", 0.02); /* INIT_STD and LN_EPS as decimals, not their floats */
  dt_json_obj_num(cfg, "layer_norm_eps", 1e-12);
  dt_json_obj_int(cfg, "pad_token_id", PAD_ID);
  dt_json_obj_str(cfg, "position_embedding_type", "absolute");
  dt_json_obj_int(cfg, "num_labels", cls.tensor.shape[0]);
  dt_json_obj_str(cfg, "problem_type", problem_type(dt_safetensors_meta(f, "task")));
  return DT_OK;
}
