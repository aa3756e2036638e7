/* Run hook "progress": the bar or plain lines during an epoch, the epoch line, and the per-rank table at the end. */
#include <math.h>
#include <stdio.h>

#include "core/impl.h"
#include "train/run.h"

static dt_status start(dt_run *r) {
  dt_progress_init(&r->prog, r->lead ? r->cfg->progress : NULL, r->cfg->progress_mode, r->cfg->epochs);
  r->prog.metrics = r->metrics;
  return DT_OK;
}

static dt_status epoch_start(dt_run *r, int epoch) {
  dt_progress_epoch_start(&r->prog, epoch + 1, r->steps_per_epoch);
  return DT_OK;
}

static dt_status step(dt_run *r, const dt_step_event *e) {
  const double loss = dt_metric_acc_loss(r->epoch_acc);
  dt_progress_step(&r->prog, e->epoch_step, loss == loss ? loss : 0, e->seen * r->world);
  return DT_OK;
}

static dt_status epoch_end(dt_run *r, const dt_epoch_metrics *m, int complete) {
  (void)complete;
  dt_progress_epoch_end(&r->prog, m);
  return DT_OK;
}

/* Every rank's time split and its own shard's first two metrics: the table users make by hand. */
static void print_rank_table(FILE *f, const dt_metric_set *ms, const double *all, int world) {
  const char *l0 = ms->eval[0].label, *l1 = ms->n_eval > 1 ? ms->eval[1].label : "";
  fprintf(f, "\n%5s %8s %8s %7s %9s %10s %9s %9s %7s %7s\n", "rank", "wall s", "user s", "sys s", "samples",
          "compute s", "data s", "comm s", l0, l1);
  for (int q = 0; q < world; q++) {
    const double *v = all + (size_t)q * RK_N;
    fprintf(f, "%5d %8.2f %8.2f %7.2f %9.0f %10.2f %9.2f %9.2f", q, v[RK_WALL], v[RK_USER], v[RK_SYS],
            v[RK_SAMPLES], v[RK_COMPUTE], v[RK_DATA], v[RK_COMM]);
    for (int i = 0; i < 2; i++) {
      if (i >= ms->n_eval) fprintf(f, " %7s", "");
      else if (isnan(v[RK_METRIC + i])) fprintf(f, " %7s", "-"); /* no validation data */
      else if (ms->eval[i].percent) fprintf(f, " %6.2f%%", 100 * v[RK_METRIC + i]);
      else fprintf(f, " %7.4f", v[RK_METRIC + i]);
    }
    fputc('\n', f);
  }
  char note[512];
  dt_progress_rank_balance(all + RK_COMPUTE, RK_N, world, note, sizeof note);
  if (note[0]) fprintf(f, "%s\n", note);
  fflush(f);
}

static dt_status end(dt_run *r, dt_train_result *res, const double *ranks) {
  (void)res;
  if (r->world > 1 && r->lead && r->cfg->progress) print_rank_table(r->cfg->progress, r->metrics, ranks, r->world);
  return DT_OK;
}

const dt_run_hook dt_hook_progress = {
    .name = "progress", .start = start, .epoch_start = epoch_start, .step = step, .epoch_end = epoch_end, .end = end};
