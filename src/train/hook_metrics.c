/* Run hook "metrics": the output directory, config.json and metrics files; the weights and summary.json at the end. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/trace.h"
#include "train/run.h"

#define PATH_MAX_LEN 4096

/* Output directory, config.json and the metrics files: before any training, so
 * an unwritable --out fails at once. A resumed run's metrics files start again
 * from the snapshot's rows (the epochs after it are trained again). */
static dt_status start(dt_run *r) {
  const dt_train_config *c = r->cfg;
  if (!c->out_dir || !r->lead) return DT_OK;
  char path[PATH_MAX_LEN];
  DT_CHECK(dt_mkdir_p(c->out_dir, 0777));
  if (c->save_every || c->save_every_steps || c->save_on_interrupt) {
    DT_CHECK(dt_run_path(r, "snapshots", path, sizeof path));
    DT_CHECK(dt_mkdir_p(path, 0777));
  }
  DT_CHECK(dt_metrics_open(c->out_dir, r->metrics, &r->metrics_writer));
  for (int i = 0; i < r->n_history; i++) DT_CHECK(dt_metrics_write(r->metrics_writer, &r->history[i]));
  size_t n = strlen(r->config_json);
  char json[sizeof r->config_json + 2];
  memcpy(json, r->config_json, n);
  memcpy(json + n, "\n", 2);
  DT_CHECK(dt_run_path(r, "config.json", path, sizeof path));
  return dt_file_write_text(path, json);
}

static dt_status epoch_end(dt_run *r, const dt_epoch_metrics *m, int complete) {
  (void)complete;
  return r->metrics_writer ? dt_metrics_write(r->metrics_writer, m) : DT_OK;
}

static dt_status save_weights(dt_run *r, const dt_train_result *res) {
  char path[PATH_MAX_LEN];
  DT_CHECK(dt_run_path(r, "model.safetensors", path, sizeof path));
  dt_run_meta rm;
  dt_run_meta_fill(&rm, r, res->last.epoch > 0 ? &res->last : NULL, res->epochs_done);
  double t0 = dt_trace_now_us();
  dt_status st = dt_model_save(r->model, path, rm.kv, rm.n);
  if (dt_trace_enabled()) dt_trace_span("io", "save weights", t0, dt_trace_now_us(), NULL);
  if (st == DT_OK) return DT_OK;
  /* The trained weights are not on disk: say where the newest state of this run is, or that there is none. */
  if (r->last_snapshot[0])
    return dt_error_prefix(st, "saving %s failed; this run's newest snapshot %s is intact (continue from it with "
                           "--resume auto, or 'dtrain export' it)", path, r->last_snapshot);
  return dt_error_prefix(st, "saving %s failed and this run wrote no snapshot: its trained weights are lost", path);
}

/* summary.json with the evaluation's detail (per-class accuracy and confusion, or per-label AUC). */
static dt_status write_summary(dt_run *r, const dt_train_result *res) {
  /* per-class figures and a (k, k) confusion matrix at most, each number up to ~16 characters */
  const size_t k = (size_t)dt_task_config_of(r->task)->outputs, len = 4096 + 16 * (k * k + 3 * k);
  char *detail = NULL;
  DT_CHECK(dt_alloc(len, (void **)&detail));
  dt_status st = dt_metric_acc_detail_json(r->eval_acc, detail, len);
  if (st == DT_OK) st = dt_train_write_summary(r->cfg->out_dir, r->cfg->model, res, detail);
  dt_free(detail);
  return st;
}

static dt_status end(dt_run *r, dt_train_result *res, const double *ranks) {
  (void)ranks;
  if (!r->cfg->out_dir || !r->lead) return DT_OK;
  DT_CHECK(save_weights(r, res));
  return write_summary(r, res);
}

static void free_hook(dt_run *r) {
  dt_metrics_close(r->metrics_writer);
  r->metrics_writer = NULL;
}

const dt_run_hook dt_hook_metrics = {
    .name = "metrics", .start = start, .epoch_end = epoch_end, .end = end, .free = free_hook};
