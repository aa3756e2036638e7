/* dt_eval_run: saved weights evaluated on a data source, with what the file's metadata records as defaults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "dtrain/core.h"
#include "train/train_impl.h"

void dt_eval_config_default(dt_eval_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->data = NULL;
  cfg->split = DT_SPLIT_TEST;
  cfg->batch_size = 256;
}

/* What to build and evaluate: the caller's choices, the file's metadata where the caller left one open. */
typedef struct eval_plan {
  char model[64], data[512];
  int hidden[DT_TRAIN_MAX_HIDDEN], n_hidden;
  dt_normalize norm;
  char task[24];             /* the task the weights were trained on ("" if not recorded) */
  int outputs, l1, n_pos_weight;
  float pos_weight[DT_TRAIN_MAX_POS_WEIGHT];
} eval_plan;

/* "32,16" -> widths; 0 on success. */
static int parse_widths(const char *s, int *w, int *n) {
  int k = 0;
  while (*s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > 1 << 30 || k == DT_TRAIN_MAX_HIDDEN) return -1;
    w[k++] = (int)v;
    s = end;
    if (*s == ',') s++;
    else if (*s) return -1;
  }
  *n = k;
  return 0;
}

/* The model's name, and its widths when the file holds the model being built. */
static dt_status plan_model(const dt_eval_config *cfg, const dt_safetensors *f, eval_plan *p) {
  const char *file_model = dt_safetensors_meta(f, "model"), *name = cfg->model;
  if (!name || !*name) name = file_model;
  if (!name) return dt_error(DT_NOT_FOUND, "%s has no \"model\" metadata: name the model it holds", cfg->weights);
  if (strlen(name) >= sizeof p->model) return dt_error(DT_INVALID_ARGUMENT, "model name '%.40s...' too long", name);
  strcpy(p->model, name);
  p->n_hidden = cfg->n_hidden;
  memcpy(p->hidden, cfg->hidden, sizeof p->hidden);
  const char *h = dt_safetensors_meta(f, "hidden");
  if (p->n_hidden == 0 && file_model && strcmp(file_model, name) == 0 && h && *h &&
      parse_widths(h, p->hidden, &p->n_hidden) != 0)
    return dt_error(DT_CORRUPT, "%s: metadata hidden=\"%.60s\" is not a list of widths", cfg->weights, h);
  return DT_OK;
}

/* Normalisation and data source: the caller's, else the file's (else none and fashion-mnist). */
static dt_status plan_data(const dt_eval_config *cfg, const dt_safetensors *f, eval_plan *p) {
  p->norm = cfg->normalize;
  const char *nz = dt_safetensors_meta(f, "normalize");
  if (!cfg->normalize_set) {
    p->norm.enabled = nz && *nz;
    if (p->norm.enabled && (sscanf(nz, "%f,%f", &p->norm.mean, &p->norm.std) != 2 || !(p->norm.std > 0)))
      return dt_error(DT_CORRUPT, "%s: metadata normalize=\"%.60s\" is not MEAN,STD", cfg->weights, nz);
  }
  const char *src = cfg->data;
  if (!src || !*src) src = dt_safetensors_meta(f, "data");
  if (!src || !*src) src = "fashion-mnist";
  if (strlen(src) >= sizeof p->data) return dt_error(DT_INVALID_ARGUMENT, "data source '%.40s...' too long", src);
  strcpy(p->data, src);
  return DT_OK;
}

/* The task the weights were trained on: its kind, width, L1 loss and BCE's pos_weight. */
static dt_status plan_task(const char *path, const dt_safetensors *f, eval_plan *p) {
  const char *o = dt_safetensors_meta(f, "outputs"), *l = dt_safetensors_meta(f, "loss");
  const char *pw = dt_safetensors_meta(f, "pos_weight"), *k = dt_safetensors_meta(f, "task");
  if (k) snprintf(p->task, sizeof p->task, "%s", k);
  if (o && *o && (sscanf(o, "%d", &p->outputs) != 1 || p->outputs < 1))
    return dt_error(DT_CORRUPT, "%s: metadata outputs=\"%.40s\" is not a positive count", path, o);
  p->l1 = l && strcmp(l, "l1") == 0;
  for (const char *c = pw; c && *c; p->n_pos_weight++) {
    char *end;
    if (p->n_pos_weight == DT_TRAIN_MAX_POS_WEIGHT) return dt_error(DT_CORRUPT, "%s: metadata pos_weight too long", path);
    p->pos_weight[p->n_pos_weight] = strtof(c, &end);
    if (end == c || (*end && *end != ',')) return dt_error(DT_CORRUPT, "%s: metadata pos_weight is not a list", path);
    c = *end ? end + 1 : end;
  }
  return DT_OK;
}

static dt_status read_plan(const dt_eval_config *cfg, eval_plan *p) {
  dt_safetensors *f = NULL;
  DT_CHECK(dt_safetensors_load(cfg->weights, &f));
  dt_status st = plan_model(cfg, f, p);
  if (st == DT_OK) st = plan_data(cfg, f, p);
  if (st == DT_OK) st = plan_task(cfg->weights, f, p);
  dt_safetensors_free(f);
  return st;
}

/* What an evaluation holds, released by eval_free. */
typedef struct eval_state {
  dt_dataset *ds;
  dt_task *task;
  dt_model *m;
  dt_loader *loader;
  dt_dp *dp;
  float *buf; /* dp: outputs of a whole batch */
  dt_metric_acc *acc;
  dt_prefix_sampler prefix;
} eval_state;

static void eval_free(eval_state *s) {
  dt_metric_acc_free(s->acc);
  dt_free(s->buf);
  dt_dp_free(s->dp);
  dt_loader_free(s->loader);
  dt_model_free(s->m);
  dt_task_free(s->task);
  dt_dataset_free(s->ds);
}

/* The model's forward, or dp's into the whole-batch buffer. */
static dt_status forward(void *user, const void *x, int n, const float **out) {
  eval_state *s = user;
  if (!s->dp) return dt_model_forward(s->m, x, n, out);
  DT_CHECK(dt_dp_forward(s->dp, x, n, s->buf));
  *out = s->buf;
  return DT_OK;
}

/* The data must pose the task the weights were trained on: another kind, or another number of
 * regression targets or labels, would be scored as nonsense (or read past the targets). */
static dt_status open_task(const dt_eval_config *cfg, const eval_plan *p, eval_state *s) {
  const dt_data_info *info = dt_dataset_info(s->ds);
  if (p->task[0] && strcmp(p->task, dt_task_kind_name(info->task)) != 0)
    return dt_error(DT_USAGE, "%s was trained on a %s task; %s is a %s task", cfg->weights, p->task, p->data,
                    dt_task_kind_name(info->task));
  if (p->outputs && info->task != DT_TASK_CLASSIFICATION && p->outputs != info->outputs)
    return dt_error(DT_USAGE, "%s has %d outputs; %s's target has %d", cfg->weights, p->outputs, p->data,
                    info->outputs);
  dt_task_config tc = {.kind = info->task, .outputs = info->outputs,
                       .regression_loss = p->l1 ? DT_LOSS_L1 : DT_LOSS_MSE,
                       .pos_weight = p->n_pos_weight ? p->pos_weight : NULL};
  if (p->outputs > tc.outputs) tc.outputs = p->outputs; /* a split may not reach the last class */
  DT_CHECK(dt_task_new(&tc, &s->task));
  return dt_metric_acc_new(s->task, 1, &s->acc);
}

static dt_status open_model(const dt_eval_config *cfg, const eval_plan *p, eval_state *s) {
  const dt_data_info *info = dt_dataset_info(s->ds);
  if (info->input < 0) return dt_error(DT_USAGE, "model %s reads an f32 input field \"x\"; %s has none", p->model, p->data);
  const dt_field *x = &info->field[info->input];
  const dt_task_config *tc = dt_task_config_of(s->task);
  dt_zoo_config zc = {.ndim = x->ndim, .outputs = tc->outputs, .task = tc->kind, .dropout = -1.0f,
                      .hidden = p->n_hidden ? p->hidden : NULL, .n_hidden = p->n_hidden};
  for (int d = 0; d < x->ndim; d++) zc.input_shape[d] = x->shape[d];
  DT_CHECK(dt_model_zoo_new(p->model, &zc, &s->m));
  DT_CHECK(dt_model_build(s->m, cfg->batch_size, 0));
  DT_CHECK(dt_model_load(s->m, cfg->weights));
  if (cfg->workers <= 0) return DT_OK;
  DT_CHECK(dt_dp_new(s->m, cfg->workers, cfg->batch_size, &s->dp));
  return dt_alloc_array((size_t)cfg->batch_size * (size_t)tc->outputs, sizeof(float), "eval outputs", (void **)&s->buf);
}

/* A loader over the split's first --limit samples (all by default), in order. */
static dt_status open_loader(const dt_eval_config *cfg, eval_state *s) {
  const int64_t size = dt_dataset_size(s->ds);
  const int64_t n = cfg->limit > 0 && cfg->limit < size ? cfg->limit : size;
  s->prefix = (dt_prefix_sampler){.n = n, .shuffle = 0, .seed = 0};
  dt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = cfg->batch_size;
  if (n < size) {
    lc.sampler = dt_prefix_sampler_fn;
    lc.sampler_user = &s->prefix;
    lc.sampler_capacity = n;
  }
  return dt_loader_new(s->ds, &lc, &s->loader);
}

static dt_status check_config(const dt_eval_config *cfg) {
  if (!cfg || !cfg->weights) return dt_error(DT_INVALID_ARGUMENT, "no weights file to evaluate");
  if (cfg->batch_size < 1) return dt_error(DT_INVALID_ARGUMENT, "batch size = %d must be >= 1", cfg->batch_size);
  if (cfg->limit < 0) return dt_error(DT_INVALID_ARGUMENT, "limit = %lld must be >= 0", (long long)cfg->limit);
  if (cfg->n_hidden < 0 || cfg->n_hidden > DT_TRAIN_MAX_HIDDEN)
    return dt_error(DT_INVALID_ARGUMENT, "%d hidden layers: at most %d", cfg->n_hidden, DT_TRAIN_MAX_HIDDEN);
  return DT_OK;
}

dt_status dt_eval_run(const dt_eval_config *cfg, dt_eval_result *res) {
  DT_CHECK(check_config(cfg));
  DT_CHECK(dt_set_threads(cfg->threads));
  eval_plan p;
  memset(&p, 0, sizeof p);
  DT_CHECK(read_plan(cfg, &p));
  eval_state s;
  memset(&s, 0, sizeof s);
  double seconds = 0;
  dt_status st = dt_dataset_load(p.data, cfg->split, &p.norm, &s.ds);
  if (st == DT_OK) st = open_task(cfg, &p, &s);
  if (st == DT_OK) st = open_model(cfg, &p, &s);
  if (st == DT_OK) st = open_loader(cfg, &s);
  if (st == DT_OK) st = dt_train_evaluate(s.m, forward, &s, s.loader, s.task, -1, s.acc, &seconds);
  if (st == DT_OK) {
    dt_eval_result r;
    memset(&r, 0, sizeof r);
    r.samples = dt_metric_acc_samples(s.acc);
    r.loss = dt_metric_acc_loss(s.acc);
    r.metrics = *dt_task_metrics(s.task);
    dt_metric_acc_values(s.acc, 0, r.metric);
    r.seconds = seconds;
    r.samples_per_s = seconds > 0 ? (double)r.samples / seconds : 0;
    snprintf(r.model, sizeof r.model, "%s", p.model);
    snprintf(r.data, sizeof r.data, "%s", p.data);
    *res = r;
  }
  eval_free(&s);
  return st;
}
