/* Tests of safetensors files: round trips, exact byte layout, checksum, every corruption and truncation, atomic save, JSON reader. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/impl.h"
#include "harness.h"
#include "test_files.h"
#include "io/json.h"

/* ---- helpers ------------------------------------------------------------------- */

/* Whole file into a malloc'd buffer; NULL if missing. */
static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)n + 1);
  *len = fread(b, 1, (size_t)n, f);
  fclose(f);
  return b;
}

/* Entries of tmpdir whose name contains ".tmp." */
static int count_temporaries(void) {
  DIR *d = opendir(tmpdir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)) != NULL) n += strstr(e->d_name, ".tmp.") != NULL;
  if (d) closedir(d);
  return n;
}

/* A file image: u64 header length, header (as given, unpadded), data_len bytes of 0x5a. */
static uint8_t *image(const char *header, size_t data_len, size_t *len) {
  size_t n = strlen(header);
  *len = 8 + n + data_len;
  uint8_t *b = malloc(*len + 1);
  uint64_t n64 = n;
  memcpy(b, &n64, 8);
  memcpy(b + 8, header, n);
  memset(b + 8 + n, 0x5a, data_len);
  return b;
}

/* Parses header + data_len bytes; returns the status, leaves the detail in dt_last_error. */
static dt_status parse_header(const char *header, size_t data_len) {
  size_t len;
  uint8_t *b = image(header, data_len, &len);
  dt_safetensors *f = NULL;
  dt_status st = dt_safetensors_parse(b, len, &f);
  dt_safetensors_free(f);
  free(b);
  return st;
}

#define ASSERT_HAS(s, sub)                                                   \
  do {                                                                       \
    if (!strstr((s), (sub))) FAIL_("\"%s\" lacks \"%s\"", (s), (sub));       \
  } while (0)

#define ASSERT_CORRUPT(header, data_len, sub)                  \
  do {                                                         \
    ASSERT_STATUS(parse_header((header), (data_len)), DT_CORRUPT); \
    ASSERT_HAS(dt_last_error(), (sub));                        \
  } while (0)

/* ---- round trips --------------------------------------------------------------- */

TEST(round_trip_all_dtypes_scalar_and_empty) {
  float f32[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-30f};
  uint16_t bf16[4], f16[3];
  for (int i = 0; i < 4; i++) bf16[i] = dt_f32_to_bf16(0.5f * (float)i - 1.0f);
  for (int i = 0; i < 3; i++) f16[i] = dt_f32_to_f16(0.25f * (float)i + 2.0f);
  int32_t i32[4] = {-7, 0, 2147483647, -2147483647 - 1};
  int64_t i64 = INT64_C(-1234567890123);
  double f64[2] = {3.141592653589793, -1e300};
  dt_named_tensor t[7];
  /* f16 (3) is 6 bytes, so the i32 after it sits at an offset that is not a multiple of 4. */
  ASSERT_OK(dt_tensor_view(&t[0].tensor, f32, DT_F32, 2, (int64_t[]){2, 3}));
  ASSERT_OK(dt_tensor_view(&t[1].tensor, bf16, DT_BF16, 1, (int64_t[]){4}));
  ASSERT_OK(dt_tensor_view(&t[2].tensor, f16, DT_F16, 1, (int64_t[]){3}));
  ASSERT_OK(dt_tensor_view(&t[3].tensor, i32, DT_I32, 2, (int64_t[]){2, 2}));
  ASSERT_OK(dt_tensor_view(&t[4].tensor, &i64, DT_I64, 0, NULL));
  ASSERT_OK(dt_tensor_view(&t[5].tensor, f64, DT_F64, 3, (int64_t[]){1, 2, 1}));
  ASSERT_OK(dt_tensor_view(&t[6].tensor, NULL, DT_F32, 2, (int64_t[]){0, 5}));
  const char *names[7] = {"w.f32", "b\"bf16\"", "h\\f16", "i32\ttab", "step", "caf\xc3\xa9", "empty"};
  for (int i = 0; i < 7; i++) t[i].name = names[i];
  dt_kv meta[2] = {{"format", "pt"}, {"note\n", "quote \" and \x01 and \xe2\x82\xac"}};
  const char *path = tmp_path("rt.safetensors");
  ASSERT_OK(dt_safetensors_save(path, t, 7, meta, 2));
  ASSERT_EQ(count_temporaries(), 0);

  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_load(path, &f));
  ASSERT_EQ(dt_safetensors_count(f), 7);
  for (int i = 0; i < 7; i++) {
    dt_named_tensor g;
    ASSERT_OK(dt_safetensors_get(f, i, &g));
    ASSERT_STR_EQ(g.name, names[i]);
    ASSERT_EQ(g.tensor.dtype, t[i].tensor.dtype);
    ASSERT_EQ(g.tensor.ndim, t[i].tensor.ndim);
    for (int d = 0; d < g.tensor.ndim; d++) ASSERT_EQ(g.tensor.shape[d], t[i].tensor.shape[d]);
    size_t bytes = dt_tensor_bytes(&g.tensor);
    ASSERT_EQ(bytes, dt_tensor_bytes(&t[i].tensor));
    if (bytes) ASSERT(memcmp(g.tensor.data, t[i].tensor.data, bytes) == 0);
    ASSERT(g.tensor.data != NULL);
    ASSERT(((uintptr_t)g.tensor.data % dt_dtype_size(g.tensor.dtype)) == 0); /* safe to read as its type */
    ASSERT_EQ(g.tensor.owns, 0);
  }
  dt_named_tensor g;
  ASSERT_OK(dt_safetensors_find(f, "i32\ttab", &g));
  ASSERT_EQ(((int32_t *)g.tensor.data)[3], -2147483647 - 1);
  ASSERT_OK(dt_safetensors_find(f, "step", &g));
  ASSERT_EQ(g.tensor.ndim, 0);
  ASSERT_EQ(*(int64_t *)g.tensor.data, INT64_C(-1234567890123));
  ASSERT_STATUS(dt_safetensors_find(f, "nope", &g), DT_NOT_FOUND);
  ASSERT_STATUS(dt_safetensors_get(f, 7, &g), DT_INVALID_ARGUMENT);
  ASSERT_EQ(dt_safetensors_meta_count(f), 3); /* the caller's two, then the checksum */
  ASSERT_STR_EQ(dt_safetensors_meta(f, "format"), "pt");
  ASSERT_STR_EQ(dt_safetensors_meta(f, "note\n"), meta[1].value);
  ASSERT(dt_safetensors_meta(f, "missing") == NULL);
  ASSERT_STR_EQ(dt_safetensors_meta_at(f, 1).key, "note\n");
  ASSERT_STR_EQ(dt_safetensors_meta_at(f, 2).key, DT_SAFETENSORS_CRC_KEY);
  ASSERT_EQ(strlen(dt_safetensors_meta_at(f, 2).value), 8);
  ASSERT(dt_safetensors_meta_at(f, 3).key == NULL);
  dt_safetensors_free(f);

  /* Same input, same bytes; and the in-memory parser agrees with the file loader. */
  size_t la, lb;
  uint8_t *a = read_file(path, &la);
  ASSERT_OK(dt_safetensors_save(tmp_path("rt2.safetensors"), t, 7, meta, 2));
  uint8_t *b = read_file(tmp_path("rt2.safetensors"), &lb);
  ASSERT(a && b);
  ASSERT_EQ(la, lb);
  ASSERT(memcmp(a, b, la) == 0);
  ASSERT_OK(dt_safetensors_parse(a, la, &f));
  ASSERT_EQ(dt_safetensors_count(f), 7);
  ASSERT_OK(dt_safetensors_find(f, "caf\xc3\xa9", &g));
  ASSERT(((double *)g.tensor.data)[1] == -1e300);
  dt_safetensors_free(f);
  free(a);
  free(b);
  dt_safetensors_free(NULL);
}

TEST(tiny_file_byte_layout_is_exact) {
  float v[2] = {1.0f, -2.0f};
  dt_named_tensor t = {.name = "a"};
  ASSERT_OK(dt_tensor_view(&t.tensor, v, DT_F32, 1, (int64_t[]){2}));
  const char *path = tmp_path("tiny.safetensors");
  ASSERT_OK(dt_safetensors_save(path, &t, 1, NULL, 0));
  size_t len;
  uint8_t *b = read_file(path, &len);
  ASSERT(b);
  /* 97 bytes of JSON, padded with 7 spaces to 104; 8 + 104 + 8 data bytes. c3872656 is
   * zlib.crc32 of the 8 data bytes (Python: "%08x" % zlib.crc32(struct.pack("<2f", 1, -2))). */
  const char *json = "{\"__metadata__\":{\"dtrain.crc32\":\"c3872656\"},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}       ";
  ASSERT_EQ(len, 120);
  const uint8_t want_len[8] = {104, 0, 0, 0, 0, 0, 0, 0};
  ASSERT(memcmp(b, want_len, 8) == 0);
  ASSERT(memcmp(b + 8, json, 104) == 0);
  const uint8_t want_data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}; /* 1.0f, -2.0f little-endian */
  ASSERT(memcmp(b + 112, want_data, 8) == 0);
  free(b);

  /* No tensors: only the checksum of no bytes (0), padded to 48 bytes, 56 in all. */
  ASSERT_OK(dt_safetensors_save(path, NULL, 0, NULL, 0));
  b = read_file(path, &len);
  ASSERT_EQ(len, 56);
  ASSERT(memcmp(b + 8, "{\"__metadata__\":{\"dtrain.crc32\":\"00000000\"}}    ", 48) == 0);
  free(b);

  /* Metadata comes first, in the order given, the checksum last; a caller's
   * "dtrain.crc32" is replaced by the real one. */
  dt_kv meta[3] = {{"z", "1"}, {"dtrain.crc32", "deadbeef"}, {"a", "2"}};
  ASSERT_OK(dt_safetensors_save(path, &t, 1, meta, 3));
  b = read_file(path, &len);
  const char *json2 = "{\"__metadata__\":{\"z\":\"1\",\"a\":\"2\",\"dtrain.crc32\":\"c3872656\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  size_t n2 = strlen(json2), padded = (n2 + 7) / 8 * 8;
  ASSERT_EQ(len, 8 + padded + 8);
  ASSERT(memcmp(b + 8, json2, n2) == 0);
  for (size_t i = n2; i < padded; i++) ASSERT_EQ(b[8 + i], ' ');
  free(b);
}

TEST(valid_edge_cases_are_accepted) {
  ASSERT_OK(parse_header("{}", 0));
  ASSERT_OK(parse_header("{}      ", 0));
  ASSERT_OK(parse_header("{\"__metadata__\":{}}", 0));
  /* Zero-size tensors share offsets with each other and with a neighbour's edge. */
  ASSERT_OK(parse_header("{\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                         "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                         "\"z2\":{\"shape\":[3,0],\"data_offsets\":[4,4],\"dtype\":\"I64\"}}",
                         4));
  /* Keys in any order, data in any order relative to the keys. */
  size_t len;
  uint8_t *b = image("{\"b\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[4,8]},"
                     "\"a\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]}}",
                     8, &len);
  int32_t va = 11, vb = -22;
  memcpy(b + len - 8, &va, 4);
  memcpy(b + len - 4, &vb, 4);
  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_parse(b, len, &f));
  dt_named_tensor t;
  ASSERT_OK(dt_safetensors_get(f, 0, &t));
  ASSERT_STR_EQ(t.name, "b");
  ASSERT_EQ(*(int32_t *)t.tensor.data, -22);
  ASSERT_OK(dt_safetensors_find(f, "a", &t));
  ASSERT_EQ(*(int32_t *)t.tensor.data, 11);
  dt_safetensors_free(f);
  free(b);
}

/* ---- corruptions ---------------------------------------------------------------- */

TEST(short_and_oversized_headers_are_corrupt) {
  uint8_t small[5] = {1, 0, 0, 0, 0};
  dt_safetensors *f = (dt_safetensors *)0x1;
  ASSERT_STATUS(dt_safetensors_parse(small, 5, &f), DT_CORRUPT);
  ASSERT_HAS(dt_last_error(), "shorter than the 8-byte");
  ASSERT(f == (dt_safetensors *)0x1); /* untouched on failure */

  size_t len;
  uint8_t *b = image("{}", 0, &len);
  uint64_t n = 3; /* header claims more than the file holds */
  memcpy(b, &n, 8);
  ASSERT_STATUS(dt_safetensors_parse(b, len, &f), DT_CORRUPT);
  ASSERT_HAS(dt_last_error(), "exceeds the 2 bytes");
  n = 200u * 1000u * 1000u;
  memcpy(b, &n, 8);
  ASSERT_STATUS(dt_safetensors_parse(b, len, &f), DT_CORRUPT);
  ASSERT_HAS(dt_last_error(), "100 MB");
  n = UINT64_MAX;
  memcpy(b, &n, 8);
  ASSERT_STATUS(dt_safetensors_parse(b, len, &f), DT_CORRUPT);
  n = 0;
  memcpy(b, &n, 8);
  ASSERT_STATUS(dt_safetensors_parse(b, len, &f), DT_CORRUPT);
  free(b);
}

TEST(malformed_json_is_corrupt) {
  ASSERT_CORRUPT(" {}", 0, "start with '{'");
  ASSERT_CORRUPT("[]", 0, "start with '{'");
  ASSERT_CORRUPT("{", 0, "JSON");
  ASSERT_CORRUPT("{}x", 0, "trailing characters");
  ASSERT_CORRUPT("{}{}", 0, "trailing characters");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"b\",}}", 0, "string key expected");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"b\\x\"}}", 0, "invalid escape");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"\\ud800\"}}", 0, "lone high surrogate");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"\\udc00\"}}", 0, "lone low surrogate");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"\\u12\"}}", 0, "\\u escape");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"\xc3\x28\"}}", 0, "UTF-8");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"\xc0\xaf\"}}", 0, "UTF-8");     /* overlong '/' */
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"\xed\xa0\x80\"}}", 0, "UTF-8"); /* encoded surrogate */
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"tab\there\"}}", 0, "control character");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.],\"data_offsets\":[0,4]}}", 4, "after '.'");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[+1],\"data_offsets\":[0,4]}}", 4, "unexpected character");
  ASSERT_CORRUPT("{\"a\":tru}", 0, "invalid literal");
  ASSERT_CORRUPT("{\"a\" 1}", 0, "':' expected");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":\"b\"}, \"__metadata__\":{}}", 0, "duplicate key \"__metadata__\"");
  /* Nesting deeper than the bound. */
  char deep[400] = "{\"__metadata__\":{\"a\":";
  for (int i = 0; i < 100; i++) strcat(deep, "[");
  for (int i = 0; i < 100; i++) strcat(deep, "]");
  strcat(deep, "}}");
  ASSERT_CORRUPT(deep, 0, "nesting too deep");
}

TEST(bad_tensor_descriptions_are_corrupt) {
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype \"F33\"");
  ASSERT_STATUS(parse_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1), DT_UNSUPPORTED);
  ASSERT_HAS(dt_last_error(), "dtype U8 is valid safetensors");
  ASSERT_STATUS(parse_header("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
                DT_UNSUPPORTED);
  ASSERT_STATUS(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4),
                DT_UNSUPPORTED);
  ASSERT_HAS(dt_last_error(), "6 dimensions");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0] is negative");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "not an integer");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "not an integer");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
                 "overflows");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
                 "not an integer");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "span 4 bytes, shape and dtype need 8");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "end before begin");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 4, "outside the 4-byte data buffer");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "not [begin, end]");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, "non-negative");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "missing \"data_offsets\"");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unexpected field \"x\"");
  ASSERT_CORRUPT("{\"a\":[]}", 0, "not an object");
  ASSERT_CORRUPT("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name");
  ASSERT_CORRUPT("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "NUL");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, "duplicate key \"a\"");
  ASSERT_CORRUPT("{\"__metadata__\":{\"a\":1}}", 0, "is not a string");
  ASSERT_CORRUPT("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
}

TEST(overlaps_holes_and_unindexed_bytes_are_corrupt) {
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 12, "\"a\" [0, 8) and \"b\" [4, 12) overlap");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                 12, "bytes [4, 8) belong to no tensor");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "bytes [0, 4) belong to no tensor");
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, "[4, 6) after the last tensor");
  ASSERT_CORRUPT("{}", 3, "3 data bytes but no tensors");
  /* A zero-size tensor inside another one's bytes. */
  ASSERT_CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                 8, "overlap");
}

TEST(load_names_the_file) {
  const char *path = tmp_path("bad.safetensors");
  size_t len;
  uint8_t *b = image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5, &len);
  FILE *fp = fopen(path, "wb");
  ASSERT(fp);
  fwrite(b, 1, len, fp);
  fclose(fp);
  free(b);
  dt_safetensors *f = NULL;
  ASSERT_STATUS(dt_safetensors_load(path, &f), DT_CORRUPT);
  ASSERT_HAS(dt_last_error(), path);
  ASSERT_HAS(dt_last_error(), "after the last tensor");
  fp = fopen(path, "wb");
  fwrite("abc", 1, 3, fp);
  fclose(fp);
  ASSERT_STATUS(dt_safetensors_load(path, &f), DT_CORRUPT);
  ASSERT_HAS(dt_last_error(), path);
  ASSERT_STATUS(dt_safetensors_load(tmp_path("missing.safetensors"), &f), DT_NOT_FOUND);
  ASSERT_HAS(dt_last_error(), "missing.safetensors");
  ASSERT(f == NULL);
}

/* ---- saving failures ----------------------------------------------------------- */

TEST(save_rejects_bad_input) {
  float v = 1;
  dt_named_tensor t[2] = {{.name = "x"}, {.name = "x"}};
  ASSERT_OK(dt_tensor_view(&t[0].tensor, &v, DT_F32, 0, NULL));
  t[1].tensor = t[0].tensor;
  const char *path = tmp_path("bad_input.safetensors");
  ASSERT_STATUS(dt_safetensors_save(path, t, 2, NULL, 0), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "tensor name \"x\" appears twice");
  t[1].name = "__metadata__";
  ASSERT_STATUS(dt_safetensors_save(path, t, 2, NULL, 0), DT_INVALID_ARGUMENT);
  t[1].name = "";
  ASSERT_STATUS(dt_safetensors_save(path, t, 2, NULL, 0), DT_INVALID_ARGUMENT);
  dt_kv meta[2] = {{"k", "1"}, {"k", "2"}};
  ASSERT_STATUS(dt_safetensors_save(path, t, 1, meta, 2), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "metadata key \"k\"");
  dt_kv bad_utf8 = {"k", "\xc3("};
  ASSERT_STATUS(dt_safetensors_save(path, t, 1, &bad_utf8, 1), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "UTF-8");
  t[0].name = "\xff";
  ASSERT_STATUS(dt_safetensors_save(path, t, 1, NULL, 0), DT_INVALID_ARGUMENT);
  ASSERT(access(path, F_OK) != 0);
  ASSERT_EQ(count_temporaries(), 0);
}

TEST(save_into_missing_or_unwritable_directory_fails_cleanly) {
  float v = 1;
  dt_named_tensor t = {.name = "x"};
  ASSERT_OK(dt_tensor_view(&t.tensor, &v, DT_F32, 0, NULL));
  const char *path = tmp_path("no_such_dir/w.safetensors");
  ASSERT_STATUS(dt_safetensors_save(path, &t, 1, NULL, 0), DT_IO);
  ASSERT_HAS(dt_last_error(), path);
  ASSERT_HAS(dt_last_error(), strerror(ENOENT));
  /* A directory in the way: the rename fails, the temporary goes. */
  ASSERT_STATUS(dt_safetensors_save(tmpdir, &t, 1, NULL, 0), DT_IO);
  ASSERT_HAS(dt_last_error(), "renaming");
  char dir_tmp[128];
  snprintf(dir_tmp, sizeof dir_tmp, "%s.tmp.%ld", tmpdir, (long)getpid());
  ASSERT(access(dir_tmp, F_OK) != 0);
  struct stat sb;
  ASSERT(stat(tmpdir, &sb) == 0 && S_ISDIR(sb.st_mode));
  /* /proc refuses new files even for root. */
  ASSERT_STATUS(dt_safetensors_save("/proc/dtrain_test.safetensors", &t, 1, NULL, 0), DT_IO);
  ASSERT_HAS(dt_last_error(), "/proc/dtrain_test.safetensors");
  if (geteuid() != 0) { /* root ignores directory permissions */
    const char *dir = tmp_path("readonly");
    ASSERT(mkdir(dir, 0555) == 0);
    char p[300];
    snprintf(p, sizeof p, "%s/w.safetensors", dir);
    ASSERT_STATUS(dt_safetensors_save(p, &t, 1, NULL, 0), DT_IO);
    ASSERT_HAS(dt_last_error(), strerror(EACCES));
    rmdir(dir);
  }
  ASSERT_EQ(count_temporaries(), 0);
}

/* The injected fault: the temporary name is "<path>.tmp.<pid>", so a symlink
 * planted there to /dev/full makes the real write fail with ENOSPC half way
 * through a 256 KiB tensor (past stdio's buffer). The save must report it,
 * remove the temporary (the link) and leave the previous file byte-identical. */
TEST(failed_save_keeps_previous_file) {
  if (access("/dev/full", W_OK) != 0) {
    printf("  (no /dev/full: fault injection skipped)\n");
    return;
  }
  const char *path = tmp_path("keep.safetensors");
  float small[3] = {1, 2, 3};
  dt_named_tensor t = {.name = "w"};
  ASSERT_OK(dt_tensor_view(&t.tensor, small, DT_F32, 1, (int64_t[]){3}));
  ASSERT_OK(dt_safetensors_save(path, &t, 1, NULL, 0));
  size_t len0;
  uint8_t *before = read_file(path, &len0);
  ASSERT(before);

  float *big = calloc(65536, sizeof *big);
  for (int i = 0; i < 65536; i++) big[i] = (float)i;
  ASSERT_OK(dt_tensor_view(&t.tensor, big, DT_F32, 2, (int64_t[]){256, 256}));
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  ASSERT(symlink("/dev/full", tmp) == 0);
  dt_status st = dt_safetensors_save(path, &t, 1, NULL, 0);
  free(big);
  ASSERT_EQ(st, DT_IO);
  ASSERT_HAS(dt_last_error(), strerror(ENOSPC));
  ASSERT_HAS(dt_last_error(), tmp);
  struct stat sb;
  ASSERT(lstat(tmp, &sb) != 0); /* temporary removed */
  size_t len1;
  uint8_t *after = read_file(path, &len1);
  ASSERT(after);
  ASSERT_EQ(len1, len0);
  ASSERT(memcmp(before, after, len0) == 0);
  free(before);
  free(after);
  ASSERT_EQ(count_temporaries(), 0);
}

/* ---- the JSON reader and writer ------------------------------------------------- */

TEST(json_decodes_escapes_numbers_and_structure) {
  const char *text = " {\"k\\u00e9\": [1, -0, 18446744073709551615, 18446744073709551616, 2.5e3, true, null],"
                     " \"s\": \"a\\\"\\\\\\/\\b\\f\\n\\r\\t\\ud83d\\ude00\", \"o\": {}} ";
  dt_json doc = {0};
  ASSERT_OK(dt_json_parse(text, strlen(text), &doc));
  ASSERT_EQ(doc.nodes[0].type, DT_JSON_OBJECT);
  ASSERT_EQ(doc.nodes[0].count, 3);
  ASSERT_EQ(doc.n, 11);
  const dt_json_node *arr = &doc.nodes[1];
  ASSERT_STR_EQ(arr->key, "k\xc3\xa9");
  ASSERT_EQ(arr->count, 7);
  ASSERT(doc.nodes[2].is_int && doc.nodes[2].magnitude == 1 && !doc.nodes[2].negative);
  ASSERT(doc.nodes[3].is_int && doc.nodes[3].magnitude == 0 && doc.nodes[3].negative);
  ASSERT(doc.nodes[4].is_int && doc.nodes[4].magnitude == UINT64_MAX);
  ASSERT(!doc.nodes[5].is_int); /* 2^64 does not fit */
  ASSERT(!doc.nodes[6].is_int);
  ASSERT_EQ(doc.nodes[7].type, DT_JSON_TRUE);
  ASSERT_EQ(doc.nodes[8].type, DT_JSON_NULL);
  const dt_json_node *s = &doc.nodes[arr->end];
  ASSERT_STR_EQ(s->key, "s");
  ASSERT_STR_EQ(s->str, "a\"\\/\b\f\n\r\t\xf0\x9f\x98\x80");
  ASSERT_EQ(s->str_len, 13);
  ASSERT_EQ(doc.nodes[s->end].type, DT_JSON_OBJECT);
  ASSERT_EQ(doc.nodes[s->end].end, doc.n);
  /* every value's source text: 2.5e3 as written, the array whole */
  ASSERT_EQ(doc.nodes[6].span, 5);
  ASSERT(memcmp(text + doc.nodes[6].at, "2.5e3", 5) == 0);
  ASSERT(text[arr->at] == '[' && text[arr->at + arr->span - 1] == ']');
  ASSERT_EQ(doc.nodes[0].at, 1);
  dt_json_free(&doc);
  dt_json_free(&doc);

  ASSERT_STATUS(dt_json_parse("", 0, &doc), DT_CORRUPT);
  ASSERT_STATUS(dt_json_parse("[1,]", 4, &doc), DT_CORRUPT);
  const char *dup = "{\"a\":1,\"b\":2,\"c\":3,\"b\":4}";
  ASSERT_STATUS(dt_json_parse(dup, strlen(dup), &doc), DT_CORRUPT);
  ASSERT_HAS(dt_last_error(), "duplicate key \"b\"");
  ASSERT_STATUS(dt_json_parse("\"a\\u0000\"x", 10, &doc), DT_CORRUPT);
  ASSERT_OK(dt_json_parse("\"a\\u0000b\"", 10, &doc));
  ASSERT_EQ(doc.nodes[0].str_len, 3);
  dt_json_free(&doc);
}

TEST(json_writer_escapes_round_trip) {
  const char *s = "q\" b\\ nl\n ctl\x01 \xe2\x82\xac";
  dt_buf b = {0};
  dt_buf_json_string(&b, s);
  ASSERT_OK(b.status);
  ASSERT_STR_EQ(b.data, "\"q\\\" b\\\\ nl\\u000a ctl\\u0001 \xe2\x82\xac\"");
  dt_json doc = {0};
  ASSERT_OK(dt_json_parse(b.data, b.len, &doc));
  ASSERT_STR_EQ(doc.nodes[0].str, s);
  dt_json_free(&doc);
  /* A long string of control characters grows to 6 bytes a byte: the buffer grows, text before stays. */
  char ctl[1000];
  memset(ctl, '\x01', sizeof ctl - 1);
  ctl[sizeof ctl - 1] = '\0';
  size_t before = b.len;
  dt_buf_json_string(&b, ctl);
  ASSERT_OK(b.status);
  ASSERT_EQ(b.len, before + 6 * (sizeof ctl - 1) + 2);
  ASSERT_EQ(strlen(b.data), b.len);
  ASSERT(strncmp(b.data + before, "\"\\u0001\\u0001", 13) == 0);
  ASSERT_STR_EQ(b.data + b.len - 7, "\\u0001\"");
  dt_buf_free(&b);
}

/* ---- models --------------------------------------------------------------------- */

/* conv(c_out) -> bn -> relu -> flatten -> fc(3) over 1x4x4 samples; seeded init. */
static dt_status small_model(int c_out, int extra_fc, uint64_t seed, dt_model **out) {
  dt_model *m = NULL;
  dt_status st;
  DT_CHECK(dt_model_new(3, (int64_t[]){1, 4, 4}, &m));
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "conv", c_out, 3, 1, 1, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, "bn", 1e-5f, 0.1f), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "relu", DT_RELU), st, fail);
  DT_CHECK_GOTO(dt_model_add_flatten(m, "flat"), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "fc", 3, 1), st, fail);
  if (extra_fc) DT_CHECK_GOTO(dt_model_add_linear(m, "fc2", 2, 1), st, fail);
  DT_CHECK_GOTO(dt_model_build(m, 2, seed), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}

/* Every tensor of a and b holds the same bytes. */
static int same_weights(dt_model *a, dt_model *b) {
  if (dt_model_num_tensors(a) != dt_model_num_tensors(b)) return 0;
  for (int i = 0; i < dt_model_num_tensors(a); i++) {
    dt_tensor_info ia;
    dt_tensor t;
    if (dt_model_tensor_info(a, i, &ia) != DT_OK) return 0;
    if (dt_tensor_view(&t, NULL, ia.dtype, ia.ndim, ia.shape) != DT_OK) return 0;
    if (memcmp(dt_model_tensor_data(a, i), dt_model_tensor_data(b, i), dt_tensor_bytes(&t)) != 0) return 0;
  }
  return 1;
}

TEST(model_round_trip_restores_every_tensor) {
  dt_model *a = NULL, *b = NULL;
  ASSERT_OK(small_model(2, 0, 1, &a));
  ASSERT_OK(small_model(2, 0, 2, &b));
  ASSERT_EQ(dt_model_num_tensors(a), 9); /* conv w,b; bn w,b,mean,var,count; fc w,b */
  ASSERT(!same_weights(a, b));
  /* Make the buffers and the i64 counter distinctive too. */
  int idx;
  ASSERT_OK(dt_model_find_tensor(a, "bn.num_batches_tracked", &idx));
  *(int64_t *)dt_model_tensor_data(a, idx) = 77;
  ASSERT_OK(dt_model_find_tensor(a, "bn.running_mean", &idx));
  ((float *)dt_model_tensor_data(a, idx))[1] = 0.375f;
  const char *path = tmp_path("model.safetensors");
  dt_kv meta[1] = {{"model", "small"}};
  ASSERT_OK(dt_model_save(a, path, meta, 1));
  ASSERT_OK(dt_model_load(b, path));
  ASSERT(same_weights(a, b));
  ASSERT_OK(dt_model_find_tensor(b, "bn.num_batches_tracked", &idx));
  ASSERT_EQ(*(int64_t *)dt_model_tensor_data(b, idx), 77);

  /* The file holds the model's names, dtypes and shapes in state_dict order. */
  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_load(path, &f));
  ASSERT_EQ(dt_safetensors_count(f), dt_model_num_tensors(a));
  for (int i = 0; i < dt_safetensors_count(f); i++) {
    dt_named_tensor t;
    dt_tensor_info info;
    ASSERT_OK(dt_safetensors_get(f, i, &t));
    ASSERT_OK(dt_model_tensor_info(a, i, &info));
    ASSERT_STR_EQ(t.name, info.name);
    ASSERT_EQ(t.tensor.dtype, info.dtype);
  }
  ASSERT_STR_EQ(dt_safetensors_meta(f, "model"), "small");
  dt_safetensors_free(f);
  dt_model_free(a);
  dt_model_free(b);
}

TEST(model_load_mismatches_name_the_tensor_and_change_nothing) {
  dt_model *a = NULL, *a_copy = NULL, *wide = NULL, *wide_copy = NULL, *deeper = NULL;
  ASSERT_OK(small_model(2, 0, 1, &a));
  ASSERT_OK(small_model(2, 0, 1, &a_copy));
  ASSERT_OK(small_model(3, 0, 2, &wide));
  ASSERT_OK(small_model(3, 0, 2, &wide_copy));
  ASSERT_OK(small_model(2, 1, 2, &deeper));
  const char *path = tmp_path("model_a.safetensors");
  ASSERT_OK(dt_model_save(a, path, NULL, 0));

  ASSERT_STATUS(dt_model_load(wide, path), DT_SHAPE_MISMATCH);
  ASSERT_HAS(dt_last_error(), "conv.weight: shape (2, 1, 3, 3) in file, (3, 1, 3, 3) in model");
  ASSERT_HAS(dt_last_error(), path);
  ASSERT(same_weights(wide, wide_copy));

  ASSERT_STATUS(dt_model_load(deeper, path), DT_NOT_FOUND);
  ASSERT_HAS(dt_last_error(), "fc2.weight of the model is missing");

  /* A file with tensors the model lacks; the matching ones must not be copied either. */
  const char *path2 = tmp_path("model_deeper.safetensors");
  ASSERT_OK(dt_model_save(deeper, path2, NULL, 0));
  ASSERT_STATUS(dt_model_load(a, path2), DT_NOT_FOUND);
  ASSERT_HAS(dt_last_error(), "fc2.weight in the file is not in the model");
  ASSERT(same_weights(a, a_copy));

  ASSERT_STATUS(dt_model_load(a, tmp_path("absent.safetensors")), DT_NOT_FOUND);
  dt_model_free(a);
  dt_model_free(a_copy);
  dt_model_free(wide);
  dt_model_free(wide_copy);
  dt_model_free(deeper);
}

/* ---- checksum, truncation and bad input through files ------------------------- */

static int write_bytes(const char *path, const uint8_t *b, size_t len) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return 0;
  size_t w = len ? fwrite(b, 1, len, fp) : 0;
  return fclose(fp) == 0 && w == len;
}

/* The detail after a failed load: names the file, fits on one line. */
#define ASSERT_DETAIL_NAMES(path)                                       \
  do {                                                                  \
    ASSERT_HAS(dt_last_error(), (path));                                \
    ASSERT_MSG(strchr(dt_last_error(), '\n') == NULL, dt_last_error()); \
  } while (0)

/* Two tensors and one metadata entry, saved by dtrain (so with a checksum). */
static dt_status save_sample(const char *path) {
  static float w[6] = {0.5f, -1.0f, 2.0f, 3.5f, -4.0f, 8.0f};
  static int64_t steps = 42;
  dt_named_tensor t[2] = {{.name = "w"}, {.name = "steps"}};
  DT_CHECK(dt_tensor_view(&t[0].tensor, w, DT_F32, 2, (int64_t[]){2, 3}));
  DT_CHECK(dt_tensor_view(&t[1].tensor, &steps, DT_I64, 0, NULL));
  dt_kv meta = {"model", "sample"};
  return dt_safetensors_save(path, t, 2, &meta, 1);
}

/* Header with the checksum value `crc` (a string), and data_len bytes of 0x5a. */
static dt_status parse_with_crc(const char *crc, size_t data_len) {
  char header[256];
  snprintf(header, sizeof header,
           "{\"__metadata__\":{\"dtrain.crc32\":\"%s\"},\"a\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}",
           crc, data_len / 4, data_len / 4 * 4);
  return parse_header(header, data_len);
}

TEST(checksum_is_written_and_verified) {
  const char *path = tmp_path("crc.safetensors");
  ASSERT_OK(save_sample(path));
  size_t len;
  uint8_t *b = read_file(path, &len);
  ASSERT(b);
  uint64_t n;
  memcpy(&n, b, 8);
  size_t data_at = 8 + (size_t)n;
  ASSERT_EQ(len - data_at, 6 * 4 + 8);
  /* The value is zlib's crc32 over every byte after the header, as 8 lowercase hex digits. */
  char want[16];
  snprintf(want, sizeof want, "%08lx", crc32(0L, b + data_at, (uInt)(len - data_at)));
  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_load(path, &f));
  ASSERT_STR_EQ(dt_safetensors_meta(f, DT_SAFETENSORS_CRC_KEY), want);
  ASSERT_STR_EQ(dt_safetensors_meta(f, "model"), "sample");

  /* Metadata copied from a loaded file (checksum included) saves again as it is. */
  int nm = dt_safetensors_meta_count(f);
  dt_kv meta[4];
  for (int i = 0; i < nm && i < 4; i++) meta[i] = dt_safetensors_meta_at(f, i);
  dt_named_tensor t[2];
  ASSERT_OK(dt_safetensors_get(f, 0, &t[0]));
  ASSERT_OK(dt_safetensors_get(f, 1, &t[1]));
  ((float *)t[0].tensor.data)[0] = 7.0f; /* different data: the copied checksum would be wrong */
  const char *again = tmp_path("crc_again.safetensors");
  ASSERT_OK(dt_safetensors_save(again, t, 2, meta, nm));
  dt_safetensors_free(f);
  f = NULL;
  ASSERT_OK(dt_safetensors_load(again, &f));
  ASSERT_EQ(dt_safetensors_meta_count(f), 2);
  ASSERT(strcmp(dt_safetensors_meta(f, DT_SAFETENSORS_CRC_KEY), want) != 0);
  dt_safetensors_free(f);
  f = NULL;

  /* Every single flipped data byte is caught, by load and by parse, with both crcs in the detail. */
  for (size_t at = data_at; at < len; at++) {
    b[at] ^= 0x10;
    ASSERT(write_bytes(path, b, len));
    ASSERT_STATUS(dt_safetensors_load(path, &f), DT_CORRUPT);
    ASSERT_DETAIL_NAMES(path);
    ASSERT_HAS(dt_last_error(), "the file is damaged");
    ASSERT_HAS(dt_last_error(), want); /* expected */
    ASSERT_STATUS(dt_safetensors_parse(b, len, &f), DT_CORRUPT);
    ASSERT_HAS(dt_last_error(), "damaged");
    ASSERT(f == NULL);
    b[at] ^= 0x10;
  }
  /* The same file without its checksum (as PyTorch would write it) loads unverified. */
  char *hdr = (char *)b + 8, *key = strstr(hdr, "\"dtrain.crc32\"");
  ASSERT(key);
  memcpy(key, "\"dtrain.other\"", 14);
  b[data_at] ^= 0x10;
  ASSERT_OK(dt_safetensors_parse(b, len, &f));
  ASSERT(dt_safetensors_meta(f, DT_SAFETENSORS_CRC_KEY) == NULL);
  dt_safetensors_free(f);
  free(b);

  /* Hand-made headers: right value in either case, wrong value, malformed values. */
  uint8_t data[8];
  memset(data, 0x5a, 8);
  char good[16], upper[16], wrong[16];
  unsigned long crc = crc32(0L, data, 8);
  snprintf(good, sizeof good, "%08lx", crc);
  snprintf(upper, sizeof upper, "%08lX", crc);
  snprintf(wrong, sizeof wrong, "%08lx", crc ^ 1);
  ASSERT_OK(parse_with_crc(good, 8));
  ASSERT_OK(parse_with_crc(upper, 8));
  ASSERT_STATUS(parse_with_crc(wrong, 8), DT_CORRUPT);
  ASSERT_HAS(dt_last_error(), "damaged");
  ASSERT_OK(parse_with_crc("00000000", 0)); /* crc32 of no bytes */
  ASSERT_STATUS(parse_with_crc("00000001", 0), DT_CORRUPT);
  const char *malformed[] = {"", "1234567", "123456789", "1234567g", " 1234567", "0x123456", "-1234567",
                             "123456\\u00e97"};
  for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
    ASSERT_STATUS(parse_with_crc(malformed[i], 8), DT_CORRUPT);
    ASSERT_HAS(dt_last_error(), "not 8 hex digits");
  }
  ASSERT_CORRUPT("{\"__metadata__\":{\"dtrain.crc32\":305419896}}", 0, "is not a string");
}

TEST(truncation_at_every_length_is_corrupt) {
  const char *path = tmp_path("full.safetensors"), *cut = tmp_path("cut.safetensors");
  ASSERT_OK(save_sample(path));
  size_t len;
  uint8_t *b = read_file(path, &len);
  ASSERT(b);
  uint64_t n;
  memcpy(&n, b, 8);
  for (size_t keep = 0; keep < len; keep++) {
    ASSERT(write_bytes(cut, b, keep));
    dt_safetensors *f = NULL;
    dt_status st = dt_safetensors_load(cut, &f);
    if (st != DT_CORRUPT) FAIL_("truncated to %zu of %zu bytes: %s (%s)", keep, len, dt_status_name(st), dt_last_error());
    ASSERT(f == NULL);
    ASSERT_DETAIL_NAMES(cut);
    const char *want = keep < 8 ? "shorter than the 8-byte header length"
                       : keep < 8 + n ? "after the length field (truncated file?)"
                                      : "data buffer (truncated file?)";
    ASSERT_HAS(dt_last_error(), want);
  }
  free(b);
}

TEST(big_endian_and_huge_header_lengths_are_refused_before_allocating) {
  const char *path = tmp_path("endian.safetensors");
  ASSERT_OK(save_sample(path));
  size_t len;
  uint8_t *b = read_file(path, &len);
  ASSERT(b);
  for (int i = 0; i < 4; i++) { /* the length field byte-reversed, as a big-endian writer would put it */
    uint8_t t = b[i];
    b[i] = b[7 - i];
    b[7 - i] = t;
  }
  ASSERT(write_bytes(path, b, len));
  dt_safetensors *f = NULL;
  ASSERT_STATUS(dt_safetensors_load(path, &f), DT_CORRUPT);
  ASSERT_DETAIL_NAMES(path);
  ASSERT_HAS(dt_last_error(), "100 MB");
  ASSERT_HAS(dt_last_error(), "must be little-endian");
  /* Just over the limit in a file far too small: refused by the size check, not by a failed 100 MB malloc. */
  uint64_t huge = 100u * 1000u * 1000u + 1;
  memcpy(b, &huge, 8);
  ASSERT(write_bytes(path, b, len));
  ASSERT_STATUS(dt_safetensors_load(path, &f), DT_CORRUPT);
  ASSERT_DETAIL_NAMES(path);
  ASSERT_HAS(dt_last_error(), "header length 100000001 exceeds the 100 MB limit");
  ASSERT(strstr(dt_last_error(), "big-endian") == NULL);
  ASSERT(f == NULL);
  free(b);
}

TEST(every_bad_header_through_load_names_the_file_on_one_line) {
  static const struct {
    const char *header;
    size_t data_len;
    dt_status want;
    const char *detail;
  } cases[] = {
      {"hello", 0, DT_CORRUPT, "start with '{'"},
      {"[1,2]", 0, DT_CORRUPT, "start with '{'"},
      {"{\"a\":", 0, DT_CORRUPT, "header"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, DT_CORRUPT, "duplicate key \"a\""},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, DT_CORRUPT, "overlap"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, DT_CORRUPT, "outside the 8-byte data buffer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[18446744073709551612,0]}}", 4, DT_CORRUPT,
       "end before begin"},
      {"{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DT_CORRUPT, "unknown dtype \"Q7\""},
      {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1048576,1048576,1048576,16],\"data_offsets\":[0,8]}}", 8, DT_CORRUPT,
       "overflows"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,8]}}", 8, DT_CORRUPT, "shape[1] is negative"},
      {"{\"__metadata__\":{\"k\":1}}", 0, DT_CORRUPT, "\"k\" is not a string"},
      {"{\"__metadata__\":{\"k\":null}}", 0, DT_CORRUPT, "\"k\" is not a string"},
      {"{\"__metadata__\":{\"k\":[\"v\"]}}", 0, DT_CORRUPT, "\"k\" is not a string"},
      {"{\"__metadata__\":{\"k\":{}}}", 0, DT_CORRUPT, "\"k\" is not a string"},
      {"{\"__metadata__\":\"k\"}", 0, DT_CORRUPT, "__metadata__ is not an object"},
      {"{\"__metadata__\":{\"dtrain.crc32\":\"12345\"}}", 0, DT_CORRUPT, "not 8 hex digits"},
      {"{\"__metadata__\":{\"dtrain.crc32\":\"12345678\"}}", 0, DT_CORRUPT, "the file is damaged"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, DT_UNSUPPORTED, "dtype U8"},
  };
  const char *path = tmp_path("bad_header.safetensors");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t len;
    uint8_t *b = image(cases[i].header, cases[i].data_len, &len);
    int written = write_bytes(path, b, len);
    free(b);
    ASSERT(written);
    dt_safetensors *f = NULL;
    dt_status st = dt_safetensors_load(path, &f);
    if (st != cases[i].want)
      FAIL_("case %zu (%s): %s, expected %s (%s)", i, cases[i].header, dt_status_name(st),
            dt_status_name(cases[i].want), dt_last_error());
    ASSERT(f == NULL);
    ASSERT_DETAIL_NAMES(path);
    ASSERT_HAS(dt_last_error(), cases[i].detail);
  }
}

TEST(model_load_refuses_a_damaged_file_and_keeps_the_model) {
  dt_model *a = NULL, *b = NULL, *b_copy = NULL;
  ASSERT_OK(small_model(2, 0, 1, &a));
  ASSERT_OK(small_model(2, 0, 2, &b));
  ASSERT_OK(small_model(2, 0, 2, &b_copy));
  const char *path = tmp_path("model_damaged.safetensors");
  ASSERT_OK(dt_model_save(a, path, NULL, 0));
  size_t len;
  uint8_t *bytes = read_file(path, &len);
  ASSERT(bytes);
  bytes[len - 20] ^= 0x01; /* one bit of some weight */
  ASSERT(write_bytes(path, bytes, len));
  free(bytes);
  ASSERT_STATUS(dt_model_load(b, path), DT_CORRUPT);
  ASSERT_DETAIL_NAMES(path);
  ASSERT_HAS(dt_last_error(), "damaged");
  ASSERT(same_weights(b, b_copy));
  dt_model_free(a);
  dt_model_free(b);
  dt_model_free(b_copy);
}

int main(int argc, char **argv) {
  static const dt_test_case cases[] = {
      TEST_ENTRY(round_trip_all_dtypes_scalar_and_empty),
      TEST_ENTRY(tiny_file_byte_layout_is_exact),
      TEST_ENTRY(valid_edge_cases_are_accepted),
      TEST_ENTRY(short_and_oversized_headers_are_corrupt),
      TEST_ENTRY(malformed_json_is_corrupt),
      TEST_ENTRY(bad_tensor_descriptions_are_corrupt),
      TEST_ENTRY(overlaps_holes_and_unindexed_bytes_are_corrupt),
      TEST_ENTRY(load_names_the_file),
      TEST_ENTRY(save_rejects_bad_input),
      TEST_ENTRY(save_into_missing_or_unwritable_directory_fails_cleanly),
      TEST_ENTRY(failed_save_keeps_previous_file),
      TEST_ENTRY(json_decodes_escapes_numbers_and_structure),
      TEST_ENTRY(json_writer_escapes_round_trip),
      TEST_ENTRY(model_round_trip_restores_every_tensor),
      TEST_ENTRY(model_load_mismatches_name_the_tensor_and_change_nothing),
      TEST_ENTRY(checksum_is_written_and_verified),
      TEST_ENTRY(truncation_at_every_length_is_corrupt),
      TEST_ENTRY(big_endian_and_huge_header_lengths_are_refused_before_allocating),
      TEST_ENTRY(every_bad_header_through_load_names_the_file_on_one_line),
      TEST_ENTRY(model_load_refuses_a_damaged_file_and_keeps_the_model),
  };
  int rc = dt_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
  remove_tmpdir();
  return rc;
}
