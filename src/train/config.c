/* The training configuration: defaults, validation and its JSON form (config.json). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"
#include "dtrain/dtrain.h"
#include "train/train_impl.h"

void dt_train_config_default(dt_train_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->model = "fashioncnn";
  cfg->dropout = -1.0f;
  cfg->data = "fashion-mnist";
  cfg->epochs = 1;
  cfg->batch_size = 64;
  dt_optim_config_default(DT_OPTIM_SGD, &cfg->optim);
  cfg->lr = 0.01f;
  cfg->schedule = DT_SCHED_CONSTANT;
  cfg->step_size_epochs = 1;
  cfg->gamma = 0.1f;
  cfg->progress_mode = DT_PROGRESS_AUTO;
  cfg->strategy = DT_STRATEGY_SINGLE;
  cfg->accumulate = 1;
  dt_ddp_config_default(&cfg->ddp);
  cfg->ddp.shared_grads = 1; /* the trainer takes dt_model_grads after wrapping */
  cfg->sharded_update = -1;
  cfg->ddp.auto_buckets = 1; /* --bucket-cap-mb or --first-bucket-mb choose PyTorch's fixed layout */
  cfg->backend = "auto";
  cfg->keep = 3;
  cfg->log_every = 10;
}

const char *dt_limit_pick_name(dt_limit_pick p) {
  static const char *const names[] = {"auto", "first", "random"};
  return (unsigned)p < 3 ? names[p] : "unknown";
}

const char *dt_strategy_name(dt_strategy s) {
  static const char *const names[] = {"single", "dp", "ddp"};
  return (unsigned)s < 3 ? names[s] : "unknown";
}

static int bad_float(float x) { return !isfinite(x); }

/* --sharded-update on asks for what these settings rule out: said rather than ignored (auto just stays off). */
static dt_status sharded_update_check(const dt_train_config *c) {
  const char *why = c->clip_grad_norm > 0           ? "--clip-grad-norm reads the averaged gradients"
                    : c->amp == DT_AMP_FP16           ? "--amp fp16's loss scaler reads the averaged gradients"
                    : c->sparse_embeddings            ? "--sparse-embeddings steps rows"
                    : !c->ddp.shared_grads            ? "it needs --shared-grads on"
                    : c->ddp.comm_hook != DT_COMM_HOOK_NONE ? "a --comm-hook all-reduces a compressed copy"
                                                            : NULL;
  return why ? dt_error(DT_USAGE, "--sharded-update on: %s (use auto or off)", why) : DT_OK;
}

dt_status dt_train_config_check(const dt_train_config *c) {
  if (!c) return dt_error(DT_INVALID_ARGUMENT, "no training configuration");
  DT_CHECK(dt_sgemm_check());
  DT_CHECK(dt_amp_kernels_check());
  if (!c->model || !*c->model) return dt_error(DT_INVALID_ARGUMENT, "no model name");
  if (!c->data || !*c->data) return dt_error(DT_INVALID_ARGUMENT, "no data source");
  if (c->epochs < 1) return dt_error(DT_INVALID_ARGUMENT, "epochs = %d must be >= 1", c->epochs);
  if (c->batch_size < 1) return dt_error(DT_INVALID_ARGUMENT, "batch size = %d must be >= 1", c->batch_size);
  if (c->n_hidden < 0 || c->n_hidden > DT_TRAIN_MAX_HIDDEN)
    return dt_error(DT_INVALID_ARGUMENT, "%d hidden layers: at most %d", c->n_hidden, DT_TRAIN_MAX_HIDDEN);
  for (int i = 0; i < c->n_hidden; i++)
    if (c->hidden[i] < 1) return dt_error(DT_INVALID_ARGUMENT, "hidden width %d = %d must be >= 1", i + 1, c->hidden[i]);
  if (bad_float(c->dropout) || c->dropout >= 1.0f)
    return dt_error(DT_INVALID_ARGUMENT, "dropout = %g must be in [0, 1) (or < 0 for the model's default)",
                    (double)c->dropout);
  if (c->limit_train < 0) return dt_error(DT_INVALID_ARGUMENT, "limit_train = %lld must be >= 0", (long long)c->limit_train);
  if (c->limit_test < 0) return dt_error(DT_INVALID_ARGUMENT, "limit_test = %lld must be >= 0", (long long)c->limit_test);
  if (c->threads < 0) return dt_error(DT_INVALID_ARGUMENT, "threads = %d must be >= 0", c->threads);
  if ((unsigned)c->limit_pick > DT_LIMIT_PICK_RANDOM)
    return dt_error(DT_INVALID_ARGUMENT, "limit_pick = %d: expected auto, first or random", (int)c->limit_pick);
  if ((unsigned)c->strategy > DT_STRATEGY_DDP)
    return dt_error(DT_INVALID_ARGUMENT, "unknown strategy %d", (int)c->strategy);
  if (c->workers < 0) return dt_error(DT_INVALID_ARGUMENT, "workers = %d must be >= 0", c->workers);
  if (c->accumulate < 1) return dt_error(DT_INVALID_ARGUMENT, "accumulate = %d must be >= 1", c->accumulate);
  if (c->strategy == DT_STRATEGY_DDP) {
    if (!(c->ddp.bucket_cap_mb > 0) || !(c->ddp.first_bucket_mb > 0))
      return dt_error(DT_INVALID_ARGUMENT, "bucket caps (%g, first %g MiB) must be > 0", c->ddp.bucket_cap_mb,
                      c->ddp.first_bucket_mb);
    if ((unsigned)c->ddp.comm_hook > DT_COMM_HOOK_FP16)
      return dt_error(DT_INVALID_ARGUMENT, "unknown comm hook %d", (int)c->ddp.comm_hook);
    if ((unsigned)c->ddp.rows_exchange > DT_ROWS_SPARSE)
      return dt_error(DT_INVALID_ARGUMENT, "unknown embedding exchange %d", (int)c->ddp.rows_exchange);
    if (c->timeout_s < 0) return dt_error(DT_INVALID_ARGUMENT, "timeout = %g must be >= 0", c->timeout_s);
    if (c->sharded_update > 0) DT_CHECK(sharded_update_check(c));
  }
  if (bad_float(c->lr) || c->lr <= 0) return dt_error(DT_INVALID_ARGUMENT, "learning rate = %g must be > 0", (double)c->lr);
  if (c->optim.kind != DT_OPTIM_SGD && c->optim.kind != DT_OPTIM_ADAM && c->optim.kind != DT_OPTIM_ADAMW)
    return dt_error(DT_INVALID_ARGUMENT, "unknown optimizer kind %d", (int)c->optim.kind);
  const dt_optim_config *o = &c->optim;
  if (bad_float(o->weight_decay) || o->weight_decay < 0)
    return dt_error(DT_INVALID_ARGUMENT, "weight decay = %g must be >= 0", (double)o->weight_decay);
  if (o->kind == DT_OPTIM_SGD) {
    if (bad_float(o->momentum) || o->momentum < 0)
      return dt_error(DT_INVALID_ARGUMENT, "momentum = %g must be >= 0", (double)o->momentum);
    if (bad_float(o->dampening) || o->dampening < 0)
      return dt_error(DT_INVALID_ARGUMENT, "dampening = %g must be >= 0", (double)o->dampening);
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
      return dt_error(DT_INVALID_ARGUMENT, "nesterov momentum needs momentum > 0 and dampening 0");
  } else {
    if (bad_float(o->beta1) || o->beta1 < 0 || o->beta1 >= 1 || bad_float(o->beta2) || o->beta2 < 0 || o->beta2 >= 1)
      return dt_error(DT_INVALID_ARGUMENT, "betas = (%g, %g) must be in [0, 1)", (double)o->beta1, (double)o->beta2);
    if (bad_float(o->eps) || o->eps <= 0) return dt_error(DT_INVALID_ARGUMENT, "eps = %g must be > 0", (double)o->eps);
  }
  if (c->schedule != DT_SCHED_CONSTANT && c->schedule != DT_SCHED_STEP && c->schedule != DT_SCHED_COSINE &&
      c->schedule != DT_SCHED_LINEAR)
    return dt_error(DT_INVALID_ARGUMENT, "unknown schedule kind %d", (int)c->schedule);
  if (c->schedule == DT_SCHED_STEP && c->step_size_epochs < 1)
    return dt_error(DT_INVALID_ARGUMENT, "step size = %d epochs must be >= 1", c->step_size_epochs);
  if (bad_float(c->gamma) || c->gamma <= 0) return dt_error(DT_INVALID_ARGUMENT, "gamma = %g must be > 0", (double)c->gamma);
  if (bad_float(c->min_lr) || c->min_lr < 0) return dt_error(DT_INVALID_ARGUMENT, "min lr = %g must be >= 0", (double)c->min_lr);
  if (c->schedule == DT_SCHED_COSINE && c->min_lr > c->lr)
    return dt_error(DT_INVALID_ARGUMENT, "min lr = %g must not exceed the learning rate %g", (double)c->min_lr,
                    (double)c->lr);
  if (c->warmup_epochs < 0 || c->warmup_steps < 0)
    return dt_error(DT_INVALID_ARGUMENT, "warm-up length must be >= 0");
  if (c->warmup_epochs > 0 && c->warmup_steps > 0)
    return dt_error(DT_INVALID_ARGUMENT, "give warm-up in epochs or in steps, not both");
  if (c->warmup_epochs >= c->epochs && (c->schedule == DT_SCHED_COSINE || c->schedule == DT_SCHED_LINEAR))
    return dt_error(DT_INVALID_ARGUMENT, "warm-up of %d epochs leaves no room for the %s schedule over %d epochs",
                    c->warmup_epochs, dt_sched_kind_name(c->schedule), c->epochs);
  if ((unsigned)c->amp > DT_AMP_FP16) return dt_error(DT_INVALID_ARGUMENT, "unknown amp mode %d", (int)c->amp);
  if (bad_float(c->clip_grad_norm) || c->clip_grad_norm < 0)
    return dt_error(DT_INVALID_ARGUMENT, "clip grad norm = %g must be >= 0 (0: off)", (double)c->clip_grad_norm);
  if (bad_float(c->label_smoothing) || c->label_smoothing < 0 || c->label_smoothing >= 1)
    return dt_error(DT_INVALID_ARGUMENT, "label smoothing = %g must be in [0, 1)", (double)c->label_smoothing);
  if (c->val_fraction != 0 && !(c->val_fraction > 0 && c->val_fraction < 1))
    return dt_error(DT_INVALID_ARGUMENT, "validation fraction = %g must be in (0, 1) (0: off)", c->val_fraction);
  if (c->val_fraction > 0 && c->val_data)
    return dt_error(DT_INVALID_ARGUMENT, "give a validation fraction or validation data, not both");
  if (c->val_data && !*c->val_data) return dt_error(DT_INVALID_ARGUMENT, "validation data: empty source");
  if (c->regression_loss != DT_LOSS_MSE && c->regression_loss != DT_LOSS_L1)
    return dt_error(DT_INVALID_ARGUMENT, "unknown regression loss %d", (int)c->regression_loss);
  if (c->n_pos_weight < 0 || c->n_pos_weight > DT_TRAIN_MAX_POS_WEIGHT)
    return dt_error(DT_INVALID_ARGUMENT, "%d pos_weight values: at most %d", c->n_pos_weight, DT_TRAIN_MAX_POS_WEIGHT);
  for (int i = 0; i < c->n_pos_weight; i++)
    if (bad_float(c->pos_weight[i]) || c->pos_weight[i] < 0)
      return dt_error(DT_INVALID_ARGUMENT, "pos_weight %d = %g must be finite and >= 0", i + 1, (double)c->pos_weight[i]);
  if (c->normalize.enabled && (bad_float(c->normalize.mean) || bad_float(c->normalize.std) || c->normalize.std <= 0))
    return dt_error(DT_INVALID_ARGUMENT, "normalize std = %g must be > 0", (double)c->normalize.std);
  if (c->progress_mode < DT_PROGRESS_AUTO || c->progress_mode > DT_PROGRESS_NONE)
    return dt_error(DT_INVALID_ARGUMENT, "unknown progress mode %d", (int)c->progress_mode);
  if (c->save_every < 0 || c->save_every_steps < 0)
    return dt_error(DT_INVALID_ARGUMENT, "snapshot interval must be >= 0 (0: off)");
  if (c->keep < 1) return dt_error(DT_INVALID_ARGUMENT, "keep = %d snapshots must be >= 1", c->keep);
  if (!c->out_dir && (c->save_every || c->save_every_steps || c->save_on_interrupt))
    return dt_error(DT_INVALID_ARGUMENT, "snapshots need an output directory");
  if (!c->out_dir && c->resume && strcmp(c->resume, "auto") == 0)
    return dt_error(DT_INVALID_ARGUMENT, "resume auto looks in the output directory: give one");
  if (c->resume && !*c->resume) return dt_error(DT_INVALID_ARGUMENT, "resume: empty snapshot path");
  if (c->init_from && !*c->init_from) return dt_error(DT_INVALID_ARGUMENT, "init from: empty path");
  if (c->init_from && c->resume)
    return dt_error(DT_INVALID_ARGUMENT, "init from starts a new run from pretrained weights (fresh optimizer, step 0); "
                                         "resume continues a snapshot with its optimizer state: give one of them");
  if (c->no_decay && !*c->no_decay) return dt_error(DT_INVALID_ARGUMENT, "no decay: empty pattern list");
  if (c->no_decay && !(c->optim.weight_decay > 0))
    return dt_error(DT_INVALID_ARGUMENT, "no decay names parameters without weight decay, but the weight decay is 0: "
                                         "give one (e.g. 0.01)");
  if (c->overwrite && !c->out_dir) return dt_error(DT_INVALID_ARGUMENT, "overwrite: no output directory");
  if (c->overwrite && c->resume)
    return dt_error(DT_INVALID_ARGUMENT, "overwrite starts afresh, resume continues: give one of them");
  if (c->allow_data_change && !c->resume)
    return dt_error(DT_INVALID_ARGUMENT, "allow data change applies to resume only");
  if (c->tensorboard && !*c->tensorboard) return dt_error(DT_INVALID_ARGUMENT, "tensorboard: empty directory name");
  if (c->trace && !*c->trace) return dt_error(DT_INVALID_ARGUMENT, "trace: empty file name");
  if (c->log_every < 1) return dt_error(DT_INVALID_ARGUMENT, "log every %d steps must be >= 1", c->log_every);
  for (int k = 0; k < 4; k++)
    if (c->bert_dims[k] < 0 || c->bert_dims[k] > 1 << 16)
      return dt_error(DT_INVALID_ARGUMENT, "bert dimension %d = %d outside 0..65536 (0: the preset's)", k, c->bert_dims[k]);
  if (c->width < 0 || c->width > 4096)
    return dt_error(DT_INVALID_ARGUMENT, "width = %d outside 1..4096 (0: the model's own)", c->width);
  if (c->factors < 0) return dt_error(DT_INVALID_ARGUMENT, "factors = %d must be >= 1 (0: the model's default)", c->factors);
  if (bad_float(c->embedding_l2) || c->embedding_l2 < 0)
    return dt_error(DT_INVALID_ARGUMENT, "embedding l2 = %g must be finite and >= 0", (double)c->embedding_l2);
  if (c->sparse_embeddings) DT_CHECK(dt_optim_rows_check(&c->optim));
  if (c->augment != DT_AUGMENT_NONE && c->augment != DT_AUGMENT_CIFAR && c->augment != DT_AUGMENT_IMAGENET)
    return dt_error(DT_INVALID_ARGUMENT, "unknown augment preset %d", (int)c->augment);
  if (c->tta != DT_TTA_NONE && c->tta != DT_TTA_FLIP)
    return dt_error(DT_INVALID_ARGUMENT, "unknown test-time augmentation %d", (int)c->tta);
  if ((c->data_workers < 0 && c->data_workers != DT_LOADER_INLINE) || c->data_workers > DT_LOADER_MAX_WORKERS)
    return dt_error(DT_INVALID_ARGUMENT, "data workers = %d must be in 0..%d or DT_LOADER_INLINE", c->data_workers,
                    DT_LOADER_MAX_WORKERS);
  if (c->holdout != DT_HOLDOUT_DEFAULT && c->holdout != DT_HOLDOUT_LAST)
    return dt_error(DT_INVALID_ARGUMENT, "unknown holdout %d", (int)c->holdout);
  if (c->holdout == DT_HOLDOUT_LAST && c->limit_test > 0)
    return dt_error(DT_INVALID_ARGUMENT, "leave-last-out ranks every user's held-out rating: drop the test limit");
  if (c->holdout == DT_HOLDOUT_LAST && (c->val_fraction > 0 || c->val_data))
    return dt_error(DT_INVALID_ARGUMENT, "leave-last-out holds out each user's latest rating: drop the validation "
                                         "fraction or data");
  return DT_OK;
}

static const char *sched_name(dt_sched_kind k) {
  static const char *const names[] = {"constant", "step", "cosine", "linear"};
  return (unsigned)k < 4 ? names[k] : "unknown";
}

static const char *progress_name(dt_progress_mode m) {
  static const char *const names[] = {"auto", "bar", "plain", "none"};
  return (unsigned)m < 4 ? names[m] : "unknown";
}

dt_status dt_train_config_json(const dt_train_config *c, char *buf, size_t len) {
  size_t pos = 0;
  int ok = 1;
#define RAW(...)                                                        \
  do {                                                                  \
    if (ok) {                                                           \
      int n_ = snprintf(buf + pos, pos < len ? len - pos : 0, __VA_ARGS__); \
      if (n_ < 0 || pos + (size_t)n_ >= len) ok = 0; else pos += (size_t)n_; \
    }                                                                   \
  } while (0)
#define STR(key, v)                                            \
  do {                                                         \
    RAW(",\"%s\":", key);                                      \
    if (ok) ok = dt_json_escape(buf, len, &pos, v);            \
  } while (0)
  if (len == 0) return dt_error(DT_INVALID_ARGUMENT, "no room for the configuration JSON");
  RAW("{\"dtrain_version\":\"%s\"", DTRAIN_VERSION);
  STR("model", c->model);
  RAW(",\"hidden\":[");
  for (int i = 0; i < c->n_hidden; i++) RAW("%s%d", i ? "," : "", c->hidden[i]);
  RAW("]");
  if (c->dropout < 0)
    RAW(",\"dropout\":null");
  else
    RAW(",\"dropout\":%g", (double)c->dropout);
  if (c->factors) RAW(",\"factors\":%d", c->factors);
  if (c->embedding_l2 > 0) RAW(",\"embedding_l2\":%g", (double)c->embedding_l2);
  if (c->sparse_embeddings) RAW(",\"sparse_embeddings\":true");
  if (c->zero_init_residual) RAW(",\"zero_init_residual\":true");
  if (c->width) RAW(",\"width\":%d", c->width);
  if (c->bert_dims[0] || c->bert_dims[1] || c->bert_dims[2] || c->bert_dims[3])
    RAW(",\"bert_dims\":[%d,%d,%d,%d]", c->bert_dims[0], c->bert_dims[1], c->bert_dims[2], c->bert_dims[3]);
  if (c->init_from) STR("init_from", c->init_from);
  STR("data", c->data);
  if (c->holdout == DT_HOLDOUT_LAST) RAW(",\"split\":\"leave-last-out\"");
  if (c->normalize.enabled)
    RAW(",\"normalize\":{\"mean\":%g,\"std\":%g}", (double)c->normalize.mean, (double)c->normalize.std);
  else
    RAW(",\"normalize\":null");
  if (c->augment != DT_AUGMENT_NONE) STR("augment", dt_augment_name(c->augment));
  if (c->tta != DT_TTA_NONE) STR("tta", dt_tta_name(c->tta));
  if (c->data_workers) RAW(",\"data_workers\":%d", c->data_workers > 0 ? c->data_workers : 0); /* 0: inline */
  if (c->cache_images) RAW(",\"cache_images\":true");
  if (c->skip_bad_images) RAW(",\"skip_bad_images\":true");
  const dt_text_options *t = &c->text;
  if (t->vocab) STR("vocab", t->vocab);
  if (t->text_column) STR("text_column", t->text_column);
  if (t->text_pair_column) STR("text_pair_column", t->text_pair_column);
  if (t->label_columns) STR("label_columns", t->label_columns);
  if (t->label_column) STR("label_column", t->label_column);
  if (t->max_len) RAW(",\"max_len\":%d", t->max_len);
  if (t->keep_case) RAW(",\"lower_case\":false");
  if (t->skip_bad_rows) RAW(",\"skip_bad_rows\":true");
  if (c->val_data) STR("val_data", c->val_data);
  if (c->val_fraction > 0) RAW(",\"val_fraction\":%g", c->val_fraction);
  RAW(",\"limit_train\":%lld,\"limit_test\":%lld", (long long)c->limit_train, (long long)c->limit_test);
  if (c->limit_train > 0 || c->limit_test > 0) STR("limit_pick", dt_limit_pick_name(c->limit_pick));
  RAW(",\"epochs\":%d,\"batch_size\":%d,\"seed\":%llu,\"threads\":%d", c->epochs, c->batch_size,
      (unsigned long long)c->seed, c->threads);
  STR("optimizer", dt_optim_kind_name(c->optim.kind));
  RAW(",\"lr\":%g,\"weight_decay\":%g", (double)c->lr, (double)c->optim.weight_decay);
  if (c->no_decay) STR("no_decay", c->no_decay);
  if (c->optim.kind == DT_OPTIM_SGD)
    RAW(",\"momentum\":%g,\"dampening\":%g,\"nesterov\":%s", (double)c->optim.momentum, (double)c->optim.dampening,
        c->optim.nesterov ? "true" : "false");
  else
    RAW(",\"betas\":[%g,%g],\"eps\":%g", (double)c->optim.beta1, (double)c->optim.beta2, (double)c->optim.eps);
  STR("schedule", sched_name(c->schedule));
  RAW(",\"step_size_epochs\":%d,\"gamma\":%g,\"min_lr\":%g", c->step_size_epochs, (double)c->gamma,
      (double)c->min_lr);
  RAW(",\"warmup_epochs\":%d,\"warmup_steps\":%lld", c->warmup_epochs, (long long)c->warmup_steps);
  RAW(",\"clip_grad_norm\":%g,\"label_smoothing\":%g", (double)c->clip_grad_norm, (double)c->label_smoothing);
  if (c->amp != DT_AMP_OFF) STR("amp", c->amp == DT_AMP_BF16 ? "bf16" : "fp16");
  if (c->regression_loss == DT_LOSS_L1) RAW(",\"loss\":\"l1\"");
  if (c->n_pos_weight) {
    RAW(",\"pos_weight\":[");
    for (int i = 0; i < c->n_pos_weight; i++) RAW("%s%g", i ? "," : "", (double)c->pos_weight[i]);
    RAW("]");
  }
  STR("strategy", dt_strategy_name(c->strategy));
  RAW(",\"accumulate\":%d", c->accumulate);
  if (c->strategy == DT_STRATEGY_DP) RAW(",\"workers\":%d", c->workers);
  if (c->strategy == DT_STRATEGY_DDP) {
    static const char *const hooks[] = {"none", "bf16", "fp16"};
    STR("backend", c->backend ? c->backend : "auto");
    RAW(",\"bucket_cap_mb\":%g,\"first_bucket_mb\":%g,\"buckets\":\"%s\"", c->ddp.bucket_cap_mb,
        c->ddp.first_bucket_mb, c->ddp.auto_buckets ? "measured" : "fixed");
    if (c->ddp.grad_piece_mb < 0)
      STR("grad_piece_mb", "auto");
    else
      RAW(",\"grad_piece_mb\":%g", c->ddp.grad_piece_mb);
    RAW(",\"broadcast_buffers\":%s,\"shared_grads\":%s,\"find_unused_parameters\":%s",
        c->ddp.broadcast_buffers ? "true" : "false", c->ddp.shared_grads ? "true" : "false",
        c->ddp.find_unused_parameters ? "true" : "false");
    STR("sharded_update", c->sharded_update < 0 ? "auto" : c->sharded_update ? "on" : "off");
    STR("comm_hook", hooks[c->ddp.comm_hook]);
    if (c->ddp.rows_exchange != DT_ROWS_AUTO) STR("embedding_exchange", c->ddp.rows_exchange == DT_ROWS_SPARSE ? "sparse" : "dense");
  }
  if (c->out_dir) STR("out", c->out_dir);
  STR("progress", progress_name(c->progress_mode));
  RAW(",\"save_every\":%d,\"save_every_steps\":%lld,\"keep\":%d,\"save_on_interrupt\":%s", c->save_every,
      (long long)c->save_every_steps, c->keep, c->save_on_interrupt ? "true" : "false");
  if (c->resume) STR("resume", c->resume);
  if (c->tensorboard) STR("tensorboard", c->tensorboard);
  if (c->trace) STR("trace", c->trace);
  RAW(",\"log_every\":%d", c->log_every);
  RAW("}");
#undef STR
#undef RAW
  if (!ok) return dt_error(DT_INVALID_ARGUMENT, "configuration JSON longer than %zu bytes", len);
  return DT_OK;
}
