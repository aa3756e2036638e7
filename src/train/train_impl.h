/* Internal pieces of the trainer: metrics files, progress display, evaluation pass, prefix sampler. */
#ifndef DT_TRAIN_IMPL_H
#define DT_TRAIN_IMPL_H

#include <stdio.h>

#include "dtrain/checkpoint.h"
#include "dtrain/data.h"
#include "dtrain/loss.h"
#include "dtrain/task.h"
#include "dtrain/model.h"
#include "dtrain/model_ctx.h"
#include "dtrain/parallel.h"
#include "dtrain/scaler.h"
#include "dtrain/snapshot.h"
#include "dtrain/train.h"
#include "io/io-impl.h"

/* ---- files (metrics.c) -------------------------------------------------- */
/* metrics.csv + metrics.jsonl in a directory: the header is written (and
 * flushed) on open, so an unwritable directory fails before training. */
typedef struct dt_metrics_writer dt_metrics_writer;
dt_status dt_metrics_open(const char *dir, const dt_metric_set *ms, dt_metrics_writer **out);
/* One row in both files, flushed. */
dt_status dt_metrics_write(dt_metrics_writer *w, const dt_epoch_metrics *m);
void dt_metrics_close(dt_metrics_writer *w);
/* DIR/summary.json: the figures of the end-of-run table, for scripts and benchmarks; detail: the
 * evaluation's detail members (dt_metric_acc_detail_json), or NULL. */
dt_status dt_train_write_summary(const char *dir, const char *model, const dt_train_result *r, const char *detail);
/* The CSV header line (without newline) of the metric set: the column order of every row. */
dt_status dt_metrics_csv_header(const dt_metric_set *ms, char *buf, size_t len);

/* ---- progress (progress.c) ---------------------------------------------- */
typedef struct dt_progress {
  FILE *f;            /* NULL: silent */
  int bar;            /* 1: \r-updated bar line; 0: plain lines */
  int steps_off;      /* DT_PROGRESS_NONE: epoch lines only */
  int epochs;         /* total epochs, for "epoch e/E" */
  int epoch;          /* current, 1-based */
  int64_t steps;      /* steps in this epoch */
  int next_tenth;     /* plain: the next 10% mark to print */
  double t0;          /* epoch start (dt_time_now) */
  double last_draw;   /* bar: when the line was last redrawn */
  const dt_metric_set *metrics; /* the names in the epoch line (NULL: classification's) */
} dt_progress;
void dt_progress_init(dt_progress *p, FILE *f, dt_progress_mode mode, int epochs);
void dt_progress_epoch_start(dt_progress *p, int epoch, int64_t steps);
/* After step `step` (1-based) of the epoch: running mean loss and samples seen. */
void dt_progress_step(dt_progress *p, int64_t step, double loss, int64_t samples);
/* Clears the bar and prints the epoch line. */
void dt_progress_epoch_end(dt_progress *p, const dt_epoch_metrics *m);
/* "epoch 1/3  train loss ... acc ...  test loss ... top1 ...  4870 samples/s" into buf (ms NULL: classification's names). */
void dt_progress_format_epoch(const dt_epoch_metrics *m, const dt_metric_set *ms, int epochs, char *buf, size_t len);
/* Under the per-rank table: where one rank's compute seconds (compute_s[q * stride], q < world) are 10% or more
 * above another's, "rank 1 computed 11.48 s, rank 0 8.95 s (+28%): ..." into buf (what it means and where to look);
 * else "". */
void dt_progress_rank_balance(const double *compute_s, size_t stride, int world, char *buf, size_t len);

/* ---- evaluation pass (eval.c) ------------------------------------------- */
/* An evaluation forward: outputs (n, outputs) of x, valid until the next call. */
typedef dt_status (*dt_forward_fn)(void *user, const void *x, int n, const float **out);
/* One pass over the loader's epoch 0 in evaluation mode (the model returns to
 * training mode afterwards) through fwd, ADDED to acc (the task's loss without
 * label smoothing, its counters and detail). Only the first `count` samples are
 * counted (count < 0: all): a distributed shard ends with padding duplicates
 * that must not count twice. */
dt_status dt_train_evaluate(dt_model *m, dt_forward_fn fwd, void *user, dt_loader *l, const dt_task *t, int64_t count,
                            dt_metric_acc *acc, double *seconds);

/* Test-time augmentation (tta.c): dt_tta_fn is an evaluation forward that runs `inner` on the batch and, under
 * DT_TTA_FLIP, on its mirror image (each (C, H, W) sample's rows reversed, torchvision's hflip) and gives the mean
 * of the two outputs (logits); under DT_TTA_NONE it is inner itself. */
typedef struct dt_tta_forward {
  dt_tta mode;
  dt_forward_fn inner;
  void *inner_user;
  int64_t rows, w;     /* a sample: rows (C * H) of w values */
  int outputs;
  float *flipped;      /* (cap, rows * w) */
  float *mean;         /* (cap, outputs) */
  int cap;
} dt_tta_forward;
/* DT_USAGE when mode mirrors and the model's samples are not f32 (C, H, W). */
dt_status dt_tta_open(dt_tta_forward *t, dt_tta mode, const dt_model *m, dt_forward_fn inner, void *inner_user);
dt_status dt_tta_fn(void *user, const void *x, int n, const float **out);
void dt_tta_close(dt_tta_forward *t);

/* Ranking evaluation (eval_rank.c): HR@K and NDCG@K at K = 10, the NCF paper's protocol. Scores the
 * candidates of queries q[0..nq) of rk into scores (nq, rk->per), batch pairs per forward through fwd;
 * pairs is (batch, 2) scratch. */
#define DT_RANK_K 10
dt_status dt_rank_score(const dt_ranking *rk, const int64_t *q, int nq, int batch, dt_forward_fn fwd, void *user,
                        int32_t *pairs, float *scores);

/* The architecture a weights file records (metadata "hidden", "factors", "width", "bert_dims", "dropout"), to rebuild
 * its zoo model: n_hidden 0, factors 0, width 0 and dropout -1 (the model's defaults) where not recorded; DT_CORRUPT
 * naming a malformed value. (eval_run.c) */
typedef struct dt_weights_arch {
  int hidden[DT_TRAIN_MAX_HIDDEN];
  int n_hidden;
  int factors;
  int width; /* "width": resnet9 and the CIFAR resnets' first stage (0: the model's own) */
  int bert_dims[4]; /* "bert_dims": layers, hidden size, heads, feed-forward size (0: the preset's) */
  float dropout;
} dt_weights_arch;
dt_status dt_weights_arch_read(const char *path, const dt_safetensors *f, dt_weights_arch *out);

/* A sampler visiting the first n samples, shuffled per epoch with Philox(seed)
 * when shuffle is set (the --limit-* flags). */
typedef struct dt_prefix_sampler {
  int64_t n;
  int shuffle;
  uint64_t seed;
} dt_prefix_sampler;
dt_status dt_prefix_sampler_fn(void *user, int64_t epoch, int64_t *out, int64_t *n);

#endif
