/* Tests of Hugging Face checkpoints: --init-from by name (conversions, missing, unused, refusals), export --format hf, the JSON object writer. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/impl.h"
#include "harness.h"
#include "io/json.h"
#include "models/zoo.h"
#include "test_files.h"

#define ASSERT_HAS(s, sub)                                             \
  do {                                                                 \
    if (!strstr((s), (sub))) FAIL_("\"%s\" lacks \"%s\"", (s), (sub)); \
  } while (0)

/* conv(2) -> BatchNorm named `norm` -> relu -> flatten -> fc(3) over 1x4x4 samples; seeded init. */
static dt_status small_model(const char *norm, uint64_t seed, dt_model **out) {
  dt_model *m = NULL;
  dt_status st;
  DT_CHECK(dt_model_new(3, (int64_t[]){1, 4, 4}, &m));
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "conv", 2, 3, 1, 1, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, norm, 1e-5f, 0.1f), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "relu", DT_RELU), st, fail);
  DT_CHECK_GOTO(dt_model_add_flatten(m, "flat"), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "fc", 3, 1), st, fail);
  DT_CHECK_GOTO(dt_model_build(m, 2, seed), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}

static size_t tensor_bytes(dt_model *m, int i) {
  dt_tensor_info info;
  dt_tensor t;
  if (dt_model_tensor_info(m, i, &info) != DT_OK || dt_tensor_view(&t, NULL, info.dtype, info.ndim, info.shape))
    return 0;
  return dt_tensor_bytes(&t);
}

/* Tensor `name` of a and b holds the same bytes. */
static int same_tensor(dt_model *a, dt_model *b, const char *name) {
  int i = -1;
  dt_tensor_info info;
  for (int k = 0; k < dt_model_num_tensors(a); k++)
    if (dt_model_tensor_info(a, k, &info) == DT_OK && strcmp(info.name, name) == 0) i = k;
  return i >= 0 && memcmp(dt_model_tensor_data(a, i), dt_model_tensor_data(b, i), tensor_bytes(a, i)) == 0;
}

static int same_weights(dt_model *a, dt_model *b) {
  for (int i = 0; i < dt_model_num_tensors(a); i++)
    if (memcmp(dt_model_tensor_data(a, i), dt_model_tensor_data(b, i), tensor_bytes(a, i)) != 0) return 0;
  return 1;
}

static float *tensor_f32(dt_model *m, const char *name) {
  dt_tensor_info info;
  for (int k = 0; k < dt_model_num_tensors(m); k++)
    if (dt_model_tensor_info(m, k, &info) == DT_OK && strcmp(info.name, name) == 0) return dt_model_tensor_data(m, k);
  return NULL;
}

/* Removes dir/model.safetensors, dir/config.json, dir/pytorch_model.bin and dir. */
static void remove_dir(const char *dir) {
  const char *names[] = {"model.safetensors", "config.json", "pytorch_model.bin"};
  char p[512];
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* ---- the JSON object writer ------------------------------------------------------------------ */

TEST(json_object_writes_members_in_order) {
  dt_json_obj o = {0}, inner = {.depth = 1};
  const char *arch[] = {"BertForSequenceClassification"}, *text = NULL, *nested = NULL;
  dt_json_obj_str(&inner, "model", "b\"ert");
  ASSERT_OK(dt_json_obj_finish(&inner, &nested));
  dt_json_obj_strs(&o, "architectures", arch, 1);
  dt_json_obj_int(&o, "hidden_size", 768);
  dt_json_obj_num(&o, "layer_norm_eps", 1e-12);
  dt_json_obj_bool(&o, "use_cache", 1);
  dt_json_obj_raw(&o, "dtrain", nested);
  ASSERT(dt_json_obj_has(&o, "hidden_size") && !dt_json_obj_has(&o, "hidden"));
  ASSERT_OK(dt_json_obj_finish(&o, &text));
  ASSERT_STR_EQ(text, "{\n  \"architectures\": [\"BertForSequenceClassification\"],\n  \"hidden_size\": 768,\n"
                      "  \"layer_norm_eps\": 9.9999999999999998e-13,\n  \"use_cache\": true,\n"
                      "  \"dtrain\": {\n    \"model\": \"b\\\"ert\"\n  }\n}\n");
  dt_json doc = {0};
  ASSERT_OK(dt_json_parse(text, strlen(text), &doc));
  ASSERT_EQ(doc.nodes[0].count, 5);
  dt_json_free(&doc);
  dt_json_obj_free(&inner);
  dt_json_obj_free(&o);
}

TEST(json_object_refuses_repeats_and_non_numbers) {
  dt_json_obj o = {0};
  const char *text = NULL;
  dt_json_obj_int(&o, "a", 1);
  dt_json_obj_str(&o, "a", "again");
  dt_json_obj_int(&o, "b", 2); /* a no-op after the failure */
  ASSERT_STATUS(dt_json_obj_finish(&o, &text), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "\"a\" given twice");
  dt_json_obj_free(&o);
  dt_json_obj p = {0};
  dt_json_obj_num(&p, "lr", 0.0 / 0.0);
  ASSERT_STATUS(dt_json_obj_finish(&p, &text), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "\"lr\"");
  dt_json_obj_free(&p);
  dt_json_obj e = {0};
  ASSERT_OK(dt_json_obj_finish(&e, &text));
  ASSERT_STR_EQ(text, "{}\n");
  dt_json_obj_free(&e);
}

/* ---- export --format hf and --init-from ------------------------------------------------------ */

TEST(export_hf_then_init_from_gives_identical_bits) {
  dt_model *a = NULL, *b = NULL;
  ASSERT_OK(small_model("bn", 1, &a));
  ASSERT_OK(small_model("bn", 2, &b));
  ASSERT(!same_weights(a, b));
  const dt_kv meta[] = {{"format", "pt"}, {"model", "mlp"}, {"outputs", "3"}};
  const char *weights = tmp_path("w.safetensors"), *dir = tmp_path("hf");
  ASSERT_OK(dt_model_save(a, weights, meta, 3));
  ASSERT_OK(dt_hf_export(weights, dir, 0));

  dt_init_report rep;
  ASSERT_OK(dt_model_init_from(b, dir, &rep));
  ASSERT(same_weights(a, b)); /* the i64 num_batches_tracked included */
  ASSERT_EQ(rep.copied, 9);
  ASSERT_EQ(rep.missing + rep.unexpected + rep.converted + rep.state_skipped, 0);
  ASSERT_HAS(rep.path, "hf/model.safetensors");
  ASSERT_STR_EQ(rep.model_type, "");

  dt_safetensors *f = NULL;
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  ASSERT_OK(dt_safetensors_load(path, &f));
  ASSERT_EQ(dt_safetensors_meta_count(f), 2); /* format and the crc, not the training's metadata */
  ASSERT_STR_EQ(dt_safetensors_meta(f, "format"), "pt");
  dt_safetensors_free(f);
  snprintf(path, sizeof path, "%s/config.json", dir);
  char *cfg = read_text(path);
  ASSERT(cfg != NULL);
  ASSERT_STR_EQ(cfg, "{\n  \"torch_dtype\": \"float32\",\n  \"dtrain\": {\n    \"model\": \"mlp\",\n"
                     "    \"outputs\": \"3\"\n  }\n}\n");
  free(cfg);
  ASSERT(dt_zoo_hf_config("mlp") == NULL && dt_zoo_hf_config("no-such-model") == NULL);

  /* the outputs are not overwritten unless asked */
  ASSERT_STATUS(dt_hf_export(weights, dir, 0), DT_USAGE);
  ASSERT_HAS(dt_last_error(), "model.safetensors and config.json: give --overwrite");
  ASSERT_OK(dt_hf_export(weights, dir, 1));
  remove_dir(dir);
  unlink(weights);
  dt_model_free(b);
  dt_model_free(a);
}

/* An f16 tensor is widened, a missing one keeps its initialisation, an extra one and a snapshot's state are counted. */
TEST(init_from_converts_and_lists_missing_and_unused) {
  dt_model *a = NULL, *b = NULL, *b0 = NULL;
  ASSERT_OK(small_model("bn", 1, &a));
  ASSERT_OK(small_model("bn", 2, &b));
  ASSERT_OK(small_model("bn", 2, &b0));
  const float *cw = tensor_f32(a, "conv.weight"), *bw = tensor_f32(a, "bn.weight");
  uint16_t half[18], bhalf[2];
  for (int i = 0; i < 18; i++) half[i] = dt_f32_to_f16(cw[i]);
  for (int i = 0; i < 2; i++) bhalf[i] = dt_f32_to_bf16(bw[i] + 0.5f);
  float extra[4] = {1, 2, 3, 4}, state[2] = {0};
  dt_named_tensor t[5];
  t[0].name = "conv.weight";
  ASSERT_OK(dt_tensor_view(&t[0].tensor, half, DT_F16, 4, (int64_t[]){2, 1, 3, 3}));
  t[1].name = "bn.weight";
  ASSERT_OK(dt_tensor_view(&t[1].tensor, bhalf, DT_BF16, 1, (int64_t[]){2}));
  t[2].name = "classifier.weight";
  ASSERT_OK(dt_tensor_view(&t[2].tensor, extra, DT_F32, 2, (int64_t[]){2, 2}));
  t[3].name = "optimizer.state.conv.bias.exp_avg";
  ASSERT_OK(dt_tensor_view(&t[3].tensor, state, DT_F32, 1, (int64_t[]){2}));
  t[4].name = "fc.bias";
  ASSERT_OK(dt_tensor_view(&t[4].tensor, (void *)tensor_f32(a, "fc.bias"), DT_F32, 1, (int64_t[]){3}));
  const char *file = tmp_path("part.safetensors");
  ASSERT_OK(dt_safetensors_save(file, t, 5, NULL, 0));

  dt_init_report rep;
  ASSERT_OK(dt_model_init_from(b, file, &rep));
  ASSERT_EQ(rep.copied, 3);
  ASSERT_EQ(rep.converted, 2);
  ASSERT_EQ(rep.missing, 6);
  ASSERT_EQ(rep.unexpected, 1);
  ASSERT_EQ(rep.state_skipped, 1);
  ASSERT_STR_EQ(rep.unexpected_names, "classifier.weight");
  ASSERT_HAS(rep.missing_names, "conv.bias, ");
  ASSERT_HAS(rep.missing_names, ", ..."); /* six missing: the first five, then "..." */
  const float *got = tensor_f32(b, "conv.weight"), *gotb = tensor_f32(b, "bn.weight");
  int bad = 0;
  for (int i = 0; i < 18; i++) bad += got[i] != dt_f16_to_f32(half[i]);
  for (int i = 0; i < 2; i++) bad += gotb[i] != dt_bf16_to_f32(bhalf[i]);
  ASSERT_EQ(bad, 0);
  ASSERT(same_tensor(a, b, "fc.bias"));
  ASSERT(same_tensor(b0, b, "fc.weight") && same_tensor(b0, b, "conv.bias") && same_tensor(b0, b, "bn.running_var"));
  unlink(file);
  dt_model_free(b0);
  dt_model_free(b);
  dt_model_free(a);
}

/* transformers reads a LayerNorm's legacy gamma/beta as weight/bias; so does --init-from. */
TEST(init_from_reads_legacy_layernorm_names) {
  dt_model *a = NULL, *b = NULL;
  ASSERT_OK(small_model("enc.LayerNorm", 1, &a));
  ASSERT_OK(small_model("enc.LayerNorm", 2, &b));
  dt_named_tensor t[2];
  t[0].name = "enc.LayerNorm.gamma";
  ASSERT_OK(dt_tensor_view(&t[0].tensor, tensor_f32(a, "enc.LayerNorm.weight"), DT_F32, 1, (int64_t[]){2}));
  t[1].name = "enc.LayerNorm.beta";
  ASSERT_OK(dt_tensor_view(&t[1].tensor, tensor_f32(a, "enc.LayerNorm.bias"), DT_F32, 1, (int64_t[]){2}));
  const char *file = tmp_path("legacy.safetensors");
  ASSERT_OK(dt_safetensors_save(file, t, 2, NULL, 0));
  dt_init_report rep;
  ASSERT_OK(dt_model_init_from(b, file, &rep));
  ASSERT_EQ(rep.copied, 2);
  ASSERT_EQ(rep.unexpected, 0);
  ASSERT(same_tensor(a, b, "enc.LayerNorm.weight") && same_tensor(a, b, "enc.LayerNorm.bias"));
  unlink(file);
  dt_model_free(b);
  dt_model_free(a);
}

/* A base model's checkpoint (BertModel's names: no "bert." prefix) loads into the classifier as transformers'
 * base_model_prefix does; the classifier, which the file lacks, is listed missing. */
TEST(init_from_takes_a_base_model_checkpoint) {
  static const int64_t vocab = 30;
  const dt_zoo_config cfg = {.ndim = 2, .input_shape = {3, 6}, .outputs = 2, .dropout = 0, .n_index = 1,
                             .index_size = &vocab, .layers = 1, .hidden_size = 8, .heads = 2};
  dt_model *a = NULL, *b = NULL;
  ASSERT_OK(dt_model_zoo_new("bert-tiny", &cfg, &a));
  ASSERT_OK(dt_model_build(a, 1, 1));
  ASSERT_OK(dt_model_zoo_new("bert-tiny", &cfg, &b));
  ASSERT_OK(dt_model_build(b, 1, 2));
  dt_named_tensor t[64];
  int n = 0;
  for (int i = 0; i < dt_model_num_tensors(a) && n < 64; i++) {
    dt_tensor_info info;
    ASSERT_OK(dt_model_tensor_info(a, i, &info));
    if (strncmp(info.name, "bert.", 5) != 0) continue;
    t[n].name = info.name + 5;
    ASSERT_OK(dt_tensor_view(&t[n++].tensor, dt_model_tensor_data(a, i), info.dtype, info.ndim, info.shape));
  }
  const char *file = tmp_path("base.safetensors");
  ASSERT_OK(dt_safetensors_save(file, t, n, NULL, 0));
  dt_init_report rep;
  ASSERT_OK(dt_model_init_from(b, file, &rep));
  ASSERT_EQ(rep.copied, n);
  ASSERT_EQ(rep.unexpected, 0);
  ASSERT_EQ(rep.missing, 2); /* classifier.weight, classifier.bias */
  ASSERT(same_tensor(a, b, "bert.encoder.layer.0.attention.self.query.weight"));
  ASSERT(!same_tensor(a, b, "classifier.weight"));
  unlink(file);
  dt_model_free(b);
  dt_model_free(a);
}

TEST(init_from_refusals_name_the_file_and_tensor) {
  dt_model *a = NULL, *b = NULL;
  ASSERT_OK(small_model("bn", 1, &a));
  ASSERT_OK(small_model("bn", 2, &b));
  float w[4 * 8] = {0};
  int64_t i64[3] = {1, 2, 3};
  dt_named_tensor t[2];
  t[0].name = "fc.bias";
  ASSERT_OK(dt_tensor_view(&t[0].tensor, tensor_f32(a, "fc.bias"), DT_F32, 1, (int64_t[]){3}));
  t[1].name = "fc.weight";
  ASSERT_OK(dt_tensor_view(&t[1].tensor, w, DT_F32, 2, (int64_t[]){4, 8}));
  const char *file = tmp_path("bad.safetensors");
  ASSERT_OK(dt_safetensors_save(file, t, 2, NULL, 0));
  dt_init_report rep;
  ASSERT_STATUS(dt_model_init_from(b, file, &rep), DT_SHAPE_MISMATCH);
  ASSERT_HAS(dt_last_error(), file);
  ASSERT_HAS(dt_last_error(), "tensor fc.weight: shape (4, 8) in the file, (3, 32) in the model");

  ASSERT_OK(dt_tensor_view(&t[1].tensor, i64, DT_I64, 1, (int64_t[]){3}));
  t[1].name = "conv.bias";
  ASSERT_OK(dt_tensor_view(&t[1].tensor, i64, DT_I64, 1, (int64_t[]){2}));
  ASSERT_OK(dt_safetensors_save(file, t, 2, NULL, 0));
  ASSERT_STATUS(dt_model_init_from(b, file, &rep), DT_SHAPE_MISMATCH);
  ASSERT_HAS(dt_last_error(), "tensor conv.bias: dtype i64 in the file, f32 in the model");

  t[0].name = "weight";
  ASSERT_OK(dt_safetensors_save(file, t, 1, NULL, 0));
  ASSERT_STATUS(dt_model_init_from(b, file, &rep), DT_NOT_FOUND);
  ASSERT_HAS(dt_last_error(), "none of the model's 9 tensors is in the file");

  dt_model *b0 = NULL;
  ASSERT_OK(small_model("bn", 2, &b0));
  ASSERT(same_weights(b, b0)); /* every refusal left the model as it was */

  const char *dir = tmp_path("ckpt");
  char p[512];
  ASSERT(mkdir(dir, 0700) == 0);
  ASSERT_STATUS(dt_model_init_from(b, dir, &rep), DT_NOT_FOUND);
  ASSERT_HAS(dt_last_error(), "a directory without model.safetensors");
  snprintf(p, sizeof p, "%s/pytorch_model.bin", dir);
  ASSERT_OK(dt_file_write_text(p, "pickle"));
  ASSERT_STATUS(dt_model_init_from(b, dir, &rep), DT_UNSUPPORTED);
  ASSERT_HAS(dt_last_error(), "safe_serialization=True");
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  ASSERT_OK(dt_model_save(a, p, NULL, 0));
  snprintf(p, sizeof p, "%s/config.json", dir);
  ASSERT_OK(dt_file_write_text(p, "{\"model_type\": \"bert\",}"));
  ASSERT_STATUS(dt_model_init_from(b, dir, &rep), DT_CORRUPT);
  ASSERT_HAS(dt_last_error(), "ckpt/config.json");
  ASSERT(same_weights(b, b0));
  ASSERT_OK(dt_file_write_text(p, "{\"model_type\": \"bert\"}"));
  ASSERT_OK(dt_model_init_from(b, dir, &rep));
  ASSERT_STR_EQ(rep.model_type, "bert");
  ASSERT(same_weights(a, b));
  remove_dir(dir);
  unlink(file);
  dt_model_free(b0);
  dt_model_free(b);
  dt_model_free(a);
}

/* A snapshot's optimizer and trainer state stays behind; 16-bit tensors are widened to f32. */
TEST(export_hf_keeps_model_tensors_as_f32) {
  uint16_t h[2] = {dt_f32_to_f16(1.5f), dt_f32_to_f16(-2.0f)};
  float s[2] = {7, 8};
  dt_named_tensor t[3];
  t[0].name = "fc.weight";
  ASSERT_OK(dt_tensor_view(&t[0].tensor, h, DT_F16, 1, (int64_t[]){2}));
  t[1].name = "optimizer.state.fc.weight.exp_avg";
  ASSERT_OK(dt_tensor_view(&t[1].tensor, s, DT_F32, 1, (int64_t[]){2}));
  t[2].name = "trainer.position";
  ASSERT_OK(dt_tensor_view(&t[2].tensor, s, DT_F32, 1, (int64_t[]){2}));
  const char *snap = tmp_path("snap.safetensors"), *dir = tmp_path("hf2");
  ASSERT_OK(dt_safetensors_save(snap, t, 3, NULL, 0));
  ASSERT_OK(dt_hf_export(snap, dir, 0));
  char p[512];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_load(p, &f));
  ASSERT_EQ(dt_safetensors_count(f), 1);
  dt_named_tensor got;
  ASSERT_OK(dt_safetensors_find(f, "fc.weight", &got));
  ASSERT_EQ(got.tensor.dtype, DT_F32);
  ASSERT(((float *)got.tensor.data)[0] == 1.5f && ((float *)got.tensor.data)[1] == -2.0f);
  dt_safetensors_free(f);
  remove_dir(dir);
  /* a file with nothing but state has nothing to export */
  ASSERT_OK(dt_safetensors_save(snap, t + 1, 2, NULL, 0));
  ASSERT_STATUS(dt_hf_export(snap, dir, 0), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "holds no model tensors");
  unlink(snap);
}

int main(int argc, char **argv) {
  static const dt_test_case cases[] = {
      TEST_ENTRY(json_object_writes_members_in_order),
      TEST_ENTRY(json_object_refuses_repeats_and_non_numbers),
      TEST_ENTRY(export_hf_then_init_from_gives_identical_bits),
      TEST_ENTRY(init_from_converts_and_lists_missing_and_unused),
      TEST_ENTRY(init_from_reads_legacy_layernorm_names),
      TEST_ENTRY(init_from_takes_a_base_model_checkpoint), TEST_ENTRY(init_from_refusals_name_the_file_and_tensor),
      TEST_ENTRY(export_hf_keeps_model_tensors_as_f32),
  };
  int rc = dt_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
  remove_tmpdir();
  return rc;
}
