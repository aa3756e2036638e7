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

dt_status dt_train_evaluate(dt_model *m, dt_dp *dp, dt_loader *l, int classes, int64_t count, dt_eval_sums *out) {
  dt_eval_sums sums = {0};
  dt_status st = DT_OK;
  int k = classes < 5 ? classes : 5;
  float *buf = NULL; /* dp: logits of a whole batch */
  double t0 = dt_time_now();
  dt_model_set_training(m, 0);
  DT_CHECK_GOTO(dt_loader_start_epoch(l, 0), st, done);
  for (;;) {
    dt_batch b;
    DT_CHECK_GOTO(dt_loader_next(l, &b), st, done);
    if (b.size == 0) break;
    const float *logits = NULL;
    float loss = 0;
    int64_t top1 = 0, topk = 0;
    if (dp) {
      if (!buf)
        DT_CHECK_GOTO(dt_alloc_array((size_t)b.size * (size_t)classes, sizeof(float), "eval logits", (void **)&buf),
                      st, done);
      DT_CHECK_GOTO(dt_dp_forward(dp, b.x, b.size, buf), st, done);
      logits = buf;
    } else {
      DT_CHECK_GOTO(dt_model_forward(m, b.x, b.size, &logits), st, done);
    }
    int n = b.size;
    if (count >= 0 && sums.samples + n > count) n = (int)(count - sums.samples); /* padding at the end */
    if (n <= 0) continue;
    DT_CHECK_GOTO(dt_loss_cross_entropy(logits, b.y, n, classes, 0.0f, &loss, NULL), st, done);
    dt_topk_correct(logits, b.y, n, classes, k, &top1, &topk);
    sums.samples += n;
    sums.loss_sum += (double)loss * n;
    sums.top1 += top1;
    sums.top5 += topk;
  }
  sums.seconds = dt_time_now() - t0;
  *out = sums;
done:
  dt_free(buf);
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
  dt_safetensors_free(file);
  file = NULL;

  DT_CHECK_GOTO(dt_dataset_load(data, cfg->split, &norm, &ds), st, done);
  int64_t n = dt_dataset_size(ds);
  if (cfg->limit > 0 && cfg->limit < n) n = cfg->limit;
  dt_zoo_config zc;
  memset(&zc, 0, sizeof zc);
  dt_dataset_sample_shape(ds, zc.sample_shape);
  zc.classes = dt_dataset_classes(ds);
  zc.hidden = n_hidden ? hidden : NULL;
  zc.n_hidden = n_hidden;
  zc.dropout = -1.0f;
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
  if (cfg->workers > 0) DT_CHECK_GOTO(dt_dp_new(m, cfg->workers, cfg->batch_size, &dp), st, done);
  dt_eval_sums sums;
  DT_CHECK_GOTO(dt_train_evaluate(m, dp, loader, zc.classes, -1, &sums), st, done);
  r.samples = sums.samples;
  r.loss = sums.samples ? sums.loss_sum / (double)sums.samples : 0;
  r.acc1 = sums.samples ? (double)sums.top1 / (double)sums.samples : 0;
  r.acc5 = sums.samples ? (double)sums.top5 / (double)sums.samples : 0;
  r.seconds = sums.seconds;
  r.samples_per_s = sums.seconds > 0 ? (double)sums.samples / sums.seconds : 0;
  strcpy(r.model, model_name);
  strcpy(r.data, data);
  *res = r;
done:
  dt_dp_free(dp);
  dt_loader_free(loader);
  dt_model_free(m);
  dt_dataset_free(ds);
  dt_safetensors_free(file);
  return st;
}
