/* Fuzz target: dt_safetensors_parse over arbitrary bytes; every tensor it accepts must be readable in full, and a checksum it accepts must be right. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "dtrain/dtrain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dt_safetensors *f = NULL;
  if (dt_safetensors_parse(data, size, &f) != DT_OK) return 0;
  /* Touch every byte of every view and every metadata string, so ASan sees any
   * view that escapes the buffer. */
  volatile uint8_t sink = 0;
  for (int i = 0; i < dt_safetensors_count(f); i++) {
    dt_named_tensor t;
    if (dt_safetensors_get(f, i, &t) != DT_OK) __builtin_trap();
    if (!t.name[0]) __builtin_trap();
    const uint8_t *p = t.tensor.data;
    size_t bytes = dt_tensor_bytes(&t.tensor);
    for (size_t b = 0; b < bytes; b++) sink ^= p[b];
    dt_named_tensor again;
    if (dt_safetensors_find(f, t.name, &again) != DT_OK || again.tensor.data != t.tensor.data) __builtin_trap();
  }
  for (int i = 0; i < dt_safetensors_meta_count(f); i++) {
    dt_kv kv = dt_safetensors_meta_at(f, i);
    sink ^= (uint8_t)(strlen(kv.key) + strlen(kv.value));
    /* Keys are unique (the JSON reader refuses duplicates), so lookup finds this very entry. */
    if (dt_safetensors_meta(f, kv.key) != kv.value) __builtin_trap();
  }
  /* An accepted checksum is 8 hex digits equal to zlib's crc32 of the data
   * section, recomputed here from the input independently of the reader. */
  const char *crc = dt_safetensors_meta(f, DT_SAFETENSORS_CRC_KEY);
  if (crc) {
    uint64_t n;
    memcpy(&n, data, 8);
    if (strlen(crc) != 8) __builtin_trap();
    char want[9];
    unsigned long got = crc32(0L, data + 8 + n, (uInt)(size - 8 - n));
    snprintf(want, sizeof want, "%08lx", got);
    for (int i = 0; i < 8; i++)
      if (want[i] != (crc[i] >= 'A' && crc[i] <= 'F' ? crc[i] - 'A' + 'a' : crc[i])) __builtin_trap();
  }
  (void)sink;
  dt_safetensors_free(f);
  return 0;
}
