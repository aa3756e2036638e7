/* Model weights to and from safetensors: every named tensor, checked in full before anything is copied. */
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "dtrain/model.h"

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

dt_status dt_model_load(dt_model *m, const char *path) {
  if (!m || !path) return dt_error(DT_INVALID_ARGUMENT, "model load: NULL model or path");
  dt_safetensors *f = NULL;
  DT_CHECK(dt_safetensors_load(path, &f));
  int n = dt_model_num_tensors(m), nf = dt_safetensors_count(f);
  dt_status st = DT_OK;
  int *src = NULL;        /* (n) file index of each model tensor */
  unsigned char *used = NULL; /* (nf) file tensor matched by a model tensor */
  if (n > 0) DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *src, "model load", (void **)&src), st, out);
  if (nf > 0) DT_CHECK_GOTO(dt_alloc_array((size_t)nf, 1, "model load", (void **)&used), st, out);

  /* Check everything first: the model stays unchanged on any failure. */
  for (int i = 0; i < n; i++) {
    dt_tensor_info info;
    dt_tensor mine;
    DT_CHECK_GOTO(model_tensor(m, i, &info, &mine), st, out);
    int j = 0;
    while (j < nf) {
      dt_named_tensor t;
      DT_CHECK_GOTO(dt_safetensors_get(f, j, &t), st, out);
      if (strcmp(t.name, info.name) == 0) break;
      j++;
    }
    if (j == nf) {
      st = dt_error(DT_NOT_FOUND, "%s: tensor %s of the model is missing from the file", path, info.name);
      goto out;
    }
    dt_named_tensor t;
    DT_CHECK_GOTO(dt_safetensors_get(f, j, &t), st, out);
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
  for (int j = 0; j < nf; j++)
    if (!used[j]) {
      dt_named_tensor t;
      DT_CHECK_GOTO(dt_safetensors_get(f, j, &t), st, out);
      st = dt_error(DT_NOT_FOUND, "%s: tensor %s in the file is not in the model (%d unexpected)", path, t.name,
                    nf - n);
      goto out;
    }

  for (int i = 0; i < n; i++) {
    dt_named_tensor t;
    DT_CHECK_GOTO(dt_safetensors_get(f, src[i], &t), st, out);
    size_t bytes = dt_tensor_bytes(&t.tensor);
    if (bytes) memcpy(dt_model_tensor_data(m, i), t.tensor.data, bytes);
  }
out:
  dt_free(used);
  dt_free(src);
  dt_safetensors_free(f);
  return st;
}
