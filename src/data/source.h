/* Internal: the data-source ops table (one file per source) and the dataset handle over it. */
#ifndef DT_DATA_SOURCE_H
#define DT_DATA_SOURCE_H

#include "dtrain/data.h"

typedef struct dt_source_ops {
  const char *name;
  const char *doc;  /* one line for help: the spec it reads */
  /* 1 if this source reads spec (the registry asks in order; the last claims anything) */
  int (*claims)(const char *spec);
  /* Opens spec's split: fills *info and the sample count, returns the state. */
  dt_status (*open)(const char *spec, dt_split split, const dt_data_options *opt, void **state, dt_data_info *info,
                    int64_t *n);
  /* Samples idx[0..n) into one buffer per field (info order). */
  void (*fetch)(const void *state, const int64_t *idx, int n, void *const *fields);
  void (*free)(void *state);
  /* Optional: fetch for `epoch` (per-sample random augmentation from (seed, epoch, index)), which may fail
   * (DT_CORRUPT naming the file). Sources that have it may implement fetch as epoch 0. */
  dt_status (*fetch_epoch)(const void *state, int64_t epoch, const int64_t *idx, int n, void *const *fields);
  /* Optional (NULL: the source has none): see dt_dataset_index_ids, _index_text, _meta, _ranking. */
  dt_status (*index_ids)(const void *state, int col, const int64_t **ids, int64_t *n);
  const char *(*index_text)(const void *state, int col, int64_t i, int part);
  int (*meta)(const void *state, const dt_kv **kv);
  dt_status (*ranking)(const void *state, dt_ranking *out);
} dt_source_ops;

extern const dt_source_ops dt_source_synthetic, dt_source_text, dt_source_movielens, dt_source_cifar,
    dt_source_imagefolder, dt_source_idx;

/* Appends a field to info; returns its index. */
int dt_data_add_field(dt_data_info *info, const char *name, dt_dtype dtype, int ndim, const int64_t *shape);

#endif
