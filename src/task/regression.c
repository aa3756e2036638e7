/* Task "regression": K outputs against K targets, MSE or L1 loss, RMSE and MAE. */
#include <math.h>

#include "core/impl.h"
#include "dtrain/loss.h"
#include "task/task-impl.h"

enum { R_SQ, R_ABS, R_N };
/* Evaluation detail with ranking: queries, hits, NDCG sum. */
enum { RK_QUERIES, RK_HITS, RK_NDCG, RK_N };

static dt_status check(const dt_task_config *c) {
  if (c->label_smoothing != 0.0f)
    return dt_error(DT_INVALID_ARGUMENT, "label smoothing applies to classification, not regression");
  if (c->pos_weight) return dt_error(DT_INVALID_ARGUMENT, "pos_weight applies to multilabel tasks, not regression");
  if (c->regression_loss != DT_LOSS_MSE && c->regression_loss != DT_LOSS_L1)
    return dt_error(DT_INVALID_ARGUMENT, "regression loss %d is unknown", (int)c->regression_loss);
  if (c->ranking_k < 0 || c->ranking_k > 1000)
    return dt_error(DT_INVALID_ARGUMENT, "ranking cut-off %d outside 0..1000", c->ranking_k);
  return DT_OK;
}

static void metric_set(const dt_task_config *c, dt_metric_set *m) {
  const dt_metric_desc rmse = {"rmse", "RMSE", "rmse", 0}, mae = {"mae", "MAE", "mae", 0};
  *m = (dt_metric_set){.n_train = 2, .n_train_row = 2, .n_eval = 2,
                       .loss_label = c->regression_loss == DT_LOSS_L1 ? "L1 loss" : "MSE loss"};
  m->train[0] = m->eval[0] = rmse;
  m->train[1] = m->eval[1] = mae;
  if (c->ranking_k == 10) { /* the NCF paper's cut-off, the one the names say */
    m->eval[2] = (dt_metric_desc){"hr10", "HR@10", "hr@10", 0};
    m->eval[3] = (dt_metric_desc){"ndcg10", "NDCG@10", "ndcg@10", 0};
    m->n_eval = 4;
  } else if (c->ranking_k) {
    m->eval[2] = (dt_metric_desc){"hr", "HR@K", "hr@k", 0};
    m->eval[3] = (dt_metric_desc){"ndcg", "NDCG@K", "ndcg@k", 0};
    m->n_eval = 4;
  }
}

static size_t num_detail(const dt_task_config *c) { return c->ranking_k ? RK_N : 0; }

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
  if (train || !a->t->cfg.ranking_k) return;
  const double *rk = acc_detail(a), q = rk[RK_QUERIES];
  v[2] = q > 0 ? rk[RK_HITS] / q : NAN;
  v[3] = q > 0 ? rk[RK_NDCG] / q : NAN;
}

dt_status dt_metric_acc_add_ranking(dt_metric_acc *a, const float *scores, int64_t n, int per) {
  if (!a->detail || a->t->ops != &dt_task_regression || !a->t->cfg.ranking_k)
    return dt_error(DT_INVALID_ARGUMENT, "dt_metric_acc_add_ranking: not an evaluation of a task with ranking");
  if (per < 2) return dt_error(DT_INVALID_ARGUMENT, "dt_metric_acc_add_ranking: %d candidates per query", per);
  double *rk = a->state + ACC_COUNTERS + a->n_counters;
  for (int64_t q = 0; q < n; q++) {
    const float *s = scores + q * per;
    int rank = 0;
    for (int j = 1; j < per; j++) rank += !(s[j] < s[0]); /* ties and NaN count against the positive */
    rk[RK_QUERIES] += 1;
    if (rank < a->t->cfg.ranking_k) {
      rk[RK_HITS] += 1;
      rk[RK_NDCG] += 1.0 / log2(rank + 2.0);
    }
  }
  return DT_OK;
}

const dt_task_ops dt_task_regression = {
    .kind = DT_TASK_REGRESSION,
    .name = "regression",
    .target_dtype = DT_F32,
    .keeps_scores = 0,
    .check = check,
    .metric_set = metric_set,
    .n_sums = R_N,
    .num_detail = num_detail,
    .loss = loss,
    .count = count,
    .count_detail = NULL,
    .values = values,
    .detail = NULL,
};
