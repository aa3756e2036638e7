/* Task "classification": class indices, cross entropy with label smoothing, top-1/top-5, per-class accuracy, confusion. */
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/loss.h"
#include "task/task-impl.h"

enum { C_TOP1, C_TOPK, C_N };

static int topk_of(const dt_task_config *c) { return c->outputs < 5 ? c->outputs : 5; }

static dt_status check(const dt_task_config *c) {
  if (c->outputs < 2) return dt_error(DT_INVALID_ARGUMENT, "classification needs >= 2 classes, got %d", c->outputs);
  if (!(c->label_smoothing >= 0.0f && c->label_smoothing < 1.0f))
    return dt_error(DT_INVALID_ARGUMENT, "label smoothing %g must be in [0, 1)", (double)c->label_smoothing);
  if (c->pos_weight) return dt_error(DT_INVALID_ARGUMENT, "pos_weight applies to multilabel tasks, not classification");
  return DT_OK;
}

/* The metrics over more than 5 classes; with 5 or fewer, top-5 (always 1) is left out. */
static const dt_metric_set with_top5 = {
    .n_train = 2, .n_train_row = 1, .n_eval = 2, .loss_label = "cross-entropy loss",
    .train = {{"acc1", "top-1", "acc", 1}, {"acc5", "top-5", "top5", 1}},
    .eval = {{"acc1", "top-1", "top1", 1}, {"acc5", "top-5", "top5", 1}}};

static void metric_set(const dt_task_config *c, dt_metric_set *m) {
  *m = with_top5;
  if (c->outputs <= 5) m->n_train = m->n_eval = 1;
}

const dt_metric_set *dt_metric_set_classification(void) { return &with_top5; }

/* Per class: samples, correct; then the (classes, classes) confusion matrix, rows the true class. */
static size_t num_detail(const dt_task_config *c) {
  const size_t k = (size_t)c->outputs;
  return 2 * k + k * k;
}

static dt_status loss(const dt_task *t, const float *out, const void *target, int n, int train, float *l,
                      float *dout) {
  const float eps = train ? t->cfg.label_smoothing : 0.0f;
  return dt_loss_cross_entropy(out, target, n, t->cfg.outputs, eps, l, dout);
}

static void count(const dt_task *t, const float *out, const void *target, int n, double *sums) {
  int64_t top1 = 0, topk = 0;
  dt_topk_correct(out, target, n, t->cfg.outputs, topk_of(&t->cfg), &top1, &topk);
  sums[C_TOP1] += (double)top1;
  sums[C_TOPK] += (double)topk;
}

/* The predicted class: the largest output, ties to the lower index (torch.argmax). */
static int argmax(const float *x, int k) {
  int best = 0;
  for (int c = 1; c < k; c++)
    if (x[c] > x[best]) best = c;
  return best;
}

static void count_detail(const dt_task *t, const float *out, const void *target, int n, double *d) {
  const int k = t->cfg.outputs;
  const int32_t *y = target;
  double *total = d, *correct = d + k, *confusion = d + 2 * k;
  for (int i = 0; i < n; i++) {
    if (y[i] < 0 || y[i] >= k) continue;
    const int p = argmax(out + (size_t)i * k, k);
    total[y[i]] += 1;
    correct[y[i]] += p == y[i];
    confusion[(size_t)y[i] * k + p] += 1;
  }
}

static void values(const dt_metric_acc *a, int train, double *v) {
  const double n = a->state[ACC_SAMPLES];
  const double *c = acc_counters(a);
  v[0] = c[C_TOP1] / n;
  if (a->t->cfg.outputs > 5) v[1] = c[C_TOPK] / n;
}

static dt_status detail(const dt_metric_acc *a, dt_metric_detail *out) {
  const int k = a->t->cfg.outputs;
  const double *d = acc_detail(a);
  DT_CHECK(dt_metric_detail_alloc(out, k, 1));
  out->value_label = "accuracy";
  out->value_key = "per_class_acc";
  out->percent = 1;
  for (int c = 0; c < k; c++) {
    out->samples[c] = d[c];
    out->value[c] = d[c] > 0 ? d[k + c] / d[c] : NAN;
  }
  memcpy(out->confusion, d + 2 * k, (size_t)k * (size_t)k * sizeof(double));
  return DT_OK;
}

const dt_task_ops dt_task_classification = {
    .kind = DT_TASK_CLASSIFICATION,
    .name = "classification",
    .target_dtype = DT_I32,
    .keeps_scores = 0,
    .check = check,
    .metric_set = metric_set,
    .n_sums = C_N,
    .num_detail = num_detail,
    .loss = loss,
    .count = count,
    .count_detail = count_detail,
    .values = values,
    .detail = detail,
};
