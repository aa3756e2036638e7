/* Checked, 64-byte aligned, zeroed allocation. */
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"

dt_status dt_alloc(size_t bytes, void **out) {
  void *p = NULL;
  size_t n = DT_ALIGN_UP(bytes ? bytes : 1);
  if (n < bytes || posix_memalign(&p, DT_ALIGN, n) != 0)
    return dt_error(DT_OUT_OF_MEMORY, "cannot allocate %zu bytes", bytes);
  memset(p, 0, n);
  *out = p;
  return DT_OK;
}

dt_status dt_alloc_array(size_t n, size_t size, const char *what, void **out) {
  size_t bytes;
  if (dt_mul_overflow(n, size, &bytes))
    return dt_error(DT_OUT_OF_MEMORY, "%s: %zu x %zu bytes overflows", what, n, size);
  if (dt_alloc(bytes, out) != DT_OK)
    return dt_error(DT_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, bytes);
  return DT_OK;
}

dt_status dt_alloc_array_unset(size_t n, size_t size, const char *what, void **out) {
  size_t bytes;
  void *p = NULL;
  if (dt_mul_overflow(n, size, &bytes) || DT_ALIGN_UP(bytes ? bytes : 1) < bytes)
    return dt_error(DT_OUT_OF_MEMORY, "%s: %zu x %zu bytes overflows", what, n, size);
  if (posix_memalign(&p, DT_ALIGN, DT_ALIGN_UP(bytes ? bytes : 1)) != 0)
    return dt_error(DT_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, bytes);
  *out = p;
  return DT_OK;
}

dt_status dt_grow_array(void **arr, int64_t *cap, int64_t used, int64_t need, int64_t first, size_t size,
                        const char *what) {
  if (need <= *cap) return DT_OK;
  int64_t grown = *cap > 0 ? *cap : first;
  while (grown < need) grown *= 2;
  void *bigger = NULL;
  DT_CHECK(dt_alloc_array((size_t)grown, size, what, &bigger));
  if (used > 0) memcpy(bigger, *arr, (size_t)used * size);
  dt_free(*arr);
  *arr = bigger;
  *cap = grown;
  return DT_OK;
}

void dt_free(void *p) { free(p); }
