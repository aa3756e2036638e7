/* Checked, 64-byte aligned allocation: zeroed, or not (for buffers written before they are read), and each thread's
 * reusable scratch. */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/impl.h"

static _Atomic uint64_t blocks_allocated;
static _Atomic int poison_unset;

void dt_alloc_poison_unset(int mode) { atomic_store_explicit(&poison_unset, mode, memory_order_relaxed); }

/* Mode 1: NaN and 3.4e38 in turn, a float at a time (as 0xff and 0x7f bytes); mode 2: zeros. */
static void poison(void *p, size_t bytes, int mode) {
  uint32_t *w = p;
  if (mode == 2) {
    memset(p, 0, bytes);
    return;
  }
  for (size_t i = 0; i < bytes / 4; i++) w[i] = i & 1 ? 0x7f7f7f7fu : 0xffffffffu;
}

uint64_t dt_alloc_count(void) { return blocks_allocated; }

/* bytes (at least 1) rounded up to the alignment, into *out; 0 on success. */
static int aligned_block(size_t bytes, void **out, size_t *rounded) {
  const size_t n = DT_ALIGN_UP(bytes ? bytes : 1);
  *rounded = n;
  if (n < bytes || posix_memalign(out, DT_ALIGN, n) != 0) return 1;
  atomic_fetch_add_explicit(&blocks_allocated, 1, memory_order_relaxed);
  return 0;
}

dt_status dt_alloc(size_t bytes, void **out) {
  void *p = NULL;
  size_t n;
  if (aligned_block(bytes, &p, &n)) return dt_error(DT_OUT_OF_MEMORY, "cannot allocate %zu bytes", bytes);
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

#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

dt_status dt_alloc_array_huge(size_t n, size_t size, const char *what, void **out) {
  size_t bytes;
  if (dt_mul_overflow(n, size, &bytes))
    return dt_error(DT_OUT_OF_MEMORY, "%s: %zu x %zu bytes overflows", what, n, size);
  if (bytes < HUGE_MIN) return dt_alloc_array(n, size, what, out);
  const size_t whole = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  void *p = NULL;
  if (whole < bytes || posix_memalign(&p, HUGE_PAGE, whole) != 0)
    return dt_error(DT_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, bytes);
  atomic_fetch_add_explicit(&blocks_allocated, 1, memory_order_relaxed);
  (void)madvise(p, whole, MADV_HUGEPAGE); /* advice: a kernel without THP leaves 4 KiB pages */
  memset(p, 0, whole);
  *out = p;
  return DT_OK;
}

dt_status dt_alloc_array_unset(size_t n, size_t size, const char *what, void **out) {
  size_t bytes, rounded;
  if (dt_mul_overflow(n, size, &bytes))
    return dt_error(DT_OUT_OF_MEMORY, "%s: %zu x %zu bytes overflows", what, n, size);
  if (aligned_block(bytes, out, &rounded))
    return dt_error(DT_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, bytes);
  const int mode = atomic_load_explicit(&poison_unset, memory_order_relaxed);
  if (mode) poison(*out, rounded, mode);
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

/* Older glibc refuses a threshold above 32 MiB (half its largest thread heap): then 32 MiB, which still covers
 * oneDNN's buffers. The trim and padding settings freeze the threshold glibc would otherwise raise by itself, so
 * they are set only once a threshold is. */
int dt_keep_freed_memory_threshold(void) {
#ifdef __GLIBC__
  const int sizes[2] = {256 << 20, 32 << 20};
  for (int i = 0; i < 2; i++)
    if (mallopt(M_MMAP_THRESHOLD, sizes[i]) == 1) {
      mallopt(M_TRIM_THRESHOLD, sizes[i]);
      mallopt(M_TOP_PAD, 64 << 20);
      return sizes[i];
    }
#endif
  return 0;
}

void dt_keep_freed_memory(void) { (void)dt_keep_freed_memory_threshold(); }

void dt_touch_pages(const void *p, size_t bytes) {
  const volatile unsigned char *c = p;
  for (size_t at = 0; at < bytes; at += 4096) (void)c[at];
  if (bytes) (void)c[bytes - 1];
}

/* The thread's scratch: the buffer itself in thread-local storage (read on every call), and registered under a
 * key whose destructor frees it when the thread exits (worker threads come and go with DP runs). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_key_make(void) { (void)pthread_key_create(&scratch_key, free); }

void *dt_thread_scratch(size_t n) {
  static _Thread_local void *buf;
  static _Thread_local size_t cap;
  if (n <= cap) return buf;
  pthread_once(&scratch_once, scratch_key_make);
  void *p = NULL;
  size_t rounded;
  if (aligned_block(n, &p, &rounded)) return NULL;
  free(buf);
  buf = p;
  cap = n;
  (void)pthread_setspecific(scratch_key, p);
  return p;
}
