/* Pieces of a run the trainer, strategies and hooks share: loaders over a prefix, the history, paths, metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "data/image.h"
#include "dtrain/dtrain.h"
#include "train/run.h"

/* Loader threads (dt_loader_config.workers): --data-workers where given. Else, for a strategy whose workers fetch
 * their own slices (dp), none where the fetch is cheap (no image decoding) and the training threads fill the cores
 * this process may run on: each worker then fetches its slice in parallel, where a loader thread could only take
 * turns with them, and a turn taken mid-step delays the step's slowest worker (measured: half of DataParallel's
 * steps on 2 cores started a worker late while the loader ran; +15% without it). Elsewhere the loader's own
 * default: single and ddp keep a loader thread. BERT-mini's DDP x2 ran 278-286 samples/s with it, 179-221 with each
 * rank fetching its own batches, though the default mlp ran 4% (DDP x2) and 6% (single, 2 threads) faster without. */
int dt_run_loader_workers(const dt_run *r, const dt_dataset *ds) {
  if (r->cfg->data_workers) return r->cfg->data_workers;
  if (!r->strategy->fills_batches || dt_dataset_info(ds)->decodes) return 0;
  long threads = dt_get_threads();
  if (r->cfg->workers > threads) threads = r->cfg->workers; /* dp: at least a thread a worker */
  return threads >= dt_usable_cores() ? DT_LOADER_INLINE : 0;
}

dt_status dt_run_prefix_loader(dt_run *r, const dt_dataset *ds, int shuffle, uint64_t seed, int64_t limit,
                               dt_prefix_sampler *prefix, dt_loader **out) {
  dt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = r->cfg->batch_size;
  lc.shuffle = shuffle;
  lc.seed = seed;
  lc.workers = dt_run_loader_workers(r, ds);
  const int64_t size = dt_dataset_size(ds);
  if (limit > 0 && limit < size) {
    prefix->n = limit;
    prefix->shuffle = shuffle;
    prefix->seed = seed;
    lc.sampler = dt_prefix_sampler_fn;
    lc.sampler_user = prefix;
    lc.sampler_capacity = limit;
  }
  return dt_loader_new(ds, &lc, out);
}

dt_status dt_run_history_add(dt_run *r, const dt_epoch_metrics *m) {
  DT_CHECK(dt_grow_array((void **)&r->history, &r->history_cap, r->n_history, r->n_history + 1, 16, sizeof *m,
                         "metrics history"));
  r->history[r->n_history++] = *m;
  return DT_OK;
}

dt_status dt_run_path(const dt_run *r, const char *name, char *buf, size_t len) {
  if ((size_t)snprintf(buf, len, "%s/%s", r->cfg->out_dir, name) >= len)
    return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
  return DT_OK;
}

static void join_widths(const int *w, int n, char *buf, size_t len) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && pos < len; i++) {
    int k = snprintf(buf + pos, len - pos, "%s%d", i ? "," : "", w[i]);
    if (k < 0) break;
    pos += (size_t)k;
  }
}

static void join_floats(const float *v, int n, char *buf, size_t len) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && pos < len; i++) {
    int k = snprintf(buf + pos, len - pos, "%s%.9g", i ? "," : "", (double)v[i]);
    if (k < 0) break;
    pos += (size_t)k;
  }
}

/* The shortest decimal that reads back as v ("0.1", not "0.10000000000000001"). */
static void format_exact(double v, char *buf, size_t len) {
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(buf, len, "%.*g", digits, v);
    if (strtod(buf, NULL) == v) return;
  }
}

/* Three floats as "a,b,c", each the shortest decimal that reads back as the float ("0.4914"). */
static void format_floats3(const float *v, char *buf, size_t len) {
  size_t o = 0;
  for (int i = 0; i < 3 && o < len; i++) {
    int digits = 1;
    char one[32];
    do snprintf(one, sizeof one, "%.*g", digits, (double)v[i]);
    while ((float)strtod(one, NULL) != v[i] && ++digits <= 9);
    o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? "," : "", one);
  }
}

void dt_run_meta_fill(dt_run_meta *rm, const dt_run *r, const dt_epoch_metrics *last, int epochs_done) {
  const dt_train_config *c = r->cfg;
  const dt_task_config *tc = dt_task_config_of(r->task);
  join_widths(c->hidden, c->n_hidden, rm->hidden, sizeof rm->hidden);
  join_floats(tc->pos_weight, tc->pos_weight ? tc->outputs : 0, rm->pos_weight, sizeof rm->pos_weight);
  snprintf(rm->epochs, sizeof rm->epochs, "%d", epochs_done);
  snprintf(rm->seed, sizeof rm->seed, "%llu", (unsigned long long)c->seed);
  snprintf(rm->outputs, sizeof rm->outputs, "%d", tc->outputs);
  snprintf(rm->m0, sizeof rm->m0, "%.6f", last ? last->test_metric[0] : 0.0);
  snprintf(rm->m1, sizeof rm->m1, "%.6f", last ? last->test_metric[1] : 0.0);
  rm->norm[0] = '\0';
  if (c->normalize.enabled)
    snprintf(rm->norm, sizeof rm->norm, "%.9g,%.9g", (double)c->normalize.mean, (double)c->normalize.std);
  rm->dropout[0] = '\0';
  if (c->dropout >= 0) snprintf(rm->dropout, sizeof rm->dropout, "%g", (double)c->dropout);
  const dt_metric_set *ms = r->metrics;
  char *k0 = rm->key0, *k1 = rm->key1;
  snprintf(k0, sizeof rm->key0, "test_%s", ms->eval[0].name);
  snprintf(k1, sizeof rm->key1, "test_%s", ms->n_eval > 1 ? ms->eval[1].name : "unused");
  const dt_kv kv[] = {
      {"format", "pt"},         {"dtrain_version", DTRAIN_VERSION}, {"model", c->model},      {"hidden", rm->hidden},
      {"dropout", rm->dropout}, {"data", c->data},                  {"normalize", rm->norm},  {"epochs", rm->epochs},
      {"seed", rm->seed},       {"task", dt_task_kind_name(tc->kind)}, {"outputs", rm->outputs},
      {"loss", tc->kind == DT_TASK_REGRESSION && tc->regression_loss == DT_LOSS_L1 ? "l1" : ""},
      {"pos_weight", rm->pos_weight}, {k0, rm->m0},
  };
  rm->n = (int)(sizeof kv / sizeof kv[0]);
  memcpy(rm->kv, kv, sizeof kv);
  if (ms->n_eval > 1) rm->kv[rm->n++] = (dt_kv){k1, rm->m1};
  if (c->factors) {
    snprintf(rm->factors, sizeof rm->factors, "%d", c->factors);
    rm->kv[rm->n++] = (dt_kv){"factors", rm->factors};
  }
  if (c->tta != DT_TTA_NONE) rm->kv[rm->n++] = (dt_kv){"tta", dt_tta_name(c->tta)};
  if (c->width) {
    snprintf(rm->width, sizeof rm->width, "%d", c->width);
    rm->kv[rm->n++] = (dt_kv){"width", rm->width};
  }
  if (c->bert_dims[0] || c->bert_dims[1] || c->bert_dims[2] || c->bert_dims[3]) {
    snprintf(rm->bert_dims, sizeof rm->bert_dims, "%d,%d,%d,%d", c->bert_dims[0], c->bert_dims[1], c->bert_dims[2],
             c->bert_dims[3]);
    rm->kv[rm->n++] = (dt_kv){"bert_dims", rm->bert_dims};
  }
  if (c->holdout == DT_HOLDOUT_LAST) rm->kv[rm->n++] = (dt_kv){"split", "leave-last-out"};
  /* the image transforms' preset, which eval applies to the test split, and the per-channel
   * Normalize it implied (the preset's, or --normalize's), for whoever loads the weights elsewhere */
  if (c->augment != DT_AUGMENT_NONE) {
    dt_transform t;
    dt_transform_preset(c->augment, DT_SPLIT_TEST, &c->normalize, &t);
    format_floats3(t.mean, rm->image_mean, sizeof rm->image_mean);
    format_floats3(t.std, rm->image_std, sizeof rm->image_std);
    rm->kv[rm->n++] = (dt_kv){"augment", dt_augment_name(c->augment)};
    rm->kv[rm->n++] = (dt_kv){"image_mean", rm->image_mean};
    rm->kv[rm->n++] = (dt_kv){"image_std", rm->image_std};
  }
  /* the held-out part of a random split, so that eval can rebuild it (with "seed") */
  if (r->val_fraction > 0) {
    format_exact(r->val_fraction, rm->val_fraction, sizeof rm->val_fraction);
    rm->kv[rm->n++] = (dt_kv){"val_fraction", rm->val_fraction};
  }
  /* what the source keeps with the weights (MovieLens: the original user and movie ids) */
  const dt_kv *data_kv = NULL;
  const int n_data = dt_dataset_meta(r->train, &data_kv);
  for (int i = 0; i < n_data && rm->n < DT_RUN_META_MAX - 4; i++) rm->kv[rm->n++] = data_kv[i];
}
