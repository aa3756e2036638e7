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
  FILE *csv;
  FILE *jsonl;
  char csv_path[DT_PATH_MAX];
  char jsonl_path[DT_PATH_MAX];
};

static const char csv_header[] =
    "epoch,step,lr,train_loss,train_acc1,test_loss,test_acc1,test_acc5,epoch_seconds,train_samples_per_s";

const char *dt_metrics_csv_header(void) { return csv_header; }

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

dt_status dt_metrics_open(const char *dir, dt_metrics_writer **out) {
  dt_metrics_writer *w = NULL;
  dt_status st = dt_alloc(sizeof *w, (void **)&w);
  if (st != DT_OK) return st;
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

dt_status dt_metrics_write(dt_metrics_writer *w, const dt_epoch_metrics *m) {
  fprintf(w->csv, "%d,%lld,%.6g,%.6f,%.6f,%.6f,%.6f,%.6f,%.3f,%.1f\n", m->epoch, (long long)m->step, (double)m->lr,
          m->train_loss, m->train_acc1, m->test_loss, m->test_acc1, m->test_acc5, m->epoch_seconds,
          m->train_samples_per_s);
  fprintf(w->jsonl, "{\"epoch\":%d,\"step\":%lld", m->epoch, (long long)m->step);
  json_num(w->jsonl, "lr", m->lr, "%.6g");
  json_num(w->jsonl, "train_loss", m->train_loss, "%.6f");
  json_num(w->jsonl, "train_acc1", m->train_acc1, "%.6f");
  json_num(w->jsonl, "test_loss", m->test_loss, "%.6f");
  json_num(w->jsonl, "test_acc1", m->test_acc1, "%.6f");
  json_num(w->jsonl, "test_acc5", m->test_acc5, "%.6f");
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

dt_status dt_train_write_summary(const char *dir, const char *model, const dt_train_result *r) {
  char path[4096], text[2048];
  size_t pos = 0;
  if ((size_t)snprintf(path, sizeof path, "%s/summary.json", dir) >= sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "output directory path too long: %s", dir);
  pos += (size_t)snprintf(text, sizeof text, "{\"model\":");
  if (!dt_json_escape(text, sizeof text, &pos, model)) return dt_error(DT_INVALID_ARGUMENT, "model name too long");
  snprintf(text + pos, sizeof text - pos,
           ",\"epochs_done\":%d,\"interrupted\":%s,\"steps\":%lld,\"params\":%zu,"
           "\"wall_seconds\":%.3f,\"cpu_user_seconds\":%.3f,\"cpu_sys_seconds\":%.3f,"
           "\"train_samples_per_s\":%.1f,\"infer_samples_per_s\":%.1f,"
           "\"compute_seconds\":%.3f,\"data_wait_seconds\":%.3f,\"comm_seconds\":%.3f,"
           "\"test_loss\":%.6f,\"test_acc1\":%.6f,\"test_acc5\":%.6f,\"peak_rss_bytes\":%zu,"
           "\"world_size\":%d,\"backend\":\"%s\",\"comm_total_seconds\":%.3f,\"comm_hidden\":%.4f}\n",
           r->epochs_done, r->interrupted ? "true" : "false", (long long)r->steps, r->params, r->wall_seconds,
           r->cpu_user_seconds, r->cpu_sys_seconds, r->train_samples_per_s, r->infer_samples_per_s,
           r->compute_seconds, r->data_wait_seconds, r->comm_seconds, r->test_loss, r->test_acc1, r->test_acc5,
           r->peak_rss_bytes, r->world_size > 0 ? r->world_size : 1, r->backend, r->comm_total_seconds, r->comm_hidden);
  return dt_file_write_text(path, text);
}
