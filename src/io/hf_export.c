/* Weights in Hugging Face's layout: OUT_DIR/model.safetensors (f32, {"format": "pt"}) and OUT_DIR/config.json. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "io/json.h"
#include "models/zoo.h"

/* Metadata of the weights that describe the training, not the file (kept under "dtrain" in config.json). */
static int describes_training(const char *key) {
  return strcmp(key, "format") != 0 && strncmp(key, "dtrain.", 7) != 0 && strcmp(key, "config") != 0 &&
         strcmp(key, "step") != 0 && strcmp(key, "world_size") != 0;
}

/* config.json: the model's hook's members (if its zoo row has one), torch_dtype, and the training's metadata. */
static dt_status build_config(const dt_safetensors *f, const char *src, dt_json_obj *cfg) {
  const char *model = dt_safetensors_meta(f, "model");
  dt_zoo_hf_config_fn hook = dt_zoo_hf_config(model);
  if (hook) {
    dt_status st = hook(f, cfg);
    if (st != DT_OK) return dt_error_prefix(st, "%s: the config of model %s", src, model);
  }
  if (!dt_json_obj_has(cfg, "torch_dtype")) dt_json_obj_str(cfg, "torch_dtype", "float32");
  dt_json_obj meta = {.depth = 1};
  for (int i = 0; i < dt_safetensors_meta_count(f); i++) {
    const dt_kv kv = dt_safetensors_meta_at(f, i);
    if (describes_training(kv.key)) dt_json_obj_str(&meta, kv.key, kv.value);
  }
  const char *text = NULL;
  dt_status st = dt_json_obj_finish(&meta, &text);
  if (st == DT_OK) dt_json_obj_raw(cfg, "dtrain", text);
  dt_json_obj_free(&meta);
  return st;
}

/* The model tensors of f (no optimizer./trainer. state), 16-bit floats widened to f32 into *owned. */
static dt_status collect(const dt_safetensors *f, const char *src, dt_named_tensor *list, int *k, float **owned) {
  const int n = dt_safetensors_count(f);
  size_t wide = 0;
  *k = 0;
  for (int i = 0; i < n; i++) {
    dt_named_tensor t;
    DT_CHECK(dt_safetensors_get(f, i, &t));
    if (strncmp(t.name, "optimizer.", 10) == 0 || strncmp(t.name, "trainer.", 8) == 0) continue;
    if (t.tensor.dtype == DT_F16 || t.tensor.dtype == DT_BF16) wide += (size_t)dt_tensor_numel(&t.tensor);
    list[(*k)++] = t;
  }
  if (*k == 0) return dt_error(DT_INVALID_ARGUMENT, "%s holds no model tensors to export", src);
  if (wide) DT_CHECK(dt_alloc_array(wide, sizeof(float), "f32 copies", (void **)owned));
  float *at = *owned;
  for (int i = 0; i < *k; i++) {
    dt_tensor *x = &list[i].tensor;
    if (x->dtype != DT_F16 && x->dtype != DT_BF16) continue;
    const uint16_t *h = x->data;
    const int64_t numel = dt_tensor_numel(x);
    (x->dtype == DT_F16 ? dt_f16_to_f32_n : dt_bf16_to_f32_n)(at, h, (size_t)numel);
    DT_CHECK(dt_tensor_view(x, at, DT_F32, x->ndim, x->shape));
    at += numel;
  }
  return DT_OK;
}

/* OUT_DIR exists (created if need be) and holds neither output, unless overwrite. */
static dt_status prepare_dir(const char *dir, int overwrite, char *weights, char *config, size_t len) {
  if (snprintf(weights, len, "%s/model.safetensors", dir) >= (int)len ||
      snprintf(config, len, "%s/config.json", dir) >= (int)len)
    return dt_error(DT_INVALID_ARGUMENT, "%s: path too long", dir);
  DT_CHECK(dt_mkdir_p(dir, 0777));
  const int has_w = dt_is_file(weights) || dt_is_dir(weights), has_c = dt_is_file(config) || dt_is_dir(config);
  if ((has_w || has_c) && !overwrite)
    return dt_error(DT_USAGE, "%s already holds %s%s%s: give --overwrite to replace them, or choose another directory",
                    dir, has_w ? "model.safetensors" : "", has_w && has_c ? " and " : "", has_c ? "config.json" : "");
  return DT_OK;
}

dt_status dt_hf_export(const char *src, const char *out_dir, int overwrite) {
  if (!src || !out_dir || !*out_dir) return dt_error(DT_INVALID_ARGUMENT, "HF export: NULL or empty path");
  char weights[4200], config[4200];
  dt_safetensors *f = NULL;
  DT_CHECK(dt_safetensors_load(src, &f));
  dt_named_tensor *list = NULL;
  float *owned = NULL;
  dt_json_obj cfg = {0};
  const char *text = NULL;
  int k = 0;
  dt_status st = DT_OK;
  const int n = dt_safetensors_count(f);
  if (n > 0) DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *list, "export", (void **)&list), st, out);
  DT_CHECK_GOTO(collect(f, src, list, &k, &owned), st, out);
  DT_CHECK_GOTO(build_config(f, src, &cfg), st, out);
  DT_CHECK_GOTO(dt_json_obj_finish(&cfg, &text), st, out);
  DT_CHECK_GOTO(prepare_dir(out_dir, overwrite, weights, config, sizeof weights), st, out);
  const dt_kv meta[] = {{"format", "pt"}}; /* what transformers' save_pretrained writes */
  DT_CHECK_GOTO(dt_safetensors_save(weights, list, k, meta, 1), st, out);
  DT_CHECK_GOTO(dt_file_write_text(config, text), st, out);
out:
  dt_json_obj_free(&cfg);
  dt_free(owned);
  dt_free(list);
  dt_safetensors_free(f);
  return st;
}
