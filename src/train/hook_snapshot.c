/* Run hook "snapshot": snapshots every N steps or epochs and where a stop request ended the run (rank 0 writes). */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/trace.h"
#include "train/run.h"

dt_status dt_run_snapshot(dt_run *r) {
  dt_snapshot_position *pos = &r->at;
  r->strategy->rng_get(r, pos);
  pos->has_scaler = r->cfg->amp == DT_AMP_FP16;
  pos->loss_scale = r->scaler.scale;
  pos->growth_tracker = r->scaler.growth_tracker;
  pos->skipped_steps = r->scaler.skipped;
  if (r->rank != 0) return DT_OK;
  char path[4096], name[64], world[16], step[32];
  snprintf(name, sizeof name, "snapshots/step-%09lld.safetensors", (long long)pos->step);
  DT_CHECK(dt_run_path(r, name, path, sizeof path));
  dt_run_meta rm;
  dt_run_meta_fill(&rm, r, r->n_history ? &r->history[r->n_history - 1] : NULL, (int)pos->epoch);
  snprintf(world, sizeof world, "%d", r->world);
  snprintf(step, sizeof step, "%lld", (long long)pos->step);
  const dt_kv extra[] = {{"dtrain.snapshot", "1"}, {"step", step}, {"world_size", world}, {"config", r->config_json}};
  memcpy(rm.kv + rm.n, extra, sizeof extra);
  const int n_meta = rm.n + (int)(sizeof extra / sizeof extra[0]);
  double t0 = dt_trace_now_us();
  dt_status st = dt_snapshot_save(path, r->model, r->optim, pos, r->history, r->n_history, rm.kv, n_meta);
  if (dt_trace_enabled()) dt_trace_span("io", "snapshot", t0, dt_trace_now_us(), NULL);
  if (st != DT_OK) return dt_error_prefix(st, "snapshot %s (the previous snapshots are intact)", path);
  snprintf(r->last_snapshot, sizeof r->last_snapshot, "%s", path);
  DT_CHECK(dt_snapshot_prune(r->cfg->out_dir, r->cfg->keep));
  DT_LOG_INFO("train", "snapshot %s (epoch %lld, step %lld)", path, (long long)pos->epoch, (long long)pos->step);
  return DT_OK;
}

/* The unfinished epoch's sums over ranks into the position (every rank takes part). */
static dt_status take_epoch_sums(dt_run *r, int reduce) {
  size_t n;
  const double *state = dt_metric_acc_sums(r->epoch_acc, &n);
  if (n > DT_SNAPSHOT_MAX_SUMS) return dt_error(DT_INTERNAL, "%zu epoch sums: at most %d", n, DT_SNAPSHOT_MAX_SUMS);
  memcpy(r->at.epoch_sums, state, n * sizeof *state);
  r->at.n_sums = (int)n;
  return reduce ? dt_run_all_sum(r, r->at.epoch_sums, n) : DT_OK;
}

/* A step snapshot; one that falls on the epoch's last step waits for its evaluation. */
static dt_status step(dt_run *r, const dt_step_event *e) {
  const int64_t every = r->cfg->save_every_steps;
  if (every <= 0 || e->step % every != 0 || e->epoch_step >= r->steps_per_epoch) return DT_OK;
  DT_CHECK(take_epoch_sums(r, 1));
  r->at.epoch = e->epoch;
  r->at.epoch_step = e->epoch_step;
  r->at.step = e->step;
  return dt_run_snapshot(r);
}

static dt_status epoch_end(dt_run *r, const dt_epoch_metrics *m, int complete) {
  const dt_train_config *c = r->cfg;
  if (!complete) return DT_OK;
  const int at_epoch = c->save_every > 0 && m->epoch % c->save_every == 0;
  const int at_step = c->save_every_steps > 0 && m->step % c->save_every_steps == 0;
  if (!at_epoch && !at_step) return DT_OK;
  dt_snapshot_position keep = r->at;
  DT_CHECK(take_epoch_sums(r, 0));
  memset(r->at.epoch_sums, 0, sizeof r->at.epoch_sums);
  r->at.epoch = m->epoch;
  r->at.epoch_step = 0;
  r->at.step = m->step;
  dt_status st = dt_run_snapshot(r);
  r->at.epoch = keep.epoch, r->at.epoch_step = keep.epoch_step;
  return st;
}

/* Where a stop request ended the run: the next run resumes at this very step. The
 * epoch's sums were summed over ranks when the epoch ended. */
static dt_status end(dt_run *r, dt_train_result *res, const double *ranks) {
  (void)ranks;
  if (!res->interrupted || !r->cfg->save_on_interrupt || !r->stopped_in_epoch) return DT_OK;
  DT_CHECK(take_epoch_sums(r, 0));
  if (r->at.epoch_step == 0) memset(r->at.epoch_sums, 0, sizeof r->at.epoch_sums);
  return dt_run_snapshot(r);
}

const dt_run_hook dt_hook_snapshot = {.name = "snapshot", .step = step, .epoch_end = epoch_end, .end = end};
