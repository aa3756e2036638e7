/* Tasks: the registry of task kinds, their construction, and the metric accumulator every pass fills. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "task/task-impl.h"

static const dt_task_ops *const task_ops[] = {&dt_task_classification, &dt_task_multilabel, &dt_task_regression};
#define N_TASKS (sizeof task_ops / sizeof task_ops[0])

static const dt_task_ops *ops_of(dt_task_kind k) {
  for (size_t i = 0; i < N_TASKS; i++)
    if (task_ops[i]->kind == k) return task_ops[i];
  return NULL;
}

const char *dt_task_kind_name(dt_task_kind k) {
  const dt_task_ops *o = ops_of(k);
  return o ? o->name : "unknown";
}

dt_status dt_task_new(const dt_task_config *cfg, dt_task **out) {
  if (!cfg || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_task_new: NULL argument");
  const dt_task_ops *o = ops_of(cfg->kind);
  if (!o) return dt_error(DT_INVALID_ARGUMENT, "task kind %d is unknown", (int)cfg->kind);
  if (cfg->outputs < 1 || cfg->outputs > (1 << 24))
    return dt_error(DT_INVALID_ARGUMENT, "%s task: %d outputs, expected 1..%d", o->name, cfg->outputs, 1 << 24);
  DT_CHECK(o->check(cfg));
  dt_task *t = NULL;
  DT_CHECK(dt_alloc(sizeof *t, (void **)&t));
  t->ops = o;
  t->cfg = *cfg;
  t->cfg.pos_weight = NULL;
  if (cfg->pos_weight) {
    dt_status st = dt_alloc_array((size_t)cfg->outputs, sizeof(float), "pos_weight", (void **)&t->pos_weight);
    if (st != DT_OK) {
      dt_free(t);
      return st;
    }
    memcpy(t->pos_weight, cfg->pos_weight, (size_t)cfg->outputs * sizeof(float));
    t->cfg.pos_weight = t->pos_weight;
  }
  o->metric_set(&t->cfg, &t->metrics);
  *out = t;
  return DT_OK;
}

void dt_task_free(dt_task *t) {
  if (!t) return;
  dt_free(t->pos_weight);
  dt_free(t);
}

const dt_task_config *dt_task_config_of(const dt_task *t) { return &t->cfg; }
const dt_metric_set *dt_task_metrics(const dt_task *t) { return &t->metrics; }
dt_dtype dt_task_target_dtype(const dt_task *t) { return t->ops->target_dtype; }
int dt_task_target_width(const dt_task *t) { return t->ops->target_dtype == DT_I32 ? 1 : t->cfg.outputs; }
int dt_task_num_sums(const dt_task *t) { return t->ops->n_sums; }

dt_status dt_task_loss(const dt_task *t, const float *out, const void *target, int n, int train, float *loss,
                       float *dout) {
  if (!t || !out || !target || !loss) return dt_error(DT_INVALID_ARGUMENT, "dt_task_loss: NULL argument");
  if (n < 1) return dt_error(DT_INVALID_ARGUMENT, "dt_task_loss: %d samples, expected >= 1", n);
  return t->ops->loss(t, out, target, n, train, loss, dout);
}

void dt_task_count(const dt_task *t, const float *out, const void *target, int n, double *sums) {
  t->ops->count(t, out, target, n, sums);
}

/* ---- the accumulator ------------------------------------------------------------------ */

dt_status dt_metric_acc_new(const dt_task *t, int detail, dt_metric_acc **out) {
  if (!t || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_metric_acc_new: NULL argument");
  dt_metric_acc *a = NULL;
  DT_CHECK(dt_alloc(sizeof *a, (void **)&a));
  a->t = t;
  a->detail = detail;
  a->n_counters = (size_t)t->ops->n_sums;
  a->n_state = ACC_COUNTERS + a->n_counters + (detail && t->ops->num_detail ? t->ops->num_detail(&t->cfg) : 0);
  dt_status st = dt_alloc_array(a->n_state, sizeof(double), "metric state", (void **)&a->state);
  if (st != DT_OK) {
    dt_free(a);
    return st;
  }
  *out = a;
  return DT_OK;
}

void dt_metric_acc_free(dt_metric_acc *a) {
  if (!a) return;
  dt_free(a->rows);
  dt_free(a->state);
  dt_free(a);
}

void dt_metric_acc_reset(dt_metric_acc *a) {
  memset(a->state, 0, a->n_state * sizeof(double));
  a->n_rows = 0;
}

/* Room for n more kept rows (doubling). */
static dt_status reserve_rows(dt_metric_acc *a, int64_t n) {
  const size_t row = 2 * (size_t)a->t->cfg.outputs * sizeof(float);
  return dt_grow_array((void **)&a->rows, &a->cap_rows, a->n_rows, a->n_rows + n, 1024, row, "kept evaluation rows");
}

/* Keeps (outputs, targets) of n samples as rows. */
static dt_status keep_rows(dt_metric_acc *a, const float *out, const float *target, int n) {
  DT_CHECK(reserve_rows(a, n));
  const size_t k = (size_t)a->t->cfg.outputs;
  float *r = a->rows + (size_t)a->n_rows * 2 * k;
  for (int i = 0; i < n; i++, r += 2 * k) {
    memcpy(r, out + (size_t)i * k, k * sizeof(float));
    memcpy(r + k, target + (size_t)i * k, k * sizeof(float));
  }
  a->n_rows += n;
  return DT_OK;
}

dt_status dt_metric_acc_add(dt_metric_acc *a, const float *out, const void *target, int n, double mean_loss) {
  if (n <= 0) return DT_OK;
  a->state[ACC_SAMPLES] += n;
  a->state[ACC_LOSS] += mean_loss * n;
  a->t->ops->count(a->t, out, target, n, a->state + ACC_COUNTERS);
  if (!a->detail) return DT_OK;
  if (a->t->ops->count_detail) a->t->ops->count_detail(a->t, out, target, n, a->state + ACC_COUNTERS + a->n_counters);
  return a->t->ops->keeps_scores ? keep_rows(a, out, target, n) : DT_OK;
}

void dt_metric_acc_add_sums(dt_metric_acc *a, int64_t n, double loss_sum, const double *sums) {
  a->state[ACC_SAMPLES] += (double)n;
  a->state[ACC_LOSS] += loss_sum;
  for (size_t i = 0; i < a->n_counters; i++) a->state[ACC_COUNTERS + i] += sums[i];
}

double *dt_metric_acc_sums(dt_metric_acc *a, size_t *count) {
  *count = a->n_state;
  return a->state;
}

int dt_metric_acc_keeps_rows(const dt_metric_acc *a) { return a->detail && a->t->ops->keeps_scores; }

float *dt_metric_acc_scores(dt_metric_acc *a, int64_t *n) {
  *n = a->n_rows;
  return a->detail && a->t->ops->keeps_scores ? a->rows : NULL;
}

dt_status dt_metric_acc_set_scores(dt_metric_acc *a, const float *rows, int64_t n) {
  a->n_rows = 0;
  DT_CHECK(reserve_rows(a, n));
  if (n) memcpy(a->rows, rows, (size_t)n * 2 * (size_t)a->t->cfg.outputs * sizeof(float));
  a->n_rows = n;
  return DT_OK;
}

int64_t dt_metric_acc_samples(const dt_metric_acc *a) { return (int64_t)a->state[ACC_SAMPLES]; }

double dt_metric_acc_loss(const dt_metric_acc *a) {
  return a->state[ACC_SAMPLES] > 0 ? a->state[ACC_LOSS] / a->state[ACC_SAMPLES] : NAN;
}

void dt_metric_acc_values(const dt_metric_acc *a, int train, double *v) {
  const dt_metric_set *m = &a->t->metrics;
  const int n = train ? m->n_train : m->n_eval;
  if (a->state[ACC_SAMPLES] <= 0) {
    for (int i = 0; i < n; i++) v[i] = NAN;
    return;
  }
  a->t->ops->values(a, train, v);
}

dt_status dt_metric_detail_alloc(dt_metric_detail *d, int k, int per_class) {
  memset(d, 0, sizeof *d);
  d->k = k;
  dt_status st = dt_alloc_array((size_t)k, sizeof(double), "metric detail", (void **)&d->value);
  if (st == DT_OK && per_class) st = dt_alloc_array((size_t)k, sizeof(double), "metric detail", (void **)&d->samples);
  if (st == DT_OK && per_class)
    st = dt_alloc_array((size_t)k * (size_t)k, sizeof(double), "confusion matrix", (void **)&d->confusion);
  if (st != DT_OK) dt_metric_detail_free(d);
  return st;
}

void dt_metric_detail_free(dt_metric_detail *d) {
  if (!d) return;
  dt_free(d->confusion);
  dt_free(d->samples);
  dt_free(d->value);
  memset(d, 0, sizeof *d);
}

dt_status dt_metric_acc_detail(const dt_metric_acc *a, dt_metric_detail *out) {
  memset(out, 0, sizeof *out);
  if (!a->detail || !a->t->ops->detail || a->state[ACC_SAMPLES] <= 0) return DT_OK;
  return a->t->ops->detail(a, out);
}

/* ---- the detail as JSON ------------------------------------------------------------------ */

__attribute__((format(printf, 4, 5))) static dt_status json_printf(char *buf, size_t len, size_t *pos,
                                                                  const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = *pos < len ? vsnprintf(buf + *pos, len - *pos, fmt, ap) : -1;
  va_end(ap);
  if (k < 0 || *pos + (size_t)k >= len) return dt_error(DT_INVALID_ARGUMENT, "metric detail does not fit %zu bytes", len);
  *pos += (size_t)k;
  return DT_OK;
}

static dt_status json_array(char *buf, size_t len, size_t *pos, const char *name, const double *v, size_t n,
                             size_t stride) {
  if (name) DT_CHECK(json_printf(buf, len, pos, "\"%s\":", name));
  DT_CHECK(json_printf(buf, len, pos, "["));
  for (size_t i = 0; i < n; i++) {
    const double x = v[i * stride];
    if (isfinite(x))
      DT_CHECK(json_printf(buf, len, pos, "%s%.6g", i ? "," : "", x));
    else
      DT_CHECK(json_printf(buf, len, pos, "%snull", i ? "," : ""));
  }
  return json_printf(buf, len, pos, "]");
}

/* The detail's members: "<value_key>":[...], and per class "per_class_samples":[...],"confusion":[[...],...]. */
static dt_status detail_members(const dt_metric_detail *d, char *buf, size_t len) {
  size_t pos = 0;
  const size_t k = (size_t)d->k;
  DT_CHECK(json_array(buf, len, &pos, d->value_key, d->value, k, 1));
  if (d->samples) {
    DT_CHECK(json_printf(buf, len, &pos, ","));
    DT_CHECK(json_array(buf, len, &pos, "per_class_samples", d->samples, k, 1));
  }
  if (!d->confusion) return DT_OK;
  DT_CHECK(json_printf(buf, len, &pos, ",\"confusion\":["));
  for (size_t r = 0; r < k; r++) {
    if (r) DT_CHECK(json_printf(buf, len, &pos, ","));
    DT_CHECK(json_array(buf, len, &pos, NULL, d->confusion + r * k, k, 1));
  }
  return json_printf(buf, len, &pos, "]");
}

dt_status dt_metric_acc_detail_json(const dt_metric_acc *a, char *buf, size_t len) {
  if (len) buf[0] = '\0';
  dt_metric_detail d;
  DT_CHECK(dt_metric_acc_detail(a, &d));
  dt_status st = d.k > 0 ? detail_members(&d, buf, len) : DT_OK;
  dt_metric_detail_free(&d);
  return st;
}
