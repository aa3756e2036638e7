/* Task "regression": K outputs against K targets, MSE or L1 loss, RMSE and MAE. */
#include <math.h>

#include "core/impl.h"
#include "dtrain/loss.h"
#include "task/task-impl.h"

enum { R_SQ, R_ABS, R_N };

static dt_status check(const dt_task_config *c) {
  if (c->label_smoothing != 0.0f)
    return dt_error(DT_INVALID_ARGUMENT, "label smoothing applies to classification, not regression");
  if (c->pos_weight) return dt_error(DT_INVALID_ARGUMENT, "pos_weight applies to multilabel tasks, not regression");
  if (c->regression_loss != DT_LOSS_MSE && c->regression_loss != DT_LOSS_L1)
    return dt_error(DT_INVALID_ARGUMENT, "regression loss %d is unknown", (int)c->regression_loss);
  return DT_OK;
}

static void metric_set(const dt_task_config *c, dt_metric_set *m) {
  const dt_metric_desc rmse = {"rmse", "RMSE", "rmse", 0}, mae = {"mae", "MAE", "mae", 0};
  *m = (dt_metric_set){.n_train = 2, .n_train_row = 2, .n_eval = 2,
                       .loss_label = c->regression_loss == DT_LOSS_L1 ? "L1 loss" : "MSE loss"};
  m->train[0] = m->eval[0] = rmse;
  m->train[1] = m->eval[1] = mae;
}

static dt_status loss(const dt_task *t, const float *out, const void *target, int n, int train, float *l,
                      float *dout) {
  (void)train;
  if (t->cfg.regression_loss == DT_LOSS_L1) return dt_loss_l1(out, target, n, t->cfg.outputs, l, dout);
  return dt_loss_mse(out, target, n, t->cfg.outputs, l, dout);
}

static void count(const dt_task *t, const float *out, const void *target, int n, double *sums) {
  const float *y = target;
  double sq = 0, ab = 0;
  for (size_t i = 0; i < (size_t)n * (size_t)t->cfg.outputs; i++) {
    const double d = (double)out[i] - (double)y[i];
    sq += d * d;
    ab += fabs(d);
  }
  sums[R_SQ] += sq;
  sums[R_ABS] += ab;
}

static void values(const dt_metric_acc *a, int train, double *v) {
  (void)train;
  const double elems = a->state[ACC_SAMPLES] * a->t->cfg.outputs;
  v[0] = sqrt(acc_counters(a)[R_SQ] / elems);
  v[1] = acc_counters(a)[R_ABS] / elems;
}

const dt_task_ops dt_task_regression = {
    .kind = DT_TASK_REGRESSION,
    .name = "regression",
    .target_dtype = DT_F32,
    .keeps_scores = 0,
    .check = check,
    .metric_set = metric_set,
    .n_sums = R_N,
    .num_detail = NULL,
    .loss = loss,
    .count = count,
    .count_detail = NULL,
    .values = values,
    .detail = NULL,
};
