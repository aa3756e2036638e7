/* Task "multilabel" (binary when K = 1): K logits against 0/1 labels, BCEWithLogits, accuracy at 0.5, exact ROC-AUC. */
#include <math.h>

#include "core/impl.h"
#include "dtrain/loss.h"
#include "task/task-impl.h"

enum { M_CORRECT, M_N };

static dt_status check(const dt_task_config *c) {
  if (c->label_smoothing != 0.0f)
    return dt_error(DT_INVALID_ARGUMENT, "label smoothing applies to classification, not multilabel tasks");
  for (int i = 0; c->pos_weight && i < c->outputs; i++)
    if (!(c->pos_weight[i] >= 0.0f) || !isfinite(c->pos_weight[i]))
      return dt_error(DT_INVALID_ARGUMENT, "pos_weight[%d] = %g must be finite and >= 0", i, (double)c->pos_weight[i]);
  return DT_OK;
}

static void metric_set(const dt_task_config *c, dt_metric_set *m) {
  (void)c;
  const dt_metric_desc auc = {"auc", "ROC-AUC", "auc", 0}, acc = {"acc", "accuracy", "acc", 1};
  *m = (dt_metric_set){.n_train = 1, .n_train_row = 1, .n_eval = 2, .loss_label = "BCE loss"};
  m->train[0] = acc;
  m->eval[0] = auc;
  m->eval[1] = acc;
}

static dt_status loss(const dt_task *t, const float *out, const void *target, int n, int train, float *l,
                      float *dout) {
  (void)train;
  return dt_loss_bce_with_logits(out, target, n, t->cfg.outputs, t->cfg.pos_weight, l, dout);
}

/* Correct labels at probability 0.5: logit > 0 predicts 1. */
static void count(const dt_task *t, const float *out, const void *target, int n, double *sums) {
  const float *y = target;
  size_t correct = 0;
  for (size_t i = 0; i < (size_t)n * (size_t)t->cfg.outputs; i++) correct += (out[i] > 0.0f) == (y[i] > 0.5f);
  sums[M_CORRECT] += (double)correct;
}

/* ROC-AUC of label j over the kept rows (outputs then targets, 2K floats a row). */
static double auc_of(const dt_metric_acc *a, int j) {
  const size_t k = (size_t)a->t->cfg.outputs;
  return dt_roc_auc(a->rows + j, a->rows + k + j, a->n_rows, 2 * k);
}

static void values(const dt_metric_acc *a, int train, double *v) {
  const int k = a->t->cfg.outputs;
  const double acc = acc_counters(a)[M_CORRECT] / (a->state[ACC_SAMPLES] * k);
  if (train) {
    v[0] = acc;
    return;
  }
  /* The mean over labels that have both classes in the evaluation set (sklearn would refuse the others). */
  double sum = 0;
  int defined = 0;
  for (int j = 0; j < k; j++) {
    const double x = auc_of(a, j);
    if (isfinite(x)) sum += x, defined++;
  }
  v[0] = defined ? sum / defined : NAN;
  v[1] = acc;
}

static dt_status detail(const dt_metric_acc *a, dt_metric_detail *out) {
  const int k = a->t->cfg.outputs;
  DT_CHECK(dt_metric_detail_alloc(out, k, 0));
  out->value_label = "ROC-AUC";
  out->value_key = "auc_per_label";
  for (int j = 0; j < k; j++) out->value[j] = auc_of(a, j);
  return DT_OK;
}

const dt_task_ops dt_task_multilabel = {
    .kind = DT_TASK_MULTILABEL,
    .name = "multilabel",
    .target_dtype = DT_F32,
    .keeps_scores = 1,
    .check = check,
    .metric_set = metric_set,
    .n_sums = M_N,
    .num_detail = NULL,
    .loss = loss,
    .count = count,
    .count_detail = NULL,
    .values = values,
    .detail = detail,
};
