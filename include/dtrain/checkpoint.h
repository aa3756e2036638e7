/* Model weights as safetensors files (readable by PyTorch and Hugging Face tools), written atomically. */
#ifndef DTRAIN_CHECKPOINT_H
#define DTRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/model.h"
#include "dtrain/status.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_named_tensor {
  const char *name;
  dt_tensor tensor; /* dtype, shape and data; f32/bf16/f16/i32/i64/f64 */
} dt_named_tensor;

typedef struct dt_kv {
  const char *key;
  const char *value;
} dt_kv;

/* The metadata key under which dt_safetensors_save records the crc32 (zlib's,
 * as 8 lowercase hex digits) of the file's data section: every byte after the
 * header. */
#define DT_SAFETENSORS_CRC_KEY "dtrain.crc32"

/* Writes tensors and string metadata to `path` atomically: a temporary file in
 * the same directory, fsync, rename, fsync of the directory. On any failure the
 * previous file at `path` is untouched and the temporary is removed.
 * The header's __metadata__ holds the caller's entries in order, then
 * "dtrain.crc32" (DT_SAFETENSORS_CRC_KEY), computed from the tensors in memory
 * before anything is written. A caller's own "dtrain.crc32" entry is dropped
 * and replaced by the one for the bytes written, so metadata copied from a
 * loaded file can be saved again as it is. */
dt_status dt_safetensors_save(const char *path, const dt_named_tensor *tensors, int n, const dt_kv *meta,
                              int n_meta);

/* A loaded file: names, dtypes, shapes and data checked against the header
 * (offsets inside the file, sizes = product of shape x dtype size, no overlap,
 * header JSON well formed and bounded). When the metadata holds
 * "dtrain.crc32" the data section must match it: a mismatch is DT_CORRUPT
 * ("the file is damaged", expected vs found crc), and so is a value that is
 * not 8 hex digits. Files without the key (PyTorch, Hugging Face) load
 * unverified; dt_safetensors_meta(f, DT_SAFETENSORS_CRC_KEY) != NULL on a
 * loaded f means its data was verified. The crc covers the data only: damage
 * to the header is caught where it breaks the structure (JSON, offsets, sizes). */
typedef struct dt_safetensors dt_safetensors;
dt_status dt_safetensors_load(const char *path, dt_safetensors **out);
/* Parses an in-memory file image (copied); for tests and fuzzing. */
dt_status dt_safetensors_parse(const uint8_t *buf, size_t len, dt_safetensors **out);
void dt_safetensors_free(dt_safetensors *f);
int dt_safetensors_count(const dt_safetensors *f);
/* Tensor i (a view into f, valid while f lives). */
dt_status dt_safetensors_get(const dt_safetensors *f, int i, dt_named_tensor *out);
dt_status dt_safetensors_find(const dt_safetensors *f, const char *name, dt_named_tensor *out);
/* Metadata value for key, or NULL. */
const char *dt_safetensors_meta(const dt_safetensors *f, const char *key);
int dt_safetensors_meta_count(const dt_safetensors *f);
dt_kv dt_safetensors_meta_at(const dt_safetensors *f, int i);

/* Saves every named tensor of the model (parameters and buffers). */
dt_status dt_model_save(dt_model *m, const char *path, const dt_kv *meta, int n_meta);
/* Loads weights into a built model: every tensor of the model must be present
 * with the same dtype and shape; the first difference is DT_SHAPE_MISMATCH or
 * DT_NOT_FOUND naming the tensor. A snapshot's optimizer.* and trainer.*
 * tensors are skipped (a snapshot loads as weights); any other tensor the
 * model lacks is DT_NOT_FOUND. The model is unchanged on failure. */
dt_status dt_model_load(dt_model *m, const char *path);

/* What dt_model_init_from did, for the caller to print (transformers' "Some
 * weights ... were newly initialized" and "were not used"). Name lists are
 * "a, b, c" of the first few, ending in ", ..." when there were more. */
typedef struct dt_init_report {
  char path[4096];          /* the file read: PATH, or PATH/model.safetensors */
  char model_type[64];      /* PATH/config.json's "model_type" ("" when none) */
  int copied;               /* model tensors taken from the file */
  int converted;            /* of those, f16 or bf16 in the file, converted to f32 */
  int missing;              /* model tensors not in the file: they keep their initialisation */
  int unexpected;           /* file tensors the model lacks (not used) */
  int state_skipped;        /* a dtrain snapshot's optimizer./trainer. tensors (never loaded) */
  char missing_names[512];
  char unexpected_names[512];
} dt_init_report;

/* Initialises a built model from pretrained weights (fine-tuning), by name:
 * path is a Hugging Face checkpoint directory (model.safetensors, optionally
 * config.json) or a safetensors file (Hugging Face's, PyTorch's or dtrain's
 * weights or snapshot). Every model tensor present in the file with the same
 * shape is copied (f32; f16 and bf16 are converted; a legacy LayerNorm
 * "gamma"/"beta" stands for "weight"/"bias" as transformers renames them);
 * the others keep their initialisation and are counted in *rep, as are the
 * file's tensors the model lacks. A tensor of the model's name with another
 * shape or an unconvertible dtype is DT_SHAPE_MISMATCH naming the file, the
 * tensor and both shapes; a file that matches no model tensor at all is
 * DT_NOT_FOUND (weights of another model); a damaged file is DT_CORRUPT (the
 * header is checked as by dt_safetensors_load). The model is unchanged on
 * failure; *rep is written on success only. */
dt_status dt_model_init_from(dt_model *m, const char *path, dt_init_report *rep);

/* Writes the model tensors of src (dtrain weights or a snapshot; optimizer and
 * trainer state left out) in Hugging Face's layout: out_dir/model.safetensors
 * (tensors by name, 16-bit floats widened to f32, __metadata__ {"format": "pt"}
 * plus dtrain's crc32) and out_dir/config.json. The config holds the members
 * the model's zoo row writes (transformers' "architectures", "model_type",
 * sizes; dtrain's own models have none, so AutoConfig refuses them rightly),
 * "torch_dtype": "float32", and the weights' metadata (model, hidden, outputs,
 * task, data, ...) as strings under "dtrain". out_dir is created if missing;
 * one already holding model.safetensors or config.json is DT_USAGE unless
 * overwrite. Both files are written atomically. */
dt_status dt_hf_export(const char *src, const char *out_dir, int overwrite);

#ifdef __cplusplus
}
#endif
#endif
