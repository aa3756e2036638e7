/* Fuzz target: the CSV/TSV reader on arbitrary bytes, strict and skipping, with the invariants of what it returns. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"
#include "data/csv.h"

/* Every cell lies in the buffer, is UTF-8 without NUL, and records start on non-decreasing lines. */
static void check(const dt_csv *c, size_t size) {
  if (c->n_cols < 1 || c->n_rows < 0) __builtin_trap();
  for (int64_t r = 0; r <= c->n_rows; r++) {
    if (r && c->line[r] < c->line[r - 1]) __builtin_trap();
    for (int k = 0; k < c->n_cols; k++) {
      size_t n = 0;
      const char *s = dt_csv_field(c, r, k, &n);
      if (s < c->buf || s + n > c->buf + size || !dt_utf8_valid(s, n) || memchr(s, 0, n)) __builtin_trap();
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char delims[2] = {',', '\t'};
  for (int mode = 0; mode < 4; mode++) {
    const dt_csv_options opt = {.delim = delims[mode & 1], .skip_bad = mode >> 1};
    dt_csv c;
    if (dt_csv_parse("fuzz.csv", (const char *)data, size, &opt, &c) == DT_OK) {
      check(&c, size);
      dt_csv_free(&c);
    }
  }
  return 0;
}
