/* Strategy "ddp": one process per worker under a launcher; buckets of gradients all-reduced during backward. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "train/run.h"
#include "train/strategy.h"

/* Joins the group of the launcher (dtrun, torchrun, mpirun, srun). */
static dt_status ddp_join(dt_run *r) {
  const dt_train_config *c = r->cfg;
  dt_group_options o;
  dt_group_options_default(&o);
  o.backend = c->backend ? c->backend : "auto";
  o.timeout_s = c->timeout_s;
  char url[300];
  if (c->master) {
    snprintf(url, sizeof url, "tcp://%s", c->master);
    o.init_method = url;
  }
  DT_CHECK(dt_group_init(&o, &r->group));
  r->rank = dt_group_rank(r->group);
  r->world = dt_group_size(r->group);
  return DT_OK;
}

/* A loader over this rank's shard of the first n samples (DistributedSampler:
 * PyTorch's index lists, padded so every rank gets the same count). */
static dt_status shard_loader(dt_run *r, const dt_dataset *ds, int shuffle, uint64_t seed, int64_t n,
                              dt_dist_sampler **shard, dt_loader **out) {
  DT_CHECK(dt_dist_sampler_new(n, r->world, r->rank, seed, shuffle, 0, shard));
  dt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = r->cfg->batch_size;
  lc.seed = seed;
  lc.workers = dt_run_loader_workers(r, ds);
  lc.sampler = dt_dist_sampler_fn;
  lc.sampler_user = *shard;
  lc.sampler_capacity = dt_dist_sampler_num_samples(*shard);
  if (lc.sampler_capacity < 1) lc.sampler_capacity = 1;
  return dt_loader_new(ds, &lc, out);
}

static int64_t limited(const dt_dataset *ds, int64_t limit) {
  const int64_t n = dt_dataset_size(ds);
  return limit > 0 && limit < n ? limit : n;
}

static dt_status ddp_loaders(dt_run *r) {
  const dt_train_config *c = r->cfg;
  DT_CHECK(shard_loader(r, r->train, 1, c->seed, limited(r->train, c->limit_train), &r->train_shard, &r->train_loader));
  r->my_val = -1;
  if (!r->val) return DT_OK;
  DT_CHECK(shard_loader(r, r->val, 0, 0, limited(r->val, c->limit_test), &r->val_shard, &r->val_loader));
  r->my_val = dt_dist_sampler_num_real(r->val_shard); /* the padding repeats at a shard's end do not count */
  return DT_OK;
}

/* --sharded-update auto's choice by size (train.h): a large model, or one whose step's activations outweigh it. */
static int sharded_pays(const dt_run *r) {
  const size_t bytes = r->n_params * sizeof(float) + dt_optim_state_bytes(r->optim);
  const size_t acts = dt_model_activation_bytes(r->model);
  const int pays = bytes >= DT_SHARDED_AUTO_MIN_BYTES || (bytes >= DT_SHARDED_AUTO_ACT_MIN_BYTES && acts > bytes);
  if (r->lead)
    DT_LOG_INFO("train", "--sharded-update auto: %s (%.2f MiB of parameters and optimizer state, %.2f MiB of "
                "activations)", pays ? "on" : "off", (double)bytes / (1 << 20), (double)acts / (1 << 20));
  return pays;
}

/* The optimizer's step moves into the all-reduces where nothing reads the averaged gradients between them and the
 * update (clipping, fp16's unscale and row-wise steps do): each rank its share of one copy for the host (the
 * sharded update), or else every rank every piece of its own copy (the fused update, DT_FUSED_UPDATE). */
static dt_status ddp_wrap(dt_run *r) {
  const dt_train_config *c = r->cfg;
  DT_CHECK(dt_ddp_new(r->model, r->group, &c->ddp, &r->ddp));
  DT_CHECK(dt_run_resume_optim(r)); /* rank 0's state, before it may move into memory the ranks share */
  if (c->amp == DT_AMP_FP16 || c->clip_grad_norm > 0 || r->n_rows) return DT_OK; /* refused for "on" by the config */
  /* the same inputs, so the same answers, everywhere */
  if (c->sharded_update > 0 || (c->sharded_update < 0 && sharded_pays(r))) {
    DT_CHECK(dt_ddp_set_optim(r->ddp, r->optim, &r->ddp_update));
    if (c->sharded_update > 0 && !r->ddp_update && r->lead)
      DT_LOG_WARN("train", "--sharded-update on: every rank steps the whole model (the ranks cannot share memory, "
                  "or the model has row tables; DT_DEBUG=ddp says which)");
  }
  long fused = 1;
  DT_CHECK(dt_tunable_int("DT_FUSED_UPDATE", &fused));
  if (fused != 0 && fused != 1) return dt_error(DT_USAGE, "DT_FUSED_UPDATE=%ld: 0 or 1", fused);
  if (!r->ddp_update && fused) DT_CHECK(dt_ddp_fuse_optim(r->ddp, r->optim, &r->ddp_update));
  return DT_OK;
}

static dt_status ddp_batch(dt_run *r, const dt_batch *b, int last, float *loss, double *sums) {
  dt_ddp_set_sync(r->ddp, last);
  if (last) dt_ddp_set_lr(r->ddp, r->step_lr);
  DT_CHECK(dt_ddp_before_forward(r->ddp));
  return dt_strategy_model_batch(r, b, loss, sums);
}

static dt_status ddp_finish(dt_run *r) { return dt_ddp_finish(r->ddp); }

/* With the sharded or fused update dt_ddp_finish has stepped the parameters already. */
static dt_status ddp_optim_step(dt_run *r, float lr) {
  return r->ddp_update ? DT_OK : dt_optim_step(r->optim, r->params, r->grads, lr);
}

/* Every rank evaluates with rank 0's batch-norm statistics. */
static dt_status ddp_eval_start(dt_run *r) { return dt_ddp_before_forward(r->ddp); }

static dt_status ddp_sum(dt_run *r, double *v, size_t n) { return dt_allreduce(r->group, v, v, n, DT_F64, DT_SUM, NULL); }

/* Counters are summed; kept rows (for exact ROC-AUC) are gathered from every rank, in rank order. */
static dt_status ddp_metrics(dt_run *r, dt_metric_acc *acc) {
  size_t n_state;
  double *state = dt_metric_acc_sums(acc, &n_state);
  DT_CHECK(ddp_sum(r, state, n_state));
  if (!dt_metric_acc_keeps_rows(acc)) return DT_OK;
  int64_t n_rows;
  const float *rows = dt_metric_acc_scores(acc, &n_rows); /* NULL on a rank that counted no sample */
  const size_t width = 2 * (size_t)dt_task_config_of(r->task)->outputs;
  int64_t *counts = NULL;
  float *mine = NULL, *all = NULL;
  dt_status st = dt_alloc_array((size_t)r->world, sizeof *counts, "row counts", (void **)&counts);
  if (st == DT_OK) st = dt_allgather(r->group, &n_rows, counts, (size_t)r->world, DT_I64, NULL);
  int64_t most = 0, total = 0;
  for (int q = 0; st == DT_OK && q < r->world; q++) most = counts[q] > most ? counts[q] : most, total += counts[q];
  /* Every rank sends `most` rows (all-gather needs equal blocks); the padding is dropped after. */
  if (st == DT_OK) st = dt_alloc_array((size_t)(most ? most : 1) * width, sizeof(float), "rows", (void **)&mine);
  if (st == DT_OK) st = dt_alloc_array((size_t)(most ? most : 1) * width * (size_t)r->world, sizeof(float), "rows", (void **)&all);
  if (st == DT_OK && most > 0) {
    if (n_rows > 0) memcpy(mine, rows, (size_t)n_rows * width * sizeof(float));
    st = dt_allgather(r->group, mine, all, (size_t)most * width * (size_t)r->world, DT_F32, NULL);
  }
  if (st == DT_OK) { /* compact: rank q's rows follow rank q-1's */
    size_t at = 0;
    for (int q = 0; q < r->world; q++) {
      memmove(all + at * width, all + (size_t)q * (size_t)most * width, (size_t)counts[q] * width * sizeof(float));
      at += (size_t)counts[q];
    }
    st = dt_metric_acc_set_scores(acc, all, total);
  }
  dt_free(all);
  dt_free(mine);
  dt_free(counts);
  return st;
}

/* Whole microseconds of a step's seconds, negated (so that a max over ranks is the least), within int32. */
static int32_t negated_us(double seconds) {
  const double us = seconds * 1e6 + 0.5;
  return us <= 0 ? 0 : us >= (double)INT32_MAX ? -INT32_MAX : -(int32_t)us;
}

/* A stop request on any rank stops every rank at the same step. The same all-reduce carries each rank's wait
 * and all-reduce time since the last one (the last step's), negated: its max gives the least of each over the
 * ranks, the step's critical figures (dt_comm_times). */
static dt_status ddp_stop(dt_run *r, int local, int *stop) {
  dt_ddp_stats s;
  dt_ddp_get_stats(r->ddp, &s);
  int32_t v[3] = {local != 0, negated_us(s.wait_s - r->comm.waited), negated_us(s.comm_s - r->comm.total)};
  DT_CHECK(dt_allreduce(r->group, v, v, 3, DT_I32, DT_MAX, NULL));
  r->comm.waited = s.wait_s, r->comm.total = s.comm_s;
  r->comm.critical_waited -= v[1] * 1e-6;
  r->comm.critical_total -= v[2] * 1e-6;
  *stop = v[0] != 0;
  return DT_OK;
}

static void ddp_comm(dt_run *r, dt_comm_times *t) {
  dt_ddp_stats s;
  dt_ddp_get_stats(r->ddp, &s);
  *t = r->comm;
  t->waited = s.wait_s;
  t->total = s.comm_s;
}

static dt_status ddp_gather(dt_run *r, const double *mine, double *all, size_t n) {
  return dt_allgather(r->group, mine, all, (size_t)r->world * n, DT_F64, NULL);
}

static void ddp_free(dt_run *r) {
  dt_ddp_free(r->ddp);
  dt_dist_sampler_free(r->val_shard);
  dt_dist_sampler_free(r->train_shard);
  dt_group_destroy(r->group);
  r->ddp = NULL;
  r->val_shard = r->train_shard = NULL;
  r->group = NULL;
}

const dt_strategy_ops dt_strategy_ddp_ops = {
    .name = "ddp",
    .join = ddp_join,
    .make_loaders = ddp_loaders,
    .wrap = ddp_wrap,
    .train_batch = ddp_batch,
    .finish_step = ddp_finish,
    .optim_step = ddp_optim_step,
    .eval_start = ddp_eval_start,
    .forward = dt_strategy_model_forward,
    .all_sum = ddp_sum,
    .reduce_metrics = ddp_metrics,
    .agree_stop = ddp_stop,
    .rng_get = dt_strategy_model_rng_get,
    .rng_set = dt_strategy_model_rng_set,
    .comm_seconds = ddp_comm,
    .gather = ddp_gather,
    .free = ddp_free,
};
