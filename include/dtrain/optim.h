/* Optimizers (SGD, Adam, AdamW with PyTorch's update rules), LR schedules, gradient clipping. */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_optim_kind { DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW } dt_optim_kind;

typedef struct dt_optim_config {
  dt_optim_kind kind;
  float weight_decay; /* SGD/Adam: L2 added to the gradient; AdamW: decoupled */
  /* SGD */
  float momentum, dampening;
  int nesterov; /* needs momentum > 0 and dampening == 0, as PyTorch */
  /* Adam / AdamW */
  float beta1, beta2, eps;
} dt_optim_config;

/* PyTorch's defaults for kind (SGD: all 0; Adam: betas 0.9, 0.999, eps 1e-8;
 * AdamW: the same with weight_decay 0.01). */
void dt_optim_config_default(dt_optim_kind kind, dt_optim_config *cfg);
/* "sgd", "adam", "adamw" */
dt_status dt_optim_kind_parse(const char *s, dt_optim_kind *out);
const char *dt_optim_kind_name(dt_optim_kind k);

/* State (momentum buffer, exp_avg, exp_avg_sq) lives in flat buffers parallel
 * to the parameter arena of `count` floats. Invalid hyper-parameters are
 * DT_INVALID_ARGUMENT naming the value. */
typedef struct dt_optim dt_optim;
dt_status dt_optim_new(const dt_optim_config *cfg, size_t count, dt_optim **out);
void dt_optim_free(dt_optim *o);
/* One update of params (count) from grads (count) at learning rate lr
 * (finite, >= 0, else DT_INVALID_ARGUMENT). params and grads must not
 * overlap. Bit-compatible with torch.optim 1.13 on CPU (foreach off) when the
 * hyper-parameters are float values. */
dt_status dt_optim_step(dt_optim *o, float *params, const float *grads, float lr);
/* The same step taken in parts on several threads (DataParallel's workers, so no other thread pool runs
 * beside them): dt_optim_begin_step once (checks lr, counts the step), then dt_optim_step_part for every k in
 * [0, parts), each part on any one thread; together bit for bit dt_optim_step's update. */
dt_status dt_optim_begin_step(dt_optim *o, float lr);
void dt_optim_step_part(dt_optim *o, float *params, const float *grads, float lr, int k, int parts);
/* The same step over elements [lo, hi) of the arena only, on the calling thread (after dt_optim_begin_step):
 * the update is element by element, so ranges tiling [0, count) in any way, on any threads, give dt_optim_step's
 * bits. For callers that update a block while its gradient, just computed, is in cache. */
void dt_optim_step_range(dt_optim *o, float *params, const float *grads, float lr, size_t lo, size_t hi);
/* The same with the range's gradients at g, apart from any arena (g[0] is element lo's): for callers that reduce
 * a block of gradients into a buffer of their own and update it from there. */
void dt_optim_step_block(dt_optim *o, float *params, const float *g, float lr, size_t lo, size_t hi);
/* Where other cores read the parameters between steps (DataParallel's workers, DDP's sharded update), on: the two
 * calls above step each block in a copy and write it back with streaming stores, which invalidate the readers'
 * copies of the lines without first taking them from their caches (an ordinary store of a line another core has
 * read waits for that). The same bits. Measured on 2 Zen 5 vCPUs, updating half of 1.4 M parameters the other core
 * had just read: 518 us with ordinary stores, 136 streamed; the next full read no slower. Off by default: a process
 * alone re-reads its parameters from its own cache. */
void dt_optim_set_shared_params(dt_optim *o, int on);
/* Row-wise ("sparse") update: the parameters outside the row tables t[0..n)
 * (arena order, disjoint; dtrain/model_ctx.h) get dt_optim_step's update, and
 * each table only its touched rows, as PyTorch steps an nn.Embedding(sparse=True):
 * SGD as torch.optim.SGD on a sparse gradient (momentum and weight decay are
 * refused: torch densifies them), Adam as torch.optim.SparseAdam (moments of
 * untouched rows stay as they are; AdamW and weight decay are refused, as
 * SparseAdam has none). The step count is shared. DT_INVALID_ARGUMENT naming
 * the refused setting. */
struct dt_rows;
dt_status dt_optim_step_rows(dt_optim *o, float *params, const float *grads, float lr, const struct dt_rows *t, int n);
/* DT_INVALID_ARGUMENT unless cfg allows row-wise updates (see dt_optim_step_rows). */
dt_status dt_optim_rows_check(const dt_optim_config *cfg);
/* Parameter groups without weight decay (transformers' "no_decay" group: biases,
 * LayerNorm weights): the arena ranges [lo, lo + n) listed take weight decay 0,
 * every other element the configured weight_decay, as torch.optim given two
 * param groups. Ranges in any order, disjoint, inside the arena, else
 * DT_INVALID_ARGUMENT naming the range; n = 0 removes the table. The table is
 * built once into work items of one decay each (arena order), so a step costs
 * no per-tensor branching. Row-wise steps refuse a table (they allow no weight
 * decay anyway). */
typedef struct dt_optim_range {
  size_t lo, n; /* elements of the parameter arena */
} dt_optim_range;
dt_status dt_optim_set_no_decay(dt_optim *o, const dt_optim_range *r, int n);
/* Elements set to take no weight decay by dt_optim_set_no_decay (0 without a table). */
size_t dt_optim_no_decay_count(const dt_optim *o);
/* Steps taken so far (Adam's bias correction uses it). */
int64_t dt_optim_step_count(const dt_optim *o);
/* The state buffers, for checkpoints: i in 0..n-1, each `count` floats, named
 * as in PyTorch's optimizer state ("momentum_buffer", "exp_avg", "exp_avg_sq"). */
int dt_optim_num_states(const dt_optim *o);
float *dt_optim_state(dt_optim *o, int i, const char **name);
/* Moves every state buffer into mem (dt_optim_state_bytes of it, 64-byte aligned; e.g. dt_group_share_common's,
 * one copy for the ranks of a host), state i at mem + i * count, the values copied there (copy 1) or found there
 * (copy 0: another process wrote them); the optimizer hands mem to release(mem, bytes) when freed. What
 * dt_optim_state returned before is invalid. DT_INVALID_ARGUMENT for an optimizer without state (plain SGD). */
dt_status dt_optim_set_state_memory(dt_optim *o, float *mem, int copy, void (*release)(void *mem, size_t bytes));
size_t dt_optim_state_bytes(const dt_optim *o);
/* The parameters it steps (dt_optim_new's count). */
size_t dt_optim_size(const dt_optim *o);
/* Restores the step count (with state buffers written through dt_optim_state). */
void dt_optim_set_step_count(dt_optim *o, int64_t steps);

/* ---- learning-rate schedules (per optimizer step) ------------------------- */
typedef enum dt_sched_kind { DT_SCHED_CONSTANT, DT_SCHED_STEP, DT_SCHED_COSINE, DT_SCHED_LINEAR } dt_sched_kind;
typedef struct dt_lr_schedule {
  dt_sched_kind kind;
  float base_lr;
  int64_t warmup_steps;  /* linear warm-up from warmup_start * base_lr (torch LinearLR); linear: from 0 */
  float warmup_start;    /* factor at step 0, default 1/3 as LinearLR; unused by linear */
  int64_t step_size;     /* step: multiply by gamma every step_size steps (StepLR) */
  float gamma;
  int64_t total_steps;   /* cosine: period T_max of CosineAnnealingLR, after warm-up;
                          * linear: num_training_steps, warm-up included */
  float min_lr;          /* cosine: eta_min */
} dt_lr_schedule;
/* The learning rate for optimizer step `step` (0-based). Warm-up runs for the
 * first warmup_steps steps, then the main schedule starts at its own step 0
 * (torch SequentialLR of LinearLR and the main scheduler). `linear` is
 * transformers' get_linear_schedule_with_warmup instead: base_lr * step / warmup
 * during warm-up (0 at step 0), then base_lr * max(0, (total - step) /
 * max(1, total - warmup)), the warm-up counted in total_steps. */
float dt_lr_at(const dt_lr_schedule *s, int64_t step);
/* Checks a schedule: DT_INVALID_ARGUMENT naming the bad field. The main
 * schedule's fields are checked only for its kind (step: step_size >= 1,
 * gamma > 0; cosine: total_steps >= 1, 0 <= min_lr <= base_lr; linear:
 * total_steps >= 1); warmup_start must be in (0, 1] when warmup_steps > 0,
 * as LinearLR's start_factor (not for linear, whose warm-up starts at 0). */
dt_status dt_lr_schedule_check(const dt_lr_schedule *s);
/* "constant", "step", "cosine", "linear" */
dt_status dt_sched_kind_parse(const char *s, dt_sched_kind *out);
const char *dt_sched_kind_name(dt_sched_kind k);

/* Scales grads so their global L2 norm is at most max_norm (torch
 * clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1).
 * Returns the norm before clipping in *norm (may be NULL); the sum of squares
 * is accumulated in double and has the same bits for any thread count.
 * max_norm <= 0 or NaN is DT_INVALID_ARGUMENT (+inf only measures). A
 * non-finite norm (NaN/inf gradients) is returned as is and the gradients are
 * left untouched, unlike torch, which would scale them all to NaN: check
 * isfinite(*norm) and skip the step. */
dt_status dt_clip_grad_norm(float *grads, size_t count, float max_norm, float *norm);
/* dt_clip_grad_norm in pieces, for callers that spread it over threads of their own (dt_dp's workers), with its
 * bits: the sum of squares is taken over dt_clip_chunks(count, &chunk) chunks of chunk gradients (the last one
 * shorter), dt_clip_chunk_sum(grads, lo, hi) each, and added in chunk order; dt_clip_coef gives the norm of that
 * sum in *norm and the factor to scale every gradient by where it is below 1 (1 where the norm is within
 * max_norm or not finite: a non-finite one is logged). max_norm is checked by the caller as dt_clip_grad_norm
 * does (dt_clip_check). */
#define DT_CLIP_MAX_CHUNKS 256 /* dt_clip_chunks' most */
size_t dt_clip_chunks(size_t count, size_t *chunk);
double dt_clip_chunk_sum(const float *grads, size_t lo, size_t hi);
float dt_clip_coef(double sum, float max_norm, float *norm);
dt_status dt_clip_check(float max_norm);

#ifdef __cplusplus
}
#endif
#endif
