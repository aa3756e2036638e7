/* Run hook "tensorboard": training scalars averaged over every --log-every steps, validation scalars every epoch. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/impl.h"
#include "train/run.h"
#include "io/tensorboard.h"

/* A window of training steps: rank-local sums. */
typedef struct run_window {
  dt_metric_acc *acc;
  double t0;
} run_window;

/* Rank 0 writes into DIR, every other rank into DIR/rank<R> with --tensorboard-all-ranks. */
static dt_status start(dt_run *r) {
  const dt_train_config *c = r->cfg;
  if (!c->tensorboard || (r->rank != 0 && !c->tensorboard_all_ranks)) return DT_OK;
  char dir[4096];
  if (r->rank == 0)
    snprintf(dir, sizeof dir, "%s", c->tensorboard);
  else if ((size_t)snprintf(dir, sizeof dir, "%s/rank%d", c->tensorboard, r->rank) >= sizeof dir)
    return dt_error(DT_INVALID_ARGUMENT, "tensorboard directory name too long");
  DT_CHECK(dt_alloc(sizeof *r->window, (void **)&r->window));
  r->window->t0 = dt_time_now();
  DT_CHECK(dt_metric_acc_new(r->task, 0, &r->window->acc));
  /* The pid in the name keeps the file of a quick restart (same second) apart, as PyTorch's writer does. */
  char suffix[32];
  snprintf(suffix, sizeof suffix, ".%ld", (long)getpid());
  return dt_tb_open(dir, suffix, &r->tb);
}

static dt_status batch(dt_run *r, int n, double loss_sum, const double *sums) {
  if (r->window) dt_metric_acc_add_sums(r->window->acc, n, loss_sum, sums);
  return DT_OK;
}

/* "<name>/<split>" scalars of a metric set. */
static dt_status scalars(dt_run *r, const dt_metric_desc *d, const double *v, int n, const char *split, int64_t step) {
  char tag[64];
  for (int i = 0; i < n; i++) {
    snprintf(tag, sizeof tag, "%s/%s", d[i].name, split);
    DT_CHECK(dt_tb_scalar(r->tb, tag, step, (float)v[i]));
  }
  return DT_OK;
}

static dt_status step(dt_run *r, const dt_step_event *e) {
  run_window *w = r->window;
  if (!w || e->step % r->cfg->log_every != 0) return DT_OK;
  const double now = dt_time_now(), dt = now - w->t0;
  const double samples = (double)dt_metric_acc_samples(w->acc);
  if (samples > 0) {
    double v[DT_MAX_METRICS];
    dt_metric_acc_values(w->acc, 1, v);
    DT_CHECK(dt_tb_scalar(r->tb, "Loss/train", e->step, (float)dt_metric_acc_loss(w->acc)));
    DT_CHECK(scalars(r, r->metrics->train, v, r->metrics->n_train, "train", e->step));
    DT_CHECK(dt_tb_scalar(r->tb, "lr", e->step, e->lr));
    if (r->cfg->amp == DT_AMP_FP16) { /* the scaler after this step, and the steps it skipped so far */
      DT_CHECK(dt_tb_scalar(r->tb, "amp/loss_scale", e->step, r->scaler.scale));
      DT_CHECK(dt_tb_scalar(r->tb, "amp/skipped_steps", e->step, (float)r->scaler.skipped));
    }
    DT_CHECK(dt_tb_scalar(r->tb, "throughput/samples_per_s", e->step, (float)(dt > 0 ? samples * r->world / dt : 0)));
    DT_CHECK(dt_tb_flush(r->tb));
  }
  dt_metric_acc_reset(w->acc);
  w->t0 = now;
  return DT_OK;
}

static dt_status epoch_end(dt_run *r, const dt_epoch_metrics *m, int complete) {
  if (!r->tb || !complete || !r->val) return DT_OK;
  DT_CHECK(dt_tb_scalar(r->tb, "Loss/val", m->step, (float)m->test_loss));
  DT_CHECK(scalars(r, r->metrics->eval, m->test_metric, r->metrics->n_eval, "val", m->step));
  return dt_tb_flush(r->tb);
}

static void free_hook(dt_run *r) {
  dt_tb_close(r->tb);
  if (r->window) dt_metric_acc_free(r->window->acc);
  dt_free(r->window);
  r->tb = NULL;
  r->window = NULL;
}

const dt_run_hook dt_hook_tensorboard = {
    .name = "tensorboard", .start = start, .batch = batch, .step = step, .epoch_end = epoch_end, .free = free_hook};
