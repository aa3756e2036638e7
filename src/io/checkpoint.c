/* Model weights to and from safetensors: every named tensor, checked in full before anything is copied. */
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "dtrain/model.h"
#include "io/io-impl.h"

/* Model tensor i as a view over the model's own storage. */
static dt_status model_tensor(dt_model *m, int i, dt_tensor_info *info, dt_tensor *view) {
  DT_CHECK(dt_model_tensor_info(m, i, info));
  void *data = dt_model_tensor_data(m, i);
  if (!data && info->ndim > 0) {
    int64_t numel = 1;
    for (int d = 0; d < info->ndim; d++) numel *= info->shape[d];
    if (numel) return dt_error(DT_INTERNAL, "model tensor %s has no data (model not built?)", info->name);
  }
  return dt_tensor_view(view, data, info->dtype, info->ndim, info->shape);
}

dt_status dt_model_save(dt_model *m, const char *path, const dt_kv *meta, int n_meta) {
  if (!m || !path) return dt_error(DT_INVALID_ARGUMENT, "model save: NULL model or path");
  int n = dt_model_num_tensors(m);
  dt_named_tensor *list = NULL;
  dt_status st = DT_OK;
  if (n > 0) DT_CHECK(dt_alloc_array((size_t)n, sizeof *list, "model save", (void **)&list));
  for (int i = 0; i < n; i++) {
    dt_tensor_info info;
    DT_CHECK_GOTO(model_tensor(m, i, &info, &list[i].tensor), st, out);
    list[i].name = info.name;
  }
  DT_CHECK_GOTO(dt_safetensors_save(path, list, n, meta, n_meta), st, out);
out:
  dt_free(list);
  return st;
}

static int same_shape(const dt_tensor *a, const dt_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* A file tensor that is not a model tensor: a snapshot's optimizer and trainer state. */
static int snapshot_extra(const char *name) {
  return strncmp(name, "optimizer.", 10) == 0 || strncmp(name, "trainer.", 8) == 0;
}

dt_status dt_model_match_file(dt_model *m, const dt_safetensors *f, const char *path, int *src) {
  int n = dt_model_num_tensors(m), nf = dt_safetensors_count(f);
  dt_status st = DT_OK;
  unsigned char *used = NULL; /* (nf) file tensor matched by a model tensor */
  if (nf > 0) DT_CHECK(dt_alloc_array((size_t)nf, 1, "model load", (void **)&used));
  for (int i = 0; i < n; i++) {
    dt_tensor_info info;
    dt_tensor mine;
    DT_CHECK_GOTO(model_tensor(m, i, &info, &mine), st, out);
    int j = 0;
    dt_named_tensor t;
    for (; j < nf; j++) {
      DT_CHECK_GOTO(dt_safetensors_get(f, j, &t), st, out);
      if (strcmp(t.name, info.name) == 0) break;
    }
    if (j == nf) {
      st = dt_error(DT_NOT_FOUND, "%s: tensor %s of the model is missing from the file (weights of another model?)",
                    path, info.name);
      goto out;
    }
    char a[128], b[128];
    if (t.tensor.dtype != mine.dtype) {
      st = dt_error(DT_SHAPE_MISMATCH, "%s: %s: dtype %s in file, %s in model", path, info.name,
                    dt_dtype_name(t.tensor.dtype), dt_dtype_name(mine.dtype));
      goto out;
    }
    if (!same_shape(&t.tensor, &mine)) {
      st = dt_error(DT_SHAPE_MISMATCH, "%s: %s: shape %s in file, %s in model", path, info.name,
                    dt_tensor_shape_str(&t.tensor, a, sizeof a), dt_tensor_shape_str(&mine, b, sizeof b));
      goto out;
    }
    src[i] = j;
    used[j] = 1;
  }
  for (int j = 0; j < nf; j++) {
    dt_named_tensor t;
    DT_CHECK_GOTO(dt_safetensors_get(f, j, &t), st, out);
    if (!used[j] && !snapshot_extra(t.name)) {
      st = dt_error(DT_NOT_FOUND, "%s: tensor %s in the file is not in the model (weights of another model?)", path,
                    t.name);
      goto out;
    }
  }
out:
  dt_free(used);
  return st;
}

void dt_model_copy_from_file(dt_model *m, const dt_safetensors *f, const int *src) {
  int n = dt_model_num_tensors(m);
  for (int i = 0; i < n; i++) {
    dt_named_tensor t;
    if (dt_safetensors_get(f, src[i], &t) != DT_OK) continue; /* checked by dt_model_match_file */
    size_t bytes = dt_tensor_bytes(&t.tensor);
    if (bytes) memcpy(dt_model_tensor_data(m, i), t.tensor.data, bytes);
  }
}

dt_status dt_model_load(dt_model *m, const char *path) {
  if (!m || !path) return dt_error(DT_INVALID_ARGUMENT, "model load: NULL model or path");
  dt_safetensors *f = NULL;
  DT_CHECK(dt_safetensors_load(path, &f));
  int n = dt_model_num_tensors(m);
  dt_status st = DT_OK;
  int *src = NULL; /* (n) file index of each model tensor */
  if (n > 0) DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *src, "model load", (void **)&src), st, out);
  /* Check everything first: the model stays unchanged on any failure. */
  DT_CHECK_GOTO(dt_model_match_file(m, f, path, src), st, out);
  dt_model_copy_from_file(m, f, src);
out:
  dt_free(src);
  dt_safetensors_free(f);
  return st;
}
