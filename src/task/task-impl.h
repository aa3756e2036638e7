/* Internal: the task ops table (one file per task) and the accumulator's layout. */
#ifndef DT_TASK_IMPL_H
#define DT_TASK_IMPL_H

#include "dtrain/task.h"

/* An accumulator's f64 state: [samples, loss sum, the task's counters, the detail counters]. */
enum { ACC_SAMPLES = 0, ACC_LOSS = 1, ACC_COUNTERS = 2 };

typedef struct dt_task_ops {
  dt_task_kind kind;
  const char *name;
  dt_dtype target_dtype;
  int keeps_scores; /* evaluation keeps (outputs, targets) rows for exact rank metrics */
  dt_status (*check)(const dt_task_config *c);
  void (*metric_set)(const dt_task_config *c, dt_metric_set *m);
  int n_sums;                                    /* summable counters of a batch */
  size_t (*num_detail)(const dt_task_config *c); /* detail counters of an evaluation; NULL: none */
  dt_status (*loss)(const dt_task *t, const float *out, const void *target, int n, int train, float *loss,
                    float *dout);
  void (*count)(const dt_task *t, const float *out, const void *target, int n, double *sums);
  void (*count_detail)(const dt_task *t, const float *out, const void *target, int n, double *detail); /* or NULL */
  /* values from the reduced state (and kept rows) */
  void (*values)(const dt_metric_acc *a, int train, double *v);
  /* the detail per class or label (arrays allocated); NULL: none */
  dt_status (*detail)(const dt_metric_acc *a, dt_metric_detail *out);
} dt_task_ops;

struct dt_task {
  const dt_task_ops *ops;
  dt_task_config cfg;
  float *pos_weight; /* owned copy, or NULL */
  dt_metric_set metrics;
};

struct dt_metric_acc {
  const dt_task *t;
  int detail;
  double *state; /* (n_state) */
  size_t n_state, n_counters;
  float *rows;   /* kept rows: (n_rows, 2 * outputs) = outputs then targets */
  int64_t n_rows, cap_rows;
};

static inline const double *acc_counters(const dt_metric_acc *a) { return a->state + ACC_COUNTERS; }
static inline const double *acc_detail(const dt_metric_acc *a) { return a->state + ACC_COUNTERS + a->n_counters; }

extern const dt_task_ops dt_task_classification, dt_task_multilabel, dt_task_regression;

/* Allocates the k-wide arrays of a detail (samples and confusion when asked). */
dt_status dt_metric_detail_alloc(dt_metric_detail *d, int k, int per_class);

#endif
