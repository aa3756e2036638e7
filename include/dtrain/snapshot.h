/* Training snapshots: weights, optimizer state and the trainer's position in one safetensors file. */
#ifndef DTRAIN_SNAPSHOT_H
#define DTRAIN_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/checkpoint.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"
#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A snapshot is a safetensors file (written atomically, with a checksum) holding:
 *   <state_dict name>                      every model tensor, as in model.safetensors
 *   optimizer.state.<param>.<state>        optimizer state per parameter tensor, PyTorch's
 *                                          state names (momentum_buffer, exp_avg, exp_avg_sq)
 *   optimizer.step                         i64 (1): optimizer steps taken
 *   trainer.position                       i64 (8): see dt_snapshot_position
 *   trainer.rng_step                       i64 (n): dropout step of the model, or of each dp worker
 *   trainer.epoch_sums                     f64 (n): the unfinished epoch's metric state (samples, loss
 *                                          sum, the task's counters; older snapshots: loss sum, correct, samples)
 *   trainer.loss_scaler                    f64 (3), --amp fp16 only: scale, growth tracker, skipped steps
 *   trainer.history                        f64 (epochs, DT_SNAPSHOT_HISTORY_COLS): the metrics rows so far
 * and metadata "dtrain.snapshot" = "1", "model", "epoch", "step", "world_size", "config" and
 * what model.safetensors records. Snapshots live in DIR/snapshots/step-<step, 9 digits>.safetensors. */

#define DT_SNAPSHOT_MAX_RNG 1024 /* one dropout step per dp worker (dp allows up to 1024) */
#define DT_SNAPSHOT_HISTORY_COLS 21 /* 16 in snapshots of classification-only versions: still read */
#define DT_SNAPSHOT_MAX_SUMS 16

typedef struct dt_snapshot_position {
  int64_t epoch;           /* epochs completed; training resumes in epoch `epoch` (0-based) */
  int64_t epoch_step;      /* optimizer steps already taken in that epoch (0: at its start) */
  int64_t step;            /* optimizer steps in all */
  int64_t world_size;      /* ranks of the run that wrote it (1 without ddp) */
  int64_t batch_size;      /* per process */
  int64_t accumulate;      /* batches per optimizer step */
  int64_t steps_per_epoch; /* to refuse a mid-epoch resume whose epochs are cut differently */
  int64_t seed;
  double epoch_sums[DT_SNAPSHOT_MAX_SUMS]; /* the unfinished epoch's metric state (dt_metric_acc_sums), all ranks */
  int n_sums;
  int n_rng;
  uint64_t rng_step[DT_SNAPSHOT_MAX_RNG];
  int has_scaler;          /* --amp fp16: the loss scaler's state below is saved and resumed */
  float loss_scale;
  int64_t growth_tracker, skipped_steps;
} dt_snapshot_position;

/* Path of the newest snapshot in dir/snapshots whose step is below `before`
 * (INT64_MAX: any) into buf, and its step in *step. DT_NOT_FOUND when there is none.
 * Only the name is looked at: loading checks the content. */
dt_status dt_snapshot_find(const char *out_dir, int64_t before, char *buf, size_t len, int64_t *step);

/* Writes model tensors only (no optimizer or trainer state) from a snapshot or a
 * weights file at src to dst, atomically, keeping the weights' metadata. */
dt_status dt_snapshot_export(const char *src, const char *dst);

#ifdef __cplusplus
}
#endif
#endif
