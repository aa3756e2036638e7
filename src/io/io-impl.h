/* Internal pieces of the file formats the trainer uses: weights matched by name, snapshots written and read. */
#ifndef DT_IO_IMPL_H
#define DT_IO_IMPL_H

#include "dtrain/checkpoint.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"
#include "dtrain/snapshot.h"
#include "dtrain/train.h"

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
/* Loads a snapshot into model, optimizer and *pos, its metrics rows into
 * *history (dt_free it; NULL when there are none) and, when config is not
 * NULL, the configuration of the run that wrote it (metadata "config"; "" if
 * it has none; longer than config_len is DT_CORRUPT). Everything is checked
 * first (model name, every tensor's name, dtype and shape, the optimizer's
 * state names); on failure nothing has changed and the detail says what differs. */
dt_status dt_snapshot_load(const char *path, const char *model_name, dt_model *m, dt_optim *o,
                           dt_snapshot_position *pos, dt_epoch_metrics **history, int *n_history, char *config,
                           size_t config_len);
/* Deletes all but the newest `keep` snapshots of out_dir (keep >= 1). */
dt_status dt_snapshot_prune(const char *out_dir, int keep);

#endif
