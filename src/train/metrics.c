/* Metrics files: metrics.csv, metrics.jsonl and summary.json. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"
#include "train/train_impl.h"

#define DT_PATH_MAX 4096

struct dt_metrics_writer {
  const dt_metric_set *ms;
  FILE *csv;
  FILE *jsonl;
  char csv_path[DT_PATH_MAX];
  char jsonl_path[DT_PATH_MAX];
};

dt_status dt_metrics_csv_header(const dt_metric_set *ms, char *buf, size_t len) {
  size_t o = 0;
  int k = snprintf(buf, len, "epoch,step,lr,train_loss");
  for (int i = 0; k >= 0 && i < ms->n_train_row; i++)
    o += (size_t)k, k = o < len ? snprintf(buf + o, len - o, ",train_%s", ms->train[i].name) : -1;
  if (k >= 0) o += (size_t)k, k = o < len ? snprintf(buf + o, len - o, ",test_loss") : -1;
  for (int i = 0; k >= 0 && i < ms->n_eval; i++)
    o += (size_t)k, k = o < len ? snprintf(buf + o, len - o, ",test_%s", ms->eval[i].name) : -1;
  if (k >= 0) o += (size_t)k, k = o < len ? snprintf(buf + o, len - o, ",epoch_seconds,train_samples_per_s") : -1;
  if (k < 0 || o + (size_t)k >= len) return dt_error(DT_INVALID_ARGUMENT, "metrics header longer than %zu bytes", len);
  return DT_OK;
}

static dt_status open_with_header(const char *path, const char *header, FILE **out) {
  FILE *f = fopen(path, "w");
  if (!f) return dt_error(DT_IO, "cannot write %s: %s (choose a writable --out directory)", path, strerror(errno));
  if (header && (fprintf(f, "%s\n", header) < 0 || fflush(f) != 0)) {
    int err = errno;
    fclose(f);
    return dt_error(DT_IO, "writing %s failed: %s", path, strerror(err));
  }
  *out = f;
  return DT_OK;
}

dt_status dt_metrics_open(const char *dir, const dt_metric_set *ms, dt_metrics_writer **out) {
  char csv_header[512];
  DT_CHECK(dt_metrics_csv_header(ms, csv_header, sizeof csv_header));
  dt_metrics_writer *w = NULL;
  dt_status st = dt_alloc(sizeof *w, (void **)&w);
  if (st != DT_OK) return st;
  w->ms = ms;
  if ((size_t)snprintf(w->csv_path, sizeof w->csv_path, "%s/metrics.csv", dir) >= sizeof w->csv_path ||
      (size_t)snprintf(w->jsonl_path, sizeof w->jsonl_path, "%s/metrics.jsonl", dir) >= sizeof w->jsonl_path) {
    st = dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
    goto fail;
  }
  DT_CHECK_GOTO(open_with_header(w->csv_path, csv_header, &w->csv), st, fail);
  DT_CHECK_GOTO(open_with_header(w->jsonl_path, NULL, &w->jsonl), st, fail);
  *out = w;
  return DT_OK;
fail:
  dt_metrics_close(w);
  return st;
}

/* JSON has no NaN/Infinity: write null for them. */
static void json_num(FILE *f, const char *key, double v, const char *fmt) {
  fprintf(f, ",\"%s\":", key);
  if (isfinite(v))
    fprintf(f, fmt, v);
  else
    fputs("null", f);
}

/* A CSV value: empty for NaN (no validation data, or a metric undefined for the data). */
static void csv_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, ",%.6f", v);
  else
    fputc(',', f);
}

static void json_metrics(FILE *f, const char *prefix, const dt_metric_desc *d, const double *v, int n) {
  char key[64];
  for (int i = 0; i < n; i++) {
    snprintf(key, sizeof key, "%s_%s", prefix, d[i].name);
    json_num(f, key, v[i], "%.6f");
  }
}

dt_status dt_metrics_write(dt_metrics_writer *w, const dt_epoch_metrics *m) {
  const dt_metric_set *ms = w->ms;
  fprintf(w->csv, "%d,%lld,%.6g", m->epoch, (long long)m->step, (double)m->lr);
  csv_num(w->csv, m->train_loss);
  for (int i = 0; i < ms->n_train_row; i++) csv_num(w->csv, m->train_metric[i]);
  csv_num(w->csv, m->test_loss);
  for (int i = 0; i < ms->n_eval; i++) csv_num(w->csv, m->test_metric[i]);
  fprintf(w->csv, ",%.3f,%.1f\n", m->epoch_seconds, m->train_samples_per_s);
  fprintf(w->jsonl, "{\"epoch\":%d,\"step\":%lld", m->epoch, (long long)m->step);
  json_num(w->jsonl, "lr", m->lr, "%.6g");
  json_num(w->jsonl, "train_loss", m->train_loss, "%.6f");
  json_metrics(w->jsonl, "train", ms->train, m->train_metric, ms->n_train_row);
  json_num(w->jsonl, "test_loss", m->test_loss, "%.6f");
  json_metrics(w->jsonl, "test", ms->eval, m->test_metric, ms->n_eval);
  json_num(w->jsonl, "epoch_seconds", m->epoch_seconds, "%.3f");
  json_num(w->jsonl, "train_samples_per_s", m->train_samples_per_s, "%.1f");
  json_num(w->jsonl, "compute_seconds", m->compute_seconds, "%.3f");
  json_num(w->jsonl, "data_wait_seconds", m->data_wait_seconds, "%.3f");
  json_num(w->jsonl, "comm_seconds", m->comm_seconds, "%.3f");
  json_num(w->jsonl, "eval_seconds", m->eval_seconds, "%.3f");
  fputs("}\n", w->jsonl);
  if (fflush(w->csv) != 0 || ferror(w->csv))
    return dt_error(DT_IO, "writing %s failed: %s", w->csv_path, strerror(errno));
  if (fflush(w->jsonl) != 0 || ferror(w->jsonl))
    return dt_error(DT_IO, "writing %s failed: %s", w->jsonl_path, strerror(errno));
  return DT_OK;
}

void dt_metrics_close(dt_metrics_writer *w) {
  if (!w) return;
  if (w->jsonl) fclose(w->jsonl);
  if (w->csv) fclose(w->csv);
  dt_free(w);
}

/* ,"test_<name>":value for each evaluation metric (null for NaN). */
static size_t summary_metrics(char *buf, size_t len, const dt_metric_set *ms, const double *v) {
  size_t o = 0;
  for (int i = 0; i < ms->n_eval && o < len; i++) {
    int k = isfinite(v[i]) ? snprintf(buf + o, len - o, ",\"test_%s\":%.6f", ms->eval[i].name, v[i])
                           : snprintf(buf + o, len - o, ",\"test_%s\":null", ms->eval[i].name);
    if (k < 0) break;
    o += (size_t)k;
  }
  return o;
}

dt_status dt_train_write_summary(const char *dir, const char *model, const dt_train_result *r, const char *detail) {
  char path[4096], text[4096];
  size_t pos = 0;
  if ((size_t)snprintf(path, sizeof path, "%s/summary.json", dir) >= sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "output directory path too long: %s", dir);
  pos += (size_t)snprintf(text, sizeof text, "{\"model\":");
  if (!dt_json_escape(text, sizeof text, &pos, model)) return dt_error(DT_INVALID_ARGUMENT, "model name too long");
  pos += (size_t)snprintf(text + pos, sizeof text - pos,
           ",\"task\":\"%s\",\"epochs_done\":%d,\"interrupted\":%s,\"steps\":%lld,\"params\":%zu,"
           "\"wall_seconds\":%.3f,\"cpu_user_seconds\":%.3f,\"cpu_sys_seconds\":%.3f,"
           "\"train_samples_per_s\":%.1f,\"infer_samples_per_s\":%.1f,"
           "\"compute_seconds\":%.3f,\"data_wait_seconds\":%.3f,\"comm_seconds\":%.3f,",
           dt_task_kind_name(r->task), r->epochs_done, r->interrupted ? "true" : "false", (long long)r->steps,
           r->params, r->wall_seconds, r->cpu_user_seconds, r->cpu_sys_seconds, r->train_samples_per_s,
           r->infer_samples_per_s, r->compute_seconds, r->data_wait_seconds, r->comm_seconds);
  if (pos < sizeof text) {
    int k = isfinite(r->test_loss) ? snprintf(text + pos, sizeof text - pos, "\"test_loss\":%.6f", r->test_loss)
                                   : snprintf(text + pos, sizeof text - pos, "\"test_loss\":null");
    pos += k > 0 ? (size_t)k : 0;
  }
  if (pos < sizeof text) pos += summary_metrics(text + pos, sizeof text - pos, &r->metrics, r->test_metric);
  if (pos < sizeof text)
    pos += (size_t)snprintf(text + pos, sizeof text - pos,
                            ",\"peak_rss_bytes\":%zu,\"world_size\":%d,\"backend\":\"%s\",\"comm_total_seconds\":%.3f,"
                            "\"comm_critical_seconds\":%.3f,\"comm_critical_total_seconds\":%.3f,\"comm_hidden\":%.4f",
                            r->peak_rss_bytes, r->world_size > 0 ? r->world_size : 1, r->backend,
                            r->comm_total_seconds, r->comm_critical_seconds, r->comm_critical_total_seconds,
                            r->comm_hidden);
  if (pos < sizeof text && r->ddp.steps > 0) {
    const dt_ddp_stats *d = &r->ddp;
    pos += (size_t)snprintf(text + pos, sizeof text - pos,
                            ",\"comm_bytes_per_step\":%.0f,\"shared_grads\":%s,\"shared_allreduces\":%llu,"
                            "\"sharded_update\":%s,\"fused_update\":%s,\"embedding_exchange\":{"
                            "\"sparse_exchanges\":%lld,\"sparse_bytes\":%.0f,\"dense_exchanges\":%lld,"
                            "\"dense_bytes\":%.0f}",
                            d->bytes / (double)d->steps, d->shared_grads ? "true" : "false",
                            (unsigned long long)d->shared_allreduces, d->sharded_update ? "true" : "false",
                            d->fused_update ? "true" : "false",
                            (long long)d->rows_sparse, d->rows_sparse_bytes, (long long)d->rows_dense,
                            d->rows_dense_bytes);
  }
  if (pos < sizeof text && r->amp != DT_AMP_OFF)
    pos += (size_t)snprintf(text + pos, sizeof text - pos, ",\"amp\":\"%s\",\"loss_scale\":%.9g,\"skipped_steps\":%lld",
                            r->amp == DT_AMP_BF16 ? "bf16" : "fp16", (double)r->loss_scale,
                            (long long)r->amp_skipped_steps);
  if (pos < sizeof text && r->skipped_images > 0)
    pos += (size_t)snprintf(text + pos, sizeof text - pos, ",\"skipped_images\":%lld", (long long)r->skipped_images);
  if (pos < sizeof text && r->skipped_rows > 0)
    pos += (size_t)snprintf(text + pos, sizeof text - pos, ",\"skipped_rows\":%lld", (long long)r->skipped_rows);
  if (pos >= sizeof text) return dt_error(DT_INTERNAL, "summary longer than %zu bytes", sizeof text);
  /* The detail (a confusion matrix of many classes) can be large: it is streamed after the fixed part. */
  dt_atomic_file a;
  DT_CHECK(dt_atomic_open(&a, path));
  dt_atomic_write(&a, text, pos);
  if (detail && *detail) {
    dt_atomic_write(&a, ",\"eval\":{", 9);
    dt_atomic_write(&a, detail, strlen(detail));
    dt_atomic_write(&a, "}", 1);
  }
  dt_atomic_write(&a, "}\n", 2);
  return dt_atomic_commit(&a);
}
