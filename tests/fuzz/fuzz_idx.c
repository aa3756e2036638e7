/* Fuzz target: IDX parsing of arbitrary bytes, and bounded gunzip + parse when they look like gzip. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/impl.h"
#include "data/data-impl.h"
#include "dtrain/data.h"

#define MAX_BYTES ((size_t)1 << 20)

/* A parsed array must be self-consistent; a violated invariant is a crash the fuzzer reports. */
static void check(const dt_idx *idx) {
  size_t count = 1;
  for (int d = 0; d < idx->ndim; d++) count *= idx->dims[d];
  if (idx->ndim < 1 || idx->ndim > 4 || count != idx->count || !idx->data) __builtin_trap();
  /* touch every byte so ASan sees a short buffer */
  size_t esize = idx->type == 0x0E ? 8 : idx->type >= 0x0C ? 4 : idx->type == 0x0B ? 2 : 1;
  volatile uint8_t sink = 0;
  const uint8_t *p = idx->data;
  for (size_t i = 0; i < idx->count * esize; i++) sink ^= p[i];
  (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dt_idx idx;
  if (dt_idx_parse(data, size, MAX_BYTES, &idx) == DT_OK) {
    check(&idx);
    dt_idx_free(&idx);
  }
  if (dt_is_gzip(data, size)) {
    uint8_t *plain = NULL;
    size_t len = 0;
    if (dt_gunzip(data, size, MAX_BYTES + DT_IDX_HEADER_BYTES(4), &plain, &len) == DT_OK) {
      if (len > MAX_BYTES + DT_IDX_HEADER_BYTES(4)) __builtin_trap();
      if (dt_idx_parse(plain, len, MAX_BYTES, &idx) == DT_OK) {
        check(&idx);
        dt_idx_free(&idx);
      }
      dt_free(plain);
    }
  }
  dt_clear_error();
  return 0;
}
