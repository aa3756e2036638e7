/* Internal pieces of the trainer: metrics files, progress display, evaluation pass, prefix sampler. */
#ifndef DT_TRAIN_IMPL_H
#define DT_TRAIN_IMPL_H

#include <stdio.h>

#include "dtrain/checkpoint.h"
#include "dtrain/data.h"
#include "dtrain/loss.h"
#include "dtrain/task.h"
#include "dtrain/model.h"
#include "dtrain/parallel.h"
#include "dtrain/snapshot.h"
#include "dtrain/train.h"

/* ---- files (metrics.c) -------------------------------------------------- */
/* mkdir -p: creates path and its missing parents (mode 0777 & umask). */
dt_status dt_train_mkdir_p(const char *path);
/* Writes text to path (truncating); DT_IO naming the path on failure. */
dt_status dt_train_write_file(const char *path, const char *text);
/* Appends s as a JSON string literal (quotes included) to buf of len at *pos;
 * returns 0 when it does not fit. */
int dt_train_json_str(char *buf, size_t len, size_t *pos, const char *s);

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
/* The metric names of classification with more than 5 classes (the default where none are given). */
const dt_metric_set *dt_metric_set_default(void);

/* ---- evaluation pass (eval.c) ------------------------------------------- */
/* An evaluation forward: outputs (n, outputs) of x, valid until the next call. */
typedef dt_status (*dt_forward_fn)(void *user, const float *x, int n, const float **out);
/* One pass over the loader's epoch 0 in evaluation mode (the model returns to
 * training mode afterwards) through fwd, ADDED to acc (the task's loss without
 * label smoothing, its counters and detail). Only the first `count` samples are
 * counted (count < 0: all): a distributed shard ends with padding duplicates
 * that must not count twice. */
dt_status dt_train_evaluate(dt_model *m, dt_forward_fn fwd, void *user, dt_loader *l, const dt_task *t, int64_t count,
                            dt_metric_acc *acc, double *seconds);

/* A sampler visiting the first n samples, shuffled per epoch with Philox(seed)
 * when shuffle is set (the --limit-* flags). */
typedef struct dt_prefix_sampler {
  int64_t n;
  int shuffle;
  uint64_t seed;
} dt_prefix_sampler;
dt_status dt_prefix_sampler_fn(void *user, int64_t epoch, int64_t *out, int64_t *n);

/* ---- weights and snapshots (checkpoint.c, snapshot.c) --------------------- */
/* Finds every model tensor in f (same dtype and shape) and writes its index to
 * src (n model tensors); a file tensor that is neither a model tensor nor a
 * snapshot's optimizer./trainer. state is an error. Changes nothing. */
dt_status dt_model_match_file(dt_model *m, const dt_safetensors *f, const char *path, int *src);
/* Copies the tensors matched by dt_model_match_file into the model. */
void dt_model_copy_from_file(dt_model *m, const dt_safetensors *f, const int *src);

/* Writes a snapshot (see dtrain/snapshot.h) atomically: history holds the
 * metrics rows of the epochs completed. */
dt_status dt_snapshot_save(const char *path, dt_model *m, dt_optim *o, const dt_snapshot_position *pos,
                           const dt_epoch_metrics *history, int n_history, const dt_kv *meta, int n_meta);
/* Loads a snapshot into model, optimizer and *pos, and its metrics rows into
 * *history (dt_free it; NULL when there are none). Everything is checked first
 * (model name, every tensor's name, dtype and shape, the optimizer's state
 * names); on failure nothing has changed and the detail says what differs. */
dt_status dt_snapshot_load(const char *path, const char *model_name, dt_model *m, dt_optim *o,
                           dt_snapshot_position *pos, dt_epoch_metrics **history, int *n_history);
/* Deletes all but the newest `keep` snapshots of out_dir (keep >= 1). */
dt_status dt_snapshot_prune(const char *out_dir, int keep);

#endif
