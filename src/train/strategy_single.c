/* Strategy "single": one process trains the whole batch; also the shared pieces dp and ddp reuse. */
#include <string.h>

#include "core/impl.h"
#include "dtrain/trace.h"
#include "train/run.h"
#include "dtrain/model_ctx.h"
#include "train/strategy.h"

dt_status dt_strategy_join_alone(dt_run *r) {
  r->rank = 0;
  r->world = 1;
  return DT_OK;
}

dt_status dt_strategy_prefix_loaders(dt_run *r) {
  const dt_train_config *c = r->cfg;
  DT_CHECK(dt_run_prefix_loader(r, r->train, 1, c->seed, c->limit_train, &r->train_prefix, &r->train_loader));
  if (r->val) DT_CHECK(dt_run_prefix_loader(r, r->val, 0, 0, c->limit_test, &r->val_prefix, &r->val_loader));
  r->my_val = -1;
  return DT_OK;
}

/* Forward, loss and backward of a batch on the model's own context; dout scaled for accumulation. */
dt_status dt_strategy_model_batch(dt_run *r, const dt_batch *b, float *loss, double *sums) {
  const float *out = NULL;
  const int accumulate = r->cfg->accumulate;
  dt_model_ctx_set_loss_weight(dt_model_default_ctx(r->model), 1.0f / ((float)b->size * (float)accumulate));
  DT_CHECK(dt_model_forward(r->model, b->x, b->size, &out));
  DT_CHECK(dt_task_loss(r->task, out, b->target, b->size, 1, loss, r->dout));
  dt_task_count(r->task, out, b->target, b->size, sums);
  const float loss_scale = dt_run_amp_loss_scale(r); /* fp16: GradScaler's scale(loss) */
  if (accumulate > 1 || loss_scale != 1.0f) {
    const float micro_scale = loss_scale / (float)accumulate;
    const size_t n = (size_t)b->size * (size_t)dt_task_config_of(r->task)->outputs;
    for (size_t i = 0; i < n; i++) r->dout[i] *= micro_scale;
  }
  return dt_model_backward(r->model, r->dout);
}

dt_status dt_strategy_model_forward(dt_run *r, const void *x, int n, const float **out) {
  return dt_model_forward(r->model, x, n, out);
}

dt_status dt_strategy_local_sum(dt_run *r, double *v, size_t n) {
  (void)r, (void)v, (void)n;
  return DT_OK;
}

dt_status dt_strategy_local_metrics(dt_run *r, dt_metric_acc *acc) {
  (void)r, (void)acc;
  return DT_OK;
}

dt_status dt_strategy_local_stop(dt_run *r, int local, int *stop) {
  (void)r;
  *stop = local;
  return DT_OK;
}

void dt_strategy_no_comm(dt_run *r, dt_comm_times *t) {
  (void)r;
  memset(t, 0, sizeof *t);
}

dt_status dt_strategy_local_gather(dt_run *r, const double *mine, double *all, size_t n) {
  (void)r;
  memcpy(all, mine, n * sizeof *mine);
  return DT_OK;
}

void dt_strategy_model_rng_get(dt_run *r, dt_snapshot_position *p) {
  p->n_rng = 1;
  p->rng_step[0] = dt_model_rng_step(r->model);
}

void dt_strategy_model_rng_set(dt_run *r, const dt_snapshot_position *p) { dt_model_set_rng_step(r->model, p->rng_step[0]); }

static dt_status single_wrap(dt_run *r) {
  (void)r;
  return DT_OK;
}

static dt_status single_batch(dt_run *r, const dt_batch *b, int last, float *loss, double *sums) {
  (void)last;
  return dt_strategy_model_batch(r, b, loss, sums);
}

static dt_status single_finish(dt_run *r) {
  (void)r;
  return DT_OK;
}

static void single_free(dt_run *r) { (void)r; }

const dt_strategy_ops dt_strategy_single_ops = {
    .name = "single",
    .join = dt_strategy_join_alone,
    .make_loaders = dt_strategy_prefix_loaders,
    .wrap = single_wrap,
    .train_batch = single_batch,
    .finish_step = single_finish,
    .eval_start = NULL,
    .forward = dt_strategy_model_forward,
    .all_sum = dt_strategy_local_sum,
    .reduce_metrics = dt_strategy_local_metrics,
    .agree_stop = dt_strategy_local_stop,
    .rng_get = dt_strategy_model_rng_get,
    .rng_set = dt_strategy_model_rng_set,
    .comm_seconds = dt_strategy_no_comm,
    .gather = dt_strategy_local_gather,
    .free = single_free,
};
