/* The training loop: epochs over a dataset with metrics, progress and a summary; evaluation of weights. */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain/data.h"
#include "dtrain/model_ctx.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/status.h"
#include "dtrain/task.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_TRAIN_MAX_HIDDEN 16
#define DT_TRAIN_MAX_POS_WEIGHT 64

/* How progress within an epoch is shown on dt_train_config.progress. AUTO: a
 * bar when the stream is a terminal, plain lines otherwise; NONE: only the
 * line that closes each epoch. (progress = NULL prints nothing at all.) */
typedef enum dt_progress_mode { DT_PROGRESS_AUTO, DT_PROGRESS_BAR, DT_PROGRESS_PLAIN, DT_PROGRESS_NONE } dt_progress_mode;

/* How the work is spread: one process (single), one process with worker threads
 * on slices of each batch (dp, like nn.DataParallel), or one process per worker
 * under a launcher with gradients all-reduced during backward (ddp, like
 * DistributedDataParallel). */
typedef enum dt_strategy { DT_STRATEGY_SINGLE = 0, DT_STRATEGY_DP, DT_STRATEGY_DDP } dt_strategy;
const char *dt_strategy_name(dt_strategy s);

/* Everything one training run needs. Strings are borrowed (the caller keeps
 * them alive during dt_train_run). Start from dt_train_config_default. */
/* Which samples --limit-train/--limit-test keep: the first N, or N drawn at random by the seed (the same on every
 * run, rank count and strategy; kept in index order). auto: random where the source numbers its samples class by
 * class (image folders), where the first N would be the first classes only; else the first N. */
typedef enum dt_limit_pick { DT_LIMIT_PICK_AUTO = 0, DT_LIMIT_PICK_FIRST, DT_LIMIT_PICK_RANDOM } dt_limit_pick;
const char *dt_limit_pick_name(dt_limit_pick p);

/* Test-time augmentation of evaluation (--tta): none, or the mean of the outputs of each image and its mirror. */
typedef enum dt_tta { DT_TTA_NONE = 0, DT_TTA_FLIP } dt_tta;
const char *dt_tta_name(dt_tta t);

/* --sharded-update auto's threshold. Measured on 2 Zen 5 cores (docs/benchmarks.md): a 23 MiB mlp +5% with it,
 * fashioncnn's 5.6 MiB +3.5% (alternated DDP steps) and +6% (whole runs), 7-22 MiB mlps -2..+3%, a 4 MiB one with
 * Adam -4%, a 2.7 MiB one -2% and a 0.9 MiB one -10% (each rank's forward then reads half the parameters from where
 * another core wrote them, which a small model would otherwise find in its own cache). */
#define DT_SHARDED_AUTO_MIN_BYTES (5u << 20)
/* ... and from this many bytes where a step's activations (dt_model_activation_bytes) take more than the parameters
 * and state: the step's own traffic then pushes the parameters out of the core's cache whatever the update does.
 * ResNet-20 (1.04 MiB without momentum, 172 MiB of activations at batch 64) +2.5% (alternated DDP steps and whole
 * runs); a 7,850 parameter Linear, whose input outweighs it, -9%. */
#define DT_SHARDED_AUTO_ACT_MIN_BYTES (1u << 20)

typedef struct dt_train_config {
  /* model */
  const char *model;               /* zoo name ("fashioncnn", "mlp", ...) */
  int hidden[DT_TRAIN_MAX_HIDDEN]; /* mlp hidden widths; n_hidden 0: the model's default */
  int n_hidden;
  float dropout; /* < 0: the model's default */
  int factors;        /* mf, ncf: embedding width; 0: the model's default */
  int bert_dims[4];   /* bert: layers, hidden size, heads, feed-forward size; 0: the preset's */
  float embedding_l2; /* mf, ncf: L2 on the looked-up embedding rows, weighted as the loss's mean; 0: off */
  int sparse_embeddings; /* update only the embedding rows a step touched (SparseAdam / sparse SGD) */
  int zero_init_residual; /* resnets: each block's last BN weight starts at 0 (torchvision's zero_init_residual) */
  int width;              /* resnet9, resnet20/32/56: the first stage's channels; 0: the model's own */
  const char *init_from;  /* NULL: the model's initialisation; else pretrained weights by name (dt_model_init_from):
                           * a Hugging Face checkpoint directory or a safetensors file; not with resume */
  /* data */
  const char *data;       /* data source spec (see dt_dataset_load): its train split is trained on */
  const char *val_data;   /* NULL: the source's test split, or --val-fraction; else a source evaluated on */
  double val_fraction;    /* in (0, 1): hold out this part of the training data (by seed); 0: off */
  dt_normalize normalize; /* disabled: x / 255 */
  dt_holdout holdout;     /* ratings: the default (a random --val-fraction, 0.1) or leave-last-out */
  dt_augment augment;     /* RGB images: transform preset (and its mean/std unless normalize is enabled) */
  dt_tta tta;             /* evaluation of images: none, or flip (the mean output of each image and its mirror) */
  int data_workers;       /* loader threads making batches; 0: auto (none where the fetch is cheap and the training
                           * threads fill the cores, else dt_loader_config's default); DT_LOADER_INLINE: none */
  int cache_images;       /* image folders: decode every image once into memory */
  int skip_bad_images;    /* image folders: leave out files that do not decode (counted in the summary) */
  dt_text_options text;   /* text data (.csv, .tsv): vocabulary, columns, max_len (see dt_text_options) */
  int64_t limit_train;    /* > 0: use only N training samples (shuffled among themselves each epoch) */
  int64_t limit_test;     /* > 0: evaluate on N test samples */
  dt_limit_pick limit_pick; /* which N: the first, or a random subset by seed (auto: random on class-ordered data) */
  /* loop */
  int epochs;     /* >= 1 */
  int batch_size; /* >= 1; per process with ddp (as in PyTorch), the whole batch with dp and single */
  uint64_t seed;  /* initialisation, shuffling, dropout */
  int threads;    /* compute threads (dt_set_threads); 0: all cores / DT_NUM_THREADS */
  /* optimizer (kind and hyper-parameters, PyTorch semantics) */
  dt_optim_config optim;
  float lr; /* base learning rate (> 0) */
  const char *no_decay; /* NULL: every parameter decays; else "bias,LayerNorm.weight": a parameter whose name
                         * contains any of these comma-separated patterns takes weight decay 0 (needs weight_decay > 0) */
  /* schedule, in epochs where the CLI speaks of epochs; converted to steps */
  dt_sched_kind schedule;
  int step_size_epochs; /* step: decay every N epochs (>= 1) */
  float gamma;          /* step: decay factor */
  float min_lr;         /* cosine: eta_min */
  int warmup_epochs;    /* linear warm-up length in epochs ... */
  int64_t warmup_steps; /* ... or in optimizer steps (give at most one of the two) */
  /* regularisation */
  float clip_grad_norm;  /* > 0: clip the global gradient L2 norm; 0: off */
  dt_amp amp;            /* mixed precision (autocast); fp16 adds a dynamic loss scaler (GradScaler) */
  float label_smoothing; /* classification: in [0, 1) */
  dt_regression_loss regression_loss; /* regression: MSE or L1 */
  float pos_weight[DT_TRAIN_MAX_POS_WEIGHT]; /* multilabel: BCE pos_weight per label (or one for all) */
  int n_pos_weight;                          /* 0: none */
  /* parallelism */
  dt_strategy strategy;
  int workers;          /* dp: worker threads (0: the thread budget) */
  int accumulate;       /* batches per optimizer step (>= 1; ddp reduces on the last only, like no_sync) */
  dt_ddp_config ddp;    /* ddp: buckets, buffer broadcast, unused parameters, comm hook */
  int sharded_update;   /* ddp: 1 each rank of a host steps its share of the parameters inside the all-reduces
                           (dt_ddp_set_optim) where no clipping, fp16 or row-wise step reads the gradients; -1
                           (default) where the parameters and optimizer state take DT_SHARDED_AUTO_MIN_BYTES or
                           more as well, or DT_SHARDED_AUTO_ACT_MIN_BYTES and less than the activations; 0 never */
  const char *backend;  /* ddp: auto, shm, tcp or mpi */
  const char *master;   /* ddp: "host:port" of the store instead of MASTER_ADDR/MASTER_PORT; NULL: environment */
  double timeout_s;     /* ddp: rendezvous and collective deadline; 0: DT_TIMEOUT */
  /* outputs (with ddp, rank 0 writes the files and prints progress and the per-rank table) */
  const char *out_dir;     /* NULL: write no files; else created (mkdir -p) */
  FILE *progress;          /* NULL: no progress */
  dt_progress_mode progress_mode;
  /* snapshots (out_dir/snapshots/step-<step>.safetensors, rank 0 writes) and resume */
  int save_every;           /* > 0: a snapshot after every N epochs */
  int64_t save_every_steps; /* > 0: a snapshot every N optimizer steps */
  int keep;                 /* newest snapshots kept (>= 1; older ones are deleted) */
  int save_on_interrupt;    /* a snapshot where dt_train_request_stop stopped the run */
  const char *resume;       /* NULL: start afresh; "auto": the newest loadable snapshot in out_dir, if
                             * any (a damaged one falls back to the one before); else a snapshot path */
  int overwrite;            /* out_dir holds another run's outputs: delete them first (else that is refused) */
  int allow_data_change;    /* resume: accept a snapshot trained on other data (source, split, limits, normalize) */
  /* observability */
  const char *tensorboard;  /* NULL: none; else a directory for TensorBoard event files */
  int tensorboard_all_ranks; /* ddp: every rank writes (rank R > 0 into tensorboard/rank<R>), not only rank 0 */
  int log_every;            /* TensorBoard training scalars: means over every N optimizer steps (>= 1) */
  const char *trace;        /* NULL: none; else a Chrome trace JSON file of every rank, written at the end */
} dt_train_config;

/* The defaults of `dtrain train`: fashioncnn on fashion-mnist, 1 epoch, batch
 * 64, SGD lr 0.01 with no momentum, constant schedule, seed 0, all cores, no
 * output directory, progress to nowhere. */
void dt_train_config_default(dt_train_config *cfg);
/* DT_INVALID_ARGUMENT naming the first bad field and its value. Does not touch
 * files or the zoo (an unknown model is caught by dt_train_run). */
dt_status dt_train_config_check(const dt_train_config *cfg);
/* The configuration as one JSON object (no newline) into buf; DT_INVALID_ARGUMENT if it does not fit. */
dt_status dt_train_config_json(const dt_train_config *cfg, char *buf, size_t len);

/* One row of metrics.csv / metrics.jsonl. The metrics are the task's
 * (dt_metric_set: train_metric[i] is train[i] for i < n_train_row,
 * test_metric[i] is eval[i]); rates are fractions in [0, 1]. */
typedef struct dt_epoch_metrics {
  int epoch;     /* 1-based */
  int64_t step;  /* optimizer steps taken so far (all epochs) */
  float lr;      /* learning rate of the epoch's last step */
  double train_loss;                   /* sample-weighted mean over the epoch */
  double train_metric[DT_MAX_METRICS]; /* over the epoch's training samples */
  double test_loss;                    /* the task's loss without label smoothing; NaN: no validation data */
  double test_metric[DT_MAX_METRICS];
  double epoch_seconds;       /* training part of the epoch, wall clock */
  double train_samples_per_s;
  int64_t train_samples;
  /* where the epoch's training time went (compute = epoch - data wait - comm) */
  double compute_seconds, data_wait_seconds, comm_seconds;
  double eval_seconds; /* the test pass */
  double infer_samples_per_s;
} dt_epoch_metrics;

typedef struct dt_train_result {
  int epochs_done;  /* complete epochs (an interrupted one is not counted), those before a resume included */
  int resumed_epoch; /* -1: started afresh; else the epoch (0-based) the run resumed in ... */
  int64_t resumed_step; /* ... at this optimizer step */
  char resumed_from[512]; /* the snapshot it resumed from */
  int interrupted;  /* 1: stopped by dt_train_request_stop */
  int64_t steps;    /* optimizer steps taken */
  size_t params;    /* trainable parameters */
  dt_epoch_metrics last; /* the last row written (a partial epoch when interrupted) */
  double wall_seconds;   /* whole run, loading included */
  double cpu_user_seconds, cpu_sys_seconds;
  double train_samples_per_s; /* all training samples / training time */
  double infer_samples_per_s; /* the last test pass */
  double compute_seconds, data_wait_seconds, comm_seconds; /* summed over epochs */
  double test_loss, test_metric[DT_MAX_METRICS];          /* of the last row */
  dt_metric_set metrics;      /* the names of the rows' metrics (the task's) */
  dt_task_kind task;
  size_t peak_rss_bytes;
  /* ddp: this process's place; all-reduce time in total and the part hidden behind backward */
  int rank, world_size;
  char backend[16];          /* the group's backend ("shm", "tcp", "shm+tcp", "mpi"), "" without ddp */
  double comm_total_seconds; /* all-reduces ran this long; comm_seconds of it was waited for */
  /* Per step, the least over the ranks of the wait at the step's end and of the all-reduce time, summed: the
   * wait of the rank that finished backward last is communication alone (a faster rank also waits for it).
   * Every step but the run's last (which --amp fp16 carries too); where no step was carried, this rank's
   * comm_seconds and comm_total_seconds. */
  double comm_critical_seconds, comm_critical_total_seconds;
  double comm_hidden;        /* 1 - comm_critical_seconds / comm_critical_total_seconds (0 without communication) */
  dt_ddp_stats ddp;          /* rank 0's gradient exchange: bytes, row tables as rows or dense (zero without ddp) */
  int64_t skipped_images;    /* --skip-bad-images: files of the training and validation data left out */
  int64_t skipped_rows;      /* --skip-bad-rows: malformed rows of the training and validation text left out */
  dt_amp amp;                /* the run's mixed precision */
  float loss_scale;          /* --amp fp16: the loss scaler's scale at the end ... */
  int64_t amp_skipped_steps; /* ... and the steps it skipped for an inf/NaN gradient (the whole run's) */
} dt_train_result;

/* Runs training as configured. With out_dir set, creates it and writes
 * metrics.csv and metrics.jsonl (flushed after every epoch), config.json,
 * report.html (after every epoch) and, at the end (also after a stop request),
 * model.safetensors and summary.json. An unwritable
 * out_dir fails before any training, and so does one that holds another run's
 * outputs (DT_USAGE) unless cfg->overwrite (deleted first) or cfg->resume. *res is filled on DT_OK, including a run
 * stopped by dt_train_request_stop (res->interrupted = 1). */
dt_status dt_train_run(const dt_train_config *cfg, dt_train_result *res);

/* Asks a running dt_train_run to stop at the next step boundary (it still
 * evaluates, writes metrics and weights). Async-signal-safe and thread-safe.
 * The request stays until dt_train_clear_stop.
 * Where the f32 GEMM is oneDNN's (AVX-512 CPUs; the banner says "oneDNN
 * sgemm"), do not let a signal handler run on a thread that trains: oneDNN's
 * JIT kernels point the stack pointer into the heap, where the kernel then
 * writes the signal frame (oneDNN issue 4845). Block SIGINT/SIGTERM before
 * starting threads and take them with sigwait in a thread of their own that
 * calls this, as dtrain's tools/stop_signals.c does. */
void dt_train_request_stop(void);
int dt_train_stop_requested(void);
void dt_train_clear_stop(void);

/* ---- evaluation ---------------------------------------------------------- */
typedef struct dt_eval_config {
  const char *weights; /* safetensors file written by dt_train_run / dt_model_save */
  const char *model;   /* NULL: from the file's metadata "model" */
  int hidden[DT_TRAIN_MAX_HIDDEN];
  int n_hidden;          /* 0: from the file's metadata "hidden" (or the model's default) */
  const char *data;      /* dataset name or directory; NULL: metadata "data", else "fashion-mnist" */
  dt_split split;
  dt_normalize normalize; /* used when normalize_set; otherwise from metadata "normalize" (or none) */
  int normalize_set;
  dt_augment augment;     /* RGB images: used when augment_set; otherwise from metadata "augment" (or none) */
  int augment_set;
  dt_tta tta;             /* images: used when tta_set; otherwise from metadata "tta" (or none) */
  int tta_set;
  int width;              /* resnet9, CIFAR resnets: used when > 0; otherwise from metadata "width" (or the model's) */
  dt_text_options text;   /* text data: each one given overrides the file's metadata (vocab, text_column, ...) */
  int batch_size;         /* >= 1 */
  int threads;            /* 0: all cores */
  int64_t limit;          /* > 0: only the first N samples */
  int workers;            /* > 0: DataParallel, this many worker threads on slices of each batch */
} dt_eval_config;

typedef struct dt_eval_result {
  int64_t samples;
  double loss;                   /* the task's loss without label smoothing */
  double metric[DT_MAX_METRICS]; /* metrics.eval */
  dt_metric_set metrics;
  double seconds, samples_per_s;
  char model[64];          /* the model evaluated */
  char data[512];          /* the dataset it was evaluated on */
  dt_tta tta;              /* the test-time augmentation applied (the caller's, else the weights') */
} dt_eval_result;

void dt_eval_config_default(dt_eval_config *cfg);
dt_status dt_eval_run(const dt_eval_config *cfg, dt_eval_result *res);

/* ---- recommendation ------------------------------------------------------- */
/* The top K items for one user of a recommender trained on ratings (mf, ncf): every item the
 * weights know is scored for the user in one batched forward, and the items the user rated in the
 * data (all of its ratings, whatever split training used) are left out. */
typedef struct dt_recommend_config {
  const char *weights; /* mf or ncf weights written by dt_train_run on ratings (metadata user_ids, item_ids) */
  const char *data;    /* the ratings (a MovieLens directory): exclusions, titles, genres; NULL: metadata "data" */
  int64_t user;        /* the original user id (MovieLens userId) */
  int top;             /* K >= 1 */
  int threads;         /* 0: all cores */
} dt_recommend_config;

typedef struct dt_recommendation {
  int64_t item;       /* the original item id (MovieLens movieId) */
  float score;        /* the predicted rating */
  const char *title;  /* "" when the data has none; points into the result */
  const char *genres; /* "Adventure|Comedy", or "" */
} dt_recommendation;

typedef struct dt_recommend_result {
  char model[64];
  char data[512];         /* the ratings used */
  int64_t user;
  int64_t items;          /* items the weights know */
  int64_t rated;          /* of them, rated by the user in the data (left out) */
  int n;                  /* min(top, items - rated) */
  dt_recommendation *top; /* (n) best first; equal scores by lower item id */
  char *text;             /* the titles and genres */
} dt_recommend_result;

void dt_recommend_config_default(dt_recommend_config *cfg);
/* *out (free with dt_recommend_result_free) on success. Weights without user and item ids (not a
 * recommender trained on ratings) are DT_USAGE; a user the weights do not know is DT_NOT_FOUND. */
dt_status dt_recommend(const dt_recommend_config *cfg, dt_recommend_result **out);
void dt_recommend_result_free(dt_recommend_result *r); /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
