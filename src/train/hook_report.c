/* Run hook "report": report.html rewritten after every epoch and at the end, with a throughput curve over time. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "io/report.h"
#include "train/run.h"

typedef struct report_state {
  double samples, t0; /* the current window of --log-every steps */
  double compute_s, data_s, comm_s; /* rank 0's time split so far */
  dt_report_point *points;
  int n;
  int64_t cap;
} report_state;

static dt_status start(dt_run *r) {
  if (!r->cfg->out_dir || !r->lead) return DT_OK;
  DT_CHECK(dt_alloc(sizeof *r->report, (void **)&r->report));
  r->report->t0 = dt_time_now();
  return DT_OK;
}

static dt_status batch(dt_run *r, int n, double loss_sum, const double *sums) {
  (void)loss_sum, (void)sums;
  if (r->report) r->report->samples += n;
  return DT_OK;
}

/* A throughput point (the job's samples/s over the window) every --log-every steps. */
static dt_status step(dt_run *r, const dt_step_event *e) {
  report_state *s = r->report;
  if (!s || e->step % r->cfg->log_every != 0) return DT_OK;
  const double now = dt_time_now(), dt = now - s->t0;
  if (s->samples > 0 && dt > 0) {
    DT_CHECK(dt_grow_array((void **)&s->points, &s->cap, s->n, s->n + 1, 256, sizeof *s->points, "throughput points"));
    s->points[s->n++] = (dt_report_point){.t_s = now - r->t_start, .samples_per_s = s->samples * r->world / dt};
  }
  s->samples = 0;
  s->t0 = now;
  return DT_OK;
}

/* out_dir/report.html from the history so far; ranks: (world, RK_N) figures or NULL (rank 0's own split). */
static dt_status write_report(dt_run *r, const dt_train_result *res, const double *ranks) {
  const dt_train_config *c = r->cfg;
  char path[4096], title[256];
  DT_CHECK(dt_run_path(r, "report.html", path, sizeof path));
  snprintf(title, sizeof title, "%s on %s (%s, %d rank%s)", c->model, c->data, r->strategy->name, r->world,
           r->world == 1 ? "" : "s");
  const int world = ranks ? r->world : 1;
  dt_report_rank *split = NULL;
  DT_CHECK(dt_alloc_array((size_t)world, sizeof *split, "report", (void **)&split));
  for (int q = 0; ranks && q < world; q++) {
    const double *v = ranks + (size_t)q * RK_N;
    split[q] = (dt_report_rank){.compute_s = v[RK_COMPUTE], .data_s = v[RK_DATA], .comm_s = v[RK_COMM]};
  }
  if (!ranks) split[0] = (dt_report_rank){res->compute_seconds, res->data_wait_seconds, res->comm_seconds};
  dt_metric_detail detail;
  dt_status st = dt_metric_acc_detail(r->eval_acc, &detail);
  if (st != DT_OK) {
    dt_free(split);
    return st;
  }
  dt_report rep = {.title = title,
                   .config_json = r->config_json,
                   .metrics = r->metrics,
                   .epochs = r->history,
                   .n_epochs = r->n_history,
                   .throughput = r->report->points,
                   .n_throughput = r->report->n,
                   .ranks = split,
                   .world = world,
                   .summary_lines = NULL,
                   .detail = &detail};
  st = dt_report_write(path, &rep);
  dt_metric_detail_free(&detail);
  dt_free(split);
  return st;
}

static dt_status epoch_end(dt_run *r, const dt_epoch_metrics *m, int complete) {
  report_state *s = r->report;
  if (!s) return DT_OK;
  s->compute_s += m->compute_seconds, s->data_s += m->data_wait_seconds, s->comm_s += m->comm_seconds;
  if (!complete) return DT_OK;
  dt_train_result so_far;
  memset(&so_far, 0, sizeof so_far);
  so_far.compute_seconds = s->compute_s, so_far.data_wait_seconds = s->data_s, so_far.comm_seconds = s->comm_s;
  return write_report(r, &so_far, NULL);
}

static dt_status end(dt_run *r, dt_train_result *res, const double *ranks) {
  return r->report ? write_report(r, res, ranks) : DT_OK;
}

static void free_hook(dt_run *r) {
  if (r->report) dt_free(r->report->points);
  dt_free(r->report);
  r->report = NULL;
}

const dt_run_hook dt_hook_report = {
    .name = "report", .start = start, .batch = batch, .step = step, .epoch_end = epoch_end, .end = end, .free = free_hook};
