/* Evaluation: one pass over a split in evaluation mode (loss, top-1, top-5), and dt_eval_run over saved weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "dtrain/core.h"
#include "train/train_impl.h"

dt_status dt_prefix_sampler_fn(void *user, int64_t epoch, int64_t *out, int64_t *n) {
  const dt_prefix_sampler *s = user;
  for (int64_t i = 0; i < s->n; i++) out[i] = i;
  if (s->shuffle) {
    /* Fisher-Yates with a stream of its own per epoch: a pure function of (seed, epoch). */
    dt_rng r;
    dt_rng_init(&r, s->seed, 0x5A4D504C00000000ull + (uint64_t)epoch);
    for (int64_t i = s->n - 1; i > 0; i--) {
      int64_t j = (int64_t)dt_rng_below(&r, (uint32_t)(i + 1));
      int64_t t = out[i];
      out[i] = out[j];
      out[j] = t;
    }
  }
  *n = s->n;
  return DT_OK;
}

dt_status dt_train_evaluate(dt_model *m, dt_forward_fn fwd, void *user, dt_loader *l, const dt_task *t, int64_t count,
                            dt_metric_acc *acc, double *seconds) {
  dt_status st = DT_OK;
  const double t0 = dt_time_now();
  int64_t counted = 0;
  dt_model_set_training(m, 0);
  DT_CHECK_GOTO(dt_loader_start_epoch(l, 0), st, done);
  for (;;) {
    dt_batch b;
    DT_CHECK_GOTO(dt_loader_next(l, &b), st, done);
    if (b.size == 0) break;
    const float *out = NULL;
    DT_CHECK_GOTO(fwd(user, b.x, b.size, &out), st, done);
    int n = b.size;
    if (count >= 0 && counted + n > count) n = (int)(count - counted); /* padding at the end */
    if (n <= 0) continue;
    float loss = 0;
    DT_CHECK_GOTO(dt_task_loss(t, out, b.target, n, 0, &loss, NULL), st, done);
    DT_CHECK_GOTO(dt_metric_acc_add(acc, out, b.target, n, (double)loss), st, done);
    counted += n;
  }
  *seconds = dt_time_now() - t0;
done:
  dt_model_set_training(m, 1);
  return st;
}

void dt_eval_config_default(dt_eval_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->data = NULL;
  cfg->split = DT_SPLIT_TEST;
  cfg->batch_size = 256;
}

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

/* The model's forward, or dp's into a whole-batch buffer. */
typedef struct eval_forward {
  dt_model *m;
  dt_dp *dp;
  float *buf;
} eval_forward;

static dt_status forward(void *user, const float *x, int n, const float **out) {
  eval_forward *ef = user;
  if (!ef->dp) return dt_model_forward(ef->m, x, n, out);
  DT_CHECK(dt_dp_forward(ef->dp, x, n, ef->buf));
  *out = ef->buf;
  return DT_OK;
}

/* What the weights' metadata says of the task: its kind ("" if not recorded), width, L1 loss, BCE's pos_weight. */
typedef struct task_meta {
  char kind[24];
  int outputs, l1, n_pos_weight;
  float pos_weight[DT_TRAIN_MAX_POS_WEIGHT];
} task_meta;

static dt_status read_task_meta(const dt_safetensors *f, const char *path, task_meta *t) {
  const char *o = dt_safetensors_meta(f, "outputs"), *l = dt_safetensors_meta(f, "loss");
  const char *pw = dt_safetensors_meta(f, "pos_weight"), *k = dt_safetensors_meta(f, "task");
  if (k) snprintf(t->kind, sizeof t->kind, "%s", k);
  if (o && *o && (sscanf(o, "%d", &t->outputs) != 1 || t->outputs < 1))
    return dt_error(DT_CORRUPT, "%s: metadata outputs=\"%.40s\" is not a positive count", path, o);
  t->l1 = l && strcmp(l, "l1") == 0;
  for (const char *p = pw; p && *p; t->n_pos_weight++) {
    char *end;
    if (t->n_pos_weight == DT_TRAIN_MAX_POS_WEIGHT) return dt_error(DT_CORRUPT, "%s: metadata pos_weight too long", path);
    t->pos_weight[t->n_pos_weight] = strtof(p, &end);
    if (end == p || (*end && *end != ',')) return dt_error(DT_CORRUPT, "%s: metadata pos_weight is not a list", path);
    p = *end ? end + 1 : end;
  }
  return DT_OK;
}

dt_status dt_eval_run(const dt_eval_config *cfg, dt_eval_result *res) {
  if (!cfg || !cfg->weights) return dt_error(DT_INVALID_ARGUMENT, "no weights file to evaluate");
  if (cfg->batch_size < 1) return dt_error(DT_INVALID_ARGUMENT, "batch size = %d must be >= 1", cfg->batch_size);
  if (cfg->limit < 0) return dt_error(DT_INVALID_ARGUMENT, "limit = %lld must be >= 0", (long long)cfg->limit);
  if (cfg->n_hidden < 0 || cfg->n_hidden > DT_TRAIN_MAX_HIDDEN)
    return dt_error(DT_INVALID_ARGUMENT, "%d hidden layers: at most %d", cfg->n_hidden, DT_TRAIN_MAX_HIDDEN);
  dt_status st = DT_OK;
  dt_safetensors *file = NULL;
  dt_dataset *ds = NULL;
  dt_model *m = NULL;
  dt_loader *loader = NULL;
  dt_dp *dp = NULL;
  dt_task *task = NULL;
  dt_metric_acc *acc = NULL;
  eval_forward ef = {0};
  task_meta task_meta = {0};
  dt_eval_result r;
  memset(&r, 0, sizeof r);
  char model_name[64], data[512];
  int hidden[DT_TRAIN_MAX_HIDDEN], n_hidden = cfg->n_hidden;
  memcpy(hidden, cfg->hidden, sizeof hidden);
  dt_normalize norm = cfg->normalize;

  DT_CHECK_GOTO(dt_set_threads(cfg->threads), st, done);
  /* What the file says about itself fills whatever the caller left open. */
  DT_CHECK_GOTO(dt_safetensors_load(cfg->weights, &file), st, done);
  const char *name = cfg->model;
  if (!name || !*name) {
    name = dt_safetensors_meta(file, "model");
    if (!name) {
      st = dt_error(DT_NOT_FOUND, "%s has no \"model\" metadata: name the model it holds", cfg->weights);
      goto done;
    }
  }
  if (strlen(name) >= sizeof model_name) {
    st = dt_error(DT_INVALID_ARGUMENT, "model name '%.40s...' too long", name);
    goto done;
  }
  strcpy(model_name, name);
  /* The file's widths apply only when it holds the model being built. */
  const char *file_model = dt_safetensors_meta(file, "model");
  if (n_hidden == 0 && file_model && strcmp(file_model, model_name) == 0) {
    const char *h = dt_safetensors_meta(file, "hidden");
    if (h && *h && parse_widths(h, hidden, &n_hidden) != 0) {
      st = dt_error(DT_CORRUPT, "%s: metadata hidden=\"%.60s\" is not a list of widths", cfg->weights, h);
      goto done;
    }
  }
  if (!cfg->normalize_set) {
    const char *nz = dt_safetensors_meta(file, "normalize");
    norm.enabled = 0;
    if (nz && *nz) {
      if (sscanf(nz, "%f,%f", &norm.mean, &norm.std) != 2 || !(norm.std > 0)) {
        st = dt_error(DT_CORRUPT, "%s: metadata normalize=\"%.60s\" is not MEAN,STD", cfg->weights, nz);
        goto done;
      }
      norm.enabled = 1;
    }
  }
  const char *src = cfg->data;
  if (!src || !*src) src = dt_safetensors_meta(file, "data");
  if (!src || !*src) src = "fashion-mnist";
  if (strlen(src) >= sizeof data) {
    st = dt_error(DT_INVALID_ARGUMENT, "data source '%.40s...' too long", src);
    goto done;
  }
  strcpy(data, src);
  DT_CHECK_GOTO(read_task_meta(file, cfg->weights, &task_meta), st, done);
  dt_safetensors_free(file);
  file = NULL;

  DT_CHECK_GOTO(dt_dataset_load(data, cfg->split, &norm, &ds), st, done);
  int64_t n = dt_dataset_size(ds);
  if (cfg->limit > 0 && cfg->limit < n) n = cfg->limit;
  const dt_data_info *info = dt_dataset_info(ds);
  dt_task_config tc = {.kind = info->task, .outputs = info->outputs, .regression_loss = task_meta.l1 ? DT_LOSS_L1 : DT_LOSS_MSE,
                       .pos_weight = task_meta.n_pos_weight ? task_meta.pos_weight : NULL};
  /* The data must pose the task the weights were trained on: another kind, or another number of
   * regression targets or labels, would be scored as nonsense (or read past the targets). */
  if (task_meta.kind[0] && strcmp(task_meta.kind, dt_task_kind_name(info->task)) != 0) {
    st = dt_error(DT_USAGE, "%s was trained on a %s task; %s is a %s task", cfg->weights, task_meta.kind, data,
                  dt_task_kind_name(info->task));
    goto done;
  }
  if (task_meta.outputs && info->task != DT_TASK_CLASSIFICATION && task_meta.outputs != info->outputs) {
    st = dt_error(DT_USAGE, "%s has %d outputs; %s's target has %d", cfg->weights, task_meta.outputs, data,
                  info->outputs);
    goto done;
  }
  if (task_meta.outputs > tc.outputs) tc.outputs = task_meta.outputs; /* a split may not reach the last class */
  DT_CHECK_GOTO(dt_task_new(&tc, &task), st, done);
  if (info->input < 0) {
    st = dt_error(DT_USAGE, "model %s reads an f32 input field \"x\"; %s has none", model_name, data);
    goto done;
  }
  const dt_field *x = &info->field[info->input];
  dt_zoo_config zc = {.ndim = x->ndim, .outputs = tc.outputs, .task = tc.kind, .dropout = -1.0f,
                      .hidden = n_hidden ? hidden : NULL, .n_hidden = n_hidden};
  for (int d = 0; d < x->ndim; d++) zc.input_shape[d] = x->shape[d];
  DT_CHECK_GOTO(dt_model_zoo_new(model_name, &zc, &m), st, done);
  DT_CHECK_GOTO(dt_model_build(m, cfg->batch_size, 0), st, done);
  DT_CHECK_GOTO(dt_model_load(m, cfg->weights), st, done);

  dt_prefix_sampler prefix = {.n = n, .shuffle = 0, .seed = 0};
  dt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = cfg->batch_size;
  if (n < dt_dataset_size(ds)) {
    lc.sampler = dt_prefix_sampler_fn;
    lc.sampler_user = &prefix;
    lc.sampler_capacity = n;
  }
  DT_CHECK_GOTO(dt_loader_new(ds, &lc, &loader), st, done);
  ef.m = m;
  if (cfg->workers > 0) {
    DT_CHECK_GOTO(dt_dp_new(m, cfg->workers, cfg->batch_size, &dp), st, done);
    DT_CHECK_GOTO(dt_alloc_array((size_t)cfg->batch_size * (size_t)tc.outputs, sizeof(float), "eval outputs",
                                 (void **)&ef.buf), st, done);
    ef.dp = dp;
  }
  DT_CHECK_GOTO(dt_metric_acc_new(task, 1, &acc), st, done);
  double seconds = 0;
  DT_CHECK_GOTO(dt_train_evaluate(m, forward, &ef, loader, task, -1, acc, &seconds), st, done);
  r.samples = dt_metric_acc_samples(acc);
  r.loss = dt_metric_acc_loss(acc);
  r.metrics = *dt_task_metrics(task);
  dt_metric_acc_values(acc, 0, r.metric);
  r.seconds = seconds;
  r.samples_per_s = seconds > 0 ? (double)r.samples / seconds : 0;
  strcpy(r.model, model_name);
  strcpy(r.data, data);
  *res = r;
done:
  dt_metric_acc_free(acc);
  dt_free(ef.buf);
  dt_dp_free(dp);
  dt_loader_free(loader);
  dt_model_free(m);
  dt_task_free(task);
  dt_dataset_free(ds);
  dt_safetensors_free(file);
  return st;
}
