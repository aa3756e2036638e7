/* Resume: rank 0 picks and loads a snapshot; one broadcast gives every rank the decision, position and optimizer state. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "train/run.h"

/* Rank 0: loads the snapshot --resume names (auto: the newest loadable one in
 * out_dir, falling back past damaged ones) and checks it fits this run. */
static dt_status resume_load(dt_run *r, dt_resume_point *rp) {
  const dt_train_config *c = r->cfg;
  const int64_t steps_per_epoch = r->steps_per_epoch;
  char stored[sizeof r->config_json]; /* the configuration of the run that wrote the snapshot */
  dt_status st = DT_OK;
  if (strcmp(c->resume, "auto") != 0) {
    snprintf(rp->path, sizeof rp->path, "%s", c->resume);
    st = dt_snapshot_load(rp->path, c->model, r->model, r->optim, &rp->pos, &r->history, &r->n_history, stored,
                          sizeof stored);
    if (st != DT_OK) return dt_error_prefix(st, "--resume %s", c->resume);
  } else {
    int64_t before = INT64_MAX, found;
    int damaged = 0;
    for (;;) {
      st = dt_snapshot_find(c->out_dir, before, rp->path, sizeof rp->path, &found);
      if (st == DT_NOT_FOUND && damaged == 0) {
        if (c->progress) fprintf(c->progress, "resume auto: no snapshot in %s/snapshots, starting afresh\n", c->out_dir);
        dt_clear_error();
        return DT_OK;
      }
      if (st == DT_NOT_FOUND)
        return dt_error(DT_CORRUPT, "resume auto: none of the %d snapshot(s) in %s/snapshots could be loaded (see the "
                        "warnings above); delete them to start afresh", damaged, c->out_dir);
      DT_CHECK(st);
      st = dt_snapshot_load(rp->path, c->model, r->model, r->optim, &rp->pos, &r->history, &r->n_history, stored,
                            sizeof stored);
      if (st == DT_OK) break;
      if (st == DT_SHAPE_MISMATCH || st == DT_INVALID_ARGUMENT) return st; /* another model or optimizer: no fallback */
      DT_LOG_WARN("train", "resume auto: skipping a damaged snapshot: %s", dt_last_error());
      damaged++;
      before = found;
    }
  }
  DT_CHECK(dt_run_resume_compare(r, rp->path, stored)); /* prints what changed; refuses other data */
  const dt_snapshot_position *p = &rp->pos;
  int layout_differs = p->world_size != r->world || p->batch_size != c->batch_size || p->accumulate != c->accumulate ||
                       p->steps_per_epoch != steps_per_epoch;
  if (layout_differs && p->epoch_step > 0)
    return dt_error(DT_MISMATCH,
                    "%s was taken in the middle of epoch %lld with %lld rank(s), batch %lld, accumulate %lld; this run "
                    "has %d, %d, %d: resume with the same workers, --batch-size and --accumulate, or from a snapshot "
                    "taken at the end of an epoch",
                    rp->path, (long long)p->epoch + 1, (long long)p->world_size, (long long)p->batch_size,
                    (long long)p->accumulate, r->world, c->batch_size, c->accumulate);
  if (layout_differs || (uint64_t)p->seed != c->seed)
    DT_LOG_WARN("train",
                "%s was written by a run with %lld rank(s), batch %lld, seed %lld; this run differs, so it continues "
                "from the snapshot but not bit for bit as the original run would have",
                rp->path, (long long)p->world_size, (long long)p->batch_size, (long long)p->seed);
  rp->active = 1;
  return DT_OK;
}

/* With ddp, rank 0's resume decision, position and optimizer state go to every
 * rank (the model itself comes with DDP's initial broadcast): only rank 0 needs
 * the file, so hosts need no shared file system. `local` is rank 0's outcome. */
static dt_status resume_share(dt_run *r, dt_status local, dt_resume_point *rp) {
  if (!r->group) return local;
  enum { H_STATE, H_OPTIM_STEP, H_N_RNG, H_SCALER, H_POS = H_SCALER + 4, H_RNG = H_POS + 8,
         H_N = H_RNG + DT_SNAPSHOT_MAX_RNG };
  int64_t h[H_N];
  memset(h, 0, sizeof h);
  const dt_snapshot_position *p = &rp->pos;
  h[H_STATE] = local != DT_OK ? -1 : rp->active;
  if (r->rank == 0 && rp->active) {
    h[H_OPTIM_STEP] = dt_optim_step_count(r->optim);
    h[H_N_RNG] = p->n_rng;
    const int64_t v[8] = {p->epoch, p->epoch_step, p->step, p->world_size, p->batch_size, p->accumulate,
                          p->steps_per_epoch, p->seed};
    memcpy(h + H_POS, v, sizeof v);
    for (int i = 0; i < p->n_rng; i++) h[H_RNG + i] = (int64_t)p->rng_step[i];
    uint32_t bits;
    memcpy(&bits, &p->loss_scale, sizeof bits);
    const int64_t s[4] = {p->has_scaler, bits, p->growth_tracker, p->skipped_steps};
    memcpy(h + H_SCALER, s, sizeof s);
  }
  DT_CHECK(dt_broadcast(r->group, h, H_N, DT_I64, 0, NULL));
  if (h[H_STATE] < 0)
    return r->rank == 0 ? local : dt_error(DT_MISMATCH, "rank 0 could not resume from a snapshot (its error says why)");
  if (r->rank == 0 || h[H_STATE] == 0) return DT_OK;
  dt_snapshot_position q;
  memset(&q, 0, sizeof q);
  q.epoch = h[H_POS];
  q.epoch_step = h[H_POS + 1];
  q.step = h[H_POS + 2];
  q.world_size = h[H_POS + 3];
  q.batch_size = h[H_POS + 4];
  q.accumulate = h[H_POS + 5];
  q.steps_per_epoch = h[H_POS + 6];
  q.seed = h[H_POS + 7];
  q.n_rng = (int)h[H_N_RNG];
  for (int i = 0; i < q.n_rng && i < DT_SNAPSHOT_MAX_RNG; i++) q.rng_step[i] = (uint64_t)h[H_RNG + i];
  q.has_scaler = (int)h[H_SCALER];
  const uint32_t bits = (uint32_t)h[H_SCALER + 1];
  memcpy(&q.loss_scale, &bits, sizeof bits);
  q.growth_tracker = h[H_SCALER + 2];
  q.skipped_steps = h[H_SCALER + 3];
  rp->pos = q; /* the unfinished epoch's sums stay on rank 0: they are summed over ranks at its end */
  rp->active = 1;
  dt_optim_set_step_count(r->optim, h[H_OPTIM_STEP]);
  return DT_OK;
}

/* The optimizer state of rank 0 to every rank (after resume_share). */
dt_status dt_run_resume_optim(dt_run *r) {
  if (!r->group || !r->resume.active) return DT_OK;
  for (int i = 0; i < dt_optim_num_states(r->optim); i++)
    DT_CHECK(dt_broadcast(r->group, dt_optim_state(r->optim, i, NULL), r->n_params, DT_F32, 0, NULL));
  return DT_OK;
}

dt_status dt_run_resume(dt_run *r) {
  dt_status local = r->lead ? resume_load(r, &r->resume) : DT_OK;
  DT_CHECK(resume_share(r, local, &r->resume));
  if (r->resume.active && r->lead && r->cfg->progress)
    fprintf(r->cfg->progress, "resumed from %s: epoch %lld, step %lld\n", r->resume.path,
            (long long)r->resume.pos.epoch + 1, (long long)r->resume.pos.step);
  return DT_OK;
}

