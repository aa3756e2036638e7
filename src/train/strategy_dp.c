/* Strategy "dp": one process, worker threads each on a slice of every batch (nn.DataParallel). */
#include "core/impl.h"
#include "dtrain/core.h"
#include "train/run.h"
#include "train/strategy.h"

/* A worker's slice of the batch the trainer took unfilled (dt_loader_next_unfilled); nothing where it came made. */
static dt_status fill_slice(void *user, int lo, int n) { return dt_loader_fill(((dt_run *)user)->train_loader, lo, n); }

static dt_status dp_wrap(dt_run *r) {
  const int workers = r->cfg->workers > 0 ? r->cfg->workers : dt_get_threads();
  DT_CHECK(dt_dp_new(r->model, workers, r->cfg->batch_size, &r->dp));
  dt_dp_set_fill(r->dp, fill_slice, r);
  /* Where nothing reads the batch's gradients before the optimizer (clipping, fp16's unscale, accumulation's
   * scaling do), the workers sum them block by block into the update itself. */
  const dt_train_config *c = r->cfg;
  dt_dp_set_fused_step(r->dp, c->accumulate == 1 && c->amp != DT_AMP_FP16 && !(c->clip_grad_norm > 0));
  dt_optim_set_shared_params(r->optim, workers > 1); /* each worker steps a share the others read in their forward */
  const size_t n = (size_t)r->cfg->batch_size * (size_t)dt_task_config_of(r->task)->outputs;
  return dt_alloc_array(n, sizeof(float), "dp evaluation outputs", (void **)&r->eval_buf);
}

/* dp adds the whole batch's gradient; accumulation is scaled at the step's end. */
static dt_status dp_batch(dt_run *r, const dt_batch *b, int last, float *loss, double *sums) {
  (void)last;
  dt_dp_set_loss_scale(r->dp, dt_run_amp_loss_scale(r));
  return dt_dp_train_step(r->dp, r->task, b->x, b->target, b->size, loss, sums);
}

static dt_status dp_finish(dt_run *r) {
  const int accumulate = r->cfg->accumulate;
  if (accumulate > 1) {
    const float micro_scale = 1.0f / (float)accumulate;
    for (size_t i = 0; i < r->n_params; i++) r->grads[i] *= micro_scale;
  }
  return DT_OK;
}

static dt_status dp_optim_step(dt_run *r, float lr) { return dt_dp_optim_step(r->dp, r->optim, lr); }

static dt_status dp_clip(dt_run *r, float max_norm, float *norm) { return dt_dp_clip_grad_norm(r->dp, max_norm, norm); }

static dt_status dp_forward(dt_run *r, const void *x, int n, const float **out) {
  DT_CHECK(dt_dp_forward(r->dp, x, n, r->eval_buf));
  *out = r->eval_buf;
  return DT_OK;
}

static void dp_rng_get(dt_run *r, dt_snapshot_position *p) {
  p->n_rng = dt_dp_workers(r->dp);
  for (int w = 0; w < p->n_rng; w++) p->rng_step[w] = dt_dp_rng_step(r->dp, w);
}

static void dp_rng_set(dt_run *r, const dt_snapshot_position *p) {
  for (int w = 0; w < dt_dp_workers(r->dp); w++) dt_dp_set_rng_step(r->dp, w, p->rng_step[w < p->n_rng ? w : 0]);
}

static void dp_free(dt_run *r) {
  dt_free(r->eval_buf);
  dt_dp_free(r->dp);
  r->eval_buf = NULL;
  r->dp = NULL;
}

const dt_strategy_ops dt_strategy_dp_ops = {
    .name = "dp",
    .fills_batches = 1,
    .join = dt_strategy_join_alone,
    .make_loaders = dt_strategy_prefix_loaders,
    .wrap = dp_wrap,
    .train_batch = dp_batch,
    .finish_step = dp_finish,
    .optim_step = dp_optim_step,
    .clip_grad_norm = dp_clip,
    .eval_start = NULL,
    .forward = dp_forward,
    .all_sum = dt_strategy_local_sum,
    .reduce_metrics = dt_strategy_local_metrics,
    .agree_stop = dt_strategy_local_stop,
    .rng_get = dp_rng_get,
    .rng_set = dp_rng_set,
    .comm_seconds = dt_strategy_no_comm,
    .gather = dt_strategy_local_gather,
    .free = dp_free,
};
