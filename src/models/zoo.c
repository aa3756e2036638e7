/* Model zoo registry: name, one-line description, supported tasks and builder of every model, looked up by name. */
#include <string.h>

#include "core/impl.h"
#include "models/zoo.h"

#define ALL_TASKS ((1u << DT_TASK_CLASSIFICATION) | (1u << DT_TASK_MULTILABEL) | (1u << DT_TASK_REGRESSION))

static const struct zoo_entry {
  const char *name;
  const char *doc;
  unsigned tasks;  /* bit per dt_task_kind */
  int input_ndim;  /* rank of the input sample it needs; 0: any */
  int index_cols;  /* > 0: reads index inputs of this many columns (user, item); 0: f32 inputs */
  dt_zoo_build_fn build;
  dt_zoo_hf_config_fn hf_config; /* config.json of an HF export; NULL: the generic one */
  int takes_width;                /* 1: dt_zoo_config.width sets its first stage's channels */
} zoo[] = {
    {"linear", "Linear(in, out) on the flattened input: the PyTorch DDP tutorial's model", ALL_TASKS, 0, 0,
     dt_zoo_build_linear, NULL, 0},
    {"mlp", "flatten, then Linear+ReLU per hidden width (default 256,128), then Linear to the outputs",
     ALL_TASKS, 0, 0, dt_zoo_build_mlp, NULL, 0},
    {"fashioncnn",
     "2x (Conv2d 3x3 + BatchNorm2d + ReLU + MaxPool2d), Linear 600, Dropout 0.25, Linear 120, Linear classes "
     "(on (C, H, W) images)",
     1u << DT_TASK_CLASSIFICATION, 3, 0, dt_zoo_build_fashioncnn, NULL, 0},
    {"mf",
     "biased matrix factorisation of (user, item): mean + user bias + item bias + <user, item> factors (--factors, "
     "default 64)",
     1u << DT_TASK_REGRESSION, 1, 2, dt_zoo_build_mf, NULL, 0},
    {"ncf",
     "neural collaborative filtering: user and item embeddings (--factors, default 32) side by side, Linear+ReLU per "
     "hidden width (default 64,32), Linear to the outputs",
     ALL_TASKS, 1, 2, dt_zoo_build_ncf, NULL, 0},
    {"resnet18", "torchvision's ResNet-18 (BasicBlock 2,2,2,2; 7x7/2 stem, max pool; images >= 32x32)",
     1u << DT_TASK_CLASSIFICATION, 3, 0, dt_zoo_build_resnet18, NULL, 0},
    {"resnet34", "torchvision's ResNet-34 (BasicBlock 3,4,6,3; images >= 32x32)", 1u << DT_TASK_CLASSIFICATION, 3, 0,
     dt_zoo_build_resnet34, NULL, 0},
    {"resnet50", "torchvision's ResNet-50 (Bottleneck 3,4,6,3, stride on the 3x3 as v1.5; images >= 32x32)",
     1u << DT_TASK_CLASSIFICATION, 3, 0, dt_zoo_build_resnet50, NULL, 0},
    {"resnet9",
     "the DAWNBench ResNet-9 (Page 2018): 3x3 conv-BN-ReLU stages 64/128/256/512 (--width: the first) with 2x2 max "
     "pools, residual pairs after the 2nd and 4th, global max pool, bias-free Linear, logits x 0.125",
     1u << DT_TASK_CLASSIFICATION, 3, 0, dt_zoo_build_resnet9, NULL, 1},
    {"resnet20",
     "CIFAR ResNet-20 (He et al. 2016: 3x3 stem, 3 stages 16/32/64 (--width: the first) of 3 BasicBlocks, 1x1 "
     "projections)",
     1u << DT_TASK_CLASSIFICATION, 3, 0, dt_zoo_build_resnet20, NULL, 1},
    {"resnet32", "CIFAR ResNet-32 (as resnet20, 5 blocks a stage)", 1u << DT_TASK_CLASSIFICATION, 3, 0,
     dt_zoo_build_resnet32, NULL, 1},
    {"resnet56", "CIFAR ResNet-56 (as resnet20, 9 blocks a stage)", 1u << DT_TASK_CLASSIFICATION, 3, 0,
     dt_zoo_build_resnet56, NULL, 1},
    {"bert",
     "Hugging Face's BertForSequenceClassification on token ids (text data): BERT-base sizes 12 layers, hidden 768, "
     "12 heads, changed by --layers, --hidden-size, --heads, --intermediate-size",
     ALL_TASKS, 2, 1, dt_zoo_build_bert, dt_bert_hf_config, 0},
    {"bert-tiny", "bert with 2 layers, hidden 128, 2 heads (Turc et al. 2019)", ALL_TASKS, 2, 1, dt_zoo_build_bert_tiny,
     dt_bert_hf_config, 0},
    {"bert-mini", "bert with 4 layers, hidden 256, 4 heads", ALL_TASKS, 2, 1, dt_zoo_build_bert_mini,
     dt_bert_hf_config, 0},
    {"bert-small", "bert with 4 layers, hidden 512, 8 heads", ALL_TASKS, 2, 1, dt_zoo_build_bert_small,
     dt_bert_hf_config, 0},
    {"bert-medium", "bert with 8 layers, hidden 512, 8 heads", ALL_TASKS, 2, 1, dt_zoo_build_bert_medium,
     dt_bert_hf_config, 0},
};
#define ZOO_SIZE (sizeof zoo / sizeof zoo[0])

static const struct zoo_entry *find(const char *name) {
  for (size_t i = 0; i < ZOO_SIZE; i++)
    if (strcmp(zoo[i].name, name) == 0) return &zoo[i];
  return NULL;
}

static void tasks_text(unsigned mask, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int k = DT_TASK_CLASSIFICATION; k <= DT_TASK_REGRESSION && o < len; k++)
    if (mask & (1u << k)) o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "", dt_task_kind_name(k));
}

/* The model fits the data's task and input rank; DT_USAGE naming both sides otherwise. */
static dt_status check_fit(const struct zoo_entry *e, const dt_zoo_config *cfg) {
  char tasks[96];
  tasks_text(e->tasks, tasks, sizeof tasks);
  if (!(e->tasks & (1u << cfg->task)))
    return dt_error(DT_USAGE, "model %s supports %s; the data is a %s task", e->name, tasks,
                    dt_task_kind_name(cfg->task));
  if (e->input_ndim && cfg->ndim != e->input_ndim)
    return dt_error(DT_USAGE, "model %s needs %d-dimensional inputs (C, H, W); the data's samples have %d dimension(s)",
                    e->name, e->input_ndim, cfg->ndim);
  if (e->index_cols && cfg->n_index != e->index_cols)
    return dt_error(DT_USAGE, "model %s reads %d index columns (user, item); the data's input is %s", e->name,
                    e->index_cols, cfg->n_index ? "another number of index columns" : "f32 values (try mlp)");
  if (!e->index_cols && cfg->n_index)
    return dt_error(DT_USAGE, "model %s reads f32 inputs; the data's input is %d index columns (try mf or ncf)", e->name,
                    cfg->n_index);
  if (cfg->ndim < 1 || cfg->ndim > 4)
    return dt_error(DT_INVALID_ARGUMENT, "model %s: input rank %d, expected 1..4", e->name, cfg->ndim);
  for (int d = 0; d < cfg->ndim; d++)
    if (cfg->input_shape[d] < 1)
      return dt_error(DT_INVALID_ARGUMENT, "model %s: input_shape[%d] is %lld, expected >= 1", e->name, d,
                      (long long)cfg->input_shape[d]);
  if (cfg->width && !e->takes_width)
    return dt_error(DT_USAGE, "model %s has fixed widths; --width applies to resnet9, resnet20, resnet32, resnet56",
                    e->name);
  if (cfg->width < 0 || cfg->width > 4096)
    return dt_error(DT_INVALID_ARGUMENT, "model %s: width %d, expected 1..4096", e->name, cfg->width);
  if (cfg->outputs < 1) return dt_error(DT_INVALID_ARGUMENT, "model %s: %d outputs, expected >= 1", e->name, cfg->outputs);
  return DT_OK;
}

dt_status dt_model_zoo_new(const char *name, const dt_zoo_config *cfg, dt_model **out) {
  if (!name || !cfg || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_model_zoo_new: NULL argument");
  const struct zoo_entry *e = find(name);
  if (e) {
    DT_CHECK(check_fit(e, cfg));
    dt_status st = e->build(cfg, out);
    return st == DT_OK ? st : dt_error_prefix(st, "building model %s", name);
  }
  char known[256] = "";
  size_t o = 0;
  for (size_t i = 0; i < ZOO_SIZE && o < sizeof known; i++)
    o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", i ? ", " : "", zoo[i].name);
  return dt_error(DT_NOT_FOUND, "unknown model \"%s\"; known models: %s", name, known);
}

int dt_model_zoo_takes_width(const char *name) {
  const struct zoo_entry *e = name ? find(name) : NULL;
  return e && e->takes_width;
}

dt_status dt_model_zoo_tasks(const char *name, char *buf, size_t len) {
  const struct zoo_entry *e = name ? find(name) : NULL;
  if (!e) return dt_error(DT_NOT_FOUND, "unknown model \"%s\"", name ? name : "(null)");
  tasks_text(e->tasks, buf, len);
  return DT_OK;
}

void dt_model_zoo_each(void (*fn)(const char *name, const char *doc, void *user), void *user) {
  if (!fn) return;
  for (size_t i = 0; i < ZOO_SIZE; i++) fn(zoo[i].name, zoo[i].doc, user);
}

dt_zoo_hf_config_fn dt_zoo_hf_config(const char *name) {
  const struct zoo_entry *e = name ? find(name) : NULL;
  return e ? e->hf_config : NULL;
}
