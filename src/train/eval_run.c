/* dt_eval_run: saved weights evaluated on a data source, with what the file's metadata records as defaults. */
#include <inttypes.h>
#include <errno.h>
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
  dt_augment augment;        /* image transforms of the split (the test split: Normalize, and imagenet's center crop) */
  dt_tta tta;                /* the caller's, else the file's "tta" (else none) */
  char task[24];             /* the task the weights were trained on ("" if not recorded) */
  int outputs, l1, n_pos_weight;
  float pos_weight[DT_TRAIN_MAX_POS_WEIGHT];
  int factors;               /* mf, ncf: embedding width (0: the model's default) */
  int width;                 /* resnet9, CIFAR resnets: the first stage's channels (0: the model's own) */
  int bert_dims[4];          /* bert: layers, hidden size, heads, feed-forward size (0: the preset's) */
  float dropout;             /* < 0: the model's default (the layers, not the rate, change the tensors' names) */
  dt_holdout holdout;        /* "split": leave-last-out, else the source's default */
  double val_fraction;       /* "val_fraction": the random split's held-out part (0: not recorded) */
  uint64_t seed;             /* "seed": the random split's permutation, leave-last-out's sampled negatives */
  int has_seed;              /* the file records it (a split is rebuilt only then) */
  dt_text_options text;      /* text data: the caller's, else training's as the file's metadata records them */
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

dt_status dt_weights_arch_read(const char *path, const dt_safetensors *f, dt_weights_arch *out) {
  dt_weights_arch a = {.dropout = -1.0f};
  const char *h = dt_safetensors_meta(f, "hidden"), *k = dt_safetensors_meta(f, "factors");
  const char *d = dt_safetensors_meta(f, "dropout");
  char *end;
  if (h && *h && parse_widths(h, a.hidden, &a.n_hidden) != 0)
    return dt_error(DT_CORRUPT, "%s: metadata hidden=\"%.60s\" is not a list of widths", path, h);
  if (k && *k && ((a.factors = (int)strtol(k, &end, 10)) < 1 || *end))
    return dt_error(DT_CORRUPT, "%s: metadata factors=\"%.40s\" is not a positive width", path, k);
  const char *w = dt_safetensors_meta(f, "width");
  long wl = 0;
  if (w && *w && ((wl = strtol(w, &end, 10)) < 1 || wl > 4096 || *end))
    return dt_error(DT_CORRUPT, "%s: metadata width=\"%.40s\" is not a width in 1..4096", path, w);
  a.width = (int)wl;
  const char *bd = dt_safetensors_meta(f, "bert_dims");
  int used = 0;
  if (bd && *bd &&
      (sscanf(bd, "%d,%d,%d,%d%n", &a.bert_dims[0], &a.bert_dims[1], &a.bert_dims[2], &a.bert_dims[3], &used) != 4 ||
       bd[used] || a.bert_dims[0] < 0 || a.bert_dims[1] < 0 || a.bert_dims[2] < 0 || a.bert_dims[3] < 0))
    return dt_error(DT_CORRUPT, "%s: metadata bert_dims=\"%.40s\" is not 4 sizes L,H,A,I", path, bd);
  if (d && *d) {
    a.dropout = strtof(d, &end);
    if (*end || !(a.dropout >= 0 && a.dropout < 1))
      return dt_error(DT_CORRUPT, "%s: metadata dropout=\"%.40s\" is not a rate in [0, 1)", path, d);
  }
  *out = a;
  return DT_OK;
}

/* The model's name, and its widths, factors and dropout when the file holds the model being built. */
static dt_status plan_model(const dt_eval_config *cfg, const dt_safetensors *f, eval_plan *p) {
  const char *file_model = dt_safetensors_meta(f, "model"), *name = cfg->model;
  if (!name || !*name) name = file_model;
  if (!name) return dt_error(DT_NOT_FOUND, "%s has no \"model\" metadata: name the model it holds", cfg->weights);
  if (strlen(name) >= sizeof p->model) return dt_error(DT_INVALID_ARGUMENT, "model name '%.40s...' too long", name);
  strcpy(p->model, name);
  p->n_hidden = cfg->n_hidden;
  memcpy(p->hidden, cfg->hidden, sizeof p->hidden);
  p->width = cfg->width;
  p->dropout = -1.0f;
  if (!file_model || strcmp(file_model, name) != 0) return DT_OK;
  dt_weights_arch a;
  DT_CHECK(dt_weights_arch_read(cfg->weights, f, &a));
  if (p->n_hidden == 0) {
    p->n_hidden = a.n_hidden;
    memcpy(p->hidden, a.hidden, sizeof p->hidden);
  }
  p->factors = a.factors;
  if (!p->width) p->width = a.width;
  memcpy(p->bert_dims, a.bert_dims, sizeof p->bert_dims);
  p->dropout = a.dropout;
  return DT_OK;
}

/* The image preset: the caller's, else the file's "augment" (else none). Weights trained with
 * --augment cifar were trained on inputs normalised by CIFAR-10's mean and std: without them the
 * test images would be scored as other inputs. */
static dt_status plan_augment(const dt_eval_config *cfg, const dt_safetensors *f, eval_plan *p) {
  p->augment = cfg->augment_set ? cfg->augment : DT_AUGMENT_NONE;
  const char *a = dt_safetensors_meta(f, "augment");
  if (cfg->augment_set || !a || !*a) return DT_OK;
  static const dt_augment known[] = {DT_AUGMENT_NONE, DT_AUGMENT_CIFAR, DT_AUGMENT_IMAGENET};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strcmp(a, dt_augment_name(known[i])) == 0) {
      p->augment = known[i];
      return DT_OK;
    }
  return dt_error(DT_CORRUPT, "%s: metadata augment=\"%.40s\" is not none, cifar or imagenet (give --augment)",
                  cfg->weights, a);
}

/* Test-time augmentation: the caller's, else the training run's (the file's "tta"), so that eval scores as the
 * run's evaluations did. */
static dt_status plan_tta(const dt_eval_config *cfg, const dt_safetensors *f, eval_plan *p) {
  p->tta = cfg->tta_set ? cfg->tta : DT_TTA_NONE;
  const char *t = dt_safetensors_meta(f, "tta");
  if (cfg->tta_set || !t || !*t) return DT_OK;
  if (strcmp(t, dt_tta_name(DT_TTA_FLIP)) == 0) {
    p->tta = DT_TTA_FLIP;
    return DT_OK;
  }
  return dt_error(DT_CORRUPT, "%s: metadata tta=\"%.40s\" is not flip (give --tta)", cfg->weights, t);
}

/* Normalisation and data source: the caller's, else the file's (else none and fashion-mnist). */
static dt_status plan_data(const dt_eval_config *cfg, const dt_safetensors *f, eval_plan *p) {
  DT_CHECK(plan_augment(cfg, f, p));
  DT_CHECK(plan_tta(cfg, f, p));
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

/* How training held data out: leave-last-out, or a random fraction by seed (rebuilt by open_data). */
static dt_status plan_split(const char *path, const dt_safetensors *f, eval_plan *p) {
  const char *sp = dt_safetensors_meta(f, "split"), *vf = dt_safetensors_meta(f, "val_fraction");
  const char *seed = dt_safetensors_meta(f, "seed");
  char *end;
  if (sp && *sp && strcmp(sp, "leave-last-out") != 0)
    return dt_error(DT_CORRUPT, "%s: metadata split=\"%.40s\" is not leave-last-out", path, sp);
  p->holdout = sp && *sp ? DT_HOLDOUT_LAST : DT_HOLDOUT_DEFAULT;
  if (vf && *vf && (!((p->val_fraction = strtod(vf, &end)) > 0) || p->val_fraction >= 1 || *end))
    return dt_error(DT_CORRUPT, "%s: metadata val_fraction=\"%.40s\" is not a fraction in (0, 1)", path, vf);
  p->has_seed = seed && *seed;
  if (p->has_seed) {
    errno = 0;
    p->seed = strtoull(seed, &end, 10);
    if (*end || *seed == '-' || errno == ERANGE)
      return dt_error(DT_CORRUPT, "%s: metadata seed=\"%.40s\" is not a seed", path, seed);
  }
  return DT_OK;
}

/* The metadata value of key where the caller gave none (an empty value is none). */
static const char *meta_or(const char *given, const dt_safetensors *f, const char *key) {
  const char *m = given ? NULL : dt_safetensors_meta(f, key);
  return given ? given : m && *m ? m : NULL;
}

/* Text data: the rows read as in training (its vocabulary, columns, class numbering, max_len and case), each
 * from the file's metadata unless the caller gives it. */
static dt_status plan_text(const dt_eval_config *cfg, const dt_safetensors *f, eval_plan *p) {
  const dt_text_options *c = &cfg->text;
  dt_text_options *t = &p->text;
  *t = *c;
  t->vocab = meta_or(c->vocab, f, "vocab");
  t->text_column = meta_or(c->text_column, f, "text_column");
  t->text_pair_column = meta_or(c->text_pair_column, f, "text_pair_column");
  if (!c->label_columns && !c->label_column) {
    t->label_columns = meta_or(NULL, f, "label_columns");
    t->label_column = meta_or(NULL, f, "label_column");
  }
  if (t->label_column) t->classes = meta_or(c->classes, f, "classes");
  const char *ml = c->max_len ? NULL : meta_or(NULL, f, "max_len"), *lc = meta_or(NULL, f, "lower_case");
  char *end = NULL;
  if (ml && ((t->max_len = (int)strtol(ml, &end, 10)) < 1 || *end))
    return dt_error(DT_CORRUPT, "%s: metadata max_len=\"%.40s\" is not a positive count", cfg->weights, ml);
  if (!c->keep_case && lc) t->keep_case = strcmp(lc, "0") == 0;
  return DT_OK;
}

static dt_status read_plan(const dt_eval_config *cfg, const dt_safetensors *f, eval_plan *p) {
  DT_CHECK(plan_model(cfg, f, p));
  DT_CHECK(plan_data(cfg, f, p));
  DT_CHECK(plan_text(cfg, f, p));
  DT_CHECK(plan_task(cfg->weights, f, p));
  return plan_split(cfg->weights, f, p);
}

#define EVAL_RANK_BLOCK 256 /* ranking queries scored per block */

/* What an evaluation holds, released by eval_free. */
typedef struct eval_state {
  dt_safetensors *file;       /* the weights' file: its metadata */
  dt_dataset *source;         /* the split as opened */
  dt_dataset *part_train, *part_val; /* the random split of training, rebuilt (NULL: none) */
  dt_dataset *ds;             /* what is evaluated: source or one of its parts (borrowed) */
  dt_ranking ranking;         /* leave-last-out's test split: HR@K and NDCG@K (n 0: none) */
  int32_t *rank_pairs;        /* (batch, 2) candidate (user, item) pairs of one forward */
  float *rank_scores;         /* (EVAL_RANK_BLOCK, per) scores of a block of queries */
  dt_task *task;
  dt_model *m;
  dt_loader *loader;
  dt_dp *dp;
  float *buf; /* dp: outputs of a whole batch */
  dt_metric_acc *acc;
  dt_prefix_sampler prefix;
  dt_tta_forward tta;         /* forward, averaged over mirrors under --tta flip */
} eval_state;

static void eval_free(eval_state *s) {
  dt_free(s->rank_scores);
  dt_free(s->rank_pairs);
  dt_metric_acc_free(s->acc);
  dt_tta_close(&s->tta);
  dt_free(s->buf);
  dt_dp_free(s->dp);
  dt_loader_free(s->loader);
  dt_model_free(s->m);
  dt_task_free(s->task);
  dt_dataset_free(s->part_val);
  dt_dataset_free(s->part_train);
  dt_dataset_free(s->source);
  dt_safetensors_free(s->file);
}

/* The model's forward, or dp's into the whole-batch buffer. */
static dt_status forward(void *user, const void *x, int n, const float **out) {
  eval_state *s = user;
  if (!s->dp) return dt_model_forward(s->m, x, n, out);
  DT_CHECK(dt_dp_forward(s->dp, x, n, s->buf));
  *out = s->buf;
  return DT_OK;
}

/* The split asked for, as training made it: where the source has no test split of its own (MovieLens,
 * synthetic), training held out a random fraction of its training split by seed (the recorded
 * "val_fraction", else the source's default): --split test is that part and --split train the rest.
 * Leave-last-out ("split") is the source's own test split, its negatives drawn by the same seed. */
static dt_status open_data(const dt_eval_config *cfg, const eval_plan *p, eval_state *s) {
  const dt_data_options opt = {.norm = &p->norm, .holdout = p->holdout, .seed = p->seed, .augment = p->augment,
                               .text = p->text};
  dt_status st = dt_dataset_load_opts(p->data, cfg->split, &opt, &s->source);
  char no_test[512] = "";
  if (st == DT_NOT_FOUND && cfg->split == DT_SPLIT_TEST && p->holdout == DT_HOLDOUT_DEFAULT) {
    snprintf(no_test, sizeof no_test, "%s", dt_last_error()); /* the error unless a random split stands in */
    st = dt_dataset_load_opts(p->data, DT_SPLIT_TRAIN, &opt, &s->source);
  }
  DT_CHECK(st);
  s->ds = s->source;
  const dt_data_info *info = dt_dataset_info(s->source);
  const double fraction = p->val_fraction > 0 ? p->val_fraction : info->val_fraction;
  const int opened_train = cfg->split == DT_SPLIT_TRAIN || no_test[0];
  if (!opened_train || info->has_test || p->holdout != DT_HOLDOUT_DEFAULT || !(fraction > 0))
    return no_test[0] ? dt_error(DT_NOT_FOUND, "%s", no_test) : DT_OK;
  if (!p->has_seed)
    return dt_error(DT_CORRUPT, "%s has no \"seed\" metadata, so training's held-out part of %s cannot be rebuilt",
                    cfg->weights, p->data);
  DT_CHECK(dt_dataset_split(s->source, fraction, p->seed, &s->part_train, &s->part_val));
  s->ds = cfg->split == DT_SPLIT_TEST ? s->part_val : s->part_train;
  DT_LOG_INFO("eval", "%s: training's random split (%g held out by seed %" PRIu64 "): the %s part, %lld samples",
              p->data, fraction, p->seed, cfg->split == DT_SPLIT_TEST ? "held-out" : "training",
              (long long)dt_dataset_size(s->ds));
  return DT_OK;
}

/* Entries in a comma list ("" has none). */
static int64_t list_count(const char *s) {
  int64_t n = *s ? 1 : 0;
  for (; *s; s++) n += *s == ',';
  return n;
}

/* What the source keeps with weights (MovieLens: "user_ids", "item_ids") must be what the weights were
 * trained with: the same original ids in the same order are the same rows of the embedding tables. */
static dt_status check_ids(const dt_eval_config *cfg, const eval_plan *p, const eval_state *s) {
  const dt_kv *kv = NULL;
  const int n = dt_dataset_meta(s->ds, &kv);
  for (int i = 0; i < n; i++) {
    const size_t klen = strlen(kv[i].key);
    if (klen < 4 || strcmp(kv[i].key + klen - 4, "_ids") != 0) continue; /* text: its keys were options (plan_text) */
    const char *mine = dt_safetensors_meta(s->file, kv[i].key);
    if (!mine) {
      DT_LOG_WARN("eval", "%s has no \"%s\" metadata: its rows are taken to be those of %s", cfg->weights,
                  kv[i].key, p->data);
      continue;
    }
    /* "user_ids" -> "user" */
    const char *u = strrchr(kv[i].key, '_');
    const int stem = u ? (int)(u - kv[i].key) : (int)strlen(kv[i].key);
    const int64_t have = list_count(kv[i].value), want = list_count(mine);
    if (have != want)
      return dt_error(DT_USAGE, "%s has %lld %.*ss; %s was trained on %lld: the weights were trained on other ratings",
                      p->data, (long long)have, stem, kv[i].key, cfg->weights, (long long)want);
    if (strcmp(mine, kv[i].value) != 0)
      return dt_error(DT_USAGE, "%s's %.*s ids differ from those %s was trained on (its \"%s\" metadata): the weights "
                      "were trained on other ratings", p->data, stem, kv[i].key, cfg->weights, kv[i].key);
  }
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
  /* leave-last-out's test split ranks each held-out rating among sampled ones, as training reported */
  if (dt_dataset_ranking(s->ds, &s->ranking) != DT_OK) {
    dt_clear_error();
    memset(&s->ranking, 0, sizeof s->ranking);
  }
  dt_task_config tc = {.kind = info->task, .outputs = info->outputs,
                       .regression_loss = p->l1 ? DT_LOSS_L1 : DT_LOSS_MSE,
                       .pos_weight = p->n_pos_weight ? p->pos_weight : NULL,
                       .ranking_k = s->ranking.n > 0 ? DT_RANK_K : 0};
  if (p->outputs > tc.outputs) tc.outputs = p->outputs; /* a split may not reach the last class */
  DT_CHECK(dt_task_new(&tc, &s->task));
  return dt_metric_acc_new(s->task, 1, &s->acc);
}

static dt_status open_model(const dt_eval_config *cfg, const eval_plan *p, eval_state *s) {
  const dt_data_info *info = dt_dataset_info(s->ds);
  if (info->input < 0 || (info->field[info->input].dtype != DT_F32 && !info->n_index))
    return dt_error(DT_USAGE, "model %s reads an input field \"x\"; %s has none", p->model, p->data);
  const dt_field *x = &info->field[info->input];
  const dt_task_config *tc = dt_task_config_of(s->task);
  dt_zoo_config zc = {.ndim = x->ndim, .outputs = tc->outputs, .task = tc->kind, .dropout = p->dropout,
                      .hidden = p->n_hidden ? p->hidden : NULL, .n_hidden = p->n_hidden, .n_index = info->n_index,
                      .index_size = info->index_size, .factors = p->factors, .width = p->width,
                      .layers = p->bert_dims[0], .hidden_size = p->bert_dims[1], .heads = p->bert_dims[2],
                      .intermediate_size = p->bert_dims[3]};
  for (int d = 0; d < x->ndim; d++) zc.input_shape[d] = x->shape[d];
  DT_CHECK(dt_model_zoo_new(p->model, &zc, &s->m));
  DT_CHECK(dt_model_build(s->m, cfg->batch_size, 0));
  DT_CHECK(dt_model_load(s->m, cfg->weights));
  if (s->ranking.n) {
    DT_CHECK(dt_alloc_array((size_t)cfg->batch_size * 2, sizeof(int32_t), "ranking pairs", (void **)&s->rank_pairs));
    DT_CHECK(dt_alloc_array((size_t)EVAL_RANK_BLOCK * (size_t)s->ranking.per, sizeof(float), "ranking scores",
                            (void **)&s->rank_scores));
  }
  if (cfg->workers <= 0) return DT_OK;
  DT_CHECK(dt_dp_new(s->m, cfg->workers, cfg->batch_size, &s->dp));
  return dt_alloc_array((size_t)cfg->batch_size * (size_t)tc->outputs, sizeof(float), "eval outputs", (void **)&s->buf);
}

/* HR@K and NDCG@K of the ranking protocol, blocks of queries at a time, into s->acc. */
static dt_status eval_ranking(const dt_eval_config *cfg, eval_state *s, double *seconds) {
  const double t0 = dt_time_now();
  int64_t q[EVAL_RANK_BLOCK];
  dt_status st = DT_OK;
  dt_model_set_training(s->m, 0);
  for (int64_t lo = 0; lo < s->ranking.n && st == DT_OK; lo += EVAL_RANK_BLOCK) {
    const int nq = s->ranking.n - lo < EVAL_RANK_BLOCK ? (int)(s->ranking.n - lo) : EVAL_RANK_BLOCK;
    for (int i = 0; i < nq; i++) q[i] = lo + i;
    st = dt_rank_score(&s->ranking, q, nq, cfg->batch_size, forward, s, s->rank_pairs, s->rank_scores);
    if (st == DT_OK) st = dt_metric_acc_add_ranking(s->acc, s->rank_scores, nq, s->ranking.per);
  }
  dt_model_set_training(s->m, 1);
  *seconds += dt_time_now() - t0;
  return st;
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
  if (cfg->width < 0 || cfg->width > 4096)
    return dt_error(DT_INVALID_ARGUMENT, "width = %d outside 1..4096 (0: the file's)", cfg->width);
  if (cfg->tta_set && cfg->tta != DT_TTA_NONE && cfg->tta != DT_TTA_FLIP)
    return dt_error(DT_INVALID_ARGUMENT, "unknown test-time augmentation %d", (int)cfg->tta);
  if (cfg->n_hidden < 0 || cfg->n_hidden > DT_TRAIN_MAX_HIDDEN)
    return dt_error(DT_INVALID_ARGUMENT, "%d hidden layers: at most %d", cfg->n_hidden, DT_TRAIN_MAX_HIDDEN);
  return DT_OK;
}

dt_status dt_eval_run(const dt_eval_config *cfg, dt_eval_result *res) {
  DT_CHECK(check_config(cfg));
  DT_CHECK(dt_set_threads(cfg->threads));
  eval_plan p;
  memset(&p, 0, sizeof p);
  eval_state s;
  memset(&s, 0, sizeof s);
  double seconds = 0;
  dt_status st = dt_safetensors_load(cfg->weights, &s.file);
  if (st == DT_OK) st = read_plan(cfg, s.file, &p);
  if (st == DT_OK) st = open_data(cfg, &p, &s);
  if (st == DT_OK) st = check_ids(cfg, &p, &s);
  if (st == DT_OK) st = open_task(cfg, &p, &s);
  if (st == DT_OK) st = open_model(cfg, &p, &s);
  if (st == DT_OK) st = dt_tta_open(&s.tta, p.tta, s.m, forward, &s);
  if (st == DT_OK) st = open_loader(cfg, &s);
  if (st == DT_OK) st = dt_train_evaluate(s.m, dt_tta_fn, &s.tta, s.loader, s.task, -1, s.acc, &seconds);
  if (st == DT_OK && s.ranking.n) st = eval_ranking(cfg, &s, &seconds);
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
    r.tta = p.tta;
    *res = r;
  }
  eval_free(&s);
  return st;
}
