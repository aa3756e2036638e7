/* Parity helper: writes a fixed safetensors file with dtrain, or reads one and prints it as hex text for Python. */
#include <stdio.h>
#include <string.h>

#include "dtrain/dtrain.h"

static void hex(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
  if (!n) printf("-");
}

/* The fixed content; test_safetensors_torch.py recomputes the same values with torch. */
static int write_fixed(const char *path) {
  static float w[18], bias[2] = {0.5f, -1.5f}, empty[1];
  static uint16_t bf[6], hf[5];
  static int32_t idx[6];
  static int64_t steps = INT64_C(123456789012);
  static double d[4];
  for (int i = 0; i < 18; i++) w[i] = (float)(i - 9) * 0.125f;
  for (int i = 0; i < 6; i++) bf[i] = dt_f32_to_bf16((float)i * 0.75f - 2.0f);
  for (int i = 0; i < 5; i++) hf[i] = dt_f32_to_f16((float)i * 0.5f - 1.0f);
  for (int i = 0; i < 6; i++) idx[i] = i * 7 - 20;
  for (int i = 0; i < 4; i++) d[i] = (double)i / 3.0;
  static const char *names[8] = {"conv.weight", "conv.bias", "bn.num_batches_tracked", "emb.bf16",
                                 "emb.f16",     "idx",       "d",                      "empty"};
  dt_named_tensor t[8];
  for (int i = 0; i < 8; i++) t[i].name = names[i];
  dt_status st = DT_OK;
  st |= dt_tensor_view(&t[0].tensor, w, DT_F32, 4, (int64_t[]){2, 1, 3, 3});
  st |= dt_tensor_view(&t[1].tensor, bias, DT_F32, 1, (int64_t[]){2});
  st |= dt_tensor_view(&t[2].tensor, &steps, DT_I64, 0, NULL);
  st |= dt_tensor_view(&t[3].tensor, bf, DT_BF16, 2, (int64_t[]){3, 2});
  st |= dt_tensor_view(&t[4].tensor, hf, DT_F16, 1, (int64_t[]){5});
  st |= dt_tensor_view(&t[5].tensor, idx, DT_I32, 2, (int64_t[]){2, 3});
  st |= dt_tensor_view(&t[6].tensor, d, DT_F64, 2, (int64_t[]){2, 2});
  st |= dt_tensor_view(&t[7].tensor, empty, DT_F32, 2, (int64_t[]){0, 4});
  dt_kv meta[3] = {{"format", "pt"}, {"epoch", "3"}, {"note", "\xc3\xbc" "n" "\xc3\xaf" "code \"q\" \\ \n"}};
  if (st == DT_OK) st = dt_safetensors_save(path, t, 8, meta, 3);
  if (st != DT_OK) {
    fprintf(stderr, "write %s: %s: %s\n", path, dt_status_name(st), dt_last_error());
    return 1;
  }
  return 0;
}

/* One line per metadata entry and per tensor (file order):
 *   meta <key hex> <value hex>
 *   tensor <name hex> <dtype> <ndim> [dims...] <data hex or ->  */
static int read_print(const char *path) {
  dt_safetensors *f = NULL;
  dt_status st = dt_safetensors_load(path, &f);
  if (st != DT_OK) {
    printf("error %s %s\n", dt_status_name(st), dt_last_error());
    return 2;
  }
  for (int i = 0; i < dt_safetensors_meta_count(f); i++) {
    dt_kv kv = dt_safetensors_meta_at(f, i);
    printf("meta ");
    hex(kv.key, strlen(kv.key));
    printf(" ");
    hex(kv.value, strlen(kv.value));
    printf("\n");
  }
  for (int i = 0; i < dt_safetensors_count(f); i++) {
    dt_named_tensor t;
    if (dt_safetensors_get(f, i, &t) != DT_OK) return 1;
    printf("tensor ");
    hex(t.name, strlen(t.name));
    printf(" %s %d", dt_dtype_name(t.tensor.dtype), t.tensor.ndim);
    for (int d = 0; d < t.tensor.ndim; d++) printf(" %lld", (long long)t.tensor.shape[d]);
    printf(" ");
    hex(t.tensor.data, dt_tensor_bytes(&t.tensor));
    printf("\n");
  }
  dt_safetensors_free(f);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "write") == 0) return write_fixed(argv[2]);
  if (argc == 3 && strcmp(argv[1], "read") == 0) return read_print(argv[2]);
  fprintf(stderr, "usage: %s write|read FILE\n", argv[0]);
  return 2;
}
