/* Tasks: what a target is, which loss and metrics apply, and how evaluation is reduced exactly across ranks. */
#ifndef DTRAIN_TASK_H
#define DTRAIN_TASK_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* classification: one class index per sample (i32), cross entropy with label
 * smoothing, top-1 (and top-5 when there are more than 5 classes), per-class
 * accuracy and the confusion matrix.
 * multilabel: K independent logits against K 0/1 labels (f32), BCEWithLogits
 * with an optional pos_weight; accuracy at 0.5 and exact ROC-AUC per label
 * (binary classification is K = 1).
 * regression: K outputs against K f32 targets, MSE or L1 loss; RMSE and MAE. */
typedef enum dt_task_kind { DT_TASK_CLASSIFICATION = 0, DT_TASK_MULTILABEL, DT_TASK_REGRESSION } dt_task_kind;
const char *dt_task_kind_name(dt_task_kind k);

typedef enum dt_regression_loss { DT_LOSS_MSE = 0, DT_LOSS_L1 } dt_regression_loss;

typedef struct dt_task_config {
  dt_task_kind kind;
  int outputs;             /* classes, labels or regression targets (>= 1; classification >= 2) */
  float label_smoothing;   /* classification, in [0, 1) */
  const float *pos_weight; /* multilabel: (outputs) weights of the positive term, or NULL (all 1) */
  dt_regression_loss regression_loss;
  int ranking_k;           /* regression: > 0 adds HR@K and NDCG@K to the evaluation (dt_metric_acc_add_ranking) */
} dt_task_config;

/* ---- metrics names ----------------------------------------------------------- */
#define DT_MAX_METRICS 4
#define DT_TASK_MAX_SUMS 8 /* dt_task_num_sums is at most this */
/* name: as in files and TensorBoard tags ("acc1" -> train_acc1, acc1/val);
 * label: as shown to people ("top-1"); brief: in the epoch line ("top1");
 * percent: a fraction shown in %. */
typedef struct dt_metric_desc {
  const char *name, *label, *brief;
  int percent;
} dt_metric_desc;
/* What a task reports in a training pass (summable figures only; the first
 * n_train_row of them in the epoch rows, all of them in TensorBoard) and in an
 * evaluation pass. */
typedef struct dt_metric_set {
  int n_train, n_train_row, n_eval;
  dt_metric_desc train[DT_MAX_METRICS], eval[DT_MAX_METRICS];
  const char *loss_label; /* "cross-entropy loss", "BCE loss", "MSE loss" */
} dt_metric_set;

/* The metrics of classification over more than 5 classes (acc1, acc5): the
 * names to use where no task is at hand, e.g. rows written by older versions. */
const dt_metric_set *dt_metric_set_classification(void);

/* ---- tasks -------------------------------------------------------------------- */
typedef struct dt_task dt_task;
/* DT_INVALID_ARGUMENT naming the bad field. The task copies pos_weight. */
dt_status dt_task_new(const dt_task_config *cfg, dt_task **out);
void dt_task_free(dt_task *t);
const dt_task_config *dt_task_config_of(const dt_task *t);
const dt_metric_set *dt_task_metrics(const dt_task *t);
/* The target of one sample: DT_I32 (1 value, a class) or DT_F32 (outputs values). */
dt_dtype dt_task_target_dtype(const dt_task *t);
int dt_task_target_width(const dt_task *t);
/* Mean loss over n samples of out (n, outputs) against target (n, width);
 * train = 0 drops label smoothing (evaluation loss). dout (n, outputs), if
 * non-NULL, receives d(mean loss)/d(out). A class index out of range or a
 * non-finite target is DT_INVALID_ARGUMENT naming the sample. */
dt_status dt_task_loss(const dt_task *t, const float *out, const void *target, int n, int train, float *loss,
                       float *dout);
/* Summable counters of a batch (dt_task_num_sums of them), ADDED to sums:
 * what the training pass reports (correct top-1/top-5, squared errors, ...). */
int dt_task_num_sums(const dt_task *t);
void dt_task_count(const dt_task *t, const float *out, const void *target, int n, double *sums);

/* ---- evaluation accumulator ---------------------------------------------------- */
/* Everything one pass needs for its metrics: sample count, loss sum, the
 * task's counters and, for an evaluation pass (detail = 1), what exact metrics
 * need: per-class counts and the confusion matrix, or every score and label
 * (ROC-AUC is not a mean of per-rank AUCs). */
typedef struct dt_metric_acc dt_metric_acc;
dt_status dt_metric_acc_new(const dt_task *t, int detail, dt_metric_acc **out);
void dt_metric_acc_free(dt_metric_acc *a);
void dt_metric_acc_reset(dt_metric_acc *a);
/* A batch: its mean loss over n samples and the outputs (for counters and detail). */
dt_status dt_metric_acc_add(dt_metric_acc *a, const float *out, const void *target, int n, double mean_loss);
/* Counters already computed (n samples, mean loss, dt_task_num_sums values). */
void dt_metric_acc_add_sums(dt_metric_acc *a, int64_t n, double loss_sum, const double *sums);
/* Summable state: samples, loss sum, counters, per-class detail (f64), so a
 * strategy can all-reduce it in place; kept scores are exchanged separately. */
double *dt_metric_acc_sums(dt_metric_acc *a, size_t *count);
/* 1 if the accumulator keeps rows (an evaluation of a multilabel task), on every rank alike:
 * what decides whether ranks exchange them, even a rank that kept none. */
int dt_metric_acc_keeps_rows(const dt_metric_acc *a);
/* The kept rows, each the outputs then the labels (2 * outputs floats), n of them; NULL when there
 * are none (dt_metric_acc_keeps_rows 0, or no sample added yet). */
float *dt_metric_acc_scores(dt_metric_acc *a, int64_t *n);
/* Replaces the kept rows by the gathered ones of every rank (n rows; copied). */
dt_status dt_metric_acc_set_scores(dt_metric_acc *a, const float *scores, int64_t n);
/* Ranking queries (an evaluation of a task with ranking_k = K): n queries of
 * `per` scores each, the positive first. The positive's rank is the number of
 * the other per - 1 candidates scoring at least as high (ties count against
 * it); a hit is rank < K and its NDCG is 1 / log2(rank + 2) (one relevant
 * item). Added to the summable state, so ranks may split the queries. */
dt_status dt_metric_acc_add_ranking(dt_metric_acc *a, const float *scores, int64_t n, int per);
int64_t dt_metric_acc_samples(const dt_metric_acc *a);
/* Mean loss and the metric values (train: the set's train metrics; else eval), NaN with no sample. */
double dt_metric_acc_loss(const dt_metric_acc *a);
void dt_metric_acc_values(const dt_metric_acc *a, int train, double *v);
/* The detail as JSON members (no braces), e.g. "per_class_acc":[...],"confusion":[[...]],
 * or "auc_per_label":[...]; "" when there is none. DT_INVALID_ARGUMENT if it does not fit. */
dt_status dt_metric_acc_detail_json(const dt_metric_acc *a, char *buf, size_t len);

/* The evaluation per class (classification: samples, accuracy and the
 * confusion matrix, rows the true class) or per label (multilabel: ROC-AUC;
 * samples and confusion NULL); k = 0 when the task has none. The arrays
 * belong to the detail: dt_metric_detail_free. */
typedef struct dt_metric_detail {
  int k;
  double *samples;         /* (k) or NULL */
  double *value;           /* (k): accuracy per class or ROC-AUC per label (NaN: undefined) */
  const char *value_label; /* "accuracy", "ROC-AUC" */
  const char *value_key;   /* its JSON name: "per_class_acc", "auc_per_label" */
  int percent;             /* value is a fraction shown in % */
  double *confusion;       /* (k, k) counts, or NULL */
} dt_metric_detail;
dt_status dt_metric_acc_detail(const dt_metric_acc *a, dt_metric_detail *out);
void dt_metric_detail_free(dt_metric_detail *d);

/* Exact ROC-AUC of scores against 0/1 labels (n of each, stride apart): the
 * Mann-Whitney statistic with ties counted half, as sklearn's roc_auc_score.
 * NaN when one class is absent. */
double dt_roc_auc(const float *scores, const float *labels, int64_t n, size_t stride);

#ifdef __cplusplus
}
#endif
#endif
