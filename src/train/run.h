/* Internal: one training run's state, the strategy ops table (single, dp, ddp) and the run hooks. */
#ifndef DT_TRAIN_RUN_H
#define DT_TRAIN_RUN_H

#include "train/train_impl.h"

typedef struct dt_run dt_run;

/* Communication seconds so far. A rank that reaches the end of a step first waits there for the slower ones
 * too, so its wait mixes load imbalance with communication; the rank that arrives last waits for the
 * communication alone. The critical figures take, step by step, the least wait and the least all-reduce
 * time over the ranks (each on its own), summed (ddp: carried by the next agreement of the ranks, the next
 * step's stop or --amp fp16's check of the step, so a run's last step is left out unless fp16 carried it). */
typedef struct dt_comm_times {
  double waited, total;                   /* this rank: waited for at the end of steps; all-reduces ran */
  double critical_waited, critical_total; /* per step the least over the ranks, summed */
} dt_comm_times;

/* How the work is spread. The trainer's loop calls these and never asks which
 * strategy it runs; each is one file (strategy_single.c, _dp.c, _ddp.c). */
typedef struct dt_strategy_ops {
  const char *name;
  /* 1: train_batch fetches the samples of a batch the trainer took unfilled (dt_loader_next_unfilled) on the
   * threads that train on them (dt_loader_fill); 0: the trainer hands it over made (dt_loader_next). */
  int fills_batches;
  /* Joins the group and sets r->rank / r->world (before data and model). */
  dt_status (*join)(dt_run *r);
  /* Loaders over this rank's part of the training and validation sets. */
  dt_status (*make_loaders)(dt_run *r);
  /* After the model and any resume: wraps the model (ddp broadcast, dp workers). */
  dt_status (*wrap)(dt_run *r);
  /* Forward, the task's loss and backward of one batch (micro-batch of an
   * accumulation group: last = 1 on its last one); adds the task's counters. */
  dt_status (*train_batch)(dt_run *r, const dt_batch *b, int last, float *loss, double *sums);
  /* Gradients of the whole step are in the arena, averaged over ranks. */
  dt_status (*finish_step)(dt_run *r);
  /* The optimizer's dense update of the whole arena (dp: by its workers); NULL: dt_optim_step. */
  dt_status (*optim_step)(dt_run *r, float lr);
  /* --clip-grad-norm on the whole arena (dp: by its workers); NULL: dt_clip_grad_norm. */
  dt_status (*clip_grad_norm)(dt_run *r, float max_norm, float *norm);
  /* Before an evaluation pass (ddp: rank 0's batch-norm statistics to all); may be NULL. */
  dt_status (*eval_start)(dt_run *r);
  /* Evaluation forward: outputs (n, outputs) valid until the next call. */
  dt_status (*forward)(dt_run *r, const void *x, int n, const float **out);
  /* Sums over ranks in place; the exact reduction of an evaluation. */
  dt_status (*all_sum)(dt_run *r, double *v, size_t n);
  dt_status (*reduce_metrics)(dt_run *r, dt_metric_acc *acc);
  /* 1 if any rank asked to stop (every rank gets the same answer). */
  dt_status (*agree_stop)(dt_run *r, int local, int *stop);
  /* Dropout steps into / out of a snapshot position. */
  void (*rng_get)(dt_run *r, dt_snapshot_position *p);
  void (*rng_set)(dt_run *r, const dt_snapshot_position *p);
  /* Communication seconds so far (dt_comm_times). */
  void (*comm_seconds)(dt_run *r, dt_comm_times *t);
  /* The per-rank figures of every rank into all (world, n), from mine (n). */
  dt_status (*gather)(dt_run *r, const double *mine, double *all, size_t n);
  void (*free)(dt_run *r);
} dt_strategy_ops;

extern const dt_strategy_ops dt_strategy_single_ops, dt_strategy_dp_ops, dt_strategy_ddp_ops;

/* What a step event tells the hooks. */
typedef struct dt_step_event {
  int epoch;          /* 0-based */
  int64_t epoch_step; /* steps done in this epoch */
  int64_t step;       /* steps done in all */
  float lr;
  float loss;         /* of the step's last batch */
  int64_t seen;       /* samples this rank has seen in the epoch */
} dt_step_event;

/* Run hooks subscribe to the loop's events; every rank calls every hook
 * (a hook that writes files does so on rank 0; one that reduces over ranks
 * does so on all). Any callback may be NULL. */
typedef struct dt_run_hook {
  const char *name;
  dt_status (*start)(dt_run *r);
  dt_status (*epoch_start)(dt_run *r, int epoch);
  dt_status (*batch)(dt_run *r, int n, double loss_sum, const double *sums);
  dt_status (*step)(dt_run *r, const dt_step_event *e);
  dt_status (*epoch_end)(dt_run *r, const dt_epoch_metrics *m, int complete);
  dt_status (*end)(dt_run *r, dt_train_result *res, const double *ranks);
  void (*free)(dt_run *r);
} dt_run_hook;

extern const dt_run_hook dt_hook_trace, dt_hook_progress, dt_hook_metrics, dt_hook_tensorboard, dt_hook_snapshot, dt_hook_report;

/* Per-rank figures of the end-of-run table, gathered on every rank. */
enum { RK_WALL, RK_USER, RK_SYS, RK_SAMPLES, RK_COMPUTE, RK_DATA, RK_COMM, RK_COMM_TOTAL, RK_METRIC, RK_N = RK_METRIC + 2 };

/* Where a resumed run starts. */
typedef struct dt_resume_point {
  int active;
  dt_snapshot_position pos;
  char path[4096];
} dt_resume_point;

struct dt_run {
  const dt_train_config *cfg;
  const dt_strategy_ops *strategy;
  int rank, world, lead; /* lead: rank 0, writes files and prints */
  /* data */
  dt_dataset *train_src, *val_src; /* as opened (val_src: a second source or the test split) */
  dt_dataset *train, *val;         /* what is trained and evaluated (views with --val-fraction); val may be NULL */
  dt_dataset *train_unpicked, *val_unpicked; /* train/val before a random --limit-pick replaced them (NULL: none) */
  double val_fraction;             /* the part of train_src held out as val by dt_dataset_split (0: none) */
  dt_loader *train_loader, *val_loader;
  int64_t my_val;                  /* samples this rank counts in evaluation (-1: all; ddp: its real ones) */
  dt_prefix_sampler train_prefix, val_prefix;
  dt_ranking ranking;              /* the validation split's ranking protocol (ranking.n 0: none) */
  int32_t *rank_pairs;             /* (batch, 2) candidate (user, item) pairs of one forward */
  float *rank_scores;              /* (DT_RANK_BLOCK, per) scores of a block of queries */
  /* model, task, optimizer */
  dt_task *task;
  const dt_metric_set *metrics;
  dt_model *model;
  dt_optim *optim;
  float *params, *grads;
  size_t n_params;
  dt_rows *rows;                   /* (n_rows) the row tables, for row-wise optimizer steps (--sparse-embeddings) */
  int n_rows;
  float *dout;                     /* (batch, outputs) */
  dt_lr_schedule sched;
  float step_lr;                   /* the learning rate of the step under way (known before its first batch) */
  int ddp_update;                  /* ddp: the optimizer's step is made by the all-reduces (sharded or fused) */
  dt_scaler scaler;                /* --amp fp16: the dynamic loss scaler (snapshotted) */
  int64_t steps_per_epoch;
  /* strategy state */
  dt_group *group;
  dt_ddp *ddp;
  dt_dist_sampler *train_shard, *val_shard;
  dt_comm_times comm;              /* ddp: the critical figures so far, and this rank's when last carried */
  dt_dp *dp;
  float *eval_buf;                 /* dp: outputs of a whole batch */
  /* the loop's position and history */
  dt_resume_point resume;
  dt_snapshot_position at;         /* where the run is, for snapshots */
  int stopped_in_epoch;            /* a stop request ended an epoch early */
  dt_epoch_metrics *history;       /* the completed epochs' rows */
  int n_history;
  int64_t history_cap;
  dt_metric_acc *epoch_acc, *eval_acc;
  dt_tta_forward tta; /* the evaluation forward: the strategy's, averaged over mirrors under --tta flip */
  char config_json[8192];
  int clear_out;                   /* --overwrite found an earlier run's outputs: rank 0 deletes them before writing */
  char last_snapshot[4096];        /* the newest snapshot this run wrote ("" none): where the weights are if saving fails */
  double t_start;
  /* hooks' state */
  dt_progress prog;
  dt_metrics_writer *metrics_writer;
  struct dt_tb_writer *tb;
  struct run_window *window;       /* tensorboard */
  struct report_state *report;
};

/* Mixed precision (amp.c): open sets every context's mode after the strategy's wrap and names the path taken;
 * loss_scale is what the loss gradient is multiplied by (the scaler's scale under fp16, else 1); unscale runs after
 * the step's gradients are complete: it divides them by the scale, agrees on the found-inf flag across ranks,
 * updates the scaler and sets *skip when the optimizer must not step. */
dt_status dt_run_amp_open(dt_run *r);
float dt_run_amp_loss_scale(const dt_run *r);
dt_status dt_run_amp_unscale(dt_run *r, int *skip);

/* HR@K and NDCG@K of the ranking protocol (r->ranking) over this rank's
 * queries (q = rank, rank + world, ...), through the strategy's forward, into
 * r->eval_acc (which the caller reduces). eval_rank.c */
#define DT_RANK_BLOCK 256
dt_status dt_run_rank_open(dt_run *r);
dt_status dt_run_rank_eval(dt_run *r);
/* The cut-off K the task reports (0: no ranking protocol). */
int dt_run_rank_k(const dt_run *r);

/* Index data (users, items): prints, on rank 0, how many of the validation's
 * users and items no training sample has (cold start). cold_start.c */
dt_status dt_run_cold_start(dt_run *r);

/* Sums over ranks (strategy), for hooks. */
static inline dt_status dt_run_all_sum(dt_run *r, double *v, size_t n) { return r->strategy->all_sum(r, v, n); }
/* --limit-train / --limit-test by --limit-pick: where the pick is random, r->train / r->val become subsets of
 * N samples drawn by the seed (the loaders then see all of them); where it is first, the loaders take a prefix. */
dt_status dt_run_pick_limits(dt_run *r);
/* The loader threads of the run's loaders over ds (see run.c). */
int dt_run_loader_workers(const dt_run *r, const dt_dataset *ds);
/* A loader over the first `limit` samples of ds (all when limit <= 0), shuffled per epoch when asked. */
dt_status dt_run_prefix_loader(dt_run *r, const dt_dataset *ds, int shuffle, uint64_t seed, int64_t limit,
                               dt_prefix_sampler *prefix, dt_loader **out);
/* A metrics row into the history (snapshots, report). */
dt_status dt_run_history_add(dt_run *r, const dt_epoch_metrics *m);
/* "%s/<name>" into buf; DT_INVALID_ARGUMENT when too long. */
dt_status dt_run_path(const dt_run *r, const char *name, char *buf, size_t len);
/* The metadata of weights and snapshots (model, data, task, ...). */
#define DT_RUN_META_MAX 32
typedef struct dt_run_meta {
  char hidden[256], epochs[32], seed[32], m0[32], m1[32], key0[40], key1[40], norm[64], dropout[32], outputs[16];
  char pos_weight[1024], factors[16], width[16], bert_dims[48], val_fraction[32], image_mean[48], image_std[48];
  dt_kv kv[DT_RUN_META_MAX]; /* room for the snapshot's 4 more */
  int n;
} dt_run_meta;
void dt_run_meta_fill(dt_run_meta *rm, const dt_run *r, const dt_epoch_metrics *last, int epochs_done);
/* Resume (resume.c): rank 0 loads, every rank gets the decision, position and optimizer state. */
dt_status dt_run_resume(dt_run *r);
dt_status dt_run_resume_optim(dt_run *r);
/* The output directory's guard (outdir.c): rank 0 refuses one holding another run's outputs (DT_USAGE naming
 * them and the ways forward) unless --overwrite or --resume; every rank gets its answer before any file is written. */
dt_status dt_run_outdir_check(dt_run *r);
/* --overwrite: rank 0 deletes the earlier run's outputs, snapshots included (just before the hooks start). */
dt_status dt_run_outdir_clear(dt_run *r);
/* Resume: the snapshot's stored configuration against this run's (resume_config.c): differences it can honour
 * are printed ("resume: lr 0.01 -> 0.05"), a changed data set is DT_USAGE unless --allow-data-change. */
dt_status dt_run_resume_compare(dt_run *r, const char *snapshot, const char *stored);
/* --init-from (init_from.c): every rank takes the pretrained weights by name (DDP's broadcast makes rank 0's
 * the rule); rank 0 prints what was copied, what kept its initialisation and what the file had besides. */
dt_status dt_run_init_from(dt_run *r);
/* --no-decay (no_decay.c): the arena ranges of the parameters whose names match, as the optimizer's no-decay
 * table; rank 0 prints both groups' tensors and parameters, and the patterns that matched nothing. */
dt_status dt_run_no_decay(dt_run *r);
/* Writes a snapshot of the run at r->at (rank 0) and prunes beyond --keep (snapshot hook). */
dt_status dt_run_snapshot(dt_run *r);

#endif
