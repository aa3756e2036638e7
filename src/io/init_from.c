/* Fine-tuning's start: a model's tensors taken by name from a Hugging Face checkpoint or any safetensors file. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "io/json.h"

/* The file of a checkpoint directory, or path itself; DT_NOT_FOUND saying what the directory lacks. */
static dt_status resolve(const char *path, char *file, size_t len) {
  if (!dt_is_dir(path)) {
    if (snprintf(file, len, "%s", path) >= (int)len) return dt_error(DT_INVALID_ARGUMENT, "%s: path too long", path);
    return DT_OK;
  }
  if (snprintf(file, len, "%s/model.safetensors", path) >= (int)len)
    return dt_error(DT_INVALID_ARGUMENT, "%s: path too long", path);
  if (dt_is_file(file)) return DT_OK;
  char other[4200];
  snprintf(other, sizeof other, "%s/model.safetensors.index.json", path);
  if (dt_is_file(other))
    return dt_error(DT_UNSUPPORTED, "%s: a sharded checkpoint (model.safetensors.index.json); dtrain reads one "
                    "model.safetensors: save it with save_pretrained(..., max_shard_size=\"100GB\")", path);
  snprintf(other, sizeof other, "%s/pytorch_model.bin", path);
  if (dt_is_file(other))
    return dt_error(DT_UNSUPPORTED, "%s holds pytorch_model.bin (a pickle, which dtrain does not read): save it with "
                    "save_pretrained(..., safe_serialization=True)", path);
  return dt_error(DT_NOT_FOUND, "%s: a directory without model.safetensors", path);
}

/* "model_type" of dir/config.json into out ("" without the file or the key); a malformed file is DT_CORRUPT. */
static dt_status read_model_type(const char *path, char *out, size_t len) {
  char cfg[4200];
  out[0] = '\0';
  if (!dt_is_dir(path)) return DT_OK;
  snprintf(cfg, sizeof cfg, "%s/config.json", path);
  FILE *f = NULL;
  size_t size = 0;
  if (!dt_is_file(cfg)) return DT_OK;
  DT_CHECK(dt_file_open_regular(cfg, &f, &size));
  char *text = NULL;
  dt_json doc = {0};
  dt_status st = DT_OK;
  if (size > ((size_t)16 << 20)) st = dt_error(DT_CORRUPT, "%s: %zu bytes, more than a config's 16 MiB", cfg, size);
  if (st == DT_OK) st = dt_alloc_array(size + 1, 1, "config.json", (void **)&text);
  if (st == DT_OK) st = dt_file_read_exact(f, cfg, text, size);
  if (st == DT_OK && (st = dt_json_parse(text, size, &doc)) != DT_OK) st = dt_error_prefix(st, "%s", cfg);
  if (st == DT_OK && doc.nodes[0].type != DT_JSON_OBJECT) st = dt_error(DT_CORRUPT, "%s: not a JSON object", cfg);
  for (int j = 1; st == DT_OK && j < doc.nodes[0].end; j = doc.nodes[j].end)
    if (strcmp(doc.nodes[j].key, "model_type") == 0 && doc.nodes[j].type == DT_JSON_STRING)
      snprintf(out, len, "%s", doc.nodes[j].str);
  dt_json_free(&doc);
  dt_free(text);
  fclose(f);
  return st;
}

/* The file tensor named `name`, or its legacy name (transformers reads LayerNorm.gamma/beta as weight/bias); -1. */
static int find_named(const dt_safetensors *f, const char *name) {
  dt_named_tensor t;
  const int n = dt_safetensors_count(f);
  for (int j = 0; j < n; j++)
    if (dt_safetensors_get(f, j, &t) == DT_OK && strcmp(t.name, name) == 0) return j;
  const size_t len = strlen(name);
  const char *legacy = len > 7 && strcmp(name + len - 7, ".weight") == 0 ? "gamma"
                       : len > 5 && strcmp(name + len - 5, ".bias") == 0 ? "beta" : NULL;
  if (!legacy || !strstr(name, "LayerNorm")) return -1;
  const size_t stem = (size_t)(strrchr(name, '.') - name) + 1;
  for (int j = 0; j < n; j++)
    if (dt_safetensors_get(f, j, &t) == DT_OK && strncmp(t.name, name, stem) == 0 && strcmp(t.name + stem, legacy) == 0)
      return j;
  return -1;
}

/* find_named, and for a task model's "bert." tensors also the name without it: a base model's checkpoint
 * (BertModel's, as bert-base-uncased) loads into the classifier as transformers' base_model_prefix does. */
static int find_tensor(const dt_safetensors *f, const char *name) {
  const int j = find_named(f, name);
  return j >= 0 || strncmp(name, "bert.", 5) != 0 ? j : find_named(f, name + 5);
}

static int convertible(dt_dtype file, dt_dtype model) {
  return file == model || (model == DT_F32 && (file == DT_F16 || file == DT_BF16));
}

static void list_add(char *list, size_t len, int count, const char *name) {
  const size_t o = strlen(list);
  if (count > 5) return; /* the first five, then ", ..." once */
  snprintf(list + o, len - o, "%s%s", o ? ", " : "", count == 5 ? "..." : name);
}

/* Model tensor i against the file: src[i] = its file index or -1 (missing); a shape or dtype clash is an error. */
static dt_status match_one(dt_model *m, int i, const dt_safetensors *f, const char *file, int *src,
                           dt_init_report *rep) {
  dt_tensor_info info;
  DT_CHECK(dt_model_tensor_info(m, i, &info));
  const int j = find_tensor(f, info.name);
  src[i] = j;
  if (j < 0) {
    list_add(rep->missing_names, sizeof rep->missing_names, rep->missing++, info.name);
    return DT_OK;
  }
  dt_named_tensor t;
  dt_tensor mine;
  DT_CHECK(dt_safetensors_get(f, j, &t));
  DT_CHECK(dt_tensor_view(&mine, NULL, info.dtype, info.ndim, info.shape));
  int same = t.tensor.ndim == mine.ndim;
  for (int d = 0; same && d < mine.ndim; d++) same = t.tensor.shape[d] == mine.shape[d];
  char a[128], b[128];
  if (!same)
    return dt_error(DT_SHAPE_MISMATCH, "%s: tensor %s: shape %s in the file, %s in the model (another size of the "
                    "model? check --hidden, the data's classes and input size)", file, t.name,
                    dt_tensor_shape_str(&t.tensor, a, sizeof a), dt_tensor_shape_str(&mine, b, sizeof b));
  if (!convertible(t.tensor.dtype, info.dtype))
    return dt_error(DT_SHAPE_MISMATCH, "%s: tensor %s: dtype %s in the file, %s in the model (f32, f16 and bf16 convert "
                    "to f32)", file, t.name, dt_dtype_name(t.tensor.dtype), dt_dtype_name(info.dtype));
  rep->copied++;
  rep->converted += t.tensor.dtype != info.dtype;
  return DT_OK;
}

/* The file's tensors no model tensor took: a snapshot's own state, or unexpected. */
static dt_status count_unused(dt_model *m, const dt_safetensors *f, const int *src, dt_init_report *rep) {
  const int n = dt_model_num_tensors(m), nf = dt_safetensors_count(f);
  for (int j = 0; j < nf; j++) {
    int used = 0;
    for (int i = 0; i < n && !used; i++) used = src[i] == j;
    if (used) continue;
    dt_named_tensor t;
    DT_CHECK(dt_safetensors_get(f, j, &t));
    if (strncmp(t.name, "optimizer.", 10) == 0 || strncmp(t.name, "trainer.", 8) == 0)
      rep->state_skipped++;
    else
      list_add(rep->unexpected_names, sizeof rep->unexpected_names, rep->unexpected++, t.name);
  }
  return DT_OK;
}

/* Copies file tensor src[i] into model tensor i for every matched i, converting 16-bit floats. */
static void copy_matched(dt_model *m, const dt_safetensors *f, const int *src) {
  const int n = dt_model_num_tensors(m);
  for (int i = 0; i < n; i++) {
    dt_named_tensor t;
    if (src[i] < 0 || dt_safetensors_get(f, src[i], &t) != DT_OK) continue; /* checked by match_one */
    void *dst = dt_model_tensor_data(m, i);
    const int64_t numel = dt_tensor_numel(&t.tensor);
    const uint16_t *h = t.tensor.data;
    if (t.tensor.dtype == DT_F16)
      dt_f16_to_f32_n(dst, h, (size_t)numel);
    else if (t.tensor.dtype == DT_BF16)
      dt_bf16_to_f32_n(dst, h, (size_t)numel);
    else if (numel)
      memcpy(dst, t.tensor.data, dt_tensor_bytes(&t.tensor));
  }
}

dt_status dt_model_init_from(dt_model *m, const char *path, dt_init_report *rep) {
  if (!m || !path || !rep) return dt_error(DT_INVALID_ARGUMENT, "dt_model_init_from: NULL argument");
  dt_init_report r;
  memset(&r, 0, sizeof r);
  DT_CHECK(resolve(path, r.path, sizeof r.path));
  DT_CHECK(read_model_type(path, r.model_type, sizeof r.model_type));
  dt_safetensors *f = NULL;
  DT_CHECK(dt_safetensors_load(r.path, &f));
  const int n = dt_model_num_tensors(m);
  int *src = NULL; /* (n) file index of each model tensor, -1: missing */
  dt_status st = DT_OK;
  if (n > 0) DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *src, "init from", (void **)&src), st, out);
  for (int i = 0; i < n; i++) DT_CHECK_GOTO(match_one(m, i, f, r.path, src, &r), st, out);
  DT_CHECK_GOTO(count_unused(m, f, src, &r), st, out);
  if (n > 0 && r.copied == 0) {
    st = dt_error(DT_NOT_FOUND, "%s: none of the model's %d tensors is in the file (weights of another model? the "
                  "file has %s)", r.path, n, r.unexpected_names[0] ? r.unexpected_names : "no tensors");
    goto out;
  }
  copy_matched(m, f, src);
  *rep = r;
out:
  dt_free(src);
  dt_safetensors_free(f);
  return st;
}
