/* Data-parallel strategies over a dt_model: DDP (one process per worker,
 * gradients all-reduced in buckets while backward runs, like PyTorch's
 * DistributedDataParallel) and DP (one process, worker threads each on a slice
 * of the batch, like nn.DataParallel). */
#ifndef DTRAIN_PARALLEL_H
#define DTRAIN_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/dist.h"
#include "dtrain/model.h"
#include "dtrain/model_ctx.h"
#include "dtrain/optim.h"
#include "dtrain/status.h"
#include "dtrain/task.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- DDP ----------------------------------------------------------------------
 *
 *   dt_ddp *d;  dt_ddp_new(model, group, NULL, &d);   // checks + broadcasts from rank 0
 *   for each step:
 *     dt_ddp_before_forward(d);                        // buffers from rank 0 (BN statistics)
 *     dt_model_zero_grad(model); forward; loss; dt_model_backward(model, dlogits);
 *                                                      // full buckets all-reduce during backward
 *     dt_ddp_finish(d);                                // waits: gradients averaged over ranks
 *     optimizer step
 */
typedef enum dt_comm_hook {
  DT_COMM_HOOK_NONE = 0, /* all-reduce f32 gradients */
  DT_COMM_HOOK_BF16,     /* divide by world size, cast to bf16, all-reduce, cast back (PyTorch's bf16_compress_hook) */
  DT_COMM_HOOK_FP16,     /* same with f16 (fp16_compress_hook) */
} dt_comm_hook;

/* How the gradient of a row table (an embedding) is exchanged: AUTO decides
 * every step, from that step's lookups (equal on every rank), whichever moves
 * fewer bytes: an all-gather of the touched rows (ids and values) or the dense
 * all-reduce of the whole table. */
typedef enum dt_rows_exchange { DT_ROWS_AUTO = 0, DT_ROWS_DENSE, DT_ROWS_SPARSE } dt_rows_exchange;

typedef struct dt_ddp_config {
  double bucket_cap_mb;       /* bucket size cap, MiB (PyTorch: 25) */
  double first_bucket_mb;     /* the first bucket (last layers), MiB (PyTorch: 1) */
  int broadcast_buffers;      /* 1: dt_ddp_before_forward broadcasts buffers from rank 0 (PyTorch default) */
  int find_unused_parameters; /* 1: parameters that got no gradient are reduced as zeros; 0: that is an error */
  dt_comm_hook comm_hook;     /* row tables are exchanged in f32 whatever the hook */
  dt_rows_exchange rows_exchange;
  int auto_buckets;           /* 1: after the first steps, lay the buckets out from the measured backward timeline
                                 and all-reduce cost (the caps above are the first steps' layout); 0: the caps' */
  double grad_piece_mb;       /* with auto_buckets and 2 or more ranks: a weight whose gradient is larger (a Linear's)
                                 is announced by its layer in up to DT_DDP_MAX_PIECES pieces of about this size
                                 (MiB), each as soon as it is computed, and the measured layout may put them in
                                 different buckets, so the all-reduce of a large last weight starts while the rest
                                 of it is computed (a weight whose pieces the layout keeps in one bucket is computed
                                 whole again); the last bits may change (dt_model_set_grad_pieces). 0: whole
                                 tensors; < 0 (the default): auto, DT_DDP_AUTO_PIECE_MB where every rank's
                                 communication thread has a CPU of its own (comm_cpu), else 0 */
  int shared_grads;           /* 1: where the ranks share a host (shm backend), the gradient arena moves into
                                 memory they map from each other (with a comm hook the 16-bit staging arena is
                                 made there instead) and the all-reduces read it in place (0 by default here, as
                                 it moves the arena; the trainer's default is 1) */
  int comm_cpu;               /* with auto_buckets and 2 or more ranks: 1 = every rank's communication thread has a
                                 CPU of its own beside the compute threads (grad_piece_mb auto cuts weights, the
                                 measured layout is planned), 0 = they share the compute threads' CPUs (whole
                                 weights; the measured layout is one bucket after backward, row tables apart); < 0
                                 (the default): as dt_group_comm_has_cpu finds. Agreed over the ranks (the least).
                                 Last in the struct: builds before it keep the layout of the fields above */
} dt_ddp_config;
void dt_ddp_config_default(dt_ddp_config *c);
#define DT_DDP_MAX_PIECES 8
#define DT_DDP_AUTO_PIECE_MB 0.25

typedef struct dt_ddp dt_ddp;

/* Wraps a built model: verifies every rank has the same model (tensor count,
 * names, shapes: DT_MISMATCH naming the first difference and the rank),
 * broadcasts parameters and buffers from rank 0, lays buckets over the gradient
 * arena in backward order, and hooks the model's gradient-ready events. With
 * shared_grads (and no comm hook) the model's gradient arena may move into
 * shared memory (take dt_model_grads after this call); it stays the model's,
 * and the DDP must then be freed before its group. */
dt_status dt_ddp_new(dt_model *m, dt_group *g, const dt_ddp_config *cfg, dt_ddp **out);
void dt_ddp_free(dt_ddp *d);
dt_status dt_ddp_before_forward(dt_ddp *d);
/* sync 0 = PyTorch's no_sync(): backward accumulates locally, no communication;
 * the next backward with sync 1 reduces the accumulated gradients. */
void dt_ddp_set_sync(dt_ddp *d, int sync);
/* After backward: waits for every bucket (all gradients averaged; with the sharded or fused update, the
 * parameters stepped instead). */
dt_status dt_ddp_finish(dt_ddp *d);
/* The sharded update (ZeRO stage 1 within a host; off by default): where the gradients are shared (shared_grads,
 * every rank on the host, no compression hook, no row tables), the model's parameters and o's state move into one
 * memory for the host's ranks (dt_group_share_common: take dt_model_params and dt_optim_state afresh), and each
 * bucket's all-reduce averages this rank's share of the gradients and steps that share of the parameters with o
 * while it is in cache (dt_allreduce_shards). Nobody then copies the averaged gradients back nor repeats the
 * others' updates: dt_ddp_finish returns with the parameters stepped (the same bits as dt_optim_step after it),
 * and the caller must not step o itself. For callers that read the averaged gradients nowhere (no clipping, no
 * loss-scale check, no gradient statistics): the whole gradient arena is then unspecified (this rank's gradients or
 * the averages, bucket by bucket). Layers announce their gradients after their whole backward
 * (dt_model_set_ready_late). o must be the model's size and outlive d; after dt_ddp_free the parameters and state
 * stay in the common memory. A dt_ddp_finish that fails may leave the step applied to some buckets only (restore
 * from a snapshot). Its time counts as the all-reduces' (dt_ddp_stats.comm_s). *on: 1 if the update is now DDP's,
 * 0 where it cannot be (logged), the caller then stepping o as before. Call it between steps, once. */
dt_status dt_ddp_set_optim(dt_ddp *d, dt_optim *o, int *on);
/* The fused update: under the same conditions, with the same duties for the caller (no stepping o, no reading the
 * averaged gradients, dt_ddp_set_lr before each synchronised backward, a failed dt_ddp_finish may leave some
 * buckets stepped), but the parameters and o's state stay this rank's own: every rank steps every piece of the
 * average with o as its bucket's all-reduce hands it over (dt_allreduce_each), its own share just reduced, the
 * others' shares where they lie in the others' memory, instead of copying those into its gradients and stepping
 * after. The same bits as dt_optim_step after a plain all-reduce. *on as for dt_ddp_set_optim; one of the two, once,
 * between steps. */
dt_status dt_ddp_fuse_optim(dt_ddp *d, dt_optim *o, int *on);
/* The sharded or fused update's learning rate for the next synchronised step, before its backward (none set: the
 * step fails with DT_INVALID_ARGUMENT naming it). */
void dt_ddp_set_lr(dt_ddp *d, float lr);

typedef struct dt_ddp_stats {
  int buckets;             /* number of buckets */
  int64_t steps;           /* synchronised steps so far */
  double comm_s;           /* seconds all-reduces ran (on the communication thread) */
  double wait_s;           /* seconds dt_ddp_finish waited for them: the part not hidden behind backward */
  double bytes;            /* bytes all-reduced (row tables: all-gathered, this rank's payload) so far */
  int64_t rows_sparse, rows_dense; /* row-table exchanges as touched rows / as the dense table */
  double rows_sparse_bytes, rows_dense_bytes; /* this rank's payload bytes of each */
  int shared_grads;        /* 1: the gradient arena (with a hook, its staging arena) is memory the ranks share
                              (all-reduces read it in place) */
  uint64_t shared_allreduces; /* all-reduces of the group run in place on shared memory so far (the measured
                                 layout's probe, 10 of them, included) */
  int sharded_update;      /* 1: the optimizer's step is DDP's, each rank on its share (dt_ddp_set_optim) */
  int fused_update;        /* 1: the optimizer's step is DDP's, every rank on every piece (dt_ddp_fuse_optim) */
  int pieced_tensors;      /* weights whose layers announce their gradients in pieces (grad_piece_mb); once the
                              measured layout is made, those whose pieces it put in more than one bucket */
} dt_ddp_stats;
void dt_ddp_get_stats(const dt_ddp *d, dt_ddp_stats *s);
/* Bucket i: [offset, offset + count) of the gradient arena. */
dt_status dt_ddp_bucket(const dt_ddp *d, int i, size_t *offset, size_t *count);

/* ---- DP -----------------------------------------------------------------------
 * One process, `workers` threads, each with its own activations and gradients
 * over the shared parameters; a batch is cut into `workers` contiguous slices. */
typedef struct dt_dp dt_dp;

/* max_batch: the largest whole batch. The compute thread budget (dt_get_threads)
 * is shared among the workers. */
dt_status dt_dp_new(dt_model *m, int workers, int max_batch, dt_dp **out);
void dt_dp_free(dt_dp *d);
/* Forward, the task's training loss (mean over the whole batch) and backward
 * of every slice in parallel; the gradients of the whole batch are ACCUMULATED
 * into the model's gradient arena (as dt_model_backward does), equal to what
 * one forward/backward of the whole batch would give. x (batch, input) and
 * target (batch, the task's target width) are sliced by sample. The task's
 * counters of the batch (dt_task_num_sums of them) are ADDED to sums. loss
 * and sums may be NULL. */
dt_status dt_dp_train_step(dt_dp *d, const dt_task *task, const void *x, const void *target, int batch, float *loss,
                           double *sums);
/* Where set, every worker of a dt_dp_train_step first calls fill(user, lo, n) for its slice, samples [lo, lo + n)
 * of x and target, which until then need not hold them (dt_loader_fill of a dt_loader_next_unfilled batch: the
 * workers fetch their slices in parallel, into their own cores' caches); its error fails the step, naming the
 * worker. NULL: none (the default). */
typedef dt_status (*dt_dp_fill_fn)(void *user, int lo, int n);
void dt_dp_set_fill(dt_dp *d, dt_dp_fill_fn fill, void *user);
/* Inference: logits (batch, classes) into out. */
dt_status dt_dp_forward(dt_dp *d, const void *x, int batch, float *out);
/* dt_optim_step(o, the model's parameters and gradients, lr), taken by the workers in parts: bit for bit the
 * same update, without the calling thread's OpenMP pool spinning beside the workers afterwards. */
dt_status dt_dp_optim_step(dt_dp *d, dt_optim *o, float lr);
/* dt_clip_grad_norm(the model's gradients, max_norm, norm), taken by the workers in parts (the sum of squares of
 * their shares of its chunks, then the scaling of their shares of the arena): the same bits, without the calling
 * thread's OpenMP pool spinning beside the workers afterwards. Sums a fused step's gradients first. */
dt_status dt_dp_clip_grad_norm(dt_dp *d, float max_norm, float *norm);
/* Fused steps (off by default): dt_dp_train_step leaves summing the slices' gradients to the next
 * dt_dp_optim_step, whose workers sum each block of the arena and update its parameters while it is in cache
 * (one pass over the gradients and one hand-off to the workers fewer; the same bits). Until then the model's
 * gradient arena does not hold the batch's gradients: for callers that neither read nor clear them between the
 * two (no clipping, no loss scaling, no accumulation scaled in between, no zero_grad); dt_dp_reduce sums them
 * first where a caller must. A further dt_dp_train_step or dt_dp_forward sums first too. Where the step's
 * zero_grad was deferred (dt_model_zero_grad_deferred), the sums go from each worker's block into the update and
 * are never stored: after the step the arena reads as zeroed, as after dt_model_zero_grad, through dt_model_grads
 * (a pointer kept from before holds stale floats until then, as after dt_model_zero_grad_deferred); a caller that
 * reads the gradients after the update, or adds to them across updates, sums first (dt_dp_reduce) or leaves
 * fusing off. Models with row tables are reduced at once. */
void dt_dp_set_fused_step(dt_dp *d, int on);
dt_status dt_dp_reduce(dt_dp *d);
/* Worker count, and each worker's dropout step (training forwards it ran; see
 * dt_model_rng_step), for snapshots and resume. */
int dt_dp_workers(const dt_dp *d);
/* Mixed precision on every worker's context (dt_model_ctx_set_amp), and the loss scale each worker's gradient of
 * the loss is multiplied by before its backward (fp16's loss scaler; 1 by default). */
dt_status dt_dp_set_amp(dt_dp *d, dt_amp mode);
void dt_dp_set_loss_scale(dt_dp *d, float scale);
uint64_t dt_dp_rng_step(const dt_dp *d, int w);
void dt_dp_set_rng_step(dt_dp *d, int w, uint64_t step);

#ifdef __cplusplus
}
#endif
#endif
